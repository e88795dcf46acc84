#!/usr/bin/env bash
# Sessions that survive (siliceod(8), "Sessions"): a chat session's transcript is saved in the
# state directory when it changes, so after SIGTERM and a restart, or after an LRU eviction, the
# next turn's prompt is the whole conversation again (also when SIGTERM cut an answer); per-uid files another uid neither sees nor
# reads; hostile names stay hex file names inside the uid's directory; a corrupt file is ignored
# with a log line; --drop removes the file; the per-uid bound; no usable state directory leaves
# sessions in memory with a warning.
. "$(dirname "$0")/lib.bash"
CHAT=$SIL_BUILD/bin/sil-chat
PY="python3 $HERE/saved_sessions_tests.py"
STATE=$STATE_DIRECTORY
UIDDIR=$STATE/sessions/$(id -u)
hex() { printf '%s' "$1" | od -An -tx1 | tr -d ' \n'; }

start_daemon --model "$MOE_MODEL"
$PY first "$STATE" "$T/1.json" || fail "first turn"
stop_daemon
start_daemon --model "$MOE_MODEL"
grep -q "saved sessions: 1 transcripts of 1 uids" "$T/daemon.log" || fail "no restore line at start"
"$CHAT" --sessions | grep -Eq '^plan +3 ' || fail "--sessions after the restart: $("$CHAT" --sessions)"
echo "ok: sil-chat --sessions lists plan (3 messages) after the restart"
$PY after_restart "$T/1.json" || fail "continued after the restart"
# sil-chat -S continues it too (a real client, no append flag of ours)
"$CHAT" --no-think -n 4 -t 0 -S plan --json "And again?" >"$T/3.json" || fail "sil-chat -S plan"
"$CHAT" --sessions | grep -Eq '^plan +7 ' || fail "plan should hold 7 messages: $("$CHAT" --sessions)"
echo "ok: sil-chat -S plan continues the restored conversation (7 messages)"

# SIGTERM while an answer streams (each step slowed by a test hook): what was said is saved.
stop_daemon
SILICEOD_TEST_HOOKS=ubatch_ms=20 start_daemon --model "$MOE_MODEL"
$PY sigterm_mid "$DPID" "$T/mid.json" || fail "SIGTERM mid-answer"
rc=0; wait "$DPID" || rc=$?; DPID=
[ "$rc" = 0 ] || fail "the daemon exited $rc after SIGTERM mid-answer"
start_daemon --model "$MOE_MODEL"
$PY after_sigterm_mid "$T/mid.json" || fail "after SIGTERM mid-answer"

if [ "$(id -u)" = 0 ] && id nobody >/dev/null 2>&1; then
    NB=$(id -u nobody) NG=$(id -g nobody)
    stop_daemon
    write_conf "threads = 2" "allow_users = $NB"
    start_daemon --model "$MOE_MODEL"
    chmod 0755 "$(dirname "$SILICEO_SOCKET")" "$T"
    chmod 0666 "$SILICEO_SOCKET"
    $PY other_uid "$STATE" "$NB" "$NG" || fail "another uid"
    write_conf "threads = 2"
else
    echo "skip: another uid's view needs root and the user nobody"
fi

# --drop removes the file, and after a restart the session is gone.
"$CHAT" --drop plan || fail "--drop plan"
[ ! -e "$UIDDIR/$(hex plan)" ] || fail "the file of a dropped session is still there"
echo "ok: --drop removes the transcript file"

# Hostile names.
$PY hostile "$STATE" || fail "hostile names"
stop_daemon
start_daemon --model "$MOE_MODEL"
$PY hostile_back || fail "hostile names after the restart"
stop_daemon

# Eviction: max_sessions = 1.
write_conf "threads = 2" "max_sessions = 1"
start_daemon --model "$MOE_MODEL"
$PY evicted || fail "evicted session"
stop_daemon

# Corrupt files: garbage, a cut-off copy, a file of another name; ignored with a line each.
write_conf "threads = 2"
start_daemon --model "$MOE_MODEL"
"$CHAT" --no-think -n 4 -t 0 -S plan "My name is Bob." >/dev/null || fail "chat plan"
"$CHAT" --no-think -n 4 -t 0 -S cut "My name is Cut." >/dev/null || fail "chat cut"
stop_daemon
head -c 200 /dev/urandom >"$UIDDIR/$(hex bad)"
f=$UIDDIR/$(hex cut)
head -c $(($(stat -c %s "$f") - 3)) "$f" >"$T/cut" && cat "$T/cut" >"$f"
cp "$UIDDIR/$(hex plan)" "$UIDDIR/$(hex other)"
echo junk >"$UIDDIR/notes.txt"
start_daemon --model "$MOE_MODEL"
grep -q "ignoring the saved session file .*/$(hex bad): .*magic" "$T/daemon.log" || fail "no line for the garbage file"
grep -q "ignoring the saved session file .*/$(hex cut): .*checksum" "$T/daemon.log" || fail "no line for the cut file"
grep -q "ignoring the saved session file .*/$(hex other): .*another session's" "$T/daemon.log" ||
    fail "no line for the file of another name"
grep -q "ignoring .*/notes.txt: not a saved session's file name" "$T/daemon.log" || fail "no line for a stray file"
echo "ok: each corrupt file is ignored with a line saying why"
$PY corrupt_after || fail "after corrupt files"
stop_daemon

# The bound per uid.
rm -rf "$STATE/sessions"
write_conf "threads = 2" "saved_sessions = 2" "saved_session_bytes = 4K"
start_daemon --model "$MOE_MODEL"
$PY bounded "$STATE" || fail "bounded"
grep -q "transcript was not saved, it lives in memory only: .*over saved_session_bytes" "$T/daemon.log" ||
    fail "no warning for the transcript over the bound"
stop_daemon

# No usable state directory (a file in its place: refused even for root): a warning, and
# sessions work in memory.
write_conf "threads = 2"
rm -rf "$STATE" && touch "$STATE"
start_daemon --model "$MOE_MODEL"
grep -q "sessions are kept in memory only" "$T/daemon.log" || fail "no warning for the unusable state directory"
$PY memory_only || fail "memory-only sessions"
stop_daemon
