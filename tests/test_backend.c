/* The CPU backend's ops (backend.h) against direct double-precision formulas on small F32
 * weights: matmul into several outputs, row ops, router top-k (ties to the lower id, the
 * normalisation), MoE over a hand-built expert plan with and without the shared expert, the
 * output head's row placement and argmax; and results that do not depend on the thread count.
 * These are the checks a device backend's ops are held to against this one. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine/backend.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quants.h"
#include "tests/testutil.h"

enum { E = 5, F = 4, S = 3, X = 4, K = 2, N = 3, V = 6 };

static void fill(float *x, int n, float scale, uint32_t seed)
{
    uint32_t s = seed;
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f * 2.0f - 1.0f) * scale;
    }
}

static struct sil_weight f32_weight(const float *w, int64_t rows, int64_t cols, int64_t n_mat)
{
    return (struct sil_weight){.type = SIL_TYPE_F32,
                               .rows = rows,
                               .cols = cols,
                               .n_mat = n_mat,
                               .mat_bytes = (size_t)(rows * cols) * sizeof(float),
                               .loc = SIL_WEIGHT_HOST,
                               .data = w};
}

/* profile: the per-op profile's file (NULL: none) */
static struct sil_backend *open_cpu_prof(int n_threads, const char *profile)
{
    struct sil_cpu_config c = {.n_threads = n_threads,
                               .profile = profile,
                               .k_max = 8,
                               .ub_max = 8,
                               .n_ctx = 16,
                               .n_embd = E,
                               .n_expert = X,
                               .n_expert_used = K,
                               .n_ff_exp = F,
                               .n_ff_shexp = S,
                               .n_vocab = V};
    struct sil_backend *be = NULL;
    struct sil_error err;
    assert_int_equal(sil_backend_cpu_create(&be, &c, &err), 0);
    return be;
}

static struct sil_backend *open_cpu(int n_threads)
{
    return open_cpu_prof(n_threads, NULL);
}

static struct sil_act act(struct sil_backend *be, int64_t rows, int64_t width)
{
    struct sil_act a = {be->ops->alloc_act(be, (size_t)(rows * width) * sizeof(float)), rows, width,
                        width};
    assert_non_null(a.data);
    return a;
}

static double dot(const float *a, const float *b, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += (double)a[i] * b[i];
    return s;
}

static double silu(double x)
{
    return x / (1.0 + exp(-x));
}

static void test_matmul_and_rows(void **state)
{
    (void)state;
    struct sil_backend *be = open_cpu(2);
    float w1[3 * E], w2[2 * E], xs[N * E], nw[E];
    fill(w1, 3 * E, 1.0f, 1);
    fill(w2, 2 * E, 1.0f, 2);
    fill(xs, N * E, 2.0f, 3);
    fill(nw, E, 1.0f, 4);
    struct sil_weight W1 = f32_weight(w1, 3, E, 1), W2 = f32_weight(w2, 2, E, 1);
    struct sil_act x = act(be, N, E), y1 = act(be, N, 3), y2 = act(be, N, 2);
    memcpy(x.data, xs, sizeof(xs));
    const struct sil_mm_out out[2] = {{&W1, y1}, {&W2, y2}};
    be->ops->matmul(be, x, out, 2);
    for (int i = 0; i < N; i++) {
        for (int r = 0; r < 3; r++)
            assert_true(fabs(((float *)y1.data)[i * 3 + r] - dot(w1 + r * E, xs + i * E, E)) <
                        1e-5);
        for (int r = 0; r < 2; r++)
            assert_true(fabs(((float *)y2.data)[i * 2 + r] - dot(w2 + r * E, xs + i * E, E)) <
                        1e-5);
    }

    /* embedding rows, row gather, rmsnorm, add, swiglu */
    struct sil_weight emb = f32_weight(xs, N, E, 1);
    struct sil_act g = act(be, 2, E), c = act(be, 2, E);
    const int32_t ids[2] = {2, 0};
    be->ops->get_rows(be, &emb, ids, g);
    assert_memory_equal(g.data, xs + 2 * E, sizeof(float) * E);
    assert_memory_equal((float *)g.data + E, xs, sizeof(float) * E);
    const int32_t rows[2] = {1, 1};
    be->ops->copy_rows(be, c, x, rows);
    assert_memory_equal((float *)c.data + E, xs + E, sizeof(float) * E);
    struct sil_weight NW = f32_weight(nw, 1, E, 1);
    be->ops->rmsnorm(be, c, g, &NW, 1e-6f);
    const double scale = 1.0 / sqrt(dot(xs + 2 * E, xs + 2 * E, E) / E + 1e-6);
    for (int j = 0; j < E; j++)
        assert_true(fabs(((float *)c.data)[j] - xs[2 * E + j] * scale * nw[j]) < 1e-5);
    be->ops->add(be, g, sil_act_rows(x, 1, 2)); /* g = x[2] + x[1], x[0] + x[2] */
    for (int j = 0; j < E; j++)
        assert_true(((float *)g.data)[E + j] == xs[j] + xs[2 * E + j]);
    be->ops->swiglu(be, c, g, sil_act_rows(x, 0, 2));
    for (int j = 0; j < 2 * E; j++)
        assert_true(fabs(((float *)c.data)[j] - silu(((float *)g.data)[j]) * xs[j]) < 1e-5);
    be->ops->free(be);
}

/* add_rmsnorm gives the bits of add, then rmsnorm, for a decode step's rows (run by the caller)
 * and for more (the pool) */
static void test_add_rmsnorm(void **state)
{
    (void)state;
    struct sil_backend *be = open_cpu(3);
    enum { R = 20 };
    float nw[E];
    fill(nw, E, 1.0f, 7);
    const struct sil_weight NW = f32_weight(nw, 1, E, 1);
    for (int n = 1; n <= R; n += R - 1) {
        struct sil_act x1 = act(be, n, E), x2 = act(be, n, E), d = act(be, n, E);
        struct sil_act y1 = act(be, n, E), y2 = act(be, n, E);
        fill(x1.data, (int)(n * E), 3.0f, 8);
        fill(d.data, (int)(n * E), 1.0f, 9);
        memcpy(x2.data, x1.data, sizeof(float) * (size_t)(n * E));
        be->ops->add(be, x1, d);
        be->ops->rmsnorm(be, y1, x1, &NW, 1e-6f);
        be->ops->add_rmsnorm(be, y2, x2, d, &NW, 1e-6f);
        assert_memory_equal(x1.data, x2.data, sizeof(float) * (size_t)(n * E));
        assert_memory_equal(y1.data, y2.data, sizeof(float) * (size_t)(n * E));
    }
    be->ops->free(be);
}

/* Router weights picking input column 0, so the router logits are exactly vals. */
static void router_weights(float *w, const float *vals)
{
    memset(w, 0, sizeof(float) * X * E);
    for (int e = 0; e < X; e++)
        w[e * E] = vals[e];
}

static void test_route(void **state)
{
    (void)state;
    struct sil_backend *be = open_cpu(2);
    const float vals[X] = {0.5f, 2.0f, -1.0f, 2.0f};
    float w[X * E];
    router_weights(w, vals);
    struct sil_weight R = f32_weight(w, X, E, 1);
    struct sil_act x = act(be, 1, E);
    ((float *)x.data)[0] = 1.0f;
    int32_t sel[K];
    float sw[K];
    struct sil_moe_plan plan = {.sel_expert = sel, .sel_weight = sw};
    be->ops->route(be, x, &R, K, &plan);
    assert_int_equal(plan.n_rows, 1);
    assert_int_equal(plan.n_used, K);
    assert_int_equal(sel[0], 1); /* the tie between experts 1 and 3 goes to the lower id first */
    assert_int_equal(sel[1], 3);
    assert_true(fabs(sw[0] - 0.5) < 1e-6 && fabs(sw[1] - 0.5) < 1e-6);
    const float vals2[X] = {1.0f, 0.0f, 3.0f, 2.0f};
    router_weights(w, vals2);
    be->ops->route(be, x, &R, K, &plan);
    assert_int_equal(sel[0], 2);
    assert_int_equal(sel[1], 3);
    const double e2 = exp(1.0);
    assert_true(fabs(sw[0] - e2 / (e2 + 1)) < 1e-6 && fabs(sw[1] - 1 / (e2 + 1)) < 1e-6);
    be->ops->free(be);
}

/* add_rmsnorm_route gives the bits of add_rmsnorm, then route: the residual, the normed rows
 * and the router's choices and weights. */
static void test_add_rmsnorm_route(void **state)
{
    (void)state;
    struct sil_backend *be = open_cpu(2);
    float nw[E], w[X * E];
    fill(nw, E, 1.0f, 21);
    fill(w, X * E, 1.0f, 22);
    const struct sil_weight NW = f32_weight(nw, 1, E, 1), R = f32_weight(w, X, E, 1);
    for (int n = 1; n <= N; n += N - 1) {
        struct sil_act x1 = act(be, n, E), x2 = act(be, n, E), d = act(be, n, E);
        struct sil_act y1 = act(be, n, E), y2 = act(be, n, E);
        fill(x1.data, (int)(n * E), 3.0f, 23);
        fill(d.data, (int)(n * E), 1.0f, 24);
        memcpy(x2.data, x1.data, sizeof(float) * (size_t)(n * E));
        int32_t sel1[N * K], sel2[N * K];
        float sw1[N * K], sw2[N * K];
        struct sil_moe_plan p1 = {.sel_expert = sel1, .sel_weight = sw1};
        struct sil_moe_plan p2 = {.sel_expert = sel2, .sel_weight = sw2};
        be->ops->add_rmsnorm(be, y1, x1, d, &NW, 1e-6f);
        be->ops->route(be, y1, &R, K, &p1);
        be->ops->add_rmsnorm_route(be, y2, x2, d, &NW, 1e-6f, &R, K, &p2);
        assert_memory_equal(x1.data, x2.data, sizeof(float) * (size_t)(n * E));
        assert_memory_equal(y1.data, y2.data, sizeof(float) * (size_t)(n * E));
        assert_int_equal(p2.n_rows, n);
        assert_memory_equal(sel1, sel2, sizeof(int32_t) * (size_t)(n * K));
        assert_memory_equal(sw1, sw2, sizeof(float) * (size_t)(n * K));
    }
    be->ops->free(be);
}

struct moe_fixture {
    float gate[X * F * E], up[X * F * E], down[X * E * F];
    float sg[S * E], su[S * E], sd[E * S], sgi[E];
    float xs[N * E];
    int32_t sel[N * K];
    float sw[N * K];
};

static void moe_fixture_fill(struct moe_fixture *m)
{
    fill(m->gate, X * F * E, 1.0f, 11);
    fill(m->up, X * F * E, 1.0f, 12);
    fill(m->down, X * E * F, 1.0f, 13);
    fill(m->sg, S * E, 1.0f, 14);
    fill(m->su, S * E, 1.0f, 15);
    fill(m->sd, E * S, 1.0f, 16);
    fill(m->sgi, E, 1.0f, 17);
    fill(m->xs, N * E, 1.5f, 18);
    /* rows 0 and 2 share expert 3; expert 1 has no row */
    const int32_t sel[N * K] = {3, 0, 2, 0, 3, 2};
    const float sw[N * K] = {0.7f, 0.3f, 0.6f, 0.4f, 0.55f, 0.45f};
    memcpy(m->sel, sel, sizeof(sel));
    memcpy(m->sw, sw, sizeof(sw));
}

/* out of one FFN on row x: down (silu(gate x) * up x), gate/up [f][E], down [E][f] */
static void ffn_ref(const float *g, const float *u, const float *d, int f, const float *x,
                    double *y)
{
    double h[8];
    for (int r = 0; r < f; r++)
        h[r] = silu(dot(g + r * E, x, E)) * dot(u + r * E, x, E);
    for (int j = 0; j < E; j++) {
        y[j] = 0;
        for (int r = 0; r < f; r++)
            y[j] += d[j * f + r] * h[r];
    }
}

/* The plan as forward_ffn.c builds it: pairs grouped by expert in ascending id. */
static void build_plan(struct sil_moe_plan *p, const struct moe_fixture *m,
                       const struct sil_weight *G, const struct sil_weight *U,
                       const struct sil_weight *D, int32_t *expert, int32_t *start,
                       int32_t *pair_row, int32_t *pair_of, struct sil_weight *hg,
                       struct sil_weight *hu, struct sil_weight *hd)
{
    p->n_rows = N;
    p->n_used = K;
    p->sel_expert = (int32_t *)m->sel;
    p->sel_weight = (float *)m->sw;
    p->expert = expert;
    p->pair_start = start;
    p->pair_row = pair_row;
    p->pair_of = pair_of;
    p->gate = hg;
    p->up = hu;
    p->down = hd;
    int32_t at = 0;
    p->n_active = 0;
    for (int e = 0; e < X; e++) {
        bool used = false;
        for (int q = 0; q < N * K; q++) {
            if (m->sel[q] != e) continue;
            if (!used) {
                expert[p->n_active] = e;
                start[p->n_active] = at;
                hg[p->n_active] = sil_weight_mat(G, e);
                hu[p->n_active] = sil_weight_mat(U, e);
                hd[p->n_active] = sil_weight_mat(D, e);
                p->n_active++;
                used = true;
            }
            pair_row[at] = q / K;
            pair_of[q] = at++;
        }
    }
    start[p->n_active] = at;
}

static void run_moe(int n_threads, bool shared, float *result)
{
    static struct moe_fixture m;
    moe_fixture_fill(&m);
    struct sil_backend *be = open_cpu(n_threads);
    struct sil_weight G = f32_weight(m.gate, F, E, X), U = f32_weight(m.up, F, E, X),
                      D = f32_weight(m.down, E, F, X);
    struct sil_weight SG = f32_weight(m.sg, S, E, 1), SU = f32_weight(m.su, S, E, 1),
                      SD = f32_weight(m.sd, E, S, 1), SGI = f32_weight(m.sgi, 1, E, 1);
    int32_t expert[X], start[X + 1], pair_row[N * K], pair_of[N * K];
    struct sil_weight hg[X], hu[X], hd[X];
    struct sil_moe_plan p;
    build_plan(&p, &m, &G, &U, &D, expert, start, pair_row, pair_of, hg, hu, hd);
    assert_int_equal(p.n_active, 3);
    p.sh_gate_inp = shared ? &SGI : NULL;
    p.sh_gate = shared ? &SG : NULL;
    p.sh_up = shared ? &SU : NULL;
    p.sh_down = shared ? &SD : NULL;
    struct sil_act x = act(be, N, E), out = act(be, N, E);
    memcpy(x.data, m.xs, sizeof(m.xs));
    be->ops->moe(be, x, &p, out);
    memcpy(result, out.data, sizeof(float) * N * E);

    for (int i = 0; i < N; i++) {
        double ref[E] = {0}, y[E];
        for (int k = 0; k < K; k++) {
            const int e = m.sel[i * K + k];
            ffn_ref(m.gate + e * F * E, m.up + e * F * E, m.down + e * E * F, F, m.xs + i * E, y);
            for (int j = 0; j < E; j++)
                ref[j] += m.sw[i * K + k] * y[j];
        }
        if (shared) {
            ffn_ref(m.sg, m.su, m.sd, S, m.xs + i * E, y);
            const double g = 1.0 / (1.0 + exp(-dot(m.sgi, m.xs + i * E, E)));
            for (int j = 0; j < E; j++)
                ref[j] += g * y[j];
        }
        for (int j = 0; j < E; j++)
            assert_true(fabs(result[i * E + j] - ref[j]) < 1e-4);
    }
    be->ops->free(be);
}

static void test_moe(void **state)
{
    (void)state;
    float a[N * E], b[N * E];
    run_moe(1, true, a);
    run_moe(3, true, b);
    assert_memory_equal(a, b, sizeof(a)); /* the thread count changes nothing */
    run_moe(2, false, a);
}

static void test_head_argmax(void **state)
{
    (void)state;
    struct sil_backend *be = open_cpu(2);
    float w[V * E] = {0};
    const float col0[V] = {0.1f, 0.9f, 0.3f, 0.9f, -2.0f, 0.5f};
    for (int v = 0; v < V; v++)
        w[v * E] = col0[v];
    struct sil_weight H = f32_weight(w, V, E, 1);
    struct sil_act x = act(be, 2, E);
    float *xs = x.data;
    xs[0] = 1.0f;  /* row 0: logits = col0, argmax 1 (tie with 3 goes to the lower id) */
    xs[E] = -1.0f; /* row 1: logits = -col0, argmax 4 */
    float logits[2 * V];
    const int32_t out_rows[2] = {1, 0};
    int32_t am[2];
    be->ops->head(be, x, &H, out_rows, logits, am);
    for (int v = 0; v < V; v++) {
        assert_true(logits[V + v] == col0[v]); /* row 0 went to logits row 1 */
        assert_true(logits[v] == -col0[v]);
    }
    assert_int_equal(am[1], 1); /* argmax goes by out_rows too */
    assert_int_equal(am[0], 4);
    /* argmax alone (no logits buffer), more rows than the backend's scratch holds at once */
    struct sil_act x10 = act(be, 10, E);
    float *x10s = x10.data;
    memset(x10s, 0, sizeof(float) * 10 * E);
    for (int r = 0; r < 10; r++)
        x10s[r * E] = r % 2 ? -1.0f : 1.0f;
    const int32_t out10[10] = {9, 8, 7, 6, 5, 4, 3, 2, 1, 0};
    int32_t am10[10] = {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
    be->ops->head(be, x10, &H, out10, NULL, am10);
    for (int r = 0; r < 10; r++)
        assert_int_equal(am10[out10[r]], r % 2 ? 4 : 1);
    be->ops->free(be);
}

/* Attention over a long context. Past 512 positions a row attends in splits of 512 positions
 * merged in order: a row gives the same bits as one of a pass of 32 rows (each thread takes
 * the splits of a group of rows and heads one after another) and alone (the pool takes the
 * (head, split) items), with 2 threads or 1; and the result is a double-precision softmax of
 * the normed and rotated q against the cached K and V. 4 query heads over 2 KV heads of 32,
 * plain and gated. */
#define AQ 4
#define AKV 2
#define AHD 32
#define ACTX 2048

static void attn_rows(struct sil_backend *be, struct sil_kv_cache *kv, bool gated, int32_t p0,
                      int32_t n, struct sil_act q, struct sil_act k, struct sil_act v,
                      struct sil_act o)
{
    const int qw = AQ * AHD * (gated ? 2 : 1);
    static float ones[AHD];
    for (int j = 0; j < AHD; j++)
        ones[j] = 1.0f;
    const struct sil_weight nw = f32_weight(ones, 1, AHD, 1);
    int32_t pos[32], seq[32] = {0}, run[2] = {0, n};
    for (int32_t i = 0; i < n; i++) {
        pos[i] = p0 + i;
        fill((float *)q.data + i * qw, qw, 1.0f, 1000 + (uint32_t)pos[i]);
        fill((float *)k.data + i * AKV * AHD, AKV * AHD, 1.0f, 5000 + (uint32_t)pos[i]);
        fill((float *)v.data + i * AKV * AHD, AKV * AHD, 1.0f, 9000 + (uint32_t)pos[i]);
    }
    struct sil_error err = {0};
    assert_int_equal(sil_kv_seq_reserve(kv, 0, p0 + n, &err), 0);
    const struct sil_ubatch ub = {.n = n, .pos = pos, .seq = seq, .n_runs = 1, .run_start = run,
                                  .kv = kv};
    const struct sil_attn_args a = {.n_head = AQ,
                                    .n_head_kv = AKV,
                                    .head_dim = AHD,
                                    .n_rot = AHD,
                                    .rope_freq_base = 10000.0f,
                                    .eps = 1e-6f,
                                    .gated = gated,
                                    .q_norm = &nw,
                                    .k_norm = &nw,
                                    .kv = kv,
                                    .layer = 0,
                                    .q = sil_act_rows(q, 0, n),
                                    .k = sil_act_rows(k, 0, n),
                                    .v = sil_act_rows(v, 0, n),
                                    .o = sil_act_rows(o, 0, n)};
    be->ops->attention(be, &ub, &a);
}

static void test_attention_split(void **state)
{
    (void)state;
    for (int gated = 0; gated < 2; gated++) {
        const int qw = AQ * AHD * (gated ? 2 : 1);
        const struct sil_kv_config kc = {.n_layer = 1,
                                         .n_seq_max = 1,
                                         .n_ctx = ACTX,
                                         .n_embd_k = AKV * AHD,
                                         .n_embd_v = AKV * AHD,
                                         .head_dim = AHD,
                                         .type = SIL_KV_F32};
        struct sil_kv_cache *kv = NULL;
        struct sil_error err = {0};
        assert_int_equal(sil_kv_create(&kv, &kc, &err), 0);
        struct sil_cpu_config c = {.n_threads = 2, .k_max = 8, .ub_max = 32, .n_ctx = ACTX,
                                   .head_dim = AHD};
        struct sil_backend *be = NULL, *be1 = NULL;
        assert_int_equal(sil_backend_cpu_create(&be, &c, &err), 0);
        c.n_threads = 1;
        assert_int_equal(sil_backend_cpu_create(&be1, &c, &err), 0);
        struct sil_act q = act(be, 32, qw), k = act(be, 32, AKV * AHD), v = act(be, 32, AKV * AHD);
        struct sil_act o = act(be, 32, AQ * AHD);
        const int32_t P = 1472; /* the rows 1472..1503 attend over 3 splits */
        for (int32_t p0 = 0; p0 < P; p0 += 32)
            attn_rows(be, kv, gated, p0, 32, q, k, v, o);
        static float batch[32 * AQ * AHD], qn[32 * 2 * AQ * AHD];
        attn_rows(be, kv, gated, P, 32, q, k, v, o);
        memcpy(batch, o.data, sizeof(batch));
        memcpy(qn, q.data, sizeof(float) * (size_t)(32 * qw)); /* normed and rotated */
        for (int32_t i = 24; i < 32; i++) /* the same rows one at a time, 2 threads and 1 */
            for (int b = 0; b < 2; b++) {
                attn_rows(b ? be1 : be, kv, gated, P + i, 1, q, k, v, o);
                if (memcmp(o.data, batch + i * AQ * AHD, sizeof(float) * AQ * AHD))
                    fail_msg("gated %d: row %d alone (%d threads) differs from the batch", gated,
                             P + i, 2 - b);
            }
        /* row 1503 against double precision */
        const int32_t pos = P + 31;
        const float *qr = qn + 31 * qw;
        double worst = 0.0;
        for (int h = 0; h < AQ; h++) {
            const float *qh = qr + h * AHD * (gated ? 2 : 1);
            const int kvh = h / (AQ / AKV);
            double *sc = malloc(sizeof(double) * (size_t)(pos + 1)), mx = -INFINITY, sum = 0.0;
            for (int32_t t = 0; t <= pos; t++) {
                const float *kr = (const float *)sil_kv_k(kv, 0, 0, t) + kvh * AHD;
                sc[t] = dot(qh, kr, AHD) / sqrt((double)AHD);
                mx = fmax(mx, sc[t]);
            }
            for (int32_t t = 0; t <= pos; t++)
                sum += sc[t] = exp(sc[t] - mx);
            for (int j = 0; j < AHD; j++) {
                double r = 0.0;
                for (int32_t t = 0; t <= pos; t++)
                    r += sc[t] / sum * ((const float *)sil_kv_v(kv, 0, 0, t))[kvh * AHD + j];
                if (gated) r *= 1.0 / (1.0 + exp(-(double)qh[AHD + j]));
                worst = fmax(worst, fabs(r - batch[31 * AQ * AHD + h * AHD + j]));
            }
            free(sc);
        }
        if (worst > 1e-5) fail_msg("gated %d: split attention %g from double precision", gated, worst);
        be->ops->free(be);
        be1->ops->free(be1);
        sil_kv_free(kv);
    }
}

/* The profile (SIL_CPU_PROFILE): passes counted by their rows, each op's calls a pass, written at free */
static void test_profile(void **state)
{
    (void)state;
    char *dir = tu_tmpdir_create();
    assert_non_null(dir);
    char path[4096];
    snprintf(path, sizeof(path), "%s/prof.txt", dir);
    struct sil_backend *be = open_cpu_prof(2, path);
    float xs[N * E], w[V * E];
    fill(xs, N * E, 1.0f, 5);
    fill(w, V * E, 1.0f, 6);
    struct sil_weight emb = f32_weight(xs, N, E, 1), H = f32_weight(w, V, E, 1);
    struct sil_act x = act(be, 2, E), y = act(be, 2, E);
    const int32_t ids[2] = {1, 0}, out_rows[2] = {0, 1};
    float logits[2 * V];
    int32_t am[2];
    for (int pass = 0; pass < 3; pass++) { /* two passes of 2 rows, one of 1 */
        const int n = pass < 2 ? 2 : 1;
        be->ops->get_rows(be, &emb, ids, sil_act_rows(x, 0, n));
        be->ops->add(be, sil_act_rows(y, 0, n), sil_act_rows(x, 0, n));
        be->ops->add(be, sil_act_rows(y, 0, n), sil_act_rows(x, 0, n));
        be->ops->head(be, sil_act_rows(x, 0, n), &H, out_rows, logits, am);
    }
    be->ops->free(be);
    FILE *fp = fopen(path, "r");
    assert_non_null(fp);
    char text[8192];
    const size_t len = fread(text, 1, sizeof(text) - 1, fp);
    fclose(fp);
    text[len] = 0;
    assert_non_null(strstr(text, "# cpu backend profile: 2 threads"));
    const char *r2 = strstr(text, "rows 2: 2 passes"), *r1 = strstr(text, "rows 1: 1 passes");
    assert_non_null(r2);
    assert_non_null(r1);
    assert_true(r1 < r2); /* ascending rows */
    /* within the 2-row section: one get_rows, two adds, one head a pass, no matmul of its own */
    assert_non_null(strstr(r2, "get_rows"));
    const char *add = strstr(r2, "\n  add "), *head = strstr(r2, "\n  head ");
    assert_non_null(add);
    assert_non_null(head);
    const char *two = strstr(add, " 2.0 calls"), *eol = strchr(add + 1, '\n');
    assert_true(two && eol && two < eol); /* on the add line itself */
    assert_null(strstr(r2, "matmul (dense)"));
    assert_non_null(strstr(r2, "between ops"));
    assert_int_equal(tu_tmpdir_remove(dir), 0);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_and_rows),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_route),
        cmocka_unit_test(test_add_rmsnorm_route),
        cmocka_unit_test(test_moe),
        cmocka_unit_test(test_head_argmax),
        cmocka_unit_test(test_attention_split),
        cmocka_unit_test(test_profile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
