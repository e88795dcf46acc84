# Sourced by the bench scripts that drive a siliceod of their own: bench_daemon CONF SOCK LOG
# MODEL starts it in the background (dpid) and waits up to 60 s for its socket; bench_daemon_stop
# ends it and fails unless it exits cleanly. The caller's EXIT trap should run bench_cleanup.
dpid=
bench_daemon() {
    "$B/bin/siliceod" --config "$1" --socket "$2" --model "$4" 2> "$3" &
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
