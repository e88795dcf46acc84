/* Block layouts of the quantized formats (same layout as GGUF's) and the per-ISA kernels that
 * quants.c puts into the type_traits table. Internal to kernels/cpu: the engine uses quants.h. */
#ifndef SIL_QUANTS_IMPL_H
#define SIL_QUANTS_IMPL_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kernels/cpu/quants.h"

#define SIL_QK 32   /* elements per block of the legacy formats */
#define SIL_QK_K 256 /* elements per super-block of the k-quants */
#define SIL_K_SCALE_SIZE 12
/* Activation blocks whose largest magnitude is below this quantize to zero, so that 1/d stays
 * finite and the scalar and SIMD quantizers agree on every input. */
#define SIL_AMAX_EPS 1e-30f

typedef uint16_t sil_fp16;

struct sil_block_q4_0 {
    sil_fp16 d;
    uint8_t qs[SIL_QK / 2]; /* element j in the low nibble of qs[j], element j+16 in the high */
};
_Static_assert(sizeof(struct sil_block_q4_0) == 18, "q4_0 block");

struct sil_block_q4_1 {
    sil_fp16 d, m;
    uint8_t qs[SIL_QK / 2];
};
_Static_assert(sizeof(struct sil_block_q4_1) == 20, "q4_1 block");

struct sil_block_q5_0 {
    sil_fp16 d;
    uint8_t qh[4]; /* fifth bits, little-endian uint32, bit j for element j */
    uint8_t qs[SIL_QK / 2];
};
_Static_assert(sizeof(struct sil_block_q5_0) == 22, "q5_0 block");

struct sil_block_q5_1 {
    sil_fp16 d, m;
    uint8_t qh[4];
    uint8_t qs[SIL_QK / 2];
};
_Static_assert(sizeof(struct sil_block_q5_1) == 24, "q5_1 block");

struct sil_block_q8_0 {
    sil_fp16 d;
    int8_t qs[SIL_QK];
};
_Static_assert(sizeof(struct sil_block_q8_0) == 34, "q8_0 block");

struct sil_block_q8_1 {
    sil_fp16 d, s; /* s = d * sum(qs) */
    int8_t qs[SIL_QK];
};
_Static_assert(sizeof(struct sil_block_q8_1) == 36, "q8_1 block");

struct sil_block_q2_K {
    uint8_t scales[SIL_QK_K / 16];
    uint8_t qs[SIL_QK_K / 4];
    sil_fp16 d, dmin;
};
_Static_assert(sizeof(struct sil_block_q2_K) == 84, "q2_K block");

struct sil_block_q3_K {
    uint8_t hmask[SIL_QK_K / 8];
    uint8_t qs[SIL_QK_K / 4];
    uint8_t scales[12];
    sil_fp16 d;
};
_Static_assert(sizeof(struct sil_block_q3_K) == 110, "q3_K block");

/* 8 sub-blocks of 32; 6-bit scale and min per sub-block packed in scales[12]. */
struct sil_block_q4_K {
    sil_fp16 d, dmin;
    uint8_t scales[SIL_K_SCALE_SIZE];
    uint8_t qs[SIL_QK_K / 2];
};
_Static_assert(sizeof(struct sil_block_q4_K) == 144, "q4_K block");

struct sil_block_q5_K {
    sil_fp16 d, dmin;
    uint8_t scales[SIL_K_SCALE_SIZE];
    uint8_t qh[SIL_QK_K / 8];
    uint8_t qs[SIL_QK_K / 2];
};
_Static_assert(sizeof(struct sil_block_q5_K) == 176, "q5_K block");

/* 16 sub-blocks of 16, int8 scale each. */
struct sil_block_q6_K {
    uint8_t ql[SIL_QK_K / 2];
    uint8_t qh[SIL_QK_K / 4];
    int8_t scales[SIL_QK_K / 16];
    sil_fp16 d;
};
_Static_assert(sizeof(struct sil_block_q6_K) == 210, "q6_K block");

/* Activation format of the k-quants: float scale, bsums = sums of each 16 qs. */
struct sil_block_q8_K {
    float d;
    int8_t qs[SIL_QK_K];
    int16_t bsums[SIL_QK_K / 16];
};
_Static_assert(sizeof(struct sil_block_q8_K) == 292, "q8_K block");

/* Unpacks the 6-bit scale and min of sub-block j (0..7) of a q4_K / q5_K block. */
static inline void sil_k4_scale_min(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* All 8 scales (sc[0..7]) and mins (m[0..7]) of a q4_K / q5_K block at once, on 32-bit words:
 * the low 6 bits of bytes 0..3 / 4..7 are scales / mins 0..3; scales / mins 4..7 are the low /
 * high nibbles of bytes 8..11 with their top 2 bits in the top bits of bytes 0..3 / 4..7. */
static inline void sil_k4_unpack(const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    uint32_t w0, w1, w2, s[2], mm[2];
    memcpy(&w0, q, 4);
    memcpy(&w1, q + 4, 4);
    memcpy(&w2, q + 8, 4);
    s[0] = w0 & 0x3f3f3f3f;
    mm[0] = w1 & 0x3f3f3f3f;
    s[1] = (w2 & 0x0f0f0f0f) | (((w0 >> 6) & 0x03030303) << 4);
    mm[1] = ((w2 >> 4) & 0x0f0f0f0f) | (((w1 >> 6) & 0x03030303) << 4);
    memcpy(sc, s, 8);
    memcpy(m, mm, 8);
}

/* Weights stream from memory once per token and each byte is used once: asking for the bytes
 * SIL_PREFETCH_DIST ahead of the block being read lets the memory latency overlap the math.
 * Measured single-thread, 256 MiB of weights, on a 16-core Xeon VM (read bandwidth 10.5 GB/s),
 * AVX-512 q4_K / q6_K / q8_0 GB/s: no prefetch 4.7 / 5.4 / 5.3, 768 B 6.2 / 6.7 / 7.1,
 * 1536 B 7.2 / 8.5 / 9.8, 3072 B 8.2 / 9.2 / 9.3. */
#ifndef SIL_PREFETCH_DIST
#define SIL_PREFETCH_DIST 3072
#endif
static inline void sil_prefetch_block(const void *p, size_t size)
{
    const char *c = (const char *)p + SIL_PREFETCH_DIST;
    for (size_t o = 0; o < size; o += 64)
        __builtin_prefetch(c + o, 0, 3);
}

/* Tiled dot products for batches (prefill): out[c][r] = vec_dot(n, w + r * wrs, a[c]) for
 * r < nr <= SIL_TILE_R, c < nc <= SIL_TILE_C, bitwise equal to the type's vec_dot at the same
 * level. sil_vec_dot_tile gives NULL for a type the current level has no tiled kernel for. */
#define SIL_TILE_R 4
#define SIL_TILE_C 8
typedef void (*sil_vec_dot_tile_fn)(int64_t n, const void *w, size_t wrs, int nr,
                                    const void *const *a, int nc, float *const *out);
sil_vec_dot_tile_fn sil_vec_dot_tile(int type);
void sil_vec_dot_tile_q4_K_avx2(int64_t n, const void *w, size_t wrs, int nr,
                                const void *const *a, int nc, float *const *out);
void sil_vec_dot_tile_q6_K_avx2(int64_t n, const void *w, size_t wrs, int nr,
                                const void *const *a, int nc, float *const *out);
void sil_vec_dot_tile_q4_K_avx512(int64_t n, const void *w, size_t wrs, int nr,
                                  const void *const *a, int nc, float *const *out);
void sil_vec_dot_tile_q6_K_avx512(int64_t n, const void *w, size_t wrs, int nr,
                                  const void *const *a, int nc, float *const *out);

/* Called by cpu.c whenever the level in force changes: points the table at that level's kernels. */
void sil_quants_set_level(enum sil_cpu_level level);

/* Per-ISA kernels (NULL-free: every level provides each function it is listed for). */
#define SIL_DECL_ISA(sfx)                                                                       \
    float sil_vec_dot_f32_##sfx(int64_t n, const void *w, const void *a);                     \
    float sil_vec_dot_f16_##sfx(int64_t n, const void *w, const void *a);                     \
    float sil_vec_dot_bf16_##sfx(int64_t n, const void *w, const void *a);                    \
    float sil_vec_dot_q8_0_##sfx(int64_t n, const void *w, const void *a);                    \
    float sil_vec_dot_q4_0_##sfx(int64_t n, const void *w, const void *a);                    \
    float sil_vec_dot_q4_1_##sfx(int64_t n, const void *w, const void *a);                    \
    float sil_vec_dot_q5_0_##sfx(int64_t n, const void *w, const void *a);                    \
    float sil_vec_dot_q5_1_##sfx(int64_t n, const void *w, const void *a);                    \
    float sil_vec_dot_q4_K_##sfx(int64_t n, const void *w, const void *a);                    \
    float sil_vec_dot_q5_K_##sfx(int64_t n, const void *w, const void *a);                    \
    float sil_vec_dot_q6_K_##sfx(int64_t n, const void *w, const void *a);                    \
    void sil_quantize_q8_0_##sfx(const float *x, void *y, int64_t n);                         \
    void sil_quantize_q8_K_##sfx(const float *x, void *y, int64_t n);

SIL_DECL_ISA(avx2)
SIL_DECL_ISA(avx512)

#endif
