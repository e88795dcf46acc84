#!/usr/bin/env bash
# The systemd watchdog covers the engine thread as well as the event loop: with WATCHDOG_USEC
# set, WATCHDOG=1 pings arrive while idle and while decoding, stop while one engine step takes
# longer than the watchdog interval (a long prefill stands in for a hung engine), and resume
# once the step is done. The notify socket is ours, so no systemd is needed.
. "$(dirname "$0")/lib.bash"
# One prefill chunk for the whole long prompt: a single long engine step.
write_conf "threads = 2" "prefill_chunk = 4096" "max_running = 2"
python3 - "$SIL_BUILD/bin/siliceod" "$T" "$MODEL" <<'PY'
import os, socket, subprocess, sys, threading, time
import siltest
from siltest import check

daemon, tmp, model = sys.argv[1:4]
WD_USEC = 300000
wd = WD_USEC / 1e6
ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
ns.bind(os.path.join(tmp, "notify.sock"))
events = []  # (monotonic time, message)
lock = threading.Lock()

def listen():
    while True:
        try:
            d = ns.recv(4096)
        except OSError:
            return
        with lock:
            events.append((time.monotonic(), d.decode(errors="replace")))

threading.Thread(target=listen, daemon=True).start()
env = dict(os.environ, NOTIFY_SOCKET=os.path.join(tmp, "notify.sock"), WATCHDOG_USEC=str(WD_USEC))
env.pop("WATCHDOG_PID", None)
log = open(os.path.join(tmp, "daemon.log"), "w")
p = subprocess.Popen([daemon, "--config", os.path.join(tmp, "siliceod.conf"), "--model", model,
                      "--socket", os.environ["SILICEO_SOCKET"], "--log-level", "info"],
                     env=env, stdout=log, stderr=log)

def pings(t0, t1):
    with lock:
        return [t for t, m in events if "WATCHDOG=1" in m.split("\n") and t0 <= t <= t1]

def max_gap(ts):
    return max((b - a for a, b in zip(ts, ts[1:])), default=0.0)

def daemon_log():
    return open(os.path.join(tmp, "daemon.log")).read()

try:
    t_end = time.monotonic() + 30
    while time.monotonic() < t_end and not any("READY=1" in m for _, m in list(events)):
        time.sleep(0.05)
    check(any("READY=1" in m for _, m in events), "READY=1 received")

    t0 = time.monotonic()
    time.sleep(1.0)
    idle = pings(t0, time.monotonic())
    check(len(idle) >= 3, "pings while idle (%d in 1 s, interval %.3f s)" % (len(idle), wd / 4))

    c = siltest.Client()
    # Decode: many short steps; the pings must keep coming.
    t0 = time.monotonic()
    err, res, notes = c.call("generate", {"prompt_tokens": [508, 88, 198], "max_tokens": 1500,
                                          "grace_tokens": 0, "temperature": 0})
    t1 = time.monotonic()
    check(err is None and res["n_generated"] > 0, "decode request finished (%d tokens in %.2f s)"
          % (res["n_generated"], t1 - t0))
    if t1 - t0 > wd:
        gap = max_gap(pings(t0 - wd, t1 + wd))
        check(gap < wd, "pings kept coming while decoding (largest gap %.3f s < %.3f s)" % (gap, wd))
    check("pings stopped" not in daemon_log(), "no stall reported while decoding")

    # A long step: 3500 prompt tokens evaluated in one batch.
    ids = [(i * 37 + 11) % 500 + 1 for i in range(3500)]
    t0 = time.monotonic()
    err, res, notes = c.call("generate", {"prompt_tokens": ids, "max_tokens": 1, "grace_tokens": 0,
                                          "temperature": 0})
    t1 = time.monotonic()
    check(err is None, "long prefill request finished")
    step = res["timings"]["prefill_ms"] / 1e3
    time.sleep(wd)
    if step > 2.5 * wd:
        gap = max_gap(pings(t0 - wd, t1 + wd))
        check(gap > wd, "no pings during a %.2f s step (gap %.3f s > watchdog %.3f s)" % (step, gap, wd))
        check("pings stopped" in daemon_log(), "the stall is logged")
        t2 = time.monotonic()
        time.sleep(1.0)
        after = pings(t2, time.monotonic())
        check(len(after) >= 3, "pings resumed after the step (%d in 1 s)" % len(after))
        check("pings resumed" in daemon_log(), "the recovery is logged")
        with lock:
            check(any("STATUS=engine thread stalled" in m for _, m in events), "STATUS= says the engine stalled")
    else:
        print("skip: the long step took only %.3f s here, too short to stop the pings" % step)
    c.close()

    p.terminate()
    check(p.wait(timeout=20) == 0, "daemon exited 0 on SIGTERM")
except BaseException:
    print(daemon_log())
    raise
finally:
    if p.poll() is None:
        p.kill()
PY
