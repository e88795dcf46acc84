/* Speculative decoding (spec.h) and the engine's verification windows (sil_seq_spec_*) on the
 * reference models of every architecture: a window's rows taken back leave the sequence
 * bit-identical to one that only evaluated the kept rows (KV blocks back in the pool, the delta
 * net's recurrent state where the kept rows left it), the window's bad uses are errors that
 * change nothing, and the drafting loop gives plain greedy decoding token for token, with the
 * target as its own drafter (every draft accepted) and with drafters that differ. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/spec.h"
#include "daemon/engine/tokenizer.h"
#include "tests/testutil.h"
#include "tests/testutil_spec.h"

static const char *const archs[] = {"qwen35moe-tiny-Q4_K_M", "qwen35-tiny-Q4_K_M",
                                    "qwen3moe-tiny-Q4_K_M", "qwen3-tiny-Q8_0"};
#define N_ARCH (sizeof(archs) / sizeof(archs[0]))

/* Evaluates ids[0, n) of seq from its end; logits of every row into lg when not NULL. */
static void eval_ids(struct sil_engine *e, int seq, const int32_t *ids, int32_t n, float *lg)
{
    int32_t pos[64], sq[64];
    bool want[64];
    assert_true(n > 0 && n <= 64);
    for (int32_t i = 0; i < n; i++) {
        pos[i] = sil_seq_len(e, seq) + i;
        sq[i] = seq;
        want[i] = lg != NULL;
    }
    struct sil_batch b = {n, ids, pos, sq, want};
    struct sil_error err = {0};
    if (sil_engine_eval(e, &b, lg, &err) < 0) fail_msg("eval: %s", err.msg);
}

static int new_seq(struct sil_engine *e)
{
    struct sil_error err = {0};
    int s = sil_seq_create(e, &err);
    assert_true(s >= 0);
    return s;
}

/* Windows opened, evaluated (K rows with logits) and cut back to a kept count, one after the
 * other on one sequence, against a second sequence that evaluates only the kept rows: the
 * window's logits of the kept rows and the logits after each commit are bit-identical, and a
 * window that keeps nothing gives its KV blocks back. The windows cross a block boundary
 * (position 64). */
static void test_commit_exact(void **state)
{
    (void)state;
    enum { K = 6, P0 = 58 };
    static const int32_t keep[] = {2, 0, 6, 1, 4, 3, 5};
    enum { NW = sizeof(keep) / sizeof(keep[0]) };
    int32_t ids[P0 + NW * K + 8];
    tu_spec_ids(ids, P0 + NW * K + 8);
    for (size_t a = 0; a < N_ARCH; a++) {
        struct sil_engine *e = tu_spec_engine(archs[a], 2, 512, false, NULL);
        const int32_t V = sil_engine_info(e)->n_vocab;
        struct sil_error err = {0};
        float *wl = malloc(sizeof(float) * (size_t)V * K),
              *rl = malloc(sizeof(float) * (size_t)V * K);
        int sa = new_seq(e), sb = new_seq(e);
        eval_ids(e, sa, ids, P0 / 2, NULL); /* the prefix in other splits on the two sequences */
        eval_ids(e, sa, ids + P0 / 2, P0 - P0 / 2, NULL);
        eval_ids(e, sb, ids, P0, NULL);
        /* the window's rows: the drafts a verifier would get, here the next tokens with every
         * other one replaced (what a rejected draft looks like) */
        int32_t at = 0; /* positions after P0 so far */
        for (int w = 0; w < NW; w++) {
            int32_t rows[K];
            for (int i = 0; i < K; i++)
                rows[i] = i % 2 ? (ids[P0 + at + i] * 3 + 1) % 500 + 1 : ids[P0 + at + i];
            struct sil_kv_info k0, k1;
            sil_engine_kv_info(e, &k0);
            const int32_t len = sil_seq_len(e, sa);
            assert_int_equal(sil_seq_spec_begin(e, sa, &err), 0);
            eval_ids(e, sa, rows, K, wl);
            assert_int_equal(sil_seq_len(e, sa), len + K);
            assert_int_equal(sil_seq_spec_commit(e, sa, len + keep[w], &err), 0);
            assert_int_equal(sil_seq_len(e, sa), len + keep[w]);
            if (keep[w] == 0) {
                sil_engine_kv_info(e, &k1);
                assert_int_equal(k1.n_free, k0.n_free);
            }
            if (keep[w] > 0) {
                eval_ids(e, sb, rows, keep[w], rl);
                if (memcmp(wl, rl, sizeof(float) * (size_t)V * (size_t)keep[w]))
                    fail_msg("%s window %d: the verify rows' logits differ from decoding them",
                             archs[a], w);
            }
            at += keep[w];
            /* the next logits: one more row on both */
            eval_ids(e, sa, &ids[P0 + at], 1, wl);
            eval_ids(e, sb, &ids[P0 + at], 1, rl);
            if (memcmp(wl, rl, sizeof(float) * (size_t)V))
                fail_msg("%s window %d (kept %d of %d): the next logits differ from a sequence "
                         "that only evaluated the kept rows",
                         archs[a], w, keep[w], K);
            at++;
        }
        assert_int_equal(sil_seq_len(e, sa), sil_seq_len(e, sb));
        assert_int_equal(sil_seq_len(e, sa), P0 + at);
        free(wl);
        free(rl);
        sil_engine_close(e);
    }
}

/* Bad uses of a window are errors that leave the sequence as it was; a full window refuses the
 * row beyond it; truncate, free and create close it. */
static void test_window_errors(void **state)
{
    (void)state;
    int32_t ids[40];
    tu_spec_ids(ids, 40);
    for (size_t a = 0; a < N_ARCH; a += 3) { /* a hybrid and an attention-only model */
        struct sil_engine *e = tu_spec_engine(archs[a], 2, 8, false, NULL);
        struct sil_error err = {0};
        int s = new_seq(e);
        assert_int_equal(sil_seq_spec_commit(e, s, 0, &err), -EINVAL); /* no window */
        assert_int_equal(sil_seq_spec_begin(e, 7, &err), -EINVAL);     /* not a sequence */
        assert_int_equal(sil_seq_spec_commit(e, -1, 0, &err), -EINVAL);
        eval_ids(e, s, ids, 8, NULL);
        assert_int_equal(sil_seq_spec_begin(e, s, &err), 0);
        eval_ids(e, s, ids + 8, 5, NULL);
        assert_int_equal(sil_seq_spec_commit(e, s, 7, &err), -EINVAL);  /* before the window */
        assert_int_equal(sil_seq_spec_commit(e, s, 14, &err), -EINVAL); /* past the end */
        assert_int_equal(sil_seq_len(e, s), 13);
        /* the window is still open: 3 more rows fill it (8), a ninth is refused */
        eval_ids(e, s, ids + 13, 3, NULL);
        int32_t tok = ids[16], pos = 16;
        struct sil_batch b = {1, &tok, &pos, &s, NULL};
        assert_int_equal(sil_engine_eval(e, &b, NULL, &err), -E2BIG);
        assert_int_equal(sil_seq_len(e, s), 16);
        assert_int_equal(sil_seq_spec_commit(e, s, 10, &err), 0);
        assert_int_equal(sil_seq_len(e, s), 10);
        assert_int_equal(sil_seq_spec_commit(e, s, 10, &err), -EINVAL); /* closed */
        /* truncate closes a window (to 0: always possible) */
        assert_int_equal(sil_seq_spec_begin(e, s, &err), 0);
        eval_ids(e, s, ids + 10, 2, NULL);
        assert_int_equal(sil_seq_truncate(e, s, 0, &err), 0);
        assert_int_equal(sil_seq_spec_commit(e, s, 0, &err), -EINVAL);
        /* free and create close it */
        assert_int_equal(sil_seq_spec_begin(e, s, &err), 0);
        sil_seq_free(e, s);
        s = new_seq(e);
        assert_int_equal(sil_seq_spec_commit(e, s, 0, &err), -EINVAL);
        /* a begin on an open window moves it to the end */
        eval_ids(e, s, ids, 4, NULL);
        assert_int_equal(sil_seq_spec_begin(e, s, &err), 0);
        eval_ids(e, s, ids + 4, 2, NULL);
        assert_int_equal(sil_seq_spec_begin(e, s, &err), 0);
        eval_ids(e, s, ids + 6, 2, NULL);
        assert_int_equal(sil_seq_spec_commit(e, s, 5, &err), -EINVAL);
        assert_int_equal(sil_seq_spec_commit(e, s, 6, &err), 0);
        assert_int_equal(sil_seq_len(e, s), 6);
        sil_engine_close(e);
    }
}

/* Plain greedy decoding: prompt, then n tokens one row at a time. */
static void plain_greedy(struct sil_engine *e, const int32_t *prompt, int32_t np, int32_t n,
                         int32_t *out)
{
    struct sil_error err = {0};
    int s = new_seq(e);
    const int32_t V = sil_engine_info(e)->n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)np);
    eval_ids(e, s, prompt, np, lg);
    int32_t am;
    {
        const float *x = lg + (size_t)(np - 1) * V;
        am = 0;
        for (int32_t v = 1; v < V; v++)
            if (x[v] > x[am]) am = v;
    }
    out[0] = am;
    for (int32_t i = 1; i < n; i++) {
        int32_t pos = sil_seq_len(e, s);
        struct sil_batch b = {1, &out[i - 1], &pos, &s, NULL};
        assert_int_equal(sil_engine_eval_out(e, &b, NULL, &out[i], NULL, &err), 0);
    }
    free(lg);
    sil_seq_free(e, s);
}

struct spec_run {
    struct sil_spec_stats st;
    int partial; /* steps that accepted some drafts but not all */
};

/* The same n tokens by speculative decoding, drafting with d (another sequence when d is t). */
static void spec_greedy(struct sil_engine *t, struct sil_engine *d, int32_t depth,
                        const int32_t *prompt, int32_t np, int32_t n, int32_t *out,
                        struct spec_run *r)
{
    struct sil_error err = {0};
    int ts = new_seq(t), ds = new_seq(d);
    struct sil_spec sp;
    if (sil_spec_init(&sp, t, ts, d, ds, depth, &err) < 0) fail_msg("spec init: %s", err.msg);
    int32_t *hist = malloc(sizeof(int32_t) * (size_t)(np + n + depth + 1));
    memcpy(hist, prompt, sizeof(int32_t) * (size_t)np);
    /* the target holds all but the last token; the draft catches up by itself */
    eval_ids(t, ts, prompt, np - 1, NULL);
    int32_t nh = np, got = 0;
    r->partial = 0;
    while (got < n + 1) {
        int32_t buf[SIL_SPEC_DEPTH_MAX + 1];
        const int rc = sil_spec_step(&sp, hist, nh, n + 1 - got, buf, &err);
        if (rc < 0) fail_msg("spec step: %s", err.msg);
        assert_true(rc >= 1 && rc <= depth + 1);
        if (rc > 1 && rc < depth + 1) r->partial++;
        memcpy(hist + nh, buf, sizeof(int32_t) * (size_t)rc);
        nh += rc;
        got += rc;
        assert_int_equal(sil_seq_len(t, ts), nh - 1);
        assert_true(sil_seq_len(d, ds) <= nh - 1);
    }
    assert_int_equal(got, n + 1);
    /* hist[np] is the greedy token after the prompt: plain's out[0] */
    memcpy(out, hist + np, sizeof(int32_t) * (size_t)n);
    r->st = sp.stats;
    sil_spec_free(&sp);
    sil_seq_free(t, ts);
    sil_seq_free(d, ds);
    free(hist);
}

static void expect_same(const char *what, const int32_t *a, const int32_t *b, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        if (a[i] != b[i])
            fail_msg("%s: token %d is %d, plain greedy decoding gives %d", what, i, b[i], a[i]);
}

/* Every architecture with itself as the drafter: every draft accepted, depth + 1 tokens a step,
 * and the tokens of plain greedy decoding. */
static void test_self_draft(void **state)
{
    (void)state;
    enum { NP = 12, N = 40, DEPTH = 4 };
    int32_t prompt[NP], plain[N + 1], got[N + 1];
    tu_spec_ids(prompt, NP);
    for (size_t a = 0; a < N_ARCH; a++) {
        struct sil_engine *e = tu_spec_engine(archs[a], 3, 512, false, NULL);
        plain_greedy(e, prompt, NP, N, plain);
        struct spec_run r;
        spec_greedy(e, e, DEPTH, prompt, NP, N, got, &r);
        expect_same(archs[a], plain, got, N);
        assert_true(r.st.drafted > 0);
        assert_int_equal(r.st.accepted, r.st.drafted);
        assert_int_equal(r.st.emitted, N + 1);
        printf("%s drafting for itself: %llu steps, %llu of %llu drafts accepted\n", archs[a],
               (unsigned long long)r.st.steps, (unsigned long long)r.st.accepted,
               (unsigned long long)r.st.drafted);
        sil_engine_close(e);
    }
}

/* Drafters that differ from the target: the same weights computed another way (F32 reference
 * mode, KV4) and models of other architectures (same tiny vocabulary). The tokens are plain
 * greedy decoding's whatever the acceptance; the same-weights drafters accept some drafts but
 * not all, so steps that keep part of a window are exercised on every architecture. */
static void test_other_drafter(void **state)
{
    (void)state;
    enum { NP = 12, N = 48, DEPTH = 4 };
    int32_t prompt[NP], plain[N + 1], got[N + 1];
    tu_spec_ids(prompt, NP);
    for (size_t a = 0; a < N_ARCH; a++) {
        struct sil_engine *t = tu_spec_engine(archs[a], 2, 512, false, NULL);
        plain_greedy(t, prompt, NP, N, plain);
        struct {
            const char *model;
            bool exact;
            const char *kv;
            bool partial; /* must accept some but not all */
        } dr[] = {{archs[a], true, "q4_0", true},
                  {archs[(a + 1) % N_ARCH], false, NULL, false},
                  {archs[(a + 2) % N_ARCH], false, NULL, false}};
        uint64_t acc = 0, drafted = 0;
        int partial = 0;
        for (size_t k = 0; k < sizeof(dr) / sizeof(dr[0]); k++) {
            struct sil_engine *d = tu_spec_engine(dr[k].model, 1, 512, dr[k].exact, dr[k].kv);
            struct spec_run r;
            spec_greedy(t, d, DEPTH, prompt, NP, N, got, &r);
            char what[160];
            snprintf(what, sizeof(what), "%s drafted by %s%s%s", archs[a], dr[k].model,
                     dr[k].exact ? " (exact)" : "", dr[k].kv ? " (kv q4_0)" : "");
            expect_same(what, plain, got, N);
            assert_int_equal(r.st.emitted, N + 1);
            printf("%s: %llu steps, %llu of %llu drafts accepted (%.1f%%), %d steps partly\n", what,
                   (unsigned long long)r.st.steps, (unsigned long long)r.st.accepted,
                   (unsigned long long)r.st.drafted,
                   r.st.drafted ? 100.0 * (double)r.st.accepted / (double)r.st.drafted : 0.0,
                   r.partial);
            if (dr[k].partial) {
                acc += r.st.accepted;
                drafted += r.st.drafted;
                partial += r.partial;
            }
            sil_engine_close(d);
        }
        if (!(acc > 0 && acc < drafted && partial > 0))
            fail_msg("%s: the perturbed drafter accepted %llu of %llu drafts in %d partial steps "
                     "(want some, not all)",
                     archs[a], (unsigned long long)acc, (unsigned long long)drafted, partial);
        sil_engine_close(t);
    }
}

/* What the route observer saw of the target's MoE layers: layers, and summed over them the
 * distinct experts of the event's (row, slot) pairs, the event's own n_active, and the pairs;
 * bad: an event whose union is not within [top-k, pairs] or differs from its n_active. */
struct route_count {
    uint64_t layers, distinct, active, pairs;
    int bad;
};

static void count_route(void *user, const struct sil_route_event *ev)
{
    struct route_count *c = user;
    bool seen[1024] = {false};
    int64_t distinct = 0;
    const int64_t pairs = (int64_t)ev->n_rows * ev->n_used;
    for (int64_t q = 0; q < pairs; q++) {
        const int32_t x = ev->expert[q];
        if (x < 0 || x >= 1024) {
            c->bad++;
            continue;
        }
        distinct += !seen[x];
        seen[x] = true;
    }
    if (distinct < ev->n_used || distinct > pairs || distinct != ev->n_active) c->bad++;
    c->layers++;
    c->distinct += (uint64_t)distinct;
    c->active += (uint64_t)ev->n_active;
    c->pairs += (uint64_t)pairs;
}

/* MoE-aware verification reporting: the spec counters of the verify passes (the union of the
 * experts per MoE layer beside rows x top-k) equal what the route events of those passes show,
 * per layer between top-k and the pairs. The drafter is another engine, so the target's only
 * passes in the steps are the verify passes (attention-only qwen3moe: commits recompute
 * nothing); on qwen35moe the commits' recompute passes come on top, so there the counters are
 * held to the bounds and to at most what the events saw. */
static void test_expert_union(void **state)
{
    (void)state;
    enum { NP = 12, N = 40, DEPTH = 4 };
    const char *const moe[] = {"qwen3moe-tiny-Q4_K_M", "qwen35moe-tiny-Q4_K_M"};
    int32_t prompt[NP];
    tu_spec_ids(prompt, NP);
    for (int a = 0; a < 2; a++) {
        struct route_count rc = {0};
        const struct sil_engine_observer obs = {.user = &rc, .on_route = count_route};
        struct sil_engine_params p;
        sil_engine_params_default(&p);
        p.n_threads = 2;
        p.n_seq_max = 2;
        p.n_ctx = 256;
        p.observer = &obs;
        struct sil_error err = {0};
        struct sil_engine *t = NULL;
        if (tu_open_refdata_engine(&t, moe[a], &p, &err) < 0)
            fail_msg("open %s: %s", moe[a], err.msg);
        /* the perturbed drafter: some drafts rejected, so verify passes of several lengths */
        struct sil_engine *d = tu_spec_engine(moe[a], 1, 512, true, "q4_0");
        const int K = sil_engine_info(t)->n_expert_used;
        int ts = new_seq(t), ds = new_seq(d);
        struct sil_spec sp;
        if (sil_spec_init(&sp, t, ts, d, ds, DEPTH, &err) < 0) fail_msg("init: %s", err.msg);
        int32_t hist[NP + N + DEPTH + 2];
        memcpy(hist, prompt, sizeof(prompt));
        eval_ids(t, ts, prompt, NP - 1, NULL);
        const struct route_count before = rc;
        int32_t nh = NP;
        while (nh < NP + N) {
            const int k = sil_spec_step(&sp, hist, nh, NP + N - nh, hist + nh, &err);
            if (k < 0) fail_msg("step: %s", err.msg);
            nh += k;
        }
        const struct sil_spec_stats *st = &sp.stats;
        printf("%s: %llu verify MoE layers, %.2f experts a layer of %.2f rows x top-%d\n", moe[a],
               (unsigned long long)st->moe_layers,
               (double)st->expert_union / (double)st->moe_layers,
               (double)st->expert_pairs / (double)st->moe_layers, K);
        assert_int_equal(rc.bad, 0);
        assert_true(st->moe_layers > 0 && st->moe_layers % (uint64_t)st->steps == 0);
        assert_true(st->expert_union >= (uint64_t)K * st->moe_layers);
        assert_true(st->expert_union <= st->expert_pairs);
        assert_true(st->expert_union < st->expert_pairs); /* rows of a pass share experts */
        const uint64_t layers = rc.layers - before.layers, distinct = rc.distinct - before.distinct,
                       pairs = rc.pairs - before.pairs;
        if (!sil_engine_recurrent(t)) {
            assert_int_equal(st->moe_layers, layers);
            assert_int_equal(st->expert_union, distinct);
            assert_int_equal(st->expert_pairs, pairs);
        } else {
            assert_true(st->moe_layers <= layers && st->expert_union <= distinct &&
                        st->expert_pairs <= pairs);
        }
        sil_spec_free(&sp);
        sil_engine_close(d);
        sil_engine_close(t);
    }
}

/* The vocabulary check: a vocabulary matches itself; two different ones (the real Qwen3 and
 * Llama 3 tokenizers, and the tiny one) do not; a draft step with bad arguments is -EINVAL. */
static void test_vocab_check(void **state)
{
    (void)state;
    const char *const files[] = {"tokenizer/qwen3-vocab.gguf", "tokenizer/llama3-vocab.gguf"};
    struct sil_vocab *v[2] = {0};
    struct sil_gguf *g[2] = {0};
    struct sil_error err = {0};
    for (int i = 0; i < 2; i++) {
        char *path = tu_refdata_path(files[i]);
        assert_int_equal(sil_gguf_open(&g[i], path, &err), 0);
        assert_int_equal(sil_vocab_load(&v[i], g[i], &err), 0);
        free(path);
    }
    assert_int_equal(sil_spec_vocab_check(v[0], v[0], &err), 0);
    assert_int_equal(sil_spec_vocab_check(v[0], v[1], &err), -EINVAL);
    assert_non_null(strstr(err.msg, "vocabulary"));
    struct sil_engine *e = tu_spec_engine(archs[3], 2, 512, false, NULL);
    assert_int_equal(sil_spec_vocab_check(v[0], sil_engine_vocab(e), &err), -EINVAL);
    struct sil_spec sp;
    assert_int_equal(sil_spec_init(&sp, e, 0, e, 0, 4, &err), -EINVAL); /* one sequence */
    assert_int_equal(sil_spec_init(&sp, e, 0, e, 1, 0, &err), -EINVAL); /* depth 0 */
    assert_int_equal(sil_spec_init(&sp, e, 0, e, 1, SIL_SPEC_DEPTH_MAX + 1, &err), -EINVAL);
    int ts = new_seq(e), ds = new_seq(e);
    assert_int_equal(sil_spec_init(&sp, e, ts, e, ds, 4, &err), 0);
    int32_t hist[4] = {1, 2, 3, 4}, out[8];
    /* the target must hold all of hist but its last token */
    assert_int_equal(sil_spec_step(&sp, hist, 4, 8, out, &err), -EINVAL);
    eval_ids(e, ts, hist, 3, NULL);
    assert_int_equal(sil_spec_step(&sp, hist, 4, 0, out, &err), -EINVAL);
    assert_int_equal(sil_spec_step(&sp, hist, 0, 8, out, &err), -EINVAL);
    assert_int_equal(sil_spec_step(&sp, hist, 4, 1, out, &err), 1);       /* no room for drafts */
    assert_int_equal(sil_spec_step(&sp, hist, 4, 8, out, &err), -EINVAL); /* hist not extended */
    sil_spec_free(&sp);
    sil_engine_close(e);
    for (int i = 0; i < 2; i++) {
        sil_vocab_free(v[i]);
        sil_gguf_close(g[i]);
    }
}

int main(void)
{
    if (!tu_refdata_exists("models/qwen3-tiny-Q8_0.gguf")) {
        if (tu_ci()) {
            fprintf(stderr, "test_spec: reference data missing under %s (CI=true)\n",
                    tu_shared_dir());
            return 1;
        }
        fprintf(stderr, "test_spec: no reference data under %s: skipped\n", tu_shared_dir());
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_commit_exact), cmocka_unit_test(test_window_errors),
        cmocka_unit_test(test_self_draft),   cmocka_unit_test(test_other_drafter),
        cmocka_unit_test(test_vocab_check),  cmocka_unit_test(test_expert_union),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
