/* Private to the daemon's event-loop side (server.c, conn.c, methods.c): the server and
 * connection structs and the functions these files share. Not installed, not for clients.
 *
 * Ownership: struct server lives on sil_daemon_run's stack for the daemon's lifetime and owns
 * every struct conn (a list); a conn owns its fd, event source, unpacker, buffers and debug
 * streams, all freed by conn_free. Functions documented "returns -1 when the connection is gone"
 * have freed c: the caller must not touch it again. */
#ifndef SIL_DAEMON_SERVER_IMPL_H
#define SIL_DAEMON_SERVER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-event.h>
#include <time.h>

#include "daemon/config.h"
#include "daemon/engine/engine.h"
#include "daemon/worker.h"
#include "siliceo-proto.h"

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

/* The model's health, as the loop knows it: damaged when its file changed under the mapping
 * (generate and chat are refused with model_problem, which says what to do), reloading while
 * SIGHUP's load runs on the engine thread. */
enum model_state { MODEL_OK, MODEL_DAMAGED, MODEL_RELOADING };

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
    struct sil_modelwatch *watch;
    enum model_state model_state;
    bool reload_damaged; /* the reload in progress replaces a damaged model */
    char model_problem[1400];
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

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* conn.c: connections, their output buffers and input framing. */
void conn_free(struct conn *c);
struct conn *conn_find(struct server *s, uint64_t id);
size_t conn_queued(const struct conn *c);
/* Writes what the socket takes now. Returns -1 when the connection had to be closed. */
int conn_flush(struct conn *c);
/* Queues bytes without writing them; a client whose queue would pass max_output is dropped (it
 * does not read). Returns -1 when the connection is gone. */
int conn_append(struct conn *c, const void *data, size_t n);
int conn_send(struct conn *c, const void *data, size_t n);
/* Sends what the scratch buffer holds. */
int conn_send_scratch(struct conn *c);
int send_error(struct conn *c, uint32_t msgid, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
int send_rpc_error(struct conn *c, uint32_t msgid, const struct sil_rpc_error *err);
bool inflight_has(const struct conn *c, uint32_t msgid);
int inflight_add(struct conn *c, uint32_t msgid);
void inflight_remove(struct conn *c, uint32_t msgid);
/* The listening socket's handler: accepts, checks the peer, creates the connection. */
int on_accept(sd_event_source *src, int fd, uint32_t revents, void *ud);

/* methods.c: the RPC methods. */
/* Runs one well-formed message; returns -1 when the connection is gone. */
int dispatch(struct conn *c, const struct sil_rpc_msg *m);
/* Sends what debug.stream requests may send now; -1 when the connection is gone. */
int pump_streams(struct conn *c);

/* server.c: lifecycle. */
void begin_shutdown(struct server *s, const char *why);
/* A connection was freed: while draining, the last one ends the loop. */
void server_conn_gone(struct server *s);
/* "ok", "damaged" or "reloading". */
const char *model_state_name(const struct server *s);

#endif
