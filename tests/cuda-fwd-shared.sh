#!/bin/sh
# The fused shared expert on the GPU (make check-cuda): a small generated qwen35moe whose shared
# expert has a routed expert's shape and types, so the fused MoE kernels carry it, through
# cuda_fwd_parity (check 8 holds it to the shared expert run apart; checks 1-7 as for refdata).
# A generated model has no llama.cpp reference: the CPU backend's logits stand in for it, with
# the tolerance 0.5 of refdata's models of this size.
# usage: tests/cuda-fwd-shared.sh BUILD_DIR
set -eu
b=$1
d=$(mktemp -d)
trap 'rm -rf "$d"' EXIT
"$b/bin/sil-mkmodel" --arch qwen35moe --layers 4 --embd 256 --heads 4 --kv-heads 2 \
    --head-dim 64 --experts 16 --experts-used 4 --expert-ffn 128 --shared-ffn 128 \
    --dn-key-heads 2 --dn-value-heads 4 --dn-head-dim 64 --vocab 1024 --type q4_k_m --seed 3 \
    --out "$d/shx-Q4_K_M.gguf" >/dev/null 2>&1
python3 - "$b/bin/sil-eval" "$d" <<'PY'
import json, random, struct, subprocess, sys
ev, d = sys.argv[1:3]
m = d + "/shx-Q4_K_M.gguf"
random.seed(5)
prompts = {}
for k, n in (("B", 9), ("C", 100)):
    ids = [random.randrange(1, 1000) for _ in range(n)]
    out = subprocess.run([ev, "--model", m, "--tokens", ",".join(map(str, ids)), "--logits",
                          "all", "--json"], capture_output=True, text=True, check=True).stdout
    fn = "shx-Q4_K_M.%s.f32" % k
    with open(d + "/" + fn, "wb") as f:
        for row in json.loads(out)["logits"]:
            f.write(struct.pack("%df" % len(row), *row))
    prompts[k] = {"ids": ids, "logits_file": fn, "tolerance_per_position": [0.5] * n}
json.dump({"prompts": prompts}, open(d + "/shx-Q4_K_M.json", "w"))
PY
SIL_TEST_SHARED_FUSE=1 sh tests/cuda-fwd.sh "$b/tests/cuda_fwd_parity" "$d"
