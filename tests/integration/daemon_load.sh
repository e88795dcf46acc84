#!/usr/bin/env bash
# 16 concurrent streaming clients, cancel, 1000 disconnect-mid-stream cycles with flat RSS (and no
# leak report at exit under the ASan build), a client that does not read.
. "$(dirname "$0")/lib.bash"
write_conf "threads = 2" "max_output = 64K" "max_running = 16"
start_daemon --model "$MODEL"
python3 "$HERE/daemon_tests.py" concurrency
python3 "$HERE/daemon_tests.py" cancel
python3 "$HERE/daemon_tests.py" churn "$DPID"
python3 "$HERE/daemon_tests.py" slow_reader
stop_daemon
