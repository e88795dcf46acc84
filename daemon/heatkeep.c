/* Warm restart of the expert cache (heatkeep.h has the contract). */
#include "daemon/heatkeep.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/log.h"

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
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
    int rc = sil_config_make_state_dir(c, dir, sizeof dir);
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

void sil_heatkeep_load(struct sil_heatkeep *h, struct sil_engine *e,
                       void (*progress)(int64_t done, int64_t total, void *user), void *user)
{
    if (!h->v.on) return;
    h->next_save = h->interval > 0 ? mono_s() + h->interval : 0;
    struct sil_engine_stats es;
    sil_engine_stats(e, &es);
    h->saved_rows = es.n_rows; /* what was loaded needs no save until the engine sees more */
    char load[16] = "none", msg[512] = "";
    struct sil_heat_restore r = {0};
    if (!h->v.path[0]) goto out;
    struct sil_error err = {0};
    const int rc = sil_engine_heat_restore(e, h->v.path, progress, user, &r, &err);
    if (rc == -ENOENT) {
        sil_info("no expert heat map at %s: the expert cache starts cold", h->v.path);
        goto out;
    }
    if (rc < 0) {
        snprintf(load, sizeof load, "ignored");
        snprintf(msg, sizeof msg, "%s", err.msg);
        sil_warn("ignoring the expert heat map (%s); starting cold", err.msg);
        goto out;
    }
    snprintf(load, sizeof load, "loaded");
    sil_notice("expert heat map loaded from %s: %lld experts hot after %llu tokens, %lld "
               "preloaded into the expert cache (%s)",
               h->v.path, (long long)r.hot, (unsigned long long)r.tokens, (long long)r.placed,
               sil_engine_ecache_mode(e) ? sil_engine_ecache_mode(e) : "(no)");
out:
    pthread_mutex_lock(&h->mu);
    snprintf(h->v.load, sizeof h->v.load, "%s", load);
    snprintf(h->v.load_msg, sizeof h->v.load_msg, "%s", msg);
    h->v.hot = r.hot;
    h->v.preloaded = r.placed;
    h->v.tokens_loaded = r.tokens;
    pthread_mutex_unlock(&h->mu);
}

int sil_heatkeep_save(struct sil_heatkeep *h, const struct sil_engine *e)
{
    if (!h->v.on || !h->v.path[0]) return 0;
    struct sil_error err = {0};
    const int rc = sil_engine_heat_save(e, h->v.path, &err);
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
