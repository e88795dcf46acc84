/* Qwen3.5 linear-attention layer around the gated delta-net core (delta_net.h):
 *
 *   qkv_mixed = Wqkv x   [conv_dim]        z    = Wgate x   [n_v_heads * head_v_dim]
 *   alpha_raw = Walpha x [n_v_heads]       beta = Wbeta x   [n_v_heads]
 *   o = delta_net(qkv_mixed, z, alpha_raw, beta; the sequence's conv + SSM state)
 *   out = Wssm_out o
 * Each sequence's rows run in order through its own state; the backend spreads the conv
 * channels, then the value heads, of all sequences in the ubatch over its threads. A token
 * tree's branches each start from the state after their branch point (tree_recurrence). */
#include <string.h>

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

/* Whether the ubatch holds a token tree that forks a recurrent state. */
static bool tree_forks(const struct sil_ubatch *ub)
{
    for (int32_t i = 0; ub->tree && i < ub->n; i++)
        if (ub->tree[i].fork) return true;
    return false;
}

/* conv1d and delta_net of a ubatch with a token tree: its rows in parts, cut after each branch
 * point (this layer's state of its sequence copied aside) and before each row that starts a
 * branch (that copy restored), so every part follows one path and each row's state is that of
 * its path. The parts run one after another (a sequence's state is shared), each spread over
 * the threads as a ubatch is; the projections around them still see all rows at once. The
 * delta net gives the same state and outputs whatever the split of a path's rows
 * (delta_net.h), so a node's rows are bit-identical to its path evaluated alone. */
static void tree_recurrence(struct sil_fwd *f, const struct sil_ubatch *ub,
                            const struct sil_delta_net_args *a)
{
    const int64_t off = a->state.offset;
    const size_t bytes = sizeof(float) * (size_t)f->dn_state_floats;
    for (int32_t r0 = 0; r0 < ub->n;) {
        int32_t r1 = r0 + 1;
        while (r1 < ub->n && !(ub->tree[r1 - 1].fork & SIL_TREE_SAVE) &&
               !(ub->tree[r1].fork & SIL_TREE_RESTORE))
            r1++;
        const int32_t n = r1 - r0, s0 = ub->seq[r0], s1 = ub->seq[r1 - 1];
        if (ub->tree[r0].fork & SIL_TREE_RESTORE)
            memcpy(f->recr_state[s0] + off, f->fork_state[s0] + off, bytes);
        struct sil_ubatch part = *ub;
        part.n = n;
        part.token += r0;
        part.pos += r0;
        part.seq += r0;
        part.out_row += r0;
        part.tree += r0;
        part.n_runs = 0;
        for (int32_t i = 0; i < n; i++)
            if (i == 0 || part.seq[i] != part.seq[i - 1]) f->tree_runs[part.n_runs++] = i;
        f->tree_runs[part.n_runs] = n;
        part.run_start = f->tree_runs;
        struct sil_delta_net_args pa = *a;
        pa.qkv_mixed = sil_act_rows(a->qkv_mixed, r0, n);
        pa.conv_out = sil_act_rows(a->conv_out, r0, n);
        pa.z = sil_act_rows(a->z, r0, n);
        pa.alpha = sil_act_rows(a->alpha, r0, n);
        pa.beta = sil_act_rows(a->beta, r0, n);
        pa.out = sil_act_rows(a->out, r0, n);
        SIL_OP(f, conv1d, &part, &pa);
        SIL_OP(f, delta_net, &part, &pa);
        if (ub->tree[r1 - 1].fork & SIL_TREE_SAVE)
            memcpy(f->fork_state[s1] + off, f->recr_state[s1] + off, bytes);
        r0 = r1;
    }
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
    if (tree_forks(ub)) {
        SIL_OP(f, matmul, cur, in, n_in);
        if (f->dn_capture)
            f->dn_capture(f->dn_capture_user, ub, l->recr_index, t.qkv_mixed, t.alpha, t.beta);
        tree_recurrence(f, ub, &a);
        SIL_MATMUL(f, t.o, {&w->ssm_out, out});
        return;
    }
    if (f->be->ops->matmul_conv1d) {
        SIL_OP(f, matmul_conv1d, ub, cur, in, n_in, &a);
    } else {
        SIL_OP(f, matmul, cur, in, n_in);
        SIL_OP(f, conv1d, ub, &a);
    }
    if (f->dn_capture)
        f->dn_capture(f->dn_capture_user, ub, l->recr_index, t.qkv_mixed, t.alpha, t.beta);
    SIL_OP(f, delta_net, ub, &a);
    SIL_MATMUL(f, t.o, {&w->ssm_out, out});
}
