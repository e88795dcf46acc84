/* Token-tree verification (engine.h's sil_engine_eval_tree and sil_seq_spec_commit_path,
 * spec.h's sil_spec_set_width) on every reference architecture, the attention-only ones and the
 * hybrids whose branches fork the delta net's recurrent state: a tree node's logits are
 * bit-identical to those of a plain sequence made of its path (f32 KV, one attention split;
 * the delta net gives the same bits whatever the split of a path's rows), also with several
 * sequences' trees in one batch across micro-batches, a committed path leaves the sequence
 * bit-identical to one that only evaluated it with the rejected nodes' KV blocks back in the
 * pool, the tree's bad uses are errors, and tree steps give plain greedy decoding's tokens. */
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
#include "tests/testutil_spec.h"

static const char *const tree_archs[] = {"qwen3moe-tiny-Q4_K_M", "qwen3-tiny-Q8_0",
                                         "qwen35-tiny-Q4_K_M", "qwen35moe-tiny-Q4_K_M"};
#define N_TREE (sizeof(tree_archs) / sizeof(tree_archs[0]))

static int new_seq(struct sil_engine *e)
{
    struct sil_error err = {0};
    int s = sil_seq_create(e, &err);
    assert_true(s >= 0);
    return s;
}

/* Rows ids[0, n) of seq from its end (parents: NULL, a plain batch); every row's logits into
 * lg when not NULL. Returns the evaluation's result. */
static int eval_rows(struct sil_engine *e, int seq, const int32_t *ids, int32_t n,
                     const int32_t *parent, float *lg, struct sil_error *err)
{
    int32_t pos[64], sq[64];
    bool want[64];
    assert_true(n > 0 && n <= 64);
    for (int32_t i = 0; i < n; i++) {
        pos[i] = sil_seq_len(e, seq) + i;
        sq[i] = seq;
        want[i] = lg != NULL;
    }
    const struct sil_batch b = {n, ids, pos, sq, want};
    if (parent) return sil_engine_eval_tree(e, &b, parent, lg, NULL, err);
    return sil_engine_eval_out(e, &b, lg, NULL, NULL, err);
}

/* The tree of the tests: a root, then W branches of D nodes one after another. */
enum { NP = 70, W = 3, D = 3, ROWS = 1 + W * D };

static void tree_of(int32_t *tok, int32_t *par)
{
    tok[0] = 7;
    par[0] = -1;
    for (int32_t j = 0; j < W; j++)
        for (int32_t i = 0; i < D; i++) {
            const int32_t r = 1 + j * D + i;
            tok[r] = 20 + 31 * j + 5 * i;
            par[r] = i == 0 ? 0 : r - 1;
        }
}

/* Each node's logits against a plain sequence of the prompt, the root and the node's path (the
 * prompt crosses a KV block boundary, so the tree spans two blocks); then a commit of each
 * branch's partial path against a plain sequence of it, with the next row's logits and the KV
 * pool's free blocks. */
static void test_tree_logits_and_commit(void **state)
{
    (void)state;
    int32_t prompt[NP], tok[ROWS], par[ROWS];
    tu_spec_ids(prompt, NP);
    tree_of(tok, par);
    struct sil_error err = {0};
    for (size_t a = 0; a < N_TREE; a++) {
        struct sil_engine *e = tu_spec_engine(tree_archs[a], 3, 0, false, NULL);
        const size_t V = (size_t)sil_engine_info(e)->n_vocab;
        float *lt = malloc(sizeof(float) * V * ROWS), *lp = malloc(sizeof(float) * V * (D + 1)),
              *x = malloc(sizeof(float) * V), *y = malloc(sizeof(float) * V);
        for (int32_t keep_j = 0; keep_j < W; keep_j++) {
            int s = new_seq(e);
            assert_int_equal(eval_rows(e, s, prompt, 64, NULL, NULL, &err), 0);
            assert_int_equal(eval_rows(e, s, prompt + 64, NP - 64, NULL, NULL, &err), 0);
            assert_int_equal(sil_seq_spec_begin(e, s, &err), 0);
            if (eval_rows(e, s, tok, ROWS, par, lt, &err) < 0) fail_msg("tree: %s", err.msg);
            for (int32_t j = 0; j < W; j++) {
                int r = new_seq(e);
                assert_int_equal(eval_rows(e, r, prompt, 64, NULL, NULL, &err), 0);
                assert_int_equal(eval_rows(e, r, prompt + 64, NP - 64, NULL, NULL, &err), 0);
                int32_t path[D + 1] = {tok[0]};
                memcpy(path + 1, tok + 1 + j * D, sizeof(int32_t) * D);
                assert_int_equal(eval_rows(e, r, path, D + 1, NULL, lp, &err), 0);
                for (int32_t i = 0; i <= D; i++) {
                    const int32_t row = i == 0 ? 0 : 1 + j * D + i - 1;
                    if (memcmp(lt + (size_t)row * V, lp + (size_t)i * V, sizeof(float) * V))
                        fail_msg("%s: tree row %d differs from its path's row %d", tree_archs[a],
                                 row, i);
                }
                sil_seq_free(e, r);
            }
            /* keep the root and the first two nodes of branch keep_j */
            const int32_t keep[3] = {0, 1 + keep_j * D, 2 + keep_j * D};
            assert_int_equal(sil_seq_spec_commit_path(e, s, keep, 3, &err), 0);
            assert_int_equal(sil_seq_len(e, s), NP + 3);
            const int32_t next = 99;
            assert_int_equal(eval_rows(e, s, &next, 1, NULL, x, &err), 0);
            int r = new_seq(e);
            /* the recurrent state's bytes (0 attention-only): s also keeps its window's and
             * its tree's branch point's */
            const uint64_t rs = sil_seq_memory(e, r);
            assert_int_equal(eval_rows(e, r, prompt, 64, NULL, NULL, &err), 0);
            assert_int_equal(eval_rows(e, r, prompt + 64, NP - 64, NULL, NULL, &err), 0);
            const int32_t path[4] = {tok[0], tok[keep[1]], tok[keep[2]], next};
            assert_int_equal(eval_rows(e, r, path, 3, NULL, NULL, &err), 0);
            assert_int_equal(eval_rows(e, r, path + 3, 1, NULL, y, &err), 0);
            if (memcmp(x, y, sizeof(float) * V))
                fail_msg("%s: after committing branch %d the logits differ from its path's",
                         tree_archs[a], keep_j);
            assert_int_equal(sil_seq_memory(e, s), sil_seq_memory(e, r) + 2 * rs);
            sil_seq_free(e, r);
            sil_seq_free(e, s);
            struct sil_kv_info ki;
            sil_engine_kv_info(e, &ki);
            assert_int_equal(ki.n_free, ki.n_blocks); /* every block back */
        }
        free(lt);
        free(lp);
        free(x);
        free(y);
        sil_engine_close(e);
    }
}

/* Several sequences' trees in one batch, after a plain sequence's rows, so that a tree spans
 * two micro-batches (cut inside a branch, or just before one starts): each node's logits are
 * those of its tree evaluated alone. */
static void test_tree_batches(void **state)
{
    (void)state;
    enum { BW = 7, BD = 9, BR = 1 + BW * BD, NB = 20 };
    int32_t tok[BR], par[BR], prompt[2][NB], plain[40];
    tok[0] = 7;
    par[0] = -1;
    for (int32_t j = 0; j < BW; j++)
        for (int32_t i = 0; i < BD; i++) {
            const int32_t r = 1 + j * BD + i;
            tok[r] = 20 + 31 * j + 5 * i;
            par[r] = i == 0 ? 0 : r - 1;
        }
    tu_spec_ids(prompt[0], NB);
    tu_spec_ids(prompt[1], NB);
    for (int32_t i = 0; i < NB; i++)
        prompt[1][i] = 1 + (prompt[1][i] * 3) % 500;
    tu_spec_ids(plain, 40);
    struct sil_error err = {0};
    for (size_t a = 0; a < N_TREE; a++) {
        struct sil_engine *e = tu_spec_engine(tree_archs[a], 6, 0, false, NULL);
        const size_t V = (size_t)sil_engine_info(e)->n_vocab;
        float *alone = malloc(sizeof(float) * V * BR * 2), *both = malloc(sizeof(float) * V * BR * 2);
        int ts[2];
        for (int k = 0; k < 2; k++) {
            ts[k] = new_seq(e);
            assert_int_equal(eval_rows(e, ts[k], prompt[k], NB, NULL, NULL, &err), 0);
            assert_int_equal(sil_seq_spec_begin(e, ts[k], &err), 0);
            if (eval_rows(e, ts[k], tok, BR, par, alone + (size_t)k * BR * V, &err) < 0)
                fail_msg("%s: tree: %s", tree_archs[a], err.msg);
            sil_seq_free(e, ts[k]);
        }
        /* 30 plain rows: micro-batch 128 cuts the second tree in a branch; 27: before one */
        for (int32_t na = 27; na <= 30; na += 3) {
            int32_t bt[40 + 2 * BR], bp[40 + 2 * BR], bs[40 + 2 * BR], bpar[40 + 2 * BR];
            bool bw[40 + 2 * BR];
            int ps = new_seq(e);
            for (int32_t i = 0; i < na; i++) {
                bt[i] = plain[i];
                bp[i] = i;
                bs[i] = ps;
                bpar[i] = -1;
                bw[i] = false;
            }
            for (int k = 0; k < 2; k++) {
                ts[k] = new_seq(e);
                assert_int_equal(eval_rows(e, ts[k], prompt[k], NB, NULL, NULL, &err), 0);
                assert_int_equal(sil_seq_spec_begin(e, ts[k], &err), 0);
                for (int32_t r = 0; r < BR; r++) {
                    const int32_t i = na + k * BR + r;
                    bt[i] = tok[r];
                    bp[i] = NB + r;
                    bs[i] = ts[k];
                    bpar[i] = par[r] < 0 ? -1 : na + k * BR + par[r];
                    bw[i] = true;
                }
            }
            const struct sil_batch b = {na + 2 * BR, bt, bp, bs, bw};
            if (sil_engine_eval_tree(e, &b, bpar, both, NULL, &err) < 0)
                fail_msg("%s: trees: %s", tree_archs[a], err.msg);
            for (int32_t r = 0; r < 2 * BR; r++)
                if (memcmp(alone + (size_t)r * V, both + (size_t)r * V, sizeof(float) * V))
                    fail_msg("%s, %d plain rows: tree %d's row %d differs from its tree's alone",
                             tree_archs[a], na, r / BR, r % BR);
            for (int k = 0; k < 2; k++)
                sil_seq_free(e, ts[k]);
            sil_seq_free(e, ps);
        }
        free(alone);
        free(both);
        sil_engine_close(e);
    }
}

/* Bad uses: outside a window, a parent of another sequence or a later row, a plain row after a
 * tree in its window, a path that does not rise; models with recurrent layers refuse a tree
 * that branches at two nodes, and take one that branches at one. */
static void test_tree_errors(void **state)
{
    (void)state;
    int32_t tok[ROWS], par[ROWS], prompt[8];
    tree_of(tok, par);
    tu_spec_ids(prompt, 8);
    struct sil_error err = {0};
    struct sil_engine *e = tu_spec_engine(tree_archs[1], 2, 0, false, NULL);
    int s = new_seq(e);
    assert_int_equal(eval_rows(e, s, prompt, 8, NULL, NULL, &err), 0);
    assert_int_equal(eval_rows(e, s, tok, ROWS, par, NULL, &err), -EINVAL); /* no window */
    assert_int_equal(sil_seq_len(e, s), 8);
    assert_int_equal(sil_seq_spec_begin(e, s, &err), 0);
    int32_t bad[ROWS];
    memcpy(bad, par, sizeof(bad));
    bad[2] = 5; /* a later row */
    assert_int_equal(eval_rows(e, s, tok, ROWS, bad, NULL, &err), -EINVAL);
    assert_int_equal(sil_seq_len(e, s), 8);
    assert_int_equal(eval_rows(e, s, tok, ROWS, par, NULL, &err), 0);
    assert_int_equal(eval_rows(e, s, tok, 1, NULL, NULL, &err), -EINVAL); /* after a tree */
    const int32_t down[2] = {0, 0};
    assert_int_equal(sil_seq_spec_commit_path(e, s, down, 2, &err), -EINVAL);
    const int32_t keep[2] = {0, 1 + D};
    assert_int_equal(sil_seq_spec_commit_path(e, s, keep, 2, &err), 0);
    assert_int_equal(sil_seq_len(e, s), 10);
    assert_int_equal(eval_rows(e, s, tok, 1, NULL, NULL, &err), 0); /* plain again */
    sil_engine_close(e);

    struct sil_engine *h = tu_spec_engine("qwen35-tiny-Q4_K_M", 2, 0, false, NULL);
    assert_true(sil_engine_has_tree(h));
    s = new_seq(h);
    assert_int_equal(eval_rows(h, s, prompt, 8, NULL, NULL, &err), 0);
    assert_int_equal(sil_seq_spec_begin(h, s, &err), 0);
    /* branches at the root and at row 1 */
    const int32_t two[5] = {-1, 0, 1, 1, 0};
    assert_int_equal(eval_rows(h, s, tok, 5, two, NULL, &err), -ENOTSUP);
    assert_non_null(strstr(err.msg, "branch at one node"));
    assert_int_equal(sil_seq_len(h, s), 8);
    /* at row 1 only, its first child next: fine */
    const int32_t one[5] = {-1, 0, 1, 1, 3};
    assert_int_equal(eval_rows(h, s, tok, 5, one, NULL, &err), 0);
    assert_int_equal(eval_rows(h, s, tok, 1, NULL, NULL, &err), -EINVAL); /* after a tree */
    const int32_t path[3] = {0, 1, 3};
    assert_int_equal(sil_seq_spec_commit_path(h, s, path, 3, &err), 0);
    assert_int_equal(sil_seq_len(h, s), 11);
    struct sil_spec sp;
    int ds = new_seq(h);
    assert_int_equal(sil_spec_init(&sp, h, s, h, ds, 3, &err), 0);
    assert_int_equal(sil_spec_set_width(&sp, 2, &err), 0);
    assert_int_equal(sil_spec_set_width(&sp, 1, &err), 0);
    sil_spec_free(&sp);
    sil_engine_close(h);
}

/* Plain greedy decoding of n tokens after prompt. */
static void plain_greedy(struct sil_engine *e, const int32_t *prompt, int32_t np, int32_t n,
                         int32_t *out)
{
    struct sil_error err = {0};
    int s = new_seq(e);
    assert_int_equal(eval_rows(e, s, prompt, np - 1, NULL, NULL, &err), 0);
    int32_t prev = prompt[np - 1];
    for (int32_t i = 0; i < n; i++) {
        int32_t pos = sil_seq_len(e, s);
        const struct sil_batch b = {1, &prev, &pos, &s, NULL};
        assert_int_equal(sil_engine_eval_out(e, &b, NULL, &out[i], NULL, &err), 0);
        prev = out[i];
    }
    sil_seq_free(e, s);
}

/* Tree steps of several shapes with drafters that agree (the target itself), partly (the same
 * weights in F32 with KV4) and hardly (another architecture): plain greedy decoding's tokens,
 * and with the target as drafter every step a whole branch. */
static void test_tree_greedy(void **state)
{
    (void)state;
    enum { P = 12, N = 40 };
    int32_t prompt[P], plain[N], hist[P + N + 64];
    tu_spec_ids(prompt, P);
    const int32_t shapes[][2] = {{2, 3}, {3, 2}, {4, 4}};
    struct sil_error err = {0};
    for (size_t a = 0; a < N_TREE; a++) {
        struct sil_engine *t = tu_spec_engine(tree_archs[a], 2, 0, false, NULL);
        plain_greedy(t, prompt, P, N, plain);
        const struct {
            const char *model;
            bool exact;
            const char *kv;
        } dr[] = {{tree_archs[a], false, NULL},
                  {tree_archs[a], true, "q4_0"},
                  {tree_archs[(a + 1) % N_TREE], false, NULL}};
        for (size_t k = 0; k < 3; k++) {
            struct sil_engine *d = tu_spec_engine(dr[k].model, 1, 0, dr[k].exact, dr[k].kv);
            for (size_t sh = 0; sh < 3; sh++) {
                int ts = new_seq(t), ds = new_seq(d);
                struct sil_spec sp;
                assert_int_equal(sil_spec_init(&sp, t, ts, d, ds, shapes[sh][1], &err), 0);
                if (sil_spec_set_width(&sp, shapes[sh][0], &err) < 0)
                    fail_msg("width: %s", err.msg);
                memcpy(hist, prompt, sizeof(prompt));
                assert_int_equal(eval_rows(t, ts, prompt, P - 1, NULL, NULL, &err), 0);
                int32_t nh = P;
                while (nh < P + N) {
                    const int rc = sil_spec_step(&sp, hist, nh, P + N - nh, hist + nh, &err);
                    if (rc < 0) fail_msg("step: %s", err.msg);
                    nh += rc;
                    assert_int_equal(sil_seq_len(t, ts), nh - 1);
                }
                for (int32_t i = 0; i < N; i++)
                    if (hist[P + i] != plain[i])
                        fail_msg("%s drafted by %s, tree %dx%d: token %d is %d, plain %d",
                                 tree_archs[a], dr[k].model, shapes[sh][0], shapes[sh][1], i,
                                 hist[P + i], plain[i]);
                printf("%s drafted by %s%s, tree %dx%d: %llu steps, %llu accepted, %.2f tokens "
                       "a step, %.2f of %.2f experts a MoE layer\n",
                       tree_archs[a], dr[k].model, dr[k].exact ? " (exact, kv q4_0)" : "",
                       shapes[sh][0], shapes[sh][1], (unsigned long long)sp.stats.steps,
                       (unsigned long long)sp.stats.accepted,
                       (double)sp.stats.emitted / (double)sp.stats.steps,
                       sp.stats.moe_layers
                           ? (double)sp.stats.expert_union / (double)sp.stats.moe_layers
                           : 0.0,
                       sp.stats.moe_layers
                           ? (double)sp.stats.expert_pairs / (double)sp.stats.moe_layers
                           : 0.0);
                if (k == 0) /* every step a whole branch but near the end */
                    assert_true(sp.stats.accepted + sp.stats.steps >= (uint64_t)N - 2);
                sil_spec_free(&sp);
                sil_seq_free(t, ts);
                sil_seq_free(d, ds);
            }
            sil_engine_close(d);
        }
        sil_engine_close(t);
    }
}

int main(void)
{
    if (!tu_refdata_exists("models/qwen3-tiny-Q8_0.gguf")) {
        if (tu_ci()) {
            fprintf(stderr, "test_spec_tree: reference data missing under %s (CI=true)\n",
                    tu_shared_dir());
            return 1;
        }
        fprintf(stderr, "test_spec_tree: no reference data under %s: skipped\n", tu_shared_dir());
        return 0;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tree_logits_and_commit),
        cmocka_unit_test(test_tree_batches),
        cmocka_unit_test(test_tree_errors),
        cmocka_unit_test(test_tree_greedy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
