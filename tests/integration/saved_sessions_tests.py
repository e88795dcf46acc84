"""Saved sessions (daemon_saved_sessions.sh): chat transcripts kept in the state directory across
restarts and evictions. Each function is one step; the script restarts the daemon between them."""
import json
import os
import stat
import sys

from siltest import Client, RawStr, check

SYSTEM = {"role": "system", "content": "You are terse."}
GEN = {"temperature": 0, "max_tokens": 6, "think": False}


def chat(c, session, text, append=True, msgs=None):
    p = dict(GEN, messages=msgs or [{"role": "user", "content": text}], session=session,
             append=append)
    return c.ok("chat", p)[0]


def cold(c, conv):
    """The same conversation sent in one go, on no session: what the engine must have seen."""
    return c.ok("chat", dict(GEN, messages=conv))[0]


def listed(c):
    """The caller's sessions by name (the daemon's owner is shown every uid's)."""
    return {s["name"]: s for s in c.ok("sessions.list")[0]["sessions"] if s["uid"] == os.getuid()}


def session_dir(state, uid):
    return os.path.join(state, "sessions", str(uid))


def file_of(state, uid, name):
    raw = name if isinstance(name, bytes) else name.encode()
    return os.path.join(session_dir(state, uid), raw.hex())


def first(state, out):
    """Turn one of 'plan' on a fresh daemon; its transcript file, private, appears at once."""
    c = Client()
    r1 = chat(c, "plan", None, append=False,
              msgs=[SYSTEM, {"role": "user", "content": "My name is Bob."}])
    json.dump(r1, open(out, "w"))
    f = file_of(state, os.getuid(), "plan")
    check(os.path.isfile(f), "the transcript is saved when it changes: %s" % f)
    check(stat.S_IMODE(os.stat(f).st_mode) == 0o600, "the file is 0600")
    for d in (session_dir(state, os.getuid()), os.path.dirname(session_dir(state, os.getuid()))):
        check(stat.S_IMODE(os.stat(d).st_mode) == 0o700, "%s is 0700" % d)
    check(listed(c)["plan"]["saved"], "sessions.list says plan is saved")


def after_restart(out1):
    """After SIGTERM and a restart, 'plan' continues: the engine's prompt is the whole
    conversation (as long as the same conversation sent in one go, the same answer), computed
    anew (nothing cached: the restart emptied every cache)."""
    r1 = json.load(open(out1))
    c = Client()
    ls = listed(c)
    check("plan" in ls and ls["plan"]["messages"] == 3 and ls["plan"]["memory"] == 0 and ls["plan"]["saved"],
          "after the restart sessions.list shows plan, saved, 3 messages, no engine state: %r" % ls.get("plan"))
    r2 = chat(c, "plan", "What is my name?")
    conv = [SYSTEM, {"role": "user", "content": "My name is Bob."},
            {"role": "assistant", "content": r1["text"]}, {"role": "user", "content": "What is my name?"}]
    one = cold(c, conv)
    check(r2["n_prompt"] == one["n_prompt"],
          "the continued prompt is the whole conversation: %d tokens, sent in one go %d" %
          (r2["n_prompt"], one["n_prompt"]))
    check(r2["n_cached"] == 0, "its state was recomputed from the transcript (%d cached)" % r2["n_cached"])
    check(r2["tokens"] == one["tokens"], "and the answer is the one-go conversation's")
    check(listed(c)["plan"]["messages"] == 5, "plan holds 5 messages")


def sigterm_mid(pid, out):
    """SIGTERM while a session's answer streams: the request ends with stop_reason shutdown and
    the transcript saved holds the answer as far as it went."""
    import signal
    c = Client()
    mid = c.send("chat", dict(GEN, messages=[{"role": "user", "content": "Count to fifty."}],
                              session="mid", max_tokens=400, grace_tokens=0))
    sent = []

    def note(n):
        sent.append(n)
        if len(sent) == 5:
            os.kill(pid, signal.SIGTERM)

    err, res, _ = c.wait(mid, on_note=note)
    check(err is None and res["stop_reason"] == "shutdown" and 5 <= res["n_generated"] < 400,
          "the streaming request ends with shutdown after %s tokens" % (res or {}).get("n_generated"))
    json.dump(res, open(out, "w"))


def after_sigterm_mid(out):
    r = json.load(open(out))
    c = Client()
    ls = listed(c)
    check(ls.get("mid", {}).get("messages") == 2, "the cut conversation was saved: %r" % ls.get("mid"))
    r2 = chat(c, "mid", "Go on.")
    one = cold(c, [{"role": "user", "content": "Count to fifty."}, {"role": "assistant", "content": r["text"]},
                   {"role": "user", "content": "Go on."}])
    check(r2["n_prompt"] == one["n_prompt"], "and continues with the partial answer in the prompt (%d, one go %d)" %
          (r2["n_prompt"], one["n_prompt"]))


def other_uid(state, uid, gid):
    """Another uid sees none of root's sessions; the same name is its own conversation."""
    root_file = file_of(state, os.getuid(), "plan")
    before = open(root_file, "rb").read()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            c = Client()
            check(listed(c) == {}, "uid %d lists no session of another uid" % uid)
            r = chat(c, "plan", "What is my name?")
            one = cold(c, [{"role": "user", "content": "What is my name?"}])
            check(r["n_prompt"] == one["n_prompt"],
                  "uid %d's 'plan' holds only its own question (%d tokens, alone %d)" %
                  (uid, r["n_prompt"], one["n_prompt"]))
            check(listed(c)["plan"]["messages"] == 2, "its plan has 2 messages")
            try:
                open(root_file, "rb").read()
                check(False, "uid %d read another uid's transcript file" % uid)
            except PermissionError:
                check(True, "uid %d cannot read another uid's transcript file" % uid)
            err, _, _ = c.call("sessions.drop", {"name": "plan", "uid": 0})
            check(err is not None and err["code"] == 6, "nor drop another uid's session: %r" % err)
            os._exit(0)
        except SystemExit as e:
            os._exit(e.code or 0)
        except BaseException as e:
            print("child:", repr(e))
            os._exit(3)
    _, st = os.waitpid(pid, 0)
    check(os.waitstatus_to_exitcode(st) == 0, "uid %d's checks passed" % uid)
    check(open(root_file, "rb").read() == before, "root's transcript file is unchanged")
    check(os.path.isfile(file_of(state, uid, "plan")), "uid %d's transcript is in its own directory" % uid)
    c = Client()
    check(listed(c)["plan"]["messages"] == 7, "root's plan still holds its 7 messages")


def evicted():
    """max_sessions = 1: a second session pushes the first out of memory; the first comes back
    on first use with its conversation."""
    c = Client()
    a1 = chat(c, "a", None, append=False, msgs=[SYSTEM, {"role": "user", "content": "My name is Ann."}])
    chat(c, "b", None, append=False, msgs=[SYSTEM, {"role": "user", "content": "My name is Ben."}])
    ls = listed(c)
    check(ls["a"]["memory"] == 0 and ls["a"]["saved"] and ls["b"]["memory"] > 0,
          "a was evicted from memory and is listed as saved: %r" % ls["a"])
    a2 = chat(c, "a", "What is my name?")
    one = cold(c, [SYSTEM, {"role": "user", "content": "My name is Ann."},
                   {"role": "assistant", "content": a1["text"]},
                   {"role": "user", "content": "What is my name?"}])
    check(a2["n_prompt"] == one["n_prompt"] and a2["tokens"] == one["tokens"],
          "the evicted session continues its conversation (%d tokens, one go %d)" %
          (a2["n_prompt"], one["n_prompt"]))
    check(listed(c)["a"]["messages"] == 5, "a holds 5 messages")


def hostile(state):
    """Names with separators, dots, binary and the longest allowed stay inside the uid's
    directory as hex file names, and come back after a restart."""
    c = Client()
    names = ["../../escape", "a/b", "..", RawStr(b"\xff\xfe\x01bin"), "x" * 127]
    for n in names:
        chat(c, n, None, append=False, msgs=[{"role": "user", "content": "Hello"}])
    d = session_dir(state, os.getuid())
    files = set(os.listdir(d))
    for n in names:
        raw = bytes(n) if isinstance(n, RawStr) else n.encode()
        check(raw.hex() in files, "name %r is saved as %s..." % (raw[:16], raw.hex()[:16]))
    check(not os.path.exists(os.path.join(state, "escape")) and
          not os.path.exists(os.path.join(os.path.dirname(state), "escape")),
          "nothing was written outside the directory")
    err, _, _ = c.call("chat", dict(GEN, messages=[{"role": "user", "content": "Hi"}],
                                    session="y" * 128))
    check(err is not None and err["code"] == 4, "a 128-byte name is refused with code 4")


def hostile_back():
    c = Client()
    names = set(listed(c))
    for n in ["../../escape", "a/b", "..", "x" * 127]:
        check(n in names, "%r is listed after the restart" % n[:20])
    r = chat(c, "../../escape", "Again")
    check(r["n_prompt"] > 0 and listed(c)["../../escape"]["messages"] == 4,
          "and continues (4 messages)")


def corrupt_after():
    """A corrupt file is ignored (the script checks the log line): not listed, and its name
    starts over."""
    c = Client()
    ls = listed(c)
    check("bad" not in ls and "cut" not in ls, "the corrupt files are not listed")
    check("plan" in ls, "the good one still is")
    r = chat(c, "cut", "What is my name?")
    one = cold(c, [{"role": "user", "content": "What is my name?"}])
    check(r["n_prompt"] == one["n_prompt"], "a session whose file is corrupt starts over")


def memory_only():
    """No usable state directory: sessions still work, in memory."""
    c = Client()
    chat(c, "m", None, append=False, msgs=[SYSTEM, {"role": "user", "content": "My name is Bob."}])
    r = chat(c, "m", "What is my name?")
    ls = listed(c)
    check(ls["m"]["messages"] == 5 and not ls["m"]["saved"] and r["n_cached"] > 0,
          "the session works in memory, not saved: %r" % ls["m"])


def bounded(state):
    """saved_sessions = 2: a third session's save removes the least recently saved file."""
    c = Client()
    for n in ["s1", "s2", "s3"]:
        chat(c, n, None, append=False, msgs=[{"role": "user", "content": "Hello " + n}])
    d = session_dir(state, os.getuid())
    files = sorted(os.listdir(d))
    check(files == sorted([b"s2".hex(), b"s3".hex()]), "two files kept, the oldest removed: %r" % files)
    err, _, _ = c.call("chat", dict(GEN, messages=[{"role": "user", "content": "the cat sat on the mat. " * 210}],
                                    session="big", append=False))
    check(err is None, "a transcript over saved_session_bytes still answers: %r" % err)
    check(sorted(os.listdir(d)) == files, "but it is not saved, and removed no other: %r" % os.listdir(d))
    ls = listed(c)
    check(ls["big"]["saved"] is False and ls["big"]["messages"] == 2, "and it says so: %r" % ls["big"])


if __name__ == "__main__":
    fn = globals()[sys.argv[1]]
    args = [int(a) if a.isdigit() else a for a in sys.argv[2:]]
    fn(*args)
