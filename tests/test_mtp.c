/* The MTP (nextn) layer: files written by sil-mkmodel --mtp load with it (and without it as
 * before), a declared layer with a tensor missing or misshapen is a load error naming it, the
 * layer's own KV keeps what sil_seq_mtp_eval says (rows in one call or one at a time, rows taken
 * back and evaluated again), and MTP drafting gives plain greedy decoding token for token. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/spec.h"
#include "tests/testutil.h"
#include "tests/testutil_mkmodel.h"

static char *tmpdir;

/* A tiny model of arch with one MTP layer (or none); edit may change its tensor list. */
static char *write_model(int arch, bool mtp, const char *name,
                         void (*edit)(struct sil_mk_model *m))
{
    char *path = tu_path_join(tmpdir, name);
    tu_mk_write_tiny(path, arch, mtp ? 1 : 0, 7, edit);
    return path;
}

static int open_model(struct sil_engine **e, const char *path, struct sil_error *err)
{
    struct sil_engine_params p;
    sil_engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 2;
    p.n_ctx = 256;
    p.n_seq_max = 2;
    p.n_batch_max = 64;
    return sil_engine_open(e, &p, err);
}

static void drop_tensor(struct sil_mk_model *m, const char *name)
{
    for (int64_t i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) {
            free(m->tensors[i].src);
            memmove(&m->tensors[i], &m->tensors[i + 1],
                    sizeof(*m->tensors) * (size_t)(m->n_tensors - i - 1));
            m->n_tensors--;
            return;
        }
    fail_msg("no tensor %s", name);
}

static void drop_hnorm(struct sil_mk_model *m)
{
    drop_tensor(m, "blk.4.nextn.hnorm.weight");
}

static void drop_mtp_attn(struct sil_mk_model *m)
{
    drop_tensor(m, "blk.4.attn_q.weight");
}

static void bad_eh_proj(struct sil_mk_model *m)
{
    for (int64_t i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, "blk.4.nextn.eh_proj.weight") == 0) {
            m->tensors[i].ne[0] /= 2; /* [n_embd, n_embd]: the hidden half missing */
            return;
        }
    fail_msg("no eh_proj");
}

static void test_load(void **state)
{
    (void)state;
    static const int archs[] = {SIL_MK_QWEN35MOE, SIL_MK_QWEN35, SIL_MK_QWEN3MOE, SIL_MK_QWEN3};
    for (size_t a = 0; a < sizeof(archs) / sizeof(archs[0]); a++) {
        char name[64];
        struct sil_error err = {0};
        struct sil_engine *e = NULL;
        snprintf(name, sizeof(name), "mtp-%zu.gguf", a);
        char *path = write_model(archs[a], true, name, NULL);
        if (open_model(&e, path, &err) < 0) fail_msg("%s: %s", name, err.msg);
        assert_true(sil_engine_has_mtp(e));
        assert_int_equal(sil_engine_info(e)->n_layer, 4); /* block_count 5: the trunk's 4 */
        sil_engine_close(e);
        free(path);
        snprintf(name, sizeof(name), "plain-%zu.gguf", a);
        path = write_model(archs[a], false, name, NULL);
        if (open_model(&e, path, &err) < 0) fail_msg("%s: %s", name, err.msg);
        assert_false(sil_engine_has_mtp(e));
        struct sil_spec sp;
        assert_int_equal(sil_spec_init_mtp(&sp, e, 0, 2, &err), -ENOTSUP);
        sil_engine_close(e);
        free(path);
    }
}

static void test_partial_layer(void **state)
{
    (void)state;
    struct {
        void (*edit)(struct sil_mk_model *);
        const char *names;
    } cases[] = {
        {drop_hnorm, "blk.4.nextn.hnorm.weight"},
        {drop_mtp_attn, "blk.4.attn_q.weight"},
        {bad_eh_proj, "blk.4.nextn.eh_proj.weight"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char name[32];
        snprintf(name, sizeof(name), "bad-%zu.gguf", i);
        char *path = write_model(SIL_MK_QWEN35MOE, true, name, cases[i].edit);
        struct sil_error err = {0};
        struct sil_engine *e = NULL;
        assert_int_equal(open_model(&e, path, &err), -EINVAL);
        assert_null(e);
        if (!strstr(err.msg, cases[i].names)) fail_msg("error without the tensor: %s", err.msg);
        free(path);
    }
}

/* Rows in one call or one at a time, and rows taken back and evaluated again, give the same
 * tokens and hidden states. */
static void test_mtp_kv(void **state)
{
    (void)state;
    char *path = write_model(SIL_MK_QWEN35MOE, true, "kv.gguf", NULL);
    struct sil_error err = {0};
    struct sil_engine *e = NULL;
    if (open_model(&e, path, &err) < 0) fail_msg("%s", err.msg);
    const int64_t E = sil_engine_info(e)->n_embd;
    enum { N = 6 };
    int32_t tok[N], am1[N], am2[N];
    float *h = malloc(sizeof(float) * N * (size_t)E), *o1 = malloc(sizeof(float) * N * (size_t)E),
          *o2 = malloc(sizeof(float) * N * (size_t)E);
    assert_non_null(h);
    for (int i = 0; i < N; i++) {
        tok[i] = 10 + 37 * i;
        for (int64_t j = 0; j < E; j++)
            h[i * E + j] = (float)((i * 31 + j * 7) % 13) / 13.0f - 0.5f;
    }
    const int seq = sil_seq_create(e, &err);
    assert_true(seq >= 0);
    assert_int_equal(sil_seq_mtp_eval(e, seq, N, tok, 0, h, am1, o1, &err), 0);
    assert_int_equal(sil_seq_mtp_eval(e, seq, 1, tok, N + 1, h, am2, o2, &err), -EINVAL); /* gap */
    for (int i = 0; i < N; i++) /* from 0 again, one row at a time */
        assert_int_equal(sil_seq_mtp_eval(e, seq, 1, tok + i, i, h + i * E, am2 + i, o2 + i * E,
                                          &err),
                         0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(am1[i], am2[i]);
        for (int64_t j = 0; j < E; j++)
            assert_float_equal(o1[i * E + j], o2[i * E + j], 1e-3);
    }
    /* the last rows again after other rows took their place */
    int32_t other[3] = {1, 2, 3};
    assert_int_equal(sil_seq_mtp_eval(e, seq, 3, other, 3, h, am2, o2, &err), 0);
    assert_int_equal(sil_seq_mtp_eval(e, seq, 3, tok + 3, 3, h + 3 * E, am2 + 3, o2 + 3 * E, &err),
                     0);
    for (int i = 3; i < N; i++)
        assert_int_equal(am1[i], am2[i]);
    int32_t bad = 1 << 20;
    assert_int_equal(sil_seq_mtp_eval(e, seq, 1, &bad, 0, h, am2, o2, &err), -EINVAL);
    free(h);
    free(o1);
    free(o2);
    sil_engine_close(e);
    free(path);
}

/* MTP drafting gives plain greedy decoding's tokens, at several depths, and says how many
 * drafts it made and how many were accepted. */
static void test_spec_mtp_exact(void **state)
{
    (void)state;
    static const int archs[] = {SIL_MK_QWEN35MOE, SIL_MK_QWEN35};
    for (size_t a = 0; a < sizeof(archs) / sizeof(archs[0]); a++) {
        char name[32];
        snprintf(name, sizeof(name), "spec-%zu.gguf", a);
        char *path = write_model(archs[a], true, name, NULL);
        struct sil_error err = {0};
        struct sil_engine *e = NULL;
        if (open_model(&e, path, &err) < 0) fail_msg("%s", err.msg);
        enum { NP = 6, NG = 24 };
        int32_t hist[NP + NG + 8], plain[NG];
        for (int i = 0; i < NP; i++)
            hist[i] = 20 + 41 * i;
        /* plain greedy decoding */
        int seq = sil_seq_create(e, &err);
        int32_t pos[NP], sq[NP], am;
        for (int i = 0; i < NP; i++) {
            pos[i] = i;
            sq[i] = seq;
        }
        struct sil_batch b = {NP, hist, pos, sq, NULL};
        assert_int_equal(sil_engine_eval_out(e, &b, NULL, &am, NULL, &err), 0);
        for (int i = 0; i < NG; i++) {
            plain[i] = am;
            int32_t p = NP + i;
            struct sil_batch b1 = {1, &plain[i], &p, &seq, NULL};
            assert_int_equal(sil_engine_eval_out(e, &b1, NULL, &am, NULL, &err), 0);
        }
        sil_seq_free(e, seq);
        for (int32_t depth = 1; depth <= 4; depth++) {
            seq = sil_seq_create(e, &err);
            struct sil_batch bp = {NP - 1, hist, pos, sq, NULL};
            for (int i = 0; i < NP; i++)
                sq[i] = seq;
            assert_int_equal(sil_engine_eval_out(e, &bp, NULL, &am, NULL, &err), 0);
            struct sil_spec sp;
            assert_int_equal(sil_spec_init_mtp(&sp, e, seq, depth, &err), 0);
            int32_t nh = NP;
            while (nh < NP + NG) {
                const int k = sil_spec_step(&sp, hist, nh, NP + NG - nh, hist + nh, &err);
                if (k < 1) fail_msg("step: %s", err.msg);
                nh += k;
            }
            for (int i = 0; i < NG; i++)
                assert_int_equal(hist[NP + i], plain[i]);
            /* the first step only verifies; every later one drafts */
            assert_true(sp.stats.drafted > 0);
            assert_true(sp.stats.accepted <= sp.stats.drafted);
            assert_int_equal(sp.stats.emitted, NG);
            print_message("arch %zu depth %d: %llu of %llu drafts accepted\n", a, depth,
                          (unsigned long long)sp.stats.accepted,
                          (unsigned long long)sp.stats.drafted);
            sil_spec_free(&sp);
            sil_seq_free(e, seq);
        }
        sil_engine_close(e);
        free(path);
    }
}

/* The prompt fed to the MTP layer as it is prefilled (sil_spec_mtp_feed, in two batches): the
 * first step drafts at once, and each draft is what the layer gives with the whole history in
 * one evaluation (row t reads the hidden state at t and the token at t + 1): the drafts
 * accepted are those a replay of that one evaluation predicts. The tokens are plain greedy's. */
static void test_spec_mtp_feed(void **state)
{
    (void)state;
    char *path = write_model(SIL_MK_QWEN35MOE, true, "feed.gguf", NULL);
    struct sil_error err = {0};
    struct sil_engine *e = NULL;
    if (open_model(&e, path, &err) < 0) fail_msg("%s", err.msg);
    const int64_t E = sil_engine_info(e)->n_embd;
    enum { NP = 7, NG = 20, N = NP + NG };
    int32_t hist[N + 8], pos[N], sq[N], am[N], ref[N];
    bool want[N];
    float *h = malloc(sizeof(float) * N * (size_t)E), *o = malloc(sizeof(float) * N * (size_t)E);
    assert_non_null(h);
    assert_non_null(o);
    for (int i = 0; i < NP; i++)
        hist[i] = 15 + 29 * i;
    /* plain greedy decoding */
    int seq = sil_seq_create(e, &err);
    for (int i = 0; i < N; i++) {
        pos[i] = i;
        sq[i] = seq;
        want[i] = true;
    }
    struct sil_batch b = {NP, hist, pos, sq, NULL};
    assert_int_equal(sil_engine_eval_out(e, &b, NULL, &am[0], NULL, &err), 0);
    for (int i = 0; i < NG; i++) {
        hist[NP + i] = am[0];
        struct sil_batch b1 = {1, &hist[NP + i], &pos[NP + i], &seq, NULL};
        assert_int_equal(sil_engine_eval_out(e, &b1, NULL, &am[0], NULL, &err), 0);
    }
    sil_seq_free(e, seq);
    /* the layer over the whole history at once: ref[t] is its prediction for token t + 2 */
    seq = sil_seq_create(e, &err);
    for (int i = 0; i < N; i++)
        sq[i] = seq;
    struct sil_batch ball = {N, hist, pos, sq, want};
    assert_int_equal(sil_engine_eval_hidden(e, &ball, NULL, am, h, &err), 0);
    assert_int_equal(sil_seq_mtp_eval(e, seq, N - 1, hist + 1, 0, h, ref, o, &err), 0);
    sil_seq_free(e, seq);
    /* the prompt but its last token prefilled in batches of 4 and 2, each fed to the layer */
    seq = sil_seq_create(e, &err);
    for (int i = 0; i < N; i++)
        sq[i] = seq;
    struct sil_spec sp;
    assert_int_equal(sil_spec_init_mtp(&sp, e, seq, 1, &err), 0);
    for (int b0 = 0; b0 < NP - 1;) {
        const int k = b0 == 0 ? 4 : NP - 1 - b0;
        struct sil_batch bk = {k, hist + b0, pos + b0, sq + b0, want + b0};
        assert_int_equal(sil_engine_eval_hidden(e, &bk, NULL, am, h, &err), 0);
        assert_int_equal(sil_spec_mtp_feed(&sp, hist + b0, k, h, &err), 0);
        b0 += k;
    }
    /* the sequence holds NP - 1 positions: feeding more than it holds is refused */
    assert_int_equal(sil_spec_mtp_feed(&sp, hist, 1, h, &err), -EINVAL);
    /* a chain of 1: the step at L drafts ref[L - 1] for position L + 1, the first step too */
    int32_t out[N + 8];
    memcpy(out, hist, sizeof(int32_t) * NP);
    int32_t nh = NP, checked = 0;
    while (nh < N) {
        const int32_t L = nh - 1;
        const uint64_t drafted = sp.stats.drafted;
        const int k = sil_spec_step(&sp, out, nh, N - nh, out + nh, &err);
        if (k < 1) fail_msg("step: %s", err.msg);
        if (nh == NP) assert_true(sp.stats.drafted > drafted);
        if (sp.stats.drafted > drafted) {
            assert_int_equal(sp.dtok[0], ref[L - 1]);
            checked++;
        }
        nh += k;
    }
    for (int i = NP; i < N; i++)
        assert_int_equal(out[i], hist[i]);
    print_message("fed prompt: %d drafts equal the whole history's, %llu of %llu accepted\n",
                  checked, (unsigned long long)sp.stats.accepted,
                  (unsigned long long)sp.stats.drafted);
    assert_true(checked >= NG / 2);
    sil_spec_free(&sp);
    sil_seq_free(e, seq);
    free(h);
    free(o);
    sil_engine_close(e);
    free(path);
}

static int setup(void **state)
{
    (void)state;
    tmpdir = tu_tmpdir_create();
    return tmpdir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_tmpdir_remove(tmpdir);
    free(tmpdir);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_load),          cmocka_unit_test(test_partial_layer),
        cmocka_unit_test(test_mtp_kv),        cmocka_unit_test(test_spec_mtp_exact),
        cmocka_unit_test(test_spec_mtp_feed),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
