"""The shipped demo model (models/) held to PyTorch, and its accuracy through the daemon.

  demo_model_tests.py engine    sil-eval on the held-out questions of heldout_torch_q8_0.jsonl
                                (normal and exact mode), the logits of reference.json, and
                                speculative decoding with the model's MTP layer
  demo_model_tests.py chat N [PATH]  N held-out 2-digit x 2-digit multiplications through
                                sil-chat (a running siliceod on $SILICEO_SOCKET); PATH: the
                                answers saved
  demo_model_tests.py chatspec N PATH  the first N of them through a daemon with spec = mtp:
                                PATH's answers, and the MTP layer's drafts accepted

The PyTorch side was computed once, on the same Q8_0 weights, by bench/train/ (reference.json by
pipeline.py, heldout_torch_q8_0.jsonl by torch_answers.py); only the standard library is needed
here. Environment: SIL_BUILD (its bin/), DEMO_MODEL.
"""

import concurrent.futures
import json
import os
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "train"))
import data  # noqa: E402  (standard library only)

BIN = os.path.join(os.environ.get("SIL_BUILD") or os.path.join(ROOT, "build"), "bin")
MODELS = os.path.join(ROOT, "models")
MODEL = os.environ.get("DEMO_MODEL") or os.path.join(MODELS, "siliceo-demo-qwen35moe-Q8_0.gguf")
IM_END = "<|im_end|>"
N_HELDOUT = 200  # the held-out questions the engine is held to PyTorch on, at least
# speculative decoding with the model's MTP layer: questions of each family, chain length, and
# the least acceptance (measured 0.755 of 607 drafts on the shipped file; an untrained layer, or
# one that does not see the prompt, accepts far fewer)
SPEC_PER_FAMILY, SPEC_DEPTH, SPEC_MIN_ACCEPTANCE = 4, 2, 0.6
# the daemon's (spec_tree = 1x1: one draft a step, always the trunk's hidden state): measured
# 0.986 of 568 drafts; 0.575 when the layer did not read the prompt
DAEMON_MIN_ACCEPTANCE = 0.8


def gguf_tokens(path):
    """tokenizer.ggml.tokens of a GGUF (v3 header, metadata read up to that key)."""
    with open(path, "rb") as f:
        b = f.read(1 << 20)  # the metadata of this small vocab is far inside the first MiB
    o = 0

    def take(fmt):
        nonlocal o
        v = struct.unpack_from("<" + fmt, b, o)
        o += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal o
        n = take("Q")
        s = b[o:o + n].decode("utf-8")
        o += n
        return s

    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def skip(t):
        nonlocal o
        if t == 8:
            string()
        elif t == 9:
            et, n = take("I"), take("Q")
            for _ in range(n):
                skip(et)
        else:
            o += sizes[t]

    if b[:4] != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file")
    o = 8
    take("Q")
    n_kv = take("Q")
    for _ in range(n_kv):
        key, t = string(), take("I")
        if key == "tokenizer.ggml.tokens" and t == 9:
            et, n = take("I"), take("Q")
            if et != 8:
                raise ValueError(f"{path}: tokenizer.ggml.tokens is not an array of strings")
            return [string() for _ in range(n)]
        skip(t)
    raise ValueError(f"{path}: no tokenizer.ggml.tokens")


def _byte_decoder():
    """GPT-2's byte-to-unicode map, inverted: token text -> bytes."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = list(bs), 0
    for c in range(256):
        if c not in bs:
            bs.append(c)
            cs.append(256 + n)
            n += 1
    return {chr(c): bytes([x]) for x, c in zip(bs, cs)}


class Engine:
    def __init__(self, model):
        self.model = model
        self.tokens = gguf_tokens(model)
        self.bd = _byte_decoder()

    def decode(self, ids):
        return b"".join(self.bd[ch] for i in ids for ch in self.tokens[i]).decode("utf-8", "replace")

    def tokenize(self, text):
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(text)
            f.flush()
            r = subprocess.run([os.path.join(BIN, "sil-eval"), "--model", self.model,
                                "--tokenize-file", f.name, "--parse-special", "--json"],
                               check=True, capture_output=True, text=True)
        return json.loads(r.stdout)["ids"]

    def eval(self, ids, n_predict, exact, logits="none"):
        cmd = [os.path.join(BIN, "sil-eval"), "--model", self.model, "--tokens",
               ",".join(map(str, ids)), "--n-predict", str(n_predict), "--logits", logits,
               "--json", "--threads", "1"]
        r = subprocess.run(cmd + (["--exact"] if exact else []), check=True, capture_output=True,
                           text=True)
        return json.loads(r.stdout)

    def spec(self, ids, n_predict):
        """sil-eval --spec mtp's report (identical, drafted, accepted, steps, emitted)."""
        cmd = [os.path.join(BIN, "sil-eval"), "--model", self.model, "--tokens",
               ",".join(map(str, ids)), "--n-predict", str(n_predict), "--logits", "none",
               "--json", "--threads", "1", "--spec", "mtp", "--spec-tree", f"1x{SPEC_DEPTH}"]
        return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)[
            "spec"]

    def complete(self, ids, n_predict, exact):
        """The greedy completion as text, cut after the first <|im_end|>."""
        text = self.decode(self.eval(ids, n_predict, exact)["greedy"])
        return text.split(IM_END)[0] + (IM_END if IM_END in text else "")


def pmap(fn, xs, workers=None):
    with concurrent.futures.ThreadPoolExecutor(workers or max(2, os.cpu_count() or 2)) as ex:
        return list(ex.map(fn, xs))


def test_engine():
    eng = Engine(MODEL)
    ok = True
    # 1. logits of the reference prompts, exact mode, against PyTorch in float64
    for r in json.load(open(os.path.join(MODELS, "reference.json"))):
        if eng.tokenize(r["prompt"]) != r["ids"]:
            print(f"FAIL: the engine tokenizes {r['prompt']!r} differently from the reference")
            ok = False
        out = eng.eval(r["ids"], 0, True, logits="all")
        nv = out["n_vocab"]
        worst = 0.0
        for pos, ref in zip(r["positions"], r["logits"]):
            row = out["logits"][pos]  # one row of n_vocab logits per prompt position
            if len(row) != nv or len(ref) != nv:
                print(f"FAIL: logits row of {len(row)}, reference of {len(ref)}, vocab {nv}")
                return False
            worst = max(worst, max(abs(a - b) for a, b in zip(row, ref)))
        good = worst <= 1e-3
        ok = ok and good
        print(f"{'ok' if good else 'FAIL'}: reference logits, {len(r['ids'])} tokens, "
              f"{len(r['positions'])} positions x {nv}: max |engine - torch| {worst:.3g} "
              f"(limit 1e-3)")
    # 2. greedy answers on the held-out questions, normal and exact mode
    held = [json.loads(x) for x in open(os.path.join(MODELS, "heldout_torch_q8_0.jsonl"))]
    fams = {e["family"] for e in held}
    if len(held) < N_HELDOUT or fams != set(data.FAMILIES):
        print(f"FAIL: heldout_torch_q8_0.jsonl has {len(held)} questions of {sorted(fams)}: "
              f"{N_HELDOUT} of all of {data.FAMILIES} wanted")
        return False
    ids = pmap(lambda e: eng.tokenize(e["prompt"]), held)
    # PyTorch's completion length bounds the tokens needed; the slack covers a segmentation
    # longer than the canonical one.
    lens = pmap(lambda e: len(eng.tokenize(e["torch_completion"])) + 8, held)
    n = len(held)
    torch_ok = sum(data.answer_of(e["torch_completion"]) == e["answer"] for e in held)
    for exact in (False, True):
        comp = pmap(lambda a: eng.complete(a[0], a[1], exact), list(zip(ids, lens)))
        same = sum(data.answer_of(c) == data.answer_of(e["torch_completion"])
                   for c, e in zip(comp, held))
        right = sum(data.answer_of(c) == e["answer"] for c, e in zip(comp, held))
        mode = "exact" if exact else "normal"
        good = same * 100 >= 99 * n and abs(right - torch_ok) <= 1
        ok = ok and good
        print(f"{'ok' if good else 'FAIL'}: {mode} mode, {n} held-out questions: answers equal "
              f"PyTorch's in {same}/{n} (need 99%), correct {right}/{n} (PyTorch {torch_ok}/{n})")
        per = {f: [0, 0] for f in data.FAMILIES}  # engine correct, questions
        for c, e in zip(comp, held):
            per[e["family"]][0] += data.answer_of(c) == e["answer"]
            per[e["family"]][1] += 1
        print(f"    {mode}: correct per family: "
              + ", ".join(f"{f} {r}/{t}" for f, (r, t) in per.items()))
        differ = [(c, e) for c, e in zip(comp, held)
                  if data.answer_of(c) != data.answer_of(e["torch_completion"])]
        for c, e in differ[:10]:
            print(f"    {mode}: {e['key']}: engine {c!r}, torch {e['torch_completion']!r}")
    # 3. speculative decoding with the model's own MTP layer (a chain of SPEC_DEPTH drafts) on
    # SPEC_PER_FAMILY questions of each family: the tokens are plain decoding's, and the trained
    # layer's drafts are accepted as often as it was measured to (a broken MTP path, or an
    # untrained layer, accepts next to nothing)
    sel = [e for f in data.FAMILIES for e in [h for h in held if h["family"] == f][:SPEC_PER_FAMILY]]
    # each answer's tokens through its <|im_end|> (lens has 8 to spare): past it the model was
    # never trained, and generation stops there
    outs = pmap(lambda e: eng.spec(ids[held.index(e)], lens[held.index(e)] - 8), sel)
    same = sum(o["identical"] for o in outs)
    drafted = sum(o["drafted"] for o in outs)
    acc = sum(o["accepted"] for o in outs) / max(1, drafted)
    good = same == len(sel) and acc >= SPEC_MIN_ACCEPTANCE
    ok = ok and good
    print(f"{'ok' if good else 'FAIL'}: --spec mtp (chain of {SPEC_DEPTH}), {len(sel)} held-out "
          f"questions: {same}/{len(sel)} identical to plain decoding, acceptance {acc:.3f} of "
          f"{drafted} drafts (need {SPEC_MIN_ACCEPTANCE}), "
          f"{sum(o['emitted'] for o in outs) / max(1, sum(o['steps'] for o in outs)):.2f} tokens a step")
    return ok


def test_chat(n, save=None):
    qs = data.mul2x2_heldout(n, 1)  # the seed of the shipped model's data

    def ask(e):
        q = e["prompt"].split("user\n", 1)[1].split(IM_END, 1)[0]
        r = subprocess.run([os.path.join(BIN, "sil-chat"), "--json", "-t", "0", "-n", "96",
                            "--timeout", "60", q], capture_output=True, text=True)
        if r.returncode != 0:
            return q, f"(sil-chat exit {r.returncode}: {r.stderr.strip()})"
        return q, json.loads(r.stdout)["text"].strip()

    res = pmap(ask, qs, 2)  # two requests at a time: the daemon runs on 2 threads
    right = sum(a == e["answer"] for (q, a), e in zip(res, qs))
    wrong = [(q, a, e["answer"]) for (q, a), e in zip(res, qs) if a != e["answer"]]
    for q, a, want in wrong[:10]:
        print(f"    wrong: {q} -> {a!r} (right: {want})")
    good = right * 100 >= 95 * n
    print(f"{'ok' if good else 'FAIL'}: sil-chat, {n} held-out 2-digit x 2-digit "
          f"multiplications: {right}/{n} correct ({100 * right / n:.1f}%, need 95%)")
    if save:
        with open(save, "w") as f:
            json.dump([a for q, a in res], f)
    return good


def test_chat_spec(n, path):
    """The first n questions of test_chat through a daemon whose model's MTP layer drafts
    (spec = mtp): the answers of the daemon without it (path), and the drafts accepted as the
    trained layer's are when it reads the prompt."""
    sys.path.insert(0, HERE)
    import siltest
    want = json.load(open(path))[:n]
    qs = data.mul2x2_heldout(n, 1)

    def ask(e):
        q = e["prompt"].split("user\n", 1)[1].split(IM_END, 1)[0]
        r = subprocess.run([os.path.join(BIN, "sil-chat"), "--json", "-t", "0", "-n", "96",
                            "--timeout", "60", q], capture_output=True, text=True)
        return json.loads(r.stdout)["text"].strip() if r.returncode == 0 else None

    got = pmap(ask, qs, 2)
    same = sum(a == b for a, b in zip(got, want))
    st = siltest.Client().ok("status")[0]["speculative"]
    acc = st["acceptance_rate"] if st else 0.0
    good = same == n and st is not None and st["drafted"] > 0 and acc >= DAEMON_MIN_ACCEPTANCE
    print(f"{'ok' if good else 'FAIL'}: sil-chat with the MTP layer drafting, {n} questions: "
          f"{same}/{n} answers as without it; {st and st['accepted']} of {st and st['drafted']} "
          f"drafts accepted ({acc:.3f}, need {DAEMON_MIN_ACCEPTANCE}), "
          f"{st and st['tokens_per_step']:.2f} tokens a step, "
          f"{st and st['stopped_requests']} requests stopped speculating")
    return good


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "engine":
        sys.exit(0 if test_engine() else 1)
    if what == "chat":
        sys.exit(0 if test_chat(int(sys.argv[2]) if len(sys.argv) > 2 else 200,
                                sys.argv[3] if len(sys.argv) > 3 else None) else 1)
    if what == "chatspec":
        sys.exit(0 if test_chat_spec(int(sys.argv[2]), sys.argv[3]) else 1)
    sys.exit(__doc__)
