/* Warm restart of the expert cache (heatkeep.h has the contract). */
#include "daemon/heatkeep.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "daemon/engine/expert_cache.h"
#include "daemon/engine/expert_heat.h"
#include "daemon/log.h"

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* mkdir -p, the last component 0750 (the map says which experts a workload uses). */
static int make_dirs(const char *path)
{
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir) return -ENAMETOOLONG;
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(dir, 0755) < 0 && errno != EEXIST) return -errno;
        *p = '/';
    }
    if (mkdir(dir, 0750) < 0 && errno != EEXIST) return -errno;
    struct stat st;
    if (stat(dir, &st) < 0) return -errno;
    return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

void sil_heatkeep_init(struct sil_heatkeep *h, const struct sil_config *c, bool on)
{
    memset(h, 0, sizeof(*h));
    pthread_mutex_init(&h->mu, NULL);
    h->interval = c->heat_save_interval;
    h->v.on = on;
    snprintf(h->v.load, sizeof h->v.load, "off");
    if (!on) return;
    char dir[PATH_MAX];
    int rc = sil_config_state_dir(c, dir, sizeof dir);
    if (rc == 0) rc = make_dirs(dir);
    if (rc == 0 && strlen(dir) + 1 + strlen(SIL_HEAT_FILE) >= sizeof h->v.path) rc = -ENAMETOOLONG;
    if (rc < 0) {
        sil_warn("state directory %s: %s; the expert heat map is kept in memory only",
                 rc == -ENOENT && !c->state_dir[0] ? "(none: no HOME)" : dir, strerror(-rc));
        return;
    }
    snprintf(h->v.path, sizeof h->v.path, "%s/%s", dir, SIL_HEAT_FILE);
}

void sil_heatkeep_destroy(struct sil_heatkeep *h)
{
    pthread_mutex_destroy(&h->mu);
}

/* Preloading goes in steps so progress can be shown; each step is one engine call. */
#define PRELOAD_STEPS 16

void sil_heatkeep_load(struct sil_heatkeep *h, struct sil_engine *e,
                       void (*progress)(int64_t done, int64_t total, void *user), void *user)
{
    if (!h->v.on) return;
    h->next_save = h->interval > 0 ? mono_s() + h->interval : 0;
    struct sil_engine_stats es;
    sil_engine_stats(e, &es);
    h->saved_rows = es.n_rows; /* what was loaded needs no save until the engine sees more */
    char load[16] = "none", msg[512] = "";
    int64_t hot = 0, placed = 0;
    uint64_t tokens = 0;
    if (!h->v.path[0]) goto out;
    const struct sil_model_info *info = sil_engine_info(e);
    struct sil_heat_map m = {0};
    struct sil_error err = {0};
    int rc = sil_heat_map_load(h->v.path, sil_engine_heat_model_id(e), (uint32_t)info->n_layer,
                               (uint32_t)info->n_expert, &m, &err);
    if (rc == -ENOENT) {
        sil_info("no expert heat map at %s: the expert cache starts cold", h->v.path);
        goto out;
    }
    if (rc == 0) rc = sil_engine_heat_import(e, &m, &err);
    if (rc < 0) {
        snprintf(load, sizeof load, "ignored");
        snprintf(msg, sizeof msg, "%s", err.msg);
        sil_warn("ignoring the expert heat map (%s); starting cold", err.msg);
        sil_heat_map_free(&m);
        goto out;
    }
    snprintf(load, sizeof load, "loaded");
    tokens = m.tokens;
    const int32_t slots = sil_engine_ecache_slots(e);
    const int64_t n_key = (int64_t)m.n_layer * m.n_expert;
    int32_t *keys = malloc((size_t)(n_key > 0 ? n_key : 1) * sizeof(int32_t));
    hot = keys ? sil_heat_map_hottest(&m, keys, n_key) : -ENOMEM;
    if (hot < 0) {
        sil_warn("expert heat map: out of memory for its order; nothing preloaded");
        hot = 0;
    }
    if (slots > 0 && hot > 0) {
        /* What the per-layer pools can take: each layer's hot experts up to its pool. */
        int64_t total = 0;
        for (uint32_t l = 0; l < m.n_layer; l++) {
            int64_t nz = 0;
            for (uint32_t x = 0; x < m.n_expert; x++)
                nz += m.heat[(size_t)l * m.n_expert + x] > 0;
            const int32_t pool = sil_engine_ecache_pool_slots(e, (int32_t)l);
            total += nz < pool ? nz : pool;
        }
        const int64_t step = (hot + PRELOAD_STEPS - 1) / PRELOAD_STEPS;
        for (int64_t i = 0; i < hot && placed < total; i += step) {
            const int64_t n = hot - i < step ? hot - i : step;
            const int64_t p = sil_engine_ecache_preload(e, keys + i, n);
            if (p > 0) placed += p;
            if (progress) progress(placed, total, user);
        }
    }
    free(keys);
    sil_heat_map_free(&m);
    sil_notice("expert heat map loaded from %s: %lld experts hot after %llu tokens, %lld "
               "preloaded into the expert cache (%s)",
               h->v.path, (long long)hot, (unsigned long long)tokens, (long long)placed,
               sil_engine_ecache_mode(e) ? sil_engine_ecache_mode(e) : "(no)");
out:
    pthread_mutex_lock(&h->mu);
    snprintf(h->v.load, sizeof h->v.load, "%s", load);
    snprintf(h->v.load_msg, sizeof h->v.load_msg, "%s", msg);
    h->v.hot = hot;
    h->v.preloaded = placed;
    h->v.tokens_loaded = tokens;
    pthread_mutex_unlock(&h->mu);
}

int sil_heatkeep_save(struct sil_heatkeep *h, const struct sil_engine *e)
{
    if (!h->v.on || !h->v.path[0]) return 0;
    struct sil_heat_map m;
    struct sil_error err = {0};
    int rc = sil_engine_heat_export(e, &m, &err);
    if (rc == 0) {
        rc = sil_heat_map_save(h->v.path, &m, &err);
        sil_heat_map_free(&m);
    }
    pthread_mutex_lock(&h->mu);
    if (rc == 0) {
        struct sil_engine_stats es;
        sil_engine_stats(e, &es);
        h->saved_rows = es.n_rows;
        h->v.saves++;
        h->v.last_save = mono_s();
    } else {
        h->v.save_errors++;
        snprintf(h->v.save_error, sizeof h->v.save_error, "%s", err.msg);
    }
    pthread_mutex_unlock(&h->mu);
    if (rc < 0)
        sil_warn("expert heat map not saved: %s", err.msg);
    else
        sil_debug("expert heat map saved to %s", h->v.path);
    return rc;
}

static bool dirty(const struct sil_heatkeep *h, const struct sil_engine *e)
{
    struct sil_engine_stats es;
    sil_engine_stats(e, &es);
    return es.n_rows != h->saved_rows;
}

void sil_heatkeep_tick(struct sil_heatkeep *h, const struct sil_engine *e, double now)
{
    if (h->interval <= 0 || !h->v.path[0] || now < h->next_save || !dirty(h, e)) return;
    h->next_save = now + h->interval;
    sil_heatkeep_save(h, e);
}

double sil_heatkeep_due(const struct sil_heatkeep *h, const struct sil_engine *e)
{
    if (h->interval <= 0 || !h->v.path[0] || !dirty(h, e)) return 0;
    return h->next_save;
}

void sil_heatkeep_view(struct sil_heatkeep *h, struct sil_heat_view *out)
{
    pthread_mutex_lock(&h->mu);
    *out = h->v;
    pthread_mutex_unlock(&h->mu);
}
