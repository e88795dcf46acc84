"""An MTP layer for a trained model, its trunk left as it is: train -> export -> checks -> speculation.

  mtp_only.py --model TRAINED.gguf --out DIR [--questions HELDOUT.jsonl] [--spec-questions N]
              [--depth D[,D...]] [--spec-threads T] [--draft-model DRAFT.gguf] [--trained]
              [train.py options...]

Runs train.py --init-from TRAINED.gguf --mtp --train-only mtp --no-eval into DIR (the trunk's
weights frozen, only the MTP layer trained on the trunk's hidden states), exports DIR/model-f32.gguf
and DIR/model-q8_0.gguf through sil-mkmodel, then checks:
  - the trunk is the model's own: every tensor of TRAINED.gguf is in the Q8_0 file with the same
    values (so the model answers exactly as before: its tests and held-out figures still hold);
  - the engine's logits, greedy tokens and MTP logits against PyTorch's on the F32 file (exact);
and answers --spec-questions questions of --questions (JSON lines with "prompt" and
"torch_completion", e.g. models/heldout_torch_q8_0.jsonl) with the Q8_0 file through the engine
with speculative decoding (sil-eval --spec mtp, chains of each --depth): acceptance, tokens a step,
answers identical to plain decoding, median speed-up against plain decoding in the same run, and
how many plain answers equal the file's torch_completion; with --draft-model the same with that
draft model drafting. Writes DIR/mtp_eval.json; exit 1 when
a check fails or a speculative answer differs from plain decoding.
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bpe  # noqa: E402
import data  # noqa: E402
import gguf_read  # noqa: E402
import parity  # noqa: E402
from export import export, load  # noqa: E402
from pipeline import engine_answers, spec_eval  # noqa: E402


def same_trunk(base, new):
    """The names of base's tensors that new lacks or holds with other values (empty: the same)."""
    _, tb = gguf_read.read(base)
    _, tn = gguf_read.read(new)
    return [k for k, v in tb.items() if k not in tn or tn[k].shape != v.shape or
            not np.array_equal(tn[k], v)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="the trained qwen35moe GGUF (F32/F16/Q8_0)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--questions", help="held-out questions (JSON lines: prompt, torch_completion)")
    ap.add_argument("--spec-questions", type=int, default=40)
    ap.add_argument("--depth", type=lambda v: [int(x) for x in v.split(",")], default=[4],
                    help="draft chain lengths, comma-separated (each a run over the questions)")
    ap.add_argument("--spec-threads", type=int, default=2)
    ap.add_argument("--draft-model", help="also speculate with this draft model's GGUF (the same "
                    "tokenizer: train.py --preset draft --vocab-from TRAINED.gguf)")
    ap.add_argument("--trained", action="store_true",
                    help="DIR already holds train.py's output (ckpt.pt, tokenizer.json): no training")
    a, rest = ap.parse_known_args()
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    if not a.trained:
        subprocess.run([sys.executable, os.path.join(HERE, "train.py"), "--out", a.out,
                        "--init-from", a.model, "--mtp", "--train-only", "mtp", "--no-eval"] + rest,
                       check=True)
    model, _ = load(os.path.join(a.out, "ckpt.pt"))
    model.eval()
    tok_path = os.path.join(a.out, "tokenizer.json")
    tok = bpe.Tokenizer.load(tok_path)
    files = {}
    for t in ("f32", "q8_0"):
        files[t] = os.path.join(a.out, f"model-{t}.gguf")
        export(model, tok_path, files[t], t)
        print(f"export: {files[t]} {os.path.getsize(files[t]) / 1e6:.2f} MB", flush=True)
    res = {"model": os.path.basename(a.model), "q8_0_bytes": os.path.getsize(files["q8_0"]),
           "base_bytes": os.path.getsize(a.model)}
    differ = same_trunk(a.model, files["q8_0"])
    res["trunk_tensors_differing"] = differ
    print(f"trunk: {len(differ)} tensors of {os.path.basename(a.model)} differ in the Q8_0 file",
          flush=True)
    qs = [json.loads(line) for line in open(a.questions)] if a.questions else []
    prompts = [e["prompt"] for e in qs[:3]] or ["<|im_start|>user\nWhat is 17 x 23?<|im_end|>\n"
                                                 "<|im_start|>assistant\n<think>"]
    res["parity_exact_f32"] = parity.compare(model, tok, files["f32"], prompts, 8, 1e-3)
    sel = qs[:a.spec_questions]
    if sel:
        plain = engine_answers(files["q8_0"], tok, sel, False)
        res["plain_equal_torch"] = sum(data.answer_of(p) == data.answer_of(e["torch_completion"])
                                       for p, e in zip(plain, sel))
        res["plain_correct"] = sum(data.answer_of(p) == e["answer"] for p, e in zip(plain, sel))
        # each answer's tokens through its <|im_end|>, where generation stops (the model was
        # never trained on what follows)
        lens = [len(tok.encode(e["torch_completion"])) for e in sel]
        res["spec_tokens"] = sum(lens)
        for mode, draft in (("mtp", None), ("draft", a.draft_model)):
            if mode == "draft" and not draft:
                continue
            res[f"spec_{mode}"] = runs = {}
            for d in a.depth:
                runs[d] = s = spec_eval(files["q8_0"], tok, sel, mode, draft, depth=d,
                                        n_predict=lens, threads=a.spec_threads)
                print(f"engine q8_0 --spec {mode} (chain of {d}): acceptance "
                      f"{s['acceptance_rate']:.3f}, {s['tokens_per_step']:.2f} tokens a step, "
                      f"{s['identical']}/{s['questions']} identical to plain decoding, median "
                      f"speed-up {s['speedup_median']}", flush=True)
        print(f"engine q8_0 plain: {res['plain_correct']}/{len(sel)} right, "
              f"{res['plain_equal_torch']} equal PyTorch's", flush=True)
    res["seconds_total"] = round(time.time() - t0, 1)
    with open(os.path.join(a.out, "mtp_eval.json"), "w") as f:
        json.dump(res, f, indent=1)
    ok = not differ and res["parity_exact_f32"] and all(
        r["identical"] == r["questions"] for k in ("spec_mtp", "spec_draft") if k in res
        for r in res[k].values())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
