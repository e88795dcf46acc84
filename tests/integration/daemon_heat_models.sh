#!/usr/bin/env bash
# The expert heat map is kept per model: three reference MoE models (two quantizations of one
# model, and another model) served in turn from one state directory each save a file of their
# own, named for the model (general.name made safe, then 16 hex digits of its identity), and
# each restart loads its own map; a copy of a model under another name finds the same file. The
# single file of earlier versions is renamed to the model's own when it is that model's, and
# left alone with a line saying so when it is not.
. "$(dirname "$0")/lib.bash"
M1=$SHARED/refdata/models/qwen35moe-tiny-Q4_K_M.gguf
M2=$SHARED/refdata/models/qwen35moe-tiny-Q8_0.gguf
M3=$SHARED/refdata/models/qwen3moe-tiny-Q4_K_M.gguf
need_refdata "$M1" "$M2" "$M3"
CHAT=$SIL_BUILD/bin/sil-chat
write_conf "threads = 2" "heat_save_interval = 0"
cold_path() { sed -n 's/.*no expert heat map at \(.*\): the expert cache starts cold$/\1/p' "$T/daemon.log"; }
slug() { # general.name as the daemon makes it safe for a file name
    python3 - "$1" <<'PY'
import re, struct, sys
f = open(sys.argv[1], "rb")
magic, ver, n_t, n_kv = struct.unpack("<4sIQQ", f.read(24))
def s():
    n, = struct.unpack("<Q", f.read(8)); return f.read(n)
sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
def skip(t):
    if t == 8: s()
    elif t == 9:
        et, n = struct.unpack("<IQ", f.read(12))
        for _ in range(n): skip(et)
    else: f.read(sizes[t])
name = b""
for _ in range(n_kv):
    k = s(); t, = struct.unpack("<I", f.read(4))
    if k == b"general.name" and t == 8: name = s()
    else: skip(t)
out = re.sub(r"-+", "-", re.sub(r"[^a-z0-9.]", "-", name.decode().lower())).strip("-")[:32].rstrip("-")
print(out or "model")
PY
}

declare -A FILE
for m in M1 M2 M3; do
    start_daemon --model "${!m}"
    FILE[$m]=$(cold_path)
    [ -n "${FILE[$m]}" ] || fail "$m: no cold-start line"
    want=$(slug "${!m}")
    [[ ${FILE[$m]} =~ ^$STATE_DIRECTORY/expert-heat-$want-[0-9a-f]{16}$ ]] ||
        fail "$m: heat map file ${FILE[$m]}, expected expert-heat-$want-<16 hex digits>"
    "$CHAT" --no-think -n 4 -t 0 "Count to three, $m" >/dev/null || fail "$m: sil-chat"
    stop_daemon
    [ -s "${FILE[$m]}" ] || fail "$m: no map saved at ${FILE[$m]}"
    cp "${FILE[$m]}" "$T/$m.heat"
done
[ "${FILE[M1]}" != "${FILE[M2]}" ] && [ "${FILE[M1]}" != "${FILE[M3]}" ] &&
    [ "${FILE[M2]}" != "${FILE[M3]}" ] || fail "two models share a file: ${FILE[*]}"
[ "$(find "$STATE_DIRECTORY" -maxdepth 1 -name 'expert-heat*' | wc -l)" = 3 ] ||
    fail "not one map per model: $(ls "$STATE_DIRECTORY")"
echo "ok: three models in one state directory keep three maps: $(cd "$STATE_DIRECTORY" && echo expert-heat*)"

# Each restart loads its own map and saves it again; the others' files stay as they were.
for m in M1 M2 M3; do
    for o in M1 M2 M3; do cp "${FILE[$o]}" "$T/before.$o"; done
    start_daemon --model "${!m}"
    grep -q "expert heat map loaded from ${FILE[$m]}: [1-9][0-9]* experts hot" "$T/daemon.log" ||
        fail "$m: its map not loaded: $(grep heat "$T/daemon.log")"
    grep -q "warning" "$T/daemon.log" && fail "$m: a warning: $(grep warning "$T/daemon.log")"
    # No expert cache on the CPU without ecache_slots: the line says so (it said '(no)').
    grep -q "no expert cache to preload them into" "$T/daemon.log" || fail "$m: the load line: $(grep loaded "$T/daemon.log")"
    "$CHAT" --no-think -n 4 -t 0 "Count to five, $m" >/dev/null || fail "$m: sil-chat"
    stop_daemon
    for o in M1 M2 M3; do
        if [ "$o" = "$m" ]; then
            cmp -s "${FILE[$o]}" "$T/before.$o" && fail "$m: its map was not saved again"
        else
            cmp -s "${FILE[$o]}" "$T/before.$o" || fail "$m changed $o's map"
        fi
    done
done
echo "ok: each model loads its own map"

# A copy of a model under another name is the same model: the same file.
cp "$M1" "$T/copy of m1.gguf"
start_daemon --model "$T/copy of m1.gguf"
grep -q "expert heat map loaded from ${FILE[M1]}:" "$T/daemon.log" || fail "the copy did not find its map"
stop_daemon
echo "ok: a copy of a model under another name finds the same map"

# The single file of earlier versions: this model's is taken over, another's is left alone.
mv "${FILE[M1]}" "$STATE_DIRECTORY/expert-heat"
start_daemon --model "$M1"
grep -q "notice: expert heat map $STATE_DIRECTORY/expert-heat renamed to ${FILE[M1]}: maps are kept per model now" "$T/daemon.log" ||
    fail "the old file was not taken over: $(grep heat "$T/daemon.log")"
grep -q "expert heat map loaded from ${FILE[M1]}:" "$T/daemon.log" || fail "the old file's map not loaded"
stop_daemon
[ ! -e "$STATE_DIRECTORY/expert-heat" ] && [ -s "${FILE[M1]}" ] || fail "after the takeover: $(ls "$STATE_DIRECTORY")"
cp "$T/M2.heat" "$STATE_DIRECTORY/expert-heat"
start_daemon --model "$M1"
grep -q "expert heat map loaded from ${FILE[M1]}:" "$T/daemon.log" || fail "M1's own map not loaded beside an old file"
stop_daemon
rm "${FILE[M1]}"
start_daemon --model "$M1"
grep -q "info: $STATE_DIRECTORY/expert-heat, the single heat map of earlier versions, is not this model's (.*): left as it is; maps are kept per model now (${FILE[M1]})" "$T/daemon.log" ||
    fail "no line for another model's old file: $(grep heat "$T/daemon.log")"
grep -q "no expert heat map at ${FILE[M1]}: the expert cache starts cold" "$T/daemon.log" || fail "not a cold start"
stop_daemon
cmp -s "$T/M2.heat" "$STATE_DIRECTORY/expert-heat" || fail "another model's old file was changed"
echo "ok: the old single file is renamed when it is this model's, left alone with a line when not"
