#!/usr/bin/env bash
# Shell sessions that remember: two sil-chat processes on one -S session continue one
# conversation (the daemon keeps the transcript); --sessions lists it, --drop removes it.
. "$(dirname "$0")/lib.bash"
CHAT=$SIL_BUILD/bin/sil-chat
write_conf "threads = 2"
start_daemon --model "$MOE_MODEL"
opts=(--no-think -n 6 -t 0 --system "You are terse.")
"$CHAT" "${opts[@]}" -S plan --json "My name is Bob." >"$T/1.json" || fail "first sil-chat -S failed"
"$CHAT" "${opts[@]}" -S plan --json "What is my name?" >"$T/2.json" || fail "second sil-chat -S failed"
python3 - "$T/1.json" "$T/2.json" <<'PY'
import json, sys
from siltest import Client, check
r1, r2 = (json.load(open(p)) for p in sys.argv[1:3])
check(r1["n_cached"] == 0 and r1["session"] == "plan", "first call starts the conversation")
conv = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "My name is Bob."},
        {"role": "assistant", "content": r1["text"].replace("\0", "")},
        {"role": "user", "content": "What is my name?"}]
cold, _ = Client().ok("chat", {"messages": conv, "temperature": 0, "max_tokens": 6,
                               "think": False})
check(r2["n_prompt"] == cold["n_prompt"],
      "the second process's prompt is the whole conversation (%d tokens, cold %d)" % (r2["n_prompt"], cold["n_prompt"]))
check(r2["tokens"] == cold["tokens"], "and its answer is the cold run's")
check(r2["n_cached"] > 0, "the second call reuses %d tokens of the first" % r2["n_cached"])
PY
"$CHAT" --sessions >"$T/list" || fail "--sessions failed"
grep -Eq '^plan +5 ' "$T/list" || fail "--sessions does not show plan with 5 messages: $(cat "$T/list")"
echo "ok: --sessions lists plan with 5 messages (system, 2 questions, 2 answers)"
"$CHAT" --drop plan || fail "--drop plan failed"
"$CHAT" --sessions | grep -q '^plan ' && fail "plan still listed after --drop"
if "$CHAT" --drop plan 2>"$T/err"; then fail "dropping a dropped session succeeded"; fi
grep -q "no session 'plan'" "$T/err" || fail "--drop of an unknown session says: $(cat "$T/err")"
echo "ok: --drop removes the session; a second --drop says there is none"
# After the drop the conversation starts over.
"$CHAT" "${opts[@]}" -S plan --json "What is my name?" >"$T/3.json" || fail "sil-chat after drop failed"
python3 -c "import json,sys; r=json.load(open('$T/3.json')); sys.exit(0 if r['n_cached']==0 else 1)" ||
    fail "a dropped session still reused tokens"
echo "ok: after --drop the session starts over"
# The Neovim plugin's session option: the same conversation, continued across processes.
if command -v nvim >/dev/null; then
    cat >"$T/nv.lua" <<'LUA'
local s = require('siliceo')
s.setup({ session = 'nv', system = 'You are terse.', max_tokens = 4, temperature = 0, split = 'enew' })
local function wait_messages(n)
  return vim.wait(60000, function() return s.session_messages('nv') == n end, 100)
end
s.chat('My name is Bob.')
assert(wait_messages(3), 'first chat: the session should hold 3 messages')
s.chat('What is my name?')
assert(wait_messages(5), 'second chat: the session should hold 5 messages')
vim.cmd('qall!')
LUA
    ROOT_NV=$ROOT/contrib/nvim
    timeout 120 nvim --headless -u NONE --cmd "set rtp^=$ROOT_NV" -c "runtime plugin/siliceo.lua" \
        -c "luafile $T/nv.lua" >"$T/nv.out" 2>&1 || fail "nvim: $(cat "$T/nv.out")"
    echo "ok: two :SiliceoChat calls in Neovim continue one session (5 messages)"
    "$CHAT" "${opts[@]}" -S nv --json "Say it again." >"$T/4.json" || fail "sil-chat -S nv failed"
    python3 -c "import json,sys; r=json.load(open('$T/4.json')); sys.exit(0 if r['n_cached']>0 else 1)" ||
        fail "sil-chat did not continue the Neovim session"
    "$CHAT" --sessions | grep -Eq '^nv +7 ' || fail "the nv session should hold 7 messages: $("$CHAT" --sessions)"
    echo "ok: sil-chat -S nv continues the conversation Neovim started (7 messages)"
else
    echo "skip: nvim not installed (Neovim plugin session check)"
fi
stop_daemon
