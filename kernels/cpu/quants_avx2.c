/* AVX2 + FMA + F16C dot products and activation quantizers. Same integer sums as the scalar
 * kernels in quants.c; only the order of the float accumulation differs. */
#include <immintrin.h>
#include <string.h>

#include "kernels/cpu/quants_impl.h"

static inline float fp16(sil_fp16 h)
{
    return _cvtsh_ss(h);
}

static inline float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline int hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static inline float hmax_ps(__m256 v)
{
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* unsigned bytes x signed bytes, summed in pairs then fours -> 8 int32 */
static inline __m256i dot_u8s8(__m256i u, __m256i s)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* signed x signed: move x's sign onto y so the left operand is unsigned */
static inline __m256i dot_s8s8(__m256i x, __m256i y)
{
    return dot_u8s8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
}

/* 32 nibbles of a legacy block: elements 0..15 from the low nibbles, 16..31 from the high */
static inline __m256i nibbles32(const uint8_t *qs)
{
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
}

/* 0x10 in byte j where bit j of the little-endian 32-bit qh is set */
static inline __m256i fifth_bits(const uint8_t *qh)
{
    uint32_t x;
    memcpy(&x, qh, 4);
    const __m256i shuf = _mm256_setr_epi64x(0x0000000000000000, 0x0101010101010101,
                                            0x0202020202020202, 0x0303030303030303);
    __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), shuf);
    b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    b = _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1));
    return _mm256_and_si256(b, _mm256_set1_epi8(0x10));
}

float sil_vec_dot_f32_avx2(int64_t n, const void *vw, const void *va)
{
    const float *w = vw, *a = va;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 8), _mm256_loadu_ps(a + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 16), _mm256_loadu_ps(a + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i + 24), _mm256_loadu_ps(a + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + i), _mm256_loadu_ps(a + i), s0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        s += w[i] * a[i];
    return s;
}

static inline __m256 load_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

float sil_vec_dot_f16_avx2(int64_t n, const void *vw, const void *va)
{
    const uint16_t *w = vw;
    const float *a = va;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(load_f16(w + i), _mm256_loadu_ps(a + i), s0);
        s1 = _mm256_fmadd_ps(load_f16(w + i + 8), _mm256_loadu_ps(a + i + 8), s1);
        s2 = _mm256_fmadd_ps(load_f16(w + i + 16), _mm256_loadu_ps(a + i + 16), s2);
        s3 = _mm256_fmadd_ps(load_f16(w + i + 24), _mm256_loadu_ps(a + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(load_f16(w + i), _mm256_loadu_ps(a + i), s0);
    float s = hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++)
        s += fp16(w[i]) * a[i];
    return s;
}

static inline __m256 load_bf16(const uint16_t *p)
{
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

float sil_vec_dot_bf16_avx2(int64_t n, const void *vw, const void *va)
{
    const uint16_t *w = vw;
    const float *a = va;
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(load_bf16(w + i), _mm256_loadu_ps(a + i), s0);
        s1 = _mm256_fmadd_ps(load_bf16(w + i + 8), _mm256_loadu_ps(a + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8)
        s0 = _mm256_fmadd_ps(load_bf16(w + i), _mm256_loadu_ps(a + i), s0);
    float s = hsum_ps(_mm256_add_ps(s0, s1));
    for (; i < n; i++) {
        const uint32_t u = (uint32_t)w[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        s += f * a[i];
    }
    return s;
}

float sil_vec_dot_q8_0_avx2(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q8_0 *w = vw, *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        sil_prefetch_block(&w[i], sizeof(w[i]));
        const __m256i x = _mm256_loadu_si256((const __m256i *)w[i].qs);
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        const __m256 d = _mm256_set1_ps(fp16(w[i].d) * fp16(a[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_s8s8(x, y)), acc);
    }
    return hsum_ps(acc);
}

float sil_vec_dot_q4_0_avx2(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q4_0 *w = vw;
    const struct sil_block_q8_0 *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        const __m256i x = _mm256_sub_epi8(nibbles32(w[i].qs), _mm256_set1_epi8(8));
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        const __m256 d = _mm256_set1_ps(fp16(w[i].d) * fp16(a[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_s8s8(x, y)), acc);
    }
    return hsum_ps(acc);
}

float sil_vec_dot_q5_0_avx2(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q5_0 *w = vw;
    const struct sil_block_q8_0 *a = va;
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        __m256i x = _mm256_or_si256(nibbles32(w[i].qs), fifth_bits(w[i].qh));
        x = _mm256_sub_epi8(x, _mm256_set1_epi8(16));
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        const __m256 d = _mm256_set1_ps(fp16(w[i].d) * fp16(a[i].d));
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_s8s8(x, y)), acc);
    }
    return hsum_ps(acc);
}

/* Affine formats: d*da*sum(q*qa) + m*da*sum(qa), q unsigned. */
static inline float dot_affine(int64_t nb, const uint8_t *base, size_t stride, const void *va,
                               __m256i (*unpack)(const uint8_t *blk))
{
    const struct sil_block_q8_0 *a = va;
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t i = 0; i < nb; i++) {
        const uint8_t *blk = base + i * stride;
        sil_fp16 dw, mw;
        memcpy(&dw, blk, 2);
        memcpy(&mw, blk + 2, 2);
        const __m256i y = _mm256_loadu_si256((const __m256i *)a[i].qs);
        const float da = fp16(a[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(dw) * da),
                              _mm256_cvtepi32_ps(dot_u8s8(unpack(blk), y)), acc);
        accm = _mm256_fmadd_ps(_mm256_set1_ps(fp16(mw) * da),
                               _mm256_cvtepi32_ps(dot_u8s8(ones, y)), accm);
    }
    return hsum_ps(_mm256_add_ps(acc, accm));
}

static __m256i unpack_q4_1(const uint8_t *blk)
{
    return nibbles32(((const struct sil_block_q4_1 *)blk)->qs);
}

static __m256i unpack_q5_1(const uint8_t *blk)
{
    const struct sil_block_q5_1 *b = (const struct sil_block_q5_1 *)blk;
    return _mm256_or_si256(nibbles32(b->qs), fifth_bits(b->qh));
}

float sil_vec_dot_q4_1_avx2(int64_t n, const void *w, const void *a)
{
    return dot_affine(n / SIL_QK, w, sizeof(struct sil_block_q4_1), a, unpack_q4_1);
}

float sil_vec_dot_q5_1_avx2(int64_t n, const void *w, const void *a)
{
    return dot_affine(n / SIL_QK, w, sizeof(struct sil_block_q5_1), a, unpack_q5_1);
}

/* sum_j m_j * (sum of the activations of sub-block j) as 4 int32 lanes: bsums summed in
 * pairs (each pair is one sub-block of 32), times the 8 mins */
static inline __m128i k4_mins_dot(const uint8_t *mins, const int16_t *bsums)
{
    const __m128i b0 = _mm_loadu_si128((const __m128i *)bsums);
    const __m128i b1 = _mm_loadu_si128((const __m128i *)(bsums + 8));
    const __m128i sub = _mm_hadd_epi16(b0, b1); /* |sum of 32 int8| <= 4064: fits */
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mins));
    return _mm_madd_epi16(sub, m16);
}

static inline float hsum128_ps(__m128 s)
{
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float sil_vec_dot_q4_K_avx2(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q4_K *w = vw;
    const struct sil_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        sil_prefetch_block(&w[i], sizeof(w[i]));
        uint8_t sc[8], mn[8];
        sil_k4_unpack(w[i].scales, sc, mn);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * j));
            const __m256i lo = _mm256_and_si256(q, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            const __m256i ylo = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * j));
            const __m256i yhi = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * j + 32));
            const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo),
                                                  _mm256_set1_epi16(sc[2 * j]));
            const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi),
                                                  _mm256_set1_epi16(sc[2 * j + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
        }
        const float d = fp16(w[i].d) * a[i].d, dmin = fp16(w[i].dmin) * a[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_mins_dot(mn, a[i].bsums)), accm);
    }
    return hsum_ps(acc) - hsum128_ps(accm);
}

float sil_vec_dot_q5_K_avx2(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q5_K *w = vw;
    const struct sil_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    __m128 accm = _mm_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        sil_prefetch_block(&w[i], sizeof(w[i]));
        uint8_t sc[8], mn[8];
        sil_k4_unpack(w[i].scales, sc, mn);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)w[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(w[i].qs + 32 * j));
            /* bit 2j of qh[l] is the fifth bit of the low nibble, bit 2j+1 of the high one;
             * shifts are per 16 bits, the mask keeps them from crossing bytes */
            const __m256i hlo = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j), one), 4);
            const __m256i hhi =
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j + 1), one), 4);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), hlo);
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hhi);
            const __m256i ylo = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * j));
            const __m256i yhi = _mm256_loadu_si256((const __m256i *)(a[i].qs + 64 * j + 32));
            const __m256i plo = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo),
                                                  _mm256_set1_epi16(sc[2 * j]));
            const __m256i phi = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi),
                                                  _mm256_set1_epi16(sc[2 * j + 1]));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
        }
        const float d = fp16(w[i].d) * a[i].d, dmin = fp16(w[i].dmin) * a[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        accm = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(k4_mins_dot(mn, a[i].bsums)), accm);
    }
    return hsum_ps(acc) - hsum128_ps(accm);
}

/* q6_K: values 0..63 (unsigned) times activations, scaled per 16; the -32 offset is applied
 * once per block through bsums: sum_k sc_k * 32 * bsum_k. */
float sil_vec_dot_q6_K_avx2(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q6_K *w = vw;
    const struct sil_block_q8_K *a = va;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        sil_prefetch_block(&w[i], sizeof(w[i]));
        const int8_t *sc = w[i].scales;
        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[i].ql + 64 * h, *qhp = w[i].qh + 32 * h;
            const int8_t *y = a[i].qs + 128 * h;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i qh = _mm256_loadu_si256((const __m256i *)qhp);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(qh, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m3), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m3), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m3), 4));
            for (int k = 0; k < 4; k++) {
                const __m256i yk = _mm256_loadu_si256((const __m256i *)(y + 32 * k));
                const int s0 = sc[8 * h + 2 * k], s1 = sc[8 * h + 2 * k + 1];
                const __m256i scv = _mm256_set_m128i(_mm_set1_epi16((short)s1), _mm_set1_epi16((short)s0));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q[k], yk), scv));
            }
        }
        const __m256i bs = _mm256_loadu_si256((const __m256i *)a[i].bsums);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[i].d) * a[i].d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_ps(acc);
}

/* ---- activation quantizers: bit-identical to the reference ones in quants.c ----------------- */

static inline __m256 abs_ps(__m256 v)
{
    return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v);
}

/* round-to-nearest-even of 32 floats times id, packed to 32 int8 in order */
static inline __m256i round_pack32(const float *x, __m256 id, __m256i *v32)
{
    for (int k = 0; k < 4; k++) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), id);
        v32[k] = _mm256_cvtps_epi32(_mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const __m256i a = _mm256_packs_epi32(v32[0], v32[1]), b = _mm256_packs_epi32(v32[2], v32[3]);
    return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

void sil_quantize_q8_0_avx2(const float *x, void *vy, int64_t n)
{
    struct sil_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / SIL_QK; i++, x += SIL_QK) {
        __m256 m = abs_ps(_mm256_loadu_ps(x));
        for (int k = 1; k < 4; k++)
            m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 8 * k)));
        const float amax = hmax_ps(m);
        const float d = amax < SIL_AMAX_EPS ? 0.0f : amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        __m256i v32[4];
        _mm256_storeu_si256((__m256i *)y[i].qs, round_pack32(x, _mm256_set1_ps(id), v32));
    }
}

void sil_quantize_q8_K_avx2(const float *x, void *vy, int64_t n)
{
    struct sil_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / SIL_QK_K; i++, x += SIL_QK_K) {
        __m256 m = abs_ps(_mm256_loadu_ps(x));
        for (int k = 1; k < 32; k++)
            m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + 8 * k)));
        const float amax = hmax_ps(m);
        if (amax < SIL_AMAX_EPS) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = 127.f / amax;
        const __m256 vs = _mm256_set1_ps(iscale);
        for (int g = 0; g < 8; g++) {
            __m256i v32[4];
            _mm256_storeu_si256((__m256i *)(y[i].qs + 32 * g), round_pack32(x + 32 * g, vs, v32));
            y[i].bsums[2 * g] = (int16_t)hsum_epi32(_mm256_add_epi32(v32[0], v32[1]));
            y[i].bsums[2 * g + 1] = (int16_t)hsum_epi32(_mm256_add_epi32(v32[2], v32[3]));
        }
        y[i].d = 1 / iscale;
    }
}

/* ---- tiled q4_K / q6_K x q8_K: weight rows x activation rows per pass ------------------------- */

/* A batch multiplies every weight row with several activation rows (prefill, or a decode step of
 * several sequences). One vec_dot per pair unpacks each weight vector and loads each activation
 * vector once per product; here each unpacked weight vector serves T_C activation rows and each
 * activation vector T_R weight rows. 16 ymm registers hold a 2 x 4 tile of int32 sums with the
 * two weight vectors, their scales and one activation vector. Per pair the integer sums (exact,
 * in any order) and the float steps are those of the type's vec_dot, in its order and lanes, so
 * the results are bitwise equal to it. */
#define T_R 2
#define T_C 4

static inline __attribute__((always_inline)) void q4_K_tile(const int R, const int C, int64_t n,
                                                            const char *vw, size_t wrs,
                                                            const void *const *va, float *const *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc[T_R][T_C];
    __m128 accm[T_R][T_C];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            acc[r][c] = _mm256_setzero_ps();
            accm[r][c] = _mm_setzero_ps();
        }
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        const struct sil_block_q4_K *w[T_R];
        const struct sil_block_q8_K *a[T_C];
        uint8_t sc[T_R][8], mn[T_R][8];
        __m256i sumi[T_R][T_C];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            w[r] = (const struct sil_block_q4_K *)(vw + (size_t)r * wrs) + i;
            sil_prefetch_block(w[r], sizeof(*w[r]));
            sil_k4_unpack(w[r]->scales, sc[r], mn[r]);
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            a[c] = (const struct sil_block_q8_K *)va[c] + i;
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                sumi[r][c] = _mm256_setzero_si256();
#pragma GCC unroll 1
        for (int j = 0; j < 4; j++)
#pragma GCC unroll 2
        for (int hf = 0; hf < 2; hf++) { /* sub-block s: nibbles hf of bytes 32 j.. */
            const int s = 2 * j + hf;
            __m256i q[T_R], scv[T_R];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const __m256i b = _mm256_loadu_si256((const __m256i *)(w[r]->qs + 32 * j));
                q[r] = _mm256_and_si256(hf ? _mm256_srli_epi16(b, 4) : b, m4);
                scv[r] = _mm256_set1_epi16(sc[r][s]);
            }
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m256i y = _mm256_loadu_si256((const __m256i *)(a[c]->qs + 32 * s));
#pragma GCC unroll 2
                for (int r = 0; r < R; r++)
                    sumi[r][c] = _mm256_add_epi32(
                        sumi[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], y), scv[r]));
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const __m128i b0 = _mm_loadu_si128((const __m128i *)a[c]->bsums);
            const __m128i b1 = _mm_loadu_si128((const __m128i *)(a[c]->bsums + 8));
            const __m128i sub = _mm_hadd_epi16(b0, b1);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const __m128i m16 = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)mn[r]));
                const float d = fp16(w[r]->d) * a[c]->d, dmin = fp16(w[r]->dmin) * a[c]->d;
                acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi[r][c]),
                                            acc[r][c]);
                accm[r][c] = _mm_fmadd_ps(_mm_set1_ps(dmin),
                                          _mm_cvtepi32_ps(_mm_madd_epi16(sub, m16)), accm[r][c]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            out[c][r] = hsum_ps(acc[r][c]) - hsum128_ps(accm[r][c]);
}

static inline __attribute__((always_inline)) void q6_K_tile(const int R, const int C, int64_t n,
                                                            const char *vw, size_t wrs,
                                                            const void *const *va, float *const *out)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
    __m256 acc[T_R][T_C];
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            acc[r][c] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        const struct sil_block_q6_K *w[T_R];
        const struct sil_block_q8_K *a[T_C];
        __m256i sumi[T_R][T_C];
#pragma GCC unroll 2
        for (int r = 0; r < R; r++) {
            w[r] = (const struct sil_block_q6_K *)(vw + (size_t)r * wrs) + i;
            sil_prefetch_block(w[r], sizeof(*w[r]));
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            a[c] = (const struct sil_block_q8_K *)va[c] + i;
#pragma GCC unroll 2
        for (int r = 0; r < R; r++)
#pragma GCC unroll 4
            for (int c = 0; c < C; c++)
                sumi[r][c] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int s = 0; s < 8; s++) { /* vec_dot's q[k] of half h, s = 4 h + k */
            const int h = s / 4, k = s % 4;
            __m256i q[T_R], scv[T_R];
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const __m256i l =
                    _mm256_loadu_si256((const __m256i *)(w[r]->ql + 64 * h + 32 * (k & 1)));
                const __m256i qh = _mm256_loadu_si256((const __m256i *)(w[r]->qh + 32 * h));
                const __m256i lo = _mm256_and_si256(k >= 2 ? _mm256_srli_epi16(l, 4) : l, m4);
                const __m256i hb = _mm256_and_si256(k ? _mm256_srli_epi16(qh, 2 * k) : qh, m3);
                q[r] = _mm256_or_si256(lo, _mm256_slli_epi16(hb, 4));
                const int8_t *scl = w[r]->scales + 8 * h + 2 * k;
                scv[r] = _mm256_set_m128i(_mm_set1_epi16((short)scl[1]), _mm_set1_epi16((short)scl[0]));
            }
#pragma GCC unroll 4
            for (int c = 0; c < C; c++) {
                const __m256i y = _mm256_loadu_si256((const __m256i *)(a[c]->qs + 32 * s));
#pragma GCC unroll 2
                for (int r = 0; r < R; r++)
                    sumi[r][c] = _mm256_add_epi32(
                        sumi[r][c], _mm256_madd_epi16(_mm256_maddubs_epi16(q[r], y), scv[r]));
            }
        }
#pragma GCC unroll 4
        for (int c = 0; c < C; c++) {
            const __m256i bs = _mm256_loadu_si256((const __m256i *)a[c]->bsums);
#pragma GCC unroll 2
            for (int r = 0; r < R; r++) {
                const __m256i sc16 =
                    _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w[r]->scales));
                const __m256i si = _mm256_sub_epi32(sumi[r][c],
                                                    _mm256_slli_epi32(_mm256_madd_epi16(bs, sc16), 5));
                acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(fp16(w[r]->d) * a[c]->d),
                                            _mm256_cvtepi32_ps(si), acc[r][c]);
            }
        }
    }
#pragma GCC unroll 2
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < C; c++)
            out[c][r] = hsum_ps(acc[r][c]);
}

/* The tile's rows in pairs (an odd last one alone), its activation rows in fours (the rest in
 * one pass of 1-3): every shape is a kernel of constant R and C. */
#define TILE_DISPATCH(kern)                                                                        \
    for (int r = 0; r < nr; r += T_R) {                                                            \
        const char *wr = (const char *)w + (size_t)r * wrs;                                        \
        const bool two = nr - r >= 2;                                                              \
        for (int c = 0; c < nc; c += T_C) {                                                        \
            float *o[T_C];                                                                         \
            const int cc = nc - c < T_C ? nc - c : T_C;                                            \
            for (int j = 0; j < cc; j++)                                                           \
                o[j] = out[c + j] + r;                                                             \
            switch (cc * 2 + two) {                                                                \
            case 2: kern(1, 1, n, wr, wrs, a + c, o); break;                                       \
            case 3: kern(2, 1, n, wr, wrs, a + c, o); break;                                       \
            case 4: kern(1, 2, n, wr, wrs, a + c, o); break;                                       \
            case 5: kern(2, 2, n, wr, wrs, a + c, o); break;                                       \
            case 6: kern(1, 3, n, wr, wrs, a + c, o); break;                                       \
            case 7: kern(2, 3, n, wr, wrs, a + c, o); break;                                       \
            case 8: kern(1, 4, n, wr, wrs, a + c, o); break;                                       \
            default: kern(2, 4, n, wr, wrs, a + c, o); break;                                      \
            }                                                                                      \
        }                                                                                          \
    }

void sil_vec_dot_tile_q4_K_avx2(int64_t n, const void *w, size_t wrs, int nr,
                                const void *const *a, int nc, float *const *out)
{
    TILE_DISPATCH(q4_K_tile)
}

void sil_vec_dot_tile_q6_K_avx2(int64_t n, const void *w, size_t wrs, int nr,
                                const void *const *a, int nc, float *const *out)
{
    TILE_DISPATCH(q6_K_tile)
}
