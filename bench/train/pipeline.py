"""The whole run: data -> vocab -> train -> export -> engine parity -> engine accuracy.

  pipeline.py --out DIR [--preset demo] [--time-budget S] [train.py options...]

Runs train.py into DIR, exports DIR/model-f32.gguf, model-q8_0.gguf and model-q4_k_m.gguf through
sil-mkmodel, checks the engine's logits against PyTorch on the F32 file (sil-eval --exact), then
answers the held-out questions with the engine (sil-eval greedy, F32 exact and Q8_0 and Q4_K_M
normal) and writes DIR/engine_eval.json (accuracy per family, agreement with PyTorch's greedy
answers) and DIR/reference.json (PyTorch float64 logits of a few prompts on the Q8_0 file's
dequantized weights: what a make-check test of the shipped file compares against). Needs build/bin/sil-mkmodel and build/bin/sil-eval.
"""

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import tarfile
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bpe  # noqa: E402
import data  # noqa: E402
import parity  # noqa: E402
import train  # noqa: E402
from gguf_read import load_into  # noqa: E402
from export import BIN, export, load  # noqa: E402
from model import Qwen35Moe  # noqa: E402

TYPES = ["f32", "q8_0", "q4_k_m"]


def engine_selection(held, n):
    """The n held-out questions the engine answers: every (len // n)-th, the first n of them."""
    return held[::max(1, len(held) // n)][:n]


def engine_answers(gguf, tok, examples, exact, n_predict=96):
    """The engine's greedy completions, one sil-eval per question, a few at a time."""
    def one(e):
        r = parity.sil_eval(gguf, tok.encode(e["prompt"]), n_predict, exact=exact, logits="none",
                            threads=1)
        text = tok.decode(r["greedy"])
        return text.split("<|im_end|>")[0] + ("<|im_end|>" if "<|im_end|>" in text else "")
    with concurrent.futures.ThreadPoolExecutor(max(1, min(16, (os.cpu_count() or 2)))) as ex:
        return list(ex.map(one, examples))


def spec_eval(gguf, tok, examples, mode, draft=None, depth=4, n_predict=96, threads=2):
    """Speculative decoding on the held-out questions, one sil-eval at a time (timed): the
    drafts' acceptance, tokens a step, the answers identical to plain decoding, and the decode
    speed against plain decoding in the same run (the median of the questions' ratios).
    n_predict: tokens a question, or a list of them (e.g. each answer's length through its
    <|im_end|>, where generation stops: what follows it was never trained on)."""
    tot = {"questions": 0, "identical": 0, "steps": 0, "drafted": 0, "accepted": 0, "emitted": 0}
    ratios = []
    for q, e in enumerate(examples):
        npred = n_predict[q] if isinstance(n_predict, list) else n_predict
        cmd = [os.path.join(BIN, "sil-eval"), "--model", gguf,
               "--tokens", ",".join(map(str, tok.encode(e["prompt"]))), "--logits", "none",
               "--json", "--n-predict", str(npred), "--threads", str(threads),
               "--spec", mode, "--spec-tree", f"1x{depth}"]
        if draft:
            cmd += ["--draft-model", draft]
        r = subprocess.run(cmd, capture_output=True, text=True)
        s = json.loads(r.stdout)["spec"] if r.stdout.strip() else None
        if s is None:
            raise RuntimeError(f"sil-eval --spec {mode} failed: {r.stderr[-400:]}")
        tot["questions"] += 1
        tot["identical"] += bool(s["identical"])
        for k in ("steps", "drafted", "accepted", "emitted"):
            tot[k] += s[k]
        if s.get("speedup"):
            ratios.append(s["speedup"])
    tot["acceptance_rate"] = tot["accepted"] / max(1, tot["drafted"])
    tot["tokens_per_step"] = tot["emitted"] / max(1, tot["steps"])
    ratios.sort()
    tot["speedup_median"] = ratios[len(ratios) // 2] if ratios else None
    tot["depth"], tot["threads"] = depth, threads
    return tot


def score(examples, completions, torch_completions):
    per = {}
    for e, c, t in zip(examples, completions, torch_completions):
        f = per.setdefault(e["family"], {"correct": 0, "total": 0, "same_as_torch": 0})
        f["total"] += 1
        f["correct"] += data.answer_of(c) == e["answer"]
        f["same_as_torch"] += data.answer_of(c) == data.answer_of(t)
    for f in per.values():
        f["accuracy"] = f["correct"] / f["total"]
    return per


def reference(model, tok, prompts, path):
    m64 = Qwen35Moe(model.cfg).double()
    m64.load_state_dict(model.state_dict())
    m64.eval()
    ref = []
    with torch.no_grad():
        for p in prompts:
            ids = tok.encode(p)
            lg = m64(torch.tensor([ids]))[0]
            ref.append({"prompt": p, "ids": ids, "positions": list(range(len(ids) - 4, len(ids))),
                        "logits": [[float(f"{v:.7g}") for v in lg[i].tolist()]
                                   for i in range(len(ids) - 4, len(ids))]})
    with open(path, "w") as f:
        json.dump(ref, f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--bundle", help="copy the results here as at most 8 files (a device "
                    "run's $OUT): the two quantized models, the JSON results, the plot, a tar")
    ap.add_argument("--llama-bench", help="a llama-bench binary: check that llama.cpp loads "
                    "and runs the Q8_0 and Q4_K_M files (output into the bundle's tar)")
    ap.add_argument("--engine-questions", type=int, default=200,
                    help="held-out questions the engine answers (spread over the families)")
    ap.add_argument("--spec-questions", type=int, default=40,
                    help="of those, how many are answered again with speculative decoding (the "
                    "model's MTP layer when it has one, and --draft-model's), CPU, Q8_0")
    ap.add_argument("--draft-model", help="a draft model's GGUF (the same tokenizer: train.py "
                    "--preset draft with the same --vocab and --seed) to draft with")
    a, rest = ap.parse_known_args()
    # Before minutes of training: the tools the export and the checks need, and new enough.
    mk, ev = os.path.join(BIN, "sil-mkmodel"), os.path.join(BIN, "sil-eval")
    for tool in (mk, ev):
        if not os.access(tool, os.X_OK):
            sys.exit(f"pipeline: {tool} is missing: build it first "
                     f"(make build/bin/{os.path.basename(tool)})")
    helptext = subprocess.run([mk, "--help"], capture_output=True, text=True).stdout
    if "--weights-from" not in helptext:
        sys.exit(f"pipeline: {mk} has no --weights-from: it is older than the exporter; rebuild it")
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    subprocess.run([sys.executable, os.path.join(HERE, "train.py"), "--out", a.out] + rest,
                   check=True)
    ckpt = os.path.join(a.out, "ckpt.pt")
    model, ck = load(ckpt)
    model.eval()
    tok_path = os.path.join(a.out, "tokenizer.json")
    tok = bpe.Tokenizer.load(tok_path)
    files = {}
    for t in TYPES:
        files[t] = os.path.join(a.out, f"model-{t}.gguf")
        export(model, tok_path, files[t], t)
        print(f"export: {files[t]} {os.path.getsize(files[t]) / 1e6:.2f} MB", flush=True)

    held = [json.loads(line) for line in open(os.path.join(a.out, "heldout_torch.jsonl"))]
    sel = engine_selection(held, a.engine_questions)
    prompts = [e["prompt"] for e in sel[:3]]
    ok_tok = parity.check_tokenizer(tok, files["f32"], [e["prompt"] for e in sel[:50]])
    ok_logits = parity.compare(model, tok, files["f32"], prompts, 8, 1e-3)

    # PyTorch on the Q8_0 file's own (dequantized) weights: the reference for the shipped file
    mq = load_into(Qwen35Moe(model.cfg), files["q8_0"]).eval()
    ok_q8 = parity.compare(mq, tok, files["q8_0"], prompts, 8, 1e-3)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch_q8 = train.greedy(mq.to(dev), tok, [e["prompt"] for e in sel], 96, dev, bf16=False)
    with open(os.path.join(a.out, "heldout_torch_q8_0.jsonl"), "w") as f:
        for e, c in zip(sel, torch_q8):
            f.write(json.dumps({"key": e["key"], "family": e["family"], "prompt": e["prompt"],
                                "answer": e["answer"], "torch_completion": c}) + "\n")

    reference(mq, tok, prompts, os.path.join(a.out, "reference.json"))  # of the Q8_0 weights
    res = {"parity_tokenizer": ok_tok, "parity_logits_exact_f32": ok_logits,
           "parity_logits_exact_q8_0": ok_q8, "n": len(sel)}
    torch_c = [e["torch_completion"] for e in sel]
    res["torch"] = score(sel, torch_c, torch_c)
    res["torch_q8_0"] = score(sel, torch_q8, torch_q8)
    for t, exact in (("f32", True), ("q8_0", False), ("q8_0", True), ("q4_k_m", False)):
        name = f"{t}{'_exact' if exact else ''}"
        comp = engine_answers(files[t], tok, sel, exact)
        res[name] = score(sel, comp, torch_q8 if t == "q8_0" else torch_c)
        tot = sum(f["correct"] for f in res[name].values())
        same = sum(f["same_as_torch"] for f in res[name].values())
        print(f"engine {name}: {tot}/{len(sel)} correct, {same}/{len(sel)} answers equal "
              f"PyTorch's", flush=True)
    spec_sel = sel[:a.spec_questions]
    for mode, draft in (("mtp", None), ("draft", a.draft_model)):
        if not spec_sel or (mode == "mtp" and not model.cfg.mtp) or (mode == "draft" and not draft):
            continue
        res[f"spec_{mode}"] = s = spec_eval(files["q8_0"], tok, spec_sel, mode, draft)
        print(f"engine q8_0 --spec {mode}: acceptance {s['acceptance_rate']:.3f}, "
              f"{s['tokens_per_step']:.2f} tokens a step, {s['identical']}/{s['questions']} "
              f"identical to plain decoding, median speed-up {s['speedup_median']}", flush=True)
    extra = []
    if a.llama_bench:
        for t in ("q8_0", "q4_k_m"):
            r = subprocess.run([a.llama_bench, "-m", files[t], "-ngl", "99", "-p", "64", "-n", "32",
                                "-r", "2", "-o", "json"], capture_output=True, text=True)
            name = f"llama-bench-{t}.json"
            with open(os.path.join(a.out, name), "w") as f:
                f.write(r.stdout + ("\n# stderr:\n" + r.stderr[-4000:] if r.returncode else ""))
            extra.append(name)
            res[f"llama_bench_{t}_exit"] = r.returncode
            print(f"llama-bench {t}: exit {r.returncode}", flush=True)
    res["seconds_total"] = round(time.time() - t0, 1)
    with open(os.path.join(a.out, "engine_eval.json"), "w") as f:
        json.dump(res, f, indent=1)
    if a.bundle:
        os.makedirs(a.bundle, exist_ok=True)
        for f in ("model-q8_0.gguf", "model-q4_k_m.gguf", "metrics.json", "engine_eval.json",
                  "loss.png", "reference.json", "heldout_torch_q8_0.jsonl"):
            if os.path.exists(os.path.join(a.out, f)):
                shutil.copy(os.path.join(a.out, f), a.bundle)
        with tarfile.open(os.path.join(a.bundle, "rest.tar.xz"), "w:xz") as t:
            for f in ["tokenizer.json", "log.jsonl", "heldout_torch.jsonl"] + extra:
                t.add(os.path.join(a.out, f), f)
    print(f"pipeline done in {res['seconds_total']:.0f} s: {a.out}", flush=True)
    ok_spec = all(res[k]["identical"] == res[k]["questions"] for k in ("spec_mtp", "spec_draft")
                  if k in res)
    sys.exit(0 if ok_tok and ok_logits and ok_q8 and ok_spec else 1)


if __name__ == "__main__":
    main()
