#!/usr/bin/env bash
# Lifecycle edges: a model path that is a FIFO, a device or a directory is refused at once,
# before the socket listens (a FIFO used to block open() forever with SIGTERM blocked); SIGTERM
# during the model load stops the load (a test hook slows the load down; the socket does not
# listen yet); SIGTERM with a client still reading a large response exits as soon as that client
# is gone, not after the 10 s drain.
. "$(dirname "$0")/lib.bash"
D=$SIL_BUILD/bin/siliceod

mkfifo "$T/fifo.gguf"
mkdir "$T/dir.gguf"
for path in "$T/fifo.gguf" /dev/null "$T/dir.gguf"; do
    rc=0
    timeout 5 "$D" --config "$T/siliceod.conf" --model "$path" --socket "$SILICEO_SOCKET" 2>"$T/err" || rc=$?
    [ "$rc" != 124 ] || fail "$path: the daemon hung"
    [ "$rc" != 0 ] || fail "$path: the daemon started"
    grep -q "not a regular file" "$T/err" || fail "$path: message: $(cat "$T/err")"
    [ ! -e "$SILICEO_SOCKET" ] || fail "$path: the socket was created"
    echo "ok: $path refused at once: $(cat "$T/err")"
done

# SIGTERM while the model loads.
SILICEOD_TEST_HOOKS=load_ms=20000 "$D" --config "$T/siliceod.conf" --model "$MODEL" --socket "$SILICEO_SOCKET" \
    >"$T/daemon.log" 2>&1 &
DPID=$!
for _ in $(seq 100); do grep -q "loading the model" "$T/daemon.log" && break; sleep 0.05; done
grep -q "loading the model" "$T/daemon.log" || fail "the load is not logged"
sleep 0.3
[ ! -e "$SILICEO_SOCKET" ] || fail "the socket listens before the model is loaded"
t0=$(date +%s%N)
kill -TERM "$DPID"
rc=0; wait "$DPID" || rc=$?; DPID=
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$rc" = 0 ] || fail "exit status $rc after SIGTERM during the load"
[ "$ms" -lt 2000 ] || fail "SIGTERM during the load took $ms ms"
grep -q "model load stopped" "$T/daemon.log" || fail "the stopped load is not logged"
[ ! -e "$SILICEO_SOCKET" ] || fail "socket left behind"
echo "ok: SIGTERM during the model load stops it ($ms ms, exit 0)"

# SIGTERM while a client has megabytes of a response still to read.
start_daemon --model "$MODEL"
python3 - "$DPID" "$T/daemon.log" <<'PY' || fail "drain"
import os, signal, socket, sys, time
import siltest
from siltest import check
pid, log = int(sys.argv[1]), sys.argv[2]
c = siltest.Client()
c.ok("status")
idle = siltest.Client()  # connected, nothing in flight: closed at once by the drain
mid = c.send("tokenize", {"text": "hello world " * 15000})  # ~100k ids, ~500 kB of response
c.s.recv(1, socket.MSG_PEEK)  # the response has begun: it fills the socket, the rest waits
time.sleep(0.2)
os.kill(pid, signal.SIGTERM)
time.sleep(0.5)
check(idle.read() is None, "the idle client is disconnected by the drain")
err, res, _ = c.wait(mid)
check(err is None and len(res["ids"]) > 50000, "the slow reader got its whole response (%d ids)" % len(res["ids"]))
c.close()
t0 = time.monotonic()
while time.monotonic() - t0 < 15:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    if open("/proc/%d/stat" % pid).read().split()[2] == "Z":
        break
    time.sleep(0.02)
dt = time.monotonic() - t0
check(dt < 1.5, "the daemon exited %.2f s after its last client left (not the 10 s drain)" % dt)
check("did not read their final responses" not in open(log).read(), "no drain timeout logged")
PY
rc=0; wait "$DPID" || rc=$?; DPID=
[ "$rc" = 0 ] || fail "exit status $rc"
echo "ok: SIGTERM exits as soon as the last client is gone, exit 0"

# A backend asked for by name that cannot run is an error saying why; vram_budget without CUDA
# says it has no effect; auto says what it picked.
rc=0
"$D" --config "$T/siliceod.conf" --model "$MODEL" --socket "$SILICEO_SOCKET" --backend cuda 2>"$T/err" || rc=$?
if [ -e /dev/nvidiactl ]; then
    echo "skip: a GPU machine: --backend cuda may run here"
else
    [ "$rc" != 0 ] || fail "--backend cuda started without a GPU"
    grep -Eqi "cuda.*(libcuda|driver|device|without CUDA|no CUDA)" "$T/err" ||
        fail "--backend cuda message: $(cat "$T/err")"
    echo "ok: --backend cuda without a GPU is an error: $(cat "$T/err")"
fi
start_daemon --model "$MODEL" --vram-budget 1G --log-level info
python3 -c "import siltest; siltest.Client().ok('status')"
grep -q "vram_budget has no effect" "$T/daemon.log" || fail "no vram_budget notice: $(cat "$T/daemon.log")"
grep -q "backend auto: cpu" "$T/daemon.log" || fail "no backend auto line"
echo "ok: --vram-budget on the CPU backend says it has no effect; auto logs its choice"
stop_daemon
