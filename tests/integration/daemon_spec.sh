#!/usr/bin/env bash
# siliceod --spec draft: greedy answers identical token for token to a daemon without a draft
# model, on a hybrid MoE model drafting for itself and drafted by another quantization, and on an
# attention-only model; per-request spec (off, a depth; bad values are error 4); status and
# metrics carry the figures; a cancelled speculative request frees its sequences and KV, and 200
# sampled speculative requests (half of them disconnected) leave the heap as it was; bad
# settings (no draft model, a tree too large, a tree with MTP drafting, another vocabulary, mtp
# on a model without the layer) stop the daemon with a message. Token trees (spec_tree = 2x3,
# --spec-tree 2x3) give the answers of a daemon without speculation on an attention-only and a
# hybrid model. siliceod --spec mtp (spec = mtp): a sil-mkmodel --mtp model drafting with its own
# MTP layer gives the answers of a daemon without speculation.
. "$(dirname "$0")/lib.bash"
M=$SHARED/refdata/models
need_refdata "$M/qwen35moe-tiny-Q4_K_M.gguf" "$M/qwen35moe-tiny-F16.gguf" "$M/qwen3-tiny-Q8_0.gguf"
for pair in qwen35moe-tiny-Q4_K_M:qwen35moe-tiny-Q4_K_M:all qwen35moe-tiny-Q4_K_M:qwen35moe-tiny-F16:any \
    qwen3-tiny-Q8_0:qwen3-tiny-Q8_0:all; do
    IFS=: read -r target draft mode <<<"$pair"
    echo "== $target drafted by $draft"
    write_conf "threads = 2" "prefix_cache = off"
    start_daemon --model "$M/$target.gguf"
    python3 "$HERE/spec_tests.py" plain "$T/plain.json"
    stop_daemon
    write_conf "threads = 2" "prefix_cache = off" "spec = draft" "draft_model = $M/$draft.gguf"
    start_daemon --model "$M/$target.gguf" --spec-tree 1x4
    python3 "$HERE/spec_tests.py" spec "$T/plain.json" "$mode"
    if [ "$mode" = all ]; then
        python3 "$HERE/spec_tests.py" churn 200
        # sil-bench reports the daemon's speculative figures over its runs
        "$SIL_BUILD/bin/sil-bench" -p 8 -n 12 -r 2 -c 1 -o "$T/bench.json" >"$T/bench.out" ||
            fail "sil-bench: $(cat "$T/bench.out")"
        grep -q "^speculative decoding (1x4): .* drafts accepted (100.0%), .* verify step .* ms against" \
            "$T/bench.out" || fail "sil-bench output: $(cat "$T/bench.out")"
        python3 - "$T/bench.json" <<'PY' || fail "sil-bench JSON: spec figures"
import json, sys
d = json.load(open(sys.argv[1]))
names = {r["metric"] for r in d["results"]}
for m in ("spec_acceptance", "spec_tokens_per_step", "spec_accepted_per_step", "spec_verify_step",
          "spec_verify_vs_one"):
    assert m in names, (m, sorted(names))
acc = [r for r in d["results"] if r["metric"] == "spec_acceptance"][0]
assert acc["value"] == 1.0 and acc["config"] == "spec,draft,1x4", acc
PY
        echo "ok: sil-bench reports acceptance, tokens a step and the verify step's cost"
    fi
    stop_daemon
done

echo "== token trees"
for run in qwen3-tiny-Q8_0:qwen3-tiny-Q8_0:all:conf qwen35moe-tiny-Q4_K_M:qwen35moe-tiny-Q4_K_M:all:flag \
    qwen35moe-tiny-Q4_K_M:qwen35moe-tiny-F16:any:flag; do
    IFS=: read -r target draft mode how <<<"$run"
    echo "== $target drafted by $draft, a 2x3 tree ($how)"
    write_conf "threads = 2" "prefix_cache = off"
    start_daemon --model "$M/$target.gguf"
    python3 "$HERE/spec_tests.py" plain "$T/plain.json"
    stop_daemon
    if [ $how = conf ]; then
        write_conf "threads = 2" "prefix_cache = off" "spec = draft" "draft_model = $M/$draft.gguf" \
            "spec_tree = 2x3"
        start_daemon --model "$M/$target.gguf"
    else
        write_conf "threads = 2" "prefix_cache = off"
        start_daemon --model "$M/$target.gguf" --spec draft --draft-model "$M/$draft.gguf" --spec-tree 2x3
    fi
    python3 "$HERE/spec_tests.py" tree "$T/plain.json" 2x3 "$mode"
    stop_daemon
done
echo "ok: 2x3 trees: plain greedy's answers on qwen3 and qwen35moe"

echo "== a model's own MTP layer drafting"
"$SIL_BUILD/bin/sil-mkmodel" --arch qwen35moe --mtp --vocab 512 --type q8_0 --quiet --out "$T/mtp.gguf" ||
    fail "sil-mkmodel --mtp"
write_conf "threads = 2" "prefix_cache = off"
start_daemon --model "$T/mtp.gguf"
python3 "$HERE/spec_tests.py" plain "$T/plain.json"
stop_daemon
write_conf "threads = 2" "prefix_cache = off" "spec = mtp" "spec_tree = 1x3"
start_daemon --model "$T/mtp.gguf"
python3 "$HERE/spec_tests.py" mtp "$T/plain.json"
stop_daemon
write_conf "threads = 2" "prefix_cache = off"
start_daemon --model "$T/mtp.gguf" --spec mtp --spec-tree 1x3
python3 "$HERE/spec_tests.py" mtp "$T/plain.json"
stop_daemon
echo "ok: spec = mtp and --spec mtp: the MTP layer drafts, plain greedy's answers"

# bad settings: the daemon does not start, and says why
bad() { # expected-message flags...
    local want=$1
    shift
    set +e
    timeout 60 "$SIL_BUILD/bin/siliceod" --config "$T/siliceod.conf" --socket "$SILICEO_SOCKET" \
        --model "$M/qwen3-tiny-Q8_0.gguf" "$@" >"$T/bad.log" 2>&1
    local rc=$?
    set -e
    [ $rc != 0 ] || fail "siliceod $* started"
    grep -q -- "$want" "$T/bad.log" || fail "message for $*: $(cat "$T/bad.log")"
    echo "ok: $* refused: $want"
}
write_conf "threads = 2"
bad "needs a draft model" --spec draft
bad "a tree of 8x8 has more than 64 rows" --spec draft --draft-model "$M/qwen3-tiny-Q8_0.gguf" --spec-tree 8x8
bad "expected WIDTHxDEPTH" --spec draft --draft-model "$M/qwen3-tiny-Q8_0.gguf" --spec-tree 0x3
bad "depth outside" --spec draft --draft-model "$M/qwen3-tiny-Q8_0.gguf" --spec-tree 1x65
bad "expected WIDTHxDEPTH" --spec-tree 1x
bad "spec = mtp: .*qwen3-tiny-Q8_0.gguf has no MTP layer" --spec mtp
bad "expected off, draft or mtp" --spec yes
bad "cannot load the draft model" --spec draft --draft-model "$T/nope.gguf"
"$SIL_BUILD/bin/sil-mkmodel" --arch qwen3 --layers 1 --embd 64 --heads 2 --kv-heads 1 --head-dim 32 \
    --ffn 128 --vocab 600 --type q8_0 --quiet --out "$T/v600.gguf" || fail "sil-mkmodel"
bad "cannot draft for .*600 tokens" --spec draft --draft-model "$T/v600.gguf"
write_conf "threads = 2" "spec_tree = 9x9"
bad "spec_tree: a tree of 9x9 has more than 64 rows" --spec draft --draft-model "$M/qwen3-tiny-Q8_0.gguf"
write_conf "threads = 2" "spec_tree = 2x3"
bad "spec_tree = 2x3: the MTP layer drafts chains only" --model "$T/mtp.gguf" --spec mtp
"$SIL_BUILD/bin/siliceod" --help >"$T/help.txt" || fail "siliceod --help"
grep -q -- "--spec-tree WIDTHxDEPTH" "$T/help.txt" || fail "--help lists --spec-tree"
