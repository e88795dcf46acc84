#!/usr/bin/env bash
# A full context, as a user meets it: with a context of 256 tokens, ten sil-chat -S turns each
# answer, the oldest turns go (sil-chat says so, the system prompt stays, the session's
# transcript and its saved file hold what is kept) and every turn's prompt and greedy answer
# are those of a cold request for the kept conversation on a daemon without prefix cache; on a
# hybrid model (recurrent state recomputed) and an attention-only one (the kept prefix reused).
# A question larger than the context is error 15 (context_full), sil-chat exits 1 saying so, the
# OpenAI bridge answers 400 context_length_exceeded; an answer that meets the end of the context
# stops with "context". The REPL, which keeps its conversation itself, leaves out the same turns.
# The Neovim plugin says how many messages each turn dropped, and its session keeps the rest.
. "$(dirname "$0")/lib.bash"
CHAT=$SIL_BUILD/bin/sil-chat
CTX=256
N=10
OPTS=(--no-think -n 8 --grace 0 -t 0 --system "You are terse.")
question() { echo "Question $1: tell me about the number $1 and its friends."; }
TM="tmux -S $T/tmux.sock"
trap '$TM kill-server 2>/dev/null || true; cleanup' EXIT
# The daemon's log line of each request: "P prompt tokens (C cached)".
requests() { grep -o "[0-9]* prompt tokens ([0-9]* cached)" "$T/daemon.log" || true; }
n_requests() { requests | grep -c . || true; }
pane() { $TM capture-pane -p -J -S - -t r; }

# The REPL without -S keeps the conversation itself and sends it whole: asked the same questions,
# it must give the daemon the prompts the -S session had, so it leaves out what the daemon left out.
repl_check() { # kind, directory of the -S turns
    local i n k want got
    $TM new-session -d -s t -x 200 -y 50 "sleep 600"
    $TM new-window -d -n r "env HOME=$T/home XDG_STATE_HOME=$T/xstate LANG=C.UTF-8 TERM=xterm \
        $CHAT --no-think -n 8 --grace 0 -t 0 --system 'You are terse.'; echo EXIT=\$?; sleep 600"
    for _ in $(seq 100); do pane | grep -qF "Ctrl-D to quit." && break; sleep 0.1; done
    for i in $(seq $N); do
        n=$(n_requests)
        $TM send-keys -t r "$(question "$i")" Enter
        for _ in $(seq 100); do [ "$(n_requests)" -gt "$n" ] && break; sleep 0.1; done
        got=$(requests | tail -1 | cut -d' ' -f1)
        want=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['n_prompt'])" "$2/$i.json")
        [ "$got" = "$want" ] || fail "$1: REPL turn $i: a prompt of $got tokens, the -S session's was $want"
    done
    want=$(cat "$2"/*.err | grep -c "oldest messages were dropped" || true)
    for _ in $(seq 50); do [ "$(pane | grep -c "oldest messages were dropped")" = "$want" ] && break; sleep 0.1; done
    got=$(pane | grep -c "oldest messages were dropped" || true)
    [ "$got" = "$want" ] || fail "$1: the REPL said $got times that messages were dropped, -S $want: $(pane)"
    $TM send-keys -t r "/quit" Enter
    for _ in $(seq 100); do pane | grep -q "EXIT=0" && break; sleep 0.1; done
    pane | grep -q "EXIT=0" || fail "$1: the REPL did not exit 0: $(pane)"
    $TM kill-server
    echo "ok: $1: the REPL's $N turns send the prompts of the -S session and say so where turns were dropped ($got times)"
}

# The Neovim plugin on a session of its own: each turn it says how many messages were dropped,
# and the session then holds exactly what was kept (the new question and answer, less those).
nvim_check() {
    if ! command -v nvim >/dev/null; then echo "skip: nvim not installed (the Neovim plugin)"; return; fi
    cat >"$T/nv.lua" <<'LUA'
local s = require('siliceo')
local notes = {}
vim.notify = function(msg, level) table.insert(notes, { msg = msg, level = level }) end
s.setup({ session = 'nvlong', system = 'You are terse.', max_tokens = 8, temperature = 0,
          split = 'enew' })
local function main()
  local total, said = 0, 0
  for i = 1, tonumber(os.getenv('NV_TURNS')) do
    local before, k = s.session_messages('nvlong'), #notes
    s.chat(string.format('Question %d: tell me about the number %d and its friends.', i, i))
    assert(vim.wait(60000, function() return not s.running() end, 20), 'turn ' .. i .. ': no end')
    local dropped = 0
    for j = k + 1, #notes do
      local d = notes[j].msg:match('its (%d+) oldest messages were dropped %(the system prompt stays%)')
      assert(d and notes[j].level == vim.log.levels.WARN, 'turn ' .. i .. ': ' .. notes[j].msg)
      dropped, said = tonumber(d), said + 1
    end
    local want = before + (before == 0 and 3 or 2) - dropped
    assert(vim.wait(5000, function() return s.session_messages('nvlong') == want end, 50),
      string.format('turn %d: %d messages before, %d dropped: the session holds %d, want %d', i,
        before, dropped, s.session_messages('nvlong'), want))
    total = total + dropped
  end
  assert(said > 0, 'no turn said that messages were dropped')
  local out = assert(io.open(os.getenv('NV_OUT'), 'w'))
  out:write(string.format('%d %d\n', said, total))
  out:close()
end
LUA
    NV_TURNS=$N NV_OUT=$T/nv.res nvim_lua "$T/nv.lua" 300 || fail "Neovim plugin: $(cat "$T/nv.lua.out")"
    read -r said total <"$T/nv.res"
    echo "ok: the Neovim plugin said $said times that messages were dropped ($total in all), and the session kept the rest"
}

for model in "$MOE_MODEL" "$MODEL"; do
    kind=hybrid
    [ "$model" = "$MODEL" ] && kind=plain
    D=$T/$kind
    mkdir -p "$D"
    write_conf "threads = 2"
    start_daemon --model "$model" --context $CTX --state-dir "$D/state"
    for i in $(seq $N); do
        "$CHAT" "${OPTS[@]}" -S long --json "$(question "$i")" >"$D/$i.json" 2>"$D/$i.err" ||
            fail "$kind: turn $i: sil-chat exited $?: $(cat "$D/$i.err")"
    done
    python3 "$HERE/context_tests.py" turns $CTX "$D" $N $kind || fail "$kind: turns"
    echo "ok: $kind: $N turns in a context of $CTX each answer; the oldest turns go, and sil-chat says so"

    big=$(printf 'word %.0s' $(seq $CTX))
    rc=0
    "$CHAT" "${OPTS[@]}" "$big" >"$D/big.out" 2>"$D/big.err" || rc=$?
    [ "$rc" = 1 ] && [ ! -s "$D/big.out" ] && grep -q "does not fit the context of $CTX.*context_full" "$D/big.err" ||
        fail "$kind: a question larger than the context: exit $rc, $(cat "$D/big.err")"
    rc=0
    "$CHAT" "${OPTS[@]}" -S long "$big" >"$D/big.out" 2>"$D/big.err" || rc=$?
    [ "$rc" = 1 ] && grep -q "context_full" "$D/big.err" ||
        fail "$kind: -S with a question larger than the context: exit $rc, $(cat "$D/big.err")"
    echo "ok: $kind: a question larger than the context: sil-chat exits 1 with error 15 (context_full)"
    python3 "$HERE/context_tests.py" edge $CTX || fail "$kind: edge"
    echo "ok: $kind: error 15 for a chat too large; an answer cut by the context stops with \"context\""
    stop_daemon

    # The same state directory, no prefix cache: cold runs of what each turn was given.
    write_conf "threads = 2" "prefix_cache = off"
    start_daemon --model "$model" --context $CTX --state-dir "$D/state"
    "$CHAT" "${OPTS[@]}" -S long --json "$(question $((N + 1)))" >"$D/next.json" 2>"$D/next.err" ||
        fail "$kind: the session after a restart: $(cat "$D/next.err")"
    python3 "$HERE/context_tests.py" replay "$D" || fail "$kind: replay"
    echo "ok: $kind: every turn's prompt and answer are a cold run's of system + kept turns; the saved session goes on from them"
    if command -v tmux >/dev/null; then repl_check $kind "$D"; else echo "skip: no tmux (the REPL)"; fi
    [ $kind = plain ] && nvim_check
    stop_daemon
done

# The bridge: a request larger than the context is a 400 with OpenAI's code.
if [ -x "$SIL_BUILD/bin/sil-openai" ] && command -v curl >/dev/null; then
    write_conf "threads = 2"
    start_daemon --model "$MODEL" --context $CTX
    P=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$SIL_BUILD/bin/sil-openai" --port "$P" >"$T/bridge.log" 2>&1 &
    BPID=$!
    trap 'kill -KILL $BPID 2>/dev/null || true; $TM kill-server 2>/dev/null || true; cleanup' EXIT
    for _ in $(seq 100); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$P/health" || true)" = 200 ] && break
        sleep 0.1
    done
    python3 - "$P" "$CTX" <<'PY' || fail "bridge"
import json, sys, urllib.request, urllib.error
from siltest import check
port, ctx = sys.argv[1], int(sys.argv[2])
body = {"max_tokens": 4, "messages": [{"role": "user", "content": "word " * ctx}]}
req = urllib.request.Request("http://127.0.0.1:%s/v1/chat/completions" % port,
                             data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
try:
    urllib.request.urlopen(req, timeout=60)
    check(False, "a request larger than the context succeeded")
except urllib.error.HTTPError as e:
    err = json.load(e)["error"]
    check(e.code == 400 and err["code"] == "context_length_exceeded" and "context" in err["message"],
          "the bridge: 400 context_length_exceeded (%d, %r)" % (e.code, err))
PY
    kill -TERM "$BPID"
    wait "$BPID" || fail "sil-openai exited $? on SIGTERM"
    echo "ok: sil-openai answers a request larger than the context with 400 context_length_exceeded"
    stop_daemon
else
    echo "skip: sil-openai or curl missing (the bridge's 400)"
fi
