/* The prefix cache (prefix_cache.h, engine.h's sil_seq_prefix_*): the hash chain, publish and
 * match over a kv cache, collisions planted by hand never matching, LRU eviction from a chain's
 * end, snapshots (clamping, LRU, bytes); and on the refdata models, a prefix hit gives the very
 * logits of a cold run: bit for bit on the hybrid models (KV blocks + recurrent snapshot), also
 * when the hit must clamp to an earlier snapshot, and on an attention-only model without any. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/kv_cache.h"
#include "daemon/engine/prefix_cache.h"
#include "tests/testutil.h"

#define BL SIL_KV_BLOCK

static uint64_t rng = 88172645463325252ull;
static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static void fill(int32_t *t, size_t n, int32_t vocab)
{
    for (size_t i = 0; i < n; i++)
        t[i] = (int32_t)(next_rand() % (uint32_t)vocab);
}

/* hashes[i] = chain hash of block i of t */
static void chain(const int32_t *t, int nb, uint64_t *hashes)
{
    uint64_t h = sil_prefix_root(0);
    for (int i = 0; i < nb; i++)
        hashes[i] = h = sil_prefix_hash(h, t + (size_t)i * BL);
}

static void test_hash_chain(void **state)
{
    (void)state;
    int32_t a[8 * BL], b[8 * BL];
    uint64_t ha[8], hb[8], hc[8];
    fill(a, 8 * BL, 150000);
    memcpy(b, a, sizeof a);
    chain(a, 8, ha);
    chain(b, 8, hb);
    assert_memory_equal(ha, hb, sizeof ha); /* same tokens, same hashes */
    for (int blk = 0; blk < 8; blk++) {
        for (int at = 0; at < BL; at += 21) {
            memcpy(b, a, sizeof a);
            b[blk * BL + at] ^= 1; /* one token changed */
            chain(b, 8, hc);
            for (int i = 0; i < 8; i++) {
                if (i < blk)
                    assert_true(hc[i] == ha[i]);
                else
                    assert_true(hc[i] != ha[i]);
            }
        }
    }
    /* Two tokens swapped, and the same block after another parent: other hashes. */
    memcpy(b, a, sizeof a);
    int32_t t = b[3];
    b[3] = b[4];
    b[4] = t;
    if (b[3] != b[4]) assert_true(sil_prefix_hash(sil_prefix_root(0), b) != ha[0]);
    assert_true(sil_prefix_hash(ha[0], a) != ha[0]);
    /* 20000 random blocks: all distinct, bits balanced. */
    enum { N = 20000 };
    uint64_t *h = malloc(N * sizeof(*h));
    int ones = 0;
    for (int i = 0; i < N; i++) {
        fill(b, BL, 150000);
        h[i] = sil_prefix_hash(sil_prefix_root(0), b);
        ones += __builtin_popcountll(h[i]);
        for (int k = 0; k < i; k += 97)
            assert_true(h[k] != h[i]);
    }
    assert_true(fabs(ones / (64.0 * N) - 0.5) < 0.01);
    free(h);
}

static struct sil_kv_cache *make_kv(int32_t n_seq, int32_t n_ctx, int32_t blocks)
{
    struct sil_kv_config c = {.n_layer = 1,
                              .n_seq_max = n_seq,
                              .n_ctx = n_ctx,
                              .n_embd_k = 32,
                              .n_embd_v = 32,
                              .head_dim = 32,
                              .type = SIL_KV_F32};
    struct sil_kv_cache *probe = NULL, *kv = NULL;
    struct sil_error err = {0};
    assert_int_equal(sil_kv_create(&probe, &c, &err), 0);
    c.budget = sil_kv_block_bytes(probe) * (uint64_t)blocks;
    sil_kv_free(probe);
    assert_int_equal(sil_kv_create(&kv, &c, &err), 0);
    assert_int_equal(sil_kv_n_blocks(kv), blocks);
    return kv;
}

/* Publish, match, a shared attach, cached blocks outliving their sequence, LRU from the end. */
static void test_publish_match_evict(void **state)
{
    (void)state;
    struct sil_kv_cache *kv = make_kv(4, 16 * BL, 8);
    struct sil_prefix_cache *pc;
    struct sil_error err = {0};
    assert_int_equal(sil_prefix_create(&pc, kv, 0, 0, &err), 0);
    int32_t t[8 * BL], blocks[8];
    fill(t, 8 * BL, 1000);
    struct sil_prefix_match m;
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_blocks, 0);
    /* Three and a half blocks evaluated: three published. */
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 3 * BL + 32, &err), 0);
    assert_int_equal(sil_prefix_publish(pc, 0, 0, t, 3 * BL + 32), 3);
    int32_t nb;
    const int32_t *tab = sil_kv_seq_table(kv, 0, &nb);
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_blocks, 3);
    assert_int_equal(m.n_usable, 3);
    assert_null(m.state);
    assert_memory_equal(blocks, tab, 3 * sizeof(int32_t));
    sil_prefix_match(pc, 0, t, 2, blocks, &m); /* bounded by max_blocks */
    assert_int_equal(m.n_blocks, 2);
    /* Publishing again changes nothing; a later token changed only shortens the match. */
    assert_int_equal(sil_prefix_publish(pc, 0, 0, t, 3 * BL), 3);
    assert_int_equal(sil_kv_n_hashed(kv), 3);
    int32_t u[8 * BL];
    memcpy(u, t, sizeof t);
    u[BL + 5]++;
    sil_prefix_match(pc, 0, u, 4, blocks, &m);
    assert_int_equal(m.n_blocks, 1);
    /* Another sequence attaches the chain: references, no copy. */
    sil_prefix_match(pc, 0, t, 3, blocks, &m);
    for (int i = 0; i < 3; i++)
        assert_int_equal(sil_kv_seq_attach(kv, 1, blocks[i], &err), 0);
    assert_int_equal(sil_kv_block_refs(kv, blocks[0]), 2);
    /* Both gone: the blocks stay cached and still match. */
    sil_kv_seq_release(kv, 0);
    sil_kv_seq_release(kv, 1);
    assert_int_equal(sil_kv_n_free(kv), 8);
    struct sil_prefix_info pi;
    sil_prefix_info(pc, &pi);
    assert_int_equal(pi.n_blocks, 3);
    assert_int_equal(pi.n_cached, 3);
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_blocks, 3);
    /* Pressure: 5 plain blocks are used first, then the chain goes from its end. */
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 5 * BL, &err), 0);
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_blocks, 3);
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 6 * BL, &err), 0);
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_blocks, 2);
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 7 * BL, &err), 0);
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_blocks, 1);
    assert_int_equal(sil_kv_n_hashed(kv), 1);
    /* A reused block that is published anew describes its new tokens only. */
    int32_t w[7 * BL], wb[7];
    fill(w, 7 * BL, 1000);
    assert_int_equal(sil_prefix_publish(pc, 2, 0, w, 7 * BL), 7);
    sil_prefix_match(pc, 0, w, 7, wb, &m);
    assert_int_equal(m.n_blocks, 7);
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_blocks, 1);
    assert_int_equal(sil_kv_n_hashed(kv), 8);
    sil_prefix_free(pc);
    sil_kv_free(kv);
}

/* A cap on cached blocks no sequence holds: the least recently freed go first, their pages back;
 * held blocks never count. */
static void test_cached_cap(void **state)
{
    (void)state;
    struct sil_kv_cache *kv = make_kv(4, 16 * BL, 16);
    struct sil_prefix_cache *pc;
    struct sil_error err = {0};
    assert_int_equal(sil_prefix_create(&pc, kv, 0, 0, &err), 0);
    sil_kv_set_cached_max(kv, 3);
    int32_t t[6 * BL], blocks[6];
    fill(t, 6 * BL, 1000);
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 6 * BL, &err), 0);
    assert_int_equal(sil_prefix_publish(pc, 0, 0, t, 6 * BL), 6);
    assert_int_equal(sil_kv_n_cached(kv), 0); /* all held */
    struct sil_prefix_match m;
    sil_prefix_match(pc, 0, t, 6, blocks, &m);
    assert_int_equal(m.n_blocks, 6);
    sil_kv_seq_release(kv, 0); /* freed from the end: blocks 5..0; the first 3 freed go */
    assert_int_equal(sil_kv_n_cached(kv), 3);
    assert_int_equal(sil_kv_n_hashed(kv), 3);
    sil_prefix_match(pc, 0, t, 6, blocks, &m);
    assert_int_equal(m.n_blocks, 3);
    assert_int_equal(sil_kv_n_free(kv), 16);
    /* Attached again: held, not counted; a lower cap trims at once. */
    for (int i = 0; i < 2; i++)
        assert_int_equal(sil_kv_seq_attach(kv, 1, blocks[i], &err), 0);
    assert_int_equal(sil_kv_n_cached(kv), 1);
    sil_kv_set_cached_max(kv, 0);
    assert_int_equal(sil_kv_n_cached(kv), 0);
    sil_prefix_match(pc, 0, t, 6, blocks, &m);
    assert_int_equal(m.n_blocks, 2);
    /* The pool still hands every block out. */
    sil_kv_seq_release(kv, 1);
    assert_int_equal(sil_kv_n_cached(kv), 0);
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 16 * BL, &err), 0);
    assert_int_equal(sil_kv_n_free(kv), 0);
    sil_prefix_free(pc);
    sil_kv_free(kv);
}

/* Blocks planted under another chain's hash (what a 64-bit collision would look like): the
 * stored tokens and the parent link refuse them. */
static void test_collision_refused(void **state)
{
    (void)state;
    struct sil_kv_cache *kv = make_kv(4, 8 * BL, 16);
    struct sil_prefix_cache *pc;
    struct sil_error err = {0};
    assert_int_equal(sil_prefix_create(&pc, kv, 0, 0, &err), 0);
    int32_t x[2 * BL], y[2 * BL];
    fill(x, 2 * BL, 1000);
    fill(y, 2 * BL, 1000);
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 2 * BL, &err), 0);
    assert_int_equal(sil_prefix_publish(pc, 0, 0, x, 2 * BL), 2);
    assert_int_equal(sil_kv_seq_reserve(kv, 1, BL, &err), 0);
    assert_int_equal(sil_prefix_publish(pc, 1, 0, y, BL), 1);
    int32_t nb, blocks[2];
    const int32_t *ta = sil_kv_seq_table(kv, 0, &nb);
    const int32_t *tb = sil_kv_seq_table(kv, 1, &nb);
    struct sil_prefix_match m;
    /* Block x0 findable under y0's hash: its tokens differ, refused (y0 itself is shadowed). */
    const uint64_t hy0 = sil_prefix_hash(sil_prefix_root(0), y);
    sil_kv_block_set_hash(kv, ta[0], hy0);
    sil_prefix_match(pc, 0, y, 1, blocks, &m);
    assert_int_equal(m.n_blocks, 0);
    sil_kv_block_set_hash(kv, tb[0], hy0); /* y0 back at the head of its bucket */
    sil_kv_block_set_hash(kv, ta[0], sil_prefix_hash(sil_prefix_root(0), x));
    sil_prefix_match(pc, 0, y, 1, blocks, &m);
    assert_int_equal(m.n_blocks, 1);
    /* Block x1 (tokens x[64..128)) findable as the child of y0 with the same tokens, as if the
     * parents' hashes collided: its parent is x0, not y0, so y0 + x1's tokens match one block. */
    int32_t yx[2 * BL];
    memcpy(yx, y, BL * sizeof(int32_t));
    memcpy(yx + BL, x + BL, BL * sizeof(int32_t));
    sil_kv_block_set_hash(kv, ta[1], sil_prefix_hash(hy0, x + BL));
    sil_prefix_match(pc, 0, yx, 2, blocks, &m);
    assert_int_equal(m.n_blocks, 1);
    assert_int_equal(blocks[0], tb[0]);
    /* Scopes: x's chain is not found from scope 7, not even under scope 7's hash of x0. */
    sil_prefix_match(pc, 7, x, 2, blocks, &m);
    assert_int_equal(m.n_blocks, 0);
    sil_kv_block_set_hash(kv, ta[0], sil_prefix_hash(sil_prefix_root(7), x));
    sil_prefix_match(pc, 7, x, 2, blocks, &m);
    assert_int_equal(m.n_blocks, 0);
    /* Published in scope 7 too (the same rows of another user): found there, and the first
     * scope's chain is intact beside it. */
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 2 * BL, &err), 0);
    assert_int_equal(sil_prefix_publish(pc, 2, 7, x, 2 * BL), 2);
    sil_prefix_match(pc, 7, x, 2, blocks, &m);
    assert_int_equal(m.n_blocks, 2);
    assert_int_equal(blocks[0], sil_kv_seq_table(kv, 2, &nb)[0]);
    assert_int_equal(sil_prefix_publish(pc, 0, 0, x, 2 * BL), 2); /* x0 gets its hash back */
    sil_prefix_match(pc, 0, x, 2, blocks, &m);
    assert_int_equal(m.n_blocks, 2);
    assert_int_equal(blocks[0], ta[0]);
    sil_prefix_free(pc);
    sil_kv_free(kv);
}

/* Snapshots: keyed by the chain's end, the match clamps to the longest with one, LRU within the
 * budget, dropped when their block is published anew, bytes counted. */
static void test_snapshots(void **state)
{
    (void)state;
    struct sil_kv_cache *kv = make_kv(4, 8 * BL, 16);
    struct sil_prefix_cache *pc;
    struct sil_error err = {0};
    const int64_t F = 5;
    assert_int_equal(sil_prefix_create(&pc, kv, F, 2 * F * sizeof(float) + 3, &err), 0);
    int32_t t[4 * BL], blocks[4];
    fill(t, 4 * BL, 1000);
    float s2[5] = {2, 2, 2, 2, 2}, s4[5] = {4, 4, 4, 4, 4}, s1[5] = {1, 1, 1, 1, 1};
    assert_int_equal(sil_prefix_snapshot(pc, 0, t, 2, s2, &err), -ENOENT); /* not published */
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 4 * BL, &err), 0);
    assert_int_equal(sil_prefix_publish(pc, 0, 0, t, 4 * BL), 4);
    struct sil_prefix_match m;
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_blocks, 4);
    assert_int_equal(m.n_usable, 0); /* no snapshot: nothing to resume from */
    assert_null(m.state);
    assert_int_equal(sil_prefix_snapshot(pc, 0, t, 2, s2, &err), 0);
    assert_int_equal(sil_prefix_snapshot(pc, 0, t, 4, s4, &err), 0);
    struct sil_prefix_info pi;
    sil_prefix_info(pc, &pi);
    assert_int_equal(pi.n_snapshots, 2);
    assert_int_equal(pi.snapshot_bytes, 2 * F * sizeof(float));
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_usable, 4);
    assert_true(m.state && m.state[0] == 4);
    sil_prefix_match(pc, 0, t, 3, blocks, &m); /* clamped to the snapshot at 2 */
    assert_int_equal(m.n_blocks, 3);
    assert_int_equal(m.n_usable, 2);
    assert_true(m.state && m.state[0] == 2);
    /* Full: the least recently used (after 4 blocks) goes for a new one after 1. */
    assert_int_equal(sil_prefix_snapshot(pc, 0, t, 1, s1, &err), 0);
    sil_prefix_info(pc, &pi);
    assert_int_equal(pi.n_snapshots, 2);
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_usable, 2);
    /* The sequence cut to 1.5 blocks and rewritten: block 1 loses its hash; the chain and the
     * snapshot after it can no longer be reached, and the sweep drops the snapshot. */
    sil_kv_seq_trim(kv, 0, BL + 10);
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 2 * BL, &err), 0);
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_blocks, 1);
    assert_int_equal(m.n_usable, 1);
    assert_true(m.state && m.state[0] == 1);
    sil_prefix_info(pc, &pi);
    assert_int_equal(pi.n_snapshots, 1);
    /* A new chain over the same block ids drops what followed their old publication. */
    int32_t u[2 * BL];
    fill(u, 2 * BL, 1000);
    assert_int_equal(sil_prefix_publish(pc, 0, 0, u, 2 * BL), 2);
    sil_prefix_info(pc, &pi);
    assert_int_equal(pi.n_snapshots, 0);
    sil_prefix_match(pc, 0, t, 4, blocks, &m);
    assert_int_equal(m.n_blocks, 0);
    sil_prefix_free(pc);
    sil_kv_free(kv);
}

/* ---- on the refdata models ---------------------------------------------------------------- */

static struct sil_engine *open_model(const char *model, bool exact, uint64_t ckpt_budget)
{
    struct sil_engine_params p;
    sil_engine_params_default(&p);
    p.n_threads = 2;
    p.exact = exact;
    p.n_seq_max = 4;
    p.n_ctx = 1024;
    p.prefix_ckpt_budget = ckpt_budget;
    struct sil_error err = {0};
    struct sil_engine *e = NULL;
    if (tu_open_refdata_engine(&e, model, &p, &err) < 0) fail_msg("open %s: %s", model, err.msg);
    return e;
}

/* ids[from, to) on seq in chunks ending at the given cuts (ascending, ending with to); every
 * row's logits into lg + row * V (lg may be NULL). */
static void eval_cuts(struct sil_engine *e, int seq, const int32_t *ids, int32_t from,
                      const int32_t *cuts, int n_cuts, float *lg)
{
    const int32_t V = sil_engine_info(e)->n_vocab;
    struct sil_error err = {0};
    for (int c = 0; c < n_cuts; c++) {
        const int32_t to = cuts[c];
        if (to <= from) continue;
        const int32_t n = to - from;
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)n),
                *sq = malloc(sizeof(int32_t) * (size_t)n);
        bool *want = malloc(sizeof(bool) * (size_t)n);
        for (int32_t i = 0; i < n; i++) {
            pos[i] = from + i;
            sq[i] = seq;
            want[i] = lg != NULL;
        }
        struct sil_batch b = {n, ids + from, pos, sq, want};
        if (sil_engine_eval(e, &b, lg ? lg + (size_t)from * V : NULL, &err) < 0)
            fail_msg("eval: %s", err.msg);
        free(pos);
        free(sq);
        free(want);
        from = to;
    }
}

/* A sequence evaluating ids in chunks ending at cuts, publishing (with snapshots) after each. */
static void publish_run(struct sil_engine *e, const int32_t *ids, const int32_t *cuts, int n_cuts)
{
    struct sil_error err = {0};
    int seq = sil_seq_create(e, &err);
    assert_true(seq >= 0);
    int32_t from = 0;
    for (int c = 0; c < n_cuts; c++) {
        eval_cuts(e, seq, ids, from, cuts + c, 1, NULL);
        from = cuts[c];
        assert_int_equal(sil_seq_prefix_publish(e, seq, 0, ids, from, true, &err), 0);
    }
    sil_seq_free(e, seq); /* its blocks stay cached */
}

/* The cold logits of ids[0, n) evaluated in chunks ending at cuts, rows [from, n). */
static float *cold_logits(struct sil_engine *e, const int32_t *ids, const int32_t *cuts, int n_cuts)
{
    const int32_t V = sil_engine_info(e)->n_vocab, n = cuts[n_cuts - 1];
    struct sil_error err = {0};
    float *lg = malloc(sizeof(float) * (size_t)V * (size_t)n);
    int seq = sil_seq_create(e, &err);
    assert_true(seq >= 0);
    eval_cuts(e, seq, ids, 0, cuts, n_cuts, lg);
    sil_seq_free(e, seq);
    return lg;
}

/* Reuses what the cache offers for ids[0, n), checks the reused length, evaluates the rest in
 * chunks ending at cuts and compares every evaluated row's logits with cold, bit for bit. */
static void warm_vs_cold(struct sil_engine *e, const char *what, const int32_t *ids,
                         const int32_t *cuts, int n_cuts, int32_t want_reused, const float *cold)
{
    const int32_t V = sil_engine_info(e)->n_vocab, n = cuts[n_cuts - 1];
    struct sil_error err = {0};
    int seq = sil_seq_create(e, &err);
    assert_true(seq >= 0);
    int32_t reused = -1;
    assert_int_equal(sil_seq_prefix_reuse(e, seq, 0, ids, n, &reused, &err), 0);
    if (reused != want_reused)
        fail_msg("%s: reused %d positions, want %d", what, reused, want_reused);
    assert_int_equal(sil_seq_len(e, seq), reused);
    float *lg = calloc((size_t)V * (size_t)n, sizeof(float));
    eval_cuts(e, seq, ids, reused, cuts, n_cuts, lg);
    size_t off = (size_t)reused * V, cnt = (size_t)(n - reused) * V, bad = 0;
    double worst = 0;
    for (size_t i = 0; i < cnt; i++) {
        bad += memcmp(&lg[off + i], &cold[off + i], sizeof(float)) != 0;
        worst = fmax(worst, fabs((double)lg[off + i] - cold[off + i]));
    }
    if (bad)
        fail_msg("%s: %zu of %zu logits differ from the cold run (max %g)", what, bad, cnt, worst);
    printf("%s: %d of %d positions reused, %d rows bit-identical to the cold run\n", what, reused,
           n, n - reused);
    free(lg);
    sil_seq_free(e, seq);
}

/* A = 256 tokens published with snapshots after 128 and 256 (the daemon's boundaries: every
 * 2 blocks here, and the prompt's last full block); then
 * - A + B (100 more): reuses all of A, the rest bit-identical to a cold run split the same way;
 * - A[0, 192) + C: 3 blocks cached but the recurrence resumes only at 128 (clamped);
 * - the cold run split once at the reused length against one batch: the same within 1e-4 (the
 *   split itself is the only difference), printed.
 * On an attention-only model the second case reuses all 192 positions. */
static void prefix_hit_exact(const char *model, bool exact)
{
    struct sil_engine *e = open_model(model, exact, 64u << 20);
    const bool recr = sil_engine_recurrent(e);
    const int32_t V = sil_engine_info(e)->n_vocab;
    int32_t ab[356], ac[300];
    fill(ab, 356, V);
    memcpy(ac, ab, 192 * sizeof(int32_t));
    fill(ac + 192, 300 - 192, V);
    const int32_t pub[] = {128, 256};
    publish_run(e, ab, pub, 2);
    struct sil_prefix_stats ps;
    sil_engine_prefix_stats(e, &ps);
    assert_int_equal(ps.n_blocks, 4);
    assert_int_equal(ps.n_snapshots, recr ? 2 : 0);
    struct sil_kv_info ki;
    sil_engine_kv_info(e, &ki);
    assert_true(ps.cached_bytes == 4 * BL * ki.bytes_per_pos); /* its sequence is gone */
    char what[160];

    const int32_t cut_ab[] = {256, 356};
    float *cold = cold_logits(e, ab, cut_ab, 2);
    snprintf(what, sizeof what, "%s%s A+B", model, exact ? " exact" : "");
    warm_vs_cold(e, what, ab, cut_ab, 2, 256, cold);
    /* The split at the hit against one batch: close, so a hit is also a cold run's answer. */
    const int32_t one[] = {356};
    float *whole = cold_logits(e, ab, one, 1);
    double worst = 0;
    for (size_t i = (size_t)256 * V; i < (size_t)356 * V; i++)
        worst = fmax(worst, fabs((double)whole[i] - cold[i]));
    printf("%s: split at 256 vs one batch: max diff %.3g\n", what, worst);
    assert_true(worst < (exact ? 1e-4 : 2e-2));
    free(whole);
    free(cold);

    const int32_t reuse_c = recr ? 128 : 192;
    const int32_t cut_ac[] = {reuse_c, 300};
    cold = cold_logits(e, ac, cut_ac, 2);
    snprintf(what, sizeof what, "%s%s A[0,192)+C", model, exact ? " exact" : "");
    warm_vs_cold(e, what, ac, cut_ac, 2, reuse_c, cold);
    free(cold);

    sil_engine_prefix_stats(e, &ps);
    assert_int_equal(ps.hits, 2);
    assert_int_equal(ps.tokens_reused, 256 + reuse_c);
    /* A prompt of other tokens misses; so does a prompt that is only A (the last token must be
     * evaluated: at most 3 blocks of it, the snapshot after 2). */
    int32_t other[200];
    fill(other, 200, V);
    struct sil_error err = {0};
    int seq = sil_seq_create(e, &err);
    int32_t reused = -1;
    assert_int_equal(sil_seq_prefix_reuse(e, seq, 0, other, 200, &reused, &err), 0);
    assert_int_equal(reused, 0);
    assert_int_equal(sil_seq_prefix_reuse(e, seq, 0, ab, 256, &reused, &err), 0);
    assert_int_equal(reused, recr ? 128 : 192);
    assert_int_equal(sil_seq_prefix_reuse(e, seq, 0, ab, 256, &reused, &err),
                     -EINVAL); /* not fresh */
    sil_seq_free(e, seq);
    seq = sil_seq_create(e, &err); /* another scope: nothing */
    assert_int_equal(sil_seq_prefix_reuse(e, seq, 1000, ab, 356, &reused, &err), 0);
    assert_int_equal(reused, 0);
    sil_seq_free(e, seq);
    sil_engine_prefix_stats(e, &ps);
    assert_int_equal(ps.misses, 2);
    sil_engine_close(e);
}

static void test_hit_equals_cold(void **state)
{
    (void)state;
    prefix_hit_exact("qwen35moe-tiny-Q4_K_M", false);
    prefix_hit_exact("qwen35-tiny-Q4_K_M", false);
    prefix_hit_exact("qwen35-tiny-Q4_K_M", true);
    prefix_hit_exact("qwen3-tiny-Q8_0", false);
}

/* Blocks shared with a sequence that is still live: it is cut back into a shared block and
 * writes there (a copy, the reader's rows untouched), and the reader continues bit for bit as a
 * cold run; the chain stays findable. Attention-only model (a cut needs no checkpoint). */
static void test_shared_with_live_writer(void **state)
{
    (void)state;
    struct sil_engine *e = open_model("qwen3-tiny-Q8_0", false, 0);
    const int32_t V = sil_engine_info(e)->n_vocab;
    int32_t a[300], ab[356], c[150];
    fill(a, 300, V);
    memcpy(ab, a, 256 * sizeof(int32_t));
    fill(ab + 256, 100, V);
    memcpy(c, a, 100 * sizeof(int32_t));
    fill(c + 100, 50, V);
    struct sil_error err = {0};
    int w = sil_seq_create(e, &err);
    const int32_t all[] = {300};
    eval_cuts(e, w, a, 0, all, 1, NULL);
    assert_int_equal(sil_seq_prefix_publish(e, w, 0, a, 300, true, &err), 0);
    int r = sil_seq_create(e, &err);
    int32_t reused = -1;
    assert_int_equal(sil_seq_prefix_reuse(e, r, 0, ab, 356, &reused, &err), 0);
    assert_int_equal(reused, 256);
    /* The writer goes back to 100 and writes 50 other tokens into the shared block 1. */
    assert_int_equal(sil_seq_truncate(e, w, 100, &err), 0);
    const int32_t to150[] = {150};
    float *lw = calloc((size_t)V * 150, sizeof(float));
    eval_cuts(e, w, c, 100, to150, 1, lw);
    const int32_t cut_c[] = {100, 150};
    float *cold_c = cold_logits(e, c, cut_c, 2);
    double worst = 0;
    for (size_t i = (size_t)100 * V; i < (size_t)150 * V; i++)
        worst = fmax(worst, fabs((double)lw[i] - cold_c[i]));
    assert_true(worst < 1e-4);
    /* The reader's rows were not touched: bit for bit as cold. */
    const int32_t cut_ab[] = {256, 356};
    float *cold = cold_logits(e, ab, cut_ab, 2);
    float *lr = calloc((size_t)V * 356, sizeof(float));
    eval_cuts(e, r, ab, 256, cut_ab + 1, 1, lr);
    assert_memory_equal(lr + (size_t)256 * V, cold + (size_t)256 * V, sizeof(float) * 100 * V);
    /* The chain of a is still findable (the reader holds its original blocks). */
    int s = sil_seq_create(e, &err);
    assert_int_equal(sil_seq_prefix_reuse(e, s, 0, ab, 300, &reused, &err), 0);
    assert_int_equal(reused, 256);
    printf("a writer cut into a shared block (max diff vs cold %.3g); the reader bit-identical\n",
           worst);
    free(lw);
    free(cold_c);
    free(cold);
    free(lr);
    sil_engine_close(e);
}

/* A hybrid model without a snapshot budget never reuses KV: the recurrence could not resume. */
static void test_hybrid_needs_snapshot(void **state)
{
    (void)state;
    struct sil_engine *e = open_model("qwen35-tiny-Q4_K_M", false, 0);
    const int32_t V = sil_engine_info(e)->n_vocab;
    int32_t ids[200];
    fill(ids, 200, V);
    const int32_t pub[] = {128};
    publish_run(e, ids, pub, 1);
    struct sil_error err = {0};
    int seq = sil_seq_create(e, &err);
    int32_t reused = -1;
    assert_int_equal(sil_seq_prefix_reuse(e, seq, 0, ids, 200, &reused, &err), 0);
    assert_int_equal(reused, 0);
    struct sil_prefix_stats ps;
    sil_engine_prefix_stats(e, &ps);
    assert_int_equal(ps.n_blocks, 2);
    assert_int_equal(ps.n_snapshots, 0);
    assert_int_equal(ps.misses, 1);
    sil_engine_close(e);
}

int main(void)
{
    const struct CMUnitTest unit[] = {
        cmocka_unit_test(test_hash_chain), cmocka_unit_test(test_publish_match_evict),
        cmocka_unit_test(test_cached_cap), cmocka_unit_test(test_collision_refused),
        cmocka_unit_test(test_snapshots),
    };
    int rc = cmocka_run_group_tests(unit, NULL, NULL);
    if (!tu_refdata_exists("models/qwen35-tiny-Q4_K_M.gguf")) {
        fprintf(stderr, "test_prefix_cache: no reference data under %s: model tests skipped\n",
                tu_shared_dir());
        return rc;
    }
    const struct CMUnitTest models[] = {
        cmocka_unit_test(test_hit_equals_cold),
        cmocka_unit_test(test_hybrid_needs_snapshot),
        cmocka_unit_test(test_shared_with_live_writer),
    };
    return rc | cmocka_run_group_tests(models, NULL, NULL);
}
