#!/bin/sh
# Whole-model CUDA-vs-CPU parity for every reference model (make check-cuda, on a GPU machine).
# usage: tests/cuda-fwd.sh BINARY REFDATA_MODELS_DIR
# Prompts B and C of each model's JSON, with the reference tolerance at their last position, the
# reference logits and, for C, the largest tolerance over its positions.
set -u
bin=$1
dir=$2
fails=0
skipped=0
n=0
for json in "$dir"/*.json; do
    gguf=${json%.json}.gguf
    [ -f "$gguf" ] || continue
    args=$(python3 - "$json" <<'PY'
import json, os, sys
d = json.load(open(sys.argv[1]))["prompts"]
out = []
for k in ("B", "C"):
    tol = d[k]["tolerance_per_position"]
    ref = os.path.join(os.path.dirname(sys.argv[1]), d[k]["logits_file"])
    out += [",".join(map(str, d[k]["ids"])), repr(tol[-1]), ref]
out.append(repr(max(d["C"]["tolerance_per_position"])))
print(" ".join(out))
PY
) || { echo "$json: cannot read the prompts"; fails=$((fails + 1)); continue; }
    # shellcheck disable=SC2086
    "$bin" "$gguf" $args
    rc=$?
    n=$((n + 1))
    if [ $rc -eq 77 ]; then
        skipped=$((skipped + 1)) # the CPU half ran; the GPU half needs a GPU
    elif [ $rc -ne 0 ]; then
        fails=$((fails + 1))
    fi
done
echo "cuda-fwd: $n models, $fails failed, $skipped without a usable GPU"
[ $n -gt 0 ] && [ $fails -eq 0 ] || exit 1
[ $skipped -eq 0 ] || exit 77
