/* Code shared by the bench tools (sil-mkmodel, sil-qbench, sil-tokbench): strict command-line
 * numbers, the version line, a JSON string, a monotonic clock, run statistics and a read-bandwidth
 * probe. Links nothing but libc. */
#ifndef SIL_BENCH_COMMON_H
#define SIL_BENCH_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit statuses of the bench tools: 1 a failure while working, 2 a bad command line. */
#define SIL_BENCH_EXIT_ERROR 1
#define SIL_BENCH_EXIT_USAGE 2

/* The whole string as a number in [min, max]; otherwise prints
 * "prog: flag: 'text' is not an integer in [min, max]" on stderr and returns -1 (max INT64_MAX,
 * or both bounds infinite for a double, leave the bound out of the message). */
int sil_bench_parse_i64(const char *prog, const char *flag, const char *s, int64_t min, int64_t max,
                        int64_t *out);
int sil_bench_parse_double(const char *prog, const char *flag, const char *s, double min,
                           double max, double *out);

/* "prog VERSION" on stdout. */
void sil_bench_version(const char *prog);

/* s as a JSON string on stdout, null for NULL. */
void sil_bench_print_json_str(const char *s);

/* Monotonic seconds. */
double sil_bench_now(void);

/* Sorts v[0..n) (n >= 1) and gives its median (the upper one for even n), minimum and maximum. */
struct sil_bench_stat {
    double median, min, max;
};
struct sil_bench_stat sil_bench_summarize(double *v, int n);

/* Streaming read bandwidth in GB/s: nthreads threads (1..SIL_BENCH_BW_MAX_THREADS) each read
 * their own part of buf (32-byte aligned) once, AVX2 loads where the CPU has them. */
#define SIL_BENCH_BW_MAX_THREADS 64
double sil_bench_read_bw(const void *buf, size_t bytes, int nthreads);

#endif
