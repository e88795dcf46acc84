"""PyTorch's greedy answers to held-out questions on a GGUF file's own weights, without training.

  torch_answers.py --model M.gguf --n 200 --out heldout_torch_q8_0.jsonl
                   [--first 120] [--tokenizer tokenizer.json] [--seed 1] [--heldout 200]

What pipeline.py writes as heldout_torch_q8_0.jsonl, for any number of questions: the model's
shape comes from the file's metadata, its weights are the file's (Q8_0 dequantized, see
gguf_read.py), the tokenizer is the file's merges (or --tokenizer), and the held-out questions
are data.heldout_examples(--heldout, --seed), as train.py drew them. The selection: the --first
questions the pipeline picked with --engine-questions FIRST (so a file made by the pipeline is a
prefix of this one), then the other held-out questions, each time of the family with the fewest
so far, until --n. Float32 greedy, 96 new tokens at most, on CUDA when there is one.
"""

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import data  # noqa: E402
import gguf_read  # noqa: E402
import train  # noqa: E402
from model import Config, Qwen35Moe  # noqa: E402
from pipeline import engine_selection  # noqa: E402


def config_of(meta, tensors):
    """The model.Config of a qwen35moe GGUF, from its metadata."""
    if meta.get("general.architecture") != "qwen35moe":
        raise ValueError(f"architecture {meta.get('general.architecture')!r}, not qwen35moe")
    k = "qwen35moe."
    hd = meta[k + "attention.key_length"]
    # block_count counts an MTP layer too (blocks n_layer .. block_count - 1), as llama.cpp has it
    nextn = meta.get(k + "nextn_predict_layers", 0)
    return Config(
        n_vocab=len(meta["tokenizer.ggml.tokens"]), n_layer=meta[k + "block_count"] - nextn,
        mtp=nextn > 0,
        n_embd=meta[k + "embedding_length"], n_head=meta[k + "attention.head_count"],
        n_head_kv=meta[k + "attention.head_count_kv"], head_dim=hd,
        rope_partial=meta[k + "rope.dimension_count"] / hd,
        rope_base=float(f"{meta[k + 'rope.freq_base']:.7g}"),
        n_expert=meta[k + "expert_count"], n_expert_used=meta[k + "expert_used_count"],
        n_ff_exp=meta[k + "expert_feed_forward_length"],
        n_ff_shexp=meta[k + "expert_shared_feed_forward_length"],
        ssm_n_group=meta[k + "ssm.group_count"], ssm_dt_rank=meta[k + "ssm.time_step_rank"],
        ssm_d_state=meta[k + "ssm.state_size"], ssm_d_conv=meta[k + "ssm.conv_kernel"],
        full_attn_interval=meta[k + "full_attention_interval"],
        # stored as float32: back to the decimal the config had
        rms_eps=float(f"{meta[k + 'attention.layer_norm_rms_epsilon']:.7g}"),
        tied="output.weight" not in tensors, n_ctx_train=meta[k + "context_length"])


def tokenizer_of(meta, path=None):
    """Our tokenizer from tokenizer.json, or rebuilt from the file's merges; either way its
    vocab must be the file's, token for token."""
    if path:
        tok = bpe.Tokenizer.load(path)
    else:
        tok = bpe.Tokenizer([tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]])
    if tok.vocab != list(meta["tokenizer.ggml.tokens"]):
        raise ValueError("the tokenizer's vocab differs from the file's tokenizer.ggml.tokens")
    return tok


def select(held, n, first):
    """pipeline.engine_selection(held, first), then the family with the fewest picked gives its
    next unpicked question (ties: data.FAMILIES order) until n."""
    sel = engine_selection(held, min(first, n))
    picked = {e["key"] for e in sel}
    left = {f: [e for e in held if e["family"] == f and e["key"] not in picked]
            for f in data.FAMILIES}
    count = {f: sum(e["family"] == f for e in sel) for f in data.FAMILIES}
    while len(sel) < n:
        fams = [f for f in data.FAMILIES if left[f]]
        if not fams:
            raise ValueError(f"only {len(sel)} held-out questions, {n} asked for")
        f = min(fams, key=lambda f: (count[f], data.FAMILIES.index(f)))
        sel.append(left[f].pop(0))
        count[f] += 1
    return sel


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="a qwen35moe GGUF (F32, F16 or Q8_0 tensors)")
    ap.add_argument("--out", required=True, help="the JSON lines file to write")
    ap.add_argument("--n", type=int, default=200, help="questions")
    ap.add_argument("--first", type=int, default=120,
                    help="the pipeline's --engine-questions whose selection comes first")
    ap.add_argument("--tokenizer", help="tokenizer.json (default: the file's merges)")
    ap.add_argument("--seed", type=int, default=1, help="train.py's --seed")
    ap.add_argument("--heldout", type=int, default=200, help="train.py's --heldout")
    a = ap.parse_args()
    meta, tensors = gguf_read.read(a.model)
    tok = tokenizer_of(meta, a.tokenizer)
    model = gguf_read.load_into(Qwen35Moe(config_of(meta, tensors)), a.model).eval()
    sel = select(data.heldout_examples(a.heldout, a.seed), a.n, a.first)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    comp = train.greedy(model.to(dev), tok, [e["prompt"] for e in sel], 96, dev, bf16=False)
    with open(a.out, "w") as f:
        for e, c in zip(sel, comp):
            f.write(json.dumps({"key": e["key"], "family": e["family"], "prompt": e["prompt"],
                                "answer": e["answer"], "torch_completion": c}) + "\n")
    right = sum(data.answer_of(c) == e["answer"] for e, c in zip(sel, comp))
    print(f"torch_answers: {len(sel)} questions, {right} right, on {dev}: {a.out}")


if __name__ == "__main__":
    main()
