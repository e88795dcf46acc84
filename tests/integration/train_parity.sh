#!/usr/bin/env bash
# The training pipeline's export against the engine (bench/train):
#  1. sil-mkmodel --weights-from: a model written from raw tensors loads; a missing, short,
#     non-finite or unknown tensor file is refused with its name.
#  2. With PyTorch (python3-torch): the chunked delta rule equals the sequential one; our BPE
#     encodes chat exchanges exactly as the engine's tokenizer; the engine's logits and greedy
#     tokens (sil-eval --exact, F32 file) match the PyTorch qwen35moe within 1e-3 relative on a
#     random model and on one trained for a few steps, and on that one's Q8_0 file against
#     PyTorch on its dequantized weights. About 25 s on 2 loaded cores.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
B=${SIL_BUILD:-$ROOT/build}
MK=$B/bin/sil-mkmodel
E=$B/bin/sil-eval
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# ---- 1: --weights-from, no PyTorch needed ------------------------------------------------------
shape=(--preset tiny --layers 4 --embd 64 --heads 2 --kv-heads 1 --head-dim 32 --experts 4
    --experts-used 2 --expert-ffn 32 --shared-ffn 32 --dn-key-heads 1 --dn-value-heads 2
    --dn-head-dim 16 --vocab 320 --type f32 --quiet)
"$MK" "${shape[@]}" --dry-run >"$T/list" || fail "dry run"
mkdir "$T/w"
# every tensor: its element count of the float 0.5 (norms 0.5, matrices 0.5: finite logits)
n=0
while read -r name _ rest; do
    case $name in token_embd.weight | output_norm.weight | output.weight | blk.*) ;; *) continue ;; esac
    elems=$(echo "$rest" | sed 's/^\[\([0-9]*\), \([0-9]*\), \([0-9]*\)\].*/\1 * \2 * \3/')
    python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<f', 0.5) * ($elems))" \
        >"$T/w/$name.f32" || fail "writing $name"
    n=$((n + 1))
done <"$T/list"
[ "$n" -gt 30 ] || fail "only $n tensors in the dry-run list"
"$MK" "${shape[@]}" --weights-from "$T/w" --out "$T/m.gguf" 2>"$T/err" || fail "export: $(cat "$T/err")"
"$E" --model "$T/m.gguf" --tokens 1,2,3 --exact --json --threads 1 >"$T/out" 2>"$T/err" ||
    fail "sil-eval on the exported model: $(cat "$T/err")"
grep -q '"logits": \[' "$T/out" || fail "no logits: $(head -c 200 "$T/out")"
# all weights equal: every vocab entry gets the same logit
python3 -c "
import json,sys
l=json.load(open('$T/out'))['logits']
l=l[0] if isinstance(l[0], list) else l
sys.exit(0 if max(l) - min(l) < 1e-4 and abs(l[0]) > 0 else 1)" || fail "logits of an all-0.5 model are not all equal"
echo "ok: sil-mkmodel --weights-from writes a model the engine loads ($n tensors)"

mv "$T/w/blk.1.ssm_a.f32" "$T/ssm_a"
"$MK" "${shape[@]}" --weights-from "$T/w" --out "$T/x.gguf" 2>"$T/err" && fail "missing file accepted"
grep -q "blk.1.ssm_a.f32" "$T/err" || fail "missing-file message: $(cat "$T/err")"
head -c 4 "$T/ssm_a" >"$T/w/blk.1.ssm_a.f32"
"$MK" "${shape[@]}" --weights-from "$T/w" --out "$T/x.gguf" 2>"$T/err" && fail "short file accepted"
grep -q "blk.1.ssm_a.f32: 4 bytes" "$T/err" || fail "short-file message: $(cat "$T/err")"
python3 -c "import struct,sys; sys.stdout.buffer.write(struct.pack('<2f', 0.5, float('nan')))" \
    >"$T/w/blk.1.ssm_a.f32"
"$MK" "${shape[@]}" --weights-from "$T/w" --out "$T/x.gguf" 2>"$T/err" && fail "NaN accepted"
grep -q "element 1 is not finite" "$T/err" || fail "NaN message: $(cat "$T/err")"
mv "$T/ssm_a" "$T/w/blk.1.ssm_a.f32"
cp "$T/w/output_norm.weight.f32" "$T/w/blk.9.attn_norm.weight.f32"
"$MK" "${shape[@]}" --weights-from "$T/w" --out "$T/x.gguf" 2>"$T/err" && fail "unknown file accepted"
grep -q "blk.9.attn_norm.weight.f32: no tensor" "$T/err" || fail "unknown-file message: $(cat "$T/err")"
[ ! -e "$T/x.gguf" ] || fail "a refused export left its output file"
echo "ok: missing, short, non-finite and unknown tensor files are refused by name"

# ---- 2: PyTorch parity -------------------------------------------------------------------------
PY=
for p in ${PYTHON:-} python3 /usr/bin/python3; do
    if "$p" -c 'import torch' 2>/dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
    case ${CI:-} in true | TRUE | True | 1) fail "python3-torch missing (CI=true; make deps)" ;; esac
    echo "skip: no python3 with torch (python3-torch) for the parity part"
    exit 0
fi
export SIL_BUILD=$B PYTHONDONTWRITEBYTECODE=1
cd "$ROOT/bench/train" || fail "bench/train"
"$PY" -c "
import torch, model
torch.manual_seed(0)
B, T, H, d = 2, 77, 3, 8
q = torch.randn(B, T, H, d, dtype=torch.float64); q = q / q.norm(dim=-1, keepdim=True) / d**0.5
k = torch.randn(B, T, H, d, dtype=torch.float64); k = k / k.norm(dim=-1, keepdim=True)
v = torch.randn(B, T, H, d, dtype=torch.float64)
g = -3 * torch.rand(B, T, H, dtype=torch.float64); beta = torch.rand(B, T, H, dtype=torch.float64)
diff = (model.delta_rule(q, k, v, g, beta) - model.delta_rule_chunked(q, k, v, g, beta)).abs().max()
assert diff < 1e-10, diff
print(f'ok: chunked delta rule = sequential (max diff {diff:.2g})')" || fail "chunked delta rule"
"$PY" parity.py --random --n-prompts 3 --n-predict 4 >"$T/p1" 2>&1 || fail "random-weight parity: $(cat "$T/p1")"
sed 's/^/random: /' "$T/p1" | grep -v sil-mkmodel
"$PY" parity.py --random --mtp --n-prompts 2 --n-predict 3 >"$T/p1m" 2>&1 ||
    fail "random-weight parity with the MTP layer: $(cat "$T/p1m")"
grep -q "ok: MTP layer" "$T/p1m" || fail "the MTP layer was not compared: $(cat "$T/p1m")"
sed 's/^/random mtp: /' "$T/p1m" | grep -v sil-mkmodel
# trained with the MTP layer: its loss and the trunk's both fall, and the export carries it
"$PY" train.py --out "$T/tr" --preset tiny --steps 12 --batch 8 --n-train 1500 --vocab 320 \
    --warmup 4 --log-every 4 --no-eval --mtp >"$T/tr.log" 2>&1 || fail "training: $(tail "$T/tr.log")"
"$PY" -c "
import json; l=[json.loads(x) for x in open('$T/tr/log.jsonl')]
assert l[-1]['loss'] < l[0]['loss'] - 0.5, l
assert l[-1]['mtp_loss'] < l[0]['mtp_loss'] - 0.5, l" || fail "loss did not fall in 12 steps: $(cat "$T/tr/log.jsonl")"
"$PY" parity.py --ckpt "$T/tr/ckpt.pt" --n-prompts 3 --n-predict 6 >"$T/p2" 2>&1 ||
    fail "trained-weight parity: $(cat "$T/p2")"
grep -q "ok: MTP layer" "$T/p2" || fail "the trained MTP layer was not compared: $(cat "$T/p2")"
sed 's/^/trained: /' "$T/p2" | grep -v sil-mkmodel
"$PY" parity.py --ckpt "$T/tr/ckpt.pt" --type q8_0 --n-prompts 2 --n-predict 4 >"$T/p3" 2>&1 ||
    fail "Q8_0 parity: $(cat "$T/p3")"
sed 's/^/trained q8_0: /' "$T/p3" | grep -v sil-mkmodel
# an MTP layer trained alone on a trained model's frozen trunk (train.py --init-from FILE
# --train-only mtp): the MTP loss falls, and the trunk's tensors come out of the export unchanged
"$PY" -c "
from export import export, load
m, _ = load('$T/tr/ckpt.pt')
export(m, '$T/tr/tokenizer.json', '$T/tr.gguf', 'q8_0')" || fail "export of the trained model"
"$PY" train.py --out "$T/mo" --init-from "$T/tr.gguf" --mtp --train-only mtp --steps 6 \
    --batch 8 --n-train 200 --warmup 2 --log-every 2 --no-eval >"$T/mo.log" 2>&1 ||
    fail "MTP-only training: $(tail "$T/mo.log")"
"$PY" -c "
import json, numpy as np, gguf_read, mtp_only
from export import export, load
l = [json.loads(x) for x in open('$T/mo/log.jsonl')]
assert l[-1]['mtp_loss'] < l[0]['mtp_loss'], l
m, _ = load('$T/mo/ckpt.pt')
export(m, '$T/mo/tokenizer.json', '$T/mo.gguf', 'q8_0')
differ = mtp_only.same_trunk('$T/tr.gguf', '$T/mo.gguf')
assert differ and all(k.startswith('blk.%d.' % m.cfg.n_layer) for k in differ), differ
_, a = gguf_read.read('$T/tr.gguf'); _, b = gguf_read.read('$T/mo.gguf')
trunk = [k for k in a if not k.startswith('blk.%d.' % m.cfg.n_layer)]
assert trunk and all(np.array_equal(a[k], b[k]) for k in trunk), 'trunk changed'
assert any(not np.array_equal(a[k], b[k]) for k in a if k not in trunk), 'MTP layer unchanged'
print(f'ok: MTP layer trained alone ({len(trunk)} trunk tensors unchanged, mtp loss '
      f'{l[0][\"mtp_loss\"]:.3f} -> {l[-1][\"mtp_loss\"]:.3f})')" >"$T/mo.chk" 2>&1 ||
    fail "MTP-only training: $(cat "$T/mo.chk")"
cat "$T/mo.chk"
echo "ok: engine = PyTorch on random and trained qwen35moe weights"
