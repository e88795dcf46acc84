/* Route trace and replay observer (route_obs.h has the contract). */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/engine/route_obs.h"
#include "daemon/engine/route_trace.h"

struct sil_route_obs {
    struct sil_engine_observer observer;
    const char *trace_path, *replay_path;
    bool tracing, replaying;
    struct sil_route_trace trace, replay;
    int32_t *sel; /* [SIL_ROUTE_TRACE_MAX_ROWS * n_used] the record being replayed */
    /* the first record that did not fit (sticky, -EINVAL, msg says why) */
    int err;
    char msg[192];
    struct sil_route_obs_stats st;
};

static int on_open(void *user, const struct sil_model_info *info, struct sil_error *err)
{
    struct sil_route_obs *o = user;
    if (info->n_expert <= 0)
        return sil_errorf(err, -EINVAL, "engine: %s has no experts to %s", info->arch_name,
                          o->trace_path ? "trace or cache" : "route");
    if (o->trace_path) {
        int rc =
            sil_route_trace_create(&o->trace, o->trace_path, (uint32_t)info->n_layer,
                                   (uint32_t)info->n_expert, (uint32_t)info->n_expert_used, err);
        if (rc < 0) return rc;
        o->tracing = true;
    }
    if (!o->replay_path) return 0;
    o->sel = malloc(sizeof(int32_t) * SIL_ROUTE_TRACE_MAX_ROWS * (size_t)info->n_expert_used);
    if (!o->sel) return sil_errorf(err, -ENOMEM, "engine: out of memory");
    int rc = sil_route_trace_open(&o->replay, o->replay_path, err);
    if (rc < 0) return rc;
    o->replaying = true;
    const struct sil_route_trace *t = &o->replay;
    if (t->n_layer != (uint32_t)info->n_layer || t->n_expert != (uint32_t)info->n_expert ||
        t->n_used != (uint32_t)info->n_expert_used)
        return sil_errorf(err, -EINVAL,
                          "%s: a trace of %u layers, %u experts, %u a row; the model has %d, "
                          "%d, %d",
                          o->replay_path, t->n_layer, t->n_expert, t->n_used, info->n_layer,
                          info->n_expert, info->n_expert_used);
    return 0;
}

/* The next replayed record for layer il's rows, or NULL (the top-k) once one did not fit. */
static const int32_t *choose(void *user, int32_t il, int32_t rows)
{
    struct sil_route_obs *o = user;
    if (o->err) return NULL;
    uint32_t layer = 0, n = 0;
    struct sil_error err = {0};
    const int rc = sil_route_trace_read(&o->replay, &layer, &n, o->sel, &err);
    if (rc == 1 && (int32_t)layer == il && (int64_t)n == rows) return o->sel;
    o->err = -EINVAL;
    if (rc < 0)
        snprintf(o->msg, sizeof o->msg, "route replay: %.160s", err.msg);
    else if (rc == 0)
        snprintf(o->msg, sizeof o->msg,
                 "route replay: the trace ended before layer %d of this evaluation", (int)il);
    else
        snprintf(o->msg, sizeof o->msg,
                 "route replay: record %llu is layer %u with %u rows, this evaluation routes "
                 "layer %d with %lld",
                 (unsigned long long)o->st.replay_records + 1, layer, n, (int)il, (long long)rows);
    return NULL;
}

static void on_route(void *user, const struct sil_route_event *ev)
{
    struct sil_route_obs *o = user;
    if (o->tracing)
        sil_route_trace_write(&o->trace, (uint32_t)ev->layer, (uint32_t)ev->n_rows, ev->expert);
    if (!ev->forced) return;
    o->st.replay_records++;
    o->st.replay_changed += (uint64_t)ev->forced_changed;
    if (ev->forced_gap > o->st.replay_gap) o->st.replay_gap = ev->forced_gap;
    if (ev->forced_bad && !o->err) {
        o->err = -EINVAL;
        snprintf(o->msg, sizeof o->msg,
                 "route replay: record %llu (layer %d) repeats an expert in a row",
                 (unsigned long long)o->st.replay_records, (int)ev->layer);
    }
}

static int on_pass_end(void *user, struct sil_error *err)
{
    struct sil_route_obs *o = user;
    return o->err ? sil_errorf(err, o->err, "%s", o->msg) : 0;
}

int sil_route_obs_create(struct sil_route_obs **out, const char *trace_path,
                         const char *replay_path, struct sil_error *err)
{
    struct sil_route_obs *o = calloc(1, sizeof(*o));
    *out = o;
    if (!o) return sil_errorf(err, -ENOMEM, "route observer: out of memory");
    o->trace_path = trace_path;
    o->replay_path = replay_path;
    o->observer = (struct sil_engine_observer){
        .user = o,
        .host_routes = trace_path != NULL, /* a trace sees every layer's choices */
        .on_open = on_open,
        .choose = replay_path ? choose : NULL,
        .on_route = on_route,
        .on_pass_end = on_pass_end,
    };
    return 0;
}

const struct sil_engine_observer *sil_route_obs_observer(struct sil_route_obs *o)
{
    return &o->observer;
}

void sil_route_obs_stats(const struct sil_route_obs *o, struct sil_route_obs_stats *out)
{
    *out = o->st;
}

int sil_route_obs_free(struct sil_route_obs *o, struct sil_error *err)
{
    if (!o) return 0;
    int rc = o->tracing ? sil_route_trace_close(&o->trace, err) : 0;
    if (o->replaying) {
        struct sil_error rerr;
        sil_route_trace_close(&o->replay, &rerr); /* read only: nothing to report */
    }
    free(o->sel);
    free(o);
    return rc;
}
