/* Private to the daemon's event-loop side (server.c, conn.c, methods.c): the server and
 * connection structs and the functions these files share. Not installed, not for clients.
 *
 * Ownership: struct server lives on sil_daemon_run's stack for the daemon's lifetime and owns
 * every struct conn (a list); a conn owns its fd, event source, unpacker, buffers and debug
 * streams, all freed by sil_conn_free. Functions documented "returns -1 when the connection is gone"
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
#include "daemon/heatkeep.h"
#include "daemon/models.h"
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
    int n_inflight;
    size_t cap_inflight;
    struct dstream *streams;
    bool closing; /* close once the output is flushed */
    bool dirty;   /* output appended by on_worker, not yet written */
    bool read_eof; /* the peer shut its write side: answer what is in flight, then close */
    bool paused;   /* not read while the daemon's input buffers are over max_input */
    double t_active;  /* last byte read or written */
    double t_partial; /* since when an incomplete message waits for its rest; 0: none */
    size_t pending_in; /* unparsed bytes buffered (counted in server.input_bytes) */
    struct inmsg *close_msg; /* tells the worker the connection went, allocated up front */
};

/* A refused peer: its error is written, our side shut, and what it still sends is read and
 * dropped for a moment, so it can read the error instead of a reset. */
struct lingering {
    struct lingering *next;
    struct server *srv;
    int fd;
    sd_event_source *io, *timer;
};

enum state { RUNNING, STOPPING, DRAINING };

/* A request waiting for its model (modelswitch.c): the message as it came, decoded and run
 * again once that model is loaded. */
struct deferred {
    struct deferred *next;
    uint64_t conn_id;
    uint32_t msgid;
    char path[PATH_MAX]; /* the model's file */
    size_t len;
    char data[];
};

/* The model's health, as the loop knows it: damaged when its file changed under the mapping
 * (generate and chat are refused with model_problem, which says what to do), reloading while
 * SIGHUP's load runs on the engine thread. */
enum model_state { MODEL_OK, MODEL_DAMAGED, MODEL_RELOADING };

struct server {
    struct sil_config *cfg;
    /* how long the last model load took, and when the reload in progress started: the hint
     * a request refused during a reload gets (retry_after_ms) */
    double load_s, reload_t0;
    int argc;
    char *const *argv;
    sd_event *ev;
    sd_event_source *listen_src, *worker_src, *drain_timer, *watchdog_timer, *tick_timer;
    uint64_t watchdog_usec; /* WATCHDOG_USEC from systemd; 0: no watchdog */
    bool engine_stalled;
    int listen_fd;
    bool activated;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    struct sil_engine *engine;
    /* The draft model of speculative decoding (spec = draft), NULL when off; the worker's
     * thread evaluates it, the loop only reads its info. */
    struct sil_engine *draft;
    /* the device memory the draft model took: part of vram_budget, which every model served
     * then shares with it (sil_server_engine_params) */
    uint64_t draft_vram;
    const struct sil_vocab *vocab;
    struct sil_worker *worker;
    struct sil_modelwatch *watch;
    enum model_state model_state;
    bool reload_damaged; /* the reload in progress replaces a damaged model */
    char model_problem[1400];
    /* Models by name (modelswitch.c): the loaded model's file ("" when none is loaded) and
     * name; a switch or keep_alive's unload under way (model_state RELOADING), loading the
     * file `loading` ("" for an unload); the requests that wait for a model, oldest first. */
    char model_path[PATH_MAX];
    char model_name[SIL_MODEL_NAME_MAX + 1];
    bool switching;
    char loading[PATH_MAX];
    struct deferred *deferred;
    int n_deferred;
    bool replaying;    /* running deferred requests: they go to the model loaded for them */
    double t_model_used; /* last time a request ran or ended: keep_alive counts from there */
    uint64_t model_loads, model_unloads;
    struct tokpool *tok; /* tokenizes large texts off the loop (tokjob.c) */
    struct sil_heatkeep heat; /* the expert heat map's file and figures */
    bool heat_init;
    struct conn *conns;
    int n_conns;
    uint64_t next_conn_id;
    enum state state;
    double t_start;
    struct sil_rpc_buf scratch;
    uint64_t input_bytes; /* unparsed input buffered across connections */
    struct lingering *lingering;
    int n_lingering;
    /* Counters for metrics. */
    uint64_t clients_total, clients_refused, clients_dropped, clients_timed_out, bytes_in, bytes_out,
        messages_in, bad_messages, requests_rejected, results_too_large;
};

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* conn.c: connections, their output buffers and input framing. */
void sil_conn_free(struct conn *c);
struct conn *sil_conn_find(struct server *s, uint64_t id);
size_t sil_conn_queued(const struct conn *c);
/* Writes what the socket takes now. Returns -1 when the connection had to be closed. */
int sil_conn_flush(struct conn *c);
/* Sends what the scratch buffer holds. */
int sil_conn_send_scratch(struct conn *c);
int sil_send_error(struct conn *c, uint32_t msgid, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The same with retry_after_ms in the error map: when to send the request again. */
int sil_send_error_retry(struct conn *c, uint32_t msgid, int code, int retry_after_ms,
                         const char *msg);
int sil_send_rpc_error(struct conn *c, uint32_t msgid, const struct sil_rpc_error *err);
/* Sends the response to msgid that the scratch buffer holds, or error 5 when it alone is larger
 * than max_output (it could never be queued). */
int sil_send_result_scratch(struct conn *c, uint32_t msgid);
bool sil_inflight_has(const struct conn *c, uint32_t msgid);
int sil_inflight_add(struct conn *c, uint32_t msgid);
void sil_inflight_remove(struct conn *c, uint32_t msgid);
/* The listening socket's handler: accepts, checks the peer, creates the connection. */
int sil_on_accept(sd_event_source *src, int fd, uint32_t revents, void *ud);
/* The once-a-second timer: idle and incomplete-message timeouts, resuming paused reads. */
int sil_on_conn_tick(sd_event_source *src, uint64_t usec, void *ud);
void sil_lingering_free_all(struct server *s);

/* Delivers one outbox message (worker or tokenizer thread) to its connection, if still there:
 * the final one takes the request off the in-flight list; one larger than max_output becomes
 * error 5. Connections written to are marked dirty. */
void sil_conn_deliver(struct server *s, const struct sil_outmsg *m);
/* Writes every dirty connection once. */
void sil_conn_flush_dirty(struct server *s);

/* tokjob.c: texts of at least TOKJOB_MIN_TEXT bytes are tokenized on a helper thread. */
#define TOKJOB_MIN_TEXT 65536
struct tokpool;
int sil_tokpool_start(struct server *s);
void sil_tokpool_free(struct tokpool *p);
/* A reload starts (true) or failed (false): while set, generate requests are refused. */
void sil_tokpool_set_reloading(struct tokpool *p, bool reloading);
/* The reload is done: waits for the job in progress (it reads the old vocab), then uses v and
 * n_ctx and clears reloading. Call before the old engine is closed. */
void sil_tokpool_set_model(struct tokpool *p, const struct sil_vocab *v, int32_t n_ctx);
/* Copies text; puts msgid in flight on c. gen NULL: a tokenize request answered {ids, n}; else a
 * generate request the thread completes (prompt, checks) and submits. -ENOMEM: nothing done. */
int sil_tokpool_submit(struct server *s, struct conn *c, uint32_t msgid, const char *text, size_t len, bool add_bos,
                       bool special, struct sil_job_req *gen);

/* methods.c: the RPC methods. */
/* The prompt ends inside an open think block: the model's first tokens are reasoning. */
bool sil_prompt_ends_in_think(const struct sil_vocab *v, const int32_t *ids, size_t n);
/* Runs one well-formed message; returns -1 when the connection is gone. */
int sil_dispatch(struct conn *c, const struct sil_rpc_msg *m);
/* Sends what debug.stream requests may send now; -1 when the connection is gone. */
int sil_pump_streams(struct conn *c);

/* modelswitch.c: which model a request is for, switching to it, keep_alive. */
/* Reads the request's 'model': 1 to go on (the model it names is loaded and serves), else the
 * request was refused (0, or -1 when the connection is gone) or waits for its model (0). */
int sil_model_pick(struct conn *c, const struct sil_rpc_msg *m);
/* After the worker's or the tokenizer's output: starts the next switch once nothing runs. */
void sil_models_pump(struct server *s);
/* The worker loaded a model (a switch's, or SIGHUP's reload), could not, or unloaded. */
void sil_models_loaded(struct server *s);
void sil_models_load_failed(struct server *s, const char *why);
void sil_models_unloaded(struct server *s);
/* The once-a-second tick: keep_alive. */
void sil_models_tick(struct server *s);
/* cancel: 1 when msgid of c was waiting (answered with error 8), else 0; -1: c is gone. */
int sil_models_cancel(struct conn *c, uint32_t msgid);
/* A connection went: its waiting requests go too. */
void sil_models_conn_gone(struct server *s, uint64_t conn_id);
/* Shutdown: every waiting request gets error 11. */
void sil_models_fail_all(struct server *s, int code, const char *msg);
int sil_server_models_dir(struct server *s, char *out, size_t size);
/* The loaded model's file and name are set from the engine (or cleared without one). */
void sil_models_set_loaded(struct server *s);
/* tokjob.c: nothing waits or runs on the tokenizer thread. */
bool sil_tokpool_idle(struct tokpool *p);

/* server.c: lifecycle. */
void sil_begin_shutdown(struct server *s, const char *why);
/* A connection was freed: while draining, the last one ends the loop. */
void sil_server_conn_gone(struct server *s);
/* "ok", "damaged", "reloading", "loading", "unloading" or "unloaded". */
const char *sil_model_state_name(const struct server *s);
/* The engine's parameters from the configuration, for the model at path. */
void sil_server_engine_params(const struct server *s, struct sil_engine_params *ep, const char *path);

#endif
