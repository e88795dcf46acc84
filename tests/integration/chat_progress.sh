#!/usr/bin/env bash
# sil-chat's progress line on a real terminal (tmux), with prompts the daemon reads in chunks of
# 16 tokens at 40 ms or more a step (test hook), a few seconds each: while the prompt is read,
# one line "reading the prompt: X / Y tokens" on stderr, Y the prompt's tokens as the daemon
# counts them, X growing; gone once the answer comes, and gone before "[cancelled]" when Ctrl-C
# ends the request during the prompt; in the REPL, what its session held is counted as cached.
# With stderr into a file, no progress anywhere (neither the file nor the terminal); into pipes,
# stdout holds the answer only and stderr nothing. The Neovim plugin shows the same figures as
# virtual text in its reply buffer, gone when the answer comes.
. "$(dirname "$0")/lib.bash"
tty_setup 150 40
BIN=$SIL_BUILD/bin
write_conf "threads = 2" "prefill_chunk = 16" "prefill_budget = 16"
SILICEOD_TEST_HOOKS=ubatch_ms=40 start_daemon --model "$MODEL"

prompt_back() { # window: the REPL's prompt is the last line again (the answer is over)
    local i
    for i in $(seq 300); do
        [ "$(pane "$1" | grep . | tail -1)" = ">" ] && return 0
        sleep 0.1
    done
    pane "$1"; fail "no prompt after the answer"
}
context() { # tag: about 1,300 tokens of words of its own
    for i in $(seq 450); do printf '%s%d ' "$1" $((i % 89)); done
}
CHAT="$BIN/sil-chat -s -n 4 -t 0 --no-think"

# ---- the line while the prompt is read, gone when the answer comes -----------------------------
context a >"$T/a.txt"
tty_run a "$CHAT summarise <$T/a.txt"
wait_for a "reading the prompt: " 20
line1=$(pane a | grep "^reading the prompt: ") || fail "no progress line"
echo "$line1" | grep -qE '^reading the prompt: [0-9][0-9,]* / [0-9],[0-9]{3} tokens$' ||
    fail "progress line: '$line1'"
sleep 0.8
line2=$(pane a | grep "^reading the prompt: ") || { pane a; fail "the progress line went before the answer came"; }
num() { echo "$1" | sed -E "s/^reading the prompt: ([0-9,]*) \/ ([0-9,]*) tokens$/\\$2/" | tr -d ,; }
x1=$(num "$line1" 1) y1=$(num "$line1" 2) x2=$(num "$line2" 1) y2=$(num "$line2" 2)
[ "$x1" -lt "$y1" ] && [ "$x2" -gt "$x1" ] && [ "$y2" = "$y1" ] ||
    fail "progress does not move: '$line1', then '$line2'"
echo "ok: while the prompt is read: '$line1', then '$line2'"
wait_for a "EXIT=0" 30
! pane a | grep -q "reading the prompt" || { pane a; fail "the progress line is still there after the answer"; }
[ "$(pane a | grep -c .)" -ge 1 ] || fail "nothing on the terminal"
# the same request as JSON (no progress asked) counts the prompt's tokens as the line did
n_prompt=$($CHAT --json summarise <"$T/a.txt" | python3 -c "import json,sys; print(json.load(sys.stdin)['n_prompt'])")
[ "$n_prompt" = "$y1" ] || fail "the line's total $y1 is not the prompt's $n_prompt tokens"
echo "ok: the line's total is the prompt's $n_prompt tokens; the line is gone after the answer"

# ---- the REPL: its second question counts what the session already held as cached ---------------
tty_run r "$BIN/sil-chat -n 4 -t 0 --no-think"
wait_for r "Ctrl-D to quit." 10
$TM send-keys -t r -l "$(context r) what is this?"
$TM send-keys -t r Enter
wait_for r "reading the prompt: " 20
prompt_back r
$TM send-keys -t r -l "$(context s) and this?"
$TM send-keys -t r Enter
wait_for r " cached)" 20
line=$(pane r | grep "^reading the prompt: ") || fail "no progress line in the REPL"
echo "$line" | grep -qE '^reading the prompt: [0-9][0-9,]* / [0-9][0-9,]* tokens \([0-9],[0-9]{3} cached\)$' ||
    fail "REPL progress line: '$line'"
prompt_back r
! pane r | grep -q "reading the prompt" || { pane r; fail "the progress line is left in the REPL"; }
echo "ok: the REPL's second question: '$line', gone after the answer"

# ---- Ctrl-C while the prompt is read: the line goes, [cancelled] on a line of its own -----------
context b >"$T/b.txt"
tty_run b "$CHAT summarise <$T/b.txt"
wait_for b "reading the prompt: " 20
$TM send-keys -t b C-c
wait_for b "EXIT=130" 20
pane b | grep -qx "\[cancelled\]" || { pane b; fail "[cancelled] not on a line of its own"; }
! pane b | grep -q "reading the prompt" || { pane b; fail "the progress line is left after Ctrl-C"; }
echo "ok: Ctrl-C during the prompt: the line is erased, [cancelled] stands alone"

# ---- stderr into a file: no progress, on the terminal or in the file ----------------------------
context c >"$T/c.txt"
tty_run c "$CHAT summarise <$T/c.txt 2>$T/c.err"
seen=0
for _ in $(seq 100); do
    pane c | grep -q "reading the prompt" && seen=1
    pane c | grep -q "^EXIT=" && break
    sleep 0.1
done
pane c | grep -qx "EXIT=0" || { pane c; fail "sil-chat with stderr into a file did not end with 0"; }
[ $seen = 0 ] || fail "a progress line on the terminal with stderr into a file"
[ ! -s "$T/c.err" ] || fail "stderr into a file got: $(od -c "$T/c.err" | head -3)"
echo "ok: stderr into a file: no progress line, an empty file"

# ---- pipes: the answer only, no carriage return, nothing on stderr -------------------------------
context d >"$T/d.txt"
$CHAT summarise <"$T/d.txt" >"$T/d.out" 2>"$T/d.err" || fail "sil-chat into pipes"
[ ! -s "$T/d.err" ] || fail "stderr into a pipe got: $(head -c 200 "$T/d.err")"
! grep -q $'\r' "$T/d.out" || fail "a carriage return in the answer"
$CHAT --json summarise <"$T/d.txt" | python3 -c "
import json, sys
r = json.load(sys.stdin)
sys.exit(0 if open('$T/d.out').read() == r['text'] + ('' if r['text'].endswith('\n') else '\n') else 1)" ||
    fail "stdout holds more than the answer"
echo "ok: into pipes: the answer alone on stdout, nothing on stderr"

# ---- the Neovim plugin: the same figures as virtual text in the reply buffer, gone with the answer
if command -v nvim >/dev/null; then
    cat >"$T/nv.lua" <<'LUA'
local s = require('siliceo')
s.setup({ max_tokens = 4, temperature = 0, split = 'enew' })
local function main()
  local f = assert(io.open(os.getenv('NV_CONTEXT')))
  s.chat('summarise', f:read('*a'))
  f:close()
  local buf = vim.api.nvim_get_current_buf()
  assert(s.running(), 'no reply streaming after :SiliceoChat')
  local function mark()
    local m = vim.api.nvim_buf_get_extmarks(buf, s.progress_ns, 0, -1, { details = true })
    return m[1] and m[1][4].virt_text[1][1]
  end
  local first, second
  assert(vim.wait(20000, function() first = mark(); return first ~= nil end, 20), 'no progress shown')
  assert(vim.wait(20000, function() second = mark(); return second ~= first end, 20),
    'the progress did not move from ' .. first)
  local pat = '^reading the prompt: ([%d,]+) / ([%d,]+) tokens$'
  local x1, y1 = first:match(pat)
  local x2, y2 = (second or ''):match(pat)
  assert(x1 and x2, string.format('progress text: %q, then %q', first, tostring(second)))
  local n = function(v) return tonumber((v:gsub(',', ''))) end
  assert(n(x1) < n(y1) and n(x2) > n(x1) and y1 == y2 and y1:find(','),
    string.format('progress does not move: %q, then %q', first, second))
  assert(vim.wait(60000, function() return not s.running() end, 20), 'the reply did not end')
  assert(mark() == nil, 'the progress is still shown after the answer')
  assert(#vim.api.nvim_buf_get_extmarks(buf, s.progress_ns, 0, -1, {}) == 0, 'marks left')
  local text = table.concat(vim.api.nvim_buf_get_lines(buf, 0, -1, false), '\n')
  assert(not text:find('reading the prompt'), 'the progress went into the answer')
  local out = assert(io.open(os.getenv('NV_OUT'), 'w'))
  out:write(first .. '\n' .. second .. '\n')
  out:close()
end
LUA
    context e >"$T/e.txt" # words of its own: nothing of it is in the prefix cache
    NV_CONTEXT=$T/e.txt NV_OUT=$T/nv.res nvim_lua "$T/nv.lua" 120 ||
        fail "Neovim plugin progress: $(cat "$T/nv.lua.out")"
    echo "ok: the Neovim plugin shows '$(head -1 "$T/nv.res")', then '$(tail -1 "$T/nv.res")', gone with the answer"
else
    echo "skip: nvim not installed (the Neovim plugin's progress)"
fi
stop_daemon
