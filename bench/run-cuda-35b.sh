#!/bin/bash
# The Qwen3.5-35B-A3B shape at Q4_K_M, all resident on one GPU: llama.cpp's llama-bench and
# siliceo's CUDA backend (sil-eval --backend cuda) on the same file: pp512 and tg128, then tg128
# after longer prompts (CTX, default "4096 16384": llama-bench -d N against sil-eval decoding
# after an N-token prompt; CTX=1 adds sil-eval decoding after a one-token prompt, the context
# llama-bench's own tg128 starts from). sil-eval runs two passes in one engine, fresh sequences each, and the
# second is the figure (llama-bench also warms up first): pass 1 includes the first eager pass
# and the graph capture. Variants (VARIANTS, default "ours"), the same file in the same call,
# for A/B figures: ours-nopdl (SIL_CUDA_PDL=0), ours-nogqa (SIL_CUDA_NO_GQA=1), ours-nomix
# (SIL_CUDA_NO_MV_MIX=1), ours-noconv (SIL_CUDA_NO_CONV_FUSE=1), ours-noaq8
# (SIL_CUDA_NO_ATTN_Q8=1), ours-nonr (SIL_CUDA_NO_NORM_ROUTER=1), ours-prev (those three
# together: the launches as they were before them), ours-nopdl-prev (the same without
# programmatic dependent launch, as on sm_75), ours-nopf (SIL_CUDA_PREFETCH=0: no L2 prefetch
# of weights before the PDL wait), ours-fused (SIL_CUDA_GROUPED=0: prefill's expert
# products through the fused decode kernels instead of grouped ones), ours-psplit /
# ours-psplit2k (SIL_CUDA_PREFILL_SPLIT=1 / 2048: prefill attention through the decode kernels'
# context split), ours-noflash (SIL_CUDA_NO_FLASH=1: prefill attention one block a row and head
# instead of tiled on tensor cores).
# usage: bench/run-cuda-35b.sh [LLAMA_BENCH|-] [OUTDIR]   (binaries from $B/bin; model in /tmp)
set -u
B=${B:-build}
PEER=${1:--}
OUT=${2:-bench/out}
M=${MODEL:-/tmp/qwen35moe-35b-a3b-q4_k_m.gguf}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
[ -f "$M" ] || "$B/bin/sil-mkmodel" --preset qwen35-35b-a3b --type q4_k_m --seed 1 --out "$M"
if [ "$PEER" != - ]; then
    "$PEER" -m "$M" -ngl 99 -fa 1 -p 512 -n 128 -r 2 -o json > "$OUT/peer.json"
    for c in ${CTX:-4096 16384}; do
        [ "$c" -gt 1 ] || continue # tg128 above is llama-bench's decode from an empty context
        "$PEER" -m "$M" -ngl 99 -fa 1 -p 0 -n 128 -d "$c" -r 1 -o json > "$OUT/peer-d$c.json"
    done
fi
(while sleep 0.5; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; done \
    > "$OUT/vram.txt") &
poll=$!
eval_run() { # name, tokens, then VAR=value settings
    local n=$1 t=$2
    shift 2
    env "$@" "$B/bin/sil-eval" --model "$M" --tokens "$(seq -s, 1 "$t")" --n-predict 128 \
        --logits none --backend cuda --ctx $((t + 256)) --passes 2 --json $EXTRA \
        > "$OUT/$n.json" 2> "$OUT/$n.err"
    echo "$n rc=$?"
}
for v in ${VARIANTS:-ours}; do
    EXTRA=
    case $v in
    ours) set -- SIL_BENCH_NONE=1 ;;
    ours-nopdl) set -- SIL_CUDA_PDL=0 ;;
    ours-nogqa) set -- SIL_CUDA_NO_GQA=1 ;;
    ours-psplit) set -- SIL_CUDA_PREFILL_SPLIT=1 ;;
    ours-psplit2k) set -- SIL_CUDA_PREFILL_SPLIT=2048 ;;
    ours-noflash) set -- SIL_CUDA_NO_FLASH=1 ;;
    ours-nofuse) set -- SIL_CUDA_NO_DN_FUSE=1 SIL_CUDA_NO_ROUTER_FUSE=1 SIL_CUDA_NO_H8_FUSE=1 ;;
    ours-nomix) set -- SIL_CUDA_NO_MV_MIX=1 ;;
    ours-noconv) set -- SIL_CUDA_NO_CONV_FUSE=1 ;;
    ours-noaq8) set -- SIL_CUDA_NO_ATTN_Q8=1 ;;
    ours-nonr) set -- SIL_CUDA_NO_NORM_ROUTER=1 ;;
    ours-nopf) set -- SIL_CUDA_PREFETCH=0 ;;
    ours-prev) set -- SIL_CUDA_NO_CONV_FUSE=1 SIL_CUDA_NO_ATTN_Q8=1 SIL_CUDA_NO_NORM_ROUTER=1 ;;
    ours-nopdl-prev) set -- SIL_CUDA_PDL=0 SIL_CUDA_NO_CONV_FUSE=1 SIL_CUDA_NO_ATTN_Q8=1 \
        SIL_CUDA_NO_NORM_ROUTER=1 ;;
    ours-kv16) set -- SIL_BENCH_NONE=1 && EXTRA="--kv-type f16" ;;
    ours-fused) set -- SIL_CUDA_GROUPED=0 ;;
    *) echo "unknown variant $v" >&2; continue ;;
    esac
    eval_run "$v-p512" 512 "$@"
    for c in ${CTX:-4096 16384}; do
        eval_run "$v-p$c" "$c" "$@"
    done
done
kill $poll
echo "peak VRAM used: $(sort -n "$OUT/vram.txt" | tail -1) MiB"
