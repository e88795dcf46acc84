/* Gated delta net, sequential form: one token after another, one value head at a time, so a
 * head's state S (dv x dk floats, 64 KiB for Qwen3.5) stays in cache across a prefill.
 * The math is in delta_net.h. */
#include "daemon/engine/delta_net.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#define DN_MAX_DIM 65536

int sil_delta_net_check(const struct sil_delta_net_params *p, struct sil_error *err)
{
    if (!p)
        return sil_errorf(err, -EINVAL, "delta_net: params: NULL");
    if (p->n_k_heads <= 0 || p->n_k_heads > DN_MAX_DIM)
        return sil_errorf(err, -EINVAL, "delta_net: n_k_heads (ssm.group_count) = %d out of range",
                          p->n_k_heads);
    if (p->n_v_heads <= 0 || p->n_v_heads > DN_MAX_DIM || p->n_v_heads % p->n_k_heads != 0)
        return sil_errorf(err, -EINVAL,
                          "delta_net: n_v_heads (ssm.time_step_rank) = %d is not a positive "
                          "multiple of n_k_heads = %d",
                          p->n_v_heads, p->n_k_heads);
    if (p->head_k_dim <= 0 || p->head_k_dim > DN_MAX_DIM)
        return sil_errorf(err, -EINVAL, "delta_net: head_k_dim (ssm.state_size) = %d out of range",
                          p->head_k_dim);
    if (p->head_v_dim <= 0 || p->head_v_dim > DN_MAX_DIM)
        return sil_errorf(err, -EINVAL,
                          "delta_net: head_v_dim (ssm.inner_size / n_v_heads) = %d out of range",
                          p->head_v_dim);
    if (p->conv_kernel <= 0 || p->conv_kernel > 64)
        return sil_errorf(err, -EINVAL, "delta_net: conv_kernel (ssm.conv_kernel) = %d out of range",
                          p->conv_kernel);
    if (!(p->eps >= 0.0f) || !isfinite(p->eps))
        return sil_errorf(err, -EINVAL, "delta_net: eps (layer_norm_rms_epsilon) = %g invalid",
                          (double)p->eps);
    if (!p->conv1d)
        return sil_errorf(err, -EINVAL, "delta_net: ssm_conv1d.weight missing");
    if (!p->dt_bias)
        return sil_errorf(err, -EINVAL, "delta_net: ssm_dt.bias missing");
    if (!p->a)
        return sil_errorf(err, -EINVAL, "delta_net: ssm_a missing");
    if (!p->norm)
        return sil_errorf(err, -EINVAL, "delta_net: ssm_norm.weight missing");
    return 0;
}

int64_t sil_delta_net_conv_dim(const struct sil_delta_net_params *p)
{
    return 2 * (int64_t)p->n_k_heads * p->head_k_dim + (int64_t)p->n_v_heads * p->head_v_dim;
}

int64_t sil_delta_net_conv_floats(const struct sil_delta_net_params *p)
{
    return (int64_t)(p->conv_kernel - 1) * sil_delta_net_conv_dim(p);
}

int64_t sil_delta_net_ssm_floats(const struct sil_delta_net_params *p)
{
    return (int64_t)p->n_v_heads * p->head_v_dim * p->head_k_dim;
}

int64_t sil_delta_net_state_floats(const struct sil_delta_net_params *p)
{
    return sil_delta_net_conv_floats(p) + sil_delta_net_ssm_floats(p);
}

void sil_delta_net_state_bind(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                              float *buf)
{
    st->conv = buf;
    st->ssm = buf + sil_delta_net_conv_floats(p);
}

void sil_delta_net_state_reset(const struct sil_delta_net_params *p, struct sil_delta_net_state *st)
{
    memset(st->conv, 0, (size_t)sil_delta_net_conv_floats(p) * sizeof(float));
    memset(st->ssm, 0, (size_t)sil_delta_net_ssm_floats(p) * sizeof(float));
}

void sil_delta_net_state_save(const struct sil_delta_net_params *p,
                              const struct sil_delta_net_state *st, float *dst)
{
    int64_t nc = sil_delta_net_conv_floats(p);
    memcpy(dst, st->conv, (size_t)nc * sizeof(float));
    memcpy(dst + nc, st->ssm, (size_t)sil_delta_net_ssm_floats(p) * sizeof(float));
}

void sil_delta_net_state_load(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                              const float *src)
{
    int64_t nc = sil_delta_net_conv_floats(p);
    memcpy(st->conv, src, (size_t)nc * sizeof(float));
    memcpy(st->ssm, src + nc, (size_t)sil_delta_net_ssm_floats(p) * sizeof(float));
}

int64_t sil_delta_net_head_scratch_floats(const struct sil_delta_net_params *p, int32_t n_tokens)
{
    (void)n_tokens;
    return 4 * (int64_t)p->head_k_dim + 3 * (int64_t)p->head_v_dim; /* q, k twice; d; S k; gate */
}

int64_t sil_delta_net_scratch_floats(const struct sil_delta_net_params *p, int32_t n_tokens)
{
    return (int64_t)n_tokens * sil_delta_net_conv_dim(p) +
           sil_delta_net_head_scratch_floats(p, n_tokens);
}

static inline float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* log(1 + e^x) without overflow: for x > 20 the log1p term is below float precision. */
static inline float softplus(float x)
{
    return x > 20.0f ? x : log1pf(expf(x));
}

/* Eight partial sums so the compiler can keep them in one vector register. */
static inline float dot(const float *a, const float *b, int n)
{
    float acc[8] = { 0 };
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++)
            acc[l] += a[i + l] * b[i + l];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Sum of squares in double: a state or projection that grew large must not overflow the norm. */
static double sumsq(const float *x, int n)
{
    double s = 0.0;
    for (int i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

/* 8 floats, unaligned, may alias float: the state rows are plain float arrays. */
typedef float v8 __attribute__((vector_size(32), aligned(4), may_alias));

/* A macro, not a function: passing a 32-byte vector by value changes the ABI without AVX. */
#define HSUM8(a) ((((a)[0] + (a)[4]) + ((a)[1] + (a)[5])) + (((a)[2] + (a)[6]) + ((a)[3] + (a)[7])))
typedef int32_t v8i __attribute__((vector_size(32), aligned(4), may_alias));

/* x[0..8) = silu(x) = x / (1 + e^-x) in place, e^-x by a degree-7 polynomial on
 * [-ln2/2, ln2/2] scaled by 2^n (relative error ~2e-7); -x is clamped to [-87, 88] so 2^n stays
 * a normal float. Vector code (not libm expf) because the conv and the gate take 12k of these
 * per token at Qwen3.5-35B size. */
static inline __attribute__((always_inline)) void silu8(float *x)
{
    const v8 v = *(const v8 *)x;
    v8 t = -v;
    const v8 hi = { 88, 88, 88, 88, 88, 88, 88, 88 }, lo = { -87, -87, -87, -87, -87, -87, -87, -87 };
    v8i m = t > hi;
    t = (v8)(((v8i)t & ~m) | ((v8i)hi & m));
    m = t < lo;
    t = (v8)(((v8i)t & ~m) | ((v8i)lo & m));
    const v8 kf = t * 1.44269504088896341f + 12582912.0f; /* 1.5 * 2^23: rounds to an integer */
    const v8 n = kf - 12582912.0f;
    const v8 r = (t - n * 0.693145751953125f) - n * 1.428606765330187e-06f;
    v8 e = 1.0f / 720 + r * (1.0f / 5040);
    e = 1.0f / 120 + r * e;
    e = 1.0f / 24 + r * e;
    e = 1.0f / 6 + r * e;
    e = 0.5f + r * e;
    e = 1.0f + r * e;
    e = 1.0f + r * e;
    const v8i ni = (v8i)kf - 0x4B400000; /* n as an integer */
    const v8 scale = (v8)((ni + 127) << 23);
    *(v8 *)x = v / (1.0f + e * scale);
}

/* silu over n floats; the tail goes through the same vector code (zero-padded), so a value's
 * result does not depend on where a thread's range starts or ends. */
static inline __attribute__((always_inline)) void silu_row(float *x, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        silu8(x + i);
    if (i < n) {
        float tmp[8] = { 0 };
        memcpy(tmp, x + i, (size_t)(n - i) * sizeof(float));
        silu8(tmp);
        memcpy(x + i, tmp, (size_t)(n - i) * sizeof(float));
    }
}

/* Sum of squares: float vectors, and double precision only when that overflows (a state or
 * projection that grew huge must still normalize). */
static inline __attribute__((always_inline)) double sumsq_fast(const float *x, int n)
{
    if (n % 8 == 0) {
        v8 acc = { 0 };
        for (int i = 0; i < n; i += 8) {
            const v8 v = *(const v8 *)(x + i);
            acc += v * v;
        }
        const float s = HSUM8(acc);
        if (s < INFINITY)
            return s;
    }
    return sumsq(x, n);
}

static inline __attribute__((always_inline)) void conv_body(const struct sil_delta_net_params *p,
                                                            struct sil_delta_net_state *st,
                                                            int32_t n_tokens,
                                                            const float *qkv_mixed,
                                                            float *conv_out, int64_t c0, int64_t c1)
{
    const int64_t cd = sil_delta_net_conv_dim(p);
    const int K = p->conv_kernel;
    const int H = K - 1; /* rows of history */
    const float *x[64];

    /* Window row r of token t is input position t - H + r: the state for positions < 0. */
    for (int32_t t = 0; t < n_tokens; t++) {
        for (int r = 0; r < K; r++) {
            const int64_t pos = (int64_t)t - H + r;
            x[r] = pos < 0 ? st->conv + (pos + H) * cd : qkv_mixed + pos * cd;
        }
        float *o = conv_out + (int64_t)t * cd;
        for (int64_t c = c0; c < c1; c++) {
            const float *w = p->conv1d + c * K;
            float acc = 0.0f;
            for (int r = 0; r < K; r++)
                acc += w[r] * x[r][c];
            o[c] = acc;
        }
        silu_row(o + c0, c1 - c0);
    }

    /* New history = the last H positions of [state; qkv_mixed]. Ascending r only reads rows at
     * or after r in the old state, so the shift is safe in place. */
    for (int r = 0; r < H; r++) {
        const int64_t pos = (int64_t)n_tokens - H + r;
        const float *src = pos < 0 ? st->conv + (pos + H) * cd : qkv_mixed + pos * cd;
        float *dst = st->conv + (int64_t)r * cd;
        if (src != dst)
            memmove(dst + c0, src + c0, (size_t)(c1 - c0) * sizeof(float));
    }
}

struct conv_args {
    const struct sil_delta_net_params *p;
    struct sil_delta_net_state *st;
    int32_t n_tokens;
    const float *qkv_mixed;
    float *conv_out;
    int64_t c0, c1;
};

static void conv_generic(const struct conv_args *a)
{
    conv_body(a->p, a->st, a->n_tokens, a->qkv_mixed, a->conv_out, a->c0, a->c1);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static void conv_avx2(const struct conv_args *a)
{
    conv_body(a->p, a->st, a->n_tokens, a->qkv_mixed, a->conv_out, a->c0, a->c1);
}
#endif

void sil_delta_net_conv(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                        int32_t n_tokens, const float *qkv_mixed, float *conv_out, int64_t c0,
                        int64_t c1)
{
    const struct conv_args a = { p, st, n_tokens, qkv_mixed, conv_out, c0, c1 };
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        conv_avx2(&a);
        return;
    }
#endif
    conv_generic(&a);
}

/* p[j] = S_j . k for every row: the first pass of a call (later tokens get it from the fused
 * update below). Four rows at a time so each load of k serves four accumulator chains. */
static inline __attribute__((always_inline)) void rows_dot(const float *S, const float *k,
                                                           float *p, int dk, int dv)
{
    int j = 0;
    for (; j + 4 <= dv; j += 4) {
        const float *S0 = S + (int64_t)j * dk, *S1 = S0 + dk, *S2 = S1 + dk, *S3 = S2 + dk;
        v8 a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
        for (int i = 0; i < dk; i += 8) {
            v8 kv = *(const v8 *)(k + i);
            a0 += *(const v8 *)(S0 + i) * kv;
            a1 += *(const v8 *)(S1 + i) * kv;
            a2 += *(const v8 *)(S2 + i) * kv;
            a3 += *(const v8 *)(S3 + i) * kv;
        }
        p[j] = HSUM8(a0);
        p[j + 1] = HSUM8(a1);
        p[j + 2] = HSUM8(a2);
        p[j + 3] = HSUM8(a3);
    }
    for (; j < dv; j++) {
        v8 a0 = { 0 };
        for (int i = 0; i < dk; i += 8)
            a0 += *(const v8 *)(S + (int64_t)j * dk + i) * *(const v8 *)(k + i);
        p[j] = HSUM8(a0);
    }
}

/* S_j = decay S_j + d_j k;  o_j = S_j . q;  and, when kn (the next token's k) is given,
 * p_j = S_j . kn in the same pass, so a prefill reads and writes S once per token.
 * The S . kn sums are formed exactly as rows_dot forms them, so prefill and token-by-token
 * decode give bit-identical results. */
static inline __attribute__((always_inline)) void rows_update(float *S, const float *k,
                                                              const float *q, const float *kn,
                                                              const float *d, float decay,
                                                              float *o, float *p, int dk, int dv)
{
    int j = 0;
    for (; j + 4 <= dv; j += 4) {
        float *S0 = S + (int64_t)j * dk, *S1 = S0 + dk, *S2 = S1 + dk, *S3 = S2 + dk;
        const float d0 = d[j], d1 = d[j + 1], d2 = d[j + 2], d3 = d[j + 3];
        v8 o0 = { 0 }, o1 = { 0 }, o2 = { 0 }, o3 = { 0 };
        v8 p0 = { 0 }, p1 = { 0 }, p2 = { 0 }, p3 = { 0 };
        for (int i = 0; i < dk; i += 8) {
            v8 kv = *(const v8 *)(k + i), qv = *(const v8 *)(q + i);
            v8 s0 = decay * *(v8 *)(S0 + i) + d0 * kv;
            v8 s1 = decay * *(v8 *)(S1 + i) + d1 * kv;
            v8 s2 = decay * *(v8 *)(S2 + i) + d2 * kv;
            v8 s3 = decay * *(v8 *)(S3 + i) + d3 * kv;
            *(v8 *)(S0 + i) = s0;
            *(v8 *)(S1 + i) = s1;
            *(v8 *)(S2 + i) = s2;
            *(v8 *)(S3 + i) = s3;
            o0 += s0 * qv;
            o1 += s1 * qv;
            o2 += s2 * qv;
            o3 += s3 * qv;
            if (kn) {
                v8 nv = *(const v8 *)(kn + i);
                p0 += s0 * nv;
                p1 += s1 * nv;
                p2 += s2 * nv;
                p3 += s3 * nv;
            }
        }
        o[j] = HSUM8(o0);
        o[j + 1] = HSUM8(o1);
        o[j + 2] = HSUM8(o2);
        o[j + 3] = HSUM8(o3);
        if (kn) {
            p[j] = HSUM8(p0);
            p[j + 1] = HSUM8(p1);
            p[j + 2] = HSUM8(p2);
            p[j + 3] = HSUM8(p3);
        }
    }
    for (; j < dv; j++) {
        float *Sj = S + (int64_t)j * dk;
        v8 o0 = { 0 }, p0 = { 0 };
        for (int i = 0; i < dk; i += 8) {
            v8 s0 = decay * *(v8 *)(Sj + i) + d[j] * *(const v8 *)(k + i);
            *(v8 *)(Sj + i) = s0;
            o0 += s0 * *(const v8 *)(q + i);
            if (kn)
                p0 += s0 * *(const v8 *)(kn + i);
        }
        o[j] = HSUM8(o0);
        if (kn)
            p[j] = HSUM8(p0);
    }
}

/* The same for head dims that are not a multiple of 8 (test shapes; real models use 128). */
static void rows_dot_scalar(const float *S, const float *k, float *p, int dk, int dv)
{
    for (int j = 0; j < dv; j++)
        p[j] = dot(S + (int64_t)j * dk, k, dk);
}

static void rows_update_scalar(float *S, const float *k, const float *q, const float *kn,
                               const float *d, float decay, float *o, float *p, int dk, int dv)
{
    for (int j = 0; j < dv; j++) {
        float *Sj = S + (int64_t)j * dk;
        for (int i = 0; i < dk; i++)
            Sj[i] = decay * Sj[i] + d[j] * k[i];
        o[j] = dot(Sj, q, dk);
        if (kn)
            p[j] = dot(Sj, kn, dk);
    }
}

struct head_args {
    const struct sil_delta_net_params *p;
    struct sil_delta_net_state *st;
    int32_t n_tokens;
    const float *conv_out, *z, *alpha_raw, *beta_raw;
    float *out;
    int32_t h0, h1;
    float *scratch;
};

/* q and k of token t for key head kh, l2-normalized, q also scaled by 1/sqrt(dk). */
static inline __attribute__((always_inline)) void load_qk(const struct sil_delta_net_params *p,
                                                          const float *row, int kh, float *q,
                                                          float *k)
{
    const int nk = p->n_k_heads, dk = p->head_k_dim;
    memcpy(q, row + (int64_t)kh * dk, (size_t)dk * sizeof(float));
    memcpy(k, row + (int64_t)nk * dk + (int64_t)kh * dk, (size_t)dk * sizeof(float));
    const float qs = (float)(1.0 / fmax(sqrt(sumsq_fast(q, dk)), (double)p->eps)) / sqrtf((float)dk);
    const float ks = (float)(1.0 / fmax(sqrt(sumsq_fast(k, dk)), (double)p->eps));
    for (int i = 0; i < dk; i++) {
        q[i] *= qs;
        k[i] *= ks;
    }
}

/* Per value head h, tokens in order:
 *   d = beta (v - decay S k);  S = decay S + d k^T;  o = S q;  out = gated_rmsnorm(o)
 * with decay S k = decay (S k), and S k of token t+1 computed while S is updated for token t. */
static inline __attribute__((always_inline)) void heads_body(const struct head_args *a)
{
    const struct sil_delta_net_params *p = a->p;
    const int nk = p->n_k_heads, nv = p->n_v_heads, dk = p->head_k_dim, dv = p->head_v_dim;
    const int64_t cd = sil_delta_net_conv_dim(p);
    const int64_t ov = (int64_t)nv * dv;
    const int vec = dk % 8 == 0;
    float *qk[2][2] = { { a->scratch, a->scratch + dk }, { a->scratch + 2 * dk, a->scratch + 3 * dk } };
    float *d = a->scratch + 4 * dk; /* [dv] */
    float *sk = d + dv;             /* [dv] S k of the coming token */
    float *gate = sk + dv;          /* [dv] silu(z) */

    for (int h = a->h0; h < a->h1; h++) {
        const int kh = h % nk;
        float *S = a->st->ssm + (int64_t)h * dv * dk; /* [dv][dk] */
        load_qk(p, a->conv_out, kh, qk[0][0], qk[0][1]);
        if (vec)
            rows_dot(S, qk[0][1], sk, dk, dv);
        else
            rows_dot_scalar(S, qk[0][1], sk, dk, dv);
        for (int32_t t = 0; t < a->n_tokens; t++) {
            const float *row = a->conv_out + (int64_t)t * cd;
            const float *v = row + 2 * (int64_t)nk * dk + (int64_t)h * dv;
            const float *q = qk[t & 1][0], *k = qk[t & 1][1];
            const float *kn = NULL;
            if (t + 1 < a->n_tokens) {
                load_qk(p, row + cd, kh, qk[(t + 1) & 1][0], qk[(t + 1) & 1][1]);
                kn = qk[(t + 1) & 1][1];
            }

            const int64_t gi = (int64_t)t * nv + h;
            const float decay = expf(p->a[h] * softplus(a->alpha_raw[gi] + p->dt_bias[h]));
            const float beta = sigmoid(a->beta_raw[gi]);
            for (int j = 0; j < dv; j++)
                d[j] = beta * (v[j] - decay * sk[j]);

            float *o = a->out + (int64_t)t * ov + (int64_t)h * dv;
            if (vec)
                rows_update(S, k, q, kn, d, decay, o, sk, dk, dv);
            else
                rows_update_scalar(S, k, q, kn, d, decay, o, sk, dk, dv);

            /* Gated RMSNorm: rmsnorm(o) * ssm_norm * silu(z). */
            const float rs = (float)(1.0 / sqrt(sumsq_fast(o, dv) / dv + (double)p->eps));
            memcpy(gate, a->z + (int64_t)t * ov + (int64_t)h * dv, (size_t)dv * sizeof(float));
            silu_row(gate, dv);
            for (int j = 0; j < dv; j++)
                o[j] = o[j] * rs * p->norm[j] * gate[j];
        }
    }
}

static void heads_generic(const struct head_args *a)
{
    heads_body(a);
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static void heads_avx2(const struct head_args *a)
{
    heads_body(a);
}
#endif

void sil_delta_net_heads(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                         int32_t n_tokens, const float *conv_out, const float *z,
                         const float *alpha_raw, const float *beta_raw, float *out, int32_t h0,
                         int32_t h1, float *scratch)
{
    const struct head_args a = { p, st, n_tokens, conv_out, z, alpha_raw, beta_raw, out, h0, h1,
                                 scratch };
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
        heads_avx2(&a);
        return;
    }
#endif
    heads_generic(&a);
}

void sil_delta_net_forward(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                           int32_t n_tokens, const float *qkv_mixed, const float *z,
                           const float *alpha_raw, const float *beta_raw, float *out,
                           float *scratch)
{
    const int64_t cd = sil_delta_net_conv_dim(p);
    float *conv_out = scratch;
    sil_delta_net_conv(p, st, n_tokens, qkv_mixed, conv_out, 0, cd);
    sil_delta_net_heads(p, st, n_tokens, conv_out, z, alpha_raw, beta_raw, out, 0, p->n_v_heads,
                        scratch + (int64_t)n_tokens * cd);
}
