/* Sampler: greedy, penalties and logit bias exactly; temperature, top-k, top-p, min-p by
 * frequencies over many seeded draws (tolerance 5 standard errors); seeds reproduce and differ. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine/sampler.h"

static struct sil_sampler_params plain(float temperature, uint64_t seed)
{
    struct sil_sampler_params p;
    sil_sampler_params_default(&p);
    p.temperature = temperature;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.0f;
    p.seed = seed;
    return p;
}

static int32_t sample1(const struct sil_sampler_params *p, const float *logits, int32_t n,
                       const int32_t *hist, size_t nh)
{
    struct sil_sampler *s = sil_sampler_new(p, n);
    assert_non_null(s);
    int32_t t = sil_sampler_sample(s, logits, hist, nh);
    sil_sampler_free(s);
    return t;
}

/* Draws n_draws tokens and checks the frequencies against expect[n] (probabilities). A token
 * with expected probability 0 must never be drawn. */
static void check_freq(const struct sil_sampler_params *p, const float *logits, int32_t n,
                       const double *expect, int n_draws)
{
    struct sil_sampler *s = sil_sampler_new(p, n);
    assert_non_null(s);
    long *count = calloc((size_t)n, sizeof *count);
    assert_non_null(count);
    for (int i = 0; i < n_draws; i++) {
        int32_t t = sil_sampler_sample(s, logits, NULL, 0);
        assert_true(t >= 0 && t < n);
        count[t]++;
    }
    for (int32_t i = 0; i < n; i++) {
        double f = (double)count[i] / n_draws;
        if (expect[i] == 0.0) {
            if (count[i] != 0)
                fail_msg("token %d drawn %ld times, expected never", i, count[i]);
            continue;
        }
        double se = sqrt(expect[i] * (1 - expect[i]) / n_draws);
        if (fabs(f - expect[i]) > 5 * se + 3.0 / n_draws)
            fail_msg("token %d: frequency %.5f, expected %.5f (5 se = %.5f)", i, f, expect[i], 5 * se);
    }
    free(count);
    sil_sampler_free(s);
}

/* softmax(logits / t) over the ids with keep[i] set. */
static void softmax_kept(const float *l, const int *keep, int n, double t, double *out)
{
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < n; i++)
        if (keep[i] && l[i] > mx)
            mx = l[i];
    for (int i = 0; i < n; i++) {
        out[i] = keep[i] ? exp((l[i] - mx) / t) : 0.0;
        z += out[i];
    }
    for (int i = 0; i < n; i++)
        out[i] /= z;
}

static void test_defaults(void **unused)
{
    (void)unused;
    struct sil_sampler_params p;
    memset(&p, 0xff, sizeof p);
    sil_sampler_params_default(&p);
    assert_float_equal(p.temperature, 0.8f, 0);
    assert_int_equal(p.top_k, 40);
    assert_float_equal(p.top_p, 0.95f, 0);
    assert_float_equal(p.min_p, 0.05f, 0);
    assert_float_equal(p.repeat_penalty, 1.0f, 0);
    assert_int_equal(p.repeat_last_n, 64);
    assert_float_equal(p.presence_penalty, 0.0f, 0);
    assert_int_equal(p.seed, 0);
    assert_null(p.logit_bias);
    assert_int_equal(p.n_logit_bias, 0);
    assert_null(sil_sampler_new(&p, 0));
    sil_sampler_free(NULL);
}

static void test_argmax(void **unused)
{
    (void)unused;
    const float a[] = { 1, 3, 3, NAN, 2 };
    assert_int_equal(sil_argmax(a, 5), 1);
    const float b[] = { NAN, -INFINITY, -5, NAN };
    assert_int_equal(sil_argmax(b, 4), 2);
    const float c[] = { NAN, NAN };
    assert_int_equal(sil_argmax(c, 2), 0);
    assert_int_equal(sil_argmax(a, 0), -1);
    /* against the one-pass scan on every length around the vector width, the largest value
     * anywhere (head, body, tail), with NaN, ties and infinities */
    float x[67];
    for (int n = 1; n <= 67; n++)
        for (int at = 0; at < n; at++) {
            for (int i = 0; i < n; i++)
                x[i] = (float)((i * 7) % 5) - 10.0f;
            x[at] = 4.0f;
            if (n > 3) x[(at + 3) % n] = NAN;
            if (n > 5 && (at + 5) % n > at) x[(at + 5) % n] = 4.0f; /* a later tie */
            int32_t want = -1;
            float bv = -INFINITY;
            for (int i = 0; i < n; i++)
                if (x[i] > bv) {
                    bv = x[i];
                    want = i;
                }
            assert_int_equal(sil_argmax(x, n), want < 0 ? 0 : want);
        }
    float inf[20];
    for (int i = 0; i < 20; i++)
        inf[i] = -INFINITY;
    assert_int_equal(sil_argmax(inf, 20), 0);
    inf[13] = INFINITY;
    inf[17] = INFINITY;
    assert_int_equal(sil_argmax(inf, 20), 13);
}

static void test_plain_greedy(void **unused)
{
    (void)unused;
    struct sil_sampler_params p;
    sil_sampler_params_default(&p);
    struct sil_sampler *s = sil_sampler_new(&p, 8);
    assert_false(sil_sampler_plain_greedy(s)); /* temperature 0.8 */
    sil_sampler_free(s);
    p.temperature = 0.0f;
    s = sil_sampler_new(&p, 8);
    assert_true(sil_sampler_plain_greedy(s));
    sil_sampler_free(s);
    p.repeat_penalty = 1.3f;
    s = sil_sampler_new(&p, 8);
    assert_false(sil_sampler_plain_greedy(s));
    sil_sampler_free(s);
    p.repeat_last_n = 0; /* a penalty over no history changes nothing */
    s = sil_sampler_new(&p, 8);
    assert_true(sil_sampler_plain_greedy(s));
    sil_sampler_free(s);
    p.repeat_penalty = 1.0f;
    p.repeat_last_n = 64;
    p.presence_penalty = 0.5f;
    s = sil_sampler_new(&p, 8);
    assert_false(sil_sampler_plain_greedy(s));
    sil_sampler_free(s);
    p.presence_penalty = 0.0f;
    const struct sil_logit_bias out_of_range[] = {{8, 5.0f}, {-1, 2.0f}, {3, 0.0f}};
    p.logit_bias = out_of_range;
    p.n_logit_bias = 3;
    s = sil_sampler_new(&p, 8);
    assert_true(sil_sampler_plain_greedy(s)); /* ignored ids and a zero bias */
    sil_sampler_free(s);
    const struct sil_logit_bias real[] = {{2, -1.0f}};
    p.logit_bias = real;
    p.n_logit_bias = 1;
    s = sil_sampler_new(&p, 8);
    assert_false(sil_sampler_plain_greedy(s));
    /* where it says 1, sampling is the argmax of the logits as they come */
    p.logit_bias = NULL;
    p.n_logit_bias = 0;
    sil_sampler_free(s);
    s = sil_sampler_new(&p, 8);
    const float lg[8] = {0.5f, NAN, 2.0f, 7.0f, 7.0f, -1.0f, 0.0f, 3.0f};
    const int32_t hist[3] = {3, 3, 4};
    assert_int_equal(sil_sampler_sample(s, lg, hist, 3), sil_argmax(lg, 8));
    sil_sampler_free(s);
}

static void test_greedy_and_penalties(void **unused)
{
    (void)unused;
    const float l[] = { 0.5f, 2.0f, 1.9f, -1.0f };
    struct sil_sampler_params p = plain(0.0f, 1);
    p.top_k = 40; /* filters do not matter for greedy */
    assert_int_equal(sample1(&p, l, 4, NULL, 0), 1);

    const int32_t h1[] = { 1 };
    assert_int_equal(sample1(&p, l, 4, h1, 1), 1); /* penalties off by default */
    p.repeat_penalty = 1.1f;                        /* 2.0 / 1.1 = 1.82 < 1.9 */
    assert_int_equal(sample1(&p, l, 4, h1, 1), 2);

    /* negative logits are multiplied: -1 * 1.1 = -1.1 < -1.05 */
    const float neg[] = { -1.0f, -1.05f, -3.0f };
    const int32_t h0[] = { 0 };
    assert_int_equal(sample1(&p, neg, 3, NULL, 0), 0);
    assert_int_equal(sample1(&p, neg, 3, h0, 1), 1);

    /* window: repeat_last_n = 2 sees only {0, 3} */
    const int32_t h3[] = { 1, 0, 3 };
    p.repeat_last_n = 2;
    assert_int_equal(sample1(&p, l, 4, h3, 3), 1);
    p.repeat_last_n = -1; /* whole history */
    assert_int_equal(sample1(&p, l, 4, h3, 3), 2);
    p.repeat_last_n = 0; /* none */
    assert_int_equal(sample1(&p, l, 4, h3, 3), 1);

    /* a token repeated in the history is penalized once: 2 / 1.2 = 1.67 > 1.5 */
    const float two[] = { 2.0f, 1.5f };
    const int32_t rep[] = { 0, 0, 0, -7, 99 }; /* out-of-range ids are ignored */
    p.repeat_last_n = 64;
    p.repeat_penalty = 1.2f;
    assert_int_equal(sample1(&p, two, 2, rep, 5), 0);
    p.repeat_penalty = 1.4f; /* 2 / 1.4 = 1.43 < 1.5 */
    assert_int_equal(sample1(&p, two, 2, rep, 5), 1);

    /* presence: 2.0 - 0.2 = 1.8 < 1.9 */
    p.repeat_penalty = 1.0f;
    p.presence_penalty = 0.2f;
    assert_int_equal(sample1(&p, l, 4, h1, 1), 2);
    p.presence_penalty = 0.05f;
    assert_int_equal(sample1(&p, l, 4, h1, 1), 1);

    /* penalties also shape the sampled distribution: token 1 (p ~ 1) pushed far down */
    const float sharp[] = { 0.0f, 30.0f, 0.0f };
    struct sil_sampler_params q = plain(1.0f, 5);
    q.presence_penalty = 60.0f;
    assert_int_equal(sample1(&q, sharp, 3, NULL, 0), 1);
    assert_int_not_equal(sample1(&q, sharp, 3, h1, 1), 1);
}

static void test_temperature(void **unused)
{
    (void)unused;
    const float l[] = { 1.0f, 0.5f, 0.0f, -1.0f, -2.0f };
    const int keep[] = { 1, 1, 1, 1, 1 };
    const double temps[] = { 1.0, 0.5, 2.0 };
    for (int i = 0; i < 3; i++) {
        double e[5];
        softmax_kept(l, keep, 5, temps[i], e);
        struct sil_sampler_params p = plain((float)temps[i], 100 + i);
        check_freq(&p, l, 5, e, 40000);
    }
}

static void test_top_k(void **unused)
{
    (void)unused;
    const float l[] = { 0.1f, 1.2f, -0.3f, 0.9f, 1.0f, 0.2f, -2.0f, 0.95f };
    const int keep[] = { 0, 1, 0, 0, 1, 0, 0, 1 }; /* 1.2, 1.0, 0.95 */
    double e[8];
    softmax_kept(l, keep, 8, 1.0, e);
    struct sil_sampler_params p = plain(1.0f, 7);
    p.top_k = 3;
    check_freq(&p, l, 8, e, 40000);
    /* temperature applies after the filter */
    softmax_kept(l, keep, 8, 3.0, e);
    p.temperature = 3.0f;
    check_freq(&p, l, 8, e, 40000);
    /* top_k >= n_vocab is off */
    const int all[] = { 1, 1, 1, 1, 1, 1, 1, 1 };
    softmax_kept(l, all, 8, 1.0, e);
    p.temperature = 1.0f;
    p.top_k = 8;
    check_freq(&p, l, 8, e, 40000);
}

static void test_top_p(void **unused)
{
    (void)unused;
    /* probabilities 0.3, 0.05, 0.5, 0.15 at ids 0..3 */
    const float l[] = { logf(0.3f), logf(0.05f), logf(0.5f), logf(0.15f) };
    struct sil_sampler_params p = plain(1.0f, 9);
    p.top_p = 0.75f; /* 0.5 + 0.3 */
    const int k1[] = { 1, 0, 1, 0 };
    double e[4];
    softmax_kept(l, k1, 4, 1.0, e);
    check_freq(&p, l, 4, e, 40000);
    p.top_p = 0.9f; /* 0.5 + 0.3 + 0.15 */
    const int k2[] = { 1, 0, 1, 1 };
    softmax_kept(l, k2, 4, 1.0, e);
    check_freq(&p, l, 4, e, 40000);
    /* equal logits: ties go to the lower ids, 4 x 0.1 >= 0.35 */
    const float flat[10] = { 0 };
    const int k4[10] = { 1, 1, 1, 1, 0, 0, 0, 0, 0, 0 };
    double e10[10];
    softmax_kept(flat, k4, 10, 1.0, e10);
    p.top_p = 0.35f;
    check_freq(&p, flat, 10, e10, 20000);
    p.top_p = 0.0f; /* only the best */
    const int k3[] = { 0, 0, 1, 0 };
    softmax_kept(l, k3, 4, 1.0, e);
    check_freq(&p, l, 4, e, 2000);
}

static void test_min_p(void **unused)
{
    (void)unused;
    const float l[] = { logf(0.3f), logf(0.05f), logf(0.5f), logf(0.15f) };
    struct sil_sampler_params p = plain(1.0f, 11);
    p.min_p = 0.2f; /* keeps p >= 0.1 */
    const int k1[] = { 1, 0, 1, 1 };
    double e[4];
    softmax_kept(l, k1, 4, 1.0, e);
    check_freq(&p, l, 4, e, 40000);
    p.min_p = 0.7f; /* keeps p >= 0.35 */
    const int k2[] = { 0, 0, 1, 0 };
    softmax_kept(l, k2, 4, 1.0, e);
    check_freq(&p, l, 4, e, 2000);
    p.min_p = 5.0f; /* > 1 keeps the best only, never nothing */
    check_freq(&p, l, 4, e, 2000);
    /* after top-k (candidates sorted): top 3 = 0.5, 0.3, 0.15; min-p 0.4 keeps p >= 0.2 */
    p.top_k = 3;
    p.min_p = 0.4f;
    const int k3[] = { 1, 0, 1, 0 };
    softmax_kept(l, k3, 4, 1.0, e);
    check_freq(&p, l, 4, e, 40000);
}

/* top-p renormalizes over what top-k kept: p = 0.4, 0.3, 0.2, 0.1, top-k 2 -> 0.57, 0.43, so
 * top-p 0.5 keeps only the first (on the full distribution it would keep two). */
static void test_chain_order(void **unused)
{
    (void)unused;
    const float l[] = { logf(0.1f), logf(0.3f), logf(0.4f), logf(0.2f) };
    struct sil_sampler_params p = plain(1.0f, 13);
    p.top_k = 2;
    p.top_p = 0.5f;
    const int k[] = { 0, 0, 1, 0 };
    double e[4];
    softmax_kept(l, k, 4, 1.0, e);
    check_freq(&p, l, 4, e, 4000);
    p.top_k = 0;
    const int k2[] = { 0, 1, 1, 0 };
    softmax_kept(l, k2, 4, 1.0, e);
    check_freq(&p, l, 4, e, 40000);
}

static int cmp_desc(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Large vocab: top-p keeps over a thousand tokens spread over many of the sampler's buckets,
 * with and without a top-k before it; min-p runs on an unsorted candidate list. Expected sets
 * computed here by a full sort. */
static void test_large_vocab(void **unused)
{
    (void)unused;
    enum { N = 6000 };
    float *l = malloc(sizeof(float) * N), *sorted = malloc(sizeof(float) * N);
    int *keep = calloc(N, sizeof(int));
    double *e = malloc(sizeof(double) * N);
    uint64_t x = 12345;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        l[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 4.0);
    }
    memcpy(sorted, l, sizeof(float) * N);
    qsort(sorted, N, sizeof(float), cmp_desc);
    double z = 0;
    for (int i = 0; i < N; i++)
        z += exp(sorted[i] - sorted[0]);
    double cum = 0;
    int cut = 0;
    while (cum < 0.9 * z)
        cum += exp(sorted[cut++] - sorted[0]);
    assert_true(cut > 1024);
    for (int i = 0; i < N; i++)
        keep[i] = l[i] >= sorted[cut - 1];
    softmax_kept(l, keep, N, 1.0, e);
    struct sil_sampler_params p = plain(1.0f, 17);
    p.top_p = 0.9f;
    check_freq(&p, l, N, e, 10000);

    /* top-k 3000 first: top-p renormalizes over those */
    z = 0;
    for (int i = 0; i < 3000; i++)
        z += exp(sorted[i] - sorted[0]);
    cum = 0;
    cut = 0;
    while (cum < 0.9 * z)
        cum += exp(sorted[cut++] - sorted[0]);
    assert_true(cut < 3000);
    for (int i = 0; i < N; i++)
        keep[i] = l[i] >= sorted[cut - 1];
    softmax_kept(l, keep, N, 1.0, e);
    p.top_k = 3000;
    check_freq(&p, l, N, e, 2000);

    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.3f;
    for (int i = 0; i < N; i++)
        keep[i] = l[i] >= sorted[0] + logf(0.3f);
    softmax_kept(l, keep, N, 1.0, e);
    check_freq(&p, l, N, e, 10000);
    free(l);
    free(sorted);
    free(keep);
    free(e);
}

static void draw_seq(uint64_t seed, int32_t *out, int n, uint64_t *seed_used)
{
    enum { V = 1000 };
    static float l[V];
    for (int i = 0; i < V; i++)
        l[i] = (float)(i % 7) * 0.1f;
    struct sil_sampler_params p = plain(1.0f, seed);
    struct sil_sampler *s = sil_sampler_new(&p, V);
    assert_non_null(s);
    if (seed_used)
        *seed_used = sil_sampler_seed(s);
    for (int i = 0; i < n; i++)
        out[i] = sil_sampler_sample(s, l, out, (size_t)i);
    sil_sampler_free(s);
}

static void test_seed(void **unused)
{
    (void)unused;
    int32_t a[64], b[64], c[64];
    uint64_t used;
    draw_seq(42, a, 64, &used);
    assert_int_equal(used, 42);
    draw_seq(42, b, 64, NULL);
    assert_memory_equal(a, b, sizeof a);
    draw_seq(43, c, 64, NULL);
    assert_true(memcmp(a, c, sizeof a) != 0);
    /* seed 0: one is chosen, reported, and reproduces the run */
    draw_seq(0, a, 64, &used);
    assert_true(used != 0);
    draw_seq(used, b, 64, NULL);
    assert_memory_equal(a, b, sizeof a);
}

/* NaN and -inf are never drawn, and the caller's logits are not modified. */
static void test_bad_logits_untouched(void **unused)
{
    (void)unused;
    float l[16], copy[16];
    for (int i = 0; i < 16; i++)
        l[i] = 0.0f;
    l[3] = NAN;
    l[7] = -INFINITY;
    l[11] = NAN;
    memcpy(copy, l, sizeof l);
    const int keep[16] = { 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 0, 1, 1, 1, 1 };
    double e[16];
    for (int i = 0; i < 16; i++)
        e[i] = keep[i] ? 1.0 / 13 : 0.0;
    struct sil_sampler_params p = plain(1.0f, 19);
    check_freq(&p, l, 16, e, 26000);
    p.repeat_penalty = 1.5f;
    p.presence_penalty = 1.0f;
    p.top_k = 10;
    p.min_p = 0.01f;
    struct sil_sampler *s = sil_sampler_new(&p, 16);
    const int32_t hist[] = { 0, 3, 7 };
    for (int i = 0; i < 1000; i++) {
        int32_t t = sil_sampler_sample(s, l, hist, 3);
        assert_true(t != 3 && t != 7 && t != 11);
    }
    sil_sampler_free(s);
    assert_memory_equal(l, copy, sizeof l);
}

/* Odd parameters (NaN, infinities, negatives, huge) never crash, always give an id in range,
 * and never pick a token whose logit is NaN or -inf while finite ones exist. */
static void test_odd_params(void **unused)
{
    (void)unused;
    const float fv[] = { NAN, INFINITY, -INFINITY, -1.0f, 0.0f, 1e-30f, 0.5f, 1.0f, 2.0f, 1e30f };
    const int32_t iv[] = { -5, 0, 1, 3, 64, 1 << 30 };
    enum { V = 50 };
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = (i % 5 == 0) ? NAN : (i % 7 == 0) ? -INFINITY : (float)((i * 37) % 11) - 5.0f;
    int32_t hist[20];
    for (int i = 0; i < 20; i++)
        hist[i] = (i * 13) % (V + 10) - 5; /* some out of range */
    uint64_t x = 7;
    for (int it = 0; it < 3000; it++) {
        struct sil_sampler_params p;
        sil_sampler_params_default(&p);
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        p.temperature = fv[(x >> 10) % 10];
        p.top_p = fv[(x >> 14) % 10];
        p.min_p = fv[(x >> 18) % 10];
        p.repeat_penalty = fv[(x >> 22) % 10];
        p.presence_penalty = fv[(x >> 26) % 10];
        p.top_k = iv[(x >> 30) % 6];
        p.repeat_last_n = iv[(x >> 34) % 6];
        p.seed = x | 1;
        struct sil_sampler *s = sil_sampler_new(&p, V);
        assert_non_null(s);
        int32_t t = sil_sampler_sample(s, l, hist, 20);
        assert_true(t >= 0 && t < V);
        if (isnan(l[t]) || l[t] == -INFINITY)
            fail_msg("iteration %d picked token %d (logit %g): T %g top_p %g min_p %g rp %g pp %g k %d",
                     it, t, (double)l[t], (double)p.temperature, (double)p.top_p, (double)p.min_p,
                     (double)p.repeat_penalty, (double)p.presence_penalty, p.top_k);
        sil_sampler_free(s);
    }
}

/* logit_bias: added before greedy, penalties and filters; +100 forces a token, -100 forbids one,
 * a small bias shifts the distribution by exactly e^bias; bad entries are ignored. */
static void test_logit_bias(void **unused)
{
    (void)unused;
    const float l[] = { 0.5f, 2.0f, 1.9f, -1.0f, 1.0f };
    struct sil_sampler_params p = plain(0.0f, 1);
    assert_int_equal(sample1(&p, l, 5, NULL, 0), 1);
    const struct sil_logit_bias ban1[] = { { 1, -100.0f } };
    p.logit_bias = ban1;
    p.n_logit_bias = 1;
    assert_int_equal(sample1(&p, l, 5, NULL, 0), 2); /* greedy sees the biased logits */
    const struct sil_logit_bias up3[] = { { 3, 3.5f } }; /* -1 + 3.5 = 2.5 > 2.0 */
    p.logit_bias = up3;
    assert_int_equal(sample1(&p, l, 5, NULL, 0), 3);

    /* Sampling at T 1 with top-k 2: +100 on the worst token makes it the only one ever drawn,
     * -100 on the two best leaves {4, 0} to top-k, in ratio e^0.5. */
    p = plain(1.0f, 7);
    p.top_k = 2;
    const struct sil_logit_bias force3[] = { { 3, 100.0f } };
    p.logit_bias = force3;
    p.n_logit_bias = 1;
    const double e_force[] = { 0, 0, 0, 1, 0 };
    check_freq(&p, l, 5, e_force, 2000);
    const struct sil_logit_bias ban12[] = { { 1, -100.0f }, { 2, -100.0f } };
    p.logit_bias = ban12;
    p.n_logit_bias = 2;
    double e_ban[5];
    const int keep[] = { 1, 0, 0, 0, 1 };
    softmax_kept(l, keep, 5, 1.0, e_ban);
    check_freq(&p, l, 5, e_ban, 20000);

    /* A small bias at T 1, no filters: p(i) proportional to e^(l_i + b_i). */
    p = plain(1.0f, 11);
    const struct sil_logit_bias mix[] = { { 0, 1.5f }, { 4, -0.5f } };
    p.logit_bias = mix;
    p.n_logit_bias = 2;
    const float lb[] = { 2.0f, 2.0f, 1.9f, -1.0f, 0.5f };
    double e_mix[5];
    const int all[] = { 1, 1, 1, 1, 1 };
    softmax_kept(lb, all, 5, 1.0, e_mix);
    check_freq(&p, l, 5, e_mix, 20000);

    /* The bias applies before the repetition penalty: (2 + 1) / 2 = 1.5 < 1.8 (token 0); after
     * it, 2 / 2 + 1 = 2 would win. */
    p = plain(0.0f, 1);
    const struct sil_logit_bias up1[] = { { 1, 1.0f } };
    p.logit_bias = up1;
    p.n_logit_bias = 1;
    p.repeat_penalty = 2.0f;
    const float l2[] = { 1.8f, 2.0f, 0.3f };
    const int32_t h1[] = { 1 };
    assert_int_equal(sample1(&p, l2, 3, NULL, 0), 1);
    assert_int_equal(sample1(&p, l2, 3, h1, 1), 0);

    /* Ids out of range and non-finite biases are ignored, not written. */
    p = plain(0.0f, 1);
    const struct sil_logit_bias bad[] = { { -1, 100.0f }, { 5, 100.0f }, { 3, NAN },
                                          { 4, INFINITY } };
    p.logit_bias = bad;
    p.n_logit_bias = 4;
    assert_int_equal(sample1(&p, l, 5, NULL, 0), 1);
    /* The logits the caller passed are not modified. */
    p.logit_bias = force3;
    p.n_logit_bias = 1;
    float copy[5];
    memcpy(copy, l, sizeof copy);
    assert_int_equal(sample1(&p, copy, 5, NULL, 0), 3);
    assert_memory_equal(copy, l, sizeof copy);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_plain_greedy),
        cmocka_unit_test(test_greedy_and_penalties),
        cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_chain_order),
        cmocka_unit_test(test_large_vocab),
        cmocka_unit_test(test_seed),
        cmocka_unit_test(test_bad_logits_untouched),
        cmocka_unit_test(test_odd_params),
        cmocka_unit_test(test_logit_bias),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
