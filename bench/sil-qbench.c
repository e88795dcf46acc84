/* sil-qbench: single-thread dequant+dot throughput (vec_dot over a weight buffer larger than
 * the caches, in GB/s of weights) per type and SIMD level, next to the machine's read bandwidth
 * with 1 and 2 threads. Prints one JSON object per line; bench/run-quant.sh assembles the file.
 * See sil-qbench(1). */
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/common/common.h"
#include "kernels/cpu/quants.h"

#define PROG "sil-qbench"

/* Results the timed loops feed, so the compiler cannot drop them. */
static volatile uint64_t sink;

static uint64_t rng = 88172645463325252ull;

static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)(rng >> 40) / 16777216.0f - 0.5f;
}

static void emit(const char *metric, const char *config, struct sil_bench_stat s, int runs,
                 double floor, const char *floor_basis)
{
    printf("{\"metric\": \"%s\", \"config\": \"%s\", \"value\": %.3f, \"unit\": \"GB/s\", "
           "\"runs\": %d, \"min\": %.3f, \"max\": %.3f",
           metric, config, s.median, runs, s.min, s.max);
    if (floor > 0)
        printf(", \"floor\": %.3f, \"floor_basis\": \"%s\"", floor, floor_basis);
    printf("}\n");
    fflush(stdout);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--mib N] [--runs N] [--n ROWLEN] [--types TYPE,...]\n"
            "\n"
            "Single-thread vec_dot throughput per weight type and SIMD level, in GB/s of weights,\n"
            "next to the read bandwidth with 1 and 2 threads. One JSON object per line on stdout.\n"
            "\n"
            "  --mib N        weight buffer in MiB, larger than the caches (1-65536, default 256)\n"
            "  --runs N       repetitions of each measurement, median reported (1-100, default 5)\n"
            "  --n ROWLEN     row length, a multiple of 256 (256-65536, default 2048)\n"
            "  --types LIST   comma-separated types (default q4_K,q6_K,q8_0,q5_K,q5_0,q4_0,f16)\n"
            "  --help         this help\n"
            "  --version      the version\n");
}

int main(int argc, char **argv)
{
    int64_t mib = 256, runs = 5, n = 2048;
    const char *types = "q4_K,q6_K,q8_0,q5_K,q5_0,q4_0,f16";
    static const struct option lo[] = {
        {"mib", required_argument, 0, 'm'},   {"runs", required_argument, 0, 'r'},
        {"n", required_argument, 0, 'n'},     {"types", required_argument, 0, 't'},
        {"help", no_argument, 0, 'h'},        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        int r = 0;
        switch (c) {
        case 'm': r = sil_bench_parse_i64(PROG, "--mib", optarg, 1, 65536, &mib); break;
        case 'r': r = sil_bench_parse_i64(PROG, "--runs", optarg, 1, 100, &runs); break;
        case 'n':
            r = sil_bench_parse_i64(PROG, "--n", optarg, 256, 65536, &n);
            if (r == 0 && n % 256) {
                fprintf(stderr, PROG ": --n: %lld is not a multiple of 256\n", (long long)n);
                r = -1;
            }
            break;
        case 't': types = optarg; break;
        case 'h': usage(stdout); return 0;
        case 'V': sil_bench_version(PROG); return 0;
        default: usage(stderr); return SIL_BENCH_EXIT_USAGE;
        }
        if (r)
            return SIL_BENCH_EXIT_USAGE;
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s'\n", argv[optind]);
        return SIL_BENCH_EXIT_USAGE;
    }
    const size_t bytes = (size_t)mib << 20;
    uint8_t *buf = aligned_alloc(64, bytes);
    if (!buf) {
        fprintf(stderr, PROG ": cannot allocate %lld MiB\n", (long long)mib);
        return SIL_BENCH_EXIT_ERROR;
    }
    memset(buf, 1, bytes); /* fault every page in before timing */

    double v[100], bw1 = 0;
    for (int t = 1; t <= 2; t++) {
        for (int r = 0; r < runs; r++)
            v[r] = sil_bench_read_bw(buf, bytes, t);
        const struct sil_bench_stat s = sil_bench_summarize(v, runs);
        char cfg[64];
        snprintf(cfg, sizeof(cfg), "threads=%d,buffer_mib=%lld", t, (long long)mib);
        emit("read_bw_gb_s", cfg, s, runs, 0, NULL);
        if (t == 1)
            bw1 = s.median; /* the floor of every single-thread dot below */
    }

    /* activations: quantized once, cache-resident like in a matmul */
    float *x = malloc((size_t)n * sizeof(float));
    if (!x) {
        fprintf(stderr, PROG ": out of memory\n");
        return SIL_BENCH_EXIT_ERROR;
    }
    for (int64_t i = 0; i < n; i++)
        x[i] = frand();
    const enum sil_cpu_level top = sil_cpu_detected_level();

    char list[256];
    snprintf(list, sizeof(list), "%s", types);
    for (char *save = NULL, *name = strtok_r(list, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        const int type = sil_type_from_name(name);
        const struct sil_type_traits *tt = sil_type_traits(type);
        if (!tt || !tt->supported || !tt->vec_dot) {
            fprintf(stderr, PROG ": skipping %s (no dot product)\n", name);
            continue;
        }
        const size_t rs = sil_row_size(type, n);
        const size_t rows = bytes / rs;
        if (rows < 1) {
            fprintf(stderr, PROG ": skipping %s (a row of %zu bytes does not fit --mib)\n", name,
                    rs);
            continue;
        }
        /* quantize a few distinct rows, then tile them over the buffer: the content does not
         * change the speed, and quantizing 256 MiB with the reference quantizer would be slow */
        const size_t distinct = rows < 16 ? rows : 16;
        float *src = malloc((size_t)n * sizeof(float));
        const struct sil_type_traits *ta = sil_type_traits(tt->vec_dot_type);
        void *a = aligned_alloc(64, (sil_row_size(tt->vec_dot_type, n) + 63) / 64 * 64);
        float *out = malloc(rows * sizeof(float));
        if (!src || !a || !out) {
            fprintf(stderr, PROG ": out of memory\n");
            return SIL_BENCH_EXIT_ERROR;
        }
        for (size_t r = 0; r < distinct; r++) {
            for (int64_t i = 0; i < n; i++)
                src[i] = frand() * 0.1f;
            tt->from_float_ref(src, buf + r * rs, n);
        }
        for (size_t r = distinct; r < rows; r++)
            memcpy(buf + r * rs, buf + (r % distinct) * rs, rs);
        free(src);
        ta->from_float_ref(x, a, n);
        for (int lev = SIL_CPU_SCALAR; lev <= (int)top; lev++) {
            if (lev == SIL_CPU_AVX512 && top == SIL_CPU_AVX512_VNNI)
                continue; /* same kernels as AVX2 on this machine */
            sil_cpu_force_level((enum sil_cpu_level)lev);
            const sil_vec_dot_fn dot = tt->vec_dot;
            for (int r = 0; r < runs; r++) {
                const double t0 = sil_bench_now();
                for (size_t i = 0; i < rows; i++)
                    out[i] = dot(n, buf + i * rs, a);
                v[r] = (double)(rows * rs) / (sil_bench_now() - t0) / 1e9;
                sink += (uint64_t)out[rows / 2];
            }
            char cfg[96];
            snprintf(cfg, sizeof(cfg), "type=%s,level=%s,n=%lld,threads=1,buffer_mib=%lld", tt->name,
                     sil_cpu_level_name((enum sil_cpu_level)lev), (long long)n, (long long)mib);
            emit("vec_dot_gb_s", cfg, sil_bench_summarize(v, runs), runs, bw1,
                 "single-thread read bandwidth measured in this run");
            /* the same kernel on an L2-resident slice: its compute-bound rate */
            const size_t hot_rows = ((size_t)1 << 20) / rs;
            for (int r = 0; r < runs; r++) {
                const int reps = 64;
                const double t0 = sil_bench_now();
                for (int k = 0; k < reps; k++)
                    for (size_t i = 0; i < hot_rows; i++)
                        out[i] = dot(n, buf + i * rs, a);
                v[r] = (double)(hot_rows * rs) * reps / (sil_bench_now() - t0) / 1e9;
            }
            snprintf(cfg, sizeof(cfg), "type=%s,level=%s,n=%lld,threads=1,buffer_mib=1", tt->name,
                     sil_cpu_level_name((enum sil_cpu_level)lev), (long long)n);
            emit("vec_dot_hot_gb_s", cfg, sil_bench_summarize(v, runs), runs, 0, NULL);
        }
        sil_cpu_force_level(SIL_CPU_AVX512_VNNI);
        free(out);
        free(a);
    }
    free(x);
    free(buf);
    return 0;
}
