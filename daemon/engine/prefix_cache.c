/* The prefix cache (prefix_cache.h): per pool block, the tokens and parent it was published
 * with; a publication number per block that changes whenever the block is published again, so
 * a child or a snapshot recorded against an older publication never matches the new one.
 * Snapshots live in a small table with an index by block; all scans are over a prompt's blocks
 * or the snapshot table, both short. */
#include "daemon/engine/prefix_cache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SNAP_MAX 1024 /* snapshot entries at most, whatever the budget */

struct snap {
    int32_t block; /* the chain's last block, -1: entry unused */
    uint32_t gen;  /* its publication the snapshot follows */
    uint64_t used; /* LRU tick */
    float *state;  /* [state_floats] */
};

struct sil_prefix_cache {
    struct sil_kv_cache *kv;
    int32_t n_pool;
    int64_t floats;
    /* per pool block: what it was published with */
    int32_t *tokens; /* [n_pool][SIL_KV_BLOCK] */
    int32_t *parent; /* parent block, -1 for a first block */
    uint32_t *parent_gen, *gen;
    uint64_t *scope;  /* the chain's scope (checked on first blocks; children follow parents) */
    int32_t *snap_of; /* entry of the snapshot after this block, -1: none */
    struct snap *snap;
    int32_t n_snap_max, n_snaps;
    uint64_t tick;
};

static inline uint64_t rotl64(uint64_t x, int r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

uint64_t sil_prefix_root(uint64_t scope)
{
    return fmix64(scope ^ 0x9e3779b97f4a7c15ull) ^ 0x243f6a8885a308d3ull;
}

/* MurmurHash3's 64-bit body over pairs of tokens, seeded with the parent hash. */
uint64_t sil_prefix_hash(uint64_t parent, const int32_t *tokens)
{
    const uint64_t c1 = 0x87c37b91114253d5ull, c2 = 0x4cf5ad432745937full;
    uint64_t h = parent;
    for (int i = 0; i < SIL_KV_BLOCK; i += 2) {
        uint64_t k = (uint64_t)(uint32_t)tokens[i] | (uint64_t)(uint32_t)tokens[i + 1] << 32;
        k *= c1;
        k = rotl64(k, 31);
        k *= c2;
        h ^= k;
        h = rotl64(h, 27) * 5 + 0x52dce729;
    }
    return fmix64(h ^ SIL_KV_BLOCK);
}

int sil_prefix_create(struct sil_prefix_cache **out, struct sil_kv_cache *kv, int64_t state_floats,
                      uint64_t snap_budget, struct sil_error *err)
{
    struct sil_prefix_cache *pc = calloc(1, sizeof(*pc));
    if (!pc) return sil_errorf(err, -ENOMEM, "prefix cache: out of memory");
    pc->kv = kv;
    pc->n_pool = sil_kv_n_blocks(kv);
    pc->floats = state_floats;
    const size_t n = (size_t)pc->n_pool;
    if (state_floats > 0) {
        const uint64_t one = (uint64_t)state_floats * sizeof(float);
        const uint64_t cnt = snap_budget / one;
        pc->n_snap_max = cnt > SNAP_MAX ? SNAP_MAX : (int32_t)cnt;
    }
    /* calloc'd: pages of blocks never published stay untouched */
    pc->tokens = calloc(n * SIL_KV_BLOCK, sizeof(int32_t));
    pc->parent = malloc(n * sizeof(int32_t));
    pc->parent_gen = calloc(n, sizeof(uint32_t));
    pc->gen = calloc(n, sizeof(uint32_t));
    pc->scope = calloc(n, sizeof(uint64_t));
    pc->snap_of = malloc(n * sizeof(int32_t));
    pc->snap = calloc(pc->n_snap_max ? (size_t)pc->n_snap_max : 1, sizeof(*pc->snap));
    if (!pc->tokens || !pc->parent || !pc->parent_gen || !pc->gen || !pc->scope || !pc->snap_of ||
        !pc->snap) {
        sil_prefix_free(pc);
        return sil_errorf(err, -ENOMEM, "prefix cache: out of memory for %d blocks", pc->n_pool);
    }
    memset(pc->parent, 0xff, n * sizeof(int32_t));
    memset(pc->snap_of, 0xff, n * sizeof(int32_t));
    for (int32_t i = 0; i < pc->n_snap_max; i++)
        pc->snap[i].block = -1;
    *out = pc;
    return 0;
}

void sil_prefix_free(struct sil_prefix_cache *pc)
{
    if (!pc) return;
    for (int32_t i = 0; pc->snap && i < pc->n_snap_max; i++)
        free(pc->snap[i].state);
    free(pc->snap);
    free(pc->tokens);
    free(pc->parent);
    free(pc->parent_gen);
    free(pc->gen);
    free(pc->scope);
    free(pc->snap_of);
    free(pc);
}

static void snap_drop(struct sil_prefix_cache *pc, int32_t i)
{
    struct snap *s = &pc->snap[i];
    if (s->block < 0) return;
    if (pc->snap_of[s->block] == i) pc->snap_of[s->block] = -1;
    s->block = -1;
    free(s->state); /* memory follows the snapshots kept */
    s->state = NULL;
    pc->n_snaps--;
}

/* A snapshot whose block was reused for other rows (hash gone) or published again can never
 * be reached: dropped, so the bytes counted are bytes that can still serve a hit. */
static void snap_sweep(struct sil_prefix_cache *pc)
{
    for (int32_t i = 0; i < pc->n_snap_max; i++) {
        const struct snap *s = &pc->snap[i];
        uint64_t h;
        if (s->block >= 0 &&
            (!sil_kv_block_hash(pc->kv, s->block, &h) || pc->gen[s->block] != s->gen))
            snap_drop(pc, i);
    }
}

/* Block b holds the rows of `tokens` after parent (a block of this chain, or -1: the first
 * block of scope). */
static bool block_is(const struct sil_prefix_cache *pc, int32_t b, uint64_t hash, uint64_t scope,
                     int32_t parent, const int32_t *tokens)
{
    uint64_t h;
    if (!sil_kv_block_hash(pc->kv, b, &h) || h != hash || pc->parent[b] != parent) return false;
    if (parent >= 0 ? pc->parent_gen[b] != pc->gen[parent] : pc->scope[b] != scope) return false;
    return memcmp(pc->tokens + (size_t)b * SIL_KV_BLOCK, tokens, SIL_KV_BLOCK * sizeof(int32_t)) ==
           0;
}

/* Follows the chain of tokens' blocks while cached; blocks (may be NULL) gets their ids. */
static int32_t chain_walk(const struct sil_prefix_cache *pc, uint64_t scope, const int32_t *tokens,
                          int32_t max_blocks, int32_t *blocks, int32_t *last)
{
    uint64_t h = sil_prefix_root(scope);
    int32_t prev = -1, i = 0;
    for (; i < max_blocks; i++) {
        const int32_t *t = tokens + (size_t)i * SIL_KV_BLOCK;
        h = sil_prefix_hash(h, t);
        const int32_t b = sil_kv_block_lookup(pc->kv, h);
        if (b < 0 || !block_is(pc, b, h, scope, prev, t)) break;
        if (blocks) blocks[i] = b;
        prev = b;
    }
    *last = prev;
    return i;
}

void sil_prefix_match(struct sil_prefix_cache *pc, uint64_t scope, const int32_t *tokens,
                      int32_t max_blocks, int32_t *blocks, struct sil_prefix_match *m)
{
    int32_t last;
    m->n_blocks = chain_walk(pc, scope, tokens, max_blocks, blocks, &last);
    m->n_usable = m->n_blocks;
    m->state = NULL;
    if (pc->floats <= 0) return;
    /* The recurrence resumes only where a snapshot follows exactly that chain. */
    for (m->n_usable = m->n_blocks; m->n_usable > 0; m->n_usable--) {
        const int32_t b = blocks[m->n_usable - 1], i = pc->snap_of[b];
        if (i >= 0 && pc->snap[i].gen == pc->gen[b]) {
            pc->snap[i].used = ++pc->tick;
            m->state = pc->snap[i].state;
            return;
        }
    }
}

int32_t sil_prefix_publish(struct sil_prefix_cache *pc, int seq, uint64_t scope,
                           const int32_t *tokens, int32_t n)
{
    int32_t nb = 0;
    const int32_t *table = sil_kv_seq_table(pc->kv, seq, &nb);
    const int32_t full = n / SIL_KV_BLOCK;
    if (!table || full > nb) return 0;
    uint64_t h = sil_prefix_root(scope);
    int32_t prev = -1;
    for (int32_t i = 0; i < full; i++) {
        const int32_t *t = tokens + (size_t)i * SIL_KV_BLOCK;
        h = sil_prefix_hash(h, t);
        const int32_t b = table[i];
        if (block_is(pc, b, h, scope, prev, t)) { /* published before (this sequence, or shared) */
            prev = b;
            continue;
        }
        const int32_t c = sil_kv_block_lookup(pc->kv, h);
        if (c >= 0 && block_is(pc, c, h, scope, prev, t)) {
            /* The same rows are cached already: the chain goes on from them. */
            prev = c;
            continue;
        }
        /* b's rows are about to be described anew: what followed its old publication goes. */
        if (pc->snap_of[b] >= 0) snap_drop(pc, pc->snap_of[b]);
        pc->gen[b]++;
        pc->parent[b] = prev;
        pc->parent_gen[b] = prev >= 0 ? pc->gen[prev] : 0;
        pc->scope[b] = scope;
        memcpy(pc->tokens + (size_t)b * SIL_KV_BLOCK, t, SIL_KV_BLOCK * sizeof(int32_t));
        sil_kv_block_set_hash(pc->kv, b, h);
        prev = b;
    }
    return full;
}

int sil_prefix_snapshot(struct sil_prefix_cache *pc, uint64_t scope, const int32_t *tokens,
                        int32_t n_blocks, const float *state, struct sil_error *err)
{
    if (pc->floats <= 0 || pc->n_snap_max == 0 || n_blocks <= 0) return 0;
    int32_t last;
    if (chain_walk(pc, scope, tokens, n_blocks, NULL, &last) != n_blocks)
        return sil_errorf(err, -ENOENT, "prefix cache: no cached chain of %d blocks to snapshot",
                          n_blocks);
    const size_t bytes = sizeof(float) * (size_t)pc->floats;
    int32_t at = pc->snap_of[last];
    if (at >= 0 && pc->snap[at].gen == pc->gen[last]) { /* the same chain: the same state */
        pc->snap[at].used = ++pc->tick;
        return 0;
    }
    snap_sweep(pc);
    at = -1;
    for (int32_t i = 0; i < pc->n_snap_max && at < 0; i++)
        if (pc->snap[i].block < 0) at = i;
    if (at < 0) { /* full: the least recently used goes */
        at = 0;
        for (int32_t i = 1; i < pc->n_snap_max; i++)
            if (pc->snap[i].used < pc->snap[at].used) at = i;
        snap_drop(pc, at);
    }
    float *buf = malloc(bytes);
    if (!buf)
        return sil_errorf(err, -ENOMEM, "prefix cache: out of memory for a %zu-byte snapshot",
                          bytes);
    memcpy(buf, state, bytes);
    pc->snap[at] = (struct snap){last, pc->gen[last], ++pc->tick, buf};
    pc->snap_of[last] = at;
    pc->n_snaps++;
    return 0;
}

void sil_prefix_info(struct sil_prefix_cache *pc, struct sil_prefix_info *out)
{
    snap_sweep(pc);
    out->n_blocks = sil_kv_n_hashed(pc->kv);
    out->n_cached = sil_kv_n_cached(pc->kv);
    out->n_snapshots = pc->n_snaps;
    out->snapshot_bytes = (uint64_t)pc->n_snaps * (uint64_t)pc->floats * sizeof(float);
}
