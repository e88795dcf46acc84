# Sourced by the integration scripts: a private socket in a temp dir, the real daemon from
# $SIL_BUILD/bin, clean-up on exit.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
SIL_BUILD=${SIL_BUILD:-$ROOT/build}
SHARED=${SHARED:-$(cd "$ROOT/.." && pwd)/shared}
MODEL=${MODEL:-$SHARED/refdata/models/qwen3-tiny-Q8_0.gguf}
MOE_MODEL=$SHARED/refdata/models/qwen35moe-tiny-Q4_K_M.gguf
T=$(mktemp -d /tmp/sil-it.XXXXXX)
export SILICEO_SOCKET=$T/run/siliceod.sock
# The expert heat map goes to the test's own state directory, never a system one.
export STATE_DIRECTORY=$T/state
export PYTHONPATH=$HERE${PYTHONPATH:+:$PYTHONPATH}
DPID=

cleanup() {
    if [ -n "$DPID" ] && kill -0 "$DPID" 2>/dev/null; then kill -KILL "$DPID" 2>/dev/null || true; fi
    rm -rf "$T"
}
trap cleanup EXIT

# A config file of our own so a system-wide /etc/siliceo/siliceod.conf never leaks in.
write_conf() {
    printf '%s\n' "$@" > "$T/siliceod.conf"
}
write_conf "threads = 2"

start_daemon() { # extra flags...
    "$SIL_BUILD/bin/siliceod" --config "$T/siliceod.conf" --socket "$SILICEO_SOCKET" "$@" >"$T/daemon.log" 2>&1 &
    DPID=$!
    python3 -c "import siltest,sys; sys.exit(0 if siltest.wait_socket('$SILICEO_SOCKET', 30) else 1)" || {
        echo "daemon did not come up:"; cat "$T/daemon.log"; exit 1; }
}

stop_daemon() { # expects exit status 0 after SIGTERM
    kill -TERM "$DPID"
    local rc=0
    wait "$DPID" || rc=$?
    DPID=
    if [ "$rc" -ne 0 ]; then echo "daemon exited $rc"; cat "$T/daemon.log"; exit 1; fi
    # Under the ASan build a leak (LeakSanitizer runs at exit) or a UBSan report fails too.
    if grep -q 'Sanitizer\|runtime error' "$T/daemon.log"; then
        echo "FAIL: sanitizer report"; cat "$T/daemon.log"; exit 1
    fi
    echo "ok: daemon exited 0 on SIGTERM"
}

fail() { echo "FAIL: $*"; [ -f "$T/daemon.log" ] && tail -n 30 "$T/daemon.log"; exit 1; }

# A script whose reference model is missing is skipped (exit 0), except under CI=true, where a
# missing refdata file is a failure: a CI run must not pass by skipping everything.
need_refdata() { # files...
    local f
    for f in "$@"; do
        [ -f "$f" ] && continue
        case ${CI:-} in true | TRUE | True | 1) fail "reference data $f missing (CI=true)" ;; esac
        echo "skip: reference data $f missing"
        exit 0
    done
}
need_refdata "$MODEL" "$MOE_MODEL"
