/* sil-bench: measures siliceod as its clients see it: prefill and decode tok/s, time to first
 * token, a concurrency sweep, expert-cache figures, and the protocol's own cost per streamed
 * token (debug.stream). Writes results JSON as bench/results expects. See sil-bench(1).
 * Prompts are token ids of exactly the asked length, fresh for every request unless
 * --reuse-prompt, so the prefix cache cannot pass for prefill; each figure is filed as cold or
 * cached by what the daemon says it reused. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include "client/common/common.h"

#define PROG "sil-bench"
#define MAX_LEVELS 16
#define MAX_RUNS 100

struct opts {
    const char *socket;
    long prompt_tokens, gen_tokens, runs, count;
    long levels[MAX_LEVELS];
    int n_levels;
    bool overhead;
    bool reuse_prompt; /* one prompt for every request: runs after the first hit the prefix cache */
    const char *out, *plot, *name, *notes, *text;
    double timeout_s;
};

struct series {
    double v[MAX_RUNS];
    int n;
};

struct result {
    const char *metric, *unit;
    char config[96];
    struct series s;
};

#define MAX_RESULTS 64
static struct result results[MAX_RESULTS];
static int n_results;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [OPTIONS]\n"
            "Benchmark a running siliceod: prefill and decode speed, time to first token,\n"
            "throughput at several concurrencies, and the protocol's cost per streamed token.\n"
            "\n"
            "  -p, --prompt-tokens N      prompt length in tokens, exactly (512)\n"
            "  -n, --gen-tokens N         tokens to generate per request, at most (128)\n"
            "  -r, --runs N               repetitions of each measurement (3)\n"
            "  -c, --concurrency LIST     parallel connections, e.g. 1,2,4,8 (1)\n"
            "      --reuse-prompt         send one prompt to every request, so runs after the\n"
            "                             first measure the prefix cache (default: a fresh\n"
            "                             prompt per request, measuring prefill cold)\n"
            "      --protocol-overhead    only measure the cost per streamed token\n"
            "                             (debug.stream)\n"
            "      --count N              notifications per --protocol-overhead run (100000)\n"
            "      --text TEXT            text of each notification (\"x\")\n"
            "  -o, --out FILE             write the results as JSON\n"
            "      --plot FILE            PNG of the concurrency sweep (needs gnuplot)\n"
            "      --name NAME            benchmark name in the JSON (\"serve\" or \"proto\")\n"
            "      --notes TEXT           notes for the JSON\n"
            "      --timeout SECONDS      per request (default 600)\n"
            "      --socket PATH          daemon socket\n"
            "  -h, --help                 this help\n"
            "  -V, --version              version\n");
}

enum { O_OVERHEAD = 256, O_REUSE, O_COUNT, O_TEXT, O_PLOT, O_NAME, O_NOTES, O_TIMEOUT, O_SOCKET };

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        {"prompt-tokens", required_argument, 0, 'p'},
        {"gen-tokens", required_argument, 0, 'n'},
        {"runs", required_argument, 0, 'r'},
        {"concurrency", required_argument, 0, 'c'},
        {"protocol-overhead", no_argument, 0, O_OVERHEAD},
        {"reuse-prompt", no_argument, 0, O_REUSE},
        {"count", required_argument, 0, O_COUNT},
        {"text", required_argument, 0, O_TEXT},
        {"out", required_argument, 0, 'o'},
        {"plot", required_argument, 0, O_PLOT},
        {"name", required_argument, 0, O_NAME},
        {"notes", required_argument, 0, O_NOTES},
        {"timeout", required_argument, 0, O_TIMEOUT},
        {"socket", required_argument, 0, O_SOCKET},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    int c, r;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":p:n:r:c:o:hV", lo, NULL)) != -1) {
        r = 0;
        switch (c) {
        case 'p': r = sil_client_parse_long(PROG, "--prompt-tokens", optarg, 1, 1000000, &o->prompt_tokens); break;
        case 'n': r = sil_client_parse_long(PROG, "--gen-tokens", optarg, 1, 1000000, &o->gen_tokens); break;
        case 'r': r = sil_client_parse_long(PROG, "--runs", optarg, 1, MAX_RUNS, &o->runs); break;
        case 'c':
            r = sil_client_parse_list(PROG, "--concurrency", optarg, 1, 256, o->levels, MAX_LEVELS);
            if (r > 0)
                o->n_levels = r;
            break;
        case O_OVERHEAD: o->overhead = true; break;
        case O_REUSE: o->reuse_prompt = true; break;
        case O_COUNT: r = sil_client_parse_long(PROG, "--count", optarg, 1, 10000000, &o->count); break;
        case O_TEXT: o->text = optarg; break;
        case 'o': o->out = optarg; break;
        case O_PLOT: o->plot = optarg; break;
        case O_NAME: o->name = optarg; break;
        case O_NOTES: o->notes = optarg; break;
        case O_TIMEOUT: r = sil_client_parse_double(PROG, "--timeout", optarg, 0.001, 86400, &o->timeout_s); break;
        case O_SOCKET: o->socket = optarg; break;
        case 'h': usage(stdout); exit(0);
        case 'V': sil_client_version(PROG); exit(0);
        default: sil_client_bad_option(PROG, c, argc, argv, lo); return -1;
        }
        if (r < 0)
            return -1;
    }
    if (optind < argc) {
        sil_client_usage_error(PROG, "unexpected argument '%s'", argv[optind]);
        return -1;
    }
    if (o->reuse_prompt && o->overhead) {
        sil_client_usage_error(PROG, "--reuse-prompt is for generation, not --protocol-overhead");
        return -1;
    }
    if (o->plot && o->overhead) {
        sil_client_usage_error(PROG, "--plot draws the concurrency sweep, not --protocol-overhead");
        return -1;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const struct series *s, double *min, double *max)
{
    double v[MAX_RUNS];
    memcpy(v, s->v, sizeof(double) * (size_t)s->n);
    qsort(v, (size_t)s->n, sizeof(double), cmp_double);
    *min = v[0];
    *max = v[s->n - 1];
    return s->n % 2 ? v[s->n / 2] : (v[s->n / 2 - 1] + v[s->n / 2]) / 2;
}

static struct result *result_for(const char *metric, const char *unit, const char *config)
{
    for (int i = 0; i < n_results; i++)
        if (!strcmp(results[i].metric, metric) && !strcmp(results[i].config, config))
            return &results[i];
    if (n_results == MAX_RESULTS)
        return NULL;
    struct result *r = &results[n_results++];
    r->metric = metric;
    r->unit = unit;
    snprintf(r->config, sizeof(r->config), "%s", config);
    return r;
}

static void record(const char *metric, const char *unit, const char *config, double v)
{
    struct result *r = result_for(metric, unit, config);
    if (r && r->s.n < MAX_RUNS)
        r->s.v[r->s.n++] = v;
}

/* ---- prompts ---------------------------------------------------------------------------------- */

/* Common English words: text a tokenizer sees every day, one token or a few each. */
static const char *const words[] = {
    "the", "of", "and", "to", "in", "is", "that", "it", "was", "for", "on", "are", "as", "with",
    "his", "they", "at", "be", "this", "from", "have", "or", "by", "one", "had", "not", "but",
    "what", "all", "were", "when", "we", "there", "can", "an", "your", "which", "their", "said",
    "if", "do", "will", "each", "about", "how", "up", "out", "them", "then", "she", "many",
    "some", "so", "these", "would", "other", "into", "has", "more", "her", "two", "like", "him",
    "see",
};

/* xorshift64*: seeded from the clock and the pid, so no two requests, nor two runs of
 * sil-bench, send the same prompt unless --reuse-prompt asks for it. */
static uint64_t next_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static uint64_t rand_seed(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t s = (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid() << 32;
    return s ? s : 1;
}

/* n random words separated by spaces (malloc'd). */
static char *random_text(long n, uint64_t *rng)
{
    const size_t n_words = sizeof(words) / sizeof(words[0]);
    char *s = malloc((size_t)n * 8 + 1);
    if (!s)
        return NULL;
    size_t len = 0;
    for (long i = 0; i < n; i++)
        len += (size_t)sprintf(s + len, "%s%s", i ? " " : "", words[next_rand(rng) % n_words]);
    s[len] = 0;
    return s;
}

/* Exactly n token ids (into ids) of a fresh random text, tokenized by the daemon and cut to
 * length: the prompt is as long as asked whatever the vocabulary. A word is a token or more,
 * so n words are enough; should a vocabulary merge words, twice as many are tried. */
static int make_prompt(struct sil_rpc_client *c, long n, uint64_t *rng, int32_t *ids,
                       struct sil_rpc_error *e)
{
    for (long n_words = n; n_words <= 4 * n; n_words *= 2) {
        char *text = random_text(n_words, rng);
        if (!text)
            return sil_rpc_errorf(e, -ENOMEM, 0, "out of memory");
        msgpack_packer *pk = sil_rpc_client_begin(c, "tokenize");
        msgpack_pack_map(pk, 1);
        sil_rpc_kv_str(pk, "text", text);
        free(text);
        const msgpack_object *res = NULL, *arr = NULL;
        int r = sil_rpc_client_call(c, NULL, NULL, &res, e);
        if (r == 0)
            r = sil_rpc_get_array(res, "ids", &arr, SIL_RPC_REQUIRED, e);
        if (r < 0) {
            sil_rpc_error_prefix(e, "tokenize");
            return r;
        }
        if ((long)arr->via.array.size < n)
            continue;
        for (long i = 0; i < n; i++) {
            const msgpack_object *id = &arr->via.array.ptr[i];
            if (id->type != MSGPACK_OBJECT_POSITIVE_INTEGER || id->via.u64 > INT32_MAX)
                return sil_rpc_errorf(e, -EPROTO, 0, "tokenize: ids[%ld] is not a token id", i);
            ids[i] = (int32_t)id->via.u64;
        }
        return 0;
    }
    return sil_rpc_errorf(e, -ERANGE, 0, "tokenize: %ld words gave fewer than %ld tokens", 4 * n, n);
}

/* ---- one generation request per thread -------------------------------------------------------- */

struct job {
    const struct opts *o;
    const int32_t *ids; /* the prompt: o->prompt_tokens ids */
    pthread_barrier_t *start;
    double t_send, t_first, t_end;
    int64_t n_generated, n_prompt, n_cached;
    double prefill_tok_s, decode_tok_s, daemon_ttft_ms;
    int rc;
    char err[512];
};

static int on_token(void *ud, const struct sil_rpc_msg *m)
{
    struct job *j = ud;
    if (m && m->type == SIL_RPC_NOTIFICATION && strcmp(m->method, "token") == 0 && j->t_first == 0)
        j->t_first = sil_client_now();
    return 0;
}

static void *run_job(void *arg)
{
    struct job *j = arg;
    struct sil_rpc_client c;
    struct sil_rpc_error e = {0};
    j->rc = sil_client_connect(&c, j->o->socket, (int)(j->o->timeout_s * 1000), &e);
    if (j->start)
        pthread_barrier_wait(j->start);
    if (j->rc < 0) {
        snprintf(j->err, sizeof(j->err), "%s", e.msg);
        return NULL;
    }
    msgpack_packer *pk = sil_rpc_client_begin(&c, "generate");
    msgpack_pack_map(pk, 5);
    sil_rpc_pack_cstr(pk, "prompt_tokens");
    msgpack_pack_array(pk, (uint32_t)j->o->prompt_tokens);
    for (long i = 0; i < j->o->prompt_tokens; i++)
        msgpack_pack_int32(pk, j->ids[i]);
    sil_rpc_kv_int(pk, "max_tokens", j->o->gen_tokens);
    /* Exactly --gen-tokens tokens: no grace tokens to end a sentence after the budget. */
    sil_rpc_kv_int(pk, "grace_tokens", 0);
    sil_rpc_kv_double(pk, "temperature", 0);
    sil_rpc_kv_uint(pk, "seed", 1);
    const msgpack_object *res = NULL;
    j->t_first = 0;
    j->t_send = sil_client_now();
    j->rc = sil_rpc_client_call(&c, on_token, j, &res, &e);
    j->t_end = sil_client_now();
    if (j->rc < 0) {
        snprintf(j->err, sizeof(j->err), "%s", e.msg);
    } else {
        const msgpack_object *t = sil_rpc_map_get(res, "timings");
        j->n_generated = sil_rpc_map_int(res, "n_generated", 0);
        j->n_prompt = sil_rpc_map_int(res, "n_prompt", 0);
        j->n_cached = sil_rpc_map_int(res, "n_cached", 0);
        j->prefill_tok_s = sil_rpc_map_double(t, "prefill_tok_s", 0);
        j->decode_tok_s = sil_rpc_map_double(t, "decode_tok_s", 0);
        j->daemon_ttft_ms = sil_rpc_map_double(t, "time_to_first_token_ms", 0);
    }
    sil_rpc_client_close(&c);
    return NULL;
}

/* Per concurrency level, medians over the runs: aggregate tok/s (generated tokens of all
 * requests over the wall time, prefill included) and per-request decode tok/s. */
static double plot_x[MAX_LEVELS], plot_agg[MAX_LEVELS], plot_decode[MAX_LEVELS];
static int n_plot;

/* Lengths as the daemon counted them, over every request, for the plot's title. */
struct range {
    int64_t lo, hi;
    bool any;
};
static struct range seen_prompt, seen_cached, seen_gen;
static int n_short; /* requests the model ended before --gen-tokens */

static void range_add(struct range *r, int64_t v)
{
    if (!r->any || v < r->lo)
        r->lo = v;
    if (!r->any || v > r->hi)
        r->hi = v;
    r->any = true;
}

/* "7" or "3 to 7" */
static const char *range_str(const struct range *r, char *buf, size_t size)
{
    if (r->lo == r->hi)
        snprintf(buf, size, "%" PRId64, r->lo);
    else
        snprintf(buf, size, "%" PRId64 " to %" PRId64, r->lo, r->hi);
    return buf;
}

/* Runs the requests of one run, C in parallel, each with its own connection. */
static int run_level(const struct opts *o, int C, struct job *jobs)
{
    pthread_t *th = calloc((size_t)C, sizeof(*th));
    if (!th)
        return -ENOMEM;
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)C);
    for (int i = 0; i < C; i++) {
        jobs[i].o = o;
        jobs[i].start = &bar;
        pthread_create(&th[i], NULL, run_job, &jobs[i]);
    }
    for (int i = 0; i < C; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&bar);
    free(th);
    for (int i = 0; i < C; i++) {
        if (jobs[i].rc < 0) {
            sil_client_warn(PROG, "request failed: %s", jobs[i].err);
            return -EIO;
        }
    }
    return 0;
}

/* Files one run's figures under its configuration: "prefix=cached" when the daemon reused part
 * of any request's prompt, else "prefix=cold", so a cache hit never passes for prefill. */
static void record_run(const struct opts *o, int C, long run, const struct job *jobs,
                       double *agg_tok_s, double *decode_tok_s)
{
    double t0 = INFINITY, t1 = 0, decode_sum = 0, prompt_sum = 0, cached_sum = 0;
    int64_t total = 0;
    bool cached = false;
    for (int i = 0; i < C; i++) {
        const struct job *j = &jobs[i];
        t0 = fmin(t0, j->t_send);
        t1 = fmax(t1, j->t_end);
        total += j->n_generated;
        decode_sum += j->decode_tok_s;
        prompt_sum += (double)j->n_prompt;
        cached_sum += (double)j->n_cached;
        cached |= j->n_cached > 0;
        range_add(&seen_prompt, j->n_prompt);
        range_add(&seen_cached, j->n_cached);
        range_add(&seen_gen, j->n_generated);
        n_short += j->n_generated < o->gen_tokens;
        if (j->n_prompt != o->prompt_tokens)
            sil_client_warn(PROG, "the daemon counted %" PRId64 " prompt tokens of the %ld sent",
                            j->n_prompt, o->prompt_tokens);
    }
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "prompt=%ld,gen=%ld,concurrency=%d,prefix=%s", o->prompt_tokens,
             o->gen_tokens, C, cached ? "cached" : "cold");
    if (C == 1) {
        const struct job *j = &jobs[0];
        record("prefill_tok_s", "tok/s", cfg, j->prefill_tok_s);
        record("ttft_ms", "ms", cfg, (j->t_first > 0 ? j->t_first : j->t_end) * 1e3 - j->t_send * 1e3);
        record("daemon_ttft_ms", "ms", cfg, j->daemon_ttft_ms);
    }
    double tput = (double)total / (t1 - t0);
    /* One value per run (the mean over its requests), so "runs" counts runs. */
    record("decode_tok_s", "tok/s", cfg, decode_sum / C);
    record("aggregate_tok_s", "tok/s", cfg, tput);
    record("prompt_tokens", "tokens", cfg, prompt_sum / C);
    record("cached_tokens", "tokens", cfg, cached_sum / C);
    record("generated_tokens", "tokens", cfg, (double)total / C);
    printf("concurrency %d run %ld (%s): %" PRId64 " tokens in %.2f s = %.1f tok/s aggregate"
           " (per request decode %.1f tok/s, prefill %.1f tok/s; prompt %" PRId64 " tokens, %" PRId64
           " cached, %" PRId64 " generated)\n",
           C, run + 1, cached ? "cached" : "cold", total, t1 - t0, tput, jobs[0].decode_tok_s,
           jobs[0].prefill_tok_s, jobs[0].n_prompt, jobs[0].n_cached, jobs[0].n_generated);
    fflush(stdout);
    *agg_tok_s = tput;
    *decode_tok_s = decode_sum / C;
}

/* A fresh prompt into each job's ids; the error printed. */
static int fresh_prompts(struct sil_rpc_client *tc, const struct opts *o, uint64_t *rng,
                         int32_t *ids, int C)
{
    struct sil_rpc_error e = {0};
    for (int i = 0; i < C; i++) {
        if (make_prompt(tc, o->prompt_tokens, rng, ids + (size_t)o->prompt_tokens * (size_t)i, &e) < 0) {
            sil_client_warn(PROG, "%s", e.msg);
            return -EIO;
        }
    }
    return 0;
}

static int bench_generation(const struct opts *o)
{
    struct sil_rpc_client tc; /* for tokenize */
    struct sil_rpc_error e = {0};
    if (sil_client_connect(&tc, o->socket, (int)(o->timeout_s * 1000), &e) < 0) {
        sil_client_warn(PROG, "%s", e.msg);
        return -EIO;
    }
    int max_c = 1;
    for (int li = 0; li < o->n_levels; li++)
        max_c = o->levels[li] > max_c ? (int)o->levels[li] : max_c;
    const size_t n = (size_t)o->prompt_tokens;
    int32_t *ids = malloc(sizeof(int32_t) * n * (size_t)max_c);
    struct job *jobs = calloc((size_t)max_c, sizeof(*jobs));
    uint64_t rng = rand_seed();
    int rc = ids && jobs ? 0 : -ENOMEM;
    if (rc < 0)
        sil_client_warn(PROG, "out of memory");
    else if (o->reuse_prompt)
        rc = fresh_prompts(&tc, o, &rng, ids, 1);
    for (int li = 0; rc == 0 && li < o->n_levels; li++) {
        int C = (int)o->levels[li];
        struct series agg = {0}, dec = {0};
        for (long run = 0; rc == 0 && run < o->runs; run++) {
            memset(jobs, 0, sizeof(*jobs) * (size_t)C);
            for (int i = 0; i < C; i++)
                jobs[i].ids = o->reuse_prompt ? ids : ids + n * (size_t)i;
            if (!o->reuse_prompt)
                rc = fresh_prompts(&tc, o, &rng, ids, C);
            if (rc == 0)
                rc = run_level(o, C, jobs);
            if (rc == 0)
                record_run(o, C, run, jobs, &agg.v[agg.n++], &dec.v[dec.n++]);
        }
        if (rc < 0)
            break;
        double mn, mx;
        plot_x[n_plot] = C;
        plot_decode[n_plot] = median(&dec, &mn, &mx);
        plot_agg[n_plot++] = median(&agg, &mn, &mx);
    }
    if (rc == 0 && n_short > 0)
        printf("note: the model ended %d request%s before %ld tokens; generated_tokens gives the "
               "lengths measured\n", n_short, n_short == 1 ? "" : "s", o->gen_tokens);
    free(jobs);
    free(ids);
    sil_rpc_client_close(&tc);
    return rc;
}

struct counter {
    long n;
};

static int count_token(void *ud, const struct sil_rpc_msg *m)
{
    struct counter *k = ud;
    if (m && m->type == SIL_RPC_NOTIFICATION)
        k->n++;
    return 0;
}

static int bench_overhead(const struct opts *o)
{
    struct sil_rpc_client c;
    struct sil_rpc_error e = {0};
    if (sil_client_connect(&c, o->socket, (int)(o->timeout_s * 1000), &e) < 0) {
        sil_client_warn(PROG, "%s", e.msg);
        return -EIO;
    }
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "debug.stream,count=%ld,text_bytes=%zu", o->count, strlen(o->text));
    for (long run = 0; run < o->runs; run++) {
        msgpack_packer *pk = sil_rpc_client_begin(&c, "debug.stream");
        msgpack_pack_map(pk, 2);
        sil_rpc_kv_int(pk, "count", o->count);
        sil_rpc_kv_str(pk, "text", o->text);
        struct counter k = {0};
        const msgpack_object *res = NULL;
        double t0 = sil_client_now();
        int r = sil_rpc_client_call(&c, count_token, &k, &res, &e);
        double dt = sil_client_now() - t0;
        if (r < 0) {
            sil_client_warn(PROG, "debug.stream: %s", e.msg);
            sil_rpc_client_close(&c);
            return -EIO;
        }
        int64_t sent = sil_rpc_map_int(res, "n_sent", -1);
        if (sent != o->count || k.n != o->count) {
            sil_client_warn(PROG, "debug.stream: asked %ld, daemon sent %" PRId64 ", received %ld", o->count, sent, k.n);
            sil_rpc_client_close(&c);
            return -EIO;
        }
        double us = dt * 1e6 / (double)o->count;
        record("us_per_token", "us", cfg, us);
        printf("protocol overhead run %ld: %ld notifications in %.3f s = %.2f us per token\n", run + 1, o->count, dt, us);
        fflush(stdout);
    }
    sil_rpc_client_close(&c);
    return 0;
}

/* ---- output ----------------------------------------------------------------------------------- */

static void read_cpu(char *buf, size_t size)
{
    snprintf(buf, size, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            if (p) {
                p += 1 + (p[1] == ' ');
                p[strcspn(p, "\n")] = 0;
                snprintf(buf, size, "%s", p);
            }
            break;
        }
    }
    fclose(f);
}

static void read_commit(char *buf, size_t size)
{
    snprintf(buf, size, "unknown");
    FILE *p = popen("git rev-parse --short HEAD 2>/dev/null", "r");
    if (!p)
        return;
    if (fgets(buf, (int)size, p))
        buf[strcspn(buf, "\n")] = 0;
    else
        snprintf(buf, size, "unknown");
    pclose(p);
}

static int write_json(const struct opts *o, int argc, char **argv, const msgpack_object *status)
{
    FILE *f = fopen(o->out, "w");
    if (!f) {
        sil_client_warn(PROG, "%s: %s", o->out, strerror(errno));
        return -errno;
    }
    char date[32], cpu[256], commit[64];
    time_t now = time(NULL);
    strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    read_cpu(cpu, sizeof(cpu));
    read_commit(commit, sizeof(commit));
    char cmd[2048] = "";
    for (int i = 0; i < argc; i++) {
        size_t n = strlen(cmd);
        snprintf(cmd + n, sizeof(cmd) - n, "%s%s", i ? " " : "", argv[i]);
    }
    fprintf(f, "{\n  \"benchmark\": ");
    sil_rpc_print_json_str(f, o->name ? o->name : o->overhead ? "proto" : "serve");
    fprintf(f, ",\n  \"date\": \"%s\",\n  \"commit\": ", date);
    sil_rpc_print_json_str(f, commit);
    fprintf(f, ",\n  \"command\": ");
    sil_rpc_print_json_str(f, cmd);
    fprintf(f, ",\n  \"machine\": {\"cpu\": ");
    sil_rpc_print_json_str(f, cpu);
    fprintf(f, ", \"cores\": %ld, \"ram_gib\": %.1f", sysconf(_SC_NPROCESSORS_ONLN),
            (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / (1u << 30));
    char dev[128];
    if (sil_rpc_map_str(status, "device", dev, sizeof(dev), NULL)) {
        fprintf(f, ", \"gpu\": ");
        sil_rpc_print_json_str(f, dev);
    }
    fprintf(f, "},\n  \"model\": ");
    const msgpack_object *model = sil_rpc_map_get(status, "model");
    if (model)
        sil_rpc_print_json(f, model, -1);
    else
        fprintf(f, "null");
    fprintf(f, ",\n  \"results\": [");
    for (int i = 0; i < n_results; i++) {
        struct result *r = &results[i];
        double mn, mx, med = median(&r->s, &mn, &mx);
        fprintf(f, "%s\n    {\"metric\": \"%s\", \"config\": ", i ? "," : "", r->metric);
        sil_rpc_print_json_str(f, r->config);
        fprintf(f, ", \"value\": %.6g, \"unit\": \"%s\", \"runs\": %d, \"min\": %.6g, \"max\": %.6g}",
                med, r->unit, r->s.n, mn, mx);
    }
    fprintf(f, "\n  ],\n  \"notes\": ");
    sil_rpc_print_json_str(f, o->notes ? o->notes
                            : "measured by sil-bench from the client side; tok/s and ttft per "
                              "request come from the daemon's timings, aggregate_tok_s and ttft_ms "
                              "from the client's clock; prefix=cold: no prompt token came from the "
                              "prefix cache, prefix=cached: cached_tokens did; prompt, cached and "
                              "generated tokens as the daemon counted them; no peer or floor "
                              "measured here");
    fprintf(f, "\n}\n");
    int bad = ferror(f);
    if (fclose(f) != 0 || bad) {
        sil_client_warn(PROG, "%s: write failed", o->out);
        return -EIO;
    }
    printf("results written to %s\n", o->out);
    return 0;
}

/* gnuplot's single-quoted string: a quote is doubled, nothing else is special. */
static void gp_str(FILE *g, const char *s)
{
    fputc('\'', g);
    for (; *s; s++) {
        if (*s == '\'')
            fputc('\'', g);
        if (*s != '\n')
            fputc(*s, g);
    }
    fputc('\'', g);
}

static int write_plot(const struct opts *o, const char *gnuplot, const char *model)
{
    char cmd[4200];
    snprintf(cmd, sizeof(cmd), "'%s' 2>&1", gnuplot);
    FILE *g = popen(cmd, "w");
    if (!g) {
        sil_client_warn(PROG, "--plot: cannot run %s: %s", gnuplot, strerror(errno));
        return -ENOENT;
    }
    /* The lengths as measured, not as asked: a model may end an answer early. */
    char title[1024], np[48], nc[48], ng[48];
    snprintf(title, sizeof(title),
             "siliceod throughput against concurrency (median of %ld runs, %s)\n"
             "model %s, prompt %s tokens (%s cached), %s generated per request",
             o->runs, o->reuse_prompt ? "one prompt for all" : "a fresh prompt per request", model,
             range_str(&seen_prompt, np, sizeof np), range_str(&seen_cached, nc, sizeof nc),
             range_str(&seen_gen, ng, sizeof ng));
    fprintf(g, "set terminal png size 900,560\nset output ");
    gp_str(g, o->plot);
    fprintf(g, "\nset title ");
    /* gnuplot breaks a title at "\n" only inside double quotes; two lines by hand instead. */
    char *nl = strchr(title, '\n');
    *nl = 0;
    fprintf(g, "sprintf(\"%%s\\n%%s\", ");
    gp_str(g, title);
    fprintf(g, ", ");
    gp_str(g, nl + 1);
    fprintf(g, ")\nset xlabel 'concurrent requests'\nset ylabel 'generated tokens per second'\n"
               "set yrange [0:*]\nset grid\nset logscale x 2\nset key below\n");
    fprintf(g, "plot '-' using 1:2 with linespoints lw 2 pt 7 title "
               "'aggregate: tokens of all requests / wall time, prefill included', "
               "'-' using 1:2 with linespoints lw 2 pt 5 title "
               "'decode, per request (daemon timings)'\n");
    for (int i = 0; i < n_plot; i++)
        fprintf(g, "%g %g\n", plot_x[i], plot_agg[i]);
    fprintf(g, "e\n");
    for (int i = 0; i < n_plot; i++)
        fprintf(g, "%g %g\n", plot_x[i], plot_decode[i]);
    fprintf(g, "e\n");
    int rc = pclose(g);
    if (rc != 0) {
        sil_client_warn(PROG, "--plot: gnuplot failed (status %d)", rc);
        return -EIO;
    }
    printf("plot written to %s\n", o->plot);
    return 0;
}

/* The first executable name in $PATH, or -ENOENT. */
static int find_program(const char *name, char *out, size_t size)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        int k = snprintf(out, size, "%.*s/%s", (int)n, n ? path : ".", name);
        if (k > 0 && (size_t)k < size && access(out, X_OK) == 0)
            return 0;
        path += n + (path[n] == ':');
    }
    return -ENOENT;
}

/* Can the file be written? Tried for real (access() says yes to root on a read-only mount), and
 * before the runs, so a benchmark of minutes does not end in "cannot write". A file that was
 * not there is removed again; one that was is left untouched. */
static int check_writable(const char *opt, const char *file)
{
    int fd = open(file, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
        close(fd);
        unlink(file);
        return 0;
    }
    if (errno == EEXIST)
        fd = open(file, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    int r = -errno;
    sil_client_warn(PROG, "%s %s: cannot write it: %s", opt, file, strerror(-r));
    return r;
}

/* Refuses before the first request a run the daemon's context cannot hold: the prompt and every
 * token asked for. */
static int check_context(const struct opts *o, const msgpack_object *status)
{
    const int64_t n_ctx = sil_rpc_map_int(sil_rpc_map_get(status, "model"), "n_ctx", 0);
    if (n_ctx > 0 && o->prompt_tokens + o->gen_tokens > n_ctx) {
        sil_client_warn(PROG, "a prompt of %ld tokens plus %ld generated needs %ld positions; the "
                              "daemon's context is %" PRId64, o->prompt_tokens, o->gen_tokens,
                        o->prompt_tokens + o->gen_tokens, n_ctx);
        return -ERANGE;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {.prompt_tokens = 512, .gen_tokens = 128, .runs = 3, .count = 100000,
                     .text = "x", .timeout_s = 600, .levels = {1}, .n_levels = 1};
    if (parse_args(argc, argv, &o) < 0)
        return SIL_EXIT_USAGE;
    char gnuplot[4096] = "";
    if (o.plot && find_program("gnuplot", gnuplot, sizeof(gnuplot)) < 0) {
        sil_client_warn(PROG, "--plot needs gnuplot, which is not in PATH (Debian: apt install "
                              "gnuplot-nox)");
        return SIL_EXIT_ERROR;
    }
    if ((o.plot && check_writable("--plot", o.plot) < 0) ||
        (o.out && check_writable("--out", o.out) < 0))
        return SIL_EXIT_ERROR;

    struct sil_rpc_client c;
    struct sil_rpc_error e = {0};
    if (sil_client_connect(&c, o.socket, (int)(o.timeout_s * 1000), &e) < 0) {
        sil_client_warn(PROG, "%s", e.msg);
        return SIL_EXIT_ERROR;
    }
    /* The status is kept across calls by copying it out of the client. */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_unpacked status;
    msgpack_unpacked_init(&status);
    const msgpack_object *st = NULL;
    if (sil_rpc_client_call0(&c, "status", NULL, NULL, &st, &e) == 0) {
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        msgpack_pack_object(&pk, *st);
        size_t off = 0;
        msgpack_unpack_next(&status, sb.data, sb.size, &off);
        char name[128], backend[32];
        printf("model %s, backend %s\n",
               sil_rpc_map_str(sil_rpc_map_get(&status.data, "model"), "name", name, sizeof(name), "?"),
               sil_rpc_map_str(&status.data, "backend", backend, sizeof(backend), "?"));
    } else {
        sil_client_warn(PROG, "status: %s", e.msg);
    }
    sil_rpc_client_close(&c);
    const msgpack_object *stp = status.data.type == MSGPACK_OBJECT_MAP ? &status.data : NULL;
    if (!o.overhead && check_context(&o, stp) < 0) {
        msgpack_unpacked_destroy(&status);
        msgpack_sbuffer_destroy(&sb);
        return SIL_EXIT_ERROR;
    }

    int rc = o.overhead ? bench_overhead(&o) : bench_generation(&o);

    const msgpack_object *ec0 = stp ? sil_rpc_map_get(stp, "expert_cache") : NULL;
    if (rc == 0 && !o.overhead && ec0 && ec0->type == MSGPACK_OBJECT_MAP) {
        /* The expert cache is simulated on the CPU (its figures say what a cache of that size
         * would have done): the runs' own figures are the counters after them less before. */
        if (sil_client_connect(&c, o.socket, (int)(o.timeout_s * 1000), &e) == 0) {
            const msgpack_object *st2 = NULL;
            if (sil_rpc_client_call0(&c, "status", NULL, NULL, &st2, &e) == 0) {
                const msgpack_object *ec = sil_rpc_map_get(st2, "expert_cache");
                char mode[32], pol[32], cfg[128];
                sil_rpc_map_str(ec, "mode", mode, sizeof(mode), "?");
                sil_rpc_map_str(ec, "policy", pol, sizeof(pol), "?");
                const int64_t slots = sil_rpc_map_int(ec, "slots", 0);
                snprintf(cfg, sizeof(cfg), "expert_cache,%s,%s,%" PRId64 " slots", mode, pol,
                         slots);
#define DELTA(k) ((double)(sil_rpc_map_int(ec, k, 0) - sil_rpc_map_int(ec0, k, 0)))
                const double hits = DELTA("hits"), look = DELTA("lookups");
                if (look > 0) {
                    record("hit_rate", "ratio", cfg, hits / look);
                    record("bytes_streamed", "bytes", cfg, DELTA("bytes_streamed"));
                    record("evictions", "count", cfg, DELTA("evictions"));
                    printf("expert cache (%s, %s, %" PRId64 " slots): hit rate %.3f over the runs, "
                           "%.0f bytes streamed, %.0f evictions\n",
                           mode, pol, slots, hits / look, DELTA("bytes_streamed"),
                           DELTA("evictions"));
                }
#undef DELTA
                /* per layer: since the daemon started (status keeps no per-layer counters) */
                const msgpack_object *ly = sil_rpc_map_get(ec, "layers");
                if (ly && ly->type == MSGPACK_OBJECT_ARRAY) {
                    for (uint32_t l = 0; l < ly->via.array.size; l++) {
                        const msgpack_object *v = &ly->via.array.ptr[l];
                        if (v->type != MSGPACK_OBJECT_FLOAT64 && v->type != MSGPACK_OBJECT_FLOAT32)
                            continue;
                        char lc[160];
                        snprintf(lc, sizeof(lc), "%s,layer %u since start", cfg, l);
                        record("hit_rate", "ratio", lc, v->via.f64);
                    }
                }
            }
            sil_rpc_client_close(&c);
        }
    }
    /* The routed experts' host tier, while experts are read from the file (the tier is chosen at
     * load, so one that is off before the runs stays off): its counters over the runs. */
    const msgpack_object *ht0 = stp ? sil_rpc_map_get(stp, "host_tier") : NULL;
    if (rc == 0 && !o.overhead && ht0 && ht0->type == MSGPACK_OBJECT_MAP &&
        sil_rpc_map_bool(ht0, "on", false) &&
        sil_client_connect(&c, o.socket, (int)(o.timeout_s * 1000), &e) == 0) {
        const msgpack_object *st2 = NULL;
        if (sil_rpc_client_call0(&c, "status", NULL, NULL, &st2, &e) == 0) {
            const msgpack_object *ht = sil_rpc_map_get(st2, "host_tier");
#define DELTA(k) (sil_rpc_map_int(ht, k, 0) - sil_rpc_map_int(ht0, k, 0))
            printf("expert host tier: %" PRId64 " hits, %" PRId64 " misses, %" PRId64
                   " bytes read from the file over the runs\n",
                   DELTA("hits"), DELTA("misses"), DELTA("bytes_read"));
#undef DELTA
        }
        sil_rpc_client_close(&c);
    }
    /* Speculative decoding, while the daemon has a draft model: its counters over the runs
     * (status keeps totals; the verify and draft times are averages a step, so their totals are
     * average x steps). */
    const msgpack_object *sp0 = stp ? sil_rpc_map_get(stp, "speculative") : NULL;
    if (rc == 0 && !o.overhead && sp0 && sp0->type == MSGPACK_OBJECT_MAP &&
        sil_client_connect(&c, o.socket, (int)(o.timeout_s * 1000), &e) == 0) {
        const msgpack_object *st2 = NULL;
        if (sil_rpc_client_call0(&c, "status", NULL, NULL, &st2, &e) == 0) {
            const msgpack_object *sp = sil_rpc_map_get(st2, "speculative");
#define DELTA(k) ((double)(sil_rpc_map_int(sp, k, 0) - sil_rpc_map_int(sp0, k, 0)))
#define TOTAL(m, k) (sil_rpc_map_double(m, k, 0) * (double)sil_rpc_map_int(m, "steps", 0))
            const double steps = DELTA("steps"), drafted = DELTA("drafted"),
                         accepted = DELTA("accepted"), emitted = DELTA("emitted");
            char tree[32], cfg[96];
            sil_rpc_map_str(sp, "tree", tree, sizeof(tree), "?");
            snprintf(cfg, sizeof(cfg), "spec,draft,%s", tree);
            const double t_one = sil_rpc_map_double(sp, "one_token_step_ms", 0);
            if (steps > 0) {
                const double verify_ms =
                    (TOTAL(sp, "verify_step_ms") - TOTAL(sp0, "verify_step_ms")) / steps;
                record("spec_acceptance", "ratio", cfg, drafted > 0 ? accepted / drafted : 0);
                record("spec_accepted_per_step", "tokens", cfg, accepted / steps);
                record("spec_tokens_per_step", "tokens", cfg, emitted / steps);
                record("spec_verify_step", "ms", cfg, verify_ms);
                if (t_one > 0) record("spec_verify_vs_one", "ratio", cfg, verify_ms / t_one);
                printf("speculative decoding (%s): %.0f steps, %.0f of %.0f drafts accepted "
                       "(%.1f%%), %.2f accepted and %.2f tokens a step, verify step %.3f ms "
                       "against %.3f ms for one token\n",
                       tree, steps, accepted, drafted, drafted > 0 ? 100 * accepted / drafted : 0,
                       accepted / steps, emitted / steps, verify_ms, t_one);
            } else {
                printf("speculative decoding (%s): no speculative step over the runs\n", tree);
            }
#undef TOTAL
#undef DELTA
        }
        sil_rpc_client_close(&c);
    }
    if (rc == 0) {
        for (int i = 0; i < n_results; i++) {
            double mn, mx, med = median(&results[i].s, &mn, &mx);
            printf("%-16s %-44s median %10.2f %-5s (min %.2f, max %.2f, %d runs)\n", results[i].metric,
                   results[i].config, med, results[i].unit, mn, mx, results[i].s.n);
        }
        if (o.out && write_json(&o, argc, argv, stp) < 0)
            rc = -EIO;
        char model[128];
        sil_rpc_map_str(sil_rpc_map_get(stp, "model"), "name", model, sizeof(model), "?");
        if (o.plot && write_plot(&o, gnuplot, model) < 0)
            rc = -EIO;
    }
    msgpack_unpacked_destroy(&status);
    msgpack_sbuffer_destroy(&sb);
    return rc == 0 ? SIL_EXIT_OK : SIL_EXIT_ERROR;
}
