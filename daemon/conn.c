/* Connections: accept with the peer credential check (refused peers get one error, then our
 * side is shut and their input read and dropped briefly so they can read it), per-connection
 * output buffers bounded by max_output, non-blocking reads, the framing of incoming msgpack-RPC
 * messages, each handed to sil_dispatch (methods.c), and the input limits: max_input across
 * connections, message_timeout for an incomplete message, idle_timeout.
 * A peer that shuts its write side still gets the answers to what it sent; the connection
 * closes after the last of them is written.
 *
 * Ownership: a struct conn is created by sil_on_accept and freed only by sil_conn_free, which
 * any write or read path may call when the peer fails or misbehaves; those paths then return
 * -1. The connection holds the ids of its requests in flight so the worker can be told when it
 * goes. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <systemd/sd-event.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/server_impl.h"
#include "daemon/utf8.h"
#include "daemon/worker.h"
#include "kernels/vec.h"
#include "siliceo-proto.h"

#define READ_CHUNK 65536
#define MAX_LINGERING 64      /* refused peers whose input is drained at once; others just closed */
#define LINGER_USEC 2000000ull /* how long a refused peer's input is drained */

/* ---- connections ------------------------------------------------------------------------------- */

void sil_conn_free(struct conn *c)
{
    struct server *s = c->srv;
    sil_models_conn_gone(s, c->id);
    if (c->n_inflight && s->worker && c->close_msg)
        sil_worker_conn_closed(s->worker, c->id, c->close_msg);
    else
        sil_worker_close_msg_free(c->close_msg);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->n_conns--;
    s->input_bytes -= c->pending_in;
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
    sil_server_conn_gone(s);
}

struct conn *sil_conn_find(struct server *s, uint64_t id)
{
    for (struct conn *c = s->conns; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

size_t sil_conn_queued(const struct conn *c) { return c->out_len - c->out_off; }

static void conn_update_events(struct conn *c)
{
    uint32_t ev = c->closing || c->read_eof || c->paused ? 0 : EPOLLIN;
    if (sil_conn_queued(c))
        ev |= EPOLLOUT;
    sd_event_source_set_io_events(c->io, ev);
}

/* Writes what the socket takes now. Returns -1 when the connection had to be closed. */
int sil_conn_flush(struct conn *c)
{
    while (sil_conn_queued(c)) {
        ssize_t n = send(c->fd, c->out + c->out_off, sil_conn_queued(c), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR)
                break;
            sil_debug("client %llu: send: %s", (unsigned long long)c->id, strerror(errno));
            sil_conn_free(c);
            return -1;
        }
        c->out_off += n;
        c->srv->bytes_out += n;
        c->t_active = now_s();
    }
    if (c->out_off == c->out_len)
        c->out_off = c->out_len = 0;
    if (c->read_eof && !c->n_inflight && !c->streams)
        c->closing = true; /* half-closed peer: its last answer is queued */
    if (c->closing && !sil_conn_queued(c)) {
        sil_conn_free(c);
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
    if (sil_conn_queued(c) + n > s->cfg->max_output) {
        sil_warn("client %llu (pid %d, uid %d) dropped: more than %llu bytes of output waiting",
                 (unsigned long long)c->id, c->cred.pid, c->cred.uid, (unsigned long long)s->cfg->max_output);
        s->clients_dropped++;
        sil_conn_free(c);
        return -1;
    }
    if (c->out_off && c->out_len + n > c->out_cap) {
        memmove(c->out, c->out + c->out_off, sil_conn_queued(c));
        c->out_len -= c->out_off;
        c->out_off = 0;
    }
    if (sil_vec_reserve(&c->out, &c->out_cap, c->out_len + n, 4096) < 0) {
        sil_conn_free(c);
        return -1;
    }
    memcpy(c->out + c->out_len, data, n);
    c->out_len += n;
    return 0;
}

static int conn_send(struct conn *c, const void *data, size_t n)
{
    if (conn_append(c, data, n) < 0)
        return -1;
    return sil_conn_flush(c);
}

/* Sends what the scratch buffer holds. */
int sil_conn_send_scratch(struct conn *c)
{
    struct server *s = c->srv;
    int rc = conn_send(c, sil_rpc_buf_head(&s->scratch), sil_rpc_buf_size(&s->scratch));
    sil_rpc_buf_reset(&s->scratch);
    return rc;
}

int sil_send_error(struct conn *c, uint32_t msgid, int code, const char *fmt, ...)
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
    return sil_conn_send_scratch(c);
}

int sil_send_error_retry(struct conn *c, uint32_t msgid, int code, int retry_after_ms, const char *msg)
{
    msgpack_packer *pk = sil_rpc_begin_error_response(&c->srv->scratch, msgid);
    msgpack_pack_map(pk, 3);
    sil_rpc_kv_int(pk, "code", code);
    sil_rpc_kv_str(pk, "message", msg);
    sil_rpc_kv_int(pk, "retry_after_ms", retry_after_ms);
    sil_rpc_end_error_response(&c->srv->scratch);
    return sil_conn_send_scratch(c);
}

int sil_send_rpc_error(struct conn *c, uint32_t msgid, const struct sil_rpc_error *err)
{
    return sil_send_error(c, msgid, err->code ? err->code : SIL_RPC_E_INVALID_PARAMS, "%s", err->msg);
}

/* An error about the connection itself, with a nil msgid (siliceo-rpc(7)). */
static int send_conn_error(struct conn *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int send_conn_error(struct conn *c, int code, const char *fmt, ...)
{
    char msg[512], clean[3 * sizeof msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t n = sil_utf8_sanitize(msg, strlen(msg), clean);
    clean[n] = 0;
    sil_rpc_pack_conn_error(&c->srv->scratch, code, clean);
    return sil_conn_send_scratch(c);
}

int sil_send_result_scratch(struct conn *c, uint32_t msgid)
{
    struct server *s = c->srv;
    size_t n = sil_rpc_buf_size(&s->scratch);
    if (n > s->cfg->max_output) {
        sil_rpc_buf_reset(&s->scratch);
        s->results_too_large++;
        return sil_send_error(c, msgid, SIL_RPC_E_TOO_LARGE, "result of %zu bytes is larger than max_output (%llu)",
                              n, (unsigned long long)s->cfg->max_output);
    }
    return sil_conn_send_scratch(c);
}

bool sil_inflight_has(const struct conn *c, uint32_t msgid)
{
    for (int i = 0; i < c->n_inflight; i++)
        if (c->inflight[i] == msgid)
            return true;
    return false;
}

int sil_inflight_add(struct conn *c, uint32_t msgid)
{
    if (sil_vec_reserve(&c->inflight, &c->cap_inflight, (size_t)c->n_inflight + 1, 8) < 0)
        return -ENOMEM;
    c->inflight[c->n_inflight++] = msgid;
    return 0;
}

void sil_inflight_remove(struct conn *c, uint32_t msgid)
{
    for (int i = 0; i < c->n_inflight; i++)
        if (c->inflight[i] == msgid) {
            c->inflight[i] = c->inflight[--c->n_inflight];
            return;
        }
}

void sil_conn_deliver(struct server *s, const struct sil_outmsg *m)
{
    struct conn *c = sil_conn_find(s, m->conn_id);
    if (!c)
        return;
    if (m->final)
        sil_inflight_remove(c, m->msgid);
    if (m->len > s->cfg->max_output) {
        /* It could never be queued: the client gets error 5, not a hang-up. */
        s->results_too_large++;
        sil_warn("client %llu: %zu bytes of output for request %u exceed max_output", (unsigned long long)c->id,
                 m->len, m->msgid);
        if (m->final) {
            sil_rpc_pack_error_response(&s->scratch, m->msgid, SIL_RPC_E_TOO_LARGE, "result larger than max_output");
            if (conn_append(c, sil_rpc_buf_head(&s->scratch), sil_rpc_buf_size(&s->scratch)) == 0)
                c->dirty = true;
            sil_rpc_buf_reset(&s->scratch);
        }
    } else if (m->len) {
        if (conn_append(c, m->data, m->len) == 0)
            c->dirty = true;
    } else if (m->final) {
        c->dirty = true; /* nothing to send, but a half-closed connection may be done */
    }
}

void sil_conn_flush_dirty(struct server *s)
{
    for (struct conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->dirty) {
            c->dirty = false;
            sil_conn_flush(c);
        }
    }
}

/* ---- I/O --------------------------------------------------------------------------------------- */

/* Keeps the buffered-input figures: the server's total, and since when a message is incomplete
 * (a message completed in this read restarts the clock for the bytes after it). */
static void note_pending(struct conn *c, bool completed)
{
    struct server *s = c->srv;
    size_t p = sil_rpc_unpacker_pending(c->up);
    s->input_bytes = s->input_bytes - c->pending_in + p;
    c->pending_in = p;
    if (!p)
        c->t_partial = 0;
    else if (completed || !c->t_partial)
        c->t_partial = now_s();
}

static int conn_read(struct conn *c)
{
    struct server *s = c->srv;
    /* Over the global cap, a connection holding part of a message waits: others may still send
     * small messages, and the message timeout ends whoever never completes theirs. */
    if (c->pending_in && s->input_bytes >= s->cfg->max_input) {
        c->paused = true;
        conn_update_events(c);
        return 0;
    }
    size_t avail = 0;
    void *p = sil_rpc_unpacker_space(c->up, READ_CHUNK, &avail);
    if (!p) {
        if (send_conn_error(c, SIL_RPC_E_TOO_LARGE, "too much unparsed input") < 0)
            return -1;
        c->closing = true;
        return sil_conn_flush(c);
    }
    ssize_t n = recv(c->fd, p, avail, MSG_DONTWAIT);
    if (n == 0) {
        /* The peer shut its write side (or closed): it may still read. What it sent is answered;
         * sil_conn_flush closes once nothing is in flight and the output is written. */
        c->read_eof = true;
        c->t_partial = 0; /* an incomplete last message can never complete: dropped */
        sil_debug("client %llu: end of input, %d requests in flight", (unsigned long long)c->id, c->n_inflight);
        return sil_conn_flush(c);
    }
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR)
            return 0;
        sil_conn_free(c);
        return -1;
    }
    sil_rpc_unpacker_commit(c->up, n);
    s->bytes_in += n;
    c->t_active = now_s();
    bool completed = false;
    for (;;) {
        struct sil_rpc_msg m;
        struct sil_rpc_error err = { 0 };
        int rc = sil_rpc_unpacker_next(c->up, &m, &err);
        if (rc == 0) {
            note_pending(c, completed);
            return 0;
        }
        completed = true;
        s->messages_in++;
        if (rc == 1) {
            rc = sil_dispatch(c, &m);
            sil_rpc_msg_release(&m);
            if (rc < 0)
                return -1; /* the connection is gone */
            if (c->closing) {
                note_pending(c, true);
                return 0;
            }
            continue;
        }
        s->bad_messages++;
        sil_debug("client %llu: bad message: %s", (unsigned long long)c->id, err.msg);
        if (rc == -EPROTO && m.has_msgid && m.type == SIL_RPC_REQUEST) {
            if (sil_send_rpc_error(c, m.msgid, &err) < 0)
                return -1;
            continue;
        }
        if (rc == -EPROTO && m.type != SIL_RPC_REQUEST && m.type >= 0)
            continue; /* a malformed notification or response: nothing to answer */
        if (rc == -EPROTO) {
            /* Whole msgpack, not a request whose msgid could be read: the framing holds, so the
             * connection stays; the error has a nil msgid as it answers no request. */
            if (send_conn_error(c, err.code ? err.code : SIL_RPC_E_INVALID_REQUEST, "%s", err.msg) < 0)
                return -1;
            continue;
        }
        /* Framing is lost (or the peer is not speaking the protocol): say why, then hang up. */
        if (send_conn_error(c, err.code ? err.code : SIL_RPC_E_PARSE, "%s", err.msg) < 0)
            return -1; /* the send failed and freed c: not even c->id may be read */
        note_pending(c, true);
        c->closing = true;
        return sil_conn_flush(c);
    }
}

static int on_conn_io(sd_event_source *src, int fd, uint32_t revents, void *ud)
{
    struct conn *c = ud;
    if (revents & (EPOLLERR | EPOLLHUP)) {
        if (!(revents & EPOLLIN)) {
            sil_conn_free(c);
            return 0;
        }
    }
    if (revents & EPOLLOUT) {
        if (sil_conn_flush(c) < 0)
            return 0;
        if (c->streams && sil_pump_streams(c) < 0)
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
    for (int i = 0; i < s->cfg->n_allow_gids; i++)
        if (s->cfg->allow_gids[i] == cr->gid)
            return true;
    gid_t stack[256], *groups = stack;
    socklen_t len = sizeof stack;
    int n = 0;
    int rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len);
    if (rc < 0 && errno == ERANGE) {
        /* More than 256 supplementary groups: the kernel said how much room they need. */
        groups = malloc(len);
        rc = groups ? getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) : -1;
    }
    if (rc == 0)
        n = len / sizeof(gid_t);
    else
        sil_warn("pid %d: cannot read its supplementary groups: %s", cr->pid, strerror(groups ? errno : ENOMEM));
    bool ok = false;
    for (int i = 0; i < s->cfg->n_allow_gids && !ok; i++)
        for (int k = 0; k < n; k++)
            if (groups[k] == s->cfg->allow_gids[i]) {
                ok = true;
                break;
            }
    if (groups != stack)
        free(groups);
    return ok;
}

static void lingering_free(struct lingering *l)
{
    struct server *s = l->srv;
    for (struct lingering **p = &s->lingering; *p; p = &(*p)->next)
        if (*p == l) {
            *p = l->next;
            break;
        }
    s->n_lingering--;
    sd_event_source_disable_unref(l->io);
    sd_event_source_disable_unref(l->timer);
    close(l->fd);
    free(l);
}

void sil_lingering_free_all(struct server *s)
{
    while (s->lingering)
        lingering_free(s->lingering);
}

static int on_lingering_io(sd_event_source *src, int fd, uint32_t revents, void *ud)
{
    struct lingering *l = ud;
    char buf[4096];
    for (int k = 0; k < 16; k++) {
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EINTR))
            return 0;
        lingering_free(l); /* end of input or an error: the peer has read or gone */
        return 0;
    }
    return 0; /* more to drop: the next round */
}

static int on_lingering_timeout(sd_event_source *src, uint64_t usec, void *ud)
{
    lingering_free(ud);
    return 0;
}

/* A refused peer gets one error (nil msgid), written without waiting; then our side is shut and
 * what it sends is read and dropped until it closes or LINGER_USEC pass, so a client that wrote
 * its first request before reading finds the error instead of a reset or a broken pipe. */
static void refuse(struct server *s, int fd, int code, const char *msg)
{
    sil_rpc_pack_conn_error(&s->scratch, code, msg);
    ssize_t n = send(fd, sil_rpc_buf_head(&s->scratch), sil_rpc_buf_size(&s->scratch), MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
    sil_rpc_buf_reset(&s->scratch);
    s->clients_refused++;
    shutdown(fd, SHUT_WR);
    struct lingering *l = s->n_lingering < MAX_LINGERING ? calloc(1, sizeof(*l)) : NULL;
    if (!l) {
        close(fd);
        return;
    }
    l->srv = s;
    l->fd = fd;
    if (sd_event_add_io(s->ev, &l->io, fd, EPOLLIN, on_lingering_io, l) < 0 ||
        sd_event_add_time_relative(s->ev, &l->timer, CLOCK_MONOTONIC, LINGER_USEC, 0, on_lingering_timeout, l) < 0) {
        sd_event_source_disable_unref(l->io);
        free(l);
        close(fd);
        return;
    }
    l->next = s->lingering;
    s->lingering = l;
    s->n_lingering++;
}

int sil_on_conn_tick(sd_event_source *src, uint64_t usec, void *ud)
{
    struct server *s = ud;
    double t = now_s();
    const struct sil_config *cfg = s->cfg;
    for (struct conn *c = s->conns, *next; c; c = next) {
        next = c->next;
        if (c->closing)
            continue;
        if (c->t_partial && cfg->message_timeout && t - c->t_partial > cfg->message_timeout) {
            sil_notice("client %llu (pid %d, uid %d) dropped: a message incomplete for %d s (%zu bytes)",
                       (unsigned long long)c->id, c->cred.pid, c->cred.uid, cfg->message_timeout, c->pending_in);
            s->clients_timed_out++;
            if (send_conn_error(c, SIL_RPC_E_TIMEOUT, "message incomplete after %d s (message_timeout)",
                                cfg->message_timeout) < 0)
                continue;
            c->closing = true;
            sil_conn_flush(c);
            continue;
        }
        bool idle = !c->n_inflight && !c->streams && !sil_conn_queued(c) && !c->t_partial;
        if (idle && cfg->idle_timeout && t - c->t_active > cfg->idle_timeout) {
            sil_debug("client %llu: idle for %d s, closing", (unsigned long long)c->id, cfg->idle_timeout);
            s->clients_timed_out++;
            if (send_conn_error(c, SIL_RPC_E_TIMEOUT, "idle for %d s (idle_timeout)", cfg->idle_timeout) < 0)
                continue;
            c->closing = true;
            sil_conn_flush(c);
            continue;
        }
        if (c->paused && s->input_bytes < cfg->max_input) {
            c->paused = false;
            conn_update_events(c);
        }
    }
    sil_models_tick(s);
    sd_event_source_set_time(src, usec + 1000000);
    return 0;
}

int sil_on_accept(sd_event_source *src, int fd, uint32_t revents, void *ud)
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
        c->t_active = now_s();
        c->up = sil_rpc_unpacker_new(s->cfg->max_message, 0);
        c->close_msg = s->worker ? sil_worker_close_msg_new() : NULL;
        if (!c->up || (s->worker && !c->close_msg) ||
            sd_event_add_io(s->ev, &c->io, cfd, EPOLLIN, on_conn_io, c) < 0) {
            sil_rpc_unpacker_free(c->up);
            sil_worker_close_msg_free(c->close_msg);
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
