#!/usr/bin/env bash
# The automatic prefix cache through the daemon, on a hybrid model (recurrent-state snapshots)
# and an attention-only one: two requests sharing a long prefix, the second reuses its full
# blocks (n_cached, status, metrics) and both answer as with the cache off (greedy); another
# uid never reuses them; prefix_cache = off reuses nothing.
. "$(dirname "$0")/lib.bash"
need_refdata "$SHARED/refdata/models/qwen35-tiny-Q4_K_M.gguf" "$MOE_MODEL" "$MODEL"
chmod 0711 "$T" # the other uid reaches the socket
for m in qwen35-tiny-Q4_K_M qwen35moe-tiny-Q4_K_M qwen3-tiny-Q8_0; do
    echo "== $m"
    write_conf "threads = 2" "allow_users = 12345" "prefix_cache = off"
    start_daemon --model "$SHARED/refdata/models/$m.gguf"
    python3 "$HERE/prefix_tests.py" cold "$T/cold.json"
    stop_daemon
    write_conf "threads = 2" "allow_users = 12345" "prefix_checkpoint_blocks = 4"
    start_daemon --model "$SHARED/refdata/models/$m.gguf"
    python3 "$HERE/prefix_tests.py" warm "$T/cold.json"
    stop_daemon
done
