/* The engine thread and its queues: the inbox the event loop fills (submit, cancel, session
 * operations, shutdown), the outbox of packed messages it reads back (an eventfd wakes it), the
 * heartbeat the watchdog reads, and the thread's loop: take the inbox, admit, step, publish.
 * Sessions are in session.c, jobs and the scheduler step in scheduler.c; see worker.h for the
 * contract with the event loop. */
#include "daemon/worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "daemon/heatkeep.h"
#include "daemon/log.h"
#include "daemon/testhooks.h"
#include "daemon/utf8.h"
#include "daemon/worker_impl.h"
#include "siliceo-proto.h"

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void beat(struct sil_worker *w) { atomic_store_explicit(&w->heartbeat_ns, now_ns(), memory_order_relaxed); }

/* ---- outbox ------------------------------------------------------------------------------------ */

/* Hands the pending messages to the event loop. The eventfd is written only when the outbox was
 * empty: a loop that has not yet taken the earlier messages is already due to wake up, and takes
 * everything queued when it does (sil_worker_take_output reads the eventfd before the list). */
static void flush_out(struct sil_worker *w)
{
    if (!w->pend_head)
        return;
    pthread_mutex_lock(&w->mu);
    bool was_empty = !w->out_head;
    if (w->out_tail)
        w->out_tail->next = w->pend_head;
    else
        w->out_head = w->pend_head;
    w->out_tail = w->pend_tail;
    pthread_mutex_unlock(&w->mu);
    w->pend_head = w->pend_tail = NULL;
    if (was_empty) {
        uint64_t one = 1;
        ssize_t n = write(w->efd, &one, sizeof one);
        (void)n;
    }
}

void sil_post_raw(struct sil_worker *w, struct sil_outmsg *m)
{
    if (w->pend_tail)
        w->pend_tail->next = m;
    else
        w->pend_head = m;
    w->pend_tail = m;
}

/* Moves what the packing buffer holds into a new pending message. */
bool sil_post(struct sil_worker *w, uint64_t conn_id, uint32_t msgid, bool final)
{
    struct sil_rpc_buf *b = &w->pk;
    size_t n = sil_rpc_buf_size(b);
    struct sil_outmsg *m = malloc(sizeof(*m) + n);
    if (!m) {
        sil_err("out of memory queueing %zu bytes for a client", n);
        sil_rpc_buf_reset(b);
        return false;
    }
    m->next = NULL;
    m->conn_id = conn_id;
    m->msgid = msgid;
    m->final = final;
    m->stopped = false;
    m->event = SIL_WORKER_EV_NONE;
    m->engine = m->old_engine = NULL;
    m->len = n;
    memcpy(m->data, sil_rpc_buf_head(b), n);
    sil_rpc_buf_reset(b);
    sil_post_raw(w, m);
    return true;
}

void sil_post_job_oom(struct sil_worker *w, struct job *j)
{
    if (!j->oom)
        return;
    if (j->conn_gone)
        j->oom->len = 0; /* only the request count of the connection needs it */
    sil_post_raw(w, j->oom);
    j->oom = NULL;
}

void sil_pack_error_clean(struct sil_rpc_buf *b, uint32_t msgid, int code, const char *msg)
{
    char clean[3 * 1024];
    size_t n = msg ? strnlen(msg, 1024) : 0;
    n = msg ? sil_utf8_sanitize(msg, n, clean) : 0;
    clean[n] = 0;
    sil_rpc_pack_error_response(b, msgid, code, msg ? clean : NULL);
}

static bool post_error(struct sil_worker *w, uint64_t conn_id, uint32_t msgid, int code, const char *msg,
                       bool final)
{
    sil_pack_error_clean(&w->pk, msgid, code, msg);
    return sil_post(w, conn_id, msgid, final);
}

/* ---- the thread -------------------------------------------------------------------------------- */

static void reload_free(struct reload *r);

static void handle_in(struct sil_worker *w, struct inmsg *m)
{
    switch (m->type) {
    case IN_SUBMIT: {
        struct job *j = m->job;
        m->job = NULL;
        j->t_submit = now_s();
        if (j->r.session[0] && sil_session_in_use(w, j->r.uid, j->r.session)) {
            if (!post_error(w, j->r.conn_id, j->r.msgid, SIL_RPC_E_BUSY,
                            "session in use by another request", true))
                sil_post_job_oom(w, j);
            sil_job_free(w, j);
            break;
        }
        j->arrival = w->arrivals++;
        sil_list_append(&w->queue, j);
        w->n_queued++;
        w->local.requests_total++;
        break;
    }
    case IN_CANCEL:
    case IN_CONN_CLOSED:
        for (int pass = 0; pass < 2; pass++)
            for (struct job *j = pass ? w->running : w->queue; j; j = j->next)
                if (j->r.conn_id == m->conn_id && (m->type == IN_CONN_CLOSED || j->r.msgid == m->msgid)) {
                    j->cancelled = true;
                    if (m->type == IN_CONN_CLOSED)
                        j->conn_gone = true;
                }
        break;
    case IN_SESS_LIST: {
        msgpack_packer *pk = sil_rpc_begin_response(&w->pk, m->msgid);
        msgpack_pack_map(pk, 3);
        sil_rpc_pack_cstr(pk, "sessions");
        /* The sessions in memory, then those only saved (no engine state until used again). */
        const struct sil_sessstore *st = &w->store;
        uint32_t n_shown = 0;
        for (struct session *s = w->sessions; s; s = s->next)
            n_shown += m->all || s->uid == m->uid;
        for (size_t i = 0; i < st->n; i++)
            n_shown += (m->all || st->ent[i].uid == m->uid) &&
                       !sil_session_find(w, st->ent[i].uid, st->ent[i].name);
        msgpack_pack_array(pk, n_shown);
        double t = now_s();
        uint64_t total = 0;
        for (struct session *s = w->sessions; s; s = s->next) {
            if (!m->all && s->uid != m->uid)
                continue;
            msgpack_pack_map(pk, 8);
            sil_utf8_pack_kv(pk, "name", s->name, strlen(s->name));
            sil_rpc_kv_uint(pk, "uid", s->uid);
            sil_rpc_kv_uint(pk, "messages", s->n_log);
            sil_rpc_kv_uint(pk, "n_tokens", s->busy ? s->busy->ctx.n : s->n_tokens);
            sil_rpc_kv_uint(pk, "memory", s->memory);
            sil_rpc_kv_double(pk, "idle_s", s->busy ? 0 : t - s->last_used);
            sil_rpc_kv_bool(pk, "busy", s->busy != NULL);
            sil_rpc_kv_bool(pk, "saved", s->n_log > 0 && s->saved &&
                                             sil_sessstore_find(st, s->uid, s->name) != NULL);
            total += s->memory;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        const double wall = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
        for (size_t i = 0; i < st->n; i++) {
            const struct sil_sessfile_entry *e = &st->ent[i];
            if ((!m->all && e->uid != m->uid) || sil_session_find(w, e->uid, e->name))
                continue;
            msgpack_pack_map(pk, 8);
            sil_utf8_pack_kv(pk, "name", e->name, strlen(e->name));
            sil_rpc_kv_uint(pk, "uid", e->uid);
            sil_rpc_kv_uint(pk, "messages", e->n_msgs);
            sil_rpc_kv_uint(pk, "n_tokens", 0);
            sil_rpc_kv_uint(pk, "memory", 0);
            const double at = (double)e->saved_at * 1e-6;
            sil_rpc_kv_double(pk, "idle_s", wall > at ? wall - at : 0);
            sil_rpc_kv_bool(pk, "busy", false);
            sil_rpc_kv_bool(pk, "saved", true);
        }
        sil_rpc_kv_uint(pk, "memory", total);
        sil_rpc_kv_uint(pk, "memory_limit", w->session_memory);
        sil_rpc_end(&w->pk);
        sil_post(w, m->conn_id, m->msgid, true);
        break;
    }
    case IN_DAMAGED:
        if (m->engine == w->e) sil_model_damaged(w, NULL);
        break;
    case IN_RELOAD:
        if (w->reload) reload_free(w->reload);
        w->reload = m->reload;
        m->reload = NULL;
        /* Queued requests were tokenized for the model in use; the running ones may finish. */
        for (struct job *j = w->queue, *next; j; j = next) {
            next = j->next;
            sil_list_remove(&w->queue, j);
            w->n_queued--;
            j->err_code = SIL_RPC_E_UNAVAILABLE;
            sil_job_finish(w, j, SIL_STOP_ERROR, "the model is being reloaded; send the request again");
        }
        break;
    case IN_UNLOAD:
        w->unload = w->e != NULL;
        break;
    case IN_SESS_DROP: {
        struct session *s = sil_session_find(w, m->uid, m->name);
        const bool file = sil_sessstore_remove(&w->store, m->uid, m->name) == 0;
        if (!s && !file) {
            post_error(w, m->conn_id, m->msgid, SIL_RPC_E_NOT_FOUND, "no such session", true);
            break;
        }
        if (s && s->busy)
            s->drop_when_idle = true;
        else if (s)
            sil_session_free(w, s);
        msgpack_packer *pk = sil_rpc_begin_response(&w->pk, m->msgid);
        msgpack_pack_map(pk, 0);
        sil_rpc_end(&w->pk);
        sil_post(w, m->conn_id, m->msgid, true);
        break;
    }
    }
}

static void reload_free(struct reload *r)
{
    if (!r) return;
    free(r->path);
    free(r->backend);
    free(r);
}

/* The per-layer figures of the simulated cache, sized for the largest model loaded. */
static bool grow_ec(struct sil_worker *w, int32_t n_layer)
{
    if (n_layer <= w->ec_cap) return true;
    struct sil_ecache_stats *a = calloc((size_t)n_layer, sizeof(*a));
    struct sil_ecache_stats *b = calloc((size_t)n_layer, sizeof(*b));
    if (!a || !b) {
        free(a);
        free(b);
        return false;
    }
    free(w->ec_local);
    w->ec_local = a;
    pthread_mutex_lock(&w->mu);
    free(w->ec_layers);
    w->ec_layers = b;
    w->ec_n = 0;
    pthread_mutex_unlock(&w->mu);
    w->ec_cap = n_layer;
    return true;
}

static void post_event(struct sil_worker *w, enum sil_worker_event ev, const char *text,
                       struct sil_engine *e, struct sil_engine *old)
{
    size_t n = text ? strlen(text) + 1 : 0;
    struct sil_outmsg *m = calloc(1, sizeof(*m) + n);
    if (!m) {
        sil_err("out of memory telling the event loop about the model");
        return;
    }
    m->event = ev;
    m->engine = e;
    m->old_engine = old;
    if (n) memcpy(m->data, text, n);
    sil_post_raw(w, m);
}

static void fail_all(struct sil_worker *w, int code, const char *msg)
{
    for (int pass = 0; pass < 2; pass++) {
        /* Detached first: sil_job_finish publishes stats, which walks the running list. */
        struct job *j = pass ? w->running : w->queue;
        if (pass)
            w->running = NULL, w->n_running = 0;
        else
            w->queue = NULL, w->n_queued = 0;
        while (j) {
            struct job *next = j->next;
            j->err_code = code;
            sil_job_finish(w, j, SIL_STOP_ERROR, msg);
            j = next;
        }
    }
}

void sil_model_damaged(struct sil_worker *w, const char *why)
{
    if (w->damaged) return;
    w->damaged = true;
    sil_engine_mark_damaged(w->e);
    const char *path = sil_engine_info(w->e)->path;
    char detail[700], msg[1200];
    if (why)
        snprintf(detail, sizeof detail, "%s", why);
    else
        snprintf(detail, sizeof detail, "%s: the model file is being written to while in use",
                 path);
    snprintf(msg, sizeof msg,
             "%s; the model cannot be used until it is reloaded: replace the file by rename "
             "(write the new file elsewhere, then mv it to %s) and send SIGHUP to siliceod",
             detail, path);
    sil_err("%s", msg);
    fail_all(w, SIL_RPC_E_UNAVAILABLE, msg);
    while (w->sessions)
        sil_session_free(w, w->sessions);
    sil_publish_stats(w);
    post_event(w, SIL_WORKER_EV_DAMAGED, msg, w->e, NULL);
}

/* Whether the engine reads its routed experts from the file through the host tier
 * (expert_store.h); a tier that holds them all reads nothing after open. */
static bool tier_on(const struct sil_engine *e)
{
    struct sil_engine_host_tier t;
    sil_engine_host_tier(e, &t);
    return t.on && !t.full;
}

/* session_memory held to the idle sessions' share of the host budget (hostmem.h), which is
 * less when the caches gave way to the experts at load. */
static uint64_t session_cap(const struct sil_worker *w, uint64_t limit)
{
    if (!w->e) return limit;
    struct sil_engine_host_plan hp;
    sil_engine_host_plan(w->e, &hp);
    return hp.want[SIL_HOST_SESSIONS] && hp.cache[SIL_HOST_SESSIONS] < limit
               ? hp.cache[SIL_HOST_SESSIONS]
               : limit;
}

static void eval_progress(void *user)
{
    struct sil_worker *w = user;
    beat(w);
    if (w->test_ubatch_ms > 0) {
        /* Test hook: a slow but live evaluation (each micro-batch takes this long). */
        struct timespec ts = {w->test_ubatch_ms / 1000, (w->test_ubatch_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
        beat(w);
    }
}

/* A reload beats the heartbeat, and stops when the daemon is stopping (SIGTERM). */
static bool reload_progress(float fraction, const char *what, void *user)
{
    struct sil_worker *w = user;
    /* Test hook: a slow reload (load_ms slows every step of a load, the first one and these) */
    for (int ms = sil_test_hook("load_ms"); ms > 0; ms -= 10) {
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
        beat(w);
    }
    beat(w);
    pthread_mutex_lock(&w->mu);
    bool stop = w->stop;
    pthread_mutex_unlock(&w->mu);
    return !stop;
}

/* The reload, once no request runs: the new engine first, so a failed load keeps the old one. */
static void do_reload(struct sil_worker *w)
{
    struct reload *r = w->reload;
    w->reload = NULL;
    struct sil_engine *ne = NULL;
    struct sil_error err = {0};
    r->p.progress = reload_progress;
    r->p.progress_user = w;
    double t0 = now_s();
    /* the old engine's host tier goes first (it reads through the mapping until replaced), so
     * the two engines never hold two tiers' memory at once */
    if (w->e) sil_engine_host_tier_drop(w->e);
    int rc = sil_engine_open(&ne, &r->p, &err);
    beat(w);
    int32_t nv = rc == 0 ? sil_vocab_n_tokens(sil_engine_vocab(ne)) : 0;
    float *logits = NULL;
    if (rc == 0 && !(logits = calloc((size_t)w->max_running * (size_t)nv, sizeof(float)))) {
        sil_engine_close(ne);
        rc = sil_errorf(&err, -ENOMEM, "reload: out of memory for the logits");
    }
    if (rc == 0 && !grow_ec(w, sil_engine_info(ne)->n_layer)) {
        sil_engine_close(ne);
        free(logits);
        rc = sil_errorf(&err, -ENOMEM, "reload: out of memory for the expert cache figures");
    }
    if (rc < 0) {
        char msg[700];
        snprintf(msg, sizeof msg, "reload failed: %s", err.msg);
        sil_err("%s; %s", msg,
                w->damaged ? "the damaged model stays unusable" : "keeping the model in use");
        post_event(w, SIL_WORKER_EV_RELOAD_FAILED, msg, NULL, NULL);
        reload_free(r);
        return;
    }
    while (w->sessions)
        sil_session_free(w, w->sessions); /* their sequences belong to the old engine */
    struct sil_engine *old = w->e;
    if (w->heat) {
        /* The old model's map is saved first; the new model takes it only if it is the same. */
        if (old) sil_heatkeep_save(w->heat, old);
        sil_heatkeep_load(w->heat, ne, NULL, NULL);
    }
    w->e = ne;
    w->tier = tier_on(ne);
    w->v = sil_engine_vocab(ne);
    w->n_vocab = nv;
    w->n_ctx = sil_engine_n_ctx(ne);
    free(w->logits);
    w->logits = logits;
    w->damaged = false;
    w->cost = (struct sil_sched_cost){ 0 }; /* another model, other step times */
    /* the speculative figures are the model's */
    w->local.spec_steps = w->local.spec_drafted = w->local.spec_accepted = 0;
    w->local.spec_emitted = w->local.spec_stopped = w->local.spec_batch_skips = 0;
    w->local.spec_draft_s = w->local.spec_verify_s = w->local.spec_commit_s = 0;
    w->local.spec_moe_layers = w->local.spec_expert_union = w->local.spec_expert_pairs = 0;
    sil_spec_check(w);
    sil_engine_set_eval_progress(ne, eval_progress, w);
    sil_notice("model %s %s in %.2f s", sil_engine_info(ne)->path, old ? "reloaded" : "loaded",
               now_s() - t0);
    sil_publish_stats(w);
    post_event(w, SIL_WORKER_EV_RELOADED, NULL, ne, old);
    reload_free(r);
}

/* keep_alive's unload, once nothing runs or waits: what a shutdown saves is saved, the engine
 * goes to the loop, which closes it. */
static void do_unload(struct sil_worker *w)
{
    w->unload = false;
    for (struct session *s = w->sessions; s; s = s->next)
        if (!s->saved) sil_session_save(w, s);
    while (w->sessions)
        sil_session_free(w, w->sessions);
    if (w->heat) sil_heatkeep_save(w->heat, w->e);
    struct sil_engine *old = w->e;
    w->e = NULL;
    w->v = NULL;
    w->damaged = false;
    sil_publish_stats(w);
    post_event(w, SIL_WORKER_EV_UNLOADED, NULL, NULL, old);
}

static void finish_cancelled(struct sil_worker *w)
{
    for (int pass = 0; pass < 2; pass++) {
        struct job **head = pass ? &w->running : &w->queue;
        struct job *j = *head;
        while (j) {
            struct job *next = j->next;
            if (j->cancelled) {
                sil_list_remove(head, j);
                if (pass)
                    w->n_running--;
                else
                    w->n_queued--;
                sil_job_finish(w, j, SIL_STOP_CANCELLED, NULL);
            }
            j = next;
        }
    }
}

void sil_publish_stats(struct sil_worker *w)
{
    uint64_t sb = 0, st = 0;
    for (struct session *s = w->sessions; s; s = s->next)
        sb += s->memory;
    for (struct job *j = w->running; j; j = j->next)
        st += sil_seq_memory(w->e, j->seq);
    if (!w->e) {
        /* no model loaded (keep_alive, or none at start): no engine figures */
        const struct sil_worker_stats keep = w->local;
        memset(&w->local, 0, sizeof w->local);
        w->local.requests_total = keep.requests_total;
        w->local.requests_failed = keep.requests_failed;
        w->local.requests_cancelled = keep.requests_cancelled;
        w->local.tokens_prompt = keep.tokens_prompt;
        w->local.tokens_cached = keep.tokens_cached;
        w->local.tokens_generated = keep.tokens_generated;
        w->local.prefix_hits = keep.prefix_hits;
        w->local.prefix_misses = keep.prefix_misses;
        w->local.prefix_tokens = keep.prefix_tokens;
        w->local.steps = keep.steps;
        w->local.eval_errors = keep.eval_errors;
        w->local.preemptions = keep.preemptions;
        w->local.tokens_recomputed = keep.tokens_recomputed;
        w->local.eval_seconds = keep.eval_seconds;
        w->local.running = w->n_running;
        w->local.queued = w->n_queued;
        w->local.prefix_enabled = w->prefix_cache;
        pthread_mutex_lock(&w->mu);
        w->stats = w->local;
        w->ec_n = 0;
        pthread_mutex_unlock(&w->mu);
        return;
    }
    w->local.running = w->n_running;
    w->local.queued = w->n_queued;
    w->local.sessions = w->n_sessions;
    w->local.spec_on = w->spec_ok;
    w->local.spec_width = w->spec_width_ok;
    w->local.spec_t_one = w->cost.t_dec[1];
    w->local.draft_seqs = w->draft_seqs;
    if (w->draft) {
        struct sil_kv_info dk;
        sil_engine_kv_info(w->draft, &dk);
        w->local.draft_kv_blocks = dk.n_blocks;
        w->local.draft_kv_free = dk.n_free;
    }
    w->local.session_bytes = sb;
    struct sil_prefix_stats ps;
    sil_engine_prefix_stats(w->e, &ps);
    w->local.prefix_enabled = w->prefix_cache;
    w->local.prefix_blocks = ps.n_blocks;
    w->local.prefix_checkpoints = ps.n_snapshots;
    w->local.prefix_checkpoint_bytes = ps.snapshot_bytes;
    w->local.prefix_cached_bytes = ps.cached_bytes;
    w->local.state_bytes = sb + st;
    w->local.ecache_slots = sil_engine_ecache_slots(w->e);
    w->local.ecache_policy = sil_engine_ecache_policy(w->e);
    w->local.ecache_mode = sil_engine_ecache_mode(w->e);
    sil_engine_ecache_layer_stats(w->e, -1, &w->local.ecache);
    const int32_t nl = w->local.ecache_slots > 0 ? sil_engine_info(w->e)->n_layer : 0;
    const int32_t n_ec = nl <= w->ec_cap ? nl : 0; /* ec_cap is the largest model's layers */
    for (int32_t l = 0; l < n_ec; l++)
        sil_engine_ecache_layer_stats(w->e, l, &w->ec_local[l]);
    pthread_mutex_lock(&w->mu);
    w->stats = w->local;
    if (n_ec) memcpy(w->ec_layers, w->ec_local, (size_t)n_ec * sizeof(*w->ec_layers));
    w->ec_n = n_ec;
    pthread_mutex_unlock(&w->mu);
}

static void *worker_main(void *arg)
{
    struct sil_worker *w = arg;
    for (;;) {
        beat(w);
        pthread_mutex_lock(&w->mu);
        /* Queued jobs count as work: when the last running job ends in a step, they start on
         * the next round, with no inbox message to wake the thread; so does a pending reload. */
        while (!w->in_head && !w->stop && !w->running && !w->queue && !w->reload && !w->unload) {
            atomic_store(&w->idle, true);
            /* Idle with a periodic heat map save pending: wake for it (the map is the engine
             * thread's to read). */
            const double due = w->heat && w->e ? sil_heatkeep_due(w->heat, w->e) : 0;
            if (due <= 0) {
                pthread_cond_wait(&w->cv, &w->mu);
                continue;
            }
            const double wait_s = due - now_s();
            if (wait_s <= 0) break;
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            const double at = (double)ts.tv_nsec * 1e-9 + wait_s + 0.001;
            ts.tv_sec += (time_t)at;
            ts.tv_nsec = (long)((at - (double)(time_t)at) * 1e9);
            pthread_cond_timedwait(&w->cv, &w->mu, &ts);
            if (now_s() >= due) break;
        }
        /* Beat before idle goes false, so the loop never sees busy with a stale heartbeat. */
        beat(w);
        atomic_store(&w->idle, false);
        struct inmsg *in = w->in_head;
        w->in_head = w->in_tail = NULL;
        bool stop = w->stop;
        w->session_memory = session_cap(w, w->session_memory_limit);
        w->max_sessions = w->max_sessions_limit;
        pthread_mutex_unlock(&w->mu);

        while (in) {
            struct inmsg *next = in->next;
            handle_in(w, in);
            free(in);
            in = next;
        }
        if (stop) {
            for (int pass = 0; pass < 2; pass++) {
                /* Detached first: sil_job_finish publishes stats, which walks the running list. */
                struct job *j = pass ? w->running : w->queue;
                if (pass)
                    w->running = NULL, w->n_running = 0;
                else
                    w->queue = NULL, w->n_queued = 0;
                while (j) {
                    struct job *next = j->next;
                    sil_job_finish(w, j, SIL_STOP_SHUTDOWN, NULL);
                    j = next;
                }
            }
            /* every change was saved when it was made: only those that failed are tried again */
            for (struct session *s = w->sessions; s; s = s->next)
                if (!s->saved)
                    sil_session_save(w, s);
            while (w->sessions)
                sil_session_free(w, w->sessions);
            if (w->heat && w->e) sil_heatkeep_save(w->heat, w->e);
            sil_publish_stats(w);
            struct sil_outmsg *m = calloc(1, sizeof(*m));
            if (m) {
                m->stopped = true;
                sil_post_raw(w, m);
            }
            flush_out(w);
            atomic_store(&w->idle, true); /* ended: nothing left that could hang */
            return NULL;
        }
        finish_cancelled(w);
        if (w->reload && !w->running) do_reload(w);
        if (w->unload && !w->running && !w->queue && !w->reload) do_unload(w);
        if (!w->e)
            fail_all(w, SIL_RPC_E_UNAVAILABLE, "no model is loaded; send the request again");
        else if (w->damaged)
            fail_all(w, SIL_RPC_E_UNAVAILABLE,
                     "the model file changed while in use; replace it by rename "
                     "and send SIGHUP to siliceod");
        else if (!w->reload)
            sil_admit(w);
        sil_publish_stats(w);
        flush_out(w); /* answers to the inbox and refusals go out before a long prefill step */
        if (w->running) {
            sil_step(w);
            beat(w);
        }
        finish_cancelled(w);
        sil_sessions_enforce(w);
        sil_publish_stats(w); /* before the final responses reach the loop */
        flush_out(w);
        if (w->heat && w->e) sil_heatkeep_tick(w->heat, w->e, now_s());
    }
}

/* ---- the loop's side --------------------------------------------------------------------------- */

static void send_in(struct sil_worker *w, struct inmsg *m)
{
    pthread_mutex_lock(&w->mu);
    if (w->in_tail)
        w->in_tail->next = m;
    else
        w->in_head = m;
    w->in_tail = m;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static struct inmsg *new_in(enum in_type t, uint64_t conn_id, uint32_t msgid)
{
    struct inmsg *m = calloc(1, sizeof(*m));
    if (!m)
        return NULL;
    m->type = t;
    m->conn_id = conn_id;
    m->msgid = msgid;
    return m;
}

/* The job's out-of-memory final response, packed now while memory is there. */
static struct sil_outmsg *oom_msg(uint64_t conn_id, uint32_t msgid)
{
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 0);
    struct sil_outmsg *m = NULL;
    if (sil_rpc_pack_error_response(&b, msgid, SIL_RPC_E_INTERNAL, "out of memory sending the result") == 0) {
        size_t n = sil_rpc_buf_size(&b);
        m = calloc(1, sizeof(*m) + n);
        if (m) {
            m->conn_id = conn_id;
            m->msgid = msgid;
            m->final = true;
            m->len = n;
            memcpy(m->data, sil_rpc_buf_head(&b), n);
        }
    }
    sil_rpc_buf_free(&b);
    return m;
}

int sil_worker_submit(struct sil_worker *w, struct sil_job_req *req)
{
    struct inmsg *m = new_in(IN_SUBMIT, req->conn_id, req->msgid);
    struct job *j = calloc(1, sizeof(*j));
    struct sil_outmsg *oom = oom_msg(req->conn_id, req->msgid);
    if (!m || !j || !oom) {
        free(m);
        free(j);
        free(oom);
        return -ENOMEM; /* the job stays the caller's */
    }
    j->r = *req;
    /* The stop pointers moved with the struct copy; they point into stop_buf, which did not. */
    j->r.ctl.stop = j->r.stop_ptrs;
    free(req);
    j->seq = -1;
    j->dseq = -1;
    j->oom = oom;
    m->job = j;
    atomic_fetch_add(&w->n_jobs, 1);
    send_in(w, m);
    return 0;
}

int sil_worker_jobs(struct sil_worker *w) { return atomic_load(&w->n_jobs); }

int sil_worker_cancel(struct sil_worker *w, uint64_t conn_id, uint32_t msgid)
{
    struct inmsg *m = new_in(IN_CANCEL, conn_id, msgid);
    if (!m)
        return -ENOMEM;
    send_in(w, m);
    return 0;
}

struct inmsg *sil_worker_close_msg_new(void) { return new_in(IN_CONN_CLOSED, 0, 0); }

void sil_worker_close_msg_free(struct inmsg *m) { free(m); }

void sil_worker_conn_closed(struct sil_worker *w, uint64_t conn_id, struct inmsg *m)
{
    m->conn_id = conn_id;
    send_in(w, m);
}

int sil_worker_sessions_list(struct sil_worker *w, uint64_t conn_id, uint32_t msgid, uint32_t uid,
                             bool all)
{
    struct inmsg *m = new_in(IN_SESS_LIST, conn_id, msgid);
    if (!m)
        return -ENOMEM;
    m->uid = uid;
    m->all = all;
    send_in(w, m);
    return 0;
}

int sil_worker_session_drop(struct sil_worker *w, uint64_t conn_id, uint32_t msgid, uint32_t uid,
                            const char *name)
{
    struct inmsg *m = new_in(IN_SESS_DROP, conn_id, msgid);
    if (!m)
        return -ENOMEM;
    m->uid = uid;
    snprintf(m->name, sizeof m->name, "%s", name);
    send_in(w, m);
    return 0;
}

void sil_worker_shutdown(struct sil_worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

void sil_worker_model_damaged(struct sil_worker *w, struct sil_engine *e)
{
    if (e) sil_engine_mark_damaged(e); /* stops an evaluation in progress at its next micro-batch */
    struct inmsg *m = new_in(IN_DAMAGED, 0, 0);
    if (!m) {
        /* The engine is marked: its evaluations fail, only the early refusal of requests is lost. */
        sil_err("out of memory telling the engine thread the model is damaged");
        return;
    }
    m->engine = e;
    send_in(w, m);
}

int sil_worker_reload(struct sil_worker *w, const struct sil_engine_params *p)
{
    struct reload *r = calloc(1, sizeof(*r));
    if (!r) {
        sil_err("reload: out of memory");
        return -ENOMEM;
    }
    r->p = *p;
    r->path = strdup(p->model_path);
    r->backend = p->backend ? strdup(p->backend) : NULL;
    if (!r->path || (p->backend && !r->backend)) {
        sil_err("reload: out of memory");
        reload_free(r);
        return -ENOMEM;
    }
    r->p.model_path = r->path;
    r->p.backend = r->backend;
    struct inmsg *m = new_in(IN_RELOAD, 0, 0);
    if (!m) {
        sil_err("reload: out of memory");
        reload_free(r);
        return -ENOMEM;
    }
    m->reload = r;
    send_in(w, m);
    return 0;
}

void sil_worker_unload(struct sil_worker *w)
{
    struct inmsg *m = new_in(IN_UNLOAD, 0, 0);
    if (!m) {
        sil_err("unload: out of memory");
        return;
    }
    send_in(w, m);
}

void sil_worker_set_limits(struct sil_worker *w, uint64_t session_memory, int max_sessions)
{
    pthread_mutex_lock(&w->mu);
    w->session_memory_limit = session_memory;
    w->max_sessions_limit = max_sessions;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

struct sil_outmsg *sil_worker_take_output(struct sil_worker *w)
{
    uint64_t v;
    ssize_t n = read(w->efd, &v, sizeof v);
    (void)n;
    pthread_mutex_lock(&w->mu);
    struct sil_outmsg *m = w->out_head;
    w->out_head = w->out_tail = NULL;
    pthread_mutex_unlock(&w->mu);
    return m;
}

void sil_worker_stats(struct sil_worker *w, struct sil_worker_stats *st)
{
    pthread_mutex_lock(&w->mu);
    *st = w->stats;
    pthread_mutex_unlock(&w->mu);
}

int32_t sil_worker_ecache_layers(struct sil_worker *w, struct sil_ecache_stats *out, int32_t max)
{
    pthread_mutex_lock(&w->mu);
    const int32_t n = w->ec_n < max ? w->ec_n : max;
    if (n > 0) memcpy(out, w->ec_layers, (size_t)n * sizeof(*out));
    pthread_mutex_unlock(&w->mu);
    return n > 0 ? n : 0;
}

int sil_worker_eventfd(const struct sil_worker *w) { return w->efd; }

bool sil_worker_alive(struct sil_worker *w, uint64_t max_age_usec, double *age_s)
{
    int64_t age = now_ns() - atomic_load_explicit(&w->heartbeat_ns, memory_order_relaxed);
    bool idle = atomic_load(&w->idle);
    if (age_s)
        *age_s = idle ? 0 : age * 1e-9;
    return idle || age <= (int64_t)max_age_usec * 1000;
}

int sil_worker_start(struct sil_worker **out, struct sil_engine *e, struct sil_engine *draft,
                     const struct sil_config *cfg, struct sil_heatkeep *heat,
                     struct sil_error *err)
{
    struct sil_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return sil_errorf(err, -ENOMEM, "out of memory");
    w->store.dfd = -1;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->e = e;
    w->draft = draft;
    w->spec_depth = cfg->spec_depth;
    w->spec_width = cfg->spec_width;
    w->spec_mtp = cfg->spec == SIL_SPEC_MTP;
    w->heat = heat;
    w->v = e ? sil_engine_vocab(e) : NULL;
    w->n_vocab = e ? sil_vocab_n_tokens(w->v) : 1;
    w->n_ctx = e ? sil_engine_n_ctx(e) : 0;
    w->max_running = cfg->max_running;
    w->prefill_chunk = cfg->prefill_chunk;
    w->host_prefill_chunk = cfg->host_prefill_chunk;
    w->prefill_budget = cfg->prefill_budget;
    w->prefill_stretch = cfg->prefill_stretch;
    w->sp.aging_s = cfg->priority_aging;
    /* the rows any engine opened with this config takes (the host tier's may be more); a step
     * gives the one in use no more than its own most */
    w->n_batch_max = (cfg->host_prefill_chunk > cfg->prefill_chunk ? cfg->host_prefill_chunk
                                                                   : cfg->prefill_chunk) +
                     cfg->max_running;
    w->tier = e && tier_on(e);
    w->session_memory_limit = cfg->session_memory;
    w->session_memory = session_cap(w, cfg->session_memory);
    w->max_sessions = w->max_sessions_limit = cfg->max_sessions;
    w->checkpoints = cfg->session_checkpoints;
    w->prefix_cache = cfg->prefix_cache;
    w->prefix_every = cfg->prefix_checkpoint_blocks * 64;
    w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    beat(w);
    sil_rpc_buf_init(&w->pk, 0);
    w->b_tok = calloc(w->n_batch_max, sizeof(int32_t));
    w->b_pos = calloc(w->n_batch_max, sizeof(int32_t));
    w->b_seq = calloc(w->n_batch_max, sizeof(int32_t));
    w->b_want = calloc(w->n_batch_max, sizeof(bool));
    w->b_status = calloc(w->n_batch_max, sizeof(int));
    w->b_pick = calloc(w->n_batch_max, sizeof(int32_t));
    w->test_stall_ms = sil_test_hook("stall_ms");
    w->test_ubatch_ms = sil_test_hook("ubatch_ms");
    w->test_kv_tokens = sil_test_hook("kv_tokens");
    w->s_items = calloc(w->max_running, sizeof(*w->s_items));
    w->s_jobs = calloc(w->max_running, sizeof(*w->s_jobs));
    w->s_idx = calloc(w->max_running, sizeof(*w->s_idx));
    w->s_take = calloc(w->max_running, sizeof(*w->s_take));
    if (e) sil_engine_set_eval_progress(e, eval_progress, w);
    if (draft) sil_engine_set_eval_progress(draft, eval_progress, w);
    sil_spec_check(w);
    w->logits = calloc((size_t)w->max_running * w->n_vocab, sizeof(float));
    if (w->efd < 0 || !w->b_tok || !w->b_pos || !w->b_seq || !w->b_want || !w->b_status ||
        !w->b_pick ||
        !w->logits || !w->s_items || !w->s_jobs || !w->s_idx || !w->s_take ||
        !grow_ec(w, e ? sil_engine_info(e)->n_layer : 0)) {
        sil_worker_free(w);
        return sil_errorf(err, -ENOMEM, "worker: out of memory");
    }
    if (cfg->saved_sessions > 0) {
        char dir[PATH_MAX];
        char note[2 * PATH_MAX];
        const int rc = sil_config_make_state_dir(cfg, dir, sizeof dir, note, sizeof note);
        if (rc < 0 && note[0])
            sil_warn("state directory unusable (%s); sessions are kept in memory only", note);
        else if (rc < 0)
            sil_warn("state directory %s: %s; sessions are kept in memory only",
                     dir[0] ? dir : "(none)", strerror(-rc));
        else {
            if (note[0]) sil_notice("state directory: %s", note);
            sil_sessstore_open(&w->store, dir, cfg->saved_sessions, cfg->saved_session_bytes);
        }
    }
    sil_publish_stats(w); /* status has the engine's figures before the first request */
    int rc = pthread_create(&w->thread, NULL, worker_main, w);
    if (rc) {
        sil_worker_free(w);
        return sil_errorf(err, -rc, "worker: pthread_create: %s", strerror(rc));
    }
    w->started = true;
    *out = w;
    return 0;
}

void sil_worker_free(struct sil_worker *w)
{
    if (!w)
        return;
    if (w->started) {
        sil_worker_shutdown(w);
        pthread_join(w->thread, NULL);
    }
    while (w->in_head) {
        struct inmsg *m = w->in_head;
        w->in_head = m->next;
        if (m->job)
            sil_job_free(w, m->job);
        reload_free(m->reload);
        free(m);
    }
    reload_free(w->reload);
    while (w->out_head) {
        struct sil_outmsg *m = w->out_head;
        w->out_head = m->next;
        free(m);
    }
    while (w->pend_head) {
        struct sil_outmsg *m = w->pend_head;
        w->pend_head = m->next;
        free(m);
    }
    sil_rpc_buf_free(&w->pk);
    if (w->efd >= 0)
        close(w->efd);
    free(w->b_tok);
    free(w->b_pos);
    free(w->b_seq);
    free(w->b_want);
    free(w->b_status);
    free(w->b_pick);
    free(w->b_hidden);
    free(w->logits);
    free(w->s_items);
    free(w->s_jobs);
    free(w->s_idx);
    free(w->s_take);
    free(w->ec_local);
    free(w->ec_layers);
    sil_sessstore_close(&w->store);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}
