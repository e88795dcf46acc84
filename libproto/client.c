/* Blocking request -> response client, with notifications passed to a callback. */
#include "siliceo-proto.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define READ_CHUNK 65536

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int sil_rpc_client_init_fd(struct sil_rpc_client *c, int fd, struct sil_rpc_error *err)
{
    memset(c, 0, sizeof(*c));
    c->fd = fd;
    c->next_id = 1;
    c->up = sil_rpc_unpacker_new(0, 0);
    if (!c->up) {
        close(fd);
        c->fd = -1;
        return sil_rpc_errorf(err, -ENOMEM, 0, "out of memory");
    }
    sil_rpc_buf_init(&c->out, 0);
    c->retry_max_ms = 60000;
    return 0;
}

int sil_rpc_client_open(struct sil_rpc_client *c, const char *path, struct sil_rpc_error *err)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    int fd = path ? sil_rpc_connect(path, err) : sil_rpc_connect_any(NULL, err);
    if (fd < 0)
        return fd;
    return sil_rpc_client_init_fd(c, fd, err);
}

void sil_rpc_client_close(struct sil_rpc_client *c)
{
    if (c->have_resp)
        sil_rpc_msg_release(&c->resp);
    c->have_resp = false;
    sil_rpc_unpacker_free(c->up);
    c->up = NULL;
    sil_rpc_buf_free(&c->out);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

msgpack_packer *sil_rpc_client_begin(struct sil_rpc_client *c, const char *method)
{
    sil_rpc_buf_reset(&c->out);
    c->pending_id = c->next_id++;
    if (c->next_id == 0)
        c->next_id = 1;
    return sil_rpc_begin_request(&c->out, c->pending_id, method);
}

static int remaining(const struct sil_rpc_client *c, int64_t deadline)
{
    if (c->timeout_ms <= 0)
        return -1;
    int64_t left = deadline - now_ms();
    return left < 0 ? 0 : (int)left;
}

static int send_all(struct sil_rpc_client *c, int64_t deadline, struct sil_rpc_error *err)
{
    while (sil_rpc_buf_size(&c->out) > 0) {
        ssize_t w = send(c->fd, sil_rpc_buf_head(&c->out), sil_rpc_buf_size(&c->out),
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            sil_rpc_buf_consume(&c->out, (size_t)w);
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return sil_rpc_errorf(err, errno == EPIPE ? -ECONNRESET : -errno, 0,
                                  "send: %s", strerror(errno));
        struct pollfd p = {.fd = c->fd, .events = POLLOUT};
        int t = remaining(c, deadline);
        if (t == 0)
            return sil_rpc_errorf(err, -ETIMEDOUT, 0, "timed out sending the request");
        if (poll(&p, 1, t) < 0 && errno != EINTR)
            return sil_rpc_errorf(err, -errno, 0, "poll: %s", strerror(errno));
    }
    return 0;
}

int sil_rpc_client_cancel(struct sil_rpc_client *c, struct sil_rpc_error *err)
{
    /* The call's own request has been sent in full, so the buffer is free for this one. */
    c->cancel_id = c->next_id++;
    if (c->next_id == 0)
        c->next_id = 1;
    msgpack_packer *pk = sil_rpc_begin_request(&c->out, c->cancel_id, "cancel");
    msgpack_pack_map(pk, 1);
    sil_rpc_kv_uint(pk, "id", c->pending_id);
    if (sil_rpc_end(&c->out) < 0)
        return sil_rpc_errorf(err, -ENOMEM, 0, "out of memory");
    c->cancel_sent = true;
    int64_t deadline = now_ms() + (c->timeout_ms > 0 ? c->timeout_ms : 0);
    return send_all(c, deadline, err);
}

/* A response with a nil msgid (or msgid 0, which no request of ours uses) is about the
 * connection, not a request: a refused peer (error 6, 7), lost framing, a timeout. It ends the
 * call, and the connection after it. */
static bool connection_error(const struct sil_rpc_msg *m)
{
    return m->type == SIL_RPC_RESPONSE && (!m->has_msgid || m->msgid == 0) && m->error;
}

/* The server closed while we sent: what it wrote before closing is still readable and says
 * why (AF_UNIX keeps queued data readable after the peer's close). */
static int read_refusal(struct sil_rpc_client *c, int ret, struct sil_rpc_error *err)
{
    for (int rounds = 0; rounds < 64; rounds++) {
        struct sil_rpc_msg m;
        struct sil_rpc_error e = {0};
        int r;
        while ((r = sil_rpc_unpacker_next(c->up, &m, &e)) == 1) {
            bool mine = m.type == SIL_RPC_RESPONSE && m.msgid == c->pending_id && m.error;
            if (connection_error(&m) || mine) {
                sil_rpc_read_error(m.error, err);
                sil_rpc_msg_release(&m);
                return -EREMOTEIO;
            }
            sil_rpc_msg_release(&m);
        }
        if (r < 0)
            break;
        size_t avail;
        void *space = sil_rpc_unpacker_space(c->up, READ_CHUNK, &avail);
        if (!space)
            break;
        ssize_t n = recv(c->fd, space, avail, MSG_DONTWAIT);
        if (n <= 0)
            break;
        sil_rpc_unpacker_commit(c->up, (size_t)n);
    }
    return ret;
}

/* One sending of the packed request and the wait for its response; *heard: a notification
 * came meanwhile. */
static int call_once(struct sil_rpc_client *c, sil_rpc_notify_fn notify, void *ud,
                     const msgpack_object **result, struct sil_rpc_error *err, bool *heard)
{
    int64_t deadline = now_ms() + (c->timeout_ms > 0 ? c->timeout_ms : 0);
    int r = send_all(c, deadline, err);
    if (r == -ECONNRESET)
        return read_refusal(c, r, err);
    if (r < 0)
        return r;
    for (;;) {
        struct sil_rpc_msg m;
        while ((r = sil_rpc_unpacker_next(c->up, &m, err)) == 1) {
            if (m.type == SIL_RPC_RESPONSE && m.msgid == c->pending_id) {
                c->resp = m;
                c->have_resp = true;
                if (m.error) {
                    sil_rpc_read_error(m.error, err);
                    return -EREMOTEIO;
                }
                if (result)
                    *result = m.result;
                return 0;
            }
            if (connection_error(&m)) {
                sil_rpc_read_error(m.error, err);
                sil_rpc_msg_release(&m);
                return -EREMOTEIO;
            }
            if (m.type == SIL_RPC_RESPONSE && c->cancel_sent && m.msgid == c->cancel_id) {
                sil_rpc_msg_release(&m);
                continue;
            }
            *heard = true;
            int nr = notify ? notify(ud, &m) : 0;
            sil_rpc_msg_release(&m);
            if (nr < 0)
                return nr;
        }
        if (r < 0) {
            sil_rpc_error_prefix(err, "reply from the server");
            return r;
        }
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int t = remaining(c, deadline);
        if (t == 0)
            return sil_rpc_errorf(err, -ETIMEDOUT, 0, "timed out after %d ms waiting for the reply",
                                  c->timeout_ms);
        int pr = poll(&p, 1, t);
        if (pr < 0 && errno == EINTR) {
            int nr = notify ? notify(ud, NULL) : 0;
            if (nr < 0)
                return nr;
            continue;
        }
        if (pr < 0)
            return sil_rpc_errorf(err, -errno, 0, "poll: %s", strerror(errno));
        if (pr == 0)
            continue;
        size_t avail;
        void *space = sil_rpc_unpacker_space(c->up, READ_CHUNK, &avail);
        if (!space)
            return sil_rpc_errorf(err, -ENOBUFS, 0, "reply buffer full");
        ssize_t n = read(c->fd, space, avail);
        if (n < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n < 0)
            return sil_rpc_errorf(err, errno == ECONNRESET ? -ECONNRESET : -errno, 0, "read: %s",
                                  strerror(errno));
        if (n == 0)
            return sil_rpc_errorf(err, -ECONNRESET, 0, "the server closed the connection");
        sil_rpc_unpacker_commit(c->up, (size_t)n);
    }
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int sil_rpc_client_call(struct sil_rpc_client *c, sil_rpc_notify_fn notify, void *ud,
                        const msgpack_object **result, struct sil_rpc_error *err)
{
    if (c->have_resp) {
        sil_rpc_msg_release(&c->resp);
        c->have_resp = false;
    }
    if (sil_rpc_end(&c->out) < 0)
        return sil_rpc_errorf(err, -ENOMEM, 0, "out of memory packing the request");
    c->cancel_sent = false;
    /* a copy of the request, to send again if the server asks for it */
    const size_t n = sil_rpc_buf_size(&c->out);
    char *again = c->retry_max_ms > 0 ? malloc(n ? n : 1) : NULL;
    if (again) memcpy(again, sil_rpc_buf_head(&c->out), n);
    const int64_t t0 = now_ms();
    int64_t end = t0 + c->retry_max_ms;
    if (c->timeout_ms > 0 && t0 + c->timeout_ms < end) end = t0 + c->timeout_ms;
    struct sil_rpc_error e = {0};
    for (;;) {
        bool heard = false;
        int r = call_once(c, notify, ud, result, &e, &heard);
        const bool retry = r == -EREMOTEIO && again && !heard &&
                           e.code == SIL_RPC_E_UNAVAILABLE && e.retry_after_ms > 0 &&
                           now_ms() + e.retry_after_ms <= end;
        if (!retry) {
            free(again);
            if (err) *err = e;
            return r;
        }
        sleep_ms(e.retry_after_ms);
        if (c->have_resp) {
            sil_rpc_msg_release(&c->resp);
            c->have_resp = false;
        }
        sil_rpc_buf_reset(&c->out);
        if (sil_rpc_buf_write(&c->out, again, n) < 0) {
            free(again);
            return sil_rpc_errorf(err, -ENOMEM, 0, "out of memory packing the request");
        }
        c->cancel_sent = false;
    }
}

int sil_rpc_client_call0(struct sil_rpc_client *c, const char *method, sil_rpc_notify_fn notify,
                         void *ud, const msgpack_object **result, struct sil_rpc_error *err)
{
    msgpack_packer *pk = sil_rpc_client_begin(c, method);
    msgpack_pack_map(pk, 0);
    return sil_rpc_client_call(c, notify, ud, result, err);
}
