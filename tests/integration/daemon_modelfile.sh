#!/usr/bin/env bash
# The served model file changed under the daemon. Each case starts a daemon on a private copy
# of the model and checks that no answer is computed from changed weights and the daemon lives:
#   lease   (the default; the daemon owns the file): truncate, then cp another model over it;
#   inotify (the lease switched off by a test hook): cp another model over it;
#   fault   (no watch at all): truncate while a generation runs, so the SIGBUS on the mapping is
#           caught on the engine and pool threads;
# then the failed requests name the file, status says damaged, generate is refused with what to
# do, and SIGHUP after a replace by rename serves again. A replace by rename while serving does
# not damage the running model; SIGHUP then loads the new file. Large tokenize requests in flight
# on the helper thread across reloads are answered whole.
. "$(dirname "$0")/lib.bash"
MK=$SIL_BUILD/bin/sil-mkmodel
[ -x "$MK" ] || MK=$ROOT/build/bin/sil-mkmodel # sanitizer builds have only the daemon
"$MK" --preset tiny --seed 7 --type q8_0 --name other-model --quiet \
    --out "$T/other.gguf" >/dev/null 2>&1
python3 - "$SIL_BUILD/bin/siliceod" "$T" "$MODEL" <<'PY'
import os, shutil, signal, socket, subprocess, sys, threading, time
import siltest
from siltest import check

daemon, tmp, model = sys.argv[1:4]
served = os.path.join(tmp, "model.gguf")
other = os.path.join(tmp, "other.gguf")
sock = os.environ["SILICEO_SOCKET"]
REQ = {"prompt_tokens": [508, 88, 198, 300], "max_tokens": 12, "grace_tokens": 0, "temperature": 0}
LOG = os.path.join(tmp, "daemon.log")

def start(hooks=""):
    shutil.copyfile(model, served)
    if os.path.exists(sock):
        os.unlink(sock)
    env = dict(os.environ, SILICEOD_TEST_HOOKS=hooks)
    p = subprocess.Popen([daemon, "--config", os.path.join(tmp, "siliceod.conf"), "--model", served,
                          "--socket", sock, "--log-level", "info"], env=env,
                         stdout=open(LOG, "w"), stderr=subprocess.STDOUT)
    check(siltest.wait_socket(sock, 30), "daemon up (hooks %r)" % hooks)
    c = siltest.Client()
    c.ok("status")  # answered once the model is loaded and the loop runs
    c.close()
    return p

def stop(p):
    p.send_signal(signal.SIGTERM)
    check(p.wait(timeout=20) == 0, "daemon exited 0 on SIGTERM")

def status(c):
    return c.ok("status")[0]

def refused(c, what):
    err, res, _ = c.call("generate", REQ)
    check(err is not None and err["code"] == 13 and served in err["message"] and "SIGHUP" in err["message"] and "rename" in err["message"],
          "%s: generate refused with code 13, naming the file and what to do (%r)" % (what, err))
    st = status(c)
    check(st["model_state"] == "damaged" and served in st["model_problem"],
          "%s: status says the model is damaged" % what)

def reload_ok(c, p, expect_tokens, what):
    tmpnew = os.path.join(tmp, "new.gguf")
    shutil.copyfile(model, tmpnew)
    os.rename(tmpnew, served)
    p.send_signal(signal.SIGHUP)
    t_end = time.monotonic() + 20
    while time.monotonic() < t_end and status(c)["model_state"] != "ok":
        time.sleep(0.05)
    check(status(c)["model_state"] == "ok", "%s: SIGHUP after a replace by rename reloads" % what)
    res, _ = c.ok("generate", REQ)
    check(res["tokens"] == expect_tokens, "%s: the reloaded model gives the first answer again" % what)

def writer(args, what):
    t0 = time.monotonic()
    r = subprocess.run(args, timeout=60)
    check(r.returncode == 0, "%s finished (%.2f s)" % (what, time.monotonic() - t0))

try:
    # ---- lease: truncate, then restore; cp over it -------------------------------------------
    p = start()
    log = open(LOG).read()
    check("read lease taken" in log, "the daemon holds a read lease on the file it owns")
    c = siltest.Client()
    first, _ = c.ok("generate", REQ)
    base = first["tokens"]
    check(len(base) > 0 and status(c)["model_state"] == "ok", "answer before the change, model ok")
    # truncate(2) waits for the lease break (coreutils' truncate opens O_NONBLOCK and gets EAGAIN).
    writer(["python3", "-c", "import os, sys; os.truncate(sys.argv[1], 1000)", served], "truncate(2) to 1000 bytes")
    refused(c, "lease/truncate")
    check(p.poll() is None, "lease/truncate: the daemon lives")
    reload_ok(c, p, base, "lease/truncate")
    writer(["cp", other, served], "cp other over it")
    refused(c, "lease/cp")
    reload_ok(c, p, base, "lease/cp")
    # ---- rename over the served path: no damage; SIGHUP loads the new file ----------------------
    tmpnew = os.path.join(tmp, "renamed.gguf")
    shutil.copyfile(other, tmpnew)
    os.rename(tmpnew, served)
    time.sleep(0.2)
    res, _ = c.ok("generate", REQ)
    check(res["tokens"] == base and status(c)["model_state"] == "ok",
          "rename: the running model keeps the old inode (same answer, model ok)")
    # A request running at SIGHUP finishes on the old model; the reload waits for it.
    c2 = siltest.Client()
    mid = c2.send("generate", dict(REQ, max_tokens=400))
    c2.s.recv(1, socket.MSG_PEEK)  # it streams
    p.send_signal(signal.SIGHUP)
    err, res, _ = c2.wait(mid)
    check(err is None and res["stop_reason"] == "length" and res["tokens"][:len(base)] == base,
          "rename: the request running at SIGHUP finished on the old model (%d tokens)" % len(res["tokens"]))
    c2.close()
    t_end = time.monotonic() + 20
    while time.monotonic() < t_end and status(c)["model"]["name"] != "other-model":
        time.sleep(0.05)
    st = status(c)
    check(st["model"]["name"] == "other-model" and st["model_state"] == "ok", "rename: SIGHUP loads the new file")
    c.ok("generate", REQ)
    c.close()
    stop(p)

    # ---- inotify: cp over it --------------------------------------------------------------
    p = start("no_lease=1")
    check("watching the file with inotify" in open(LOG).read(), "inotify: the fallback watch is in place")
    c = siltest.Client()
    res, _ = c.ok("generate", REQ)
    check(res["tokens"] == base, "inotify: first answer as before")
    writer(["cp", other, served], "inotify: cp other over it")
    refused(c, "inotify/cp")
    reload_ok(c, p, base, "inotify/cp")
    c.close()
    stop(p)

    # ---- large texts are tokenized on a helper thread: a reload swaps its vocab between jobs ----
    p = start()
    c = siltest.Client()
    big = "hello world " * 80000  # ~1 MB: off the loop
    n_ids = len(c.ok("tokenize", {"text": big})[0]["ids"])
    for rnd in range(3):
        mids = [c.send("tokenize", {"text": big}) for _ in range(3)]
        tmpnew = os.path.join(tmp, "renamed.gguf")
        shutil.copyfile(model, tmpnew)
        os.rename(tmpnew, served)
        p.send_signal(signal.SIGHUP)
        for mid in mids:
            err, res, _ = c.wait(mid)
            check(err is None and len(res["ids"]) == n_ids, "reload %d: a large tokenize is answered whole" % rnd)
        t_end = time.monotonic() + 20
        while time.monotonic() < t_end and status(c)["model_state"] != "ok":
            time.sleep(0.05)
        check(p.poll() is None and status(c)["model_state"] == "ok", "reload %d: the new model serves" % rnd)
    check(len(c.ok("tokenize", {"text": big})[0]["ids"]) == n_ids, "after the reloads: the same ids")
    check(open(LOG).read().count("reloaded in") == 3, "three reloads logged")
    c.close()
    stop(p)

    # ---- no watch: the SIGBUS on the mapping, on the engine and pool threads ------------------
    # Not under ThreadSanitizer: there the daemon died without a report in 1 of 2 to 4 runs at
    # the fault (most likely one inside the sanitizer's own interceptors, such as a memcpy from
    # the mapping, which its signal handling cannot leave by siglongjmp); the ASan and plain
    # builds run it.
    if os.environ.get("SIL_SANITIZER") == "thread":
        print("skip: the SIGBUS recovery under ThreadSanitizer")
    else:
        p = start("no_watch=1")
        c = siltest.Client()
        c2 = siltest.Client()
        long_req = dict(REQ, max_tokens=100000, prompt_tokens=[(i * 37 + 11) % 500 + 1 for i in range(200)])
        mid = c2.send("generate", long_req)
        time.sleep(0.5)
        os.truncate(served, 1000)
        err, res, notes = c2.wait(mid)
        failed_msg = err["message"] if err else res.get("error", "")
        check((err is not None or res["stop_reason"] == "error") and served in failed_msg and "offset" in failed_msg,
              "fault: the request in the evaluation fails naming the file (%r)" % failed_msg[:160])
        check(p.poll() is None, "fault: the daemon survived the SIGBUS")
        refused(c, "fault")
        check("evaluation failed" in open(LOG).read(), "fault: the failure is logged")
        reload_ok(c, p, base, "fault")
        c.close()
        c2.close()
        stop(p)
except BaseException:
    print(open(LOG).read()[-4000:])
    raise
PY
