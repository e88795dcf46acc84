#!/usr/bin/env bash
# Makes the engine benchmark model: qwen35moe, q4_k_m, 12 layers, hidden 1024, 8 query / 2 KV
# heads of 128, gated delta net 8 key / 16 value heads of 128, 64 experts top-8 of 512, shared
# expert 512, vocab 32768 (~800 MiB), into bench/models/ (git-ignored).
# Usage: bench/make-bench-model.sh [--skew S] [--seed N] [other sil-mkmodel flags]
# Environment: B (build dir, default build), OUT (default bench/models/bench-qwen35moe-q4_k_m.gguf).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
OUT=${OUT:-bench/models/bench-qwen35moe-q4_k_m.gguf}
mk="$B/bin/sil-mkmodel"
[ -x "$mk" ] || make B="$B" "$mk"
mkdir -p "$(dirname "$OUT")"
# The preset spells the shape out; the flags repeat it so this file documents the model.
"$mk" --preset bench --arch qwen35moe --type q4_k_m \
    --layers 12 --embd 1024 --heads 8 --kv-heads 2 --head-dim 128 \
    --dn-key-heads 8 --dn-value-heads 16 --dn-head-dim 128 \
    --experts 64 --experts-used 8 --expert-ffn 512 --shared-ffn 512 --vocab 32768 \
    --seed 1 "$@" --out "$OUT"
ls -l "$OUT"
