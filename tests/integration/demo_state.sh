#!/usr/bin/env bash
# make demo and make demo-random keep the daemon's state in a directory of the demo's own
# ($B/demo-state), never the system daemon's (/var/lib/siliceo, for root) nor the user's
# (STATE_DIRECTORY, XDG_STATE_HOME, HOME): each demo model saves its own heat map there, neither
# overwrites the other's, and the next run loads its map, with a load line that ends in words.
. "$(dirname "$0")/lib.bash"
# A build tree of the test's own, so the default $B/demo-state lands in the temporary directory.
mkdir -p "$T/b"
ln -s "$SIL_BUILD/bin" "$T/b/bin"
for b in siliceod sil-chat sil-probe sil-mkmodel; do
    [ -x "$SIL_BUILD/bin/$b" ] || { echo "skip: $SIL_BUILD/bin/$b missing (the demo needs it)"; exit 0; }
done
export STATE_DIRECTORY=$T/leak/systemd XDG_STATE_HOME=$T/leak/xdg HOME=$T/leak/home
export SILICEO_STATE_DIR=$T/models # where demo-random makes its model
unset SILICEO_SOCKET
touch "$T/stamp"
sys_state_untouched() {
    [ ! -e /var/lib/siliceo ] && return 0
    [ -z "$(find /var/lib/siliceo -newer "$T/stamp" 2>/dev/null)" ]
}
had_sys=0
[ -e /var/lib/siliceo ] && had_sys=1
demo() { # log, demo.sh's arguments
    local log=$1
    shift
    B=$T/b bash "$ROOT/contrib/demo.sh" "$@" >"$T/$log" 2>&1 || fail "demo $*: $(tail -20 "$T/$log")"
}
D=$T/b/demo-state
demo demo1.log
grep -q "^demo: starting siliceod on .*state in $D)" "$T/demo1.log" || fail "the demo does not say where its state is"
demo random1.log --random
files=("$D"/expert-heat-*)
[ "${#files[@]}" = 2 ] || fail "not two heat maps in $D: $(ls "$D")"
[ -n "$(ls "$D"/expert-heat-siliceo-demo-* 2>/dev/null)" ] || fail "no map named for the demo model: $(ls "$D")"
[ "$(stat -c %a "$D")" = 750 ] || fail "$D has mode $(stat -c %a "$D")"
[ ! -e "$T/leak" ] || fail "the demo wrote outside its state directory: $(find "$T/leak")"
[ "$had_sys" = 1 ] || [ ! -e /var/lib/siliceo ] || fail "the demo made /var/lib/siliceo"
sys_state_untouched || fail "the demo wrote in /var/lib/siliceo: $(find /var/lib/siliceo -newer "$T/stamp")"
echo "ok: demo and demo-random keep one heat map each in $D, nothing elsewhere"
cp "$D"/expert-heat-siliceo-demo-* "$T/demo.heat"
for run in demo2.log:"" random2.log:--random; do
    log=${run%%:*}
    demo "$log" ${run#*:}
    grep -q "expert heat map loaded from $D/expert-heat-" "$T/$log" || fail "$log: no map loaded: $(cat "$T/$log")"
    grep "expert heat map loaded" "$T/$log" | grep -q "((no))" && fail "$log: the load line ends in '((no))'"
done
grep -q "loaded from $D/expert-heat-siliceo-demo-" "$T/demo2.log" || fail "demo loaded another model's map"
grep -q "loaded from $D/expert-heat-siliceo-demo-" "$T/random2.log" && fail "demo-random loaded the demo model's map"
[ "$(ls "$D"/expert-heat-* | wc -l)" = 2 ] || fail "after the second runs: $(ls "$D")"
[ ! -e "$T/leak" ] && sys_state_untouched || fail "the second runs wrote outside $D"
echo "ok: the next run of each loads its own map: $(grep -h "expert heat map loaded" "$T/demo2.log" | cut -c1-160)"
