#!/usr/bin/env bash
# sil-chat's REPL on a real terminal (tmux), typed and pasted as a person would: -S continues a
# session that one-shot calls began, a trailing backslash and a paste of several lines each make
# one question, /help lists every command the REPL takes, /stats and --verbose print the speeds
# the daemon measured for that very answer.
. "$(dirname "$0")/lib.bash"
tty_setup 200 50 -J
BIN=$SIL_BUILD/bin
start_daemon --model "$MODEL"
OPTS="--no-think -n 4 --grace 0 -t 0"

# The daemon's log line of each request: "P prompt tokens (C cached)".
requests() { grep -o "[0-9]* prompt tokens ([0-9]* cached)" "$T/daemon.log" || true; }
n_requests() { requests | grep -c . || true; }
wait_requests() { # count
    local i
    for i in $(seq 100); do [ "$(n_requests)" -ge "$1" ] && return 0; sleep 0.1; done
    fail "waited for request $1; the daemon logged $(n_requests)"
}
messages() { # session name: messages the daemon holds
    python3 -c "import siltest, sys; r, _ = siltest.Client().ok('sessions.list')
print(sum(s['messages'] for s in r['sessions'] if s['name'] == sys.argv[1]))" "$1"
}
# The prompt length of a question asked alone (no session): the daemon's count.
n_prompt_of() {
    "$BIN/sil-chat" $OPTS --json "$1" | python3 -c "import json, sys; print(json.load(sys.stdin)['n_prompt'])"
}
start_chat() { # window, sil-chat arguments...
    local w=$1; shift
    tty_run "$w" "$BIN/sil-chat $*"
    wait_for "$w" "Ctrl-D to quit."
}

# ---- -S NAME in the REPL continues the session ------------------------------------------------------
"$BIN/sil-chat" $OPTS -S plan "My name is Bob." >/dev/null || fail "sil-chat -S plan"
"$BIN/sil-chat" $OPTS -S plan "I live in Lyon." >/dev/null || fail "sil-chat -S plan (2)"
[ "$(messages plan)" = 4 ] || fail "two one-shot turns left $(messages plan) messages"
before=$(requests | tail -1 | cut -d' ' -f1)
start_chat a $OPTS -S plan
wait_for a "continuing session plan: 4 messages"
n=$(n_requests)
$TM send-keys -t a "What is my name?" Enter
wait_requests $((n + 1))
wait_for a "> What is my name?"
[ "$(messages plan)" = 6 ] || fail "the REPL left $(messages plan) messages in plan, want 6 (4 kept + 2)"
last=$(requests | tail -1)
[ "${last%% *}" -gt "$before" ] || fail "the REPL's prompt ($last) is not the conversation so far ($before tokens before)"
echo "$last" | grep -q "([1-9][0-9]* cached)" || fail "the REPL's turn reused nothing of the session: $last"
$TM send-keys -t a "/quit" Enter
wait_for a "EXIT=0"
[ "$(messages plan)" = 6 ] || fail "leaving the REPL changed plan: $(messages plan) messages"
"$BIN/sil-chat" $OPTS -S plan "And where do I live?" >/dev/null || fail "sil-chat -S plan after the REPL"
[ "$(messages plan)" = 8 ] || fail "a one-shot call after the REPL: $(messages plan) messages, want 8"
echo "ok: sil-chat -S plan in the REPL continues the 4 messages of earlier calls (6, then 8 after one more call)"
# /reset forgets a named session's conversation, in the daemon too; the next turn starts it anew.
start_chat r $OPTS -S plan
wait_for r "continuing session plan: 8 messages"
$TM send-keys -t r "/reset" Enter
wait_for r "conversation cleared"
[ "$(messages plan)" = 0 ] || fail "/reset left $(messages plan) messages in plan"
n=$(n_requests)
$TM send-keys -t r "Hello again." Enter
wait_requests $((n + 1))
for _ in $(seq 50); do [ "$(messages plan)" = 2 ] && break; sleep 0.1; done
[ "$(messages plan)" = 2 ] || fail "after /reset and one turn plan holds $(messages plan) messages, want 2"
requests | tail -1 | grep -q "(0 cached)" || fail "the turn after /reset reused the old conversation: $(requests | tail -1)"
echo "ok: /reset in a -S REPL drops the session's conversation; the next turn starts it again"

# ---- multi-line questions ------------------------------------------------------------------------
start_chat m $OPTS
n=$(n_requests)
$TM send-keys -t m "first line\\" Enter
wait_for m "... "
sleep 0.3
[ "$(n_requests)" = "$n" ] || fail "a line ending in a backslash was sent"
$TM send-keys -t m "second line" Enter
wait_requests $((n + 1))
want=$(n_prompt_of "$(printf 'first line\nsecond line')")
got=$(requests | tail -1 | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "backslash: the daemon got a prompt of $got tokens, 'first line\\nsecond line' alone is $want"
echo "ok: a trailing backslash continues the question on the next line ($got prompt tokens, as asked whole)"
# A paste: three lines at once, the last with its newline, as a terminal sends them.
start_chat p $OPTS
n=$(n_requests)
$TM set-buffer "$(printf 'pasted one\rpasted two\rpasted three\r')"
$TM paste-buffer -t p
wait_requests $((n + 1))
sleep 0.5
[ "$(n_requests)" = $((n + 1)) ] || fail "a paste of 3 lines made $(($(n_requests) - n)) requests"
want=$(n_prompt_of "$(printf 'pasted one\npasted two\npasted three')")
got=$(requests | tail -1 | cut -d' ' -f1)
[ "$got" = "$want" ] || fail "paste: the daemon got a prompt of $got tokens, the three lines alone are $want"
echo "ok: a paste of three lines is one question ($got prompt tokens)"

# ---- /help lists every command, each of them works -------------------------------------------------
$TM send-keys -t p "/help" Enter
wait_for p "/quit"
# the commands are the first column of /help's lines (16 characters wide)
cmds=$(pane p | sed -n '/^> \/help$/,$p' | grep "^/" | cut -c1-16 | grep -oE "/[a-z]+" | sort -u)
for c in /help /reset /think /stats /quit /exit; do
    printf '%s\n' "$cmds" | grep -qx -- "$c" || fail "/help does not list $c: $(pane p)"
    grep -q "^\.It Ic.* $c\( \|$\)" "$ROOT/man/sil-chat.1" || fail "sil-chat(1) does not list $c"
done
# The REPL's own list, not ours: every command it names is taken (none is "unknown").
for c in $cmds; do
    case $c in /quit | /exit) continue ;; /think | /stats) c="$c on" ;; esac
    $TM send-keys -t p "$c" Enter
    sleep 0.2
done
$TM send-keys -t p "/bogus" Enter
wait_for p "unknown command /bogus; /help lists them"
[ "$(pane p | grep -c "unknown command")" = 1 ] || fail "a listed command is unknown: $(pane p)"
for c in /quit /exit; do
    start_chat "q${c#/}"
    $TM send-keys -t "q${c#/}" "$c" Enter
    wait_for "q${c#/}" "EXIT=0"
done
echo "ok: /help lists $(echo $cmds) and the man page too; each is taken, /bogus is not"

# Is a figures line that of the daemon's last request, evaluated = prompt - cached, 4 generated?
same_as_logged() {
    local logged; logged=$(requests | tail -1)
    [[ $1 =~ ^prompt\ ([0-9]+)\ tokens\ \(([0-9]+)\ cached,\ ([0-9]+)\ evaluated\ at\ [0-9.]+\ tok/s\ in\ [0-9.]+\ s\),\ answer\ 4\ tokens\ at\ [0-9.]+\ tok/s\ in ]] &&
        [ "${BASH_REMATCH[1]} prompt tokens (${BASH_REMATCH[2]} cached)" = "$logged" ] &&
        [ $((BASH_REMATCH[1] - BASH_REMATCH[2])) = "${BASH_REMATCH[3]}" ] && return 0
    echo "figures '$1', the daemon logged '$logged'"
    return 1
}
# ---- /stats and --verbose: the speeds of that answer ------------------------------------------------
start_chat s $OPTS
n=$(n_requests)
$TM send-keys -t s "How fast are you?" Enter
wait_requests $((n + 1))
$TM send-keys -t s "/stats" Enter
wait_for s "answer 4 tokens at"
same_as_logged "$(pane s | grep "^prompt [0-9]* tokens" | tail -1)" || fail "/stats"
$TM send-keys -t s "/stats on" Enter
sleep 0.2
$TM send-keys -t s "And now?" Enter
wait_requests $((n + 2))
for _ in $(seq 50); do [ "$(pane s | grep -c "^prompt [0-9]* tokens")" = 2 ] && break; sleep 0.1; done
[ "$(pane s | grep -c "^prompt [0-9]* tokens")" = 2 ] || fail "/stats on printed no figures after the answer: $(pane s)"
same_as_logged "$(pane s | grep "^prompt [0-9]* tokens" | tail -1)" || fail "/stats on"
echo "ok: /stats gives the last answer's prompt and decode speed, as the daemon counted it; /stats on after each answer"
"$BIN/sil-chat" $OPTS --verbose "Hello there" >"$T/out" 2>"$T/err" || fail "--verbose: $(cat "$T/err")"
logged=$(requests | tail -1)
grep -q "^prompt ${logged%% *} tokens (0 cached, ${logged%% *} evaluated at [0-9.]* tok/s in [0-9.]* s), answer 4 tokens at" "$T/err" ||
    fail "--verbose on stderr: '$(cat "$T/err")', the daemon logged '$logged'"
! grep -q "tok/s" "$T/out" || fail "--verbose wrote its figures to stdout"
"$BIN/sil-chat" $OPTS "Hello there" 2>"$T/err" >/dev/null
[ ! -s "$T/err" ] || fail "figures without --verbose: $(cat "$T/err")"
echo "ok: --verbose prints the figures on stderr after the answer, stdout keeps the answer only"
stop_daemon
