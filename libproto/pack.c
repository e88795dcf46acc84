/* Packing RPC messages into a bounded, growable buffer. */
#include "siliceo-proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int buf_write(void *data, const char *p, size_t n)
{
    struct sil_rpc_buf *b = data;
    if (b->failed)
        return -1;
    if (n == 0)
        return 0; /* an empty string body may come with p == NULL */
    if (b->cap - b->len < n) {
        /* Reclaim consumed bytes before growing. */
        if (b->off > 0) { /* mark >= off: packing never overlaps sending */
            memmove(b->data, b->data + b->off, b->len - b->off);
            b->len -= b->off;
            b->mark -= b->off;
            b->off = 0;
        }
    }
    if (b->max && (b->len - b->off) + n > b->max) {
        b->failed = 1;
        return -1;
    }
    if (b->cap - b->len < n) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap - b->len < n)
            ncap *= 2;
        char *nd = realloc(b->data, ncap);
        if (!nd) {
            b->failed = 1;
            return -1;
        }
        b->data = nd;
        b->cap = ncap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

int sil_rpc_buf_write(struct sil_rpc_buf *b, const void *p, size_t n)
{
    return buf_write(b, p, n) < 0 ? -ENOBUFS : 0;
}

void sil_rpc_buf_init(struct sil_rpc_buf *b, size_t max)
{
    memset(b, 0, sizeof(*b));
    b->max = max;
    msgpack_packer_init(&b->pk, b, buf_write);
}

void sil_rpc_buf_free(struct sil_rpc_buf *b)
{
    free(b->data);
    b->data = NULL;
    b->off = b->len = b->cap = b->mark = 0;
}

void sil_rpc_buf_consume(struct sil_rpc_buf *b, size_t n)
{
    if (n > b->len - b->off)
        n = b->len - b->off;
    b->off += n;
    if (b->off == b->len)
        b->off = b->len = b->mark = 0;
}

void sil_rpc_buf_reset(struct sil_rpc_buf *b)
{
    b->off = b->len = b->mark = 0;
    b->failed = 0;
}

static msgpack_packer *begin(struct sil_rpc_buf *b)
{
    /* The packer may have been copied with the struct; point it back at this buffer. */
    msgpack_packer_init(&b->pk, b, buf_write);
    b->mark = b->len;
    b->failed = 0;
    return &b->pk;
}

msgpack_packer *sil_rpc_begin_request(struct sil_rpc_buf *b, uint32_t msgid, const char *method)
{
    msgpack_packer *pk = begin(b);
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint32(pk, SIL_RPC_REQUEST);
    msgpack_pack_uint32(pk, msgid);
    sil_rpc_pack_cstr(pk, method);
    return pk;
}

msgpack_packer *sil_rpc_begin_response(struct sil_rpc_buf *b, uint32_t msgid)
{
    msgpack_packer *pk = begin(b);
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint32(pk, SIL_RPC_RESPONSE);
    msgpack_pack_uint32(pk, msgid);
    msgpack_pack_nil(pk);
    return pk;
}

msgpack_packer *sil_rpc_begin_error_response(struct sil_rpc_buf *b, uint32_t msgid)
{
    msgpack_packer *pk = begin(b);
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint32(pk, SIL_RPC_RESPONSE);
    msgpack_pack_uint32(pk, msgid);
    return pk;
}

int sil_rpc_end_error_response(struct sil_rpc_buf *b)
{
    msgpack_pack_nil(&b->pk);
    return sil_rpc_end(b);
}

msgpack_packer *sil_rpc_begin_notification(struct sil_rpc_buf *b, const char *method)
{
    msgpack_packer *pk = begin(b);
    msgpack_pack_array(pk, 3);
    msgpack_pack_uint32(pk, SIL_RPC_NOTIFICATION);
    sil_rpc_pack_cstr(pk, method);
    return pk;
}

int sil_rpc_end(struct sil_rpc_buf *b)
{
    if (b->failed) {
        if (b->mark >= b->off)
            b->len = b->mark;
        b->failed = 0;
        return -ENOBUFS;
    }
    b->mark = b->len;
    return 0;
}

int sil_rpc_pack_error_response(struct sil_rpc_buf *b, uint32_t msgid, int code,
                                const char *message)
{
    msgpack_packer *pk = begin(b);
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint32(pk, SIL_RPC_RESPONSE);
    msgpack_pack_uint32(pk, msgid);
    msgpack_pack_map(pk, 2);
    sil_rpc_kv_int(pk, "code", code);
    sil_rpc_kv_str(pk, "message", message ? message : sil_rpc_code_message(code));
    msgpack_pack_nil(pk);
    return sil_rpc_end(b);
}

int sil_rpc_pack_conn_error(struct sil_rpc_buf *b, int code, const char *message)
{
    msgpack_packer *pk = begin(b);
    msgpack_pack_array(pk, 4);
    msgpack_pack_uint32(pk, SIL_RPC_RESPONSE);
    msgpack_pack_nil(pk);
    msgpack_pack_map(pk, 2);
    sil_rpc_kv_int(pk, "code", code);
    sil_rpc_kv_str(pk, "message", message ? message : sil_rpc_code_message(code));
    msgpack_pack_nil(pk);
    return sil_rpc_end(b);
}

int sil_rpc_pack_token(struct sil_rpc_buf *b, uint32_t msgid, const char *text, size_t len,
                       const int32_t *ids, size_t n_ids)
{
    msgpack_packer *pk = sil_rpc_begin_notification(b, "token");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 3);
    sil_rpc_kv_uint(pk, "id", msgid);
    sil_rpc_kv_strn(pk, "text", text, len);
    sil_rpc_pack_cstr(pk, "ids");
    msgpack_pack_array(pk, (uint32_t)n_ids);
    for (size_t i = 0; i < n_ids; i++)
        msgpack_pack_int32(pk, ids[i]);
    return sil_rpc_end(b);
}

int sil_rpc_pack_cstr(msgpack_packer *pk, const char *s)
{
    if (!s)
        return msgpack_pack_nil(pk);
    return sil_rpc_pack_strn(pk, s, strlen(s));
}

int sil_rpc_pack_strn(msgpack_packer *pk, const char *s, size_t n)
{
    if (msgpack_pack_str(pk, n) < 0)
        return -1;
    return msgpack_pack_str_body(pk, s, n);
}

int sil_rpc_kv_str(msgpack_packer *pk, const char *key, const char *val)
{
    return sil_rpc_pack_cstr(pk, key) | sil_rpc_pack_cstr(pk, val);
}

int sil_rpc_kv_strn(msgpack_packer *pk, const char *key, const char *val, size_t n)
{
    return sil_rpc_pack_cstr(pk, key) | sil_rpc_pack_strn(pk, val, n);
}

int sil_rpc_kv_int(msgpack_packer *pk, const char *key, int64_t val)
{
    return sil_rpc_pack_cstr(pk, key) | msgpack_pack_int64(pk, val);
}

int sil_rpc_kv_uint(msgpack_packer *pk, const char *key, uint64_t val)
{
    return sil_rpc_pack_cstr(pk, key) | msgpack_pack_uint64(pk, val);
}

int sil_rpc_kv_double(msgpack_packer *pk, const char *key, double val)
{
    return sil_rpc_pack_cstr(pk, key) | msgpack_pack_double(pk, val);
}

int sil_rpc_kv_bool(msgpack_packer *pk, const char *key, bool val)
{
    return sil_rpc_pack_cstr(pk, key) | (val ? msgpack_pack_true(pk) : msgpack_pack_false(pk));
}

int sil_rpc_kv_nil(msgpack_packer *pk, const char *key)
{
    return sil_rpc_pack_cstr(pk, key) | msgpack_pack_nil(pk);
}
