#!/usr/bin/env bash
# Inter-token gap benchmark: one client streams a long generation through siliceod while another
# client's PROMPT-token prompt (default 4096) prefills; the stream's gaps between token
# notifications are split into those while the prompt was being evaluated and those outside it,
# and the median and p99 of each are reported with the prompt's time to first token. Run once
# per PREFILL_STRETCH value (default "2 0": the budget by time, then fixed prefill_budget
# chunks), RUNS times each (default 3), alternating.
#
# usage: bench/run-gap.sh [MODEL.gguf]   (default: the sil-mkmodel bench model, made if absent)
# Environment: B (build dir, default build; NO_BUILD=1 uses its siliceod as it is), THREADS (2),
#              PROMPT (4096), RUNS (3), PREFILL_STRETCH ("2 0"), MACHINE (vm),
#              OUT (default bench/results/gap-<machine>-<yyyymmdd>.json).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
. bench/daemon.sh
bench_prepare "${1:-}"
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-4096}
RUNS=${RUNS:-3}
STRETCHES=${PREFILL_STRETCH:-2 0}
MACHINE=${MACHINE:-vm}
OUT=${OUT:-bench/results/gap-$MACHINE-$(date -u +%Y%m%d).json}

tmp=$(mktemp -d)
trap bench_cleanup EXIT
for s in $STRETCHES; do
    sock=$tmp/s$s.sock
    # the prefix cache off: every run's prompt is evaluated in full
    printf '%s\n' "threads = $THREADS" "log_level = warning" "context = $((PROMPT + 4608))" \
        "prefill_stretch = $s" "prefix_cache = off" > "$tmp/s$s.conf"
    bench_daemon "$tmp/s$s.conf" "$sock" "$tmp/daemon-s$s.log" "$model"
    SILICEO_SOCKET=$sock PYTHONPATH=tests/integration python3 - "$PROMPT" "$RUNS" "$s" \
        > "$tmp/r-s$s.json" <<'PY'
import json, random, statistics, sys, threading, time
from siltest import Client
n, runs, stretch = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
c = Client(timeout=3600)
st = c.ok("status")[0]
V = st["model"]["n_vocab"]
# the end-of-generation tokens kept out, so the stream runs until it is cancelled
eos = c.ok("tokenize", {"text": "<|im_end|><|endoftext|>", "special": True})[0]["ids"]
no_eos = {i: -100 for i in eos}
c.close()
rnd = random.Random(11)
ids = lambda k: [rnd.randrange(10, V - 64) for _ in range(k)]

def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]

def one():
    res, started = {}, threading.Event()

    def decoder():
        cd = Client(timeout=3600)
        times = []

        def on_note(m):
            times.append(time.monotonic())
            if len(times) == 20:
                started.set()
        res["dc"] = cd
        res["dm"] = cd.send("generate", {"prompt_tokens": ids(16), "add_bos": False,
                                         "max_tokens": 1000000, "temperature": 0,
                                         "logit_bias": no_eos})
        err, r, _ = cd.wait(res["dm"], on_note=on_note)
        res["d"] = (err, r, times)
        cd.close()

    def prefiller():
        started.wait()
        time.sleep(1.0)  # gaps before the prompt arrives
        cp = Client(timeout=3600)
        t0 = time.monotonic()
        first = []
        err, r, _ = cp.wait(cp.send("generate", {"prompt_tokens": ids(n), "add_bos": False,
                                                 "max_tokens": 1, "temperature": 0}),
                            on_note=lambda m: first.append(time.monotonic()))
        res["p"] = (err, r, t0, first[0] if first else time.monotonic())
        cp.close()
        time.sleep(1.0)  # and after it
        res["dc"].send("cancel", {"id": res["dm"]})

    td, tp = threading.Thread(target=decoder), threading.Thread(target=prefiller)
    td.start(); tp.start(); tp.join(); td.join()
    err, r, times = res["d"]
    perr, pr, p0, p1 = res["p"]
    assert err is None and perr is None, (err, perr)
    during = [b - a for a, b in zip(times, times[1:]) if a >= p0 and b <= p1]
    outside = [b - a for a, b in zip(times, times[1:]) if b < p0 or a > p1]
    ms = lambda x: round(1e3 * x, 2)
    return {"prompt_tokens": pr["n_prompt"], "ttft_ms": round(pr["timings"]["time_to_first_token_ms"], 1),
            "during": {"n": len(during), "median_ms": ms(statistics.median(during)),
                       "p99_ms": ms(pct(during, 0.99)), "max_ms": ms(max(during))},
            "outside": {"n": len(outside), "median_ms": ms(statistics.median(outside)),
                        "p99_ms": ms(pct(outside, 0.99))},
            "p99_over_median_during": round(pct(during, 0.99) / statistics.median(during), 3),
            "median_during_over_outside": round(statistics.median(during) / statistics.median(outside), 3),
            "loadavg": open("/proc/loadavg").read().split()[:3]}

out = []
for i in range(runs):
    out.append(one())
    print("stretch %g run %d: %s" % (stretch, i + 1, json.dumps(out[-1])), file=sys.stderr)
json.dump({"prefill_stretch": stretch, "runs": out}, sys.stdout)
PY
    bench_daemon_stop
done
python3 - "$OUT" "$model" "$THREADS" "$PROMPT" "$tmp"/r-s*.json <<'PY'
import datetime, json, statistics, subprocess, sys
out, model, threads, n = sys.argv[1:5]
sets = [json.load(open(f)) for f in sys.argv[5:]]
try:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
except OSError:
    commit = ""
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
results = []
for s in sets:
    k = s["prefill_stretch"]
    runs = s["runs"]
    med = lambda f: statistics.median(f(r) for r in runs)
    cfg = "threads=%s,prompt=%s,prefill_stretch=%g" % (threads, n, k)
    for metric, f, unit in [
        ("gap_during_median_ms", lambda r: r["during"]["median_ms"], "ms"),
        ("gap_during_p99_ms", lambda r: r["during"]["p99_ms"], "ms"),
        ("gap_outside_median_ms", lambda r: r["outside"]["median_ms"], "ms"),
        ("gap_p99_over_median_during", lambda r: r["p99_over_median_during"], "ratio"),
        ("ttft_ms", lambda r: r["ttft_ms"], "ms")]:
        v = [f(r) for r in runs]
        results.append({"metric": metric, "config": cfg, "value": statistics.median(v), "unit": unit,
                        "runs": len(v), "min": min(v), "max": max(v)})
    results[-5]["floor"] = results[-3]["value"]
    results[-5]["floor_basis"] = "the stream's median gap with no prompt being evaluated (same run)"
json.dump({"benchmark": "gap", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": commit, "command": "bench/run-gap.sh (PROMPT=%s THREADS=%s)" % (n, threads),
           "machine": {"cpu": cpu, "cores": threads}, "model": {"file": model},
           "results": results, "raw": sets,
           "notes": "No peer figure: llama-bench and llama-batched-bench do not run a stream beside "
                    "another client's prompt, and llama-server was not run. Gaps are between the "
                    "stream's token notifications as the client receives them; 'during' is the window "
                    "from sending the prompt to its first token."},
          open(out, "w"), indent=1)
for r in results:
    print(r["metric"], r["config"], r["value"])
PY
