/* AVX2 + FMA + F16C attention kernels over cached KV heads; same integer sums as the scalar
 * ones in kv_attn.c, only the order of the float accumulation differs. */
#include <immintrin.h>

#include "kernels/cpu/kv_attn.h"
#include "kernels/cpu/quants_impl.h"

static inline float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline const void *row(const void *base, size_t stride, int t)
{
    return (const char *)base + (size_t)t * stride;
}

/* signed x signed bytes summed in fours -> 8 int32 */
static inline __m256i dot_s8s8(__m256i x, __m256i y)
{
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* the 32 elements of a q4_0 block as signed bytes */
static inline __m256i q4_bytes(const uint8_t *qs)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_sub_epi8(_mm256_and_si256(b, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
}

void sil_kv_scores_f32_avx2(const float *q, const void *qq, const void *k, size_t stride, int n,
                            int hd, float scale, float *scores)
{
    (void)qq;
    for (int t = 0; t < n; t++) {
        const float *kt = row(k, stride, t);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int j = 0;
        for (; j + 16 <= hd; j += 16) {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), _mm256_loadu_ps(kt + j), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 8), _mm256_loadu_ps(kt + j + 8), a1);
        }
        float s = hsum(_mm256_add_ps(a0, a1));
        for (; j < hd; j++)
            s += q[j] * kt[j];
        scores[t] = s * scale;
    }
}

void sil_kv_scores_f16_avx2(const float *q, const void *qq, const void *k, size_t stride, int n,
                            int hd, float scale, float *scores)
{
    (void)qq;
    for (int t = 0; t < n; t++) {
        const sil_fp16 *kt = row(k, stride, t);
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        int j = 0;
        for (; j + 16 <= hd; j += 16) {
            const __m256 k0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kt + j)));
            const __m256 k1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(kt + j + 8)));
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j), k0, a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + j + 8), k1, a1);
        }
        float s = hsum(_mm256_add_ps(a0, a1));
        for (; j < hd; j++)
            s += q[j] * _cvtsh_ss(kt[j]);
        scores[t] = s * scale;
    }
}

void sil_kv_scores_q8_0_avx2(const float *q, const void *qq, const void *k, size_t stride, int n,
                             int hd, float scale, float *scores)
{
    (void)q;
    const struct sil_block_q8_0 *a = qq;
    for (int t = 0; t < n; t++) {
        const struct sil_block_q8_0 *w = row(k, stride, t);
        __m256 acc = _mm256_setzero_ps();
        for (int b = 0; b < hd / SIL_QK; b++) {
            const __m256i x = _mm256_loadu_si256((const __m256i *)w[b].qs);
            const __m256i y = _mm256_loadu_si256((const __m256i *)a[b].qs);
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(w[b].d) * _cvtsh_ss(a[b].d));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_s8s8(x, y)), acc);
        }
        scores[t] = hsum(acc) * scale;
    }
}

void sil_kv_scores_q4_0_avx2(const float *q, const void *qq, const void *k, size_t stride, int n,
                             int hd, float scale, float *scores)
{
    (void)q;
    const struct sil_block_q8_0 *a = qq;
    for (int t = 0; t < n; t++) {
        const struct sil_block_q4_0 *w = row(k, stride, t);
        __m256 acc = _mm256_setzero_ps();
        for (int b = 0; b < hd / SIL_QK; b++) {
            const __m256i x = q4_bytes(w[b].qs);
            const __m256i y = _mm256_loadu_si256((const __m256i *)a[b].qs);
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(w[b].d) * _cvtsh_ss(a[b].d));
            acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_s8s8(x, y)), acc);
        }
        scores[t] = hsum(acc) * scale;
    }
}

/* The V sums keep 32 outputs in registers while streaming the n cached rows past them. */
void sil_kv_accum_f32_avx2(float *o, const float *p, const void *v, size_t stride, int n, int hd)
{
    int j = 0;
    for (; j + 32 <= hd; j += 32) {
        __m256 o0 = _mm256_loadu_ps(o + j), o1 = _mm256_loadu_ps(o + j + 8);
        __m256 o2 = _mm256_loadu_ps(o + j + 16), o3 = _mm256_loadu_ps(o + j + 24);
        for (int t = 0; t < n; t++) {
            const float *vt = (const float *)row(v, stride, t) + j;
            const __m256 s = _mm256_set1_ps(p[t]);
            o0 = _mm256_fmadd_ps(s, _mm256_loadu_ps(vt), o0);
            o1 = _mm256_fmadd_ps(s, _mm256_loadu_ps(vt + 8), o1);
            o2 = _mm256_fmadd_ps(s, _mm256_loadu_ps(vt + 16), o2);
            o3 = _mm256_fmadd_ps(s, _mm256_loadu_ps(vt + 24), o3);
        }
        _mm256_storeu_ps(o + j, o0);
        _mm256_storeu_ps(o + j + 8, o1);
        _mm256_storeu_ps(o + j + 16, o2);
        _mm256_storeu_ps(o + j + 24, o3);
    }
    for (int t = 0; t < n && j < hd; t++) {
        const float *vt = row(v, stride, t);
        for (int i = j; i < hd; i++)
            o[i] += p[t] * vt[i];
    }
}

void sil_kv_accum_f16_avx2(float *o, const float *p, const void *v, size_t stride, int n, int hd)
{
    int j = 0;
    for (; j + 32 <= hd; j += 32) {
        __m256 o0 = _mm256_loadu_ps(o + j), o1 = _mm256_loadu_ps(o + j + 8);
        __m256 o2 = _mm256_loadu_ps(o + j + 16), o3 = _mm256_loadu_ps(o + j + 24);
        for (int t = 0; t < n; t++) {
            const sil_fp16 *vt = (const sil_fp16 *)row(v, stride, t) + j;
            const __m256 s = _mm256_set1_ps(p[t]);
            o0 = _mm256_fmadd_ps(s, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)vt)), o0);
            o1 =
                _mm256_fmadd_ps(s, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vt + 8))), o1);
            o2 = _mm256_fmadd_ps(s, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vt + 16))),
                                 o2);
            o3 = _mm256_fmadd_ps(s, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vt + 24))),
                                 o3);
        }
        _mm256_storeu_ps(o + j, o0);
        _mm256_storeu_ps(o + j + 8, o1);
        _mm256_storeu_ps(o + j + 16, o2);
        _mm256_storeu_ps(o + j + 24, o3);
    }
    for (int t = 0; t < n && j < hd; t++) {
        const sil_fp16 *vt = row(v, stride, t);
        for (int i = j; i < hd; i++)
            o[i] += p[t] * _cvtsh_ss(vt[i]);
    }
}

/* 32 signed bytes -> o[0..32) += s * bytes */
static inline void axpy_bytes(__m256 s, __m256i x, __m256 *o)
{
    const __m128i lo = _mm256_castsi256_si128(x), hi = _mm256_extracti128_si256(x, 1);
    o[0] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), o[0]);
    o[1] =
        _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), o[1]);
    o[2] = _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), o[2]);
    o[3] =
        _mm256_fmadd_ps(s, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), o[3]);
}

void sil_kv_accum_q8_0_avx2(float *o, const float *p, const void *v, size_t stride, int n, int hd)
{
    for (int b = 0; b < hd / SIL_QK; b++) {
        float *ob = o + b * SIL_QK;
        __m256 acc[4] = {_mm256_loadu_ps(ob), _mm256_loadu_ps(ob + 8), _mm256_loadu_ps(ob + 16),
                         _mm256_loadu_ps(ob + 24)};
        for (int t = 0; t < n; t++) {
            const struct sil_block_q8_0 *w = (const struct sil_block_q8_0 *)row(v, stride, t) + b;
            axpy_bytes(_mm256_set1_ps(p[t] * _cvtsh_ss(w->d)),
                       _mm256_loadu_si256((const __m256i *)w->qs), acc);
        }
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(ob + 8 * i, acc[i]);
    }
}

void sil_kv_accum_q4_0_avx2(float *o, const float *p, const void *v, size_t stride, int n, int hd)
{
    for (int b = 0; b < hd / SIL_QK; b++) {
        float *ob = o + b * SIL_QK;
        __m256 acc[4] = {_mm256_loadu_ps(ob), _mm256_loadu_ps(ob + 8), _mm256_loadu_ps(ob + 16),
                         _mm256_loadu_ps(ob + 24)};
        for (int t = 0; t < n; t++) {
            const struct sil_block_q4_0 *w = (const struct sil_block_q4_0 *)row(v, stride, t) + b;
            axpy_bytes(_mm256_set1_ps(p[t] * _cvtsh_ss(w->d)), q4_bytes(w->qs), acc);
        }
        for (int i = 0; i < 4; i++)
            _mm256_storeu_ps(ob + 8 * i, acc[i]);
    }
}
