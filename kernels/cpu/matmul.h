/* Quantized matrix multiplication on top of quants.h: y[j][r] = W[r] . x[j].
 *
 * Activations are converted once per input (sil_mm_input_prepare) to the format the weight
 * type's dot product wants (Q8_0 for legacy quants, Q8_K for k-quants, F32 for F32/F16/BF16),
 * then any number of weights sharing that input (Q, K, V; gate and up; every expert) reuse it.
 * A call to sil_matmul runs a list of jobs in one parallel region: work is cut into chunks of
 * weight rows and threads take chunks dynamically, so uneven MoE jobs still balance. A job of any
 * number of input rows whose weight type has a tiled kernel at the current SIMD level (q4_K, q6_K
 * with AVX-512 VNNI) reuses each unpacked weight block for several input rows; its results are
 * bitwise those of vec_dot, so a row's output does not depend on the batch it came in.
 *
 * Exact mode (reference): weights are dequantized row by row to F32 and multiplied with the
 * F32 activations; no activation rounding anywhere.
 *
 * Ownership: a struct sil_mm_input owns nothing; its buffers come from the caller (sized with
 * sil_mm_input_bytes at load) so nothing is allocated per token. */
#ifndef SIL_MATMUL_H
#define SIL_MATMUL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/threadpool.h"

#define SIL_MM_FORMATS 3 /* F32, Q8_0, Q8_K */

struct sil_mm_input {
    const float *x;  /* [n][k] F32 rows, row stride k */
    int64_t n, k;
    bool exact;
    void *buf[SIL_MM_FORMATS];      /* caller buffers for the quantized formats (Q8_0, Q8_K) */
    size_t buf_bytes[SIL_MM_FORMATS];
    bool ready[SIL_MM_FORMATS];
};

/* Bytes a buffer for the format of weight type wtype needs for n rows of k; 0 for F32 inputs. */
size_t sil_mm_input_bytes(int wtype, int64_t k, int64_t n);
/* Bytes for every format: the caller gives one buffer of this size to sil_mm_input_init. */
size_t sil_mm_input_bytes_all(int64_t k, int64_t n);
/* Points the input at x [n][k] and its buffers (buf of sil_mm_input_bytes_all(k_max, n_max)
 * bytes; k_max/n_max bound k/n). Marks every format stale. */
void sil_mm_input_init(struct sil_mm_input *in, const float *x, int64_t n, int64_t k, bool exact,
                       void *buf, int64_t k_max, int64_t n_max);
/* Converts the rows for weight type wtype (once; later calls for the same format are free). */
void sil_mm_input_prepare(struct sil_threadpool *tp, struct sil_mm_input *in, int wtype);

struct sil_mm_job {
    const void *w;      /* m rows of k elements of wtype, contiguous */
    int wtype;
    int64_t m;
    struct sil_mm_input *in; /* prepared for wtype */
    const int32_t *rows; /* input rows to use (NULL: 0..n_rows-1) */
    int64_t n_rows;
    float *y;           /* y[o * ldy + r] for r < m, o = out_rows ? out_rows[j] : j */
    const int32_t *out_rows;
    int64_t ldy;
    /* Optional, a SwiGLU pair: the up matrix (wtype, m rows, the same input) into y_up (laid
     * out as y), then y = silu(y) * y_up (sil_swiglu) on each chunk's rows as it finishes */
    const void *w_up;
    float *y_up;
};

/* Per-thread scratch (exact mode dequantizes weight rows into it): floats per thread. */
int64_t sil_matmul_scratch_floats(int64_t k_max);

/* Runs every job; scratch: n_threads * sil_matmul_scratch_floats(k_max) floats. */
void sil_matmul(struct sil_threadpool *tp, const struct sil_mm_job *jobs, int n_jobs,
                float *scratch, int64_t k_max);

#endif
