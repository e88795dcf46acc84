"""Trains the small qwen35moe on the generated chat data.

  train.py --out DIR [--preset demo|tiny|draft] [--mtp] [--steps N] [--batch N] [--lr F] [--seed N]
           [--time-budget SECONDS] [--device cuda|cpu] [--init-from FILE.gguf [--train-only mtp]]
           [--vocab-from FILE.gguf]

Writes into DIR: tokenizer.json, ckpt.pt (config, weights, seed, command), log.jsonl (one line
per logged step), loss.png (matplotlib, else gnuplot), metrics.json (held-out accuracy per family
by greedy decoding, training time, device, parameter count, expert popularity and LRU hit rates).
AdamW with linear warm-up and a cosine schedule; bf16 autocast on CUDA, float32 on the CPU.
The loss counts only the assistant's tokens (<think>... through <|im_end|>).

--init-from starts from a trained qwen35moe GGUF (F32, F16 or Q8_0 tensors): its shape, weights
and tokenizer (the file's merges) instead of --preset's, a fresh vocab and random weights; an MTP
layer the file lacks (--mtp) starts from random weights. --train-only mtp then trains the MTP
layer alone on the frozen trunk: the trunk's weights, and so its answers, stay those of the file
(the trunk's hidden states of every training example are computed once, so a step costs only the
MTP layer's forward and backward; the trunk's loss is logged as 0). --vocab-from takes a trained
model's tokenizer, for a draft model that drafts for it.
"""

import argparse
import dataclasses
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import data  # noqa: E402
from model import PRESETS, Qwen35Moe, config_dict  # noqa: E402


def encode_all(tok, examples):
    out = []
    for e in examples:
        p, c = tok.encode(e["prompt"]), tok.encode(e["completion"])
        out.append((p + c, len(p)))
    return out


def batch_of(enc, idx, pad, device):
    T = max(len(enc[i][0]) for i in idx)
    x = torch.full((len(idx), T), pad, dtype=torch.long)
    y = torch.full((len(idx), T), -100, dtype=torch.long)
    for r, i in enumerate(idx):
        ids, n_p = enc[i]
        x[r, :len(ids)] = torch.tensor(ids)
        y[r, n_p - 1:len(ids) - 1] = torch.tensor(ids[n_p:])
    return x.to(device), y.to(device)


@torch.no_grad()
def greedy(model, tok, prompts, max_new, device, routing_log=None, bf16=True):
    """Greedy completions, prompts of equal token length batched together; stops at <|im_end|>."""
    end = tok.special("<|im_end|>")
    enc = [tok.encode(p) for p in prompts]
    by_len = {}
    for i, ids in enumerate(enc):
        by_len.setdefault(len(ids), []).append(i)
    outs = [None] * len(prompts)
    for _, group in sorted(by_len.items()):
        for s in range(0, len(group), 256):
            part = group[s:s + 256]
            x = torch.tensor([enc[i] for i in part], device=device)
            done = torch.zeros(len(part), dtype=torch.bool, device=device)
            gen = []
            for _ in range(max_new):
                with autocast(device if bf16 else "cpu"):
                    nxt = model(x)[:, -1].float().argmax(-1)
                nxt = torch.where(done, torch.full_like(nxt, end), nxt)
                gen.append(nxt)
                done |= nxt == end
                x = torch.cat([x, nxt[:, None]], 1)
                if bool(done.all()):
                    break
            if routing_log is not None:
                rl = []
                with autocast(device):
                    model(x, routing=rl)
                for r in range(len(part)):
                    routing_log.append([layer[r].tolist() for layer in rl])
            g = torch.stack(gen, 1).tolist()
            for r, i in enumerate(part):
                ids = g[r]
                if end in ids:
                    ids = ids[:ids.index(end) + 1]
                outs[i] = tok.decode(ids)
    return outs


def autocast(device):
    if str(device).startswith("cuda"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def accuracy(model, tok, examples, device, max_new=96, routing_log=None):
    outs = greedy(model, tok, [e["prompt"] for e in examples], max_new, device, routing_log)
    per = {}
    for e, o in zip(examples, outs):
        f = per.setdefault(e["family"], [0, 0])
        f[0] += data.answer_of(o) == e["answer"]
        f[1] += 1
    return {k: {"correct": v[0], "total": v[1], "accuracy": v[0] / v[1]} for k, v in per.items()}, outs


def lru_hit_rates(routing, n_layer, n_expert):
    """routing: per sequence, per layer, per position the top-k ids. Per layer: how often each
    expert is used, and the hit rate of an LRU cache of s slots (s = 1..n_expert) fed the
    sequences' routing in order."""
    res = []
    for il in range(n_layer):
        use = [0] * n_expert
        stream = []
        for seq in routing:
            for pos in seq[il]:
                stream.append(pos)
                for e in pos:
                    use[e] += 1
        hits = {}
        for slots in range(1, n_expert + 1):
            cache, h, n = [], 0, 0
            for pos in stream:
                for e in pos:
                    n += 1
                    if e in cache:
                        h += 1
                        cache.remove(e)
                    elif len(cache) >= slots:
                        cache.pop(0)
                    cache.append(e)
            hits[slots] = h / max(n, 1)
        total = sum(use)
        res.append({"layer": il, "popularity": [u / max(total, 1) for u in use],
                    "lru_hit_rate_by_slots": hits})
    return res


def plot(log, path, key="loss"):
    """The training loss (key: the log's field, mtp_loss when only the MTP layer trains)."""
    steps = [r["step"] for r in log]
    loss = [r[key] for r in log]
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(steps, loss)
        ax.set_xlabel("step")
        ax.set_ylabel(f"training {key.replace('_', ' ')} (nats/token)")
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        return "matplotlib"
    except ImportError:
        pass
    if shutil.which("gnuplot"):
        dat = path + ".dat"
        with open(dat, "w") as f:
            for s, v in zip(steps, loss):
                f.write(f"{s} {v}\n")
        script = (f"set terminal png size 700,400; set output '{path}'; set logscale y; "
                  f"set xlabel 'step'; set ylabel 'training {key.replace('_', ' ')}'; "
                  f"plot '{dat}' with lines title '{key}'")
        subprocess.run(["gnuplot", "-e", script], check=True)
        os.remove(dat)
        return "gnuplot"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="demo", choices=sorted(PRESETS))
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.05)
    ap.add_argument("--aux", type=float, default=0.01, help="expert balance loss weight")
    ap.add_argument("--mtp", action="store_true",
                    help="an MTP layer too, trained to predict the token after next")
    ap.add_argument("--mtp-weight", type=float, default=0.3, help="the MTP loss's weight")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n-train", type=int, default=200000)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--heldout", type=int, default=200, help="held-out questions per family")
    ap.add_argument("--time-budget", type=float, default=0,
                    help="seconds of training at most; the schedule ends with them")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--no-eval", action="store_true", help="skip the held-out evaluation")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=1,
                    help="CPU threads (1: more only pays on an idle machine)")
    ap.add_argument("--init-from", metavar="FILE.gguf",
                    help="start from this trained model's shape, weights and tokenizer")
    ap.add_argument("--vocab-from", metavar="FILE.gguf",
                    help="this model's tokenizer (a draft model for it) instead of a new one")
    ap.add_argument("--train-only", choices=["mtp"],
                    help="train only the MTP layer (needs --init-from and --mtp)")
    a = ap.parse_args()
    if a.train_only and not (a.init_from and a.mtp):
        ap.error("--train-only mtp needs --init-from and --mtp")
    os.makedirs(a.out, exist_ok=True)
    if a.threads:
        torch.set_num_threads(a.threads)
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    t0 = time.time()

    train = data.train_examples(a.n_train, a.seed)
    init = None
    if a.init_from:
        import gguf_read
        import torch_answers
        meta, ts = gguf_read.read(a.init_from)
        init = (torch_answers.config_of(meta, ts), ts)
        tok = torch_answers.tokenizer_of(meta)
    elif a.vocab_from:
        import gguf_read
        import torch_answers
        tok = torch_answers.tokenizer_of(gguf_read.read(a.vocab_from)[0])
    else:
        tok = bpe.train([e["prompt"] + e["completion"] for e in train[:20000]], a.vocab)
    tok_path = os.path.join(a.out, "tokenizer.json")
    tok.save(tok_path)
    enc = encode_all(tok, train)
    pad = tok.special("<|endoftext|>")
    print(f"data: {len(train)} examples, vocab {len(tok)}, longest {max(len(e[0]) for e in enc)}"
          f" tokens, {time.time() - t0:.1f} s", flush=True)

    base = init[0] if init else PRESETS[a.preset]
    cfg = dataclasses.replace(base, n_vocab=len(tok), mtp=a.mtp)
    model = Qwen35Moe(cfg)
    model.init_weights(a.seed)
    mtp_prefix = f"blk__{cfg.n_layer}__"
    if init:
        with torch.no_grad():
            for name, p in model.named_gguf():
                if name in init[1]:
                    p.copy_(torch.from_numpy(init[1][name]).reshape(p.shape))
                elif not name.startswith(f"blk.{cfg.n_layer}."):
                    sys.exit(f"train: {a.init_from} has no tensor {name}")
    if a.train_only:
        for n, p in model.w.items():
            p.requires_grad_(n.startswith(mtp_prefix))
    model.to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    n_train_p = sum(p.numel() for p in model.parameters() if p.requires_grad)
    print(f"model: {a.init_from or a.preset}, {n_params / 1e6:.2f} M parameters "
          f"({n_train_p / 1e6:.2f} M trained), device {dev}", flush=True)

    trained = {n: p for n, p in model.w.items() if p.requires_grad}
    decay = [p for n, p in trained.items() if p.dim() >= 2 and "conv1d" not in n]
    no_decay = [p for n, p in trained.items() if not (p.dim() >= 2 and "conv1d" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)

    def progress(s):
        """Fraction of the run done: by steps, or by time when a budget is given and it is
        the tighter bound, so the cosine reaches its floor when the budget ends."""
        f = (s - a.warmup) / max(1, a.steps - a.warmup)
        if a.time_budget and s > 0:
            f = max(f, (time.time() - t_train) / a.time_budget)
        return min(max(f, 0.0), 1.0)

    def lr_at(s):
        if s < a.warmup:
            return a.lr * (s + 1) / a.warmup
        return a.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress(s))))

    hidden = None
    if a.train_only:
        # the frozen trunk's hidden states of every training example, once: a step then costs
        # only the MTP layer (the trunk's loss is logged as 0)
        t_h = time.time()
        hidden = [None] * len(enc)
        order = sorted(range(len(enc)), key=lambda i: len(enc[i][0]))
        with torch.no_grad():
            for b0 in range(0, len(order), 64):
                idx = order[b0:b0 + 64]
                x, _ = batch_of(enc, idx, pad, dev)
                h = model.trunk(x)
                for r, i in enumerate(idx):
                    hidden[i] = h[r, :len(enc[i][0])].clone()
        print(f"trunk hidden states of {len(enc)} examples: {time.time() - t_h:.0f} s", flush=True)

    log = []
    logf = open(os.path.join(a.out, "log.jsonl"), "w")
    rng = random.Random(a.seed + 1)
    model.train()
    t_train = time.time()
    step = 0
    lr = a.lr
    for step in range(a.steps):
        lr = lr_at(step)
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = [rng.randrange(len(enc)) for _ in range(a.batch)]
        x, y = batch_of(enc, idx, pad, dev)
        with autocast(dev):
            if hidden is not None:
                h = torch.zeros(x.shape[0], x.shape[1], cfg.n_embd, device=dev)
                for r, i in enumerate(idx):
                    h[r, :hidden[i].shape[0]] = hidden[i]
                model.aux_loss = torch.zeros((), device=dev)
                mlogits = model.mtp_forward(h[:, :-1], x[:, 1:])
                loss = torch.zeros((), device=dev)
            elif a.mtp:
                logits, mlogits = model(x, mtp=True)
            else:
                logits = model(x)
        if hidden is None:
            loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1),
                                   ignore_index=-100)
        total = loss + a.aux * model.aux_loss
        if a.mtp:
            # row t of the MTP layer predicts the token after t + 1: y shifted by one
            y2 = y[:, 1:]
            mloss = F.cross_entropy(mlogits.float().reshape(-1, mlogits.shape[-1]),
                                    y2.reshape(-1), ignore_index=-100)
            total = total + a.mtp_weight * mloss
        opt.zero_grad(set_to_none=True)
        total.backward()
        gn = torch.nn.utils.clip_grad_norm_(list(trained.values()), 1.0)
        opt.step()
        if step % a.log_every == 0 or step == a.steps - 1:
            r = {"step": step, "loss": loss.item(), "aux": model.aux_loss.item(),
                 "lr": lr, "grad_norm": gn.item(), "time_s": time.time() - t_train}
            if a.mtp:
                with torch.no_grad():
                    m = y2 != -100
                    r["mtp_loss"] = mloss.item()
                    # how often the layer's first choice is the token after next: its
                    # acceptance as a one-token drafter on the training batch
                    r["mtp_top1"] = ((mlogits.argmax(-1) == y2) & m).sum().item() / max(
                        1, m.sum().item())
            log.append(r)
            logf.write(json.dumps(r) + "\n")
            logf.flush()
            if step % (a.log_every * 10) == 0 or step == a.steps - 1:
                print(f"step {step}: loss {r['loss']:.4f} lr {r['lr']:.2e} "
                      f"{r['time_s']:.0f} s" + (f" mtp loss {r['mtp_loss']:.4f} top-1 "
                                                 f"{r['mtp_top1']:.3f}" if a.mtp else ""),
                      flush=True)
        if a.time_budget and step >= a.warmup and progress(step) >= 1.0:
            print(f"time budget reached at step {step}", flush=True)
            break
    train_s = time.time() - t_train
    logf.close()

    model.eval()
    ck = {"config": config_dict(cfg), "model": {k: v.detach().float().cpu()
                                                 for k, v in model.state_dict().items()},
          "seed": a.seed, "steps_done": step + 1, "argv": sys.argv}
    torch.save(ck, os.path.join(a.out, "ckpt.pt"))
    plotter = plot(log, os.path.join(a.out, "loss.png"), "mtp_loss" if a.train_only else "loss")

    if a.no_eval:
        print(f"trained {step + 1} steps in {train_s:.0f} s (no evaluation)", flush=True)
        return
    t_eval = time.time()
    held = data.heldout_examples(a.heldout, a.seed)
    routing = []
    acc, outs = accuracy(model, tok, held, dev, routing_log=routing)
    mul_acc, _ = accuracy(model, tok, data.mul2x2_heldout(a.heldout, a.seed), dev)
    acc.update(mul_acc)
    with open(os.path.join(a.out, "heldout_torch.jsonl"), "w") as f:
        for e, o in zip(held, outs):
            f.write(json.dumps({"key": e["key"], "family": e["family"], "prompt": e["prompt"],
                                "answer": e["answer"], "torch_completion": o}) + "\n")
    metrics = {
        "preset": a.preset, "config": config_dict(cfg), "params": n_params,
        "init_from": os.path.basename(a.init_from) if a.init_from else None,
        "train_only": a.train_only, "params_trained": n_train_p,
        "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        "torch": torch.__version__, "steps": step + 1, "batch": a.batch, "lr": a.lr,
        "seed": a.seed, "train_seconds": round(train_s, 1),
        "eval_seconds": round(time.time() - t_eval, 1),
        "final_loss": log[-1]["loss"] if log else None, "loss_plot": plotter,
        "final_mtp_loss": log[-1].get("mtp_loss") if log else None,
        "final_mtp_top1": log[-1].get("mtp_top1") if log else None,
        "heldout_accuracy": acc,
        "experts": lru_hit_rates(routing, cfg.n_layer, cfg.n_expert),
    }
    with open(os.path.join(a.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    print(f"trained {step + 1} steps in {train_s:.0f} s; held-out accuracy:", flush=True)
    for k, v in sorted(acc.items()):
        print(f"  {k:8s} {v['correct']:4d}/{v['total']:4d} = {100 * v['accuracy']:.1f}%")


if __name__ == "__main__":
    main()
