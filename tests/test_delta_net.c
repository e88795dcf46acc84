/* Gated delta net: against a naive per-head implementation written from the equations (double
 * precision, state kept transposed as HF keeps it), state carry-over, snapshot/restore, the
 * two-phase (threaded) form, large inputs, and parameter checks. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine/delta_net.h"

struct rng {
    uint64_t s;
};

static double urand(struct rng *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return (double)(r->s >> 11) / 9007199254740992.0;
}

static float uni(struct rng *r, double lo, double hi)
{
    return (float)(lo + (hi - lo) * urand(r));
}

static float gauss(struct rng *r, double sd)
{
    double u = urand(r), v = urand(r);
    return (float)(sd * sqrt(-2.0 * log(u + 1e-300)) * cos(2.0 * M_PI * v));
}

/* A layer: its params and weight storage. */
struct layer {
    struct sil_delta_net_params p;
    float *conv1d, *dt_bias, *a, *norm;
};

static void layer_init(struct layer *L, int nk, int nv, int dk, int dv, int K, uint64_t seed)
{
    struct rng r = { seed };
    memset(L, 0, sizeof *L);
    L->p.n_k_heads = nk;
    L->p.n_v_heads = nv;
    L->p.head_k_dim = dk;
    L->p.head_v_dim = dv;
    L->p.conv_kernel = K;
    L->p.eps = 1e-6f;
    int64_t cd = 2 * (int64_t)nk * dk + (int64_t)nv * dv;
    L->conv1d = malloc(sizeof(float) * (size_t)(cd * K));
    L->dt_bias = malloc(sizeof(float) * (size_t)nv);
    L->a = malloc(sizeof(float) * (size_t)nv);
    L->norm = malloc(sizeof(float) * (size_t)dv);
    assert_non_null(L->conv1d);
    for (int64_t i = 0; i < cd * K; i++)
        L->conv1d[i] = gauss(&r, 0.5);
    for (int h = 0; h < nv; h++) {
        L->dt_bias[h] = uni(&r, -0.5, 1.0);
        L->a[h] = (float)-exp(log(uni(&r, 0.5, 8.0)));
    }
    for (int j = 0; j < dv; j++)
        L->norm[j] = uni(&r, 0.5, 1.5);
    L->p.conv1d = L->conv1d;
    L->p.dt_bias = L->dt_bias;
    L->p.a = L->a;
    L->p.norm = L->norm;
}

static void layer_free(struct layer *L)
{
    free(L->conv1d);
    free(L->dt_bias);
    free(L->a);
    free(L->norm);
}

/* Inputs for n tokens. */
struct inputs {
    int n;
    float *qkv, *z, *alpha, *beta;
};

static void inputs_init(struct inputs *in, const struct sil_delta_net_params *p, int n, double scale,
                        uint64_t seed)
{
    struct rng r = { seed };
    int64_t cd = sil_delta_net_conv_dim(p), ov = (int64_t)p->n_v_heads * p->head_v_dim;
    in->n = n;
    in->qkv = malloc(sizeof(float) * (size_t)(n * cd));
    in->z = malloc(sizeof(float) * (size_t)(n * ov));
    in->alpha = malloc(sizeof(float) * (size_t)(n * p->n_v_heads));
    in->beta = malloc(sizeof(float) * (size_t)(n * p->n_v_heads));
    assert_non_null(in->beta);
    for (int64_t i = 0; i < n * cd; i++)
        in->qkv[i] = gauss(&r, scale);
    for (int64_t i = 0; i < n * ov; i++)
        in->z[i] = gauss(&r, scale);
    for (int64_t i = 0; i < n * p->n_v_heads; i++) {
        in->alpha[i] = gauss(&r, scale);
        in->beta[i] = gauss(&r, scale);
    }
}

static void inputs_free(struct inputs *in)
{
    free(in->qkv);
    free(in->z);
    free(in->alpha);
    free(in->beta);
}

static float *state_new(const struct sil_delta_net_params *p, struct sil_delta_net_state *st)
{
    float *buf = calloc((size_t)sil_delta_net_state_floats(p), sizeof(float));
    assert_non_null(buf);
    sil_delta_net_state_bind(p, st, buf);
    return buf;
}

static void state_random(const struct sil_delta_net_params *p, float *buf, uint64_t seed)
{
    struct rng r = { seed };
    for (int64_t i = 0; i < sil_delta_net_state_floats(p); i++)
        buf[i] = gauss(&r, 0.3);
}

static void run(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                const struct inputs *in, int t0, int n, float *out)
{
    int64_t cd = sil_delta_net_conv_dim(p), ov = (int64_t)p->n_v_heads * p->head_v_dim;
    float *scratch = malloc(sizeof(float) * (size_t)sil_delta_net_scratch_floats(p, n));
    assert_non_null(scratch);
    sil_delta_net_forward(p, st, n, in->qkv + t0 * cd, in->z + t0 * ov, in->alpha + t0 * p->n_v_heads,
                          in->beta + t0 * p->n_v_heads, out + t0 * ov, scratch);
    free(scratch);
}

static double silu_d(double x)
{
    return x / (1.0 + exp(-x));
}

/* Straight from the equations, double precision. M[h][i][j] (i over keys, j over values) is the
 * transpose of the engine's S[h][j][i]. state_buf (engine layout) is read and updated. */
static void naive(const struct sil_delta_net_params *p, float *state_buf, const struct inputs *in,
                  double *out)
{
    const int nk = p->n_k_heads, nv = p->n_v_heads, dk = p->head_k_dim, dv = p->head_v_dim;
    const int K = p->conv_kernel, n = in->n;
    const int cd = 2 * nk * dk + nv * dv;
    const double eps = p->eps;
    /* x_all: K-1 history rows then the n input rows */
    double *xa = calloc((size_t)(K - 1 + n) * cd, sizeof(double));
    double *M = calloc((size_t)nv * dk * dv, sizeof(double));
    double *c = calloc((size_t)cd, sizeof(double));
    double *q = calloc((size_t)dk, sizeof(double)), *k = calloc((size_t)dk, sizeof(double));
    double *o = calloc((size_t)dv, sizeof(double)), *delta = calloc((size_t)dv, sizeof(double));
    assert_non_null(delta);
    const float *conv_st = state_buf;
    const float *ssm_st = state_buf + (K - 1) * cd;
    for (int r = 0; r < K - 1; r++)
        for (int ch = 0; ch < cd; ch++)
            xa[r * cd + ch] = conv_st[r * cd + ch];
    for (int t = 0; t < n; t++)
        for (int ch = 0; ch < cd; ch++)
            xa[(K - 1 + t) * cd + ch] = in->qkv[t * cd + ch];
    for (int h = 0; h < nv; h++)
        for (int j = 0; j < dv; j++)
            for (int i = 0; i < dk; i++)
                M[((size_t)h * dk + i) * dv + j] = ssm_st[((size_t)h * dv + j) * dk + i];

    for (int t = 0; t < n; t++) {
        for (int ch = 0; ch < cd; ch++) {
            double s = 0;
            for (int r = 0; r < K; r++)
                s += (double)p->conv1d[ch * K + r] * xa[(t + r) * cd + ch];
            c[ch] = silu_d(s);
        }
        for (int h = 0; h < nv; h++) {
            int kh = h % nk;
            double nq = 0, nkk = 0;
            for (int i = 0; i < dk; i++) {
                q[i] = c[kh * dk + i];
                k[i] = c[nk * dk + kh * dk + i];
                nq += q[i] * q[i];
                nkk += k[i] * k[i];
            }
            nq = fmax(sqrt(nq), eps);
            nkk = fmax(sqrt(nkk), eps);
            for (int i = 0; i < dk; i++) {
                q[i] = q[i] / nq / sqrt((double)dk);
                k[i] = k[i] / nkk;
            }
            const double *v = c + 2 * nk * dk + h * dv;
            double g = p->a[h] * log1p(exp((double)in->alpha[t * nv + h] + p->dt_bias[h]));
            double b = 1.0 / (1.0 + exp(-(double)in->beta[t * nv + h]));
            double *Mh = M + (size_t)h * dk * dv;
            for (int x = 0; x < dk * dv; x++)
                Mh[x] *= exp(g);
            for (int j = 0; j < dv; j++) {
                double kv = 0;
                for (int i = 0; i < dk; i++)
                    kv += Mh[i * dv + j] * k[i];
                delta[j] = (v[j] - kv) * b;
            }
            for (int i = 0; i < dk; i++)
                for (int j = 0; j < dv; j++)
                    Mh[i * dv + j] += k[i] * delta[j];
            double ms = 0;
            for (int j = 0; j < dv; j++) {
                o[j] = 0;
                for (int i = 0; i < dk; i++)
                    o[j] += Mh[i * dv + j] * q[i];
                ms += o[j] * o[j];
            }
            double rs = 1.0 / sqrt(ms / dv + eps);
            for (int j = 0; j < dv; j++)
                out[(size_t)t * nv * dv + h * dv + j] =
                    o[j] * rs * p->norm[j] * silu_d(in->z[(size_t)t * nv * dv + h * dv + j]);
        }
    }
    /* write the state back in engine layout */
    float *conv_w = state_buf;
    float *ssm_w = state_buf + (K - 1) * cd;
    for (int r = 0; r < K - 1; r++)
        for (int ch = 0; ch < cd; ch++)
            conv_w[r * cd + ch] = (float)xa[(n + r) * cd + ch];
    for (int h = 0; h < nv; h++)
        for (int j = 0; j < dv; j++)
            for (int i = 0; i < dk; i++)
                ssm_w[((size_t)h * dv + j) * dk + i] = (float)M[((size_t)h * dk + i) * dv + j];
    free(xa);
    free(M);
    free(c);
    free(q);
    free(k);
    free(o);
    free(delta);
}

/* One case: engine vs naive from the same (random or zero) initial state. */
static void check_vs_naive(int nk, int nv, int dk, int dv, int K, int n, int random_state,
                           uint64_t seed)
{
    struct layer L;
    layer_init(&L, nk, nv, dk, dv, K, seed);
    struct sil_error err = { 0 };
    assert_int_equal(sil_delta_net_check(&L.p, &err), 0);
    struct inputs in;
    inputs_init(&in, &L.p, n, 1.0, seed * 7 + 1);
    struct sil_delta_net_state st;
    float *buf = state_new(&L.p, &st);
    if (random_state)
        state_random(&L.p, buf, seed + 99);
    int64_t nsf = sil_delta_net_state_floats(&L.p);
    float *ref_state = malloc(sizeof(float) * (size_t)nsf);
    memcpy(ref_state, buf, sizeof(float) * (size_t)nsf);
    int64_t ov = (int64_t)nv * dv;
    float *out = calloc((size_t)(n * ov), sizeof(float));
    double *ref = calloc((size_t)(n * ov), sizeof(double));
    assert_non_null(ref);

    run(&L.p, &st, &in, 0, n, out);
    naive(&L.p, ref_state, &in, ref);

    /* Error relative to the RMS of the (token, head) row: the gated RMSNorm rescales each row,
     * so an element near zero in a large row carries the row's absolute error. Float sums in
     * o = S q cancel (|S_j| |q| >> |o_j|), so ~1e-5 is what float can do here; bugs give O(1). */
    double max_err = 0;
    for (int64_t r = 0; r < (int64_t)n * nv; r++) {
        double ms = 0;
        for (int j = 0; j < dv; j++)
            ms += ref[r * dv + j] * ref[r * dv + j];
        const double rms = sqrt(ms / dv) + 1e-6;
        for (int j = 0; j < dv; j++) {
            assert_true(isfinite(out[r * dv + j]));
            double e = fabs(out[r * dv + j] - ref[r * dv + j]) / rms;
            if (e > max_err)
                max_err = e;
        }
    }
    if (max_err > 2e-4)
        fail_msg("output rel err %g (nk %d nv %d dk %d dv %d K %d n %d)", max_err, nk, nv, dk, dv, K, n);
    double max_st = 0;
    for (int64_t i = 0; i < nsf; i++) {
        double e = fabs(buf[i] - ref_state[i]) / (1e-3 + fabs(ref_state[i]));
        if (e > max_st)
            max_st = e;
    }
    if (max_st > 2e-4)
        fail_msg("state rel err %g", max_st);
    free(out);
    free(ref);
    free(ref_state);
    free(buf);
    inputs_free(&in);
    layer_free(&L);
}

static void test_vs_naive_small(void **unused)
{
    (void)unused;
    check_vs_naive(2, 4, 8, 6, 4, 7, 0, 1);
    check_vs_naive(2, 4, 12, 12, 4, 9, 1, 2); /* dims not a multiple of 8: dot tails */
    check_vs_naive(3, 3, 16, 16, 4, 5, 1, 3); /* nk == nv */
    check_vs_naive(1, 4, 8, 8, 2, 6, 1, 4);   /* kernel 2 */
    check_vs_naive(2, 6, 8, 8, 1, 3, 1, 5);   /* kernel 1: no conv history */
    check_vs_naive(2, 4, 8, 8, 4, 1, 1, 6);   /* a single decode token */
    check_vs_naive(4, 8, 32, 32, 4, 40, 0, 7); /* the tiny refdata model's shape, prefill */
}

static void test_vs_naive_qwen35_dims(void **unused)
{
    (void)unused;
    /* Qwen3.5-35B-A3B: 16 key heads, 32 value heads, 128 dims, kernel 4. */
    check_vs_naive(16, 32, 128, 128, 4, 3, 1, 11);
}

/* Running n tokens in pieces gives exactly the same output and state as one call. */
static void test_split_equals_whole(void **unused)
{
    (void)unused;
    struct layer L;
    layer_init(&L, 2, 4, 16, 16, 4, 21);
    const int n = 11;
    struct inputs in;
    inputs_init(&in, &L.p, n, 1.0, 22);
    int64_t ov = (int64_t)L.p.n_v_heads * L.p.head_v_dim, nsf = sil_delta_net_state_floats(&L.p);
    struct sil_delta_net_state st;
    float *buf = state_new(&L.p, &st);
    float *whole = calloc((size_t)(n * ov), sizeof(float));
    float *part = calloc((size_t)(n * ov), sizeof(float));
    float *whole_state = malloc(sizeof(float) * (size_t)nsf);
    run(&L.p, &st, &in, 0, n, whole);
    memcpy(whole_state, buf, sizeof(float) * (size_t)nsf);

    const int splits[][3] = { { 1, 10, 0 }, { 5, 6, 0 }, { 10, 1, 0 }, { 2, 1, 8 }, { 1, 1, 9 } };
    for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++) {
        sil_delta_net_state_reset(&L.p, &st);
        memset(part, 0, sizeof(float) * (size_t)(n * ov));
        int t = 0;
        for (int k = 0; k < 3 && splits[s][k] > 0; k++) {
            run(&L.p, &st, &in, t, splits[s][k], part);
            t += splits[s][k];
        }
        assert_int_equal(t, n);
        assert_memory_equal(part, whole, sizeof(float) * (size_t)(n * ov));
        assert_memory_equal(buf, whole_state, sizeof(float) * (size_t)nsf);
    }
    /* token by token (the decode path) */
    sil_delta_net_state_reset(&L.p, &st);
    for (int t = 0; t < n; t++)
        run(&L.p, &st, &in, t, 1, part);
    assert_memory_equal(part, whole, sizeof(float) * (size_t)(n * ov));
    assert_memory_equal(buf, whole_state, sizeof(float) * (size_t)nsf);
    /* and the state really moved: a second pass over the same tokens differs */
    run(&L.p, &st, &in, 0, n, part);
    assert_true(memcmp(part, whole, sizeof(float) * (size_t)(n * ov)) != 0);

    free(whole);
    free(part);
    free(whole_state);
    free(buf);
    inputs_free(&in);
    layer_free(&L);
}

static void test_snapshot_restore(void **unused)
{
    (void)unused;
    struct layer L;
    layer_init(&L, 2, 4, 8, 8, 4, 31);
    const int n = 9;
    struct inputs in;
    inputs_init(&in, &L.p, n, 1.0, 32);
    int64_t ov = (int64_t)L.p.n_v_heads * L.p.head_v_dim, nsf = sil_delta_net_state_floats(&L.p);
    assert_int_equal(nsf, 3 * (2 * 2 * 8 + 4 * 8) + 4 * 8 * 8);
    struct sil_delta_net_state st;
    float *buf = state_new(&L.p, &st);
    float *snap = malloc(sizeof(float) * (size_t)nsf);
    float *after = malloc(sizeof(float) * (size_t)nsf);
    float *o1 = calloc((size_t)(n * ov), sizeof(float)), *o2 = calloc((size_t)(n * ov), sizeof(float));

    run(&L.p, &st, &in, 0, 4, o1);
    sil_delta_net_state_save(&L.p, &st, snap);
    assert_memory_equal(snap, buf, sizeof(float) * (size_t)nsf);
    run(&L.p, &st, &in, 4, 5, o1);
    memcpy(after, buf, sizeof(float) * (size_t)nsf);
    assert_true(memcmp(after, snap, sizeof(float) * (size_t)nsf) != 0);

    /* restore into a different state object, then replay */
    struct sil_delta_net_state st2;
    float *buf2 = state_new(&L.p, &st2);
    sil_delta_net_state_load(&L.p, &st2, snap);
    run(&L.p, &st2, &in, 4, 5, o2);
    assert_memory_equal(o2 + 4 * ov, o1 + 4 * ov, sizeof(float) * (size_t)(5 * ov));
    assert_memory_equal(buf2, after, sizeof(float) * (size_t)nsf);

    /* restore in place over a modified state */
    sil_delta_net_state_load(&L.p, &st, snap);
    run(&L.p, &st, &in, 4, 5, o2);
    assert_memory_equal(buf, after, sizeof(float) * (size_t)nsf);

    sil_delta_net_state_reset(&L.p, &st);
    for (int64_t i = 0; i < nsf; i++)
        assert_true(buf[i] == 0.0f);

    free(o1);
    free(o2);
    free(snap);
    free(after);
    free(buf);
    free(buf2);
    inputs_free(&in);
    layer_free(&L);
}

/* Phase 1 over channel ranges and phase 2 over head ranges == sil_delta_net_forward. */
static void test_two_phase(void **unused)
{
    (void)unused;
    struct layer L;
    layer_init(&L, 2, 6, 8, 8, 4, 41);
    const int n = 5;
    struct inputs in;
    inputs_init(&in, &L.p, n, 1.0, 42);
    int64_t ov = (int64_t)L.p.n_v_heads * L.p.head_v_dim, nsf = sil_delta_net_state_floats(&L.p);
    int64_t cd = sil_delta_net_conv_dim(&L.p);
    struct sil_delta_net_state st, st2;
    float *buf = state_new(&L.p, &st), *buf2 = state_new(&L.p, &st2);
    state_random(&L.p, buf, 43);
    memcpy(buf2, buf, sizeof(float) * (size_t)nsf);
    float *o1 = calloc((size_t)(n * ov), sizeof(float)), *o2 = calloc((size_t)(n * ov), sizeof(float));
    run(&L.p, &st, &in, 0, n, o1);

    float *conv_out = malloc(sizeof(float) * (size_t)(n * cd));
    float *hs = malloc(sizeof(float) * (size_t)sil_delta_net_head_scratch_floats(&L.p, n));
    const int64_t cuts[] = { 0, 7, 30, cd };
    for (int i = 0; i < 3; i++)
        sil_delta_net_conv(&L.p, &st2, n, in.qkv, conv_out, cuts[i], cuts[i + 1]);
    const int hcuts[] = { 0, 1, 4, 6 };
    for (int i = 0; i < 3; i++)
        sil_delta_net_heads(&L.p, &st2, n, conv_out, in.z, in.alpha, in.beta, o2, hcuts[i],
                            hcuts[i + 1], hs);
    assert_memory_equal(o2, o1, sizeof(float) * (size_t)(n * ov));
    assert_memory_equal(buf2, buf, sizeof(float) * (size_t)nsf);
    free(conv_out);
    free(hs);
    free(o1);
    free(o2);
    free(buf);
    free(buf2);
    inputs_free(&in);
    layer_free(&L);
}

/* Huge projections, saturated gates, long runs: everything stays finite. */
static void test_large_inputs_finite(void **unused)
{
    (void)unused;
    const double scales[] = { 1e2, 1e4, 1e6, 1e15 };
    for (size_t s = 0; s < sizeof scales / sizeof scales[0]; s++) {
        struct layer L;
        layer_init(&L, 2, 4, 16, 16, 4, 51 + s);
        const int n = 64;
        struct inputs in;
        inputs_init(&in, &L.p, n, scales[s], 52 + s);
        int64_t ov = (int64_t)L.p.n_v_heads * L.p.head_v_dim, nsf = sil_delta_net_state_floats(&L.p);
        struct sil_delta_net_state st;
        float *buf = state_new(&L.p, &st);
        float *out = calloc((size_t)(n * ov), sizeof(float));
        for (int rep = 0; rep < 3; rep++) {
            run(&L.p, &st, &in, 0, n, out);
            for (int64_t i = 0; i < n * ov; i++)
                if (!isfinite(out[i]))
                    fail_msg("scale %g rep %d: out[%lld] = %g", scales[s], rep, (long long)i,
                             (double)out[i]);
            for (int64_t i = 0; i < nsf; i++)
                if (!isfinite(buf[i]))
                    fail_msg("scale %g rep %d: state[%lld] = %g", scales[s], rep, (long long)i,
                             (double)buf[i]);
        }
        free(out);
        free(buf);
        inputs_free(&in);
        layer_free(&L);
    }
}

/* Zero inputs from an empty state: conv gives silu(0) = 0, q = k = 0 survive the l2 norm's eps,
 * and the output is exactly 0 (not NaN). */
static void test_zero_input(void **unused)
{
    (void)unused;
    struct layer L;
    layer_init(&L, 2, 4, 8, 8, 4, 61);
    const int n = 3;
    struct inputs in;
    inputs_init(&in, &L.p, n, 0.0, 62);
    int64_t ov = (int64_t)L.p.n_v_heads * L.p.head_v_dim;
    struct sil_delta_net_state st;
    float *buf = state_new(&L.p, &st);
    float *out = malloc(sizeof(float) * (size_t)(n * ov));
    for (int64_t i = 0; i < n * ov; i++)
        out[i] = NAN;
    run(&L.p, &st, &in, 0, n, out);
    for (int64_t i = 0; i < n * ov; i++)
        assert_true(out[i] == 0.0f);
    free(out);
    free(buf);
    inputs_free(&in);
    layer_free(&L);
}

static void test_check(void **unused)
{
    (void)unused;
    struct layer L;
    layer_init(&L, 2, 4, 8, 8, 4, 71);
    struct sil_error err = { 0 };
    assert_int_equal(sil_delta_net_check(&L.p, &err), 0);
    assert_int_equal(sil_delta_net_conv_dim(&L.p), 2 * 2 * 8 + 4 * 8);
    assert_int_equal(sil_delta_net_ssm_floats(&L.p), 4 * 8 * 8);

    struct sil_delta_net_params p = L.p;
    p.n_v_heads = 6;
    p.n_k_heads = 4;
    assert_int_equal(sil_delta_net_check(&p, &err), -EINVAL);
    assert_int_equal(err.code, -EINVAL);
    assert_non_null(strstr(err.msg, "n_v_heads"));

    p = L.p;
    p.head_k_dim = 0;
    assert_int_equal(sil_delta_net_check(&p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "head_k_dim"));

    p = L.p;
    p.conv_kernel = 0;
    assert_int_equal(sil_delta_net_check(&p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "conv_kernel"));

    p = L.p;
    p.eps = NAN;
    assert_int_equal(sil_delta_net_check(&p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "eps"));

    p = L.p;
    p.a = NULL;
    assert_int_equal(sil_delta_net_check(&p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "ssm_a"));

    p = L.p;
    p.conv1d = NULL;
    assert_int_equal(sil_delta_net_check(&p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "ssm_conv1d"));
    layer_free(&L);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vs_naive_small),
        cmocka_unit_test(test_vs_naive_qwen35_dims),
        cmocka_unit_test(test_split_equals_whole),
        cmocka_unit_test(test_snapshot_restore),
        cmocka_unit_test(test_two_phase),
        cmocka_unit_test(test_large_inputs_finite),
        cmocka_unit_test(test_zero_input),
        cmocka_unit_test(test_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
