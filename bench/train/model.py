"""qwen35moe in plain PyTorch, computed the way the siliceo engine computes it.

Per layer il (recurrent unless (il + 1) % full_attn_interval == 0):
  x += mixer(rmsnorm(x) * attn_norm)                 gated delta net, or gated full attention
  x += moe(rmsnorm(x) * post_attention_norm)
logits = output(rmsnorm(x) * output_norm)            output tied to token_embd or not

Norm weights are used as stored (y = x / rms(x) * w), as the GGUF stores them (converters fold
Qwen3.5's 1 + w into the file); they start at 1. Parameter names are the GGUF tensor names with
'.' -> '__', and every parameter has the GGUF layout (ne[0] is the last torch dimension), so
export is a plain dump.

Gated delta net (value head h reads key head h % n_k_heads):
  qkv = silu(causal depthwise conv1d(Wqkv x)); q, k l2-normalized, q / sqrt(dk)
  decay = exp(ssm_a * softplus(Walpha x + dt_bias)); beta = sigmoid(Wbeta x)
  S = decay S + beta (v - decay S k) k^T;  o = S q;  out = Wout (rmsnorm(o) * ssm_norm * silu(z))
Attention: Wq gives per head q then its gate; q, k rmsnorm'd per head (q_norm, k_norm), NeoX rope
on the first n_rot dims; softmax(q k / sqrt(hd)) v over the causal past, o *= sigmoid(gate).
MoE: p = softmax(router x); top-k, weights p / sum(p_top); experts silu(g x) * (u x) -> down;
plus sigmoid(w_sh . x) * shared_expert(x).
"""

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    n_vocab: int = 512
    n_layer: int = 8
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    rope_partial: float = 0.25
    rope_base: float = 1e7
    n_expert: int = 8
    n_expert_used: int = 2
    n_ff_exp: int = 64
    n_ff_shexp: int = 128
    ssm_n_group: int = 2       # delta-net key heads
    ssm_dt_rank: int = 4       # delta-net value heads
    ssm_d_state: int = 64      # delta-net head dim (keys and values)
    ssm_d_conv: int = 4
    full_attn_interval: int = 4
    rms_eps: float = 1e-6
    tied: bool = False
    n_ctx_train: int = 4096
    mtp: bool = False          # one MTP (next-token prediction) layer after the blocks

    @property
    def n_rot(self):
        return int(round(self.rope_partial * self.head_dim))

    def recurrent(self, il):
        return (il + 1) % self.full_attn_interval != 0

    def mkmodel_flags(self):
        """sil-mkmodel flags that make exactly this shape."""
        return ["--arch", "qwen35moe", "--layers", str(self.n_layer), "--embd", str(self.n_embd),
                "--heads", str(self.n_head), "--kv-heads", str(self.n_head_kv),
                "--head-dim", str(self.head_dim), "--experts", str(self.n_expert),
                "--experts-used", str(self.n_expert_used), "--expert-ffn", str(self.n_ff_exp),
                "--shared-ffn", str(self.n_ff_shexp), "--dn-key-heads", str(self.ssm_n_group),
                "--dn-value-heads", str(self.ssm_dt_rank), "--dn-head-dim", str(self.ssm_d_state),
                "--dn-conv", str(self.ssm_d_conv),
                "--full-attn-interval", str(self.full_attn_interval),
                "--rope-base", repr(self.rope_base), "--rope-partial", repr(self.rope_partial),
                "--ctx", str(self.n_ctx_train), "--tied" if self.tied else "--untied"] + (
                    ["--mtp"] if self.mtp else [])


PRESETS = {
    # ~6.3 M parameters, Q8_0 file ~7 MB: the shipped model
    "demo": Config(),
    # for CPU smoke runs and the parity test: seconds per hundred steps
    "tiny": Config(n_layer=4, n_embd=64, n_head=4, n_head_kv=2, head_dim=16, rope_partial=0.5,
                   n_expert=4, n_expert_used=2, n_ff_exp=32, n_ff_shexp=64, ssm_n_group=2,
                   ssm_dt_rank=4, ssm_d_state=16),
    # a draft model for the demo model (speculative decoding): a quarter of its layers, half
    # its width, the same tokenizer when trained with the same --vocab and --seed
    "draft": Config(n_layer=2, n_embd=128, n_head=4, n_head_kv=2, head_dim=32, n_expert=4,
                    n_expert_used=2, n_ff_exp=64, n_ff_shexp=128, ssm_n_group=2, ssm_dt_rank=4,
                    ssm_d_state=32, full_attn_interval=2),
}


def rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(n_rot, base, n_pos, device):
    """cos/sin [n_pos, n_rot/2] with the engine's float32 frequencies: theta_i = pos * s^i,
    s = base^(-2/n_rot), the powers formed by repeated float32 multiplication."""
    half = n_rot // 2
    s = torch.tensor(base, dtype=torch.float32) ** torch.tensor(-2.0 / n_rot, dtype=torch.float32)
    pos = torch.arange(n_pos, dtype=torch.float32)
    cols = [pos]
    for _ in range(1, half):
        cols.append(cols[-1] * s)
    theta = torch.stack(cols, -1).double()
    return torch.cos(theta).float().to(device), torch.sin(theta).float().to(device)


def rope_neox(x, cos, sin, n_rot):
    """x [B, T, H, hd]; rotates pairs (i, i + n_rot/2) of the first n_rot dims."""
    half = n_rot // 2
    a, b, rest = x[..., :half], x[..., half:n_rot], x[..., n_rot:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([a * c - b * s, a * s + b * c, rest], -1)


class Qwen35Moe(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        c = cfg
        E, hd = c.n_embd, c.head_dim
        key_dim, value_dim = c.ssm_d_state * c.ssm_n_group, c.ssm_d_state * c.ssm_dt_rank
        self.shapes = {"token_embd.weight": (c.n_vocab, E), "output_norm.weight": (E,)}
        if not c.tied:
            self.shapes["output.weight"] = (c.n_vocab, E)
        # the MTP layer is block n_layer: its stem and head norm, then a full-attention block
        for il in range(c.n_layer + (1 if c.mtp else 0)):
            p = f"blk.{il}."
            s = {"attn_norm.weight": (E,), "post_attention_norm.weight": (E,)}
            if il == c.n_layer:
                s.update({"nextn.eh_proj.weight": (E, 2 * E), "nextn.enorm.weight": (E,),
                          "nextn.hnorm.weight": (E,), "nextn.shared_head_norm.weight": (E,)})
            if il < c.n_layer and c.recurrent(il):
                s.update({"attn_qkv.weight": (2 * key_dim + value_dim, E),
                          "attn_gate.weight": (value_dim, E),
                          "ssm_conv1d.weight": (2 * key_dim + value_dim, c.ssm_d_conv),
                          "ssm_dt.bias": (c.ssm_dt_rank,), "ssm_a": (c.ssm_dt_rank,),
                          "ssm_beta.weight": (c.ssm_dt_rank, E),
                          "ssm_alpha.weight": (c.ssm_dt_rank, E),
                          "ssm_norm.weight": (c.ssm_d_state,), "ssm_out.weight": (E, value_dim)})
            else:
                s.update({"attn_q.weight": (2 * hd * c.n_head, E),
                          "attn_k.weight": (hd * c.n_head_kv, E),
                          "attn_v.weight": (hd * c.n_head_kv, E),
                          "attn_output.weight": (E, hd * c.n_head),
                          "attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)})
            s.update({"ffn_gate_inp.weight": (c.n_expert, E),
                      "ffn_gate_exps.weight": (c.n_expert, c.n_ff_exp, E),
                      "ffn_up_exps.weight": (c.n_expert, c.n_ff_exp, E),
                      "ffn_down_exps.weight": (c.n_expert, E, c.n_ff_exp),
                      "ffn_gate_inp_shexp.weight": (1, E),
                      "ffn_gate_shexp.weight": (c.n_ff_shexp, E),
                      "ffn_up_shexp.weight": (c.n_ff_shexp, E),
                      "ffn_down_shexp.weight": (E, c.n_ff_shexp)})
            for k, v in s.items():
                self.shapes[p + k] = v
        self.w = nn.ParameterDict({k.replace(".", "__"): nn.Parameter(torch.empty(v))
                                   for k, v in self.shapes.items()})
        self.rope = None
        self.chunked = True  # delta_rule_chunked (same math as delta_rule, far fewer steps)
        self.aux_loss = torch.zeros(())

    def p(self, name):
        return self.w[name.replace(".", "__")]

    def named_gguf(self):
        return [(k, self.p(k)) for k in self.shapes]

    @torch.no_grad()
    def init_weights(self, seed):
        g = torch.Generator().manual_seed(seed)
        c = self.cfg
        for name, t in self.named_gguf():
            cls = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
            if name.endswith("norm.weight"):
                t.fill_(1.0)
            elif name.endswith("ssm_a"):
                # -exp(A_log), A_log = log U(1, 16) as Qwen3-Next initializes it
                t.copy_(-(1 + 15 * torch.rand(t.shape, generator=g)))
            elif name.endswith("ssm_dt.bias"):
                # softplus^-1 of dt ~ logU(1e-3, 1e-1)
                dt = torch.exp(torch.rand(t.shape, generator=g) * (math.log(0.1) - math.log(1e-3))
                               + math.log(1e-3))
                t.copy_(dt + torch.log(-torch.expm1(-dt)))
            elif cls == "ssm_conv1d":
                t.copy_(torch.randn(t.shape, generator=g) / math.sqrt(c.ssm_d_conv))
            elif cls == "token_embd":
                t.copy_(torch.randn(t.shape, generator=g) * 0.02 * math.sqrt(c.n_embd) /
                        (4 if not c.tied else 1))
            else:
                fan_in = t.shape[-1]
                std = 1.0 / math.sqrt(fan_in)
                if cls in ("attn_output", "ssm_out", "ffn_down_exps", "ffn_down_shexp"):
                    std /= math.sqrt(2 * c.n_layer)
                t.copy_(torch.randn(t.shape, generator=g) * std)

    # ---- blocks -------------------------------------------------------------------------------

    def attention(self, il, x):
        c = self.cfg
        B, T, _ = x.shape
        hd, H, Hk = c.head_dim, c.n_head, c.n_head_kv
        p = f"blk.{il}."
        qg = F.linear(x, self.p(p + "attn_q.weight")).view(B, T, H, 2 * hd)
        q, gate = qg[..., :hd], qg[..., hd:]
        k = F.linear(x, self.p(p + "attn_k.weight")).view(B, T, Hk, hd)
        v = F.linear(x, self.p(p + "attn_v.weight")).view(B, T, Hk, hd)
        q = rmsnorm(q, self.p(p + "attn_q_norm.weight"), c.rms_eps)
        k = rmsnorm(k, self.p(p + "attn_k_norm.weight"), c.rms_eps)
        if self.rope is None or self.rope[0].shape[0] < T or self.rope[0].device != x.device:
            self.rope = rope_tables(c.n_rot, c.rope_base, max(T, 256), x.device)
        cos, sin = self.rope[0][:T].to(q.dtype), self.rope[1][:T].to(q.dtype)
        q, k = rope_neox(q, cos, sin, c.n_rot), rope_neox(k, cos, sin, c.n_rot)
        rep = H // Hk
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        att = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(hd)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        o = torch.einsum("bhts,bshd->bthd", att, v)
        o = o * torch.sigmoid(gate)
        return F.linear(o.reshape(B, T, H * hd), self.p(p + "attn_output.weight"))

    def delta_net(self, il, x):
        c = self.cfg
        B, T, _ = x.shape
        p = f"blk.{il}."
        nk, nv, d = c.ssm_n_group, c.ssm_dt_rank, c.ssm_d_state
        qkv = F.linear(x, self.p(p + "attn_qkv.weight"))               # [B, T, conv_dim]
        z = F.linear(x, self.p(p + "attn_gate.weight")).view(B, T, nv, d)
        alpha = F.linear(x, self.p(p + "ssm_alpha.weight"))            # [B, T, nv]
        beta = torch.sigmoid(F.linear(x, self.p(p + "ssm_beta.weight")))
        w = self.p(p + "ssm_conv1d.weight")                             # [conv_dim, K]
        K = c.ssm_d_conv
        xc = F.pad(qkv.transpose(1, 2), (K - 1, 0))
        conv = F.silu(F.conv1d(xc, w.unsqueeze(1).to(xc.dtype), groups=w.shape[0]))
        conv = conv.transpose(1, 2)                                     # [B, T, conv_dim]
        q = conv[..., :nk * d].reshape(B, T, nk, d)
        k = conv[..., nk * d:2 * nk * d].reshape(B, T, nk, d)
        v = conv[..., 2 * nk * d:].reshape(B, T, nv, d)
        q = q / q.norm(dim=-1, keepdim=True).clamp_min(c.rms_eps) / math.sqrt(d)
        k = k / k.norm(dim=-1, keepdim=True).clamp_min(c.rms_eps)
        idx = torch.arange(nv, device=x.device) % nk
        q, k = q[:, :, idx], k[:, :, idx]                               # [B, T, nv, d]
        g = self.p(p + "ssm_a") * F.softplus(alpha + self.p(p + "ssm_dt.bias"))
        rule = delta_rule_chunked if self.chunked else delta_rule
        with torch.autocast(device_type=x.device.type, enabled=False):  # the state in float32
            o = rule(q.float(), k.float(), v.float(), g.float(), beta.float()).to(x.dtype)
        o = rmsnorm(o, self.p(p + "ssm_norm.weight"), c.rms_eps) * F.silu(z)
        return F.linear(o.reshape(B, T, nv * d), self.p(p + "ssm_out.weight"))

    def moe(self, il, x):
        c = self.cfg
        p = f"blk.{il}."
        logits = F.linear(x, self.p(p + "ffn_gate_inp.weight"))        # [B, T, X]
        probs = logits.float().softmax(-1)
        top_p, top_i = probs.topk(c.n_expert_used, dim=-1)
        top_w = top_p / top_p.sum(-1, keepdim=True).clamp_min(6.103515625e-5)
        dense_w = torch.zeros_like(probs).scatter(-1, top_i, top_w).to(x.dtype)
        g = torch.einsum("bte,xfe->btxf", x, self.p(p + "ffn_gate_exps.weight"))
        u = torch.einsum("bte,xfe->btxf", x, self.p(p + "ffn_up_exps.weight"))
        h = F.silu(g) * u * dense_w[..., None]
        out = torch.einsum("btxf,xef->bte", h, self.p(p + "ffn_down_exps.weight"))
        sh = F.linear(F.silu(F.linear(x, self.p(p + "ffn_gate_shexp.weight"))) *
                      F.linear(x, self.p(p + "ffn_up_shexp.weight")),
                      self.p(p + "ffn_down_shexp.weight"))
        sh = sh * torch.sigmoid(F.linear(x, self.p(p + "ffn_gate_inp_shexp.weight")))
        if self.training:
            # Switch-style balance: fraction routed to e times its mean probability
            frac = F.one_hot(top_i, c.n_expert).float().sum(-2).mean((0, 1)) / c.n_expert_used
            self.aux_loss = self.aux_loss + c.n_expert * (frac * probs.mean((0, 1))).sum()
        self.last_routing = top_i
        return out + sh

    def head(self):
        c = self.cfg
        return self.p("token_embd.weight") if c.tied else self.p("output.weight")

    def forward(self, tokens, routing=None, mtp=False):
        """tokens [B, T] -> logits [B, T, n_vocab]; routing: a list that gets each layer's
        top-k expert ids [B, T, k]. mtp (a model with the MTP layer): also the MTP layer's
        logits [B, T - 1, n_vocab], row t predicting token t + 2 from the hidden state at t and
        token t + 1 (forward_mtp), returned as (logits, mtp_logits)."""
        x = self.trunk(tokens, routing)
        logits = F.linear(x, self.head())
        if not mtp:
            return logits
        return logits, self.mtp_forward(x[:, :-1], tokens[:, 1:])

    def trunk(self, tokens, routing=None):
        """tokens [B, T] -> the trunk's hidden states after the output norm [B, T, E], what the
        head and the MTP layer read."""
        c = self.cfg
        self.aux_loss = torch.zeros((), device=tokens.device)
        x = F.embedding(tokens, self.p("token_embd.weight"))
        for il in range(c.n_layer):
            h = rmsnorm(x, self.p(f"blk.{il}.attn_norm.weight"), c.rms_eps)
            x = x + (self.delta_net(il, h) if c.recurrent(il) else self.attention(il, h))
            h = rmsnorm(x, self.p(f"blk.{il}.post_attention_norm.weight"), c.rms_eps)
            x = x + self.moe(il, h)
            if routing is not None:
                routing.append(self.last_routing)
        return rmsnorm(x, self.p("output_norm.weight"), c.rms_eps)

    def mtp_forward(self, hidden, nxt):
        """The MTP layer (forward_mtp.c): hidden [B, T, E], the trunk's state after its output
        norm at t, and nxt [B, T], the token after t -> logits of the token after that. Its
        attention runs over these T rows in their own positions 0..T-1."""
        c = self.cfg
        il = c.n_layer
        p = f"blk.{il}."
        e = rmsnorm(F.embedding(nxt, self.p("token_embd.weight")), self.p(p + "nextn.enorm.weight"),
                    c.rms_eps)
        h = rmsnorm(hidden, self.p(p + "nextn.hnorm.weight"), c.rms_eps)
        u = F.linear(torch.cat([e, h], -1), self.p(p + "nextn.eh_proj.weight"))
        u = u + self.attention(il, rmsnorm(u, self.p(p + "attn_norm.weight"), c.rms_eps))
        u = u + self.moe(il, rmsnorm(u, self.p(p + "post_attention_norm.weight"), c.rms_eps))
        g = rmsnorm(u, self.p(p + "nextn.shared_head_norm.weight"), c.rms_eps)
        return F.linear(g, self.head())


def delta_rule(q, k, v, g, beta):
    """Sequential gated delta rule, float32. q, k, v [B, T, H, d]; g, beta [B, T, H].
    S [B, H, dv, dk]; per step: S = e^g S; S += beta (v - S k) k^T; o = S q."""
    B, T, H, d = q.shape
    S = q.new_zeros(B, H, v.shape[-1], d)
    outs = []
    for t in range(T):
        decay = torch.exp(g[:, t])[..., None, None]
        kt, qt = k[:, t], q[:, t]
        S = decay * S
        sk = torch.einsum("bhvk,bhk->bhv", S, kt)
        dlt = beta[:, t][..., None] * (v[:, t] - sk)
        S = S + dlt[..., :, None] * kt[..., None, :]
        outs.append(torch.einsum("bhvk,bhk->bhv", S, qt))
    return torch.stack(outs, 1)


def delta_rule_chunked(q, k, v, g, beta, chunk=32):
    """delta_rule in chunks (the WY form of the delta rule): the same outputs up to rounding,
    with a Python loop over T / chunk chunks instead of T steps. Within a chunk, with
    G_i = cumulative g and D_ij = exp(G_i - G_j) for j <= i:
      U = (I + tril(beta_i k_i.k_j D_ij, -1))^-1 beta (v - exp(G) S0 k)   the new values
      o = exp(G) S0 q + tril(q_i.k_j D_ij) U
      S = exp(G_last) S0 + sum_j exp(G_last - G_j) U_j k_j^T"""
    B, T, H, d = q.shape
    dv = v.shape[-1]
    pad = (-T) % chunk
    tr = lambda x: F.pad(x.transpose(1, 2), (0, 0, 0, pad))  # noqa: E731  [B, H, T', d]
    q, k, v = tr(q), tr(k), tr(v)
    g = F.pad(g.transpose(1, 2), (0, pad))                     # [B, H, T']
    beta = F.pad(beta.transpose(1, 2), (0, pad))
    n = q.shape[2] // chunk
    q, k, v = (x.reshape(B, H, n, chunk, -1) for x in (q, k, v))
    g, beta = g.reshape(B, H, n, chunk).cumsum(-1), beta.reshape(B, H, n, chunk)
    diff = g[..., :, None] - g[..., None, :]
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()
    D = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()  # [B,H,n,c,c]
    kk = k @ k.transpose(-1, -2)
    strict = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    L = torch.where(strict, beta[..., :, None] * kk * D, torch.zeros_like(kk))
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    Tm = torch.linalg.solve_triangular(eye + L, eye.expand_as(L), upper=False)
    qk = torch.where(lower, (q @ k.transpose(-1, -2)) * D, torch.zeros_like(kk))
    S = q.new_zeros(B, H, d, dv)                               # k-major: o = q S
    outs = []
    for i in range(n):
        eg = g[:, :, i].exp()[..., None]                       # [B, H, c, 1]
        u = Tm[:, :, i] @ (beta[:, :, i][..., None] * (v[:, :, i] - eg * (k[:, :, i] @ S)))
        outs.append(eg * (q[:, :, i] @ S) + qk[:, :, i] @ u)
        glast = g[:, :, i, -1][..., None, None]
        w = (g[:, :, i, -1][..., None] - g[:, :, i]).exp()[..., None]
        S = glast.exp() * S + (k[:, :, i] * w).transpose(-1, -2) @ u
    o = torch.stack(outs, 2).reshape(B, H, n * chunk, dv)[:, :, :T]
    return o.transpose(1, 2)


def config_dict(cfg):
    return asdict(cfg)
