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
#include "daemon/log.h"
#include "daemon/utf8.h"
#include "daemon/worker.h"
#include "siliceo-proto.h"

#define READ_CHUNK 65536
#define MAX_DEBUG_STREAM 10000000
#define MAX_CHAT_MESSAGES 4096

struct dstream {
    struct dstream *next;
    uint32_t msgid;
    uint64_t remaining, sent;
    bool cancelled;
    size_t len;
    char text[];
};

struct conn {
    struct conn *prev, *next;
    struct server *srv;
    uint64_t id;
    int fd;
    sd_event_source *io;
    struct ucred cred;
    bool owner;
    struct sil_rpc_unpacker *up;
    char *out;
    size_t out_off, out_len, out_cap;
    uint32_t *inflight; /* msgids of requests the worker (or a debug stream) still answers */
    int n_inflight, cap_inflight;
    struct dstream *streams;
    bool closing; /* close once the output is flushed */
    bool dirty;   /* output appended by on_worker, not yet written */
};

enum state { RUNNING, STOPPING, DRAINING };

struct server {
    struct sil_config *cfg;
    int argc;
    char *const *argv;
    sd_event *ev;
    sd_event_source *listen_src, *worker_src, *drain_timer, *watchdog_timer;
    uint64_t watchdog_usec; /* WATCHDOG_USEC from systemd; 0: no watchdog */
    bool engine_stalled;
    int listen_fd;
    bool activated;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct sil_engine *engine;
    const struct sil_vocab *vocab;
    struct sil_worker *worker;
    struct conn *conns;
    int n_conns;
    uint64_t next_conn_id;
    enum state state;
    double t_start;
    struct sil_rpc_buf scratch;
    /* Counters for metrics. */
    uint64_t clients_total, clients_refused, clients_dropped, bytes_in, bytes_out, messages_in,
        bad_messages, requests_rejected;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- connections ------------------------------------------------------------------------------- */

static void conn_free(struct conn *c)
{
    struct server *s = c->srv;
    if (c->n_inflight && s->worker)
        sil_worker_conn_closed(s->worker, c->id);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->n_conns--;
    sd_event_source_disable_unref(c->io);
    close(c->fd);
    sil_rpc_unpacker_free(c->up);
    while (c->streams) {
        struct dstream *d = c->streams;
        c->streams = d->next;
        free(d);
    }
    free(c->inflight);
    free(c->out);
    free(c);
}

static struct conn *conn_find(struct server *s, uint64_t id)
{
    for (struct conn *c = s->conns; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

static size_t conn_queued(const struct conn *c) { return c->out_len - c->out_off; }

static void conn_update_events(struct conn *c)
{
    uint32_t ev = c->closing ? 0 : EPOLLIN;
    if (conn_queued(c))
        ev |= EPOLLOUT;
    sd_event_source_set_io_events(c->io, ev);
}

/* Writes what the socket takes now. Returns -1 when the connection had to be closed. */
static int conn_flush(struct conn *c)
{
    while (conn_queued(c)) {
        ssize_t n = send(c->fd, c->out + c->out_off, conn_queued(c), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                break;
            sil_debug("client %llu: send: %s", (unsigned long long)c->id, strerror(errno));
            conn_free(c);
            return -1;
        }
        c->out_off += n;
        c->srv->bytes_out += n;
    }
    if (c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->closing && !conn_queued(c)) {
        conn_free(c);
        return -1;
    }
    conn_update_events(c);
    return 0;
}

/* Queues bytes without writing them; a client whose queue would pass max_output is dropped (it
 * does not read). Returns -1 when the connection is gone. */
static int conn_append(struct conn *c, const void *data, size_t n)
{
    struct server *s = c->srv;
    if (conn_queued(c) + n > s->cfg->max_output) {
        sil_warn("client %llu (pid %d, uid %d) dropped: more than %llu bytes of output waiting",
                 (unsigned long long)c->id, c->cred.pid, c->cred.uid, (unsigned long long)s->cfg->max_output);
        s->clients_dropped++;
        conn_free(c);
        return -1;
    }
    if (c->out_off && c->out_len + n > c->out_cap) {
        memmove(c->out, c->out + c->out_off, conn_queued(c));
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n)
            cap *= 2;
        char *p = realloc(c->out, cap);
        if (!p) {
            conn_free(c);
            return -1;
        }
        c->out = p;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, data, n);
    c->out_len += n;
    return 0;
}

static int conn_send(struct conn *c, const void *data, size_t n)
{
    if (conn_append(c, data, n) < 0)
        return -1;
    return conn_flush(c);
}

/* Sends what the scratch buffer holds. */
static int conn_send_scratch(struct conn *c)
{
    struct server *s = c->srv;
    int rc = conn_send(c, sil_rpc_buf_head(&s->scratch), sil_rpc_buf_size(&s->scratch));
    sil_rpc_buf_reset(&s->scratch);
    return rc;
}

static int send_error(struct conn *c, uint32_t msgid, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int send_error(struct conn *c, uint32_t msgid, int code, const char *fmt, ...)
{
    char msg[512], clean[3 * sizeof msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Messages quote what clients sent and cut it at a byte count: keep them valid UTF-8. */
    size_t n = sil_utf8_sanitize(msg, strlen(msg), clean);
    clean[n] = 0;
    sil_rpc_pack_error_response(&c->srv->scratch, msgid, code, clean);
    return conn_send_scratch(c);
}

static int send_rpc_error(struct conn *c, uint32_t msgid, const struct sil_rpc_error *err)
{
    return send_error(c, msgid, err->code ? err->code : SIL_RPC_E_INVALID_PARAMS, "%s", err->msg);
}

static bool inflight_has(const struct conn *c, uint32_t msgid)
{
    for (int i = 0; i < c->n_inflight; i++)
        if (c->inflight[i] == msgid)
            return true;
    return false;
}

static int inflight_add(struct conn *c, uint32_t msgid)
{
    if (c->n_inflight == c->cap_inflight) {
        int cap = c->cap_inflight ? c->cap_inflight * 2 : 8;
        uint32_t *p = realloc(c->inflight, cap * sizeof(*p));
        if (!p)
            return -ENOMEM;
        c->inflight = p;
        c->cap_inflight = cap;
    }
    c->inflight[c->n_inflight++] = msgid;
    return 0;
}

static void inflight_remove(struct conn *c, uint32_t msgid)
{
    for (int i = 0; i < c->n_inflight; i++)
        if (c->inflight[i] == msgid) {
            c->inflight[i] = c->inflight[--c->n_inflight];
            return;
        }
}

/* ---- debug.stream: notifications without the model, paced by the client's reading ------------- */

static int pump_streams(struct conn *c)
{
    struct server *s = c->srv;
    while (c->streams) {
        struct dstream *d = c->streams;
        while (d->remaining && !d->cancelled && conn_queued(c) < s->cfg->max_output / 2) {
            /* Batch a few notifications per send to keep the syscall count down. */
            for (int k = 0; k < 64 && d->remaining; k++) {
                sil_rpc_pack_token(&s->scratch, d->msgid, d->text, d->len, NULL, 0);
                d->remaining--;
                d->sent++;
            }
            if (conn_send_scratch(c) < 0)
                return -1;
        }
        if (d->remaining && !d->cancelled)
            return 0; /* wait for the client to read */
        msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, d->msgid);
        msgpack_pack_map(pk, 2);
        sil_rpc_kv_uint(pk, "n_sent", d->sent);
        sil_rpc_kv_str(pk, "stop_reason", d->cancelled ? "cancelled" : "length");
        sil_rpc_end(&s->scratch);
        c->streams = d->next;
        inflight_remove(c, d->msgid);
        free(d);
        if (conn_send_scratch(c) < 0)
            return -1;
    }
    return 0;
}

/* ---- methods ----------------------------------------------------------------------------------- */

static const char *const capabilities[] = { "hello", "generate", "chat", "cancel", "tokenize", "detokenize",
                                            "status", "metrics", "sessions.list", "sessions.drop", "shutdown",
                                            "debug.stream", "stream", "sessions" };

static int m_hello(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    struct sil_rpc_error err = { 0 };
    const msgpack_object *proto = sil_rpc_map_get(m->params, "protocol");
    char client[128] = "";
    if (sil_rpc_get_strbuf(m->params, "client", client, sizeof client, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE, &err) < 0)
        return send_rpc_error(c, m->msgid, &err);
    bool ok = !proto || proto->type == MSGPACK_OBJECT_NIL;
    if (proto && proto->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < proto->via.array.size; i++) {
            const msgpack_object *o = &proto->via.array.ptr[i];
            if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 == SIL_RPC_PROTOCOL_VERSION)
                ok = true;
            else if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
                return send_error(c, m->msgid, SIL_RPC_E_INVALID_PARAMS, "field 'protocol[%u]': expected integer", i);
        }
    } else if (proto && proto->type != MSGPACK_OBJECT_NIL) {
        int64_t v;
        if (sil_rpc_get_int(m->params, "protocol", 0, UINT32_MAX, &v, SIL_RPC_REQUIRED, &err) < 0)
            return send_rpc_error(c, m->msgid, &err);
        ok = v == SIL_RPC_PROTOCOL_VERSION;
    }
    if (!ok)
        return send_error(c, m->msgid, SIL_RPC_E_VERSION, "this daemon speaks protocol version %d",
                          SIL_RPC_PROTOCOL_VERSION);
    if (client[0])
        sil_debug("client %llu is %s", (unsigned long long)c->id, client);
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 6);
    sil_rpc_kv_uint(pk, "protocol", SIL_RPC_PROTOCOL_VERSION);
    sil_rpc_kv_str(pk, "server", "siliceod");
    sil_rpc_kv_str(pk, "version", SIL_VERSION);
    sil_rpc_pack_cstr(pk, "capabilities");
    size_t n_caps = sizeof capabilities / sizeof *capabilities;
    bool thinking = s->vocab && sil_vocab_think_open(s->vocab) >= 0;
    msgpack_pack_array(pk, n_caps + thinking);
    for (size_t i = 0; i < n_caps; i++)
        sil_rpc_pack_cstr(pk, capabilities[i]);
    if (thinking)
        sil_rpc_pack_cstr(pk, "thinking");
    const struct sil_model_info *info = s->engine ? sil_engine_info(s->engine) : NULL;
    sil_rpc_pack_cstr(pk, "model");
    if (info) {
        msgpack_pack_map(pk, 2);
        sil_utf8_pack_kv(pk, "name", info->name, strlen(info->name)); /* GGUF metadata: any bytes */
        sil_rpc_kv_str(pk, "arch", info->arch_name);
    } else {
        msgpack_pack_nil(pk);
    }
    sil_rpc_kv_uint(pk, "max_message", s->cfg->max_message);
    sil_rpc_end(&s->scratch);
    return conn_send_scratch(c);
}

static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "re");
    unsigned long long size = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &size, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

static int m_status(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    struct sil_worker_stats st = { 0 };
    if (s->worker)
        sil_worker_stats(s->worker, &st);
    const struct sil_model_info *info = s->engine ? sil_engine_info(s->engine) : NULL;
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 13);
    sil_rpc_kv_str(pk, "state", s->state == RUNNING ? "ready" : "stopping");
    sil_rpc_kv_str(pk, "version", SIL_VERSION);
    sil_rpc_kv_uint(pk, "pid", getpid());
    sil_rpc_kv_double(pk, "uptime_s", now_s() - s->t_start);
    sil_rpc_kv_str(pk, "backend", info ? info->backend : "none");
    sil_rpc_kv_int(pk, "threads", info ? info->n_threads : 0);
    sil_rpc_pack_cstr(pk, "model");
    if (info) {
        msgpack_pack_map(pk, 13);
        sil_utf8_pack_kv(pk, "name", info->name, strlen(info->name));
        sil_rpc_kv_str(pk, "arch", info->arch_name);
        sil_utf8_pack_kv(pk, "file", info->path, strlen(info->path)); /* a path is bytes */
        sil_rpc_kv_uint(pk, "file_bytes", info->file_bytes);
        sil_rpc_kv_uint(pk, "n_params", info->n_params);
        sil_rpc_kv_int(pk, "n_ctx", sil_engine_n_ctx(s->engine));
        sil_rpc_kv_int(pk, "n_vocab", info->n_vocab);
        sil_rpc_kv_int(pk, "n_ctx_train", info->n_ctx_train);
        sil_rpc_kv_int(pk, "n_layer", info->n_layer);
        sil_rpc_kv_int(pk, "n_expert", info->n_expert);
        sil_rpc_kv_int(pk, "n_expert_used", info->n_expert_used);
        sil_rpc_kv_uint(pk, "routed_expert_bytes", info->routed_expert_bytes);
        sil_rpc_kv_uint(pk, "backbone_bytes", info->backbone_bytes);
    } else {
        msgpack_pack_nil(pk);
    }
    sil_rpc_pack_cstr(pk, "memory");
    msgpack_pack_map(pk, 4);
    sil_rpc_kv_uint(pk, "rss", rss_bytes());
    sil_rpc_kv_uint(pk, "model", info ? info->file_bytes : 0);
    sil_rpc_kv_uint(pk, "kv", st.state_bytes);
    sil_rpc_kv_uint(pk, "sessions", st.session_bytes);
    sil_rpc_pack_cstr(pk, "queue");
    msgpack_pack_map(pk, 4);
    sil_rpc_kv_int(pk, "running", st.running);
    sil_rpc_kv_int(pk, "queued", st.queued);
    sil_rpc_kv_int(pk, "max_running", s->cfg->max_running);
    sil_rpc_kv_int(pk, "max_queue", s->cfg->max_queue);
    sil_rpc_kv_int(pk, "sessions", st.sessions);
    sil_rpc_kv_int(pk, "clients", s->n_conns);
    sil_rpc_pack_cstr(pk, "requests");
    msgpack_pack_map(pk, 3);
    sil_rpc_kv_uint(pk, "total", st.requests_total);
    sil_rpc_kv_uint(pk, "failed", st.requests_failed);
    sil_rpc_kv_uint(pk, "cancelled", st.requests_cancelled);
    sil_rpc_pack_cstr(pk, "tokens");
    msgpack_pack_map(pk, 3);
    sil_rpc_kv_uint(pk, "prompt", st.tokens_prompt);
    sil_rpc_kv_uint(pk, "cached", st.tokens_cached);
    sil_rpc_kv_uint(pk, "generated", st.tokens_generated);
    sil_rpc_end(&s->scratch);
    return conn_send_scratch(c);
}

static int m_metrics(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    struct sil_worker_stats st = { 0 };
    if (s->worker)
        sil_worker_stats(s->worker, &st);
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 1);
    sil_rpc_pack_cstr(pk, "metrics");
    msgpack_pack_map(pk, 26);
    sil_rpc_kv_double(pk, "siliceo_uptime_seconds", now_s() - s->t_start);
    sil_rpc_kv_uint(pk, "siliceo_rss_bytes", rss_bytes());
    sil_rpc_kv_uint(pk, "siliceo_clients", s->n_conns);
    sil_rpc_kv_uint(pk, "siliceo_clients_total", s->clients_total);
    sil_rpc_kv_uint(pk, "siliceo_clients_refused_total", s->clients_refused);
    sil_rpc_kv_uint(pk, "siliceo_clients_dropped_total", s->clients_dropped);
    sil_rpc_kv_uint(pk, "siliceo_bytes_in_total", s->bytes_in);
    sil_rpc_kv_uint(pk, "siliceo_bytes_out_total", s->bytes_out);
    sil_rpc_kv_uint(pk, "siliceo_messages_in_total", s->messages_in);
    sil_rpc_kv_uint(pk, "siliceo_bad_messages_total", s->bad_messages);
    sil_rpc_kv_uint(pk, "siliceo_requests_rejected_total", s->requests_rejected);
    sil_rpc_kv_uint(pk, "siliceo_requests_total", st.requests_total);
    sil_rpc_kv_uint(pk, "siliceo_requests_failed_total", st.requests_failed);
    sil_rpc_kv_uint(pk, "siliceo_requests_cancelled_total", st.requests_cancelled);
    sil_rpc_kv_int(pk, "siliceo_queue_running", st.running);
    sil_rpc_kv_int(pk, "siliceo_queue_queued", st.queued);
    sil_rpc_kv_uint(pk, "siliceo_tokens_prompt_total", st.tokens_prompt);
    sil_rpc_kv_uint(pk, "siliceo_tokens_cached_total", st.tokens_cached);
    sil_rpc_kv_uint(pk, "siliceo_tokens_generated_total", st.tokens_generated);
    sil_rpc_kv_uint(pk, "siliceo_eval_steps_total", st.steps);
    sil_rpc_kv_uint(pk, "siliceo_eval_errors_total", st.eval_errors);
    sil_rpc_kv_double(pk, "siliceo_eval_seconds_total", st.eval_seconds);
    sil_rpc_kv_int(pk, "siliceo_sessions", st.sessions);
    sil_rpc_kv_uint(pk, "siliceo_session_bytes", st.session_bytes);
    sil_rpc_kv_uint(pk, "siliceo_state_bytes", st.state_bytes);
    sil_rpc_kv_uint(pk, "siliceo_ready", s->state == RUNNING);
    sil_rpc_end(&s->scratch);
    return conn_send_scratch(c);
}

/* need_model and admit_request: 1 to go on, else what the method returns (0: refused with an
 * error response, -1: the connection is gone and c with it). */
static int need_model(struct conn *c, const struct sil_rpc_msg *m)
{
    if (c->srv->worker)
        return 1;
    return send_error(c, m->msgid, SIL_RPC_E_METHOD_NOT_FOUND, "%s: not available, siliceod runs with --no-model",
                      m->method);
}

static int m_tokenize(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    int ok = need_model(c, m);
    if (ok <= 0)
        return ok;
    struct sil_rpc_error err = { 0 };
    const char *text;
    size_t len;
    bool add_bos = false, special = false;
    if (sil_rpc_get_str(m->params, "text", &text, &len, SIL_RPC_REQUIRED, &err) < 0 ||
        sil_rpc_get_bool(m->params, "add_bos", &add_bos, SIL_RPC_OPTIONAL, &err) < 0 ||
        sil_rpc_get_bool(m->params, "special", &special, SIL_RPC_OPTIONAL, &err) < 0)
        return send_rpc_error(c, m->msgid, &err);
    int32_t *ids = NULL;
    size_t n = 0;
    struct sil_error e = { 0 };
    if (sil_tokenize(s->vocab, text, len, add_bos, special, &ids, &n, &e) < 0)
        return send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "tokenize: %s", e.msg);
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 2);
    sil_rpc_pack_cstr(pk, "ids");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_int32(pk, ids[i]);
    sil_rpc_kv_uint(pk, "n", n);
    free(ids);
    if (sil_rpc_end(&s->scratch) < 0)
        return send_error(c, m->msgid, SIL_RPC_E_TOO_LARGE, "result too large");
    return conn_send_scratch(c);
}

/* ids: an array of token ids, each checked against the vocab. *out malloc'd. */
static int read_ids(const struct server *s, const msgpack_object *arr, const char *field, int32_t **out,
                    size_t *n, struct sil_rpc_error *err)
{
    int32_t n_vocab = sil_vocab_n_tokens(s->vocab);
    uint32_t cnt = arr->via.array.size;
    int32_t *ids = malloc((cnt ? cnt : 1) * sizeof(*ids));
    if (!ids)
        return sil_rpc_errorf(err, -ENOMEM, SIL_RPC_E_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < cnt; i++) {
        const msgpack_object *o = &arr->via.array.ptr[i];
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 >= (uint64_t)n_vocab) {
            free(ids);
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                  "%s[%u]: expected a token id in [0, %d)", field, i, n_vocab);
        }
        ids[i] = (int32_t)o->via.u64;
    }
    *out = ids;
    *n = cnt;
    return 0;
}

static int m_detokenize(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    int ok = need_model(c, m);
    if (ok <= 0)
        return ok;
    struct sil_rpc_error err = { 0 };
    const msgpack_object *arr;
    bool special = false;
    int32_t *ids;
    size_t n;
    if (sil_rpc_get_array(m->params, "ids", &arr, SIL_RPC_REQUIRED, &err) < 0 ||
        sil_rpc_get_bool(m->params, "special", &special, SIL_RPC_OPTIONAL, &err) < 0 ||
        read_ids(s, arr, "ids", &ids, &n, &err) < 0)
        return send_rpc_error(c, m->msgid, &err);
    char *text = NULL;
    size_t len = 0;
    struct sil_error e = { 0 };
    int rc = sil_detokenize(s->vocab, ids, n, special, &text, &len, &e);
    free(ids);
    if (rc < 0)
        return send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "detokenize: %s", e.msg);
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 1);
    /* Any ids may be asked for: byte tokens that do not form UTF-8 come back as U+FFFD. */
    sil_utf8_pack_kv(pk, "text", text, len);
    free(text);
    if (sil_rpc_end(&s->scratch) < 0)
        return send_error(c, m->msgid, SIL_RPC_E_TOO_LARGE, "result too large");
    return conn_send_scratch(c);
}

/* Sampling, budgets, stop strings, session and priority: the fields generate and chat share. */
static int read_gen_params(struct server *s, const msgpack_object *p, struct sil_job_req *j,
                           struct sil_rpc_error *err)
{
    const struct sil_config *cfg = s->cfg;
    sil_sampler_params_default(&j->sampling);
    sil_genctl_params_default(&j->ctl);
    j->ctl.think_open = sil_vocab_think_open(s->vocab);
    j->ctl.think_close = sil_vocab_think_close(s->vocab);
    int64_t max_tokens = cfg->max_tokens_default, top_k = j->sampling.top_k, think = -1,
            grace = SIL_GENCTL_GRACE_MAX, rep_n = j->sampling.repeat_last_n;
    double temp = j->sampling.temperature, top_p = j->sampling.top_p, min_p = j->sampling.min_p,
           rep = j->sampling.repeat_penalty, pres = j->sampling.presence_penalty;
    uint64_t seed = 0;
    bool repair = true;
    const unsigned O = SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE;
    if (sil_rpc_get_int(p, "max_tokens", 1, cfg->max_tokens_limit, &max_tokens, O, err) < 0 ||
        sil_rpc_get_double(p, "temperature", 0, 100, &temp, O, err) < 0 ||
        sil_rpc_get_int(p, "top_k", 0, 1 << 24, &top_k, O, err) < 0 ||
        sil_rpc_get_double(p, "top_p", 0, 1, &top_p, O, err) < 0 ||
        sil_rpc_get_double(p, "min_p", 0, 1, &min_p, O, err) < 0 ||
        sil_rpc_get_double(p, "repeat_penalty", 0.01, 100, &rep, O, err) < 0 ||
        sil_rpc_get_int(p, "repeat_last_n", 0, 1 << 20, &rep_n, O, err) < 0 ||
        sil_rpc_get_double(p, "presence_penalty", -100, 100, &pres, O, err) < 0 ||
        sil_rpc_get_uint(p, "seed", 0, UINT64_MAX, &seed, O, err) < 0 ||
        sil_rpc_get_int(p, "max_thinking_tokens", -1, 1 << 24, &think, O, err) < 0 ||
        sil_rpc_get_int(p, "grace_tokens", 0, SIL_GENCTL_GRACE_MAX, &grace, O, err) < 0 ||
        sil_rpc_get_bool(p, "repair_markdown", &repair, O, err) < 0 ||
        sil_rpc_get_strbuf(p, "session", j->session, sizeof j->session, O, err) < 0)
        return -EINVAL;
    j->sampling.temperature = (float)temp;
    j->sampling.top_k = (int32_t)top_k;
    j->sampling.top_p = (float)top_p;
    j->sampling.min_p = (float)min_p;
    j->sampling.repeat_penalty = (float)rep;
    j->sampling.repeat_last_n = (int32_t)rep_n;
    j->sampling.presence_penalty = (float)pres;
    j->sampling.seed = seed;
    j->ctl.max_tokens = (int32_t)max_tokens;
    j->ctl.max_thinking_tokens = (int32_t)think;
    j->ctl.grace_tokens = (int32_t)grace;
    j->ctl.repair_markdown = repair;

    j->priority = SIL_PRIO_NORMAL;
    const msgpack_object *prio = sil_rpc_map_get(p, "priority");
    if (prio && prio->type == MSGPACK_OBJECT_STR) {
        static const char *const names[] = { "interactive", "normal", "batch" };
        j->priority = -1;
        for (int i = 0; i < 3; i++)
            if (prio->via.str.size == strlen(names[i]) && memcmp(prio->via.str.ptr, names[i], prio->via.str.size) == 0)
                j->priority = i;
        if (j->priority < 0)
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                  "priority: expected \"interactive\", \"normal\" or \"batch\"");
    } else if (prio && prio->type != MSGPACK_OBJECT_NIL) {
        int64_t v;
        if (sil_rpc_get_int(p, "priority", 0, 2, &v, O, err) < 0)
            return -EINVAL;
        j->priority = (int)v;
    }

    /* stop: a string or an array of strings. */
    const msgpack_object *stop = sil_rpc_map_get(p, "stop");
    if (stop && stop->type != MSGPACK_OBJECT_NIL) {
        const msgpack_object *items = stop;
        uint32_t n = 1;
        if (stop->type == MSGPACK_OBJECT_ARRAY) {
            n = stop->via.array.size;
            items = stop->via.array.ptr;
        } else if (stop->type != MSGPACK_OBJECT_STR) {
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "stop: expected a string or an array of strings");
        }
        if (n > SIL_GENCTL_MAX_STOP)
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "stop: at most %d strings", SIL_GENCTL_MAX_STOP);
        j->stop_buf = malloc((size_t)n * (SIL_GENCTL_MAX_STOP_LEN + 1) + 1);
        if (!j->stop_buf)
            return sil_rpc_errorf(err, -ENOMEM, SIL_RPC_E_INTERNAL, "out of memory");
        char *q = j->stop_buf;
        for (uint32_t i = 0; i < n; i++) {
            const msgpack_object *o = &items[i];
            if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 || o->via.str.size > SIL_GENCTL_MAX_STOP_LEN ||
                memchr(o->via.str.ptr, 0, o->via.str.size))
                return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                      "stop[%u]: expected a string of 1 to %d bytes", i, SIL_GENCTL_MAX_STOP_LEN);
            /* The text it is matched against is valid UTF-8; a string that is not could only hold
             * back part of a character. */
            if (!sil_utf8_valid(o->via.str.ptr, o->via.str.size))
                return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "stop[%u]: not valid UTF-8", i);
            memcpy(q, o->via.str.ptr, o->via.str.size);
            q[o->via.str.size] = 0;
            j->stop_ptrs[i] = q;
            q += o->via.str.size + 1;
        }
        j->ctl.stop = j->stop_ptrs;
        j->ctl.n_stop = n;
    }
    return 0;
}

static int submit(struct conn *c, const struct sil_rpc_msg *m, struct sil_job_req *j)
{
    struct server *s = c->srv;
    int32_t n_ctx = sil_engine_n_ctx(s->engine);
    if (j->n_prompt == 0) {
        sil_job_req_free(j);
        return send_error(c, m->msgid, SIL_RPC_E_INVALID_PARAMS, "empty prompt");
    }
    if ((int64_t)j->n_prompt + 1 >= n_ctx) {
        size_t n = j->n_prompt;
        sil_job_req_free(j);
        return send_error(c, m->msgid, SIL_RPC_E_TOO_LARGE, "prompt of %zu tokens does not fit the context of %d", n,
                          n_ctx);
    }
    if (inflight_has(c, m->msgid)) {
        sil_job_req_free(j);
        return send_error(c, m->msgid, SIL_RPC_E_INVALID_REQUEST, "msgid %u is already in flight", m->msgid);
    }
    if (inflight_add(c, m->msgid) < 0) {
        sil_job_req_free(j);
        return send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    }
    j->conn_id = c->id;
    j->msgid = m->msgid;
    sil_worker_submit(s->worker, j);
    return 0;
}

/* Admission control shared by generate, chat and debug.stream. */
static int admit_request(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    if (c->n_inflight >= s->cfg->max_client_requests) {
        s->requests_rejected++;
        return send_error(c, m->msgid, SIL_RPC_E_BUSY, "more than %d requests in flight on this connection",
                          s->cfg->max_client_requests);
    }
    if (s->worker) {
        struct sil_worker_stats st;
        sil_worker_stats(s->worker, &st);
        if (st.queued >= s->cfg->max_queue && st.running >= s->cfg->max_running) {
            s->requests_rejected++;
            return send_error(c, m->msgid, SIL_RPC_E_BUSY, "queue full (%d waiting)", st.queued);
        }
    }
    return 1;
}

/* The prompt ends inside an open think block: the model's first tokens are reasoning. */
static bool ends_in_think(const struct server *s, const int32_t *ids, size_t n)
{
    int32_t open = sil_vocab_think_open(s->vocab);
    if (open < 0 || n == 0)
        return false;
    if (ids[n - 1] == open)
        return true;
    if (n >= 2 && ids[n - 2] == open) {
        const char *b;
        int len = sil_token_bytes(s->vocab, ids[n - 1], &b);
        for (int i = 0; i < len; i++)
            if (b[i] != '\n' && b[i] != ' ')
                return false;
        return len > 0;
    }
    return false;
}

static int m_generate(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    int ok = need_model(c, m);
    if (ok > 0)
        ok = admit_request(c, m);
    if (ok <= 0)
        return ok;
    struct sil_rpc_error err = { 0 };
    struct sil_job_req *j = calloc(1, sizeof(*j));
    if (!j)
        return send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    const char *text = NULL;
    size_t len = 0;
    const msgpack_object *toks = NULL;
    bool special = true, add_bos = sil_vocab_add_bos(s->vocab);
    if (read_gen_params(s, m->params, j, &err) < 0 ||
        sil_rpc_get_str(m->params, "prompt", &text, &len, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE, &err) < 0 ||
        sil_rpc_get_array(m->params, "prompt_tokens", &toks, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE, &err) < 0 ||
        sil_rpc_get_bool(m->params, "special", &special, SIL_RPC_OPTIONAL, &err) < 0 ||
        sil_rpc_get_bool(m->params, "add_bos", &add_bos, SIL_RPC_OPTIONAL, &err) < 0)
        goto bad;
    if (!text == !toks) {
        sil_rpc_errorf(&err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "give exactly one of prompt and prompt_tokens");
        goto bad;
    }
    if (toks) {
        if (read_ids(s, toks, "prompt_tokens", &j->prompt, &j->n_prompt, &err) < 0)
            goto bad;
    } else {
        struct sil_error e = { 0 };
        if (sil_tokenize(s->vocab, text, len, add_bos, special, &j->prompt, &j->n_prompt, &e) < 0) {
            sil_rpc_errorf(&err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "prompt: %s", e.msg);
            goto bad;
        }
    }
    j->ctl.in_reasoning = ends_in_think(s, j->prompt, j->n_prompt);
    return submit(c, m, j);
bad:
    sil_job_req_free(j);
    return send_rpc_error(c, m->msgid, &err);
}

static int m_chat(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    int ok = need_model(c, m);
    if (ok > 0)
        ok = admit_request(c, m);
    if (ok <= 0)
        return ok;
    struct sil_rpc_error err = { 0 };
    struct sil_job_req *j = calloc(1, sizeof(*j));
    struct sil_chat_msg *msgs = NULL;
    char **strs = NULL;
    uint32_t n = 0;
    if (!j)
        return send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    const msgpack_object *arr;
    bool think = sil_vocab_think_open(s->vocab) >= 0;
    if (read_gen_params(s, m->params, j, &err) < 0 ||
        sil_rpc_get_array(m->params, "messages", &arr, SIL_RPC_REQUIRED, &err) < 0 ||
        sil_rpc_get_bool(m->params, "think", &think, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE, &err) < 0)
        goto bad;
    n = arr->via.array.size;
    if (n == 0 || n > MAX_CHAT_MESSAGES) {
        sil_rpc_errorf(&err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "messages: expected 1 to %d messages", MAX_CHAT_MESSAGES);
        goto bad;
    }
    msgs = calloc(n, sizeof(*msgs));
    strs = calloc((size_t)n * 3, sizeof(*strs));
    if (!msgs || !strs) {
        sil_rpc_errorf(&err, -ENOMEM, SIL_RPC_E_INTERNAL, "out of memory");
        goto bad;
    }
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *o = &arr->via.array.ptr[i];
        const char *keys[3] = { "role", "content", "reasoning" };
        if (o->type != MSGPACK_OBJECT_MAP) {
            sil_rpc_errorf(&err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "messages[%u]: expected a map {role, content}", i);
            goto bad;
        }
        for (int k = 0; k < 3; k++) {
            const char *str;
            size_t len;
            int rc = sil_rpc_get_str(o, keys[k], &str, &len, k < 2 ? SIL_RPC_REQUIRED : SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE,
                                     &err);
            if (rc < 0 || (rc == 1 && memchr(str, 0, len))) {
                if (rc >= 0)
                    sil_rpc_errorf(&err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "%s: contains a NUL byte", keys[k]);
                sil_rpc_error_prefix(&err, "messages[%u]", i);
                goto bad;
            }
            if (rc == 1) {
                strs[i * 3 + k] = strndup(str, len);
                if (!strs[i * 3 + k]) {
                    sil_rpc_errorf(&err, -ENOMEM, SIL_RPC_E_INTERNAL, "out of memory");
                    goto bad;
                }
            }
        }
        msgs[i].role = strs[i * 3];
        msgs[i].content = strs[i * 3 + 1];
        msgs[i].reasoning = strs[i * 3 + 2];
    }
    /* Token ids straight from the template: message contents are never parsed for special
     * tokens, so a message cannot close its turn and open a system turn by its text. */
    struct sil_error e = { 0 };
    int rc = sil_chat_tokenize(s->vocab, msgs, n, true, think, &j->prompt, &j->n_prompt, &e);
    if (rc < 0) {
        sil_rpc_errorf(&err, rc, rc == -ENOMEM ? SIL_RPC_E_INTERNAL : SIL_RPC_E_INVALID_PARAMS, "messages: %s",
                       e.msg);
        goto bad;
    }
    j->ctl.in_reasoning = think && ends_in_think(s, j->prompt, j->n_prompt);
    for (uint32_t i = 0; i < n * 3; i++)
        free(strs[i]);
    free(strs);
    free(msgs);
    return submit(c, m, j);
bad:
    if (strs)
        for (uint32_t i = 0; i < n * 3; i++)
            free(strs[i]);
    free(strs);
    free(msgs);
    sil_job_req_free(j);
    return send_rpc_error(c, m->msgid, &err);
}

static int m_cancel(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    struct sil_rpc_error err = { 0 };
    int64_t id;
    if (sil_rpc_get_int(m->params, "id", 0, UINT32_MAX, &id, SIL_RPC_REQUIRED, &err) < 0)
        return send_rpc_error(c, m->msgid, &err);
    if (!inflight_has(c, (uint32_t)id))
        return send_error(c, m->msgid, SIL_RPC_E_NOT_FOUND, "no request %lld in flight on this connection",
                          (long long)id);
    bool is_stream = false;
    for (struct dstream *d = c->streams; d; d = d->next)
        if (d->msgid == (uint32_t)id) {
            d->cancelled = true;
            is_stream = true;
        }
    if (!is_stream)
        sil_worker_cancel(s->worker, c->id, (uint32_t)id);
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 0);
    sil_rpc_end(&s->scratch);
    if (conn_send_scratch(c) < 0)
        return -1;
    return is_stream ? pump_streams(c) : 0;
}

static int m_sessions_list(struct conn *c, const struct sil_rpc_msg *m)
{
    int ok = need_model(c, m);
    if (ok <= 0)
        return ok;
    sil_worker_sessions_list(c->srv->worker, c->id, m->msgid);
    return 0;
}

static int m_sessions_drop(struct conn *c, const struct sil_rpc_msg *m)
{
    int ok = need_model(c, m);
    if (ok <= 0)
        return ok;
    struct sil_rpc_error err = { 0 };
    char name[SIL_SESSION_NAME_MAX];
    if (sil_rpc_get_strbuf(m->params, "name", name, sizeof name, SIL_RPC_REQUIRED, &err) < 0)
        return send_rpc_error(c, m->msgid, &err);
    sil_worker_session_drop(c->srv->worker, c->id, m->msgid, name);
    return 0;
}

static void begin_shutdown(struct server *s, const char *why);

static int m_shutdown(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    if (!c->owner)
        return send_error(c, m->msgid, SIL_RPC_E_PERMISSION, "shutdown: only the daemon's owner (uid %d) or root may",
                          (int)geteuid());
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 0);
    sil_rpc_end(&s->scratch);
    if (conn_send_scratch(c) < 0)
        return -1;
    char why[64];
    snprintf(why, sizeof why, "shutdown requested by pid %d", c->cred.pid);
    begin_shutdown(s, why);
    return 0;
}

static int m_debug_stream(struct conn *c, const struct sil_rpc_msg *m)
{
    struct sil_rpc_error err = { 0 };
    int64_t count;
    const char *text = "x";
    size_t len = 1;
    int ok = admit_request(c, m);
    if (ok <= 0)
        return ok;
    if (sil_rpc_get_int(m->params, "count", 0, MAX_DEBUG_STREAM, &count, SIL_RPC_REQUIRED, &err) < 0 ||
        sil_rpc_get_str(m->params, "text", &text, &len, SIL_RPC_OPTIONAL, &err) < 0)
        return send_rpc_error(c, m->msgid, &err);
    if (len > 4096)
        return send_error(c, m->msgid, SIL_RPC_E_INVALID_PARAMS, "text: at most 4096 bytes");
    if (inflight_has(c, m->msgid))
        return send_error(c, m->msgid, SIL_RPC_E_INVALID_REQUEST, "msgid %u is already in flight", m->msgid);
    size_t clean_len = sil_utf8_sanitized_len(text, len); /* streamed back: valid UTF-8 only */
    struct dstream *d = calloc(1, sizeof(*d) + clean_len);
    if (!d || inflight_add(c, m->msgid) < 0) {
        free(d);
        return send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    }
    d->msgid = m->msgid;
    d->remaining = (uint64_t)count;
    d->len = sil_utf8_sanitize(text, len, d->text);
    struct dstream **p = &c->streams;
    while (*p)
        p = &(*p)->next;
    *p = d;
    return pump_streams(c);
}

struct method {
    const char *name;
    int (*fn)(struct conn *c, const struct sil_rpc_msg *m);
    bool during_shutdown;
};

static const struct method methods[] = {
    { "hello", m_hello, true },
    { "status", m_status, true },
    { "metrics", m_metrics, true },
    { "generate", m_generate, false },
    { "chat", m_chat, false },
    { "cancel", m_cancel, true },
    { "tokenize", m_tokenize, true },
    { "detokenize", m_detokenize, true },
    { "sessions.list", m_sessions_list, false },
    { "sessions.drop", m_sessions_drop, false },
    { "shutdown", m_shutdown, true },
    { "debug.stream", m_debug_stream, false },
};

static int dispatch(struct conn *c, const struct sil_rpc_msg *m)
{
    if (m->type != SIL_RPC_REQUEST)
        return 0; /* no notifications or responses are expected from clients; ignored */
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++) {
        if (strcmp(methods[i].name, m->method) != 0)
            continue;
        if (c->srv->state != RUNNING && !methods[i].during_shutdown)
            return send_error(c, m->msgid, SIL_RPC_E_SHUTTING_DOWN, "siliceod is shutting down");
        sil_debug("client %llu: %s (msgid %u)", (unsigned long long)c->id, m->method, m->msgid);
        return methods[i].fn(c, m);
    }
    return send_error(c, m->msgid, SIL_RPC_E_METHOD_NOT_FOUND, "unknown method '%.64s'", m->method);
}

/* ---- I/O --------------------------------------------------------------------------------------- */

static int conn_read(struct conn *c)
{
    struct server *s = c->srv;
    size_t avail = 0;
    void *p = sil_rpc_unpacker_space(c->up, READ_CHUNK, &avail);
    if (!p) {
        if (send_error(c, 0, SIL_RPC_E_TOO_LARGE, "too much unparsed input") < 0)
            return -1;
        c->closing = true;
        return conn_flush(c);
    }
    ssize_t n = recv(c->fd, p, avail, MSG_DONTWAIT);
    if (n == 0) {
        conn_free(c);
        return -1;
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR)
            return 0;
        conn_free(c);
        return -1;
    }
    sil_rpc_unpacker_commit(c->up, n);
    s->bytes_in += n;
    for (;;) {
        struct sil_rpc_msg m;
        struct sil_rpc_error err = { 0 };
        int rc = sil_rpc_unpacker_next(c->up, &m, &err);
        if (rc == 0)
            return 0;
        s->messages_in++;
        if (rc == 1) {
            rc = dispatch(c, &m);
            sil_rpc_msg_release(&m);
            if (rc < 0)
                return -1; /* the connection is gone */
            if (c->closing)
                return 0;
            continue;
        }
        s->bad_messages++;
        sil_debug("client %llu: bad message: %s", (unsigned long long)c->id, err.msg);
        if (rc == -EPROTO && m.has_msgid && m.type == SIL_RPC_REQUEST) {
            if (send_rpc_error(c, m.msgid, &err) < 0)
                return -1;
            continue;
        }
        if (rc == -EPROTO && m.type != SIL_RPC_REQUEST && m.type >= 0)
            continue; /* a malformed notification or response: nothing to answer */
        /* Framing is lost (or the peer is not speaking the protocol): say why, then hang up. */
        if (send_error(c, 0, err.code ? err.code : SIL_RPC_E_PARSE, "%s", err.msg) < 0)
            return -1; /* the send failed and freed c: not even c->id may be read */
        c->closing = true;
        return conn_flush(c);
    }
}

static int on_conn_io(sd_event_source *src, int fd, uint32_t revents, void *ud)
{
    struct conn *c = ud;
    if (revents & (EPOLLERR | EPOLLHUP)) {
        if (!(revents & EPOLLIN)) {
            conn_free(c);
            return 0;
        }
    }
    if (revents & EPOLLOUT) {
        if (conn_flush(c) < 0)
            return 0;
        if (c->streams && pump_streams(c) < 0)
            return 0;
    }
    if ((revents & EPOLLIN) && !c->closing)
        conn_read(c);
    return 0;
}

static bool peer_allowed(const struct server *s, int fd, const struct ucred *cr)
{
    if (cr->uid == 0 || cr->uid == geteuid())
        return true;
    for (int i = 0; i < s->cfg->n_allow_uids; i++)
        if (s->cfg->allow_uids[i] == cr->uid)
            return true;
    if (!s->cfg->n_allow_gids)
        return false;
    gid_t groups[256];
    socklen_t len = sizeof groups;
    int n = 0;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0)
        n = len / sizeof(gid_t);
    for (int i = 0; i < s->cfg->n_allow_gids; i++) {
        if (s->cfg->allow_gids[i] == cr->gid)
            return true;
        for (int k = 0; k < n; k++)
            if (groups[k] == s->cfg->allow_gids[i])
                return true;
    }
    return false;
}

/* A refused peer gets one error response, written without waiting, and the socket is closed. */
static void refuse(struct server *s, int fd, int code, const char *msg)
{
    sil_rpc_pack_error_response(&s->scratch, 0, code, msg);
    ssize_t n = send(fd, sil_rpc_buf_head(&s->scratch), sil_rpc_buf_size(&s->scratch), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
    sil_rpc_buf_reset(&s->scratch);
    s->clients_refused++;
    close(fd);
}

static int on_accept(sd_event_source *src, int fd, uint32_t revents, void *ud)
{
    struct server *s = ud;
    for (int k = 0; k < 16; k++) {
        int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (cfd < 0) {
            if (errno != EAGAIN && errno != EINTR)
                sil_warn("accept: %s", strerror(errno));
            return 0;
        }
        struct ucred cr = { 0 };
        socklen_t len = sizeof cr;
        if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0) {
            close(cfd);
            continue;
        }
        if (!peer_allowed(s, cfd, &cr)) {
            char msg[128];
            snprintf(msg, sizeof msg, "permission denied: uid %d is not allowed to use this daemon", (int)cr.uid);
            sil_notice("refused pid %d uid %d gid %d: not in the allow list", cr.pid, cr.uid, cr.gid);
            refuse(s, cfd, SIL_RPC_E_PERMISSION, msg);
            continue;
        }
        if (s->n_conns >= s->cfg->max_clients) {
            sil_warn("refused pid %d: %d clients connected", cr.pid, s->n_conns);
            refuse(s, cfd, SIL_RPC_E_BUSY, "too many clients");
            continue;
        }
        struct conn *c = calloc(1, sizeof(*c));
        if (!c) {
            close(cfd);
            continue;
        }
        c->srv = s;
        c->fd = cfd;
        c->id = ++s->next_conn_id;
        c->cred = cr;
        c->owner = cr.uid == 0 || cr.uid == geteuid();
        c->up = sil_rpc_unpacker_new(s->cfg->max_message, 0);
        if (!c->up || sd_event_add_io(s->ev, &c->io, cfd, EPOLLIN, on_conn_io, c) < 0) {
            sil_rpc_unpacker_free(c->up);
            close(cfd);
            free(c);
            continue;
        }
        c->next = s->conns;
        if (s->conns)
            s->conns->prev = c;
        s->conns = c;
        s->n_conns++;
        s->clients_total++;
        sil_debug("client %llu connected: pid %d uid %d", (unsigned long long)c->id, cr.pid, cr.uid);
    }
    return 0;
}

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
        conn_flush(c);
        c = next;
    }
    if (!s->conns)
        sd_event_exit(s->ev, 0);
}

static int on_worker(sd_event_source *src, int fd, uint32_t revents, void *ud)
{
    struct server *s = ud;
    struct sil_outmsg *m = sil_worker_take_output(s->worker);
    /* Everything the worker produced since the last wake-up is appended first and each client's
     * socket written once: one send per client per wake-up, not one per token. */
    while (m) {
        struct sil_outmsg *next = m->next;
        if (m->stopped) {
            s->state = DRAINING;
        } else {
            struct conn *c = conn_find(s, m->conn_id);
            if (c) {
                if (m->final)
                    inflight_remove(c, m->msgid);
                if (m->len && conn_append(c, m->data, m->len) == 0)
                    c->dirty = true;
            }
        }
        free(m);
        m = next;
    }
    for (struct conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->dirty) {
            c->dirty = false;
            conn_flush(c);
        }
    }
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

static void begin_shutdown(struct server *s, const char *why)
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
            pump_streams(c);
    }
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
        return 0;
    }
    begin_shutdown(s, si->ssi_signo == SIGTERM ? "SIGTERM" : "SIGINT");
    return 0;
}

/* ---- watchdog ---------------------------------------------------------------------------------- */

/* WATCHDOG=1 says both threads are alive: this timer firing shows the event loop runs, and the
 * engine thread must be waiting for work or have finished a scheduler step within the watchdog
 * interval. A hung engine (or one step longer than WatchdogSec) stops the pings, and systemd
 * restarts the daemon. */
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
        sil_err("engine thread has not finished a step for %.1f s; watchdog pings stopped", age);
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

static void load_progress(float fraction, const char *what, void *user)
{
    static int last = -1;
    int pct = (int)(fraction * 100);
    if (pct == last)
        return;
    last = pct;
    sd_notifyf(0, "STATUS=loading model: %d%% %s", pct, what ? what : "");
}

/* Creates the socket's directory (0750) when missing; the default ones are ours to fix up. */
static int make_socket_dir(const char *path, gid_t gid)
{
    char dir[sizeof(((struct sockaddr_un *)0)->sun_path)];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return 0;
    *slash = 0;
    struct stat st;
    if (stat(dir, &st) == 0)
        return 0;
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
    return 0;
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
    int rc = make_socket_dir(s->path, gid);
    if (rc < 0) {
        sil_err("cannot create the directory of %s: %s", s->path, strerror(-rc));
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
    /* Blocked before any thread exists, so the worker inherits the mask and sd-event gets them. */
    sigprocmask(SIG_BLOCK, &ss, NULL);
    signal(SIGPIPE, SIG_IGN);
    sil_rpc_buf_init(&s->scratch, 0);

    if (setup_listen(s) < 0)
        goto out;

    if (!cfg->no_model) {
        struct sil_engine_params ep;
        sil_engine_params_default(&ep);
        ep.model_path = cfg->model;
        ep.n_threads = cfg->threads;
        ep.backend = cfg->backend;
        ep.vram_budget = cfg->vram_budget;
        ep.n_ctx = cfg->ctx;
        ep.n_seq_max = cfg->max_running + cfg->max_sessions;
        ep.n_batch_max = cfg->prefill_chunk + cfg->max_running;
        ep.progress = load_progress;
        struct sil_error err = { 0 };
        sd_notifyf(0, "STATUS=loading model %s", cfg->model);
        double t0 = now_s();
        if (sil_engine_open(&s->engine, &ep, &err) < 0) {
            sil_err("cannot load the model: %s", err.msg);
            sd_notifyf(0, "STATUS=cannot load the model: %s", err.msg);
            goto out;
        }
        const struct sil_model_info *info = sil_engine_info(s->engine);
        sil_info("model %s (%s, %d layers, %llu parameters) loaded in %.2f s on %s, %d threads, context %d",
                 info->name, info->arch_name, info->n_layer, (unsigned long long)info->n_params, now_s() - t0,
                 info->backend, info->n_threads, sil_engine_n_ctx(s->engine));
        s->vocab = sil_engine_vocab(s->engine);
        if (sil_worker_start(&s->worker, s->engine, cfg, &err) < 0) {
            sil_err("%s", err.msg);
            goto out;
        }
    } else {
        sil_notice("running without a model (--no-model): only hello, status, metrics and debug.stream work");
    }

    if (sd_event_default(&s->ev) < 0)
        goto out;
    if (sd_event_add_io(s->ev, &s->listen_src, s->listen_fd, EPOLLIN, on_accept, s) < 0 ||
        sd_event_add_signal(s->ev, NULL, SIGTERM, on_signal, s) < 0 ||
        sd_event_add_signal(s->ev, NULL, SIGINT, on_signal, s) < 0 ||
        sd_event_add_signal(s->ev, NULL, SIGHUP, on_signal, s) < 0 ||
        (s->worker && sd_event_add_io(s->ev, &s->worker_src, sil_worker_eventfd(s->worker), EPOLLIN, on_worker, s) < 0)) {
        sil_err("event loop set-up failed");
        goto out;
    }
    if (setup_watchdog(s) < 0) {
        sil_err("event loop set-up failed (watchdog timer)");
        goto out;
    }
    sd_notifyf(0, "READY=1\nSTATUS=ready: %s on %s", s->engine ? sil_engine_info(s->engine)->name : "no model",
               s->path);
    sil_notice("ready");
    int rc = sd_event_loop(s->ev);
    status = rc < 0 ? 1 : 0;
    if (rc < 0)
        sil_err("event loop: %s", strerror(-rc));
    else
        sil_notice("stopped");

out:
    while (s->conns)
        conn_free(s->conns);
    if (s->worker) {
        sil_worker_free(s->worker);
        s->worker = NULL;
    }
    if (s->engine)
        sil_engine_close(s->engine);
    sd_event_source_disable_unref(s->listen_src);
    sd_event_source_disable_unref(s->worker_src);
    sd_event_source_disable_unref(s->drain_timer);
    sd_event_source_disable_unref(s->watchdog_timer);
    if (s->listen_fd >= 0 && !s->activated) {
        unlink(s->path);
        close(s->listen_fd);
    }
    if (s->ev)
        sd_event_unref(s->ev);
    sil_rpc_buf_free(&s->scratch);
    return status;
}
