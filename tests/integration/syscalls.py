"""Which syscalls of an strace log a unit's SystemCallFilter= lines refuse.
usage: syscalls.py UNIT STRACE_LOG; prints the refused ones, exits 1 if any."""
import re
import subprocess
import sys

groups, cur = {}, None
for line in subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True,
                           text=True, check=True).stdout.splitlines():
    s = line.strip()
    if line.startswith("@"):  # a group's own line; its members are indented (some are groups)
        cur = groups.setdefault(s.split()[0], [])
    elif cur is not None and s and not s.startswith("#"):
        cur.append(s.split()[0])


def expand(names, seen=None):
    seen = set() if seen is None else seen
    out = set()
    for n in names:
        if n.startswith("@"):
            if n not in seen:
                seen.add(n)
                out |= expand(groups.get(n, []), seen)
        else:
            out.add(n)
    return out


allow, deny = None, set()
for line in open(sys.argv[1]):
    m = re.match(r"SystemCallFilter=(~?)(.*)", line.strip())
    if not m:
        continue
    names = expand(m.group(2).split())
    if m.group(1):
        deny |= names
    else:
        allow = names if allow is None else allow | names
used = set()
for line in open(sys.argv[2]):
    m = re.match(r"(?:\d+\s+)?([a-z_0-9]+)\(", line)
    if m:
        used.add(m.group(1))
# execve is the service manager's, before the filter applies to the program.
refused = sorted(s for s in used - {"execve"} if (allow is not None and s not in allow) or s in deny)
print(" ".join(refused))
print(f"{len(used)} syscalls used, {len(refused)} refused", file=sys.stderr)
sys.exit(1 if refused else 0)
