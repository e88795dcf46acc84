/* The automatic prefix cache: full KV blocks (kv_cache.h) found again by the tokens before and
 * in them, so a new sequence whose prompt starts like an earlier one attaches those blocks
 * instead of evaluating them.
 *
 * A block's key is a hash chain: h_0 = hash(root, tokens of block 0), h_i = hash(h_{i-1},
 * tokens of block i). The kv cache maps hashes to blocks and evicts unreferenced ones LRU; this
 * module keeps beside each published block its tokens and its parent (block id and publication
 * number), and a match accepts a block only when both agree: a hash collision can cost a hit,
 * never give KV of other tokens. Chains live in scopes (e.g. one per user): a chain of one scope
 * never matches in another, so nobody learns from a hit what someone else's prompts held.
 *
 * Models with recurrent layers (gated delta net) cannot resume a sequence from KV alone: the
 * recurrent state after the reused prefix is needed too. Snapshots of it are kept keyed by the
 * chain's last block (id and publication number), bounded in bytes, least recently used dropped
 * first; a match is clamped to the longest prefix that has one.
 *
 * Ownership: the cache borrows the kv cache (which must outlive it) and owns its snapshots
 * (malloc'd when taken, between evaluations). One thread at a time (the engine's). */
#ifndef SIL_PREFIX_CACHE_H
#define SIL_PREFIX_CACHE_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/engine/kv_cache.h"
#include "kernels/error.h"

/* The parent hash of a sequence's first block in a scope. */
uint64_t sil_prefix_root(uint64_t scope);
/* The chain hash of one full block (SIL_KV_BLOCK tokens) after a parent hash. */
uint64_t sil_prefix_hash(uint64_t parent, const int32_t *tokens);

struct sil_prefix_cache;

/* state_floats: size of one recurrent-state snapshot (0: the model has none, no snapshot is
 * needed); snap_budget: bytes of snapshots kept at most (0: none, so a model with recurrent
 * layers never hits). */
int sil_prefix_create(struct sil_prefix_cache **out, struct sil_kv_cache *kv, int64_t state_floats,
                      uint64_t snap_budget, struct sil_error *err);
void sil_prefix_free(struct sil_prefix_cache *pc);

/* A match of tokens[0, 64 max_blocks): n_blocks chained blocks are cached (their ids in
 * blocks[], which has room for max_blocks); n_usable of them can be reused: n_blocks without
 * recurrent layers, else the longest prefix with a snapshot after it (state: that snapshot,
 * valid until the next call that changes the cache; NULL when n_usable is 0). */
struct sil_prefix_match {
    int32_t n_blocks, n_usable;
    const float *state;
};
void sil_prefix_match(struct sil_prefix_cache *pc, uint64_t scope, const int32_t *tokens,
                      int32_t max_blocks, int32_t *blocks, struct sil_prefix_match *m);

/* Publishes the full blocks of seq that hold tokens[0, n) (n <= the sequence's length): each
 * becomes findable by its chain. A block that is already cached with the same chain is left as
 * it is (the chain goes on from it). Returns the number of full blocks now chained. */
int32_t sil_prefix_publish(struct sil_prefix_cache *pc, int seq, uint64_t scope,
                           const int32_t *tokens, int32_t n);

/* Keeps a snapshot of the recurrent state after the first n_blocks blocks of tokens (their chain
 * must be published: call sil_prefix_publish first). -ENOENT when the chain is not cached,
 * -ENOMEM; a no-op without recurrent layers or budget. */
int sil_prefix_snapshot(struct sil_prefix_cache *pc, uint64_t scope, const int32_t *tokens,
                        int32_t n_blocks, const float *state, struct sil_error *err);

struct sil_prefix_info {
    int32_t n_blocks; /* blocks findable by hash (in use or cached) */
    int32_t n_cached; /* of which no sequence holds: kept only for later hits */
    int32_t n_snapshots;
    uint64_t snapshot_bytes;
};
/* Drops snapshots that can no longer be reached first (their block was reused). */
void sil_prefix_info(struct sil_prefix_cache *pc, struct sil_prefix_info *out);

#endif
