#!/usr/bin/env bash
# make demo: siliceod on the shipped trained model (models/, see models/README.md) on a private
# socket, sil-probe's summary, one question streamed with its reasoning, then questions of every
# task family, each answer printed next to the right one, then one question under a thinking
# budget so small that the daemon forces the close token; a clean stop (SIGTERM, status checked).
# make demo-random (contrib/demo.sh --random): the random-weight benchmark-shape model instead
# (made once by sil-mkmodel into state/), one streamed question: real engine, noise for text.
# The daemon keeps its state (the expert heat map, one file per model, and saved sessions) in a
# directory of the demo's own, $B/demo-state (DEMO_STATE_DIR names another), never the system
# daemon's or the user's: run as root it would otherwise be /var/lib/siliceo.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
BIN=$B/bin
STATE=${SILICEO_STATE_DIR:-state}
RANDOM_MODEL=0
[ "${1:-}" = --random ] && RANDOM_MODEL=1

for b in siliceod sil-chat sil-probe sil-mkmodel; do
    [ -x "$BIN/$b" ] || { echo "demo: $BIN/$b is missing; run 'make all' first" >&2; exit 1; }
done
if [ "$RANDOM_MODEL" = 1 ]; then
    MODEL=$STATE/demo.gguf
    mkdir -p "$STATE"
    if [ ! -f "$MODEL" ]; then
        echo "demo: making the random-weight model $MODEL (once)"
        "$BIN/sil-mkmodel" --preset demo --out "$MODEL.tmp"
        mv "$MODEL.tmp" "$MODEL"
    fi
else
    MODEL=${DEMO_MODEL:-models/siliceo-demo-qwen35moe-Q8_0.gguf}
    [ -f "$MODEL" ] || { echo "demo: $MODEL is missing" >&2; exit 1; }
fi

DSTATE=${DEMO_STATE_DIR:-$B/demo-state}

RUN=$(mktemp -d /tmp/siliceo-demo.XXXXXX)
export SILICEO_SOCKET=$RUN/siliceod.sock
DPID=
cleanup() {
    if [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; then kill -TERM "$DPID"; wait "$DPID" || true; fi
    rm -rf "$RUN"
}
trap cleanup EXIT

echo "demo: starting siliceod on $MODEL ($SILICEO_SOCKET, state in $DSTATE)"
: >"$RUN/siliceod.conf"
"$BIN/siliceod" --config "$RUN/siliceod.conf" --model "$MODEL" --socket "$SILICEO_SOCKET" \
    --state-dir "$DSTATE" --log-level notice &
DPID=$!
for _ in $(seq 600); do
    if "$BIN/sil-probe" --timeout 2 >/dev/null 2>&1; then break; fi
    kill -0 "$DPID" 2>/dev/null || { echo "demo: siliceod exited during start-up" >&2; DPID=; exit 1; }
    sleep 0.2
done

echo; echo "demo: sil-probe"
"$BIN/sil-probe" || true

if [ "$RANDOM_MODEL" = 1 ]; then
    QUESTION=${DEMO_QUESTION:-"What is a mixture-of-experts model? Answer in two sentences."}
    echo; echo "demo: sil-chat \"$QUESTION\" (random weights: the text is noise)"
    "$BIN/sil-chat" --max-tokens 96 --no-think "$QUESTION"
    echo
else
    echo; echo "demo: sil-chat --show-reasoning \"What is 17 x 23?\" (streamed: reasoning, then the answer)"
    "$BIN/sil-chat" --show-reasoning -t 0 "What is 17 x 23?"
    echo
    # question|right answer; held-out questions (never in the training data) of each family
    echo "demo: one question of each task family (greedy, thinking on)"
    wrong=0
    while IFS='|' read -r q want; do
        got=$("$BIN/sil-chat" --json -t 0 -n 96 "$q" |
            python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["text"].strip()); print(r["reasoning"])')
        answer=${got%%$'\n'*}
        reasoning=${got#*$'\n'}
        mark=ok
        [ "$answer" = "$want" ] || { mark=WRONG; wrong=$((wrong + 1)); }
        printf '  %-54s -> %-14s right: %-14s %s\n' "$q" "$answer" "$want" "$mark"
        printf '  %-54s    (thought: %s)\n' "" "$reasoning"
    done <<'EOF'
What is 17 x 23?|391
What is 487 + 356?|843
Which is the largest: 30, 29, 27, 13?|30
Sort these numbers from small to large: 44, 64, 29, 7|7, 29, 44, 64
Count the letter r in occurrence.|2
Convert 94 hours to minutes.|5640
EOF
    echo "demo: $((6 - wrong))/6 right"
    echo
    echo "demo: the thinking budget: sil-chat --max-thinking-tokens 4 \"What is 17 x 23?\""
    "$BIN/sil-chat" --json -t 0 -n 96 --max-thinking-tokens 4 "What is 17 x 23?" | python3 -c '
import json, sys
r = json.load(sys.stdin)
n, why, ans = r["n_reasoning"], r["reasoning"], r["text"].strip()
print(f"  reasoning cut after {n} tokens: {why!r}; the daemon wrote the close token, and the")
print(f"  answer, without its worked steps, is {ans!r} (right: 391)")'
fi
echo
echo "demo: stopping siliceod (SIGTERM)"
kill -TERM "$DPID"
rc=0
wait "$DPID" || rc=$?
DPID=
[ "$rc" -eq 0 ] || { echo "demo: siliceod exited with status $rc" >&2; exit 1; }
echo "demo: done"
