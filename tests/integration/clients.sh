#!/usr/bin/env bash
# The clients against the real daemon, as a shell user meets them: finding the socket, a refused
# peer reading why, one-line answers to bad options, nothing to ask, Prometheus output read by
# Debian's prometheus_client parsers, sil-bench's checks and plot.
. "$(dirname "$0")/lib.bash"
BIN=$SIL_BUILD/bin
SOCK=$SILICEO_SOCKET
start_daemon --model "$MODEL"

# ---- bad options: one line, "try --help" -------------------------------------------------------
for p in sil-chat:2 sil-probe:3 sil-bench:2; do
    prog=${p%:*} want=${p#*:} rc=0
    "$BIN/$prog" --bogus >"$T/out" 2>"$T/err" || rc=$?
    [ "$rc" = "$want" ] || fail "$prog --bogus exited $rc, want $want"
    [ "$(wc -l <"$T/err")" = 1 ] || fail "$prog --bogus printed $(wc -l <"$T/err") lines: $(cat "$T/err")"
    grep -qx "$prog: unknown option '--bogus'; try '$prog --help'" "$T/err" || fail "$prog: $(cat "$T/err")"
    [ ! -s "$T/out" ] || fail "$prog --bogus wrote to stdout"
    rc=0
    "$BIN/$prog" --socket 2>"$T/err" || rc=$?
    grep -qx "$prog: option '--socket' needs an argument; try '$prog --help'" "$T/err" || fail "$prog: $(cat "$T/err")"
done
for prog in siliceod sil-openai; do
    rc=0
    "$BIN/$prog" --bogus >"$T/out" 2>"$T/err" || rc=$?
    [ "$rc" = 2 ] || fail "$prog --bogus exited $rc, want 2"
    [ "$(wc -l <"$T/err")" = 1 ] || fail "$prog --bogus printed $(wc -l <"$T/err") lines: $(cat "$T/err")"
    grep -q "try '$prog --help'" "$T/err" || fail "$prog: $(cat "$T/err")"
done
echo "ok: a bad option gets one line and 'try --help' from every client and siliceod"

# ---- nothing to ask ----------------------------------------------------------------------------
rc=0
"$BIN/sil-chat" </dev/null 2>"$T/err" || rc=$?
[ "$rc" = 2 ] || fail "sil-chat </dev/null exited $rc"
grep -q "nothing to ask" "$T/err" || fail "sil-chat </dev/null: $(cat "$T/err")"
rc=0
printf ' \n\t\n' | "$BIN/sil-chat" 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q "nothing to ask" "$T/err" || fail "blank stdin: $rc $(cat "$T/err")"
rc=0
"$BIN/sil-chat" "" </dev/null 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q "nothing to ask: the question is empty" "$T/err" || fail "sil-chat \"\": $rc $(cat "$T/err")"
rc=0
"$BIN/sil-chat" " " "	" </dev/null 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q "the question is empty" "$T/err" || fail "sil-chat of blanks: $rc $(cat "$T/err")"
echo "ok: sil-chat with an empty stdin and no question, or an empty question, says there is nothing to ask"

# ---- finding the socket ------------------------------------------------------------------------
# The per-user place, found through XDG_RUNTIME_DIR; for root it comes after the system socket.
mkdir -p "$T/xdg/siliceo"
ln -s "$SOCK" "$T/xdg/siliceo/siliceod.sock"
env -u SILICEO_SOCKET XDG_RUNTIME_DIR="$T/xdg" "$BIN/sil-probe" >"$T/out" || fail "probe via XDG_RUNTIME_DIR: $(cat "$T/out")"
echo "ok: without SILICEO_SOCKET the clients find the per-user socket"
rc=0
env -u SILICEO_SOCKET XDG_RUNTIME_DIR="$T/none" "$BIN/sil-chat" hi 2>"$T/err" || rc=$?
[ "$rc" = 1 ] || fail "sil-chat with no socket exited $rc"
grep -q "cannot connect to siliceod: tried .*$T/none/siliceo/siliceod.sock (No such file or directory)" "$T/err" ||
    fail "error does not name the per-user socket: $(cat "$T/err")"
grep -q "/run/siliceo/siliceod.sock (" "$T/err" || [ -S /run/siliceo/siliceod.sock ] ||
    fail "error does not name the system socket: $(cat "$T/err")"
[ -e /run/siliceo ] || grep -q "; no siliceod runs, neither yours nor the system's: 'siliceod --model FILE' starts one" "$T/err" ||
    fail "error does not say that no daemon runs: $(cat "$T/err")"
if command -v nvim >/dev/null; then
    (cd "$ROOT/contrib/nvim" && env -u SILICEO_SOCKET XDG_RUNTIME_DIR="$T/xdg" nvim --headless -u NONE \
        --cmd "set rtp+=." -c "lua local r, e = require('siliceo').request('status'); io.stdout:write(r and 'OK ' .. r.model.name or e)" \
        -c q >"$T/nvim.out" 2>&1) || true
    grep -q "^OK Qwen3 Tiny" "$T/nvim.out" || fail "Neovim plugin via XDG_RUNTIME_DIR: $(cat "$T/nvim.out")"
    (cd "$ROOT/contrib/nvim" && env -u SILICEO_SOCKET XDG_RUNTIME_DIR="$T/none" nvim --headless -u NONE \
        --cmd "set rtp+=." -c "lua local r, e = require('siliceo').request('status'); io.stdout:write(r and 'OK' or e)" \
        -c q >"$T/nvim.out" 2>&1) || true
    grep -q "cannot connect to siliceod: tried .*$T/none/siliceo/siliceod.sock" "$T/nvim.out" &&
        grep -q "/run/siliceo/siliceod.sock" "$T/nvim.out" || fail "Neovim plugin error: $(cat "$T/nvim.out")"
    echo "ok: the Neovim plugin finds the per-user socket and names every path it tried"
fi
# --socket and SILICEO_SOCKET still name the only socket tried.
rc=0
"$BIN/sil-probe" --socket "$T/nope.sock" >"$T/out" 2>&1 || rc=$?
[ "$rc" = 2 ] && grep -q "connect $T/nope.sock: No such file" "$T/out" && ! grep -q /run/siliceo "$T/out" ||
    fail "--socket: $(cat "$T/out")"
# A socket file nobody listens on (a daemon that stopped without removing it).
python3 -c "import socket,sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])" "$T/stale.sock"
rc=0
"$BIN/sil-chat" --socket "$T/stale.sock" hi 2>"$T/err" || rc=$?
[ "$rc" = 1 ] && grep -q "connect $T/stale.sock: Connection refused; $T/stale.sock is left from a siliceod that no longer runs" "$T/err" ||
    fail "stale socket: $rc $(cat "$T/err")"
echo "ok: the error names every socket tried and what it means; --socket is the only one tried when given"

# ---- a refused peer sees why (needs root to run a client as another user) --------------------------
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    NOBODY="setpriv --reuid=65534 --regid=65534 --clear-groups"
    chmod 755 "$T" "$(dirname "$SOCK")"
    chmod 666 "$SOCK"
    for i in $(seq 10); do
        rc=0
        $NOBODY "$BIN/sil-chat" --socket "$SOCK" hi 2>"$T/err" || rc=$?
        [ "$rc" = 1 ] || fail "refused sil-chat exited $rc"
        grep -q "permission denied: uid 65534 is not allowed to use this daemon (error 6, permission_denied)" "$T/err" ||
            fail "refused sil-chat (try $i): $(cat "$T/err")"
    done
    rc=0
    $NOBODY "$BIN/sil-probe" --socket "$SOCK" >"$T/out" || rc=$?
    [ "$rc" = 2 ] && grep -q "CRITICAL - status: permission denied: uid 65534" "$T/out" || fail "refused probe: $(cat "$T/out")"
    echo "ok: a uid outside the allow list reads the daemon's error 6 (10 of 10 tries)"
    chmod 660 "$SOCK"
    rc=0
    $NOBODY "$BIN/sil-chat" --socket "$SOCK" hi 2>"$T/err" || rc=$?
    # Group root lets in nobody but root: no group to join (the issue's hint said to join root).
    grep -q "Permission denied; $SOCK (owner root, group root, mode 0660) lets in no group: only root may use that daemon; run your own" "$T/err" &&
        grep -q "socket_group and allow_groups" "$T/err" && ! grep -q "join\|usermod" "$T/err" ||
        fail "EACCES hint, group root: $(cat "$T/err")"
    # A group the user is not in: named, with how to join it and the daemon's allow lists.
    G=$(getent group | awk -F: '$3 != 0 && $3 != 65534 && $4 !~ /nobody/ {print $1; exit}')
    chgrp "$G" "$SOCK"
    rc=0
    $NOBODY "$BIN/sil-chat" --socket "$SOCK" hi 2>"$T/err" || rc=$?
    [ "$rc" = 1 ] && grep -q "Permission denied; $SOCK belongs to group $G, which you are not in: an administrator adds you (usermod -aG $G nobody" "$T/err" &&
        grep -q "allow_users and allow_groups" "$T/err" || fail "EACCES hint, group $G: $(cat "$T/err")"
    # The socket's group may write but its mode lets no group in: the same as group root.
    chmod 600 "$SOCK"
    $NOBODY "$BIN/sil-chat" --socket "$SOCK" hi 2>"$T/err" || true
    grep -q "Permission denied; $SOCK (owner root, group $G, mode 0600) lets in no group: only root" "$T/err" ||
        fail "EACCES hint, mode 0600: $(cat "$T/err")"
    chgrp root "$SOCK"
    chmod 660 "$SOCK"
    echo "ok: EACCES names the group to join and the allow lists, or says no group gets in"
else
    echo "skip: refused-peer checks need root and setpriv"
fi

# ---- the answer budget: -n, then up to --grace more (64 by default); --grace 0: a hard cap -------
n_hard=$("$BIN/sil-chat" --json --no-think -n 3 --grace 0 -t 0 "hello there" |
    python3 -c "import json,sys; print(json.load(sys.stdin)['n_generated'])") || fail "sil-chat --grace 0"
n_soft=$("$BIN/sil-chat" --json --no-think -n 3 -t 0 "hello there" |
    python3 -c "import json,sys; print(json.load(sys.stdin)['n_generated'])") || fail "sil-chat -n 3"
[ "$n_hard" = 3 ] || fail "-n 3 --grace 0 generated $n_hard tokens"
[ "$n_soft" -ge 3 ] && [ "$n_soft" -le 67 ] || fail "-n 3 generated $n_soft tokens (3 to 67 expected)"
rc=0
"$BIN/sil-chat" --grace 65 hi 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q -- "--grace" "$T/err" || fail "--grace 65: $rc $(cat "$T/err")"
rc=0
"$BIN/sil-chat" -n abc hi 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q "'abc' is not an integer; try 'sil-chat --help'" "$T/err" ||
    fail "-n abc: $rc $(cat "$T/err")"
"$BIN/sil-chat" --help | head -1 | grep -q "^usage: sil-chat " || fail "sil-chat --help's first line"
grep -q "info: request [0-9]* of uid [0-9]*: length, [0-9]* prompt tokens ([0-9]* cached), 3 generated, queue" \
    "$T/daemon.log" || fail "no request line in the daemon's log: $(tail -5 "$T/daemon.log")"
! grep -q "hello there" "$T/daemon.log" || fail "the daemon's log holds prompt text"
echo "ok: the daemon logs a line a request, without its text"
echo "ok: -n 3 --grace 0 gives 3 tokens, -n 3 alone $n_soft (the grace to end a sentence), --grace 65 refused"

# ---- Prometheus output -------------------------------------------------------------------------
"$BIN/sil-chat" --no-think -n 2 -t 0 hi >/dev/null || fail "sil-chat hi"
"$BIN/sil-probe" --prom >"$T/metrics.prom" || fail "sil-probe --prom"
"$BIN/sil-probe" --openmetrics >"$T/metrics.om" || fail "sil-probe --openmetrics"
/usr/bin/python3 - "$T/metrics.prom" "$T/metrics.om" <<'EOF' || fail "Prometheus output rejected"
import sys
from prometheus_client.parser import text_string_to_metric_families as text_parse
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
prom, om = (open(p).read() for p in sys.argv[1:3])
for name, fams in (("text", list(text_parse(prom))), ("openmetrics", list(om_parse(om)))):
    names = [f.name for f in fams]
    assert len(names) == len(set(names)), (name, "duplicate families", names)
    for f in fams:
        assert f.type in ("gauge", "counter"), (name, f.name, f.type)
        assert f.documentation, (name, f.name, "no help")
        assert f.samples, (name, f.name, "no samples")
    by = {f.name: f for f in fams}
    assert by["siliceo_up"].samples[0].value == 1
    assert by["siliceo_connected_clients"].type == "gauge"
    assert by["siliceo_vram_weight_bytes"].samples[0].value == 0  # the CPU backend takes no VRAM
    assert by["siliceo_expert_copies"].type == "counter"
    assert by["siliceo_expert_copies"].samples[0].value == 0  # no expert slots on the CPU
    assert by["siliceo_expert_pinned_bytes"].samples[0].value == 0
    assert by["siliceo_clients"].type == "counter"
    assert by["siliceo_clients"].samples[0].name == "siliceo_clients_total"
    assert by["siliceo_requests"].samples[0].value >= 1, by["siliceo_requests"]
    print("ok: %s parser: %d families, each with help and type" % (name, len(fams)))
# Every family line carries # HELP and # TYPE in the text itself.
for text in (prom, om):
    helps = [l.split()[2] for l in text.splitlines() if l.startswith("# HELP ")]
    types = [l.split()[2] for l in text.splitlines() if l.startswith("# TYPE ")]
    assert helps == types and len(helps) > 20, (helps, types)
assert om.endswith("# EOF\n") and not prom.endswith("# EOF\n")
EOF
rc=0
"$BIN/sil-probe" --openmetrics --socket "$T/nope.sock" >"$T/down.om" 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q "nope.sock" "$T/err" || fail "failed scrape: $rc $(cat "$T/err")"
/usr/bin/python3 -c "
from prometheus_client.openmetrics.parser import text_string_to_metric_families as p
f = list(p(open('$T/down.om').read())); assert [x.name for x in f] == ['siliceo_up'] and f[0].samples[0].value == 0
" || fail "failed scrape output: $(cat "$T/down.om")"
echo "ok: a failed scrape is siliceo_up 0 (parsed) and the reason on stderr"
# The sample probe script's textfile output parses too, its own family included.
SIL_PROBE="$BIN/sil-probe" SIL_PROBE_PROM_FILE="$T/probe.prom" sh contrib/siliceo-probe.sh \
    >/dev/null 2>&1 || true
/usr/bin/python3 -c "
from prometheus_client.parser import text_string_to_metric_families as p
f = {x.name: x for x in p(open('$T/probe.prom').read())}
assert all(x.documentation for x in f.values()), 'a family without help'
assert f['siliceo_probe_status'].samples[0].value == 0, f['siliceo_probe_status']
" || fail "probe script output: $(cat "$T/probe.prom")"
echo "ok: contrib/siliceo-probe.sh writes a textfile that parses, every family with help"

# ---- sil-bench ---------------------------------------------------------------------------------
rc=0
(PATH=/nonexistent; "$BIN/sil-bench" -p 4 -n 2 -r 1 --plot "$T/p.png" >"$T/out" 2>"$T/err") || rc=$?
[ "$rc" = 1 ] && grep -q "needs gnuplot" "$T/err" && [ ! -s "$T/out" ] || fail "no gnuplot: $rc $(cat "$T/err" "$T/out")"
rc=0
"$BIN/sil-bench" -p 4 -n 2 -r 1 --plot "$T/nodir/p.png" >"$T/out" 2>"$T/err" || rc=$?
[ "$rc" = 1 ] && grep -q "cannot write it" "$T/err" && [ ! -s "$T/out" ] || fail "bad plot path: $rc $(cat "$T/err")"
echo "ok: sil-bench checks gnuplot and the plot path before any request"
# A stand-in gnuplot keeps the script; then the real one draws it.
mkdir -p "$T/fakebin"
printf '#!/bin/sh\ncat >"%s/plot.gp"\n' "$T" >"$T/fakebin/gnuplot"
chmod +x "$T/fakebin/gnuplot"
PATH="$T/fakebin:$PATH" "$BIN/sil-bench" -p 8 -n 4 -r 2 -c 1,2 -o "$T/bench.json" --plot "$T/p.png" >"$T/out" ||
    fail "sil-bench: $(cat "$T/out")"
grep -q "^set yrange \[0:\*\]" "$T/plot.gp" || fail "plot y axis does not start at 0"
grep -q "^set title .*median of 2 runs.*model Qwen3 Tiny, prompt 8 tokens (0 cached), [0-9to ]* generated per request" "$T/plot.gp" ||
    fail "plot title: $(grep title "$T/plot.gp")"
grep -q "aggregate: .*prefill included" "$T/plot.gp" || fail "plot does not say what it measured"
python3 -c "
import json; r = json.load(open('$T/bench.json'))['results']
bad = [x for x in r if x['runs'] != 2]
assert not bad and len(r) >= 6, bad
" || fail "runs in the JSON: $(cat "$T/bench.json")"
if command -v gnuplot >/dev/null; then
    "$BIN/sil-bench" -p 8 -n 4 -r 1 -c 1,2 --plot "$T/p.png" >"$T/out" || fail "sil-bench --plot: $(cat "$T/out")"
    [ "$(head -c 4 "$T/p.png" | od -An -c | tr -d ' ')" = "211PNG" ] || fail "not a PNG"
fi
echo "ok: sil-bench's plot starts at 0, names model and lengths, says what it measured; runs counts runs"
stop_daemon
