/* The OpenAI API side of sil-openai, without any HTTP: a request body is checked and turned into
 * the params of the daemon's chat or generate method (siliceo-rpc(7)); daemon results and token
 * notifications are turned into OpenAI response objects and stream chunks. Kept apart from the
 * server so tests/fuzz/fuzz_openai_json.c can drive it with arbitrary bytes. */
#ifndef SIL_OPENAI_H
#define SIL_OPENAI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "siliceo-proto.h"
#include "client/sil-openai/json.h"

enum sil_oa_kind { SIL_OA_CHAT, SIL_OA_COMPLETION };

/* An OpenAI-style error: HTTP status and the fields of {"error": {message, type, param, code}}. */
struct sil_oa_fail {
    int status;
    const char *type; /* "invalid_request_error", ... */
    const char *code; /* NULL or e.g. "context_length_exceeded" */
    char param[96];   /* "" for null */
    char msg[512];
};

int sil_oa_failf(struct sil_oa_fail *f, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* What the server needs to know about a parsed request. */
struct sil_oa_req {
    enum sil_oa_kind kind;
    bool stream;
    bool include_usage; /* stream_options.include_usage */
    char model[160];    /* the request's model, sent to the daemon, which picks it by name; "" none */
};

/* Daemon features the translation depends on (from the hello capabilities). */
struct sil_oa_caps {
    bool logit_bias;
    bool priority; /* priority classes and priority_level */
};

/* Checks body and packs the request [0, msgid, "chat" | "generate", params] into out.
 * 0, or -EINVAL with f filled (status 400 or 413) / -ENOMEM. */
int sil_oa_request(enum sil_oa_kind kind, const char *body, size_t len,
                   const struct sil_oa_caps *caps, uint32_t msgid, struct sil_rpc_buf *out,
                   struct sil_oa_req *req, struct sil_oa_fail *f);

/* A daemon error response {code, message} as an OpenAI error. */
void sil_oa_fail_from_rpc(struct sil_oa_fail *f, int code, const char *message);

/* {"error": {...}} */
void sil_oa_format_error(struct sil_oa_buf *b, const struct sil_oa_fail *f);

/* Identity of one response, the same in every chunk of a stream. */
struct sil_oa_resp {
    enum sil_oa_kind kind;
    char id[48];
    long long created;
    const char *model;
};

/* "stop" / "length" (for "context" too) from the daemon's stop_reason; NULL for an ending that
 * is no finish (cancelled, shutdown, error). */
const char *sil_oa_finish_reason(const char *stop_reason, size_t len);

/* The whole chat.completion / text_completion object from the daemon's result map. */
int sil_oa_format_result(struct sil_oa_buf *b, const struct sil_oa_resp *r,
                         const msgpack_object *result, struct sil_oa_fail *f);
/* One SSE event "data: {chunk}\n\n": a delta with text and / or reasoning (either may be
 * empty), the role on the first chunk, finish_reason (NULL: null). */
void sil_oa_format_chunk(struct sil_oa_buf *b, const struct sil_oa_resp *r, bool first,
                         const char *text, size_t text_len, const char *reasoning,
                         size_t reasoning_len, const char *finish, bool usage_null);
/* The last chunk of a stream with include_usage: empty choices and the usage object. */
void sil_oa_format_usage_chunk(struct sil_oa_buf *b, const struct sil_oa_resp *r,
                               const msgpack_object *result);
/* "usage": {...} from the result map (no leading comma). */
void sil_oa_format_usage(struct sil_oa_buf *b, const msgpack_object *result);

/* One request of the request log: what was asked and how it ended, counts and times only,
 * never the prompt or the answer. Owned by the HTTP connection serving the request. */
struct sil_oa_reqlog {
    char method[16];
    char path[128];
    bool path_cut;   /* the path was longer */
    char id[48];     /* the response id, "" for other endpoints */
    int status;      /* the HTTP status sent, 0: none */
    char model[160]; /* "" : not a generation */
    bool stream;
    char stop[32]; /* the daemon's stop_reason or error code, "" when none came */
    long long n_prompt, n_cached, n_generated; /* -1: not known */
    bool client_gone;                          /* the HTTP client hung up before the end */
    const char *ended_early; /* why the connection ended before the answer did, NULL: it did not */
    double t_start;          /* sil_client_now() when the request came */
};

void sil_oa_reqlog_start(struct sil_oa_reqlog *l, const char *method, const char *path, double now);
/* stop_reason, n_prompt, n_cached and n_generated from the daemon's result map. */
void sil_oa_reqlog_counts(struct sil_oa_reqlog *l, const msgpack_object *result);
/* The line, without a newline, cut to size - 1 bytes; the peer's bytes (method, path) and the
 * model name in printable ASCII, others as \xHH. Returns the length it would have had. */
size_t sil_oa_reqlog_format(char *buf, size_t size, const struct sil_oa_reqlog *l, double now);

/* The chat page: chat.html (at / and /index.html), its style sheet /chat.css and its script
 * /chat.js, embedded in the binary. data is static and never NUL-terminated. */
struct sil_oa_page_file {
    const char *type; /* Content-Type */
    const char *data;
    size_t len;
};
/* The page's file served at url: 0 and *out filled (out may be NULL), or -ENOENT. */
int sil_oa_page_file(const char *url, struct sil_oa_page_file *out);
/* Its entity tag, a quoted hash of its bytes, for ETag and If-None-Match. */
void sil_oa_page_etag(const struct sil_oa_page_file *f, char *buf, size_t size);
/* The page's Content-Security-Policy: its own style sheet and script from the bridge that served
 * it (nothing inline), requests to that bridge, nothing else (no other origin, no frames, no
 * forms, no plugins). */
#define SIL_OA_PAGE_CSP                                                                            \
    "default-src 'none'; script-src 'self'; style-src 'self'; "                                    \
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

#endif
