/* AVX-512 (F/BW/VL/DQ) + VNNI dot products. Only used when the CPU has VNNI (cpu.c); then
 * AVX2 is present too, so the activation quantizers reuse the AVX2 ones where wider registers
 * would not help. Same integer sums as the scalar kernels; float accumulation order differs. */
#include <immintrin.h>
#include <stdbool.h>
#include <string.h>

#include "kernels/cpu/quants_impl.h"

static inline float fp16(sil_fp16 h)
{
    return _cvtsh_ss(h);
}

static inline float hsum256_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float sil_vec_dot_f32_avx512(int64_t n, const void *vw, const void *va)
{
    const float *w = vw, *a = va;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(a + i), s0);
        s1 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 16), _mm512_loadu_ps(a + i + 16), s1);
        s2 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 32), _mm512_loadu_ps(a + i + 32), s2);
        s3 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i + 48), _mm512_loadu_ps(a + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(_mm512_loadu_ps(w + i), _mm512_loadu_ps(a + i), s0);
    if (i < n) { /* masked tail: lanes past n load as zero */
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, w + i), _mm512_maskz_loadu_ps(k, a + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static inline __m512 load_f16(const uint16_t *p)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

float sil_vec_dot_f16_avx512(int64_t n, const void *vw, const void *va)
{
    const uint16_t *w = vw;
    const float *a = va;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        s0 = _mm512_fmadd_ps(load_f16(w + i), _mm512_loadu_ps(a + i), s0);
        s1 = _mm512_fmadd_ps(load_f16(w + i + 16), _mm512_loadu_ps(a + i + 16), s1);
        s2 = _mm512_fmadd_ps(load_f16(w + i + 32), _mm512_loadu_ps(a + i + 32), s2);
        s3 = _mm512_fmadd_ps(load_f16(w + i + 48), _mm512_loadu_ps(a + i + 48), s3);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(load_f16(w + i), _mm512_loadu_ps(a + i), s0);
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        const __m512 wf = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, w + i));
        s1 = _mm512_fmadd_ps(wf, _mm512_maskz_loadu_ps(k, a + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

static inline __m512 load_bf16(const uint16_t *p)
{
    const __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

float sil_vec_dot_bf16_avx512(int64_t n, const void *vw, const void *va)
{
    const uint16_t *w = vw;
    const float *a = va;
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm512_fmadd_ps(load_bf16(w + i), _mm512_loadu_ps(a + i), s0);
        s1 = _mm512_fmadd_ps(load_bf16(w + i + 16), _mm512_loadu_ps(a + i + 16), s1);
    }
    for (; i + 16 <= n; i += 16)
        s0 = _mm512_fmadd_ps(load_bf16(w + i), _mm512_loadu_ps(a + i), s0);
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1);
        const __m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, w + i));
        const __m512 wf = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        s1 = _mm512_fmadd_ps(wf, _mm512_maskz_loadu_ps(k, a + i), s1);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

/* ---- legacy formats: one 32-element block per 256-bit VNNI step -------------------------------- */

static inline __m256i dot_s8s8(__m256i x, __m256i y)
{
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

static inline __m256i nibbles32(const uint8_t *qs)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

/* 0x10 in byte j where bit j of qh is set: a mask register makes this one instruction */
static inline __m256i fifth_bits(const uint8_t *qh)
{
    uint32_t x;
    memcpy(&x, qh, 4);
    return _mm256_maskz_mov_epi8((__mmask32)x, _mm256_set1_epi8(0x10));
}

float sil_vec_dot_q8_0_avx512(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q8_0 *w = vw, *a = va;
    __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
    int64_t i = 0;
    const int64_t nb = n / SIL_QK;
    for (; i + 2 <= nb; i += 2) { /* two independent chains hide the dpbusd latency */
        sil_prefetch_block(&w[i], 2 * sizeof(w[i]));
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)w[i].qs);
        const __m256i y0 = _mm256_loadu_si256((const __m256i *)a[i].qs);
        const __m256i x1 = _mm256_loadu_si256((const __m256i *)w[i + 1].qs);
        const __m256i y1 = _mm256_loadu_si256((const __m256i *)a[i + 1].qs);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[i].d) * fp16(a[i].d)),
                               _mm256_cvtepi32_ps(dot_s8s8(x0, y0)), acc0);
        acc1 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[i + 1].d) * fp16(a[i + 1].d)),
                               _mm256_cvtepi32_ps(dot_s8s8(x1, y1)), acc1);
    }
    for (; i < nb; i++) {
        const __m256i x = _mm256_loadu_si256((const __m256i *)w[i].qs);
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        acc0 = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[i].d) * fp16(a[i].d)),
                               _mm256_cvtepi32_ps(dot_s8s8(x, y)), acc0);
    }
    return hsum256_ps(_mm256_add_ps(acc0, acc1));
}

float sil_vec_dot_q4_0_avx512(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q4_0 *w = vw;
    const struct sil_block_q8_0 *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        const __m256i x = _mm256_sub_epi8(nibbles32(w[i].qs), _mm256_set1_epi8(8));
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[i].d) * fp16(a[i].d)),
                              _mm256_cvtepi32_ps(dot_s8s8(x, y)), acc);
    }
    return hsum256_ps(acc);
}

float sil_vec_dot_q5_0_avx512(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q5_0 *w = vw;
    const struct sil_block_q8_0 *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        __m256i x = _mm256_or_si256(nibbles32(w[i].qs), fifth_bits(w[i].qh));
        x = _mm256_sub_epi8(x, _mm256_set1_epi8(16));
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[i].d) * fp16(a[i].d)),
                              _mm256_cvtepi32_ps(dot_s8s8(x, y)), acc);
    }
    return hsum256_ps(acc);
}

float sil_vec_dot_q4_1_avx512(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q4_1 *w = vw;
    const struct sil_block_q8_0 *a = va;
    __m256 acc = _mm256_setzero_ps(), accm = acc;
    const __m256i ones = _mm256_set1_epi8(1), zero = _mm256_setzero_si256();
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        const float da = fp16(a[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[i].d) * da),
                              _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(zero, nibbles32(w[i].qs), y)), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[i].m) * da),
                               _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(zero, ones, y)), accm);
    }
    return hsum256_ps(_mm256_add_ps(acc, accm));
}

float sil_vec_dot_q5_1_avx512(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q5_1 *w = vw;
    const struct sil_block_q8_0 *a = va;
    __m256 acc = _mm256_setzero_ps(), accm = acc;
    const __m256i ones = _mm256_set1_epi8(1), zero = _mm256_setzero_si256();
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        const __m256i q = _mm256_or_si256(nibbles32(w[i].qs), fifth_bits(w[i].qh));
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        const float da = fp16(a[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[i].d) * da),
                              _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(zero, q, y)), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[i].m) * da),
                               _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(zero, ones, y)), accm);
    }
    return hsum256_ps(_mm256_add_ps(acc, accm));
}

/* ---- k-quants: 64 elements per 512-bit VNNI step ------------------------------------------------ */

static inline __m512i join(__m256i lo, __m256i hi)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* sil_k4_unpack into a register (bytes 0..7 scales, 8..15 mins): going through memory costs a
 * store-forwarding stall per block, which the tiled kernel, not waiting on memory, feels (13.1 ->
 * 8.3 ns per dot with the other changes of that step). vec_dot keeps the memory round trip: there
 * the stall overlaps other blocks, and the inserts of this version made it 4% slower from L2. */
static inline __m128i k4_unpack_vec(const uint8_t *q)
{
    uint32_t w0, w1, w2;
    memcpy(&w0, q, 4);
    memcpy(&w1, q + 4, 4);
    memcpy(&w2, q + 8, 4);
    return _mm_setr_epi32(
        (int)(w0 & 0x3f3f3f3f), (int)((w2 & 0x0f0f0f0f) | (((w0 >> 6) & 0x03030303) << 4)),
        (int)(w1 & 0x3f3f3f3f), (int)(((w2 >> 4) & 0x0f0f0f0f) | (((w1 >> 6) & 0x03030303) << 4)));
}

/* sum_k mins[k] * (sum of sub-block k's activations); scm from k4_unpack_vec */
static inline __m128i k4_mins_dot(__m128i scm, const int16_t *bsums)
{
    const __m128i b0 = _mm_loadu_si128((const __m128i *)bsums);
    const __m128i b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
    const __m128i sub = _mm_hadd_epi16(b0, b1); /* |sum of 32 int8| <= 4064: fits */
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_srli_si128(scm, 8));
    return _mm_madd_epi16(sub, m16);
}

static inline float hsum128_ps(__m128 s)
{
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* idx[j]: lanes 0..7 take scale 2j, lanes 8..15 scale 2j+1 (of 16 int32 lanes sc0..7, m0..7) */
static const int32_t pair_idx[4][16] = {
    {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
    {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3},
    {4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5},
    {6, 6, 6, 6, 6, 6, 6, 6, 7, 7, 7, 7, 7, 7, 7, 7},
};

/* p * scale per lane; p = sum of 4 products (|p| <= 4*31*127 < 2^15), so multiplying its low
 * 16 bits (madd against a scale whose high 16 bits are zero) is exact and cheaper than mullo */
static inline __m512i scale_lanes(__m512i p, __m512i sc32, int j)
{
    const __m512i s = _mm512_permutexvar_epi32(_mm512_loadu_si512(pair_idx[j]), sc32);
    return _mm512_madd_epi16(p, s);
}

/* Adds the two 256-bit halves: the tiled q4_K kernel folds two pairs' sums into one register this
 * way before the float step, and vec_dot does the same so that both round identically. */
static inline __m256i fold256(__m512i v)
{
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

float sil_vec_dot_q4_K_avx512(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q4_K *w = vw;
    const struct sil_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        sil_prefetch_block(&w[i], sizeof(w[i]));
        uint8_t sm[16];
        sil_k4_unpack(w[i].scales, sm, sm + 8);
        const __m128i scm = _mm_loadu_si128((const __m128i *)sm);
        const __m512i sc32 = _mm512_cvtepu8_epi32(scm);
        __m512i sumi = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * j));
            const __m512i qq = join(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16(q, 4), m4));
            const __m512i y = _mm512_loadu_si512(a[i].qs + 64 * j);
            const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qq, y);
            sumi = _mm512_add_epi32(sumi, scale_lanes(p, sc32, j));
        }
        const float d = fp16(w[i].d) * a[i].d, dmin = fp16(w[i].dmin) * a[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(fold256(sumi)), acc);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_mins_dot(scm, a[i].bsums)), accm);
    }
    return hsum256_ps(acc) - hsum128_ps(accm);
}

float sil_vec_dot_q5_K_avx512(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q5_K *w = vw;
    const struct sil_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m512 acc = _mm512_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        sil_prefetch_block(&w[i], sizeof(w[i]));
        uint8_t sm[16];
        sil_k4_unpack(w[i].scales, sm, sm + 8);
        const __m128i scm = _mm_loadu_si128((const __m128i *)sm);
        const __m512i sc32 = _mm512_cvtepu8_epi32(scm);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)w[i].qh);
        __m512i sumi = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * j));
            const __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4);
            const __m256i hhi = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4);
            const __m512i qq = join(_mm256_or_si256(_mm256_and_si256(q, m4), hlo),
                                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hhi));
            const __m512i y = _mm512_loadu_si512(a[i].qs + 64 * j);
            const __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qq, y);
            sumi = _mm512_add_epi32(sumi, scale_lanes(p, sc32, j));
        }
        const float d = fp16(w[i].d) * a[i].d, dmin = fp16(w[i].dmin) * a[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_mins_dot(scm, a[i].bsums)), accm);
    }
    return _mm512_reduce_add_ps(acc) - hsum128_ps(accm);
}

float sil_vec_dot_q6_K_avx512(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q6_K *w = vw;
    const struct sil_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    /* lane k of the product of elements [64p, 64p+64) of half h belongs to sub-block
     * 8h + 4p + k/4 */
    const __m512i idx0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    const __m512i four = _mm512_set1_epi32(4);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        sil_prefetch_block(&w[i], sizeof(w[i]));
        /* signed scales in the low 16 bits of each lane, high 16 bits zero, for the madd trick
         * (|p| <= 4*63*127 < 2^15) */
        const __m512i sc16 = _mm512_and_si512(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)w[i].scales)),
                                              _mm512_set1_epi32(0xFFFF));
        __m512i sumi = _mm512_setzero_si512();
        __m512i idx = idx0;
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[i].ql + 64 * h;
            const int8_t *y = a[i].qs + 128 * h;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)(w[i].qh + 32 * h));
            const __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                               _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            const __m256i q1 = _mm256_or_si256(
                _mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            const __m256i q2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
            const __m256i q3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
            const __m512i pa = _mm512_dpbusd_epi32(_mm512_setzero_si512(), join(q0, q1), _mm512_loadu_si512(y));
            const __m512i pb = _mm512_dpbusd_epi32(_mm512_setzero_si512(), join(q2, q3), _mm512_loadu_si512(y + 64));
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(pa, _mm512_permutexvar_epi32(idx, sc16)));
            idx = _mm512_add_epi32(idx, four);
            sumi = _mm512_add_epi32(sumi, _mm512_madd_epi16(pb, _mm512_permutexvar_epi32(idx, sc16)));
            idx = _mm512_add_epi32(idx, four);
        }
        /* the -32 offset: sum_k sc_k * 32 * bsum_k */
        const __m256i bs = _mm256_loadu_si256((const __m256i *)a[i].bsums);
        const __m256i scw = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[i].scales));
        const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(bs, scw), 5);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[i].d) * a[i].d),
                              _mm256_cvtepi32_ps(_mm256_sub_epi32(fold256(sumi), corr)), acc);
    }
    return hsum256_ps(acc);
}

void sil_quantize_q8_0_avx512(const float *x, void *y, int64_t n)
{
    sil_quantize_q8_0_avx2(x, y, n);
}

void sil_quantize_q8_K_avx512(const float *x, void *y, int64_t n)
{
    sil_quantize_q8_K_avx2(x, y, n);
}

/* ---- tiled q4_K / q6_K x q8_K: R weight rows x C activation rows per pass -------------------- */

/* Prefill multiplies every weight row with many activation rows. One vec_dot per pair unpacks
 * each weight block and loads each activation block once per product; here each unpacked
 * weight vector serves C activation rows and each activation vector R weight rows. Per pair the
 * integer sums and the float steps are those of the type's vec_dot, in the same order, so the
 * results are bitwise equal to it. */

/* 4 x 4: q4_K unpacks cheaply, so activation loads weigh as much as weight unpacking */
#define Q4_R 4
#define Q4_C 4

static inline __attribute__((always_inline)) void q4_K_tile(const int R, const int C, int64_t n,
                                                            const void *vw, size_t wrs,
                                                            const void *const *va,
                                                            float *const *out)
{
    const __m512i m4x = _mm512_set1_epi8(0x0F);
    const __m512i nib_shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    /* pair (r, c): lanes 8(c%2)..8(c%2)+7 of acc[r][c/2], the sums folded as in vec_dot */
    __m512 acc[Q4_R][(Q4_C + 1) / 2];
    /* the mins term of pair (r, c) in lanes 4r..4r+3 of accm[c]: one 512-bit step serves 4 rows */
    __m512 accm[Q4_C];
    _Static_assert(Q4_R <= 4, "4 rows of mins per register");
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        accm[c] = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            acc[r][c / 2] = _mm512_setzero_ps();
    }
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        const struct sil_block_q4_K *w[Q4_R];
        const struct sil_block_q8_K *a[Q4_C];
        __m512i sc32[Q4_R];
        __m512i sumi[Q4_R][Q4_C];
        __m512i mins = _mm512_setzero_si512();
        __m512 dmin4 = _mm512_setzero_ps();
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            w[r] = (const struct sil_block_q4_K *)((const char *)vw + (size_t)r * wrs) + i;
            sil_prefetch_block(w[r], sizeof(*w[r]));
            const __m128i scm = k4_unpack_vec(w[r]->scales);
            sc32[r] = _mm512_cvtepu8_epi32(scm);
            mins = _mm512_mask_broadcast_i32x4(mins, (__mmask16)(0xF << 4 * r),
                                               _mm_cvtepu8_epi16(_mm_srli_si128(scm, 8)));
            dmin4 = _mm512_mask_mov_ps(dmin4, (__mmask16)(0xF << 4 * r),
                                       _mm512_set1_ps(fp16(w[r]->dmin)));
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            a[c] = (const struct sil_block_q8_K *)va[c] + i;
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                sumi[r][c] = _mm512_setzero_si512();
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) {
            __m512i qq[Q4_R], s[Q4_R];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                /* both nibble halves from one broadcast load and one variable shift: the bytes
                 * of vec_dot's two masks, shift and insert, in 2 vector ops fewer */
                const __m512i q = _mm512_broadcast_i64x4(
                    _mm256_loadu_si256((const __m256i *)(w[r]->qs + 32 * j)));
                qq[r] = _mm512_and_si512(_mm512_srlv_epi16(q, nib_shift), m4x);
                s[r] = _mm512_permutexvar_epi32(_mm512_loadu_si512(pair_idx[j]), sc32[r]);
            }
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m512i y = _mm512_loadu_si512(a[c]->qs + 64 * j);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) /* dpwssd = add(sumi, madd(p, s)) exactly */
                    sumi[r][c] = _mm512_dpwssd_epi32(
                        sumi[r][c], _mm512_dpbusd_epi32(_mm512_setzero_si512(), qq[r], y), s[r]);
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const __m128i b0 = _mm_loadu_si128((const __m128i *)a[c]->bsums);
            const __m128i b1 = _mm_loadu_si128((const __m128i *)(a[c]->bsums + 8));
            const __m512i sub = _mm512_broadcast_i32x4(_mm_hadd_epi16(b0, b1));
            accm[c] = _mm512_fmadd_ps(_mm512_mul_ps(dmin4, _mm512_set1_ps(a[c]->d)),
                                      _mm512_cvtepi32_ps(_mm512_madd_epi16(sub, mins)), accm[c]);
        }
#pragma GCC unroll 2
        for (int c = 0; c < C; c += 2) {
            const bool two = c + 1 < C;
            const __m512 da = _mm512_insertf32x8(_mm512_set1_ps(a[c]->d),
                                                 _mm256_set1_ps(two ? a[c + 1]->d : 0.0f), 1);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m512i s1 = two ? sumi[r][c + 1] : _mm512_setzero_si512();
                const __m512i f = _mm512_add_epi32(_mm512_shuffle_i64x2(sumi[r][c], s1, 0x44),
                                                   _mm512_shuffle_i64x2(sumi[r][c], s1, 0xEE));
                acc[r][c / 2] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(fp16(w[r]->d)), da),
                                                _mm512_cvtepi32_ps(f), acc[r][c / 2]);
            }
        }
    }
#pragma GCC unroll 4
    for (int c = 0; c < C; c++) {
        float m[16], v[16];
        _mm512_storeu_ps(m, accm[c]);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm512_storeu_ps(v, acc[r][c / 2]);
            out[c][r] =
                hsum256_ps(_mm256_loadu_ps(v + 8 * (c % 2))) - hsum128_ps(_mm_loadu_ps(m + 4 * r));
        }
    }
}

void sil_vec_dot_tile_q4_K_avx512(int64_t n, const void *w, size_t wrs, int nr,
                                  const void *const *a, int nc, float *const *out)
{
    if (nr == Q4_R) {
        for (int c = 0; c < nc; c += Q4_C) {
            switch (nc - c) {
            case 1:
                q4_K_tile(4, 1, n, w, wrs, a + c, out + c);
                break;
            case 2:
                q4_K_tile(4, 2, n, w, wrs, a + c, out + c);
                break;
            case 3:
                q4_K_tile(4, 3, n, w, wrs, a + c, out + c);
                break;
            default:
                q4_K_tile(4, 4, n, w, wrs, a + c, out + c);
                break;
            }
        }
        return;
    }
    for (int r = 0; r < nr; r++) /* the last rows of a matrix: one weight row at a time */
        for (int c = 0; c < nc; c++)
            out[c][r] = sil_vec_dot_q4_K_avx512(n, (const char *)w + (size_t)r * wrs, a[c]);
}

/* q6_K x q8_K the same way, 2 x 8: its weights cost more to unpack, so each unpacked vector
 * serves more activation rows (single thread, k = 1024: 7.5 ns per dot vs 8.8 for 4 x 4). The
 * -32 offset of each pair is subtracted after the fold, as vec_dot does, so the two stay
 * bitwise equal. */
#define Q6_R 2
#define Q6_C 8
static inline __attribute__((always_inline)) void q6_K_tile(const int R, const int C, int64_t n,
                                                            const void *vw, size_t wrs,
                                                            const void *const *va,
                                                            float *const *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    const __m512i idx0 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 acc[Q6_R][(Q6_C + 1) / 2];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c += 2)
            acc[r][c / 2] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        const struct sil_block_q6_K *w[Q6_R];
        const struct sil_block_q8_K *a[Q6_C];
        __m512i sc16[Q6_R], scw[Q6_R];
        __m512i sumi[Q6_R][Q6_C];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            w[r] = (const struct sil_block_q6_K *)((const char *)vw + (size_t)r * wrs) + i;
            sil_prefetch_block(w[r], sizeof(*w[r]));
            const __m128i sc = _mm_loadu_si128((const __m128i *)w[r]->scales);
            sc16[r] = _mm512_and_si512(_mm512_cvtepi8_epi32(sc), _mm512_set1_epi32(0xFFFF));
            scw[r] = _mm512_broadcast_i64x4(_mm256_cvtepi8_epi16(sc));
        }
#pragma GCC unroll 8
        for (int c = 0; c < C; c++)
            a[c] = (const struct sil_block_q8_K *)va[c] + i;
#pragma GCC unroll 8
        for (int r = 0; r < R; r++)
#pragma GCC unroll 8
            for (int c = 0; c < C; c++)
                sumi[r][c] = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m512i qa[Q6_R], qb[Q6_R];
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const uint8_t *ql = w[r]->ql + 64 * h;
                const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
                const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(w[r]->qh + 32 * h));
                const __m256i q0 = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                                   _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
                const __m256i q1 = _mm256_or_si256(
                    _mm256_and_si256(l1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
                const __m256i q2 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
                const __m256i q3 = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
                qa[r] = join(q0, q1);
                qb[r] = join(q2, q3);
            }
#pragma GCC unroll 2
            for (int p = 0; p < 2; p++) {
                const __m512i idx = _mm512_add_epi32(idx0, _mm512_set1_epi32(8 * h + 4 * p));
                __m512i s[Q6_R];
#pragma GCC unroll 8
                for (int r = 0; r < R; r++)
                    s[r] = _mm512_permutexvar_epi32(idx, sc16[r]);
#pragma GCC unroll 8
                for (int c = 0; c < C; c++) {
                    const __m512i y = _mm512_loadu_si512(a[c]->qs + 128 * h + 64 * p);
#pragma GCC unroll 8
                    for (int r = 0; r < R; r++)
                        sumi[r][c] = _mm512_dpwssd_epi32(
                            sumi[r][c],
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), p ? qb[r] : qa[r], y),
                            s[r]);
                }
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c += 2) {
            const bool two = c + 1 < C;
            const __m512 da = _mm512_insertf32x8(_mm512_set1_ps(a[c]->d),
                                                 _mm256_set1_ps(two ? a[c + 1]->d : 0.0f), 1);
            const __m256i bs0 = _mm256_loadu_si256((const __m256i *)a[c]->bsums);
            const __m512i bs = _mm512_inserti64x4(
                _mm512_castsi256_si512(bs0),
                two ? _mm256_loadu_si256((const __m256i *)a[c + 1]->bsums) : _mm256_setzero_si256(),
                1);
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                const __m512i s1 = two ? sumi[r][c + 1] : _mm512_setzero_si512();
                const __m512i f = _mm512_add_epi32(_mm512_shuffle_i64x2(sumi[r][c], s1, 0x44),
                                                   _mm512_shuffle_i64x2(sumi[r][c], s1, 0xEE));
                const __m512i corr = _mm512_slli_epi32(_mm512_madd_epi16(bs, scw[r]), 5);
                acc[r][c / 2] =
                    _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(fp16(w[r]->d)), da),
                                    _mm512_cvtepi32_ps(_mm512_sub_epi32(f, corr)), acc[r][c / 2]);
            }
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; c++) {
        float v[16];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            _mm512_storeu_ps(v, acc[r][c / 2]);
            out[c][r] = hsum256_ps(_mm256_loadu_ps(v + 8 * (c % 2)));
        }
    }
}

void sil_vec_dot_tile_q6_K_avx512(int64_t n, const void *w, size_t wrs, int nr,
                                  const void *const *a, int nc, float *const *out)
{
    int r = 0;
    for (; r + Q6_R <= nr; r += Q6_R) {
        const void *wr = (const char *)w + (size_t)r * wrs;
        float *o[SIL_TILE_C];
        for (int c = 0; c < nc; c++)
            o[c] = out[c] + r;
        switch (nc) {
        case 1:
            q6_K_tile(2, 1, n, wr, wrs, a, o);
            break;
        case 2:
            q6_K_tile(2, 2, n, wr, wrs, a, o);
            break;
        case 3:
            q6_K_tile(2, 3, n, wr, wrs, a, o);
            break;
        case 4:
            q6_K_tile(2, 4, n, wr, wrs, a, o);
            break;
        case 5:
            q6_K_tile(2, 5, n, wr, wrs, a, o);
            break;
        case 6:
            q6_K_tile(2, 6, n, wr, wrs, a, o);
            break;
        case 7:
            q6_K_tile(2, 7, n, wr, wrs, a, o);
            break;
        default:
            q6_K_tile(2, 8, n, wr, wrs, a, o);
            break;
        }
    }
    for (; r < nr; r++)
        for (int c = 0; c < nc; c++)
            out[c][r] = sil_vec_dot_q6_K_avx512(n, (const char *)w + (size_t)r * wrs, a[c]);
}
