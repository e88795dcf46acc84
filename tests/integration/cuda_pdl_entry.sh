#!/usr/bin/env bash
# Every CUDA kernel starts with SIL_PDL_ENTRY() (kernels/cuda/pdl.cuh): the backend launches
# kernels so that the next one may start early, and a kernel that touched memory before that
# wait would race with the one before it. Checks the sources, so it needs no GPU; also checks
# that it finds the kernels (a parser that saw none would pass anything).
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

bad, n = [], 0
for path in sys.argv[1:]:
    s = open(path).read()
    # macro bodies: drop the line continuations so a kernel inside a #define reads as code
    s = s.replace("\\\n", "\n")
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
        if not body.startswith("SIL_PDL_ENTRY();"):
            bad.append("%s: %s" % (path, name))
if n < 20:
    sys.exit("found only %d kernels: the check is broken" % n)
if bad:
    sys.exit("kernels that do not start with SIL_PDL_ENTRY():\n  " + "\n  ".join(bad))
print("%d kernels, each starts with SIL_PDL_ENTRY()" % n)
PY
