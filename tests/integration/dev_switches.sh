#!/usr/bin/env bash
# The developer switches have a page of their own: every SIL_* environment variable the C and CUDA
# sources read (and SILICEOD_TEST_HOOKS, CUDA_FORCE_PTX_JIT) is described in siliceo-dev(7), the
# page describes none that no source reads, and siliceod(8) describes none of them itself but
# points to the page.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$ROOT" || exit 1
DEV=man/siliceo-dev.7
[ -f "$DEV" ] || fail "no $DEV"

pat='(SIL_[A-Z0-9_]+|SILICEOD_TEST_HOOKS|CUDA_FORCE_PTX_JIT)'
grep -rhoE "\"$pat\"" daemon kernels client libproto bench \
    --include='*.c' --include='*.h' --include='*.cu' | tr -d '"' | sort -u >"$T/read"
[ "$(wc -l <"$T/read")" -ge 10 ] || fail "only $(wc -l <"$T/read") switches found in the sources"
# The names of the page's items (.It Ev A , B) and of siliceod(8)'s.
items() { sed -n 's/^\.It Ev //p' "$1" | tr ',' '\n' | tr -d ' ' | grep -xE "$pat" | sort -u; }
items "$DEV" >"$T/dev"
undocumented=$(comm -23 "$T/read" "$T/dev" | tr '\n' ' ')
stale=$(comm -13 "$T/read" "$T/dev" | tr '\n' ' ')
[ -z "$undocumented" ] || fail "read by the sources, not in $DEV: $undocumented"
[ -z "$stale" ] || fail "in $DEV, read by no source: $stale"
echo "ok: the $(wc -l <"$T/read") switches the sources read are the ones $DEV describes"

in8=$(items man/siliceod.8 | tr '\n' ' ')
[ -z "$in8" ] || fail "siliceod(8) still describes developer switches: $in8"
grep -q '^\.Xr siliceo-dev 7' man/siliceod.8 || fail "siliceod(8) does not point to siliceo-dev(7)"
echo "ok: siliceod(8) describes none of them and points to siliceo-dev(7)"
