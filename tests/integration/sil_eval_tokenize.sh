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

"$E" --help | grep -q -- --tokenize-file || fail "--help lists --tokenize-file"
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
