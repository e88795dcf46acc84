#!/usr/bin/env bash
# Serving benchmark: time to first token and decode tok/s through siliceod (one request at a
# time, loopback Unix socket, the real daemon and sil-bench), on a tiny model so that the
# daemon's own costs (queueing, scheduling, packing, socket, wake-ups) are a visible part of each
# token. The same prompts run in process with sil-eval in the same run, alternating with the
# daemon runs, as a reference for what the engine alone does.
#
# usage: bench/run-serve.sh [MODEL.gguf]
#   MODEL.gguf  default: $SHARED/refdata/models/qwen3-tiny-Q8_0.gguf (SHARED defaults to
#               ../shared relative to the repository root, as for the tests)
# Environment: B (build dir, default build), RUNS (default 5), THREADS (default 2),
#              PROMPTS (prompt lengths in words, default "16 512"), GEN (tokens, default 128),
#              MACHINE (name in the results file, default vm), OUT (results file, default
#              bench/results/serve-<machine>-<yyyymmdd>.json).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
SHARED=${SHARED:-$(cd "$ROOT/.." && pwd)/shared}
model=${1:-$SHARED/refdata/models/qwen3-tiny-Q8_0.gguf}
B=${B:-build}
RUNS=${RUNS:-5}
THREADS=${THREADS:-2}
PROMPTS=${PROMPTS:-16 512}
GEN=${GEN:-128}
MACHINE=${MACHINE:-vm}
OUT=${OUT:-bench/results/serve-$MACHINE-$(date -u +%Y%m%d).json}
[ -f "$model" ] || { echo "run-serve.sh: no model at $model" >&2; exit 1; }

make -s B="$B" "$B/bin/siliceod" "$B/bin/sil-bench" "$B/bin/sil-eval" >&2

. bench/daemon.sh
tmp=$(mktemp -d)
trap bench_cleanup EXIT
sock=$tmp/siliceod.sock
# A config of our own so a system-wide /etc/siliceo/siliceod.conf never changes the figures.
printf 'threads = %s\nlog_level = warning\n' "$THREADS" > "$tmp/siliceod.conf"
bench_daemon "$tmp/siliceod.conf" "$sock" "$tmp/daemon.log" "$model"

cat /proc/loadavg > "$tmp/load-start"
# Runs alternate between the daemon and the in-process engine, so a change in the machine's
# load hits both alike. The first daemon request of each prompt length is a warm-up (page cache,
# thread start-up) and is not recorded.
for p in $PROMPTS; do
    "$B/bin/sil-bench" --socket "$sock" -p "$p" -n "$GEN" -r 1 > /dev/null
done
for r in $(seq "$RUNS"); do
    for p in $PROMPTS; do
        echo "run $r/$RUNS, prompt $p tokens: siliceod + sil-bench, then sil-eval" >&2
        "$B/bin/sil-bench" --socket "$sock" -p "$p" -n "$GEN" -r 1 -o "$tmp/bench-$p-$r.json" > /dev/null
        # sil-bench sends exactly p tokens of fresh text; the engine gets p tokens of words too.
        python3 -c "import sys; w='the quick brown fox jumps over a lazy dog'.split(); n=int(sys.argv[1]); print(' '.join(w[i % 9] for i in range(n)), end='')" "$p" >"$tmp/text"
        ids=$("$B/bin/sil-eval" --model "$model" --tokenize-file "$tmp/text" --json |
            python3 -c "import json,sys; print(','.join(map(str, json.load(sys.stdin)['ids'][:int(sys.argv[1])])))" "$p")
        "$B/bin/sil-eval" --model "$model" --tokens "$ids" --n-predict "$GEN" --logits none \
            --threads "$THREADS" --json > "$tmp/eval-$p-$r.json"
    done
done
cat /proc/loadavg > "$tmp/load-end"
bench_daemon_stop

python3 - "$tmp" "$RUNS" "$model" "$THREADS" "$GEN" "$OUT" "$B" "$PROMPTS" <<'PY'
import datetime, json, os, statistics, subprocess, sys
tmp, runs, model, threads, gen, out, build, prompts = sys.argv[1:9]
runs, prompts = int(runs), prompts.split()

def cpu():
    for l in open("/proc/cpuinfo"):
        if l.startswith("model name"):
            return l.split(":", 1)[1].strip()
    return "unknown"

def git(*a):
    try:
        return subprocess.run(["git", *a], capture_output=True, text=True, check=True).stdout.strip()
    except Exception:
        return ""

commit = git("rev-parse", "--short", "HEAD") or "unknown"
if git("status", "--porcelain", "--untracked-files=no", "--", "daemon", "libproto", "client", "kernels"):
    commit += "-dirty"
ram = int(open("/proc/meminfo").readline().split()[1]) / 1024 / 1024
results = []

def add(metric, config, unit, vals):
    vals = [v for v in vals if v is not None]
    if not vals:
        return
    results.append({"metric": metric, "config": config, "value": round(statistics.median(vals), 3),
                    "unit": unit, "runs": len(vals), "min": round(min(vals), 3), "max": round(max(vals), 3)})

n_prompt = {}
for p in prompts:
    bench = [json.load(open(f"{tmp}/bench-{p}-{r}.json")) for r in range(1, runs + 1)]
    ev = [json.load(open(f"{tmp}/eval-{p}-{r}.json")) for r in range(1, runs + 1)]
    n_prompt[p] = len(ev[0]["tokens"])
    cfg = f"siliceod,prompt_tokens={p},gen={gen},concurrency=1,threads={threads}"

    def get(b, metric):
        for x in b["results"]:
            if x["metric"] == metric:
                return x["value"]
        return None

    add("ttft_ms", cfg + ",clock=client", "ms", [get(b, "ttft_ms") for b in bench])
    add("ttft_ms", cfg + ",clock=daemon", "ms", [get(b, "daemon_ttft_ms") for b in bench])
    add("decode_tok_s", cfg, "tok/s", [get(b, "decode_tok_s") for b in bench])
    add("prefill_tok_s", cfg, "tok/s", [get(b, "prefill_tok_s") for b in bench])
    ecfg = f"sil-eval in process,prompt_tokens={n_prompt[p]},gen={gen},threads={threads}"
    add("decode_tok_s", ecfg, "tok/s", [e["timings"]["decode_tok_s"] for e in ev])
    add("prefill_tok_s", ecfg, "tok/s", [e["timings"]["prefill_tok_s"] for e in ev])

load0, load1 = open(f"{tmp}/load-start").read().split()[:3], open(f"{tmp}/load-end").read().split()[:3]
cmd = "bench/run-serve.sh" + ("" if model.endswith("qwen3-tiny-Q8_0.gguf") else " " + os.path.basename(model))
env = " ".join(f"{k}={os.environ[k]}" for k in ("RUNS", "THREADS", "PROMPTS", "GEN", "MACHINE") if k in os.environ)
doc = {
    "benchmark": "serve",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commit": commit,
    "command": (env + " " if env else "") + f"B={build} " + cmd,
    "machine": {"cpu": cpu(), "cores": os.cpu_count(), "ram_gib": round(ram, 1)},
    "model": {"file": os.path.basename(model), "bytes": os.path.getsize(model),
              "made_by": "refdata: tiny random Qwen3 (HF) converted to F16 GGUF, then llama-quantize Q8_0",
              "routing": "dense"},
    "results": results,
    "notes": (
        f"{runs} runs per figure after one warm-up request per prompt length; one request at a time "
        "(concurrency 1) over a loopback Unix socket; greedy, grace_tokens 0, so every request "
        f"generates {gen} tokens unless the model ends it. ttft_ms clock=client: sil-bench's clock "
        "from sending the request to the first token notification (includes parsing, tokenizing, "
        "queueing, the prefill step and the socket); clock=daemon: the daemon's "
        "time_to_first_token_ms (request queued to first token sampled). decode_tok_s and "
        "prefill_tok_s of siliceod are the daemon's own timings, for a fresh prompt of exactly "
        "prompt_tokens tokens each request (no prefix-cache hit). The sil-eval rows run a prompt "
        "of as many tokens in process, alternating with the daemon runs, as the engine-only reference. "
        "No peer: no other daemon with a streaming round trip was available on this machine "
        "(the llama.cpp tree here has no server binary), so peer_value is left out; no floor "
        f"computed (the tiny model fits in cache, so no bandwidth floor applies). Load average "
        f"{' '.join(load0)} before, {' '.join(load1)} after (shared machine)."),
}
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
for r in results:
    print(f"{r['metric']:14s} {r['config']:80s} {r['value']:10.2f} {r['unit']} (min {r['min']}, max {r['max']})")
print("results written to", out)
PY
