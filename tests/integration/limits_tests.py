"""Limits, framing and protocol consistency against a running siliceod (socket in
$SILICEO_SOCKET), one group per argument; run by tests/integration/daemon_limits.sh, which starts
the daemon with the settings each group expects."""
import os
import socket
import sys
import threading
import time

from siltest import Client, check, pack, unpack, Incomplete

SOCK = os.environ["SILICEO_SOCKET"]
GREEDY = {"temperature": 0, "grace_tokens": 0}


def status():
    c = Client()
    st = c.ok("status")[0]
    c.close()
    return st


def burst(max_queue, max_running):
    """20 connections x 16 pipelined generates: never more waiting than max_queue, and each
    request gets exactly one final response, a result or error 7."""
    n_conn, n_req = 20, 16
    conns = [Client(timeout=300) for _ in range(n_conn)]
    seen = {"max_queued": 0, "max_total": 0}
    stop = threading.Event()

    def monitor():
        m = Client()
        while not stop.is_set():
            q = m.ok("status")[0]["queue"]
            seen["max_queued"] = max(seen["max_queued"], q["queued"])
            seen["max_total"] = max(seen["max_total"], q["queued"] + q["running"])
            time.sleep(0.002)
        m.close()

    mon = threading.Thread(target=monitor)
    mon.start()
    # All requests of a connection in one write, every connection before any reply is read.
    for c in conns:
        c.send_raw(b"".join(pack([0, i + 1, "generate", dict(GREEDY, prompt="Count: %d" % i, max_tokens=12)])
                            for i in range(n_req)))
    results = busy = other = 0
    for c in conns:
        finals = {}
        while len(finals) < n_req:  # in any order: refusals come before results
            m = c.read()
            check(m is not None, "connection open until its last final response")
            if m[0] == 1:
                check(m[1] not in finals, "one final response per request")
                finals[m[1]] = m[2]
        for err in finals.values():
            if err is None:
                results += 1
            elif err["code"] == 7 and "queue full" in err["message"]:
                busy += 1
            else:
                other += 1
                print("unexpected error:", err)
        c.close()
    stop.set()
    mon.join()
    print("burst: %d results, %d busy, max queued %d, max running+queued %d" %
          (results, busy, seen["max_queued"], seen["max_total"]))
    check(other == 0 and results + busy == n_conn * n_req, "every request got one final response")
    check(busy > 0 and results >= max_running + max_queue, "the burst was over the limit: some refused, some run")
    check(seen["max_queued"] <= max_queue, "never more than max_queue waiting (%d <= %d)" %
          (seen["max_queued"], max_queue))
    check(seen["max_total"] <= max_queue + max_running, "never more than max_running + max_queue accepted")
    st = status()
    check(st["queue"]["queued"] == 0 and st["queue"]["running"] == 0, "queue empty after the burst")


def half_close():
    """A client that shuts its write side still gets every answer, then EOF."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(120)
    s.connect(SOCK)
    s.sendall(pack([0, 1, "generate", dict(GREEDY, prompt="One", max_tokens=6)]) +
              pack([0, 2, "generate", dict(GREEDY, prompt="Two", max_tokens=6)]) +
              pack([0, 3, "tokenize", {"text": "three"}]) +
              pack([0, 4, "sessions.list", {}]) +
              pack([0, 5, "debug.stream", {"count": 50}]))
    s.shutdown(socket.SHUT_WR)
    buf, finals = b"", {}
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
        while buf:
            try:
                m, n = unpack(buf)
            except Incomplete:
                break
            buf = buf[n:]
            if m[0] == 1:
                finals[m[1]] = m
    s.close()
    check(sorted(finals) == [1, 2, 3, 4, 5] and all(m[2] is None for m in finals.values()),
          "half-closed client got all 5 final responses, then EOF (%s)" % sorted(finals))
    # Half-closed with nothing in flight: closed at once.
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(SOCK)
    s.shutdown(socket.SHUT_WR)
    check(s.recv(10) == b"", "half-closed idle client is closed")
    s.close()


def max_output(limit):
    """A result larger than max_output: error 5, and the connection stays."""
    c = Client()
    text = "word " * (limit // 2)
    err, res, _ = c.call("tokenize", {"text": text})
    check(err is not None and err["code"] == 5 and "max_output" in err["message"],
          "tokenize result over max_output gives error 5 (%r)" % (err,))
    check(c.ok("tokenize", {"text": "small"})[0]["n"] > 0, "the connection still works")
    # The same for a text tokenized on the helper thread (at least 64 KiB).
    err, res, _ = c.call("tokenize", {"text": "word " * 100000})
    check(err is not None and err["code"] == 5, "a large text's result over max_output: error 5 too")
    res, _ = c.ok("tokenize", {"text": "word " * 14000})
    small = c.ok("tokenize", {"text": "word " * 100})[0]["ids"]  # inline: under 64 KiB
    check(res["n"] == len(res["ids"]) and res["n"] >= 140 * (len(small) - 1),
          "a 70 KB text tokenized off the loop: %d ids" % res["n"])
    check(res["ids"][:len(small) - 1] == small[:-1], "and the ids match the inline tokenizer's")
    err, res, _ = c.call("generate", dict(GREEDY, prompt="word " * 40000, max_tokens=2))
    check(err is not None and err["code"] == 15 and "context" in err["message"],
          "a 100 KB prompt tokenized off the loop: error 15 (context_full) (%r)" % (err,))
    # Spaces make 16-byte tokens: 70 KB that fits the context of 8192 (a long prefill under ASan).
    c.s.settimeout(900)
    err, res, _ = c.call("generate", dict(GREEDY, prompt="word " * 600 + " " * 70000, max_tokens=2))
    c.s.settimeout(60)
    check(err is None and res["n_prompt"] > 600 and res["n_generated"] >= 1,
          "a long prompt that fits is generated from (%d tokens)" % (res or {}).get("n_prompt", 0))
    m = c.ok("metrics")[0]["metrics"]
    check(m["siliceo_results_too_large_total"] >= 1 and m["siliceo_clients_dropped_total"] == 0,
          "counted as too large, nobody dropped")
    c.close()


def conn_errors():
    """Connection-level errors carry a nil msgid; well-formed messages of the wrong shape keep
    the connection."""
    for data, what in ((pack(42), "a bare integer"), (pack("text"), "a string"),
                       (pack({"a": 1}), "a map"), (pack([0, "x", "status", {}]), "a msgid that is a string"),
                       (pack([7, 1, "status", {}]), "an unknown message type"),
                       (pack([0, 1, "status"]), "a request of 3 elements")):
        c = Client(timeout=10)
        c.send_raw(data)
        m = c.read()
        check(m is not None and m[0] == 1 and isinstance(m[2], dict) and m[2]["code"] in (2, 4),
              what + ": error %r" % (m,))
        if m[1] is not None:
            check(what == "a request of 3 elements" and m[1] == 1, what + ": msgid only where it was read")
        else:
            print("ok: %s: error with a nil msgid" % what)
        check(c.ok("hello")[0]["server"] == "siliceod", what + ": connection still usable")
        c.close()
    c = Client(timeout=10)
    c.send_raw(b"\xc1")
    m = c.read()
    check(m is not None and m[0] == 1 and m[1] is None and m[2]["code"] == 1, "lost framing: error 1, nil msgid")
    check(c.read() is None, "lost framing: then closed")
    c.close()


def cancel_queued():
    """Cancelling a request that is still queued: error 8 with its real wait."""
    c = Client(timeout=120)
    # Long enough to still run when the cancel comes: the context, not max_tokens, ends them.
    long_ids = [c.send("generate", dict(GREEDY, prompt="Long %d" % i, max_tokens=100000, grace_tokens=0))
                for i in range(2)]
    t0 = time.time()
    q = c.send("generate", dict(GREEDY, prompt="Queued", max_tokens=4))
    time.sleep(0.3)
    st = status()
    check(st["queue"]["queued"] >= 1, "the third request waits (max_running 2)")
    cid = c.send("cancel", {"id": q})
    waited = (time.time() - t0) * 1e3
    err, _, _ = c.wait(cid)
    check(err is None, "cancel accepted")
    err, res, notes = c.wait(q)
    check(err is not None and err["code"] == 8 and 0.5 * waited <= err.get("queue_ms", 0) <= waited + 500,
          "queued request ends with error 8 and its wait (%r, %.0f ms)" % (err, waited))
    for i in long_ids:
        c.send("cancel", {"id": i})
    for i in long_ids:
        err, res, _ = c.wait(i)
        check(err is None and res["stop_reason"] == "cancelled" and res["timings"]["queue_ms"] >= 0,
              "a running request cancelled ends with its result")
    c.close()


def eog_ids():
    """The streamed ids add up to `tokens`, the end-of-generation token included."""
    c = Client(timeout=120)
    eos_seen = 0
    for seed in range(1, 40):
        r, notes = c.ok("generate", {"prompt": "Hello", "max_tokens": 64, "seed": seed, "temperature": 1.5,
                                     "top_k": 0, "top_p": 1, "min_p": 0})
        ids = [i for n in notes for i in n["ids"]]
        check(ids == r["tokens"], "seed %d: streamed ids == tokens (%s)" % (seed, r["stop_reason"]))
        eos_seen += r["stop_reason"] == "eos"
        if eos_seen >= 3:
            break
    print("runs that ended on eos: %d" % eos_seen)
    check(eos_seen > 0, "some runs ended on the end-of-generation token")
    c.close()


def metrics():
    """Prometheus and OpenMetrics text parse with python3-prometheus-client; HELP and TYPE for
    every family, no gauge named like a counter's family."""
    from prometheus_client.parser import text_string_to_metric_families as prom_parse
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
    c = Client()
    m = c.ok("metrics")[0]["metrics"]
    check("siliceo_connected_clients" in m and "siliceo_clients" not in m, "gauge renamed siliceo_connected_clients")
    for fmt, parse in (("prometheus", prom_parse), ("openmetrics", om_parse)):
        text = c.ok("metrics", {"format": fmt})[0]["text"]
        fams = list(parse(text))
        names = {f.name for f in fams}
        check(len(fams) == len(m), "%s: %d families parsed for %d metrics" % (fmt, len(fams), len(m)))
        for f in fams:
            check(f.documentation and f.type in ("counter", "gauge"), "%s: %s has HELP and TYPE" % (fmt, f.name))
        lines = text.splitlines()
        for name in m:
            fam = name[:-6] if fmt == "openmetrics" and name.endswith("_total") else name
            check("# HELP %s " % fam in text and any(l.startswith("# TYPE %s " % fam) for l in lines),
                  "%s: # HELP and # TYPE for %s" % (fmt, name))
        check(len(names) == len(fams), "%s: no family name clashes" % fmt)
    err, _, _ = c.call("metrics", {"format": "xml"})
    check(err is not None and err["code"] == 4, "unknown format: error 4")
    c.close()


def timeouts(message_timeout, idle_timeout):
    """An incomplete message and an idle connection are closed with error 14 and a nil msgid."""
    t0 = time.time()
    part = Client(timeout=30)
    part.send_raw(b"\x94\x00\x01\xa8generate\xdb\x00\x10\x00\x00" + b"a" * 1000)  # 1 MiB str, 1000 bytes sent
    idle = Client(timeout=30)
    busy = Client(timeout=30)
    m = part.read()
    dt = time.time() - t0
    check(m is not None and m[0] == 1 and m[1] is None and m[2]["code"] == 14, "partial message: error 14 (%r)" % (m,))
    check(message_timeout <= dt < message_timeout + 3, "after message_timeout (%.1f s)" % dt)
    check(part.read() is None, "then closed")
    # busy keeps talking, idle does not.
    end = t0 + idle_timeout + 2
    while time.time() < end:
        busy.ok("hello")
        time.sleep(0.5)
    m = idle.read()
    check(m is not None and m[1] is None and m[2]["code"] == 14 and "idle" in m[2]["message"],
          "idle connection: error 14 (%r)" % (m,))
    check(idle.read() is None, "idle connection closed")
    check(busy.ok("hello")[0]["server"] == "siliceod", "a connection that talks is kept")
    busy.close()


def input_cap(max_input):
    """Partial messages from many clients cannot buffer much more than max_input. Run with a
    message_timeout above the 1.5 s it sends for."""
    c = Client()
    before = c.ok("metrics")[0]["metrics"]["siliceo_bytes_in_total"]
    c.close()
    n = 8
    socks, sent = [], [0] * n
    # Each a 3 MiB string of which up to 2 MiB is offered, round-robin for 1.5 s.
    data = b"\x94\x00\x01\xa8generate\xdb\x00\x30\x00\x00" + b"a" * (2 << 20)
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(SOCK)
        s.setblocking(False)
        socks.append(s)
    t_end = time.time() + 1.5
    while time.time() < t_end:
        for k, s in enumerate(socks):
            try:
                if sent[k] < len(data):
                    sent[k] += s.send(data[sent[k]:sent[k] + 65536])
            except BlockingIOError:
                pass
        time.sleep(0.001)
    c = Client()
    after = c.ok("metrics")[0]["metrics"]["siliceo_bytes_in_total"]
    got = after - before
    print("input read by the daemon: %.2f MiB (offered %.2f MiB) for max_input %.2f MiB" %
          (got / 2**20, sum(sent) / 2**20, max_input / 2**20))
    check(sum(sent) > max_input + n * 65536, "the clients offered more than the cap")
    check(got <= max_input + n * 65536 + 65536, "the daemon stopped reading at max_input")
    check(c.ok("hello")[0]["server"] == "siliceod", "small messages still answered")
    for s in socks:
        s.close()
    c.close()


def refused_reads_error():
    """A refused peer (not in the allow list) that writes first still reads error 6."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(SOCK)
    try:
        s.sendall(pack([0, 1, "hello", {}]) + b"x" * 200000)
        wrote = True
    except (BrokenPipeError, ConnectionResetError):
        wrote = False
    buf = b""
    while True:
        try:
            d = s.recv(4096)
        except ConnectionResetError:
            check(False, "refused peer got a reset")
        if not d:
            break
        buf += d
    m, _ = unpack(buf)
    check(wrote, "the refused peer's writes did not fail")
    check(m[0] == 1 and m[1] is None and m[2]["code"] == 6 and "not allowed" in m[2]["message"],
          "refused peer reads error 6: %s" % m[2]["message"])


def as_user(uid, gid, groups, fn):
    """Runs fn in a child with these credentials; its exit status is the result."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups(groups)
            os.setgid(gid)
            os.setuid(uid)
            fn()
            os._exit(0)
        except SystemExit as e:
            os._exit(e.code or 0)
        except BaseException as e:
            print("child:", repr(e))
            os._exit(3)
    _, st = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(st)


def allow_lists(uid, gid):
    """allow_users / allow_groups accept users by uid, primary group and supplementary groups
    (also past 256 of them), and refuse the rest with a readable error 6."""
    def allowed():
        c = Client(timeout=10)
        check(c.ok("hello")[0]["server"] == "siliceod", "uid %d is served" % os.getuid())
        c.close()

    def refused():
        refused_reads_error()

    many = list(range(50000, 50300)) + [gid]
    cases = [
        ("allow_users", uid, 60001, [], allowed),
        ("not listed", uid + 1, 60002, [], refused),
        ("primary group", uid + 2, gid, [], allowed),
        ("supplementary group", uid + 3, 60003, [60004, gid], allowed),
        ("301 supplementary groups, the allowed one last", uid + 4, 60005, many, allowed),
        ("301 supplementary groups, none allowed", uid + 5, 60006, many[:-1], refused),
    ]
    for what, u, g, groups, fn in cases:
        rc = as_user(u, g, groups, fn)
        check(rc == 0, "%s (uid %d): as expected" % (what, u))
    c = Client()
    m = c.ok("metrics")[0]["metrics"]
    check(m["siliceo_clients_refused_total"] == 2, "two peers refused")
    c.close()


def tokenize_stall(method):
    """A 4 MB tokenize must not stop the event loop: a debug.stream on another connection keeps
    flowing while it runs. Prints the longest gap between streamed notifications."""
    a = Client(timeout=120)
    times = []
    mid = a.send("debug.stream", {"count": 10000000, "text": "x"})
    done = threading.Event()

    def reader():
        while not done.is_set():
            m = a.read()
            if m is None:
                return
            if m[0] == 2:
                times.append(time.monotonic())
            elif m[0] == 1 and m[1] == mid:
                return

    th = threading.Thread(target=reader)
    th.start()
    time.sleep(0.5)
    b = Client(timeout=120)
    text = "lorem ipsum dolor sit amet, " * (4000000 // 28)
    # Replies stay small (error 5 over max_output, or 15 for a prompt too long for the context): the
    # daemon tokenizes either way, and the test client need not decode a million ids.
    t0 = time.monotonic()
    err, res, _ = b.call(method, {"text": text} if method == "tokenize" else
                         {"prompt": text, "max_tokens": 1})
    t1 = time.monotonic()
    time.sleep(0.2)
    a.send("cancel", {"id": mid})
    th.join(60)
    done.set()
    inside = [t for t in times if t0 - 0.05 <= t <= t1 + 0.05]
    gaps = [y - x for x, y in zip(inside, inside[1:])] or [t1 - t0]
    gap = max(gaps)
    print("%s of %d bytes: %.3f s (%s); longest gap in the stream meanwhile: %.3f s over %d notifications" %
          (method, len(text), t1 - t0, "error %d" % err["code"] if err else "ok", gap, len(inside)))
    check(len(inside) > 0, "the stream flowed during the tokenize")
    check(gap < max(0.08, 0.25 * (t1 - t0)), "no stall of the event loop (%.3f s of %.3f s)" % (gap, t1 - t0))
    a.close()
    b.close()


if __name__ == "__main__":
    what = sys.argv[1]
    args = [int(a) if a.isdigit() else a for a in sys.argv[2:]]
    globals()[what](*args)
