"""Exports a checkpoint (train.py's ckpt.pt) to GGUF through sil-mkmodel --weights-from.

  export.py CKPT OUT.gguf [--type f32|q8_0|q4_k_m] [--mkmodel PATH] [--name TEXT]

The raw F32 tensors (GGUF names, ne[0] fastest) go to a temporary directory beside OUT; the
tokenizer.json saved in the checkpoint becomes the GGUF vocab (sil-mkmodel --vocab-from). The
tensor list, metadata keys, type recipes and quantizers are sil-mkmodel's, the same code that
writes the random-weight benchmark models.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Qwen35Moe  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the build whose tools run (the tests point SIL_BUILD at the sanitized one)
BIN = os.path.join(os.environ.get("SIL_BUILD") or os.path.join(ROOT, "build"), "bin")


def load(ckpt_path):
    try:  # our own file: config and argv beside the tensors
        ck = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    except TypeError:
        ck = torch.load(ckpt_path, map_location="cpu")
    cfg = Config(**ck["config"])
    m = Qwen35Moe(cfg)
    m.load_state_dict(ck["model"])
    return m, ck


def dump_raw(model, d):
    os.makedirs(d, exist_ok=True)
    for name, t in model.named_gguf():
        t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tofile(
            os.path.join(d, name + ".f32"))


def export(model, tokenizer_json, out, qtype="q8_0", mkmodel=None, name=None, quiet=True):
    mkmodel = mkmodel or os.path.join(BIN, "sil-mkmodel")
    tmp = tempfile.mkdtemp(prefix=".raw-", dir=os.path.dirname(os.path.abspath(out)))
    try:
        dump_raw(model, tmp)
        cmd = [mkmodel] + model.cfg.mkmodel_flags() + [
            "--vocab-from", tokenizer_json, "--pre", "qwen2", "--weights-from", tmp,
            "--type", qtype, "--exact-quant", "--threads", "2", "--out", out,
            "--name", name or "siliceo demo qwen35moe"]
        if quiet:
            cmd.append("--quiet")
        subprocess.run(cmd, check=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("ckpt")
    ap.add_argument("out")
    ap.add_argument("--type", default="q8_0")
    ap.add_argument("--mkmodel")
    ap.add_argument("--name")
    a = ap.parse_args()
    model, ck = load(a.ckpt)
    tok = os.path.join(os.path.dirname(os.path.abspath(a.ckpt)), "tokenizer.json")
    export(model, tok, a.out, a.type, a.mkmodel, a.name)


if __name__ == "__main__":
    main()
