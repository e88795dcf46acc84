/* Qwen3.5 linear-attention layer around the gated delta-net core (delta_net.h):
 *
 *   qkv_mixed = Wqkv x   [conv_dim]        z    = Wgate x   [n_v_heads * head_v_dim]
 *   alpha_raw = Walpha x [n_v_heads]       beta = Wbeta x   [n_v_heads]
 *   o = delta_net(qkv_mixed, z, alpha_raw, beta; the sequence's conv + SSM state)
 *   out = Wssm_out o
 * Each sequence's rows run in order through its own state; the conv channels and then the
 * value heads of all sequences in the batch are spread over the threads. */
#include "daemon/engine/forward.h"

struct dn_task {
    struct sil_fwd *f;
    const struct sil_ubatch *ub;
    const struct sil_delta_net_params *p;
    int recr_index;
    int64_t conv_dim, zdim;
    long conv_chunks; /* channel ranges per sequence in the conv phase */
};

/* The sequence run r: its rows [*r0, *r0 + *nt) and its state for this layer. */
static void run_state(const struct dn_task *t, long r, int32_t *r0, int32_t *nt,
                      struct sil_delta_net_state *st)
{
    const struct sil_ubatch *ub = t->ub;
    *r0 = ub->run_start[r];
    *nt = ub->run_start[r + 1] - *r0;
    float *state = t->f->recr_state[ub->seq[*r0]] + (int64_t)t->recr_index * t->f->dn_state_floats;
    sil_delta_net_state_bind(t->p, st, state);
}

/* item = (sequence run, channel range) */
static void dn_conv(void *arg, long lo, long hi, int ith)
{
    struct dn_task *t = arg;
    (void)ith;
    for (long it = lo; it < hi; it++) {
        const long r = it / t->conv_chunks, ci = it % t->conv_chunks;
        int32_t r0, nt;
        struct sil_delta_net_state st;
        run_state(t, r, &r0, &nt, &st);
        long c0, c1;
        sil_split_range((long)t->conv_dim, (int)ci, (int)t->conv_chunks, &c0, &c1);
        sil_delta_net_conv(t->p, &st, nt, t->f->a + (int64_t)r0 * t->conv_dim,
                           t->f->e + (int64_t)r0 * t->conv_dim, c0, c1);
    }
}

/* item = (sequence run, value head) */
static void dn_heads(void *arg, long lo, long hi, int ith)
{
    struct dn_task *t = arg;
    struct sil_fwd *f = t->f;
    const int nv = t->p->n_v_heads, n = t->ub->n;
    for (long it = lo; it < hi; it++) {
        const long r = it / nv;
        const int32_t h = (int32_t)(it % nv);
        int32_t r0, nt;
        struct sil_delta_net_state st;
        run_state(t, r, &r0, &nt, &st);
        sil_delta_net_heads(t->p, &st, nt, f->e + (int64_t)r0 * t->conv_dim, f->b + (int64_t)r0 * t->zdim,
                            f->c + (int64_t)r0 * nv, f->c + (int64_t)(n + r0) * nv,
                            f->d + (int64_t)r0 * t->zdim, h, h + 1,
                            f->dn_scratch + (int64_t)ith * f->dn_head_scratch);
    }
}

void sil_fwd_delta_net(struct sil_fwd *f, const struct sil_ubatch *ub, int il, struct sil_act cur_,
        struct sil_act out_)
{
    const struct sil_hparams *hp = &f->model->hp;
    const struct sil_layer *l = &f->model->layers[il];
    const struct sil_delta_net_params *p = &f->dn[l->recr_index];
    const int n = ub->n;
    const int64_t conv_dim = sil_delta_net_conv_dim(p);
    const int64_t nv = p->n_v_heads, zdim = nv * p->head_v_dim;

    /* f->c holds alpha [n][nv] then beta [n][nv] */
    struct sil_mm_input in;
    sil_fwd_input(f, &in, 0, ((float *)cur_.data), n, hp->n_embd);
    struct sil_mm_job jobs[4] = {
        {.w = l->wqkv->data, .wtype = l->wqkv->type, .m = conv_dim, .in = &in, .n_rows = n, .y = f->a, .ldy = conv_dim},
        {.w = l->wgate->data, .wtype = l->wgate->type, .m = zdim, .in = &in, .n_rows = n, .y = f->b, .ldy = zdim},
        {.w = l->ssm_alpha->data, .wtype = l->ssm_alpha->type, .m = nv, .in = &in, .n_rows = n, .y = f->c, .ldy = nv},
        {.w = l->ssm_beta->data, .wtype = l->ssm_beta->type, .m = nv, .in = &in, .n_rows = n, .y = f->c + (int64_t)n * nv, .ldy = nv},
    };
    sil_fwd_matmul(f, jobs, 4);

    /* two parallel phases over all sequences of the batch (decode of N sequences is 2 tasks,
     * not 2N): conv over (sequence, channel range), then the delta rule over (sequence, head) */
    const long chunks = ub->n_runs >= 4 * f->n_threads ? 1 : (4 * f->n_threads + ub->n_runs - 1) / ub->n_runs;
    struct dn_task t = {f, ub, p, l->recr_index, conv_dim, zdim, chunks};
    sil_threadpool_for(f->tp, (long)ub->n_runs * chunks, 0, dn_conv, &t);
    sil_threadpool_for(f->tp, (long)ub->n_runs * nv, 0, dn_heads, &t);

    struct sil_mm_input in_o;
    sil_fwd_input(f, &in_o, 1, f->d, n, zdim);
    struct sil_mm_job jo = {.w = l->ssm_out->data, .wtype = l->ssm_out->type, .m = hp->n_embd,
                            .in = &in_o, .n_rows = n, .y = ((float *)out_.data), .ldy = hp->n_embd};
    sil_fwd_matmul(f, &jo, 1);
}
