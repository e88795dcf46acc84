/* Warm restart: the engine's expert heat map kept in the state directory, one file per model
 * (sil_heat_file_name: its name and identity in the file name). At start the model's file is
 * loaded (a missing one is a cold start; a corrupt one, or one of another model, is ignored with a
 * warning) and its hottest experts are preloaded into the engine's expert cache (for now the
 * cache simulated on the CPU, when ecache_slots is set); the engine thread saves the map every
 * heat_save_interval seconds and at shutdown, atomically (expert_heat.h).
 *
 * Threads: load and save run where the engine is used (the loop before the worker starts, then
 * the engine thread); the figures status shows are read from any thread under mu. Ownership: the
 * server owns the struct for the daemon's lifetime. */
#ifndef SIL_DAEMON_HEATKEEP_H
#define SIL_DAEMON_HEATKEEP_H

#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/engine/engine.h"

/* The single file of earlier versions, for every model: taken over (renamed to the model's
 * own) when it is this model's, else left alone with a line saying so. */
#define SIL_HEAT_LEGACY_FILE "expert-heat"

/* What status shows (a snapshot). */
struct sil_heat_view {
    bool on;                /* the engine keeps a heat map */
    char path[PATH_MAX];    /* the model's file; "" when not saved (no usable state directory) */
    char load[16];          /* "loaded", "none" (no file: cold), "ignored" (warned), "off" */
    char load_msg[512];     /* why it was ignored, or "" */
    int64_t hot;            /* experts with heat in the map loaded */
    int64_t preloaded;      /* of which placed in the expert cache */
    uint64_t tokens_loaded; /* tokens the loaded map had seen */
    uint64_t saves, save_errors;
    double last_save;     /* CLOCK_MONOTONIC seconds of the last good save, 0: none */
    char save_error[512]; /* the last failed save, "" */
};

struct sil_heatkeep {
    pthread_mutex_t mu;
    char dir[PATH_MAX];     /* the state directory, "" when there is none (set at init) */
    struct sil_heat_view v; /* under mu */
    int interval;           /* seconds between saves, 0: at shutdown only */
    double next_save;       /* engine thread */
    uint64_t saved_rows; /* engine thread: the engine's rows at the last save (unchanged: skip) */
};

/* Resolves and creates (0750) the state directory; a failure leaves the map unsaved with a
 * warning (never fatal). on: the engine was opened with heat_map. */
void sil_heatkeep_init(struct sil_heatkeep *h, const struct sil_config *c, bool on);
void sil_heatkeep_destroy(struct sil_heatkeep *h);

/* Loads e's file (a reload's new model has its own) into e and preloads its hottest experts, reporting progress (done of total
 * experts) through progress (may be NULL). Never fails: what happened is in the view and the
 * log. */
void sil_heatkeep_load(struct sil_heatkeep *h, struct sil_engine *e,
                       void (*progress)(int64_t done, int64_t total, void *user), void *user);
/* Saves e's map to e's file now: 0 or -errno (logged, counted). */
int sil_heatkeep_save(struct sil_heatkeep *h, const struct sil_engine *e);
/* The periodic save, called by the engine thread between steps and when idle: saves when the
 * interval has passed and the engine evaluated rows since the last save. */
void sil_heatkeep_tick(struct sil_heatkeep *h, const struct sil_engine *e, double now);
/* When the engine thread should wake for the next periodic save (CLOCK_MONOTONIC seconds), or
 * 0 when none is pending (off, or nothing new to save). */
double sil_heatkeep_due(const struct sil_heatkeep *h, const struct sil_engine *e);

void sil_heatkeep_view(struct sil_heatkeep *h, struct sil_heat_view *out);

#endif
