#!/usr/bin/env bash
# Batched decode benchmark: aggregate decode tok/s of 1, 2, 4, 8, 16 sequences decoding together
# (one engine eval of N rows per step) on the sil-mkmodel "bench" model, each figure next to its
# byte bound: (backbone bytes + bytes of the union of experts the step's routing touched) over
# the streaming read bandwidth measured just before it in the same process (sil-batchbench).
#
# usage: bench/run-batch.sh [MODEL.gguf]
#   MODEL.gguf  default: bench/models/bench-qwen35moe-q4_k_m.gguf, made by bench/make-bench-model.sh
#               if missing
# Environment: B (build dir, default build), RUNS (default 3), THREADS (default 2),
#              STREAMS (default 1,2,4,8,16), GEN (decode steps, default 64), PROMPT (tokens per
#              sequence, default 32), MACHINE (name in the results file, default vm),
#              OUT (default bench/results/batch-<machine>-<yyyymmdd>.json),
#              BASE_BIN (a sil-batchbench built from an older commit, BASE its name: runs alternate
#              between the two and the file holds both, the older one's configs marked build=BASE),
#              PEER (llama.cpp's llama-batched-bench built for this CPU, outside the repo: it runs
#              in every run after ours with the same threads, prompt, generated tokens and stream
#              counts, and its S_TG t/s median is each figure's peer_value),
#              MAKE (default make; true runs the binaries in B as they are, on a machine that
#              cannot build).
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:-bench/models/bench-qwen35moe-q4_k_m.gguf}
B=${B:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
STREAMS=${STREAMS:-1,2,4,8,16}
GEN=${GEN:-64}
PROMPT=${PROMPT:-32}
MACHINE=${MACHINE:-vm}
OUT=${OUT:-bench/results/batch-$MACHINE-$(date -u +%Y%m%d).json}

${MAKE:-make} -s B="$B" "$B/bin/sil-batchbench" "$B/bin/sil-mkmodel" >&2
if [ ! -f "$model" ]; then
    mkdir -p "$(dirname "$model")"
    OUT="$model" B="$B" bench/make-bench-model.sh --quiet >&2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat /proc/loadavg > "$tmp/load-start"
args=(--model "$model" --threads "$THREADS" --streams "$STREAMS" --gen "$GEN" --prompt "$PROMPT")
: > "$tmp/runs.jsonl"
: > "$tmp/base.jsonl"
: > "$tmp/peer.txt"
for r in $(seq "$RUNS"); do
    if [ -n "${BASE_BIN:-}" ]; then
        echo "run $r/$RUNS: ${BASE:-base}" >&2
        "$BASE_BIN" "${args[@]}" --runs 1 >> "$tmp/base.jsonl"
    fi
    echo "run $r/$RUNS" >&2
    "$B/bin/sil-batchbench" "${args[@]}" --runs 1 >> "$tmp/runs.jsonl"
    if [ -n "${PEER:-}" ]; then
        echo "run $r/$RUNS: peer" >&2
        n_max=$(tr ',' '\n' <<< "$STREAMS" | sort -n | tail -1)
        "$PEER" -m "$model" -t "$THREADS" -c $(((PROMPT + GEN) * n_max + 64)) -npp "$PROMPT" \
            -ntg "$GEN" -npl "$STREAMS" 2> /dev/null | grep -E '^\|' >> "$tmp/peer.txt"
    fi
done
cat /proc/loadavg > "$tmp/load-end"

python3 - "$tmp" "$model" "$OUT" "$B" "${BASE:-base}" "${PEER:-}" <<'PY'
import datetime, json, os, statistics, subprocess, sys
tmp, model, out, build, base, peer = sys.argv[1:7]
# llama-batched-bench's table: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | ...
peer_tg = {}
for l in open(f"{tmp}/peer.txt"):
    c = [x.strip() for x in l.strip().strip("|").split("|")]
    if len(c) >= 8 and c[2].isdigit():
        peer_tg.setdefault(int(c[2]), []).append(float(c[7]))
sets = [("", [json.loads(l) for l in open(f"{tmp}/runs.jsonl")]),
        (f",build={base}", [json.loads(l) for l in open(f"{tmp}/base.jsonl")])]

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
if git("status", "--porcelain", "--untracked-files=no", "--", "daemon", "kernels", "bench"):
    commit += "-dirty"
results = []
for tag, rows in sets:
    for n in sorted({r["streams"] for r in rows}):
        rs = [r for r in rows if r["streams"] == n]
        v = [r["decode_tok_s"] for r in rs]
        fl = statistics.median([r["floor_tok_s"] for r in rs])
        eb = statistics.median([r["expert_bytes_step"] for r in rs])
        bw = statistics.median([r["read_bw_gb_s"] for r in rs])
        r0 = rs[0]
        results.append({
            "metric": "decode_tok_s",
            "config": f"streams={n},threads={r0['threads']},prompt={r0['prompt']},gen={r0['gen']},aggregate{tag}",
            "value": round(statistics.median(v), 3), "unit": "tok/s",
            "floor": round(fl, 3),
            "floor_basis": (f"N * read_bw / (backbone {r0['backbone_bytes_step'] / 1e6:.1f} MB + union of "
                            f"routed experts {eb / 1e6:.1f} MB per step, counted from the run's routing); "
                            f"read_bw {bw:.2f} GB/s with {r0['threads']} threads, measured before each run"),
            "runs": len(v), "min": round(min(v), 3), "max": round(max(v), 3),
            "cpu_ms_per_step": round(statistics.median([r["cpu_ms_step"] for r in rs]), 3),
            "cpu_tok_s": round(n * 1e3 / statistics.median([r["cpu_ms_step"] for r in rs]), 3),
        })
        if not tag and n in peer_tg:
            results[-1].update({
                "peer": (f"llama.cpp llama-batched-bench -t {r0['threads']} -npp {r0['prompt']} "
                         f"-ntg {r0['gen']} (S_TG t/s), in every run after ours, same file"),
                "peer_value": round(statistics.median(peer_tg[n]), 3),
                "peer_runs": len(peer_tg[n]),
                "peer_ratio": round(statistics.median(v) / statistics.median(peer_tg[n]), 3)})
load0 = open(f"{tmp}/load-start").read().split()[:3]
load1 = open(f"{tmp}/load-end").read().split()[:3]
env = " ".join(f"{k}={os.environ[k]}" for k in ("RUNS", "THREADS", "STREAMS", "GEN", "PROMPT", "MACHINE", "BASE")
               if k in os.environ)
ram = int(open("/proc/meminfo").readline().split()[1]) / 1024 / 1024
doc = {
    "benchmark": "batch",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commit": commit,
    "command": (env + " " if env else "") + f"B={build} bench/run-batch.sh",
    "machine": {"cpu": cpu(), "cores": os.cpu_count(), "ram_gib": round(ram, 1)},
    "model": {"file": os.path.basename(model), "bytes": os.path.getsize(model),
              "made_by": "sil-mkmodel --preset bench --type q4_k_m --seed 1", "routing": "uniform random"},
    "results": results,
    "notes": (
        "sil-batchbench: N sequences, each prefilled with its own prompt, then GEN decode steps of "
        "one engine evaluation with N rows (greedy: the engine's argmax of each row, included in the "
        "time); runs alternate with the BASE build where one is given; value = aggregate tok/s of the decode steps, median of runs; stream counts "
        "alternate within each run. floor = byte bound: N tokens per step over (every "
        "non-expert tensor less the embedding table, N embedding rows, and the routed-expert "
        "matrices of every expert some row of the step was routed to, once per layer, as the "
        "engine counted them) / the streaming read bandwidth of the same thread count, measured "
        "just before each measurement. The recurrent (delta-net) state each sequence reads and "
        "writes per token is not in the floor. cpu_ms_per_step = process CPU time per step "
        "(with one thread, the work; with more, it includes the pool's spinning); cpu_tok_s = "
        "N / cpu_ms_per_step: with one thread, the aggregate the work allows when the core is not "
        "shared, steadier than value on a loaded machine. "
        + ("peer_value: llama.cpp's llama-batched-bench built for this CPU outside the repo, run "
           "after ours in every run (S_TG: its decode rate over the same parallel sequences). "
           if peer_tg else "No peer: llama-batched-bench was not given (PEER), so peer_value is left out. ")
        + f"Load average {' '.join(load0)} before, {' '.join(load1)} after."),
}
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
for r in results:
    print(f"{r['config']:60s} {r['value']:9.2f} tok/s  floor {r['floor']:9.2f}  "
          f"(min {r['min']}, max {r['max']}, cpu {r['cpu_ms_per_step']} ms/step)")
print("results written to", out)
PY
