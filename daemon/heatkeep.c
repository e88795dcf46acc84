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
    char note[2 * PATH_MAX];
    int rc = sil_config_make_state_dir(c, h->dir, sizeof h->dir, note, sizeof note);
    /* room for "/expert-heat-" and the name sil_heat_file_name makes */
    if (rc == 0 && strlen(h->dir) + 64 >= sizeof h->v.path) rc = -ENAMETOOLONG;
    if (rc < 0) {
        if (note[0])
            sil_warn("state directory unusable (%s); the expert heat map is kept in memory only",
                     note);
        else
            sil_warn("state directory %s: %s; the expert heat map is kept in memory only",
                     h->dir[0] ? h->dir : "(none)", strerror(-rc));
        h->dir[0] = 0;
    } else if (note[0]) {
        sil_info("state directory: %s", note);
    }
}

/* e's file in the state directory: 0, or -ENAMETOOLONG (then out is ""). */
static int heat_path(const struct sil_heatkeep *h, const struct sil_engine *e, char *out,
                     size_t size)
{
    char name[128];
    out[0] = 0;
    if (sil_engine_heat_file_name(e, name, sizeof name) < 0) return -ENAMETOOLONG;
    const int n = snprintf(out, size, "%s/%s", h->dir, name);
    if (n < 0 || (size_t)n >= size) {
        out[0] = 0;
        return -ENAMETOOLONG;
    }
    return 0;
}

/* No file of this model's: the single file of earlier versions is taken over when it is this
 * model's (renamed to path), else left as it is. Returns what sil_engine_heat_restore did with
 * it, or -ENOENT when there is none. */
static int restore_legacy(const struct sil_heatkeep *h, struct sil_engine *e, const char *path,
                          void (*progress)(int64_t done, int64_t total, void *user), void *user,
                          struct sil_heat_restore *r)
{
    char old[PATH_MAX + 16];
    snprintf(old, sizeof old, "%s/%s", h->dir, SIL_HEAT_LEGACY_FILE);
    struct sil_error err = {0};
    const int rc = sil_engine_heat_restore(e, old, progress, user, r, &err);
    if (rc == -ENOENT) return rc;
    if (rc < 0) {
        sil_info("%s, the single heat map of earlier versions, is not this model's (%s): left "
                 "as it is; maps are kept per model now (%s)",
                 old, err.msg, path);
        return -ENOENT;
    }
    if (rename(old, path) < 0)
        sil_warn("expert heat map %s: not renamed to %s: %s", old, path, strerror(errno));
    else
        sil_notice("expert heat map %s renamed to %s: maps are kept per model now", old, path);
    return 0;
}
/* Only models with routed experts have a map (with models by name a daemon may load both). */
static bool has_experts(const struct sil_engine *e) { return sil_engine_info(e)->n_expert > 0; }

void sil_heatkeep_destroy(struct sil_heatkeep *h)
{
    pthread_mutex_destroy(&h->mu);
}

void sil_heatkeep_load(struct sil_heatkeep *h, struct sil_engine *e,
                       void (*progress)(int64_t done, int64_t total, void *user), void *user)
{
    if (!h->v.on || !has_experts(e)) return;
    h->next_save = h->interval > 0 ? mono_s() + h->interval : 0;
    struct sil_engine_stats es;
    sil_engine_stats(e, &es);
    h->saved_rows = es.n_rows; /* what was loaded needs no save until the engine sees more */
    char load[16] = "none", msg[512] = "", path[PATH_MAX] = "";
    struct sil_heat_restore r = {0};
    if (!h->dir[0] || heat_path(h, e, path, sizeof path) < 0) goto out;
    struct sil_error err = {0};
    int rc = sil_engine_heat_restore(e, path, progress, user, &r, &err);
    if (rc == -ENOENT) rc = restore_legacy(h, e, path, progress, user, &r);
    if (rc == -ENOENT) {
        sil_info("no expert heat map at %s: the expert cache starts cold", path);
        goto out;
    }
    if (rc < 0) {
        snprintf(load, sizeof load, "ignored");
        snprintf(msg, sizeof msg, "%s", err.msg);
        sil_warn("ignoring the expert heat map (%s); starting cold", err.msg);
        goto out;
    }
    snprintf(load, sizeof load, "loaded");
    const char *mode = sil_engine_ecache_mode(e);
    if (mode)
        sil_notice("expert heat map loaded from %s: %lld experts hot after %llu tokens, %lld "
                   "preloaded into the expert cache (%s)",
                   path, (long long)r.hot, (unsigned long long)r.tokens, (long long)r.placed, mode);
    else
        sil_notice("expert heat map loaded from %s: %lld experts hot after %llu tokens; no expert "
                   "cache to preload them into (every expert is read where it lies)",
                   path, (long long)r.hot, (unsigned long long)r.tokens);
out:
    pthread_mutex_lock(&h->mu);
    snprintf(h->v.path, sizeof h->v.path, "%s", path);
    snprintf(h->v.load, sizeof h->v.load, "%s", load);
    snprintf(h->v.load_msg, sizeof h->v.load_msg, "%s", msg);
    h->v.hot = r.hot;
    h->v.preloaded = r.placed;
    h->v.tokens_loaded = r.tokens;
    pthread_mutex_unlock(&h->mu);
}

int sil_heatkeep_save(struct sil_heatkeep *h, const struct sil_engine *e)
{
    char path[PATH_MAX];
    if (!h->v.on || !has_experts(e) || !h->dir[0] || heat_path(h, e, path, sizeof path) < 0)
        return 0;
    struct sil_error err = {0};
    const int rc = sil_engine_heat_save(e, path, &err);
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
        sil_debug("expert heat map saved to %s", path);
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
    if (h->interval <= 0 || !h->v.path[0] || !has_experts(e) || now < h->next_save ||
        !dirty(h, e))
        return;
    h->next_save = now + h->interval;
    sil_heatkeep_save(h, e);
}

double sil_heatkeep_due(const struct sil_heatkeep *h, const struct sil_engine *e)
{
    if (h->interval <= 0 || !h->v.path[0] || !has_experts(e) || !dirty(h, e)) return 0;
    return h->next_save;
}

void sil_heatkeep_view(struct sil_heatkeep *h, struct sil_heat_view *out)
{
    pthread_mutex_lock(&h->mu);
    *out = h->v;
    pthread_mutex_unlock(&h->mu);
}
