/* The MTP (multi-token prediction, "nextn") layer of Qwen3.5 / Qwen3-Next, as their reference
 * implementations run it (transformers' and vLLM's MTP modules, llama.cpp's qwen35moe MTP graph):
 *
 *   e  = rmsnorm(embed(x_{t+1})) * enorm      the next token's embedding   [n, n_embd]
 *   h  = rmsnorm(h_t) * hnorm                 the hidden state at t        [n, n_embd]
 *   u  = eh_proj [e, h]                       (concatenated: embedding first) [n, n_embd]
 *   u += attention(rmsnorm(u) * attn_norm)    a full-attention block of the architecture,
 *   u += ffn_or_moe(rmsnorm(u) * ffn_norm)    with a KV cache of its own
 *   g  = rmsnorm(u) * shared_head_norm        the layer's hidden state, read by the next draft
 *   x_{t+2} = argmax(output g)                (or drawn from softmax(output g) when sampling)
 *
 * h_t is the target's last hidden state after its output norm (what its head reads). The MTP
 * row of position t sits at position t: tokens shift by one, hidden states and positions do
 * not. */
#include <string.h>

#include "daemon/engine/forward.h"

void sil_forward_mtp(struct sil_fwd *f, const struct sil_ubatch *ub, const float *h_in,
                     float *logits, int32_t *argmax, float *h_out)
{
    const struct sil_model *m = f->model;
    const float eps = m->hp.rms_eps;
    const int64_t E = m->hp.n_embd;
    const int il = m->hp.n_layer; /* the MTP block follows the trunk */
    const struct sil_layer_weights *w = &f->lw[il];
    const int32_t n = ub->n;
    struct sil_act x = sil_act_rows(f->x, 0, n);     /* [n, n_embd] */
    struct sil_act cur = sil_act_rows(f->cur, 0, n); /* [n, n_embd] */
    struct sil_act out = sil_act_rows(f->out, 0, n); /* [n, n_embd] */
    struct sil_act cat = sil_act_rows(f->mtp_cat, 0, n); /* [n, 2 n_embd] */
    struct sil_act e_half = {cat.data, n, E, cat.ld};
    struct sil_act h_half = {(float *)cat.data + E, n, E, cat.ld};

    /* the trunk's expert cache, host tier, observers and a route chooser know n_layer layers: the MTP
     * block reads its experts in place and is seen by none of them */
    struct sil_expert_obs *obs = f->obs;
    struct sil_ecache *ecache = f->ecache;
    struct sil_xstore *xstore = f->xstore;
    const struct sil_engine_observer *chooser = f->chooser;
    const int n_observer = f->n_observer;
    struct sil_kv_cache *kv = f->kv;
    f->obs = NULL;
    f->ecache = NULL;
    f->xstore = NULL;
    f->chooser = NULL;
    f->n_observer = 0;
    f->kv = f->mtp_kv;

    if (f->be->ops->begin) SIL_OP(f, begin, ub);
    SIL_OP(f, get_rows, &f->mtp_embd, ub->token, x);
    SIL_OP(f, rmsnorm, e_half, x, &f->mtp_enorm, eps);
    for (int32_t i = 0; i < n; i++)
        memcpy((float *)out.data + i * out.ld, h_in + i * E, sizeof(float) * (size_t)E);
    SIL_OP(f, rmsnorm, h_half, out, &f->mtp_hnorm, eps);
    SIL_MATMUL(f, cat, {&f->mtp_eh_proj, x});

    SIL_OP(f, rmsnorm, cur, x, &w->attn_norm, eps);
    sil_fwd_attention(f, ub, il, cur, out);
    const struct sil_fwd_norm ffn_in = {x, out, &w->ffn_norm, eps};
    sil_fwd_ffn_add_norm(f, ub, il, &ffn_in, x, cur, out, &f->mtp_head_norm);
    for (int32_t i = 0; i < n; i++) {
        memcpy(h_out + i * E, (const float *)cur.data + i * cur.ld, sizeof(float) * (size_t)E);
        f->keep_out[i] = i;
    }
    SIL_OP(f, head, cur, &f->mtp_head, f->keep_out, logits, argmax);

    f->obs = obs;
    f->ecache = ecache;
    f->xstore = xstore;
    f->chooser = chooser;
    f->n_observer = n_observer;
    f->kv = kv;
}
