/* Scalar kernels (the reference the SIMD ones are tested against) and the per-type choice. */
#include "kernels/cpu/kv_attn.h"

#include "kernels/cpu/quants_impl.h"

static void scores_f32(const float *q, const void *qq, const void *k, size_t stride, int n, int hd,
                       float scale, float *scores)
{
    (void)qq;
    for (int t = 0; t < n; t++) {
        const float *kt = (const float *)((const char *)k + (size_t)t * stride);
        float s = 0.0f;
        for (int j = 0; j < hd; j++)
            s += q[j] * kt[j];
        scores[t] = s * scale;
    }
}

static void scores_f16(const float *q, const void *qq, const void *k, size_t stride, int n, int hd,
                       float scale, float *scores)
{
    (void)qq;
    for (int t = 0; t < n; t++) {
        const sil_fp16 *kt = (const sil_fp16 *)((const char *)k + (size_t)t * stride);
        float s = 0.0f;
        for (int j = 0; j < hd; j++)
            s += q[j] * sil_fp16_to_fp32(kt[j]);
        scores[t] = s * scale;
    }
}

static void scores_q8_0(const float *q, const void *qq, const void *k, size_t stride, int n, int hd,
                        float scale, float *scores)
{
    (void)q;
    const struct sil_block_q8_0 *a = qq;
    for (int t = 0; t < n; t++) {
        const struct sil_block_q8_0 *w =
            (const struct sil_block_q8_0 *)((const char *)k + (size_t)t * stride);
        float s = 0.0f;
        for (int b = 0; b < hd / SIL_QK; b++) {
            int32_t sum = 0;
            for (int j = 0; j < SIL_QK; j++)
                sum += w[b].qs[j] * a[b].qs[j];
            s += sil_fp16_to_fp32(w[b].d) * sil_fp16_to_fp32(a[b].d) * (float)sum;
        }
        scores[t] = s * scale;
    }
}

static void scores_q4_0(const float *q, const void *qq, const void *k, size_t stride, int n, int hd,
                        float scale, float *scores)
{
    (void)q;
    const struct sil_block_q8_0 *a = qq;
    for (int t = 0; t < n; t++) {
        const struct sil_block_q4_0 *w =
            (const struct sil_block_q4_0 *)((const char *)k + (size_t)t * stride);
        float s = 0.0f;
        for (int b = 0; b < hd / SIL_QK; b++) {
            int32_t sum = 0;
            for (int j = 0; j < SIL_QK / 2; j++)
                sum += ((w[b].qs[j] & 0x0F) - 8) * a[b].qs[j] +
                       ((w[b].qs[j] >> 4) - 8) * a[b].qs[j + SIL_QK / 2];
            s += sil_fp16_to_fp32(w[b].d) * sil_fp16_to_fp32(a[b].d) * (float)sum;
        }
        scores[t] = s * scale;
    }
}

static void accum_f32(float *o, const float *p, const void *v, size_t stride, int n, int hd)
{
    for (int t = 0; t < n; t++) {
        const float *vt = (const float *)((const char *)v + (size_t)t * stride);
        for (int j = 0; j < hd; j++)
            o[j] += p[t] * vt[j];
    }
}

static void accum_f16(float *o, const float *p, const void *v, size_t stride, int n, int hd)
{
    for (int t = 0; t < n; t++) {
        const sil_fp16 *vt = (const sil_fp16 *)((const char *)v + (size_t)t * stride);
        for (int j = 0; j < hd; j++)
            o[j] += p[t] * sil_fp16_to_fp32(vt[j]);
    }
}

static void accum_q8_0(float *o, const float *p, const void *v, size_t stride, int n, int hd)
{
    for (int t = 0; t < n; t++) {
        const struct sil_block_q8_0 *w =
            (const struct sil_block_q8_0 *)((const char *)v + (size_t)t * stride);
        for (int b = 0; b < hd / SIL_QK; b++) {
            const float s = p[t] * sil_fp16_to_fp32(w[b].d);
            for (int j = 0; j < SIL_QK; j++)
                o[b * SIL_QK + j] += s * (float)w[b].qs[j];
        }
    }
}

static void accum_q4_0(float *o, const float *p, const void *v, size_t stride, int n, int hd)
{
    for (int t = 0; t < n; t++) {
        const struct sil_block_q4_0 *w =
            (const struct sil_block_q4_0 *)((const char *)v + (size_t)t * stride);
        for (int b = 0; b < hd / SIL_QK; b++) {
            const float s = p[t] * sil_fp16_to_fp32(w[b].d);
            float *ob = o + b * SIL_QK;
            for (int j = 0; j < SIL_QK / 2; j++) {
                ob[j] += s * (float)((w[b].qs[j] & 0x0F) - 8);
                ob[j + SIL_QK / 2] += s * (float)((w[b].qs[j] >> 4) - 8);
            }
        }
    }
}

const struct sil_kv_kernels *sil_kv_kernels(int type)
{
    static const struct sil_kv_kernels scalar[] = {
        {scores_f32, accum_f32, false},
        {scores_f16, accum_f16, false},
        {scores_q8_0, accum_q8_0, true},
        {scores_q4_0, accum_q4_0, true},
    };
    static const struct sil_kv_kernels avx2[] = {
        {sil_kv_scores_f32_avx2, sil_kv_accum_f32_avx2, false},
        {sil_kv_scores_f16_avx2, sil_kv_accum_f16_avx2, false},
        {sil_kv_scores_q8_0_avx2, sil_kv_accum_q8_0_avx2, true},
        {sil_kv_scores_q4_0_avx2, sil_kv_accum_q4_0_avx2, true},
    };
    const int i = type == SIL_TYPE_F32    ? 0
                  : type == SIL_TYPE_F16  ? 1
                  : type == SIL_TYPE_Q8_0 ? 2
                  : type == SIL_TYPE_Q4_0 ? 3
                                          : -1;
    if (i < 0) return NULL;
    sil_cpu_init();
    return sil_cpu_level() >= SIL_CPU_AVX2 ? &avx2[i] : &scalar[i];
}
