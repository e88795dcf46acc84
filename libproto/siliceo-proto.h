/* libsiliceo-proto: msgpack-RPC framing, error codes, typed field access and Unix socket helpers
 * for siliceod and its clients. The wire format is specified in siliceo-rpc(7).
 *
 *   request      [0, msgid, method, params]
 *   response     [1, msgid, error, result]      error is nil or {code, message}
 *   notification [2, method, params]
 *
 * Params and results are maps with named fields. For compatibility with generic msgpack-RPC
 * clients (Neovim's rpcrequest(), which sends its arguments as an array), params may also be an
 * array holding exactly one map, an empty array or nil; the unpacker normalises all of these so
 * that sil_rpc_msg.params is the map or NULL.
 *
 * Functions return 0 (or a count) on success and a negative errno on failure, and fill a
 * struct sil_rpc_error whose code is the protocol error code to send back (SIL_RPC_E_*), so a
 * server can answer with err.code and err.msg directly. This library depends on msgpack-c only.
 */
#ifndef SILICEO_PROTO_H
#define SILICEO_PROTO_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Protocol version spoken by this library; `hello` negotiates it (siliceo-rpc(7)). */
#define SIL_RPC_PROTOCOL_VERSION 1

#define SIL_RPC_DEFAULT_MAX_MSG (4u << 20)  /* bytes in one message */
#define SIL_RPC_DEFAULT_MAX_DEPTH 16        /* nesting of arrays/maps, the outer array is 1 */
#define SIL_RPC_MAX_DEPTH_LIMIT 32          /* hard ceiling for max_depth */
#define SIL_RPC_METHOD_MAX 64               /* bytes in a method name, NUL included */

/* Protocol error codes: the `code` of an error response. Numbers are part of the protocol and
 * never change meaning; new codes are appended. */
enum sil_rpc_code {
    SIL_RPC_OK = 0,
    SIL_RPC_E_PARSE = 1,            /* bytes are not valid msgpack */
    SIL_RPC_E_INVALID_REQUEST = 2,  /* valid msgpack, not a valid RPC message */
    SIL_RPC_E_METHOD_NOT_FOUND = 3, /* unknown method */
    SIL_RPC_E_INVALID_PARAMS = 4,   /* missing field, wrong type or value out of range */
    SIL_RPC_E_TOO_LARGE = 5,        /* message, prompt or output over a limit */
    SIL_RPC_E_PERMISSION = 6,       /* peer not allowed (e.g. shutdown by a non-owner) */
    SIL_RPC_E_BUSY = 7,             /* queue full / overloaded, retry later */
    SIL_RPC_E_CANCELLED = 8,        /* request cancelled */
    SIL_RPC_E_NOT_FOUND = 9,        /* no such session / request */
    SIL_RPC_E_INTERNAL = 10,        /* bug or resource failure in the daemon */
    SIL_RPC_E_SHUTTING_DOWN = 11,   /* daemon is stopping */
    SIL_RPC_E_VERSION = 12,         /* no common protocol version */
    SIL_RPC_E_UNAVAILABLE = 13,     /* model damaged or being reloaded (message: what to do) */
    SIL_RPC_E_TIMEOUT = 14,         /* a connection idle, or a message incomplete, for too long */
    SIL_RPC_E_CONTEXT_FULL = 15,    /* the prompt (a session's newest turn) does not fit the context */
    SIL_RPC_E_MODEL_NOT_FOUND = 16, /* no model of that name (message: the names there are) */
    SIL_RPC_CODE_COUNT
};

/* "parse_error", "invalid_request", ...; "unknown" for numbers not in the table. */
const char *sil_rpc_code_name(int code);
/* Default one-line message, e.g. "invalid params". */
const char *sil_rpc_code_message(int code);

struct sil_rpc_error {
    int code;      /* SIL_RPC_E_* for protocol errors, the remote code after -EREMOTEIO, else 0 */
    char msg[512]; /* one line, no trailing newline */
    int retry_after_ms; /* a remote error's hint (> 0): the request may be sent again after it */
};

/* Sets err (may be NULL) and returns ret, so callers can `return sil_rpc_errorf(err, -EINVAL,
 * SIL_RPC_E_INVALID_PARAMS, "...")`. */
int sil_rpc_errorf(struct sil_rpc_error *err, int ret, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Prefixes the message: "prefix: old message". */
void sil_rpc_error_prefix(struct sil_rpc_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* ---- messages -------------------------------------------------------------------------------- */

enum sil_rpc_type {
    SIL_RPC_REQUEST = 0,
    SIL_RPC_RESPONSE = 1,
    SIL_RPC_NOTIFICATION = 2,
};

/* One decoded message. Every pointer points into memory owned by the message and stays valid
 * until sil_rpc_msg_release(); the unpacker's own buffer may be reused meanwhile. */
struct sil_rpc_msg {
    int type;                        /* enum sil_rpc_type, -1 when not even that is known */
    uint32_t msgid;                  /* request, response */
    bool has_msgid;                  /* msgid was read (also set on a rejected request); false
                                      * for a response with a nil msgid (a connection error) */
    char method[SIL_RPC_METHOD_MAX]; /* request, notification; NUL-terminated */
    const msgpack_object *params;    /* request, notification: the params map, NULL if none */
    const msgpack_object *error;     /* response: NULL when nil */
    const msgpack_object *result;    /* response: may be a nil object */
    msgpack_object root;             /* the whole message */
    size_t size;                     /* bytes on the wire */
    void *priv_;                     /* owned memory */
};

void sil_rpc_msg_release(struct sil_rpc_msg *msg);

/* Incremental unpacker: feed bytes as they arrive, take complete messages out. Framing is done
 * by a bounded scanner before msgpack-c sees the bytes, so a message over max_msg, nested deeper
 * than max_depth, or declaring more elements than it has bytes, costs at most max_msg of buffer
 * and never an allocation sized by the peer: a decoded message takes at most about 25 times its
 * wire size (one msgpack_object per element). Not thread-safe; one per connection. */
struct sil_rpc_unpacker;

/* max_msg 0 -> SIL_RPC_DEFAULT_MAX_MSG; max_depth 0 -> SIL_RPC_DEFAULT_MAX_DEPTH (at most
 * SIL_RPC_MAX_DEPTH_LIMIT). Returns NULL on allocation failure. */
struct sil_rpc_unpacker *sil_rpc_unpacker_new(size_t max_msg, unsigned max_depth);
void sil_rpc_unpacker_free(struct sil_rpc_unpacker *u);

/* Copies n bytes in. Call sil_rpc_unpacker_next() until it returns 0 between feeds: the buffer
 * holds at most max_msg + 1 MiB of unparsed bytes, beyond that -ENOBUFS. */
int sil_rpc_unpacker_feed(struct sil_rpc_unpacker *u, const void *data, size_t n,
                          struct sil_rpc_error *err);
/* Zero-copy alternative to feed: space for at least `want` bytes (read(2) into it), then commit
 * what was written. Returns NULL (and *avail 0) when the buffer limit is reached. */
void *sil_rpc_unpacker_space(struct sil_rpc_unpacker *u, size_t want, size_t *avail);
void sil_rpc_unpacker_commit(struct sil_rpc_unpacker *u, size_t n);
/* Bytes buffered and not yet returned as messages. */
size_t sil_rpc_unpacker_pending(const struct sil_rpc_unpacker *u);

/* Takes the next complete message out.
 *   1        *msg filled; release it with sil_rpc_msg_release()
 *   0        need more bytes
 *   -EMSGSIZE  message over max_msg (err code SIL_RPC_E_TOO_LARGE)          fatal for the stream
 *   -EBADMSG   malformed msgpack or nested too deep (SIL_RPC_E_PARSE)       fatal for the stream
 *   -EPROTO    valid msgpack but not a valid RPC message (SIL_RPC_E_INVALID_REQUEST, or
 *              SIL_RPC_E_INVALID_PARAMS for params of the wrong shape): the bytes are consumed,
 *              the stream stays usable, and msg->type / msgid / has_msgid / method are filled as
 *              far as they could be read so a server can answer; msg needs no release.
 * After a fatal error every later call returns the same error. */
int sil_rpc_unpacker_next(struct sil_rpc_unpacker *u, struct sil_rpc_msg *msg,
                          struct sil_rpc_error *err);

/* Decodes exactly one complete message from a buffer (same checks as the unpacker). */
int sil_rpc_decode(const void *data, size_t n, size_t max_msg, unsigned max_depth,
                   struct sil_rpc_msg *msg, struct sil_rpc_error *err);

/* ---- typed field access on a map -------------------------------------------------------------- */

/* Flags for the getters. */
#define SIL_RPC_OPTIONAL 0u
#define SIL_RPC_REQUIRED 1u
#define SIL_RPC_NULLABLE 2u /* a nil value counts as absent */

/* Every getter returns 1 when the field was found and stored, 0 when it is absent and optional
 * (the output is left untouched, so it can hold the default), and a negative errno with
 * err->code SIL_RPC_E_INVALID_PARAMS and a message naming the field otherwise:
 * -ENOENT (required and absent), -EINVAL (wrong type, not a map), -ERANGE (out of range). */

/* The value for a string key, NULL if absent or if map is not a map. */
const msgpack_object *sil_rpc_map_get(const msgpack_object *map, const char *key);

/* str or bin. *s is NOT NUL-terminated; *len may be NULL only if the caller does not need it. */
int sil_rpc_get_str(const msgpack_object *map, const char *key, const char **s, size_t *len,
                    unsigned flags, struct sil_rpc_error *err);
/* Like get_str, but copies into buf (NUL-terminated) and rejects values with a NUL byte or
 * longer than size - 1. */
int sil_rpc_get_strbuf(const msgpack_object *map, const char *key, char *buf, size_t size,
                       unsigned flags, struct sil_rpc_error *err);
/* Integers; an integral float is accepted too (some clients send 1.0 for 1). */
int sil_rpc_get_int(const msgpack_object *map, const char *key, int64_t min, int64_t max,
                    int64_t *out, unsigned flags, struct sil_rpc_error *err);
int sil_rpc_get_uint(const msgpack_object *map, const char *key, uint64_t min, uint64_t max,
                     uint64_t *out, unsigned flags, struct sil_rpc_error *err);
/* float32/float64 or any integer. NaN is always out of range. */
int sil_rpc_get_double(const msgpack_object *map, const char *key, double min, double max,
                       double *out, unsigned flags, struct sil_rpc_error *err);
int sil_rpc_get_bool(const msgpack_object *map, const char *key, bool *out, unsigned flags,
                     struct sil_rpc_error *err);
/* *out points to the array / map object inside the message. */
int sil_rpc_get_array(const msgpack_object *map, const char *key, const msgpack_object **out,
                      unsigned flags, struct sil_rpc_error *err);
int sil_rpc_get_map(const msgpack_object *map, const char *key, const msgpack_object **out,
                    unsigned flags, struct sil_rpc_error *err);

/* Loose readers for clients printing results: the value or def when absent / wrong type. */
int64_t sil_rpc_map_int(const msgpack_object *map, const char *key, int64_t def);
double sil_rpc_map_double(const msgpack_object *map, const char *key, double def);
bool sil_rpc_map_bool(const msgpack_object *map, const char *key, bool def);
/* Copies a str/bin value into buf (NUL-terminated, truncated) and returns buf. When absent or
 * not a string: copies def into buf and returns buf, or, with def NULL, sets buf to "" and
 * returns NULL. */
const char *sil_rpc_map_str(const msgpack_object *map, const char *key, char *buf, size_t size,
                            const char *def);

/* Reads an error response's {code, message} (a bare string or int is accepted too). */
void sil_rpc_read_error(const msgpack_object *error, struct sil_rpc_error *err);

/* Writes o as JSON (str as UTF-8 text with escapes, bin as a string, ext as null, non-string
 * map keys stringified). indent < 0: compact, else pretty with that many spaces. */
int sil_rpc_print_json(FILE *f, const msgpack_object *o, int indent);
/* Writes the C string s (NULL: "") as a JSON string, escaped as sil_rpc_print_json does. */
int sil_rpc_print_json_str(FILE *f, const char *s);

/* ---- packing ---------------------------------------------------------------------------------- */

/* A growable output buffer with an optional hard limit (a server's per-connection output
 * queue): writes that would grow it past max fail, and the message being packed is removed. */
struct sil_rpc_buf {
    char *data;
    size_t off;  /* first byte not yet consumed (sent) */
    size_t len;  /* end of data */
    size_t cap;
    size_t max;  /* 0: unlimited */
    size_t mark; /* start of the message being packed */
    int failed;  /* a write failed since the last begin */
    msgpack_packer pk;
};

void sil_rpc_buf_init(struct sil_rpc_buf *b, size_t max);
void sil_rpc_buf_free(struct sil_rpc_buf *b);
static inline const char *sil_rpc_buf_head(const struct sil_rpc_buf *b) { return b->data + b->off; }
static inline size_t sil_rpc_buf_size(const struct sil_rpc_buf *b) { return b->len - b->off; }
/* Drops n sent bytes from the front. */
void sil_rpc_buf_consume(struct sil_rpc_buf *b, size_t n);
/* Appends n raw bytes (a message packed before): 0, or -ENOBUFS past the limit. */
int sil_rpc_buf_write(struct sil_rpc_buf *b, const void *p, size_t n);
void sil_rpc_buf_reset(struct sil_rpc_buf *b);

/* Start a message; the caller packs exactly one object (params or result) with the returned
 * packer, then calls sil_rpc_end(). */
msgpack_packer *sil_rpc_begin_request(struct sil_rpc_buf *b, uint32_t msgid, const char *method);
msgpack_packer *sil_rpc_begin_response(struct sil_rpc_buf *b, uint32_t msgid);
msgpack_packer *sil_rpc_begin_notification(struct sil_rpc_buf *b, const char *method);
/* [1, msgid, error, nil] with an error map of the caller's (code, message and more fields):
 * begin, pack the map, then end_error_response instead of sil_rpc_end. */
msgpack_packer *sil_rpc_begin_error_response(struct sil_rpc_buf *b, uint32_t msgid);
int sil_rpc_end_error_response(struct sil_rpc_buf *b);
/* 0, or -ENOBUFS (buffer limit or allocation failure) with the partial message removed. */
int sil_rpc_end(struct sil_rpc_buf *b);

/* Whole messages: [1, msgid, {code, message}, nil]; message NULL -> the code's default. */
int sil_rpc_pack_error_response(struct sil_rpc_buf *b, uint32_t msgid, int code,
                                const char *message);
/* [1, nil, {code, message}, nil]: an error about the connection, not about one request (a
 * refused peer, lost framing, a timeout); nil cannot collide with a client's msgid. */
int sil_rpc_pack_conn_error(struct sil_rpc_buf *b, int code, const char *message);
/* [2, "token", [{id, text, ids}]]: one streamed piece of the reply to request msgid. */
int sil_rpc_pack_token(struct sil_rpc_buf *b, uint32_t msgid, const char *text, size_t len,
                       const int32_t *ids, size_t n_ids);

/* Small helpers for packing maps (return msgpack's 0 / -1). */
int sil_rpc_pack_cstr(msgpack_packer *pk, const char *s); /* NULL packs nil */
int sil_rpc_pack_strn(msgpack_packer *pk, const char *s, size_t n);
int sil_rpc_kv_str(msgpack_packer *pk, const char *key, const char *val);
int sil_rpc_kv_strn(msgpack_packer *pk, const char *key, const char *val, size_t n);
int sil_rpc_kv_int(msgpack_packer *pk, const char *key, int64_t val);
int sil_rpc_kv_uint(msgpack_packer *pk, const char *key, uint64_t val);
int sil_rpc_kv_double(msgpack_packer *pk, const char *key, double val);
int sil_rpc_kv_bool(msgpack_packer *pk, const char *key, bool val);
int sil_rpc_kv_nil(msgpack_packer *pk, const char *key);

/* ---- Unix sockets ----------------------------------------------------------------------------- */

/* The socket path: override (--socket) if non-NULL and non-empty, else $SILICEO_SOCKET, else
 * $XDG_RUNTIME_DIR/siliceo/siliceod.sock for a user (without XDG_RUNTIME_DIR:
 * /run/user/<uid>/siliceo/siliceod.sock when /run/user/<uid> is the user's directory, else
 * /tmp/siliceo-<uid>/siliceod.sock) and /run/siliceo/siliceod.sock for root. 0 or
 * -ENAMETOOLONG. */
int sil_rpc_socket_path(const char *override, char *buf, size_t size);

/* The sockets a client tries, in order: only override or $SILICEO_SOCKET when set; else the
 * per-user socket (as above; not for root) then /run/siliceo/siliceod.sock, the system
 * service's. Returns how many were written (1 or 2) or -ENAMETOOLONG. */
#define SIL_RPC_SYSTEM_SOCKET "/run/siliceo/siliceod.sock"
#define SIL_RPC_MAX_CANDIDATES 2
int sil_rpc_socket_candidates(const char *override, char paths[][4096], int max);

/* A connected SOCK_STREAM | SOCK_CLOEXEC fd, or a negative errno. */
int sil_rpc_connect(const char *path, struct sil_rpc_error *err);
/* Connects to the first candidate that answers. On failure the error names every path tried
 * with its reason, then what they mean together: for EACCES the group that would let the user
 * in (or that none does, and whether the user was added to it after logging in), a socket no
 * daemon answers on, or that no daemon runs (the user's own socket named when it is missing);
 * the return is the most telling errno (-EACCES before -ECONNREFUSED before -ENOENT). */
int sil_rpc_connect_any(const char *override, struct sil_rpc_error *err);
/* A listening socket at path with the given mode (e.g. 0660). A stale socket file (nobody
 * listening) is replaced; a live one gives -EADDRINUSE. The parent directory must exist. */
int sil_rpc_listen(const char *path, mode_t mode, int backlog, struct sil_rpc_error *err);

/* ---- blocking client -------------------------------------------------------------------------- */

struct sil_rpc_client {
    int fd;
    uint32_t next_id;
    uint32_t pending_id; /* msgid of the call in progress */
    int timeout_ms;      /* whole-call deadline, <= 0: none */
    /* A call refused with error 13 and a retry_after_ms hint (the daemon reloading its model)
     * before any notification of it is sent again after the hint, for up to this many ms in
     * all (sil_rpc_client_open: 60000; 0: never; the call's timeout_ms bounds it too). */
    int retry_max_ms;
    struct sil_rpc_unpacker *up;
    struct sil_rpc_buf out;
    struct sil_rpc_msg resp; /* last response, owned by the client until the next call */
    bool have_resp;
    uint32_t cancel_id; /* msgid of a cancel sent from a callback: its response is swallowed */
    bool cancel_sent;
};

/* Called for each notification (and each response to another msgid) that arrives while a call
 * waits, and with msg == NULL when a signal interrupted the wait (check your flags, maybe call
 * sil_rpc_client_cancel()). Return 0 to keep waiting, a negative errno to abort the call. */
typedef int (*sil_rpc_notify_fn)(void *ud, const struct sil_rpc_msg *msg);

/* path NULL -> the candidates of sil_rpc_connect_any(NULL). */
int sil_rpc_client_open(struct sil_rpc_client *c, const char *path, struct sil_rpc_error *err);
/* Wraps an already connected fd (tests, socket pairs); the client owns it afterwards. */
int sil_rpc_client_init_fd(struct sil_rpc_client *c, int fd, struct sil_rpc_error *err);
void sil_rpc_client_close(struct sil_rpc_client *c);

/* Starts a request; pack exactly one params object (a map) with the returned packer, then
 * sil_rpc_client_call(). Returns NULL only on allocation failure. */
msgpack_packer *sil_rpc_client_begin(struct sil_rpc_client *c, const char *method);
/* Sends the request started by begin and waits for its response. On success returns 0 and
 * *result points to the result object (valid until the next call or close). When the server
 * answered with an error: -EREMOTEIO, err->code / msg are the server's; so too when it sent an
 * error about the connection (a nil msgid: refused peer, timeout; read even after a broken
 * pipe). Local failures: -ETIMEDOUT, -ECONNRESET (server closed), -EPROTO / -EBADMSG /
 * -EMSGSIZE (bad reply), other errno from the socket, or what notify returned. */
int sil_rpc_client_call(struct sil_rpc_client *c, sil_rpc_notify_fn notify, void *ud,
                        const msgpack_object **result, struct sil_rpc_error *err);
/* Shorthand: a call with an empty params map. */
int sil_rpc_client_call0(struct sil_rpc_client *c, const char *method, sil_rpc_notify_fn notify,
                         void *ud, const msgpack_object **result, struct sil_rpc_error *err);
/* From inside a notify callback: sends cancel {id: pending_id} without waiting (its response is
 * swallowed). */
int sil_rpc_client_cancel(struct sil_rpc_client *c, struct sil_rpc_error *err);

#ifdef __cplusplus
}
#endif

#endif
