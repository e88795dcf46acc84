#!/usr/bin/env bash
# `make install DESTDIR=... PREFIX=/usr` puts every binary, libsiliceo-proto.a, siliceo-proto.h,
# the .pc file (naming PREFIX) and the man pages in place; a C program built with
# `pkg-config --cflags --libs siliceo-proto` against that tree links and runs. Every binary has a
# man page, answers --help and --version, and names the same long options as its man page.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SIL_BUILD=${SIL_BUILD:-$ROOT/build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$ROOT"

# The build make check just made, named as the Makefile names it; a nested make, not a sub-make
# of the caller's (no jobserver to inherit). A sanitizer build ($B/asan) is no install tree: make
# would relink its binaries without the sanitizer runtime.
B=$(realpath --relative-to="$ROOT" "$SIL_BUILD")
if nm "$SIL_BUILD/lib/libsiliceo-proto.a" 2>/dev/null | grep -q __asan_; then
    echo "skip: $B is a sanitizer build"
    exit 0
fi
D=$T/root
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s B="$B" install DESTDIR="$D" PREFIX=/usr \
    >"$T/log" 2>&1 ||
    fail "make install: $(tail -n 20 "$T/log")"

bins=()
for b in "$SIL_BUILD"/bin/*; do [ -x "$b" ] && bins+=("$(basename "$b")"); done
[ ${#bins[@]} -ge 4 ] || fail "only ${#bins[@]} binaries in $SIL_BUILD/bin"
for b in "${bins[@]}"; do
    [ "$b" = siliceod ] && dir=sbin || dir=bin
    [ -x "$D/usr/$dir/$b" ] || fail "$b not installed in /usr/$dir"
    man=$(ls "$D"/usr/share/man/man[1-8]/"$b".[1-8] 2>/dev/null | head -n 1)
    [ -n "$man" ] || fail "no man page installed for $b"
done
[ -f "$D/usr/lib/libsiliceo-proto.a" ] || fail "libsiliceo-proto.a not in /usr/lib"
[ -f "$D/usr/include/siliceo-proto.h" ] || fail "siliceo-proto.h not in /usr/include"
pc=$D/usr/lib/pkgconfig/siliceo-proto.pc
[ -f "$pc" ] || fail "siliceo-proto.pc not in /usr/lib/pkgconfig"
grep -qx 'prefix=/usr' "$pc" || fail "the .pc does not name PREFIX=/usr: $(head -n 3 "$pc")"
for m in man/*.[1-8]; do
    s=${m##*.}
    [ -f "$D/usr/share/man/man$s/$(basename "$m")" ] || fail "$m not installed in man$s"
done
echo "ok: ${#bins[@]} binaries, library, header, .pc and man pages installed under DESTDIR"

# A failed install command stops make, even in the middle of a line that installs many files: a
# directory where sil-chat (not the last client) goes, and nothing after that line is installed.
D2=$T/broken
mkdir -p "$D2/usr/bin/sil-chat/x"
if env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s B="$B" install DESTDIR="$D2" PREFIX=/usr \
    >"$T/log2" 2>&1; then
    fail "make install succeeded with sil-chat's place taken by a directory"
fi
[ ! -e "$D2/usr/lib/libsiliceo-proto.a" ] || fail "make install went on after a failed install"
echo "ok: a failed install command fails make install at once"

export PKG_CONFIG_PATH=$D/usr/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$D
[ "$(pkg-config --modversion siliceo-proto)" = "$(sed -n 's/^VERSION := //p' Makefile)" ] ||
    fail "pkg-config --modversion: $(pkg-config --modversion siliceo-proto 2>&1)"
cat >"$T/p.c" <<'C'
#include <siliceo-proto.h>
#include <stdio.h>

/* Packs a request, unpacks it again, prints what came back. */
int main(void)
{
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 0);
    msgpack_packer *pk = sil_rpc_begin_request(&b, 7, "status");
    msgpack_pack_map(pk, 1);
    sil_rpc_kv_str(pk, "x", "y");
    if (sil_rpc_end(&b) != 0)
        return 1;
    struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(0, 0);
    struct sil_rpc_error e = {0};
    struct sil_rpc_msg m;
    if (!u || sil_rpc_unpacker_feed(u, sil_rpc_buf_head(&b), sil_rpc_buf_size(&b), &e) != 0 ||
        sil_rpc_unpacker_next(u, &m, &e) != 1)
        return 1;
    char x[8];
    printf("%s %u %s %s\n", m.method, m.msgid, sil_rpc_code_name(SIL_RPC_E_PARSE),
           sil_rpc_map_str(m.params, "x", x, sizeof(x), "?"));
    sil_rpc_msg_release(&m);
    sil_rpc_unpacker_free(u);
    sil_rpc_buf_free(&b);
    return 0;
}
C
# shellcheck disable=SC2046
${CC:-cc} -std=c11 -Wall -Werror -o "$T/p" "$T/p.c" $(pkg-config --cflags --libs siliceo-proto) \
    >"$T/cc.log" 2>&1 || fail "compile with pkg-config flags: $(cat "$T/cc.log")"
out=$("$T/p") || fail "the program exited $?"
[ "$out" = "status 7 parse_error y" ] || fail "the program printed '$out'"
echo "ok: a program built with pkg-config --cflags --libs siliceo-proto links and runs"

# Every binary: --help and --version exit 0; the long options of --help and of the man page agree
# (--help and --version themselves aside: pages need not list them).
opts() { grep -oE -- '--[a-z][a-z0-9-]*' | grep -vxE -- '--(help|version)' | sort -u; }
for b in "${bins[@]}"; do
    exe=$SIL_BUILD/bin/$b
    "$exe" --help >"$T/help" 2>&1 || fail "$b --help exited $?"
    v=$("$exe" --version 2>&1) || fail "$b --version exited $?"
    case $v in "$b "*) ;; *) fail "$b --version printed '$v'" ;; esac
    man=$(ls man/"$b".[1-8])
    mandoc -Tascii "$man" | sed 's/.\x08//g' | opts >"$T/man.opts"
    opts <"$T/help" >"$T/help.opts"
    only_help=$(comm -23 "$T/help.opts" "$T/man.opts" | tr '\n' ' ')
    only_man=$(comm -13 "$T/help.opts" "$T/man.opts" | tr '\n' ' ')
    [ -z "$only_help$only_man" ] ||
        fail "$b: in --help only: [$only_help] in $man only: [$only_man]"
done
echo "ok: every binary has --help, --version and a man page naming the same options"

env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s B="$B" uninstall DESTDIR="$D" PREFIX=/usr \
    >"$T/log3" 2>&1 || fail "make uninstall: $(tail -n 20 "$T/log3")"
left=$(cd "$D" && find . ! -type d | head -n 5)
[ -z "$left" ] || fail "make uninstall left files: $left"
echo "ok: make uninstall removes every file make install put there"
