/* Models by name on the loop's side: which model a request is for, the requests that wait while
 * the daemon loads it, the switch itself (through the worker's reload) and keep_alive.
 *
 * One model is loaded at a time. A request for another model (or any request while others
 * wait) waits here, its message kept as it came; once no request runs on the worker, the model
 * the oldest waiting request names is loaded in place of the one in use and every request
 * waiting for it runs, in the order they came; then the next model, if any. Requests that
 * arrive meanwhile wait their turn, even for the model in use, so a stream of requests for one
 * model cannot hold off another's forever, and a mix of models costs one switch per turn, not
 * one per request. keep_alive unloads a model no request used for that long. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>

#include "daemon/log.h"
#include "daemon/server_impl.h"
#include "daemon/worker.h"
#include "siliceo-proto.h"

int sil_server_models_dir(struct server *s, char *out, size_t size)
{
    bool explicit_dir;
    const int rc = sil_models_dir(s->cfg, out, size, &explicit_dir);
    if (rc < 0) out[0] = 0;
    return rc;
}

/* The list for the models method and for errors: names separated by ", " into out. */
static void models_names(struct server *s, char *out, size_t size)
{
    char dir[PATH_MAX];
    sil_server_models_dir(s, dir, sizeof dir);
    struct sil_model_entry *list = NULL;
    size_t n = 0, off = 0;
    out[0] = 0;
    if (sil_models_list(dir, s->cfg->model, &list, &n) < 0) return;
    for (size_t i = 0; i < n; i++) {
        const size_t need = strlen(list[i].name) + 2;
        if (off + need + 5 >= size) {
            snprintf(out + off, size - off, "%s...", off ? ", " : "");
            break;
        }
        off += (size_t)snprintf(out + off, size - off, "%s%s", off ? ", " : "", list[i].name);
    }
    sil_models_free(list);
}

void sil_models_set_loaded(struct server *s)
{
    s->model_path[0] = s->model_name[0] = 0;
    if (!s->engine) return;
    const struct sil_model_info *info = sil_engine_info(s->engine);
    snprintf(s->model_path, sizeof s->model_path, "%s", info->path);
    if (!sil_model_name_of(info->path, s->model_name, sizeof s->model_name))
        s->model_name[0] = 0;
}

/* The loaded model's file, whatever path names it. */
static bool is_loaded(const struct server *s, const char *path)
{
    if (!s->engine) return false;
    if (strcmp(path, s->model_path) == 0) return true;
    const struct sil_model_info *info = sil_engine_info(s->engine);
    struct stat st;
    return stat(path, &st) == 0 && (uint64_t)st.st_dev == info->file_dev &&
           (uint64_t)st.st_ino == info->file_ino;
}

static int not_found(struct conn *c, uint32_t msgid, const char *why)
{
    char names[1024];
    models_names(c->srv, names, sizeof names);
    return sil_send_error(c, msgid, SIL_RPC_E_MODEL_NOT_FOUND, "%s; models: %s", why,
                          names[0] ? names : "none");
}

static void remove_deferred(struct server *s, struct deferred *d)
{
    for (struct deferred **p = &s->deferred; *p; p = &(*p)->next)
        if (*p == d) {
            *p = d->next;
            s->n_deferred--;
            return;
        }
}

int sil_model_pick(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    if (!s->worker || s->replaying) return 1;
    struct sil_rpc_error err = {0};
    const char *name = NULL;
    size_t len = 0;
    if (sil_rpc_get_str(m->params, "model", &name, &len, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE,
                        &err) < 0)
        return sil_send_rpc_error(c, m->msgid, &err);
    char path[PATH_MAX];
    const struct sil_model_info *info = s->engine ? sil_engine_info(s->engine) : NULL;
    if (name && len) {
        char dir[PATH_MAX], why[320];
        sil_server_models_dir(s, dir, sizeof dir);
        if (info && strlen(info->name) == len && memcmp(info->name, name, len) == 0) {
            /* the loaded model's own name (general.name), which earlier versions showed */
            snprintf(path, sizeof path, "%s", s->model_path);
        } else if (sil_models_resolve(dir, s->cfg->model, name, len, path, sizeof path, why,
                                      sizeof why) < 0) {
            return not_found(c, m->msgid, why);
        }
        if (is_loaded(s, path)) snprintf(path, sizeof path, "%s", s->model_path);
    } else if (s->model_path[0]) {
        snprintf(path, sizeof path, "%s", s->model_path);
    } else if (s->switching && s->loading[0]) {
        snprintf(path, sizeof path, "%s", s->loading);
    } else if (s->cfg->model[0]) {
        snprintf(path, sizeof path, "%s", s->cfg->model);
    } else {
        return not_found(c, m->msgid, "no model is loaded: name one with 'model'");
    }
    /* A damaged model, or SIGHUP's reload: admission says so. */
    if (!s->switching && s->model_state != MODEL_OK) return 1;
    if (!s->switching && !s->deferred && s->engine && strcmp(path, s->model_path) == 0) {
        s->t_model_used = now_s();
        return 1;
    }
    /* It waits for its model: counted as the worker's queue is. */
    if (c->n_inflight >= s->cfg->max_client_requests ||
        sil_worker_jobs(s->worker) + s->n_deferred >= s->cfg->max_running + s->cfg->max_queue) {
        s->requests_rejected++;
        return sil_send_error(c, m->msgid, SIL_RPC_E_BUSY,
                              "queue full (%d requests running or waiting for a model)",
                              sil_worker_jobs(s->worker) + s->n_deferred);
    }
    if (sil_inflight_has(c, m->msgid))
        return sil_send_error(c, m->msgid, SIL_RPC_E_INVALID_REQUEST, "msgid %u is already in flight",
                              m->msgid);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    struct deferred *d = NULL;
    if (msgpack_pack_object(&pk, m->root) == 0) d = malloc(sizeof(*d) + sb.size);
    if (!d || sil_inflight_add(c, m->msgid) < 0) {
        free(d);
        msgpack_sbuffer_destroy(&sb);
        return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    }
    d->next = NULL;
    d->conn_id = c->id;
    d->msgid = m->msgid;
    snprintf(d->path, sizeof d->path, "%s", path);
    d->len = sb.size;
    memcpy(d->data, sb.data, sb.size);
    msgpack_sbuffer_destroy(&sb);
    struct deferred **p = &s->deferred;
    while (*p)
        p = &(*p)->next;
    *p = d;
    s->n_deferred++;
    sil_debug("client %llu: %s (msgid %u) waits for the model %s", (unsigned long long)c->id,
              m->method, m->msgid, path);
    sil_models_pump(s);
    return 0;
}

/* Runs every waiting request for the loaded model, in the order they came. */
static void replay(struct server *s)
{
    struct deferred *mine = NULL, **tail = &mine;
    for (struct deferred **p = &s->deferred; *p;) {
        struct deferred *d = *p;
        if (strcmp(d->path, s->model_path) == 0) {
            *p = d->next;
            s->n_deferred--;
            d->next = NULL;
            *tail = d;
            tail = &d->next;
        } else {
            p = &d->next;
        }
    }
    s->replaying = true;
    while (mine) {
        struct deferred *d = mine;
        mine = d->next;
        struct conn *c = sil_conn_find(s, d->conn_id);
        if (c) {
            sil_inflight_remove(c, d->msgid);
            struct sil_rpc_msg msg;
            struct sil_rpc_error err = {0};
            if (sil_rpc_decode(d->data, d->len, d->len + 1, 0, &msg, &err) < 0) {
                sil_send_error(c, d->msgid, SIL_RPC_E_INTERNAL, "the waiting request: %s", err.msg);
            } else {
                sil_dispatch(c, &msg);
                sil_rpc_msg_release(&msg);
            }
        }
        free(d);
    }
    s->replaying = false;
    s->t_model_used = now_s();
}

static void start_load(struct server *s, const char *path)
{
    sil_notice("loading the model %s for a request%s%s", path, s->engine ? " in place of " : "",
               s->engine ? s->model_path : "");
    s->switching = true;
    s->reload_damaged = false;
    snprintf(s->loading, sizeof s->loading, "%s", path);
    s->model_state = MODEL_RELOADING;
    s->reload_t0 = now_s();
    sd_notifyf(0, "RELOADING=1\nSTATUS=loading the model %s", path);
    struct sil_engine_params ep;
    sil_server_engine_params(s, &ep, path);
    sil_tokpool_set_reloading(s->tok, true);
    if (sil_worker_reload(s->worker, &ep) < 0) sil_models_load_failed(s, "out of memory");
}

void sil_models_pump(struct server *s)
{
    if (!s->worker || s->state != RUNNING) return;
    if (sil_worker_jobs(s->worker) > 0) s->t_model_used = now_s();
    if (s->switching || s->model_state != MODEL_OK) return;
    while (s->deferred) {
        if (sil_worker_jobs(s->worker) > 0 || !sil_tokpool_idle(s->tok)) return;
        if (s->engine && strcmp(s->deferred->path, s->model_path) == 0) {
            replay(s);
            continue;
        }
        start_load(s, s->deferred->path);
        return;
    }
}

void sil_models_loaded(struct server *s)
{
    sil_models_set_loaded(s);
    s->model_loads++;
    s->switching = false;
    s->loading[0] = 0;
    s->t_model_used = now_s();
    sil_models_pump(s);
}

void sil_models_load_failed(struct server *s, const char *why)
{
    if (s->switching) {
        char msg[1200];
        snprintf(msg, sizeof msg, "cannot load the model %.400s: %.700s", s->loading, why);
        /* From the head each time: an answer that fails frees its connection's others. */
        for (;;) {
            struct deferred *d = s->deferred;
            while (d && strcmp(d->path, s->loading) != 0)
                d = d->next;
            if (!d) break;
            remove_deferred(s, d);
            struct conn *c = sil_conn_find(s, d->conn_id);
            const uint32_t msgid = d->msgid;
            free(d);
            if (c) {
                sil_inflight_remove(c, msgid);
                sil_send_error(c, msgid, SIL_RPC_E_UNAVAILABLE, "%s", msg);
            }
        }
        s->switching = false;
        s->loading[0] = 0;
        s->model_state = MODEL_OK;
        sil_tokpool_set_reloading(s->tok, false);
    }
    sil_models_pump(s);
}

void sil_models_unloaded(struct server *s)
{
    sil_notice("model %s unloaded after %d s without a request (keep_alive)", s->model_path,
               s->cfg->keep_alive);
    s->engine = NULL;
    s->vocab = NULL;
    sil_models_set_loaded(s);
    s->model_unloads++;
    s->switching = false;
    s->loading[0] = 0;
    s->model_state = MODEL_OK;
    sil_tokpool_set_reloading(s->tok, false);
    sd_notifyf(0, "READY=1\nSTATUS=ready: no model loaded on %s", s->path);
    sil_models_pump(s);
}

void sil_models_tick(struct server *s)
{
    if (!s->worker || s->state != RUNNING || s->cfg->keep_alive <= 0 || !s->engine ||
        s->switching || s->model_state != MODEL_OK || s->deferred)
        return;
    const double t = now_s();
    if (sil_worker_jobs(s->worker) > 0 || !sil_tokpool_idle(s->tok)) {
        s->t_model_used = t;
        return;
    }
    if (t - s->t_model_used < s->cfg->keep_alive) return;
    s->switching = true;
    s->loading[0] = 0;
    s->model_state = MODEL_RELOADING;
    s->reload_t0 = t;
    sil_tokpool_set_reloading(s->tok, true);
    sil_worker_unload(s->worker);
}

int sil_models_cancel(struct conn *c, uint32_t msgid)
{
    struct server *s = c->srv;
    for (struct deferred *d = s->deferred; d; d = d->next) {
        if (d->conn_id != c->id || d->msgid != msgid) continue;
        remove_deferred(s, d);
        free(d);
        sil_inflight_remove(c, msgid);
        return sil_send_error(c, msgid, SIL_RPC_E_CANCELLED, "cancelled while waiting for its model") <
                       0
                   ? -1
                   : 1;
    }
    return 0;
}

void sil_models_conn_gone(struct server *s, uint64_t conn_id)
{
    for (struct deferred *d = s->deferred, *next; d; d = next) {
        next = d->next;
        if (d->conn_id != conn_id) continue;
        remove_deferred(s, d);
        free(d);
    }
}

void sil_models_fail_all(struct server *s, int code, const char *msg)
{
    while (s->deferred) {
        struct deferred *d = s->deferred;
        s->deferred = d->next;
        s->n_deferred--;
        struct conn *c = sil_conn_find(s, d->conn_id);
        const uint32_t msgid = d->msgid;
        free(d);
        if (c) {
            sil_inflight_remove(c, msgid);
            sil_send_error(c, msgid, code, "%s", msg);
        }
    }
}
