/* What the CUDA kernel tests (test_cuda_ops, test_cuda_mmq) share: a seeded generator (define
 * CUDA_TEST_SEED before including), pass/fail lines, the driver-call check, the GPU's activation
 * rounding on the host and the error measure the tolerances are stated in. Header-only: each
 * test links only the kernel libraries. */
#ifndef SIL_TESTS_CUDA_TESTUTIL_H
#define SIL_TESTS_CUDA_TESTUTIL_H

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/error.h"

static int failures;
static uint64_t rng = CUDA_TEST_SEED;

static float frand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

static void check(bool ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(bool ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    if (!ok) failures++;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static struct sil_error err;

#define CK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ < 0) {                                                                             \
            printf("FAIL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, err.msg);                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* The GPU's activation rounding: blocks of 32, d = amax / 127, q = round(x / d). */
static void host_q8(const float *x, int64_t k, float *d, int8_t *q)
{
    for (int64_t b = 0; b < k / 32; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 32; i++)
            amax = fmaxf(amax, fabsf(x[b * 32 + i]));
        d[b] = amax / 127.0f;
        for (int i = 0; i < 32; i++)
            q[b * 32 + i] = amax == 0.0f ? 0 : (int8_t)roundf(x[b * 32 + i] / d[b]);
    }
}

/* ||a - ref|| / ||mag||, mag[r] = sum_c |w_rc x_c|: the dot's scale, which rounding errors follow
 * (a plain ||ref|| would blow up where a dot cancels to near zero). */
static double nerr(const float *a, const double *ref, const double *mag, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i])) return INFINITY;
        num += (a[i] - ref[i]) * (a[i] - ref[i]);
        den += mag[i] * mag[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

#endif
