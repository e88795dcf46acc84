#!/usr/bin/env bash
# sil-eval --spec draft as a user runs it, on every reference architecture: speculative decoding
# gives plain greedy decoding's tokens, with the target drafting for itself (every draft
# accepted) and with other drafters (the F16 file drafted by its Q4_K_M quantization and back,
# the other architectures, a small seeded model of the same vocabulary from sil-mkmodel); the
# JSON's figures agree with each other; token trees (WIDTHxDEPTH) give the same tokens on every
# architecture (the hybrids' branches fork the recurrent state), and are a clear error with the
# MTP layer drafting; drafts of another vocabulary are a clear error. Acceptance figures are
# printed.
set -u
. "$(dirname "$0")/lib.bash"
set +e
E=$SIL_BUILD/bin/sil-eval
MK=$SIL_BUILD/bin/sil-mkmodel
M=$SHARED/refdata/models
ARCHS="qwen35moe-tiny-Q4_K_M qwen35-tiny-Q4_K_M qwen3moe-tiny-Q4_K_M qwen3-tiny-Q8_0"
for a in $ARCHS qwen35moe-tiny-F16; do need_refdata "$M/$a.gguf"; done
PROMPT=$(printf '<|im_start|>user\nHello, h')

# run TARGET DRAFT TREE OUT: the JSON of one run (exit status checked)
run() {
    "$E" --model "$1" --prompt "$PROMPT" --parse-special --n-predict 48 --logits none --threads 2 \
        --spec draft --draft-model "$2" --spec-tree "$3" --json >"$4" 2>"$T/err" ||
        fail "sil-eval --spec draft ($1 drafted by $2, $3): $(cat "$T/err")"
}

# check OUT NAME MODE: the spec tokens are plain's; the counts add up; MODE all: every draft
# accepted, some: some but not all, any: whatever
check() {
    /usr/bin/python3 - "$1" "$2" "$3" <<'PY' || fail "$2: spec output"
import json, sys
d = json.load(open(sys.argv[1])); name, mode = sys.argv[2], sys.argv[3]
s = d["spec"]
assert s["greedy"] == d["greedy"] and s["identical"] is True, (s["greedy"], d["greedy"])
assert len(s["greedy"]) == 48
assert s["emitted"] == 48 and s["emitted"] == s["accepted"] + s["steps"], s
assert s["accepted"] <= s["drafted"] <= s["steps"] * s["depth"] * s["width"], s
assert abs(s["acceptance_rate"] - s["accepted"] / s["drafted"]) < 1e-4, s
assert abs(s["accepted_per_step"] - s["accepted"] / s["steps"]) < 1e-4, s
assert abs(s["tokens_per_step"] - s["emitted"] / s["steps"]) < 1e-4, s
assert s["verify_step_ms"] > 0 and s["one_token_step_ms"] > 0 and s["verify_vs_one_token"] > 0, s
assert s["tree"] == "%dx%d" % (s["width"], s["depth"]), s
if mode == "all" and s["width"] > 1:  # a whole branch a step but near the end
    assert s["accepted"] >= s["steps"] * s["depth"] - s["depth"], s
elif mode == "all":
    assert s["accepted"] == s["drafted"] and s["acceptance_rate"] == 1.0, s
elif mode == "some":
    assert 0 < s["accepted"] < s["drafted"], s
print("%s: %d of %d drafts accepted (%.1f%%), %.2f tokens a step, verify step %.3f ms vs one-token "
      "step %.3f ms" % (name, s["accepted"], s["drafted"], 100 * s["acceptance_rate"],
                        s["tokens_per_step"], s["verify_step_ms"], s["one_token_step_ms"]))
PY
}

for a in $ARCHS; do
    run "$M/$a.gguf" "$M/$a.gguf" 1x4 "$T/self.json"
    check "$T/self.json" "$a drafting for itself (1x4)" all
done
run "$M/qwen3-tiny-Q8_0.gguf" "$M/qwen3-tiny-Q8_0.gguf" 1x1 "$T/d1.json"
check "$T/d1.json" "qwen3-tiny-Q8_0 drafting for itself (1x1)" all
run "$M/qwen35-tiny-Q4_K_M.gguf" "$M/qwen35-tiny-Q4_K_M.gguf" 1x16 "$T/d16.json"
check "$T/d16.json" "qwen35-tiny-Q4_K_M drafting for itself (1x16)" all
echo "ok: every architecture drafting for itself: every draft accepted, plain greedy's tokens"

# token trees: every architecture verifies them, with plain greedy's tokens
for a in $ARCHS; do
    for tree in 2x3 3x2 4x4; do
        run "$M/$a.gguf" "$M/$a.gguf" $tree "$T/tree.json"
        check "$T/tree.json" "$a drafting for itself ($tree)" all
    done
    case $a in
    qwen3moe*) o=qwen3-tiny-Q8_0 ;;
    qwen3-*) o=qwen3moe-tiny-Q4_K_M ;;
    qwen35moe*) o=qwen35-tiny-Q4_K_M ;;
    *) o=qwen35moe-tiny-Q4_K_M ;;
    esac
    run "$M/$a.gguf" "$M/$o.gguf" 2x3 "$T/tree.json"
    check "$T/tree.json" "$a drafted by $o (2x3)" any
done
run "$M/qwen35moe-tiny-F16.gguf" "$M/qwen35moe-tiny-Q4_K_M.gguf" 3x3 "$T/tree.json"
check "$T/tree.json" "qwen35moe-tiny-F16 drafted by its Q4_K_M (3x3)" some
echo "ok: token trees give plain greedy's tokens on every architecture"

run "$M/qwen35moe-tiny-F16.gguf" "$M/qwen35moe-tiny-Q4_K_M.gguf" 1x4 "$T/f16.json"
check "$T/f16.json" "qwen35moe-tiny-F16 drafted by its Q4_K_M" some
run "$M/qwen35moe-tiny-Q4_K_M.gguf" "$M/qwen35moe-tiny-F16.gguf" 1x3 "$T/q4.json"
check "$T/q4.json" "qwen35moe-tiny-Q4_K_M drafted by the F16" any
set -- $ARCHS
for a in $ARCHS; do
    shift
    other=${1:-qwen35moe-tiny-Q4_K_M}
    run "$M/$a.gguf" "$M/$other.gguf" 1x4 "$T/x.json"
    check "$T/x.json" "$a drafted by $other" any
done
# a seeded random model of the same (tiny) vocabulary
"$MK" --arch qwen3 --layers 1 --embd 64 --heads 2 --kv-heads 1 --head-dim 32 --ffn 128 \
    --vocab-from "$M/tiny-tokenizer.json" --seed 7 --type q8_0 --quiet --out "$T/small.gguf" ||
    fail "sil-mkmodel"
for a in qwen35moe-tiny-Q4_K_M qwen3-tiny-Q8_0; do
    run "$M/$a.gguf" "$T/small.gguf" 1x4 "$T/s.json"
    check "$T/s.json" "$a drafted by a 1-layer seeded model" any
done
echo "ok: other drafters: plain greedy's tokens whatever the acceptance"

# plain text output names the figures
"$E" --model "$M/qwen3-tiny-Q8_0.gguf" --tokens 1,2,3 --n-predict 8 --threads 2 --spec draft \
    --draft-model "$M/qwen3-tiny-Q8_0.gguf" >"$T/out.txt" 2>&1 || fail "text output: $(cat "$T/out.txt")"
grep -q "^spec (draft, 1x4): .* drafts accepted .*identical to plain greedy decoding" "$T/out.txt" ||
    fail "text output: $(cat "$T/out.txt")"

# errors: usage (2) and unusable drafts (1), each with a message
usage() { # expected-message args...
    local want=$1
    shift
    "$E" "$@" >/dev/null 2>"$T/err"
    local rc=$?
    [ $rc = 2 ] || fail "exit $rc (want 2) for $*"
    grep -q -- "$want" "$T/err" || fail "message for $*: $(cat "$T/err")"
}
B=(--model "$M/qwen3-tiny-Q8_0.gguf" --tokens 1,2,3 --n-predict 8)
D=(--spec draft --draft-model "$M/qwen3-tiny-Q8_0.gguf")
usage "at most 64 rows" "${B[@]}" "${D[@]}" --spec-tree 8x8
usage "not WIDTHxDEPTH" "${B[@]}" "${D[@]}" --spec-tree 1x
usage "not WIDTHxDEPTH" "${B[@]}" "${D[@]}" --spec-tree 1x0
usage "depth at most" "${B[@]}" "${D[@]}" --spec-tree 1x65
usage "--draft-model goes with --spec draft, not mtp" "${B[@]}" "${D[@]}" --spec mtp
usage "--spec must be off, draft, oracle or mtp" "${B[@]}" --spec tree
usage "needs --draft-model" "${B[@]}" --spec draft
usage "need --spec draft, oracle or mtp" "${B[@]}" --draft-model "$M/qwen3-tiny-Q8_0.gguf"
usage "need --spec draft, oracle or mtp" "${B[@]}" --spec off --spec-tree 1x4
usage "needs --n-predict" --model "$M/qwen3-tiny-Q8_0.gguf" --tokens 1,2,3 "${D[@]}"
usage "need a prompt" --model "$M/qwen3-tiny-Q8_0.gguf" "${D[@]}"
grep -q -- "--draft-model" <<<"$("$E" --help)" || fail "--help lists --draft-model"
grep -q -- "--spec-tree" <<<"$("$E" --help)" || fail "--help lists --spec-tree"

"$MK" --arch qwen3 --layers 1 --embd 64 --heads 2 --kv-heads 1 --head-dim 32 --ffn 128 --vocab 600 \
    --type q8_0 --quiet --out "$T/v600.gguf" || fail "sil-mkmodel"
"$MK" --arch qwen3 --layers 1 --embd 64 --heads 2 --kv-heads 1 --head-dim 32 --ffn 128 --vocab 512 \
    --type q8_0 --quiet --out "$T/v512.gguf" || fail "sil-mkmodel"
for v in "v600.gguf:has 600 tokens, the target's 512" "v512.gguf:token 257 differs" \
    "nope.gguf:cannot open"; do
    "$E" "${B[@]}" --spec draft --draft-model "$T/${v%%:*}" >/dev/null 2>"$T/err"
    rc=$?
    [ $rc = 1 ] || fail "exit $rc (want 1) for the draft ${v%%:*}"
    grep -q "draft model .*${v%%:*}: .*${v#*:}" "$T/err" || fail "message for ${v%%:*}: $(cat "$T/err")"
done
echo "ok: oversized trees, missing or stray options are usage errors; another vocabulary is an error"

# the model's own MTP layer drafts: plain greedy's tokens, acceptance reported; a model
# without one is an error
"$MK" --arch qwen35moe --mtp --vocab 512 --type q8_0 --quiet --out "$T/mtp.gguf" || fail "sil-mkmodel --mtp"
"$E" --model "$T/mtp.gguf" --tokens 5,6,7,8 --n-predict 24 --threads 2 --spec mtp --spec-tree 1x3 \
    --json >"$T/mtp.json" 2>"$T/err" || fail "--spec mtp: $(cat "$T/err")"
python3 - "$T/mtp.json" <<'PY' || fail "--spec mtp output"
import json, sys
s = json.load(open(sys.argv[1]))["spec"]
assert s["mode"] == "mtp" and s["draft_model"] is None, s
assert s["identical"] is True, s
assert s["drafted"] > 0 and 0 <= s["accepted"] <= s["drafted"], s
assert 0.0 <= s["acceptance_rate"] <= 1.0 and s["tokens_per_step"] >= 1.0, s
PY
"$E" "${B[@]}" --spec mtp >/dev/null 2>"$T/err"
rc=$?
[ $rc = 1 ] || fail "exit $rc (want 1) for --spec mtp without an MTP layer"
grep -q "has no MTP layer" "$T/err" || fail "message: $(cat "$T/err")"
"$E" --model "$T/mtp.gguf" --tokens 5,6,7,8 --n-predict 8 --threads 2 --spec mtp --spec-tree 2x3 \
    >/dev/null 2>"$T/err"
rc=$?
[ $rc = 1 ] || fail "exit $rc (want 1) for --spec mtp --spec-tree 2x3"
grep -q "token trees (width 2) need a draft model" "$T/err" || fail "message: $(cat "$T/err")"
echo "ok: --spec mtp drafts with the model's MTP layer, plain greedy's tokens"

# the oracle (a benchmark drafter that knows plain decoding's tokens): each draft right with
# probability --oracle-p; every p gives plain greedy's tokens, p = 1 accepts every draft and
# p = 0 none; trees, a p outside [0, 1] and --oracle-p without it are usage errors
for m in qwen3-tiny-Q8_0 qwen35moe-tiny-Q4_K_M; do
    for p in 0 0.5 1; do
        "$E" --model "$M/$m.gguf" --tokens 5,6,7,8 --n-predict 24 --threads 2 --spec oracle \
            --oracle-p $p --spec-tree 1x3 --json >"$T/o.json" 2>"$T/err" || fail "--spec oracle: $(cat "$T/err")"
        python3 - "$T/o.json" "$p" <<'PY' || fail "--spec oracle output, $m p=$p"
import json, sys
s, p = json.load(open(sys.argv[1]))["spec"], float(sys.argv[2])
assert s["mode"] == "oracle" and s["oracle_p"] == p and s["identical"] is True, s
assert s["drafted"] > 0, s
if p == 1.0:
    assert s["accepted"] == s["drafted"] and s["tokens_per_step"] > 3.5, s
if p == 0.0:
    assert s["accepted"] == 0 and s["tokens_per_step"] == 1.0, s
PY
    done
done
usage "drafts chains only" "${B[@]}" --spec oracle --spec-tree 2x2
usage "not a number in \\[0, 1\\]" "${B[@]}" --spec oracle --oracle-p 1.5
usage "--oracle-p goes with --spec oracle" "${B[@]}" --spec mtp --oracle-p 0.5
usage "--draft-model goes with --spec draft, not oracle" "${B[@]}" "${D[@]}" --spec oracle
echo "ok: --spec oracle: plain greedy's tokens at every p, all drafts at p = 1, none at p = 0"

# --probe-steps: at each step given, the row's logits one row at a time against the same row as
# the second of a two-row pass and against a second one-row run: the CPU's rows are the same
# bits in any batch, so both differences are 0; a step past the run is left out
"$E" --model "$M/qwen35moe-tiny-Q4_K_M.gguf" --tokens 5,6,7,8 --n-predict 12 --threads 2 \
    --spec oracle --oracle-p 0.5 --probe-steps 1,6,40 --json >"$T/p.json" 2>"$T/err" ||
    fail "--probe-steps: $(cat "$T/err")"
python3 - "$T/p.json" <<'PY' || fail "--probe-steps output: $(cat "$T/p.json")"
import json, sys
d = json.load(open(sys.argv[1]))
pr = d["probes"]
assert [p["step"] for p in pr] == [1, 6], pr
for p in pr:
    assert p["plain_margin"] > 0 and p["two_row_max_diff"] == 0 and p["rerun_max_diff"] == 0, p
PY
usage "--probe-steps goes with --spec" "${B[@]}" --probe-steps 3
usage "not a list of at most 16 step numbers" "${B[@]}" --spec oracle --probe-steps 3,x
usage "not a list of at most 16 step numbers" "${B[@]}" --spec oracle --probe-steps=-1
echo "ok: --probe-steps: one row at a time, two rows in a pass and a rerun agree on the CPU"
