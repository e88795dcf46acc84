#!/bin/bash
# The chain floor of a decode step: what a step costs when it moves almost no bytes. The model
# keeps a benchmark shape's structure (its layers, full-attention interval, experts and top-k,
# so the same launches or pool passes in the same order) with a hidden size of 256, expert and
# shared-expert FFNs of 256 and few heads, so a step reads a few hundred MB at most and its time
# is what the dependent chain of kernels (CUDA) or thread-pool passes (CPU) costs by itself.
# A step of the full model cannot take less than this chain, whatever its bytes: it bounds the
# fraction of the byte bound a design can reach.
# sil-batchbench runs the chain model and the full model in the same call; the peer
# (llama-batched-bench, optional) runs both too.
# Raw outputs go to OUTDIR.
# usage: bench/run-chain-floor.sh MODEL.gguf [OUTDIR]
#   MODEL.gguf: the full model (made with PRESET if missing)
# Environment: B (build dir, default build), BACKEND (cuda or cpu, default cuda), PRESET
#              (qwen35-35b-a3b; bench for the CPU model), THREADS (engine threads, default 16),
#              STREAMS (1,8), GEN (128), PROMPT (128), RUNS (1), BW_GBS (the byte bound's
#              bandwidth for cuda; default: sil-cudabench's d2d copy of this run),
#              PEER (llama-batched-bench; none if unset), PEER_NGL (99 for cuda, 0 for cpu)
set -u
M=${1:?usage: bench/run-chain-floor.sh MODEL.gguf [OUTDIR]}
OUT=${2:-bench/out}
B=${B:-build}
BACKEND=${BACKEND:-cuda}
PRESET=${PRESET:-qwen35-35b-a3b}
THREADS=${THREADS:-16}
STREAMS=${STREAMS:-1,8}
GEN=${GEN:-128}
PROMPT=${PROMPT:-128}
RUNS=${RUNS:-1}
mkdir -p "$OUT"
CHAIN=${M%.gguf}-chain.gguf
[ -f "$M" ] || "$B/bin/sil-mkmodel" --preset "$PRESET" --type q4_k_m --seed 1 --quiet --out "$M" ||
    exit 1
# the same layers, attention interval, experts and top-k; 256 wide everywhere it can be
[ -f "$CHAIN" ] || "$B/bin/sil-mkmodel" --preset "$PRESET" --embd 256 --heads 8 --kv-heads 1 \
    --head-dim 256 --dn-key-heads 2 --dn-value-heads 4 --expert-ffn 256 --shared-ffn 256 \
    --vocab 4096 --type q4_k_m --seed 1 --quiet --out "$CHAIN" || exit 1
args=(--streams "$STREAMS" --gen "$GEN" --prompt "$PROMPT" --runs "$RUNS" --threads "$THREADS"
    --backend "$BACKEND")
if [ "$BACKEND" = cuda ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader |
        tee "$OUT/gpu.txt"
    if [ -z "${BW_GBS:-}" ]; then
        "$B/bin/sil-cudabench" --reps 20 > "$OUT/cudabench.txt" 2>&1
        BW_GBS=$(sed -n 's/^d2d copy 1 GiB: .*us, \([0-9.]*\) GB\/s.*/\1/p' "$OUT/cudabench.txt")
    fi
    args+=(--bw-gbs "${BW_GBS:?no d2d figure}")
fi
lscpu > "$OUT/lscpu.txt"
for m in "$CHAIN" "$M"; do
    name=$(basename "${m%.gguf}")
    echo "== ours: $name"
    "$B/bin/sil-batchbench" --model "$m" "${args[@]}" | tee "$OUT/ours-$name.jsonl"
    if [ -n "${PEER:-}" ]; then
        echo "== peer: $name"
        ngl=${PEER_NGL:-$([ "$BACKEND" = cuda ] && echo 99 || echo 0)}
        "$PEER" -m "$m" -ngl "$ngl" -fa 1 -t "$THREADS" -c 4096 -npp "$PROMPT" -ntg "$GEN" \
            -npl "$STREAMS" > "$OUT/peer-$name.txt" 2>&1
        echo "peer rc=$?"
        grep '^|' "$OUT/peer-$name.txt"
    fi
done
