/* Full (softmax) attention: qwen3 / qwen3moe, and Qwen3.5's gated variant.
 *
 *   q = Wq x   [n_head, hd]  (Qwen3.5: [n_head, 2*hd] = per head q then its output gate)
 *   k = Wk x, v = Wv x       [n_head_kv, hd]
 *   q, k = rmsnorm per head (q_norm, k_norm), then NeoX rope on the first n_rot dims
 *   o_h = softmax(q_h . K_kvh^T / sqrt(hd)) V_kvh over positions 0..pos of the row's sequence,
 *         kvh = h / (n_head / n_head_kv)
 *   Qwen3.5: o *= sigmoid(gate)
 *   out = Wo o
 * For text tokens Qwen3.5's multi-section rope has the same position in every section, which
 * is exactly NeoX rope on n_rot dims. */
#include "daemon/engine/forward.h"

/* Block-local activations of n rows. */
struct attn_acts {
    struct sil_act q; /* [n, n_head * hd]; Qwen3.5: [n, n_head * 2 * hd], per head q then gate */
    struct sil_act k; /* [n, n_head_kv * hd] */
    struct sil_act v; /* [n, n_head_kv * hd] */
    struct sil_act o; /* [n, n_head * hd] */
};

static void attn_acts(const struct sil_fwd *f, struct sil_fwd_arena *ar, int64_t n,
                      struct attn_acts *t)
{
    const struct sil_hparams *hp = &f->model->hp;
    const int64_t hd = hp->n_embd_head_k;
    t->q = sil_fwd_take(ar, n, hp->n_head * hd * (f->model->traits->gated_attn ? 2 : 1));
    t->k = sil_fwd_take(ar, n, hp->n_head_kv * hd);
    t->v = sil_fwd_take(ar, n, hp->n_head_kv * hd);
    t->o = sil_fwd_take(ar, n, hp->n_head * hd);
}

size_t sil_fwd_attention_scratch(const struct sil_fwd *f)
{
    struct sil_fwd_arena ar = {0};
    struct attn_acts t;
    attn_acts(f, &ar, f->ub_max, &t);
    return ar.used;
}

void sil_fwd_attention(struct sil_fwd *f, const struct sil_ubatch *ub, int il, struct sil_act cur,
                       struct sil_act out)
{
    const struct sil_hparams *hp = &f->model->hp;
    const struct sil_layer_weights *w = &f->lw[il];
    struct sil_fwd_arena ar = sil_fwd_scratch(f);
    struct attn_acts t;
    attn_acts(f, &ar, ub->n, &t);

    SIL_MATMUL(f, cur, {&w->wq, t.q}, {&w->wk, t.k}, {&w->wv, t.v});
    const struct sil_attn_args a = {
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->n_embd_head_k,
        .n_rot = hp->n_rot,
        .rope_freq_base = hp->rope_freq_base,
        .eps = hp->rms_eps,
        .gated = f->model->traits->gated_attn,
        .q_norm = &w->q_norm,
        .k_norm = &w->k_norm,
        .kv = f->kv,
        .layer = f->model->layers[il].attn_index,
        .q = t.q,
        .k = t.k,
        .v = t.v,
        .o = t.o,
    };
    SIL_OP(f, attention, ub, &a);
    SIL_MATMUL(f, t.o, {&w->wo, out});
}
