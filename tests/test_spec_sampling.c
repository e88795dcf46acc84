/* Speculative sampling (spec.h): the acceptance rule keeps the target's distribution whatever
 * the draft's. On synthetic distributions, a draft token drawn from q and put through
 * sil_spec_accept comes out distributed as p (one token), and a chain of two drafts followed as
 * sil_spec_step_sampled follows it gives the target's joint distribution of two tokens (a Markov
 * chain p(x1) p(x2 | x1)); sil_sampler_probs is the distribution sil_sampler_sample draws from
 * under temperature, top-k, top-p and min-p; greedy settings give the argmax. On a tiny model
 * drafted by another, the first token of a sampled speculative step follows the target's
 * sampling distribution at that position (drafted by the same file in reference mode with KV4,
 * which accepts some drafts), and a model drafting for itself has every draft accepted. The same
 * holds with the model's own MTP layer drafting (a sil-mkmodel --mtp model), from a position where
 * the layer has the target's hidden state to start from.
 *
 * The bound: Pearson's chi-square of the counts against the expected ones, with a fixed seed,
 * below the 0.999 quantile of the chi-square law with (cells - 1) degrees of freedom (cells
 * with fewer than 5 expected counts pooled into one); the total variation distance is printed
 * beside it. A rule that kept q's distribution, or p's without the residual, fails by far. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/sampler.h"
#include "daemon/engine/spec.h"
#include "tests/testutil.h"
#include "tests/testutil_mkmodel.h"

/* The 0.999 quantile of chi-square with k degrees of freedom (Wilson-Hilferty; within 1% for
 * k >= 3). */
static double chi2_crit(int k)
{
    const double z = 3.0902, h = 2.0 / (9.0 * k), c = 1 - h + z * sqrt(h);
    return k * c * c * c;
}

/* Pearson's chi-square of counts[n] against probabilities p[n] over total draws, pooling cells
 * expected under 5; *dof gets the degrees of freedom, *tv the total variation distance. */
static double chi2(const uint64_t *counts, const double *p, int n, uint64_t total, int *dof,
                   double *tv)
{
    double x = 0, pool_e = 0, pool_o = 0, d = 0;
    int cells = 0;
    for (int i = 0; i < n; i++) {
        const double e = p[i] * (double)total;
        d += fabs((double)counts[i] / (double)total - p[i]);
        if (e < 5) {
            pool_e += e;
            pool_o += (double)counts[i];
            assert_true(e > 0 || counts[i] == 0); /* a token p cannot give never comes out */
            continue;
        }
        x += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
        cells++;
    }
    if (pool_e >= 5) {
        x += (pool_o - pool_e) * (pool_o - pool_e) / pool_e;
        cells++;
    }
    *dof = cells - 1;
    *tv = d / 2;
    return x;
}

static void expect_fit(const char *what, const uint64_t *counts, const double *p, int n,
                       uint64_t total)
{
    int dof;
    double tv;
    const double x = chi2(counts, p, n, total, &dof, &tv);
    printf("%s: chi-square %.1f (%d dof, 0.999 quantile %.1f), total variation %.4f, %llu draws\n",
           what, x, dof, chi2_crit(dof), tv, (unsigned long long)total);
    assert_true(dof >= 3);
    assert_true(x < chi2_crit(dof));
}

enum { NV = 8 };

static struct sil_sampler *sampler(float temp, int32_t top_k, float top_p, float min_p,
                                   uint64_t seed, int32_t nv)
{
    struct sil_sampler_params sp;
    sil_sampler_params_default(&sp);
    sp.temperature = temp;
    sp.top_k = top_k;
    sp.top_p = top_p;
    sp.min_p = min_p;
    sp.seed = seed;
    struct sil_sampler *s = sil_sampler_new(&sp, nv);
    assert_non_null(s);
    return s;
}

/* One draft token drawn from q, accepted or replaced: the tokens follow p. q puts mass where p
 * has none (token 7) and little where p has much (token 0). */
static void test_one_token(void **state)
{
    (void)state;
    const float p[NV] = {0.40f, 0.20f, 0.15f, 0.10f, 0.08f, 0.05f, 0.02f, 0.0f};
    const float q[NV] = {0.05f, 0.30f, 0.10f, 0.20f, 0.05f, 0.10f, 0.05f, 0.15f};
    struct sil_sampler *rng = sampler(1, 0, 1, 0, 11, NV), *drng = sampler(1, 0, 1, 0, 12, NV);
    enum { N = 200000 };
    uint64_t counts[NV] = {0}, acc = 0;
    float scratch[NV];
    for (int i = 0; i < N; i++) {
        const int32_t x = sil_sampler_draw(drng, q);
        bool ok;
        const int32_t t = sil_spec_accept(p, q, NV, x, rng, scratch, &ok);
        assert_true(t >= 0 && t < NV);
        counts[t]++;
        acc += ok;
    }
    double pd[NV];
    double expect_acc = 0;
    for (int i = 0; i < NV; i++) {
        pd[i] = p[i];
        expect_acc += p[i] < q[i] ? p[i] : q[i]; /* P(accept) = sum min(p, q) */
    }
    expect_fit("one token, q far from p", counts, pd, NV, N);
    assert_int_equal(counts[7], 0);
    printf("accepted %.4f of drafts (sum of min(p, q): %.4f)\n", (double)acc / N, expect_acc);
    assert_true(fabs((double)acc / N - expect_acc) < 0.01);
    /* q = p: every draft accepted */
    for (int i = 0; i < 1000; i++) {
        bool ok;
        sil_spec_accept(p, p, NV, sil_sampler_draw(drng, p), rng, scratch, &ok);
        assert_true(ok);
    }
    sil_sampler_free(rng);
    sil_sampler_free(drng);
}

/* p(x1) and p(x2 | x1) as a table: row 0 is x1's, row 1 + a is x2's after a. */
static void markov(float t[NV + 1][NV], uint64_t seed, float sharp)
{
    uint64_t x = seed;
    for (int r = 0; r <= NV; r++) {
        float z = 0;
        for (int i = 0; i < NV; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            t[r][i] = expf(sharp * (float)((x >> 33) % 1000) / 1000.0f);
            z += t[r][i];
        }
        for (int i = 0; i < NV; i++)
            t[r][i] /= z;
    }
}

/* Two tokens as a step of depth 2 makes them: d1 ~ q(.), d2 ~ q(. | d1); d1 through the rule on
 * p(.), then (accepted) d2 on p(. | d1), else the second token from the next step (a fresh draft
 * from q(. | x1) through the rule on p(. | x1)). The pairs follow p(x1) p(x2 | x1). */
static void test_chain(void **state)
{
    (void)state;
    float p[NV + 1][NV], q[NV + 1][NV], scratch[NV];
    markov(p, 1, 3.0f);
    markov(q, 2, 3.0f);
    struct sil_sampler *rng = sampler(1, 0, 1, 0, 21, NV), *drng = sampler(1, 0, 1, 0, 22, NV);
    enum { N = 400000 };
    static uint64_t counts[NV * NV];
    memset(counts, 0, sizeof counts);
    uint64_t acc = 0, drafted = 0;
    for (int i = 0; i < N; i++) {
        const int32_t d1 = sil_sampler_draw(drng, q[0]), d2 = sil_sampler_draw(drng, q[1 + d1]);
        bool ok;
        const int32_t x1 = sil_spec_accept(p[0], q[0], NV, d1, rng, scratch, &ok);
        int32_t x2;
        drafted += 2;
        acc += ok;
        if (ok) {
            x2 = sil_spec_accept(p[1 + d1], q[1 + d1], NV, d2, rng, scratch, &ok);
            acc += ok;
        } else {
            const int32_t d = sil_sampler_draw(drng, q[1 + x1]);
            x2 = sil_spec_accept(p[1 + x1], q[1 + x1], NV, d, rng, scratch, &ok);
        }
        counts[x1 * NV + x2]++;
    }
    double pd[NV * NV];
    for (int a = 0; a < NV; a++)
        for (int b = 0; b < NV; b++)
            pd[a * NV + b] = (double)p[0][a] * p[1 + a][b];
    printf("chain of two: %.1f%% of drafts accepted\n", 100.0 * (double)acc / (double)drafted);
    expect_fit("two tokens, the joint distribution", counts, pd, NV * NV, N);
    sil_sampler_free(rng);
    sil_sampler_free(drng);
}

/* sil_sampler_probs is what sil_sampler_sample draws from, under each setting; greedy is the
 * argmax; the rule on two such distributions (same settings, other logits) keeps the first. */
static void test_sampler_probs(void **state)
{
    (void)state;
    enum { V = 40, N = 100000 };
    float lt[V], ld[V];
    for (int i = 0; i < V; i++) {
        lt[i] = 3.0f * sinf(0.7f * (float)i) + 0.05f * (float)i;
        ld[i] = 3.0f * cosf(0.5f * (float)i);
    }
    const struct {
        float temp;
        int32_t k;
        float top_p, min_p;
    } set[] = {{0.8f, 0, 1.0f, 0.0f}, {1.0f, 12, 1.0f, 0.0f}, {0.7f, 0, 0.9f, 0.0f},
               {1.2f, 0, 1.0f, 0.05f}, {0.8f, 20, 0.95f, 0.05f}};
    for (size_t k = 0; k < sizeof set / sizeof *set; k++) {
        struct sil_sampler *ts = sampler(set[k].temp, set[k].k, set[k].top_p, set[k].min_p, 31, V);
        struct sil_sampler *ds = sampler(set[k].temp, set[k].k, set[k].top_p, set[k].min_p, 32, V);
        float p[V], q[V], scratch[V];
        sil_sampler_probs(ts, lt, NULL, 0, p);
        sil_sampler_probs(ds, ld, NULL, 0, q);
        double pd[V], sum = 0;
        int kept = 0;
        for (int i = 0; i < V; i++) {
            pd[i] = p[i];
            sum += p[i];
            kept += p[i] > 0;
        }
        assert_true(fabs(sum - 1) < 1e-5);
        if (set[k].k > 0) assert_true(kept <= set[k].k);
        uint64_t cs[V] = {0}, cr[V] = {0};
        for (int i = 0; i < N; i++) {
            cs[sil_sampler_sample(ts, lt, NULL, 0)]++;
            bool ok;
            cr[sil_spec_accept(p, q, V, sil_sampler_draw(ds, q), ts, scratch, &ok)]++;
        }
        char what[128];
        snprintf(what, sizeof what, "settings %zu: sil_sampler_sample against sil_sampler_probs", k);
        expect_fit(what, cs, pd, V, N);
        snprintf(what, sizeof what, "settings %zu: the rule, draft of other logits", k);
        expect_fit(what, cr, pd, V, N);
        sil_sampler_free(ts);
        sil_sampler_free(ds);
    }
    /* greedy: one-hot at the argmax, and the rule gives it whatever the draft */
    struct sil_sampler *g = sampler(0, 40, 0.95f, 0.05f, 41, V);
    float p[V], q[V], scratch[V];
    sil_sampler_probs(g, lt, NULL, 0, p);
    sil_sampler_probs(g, ld, NULL, 0, q);
    const int32_t am = sil_argmax(lt, V);
    assert_true(p[am] == 1.0f);
    for (int i = 0; i < 100; i++) {
        bool ok;
        assert_int_equal(sil_spec_accept(p, q, V, sil_argmax(ld, V), g, scratch, &ok), am);
        assert_int_equal(ok, sil_argmax(ld, V) == am);
    }
    sil_sampler_free(g);
}

/* On a tiny model: the first token of sampled speculative steps from one position follows the
 * target's sampling distribution there (drafted by another model); the model drafting for itself
 * has every draft accepted. Each trial cuts both sequences back to where it started. */
static void test_model(void **state)
{
    (void)state;
    if (!tu_refdata_exists("models/qwen3-tiny-Q8_0.gguf")) {
        if (tu_ci()) fail_msg("reference data missing (CI=true)");
        printf("no reference data: the model part skipped\n");
        return;
    }
    struct sil_engine_params ep;
    sil_engine_params_default(&ep);
    ep.n_threads = 2;
    ep.n_seq_max = 3;
    ep.n_ctx = 128;
    ep.n_batch_max = 64;
    struct sil_error err = {0};
    struct sil_engine *t = NULL, *d = NULL;
    if (tu_open_refdata_engine(&t, "qwen3-tiny-Q8_0", &ep, &err) < 0)
        fail_msg("open: %s", err.msg);
    /* the drafter: the same file in F32 reference mode with KV4, close to it but not equal */
    ep.exact = true;
    ep.kv_type = "q4_0";
    if (tu_open_refdata_engine(&d, "qwen3-tiny-Q8_0", &ep, &err) < 0) fail_msg("open: %s", err.msg);
    const int32_t nv = sil_engine_info(t)->n_vocab;
    enum { NP = 10, TRIALS = 3000, DEPTH = 3 };
    int32_t hist[NP];
    for (int32_t i = 0; i < NP; i++)
        hist[i] = 1 + (int32_t)(((uint32_t)i * 7919u + 13u) % 500u);
    for (int pass = 0; pass < 2; pass++) {
        struct sil_engine *dr = pass == 0 ? d : t;
        const int ts = sil_seq_create(t, &err), ds = sil_seq_create(dr, &err);
        assert_true(ts >= 0 && ds >= 0);
        /* the target holds hist but its last token; the draft catches up in the step */
        int32_t pos[NP], sq[NP];
        for (int32_t i = 0; i < NP - 1; i++) {
            pos[i] = i;
            sq[i] = ts;
        }
        const struct sil_batch b = {NP - 1, hist, pos, sq, NULL};
        float *lg = malloc(sizeof(float) * (size_t)nv);
        assert_int_equal(sil_engine_eval(t, &b, lg, &err), 0);
        struct sil_spec s;
        assert_int_equal(sil_spec_init(&s, t, ts, dr, ds, DEPTH, &err), 0);
        struct sil_sampler *tsmp = sampler(1.0f, 16, 1.0f, 0.0f, 51, nv),
                           *dsmp = sampler(1.0f, 16, 1.0f, 0.0f, 52, nv);
        /* the target's distribution at the position: the logits after hist */
        const int ps = sil_seq_create(t, &err);
        int32_t pp[NP], psq[NP];
        for (int32_t i = 0; i < NP; i++) {
            pp[i] = i;
            psq[i] = ps;
        }
        const struct sil_batch pb = {NP, hist, pp, psq, NULL};
        assert_int_equal(sil_engine_eval(t, &pb, lg, &err), 0);
        sil_seq_free(t, ps);
        float *p = malloc(sizeof(float) * (size_t)nv);
        sil_sampler_probs(tsmp, lg, hist, NP, p);
        uint64_t *counts = calloc((size_t)nv, sizeof(uint64_t));
        int32_t out[DEPTH + 1];
        for (int i = 0; i < TRIALS; i++) {
            const int k = sil_spec_step_sampled(&s, hist, NP, DEPTH + 1, tsmp, dsmp, out, &err);
            if (k < 1) fail_msg("step: %s", err.msg);
            counts[out[0]]++;
            assert_int_equal(sil_seq_truncate(t, ts, NP - 1, &err), 0);
            assert_int_equal(sil_seq_truncate(dr, ds, NP - 1, &err), 0);
        }
        double *pd = malloc(sizeof(double) * (size_t)nv);
        for (int32_t i = 0; i < nv; i++)
            pd[i] = p[i];
        printf("%s: %llu of %llu drafts accepted\n", pass ? "drafting for itself" : "drafted by its exact KV4 twin",
               (unsigned long long)s.stats.accepted, (unsigned long long)s.stats.drafted);
        if (pass == 0) {
            expect_fit("tiny model drafted by another, the first token", counts, pd, nv, TRIALS);
            assert_true(s.stats.accepted > 0 && s.stats.accepted < s.stats.drafted);
        } else {
            assert_true(s.stats.accepted == s.stats.drafted);
        }
        free(pd);
        free(counts);
        free(p);
        free(lg);
        sil_sampler_free(tsmp);
        sil_sampler_free(dsmp);
        sil_spec_free(&s);
        sil_seq_free(t, ts);
        sil_seq_free(dr, ds);
    }
    sil_engine_close(d);
    sil_engine_close(t);
}

/* MTP drafting, sampled: from a position where the MTP layer has the target's hidden state (after
 * one step), the first token of a sampled speculative step follows the target's sampling
 * distribution there, drafts are made every step and some, not all, are accepted. Each trial
 * puts the target back (a recurrent-state checkpoint) and the drafter's state as it was. */
static void test_mtp(void **state)
{
    (void)state;
    char *dir = tu_tmpdir_create();
    assert_non_null(dir);
    char *path = tu_path_join(dir, "mtp.gguf");
    tu_mk_write_tiny(path, SIL_MK_QWEN35MOE, 1, 11, NULL); /* a qwen35moe with an MTP layer */
    struct sil_engine_params ep;
    sil_engine_params_default(&ep);
    ep.model_path = path;
    ep.n_threads = 2;
    ep.n_seq_max = 2;
    ep.n_ctx = 128;
    ep.n_batch_max = 64;
    struct sil_error err = {0};
    struct sil_engine *t = NULL;
    if (sil_engine_open(&t, &ep, &err) < 0) fail_msg("open: %s", err.msg);
    assert_true(sil_engine_has_mtp(t));
    const int32_t nv = sil_engine_info(t)->n_vocab, E = sil_engine_info(t)->n_embd;
    enum { NP = 8, TRIALS = 3000, DEPTH = 3 };
    int32_t hist[NP + 1 + DEPTH + 1];
    for (int32_t i = 0; i < NP; i++)
        hist[i] = 20 + (int32_t)(((uint32_t)i * 7919u + 13u) % 480u);
    const int ts = sil_seq_create(t, &err);
    assert_true(ts >= 0);
    int32_t pos[NP + 1], sq[NP + 1];
    for (int32_t i = 0; i < NP + 1; i++) {
        pos[i] = i;
        sq[i] = ts;
    }
    float *lg = malloc(sizeof(float) * (size_t)nv), *p = malloc(sizeof(float) * (size_t)nv);
    const struct sil_batch b = {NP - 1, hist, pos, sq, NULL};
    assert_int_equal(sil_engine_eval(t, &b, lg, &err), 0);
    struct sil_spec s;
    assert_int_equal(sil_spec_init_mtp(&s, t, ts, DEPTH, &err), 0);
    /* the first step drafts nothing and gives the layer the hidden state to start from */
    assert_int_equal(sil_spec_step(&s, hist, NP, 1, hist + NP, &err), 1);
    assert_int_equal(s.stats.drafted, 0);
    assert_int_equal(sil_seq_len(t, ts), NP);
    assert_int_equal(sil_seq_checkpoint(t, ts, 1, &err), 0);
    const struct sil_spec saved = s;
    float *hid = malloc(sizeof(float) * (size_t)E * (size_t)s.hn);
    memcpy(hid, s.hid, sizeof(float) * (size_t)E * (size_t)s.hn);

    struct sil_sampler *tsmp = sampler(1.5f, 0, 1.0f, 0.0f, 61, nv),
                       *dsmp = sampler(1.5f, 0, 1.0f, 0.0f, 62, nv);
    /* the target's distribution after hist[0, NP + 1) */
    const int ps = sil_seq_create(t, &err);
    for (int32_t i = 0; i < NP + 1; i++)
        sq[i] = ps;
    const struct sil_batch pb = {NP + 1, hist, pos, sq, NULL};
    assert_int_equal(sil_engine_eval(t, &pb, lg, &err), 0);
    sil_seq_free(t, ps);
    sil_sampler_probs(tsmp, lg, hist, NP + 1, p);
    uint64_t *counts = calloc((size_t)nv, sizeof(uint64_t));
    int32_t out[DEPTH + 1];
    for (int i = 0; i < TRIALS; i++) {
        s.mbase = saved.mbase;
        s.mlen = saved.mlen;
        s.hpos = saved.hpos;
        s.hn = saved.hn;
        memcpy(s.hid, hid, sizeof(float) * (size_t)E * (size_t)s.hn);
        const int k = sil_spec_step_sampled(&s, hist, NP + 1, DEPTH + 1, tsmp, dsmp, out, &err);
        if (k < 1) fail_msg("step: %s", err.msg);
        counts[out[0]]++;
        assert_int_equal(sil_seq_truncate(t, ts, NP, &err), 0);
    }
    double *pd = malloc(sizeof(double) * (size_t)nv);
    for (int32_t i = 0; i < nv; i++)
        pd[i] = p[i];
    printf("MTP drafting: %llu of %llu drafts accepted\n", (unsigned long long)s.stats.accepted,
           (unsigned long long)s.stats.drafted);
    expect_fit("tiny MTP model drafting for itself, the first token", counts, pd, nv, TRIALS);
    assert_int_equal(s.stats.drafted, (uint64_t)TRIALS * DEPTH);
    assert_true(s.stats.accepted > 0 && s.stats.accepted < s.stats.drafted);
    free(pd);
    free(counts);
    free(p);
    free(lg);
    free(hid);
    sil_sampler_free(tsmp);
    sil_sampler_free(dsmp);
    sil_spec_free(&s);
    sil_seq_free(t, ts);
    sil_engine_close(t);
    tu_tmpdir_remove(dir);
    free(dir);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_token),
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_sampler_probs),
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_mtp),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
