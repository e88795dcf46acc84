#!/usr/bin/env bash
# Issue 40: which dimension of the 35B-A3B shape makes a CUDA pass of two rows differ from one row
# at a time (a verify pass against plain decoding). Makes 4-layer sil-mkmodel models that go from
# the tiny shape to the 35B one a dimension at a time (and back), runs
# `sil-eval --backend cuda --spec oracle --oracle-p 1 --spec-tree 1x1 --probe-steps 2,5,9` on each
# and prints, per model, the largest two_row_max_diff (two rows against one) and rerun_max_diff
# (one row run again); on the 35B-shaped model also with all of the CUDA path switches off at once
# and each on its own. A dimension whose model shows a two-row difference while the tiny shape
# shows none names the kernel to look at. Needs a GPU; a few minutes.
#
# usage: bench/run-two-row-probe.sh [NAME ...]   (default: every model below)
# Environment: B (build dir, default build), OUTDIR (raw JSON and logs, default
#              /tmp/two-row-probe), KEEP=1 (keep the models in OUTDIR).
set -u
cd "$(dirname "$0")/.." || exit 1
B=${B:-build}
OUTDIR=${OUTDIR:-/tmp/two-row-probe}
mkdir -p "$OUTDIR"
MK=$B/bin/sil-mkmodel
EV=$B/bin/sil-eval
if [ ! -x "$MK" ] || [ ! -x "$EV" ]; then
    echo "run-two-row-probe: build $MK and $EV first" >&2
    exit 1
fi

B35="--preset qwen35-35b-a3b --layers 4 --skew 0.46"
TINY="--preset tiny --layers 4"
declare -A SHAPE=(
    [tiny]="$TINY"
    [base]="$B35"
    [vocab512]="$B35 --vocab 512"
    [embd256]="$B35 --embd 256"
    [exp16]="$B35 --experts 16 --experts-used 4"
    [attn64]="$B35 --head-dim 64 --heads 4 --kv-heads 2"
    [effn64]="$B35 --expert-ffn 64 --shared-ffn 128"
    [dnsmall]="$B35 --dn-key-heads 4 --dn-value-heads 8 --dn-head-dim 32"
    [t-vocab]="$TINY --vocab 248320"
    [t-embd]="$TINY --embd 2048"
    [t-exp]="$TINY --experts 256 --experts-used 8"
    [t-dn]="$TINY --dn-key-heads 16 --dn-value-heads 32 --dn-head-dim 128"
    [t-attn]="$TINY --head-dim 256 --heads 16 --kv-heads 2"
)
ORDER=(tiny base vocab512 embd256 exp16 attn64 effn64 dnsmall t-vocab t-embd t-exp t-dn t-attn)
SWITCHES=(SIL_CUDA_NO_ATTN_Q8=1 SIL_CUDA_NO_CONV_FUSE=1 SIL_CUDA_NO_DN_FUSE=1 SIL_CUDA_NO_GQA=1
    SIL_CUDA_NO_H8_FUSE=1 SIL_CUDA_NO_MV_MIX=1 SIL_CUDA_NO_NORM_ROUTER=1 SIL_CUDA_NO_ROUTER_FUSE=1
    SIL_CUDA_NO_SHARED_FUSE=1 SIL_CUDA_HOST_ROUTE=1 SIL_CUDA_PDL=0)
[ $# -gt 0 ] && ORDER=("$@")

# probe LABEL MODEL [VAR=value ...]: one sil-eval run, one line
probe() {
    local label=$1 model=$2
    shift 2
    env "$@" "$EV" --model "$model" --tokens 1..64 --n-predict 12 --backend cuda --spec oracle \
        --oracle-p 1 --spec-tree 1x1 --probe-steps 2,5,9 --json >"$OUTDIR/$label.json" \
        2>"$OUTDIR/$label.err"
    python3 - "$OUTDIR/$label.json" "$label" "$?" <<'PY'
import json, sys
try:
    p = json.load(open(sys.argv[1])).get("probes") or []
    print("%-28s two_row %-10s rerun %s" % (sys.argv[2],
          max(x["two_row_max_diff"] for x in p) if p else "-",
          max(x["rerun_max_diff"] for x in p) if p else "-"))
except (OSError, ValueError, KeyError) as e:
    print("%-28s no result (exit %s): %s" % (sys.argv[2], sys.argv[3], e))
PY
}

for name in "${ORDER[@]}"; do
    [ -n "${SHAPE[$name]:-}" ] || { echo "run-two-row-probe: no model $name" >&2; exit 1; }
    m=$OUTDIR/$name.gguf
    # shellcheck disable=SC2086 # the shape is a list of options
    "$MK" --quiet --seed 1 --type q4_k_m ${SHAPE[$name]} --out "$m" >/dev/null 2>"$OUTDIR/$name.mk.err" ||
        { echo "$name: sil-mkmodel failed: $(cat "$OUTDIR/$name.mk.err")"; continue; }
    probe "$name" "$m"
    if [ "$name" = base ]; then
        probe base-all-switches "$m" "${SWITCHES[@]}"
        for s in "${SWITCHES[@]}"; do probe "base-${s%%=*}" "$m" "$s"; done
    fi
    [ -n "${KEEP:-}" ] || rm -f "$m"
done
