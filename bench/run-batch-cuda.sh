#!/bin/bash
# Batched decode on the GPU: aggregate decode tok/s of 1, 2, 4, 8, 16 sequences decoding
# together on the CUDA backend (sil-batchbench --backend cuda), sil-mkmodel's 35B-A3B shape at
# Q4_K_M, all resident and at --vram-budget BUDGET, next to the byte bound over the device
# bandwidth (sil-cudabench's device-to-device copy, same run); the expert bytes of all-resident
# steps come from a second run with the routing brought to the host (SIL_CUDA_HOST_ROUTE=1: the
# same tokens), and llama.cpp's llama-batched-bench on the same file as the peer.
# Raw outputs go to OUTDIR.
# usage: bench/run-batch-cuda.sh LLAMA_BATCHED_BENCH [OUTDIR]
# Environment: B (build dir, default build), BUDGET (default 8G), STREAMS (default
#              1,2,4,8,16), GEN (default 128), PROMPT (default 128), MODEL (default
#              /tmp/qwen35moe-35b-a3b-q4_k_m.gguf, made if missing)
set -u
B=${B:-build}
PEER=${1:?usage: bench/run-batch-cuda.sh LLAMA_BATCHED_BENCH [OUTDIR]}
OUT=${2:-bench/out}
BUDGET=${BUDGET:-8G}
STREAMS=${STREAMS:-1,2,4,8,16}
GEN=${GEN:-128}
PROMPT=${PROMPT:-128}
M=${MODEL:-/tmp/qwen35moe-35b-a3b-q4_k_m.gguf}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
[ -f "$M" ] || "$B/bin/sil-mkmodel" --preset qwen35-35b-a3b --type q4_k_m --seed 1 --out "$M" \
    > /dev/null
"$B/bin/sil-cudabench" --reps 20 > "$OUT/cudabench.txt" 2>&1
BW=$(sed -n 's/^d2d copy 1 GiB: .*us, \([0-9.]*\) GB\/s.*/\1/p' "$OUT/cudabench.txt")
echo "device copy bandwidth (read + write): ${BW:?no d2d figure} GB/s"
args=(--model "$M" --streams "$STREAMS" --gen "$GEN" --prompt "$PROMPT" --runs 1 --backend cuda
    --bw-gbs "$BW")
"$B/bin/sil-batchbench" "${args[@]}" > "$OUT/resident.jsonl"
SIL_CUDA_HOST_ROUTE=1 "$B/bin/sil-batchbench" "${args[@]}" > "$OUT/resident-hostroute.jsonl"
"$B/bin/sil-batchbench" "${args[@]}" --vram-budget "$BUDGET" > "$OUT/budget.jsonl"
"$PEER" -m "$M" -ngl 99 -fa 1 -c 8192 -npp "$PROMPT" -ntg "$GEN" -npl "$STREAMS" \
    > "$OUT/peer.txt" 2>&1
echo "peer rc=$?"
