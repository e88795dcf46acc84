#!/usr/bin/env bash
# The scheduler: priority fields checked; 32 concurrent clients of mixed classes all complete,
# interactive first on average (first-token latency per class); a request preempted by a more
# urgent one (one sequence slot) or for lack of engine space (test hook kv_tokens) resumes by
# recompute with the tokens it gives alone; a client holding every slot gives one up to another
# client's request of its class; a decoding stream goes on while another client's
# long prompt prefills (inter-token gap median and p99 printed), within 10 x the gap without it
# when the prefill budget is held to time (prefill_stretch).
. "$(dirname "$0")/lib.bash"
S=$HERE/sched_tests.py

# Four slots for 32 clients: most wait, so the order of admission and prefill shows. Each
# micro-batch takes at least 2 ms (test hook), so every request is queued before the first ends.
write_conf "threads = 2" "max_running = 4" "max_queue = 64" "max_client_requests = 4"
SILICEOD_TEST_HOOKS=ubatch_ms=2 start_daemon --model "$MODEL"
python3 "$S" priority-params
python3 "$S" mixed 32
stop_daemon

# Fair shares: a client holding all four slots with endless requests gives one up to another
# client's request of the same class (each micro-batch at least 5 ms: 3000 tokens would take
# the greedy ones over 15 s).
write_conf "threads = 2" "max_running = 4" "max_queue = 16" "max_client_requests = 4"
SILICEOD_TEST_HOOKS=ubatch_ms=5 start_daemon --model "$MODEL"
python3 "$S" fair 4
grep -q "preempted (a fair share for another client)" "$T/daemon.log" || fail "no fair preemption logged"
stop_daemon

# One slot: a batch request gives it up to an interactive one; on the hybrid model too, where a
# session's recurrent state is rebuilt with its checkpoints.
write_conf "threads = 2" "max_running = 1" "max_queue = 8"
for m in "$MODEL" "$MOE_MODEL"; do
    echo "model $(basename "$m")"
    SILICEOD_TEST_HOOKS=ubatch_ms=5 start_daemon --model "$m"
    python3 "$S" preempt
    grep -q "preempted (a more urgent request)" "$T/daemon.log" || fail "no preemption logged"
    stop_daemon
done

# Room for 150 positions in all: four requests of ~10 + 40 positions do not fit at once. Each
# micro-batch takes at least 2 ms (test hook), so the four overlap on a loaded machine too (with
# the tiny model's steps alone, one could end before the last had started: no preemption).
write_conf "threads = 2" "max_running = 4" "max_queue = 8"
SILICEOD_TEST_HOOKS=kv_tokens=150,ubatch_ms=2 start_daemon --model "$MODEL"
python3 "$S" kv-space 4
grep -q "preempted (out of engine space)" "$T/daemon.log" || fail "no preemption for space logged"
stop_daemon

# A decoding stream next to another client's prompt of ~1500 tokens, on a model big enough for
# steps to take milliseconds: with prompt chunks of 64 (prefill_stretch 0) the stream gets a token
# every step, and with the budget by time (prefill_stretch 2) gaps near those without a prefill:
# its median within 10 x the gap without (fixed 64-token chunks give about 75 x here; the
# controller's target is 2 x, and a loaded 2-core machine measured up to 5.6 x).
MK=$SIL_BUILD/bin/sil-mkmodel
[ -x "$MK" ] || MK=$ROOT/build/bin/sil-mkmodel # sanitizer builds have only the daemon
"$MK" --preset demo --quiet --out "$T/demo.gguf" || fail "sil-mkmodel"
for stretch in 0 2; do
    write_conf "threads = 2" "max_running = 4" "prefill_budget = 64" "prefill_stretch = $stretch"
    start_daemon --model "$T/demo.gguf"
    python3 "$S" gap 300 64 $stretch $([ "$stretch" -gt 0 ] && echo 10 || echo 0)
    stop_daemon
done
