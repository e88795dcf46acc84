"""Warm restart checks against a running siliceod with the simulated expert cache on
(daemon_heat.sh drives the phases). Figures of each turn are appended to a JSON lines file."""
import json
import struct
import sys

from siltest import Client, check

GREEDY = {"temperature": 0, "grace_tokens": 0}
PROMPT = "Hello there, how are you today?"


def cache(c):
    st, _ = c.ok("status")
    return st["expert_cache"], st["heat_map"]


def turn(c, n):
    """One request; the simulated cache's hit rate over it (counters after less before)."""
    ec0, _ = cache(c)
    r, _ = c.ok("generate", dict(GREEDY, prompt=PROMPT, max_tokens=n))
    # Greedy: every turn of this prompt routes the same way, so turns compare cache states only.
    check(r["n_generated"] > 0 and r["stop_reason"] in ("length", "eos"), "the turn generated "
          "%d tokens (%s)" % (r["n_generated"], r["stop_reason"]))
    ec1, _ = cache(c)
    look = ec1["lookups"] - ec0["lookups"]
    check(look > 0, "the turn was looked up in the simulated cache (%d lookups)" % look)
    return (ec1["hits"] - ec0["hits"]) / look


def record(path, name, rate):
    with open(path, "a") as f:
        f.write(json.dumps({"turn": name, "hit_rate": rate}) + "\n")
    print("figure: %s hit rate %.4f" % (name, rate))


def read_heat(path, slots):
    """Experts with heat in a heat map file, and how many per-layer pools of slots take."""
    with open(path, "rb") as f:
        b = f.read()
    check(b[:8] == b"SILHEAT\0", "the heat file starts with its magic")
    n_layer, n_expert = struct.unpack_from("<II", b, 12)
    heat = struct.unpack_from("<%df" % (n_layer * n_expert), b, 40)
    hot = want = 0
    for l in range(n_layer):
        nz = sum(1 for h in heat[l * n_expert:(l + 1) * n_expert] if h > 0)
        pool = slots // n_layer + (1 if l < slots % n_layer else 0)
        hot += nz
        want += min(nz, pool)
    return hot, want


def main():
    what, figs = sys.argv[1], sys.argv[2]
    c = Client()
    ec, hm = cache(c)
    if what == "cold":
        check(ec is not None and ec["mode"] == "simulated", "status says the cache is simulated")
        check(ec["slots"] == int(sys.argv[3]), "status shows the slots configured")
        check(hm["loaded"] == "none" and hm["preloaded"] == 0, "a cold start preloads nothing")
        check(ec["hit_rate"] is None and all(x is None for x in ec["layers"]),
              "no hit rate before the first lookup")
        record(figs, "cold first", turn(c, 48))
        record(figs, "warm", turn(c, 48))
        ec, _ = cache(c)
        check(len(ec["layers"]) == int(sys.argv[4]), "a hit rate per layer")
        check(all(0 <= x <= 1 for x in ec["layers"]), "per-layer hit rates in [0, 1]")
        check(ec["hits"] + ec["misses"] == ec["lookups"] and ec["bytes_streamed"] > 0,
              "misses are counted as bytes streamed")
    elif what == "restart":
        slots = int(sys.argv[3])
        check(hm["loaded"] == "loaded" and hm["load_error"] is None, "the heat map was loaded")
        # The file saved at SIGTERM: per-layer pools of slots / n_layer take each layer's hottest.
        hot, want = read_heat(sys.argv[4], slots)
        check(hm["hot_experts"] == hot and hm["preloaded"] == want,
              "the hottest experts fill the per-layer pools (%d hot, %d preloaded, %d expected)"
              % (hm["hot_experts"], hm["preloaded"], want))
        check(ec["preloaded"] == want and hm["tokens_loaded"] > 0, "status shows the preload")
        rate = turn(c, 48)
        record(figs, "first after restart", rate)
        with open(figs) as f:
            rows = [json.loads(x) for x in f]
        cold = [r["hit_rate"] for r in rows if r["turn"] == "cold first"][0]
        check(rate >= cold, "the first turn after a restart hits at least as often as the cold "
              "first turn (%.4f >= %.4f)" % (rate, cold))
    elif what == "reloaded":
        check(hm["loaded"] == "loaded" and hm["saves"] == 1, "the reload saved the map and "
              "loaded it again (%d saves)" % hm["saves"])
        check(ec["preloaded"] > 0 and ec["lookups"] == 0, "the new engine's cache is preloaded "
              "and fresh (%d preloaded)" % ec["preloaded"])
        r, _ = c.ok("generate", dict(GREEDY, prompt=PROMPT, max_tokens=8))
        check(r["n_generated"] > 0, "the reloaded model serves")
    elif what == "ignored":
        check(hm["loaded"] == "ignored" and hm["load_error"], "the bad heat map was ignored: %s"
              % hm["load_error"])
        check(hm["preloaded"] == 0 and ec["preloaded"] == 0, "nothing preloaded from it")
        r, _ = c.ok("generate", dict(GREEDY, prompt=PROMPT, max_tokens=8))
        check(r["n_generated"] > 0, "the daemon serves after ignoring it")
    elif what == "metrics":
        r, _ = c.ok("metrics", {"format": "prometheus"})
        m, _ = c.ok("metrics")
        m = m["metrics"]
        check(m["siliceo_expert_cache_sim_slots"] == ec["slots"] and
              m["siliceo_expert_cache_sim_hits_total"] == ec["hits"] and
              m["siliceo_expert_cache_sim_lookups_total"] == ec["lookups"],
              "metrics agree with status")
        check(sum(m["siliceo_expert_cache_sim_layer_hits_total"].values()) == ec["hits"],
              "per-layer hits as label maps")
        with open(sys.argv[3], "w") as f:
            f.write(r["text"])
        return
    elif what == "saves":
        check(hm["saves"] >= 1 and hm["save_errors"] == 0 and hm["last_save_age_s"] is not None,
              "the periodic save ran (%d saves)" % hm["saves"])
    elif what == "unsaved":
        check(hm is not None and hm["file"] is None, "no usable state directory: no heat file")
        r, _ = c.ok("generate", dict(GREEDY, prompt=PROMPT, max_tokens=4))
        check(r["n_generated"] > 0, "the daemon serves without a state directory")
    elif what == "off":
        check(ec is None and hm is None, "expert_cache and heat_map are nil when off")
    else:
        raise SystemExit("unknown phase " + what)


if __name__ == "__main__":
    main()
