/* The streaming read bandwidth the CPU benchmarks set their floors by (common.h). */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>

#include "bench/common/common.h"

/* Streaming read: 256-bit loads into 4 independent accumulators, so the loop is bound by
 * loads, not adds. The target attribute keeps the rest of the file baseline x86-64. */
__attribute__((target("avx2"))) static uint64_t read_sum_avx2(const uint64_t *p, size_t n)
{
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
    const __m256i *v = (const __m256i *)p;
    for (size_t i = 0; i + 16 <= n; i += 16, v += 4) {
        s0 = _mm256_add_epi64(s0, _mm256_load_si256(v));
        s1 = _mm256_add_epi64(s1, _mm256_load_si256(v + 1));
        s2 = _mm256_add_epi64(s2, _mm256_load_si256(v + 2));
        s3 = _mm256_add_epi64(s3, _mm256_load_si256(v + 3));
    }
    const __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
    return (uint64_t)_mm256_extract_epi64(s, 0) ^ (uint64_t)_mm256_extract_epi64(s, 3);
}

static uint64_t read_sum(const uint64_t *p, size_t n)
{
    if (__builtin_cpu_supports("avx2"))
        return read_sum_avx2(p, n);
    uint64_t s = 0;
    for (size_t i = 0; i < n; i++)
        s += p[i];
    return s;
}

struct reader {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
    pthread_barrier_t *start;
};

static void *reader_main(void *arg)
{
    struct reader *r = arg;
    pthread_barrier_wait(r->start);
    r->sum = read_sum(r->p, r->n);
    return NULL;
}

static volatile uint64_t sink;

double sil_bench_read_bw(const void *buf, size_t bytes, int nthreads)
{
    if (nthreads < 1) nthreads = 1;
    if (nthreads > SIL_BENCH_BW_MAX_THREADS) nthreads = SIL_BENCH_BW_MAX_THREADS;
    pthread_t th[SIL_BENCH_BW_MAX_THREADS];
    struct reader r[SIL_BENCH_BW_MAX_THREADS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nthreads + 1);
    const size_t words = bytes / 8 / (size_t)nthreads / 16 * 16; /* 128-byte multiples */
    for (int t = 0; t < nthreads; t++) {
        r[t] = (struct reader){(const uint64_t *)buf + (size_t)t * words, words, 0, &start};
        pthread_create(&th[t], NULL, reader_main, &r[t]);
    }
    const double t0 = sil_bench_now();
    pthread_barrier_wait(&start);
    for (int t = 0; t < nthreads; t++) {
        pthread_join(th[t], NULL);
        sink += r[t].sum;
    }
    const double dt = sil_bench_now() - t0;
    pthread_barrier_destroy(&start);
    return (double)words * 8 * nthreads / dt / 1e9;
}

