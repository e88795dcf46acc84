"""Prefill progress notifications (siliceo-rpc(7), the progress field) against a running siliceod
(socket in $SILICEO_SOCKET) whose prompts take many steps: run by
tests/integration/daemon_progress.sh, which gives it the prefill chunk and the minimum time of a
step. Arguments: the prefill chunk, then one group: caps, long, cached, off, bad, chat."""
import sys
import time

from siltest import Client, check

GREEDY = {"temperature": 0, "grace_tokens": 0, "max_tokens": 2}
INTERVAL = 0.25  # the daemon's least time between two notifications of a request


def prompt(n_words, tag="p"):
    return " ".join("%s%d" % (tag, i % 97) for i in range(n_words))


def request(c, method, params):
    """One request; returns (error, result, [(arrival time, method, params) of its notes])."""
    msgid = c.send(method, params)
    notes = []
    while True:
        m = c.read()
        if m is None:
            raise EOFError("connection closed while waiting for %d" % msgid)
        if m[0] == 2:
            p = m[2][0] if isinstance(m[2], list) and m[2] else m[2]
            if isinstance(p, dict) and p.get("id") == msgid:
                notes.append((time.monotonic(), m[1], p))
        elif m[0] == 1 and m[1] == msgid:
            return m[2], m[3], notes


def progress_of(notes):
    return [(t, p) for t, meth, p in notes if meth == "progress"]


def check_progress(notes, res, chunk, what):
    """The notes of one request: progress first, growing, rate-limited, ending at the evaluated
    part of the prompt; returns how many progress notes came."""
    prog = progress_of(notes)
    kinds = [meth for _, meth, _ in notes]
    check(all(k in ("progress", "token") for k in kinds), "%s: only progress and token notes (%s)"
          % (what, sorted(set(kinds))))
    first_token = kinds.index("token") if "token" in kinds else len(kinds)
    check(len(prog) > 0 and kinds[:first_token] == ["progress"] * len(prog),
          "%s: %d progress notes, all before the first token" % (what, len(prog)))
    total = res["n_prompt"] - res["n_cached"]
    check(all(p["n_prompt"] == res["n_prompt"] and p["n_cached"] == res["n_cached"] for _, p in prog),
          "%s: every note has the result's n_prompt %d and n_cached %d" % (what, res["n_prompt"], res["n_cached"]))
    done = [p["n_evaluated"] for _, p in prog]
    check(all(a < b for a, b in zip(done, done[1:])), "%s: n_evaluated grows: %s" % (what, done))
    check(done[-1] == total, "%s: the last note says the whole prompt (%d of %d tokens evaluated)"
          % (what, done[-1], total))
    check(done[0] <= chunk, "%s: the first note comes after the first chunk (%d <= %d tokens)"
          % (what, done[0], chunk))
    # At most one note every 0.25 s besides the last: over the span between the first and the
    # last note, a count above span / 0.25 + 2 (one for either end) means no limit was kept.
    span = prog[-1][0] - prog[0][0]
    check(len(prog) <= span / INTERVAL + 2,
          "%s: rate-limited: %d notes in %.2f s (steps of %d tokens: %d steps)"
          % (what, len(prog), span, chunk, (total + chunk - 1) // chunk))
    return len(prog)


def caps(chunk):
    c = Client()
    res, _ = c.ok("hello", {"protocol": [1]})
    check("progress" in res["capabilities"], "hello lists the progress capability")


def long(chunk):
    c = Client()
    err, res, notes = request(c, "generate", dict(GREEDY, prompt=prompt(320), progress=True))
    check(err is None and res["n_generated"] >= 1, "a long prompt with progress is answered")
    total = res["n_prompt"] - res["n_cached"]
    check(total > 20 * chunk, "the prompt takes many steps (%d tokens to evaluate, chunks of %d)" % (total, chunk))
    n = check_progress(notes, res, chunk, "long prompt")
    check(n >= 3, "a prompt of %.1f s of steps gives at least 3 notes (%d)"
          % (res["timings"]["prefill_ms"] / 1e3, n))


def cached(chunk):
    """On a session the second prompt extends the first: the notes say what was reused and count
    only the tokens evaluated."""
    c = Client()
    first = prompt(150, "s")
    err, res, notes = request(c, "generate", dict(GREEDY, prompt=first, session="progress", progress=True))
    check(err is None and res["n_cached"] == 0, "a fresh session evaluates its whole prompt")
    check_progress(notes, res, chunk, "fresh session")
    err, res, notes = request(c, "generate", dict(GREEDY, prompt=first + " " + prompt(200, "t"),
                                                  session="progress", progress=True))
    check(err is None and res["n_cached"] > 0, "the extended prompt reuses the session (%d cached)"
          % (res["n_cached"] if res else -1))
    check_progress(notes, res, chunk, "session continued")


def off(chunk):
    """A client that does not ask gets no progress note; on one connection two requests, one that
    asks and one that does not, get theirs only."""
    c = Client()
    for extra, what in [({}, "without the field"), ({"progress": False}, "with progress false"),
                        ({"progress": None}, "with progress nil")]:
        err, res, notes = request(c, "generate", dict(GREEDY, prompt=prompt(120, "o"), **extra))
        check(err is None and res["n_prompt"] > 10 * chunk and not progress_of(notes)
              and any(m == "token" for _, m, _ in notes),
              "a long prompt %s: tokens streamed, no progress note" % what)
    a = c.send("generate", dict(GREEDY, prompt=prompt(150, "a"), progress=True))
    b = c.send("generate", dict(GREEDY, prompt=prompt(150, "b")))
    got, done = {a: 0, b: 0}, set()
    while len(done) < 2:
        m = c.read()
        if m is None:
            raise EOFError("connection closed")
        if m[0] == 2 and m[1] == "progress":
            got[m[2][0]["id"]] = got.get(m[2][0]["id"], 0) + 1
        elif m[0] == 1:
            check(m[2] is None, "request %d answered" % m[1])
            done.add(m[1])
    check(got[a] > 0 and got[b] == 0 and len(got) == 2,
          "two requests at once: progress notes for the one that asked only (%r)" % got)


def bad(chunk):
    c = Client()
    for v in ["yes", 1, [True], {"on": True}]:
        err, _, _ = c.call("generate", dict(GREEDY, prompt="x", progress=v))
        check(err is not None and err["code"] == 4 and "progress" in err["message"],
              "progress %r: error 4 naming the field" % (v,))
    err, _, _ = c.call("chat", dict(GREEDY, messages=[{"role": "user", "content": "x"}], progress="on"))
    check(err is not None and err["code"] == 4 and "progress" in err["message"], "chat checks progress too")
    c.ok("status")
    check(True, "the daemon goes on after the refused requests")


def chat(chunk):
    c = Client()
    err, res, notes = request(c, "chat", dict(GREEDY, messages=[{"role": "user", "content": prompt(250, "c")}],
                                              think=False, progress=True))
    check(err is None, "a long chat with progress is answered")
    check_progress(notes, res, chunk, "chat")


if __name__ == "__main__":
    globals()[sys.argv[2]](int(sys.argv[1]))
