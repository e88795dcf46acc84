#!/usr/bin/env bash
# Every CUDA kernel starts with SIL_PDL_ENTRY() (kernels/cuda/pdl.cuh): the backend launches
# kernels so that the next one may start early, and a kernel that touched memory before that
# wait would race with the one before it. Before it a kernel may only ask L2 for memory it will
# read (pdl.cuh's sil_l2_prefetch): statements that are a call of a function named *prefetch*,
# alone or under "if (threadIdx.x == 0)", where that function (found in the sources) writes no
# memory: no store through an index or a pointer, no atomic. Checks the sources, so it needs no
# GPU; also checks that it finds the kernels and the prefetch helpers (a parser that saw none
# would pass anything).
set -euo pipefail
cd "$(dirname "$0")/../.."
/usr/bin/python3 - kernels/cuda/*.cu kernels/cuda/*.cuh <<'PY'
import re, sys

def matching(s, i, o, c):
    """Index of the bracket closing the one at s[i]."""
    d = 0
    for j in range(i, len(s)):
        if s[j] == o:
            d += 1
        elif s[j] == c:
            d -= 1
            if d == 0:
                return j
    raise SystemExit("unbalanced %s%s" % (o, c))

PREFIX = re.compile(r"(if \(threadIdx\.x == 0\)\s*)?(\w*prefetch\w*)\s*(<[^;{}]*?>)?\s*\(")
STORE = re.compile(r"\]\s*(=[^=]|[-+*/|&^]=)|^\s*\*[\w(]|atomic|\bst\.|red\.", re.M)

def prefix_calls(body):
    """The prefetch helpers called before SIL_PDL_ENTRY(), or None where anything else is."""
    called = []
    while not body.startswith("SIL_PDL_ENTRY();"):
        m = PREFIX.match(body)
        if not m:
            return None
        q = matching(body, m.end() - 1, "(", ")")
        rest = body[q + 1:].lstrip()
        if not rest.startswith(";"):
            return None
        called.append(m.group(2))
        body = rest[1:].lstrip()
    return called

srcs = {}
for path in sys.argv[1:]:
    # macro bodies: drop the line continuations so a kernel inside a #define reads as code
    srcs[path] = open(path).read().replace("\\\n", "\n")

# the prefetch helpers' bodies: __device__ functions named *prefetch*
helpers = {}
for path, s in srcs.items():
    for m in re.finditer(r"__device__[^;{}]*?\b(\w*prefetch\w*)\s*\(", s):
        q = matching(s, m.end() - 1, "(", ")")
        b = s.find("{", q)
        if b < 0 or s[q + 1:b].strip():
            continue
        helpers[m.group(1)] = s[b:matching(s, b, "{", "}") + 1]

bad, n, used = [], 0, set()
for path, s in srcs.items():
    for m in re.finditer(r"__global__", s):
        i = m.end()
        lb = s.find("__launch_bounds__", i, i + 40)
        if lb >= 0:
            i = matching(s, s.index("(", lb), "(", ")") + 1
        p = s.index("(", i)
        name = s[i:p].split()[-1]
        q = matching(s, p, "(", ")")
        b = s.index("{", q)
        body = s[b + 1:].lstrip()
        n += 1
        calls = prefix_calls(body)
        if calls is None:
            bad.append("%s: %s" % (path, name))
        for c in calls or []:
            used.add(c)
            if c not in helpers:
                bad.append("%s: %s calls %s, not a prefetch helper found" % (path, name, c))
            elif STORE.search(re.sub(r"//[^\n]*", "", helpers[c])):
                bad.append("%s: %s calls %s, which stores" % (path, name, c))
if n < 20:
    sys.exit("found only %d kernels: the check is broken" % n)
if len(helpers) < 3 or not used:
    sys.exit("found %d prefetch helpers, %d used: the check is broken" % (len(helpers), len(used)))
if bad:
    sys.exit("kernels that do not start with SIL_PDL_ENTRY():\n  " + "\n  ".join(bad))
print("%d kernels, each starts with SIL_PDL_ENTRY() (%d helpers before it, none storing)"
      % (n, len(used)))
PY
