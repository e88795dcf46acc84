/* Fast q4_K and q6_K row quantizers for synthetic weights. The reference quantizers search for
 * the best scales per sub-block, which makes a 35B-parameter file take most of an hour on two
 * cores; random weights do not need that. These take min/max scales with no search: the blocks
 * are valid GGUF blocks (same layout; read back by any q4_K/q6_K reader), their error is
 * somewhat above the reference's. --exact-quant selects the reference quantizers instead. */
#include <math.h>
#include <string.h>

#include "bench/sil-mkmodel/mkmodel.h"
#include "kernels/cpu/quants.h"

#define QK 256

static inline int nearest(float x) { return (int)lrintf(x); }
static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

static void put_fp16(uint8_t *p, float f)
{
    uint16_t h = sil_fp32_to_fp16(f);
    memcpy(p, &h, 2);
}

/* Block: d (fp16), dmin (fp16), 12 bytes of packed 6-bit scales/mins, 128 bytes of nibbles.
 * x = d * sc[j] * q - dmin * m[j] with q in 0..15, 8 sub-blocks of 32. */
static void q4_K_block(const float *x, uint8_t *y)
{
    float scale[8], min[8], max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; j++) {
        float lo = 0, hi = -INFINITY; /* the min is clamped at 0: mins are stored as positive offsets */
        for (int i = 0; i < 32; i++) {
            float v = x[32 * j + i];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        scale[j] = (hi - lo) / 15.0f;
        min[j] = -lo;
        max_scale = scale[j] > max_scale ? scale[j] : max_scale;
        max_min = min[j] > max_min ? min[j] : max_min;
    }
    float d = sil_fp16_to_fp32(sil_fp32_to_fp16(max_scale / 63.0f));
    float dmin = sil_fp16_to_fp32(sil_fp32_to_fp16(max_min / 63.0f));
    uint8_t ls[8], lm[8];
    for (int j = 0; j < 8; j++) {
        /* round the scale up so the sub-block's range still fits in 0..15 */
        ls[j] = (uint8_t)(d > 0 ? clampi((int)ceilf(scale[j] / d), 0, 63) : 0);
        lm[j] = (uint8_t)(dmin > 0 ? clampi(nearest(min[j] / dmin), 0, 63) : 0);
    }
    put_fp16(y, d);
    put_fp16(y + 2, dmin);
    uint8_t *sc = y + 4, *qs = y + 16;
    for (int j = 0; j < 4; j++) {
        sc[j] = ls[j];
        sc[j + 4] = lm[j];
    }
    for (int j = 4; j < 8; j++) {
        sc[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
        sc[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
        sc[j] |= (uint8_t)((lm[j] >> 4) << 6);
    }
    uint8_t q[QK];
    for (int j = 0; j < 8; j++) {
        float s = d * ls[j], m = dmin * lm[j], inv = s > 0 ? 1.0f / s : 0;
        for (int i = 0; i < 32; i++)
            q[32 * j + i] = (uint8_t)clampi(nearest((x[32 * j + i] + m) * inv), 0, 15);
    }
    /* 64 values per 32 bytes: low nibbles the first sub-block, high nibbles the second */
    for (int b = 0; b < 4; b++)
        for (int i = 0; i < 32; i++)
            qs[32 * b + i] = (uint8_t)(q[64 * b + i] | (q[64 * b + 32 + i] << 4));
}

/* Block: ql[128] low 4 bits, qh[64] high 2 bits, int8 scales[16], d (fp16).
 * x = d * scales[j] * (q - 32) with q in 0..63, 16 sub-blocks of 16. */
static void q6_K_block(const float *x, uint8_t *y)
{
    float scale[16], max_scale = 0;
    for (int j = 0; j < 16; j++) {
        float amax = 0;
        for (int i = 0; i < 16; i++)
            amax = fabsf(x[16 * j + i]) > amax ? fabsf(x[16 * j + i]) : amax;
        scale[j] = amax / 31.0f;
        max_scale = scale[j] > max_scale ? scale[j] : max_scale;
    }
    float d = sil_fp16_to_fp32(sil_fp32_to_fp16(max_scale / 127.0f));
    uint8_t *ql = y, *qh = y + 128;
    int8_t *sc = (int8_t *)(y + 192);
    uint8_t q[QK];
    for (int j = 0; j < 16; j++) {
        int s = d > 0 ? clampi((int)ceilf(scale[j] / d), 0, 127) : 0;
        sc[j] = (int8_t)s;
        float inv = s ? 1.0f / (d * (float)s) : 0;
        for (int i = 0; i < 16; i++)
            q[16 * j + i] = (uint8_t)(clampi(nearest(x[16 * j + i] * inv), -32, 31) + 32);
    }
    put_fp16(y + 208, d);
    for (int h = 0; h < 2; h++) {
        const uint8_t *L = q + 128 * h;
        for (int l = 0; l < 32; l++) {
            ql[64 * h + l] = (uint8_t)((L[l] & 0xF) | ((L[l + 64] & 0xF) << 4));
            ql[64 * h + l + 32] = (uint8_t)((L[l + 32] & 0xF) | ((L[l + 96] & 0xF) << 4));
            qh[32 * h + l] = (uint8_t)((L[l] >> 4) | ((L[l + 32] >> 4) << 2) | ((L[l + 64] >> 4) << 4) |
                                       ((L[l + 96] >> 4) << 6));
        }
    }
}

bool sil_mk_fast_quantize_row(int type, const float *x, void *y, int64_t n)
{
    uint8_t *o = y;
    if (n % QK)
        return false;
    if (type == SIL_TYPE_Q4_K) {
        for (int64_t b = 0; b < n / QK; b++)
            q4_K_block(x + QK * b, o + 144 * b);
        return true;
    }
    if (type == SIL_TYPE_Q6_K) {
        for (int64_t b = 0; b < n / QK; b++)
            q6_K_block(x + QK * b, o + 210 * b);
        return true;
    }
    return false;
}
