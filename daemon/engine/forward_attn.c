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
#include <math.h>
#include <string.h>

#include "daemon/engine/forward.h"
#include "kernels/cpu/ops.h"

struct attn_task {
    struct sil_fwd *f;
    const struct sil_ubatch *ub;
    const struct sil_layer *l;
    int layer;        /* attention layer index in the KV cache */
    int64_t q_stride; /* floats from one q head to the next inside a row of f->a */
    int64_t q_row;    /* floats per row of f->a */
};

/* Per row: q/k norm, rope, K and V into the cache. */
static void qk_prep(void *arg, long lo, long hi, int ith)
{
    struct attn_task *t = arg;
    struct sil_fwd *f = t->f;
    const struct sil_hparams *hp = &f->model->hp;
    const int hd = hp->n_embd_head_k, nkv = hp->n_head_kv;
    const float *qn = t->l->q_norm->data, *kn = t->l->k_norm->data;
    (void)ith;
    for (long i = lo; i < hi; i++) {
        const int32_t pos = t->ub->pos[i], seq = t->ub->seq[i];
        float *q = f->a + i * t->q_row;
        for (int h = 0; h < hp->n_head; h++) {
            float *qh = q + h * t->q_stride;
            sil_rmsnorm(qh, qh, qn, hd, hp->rms_eps);
            sil_rope_neox(qh, 1, hd, hp->n_rot, pos, hp->rope_freq_base);
        }
        float *k = f->b + i * (int64_t)nkv * hd;
        for (int h = 0; h < nkv; h++)
            sil_rmsnorm(k + h * hd, k + h * hd, kn, hd, hp->rms_eps);
        sil_rope_neox(k, nkv, hd, hp->n_rot, pos, hp->rope_freq_base);
        memcpy(sil_kv_k(f->kv, t->layer, seq, pos), k, sizeof(float) * (size_t)nkv * hd);
        memcpy(sil_kv_v(f->kv, t->layer, seq, pos), f->c + i * (int64_t)nkv * hd,
               sizeof(float) * (size_t)nkv * hd);
    }
}

/* Per (row, head): softmax attention over the sequence's positions 0..pos. */
static void attend(void *arg, long lo, long hi, int ith)
{
    struct attn_task *t = arg;
    struct sil_fwd *f = t->f;
    const struct sil_hparams *hp = &f->model->hp;
    const int hd = hp->n_embd_head_k, nh = hp->n_head;
    const int group = hp->n_head / hp->n_head_kv;
    const bool gated = f->model->traits->gated_attn;
    const float scale = 1.0f / sqrtf((float)hd);
    float *scores = f->attn_scratch + (int64_t)ith * f->n_ctx;
    const int64_t ks = sil_kv_row_stride_k(f->kv), vs = sil_kv_row_stride_v(f->kv);
    for (long w = lo; w < hi; w++) {
        const long i = w / nh;
        const int h = (int)(w % nh), kvh = h / group;
        const int32_t pos = t->ub->pos[i], seq = t->ub->seq[i];
        const float *q = f->a + i * t->q_row + h * t->q_stride;
        const float *k0 = sil_kv_k(f->kv, t->layer, seq, 0) + kvh * hd;
        const float *v0 = sil_kv_v(f->kv, t->layer, seq, 0) + kvh * hd;
        for (int32_t p = 0; p <= pos; p++)
            scores[p] = sil_dot_f32(q, k0 + p * ks, hd) * scale;
        sil_softmax(scores, pos + 1);
        float *o = f->d + i * (int64_t)nh * hd + h * hd;
        memset(o, 0, sizeof(float) * (size_t)hd);
        for (int32_t p = 0; p <= pos; p++)
            sil_axpy(o, scores[p], v0 + p * vs, hd);
        if (gated) {
            const float *g = q + hd;
            for (int j = 0; j < hd; j++)
                o[j] *= sil_sigmoid(g[j]);
        }
    }
}

void sil_fwd_attention(struct sil_fwd *f, const struct sil_ubatch *ub, int il, struct sil_act cur_,
        struct sil_act out_)
{
    const struct sil_hparams *hp = &f->model->hp;
    const struct sil_layer *l = &f->model->layers[il];
    const int n = ub->n, hd = hp->n_embd_head_k;
    const bool gated = f->model->traits->gated_attn;
    struct attn_task t = {f, ub, l, l->attn_index, gated ? 2 * hd : hd,
                          (int64_t)hp->n_head * hd * (gated ? 2 : 1)};

    struct sil_mm_input in;
    sil_fwd_input(f, &in, 0, ((float *)cur_.data), n, hp->n_embd);
    struct sil_mm_job jobs[3] = {
        {.w = l->wq->data, .wtype = l->wq->type, .m = l->wq->ne[1], .in = &in, .n_rows = n, .y = f->a, .ldy = l->wq->ne[1]},
        {.w = l->wk->data, .wtype = l->wk->type, .m = l->wk->ne[1], .in = &in, .n_rows = n, .y = f->b, .ldy = l->wk->ne[1]},
        {.w = l->wv->data, .wtype = l->wv->type, .m = l->wv->ne[1], .in = &in, .n_rows = n, .y = f->c, .ldy = l->wv->ne[1]},
    };
    sil_fwd_matmul(f, jobs, 3);

    sil_threadpool_for(f->tp, n, 0, qk_prep, &t);
    sil_threadpool_for(f->tp, (long)n * hp->n_head, 0, attend, &t);

    struct sil_mm_input in_o;
    sil_fwd_input(f, &in_o, 1, f->d, n, (int64_t)hp->n_head * hd);
    struct sil_mm_job jo = {.w = l->wo->data, .wtype = l->wo->type, .m = hp->n_embd, .in = &in_o,
                            .n_rows = n, .y = ((float *)out_.data), .ldy = hp->n_embd};
    sil_fwd_matmul(f, &jo, 1);
}
