/* Expert plan observer (expert_obs.h has the contract). */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/expert_obs.h"

struct sil_expert_obs {
    struct sil_ecache *cache; /* the simulated cache, or NULL */
    struct sil_ecache *heat;  /* no slots, for its heat map only: when asked and no cache */
    int pol;
    struct sil_engine_observer observer;
    int32_t n_slot;               /* of the simulated cache */
    int32_t *uses;                /* [n_expert] rows of each active expert */
    struct sil_ecache_entry *res; /* [n_expert] */
};

int sil_expert_obs_open(struct sil_expert_obs **out, const struct sil_expert_obs_config *c,
                        struct sil_error *err)
{
    *out = NULL;
    struct sil_expert_obs *o = calloc(1, sizeof(*o));
    if (!o) return sil_errorf(err, -ENOMEM, "expert observer: out of memory");
    int rc = 0;
    if (c->sim_slots >= 0 || c->heat) {
        /* a simulated cache; or for the heat map alone an LRU with no slots, whose lookups are
         * O(n) and only update the decayed frequencies */
        const bool sim = c->sim_slots >= 0;
        const int pol = !sim            ? SIL_ECACHE_LRU
                        : c->sim_policy ? sil_ecache_policy_parse(c->sim_policy)
                                        : SIL_ECACHE_DEFAULT;
        if (pol < 0) {
            rc = sil_errorf(err, -EINVAL,
                            "expert cache policy '%s' unknown (lru, lfu, heat, static)",
                            c->sim_policy);
            goto fail;
        }
        const int64_t n_key = (int64_t)c->n_layer * c->n_expert;
        struct sil_ecache_config k = {
            .n_layer = c->n_layer,
            .n_expert = c->n_expert,
            .n_slot = sim ? (int32_t)(c->sim_slots < n_key ? c->sim_slots : n_key) : 0,
            .policy = pol,
            .expert_bytes = c->expert_bytes,
        };
        o->uses = malloc((size_t)c->n_expert * sizeof(int32_t));
        o->res = malloc((size_t)c->n_expert * sizeof(*o->res));
        if (!o->uses || !o->res) {
            rc = sil_errorf(err, -ENOMEM, "expert observer: out of memory");
            goto fail;
        }
        if ((rc = sil_ecache_create(sim ? &o->cache : &o->heat, &k, err)) < 0) goto fail;
        if (sim) {
            o->pol = pol;
            o->n_slot = k.n_slot;
        }
    }
    *out = o;
    return 0;
fail:
    sil_expert_obs_close(o);
    return rc;
}

static void on_route(void *user, const struct sil_route_event *ev)
{
    struct sil_expert_obs *o = user;
    struct sil_ecache *c = o->cache ? o->cache : o->heat;
    if (!c) return;
    for (int32_t a = 0; a < ev->n_active; a++)
        o->uses[a] = ev->active_start[a + 1] - ev->active_start[a];
    sil_ecache_lookup(c, ev->layer, ev->active, o->uses, ev->n_active, o->res);
}

const struct sil_engine_observer *sil_expert_obs_observer(struct sil_expert_obs *o)
{
    o->observer = (struct sil_engine_observer){.user = o, .on_route = on_route};
    return &o->observer;
}

void sil_expert_obs_layer_stats(const struct sil_expert_obs *o, int32_t layer,
                                struct sil_ecache_stats *out)
{
    if (o && o->cache)
        sil_ecache_stats(o->cache, layer, out);
    else
        memset(out, 0, sizeof(*out));
}

int32_t sil_expert_obs_slots(const struct sil_expert_obs *o)
{
    return o && o->cache ? o->n_slot : 0;
}

int32_t sil_expert_obs_pool_slots(const struct sil_expert_obs *o, int32_t layer)
{
    return o && o->cache ? sil_ecache_pool_slots(o->cache, layer) : 0;
}

const char *sil_expert_obs_policy(const struct sil_expert_obs *o)
{
    return o && o->cache ? sil_ecache_policy_name(o->pol) : NULL;
}

bool sil_expert_obs_heat_export(const struct sil_expert_obs *o, float *heat)
{
    const struct sil_ecache *c = !o ? NULL : o->cache ? o->cache : o->heat;
    if (!c) return false;
    sil_ecache_heat_export(c, heat);
    return true;
}

bool sil_expert_obs_heat_import(struct sil_expert_obs *o, const float *heat)
{
    struct sil_ecache *c = !o ? NULL : o->cache ? o->cache : o->heat;
    if (!c) return false;
    sil_ecache_heat_import(c, heat);
    return true;
}

int sil_expert_obs_preload(struct sil_expert_obs *o, int32_t layer, int32_t expert)
{
    if (!o || !o->cache) return -ENODEV;
    return sil_ecache_preload(o->cache, layer, expert);
}

void sil_expert_obs_stats(const struct sil_expert_obs *o, struct sil_ecache_stats *out)
{
    if (o && o->cache)
        sil_ecache_stats(o->cache, -1, out);
    else
        memset(out, 0, sizeof(*out));
}

void sil_expert_obs_close(struct sil_expert_obs *o)
{
    if (!o) return;
    sil_ecache_free(o->cache);
    sil_ecache_free(o->heat);
    free(o->uses);
    free(o->res);
    free(o);
}
