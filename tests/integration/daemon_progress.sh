#!/usr/bin/env bash
# Prefill progress: prompts read in chunks of 16 tokens, each step at least 40 ms (test hook), so
# a prompt of hundreds of tokens takes seconds. A request with progress: true gets progress
# notes before its first token, growing, at most 4 a second, the last one the whole prompt less
# the cached part (a session's too); generate and chat both; a request without the field (or
# false, or nil) gets none, next to one that asks on the same connection; a progress that is not
# a boolean is error 4.
. "$(dirname "$0")/lib.bash"
S=$HERE/progress_tests.py
CHUNK=16
write_conf "threads = 2" "prefill_chunk = $CHUNK" "prefill_budget = $CHUNK" "max_running = 4"
SILICEOD_TEST_HOOKS=ubatch_ms=40 start_daemon --model "$MODEL"
for group in caps long cached off bad chat; do
    python3 "$S" "$CHUNK" "$group"
done
stop_daemon
