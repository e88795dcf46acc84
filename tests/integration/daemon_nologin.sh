#!/usr/bin/env bash
# The quick start for a user without a login session (no XDG_RUNTIME_DIR, no /run/user/UID: cron,
# su without a session, a container): siliceod and sil-chat, run as nobody with an empty environment, agree
# on /tmp/siliceo-UID/siliceod.sock, which the daemon makes private to the user, and an answer
# comes back. A directory of that name that is not the user's (made by someone else, or
# writable by others) is refused with a line that says so. The state directory, whose default
# (~/.local/state/siliceo) cannot be made under HOME=/nonexistent, falls back to
# /var/tmp/siliceo-UID (0700) with a line saying why, and a saved session lands there; a
# directory of that name that is not the user's is refused with a warning and the daemon serves
# with its state in memory. Before any daemon runs, sil-chat says that none does (never that
# the user should join a group). Needs root (setpriv); skipped otherwise.
. "$(dirname "$0")/lib.bash"
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null || ! id nobody >/dev/null 2>&1; then
    echo "skip: needs root, setpriv and the user nobody"
    exit 0
fi
NB=$(id -u nobody)
[ ! -d "/run/user/$NB" ] || { echo "skip: /run/user/$NB exists here"; exit 0; }
DIR=/tmp/siliceo-$NB
[ ! -e "$DIR" ] || { echo "skip: $DIR exists already"; exit 0; }
SDIR=/var/tmp/siliceo-$NB
[ ! -e "$SDIR" ] || { echo "skip: $SDIR exists already"; exit 0; }
W=$(mktemp -d /tmp/sil-nologin.XXXXXX)
chmod 755 "$W"
cp "$MODEL" "$W/model.gguf"
chmod 644 "$W/model.gguf"
printf 'threads = 2\n' >"$W/siliceod.conf"
chmod 644 "$W/siliceod.conf"
# setpriv execs: the pid is the daemon's
as_nobody() { setpriv --reuid=nobody --regid=nogroup --clear-groups env -i PATH=/usr/bin:/bin HOME=/nonexistent "$@"; }
NPID=
trap '[ -z "$NPID" ] || kill -KILL "$NPID" 2>/dev/null || true; rm -rf "$W" "$DIR" "$SDIR"; cleanup' EXIT

# No daemon yet: the hint says so, and names no group to join.
rc=0
out=$(as_nobody "$SIL_BUILD/bin/sil-chat" hi 2>&1) || rc=$?
[ "$rc" = 1 ] || fail "sil-chat with no daemon exited $rc: $out"
grep -q "$DIR/siliceod.sock (No such file or directory)" <<<"$out" || fail "the hint does not name $DIR: $out"
if [ ! -e /run/siliceo ]; then
    grep -q "; no siliceod runs, neither yours nor the system's: 'siliceod --model FILE' starts one" <<<"$out" ||
        fail "the hint does not say that no daemon runs: $out"
fi
! grep -q "join\|usermod\|group root" <<<"$out" || fail "the hint suggests joining a group: $out"
echo "ok: before the daemon starts, sil-chat as nobody says that no siliceod runs"

setpriv --reuid=nobody --regid=nogroup --clear-groups env -i PATH=/usr/bin:/bin HOME=/nonexistent \
    "$SIL_BUILD/bin/siliceod" --config "$W/siliceod.conf" --model "$W/model.gguf" \
    >"$W/daemon.log" 2>&1 &
NPID=$!
for _ in $(seq 1 100); do [ -S "$DIR/siliceod.sock" ] && break; sleep 0.1; done
[ -S "$DIR/siliceod.sock" ] || { cat "$W/daemon.log"; fail "no socket at $DIR/siliceod.sock"; }
[ "$(stat -c '%u %a' "$DIR")" = "$NB 750" ] || fail "$DIR is $(stat -c '%u %a' "$DIR"), not nobody's 750"
out=$(as_nobody "$SIL_BUILD/bin/sil-chat" --no-think -n 4 -t 0 "Hello there" 2>&1) ||
    fail "sil-chat as nobody: $out"
[ -n "$out" ] || fail "sil-chat as nobody printed nothing"
echo "ok: siliceod and sil-chat as nobody without a login session meet at $DIR/siliceod.sock"
grep -q "notice: state directory: /nonexistent/.local/state/siliceo: .*; using $SDIR$" "$W/daemon.log" ||
    fail "no line for the state directory's fallback: $(grep -i state "$W/daemon.log")"
[ "$(stat -c '%u %a' "$SDIR")" = "$NB 700" ] || fail "$SDIR is $(stat -c '%u %a' "$SDIR"), not nobody's 700"
as_nobody "$SIL_BUILD/bin/sil-chat" --no-think -n 4 -t 0 -S kept "Hello again" >/dev/null 2>&1 ||
    fail "sil-chat -S as nobody"
[ -n "$(find "$SDIR/sessions/$NB" -type f 2>/dev/null)" ] || fail "no saved session under $SDIR: $(find "$SDIR")"
echo "ok: without a usable HOME the state directory is $SDIR (nobody's, 0700), and a session is saved there"
if command -v nvim >/dev/null; then
    # the Neovim plugin finds the same socket (nvim wants a writable HOME for its state)
    mkdir -p "$W/home" && chown nobody "$W/home"
    setpriv --reuid=nobody --regid=nogroup --clear-groups env -i PATH=/usr/bin:/bin HOME="$W/home" \
        nvim --headless -u NONE --cmd "set rtp+=$ROOT/contrib/nvim" \
        -c "lua local r, e = require('siliceo').request('status'); io.stdout:write(r and 'OK ' .. r.model.name or e)" \
        -c q >"$W/nvim.out" 2>&1 || true
    grep -q "^OK Qwen3 Tiny" "$W/nvim.out" || fail "the Neovim plugin as nobody: $(cat "$W/nvim.out")"
    echo "ok: the Neovim plugin as nobody finds it too"
fi
kill -TERM "$NPID"
rc=0
wait "$NPID" || rc=$?
NPID=
[ "$rc" = 0 ] || fail "siliceod as nobody exited $rc after SIGTERM"

# someone else's state directory there first: a warning, and the daemon serves from memory
rm -rf "$SDIR" "$DIR"
mkdir -m 777 "$SDIR"
setpriv --reuid=nobody --regid=nogroup --clear-groups env -i PATH=/usr/bin:/bin HOME=/nonexistent \
    "$SIL_BUILD/bin/siliceod" --config "$W/siliceod.conf" --model "$W/model.gguf" \
    >"$W/daemon.log" 2>&1 &
NPID=$!
for _ in $(seq 1 100); do [ -S "$DIR/siliceod.sock" ] && break; sleep 0.1; done
[ -S "$DIR/siliceod.sock" ] || { cat "$W/daemon.log"; fail "no socket at $DIR/siliceod.sock"; }
grep -q "warning: state directory unusable (/nonexistent/.local/state/siliceo: .*; $SDIR belongs to uid 0 with mode 777: not this user's, or writable by others; remove it, or set state_dir); sessions are kept in memory only" "$W/daemon.log" ||
    fail "no warning for someone else's $SDIR: $(grep -i state "$W/daemon.log")"
as_nobody "$SIL_BUILD/bin/sil-chat" --no-think -n 4 -t 0 "Hello" >/dev/null 2>&1 || fail "sil-chat as nobody, state in memory"
[ -z "$(ls -A "$SDIR")" ] || fail "the daemon wrote into someone else's $SDIR: $(ls -A "$SDIR")"
kill -TERM "$NPID"
rc=0
wait "$NPID" || rc=$?
NPID=
[ "$rc" = 0 ] || fail "siliceod as nobody exited $rc after SIGTERM"
rm -rf "$SDIR"
echo "ok: a $SDIR that is not the user's is refused with a warning, and the daemon serves"

# someone else's directory there first: refused, saying why
rm -rf "$DIR"
mkdir -m 777 "$DIR"
rc=0
timeout 30 setpriv --reuid=nobody --regid=nogroup --clear-groups env -i PATH=/usr/bin:/bin \
    HOME=/nonexistent "$SIL_BUILD/bin/siliceod" --config "$W/siliceod.conf" --model "$W/model.gguf" \
    >"$W/bad.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] || fail "siliceod used a directory writable by others"
grep -q "$DIR belongs to uid 0 with mode 777: not this user's, or writable by others" "$W/bad.log" ||
    fail "no clear refusal: $(cat "$W/bad.log")"
echo "ok: a directory of that name writable by others is refused with the reason"
