/* Incremental, bounded framing of msgpack-RPC messages. A small scanner walks the msgpack
 * headers as bytes arrive (resuming where it stopped), so it knows where a message ends, its
 * size and depth, before msgpack-c allocates anything for it. */
#include "siliceo-proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define FEED_SLACK (1u << 20)

struct sil_rpc_unpacker {
    char *buf;
    size_t cap;
    size_t start; /* first byte of the message being scanned */
    size_t scan;  /* next header to read */
    size_t end;   /* end of buffered bytes */
    size_t max_msg;
    unsigned max_depth;
    unsigned depth;
    uint32_t rem[SIL_RPC_MAX_DEPTH_LIMIT]; /* elements left in each open container */
    int fatal;                             /* sticky error */
    struct sil_rpc_error fatal_err;
};

struct msg_priv {
    msgpack_unpacked up;
    size_t len;
    char data[];
};

struct sil_rpc_unpacker *sil_rpc_unpacker_new(size_t max_msg, unsigned max_depth)
{
    struct sil_rpc_unpacker *u = calloc(1, sizeof(*u));
    if (!u)
        return NULL;
    u->max_msg = max_msg ? max_msg : SIL_RPC_DEFAULT_MAX_MSG;
    u->max_depth = max_depth ? max_depth : SIL_RPC_DEFAULT_MAX_DEPTH;
    if (u->max_depth > SIL_RPC_MAX_DEPTH_LIMIT)
        u->max_depth = SIL_RPC_MAX_DEPTH_LIMIT;
    return u;
}

void sil_rpc_unpacker_free(struct sil_rpc_unpacker *u)
{
    if (!u)
        return;
    free(u->buf);
    free(u);
}

size_t sil_rpc_unpacker_pending(const struct sil_rpc_unpacker *u) { return u->end - u->start; }

static void compact(struct sil_rpc_unpacker *u)
{
    if (u->start == 0)
        return;
    memmove(u->buf, u->buf + u->start, u->end - u->start);
    u->scan -= u->start;
    u->end -= u->start;
    u->start = 0;
}

void *sil_rpc_unpacker_space(struct sil_rpc_unpacker *u, size_t want, size_t *avail)
{
    *avail = 0;
    if (want == 0)
        want = 1;
    compact(u);
    size_t limit = u->max_msg + FEED_SLACK;
    if (u->end >= limit)
        return NULL;
    if (want > limit - u->end)
        want = limit - u->end;
    if (u->cap - u->end < want) {
        size_t ncap = u->cap ? u->cap : 4096;
        while (ncap - u->end < want)
            ncap *= 2;
        if (ncap > limit)
            ncap = limit;
        char *nb = realloc(u->buf, ncap);
        if (!nb)
            return NULL;
        u->buf = nb;
        u->cap = ncap;
    }
    *avail = u->cap - u->end;
    return u->buf + u->end;
}

void sil_rpc_unpacker_commit(struct sil_rpc_unpacker *u, size_t n)
{
    if (n > u->cap - u->end)
        n = u->cap - u->end; /* programmer error; never run past the buffer */
    u->end += n;
}

int sil_rpc_unpacker_feed(struct sil_rpc_unpacker *u, const void *data, size_t n,
                          struct sil_rpc_error *err)
{
    const char *p = data;
    while (n > 0) {
        size_t avail;
        char *dst = sil_rpc_unpacker_space(u, n, &avail);
        if (!dst)
            return sil_rpc_errorf(err, -ENOBUFS, SIL_RPC_E_TOO_LARGE,
                                  "input buffer full: %zu bytes pending (limit %zu)",
                                  u->end - u->start, u->max_msg + FEED_SLACK);
        size_t k = avail < n ? avail : n;
        memcpy(dst, p, k);
        u->end += k;
        p += k;
        n -= k;
    }
    return 0;
}

static uint32_t be16(const unsigned char *p) { return (uint32_t)p[0] << 8 | p[1]; }
static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Reads the header at p (avail bytes). Returns the header length (0: need more bytes, -1:
 * invalid byte); *payload gets the bytes that follow it, *children the elements it opens. */
static int header(const unsigned char *p, size_t avail, uint64_t *payload, uint64_t *children,
                  bool *container)
{
    unsigned c = p[0];
    *payload = 0;
    *children = 0;
    *container = false;
    if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3)
        return 1;
    if ((c & 0xe0) == 0xa0) {
        *payload = c & 0x1f;
        return 1;
    }
    if ((c & 0xf0) == 0x90 || (c & 0xf0) == 0x80) {
        *container = true;
        *children = (c & 0x0f) * ((c & 0xf0) == 0x80 ? 2u : 1u);
        return 1;
    }
    static const unsigned char need[] = {
        /* c4..df */
        2, 3, 5, /* bin8/16/32 */
        3, 4, 6, /* ext8/16/32 */
        5, 9,    /* float32/64 */
        2, 3, 5, 9, /* uint8..64 */
        2, 3, 5, 9, /* int8..64 */
        3, 4, 6, 10, 18, /* fixext1..16 */
        2, 3, 5, /* str8/16/32 */
        3, 5,    /* array16/32 */
        3, 5,    /* map16/32 */
    };
    if (c == 0xc1)
        return -1;
    unsigned h = need[c - 0xc4];
    if (avail < h)
        return 0;
    switch (c) {
    case 0xc4: case 0xd9: *payload = p[1]; break;
    case 0xc5: case 0xda: *payload = be16(p + 1); break;
    case 0xc6: case 0xdb: *payload = be32(p + 1); break;
    case 0xc7: *payload = p[1]; break; /* ext: the type byte is inside h */
    case 0xc8: *payload = be16(p + 1); break;
    case 0xc9: *payload = be32(p + 1); break;
    case 0xdc: *container = true; *children = be16(p + 1); break;
    case 0xdd: *container = true; *children = be32(p + 1); break;
    case 0xde: *container = true; *children = 2ull * be16(p + 1); break;
    case 0xdf: *container = true; *children = 2ull * be32(p + 1); break;
    default: break; /* fixed-size scalar, fixext: all in h */
    }
    return (int)h;
}

static int fail(struct sil_rpc_unpacker *u, int ret, int code, struct sil_rpc_error *err,
                const char *fmt, size_t a, size_t b)
{
    u->fatal = ret;
    sil_rpc_errorf(&u->fatal_err, ret, code, fmt, a, b);
    if (err)
        *err = u->fatal_err;
    return ret;
}

/* 1: a message ends at u->scan; 0: need more bytes; <0: fatal. */
static int scan(struct sil_rpc_unpacker *u, struct sil_rpc_error *err)
{
    for (;;) {
        size_t avail = u->end - u->scan;
        size_t used = u->scan - u->start;
        if (avail == 0) /* buf may still be NULL: no pointer arithmetic on it before this */
            return 0;
        const unsigned char *p = (const unsigned char *)u->buf + u->scan;
        uint64_t payload, children;
        bool container;
        int h = header(p, avail, &payload, &children, &container);
        if (h < 0)
            return fail(u, -EBADMSG, SIL_RPC_E_PARSE, err,
                        "byte offset %zu in message: invalid msgpack type byte (message at +%zu)",
                        used, u->start);
        if (h == 0) {
            if (used + avail >= u->max_msg) /* the header alone runs past the limit */
                goto too_large;
            return 0;
        }
        uint64_t total = (uint64_t)h + payload;
        if (used + total > u->max_msg)
            goto too_large;
        if (container && children > u->max_msg - used - total)
            goto too_large; /* every element takes at least one byte */
        if (avail < total)
            return 0;
        u->scan += total;
        if (container && children > 0) {
            if (u->depth >= u->max_depth)
                return fail(u, -EBADMSG, SIL_RPC_E_PARSE, err,
                            "byte offset %zu in message: nested deeper than %zu", used,
                            u->max_depth);
            if (children > UINT32_MAX) /* map32 of 2^31+ pairs, only with max_msg >= 4 GiB */
                goto too_large;
            u->rem[u->depth++] = (uint32_t)children;
            continue;
        }
        if (container && u->depth >= u->max_depth)
            return fail(u, -EBADMSG, SIL_RPC_E_PARSE, err,
                        "byte offset %zu in message: nested deeper than %zu", used, u->max_depth);
        for (;;) {
            if (u->depth == 0)
                return 1;
            if (--u->rem[u->depth - 1] > 0)
                break;
            u->depth--;
        }
    }
too_large:
    return fail(u, -EMSGSIZE, SIL_RPC_E_TOO_LARGE, err,
                "message over the limit of %zu bytes (message at +%zu)", u->max_msg, u->start);
}

void sil_rpc_msg_release(struct sil_rpc_msg *msg)
{
    if (!msg || !msg->priv_)
        return;
    struct msg_priv *pv = msg->priv_;
    msgpack_unpacked_destroy(&pv->up);
    free(pv);
    msg->priv_ = NULL;
    msg->params = msg->error = msg->result = NULL;
}

static int invalid(struct sil_rpc_msg *msg, struct sil_rpc_error *err, int code, const char *what)
{
    sil_rpc_msg_release(msg);
    return sil_rpc_errorf(err, -EPROTO, code, "%s", what);
}

/* params: a map, nil, [] or [map] (generic msgpack-RPC clients send an argument array). */
static int params_of(const msgpack_object *o, const msgpack_object **out)
{
    *out = NULL;
    if (o->type == MSGPACK_OBJECT_MAP) {
        *out = o;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NIL)
        return 0;
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        if (o->via.array.size == 0)
            return 0;
        const msgpack_object *e = &o->via.array.ptr[0];
        if (o->via.array.size == 1 && e->type == MSGPACK_OBJECT_MAP) {
            *out = e;
            return 0;
        }
        if (o->via.array.size == 1 && e->type == MSGPACK_OBJECT_NIL)
            return 0;
    }
    return -1;
}

static int method_of(const msgpack_object *o, struct sil_rpc_msg *msg)
{
    const char *s;
    size_t n;
    if (o->type == MSGPACK_OBJECT_STR) {
        s = o->via.str.ptr;
        n = o->via.str.size;
    } else if (o->type == MSGPACK_OBJECT_BIN) {
        s = o->via.bin.ptr;
        n = o->via.bin.size;
    } else {
        return -1;
    }
    if (n == 0 || n >= sizeof(msg->method) || memchr(s, 0, n))
        return -1;
    memcpy(msg->method, s, n);
    msg->method[n] = 0;
    return 0;
}

/* Checks the RPC shape of a decoded message and fills the fields of msg. */
static int validate(struct sil_rpc_msg *msg, struct sil_rpc_error *err)
{
    const msgpack_object *r = &msg->root;
    if (r->type != MSGPACK_OBJECT_ARRAY || r->via.array.size < 3)
        return invalid(msg, err, SIL_RPC_E_INVALID_REQUEST,
                       "message is not an array of 3 or 4 elements");
    const msgpack_object *a = r->via.array.ptr;
    uint32_t n = r->via.array.size;
    if (a[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[0].via.u64 > 2)
        return invalid(msg, err, SIL_RPC_E_INVALID_REQUEST,
                       "element 0 (type) is not 0, 1 or 2");
    msg->type = (int)a[0].via.u64;
    /* A response with a nil msgid answers no request: siliceod's errors about the connection. */
    bool conn_error = msg->type == SIL_RPC_RESPONSE && a[1].type == MSGPACK_OBJECT_NIL;
    if (msg->type != SIL_RPC_NOTIFICATION && !conn_error) {
        if (a[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER || a[1].via.u64 > UINT32_MAX)
            return invalid(msg, err, SIL_RPC_E_INVALID_REQUEST,
                           "element 1 (msgid) is not an unsigned 32-bit integer");
        msg->msgid = (uint32_t)a[1].via.u64;
        msg->has_msgid = true;
    }
    switch (msg->type) {
    case SIL_RPC_REQUEST:
        if (n != 4)
            return invalid(msg, err, SIL_RPC_E_INVALID_REQUEST, "request is not [0, msgid, method, params]");
        if (method_of(&a[2], msg) < 0)
            return invalid(msg, err, SIL_RPC_E_INVALID_REQUEST,
                           "element 2 (method) is not a string of 1 to 63 bytes");
        if (params_of(&a[3], &msg->params) < 0)
            return invalid(msg, err, SIL_RPC_E_INVALID_PARAMS,
                           "element 3 (params) is not a map (or [map], [] or nil)");
        break;
    case SIL_RPC_RESPONSE:
        if (n != 4)
            return invalid(msg, err, SIL_RPC_E_INVALID_REQUEST, "response is not [1, msgid, error, result]");
        msg->error = a[2].type == MSGPACK_OBJECT_NIL ? NULL : &a[2];
        msg->result = &a[3];
        break;
    case SIL_RPC_NOTIFICATION:
        if (n != 3)
            return invalid(msg, err, SIL_RPC_E_INVALID_REQUEST, "notification is not [2, method, params]");
        if (method_of(&a[1], msg) < 0)
            return invalid(msg, err, SIL_RPC_E_INVALID_REQUEST,
                           "element 1 (method) is not a string of 1 to 63 bytes");
        if (params_of(&a[2], &msg->params) < 0)
            return invalid(msg, err, SIL_RPC_E_INVALID_PARAMS,
                           "element 2 (params) is not a map (or [map], [] or nil)");
        break;
    }
    return 1;
}

/* Decodes the complete message data[0..n) (already scanned) into msg. */
static int decode_scanned(const char *data, size_t n, struct sil_rpc_msg *msg,
                          struct sil_rpc_error *err)
{
    memset(msg, 0, sizeof(*msg));
    msg->type = -1;
    msg->size = n;
    struct msg_priv *pv = malloc(sizeof(*pv) + n);
    if (!pv)
        return sil_rpc_errorf(err, -ENOMEM, SIL_RPC_E_INTERNAL, "out of memory for a %zu-byte message", n);
    memcpy(pv->data, data, n);
    pv->len = n;
    msgpack_unpacked_init(&pv->up);
    msg->priv_ = pv;
    size_t off = 0;
    msgpack_unpack_return ret = msgpack_unpack_next(&pv->up, pv->data, n, &off);
    if (ret != MSGPACK_UNPACK_SUCCESS || off != n) {
        sil_rpc_msg_release(msg);
        if (ret == MSGPACK_UNPACK_NOMEM_ERROR)
            return sil_rpc_errorf(err, -ENOMEM, SIL_RPC_E_INTERNAL,
                                  "out of memory decoding a %zu-byte message", n);
        return sil_rpc_errorf(err, -EBADMSG, SIL_RPC_E_PARSE,
                              "msgpack decoder rejected a %zu-byte message (%d)", n, (int)ret);
    }
    msg->root = pv->up.data;
    return validate(msg, err);
}

int sil_rpc_unpacker_next(struct sil_rpc_unpacker *u, struct sil_rpc_msg *msg,
                          struct sil_rpc_error *err)
{
    memset(msg, 0, sizeof(*msg));
    msg->type = -1;
    if (u->fatal) {
        if (err)
            *err = u->fatal_err;
        return u->fatal;
    }
    int r = scan(u, err);
    if (r <= 0)
        return r;
    size_t n = u->scan - u->start;
    r = decode_scanned(u->buf + u->start, n, msg, err);
    u->start = u->scan;
    if (u->start == u->end)
        u->start = u->scan = u->end = 0;
    if (r == -EBADMSG || r == -ENOMEM) {
        u->fatal = r;
        if (err)
            u->fatal_err = *err;
    }
    return r;
}

int sil_rpc_decode(const void *data, size_t n, size_t max_msg, unsigned max_depth,
                   struct sil_rpc_msg *msg, struct sil_rpc_error *err)
{
    memset(msg, 0, sizeof(*msg));
    msg->type = -1;
    struct sil_rpc_unpacker u = {0};
    u.buf = (char *)data;
    u.end = u.cap = n;
    u.max_msg = max_msg ? max_msg : SIL_RPC_DEFAULT_MAX_MSG;
    u.max_depth = max_depth ? max_depth : SIL_RPC_DEFAULT_MAX_DEPTH;
    if (u.max_depth > SIL_RPC_MAX_DEPTH_LIMIT)
        u.max_depth = SIL_RPC_MAX_DEPTH_LIMIT;
    int r = scan(&u, err);
    if (r == 0)
        return sil_rpc_errorf(err, -EBADMSG, SIL_RPC_E_PARSE,
                              "truncated message: %zu bytes, more expected", n);
    if (r < 0)
        return r;
    if (u.scan != n)
        return sil_rpc_errorf(err, -EBADMSG, SIL_RPC_E_PARSE,
                              "byte offset %zu: %zu trailing bytes after the message", u.scan,
                              n - u.scan);
    return decode_scanned(data, n, msg, err);
}
