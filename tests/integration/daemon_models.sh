#!/usr/bin/env bash
# Models by name: a models directory of two reference models (symlinks), a daemon started with
# none loaded. Each model's greedy answer through sil-chat -m equals a daemon started directly
# on that model; the loaded model switches (status), requests without a model go to the loaded
# one, sil-chat --models and the models method list exactly the valid files, unknown and hostile
# names are error 16 naming the models there are, concurrent requests for both models all
# complete with their own model's answer, a request waiting for its model can be cancelled,
# keep_alive unloads an idle model and the next request loads it again, and the bridge's
# /v1/models ids are the names (no spaces) while its 'model' field picks the model.
. "$(dirname "$0")/lib.bash"
CHAT=$SIL_BUILD/bin/sil-chat
A=qwen3-tiny-Q8_0
B=qwen35moe-tiny-Q4_K_M
Q="Name three colours."
ask() { "$CHAT" --no-think -t 0 -n 12 --grace 0 "$@" "$Q"; }

# The answers of daemons started directly on each model.
start_daemon --model "$MODEL"
REF_A=$(ask) || fail "sil-chat on $A"
stop_daemon
start_daemon --model "$MOE_MODEL"
REF_B=$(ask) || fail "sil-chat on $B"
stop_daemon
[ -n "$REF_A" ] && [ -n "$REF_B" ] && [ "$REF_A" != "$REF_B" ] ||
    fail "the two models' answers are not distinct (test set-up): '$REF_A' / '$REF_B'"

M=$T/models
mkdir -p "$M/sub.gguf"
ln -s "$MODEL" "$M/$A.gguf"
ln -s "$MOE_MODEL" "$M/$B.gguf"
ln -s "$MODEL" "$M/with space.gguf" # not a valid name: not listed
: >"$M/notes.txt"
cp "$MODEL" "$T/outside.gguf" # beside the directory: no name reaches it
write_conf "threads = 2" "models_dir = $M" "keep_alive = 3"
start_daemon
grep -q "no default model: requests name one of $M" "$T/daemon.log" || fail "no start-up line"

python3 - "$A" "$B" <<'PY' || fail "models before any load"
import sys, siltest
from siltest import check
a, b = sys.argv[1:3]
c = siltest.Client()
check("model" in c.ok("hello")[0]["capabilities"], "hello lists the model parameter")
st = c.ok("status")[0]
check(st["model_state"] == "unloaded" and st["model"] is None,
      "started without a model: status says unloaded (%r)" % st["model_state"])
res = c.ok("models")[0]
names = [m["name"] for m in res["models"]]
check(names == [a, b], "models lists exactly the two valid files, sorted: %r" % names)
check(all(" " not in n for n in names), "no name has a space")
check(not any(m["loaded"] for m in res["models"]) and res["loaded"] is None, "none loaded")
check(all(m["size"] > 0 and m["file"].endswith(m["name"] + ".gguf") for m in res["models"]),
      "size and file of each")
PY
out=$("$CHAT" --models) || fail "sil-chat --models"
[ "$(printf '%s\n' "$out" | sed 1d | awk '{print $1}' | tr '\n' ' ')" = "$A $B " ] ||
    fail "sil-chat --models: $out"
echo "ok: sil-chat --models lists $A and $B"

model_id() { python3 -c 'import siltest; m = siltest.Client().ok("status")[0]["model"]; print(m["id"] if m else "none")'; }
got=$(ask -m "$A") || fail "sil-chat -m $A"
[ "$got" = "$REF_A" ] || fail "-m $A: '$got', a daemon on $A says '$REF_A'"
[ "$(model_id)" = "$A" ] || fail "status after -m $A: $(model_id)"
got=$(ask -m "$B") || fail "sil-chat -m $B"
[ "$got" = "$REF_B" ] || fail "-m $B: '$got', a daemon on $B says '$REF_B'"
[ "$(model_id)" = "$B" ] || fail "status after -m $B: $(model_id)"
got=$(ask) || fail "sil-chat without -m"
[ "$got" = "$REF_B" ] || fail "without -m the loaded model ($B) answers: '$got'"
got=$(ask -m "$A.gguf") || fail "sil-chat -m $A.gguf"
[ "$got" = "$REF_A" ] || fail "-m $A.gguf: '$got'"
echo "ok: -m $A and -m $B give each model's own answer, the loaded model switches, no -m goes to it"

for bad in nope ../outside ../x a/b .hidden "with space" "$M/$A" "$A/../$B"; do
    rc=0
    err=$("$CHAT" -n 2 -m "$bad" hi 2>&1 >/dev/null) || rc=$?
    [ "$rc" -eq 1 ] || fail "-m '$bad': exit $rc"
    case $err in *"models: $A, $B"*"model_not_found"*) ;; *) fail "-m '$bad': $err" ;; esac
done
[ "$(model_id)" = "$A" ] || fail "a refused name changed the loaded model: $(model_id)"
grep -q "outside.gguf" "$T/daemon.log" && fail "a name reached a file outside the directory"
echo "ok: unknown and hostile names are error 16 listing the models; nothing loaded for them"

python3 - "$A" "$B" "$REF_A" "$REF_B" <<'PY' || fail "concurrent requests"
import sys, time, siltest
from siltest import check
a, b, ref_a, ref_b = sys.argv[1:5]
msgs = [{"role": "user", "content": "Name three colours."}]
def params(m):
    return {"model": m, "messages": msgs, "think": False, "temperature": 0, "max_tokens": 12,
            "grace_tokens": 0}
# Eight requests, the two models alternating, each on a connection of its own, all at once.
cs = [(siltest.Client(), a if i % 2 == 0 else b) for i in range(8)]
ids = [c.send("chat", params(m)) for c, m in cs]
for (c, m), i in zip(cs, ids):
    err, res, _ = c.wait(i)
    check(err is None, "concurrent %s: %r" % (m, err))
    want = ref_a if m == a else ref_b
    check(res["text"].strip() == want.strip(),
          "concurrent %s answers as that model: %r" % (m, res["text"]))
# A request waiting for its model is cancelled with error 8; the running one completes.
c = siltest.Client()
# the running request must not end early at its end-of-text token (under load the status poll
# below could then miss it, and the request for the other model would not wait behind it)
c.ok("generate", {"model": b, "prompt": "Hi", "max_tokens": 1, "grace_tokens": 0})
bias = {}
for t in ("<|im_end|>", "<|endoftext|>"):
    r, _ = c.ok("tokenize", {"text": t, "special": True})
    if len(r["ids"]) == 1:
        bias[r["ids"][0]] = -100
long_id = c.send("generate", {"model": b, "prompt": "Once upon a time", "max_tokens": 600,
                              "grace_tokens": 0, "temperature": 0, "logit_bias": bias})
t_end = time.monotonic() + 10
while time.monotonic() < t_end and c.ok("status")[0]["queue"]["running"] == 0:
    time.sleep(0.01)
check(c.ok("status")[0]["queue"]["running"] == 1, "the long request is running")
wait_id = c.send("generate", {"model": a, "prompt": "Hello", "max_tokens": 4})
cancel_id = c.send("cancel", {"id": wait_id})
err, _, _ = c.wait(wait_id)
check(err is not None and err["code"] == 8, "a waiting request cancelled: error 8 (%r)" % err)
err, res, _ = c.wait(long_id)
check(err is None and res["n_generated"] > 0, "the running request completes (%r)" % err)
st = c.ok("status")[0]
check(st["model"]["id"] == b, "the cancelled request loaded nothing (%s)" % st["model"]["id"])
PY

# keep_alive = 3: idle, the model goes; the next request loads it again.
python3 - "$B" <<'PY' || fail "keep_alive"
import sys, time, siltest
from siltest import check
c = siltest.Client()
t_end = time.monotonic() + 15
while time.monotonic() < t_end and c.ok("status")[0]["model_state"] != "unloaded":
    time.sleep(0.2)
st = c.ok("status")[0]
check(st["model_state"] == "unloaded" and st["model"] is None,
      "keep_alive unloaded the idle model (%r)" % st["model_state"])
PY
grep -q "unloaded after 3 s without a request (keep_alive)" "$T/daemon.log" || fail "no unload line"
got=$(ask -m "$B") || fail "sil-chat -m $B after the unload"
[ "$got" = "$REF_B" ] || fail "after the unload -m $B: '$got'"
[ "$(model_id)" = "$B" ] || fail "status after the reload: $(model_id)"
echo "ok: keep_alive unloads the idle model, the next request loads it again"

# The bridge: ids are the names, 'model' picks the model, an unknown one is 404.
if [ -x "$SIL_BUILD/bin/sil-openai" ]; then
    P=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    "$SIL_BUILD/bin/sil-openai" --port "$P" >"$T/bridge.log" 2>&1 &
    BPID=$!
    python3 - "$P" "$A" "$B" <<'PY' || { kill "$BPID"; fail "bridge"; }
import json, sys, time, urllib.error, urllib.request, siltest
from siltest import check
port, a, b = sys.argv[1:4]
base = "http://127.0.0.1:%s" % port
def req(path, body=None):
    r = urllib.request.Request(base + path, data=json.dumps(body).encode() if body else None,
                               headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(r, timeout=60) as f:
            return f.status, json.loads(f.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
for _ in range(100):
    try:
        st, o = req("/v1/models")
        break
    except OSError:
        time.sleep(0.05)
ids = [m["id"] for m in o["data"]]
check(st == 200 and ids == [a, b], "/v1/models ids are the names: %r" % ids)
check(all(" " not in i for i in ids), "no id has a space")
check(req("/v1/models/" + b)[0] == 200, "/v1/models/%s" % b)
st, o = req("/v1/models/nope")
check(st == 404 and o["error"]["code"] == "model_not_found", "/v1/models/nope: %d %r" % (st, o))
msgs = [{"role": "user", "content": "Name three colours."}]
c = siltest.Client()
for m in (a, b, a):
    st, o = req("/v1/chat/completions", {"model": m, "messages": msgs, "temperature": 0,
                                         "max_tokens": 12, "think": False})
    check(st == 200 and o["model"] == m, "the bridge's chat with model %s: %d, model %r" %
          (m, st, o.get("model")))
    want = c.ok("chat", {"model": m, "messages": msgs, "think": False, "temperature": 0,
                         "max_tokens": 12, "grace_tokens": 0})[0]["text"]
    check(o["choices"][0]["message"]["content"] == want,
          "the bridge's answer for %s is that model's: %r" % (m, o["choices"][0]["message"]))
    check(c.ok("status")[0]["model"]["id"] == m, "the daemon loaded %s" % m)
st, o = req("/v1/chat/completions", {"model": "gpt-4o", "messages": msgs})
check(st == 404 and o["error"]["code"] == "model_not_found" and o["error"]["param"] == "model"
      and a in o["error"]["message"], "an unknown model: 404 model_not_found (%d %r)" % (st, o))
PY
    kill -TERM "$BPID"
    wait "$BPID" || fail "sil-openai exited $?"
fi
stop_daemon

# --models-dir on the command line, the default model loaded at start and listed too.
rm -f "$M/$A.gguf"
write_conf "threads = 2"
start_daemon --model "$MODEL" --models-dir "$M"
[ "$(model_id)" = "$A" ] || fail "the default model is loaded at start: $(model_id)"
out=$("$CHAT" --models) || fail "sil-chat --models with a default model"
printf '%s\n' "$out" | grep -q "^$A .*loaded$" || fail "the default model listed as loaded: $out"
printf '%s\n' "$out" | grep -q "^$B " || fail "the directory's model listed: $out"
got=$(ask -m "$B") || fail "-m $B beside a default model"
[ "$got" = "$REF_B" ] || fail "-m $B beside a default model: '$got'"
got=$(ask -m "$A") || fail "-m $A, the default model by name"
[ "$got" = "$REF_A" ] || fail "-m $A, the default model by name: '$got'"
stop_daemon

# Neither a model nor a directory: a usage error before anything starts.
rc=0
"$SIL_BUILD/bin/siliceod" --config "$T/siliceod.conf" --socket "$SILICEO_SOCKET" >"$T/none.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "no model: give --model FILE or --models-dir DIR" "$T/none.log" ||
    fail "no model and no directory: exit $rc, $(cat "$T/none.log")"
echo "ok: models by name"
