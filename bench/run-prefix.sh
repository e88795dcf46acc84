#!/usr/bin/env bash
# Prefix-cache benchmark: time to first token through siliceod for a long prompt (PROMPT tokens,
# default 4096) cold, and warm: the same length of which SHARED_PCT percent (default 90) is the
# start of an earlier prompt, so the daemon reuses its cached blocks (up to the last recurrent
# snapshot at or below the shared part on the hybrid bench model). Cold and warm runs alternate,
# so the machine's load hits both alike. Every prompt is random token ids, so nothing but the
# intended prefix is shared; the one prompt whose start the warm runs share is primed first (a
# cold run itself, recorded as one).
#
# usage: bench/run-prefix.sh [MODEL.gguf]   (default: the sil-mkmodel bench model, made if absent)
# Environment: B (build dir, default build; NO_BUILD=1 uses its siliceod as it is), THREADS (2),
#              CKPT_MEMORY (prefix_checkpoint_memory, e.g. 8G: a big model's snapshots are large),
#              PROMPT (4096), SHARED_PCT (90), RUNS (3), CKPT_BLOCKS (prefix_checkpoint_blocks, 4),
#              MACHINE (vm),
#              OUT (default bench/results/prefix-<machine>-<yyyymmdd>.json).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
. bench/daemon.sh
bench_prepare "${1:-}"
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-4096}
SHARED_PCT=${SHARED_PCT:-90}
RUNS=${RUNS:-3}
CKPT_BLOCKS=${CKPT_BLOCKS:-4}
MACHINE=${MACHINE:-vm}
OUT=${OUT:-bench/results/prefix-$MACHINE-$(date -u +%Y%m%d).json}

tmp=$(mktemp -d)
trap bench_cleanup EXIT
sock=$tmp/siliceod.sock
printf '%s\n' "threads = $THREADS" "log_level = warning" "context = $((PROMPT + 256))" \
    "prefill_chunk = 256" "prefix_checkpoint_blocks = $CKPT_BLOCKS" \
    ${CKPT_MEMORY:+"prefix_checkpoint_memory = $CKPT_MEMORY"} > "$tmp/siliceod.conf"
bench_daemon "$tmp/siliceod.conf" "$sock" "$tmp/daemon.log" "$model"

SILICEO_SOCKET=$sock PYTHONPATH=tests/integration python3 - "$model" "$THREADS" "$PROMPT" \
    "$SHARED_PCT" "$RUNS" "$CKPT_BLOCKS" "$OUT" <<'PY'
import datetime, json, random, statistics, sys
from siltest import Client
model, threads, n, pct, runs, ckpt, out = sys.argv[1:8]
threads, n, pct, runs, ckpt = int(threads), int(n), int(pct), int(runs), int(ckpt)
c = Client(timeout=3600)
st = c.ok("status")[0]
V = st["model"]["n_vocab"]
rnd = random.Random(7)
ids = lambda k: [rnd.randrange(10, V - 64) for _ in range(k)]

def ttft(prompt):
    r = c.ok("generate", {"prompt_tokens": prompt, "add_bos": False, "max_tokens": 1,
                          "temperature": 0})[0]
    return {"ttft_ms": r["timings"]["time_to_first_token_ms"], "n_prompt": r["n_prompt"],
            "n_cached": r["n_cached"]}

shared = n * pct // 100
base = ids(n)
cold, warm = [], []
print("prime (cold): %d tokens" % n, file=sys.stderr)
cold.append(ttft(base))
for i in range(runs):
    cold.append(ttft(ids(n)))
    print("cold %d: %.0f ms" % (i + 1, cold[-1]["ttft_ms"]), file=sys.stderr)
    warm.append(ttft(base[:shared] + ids(n - shared)))
    print("warm %d: %.0f ms, %d cached" % (i + 1, warm[-1]["ttft_ms"], warm[-1]["n_cached"]),
          file=sys.stderr)
pc = c.ok("status")[0]["prefix_cache"]
med = lambda v: statistics.median(x["ttft_ms"] for x in v)
res = {"benchmark": "prefix-cache", "date": datetime.date.today().isoformat(), "model": model,
       "arch": st["model"]["arch"], "threads": threads, "prompt_tokens": n, "shared_tokens": shared,
       "prefix_checkpoint_blocks": ckpt, "cold": cold, "warm": warm,
       "cold_ttft_ms_median": med(cold), "warm_ttft_ms_median": med(warm),
       "warm_over_cold": med(warm) / med(cold), "prefix_cache_status": pc,
       "loadavg_end": open("/proc/loadavg").read().split()[:3]}
json.dump(res, open(out, "w"), indent=1)
print("cold %.0f ms, warm %.0f ms (%d of %d cached): warm/cold %.3f" %
      (res["cold_ttft_ms_median"], res["warm_ttft_ms_median"], warm[0]["n_cached"], n,
       res["warm_over_cold"]))
PY
bench_daemon_stop
