/* sil-openai: an OpenAI-compatible HTTP bridge to siliceod. HTTP on one side (GNU
 * libmicrohttpd, one thread per connection, so each request may block on the daemon), msgpack-RPC
 * on the other: every generation request gets its own daemon connection, so closing it cancels
 * the request there; while waiting for the daemon the thread also watches the HTTP peer's socket
 * and closes the daemon connection as soon as the peer hangs up. See sil-openai(1). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <microhttpd.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <syslog.h>
#include <systemd/sd-daemon.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "client/common/common.h"
#include "client/sil-openai/openai.h"

#define PROG "sil-openai"

struct opts {
    const char *socket; /* daemon socket, NULL: the default */
    const char *host;
    int port;
    const char *unix_path; /* listen on a Unix socket instead */
    size_t max_body;
    int max_concurrent; /* generation requests in flight */
    int max_connections;
    int timeout_s; /* idle HTTP connection */
    int health_timeout_ms;
    bool debug_stream; /* POST /v1/debug/stream relays debug.stream, for bench/run-openai.sh */
    bool no_ui;        /* no chat page at / */
    int log_level;     /* LOG_ERR .. LOG_DEBUG: request lines at LOG_INFO */
    char token[256];   /* "" : no check */
};

static struct opts g_opt;
static atomic_int g_in_flight;
static atomic_ullong g_counter, g_requests, g_errors, g_cancelled, g_rejected;
static unsigned long long g_id_salt;
static volatile sig_atomic_t g_stop;
static bool g_journal; /* stderr is the journal's stream: lines carry their priority as <N> */

/* Daemon facts, cached from hello: the model name goes into every response. Asked again after
 * INFO_TTL_S, so a daemon restarted with another model is seen without a round trip per request. */
#define INFO_TTL_S 5.0
static pthread_mutex_t g_info_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_model[128];
static struct sil_oa_caps g_caps;
static bool g_have_info;
static double g_info_at;

static void on_signal(int sig)
{
    g_stop = 1;
}

/* ---- the log -------------------------------------------------------------------------------- */

static const char *const level_names[] = {[LOG_ERR] = "err",
                                          [LOG_WARNING] = "warning",
                                          [LOG_NOTICE] = "notice",
                                          [LOG_INFO] = "info",
                                          [LOG_DEBUG] = "debug"};

/* The names siliceod's log_level takes. */
static int parse_level(const char *s)
{
    for (int i = LOG_ERR; i <= LOG_DEBUG; i++)
        if (strcasecmp(s, level_names[i]) == 0) return i;
    if (strcasecmp(s, "error") == 0) return LOG_ERR;
    if (strcasecmp(s, "warn") == 0) return LOG_WARNING;
    return -EINVAL;
}

/* JOURNAL_STREAM is "dev:ino" of the journal's stream; it counts only if stderr is that stream. */
static bool stderr_is_journal(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    unsigned long long dev, ino;
    struct stat st;
    if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
        return false;
    return st.st_dev == dev && st.st_ino == ino;
}

/* One request's line, once its connection is done with it: at debug level for the endpoints
 * monitors poll (/health, /metrics), at info for the others. */
static void log_request(const struct sil_oa_reqlog *l)
{
    bool polled = strcmp(l->path, "/health") == 0 || strcmp(l->path, "/metrics") == 0;
    int level = polled ? LOG_DEBUG : LOG_INFO;
    if (level > g_opt.log_level) return;
    char line[1024];
    int n = g_journal ? snprintf(line, sizeof(line), "<%d>", level)
                      : snprintf(line, sizeof(line), PROG ": %s: ", level_names[level]);
    size_t m = sil_oa_reqlog_format(line + n, sizeof(line) - (size_t)n - 1, l, sil_client_now());
    if (m > sizeof(line) - (size_t)n - 2) m = sizeof(line) - (size_t)n - 2;
    line[(size_t)n + m] = '\n';
    /* one write a line, so the threads' lines never interleave */
    ssize_t w = write(STDERR_FILENO, line, (size_t)n + m + 1);
    (void)w;
}

/* Each HTTP connection serves one request at a time: its socket context holds that request's
 * log record. */
static void connection_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                              enum MHD_ConnectionNotificationCode toe)
{
    if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
        *socket_context = calloc(1, sizeof(struct sil_oa_reqlog));
    } else {
        free(*socket_context);
        *socket_context = NULL;
    }
}

static struct sil_oa_reqlog *reqlog_of(struct MHD_Connection *conn)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

static int open_client(struct sil_rpc_client *c, int timeout_ms, struct sil_rpc_error *err)
{
    char path[4096];
    if (sil_rpc_socket_path(g_opt.socket, path, sizeof(path)) < 0)
        return sil_rpc_errorf(err, -ENAMETOOLONG, 0, "socket path too long");
    int r = sil_rpc_client_open(c, path, err);
    if (r == 0) c->timeout_ms = timeout_ms;
    return r;
}

static int refresh_info(struct sil_rpc_error *err)
{
    struct sil_rpc_client c;
    int r = open_client(&c, g_opt.health_timeout_ms, err);
    if (r < 0) return r;
    msgpack_packer *pk = sil_rpc_client_begin(&c, "hello");
    msgpack_pack_map(pk, 2);
    sil_rpc_kv_int(pk, "protocol", SIL_RPC_PROTOCOL_VERSION);
    sil_rpc_kv_str(pk, "client", PROG " " SIL_VERSION);
    const msgpack_object *res;
    r = sil_rpc_client_call(&c, NULL, NULL, &res, err);
    if (r == 0) {
        pthread_mutex_lock(&g_info_lock);
        /* the id requests name the model by (its file name), else its name; a daemon with no
         * model loaded has neither */
        const msgpack_object *m = sil_rpc_map_get(res, "model");
        char name[sizeof g_model];
        sil_rpc_map_str(m, "name", name, sizeof(name), "none");
        sil_rpc_map_str(m, "id", g_model, sizeof(g_model), name);
        g_caps.logit_bias = false;
        g_caps.priority = false;
        const msgpack_object *caps = sil_rpc_map_get(res, "capabilities");
        if (caps && caps->type == MSGPACK_OBJECT_ARRAY)
            for (uint32_t i = 0; i < caps->via.array.size; i++) {
                const msgpack_object *s = &caps->via.array.ptr[i];
                if (s->type == MSGPACK_OBJECT_STR && s->via.str.size == 10 &&
                    !memcmp(s->via.str.ptr, "logit_bias", 10))
                    g_caps.logit_bias = true;
                if (s->type == MSGPACK_OBJECT_STR && s->via.str.size == 8 &&
                    !memcmp(s->via.str.ptr, "priority", 8))
                    g_caps.priority = true;
            }
        g_have_info = true;
        g_info_at = sil_client_now();
        pthread_mutex_unlock(&g_info_lock);
    }
    sil_rpc_client_close(&c);
    return r;
}

static int get_info(char *model, size_t size, struct sil_oa_caps *caps, struct sil_rpc_error *err)
{
    pthread_mutex_lock(&g_info_lock);
    bool have = g_have_info, fresh = have && sil_client_now() - g_info_at < INFO_TTL_S;
    pthread_mutex_unlock(&g_info_lock);
    /* A failed refresh keeps the old facts: the request's own connection tells whether the
     * daemon is there. */
    if (!fresh && refresh_info(err) < 0 && !have) return -EHOSTDOWN;
    pthread_mutex_lock(&g_info_lock);
    snprintf(model, size, "%s", g_model);
    *caps = g_caps;
    pthread_mutex_unlock(&g_info_lock);
    return 0;
}

/* ---- responses ------------------------------------------------------------------------------ */

static enum MHD_Result send_buf(struct MHD_Connection *conn, int status, const char *type,
                                char *data, size_t len)
{
    struct MHD_Response *resp = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(data);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", type);
    if (status == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    struct sil_oa_reqlog *l = reqlog_of(conn);
    if (l) l->status = status;
    enum MHD_Result r = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return r;
}

static enum MHD_Result send_json(struct MHD_Connection *conn, int status, struct sil_oa_buf *b)
{
    size_t len;
    char *p = sil_oa_buf_take(b, &len);
    if (!p) return MHD_NO;
    return send_buf(conn, status, "application/json", p, len);
}

static enum MHD_Result send_fail(struct MHD_Connection *conn, const struct sil_oa_fail *f)
{
    struct sil_oa_buf b;
    sil_oa_buf_init(&b, 0);
    sil_oa_format_error(&b, f);
    sil_oa_buf_cstr(&b, "\n");
    if (f->status >= 500 || f->status == 429) atomic_fetch_add(&g_errors, 1);
    return send_json(conn, f->status, &b);
}

static enum MHD_Result send_failf(struct MHD_Connection *conn, int status, const char *param,
                                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static enum MHD_Result send_failf(struct MHD_Connection *conn, int status, const char *param,
                                  const char *fmt, ...)
{
    struct sil_oa_fail f;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sil_oa_failf(&f, status, param, "%s", msg);
    if (status == 401) {
        f.type = "invalid_request_error";
        f.code = "invalid_api_key";
    } else if (status == 404)
        f.code = "unknown_url";
    return send_fail(conn, &f);
}

/* ---- one generation ------------------------------------------------------------------------- */

struct gen {
    int fd;      /* daemon connection, -1 once closed */
    int peer_fd; /* the HTTP client's socket */
    uint32_t msgid;
    struct sil_rpc_unpacker *up;
    struct sil_rpc_buf out;
    struct sil_oa_req req;
    struct sil_oa_resp resp;
    char model[160];
    struct sil_oa_buf sse; /* formatted, not yet handed to MHD */
    size_t sse_off;
    bool first, done, failed;
    bool slot;                 /* holds one of max_concurrent */
    struct sil_oa_reqlog *log; /* the connection's, NULL: none; written until the stream ends */
};

static void gen_close(struct gen *g)
{
    if (g->fd >= 0) close(g->fd); /* the daemon cancels what the connection still runs */
    g->fd = -1;
}

static void gen_free(struct gen *g)
{
    if (!g) return;
    if (g->fd >= 0 && !g->done) atomic_fetch_add(&g_cancelled, 1);
    gen_close(g);
    if (g->up) sil_rpc_unpacker_free(g->up);
    sil_rpc_buf_free(&g->out);
    sil_oa_buf_free(&g->sse);
    if (g->slot) atomic_fetch_sub(&g_in_flight, 1);
    free(g);
}

/* Next message from the daemon, watching the peer meanwhile. 1: msg filled; -EPIPE: the peer
 * went away (daemon connection closed, which cancels); other negative: daemon failure. */
static int gen_next(struct gen *g, struct sil_rpc_msg *msg, struct sil_rpc_error *err)
{
    for (;;) {
        int r = sil_rpc_unpacker_next(g->up, msg, err);
        if (r == 1) return 1;
        if (r < 0 && r != -EPROTO) return r;
        if (r == -EPROTO) continue;
        if (sil_rpc_buf_size(&g->out)) {
            ssize_t w = send(g->fd, sil_rpc_buf_head(&g->out), sil_rpc_buf_size(&g->out),
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w < 0 && errno != EAGAIN && errno != EINTR)
                return sil_rpc_errorf(err, -errno, 0, "send to siliceod: %s", strerror(errno));
            if (w > 0) sil_rpc_buf_consume(&g->out, (size_t)w);
        }
        struct pollfd p[2] = {
            {.fd = g->fd, .events = POLLIN | (sil_rpc_buf_size(&g->out) ? POLLOUT : 0)},
            {.fd = g->peer_fd, .events = POLLRDHUP},
        };
        int n = poll(p, g->peer_fd >= 0 ? 2 : 1, -1);
        if (n < 0 && errno != EINTR)
            return sil_rpc_errorf(err, -errno, 0, "poll: %s", strerror(errno));
        if (n <= 0) continue;
        if (g->peer_fd >= 0 && (p[1].revents & (POLLRDHUP | POLLHUP | POLLERR))) {
            if (g->log) g->log->client_gone = true;
            gen_close(g);
            atomic_fetch_add(&g_cancelled, 1);
            g->done = true;
            return -EPIPE;
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            size_t avail;
            void *space = sil_rpc_unpacker_space(g->up, 64 * 1024, &avail);
            if (!space) return sil_rpc_errorf(err, -ENOBUFS, 0, "siliceod reply too large");
            ssize_t rd = recv(g->fd, space, avail, MSG_DONTWAIT);
            if (rd == 0)
                return sil_rpc_errorf(err, -ECONNRESET, 0, "siliceod closed the connection");
            if (rd < 0 && errno != EAGAIN && errno != EINTR)
                return sil_rpc_errorf(err, -errno, 0, "recv from siliceod: %s", strerror(errno));
            if (rd > 0) sil_rpc_unpacker_commit(g->up, (size_t)rd);
        }
    }
}

static bool is_token(const struct sil_rpc_msg *m)
{
    return m->type == SIL_RPC_NOTIFICATION && strcmp(m->method, "token") == 0 && m->params;
}

/* Formats one token notification into g->sse (stream mode). */
static void gen_token(struct gen *g, const struct sil_rpc_msg *m)
{
    const msgpack_object *t = sil_rpc_map_get(m->params, "text");
    const msgpack_object *rs = sil_rpc_map_get(m->params, "reasoning");
    const char *text = "", *reasoning = "";
    size_t tn = 0, rn = 0;
    if (t && t->type == MSGPACK_OBJECT_STR) {
        text = t->via.str.ptr;
        tn = t->via.str.size;
    }
    if (rs && rs->type == MSGPACK_OBJECT_STR) {
        reasoning = rs->via.str.ptr;
        rn = rs->via.str.size;
    }
    if (!tn && !rn && !g->first) return;
    sil_oa_format_chunk(&g->sse, &g->resp, g->first, text, tn, reasoning, rn, NULL,
                        g->req.include_usage);
    g->first = false;
}

/* The final response in stream mode: finish chunk, usage, [DONE]. */
static void gen_final(struct gen *g, const struct sil_rpc_msg *m)
{
    struct sil_rpc_error e;
    if (m->error) {
        sil_rpc_read_error(m->error, &e);
        if (g->log) snprintf(g->log->stop, sizeof(g->log->stop), "%s", sil_rpc_code_name(e.code));
        struct sil_oa_fail f;
        sil_oa_fail_from_rpc(&f, e.code, e.msg);
        sil_oa_buf_cstr(&g->sse, "data: ");
        sil_oa_format_error(&g->sse, &f);
        sil_oa_buf_cstr(&g->sse, "\n\n");
    } else {
        if (g->log) sil_oa_reqlog_counts(g->log, m->result);
        const msgpack_object *sr = sil_rpc_map_get(m->result, "stop_reason");
        const char *finish = sr && sr->type == MSGPACK_OBJECT_STR
                                 ? sil_oa_finish_reason(sr->via.str.ptr, sr->via.str.size)
                                 : NULL;
        if (!finish) {
            struct sil_oa_fail f;
            char err[256], why[32];
            sil_rpc_map_str(m->result, "error", err, sizeof(err), "");
            sil_rpc_map_str(m->result, "stop_reason", why, sizeof(why), "");
            sil_oa_failf(&f, 500, NULL, "generation ended: %s%s%s", why, err[0] ? ": " : "", err);
            sil_oa_buf_cstr(&g->sse, "data: ");
            sil_oa_format_error(&g->sse, &f);
            sil_oa_buf_cstr(&g->sse, "\n\n");
        } else {
            sil_oa_format_chunk(&g->sse, &g->resp, g->first, "", 0, "", 0, finish,
                                g->req.include_usage);
            if (g->req.include_usage) sil_oa_format_usage_chunk(&g->sse, &g->resp, m->result);
        }
    }
    sil_oa_buf_cstr(&g->sse, "data: [DONE]\n\n");
    g->done = true;
    gen_close(g);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct gen *g = cls;
    while (g->sse_off >= g->sse.len) {
        if (g->done) return MHD_CONTENT_READER_END_OF_STREAM;
        sil_oa_buf_reset(&g->sse);
        g->sse_off = 0;
        struct sil_rpc_msg m;
        struct sil_rpc_error err = {0};
        int r = gen_next(g, &m, &err);
        if (r == -EPIPE) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (r < 0) {
            if (g->log) snprintf(g->log->stop, sizeof(g->log->stop), "daemon lost");
            struct sil_oa_fail f;
            sil_oa_failf(&f, 502, NULL, "siliceod: %s", err.msg);
            sil_oa_buf_cstr(&g->sse, "data: ");
            sil_oa_format_error(&g->sse, &f);
            sil_oa_buf_cstr(&g->sse, "\n\ndata: [DONE]\n\n");
            g->done = true;
            gen_close(g);
            break;
        }
        /* Take every message already buffered, so one write carries them all. */
        do {
            if (is_token(&m))
                gen_token(g, &m);
            else if (m.type == SIL_RPC_RESPONSE && m.msgid == g->msgid)
                gen_final(g, &m);
            sil_rpc_msg_release(&m);
        } while (!g->done && sil_rpc_unpacker_next(g->up, &m, &err) == 1);
        if (g->sse.failed) {
            g->done = true;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
    size_t n = g->sse.len - g->sse_off;
    if (n > max) n = max;
    memcpy(buf, g->sse.data + g->sse_off, n);
    g->sse_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    gen_free(cls);
}

/* {count, text?, stream?} -> debug.stream: the daemon streams without the model, so the bridge's
 * own cost per token can be measured. */
static int debug_request(const char *body, size_t len, uint32_t msgid, struct sil_rpc_buf *out,
                         struct sil_oa_req *req, struct sil_oa_fail *f)
{
    struct sil_oa_json_doc *doc;
    struct sil_oa_json_err je;
    if (sil_oa_json_parse(&doc, body, len, &je) < 0)
        return sil_oa_failf(f, 400, NULL, "invalid JSON at byte %zu: %s", je.offset, je.msg);
    const struct sil_oa_json *o = sil_oa_json_root(doc);
    const struct sil_oa_json *count = sil_oa_json_get(o, "count");
    const struct sil_oa_json *text = sil_oa_json_get(o, "text");
    const struct sil_oa_json *stream = sil_oa_json_get(o, "stream");
    int r = 0;
    if (!count || count->type != SIL_OA_JSON_NUMBER || !count->is_int ||
        (text && text->type != SIL_OA_JSON_STRING))
        r = sil_oa_failf(f, 400, "count", "want {count: integer, text: string}");
    if (r == 0) {
        msgpack_packer *pk = sil_rpc_begin_request(out, msgid, "debug.stream");
        msgpack_pack_map(pk, text ? 2 : 1);
        sil_rpc_kv_int(pk, "count", count->i);
        if (text) sil_rpc_kv_strn(pk, "text", text->str, text->len);
        sil_rpc_end(out);
        req->kind = SIL_OA_CHAT;
        req->stream = !stream || stream->type == SIL_OA_JSON_TRUE;
        req->include_usage = false;
    }
    sil_oa_json_free(doc);
    return r;
}

static enum MHD_Result handle_generate(struct MHD_Connection *conn, enum sil_oa_kind kind,
                                       bool debug, const char *body, size_t len)
{
    atomic_fetch_add(&g_requests, 1);
    struct gen *g = calloc(1, sizeof(*g));
    if (!g) return MHD_NO;
    g->fd = -1;
    g->first = true;
    sil_rpc_buf_init(&g->out, 0);
    sil_oa_buf_init(&g->sse, 0);
    if (atomic_fetch_add(&g_in_flight, 1) >= g_opt.max_concurrent) {
        atomic_fetch_sub(&g_in_flight, 1);
        atomic_fetch_add(&g_rejected, 1);
        gen_free(g);
        struct sil_oa_fail f;
        sil_oa_failf(&f, 429, NULL, "too many requests in flight (limit %d)", g_opt.max_concurrent);
        f.type = "rate_limit_error";
        f.code = "rate_limit_exceeded";
        return send_fail(conn, &f);
    }
    g->slot = true;
    struct sil_rpc_error err = {0};
    struct sil_oa_caps caps;
    if (get_info(g->model, sizeof(g->model), &caps, &err) < 0) {
        gen_free(g);
        return send_failf(conn, 503, NULL, "siliceod is not available: %s", err.msg);
    }
    struct sil_oa_fail f;
    g->msgid = 1;
    if (debug ? debug_request(body, len, g->msgid, &g->out, &g->req, &f) < 0
              : sil_oa_request(kind, body, len, &caps, g->msgid, &g->out, &g->req, &f) < 0) {
        gen_free(g);
        return send_fail(conn, &f);
    }
    char path[4096];
    sil_rpc_socket_path(g_opt.socket, path, sizeof(path));
    g->fd = sil_rpc_connect(path, &err);
    g->up = sil_rpc_unpacker_new(0, 0);
    if (g->fd < 0 || !g->up) {
        gen_free(g);
        return send_failf(conn, 503, NULL, "siliceod is not available: %s", err.msg);
    }
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    g->peer_fd = ci ? ci->connect_fd : -1;
    g->resp.kind = kind;
    if (g->req.model[0]) /* the daemon serves the model asked for, or refuses */
        snprintf(g->model, sizeof(g->model), "%s", g->req.model);
    g->resp.model = g->model;
    g->resp.created = (long long)time(NULL);
    snprintf(g->resp.id, sizeof(g->resp.id), "%s-%016llx%08llx",
             kind == SIL_OA_CHAT ? "chatcmpl" : "cmpl", g_id_salt,
             (unsigned long long)atomic_fetch_add(&g_counter, 1));
    g->log = reqlog_of(conn);
    if (g->log) {
        snprintf(g->log->id, sizeof(g->log->id), "%s", g->resp.id);
        snprintf(g->log->model, sizeof(g->log->model), "%s", g->model);
        g->log->stream = g->req.stream;
    }

    /* Wait for the first message, so a request the daemon refuses gets a proper status even when
     * streamed. */
    struct sil_rpc_msg m;
    for (;;) {
        int r = gen_next(g, &m, &err);
        if (r == -EPIPE) {
            gen_free(g);
            return MHD_NO;
        }
        if (r < 0) {
            gen_free(g);
            return send_failf(conn, 502, NULL, "siliceod: %s", err.msg);
        }
        if (m.type == SIL_RPC_RESPONSE && m.msgid == g->msgid && m.error) {
            struct sil_rpc_error e;
            sil_rpc_read_error(m.error, &e);
            if (g->log)
                snprintf(g->log->stop, sizeof(g->log->stop), "%s", sil_rpc_code_name(e.code));
            sil_rpc_msg_release(&m);
            gen_free(g);
            sil_oa_fail_from_rpc(&f, e.code, e.msg);
            return send_fail(conn, &f);
        }
        if (g->req.stream || (m.type == SIL_RPC_RESPONSE && m.msgid == g->msgid)) break;
        sil_rpc_msg_release(&m); /* non-streamed: the result carries the whole text */
    }
    if (!g->req.stream) {
        struct sil_oa_buf b;
        sil_oa_buf_init(&b, 0);
        g->done = true;
        if (g->log) sil_oa_reqlog_counts(g->log, m.result);
        int r = sil_oa_format_result(&b, &g->resp, m.result, &f);
        sil_rpc_msg_release(&m);
        gen_free(g);
        if (r < 0) {
            sil_oa_buf_free(&b);
            return send_fail(conn, &f);
        }
        sil_oa_buf_cstr(&b, "\n");
        return send_json(conn, 200, &b);
    }
    if (is_token(&m))
        gen_token(g, &m);
    else
        gen_final(g, &m);
    sil_rpc_msg_release(&m);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024,
                                                                  stream_reader, g, stream_free);
    if (!resp) {
        gen_free(g);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    if (g->log) g->log->status = MHD_HTTP_OK;
    enum MHD_Result r = MHD_queue_response(conn, MHD_HTTP_OK, resp);
    MHD_destroy_response(resp);
    return r;
}

/* ---- other endpoints ------------------------------------------------------------------------ */

static enum MHD_Result handle_health(struct MHD_Connection *conn)
{
    struct sil_rpc_client c;
    struct sil_rpc_error err = {0};
    const char *state = "unavailable";
    int status = 503;
    if (open_client(&c, g_opt.health_timeout_ms, &err) == 0) {
        const msgpack_object *res;
        int r = sil_rpc_client_call0(&c, "status", NULL, NULL, &res, &err);
        if (r == -ETIMEDOUT)
            state = "loading"; /* the daemon answers only once its model is loaded */
        else if (r == 0) {
            char st[32];
            sil_rpc_map_str(res, "state", st, sizeof(st), "");
            if (strcmp(st, "ready") == 0) {
                state = "ok";
                status = 200;
            } else
                state = strcmp(st, "stopping") == 0 ? "stopping" : "unavailable";
        }
        sil_rpc_client_close(&c);
    }
    struct sil_oa_buf b;
    sil_oa_buf_init(&b, 0);
    sil_oa_buf_printf(&b, "{\"status\":\"%s\"", state);
    if (status != 200 && err.msg[0]) {
        sil_oa_buf_cstr(&b, ",\"error\":");
        sil_oa_buf_jstr(&b, err.msg, strlen(err.msg));
    }
    sil_oa_buf_cstr(&b, "}\n");
    return send_json(conn, status, &b);
}

/* /v1/models: every model the daemon can load, by the names requests give (siliceo-rpc(7)
 * models); /v1/models/ID: one of them. */
static enum MHD_Result handle_models(struct MHD_Connection *conn, const char *one)
{
    struct sil_rpc_client c;
    struct sil_rpc_error err = {0};
    if (open_client(&c, g_opt.health_timeout_ms, &err) < 0)
        return send_failf(conn, 503, NULL, "siliceod is not available: %s", err.msg);
    msgpack_packer *pk = sil_rpc_client_begin(&c, "models");
    msgpack_pack_map(pk, 0);
    const msgpack_object *res = NULL, *arr = NULL;
    if (sil_rpc_client_call(&c, NULL, NULL, &res, &err) < 0 ||
        sil_rpc_get_array(res, "models", &arr, SIL_RPC_REQUIRED, &err) < 0) {
        sil_rpc_client_close(&c);
        return send_failf(conn, 502, NULL, "siliceod: models: %s", err.msg);
    }
    struct sil_oa_buf b;
    sil_oa_buf_init(&b, 0);
    if (!one) sil_oa_buf_cstr(&b, "{\"object\":\"list\",\"data\":[");
    int n = 0;
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        char name[160];
        sil_rpc_map_str(&arr->via.array.ptr[i], "name", name, sizeof name, "");
        if (!name[0] || (one && strcmp(one, name) != 0)) continue;
        if (n++) sil_oa_buf_cstr(&b, ",");
        sil_oa_buf_cstr(&b, "{\"id\":");
        sil_oa_buf_jstr(&b, name, strlen(name));
        sil_oa_buf_printf(&b, ",\"object\":\"model\",\"created\":%lld,\"owned_by\":\"siliceo\"}",
                          (long long)time(NULL));
    }
    sil_rpc_client_close(&c);
    if (one && !n) {
        sil_oa_buf_free(&b);
        struct sil_oa_fail f;
        sil_oa_failf(&f, 404, "model", "the model '%.100s' does not exist", one);
        f.code = "model_not_found";
        return send_fail(conn, &f);
    }
    sil_oa_buf_cstr(&b, one ? "\n" : "]}\n");
    return send_json(conn, 200, &b);
}

static enum MHD_Result handle_metrics(struct MHD_Connection *conn)
{
    struct sil_rpc_client c;
    struct sil_rpc_error err = {0};
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return MHD_NO;
    int ok = 0;
    if (open_client(&c, g_opt.health_timeout_ms, &err) == 0) {
        const msgpack_object *res;
        if (sil_rpc_client_call0(&c, "metrics", NULL, NULL, &res, &err) == 0) {
            sil_probe_prom(f, res, SIL_PROM_TEXT);
            ok = 1;
        }
        sil_rpc_client_close(&c);
    }
    fprintf(f,
            "# HELP siliceo_openai_up 1 when the bridge reached siliceod for this scrape\n"
            "# TYPE siliceo_openai_up gauge\n"
            "siliceo_openai_up %d\n"
            "# HELP siliceo_openai_requests_total HTTP requests the bridge answered\n"
            "# TYPE siliceo_openai_requests_total counter\n"
            "siliceo_openai_requests_total %llu\n"
            "# HELP siliceo_openai_errors_total HTTP requests answered with an error\n"
            "# TYPE siliceo_openai_errors_total counter\n"
            "siliceo_openai_errors_total %llu\n"
            "# HELP siliceo_openai_cancelled_total requests whose HTTP client went away\n"
            "# TYPE siliceo_openai_cancelled_total counter\n"
            "siliceo_openai_cancelled_total %llu\n"
            "# HELP siliceo_openai_rejected_total requests refused over the concurrency limit\n"
            "# TYPE siliceo_openai_rejected_total counter\n"
            "siliceo_openai_rejected_total %llu\n"
            "# HELP siliceo_openai_in_flight requests the bridge is serving now\n"
            "# TYPE siliceo_openai_in_flight gauge\n"
            "siliceo_openai_in_flight %d\n",
            ok, (unsigned long long)g_requests, (unsigned long long)g_errors,
            (unsigned long long)g_cancelled, (unsigned long long)g_rejected,
            atomic_load(&g_in_flight));
    fclose(f);
    if (!ok) {
        free(text);
        return send_failf(conn, 503, NULL, "siliceod is not available: %s", err.msg);
    }
    return send_buf(conn, 200, "text/plain; version=0.0.4", text, len);
}

/* The chat page (client/sil-openai/chat.html, chat.css, chat.js): revalidated on each load
 * (no-cache), a 304 when the browser holds this build's copy. It holds no secret, so it is served
 * without the token; the requests it makes carry the key its user types. */
static enum MHD_Result handle_page(struct MHD_Connection *conn, const char *url)
{
    struct sil_oa_page_file f;
    if (sil_oa_page_file(url, &f) < 0)
        return send_failf(conn, 404, NULL, "unknown URL %.200s", url);
    char etag[24];
    sil_oa_page_etag(&f, etag, sizeof(etag));
    const char *inm = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "If-None-Match");
    bool fresh = inm && (strstr(inm, etag) || strcmp(inm, "*") == 0);
    struct MHD_Response *resp = MHD_create_response_from_buffer(
        fresh ? 0 : f.len, fresh ? NULL : (void *)f.data, MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, "Content-Type", f.type);
    MHD_add_response_header(resp, "Content-Security-Policy", SIL_OA_PAGE_CSP);
    MHD_add_response_header(resp, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(resp, "Referrer-Policy", "no-referrer");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "ETag", etag);
    int status = fresh ? MHD_HTTP_NOT_MODIFIED : MHD_HTTP_OK;
    struct sil_oa_reqlog *l = reqlog_of(conn);
    if (l) l->status = status;
    enum MHD_Result r = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return r;
}

/* ---- routing -------------------------------------------------------------------------------- */

struct upload {
    char *data;
    size_t len, cap;
    bool too_large;
    size_t dropped; /* bytes of a body over the limit read and dropped */
};

/* A body over --max-body is read and dropped up to this many bytes before the 413 goes out, so
 * a client that sends all of it before reading (no Expect: 100-continue) reads the answer instead
 * of a broken pipe; past it the answer goes out at once and the connection closes. */
#define DRAIN_MAX ((size_t)64 << 20)

static bool token_ok(struct MHD_Connection *conn)
{
    if (!g_opt.token[0]) return true;
    const char *h = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    h += 7;
    size_t n = strlen(h), m = strlen(g_opt.token);
    unsigned char diff = n != m;
    for (size_t i = 0; i < m; i++) /* the same time for every wrong token of this length */
        diff |= (unsigned char)(g_opt.token[i] ^ (i < n ? h[i] : 0));
    return diff == 0;
}

static void request_done(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct upload *u = *con_cls;
    if (u) {
        free(u->data);
        free(u);
        *con_cls = NULL;
    }
    struct sil_oa_reqlog *l = reqlog_of(conn);
    if (!l || !l->t_start) return;
    if (toe == MHD_REQUEST_TERMINATED_TIMEOUT_REACHED)
        l->ended_early = "timed out";
    else if (toe == MHD_REQUEST_TERMINATED_DAEMON_SHUTDOWN)
        l->ended_early = "bridge stopping";
    else if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        l->ended_early = "connection closed";
    log_request(l);
    l->t_start = 0;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *conn, const char *url,
                               const char *method, const char *version, const char *upload_data,
                               size_t *upload_size, void **con_cls)
{
    bool post = strcmp(method, "POST") == 0;
    bool get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    enum sil_oa_kind kind = SIL_OA_CHAT;
    int route; /* 0 unknown, 1 generation, 2 health, 3 models, 4 one model, 5 metrics, 6 debug
                * stream, 7 the chat page */
    if (strcmp(url, "/v1/chat/completions") == 0 || strcmp(url, "/chat/completions") == 0)
        route = 1;
    else if (strcmp(url, "/v1/completions") == 0 || strcmp(url, "/completions") == 0) {
        route = 1;
        kind = SIL_OA_COMPLETION;
    } else if (strcmp(url, "/health") == 0)
        route = 2;
    else if (strcmp(url, "/v1/models") == 0 || strcmp(url, "/models") == 0)
        route = 3;
    else if (strncmp(url, "/v1/models/", 11) == 0 && url[11])
        route = 4;
    else if (strcmp(url, "/metrics") == 0)
        route = 5;
    else if (g_opt.debug_stream && strcmp(url, "/v1/debug/stream") == 0)
        route = 6;
    else if (!g_opt.no_ui && sil_oa_page_file(url, NULL) == 0)
        route = 7;
    else
        route = 0;

    struct upload *u = *con_cls;
    if (!u) {
        u = calloc(1, sizeof(*u));
        if (!u) return MHD_NO;
        *con_cls = u;
        struct sil_oa_reqlog *l = reqlog_of(conn);
        if (l) sil_oa_reqlog_start(l, method, url, sil_client_now());
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > g_opt.max_body) u->too_large = true;
        /* Refused before the body is read: the connection is closed after the answer. */
        if (route == 0) return send_failf(conn, 404, NULL, "unknown URL %s %.200s", method, url);
        if (route != 2 && route != 7 && !token_ok(conn))
            return send_failf(conn, 401, NULL, "missing or wrong bearer token");
        if (((route == 1 || route == 6) && !post) || (route != 1 && route != 6 && !get))
            return send_failf(conn, 405, NULL, "method %s not allowed on %.200s", method, url);
        if (u->too_large) {
            /* a client waiting for 100 Continue sends nothing more: refused now; another one
             * is sending its body: it is dropped, then refused (up to DRAIN_MAX) */
            const char *ex = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Expect");
            if ((ex && strcasecmp(ex, "100-continue") == 0) || strtoull(cl, NULL, 10) > DRAIN_MAX)
                return send_failf(conn, 413, NULL, "request body over %zu bytes", g_opt.max_body);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (u->too_large) {
            u->dropped += *upload_size;
            if (u->dropped > DRAIN_MAX)
                return send_failf(conn, 413, NULL, "request body over %zu bytes", g_opt.max_body);
        } else {
            if (*upload_size > g_opt.max_body - u->len) {
                u->too_large = true; /* the rest is read and dropped */
                free(u->data);
                u->data = NULL;
                u->len = u->cap = 0;
            } else {
                if (u->len + *upload_size > u->cap) {
                    size_t cap = u->cap ? u->cap : 4096;
                    while (cap < u->len + *upload_size)
                        cap *= 2;
                    char *p = realloc(u->data, cap);
                    if (!p) return MHD_NO;
                    u->data = p;
                    u->cap = cap;
                }
                memcpy(u->data + u->len, upload_data, *upload_size);
                u->len += *upload_size;
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (u->too_large)
        return send_failf(conn, 413, NULL, "request body over %zu bytes", g_opt.max_body);
    switch (route) {
    case 1:
        return handle_generate(conn, kind, false, u->data ? u->data : "", u->len);
    case 6:
        return handle_generate(conn, kind, true, u->data ? u->data : "", u->len);
    case 2:
        return handle_health(conn);
    case 3:
        return handle_models(conn, NULL);
    case 4:
        return handle_models(conn, url + 11);
    case 7:
        return handle_page(conn, url);
    default:
        return handle_metrics(conn);
    }
}

/* ---- start-up ------------------------------------------------------------------------------- */

static int read_token(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f) {
        sil_client_warn(PROG, "--token-file %s: %s", path, strerror(errno));
        return -errno;
    }
    size_t n = fread(g_opt.token, 1, sizeof(g_opt.token) - 1, f);
    bool more = fgetc(f) != EOF;
    fclose(f);
    g_opt.token[n] = 0;
    while (n && (g_opt.token[n - 1] == '\n' || g_opt.token[n - 1] == '\r'))
        g_opt.token[--n] = 0;
    if (more || n == 0 || strlen(g_opt.token) != n) {
        sil_client_warn(PROG, "--token-file %s: want one line of 1 to %zu bytes", path,
                        sizeof(g_opt.token) - 2);
        return -EINVAL;
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [OPTIONS]\n"
               "Serve siliceod's model over an OpenAI-compatible HTTP API.\n"
               "\n"
               "  -s, --socket PATH          siliceod socket (default: $SILICEO_SOCKET, then\n"
               "                             the standard path)\n"
               "  -l, --listen HOST:PORT     address to listen on (default 127.0.0.1:8080)\n"
               "  -p, --port PORT            port on 127.0.0.1\n"
               "  -u, --unix PATH            listen on a Unix socket instead\n"
               "      --token-file PATH      require 'Authorization: Bearer <token>' (also\n"
               "                             $SILICEO_OPENAI_TOKEN)\n"
               "      --max-body BYTES       largest request body (default 1048576)\n"
               "      --max-concurrent N     generation requests in flight (default 16)\n"
               "      --max-connections N    HTTP connections (default 64)\n"
               "      --timeout SEC          idle HTTP connection timeout (default 60)\n"
               "      --health-timeout MS    how long /health waits for the daemon (default\n"
               "                             2000)\n"
               "      --log-level LEVEL      err, warning, notice, info (default: a line a\n"
               "                             request) or debug (also /health and /metrics)\n"
               "      --no-ui                serve no chat page at /\n"
               "      --debug-stream         serve POST /v1/debug/stream (benchmarks)\n"
               "  -h, --help                 this help\n"
               "  -V, --version              version\n");
}

int main(int argc, char **argv)
{
    g_opt.host = "127.0.0.1";
    g_opt.port = 8080;
    g_opt.max_body = 1 << 20;
    g_opt.max_concurrent = 16;
    g_opt.max_connections = 64;
    g_opt.timeout_s = 60;
    g_opt.health_timeout_ms = 2000;
    g_opt.log_level = LOG_INFO;
    const char *token_file = NULL;
    static char hostbuf[256];
    enum { O_TOKEN = 256, O_BODY, O_CONC, O_CONN, O_TIMEOUT, O_HEALTH, O_DEBUG, O_LOG, O_NO_UI };
    static const struct option lo[] = {{"socket", required_argument, 0, 's'},
                                       {"listen", required_argument, 0, 'l'},
                                       {"port", required_argument, 0, 'p'},
                                       {"unix", required_argument, 0, 'u'},
                                       {"token-file", required_argument, 0, O_TOKEN},
                                       {"max-body", required_argument, 0, O_BODY},
                                       {"max-concurrent", required_argument, 0, O_CONC},
                                       {"max-connections", required_argument, 0, O_CONN},
                                       {"timeout", required_argument, 0, O_TIMEOUT},
                                       {"health-timeout", required_argument, 0, O_HEALTH},
                                       {"debug-stream", no_argument, 0, O_DEBUG},
                                       {"log-level", required_argument, 0, O_LOG},
                                       {"no-ui", no_argument, 0, O_NO_UI},
                                       {"help", no_argument, 0, 'h'},
                                       {"version", no_argument, 0, 'V'},
                                       {0, 0, 0, 0}};
    int c;
    long v;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":s:l:p:u:hV", lo, NULL)) != -1) {
        switch (c) {
        case 's':
            g_opt.socket = optarg;
            break;
        case 'u':
            g_opt.unix_path = optarg;
            break;
        case 'l': {
            const char *colon = strrchr(optarg, ':');
            if (!colon || colon == optarg || (size_t)(colon - optarg) >= sizeof(hostbuf)) {
                sil_client_warn(PROG, "--listen: want HOST:PORT, got '%s'", optarg);
                return SIL_EXIT_USAGE;
            }
            memcpy(hostbuf, optarg, (size_t)(colon - optarg));
            hostbuf[colon - optarg] = 0;
            g_opt.host = hostbuf;
            if (sil_client_parse_long(PROG, "--listen", colon + 1, 0, 65535, &v) < 0)
                return SIL_EXIT_USAGE;
            g_opt.port = (int)v;
            break;
        }
        case 'p':
            if (sil_client_parse_long(PROG, "--port", optarg, 0, 65535, &v) < 0)
                return SIL_EXIT_USAGE;
            g_opt.port = (int)v;
            break;
        case O_TOKEN:
            token_file = optarg;
            break;
        case O_BODY:
            if (sil_client_parse_long(PROG, "--max-body", optarg, 1, 1L << 30, &v) < 0)
                return SIL_EXIT_USAGE;
            g_opt.max_body = (size_t)v;
            break;
        case O_CONC:
            if (sil_client_parse_long(PROG, "--max-concurrent", optarg, 1, 4096, &v) < 0)
                return SIL_EXIT_USAGE;
            g_opt.max_concurrent = (int)v;
            break;
        case O_CONN:
            if (sil_client_parse_long(PROG, "--max-connections", optarg, 1, 65536, &v) < 0)
                return SIL_EXIT_USAGE;
            g_opt.max_connections = (int)v;
            break;
        case O_TIMEOUT:
            if (sil_client_parse_long(PROG, "--timeout", optarg, 1, 86400, &v) < 0)
                return SIL_EXIT_USAGE;
            g_opt.timeout_s = (int)v;
            break;
        case O_HEALTH:
            if (sil_client_parse_long(PROG, "--health-timeout", optarg, 1, 600000, &v) < 0)
                return SIL_EXIT_USAGE;
            g_opt.health_timeout_ms = (int)v;
            break;
        case O_DEBUG:
            g_opt.debug_stream = true;
            break;
        case O_NO_UI:
            g_opt.no_ui = true;
            break;
        case O_LOG:
            g_opt.log_level = parse_level(optarg);
            if (g_opt.log_level < 0) {
                sil_client_usage_error(PROG,
                                       "--log-level: err, warning, notice, info or debug, "
                                       "not '%s'",
                                       optarg);
                return SIL_EXIT_USAGE;
            }
            break;
        case 'h':
            usage(stdout);
            return SIL_EXIT_OK;
        case 'V':
            sil_client_version(PROG);
            return SIL_EXIT_OK;
        default:
            sil_client_bad_option(PROG, c, argc, argv, lo);
            return SIL_EXIT_USAGE;
        }
    }
    if (optind < argc) {
        sil_client_usage_error(PROG, "unexpected argument '%s'", argv[optind]);
        return SIL_EXIT_USAGE;
    }
    if (token_file) {
        if (read_token(token_file) < 0) return SIL_EXIT_USAGE;
    } else if (getenv("SILICEO_OPENAI_TOKEN") && getenv("SILICEO_OPENAI_TOKEN")[0]) {
        snprintf(g_opt.token, sizeof(g_opt.token), "%s", getenv("SILICEO_OPENAI_TOKEN"));
    }
    unsigned long long salt = 0;
    if (getrandom(&salt, sizeof(salt), 0) != sizeof(salt))
        salt = (unsigned long long)time(NULL) ^ (unsigned long long)getpid() << 32;
    g_id_salt = salt;

    int lfd = -1;
    struct sil_rpc_error err = {0};
    int n = sd_listen_fds(1);
    if (n > 1) {
        sil_client_warn(PROG, "socket activation: %d sockets passed, expected 1", n);
        return SIL_EXIT_ERROR;
    }
    if (n == 1) {
        lfd = SD_LISTEN_FDS_START;
    } else if (g_opt.unix_path) {
        lfd = sil_rpc_listen(g_opt.unix_path, 0660, 128, &err);
        if (lfd < 0) {
            sil_client_warn(PROG, "%s", err.msg);
            return SIL_EXIT_ERROR;
        }
    } else {
        struct sockaddr_in6 a6 = {.sin6_family = AF_INET6, .sin6_port = htons(g_opt.port)};
        struct sockaddr_in a4 = {.sin_family = AF_INET, .sin_port = htons(g_opt.port)};
        bool v6 = inet_pton(AF_INET6, g_opt.host, &a6.sin6_addr) == 1;
        if (!v6 && inet_pton(AF_INET, g_opt.host, &a4.sin_addr) != 1) {
            sil_client_warn(PROG, "--listen: '%s' is not a numeric IPv4 or IPv6 address",
                            g_opt.host);
            return SIL_EXIT_USAGE;
        }
        lfd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        if (lfd >= 0) setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (lfd < 0 ||
            bind(lfd, v6 ? (struct sockaddr *)&a6 : (struct sockaddr *)&a4,
                 v6 ? sizeof(a6) : sizeof(a4)) < 0 ||
            listen(lfd, 128) < 0) {
            sil_client_warn(PROG, "cannot listen on %s:%d: %s", g_opt.host, g_opt.port,
                            strerror(errno));
            return SIL_EXIT_ERROR;
        }
    }
    g_journal = stderr_is_journal();
    signal(SIGPIPE, SIG_IGN);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
            MHD_USE_ERROR_LOG,
        0, NULL, NULL, handler, NULL, MHD_OPTION_LISTEN_SOCKET, lfd, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)g_opt.max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)g_opt.timeout_s,
        MHD_OPTION_NOTIFY_COMPLETED, request_done, NULL, MHD_OPTION_NOTIFY_CONNECTION,
        connection_notify, NULL, MHD_OPTION_END);
    if (!d) {
        sil_client_warn(PROG, "cannot start the HTTP server");
        return SIL_EXIT_ERROR;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (g_opt.unix_path && n == 0)
        fprintf(stderr, PROG ": listening on %s\n", g_opt.unix_path);
    else if (n == 0 && g_opt.no_ui)
        fprintf(stderr, PROG ": listening on %s:%d\n", g_opt.host, g_opt.port);
    else if (n == 0) {
        bool v6 = strchr(g_opt.host, ':') != NULL;
        fprintf(stderr, PROG ": listening on %s:%d, chat page at http://%s%s%s:%d/\n", g_opt.host,
                g_opt.port, v6 ? "[" : "", g_opt.host, v6 ? "]" : "", g_opt.port);
    }
    sd_notify(0, "READY=1");
    while (!g_stop)
        pause();
    sd_notify(0, "STOPPING=1");
    MHD_stop_daemon(d);
    if (g_opt.unix_path && n == 0) unlink(g_opt.unix_path);
    return SIL_EXIT_OK;
}
