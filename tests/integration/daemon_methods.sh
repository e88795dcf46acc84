#!/usr/bin/env bash
# Every method, generation controls, sessions, type checks; then bad input with a bystander.
. "$(dirname "$0")/lib.bash"
# A second uid for the session-ownership checks (the tests run as root; the child keeps gid 0).
write_conf "threads = 2" "allow_users = 12345"
chmod 0711 "$T"
start_daemon --model "$MODEL"
python3 "$HERE/daemon_tests.py" methods
python3 "$HERE/daemon_tests.py" controls
python3 "$HERE/daemon_tests.py" sessions
python3 "$HERE/daemon_tests.py" sessions_uid
python3 "$HERE/daemon_tests.py" bad_input
# The real clients against the same daemon.
if [ -x "$SIL_BUILD/bin/sil-probe" ]; then
    "$SIL_BUILD/bin/sil-probe" >"$T/probe.out" || fail "sil-probe: $(cat "$T/probe.out")"
    grep -q "OK" "$T/probe.out" || fail "sil-probe says: $(cat "$T/probe.out")"
    echo "ok: sil-probe reports OK"
fi
if [ -x "$SIL_BUILD/bin/sil-chat" ]; then
    "$SIL_BUILD/bin/sil-chat" --no-think -n 4 -t 0 "Hello there" >"$T/chat.out" || fail "sil-chat failed"
    [ -s "$T/chat.out" ] || fail "sil-chat printed nothing"
    echo "ok: sil-chat streams an answer"
fi
stop_daemon
