#!/bin/bash
# The Qwen3.5-35B-A3B shape at Q4_K_M, all resident on one GPU: llama.cpp's llama-bench and
# siliceo's CUDA backend (sil-eval --backend cuda) on the same file, pp512 and tg128.
# usage: bench/run-cuda-35b.sh [LLAMA_BENCH] [OUTDIR]   (binaries from build/bin; model in /tmp)
set -u
B=${B:-build}
PEER=${1:-}
OUT=${2:-bench/out}
M=${MODEL:-/tmp/qwen35moe-35b-a3b-q4_k_m.gguf}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
[ -f "$M" ] || "$B/bin/sil-mkmodel" --preset qwen35-35b-a3b --type q4_k_m --seed 1 --out "$M"
if [ -n "$PEER" ]; then
    "$PEER" -m "$M" -ngl 99 -fa 1 -p 512 -n 128 -r 2 -o json > "$OUT/peer.json"
fi
T=$(seq -s, 1 512)
(while sleep 0.5; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done \
    > "$OUT/vram.txt") &
poll=$!
for r in 1 2; do
    "$B/bin/sil-eval" --model "$M" --tokens "$T" --n-predict 128 --logits none --backend cuda \
        --json > "$OUT/eval$r.json"
done
kill $poll
echo "peak VRAM used: $(sort -n "$OUT/vram.txt" | tail -1) MiB"
