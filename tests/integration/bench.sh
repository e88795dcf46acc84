#!/usr/bin/env bash
# sil-bench as a user runs it against the real daemon: prompts exactly as long as asked (the
# daemon's own count in its log), a fresh prompt per request so the prefix cache never passes for
# prefill, --reuse-prompt filed as cold then cached with the cache hit in the JSON, the plot's
# title from the lengths measured, and a run the context cannot hold refused before it starts.
. "$(dirname "$0")/lib.bash"
BIN=$SIL_BUILD/bin
start_daemon --model "$MODEL" --context 512

prefix_hits() {
    python3 -c "import siltest; r, _ = siltest.Client().ok('status'); print(r['prefix_cache']['hits'])"
}
# Each request's "N prompt tokens (K cached)" from the daemon's log, since line $1.
logged() { tail -n +"$1" "$T/daemon.log" | grep -o "[0-9]* prompt tokens ([0-9]* cached)" || true; }

# ---- exact prompt lengths, cold every time -------------------------------------------------------
for p in 1 65 200; do
    from=$(($(wc -l <"$T/daemon.log") + 1))
    hits0=$(prefix_hits)
    "$BIN/sil-bench" -p "$p" -n 4 -r 3 -c 1,2 -o "$T/cold.json" >"$T/out" || fail "sil-bench -p $p: $(cat "$T/out")"
    # 3 runs at concurrency 1 and 3 at 2: 9 requests, each of exactly p tokens, none from a cache
    [ "$(logged "$from" | grep -c .)" = 9 ] || fail "-p $p: the daemon logged $(logged "$from" | grep -c .) requests, want 9"
    bad=$(logged "$from" | grep -vx "$p prompt tokens (0 cached)" || true)
    [ -z "$bad" ] || fail "-p $p: the daemon counted: $bad"
    [ "$(prefix_hits)" = "$hits0" ] || fail "-p $p: the prefix cache was hit ($hits0 -> $(prefix_hits))"
    python3 - "$T/cold.json" "$p" <<'EOF' || fail "-p $p JSON: $(cat "$T/cold.json")"
import json, sys
r, p = json.load(open(sys.argv[1]))["results"], int(sys.argv[2])
assert r and all(x["config"].endswith(",prefix=cold") for x in r), [x["config"] for x in r]
by = {(x["metric"], x["config"]): x for x in r}
for c in (1, 2):
    cfg = "prompt=%d,gen=4,concurrency=%d,prefix=cold" % (p, c)
    pt, ct = by[("prompt_tokens", cfg)], by[("cached_tokens", cfg)]
    assert pt["min"] == pt["max"] == p and pt["runs"] == 3, pt
    assert ct["max"] == 0 and ct["runs"] == 3, ct
    g = by[("generated_tokens", cfg)]
    assert 1 <= g["min"] <= g["max"] <= 4, g
assert by[("prefill_tok_s", "prompt=%d,gen=4,concurrency=1,prefix=cold" % p)]["value"] > 0
EOF
done
echo "ok: -p N sends exactly N prompt tokens (the daemon's count), a fresh prompt per request: no cache hit"

# ---- --reuse-prompt: the first run cold, the others cached, apart ----------------------------------
from=$(($(wc -l <"$T/daemon.log") + 1))
"$BIN/sil-bench" -p 200 -n 4 -r 3 --reuse-prompt -o "$T/warm.json" >"$T/out" || fail "--reuse-prompt: $(cat "$T/out")"
[ "$(logged "$from" | head -1)" = "200 prompt tokens (0 cached)" ] || fail "first run: $(logged "$from")"
[ "$(logged "$from" | tail -n +2 | grep -c "^200 prompt tokens (1[0-9][0-9] cached)")" = 2 ] ||
    fail "runs 2-3 did not reuse the prompt: $(logged "$from")"
grep -q "^concurrency 1 run 1 (cold):" "$T/out" && grep -q "^concurrency 1 run 3 (cached):" "$T/out" ||
    fail "runs not labelled cold/cached: $(cat "$T/out")"
python3 - "$T/warm.json" <<'EOF' || fail "--reuse-prompt JSON: $(cat "$T/warm.json")"
import json, sys
r = json.load(open(sys.argv[1]))["results"]
by = {(x["metric"], x["config"].rsplit(",", 1)[1]): x for x in r}
cold, warm = "prefix=cold", "prefix=cached"
for m in ("ttft_ms", "prefill_tok_s", "cached_tokens", "prompt_tokens"):
    assert by[(m, cold)]["runs"] == 1 and by[(m, warm)]["runs"] == 2, m
assert by[("cached_tokens", cold)]["value"] == 0
assert 100 <= by[("cached_tokens", warm)]["min"] < 200, by[("cached_tokens", warm)]
assert by[("prompt_tokens", warm)]["value"] == 200
EOF
echo "ok: --reuse-prompt files run 1 as cold and runs 2-3 as cached, the tokens reused in the JSON"

# ---- the plot's title: lengths as measured ---------------------------------------------------------
mkdir -p "$T/fakebin"
printf '#!/bin/sh\ncat >"%s/plot.gp"\n' "$T" >"$T/fakebin/gnuplot"
chmod +x "$T/fakebin/gnuplot"
# A long budget: the tiny model ends some answers early, and the title must say what was generated.
PATH="$T/fakebin:$PATH" "$BIN/sil-bench" -p 5 -n 300 -r 12 -o "$T/plot.json" --plot "$T/p.png" >"$T/out" ||
    fail "sil-bench --plot: $(cat "$T/out")"
python3 - "$T/plot.json" "$T/plot.gp" "$T/out" <<'EOF' || fail "plot title: $(grep title "$T/plot.gp")"
import json, re, sys
r = json.load(open(sys.argv[1]))["results"]
g = [x for x in r if x["metric"] == "generated_tokens"]
lo, hi = min(x["min"] for x in g), max(x["max"] for x in g)
want = "%d" % lo if lo == hi else "%d to %d" % (lo, hi)
title = [l for l in open(sys.argv[2]) if l.startswith("set title")][0]
assert "prompt 5 tokens (0 cached), %s generated per request" % want in title, (title, want)
assert "a fresh prompt per request" in title, title
out = open(sys.argv[3]).read()
assert ("note: the model ended" in out) == (lo < 300), out
print("measured: %s generated per request" % want)
EOF
echo "ok: the plot's title gives the prompt, cached and generated lengths as measured"

# ---- what cannot run is refused before the first request --------------------------------------------
from=$(($(wc -l <"$T/daemon.log") + 1))
rc=0
"$BIN/sil-bench" -p 500 -n 20 -r 1 >"$T/out" 2>"$T/err" || rc=$?
[ "$rc" = 1 ] && grep -qx "sil-bench: a prompt of 500 tokens plus 20 generated needs 520 positions; the daemon's context is 512" "$T/err" ||
    fail "over the context: $rc $(cat "$T/err")"
[ -z "$(logged "$from")" ] || fail "a request was sent: $(logged "$from")"
rc=0
"$BIN/sil-bench" --reuse-prompt --protocol-overhead >"$T/out" 2>"$T/err" || rc=$?
[ "$rc" = 2 ] && grep -q "reuse-prompt is for generation" "$T/err" || fail "--reuse-prompt --protocol-overhead: $rc $(cat "$T/err")"
grep -q -- "--reuse-prompt" <<<"$("$BIN/sil-bench" --help)" || fail "--help lacks --reuse-prompt"
echo "ok: a run the context cannot hold is refused with the figures, before any request"
stop_daemon
