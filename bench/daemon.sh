# Sourced by the bench scripts that drive a siliceod of their own: bench_daemon CONF SOCK LOG
# MODEL starts it in the background (dpid) and waits up to 60 s for its socket (SILICEOD_ARGS: more
# options, e.g. --backend cuda --vram-budget 8G); bench_daemon_stop
# ends it and fails unless it exits cleanly. The caller's EXIT trap should run bench_cleanup.
dpid=
# bench_prepare [MODEL]: model = MODEL, else the sil-mkmodel bench model (made if absent), and
# $B/bin/siliceod built unless NO_BUILD is set.
bench_prepare() {
    model=${1:-bench/models/bench-qwen35moe-q4_k_m.gguf}
    [ -f "$model" ] || OUT="$model" B="$B" bench/make-bench-model.sh >&2
    [ -n "${NO_BUILD:-}" ] || make -s B="$B" "$B/bin/siliceod" >&2
}
bench_daemon() {
    # shellcheck disable=SC2086 # SILICEOD_ARGS is a list of options
    "$B/bin/siliceod" --config "$1" --socket "$2" --model "$4" ${SILICEOD_ARGS:-} 2> "$3" &
    dpid=$!
    for _ in $(seq 600); do
        [ -S "$2" ] && return 0
        kill -0 "$dpid" 2>/dev/null || { cat "$3" >&2; return 1; }
        sleep 0.1
    done
    echo "$(basename "$0"): siliceod did not come up" >&2
    cat "$3" >&2
    return 1
}
bench_daemon_stop() {
    kill -TERM "$dpid"
    wait "$dpid" || { echo "$(basename "$0"): siliceod did not exit cleanly" >&2; return 1; }
    dpid=
}
bench_cleanup() {
    if [ -n "$dpid" ] && kill -0 "$dpid" 2>/dev/null; then kill -KILL "$dpid" 2>/dev/null || true; fi
    [ -z "${tmp:-}" ] || rm -rf "$tmp"
}
