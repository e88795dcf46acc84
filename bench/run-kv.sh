#!/usr/bin/env bash
# KV cache benchmark on the sil-mkmodel bench model, for each KV element type (f32, f16, q8_0,
# q4_0) and, given a second sil-eval, that one as "base" in the same rotation:
#  - decode tok/s with THREADS threads (2) at a short and a ~4k context, runs interleaved so a
#    change in the machine's load hits every variant alike; the best run of each is reported;
#  - decode CPU time per token with 1 thread at a short and a 2k context: the CPU time of a run
#    that decodes N tokens minus that of the same prompt decoding none, over N (steadier than
#    wall time on a shared machine);
#  - the KV bytes a position holds and the anonymous memory at the end of each run.
#
# usage: bench/run-kv.sh [BASE_SIL_EVAL]
# Environment: B (build dir, default build), MODEL (default bench/models/bench-qwen35moe-q4_k_m.gguf),
#              THREADS (2), RUNS_SHORT (6), RUNS_LONG (2), MACHINE (vm), NO_BUILD=1 (use B's
#              sil-eval as it is), CPU1=0 (skip the 1-thread CPU-time part),
#              OUT (default bench/results/kv-<machine>-<yyyymmdd>.json).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
MODEL=${MODEL:-bench/models/bench-qwen35moe-q4_k_m.gguf}
[ -f "$MODEL" ] || OUT="$MODEL" B="$B" bench/make-bench-model.sh >&2
[ -n "${NO_BUILD:-}" ] || make -s B="$B" "$B/bin/sil-eval" >&2
python3 - "$B/bin/sil-eval" "${1:-}" "$MODEL" "${THREADS:-2}" "${RUNS_SHORT:-6}" "${RUNS_LONG:-2}" <<'PY'
import datetime, json, os, resource, subprocess, sys
sil, base, model, threads, runs_short, runs_long = sys.argv[1:7]
threads, runs_short, runs_long = int(threads), int(runs_short), int(runs_long)
variants = (["base"] if base else []) + ["f32", "f16", "q8_0", "q4_0"]

def run(v, n_prompt, n_predict, nth):
    ids = ",".join(str(100 + (i * 37) % 20000) for i in range(n_prompt))
    cmd = [base] if v == "base" else [sil, "--kv-type", v]
    cmd += ["--model", model, "--tokens", ids, "--n-predict", str(n_predict), "--logits", "none",
            "--threads", str(nth), "--json"]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    j = json.loads(out)
    j["cpu_s"] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    j["load1"] = float(open("/proc/loadavg").read().split()[0])
    return j

res = {"benchmark": "kv-cache", "date": datetime.date.today().isoformat(), "model": model,
       "wall": {}, "cpu": {}}
for n_prompt, n_predict, reps in ((64, 257, runs_short), (3968, 65, runs_long)):
    key = f"prompt {n_prompt} + {n_predict - 1} decoded, {threads} threads"
    res["wall"][key] = {v: {"runs": []} for v in variants}
    for r in range(reps):
        for v in variants:
            print(f"wall {key}: {v} {r + 1}/{reps}", file=sys.stderr)
            j = run(v, n_prompt, n_predict, threads)
            res["wall"][key][v]["kv_bytes_per_token"] = j["memory"].get("kv_bytes_per_token")
            res["wall"][key][v]["runs"].append({"decode_tok_s": j["timings"]["decode_tok_s"],
                                                "rss_anon_mib": j["memory"]["rss_anon_mib"],
                                                "load1": j["load1"]})
    for v in variants:
        e = res["wall"][key][v]
        e["best_decode_tok_s"] = max(x["decode_tok_s"] for x in e["runs"])
for n_prompt, n_predict in ((64, 257), (2048, 385)) if os.environ.get("CPU1", "1") != "0" else ():
    key = f"prompt {n_prompt} + {n_predict - 1} decoded, 1 thread"
    res["cpu"][key] = {}
    for v in variants:
        print(f"cpu {key}: {v}", file=sys.stderr)
        a, b = run(v, n_prompt, 1, 1), run(v, n_prompt, n_predict, 1)
        res["cpu"][key][v] = {"decode_cpu_ms_per_token": (b["cpu_s"] - a["cpu_s"]) / (n_predict - 1) * 1e3}
path = os.environ.get("OUT") or \
    f"bench/results/kv-{os.environ.get('MACHINE', 'vm')}-{datetime.date.today():%Y%m%d}.json"
json.dump(res, open(path, "w"), indent=1)
for k, e in res["wall"].items():
    print(k + ": " + ", ".join(f"{v} {x['best_decode_tok_s']:.1f} tok/s" for v, x in e.items()))
for k, e in res["cpu"].items():
    print(k + ": " + ", ".join(f"{v} {x['decode_cpu_ms_per_token']:.2f} ms" for v, x in e.items()))
print("wrote", path)
PY
