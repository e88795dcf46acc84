/* sil-batchbench: aggregate decode throughput of N sequences decoding together, one
 * evaluation of N rows per step (greedy: the engine's argmax, found where the logits are; with
 * --pick host the logits come to the host and are picked there), for each N of --streams, next
 * to the byte bound of the same steps: the weight bytes a step must read (the backbone without
 * the embedding table, N embedding rows, and the routed experts the step's routing touched, as
 * the engine counted them) over the streaming read bandwidth measured just before, in the same
 * process with the same thread count. With --spec draft or mtp, the same N sequences then decode
 * the same tokens again by speculative decoding (a chain or, with a draft model, a token tree,
 * each sequence its own steps, as siliceod runs them), with the drafts accepted and the verify
 * pass's cost against a one-token step. Prints one JSON object per (run, N) on stdout, and with
 * --spec one more for the speculative decode; bench/run-batch.sh assembles the results file. */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/common/common.h"
#include "bench/common/spec.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/sampler.h"
#include "daemon/engine/size.h"
#include "daemon/engine/spec.h"

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
    int32_t *gen;   /* [MAX_STREAMS][n_gen]: each sequence's tokens after its first (--spec) */
    int n_gen_max;
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
            if (b->gen && step < b->n_gen_max)
                b->gen[(size_t)s * (size_t)b->n_gen_max + step] = b->tok[s];
        }
    }
    return 0;
}

/* Token i of sequence s's prompt. */
static int32_t prompt_token(int32_t V, int s, int i)
{
    return 100 + (i * 37 + s * 1009) % (V > 20100 ? 20000 : V - 100);
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
            b->tok[i] = prompt_token(V, s, i);
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

/* ---- speculative decoding ----------------------------------------------------------------- */

/* What a speculative measurement gives: the counters of every sequence added up, the seconds
 * of the whole decode, and whether every sequence's tokens were those of the plain decode. */
struct spec_result {
    struct sil_spec_stats st;
    double decode_s;
    bool identical;
};

/* Evaluates prompt_token(s, 0 .. n_prompt) in seq of e; the argmax of the last row into *first
 * (may be NULL). */
static int prefill(struct sil_engine *e, struct bufs *b, int seq, int s, int n_prompt,
                   int32_t *first, struct sil_error *err)
{
    const int32_t V = sil_engine_info(e)->n_vocab;
    for (int i = 0; i < n_prompt; i++) {
        b->tok[i] = prompt_token(V, s, i);
        b->pos[i] = i;
        b->seq[i] = seq;
    }
    const struct sil_batch bt = {n_prompt, b->tok, b->pos, b->seq, NULL};
    int32_t am;
    const int rc = sil_engine_eval_out(e, &bt, NULL, &am, NULL, err);
    if (rc == 0 && first) *first = am;
    return rc;
}

/* prefill for MTP drafting: the same rows, every one's hidden state fed to sp's MTP layer
 * (sil_spec_mtp_feed), so that it reads the prompt as it was trained to. */
static int prefill_fed(struct sil_engine *e, struct bufs *b, struct sil_spec *sp, int seq, int s,
                       int n_prompt, int32_t *first, struct sil_error *err)
{
    const int32_t V = sil_engine_info(e)->n_vocab;
    const size_t E = (size_t)sil_engine_info(e)->n_embd;
    float *hidden = malloc(sizeof(float) * (size_t)n_prompt * E);
    int32_t *am = malloc(sizeof(int32_t) * (size_t)n_prompt);
    bool *want = malloc(sizeof(bool) * (size_t)n_prompt);
    int rc = hidden && am && want ? 0 : sil_errorf(err, -ENOMEM, "out of memory");
    for (int i = 0; rc == 0 && i < n_prompt; i++) {
        b->tok[i] = prompt_token(V, s, i);
        b->pos[i] = i;
        b->seq[i] = seq;
        want[i] = true;
    }
    const struct sil_batch bt = {n_prompt, b->tok, b->pos, b->seq, want};
    if (rc == 0) rc = sil_engine_eval_hidden(e, &bt, NULL, am, hidden, err);
    if (rc == 0) rc = sil_spec_mtp_feed(sp, b->tok, n_prompt, hidden, err);
    if (rc == 0) *first = am[n_prompt - 1];
    free(hidden);
    free(am);
    free(want);
    return rc;
}

/* The speculative measurement: ns sequences of e prefilled as run_one's (and the draft's, de,
 * when there is one, outside the timing), then n_gen tokens each by speculative steps of a
 * width x depth tree of drafts (width 1: a chain), the sequences taking turns a step each;
 * their tokens are checked against the plain decode's in b->gen. */
static int run_spec(struct sil_engine *e, struct sil_engine *de, struct bufs *b, int ns,
                    int n_prompt, int n_gen, int32_t width, int32_t depth, struct spec_result *res)
{
    struct sil_error err = {0};
    struct sil_spec sp[MAX_STREAMS];
    int tseq[MAX_STREAMS], dseq[MAX_STREAMS];
    int32_t nh[MAX_STREAMS];
    const int32_t n_all = n_prompt + 1 + n_gen; /* prompt, the prefill's token, the decode's */
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)n_all * (size_t)ns);
    int rc = -1, made = 0, dmade = 0, inited = 0;
    memset(res, 0, sizeof(*res));
    memset(sp, 0, sizeof(sp));
    if (!hist) {
        snprintf(err.msg, sizeof(err.msg), "out of memory");
        goto out;
    }
    for (; made < ns; made++) {
        tseq[made] = sil_seq_create(e, &err);
        if (tseq[made] < 0) goto out;
    }
    for (; de && dmade < ns; dmade++) {
        dseq[dmade] = sil_seq_create(de, &err);
        if (dseq[dmade] < 0) goto out;
    }
    const int32_t V = sil_engine_info(e)->n_vocab;
    for (int s = 0; s < ns; s++) {
        int32_t *h = hist + (size_t)s * (size_t)n_all;
        for (int i = 0; i < n_prompt; i++)
            h[i] = prompt_token(V, s, i);
        if (!de) { /* the MTP layer drafts: it reads the prompt as the target takes it in */
            if (sil_spec_init_mtp(&sp[s], e, tseq[s], depth, &err) < 0) goto out;
            inited++;
            if (prefill_fed(e, b, &sp[s], tseq[s], s, n_prompt, &h[n_prompt], &err) < 0) goto out;
        } else if (prefill(e, b, tseq[s], s, n_prompt, &h[n_prompt], &err) < 0 ||
                   prefill(de, b, dseq[s], s, n_prompt, NULL, &err) < 0) {
            goto out;
        }
        nh[s] = n_prompt + 1;
    }
    for (int s = 0; s < ns; s++) {
        if (de) {
            if (sil_spec_init(&sp[s], e, tseq[s], de, dseq[s], depth, &err) < 0) goto out;
            inited++;
        }
        if (width > 1 && sil_spec_set_width(&sp[s], width, &err) < 0) goto out;
    }
    const double t0 = sil_bench_now();
    for (bool more = true; more;) {
        more = false;
        for (int s = 0; s < ns; s++) {
            if (nh[s] >= n_all) continue;
            int32_t *h = hist + (size_t)s * (size_t)n_all;
            const int k = sil_spec_step(&sp[s], h, nh[s], n_all - nh[s], h + nh[s], &err);
            if (k < 0) goto out;
            nh[s] += k;
            more |= nh[s] < n_all;
        }
    }
    res->decode_s = sil_bench_now() - t0;
    res->identical = true;
    for (int s = 0; s < ns; s++) {
        const struct sil_spec_stats *st = &sp[s].stats;
        res->st.steps += st->steps;
        res->st.drafted += st->drafted;
        res->st.accepted += st->accepted;
        res->st.emitted += st->emitted;
        res->st.draft_s += st->draft_s;
        res->st.verify_s += st->verify_s;
        res->st.commit_s += st->commit_s;
        res->st.moe_layers += st->moe_layers;
        res->st.expert_union += st->expert_union;
        res->st.expert_pairs += st->expert_pairs;
        const int32_t *h = hist + (size_t)s * (size_t)n_all + n_prompt + 1;
        if (memcmp(h, b->gen + (size_t)s * (size_t)b->n_gen_max, sizeof(int32_t) * (size_t)n_gen))
            res->identical = false;
    }
    rc = 0;
out:
    if (rc < 0) fprintf(stderr, PROG ": speculative decoding: %s\n", err.msg);
    for (int s = 0; s < inited; s++)
        sil_spec_free(&sp[s]);
    for (int s = 0; s < made; s++)
        sil_seq_free(e, tseq[s]);
    for (int s = 0; s < dmade; s++)
        sil_seq_free(de, dseq[s]);
    free(hist);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: " PROG " --model FILE [--threads N] [--streams LIST] [--prompt N] [--gen N]\n"
        "                      [--runs N] [--mib N]\n"
        "                      [--spec off|draft|mtp [--draft-model FILE] [--spec-tree WxD]]\n"
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
        "  --spec MODE     after each plain figure, the same tokens by speculative decoding:\n"
        "                  off (default), draft (--draft-model drafts) or mtp (the model's own\n"
        "                  MTP layer drafts)\n"
        "  --draft-model FILE the draft model of --spec draft (the model's vocabulary)\n"
        "  --spec-tree WxD drafts a step: 1xDEPTH, a chain (default 1x4), or with --spec\n"
        "                  draft a token tree, WIDTH x DEPTH drafts (1 + W x D <= 64)\n"
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
    const char *spec_arg = NULL, *draft_model = NULL, *spec_tree = NULL;
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
        {"spec", required_argument, 0, 'S'},
        {"draft-model", required_argument, 0, 'D'},
        {"spec-tree", required_argument, 0, 'T'},
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
        case 'S':
            spec_arg = optarg;
            break;
        case 'D':
            draft_model = optarg;
            break;
        case 'T':
            spec_tree = optarg;
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
    enum sil_bench_spec spec;
    long tree_width = 1, tree_depth = 4;
    if (sil_bench_spec_mode(PROG, spec_arg, draft_model, spec_tree, false, &spec) < 0 ||
        (spec_tree && sil_bench_spec_tree(PROG, spec_tree, &tree_width, &tree_depth) < 0))
        return SIL_BENCH_EXIT_USAGE;
    if (spec == SIL_BENCH_SPEC_MTP && tree_width > 1) {
        fprintf(stderr, PROG ": --spec-tree %s: the MTP layer drafts chains only; use 1x%ld\n",
                spec_tree, tree_depth);
        return SIL_BENCH_EXIT_USAGE;
    }
    const int32_t width = (int32_t)tree_width, depth = (int32_t)tree_depth;
    const int32_t spec_rows = 1 + width * depth; /* a verify pass's rows, the last token's too */
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
    p.spec_states = spec ? 1 : 0; /* one step's window is open at a time */
    /* a verify pass may run width x depth positions past the last token kept */
    p.n_ctx = (int32_t)(n_prompt + (n_gen > WARMUP_STEPS ? n_gen : WARMUP_STEPS) + 1 +
                        (spec ? spec_rows : 0));
    p.n_batch_max = (int32_t)(n_prompt > ns_max ? n_prompt : ns_max);
    if (spec && p.n_batch_max < spec_rows) p.n_batch_max = spec_rows;
    p.backend = backend;
    p.vram_budget = budget;
    struct sil_error err = {0};
    struct sil_engine *e;
    /* the draft model first (--spec draft), whole: on a device it takes its part of
     * --vram-budget and the target the rest */
    struct sil_engine *de; /* the draft model's engine */
    struct sil_engine_params dp;
    sil_engine_params_default(&dp);
    sil_dev_switches_read(&dp);
    dp.model_path = draft_model;
    dp.n_threads = p.n_threads;
    dp.backend = p.backend;
    dp.n_ctx = p.n_ctx;
    dp.n_seq_max = p.n_seq_max;
    dp.n_batch_max = (int32_t)(n_prompt > spec_rows ? n_prompt : spec_rows);
    if (sil_bench_spec_draft_first(PROG, spec, &dp, &p, &de) < 0) return SIL_BENCH_EXIT_ERROR;
    if (sil_engine_open(&e, &p, &err) < 0) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        sil_engine_close(de);
        return SIL_BENCH_EXIT_ERROR;
    }
    /* trees need a target that verifies them (known before any figure is measured) */
    if (spec && width > 1 && !sil_engine_has_tree(e)) {
        fprintf(stderr,
                PROG ": --spec-tree %dx%d: token trees need the CPU backend (%s runs on %s); "
                     "use 1x%d\n",
                (int)width, (int)depth, model, sil_engine_info(e)->backend, (int)depth);
        sil_engine_close(de);
        sil_engine_close(e);
        return SIL_BENCH_EXIT_ERROR;
    }
    if (sil_bench_spec_check(PROG, spec, e, model, &de) < 0) {
        sil_engine_close(e);
        return SIL_BENCH_EXIT_ERROR;
    }
    const size_t bw_bytes = (size_t)mib << 20;
    const int32_t V = sil_engine_info(e)->n_vocab;
    struct bufs b = {0};
    b.host_pick = host_pick;
    if (spec) {
        b.n_gen_max = (int)n_gen;
        b.gen = malloc(sizeof(int32_t) * (size_t)n_gen * MAX_STREAMS);
    }
    const size_t rows = (size_t)p.n_batch_max;
    b.tok = calloc(rows, sizeof(int32_t));
    b.pos = calloc(rows, sizeof(int32_t));
    b.seq = calloc(rows, sizeof(int32_t));
    b.logits = malloc(sizeof(float) * (size_t)V * (size_t)ns_max);
    uint8_t *bw_buf = aligned_alloc(64, bw_bytes);
    int rc = SIL_BENCH_EXIT_ERROR;
    if (!b.tok || !b.pos || !b.seq || !b.logits || !bw_buf || (spec && !b.gen)) {
        fprintf(stderr, PROG ": out of memory\n");
        goto out;
    }
    memset(bw_buf, 1, bw_bytes); /* fault the pages in before timing */
    /* warm-up: the model's pages into the page cache, the pool's threads started */
    double tok_s, eb, cpu_ms;
    if (run_one(e, &b, 1, (int)n_prompt, WARMUP_STEPS, &tok_s, &eb, &cpu_ms) < 0) goto out;
    for (int r = 0; r < runs; r++) {
        /* with --spec, the one-token step the verify pass is set against: one row of one
         * sequence, timed inside the engine, in this run */
        double one_ms = 0;
        if (spec) {
            if (run_one(e, &b, 1, (int)n_prompt, (int)n_gen, &tok_s, &eb, &cpu_ms) < 0) goto out;
            one_ms = b.eval_s * 1e3 / (double)n_gen;
        }
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
            if (!spec) continue;
            const double plain_tok_s = tok_s;
            struct spec_result sr;
            if (run_spec(e, de, &b, ns[i], (int)n_prompt, (int)n_gen, width, depth, &sr) < 0)
                goto out;
            const struct sil_spec_stats *ss = &sr.st;
            const double steps = ss->steps ? (double)ss->steps : 1.0;
            const double spec_tok_s = sr.decode_s > 0 ? (double)ns[i] * n_gen / sr.decode_s : 0.0;
            const double verify_ms = 1e3 * ss->verify_s / steps;
            printf("{\"run\": %d, \"backend\": \"%s\", \"streams\": %d, \"threads\": %d, "
                   "\"prompt\": %d, \"gen\": %d, \"spec\": {\"mode\": \"%s\", \"draft_model\": ",
                   r + 1, sil_engine_info(e)->backend, ns[i], (int)threads, (int)n_prompt,
                   (int)n_gen, spec == SIL_BENCH_SPEC_MTP ? "mtp" : "draft");
            sil_bench_print_json_str(spec == SIL_BENCH_SPEC_DRAFT ? draft_model : NULL);
            printf(", \"tree\": \"%dx%d\", \"width\": %d, \"depth\": %d, \"identical\": %s, "
                   "\"steps\": %llu, \"drafted\": %llu, \"accepted\": %llu, \"emitted\": %llu, "
                   "\"acceptance_rate\": %.4f, \"accepted_per_step\": %.4f, "
                   "\"tokens_per_step\": %.4f, \"verify_step_ms\": %.4f, "
                   "\"one_token_step_ms\": %.4f, \"verify_vs_one_token\": %.4f, "
                   "\"draft_ms_per_step\": %.4f, \"commit_ms_per_step\": %.4f, "
                   "\"moe_layers\": %llu, \"expert_union_per_layer\": %.4f, "
                   "\"expert_pairs_per_layer\": %.4f}, "
                   "\"decode_tok_s\": %.3f, \"plain_decode_tok_s\": %.3f, \"speedup\": %.4f}\n",
                   (int)width, (int)depth, (int)width, (int)depth, sr.identical ? "true" : "false",
                   (unsigned long long)ss->steps, (unsigned long long)ss->drafted,
                   (unsigned long long)ss->accepted, (unsigned long long)ss->emitted,
                   ss->drafted ? (double)ss->accepted / (double)ss->drafted : 0.0,
                   (double)ss->accepted / steps, (double)ss->emitted / steps, verify_ms, one_ms,
                   one_ms > 0 ? verify_ms / one_ms : 0.0, 1e3 * ss->draft_s / steps,
                   1e3 * ss->commit_s / steps, (unsigned long long)ss->moe_layers,
                   ss->moe_layers ? (double)ss->expert_union / (double)ss->moe_layers : 0.0,
                   ss->moe_layers ? (double)ss->expert_pairs / (double)ss->moe_layers : 0.0,
                   spec_tok_s, plain_tok_s, plain_tok_s > 0 ? spec_tok_s / plain_tok_s : 0.0);
            fflush(stdout);
        }
    }
    rc = 0;
out:
    free(bw_buf);
    free(b.tok);
    free(b.pos);
    free(b.seq);
    free(b.logits);
    free(b.gen);
    sil_engine_close(de);
    sil_engine_close(e);
    return rc;
}
