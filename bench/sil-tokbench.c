/* sil-tokbench: tokenizer throughput on one thread, in process (vocab loaded once, the text
 * encoded --runs times). Prints one JSON object; bench/run-tokenizer.sh turns it into a
 * results file next to the peer's figure. See sil-tokbench(1). */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/common/common.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer.h"

#define PROG "sil-tokbench"

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

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " --model FILE --text FILE [--runs N] [--parse-special] [--ids-out FILE]\n"
            "\n"
            "Tokenizer throughput on one thread: loads the vocab of a GGUF model once, encodes the\n"
            "text --runs times, prints one JSON object on stdout.\n"
            "\n"
            "  --model FILE     GGUF file whose vocab is used\n"
            "  --text FILE      the text to encode\n"
            "  --runs N         encodings; median, min and max are reported (1-1000, default 5)\n"
            "  --parse-special  match special-token text as special tokens\n"
            "  --ids-out FILE   write the ids of the last run, one per line\n"
            "  --help           this help\n"
            "  --version        the version\n");
}

int main(int argc, char **argv)
{
    const char *model = NULL, *text_path = NULL, *ids_out = NULL;
    int64_t runs = 5;
    bool parse_special = false;
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'},   {"text", required_argument, 0, 't'},
        {"runs", required_argument, 0, 'r'},    {"parse-special", no_argument, 0, 'p'},
        {"ids-out", required_argument, 0, 'o'}, {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},       {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm': model = optarg; break;
        case 't': text_path = optarg; break;
        case 'o': ids_out = optarg; break;
        case 'p': parse_special = true; break;
        case 'r':
            if (sil_bench_parse_i64(PROG, "--runs", optarg, 1, 1000, &runs))
                return SIL_BENCH_EXIT_USAGE;
            break;
        case 'h': usage(stdout); return 0;
        case 'V': sil_bench_version(PROG); return 0;
        default: usage(stderr); return SIL_BENCH_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s'\n", argv[optind]);
        return SIL_BENCH_EXIT_USAGE;
    }
    if (!model || !text_path) {
        fprintf(stderr, PROG ": --model FILE and --text FILE are required\n");
        return SIL_BENCH_EXIT_USAGE;
    }
    size_t len = 0;
    char *text = slurp(text_path, &len);
    if (!text) {
        fprintf(stderr, PROG ": %s: %s\n", text_path, strerror(errno));
        return SIL_BENCH_EXIT_ERROR;
    }
    struct sil_error err = {0};
    struct sil_gguf *g = NULL;
    struct sil_vocab *v = NULL;
    double t0 = sil_bench_now();
    if (sil_gguf_open(&g, model, &err) < 0 || sil_vocab_load(&v, g, &err) < 0) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return SIL_BENCH_EXIT_ERROR;
    }
    double load_s = sil_bench_now() - t0;
    double *t = calloc((size_t)runs, sizeof *t);
    if (!t)
        return SIL_BENCH_EXIT_ERROR;
    int32_t *ids = NULL;
    size_t n = 0;
    for (int r = 0; r < runs; r++) {
        free(ids);
        double s = sil_bench_now();
        if (sil_tokenize(v, text, len, false, parse_special, &ids, &n, &err) < 0) {
            fprintf(stderr, PROG ": %s\n", err.msg);
            free(t);
            return SIL_BENCH_EXIT_ERROR;
        }
        t[r] = sil_bench_now() - s;
    }
    if (ids_out) {
        FILE *f = fopen(ids_out, "w");
        if (!f) {
            fprintf(stderr, PROG ": %s: %s\n", ids_out, strerror(errno));
            return SIL_BENCH_EXIT_ERROR;
        }
        for (size_t i = 0; i < n; i++)
            fprintf(f, "%d\n", ids[i]);
        if (ferror(f) | fclose(f)) {
            fprintf(stderr, PROG ": %s: write failed\n", ids_out);
            return SIL_BENCH_EXIT_ERROR;
        }
    }
    struct sil_bench_stat st = sil_bench_summarize(t, (int)runs);
    double mb = (double)len / 1e6;
    printf("{\"bytes\": %zu, \"tokens\": %zu, \"load_s\": %.4f, \"runs\": %d, "
           "\"median_s\": %.5f, \"min_s\": %.5f, \"max_s\": %.5f, \"median_mb_s\": %.2f, "
           "\"min_mb_s\": %.2f, \"max_mb_s\": %.2f}\n",
           len, n, load_s, (int)runs, st.median, st.min, st.max, mb / st.median, mb / st.max,
           mb / st.min);
    free(t);
    free(ids);
    free(text);
    sil_vocab_free(v);
    sil_gguf_close(g);
    return 0;
}
