/* Tokenization of large texts off the event loop. A tokenize or generate request whose text is
 * at least TOKJOB_MIN_TEXT bytes is copied to one helper thread, which tokenizes it and either
 * packs the tokenize result, or finishes preparing the generate request and submits it to the
 * worker itself; errors and results come back as outbox messages (struct sil_outmsg) that the
 * loop delivers like the worker's. Smaller texts are tokenized in place: a few milliseconds.
 *
 * Contract: the thread only reads the vocab (immutable) and calls sil_worker_submit (thread
 * safe). A reload (SIGHUP) swaps the vocab with sil_tokpool_set_model only between jobs, before the
 * loop closes the old engine; while it runs, prepared generate requests are refused with
 * model_unavailable as the loop refuses them. The loop adds the request to the connection's
 * in-flight list before handing it over; the final message the thread posts (or the worker's,
 * for a submitted generate) removes it.
 * Ownership: a job owns its text copy and, for generate, the prepared sil_job_req until it is
 * submitted; posted messages are freed by the loop. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/server_impl.h"
#include "daemon/utf8.h"
#include "daemon/worker.h"
#include "siliceo-proto.h"

struct tokjob {
    struct tokjob *next;
    uint64_t conn_id;
    uint32_t msgid;
    bool add_bos, special;
    struct sil_job_req *gen; /* generate: the request to submit; NULL for tokenize */
    size_t len;
    char text[];
};

struct tokpool {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int efd;
    sd_event_source *src;
    /* Under mu. */
    struct tokjob *head, *tail;
    struct sil_outmsg *out_head, *out_tail;
    bool stop;
    bool busy;      /* the thread runs a job: v and n_ctx are in use */
    bool reloading; /* a model reload is under way: generate requests are refused */
    /* Changed under mu while not busy (sil_tokpool_set_model); read by the thread during a job. */
    const struct sil_vocab *v;
    int32_t n_ctx;
    /* Read-only after start. */
    struct server *srv;
    struct sil_worker *w;
};

static void post_msg(struct tokpool *p, uint64_t conn_id, uint32_t msgid, struct sil_rpc_buf *b)
{
    size_t n = sil_rpc_buf_size(b);
    struct sil_outmsg *m = malloc(sizeof(*m) + n);
    if (!m) {
        /* Without it the request would stay in flight: an empty final message still clears it,
         * and failing that the client waits until it closes. */
        m = calloc(1, sizeof(*m));
        n = 0;
        sil_err("out of memory posting a tokenize result");
        if (!m)
            return;
    }
    m->next = NULL;
    m->conn_id = conn_id;
    m->msgid = msgid;
    m->final = true;
    m->stopped = false;
    m->len = n;
    memcpy(m->data, sil_rpc_buf_head(b), n);
    pthread_mutex_lock(&p->mu);
    bool was_empty = !p->out_head;
    if (p->out_tail)
        p->out_tail->next = m;
    else
        p->out_head = m;
    p->out_tail = m;
    pthread_mutex_unlock(&p->mu);
    if (was_empty) {
        uint64_t one = 1;
        ssize_t r = write(p->efd, &one, sizeof one);
        (void)r;
    }
}

static void post_error(struct tokpool *p, struct tokjob *j, struct sil_rpc_buf *b, int code, const char *msg)
{
    char clean[3 * 600];
    size_t n = sil_utf8_sanitize(msg, strnlen(msg, 600), clean);
    clean[n] = 0;
    sil_rpc_buf_reset(b);
    sil_rpc_pack_error_response(b, j->msgid, code, clean);
    post_msg(p, j->conn_id, j->msgid, b);
}

static void run_job(struct tokpool *p, struct tokjob *j, struct sil_rpc_buf *b)
{
    int32_t *ids = NULL;
    size_t n = 0;
    struct sil_error e = { 0 };
    char msg[600];
    if (sil_tokenize(p->v, j->text, j->len, j->add_bos, j->special, &ids, &n, &e) < 0) {
        snprintf(msg, sizeof msg, "%s: %s", j->gen ? "prompt" : "tokenize", e.msg);
        post_error(p, j, b, j->gen ? SIL_RPC_E_INVALID_PARAMS : SIL_RPC_E_INTERNAL, msg);
        return;
    }
    if (!j->gen) {
        msgpack_packer *pk = sil_rpc_begin_response(b, j->msgid);
        msgpack_pack_map(pk, 2);
        sil_rpc_pack_cstr(pk, "ids");
        msgpack_pack_array(pk, n);
        for (size_t i = 0; i < n; i++)
            msgpack_pack_int32(pk, ids[i]);
        sil_rpc_kv_uint(pk, "n", n);
        free(ids);
        if (sil_rpc_end(b) < 0)
            post_error(p, j, b, SIL_RPC_E_TOO_LARGE, "result too large");
        else
            post_msg(p, j->conn_id, j->msgid, b);
        return;
    }
    struct sil_job_req *r = j->gen;
    r->prompt = ids;
    r->n_prompt = n;
    if (n == 0) {
        post_error(p, j, b, SIL_RPC_E_INVALID_PARAMS, "empty prompt");
        return;
    }
    if ((int64_t)n + 1 >= p->n_ctx) {
        snprintf(msg, sizeof msg, "prompt of %zu tokens does not fit the context of %d", n, p->n_ctx);
        post_error(p, j, b, SIL_RPC_E_CONTEXT_FULL, msg);
        return;
    }
    r->ctl.in_reasoning = sil_prompt_ends_in_think(p->v, ids, n);
    r->conn_id = j->conn_id;
    r->msgid = j->msgid;
    /* Under mu: a reload the loop starts after this check reaches the worker after the request,
     * which then fails it like every queued request (tokenized for the old model). */
    pthread_mutex_lock(&p->mu);
    bool reloading = p->reloading;
    int rc = reloading ? 0 : sil_worker_submit(p->w, r);
    pthread_mutex_unlock(&p->mu);
    if (reloading) {
        post_error(p, j, b, SIL_RPC_E_UNAVAILABLE,
                   "the model is being reloaded; send the request again");
        return;
    }
    if (rc < 0) {
        post_error(p, j, b, SIL_RPC_E_INTERNAL, "out of memory");
        return;
    }
    j->gen = NULL; /* the worker's now; its final response ends the request */
}

static void *tok_main(void *arg)
{
    struct tokpool *p = arg;
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 0);
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->head && !p->stop)
            pthread_cond_wait(&p->cv, &p->mu);
        struct tokjob *j = p->head;
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        p->head = j->next;
        if (!p->head)
            p->tail = NULL;
        p->busy = true;
        pthread_mutex_unlock(&p->mu);
        run_job(p, j, &b);
        sil_rpc_buf_reset(&b);
        sil_job_req_free(j->gen);
        free(j);
        pthread_mutex_lock(&p->mu);
        p->busy = false;
        pthread_cond_broadcast(&p->cv); /* sil_tokpool_set_model may wait for this */
        pthread_mutex_unlock(&p->mu);
    }
    sil_rpc_buf_free(&b);
    return NULL;
}

static int on_tok_output(sd_event_source *src, int fd, uint32_t revents, void *ud)
{
    struct tokpool *p = ud;
    uint64_t v;
    ssize_t r = read(p->efd, &v, sizeof v);
    (void)r;
    pthread_mutex_lock(&p->mu);
    struct sil_outmsg *m = p->out_head;
    p->out_head = p->out_tail = NULL;
    pthread_mutex_unlock(&p->mu);
    while (m) {
        struct sil_outmsg *next = m->next;
        sil_conn_deliver(p->srv, m);
        free(m);
        m = next;
    }
    sil_models_pump(p->srv); /* a prompt refused here may leave the worker idle */
    sil_conn_flush_dirty(p->srv);
    return 0;
}

int sil_tokpool_start(struct server *s)
{
    struct tokpool *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->srv = s;
    p->v = s->vocab;
    p->w = s->worker;
    p->n_ctx = s->engine ? sil_engine_n_ctx(s->engine) : 0; /* none loaded: set at the load */
    p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    int rc = p->efd < 0 ? -errno : sd_event_add_io(s->ev, &p->src, p->efd, EPOLLIN, on_tok_output, p);
    if (rc == 0)
        rc = -pthread_create(&p->thread, NULL, tok_main, p);
    if (rc < 0) {
        sd_event_source_disable_unref(p->src);
        if (p->efd >= 0)
            close(p->efd);
        free(p);
        return rc;
    }
    s->tok = p;
    return 0;
}

void sil_tokpool_set_reloading(struct tokpool *p, bool reloading)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->reloading = reloading;
    pthread_mutex_unlock(&p->mu);
}

bool sil_tokpool_idle(struct tokpool *p)
{
    if (!p) return true;
    pthread_mutex_lock(&p->mu);
    const bool idle = !p->head && !p->busy;
    pthread_mutex_unlock(&p->mu);
    return idle;
}

void sil_tokpool_set_model(struct tokpool *p, const struct sil_vocab *v, int32_t n_ctx)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    while (p->busy)
        pthread_cond_wait(&p->cv, &p->mu); /* at most one tokenization: well under a second */
    p->v = v;
    p->n_ctx = n_ctx;
    p->reloading = false;
    pthread_mutex_unlock(&p->mu);
}

void sil_tokpool_free(struct tokpool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    while (p->head) {
        struct tokjob *j = p->head;
        p->head = j->next;
        sil_job_req_free(j->gen);
        free(j);
    }
    while (p->out_head) {
        struct sil_outmsg *m = p->out_head;
        p->out_head = m->next;
        free(m);
    }
    sd_event_source_disable_unref(p->src);
    close(p->efd);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

int sil_tokpool_submit(struct server *s, struct conn *c, uint32_t msgid, const char *text, size_t len, bool add_bos,
                       bool special, struct sil_job_req *gen)
{
    struct tokpool *p = s->tok;
    struct tokjob *j = malloc(sizeof(*j) + len);
    if (!j)
        return -ENOMEM;
    if (sil_inflight_add(c, msgid) < 0) {
        free(j);
        return -ENOMEM;
    }
    j->next = NULL;
    j->conn_id = c->id;
    j->msgid = msgid;
    j->add_bos = add_bos;
    j->special = special;
    j->gen = gen;
    j->len = len;
    memcpy(j->text, text, len);
    pthread_mutex_lock(&p->mu);
    if (p->tail)
        p->tail->next = j;
    else
        p->head = j;
    p->tail = j;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return 0;
}
