#!/bin/bash
# Two builds' logits compared bit for bit: the proof that a change which should not change the
# numbers (a refactor of a backend) did not. For every reference model, every prompt of its JSON
# and every mode given, both builds' sil-eval print the logits of every prompt position and of
# n greedy steps (--logits all --n-predict N --json); the two outputs must be equal, byte for
# byte in their logits and greedy tokens.
#
# usage: bench/ab-logits.sh NEW_SIL_EVAL BASE_SIL_EVAL MODELS_DIR MODE...
#   MODE: a name, then '=' and the arguments and environment for both builds, each separated
#         by ':'; an argument of the form NAME=VALUE is set in the environment instead; an
#         argument starting with new% or base% goes to that build alone. Examples:
#           cpu=--backend:cpu:--threads:2
#           exact=--backend:cpu:--exact
#           cuda=--backend:cuda
#           eager=--backend:cuda:new%--cuda-graphs:new%off:base%SIL_CUDA_GRAPHS=0
#           slots=--backend:cuda:SIL_CUDA_SLOTS=16
# Environment: N (greedy steps, default 8), PROMPTS (default "A B C D"), KEEP (keep the outputs
# here; default a temporary directory, removed), MOE_ONLY_MODES (modes run on MoE models only,
# e.g. "slots": a dense model has no experts to put in slots).
# Prints one line per run and a summary; exit 1 if any pair differs or a run failed.
set -u
[ $# -ge 4 ] || { sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 2; }
new=$1 base=$2 dir=$3
shift 3
N=${N:-8}
PROMPTS=${PROMPTS:-A B C D}
MOE_ONLY_MODES=${MOE_ONLY_MODES:-}
tmp=${KEEP:-}
[ -n "$tmp" ] && mkdir -p "$tmp" || { tmp=$(mktemp -d) && trap 'rm -rf "$tmp"' EXIT; }
runs=0 same=0 bad=0

# run_one BUILD(new|base) BIN SPEC OUTFILE ARGS...
run_one() {
    local which=$1 bin=$2 spec=$3 out=$4
    shift 4
    local -a env=() args=()
    local IFS=':'
    for a in $spec; do
        case $a in
            new%*) [ "$which" = new ] || continue; a=${a#new%} ;;
            base%*) [ "$which" = base ] || continue; a=${a#base%} ;;
        esac
        if [[ $a =~ ^[A-Z_][A-Z0-9_]*= ]]; then env+=("$a"); else args+=("$a"); fi
    done
    unset IFS
    env "${env[@]}" "$bin" "$@" "${args[@]}" > "$out" 2> "$out.err"
}

for json in "$dir"/*.json; do
    gguf=${json%.json}.gguf
    [ -f "$gguf" ] || continue
    m=$(basename "$gguf" .gguf)
    moe=$(python3 -c "import json,sys; print(1 if 'moe' in json.load(open(sys.argv[1]))['arch'] else 0)" "$json")
    for p in $PROMPTS; do
        ids=$(python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['prompts'][sys.argv[2]]['ids'])))" "$json" "$p" 2>/dev/null) || continue
        for mode in "$@"; do
            name=${mode%%=*} spec=${mode#*=}
            [ "$name" = "$mode" ] && spec=
            if [ "$moe" = 0 ] && [[ " $MOE_ONLY_MODES " == *" $name "* ]]; then continue; fi
            runs=$((runs + 1))
            o=$tmp/$m.$p.$name
            common=(--model "$gguf" --tokens "$ids" --n-predict "$N" --logits all --json)
            run_one new "$new" "$spec" "$o.new" "${common[@]}"; rn=$?
            run_one base "$base" "$spec" "$o.base" "${common[@]}"; rb=$?
            if [ $rn -ne 0 ] || [ $rb -ne 0 ]; then
                echo "FAIL $m $p $name: rc new $rn base $rb: $(tail -1 "$o.new.err") | $(tail -1 "$o.base.err")"
                bad=$((bad + 1))
                continue
            fi
            r=$(python3 - "$o.new" "$o.base" <<'PY'
import json, sys
def load(f):
    t = open(f).read()
    d = json.loads(t[t.index('{'):])
    return d.get("logits"), d.get("greedy")
(ln, gn), (lb, gb) = load(sys.argv[1]), load(sys.argv[2])
if not ln:
    print("no logits"); sys.exit()
if ln == lb and gn == gb:
    n = sum(len(r) if isinstance(r, list) else 1 for r in ln)
    print(f"same {n}")
else:
    import itertools
    fl = lambda l: [x for r in l for x in (r if isinstance(r, list) else [r])]
    a, b = fl(ln), fl(lb or [])
    d = max((abs(x - y) for x, y in zip(a, b)), default=float("nan"))
    print(f"differ: max |diff| {d:.3g} over {min(len(a), len(b))} values, greedy {'same' if gn == gb else 'differs'}")
PY
)
            case $r in
                same*) same=$((same + 1)); echo "ok   $m $p $name: ${r#same } logits identical, greedy identical" ;;
                *) bad=$((bad + 1)); echo "FAIL $m $p $name: $r" ;;
            esac
        done
    done
done
echo "ab-logits: $runs runs, $same identical, $bad differ or failed"
[ $runs -gt 0 ] && [ $bad -eq 0 ]
