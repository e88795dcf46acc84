#!/usr/bin/env bash
# `make deb` builds siliceod, siliceo-clients and libsiliceo-proto-dev (about 90 s on 2 cores:
# the packages build from a clean copy); lintian finds no error. Unpacked into a scratch root the
# packages line up: the units' ExecStart and config exist (the HTTP bridge's units with its binary
# in siliceo-clients, not enabled), systemd-analyze verify is silent,
# the sysusers.d user is User= and the socket owner, tmpfiles.d makes the socket's directory
# (the unit's RuntimeDirectory), the postinst makes the user before the directories, the config
# is a conffile, every binary has its man page, and a program builds with the -dev package.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SIL_BUILD=${SIL_BUILD:-$ROOT/build}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$ROOT" || exit 1

B=$(realpath --relative-to="$ROOT" "$SIL_BUILD")
if nm "$SIL_BUILD/lib/libsiliceo-proto.a" 2>/dev/null | grep -q __asan_; then
    echo "skip: $B is a sanitizer build (the packages do not use it)"
    exit 0
fi
if ! command -v dpkg-buildpackage >/dev/null || ! command -v dh >/dev/null; then
    echo "skip: dpkg-buildpackage or debhelper missing (make deps installs them)"
    exit 0
fi
git rev-parse --git-dir >/dev/null 2>&1 || fail "make deb packs the files git tracks: not a git tree"
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s B="$B" deb >"$T/log" 2>&1 ||
    fail "make deb: $(tail -n 30 "$T/log")"
D=$SIL_BUILD/deb
grep -q '^E:' "$D/lintian.log" && fail "lintian errors: $(grep '^E:' "$D/lintian.log")"
n=0
for f in "$D"/*.deb; do case $f in *-dbgsym_*) ;; *) n=$((n + 1)) ;; esac; done
echo "ok: make deb built $n packages; lintian: $(grep -c '^W:' "$D/lintian.log") warnings, no errors"
grep '^W:' "$D/lintian.log" | sed 's/^/    /'

R=$T/root
for p in siliceod siliceo-clients libsiliceo-proto-dev; do
    deb=$(ls "$D/${p}"_*.deb 2>/dev/null | head -n 1)
    [ -n "$deb" ] || fail "no package $p"
    dpkg -x "$deb" "$R" || fail "dpkg -x $deb"
    mkdir -p "$T/ctl/$p" && dpkg-deb -e "$deb" "$T/ctl/$p" || fail "dpkg-deb -e $deb"
done

U=$R/lib/systemd/system
key() { sed -n "s/^$2=//p" "$1"; }
[ -f "$U/siliceod.service" ] && [ -f "$U/siliceod.socket" ] || fail "units not in /lib/systemd/system"
exec_start=$(key "$U/siliceod.service" ExecStart)
bin=${exec_start%% *}
[ -x "$R$bin" ] || fail "ExecStart's $bin is not in the package"
conf=$(sed -n 's/.*--config \([^ ]*\).*/\1/p' <<<"$exec_start")
[ -f "$R$conf" ] || fail "ExecStart's config $conf is not in the package"
grep -qx "$conf" "$T/ctl/siliceod/conffiles" || fail "$conf is not a conffile"
"$R$bin" --version >/dev/null || fail "the packaged $bin --version"
echo "ok: ExecStart=$exec_start; both in the package, $conf a conffile"

# The HTTP bridge's units come with its binary in siliceo-clients, ExecStart naming where the
# package puts it; installed, neither enabled nor started (the bridge opens a TCP port).
dpkg-deb -c "$(ls "$D"/siliceo-clients_*.deb)" >"$T/clients.list" || fail "dpkg-deb -c siliceo-clients"
for u in sil-openai.service sil-openai.socket; do
    grep -q "/lib/systemd/system/$u\$" "$T/clients.list" || fail "$u is not in siliceo-clients"
done
o_exec=$(key "$U/sil-openai.service" ExecStart)
o_bin=${o_exec%% *}
[ "$o_bin" = /usr/bin/sil-openai ] && [ -x "$R$o_bin" ] ||
    fail "sil-openai.service runs '$o_bin', which the packages do not hold at that path"
grep -q "\.$o_bin\$" "$T/clients.list" ||
    fail "$o_bin is not in siliceo-clients with its unit"
[ "$(key "$U/sil-openai.service" User)" = "$(key "$U/siliceod.service" User)" ] ||
    fail "sil-openai.service's User= is not the daemon's"
cpost=$T/ctl/siliceo-clients/postinst
[ -f "$cpost" ] || fail "siliceo-clients has no postinst (systemd's unit state)"
grep -q "deb-systemd-invoke.*sil-openai" "$cpost" && fail "siliceo-clients' postinst starts the bridge"
# Not enabled: an enable runs only for units installed before (debian-installed), to keep the
# administrator's choice across upgrades.
n_en=$(grep -c "deb-systemd-helper enable 'sil-openai" "$cpost")
n_kept=$(grep -c "if deb-systemd-helper debian-installed 'sil-openai" "$cpost")
[ "$n_kept" -ge 1 ] && [ "$n_en" = "$n_kept" ] ||
    fail "siliceo-clients' postinst enables the bridge on a first install: $(grep -n sil-openai "$cpost")"
echo "ok: siliceo-clients holds sil-openai's units (ExecStart=$o_exec), installed but not enabled or started"

mkdir -p "$R/usr/bin"
cp /lib/systemd/system/*.target /lib/systemd/system/modprobe@.service "$U/"
[ -e "$R/bin" ] || ln -s usr/bin "$R/bin"
cp "$(type -P kill)" "$R/usr/bin/kill"
out=$(MANPATH=$R/usr/share/man systemd-analyze verify --root="$R" "$U/siliceod.service" \
    "$U/siliceod.socket" "$U/sil-openai.service" "$U/sil-openai.socket" 2>&1) ||
    fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify printed: $out"
echo "ok: systemd-analyze verify is silent on the packaged units"

systemd-sysusers --root="$R" >"$T/su.log" 2>&1 || fail "systemd-sysusers: $(cat "$T/su.log")"
user=$(key "$U/siliceod.service" User)
pw=$(grep "^$user:" "$R/etc/passwd") || fail "the package's sysusers.d makes no user $user"
for v in "$(key "$U/siliceod.service" Group)" "$(key "$U/siliceod.socket" SocketUser)" \
    "$(key "$U/siliceod.socket" SocketGroup)"; do
    [ "$v" = "$user" ] || fail "a unit names '$v' where User=$user"
done
listen=$(key "$U/siliceod.socket" ListenStream)
sockdir=$(dirname "$listen")
[ "/run/$(key "$U/siliceod.service" RuntimeDirectory)" = "$sockdir" ] ||
    fail "RuntimeDirectory does not hold $listen"
systemd-tmpfiles --root="$R" --create >"$T/tf.log" 2>&1 || fail "systemd-tmpfiles: $(cat "$T/tf.log")"
st=$(stat -c '%u:%g' "$R$sockdir") || fail "tmpfiles makes no $sockdir"
[ "$st" = "$(cut -d: -f3,4 <<<"$pw")" ] || fail "$sockdir owned by $st, not $user"
echo "ok: user $user is User= and owns the socket; tmpfiles.d makes $sockdir for it"

post=$T/ctl/siliceod/postinst
su_line=$(grep -n 'systemd-sysusers' "$post" | head -n 1 | cut -d: -f1)
tf_line=$(grep -n 'systemd-tmpfiles' "$post" | head -n 1 | cut -d: -f1)
start_line=$(grep -n "deb-systemd-invoke.*siliceod.socket" "$post" | head -n 1 | cut -d: -f1)
[ -n "$su_line" ] && [ -n "$tf_line" ] && [ -n "$start_line" ] ||
    fail "postinst lacks sysusers ($su_line), tmpfiles ($tf_line) or the socket start ($start_line)"
[ "$su_line" -lt "$tf_line" ] && [ "$tf_line" -lt "$start_line" ] ||
    fail "postinst order: sysusers $su_line, tmpfiles $tf_line, socket start $start_line"
grep -q "deb-systemd-invoke.*'siliceod.service'" "$post" && fail "postinst starts the service itself"
echo "ok: postinst makes the user, then the directories, then starts siliceod.socket (not the service)"

for b in "$R"/usr/bin/* "$R"/usr/sbin/*; do
    n=$(basename "$b")
    [ "$n" = kill ] && continue
    ls "$R"/usr/share/man/man[18]/"$n".[18].gz >/dev/null 2>&1 || fail "no man page for $n"
done
for c in contrib/bash-completion/*; do
    [ -f "$R/usr/share/bash-completion/completions/$(basename "$c")" ] ||
        fail "completion $(basename "$c") not packaged"
done
for m in man/*.[1-8]; do
    s=${m##*.}
    [ -f "$R/usr/share/man/man$s/$(basename "$m").gz" ] || fail "$m is in no package"
done
echo "ok: every packaged binary has its man page; every page of man/ and completions packaged"

ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
export PKG_CONFIG_PATH=$R/usr/lib/$ma/pkgconfig PKG_CONFIG_SYSROOT_DIR=$R
printf '#include <siliceo-proto.h>\nint main(void) { return sil_rpc_code_name(SIL_RPC_E_PARSE) ? 0 : 1; }\n' >"$T/p.c"
# shellcheck disable=SC2046 # the flags are words
${CC:-cc} -o "$T/p" "$T/p.c" $(pkg-config --cflags --libs siliceo-proto) >"$T/cc.log" 2>&1 ||
    fail "build against libsiliceo-proto-dev: $(cat "$T/cc.log")"
"$T/p" || fail "the program built against libsiliceo-proto-dev exited $?"
echo "ok: a program builds with pkg-config against libsiliceo-proto-dev (/usr/lib/$ma) and runs"
