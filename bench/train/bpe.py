"""A small byte-level BPE (GPT-2 byte alphabet, Qwen2 pre-tokenizer) trained on our own data.

Ids: 0-255 the byte tokens, then one token per merge, then the chat specials
<|endoftext|> <|im_start|> <|im_end|> (control) and <think> </think> (user-defined, as in Qwen3).
save() writes a Hugging Face tokenizer.json, which sil-mkmodel --vocab-from imports into the
GGUF's tokenizer.ggml.* keys (model gpt2, pre qwen2).

The pre-tokenizer is Qwen2's regex with \\p{L} = [A-Za-z] and \\p{N} = [0-9]: our corpus is ASCII
(train() checks), and on ASCII text the two agree. Digits are single tokens, as in Qwen2.
Standard library only.
"""

import json
import re

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
CONTROL = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

PRE = re.compile(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\nA-Za-z0-9]?[A-Za-z]+|[0-9]| ?[^\sA-Za-z0-9]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(s) for s in SPECIALS) + ")")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()
U2B = {v: k for k, v in B2U.items()}


def _words(text):
    for piece in SPECIAL_SPLIT.split(text):
        if not piece:
            continue
        if piece in SPECIALS:
            yield piece, True
        else:
            for w in PRE.findall(piece):
                yield "".join(B2U[b] for b in w.encode("utf-8")), False


class Tokenizer:
    def __init__(self, merges):
        self.merges = list(merges)  # [(a, b)], rank = index
        self.rank = {m: i for i, m in enumerate(self.merges)}
        self.vocab = [B2U[b] for b in range(256)] + [a + b for a, b in self.merges] + SPECIALS
        self.id = {t: i for i, t in enumerate(self.vocab)}
        assert len(self.id) == len(self.vocab), "duplicate token"
        self.cache = {}

    def __len__(self):
        return len(self.vocab)

    def special(self, s):
        return self.id[s]

    def _bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        parts = list(word)
        while len(parts) > 1:
            best, at = None, -1
            for i in range(len(parts) - 1):
                r = self.rank.get((parts[i], parts[i + 1]))
                if r is not None and (best is None or r < best):
                    best, at = r, i
            if best is None:
                break
            parts[at:at + 2] = [parts[at] + parts[at + 1]]
        ids = [self.id[p] for p in parts]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        out = []
        for w, sp in _words(text):
            out.extend([self.id[w]] if sp else self._bpe(w))
        return out

    def decode(self, ids):
        bs = bytearray()
        for i in ids:
            t = self.vocab[i]
            if t in SPECIALS:
                bs += t.encode()
            else:
                bs += bytes(U2B[c] for c in t)
        return bs.decode("utf-8", errors="replace")

    def save(self, path):
        n_base = 256 + len(self.merges)
        added = [{"id": n_base + i, "content": s, "single_word": False, "lstrip": False,
                  "rstrip": False, "normalized": False, "special": s in CONTROL}
                 for i, s in enumerate(SPECIALS)]
        doc = {
            "version": "1.0",
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": PRE.pattern}, "behavior": "Isolated",
                 "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                 "use_regex": False}]},
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                        "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None,
                      "continuing_subword_prefix": "", "end_of_word_suffix": "",
                      "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {t: i for i, t in enumerate(self.vocab[:n_base])},
                      "merges": [f"{a} {b}" for a, b in self.merges]},
        }
        with open(path, "w") as f:
            json.dump(doc, f, ensure_ascii=False, indent=1)

    @staticmethod
    def load(path):
        with open(path) as f:
            doc = json.load(f)
        return Tokenizer([tuple(m.split(" ")) for m in doc["model"]["merges"]])


def train(texts, vocab_size):
    """Merges learnt from texts until the vocab (bytes + merges + specials) has vocab_size tokens.
    The most frequent pair wins; ties go to the smaller pair, so the result is deterministic."""
    counts = {}
    for t in texts:
        if not t.isascii():
            raise ValueError(f"non-ASCII text in the corpus: {t[:40]!r}")
        for w, sp in _words(t):
            if not sp:
                counts[w] = counts.get(w, 0) + 1
    words = [(list(w), c) for w, c in counts.items()]
    merges = []
    n_merges = vocab_size - 256 - len(SPECIALS)
    while len(merges) < n_merges:
        pairs = {}
        for parts, c in words:
            for i in range(len(parts) - 1):
                p = (parts[i], parts[i + 1])
                pairs[p] = pairs.get(p, 0) + c
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        a, b = best
        for parts, _ in words:
            i = 0
            while i < len(parts) - 1:
                if parts[i] == a and parts[i + 1] == b:
                    parts[i:i + 2] = [a + b]
                i += 1
    # A short corpus may give fewer merges; pad with merges of unused byte pairs so the vocab
    # keeps its size (a multiple of 64 keeps the GPU matmuls aligned).
    k = 0
    have = set(merges)
    while len(merges) < n_merges:
        p = (B2U[0x80 + k // 64], B2U[0xC0 + k % 64])
        k += 1
        if p not in have:
            merges.append(p)
    return Tokenizer(merges)
