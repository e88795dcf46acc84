#!/usr/bin/env bash
# A short soak (tests/soak/soak.py): 8 clients for SOAK_SECONDS (default 45) of streamed
# generations, session chats, cancels, connections closed mid-stream, bad parameters and bytes
# that are not msgpack-RPC, on the hybrid MoE model with the caches held small: every request on a
# connection that stayed open answered exactly once, streams equal to results, descriptors back
# to their count at the start, RSS bounded once warm. tests/soak/run.sh runs it for longer.
. "$(dirname "$0")/lib.bash"
write_conf "threads = 2" "max_running = 8" "max_queue = 64" "session_memory = 32M" \
    "prefix_checkpoint_memory = 32M" "prefix_cache_memory = 32M"
start_daemon --model "$MOE_MODEL"
# RSS bounded, except under a sanitizer (its shadow memory grows with what the threads touch)
RSS_MAX=160
[ -z "${SIL_SANITIZER:-}" ] || RSS_MAX=0
python3 "$ROOT/tests/soak/soak.py" "$DPID" "${SOAK_SECONDS:-45}" 8 --seed 7 --rss-max-mib "$RSS_MAX" \
    --json "$T/soak.json" || fail "soak"
stop_daemon
