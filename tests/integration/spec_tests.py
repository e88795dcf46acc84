"""Speculative decoding through a running siliceod (daemon_spec.sh). `plain PATH` records greedy
answers of a daemon without a draft model (and checks that spec is refused there); `spec PATH
MODE` checks that a daemon with one gives the same tokens (alone, side by side, per-request depths,
spec "off", a batch too large to speculate), that status and metrics carry the figures (MODE all:
every draft accepted, the target drafting for itself), that bad spec values are error 4, and that
a speculative request cancelled mid-stream leaves the engine state as it found it. `mtp PATH`: a
daemon whose model's own MTP layer drafts (spec = mtp) gives the tokens of PATH's daemon without
speculation, alone and side by side, with per-request depths and spec "off", and speculates for
sampled requests; status and metrics say mtp. `tree PATH WxD MODE`: a daemon drafting token trees
of WxD (its width in status) gives PATH's tokens, alone, side by side, with per-request depths
and spec "off" (MODE all: the target drafts for itself, a whole branch a step). `churn N`: N sampled requests that speculate, half
of them ended by a disconnect, leave the heap and the draft's sequences as they were."""
import json
import random
import sys
import threading
import time

from siltest import Client, check

GREEDY = {"temperature": 0, "grace_tokens": 0, "max_tokens": 24, "add_bos": False}
rnd = random.Random(40)
PROMPTS = [[rnd.randrange(3, 400) for _ in range(n)] for n in (5, 17, 40, 70)]


def gen(c, ids, **kw):
    return c.ok("generate", dict(GREEDY, prompt_tokens=ids, **kw))[0]


def plain(path):
    c = Client()
    check(c.ok("status")[0]["speculative"] is None, "status: speculative is nil without a draft model")
    err, _, _ = c.call("generate", dict(GREEDY, prompt_tokens=PROMPTS[0], spec=2))
    check(err is not None and err["code"] == 4 and "draft model" in err["message"],
          "spec with no draft model: error 4 (%r)" % err)
    check(gen(c, PROMPTS[0], spec="off")["n_generated"] > 0, "spec off is accepted without a draft model")
    out = [gen(c, p)["tokens"] for p in PROMPTS]
    # greedy with a repetition penalty: not the raw argmax, so the sampled path with one-hot
    # distributions
    out.append(gen(c, PROMPTS[1], repeat_penalty=1.3)["tokens"])
    with open(path, "w") as f:
        json.dump(out, f)


def spec_status(c):
    return c.ok("status")[0]["speculative"]


def concurrent(ids_list, **kw):
    res = [None] * len(ids_list)

    def run(i):
        res[i] = gen(Client(), ids_list[i], **kw)

    ts = [threading.Thread(target=run, args=(i,)) for i in range(len(ids_list))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return res


def spec(path, mode):
    with open(path) as f:
        want = json.load(f)
    c = Client()
    s0 = spec_status(c)
    check(s0 is not None and s0["mode"] == "draft" and s0["active"] is True and s0["tree"] == "1x4",
          "status: a draft model is active, 1x4 (%r)" % s0)
    check(s0["max_rows"] == 4, "status: speculation stops past 4 decoding requests")
    check(s0["steps"] == 0 and s0["drafted"] == 0 and s0["draft_state"]["sequences"] == 0,
          "status: nothing speculated yet")

    for i, p in enumerate(PROMPTS):
        r = gen(c, p)
        check(r["tokens"] == want[i], "prompt %d: the tokens of plain greedy decoding" % i)
    s1 = spec_status(c)
    check(s1["steps"] > 0 and s1["drafted"] > 0 and s1["emitted"] == s1["accepted"] + s1["steps"],
          "status: speculative steps ran, emitted = accepted + steps (%r)" % s1)
    check(s1["accepted"] <= s1["drafted"] <= 4 * s1["steps"], "status: accepted <= drafted <= 4 a step")
    check(abs(s1["acceptance_rate"] - s1["accepted"] / s1["drafted"]) < 1e-9, "status: acceptance_rate")
    check(abs(s1["tokens_per_step"] - s1["emitted"] / s1["steps"]) < 1e-9, "status: tokens_per_step")
    check(s1["verify_step_ms"] > 0 and s1["draft_step_ms"] > 0, "status: verify and draft times")
    check(s1["one_token_step_ms"] > 0 and s1["verify_vs_one_token"] > 0,
          "status: the verify step against a one-token step (%.3f ms vs %.3f ms)"
          % (s1["verify_step_ms"], s1["one_token_step_ms"]))
    if mode == "all":
        check(s1["accepted"] == s1["drafted"], "the target drafting for itself: every draft accepted")
    print("acceptance %.1f%%, %.2f tokens a step, verify %.3f ms against %.3f ms a token" %
          (100 * s1["acceptance_rate"], s1["tokens_per_step"], s1["verify_step_ms"], s1["one_token_step_ms"]))

    # per request: off speculates nothing; a depth of its own drafts at most that
    r = gen(c, PROMPTS[1], spec="off")
    s2 = spec_status(c)
    check(r["tokens"] == want[1] and s2["steps"] == s1["steps"], "spec off: no speculative step, same tokens")
    r = gen(c, PROMPTS[2], spec=1)
    s3 = spec_status(c)
    check(r["tokens"] == want[2] and s3["drafted"] - s2["drafted"] <= s3["steps"] - s2["steps"],
          "spec 1: one draft a step at most, same tokens")
    r = gen(c, PROMPTS[3], spec=12)
    check(r["tokens"] == want[3], "spec 12: same tokens")

    # sampled requests speculate too (the acceptance rule, test_spec_sampling.c); greedy with a
    # penalty goes that way with one-hot distributions and gives plain decoding's tokens
    r = gen(c, PROMPTS[1], repeat_penalty=1.3)
    s6 = spec_status(c)
    check(r["tokens"] == want[4] and s6["steps"] > s3["steps"],
          "greedy with a repetition penalty: speculative steps, plain decoding's tokens")
    r = gen(c, PROMPTS[2], temperature=0.8, seed=7, max_tokens=32)
    s7 = spec_status(c)
    check(r["n_generated"] > 0 and s7["steps"] > s6["steps"] and s7["drafted"] > s6["drafted"],
          "a sampled request speculates (%d steps, %d of %d accepted)"
          % (s7["steps"] - s6["steps"], s7["accepted"] - s6["accepted"], s7["drafted"] - s6["drafted"]))

    # side by side: each request its own draft sequence
    res = concurrent(PROMPTS[:3])
    check([r["tokens"] for r in res] == want[:3], "three requests at once: plain greedy's tokens")
    # more requests than speculate at once: plain decoding steps, same tokens
    s4 = spec_status(c)
    ids = PROMPTS + [p[::-1] for p in PROMPTS] + [p[1:] for p in PROMPTS]
    res = concurrent(ids, max_tokens=64)
    same = all(r["tokens"][:len(w)] == w and (len(w) == 24 or r["tokens"] == w) for r, w in zip(res, want[:4]))
    check(same, "twelve requests at once: plain greedy's tokens")
    s5 = spec_status(c)
    check(s5["batch_skips"] > s4["batch_skips"], "twelve requests decoding: steps taken plainly (%d)"
          % (s5["batch_skips"] - s4["batch_skips"]))

    # adaptive: low acceptance shrinks the depth; a request whose speculative steps give fewer
    # tokens a second than one-token steps stops speculating (on the CPU with these tiny models
    # a draft step costs about what a target step does, so speculation never pays here)
    a0 = spec_status(c)
    r = gen(c, PROMPTS[0], max_tokens=96)
    a1 = spec_status(c)
    steps, drafted = a1["steps"] - a0["steps"], a1["drafted"] - a0["drafted"]
    acc = (a1["accepted"] - a0["accepted"]) / drafted if drafted else 0
    print("a long request: %d speculative steps, %d drafts (%.1f%% accepted), stopped %d" %
          (steps, drafted, 100 * acc, a1["stopped_requests"] - a0["stopped_requests"]))
    stopped = a1["stopped_requests"] - a0["stopped_requests"]
    if mode == "all":
        # the target drafting for itself: a step of D drafts and a verify costs about the D + 1
        # one-token steps it replaces, so whether it pays is for the timings (sanitizers and load
        # turn it either way); only the rule's floor of 8 judged steps is checked here
        check(stopped == 0 or 8 <= steps < r["n_generated"],
              "a request drafting for itself stops speculating, if at all, after 8 steps")
    else:
        check(stopped == 1 and 8 <= steps < r["n_generated"],
              "a request where speculation does not pay stops after 8 steps and decodes plainly")
    if mode == "all":
        check(drafted == 4 * steps, "full acceptance keeps the depth at 4")
    elif acc < 0.4:
        check(drafted < 4 * steps, "low acceptance shrinks the depth (%d drafts in %d steps)" % (drafted, steps))

    # bad values: error 4, the daemon lives
    for bad in ("on", "draft", "", 0, -1, 65, 1.5, [], {}, True):
        err, _, _ = c.call("generate", dict(GREEDY, prompt_tokens=PROMPTS[0], spec=bad))
        check(err is not None and err["code"] == 4 and "spec" in err["message"],
              "spec=%r: error 4 (%s)" % (bad, err and err["message"]))
        err, _, _ = c.call("chat", {"messages": [{"role": "user", "content": "hi"}], "spec": bad,
                                    "max_tokens": 2})
        check(err is not None and err["code"] == 4, "chat spec=%r: error 4" % (bad,))
    r, _ = c.ok("chat", {"messages": [{"role": "user", "content": "hi"}], "spec": 3, "max_tokens": 4,
                         "temperature": 0})
    check(r["n_generated"] > 0, "chat with spec 3 answers")
    check(gen(c, PROMPTS[0])["tokens"] == want[0], "the daemon lives on after bad values")

    # metrics: Prometheus text and the map
    m = c.ok("metrics")[0]["metrics"]
    st = spec_status(c)
    check(m["siliceo_spec_steps_total"] == st["steps"] and m["siliceo_spec_accepted_tokens_total"] == st["accepted"]
          and m["siliceo_spec_drafted_tokens_total"] == st["drafted"], "metrics: steps, drafted, accepted as status")
    check(abs(m["siliceo_spec_acceptance_ratio"] - st["acceptance_rate"]) < 1e-9, "metrics: acceptance ratio")
    check(m["siliceo_spec_verify_cost_ratio"] > 0 and m["siliceo_spec_tokens_per_step"] >= 1,
          "metrics: verify cost against a one-token step, tokens a step")
    text = c.ok("metrics", {"format": "prometheus"})[0]["text"]
    for name, kind in (("siliceo_spec_steps_total", "counter"), ("siliceo_spec_drafted_tokens_total", "counter"),
                       ("siliceo_spec_accepted_tokens_total", "counter"), ("siliceo_spec_acceptance_ratio", "gauge"),
                       ("siliceo_spec_tokens_per_step", "gauge"), ("siliceo_spec_verify_cost_ratio", "gauge"),
                       ("siliceo_spec_verify_seconds_total", "counter"), ("siliceo_spec_draft_sequences", "gauge")):
        check("# TYPE %s %s\n" % (name, kind) in text and "# HELP %s " % name in text,
              "prometheus text has HELP and TYPE for %s" % name)
    check("\nsiliceo_spec_steps_total %d\n" % st["steps"] in text, "prometheus: siliceo_spec_steps_total")

    # cancelled mid-stream: every sequence and KV block back as before
    base = c.ok("status")[0]
    mid = c.send("generate", dict(GREEDY, prompt_tokens=PROMPTS[3], max_tokens=400))
    seen = []
    while len(seen) < 6:
        msg = c.read()
        if msg[0] == 2 and msg[2][0].get("id") == mid:
            seen.append(msg)
        elif msg[0] == 1:
            break
    during = spec_status(c)
    c.send("cancel", {"id": mid})
    err, res, _ = c.wait(mid)
    check(err is None and res["stop_reason"] in ("cancelled", "eos"), "cancelled mid-stream (%s)"
          % (res or err))
    after = c.ok("status")[0]
    for _ in range(50):
        if after["queue"]["running"] == 0:
            break
        time.sleep(0.1)
        after = c.ok("status")[0]
    check(during["draft_state"]["sequences"] == 1 or res["stop_reason"] != "cancelled"
          or during["stopped_requests"] > base["speculative"]["stopped_requests"],
          "while it ran it held a draft sequence (or had stopped speculating)")
    check(after["queue"]["running"] == 0 and after["memory"]["kv"] == base["memory"]["kv"],
          "after the cancel: no request runs, the KV state is what it was (%d, %d)"
          % (after["memory"]["kv"], base["memory"]["kv"]))
    a, b = after["speculative"]["draft_state"], base["speculative"]["draft_state"]
    check(a["sequences"] == 0 and a["kv_blocks_free"] == b["kv_blocks_free"] == a["kv_blocks"],
          "after the cancel: the draft holds no sequence and every KV block is free (%r)" % a)


def mtp(path):
    with open(path) as f:
        want = json.load(f)
    c = Client()
    s0 = spec_status(c)
    check(s0 is not None and s0["mode"] == "mtp" and s0["active"] is True and s0["tree"] == "1x3"
          and s0["draft_model"] is None and s0["draft_arch"] is None,
          "status: the MTP layer drafts, 1x3, no draft model (%r)" % s0)
    for i, p in enumerate(PROMPTS):
        check(gen(c, p)["tokens"] == want[i], "prompt %d: the tokens of plain greedy decoding" % i)
    s1 = spec_status(c)
    check(s1["steps"] > 0 and s1["drafted"] > 0 and s1["emitted"] == s1["accepted"] + s1["steps"],
          "status: speculative steps drafted by the MTP layer, emitted = accepted + steps (%r)" % s1)
    check(s1["accepted"] <= s1["drafted"] <= 3 * s1["steps"], "status: accepted <= drafted <= 3 a step")
    check(s1["draft_state"]["sequences"] == 0, "status: no draft sequences with mtp")
    print("mtp: %d of %d drafts accepted, %.2f tokens a step" % (s1["accepted"], s1["drafted"],
                                                                  s1["tokens_per_step"]))
    r = gen(c, PROMPTS[1], spec="off")
    s2 = spec_status(c)
    check(r["tokens"] == want[1] and s2["steps"] == s1["steps"], "spec off: no speculative step, same tokens")
    r = gen(c, PROMPTS[2], spec=1)
    s3 = spec_status(c)
    check(r["tokens"] == want[2] and 0 < s3["drafted"] - s2["drafted"] <= s3["steps"] - s2["steps"],
          "spec 1: one draft a step at most, same tokens")
    check(gen(c, PROMPTS[3], spec=12)["tokens"] == want[3], "spec 12: same tokens")
    r = gen(c, PROMPTS[1], repeat_penalty=1.3)
    s4 = spec_status(c)
    check(r["tokens"] == want[4] and s4["steps"] > s3["steps"],
          "greedy with a repetition penalty: MTP speculative sampling, plain decoding's tokens")
    r = gen(c, PROMPTS[2], temperature=0.8, seed=7, max_tokens=32)
    s5 = spec_status(c)
    check(r["n_generated"] > 0 and s5["drafted"] > s4["drafted"],
          "a sampled request speculates with the MTP layer (%d drafts)" % (s5["drafted"] - s4["drafted"]))
    res = concurrent(PROMPTS[:3])
    check([r["tokens"] for r in res] == want[:3], "three requests at once: plain greedy's tokens")
    for bad in ("on", 0, 65, True):
        err, _, _ = c.call("generate", dict(GREEDY, prompt_tokens=PROMPTS[0], spec=bad))
        check(err is not None and err["code"] == 4, "spec=%r: error 4" % (bad,))
    m = c.ok("metrics")[0]["metrics"]
    st = spec_status(c)
    check(m["siliceo_spec_active"] == 1 and m["siliceo_spec_steps_total"] == st["steps"],
          "metrics: active, steps as status")
    check(gen(c, PROMPTS[0])["tokens"] == want[0], "the daemon lives on")


def tree(path, shape, mode):
    with open(path) as f:
        want = json.load(f)
    width, depth = (int(x) for x in shape.split("x"))
    c = Client()
    s0 = spec_status(c)
    check(s0 is not None and s0["active"] is True and s0["tree"] == shape and s0["width"] == width
          and s0["depth"] == depth, "status: a tree of %s, width %d (%r)" % (shape, width, s0))
    for i, p in enumerate(PROMPTS):
        check(gen(c, p)["tokens"] == want[i], "%s, prompt %d: the tokens of plain greedy decoding"
              % (shape, i))
    s1 = spec_status(c)
    check(s1["steps"] > 0 and s1["emitted"] == s1["accepted"] + s1["steps"],
          "status: speculative steps, emitted = accepted + steps (%r)" % s1)
    check(s1["accepted"] <= depth * s1["steps"] and s1["drafted"] <= width * depth * s1["steps"],
          "status: at most one branch accepted and width x depth drafted a step")
    if mode == "all":
        check(s1["accepted"] >= s1["steps"] * depth // 2,
              "drafting for itself: most of a branch accepted a step (%r)" % s1)
    print("tree %s: %d of %d drafts accepted, %.2f tokens a step, verify %.3f ms vs one token "
          "%.3f ms" % (shape, s1["accepted"], s1["drafted"], s1["tokens_per_step"],
                       s1["verify_step_ms"], s1["one_token_step_ms"]))
    for i, kw in enumerate(({"spec": "off"}, {"spec": 1}, {"spec": 12}, {"spec": 40})):
        p = PROMPTS[1 + i % 3]
        check(gen(c, p, **kw)["tokens"] == want[1 + i % 3], "%r: the same tokens" % kw)
    check(gen(c, PROMPTS[1], repeat_penalty=1.3)["tokens"] == want[4],
          "greedy with a repetition penalty (sampled chains): plain decoding's tokens")
    res = concurrent(PROMPTS[:3])
    check([r["tokens"] for r in res] == want[:3], "three requests at once: plain greedy's tokens")


def churn(n):
    """n sampled requests that speculate, every other one ended by its client's disconnect: the
    heap comes back to where it was and the draft holds no sequence. A draft sampler kept past its
    request (about 14 KiB with a 512-token vocabulary) grows the heap by n times that."""
    c = Client()

    def settle():
        for _ in range(100):
            st = c.ok("status")[0]
            if st["queue"]["running"] == 0 and st["queue"]["queued"] == 0:
                return st
            time.sleep(0.1)
        return st

    def one(i, disconnect):
        k = Client()
        mid = k.send("generate", dict(GREEDY, prompt_tokens=PROMPTS[i % 3], temperature=0.8, seed=i + 1,
                                      max_tokens=16))
        if disconnect:  # after a few tokens, mid-stream
            for _ in range(3):
                msg = k.read()
                if msg is None or msg[0] != 2:
                    break
        else:
            err, _, _ = k.wait(mid)
            if err is not None:
                check(False, "sampled request %d answers (%r)" % (i, err))
        k.close()

    for i in range(20):
        one(i, i % 2 == 1)
    base = settle()
    for i in range(n):
        one(i, i % 2 == 1)
    after = settle()
    steps = after["speculative"]["steps"] - base["speculative"]["steps"]
    check(steps >= n // 2, "the sampled requests speculated (%d steps)" % steps)
    check(after["queue"]["running"] == 0 and after["speculative"]["draft_state"]["sequences"] == 0,
          "after %d sampled requests: none runs, the draft holds no sequence" % n)
    h0, h1 = base["memory"]["heap"], after["memory"]["heap"]
    check(h1 - h0 < 256 << 10, "heap flat over %d sampled speculative requests (%d -> %d KiB)"
          % (n, h0 >> 10, h1 >> 10))


if __name__ == "__main__":
    {"plain": lambda: plain(sys.argv[2]), "spec": lambda: spec(sys.argv[2], sys.argv[3]),
     "mtp": lambda: mtp(sys.argv[2]), "churn": lambda: churn(int(sys.argv[2])),
     "tree": lambda: tree(sys.argv[2], sys.argv[3], sys.argv[4])}[sys.argv[1]]()
