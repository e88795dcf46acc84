#!/usr/bin/env bash
# Sessions on both hybrid models (linear-attention layers): turns resume from recurrent-state
# checkpoints and answer as cold runs; chat append; generate continuations.
. "$(dirname "$0")/lib.bash"
for m in qwen35-tiny-Q4_K_M qwen35moe-tiny-Q4_K_M; do
    echo "== $m"
    start_daemon --model "$SHARED/refdata/models/$m.gguf"
    python3 "$HERE/daemon_tests.py" hybrid_sessions
    stop_daemon
done
