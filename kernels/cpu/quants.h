/* Quantized formats: one type_traits table describes every type (block size, bytes, dequantize,
 * reference quantizer, dot product). Block layouts are exactly GGUF's (ggml type numbers).
 *
 * Dot products: a weight row of type T is multiplied with activations quantized once to
 * sil_type_traits(T)->vec_dot_type (Q8_0 for the legacy formats, Q8_K for the k-quants,
 * F32 for F32, F16 and BF16). The SIMD level is chosen at run time from CPUID
 * (sil_cpu_init); sil_cpu_force_level lets tests compare every level with the scalar one. */
#ifndef SIL_QUANTS_H
#define SIL_QUANTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum sil_type {
    SIL_TYPE_F32 = 0,
    SIL_TYPE_F16 = 1,
    SIL_TYPE_Q4_0 = 2,
    SIL_TYPE_Q4_1 = 3,
    SIL_TYPE_Q5_0 = 6,
    SIL_TYPE_Q5_1 = 7,
    SIL_TYPE_Q8_0 = 8,
    SIL_TYPE_Q8_1 = 9,
    SIL_TYPE_Q2_K = 10,
    SIL_TYPE_Q3_K = 11,
    SIL_TYPE_Q4_K = 12,
    SIL_TYPE_Q5_K = 13,
    SIL_TYPE_Q6_K = 14,
    SIL_TYPE_Q8_K = 15,
    SIL_TYPE_BF16 = 30,
    SIL_TYPE_COUNT = 40 /* numbers >= this are unknown */
};

typedef void (*sil_to_float_fn)(const void *x, float *y, int64_t n);
typedef void (*sil_from_float_fn)(const float *x, void *y, int64_t n);
/* sum_i w[i] * a[i] over n elements; w is a row of the weight type, a is in vec_dot_type. */
typedef float (*sil_vec_dot_fn)(int64_t n, const void *w, const void *a);

struct sil_type_traits {
    const char *name;     /* "q4_K", as ggml names it */
    int64_t block_size;   /* elements per block */
    size_t type_size;     /* bytes per block */
    bool known;           /* a GGUF type number we know the layout of (size is valid) */
    bool supported;       /* we can dequantize it and compute with it */
    int vec_dot_type;     /* activation format for vec_dot */
    sil_to_float_fn to_float;       /* dequantize n elements (n a multiple of block_size) */
    sil_from_float_fn from_float_ref; /* reference quantizer, scalar, deterministic */
    sil_from_float_fn from_float;     /* fast quantizer (activations); same output as the reference */
    sil_vec_dot_fn vec_dot;           /* current SIMD level */
};

/* NULL for numbers we have no entry for (never for a known type). */
const struct sil_type_traits *sil_type_traits(int type);
const char *sil_type_name(int type); /* "type 99" style text for unknown numbers (static buffer-free) */
/* Bytes of a row of n elements; 0 if the type is unknown or n is not a multiple of its block. */
size_t sil_row_size(int type, int64_t n);
/* Parses "q4_K", "Q4_K", "f16"...; -1 if unknown. */
int sil_type_from_name(const char *name);

void sil_dequantize_row(int type, const void *x, float *y, int64_t n);
void sil_quantize_row_ref(int type, const float *x, void *y, int64_t n);

/* out[r] = vec_dot(n, w + r*row_stride, a) for r < nrows, at the current SIMD level; type must
 * be supported and a in its vec_dot_type. The building block of the engine's matmul. */
void sil_vec_dot_rows(int type, int64_t n, const void *w, size_t row_stride, int nrows,
                      const void *a, float *out);

/* CPU feature dispatch. */
enum sil_cpu_level { SIL_CPU_SCALAR = 0, SIL_CPU_AVX2 = 1, SIL_CPU_AVX512 = 2, SIL_CPU_AVX512_VNNI = 3 };
void sil_cpu_init(void); /* idempotent, thread-safe; called by sil_type_traits too */
enum sil_cpu_level sil_cpu_detected_level(void);
enum sil_cpu_level sil_cpu_level(void);
/* Use at most this level (tests, benchmarks); returns the level actually in force. */
enum sil_cpu_level sil_cpu_force_level(enum sil_cpu_level level);
const char *sil_cpu_level_name(enum sil_cpu_level level);

/* fp16 / bf16 conversions (scalar, exact round-to-nearest-even). */
float sil_fp16_to_fp32(uint16_t h);
uint16_t sil_fp32_to_fp16(float f);
float sil_bf16_to_fp32(uint16_t h);
uint16_t sil_fp32_to_bf16(float f);

#endif
