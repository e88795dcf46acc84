#!/usr/bin/env bash
# make demo: the demo model (made once), siliceod on a private socket, sil-probe's summary, one
# streamed question with sil-chat, then a clean stop (SIGTERM, exit status checked).
set -euo pipefail
cd "$(dirname "$0")/.."
B=${B:-build}
BIN=$B/bin
STATE=${SILICEO_STATE_DIR:-state}
MODEL=$STATE/demo.gguf
QUESTION=${DEMO_QUESTION:-"What is a mixture-of-experts model? Answer in two sentences."}

for b in siliceod sil-chat sil-probe sil-mkmodel; do
    [ -x "$BIN/$b" ] || { echo "demo: $BIN/$b is missing; run 'make all' first" >&2; exit 1; }
done
mkdir -p "$STATE"
if [ ! -f "$MODEL" ]; then
    echo "demo: making the demo model $MODEL (once)"
    "$BIN/sil-mkmodel" --preset demo --out "$MODEL.tmp"
    mv "$MODEL.tmp" "$MODEL"
fi

RUN=$(mktemp -d /tmp/siliceo-demo.XXXXXX)
export SILICEO_SOCKET=$RUN/siliceod.sock
DPID=
cleanup() {
    if [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; then kill -TERM "$DPID"; wait "$DPID" || true; fi
    rm -rf "$RUN"
}
trap cleanup EXIT

echo "demo: starting siliceod on $SILICEO_SOCKET"
: >"$RUN/siliceod.conf"
"$BIN/siliceod" --config "$RUN/siliceod.conf" --model "$MODEL" --socket "$SILICEO_SOCKET" --log-level notice &
DPID=$!
for _ in $(seq 600); do
    if "$BIN/sil-probe" --timeout 2 >/dev/null 2>&1; then break; fi
    kill -0 "$DPID" 2>/dev/null || { echo "demo: siliceod exited during start-up" >&2; DPID=; exit 1; }
    sleep 0.2
done

echo; echo "demo: sil-probe"
"$BIN/sil-probe" || true
echo; echo "demo: sil-chat \"$QUESTION\""
"$BIN/sil-chat" --max-tokens 96 --no-think "$QUESTION"
echo
echo "demo: stopping siliceod (SIGTERM)"
kill -TERM "$DPID"
rc=0
wait "$DPID" || rc=$?
DPID=
[ "$rc" -eq 0 ] || { echo "demo: siliceod exited with status $rc" >&2; exit 1; }
echo "demo: done"
