/* The CUDA backend's MoE block: the router (on the device, with the norm before it in its
 * launch where it can; its choices brought to the host where the plan is built there), then the
 * routed experts by one of four paths: the fused decode kernels over the stacked experts (the
 * shared expert in them where it has a routed expert's shape), the grouped tensor-core products
 * of prefill, the per-expert path for types the fused kernels lack, and experts in slots (with
 * the host's share of misses computed on the CPU meanwhile), then the shared expert and sum. */
#ifdef SIL_HAVE_CUDA

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "daemon/engine/backend_cuda_impl.h"

/* The fused kernels take these experts straight from the router's output. */
/* Experts the fused kernels run: quantized, gate and up of one type, and K routed experts a token
 * (plus the shared one) within the slots down takes; the others take the per-expert path. */
bool sil_cb_fused_types(const struct sil_weight *g, const struct sil_weight *u,
                        const struct sil_weight *d, int K)
{
    return quantized(g->type) && u->type == g->type && quantized(d->type) &&
           K + 1 <= SIL_CUDA_MOE_SLOTS_MAX;
}

static bool device_routable(const struct cuda_backend *b, const struct sil_moe_plan *pl)
{
    const struct sil_weight *g = pl->gate_exps, *u = pl->up_exps, *d = pl->down_exps;
    return !b->host_route && g && u && d && g->loc == SIL_WEIGHT_DEVICE &&
           u->loc == SIL_WEIGHT_DEVICE && d->loc == SIL_WEIGHT_DEVICE &&
           sil_cb_fused_types(g, u, d, pl->n_used) && g->n_mat == b->c.n_expert;
}

/* A decode pass of path (b), and a layer whose experts the fused kernels run from slots or
 * from the pinned mapping. */
static bool zc_routable(const struct cuda_backend *b, const struct sil_moe_plan *pl, int n)
{
    const struct sil_weight *g = pl->gate_exps, *u = pl->up_exps, *d = pl->down_exps;
    return b->zc_pass && n <= MB && pl->layer >= 0 && pl->layer < b->c.n_layer && g && u && d &&
           g->loc == SIL_WEIGHT_MMAP && u->loc == SIL_WEIGHT_MMAP && d->loc == SIL_WEIGHT_MMAP &&
           sil_cb_fused_types(g, u, d, pl->n_used) && g->n_mat == b->c.n_expert &&
           u->n_mat == g->n_mat && d->n_mat == g->n_mat;
}

static sil_cuda_ptr zc_ids_of(const struct cuda_backend *b, int32_t layer)
{
    return b->zc_ids + (uint64_t)layer * (uint64_t)(MB * b->c.n_expert_used) * 4;
}

/* The norm of add_rmsnorm_route (x += d, y = rmsnorm(x) * w) in its router's launch. */
struct router_norm {
    struct sil_act x;
    sil_cuda_ptr d, w;
    float eps;
};

/* add_rmsnorm_route's norm and router in one launch: one token whose norm kernel takes the
 * width, into an F32 router on the device that the fused kernel with the norm takes. */
static bool router_takes_norm(const struct cuda_backend *b, struct sil_act y, struct sil_act x,
                              struct sil_act d, const struct sil_weight *w, int K)
{
    return b->mode != PASS_REPLAY && b->rc == 0 && x.rows == 1 && y.rows == 1 &&
           y.width == x.width && d.ld == d.width && sil_cb_norm_fuses(b, y, x) &&
           sil_cuda_router_norm_ok(x.width) && !b->no_norm_router && !b->no_router_fuse &&
           b->router_done && w->cols == x.width && w->type == SIL_TYPE_F32 &&
           w->loc == SIL_WEIGHT_DEVICE && w->rows <= 1024 && K <= 32 && K <= w->rows;
}

/* The router's choices for x's n rows on the device: ids, and b->wts. A decode batch with an F32
 * router of at most 1024 experts takes one launch (matvec and top-k; for one token with the
 * norm that makes x when rn is given), else two. */
static void router(struct cuda_backend *b, struct sil_act x, const struct sil_weight *w, int n,
                   int X, int K, sil_cuda_ptr ids, const struct router_norm *rn)
{
    if (rn) {
        struct sil_cuda_weight cw;
        const struct sil_cuda_norm_in nt = {dp(rn->x.data), rn->w,          dp(x.data),
                                            b->q8,          b->router_done, rn->eps};
        if (ok(b, sil_cb_view(w, w->rows, &cw, &b->err)) &&
            ok(b, sil_cuda_router_norm(b->cu, &cw, rn->d, &nt, b->router, K, ids, b->wts, NULL,
                                       &b->err))) {
            atomic_fetch_add_explicit(&b->fused[2], 1, memory_order_relaxed);
            b->q8_src = dp(x.data);
            b->q8_n = 1;
            b->q8_k = x.width;
        }
        return;
    }
    if (!b->no_router_fuse && b->router_done && n <= MB && w->type == SIL_TYPE_F32 &&
        w->loc == SIL_WEIGHT_DEVICE && X <= 1024 && K <= 32 && x.ld == x.width) {
        struct sil_cuda_weight cw;
        if (ok(b, sil_cb_view(w, w->rows, &cw, &b->err)))
            ok(b, sil_cuda_router_fused(b->cu, &cw, dp(x.data), n, b->router, K, ids, b->wts,
                                        b->router_done, NULL, &b->err));
        return;
    }
    const struct sil_mm_out lo = {w, {(void *)(uintptr_t)b->router, x.rows, X, X}};
    sil_cb_mm_chunks(b, x, &lo, 1);
    if (b->rc == 0)
        ok(b, sil_cuda_router_topk(b->cu, b->router, n, X, K, ids, b->wts, NULL, &b->err));
}

/* route, with the norm that makes x in the router's launch when rn is given. */
static void route(struct cuda_backend *b, struct sil_act x, const struct sil_weight *w, int n_used,
                  struct sil_moe_plan *plan, const struct router_norm *rn)
{
    const int X = (int)w->rows, K = n_used, n = (int)x.rows;
    plan->n_rows = n;
    plan->n_used = K;
    /* path (b): routed on the device over the slot table; the choices stay in zc_ids */
    if (b->rc == 0 && n > 0 && zc_routable(b, plan, n)) {
        plan->device_routed = true;
        b->zc_rows[plan->layer] = n;
        if (b->mode == PASS_REPLAY) return;
        router(b, x, w, n, X, K, zc_ids_of(b, plan->layer), rn);
        return;
    }
    /* prefill brings the choices back for the grouped products */
    if (b->rc == 0 && n > 0 && (n <= MB || b->no_grouped) && device_routable(b, plan)) {
        plan->device_routed = true;
        if (b->mode == PASS_REPLAY) return;
        router(b, x, w, n, X, K, b->ids, rn);
        return;
    }
    if (b->rc || n == 0 || (b->mode != PASS_EAGER && !b->segmented)) {
        if (b->rc == 0 && n > 0) fail(b, -EINVAL, "host routing inside a graph");
        /* keep the plan well-formed for moe_plan() even after an error */
        for (int64_t q = 0; q < (int64_t)n * K; q++) {
            plan->sel_expert[q] = (int32_t)(q % K) % X;
            plan->sel_weight[q] = 0.0f;
        }
        return;
    }
    if (!b->segmented) not_capturable(b);
    /* the plan is built on the host: the choices come back (n * K * 8 bytes, pinned) */
    const size_t bytes = sizeof(int32_t) * (size_t)(n * K);
    int32_t *h_ids = b->h_ids;
    float *h_wts = (float *)(b->h_ids + b->c.ub_max * K);
    if (b->mode != PASS_REPLAY) {
        router(b, x, w, n, X, K, b->ids, rn);
        if (b->rc == 0) ok(b, sil_cuda_download(b->cu, h_ids, b->ids, bytes, NULL, &b->err));
        if (b->rc == 0) ok(b, sil_cuda_download(b->cu, h_wts, b->wts, bytes, NULL, &b->err));
        /* path (c): the MoE input too, for the experts the host computes */
        if (b->rc == 0 && b->hx && n <= MB) {
            if (x.ld != x.width)
                fail(b, -EINVAL, "router rows are not contiguous");
            else
                ok(b, sil_cuda_download(b->cu, b->h_x, dp(x.data),
                                        sizeof(float) * (size_t)(n * x.width), NULL, &b->err));
        }
    }
    sil_cb_seg_end(b);
    if (b->rc == 0) ok(b, sil_cuda_sync(b->cu, NULL, &b->err));
    if (b->rc == 0) {
        memcpy(plan->sel_expert, h_ids, bytes);
        memcpy(plan->sel_weight, h_wts, bytes);
    }
    for (int64_t q = 0; q < (int64_t)n * K; q++)
        if (b->rc || plan->sel_expert[q] < 0 || plan->sel_expert[q] >= X) {
            fail(b, -EIO, "router returned an expert id out of range");
            plan->sel_expert[q] = 0;
        }
}

void sil_cb_route(struct sil_backend *be, struct sil_act x, const struct sil_weight *w, int n_used,
                  struct sil_moe_plan *plan)
{
    route(cb(be), x, w, n_used, plan, NULL);
}

/* The norm in the router's launch where router_takes_norm; else add_rmsnorm, then route. */
void sil_cb_add_rmsnorm_route(struct sil_backend *be, struct sil_act y, struct sil_act x,
                              struct sil_act d, const struct sil_weight *norm, float eps,
                              const struct sil_weight *w, int n_used, struct sil_moe_plan *plan)
{
    struct cuda_backend *b = cb(be);
    if (!router_takes_norm(b, y, x, d, w, n_used)) {
        sil_cb_add_rmsnorm(be, y, x, d, norm, eps);
        sil_cb_route(be, y, w, n_used, plan);
        return;
    }
    b->q8_src = 0; /* x and y are written */
    const struct router_norm rn = {x, dp(d.data), dp(norm->data), eps};
    route(b, y, w, n_used, plan, &rn);
}

/* Shared expert into out: sigmoid(gate_inp . x) * down(silu(gate x) * up x), then out +=
 * routed (already in b->routed). x is quantized in b->q8 for chunk [r0, r0 + n). */
static void shared_and_sum(struct cuda_backend *b, struct sil_act x, const struct sil_moe_plan *pl,
                           struct sil_act out)
{
    const int64_t E = out.width;
    sil_cuda_ptr outp = dp(out.data);
    if (!pl->sh_gate_inp) {
        ok(b, sil_cuda_copy_d2d(b->cu, outp, b->routed, sizeof(float) * (size_t)(x.rows * E), NULL,
                                &b->err));
        return;
    }
    const int64_t S = pl->sh_gate->rows;
    const struct sil_mm_out gu[] = {
        {pl->sh_gate, {(void *)(uintptr_t)b->sh_gate, x.rows, S, S}},
        {pl->sh_up, {(void *)(uintptr_t)b->sh_up, x.rows, S, S}},
        {pl->sh_gate_inp, {(void *)(uintptr_t)b->sh_logit, x.rows, 1, 1}},
    };
    sil_cb_mm_chunks(b, x, gu, 3);
    if (b->rc ||
        !ok(b, sil_cuda_swiglu(b->cu, b->sh_gate, b->sh_gate, b->sh_up, x.rows * S, NULL, &b->err)))
        return;
    const struct sil_mm_out d = {pl->sh_down, out};
    sil_cb_mm_chunks(b, (struct sil_act){(void *)(uintptr_t)b->sh_gate, x.rows, S, S}, &d, 1);
    if (b->rc) return;
    ok(b, sil_cuda_fwd_gate_add(b->cu, b->fwd, outp, out.ld, b->sh_logit, b->routed, E, E, x.rows,
                                NULL, &b->err));
}

/* Quantized experts: the fused kernels over the stacked tensors, 8 rows at a time. */
/* The shared expert can ride in the fused kernels as slot k: a routed expert's shape and types,
 * resident, with an F32 gate over the embedding. */
static bool shared_fusable(const struct cuda_backend *b, const struct sil_moe_plan *pl, int64_t E)
{
    const struct sil_weight *gi = pl->sh_gate_inp, *sg = pl->sh_gate, *su = pl->sh_up,
                            *sd = pl->sh_down;
    return gi && sg && su && sd && !b->no_shared_fuse && gi->loc == SIL_WEIGHT_DEVICE &&
           sg->loc == SIL_WEIGHT_DEVICE && su->loc == SIL_WEIGHT_DEVICE &&
           sd->loc == SIL_WEIGHT_DEVICE && gi->type == SIL_TYPE_F32 && gi->cols == E &&
           gi->rows == 1 && sg->type == pl->gate_exps->type && su->type == pl->gate_exps->type &&
           sd->type == pl->down_exps->type && sg->rows == pl->gate_exps->rows &&
           su->rows == sg->rows && sg->cols == E && sd->rows == pl->down_exps->rows &&
           sd->cols == pl->down_exps->cols;
}

/* The routed stacks in the pinned mapping behind slot views g, u, d (reads in place) with the
 * layer's slot table tab [n_expert]. False (the backend failed) when the stacks are not in the
 * mapping. */
static bool host_views(struct cuda_backend *b, const struct sil_moe_plan *pl, sil_cuda_ptr tab,
                       struct sil_cuda_weight *g, struct sil_cuda_weight *u,
                       struct sil_cuda_weight *d)
{
    const int n_slot = (int)b->es.n;
    g->host = sil_cuda_slots_host_dev(&b->es, pl->gate_exps->data);
    u->host = sil_cuda_slots_host_dev(&b->es, pl->up_exps->data);
    d->host = sil_cuda_slots_host_dev(&b->es, pl->down_exps->data);
    g->host_stride = pl->gate_exps->mat_bytes;
    u->host_stride = pl->up_exps->mat_bytes;
    d->host_stride = pl->down_exps->mat_bytes;
    g->tab = u->tab = d->tab = tab;
    g->n_slot = u->n_slot = d->n_slot = n_slot;
    if (g->host && u->host && d->host) return true;
    fail(b, -EINVAL, "routed experts outside the pinned mapping");
    return false;
}

/* Quantized experts: the fused kernels over the stacked tensors, 8 rows at a time, into
 * b->routed; with the shared expert fused (true returned), the whole MoE output into out. */
static bool moe_fused(struct cuda_backend *b, struct sil_act x, const struct sil_moe_plan *pl,
                      int X, struct sil_act out)
{
    const int K = pl->n_used;
    const int64_t E = x.width;
    const bool sh = shared_fusable(b, pl, E);
    /* path (b): the router's expert ids stay as they are, the kernels look them up */
    const bool zc = b->es.n > 0 && pl->device_routed && b->zc_pass;
    const sil_cuda_ptr ids0 = zc ? zc_ids_of(b, pl->layer) : b->ids;
    struct sil_cuda_weight g = {0}, u = {0}, d = {0}, sg, su, sd;
    if (b->es.n > 0) {
        /* the slot pools as stacks of n_slots matrices, b->ids holding slot numbers */
        const int64_t F = pl->gate_exps->rows, R = pl->down_exps->rows;
        if (!ok(b,
                sil_cuda_weight_view(pl->gate_exps->type, F * X, E, b->es.pool_g, &g, &b->err)) ||
            !ok(b, sil_cuda_weight_view(pl->up_exps->type, F * X, E, b->es.pool_u, &u, &b->err)) ||
            !ok(b, sil_cuda_weight_view(pl->down_exps->type, R * X, pl->down_exps->cols,
                                        b->es.pool_d, &d, &b->err)))
            return false;
        g.mat_stride = b->es.slot_g;
        u.mat_stride = b->es.slot_u;
        d.mat_stride = b->es.slot_d;
        /* path (b): slots where the table says, the mapping in place elsewhere */
        if (zc && !host_views(b, pl, b->es.tab + (uint64_t)pl->layer * (uint64_t)X * 4, &g, &u,
                              &d))
            return false;
    } else if (!ok(b, sil_cb_view(pl->gate_exps, pl->gate_exps->rows * X, &g, &b->err)) ||
               !ok(b, sil_cb_view(pl->up_exps, pl->up_exps->rows * X, &u, &b->err)) ||
               !ok(b, sil_cb_view(pl->down_exps, pl->down_exps->rows * X, &d, &b->err)))
        return false;
    if (sh && (!ok(b, sil_cb_view(pl->sh_gate, pl->sh_gate->rows, &sg, &b->err)) ||
               !ok(b, sil_cb_view(pl->sh_up, pl->sh_up->rows, &su, &b->err)) ||
               !ok(b, sil_cb_view(pl->sh_down, pl->sh_down->rows, &sd, &b->err))))
        return false;
    const int64_t F = pl->gate_exps->rows, K1 = sh ? K + 1 : K;
    for (int64_t r0 = 0; r0 < x.rows && b->rc == 0; r0 += MB) {
        const int n = (int)(x.rows - r0 < MB ? x.rows - r0 : MB);
        const sil_cuda_ptr xp = dp(x.data) + (uint64_t)(r0 * E) * 4;
        const sil_cuda_ptr ids = ids0 + (uint64_t)(r0 * K) * 4,
                           w = b->wts + (uint64_t)(r0 * K) * 4;
        const sil_cuda_ptr lg = b->sh_logit + (uint64_t)r0 * 4;
        if (!sil_cb_have_q8(b, xp, n, E)) return sh;
        /* the hidden rows' q8 by gate/up's last block of each row, or a launch of its own;
         * decode only: a prefill's chunks ran 8% slower fused (resident 35B shape, pp512) */
        const bool hq = !b->no_h8_fuse && b->moe_done && F % 32 == 0 && x.rows <= MB;
        const sil_cuda_ptr h8 = hq ? b->q8h : 0, done = hq ? b->moe_done : 0;
        const int rc =
            sh ? sil_cuda_moe_gate_up_shared(b->cu, &g, &u, &sg, &su, X, b->q8, n, ids, K, xp,
                                             dp(pl->sh_gate_inp->data), lg, b->h_gate, h8, done,
                                             NULL, &b->err)
               : sil_cuda_moe_gate_up(b->cu, &g, &u, X, b->q8, n, ids, K, b->h_gate, h8, done, NULL,
                                      &b->err);
        if (!ok(b, rc) || (!hq && !ok(b, sil_cuda_quantize_q8(b->cu, b->h_gate, (int64_t)n * K1, F,
                                                              b->q8h, NULL, &b->err))))
            return sh;
        if (sh)
            ok(b, sil_cuda_moe_down_shared(b->cu, &d, &sd, X, b->q8h, n, ids, w, lg, K,
                                           dp(out.data) + (uint64_t)(r0 * E) * 4, NULL, &b->err));
        else
            ok(b, sil_cuda_moe_down(b->cu, &d, X, b->q8h, n, ids, w, K,
                                    b->routed + (uint64_t)(r0 * E) * 4, NULL, &b->err));
    }
    return sh;
}

/* Any type: per active expert, its rows gathered, matvecs, then the weighted sum per row. */
static void moe_generic(struct cuda_backend *b, struct sil_act x, const struct sil_moe_plan *pl)
{
    const int K = pl->n_used;
    const int64_t E = x.width, P = (int64_t)pl->n_rows * K;
    const int64_t F = pl->gate[0].rows;
    for (int64_t q = 0; q < P; q++)
        b->tmp[q] = pl->pair_row[q];
    if (!ok(b, sil_cuda_upload(b->cu, b->pair_row, b->tmp, sizeof(int32_t) * (size_t)P, NULL,
                               &b->err)) ||
        !ok(b, sil_cuda_upload(b->cu, b->pair_of, pl->pair_of, sizeof(int32_t) * (size_t)P, NULL,
                               &b->err)))
        return;
    const sil_cuda_ptr xp = dp(x.data);
    for (int a = 0; a < pl->n_active && b->rc == 0; a++) {
        for (int32_t j0 = pl->pair_start[a]; j0 < pl->pair_start[a + 1] && b->rc == 0; j0 += MB) {
            const int32_t cnt = pl->pair_start[a + 1] - j0 < MB ? pl->pair_start[a + 1] - j0 : MB;
            if (!ok(b, sil_cuda_fwd_gather_rows(b->cu, b->fwd, b->x_g, E, xp, E,
                                                b->pair_row + (uint64_t)j0 * 4, E, cnt, NULL,
                                                &b->err)))
                return;
            const struct sil_mm_out gu[] = {
                {&pl->gate[a],
                 {(void *)(uintptr_t)(b->h_gate + (uint64_t)(j0 * F) * 4), cnt, F, F}},
                {&pl->up[a], {(void *)(uintptr_t)(b->h_up + (uint64_t)(j0 * F) * 4), cnt, F, F}},
            };
            sil_cb_mm_chunks(b, (struct sil_act){(void *)(uintptr_t)b->x_g, cnt, E, E}, gu, 2);
        }
    }
    if (b->rc ||
        !ok(b, sil_cuda_swiglu(b->cu, b->h_gate, b->h_gate, b->h_up, P * F, NULL, &b->err)))
        return;
    for (int a = 0; a < pl->n_active && b->rc == 0; a++) {
        const int32_t j0 = pl->pair_start[a], cnt = pl->pair_start[a + 1] - j0;
        const struct sil_mm_out d = {
            &pl->down[a], {(void *)(uintptr_t)(b->d_pair + (uint64_t)(j0 * E) * 4), cnt, E, E}};
        sil_cb_mm_chunks(
            b, (struct sil_act){(void *)(uintptr_t)(b->h_gate + (uint64_t)(j0 * F) * 4), cnt, F, F},
            &d, 1);
    }
    if (b->rc) return;
    ok(b, sil_cuda_fwd_moe_combine(b->cu, b->fwd, b->routed, E, b->d_pair, b->pair_of, b->wts, K,
                                   E, pl->n_rows, NULL, &b->err));
}

/* Prefill (more rows than a decode batch), quantized experts: each active expert's matrices
 * read once for all its rows, on tensor cores. Rows are gathered in pair order (grouped by
 * expert), quantized once, multiplied by their expert's gate and up, silu-gated, quantized, by
 * down, then summed per row with the router's weights. slots: the plan's experts are in slots
 * (their handles name them) and the pools stand for the stacks. */
static void moe_grouped(struct cuda_backend *b, struct sil_act x, const struct sil_moe_plan *pl,
                        bool slots)
{
    const int K = pl->n_used, A = pl->n_active, X = (int)b->c.n_expert; /* grp's layout */
    const int64_t E = x.width, P = (int64_t)pl->n_rows * K, F = pl->gate_exps->rows;
    int32_t max_rows = 0;
    for (int a = 0; a < A; a++) {
        const int32_t c = pl->pair_start[a + 1] - pl->pair_start[a];
        if (c > max_rows) max_rows = c;
    }
    for (int64_t q = 0; q < P; q++)
        b->tmp[q] = pl->pair_row[q];
    /* slot experts: each active expert's matrices are its slot in the pools */
    for (int a = 0; slots && a < A; a++)
        b->tmp[P + a] = (int32_t)(uintptr_t)pl->gate[a].data;
    if (!ok(b, sil_cuda_upload(b->cu, b->pair_row, b->tmp, sizeof(int32_t) * (size_t)P, NULL,
                               &b->err)) ||
        !ok(b, sil_cuda_upload(b->cu, b->pair_of, pl->pair_of, sizeof(int32_t) * (size_t)P, NULL,
                               &b->err)) ||
        !ok(b, sil_cuda_upload(b->cu, b->grp, slots ? b->tmp + P : pl->expert,
                               sizeof(int32_t) * (size_t)A, NULL, &b->err)) ||
        !ok(b, sil_cuda_upload(b->cu, b->grp + (uint64_t)X * 4, pl->pair_start,
                               sizeof(int32_t) * (size_t)(A + 1), NULL, &b->err)))
        return;
    struct sil_cuda_weight g, u, d;
    size_t sg = pl->gate_exps->mat_bytes, su = pl->up_exps->mat_bytes,
           sd = pl->down_exps->mat_bytes;
    if (slots) {
        const int64_t R = pl->down_exps->rows;
        if (!ok(b, sil_cuda_weight_view(pl->gate_exps->type, F, E, b->es.pool_g, &g, &b->err)) ||
            !ok(b, sil_cuda_weight_view(pl->up_exps->type, F, E, b->es.pool_u, &u, &b->err)) ||
            !ok(b, sil_cuda_weight_view(pl->down_exps->type, R, pl->down_exps->cols, b->es.pool_d,
                                        &d, &b->err)))
            return;
        sg = b->es.slot_g;
        su = b->es.slot_u;
        sd = b->es.slot_d;
    } else if (!ok(b, sil_cb_view(pl->gate_exps, F, &g, &b->err)) ||
               !ok(b, sil_cb_view(pl->up_exps, F, &u, &b->err)) ||
               !ok(b, sil_cb_view(pl->down_exps, pl->down_exps->rows, &d, &b->err)))
        return;
    const sil_cuda_ptr xg = b->x_pair;
    const sil_cuda_ptr gm = b->grp, gs = b->grp + (uint64_t)X * 4;
    if (!ok(b, sil_cuda_fwd_gather_rows(b->cu, b->fwd, xg, E, dp(x.data), E, b->pair_row, E, P,
                                        NULL, &b->err)) ||
        !ok(b, sil_cuda_quantize_q8(b->cu, xg, P, E, b->q8p, NULL, &b->err)) ||
        !ok(b, sil_cuda_matmul_grouped(b->cu, &g, sg, b->q8p, (int)P, gm, gs, A, max_rows,
                                       b->h_gate, F, NULL, &b->err)) ||
        !ok(b, sil_cuda_matmul_grouped(b->cu, &u, su, b->q8p, (int)P, gm, gs, A, max_rows, b->h_up,
                                       F, NULL, &b->err)) ||
        !ok(b, sil_cuda_swiglu(b->cu, b->h_gate, b->h_gate, b->h_up, P * F, NULL, &b->err)) ||
        !ok(b, sil_cuda_quantize_q8(b->cu, b->h_gate, P, F, b->q8p, NULL, &b->err)) ||
        !ok(b, sil_cuda_matmul_grouped(b->cu, &d, sd, b->q8p, (int)P, gm, gs, A, max_rows,
                                       b->d_pair, E, NULL, &b->err)))
        return;
    ok(b, sil_cuda_fwd_moe_combine(b->cu, b->fwd, b->routed, E, b->d_pair, b->pair_of, b->wts, K,
                                   E, pl->n_rows, NULL, &b->err));
}

/* Slot experts (the plan's handles name slots): their slot numbers per (row, k) replace the
 * router's expert ids on the device, and the fused kernels run over the slot pools. */
static void moe_slots(struct cuda_backend *b, struct sil_act x, const struct sil_moe_plan *pl,
                      struct sil_act out)
{
    const int K = pl->n_used;
    const int64_t P = (int64_t)pl->n_rows * K;
    /* path (c): experts left in the mapping are the host's (tmp -1) in a decode step */
    const bool cpu =
        b->hx && pl->n_rows <= MB &&
        sil_cb_fused_types(pl->gate_exps, pl->up_exps, pl->down_exps, pl->n_used);
    /* per pair, tmp holds the slot (>= 0) or -1 (the host's) */
    int32_t any_slot = -1, n_host = 0;
    for (int a = 0; a < pl->n_active; a++) {
        const bool slot_e = pl->gate[a].loc == SIL_WEIGHT_SLOT &&
                            pl->up[a].loc == SIL_WEIGHT_SLOT && pl->down[a].loc == SIL_WEIGHT_SLOT;
        const bool host_e =
            cpu && on_host(&pl->gate[a]) && on_host(&pl->up[a]) && on_host(&pl->down[a]);
        if (!slot_e && !host_e) {
            fail(b, -ENOSPC,
                 b->hx && pl->n_rows <= MB
                     ? "misses on the CPU need quantized experts whose gate and up share a type"
                     : "a layer needs more experts at once than the expert slots hold "
                       "(raise --vram-budget or evaluate fewer rows at a time)");
            return;
        }
        const int32_t slot = slot_e ? (int32_t)(uintptr_t)pl->gate[a].data : -1;
        if (slot_e) any_slot = slot;
        n_host += !slot_e;
        for (int32_t j = pl->pair_start[a]; j < pl->pair_start[a + 1]; j++)
            b->tmp[j] = slot;
    }
    if (!sil_cb_fused_types(pl->gate_exps, pl->up_exps, pl->down_exps, pl->n_used)) {
        /* no fused kernel for these experts (float, or more a token than down's slots): the
         * per-expert path on views of their slots
         * (it uploads its pairs from the host: never part of a graph) */
        if (b->mode != PASS_EAGER) {
            fail(b, -EINVAL, "unfused experts in slots inside a graph");
            return;
        }
        not_capturable(b);
        b->segmented = false;
        b->seg_gap = false;
        for (int a = 0; a < pl->n_active; a++) {
            const uint64_t slot = (uint64_t)(uintptr_t)pl->gate[a].data;
            pl->gate[a].loc = pl->up[a].loc = pl->down[a].loc = SIL_WEIGHT_DEVICE;
            pl->gate[a].data = (const void *)(uintptr_t)(b->es.pool_g + slot * b->es.slot_g);
            pl->up[a].data = (const void *)(uintptr_t)(b->es.pool_u + slot * b->es.slot_u);
            pl->down[a].data = (const void *)(uintptr_t)(b->es.pool_d + slot * b->es.slot_d);
        }
        moe_generic(b, x, pl);
        if (b->rc == 0) shared_and_sum(b, x, pl, out);
        return;
    }
    /* prefill (unless SIL_CUDA_GROUPED=0): grouped products over the slot pools, each expert
     * read once, as everything resident does (the same kernels on the same bytes) */
    if (!cpu && !b->no_grouped && pl->n_rows > MB && n_host == 0) {
        if (b->rc == 0) moe_grouped(b, x, pl, true);
        if (b->rc == 0) shared_and_sum(b, x, pl, out);
        return;
    }
    /* the host's pairs keep a valid slot (the pools start zeroed) with weight 0 on the device */
    int n_jobs = 0;
    for (int64_t q = 0; q < P; q++) {
        const int32_t pair = pl->pair_of[q], slot = b->tmp[pair];
        b->slot_ids[q] = slot >= 0 ? slot : any_slot >= 0 ? any_slot : 0;
        if (!n_host) continue;
        b->h_wts[q] = slot >= 0 ? pl->sel_weight[q] : 0.0f;
        if (slot >= 0) continue;
        int a = 0;
        while (a + 1 < pl->n_active && pl->pair_start[a + 1] <= pair)
            a++;
        b->jobs[n_jobs++] = (struct sil_host_expert_job){(int32_t)(q / K), pl->sel_weight[q],
                                                         &pl->gate[a], &pl->up[a], &pl->down[a]};
    }
    if (!ok(b, sil_cuda_upload(b->cu, b->ids, b->slot_ids, sizeof(int32_t) * (size_t)P, NULL,
                               &b->err)))
        return;
    if (n_host &&
        !ok(b, sil_cuda_upload(b->cu, b->wts, b->h_wts, sizeof(float) * (size_t)P, NULL, &b->err)))
        return;
    sil_cb_seg_begin(b);
    if (b->mode != PASS_REPLAY) {
        if (b->rc) return;
        if (!moe_fused(b, x, pl, b->es.n, out) && b->rc == 0) shared_and_sum(b, x, pl, out);
    }
    if (!cpu || b->rc) return;
    /* path (c): the device part runs (the segment is cut here in every decode pass, so the
     * segments stay the same whatever the host gets) while the host computes its experts */
    sil_cb_seg_end(b);
    if (n_jobs > 0) {
        const int64_t E = out.width;
        struct sil_error e = {0};
        if (sil_host_experts_run(b->hx, b->h_x, pl->n_rows, b->jobs, n_jobs, b->h_y, &e) < 0) {
            b->rc = e.code ? e.code : -EIO;
            b->err = e;
            return;
        }
        atomic_fetch_add_explicit(&b->host_experts, (uint64_t)n_host, memory_order_relaxed);
        if (out.ld != E) {
            fail(b, -EINVAL, "moe rows are not contiguous");
            return;
        }
        ok(b, sil_cuda_upload(b->cu, b->cpu_y, b->h_y, sizeof(float) * (size_t)(pl->n_rows * E),
                              NULL, &b->err));
        if (b->rc == 0)
            ok(b, sil_cuda_add(b->cu, dp(out.data), b->cpu_y, pl->n_rows * E, NULL, &b->err));
        b->q8_src = 0;
    }
    sil_cb_seg_begin(b);
}

void sil_cb_moe(struct sil_backend *be, struct sil_act x, const struct sil_moe_plan *pl,
                struct sil_act out)
{
    struct cuda_backend *b = cb(be);
    if (b->seg_gap) {
        /* a segmented pass: slot ids up, then the next segment starts with these experts */
        if (b->rc == 0 && x.rows > 0 && pl->n_active > 0 && b->es.n > 0)
            moe_slots(b, x, pl, out);
        else
            sil_cb_seg_begin(b);
        return;
    }
    if (b->mode == PASS_REPLAY) return;
    if (b->rc || x.rows == 0 || (pl->n_active == 0 && !pl->device_routed)) return;
    if (x.ld != x.width || out.ld != out.width) {
        fail(b, -EINVAL, "moe rows are not contiguous");
        return;
    }
    if (pl->n_active > 0 && b->es.n > 0) {
        moe_slots(b, x, pl, out);
        return;
    }
    const int X = (int)b->c.n_expert;
    const bool stacked = pl->gate_exps && pl->gate_exps->loc == SIL_WEIGHT_DEVICE &&
                         pl->up_exps->loc == SIL_WEIGHT_DEVICE &&
                         pl->down_exps->loc == SIL_WEIGHT_DEVICE;
    const bool fused =
        stacked && sil_cb_fused_types(pl->gate_exps, pl->up_exps, pl->down_exps, pl->n_used);
    if (fused && !pl->device_routed && x.rows > MB && pl->gate_exps->n_mat == X && !b->no_grouped)
        moe_grouped(b, x, pl, false);
    else if (pl->device_routed || fused) {
        if (moe_fused(b, x, pl, X, out)) return; /* the shared expert is in */
    } else
        moe_generic(b, x, pl);
    if (b->rc == 0) shared_and_sum(b, x, pl, out);
}

#endif
