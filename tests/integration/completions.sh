#!/usr/bin/env bash
# Bash completion for every tool built (clients, bench tools, siliceod): contrib/bash-completion
# holds a file for each, and completing "--" after the tool's name in bash offers every long
# option its --help lists.
. "$(dirname "$0")/lib.bash"
n=0
for b in "$SIL_BUILD"/bin/sil-* "$SIL_BUILD"/bin/siliceod; do
    [ -x "$b" ] || continue
    t=$(basename "$b")
    f=$ROOT/contrib/bash-completion/$t
    [ -f "$f" ] || fail "no bash completion for $t"
    help=$("$b" --help 2>&1 || true)
    want=$(printf '%s\n' "$help" | grep -oE '(^|[^[:alnum:]-])--[a-z][a-z0-9-]*' | grep -oE -- '--[a-z][a-z0-9-]*' |
        sort -u)
    got=$(bash -c '. "$1"; COMP_WORDS=("$2" --); COMP_CWORD=1; f=$(complete -p "$2" | sed -n "s/.*-F \([^ ]*\) .*/\1/p");
        "$f"; printf "%s\n" "${COMPREPLY[@]}"' _ "$f" "$t" | sort -u)
    missing=$(comm -23 <(printf '%s\n' "$want") <(printf '%s\n' "$got") | tr '\n' ' ')
    [ -z "${missing// /}" ] || fail "$t: the completion lacks $missing"
    n=$((n + 1))
done
[ "$n" -ge 8 ] || fail "only $n tools found under $SIL_BUILD/bin"
echo "ok: bash completion for $n tools, each offering every long option of its --help"
