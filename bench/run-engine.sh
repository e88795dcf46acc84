#!/usr/bin/env bash
# Engine CPU benchmark: prefill pp512 and decode tg128 tok/s with 2 threads on the sil-mkmodel
# "bench" model (qwen35moe, 12 layers, hidden 1024, 64 experts top-8, q4_k_m), next to llama.cpp's
# llama-bench on the same file in the same run, plus memory beyond the mapped weights at a 4k context.
#
# usage: bench/run-engine.sh PEER_BIN_DIR [MODEL.gguf]
#   PEER_BIN_DIR  directory holding llama.cpp's llama-bench (skipped, and said so, if absent)
#   MODEL.gguf    default: bench/models/bench-qwen35moe-q4_k_m.gguf, made by bench/make-bench-model.sh
#                 (or sil-mkmodel --preset bench) if missing
# Environment: B (build dir, default build), RUNS (default 3), THREADS (default 2),
#              MACHINE (name in the results file, default vm).
# Writes bench/results/engine-<machine>-<yyyymmdd>.json.
set -euo pipefail
cd "$(dirname "$0")/.."
peer_dir=${1:?usage: bench/run-engine.sh PEER_BIN_DIR [MODEL.gguf]}
model=${2:-bench/models/bench-qwen35moe-q4_k_m.gguf}
B=${B:-build}
RUNS=${RUNS:-3}
THREADS=${THREADS:-2}
export MACHINE=${MACHINE:-vm}
made_by="sil-mkmodel --preset bench --type q4_k_m --seed 1"

make -s B="$B" "$B/bin/sil-eval" "$B/bin/sil-mkmodel" "$B/bin/sil-qbench" >&2
if [ ! -f "$model" ]; then
    mkdir -p "$(dirname "$model")"
    if [ -x bench/make-bench-model.sh ]; then
        OUT="$model" B="$B" bench/make-bench-model.sh >&2
    else
        "$B/bin/sil-mkmodel" --preset bench --type q4_k_m --seed 1 --quiet --out "$model" >&2
    fi
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# 512 prompt ids (any ids below the vocab size: the weights are random, so content is irrelevant)
ids512=$(python3 -c 'print(",".join(str(100 + (i * 37) % 20000) for i in range(512)))')
ids4k=$(python3 -c 'print(",".join(str(100 + (i * 37) % 20000) for i in range(4095)))')

cat /proc/loadavg > "$tmp/load-start"
echo "read bandwidth (sil-qbench)" >&2
"$B/bin/sil-qbench" --types q4_K --runs 3 --mib 256 > "$tmp/qbench.jsonl"

# Runs of the two engines alternate, so a change in the machine's load hits both alike.
peer_ok=0
[ -x "$peer_dir/llama-bench" ] && peer_ok=1
for r in $(seq "$RUNS"); do
    echo "sil-eval run $r/$RUNS" >&2
    "$B/bin/sil-eval" --model "$model" --tokens "$ids512" --n-predict 129 --logits none \
        --threads "$THREADS" --json > "$tmp/sil-$r.json"
    if [ "$peer_ok" = 1 ]; then
        echo "llama-bench (peer) run $r/$RUNS" >&2
        if ! "$peer_dir/llama-bench" -m "$model" -t "$THREADS" -p 512 -n 128 -r 1 -o json \
            > "$tmp/peer-$r.json" 2> "$tmp/peer.err"; then
            tail -n 5 "$tmp/peer.err" >&2
            peer_ok=0
        fi
    fi
done
echo "sil-eval 4k-context memory run" >&2
"$B/bin/sil-eval" --model "$model" --tokens "$ids4k" --n-predict 1 --logits none \
    --threads "$THREADS" --json > "$tmp/sil-4k.json"
cat /proc/loadavg > "$tmp/load-end"

python3 - "$tmp" "$RUNS" "$peer_ok" "$model" "$made_by" "$THREADS" "$peer_dir" "$*" <<'PY'
import json, os, platform, statistics, struct, subprocess, sys, datetime
tmp, runs, peer_ok, model, made_by, threads, peer_dir, args = sys.argv[1:9]
runs, peer_ok = int(runs), peer_ok == "1"
sil = [json.load(open(f"{tmp}/sil-{r}.json")) for r in range(1, runs + 1)]
mem4k = json.load(open(f"{tmp}/sil-4k.json"))["memory"]
def cpu():
    for l in open("/proc/cpuinfo"):
        if l.startswith("model name"):
            return l.split(":", 1)[1].strip()
    return platform.processor()
ram = int(open("/proc/meminfo").readline().split()[1]) / 1024 / 1024

def decode_bytes_per_token(path):
    """Weight bytes one decode token must read: every tensor, routed experts scaled by
    expert_used_count / expert_count, one row of token_embd."""
    # (block elements, block bytes) of the GGUF types the bench model uses
    blocks = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
              10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 30: (1, 2)}
    f = open(path, "rb")
    def rd(fmt):
        return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]
    def rs():
        return f.read(rd("Q"))
    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
    def rv(t):
        if t == 8:
            return rs()
        if t == 9:
            et, n = rd("I"), rd("Q")
            return [rv(et) for _ in range(n)]
        return rd(scalar[t])
    f.read(4); rd("I"); nt = rd("Q"); nkv = rd("Q")
    kv = {}
    for _ in range(nkv):
        k = rs().decode(); t = rd("I"); kv[k] = rv(t)
    arch = kv["general.architecture"].decode()
    used = kv.get(arch + ".expert_used_count", 1) / kv.get(arch + ".expert_count", 1)
    total = 0.0
    for _ in range(nt):
        name = rs().decode(); nd = rd("I"); ne = [rd("Q") for _ in range(nd)]; t = rd("I"); rd("Q")
        n = 1
        for x in ne:
            n *= x
        b = n // blocks[t][0] * blocks[t][1]
        total += b * used if "_exps" in name else b / ne[1] if name == "token_embd.weight" else b
    return total

bw = None
for line in open(f"{tmp}/qbench.jsonl"):
    r = json.loads(line)
    # the best sample: on a shared host the median can sit below what decode itself reaches
    if r["metric"] == "read_bw_gb_s" and r["config"].startswith(f"threads={min(int(threads), 2)},"):
        bw = r["max"]
bytes_tok = decode_bytes_per_token(model)
peer = {"prefill_tok_s": [], "decode_tok_s": []}
peer_name = None
if peer_ok:
    for r in range(1, runs + 1):
        for t in json.load(open(f"{tmp}/peer-{r}.json")):
            key = "prefill_tok_s" if t["n_prompt"] > 0 and t["n_gen"] == 0 else "decode_tok_s"
            peer[key].append(t["avg_ts"])
            peer_name = f"llama.cpp {t.get('build_commit', '?')} llama-bench -t {threads} -p 512 -n 128 (backend {t.get('backends', '?')})"
def entry(metric, config, values, unit, peer_key=None):
    e = {"metric": metric, "config": config, "value": round(statistics.median(values), 2), "unit": unit,
         "runs": len(values), "min": round(min(values), 2), "max": round(max(values), 2)}
    if peer_key and peer.get(peer_key):
        e["peer"] = peer_name
        e["peer_value"] = round(statistics.median(peer[peer_key]), 2)
        e["peer_min"] = round(min(peer[peer_key]), 2)
        e["peer_max"] = round(max(peer[peer_key]), 2)
    return e
results = [
    entry("prefill_tok_s", f"pp512,threads={threads}", [s["timings"]["prefill_tok_s"] for s in sil], "tok/s", "prefill_tok_s"),
    dict(entry("decode_tok_s", f"tg128 after a 512-token prompt,threads={threads}", [s["timings"]["decode_tok_s"] for s in sil], "tok/s", "decode_tok_s"),
         **({"floor": round(bw * 1e9 / bytes_tok, 1),
             "floor_basis": f"{bytes_tok / 2**20:.1f} MiB of weights per token (routed experts x used/count) / "
                            f"{bw} GB/s read bandwidth (best of 3 sil-qbench samples, {min(int(threads), 2)} threads, this run)"} if bw else {})),
    entry("rss_mib", "anonymous RSS (beyond the mapped weights) after pp512+tg128", [s["memory"]["rss_anon_mib"] for s in sil], "MiB"),
    {"metric": "rss_mib", "config": "anonymous RSS (beyond the mapped weights) after a 4095-token prefill, n_ctx 4096",
     "value": mem4k["rss_anon_mib"], "unit": "MiB", "runs": 1, "min": mem4k["rss_anon_mib"], "max": mem4k["rss_anon_mib"]},
]
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
date = datetime.datetime.now(datetime.timezone.utc)
out = {
    "benchmark": "engine",
    "date": date.strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commit": commit,
    # paths are machine-specific: the command is recorded with placeholders
    "command": "B=... RUNS=%d THREADS=%s bench/run-engine.sh PEER_BIN_DIR%s" % (runs, threads, " MODEL.gguf" if len(args.split()) > 1 else ""),
    "machine": {"cpu": cpu(), "cores": os.cpu_count(), "ram_gib": round(ram, 1)},
    "model": {"file": os.path.basename(model), "bytes": os.path.getsize(model), "made_by": made_by, "routing": "uniform (random weights)"},
    "results": results,
    "notes": (f"Load average at start / end: {open(tmp + '/load-start').read().split()[0]} / "
              f"{open(tmp + '/load-end').read().split()[0]} (shared host: other jobs change the speed of both engines; "
              "runs of the two alternate). "
              "sil-eval --json timings: prefill = one 512-row batch; decode = 128 greedy tokens after the prompt "
              "(llama-bench tg128 starts from an empty context). RSS is RssAnon from /proc/self/status at exit "
              "(nothing is freed before, so it is the peak): scratch + KV + recurrent state, not the mmap'd weights. "
              + ("" if peer_ok else "Peer llama-bench not run: not found or failed in " + peer_dir + ". ")
              + "Prefill has no floor here (compute-bound; no peak-FLOP measurement yet)."),
}
os.makedirs("bench/results", exist_ok=True)
host = os.environ.get("MACHINE", "vm")
path = f"bench/results/engine-{host}-{date.strftime('%Y%m%d')}.json"
json.dump(out, open(path, "w"), indent=1)
print(path)
print(json.dumps(results, indent=1))
PY
