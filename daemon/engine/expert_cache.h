/* Expert cache policy: which routed experts stay resident in a pool of equal slots (one slot =
 * gate + up + down of one expert of one layer), independent of where the slots live. The
 * mechanism (copying a miss into its slot, running a miss from host memory) is the caller's.
 *
 * A lookup takes one layer's expert plan (the distinct experts of a ubatch at that layer) and
 * answers per expert: HIT (its slot), FILL (a miss with the slot to copy it into, and what that
 * slot held), or HOST (a miss with no slot left: run it from host memory). Every expert of one
 * plan is pinned for that plan: a fill never evicts an expert the same plan hits or fills, so a
 * plan wider than the pool gets HOST answers instead of evicting its own experts.
 *
 * Pools: one per layer (n_slot split equally over the layers, the first n_slot % n_layer layers
 * get one more; every layer routes the same n_expert_used per token) or one global pool.
 * Policies (within a pool):
 *   LRU    least recently used is evicted.
 *   LFU    least decayed frequency is evicted (ties to the lower slot).
 *   HEAT   LRU over a probation segment; the `protect` fraction of the pool holding the
 *          hottest experts by decayed frequency is never evicted while probation has an
 *          unpinned slot (a probation hit hotter than the coldest protected expert swaps in).
 *   STATIC the "pin the hottest set" baseline: an expert in the pinned part of a pool is never
 *          evicted. With n_stage 0 only sil_ecache_preload places experts and every miss is
 *          HOST. With n_stage > 0 the last n_stage slots of each pool are a staging area that
 *          misses are copied through (evicting the least recently used there), for a mechanism
 *          that cannot run an expert from host memory; the pinned part holds what was preloaded
 *          (the heat map's hottest, preloaded first) and then the first misses seen.
 * Decayed frequency (every policy keeps it: it is the heat map): each use adds the rows routed
 * to the expert, and the sum halves every half_life lookups of a layer (tokens, in decode).
 *
 * Cost: a lookup is O(n) for LRU, O(n log slots) for LFU and HEAT, and never allocates; the
 * state is sized at create. Ownership: the cache owns its arrays; res and the input arrays are
 * the caller's. One thread at a time. */
#ifndef SIL_EXPERT_CACHE_H
#define SIL_EXPERT_CACHE_H

#include <stdint.h>

#include "kernels/error.h"

enum sil_ecache_policy {
    SIL_ECACHE_LRU,
    SIL_ECACHE_LFU,
    SIL_ECACHE_HEAT,
    SIL_ECACHE_STATIC,
    SIL_ECACHE_POLICY_COUNT,
};

/* The best adaptive policy measured (sil-cachesim, bench/results/cachesim-*): LFU with decay
 * had the highest warm hit rate of lru / lfu / heat at every size, on synthetic and recorded
 * routing. A static set chosen from the cold turn did better still where tokens do not reuse
 * their neighbours' experts (random-weight models), worse where they do (--reuse 0.6). */
#define SIL_ECACHE_DEFAULT SIL_ECACHE_LFU

enum sil_ecache_pools {
    SIL_ECACHE_PER_LAYER,
    SIL_ECACHE_GLOBAL,
};

struct sil_ecache_config {
    int32_t n_layer, n_expert; /* keys are (layer, expert) */
    int32_t n_slot;            /* slots in all (0: every lookup misses) */
    enum sil_ecache_policy policy;
    enum sil_ecache_pools pools;
    double half_life;      /* lookups of one layer; 0: 64 */
    double protect;        /* HEAT: fraction of a pool protected, [0, 1); 0: 0.5 */
    uint64_t expert_bytes; /* gate + up + down of one expert, for the streamed-bytes counter */
    int32_t n_stage;       /* STATIC: slots of each pool misses stream through (at most half of
                            * the pool; 0: none, every miss is HOST); other policies ignore it */
};

enum sil_ecache_kind {
    SIL_ECACHE_HIT,
    SIL_ECACHE_FILL,
    SIL_ECACHE_HOST,
};

/* Answer for one expert of a plan. */
struct sil_ecache_entry {
    int32_t kind;                      /* enum sil_ecache_kind */
    int32_t slot;                      /* HIT: where it is; FILL: where to copy it; HOST: -1 */
    int32_t evict_layer, evict_expert; /* FILL: what the slot held, -1 when it was empty */
};

/* Counters since create or the last reset; misses = fills + host. bytes_streamed counts every
 * miss (a fill crosses the bus into its slot, a host miss is read from host memory). */
struct sil_ecache_stats {
    uint64_t lookups, hits, misses, fills, host, evictions, bytes_streamed;
};

struct sil_ecache;

/* -EINVAL for a bad config (message names the field), -ENOMEM. */
int sil_ecache_create(struct sil_ecache **out, const struct sil_ecache_config *c,
                      struct sil_error *err);
void sil_ecache_free(struct sil_ecache *c);

/* One layer's plan: expert[0..n) distinct ids, uses[i] the rows routed to expert[i] (NULL: 1
 * each). Fills res[0..n); returns how many are HOST (the plan did not fit), or -EINVAL for a
 * layer or expert out of range (res then untouched past the bad entry, nothing counted). */
int sil_ecache_lookup(struct sil_ecache *c, int32_t layer, const int32_t *expert,
                      const int32_t *uses, int32_t n, struct sil_ecache_entry *res);

/* Later lookups leave up to n of each plan's misses, the coldest (lowest decayed frequency),
 * unfilled as HOST: computed from host memory while the rest stream (0: fill every miss). */
void sil_ecache_set_host_misses(struct sil_ecache *c, int32_t n);
/* With share in (0, 1]: of a plan's m misses, round(m * share) (at most the quota above) stay
 * on the host; 0 (the default): the quota whatever m is. */
void sil_ecache_set_host_share(struct sil_ecache *c, double share);

/* Admission (on != 0) for later lookups: a miss is filled only into a free slot or when its
 * decayed frequency, this use counted, exceeds that of the expert it would evict; else it is
 * HOST. For a mechanism that can run misses from host memory at no extra cost (zero-copy
 * reads), so a cold expert does not push out a hotter one. Off at create. */
void sil_ecache_set_admission(struct sil_ecache *c, int on);

/* Places (layer, expert) in a free slot of its pool without evicting: the slot, -EEXIST when it
 * is already resident, -ENOSPC when its pool is full, -EINVAL out of range. Preload the hottest
 * first: in LRU order the first preloaded is the most recently used; STATIC pins the first
 * preloaded until its pinned part is full (the rest go to staging). */
int sil_ecache_preload(struct sil_ecache *c, int32_t layer, int32_t expert);

/* LFU: (layer, expert), when resident, becomes the first to go (its decayed frequency 0): a
 * lower level that a higher one took a copy from keeps what the higher one does not hold.
 * Other policies and experts not resident: nothing. */
void sil_ecache_demote(struct sil_ecache *c, int32_t layer, int32_t expert);

/* The slot holding (layer, expert), or -1. */
int32_t sil_ecache_slot_of(const struct sil_ecache *c, int32_t layer, int32_t expert);

/* Decayed frequency of each (layer, expert), heat[layer * n_expert + expert], now; import
 * replaces them (a heat map loaded at start; negative or non-finite values count as 0). */
void sil_ecache_heat_export(const struct sil_ecache *c, float *heat);
void sil_ecache_heat_import(struct sil_ecache *c, const float *heat);

/* layer -1: all layers. */
void sil_ecache_stats(const struct sil_ecache *c, int32_t layer, struct sil_ecache_stats *out);
void sil_ecache_reset_stats(struct sil_ecache *c);

/* Slots of layer's pool (the whole pool when global). */
int32_t sil_ecache_pool_slots(const struct sil_ecache *c, int32_t layer);

const char *sil_ecache_policy_name(enum sil_ecache_policy p);
/* By name ("lru", "lfu", "heat", "static"); -1 when unknown. */
int sil_ecache_policy_parse(const char *name);

#endif
