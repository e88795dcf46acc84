#!/usr/bin/env bash
# The daemon with the routed experts' host tier on (a host budget smaller than the experts): a
# budget under the least the model takes is refused with that least in bytes; a little above it,
# status says the tier is on and the caches gave way (each below what it was configured to,
# the idle sessions held to their share), and with nothing generating a long prompt goes in host_prefill_chunk steps
# (each layer's missing experts read from the file once a step), cut only at a prefix-cache
# snapshot point, where without the tier it goes in prefill_chunk steps; the snapshot is taken,
# so the same prompt again reuses it.
. "$(dirname "$0")/lib.bash"
D=$SIL_BUILD/bin/siliceod
PROMPT=$(python3 -c "print(' '.join('w%d' % (i % 97) for i in range(400)))")

write_conf "threads = 2" "host_budget = 4K"
rc=0
timeout 60 "$D" --config "$T/siliceod.conf" --socket "$SILICEO_SOCKET" --model "$MOE_MODEL" \
    >"$T/small.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "a 4 KiB host budget was taken"
MIN=$(sed -n 's/.*under the least this model takes, [^(]*(\([0-9]*\) bytes).*/\1/p' "$T/small.log" | head -1)
grep -q "host tier needs at least" "$T/small.log" || { cat "$T/small.log"; fail "no tier minimum in the error"; }
[ -n "$MIN" ] && [ "$MIN" -gt 4096 ] || { cat "$T/small.log"; fail "no minimum in the error"; }
echo "ok: a 4 KiB host budget refused; the minimum is $MIN bytes"

# steps PREFIX: the generate's prompt tokens, cached tokens and the scheduler steps it took
steps() {
    python3 - "$PROMPT" "$1" <<'PY'
import sys
from siltest import Client, check
prompt, want = sys.argv[1], sys.argv[2]
c = Client()
st = c.ok("status")[0]
tier = st["host_tier"]
hb = st["host_budget"]
if want == "tier":
    check(tier["on"] is True and tier["full"] is False and tier["slots"] > 0, "status: the host tier is on, not full (%s)" % tier)
    check(hb["host_tier"] is True and hb["gave_way"] is True, "status: the caches gave way (%s)" % hb)
    check(hb["fixed"] + hb["experts"] + sum(hb[k]["limit"] for k in ("snapshots", "prefix_blocks", "sessions"))
          <= hb["budget"], "status: the plan is within the budget (%s)" % hb)
    check(tier["slots"] * tier["slot_bytes"] <= hb["experts"], "status: the tier within its share")
    check(hb["sessions"]["limit"] < hb["sessions"]["configured"] == 1 << 30, "status: the sessions gave way (%s)" % hb)
    check(hb["snapshots"]["limit"] == hb["snapshots"]["configured"] == 128 << 10,
          "status: snapshots under their floor kept (%s)" % hb)
    check(hb["prefix_blocks"]["configured"] == 0, "status: prefix blocks within kv_budget (%s)" % hb)
    sl = c.ok("sessions.list")[0]
    check(sl["memory_limit"] == hb["sessions"]["limit"], "sessions.list: the sessions' share (%s)" % sl)
else:
    check(tier["on"] is False, "status: the host tier is off")
    check(hb["gave_way"] is False and hb["sessions"]["limit"] == 1 << 30, "status: no cache gave way")
s0 = c.ok("metrics")[0]["metrics"]["siliceo_eval_steps_total"]
r, _ = c.ok("generate", {"prompt": prompt, "max_tokens": 1, "temperature": 0, "grace_tokens": 0})
s1 = c.ok("metrics")[0]["metrics"]["siliceo_eval_steps_total"]
r2, _ = c.ok("generate", {"prompt": prompt, "max_tokens": 1, "temperature": 0, "grace_tokens": 0})
print(r["n_prompt"], r2["n_cached"], s1 - s0)
PY
}

# 1 MiB above the least: with the caches' floors, less than the tiny model's 2 MiB of experts;
# a KV pool of its own (kv_budget) keeps the prefix blocks out of the budget's plan
write_conf "threads = 2" "host_budget = $((MIN + (1 << 20)))" "prefill_chunk = 16" "host_prefill_chunk = 1024" \
    "kv_budget = 4M" "prefix_checkpoint_memory = 128K"
start_daemon --model "$MOE_MODEL"
read -r NP CACHED STEPS < <(steps tier | tail -1)
stop_daemon
echo "tier: a prompt of $NP tokens in $STEPS steps, $CACHED reused the second time"
[ "$NP" -ge 300 ] || fail "the prompt has $NP tokens"
# one step to the last snapshot point (a multiple of 64 below the prompt's end), one for the rest
[ "$STEPS" -le 3 ] || fail "the host tier's prompt took $STEPS steps"
[ "$CACHED" -ge 256 ] || fail "the second request reused $CACHED tokens"

write_conf "threads = 2" "host_budget = off" "prefill_chunk = 16" "host_prefill_chunk = 1024"
start_daemon --model "$MOE_MODEL"
read -r NP2 CACHED2 STEPS2 < <(steps off | tail -1)
stop_daemon
echo "off: a prompt of $NP2 tokens in $STEPS2 steps, $CACHED2 reused the second time"
[ "$STEPS2" -ge $((NP2 / 16)) ] || fail "without the tier the prompt took $STEPS2 steps"
echo "ok: daemon_tier"
