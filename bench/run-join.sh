#!/usr/bin/env bash
# Streams that join while a long prompt is evaluated: one batch-class stream decodes, another
# batch-class client sends a PROMPT-token prompt, and half a second later JOIN interactive
# clients start streams of their own (short prompts, which go first), so the number of decoding
# rows grows while the long prompt is still being evaluated under prefill_stretch. Reports the
# long prompt's time to first token and the first stream's gaps between tokens while it was
# evaluated and after it (all JOIN + 1 streams decoding, nothing else: the floor of the gap).
# With BASE_B (another build directory), runs alternate between its siliceod and this one.
#
# usage: bench/run-join.sh [MODEL.gguf]   (default: the sil-mkmodel bench model, made if absent)
# Environment: B (build dir, default build; NO_BUILD=1 uses its siliceod as it is), BASE_B and
#              BASE (its name in the file), THREADS (2), PROMPT (1024), JOIN (3), RUNS (2),
#              PREFILL_STRETCH (2), MACHINE (vm),
#              OUT (default bench/results/join-<machine>-<yyyymmdd>.json).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
. bench/daemon.sh
bench_prepare "${1:-}"
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-1024}
JOIN=${JOIN:-3}
RUNS=${RUNS:-2}
STRETCH=${PREFILL_STRETCH:-2}
MACHINE=${MACHINE:-vm}
OUT=${OUT:-bench/results/join-$MACHINE-$(date -u +%Y%m%d).json}

tmp=$(mktemp -d)
trap bench_cleanup EXIT
builds=("$B")
[ -z "${BASE_B:-}" ] || builds+=("$BASE_B")
for r in $(seq "$RUNS"); do
    for b in "${builds[@]}"; do
        sock=$tmp/s.sock
        printf '%s\n' "threads = $THREADS" "log_level = warning" "context = $((PROMPT + 4096))" \
            "prefill_stretch = $STRETCH" "prefix_cache = off" "max_running = $((JOIN + 2))" \
            > "$tmp/c.conf"
        B=$b bench_daemon "$tmp/c.conf" "$sock" "$tmp/daemon.log" "$model"
        name=this
        [ "$b" = "$B" ] || name=${BASE:-base}
        SILICEO_SOCKET=$sock PYTHONPATH=tests/integration python3 - "$PROMPT" "$JOIN" "$name" \
            >> "$tmp/runs.jsonl" <<'PY'
import json, random, statistics, sys, threading, time
from siltest import Client
n, n_join, name = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
c = Client(timeout=3600)
V = c.ok("status")[0]["model"]["n_vocab"]
eos = c.ok("tokenize", {"text": "<|im_end|><|endoftext|>", "special": True})[0]["ids"]
no_eos = {i: -100 for i in eos}
c.close()
rnd = random.Random(5)
ids = lambda k: [rnd.randrange(10, V - 64) for _ in range(k)]
res = {}

def stream(k, started=None):
    cd = Client(timeout=3600)
    times = []

    def on_note(m):
        times.append(time.monotonic())
        if started is not None and len(times) == 20:
            started.set()
    res["c%d" % k] = cd
    res["m%d" % k] = cd.send("generate", {"prompt_tokens": ids(16), "add_bos": False,
                                          "max_tokens": 1000000, "temperature": 0,
                                          "logit_bias": no_eos,
                                          "priority": "interactive" if k else "batch"})
    err, _, _ = cd.wait(res["m%d" % k], on_note=on_note)
    res["t%d" % k] = times
    cd.close()

started = threading.Event()
ths = [threading.Thread(target=stream, args=(0, started))]
ths[0].start()
started.wait()
time.sleep(1.0)
cp = Client(timeout=3600)
t0 = time.monotonic()
mid = cp.send("generate", {"prompt_tokens": ids(n), "add_bos": False, "max_tokens": 1,
                           "temperature": 0, "priority": "batch"})
time.sleep(0.5)
for k in range(1, n_join + 1):
    ths.append(threading.Thread(target=stream, args=(k,)))
    ths[-1].start()
t_join = time.monotonic()
err, r, _ = cp.wait(mid)
assert err is None, err
t1 = time.monotonic()
cp.close()
time.sleep(1.5)  # every stream decoding, nothing else
for k in range(n_join + 1):
    res["c%d" % k].send("cancel", {"id": res["m%d" % k]})
for th in ths:
    th.join()
t = res["t0"]
gap = lambda lo, hi: [b - a for a, b in zip(t, t[1:]) if a >= lo and b <= hi]
during, after = gap(t_join + 0.5, t1), gap(t1 + 0.2, t1 + 1.5)
pct = lambda v, q: sorted(v)[min(len(v) - 1, int(q * len(v)))]
ms = lambda x: round(1e3 * x, 2)
print(json.dumps({"build": name, "ttft_ms": round(r["timings"]["time_to_first_token_ms"], 1),
                  "during": {"n": len(during), "median_ms": ms(statistics.median(during)),
                             "p99_ms": ms(pct(during, 0.99))},
                  "after": {"n": len(after), "median_ms": ms(statistics.median(after))},
                  "loadavg": open("/proc/loadavg").read().split()[:3]}))
PY
        tail -1 "$tmp/runs.jsonl" >&2
        bench_daemon_stop
    done
done
python3 - "$OUT" "$model" "$THREADS" "$PROMPT" "$JOIN" "$STRETCH" "${BASE:-base}" \
    "$tmp/runs.jsonl" <<'PY'
import datetime, json, statistics, subprocess, sys
out, model, threads, n, n_join, stretch, base = sys.argv[1:8]
runs = [json.loads(l) for l in open(sys.argv[8])]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                        text=True).stdout.strip()
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo")
            if l.startswith("model name")), "")
results = []
for name in dict.fromkeys(r["build"] for r in runs):
    rs = [r for r in runs if r["build"] == name]
    cfg = "threads=%s,prompt=%s,join=%s,prefill_stretch=%s,build=%s" % (
        threads, n, n_join, stretch, commit if name == "this" else base)
    for metric, f in [("ttft_ms", lambda r: r["ttft_ms"]),
                      ("gap_during_median_ms", lambda r: r["during"]["median_ms"]),
                      ("gap_during_p99_ms", lambda r: r["during"]["p99_ms"]),
                      ("gap_after_median_ms", lambda r: r["after"]["median_ms"])]:
        v = [f(r) for r in rs]
        results.append({"metric": metric, "config": cfg, "value": statistics.median(v),
                        "unit": "ms", "runs": len(v), "min": min(v), "max": max(v)})
    results[-3]["floor"] = results[-1]["value"]
    results[-3]["floor_basis"] = ("the first stream's median gap after the prompt, every stream "
                                  "decoding and nothing else (same runs)")
json.dump({"benchmark": "join",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": commit, "command": "bench/run-join.sh (PROMPT=%s JOIN=%s THREADS=%s)" % (
               n, n_join, threads),
           "machine": {"cpu": cpu, "cores": int(threads)}, "model": {"file": model},
           "results": results, "runs": runs,
           "notes": "No peer: llama-batched-bench runs no mixed traffic."},
          open(out, "w"), indent=1)
for e in results:
    print(e["metric"], e["config"], e["value"])
PY
