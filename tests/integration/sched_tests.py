"""Scheduler checks against a running siliceod (socket in $SILICEO_SOCKET), one group per
argument: priority-params, mixed, preempt, kv-space, gap. Run by tests/integration/daemon_sched.sh,
which starts the daemon with the settings (and test hooks) each group expects."""
import statistics
import sys
import threading
import time

from siltest import Client, check

GREEDY = {"temperature": 0, "grace_tokens": 0}
CLASSES = ("interactive", "normal", "batch")


def status():
    c = Client()
    st = c.ok("status")[0]
    c.close()
    return st


def streamed(c, params):
    """One generate; returns (error, result, notes, t_send, [arrival time of each token note])."""
    times = []
    t0 = time.monotonic()
    err, res, notes = c.wait(c.send("generate", params), on_note=lambda n: times.append(time.monotonic()))
    return err, res, notes, t0, times


def ids_of(notes):
    return [i for n in notes for i in n.get("ids", [])]


def priority_params():
    c = Client()
    caps = c.ok("hello", {"protocol": [1]})[0]["capabilities"]
    check("priority" in caps and "preemption" in caps, "hello lists priority and preemption")
    for bad, what in [({"priority": "urgent"}, "an unknown class"), ({"priority": 3}, "class 3"),
                      ({"priority": [1]}, "an array"), ({"priority_level": 101}, "level 101"),
                      ({"priority_level": -101}, "level -101"), ({"priority_level": "high"}, "a string level"),
                      ({"priority_level": 1.5}, "a float level")]:
        err, _, _ = c.call("generate", dict(GREEDY, prompt="x", max_tokens=2, **bad))
        check(err is not None and err["code"] == 4 and "priority" in err["message"],
              "generate refuses %s with error 4 naming the field" % what)
    err, _, _ = c.call("chat", dict(GREEDY, messages=[{"role": "user", "content": "x"}], max_tokens=2,
                                    priority_level=500))
    check(err is not None and err["code"] == 4, "chat refuses level 500 with error 4")
    for good in [{"priority": "batch", "priority_level": -100}, {"priority": 0, "priority_level": 100},
                 {"priority": None, "priority_level": None}]:
        r, _ = c.ok("generate", dict(GREEDY, prompt="x", max_tokens=2, **good))
        check(r["n_generated"] >= 1 and r["n_preempted"] == 0, "generate accepts %r" % good)
    c.close()


def mixed(n_clients):
    """n clients at once, classes round-robin with a level each: all complete, and interactive
    requests see their first token sooner on average than normal, normal sooner than batch."""
    barrier = threading.Barrier(n_clients)
    out = [None] * n_clients

    def one(i):
        cls = CLASSES[i % 3]
        c = Client(timeout=300)
        c.ok("hello", {"protocol": [1]})
        barrier.wait()
        err, res, notes, t0, times = streamed(c, dict(GREEDY, prompt="Request %d: tell a story." % i,
                                                      max_tokens=16, priority=cls, priority_level=(i * 7) % 21 - 10))
        t_end = time.monotonic()
        out[i] = (cls, err, res, notes, (times[0] - t0) if times else None, t_end - t0)
        c.close()

    th = [threading.Thread(target=one, args=(i,)) for i in range(n_clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    errs = [o[1] for o in out if o[1] is not None]
    check(not errs, "all %d requests complete (errors: %s)" % (n_clients, errs[:3]))
    check(all(ids_of(o[3]) == o[2]["tokens"] for o in out), "every stream's ids equal its result tokens")
    ttft = {k: [o[4] for o in out if o[0] == k] for k in CLASSES}
    done = {k: [o[5] for o in out if o[0] == k] for k in CLASSES}
    pre = sum(o[2]["n_preempted"] for o in out)
    for k in CLASSES:
        print("figure: %-11s first token mean %7.1f ms median %7.1f ms, end mean %7.1f ms (%d requests)" %
              (k, 1e3 * statistics.mean(ttft[k]), 1e3 * statistics.median(ttft[k]), 1e3 * statistics.mean(done[k]),
               len(ttft[k])))
    print("figure: %d preemptions in the run" % pre)
    m = {k: statistics.mean(ttft[k]) for k in CLASSES}
    check(m["interactive"] < m["normal"] < m["batch"],
          "mean first-token latency: interactive %.0f < normal %.0f < batch %.0f ms" %
          (1e3 * m["interactive"], 1e3 * m["normal"], 1e3 * m["batch"]))
    e = {k: statistics.mean(done[k]) for k in CLASSES}
    check(e["interactive"] < e["batch"], "interactive requests finish first on average")
    st = status()
    check(st["queue"]["running"] == 0 and st["queue"]["queued"] == 0, "queue empty afterwards")


NO_EOS = {}


def no_eos():
    """A logit_bias that keeps the end-of-generation tokens out, for streams of a set length."""
    c = Client()
    eos = c.ok("tokenize", {"text": "<|im_end|><|endoftext|>", "special": True})[0]["ids"]
    c.close()
    NO_EOS.update({i: -100 for i in eos})


def preempt():
    """max_running 1: a batch request is preempted by an interactive one mid-answer and resumes
    by recompute; its tokens equal those of the same request run alone (greedy), and what it
    streamed is exactly its result: nothing lost, nothing repeated."""
    no_eos()
    c = Client(timeout=300)
    params = dict(GREEDY, prompt="The scheduler test: once upon a time", max_tokens=48, priority="batch",
                  logit_bias=NO_EOS)
    alone, _ = c.ok("generate", params)
    check(alone["n_preempted"] == 0 and alone["n_generated"] >= 8, "alone: %d tokens, not preempted" %
          alone["n_generated"])
    before = status()["requests"]["preempted"]

    got = {}

    def interactive():
        # Sent once the batch request has streamed a few tokens: it must take the only slot.
        got["go"].wait()
        ci = Client(timeout=300)
        err, res, notes, t0, times = streamed(ci, dict(GREEDY, prompt="Quick question", max_tokens=6,
                                                       priority="interactive"))
        got["i"] = (err, res, time.monotonic())
        ci.close()

    got["go"] = threading.Event()
    t = threading.Thread(target=interactive)
    t.start()
    n_seen = [0]

    def on_note(n):
        n_seen[0] += 1
        if n_seen[0] == 4:
            got["go"].set()

    err, res, notes = c.wait(c.send("generate", params), on_note=on_note)
    t_b = time.monotonic()
    t.join()
    check(err is None and got["i"][0] is None, "both requests complete")
    check(res["n_preempted"] >= 1, "the batch request was preempted (%d times)" % res["n_preempted"])
    check(got["i"][2] < t_b, "the interactive request finished first")
    check(res["tokens"] == alone["tokens"], "preempted and resumed: the same %d tokens as alone" % len(res["tokens"]))
    check(ids_of(notes) == res["tokens"], "streamed ids equal the result: none lost or repeated")
    check("".join(n["text"] for n in notes) == res["text"] == alone["text"], "streamed text equals the text alone")
    st = status()
    check(st["requests"]["preempted"] > before and st["tokens"]["recomputed"] > 0,
          "status counts the preemption and the recomputed positions (%d)" % st["tokens"]["recomputed"])

    # On a session: preempted and resumed, the session then holds what it holds without the
    # preemption, and a follow-up request reuses it the same way.
    ids = c.ok("tokenize", {"text": params["prompt"]})[0]["ids"]
    more = c.ok("tokenize", {"text": " And then"})[0]["ids"]
    runs = {}
    for name in ("alone", "preempted"):
        sp = dict(params, session="sched-" + name)
        got["go"] = threading.Event()
        n_seen[0] = 0
        t = None
        if name == "preempted":
            t = threading.Thread(target=interactive)
            t.start()
            err, r1, notes = c.wait(c.send("generate", sp), on_note=on_note)
            t.join()
        else:
            err, r1, notes = c.wait(c.send("generate", sp))
        check(err is None and ids_of(notes) == r1["tokens"], "session %s: complete, stream equals result" % name)
        r2, _ = c.ok("generate", dict(GREEDY, prompt_tokens=ids + r1["tokens"] + more, max_tokens=16,
                                      session="sched-" + name))
        runs[name] = (r1, r2)
    (a1, a2), (p1, p2) = runs["alone"], runs["preempted"]
    check(a1["n_preempted"] == 0 and p1["n_preempted"] >= 1, "the session request was preempted")
    check(p1["tokens"] == a1["tokens"], "on a session, preempted: the same tokens as alone")
    check(p2["n_cached"] == a2["n_cached"] and p2["n_cached"] >= len(ids) + len(a1["tokens"]) - 1,
          "the follow-up reuses %d positions of the session, as without the preemption" % p2["n_cached"])
    check(p2["tokens"] == a2["tokens"], "and continues with the same tokens")

    # Cancelled while preempted: once the interactive request streams, the batch one (one slot)
    # waits in the queue; a cancel then ends it at once, before the interactive one is done.
    mid = c.send("generate", dict(params, max_tokens=400))
    ev = {}

    def interactive_cancels():
        ci = Client(timeout=300)
        sent = []

        def on_note(n):
            if not sent:
                ev["queued"] = status()["queue"]["queued"]
                c.send("cancel", {"id": mid})
                sent.append(time.monotonic())
        err, res, notes = ci.wait(ci.send("generate", dict(GREEDY, prompt="Another question", max_tokens=40,
                                                           priority="interactive", logit_bias=NO_EOS)),
                                  on_note=on_note)
        ev["i_end"] = time.monotonic()
        ev["i_err"] = err
        ci.close()

    cn = []
    t = None
    while True:
        m = c.read()
        if m[0] == 2 and m[2][0].get("id") == mid:
            cn.append(m[2][0])
            if len(cn) == 4:
                t = threading.Thread(target=interactive_cancels)
                t.start()
        elif m[0] == 1 and m[1] == mid:
            break
    t_cancelled = time.monotonic()
    t.join()
    check("queued" in ev, "the interactive request streamed (error: %s)" % ev.get("i_err"))
    check(ev["queued"] == 1, "the batch request waited in the queue while the interactive one ran")
    check(m[2] is None and m[3]["stop_reason"] == "cancelled" and m[3]["n_preempted"] >= 1,
          "cancelled while preempted: stop_reason cancelled")
    check(t_cancelled < ev["i_end"], "it ended at once, before the interactive request")
    check(ids_of(cn) == m[3]["tokens"] and len(cn) >= 4, "its streamed ids equal its result tokens")
    st = status()
    check(st["queue"]["running"] == 0 and st["queue"]["queued"] == 0, "nothing left running or queued")
    c.close()


def kv_space(n):
    """The engine (test hook kv_tokens) has room for fewer positions than n requests need at
    once: requests are preempted when it runs out and resumed later; every one completes with the
    tokens it gives alone."""
    prompts = ["Story %d begins with a dragon and" % i for i in range(n)]
    c = Client(timeout=300)
    alone = []
    for p in prompts:
        r, _ = c.ok("generate", dict(GREEDY, prompt=p, max_tokens=40))
        alone.append(r["tokens"])
    c.close()
    before = status()["requests"]["preempted"]
    out = [None] * n
    barrier = threading.Barrier(n)

    def one(i):
        ci = Client(timeout=300)
        barrier.wait()
        err, res, notes = ci.wait(ci.send("generate", dict(GREEDY, prompt=prompts[i], max_tokens=40,
                                                           priority=CLASSES[i % 3])))
        out[i] = (err, res, notes)
        ci.close()

    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    check(all(o[0] is None for o in out), "all %d complete under the tiny KV budget (%s)" %
          (n, [o[0] for o in out if o[0]][:2]))
    pre = sum(o[1]["n_preempted"] for o in out)
    check(pre > 0 and status()["requests"]["preempted"] - before == pre,
          "%d preemptions for lack of space, counted in status" % pre)
    check(all(out[i][1]["tokens"] == alone[i] for i in range(n)), "each gives the tokens it gives alone")
    check(all(ids_of(o[2]) == o[1]["tokens"] for o in out), "streams equal results: none lost or repeated")


def gap(n_prompt_words, budget, stretch, max_ratio):
    no_eos()
    """The inter-token gap of a decoding stream while another client's long prompt prefills
    (median and p99 reported): the stream gets a token every step during the prefill; with the
    budget by time (stretch > 0) its median gap stays within max_ratio x the gap without."""
    c = Client(timeout=300)
    long_prompt = " ".join("word%d" % (i % 97) for i in range(n_prompt_words))
    n_long = len(c.ok("tokenize", {"text": long_prompt})[0]["ids"])
    c.close()
    res = {}
    started = threading.Event()

    def decoder():
        cd = Client(timeout=300)
        times = []

        def on_note(n):
            times.append(time.monotonic())
            if len(times) == 10:
                started.set()
        res["dc"] = cd
        res["dm"] = cd.send("generate", dict(GREEDY, prompt="Stream", max_tokens=4000, logit_bias=NO_EOS))
        err, r, notes = cd.wait(res["dm"], on_note=on_note)
        res["d"] = (err, r, times)
        cd.close()

    def prefiller():
        started.wait()
        cp = Client(timeout=300)
        t0 = time.monotonic()
        err, r, notes, _, times = streamed(cp, dict(GREEDY, prompt=long_prompt, max_tokens=1))
        res["p"] = (err, r, t0, times[0] if times else time.monotonic())
        cp.close()
        time.sleep(0.5)  # some gaps after it, then the stream may end
        res["dc"].send("cancel", {"id": res["dm"]})

    td, tp = threading.Thread(target=decoder), threading.Thread(target=prefiller)
    td.start()
    tp.start()
    tp.join()
    td.join()
    err, r, times = res["d"]
    perr, pr, p0, p1 = res["p"]
    check(err is None and perr is None, "both requests complete (%s, %s)" % (err, perr))
    check(r["stop_reason"] == "cancelled" and pr["n_prompt"] == n_long, "the stream ran until cancelled")
    during = [b - a for a, b in zip(times, times[1:]) if a >= p0 and b <= p1]
    outside = [b - a for a, b in zip(times, times[1:]) if b < p0 or a > p1]
    n_steps = (n_long + budget - 1) // budget
    check(len(during) >= n_steps // 2,
          "the stream got %d tokens while a %d-token prompt prefilled (at least %d steps of %d)" %
          (len(during), n_long, n_steps, budget))

    def pct(v, q):
        v = sorted(v)
        return v[min(len(v) - 1, int(q * len(v)))]
    print("figure: prefill_stretch %d: prefill of %d tokens took %.0f ms; decode gap during it median %.1f ms "
          "p99 %.1f ms (%d gaps); without it median %.1f ms p99 %.1f ms (%d gaps)" %
          (stretch, n_long, 1e3 * (p1 - p0), 1e3 * statistics.median(during), 1e3 * pct(during, 0.99),
           len(during), 1e3 * statistics.median(outside), 1e3 * pct(outside, 0.99), len(outside)))
    if max_ratio:
        ratio = statistics.median(during) / statistics.median(outside)
        check(ratio <= max_ratio, "with prefill_stretch %d the median gap during the prefill is %.1f x the one "
              "without (at most %d)" % (stretch, ratio, max_ratio))


def fair(n_slots):
    """One greedy client holds every slot with endless requests of a class (reading its streams
    as they come); a polite client's request of the same class gets a slot by preemption and
    ends long before the greedy ones would, each class. The greedy requests lose nothing: what
    each streamed is its result."""
    no_eos()
    for cls in CLASSES:
        g = Client(timeout=300)
        ids = [g.send("generate", dict(GREEDY, prompt="Greedy %d: count on and on" % k, max_tokens=3000,
                                       priority=cls, logit_bias=NO_EOS))
               for k in range(n_slots)]
        notes = {i: [] for i in ids}
        finals = {}
        lock = threading.Lock()

        def reader():
            while len(finals) < len(ids):
                m = g.read()
                if m is None:
                    return
                with lock:
                    if m[0] == 2 and m[2][0].get("id") in notes:
                        notes[m[2][0]["id"]].append(m[2][0])
                    elif m[0] == 1 and m[1] in notes:
                        finals[m[1]] = (m[2], m[3])

        t = threading.Thread(target=reader)
        t.start()
        t_wait = time.monotonic()
        while time.monotonic() - t_wait < 60:
            with lock:
                if all(len(v) >= 2 for v in notes.values()):
                    break
            time.sleep(0.02)
        check(status()["queue"]["running"] == n_slots, "%s: the greedy client holds all %d slots" % (cls, n_slots))
        p = Client(timeout=120)
        t0 = time.monotonic()
        err, res, pnotes, _, _ = streamed(p, dict(GREEDY, prompt="Quick question", max_tokens=4, priority=cls))
        took = time.monotonic() - t0
        p.close()
        with lock:
            pending = len(finals)
        check(err is None and res["n_generated"] >= 1, "%s: the polite request completes" % cls)
        check(pending == 0, "%s: it ended in %.2f s, before any greedy request" % (cls, took))
        for i in ids:
            g.send("cancel", {"id": i})
        t.join(60)
        check(len(finals) == n_slots and all(e is None for e, _ in finals.values()),
              "%s: the greedy requests end (cancelled) without error" % cls)
        check(all([x for n in notes[i] for x in n.get("ids", [])] == finals[i][1]["tokens"] for i in ids),
              "%s: each greedy stream's ids equal its result: nothing lost or repeated" % cls)
        pre = sum(r["n_preempted"] for _, r in finals.values())
        check(pre >= 1, "%s: %d greedy requests preempted for the polite one" % (cls, pre))
        g.close()
        st = status()
        check(st["queue"]["running"] == 0 and st["queue"]["queued"] == 0, "%s: nothing left running" % cls)


if __name__ == "__main__":
    g = sys.argv[1]
    args = [int(a) for a in sys.argv[2:]]
    {"priority-params": priority_params, "mixed": mixed, "preempt": preempt, "kv-space": kv_space,
     "gap": gap, "fair": fair}[g](*args)
