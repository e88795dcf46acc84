#!/usr/bin/env bash
# Dequant+dot throughput per core (GB/s of weights) for the quantized formats, next to the
# machine's read bandwidth. Writes bench/results/quant-<machine>-<yyyymmdd>.json (BENCH.md).
#
#   bench/run-quant.sh [--machine NAME] [sil-qbench options: --mib N --runs N --n ROWLEN --types ...]
# Environment: B (build dir, default build); NO_BUILD=1 runs an already built $B/bin/sil-qbench
# (e.g. one copied to a machine without the build dependencies).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
machine=$(hostname -s)
if [ "${1:-}" = "--machine" ]; then
    machine=$2
    shift 2
fi
[ "${NO_BUILD:-0}" = 1 ] || make -s B="$B" "$B/bin/sil-qbench" >/dev/null
out=bench/results/quant-$machine-$(date -u +%Y%m%d).json
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
"$B/bin/sil-qbench" "$@" >"$tmp"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

python3 - "$tmp" "$out" "bench/run-quant.sh $*" "$load_before" "$load_after" <<'EOF'
import json, os, subprocess, sys, datetime
lines, out, command = sys.argv[1], sys.argv[2], sys.argv[3].strip()
load_before, load_after = sys.argv[4], sys.argv[5]
results = [json.loads(l) for l in open(lines) if l.strip()]
def sh(c):
    try:
        return subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""
cpu = ""
for l in open("/proc/cpuinfo"):
    if l.startswith("model name"):
        cpu = l.split(":", 1)[1].strip()
        break
ram = 0
for l in open("/proc/meminfo"):
    if l.startswith("MemTotal"):
        ram = round(int(l.split()[1]) / 1048576, 1)
doc = {
    "benchmark": "quant",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commit": sh("git rev-parse --short HEAD"),
    "command": command,
    "machine": {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": ram},
    "results": results,
    "notes": ("Single-thread vec_dot (dequantize + dot product fused, activations quantized once "
              "to the type's vec_dot_type and cache-resident) over a weight buffer larger than the "
              "last-level cache; value = GB/s of weight bytes, median of runs. floor = single-thread "
              "streaming read bandwidth measured in the same run (the most a memory-bound kernel "
              "can reach). vec_dot_hot_gb_s = the same kernel over a 1 MiB L2-resident slice "
              "(compute-bound rate). read_bw_gb_s with 1 and 2 threads. avx512 without VNNI "
              "is not listed where the CPU has VNNI (it runs the AVX2 kernels). No peer measured. "
              "Load average (1/5/15 min) before: %s, after: %s (%d CPUs)."
              % (load_before, load_after, os.cpu_count())),
}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print(out)
EOF
