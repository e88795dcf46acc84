#!/usr/bin/env bash
# The KV cache settings: --kv-type picks the element type (logged with its size), a bad one is a
# usage error naming the choices; a pool too small for a prompt fails that request with an error
# naming the blocks, and the daemon goes on serving requests that fit.
. "$(dirname "$0")/lib.bash"
rc=0
"$SIL_BUILD/bin/siliceod" --config "$T/siliceod.conf" --model "$MODEL" --kv-type q4_K \
    >"$T/bad.log" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "--kv-type q4_K exited $rc, not 2"
grep -q "expected f32, f16, q8_0 or q4_0" "$T/bad.log" || fail "no choices named: $(cat "$T/bad.log")"
echo "ok: a bad --kv-type is a usage error naming the choices"

# qwen3-tiny: 2 KiB a position in f16, so 256K is two blocks of 64 positions
start_daemon --model "$MODEL" --kv-type f16 --kv-budget 256K --log-level info
grep -q "KV cache: f16, 2048 bytes a position, 2 blocks of 64 positions" "$T/daemon.log" ||
    fail "no KV line: $(cat "$T/daemon.log")"
echo "ok: the KV type and pool are logged"
python3 - <<'PY'
from siltest import Client, check
c = Client()
g = {"temperature": 0, "grace_tokens": 0}
r, _ = c.ok("generate", dict(g, prompt_tokens=list(range(3, 43)), max_tokens=8))
check(r["n_generated"] == 8, "a 40-token prompt fits the pool")
err, res, _ = c.call("generate", dict(g, prompt_tokens=list(range(3, 203)), max_tokens=4))
if err is None:
    check(res["stop_reason"] == "error" and "blocks" in res.get("error", ""), "a 200-token prompt fails: %r" % res)
else:
    check("blocks" in str(err), "a 200-token prompt fails naming the blocks: %r" % err)
r, _ = c.ok("generate", dict(g, prompt_tokens=list(range(3, 43)), max_tokens=8))
check(r["n_generated"] == 8, "the daemon still serves a prompt that fits")
PY
stop_daemon
