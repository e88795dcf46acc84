#!/bin/sh
# Whole-model CUDA-vs-CPU parity for every reference model (make check-cuda, on a GPU machine).
# usage: tests/cuda-fwd.sh BINARY REFDATA_MODELS_DIR
# Prompts B and C of each model's JSON, with the reference tolerance at their last position.
set -u
bin=$1
dir=$2
fails=0
n=0
for json in "$dir"/*.json; do
    gguf=${json%.json}.gguf
    [ -f "$gguf" ] || continue
    args=$(python3 - "$json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["prompts"]
out = []
for k in ("B", "C"):
    out += [",".join(map(str, d[k]["ids"])), repr(d[k]["tolerance_per_position"][-1])]
print(" ".join(out))
PY
) || { echo "$json: cannot read the prompts"; fails=$((fails + 1)); continue; }
    # shellcheck disable=SC2086
    "$bin" "$gguf" $args
    rc=$?
    n=$((n + 1))
    if [ $rc -eq 77 ]; then
        echo "cuda-fwd: no usable GPU; skipped"
        exit 77
    fi
    [ $rc -eq 0 ] || fails=$((fails + 1))
done
echo "cuda-fwd: $n models, $fails failed"
[ $n -gt 0 ] && [ $fails -eq 0 ]
