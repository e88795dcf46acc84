/* Qwen3.5 linear-attention layer around the gated delta-net core (delta_net.h):
 *
 *   qkv_mixed = Wqkv x   [conv_dim]        z    = Wgate x   [n_v_heads * head_v_dim]
 *   alpha_raw = Walpha x [n_v_heads]       beta = Wbeta x   [n_v_heads]
 *   o = delta_net(qkv_mixed, z, alpha_raw, beta; the sequence's conv + SSM state)
 *   out = Wssm_out o
 * Each sequence's rows run in order through its own state; the backend spreads the conv
 * channels, then the value heads, of all sequences in the ubatch over its threads. */
#include "daemon/engine/forward.h"

/* Block-local activations of n rows. */
struct dn_acts {
    struct sil_act
        qkv_mixed;    /* [n, conv_dim]: q [n_k_heads, dk], k [n_k_heads, dk], v [n_v_heads, dv] */
    struct sil_act z; /* [n, n_v_heads * dv] output gate */
    struct sil_act alpha;    /* [n, n_v_heads] decay input */
    struct sil_act beta;     /* [n, n_v_heads] update strength input */
    struct sil_act conv_out; /* [n, conv_dim] */
    struct sil_act o;        /* [n, n_v_heads * dv] */
};

static void dn_acts(const struct sil_fwd *f, struct sil_fwd_arena *ar, int64_t n, struct dn_acts *t)
{
    const struct sil_delta_net_params *p = &f->dn[0];
    const int64_t conv_dim = sil_delta_net_conv_dim(p), nv = p->n_v_heads;
    t->qkv_mixed = sil_fwd_take(ar, n, conv_dim);
    t->z = sil_fwd_take(ar, n, nv * p->head_v_dim);
    t->alpha = sil_fwd_take(ar, n, nv);
    t->beta = sil_fwd_take(ar, n, nv);
    t->conv_out = sil_fwd_take(ar, n, conv_dim);
    t->o = sil_fwd_take(ar, n, nv * p->head_v_dim);
}

size_t sil_fwd_delta_net_scratch(const struct sil_fwd *f)
{
    struct sil_fwd_arena ar = {0};
    struct dn_acts t;
    dn_acts(f, &ar, f->ub_max, &t);
    return ar.used;
}

void sil_fwd_delta_net(struct sil_fwd *f, const struct sil_ubatch *ub, int il, struct sil_act cur,
                       struct sil_act out)
{
    const struct sil_layer *l = &f->model->layers[il];
    const struct sil_layer_weights *w = &f->lw[il];
    struct sil_fwd_arena ar = sil_fwd_scratch(f);
    struct dn_acts t;
    dn_acts(f, &ar, ub->n, &t);

    /* the input projections of cur */
    const struct sil_mm_out in[] = {{&w->wqkv, t.qkv_mixed},
                                    {&w->wgate, t.z},
                                    {&w->ssm_alpha, t.alpha},
                                    {&w->ssm_beta, t.beta}};
    const int n_in = (int)(sizeof(in) / sizeof(in[0]));
    const struct sil_delta_net_args a = {
        .p = &f->dn[l->recr_index],
        .conv1d = &w->ssm_conv1d,
        .dt_bias = &w->ssm_dt,
        .a = &w->ssm_a,
        .norm = &w->ssm_norm,
        .state = {f->recr_state, (int64_t)l->recr_index * f->dn_state_floats},
        .qkv_mixed = t.qkv_mixed,
        .conv_out = t.conv_out,
        .z = t.z,
        .alpha = t.alpha,
        .beta = t.beta,
        .out = t.o,
    };
    /* the projections and the conv in one launch where the backend has it */
    if (f->be->ops->matmul_conv1d) {
        SIL_OP(f, matmul_conv1d, ub, cur, in, n_in, &a);
    } else {
        SIL_OP(f, matmul, cur, in, n_in);
        SIL_OP(f, conv1d, ub, &a);
    }
    SIL_OP(f, delta_net, ub, &a);
    SIL_MATMUL(f, t.o, {&w->ssm_out, out});
}
