/* The type_traits table, scalar dequantizers, reference quantizers and scalar dot products.
 * The scalar kernels are the reference the SIMD ones (quants_avx2.c, quants_avx512.c) are
 * tested against: they define the integer sums exactly and the float combination per block. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_impl.h"

/* ---- fp16 / bf16 ------------------------------------------------------------------------------ */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* Round-half-to-even to int for |x| < 2^22, the rounding mode the SIMD quantizers use too
 * (adding 1.5*2^23 leaves the rounded integer in the low mantissa bits). */
static inline int nearest_int(float x)
{
    float v = x + 12582912.f;
    return (int)(f32_bits(v) & 0x007fffff) - 0x00400000;
}

float sil_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff;
    if (exp == 0) {
        if (mant == 0)
            return bits_f32(sign);
        /* subnormal half: every one is a normal float */
        uint32_t e = 113;
        while (!(mant & 0x400)) {
            mant <<= 1;
            e--;
        }
        return bits_f32(sign | (e << 23) | ((mant & 0x3ff) << 13));
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000 | (mant << 13) | (mant ? 0x400000 : 0));
    return bits_f32(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t sil_fp32_to_fp16(float f)
{
    uint32_t x = f32_bits(f);
    uint16_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffff;
    if (ax > 0x7f800000) /* NaN: quiet, keep the top payload bits (as F16C does) */
        return sign | 0x7e00 | (uint16_t)((ax >> 13) & 0x3ff);
    if (ax >= 0x477ff000) /* >= 65520 rounds to infinity */
        return sign | 0x7c00;
    if (ax < 0x38800000) { /* below the smallest normal half: multiples of 2^-24 */
        float v = bits_f32(ax) * 16777216.0f; /* exact: scaling by a power of two */
        return sign | (uint16_t)nearest_int(v);
    }
    ax += 0xfff + ((ax >> 13) & 1);
    return sign | (uint16_t)((ax - (112u << 23)) >> 13);
}

float sil_bf16_to_fp32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

uint16_t sil_fp32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000)
        return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

#define FP16(h) sil_fp16_to_fp32(h)

/* ---- float formats ---------------------------------------------------------------------------- */

static void f32_to_float(const void *x, float *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f32_from_float(const float *x, void *y, int64_t n)
{
    memcpy(y, x, (size_t)n * sizeof(float));
}

static void f16_to_float(const void *vx, float *y, int64_t n)
{
    const uint16_t *x = vx;
    for (int64_t i = 0; i < n; i++)
        y[i] = sil_fp16_to_fp32(x[i]);
}

static void f16_from_float(const float *x, void *vy, int64_t n)
{
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++)
        y[i] = sil_fp32_to_fp16(x[i]);
}

static void bf16_to_float(const void *vx, float *y, int64_t n)
{
    const uint16_t *x = vx;
    for (int64_t i = 0; i < n; i++)
        y[i] = sil_bf16_to_fp32(x[i]);
}

static void bf16_from_float(const float *x, void *vy, int64_t n)
{
    uint16_t *y = vy;
    for (int64_t i = 0; i < n; i++)
        y[i] = sil_fp32_to_bf16(x[i]);
}

/* Reference float dots accumulate in double: they are the yardstick for the SIMD ones. */
static float vec_dot_f32(int64_t n, const void *vw, const void *va)
{
    const float *w = vw, *a = va;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)w[i] * a[i];
    return (float)s;
}

static float vec_dot_f16(int64_t n, const void *vw, const void *va)
{
    const uint16_t *w = vw;
    const float *a = va;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)sil_fp16_to_fp32(w[i]) * a[i];
    return (float)s;
}

static float vec_dot_bf16(int64_t n, const void *vw, const void *va)
{
    const uint16_t *w = vw;
    const float *a = va;
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += (double)sil_bf16_to_fp32(w[i]) * a[i];
    return (float)s;
}

/* ---- legacy formats: dequantize --------------------------------------------------------------- */

static void q4_0_to_float(const void *vx, float *y, int64_t n)
{
    const struct sil_block_q4_0 *x = vx;
    for (int64_t i = 0; i < n / SIL_QK; i++, y += SIL_QK) {
        const float d = FP16(x[i].d);
        for (int j = 0; j < SIL_QK / 2; j++) {
            y[j] = ((x[i].qs[j] & 0xF) - 8) * d;
            y[j + 16] = ((x[i].qs[j] >> 4) - 8) * d;
        }
    }
}

static void q4_1_to_float(const void *vx, float *y, int64_t n)
{
    const struct sil_block_q4_1 *x = vx;
    for (int64_t i = 0; i < n / SIL_QK; i++, y += SIL_QK) {
        const float d = FP16(x[i].d), m = FP16(x[i].m);
        for (int j = 0; j < SIL_QK / 2; j++) {
            y[j] = (x[i].qs[j] & 0xF) * d + m;
            y[j + 16] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

static inline uint32_t load_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void q5_0_to_float(const void *vx, float *y, int64_t n)
{
    const struct sil_block_q5_0 *x = vx;
    for (int64_t i = 0; i < n / SIL_QK; i++, y += SIL_QK) {
        const float d = FP16(x[i].d);
        const uint32_t qh = load_u32(x[i].qh);
        for (int j = 0; j < SIL_QK / 2; j++) {
            int q0 = (x[i].qs[j] & 0xF) | ((qh >> j) & 1) << 4;
            int q1 = (x[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            y[j] = (q0 - 16) * d;
            y[j + 16] = (q1 - 16) * d;
        }
    }
}

static void q5_1_to_float(const void *vx, float *y, int64_t n)
{
    const struct sil_block_q5_1 *x = vx;
    for (int64_t i = 0; i < n / SIL_QK; i++, y += SIL_QK) {
        const float d = FP16(x[i].d), m = FP16(x[i].m);
        const uint32_t qh = load_u32(x[i].qh);
        for (int j = 0; j < SIL_QK / 2; j++) {
            int q0 = (x[i].qs[j] & 0xF) | ((qh >> j) & 1) << 4;
            int q1 = (x[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            y[j] = q0 * d + m;
            y[j + 16] = q1 * d + m;
        }
    }
}

static void q8_0_to_float(const void *vx, float *y, int64_t n)
{
    const struct sil_block_q8_0 *x = vx;
    for (int64_t i = 0; i < n / SIL_QK; i++, y += SIL_QK) {
        const float d = FP16(x[i].d);
        for (int j = 0; j < SIL_QK; j++)
            y[j] = x[i].qs[j] * d;
    }
}

static void q8_1_to_float(const void *vx, float *y, int64_t n)
{
    const struct sil_block_q8_1 *x = vx;
    for (int64_t i = 0; i < n / SIL_QK; i++, y += SIL_QK) {
        const float d = FP16(x[i].d);
        for (int j = 0; j < SIL_QK; j++)
            y[j] = x[i].qs[j] * d;
    }
}

/* ---- legacy formats: reference quantizers ----------------------------------------------------- */

/* The value of largest magnitude, with its sign (the symmetric formats map it to the end of
 * their range that has one more level). */
static float signed_absmax(const float *x, int n, float *amax_out)
{
    float amax = 0, max = 0;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    *amax_out = amax;
    return max;
}

static inline int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

static void q4_0_from_float(const float *x, void *vy, int64_t n)
{
    struct sil_block_q4_0 *y = vy;
    for (int64_t i = 0; i < n / SIL_QK; i++, x += SIL_QK) {
        float amax;
        const float d = signed_absmax(x, SIL_QK, &amax) / -8;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = sil_fp32_to_fp16(d);
        for (int j = 0; j < SIL_QK / 2; j++) {
            int q0 = clampi(nearest_int(x[j] * id) + 8, 0, 15);
            int q1 = clampi(nearest_int(x[j + 16] * id) + 8, 0, 15);
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void minmax(const float *x, int n, float *mn, float *mx)
{
    *mn = x[0];
    *mx = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < *mn)
            *mn = x[j];
        if (x[j] > *mx)
            *mx = x[j];
    }
}

static void q4_1_from_float(const float *x, void *vy, int64_t n)
{
    struct sil_block_q4_1 *y = vy;
    for (int64_t i = 0; i < n / SIL_QK; i++, x += SIL_QK) {
        float mn, mx;
        minmax(x, SIL_QK, &mn, &mx);
        const float d = (mx - mn) / 15;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = sil_fp32_to_fp16(d);
        y[i].m = sil_fp32_to_fp16(mn);
        for (int j = 0; j < SIL_QK / 2; j++) {
            int q0 = clampi(nearest_int((x[j] - mn) * id), 0, 15);
            int q1 = clampi(nearest_int((x[j + 16] - mn) * id), 0, 15);
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void pack_q5(const int *q, uint8_t *qs, uint8_t *qh_out)
{
    uint32_t qh = 0;
    for (int j = 0; j < SIL_QK / 2; j++) {
        qs[j] = (uint8_t)((q[j] & 0xF) | (q[j + 16] & 0xF) << 4);
        qh |= (uint32_t)((q[j] >> 4) & 1) << j;
        qh |= (uint32_t)((q[j + 16] >> 4) & 1) << (j + 16);
    }
    for (int k = 0; k < 4; k++)
        qh_out[k] = (uint8_t)(qh >> (8 * k));
}

static void q5_0_from_float(const float *x, void *vy, int64_t n)
{
    struct sil_block_q5_0 *y = vy;
    for (int64_t i = 0; i < n / SIL_QK; i++, x += SIL_QK) {
        float amax;
        const float d = signed_absmax(x, SIL_QK, &amax) / -16;
        const float id = d ? 1.0f / d : 0.0f;
        int q[SIL_QK];
        y[i].d = sil_fp32_to_fp16(d);
        for (int j = 0; j < SIL_QK; j++)
            q[j] = clampi(nearest_int(x[j] * id) + 16, 0, 31);
        pack_q5(q, y[i].qs, y[i].qh);
    }
}

static void q5_1_from_float(const float *x, void *vy, int64_t n)
{
    struct sil_block_q5_1 *y = vy;
    for (int64_t i = 0; i < n / SIL_QK; i++, x += SIL_QK) {
        float mn, mx;
        minmax(x, SIL_QK, &mn, &mx);
        const float d = (mx - mn) / 31;
        const float id = d ? 1.0f / d : 0.0f;
        int q[SIL_QK];
        y[i].d = sil_fp32_to_fp16(d);
        y[i].m = sil_fp32_to_fp16(mn);
        for (int j = 0; j < SIL_QK; j++)
            q[j] = clampi(nearest_int((x[j] - mn) * id), 0, 31);
        pack_q5(q, y[i].qs, y[i].qh);
    }
}

/* Activations: d = amax/127, q = round(x/d). The fast quantizers reproduce this bit for bit. */
static void q8_0_from_float(const float *x, void *vy, int64_t n)
{
    struct sil_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / SIL_QK; i++, x += SIL_QK) {
        float amax;
        signed_absmax(x, SIL_QK, &amax);
        const float d = amax < SIL_AMAX_EPS ? 0.0f : amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = sil_fp32_to_fp16(d);
        for (int j = 0; j < SIL_QK; j++)
            y[i].qs[j] = (int8_t)nearest_int(x[j] * id);
    }
}

static void q8_1_from_float(const float *x, void *vy, int64_t n)
{
    struct sil_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / SIL_QK; i++, x += SIL_QK) {
        float amax;
        signed_absmax(x, SIL_QK, &amax);
        const float d = amax < SIL_AMAX_EPS ? 0.0f : amax / 127;
        const float id = d ? 1.0f / d : 0.0f;
        int sum = 0;
        y[i].d = sil_fp32_to_fp16(d);
        for (int j = 0; j < SIL_QK; j++) {
            y[i].qs[j] = (int8_t)nearest_int(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = sil_fp32_to_fp16(d * sum);
    }
}

static void q8_K_from_float(const float *x, void *vy, int64_t n)
{
    struct sil_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / SIL_QK_K; i++, x += SIL_QK_K) {
        float amax;
        signed_absmax(x, SIL_QK_K, &amax);
        if (amax < SIL_AMAX_EPS) {
            memset(&y[i], 0, sizeof(y[i]));
            continue;
        }
        const float iscale = 127.f / amax;
        for (int j = 0; j < SIL_QK_K; j++)
            y[i].qs[j] = (int8_t)clampi(nearest_int(iscale * x[j]), -127, 127);
        for (int j = 0; j < SIL_QK_K / 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += y[i].qs[16 * j + l];
            y[i].bsums[j] = (int16_t)s;
        }
        y[i].d = 1 / iscale;
    }
}

static void q8_K_to_float(const void *vx, float *y, int64_t n)
{
    const struct sil_block_q8_K *x = vx;
    for (int64_t i = 0; i < n / SIL_QK_K; i++, y += SIL_QK_K)
        for (int j = 0; j < SIL_QK_K; j++)
            y[j] = x[i].d * x[i].qs[j];
}

/* ---- k-quants: dequantize --------------------------------------------------------------------- */

static void q4_K_to_float(const void *vx, float *y, int64_t n)
{
    const struct sil_block_q4_K *x = vx;
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        const float d = FP16(x[i].d), dmin = FP16(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int j = 0; j < 4; j++, q += 32) {
            uint8_t sc, m;
            sil_k4_scale_min(2 * j, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            sil_k4_scale_min(2 * j + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (q[l] >> 4) - m2;
        }
    }
}

static void q5_K_to_float(const void *vx, float *y, int64_t n)
{
    const struct sil_block_q5_K *x = vx;
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        const float d = FP16(x[i].d), dmin = FP16(x[i].dmin);
        const uint8_t *q = x[i].qs, *qh = x[i].qh;
        for (int j = 0; j < 4; j++, q += 32) {
            uint8_t sc, m;
            sil_k4_scale_min(2 * j, x[i].scales, &sc, &m);
            const float d1 = d * sc, m1 = dmin * m;
            sil_k4_scale_min(2 * j + 1, x[i].scales, &sc, &m);
            const float d2 = d * sc, m2 = dmin * m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * ((q[l] & 0xF) | ((qh[l] >> (2 * j)) & 1) << 4) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * ((q[l] >> 4) | ((qh[l] >> (2 * j + 1)) & 1) << 4) - m2;
        }
    }
}

/* Element e of a q6_K super-block (0..255): 6-bit value 0..63 and its sub-block (0..15). */
static inline int q6_K_get(const struct sil_block_q6_K *b, int e)
{
    const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
    const uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
    const int lo = (quarter & 1) ? ql[l + 32] : ql[l];
    const int nib = (quarter & 2) ? lo >> 4 : lo & 0xF;
    return nib | ((qh[l] >> (2 * quarter)) & 3) << 4;
}

static void q6_K_to_float(const void *vx, float *y, int64_t n)
{
    const struct sil_block_q6_K *x = vx;
    for (int64_t i = 0; i < n / SIL_QK_K; i++, y += SIL_QK_K) {
        const float d = FP16(x[i].d);
        for (int e = 0; e < SIL_QK_K; e++)
            y[e] = d * x[i].scales[e / 16] * (q6_K_get(&x[i], e) - 32);
    }
}

/* ---- k-quants: reference quantizers ----------------------------------------------------------- */

/* Affine fit x ~ scale*L - mn (L in 0..nmax, mn >= 0) of one sub-block. Tries a few step sizes
 * around (max-min)/nmax; for each rounding, a weighted least-squares fit of scale and offset;
 * keeps the one with the smallest weighted squared error. Weights favour large values. */
static float fit_affine(const float *x, int n, int nmax, float *mn_out)
{
    float lo, hi;
    minmax(x, n, &lo, &hi);
    if (lo > 0)
        lo = 0;
    if (hi == lo) {
        *mn_out = -lo;
        return 0;
    }
    float w[32], sum_x2 = 0;
    for (int i = 0; i < n; i++)
        sum_x2 += x[i] * x[i];
    const float rms = sqrtf(sum_x2 / n);
    float sw = 0, swx = 0;
    for (int i = 0; i < n; i++) {
        w[i] = rms + fabsf(x[i]);
        sw += w[i];
        swx += w[i] * x[i];
    }
    float best_scale = (hi - lo) / nmax, best_min = lo, best_err = INFINITY;
    for (int step = -10; step <= 10; step++) {
        const float iscale = (nmax + 0.1f * step) / (hi - lo);
        float sl = 0, sl2 = 0, sxl = 0;
        int L[32];
        for (int i = 0; i < n; i++) {
            L[i] = clampi(nearest_int(iscale * (x[i] - lo)), 0, nmax);
            sl += w[i] * L[i];
            sl2 += w[i] * L[i] * L[i];
            sxl += w[i] * L[i] * x[i];
        }
        const float det = sw * sl2 - sl * sl;
        if (det <= 0)
            continue;
        float scale = (sw * sxl - swx * sl) / det;
        float off = (sl2 * swx - sl * sxl) / det;
        if (off > 0) { /* the format stores a non-negative min: refit through zero */
            off = 0;
            scale = sxl / sl2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float e = scale * L[i] + off - x[i];
            err += w[i] * e * e;
        }
        if (err < best_err) {
            best_err = err;
            best_scale = scale;
            best_min = off;
        }
    }
    *mn_out = -best_min;
    return best_scale;
}

/* Quantizes 8 sub-block scales and mins to 6 bits against two fp16 super-block factors and
 * packs them; returns the dequantized per-sub-block scale and min actually stored. */
static void pack_k4_scales(const float *scales, const float *mins, sil_fp16 *d, sil_fp16 *dmin,
                           uint8_t *packed, float *eff_scale, float *eff_min)
{
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        if (scales[j] > max_scale)
            max_scale = scales[j];
        if (mins[j] > max_min)
            max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(packed, 0, SIL_K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        const int ls = clampi(nearest_int(inv_scale * scales[j]), 0, 63);
        const int lm = clampi(nearest_int(inv_min * mins[j]), 0, 63);
        if (j < 4) {
            packed[j] = (uint8_t)ls;
            packed[j + 4] = (uint8_t)lm;
        } else {
            packed[j + 4] = (uint8_t)((ls & 0xF) | (lm & 0xF) << 4);
            packed[j - 4] |= (uint8_t)((ls >> 4) << 6);
            packed[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    *d = sil_fp32_to_fp16(max_scale / 63.f);
    *dmin = sil_fp32_to_fp16(max_min / 63.f);
    for (int j = 0; j < 8; j++) {
        uint8_t sc, m;
        sil_k4_scale_min(j, packed, &sc, &m);
        eff_scale[j] = FP16(*d) * sc;
        eff_min[j] = FP16(*dmin) * m;
    }
}

/* Shared by q4_K (nmax 15) and q5_K (nmax 31): values against the stored scales, 0..nmax. */
static void k_affine_levels(const float *x, int nmax, sil_fp16 *d, sil_fp16 *dmin,
                            uint8_t *packed, uint8_t *L)
{
    float scales[8], mins[8], es[8], em[8];
    for (int j = 0; j < 8; j++)
        scales[j] = fit_affine(x + 32 * j, 32, nmax, &mins[j]);
    pack_k4_scales(scales, mins, d, dmin, packed, es, em);
    for (int j = 0; j < 8; j++) {
        for (int l = 0; l < 32; l++) {
            const float v = x[32 * j + l];
            L[32 * j + l] = es[j] ? (uint8_t)clampi(nearest_int((v + em[j]) / es[j]), 0, nmax) : 0;
        }
    }
}

static void q4_K_from_float(const float *x, void *vy, int64_t n)
{
    struct sil_block_q4_K *y = vy;
    for (int64_t i = 0; i < n / SIL_QK_K; i++, x += SIL_QK_K) {
        uint8_t L[SIL_QK_K];
        k_affine_levels(x, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        for (int j = 0; j < 4; j++)
            for (int l = 0; l < 32; l++)
                y[i].qs[32 * j + l] = (uint8_t)(L[64 * j + l] | L[64 * j + 32 + l] << 4);
    }
}

static void q5_K_from_float(const float *x, void *vy, int64_t n)
{
    struct sil_block_q5_K *y = vy;
    for (int64_t i = 0; i < n / SIL_QK_K; i++, x += SIL_QK_K) {
        uint8_t L[SIL_QK_K];
        k_affine_levels(x, 31, &y[i].d, &y[i].dmin, y[i].scales, L);
        memset(y[i].qh, 0, sizeof(y[i].qh));
        for (int j = 0; j < 4; j++) {
            for (int l = 0; l < 32; l++) {
                const int a = L[64 * j + l], b = L[64 * j + 32 + l];
                y[i].qs[32 * j + l] = (uint8_t)((a & 0xF) | (b & 0xF) << 4);
                y[i].qh[l] |= (uint8_t)(((a >> 4) << (2 * j)) | ((b >> 4) << (2 * j + 1)));
            }
        }
    }
}

/* Symmetric fit x ~ scale*l, l in -32..31, of 16 values: a few candidate steps around
 * max/-32, least-squares scale for each rounding, weighted by x^2; returns the best scale. */
static float fit_symmetric(const float *x, int n)
{
    float amax;
    const float max = signed_absmax(x, n, &amax);
    if (amax < 1e-15f)
        return 0;
    float best_scale = max / -32, best = -1;
    for (int step = -9; step <= 9; step++) {
        const float iscale = -(32 + 0.1f * step) / max;
        float sumlx = 0, suml2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest_int(iscale * x[i]), -32, 31);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * l;
            suml2 += w * l * l;
        }
        /* least-squares scale sumlx/suml2 removes sumlx^2/suml2 from the error */
        if (suml2 > 0 && sumlx * sumlx / suml2 > best) {
            best = sumlx * sumlx / suml2;
            best_scale = sumlx / suml2;
        }
    }
    return best_scale;
}

static void q6_K_from_float(const float *x, void *vy, int64_t n)
{
    struct sil_block_q6_K *y = vy;
    for (int64_t i = 0; i < n / SIL_QK_K; i++, x += SIL_QK_K) {
        float scales[16], max_scale = 0, amax = 0;
        for (int j = 0; j < 16; j++) {
            scales[j] = fit_symmetric(x + 16 * j, 16);
            if (fabsf(scales[j]) > amax) {
                amax = fabsf(scales[j]);
                max_scale = scales[j];
            }
        }
        memset(&y[i], 0, sizeof(y[i]));
        if (amax < 1e-15f)
            continue;
        const float iscale = -128.f / max_scale;
        y[i].d = sil_fp32_to_fp16(1 / iscale);
        for (int j = 0; j < 16; j++)
            y[i].scales[j] = (int8_t)clampi(nearest_int(iscale * scales[j]), -128, 127);
        for (int e = 0; e < SIL_QK_K; e++) {
            const float d = FP16(y[i].d) * y[i].scales[e / 16];
            const int q = d ? clampi(nearest_int(x[e] / d), -32, 31) + 32 : 32;
            const int half = e / 128, r = e % 128, quarter = r / 32, l = r % 32;
            uint8_t *ql = y[i].ql + 64 * half + ((quarter & 1) ? 32 : 0);
            ql[l] |= (uint8_t)((q & 0xF) << ((quarter & 2) ? 4 : 0));
            y[i].qh[32 * half + l] |= (uint8_t)((q >> 4) << (2 * quarter));
        }
    }
}

/* ---- scalar dot products ---------------------------------------------------------------------- */
/* Each block contributes (weight scale * activation scale) * integer sum, added in block order. */

static float vec_dot_q8_0(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q8_0 *w = vw, *a = va;
    float s = 0;
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        int sumi = 0;
        for (int j = 0; j < SIL_QK; j++)
            sumi += w[i].qs[j] * a[i].qs[j];
        s += FP16(w[i].d) * FP16(a[i].d) * (float)sumi;
    }
    return s;
}

static float vec_dot_q4_0(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q4_0 *w = vw;
    const struct sil_block_q8_0 *a = va;
    float s = 0;
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        int sumi = 0;
        for (int j = 0; j < SIL_QK / 2; j++)
            sumi += ((w[i].qs[j] & 0xF) - 8) * a[i].qs[j] + ((w[i].qs[j] >> 4) - 8) * a[i].qs[j + 16];
        s += FP16(w[i].d) * FP16(a[i].d) * (float)sumi;
    }
    return s;
}

/* Affine formats: sum (d*q + m) * da*qa = d*da*sum(q*qa) + m*da*sum(qa). */
static float vec_dot_q4_1(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q4_1 *w = vw;
    const struct sil_block_q8_0 *a = va;
    float s = 0;
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        int sumi = 0, suma = 0;
        for (int j = 0; j < SIL_QK / 2; j++) {
            sumi += (w[i].qs[j] & 0xF) * a[i].qs[j] + (w[i].qs[j] >> 4) * a[i].qs[j + 16];
            suma += a[i].qs[j] + a[i].qs[j + 16];
        }
        const float da = FP16(a[i].d);
        s += FP16(w[i].d) * da * (float)sumi + FP16(w[i].m) * da * (float)suma;
    }
    return s;
}

static float vec_dot_q5_0(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q5_0 *w = vw;
    const struct sil_block_q8_0 *a = va;
    float s = 0;
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        const uint32_t qh = load_u32(w[i].qh);
        int sumi = 0;
        for (int j = 0; j < SIL_QK / 2; j++) {
            const int q0 = ((w[i].qs[j] & 0xF) | ((qh >> j) & 1) << 4) - 16;
            const int q1 = ((w[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - 16;
            sumi += q0 * a[i].qs[j] + q1 * a[i].qs[j + 16];
        }
        s += FP16(w[i].d) * FP16(a[i].d) * (float)sumi;
    }
    return s;
}

static float vec_dot_q5_1(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q5_1 *w = vw;
    const struct sil_block_q8_0 *a = va;
    float s = 0;
    for (int64_t i = 0; i < n / SIL_QK; i++) {
        const uint32_t qh = load_u32(w[i].qh);
        int sumi = 0, suma = 0;
        for (int j = 0; j < SIL_QK / 2; j++) {
            const int q0 = (w[i].qs[j] & 0xF) | ((qh >> j) & 1) << 4;
            const int q1 = (w[i].qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4;
            sumi += q0 * a[i].qs[j] + q1 * a[i].qs[j + 16];
            suma += a[i].qs[j] + a[i].qs[j + 16];
        }
        const float da = FP16(a[i].d);
        s += FP16(w[i].d) * da * (float)sumi + FP16(w[i].m) * da * (float)suma;
    }
    return s;
}

/* q4_K/q5_K: sum_j sc_j*d*da*sum(q*qa) - sum_j m_j*dmin*da*sum(qa); the sums of qa per 16 are
 * the activation block's bsums. */
static float vec_dot_q4_K(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q4_K *w = vw;
    const struct sil_block_q8_K *a = va;
    float s = 0;
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        const uint8_t *q = w[i].qs;
        const int8_t *qa = a[i].qs;
        int sumi = 0, summ = 0;
        uint8_t sc[8], mn[8];
        sil_k4_unpack(w[i].scales, sc, mn);
        for (int j = 0; j < 4; j++, q += 32, qa += 64) {
            const int sc0 = sc[2 * j], m0 = mn[2 * j], sc1 = sc[2 * j + 1], m1 = mn[2 * j + 1];
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += (q[l] & 0xF) * qa[l];
                s1 += (q[l] >> 4) * qa[l + 32];
            }
            sumi += sc0 * s0 + sc1 * s1;
            summ += m0 * (a[i].bsums[4 * j] + a[i].bsums[4 * j + 1]) +
                    m1 * (a[i].bsums[4 * j + 2] + a[i].bsums[4 * j + 3]);
        }
        const float d = FP16(w[i].d) * a[i].d, dmin = FP16(w[i].dmin) * a[i].d;
        s += d * (float)sumi - dmin * (float)summ;
    }
    return s;
}

static float vec_dot_q5_K(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q5_K *w = vw;
    const struct sil_block_q8_K *a = va;
    float s = 0;
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        const uint8_t *q = w[i].qs, *qh = w[i].qh;
        const int8_t *qa = a[i].qs;
        int sumi = 0, summ = 0;
        uint8_t sc[8], mn[8];
        sil_k4_unpack(w[i].scales, sc, mn);
        for (int j = 0; j < 4; j++, q += 32, qa += 64) {
            const int sc0 = sc[2 * j], m0 = mn[2 * j], sc1 = sc[2 * j + 1], m1 = mn[2 * j + 1];
            int s0 = 0, s1 = 0;
            for (int l = 0; l < 32; l++) {
                s0 += ((q[l] & 0xF) | ((qh[l] >> (2 * j)) & 1) << 4) * qa[l];
                s1 += ((q[l] >> 4) | ((qh[l] >> (2 * j + 1)) & 1) << 4) * qa[l + 32];
            }
            sumi += sc0 * s0 + sc1 * s1;
            summ += m0 * (a[i].bsums[4 * j] + a[i].bsums[4 * j + 1]) +
                    m1 * (a[i].bsums[4 * j + 2] + a[i].bsums[4 * j + 3]);
        }
        const float d = FP16(w[i].d) * a[i].d, dmin = FP16(w[i].dmin) * a[i].d;
        s += d * (float)sumi - dmin * (float)summ;
    }
    return s;
}

/* q6_K: sum_k sc_k * sum((q-32)*qa) = sum_k sc_k * (sum(q*qa) - 32*bsum_k). Walks the layout
 * in its storage order: each byte of ql/qh feeds four elements 32 apart. */
static float vec_dot_q6_K(int64_t n, const void *vw, const void *va)
{
    const struct sil_block_q6_K *w = vw;
    const struct sil_block_q8_K *a = va;
    float s = 0;
    for (int64_t i = 0; i < n / SIL_QK_K; i++) {
        int sub[16];
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = w[i].ql + 64 * h, *qh = w[i].qh + 32 * h;
            const int8_t *qa = a[i].qs + 128 * h;
            for (int is = 0; is < 2; is++) {
                int s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                for (int l = 16 * is; l < 16 * is + 16; l++) {
                    s0 += ((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) * qa[l];
                    s1 += ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) * qa[l + 32];
                    s2 += ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) * qa[l + 64];
                    s3 += ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) * qa[l + 96];
                }
                sub[8 * h + is + 0] = s0;
                sub[8 * h + is + 2] = s1;
                sub[8 * h + is + 4] = s2;
                sub[8 * h + is + 6] = s3;
            }
        }
        int sumi = 0;
        for (int k = 0; k < 16; k++)
            sumi += w[i].scales[k] * (sub[k] - 32 * a[i].bsums[k]);
        s += FP16(w[i].d) * a[i].d * (float)sumi;
    }
    return s;
}

/* ---- the table -------------------------------------------------------------------------------- */

#define KNOWN(nm, bs, ts) .name = nm, .block_size = bs, .type_size = ts, .known = true
#define FULL(nm, bs, ts, vdt, tf, ff, vd)                                                         \
    {                                                                                             \
        KNOWN(nm, bs, ts), .supported = true, .vec_dot_type = vdt, .to_float = tf,                \
        .from_float_ref = ff, .from_float = ff, .vec_dot = vd                                     \
    }

/* vec_dot is rewritten by sil_quants_set_level; the initializers are the scalar kernels. */
static struct sil_type_traits traits[SIL_TYPE_COUNT] = {
    [SIL_TYPE_F32] = FULL("f32", 1, 4, SIL_TYPE_F32, f32_to_float, f32_from_float, vec_dot_f32),
    [SIL_TYPE_F16] = FULL("f16", 1, 2, SIL_TYPE_F32, f16_to_float, f16_from_float, vec_dot_f16),
    [SIL_TYPE_BF16] = FULL("bf16", 1, 2, SIL_TYPE_F32, bf16_to_float, bf16_from_float, vec_dot_bf16),
    [SIL_TYPE_Q4_0] = FULL("q4_0", 32, 18, SIL_TYPE_Q8_0, q4_0_to_float, q4_0_from_float, vec_dot_q4_0),
    [SIL_TYPE_Q4_1] = FULL("q4_1", 32, 20, SIL_TYPE_Q8_0, q4_1_to_float, q4_1_from_float, vec_dot_q4_1),
    [SIL_TYPE_Q5_0] = FULL("q5_0", 32, 22, SIL_TYPE_Q8_0, q5_0_to_float, q5_0_from_float, vec_dot_q5_0),
    [SIL_TYPE_Q5_1] = FULL("q5_1", 32, 24, SIL_TYPE_Q8_0, q5_1_to_float, q5_1_from_float, vec_dot_q5_1),
    [SIL_TYPE_Q8_0] = FULL("q8_0", 32, 34, SIL_TYPE_Q8_0, q8_0_to_float, q8_0_from_float, vec_dot_q8_0),
    /* activation-only formats: no dot product with themselves as weights */
    [SIL_TYPE_Q8_1] = {KNOWN("q8_1", 32, 36), .supported = true, .vec_dot_type = SIL_TYPE_Q8_1,
                       .to_float = q8_1_to_float, .from_float_ref = q8_1_from_float,
                       .from_float = q8_1_from_float},
    [SIL_TYPE_Q8_K] = {KNOWN("q8_K", 256, 292), .supported = true, .vec_dot_type = SIL_TYPE_Q8_K,
                       .to_float = q8_K_to_float, .from_float_ref = q8_K_from_float,
                       .from_float = q8_K_from_float},
    [SIL_TYPE_Q2_K] = {KNOWN("q2_K", 256, 84), .vec_dot_type = SIL_TYPE_Q8_K},
    [SIL_TYPE_Q3_K] = {KNOWN("q3_K", 256, 110), .vec_dot_type = SIL_TYPE_Q8_K},
    [SIL_TYPE_Q4_K] = FULL("q4_K", 256, 144, SIL_TYPE_Q8_K, q4_K_to_float, q4_K_from_float, vec_dot_q4_K),
    [SIL_TYPE_Q5_K] = FULL("q5_K", 256, 176, SIL_TYPE_Q8_K, q5_K_to_float, q5_K_from_float, vec_dot_q5_K),
    [SIL_TYPE_Q6_K] = FULL("q6_K", 256, 210, SIL_TYPE_Q8_K, q6_K_to_float, q6_K_from_float, vec_dot_q6_K),
};

static sil_vec_dot_tile_fn tile_q4_K, tile_q6_K; /* set with vec_dot by sil_quants_set_level */

void sil_quants_set_level(enum sil_cpu_level level)
{
    static const struct {
        int type;
        sil_vec_dot_fn fn[3]; /* scalar, avx2, avx512 (+vnni) */
    } dots[] = {
        {SIL_TYPE_F32, {vec_dot_f32, sil_vec_dot_f32_avx2, sil_vec_dot_f32_avx512}},
        {SIL_TYPE_F16, {vec_dot_f16, sil_vec_dot_f16_avx2, sil_vec_dot_f16_avx512}},
        {SIL_TYPE_BF16, {vec_dot_bf16, sil_vec_dot_bf16_avx2, sil_vec_dot_bf16_avx512}},
        {SIL_TYPE_Q8_0, {vec_dot_q8_0, sil_vec_dot_q8_0_avx2, sil_vec_dot_q8_0_avx512}},
        {SIL_TYPE_Q4_0, {vec_dot_q4_0, sil_vec_dot_q4_0_avx2, sil_vec_dot_q4_0_avx512}},
        {SIL_TYPE_Q4_1, {vec_dot_q4_1, sil_vec_dot_q4_1_avx2, sil_vec_dot_q4_1_avx512}},
        {SIL_TYPE_Q5_0, {vec_dot_q5_0, sil_vec_dot_q5_0_avx2, sil_vec_dot_q5_0_avx512}},
        {SIL_TYPE_Q5_1, {vec_dot_q5_1, sil_vec_dot_q5_1_avx2, sil_vec_dot_q5_1_avx512}},
        {SIL_TYPE_Q4_K, {vec_dot_q4_K, sil_vec_dot_q4_K_avx2, sil_vec_dot_q4_K_avx512}},
        {SIL_TYPE_Q5_K, {vec_dot_q5_K, sil_vec_dot_q5_K_avx2, sil_vec_dot_q5_K_avx512}},
        {SIL_TYPE_Q6_K, {vec_dot_q6_K, sil_vec_dot_q6_K_avx2, sil_vec_dot_q6_K_avx512}},
    };
    /* The 512-bit kernels use VNNI; a CPU with AVX-512 but no VNNI runs the AVX2 ones. */
    const int k = level >= SIL_CPU_AVX512_VNNI ? 2 : level >= SIL_CPU_AVX2 ? 1 : 0;
    for (size_t i = 0; i < sizeof(dots) / sizeof(dots[0]); i++)
        traits[dots[i].type].vec_dot = dots[i].fn[k];
    static const sil_from_float_fn q8_0[3] = {q8_0_from_float, sil_quantize_q8_0_avx2,
                                              sil_quantize_q8_0_avx512};
    static const sil_from_float_fn q8_K[3] = {q8_K_from_float, sil_quantize_q8_K_avx2,
                                              sil_quantize_q8_K_avx512};
    traits[SIL_TYPE_Q8_0].from_float = q8_0[k];
    traits[SIL_TYPE_Q8_K].from_float = q8_K[k];
    static const sil_vec_dot_tile_fn t4[3] = {NULL, sil_vec_dot_tile_q4_K_avx2,
                                              sil_vec_dot_tile_q4_K_avx512};
    static const sil_vec_dot_tile_fn t6[3] = {NULL, sil_vec_dot_tile_q6_K_avx2,
                                              sil_vec_dot_tile_q6_K_avx512};
    tile_q4_K = t4[k];
    tile_q6_K = t6[k];
}

sil_vec_dot_tile_fn sil_vec_dot_tile(int type)
{
    sil_cpu_init();
    return type == SIL_TYPE_Q4_K ? tile_q4_K : type == SIL_TYPE_Q6_K ? tile_q6_K : NULL;
}

const struct sil_type_traits *sil_type_traits(int type)
{
    sil_cpu_init();
    if (type < 0 || type >= SIL_TYPE_COUNT || !traits[type].name)
        return NULL;
    return &traits[type];
}

const char *sil_type_name(int type)
{
    static __thread char buf[24];
    if (type >= 0 && type < SIL_TYPE_COUNT && traits[type].name)
        return traits[type].name;
    snprintf(buf, sizeof(buf), "type %d", type);
    return buf;
}

size_t sil_row_size(int type, int64_t n)
{
    if (type < 0 || type >= SIL_TYPE_COUNT || !traits[type].known || n < 0)
        return 0;
    const struct sil_type_traits *t = &traits[type];
    if (n % t->block_size)
        return 0;
    return (size_t)(n / t->block_size) * t->type_size;
}

int sil_type_from_name(const char *name)
{
    if (!name)
        return -1;
    for (int i = 0; i < SIL_TYPE_COUNT; i++)
        if (traits[i].name && strcasecmp(traits[i].name, name) == 0)
            return i;
    return -1;
}

void sil_dequantize_row(int type, const void *x, float *y, int64_t n)
{
    const struct sil_type_traits *t = sil_type_traits(type);
    if (t && t->to_float)
        t->to_float(x, y, n);
}

void sil_quantize_row_ref(int type, const float *x, void *y, int64_t n)
{
    const struct sil_type_traits *t = sil_type_traits(type);
    if (t && t->from_float_ref)
        t->from_float_ref(x, y, n);
}

void sil_vec_dot_rows(int type, int64_t n, const void *w, size_t row_stride, int nrows,
                      const void *a, float *out)
{
    const sil_vec_dot_fn dot = sil_type_traits(type)->vec_dot;
    const char *row = w;
    for (int r = 0; r < nrows; r++, row += row_stride)
        out[r] = dot(n, row, a);
}
