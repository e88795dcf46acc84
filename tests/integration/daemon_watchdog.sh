#!/usr/bin/env bash
# The systemd watchdog covers the engine thread as well as the event loop: with WATCHDOG_USEC
# set, WATCHDOG=1 pings arrive while idle, while decoding and during a long evaluation that makes
# progress (the engine reports each micro-batch), stop while the engine thread stalls, and resume
# once it goes on. Test hooks (SILICEOD_TEST_HOOKS) make the timing deterministic: ubatch_ms
# slows every micro-batch down while it still reports progress, stall_ms stops the engine thread
# before an evaluation with prompt rows without any heartbeat. The notify socket is ours, so no
# systemd is needed.
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
def start(hooks):
    with lock:
        events.clear()
    env = dict(os.environ, NOTIFY_SOCKET=os.path.join(tmp, "notify.sock"), WATCHDOG_USEC=str(WD_USEC),
               SILICEOD_TEST_HOOKS=hooks)
    env.pop("WATCHDOG_PID", None)
    log = open(os.path.join(tmp, "daemon.log"), "w")
    p = subprocess.Popen([daemon, "--config", os.path.join(tmp, "siliceod.conf"), "--model", model,
                          "--socket", os.environ["SILICEO_SOCKET"], "--log-level", "info"],
                         env=env, stdout=log, stderr=log)
    t_end = time.monotonic() + 30
    while time.monotonic() < t_end and not any("READY=1" in m for _, m in list(events)):
        time.sleep(0.05)
    check(any("READY=1" in m for _, m in events), "READY=1 received (hooks %s)" % hooks)
    return p

def pings(t0, t1):
    with lock:
        return [t for t, m in events if "WATCHDOG=1" in m.split("\n") and t0 <= t <= t1]

def max_gap(ts):
    return max((b - a for a, b in zip(ts, ts[1:])), default=0.0)

def daemon_log():
    return open(os.path.join(tmp, "daemon.log")).read()

p = None
try:
    # ---- a live engine: pings while idle, decoding, and inside a long evaluation -------------
    p = start("ubatch_ms=150")
    t0 = time.monotonic()
    time.sleep(1.0)
    idle = pings(t0, time.monotonic())
    check(len(idle) >= 3, "pings while idle (%d in 1 s, interval %.3f s)" % (len(idle), wd / 4))

    c = siltest.Client()
    t0 = time.monotonic()
    err, res, notes = c.call("generate", {"prompt_tokens": [508, 88, 198], "max_tokens": 12,
                                          "grace_tokens": 0, "temperature": 0})
    t1 = time.monotonic()
    check(err is None and res["n_generated"] > 0, "decode request finished (%d tokens in %.2f s)"
          % (res["n_generated"], t1 - t0))
    gap = max_gap(pings(t0 - wd, t1 + wd))
    check(gap < wd, "pings kept coming while decoding (largest gap %.3f s < %.3f s)" % (gap, wd))

    # One micro-batch's own compute must fit the interval for what follows to mean anything (a
    # sanitizer build on a loaded machine may be slower).
    res, _ = c.ok("generate", {"prompt_tokens": [(i * 7 + 3) % 500 + 1 for i in range(128)], "max_tokens": 1,
                               "grace_tokens": 0, "temperature": 0})
    ub = res["timings"]["prefill_ms"] / 1e3 - 0.15
    # 1000 prompt tokens in one step: 8 micro-batches of 150 ms each, one evaluation of 1.2 s,
    # four times the watchdog interval; the per-micro-batch progress keeps the pings coming.
    ids = [(i * 37 + 11) % 500 + 1 for i in range(1000)]
    t0 = time.monotonic()
    err, res, notes = c.call("generate", {"prompt_tokens": ids, "max_tokens": 1, "grace_tokens": 0,
                                          "temperature": 0})
    t1 = time.monotonic()
    check(err is None, "long prefill request finished")
    step = res["timings"]["prefill_ms"] / 1e3
    check(step > 3 * wd, "the evaluation took %.2f s (> 3 x the watchdog interval)" % step)
    gap = max_gap(pings(t0 - wd, t1 + wd))
    if ub < wd / 2:
        check(gap < wd, "pings kept coming during a %.2f s evaluation (largest gap %.3f s < %.3f s)" % (step, gap, wd))
        check("pings stopped" not in daemon_log(), "no stall reported for a live engine")
    else:
        print("skip: one micro-batch computes for %.2f s here, too long for a %.2f s watchdog" % (ub, wd))
    c.close()
    p.terminate()
    check(p.wait(timeout=20) == 0, "daemon exited 0 on SIGTERM")

    # ---- a stalled engine: no pings while it stalls, pings again after ------------------------
    p = start("stall_ms=1500")
    c = siltest.Client()
    t0 = time.monotonic()
    err, res, notes = c.call("generate", {"prompt_tokens": [508, 88, 198], "max_tokens": 1, "grace_tokens": 0,
                                          "temperature": 0})
    t1 = time.monotonic()
    check(err is None and t1 - t0 >= 1.5, "request finished after the 1.5 s stall (%.2f s)" % (t1 - t0))
    time.sleep(wd)
    gap = max_gap(pings(t0 - wd, t1 + wd))
    check(gap > 1.0, "no pings while the engine stalled (gap %.3f s)" % gap)
    check("pings stopped" in daemon_log(), "the stall is logged")
    with lock:
        check(any("STATUS=engine thread stalled" in m for _, m in events), "STATUS= says the engine stalled")
    t2 = time.monotonic()
    time.sleep(1.0)
    after = pings(t2, time.monotonic())
    check(len(after) >= 3, "pings resumed after the stall (%d in 1 s)" % len(after))
    check("pings resumed" in daemon_log(), "the recovery is logged")
    c.close()

    p.terminate()
    check(p.wait(timeout=20) == 0, "daemon exited 0 on SIGTERM")
except BaseException:
    print(daemon_log())
    raise
finally:
    if p and p.poll() is None:
        p.kill()
PY
