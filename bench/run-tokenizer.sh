#!/usr/bin/env bash
# Tokenizer throughput, one thread, on ~10 MB of generated mixed text (English, Italian, Chinese,
# code, whitespace runs; same bytes on every run), next to llama.cpp's llama-tokenize on the
# same text and vocab in the same run. Writes bench/results/tokenizer-<machine>-<date>.json.
#
#   bench/run-tokenizer.sh [--peer PATH/llama-tokenize] [--model VOCAB.gguf] [--runs N] [--mb N]
#
# Environment: B (build dir, default build), SHARED (default ../shared), PEER_TOKENIZE (same as
# --peer). Without a peer the peer figures are left out and the notes say so.
# Two figures: "in process" (sil-tokbench: vocab loaded once, encode timed alone) and "CLI"
# (whole-process wall time of `sil-eval --tokenize-file` and `llama-tokenize -f` on the text
# minus the same on an empty file, i.e. load time removed, printing of the ids included for both).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
SHARED=${SHARED:-$(cd .. && pwd)/shared}
peer=${PEER_TOKENIZE:-}
model=$SHARED/refdata/tokenizer/qwen3-vocab.gguf
runs=5
mb=10
while [ $# -gt 0 ]; do
    case $1 in
    --peer) peer=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --mb) mb=$2; shift 2 ;;
    -h | --help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "run-tokenizer.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
for b in "$B/bin/sil-tokbench" "$B/bin/sil-eval"; do
    [ -x "$b" ] || { echo "run-tokenizer.sh: $b missing (make B=$B)" >&2; exit 1; }
done
[ -f "$model" ] || { echo "run-tokenizer.sh: $model missing" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
text=$tmp/mixed.txt
: >"$tmp/empty.txt"

# Deterministic text: a fixed LCG picks pieces, so the bytes never depend on a library's RNG.
python3 - "$text" "$mb" <<'EOF'
import sys
out, mb = sys.argv[1], int(sys.argv[2])
pieces = [
    "The quick brown fox jumps over the lazy dog. ",
    "Tokenization throughput is measured on one thread, ",
    "and every figure is reported next to its peer. ",
    "Il gatto dorme sulla sedia perché fuori piove; ",
    "la città è più bella quando c'è il sole. ",
    "我们今天去公园散步，天气很好。",
    "机器学习模型需要大量的数据。",
    "static int add(int a, int b)\n{\n    return a + b;\n}\n",
    "for (size_t i = 0; i < n; i++) {\n\tsum += x[i] * 0.5f;\n}\n",
    "def f(x):\n    if x > 10:\n        return [i ** 2 for i in range(x)]\n",
    "        \n\n    \t  ",
    "                                ",
    "1234567890 3.14159 2026-11-30 ",
    "I'm sure they'll say it's fine, WE'LL see. ",
]
state = 20261130
buf = []
size = 0
target = mb * 1000 * 1000
while size < target:
    state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
    p = pieces[(state >> 33) % len(pieces)]
    buf.append(p)
    size += len(p.encode())
open(out, "wb").write("".join(buf).encode())
EOF
bytes=$(stat -c %s "$text")

# wall seconds of a command, stdout to a file
wall() { local o=$1; shift; local t0 t1; t0=$(date +%s.%N); "$@" >"$o" 2>/dev/null; t1=$(date +%s.%N); echo "$t1 - $t0" | bc -l; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "text: $bytes bytes; in process (sil-tokbench, $runs runs)..." >&2
inproc=$("$B/bin/sil-tokbench" --model "$model" --text "$text" --runs "$runs" --ids-out "$tmp/sil.ids")

cli_runs() { # name, command prefix... (text file appended)
    local name=$1; shift
    local te=() tt=()
    for _ in $(seq "$runs"); do
        te+=("$(wall "$tmp/$name.empty.out" "$@" "$tmp/empty.txt")")
        tt+=("$(wall "$tmp/$name.out" "$@" "$text")")
    done
    echo "$(median "${te[@]}") $(median "${tt[@]}") $(printf '%s\n' "${tt[@]}" | sort -g | head -1) $(printf '%s\n' "${tt[@]}" | sort -g | tail -1)"
}
echo "CLI sil-eval..." >&2
sil_cli=$(cli_runs sil "$B/bin/sil-eval" --model "$model" --tokenize-file)
tr ' ' '\n' <"$tmp/sil.out" | grep -v '^$' >"$tmp/sil-cli.ids"
cmp -s "$tmp/sil-cli.ids" "$tmp/sil.ids" || { echo "run-tokenizer.sh: sil-eval and sil-tokbench ids differ" >&2; exit 1; }

peer_cli="" peer_desc="" same_ids=null
if [ -n "$peer" ] && [ -x "$peer" ]; then
    echo "CLI peer $peer..." >&2
    peer_cli=$(cli_runs peer "$peer" -m "$model" --ids --log-disable --no-escape --no-parse-special --no-bos -f)
    tr -d '[] ' <"$tmp/peer.out" | tr ',' '\n' | grep -v '^$' >"$tmp/peer.ids"
    if cmp -s "$tmp/peer.ids" "$tmp/sil.ids"; then same_ids=true; else same_ids=false; fi
    rev=$(git -C "$(dirname "$peer")" rev-parse --short=9 HEAD 2>/dev/null || echo unknown)
    peer_desc="llama.cpp $rev llama-tokenize"
fi

load_avg=$(cut -d' ' -f1-3 /proc/loadavg)
machine_cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
host=$(hostname -s 2>/dev/null || echo host)
out=bench/results/tokenizer-$host-$(date -u +%Y%m%d).json
mkdir -p bench/results
python3 - "$out" "$inproc" "$sil_cli" "$peer_cli" "$peer_desc" "$same_ids" "$bytes" "$runs" \
    "$model" "$machine_cpu" "$load_avg" "${peer:+--peer <llama-tokenize> }--runs $runs --mb $mb" <<'EOF'
import json, os, subprocess, sys, datetime
out, inproc, sil_cli, peer_cli, peer_desc, same, nbytes, runs, model, cpu, load_avg, args = sys.argv[1:]
ip = json.loads(inproc)
nbytes, runs = int(nbytes), int(runs)
def cli(s):
    e, t, lo, hi = map(float, s.split())
    mbs = lambda x: round(nbytes / 1e6 / max(x - e, 1e-9), 2)
    return mbs(t), mbs(hi), mbs(lo), e
commit = subprocess.run(["git", "rev-parse", "--short=9", "HEAD"], capture_output=True, text=True).stdout.strip()
ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
sv, smin, smax, sload = cli(sil_cli)
cli_res = {"metric": "tokenize_cli_mb_s", "config": "qwen3 vocab, whole process minus load, ids printed",
           "value": sv, "unit": "MB/s", "runs": runs, "min": smin, "max": smax}
notes = ("In process: sil-tokbench encodes the text %d times with the vocab loaded once (median). "
         "CLI: median wall time of the program on the text minus its median on an empty file "
         "(load: sil-eval %.3f s" % (runs, sload))
if peer_cli:
    pv, pmin, pmax, pload = cli(peer_cli)
    cli_res.update({"peer": peer_desc + " --ids --no-escape --no-parse-special --no-bos", "peer_value": pv})
    notes += ", llama-tokenize %.3f s); both print every id. Same ids from both: %s. " % (pload, same)
    notes += "llama.cpp has no in-process tokenizer benchmark, so the in-process figure has no peer. "
else:
    notes += "); no peer binary given (--peer), so no peer figures. "
notes += "Load average at the end of the run: %s (other work shares this machine). " % load_avg
notes += ("No hardware floor is given: tokenization is compute-bound per byte, and reading 10 MB "
          "from memory takes well under a millisecond.")
res = {
    "benchmark": "tokenizer",
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "commit": commit,
    "command": "bench/run-tokenizer.sh " + args,
    "machine": {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(ram, 1)},
    "model": {"file": os.path.basename(model), "bytes": os.path.getsize(model)},
    "text": {"bytes": nbytes, "tokens": ip["tokens"], "made_by": "bench/run-tokenizer.sh (fixed LCG over English, Italian, Chinese, C, Python, whitespace and digit pieces)"},
    "results": [
        {"metric": "tokenize_mb_s", "config": "qwen3 vocab, in process, one thread",
         "value": ip["median_mb_s"], "unit": "MB/s", "runs": runs, "min": ip["min_mb_s"], "max": ip["max_mb_s"]},
        cli_res,
        {"metric": "vocab_load_s", "config": "qwen3 vocab (151,936 tokens, 151,387 merges)",
         "value": ip["load_s"], "unit": "s", "runs": 1},
    ],
    "notes": notes,
}
json.dump(res, open(out, "w"), indent=2)
print(json.dumps(res, indent=2))
EOF
echo "wrote $out" >&2
