"""The engine against the PyTorch model on the same weights.

  parity.py --random [--preset tiny]       random weights: export F32, compare logits
  parity.py --ckpt CKPT [--type q8_0]      a trained checkpoint, exported to F32 (or Q8_0)
  parity.py --ckpt CKPT --gguf FILE        against an existing F32 or Q8_0 export of it

For each prompt, sil-eval --exact --logits all --json runs the GGUF and the PyTorch forward runs
the checkpoint in float64 (a reference free of PyTorch's own float32 rounding); the check is
max |engine - torch| <= tol * max(1, max |torch|) over every position and vocab entry. The
greedy continuations are compared too. A model with the MTP layer (--mtp with --random, or a
checkpoint trained with it) also has that layer's logits compared (sil-eval --mtp-logits: row t
from the hidden state at t and token t + 1), to the same tolerance. Exit status 0 = within
tolerance, 1 = not.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import data  # noqa: E402
from export import BIN, export, load  # noqa: E402
from gguf_read import load_into  # noqa: E402
from model import PRESETS, Qwen35Moe  # noqa: E402


def sil_eval(gguf, ids, n_predict, exact=True, threads=2, logits="all"):
    cmd = [os.path.join(BIN, "sil-eval"), "--model", gguf,
           "--tokens", ",".join(map(str, ids)), "--logits", logits, "--json",
           "--n-predict", str(n_predict), "--threads", str(threads)]
    if exact:
        cmd.append("--exact")
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(r.stdout)


def compare_mtp(m64, gguf, ids, tol):
    """The MTP layer's logits of one prompt, engine (exact) against PyTorch float64."""
    cmd = [os.path.join(BIN, "sil-eval"), "--model", gguf, "--tokens", ",".join(map(str, ids)),
           "--mtp-logits", "--exact", "--threads", "2"]
    r = subprocess.run(cmd, check=True, capture_output=True, text=True)
    eng = torch.tensor(json.loads(r.stdout)["mtp_logits"], dtype=torch.float64)
    with torch.no_grad():
        ref = m64(torch.tensor([ids]), mtp=True)[1][0]
    eng = eng.view(ref.shape)
    diff = (eng - ref).abs().max().item()
    scale = max(1.0, ref.abs().max().item())
    good = diff <= tol * scale
    print(f"{'ok' if good else 'FAIL'}: MTP layer, {len(ids) - 1} rows, max|diff| {diff:.3g} "
          f"(scale {scale:.3g}, tol {tol * scale:.3g})")
    return good


def torch_greedy(model, ids, n):
    out = []
    cur = list(ids)
    with torch.no_grad():
        for _ in range(n):
            lg = model(torch.tensor([cur]))[0, -1]
            t = int(lg.argmax())
            out.append(t)
            cur.append(t)
    return out


def check_tokenizer(tok, gguf, texts):
    """Our encoder against the engine's, on whole chat exchanges (specials parsed)."""
    ok = True
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
        for t in texts:
            f.seek(0)
            f.truncate()
            f.write(t)
            f.flush()
            r = subprocess.run([os.path.join(BIN, "sil-eval"), "--model", gguf,
                                "--tokenize-file", f.name, "--parse-special", "--json"],
                               check=True, capture_output=True, text=True)
            if json.loads(r.stdout)["ids"] != tok.encode(t):
                print(f"FAIL: tokenizer differs on {t!r}")
                ok = False
    print(f"{'ok' if ok else 'FAIL'}: tokenizer equal on {len(texts)} exchanges")
    return ok


def compare(model, tok, gguf, prompts, n_predict, tol, exact=True):
    ok = True
    m64 = Qwen35Moe(model.cfg).double()
    m64.load_state_dict(model.state_dict())
    m64.eval()
    for text in prompts:
        ids = tok.encode(text)
        r = sil_eval(gguf, ids, n_predict, exact)
        eng = torch.tensor(r["logits"], dtype=torch.float64).view(len(ids), -1)
        with torch.no_grad():
            ref = m64(torch.tensor([ids]))[0]
        diff = (eng - ref).abs().max().item()
        scale = max(1.0, ref.abs().max().item())
        greedy = torch_greedy(m64, ids, n_predict)
        same = greedy == r["greedy"]
        good = diff <= tol * scale
        ok = ok and good and same
        print(f"{'ok' if good and same else 'FAIL'}: {len(ids)} tokens, max|diff| {diff:.3g} "
              f"(scale {scale:.3g}, tol {tol * scale:.3g}), greedy {n_predict} tokens "
              f"{'equal' if same else 'DIFFER: ' + str(greedy) + ' vs ' + str(r['greedy'])}")
        if model.cfg.mtp and exact:
            ok = compare_mtp(m64, gguf, ids, tol) and ok
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--random", action="store_true")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--mtp", action="store_true", help="with --random: an MTP layer too")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--ckpt")
    ap.add_argument("--gguf", help="an existing export (F32 or Q8_0) to compare instead")
    ap.add_argument("--type", default="f32", choices=["f32", "q8_0"],
                    help="export type; q8_0: PyTorch runs the dequantized Q8_0 weights")
    ap.add_argument("--tol", type=float, default=1e-3)
    ap.add_argument("--n-prompts", type=int, default=3)
    ap.add_argument("--n-predict", type=int, default=4)
    a = ap.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        if a.random:
            ex = data.train_examples(600, a.seed)
            tok = bpe.train([e["prompt"] + e["completion"] for e in ex], 320)
            tok_path = os.path.join(tmp, "tokenizer.json")
            tok.save(tok_path)
            cfg = dataclasses.replace(PRESETS[a.preset], n_vocab=len(tok), mtp=a.mtp)
            model = Qwen35Moe(cfg)
            model.init_weights(a.seed)
            # random weights at training init are near-silent; larger norms and gates make
            # every block contribute, so a mismatch anywhere shows in the logits
            with torch.no_grad():
                g = torch.Generator().manual_seed(a.seed + 1)
                for name, t in model.named_gguf():
                    if name.endswith("norm.weight"):
                        t.copy_(1 + 0.5 * torch.randn(t.shape, generator=g))
                    elif name.endswith("token_embd.weight") or name == "output.weight":
                        t.mul_(4)
            gguf = os.path.join(tmp, "m.gguf")
        else:
            model, ck = load(a.ckpt)
            tok_path = os.path.join(os.path.dirname(os.path.abspath(a.ckpt)), "tokenizer.json")
            tok = bpe.Tokenizer.load(tok_path)
            gguf = a.gguf or os.path.join(tmp, "m.gguf")
        model.eval()
        if not a.gguf:
            export(model, tok_path, gguf, a.type)
        if a.type != "f32" or a.gguf:
            # PyTorch runs what the file holds (Q8_0 dequantized), so the check is the engine's
            model = load_into(Qwen35Moe(model.cfg), gguf).eval()
        held = data.heldout_examples(1, a.seed)
        prompts = [e["prompt"] for e in held[:a.n_prompts]]
        ok = check_tokenizer(tok, gguf, [e["prompt"] + e["completion"] for e in held])
        ok = compare(model, tok, gguf, prompts, a.n_predict, a.tol) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
