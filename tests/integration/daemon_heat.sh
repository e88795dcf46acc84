#!/usr/bin/env bash
# Warm restart of the expert cache (simulated on the CPU): a cold start preloads nothing; the
# heat map is saved periodically and at SIGTERM in the state directory and loaded at the next
# start, where its hottest experts fill the slots and the first turn hits at least as often as
# the cold first one (figures printed: cold first turn, warm turn, first turn after a restart);
# a truncated file, one with flipped bytes and one from another model are ignored with a warning
# and the daemon serves; no usable state directory only warns; a dense model and off mean nil in
# status.
. "$(dirname "$0")/lib.bash"
S=$HERE/heat_tests.py
MK=$SIL_BUILD/bin/sil-mkmodel
[ -x "$MK" ] || MK=$ROOT/build/bin/sil-mkmodel # sanitizer builds have only the daemon
# 4 MoE layers of 64 experts, top-4, skewed routing; 64 slots hold a quarter of the experts.
"$MK" --preset tiny --experts 64 --experts-used 4 --skew 1.0 --quiet --out "$T/moe.gguf" ||
    fail "sil-mkmodel"
"$MK" --preset tiny --experts 32 --experts-used 4 --quiet --out "$T/other.gguf" || fail "sil-mkmodel"
# The same shape quantized otherwise: another identity.
"$MK" --preset tiny --experts 64 --experts-used 4 --skew 1.0 --type q8_0 --quiet \
    --out "$T/requant.gguf" || fail "sil-mkmodel"
FIGS=$T/figures.jsonl

write_conf "threads = 2" "ecache_slots = 64" "heat_save_interval = 1"
start_daemon --model "$T/moe.gguf"
# The model's own file: its name and identity in the file name.
HEAT=$(sed -n 's/.*no expert heat map at \(.*\): the expert cache starts cold$/\1/p' "$T/daemon.log")
[ -n "$HEAT" ] || fail "no cold-start line"
[[ $HEAT =~ ^$STATE_DIRECTORY/expert-heat-[a-z0-9.-]+-[0-9a-f]{16}$ ]] || fail "heat map file $HEAT"
python3 "$S" cold "$FIGS" 64 4
# Metrics: the daemon's own text and sil-probe's from the map, both with per-layer series.
python3 "$S" metrics "$FIGS" "$T/daemon.prom"
"$SIL_BUILD/bin/sil-probe" --prom >"$T/probe.prom" || fail "sil-probe --prom"
"$SIL_BUILD/bin/sil-probe" --openmetrics >"$T/probe.om" || fail "sil-probe --openmetrics"
/usr/bin/python3 - "$T/daemon.prom" "$T/probe.prom" "$T/probe.om" <<'PY' || fail "metrics rejected"
import sys
from prometheus_client.parser import text_string_to_metric_families as prom
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
for path in sys.argv[1:]:
    text = open(path).read()
    fams = {f.name: f for f in (om if path.endswith(".om") else prom)(text)}
    hits = [f for n, f in fams.items() if n.startswith("siliceo_expert_cache_sim_layer_hits")][0]
    look = [f for n, f in fams.items() if n.startswith("siliceo_expert_cache_sim_layer_lookups")][0]
    assert hits.type == "counter" and len(hits.samples) == 4, (path, hits)
    assert sorted(s.labels["layer"] for s in hits.samples) == ["0", "1", "2", "3"], path
    h = sum(s.value for s in hits.samples)
    tot = [f for n, f in fams.items() if n.startswith("siliceo_expert_cache_sim_hits")][0]
    assert h == tot.samples[0].value > 0, (path, h, tot)
    assert sum(s.value for s in look.samples) >= h
    print("ok: %s parses; per-layer hits add up to %d" % (path, h))
PY
sleep 1.5
python3 "$S" saves "$FIGS"
[ -s "$HEAT" ] || fail "no heat file after the periodic save"
stop_daemon
# 40 bytes of header, 4 x 64 floats, the checksum.
[ "$(stat -c %s "$HEAT")" -eq $((40 + 4 * 64 * 4 + 8)) ] || fail "heat file of $(stat -c %s "$HEAT") bytes"
[ -z "$(find "$STATE_DIRECTORY" -name '*.tmp*')" ] || fail "a temporary file was left behind"
cp "$HEAT" "$T/good-heat"
write_conf "threads = 2" "ecache_slots = 64" "heat_save_interval = 0" # saves: shutdown, reload

# The notify socket is ours: the preload's progress shows in STATUS= before READY=1.
python3 - "$T/notify.sock" "$T/notify.log" <<'PY' &
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(30)
with open(sys.argv[2], "w") as f:
    while True:
        m = s.recv(4096).decode()
        f.write(m.replace("\n", " | ") + "\n")
        f.flush()
        if "READY=1" in m:
            break
PY
NPID=$!
for _ in $(seq 100); do [ -S "$T/notify.sock" ] && break; sleep 0.05; done
NOTIFY_SOCKET=$T/notify.sock start_daemon --model "$T/moe.gguf"
wait "$NPID" || fail "no READY=1 on the notify socket"
grep -n "STATUS=preloading the hottest experts: [0-9]* of [0-9]*" "$T/notify.log" | tail -1 |
    grep -q ":STATUS=preloading the hottest experts: \([0-9]*\) of \1\$" ||
    fail "no preload progress to its end: $(cat "$T/notify.log")"
[ "$(grep -n "STATUS=preloading" "$T/notify.log" | tail -1 | cut -d: -f1)" -lt \
    "$(grep -n "READY=1" "$T/notify.log" | cut -d: -f1)" ] || fail "preload progress after READY=1"
echo "ok: sd_notify: $(grep -c "STATUS=preloading" "$T/notify.log") preload progress lines before READY=1"
grep -q "expert heat map loaded from $HEAT" "$T/daemon.log" || fail "no load line"
python3 "$S" restart "$FIGS" 64 "$T/good-heat"
# A reload (the file replaced by rename, SIGHUP) saves the map first and loads it into the new
# engine: the same model, so it is taken again.
cp "$T/moe.gguf" "$T/moe.new" && mv "$T/moe.new" "$T/moe.gguf"
kill -HUP "$DPID"
for _ in $(seq 200); do grep -q "^siliceod: notice: model .* reloaded in" "$T/daemon.log" && break; sleep 0.05; done
grep -q "^siliceod: notice: model .* reloaded in" "$T/daemon.log" || fail "no reload"
[ "$(grep -c "expert heat map loaded from $HEAT" "$T/daemon.log")" -eq 2 ] ||
    fail "the reloaded engine did not load the heat map ($(grep -c "expert heat map loaded from $HEAT" "$T/daemon.log") load lines)"
python3 "$S" reloaded "$FIGS"
stop_daemon

# Flipped bytes in the heat values: the checksum refuses it.
cp "$T/good-heat" "$HEAT"
printf '\xff\xff\xff\x7f' | dd of="$HEAT" bs=1 seek=100 conv=notrunc status=none
start_daemon --model "$T/moe.gguf"
grep -q "warning.*ignoring the expert heat map" "$T/daemon.log" || fail "no warning for a corrupt file"
python3 "$S" ignored "$FIGS"
stop_daemon

# Truncated.
cp "$T/good-heat" "$HEAT"
truncate -s 30 "$HEAT"
start_daemon --model "$T/moe.gguf"
grep -q "warning.*ignoring the expert heat map" "$T/daemon.log" || fail "no warning for a short file"
python3 "$S" ignored "$FIGS"
stop_daemon

# Another model's map, copied over the file this one would read (maps are named per model, so
# only a copy puts it there): of another shape, and of the same shape quantized otherwise.
for m in other requant; do
    start_daemon --model "$T/$m.gguf"
    mine=$(sed -n 's/.*no expert heat map at \(.*\): the expert cache starts cold$/\1/p' "$T/daemon.log")
    stop_daemon
    [ -n "$mine" ] && [ "$mine" != "$HEAT" ] || fail "$m.gguf's map: '$mine' (the first model's: $HEAT)"
    cp "$T/good-heat" "$mine"
    start_daemon --model "$T/$m.gguf"
    grep -q "warning.*ignoring the expert heat map" "$T/daemon.log" ||
        fail "no warning for another model's map ($m)"
    python3 "$S" ignored "$FIGS"
    stop_daemon
    rm -f "$mine"
done

# The state directory cannot be made (a file is in the way): a warning, the daemon serves.
: >"$T/not-a-dir"
write_conf "threads = 2" "ecache_slots = 64" "state_dir = $T/not-a-dir/state"
start_daemon --model "$T/moe.gguf"
grep -q "warning.*kept in memory only" "$T/daemon.log" || fail "no warning for the state directory"
python3 "$S" unsaved "$FIGS"
stop_daemon

# A dense model: nothing to cache or heat, a notice, and the daemon serves.
write_conf "threads = 2" "ecache_slots = 64"
cp "$HEAT" "$T/before-dense"
start_daemon --model "$MODEL"
grep -q "ecache_slots has no effect: the model has no routed experts" "$T/daemon.log" ||
    fail "no notice for a dense model"
python3 "$S" off "$FIGS"
stop_daemon
cmp -s "$HEAT" "$T/before-dense" || fail "a dense model wrote over the heat map"
[ "$(find "$STATE_DIRECTORY" -maxdepth 1 -name 'expert-heat*' | wc -l)" = 1 ] ||
    fail "a dense model left a heat map: $(ls "$STATE_DIRECTORY")"

# Off: no simulated cache, no heat map.
write_conf "threads = 2" "heat_map = no"
start_daemon --model "$T/moe.gguf"
python3 "$S" off "$FIGS"
stop_daemon
echo "figures:"
cat "$FIGS"
