"""Checks for chat_context.sh: a session that outgrows a small context drops its oldest turns.

  context_tests.py turns CTX DIR N PLAIN   the N sil-chat -S turns saved in DIR (i.json, i.err)
  context_tests.py replay DIR              every turn again, cold, on a daemon without prefix
                                           cache: same prompt length, same greedy answer
  context_tests.py edge CTX                one request too large, one answer cut by the context
"""
import json
import os
import sys

from siltest import Client, check

SYSTEM = "You are terse."
GEN = {"temperature": 0, "max_tokens": 8, "grace_tokens": 0, "think": False}


def question(i):
    return "Question %d: tell me about the number %d and its friends." % (i, i)


def turns(ctx, d, n, plain):
    conv = [{"role": "system", "content": SYSTEM}]
    seen = []  # per turn: the messages the model was given, and its answer
    drops = 0
    for i in range(1, n + 1):
        r = json.load(open(os.path.join(d, "%d.json" % i)))
        err = open(os.path.join(d, "%d.err" % i)).read()
        check(r["n_generated"] > 0 and r["text"] != "" and r["stop_reason"] in ("length", "eos"),
              "turn %d answers (%d tokens, %r, %s)" % (i, r["n_generated"], r["text"][:20],
                                                         r["stop_reason"]))
        check(r["n_prompt"] + r["n_generated"] < ctx,
              "turn %d: prompt %d + answer %d within the context of %d" %
              (i, r["n_prompt"], r["n_generated"], ctx))
        k = r["dropped_messages"]
        said = "oldest messages were dropped" in err
        check(said == (k > 0), "turn %d: sil-chat says so exactly when messages were dropped "
              "(%d dropped, stderr %r)" % (i, k, err))
        conv.append({"role": "user", "content": question(i)})
        if k:
            drops += 1
            check(k % 2 == 0, "turn %d drops whole turns (%d messages)" % (i, k))
            check(r["n_prompt"] <= ctx // 2,
                  "turn %d: the kept conversation takes at most half the context (%d)" %
                  (i, r["n_prompt"]))
            del conv[1:1 + k]  # the system message stays
            if plain:
                check(r["n_cached"] > 0, "turn %d: an attention-only model reuses the kept "
                      "prefix (%d cached)" % (i, r["n_cached"]))
        seen.append({"messages": [dict(m) for m in conv], "n_prompt": r["n_prompt"],
                     "tokens": r["tokens"]})
        conv.append({"role": "assistant", "content": r["text"]})
    check(drops >= 2, "the session dropped older turns %d times in %d turns" % (drops, n))
    sess = [s for s in Client().ok("sessions.list")[0]["sessions"] if s["name"] == "long"]
    check(len(sess) == 1 and sess[0]["messages"] == len(conv),
          "the session's transcript holds what the model saw (%d messages, %r)" %
          (len(conv), sess))
    json.dump({"seen": seen, "conv": conv}, open(os.path.join(d, "seen.json"), "w"))


def replay(d):
    s = json.load(open(os.path.join(d, "seen.json")))
    r = json.load(open(os.path.join(d, "next.json")))
    c = Client()
    saved = [x for x in c.ok("sessions.list")[0]["sessions"] if x["name"] == "long"]
    check(len(saved) == 1 and saved[0]["saved"] and
          saved[0]["messages"] == len(s["conv"]) + 2 - r["dropped_messages"],
          "after a restart and a turn the saved transcript holds the kept conversation (%d + 2 "
          "- %d dropped: %r)" % (len(s["conv"]), r["dropped_messages"], saved))
    for i, t in enumerate(s["seen"], 1):
        check(t["messages"][0]["role"] == "system", "turn %d kept the system prompt" % i)
        cold, _ = c.ok("chat", dict(GEN, messages=t["messages"]))
        check(cold["n_prompt"] == t["n_prompt"],
              "turn %d: the session's prompt is system + kept turns + question (%d tokens, "
              "cold %d)" % (i, t["n_prompt"], cold["n_prompt"]))
        check(cold["tokens"] == t["tokens"], "turn %d: the session's answer is the cold one's "
              "(engine state recomputed, not reused from the dropped turns)" % i)
    # The session continued after the restart, from its saved (trimmed) transcript.
    conv = s["conv"] + [{"role": "user", "content": question(len(s["seen"]) + 1)}]
    del conv[1:1 + r["dropped_messages"]]
    cold, _ = c.ok("chat", dict(GEN, messages=conv))
    check(r["n_prompt"] == cold["n_prompt"] and r["tokens"] == cold["tokens"],
          "the restarted session goes on from the kept conversation (%d tokens, cold %d)" %
          (r["n_prompt"], cold["n_prompt"]))


def edge(ctx):
    c = Client()
    check("context_full" in c.ok("hello")[0]["capabilities"], "hello lists context_full")
    big = [{"role": "user", "content": "word " * ctx}]
    err, _, _ = c.call("chat", dict(GEN, messages=big))
    check(err is not None and err["code"] == 15 and "does not fit the context" in err["message"],
          "a chat larger than the context: error 15, context_full (%r)" % (err,))
    err, _, _ = c.call("chat", dict(GEN, messages=big, session="long", append=True))
    check(err is not None and err["code"] == 15, "on a session too (%r)" % (err,))
    # An answer that meets the end of the context stops with "context", not an empty "length".
    bias = {}
    for t in ("<|im_end|>", "<|endoftext|>"):
        r, _ = c.ok("tokenize", {"text": t, "special": True})
        if len(r["ids"]) == 1:
            bias[r["ids"][0]] = -100
    ids, _ = c.ok("tokenize", {"text": "one two three four five six seven eight nine ten " * 40})
    prompt = ids["ids"][:ctx - 4]
    r, _ = c.ok("generate", {"prompt_tokens": prompt, "max_tokens": 50, "grace_tokens": 0,
                             "temperature": 0, "logit_bias": bias})
    check(r["stop_reason"] == "context" and 0 < r["n_generated"] and
          r["n_prompt"] + r["n_generated"] <= ctx,
          "an answer cut by the context ends with stop_reason context (%s, %d + %d of %d)" %
          (r["stop_reason"], r["n_prompt"], r["n_generated"], ctx))


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[0] == "turns":
        turns(int(a[1]), a[2], int(a[3]), a[4] == "plain")
    elif a[0] == "replay":
        replay(a[1])
    elif a[0] == "edge":
        edge(int(a[1]))
