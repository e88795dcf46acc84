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

# ---- a real terminal (tmux), for the clients' terminal tests --------------------------------------
# tty_setup COLS ROWS [capture-pane flags]: skips the script when there is no tmux; else a private
# tmux server ($TM) whose session t is COLS x ROWS, killed on exit with the clients its windows
# ran given time to end first (they may still be saving their history). Call it before
# start_daemon, so a skipped script starts nothing.
tty_setup() {
    command -v tmux >/dev/null || { echo "skip: no tmux"; exit 0; }
    TM="tmux -S $T/tmux.sock"
    TTY_CAPTURE=${3:-}
    trap tty_cleanup EXIT
    mkdir -p "$T/home"
    $TM new-session -d -s t -x "$1" -y "$2" "sleep 600"
}

tty_cleanup() {
    $TM kill-server 2>/dev/null || true
    for _ in $(seq 50); do pgrep -f "$SIL_BUILD/bin/sil-chat" >/dev/null || break; sleep 0.1; done
    cleanup
}

pane() { # window: what it shows
    $TM capture-pane -p $TTY_CAPTURE -t "$1"
}

wait_for() { # window, fixed string, seconds (10)
    local i
    for i in $(seq $((${3:-10} * 10))); do
        pane "$1" | grep -qF -- "$2" && return 0
        sleep 0.1
    done
    echo "pane $1:"; pane "$1"; fail "waited for '$2'"
}

# tty_run WINDOW COMMAND: a new window runs the shell command with a private home and state
# directory in a UTF-8 locale, then shows "EXIT=status" and stays open.
tty_run() {
    $TM new-window -d -n "$1" "env HOME=$T/home XDG_STATE_HOME=$T/state LANG=C.UTF-8 TERM=xterm \
        $2; echo EXIT=\$?; sleep 600"
}

# nvim_lua SCRIPT SECONDS: the Lua file SCRIPT, which defines main(), run by a headless Neovim
# with the siliceo plugin loaded; an error in main, or the time running out, is a non-zero status.
# Neovim's output goes to SCRIPT.out.
nvim_lua() {
    cat >>"$1" <<'LUA'
local ok, err = pcall(main)
if not ok then
  io.stderr:write(tostring(err) .. '\n')
  vim.cmd('cquit')
end
vim.cmd('qall!')
LUA
    timeout "$2" nvim --headless -u NONE --cmd "set rtp^=$ROOT/contrib/nvim" \
        -c "runtime plugin/siliceo.lua" -c "luafile $1" >"$1.out" 2>&1
}
