#!/usr/bin/env bash
# Warm restart of the expert cache, simulated on the CPU (no GPU slots yet): the hit rate of the
# first turn after a restart (the heat map saved at SIGTERM, its hottest experts preloaded at
# start) against the same turn on a cold daemon and on a warm one (same history, no restart).
# Model: sil-mkmodel's narrow 40-layer, 256-expert, top-8 shape (run-cachesim.sh's), at --skew 0
# and $SKEW; cache: $SLOTS slots (27% of the 10240 experts), each policy in $POLICIES.
# Turns: greedy generate on three texts from the man pages, P1 P2 P3, in two shapes: prefill-heavy
# (900 bytes, 32 tokens generated) and decode-heavy (150 bytes, $GEN tokens):
#   cold:    fresh daemon, P1                  (the cold first turn)
#   warm:    the same daemon, P2 then P3       (P3: a warm turn)
#   restart: SIGTERM, start again, P3          (the first turn after a restart)
#   cold P3: fresh daemon, P3                  (the same turn cold)
# Each turn's hit rate = hits / lookups of the daemon's status counters across the request
# (prefill and decode together, as served).
#
# usage: bench/run-warm-restart.sh
# Environment: B (build dir, default build), MACHINE (default vm), SKEW (default 0.457),
#              SLOTS (default 2765), POLICIES (default "lfu lru heat"), GEN (default 160),
#              THREADS (default 2), OUT (default bench/results/warm-restart-<machine>-<date>.json)
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
MACHINE=${MACHINE:-vm}
SKEW=${SKEW:-0.457}
SLOTS=${SLOTS:-2765}
POLICIES=${POLICIES:-lfu lru heat}
GEN=${GEN:-160}
THREADS=${THREADS:-2}
OUT=${OUT:-bench/results/warm-restart-$MACHINE-$(date -u +%Y%m%d).json}

make -s B="$B" "$B/bin/siliceod" "$B/bin/sil-mkmodel" >&2
tmp=$(mktemp -d)
DPID=
cleanup() {
    if [ -n "$DPID" ]; then kill -KILL "$DPID" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
export SILICEO_SOCKET=$tmp/s.sock PYTHONPATH=$PWD/tests/integration
texts() { # bytes
    head -c 1000 man/siliceod.8 | tail -c "$1" > "$tmp/p1.txt"
    head -c 1900 man/siliceod.conf.5 | tail -c "$1" > "$tmp/p2.txt"
    head -c 2900 man/siliceo-rpc.7 | tail -c "$1" > "$tmp/p3.txt"
}

start() { # state-dir policy
    printf 'threads = %s\necache_slots = %s\necache_policy = %s\nheat_save_interval = 0\n' \
        "$THREADS" "$SLOTS" "$2" > "$tmp/c.conf"
    "$B/bin/siliceod" --config "$tmp/c.conf" --model "$tmp/m.gguf" --state-dir "$1" \
        >>"$tmp/d.log" 2>&1 &
    DPID=$!
    python3 -c "import siltest,sys; sys.exit(0 if siltest.wait_socket('$SILICEO_SOCKET', 60) else 1)"
}
stop() {
    kill -TERM "$DPID"
    wait "$DPID"
    DPID=
}
turns() { # label-prefix skew policy prompt-files...: one JSON line per turn
    local label=$1 skew=$2 pol=$3
    shift 3
    python3 - "$label" "$skew" "$pol" "$gen" "$@" >>"$tmp/rows.jsonl" <<'PY'
import json, sys
from siltest import Client
label, skew, pol, gen = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])
c = Client(timeout=600)
def ec():
    st, _ = c.ok("status")
    return st["expert_cache"], st["heat_map"]
for i, path in enumerate(sys.argv[5:]):
    e0, hm = ec()
    r, _ = c.ok("generate", {"prompt": open(path).read(), "max_tokens": gen, "temperature": 0,
                             "grace_tokens": 0})
    e1, _ = ec()
    look = e1["lookups"] - e0["lookups"]
    row = {"turn": "%s %s" % (label, path.rsplit("/", 1)[1][:2].upper()), "skew": skew,
           "policy": pol, "slots": e1["slots"], "n_prompt": r["n_prompt"],
           "n_generated": r["n_generated"], "lookups": look,
           "hit_rate": (e1["hits"] - e0["hits"]) / look,
           "bytes_streamed": e1["bytes_streamed"] - e0["bytes_streamed"],
           "preloaded": hm["preloaded"], "heat_loaded": hm["loaded"]}
    print(json.dumps(row))
    print("%-18s skew %-5g %-5s gen %-4d hit rate %.4f (%d lookups, prompt %d, gen %d, preloaded %d)"
          % (row["turn"], skew, pol, gen, row["hit_rate"], look, r["n_prompt"], r["n_generated"],
             hm["preloaded"]), file=sys.stderr)
PY
}

for skew in 0 "$SKEW"; do
    "$B/bin/sil-mkmodel" --preset tiny --layers 40 --embd 256 --experts 256 --experts-used 8 \
        --expert-ffn 32 --shared-ffn 32 --vocab 1024 --type q8_0 --skew "$skew" --quiet \
        --out "$tmp/m.gguf" >/dev/null 2>&1
    for shape in "900 32" "150 $GEN"; do
        read -r plen gen <<<"$shape"
        texts "$plen"
        for pol in $POLICIES; do
            rm -rf "$tmp/st" "$tmp/st0"
            start "$tmp/st" "$pol"
            turns cold "$skew" "$pol" "$tmp/p1.txt"
            turns warm "$skew" "$pol" "$tmp/p2.txt" "$tmp/p3.txt"
            stop
            start "$tmp/st" "$pol"
            turns "restart first" "$skew" "$pol" "$tmp/p3.txt"
            stop
            start "$tmp/st0" "$pol"
            turns cold "$skew" "$pol" "$tmp/p3.txt"
            stop
        done
    done
done

python3 - "$tmp/rows.jsonl" "$OUT" "$(git rev-parse --short HEAD)" "$MACHINE" <<'PY'
import json, os, sys, time
rows = [json.loads(l) for l in open(sys.argv[1])]
out = {"benchmark": "warm-restart", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "commit": sys.argv[3], "machine": sys.argv[4], "cpus": os.cpu_count(),
       "mode": "simulated on the CPU (no GPU slots: hit rates of a cache of that size, no timing)",
       "model": "sil-mkmodel --preset tiny --layers 40 --embd 256 --experts 256 --experts-used 8 "
                "--expert-ffn 32 --shared-ffn 32 --vocab 1024 --type q8_0 --skew S",
       "turns": "greedy generate; P1, P2, P3 = texts of siliceod.8, siliceod.conf.5, "
                "siliceo-rpc.7 (900 bytes with 32 tokens generated: prefill-heavy; 150 bytes "
                "with GEN: decode-heavy); hit rate over the request (prefill + decode)",
       "results": rows}
with open(sys.argv[2], "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
print("results written to", sys.argv[2])
PY
