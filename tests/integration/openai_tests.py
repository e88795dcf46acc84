"""sil-openai against the real daemon: every endpoint through curl, checked field by field against
the OpenAI response schema; SSE parsed with http.client; bad bodies; cancellation on disconnect.
Usage: openai_tests.py BASE_URL (SILICEO_SOCKET names the daemon, for its status)."""
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse

import siltest

BASE = sys.argv[1]
U = urllib.parse.urlparse(BASE)
CHAT = [{"role": "system", "content": "You are brief."}, {"role": "user", "content": "Say hello."}]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def curl(path, body=None, extra=(), raw=False):
    """(status, headers text, body bytes) of one request made by curl."""
    cmd = ["curl", "-sS", "-D", "-", "--max-time", "60", BASE + path] + list(extra)
    if body is not None:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
        inp = data.encode() if isinstance(data, str) else data
    else:
        inp = None
    out = subprocess.run(cmd, input=inp, capture_output=True, check=True).stdout
    head, _, rest = out.partition(b"\r\n\r\n")
    if head.startswith(b"HTTP/1.1 100"):
        head, _, rest = rest.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, head.decode().lower(), rest


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def check_usage(u, what):
    check(isinstance(u, dict), what + ": usage missing")
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        check(is_int(u.get(k)) and u[k] >= 0, "%s: usage.%s = %r" % (what, k, u.get(k)))
    check(u["prompt_tokens"] > 0, what + ": no prompt tokens")
    check(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], what + ": total")
    check(is_int(u["completion_tokens_details"]["reasoning_tokens"]), what + ": reasoning_tokens")
    check(is_int(u["prompt_tokens_details"]["cached_tokens"]), what + ": cached_tokens")


def check_head(o, obj, prefix, model, what):
    check(o.get("object") == obj, "%s: object %r" % (what, o.get("object")))
    check(isinstance(o.get("id"), str) and o["id"].startswith(prefix), what + ": id %r" % o.get("id"))
    check(is_int(o.get("created")) and abs(o["created"] - time.time()) < 120, what + ": created")
    check(o.get("model") == model, "%s: model %r, want %r" % (what, o.get("model"), model))


def check_error(status, body, want_status, what, param=None):
    check(status == want_status, "%s: status %d, want %d (%r)" % (what, status, want_status, body[:200]))
    e = json.loads(body)["error"]
    check(isinstance(e["message"], str) and e["message"], what + ": error.message")
    check(isinstance(e["type"], str) and e["type"], what + ": error.type")
    check("param" in e and "code" in e, what + ": error.param / error.code missing")
    if param is not None:
        check(e["param"] == param, "%s: param %r, want %r" % (what, e["param"], param))
    return e


def sse_events(data):
    """The data: payloads of an SSE body, in order."""
    out = []
    for block in data.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = [l for l in block.split("\n") if l.startswith("data: ")]
        check(len(lines) == 1, "SSE block without one data line: %r" % block[:200])
        out.append(lines[0][6:])
    return out


def models():
    st, head, body = curl("/v1/models")
    check(st == 200 and "application/json" in head, "GET /v1/models: %d" % st)
    o = json.loads(body)
    check(o["object"] == "list" and len(o["data"]) == 1, "/v1/models: %r" % o)
    m = o["data"][0]
    check(m["object"] == "model" and isinstance(m["id"], str) and m["id"], "/v1/models: model")
    check(is_int(m["created"]) and m["owned_by"] == "siliceo", "/v1/models: created / owned_by")
    st, _, body = curl("/v1/models/" + urllib.parse.quote(m["id"]))
    check(st == 200 and json.loads(body)["id"] == m["id"], "GET /v1/models/ID")
    st, _, body = curl("/v1/models/no-such-model")
    check_error(st, body, 404, "GET /v1/models/no-such-model")
    print("ok: /v1/models lists %r" % m["id"])
    return m["id"]


def health_metrics():
    st, _, body = curl("/health")
    check(st == 200 and json.loads(body)["status"] == "ok", "/health: %d %r" % (st, body))
    st, head, body = curl("/metrics")
    check(st == 200 and "text/plain" in head, "/metrics: %d" % st)
    text = body.decode()
    for name in ("siliceo_ready 1", "# TYPE siliceo_requests_total counter", "siliceo_openai_up 1"):
        check(name in text, "/metrics lacks %r" % name)
    print("ok: /health 200, /metrics relays the daemon's Prometheus text")


def chat(model):
    req = {"model": model, "messages": CHAT, "max_tokens": 12, "temperature": 0, "seed": 7,
           "think": False}
    st, head, body = curl("/v1/chat/completions", req)
    check(st == 200 and "application/json" in head, "chat: %d %r" % (st, body[:300]))
    o = json.loads(body)
    check_head(o, "chat.completion", "chatcmpl-", model, "chat")
    check(len(o["choices"]) == 1, "chat: choices")
    c = o["choices"][0]
    check(c["index"] == 0 and c["logprobs"] is None, "chat: index / logprobs")
    check(c["finish_reason"] in ("stop", "length"), "chat: finish_reason %r" % c["finish_reason"])
    check(c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str),
          "chat: message")
    check_usage(o["usage"], "chat")
    check(o["usage"]["completion_tokens"] <= 12, "chat: max_tokens 12 gave %d tokens" %
          o["usage"]["completion_tokens"])
    if c["finish_reason"] == "length":
        check(o["usage"]["completion_tokens"] == 12, "chat: length but not 12 tokens")
    # max_completion_tokens is the newer name of the same cap.
    req2 = dict(req, max_completion_tokens=3)
    del req2["max_tokens"]
    st, _, body = curl("/v1/chat/completions", req2)
    o2 = json.loads(body)
    check(st == 200 and o2["usage"]["completion_tokens"] <= 3, "max_completion_tokens: %r" % o2)
    print("ok: chat completion, %d tokens, finish %s" % (o["usage"]["completion_tokens"],
                                                          c["finish_reason"]))

    # Streamed, the same greedy request: the deltas add up to the same text.
    sreq = dict(req, stream=True, stream_options={"include_usage": True})
    st, head, body = curl("/v1/chat/completions", sreq, ["-N"])
    check(st == 200 and "text/event-stream" in head, "stream: %d %s" % (st, head))
    ev = sse_events(body)
    check(ev[-1] == "[DONE]", "stream does not end with [DONE]: %r" % ev[-1:])
    chunks = [json.loads(e) for e in ev[:-1]]
    text, finishes, ids = "", [], set()
    for i, ch in enumerate(chunks):
        check_head(ch, "chat.completion.chunk", "chatcmpl-", model, "chunk %d" % i)
        ids.add(ch["id"])
        if ch["choices"]:
            d = ch["choices"][0]
            check(d["index"] == 0 and "delta" in d and "finish_reason" in d, "chunk %d fields" % i)
            if i == 0:
                check(d["delta"].get("role") == "assistant", "first chunk has no role")
            text += d["delta"].get("content", "") or ""
            if d["finish_reason"] is not None:
                finishes.append(d["finish_reason"])
        check("usage" in ch, "chunk %d: usage field missing with include_usage" % i)
    check(len(ids) == 1, "chunk ids differ")
    check(finishes == [c["finish_reason"]], "stream finish_reason %r, non-stream %r" %
          (finishes, c["finish_reason"]))
    last = chunks[-1]
    check(last["choices"] == [] and last["usage"] is not None, "last chunk is not the usage chunk")
    check_usage(last["usage"], "stream usage")
    check(last["usage"]["completion_tokens"] == o["usage"]["completion_tokens"], "stream usage differs")
    check(text == c["message"]["content"], "stream text %r != %r" % (text, c["message"]["content"]))
    print("ok: streamed chat: %d chunks, same text as non-streamed, usage chunk, [DONE]" % len(chunks))

    # Reasoning goes to reasoning_content (the tiny model may or may not think: check the shape).
    st, _, body = curl("/v1/chat/completions", {"messages": CHAT, "max_tokens": 8, "temperature": 0,
                                                  "max_thinking_tokens": 4})
    check(st == 200, "max_thinking_tokens: %d %r" % (st, body[:200]))
    m = json.loads(body)["choices"][0]["message"]
    r = json.loads(body)["usage"]["completion_tokens_details"]["reasoning_tokens"]
    check(r <= 5, "max_thinking_tokens 4 gave %d reasoning tokens" % r)
    check((r > 0) == ("reasoning_content" in m), "reasoning_content present iff reasoning tokens")
    print("ok: max_thinking_tokens accepted, %d reasoning tokens" % r)


def completions(model):
    req = {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}
    st, _, body = curl("/v1/completions", req)
    check(st == 200, "completions: %d %r" % (st, body[:300]))
    o = json.loads(body)
    check_head(o, "text_completion", "cmpl-", model, "completions")
    c = o["choices"][0]
    check(isinstance(c["text"], str) and c["index"] == 0 and c["logprobs"] is None, "completion choice")
    check(c["finish_reason"] in ("stop", "length"), "completion finish_reason")
    check_usage(o["usage"], "completions")
    if c["finish_reason"] == "length":
        check(o["usage"]["completion_tokens"] == 5, "max_tokens 5 is a hard cap: %d" %
              o["usage"]["completion_tokens"])
    st, head, body = curl("/v1/completions", dict(req, stream=True), ["-N"])
    ev = sse_events(body)
    check(st == 200 and "text/event-stream" in head and ev[-1] == "[DONE]", "completion stream")
    chunks = [json.loads(e) for e in ev[:-1]]
    for ch in chunks:
        check_head(ch, "text_completion", "cmpl-", model, "completion chunk")
        check("usage" not in ch, "usage in a chunk without include_usage")
    text = "".join(ch["choices"][0]["text"] for ch in chunks)
    check(text == c["text"], "completion stream text %r != %r" % (text, c["text"]))
    check(chunks[-1]["choices"][0]["finish_reason"] == c["finish_reason"], "completion stream finish")
    # A prompt of token ids, and a stop string.
    st, _, body = curl("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 2, "stop": ["zz"]})
    check(st == 200, "token prompt: %d %r" % (st, body[:200]))
    print("ok: completions, streamed and not, token-id prompt")


def bad_input():
    st, _, body = curl("/v1/chat/completions", b'{"messages": [')
    check_error(st, body, 400, "truncated JSON")
    for raw in (b'{"messages":[], }', b"{'a':1}", b'{"a":01}', b'{"a":"\xc0\xaf"}', b'{"a":1}{',
                b'{"a":"\\ud800"}', b'{"a":1,"a":2}', b"\xef\xbb\xbf{}", b"", b"nul"):
        st, _, body = curl("/v1/chat/completions", raw)
        check_error(st, body, 400, "malformed %r" % raw)
    st, _, body = curl("/v1/chat/completions", {"messages": CHAT, "n": 2})
    e = check_error(st, body, 400, "n=2", "n")
    check("n = 1" in e["message"], "n=2 message unclear: %r" % e["message"])
    st, _, body = curl("/v1/chat/completions", {"messages": "hi"})
    check_error(st, body, 400, "messages string", "messages")
    st, _, body = curl("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]})
    check_error(st, body, 400, "tool role", "messages[0].role")
    st, _, body = curl("/v1/chat/completions", {"messages": CHAT, "max_tokens": 0})
    check_error(st, body, 400, "max_tokens 0", "max_tokens")
    st, _, body = curl("/v1/chat/completions", {"messages": CHAT, "temperature": "hot"})
    check_error(st, body, 400, "temperature string", "temperature")
    # A range only the daemon knows: its invalid_params comes back as a 400 naming the field.
    st, _, body = curl("/v1/chat/completions", {"messages": CHAT, "top_k": 5, "min_p": 7})
    check_error(st, body, 400, "daemon-checked min_p", "min_p")
    st, _, body = curl("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"5": 200}})
    check_error(st, body, 400, "logit_bias value", "logit_bias")
    # siliceod advertises logit_bias, so the bridge passes it on: +100 on ` forces the answer.
    tick = siltest.Client().ok("tokenize", {"text": "`"})[0]["ids"][0]
    st, _, body = curl("/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, "temperature": 0,
                                                 "logit_bias": {str(tick): 100}})
    check(st == 200 and json.loads(body)["choices"][0]["message"]["content"].startswith("```"),
          "logit_bias passed on to the daemon (%d %.80s)" % (st, body))
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (2 << 20)}]})
    st, _, body = curl("/v1/chat/completions", big)
    check_error(st, body, 413, "2 MiB body")
    # Chunked upload (no Content-Length) over the limit.
    st, _, body = curl("/v1/chat/completions", big, ["-H", "Transfer-Encoding: chunked"])
    check_error(st, body, 413, "2 MiB chunked body")
    # Python's http.client sends the whole body before it reads (no Expect: 100-continue): it
    # reads the 413, not a broken pipe.
    u = urllib.parse.urlsplit(BASE)
    hc = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    hc.request("POST", "/v1/chat/completions", body=big.encode(), headers={"Content-Type": "application/json"})
    r = hc.getresponse()
    check_error(r.status, r.read().decode(), 413, "2 MiB body from http.client")
    hc.close()
    st, _, body = curl("/v1/nothing")
    check_error(st, body, 404, "unknown URL")
    st, _, body = curl("/v1/chat/completions")
    check_error(st, body, 405, "GET on a POST endpoint")
    st, _, body = curl("/health")
    check(st == 200, "bridge unhealthy after bad input")
    print("ok: malformed JSON, bad fields, n>1, oversized bodies: 4xx error objects; bridge alive")


def open_stream(req):
    h = http.client.HTTPConnection(U.hostname, U.port, timeout=60)
    h.request("POST", "/v1/chat/completions", json.dumps(req), {"Content-Type": "application/json"})
    return h, h.getresponse()


def sse_client():
    """http.client reading the SSE stream line by line, as a streaming client does."""
    h, r = open_stream({"messages": CHAT, "max_tokens": 16, "stream": True, "temperature": 0})
    check(r.status == 200 and r.getheader("Content-Type") == "text/event-stream", "SSE headers")
    n, done, data = 0, False, []
    while True:
        line = r.readline()
        if not line:
            break
        line = line.decode().rstrip("\r\n")
        if not line:
            continue
        check(line.startswith("data: "), "SSE line %r" % line)
        p = line[6:]
        if p == "[DONE]":
            done = True
            continue
        check(not done, "data after [DONE]")
        data.append(json.loads(p))
        n += 1
    h.close()
    check(done and n >= 2, "http.client saw %d chunks, done=%s" % (n, done))
    check(data[-1]["choices"][0]["finish_reason"] in ("stop", "length"), "SSE finish")
    print("ok: http.client parses the SSE stream: %d chunks then [DONE]" % n)


def daemon_status():
    c = siltest.Client()
    st, _ = c.ok("status")
    c.close()
    return st


def wait_idle(before, what):
    for _ in range(100):
        st = daemon_status()
        if st["queue"]["running"] == 0 and st["queue"]["queued"] == 0 and \
                st["requests"]["cancelled"] > before:
            return st
        time.sleep(0.05)
    fail("%s: daemon still runs the request or did not count it cancelled: %r" %
         (what, st["queue"], ))


def cancel_on_disconnect():
    long = {"messages": CHAT, "max_tokens": 100000, "temperature": 1.0, "think": False,
            "stop": ["\x01\x02never"]}
    before = daemon_status()["requests"]["cancelled"]
    h, r = open_stream(dict(long, stream=True))
    check(r.status == 200, "long stream")
    r.readline()
    st = daemon_status()
    check(st["queue"]["running"] == 1, "the long request is not running: %r" % st["queue"])
    h.sock.shutdown(2)
    h.close()
    st = wait_idle(before, "streamed")
    print("ok: a streaming client that disconnects cancels its request (cancelled %d -> %d)" %
          (before, st["requests"]["cancelled"]))
    before = st["requests"]["cancelled"]
    h = http.client.HTTPConnection(U.hostname, U.port, timeout=60)
    h.request("POST", "/v1/chat/completions", json.dumps(long), {"Content-Type": "application/json"})
    for _ in range(100):
        if daemon_status()["queue"]["running"] == 1:
            break
        time.sleep(0.02)
    else:
        fail("non-streamed long request never ran")
    h.sock.shutdown(2)
    h.close()
    st = wait_idle(before, "non-streamed")
    print("ok: a non-streaming client that disconnects cancels its request too")
    st, _, _ = curl("/health")
    check(st == 200, "bridge unhealthy after disconnects")


def concurrency(base_limited):
    """Against a bridge started with --max-concurrent 1: a second request in flight gets 429."""
    global U
    u0 = U
    U = urllib.parse.urlparse(base_limited)
    h, r = open_stream({"messages": CHAT, "max_tokens": 100000, "stream": True, "think": False})
    r.readline()
    out = subprocess.run(["curl", "-sS", "-o", "-", "-w", "\n%{http_code}", base_limited +
                          "/v1/chat/completions", "-d", json.dumps({"messages": CHAT})],
                         capture_output=True, check=True).stdout.decode()
    body, code = out.rsplit("\n", 1)
    check_error(int(code), body.encode(), 429, "second request over --max-concurrent 1")
    h.close()
    U = u0
    print("ok: --max-concurrent 1: a second request gets 429")


def log_lines(log, n, what):
    """The bridge's log once it holds n request lines (a line is written once the answer is out,
    which may be just after the client has read it)."""
    for _ in range(100):
        with open(log, encoding="utf-8", errors="replace") as f:
            lines = [ln.rstrip("\n") for ln in f if ln.startswith("sil-openai: ") and
                     "listening on" not in ln]
        if len(lines) >= n:
            return lines
        time.sleep(0.05)
    fail("%s: %d request lines in the bridge's log, want %d: %r" % (what, len(lines), n, lines))


def request_log(log):
    """Against a bridge at the default log level whose stderr is LOG: one info line a request
    (method, path, response id, status, model, the daemon's stop reason, token counts, time),
    none for /health, and never the prompt's text."""
    secret = "Quixotic%dZebra" % os.getpid()
    ask = [{"role": "user", "content": "Repeat " + secret}]
    lines = log_lines(log, 0, "start")
    n0 = len(lines)
    for _ in range(3):
        curl("/health")
    st, _, body = curl("/v1/chat/completions", {"messages": ask, "max_tokens": 3, "temperature": 0})
    check(st == 200, "chat for the log: %d %r" % (st, body[:200]))
    o = json.loads(body)
    u, fin = o["usage"], o["choices"][0]["finish_reason"]
    lines = log_lines(log, n0 + 1, "one chat")
    line = lines[n0]
    # The daemon's stop_reason: length when max_tokens cut it, else eos or a stop string.
    want = ("sil-openai: info: POST /v1/chat/completions %s: 200, model %s, " %
            (o["id"], o["model"]))
    check(line.startswith(want), "the chat's line %r does not start %r" % (line, want))
    rest = line[len(want):].split(", ")
    check(rest[0] == "length" if fin == "length" else rest[0] in ("eos", "stop"),
          "stop reason %r for finish_reason %s" % (rest[0], fin))
    check(rest[1] == "%d prompt tokens (%d cached)" %
          (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]),
          "prompt counts %r, usage %r" % (rest[1], u))
    check(rest[2] == "%d generated" % u["completion_tokens"], "generated %r, usage %r" % (rest[2], u))
    check(rest[3].endswith(" ms") and float(rest[3][:-3]) > 0 and len(rest) == 4,
          "time %r in %r" % (rest[3:], line))

    req = {"messages": ask, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}}
    st, _, body = curl("/v1/chat/completions", req)
    ev = [json.loads(e) for e in sse_events(body) if e != "[DONE]"]
    u = ev[-1]["usage"]
    lines = log_lines(log, n0 + 2, "a stream")
    want = "POST /v1/chat/completions %s: 200, model %s, streamed, " % (ev[0]["id"], ev[0]["model"])
    check(want in lines[-1] and ", %d prompt tokens (%d cached), %d generated, " %
          (u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"],
           u["completion_tokens"]) in lines[-1], "the stream's line %r (usage %r)" % (lines[-1], u))

    # the path as the bridge reads it, %-escapes decoded: a newline must not start a line of its own
    st, _, _ = curl("/no/such%5Cpath%0Ainfo:")
    lines = log_lines(log, n0 + 3, "a 404")
    check(lines[-1].startswith("sil-openai: info: GET /no/such\\x5cpath\\x0ainfo:: 404, ") and
          lines[-1].endswith(" ms"), "the 404's line %r" % lines[-1])
    lines = log_lines(log, n0 + 3, "all")
    check(len(lines) == n0 + 3, "lines for /health at info level: %r" % lines[n0:])
    with open(log, encoding="utf-8", errors="replace") as f:
        check(secret not in f.read(), "the bridge's log holds the prompt's text")
    print("ok: the bridge logs a line a request (status, model, stop reason, counts as in usage, "
          "time), none for /health, no prompt text")


what = sys.argv[2] if len(sys.argv) > 2 else "all"
if what == "concurrency":
    concurrency(BASE)
    sys.exit(0)
if what == "log":
    request_log(sys.argv[3])
    sys.exit(0)
model = models()
health_metrics()
chat(model)
completions(model)
sse_client()
bad_input()
cancel_on_disconnect()
print("ok: all sil-openai checks passed")
