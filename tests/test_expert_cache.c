/* Expert cache policy and heat map: each policy's hits, fills and evictions on hand-built
 * sequences whose answers are worked out in the comments; pinning within a plan; a plan wider
 * than the pool; counters; global vs per-layer pools; random plans against the invariants; LRU
 * vs the static hottest set on traces with and without reuse; heat map round trip, corrupted,
 * truncated and mismatched files. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/expert_cache.h"
#include "daemon/engine/expert_heat.h"
#include "daemon/engine/model.h"
#include "daemon/engine/route_obs.h"
#include "daemon/engine/route_trace.h"
#include "tests/testutil.h"

static struct sil_ecache *mk_stage(int32_t L, int32_t X, int32_t slots,
                                   enum sil_ecache_policy pol, enum sil_ecache_pools pools,
                                   double half_life, double protect, int32_t n_stage)
{
    struct sil_ecache_config c = {.n_layer = L,
                                  .n_stage = n_stage,
                                  .n_expert = X,
                                  .n_slot = slots,
                                  .policy = pol,
                                  .pools = pools,
                                  .half_life = half_life,
                                  .protect = protect,
                                  .expert_bytes = 1000};
    struct sil_ecache *e = NULL;
    struct sil_error err = {0};
    assert_int_equal(sil_ecache_create(&e, &c, &err), 0);
    return e;
}

static struct sil_ecache *mk(int32_t L, int32_t X, int32_t slots, enum sil_ecache_policy pol,
                             enum sil_ecache_pools pools, double half_life, double protect)
{
    return mk_stage(L, X, slots, pol, pools, half_life, protect, 0);
}

/* One single-expert plan at layer l; returns the entry. */
static struct sil_ecache_entry one(struct sil_ecache *c, int32_t l, int32_t e)
{
    struct sil_ecache_entry r;
    int rc = sil_ecache_lookup(c, l, &e, NULL, 1, &r);
    assert_true(rc == 0 || rc == 1);
    return r;
}

static void expect(struct sil_ecache_entry r, int kind, int slot, int evict_expert)
{
    assert_int_equal(r.kind, kind);
    assert_int_equal(r.slot, slot);
    assert_int_equal(r.evict_expert, evict_expert);
}

static void test_lru(void **state)
{
    struct sil_ecache *c = mk(1, 8, 3, SIL_ECACHE_LRU, SIL_ECACHE_PER_LAYER, 0, 0);
    expect(one(c, 0, 0), SIL_ECACHE_FILL, 0, -1);
    expect(one(c, 0, 1), SIL_ECACHE_FILL, 1, -1);
    expect(one(c, 0, 2), SIL_ECACHE_FILL, 2, -1);
    expect(one(c, 0, 0), SIL_ECACHE_HIT, 0, -1); /* recency now 0, 2, 1 */
    expect(one(c, 0, 3), SIL_ECACHE_FILL, 1, 1); /* 1 was least recent */
    expect(one(c, 0, 1), SIL_ECACHE_FILL, 2, 2); /* then 2 */
    expect(one(c, 0, 0), SIL_ECACHE_HIT, 0, -1);
    assert_int_equal(sil_ecache_slot_of(c, 0, 2), -1);
    assert_int_equal(sil_ecache_slot_of(c, 0, 3), 1);
    struct sil_ecache_stats s;
    sil_ecache_stats(c, -1, &s);
    assert_int_equal(s.lookups, 7);
    assert_int_equal(s.hits, 2);
    assert_int_equal(s.misses, 5);
    assert_int_equal(s.fills, 5);
    assert_int_equal(s.host, 0);
    assert_int_equal(s.evictions, 2);
    assert_int_equal(s.bytes_streamed, 5000);
    sil_ecache_reset_stats(c);
    sil_ecache_stats(c, 0, &s);
    assert_int_equal(s.lookups + s.hits + s.misses, 0);
    sil_ecache_free(c);
}

/* A plan's own experts are never its victims, whatever order the plan lists them in. */
static void test_pinning(void **state)
{
    for (int pol = 0; pol < SIL_ECACHE_STATIC; pol++) {
        struct sil_ecache *c = mk(1, 8, 3, pol, SIL_ECACHE_PER_LAYER, 1e6, 0.34);
        one(c, 0, 0);
        one(c, 0, 1);
        one(c, 0, 2);
        /* 0 is the least recent (LRU) and ties for least frequent at the lowest slot (LFU), but
         * the plan hits it after listing the miss 5 */
        const int32_t plan[2] = {5, 0};
        struct sil_ecache_entry r[2];
        assert_int_equal(sil_ecache_lookup(c, 0, plan, NULL, 2, r), 0);
        assert_int_equal(r[0].kind, SIL_ECACHE_FILL);
        assert_int_not_equal(r[0].evict_expert, 0);
        assert_int_not_equal(r[0].evict_expert, -1);
        expect(r[1], SIL_ECACHE_HIT, 0, -1);
        assert_int_equal(sil_ecache_slot_of(c, 0, 0), 0);
        sil_ecache_free(c);
    }
}

/* Wider than the pool: hits stay, fills evict only experts outside the plan, the rest is HOST. */
static void test_wide_plan(void **state)
{
    for (int pol = 0; pol < SIL_ECACHE_STATIC; pol++) {
        struct sil_ecache *c = mk(1, 16, 3, pol, SIL_ECACHE_PER_LAYER, 0, 0.34);
        const int32_t warm[3] = {0, 1, 2};
        struct sil_ecache_entry r[5];
        assert_int_equal(sil_ecache_lookup(c, 0, warm, NULL, 3, r), 0);
        const int32_t wide[5] = {0, 1, 2, 3, 4};
        assert_int_equal(sil_ecache_lookup(c, 0, wide, NULL, 5, r), 2);
        for (int i = 0; i < 3; i++)
            assert_int_equal(r[i].kind, SIL_ECACHE_HIT);
        for (int i = 3; i < 5; i++)
            expect(r[i], SIL_ECACHE_HOST, -1, -1);
        const int32_t other[4] = {7, 8, 9, 10};
        assert_int_equal(sil_ecache_lookup(c, 0, other, NULL, 4, r), 1);
        int fills = 0, seen = 0;
        for (int i = 0; i < 4; i++) {
            if (r[i].kind == SIL_ECACHE_FILL) {
                fills++;
                assert_true(r[i].evict_expert >= 0 && r[i].evict_expert <= 2);
                seen |= 1 << r[i].evict_expert;
            }
        }
        assert_int_equal(fills, 3);
        assert_int_equal(seen, 7);
        struct sil_ecache_stats s;
        sil_ecache_stats(c, 0, &s);
        assert_int_equal(s.hits, 3);
        assert_int_equal(s.misses, 3 + 2 + 4);
        assert_int_equal(s.host, 3);
        assert_int_equal(s.evictions, 3);
        sil_ecache_free(c);
    }
}

static void test_lfu(void **state)
{
    /* no decay to speak of: 0 used 3 times, 1 once; 2 evicts 1 though 0 is less recent */
    struct sil_ecache *c = mk(1, 4, 2, SIL_ECACHE_LFU, SIL_ECACHE_PER_LAYER, 1e6, 0);
    one(c, 0, 0);
    one(c, 0, 0);
    one(c, 0, 0);
    one(c, 0, 1);
    expect(one(c, 0, 2), SIL_ECACHE_FILL, 1, 1);
    sil_ecache_free(c);
    /* the same with LRU evicts 0 */
    c = mk(1, 4, 2, SIL_ECACHE_LRU, SIL_ECACHE_PER_LAYER, 0, 0);
    one(c, 0, 0);
    one(c, 0, 0);
    one(c, 0, 0);
    one(c, 0, 1);
    expect(one(c, 0, 2), SIL_ECACHE_FILL, 0, 0);
    sil_ecache_free(c);

    /* decay: 0 at lookups 1..3, 1 at 4..5. Without decay 0 (3) beats 1 (2) and 2 evicts 1; with
     * a half-life of one lookup 0 weighs 2+4+8 = 14 against 16+32 = 48, and 2 evicts 0 */
    for (int d = 0; d < 2; d++) {
        c = mk(1, 4, 2, SIL_ECACHE_LFU, SIL_ECACHE_PER_LAYER, d ? 1 : 1e6, 0);
        one(c, 0, 0);
        one(c, 0, 0);
        one(c, 0, 0);
        one(c, 0, 1);
        one(c, 0, 1);
        const struct sil_ecache_entry r = one(c, 0, 2);
        assert_int_equal(r.kind, SIL_ECACHE_FILL);
        assert_int_equal(r.evict_expert, d ? 0 : 1);
        float heat[4];
        sil_ecache_heat_export(c, heat);
        if (d) /* 14 / 2^6 and 48 / 2^6 after six lookups, 2 at 2^6 / 2^6 */
            assert_true(fabsf(heat[0] - 14.0f / 64) < 1e-6f && fabsf(heat[2] - 1) < 1e-6f);
        else
            assert_true(fabsf(heat[0] - 3) < 1e-4f && fabsf(heat[1] - 2) < 1e-4f);
        sil_ecache_free(c);
    }

    /* uses weigh: one plan routing 5 rows to expert 1 outweighs three single uses of 0 */
    c = mk(1, 4, 2, SIL_ECACHE_LFU, SIL_ECACHE_PER_LAYER, 1e6, 0);
    one(c, 0, 0);
    one(c, 0, 0);
    one(c, 0, 0);
    const int32_t e1 = 1, u5 = 5;
    struct sil_ecache_entry r;
    assert_int_equal(sil_ecache_lookup(c, 0, &e1, &u5, 1, &r), 0);
    expect(one(c, 0, 2), SIL_ECACHE_FILL, 0, 0);
    sil_ecache_free(c);
}

static void test_heat(void **state)
{
    /* two hot experts, then a scan of one-offs: HEAT keeps the hot two in its protected half,
     * LRU loses them */
    for (int pol = SIL_ECACHE_LRU; pol <= SIL_ECACHE_HEAT; pol += SIL_ECACHE_HEAT) {
        struct sil_ecache *c = mk(1, 16, 4, pol, SIL_ECACHE_PER_LAYER, 1e6, 0.5);
        for (int i = 0; i < 5; i++) {
            one(c, 0, 0);
            one(c, 0, 1);
        }
        for (int e = 2; e < 7; e++)
            assert_int_equal(one(c, 0, e).kind, SIL_ECACHE_FILL);
        const int k = pol == SIL_ECACHE_HEAT ? SIL_ECACHE_HIT : SIL_ECACHE_FILL;
        assert_int_equal(one(c, 0, 0).kind, k);
        assert_int_equal(one(c, 0, 1).kind, k);
        sil_ecache_free(c);
    }
    /* promotion: one protected slot of three. 0 fills it; 1 gets hotter and swaps in; 0 is
     * demoted to probation, and the scan 2, 3, 4 evicts 0 then 2 but never the hot 1 (LRU
     * evicts 1 at 4) */
    for (int pol = SIL_ECACHE_LRU; pol <= SIL_ECACHE_HEAT; pol += SIL_ECACHE_HEAT) {
        struct sil_ecache *c = mk(1, 8, 3, pol, SIL_ECACHE_PER_LAYER, 1e6, 0.34);
        one(c, 0, 0);
        for (int i = 0; i < 4; i++)
            one(c, 0, 1);
        assert_int_equal(one(c, 0, 2).evict_expert, -1);
        assert_int_equal(one(c, 0, 3).evict_expert, 0);
        assert_int_equal(one(c, 0, 4).evict_expert, pol == SIL_ECACHE_HEAT ? 2 : 1);
        sil_ecache_free(c);
    }
}

static void test_static(void **state)
{
    struct sil_ecache *c = mk(2, 8, 4, SIL_ECACHE_STATIC, SIL_ECACHE_PER_LAYER, 0, 0);
    assert_int_equal(sil_ecache_preload(c, 0, 3), 0);
    assert_int_equal(sil_ecache_preload(c, 0, 3), -EEXIST);
    assert_int_equal(sil_ecache_preload(c, 0, 5), 1);
    assert_int_equal(sil_ecache_preload(c, 0, 6), -ENOSPC);
    assert_int_equal(sil_ecache_preload(c, 1, 6), 2);
    assert_int_equal(sil_ecache_preload(c, 2, 0), -EINVAL);
    assert_int_equal(sil_ecache_preload(c, 0, 8), -EINVAL);
    expect(one(c, 0, 3), SIL_ECACHE_HIT, 0, -1);
    expect(one(c, 0, 4), SIL_ECACHE_HOST, -1, -1);
    expect(one(c, 0, 4), SIL_ECACHE_HOST, -1, -1);
    expect(one(c, 1, 4), SIL_ECACHE_HOST, -1, -1); /* layer 1 has a free slot; static keeps it */
    expect(one(c, 1, 6), SIL_ECACHE_HIT, 2, -1);
    struct sil_ecache_stats s;
    sil_ecache_stats(c, 0, &s);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.host, 2);
    assert_int_equal(s.fills, 0);
    sil_ecache_free(c);

    /* with a staging area (6 slots, 2 staging: 4 pinned; slots are handed out from 0 up) the
     * preloads and then the first misses are pinned, later misses go through staging (LRU) */
    c = mk_stage(1, 16, 6, SIL_ECACHE_STATIC, SIL_ECACHE_PER_LAYER, 0, 0, 2);
    assert_int_equal(sil_ecache_preload(c, 0, 1), 0);
    assert_int_equal(sil_ecache_preload(c, 0, 2), 1);
    expect(one(c, 0, 3), SIL_ECACHE_FILL, 2, -1); /* pinned from here on */
    expect(one(c, 0, 4), SIL_ECACHE_FILL, 3, -1); /* the pinned part is full */
    expect(one(c, 0, 5), SIL_ECACHE_FILL, 4, -1); /* staging */
    expect(one(c, 0, 6), SIL_ECACHE_FILL, 5, -1);
    expect(one(c, 0, 7), SIL_ECACHE_FILL, 4, 5); /* staging's least recent */
    expect(one(c, 0, 6), SIL_ECACHE_HIT, 5, -1);
    expect(one(c, 0, 8), SIL_ECACHE_FILL, 4, 7); /* 6 was used after 7 */
    for (int32_t e = 1; e <= 4; e++) /* the pinned ones were never evicted */
        expect(one(c, 0, e), SIL_ECACHE_HIT, e - 1, -1);
    {
        const int32_t wide[3] = {9, 10, 11}; /* 3 misses, 2 staging slots */
        struct sil_ecache_entry r[3];
        assert_int_equal(sil_ecache_lookup(c, 0, wide, NULL, 3, r), 1);
        expect(r[0], SIL_ECACHE_FILL, 5, 6);
        expect(r[1], SIL_ECACHE_FILL, 4, 8);
        expect(r[2], SIL_ECACHE_HOST, -1, -1);
    }
    assert_int_equal(sil_ecache_preload(c, 0, 12), -ENOSPC);
    sil_ecache_stats(c, 0, &s);
    assert_int_equal(s.fills, 8);
    assert_int_equal(s.evictions, 4);
    assert_int_equal(s.host, 1);
    sil_ecache_free(c);
    /* preloads past the pinned part go to staging and leave it as misses arrive */
    c = mk_stage(1, 16, 4, SIL_ECACHE_STATIC, SIL_ECACHE_PER_LAYER, 0, 0, 1);
    for (int32_t e = 0; e < 4; e++)
        assert_int_equal(sil_ecache_preload(c, 0, e), e);
    expect(one(c, 0, 9), SIL_ECACHE_FILL, 3, 3);
    for (int32_t e = 0; e < 3; e++)
        expect(one(c, 0, e), SIL_ECACHE_HIT, e, -1);
    sil_ecache_free(c);
    {
        struct sil_ecache_config bad = {.n_layer = 1, .n_expert = 4, .n_slot = 2,
                                        .policy = SIL_ECACHE_STATIC, .n_stage = 3};
        struct sil_error err = {0};
        c = NULL;
        assert_int_equal(sil_ecache_create(&c, &bad, &err), -EINVAL);
        assert_non_null(strstr(err.msg, "n_stage"));
        assert_null(c);
    }

    /* LRU preload order: the first preloaded is the most recent, so the last goes first */
    c = mk(1, 8, 3, SIL_ECACHE_LRU, SIL_ECACHE_PER_LAYER, 0, 0);
    for (int e = 0; e < 3; e++)
        assert_int_equal(sil_ecache_preload(c, 0, e), e);
    expect(one(c, 0, 7), SIL_ECACHE_FILL, 2, 2);
    sil_ecache_free(c);
}

/* Layer 0 cycles through 3 experts, layer 1 uses one: per-layer pools of 2 slots make layer 0
 * miss every time (a cycle longer than LRU's pool); one global pool of 4 holds all 4 keys. */
static void test_pools(void **state)
{
    for (int g = 0; g < 2; g++) {
        struct sil_ecache *c =
            mk(2, 8, 4, SIL_ECACHE_LRU, g ? SIL_ECACHE_GLOBAL : SIL_ECACHE_PER_LAYER, 0, 0);
        assert_int_equal(sil_ecache_pool_slots(c, 0), g ? 4 : 2);
        for (int rep = 0; rep < 10; rep++) {
            one(c, 0, 0);
            one(c, 0, 1);
            one(c, 0, 2);
            one(c, 1, 0);
        }
        struct sil_ecache_stats s0, s1, t;
        sil_ecache_stats(c, 0, &s0);
        sil_ecache_stats(c, 1, &s1);
        sil_ecache_stats(c, -1, &t);
        assert_int_equal(s0.hits, g ? 27 : 0);
        assert_int_equal(s1.hits, 9);
        assert_int_equal(t.hits, s0.hits + s1.hits);
        assert_int_equal(t.misses, s0.misses + s1.misses);
        assert_int_equal(t.lookups, 40);
        sil_ecache_free(c);
    }
    /* 5 slots over 2 layers: 3 and 2 */
    struct sil_ecache *c = mk(2, 8, 5, SIL_ECACHE_LRU, SIL_ECACHE_PER_LAYER, 0, 0);
    assert_int_equal(sil_ecache_pool_slots(c, 0), 3);
    assert_int_equal(sil_ecache_pool_slots(c, 1), 2);
    sil_ecache_free(c);
}

static void test_bad_input(void **state)
{
    struct sil_ecache_config k = {.n_layer = 2, .n_expert = 8, .n_slot = 17};
    struct sil_ecache *c = (struct sil_ecache *)&k;
    struct sil_error err = {0};
    assert_int_equal(sil_ecache_create(&c, &k, &err), -EINVAL);
    assert_null(c);
    assert_non_null(strstr(err.msg, "n_slot"));
    k.n_slot = 4;
    k.policy = 9;
    assert_int_equal(sil_ecache_create(&c, &k, &err), -EINVAL);
    k.policy = SIL_ECACHE_HEAT;
    k.protect = 1.5;
    assert_int_equal(sil_ecache_create(&c, &k, &err), -EINVAL);
    k.protect = 0;
    k.half_life = -1;
    assert_int_equal(sil_ecache_create(&c, &k, &err), -EINVAL);
    k.half_life = 0;
    assert_int_equal(sil_ecache_create(&c, &k, &err), 0);
    struct sil_ecache_entry r[9];
    const int32_t bad[2] = {1, 8};
    assert_int_equal(sil_ecache_lookup(c, 0, bad, NULL, 2, r), -EINVAL);
    assert_int_equal(sil_ecache_lookup(c, 2, bad, NULL, 1, r), -EINVAL);
    assert_int_equal(sil_ecache_lookup(c, -1, bad, NULL, 1, r), -EINVAL);
    struct sil_ecache_stats s;
    sil_ecache_stats(c, -1, &s);
    assert_int_equal(s.lookups, 0);
    /* a zero-slot cache misses everything to host */
    sil_ecache_free(c);
    k.n_slot = 0;
    assert_int_equal(sil_ecache_create(&c, &k, &err), 0);
    expect(one(c, 1, 3), SIL_ECACHE_HOST, -1, -1);
    sil_ecache_free(c);
    assert_int_equal(sil_ecache_policy_parse("heat"), SIL_ECACHE_HEAT);
    assert_int_equal(sil_ecache_policy_parse("mru"), -1);
    assert_string_equal(sil_ecache_policy_name(SIL_ECACHE_LFU), "lfu");
}

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t x = *s;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Random plans through every policy and pool layout; after each, the cache must be consistent:
 * every answer's slot holds its expert, no plan evicts its own expert, each slot one key. */
static void test_random_invariants(void **state)
{
    const int32_t L = 3, X = 20;
    uint64_t rng = 7;
    for (int pv = 0; pv <= SIL_ECACHE_POLICY_COUNT; pv++) {
        /* the last round: static with a staging area of 3 slots per pool */
        const int pol = pv < SIL_ECACHE_POLICY_COUNT ? pv : SIL_ECACHE_STATIC;
        for (int g = 0; g < 2; g++) {
            for (int32_t slots = 0; slots <= 31; slots += 5) {
                struct sil_ecache *c =
                    mk_stage(L, X, slots, pol, g, 4, 0.3, pv == pol ? 0 : slots < 3 ? slots : 3);
                if (pol == SIL_ECACHE_STATIC)
                    for (int32_t k = 0; k < L * X; k += 3)
                        sil_ecache_preload(c, k / X, k % X);
                uint64_t n_hit = 0, n_miss = 0, n_host = 0;
                for (int it = 0; it < 3000; it++) {
                    const int32_t l = (int32_t)(rng_next(&rng) % L);
                    int32_t plan[20], uses[20], n = 1 + (int32_t)(rng_next(&rng) % 9);
                    uint32_t taken = 0;
                    for (int32_t i = 0; i < n; i++) {
                        int32_t e;
                        do /* skewed: low ids more often */
                            e = (int32_t)((rng_next(&rng) % X) * (rng_next(&rng) % X) / X);
                        while (taken & (1u << e));
                        taken |= 1u << e;
                        plan[i] = e;
                        uses[i] = 1 + (int32_t)(rng_next(&rng) % 4);
                    }
                    struct sil_ecache_entry r[20];
                    const int h = sil_ecache_lookup(c, l, plan, uses, n, r);
                    assert_true(h >= 0 && h <= n);
                    int hosts = 0;
                    for (int32_t i = 0; i < n; i++) {
                        if (r[i].kind == SIL_ECACHE_HOST) {
                            hosts++;
                            n_host++;
                            assert_int_equal(sil_ecache_slot_of(c, l, plan[i]), -1);
                            continue;
                        }
                        r[i].kind == SIL_ECACHE_HIT ? n_hit++ : n_miss++;
                        assert_int_equal(sil_ecache_slot_of(c, l, plan[i]), r[i].slot);
                        if (r[i].kind == SIL_ECACHE_FILL && r[i].evict_expert >= 0) {
                            assert_false(r[i].evict_layer == l &&
                                         (taken & (1u << r[i].evict_expert)));
                            assert_int_equal(
                                sil_ecache_slot_of(c, r[i].evict_layer, r[i].evict_expert), -1);
                            if (!g) assert_int_equal(r[i].evict_layer, l);
                        }
                    }
                    assert_int_equal(hosts, h);
                    /* a host answer only when the pool is full of this plan's experts */
                    if (h > 0 && pol != SIL_ECACHE_STATIC)
                        assert_true(n - h == sil_ecache_pool_slots(c, l));
                }
                int32_t owner[32];
                memset(owner, -1, sizeof(owner));
                int32_t resident = 0;
                for (int32_t k = 0; k < L * X; k++) {
                    const int32_t s = sil_ecache_slot_of(c, k / X, k % X);
                    if (s < 0) continue;
                    assert_true(s < slots);
                    assert_int_equal(owner[s], -1);
                    owner[s] = k;
                    resident++;
                }
                assert_true(resident <= slots);
                struct sil_ecache_stats s;
                sil_ecache_stats(c, -1, &s);
                assert_int_equal(s.hits, n_hit);
                assert_int_equal(s.fills, n_miss);
                assert_int_equal(s.host, n_host);
                assert_int_equal(s.misses, s.fills + s.host);
                assert_true(s.evictions <= s.fills);
                if (pol != SIL_ECACHE_STATIC)
                    assert_int_equal(s.fills - s.evictions, (uint64_t)resident);
                sil_ecache_free(c);
            }
        }
    }
}

/* A one-layer trace of n_tok tokens, K of X experts each, Zipf(S) over a random ranking; with
 * probability reuse each expert is carried over from the previous token (temporal locality). */
static void gen_trace(int32_t *tr, int n_tok, int K, int X, double S, double reuse, uint64_t seed)
{
    double cdf[256], sum = 0;
    for (int e = 0; e < X; e++)
        cdf[e] = sum += pow(e + 1, -S);
    uint64_t rng = seed;
    for (int t = 0; t < n_tok; t++) {
        int32_t *row = tr + t * K;
        for (int k = 0; k < K; k++) {
            int32_t e;
            bool dup;
            do {
                if (t > 0 && (double)(rng_next(&rng) >> 11) / 9007199254740992.0 < reuse) {
                    e = tr[(t - 1) * K + (int)(rng_next(&rng) % K)];
                } else {
                    const double u = (double)(rng_next(&rng) >> 11) / 9007199254740992.0 * sum;
                    e = 0;
                    while (e < X - 1 && cdf[e] < u)
                        e++;
                }
                dup = false;
                for (int j = 0; j < k; j++)
                    dup |= row[j] == e;
            } while (dup);
            row[k] = e;
        }
    }
}

static double replay(const int32_t *tr, int n_tok, int K, int X, int slots, int pol)
{
    struct sil_ecache *c = mk(1, X, slots, pol, SIL_ECACHE_PER_LAYER, 0, 0);
    if (pol == SIL_ECACHE_STATIC) { /* the hottest set of the whole trace: an oracle */
        int count[256] = {0}, order[256];
        for (int i = 0; i < n_tok * K; i++)
            count[tr[i]]++;
        for (int e = 0; e < X; e++)
            order[e] = e;
        for (int i = 0; i < X; i++)
            for (int j = i + 1; j < X; j++)
                if (count[order[j]] > count[order[i]]) {
                    const int t = order[i];
                    order[i] = order[j];
                    order[j] = t;
                }
        for (int i = 0; i < slots; i++)
            sil_ecache_preload(c, 0, order[i]);
    }
    struct sil_ecache_entry r[16];
    for (int t = 0; t < n_tok; t++)
        sil_ecache_lookup(c, 0, tr + t * K, NULL, K, r);
    struct sil_ecache_stats s;
    sil_ecache_stats(c, -1, &s);
    sil_ecache_free(c);
    return (double)s.hits / (double)(s.hits + s.misses);
}

/* With reuse between neighbouring tokens (real routing has it: an expert's median reuse distance
 * is ~2 tokens) LRU beats the best static set; on independent tokens (no locality) the static
 * hottest set is the better one, as the independent-reference model predicts. */
static void test_lru_vs_static(void **state)
{
    enum { N = 4000, K = 8, X = 64 };
    int32_t *tr = malloc(sizeof(int32_t) * N * K);
    assert_non_null(tr);
    for (int slots = 3 * K; slots <= 5 * K; slots += K) {
        gen_trace(tr, N, K, X, 0.6, 0.5, 11);
        const double lru = replay(tr, N, K, X, slots, SIL_ECACHE_LRU);
        const double stat = replay(tr, N, K, X, slots, SIL_ECACHE_STATIC);
        print_message("reuse 0.5, %d slots: lru %.3f static %.3f\n", slots, lru, stat);
        assert_true(lru >= stat);
        gen_trace(tr, N, K, X, 0.6, 0.0, 11);
        const double lru0 = replay(tr, N, K, X, slots, SIL_ECACHE_LRU);
        const double stat0 = replay(tr, N, K, X, slots, SIL_ECACHE_STATIC);
        print_message("independent, %d slots: lru %.3f static %.3f\n", slots, lru0, stat0);
        assert_true(stat0 > lru0);
    }
    free(tr);
}

/* ---- heat map ----------------------------------------------------------------------------------
 */

static char *tmpdir;

static int setup(void **state)
{
    tmpdir = tu_tmpdir_create();
    return tmpdir ? 0 : -1;
}

static int teardown(void **state)
{
    tu_tmpdir_remove(tmpdir);
    free(tmpdir);
    return 0;
}

static void test_heat_roundtrip(void **state)
{
    struct sil_ecache *c = mk(3, 5, 6, SIL_ECACHE_LRU, SIL_ECACHE_PER_LAYER, 8, 0);
    for (int i = 0; i < 20; i++) {
        one(c, i % 3, (i * 7) % 5);
        one(c, 2, 4);
    }
    float heat[15], back[15];
    sil_ecache_heat_export(c, heat);
    struct sil_heat_map m = {3, 5, 0x1234abcdull, 20, heat};
    char *path = tu_path_join(tmpdir, "heat");
    struct sil_error err = {0};
    assert_int_equal(sil_heat_map_save(path, &m, &err), 0);
    struct sil_heat_map got;
    assert_int_equal(sil_heat_map_load(path, 0x1234abcdull, 3, 5, &got, &err), 0);
    assert_int_equal(got.n_layer, 3);
    assert_int_equal(got.n_expert, 5);
    assert_int_equal(got.tokens, 20);
    assert_memory_equal(got.heat, heat, sizeof(heat));
    /* hottest first: (2, 4) is used on every step */
    int32_t keys[15];
    const int64_t n = sil_heat_map_hottest(&got, keys, 15);
    assert_true(n > 1 && n <= 15);
    assert_int_equal(keys[0], 2 * 5 + 4);
    for (int64_t i = 1; i < n; i++)
        assert_true(got.heat[keys[i - 1]] >= got.heat[keys[i]]);
    for (int64_t i = n; i < 15; i++) /* the rest are unused */
        assert_true(got.heat[i] >= 0);
    assert_int_equal(sil_heat_map_hottest(&got, keys, 2), 2);
    /* imported into a fresh cache, the heat reads back the same */
    struct sil_ecache *d = mk(3, 5, 6, SIL_ECACHE_LFU, SIL_ECACHE_PER_LAYER, 8, 0);
    sil_ecache_heat_import(d, got.heat);
    sil_ecache_heat_export(d, back);
    for (int i = 0; i < 15; i++)
        assert_true(fabsf(back[i] - heat[i]) <= 1e-6f * heat[i]);
    sil_heat_map_free(&got);
    /* no temporary left behind; a second save replaces the file */
    char *tmp = NULL;
    assert_true(asprintf(&tmp, "%s.%ld~", path, (long)getpid() % 100000000) > 0);
    assert_int_not_equal(access(tmp, F_OK), 0);
    heat[0] = 99;
    assert_int_equal(sil_heat_map_save(path, &m, &err), 0);
    assert_int_equal(sil_heat_map_load(path, 0x1234abcdull, 3, 5, &got, &err), 0);
    assert_true(got.heat[0] == 99);
    sil_heat_map_free(&got);
    free(tmp);
    free(path);
    sil_ecache_free(c);
    sil_ecache_free(d);
}

static void test_heat_corrupt(void **state)
{
    float heat[8] = {1, 2, 3, 4, 0, 0.5f, 7, 8};
    struct sil_heat_map m = {2, 4, 42, 1, heat}, got;
    char *path = tu_path_join(tmpdir, "heat2");
    struct sil_error err = {0};
    assert_int_equal(sil_heat_map_save(path, &m, &err), 0);
    void *buf;
    size_t len;
    assert_int_equal(tu_read_file(path, &buf, &len), 0);
    assert_int_equal(len, 40 + 32 + 8);
    uint8_t *b = buf;
    /* every single flipped bit anywhere is refused */
    for (size_t i = 0; i < len; i++) {
        for (int bit = 0; bit < 8; bit += 3) {
            b[i] ^= (uint8_t)(1 << bit);
            assert_int_equal(sil_heat_map_parse(b, len, "x", 42, 2, 4, &got, &err), -EINVAL);
            assert_null(got.heat);
            b[i] ^= (uint8_t)(1 << bit);
        }
    }
    /* every truncation, and one byte more */
    for (size_t n = 0; n < len; n++)
        assert_int_equal(sil_heat_map_parse(b, n, "x", 42, 2, 4, &got, &err), -EINVAL);
    uint8_t *longer = calloc(1, len + 1);
    memcpy(longer, b, len);
    assert_int_equal(sil_heat_map_parse(longer, len + 1, "x", 42, 2, 4, &got, &err), -EINVAL);
    free(longer);
    /* another model, another shape */
    assert_int_equal(sil_heat_map_parse(b, len, "x", 43, 2, 4, &got, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "another model"));
    assert_int_equal(sil_heat_map_parse(b, len, "x", 42, 4, 2, &got, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "offset 12"));
    assert_int_equal(sil_heat_map_parse(b, len, "x", 42, 2, 4, &got, &err), 0);
    sil_heat_map_free(&got);
    /* a well-formed file whose heat is negative (checksum fixed up) */
    heat[3] = -1;
    assert_int_equal(sil_heat_map_save(path, &m, &err), 0); /* saved as 0 */
    assert_int_equal(sil_heat_map_load(path, 42, 2, 4, &got, &err), 0);
    assert_true(got.heat[3] == 0);
    sil_heat_map_free(&got);
    /* on disk: missing, truncated, a directory */
    char *missing = tu_path_join(tmpdir, "none");
    assert_int_equal(sil_heat_map_load(missing, 42, 2, 4, &got, &err), -ENOENT);
    assert_int_equal(tu_write_file(path, b, len / 2), 0);
    assert_int_equal(sil_heat_map_load(path, 42, 2, 4, &got, &err), -EINVAL);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(sil_heat_map_load(tmpdir, 42, 2, 4, &got, &err), -EINVAL);
    /* saving into a directory that does not exist fails and names the path */
    char *nodir = tu_path_join(missing, "heat");
    assert_true(sil_heat_map_save(nodir, &m, &err) < 0);
    assert_non_null(strstr(err.msg, nodir));
    free(nodir);
    free(missing);
    free(buf);
    free(path);
}

/* Trace round trip; a truncated record, an expert or layer out of range, a bad header refused. */
/* Host misses: with a quota of 2, the two coldest misses of a plan stay HOST (no slot taken,
 * counted as misses and streamed bytes), the rest are filled; a quota of 0 fills again. */
static void test_host_misses(void **state)
{
    (void)state;
    struct sil_ecache *c = mk(1, 8, 8, SIL_ECACHE_LFU, SIL_ECACHE_GLOBAL, 0, 0);
    struct sil_ecache_entry r[4];
    /* heat: expert 3 used 4 times, 2 three times, 1 twice (lookups of one expert, quota 1:
     * each single miss is the coldest and stays HOST, so nothing is resident yet) */
    sil_ecache_set_host_misses(c, 1);
    const int32_t e3[] = {3}, e2[] = {2}, e1[] = {1};
    for (int i = 0; i < 4; i++)
        assert_int_equal(sil_ecache_lookup(c, 0, e3, NULL, 1, r), 1);
    for (int i = 0; i < 3; i++)
        assert_int_equal(sil_ecache_lookup(c, 0, e2, NULL, 1, r), 1);
    for (int i = 0; i < 2; i++)
        assert_int_equal(sil_ecache_lookup(c, 0, e1, NULL, 1, r), 1);
    assert_int_equal(r[0].kind, SIL_ECACHE_HOST);
    assert_int_equal(sil_ecache_slot_of(c, 0, 3), -1);
    /* plan {0, 1, 2, 3}, all misses, quota 2: 0 (never used) and 1 (twice) stay HOST */
    sil_ecache_set_host_misses(c, 2);
    const int32_t plan[] = {0, 1, 2, 3};
    assert_int_equal(sil_ecache_lookup(c, 0, plan, NULL, 4, r), 2);
    assert_int_equal(r[0].kind, SIL_ECACHE_HOST);
    assert_int_equal(r[1].kind, SIL_ECACHE_HOST);
    assert_int_equal(r[2].kind, SIL_ECACHE_FILL);
    assert_int_equal(r[3].kind, SIL_ECACHE_FILL);
    assert_int_equal(r[0].slot, -1);
    assert_int_equal(sil_ecache_slot_of(c, 0, 0), -1);
    assert_true(sil_ecache_slot_of(c, 0, 2) >= 0 && sil_ecache_slot_of(c, 0, 3) >= 0);
    struct sil_ecache_stats st;
    sil_ecache_stats(c, -1, &st);
    assert_int_equal(st.misses, 4 + 3 + 2 + 4);
    assert_int_equal(st.fills, 2);
    assert_int_equal(st.bytes_streamed, (4 + 3 + 2 + 4) * 1000);
    /* the same plan again: 2 and 3 hit, 0 and 1 still HOST */
    assert_int_equal(sil_ecache_lookup(c, 0, plan, NULL, 4, r), 2);
    assert_int_equal(r[2].kind, SIL_ECACHE_HIT);
    assert_int_equal(r[3].kind, SIL_ECACHE_HIT);
    /* quota 0: the misses are filled */
    sil_ecache_set_host_misses(c, 0);
    assert_int_equal(sil_ecache_lookup(c, 0, plan, NULL, 4, r), 0);
    assert_int_equal(r[0].kind, SIL_ECACHE_FILL);
    assert_int_equal(r[1].kind, SIL_ECACHE_FILL);
    sil_ecache_free(c);
}

/* Host share: of m misses round(m * share) stay HOST, never more than the quota; a share of 0
 * (or not a number) leaves the quota alone. */
static void test_host_share(void **state)
{
    (void)state;
    const int32_t plan[] = {0, 1, 2, 3, 4, 5, 6, 7}, two[] = {8, 9}, one[] = {10};
    struct sil_ecache_entry r[8];
    const struct {
        double share;
        int32_t quota, n, want;
    } cases[] = {
        {0.3, 8, 8, 2}, /* 2.4 -> 2 */
        {0.3, 8, 2, 1}, /* 0.6 -> 1 */
        {0.3, 8, 1, 0}, /* 0.3 -> 0: the one miss is copied */
        {0.6, 3, 8, 3}, /* 4.8 -> 5, but the quota is 3 */
        {1.0, 8, 8, 8}, {2.0, 8, 8, 8},   /* clamped to 1 */
        {0.0, 2, 8, 2}, {NAN, 2, 8, 2},   /* no share: the quota */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct sil_ecache *c = mk(1, 16, 16, SIL_ECACHE_LFU, SIL_ECACHE_GLOBAL, 0, 0);
        sil_ecache_set_host_misses(c, cases[k].quota);
        sil_ecache_set_host_share(c, cases[k].share);
        const int32_t *e = cases[k].n == 8 ? plan : cases[k].n == 2 ? two : one;
        assert_int_equal(sil_ecache_lookup(c, 0, e, NULL, cases[k].n, r), cases[k].want);
        int host = 0;
        for (int i = 0; i < cases[k].n; i++)
            host += r[i].kind == SIL_ECACHE_HOST;
        assert_int_equal(host, cases[k].want);
        sil_ecache_free(c);
    }
}

/* Admission: free slots fill; once the pool is full a miss fills only when it is hotter than
 * the expert it would evict (LFU's coldest, LRU's least recent), else it is HOST and nothing
 * resident moves; off again, every miss fills. */
static void test_admission(void **state)
{
    (void)state;
    for (int pol = 0; pol < 2; pol++) {
        const enum sil_ecache_policy policy = pol ? SIL_ECACHE_LRU : SIL_ECACHE_LFU;
        struct sil_ecache *c = mk(1, 8, 2, policy, SIL_ECACHE_GLOBAL, 1e6, 0);
        struct sil_ecache_entry r[2];
        sil_ecache_set_admission(c, 1);
        const int32_t e0[] = {0}, e1[] = {1}, e2[] = {2};
        /* 1 used three times, then 0 four times: both fill free slots, then hit; 1 is both
         * the least used and the least recent */
        for (int i = 0; i < 3; i++)
            assert_int_equal(sil_ecache_lookup(c, 0, e1, NULL, 1, r), 0);
        for (int i = 0; i < 4; i++)
            assert_int_equal(sil_ecache_lookup(c, 0, e0, NULL, 1, r), 0);
        assert_int_equal(r[0].kind, SIL_ECACHE_HIT);
        const int32_t s0 = sil_ecache_slot_of(c, 0, 0), s1 = sil_ecache_slot_of(c, 0, 1);
        assert_true(s0 >= 0 && s1 >= 0 && s0 != s1);
        /* 2 is colder than 1 at its first and second use: HOST, and the pool keeps 0 and 1 */
        for (int i = 0; i < 2; i++) {
            assert_int_equal(sil_ecache_lookup(c, 0, e2, NULL, 1, r), 1);
            assert_int_equal(r[0].kind, SIL_ECACHE_HOST);
            assert_int_equal(r[0].slot, -1);
        }
        assert_int_equal(sil_ecache_slot_of(c, 0, 0), s0);
        assert_int_equal(sil_ecache_slot_of(c, 0, 1), s1);
        struct sil_ecache_stats st;
        sil_ecache_stats(c, -1, &st);
        assert_int_equal(st.fills, 2);
        assert_int_equal(st.host, 2);
        assert_int_equal(st.evictions, 0);
        /* its third use (later than 1's three) makes 2 the hotter: it takes 1's slot */
        assert_int_equal(sil_ecache_lookup(c, 0, e2, NULL, 1, r), 0);
        assert_int_equal(r[0].kind, SIL_ECACHE_FILL);
        assert_int_equal(r[0].slot, s1);
        assert_int_equal(r[0].evict_expert, 1);
        assert_int_equal(sil_ecache_slot_of(c, 0, 2), s1);
        assert_int_equal(sil_ecache_slot_of(c, 0, 0), s0);
        /* off: a cold miss evicts */
        sil_ecache_set_admission(c, 0);
        const int32_t e5[] = {5};
        assert_int_equal(sil_ecache_lookup(c, 0, e5, NULL, 1, r), 0);
        assert_int_equal(r[0].kind, SIL_ECACHE_FILL);
        sil_ecache_free(c);
    }
}

static void test_route_trace(void **state)
{
    char *path = tu_path_join(tmpdir, "t.trace");
    struct sil_route_trace w, r;
    struct sil_error err = {0};
    assert_int_equal(sil_route_trace_create(&w, path, 2, 300, 3, &err), 0);
    const int32_t a[6] = {1, 2, 299, 0, 7, 8}, b[3] = {5, 4, 3};
    sil_route_trace_write(&w, 0, 2, a);
    sil_route_trace_write(&w, 1, 1, b);
    assert_int_equal(sil_route_trace_close(&w, &err), 0);
    int32_t sel[6 * 4];
    uint32_t layer, rows;
    assert_int_equal(sil_route_trace_open(&r, path, &err), 0);
    assert_int_equal(r.n_expert, 300);
    assert_int_equal(sil_route_trace_read(&r, &layer, &rows, sel, &err), 1);
    assert_int_equal(layer, 0);
    assert_int_equal(rows, 2);
    assert_memory_equal(sel, a, sizeof(a));
    assert_int_equal(sil_route_trace_read(&r, &layer, &rows, sel, &err), 1);
    assert_int_equal(layer, 1);
    assert_memory_equal(sel, b, sizeof(b));
    assert_int_equal(sil_route_trace_read(&r, &layer, &rows, sel, &err), 0);
    fclose(r.f);

    void *buf;
    size_t len;
    assert_int_equal(tu_read_file(path, &buf, &len), 0);
    assert_int_equal(len, 32 + 8 + 12 + 8 + 6);
    uint8_t *p = buf;
    struct {
        size_t len, at;
        uint8_t v;
        int reads; /* records read before the failure; -1: the header is refused */
    } bad[] = {
        {len - 1, 0, 'S', 1},       /* the last record truncated */
        {len, 32 + 8 + 4, 0xff, 0}, /* an expert id 0x..ff >= 300 */
        {len, 32 + 20, 5, 1},       /* the second record's layer 5 of 2 */
        {len, 32 + 4, 0, 0},        /* the first record has 0 rows */
        {len, 0, 'X', -1},          /* magic */
        {len, 8, 2, -1},            /* version */
        {len, 20, 0, -1},           /* 0 experts used */
        {20, 0, 'S', -1},           /* a short header */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint8_t *q = malloc(len);
        memcpy(q, p, len);
        q[bad[i].at] = bad[i].v;
        assert_int_equal(tu_write_file(path, q, bad[i].len), 0);
        free(q);
        if (bad[i].reads < 0) {
            assert_int_equal(sil_route_trace_open(&r, path, &err), -EINVAL);
            continue;
        }
        assert_int_equal(sil_route_trace_open(&r, path, &err), 0);
        for (int k = 0; k < bad[i].reads; k++)
            assert_int_equal(sil_route_trace_read(&r, &layer, &rows, sel, &err), 1);
        assert_int_equal(sil_route_trace_read(&r, &layer, &rows, sel, &err), -EINVAL);
        fclose(r.f);
    }
    /* a shape the format cannot hold */
    assert_int_equal(sil_route_trace_create(&w, path, 2, 70000, 3, &err), -EINVAL);
    free(buf);
    free(path);
}

/* ---- the engine's observer ----------------------------------------------------------------------
 */

/* Evaluates 40 tokens in batches of 16 rows, then 3 decode steps, with or without a route
 * trace and a simulated cache; returns every row's logits. */
static float *run_engine(const char *model, const char *trace, int32_t slots,
                         struct sil_engine_stats *st, int32_t *n_layer, int32_t *n_vocab)
{
    struct sil_engine_params p;
    sil_engine_params_default(&p);
    p.model_path = model;
    p.n_threads = 2;
    p.n_seq_max = 1;
    p.n_batch_max = 16;
    p.ecache_sim_slots = slots;
    struct sil_engine *e = NULL;
    struct sil_error err = {0};
    struct sil_route_obs *ro = NULL;
    if (trace) {
        assert_int_equal(sil_route_obs_create(&ro, trace, NULL, &err), 0);
        p.observer = sil_route_obs_observer(ro);
    }
    assert_int_equal(sil_engine_open(&e, &p, &err), 0);
    const int32_t V = sil_engine_info(e)->n_vocab;
    *n_layer = sil_engine_info(e)->n_layer;
    *n_vocab = V;
    enum { N = 40, D = 3 };
    float *logits = malloc(sizeof(float) * (size_t)V * (N + D));
    int32_t tok[N], pos[N], seq[N];
    bool want[N];
    for (int i = 0; i < N; i++) {
        tok[i] = (i * 37 + 11) % V;
        pos[i] = i;
        seq[i] = 0;
        want[i] = true;
    }
    assert_int_equal(sil_seq_create(e, &err), 0);
    for (int at = 0; at < N; at += 16) { /* n_batch_max rows a call: 16, 16, 8 */
        const int n = N - at < 16 ? N - at : 16;
        struct sil_batch b = {n, tok + at, pos + at, seq + at, want + at};
        assert_int_equal(sil_engine_eval(e, &b, logits + (size_t)V * at, &err), 0);
    }
    for (int d = 0; d < D; d++) {
        int32_t t = (d * 5 + 3) % V, ps = N + d, sq = 0;
        struct sil_batch one_b = {1, &t, &ps, &sq, NULL};
        assert_int_equal(sil_engine_eval(e, &one_b, logits + (size_t)V * (N + d), &err), 0);
    }
    sil_engine_stats(e, st);
    sil_engine_close(e);
    assert_int_equal(sil_route_obs_free(ro, &err), 0);
    return logits;
}

/* Watching the plans changes no logit; the trace holds every (ubatch, layer) plan; the
 * simulated cache counts each active expert of each plan once. */
static void test_engine_observer(void **state)
{
    if (!tu_refdata_exists("models/qwen35moe-tiny-Q8_0.gguf")) {
        print_message("skipped: no qwen35moe-tiny-Q8_0.gguf in refdata\n");
        return;
    }
    char *model = tu_refdata_path("models/qwen35moe-tiny-Q8_0.gguf");
    char *trace = tu_path_join(tmpdir, "route.trace");
    struct sil_engine_stats s0, s1;
    int32_t L, V;
    float *plain = run_engine(model, NULL, 0, &s0, &L, &V);
    float *seen = run_engine(model, trace, 7, &s1, &L, &V);
    assert_memory_equal(plain, seen, sizeof(float) * (size_t)V * 43);
    assert_int_equal(s0.ecache_hits + s0.ecache_misses, 0);
    assert_true(s1.ecache_hits > 0 && s1.ecache_misses > 0);

    struct sil_route_trace t;
    struct sil_error err = {0};
    assert_int_equal(sil_route_trace_open(&t, trace, &err), 0);
    assert_int_equal(t.n_layer, (uint32_t)L);
    int32_t *sel = malloc(sizeof(int32_t) * SIL_ROUTE_TRACE_MAX_ROWS * t.n_used);
    uint32_t layer, rows, n_rec = 0, tokens = 0;
    uint64_t active = 0;
    int rc;
    while ((rc = sil_route_trace_read(&t, &layer, &rows, sel, &err)) == 1) {
        assert_int_equal(layer, n_rec % (uint32_t)L);
        if (layer == 0) tokens += rows;
        uint8_t used[256] = {0};
        for (uint32_t i = 0; i < rows * t.n_used; i++) {
            assert_true(sel[i] >= 0 && (uint32_t)sel[i] < t.n_expert);
            active += !used[sel[i]];
            used[sel[i]] = 1;
        }
        n_rec++;
    }
    assert_int_equal(rc, 0);
    fclose(t.f);
    assert_int_equal(tokens, 43);
    assert_int_equal(n_rec, (uint32_t)L * (3 + 3)); /* ubatches of 16, 16, 8, then 3 decodes */
    assert_int_equal(s1.ecache_hits + s1.ecache_misses, active);
    /* the expert bytes the plans named are what a cache with no slot would stream */
    assert_int_equal(s1.ecache_bytes_streamed * (s1.ecache_hits + s1.ecache_misses),
                     s1.expert_bytes * s1.ecache_misses);
    free(sel);
    free(plain);
    free(seen);

    /* heat-map identity: the same file twice is the same model, another quantization is not */
    struct sil_model *a, *b, *c;
    char *other = tu_refdata_path("models/qwen35moe-tiny-Q4_K_M.gguf");
    assert_int_equal(sil_model_load(&a, model, &err), 0);
    assert_int_equal(sil_model_load(&b, model, &err), 0);
    assert_int_equal(sil_model_load(&c, other, &err), 0);
    assert_true(sil_heat_model_id(a) == sil_heat_model_id(b));
    assert_true(sil_heat_model_id(a) != sil_heat_model_id(c));
    sil_model_free(a);
    sil_model_free(b);
    sil_model_free(c);
    free(other);
    free(trace);
    free(model);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lru),
        cmocka_unit_test(test_pinning),
        cmocka_unit_test(test_wide_plan),
        cmocka_unit_test(test_lfu),
        cmocka_unit_test(test_heat),
        cmocka_unit_test(test_static),
        cmocka_unit_test(test_pools),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_random_invariants),
        cmocka_unit_test(test_lru_vs_static),
        cmocka_unit_test(test_heat_roundtrip),
        cmocka_unit_test(test_heat_corrupt),
        cmocka_unit_test(test_host_misses),
        cmocka_unit_test(test_host_share),
        cmocka_unit_test(test_admission),
        cmocka_unit_test(test_route_trace),
        cmocka_unit_test(test_engine_observer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
