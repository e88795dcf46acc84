/* sil-cachesim: replays routing through every expert-cache policy at a list of slot counts and
 * prints the hit rates (cold: the first turn from an empty cache; restart: the turn after it on a
 * fresh cache preloaded from the cold turn's heat map, through the heat-map file; warm: the
 * turns after the cold one, continued), the misses per token and the host cost of a lookup.
 *
 * Routing comes from a trace (--trace FILE, the format in daemon/engine/route_trace.h: recorded
 * by `sil-eval --route-trace FILE` or written by --write-trace) or is synthetic, drawn as
 * sil-mkmodel --skew S shapes its routers: the logit of the expert of popularity rank r is
 * sigma * N(0, 1) + tau * z_e - S * ln(r + 1) on every token, z_e ~ N(0, 1) fixed per (layer,
 * expert) (a random router also reads the mean of the hidden state: popularity even at S = 0),
 * and the top n_used are taken (rank = id: hit rates do not depend on the permutation). The
 * defaults sigma 0.63 (--noise), tau 0.17 (--spread) were fitted to traces of sil-mkmodel models
 * of 40 layers, 256 experts, top-8: per-layer LRU at 27% of the experts, warm, 0.350 / 0.643 /
 * 0.859 synthetic against 0.365 / 0.651 / 0.862 recorded at --skew 0 / 0.3 / 0.46.
 * --reuse P carries each expert over from the previous token with probability P (temporal
 * locality, which real routing has and random-weight models barely do).
 *
 * --find-skew H: the S at which the LRU with per-layer pools at the first --slots size reaches
 * the warm hit rate H (bisection on synthetic routing). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/common/common.h"
#include "daemon/engine/expert_cache.h"
#include "daemon/engine/expert_heat.h"
#include "daemon/engine/route_trace.h"

#define PROG "sil-cachesim"

struct rec {
    uint32_t layer, n_rows;
    int64_t at; /* first id in trace.ids */
};

struct trace {
    int32_t n_layer, n_expert, n_used;
    struct rec *rec;
    int64_t n_rec, cap_rec;
    int32_t *ids;
    int64_t n_ids, cap_ids;
    int64_t n_tokens;
};

struct opts {
    const char *trace, *write_trace, *json, *slots, *policies, *pools, *label;
    bool split;
    int32_t n_layer, n_expert, n_used, turns, prompt, decode, ubatch;
    double skew, noise, spread, reuse, half_life, protect, find_skew;
    int64_t cold, expert_bytes;
    uint64_t seed;
};

static void die_oom(void)
{
    fprintf(stderr, PROG ": out of memory\n");
    exit(SIL_BENCH_EXIT_ERROR);
}

static int32_t *trace_add(struct trace *t, uint32_t layer, uint32_t n_rows)
{
    if (t->n_rec == t->cap_rec) {
        t->cap_rec = t->cap_rec ? 2 * t->cap_rec : 4096;
        t->rec = realloc(t->rec, (size_t)t->cap_rec * sizeof(*t->rec));
        if (!t->rec) die_oom();
    }
    const int64_t n = (int64_t)n_rows * t->n_used;
    while (t->n_ids + n > t->cap_ids) {
        t->cap_ids = t->cap_ids ? 2 * t->cap_ids : 1 << 20;
        t->ids = realloc(t->ids, (size_t)t->cap_ids * sizeof(int32_t));
        if (!t->ids) die_oom();
    }
    t->rec[t->n_rec++] = (struct rec){layer, n_rows, t->n_ids};
    if (layer == 0) t->n_tokens += n_rows;
    int32_t *p = t->ids + t->n_ids;
    t->n_ids += n;
    return p;
}

static void trace_clear(struct trace *t)
{
    t->n_rec = t->n_ids = t->n_tokens = 0;
}

static uint64_t next64(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t x = *s;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static double unif(uint64_t *s)
{
    return ((double)(next64(s) >> 11) + 0.5) / 9007199254740992.0;
}

/* Synthetic routing of one (token, layer): the n_used best of sigma * N(0,1) - S ln(r + 1),
 * each carried over from prev (the previous token's experts at this layer) with probability
 * reuse. out and prev are n_used ids. */
static void route_one(const struct opts *o, const double *bias, uint64_t *rng, const int32_t *prev,
                      int32_t *out, double *logit, uint8_t *taken)
{
    const int32_t X = o->n_expert, K = o->n_used;
    for (int32_t e = 0; e < X; e++) {
        /* Box-Muller, one value per pair of uniforms: simple, fast enough here */
        const double g = sqrt(-2 * log(unif(rng))) * cos(6.283185307179586 * unif(rng));
        logit[e] = o->noise * g + bias[e];
        taken[e] = 0;
    }
    for (int32_t k = 0; k < K; k++) {
        int32_t e = -1;
        if (prev && o->reuse > 0 && unif(rng) < o->reuse) {
            const int32_t c = prev[next64(rng) % (uint64_t)K];
            if (!taken[c]) e = c;
        }
        if (e < 0) {
            for (int32_t x = 0; x < X; x++)
                if (!taken[x] && (e < 0 || logit[x] > logit[e])) e = x;
        }
        taken[e] = 1;
        out[k] = e;
    }
}

static void synthesize(const struct opts *o, double skew, struct trace *t)
{
    const int32_t X = o->n_expert, K = o->n_used, L = o->n_layer;
    double *logit = malloc((size_t)X * sizeof(double));
    uint8_t *taken = malloc((size_t)X);
    int32_t *prev = malloc((size_t)L * K * sizeof(int32_t));
    if (!logit || !taken || !prev) die_oom();
    uint64_t rng = o->seed * 0x2545f4914f6cdd1dull + 1;
    double *lbias = malloc((size_t)L * X * sizeof(double));
    if (!lbias) die_oom();
    for (int32_t l = 0; l < L; l++)
        for (int32_t e = 0; e < X; e++) {
            const double g = sqrt(-2 * log(unif(&rng))) * cos(6.283185307179586 * unif(&rng));
            lbias[l * X + e] = -skew * log((double)e + 1) + o->spread * g;
        }
    bool have_prev = false;
    for (int32_t turn = 0; turn < o->turns; turn++) {
        for (int32_t done = 0; done < o->prompt;) {
            const int32_t n = o->prompt - done < o->ubatch ? o->prompt - done : o->ubatch;
            for (int32_t l = 0; l < L; l++) {
                int32_t *ids = trace_add(t, (uint32_t)l, (uint32_t)n);
                for (int32_t r = 0; r < n; r++) {
                    route_one(o, lbias + l * X, &rng, have_prev ? prev + l * K : NULL, ids + r * K,
                              logit, taken);
                    memcpy(prev + l * K, ids + r * K, (size_t)K * sizeof(int32_t));
                }
            }
            have_prev = true;
            done += n;
        }
        for (int32_t d = 0; d < o->decode; d++) {
            for (int32_t l = 0; l < L; l++) {
                int32_t *ids = trace_add(t, (uint32_t)l, 1);
                route_one(o, lbias + l * X, &rng, have_prev ? prev + l * K : NULL, ids, logit,
                          taken);
                memcpy(prev + l * K, ids, (size_t)K * sizeof(int32_t));
            }
            have_prev = true;
        }
    }
    free(lbias);
    free(logit);
    free(taken);
    free(prev);
}

/* Every ubatch (the records from one of layer 0 to the next) replayed one row at a time, token
 * by token through the layers: the routing a decode of the same tokens would have. */
static void split_rows(struct trace *t)
{
    struct trace s = {.n_layer = t->n_layer, .n_expert = t->n_expert, .n_used = t->n_used};
    const int32_t K = t->n_used;
    for (int64_t g = 0; g < t->n_rec;) {
        int64_t end = g + 1;
        while (end < t->n_rec && t->rec[end].layer != 0)
            end++;
        uint32_t rows = 0;
        for (int64_t r = g; r < end; r++)
            rows = t->rec[r].n_rows > rows ? t->rec[r].n_rows : rows;
        for (uint32_t row = 0; row < rows; row++)
            for (int64_t r = g; r < end; r++)
                if (row < t->rec[r].n_rows)
                    memcpy(trace_add(&s, t->rec[r].layer, 1),
                           t->ids + t->rec[r].at + (int64_t)row * K, (size_t)K * sizeof(int32_t));
        g = end;
    }
    free(t->rec);
    free(t->ids);
    *t = s;
}

static int load_trace(const char *path, struct trace *t)
{
    struct sil_route_trace rt;
    struct sil_error err = {0};
    if (sil_route_trace_open(&rt, path, &err) < 0) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return -1;
    }
    t->n_layer = (int32_t)rt.n_layer;
    t->n_expert = (int32_t)rt.n_expert;
    t->n_used = (int32_t)rt.n_used;
    int32_t *buf = malloc((size_t)SIL_ROUTE_TRACE_MAX_ROWS * rt.n_used * sizeof(int32_t));
    if (!buf) die_oom();
    uint32_t layer, n_rows;
    int rc;
    while ((rc = sil_route_trace_read(&rt, &layer, &n_rows, buf, &err)) == 1)
        memcpy(trace_add(t, layer, n_rows), buf, (size_t)n_rows * rt.n_used * sizeof(int32_t));
    free(buf);
    fclose(rt.f);
    if (rc < 0) {
        fprintf(stderr, PROG ": %s: %s\n", path, err.msg);
        return -1;
    }
    return 0;
}

struct result {
    double cold, warm, all; /* hit rates */
    double miss_per_token;  /* warm */
    double evict_per_token; /* warm */
    double ns_per_lookup;
    int64_t cold_tokens;
    /* the turn after the cold one (as many tokens): on a fresh cache preloaded from the cold
     * turn's heat map, on an empty one, and on the cache kept from the cold turn; -1 static */
    double restart, empty, kept;
};

static double rate(const struct sil_ecache_stats *s)
{
    return s->hits + s->misses ? (double)s->hits / (double)(s->hits + s->misses) : 0;
}

/* The static set: per pool, the experts most used in the cold turn (what a heat map saved
 * after it would hold), so its warm hit rate is measured on tokens it was not chosen from. */
static void preload_hottest(struct sil_ecache *c, const struct trace *t, int64_t cold_tokens)
{
    const int64_t n_key = (int64_t)t->n_layer * t->n_expert;
    double *count = calloc((size_t)n_key, sizeof(double));
    int32_t *order = malloc((size_t)n_key * sizeof(int32_t));
    if (!count || !order) die_oom();
    int64_t tokens = 0;
    for (int64_t r = 0; r < t->n_rec; r++) {
        const struct rec *rc = &t->rec[r];
        if (rc->layer == 0) {
            if (cold_tokens > 0 && tokens >= cold_tokens) break;
            tokens += rc->n_rows;
        }
        for (int64_t i = 0; i < (int64_t)rc->n_rows * t->n_used; i++)
            count[(int64_t)rc->layer * t->n_expert + t->ids[rc->at + i]] += 1;
    }
    for (int64_t k = 0; k < n_key; k++)
        order[k] = (int32_t)k;
    /* selection by repeated passes would be quadratic; a simple sort by count is enough here */
    for (int64_t gap = n_key / 2; gap > 0; gap /= 2)
        for (int64_t i = gap; i < n_key; i++)
            for (int64_t j = i; j >= gap && count[order[j - gap]] < count[order[j]]; j -= gap) {
                const int32_t x = order[j];
                order[j] = order[j - gap];
                order[j - gap] = x;
            }
    /* a full pool refuses the rest: each pool ends up with its own hottest */
    for (int64_t k = 0; k < n_key; k++)
        if (count[order[k]] > 0)
            sil_ecache_preload(c, order[k] / t->n_expert, order[k] % t->n_expert);
    free(count);
    free(order);
}

struct scratch {
    int32_t *uses, *plan, *cnt;
    struct sil_ecache_entry *ent;
    double t_lookup;
    int64_t lookups;
};

/* Replays records from r0 until max_tokens tokens have started (at layer 0) or the trace ends;
 * returns the record it stopped at, *tokens the tokens replayed. */
static int64_t replay(struct sil_ecache *c, const struct trace *t, int64_t r0, int64_t max_tokens,
                      struct scratch *w, int64_t *tokens)
{
    const int32_t X = t->n_expert;
    *tokens = 0;
    int64_t r = r0;
    for (; r < t->n_rec; r++) {
        const struct rec *rc = &t->rec[r];
        if (rc->layer == 0) {
            if (*tokens >= max_tokens) break;
            *tokens += rc->n_rows;
        }
        /* the plan: distinct experts in ascending id with their row counts */
        const int32_t *ids = t->ids + rc->at;
        const int64_t n = (int64_t)rc->n_rows * t->n_used;
        for (int64_t i = 0; i < n; i++)
            w->uses[ids[i]]++;
        int32_t m = 0;
        for (int32_t e = 0; e < X; e++)
            if (w->uses[e]) {
                w->plan[m] = e;
                w->cnt[m++] = w->uses[e];
                w->uses[e] = 0;
            }
        const double t0 = sil_bench_now();
        sil_ecache_lookup(c, (int32_t)rc->layer, w->plan, w->cnt, m, w->ent);
        w->t_lookup += sil_bench_now() - t0;
        w->lookups++;
    }
    return r;
}

/* A restart after the cold turn: its heat map saved to a file and loaded back, a fresh cache
 * preloaded with the hottest experts, then the next cold-turn's worth of tokens replayed. */
static double restart(const struct sil_ecache_config *cfg, const struct trace *t, int64_t r_warm,
                      int64_t n_tokens, const float *heat, bool preload, struct scratch *w)
{
    const char *dir = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
    char path[4096];
    snprintf(path, sizeof(path), "%s/sil-cachesim-%ld.heat", dir, (long)getpid());
    struct sil_heat_map m = {(uint32_t)t->n_layer, (uint32_t)t->n_expert, 1, 0, (float *)heat};
    struct sil_heat_map got;
    struct sil_error err = {0};
    if (sil_heat_map_save(path, &m, &err) < 0 ||
        sil_heat_map_load(path, 1, m.n_layer, m.n_expert, &got, &err) < 0) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        unlink(path);
        return -1;
    }
    unlink(path);
    const int64_t n_key = (int64_t)t->n_layer * t->n_expert;
    int32_t *keys = malloc((size_t)n_key * sizeof(int32_t));
    struct sil_ecache *c = NULL;
    if (!keys || sil_ecache_create(&c, cfg, &err) < 0) die_oom();
    sil_ecache_heat_import(c, got.heat);
    const int64_t n = preload ? sil_heat_map_hottest(&got, keys, n_key) : 0;
    for (int64_t i = 0; i < n; i++)
        sil_ecache_preload(c, keys[i] / t->n_expert, keys[i] % t->n_expert);
    int64_t tokens;
    replay(c, t, r_warm, n_tokens, w, &tokens);
    struct sil_ecache_stats s;
    sil_ecache_stats(c, -1, &s);
    sil_ecache_free(c);
    sil_heat_map_free(&got);
    free(keys);
    return rate(&s);
}

static int simulate(const struct opts *o, const struct trace *t, int policy, int pools,
                    int32_t slots, int64_t cold_tokens, struct result *res)
{
    struct sil_ecache_config cfg = {.n_layer = t->n_layer,
                                    .n_expert = t->n_expert,
                                    .n_slot = slots,
                                    .policy = policy,
                                    .pools = pools,
                                    .half_life = o->half_life,
                                    .protect = o->protect,
                                    .expert_bytes = (uint64_t)o->expert_bytes};
    struct sil_ecache *c = NULL;
    struct sil_error err = {0};
    if (sil_ecache_create(&c, &cfg, &err) < 0) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        return -1;
    }
    if (policy == SIL_ECACHE_STATIC) preload_hottest(c, t, cold_tokens);
    const int32_t X = t->n_expert;
    const int64_t n_key = (int64_t)t->n_layer * X;
    struct scratch w = {calloc((size_t)X, sizeof(int32_t)),
                        malloc((size_t)X * sizeof(int32_t)),
                        malloc((size_t)X * sizeof(int32_t)),
                        malloc((size_t)X * sizeof(struct sil_ecache_entry)),
                        0,
                        0};
    float *heat = malloc((size_t)n_key * sizeof(float));
    if (!w.uses || !w.plan || !w.cnt || !w.ent || !heat) die_oom();
    struct sil_ecache_stats cold, next, all;
    int64_t ct, nt, rest;
    const int64_t r_warm = replay(c, t, 0, cold_tokens, &w, &ct);
    sil_ecache_stats(c, -1, &cold);
    sil_ecache_heat_export(c, heat);
    const int64_t r_next = replay(c, t, r_warm, ct, &w, &nt);
    sil_ecache_stats(c, -1, &next);
    replay(c, t, r_next, INT64_MAX, &w, &rest);
    sil_ecache_stats(c, -1, &all);
    const int64_t wt = nt + rest;
    next.hits -= cold.hits;
    next.misses -= cold.misses;
    struct sil_ecache_stats warm = all;
    warm.hits -= cold.hits;
    warm.misses -= cold.misses;
    warm.evictions -= cold.evictions;
    const double ns = w.lookups ? w.t_lookup * 1e9 / (double)w.lookups : 0;
    const bool fresh = policy != SIL_ECACHE_STATIC && nt > 0;
    const double rst = fresh ? restart(&cfg, t, r_warm, ct, heat, true, &w) : -1;
    const double emp = fresh ? restart(&cfg, t, r_warm, ct, heat, false, &w) : -1;
    *res = (struct result){
        .cold = rate(&cold),
        .warm = rate(&warm),
        .all = rate(&all),
        .miss_per_token = wt ? (double)warm.misses / (double)wt : 0,
        .evict_per_token = wt ? (double)warm.evictions / (double)wt : 0,
        .ns_per_lookup = ns,
        .cold_tokens = ct,
        .restart = rst,
        .empty = emp,
        .kept = fresh ? rate(&next) : -1,
    };
    free(w.uses);
    free(w.plan);
    free(w.cnt);
    free(w.ent);
    free(heat);
    sil_ecache_free(c);
    return 0;
}

/* "27%,512,3k": percent of all experts, a slot count, or a multiple of n_used per layer. */
static int parse_slots(const char *s, const struct trace *t, int32_t *out, int max)
{
    const int64_t n_key = (int64_t)t->n_layer * t->n_expert;
    int n = 0;
    char *dup = strdup(s), *save = NULL;
    if (!dup) die_oom();
    for (char *tok = strtok_r(dup, ",", &save); tok && n < max; tok = strtok_r(NULL, ",", &save)) {
        char *end;
        const double v = strtod(tok, &end);
        double slots;
        if (end == tok || v < 0) {
            free(dup);
            return -1;
        }
        if (strcmp(end, "%") == 0)
            slots = v / 100 * (double)n_key;
        else if (strcmp(end, "k") == 0)
            slots = v * t->n_used * t->n_layer;
        else if (*end == 0)
            slots = v;
        else {
            free(dup);
            return -1;
        }
        if (slots > (double)n_key) slots = (double)n_key;
        out[n++] = (int32_t)llround(slots);
    }
    free(dup);
    return n;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [--trace FILE | synthetic options] [options]\n"
            "  --trace FILE         replay a routing trace (route_trace.h format)\n"
            "  --cold N             with --trace: the first N tokens are the cold turn (default: "
            "a quarter)\n"
            "  --split-rows         replay each row of a multi-row record as its own plan (the "
            "routing of\n"
            "                       a prompt replayed as if decoded token by token)\n"
            "synthetic routing (as sil-mkmodel --skew shapes it):\n"
            "  --layers N --experts N --used K   shape (default 40, 256, 8: Qwen3.5-35B-A3B)\n"
            "  --skew S             Zipf exponent of expert popularity (default 0: uniform)\n"
            "  --noise SIGMA        spread of the per-token router logit (default 0.63)\n"
            "  --spread TAU         spread of a fixed per-expert logit offset (default 0.17)\n"
            "  --reuse P            carry each expert over from the previous token with "
            "probability P\n"
            "  --turns N --prompt N --decode N --ubatch N   turns of a prompt (in ubatches) and "
            "decode\n"
            "                       tokens (default 4, 0, 512, 512); the first turn is the cold "
            "one\n"
            "  --seed N             (default 1)\n"
            "  --write-trace FILE   write the synthetic routing as a trace, then simulate\n"
            "cache:\n"
            "  --slots LIST         sizes: P%% of all experts, N slots, or Mk (M x n_used per "
            "layer)\n"
            "                       (default 10%%,20%%,27%%,40%%,60%%)\n"
            "  --policies LIST      lru,lfu,heat,static (default all)\n"
            "  --pools LIST         per-layer,global (default both)\n"
            "  --half-life N        decayed frequency half-life in tokens (default 64)\n"
            "  --protect F          heat: protected fraction of a pool (default 0.5)\n"
            "  --expert-bytes N     bytes of one expert, for bytes streamed per token\n"
            "output:\n"
            "  --json FILE          also write the results as a bench/results JSON file\n"
            "  --label TEXT         the routing's name in the JSON (e.g. 'skew 1.2')\n"
            "  --find-skew H        print the S at which per-layer LRU at the first --slots size "
            "reaches\n"
            "                       warm hit rate H, then exit\n");
}

enum {
    O_TRACE = 256,
    O_COLD,
    O_LAYERS,
    O_EXPERTS,
    O_USED,
    O_SKEW,
    O_NOISE,
    O_REUSE,
    O_TURNS,
    O_PROMPT,
    O_DECODE,
    O_UBATCH,
    O_SEED,
    O_WRITE,
    O_SLOTS,
    O_POLICIES,
    O_POOLS,
    O_HALF,
    O_PROTECT,
    O_EBYTES,
    O_JSON,
    O_LABEL,
    O_FIND,
    O_HELP,
    O_VERSION,
    O_SPLIT,
    O_SPREAD,
};

static const struct option longopts[] = {
    {"trace", 1, 0, O_TRACE},     {"cold", 1, 0, O_COLD},
    {"layers", 1, 0, O_LAYERS},   {"experts", 1, 0, O_EXPERTS},
    {"used", 1, 0, O_USED},       {"skew", 1, 0, O_SKEW},
    {"noise", 1, 0, O_NOISE},     {"reuse", 1, 0, O_REUSE},
    {"turns", 1, 0, O_TURNS},     {"prompt", 1, 0, O_PROMPT},
    {"decode", 1, 0, O_DECODE},   {"ubatch", 1, 0, O_UBATCH},
    {"seed", 1, 0, O_SEED},       {"write-trace", 1, 0, O_WRITE},
    {"slots", 1, 0, O_SLOTS},     {"policies", 1, 0, O_POLICIES},
    {"pools", 1, 0, O_POOLS},     {"half-life", 1, 0, O_HALF},
    {"protect", 1, 0, O_PROTECT}, {"expert-bytes", 1, 0, O_EBYTES},
    {"json", 1, 0, O_JSON},       {"label", 1, 0, O_LABEL},
    {"find-skew", 1, 0, O_FIND},  {"help", 0, 0, O_HELP},
    {"version", 0, 0, O_VERSION}, {"split-rows", 0, 0, O_SPLIT},
    {"spread", 1, 0, O_SPREAD},   {0, 0, 0, 0},
};

static int parse_args(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.n_layer = 40,
                       .n_expert = 256,
                       .n_used = 8,
                       .turns = 4,
                       .prompt = 0,
                       .decode = 512,
                       .ubatch = 512,
                       .noise = 0.63,
                       .spread = 0.17,
                       .half_life = 64,
                       .protect = 0.5,
                       .cold = -1,
                       .seed = 1,
                       .slots = "10%,20%,27%,40%,60%",
                       .policies = "lru,lfu,heat,static",
                       .pools = "per-layer,global"};
    int c;
    int64_t v;
    while ((c = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
#define I64(field, lo, hi)                                                                         \
    do {                                                                                           \
        if (sil_bench_parse_i64(PROG, argv[optind - 2], optarg, lo, hi, &v) < 0) return -1;        \
        o->field = v;                                                                              \
    } while (0)
#define DBL(field, lo, hi)                                                                         \
    do {                                                                                           \
        if (sil_bench_parse_double(PROG, argv[optind - 2], optarg, lo, hi, &o->field) < 0)         \
            return -1;                                                                             \
    } while (0)
        switch (c) {
        case O_TRACE:
            o->trace = optarg;
            break;
        case O_SPLIT:
            o->split = true;
            break;
        case O_COLD:
            I64(cold, 0, INT64_MAX);
            break;
        case O_LAYERS:
            I64(n_layer, 1, 4096);
            break;
        case O_EXPERTS:
            I64(n_expert, 1, 65535);
            break;
        case O_USED:
            I64(n_used, 1, 256);
            break;
        case O_SKEW:
            DBL(skew, 0, 10);
            break;
        case O_NOISE:
            DBL(noise, 0, 100);
            break;
        case O_SPREAD:
            DBL(spread, 0, 100);
            break;
        case O_REUSE:
            DBL(reuse, 0, 1);
            break;
        case O_TURNS:
            I64(turns, 1, 1000);
            break;
        case O_PROMPT:
            I64(prompt, 0, 1 << 20);
            break;
        case O_DECODE:
            I64(decode, 0, 1 << 20);
            break;
        case O_UBATCH:
            I64(ubatch, 1, SIL_ROUTE_TRACE_MAX_ROWS);
            break;
        case O_SEED:
            I64(seed, 0, INT64_MAX);
            break;
        case O_WRITE:
            o->write_trace = optarg;
            break;
        case O_SLOTS:
            o->slots = optarg;
            break;
        case O_POLICIES:
            o->policies = optarg;
            break;
        case O_POOLS:
            o->pools = optarg;
            break;
        case O_HALF:
            DBL(half_life, 0.01, 1e8);
            break;
        case O_PROTECT:
            DBL(protect, 0.01, 0.99);
            break;
        case O_EBYTES:
            I64(expert_bytes, 0, INT64_MAX);
            break;
        case O_JSON:
            o->json = optarg;
            break;
        case O_LABEL:
            o->label = optarg;
            break;
        case O_FIND:
            DBL(find_skew, 0.001, 0.999);
            break;
        case O_HELP:
            usage(stdout);
            exit(0);
        case O_VERSION:
            sil_bench_version(PROG);
            exit(0);
        default:
            return -1;
        }
#undef I64
#undef DBL
    }
    if (optind < argc) {
        fprintf(stderr, PROG ": unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    if (o->n_used > o->n_expert) {
        fprintf(stderr, PROG ": --used %d is more than --experts %d\n", o->n_used, o->n_expert);
        return -1;
    }
    return 0;
}

static bool listed(const char *list, const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = list; (p = strstr(p, name)); p += n)
        if ((p == list || p[-1] == ',') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}

static double lru_warm(const struct opts *o, double skew, int32_t slots, struct trace *t)
{
    trace_clear(t);
    synthesize(o, skew, t);
    struct result r;
    if (simulate(o, t, SIL_ECACHE_LRU, SIL_ECACHE_PER_LAYER, slots, (int64_t)o->prompt + o->decode,
                 &r) < 0)
        exit(SIL_BENCH_EXIT_ERROR);
    return r.warm;
}

int main(int argc, char **argv)
{
    struct opts o;
    if (parse_args(argc, argv, &o) < 0) {
        usage(stderr);
        return SIL_BENCH_EXIT_USAGE;
    }
    struct trace t = {.n_layer = o.n_layer, .n_expert = o.n_expert, .n_used = o.n_used};
    int64_t cold = o.cold;
    if (o.trace) {
        if (load_trace(o.trace, &t) < 0) return SIL_BENCH_EXIT_ERROR;
        if (o.split) split_rows(&t);
        if (cold < 0) cold = t.n_tokens / 4;
    } else {
        synthesize(&o, o.skew, &t);
        if (cold < 0) cold = (int64_t)o.prompt + o.decode;
    }
    int32_t slots[64];
    const int n_slots = parse_slots(o.slots, &t, slots, 64);
    if (n_slots <= 0) {
        fprintf(stderr, PROG ": --slots: '%s' is not a list of N, P%% or Mk\n", o.slots);
        return SIL_BENCH_EXIT_USAGE;
    }

    if (o.find_skew > 0) {
        double lo = 0, hi = 8;
        if (lru_warm(&o, lo, slots[0], &t) >= o.find_skew ||
            lru_warm(&o, hi, slots[0], &t) < o.find_skew) {
            fprintf(stderr, PROG ": hit rate %.4f is not reached between skew 0 and 8\n",
                    o.find_skew);
            return SIL_BENCH_EXIT_ERROR;
        }
        for (int it = 0; it < 24 && hi - lo > 1e-4; it++) {
            const double mid = (lo + hi) / 2;
            *(lru_warm(&o, mid, slots[0], &t) < o.find_skew ? &lo : &hi) = mid;
        }
        const double s = (lo + hi) / 2;
        printf("skew %.4f: per-layer LRU, %d slots (%.1f%% of %d x %d), warm hit rate %.4f\n", s,
               slots[0], 100.0 * slots[0] / ((double)t.n_layer * t.n_expert), t.n_layer, t.n_expert,
               lru_warm(&o, s, slots[0], &t));
        return 0;
    }

    if (o.write_trace) {
        struct sil_route_trace w;
        struct sil_error err = {0};
        if (sil_route_trace_create(&w, o.write_trace, (uint32_t)t.n_layer, (uint32_t)t.n_expert,
                                   (uint32_t)t.n_used, &err) < 0) {
            fprintf(stderr, PROG ": %s\n", err.msg);
            return SIL_BENCH_EXIT_ERROR;
        }
        for (int64_t r = 0; r < t.n_rec; r++)
            sil_route_trace_write(&w, t.rec[r].layer, t.rec[r].n_rows, t.ids + t.rec[r].at);
        if (sil_route_trace_close(&w, &err) < 0) {
            fprintf(stderr, PROG ": %s: %s\n", o.write_trace, err.msg);
            return SIL_BENCH_EXIT_ERROR;
        }
    }

    char routing[256];
    if (o.trace)
        snprintf(routing, sizeof(routing), "trace %s%s", o.label ? o.label : o.trace,
                 o.split ? ", rows split" : "");
    else
        snprintf(
            routing, sizeof(routing),
            "synthetic skew %g noise %g spread %g reuse %g, %d turns of %d prompt (ubatch %d) + %d "
            "decode tokens",
            o.skew, o.noise, o.spread, o.reuse, o.turns, o.prompt, o.ubatch, o.decode);
    printf("%s\n%d layers x %d experts, top-%d; %lld tokens, the first %lld cold\n", routing,
           t.n_layer, t.n_expert, t.n_used, (long long)t.n_tokens, (long long)cold);
    printf("%-7s %-9s %7s %6s %7s %7s %7s %7s %7s %7s %9s %9s %8s\n", "policy", "pools", "slots",
           "share", "cold", "empty", "restart", "kept", "warm", "all", "miss/tok", "evict/tok",
           "ns/look");

    FILE *js = NULL;
    if (o.json) {
        js = fopen(o.json, "w");
        if (!js) {
            fprintf(stderr, PROG ": %s: %s\n", o.json, strerror(errno));
            return SIL_BENCH_EXIT_ERROR;
        }
        const time_t now = time(NULL);
        char date[32];
        strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        fprintf(js, "{\n  \"benchmark\": \"cachesim\",\n  \"date\": \"%s\",\n", date);
        fprintf(js, "  \"command\": \"" PROG);
        for (int i = 1; i < argc; i++)
            fprintf(js, " %s", argv[i]);
        fprintf(js,
                "\",\n  \"routing\": \"%s\",\n  \"shape\": {\"n_layer\": %d, \"n_expert\": %d, "
                "\"n_expert_used\": %d, \"tokens\": %lld, \"cold_tokens\": %lld},\n"
                "  \"results\": [",
                routing, t.n_layer, t.n_expert, t.n_used, (long long)t.n_tokens, (long long)cold);
    }
    static const char *const pool_names[2] = {"per-layer", "global"};
    bool first = true;
    for (int si = 0; si < n_slots; si++) {
        for (int pools = 0; pools < 2; pools++) {
            if (!listed(o.pools, pool_names[pools])) continue;
            for (int pol = 0; pol < SIL_ECACHE_POLICY_COUNT; pol++) {
                if (!listed(o.policies, sil_ecache_policy_name(pol))) continue;
                struct result r;
                if (simulate(&o, &t, pol, pools, slots[si], cold, &r) < 0)
                    return SIL_BENCH_EXIT_ERROR;
                const double share = 100.0 * slots[si] / ((double)t.n_layer * t.n_expert);
                char nx[3][16];
                const double nv[3] = {r.empty, r.restart, r.kept};
                for (int k = 0; k < 3; k++)
                    snprintf(nx[k], sizeof(nx[k]), nv[k] >= 0 ? "%.4f" : "-", nv[k]);
                printf("%-7s %-9s %7d %5.1f%% %7.4f %7s %7s %7s %7.4f %7.4f %9.2f %9.2f %8.0f\n",
                       sil_ecache_policy_name(pol), pool_names[pools], slots[si], share, r.cold,
                       nx[0], nx[1], nx[2], r.warm, r.all, r.miss_per_token, r.evict_per_token,
                       r.ns_per_lookup);
                if (!js) continue;
                const char *metric[6] = {"cold_hit_rate",          "warm_hit_rate",
                                         "misses_per_token",       "restart_hit_rate",
                                         "restart_empty_hit_rate", "next_turn_kept_hit_rate"};
                const double val[6] = {r.cold,    r.warm,  r.miss_per_token,
                                       r.restart, r.empty, r.kept};
                const char *unit[6] = {"fraction", "fraction", "experts",
                                       "fraction", "fraction", "fraction"};
                for (int m = 0; m < (r.restart >= 0 ? 6 : 3); m++) {
                    fprintf(js,
                            "%s\n    {\"metric\": \"%s\", \"config\": \"policy=%s,pools=%s,"
                            "slots=%d,share=%.1f%%\", \"value\": %.4f, \"unit\": \"%s\", "
                            "\"runs\": 1}",
                            first ? "" : ",", metric[m], sil_ecache_policy_name(pol),
                            pool_names[pools], slots[si], share, val[m], unit[m]);
                    first = false;
                }
                if (o.expert_bytes > 0)
                    fprintf(js,
                            ",\n    {\"metric\": \"streamed_mb_per_token\", \"config\": "
                            "\"policy=%s,pools=%s,slots=%d\", \"value\": %.3f, \"unit\": \"MB\", "
                            "\"runs\": 1}",
                            sil_ecache_policy_name(pol), pool_names[pools], slots[si],
                            r.miss_per_token * (double)o.expert_bytes / 1e6);
            }
        }
    }
    if (js) {
        fprintf(js,
                "\n  ],\n  \"notes\": \"cold: the first %lld tokens from an empty cache; warm: "
                "every token after; on the next turn (as many tokens after the cold one): restart: "
                "a fresh cache preloaded from the cold turn's heat map (saved to a file and "
                "loaded back), restart_empty: a fresh empty cache, next_turn_kept: the cache "
                "kept from the cold turn; "
                "static: the hottest experts of the cold turn preloaded, never changed; lookups "
                "timed on the host\"\n}\n",
                (long long)cold);
        if (fclose(js) != 0) {
            fprintf(stderr, PROG ": %s: write failed\n", o.json);
            return SIL_BENCH_EXIT_ERROR;
        }
    }
    free(t.rec);
    free(t.ids);
    return 0;
}
