/* Token sampler. The chain, on a private copy of the logits:
 *   0. the logit biases are added (NaN logits become -inf first);
 *   1. penalties over the distinct tokens of the last repeat_last_n history entries
 *      (repeat_last_n < 0: the whole history, 0: none): repetition as in CTRL (a positive logit
 *      is divided by the penalty, a negative one multiplied), presence subtracts a constant;
 *   2. temperature <= 0: argmax, done;
 *   3. top-k, then top-p (smallest prefix whose probability, renormalized over what top-k kept,
 *      reaches top_p), then min-p (drop p < min_p * p_max); all on temperature-1 probabilities;
 *   4. softmax of the survivors at the temperature and one draw from a seeded xoshiro256**.
 * Ties are broken by the lower token id, so the same seed and inputs give the same tokens. */
#include "daemon/engine/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct cand {
    float logit;
    int32_t id;
};

#define SAMPLER_BUCKETS 1024
#define SAMPLER_BUCKET_RANGE 32.0 /* nats: e^-32 ~ 1e-14 of the top token's weight */

struct sil_sampler {
    struct sil_sampler_params p;
    int32_t n_vocab;
    uint64_t seed;
    uint64_t rng[4];
    uint32_t stamp;     /* generation of seen[] marks, so it never needs clearing per sample */
    uint32_t *seen;     /* [n_vocab] */
    struct cand *cand;  /* [n_vocab] */
    double bucket_mass[SAMPLER_BUCKETS]; /* top-p scratch */
};

void sil_sampler_params_default(struct sil_sampler_params *p)
{
    p->temperature = 0.8f;
    p->top_k = 40;
    p->top_p = 0.95f;
    p->min_p = 0.05f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 64;
    p->presence_penalty = 0.0f;
    p->seed = 0;
    p->logit_bias = NULL;
    p->n_logit_bias = 0;
}

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t r = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return r;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4])
{
    return (double)(rng_next(s) >> 11) * 0x1.0p-53;
}

struct sil_sampler *sil_sampler_new(const struct sil_sampler_params *p, int32_t n_vocab)
{
    if (n_vocab <= 0)
        return NULL;
    struct sil_sampler *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    if (p)
        s->p = *p;
    else
        sil_sampler_params_default(&s->p);
    s->n_vocab = n_vocab;
    s->seen = calloc((size_t)n_vocab, sizeof *s->seen);
    s->cand = malloc((size_t)n_vocab * sizeof *s->cand);
    if (!s->seen || !s->cand) {
        sil_sampler_free(s);
        return NULL;
    }
    s->seed = s->p.seed;
    if (s->seed == 0) {
        /* Not for secrecy, just different per run: wall clock and pid through splitmix. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
        x ^= (uint64_t)getpid() << 32;
        s->seed = splitmix64(&x);
        if (s->seed == 0)
            s->seed = 1;
    }
    uint64_t x = s->seed;
    for (int i = 0; i < 4; i++)
        s->rng[i] = splitmix64(&x);
    return s;
}

void sil_sampler_free(struct sil_sampler *s)
{
    if (!s)
        return;
    free(s->seen);
    free(s->cand);
    free(s);
}

uint64_t sil_sampler_seed(const struct sil_sampler *s)
{
    return s->seed;
}

/* A logit bias the chain applies (ids outside the vocabulary and non-finite biases are
 * ignored). */
static int bias_applies(const struct sil_sampler *s, const struct sil_logit_bias *b)
{
    return b->id >= 0 && b->id < s->n_vocab && isfinite(b->bias);
}

/* Which penalties the chain applies (bit 0 repetition, bit 1 presence); 0 when none. */
static int penalties_used(const struct sil_sampler *s)
{
    const float rp = s->p.repeat_penalty, pp = s->p.presence_penalty;
    if (s->p.repeat_last_n == 0) return 0;
    return (rp > 0.0f && rp != 1.0f) | (pp != 0.0f && isfinite(pp)) << 1;
}

int sil_sampler_plain_greedy(const struct sil_sampler *s)
{
    if (s->p.temperature > 0.0f || penalties_used(s)) return 0;
    for (int32_t i = 0; i < s->p.n_logit_bias; i++)
        if (bias_applies(s, &s->p.logit_bias[i]) && s->p.logit_bias[i].bias != 0.0f) return 0;
    return 1;
}

typedef float sil_v4f __attribute__((vector_size(16)));
typedef int32_t sil_v4i __attribute__((vector_size(16)));

/* Two passes: the largest value over 4-wide vectors (no branch, so it runs at memory speed;
 * a 250k-entry vocabulary in a tenth of a millisecond), then the first index holding it. NaN
 * never compares greater; all NaN or -inf gives 0. */
int32_t sil_argmax(const float *x, int32_t n)
{
    if (n <= 0)
        return -1;
    sil_v4f m0 = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, m1 = m0;
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        sil_v4f a, b;
        memcpy(&a, x + i, sizeof a);
        memcpy(&b, x + i + 4, sizeof b);
        const sil_v4i ka = a > m0, kb = b > m1;
        m0 = (sil_v4f)(((sil_v4i)a & ka) | ((sil_v4i)m0 & ~ka));
        m1 = (sil_v4f)(((sil_v4i)b & kb) | ((sil_v4i)m1 & ~kb));
    }
    float bv = -INFINITY;
    for (int j = 0; j < 4; j++) {
        if (m0[j] > bv) bv = m0[j];
        if (m1[j] > bv) bv = m1[j];
    }
    for (; i < n; i++)
        if (x[i] > bv) bv = x[i];
    if (!(bv > -INFINITY))
        return 0;
    for (i = 0; i < n; i++)
        if (x[i] == bv)
            return i;
    return 0;
}

/* a ranks before b: higher logit, then lower id. */
static inline int before(const struct cand *a, const struct cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

static void swap_cand(struct cand *a, struct cand *b)
{
    struct cand t = *a;
    *a = *b;
    *b = t;
}

/* Heap whose root ranks last of its m entries. */
static void sift_down(struct cand *h, int32_t m, int32_t i)
{
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < m && before(&h[w], &h[l]))
            w = l;
        if (r < m && before(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        swap_cand(&h[i], &h[w]);
        i = w;
    }
}

/* Moves the m best of c[0..n) to c[0..m), sorted best first. O(n log m), no worst case. */
static void select_top(struct cand *c, int32_t n, int32_t m)
{
    if (m > n)
        m = n;
    for (int32_t i = m / 2 - 1; i >= 0; i--)
        sift_down(c, m, i);
    for (int32_t i = m; i < n; i++)
        if (before(&c[i], &c[0])) {
            swap_cand(&c[i], &c[0]);
            sift_down(c, m, 0);
        }
    /* Heapsort: the root (worst) goes to the end, leaving best-first order. */
    for (int32_t e = m - 1; e > 0; e--) {
        swap_cand(&c[0], &c[e]);
        sift_down(c, e, 0);
    }
}

/* Bucket of a logit by its distance below the max: SAMPLER_BUCKET_RANGE nats in equal steps,
 * everything further (down to -inf) in the last bucket. */
static inline int bucket_of(float logit, float maxl)
{
    float d = (maxl - logit) * (float)(SAMPLER_BUCKETS / SAMPLER_BUCKET_RANGE);
    return d < (float)(SAMPLER_BUCKETS - 1) ? (int)d : SAMPLER_BUCKETS - 1;
}

static void apply_penalties(struct sil_sampler *s, const int32_t *history, size_t n_history)
{
    const float rp = s->p.repeat_penalty, pp = s->p.presence_penalty;
    const int used = penalties_used(s), use_rp = used & 1, use_pp = used & 2;
    if (!used || !history || n_history == 0)
        return;
    size_t start = 0;
    if (s->p.repeat_last_n > 0 && n_history > (size_t)s->p.repeat_last_n)
        start = n_history - (size_t)s->p.repeat_last_n;
    if (++s->stamp == 0) { /* wrapped: old marks could collide */
        memset(s->seen, 0, (size_t)s->n_vocab * sizeof *s->seen);
        s->stamp = 1;
    }
    for (size_t i = start; i < n_history; i++) {
        int32_t t = history[i];
        if (t < 0 || t >= s->n_vocab || s->seen[t] == s->stamp)
            continue;
        s->seen[t] = s->stamp;
        float *l = &s->cand[t].logit; /* cand[t].id == t before any reordering */
        if (use_rp)
            *l = *l > 0.0f ? *l / rp : *l * rp;
        if (use_pp)
            *l -= pp;
    }
}

/* Top-p without sorting the vocabulary: weights are bucketed by their distance below the max
 * logit, the bucket where the cumulative mass crosses top_p is found, and only that bucket is
 * sorted. Buckets are monotone in the logit, so the result is exactly the smallest prefix of
 * the (logit desc, id asc) order whose mass reaches top_p. Returns the survivor count; the
 * survivors are moved to c[0..). */
static int32_t top_p_cut(struct sil_sampler *s, int32_t n, float maxl, int sorted)
{
    struct cand *c = s->cand;
    const double target = (s->p.top_p > 0.0f ? s->p.top_p : 0.0f);
    double z = 0.0;
    for (int32_t i = 0; i < n; i++)
        z += exp((double)c[i].logit - maxl);
    if (sorted) {
        double cum = 0.0;
        for (int32_t i = 0; i < n; i++) {
            cum += exp((double)c[i].logit - maxl);
            if (cum >= target * z)
                return i + 1;
        }
        return n;
    }
    memset(s->bucket_mass, 0, sizeof s->bucket_mass);
    for (int32_t i = 0; i < n; i++)
        s->bucket_mass[bucket_of(c[i].logit, maxl)] += exp((double)c[i].logit - maxl);
    double cum = 0.0;
    int b = 0;
    for (; b < SAMPLER_BUCKETS - 1; b++) {
        if (cum + s->bucket_mass[b] >= target * z)
            break;
        cum += s->bucket_mass[b];
    }
    /* c[0..a): buckets before b; c[a..a+m): bucket b. */
    int32_t a = 0;
    for (int32_t i = 0; i < n; i++)
        if (bucket_of(c[i].logit, maxl) < b)
            swap_cand(&c[a++], &c[i]);
    int32_t m = 0;
    for (int32_t i = a; i < n; i++)
        if (bucket_of(c[i].logit, maxl) == b)
            swap_cand(&c[a + m++], &c[i]);
    select_top(c + a, m, m);
    for (int32_t i = 0; i < m; i++) {
        cum += exp((double)c[a + i].logit - maxl);
        if (cum >= target * z)
            return a + i + 1;
    }
    return a + m; /* rounding: the bucket sums said the mass is reached within bucket b */
}

/* Steps 0 to 3 of the chain: the survivors in c[0..n), returned, with the largest logit in
 * *maxl; 0 when the pick is the argmax *best (greedy, or no finite logit). */
static int32_t chain(struct sil_sampler *s, const float *logits, const int32_t *history,
                     size_t n_history, float *maxl_out, int32_t *best_out)
{
    const int32_t nv = s->n_vocab;
    struct cand *c = s->cand;
    for (int32_t i = 0; i < nv; i++) {
        c[i].logit = isnan(logits[i]) ? -INFINITY : logits[i];
        c[i].id = i;
    }
    for (int32_t i = 0; i < s->p.n_logit_bias; i++) {
        const struct sil_logit_bias *b = &s->p.logit_bias[i];
        if (bias_applies(s, b))
            c[b->id].logit += b->bias;
    }
    apply_penalties(s, history, n_history);

    float maxl = -INFINITY;
    int32_t best = 0;
    for (int32_t i = 0; i < nv; i++)
        if (c[i].logit > maxl) {
            maxl = c[i].logit;
            best = i;
        }
    *best_out = best;
    *maxl_out = maxl;
    if (!(s->p.temperature > 0.0f) || maxl == -INFINITY || maxl == INFINITY)
        return 0;

    int32_t n = nv;     /* survivors: c[0..n) */
    int sorted = 0;     /* c[0..n) best first */
    if (s->p.top_k > 0 && s->p.top_k < n) {
        select_top(c, n, s->p.top_k);
        n = s->p.top_k;
        sorted = 1;
    }

    if (s->p.top_p < 1.0f) {
        n = top_p_cut(s, n, maxl, sorted);
    }

    if (s->p.min_p > 0.0f) {
        const float thr = s->p.min_p >= 1.0f ? maxl : maxl + logf(s->p.min_p);
        if (sorted) {
            int32_t k = 1;
            while (k < n && c[k].logit >= thr)
                k++;
            n = k;
        } else {
            int32_t k = 0;
            for (int32_t i = 0; i < n; i++)
                if (c[i].logit >= thr)
                    c[k++] = c[i];
            n = k; /* the max itself always passes */
        }
    }

    return n;
}

int32_t sil_sampler_sample(struct sil_sampler *s, const float *logits, const int32_t *history,
                           size_t n_history)
{
    struct cand *c = s->cand;
    float maxl;
    int32_t best;
    const int32_t n = chain(s, logits, history, n_history, &maxl, &best);
    if (n == 0)
        return best;
    const double inv_t = 1.0 / s->p.temperature;
    double z = 0.0;
    for (int32_t i = 0; i < n; i++)
        z += exp(((double)c[i].logit - maxl) * inv_t);
    double u = rng_uniform(s->rng) * z;
    for (int32_t i = 0; i < n; i++) {
        u -= exp(((double)c[i].logit - maxl) * inv_t);
        if (u < 0.0)
            return c[i].id;
    }
    /* Rounding left u a hair above zero: the last survivor with nonzero weight. */
    for (int32_t i = n - 1; i > 0; i--)
        if (c[i].logit > -INFINITY)
            return c[i].id;
    return c[0].id;
}

void sil_sampler_probs(struct sil_sampler *s, const float *logits, const int32_t *history,
                       size_t n_history, float *probs)
{
    struct cand *c = s->cand;
    float maxl;
    int32_t best;
    const int32_t n = chain(s, logits, history, n_history, &maxl, &best);
    memset(probs, 0, (size_t)s->n_vocab * sizeof *probs);
    if (n == 0) {
        probs[best] = 1.0f;
        return;
    }
    const double inv_t = 1.0 / s->p.temperature;
    double z = 0.0;
    for (int32_t i = 0; i < n; i++)
        z += exp(((double)c[i].logit - maxl) * inv_t);
    for (int32_t i = 0; i < n; i++)
        probs[c[i].id] = (float)(exp(((double)c[i].logit - maxl) * inv_t) / z);
}

double sil_sampler_uniform(struct sil_sampler *s)
{
    return rng_uniform(s->rng);
}

int32_t sil_sampler_draw(struct sil_sampler *s, const float *w)
{
    const int32_t nv = s->n_vocab;
    double z = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < nv; i++)
        if (w[i] > 0.0f) {
            z += w[i];
            last = i;
        }
    if (last < 0)
        return -1;
    double u = rng_uniform(s->rng) * z;
    for (int32_t i = 0; i < nv; i++)
        if (w[i] > 0.0f) {
            u -= w[i];
            if (u < 0.0)
                return i;
        }
    return last; /* rounding left u a hair above zero */
}
