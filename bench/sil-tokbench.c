/* sil-tokbench: tokenizer throughput on one thread, in process (vocab loaded once, the text
 * encoded --runs times). Prints one JSON object; bench/run-tokenizer.sh turns it into a
 * results file next to the peer's figure.
 *
 *   sil-tokbench --model FILE --text FILE [--runs N] [--parse-special] [--ids-out FILE] */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer.h"

static double now(void)
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

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *p = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n >= 0 && fseek(f, 0, SEEK_SET) == 0 && (p = malloc((size_t)n + 1))) {
            if (fread(p, 1, (size_t)n, f) != (size_t)n) {
                free(p);
                p = NULL;
            } else {
                *len = (size_t)n;
            }
        }
    }
    fclose(f);
    return p;
}

int main(int argc, char **argv)
{
    const char *model = NULL, *text_path = NULL, *ids_out = NULL;
    int runs = 5;
    bool parse_special = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool more = i + 1 < argc;
        if (!strcmp(a, "--model") && more)
            model = argv[++i];
        else if (!strcmp(a, "--text") && more)
            text_path = argv[++i];
        else if (!strcmp(a, "--ids-out") && more)
            ids_out = argv[++i];
        else if (!strcmp(a, "--runs") && more)
            runs = atoi(argv[++i]);
        else if (!strcmp(a, "--parse-special"))
            parse_special = true;
        else if (!strcmp(a, "--help")) {
            printf("usage: sil-tokbench --model FILE --text FILE [--runs N] [--parse-special] "
                   "[--ids-out FILE]\n");
            return 0;
        } else {
            fprintf(stderr, "sil-tokbench: unknown option or missing value: '%s'\n", a);
            return 2;
        }
    }
    if (!model || !text_path || runs < 1 || runs > 1000) {
        fprintf(stderr, "sil-tokbench: need --model FILE --text FILE (and 1 <= runs <= 1000)\n");
        return 2;
    }
    size_t len = 0;
    char *text = slurp(text_path, &len);
    if (!text) {
        fprintf(stderr, "sil-tokbench: %s: %s\n", text_path, strerror(errno));
        return 1;
    }
    struct sil_error err = {0};
    struct sil_gguf *g = NULL;
    struct sil_vocab *v = NULL;
    double t0 = now();
    if (sil_gguf_open(&g, model, &err) < 0 || sil_vocab_load(&v, g, &err) < 0) {
        fprintf(stderr, "sil-tokbench: %s\n", err.msg);
        return 1;
    }
    double load_s = now() - t0;
    double *t = calloc((size_t)runs, sizeof *t);
    if (!t)
        return 1;
    int32_t *ids = NULL;
    size_t n = 0;
    for (int r = 0; r < runs; r++) {
        free(ids);
        double s = now();
        if (sil_tokenize(v, text, len, false, parse_special, &ids, &n, &err) < 0) {
            fprintf(stderr, "sil-tokbench: %s\n", err.msg);
            free(t);
            return 1;
        }
        t[r] = now() - s;
    }
    if (ids_out) {
        FILE *f = fopen(ids_out, "w");
        if (!f) {
            fprintf(stderr, "sil-tokbench: %s: %s\n", ids_out, strerror(errno));
            return 1;
        }
        for (size_t i = 0; i < n; i++)
            fprintf(f, "%d\n", ids[i]);
        fclose(f);
    }
    qsort(t, (size_t)runs, sizeof *t, cmp_double);
    double mb = (double)len / 1e6;
    printf("{\"bytes\": %zu, \"tokens\": %zu, \"load_s\": %.4f, \"runs\": %d, "
           "\"median_s\": %.5f, \"min_s\": %.5f, \"max_s\": %.5f, \"median_mb_s\": %.2f, "
           "\"min_mb_s\": %.2f, \"max_mb_s\": %.2f}\n",
           len, n, load_s, runs, t[runs / 2], t[0], t[runs - 1], mb / t[runs / 2],
           mb / t[runs - 1], mb / t[0]);
    free(t);
    free(ids);
    free(text);
    sil_vocab_free(v);
    sil_gguf_close(g);
    return 0;
}
