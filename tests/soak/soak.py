"""Soak of a running siliceod (socket in $SILICEO_SOCKET, its pid given): CLIENTS threads for
SECONDS, each on its own connection doing, at random (seeded), streamed generations of every
class, chat turns on a session of its own, a generation cancelled after its first token, a
connection closed mid-stream, a request with a bad parameter (error 4, the connection lives) and
a connection that sends bytes that are not msgpack-RPC (the daemon closes it). Checked:

  * every well-formed request on a connection that stayed open is answered exactly once (a
    status sent last on each connection must come back with nothing for an earlier msgid after
    that request's own answer, and nothing answers twice);
  * every streamed request's notes carry exactly its result's tokens;
  * after the clients are gone the daemon's open descriptors are back to their count at the
    start;
  * its resident memory stays under a bound (--rss-max-mib) once warm.

Prints one line per check and writes a JSON summary (--json): requests by kind, errors by code,
RSS and descriptors over time, time to first token p50 / p99.

usage: soak.py PID SECONDS CLIENTS [--seed N] [--json FILE] [--rss-max-mib N]"""
import argparse
import json
import os
import random
import socket
import statistics
import sys
import threading
import time

from siltest import Client, check, pack

CLASSES = ("interactive", "normal", "batch")
WORDS = ("the cat sat on a mat while rain fell over old hills and the river ran far to the sea " +
         "so we wrote code late into the night").split()


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def n_fds(pid):
    return len(os.listdir("/proc/%d/fd" % pid))


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.kinds = {}
        self.errors = {}
        self.ttft = []
        self.problems = []

    def count(self, kind, err=None):
        with self.lock:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
            if err is not None:
                k = str(err.get("code") if isinstance(err, dict) else err)
                self.errors[k] = self.errors.get(k, 0) + 1
                if kind != "bad-params" and isinstance(err, dict) and len(self.problems) < 20:
                    self.problems.append("%s: error %s: %s" % (kind, err.get("code"), err.get("message")))

    def problem(self, what):
        with self.lock:
            if len(self.problems) < 20:
                self.problems.append(what)


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


class Conn(Client):
    """A client that notices any response to a msgid it already has the answer to."""

    def __init__(self, stats):
        super().__init__(timeout=120)
        self.stats = stats
        self.answered = set()

    def wait(self, msgid, on_note=None):
        err, res, notes = super().wait(msgid, on_note)
        if msgid in self.answered:
            self.stats.problem("msgid %d answered twice" % msgid)
        self.answered.add(msgid)
        # responses that Client.wait set aside: an answer to an earlier msgid is a repeat
        for m in self.notes:
            if m[0] == 1 and m[1] in self.answered:
                self.stats.problem("msgid %d answered again" % m[1])
        self.notes = [m for m in self.notes if m[0] != 2]
        return err, res, notes

    def finish(self):
        """A status as the last request: answered once, and nothing for an earlier one after."""
        err, res, _ = self.call("status")
        if err is not None:
            self.stats.problem("status at the end: %r" % err)
        self.s.settimeout(0.2)
        try:
            while True:
                m = self.read()
                if m is None:
                    break
                if m[0] == 1:
                    self.stats.problem("an answer after the last one: msgid %d" % m[1])
        except (socket.timeout, OSError):
            pass
        self.close()


def streamed(c, params, stats, kind):
    t0 = time.monotonic()
    first = []
    err, res, notes = c.wait(c.send("generate", params),
                             on_note=lambda n: first.append(time.monotonic()) if not first else None)
    stats.count(kind, err)
    if err is None:
        ids = [i for n in notes for i in n.get("ids", [])]
        if ids != res["tokens"]:
            stats.problem("%s: the streamed ids are not the result's tokens" % kind)
        if first:
            with stats.lock:
                stats.ttft.append(first[0] - t0)
    return err, res


def one_client(i, deadline, seed, stats):
    rng = random.Random(seed * 1000 + i)
    c = Conn(stats)
    turn = 0
    conv = []
    while time.monotonic() < deadline:
        r = rng.random()
        try:
            if r < 0.40:
                streamed(c, {"prompt": words(rng, rng.randint(3, 40)), "max_tokens": rng.randint(4, 24),
                             "priority": rng.choice(CLASSES), "temperature": rng.choice([0, 0.8]),
                             "seed": rng.randint(0, 1 << 30)}, stats, "generate")
            elif r < 0.60:
                if turn == 3:
                    c.call("sessions.drop", {"name": "soak-%d" % i})
                    turn, conv = 0, []
                conv.append({"role": "user", "content": words(rng, rng.randint(2, 12))})
                err, res, _ = c.call("chat", {"messages": conv, "session": "soak-%d" % i, "max_tokens": 8,
                                              "temperature": 0, "think": False})
                stats.count("chat", err)
                if err is None:
                    conv.append({"role": "assistant", "content": res["text"]})
                    turn += 1
            elif r < 0.75:
                mid = c.send("generate", {"prompt": words(rng, 8), "max_tokens": 300, "temperature": 0.9,
                                          "seed": rng.randint(0, 1 << 30)})
                sent = []

                def on_note(n, mid=mid, sent=sent):
                    if not sent:
                        c.send("cancel", {"id": mid})
                        sent.append(1)
                err, res, _ = c.wait(mid, on_note=on_note)
                stats.count("cancel", err)
                if err is None and res.get("stop_reason") not in ("cancelled", "length", "stop", "eos"):
                    stats.problem("cancelled: stop_reason %r" % res.get("stop_reason"))
            elif r < 0.85:
                d = Client(timeout=60)
                d.send("generate", {"prompt": words(rng, 6), "max_tokens": 200, "temperature": 0.9})
                m = d.read()  # a note, or the answer when it ended first
                d.close()
                stats.count("disconnect", None if m is not None else "closed")
            elif r < 0.95:
                bad = rng.choice([{"prompt": "x", "max_tokens": "many"}, {"prompt": 5},
                                  {"prompt": "x", "temperature": -1}, {"prompt": "x", "priority": 9},
                                  {"messages": "hi"}])
                err, _, _ = c.call("chat" if "messages" in bad else "generate", bad)
                stats.count("bad-params", err)
                if err is None or err.get("code") != 4:
                    stats.problem("bad parameters %r: %r" % (bad, err))
            else:
                h = Client(timeout=30)
                junk = rng.choice([bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))),
                                   pack([0, 1, "generate"]), pack({"a": 1}), pack([7, 1, "x", {}]),
                                   b"\xdd\xff\xff\xff\xff"])
                try:
                    h.send_raw(junk)
                    h.s.shutdown(socket.SHUT_WR)
                    while h.read() is not None:
                        pass
                except OSError:
                    pass
                h.close()
                stats.count("malformed")
        except (EOFError, OSError) as e:
            stats.problem("client %d: %s" % (i, e))
            return
    try:
        c.finish()
    except (EOFError, OSError) as e:
        stats.problem("client %d at the end: %s" % (i, e))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pid", type=int)
    ap.add_argument("seconds", type=float)
    ap.add_argument("clients", type=int)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--rss-max-mib", type=float, default=0)
    a = ap.parse_args()
    stats = Stats()
    Client().close()  # the daemon answers before anything is counted
    time.sleep(0.5)  # and has closed that connection
    fd0 = n_fds(a.pid)
    t_start = time.monotonic()
    deadline = t_start + a.seconds
    series = []
    stop = threading.Event()

    def sampler():
        while not stop.is_set():
            series.append((round(time.monotonic() - t_start, 1), rss_kib(a.pid), n_fds(a.pid)))
            stop.wait(1.0)

    smp = threading.Thread(target=sampler)
    smp.start()
    th = [threading.Thread(target=one_client, args=(i, deadline, a.seed, stats)) for i in range(a.clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    time.sleep(1.0)  # closed connections are reaped by the loop
    stop.set()
    smp.join()
    fd1 = n_fds(a.pid)
    rss = [s[1] for s in series]
    warm = rss[len(rss) // 4:] if len(rss) >= 4 else rss
    total = sum(stats.kinds.values())
    ttft = sorted(stats.ttft)
    p = (lambda q: round(1e3 * ttft[min(len(ttft) - 1, int(q * len(ttft)))], 1)) if ttft else (lambda q: None)
    summary = {"seconds": a.seconds, "clients": a.clients, "seed": a.seed, "requests": total,
               "by_kind": stats.kinds, "errors_by_code": stats.errors, "problems": stats.problems,
               "fds_start": fd0, "fds_end": fd1, "rss_mib_max": round(max(rss) / 1024, 1) if rss else None,
               "rss_mib_end": round(rss[-1] / 1024, 1) if rss else None,
               "ttft_ms_p50": p(0.5), "ttft_ms_p99": p(0.99), "series": series}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    print("figure: %d requests in %.0f s by %d clients: %s; errors by code %s; first token p50 %s ms "
          "p99 %s ms; RSS max %s MiB" % (total, a.seconds, a.clients, stats.kinds, stats.errors,
                                         summary["ttft_ms_p50"], summary["ttft_ms_p99"], summary["rss_mib_max"]))
    check(not stats.problems, "every request answered exactly once, streams equal results (%s)" %
          "; ".join(stats.problems[:5]))
    check(stats.kinds.get("generate", 0) > 0 and stats.kinds.get("chat", 0) > 0, "generations and chats ran")
    check(fd1 == fd0, "descriptors back to their count at the start (%d, %d)" % (fd0, fd1))
    if a.rss_max_mib:
        check(max(warm) / 1024 <= a.rss_max_mib, "RSS once warm at most %.0f MiB (%.1f)" %
              (a.rss_max_mib, max(warm) / 1024))


if __name__ == "__main__":
    main()
