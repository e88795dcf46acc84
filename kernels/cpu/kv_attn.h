/* The two inner loops of attention over a KV cache block, per element type (f32, f16, q8_0,
 * q4_0 in GGUF layouts): the scores of one query head against n cached K heads, and the
 * softmax-weighted sum of n cached V heads. A cached head is hd elements at base + t * stride.
 * Chosen once per block from the current SIMD level, so the per-token work is inline code. */
#ifndef SIL_KV_ATTN_H
#define SIL_KV_ATTN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* scores[t] = scale * (q . K_t) for t < n. qq: q quantized to q8_0 (hd / 32 blocks) when the
 * kernels say q8_query (the quantized K types), else unused. */
typedef void (*sil_kv_scores_fn)(const float *q, const void *qq, const void *k, size_t stride,
                                 int n, int hd, float scale, float *scores);
/* o[j] += sum_t p[t] * V_t[j] for j < hd, t < n. */
typedef void (*sil_kv_accum_fn)(float *o, const float *p, const void *v, size_t stride, int n,
                                int hd);

struct sil_kv_kernels {
    sil_kv_scores_fn scores;
    sil_kv_accum_fn accum;
    bool q8_query;
};

/* NULL for a type other than f32, f16, q8_0, q4_0 (ggml numbers). */
const struct sil_kv_kernels *sil_kv_kernels(int type);

void sil_kv_scores_f32_avx2(const float *q, const void *qq, const void *k, size_t stride, int n,
                            int hd, float scale, float *scores);
void sil_kv_scores_f16_avx2(const float *q, const void *qq, const void *k, size_t stride, int n,
                            int hd, float scale, float *scores);
void sil_kv_scores_q8_0_avx2(const float *q, const void *qq, const void *k, size_t stride, int n,
                             int hd, float scale, float *scores);
void sil_kv_scores_q4_0_avx2(const float *q, const void *qq, const void *k, size_t stride, int n,
                             int hd, float scale, float *scores);
void sil_kv_accum_f32_avx2(float *o, const float *p, const void *v, size_t stride, int n, int hd);
void sil_kv_accum_f16_avx2(float *o, const float *p, const void *v, size_t stride, int n, int hd);
void sil_kv_accum_q8_0_avx2(float *o, const float *p, const void *v, size_t stride, int n, int hd);
void sil_kv_accum_q4_0_avx2(float *o, const float *p, const void *v, size_t stride, int n, int hd);

#endif
