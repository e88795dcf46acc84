#!/usr/bin/env bash
# sil-batchbench --spec as a user runs it: with the model drafting for itself every draft of a
# chain is accepted, and a whole branch of a 2x3 token tree a step, and every stream's tokens are
# the plain decode's; the JSON's figures agree with each other; --spec mtp drafts with a model's
# MTP layer (plain decoding's tokens) and is an error on a model without one; a tree with it,
# stray or missing options are usage errors.
set -u
. "$(dirname "$0")/lib.bash"
set +e
BB=$SIL_BUILD/bin/sil-batchbench
MK=$SIL_BUILD/bin/sil-mkmodel
M=$SHARED/refdata/models
need_refdata "$M/qwen35moe-tiny-Q4_K_M.gguf"
need_refdata "$M/qwen3-tiny-Q8_0.gguf"
COMMON=(--threads 2 --streams 1,3 --prompt 8 --gen 20 --runs 2 --mib 16)

# check OUT MODE TREE ACCEPT: one plain and one spec line per (run, streams); the spec line's
# tokens are the plain decode's and its counts add up; ACCEPT all: every draft accepted (a tree:
# one whole branch a step)
check() {
    /usr/bin/python3 - "$@" <<'PY' || fail "$2: JSON"
import json, sys
path, mode, tree, accept = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
width, depth = map(int, tree.split("x"))
lines = [json.loads(l) for l in open(path)]
plain = [l for l in lines if "spec" not in l]
spec = [l for l in lines if "spec" in l]
assert len(plain) == 4 and len(spec) == 4, lines
for p, l in zip(plain, spec):
    assert (p["run"], p["streams"]) == (l["run"], l["streams"]), (p, l)
    s = l["spec"]
    assert s["mode"] == mode and s["tree"] == tree, s
    assert s["width"] == width and s["depth"] == depth, s
    assert (s["draft_model"] is None) == (mode == "mtp"), s
    assert s["identical"] is True, s
    assert s["emitted"] == 20 * l["streams"] and s["emitted"] == s["accepted"] + s["steps"], s
    assert s["accepted"] <= s["drafted"] <= s["steps"] * width * depth, s
    if s["drafted"]:
        assert abs(s["acceptance_rate"] - s["accepted"] / s["drafted"]) < 1e-4, s
    assert abs(s["accepted_per_step"] - s["accepted"] / s["steps"]) < 1e-4, s
    assert abs(s["tokens_per_step"] - s["emitted"] / s["steps"]) < 1e-4, s
    assert s["verify_step_ms"] > 0 and s["one_token_step_ms"] > 0, s
    assert abs(s["verify_vs_one_token"] - s["verify_step_ms"] / s["one_token_step_ms"]) < 1e-2 * s["verify_vs_one_token"] + 1e-3, s
    assert l["plain_decode_tok_s"] == p["decode_tok_s"] and l["decode_tok_s"] > 0, (p, l)
    assert abs(l["speedup"] - l["decode_tok_s"] / l["plain_decode_tok_s"]) < 1e-3 * l["speedup"] + 1e-4, l
    if accept == "all":
        assert s["steps"] == l["streams"] * -(-20 // (depth + 1)), s
        assert s["accepted"] > 0, s
        if width == 1:
            assert s["accepted"] == s["drafted"] and s["acceptance_rate"] == 1.0, s
        else:
            assert s["drafted"] > s["accepted"] and s["acceptance_rate"] < 1.0, s
    else:
        assert s["drafted"] > 0, s
print("%s %s: %d of %d drafts accepted, %.2f tokens a step, verify step %.3f ms vs one-token "
      "step %.3f ms" % (mode, tree, s["accepted"], s["drafted"], s["tokens_per_step"],
                        s["verify_step_ms"], s["one_token_step_ms"]))
PY
}

for a in qwen35moe-tiny-Q4_K_M qwen3-tiny-Q8_0; do
    "$BB" --model "$M/$a.gguf" "${COMMON[@]}" --spec draft --draft-model "$M/$a.gguf" \
        --spec-tree 1x3 >"$T/self.jsonl" 2>"$T/err" || fail "$a drafting for itself: $(cat "$T/err")"
    check "$T/self.jsonl" draft 1x3 all
    "$BB" --model "$M/$a.gguf" "${COMMON[@]}" --spec draft --draft-model "$M/$a.gguf" \
        --spec-tree 2x3 >"$T/tree.jsonl" 2>"$T/err" || fail "$a, a 2x3 tree: $(cat "$T/err")"
    check "$T/tree.jsonl" draft 2x3 all
done
echo "ok: the model drafting for itself: every draft of a chain, a whole branch of a 2x3 tree" \
    "accepted a step, the plain decode's tokens"

"$MK" --arch qwen35moe --mtp --vocab 512 --type q8_0 --quiet --out "$T/mtp.gguf" || fail "sil-mkmodel --mtp"
"$BB" --model "$T/mtp.gguf" "${COMMON[@]}" --spec mtp >"$T/mtp.jsonl" 2>"$T/err" ||
    fail "--spec mtp: $(cat "$T/err")"
check "$T/mtp.jsonl" mtp 1x4 any
"$BB" --model "$M/qwen3-tiny-Q8_0.gguf" "${COMMON[@]}" --spec mtp >/dev/null 2>"$T/err"
rc=$?
[ $rc = 1 ] || fail "exit $rc (want 1) for --spec mtp without an MTP layer"
grep -q "has no MTP layer" "$T/err" || fail "message: $(cat "$T/err")"
"$BB" --model "$M/qwen3-tiny-Q8_0.gguf" "${COMMON[@]}" --spec draft --draft-model "$T/mtp.gguf" \
    >/dev/null 2>"$T/err"
rc=$?
[ $rc = 1 ] || fail "exit $rc (want 1) for a draft of another vocabulary"
grep -q "draft model .*mtp.gguf: " "$T/err" || fail "message: $(cat "$T/err")"
echo "ok: --spec mtp drafts with the model's MTP layer; a model without one, another vocabulary: errors"

usage() { # expected-message args...
    local want=$1
    shift
    "$BB" --model "$M/qwen3-tiny-Q8_0.gguf" "$@" >/dev/null 2>"$T/err"
    local rc=$?
    [ $rc = 2 ] || fail "exit $rc (want 2) for $*"
    grep -q -- "$want" "$T/err" || fail "message for $*: $(cat "$T/err")"
}
D=(--spec draft --draft-model "$M/qwen3-tiny-Q8_0.gguf")
usage "the MTP layer drafts chains only; use 1x3" --spec mtp --spec-tree 2x3
usage "a tree has at most 64 rows" "${D[@]}" --spec-tree 8x8
usage "not WIDTHxDEPTH" "${D[@]}" --spec-tree 1x
usage "not WIDTHxDEPTH" "${D[@]}" --spec-tree x4
usage "depth at most" "${D[@]}" --spec-tree 1x65
usage "--draft-model goes with --spec draft, not mtp" "${D[@]}" --spec mtp
usage "--spec must be off, draft or mtp" --spec tree
usage "needs --draft-model" --spec draft
usage "need --spec draft or mtp" --draft-model "$M/qwen3-tiny-Q8_0.gguf"
usage "need --spec draft or mtp" --spec off --spec-tree 1x4
# --spec off is the plain benchmark, one line per (run, streams)
"$BB" --model "$M/qwen3-tiny-Q8_0.gguf" --threads 2 --streams 2 --gen 4 --runs 1 --mib 16 --spec off \
    >"$T/off.jsonl" 2>"$T/err" || fail "--spec off: $(cat "$T/err")"
[ "$(wc -l <"$T/off.jsonl")" = 1 ] && ! grep -q '"spec"' "$T/off.jsonl" || fail "--spec off: $(cat "$T/off.jsonl")"
echo "ok: a tree with --spec mtp, stray or missing options are usage errors; --spec off is the plain benchmark"
