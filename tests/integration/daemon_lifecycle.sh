#!/usr/bin/env bash
# Start-up and shutdown: --inspect, a second instance, a stale socket, socket mode, peers outside
# the allow list, SIGHUP, SIGTERM during streams, the shutdown method, socket activation, the
# MoE model, --no-model.
. "$(dirname "$0")/lib.bash"
D=$SIL_BUILD/bin/siliceod

"$D" --inspect "$MODEL" >"$T/inspect.txt" || fail "--inspect on a good model"
grep -q qwen3 "$T/inspect.txt" || fail "--inspect names the architecture"
printf 'GGUF\003\000\000\000garbage' >"$T/bad.gguf"
if "$D" --inspect "$T/bad.gguf" >/dev/null 2>"$T/inspect.err"; then fail "--inspect accepted a bad file"; fi
grep -q "bad.gguf" "$T/inspect.err" || fail "--inspect error names the file: $(cat "$T/inspect.err")"
echo "ok: --inspect: good file described, bad file a clear error and non-zero exit"
if "$D" --config "$T/siliceod.conf" --model "$T/bad.gguf" --socket "$T/x.sock" 2>"$T/load.err"; then fail "started on a bad model"; fi
grep -q "cannot load the model" "$T/load.err" || fail "load error: $(cat "$T/load.err")"
echo "ok: a bad model file stops the start with a clear message"

# A stale socket file (nobody listening) is replaced.
mkdir -p "$T/run"
python3 -c "import socket; s=socket.socket(socket.AF_UNIX); s.bind('$SILICEO_SOCKET')"
start_daemon --model "$MODEL"
echo "ok: stale socket replaced"
[ "$(stat -c %a "$SILICEO_SOCKET")" = 660 ] || fail "socket mode $(stat -c %a "$SILICEO_SOCKET")"
echo "ok: socket is 0660"

# A second instance refuses to start, before loading its model (the test hook makes a load take
# seconds), and leaves the first one's socket alone.
t0=$(date +%s%N)
if SILICEOD_TEST_HOOKS=load_ms=3000 "$D" --config "$T/siliceod.conf" --model "$MODEL" \
    --socket "$SILICEO_SOCKET" 2>"$T/second.err"; then
    fail "second instance started"; fi
ms=$((($(date +%s%N) - t0) / 1000000))
grep -q "already running" "$T/second.err" || fail "second instance message: $(cat "$T/second.err")"
! grep -q "loading the model" "$T/second.err" || fail "the second instance loaded its model first"
[ "$ms" -lt 2000 ] || fail "the second instance took $ms ms to refuse"
python3 -c "import siltest; siltest.Client().ok('status')" || fail "first instance lost its socket"
echo "ok: a second instance refuses to start at once ($ms ms) with a clear message"

# A peer with another uid is refused with error 6 (tests run as root; skipped otherwise).
# The system python: another user cannot run one installed under root's home.
SYSPY=$(command -v /usr/bin/python3 || true)
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null && [ -n "$SYSPY" ]; then
    chmod 755 "$T" "$T/run"; chmod 666 "$SILICEO_SOCKET"  # let uid 65534 reach the socket at all
    cp "$HERE/siltest.py" "$T/"; chmod 644 "$T/siltest.py"
    out=$(cd "$T" && setpriv --reuid=65534 --regid=65534 --clear-groups env PYTHONPATH="$T" "$SYSPY" -c "
import siltest
c = siltest.Client()
try:
    c.send('status')
except OSError:
    pass  # refused before our request was read; the error is still there to read
m = c.read()
print(m[2]['code'] if m and m[0] == 1 and m[2] else 'none', c.read() is None)
") || fail "unprivileged client crashed"
    [ "$out" = "6 True" ] || fail "peer outside the allow list: $out"
    chmod 660 "$SILICEO_SOCKET"
    echo "ok: peer outside the allow list gets error 6 and is disconnected"
else
    echo "skip: peer refusal needs root, setpriv and /usr/bin/python3"
fi

# SIGHUP re-reads the configuration (log level is live).
write_conf "threads = 2" "log_level = debug" "max_clients = 100"
kill -HUP "$DPID"
sleep 0.3
python3 -c "import siltest; siltest.Client().ok('status')"
sleep 0.2
grep -q "configuration reloaded" "$T/daemon.log" || fail "SIGHUP not logged"
grep -q "debug: client" "$T/daemon.log" || fail "log level not applied live"
echo "ok: SIGHUP reloads live settings"

# SIGTERM while 4 clients stream: each gets a final response, the daemon exits 0.
python3 "$HERE/daemon_tests.py" streams_for_sigterm 4 "$T/reasons" &
SP=$!
for _ in $(seq 100); do [ -f "$T/reasons.streaming" ] && break; sleep 0.1; done
[ -f "$T/reasons.streaming" ] || fail "streams did not start"
stop_daemon
wait "$SP" || fail "stream client failed"
[ "$(cat "$T/reasons")" = "shutdown shutdown shutdown shutdown" ] || fail "final responses: $(cat "$T/reasons")"
echo "ok: SIGTERM during 4 streams: every client got stop_reason shutdown"
[ ! -e "$SILICEO_SOCKET" ] || fail "socket left behind"
echo "ok: socket removed on exit"

# The shutdown method (the owner may).
start_daemon --model "$MOE_MODEL"
python3 - <<'PY' || fail "MoE model / shutdown"
import siltest
c = siltest.Client()
r, _ = c.ok("chat", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0,
                     "grace_tokens": 0, "think": True, "max_thinking_tokens": 2})
siltest.check(r["stop_reason"] in ("length", "eos"), "qwen35moe: chat with thinking works")
siltest.check(r["n_reasoning"] in (0, 3), "qwen35moe: thinking budget (%d reasoning tokens)" % r["n_reasoning"])
r, _ = c.ok("shutdown")
siltest.check(r == {}, "shutdown answers an empty map")
PY
rc=0; wait "$DPID" || rc=$?; DPID=
[ "$rc" = 0 ] || fail "exit status $rc after shutdown"
echo "ok: shutdown method stops the daemon, exit 0"

# Socket activation: systemd-socket-activate passes a listening socket (LISTEN_FDS).
if command -v systemd-socket-activate >/dev/null; then
    A=$T/act.sock
    systemd-socket-activate -l "$A" "$D" --config "$T/siliceod.conf" --model "$MODEL" >"$T/act.log" 2>&1 &
    DPID=$!
    python3 -c "import siltest,sys; sys.exit(0 if siltest.wait_socket('$A', 30) else 1)" || fail "activation socket"
    SILICEO_SOCKET=$A python3 -c "import siltest; r,_ = siltest.Client().ok('generate', {'prompt': 'Hi', 'max_tokens': 2}); assert r['n_generated'] >= 1" \
        || { cat "$T/act.log"; fail "request over the activated socket"; }
    grep -q "passed by systemd" "$T/act.log" || { cat "$T/act.log"; fail "daemon did not use LISTEN_FDS"; }
    kill -TERM "$DPID"; rc=0; wait "$DPID" || rc=$?; DPID=
    [ "$rc" = 0 ] || fail "activated daemon exit $rc"
    echo "ok: socket activation"
else
    echo "skip: systemd-socket-activate not installed"
fi

# --no-model: the protocol alone (for the overhead benchmark).
start_daemon --no-model
python3 - <<'PY' || fail "--no-model"
import siltest
c = siltest.Client()
r, _ = c.ok("debug.stream", {"count": 5})
siltest.check(r["n_sent"] == 5, "--no-model: debug.stream works")
err, _, _ = c.call("generate", {"prompt": "x"})
siltest.check(err["code"] == 3, "--no-model: generate is not available")
PY
stop_daemon
