"""The prefix cache through a running siliceod (daemon_prefix.sh): `cold PATH` records greedy
answers with the cache off, `warm PATH` checks reuse, status, metrics and the same answers."""
import json
import random
import sys

from daemon_tests import OTHER_UID, as_uid
from siltest import Client, check

GREEDY = {"temperature": 0, "grace_tokens": 0, "max_tokens": 8}
rnd = random.Random(16)
PREFIX = [rnd.randrange(3, 400) for _ in range(600)]
P1 = PREFIX + [rnd.randrange(3, 400) for _ in range(12)]  # 612 tokens: 9 full blocks
P2 = PREFIX + [rnd.randrange(3, 400) for _ in range(30)]  # shares 600: 9 full blocks


def gen(c, ids):
    return c.ok("generate", dict(GREEDY, prompt_tokens=ids, add_bos=False))[0]


def cold(path):
    c = Client()
    st = c.ok("status")[0]
    check(st["prefix_cache"]["enabled"] is False, "status: prefix_cache off")
    out = {}
    for name, ids in (("p1", P1), ("p2", P2)):
        r = gen(c, ids)
        check(r["n_cached"] == 0, "%s with the cache off evaluates everything" % name)
        out[name] = r["tokens"]
    st = c.ok("status")[0]["prefix_cache"]
    check(st["hits"] == 0 and st["blocks"] == 0, "no prefix blocks with the cache off (%r)" % st)
    with open(path, "w") as f:
        json.dump(out, f)


def warm(path):
    with open(path) as f:
        want = json.load(f)
    c = Client()
    arch = c.ok("status")[0]["model"]["arch"]
    hybrid = arch in ("qwen35", "qwen35moe")
    r1 = gen(c, P1)
    check(r1["n_cached"] == 0, "the first request finds nothing cached")
    check(r1["tokens"] == want["p1"], "the first request answers as with the cache off")
    r2 = gen(c, P2)
    check(r2["n_cached"] == 576, "the second request reuses the 9 full blocks it shares (%d)" % r2["n_cached"])
    check(r2["tokens"] == want["p2"], "the second request answers as with the cache off")
    r3 = gen(c, P1)
    check(r3["n_cached"] == 576 and r3["tokens"] == want["p1"], "the first prompt again: 576 reused, same answer")
    # Another uid shares nothing: its prompts are its own.
    other = as_uid(OTHER_UID, lambda: Client().ok("generate", dict(GREEDY, prompt_tokens=P2, add_bos=False))[0])
    check(other["n_cached"] == 0 and other["tokens"] == want["p2"], "another uid reuses nothing (%d)" % other["n_cached"])
    st = c.ok("status")[0]
    pc = st["prefix_cache"]
    check(pc["enabled"] is True and pc["hits"] == 2 and pc["misses"] == 2 and pc["tokens"] == 1152,
          "status: 2 hits, 2 misses, 1152 tokens reused (%r)" % pc)
    check(pc["blocks"] >= 18, "status: the cached blocks of both uids (%d)" % pc["blocks"])
    check(st["tokens"]["cached"] >= 1152, "tokens.cached counts prefix reuse (%d)" % st["tokens"]["cached"])
    if hybrid:
        check(pc["checkpoints"] >= 3 and pc["checkpoint_bytes"] > 0, "snapshots kept on a hybrid model (%r)" % pc)
    else:
        check(pc["checkpoints"] == 0 and pc["checkpoint_bytes"] == 0, "no snapshots on an attention-only model")
    check(st["memory"]["prefix_checkpoints"] == pc["checkpoint_bytes"], "status memory counts the snapshots")
    check(st["memory"]["prefix_blocks"] > 0, "status memory counts the cached blocks no request holds (%d)"
          % st["memory"]["prefix_blocks"])
    m = c.ok("metrics")[0]["metrics"]
    check(m["siliceo_prefix_hits_total"] == 2 and m["siliceo_prefix_tokens_total"] == 1152,
          "metrics: prefix hits and tokens")
    text = c.ok("metrics", {"format": "prometheus"})[0]["text"]
    for name, kind in (("siliceo_prefix_hits_total", "counter"), ("siliceo_prefix_misses_total", "counter"),
                       ("siliceo_prefix_checkpoint_bytes", "gauge")):
        check("# TYPE %s %s\n" % (name, kind) in text and "# HELP %s " % name in text,
              "prometheus text has HELP and TYPE for %s" % name)
    check("\nsiliceo_prefix_hits_total 2\n" in text, "prometheus: siliceo_prefix_hits_total 2")
    # A session holding only the first 100 tokens: the prefix cache resumes further (576).
    c.ok("generate", dict(GREEDY, prompt_tokens=PREFIX[:100], add_bos=False, session="ps"))
    r = c.ok("generate", dict(GREEDY, prompt_tokens=P1, add_bos=False, session="ps"))[0]
    check(r["n_cached"] == 576 and r["tokens"] == want["p1"],
          "a session that shares less than the cache resumes from the cache (%d), same answer" % r["n_cached"])
    # Its next turn shares all of P1 with it: the session's own tokens (612 on an attention-only
    # model; on a hybrid one its checkpoint at the end of that prompt).
    r = c.ok("generate", dict(GREEDY, prompt_tokens=P1 + [5, 6, 7], add_bos=False, session="ps"))[0]
    check(r["n_cached"] >= 612, "the session's own prefix when it is longer (%d)" % r["n_cached"])
    c.ok("sessions.drop", {"name": "ps"})
    c.close()


if __name__ == "__main__":
    {"cold": cold, "warm": warm}[sys.argv[1]](sys.argv[2])
