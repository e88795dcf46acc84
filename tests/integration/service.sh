#!/usr/bin/env bash
# `make install-service DESTDIR=R PREFIX=/usr` gives a root where systemd accepts the units as
# they are (siliceod's and the HTTP bridge's, each ExecStart naming the installed binary):
# `systemd-analyze verify` prints nothing, `systemd-analyze security --offline=true`
# scores siliceod.service at most 1.0, ExecStart and the config exist, the sysusers.d user is the
# unit's User= and socket owner, tmpfiles.d makes the socket's directory for that user as the
# unit's RuntimeDirectory (kept across restarts), and the installed config loads in the real
# daemon, whose syscalls the unit's SystemCallFilter= all allows; behind a held listener (as the
# socket unit holds it) a restart keeps the socket. A second install keeps an edited config;
# uninstall removes the rest.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SIL_BUILD=${SIL_BUILD:-$ROOT/build}
T=$(mktemp -d)
DPID=
cleanup() {
    if [ -n "$DPID" ]; then kill -KILL "$DPID" 2>/dev/null || true; fi
    rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
cd "$ROOT" || exit 1
export PYTHONPATH=$ROOT/tests/integration${PYTHONPATH:+:$PYTHONPATH}

# As install.sh: a nested make of the build make check made; a sanitizer build is no install tree.
B=$(realpath --relative-to="$ROOT" "$SIL_BUILD")
if nm "$SIL_BUILD/lib/libsiliceo-proto.a" 2>/dev/null | grep -q __asan_; then
    echo "skip: $B is a sanitizer build"
    exit 0
fi
for tool in systemd-analyze systemd-sysusers systemd-tmpfiles; do
    command -v $tool >/dev/null || fail "$tool missing (make deps installs systemd)"
done
R=$T/root
mk() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s B="$B" PREFIX=/usr DESTDIR="$R" "$@"; }
mk install-service >"$T/log" 2>&1 || fail "make install-service: $(tail -n 20 "$T/log")"

U=$R/usr/lib/systemd/system
for f in "$U/siliceod.service" "$U/siliceod.socket" "$U/sil-openai.service" "$U/sil-openai.socket" \
    "$R/usr/lib/sysusers.d/siliceo.conf" \
    "$R/usr/lib/tmpfiles.d/siliceo.conf" "$R/etc/siliceo/siliceod.conf" \
    "$R/usr/share/siliceo/siliceo-probe.sh" \
    "$R/usr/share/nvim/site/pack/siliceo/opt/siliceo/plugin/siliceo.lua" \
    "$R/usr/share/nvim/site/pack/siliceo/opt/siliceo/lua/siliceo/init.lua"; do
    [ -f "$f" ] || fail "not installed: ${f#"$R"}"
done
for c in contrib/bash-completion/*; do
    [ -f "$R/usr/share/bash-completion/completions/$(basename "$c")" ] ||
        fail "completion $(basename "$c") not installed"
done
[ -x "$R/usr/share/siliceo/siliceo-probe.sh" ] || fail "the probe script is not executable"
for u in siliceod sil-openai; do
    grep -q '@[A-Z]*@' "$U/$u.service" && fail "placeholder left in $u.service: $(grep '@' "$U/$u.service")"
done
echo "ok: units, sysusers.d, tmpfiles.d, config, completions, Neovim plugin, probe script installed"

# The values of KEY= in a unit (every line, in order).
key() { sed -n "s/^$2=//p" "$1"; }
exec_start=$(key "$U/siliceod.service" ExecStart)
bin=${exec_start%% *}
[ "$bin" = /usr/sbin/siliceod ] || fail "ExecStart runs '$bin', not /usr/sbin/siliceod"
[ -x "$R$bin" ] || fail "ExecStart's $bin is not installed"
conf=$(sed -n 's/.*--config \([^ ]*\).*/\1/p' <<<"$exec_start")
[ "$conf" = /etc/siliceo/siliceod.conf ] && [ -f "$R$conf" ] || fail "ExecStart's config '$conf'"
echo "ok: ExecStart=$exec_start, both paths installed"
# The bridge's unit runs the bridge where PREFIX put it, with arguments it takes (--help after
# them exits 0 only when they parse).
o_exec=$(key "$U/sil-openai.service" ExecStart)
o_bin=${o_exec%% *}
[ "$o_bin" = /usr/bin/sil-openai ] || fail "sil-openai.service runs '$o_bin', not /usr/bin/sil-openai"
[ -x "$R$o_bin" ] || fail "sil-openai.service's $o_bin is not installed"
read -ra o_args <<<"${o_exec#* }"
"$R$o_bin" "${o_args[@]}" --help >/dev/null 2>"$T/o.err" || fail "$o_exec --help: $(cat "$T/o.err")"
echo "ok: sil-openai.service: ExecStart=$o_exec, installed, its arguments accepted"

# verify needs what a real root has around the units: the targets they are ordered against,
# ExecReload's kill and the Documentation= pages (found through MANPATH).
mkdir -p "$R/lib/systemd/system" "$R/usr/bin"
cp /lib/systemd/system/*.target /lib/systemd/system/modprobe@.service "$R/lib/systemd/system/"
ln -s usr/bin "$R/bin"
cp "$(type -P kill)" "$R/usr/bin/kill"
out=$(MANPATH=$R/usr/share/man systemd-analyze verify --root="$R" "$U/siliceod.service" \
    "$U/siliceod.socket" "$U/sil-openai.service" "$U/sil-openai.socket" 2>&1) ||
    fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify printed: $out"
echo "ok: systemd-analyze verify --root is silent on the four units"

sec=$(systemd-analyze security --offline=true --root="$R" siliceod.service 2>&1)
score=$(sed -n 's/.*Overall exposure level for siliceod.service: \([0-9.]*\).*/\1/p' <<<"$sec")
[ -n "$score" ] || fail "no score in: $(tail -n 5 <<<"$sec")"
awk -v s="$score" 'BEGIN { exit !(s <= 1.0) }' ||
    fail "exposure $score > 1.0; failing checks: $(grep '✗' <<<"$sec")"
echo "ok: systemd-analyze security --offline=true: exposure $score (at most 1.0)"

# GPU access without group assumptions: no SupplementaryGroups= (fatal when a group is missing);
# the NVIDIA nodes by major name behind a closed device policy.
[ -z "$(key "$U/siliceod.service" SupplementaryGroups)" ] || fail "SupplementaryGroups= in the unit"
[ "$(key "$U/siliceod.service" DevicePolicy)" = closed ] || fail "DevicePolicy is not closed"
for d in char-nvidia-frontend char-nvidia char-nvidia-uvm; do
    key "$U/siliceod.service" DeviceAllow | grep -q "^$d rw" || fail "no DeviceAllow=$d rw"
done
echo "ok: no SupplementaryGroups=, DevicePolicy=closed with the NVIDIA majors allowed"

# The user: sysusers.d in the root creates what User=, Group=, SocketUser= and SocketGroup= name.
systemd-sysusers --root="$R" >"$T/sysusers.log" 2>&1 || fail "systemd-sysusers: $(cat "$T/sysusers.log")"
user=$(key "$U/siliceod.service" User)
for v in "$(key "$U/siliceod.service" Group)" "$(key "$U/siliceod.socket" SocketUser)" \
    "$(key "$U/siliceod.socket" SocketGroup)"; do
    [ "$v" = "$user" ] || fail "unit names '$v' where User=$user"
done
pw=$(grep "^$user:" "$R/etc/passwd") || fail "sysusers made no user $user: $(cat "$R/etc/passwd")"
uid=$(cut -d: -f3 <<<"$pw")
gid=$(cut -d: -f4 <<<"$pw")
grep -q "^$user:x:$gid:" "$R/etc/group" || fail "no group $user with gid $gid"
grep -qE "^video:x:[0-9]+:(.*,)?$user(,|$)" "$R/etc/group" || fail "$user is not in video"
grep -q render "$R/etc/group" "$R/usr/lib/sysusers.d/siliceo.conf" &&
    fail "the service depends on a render group"
echo "ok: sysusers.d makes $user ($uid:$gid), member of video, as User=, Group= and the socket owner"
# The bridge runs as that user, which the daemon's peer check lets in.
for v in "$(key "$U/sil-openai.service" User)" "$(key "$U/sil-openai.service" Group)"; do
    [ "$v" = "$user" ] || fail "sil-openai.service names '$v' where siliceod.service has User=$user"
done

# The socket's directory: ListenStream's dir = RuntimeDirectory = the tmpfiles.d entry, owned by
# the user, kept when the service stops (the socket unit still listens in it).
listen=$(key "$U/siliceod.socket" ListenStream)
sockdir=$(dirname "$listen")
[ "/run/$(key "$U/siliceod.service" RuntimeDirectory)" = "$sockdir" ] ||
    fail "RuntimeDirectory does not hold $listen"
[ "$(key "$U/siliceod.service" RuntimeDirectoryPreserve)" = yes ] ||
    fail "no RuntimeDirectoryPreserve=yes: a restart deletes $listen"
grep -q "SILICEO_SOCKET=$listen\$" <<<"$(key "$U/siliceod.service" Environment)" ||
    fail "the service's default socket is not $listen"
grep -q "SILICEO_SOCKET=$listen\$" <<<"$(key "$U/sil-openai.service" Environment)" ||
    fail "sil-openai.service does not talk to $listen: $(key "$U/sil-openai.service" Environment)"
systemd-tmpfiles --root="$R" --create "$R/usr/lib/tmpfiles.d/siliceo.conf" >"$T/tmpf.log" 2>&1 ||
    fail "systemd-tmpfiles: $(cat "$T/tmpf.log")"
st=$(stat -c '%a %u %g' "$R$sockdir") || fail "tmpfiles made no $sockdir"
rmode=$(key "$U/siliceod.service" RuntimeDirectoryMode)
[ "$st" = "${rmode#0} $uid $gid" ] || fail "$sockdir is '$st', want '${rmode#0} $uid $gid'"
[ -d "$R/var/lib/siliceo/models" ] || fail "tmpfiles made no /var/lib/siliceo/models"
echo "ok: $listen: its dir $sockdir is RuntimeDirectory (preserved) and tmpfiles' (mode $st)"

# The installed config in the real daemon. Its allow_groups names the group sysusers makes: in a
# mount namespace /etc/group carries that group, as on a system with the service installed.
model=$T/tiny.gguf
"$SIL_BUILD/bin/sil-mkmodel" --preset tiny --out "$model" >"$T/mk.log" 2>&1 ||
    fail "sil-mkmodel: $(cat "$T/mk.log")"
cfg=$R/etc/siliceo/siliceod.conf
cp /etc/group "$T/group"
grep -q "^$user:" "$T/group" || grep "^$user:" "$R/etc/group" >>"$T/group"
# The daemon's command line starts with this (an array: run in the background, the daemon itself
# is the job, so SIGTERM reaches it).
# shellcheck disable=SC2016 # the inner sh expands them
ns=(unshare -m sh -c 'mount --bind "$0" /etc/group && exec "$@"' "$T/group")
if ! "${ns[@]}" true 2>/dev/null; then
    # No mount namespace here: the same file with the group replaced by one that exists.
    grep -q "^$user:" /etc/group ||
        { echo "note: no mount namespace; allow_groups = $user replaced by $(id -gn)"
          sed "s/^allow_groups = $user\$/allow_groups = $(id -gn)/" "$cfg" >"$T/conf"; cfg=$T/conf; }
    ns=()
fi
out=$("${ns[@]}" "$SIL_BUILD/bin/siliceod" --config "$cfg" --socket "$T/s.sock" 2>&1)
grep -q "/var/lib/siliceo/models/" <<<"$out" || fail "without --model the daemon said: $out"
echo "ok: the config's model= is read: $(grep -m1 models <<<"$out")"
# Under strace when there is one: every syscall of a run (load, requests, shutdown) must pass
# the unit's SystemCallFilter=.
tr=()
strace -f -qq -o /dev/null true 2>/dev/null && tr=(strace -f -qq -o "$T/strace.log")
"${ns[@]}" "${tr[@]}" "$SIL_BUILD/bin/siliceod" --config "$cfg" --model "$model" \
    --socket "$T/s.sock" >"$T/d.log" 2>&1 &
DPID=$!
python3 -c "import siltest,sys; sys.exit(0 if siltest.wait_socket('$T/s.sock', 20) else 1)" ||
    fail "the daemon with the installed config did not come up: $(cat "$T/d.log")"
SILICEO_SOCKET=$T/s.sock python3 - <<'PY' || fail "requests: $(cat "$T/d.log")"
import siltest
c = siltest.Client()
c.ok("hello", {})
r, _ = c.ok("generate", {"prompt": "Hi", "max_tokens": 4})
assert r["n_generated"] >= 1, r
c.ok("status", {})
c.ok("shutdown", {})
PY
rc=0
wait "$DPID" || rc=$?
DPID=
[ "$rc" = 0 ] || fail "daemon exit $rc: $(cat "$T/d.log")"
echo "ok: siliceod runs with the installed $conf (allow_groups = $user), answers, stops with 0"
if [ ${#tr[@]} -gt 0 ]; then
    refused=$(python3 tests/integration/syscalls.py "$U/siliceod.service" "$T/strace.log" 2>"$T/sc.log") ||
        fail "SystemCallFilter= refuses syscalls the daemon made: $refused"
    echo "ok: $(cat "$T/sc.log"); the unit's SystemCallFilter= allows them all"
else
    echo "skip: no strace or no ptrace here; syscalls not checked against SystemCallFilter="
fi

# A restart behind the socket unit: this process holds the listener as systemd does and passes
# it (LISTEN_FDS) to one daemon, then to the next. The socket file outlives the first daemon,
# and a client that connects while none runs is answered by the second.
"${ns[@]}" env SIL="$SIL_BUILD/bin/siliceod" CFG="$cfg" MODEL="$model" SOCK="$T/run/siliceod.sock" \
    python3 - <<'PY' ||
import os
import socket
import subprocess
import siltest
path = os.environ["SOCK"]
os.makedirs(os.path.dirname(path), mode=0o750)
ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
ls.bind(path)
ls.listen(16)
def daemon():
    # The listener becomes fd 3 of the daemon, LISTEN_PID its pid (sh's, kept across exec).
    fd = ls.fileno()
    return subprocess.Popen(["sh", "-c", 'eval "exec 3<&$0"; LISTEN_PID=$$ LISTEN_FDS=1 exec "$@"',
                             str(fd), os.environ["SIL"], "--config", os.environ["CFG"],
                             "--model", os.environ["MODEL"]],
                            pass_fds=(fd,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
def stop(d):
    d.terminate()
    rc = d.wait(20)
    log = d.stderr.read().decode()
    if rc != 0 or "passed by systemd" not in log:
        siltest.check(False, f"activated daemon: exit {rc}, log: {log[-600:]}")
d = daemon()
siltest.Client(path).ok("hello", {})
stop(d)
siltest.check(os.path.exists(path), "the socket file survives the daemon's stop")
early = siltest.Client(path)  # accepted into the backlog, no daemon yet
early.send("hello", {}, msgid=1)
d = daemon()
err, res, _ = early.wait(1)
siltest.check(err is None and res.get("server") == "siliceod", f"queued client answered by {res and res.get('server')} ({err})")
stop(d)
PY
    fail "restart behind the socket"
echo "ok: the socket file and listener survive a daemon restart; a client queued meanwhile is answered"

# Reinstalling keeps an edited config; uninstall removes the rest but not the edited config.
echo "threads = 3" >>"$R/etc/siliceo/siliceod.conf"
mk install-service >"$T/log" 2>&1 || fail "second make install-service: $(tail -n 20 "$T/log")"
grep -q '^threads = 3$' "$R/etc/siliceo/siliceod.conf" || fail "reinstall overwrote the config"
cmp -s contrib/siliceod.conf "$R/etc/siliceo/siliceod.conf.dist" || fail "no siliceod.conf.dist"
mk uninstall >"$T/log" 2>&1 || fail "make uninstall: $(tail -n 20 "$T/log")"
left=$(cd "$R" && find usr etc -type f | grep -vxE 'usr/bin/kill|etc/(passwd|group|shadow|gshadow|.pwd.lock)' | sort)
[ "$left" = etc/siliceo/siliceod.conf ] || fail "after uninstall: $left"
echo "ok: reinstall keeps an edited config (new one as .dist), uninstall leaves only it"
