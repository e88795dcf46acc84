"""Chat-formatted questions with checkable answers and short worked steps.

Every example is one ChatML exchange:
    <|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n<think>{steps}</think>{answer}<|im_end|>
Families: mul (2-digit x 2-digit, some 3-digit x 1-digit), add (2-4 digits), max (largest of a
short list), sort (ascending), count (a letter in a word), unit (unit conversions).

Held-out questions are split off by a hash of the question's canonical key, so the split does not
depend on the seed, the order or the number of examples drawn: a held-out key is never trained on.
Only the standard library is used, so make check can import this without PyTorch.
"""

import hashlib
import json
import random
import sys

FAMILIES = ["mul", "add", "max", "sort", "count", "unit"]
HELDOUT_PERCENT = 10  # of each family's keys

WORDS = """apple banana cherry orange grape lemon melon peach pear plum mango papaya berry
strawberry blueberry raspberry banana coconut kiwi lime apricot walnut almond peanut
bottle window garden kitten puppy rabbit turtle monkey giraffe elephant zebra tiger lion
panda koala dolphin whale shark octopus lobster parrot pigeon sparrow eagle falcon owl
river mountain valley forest desert island ocean meadow canyon volcano glacier prairie
pencil paper eraser ruler marker crayon folder basket bucket hammer ladder mirror pillow
blanket jacket sweater mitten button zipper pocket ribbon carpet curtain kettle teapot
spoon fork knife plate saucer napkin butter cheese bread pepper salad noodle pizza
pasta cookie muffin waffle pancake yogurt cereal coffee tissue bubble balloon rocket
planet comet galaxy meteor saturn jupiter mercury venus neptune summer winter autumn
spring morning evening midnight tomorrow yesterday holiday birthday letter number
pattern puzzle riddle secret mystery treasure pirate castle dragon wizard giant knight
princess kingdom village market school library museum theater hospital station airport
harbor bridge tunnel street avenue corner circle square triangle diagonal parallel
bookkeeper committee mississippi tennessee assessment successful accessory possession
banana coffee letter balloon address occurrence embarrass millennium necessary
parallel beginning commitment programming grammar hammer scissors
""".split()
WORDS = sorted(set(WORDS))

UNITS = [  # (from, to, factor)
    ("meters", "centimeters", 100),
    ("kilometers", "meters", 1000),
    ("kilograms", "grams", 1000),
    ("liters", "milliliters", 1000),
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("days", "hours", 24),
    ("feet", "inches", 12),
    ("weeks", "days", 7),
    ("yards", "feet", 3),
]


def is_heldout(key):
    h = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(h[:4], "little") % 100 < HELDOUT_PERCENT


def _mul_steps(a, b):
    """a x b through the tens and ones of b: '17x20 = 340, 17x3 = 51, 340 + 51 = 391'."""
    if b < 10:
        return f"{a}x{b} = {a * b}"
    t, o = b // 10 * 10, b % 10
    if o == 0:
        return f"{a}x{t} = {a * t}"
    return f"{a}x{t} = {a * t}, {a}x{o} = {a * o}, {a * t} + {a * o} = {a * b}"


def _add_steps(a, b):
    """Column addition from the right: '7+6 = 13 carry 1, 8+5+1 = 14 carry 1, ...'."""
    da, db = str(a)[::-1], str(b)[::-1]
    carry, parts = 0, []
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        expr = f"{x}+{y}" + (f"+{carry}" if carry else "")
        carry = s // 10
        parts.append(f"{expr} = {s}" + (" carry 1" if carry else ""))
    return ", ".join(parts)


def make(family, rng):
    """(key, question, steps, answer) of one random question of the family."""
    if family == "mul":
        if rng.random() < 0.8:
            a, b = rng.randint(10, 99), rng.randint(10, 99)
        else:
            a, b = rng.randint(100, 999), rng.randint(2, 9)
        q = rng.choice(["What is {a} x {b}?", "Compute {a} * {b}.", "{a} times {b}?"])
        return f"mul:{a}:{b}", q.format(a=a, b=b), _mul_steps(a, b), str(a * b)
    if family == "add":
        na, nb = rng.randint(2, 4), rng.randint(2, 4)
        a, b = rng.randint(10 ** (na - 1), 10**na - 1), rng.randint(10 ** (nb - 1), 10**nb - 1)
        q = rng.choice(["What is {a} + {b}?", "Add {a} and {b}.", "{a} plus {b}?"])
        return f"add:{a}:{b}", q.format(a=a, b=b), _add_steps(a, b), str(a + b)
    if family in ("max", "sort"):
        xs = rng.sample(range(1, 100), rng.randint(3, 5))
        lst = ", ".join(map(str, xs))
        if family == "max":
            best, steps = xs[0], []
            for x in xs[1:]:
                nb = max(best, x)
                steps.append(f"{best} vs {x} -> {nb}")
                best = nb
            q = rng.choice(["Which is the largest: {l}?", "What is the biggest of {l}?"])
            return f"max:{lst}", q.format(l=lst), ", ".join(steps), str(best)
        rest, steps = list(xs), []
        while rest:
            m = min(rest)
            steps.append(str(m))
            rest.remove(m)
        q = rng.choice(["Sort ascending: {l}", "Sort these numbers from small to large: {l}"])
        ans = ", ".join(map(str, sorted(xs)))
        return f"sort:{lst}", q.format(l=lst), "smallest first: " + " then ".join(steps), ans
    if family == "count":
        w = rng.choice(WORDS)
        c = rng.choice(w) if rng.random() < 0.85 else rng.choice("abcdefghijklmnopqrstuvwxyz")
        n, marks = 0, []
        for ch in w:
            if ch == c:
                n += 1
                marks.append(f"{ch}({n})")
            else:
                marks.append(ch)
        q = rng.choice(["How many {c}'s are in {w}?", "Count the letter {c} in {w}."])
        return f"count:{w}:{c}", q.format(c=c, w=w), " ".join(marks), str(n)
    if family == "unit":
        src, dst, f = rng.choice(UNITS)
        v = rng.randint(1, 99)
        q = rng.choice(["How many {d} are in {v} {s}?", "Convert {v} {s} to {d}."])
        steps = f"1 {src} = {f} {dst}, " + _mul_steps(v, f)
        return f"unit:{src}:{v}", q.format(d=dst, v=v, s=src), steps, str(v * f)
    raise ValueError(family)


def prompt(question):
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def completion(steps, answer):
    return f"<think>{steps}</think>{answer}<|im_end|>"


def train_examples(n, seed):
    """n training examples (dicts), families in turn, held-out keys skipped."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        fam = FAMILIES[len(out) % len(FAMILIES)]
        key, q, s, a = make(fam, rng)
        if is_heldout(key):
            continue
        out.append({"family": fam, "key": key, "prompt": prompt(q), "completion": completion(s, a),
                    "answer": a})
    return out


def heldout_examples(per_family, seed, family=None):
    """per_family distinct held-out questions of each family (or of one), in a fixed order."""
    rng = random.Random(seed ^ 0x5EED)
    out = []
    for fam in [family] if family else FAMILIES:
        seen = set()
        tries = 0
        while len(seen) < per_family and tries < 200 * per_family:
            tries += 1
            key, q, s, a = make(fam, rng)
            if not is_heldout(key) or key in seen:
                continue
            seen.add(key)
            out.append({"family": fam, "key": key, "prompt": prompt(q), "completion": completion(s, a),
                        "answer": a})
    return out


def mul2x2_heldout(n, seed):
    """n held-out 2-digit x 2-digit multiplications (the issue's acceptance set)."""
    rng = random.Random(seed ^ 0x2222)
    out, seen = [], set()
    while len(out) < n:
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        key = f"mul:{a}:{b}"
        if not is_heldout(key) or key in seen:
            continue
        seen.add(key)
        out.append({"family": "mul2x2", "key": key, "prompt": prompt(f"What is {a} x {b}?"),
                    "completion": completion(_mul_steps(a, b), str(a * b)), "answer": str(a * b)})
    return out


def answer_of(text):
    """The answer in a generated completion: after </think>, up to <|im_end|>."""
    if "</think>" not in text:
        return None
    return text.split("</think>", 1)[1].split("<|im_end|>", 1)[0].strip()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    for e in train_examples(n, 1):
        print(json.dumps(e))
