/* sil-batchbench: aggregate decode throughput of N sequences decoding together, one
 * evaluation of N rows per step (greedy: the engine's argmax, found where the logits are; with
 * --pick host the logits come to the host and are picked there), for each N of --streams, next
 * to the byte bound of the same steps: the weight bytes a step must read (the backbone without
 * the embedding table, N embedding rows, and the routed experts the step's routing touched, as
 * the engine counted them) over the streaming read bandwidth measured just before, in the same
 * process with the same thread count. Prints one JSON object per (run, N) on stdout;
 * bench/run-batch.sh assembles the results file. */
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/common/common.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/sampler.h"
#include "daemon/engine/size.h"

#define PROG "sil-batchbench"
#define MAX_STREAMS 64
#define MAX_THREADS 64
#define WARMUP_STEPS 4 /* decode steps of the untimed first run */

/* ---- model bytes -------------------------------------------------------------------------- */

/* Bytes every decode step reads whatever the routing: tensors that are not routed experts,
 * less the embedding table when a separate output head exists (a step reads only its rows);
 * *embd_row: bytes of one embedding row. */
static int step_bytes(const char *path, uint64_t *fixed, uint64_t *embd_row)
{
    struct sil_gguf *g;
    struct sil_error err = {0};
    if (sil_gguf_open(&g, path, &err) < 0) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return -1;
    }
    *fixed = 0;
    *embd_row = 0;
    for (int64_t i = 0; i < sil_gguf_n_tensors(g); i++) {
        const struct sil_gguf_tensor *t = sil_gguf_tensor(g, i);
        if (!strstr(t->name, "_exps.")) *fixed += t->nbytes;
    }
    const struct sil_gguf_tensor *te = sil_gguf_find_tensor(g, "token_embd.weight");
    if (te && sil_gguf_find_tensor(g, "output.weight") && te->ne[1] > 0) {
        *fixed -= te->nbytes;
        *embd_row = te->nbytes / (uint64_t)te->ne[1];
    }
    sil_gguf_close(g);
    return 0;
}

/* ---- the benchmark ------------------------------------------------------------------------ */

/* CPU seconds of the whole process: with one thread, the work a step did, whatever the load of
 * a shared machine (with more, it includes the pool's spinning). */
static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct bufs {
    int32_t *tok, *pos, *seq;
    int32_t seqs[MAX_STREAMS];
    int32_t am[MAX_STREAMS];
    float *logits;
    bool host_pick; /* --pick host: every row's logits to the host, argmax there */
    double eval_s;  /* seconds inside the engine during decode_steps */
};

/* The timed part: n_gen steps of ns rows, each row's next token its argmax. Not inlined, so a
 * profiler can collect this function alone (valgrind --toggle-collect=decode_steps). */
__attribute__((noinline)) static int decode_steps(struct sil_engine *e, struct bufs *b, int ns,
                                                  int n_gen, struct sil_error *err)
{
    const int32_t V = sil_engine_info(e)->n_vocab;
    b->eval_s = 0;
    for (int step = 0; step < n_gen; step++) {
        const struct sil_batch bt = {ns, b->tok, b->pos, b->seq, NULL};
        const double t0 = sil_bench_now();
        if (sil_engine_eval_out(e, &bt, b->host_pick ? b->logits : NULL,
                                b->host_pick ? NULL : b->am, NULL, err) < 0)
            return -1;
        b->eval_s += sil_bench_now() - t0;
        for (int s = 0; s < ns; s++) {
            b->tok[s] = b->host_pick ? sil_argmax(b->logits + (size_t)s * V, V) : b->am[s];
            b->pos[s]++;
        }
    }
    return 0;
}

/* One measurement: ns sequences prefilled with n_prompt tokens each, then n_gen decode steps of
 * ns rows. */
static int run_one(struct sil_engine *e, struct bufs *b, int ns, int n_prompt, int n_gen,
                   double *tok_s, double *expert_bytes_step, double *cpu_ms_step)
{
    struct sil_error err = {0};
    const int32_t V = sil_engine_info(e)->n_vocab;
    int rc = -1, made = 0;
    for (; made < ns; made++) {
        b->seqs[made] = sil_seq_create(e, &err);
        if (b->seqs[made] < 0) goto out;
    }
    for (int s = 0; s < ns; s++) { /* prompts differ per sequence, so the routing does too */
        for (int i = 0; i < n_prompt; i++) {
            b->tok[i] = 100 + (i * 37 + s * 1009) % (V > 20100 ? 20000 : V - 100);
            b->pos[i] = i;
            b->seq[i] = b->seqs[s];
        }
        const struct sil_batch bt = {n_prompt, b->tok, b->pos, b->seq, NULL};
        if (sil_engine_eval(e, &bt, b->logits + (size_t)s * V, &err) < 0) goto out;
    }
    for (int s = 0; s < ns; s++) {
        b->tok[s] = sil_argmax(b->logits + (size_t)s * V, V);
        b->pos[s] = n_prompt;
        b->seq[s] = b->seqs[s];
    }
    struct sil_engine_stats st0, st1;
    sil_engine_stats(e, &st0);
    const double t0 = sil_bench_now(), c0 = cpu_now();
    if (decode_steps(e, b, ns, n_gen, &err) < 0) goto out;
    const double dt = sil_bench_now() - t0;
    *cpu_ms_step = (cpu_now() - c0) * 1e3 / n_gen;
    sil_engine_stats(e, &st1);
    *tok_s = (double)ns * n_gen / dt;
    *expert_bytes_step = (double)(st1.expert_bytes - st0.expert_bytes) / n_gen;
    rc = 0;
out:
    if (rc < 0) fprintf(stderr, PROG ": %s\n", err.msg);
    for (int s = 0; s < made; s++)
        sil_seq_free(e, b->seqs[s]);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: " PROG " --model FILE [--threads N] [--streams LIST] [--prompt N] [--gen N]\n"
        "                      [--runs N] [--mib N]\n"
        "\n"
        "Aggregate decode tok/s of N sequences decoding in one eval per step, for each N,\n"
        "next to the byte bound of the same steps. One JSON object per line on stdout.\n"
        "\n"
        "  --model FILE    GGUF model\n"
        "  --threads N     engine and bandwidth threads (1-64, default 2)\n"
        "  --streams LIST  comma-separated stream counts (1-64 each, default 1,2,4,8,16)\n"
        "  --prompt N      prompt tokens per sequence (1-4096, default 32)\n"
        "  --gen N         decode steps measured (1-4096, default 64)\n"
        "  --runs N        repetitions; stream counts alternate within a run (default 3)\n"
        "  --mib N         bandwidth buffer in MiB, larger than the caches (default 1024)\n"
        "  --backend NAME  cpu (default) or cuda\n"
        "  --vram-budget SIZE device memory cap for the cuda backend (e.g. 8G)\n"
        "  --pick WHERE    device (default: the engine's argmax, only token ids come back) or\n"
        "                  host (every row's logits to the host, argmax there)\n"
        "  --bw-gbs F      the bandwidth the byte bound divides by, in GB/s, instead of the\n"
        "                  host read bandwidth measured before each figure (a device's, measured\n"
        "                  elsewhere in the same run); needed with --backend cuda\n"
        "  --help, --version\n");
}

int main(int argc, char **argv)
{
    const char *model = NULL, *streams = "1,2,4,8,16";
    int64_t threads = 2, n_prompt = 32, n_gen = 64, runs = 3, mib = 1024;
    const char *backend = "cpu";
    double bw_given = 0;
    uint64_t budget = 0;
    bool host_pick = false;
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'},
        {"threads", required_argument, 0, 't'},
        {"streams", required_argument, 0, 's'},
        {"prompt", required_argument, 0, 'p'},
        {"gen", required_argument, 0, 'g'},
        {"runs", required_argument, 0, 'r'},
        {"mib", required_argument, 0, 'b'},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {"backend", required_argument, 0, 'k'},
        {"vram-budget", required_argument, 0, 'v'},
        {"bw-gbs", required_argument, 0, 'w'},
        {"pick", required_argument, 0, 'P'},
        {0, 0, 0, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        int r = 0;
        switch (c) {
        case 'm':
            model = optarg;
            break;
        case 's':
            streams = optarg;
            break;
        case 't':
            r = sil_bench_parse_i64(PROG, "--threads", optarg, 1, MAX_THREADS, &threads);
            break;
        case 'p':
            r = sil_bench_parse_i64(PROG, "--prompt", optarg, 1, 4096, &n_prompt);
            break;
        case 'g':
            r = sil_bench_parse_i64(PROG, "--gen", optarg, 1, 4096, &n_gen);
            break;
        case 'r':
            r = sil_bench_parse_i64(PROG, "--runs", optarg, 1, 100, &runs);
            break;
        case 'b':
            r = sil_bench_parse_i64(PROG, "--mib", optarg, 16, 65536, &mib);
            break;
        case 'k':
            backend = optarg;
            if (strcmp(backend, "cpu") && strcmp(backend, "cuda")) {
                fprintf(stderr, PROG ": --backend must be cpu or cuda\n");
                r = 1;
            }
            break;
        case 'v':
            if (sil_parse_size(optarg, &budget) < 0 || budget == 0) {
                fprintf(stderr, PROG ": --vram-budget must be a size such as 8G\n");
                r = 1;
            }
            break;
        case 'P':
            if (strcmp(optarg, "device") && strcmp(optarg, "host")) {
                fprintf(stderr, PROG ": --pick must be device or host\n");
                r = 1;
            }
            host_pick = strcmp(optarg, "host") == 0;
            break;
        case 'w':
            r = sil_bench_parse_double(PROG, "--bw-gbs", optarg, 0.001, 1e6, &bw_given);
            break;
        case 'h':
            usage(stdout);
            return 0;
        case 'V':
            sil_bench_version(PROG);
            return 0;
        default:
            usage(stderr);
            return SIL_BENCH_EXIT_USAGE;
        }
        if (r) return SIL_BENCH_EXIT_USAGE;
    }
    if (!model || optind < argc) {
        usage(stderr);
        return SIL_BENCH_EXIT_USAGE;
    }
    int ns[MAX_STREAMS], n_ns = 0, ns_max = 0;
    char list[256];
    snprintf(list, sizeof(list), "%s", streams);
    for (char *sv = NULL, *w = strtok_r(list, ",", &sv); w; w = strtok_r(NULL, ",", &sv)) {
        int64_t v;
        if (n_ns == MAX_STREAMS || sil_bench_parse_i64(PROG, "--streams", w, 1, MAX_STREAMS, &v))
            return SIL_BENCH_EXIT_USAGE;
        ns[n_ns++] = (int)v;
        ns_max = v > ns_max ? (int)v : ns_max;
    }
    if (n_ns == 0) {
        usage(stderr);
        return SIL_BENCH_EXIT_USAGE;
    }
    if (strcmp(backend, "cpu") != 0 && bw_given <= 0) {
        fprintf(stderr, PROG ": --backend %s needs --bw-gbs (the device's bandwidth)\n", backend);
        return SIL_BENCH_EXIT_USAGE;
    }

    uint64_t fixed, embd_row;
    if (step_bytes(model, &fixed, &embd_row) < 0) return SIL_BENCH_EXIT_ERROR;
    struct sil_engine_params p;
    sil_engine_params_default(&p);
    sil_dev_switches_read(&p);
    p.model_path = model;
    p.n_threads = (int)threads;
    p.n_seq_max = ns_max;
    p.n_ctx = (int32_t)(n_prompt + (n_gen > WARMUP_STEPS ? n_gen : WARMUP_STEPS) + 1);
    p.n_batch_max = (int32_t)(n_prompt > ns_max ? n_prompt : ns_max);
    p.backend = backend;
    p.vram_budget = budget;
    struct sil_error err = {0};
    struct sil_engine *e;
    if (sil_engine_open(&e, &p, &err) < 0) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return SIL_BENCH_EXIT_ERROR;
    }
    const size_t bw_bytes = (size_t)mib << 20;
    const int32_t V = sil_engine_info(e)->n_vocab;
    struct bufs b = {0};
    b.host_pick = host_pick;
    const size_t rows = (size_t)p.n_batch_max;
    b.tok = calloc(rows, sizeof(int32_t));
    b.pos = calloc(rows, sizeof(int32_t));
    b.seq = calloc(rows, sizeof(int32_t));
    b.logits = malloc(sizeof(float) * (size_t)V * (size_t)ns_max);
    uint8_t *bw_buf = aligned_alloc(64, bw_bytes);
    int rc = SIL_BENCH_EXIT_ERROR;
    if (!b.tok || !b.pos || !b.seq || !b.logits || !bw_buf) {
        fprintf(stderr, PROG ": out of memory\n");
        goto out;
    }
    memset(bw_buf, 1, bw_bytes); /* fault the pages in before timing */
    /* warm-up: the model's pages into the page cache, the pool's threads started */
    double tok_s, eb, cpu_ms;
    if (run_one(e, &b, 1, (int)n_prompt, WARMUP_STEPS, &tok_s, &eb, &cpu_ms) < 0) goto out;
    for (int r = 0; r < runs; r++)
        for (int i = 0; i < n_ns; i++) {
            const double bw =
                bw_given > 0 ? bw_given : sil_bench_read_bw(bw_buf, bw_bytes, (int)threads);
            if (run_one(e, &b, ns[i], (int)n_prompt, (int)n_gen, &tok_s, &eb, &cpu_ms) < 0)
                goto out;
            const double step = (double)fixed + (double)embd_row * ns[i] + eb;
            if (eb == 0 && sil_engine_info(e)->n_expert > 0 && r == 0)
                fprintf(stderr,
                        PROG ": %d streams: no expert bytes counted (routing kept on the device); "
                             "SIL_CUDA_HOST_ROUTE=1 gives them for the same tokens\n",
                        ns[i]);
            printf("{\"run\": %d, \"backend\": \"%s\", \"streams\": %d, \"threads\": %d, "
                   "\"prompt\": %d, \"gen\": %d, "
                   "\"decode_tok_s\": %.3f, \"read_bw_gb_s\": %.3f, \"bw_source\": \"%s\", "
                   "\"backbone_bytes_step\": %.0f, "
                   "\"expert_bytes_step\": %.0f, \"floor_tok_s\": %.3f, \"cpu_ms_step\": %.3f, "
                   "\"pick\": \"%s\", \"eval_ms_step\": %.3f, \"step_ms\": %.3f}\n",
                   r + 1, sil_engine_info(e)->backend, ns[i], (int)threads, (int)n_prompt,
                   (int)n_gen, tok_s, bw, bw_given > 0 ? "given" : "measured",
                   (double)fixed + (double)embd_row * ns[i], eb, ns[i] * bw * 1e9 / step, cpu_ms,
                   host_pick ? "host" : "device", b.eval_s * 1e3 / (double)n_gen,
                   1e3 * ns[i] / tok_s);
            fflush(stdout);
        }
    rc = 0;
out:
    free(bw_buf);
    free(b.tok);
    free(b.pos);
    free(b.seq);
    free(b.logits);
    sil_engine_close(e);
    return rc;
}
