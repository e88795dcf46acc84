#include "kernels/cpu/ops.h"

#include <math.h>

void sil_rmsnorm(float *y, const float *x, const float *w, int64_t n, float eps)
{
    /* Sum in double: for wide rows the F32 sum of squares loses digits the reference keeps. */
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)x[i] * x[i];
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    if (w) {
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * scale * w[i];
    } else {
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * scale;
    }
}

void sil_rope_neox(float *x, int n_head, int head_dim, int n_rot, int32_t pos, float freq_base)
{
    const int half = n_rot / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    float cs[512], sn[512]; /* half <= 512: head dims are far smaller */
    float theta = (float)pos;
    for (int i = 0; i < half && i < 512; i++) {
        cs[i] = cosf(theta);
        sn[i] = sinf(theta);
        theta *= theta_scale;
    }
    for (int h = 0; h < n_head; h++) {
        float *v = x + (int64_t)h * head_dim;
        for (int i = 0; i < half; i++) {
            const float a = v[i], b = v[i + half];
            v[i] = a * cs[i] - b * sn[i];
            v[i + half] = a * sn[i] + b * cs[i];
        }
    }
}

float sil_softmax_exp(float *x, int64_t n, double *sum_out)
{
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    *sum_out = sum;
    return mx;
}

void sil_softmax(float *x, int64_t n)
{
    double sum;
    sil_softmax_exp(x, n, &sum);
    const float inv = (float)(1.0 / sum);
    for (int64_t i = 0; i < n; i++)
        x[i] *= inv;
}

float sil_silu(float x)
{
    return x / (1.0f + expf(-x));
}

float sil_sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

float sil_softplus(float x)
{
    /* log1p(exp(x)) overflows for large x, where it equals x to float precision. */
    return x > 20.0f ? x : log1pf(expf(x));
}

void sil_swiglu(float *out, const float *gate, const float *up, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        out[i] = sil_silu(gate[i]) * up[i];
}

void sil_axpy(float *y, float a, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += a * x[i];
}

void sil_add(float *y, const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += x[i];
}

float sil_dot_f32(const float *a, const float *b, int64_t n)
{
    /* Eight partial sums: lets the compiler keep a vector accumulator without -ffast-math. */
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[i + j] * b[i + j];
    float s = 0.0f;
    for (; i < n; i++)
        s += a[i] * b[i];
    return s + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}
