#!/usr/bin/env bash
# A request during a model reload is refused with code 13 and a retry_after_ms hint (what the
# last load took, less what the reload has taken), and a client of the protocol library
# (sil-chat) waits that long and sends it again instead of failing or spinning. A test hook
# slows every step of a load down, so the reload lasts a few seconds.
. "$(dirname "$0")/lib.bash"
cp "$MODEL" "$T/model.gguf"
SILICEOD_TEST_HOOKS=load_ms=600 start_daemon --model "$T/model.gguf"
python3 - "$DPID" "$T" "$MODEL" "$SIL_BUILD/bin/sil-chat" <<'PY' || fail "reload retry"
import os, shutil, signal, subprocess, sys, time
import siltest
from siltest import check
pid, tmp, model, chat = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
c = siltest.Client()
c.ok("status")
shutil.copyfile(model, os.path.join(tmp, "new.gguf"))
os.rename(os.path.join(tmp, "new.gguf"), os.path.join(tmp, "model.gguf"))
os.kill(pid, signal.SIGHUP)
t_end = time.monotonic() + 10
while time.monotonic() < t_end and c.ok("status")[0]["model_state"] != "reloading":
    time.sleep(0.02)
check(c.ok("status")[0]["model_state"] == "reloading", "SIGHUP after a replace starts a reload")
err, res, _ = c.call("generate", {"prompt_tokens": [1, 2, 3], "max_tokens": 2})
check(err is not None and err["code"] == 13 and 100 <= err.get("retry_after_ms", 0) <= 5000,
      "a request during the reload: code 13 with retry_after_ms (%r)" % err)
t0 = time.monotonic()
r = subprocess.run([chat, "--no-think", "-n", "2", "-t", "0", "hi"], capture_output=True,
                   timeout=60)
dt = time.monotonic() - t0
check(r.returncode == 0, "sil-chat sent during the reload succeeds after it (exit %d, %.2f s: %s)"
      % (r.returncode, dt, r.stderr.decode(errors="replace").strip()))
check(c.ok("status")[0]["model_state"] == "ok", "the reload finished")
c.close()
print("ok: refused with retry_after_ms %d; sil-chat retried and was answered after %.2f s"
      % (err["retry_after_ms"], dt))
PY
stop_daemon
