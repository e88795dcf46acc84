#!/usr/bin/env bash
# Limits and framing (max_queue under a burst, half-closed clients, max_output, timeouts,
# max_input), protocol consistency (nil msgid on connection errors, cancelled while queued, the
# end-of-generation id streamed), Prometheus text, exit statuses, and the allow lists with
# clients running as other uids.
. "$(dirname "$0")/lib.bash"
L=$HERE/limits_tests.py

# Exit statuses of siliceod(8): 2 for a usage error, 1 for a bad configuration or model.
rc=0; "$SIL_BUILD/bin/siliceod" --no-such-option >"$T/o" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "unknown option: exit $rc, expected 2"
rc=0; "$SIL_BUILD/bin/siliceod" --threads many --no-model >"$T/o" 2>&1 || rc=$?
[ "$rc" -eq 2 ] || fail "bad option value: exit $rc, expected 2"
printf 'max_queue = lots\n' >"$T/bad.conf"
rc=0; "$SIL_BUILD/bin/siliceod" --config "$T/bad.conf" --no-model >"$T/o" 2>&1 || rc=$?
[ "$rc" -eq 1 ] || fail "bad config file: exit $rc, expected 1"
grep -q "bad.conf:1: max_queue" "$T/o" || fail "bad config: no file:line: key in $(cat "$T/o")"
rc=0; "$SIL_BUILD/bin/siliceod" --config "$T/siliceod.conf" >"$T/o" 2>&1 || rc=$?
[ "$rc" -eq 1 ] || fail "no model: exit $rc, expected 1"
head -c 4096 /dev/urandom >"$T/junk.gguf"
rc=0; "$SIL_BUILD/bin/siliceod" --config "$T/siliceod.conf" --socket "$T/junk.sock" --model "$T/junk.gguf" \
    >"$T/o" 2>&1 || rc=$?
[ "$rc" -eq 1 ] || fail "bad model: exit $rc, expected 1"
! grep -q listening "$T/o" || fail "bad model: 'listening' printed before the model was checked: $(cat "$T/o")"
[ ! -e "$T/junk.sock" ] || fail "bad model: the socket was created"
grep -q SILICEO_SOCKET <<<"$("$SIL_BUILD/bin/siliceod" --help)" || fail "--help does not mention SILICEO_SOCKET"
echo "ok: exit statuses 2 (usage) and 1 (config, model), no 'listening' before the model, --help names SILICEO_SOCKET"

write_conf "threads = 2" "max_queue = 4" "max_running = 2" "max_output = 256K" "message_timeout = 2" \
    "idle_timeout = 4" "max_input = 1M" "context = 8192"
start_daemon --model "$MODEL" ${LIMITS_DEBUG:+--log-level debug}
grep -q "listening" "$T/daemon.log" || fail "no 'listening' line"
python3 "$L" conn_errors
python3 "$L" half_close
python3 "$L" max_output 262144
# Texts of 4 MB are tokenized off the event loop: a stream elsewhere keeps flowing.
python3 "$L" tokenize_stall tokenize
python3 "$L" tokenize_stall generate
python3 "$L" cancel_queued
python3 "$L" eog_ids
# Debian's interpreter: python3-prometheus-client lives in its dist-packages.
/usr/bin/python3 "$L" metrics
python3 "$L" burst 4 2
python3 "$L" input_cap 4194304  # max_input 1M is raised to max_message
python3 "$L" timeouts 2 4
stop_daemon

# Allow lists: clients as other uids need root to switch, and a socket they can reach.
if [ "$(id -u)" -ne 0 ]; then
    [ "${CI:-}" != true ] || fail "the allow-list test needs root (CI=true)"
    echo "SKIP: allow lists (not root)"
    exit 0
fi
write_conf "threads = 2" "allow_users = 4001" "allow_groups = 4100"
start_daemon --no-model
chmod 0755 "$(dirname "$SILICEO_SOCKET")" "$T"
chmod 0666 "$SILICEO_SOCKET"
python3 "$L" allow_lists 4001 4100
grep -q "refused pid .* uid 4002" "$T/daemon.log" || fail "the refusal is not logged"
stop_daemon
