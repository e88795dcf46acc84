#include "bench/common/common.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>

int sil_bench_parse_i64(const char *prog, const char *flag, const char *s, int64_t min, int64_t max,
                        int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 0);
    if (errno || end == s || *end || v < min || v > max) {
        if (max == INT64_MAX)
            fprintf(stderr, "%s: %s: '%s' is not an integer >= %lld\n", prog, flag, s,
                    (long long)min);
        else
            fprintf(stderr, "%s: %s: '%s' is not an integer in [%lld, %lld]\n", prog, flag, s,
                    (long long)min, (long long)max);
        return -1;
    }
    *out = v;
    return 0;
}

int sil_bench_parse_double(const char *prog, const char *flag, const char *s, double min,
                           double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= min && v <= max)) {
        if (min == -HUGE_VAL && max == HUGE_VAL)
            fprintf(stderr, "%s: %s: '%s' is not a number\n", prog, flag, s);
        else
            fprintf(stderr, "%s: %s: '%s' is not a number in [%g, %g]\n", prog, flag, s, min, max);
        return -1;
    }
    *out = v;
    return 0;
}

void sil_bench_version(const char *prog) { printf("%s %s\n", prog, SIL_VERSION); }

double sil_bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

struct sil_bench_stat sil_bench_summarize(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return (struct sil_bench_stat){v[n / 2], v[0], v[n - 1]};
}

void sil_bench_print_json_str(const char *s)
{
    if (!s) {
        fputs("null", stdout);
        return;
    }
    putchar('"');
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\')
            printf("\\%c", *c);
        else if (*c < 0x20)
            printf("\\u%04x", *c);
        else
            putchar(*c);
    }
    putchar('"');
}
