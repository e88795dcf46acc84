#include "daemon/worker.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/utf8.h"
#include "siliceo-proto.h"

struct session {
    struct session *prev, *next; /* most recently used first */
    char name[SIL_SESSION_NAME_MAX];
    int seq;
    int32_t *tokens; /* what the sequence holds */
    size_t n_tokens;
    uint64_t memory;
    double last_used;
    struct job *busy;
    bool drop_when_idle;
};

struct tokvec {
    int32_t *p;
    size_t n, cap;
};

struct job {
    struct job *next;
    struct sil_job_req r;
    uint64_t arrival;
    int seq;
    struct session *sess;
    bool cancelled, conn_gone, decoding;
    size_t n_done;   /* prompt tokens in the sequence */
    size_t n_cached; /* of which reused from the session */
    int32_t pending; /* sampled token to evaluate next */
    struct tokvec ctx; /* tokens in the sequence, in order */
    struct tokvec gen; /* generated tokens */
    struct sil_sampler *smp;
    struct sil_genctl *gc;
    struct sil_detok dt;
    double t_submit, t_admit, t_first, t_end;
    int logit_row;
};

enum in_type { IN_SUBMIT, IN_CANCEL, IN_CONN_CLOSED, IN_SESS_LIST, IN_SESS_DROP };

struct inmsg {
    struct inmsg *next;
    enum in_type type;
    uint64_t conn_id;
    uint32_t msgid;
    struct sil_job_req *job;
    char name[SIL_SESSION_NAME_MAX];
};

struct sil_worker {
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int efd;
    /* Under mu. */
    struct inmsg *in_head, *in_tail;
    struct sil_outmsg *out_head, *out_tail;
    bool stop;
    struct sil_worker_stats stats;
    /* Liveness for the watchdog, read by the loop without the lock: the time the engine thread
     * last went round its loop, and whether it is blocked waiting for work (then an old
     * heartbeat is no sign of a hang). */
    atomic_int_least64_t heartbeat_ns;
    atomic_bool idle;
    uint64_t session_memory_limit;
    int max_sessions_limit;
    /* Engine thread only. */
    struct sil_engine *e;
    const struct sil_vocab *v;
    int32_t n_vocab, n_ctx;
    int max_running, prefill_chunk, n_batch_max;
    uint64_t session_memory;
    int max_sessions;
    struct job *queue, *running;
    int n_running, n_queued;
    struct session *sessions;
    int n_sessions;
    uint64_t arrivals;
    int32_t *b_tok, *b_pos, *b_seq;
    bool *b_want;
    float *logits;
    struct sil_worker_stats local;
    /* Messages of this loop iteration, handed to the event loop together (one wake-up per step
     * instead of one per token), and the buffer they are packed in (no allocation per token). */
    struct sil_outmsg *pend_head, *pend_tail;
    struct sil_rpc_buf pk;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void beat(struct sil_worker *w) { atomic_store_explicit(&w->heartbeat_ns, now_ns(), memory_order_relaxed); }

static int tokvec_push(struct tokvec *t, const int32_t *ids, size_t n)
{
    if (t->n + n > t->cap) {
        size_t cap = t->cap ? t->cap : 64;
        while (cap < t->n + n)
            cap *= 2;
        int32_t *p = realloc(t->p, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        t->p = p;
        t->cap = cap;
    }
    memcpy(t->p + t->n, ids, n * sizeof(*ids));
    t->n += n;
    return 0;
}

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

static void post_raw(struct sil_worker *w, struct sil_outmsg *m)
{
    if (w->pend_tail)
        w->pend_tail->next = m;
    else
        w->pend_head = m;
    w->pend_tail = m;
}

/* Moves what the packing buffer holds into a new pending message. */
static void post(struct sil_worker *w, uint64_t conn_id, uint32_t msgid, bool final)
{
    struct sil_rpc_buf *b = &w->pk;
    size_t n = sil_rpc_buf_size(b);
    struct sil_outmsg *m = malloc(sizeof(*m) + n);
    if (!m) {
        sil_err("out of memory queueing %zu bytes for a client", n);
        sil_rpc_buf_reset(b);
        return;
    }
    m->next = NULL;
    m->conn_id = conn_id;
    m->msgid = msgid;
    m->final = final;
    m->stopped = false;
    m->len = n;
    memcpy(m->data, sil_rpc_buf_head(b), n);
    sil_rpc_buf_reset(b);
    post_raw(w, m);
}

static void post_error(struct sil_worker *w, uint64_t conn_id, uint32_t msgid, int code, const char *msg,
                       bool final)
{
    sil_rpc_pack_error_response(&w->pk, msgid, code, msg);
    post(w, conn_id, msgid, final);
}

/* ---- sessions ---------------------------------------------------------------------------------- */

static struct session *session_find(struct sil_worker *w, const char *name)
{
    for (struct session *s = w->sessions; s; s = s->next)
        if (strcmp(s->name, name) == 0)
            return s;
    return NULL;
}

static void session_unlink(struct sil_worker *w, struct session *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        w->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

static void session_to_front(struct sil_worker *w, struct session *s)
{
    session_unlink(w, s);
    s->next = w->sessions;
    if (w->sessions)
        w->sessions->prev = s;
    w->sessions = s;
}

static void session_free(struct sil_worker *w, struct session *s)
{
    session_unlink(w, s);
    if (s->seq >= 0)
        sil_seq_free(w->e, s->seq);
    free(s->tokens);
    free(s);
    w->n_sessions--;
}

/* Drops idle sessions from the least recently used end while over the limits. */
static void sessions_enforce(struct sil_worker *w)
{
    uint64_t total = 0;
    struct session *tail = NULL;
    for (struct session *s = w->sessions; s; s = s->next) {
        total += s->memory;
        tail = s;
    }
    for (struct session *s = tail; s;) {
        struct session *prev = s->prev;
        if (!s->busy && (total > w->session_memory || w->n_sessions > w->max_sessions)) {
            sil_debug("session '%s' dropped (LRU; %llu bytes)", s->name, (unsigned long long)s->memory);
            total -= s->memory;
            session_free(w, s);
        }
        s = prev;
    }
}

/* A sequence for a new request: evicts the least recently used idle session when all are taken. */
static int seq_get(struct sil_worker *w, struct sil_error *err)
{
    for (;;) {
        int seq = sil_seq_create(w->e, err);
        if (seq != -ENOSPC)
            return seq;
        struct session *victim = NULL;
        for (struct session *s = w->sessions; s; s = s->next)
            if (!s->busy)
                victim = s;
        if (!victim)
            return -ENOSPC;
        sil_debug("session '%s' dropped to free a sequence", victim->name);
        session_free(w, victim);
    }
}

/* ---- jobs -------------------------------------------------------------------------------------- */

void sil_job_req_free(struct sil_job_req *r)
{
    if (!r)
        return;
    free(r->prompt);
    free(r->stop_buf);
    free(r);
}

static void job_free(struct sil_worker *w, struct job *j)
{
    sil_sampler_free(j->smp);
    sil_genctl_free(j->gc);
    free(j->ctx.p);
    free(j->gen.p);
    free(j->r.prompt);
    free(j->r.stop_buf);
    free(j);
}

static void pack_token(struct sil_rpc_buf *b, uint32_t msgid, const struct sil_genctl_out *o,
                       const int32_t *ids, size_t n_ids)
{
    msgpack_packer *pk = sil_rpc_begin_notification(b, "token");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, o->n_reasoning ? 4 : 3);
    sil_rpc_kv_uint(pk, "id", msgid);
    /* Already valid UTF-8 (job_token sanitizes each piece); packing checks it again for free. */
    sil_utf8_pack_kv(pk, "text", o->answer, o->n_answer);
    if (o->n_reasoning)
        sil_utf8_pack_kv(pk, "reasoning", o->reasoning, o->n_reasoning);
    sil_rpc_pack_cstr(pk, "ids");
    msgpack_pack_array(pk, (uint32_t)n_ids);
    for (size_t i = 0; i < n_ids; i++)
        msgpack_pack_int32(pk, ids[i]);
    sil_rpc_end(b);
}

static double ms(double a, double b) { return a > 0 && b >= a ? (b - a) * 1e3 : 0; }

static void publish_stats(struct sil_worker *w);

/* Final response, the sequence back to its session (or freed), the job freed. */
static void job_finish(struct sil_worker *w, struct job *j, enum sil_stop_reason why, const char *errmsg)
{
    j->t_end = now_s();
    struct sil_genctl_out tail = { 0 };
    int reason = why;
    if (j->gc) {
        /* Bytes the detokenizer still holds are a character that never completed: U+FFFD
         * (genctl drops it when a stop string or a sentence end cut the text before it). The
         * last text to stream is everything the totals gained from here on. */
        size_t a0, r0;
        sil_genctl_answer(j->gc, &a0);
        sil_genctl_reasoning(j->gc, &r0);
        char held[16], clean[3 * sizeof held];
        int n = sil_detok_flush(&j->dt, held, sizeof held);
        if (n > 0) {
            size_t len = sil_utf8_sanitize(held, (size_t)n, clean);
            struct sil_genctl_out o;
            sil_genctl_push_text(j->gc, clean, len, &o);
        }
        reason = sil_genctl_finish(j->gc, why, &tail);
        size_t na, nr;
        const char *a = sil_genctl_answer(j->gc, &na), *r = sil_genctl_reasoning(j->gc, &nr);
        if (!a)
            a = "";
        if (!r)
            r = "";
        tail = (struct sil_genctl_out){ a + a0, na - a0, r + r0, nr - r0 };
    }
    if (reason < 0)
        reason = SIL_STOP_ERROR;

    if (reason == SIL_STOP_CANCELLED)
        w->local.requests_cancelled++;
    if (reason == SIL_STOP_ERROR)
        w->local.requests_failed++;

    /* Status read right after the final response must not count this request as running. */
    publish_stats(w);
    if (!j->conn_gone) {
        if (tail.n_answer || tail.n_reasoning)
            pack_token(&w->pk, j->r.msgid, &tail, NULL, 0);
        if (reason == SIL_STOP_ERROR && j->gen.n == 0) {
            sil_rpc_pack_error_response(&w->pk, j->r.msgid, SIL_RPC_E_INTERNAL, errmsg);
        } else {
            size_t n_text = 0, n_reason = 0;
            const char *text = j->gc ? sil_genctl_answer(j->gc, &n_text) : "";
            const char *reasoning = j->gc ? sil_genctl_reasoning(j->gc, &n_reason) : "";
            double prefill = ms(j->t_admit, j->t_first), decode = ms(j->t_first, j->t_end);
            size_t n_eval = j->r.n_prompt - j->n_cached;
            msgpack_packer *pk = sil_rpc_begin_response(&w->pk, j->r.msgid);
            int n = 11 + (j->r.session[0] != 0) + (errmsg != NULL);
            msgpack_pack_map(pk, n);
            sil_utf8_pack_kv(pk, "text", text, n_text);
            sil_utf8_pack_kv(pk, "reasoning", reasoning, n_reason);
            sil_rpc_pack_cstr(pk, "tokens");
            msgpack_pack_array(pk, (uint32_t)j->gen.n);
            for (size_t i = 0; i < j->gen.n; i++)
                msgpack_pack_int32(pk, j->gen.p[i]);
            sil_rpc_kv_uint(pk, "n_prompt", j->r.n_prompt);
            sil_rpc_kv_uint(pk, "n_cached", j->n_cached);
            sil_rpc_kv_uint(pk, "n_generated", j->gen.n);
            sil_rpc_kv_uint(pk, "n_reasoning", j->gc ? (uint64_t)sil_genctl_n_reasoning_tokens(j->gc) : 0);
            sil_rpc_kv_str(pk, "stop_reason", sil_stop_reason_name(reason));
            sil_rpc_kv_uint(pk, "seed", j->smp ? sil_sampler_seed(j->smp) : j->r.sampling.seed);
            const char *model = sil_engine_info(w->e)->name;
            sil_utf8_pack_kv(pk, "model", model, strlen(model)); /* GGUF metadata: any bytes */
            if (j->r.session[0])
                sil_utf8_pack_kv(pk, "session", j->r.session, strlen(j->r.session));
            if (errmsg)
                sil_utf8_pack_kv(pk, "error", errmsg, strlen(errmsg));
            sil_rpc_pack_cstr(pk, "timings");
            msgpack_pack_map(pk, 6);
            sil_rpc_kv_double(pk, "queue_ms", ms(j->t_submit, j->t_admit));
            sil_rpc_kv_double(pk, "prefill_ms", prefill);
            sil_rpc_kv_double(pk, "decode_ms", decode);
            sil_rpc_kv_double(pk, "time_to_first_token_ms", ms(j->t_submit, j->t_first));
            sil_rpc_kv_double(pk, "prefill_tok_s", prefill > 0 ? n_eval / (prefill * 1e-3) : 0);
            sil_rpc_kv_double(pk, "decode_tok_s",
                              decode > 0 && j->gen.n > 1 ? (j->gen.n - 1) / (decode * 1e-3) : 0);
            sil_rpc_end(&w->pk);
        }
        post(w, j->r.conn_id, j->r.msgid, true);
    } else {
        /* Nothing to send, but the loop still counts requests in flight per connection. */
        struct sil_outmsg *m = calloc(1, sizeof(*m));
        if (m) {
            m->conn_id = j->r.conn_id;
            m->msgid = j->r.msgid;
            m->final = true;
            post_raw(w, m);
        }
    }

    if (j->seq >= 0) {
        struct session *s = j->sess;
        bool keep = s && reason != SIL_STOP_ERROR && !s->drop_when_idle;
        if (keep) {
            free(s->tokens);
            s->tokens = j->ctx.p;
            s->n_tokens = j->ctx.n;
            j->ctx.p = NULL;
            s->memory = sil_seq_memory(w->e, j->seq);
            s->last_used = now_s();
            s->busy = NULL;
            session_to_front(w, s);
        } else if (s) {
            s->busy = NULL;
            session_free(w, s);
        } else {
            sil_seq_free(w->e, j->seq);
        }
        j->seq = -1;
    }
    sil_debug("request %u done: %s, %zu prompt (%zu cached), %zu generated", j->r.msgid,
              sil_stop_reason_name(reason), j->r.n_prompt, j->n_cached, j->gen.n);
    job_free(w, j);
}

static void list_remove(struct job **head, struct job *j)
{
    for (struct job **p = head; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            j->next = NULL;
            return;
        }
}

static void list_append(struct job **head, struct job *j)
{
    struct job **p = head;
    while (*p)
        p = &(*p)->next;
    j->next = NULL;
    *p = j;
}

/* Places the job's sequence: reuses its session's common prefix where it can. */
static int job_admit(struct sil_worker *w, struct job *j, struct sil_error *err)
{
    struct session *s = NULL;
    if (j->r.session[0]) {
        s = session_find(w, j->r.session);
        if (s && s->busy)
            return -EBUSY;
    }
    j->t_admit = now_s();
    if (s) {
        size_t common = 0;
        while (common < s->n_tokens && common < j->r.n_prompt && s->tokens[common] == j->r.prompt[common])
            common++;
        if (common == j->r.n_prompt)
            common--; /* the last prompt token must be evaluated for its logits */
        if ((int32_t)common < sil_seq_len(w->e, s->seq)) {
            int rc = sil_seq_truncate(w->e, s->seq, (int32_t)common, err);
            if (rc == -ENOTSUP) {
                common = 0;
                rc = sil_seq_truncate(w->e, s->seq, 0, err);
            }
            if (rc) {
                session_free(w, s);
                s = NULL;
            }
        }
        if (s) {
            j->seq = s->seq;
            j->n_cached = j->n_done = common;
            s->busy = j;
            if (tokvec_push(&j->ctx, j->r.prompt, common))
                return -ENOMEM;
        }
    }
    if (!s) {
        int seq = seq_get(w, err);
        if (seq < 0)
            return seq;
        j->seq = seq;
        if (j->r.session[0] && w->max_sessions > 0) {
            s = calloc(1, sizeof(*s));
            if (!s)
                return -ENOMEM;
            snprintf(s->name, sizeof s->name, "%s", j->r.session);
            s->seq = seq;
            s->busy = j;
            s->last_used = now_s();
            s->next = w->sessions;
            if (w->sessions)
                w->sessions->prev = s;
            w->sessions = s;
            w->n_sessions++;
        }
    }
    j->sess = s;
    struct sil_sampler *smp = sil_sampler_new(&j->r.sampling, w->n_vocab);
    if (!smp)
        return -ENOMEM;
    j->smp = smp;
    sil_detok_init(&j->dt, w->v, false);
    int rc = sil_genctl_new(&j->gc, &j->r.ctl);
    if (rc)
        return rc;
    w->local.tokens_cached += j->n_cached;
    return 0;
}

static void admit(struct sil_worker *w)
{
    while (w->n_running < w->max_running && w->queue) {
        /* Highest priority first, then arrival order. */
        struct job *best = NULL;
        for (struct job *j = w->queue; j; j = j->next) {
            if (j->r.session[0]) {
                struct session *s = session_find(w, j->r.session);
                if (s && s->busy)
                    continue;
            }
            if (!best || j->r.priority < best->r.priority)
                best = j;
        }
        if (!best)
            return;
        struct sil_error err = { 0 };
        int rc = job_admit(w, best, &err);
        if (rc == -ENOSPC && w->running)
            return; /* a running request will free a sequence */
        list_remove(&w->queue, best);
        w->n_queued--;
        if (rc) {
            char msg[600];
            snprintf(msg, sizeof msg, "cannot start the request: %s", err.msg[0] ? err.msg : strerror(-rc));
            job_finish(w, best, SIL_STOP_ERROR, msg);
            continue;
        }
        list_append(&w->running, best);
        w->n_running++;
    }
}

static void running_finish(struct sil_worker *w, struct job *j, enum sil_stop_reason why, const char *msg)
{
    list_remove(&w->running, j);
    w->n_running--;
    job_finish(w, j, why, msg);
}

/* Streams the text of one new token and applies the generation controls. */
static void job_token(struct sil_worker *w, struct job *j, int32_t id)
{
    if (!j->t_first)
        j->t_first = now_s();
    if (tokvec_push(&j->gen, &id, 1)) {
        running_finish(w, j, SIL_STOP_ERROR, "out of memory");
        return;
    }
    w->local.tokens_generated++;
    if (sil_vocab_is_eog(w->v, id)) {
        running_finish(w, j, SIL_STOP_EOS, NULL);
        return;
    }
    /* The detokenizer gives whole characters (an incomplete one waits for the next token) but
     * passes invalid bytes on: those become U+FFFD here, before the generation controls, so stop
     * strings, the streamed pieces and the result text all see the text the client gets. */
    char piece[4096], clean[3 * sizeof piece];
    int n = sil_detok_push(&j->dt, id, piece, sizeof piece);
    if (n < 0)
        n = 0;
    const char *text = piece;
    size_t len = (size_t)n;
    if (!sil_utf8_valid(piece, len)) {
        len = sil_utf8_sanitize(piece, len, clean);
        text = clean;
    }
    struct sil_genctl_out o;
    int rc = sil_genctl_push(j->gc, id, text, len, &o);
    if (!j->conn_gone) {
        pack_token(&w->pk, j->r.msgid, &o, &id, 1);
        post(w, j->r.conn_id, j->r.msgid, false);
    }
    enum sil_stop_reason why = SIL_STOP_NONE;
    const char *msg = NULL;
    if (rc < 0) {
        why = SIL_STOP_ERROR;
        msg = "out of memory";
    } else if (rc != SIL_STOP_NONE) {
        why = rc;
    } else if ((int32_t)j->ctx.n + 1 >= w->n_ctx) {
        why = SIL_STOP_LENGTH; /* the context is full */
    }
    if (why != SIL_STOP_NONE) {
        running_finish(w, j, why, msg);
        return;
    }
    j->pending = id;
    j->decoding = true;
}

/* One scheduler step: decode rows for every decoding request, then prompt chunks. */
static void step(struct sil_worker *w)
{
    int n = 0, n_logits = 0;
    int32_t budget = w->prefill_chunk;
    for (struct job *j = w->running; j; j = j->next) {
        j->logit_row = -1;
        if (j->decoding && n < w->n_batch_max) {
            w->b_tok[n] = j->pending;
            w->b_pos[n] = (int32_t)j->ctx.n;
            w->b_seq[n] = j->seq;
            w->b_want[n] = true;
            j->logit_row = n_logits++;
            n++;
        }
    }
    for (struct job *j = w->running; j && budget > 0 && n < w->n_batch_max; j = j->next) {
        if (j->decoding)
            continue;
        size_t left = j->r.n_prompt - j->n_done;
        size_t take = left;
        if (take > (size_t)budget)
            take = budget;
        if (take > (size_t)(w->n_batch_max - n))
            take = w->n_batch_max - n;
        for (size_t i = 0; i < take; i++) {
            w->b_tok[n] = j->r.prompt[j->n_done + i];
            w->b_pos[n] = (int32_t)(j->ctx.n + i);
            w->b_seq[n] = j->seq;
            w->b_want[n] = false;
            n++;
        }
        if (take == left) {
            w->b_want[n - 1] = true;
            j->logit_row = n_logits++;
        }
        budget -= (int32_t)take;
    }
    if (n == 0)
        return;

    struct sil_batch batch = { .n = n, .token = w->b_tok, .pos = w->b_pos, .seq = w->b_seq, .want_logits = w->b_want };
    struct sil_error err = { 0 };
    double t0 = now_s();
    int rc = sil_engine_eval(w->e, &batch, w->logits, &err);
    w->local.eval_seconds += now_s() - t0;
    w->local.steps++;
    if (rc) {
        w->local.eval_errors++;
        sil_err("evaluation failed (%d rows): %s", n, err.msg);
        struct job *j = w->running;
        w->running = NULL;
        w->n_running = 0;
        while (j) {
            struct job *next = j->next;
            job_finish(w, j, SIL_STOP_ERROR, err.msg);
            j = next;
        }
        return;
    }

    /* Account for what was evaluated, row by row, before anything finishes. */
    for (int r = 0; r < n;) {
        struct job *j = NULL;
        for (struct job *k = w->running; k; k = k->next)
            if (k->seq == w->b_seq[r]) {
                j = k;
                break;
            }
        int start = r;
        while (r < n && w->b_seq[r] == w->b_seq[start])
            r++;
        if (!j)
            continue;
        int cnt = r - start;
        if (tokvec_push(&j->ctx, w->b_tok + start, cnt)) {
            j->cancelled = true; /* finished below with what it has */
            continue;
        }
        if (!j->decoding) {
            j->n_done += cnt;
            w->local.tokens_prompt += cnt;
        }
    }

    struct job *j = w->running;
    while (j) {
        struct job *next = j->next;
        if (j->logit_row >= 0 && !j->cancelled) {
            const float *lg = w->logits + (size_t)j->logit_row * w->n_vocab;
            int32_t forced = sil_genctl_forced(j->gc);
            int32_t id = forced >= 0 ? forced : sil_sampler_sample(j->smp, lg, j->ctx.p, j->ctx.n);
            job_token(w, j, id);
        }
        j = next;
    }
}

static bool session_in_use(struct sil_worker *w, const char *name)
{
    for (int pass = 0; pass < 2; pass++)
        for (struct job *j = pass ? w->running : w->queue; j; j = j->next)
            if (strcmp(j->r.session, name) == 0)
                return true;
    return false;
}

/* ---- the thread -------------------------------------------------------------------------------- */

static void handle_in(struct sil_worker *w, struct inmsg *m)
{
    switch (m->type) {
    case IN_SUBMIT: {
        struct job *j = calloc(1, sizeof(*j));
        if (!j) {
            post_error(w, m->job->conn_id, m->job->msgid, SIL_RPC_E_INTERNAL, "out of memory", true);
            sil_job_req_free(m->job);
            break;
        }
        j->r = *m->job;
        /* The stop pointers moved with the struct copy; they point into stop_buf, which did not. */
        j->r.ctl.stop = j->r.stop_ptrs;
        free(m->job);
        j->seq = -1;
        j->t_submit = now_s();
        if (j->r.session[0] && session_in_use(w, j->r.session)) {
            post_error(w, j->r.conn_id, j->r.msgid, SIL_RPC_E_BUSY, "session in use by another request", true);
            job_free(w, j);
            break;
        }
        j->arrival = w->arrivals++;
        list_append(&w->queue, j);
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
        msgpack_pack_array(pk, w->n_sessions);
        double t = now_s();
        uint64_t total = 0;
        for (struct session *s = w->sessions; s; s = s->next) {
            msgpack_pack_map(pk, 5);
            sil_utf8_pack_kv(pk, "name", s->name, strlen(s->name));
            sil_rpc_kv_uint(pk, "n_tokens", s->busy ? s->busy->ctx.n : s->n_tokens);
            sil_rpc_kv_uint(pk, "memory", s->memory);
            sil_rpc_kv_double(pk, "idle_s", s->busy ? 0 : t - s->last_used);
            sil_rpc_kv_bool(pk, "busy", s->busy != NULL);
            total += s->memory;
        }
        sil_rpc_kv_uint(pk, "memory", total);
        sil_rpc_kv_uint(pk, "memory_limit", w->session_memory);
        sil_rpc_end(&w->pk);
        post(w, m->conn_id, m->msgid, false);
        break;
    }
    case IN_SESS_DROP: {
        struct session *s = session_find(w, m->name);
        if (!s) {
            post_error(w, m->conn_id, m->msgid, SIL_RPC_E_NOT_FOUND, "no such session", false);
            break;
        }
        if (s->busy)
            s->drop_when_idle = true;
        else
            session_free(w, s);
        msgpack_packer *pk = sil_rpc_begin_response(&w->pk, m->msgid);
        msgpack_pack_map(pk, 0);
        sil_rpc_end(&w->pk);
        post(w, m->conn_id, m->msgid, false);
        break;
    }
    }
}

static void finish_cancelled(struct sil_worker *w)
{
    for (int pass = 0; pass < 2; pass++) {
        struct job **head = pass ? &w->running : &w->queue;
        struct job *j = *head;
        while (j) {
            struct job *next = j->next;
            if (j->cancelled) {
                list_remove(head, j);
                if (pass)
                    w->n_running--;
                else
                    w->n_queued--;
                job_finish(w, j, SIL_STOP_CANCELLED, NULL);
            }
            j = next;
        }
    }
}

static void publish_stats(struct sil_worker *w)
{
    uint64_t sb = 0, st = 0;
    for (struct session *s = w->sessions; s; s = s->next)
        sb += s->memory;
    for (struct job *j = w->running; j; j = j->next)
        st += sil_seq_memory(w->e, j->seq);
    w->local.running = w->n_running;
    w->local.queued = w->n_queued;
    w->local.sessions = w->n_sessions;
    w->local.session_bytes = sb;
    w->local.state_bytes = sb + st;
    pthread_mutex_lock(&w->mu);
    w->stats = w->local;
    pthread_mutex_unlock(&w->mu);
}

static void *worker_main(void *arg)
{
    struct sil_worker *w = arg;
    for (;;) {
        beat(w);
        pthread_mutex_lock(&w->mu);
        while (!w->in_head && !w->stop && !w->running) {
            atomic_store(&w->idle, true);
            pthread_cond_wait(&w->cv, &w->mu);
        }
        /* Beat before idle goes false, so the loop never sees busy with a stale heartbeat. */
        beat(w);
        atomic_store(&w->idle, false);
        struct inmsg *in = w->in_head;
        w->in_head = w->in_tail = NULL;
        bool stop = w->stop;
        w->session_memory = w->session_memory_limit;
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
                /* Detached first: job_finish publishes stats, which walks the running list. */
                struct job *j = pass ? w->running : w->queue;
                if (pass)
                    w->running = NULL, w->n_running = 0;
                else
                    w->queue = NULL, w->n_queued = 0;
                while (j) {
                    struct job *next = j->next;
                    job_finish(w, j, SIL_STOP_SHUTDOWN, NULL);
                    j = next;
                }
            }
            while (w->sessions)
                session_free(w, w->sessions);
            publish_stats(w);
            struct sil_outmsg *m = calloc(1, sizeof(*m));
            if (m) {
                m->stopped = true;
                post_raw(w, m);
            }
            flush_out(w);
            atomic_store(&w->idle, true); /* ended: nothing left that could hang */
            return NULL;
        }
        finish_cancelled(w);
        admit(w);
        publish_stats(w);
        flush_out(w); /* answers to the inbox and refusals go out before a long prefill step */
        if (w->running) {
            step(w);
            beat(w);
        }
        finish_cancelled(w);
        sessions_enforce(w);
        publish_stats(w); /* before the final responses reach the loop */
        flush_out(w);
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
        abort(); /* a few bytes; nothing sensible to do without them */
    m->type = t;
    m->conn_id = conn_id;
    m->msgid = msgid;
    return m;
}

void sil_worker_submit(struct sil_worker *w, struct sil_job_req *job)
{
    struct inmsg *m = new_in(IN_SUBMIT, job->conn_id, job->msgid);
    m->job = job;
    send_in(w, m);
}

void sil_worker_cancel(struct sil_worker *w, uint64_t conn_id, uint32_t msgid)
{
    send_in(w, new_in(IN_CANCEL, conn_id, msgid));
}

void sil_worker_conn_closed(struct sil_worker *w, uint64_t conn_id)
{
    send_in(w, new_in(IN_CONN_CLOSED, conn_id, 0));
}

void sil_worker_sessions_list(struct sil_worker *w, uint64_t conn_id, uint32_t msgid)
{
    send_in(w, new_in(IN_SESS_LIST, conn_id, msgid));
}

void sil_worker_session_drop(struct sil_worker *w, uint64_t conn_id, uint32_t msgid, const char *name)
{
    struct inmsg *m = new_in(IN_SESS_DROP, conn_id, msgid);
    snprintf(m->name, sizeof m->name, "%s", name);
    send_in(w, m);
}

void sil_worker_shutdown(struct sil_worker *w)
{
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
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

int sil_worker_eventfd(const struct sil_worker *w) { return w->efd; }

bool sil_worker_alive(struct sil_worker *w, uint64_t max_age_usec, double *age_s)
{
    int64_t age = now_ns() - atomic_load_explicit(&w->heartbeat_ns, memory_order_relaxed);
    bool idle = atomic_load(&w->idle);
    if (age_s)
        *age_s = idle ? 0 : age * 1e-9;
    return idle || age <= (int64_t)max_age_usec * 1000;
}

int sil_worker_start(struct sil_worker **out, struct sil_engine *e, const struct sil_config *cfg,
                     struct sil_error *err)
{
    struct sil_worker *w = calloc(1, sizeof(*w));
    if (!w)
        return sil_errorf(err, -ENOMEM, "out of memory");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->e = e;
    w->v = sil_engine_vocab(e);
    w->n_vocab = sil_vocab_n_tokens(w->v);
    w->n_ctx = sil_engine_n_ctx(e);
    w->max_running = cfg->max_running;
    w->prefill_chunk = cfg->prefill_chunk;
    w->n_batch_max = cfg->prefill_chunk + cfg->max_running;
    w->session_memory = w->session_memory_limit = cfg->session_memory;
    w->max_sessions = w->max_sessions_limit = cfg->max_sessions;
    w->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    beat(w);
    sil_rpc_buf_init(&w->pk, 0);
    w->b_tok = calloc(w->n_batch_max, sizeof(int32_t));
    w->b_pos = calloc(w->n_batch_max, sizeof(int32_t));
    w->b_seq = calloc(w->n_batch_max, sizeof(int32_t));
    w->b_want = calloc(w->n_batch_max, sizeof(bool));
    w->logits = calloc((size_t)w->max_running * w->n_vocab, sizeof(float));
    if (w->efd < 0 || !w->b_tok || !w->b_pos || !w->b_seq || !w->b_want || !w->logits) {
        sil_worker_free(w);
        return sil_errorf(err, -ENOMEM, "worker: out of memory");
    }
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
            sil_job_req_free(m->job);
        free(m);
    }
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
    free(w->logits);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}
