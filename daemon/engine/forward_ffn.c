/* Feed-forward blocks.
 *
 * ffn (qwen3, qwen35):  out = Wdown (silu(Wgate x) * Wup x)
 * moe (qwen3moe, qwen35moe):
 *   p = softmax(Wrouter x)  [n_expert];  top n_expert_used experts, weights p_e / sum(p_top)
 *   out = sum_e w_e * Wdown_e (silu(Wgate_e x) * Wup_e x)      (summed in top-k order)
 *   qwen35moe adds the shared expert: out += sigmoid(w_shgate . x) * ffn_shexp(x)
 * Between routing and the expert matmuls the block builds the expert plan (struct sil_moe_plan):
 * every (row, slot) pair grouped by expert, and the weight handles of each expert that runs. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "daemon/engine/forward.h"

/* Block-local activations of n rows (dense FFN). */
struct ffn_acts {
    struct sil_act gate; /* [n, n_ff] Wgate x, then silu(Wgate x) * Wup x in place */
    struct sil_act up;   /* [n, n_ff] */
};

static void ffn_acts(const struct sil_fwd *f, struct sil_fwd_arena *ar, int64_t n,
                     struct ffn_acts *t)
{
    t->gate = sil_fwd_take(ar, n, f->model->hp.n_ff);
    t->up = sil_fwd_take(ar, n, f->model->hp.n_ff);
}

size_t sil_fwd_ffn_scratch(const struct sil_fwd *f)
{
    struct sil_fwd_arena ar = {0};
    struct ffn_acts t;
    ffn_acts(f, &ar, f->ub_max, &t);
    return ar.used;
}

void sil_fwd_ffn(struct sil_fwd *f, const struct sil_ubatch *ub, int il,
                 const struct sil_fwd_norm *norm, struct sil_act cur, struct sil_act out)
{
    const struct sil_layer_weights *w = &f->lw[il];
    struct sil_fwd_arena ar = sil_fwd_scratch(f);
    struct ffn_acts t;
    ffn_acts(f, &ar, ub->n, &t);

    if (norm) sil_fwd_add_norm(f, cur, norm->x, norm->d, norm->w, norm->eps);
    SIL_MATMUL(f, cur, {&w->ffn_gate, t.gate}, {&w->ffn_up, t.up});
    SIL_OP(f, swiglu, t.gate, t.gate, t.up);
    SIL_MATMUL(f, t.gate, {&w->ffn_down, out});
}

/* The expert plan from the routing in p->sel_expert: pairs (row, slot) grouped by expert in
 * ascending id, pair order within an expert by row then slot; each active expert's matrices as
 * handles into the layer's stacked expert tensors. An expert cache would pick the handles here
 * (a resident slot or host memory) and count hits and misses. */
static void moe_plan(struct sil_fwd *f, const struct sil_layer_weights *w, struct sil_moe_plan *p)
{
    const int X = f->model->hp.n_expert, K = p->n_used;
    const int64_t P = (int64_t)p->n_rows * K;
    int32_t *n_pairs = f->expert_pairs, *next = f->expert_next; /* [n_expert] */
    memset(n_pairs, 0, sizeof(int32_t) * (size_t)X);
    for (int64_t q = 0; q < P; q++)
        n_pairs[p->sel_expert[q]]++;
    p->n_active = 0;
    int32_t at = 0;
    for (int e = 0; e < X; e++) {
        next[e] = at;
        if (n_pairs[e] == 0) continue;
        const int a = p->n_active++;
        p->expert[a] = e;
        p->pair_start[a] = at;
        p->gate[a] = sil_weight_mat(&w->ffn_gate_exps, e);
        p->up[a] = sil_weight_mat(&w->ffn_up_exps, e);
        p->down[a] = sil_weight_mat(&w->ffn_down_exps, e);
        at += n_pairs[e];
    }
    p->pair_start[p->n_active] = at;
    for (int64_t q = 0; q < P; q++) {
        const int32_t j = next[p->sel_expert[q]]++;
        p->pair_row[j] = (int32_t)(q / K);
        p->pair_of[q] = j;
    }
}

/* The host tier: the plan's experts which[0..n) are made resident in host slots (read from
 * the file when they are not) and their handles point there. On failure the handles stay in
 * the mapping and the evaluation fails after this pass (xs_err). */
static void host_tier(struct sil_fwd *f, int il, struct sil_moe_plan *p, int32_t n)
{
    if (n == 0 || f->xs_err) return;
    for (int32_t i = 0; i < n; i++) {
        const int32_t a = f->xs_which[i];
        f->xs_exp[i] = p->expert[a];
        f->xs_uses[i] = p->pair_start[a + 1] - p->pair_start[a];
    }
    struct sil_error err = {0};
    const int rc = sil_xstore_acquire(f->xstore, il, f->xs_exp, f->xs_uses, n, f->xs_ptr, &err);
    if (rc < 0) {
        f->xs_err = rc;
        snprintf(f->xs_msg, sizeof f->xs_msg, "%.190s", err.msg);
        return;
    }
    for (int32_t i = 0; i < n; i++) {
        const int32_t a = f->xs_which[i];
        struct sil_weight *m[3] = {&p->gate[a], &p->up[a], &p->down[a]};
        for (int k = 0; k < 3; k++) {
            m[k]->loc = SIL_WEIGHT_HOST;
            m[k]->data = f->xs_ptr[3 * i + k];
        }
    }
}

/* Slots for the plan's experts (a backend with an expert cache): hits point at their slot,
 * misses are copied into the slot the policy chose (from the host tier when there is one); a
 * plan wider than the pool keeps its last experts on the host, which the device backend
 * refuses in a prefill (its error fails the evaluation). */
static void assign_slots(struct sil_fwd *f, int il, struct sil_moe_plan *p)
{
    for (int a = 0; a < p->n_active; a++)
        f->ecache_uses[a] = p->pair_start[a + 1] - p->pair_start[a];
    /* a decode step (at most 8 rows, the CUDA decode batch) may leave its coldest misses to
     * the backend's host path */
    if (f->cpu_misses > 0)
        sil_ecache_set_host_misses(f->ecache, p->n_rows <= 8 ? f->cpu_misses : 0);
    if (sil_ecache_lookup(f->ecache, il, p->expert, f->ecache_uses, p->n_active, f->ecache_res) <
        0)
        return;
    if (f->xstore) {
        int32_t n = 0;
        for (int a = 0; a < p->n_active; a++)
            if (f->ecache_res[a].kind != SIL_ECACHE_HIT) f->xs_which[n++] = a;
        host_tier(f, il, p, n);
    }
    for (int a = 0; a < p->n_active; a++) {
        const struct sil_ecache_entry *r = &f->ecache_res[a];
        if (r->kind == SIL_ECACHE_HOST) continue;
        if (r->kind == SIL_ECACHE_FILL) {
            SIL_OP(f, fill_slot, r->slot, &p->gate[a], &p->up[a], &p->down[a], il, p->expert[a]);
            /* the host tier keeps other experts than VRAM (demoting in decode steps only
             * measured slower: bench/results/lowmem-nodemote-h100-20261206.json) */
            if (f->xstore) sil_xstore_demote(f->xstore, il, p->expert[a]);
        }
        struct sil_weight *m[3] = {&p->gate[a], &p->up[a], &p->down[a]};
        for (int i = 0; i < 3; i++) {
            m[i]->loc = SIL_WEIGHT_SLOT;
            m[i]->data = (const void *)(uintptr_t)r->slot;
        }
    }
}

/* Shows layer il's plan to the observers (engine.h); nothing without one. weight: the plan's
 * router weights, NULL when they stayed on the device. */
static void observe(struct sil_fwd *f, int il, const struct sil_moe_plan *p, const float *weight)
{
    if (f->n_observer == 0) return;
    const struct sil_route_event ev = {
        .layer = il,
        .n_rows = p->n_rows,
        .n_used = p->n_used,
        .expert = p->sel_expert,
        .weight = weight,
        .n_active = p->n_active,
        .active = p->expert,
        .active_start = p->pair_start,
        .forced = p->force_sel != NULL,
        .forced_changed = p->force_changed,
        .forced_gap = p->force_gap,
        .forced_bad = p->force_bad,
    };
    for (int i = 0; i < f->n_observer; i++)
        if (f->observer[i]->on_route) f->observer[i]->on_route(f->observer[i]->user, &ev);
}

void sil_fwd_moe(struct sil_fwd *f, const struct sil_ubatch *ub, int il,
                 const struct sil_fwd_norm *norm, struct sil_act cur, struct sil_act out)
{
    const struct sil_layer_weights *w = &f->lw[il];
    struct sil_moe_plan *plan = &f->plan;
    const bool shexp = f->model->traits->shared_expert;
    plan->gate_exps = &w->ffn_gate_exps;
    plan->up_exps = &w->ffn_up_exps;
    plan->down_exps = &w->ffn_down_exps;
    plan->sh_gate_inp = shexp ? &w->ffn_gate_inp_shexp : NULL;
    plan->sh_gate = shexp ? &w->ffn_gate_shexp : NULL;
    plan->sh_up = shexp ? &w->ffn_up_shexp : NULL;
    plan->sh_down = shexp ? &w->ffn_down_shexp : NULL;
    plan->device_routed = false;
    plan->layer = il;
    plan->force_sel =
        f->chooser ? f->chooser->choose(f->chooser->user, il, (int32_t)cur.rows) : NULL;
    plan->force_changed = 0;
    plan->force_gap = 0.0f;
    plan->force_bad = false;
    const int K = f->model->hp.n_expert_used;
    if (norm && f->be->ops->add_rmsnorm_route) {
        SIL_OP(f, add_rmsnorm_route, cur, norm->x, norm->d, norm->w, norm->eps, &w->ffn_gate_inp, K,
               plan);
    } else {
        if (norm) sil_fwd_add_norm(f, cur, norm->x, norm->d, norm->w, norm->eps);
        SIL_OP(f, route, cur, &w->ffn_gate_inp, K, plan);
    }
    if (plan->device_routed) {
        plan->n_active = 0; /* the choices stay on the device: not counted in expert_bytes */
    } else {
        moe_plan(f, w, plan);
        observe(f, il, plan, plan->sel_weight);
        if (f->ecache) {
            assign_slots(f, il, plan);
        } else if (f->xstore) {
            for (int a = 0; a < plan->n_active; a++)
                f->xs_which[a] = a;
            host_tier(f, il, plan, plan->n_active);
        }
        for (int a = 0; a < plan->n_active; a++)
            f->expert_bytes +=
                plan->gate[a].mat_bytes + plan->up[a].mat_bytes + plan->down[a].mat_bytes;
        f->moe_plans++;
        f->moe_experts += (uint64_t)plan->n_active;
        f->moe_pairs += (uint64_t)plan->n_rows * (uint64_t)plan->n_used;
    }
    SIL_OP(f, moe, cur, plan, out);
}

/* A pass whose routing stayed on the device while experts live in slots (the backend read its
 * misses in place): each MoE layer's choices become a plan for the cache after the fact, so
 * hits, misses, the heat map and the fills admission allows (ordered before the next pass) are
 * as a host-routed pass would have them. */
void sil_fwd_moe_deferred(struct sil_fwd *f)
{
    const struct sil_backend *be = f->be;
    if (!f->ecache || !be->ops->routes || !f->model->traits->moe) return;
    struct sil_moe_plan *plan = &f->plan;
    const int K = f->model->hp.n_expert_used, X = f->model->hp.n_expert;
    for (int il = 0; il < f->model->hp.n_layer; il++) {
        const struct sil_layer_weights *w = &f->lw[il];
        const int32_t *ids = NULL;
        const int32_t n = be->ops->routes(f->be, il, &ids);
        if (n <= 0 || !ids || n > f->ub_max) continue;
        bool good = true;
        for (int64_t q = 0; q < (int64_t)n * K; q++)
            good = good && ids[q] >= 0 && ids[q] < X;
        if (!good) continue; /* the kernels wrote NaN for these: the pass already failed */
        plan->n_rows = n;
        plan->n_used = K;
        plan->layer = il;
        plan->gate_exps = &w->ffn_gate_exps;
        plan->up_exps = &w->ffn_up_exps;
        plan->down_exps = &w->ffn_down_exps;
        memcpy(plan->sel_expert, ids, sizeof(int32_t) * (size_t)n * (size_t)K);
        moe_plan(f, w, plan);
        observe(f, il, plan, NULL);
        sil_ecache_set_admission(f->ecache, 1);
        assign_slots(f, il, plan);
        sil_ecache_set_admission(f->ecache, 0);
        for (int a = 0; a < plan->n_active; a++)
            f->expert_bytes +=
                plan->gate[a].mat_bytes + plan->up[a].mat_bytes + plan->down[a].mat_bytes;
        f->moe_plans++;
        f->moe_experts += (uint64_t)plan->n_active;
        f->moe_pairs += (uint64_t)plan->n_rows * (uint64_t)plan->n_used;
    }
}
