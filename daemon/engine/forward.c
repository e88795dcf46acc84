/* The layer loop shared by all four architectures:
 *
 *   x = token_embd[token]                                    [n, n_embd]
 *   for each layer:
 *     x += attention(rmsnorm(x) * attn_norm)     (or the gated delta net on Qwen3.5's
 *                                                 linear-attention layers)
 *     x += ffn_or_moe(rmsnorm(x) * ffn_norm)     (Qwen3.5 names it post_attention_norm)
 *   logits = output(rmsnorm(x) * output_norm)    only for rows that want logits */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/forward.h"

struct sil_act sil_fwd_take(struct sil_fwd_arena *a, int64_t rows, int64_t width)
{
    const size_t bytes = ((size_t)(rows * width) * sizeof(float) + 63) & ~(size_t)63;
    struct sil_act t = {a->base ? a->base + a->used : NULL, rows, width, width};
    a->used += bytes;
    if (a->base && a->used > a->size)
        abort(); /* a block takes more than its *_scratch said: a programming error */
    return t;
}

static struct sil_weight weight(const struct sil_gguf_tensor *t)
{
    struct sil_weight w = {0};
    if (!t) return w;
    w.type = t->type;
    w.cols = t->ne[0];
    w.rows = t->n_dims >= 2 ? t->ne[1] : 1;
    w.n_mat = t->n_dims >= 3 ? t->ne[2] : 1;
    w.mat_bytes = (size_t)t->nbytes / (size_t)w.n_mat;
    w.loc = SIL_WEIGHT_MMAP;
    w.data = t->data;
    return w;
}

static void bind_layer(struct sil_layer_weights *w, const struct sil_layer *l)
{
    w->attn_norm = weight(l->attn_norm);
    w->ffn_norm = weight(l->ffn_norm);
    w->wq = weight(l->wq);
    w->wk = weight(l->wk);
    w->wv = weight(l->wv);
    w->wo = weight(l->wo);
    w->q_norm = weight(l->q_norm);
    w->k_norm = weight(l->k_norm);
    w->wqkv = weight(l->wqkv);
    w->wgate = weight(l->wgate);
    w->ssm_conv1d = weight(l->ssm_conv1d);
    w->ssm_dt = weight(l->ssm_dt);
    w->ssm_a = weight(l->ssm_a);
    w->ssm_beta = weight(l->ssm_beta);
    w->ssm_alpha = weight(l->ssm_alpha);
    w->ssm_norm = weight(l->ssm_norm);
    w->ssm_out = weight(l->ssm_out);
    w->ffn_gate = weight(l->ffn_gate);
    w->ffn_up = weight(l->ffn_up);
    w->ffn_down = weight(l->ffn_down);
    w->ffn_gate_inp = weight(l->ffn_gate_inp);
    w->ffn_gate_exps = weight(l->ffn_gate_exps);
    w->ffn_up_exps = weight(l->ffn_up_exps);
    w->ffn_down_exps = weight(l->ffn_down_exps);
    w->ffn_gate_inp_shexp = weight(l->ffn_gate_inp_shexp);
    w->ffn_gate_shexp = weight(l->ffn_gate_shexp);
    w->ffn_up_shexp = weight(l->ffn_up_shexp);
    w->ffn_down_shexp = weight(l->ffn_down_shexp);
}

static void *xcalloc(size_t n, size_t sz, bool *fail)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p) *fail = true;
    return p;
}

static size_t max_size(size_t a, size_t b)
{
    return a > b ? a : b;
}

static struct sil_act act(struct sil_fwd *f, int64_t rows, int64_t width, bool *fail)
{
    struct sil_act a = {SIL_OP(f, alloc_act, (size_t)(rows * width) * sizeof(float)), rows, width,
                        width};
    if (!a.data) *fail = true;
    return a;
}

/* Every weight handle the blocks use, for sil_fwd_place_weights. */
static int place_layer(struct sil_fwd *f, struct sil_layer_weights *w, struct sil_error *err)
{
    struct sil_weight *all[] = {
        &w->attn_norm,
        &w->ffn_norm,
        &w->wq,
        &w->wk,
        &w->wv,
        &w->wo,
        &w->q_norm,
        &w->k_norm,
        &w->wqkv,
        &w->wgate,
        &w->ssm_conv1d,
        &w->ssm_dt,
        &w->ssm_a,
        &w->ssm_beta,
        &w->ssm_alpha,
        &w->ssm_norm,
        &w->ssm_out,
        &w->ffn_gate,
        &w->ffn_up,
        &w->ffn_down,
        &w->ffn_gate_inp,
        &w->ffn_gate_exps,
        &w->ffn_up_exps,
        &w->ffn_down_exps,
        &w->ffn_gate_inp_shexp,
        &w->ffn_gate_shexp,
        &w->ffn_up_shexp,
        &w->ffn_down_shexp,
    };
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
        int rc = f->be->ops->place(f->be, all[i], true, err);
        if (rc < 0) return rc;
    }
    return 0;
}

int sil_fwd_place_weights(struct sil_fwd *f, struct sil_error *err)
{
    if (!f->be->ops->place) return 0;
    for (int il = 0; il < f->model->hp.n_layer; il++) {
        int rc = place_layer(f, &f->lw[il], err);
        if (rc < 0) {
            sil_error_prefix(err, "layer %d", il);
            return rc;
        }
    }
    int rc = f->be->ops->place(f->be, &f->output_norm, true, err);
    /* the embedding is read on the host (get_rows); a tied head keeps those pages */
    if (rc == 0) rc = f->be->ops->place(f->be, &f->output, f->output.data != f->tok_embd.data, err);
    if (rc == 0 && f->be->ops->placed) rc = f->be->ops->placed(f->be, err);
    return rc;
}

int sil_fwd_open(struct sil_fwd *f, struct sil_error *err)
{
    const struct sil_model *m = f->model;
    const struct sil_hparams *hp = &m->hp;
    const int64_t U = f->ub_max, E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used;
    bool fail = false;
    f->tok_embd = weight(m->tok_embd);
    f->output_norm = weight(m->output_norm);
    f->output = weight(m->output);
    f->lw = xcalloc((size_t)(hp->n_layer + hp->n_nextn), sizeof(*f->lw), &fail);
    for (int il = 0; f->lw && il < hp->n_layer + hp->n_nextn; il++)
        bind_layer(&f->lw[il], &m->layers[il]);
    if (hp->n_nextn > 0) {
        f->mtp_eh_proj = weight(m->nextn.eh_proj);
        f->mtp_enorm = weight(m->nextn.enorm);
        f->mtp_hnorm = weight(m->nextn.hnorm);
        f->mtp_head_norm = weight(m->nextn.shared_head_norm);
        f->mtp_embd = weight(m->nextn.embed_tokens);
        f->mtp_head = weight(m->nextn.shared_head_head);
        f->mtp_cat = act(f, U, 2 * E, &fail);
    }

    f->x = act(f, U, E, &fail);
    f->cur = act(f, U, E, &fail);
    if (f->n_lm > 0) {
        f->lm_x = xcalloc((size_t)f->n_lm, sizeof(*f->lm_x), &fail);
        f->lm_cur = xcalloc((size_t)f->n_lm, sizeof(*f->lm_cur), &fail);
        for (int32_t k = 0; !fail && k < f->n_lm; k++) {
            f->lm_x[k] = act(f, U, E, &fail);
            f->lm_cur[k] = act(f, U, E, &fail);
        }
    }
    f->out = act(f, U, E, &fail);
    f->scratch_bytes = 0;
    if (hp->n_layer_attn > 0 || hp->n_nextn > 0)
        f->scratch_bytes = max_size(f->scratch_bytes, sil_fwd_attention_scratch(f));
    if (hp->n_layer_recr > 0)
        f->scratch_bytes = max_size(f->scratch_bytes, sil_fwd_delta_net_scratch(f));
    if (!m->traits->moe) f->scratch_bytes = max_size(f->scratch_bytes, sil_fwd_ffn_scratch(f));
    if (f->scratch_bytes > 0) f->scratch = SIL_OP(f, alloc_act, f->scratch_bytes);

    if (X > 0) {
        struct sil_moe_plan *p = &f->plan;
        p->sel_expert = xcalloc((size_t)(U * K), sizeof(int32_t), &fail);
        p->sel_weight = xcalloc((size_t)(U * K), sizeof(float), &fail);
        p->expert = xcalloc((size_t)X, sizeof(int32_t), &fail);
        p->pair_start = xcalloc((size_t)X + 1, sizeof(int32_t), &fail);
        p->pair_row = xcalloc((size_t)(U * K), sizeof(int32_t), &fail);
        p->pair_of = xcalloc((size_t)(U * K), sizeof(int32_t), &fail);
        p->gate = xcalloc((size_t)X, sizeof(struct sil_weight), &fail);
        p->up = xcalloc((size_t)X, sizeof(struct sil_weight), &fail);
        p->down = xcalloc((size_t)X, sizeof(struct sil_weight), &fail);
        f->expert_pairs = xcalloc((size_t)X, sizeof(int32_t), &fail);
        f->expert_next = xcalloc((size_t)X, sizeof(int32_t), &fail);
    }
    f->keep_rows = xcalloc((size_t)U, sizeof(int32_t), &fail);
    f->keep_out = xcalloc((size_t)U, sizeof(int32_t), &fail);
    f->tree_runs = xcalloc((size_t)U + 1, sizeof(int32_t), &fail);
    if (fail || (f->scratch_bytes > 0 && !f->scratch))
        return sil_errorf(err, -ENOMEM, "%s: out of memory for activations", m->info.path);
    return 0;
}

void sil_fwd_close(struct sil_fwd *f)
{
    struct sil_moe_plan *p = &f->plan;
    free(f->lm_x);
    free(f->lm_cur);
    f->lm_x = f->lm_cur = NULL;
    void *ptrs[] = {f->lw,        p->sel_expert, p->sel_weight,   p->expert,     p->pair_start,
                    p->pair_row,  p->pair_of,    p->gate,         p->up,         p->down,
                    f->keep_rows, f->keep_out,   f->expert_pairs, f->expert_next,
                    f->tree_runs};
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++)
        free(ptrs[i]);
    /* open may run again (another backend) */
    f->lw = NULL;
    memset(p, 0, sizeof(*p));
    f->keep_rows = f->keep_out = f->expert_pairs = f->expert_next = f->tree_runs = NULL;
}

/* After the last layer's mixer only rows that want logits matter: the last FFN runs on them
 * alone (prefill with logits for the last row skips 1/n_layer of the FFN work). Gathers those
 * rows of x into out and swaps the two; returns the reduced ubatch. */
static struct sil_ubatch keep_output_rows(struct sil_fwd *f, const struct sil_ubatch *ub)
{
    struct sil_ubatch r = *ub;
    int32_t j = 0;
    for (int32_t i = 0; i < ub->n; i++) {
        if (ub->out_row[i] < 0) continue;
        f->keep_rows[j] = i;
        f->keep_out[j++] = ub->out_row[i];
    }
    SIL_OP(f, copy_rows, sil_act_rows(f->out, 0, j), f->x, f->keep_rows);
    const struct sil_act x = f->x;
    f->x = f->out;
    f->out = x;
    r.n = j;
    r.out_row = f->keep_out;
    r.token = r.pos = r.seq = NULL; /* the FFN and the output head use neither */
    r.n_runs = 0;
    return r;
}

/* x += d; y = rmsnorm(x) * w: one pass over the rows where the backend has it */
void sil_fwd_add_norm(struct sil_fwd *f, struct sil_act y, struct sil_act x, struct sil_act d,
                      const struct sil_weight *w, float eps)
{
    if (f->be->ops->add_rmsnorm) {
        SIL_OP(f, add_rmsnorm, y, x, d, w, eps);
    } else {
        SIL_OP(f, add, x, d);
        SIL_OP(f, rmsnorm, y, x, w, eps);
    }
}

void sil_fwd_ffn_add_norm(struct sil_fwd *f, const struct sil_ubatch *ub, int il,
                          const struct sil_fwd_norm *norm, struct sil_act x, struct sil_act cur,
                          struct sil_act out, const struct sil_weight *next)
{
    if (f->model->traits->moe)
        sil_fwd_moe(f, ub, il, norm, cur, out);
    else
        sil_fwd_ffn(f, ub, il, norm, cur, out);
    sil_fwd_add_norm(f, cur, x, out, next, f->model->hp.rms_eps);
}

/* The embedding rows of the ubatch into x, and the first block's norm into cur. */
static void embed(struct sil_fwd *f, const struct sil_ubatch *ub)
{
    f->n_ubatch++;
    f->n_rows += (uint64_t)ub->n;
    if (f->be->ops->begin) SIL_OP(f, begin, ub);
    SIL_OP(f, get_rows, &f->tok_embd, ub->token, sil_act_rows(f->x, 0, ub->n));
    /* each residual add goes with the norm after it (the next block's, or the output's) */
    SIL_OP(f, rmsnorm, sil_act_rows(f->cur, 0, ub->n), sil_act_rows(f->x, 0, ub->n),
           &f->lw[0].attn_norm, f->model->hp.rms_eps);
}

/* Layer il but the last: cur (normed x) -> x += block, x += ffn, cur = the next norm. */
static void layer(struct sil_fwd *f, const struct sil_ubatch *ub, int il)
{
    const struct sil_model *m = f->model;
    const float eps = m->hp.rms_eps;
    const struct sil_layer_weights *w = &f->lw[il];
    struct sil_act x = sil_act_rows(f->x, 0, ub->n);     /* [n, n_embd] */
    struct sil_act cur = sil_act_rows(f->cur, 0, ub->n); /* [n, n_embd], normed */
    struct sil_act out = sil_act_rows(f->out, 0, ub->n); /* [n, n_embd] */
    if (m->hp.recurrent[il])
        sil_fwd_delta_net(f, ub, il, cur, out);
    else
        sil_fwd_attention(f, ub, il, cur, out);
    /* x += out, cur = rmsnorm(x) * ffn_norm, in the block (a MoE router may take the norm) */
    const struct sil_fwd_norm ffn_in = {x, out, &w->ffn_norm, eps};
    sil_fwd_ffn_add_norm(f, ub, il, &ffn_in, x, cur, out, &f->lw[il + 1].attn_norm);
}

/* The last layer (its FFN only on the rows that want logits) and the head. */
static void finish(struct sil_fwd *f, const struct sil_ubatch *ub, float *logits, int32_t *argmax)
{
    const struct sil_model *m = f->model;
    const float eps = m->hp.rms_eps;
    const int il = m->hp.n_layer - 1;
    const struct sil_layer_weights *w = &f->lw[il];
    struct sil_act cur = sil_act_rows(f->cur, 0, ub->n);
    struct sil_act out = sil_act_rows(f->out, 0, ub->n);
    if (m->hp.recurrent[il])
        sil_fwd_delta_net(f, ub, il, cur, out);
    else
        sil_fwd_attention(f, ub, il, cur, out);
    SIL_OP(f, add, sil_act_rows(f->x, 0, ub->n), out);
    const struct sil_ubatch last = keep_output_rows(f, ub);
    if (last.n == 0) return;
    struct sil_act x = sil_act_rows(f->x, 0, last.n);
    cur = sil_act_rows(f->cur, 0, last.n);
    out = sil_act_rows(f->out, 0, last.n);
    SIL_OP(f, rmsnorm, cur, x, &w->ffn_norm, eps);
    sil_fwd_ffn_add_norm(f, &last, il, NULL, x, cur, out, &f->output_norm);
    if (f->hidden) /* host activations (the engine asks for them on the CPU only) */
        for (int32_t j = 0; j < last.n; j++)
            memcpy(f->hidden + (int64_t)last.out_row[j] * m->hp.n_embd,
                   (const float *)cur.data + j * cur.ld, sizeof(float) * (size_t)m->hp.n_embd);
    /* keep_output_rows left only the rows that want logits, cur their output norm */
    SIL_OP(f, head, cur, &f->output, last.out_row, logits, argmax);
    sil_fwd_moe_deferred(f);
}

void sil_forward(struct sil_fwd *f, const struct sil_ubatch *ub, float *logits, int32_t *argmax)
{
    embed(f, ub);
    for (int il = 0; il + 1 < f->model->hp.n_layer; il++)
        layer(f, ub, il);
    finish(f, ub, logits, argmax);
}

/* Points the residual and the normed rows at micro-batch k's (its own between layers); the
 * backend takes up k's inputs again when the ops before were another micro-batch's. */
static void use_rows(struct sil_fwd *f, const struct sil_ubatch *ubs, int n_ub, int k, bool resume)
{
    f->x = f->lm_x[k];
    f->cur = f->lm_cur[k];
    if (resume && n_ub > 1 && f->be->ops->resume) SIL_OP(f, resume, &ubs[k]);
}

void sil_forward_layers(struct sil_fwd *f, const struct sil_ubatch *ubs, int n_ub, float *logits,
                        int32_t *argmax)
{
    const struct sil_act x = f->x, cur = f->cur, out = f->out;
    if (n_ub > 1) f->n_layered += (uint64_t)n_ub;
    for (int k = 0; k < n_ub; k++) {
        use_rows(f, ubs, n_ub, k, false); /* embed begins k's pass */
        embed(f, &ubs[k]);
    }
    for (int il = 0; il + 1 < f->model->hp.n_layer; il++)
        for (int k = 0; k < n_ub; k++) {
            use_rows(f, ubs, n_ub, k, true);
            layer(f, &ubs[k], il);
        }
    for (int k = 0; k < n_ub; k++) {
        use_rows(f, ubs, n_ub, k, true);
        finish(f, &ubs[k], logits, argmax);
        f->out = out; /* the last layer swapped x and out */
    }
    f->x = x;
    f->cur = cur;
    f->out = out;
}
