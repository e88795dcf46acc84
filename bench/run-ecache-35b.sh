#!/bin/bash
# The VRAM expert cache at a budget: sil-mkmodel's Qwen3.5-35B-A3B shape at Q4_K_M (routing
# uniform, or skewed with SKEW), evaluated by sil-eval on the CUDA backend with --vram-budget
# (default 8G), two passes of a 512-token prompt and 128 greedy tokens in fresh sequences of one
# engine (pass 1 cold, pass 2 warm): prefill and decode speed, hit rates, bytes streamed, pinned
# host memory and the host-to-device bandwidth measured at open; the same with the copies capped
# at CAP GB/s (SIL_BENCH_H2D_GBS, a benchmark setting: a PCIe 3 link on a faster one), with
# graphs off (eager), and llama.cpp's llama-bench with -ncmoe NCMOE on the same file.
# Raw outputs go to OUTDIR; the results file is assembled from them by hand (see its notes).
# usage: bench/run-ecache-35b.sh LLAMA_BENCH [OUTDIR]
# Environment: B (build dir, default build), SKEW (default 0), BUDGET (default 8G), CAP (default
#              12.6), NCMOE (default 29), MODEL (default /tmp/qwen35moe-35b-a3b-q4_k_m-s$SKEW.gguf),
#              CPU_MISSES (default empty: not run; else a list such as "1 2 4": miss path (c) with
#              that many misses of each decode layer on the CPU, with and without the cap),
#              RUNS (default "ours ours-eager ours-cap"; ours is the default, the CPU's share of
#              decode misses chosen by speed; also ours-a and ours-a-cap: path (a) alone,
#              --cuda-cpu-share=off; ours-zc: miss path (b), decode misses read in place,
#              --cuda-zero-copy=on), SHARES (default empty; else a list such as "0.4 0.7": the
#              CPU's share forced, --cuda-cpu-share), PEER_RUN (default 1; 0 skips llama-bench)
# LLAMA_BENCH may be - when PEER_RUN=0.
set -u
B=${B:-build}
PEER=${1:?usage: bench/run-ecache-35b.sh LLAMA_BENCH [OUTDIR]}
OUT=${2:-bench/out}
SKEW=${SKEW:-0}
BUDGET=${BUDGET:-8G}
CAP=${CAP:-12.6}
NCMOE=${NCMOE:-29}
M=${MODEL:-/tmp/qwen35moe-35b-a3b-q4_k_m-s$SKEW.gguf}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
[ -f "$M" ] || "$B/bin/sil-mkmodel" --preset qwen35-35b-a3b --type q4_k_m --seed 1 --skew "$SKEW" \
    --out "$M" > /dev/null
T=$(seq -s, 1 512)
vpoll() {
    (while sleep 0.25; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done \
        > "$OUT/vram-$1.txt") &
    poll=$!
}
run() { # name, then VAR=value settings (siliceo-dev(7)) and sil-eval options (--name=value)
    local n=$1 a
    shift
    local envs=() opts=()
    for a in "$@"; do
        case $a in --*) opts+=("$a") ;; *) envs+=("$a") ;; esac
    done
    vpoll "$n"
    env "${envs[@]}" /usr/bin/time -v "$B/bin/sil-eval" --model "$M" --tokens "$T" \
        --n-predict 128 --logits none --backend cuda --vram-budget "$BUDGET" --passes 2 --json \
        "${opts[@]}" > "$OUT/$n.json" 2> "$OUT/$n.err"
    echo "$n rc=$? peak VRAM $(sort -n "$OUT/vram-$n.txt" | tail -1) MiB"
    kill $poll
}
for r in ${RUNS:-ours ours-eager ours-cap}; do
    case $r in
    ours) run ours SIL_BENCH_NONE=1 ;;
    ours-eager) run ours-eager --cuda-graphs=off ;;
    ours-cap) run ours-cap SIL_BENCH_H2D_GBS="$CAP" ;;
    ours-zc) run ours-zc --cuda-zero-copy=on ;;
    ours-a) run ours-a --cuda-cpu-share=off ;;
    ours-a-cap) run ours-a-cap --cuda-cpu-share=off SIL_BENCH_H2D_GBS="$CAP" ;;
    *) echo "unknown run $r" >&2 ;;
    esac
done
for n in ${CPU_MISSES:-}; do
    run "ours-cpu$n" SIL_CUDA_CPU_MISSES="$n"
    run "ours-cpu$n-cap" SIL_CUDA_CPU_MISSES="$n" SIL_BENCH_H2D_GBS="$CAP"
done
for f in ${SHARES:-}; do
    run "ours-share$f" --cuda-cpu-share="$f"
done
[ "${PEER_RUN:-1}" = 0 ] && exit 0
vpoll peer
"$PEER" -m "$M" -ngl 99 -ncmoe "$NCMOE" -fa 1 -p 512 -n 128 -r 2 -o json > "$OUT/peer.json"
echo "peer rc=$? peak VRAM $(sort -n "$OUT/vram-peer.txt" | tail -1) MiB"
kill $poll
