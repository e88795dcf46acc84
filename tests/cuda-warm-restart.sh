#!/bin/sh
# Warm restart on the GPU's expert slots (needs a GPU): siliceod on the CUDA backend with the
# routed experts forced into 64 slots (SIL_CUDA_SLOTS, one global pool) of a generated 4 x 64
# expert model; a cold daemon answers a greedy turn, SIGTERM saves the heat map, the next start
# copies the hottest experts into the slots before it is ready; its first turn gives the same
# tokens and hits at least as often as the cold one (figures printed).
# usage: tests/cuda-warm-restart.sh BUILD_DIR
set -eu
b=$1
d=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; rm -rf "$d"' EXIT
"$b/bin/sil-mkmodel" --preset tiny --experts 64 --experts-used 4 --skew 1.0 --quiet \
    --out "$d/moe.gguf" >/dev/null 2>&1
printf 'threads = 2\nheat_save_interval = 0\n' >"$d/c.conf"
export SILICEO_SOCKET="$d/s.sock" PYTHONPATH="$(dirname "$0")/integration" SIL_CUDA_SLOTS=64
start() {
    "$b/bin/siliceod" --config "$d/c.conf" --model "$d/moe.gguf" --backend cuda \
        --state-dir "$d/state" >>"$d/daemon.log" 2>&1 &
    pid=$!
    python3 -c "import siltest,sys; sys.exit(0 if siltest.wait_socket('$d/s.sock', 60) else 1)" ||
        { cat "$d/daemon.log"; exit 1; }
}
stop() { kill -TERM "$pid"; wait "$pid"; pid=; }
turn() { # phase
    python3 - "$1" "$d/figs.json" <<'PY'
import json, os, sys
from siltest import Client, check
phase, figs = sys.argv[1], sys.argv[2]
c = Client()
st, _ = c.ok("status")
ec, hm = st["expert_cache"], st["heat_map"]
check(st["backend"] == "cuda" and ec is not None and ec["mode"] == "device" and ec["slots"] == 64,
      "%s: the expert cache is the device's 64 slots" % phase)
r, _ = c.ok("generate", {"prompt": "Hello there, how are you today?", "max_tokens": 48,
                         "temperature": 0, "grace_tokens": 0})
e1, _ = c.ok("status")
e1 = e1["expert_cache"]
rate = (e1["hits"] - ec["hits"]) / (e1["lookups"] - ec["lookups"])
f = json.load(open(figs)) if os.path.exists(figs) else {}
if phase == "cold":
    check(hm["loaded"] == "none" and ec["preloaded"] == 0, "cold: nothing preloaded")
else:
    check(hm["loaded"] == "loaded" and 0 < ec["preloaded"] <= 64 and
          ec["preloaded"] == min(64, hm["hot_experts"]),
          "restart: %d hot experts, %d copied into the slots" % (hm["hot_experts"], ec["preloaded"]))
    check(r["tokens"] == f["cold"]["tokens"], "restart: the same tokens as the cold turn")
    check(rate >= f["cold"]["rate"], "restart: hit rate %.4f >= cold %.4f" % (rate, f["cold"]["rate"]))
f[phase] = {"tokens": r["tokens"], "rate": rate}
json.dump(f, open(figs, "w"))
print("figure: %s first turn on the GPU slots: hit rate %.4f" % (phase, rate))
PY
}
start
turn cold
stop
[ -s "$d/state/expert-heat" ] || { echo "FAIL: no heat file"; exit 1; }
start
grep -q "expert heat map loaded" "$d/daemon.log" || { cat "$d/daemon.log"; exit 1; }
turn restart
stop
grep "expert cache\|heat map" "$d/daemon.log"
echo "ok: warm restart on the GPU's expert slots"
