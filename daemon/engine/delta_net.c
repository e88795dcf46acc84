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
    return 2 * (int64_t)p->head_k_dim + p->head_v_dim;
}

int64_t sil_delta_net_scratch_floats(const struct sil_delta_net_params *p, int32_t n_tokens)
{
    return (int64_t)n_tokens * sil_delta_net_conv_dim(p) +
           sil_delta_net_head_scratch_floats(p, n_tokens);
}

static inline float silu(float x)
{
    return x / (1.0f + expf(-x));
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

void sil_delta_net_conv(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                        int32_t n_tokens, const float *qkv_mixed, float *conv_out, int64_t c0,
                        int64_t c1)
{
    const int64_t cd = sil_delta_net_conv_dim(p);
    const int K = p->conv_kernel;
    const int H = K - 1; /* rows of history */

    /* Window row r of token t is input position t - H + r: the state for positions < 0. */
    for (int32_t t = 0; t < n_tokens; t++) {
        float *o = conv_out + (int64_t)t * cd;
        for (int64_t c = c0; c < c1; c++)
            o[c] = 0.0f;
        for (int r = 0; r < K; r++) {
            int64_t pos = (int64_t)t - H + r;
            const float *x = pos < 0 ? st->conv + (pos + H) * cd : qkv_mixed + pos * cd;
            for (int64_t c = c0; c < c1; c++)
                o[c] += p->conv1d[c * K + r] * x[c];
        }
        for (int64_t c = c0; c < c1; c++)
            o[c] = silu(o[c]);
    }

    /* New history = the last H positions of [state; qkv_mixed]. Ascending r only reads rows at
     * or after r in the old state, so the shift is safe in place. */
    for (int r = 0; r < H; r++) {
        int64_t pos = (int64_t)n_tokens - H + r;
        const float *x = pos < 0 ? st->conv + (pos + H) * cd : qkv_mixed + pos * cd;
        float *dst = st->conv + (int64_t)r * cd;
        if (x != dst)
            memmove(dst + c0, x + c0, (size_t)(c1 - c0) * sizeof(float));
    }
}

void sil_delta_net_heads(const struct sil_delta_net_params *p, struct sil_delta_net_state *st,
                         int32_t n_tokens, const float *conv_out, const float *z,
                         const float *alpha_raw, const float *beta_raw, float *out, int32_t h0,
                         int32_t h1, float *scratch)
{
    const int nk = p->n_k_heads, nv = p->n_v_heads, dk = p->head_k_dim, dv = p->head_v_dim;
    const int64_t cd = sil_delta_net_conv_dim(p);
    const int64_t ov = (int64_t)nv * dv;
    const float q_scale = 1.0f / sqrtf((float)dk);
    float *q = scratch;      /* [dk] */
    float *k = q + dk;       /* [dk] */
    float *d = k + dk;       /* [dv] */

    for (int h = h0; h < h1; h++) {
        const int kh = h % nk;
        float *S = st->ssm + (int64_t)h * dv * dk; /* [dv][dk] */
        for (int32_t t = 0; t < n_tokens; t++) {
            const float *row = conv_out + (int64_t)t * cd;
            const float *v = row + 2 * (int64_t)nk * dk + (int64_t)h * dv;
            memcpy(q, row + (int64_t)kh * dk, (size_t)dk * sizeof(float));
            memcpy(k, row + (int64_t)nk * dk + (int64_t)kh * dk, (size_t)dk * sizeof(float));
            float qs = (float)(1.0 / fmax(sqrt(sumsq(q, dk)), (double)p->eps)) * q_scale;
            float ks = (float)(1.0 / fmax(sqrt(sumsq(k, dk)), (double)p->eps));
            for (int i = 0; i < dk; i++) {
                q[i] *= qs;
                k[i] *= ks;
            }

            const float decay = expf(p->a[h] * softplus(alpha_raw[(int64_t)t * nv + h] + p->dt_bias[h]));
            const float beta = sigmoid(beta_raw[(int64_t)t * nv + h]);

            /* (decay S) k = decay (S k): the decay is folded into the second pass. */
            for (int j = 0; j < dv; j++)
                d[j] = beta * (v[j] - decay * dot(S + (int64_t)j * dk, k, dk));

            float *o = out + (int64_t)t * ov + (int64_t)h * dv;
            for (int j = 0; j < dv; j++) {
                float *Sj = S + (int64_t)j * dk;
                const float dj = d[j];
                for (int i = 0; i < dk; i++)
                    Sj[i] = decay * Sj[i] + dj * k[i];
                o[j] = dot(Sj, q, dk);
            }

            /* Gated RMSNorm: rmsnorm(o) * ssm_norm * silu(z). */
            const float rs = (float)(1.0 / sqrt(sumsq(o, dv) / dv + (double)p->eps));
            const float *zh = z + (int64_t)t * ov + (int64_t)h * dv;
            for (int j = 0; j < dv; j++)
                o[j] = o[j] * rs * p->norm[j] * silu(zh[j]);
        }
    }
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
