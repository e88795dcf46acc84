#!/bin/bash
# Issue 40's speculative-decoding figures on a GPU: sil-mkmodel's Qwen3.5-35B-A3B shape (Q4_K_M,
# routing skew 0.46), sil-eval on the CUDA backend with the oracle drafter (test-only: it knows
# plain greedy decoding's tokens and proposes each with probability p), chains of depth D, all
# resident and at --vram-budget 8G. Each run is one sil-eval process: a 128-token prompt, 128
# greedy tokens twice (--passes 2; the warm pass is the plain figure, the peer), then the same
# 128 tokens by speculative decoding; sil-eval checks they are plain greedy's. p = 1 gives the
# verify pass's time by rows (every draft accepted: depth + 1 rows a step).
#
# usage: bench/run-spec-oracle.sh [run|report FILE]
#   run     every configuration below, raw outputs under OUTDIR
#   report  the results JSON (../shared/BENCH.md) from OUTDIR
# Environment: B (build dir: $B/bin/sil-eval, $B/bin/sil-mkmodel; default build), BASE_B (another
#   build's dir: its runs are named base_*), BASE_COMMIT, COMMIT, MODEL (default
#   /tmp/qwen35moe-35b-a3b-q4_k_m-s0.46.gguf, made if absent), OUTDIR (default /tmp/spec-oracle),
#   RES (all-resident runs, "p:depth ..." default "0.8:3 0.6:2 0.6:4 0.6:6 0.8:2 0.8:4 0.8:6
#   0.9:2 0.9:4 0.9:6"), G8 (8G runs, default "0.8:3 0.6:2 0.6:4 0.9:2 0.9:4 0.8:2 0.8:4"),
#   ROWS (p = 1 depths, all resident, default "1 3 7 15"), BASE_RUNS ("res:0.8:3 g8:0.8:3": the
#   runs made with BASE_B too), TIMEOUT (per run, default 120), END (epoch seconds: no run starts
#   within 45 s of it).
set -u
cd "$(dirname "$0")/.." || exit 1
B=${B:-build}
BASE_B=${BASE_B:-}
M=${MODEL:-/tmp/qwen35moe-35b-a3b-q4_k_m-s0.46.gguf}
OUTDIR=${OUTDIR:-/tmp/spec-oracle}
RES=${RES:-0.8:3 0.6:2 0.6:4 0.6:6 0.8:2 0.8:4 0.8:6 0.9:2 0.9:4 0.9:6}
G8=${G8:-0.8:3 0.6:2 0.6:4 0.9:2 0.9:4 0.8:2 0.8:4}
ROWS=${ROWS:-1 3 7 15}
BASE_RUNS=${BASE_RUNS:-res:0.8:3 g8:0.8:3}
TIMEOUT=${TIMEOUT:-120}
END=${END:-0}
mkdir -p "$OUTDIR"

one() { # NAME BIN BUDGET-ARGS P DEPTH
    local name=$1 bin=$2 bud=$3 p=$4 d=$5
    if [ "$END" -gt 0 ] && [ $(($(date +%s) + 45)) -gt "$END" ]; then
        echo "run-spec-oracle: $name skipped (no time left)"
        return
    fi
    local s
    s=$(date +%s)
    # shellcheck disable=SC2086 # bud is a list of options
    timeout "$TIMEOUT" "$bin" --model "$M" --tokens 1..128 --n-predict 128 --passes 2 \
        --backend cuda $bud --logits none --json --spec oracle --oracle-p "$p" --spec-tree "1x$d" \
        > "$OUTDIR/$name.json" 2> "$OUTDIR/$name.err"
    local rc=$? bl=none
    [ -z "$bud" ] || bl=${bud#--vram-budget }
    echo "name=$name rc=$rc wall_s=$(($(date +%s) - s)) p=$p depth=$d budget=$bl" \
        > "$OUTDIR/$name.meta"
    echo "run-spec-oracle: $(cat "$OUTDIR/$name.meta")"
}

case ${1:-run} in
run)
    [ -f "$M" ] || "$B/bin/sil-mkmodel" --preset qwen35-35b-a3b --type q4_k_m --seed 1 \
        --skew 0.46 --quiet --out "$M" || exit 1
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUTDIR/gpu.txt" 2>&1
    for pd in $RES; do
        one "res_p${pd%:*}_d${pd#*:}" "$B/bin/sil-eval" "" "${pd%:*}" "${pd#*:}"
        [[ " $BASE_RUNS " == *" res:$pd "* ]] && [ -n "$BASE_B" ] &&
            one "base_res_p${pd%:*}_d${pd#*:}" "$BASE_B/bin/sil-eval" "" "${pd%:*}" "${pd#*:}"
    done
    for d in $ROWS; do one "res_p1_d$d" "$B/bin/sil-eval" "" 1 "$d"; done
    for pd in $G8; do
        one "g8_p${pd%:*}_d${pd#*:}" "$B/bin/sil-eval" "--vram-budget 8G" "${pd%:*}" "${pd#*:}"
        [[ " $BASE_RUNS " == *" g8:$pd "* ]] && [ -n "$BASE_B" ] &&
            one "base_g8_p${pd%:*}_d${pd#*:}" "$BASE_B/bin/sil-eval" "--vram-budget 8G" "${pd%:*}" "${pd#*:}"
    done
    ;;
report)
    out=${2:?report needs a FILE}
    python3 - "$OUTDIR" "$out" "${COMMIT:-$(git rev-parse --short HEAD)}" "${BASE_COMMIT:-}" \
        "$M" <<'PY'
import glob, json, os, platform, sys, time
d, out, commit, base_commit, model = sys.argv[1:6]
gpu = open(os.path.join(d, "gpu.txt")).read().strip().split(", ") if os.path.exists(os.path.join(d, "gpu.txt")) else ["", ""]
res, failed, replays = [], [], []
for meta in sorted(glob.glob(os.path.join(d, "*.meta"))):
    m = dict(kv.split("=", 1) for kv in open(meta).read().split())
    name = m["name"]
    try:
        j = json.load(open(os.path.join(d, name + ".json")))
        s = j["spec"]
    except Exception:
        failed.append(f"{name} (rc {m['rc']}: " + open(os.path.join(d, name + ".err")).read().strip().splitlines()[-1:][0][:160] + ")" if os.path.getsize(os.path.join(d, name + ".err")) else f"{name} (rc {m['rc']})")
        continue
    where = "all resident" if m["budget"] == "none" else "8G"
    cfg = f"oracle p={m['p']},{where},chain 1x{m['depth']}" + (f",build={base_commit}" if name.startswith("base_") else "")
    common = {"config": cfg, "runs": 1}
    plain = s["plain_decode_tok_s"]
    res.append(dict(common, metric="decode_tok_s", value=round(s["decode_tok_s"], 2), unit="tok/s",
                    peer="plain greedy decoding, same process (warm pass)", peer_value=round(plain, 2)))
    res.append(dict(common, metric="speedup_x", value=round(s["speedup"], 4), unit="x"))
    res.append(dict(common, metric="tokens_per_step", value=round(s["tokens_per_step"], 4), unit="tokens"))
    res.append(dict(common, metric="verify_step_ms", value=round(s["verify_step_ms"], 4), unit="ms",
                    peer="one plain decode step", peer_value=round(s["one_token_step_ms"], 4)))
    res.append(dict(common, metric="commit_step_ms", value=round(s["commit_ms_per_step"], 4), unit="ms"))
    res.append(dict(common, metric="expert_union_per_layer", value=round(s["expert_union_per_layer"], 3),
                    unit="experts", peer="rows x top-k per layer", peer_value=round(s["expert_pairs_per_layer"], 3)))
    replays.append(s.get("device_cut_replays") or 0)
    if not s["identical"]:
        failed.append(f"{name}: tokens differ from plain greedy decoding")
doc = {
    "benchmark": "spec-oracle",
    "date": os.environ.get("DATE") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "commit": commit,
    "command": "bench/run-spec-oracle.sh run; bench/run-spec-oracle.sh report FILE",
    "machine": {"cpu": platform.processor() or "unknown", "cores": os.cpu_count(),
                "gpu": gpu[0], "driver": gpu[1] if len(gpu) > 1 else ""},
    "model": {"file": os.path.basename(model), "bytes": os.path.getsize(model) if os.path.exists(model) else None,
              "made_by": "sil-mkmodel --preset qwen35-35b-a3b --type q4_k_m --seed 1 --skew 0.46",
              "routing": "skew 0.46"},
    "results": res,
    "notes": ("Issue 40, item 8. The oracle drafter is test-only: it proposes plain greedy decoding's "
              "own token with probability p (else a surely wrong one), at no cost, so the figures are "
              "what a drafter of that acceptance would give, not a drafter's. Each configuration is one "
              "sil-eval run (128-token prompt, 128 tokens; --passes 2, the warm pass's decode is the "
              "peer_value, plain decoding in the same process); its speculative tokens are checked "
              "identical to plain greedy's. p = 1 runs give the verify pass's time for depth + 1 rows. "
              "CUDA verifies chains only (trees: CPU backend); a cut on the device " +
              ("replays the kept rows' delta-net cores there (device_cut_replays: " +
               ", ".join(sorted({str(r) for r in replays})) + " a run)"
               if replays and any(replays) else "evaluates the kept rows again") + ". " + (f"base_* runs: {base_commit}, the window's start copied through host "
              "memory. " if base_commit else "") +
              ("Failed or not run: " + "; ".join(failed) if failed else "Every run completed.")),
}
json.dump(doc, open(out, "w"), indent=1)
print(f"run-spec-oracle: {len(res)} results, {len(failed)} failed -> {out}")
PY
    ;;
*)
    sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
    ;;
esac
