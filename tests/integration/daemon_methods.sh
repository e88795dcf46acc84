#!/usr/bin/env bash
# Every method, generation controls, sessions, type checks; then bad input with a bystander.
. "$(dirname "$0")/lib.bash"
start_daemon --model "$MODEL"
python3 "$HERE/daemon_tests.py" methods
python3 "$HERE/daemon_tests.py" controls
python3 "$HERE/daemon_tests.py" sessions
python3 "$HERE/daemon_tests.py" bad_input
stop_daemon
