/* The engine's own observer of its expert plans (struct sil_engine_observer, off unless asked
 * for): each MoE layer's plan is looked up in a simulated expert cache of a given size and
 * policy, whose hit rates sil_engine_stats reports, and/or counted in a heat map (the decayed
 * use of every expert; the simulated cache's own when there is one, else a cache of no slots
 * kept only for its heat). Only host-routed plans are seen: a plan whose routing stays on the
 * device (CUDA) never reaches the observer. Nothing here changes a plan: the weight handles
 * keep pointing where they did, so logits are the same with it on or off. Route traces are
 * another observer's (route_obs.h).
 * Ownership: the observer owns its cache and its scratch; one thread (the
 * engine's) at a time. */
#ifndef SIL_EXPERT_OBS_H
#define SIL_EXPERT_OBS_H

#include <stdint.h>

#include "daemon/engine/backend.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/expert_cache.h"
#include "kernels/error.h"

struct sil_expert_obs_config {
    int32_t n_layer, n_expert, n_used;
    int32_t sim_slots;      /* < 0: no simulated cache */
    const char *sim_policy; /* NULL: SIL_ECACHE_DEFAULT */
    uint64_t expert_bytes;  /* gate + up + down of one expert */
    bool heat;              /* keep a heat map even without a simulated cache */
};

struct sil_expert_obs;

int sil_expert_obs_open(struct sil_expert_obs **out, const struct sil_expert_obs_config *c,
                        struct sil_error *err);
/* The observer to show every layer's plan to, after it is built and before the experts run
 * (its on_route never allocates); it lives as long as o. */
const struct sil_engine_observer *sil_expert_obs_observer(struct sil_expert_obs *o);
/* The simulated cache's counters (all zero without one). */
void sil_expert_obs_stats(const struct sil_expert_obs *o, struct sil_ecache_stats *out);
/* Per layer (layer -1: all) and the slots of the simulated cache (0 without one). */
void sil_expert_obs_layer_stats(const struct sil_expert_obs *o, int32_t layer,
                                struct sil_ecache_stats *out);
int32_t sil_expert_obs_slots(const struct sil_expert_obs *o);
/* Slots of layer's pool in the simulated cache (0 without one). */
int32_t sil_expert_obs_pool_slots(const struct sil_expert_obs *o, int32_t layer);
/* The simulated cache's policy name, NULL without one. */
const char *sil_expert_obs_policy(const struct sil_expert_obs *o);
/* The heat map, heat[layer * n_expert + expert]: false when neither a heat map nor a simulated
 * cache is kept (heat untouched). Import replaces it. */
bool sil_expert_obs_heat_export(const struct sil_expert_obs *o, float *heat);
bool sil_expert_obs_heat_import(struct sil_expert_obs *o, const float *heat);
/* Places (layer, expert) in the simulated cache (sil_ecache_preload): the slot or -errno;
 * -ENODEV without a simulated cache. */
int sil_expert_obs_preload(struct sil_expert_obs *o, int32_t layer, int32_t expert);
/* Frees everything; o may be NULL. */
void sil_expert_obs_close(struct sil_expert_obs *o);

#endif
