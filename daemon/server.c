/* The daemon's lifecycle: socket set-up (or socket activation), model load, the event loop and
 * its sources (listening socket, worker eventfd, signals, watchdog), sd_notify readiness and
 * status, SIGHUP reload of the live settings, and the drain on SIGTERM / shutdown.
 * Connections are in conn.c, the methods in methods.c.
 *
 * Ownership: sil_daemon_run owns the server, the engine and the worker, and frees them (and any
 * connection left) before it returns. */
#include "daemon/engine/size.h"
#include "daemon/server.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <systemd/sd-event.h>
#include <time.h>
#include <unistd.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/spec.h"
#include "daemon/log.h"
#include "daemon/modelwatch.h"
#include "daemon/server_impl.h"
#include "daemon/testhooks.h"
#include "daemon/utf8.h"
#include "daemon/worker.h"
#include "siliceo-proto.h"

/* ---- worker output, shutdown ------------------------------------------------------------------- */

static void maybe_exit(struct server *s)
{
    if (s->state != DRAINING)
        return;
    /* Close connections that have nothing more to send; the rest close after their flush. */
    struct conn *c = s->conns;
    while (c) {
        struct conn *next = c->next;
        c->closing = true;
        sil_conn_flush(c);
        c = next;
    }
    if (!s->conns)
        sd_event_exit(s->ev, 0);
}

void sil_server_conn_gone(struct server *s)
{
    if (s->state == DRAINING && !s->conns && s->ev) sd_event_exit(s->ev, 0);
}

const char *sil_model_state_name(const struct server *s)
{
    if (s->switching) return s->loading[0] ? "loading" : "unloading";
    if (s->worker && !s->engine) return "unloaded";
    return s->model_state == MODEL_DAMAGED     ? "damaged"
           : s->model_state == MODEL_RELOADING ? "reloading"
                                               : "ok";
}

/* ---- the model file ----------------------------------------------------------------------------
 */

static void on_model_changed(void *user, const char *why)
{
    struct server *s = user;
    if (s->model_state == MODEL_DAMAGED) return;
    sil_err("%s; stopping its use", why);
    if (s->model_state == MODEL_OK) {
        s->model_state = MODEL_DAMAGED;
        snprintf(s->model_problem, sizeof s->model_problem,
                 "%s; the model cannot be used until it is reloaded: replace the file by rename "
                 "and send "
                 "SIGHUP to siliceod",
                 why);
    }
    /* The worker answers with SIL_WORKER_EV_DAMAGED once nothing reads the mapping; the lease
     * (and with it the writer) is released then. */
    sil_worker_model_damaged(s->worker, s->engine);
}

static void start_watch(struct server *s)
{
    sil_modelwatch_free(s->watch);
    s->watch = NULL;
    if (sil_modelwatch_start(&s->watch, s->ev, sil_engine_info(s->engine), on_model_changed, s) < 0)
        sil_warn("out of memory: the model file is not watched");
}

void sil_server_engine_params(const struct server *s, struct sil_engine_params *ep, const char *path)
{
    const struct sil_config *cfg = s->cfg;
    sil_engine_params_default(ep);
    ep->model_path = path;
    ep->n_threads = cfg->threads;
    ep->backend = cfg->backend;
    ep->vram_budget = cfg->vram_budget;
    ep->vram_reserved = cfg->vram_budget ? s->draft_vram : 0;
    /* a speculative step opens and closes its window: one is open at a time */
    ep->spec_states = cfg->spec != SIL_SPEC_OFF ? 1 : 0;
    ep->host_budget = cfg->host_budget;
    ep->host_budget_off = cfg->host_budget_off;
    ep->n_ctx = cfg->ctx;
    ep->kv_type = cfg->kv_type;
    ep->kv_budget = cfg->kv_budget;
    ep->prefix_ckpt_budget = cfg->prefix_cache ? cfg->prefix_checkpoint_memory : 0;
    ep->prefix_cache_budget = cfg->prefix_cache_memory;
    ep->session_budget = cfg->max_sessions ? cfg->session_memory : 0;
    ep->n_seq_max = cfg->max_running + cfg->max_sessions;
    ep->n_batch_max = cfg->prefill_chunk + cfg->max_running;
    ep->n_batch_tier = cfg->host_prefill_chunk + cfg->max_running;
    ep->heat_map = cfg->heat_map;
    ep->ecache_sim_slots = cfg->ecache_slots;
    ep->ecache_sim_policy = cfg->ecache_policy[0] ? cfg->ecache_policy : NULL;
    ep->ecache_sim_soft = true;
    ep->cuda = cfg->cuda;
    sil_dev_switches_read(ep); /* tests and benchmarks: siliceo-dev(7) */
}

/* SIGHUP: a damaged model is always reloaded; a sound one when the path names another file now
 * (it was replaced by rename). The loaded model's path: the default one or one asked for. */
static void maybe_reload(struct server *s)
{
    if (!s->worker || !s->engine || s->switching || s->model_state == MODEL_RELOADING) return;
    const struct sil_model_info *info = sil_engine_info(s->engine);
    struct stat st;
    if (s->model_state == MODEL_OK) {
        if (stat(s->model_path, &st) < 0 ||
            ((uint64_t)st.st_dev == info->file_dev && (uint64_t)st.st_ino == info->file_ino))
            return;
    }
    sil_notice("reloading the model from %s%s", s->model_path,
               s->model_state == MODEL_DAMAGED ? " (damaged)" : "");
    s->reload_damaged = s->model_state == MODEL_DAMAGED;
    s->model_state = MODEL_RELOADING;
    s->reload_t0 = now_s();
    sd_notifyf(0, "RELOADING=1\nSTATUS=reloading the model %s", s->model_path);
    struct sil_engine_params ep;
    sil_server_engine_params(s, &ep, s->model_path);
    sil_tokpool_set_reloading(s->tok, true); /* before the worker hears of it: see tokjob.c */
    if (sil_worker_reload(s->worker, &ep) < 0) {
        sil_tokpool_set_reloading(s->tok, false);
        s->model_state = s->reload_damaged ? MODEL_DAMAGED : MODEL_OK;
    }
}

static void on_model_event(struct server *s, struct sil_outmsg *m)
{
    switch (m->event) {
    case SIL_WORKER_EV_DAMAGED:
        if (s->model_state == MODEL_OK)
            snprintf(s->model_problem, sizeof s->model_problem, "%s", m->data);
        if (s->model_state != MODEL_RELOADING) s->model_state = MODEL_DAMAGED;
        sil_modelwatch_release(s->watch); /* nothing reads the mapping now */
        sd_notifyf(0, "STATUS=model damaged: %s", s->model_problem);
        break;
    case SIL_WORKER_EV_RELOADED:
        s->engine = m->engine;
        s->vocab = sil_engine_vocab(s->engine);
        sil_tokpool_set_model(s->tok, s->vocab, sil_engine_n_ctx(s->engine)); /* off the old vocab */
        sil_modelwatch_free(s->watch);
        s->watch = NULL;
        sil_engine_close(m->old_engine);
        s->load_s = now_s() - s->reload_t0;
        s->model_state = MODEL_OK;
        s->model_problem[0] = 0;
        start_watch(s);
        sd_notifyf(0, "READY=1\nSTATUS=ready: %s on %s", sil_engine_info(s->engine)->name, s->path);
        sil_models_loaded(s);
        break;
    case SIL_WORKER_EV_UNLOADED:
        sil_modelwatch_free(s->watch);
        s->watch = NULL;
        sil_engine_close(m->old_engine);
        sil_models_unloaded(s);
        break;
    case SIL_WORKER_EV_RELOAD_FAILED:
        sil_tokpool_set_reloading(s->tok, false);
        s->model_state = s->reload_damaged ? MODEL_DAMAGED : MODEL_OK;
        if (s->reload_damaged)
            snprintf(s->model_problem, sizeof s->model_problem,
                     "the model file changed while in use and the %s; replace the file by rename "
                     "and send SIGHUP to "
                     "siliceod",
                     m->data);
        sd_notifyf(0, "READY=1\nSTATUS=%s", m->data);
        sil_models_load_failed(s, m->data);
        break;
    case SIL_WORKER_EV_NONE:
        break;
    }
}

static int on_worker(sd_event_source *src, int fd, uint32_t revents, void *ud)
{
    struct server *s = ud;
    struct sil_outmsg *m = sil_worker_take_output(s->worker);
    /* Everything the worker produced since the last wake-up is appended first and each client's
     * socket written once: one send per client per wake-up, not one per token. */
    while (m) {
        struct sil_outmsg *next = m->next;
        if (m->stopped)
            s->state = DRAINING;
        else if (m->event)
            on_model_event(s, m);
        else
            sil_conn_deliver(s, m);
        free(m);
        m = next;
    }
    sil_models_pump(s); /* a model another request waits for, once nothing runs */
    sil_conn_flush_dirty(s);
    maybe_exit(s);
    return 0;
}

static int on_drain_timeout(sd_event_source *src, uint64_t usec, void *ud)
{
    struct server *s = ud;
    sil_warn("%d clients did not read their final responses in time; closing", s->n_conns);
    sd_event_exit(s->ev, 0);
    return 0;
}

void sil_begin_shutdown(struct server *s, const char *why)
{
    if (s->state != RUNNING)
        return;
    sil_notice("stopping: %s", why);
    sd_notify(0, "STOPPING=1\nSTATUS=stopping");
    s->state = STOPPING;
    s->listen_src = sd_event_source_disable_unref(s->listen_src);
    if (!s->activated) {
        unlink(s->path);
        close(s->listen_fd);
        s->listen_fd = -1;
    }
    /* Debug streams end now with what they sent. */
    for (struct conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        for (struct dstream *d = c->streams; d; d = d->next)
            d->cancelled = true;
        if (c->streams)
            sil_pump_streams(c);
    }
    sil_models_fail_all(s, SIL_RPC_E_SHUTTING_DOWN, "siliceod is shutting down");
    sd_event_add_time_relative(s->ev, &s->drain_timer, CLOCK_MONOTONIC, 10 * 1000000ull, 0, on_drain_timeout, s);
    if (s->worker)
        sil_worker_shutdown(s->worker);
    else
        s->state = DRAINING;
    maybe_exit(s);
}

static int on_signal(sd_event_source *src, const struct signalfd_siginfo *si, void *ud)
{
    struct server *s = ud;
    if (si->ssi_signo == SIGIO) {
        sil_modelwatch_on_sigio(s->watch, (int)si->ssi_fd);
        return 0;
    }
    if (si->ssi_signo == SIGHUP) {
        struct sil_config fresh;
        struct sil_cli cli;
        struct sil_error err = { 0 };
        if (sil_config_from_args(&fresh, &cli, s->argc, s->argv, &err) < 0) {
            sil_err("reload: %s; keeping the current settings", err.msg);
            return 0;
        }
        char changed[256];
        sil_config_apply_live(s->cfg, &fresh, changed, sizeof changed);
        sil_log_set_level(s->cfg->log_level);
        if (s->worker)
            sil_worker_set_limits(s->worker, s->cfg->session_memory, s->cfg->max_sessions);
        sil_notice("configuration reloaded%s%s%s", changed[0] ? " (restart needed for: " : "", changed,
                   changed[0] ? ")" : "");
        if (s->state == RUNNING) maybe_reload(s);
        return 0;
    }
    sil_begin_shutdown(s, si->ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
    return 0;
}

/* ---- watchdog ---------------------------------------------------------------------------------- */

/* WATCHDOG=1 says both threads are alive: this timer firing shows the event loop runs, and the
 * engine thread must be waiting for work or have made progress (a scheduler step, or a
 * micro-batch inside a long evaluation) within the watchdog interval. A hung engine stops the
 * pings, and systemd restarts the daemon. */
static int on_watchdog(sd_event_source *src, uint64_t usec, void *ud)
{
    struct server *s = ud;
    double age = 0;
    bool alive = !s->worker || s->state == DRAINING || sil_worker_alive(s->worker, s->watchdog_usec, &age);
    if (alive) {
        sd_notify(0, "WATCHDOG=1");
        if (s->engine_stalled) {
            s->engine_stalled = false;
            sil_notice("engine thread is making progress again; watchdog pings resumed");
            sd_notify(0, "STATUS=ready");
        }
    } else if (!s->engine_stalled) {
        s->engine_stalled = true;
        sil_err("engine thread has made no progress for %.1f s; watchdog pings stopped", age);
        sd_notifyf(0, "STATUS=engine thread stalled for %.0f s", age);
    }
    sd_event_source_set_time(src, usec + s->watchdog_usec / 4);
    return 0;
}

static int setup_watchdog(struct server *s)
{
    uint64_t usec = 0;
    if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0)
        return 0;
    s->watchdog_usec = usec;
    int rc = sd_event_add_time_relative(s->ev, &s->watchdog_timer, CLOCK_MONOTONIC, usec / 4, usec / 20,
                                        on_watchdog, s);
    if (rc < 0)
        return rc;
    sd_event_source_set_enabled(s->watchdog_timer, SD_EVENT_ON);
    sil_info("watchdog: pinging every %.2f s while the loop and the engine thread make progress", usec / 4e6);
    return 0;
}

/* ---- start-up ---------------------------------------------------------------------------------- */

/* SIGTERM and SIGINT are blocked (sd-event takes them later), so a signal during the load waits
 * as pending: it stops the load between its stages. */
static bool stop_pending(void)
{
    sigset_t p;
    return sigpending(&p) == 0 && (sigismember(&p, SIGTERM) == 1 || sigismember(&p, SIGINT) == 1);
}

static bool load_progress(float fraction, const char *what, void *user)
{
    /* Test hook: a slow load, to stop it in the middle. */
    for (int ms = sil_test_hook("load_ms"); ms > 0 && !stop_pending(); ms -= 10)
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    if (stop_pending()) return false;
    static int last = -1;
    int pct = (int)(fraction * 100);
    if (pct == last) return true;
    last = pct;
    sd_notifyf(0, "STATUS=loading model: %d%% %s", pct, what ? what : "");
    return true;
}

static void preload_progress(int64_t done, int64_t total, void *user)
{
    sd_notifyf(0, "STATUS=preloading the hottest experts: %lld of %lld", (long long)done,
               (long long)total);
}

/* spec = draft: the draft model, opened before any served model, as they are (threads, backend,
 * context, KV type) with a sequence for each request that may run, its own KV and recurrent
 * state, and no caches of its own (no prefix cache, host tier, heat map). On a device its
 * memory is part of vram_budget: the served models get the rest. Its vocabulary is checked
 * against the default model once that is loaded (draft_fits: a mismatch is an error at start),
 * and by the worker against every model loaded later (a mismatch there only turns speculation
 * off for that model). */
static int open_draft(struct server *s, struct sil_error *err)
{
    const struct sil_config *cfg = s->cfg;
    struct stat st;
    if (stat(cfg->draft_model, &st) < 0)
        return sil_errorf(err, -errno, "cannot load the draft model: %s: %s", cfg->draft_model,
                          strerror(errno));
    if (!S_ISREG(st.st_mode))
        return sil_errorf(err, -EINVAL, "cannot load the draft model: %s: not a regular file",
                          cfg->draft_model);
    struct sil_engine_params ep;
    sil_engine_params_default(&ep);
    ep.model_path = cfg->draft_model;
    ep.n_threads = cfg->threads;
    ep.backend = cfg->backend;
    ep.n_ctx = cfg->ctx;
    ep.kv_type = cfg->kv_type;
    ep.host_budget_off = true;
    ep.n_seq_max = cfg->max_running;
    ep.n_batch_max = cfg->prefill_chunk + cfg->max_running;
    ep.progress = load_progress;
    sil_info("loading the draft model %s", cfg->draft_model);
    int rc = sil_engine_open(&s->draft, &ep, err);
    if (rc < 0) {
        char why[sizeof err->msg];
        snprintf(why, sizeof why, "%s", err->msg);
        return sil_errorf(err, rc, "cannot load the draft model: %s", why);
    }
    if (cfg->spec_depth >= sil_engine_n_batch_max(s->draft))
        return sil_errorf(err, -EINVAL, "spec_tree: depth %d is not below the draft's batch of %d",
                          cfg->spec_depth, sil_engine_n_batch_max(s->draft));
    s->draft_vram = sil_engine_device_bytes(s->draft);
    char b[2][24];
    if (cfg->vram_budget && s->draft_vram >= cfg->vram_budget)
        return sil_errorf(err, -ENOMEM,
                          "vram_budget %s: the draft model %s takes %s of it, nothing is left for "
                          "the model served",
                          sil_size_str(cfg->vram_budget, b[0], 24), cfg->draft_model,
                          sil_size_str(s->draft_vram, b[1], 24));
    if (cfg->vram_budget && s->draft_vram)
        sil_info("the draft model takes %s of vram_budget %s; the model served gets the rest",
                 sil_size_str(s->draft_vram, b[0], 24), sil_size_str(cfg->vram_budget, b[1], 24));
    const struct sil_model_info *di = sil_engine_info(s->draft);
    if (cfg->spec_width > 1)
        sil_info("draft model %s (%s, %d layers) on %s, token trees of %d chains of %d tokens",
                 di->name, di->arch_name, di->n_layer, di->backend, cfg->spec_width,
                 cfg->spec_depth);
    else
        sil_info("draft model %s (%s, %d layers) on %s, chains of %d tokens", di->name,
                 di->arch_name, di->n_layer, di->backend, cfg->spec_depth);
    return 0;
}

/* The draft model against the default model, once both are loaded. */
static int draft_fits(struct server *s, struct sil_error *err)
{
    const struct sil_config *cfg = s->cfg;
    int rc = 0;
    /* a tree: the model served at start must verify trees in a batch (later ones that cannot
     * draft chains, the worker says so) */
    if (s->engine && cfg->spec_width > 1) {
        const struct sil_model_info *info = sil_engine_info(s->engine);
        if (!sil_engine_has_tree(s->engine))
            return sil_errorf(err, -EINVAL,
                              "spec_tree = %dx%d: token trees need the CPU backend (%s runs on "
                              "%s); give 1x%d",
                              cfg->spec_width, cfg->spec_depth, info->path, info->backend,
                              cfg->spec_depth);
        if (1 + cfg->spec_width * cfg->spec_depth > sil_engine_n_batch_max(s->engine))
            return sil_errorf(err, -EINVAL,
                              "spec_tree = %dx%d: %d rows do not fit the model's batch of %d",
                              cfg->spec_width, cfg->spec_depth,
                              1 + cfg->spec_width * cfg->spec_depth,
                              sil_engine_n_batch_max(s->engine));
    }
    if (s->engine) {
        rc = sil_spec_vocab_check(sil_engine_vocab(s->engine), sil_engine_vocab(s->draft), err);
        if (rc < 0) {
            char why[sizeof err->msg];
            snprintf(why, sizeof why, "%s", err->msg);
            return sil_errorf(err, rc, "the draft model %s cannot draft for %s: %s",
                              cfg->draft_model, sil_engine_info(s->engine)->path, why);
        }
    }
    return 0;
}

/* spec = mtp: the model served at start must carry an MTP layer the backend can run, and a
 * chain must fit its batch. Models loaded later without one decode plainly (the worker says
 * so). */
static int check_mtp(struct server *s, struct sil_error *err)
{
    const struct sil_config *cfg = s->cfg;
    const struct sil_model_info *info = sil_engine_info(s->engine);
    if (!sil_engine_has_mtp(s->engine))
        return sil_errorf(err, -EINVAL,
                          "spec = mtp: %s has no MTP layer to draft with (or the %s backend "
                          "cannot run it); use spec = draft with a draft model, or spec = off",
                          info->path, info->backend);
    if (cfg->spec_depth >= sil_engine_n_batch_max(s->engine))
        return sil_errorf(err, -EINVAL, "spec_tree: depth %d is not below the model's batch of %d",
                          cfg->spec_depth, sil_engine_n_batch_max(s->engine));
    if (cfg->spec_width > 1)
        return sil_errorf(err, -EINVAL,
                          "spec_tree = %dx%d: the MTP layer drafts chains only; give 1x%d or "
                          "spec = draft",
                          cfg->spec_width, cfg->spec_depth, cfg->spec_depth);
    if (cfg->draft_model[0])
        sil_notice("spec = mtp: the draft model %s is not used", cfg->draft_model);
    sil_info("speculative decoding with the MTP layer of %s, chains of %d tokens", info->name,
             cfg->spec_depth);
    return 0;
}

/* Creates the socket's directory (0750) when missing; the default ones are ours to fix up. */
/* The socket's directory must be the daemon's user's or root's, and nobody else may write
 * there but under the sticky bit (as /tmp): another user who made it first (the per-user
 * fallback lives in /tmp) could otherwise take the socket's place. */
static int socket_dir_ours(const char *dir, char *why, size_t n)
{
    struct stat st;
    if (stat(dir, &st) < 0)
        return -errno;
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, n, "%s is not a directory", dir);
        return -ENOTDIR;
    }
    if ((st.st_uid != geteuid() && st.st_uid != 0) ||
        ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX))) {
        snprintf(why, n,
                 "%s belongs to uid %u with mode %03o: not this user's, or writable by others; "
                 "remove it, or give --socket a path in a directory of yours",
                 dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777));
        return -EPERM;
    }
    return 0;
}

static int make_socket_dir(const char *path, gid_t gid, char *why, size_t why_n)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = 0;
    struct stat st;
    if (stat(dir, &st) == 0)
        return socket_dir_ours(dir, why, why_n);
    /* Parents first (e.g. /run/user/UID exists; its siliceo/ child may not). */
    for (char *p = dir + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(dir, 0755) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(dir, 0750) < 0 && errno != EEXIST)
        return -errno;
    if (chmod(dir, 0750) < 0)
        return -errno;
    if (gid != (gid_t)-1 && chown(dir, (uid_t)-1, gid) < 0)
        return -errno;
    return socket_dir_ours(dir, why, why_n);
}

/* Whether a live daemon answers on the socket this one would listen on (not under socket
 * activation, where systemd holds it): checked before the model loads, which takes seconds to
 * minutes, so a second instance is refused at once. setup_listen checks again. */
static bool socket_busy(struct server *s)
{
    struct stat st;
    if (sd_listen_fds(0) > 0 || sil_rpc_socket_path(s->cfg->socket, s->path, sizeof s->path) < 0 ||
        lstat(s->path, &st) < 0 || !S_ISSOCK(st.st_mode))
        return false;
    const int fd = sil_rpc_connect(s->path, NULL);
    if (fd < 0) return false;
    close(fd);
    return true;
}

static int setup_listen(struct server *s)
{
    int n = sd_listen_fds(1);
    if (n > 1) {
        sil_err("socket activation: %d sockets passed, expected 1", n);
        return -EINVAL;
    }
    if (n == 1) {
        int fd = SD_LISTEN_FDS_START;
        if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
            sil_err("socket activation: fd %d is not a listening Unix stream socket", fd);
            return -EINVAL;
        }
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        s->listen_fd = fd;
        s->activated = true;
        snprintf(s->path, sizeof s->path, "(socket activation)");
        sil_info("listening on the socket passed by systemd");
        return 0;
    }
    if (sil_rpc_socket_path(s->cfg->socket, s->path, sizeof s->path) < 0) {
        sil_err("socket path too long");
        return -ENAMETOOLONG;
    }
    gid_t gid = (gid_t)-1;
    if (s->cfg->socket_group[0]) {
        struct group *gr = getgrnam(s->cfg->socket_group);
        gid = gr ? gr->gr_gid : (gid_t)strtoul(s->cfg->socket_group, NULL, 10);
    }
    char why[512] = "";
    int rc = make_socket_dir(s->path, gid, why, sizeof why);
    if (rc < 0) {
        sil_err("cannot create the directory of %s: %s", s->path, why[0] ? why : strerror(-rc));
        return rc;
    }
    struct sil_rpc_error err = { 0 };
    int fd = sil_rpc_listen(s->path, 0660, 128, &err);
    if (fd == -EADDRINUSE) {
        sil_err("another siliceod is already running on %s; not starting a second one", s->path);
        return fd;
    }
    if (fd < 0) {
        sil_err("%s", err.msg);
        return fd;
    }
    if (gid != (gid_t)-1 && chown(s->path, (uid_t)-1, gid) < 0)
        sil_warn("chown %s to group %s: %s", s->path, s->cfg->socket_group, strerror(errno));
    s->listen_fd = fd;
    sil_info("listening on %s", s->path);
    return 0;
}

int sil_daemon_run(struct sil_config *cfg, int argc, char *const *argv)
{
    struct server srv = { .cfg = cfg, .argc = argc, .argv = argv, .listen_fd = -1, .t_start = now_s() };
    struct server *s = &srv;
    int status = 1;

    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGTERM);
    sigaddset(&ss, SIGINT);
    sigaddset(&ss, SIGHUP);
    sigaddset(&ss, SIGIO); /* the model file's lease breaks (modelwatch.h) */
    /* Blocked before any thread exists, so the worker inherits the mask and sd-event gets them. */
    sigprocmask(SIG_BLOCK, &ss, NULL);
    signal(SIGPIPE, SIG_IGN);
    sil_rpc_buf_init(&s->scratch, 0);

    if (socket_busy(s)) {
        sil_err("another siliceod is already running on %s; not starting a second one", s->path);
        goto out;
    }
    /* The model is checked and loaded before the socket listens: a bad model never shows a
     * "listening" line, and clients never wait on a daemon that is about to fail. */
    if (!cfg->no_model && cfg->model[0]) {
        /* A FIFO, device or directory would block or fail the load: refused before opening it.
         * stat() does not open, so it cannot block. */
        struct stat st;
        if (stat(cfg->model, &st) < 0) {
            sil_err("cannot load the model: %s: %s", cfg->model, strerror(errno));
            goto out;
        }
        if (!S_ISREG(st.st_mode)) {
            sil_err("cannot load the model: %s: not a regular file (%s)", cfg->model,
                    S_ISDIR(st.st_mode)                          ? "a directory"
                    : S_ISFIFO(st.st_mode)                       ? "a FIFO"
                    : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                 : "a special file");
            goto out;
        }
    }
    if (!cfg->no_model && !cfg->model[0]) {
        /* Models by name only: the first request that names one loads it. */
        char dir[PATH_MAX];
        sil_server_models_dir(s, dir, sizeof dir);
        sil_notice("no default model: requests name one of %s", dir);
        sil_heatkeep_init(&s->heat, cfg, cfg->heat_map);
        s->heat_init = true;
        struct sil_error err = { 0 };
        if (cfg->spec == SIL_SPEC_DRAFT && open_draft(s, &err) < 0) {
            sil_err("%s", err.msg);
            goto out;
        }
        if (sil_worker_start(&s->worker, NULL, s->draft, cfg, &s->heat, &err) < 0) {
            sil_err("%s", err.msg);
            goto out;
        }
    } else if (!cfg->no_model) {
        struct sil_error err = { 0 };
        /* the draft first: on a device the model gets what of vram_budget it leaves */
        if (cfg->spec == SIL_SPEC_DRAFT && open_draft(s, &err) < 0) {
            sil_err("%s", err.msg);
            sd_notifyf(0, "STATUS=%s", err.msg);
            goto out;
        }
        struct sil_engine_params ep;
        sil_server_engine_params(s, &ep, cfg->model);
        ep.progress = load_progress;
        sil_info("loading the model %s", cfg->model);
        sd_notifyf(0, "STATUS=loading model %s", cfg->model);
        double t0 = now_s();
        int lrc = sil_engine_open(&s->engine, &ep, &err);
        if (lrc == -ECANCELED) {
            sil_notice("model load stopped by a signal; exiting");
            status = 0;
            goto out;
        }
        if (lrc < 0) {
            sil_err("cannot load the model: %s", err.msg);
            sd_notifyf(0, "STATUS=cannot load the model: %s", err.msg);
            goto out;
        }
        const struct sil_model_info *info = sil_engine_info(s->engine);
        s->load_s = now_s() - t0;
        sil_info("model %s (%s, %d layers, %llu parameters) loaded in %.2f s on %s, %d threads, context %d",
                 info->name, info->arch_name, info->n_layer, (unsigned long long)info->n_params, now_s() - t0,
                 info->backend, info->n_threads, sil_engine_n_ctx(s->engine));
        if (!cfg->backend[0] || strcmp(cfg->backend, "auto") == 0)
            sil_info("backend auto: %s", info->backend);
        if (cfg->vram_budget && strcmp(info->backend, "cuda") != 0)
            sil_notice("vram_budget has no effect: the model runs on the %s backend",
                       info->backend);
        struct sil_kv_info kvi;
        sil_engine_kv_info(s->engine, &kvi);
        if (strcmp(info->backend, "cpu") == 0)
            sil_info("KV cache: %s, %llu bytes a position, %d blocks of %d positions", kvi.type,
                     (unsigned long long)kvi.bytes_per_pos, kvi.n_blocks, kvi.block_positions);
        else if (strcmp(cfg->kv_type, "f32") || cfg->kv_budget)
            sil_notice("kv_type and kv_budget have no effect: the %s backend keeps its own KV cache",
                       info->backend);
        s->vocab = sil_engine_vocab(s->engine);
        const char *ec_mode = sil_engine_ecache_mode(s->engine);
        if (cfg->ecache_slots > 0 && (!ec_mode || strcmp(ec_mode, "simulated") != 0))
            sil_notice("ecache_slots has no effect: %s",
                       info->n_expert <= 0 ? "the model has no routed experts"
                       : ec_mode           ? "the backend's own expert slots are in use"
                                           : "the expert cache is simulated on the CPU backend "
                                             "only");
        if (ec_mode && strcmp(ec_mode, "device") == 0)
            sil_info("expert cache: %d slots on the device (%s)",
                     (int)sil_engine_ecache_slots(s->engine), sil_engine_ecache_policy(s->engine));
        /* A budget set for a dense model is likely a mistake; the tier itself is logged by the
         * engine when it opens one. */
        if ((cfg->host_budget || cfg->host_budget_off) && info->n_expert <= 0)
            sil_notice("host_budget has no effect: the model has no routed experts");
        /* The heat map is only kept (and saved) for models with routed experts. */
        sil_heatkeep_init(&s->heat, cfg, cfg->heat_map && info->n_expert > 0);
        s->heat_init = true;
        sil_heatkeep_load(&s->heat, s->engine, preload_progress, NULL);
        if ((cfg->spec == SIL_SPEC_DRAFT && draft_fits(s, &err) < 0) ||
            (cfg->spec == SIL_SPEC_MTP && check_mtp(s, &err) < 0)) {
            sil_err("%s", err.msg);
            sd_notifyf(0, "STATUS=%s", err.msg);
            goto out;
        }
        if (sil_worker_start(&s->worker, s->engine, s->draft, cfg, &s->heat, &err) < 0) {
            sil_err("%s", err.msg);
            goto out;
        }
        sil_models_set_loaded(s);
        s->t_model_used = now_s();
    } else {
        sil_notice("running without a model (--no-model): only hello, status, metrics and debug.stream work");
    }
    if (setup_listen(s) < 0)
        goto out;

    if (sd_event_default(&s->ev) < 0)
        goto out;
    if (sd_event_add_io(s->ev, &s->listen_src, s->listen_fd, EPOLLIN, sil_on_accept, s) < 0 ||
        sd_event_add_signal(s->ev, NULL, SIGTERM, on_signal, s) < 0 ||
        sd_event_add_signal(s->ev, NULL, SIGINT, on_signal, s) < 0 ||
        sd_event_add_signal(s->ev, NULL, SIGHUP, on_signal, s) < 0 ||
        sd_event_add_signal(s->ev, NULL, SIGIO, on_signal, s) < 0 ||
        (s->worker && sd_event_add_io(s->ev, &s->worker_src, sil_worker_eventfd(s->worker), EPOLLIN,
                                      on_worker, s) < 0)) {
        sil_err("event loop set-up failed");
        goto out;
    }
    if (s->engine) start_watch(s);
    if (s->worker && sil_tokpool_start(s) < 0) {
        sil_err("cannot start the tokenizer thread");
        goto out;
    }
    if (sd_event_add_time_relative(s->ev, &s->tick_timer, CLOCK_MONOTONIC, 1000000, 100000, sil_on_conn_tick, s) < 0 ||
        sd_event_source_set_enabled(s->tick_timer, SD_EVENT_ON) < 0) {
        sil_err("event loop set-up failed (connection timer)");
        goto out;
    }
    if (setup_watchdog(s) < 0) {
        sil_err("event loop set-up failed (watchdog timer)");
        goto out;
    }
    sd_notifyf(0, "READY=1\nSTATUS=ready: %s on %s", s->engine ? sil_engine_info(s->engine)->name : "no model loaded",
               s->path);
    sil_notice("ready");
    int rc = sd_event_loop(s->ev);
    status = rc < 0 ? 1 : 0;
    if (rc < 0)
        sil_err("event loop: %s", strerror(-rc));
    else
        sil_notice("stopped");

out:
    sil_models_fail_all(s, SIL_RPC_E_SHUTTING_DOWN, "siliceod is shutting down");
    while (s->conns)
        sil_conn_free(s->conns);
    sil_lingering_free_all(s);
    sil_tokpool_free(s->tok); /* before the worker: it may still submit to it */
    s->tok = NULL;
    if (s->worker) {
        sil_worker_free(s->worker);
        s->worker = NULL;
    }
    sil_modelwatch_free(s->watch);
    if (s->engine)
        sil_engine_close(s->engine);
    if (s->draft)
        sil_engine_close(s->draft);
    if (s->heat_init) sil_heatkeep_destroy(&s->heat);
    sd_event_source_disable_unref(s->listen_src);
    sd_event_source_disable_unref(s->worker_src);
    sd_event_source_disable_unref(s->drain_timer);
    sd_event_source_disable_unref(s->watchdog_timer);
    sd_event_source_disable_unref(s->tick_timer);
    if (s->listen_fd >= 0 && !s->activated) {
        unlink(s->path);
        close(s->listen_fd);
    }
    if (s->ev)
        sd_event_unref(s->ev);
    sil_rpc_buf_free(&s->scratch);
    return status;
}
