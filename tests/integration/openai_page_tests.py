"""sil-openai's chat page in headless Chromium, driven as a user would (clicks, typed text, keys):
Usage: openai_page_tests.py DIR answer BASE     a question typed and sent: the streamed answer and
                                                its folded reasoning equal curl's for the same
                                                greedy request; a second question carries the
                                                conversation; a refused question shows the
                                                error; nothing is loaded from elsewhere
       openai_page_tests.py DIR stop BASE       a long answer stopped mid-stream: the page stops
                                                growing and the daemon cancels the request
       openai_page_tests.py DIR key BASE TOKEN  a bridge that wants a token: the page asks for it
DIR is a scratch directory for Chromium's profile and output."""
import json
import os
import subprocess
import sys
import time
import urllib.parse

import cdp

DIR, MODE, BASE = sys.argv[1], sys.argv[2], sys.argv[3]


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def curl_stream(body, token=None):
    """(answer, reasoning) of a streamed chat completion made by curl, its chunks joined."""
    cmd = ["curl", "-sSN", "--max-time", "60", BASE + "/v1/chat/completions",
           "-H", "Content-Type: application/json", "--data-binary", "@-"]
    if token:
        cmd += ["-H", "Authorization: Bearer " + token]
    out = subprocess.run(cmd, input=json.dumps(dict(body, stream=True)).encode(),
                         capture_output=True, check=True).stdout.decode("utf-8", "replace")
    text = reasoning = ""
    done = False
    for ln in out.splitlines():
        if not ln.startswith("data: "):
            continue
        if ln == "data: [DONE]":
            done = True
            continue
        c = json.loads(ln[6:])
        check("error" not in c, "curl's stream failed: %r" % c)
        for ch in c["choices"]:
            text += ch["delta"].get("content") or ""
            reasoning += ch["delta"].get("reasoning_content") or ""
    check(done, "curl's stream has no [DONE]: %r" % out[-300:])
    return text, reasoning


def metric(name):
    out = subprocess.run(["curl", "-sS", BASE + "/metrics"], capture_output=True, check=True).stdout
    for ln in out.decode().splitlines():
        if ln.startswith(name + " "):
            return float(ln.split()[1])
    fail("no %s in /metrics" % name)


LAST = """(() => { const m = [...document.querySelectorAll('.msg.assistant')].pop(); if (!m) return null;
  const r = m.querySelector('.reasoning');
  return {state: m.dataset.state, answer: m.querySelector('.answer').textContent,
          reasoning: r.querySelector('.text').textContent, shown: !r.hidden, open: r.open,
          summary: r.querySelector('summary').textContent, meta: m.querySelector('.meta').textContent,
          n: document.querySelectorAll('.msg.assistant').length}; })()"""


def last(b):
    return b.eval(LAST)


def wait_answer(b, n):
    """The n-th answer once its stream has ended."""
    return b.wait(lambda: (lambda m: m if m and m["n"] == n and m["state"] != "streaming" else None)(last(b)),
                  "answer %d to end" % n, 60)


def open_page(b):
    b.open_page()
    b.navigate(BASE + "/")
    check(b.eval("document.title").endswith("siliceo"), "title %r" % b.eval("document.title"))
    # the style sheet came from the bridge and applies (the policy allows no inline style)
    sheets = b.eval("[...document.styleSheets].map(s => s.href)")
    check(sheets == [BASE + "/chat.css"], "style sheets %r" % (sheets,))
    check(b.eval("getComputedStyle(document.querySelector('#status')).maxWidth") not in ("none", ""),
          "chat.css does not apply")


def models_listed(b):
    return b.wait(lambda: b.eval("[...document.querySelectorAll('#model option')].map(o => o.value)"),
                  "the model picker to fill")


def settings(b, temperature, max_tokens, think=None):
    """Opens Settings and types the temperature and the answer budget into their fields."""
    if not b.eval("document.querySelector('#settings').open"):
        b.click("#settings summary")
    for sel, v in (("#temperature", temperature), ("#maxtokens", max_tokens)):
        b.click(sel)
        b.eval("document.querySelector('%s').select()" % sel)
        b.type(str(v))
    if think is not None and b.eval("document.querySelector('#think').checked") != think:
        b.click("#think")


def ask(b, question, how):
    b.click("#input")
    b.type(question)
    check(b.eval("document.querySelector('#input').value") == question, "the question was not typed")
    if how == "click":
        b.click("#send")
    else:
        b.key("Enter", "Enter", 13)


def only_own_origin(b):
    """Every request the page made went to the bridge; a request elsewhere is refused by the
    page's Content-Security-Policy."""
    origin = urllib.parse.urlparse(BASE)
    urls = [e["params"]["request"]["url"] for e in b.events if e["method"] == "Network.requestWillBeSent"]
    check(urls, "no request recorded")
    for u in urls:
        p = urllib.parse.urlparse(u)
        check(p.scheme == origin.scheme and p.netloc == origin.netloc, "the page loaded %s" % u)
    v = b.eval("""new Promise((done) => {
        document.addEventListener('securitypolicyviolation', (e) => done(e.effectiveDirective), {once: true});
        fetch('http://192.0.2.1/').catch(() => {});
        setTimeout(() => done('allowed'), 5000); })""", await_promise=True)
    check(v == "connect-src", "a fetch to another origin: %r, want a connect-src violation" % v)
    v = b.eval("""new Promise((done) => {
        document.addEventListener('securitypolicyviolation', (e) => done(e.effectiveDirective), {once: true});
        const i = document.createElement('img'); i.src = 'http://192.0.2.1/x.png'; document.body.append(i);
        setTimeout(() => done('allowed'), 5000); })""", await_promise=True)
    check(v == "img-src", "an image from another origin: %r, want an img-src violation" % v)
    print("ok: the page made %d requests, all to the bridge; other origins are refused by its "
          "Content-Security-Policy" % len(urls))


def test_answer(b):
    open_page(b)
    models = models_listed(b)
    want_models = [m["id"] for m in json.loads(subprocess.run(
        ["curl", "-sS", BASE + "/v1/models"], capture_output=True, check=True).stdout)["data"]]
    check(models == want_models, "the picker lists %r, /v1/models %r" % (models, want_models))
    model = b.eval("document.querySelector('#model').value")
    print("ok: the model picker lists /v1/models: %r" % models)

    settings(b, 0, 200)
    q1 = "What is 23 x 47?"
    ask(b, q1, "click")
    m = wait_answer(b, 1)
    check(m["state"] == "done", "answer 1 ended %r: %r" % (m["state"], m["meta"]))
    body = {"model": model, "messages": [{"role": "user", "content": q1}], "temperature": 0,
            "max_tokens": 200, "think": True}
    text, reasoning = curl_stream(body)
    check(m["answer"] == text, "the page's answer %r, curl's %r" % (m["answer"], text))
    check(m["reasoning"] == reasoning, "the page's reasoning %r, curl's %r" % (m["reasoning"], reasoning))
    check(text and reasoning, "curl's answer %r or reasoning %r is empty" % (text, reasoning))
    check(m["shown"] and not m["open"], "the reasoning is not shown folded: %r" % m)
    check("tokens" in m["meta"], "no token count under the answer: %r" % m["meta"])
    print("ok: typed and sent, the page's answer %r and reasoning %r equal curl's streamed ones"
          " (greedy); the reasoning is folded" % (text, reasoning))
    b.click(".msg.assistant .reasoning summary")
    check(b.eval("document.querySelector('.msg.assistant .reasoning').open"), "a click does not unfold it")

    q2 = "What is 51 x 44?"
    ask(b, q2, "enter")
    m2 = wait_answer(b, 2)
    check(m2["state"] == "done", "answer 2 ended %r: %r" % (m2["state"], m2["meta"]))
    body["messages"] += [{"role": "assistant", "content": text, "reasoning_content": reasoning},
                         {"role": "user", "content": q2}]
    text2, reasoning2 = curl_stream(body)
    check((m2["answer"], m2["reasoning"]) == (text2, reasoning2),
          "the second answer %r / %r, curl's with the whole conversation %r / %r"
          % (m2["answer"], m2["reasoning"], text2, reasoning2))
    print("ok: a question sent with Enter carries the conversation: answer %r equals curl's" % text2)

    # A question the daemon refuses: the page shows the bridge's error and the conversation
    # goes on without it.
    body["messages"] += [{"role": "assistant", "content": text2, "reasoning_content": reasoning2}]
    ask(b, "7 " * 6000, "enter")
    m3 = wait_answer(b, 3)
    refused = subprocess.run(["curl", "-sS", BASE + "/v1/chat/completions", "--data-binary", "@-"],
                             input=json.dumps(dict(body, messages=body["messages"] + [
                                 {"role": "user", "content": "7 " * 6000}])).encode(),
                             capture_output=True, check=True).stdout
    want = json.loads(refused)["error"]["message"]
    check(m3["state"] == "error" and m3["meta"].startswith(want),
          "a refused question shows %r (%s), want the bridge's %r" % (m3["meta"], m3["state"], want))
    q4 = "What is 12 x 13?"
    ask(b, q4, "enter")
    m4 = wait_answer(b, 4)
    text4, reasoning4 = curl_stream(dict(body, messages=body["messages"] + [{"role": "user", "content": q4}]))
    check((m4["answer"], m4["reasoning"]) == (text4, reasoning4),
          "after the refusal the answer %r, curl's %r" % (m4["answer"], text4))
    print("ok: a refused question shows the bridge's error (%r) and is left out of the conversation"
          % m3["meta"])

    b.click("#new")
    check(b.eval("document.querySelectorAll('.msg').length") == 0, "New chat left messages")
    only_own_origin(b)


def test_stop(b):
    open_page(b)
    models_listed(b)
    settings(b, 0, 4000, think=False)
    cancelled0 = metric("siliceo_requests_cancelled_total")
    t0 = time.monotonic()
    ask(b, "Tell me a long story.", "click")
    m = b.wait(lambda: (lambda m: m if m and m["state"] == "streaming" and len(m["answer"]) >= 20 else None)(last(b)),
               "a partial answer while streaming", 30)
    check(not b.eval("document.querySelector('#stop').disabled"), "Stop is disabled while streaming")
    b.click("#stop")
    m = b.wait(lambda: (lambda m: m if m and m["state"] != "streaming" else None)(last(b)), "the stop", 5)
    check(m["state"] == "stopped", "after Stop the answer is %r: %r" % (m["state"], m["meta"]))
    time.sleep(0.5)
    m2 = last(b)
    check(m2["answer"] == m["answer"], "the answer grew after Stop")
    b.wait(lambda: metric("siliceo_requests_cancelled_total") == cancelled0 + 1 and
           metric("siliceo_queue_running") == 0, "the daemon to cancel the request", 5)
    took = time.monotonic() - t0
    check(not b.eval("document.querySelector('#send').disabled"), "Send stays disabled after Stop")
    print("ok: Stop ends a streaming answer (%d characters shown, 'stopped'), the daemon cancelled "
          "the request, %.1f s after it was sent" % (len(m["answer"]), took))


def test_key(b, token):
    open_page(b)
    b.wait(lambda: not b.eval("document.querySelector('#keybox').hidden"), "the API key field")
    check("API key" in b.eval("document.querySelector('#status').textContent"), "no word on the key")
    check(not b.eval("document.querySelectorAll('#model option').length"), "models listed without the key")
    b.click("#key")
    b.type("wrong-" + token)
    b.key("Enter", "Enter", 13)
    b.wait(lambda: "refused" in b.eval("document.querySelector('#status').textContent"),
           "the page to say the key was refused")
    b.click("#key")
    b.type(token)
    b.click("#keyset")
    models_listed(b)
    check(b.eval("sessionStorage.getItem('siliceo-api-key')") == token, "the key is not kept for the tab")
    check(b.eval("localStorage.length") == 0, "something was written to localStorage")
    settings(b, 0, 16)
    ask(b, "What is 12 x 12?", "enter")
    m = wait_answer(b, 1)
    check(m["state"] == "done" and m["answer"], "with the key the answer is %r" % m)
    print("ok: the page asks for the API key, says a wrong one is refused, keeps the right one for"
          " the tab and answers with it")


b = cdp.Browser(cdp.find(), DIR)
try:
    if MODE == "answer":
        test_answer(b)
    elif MODE == "stop":
        test_stop(b)
    elif MODE == "key":
        test_key(b, sys.argv[4])
    else:
        fail("unknown mode " + MODE)
except cdp.Error as e:
    with open(b.log_path, errors="replace") as f:
        print("".join(f.readlines()[-20:]))
    fail(str(e))
finally:
    b.close()
