#!/usr/bin/env bash
# A long soak of siliceod (tests/soak/soak.py) with its own daemon and socket: CLIENTS clients
# for MINUTES on MODEL, the caches held to CACHE each, then a JSON summary (requests by kind,
# errors by code, RSS and descriptors every second, first-token p50/p99, what failed) to OUT.
# Exit status 0 when every check held.
#
# usage: tests/soak/run.sh MODEL MINUTES CLIENTS OUT.json [CACHE (default 64M)] [SEED]
# Environment: SIL_BUILD (default build), SILICEOD_ARGS (more daemon flags, e.g. --backend cuda).
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,9p' "$0"; exit 2; }
MODEL=$1 MINUTES=$2 CLIENTS=$3 OUT=$4 CACHE=${5:-64M} SEED=${6:-1}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SIL_BUILD=${SIL_BUILD:-$ROOT/build}
T=$(mktemp -d /tmp/sil-soak.XXXXXX)
export SILICEO_SOCKET=$T/siliceod.sock STATE_DIRECTORY=$T/state
export PYTHONPATH=$ROOT/tests/integration${PYTHONPATH:+:$PYTHONPATH}
DPID=
trap '[ -n "$DPID" ] && kill -KILL "$DPID" 2>/dev/null; rm -rf "$T"' EXIT
printf '%s\n' "threads = 2" "max_running = 16" "max_queue = 256" "session_memory = $CACHE" \
    "prefix_checkpoint_memory = $CACHE" "prefix_cache_memory = $CACHE" > "$T/siliceod.conf"
# shellcheck disable=SC2086
"$SIL_BUILD/bin/siliceod" --config "$T/siliceod.conf" --socket "$SILICEO_SOCKET" --model "$MODEL" \
    ${SILICEOD_ARGS:-} > "$T/daemon.log" 2>&1 &
DPID=$!
python3 -c "import siltest,sys; sys.exit(0 if siltest.wait_socket('$SILICEO_SOCKET', 60) else 1)" ||
    { cat "$T/daemon.log"; exit 1; }
rc=0
python3 "$HERE/soak.py" "$DPID" "$((MINUTES * 60))" "$CLIENTS" --seed "$SEED" --json "$OUT" || rc=$?
kill -TERM "$DPID"
wait "$DPID" || { echo "siliceod exited $? after SIGTERM"; tail -20 "$T/daemon.log"; rc=1; }
DPID=
exit $rc
