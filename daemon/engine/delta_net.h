/* Gated delta net: the core of a Qwen3.5 linear-attention layer (everything between the input
 * projections and ssm_out), for the tokens of ONE sequence, in order, updating that sequence's
 * recurrent state in place. Prefill of many tokens and decode of one are the same call.
 *
 * The caller (the forward pass) does, per linear-attention layer and token x = attn_norm(h):
 *   qkv_mixed = attn_qkv  . x      [n_tokens, conv_dim]            (blk.N.attn_qkv.weight)
 *   z         = attn_gate . x      [n_tokens, n_v_heads*head_v_dim] (blk.N.attn_gate.weight)
 *   alpha_raw = ssm_alpha . x      [n_tokens, n_v_heads]            (blk.N.ssm_alpha.weight)
 *   beta_raw  = ssm_beta  . x      [n_tokens, n_v_heads]            (blk.N.ssm_beta.weight)
 * all row-major F32, rows = tokens, no bias, no activation. It passes them here unchanged (the
 * channel order is the GGUF's, nothing to permute) and gets
 *   out [n_tokens, n_v_heads*head_v_dim]   the gated-RMSNorm'd output, ready for
 *   h += ssm_out . out                     (blk.N.ssm_out.weight).
 *
 * What happens here, per token t (shapes per token):
 *   conv_dim channels of qkv_mixed are, in this order:
 *     q [n_k_heads][head_k_dim], k [n_k_heads][head_k_dim], v [n_v_heads][head_v_dim]
 *   c      = silu(causal depthwise conv1d over the last conv_kernel rows of qkv_mixed,
 *                 kernel ssm_conv1d[channel][tap], tap conv_kernel-1 = current token)
 *   q, k   = l2_normalize(c.q[kh]), l2_normalize(c.k[kh])   x / max(|x|, eps)
 *   q     *= 1/sqrt(head_k_dim)
 *   value head h uses key head kh = h % n_k_heads (the GGUF stores the value heads in the
 *   order that makes this true; the HF checkpoint's grouping is different)
 *   g[h]   = ssm_a[h] * softplus(alpha_raw[h] + ssm_dt_bias[h])   (ssm_a = -exp(A_log),
 *                                                                 as the GGUF stores it)
 *   beta[h]= sigmoid(beta_raw[h])
 *   S_h    = exp(g[h]) * S_h                      S_h: [head_v_dim][head_k_dim]
 *   S_h   += beta[h] * (v_h - S_h k) k^T          (delta rule)
 *   o_h    = S_h q
 *   out_h  = rmsnorm(o_h, eps) * ssm_norm * silu(z_h)   (ssm_norm used as stored, no 1+w)
 *
 * Ownership: params points at weights the caller keeps alive (F32; the GGUF stores these four
 * tensors as F32, so they may point into the mmap). State memory belongs to the caller (a slot
 * pool); these functions only read and write it. Nothing here allocates or keeps pointers
 * between calls, so different sequences/layers may run on different threads at once. */
#ifndef SIL_DELTA_NET_H
#define SIL_DELTA_NET_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/error.h"

struct sil_delta_net_params {
    int32_t n_k_heads;   /* {arch}.ssm.group_count (16 for Qwen3.5-35B-A3B) */
    int32_t n_v_heads;   /* {arch}.ssm.time_step_rank (32); multiple of n_k_heads */
    int32_t head_k_dim;  /* {arch}.ssm.state_size (128) */
    int32_t head_v_dim;  /* {arch}.ssm.inner_size / n_v_heads (128) */
    int32_t conv_kernel; /* {arch}.ssm.conv_kernel (4) */
    float eps;           /* {arch}.attention.layer_norm_rms_epsilon: l2 norm and gated RMSNorm */
    const float *conv1d; /* blk.N.ssm_conv1d.weight, [conv_dim][conv_kernel] (GGUF ne = {conv_kernel, conv_dim}) */
    const float *dt_bias; /* blk.N.ssm_dt.bias, [n_v_heads] */
    const float *a;       /* blk.N.ssm_a, [n_v_heads] (negative) */
    const float *norm;    /* blk.N.ssm_norm.weight, [head_v_dim] */
};

/* Per sequence and layer. conv: the last conv_kernel-1 rows of qkv_mixed seen, oldest first
 * ([conv_kernel-1][conv_dim]); ssm: S per value head ([n_v_heads][head_v_dim][head_k_dim]).
 * All zeros = empty sequence. The two arrays may be one allocation (see state_floats). */
struct sil_delta_net_state {
    float *conv;
    float *ssm;
};

/* 0, or -EINVAL with the field named in err (head counts, dims, kernel, eps, NULL weights). */
int sil_delta_net_check(const struct sil_delta_net_params *p, struct sil_error *err);

int64_t sil_delta_net_conv_dim(const struct sil_delta_net_params *p);     /* 2*nk*dk + nv*dv */
int64_t sil_delta_net_conv_floats(const struct sil_delta_net_params *p);  /* (kernel-1)*conv_dim */
int64_t sil_delta_net_ssm_floats(const struct sil_delta_net_params *p);   /* nv*dv*dk */
int64_t sil_delta_net_state_floats(const struct sil_delta_net_params *p); /* conv + ssm */

/* Points st at one buffer of state_floats floats (conv first, then ssm). */
void sil_delta_net_state_bind(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                              float *buf);
/* Empty sequence (all zeros). */
void sil_delta_net_state_reset(const struct sil_delta_net_params *p, struct sil_delta_net_state *st);
/* Snapshot / restore (prefix checkpoints, speculative decoding): copies state_floats floats,
 * conv then ssm, to/from a caller buffer. Restoring a snapshot then running the same tokens
 * gives bit-identical outputs and state. */
void sil_delta_net_state_save(const struct sil_delta_net_params *p,
                              const struct sil_delta_net_state *st, float *dst);
void sil_delta_net_state_load(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                              const float *src);

/* Scratch (floats) that sil_delta_net_forward needs for n_tokens tokens; size it once for the
 * largest batch. Sizes grow linearly with n_tokens. */
int64_t sil_delta_net_scratch_floats(const struct sil_delta_net_params *p, int32_t n_tokens);

/* Runs n_tokens (>= 1) tokens of one sequence in order; updates st in place. Splitting the
 * tokens over several calls (prefill vs decode, any chunking, any thread split in the two-phase
 * form) gives bit-identical outputs and state on the same machine.
 * Inputs as described above (row strides: conv_dim, nv*dv, nv, nv). out may not alias inputs.
 * scratch: sil_delta_net_scratch_floats(p, n_tokens) floats. Single-threaded. */
void sil_delta_net_forward(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                           int32_t n_tokens, const float *qkv_mixed, const float *z,
                           const float *alpha_raw, const float *beta_raw, float *out,
                           float *scratch);

/* The same work in two phases, for spreading one sequence's layer over threads:
 * 1. conv: conv_out[n_tokens][conv_dim] = silu(conv1d(...)) for channels [c0, c1), and the
 *    conv state of those channels advanced. Channel ranges are independent.
 * 2. heads: the delta rule and gated norm for value heads [h0, h1), reading conv_out (all
 *    channels of phase 1 must be done), writing out's columns of those heads and their S.
 *    Head ranges are independent; each thread needs its own head scratch
 *    (sil_delta_net_head_scratch_floats). */
void sil_delta_net_conv(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                        int32_t n_tokens, const float *qkv_mixed, float *conv_out, int64_t c0,
                        int64_t c1);
int64_t sil_delta_net_head_scratch_floats(const struct sil_delta_net_params *p, int32_t n_tokens);
void sil_delta_net_heads(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                         int32_t n_tokens, const float *conv_out, const float *z,
                         const float *alpha_raw, const float *beta_raw, float *out, int32_t h0,
                         int32_t h1, float *scratch);

#endif
