#!/usr/bin/env bash
# sil-eval tokenize mode as a user runs it: every reference vector through the CLI
# (shared/tools/check-tokenizer), the JSON shape, usage errors and a bad model file.
set -u
E=$SIL_BUILD/bin/sil-eval
V=$SHARED/refdata/tokenizer/qwen3-vocab.gguf
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# As lib.bash's need_refdata: a missing reference is a skip, but a failure under CI=true.
if [ ! -f "$V" ]; then
    case ${CI:-} in true | TRUE | True | 1) fail "reference data $V missing (CI=true)" ;; esac
    echo "skip: $V missing"
    exit 0
fi
if [ -x "$SHARED/tools/check-tokenizer" ]; then
    out=$("$SHARED/tools/check-tokenizer" "$E") || fail "check-tokenizer: $out"
    echo "$out"
fi

printf '<|im_start|>user\nhi<|im_end|>' >"$T/p.txt"
[ "$("$E" --model "$V" --tokenize-file "$T/p.txt" --parse-special --json)" = '{"ids": [151644, 872, 198, 6023, 151645]}' ] ||
    fail "--parse-special --json output"
[ "$("$E" --model="$V" --tokenize-file="$T/p.txt")" = "27 91 318 4906 91 29 872 198 6023 27 91 318 6213 91 29" ] ||
    fail "plain output without --parse-special: $("$E" --model="$V" --tokenize-file="$T/p.txt")"
: >"$T/empty.txt"
[ "$("$E" --model "$V" --tokenize-file "$T/empty.txt" --json)" = '{"ids": []}' ] || fail "empty file"
echo "ok: output formats, special tokens only with --parse-special, empty input"

grep -q -- --tokenize-file <<<"$("$E" --help)" || fail "--help lists --tokenize-file"
"$E" --version | grep -q '^sil-eval ' || fail "--version"
"$E" --version | grep -qE '^backends: cpu(, cuda \(sm_[0-9]+| \(built without CUDA\))' || fail "--version lists the backends"
"$E" --no-such-option >/dev/null 2>"$T/err"; [ $? = 2 ] || fail "unknown option exit status"
grep -q "unknown option '--no-such-option'" "$T/err" || fail "unknown option message: $(cat "$T/err")"
"$E" --model "$V" >/dev/null 2>"$T/err"; [ $? = 2 ] || fail "no mode exit status"
"$E" --model "$V" --tokenize-file >/dev/null 2>"$T/err"; [ $? = 2 ] || fail "missing value exit status"
printf 'GGUF\003\000\000\000garbage' >"$T/bad.gguf"
"$E" --model "$T/bad.gguf" --tokenize-file "$T/p.txt" >/dev/null 2>"$T/err"; [ $? = 1 ] || fail "bad model exit status"
grep -q "bad.gguf" "$T/err" || fail "bad model message names the file: $(cat "$T/err")"
"$E" --model "$V" --tokenize-file "$T/nope.txt" >/dev/null 2>"$T/err"; [ $? = 1 ] || fail "missing text exit status"
echo "ok: --help, --version, usage errors (2), bad files (1) with the file named"

# --passes: fresh sequences of one engine give the same tokens each pass; --vram-budget parsing
M=$SHARED/refdata/models/qwen35moe-tiny-Q4_K_M.gguf
if [ -f "$M" ]; then
    # --tokens: ids and inclusive ranges; a bad range is a usage error naming where
    "$E" --model "$M" --tokens 7,1..4,9 --logits none --json >"$T/rng.json" || fail "--tokens range"
    /usr/bin/python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['tokens']; assert t == [7, 1, 2, 3, 4, 9], t" \
        "$T/rng.json" || fail "--tokens 7,1..4,9 gave $(cat "$T/rng.json" | head -c 200)"
    for bad in 4..1 1.. 1..x 1...3 0..99999999 1.5; do
        "$E" --model "$M" --tokens "$bad" --logits none >/dev/null 2>"$T/err"
        rc=$?
        [ $rc = 2 ] || [ $rc = 1 ] || fail "--tokens $bad: exit $rc"
        grep -q "bad id list at '$bad'" "$T/err" || fail "--tokens $bad: $(cat "$T/err")"
    done
    echo "ok: --tokens takes ids and ranges A..B; bad ranges are refused with where"
    "$E" --model "$M" --tokens 1,2,3,4,5 --n-predict 6 --passes 3 --logits none --json \
        --ecache-slots 16 >"$T/passes.json" || fail "--passes run"
    "$E" --model "$M" --tokens 1,2,3,4,5 --n-predict 6 --logits none --json >"$T/one.json" ||
        fail "one pass run"
    /usr/bin/python3 - "$T/passes.json" "$T/one.json" <<'PY' || fail "--passes output"
import json, sys
d = json.load(open(sys.argv[1])); one = json.load(open(sys.argv[2]))
p = d["passes"]
assert len(p) == 3, p
assert d["greedy"] == one["greedy"], (d["greedy"], one["greedy"])
assert d["timings"]["prefill_tok_s"] == p[0]["prefill_tok_s"]
# the simulated cache starts empty: the first prefill only misses, a later pass hits
assert p[0]["prefill"]["hits"] == 0 and p[0]["prefill"]["misses"] > 0, p[0]
assert p[2]["prefill"]["hits"] > 0, p[2]
tot = sum(x[k]["hits"] + x[k]["misses"] for x in p for k in ("prefill", "decode"))
assert tot == d["ecache"]["hits"] + d["ecache"]["misses"], (tot, d["ecache"])
PY
    for bad in 8Q 0 -1G 8GG ''; do
        "$E" --model "$M" --tokens 1 --vram-budget "$bad" >/dev/null 2>"$T/err"
        [ $? = 2 ] || fail "--vram-budget '$bad' exit status"
        grep -q "vram-budget must be a size" "$T/err" || fail "--vram-budget '$bad': $(cat "$T/err")"
    done
    "$E" --model "$M" --tokens 1 --passes 0 >/dev/null 2>&1; [ $? = 2 ] || fail "--passes 0"
    # on the CPU backend a budget changes nothing
    "$E" --model "$M" --tokens 1,2,3 --vram-budget 512MiB --json >"$T/b.json" || fail "--vram-budget 512MiB"
    echo "ok: --passes (same tokens each pass, per-pass cache counters), --vram-budget parsing"

    # --host-budget: a size, auto or off; the JSON's host_tier after the run
    for bad in 8Q 0 -1G OFF ''; do
        "$E" --model "$M" --tokens 1 --host-budget "$bad" >/dev/null 2>"$T/err"
        [ $? = 2 ] || fail "--host-budget '$bad' exit status"
        grep -q "host-budget must be a size" "$T/err" || fail "--host-budget '$bad': $(cat "$T/err")"
    done
    for hb in off auto 64G; do
        "$E" --model "$M" --tokens 1,2,3 --n-predict 2 --logits none --host-budget "$hb" --json \
            >"$T/hb-$hb.json" || fail "--host-budget $hb"
    done
    "$E" --model "$M" --tokens 1,2,3 --n-predict 2 --logits none --json >"$T/hb-none.json" ||
        fail "run without --host-budget"
    /usr/bin/python3 - "$T" <<'PY' || fail "--host-budget output"
import json, sys
d = {k: json.load(open("%s/hb-%s.json" % (sys.argv[1], k))) for k in ("off", "auto", "64G", "none")}
keys = {"on", "full", "budget", "budget_from", "slots", "slot_bytes", "io", "hits", "misses",
        "bytes_read", "reads", "wait_s"}
for k, v in d.items():
    assert set(v["host_tier"]) == keys, (k, v["host_tier"])
    assert v["host_tier"]["full"] is False, (k, v["host_tier"])  # the CPU reads its mapping
    assert v["greedy"] == d["off"]["greedy"], (k, v["greedy"], d["off"]["greedy"])
# off: no tier; the tiny model's experts fit any budget here, so none is on
assert d["off"]["host_tier"]["on"] is False and d["off"]["host_tier"]["hits"] == 0, d["off"]
t = d["64G"]["host_tier"]
assert t["on"] is False and t["budget"] == 64 << 30 and t["budget_from"] == "host_budget", t
t = d["auto"]["host_tier"]
assert t["budget_from"] in ("MemAvailable", "cgroup memory.max", "unknown"), t
assert d["none"]["host_tier"]["budget_from"] == t["budget_from"], d["none"]  # auto is the default
# the one host budget: on the CPU the backbone and KV held, the experts whole where they fit
hb = d["64G"]["host_budget"]
assert hb["budget"] == 64 << 30 and hb["fixed"] > 0 and hb["host_tier"] is False, hb
assert hb["gave_way"] is False and hb["experts"] > 0, hb
assert d["off"]["host_budget"]["experts"] == 0, d["off"]  # off: the experts are not counted
PY
    echo "ok: --host-budget parsing, the same tokens with the tier off, auto or a budget"

    # --heat-map: the first run starts cold and saves the map; the next (a warm restart) loads
    # it and preloads its hottest experts, so its prefill hits where a cold one only misses; a
    # corrupt file is ignored with a warning and replaced; a map that cannot be saved fails
    H=$T/heat.bin
    hm() { "$E" --model "$M" --tokens 1,2,3,4,5,6,7,8 --n-predict 4 --logits none --json \
        --ecache-slots 16 --heat-map "$H" "$@"; }
    hm >"$T/h1.json" 2>"$T/h1.err" || fail "--heat-map first run: $(cat "$T/h1.err")"
    [ -s "$H" ] || fail "--heat-map: no map saved"
    hm >"$T/h2.json" 2>"$T/h2.err" || fail "--heat-map restart: $(cat "$T/h2.err")"
    grep -q "preloaded" "$T/h2.err" || fail "--heat-map restart: no log line: $(cat "$T/h2.err")"
    printf 'not a heat map at all, but long enough to pass for a header of one, nearly' >"$H"
    hm >"$T/h3.json" 2>"$T/h3.err" || fail "--heat-map over a corrupt file"
    grep -q "ignoring the expert heat map" "$T/h3.err" || fail "corrupt map: $(cat "$T/h3.err")"
    /usr/bin/python3 - "$T/h1.json" "$T/h2.json" "$T/h3.json" <<'PY' || fail "--heat-map output"
import json, sys
a, b, c = (json.load(open(f)) for f in sys.argv[1:4])
ha, hb, hc = a["heat_map"], b["heat_map"], c["heat_map"]
assert ha["loaded"] == "none" and ha["preloaded"] == 0 and ha["saved"], ha
assert hb["loaded"] == "loaded" and hb["hot"] > 0 and hb["saved"], hb
assert 0 < hb["preloaded"] <= 16 and hb["tokens"] >= 11, hb
assert a["passes"][0]["prefill"]["hits"] == 0, a["passes"][0]
assert b["passes"][0]["prefill"]["hits"] > 0, b["passes"][0]
assert b["greedy"] == a["greedy"], (a["greedy"], b["greedy"])
assert hc["loaded"] == "ignored" and hc["preloaded"] == 0 and hc["saved"], hc
assert c["passes"][0]["prefill"]["hits"] == 0, c["passes"][0]
PY
    hm >/dev/null 2>&1 || fail "--heat-map after the corrupt file was replaced"
    "$E" --model "$M" --tokens 1,2 --logits none --ecache-slots 16 --heat-map "$T/no/such/dir/h" \
        >/dev/null 2>"$T/h4.err"
    [ $? = 1 ] || fail "--heat-map unsavable: exit status"
    grep -q "not saved" "$T/h4.err" || fail "--heat-map unsavable: $(cat "$T/h4.err")"
    echo "ok: --heat-map (cold, then preloaded at a restart; corrupt ignored; unsavable fails)"
fi
