/* libproto: framing, validation, field access, packing, sockets and the blocking client. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "siliceo-proto.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- helpers ---------------------------------------------------------------------------------- */

struct raw {
    msgpack_sbuffer sb;
    msgpack_packer pk;
};

static void raw_init(struct raw *r)
{
    msgpack_sbuffer_init(&r->sb);
    msgpack_packer_init(&r->pk, &r->sb, msgpack_sbuffer_write);
}

static void raw_free(struct raw *r) { msgpack_sbuffer_destroy(&r->sb); }


/* A request with a few typed params, as a server would receive it. */
static void pack_sample_request(struct sil_rpc_buf *b, uint32_t id)
{
    msgpack_packer *pk = sil_rpc_begin_request(b, id, "generate");
    msgpack_pack_map(pk, 6);
    sil_rpc_kv_str(pk, "prompt", "Hello");
    sil_rpc_kv_int(pk, "max_tokens", 32);
    sil_rpc_kv_double(pk, "temperature", 0.5);
    sil_rpc_kv_bool(pk, "think", true);
    sil_rpc_pack_cstr(pk, "stop");
    msgpack_pack_array(pk, 2);
    sil_rpc_pack_cstr(pk, "\n\n");
    sil_rpc_pack_cstr(pk, "END");
    sil_rpc_kv_nil(pk, "session");
    assert_int_equal(sil_rpc_end(b), 0);
}

static char *mem_json(const msgpack_object *o, int indent)
{
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    assert_non_null(f);
    assert_int_equal(sil_rpc_print_json(f, o, indent), 0);
    fclose(f);
    return s;
}

/* ---- codes ------------------------------------------------------------------------------------ */

static void test_codes(void **state)
{
    assert_string_equal(sil_rpc_code_name(SIL_RPC_E_PARSE), "parse_error");
    assert_string_equal(sil_rpc_code_name(SIL_RPC_E_INVALID_PARAMS), "invalid_params");
    assert_string_equal(sil_rpc_code_name(SIL_RPC_E_VERSION), "version_mismatch");
    assert_string_equal(sil_rpc_code_name(99), "unknown");
    assert_string_equal(sil_rpc_code_name(-1), "unknown");
    assert_int_equal(SIL_RPC_E_PARSE, 1);
    assert_int_equal(SIL_RPC_E_NOT_FOUND, 9);
    assert_int_equal(SIL_RPC_E_VERSION, 12);
    for (int c = 1; c < SIL_RPC_CODE_COUNT; c++) {
        assert_true(strlen(sil_rpc_code_message(c)) > 0);
        assert_string_not_equal(sil_rpc_code_name(c), "unknown");
    }
    struct sil_rpc_error e;
    assert_int_equal(sil_rpc_errorf(&e, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "x=%d", 3), -EINVAL);
    assert_int_equal(e.code, SIL_RPC_E_INVALID_PARAMS);
    sil_rpc_error_prefix(&e, "generate");
    assert_string_equal(e.msg, "generate: x=3");
    assert_int_equal(sil_rpc_errorf(NULL, -EIO, 1, "ignored"), -EIO);
    assert_int_equal(SIL_RPC_E_UNAVAILABLE, 13);
    assert_string_equal(sil_rpc_code_name(SIL_RPC_E_UNAVAILABLE), "model_unavailable");
    assert_int_equal(SIL_RPC_E_TIMEOUT, 14);
    assert_string_equal(sil_rpc_code_name(SIL_RPC_E_TIMEOUT), "timeout");
    assert_int_equal(SIL_RPC_E_CONTEXT_FULL, 15); /* numbers are the protocol's */
    assert_string_equal(sil_rpc_code_name(SIL_RPC_E_CONTEXT_FULL), "context_full");
    assert_int_equal(SIL_RPC_E_MODEL_NOT_FOUND, 16);
    assert_string_equal(sil_rpc_code_name(SIL_RPC_E_MODEL_NOT_FOUND), "model_not_found");
}

/* A connection error is a response with a nil msgid: it decodes, and names no request. */
static void test_conn_error(void **state)
{
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 0);
    assert_int_equal(sil_rpc_pack_conn_error(&b, SIL_RPC_E_PERMISSION, "uid 7 is not allowed"), 0);
    const unsigned char *d = (const unsigned char *)sil_rpc_buf_head(&b);
    assert_int_equal(d[0], 0x94);
    assert_int_equal(d[1], 0x01);
    assert_int_equal(d[2], 0xc0); /* nil, not 0: no client msgid can be mistaken for it */
    struct sil_rpc_msg m;
    struct sil_rpc_error err = {0};
    assert_int_equal(sil_rpc_decode(d, sil_rpc_buf_size(&b), 0, 0, &m, &err), 1);
    assert_int_equal(m.type, SIL_RPC_RESPONSE);
    assert_false(m.has_msgid);
    assert_non_null(m.error);
    struct sil_rpc_error re = {0};
    sil_rpc_read_error(m.error, &re);
    assert_int_equal(re.code, SIL_RPC_E_PERMISSION);
    assert_string_equal(re.msg, "uid 7 is not allowed");
    sil_rpc_msg_release(&m);
    /* A request still needs an integer msgid. */
    static const unsigned char bad[] = {0x94, 0x00, 0xc0, 0xa1, 'x', 0x80};
    assert_int_equal(sil_rpc_decode(bad, sizeof bad, 0, 0, &m, &err), -EPROTO);
    sil_rpc_buf_free(&b);
}

/* ---- round trips ------------------------------------------------------------------------------ */

static void test_round_trip_request(void **state)
{
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 0);
    pack_sample_request(&b, 77);
    struct sil_rpc_msg m;
    struct sil_rpc_error e = {0};
    assert_int_equal(sil_rpc_decode(sil_rpc_buf_head(&b), sil_rpc_buf_size(&b), 0, 0, &m, &e), 1);
    assert_int_equal(m.type, SIL_RPC_REQUEST);
    assert_int_equal(m.msgid, 77);
    assert_true(m.has_msgid);
    assert_string_equal(m.method, "generate");
    assert_int_equal(m.size, sil_rpc_buf_size(&b));
    assert_non_null(m.params);

    char prompt[16];
    assert_int_equal(sil_rpc_get_strbuf(m.params, "prompt", prompt, sizeof(prompt), SIL_RPC_REQUIRED, &e), 1);
    assert_string_equal(prompt, "Hello");
    int64_t mt = 0;
    assert_int_equal(sil_rpc_get_int(m.params, "max_tokens", 1, 1000, &mt, SIL_RPC_REQUIRED, &e), 1);
    assert_int_equal(mt, 32);
    uint64_t umt = 0;
    assert_int_equal(sil_rpc_get_uint(m.params, "max_tokens", 0, 100, &umt, 0, &e), 1);
    assert_int_equal(umt, 32);
    double t = 0;
    assert_int_equal(sil_rpc_get_double(m.params, "temperature", 0, 2, &t, 0, &e), 1);
    assert_true(t == 0.5);
    bool think = false;
    assert_int_equal(sil_rpc_get_bool(m.params, "think", &think, 0, &e), 1);
    assert_true(think);
    const msgpack_object *stop = NULL;
    assert_int_equal(sil_rpc_get_array(m.params, "stop", &stop, 0, &e), 1);
    assert_int_equal(stop->via.array.size, 2);
    assert_int_equal(stop->via.array.ptr[1].via.str.size, 3);
    /* nil with NULLABLE is absent; without it, it is a wrong type. */
    const msgpack_object *sess = NULL;
    assert_int_equal(sil_rpc_get_map(m.params, "session", &sess, SIL_RPC_NULLABLE, &e), 0);
    assert_null(sess);
    char sbuf[8];
    assert_int_equal(sil_rpc_get_strbuf(m.params, "session", sbuf, sizeof(sbuf), 0, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "'session'"));
    assert_non_null(strstr(e.msg, "nil"));

    /* The message owns its memory: the packing buffer can go first. */
    sil_rpc_buf_free(&b);
    assert_int_equal(sil_rpc_map_int(m.params, "max_tokens", -1), 32);
    sil_rpc_msg_release(&m);
    assert_null(m.priv_);
    sil_rpc_msg_release(&m); /* twice is harmless */
}

static void test_round_trip_response_and_error(void **state)
{
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 0);
    msgpack_packer *pk = sil_rpc_begin_response(&b, 5);
    msgpack_pack_map(pk, 2);
    sil_rpc_kv_str(pk, "text", "hi");
    sil_rpc_kv_uint(pk, "n_generated", 2);
    assert_int_equal(sil_rpc_end(&b), 0);
    size_t first = sil_rpc_buf_size(&b);
    assert_int_equal(sil_rpc_pack_error_response(&b, 6, SIL_RPC_E_NOT_FOUND, "no session 'x'"), 0);
    assert_int_equal(sil_rpc_pack_error_response(&b, 7, SIL_RPC_E_BUSY, NULL), 0);

    struct sil_rpc_msg m;
    struct sil_rpc_error e;
    assert_int_equal(sil_rpc_decode(sil_rpc_buf_head(&b), first, 0, 0, &m, &e), 1);
    assert_int_equal(m.type, SIL_RPC_RESPONSE);
    assert_int_equal(m.msgid, 5);
    assert_null(m.error);
    assert_int_equal(m.result->type, MSGPACK_OBJECT_MAP);
    char text[8];
    assert_string_equal(sil_rpc_map_str(m.result, "text", text, sizeof(text), "?"), "hi");
    assert_string_equal(sil_rpc_map_str(m.result, "nope", text, sizeof(text), "?"), "?");
    assert_string_equal(text, "?");
    assert_null(sil_rpc_map_str(m.result, "nope", text, sizeof(text), NULL));
    assert_string_equal(text, "");
    assert_null(sil_rpc_map_str(m.result, "n_generated", text, sizeof(text), NULL));
    sil_rpc_msg_release(&m);

    struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(0, 0);
    assert_int_equal(sil_rpc_unpacker_feed(u, sil_rpc_buf_head(&b) + first, sil_rpc_buf_size(&b) - first, &e), 0);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), 1);
    assert_int_equal(m.msgid, 6);
    assert_non_null(m.error);
    sil_rpc_read_error(m.error, &e);
    assert_int_equal(e.code, SIL_RPC_E_NOT_FOUND);
    assert_string_equal(e.msg, "no session 'x'");
    assert_int_equal(m.result->type, MSGPACK_OBJECT_NIL);
    sil_rpc_msg_release(&m);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), 1);
    sil_rpc_read_error(m.error, &e);
    assert_int_equal(e.code, SIL_RPC_E_BUSY);
    assert_string_equal(e.msg, sil_rpc_code_message(SIL_RPC_E_BUSY));
    sil_rpc_msg_release(&m);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), 0);
    assert_int_equal(sil_rpc_unpacker_pending(u), 0);
    sil_rpc_unpacker_free(u);
    sil_rpc_buf_free(&b);
}

static void test_token_notification(void **state)
{
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 0);
    int32_t ids[3] = {151643, 0, -1};
    assert_int_equal(sil_rpc_pack_token(&b, 42, "wor\0ld", 6, ids, 3), 0);
    struct sil_rpc_msg m;
    struct sil_rpc_error e;
    assert_int_equal(sil_rpc_decode(sil_rpc_buf_head(&b), sil_rpc_buf_size(&b), 0, 0, &m, &e), 1);
    assert_int_equal(m.type, SIL_RPC_NOTIFICATION);
    assert_false(m.has_msgid);
    assert_string_equal(m.method, "token");
    /* [{id, text, ids}] is normalised to the map. */
    assert_non_null(m.params);
    assert_int_equal(m.params->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(sil_rpc_map_int(m.params, "id", 0), 42);
    const char *s;
    size_t n;
    assert_int_equal(sil_rpc_get_str(m.params, "text", &s, &n, SIL_RPC_REQUIRED, &e), 1);
    assert_int_equal(n, 6);
    assert_memory_equal(s, "wor\0ld", 6);
    char buf[16];
    assert_int_equal(sil_rpc_get_strbuf(m.params, "text", buf, sizeof(buf), 0, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "NUL"));
    const msgpack_object *a;
    assert_int_equal(sil_rpc_get_array(m.params, "ids", &a, 0, &e), 1);
    assert_int_equal(a->via.array.size, 3);
    assert_int_equal(a->via.array.ptr[0].via.u64, 151643);
    assert_int_equal(a->via.array.ptr[2].via.i64, -1);
    sil_rpc_msg_release(&m);
    sil_rpc_buf_free(&b);
}

static void test_params_shapes(void **state)
{
    struct sil_rpc_msg m;
    struct sil_rpc_error e;
    struct raw r;
    /* [0, 1, "status", [{"a": 1}]] -> the map */
    raw_init(&r);
    msgpack_pack_array(&r.pk, 4);
    msgpack_pack_uint8(&r.pk, 0);
    msgpack_pack_uint8(&r.pk, 1);
    sil_rpc_pack_cstr(&r.pk, "status");
    msgpack_pack_array(&r.pk, 1);
    msgpack_pack_map(&r.pk, 1);
    sil_rpc_kv_int(&r.pk, "a", 1);
    assert_int_equal(sil_rpc_decode(r.sb.data, r.sb.size, 0, 0, &m, &e), 1);
    assert_non_null(m.params);
    assert_int_equal(sil_rpc_map_int(m.params, "a", 0), 1);
    sil_rpc_msg_release(&m);
    raw_free(&r);
    /* [] and nil -> no params; every optional getter says absent, a required one fails */
    for (int k = 0; k < 3; k++) {
        raw_init(&r);
        msgpack_pack_array(&r.pk, 4);
        msgpack_pack_uint8(&r.pk, 0);
        msgpack_pack_uint8(&r.pk, 2);
        sil_rpc_pack_cstr(&r.pk, "status");
        if (k == 0)
            msgpack_pack_array(&r.pk, 0);
        else if (k == 1)
            msgpack_pack_nil(&r.pk);
        else {
            msgpack_pack_array(&r.pk, 1);
            msgpack_pack_nil(&r.pk);
        }
        assert_int_equal(sil_rpc_decode(r.sb.data, r.sb.size, 0, 0, &m, &e), 1);
        assert_null(m.params);
        int64_t v = 9;
        assert_int_equal(sil_rpc_get_int(m.params, "x", 0, 10, &v, 0, &e), 0);
        assert_int_equal(v, 9);
        assert_int_equal(sil_rpc_get_int(m.params, "x", 0, 10, &v, SIL_RPC_REQUIRED, &e), -ENOENT);
        assert_non_null(strstr(e.msg, "'x'"));
        sil_rpc_msg_release(&m);
        raw_free(&r);
    }
    /* params a string / [1, 2] -> -EPROTO, msgid known, code invalid params */
    for (int k = 0; k < 2; k++) {
        raw_init(&r);
        msgpack_pack_array(&r.pk, 4);
        msgpack_pack_uint8(&r.pk, 0);
        msgpack_pack_uint32(&r.pk, 4000000000u);
        sil_rpc_pack_cstr(&r.pk, "chat");
        if (k == 0)
            sil_rpc_pack_cstr(&r.pk, "hello");
        else {
            msgpack_pack_array(&r.pk, 2);
            msgpack_pack_int(&r.pk, 1);
            msgpack_pack_int(&r.pk, 2);
        }
        assert_int_equal(sil_rpc_decode(r.sb.data, r.sb.size, 0, 0, &m, &e), -EPROTO);
        assert_int_equal(e.code, SIL_RPC_E_INVALID_PARAMS);
        assert_true(m.has_msgid);
        assert_int_equal(m.msgid, 4000000000u);
        assert_int_equal(m.type, SIL_RPC_REQUEST);
        assert_string_equal(m.method, "chat");
        assert_null(m.priv_);
        raw_free(&r);
    }
}

/* Messages that are valid msgpack but not RPC: -EPROTO, and the stream goes on. */
static void test_invalid_rpc_then_valid(void **state)
{
    struct raw r;
    raw_init(&r);
    /* 1: not an array */
    msgpack_pack_map(&r.pk, 0);
    /* 2: bad type 3 */
    msgpack_pack_array(&r.pk, 4);
    msgpack_pack_uint8(&r.pk, 3);
    msgpack_pack_uint8(&r.pk, 1);
    sil_rpc_pack_cstr(&r.pk, "x");
    msgpack_pack_nil(&r.pk);
    /* 3: method not a string, msgid known */
    msgpack_pack_array(&r.pk, 4);
    msgpack_pack_uint8(&r.pk, 0);
    msgpack_pack_uint8(&r.pk, 9);
    msgpack_pack_int(&r.pk, 5);
    msgpack_pack_nil(&r.pk);
    /* 4: negative msgid */
    msgpack_pack_array(&r.pk, 4);
    msgpack_pack_uint8(&r.pk, 0);
    msgpack_pack_int(&r.pk, -1);
    sil_rpc_pack_cstr(&r.pk, "x");
    msgpack_pack_nil(&r.pk);
    /* 5: method of 64 bytes (one too many) */
    msgpack_pack_array(&r.pk, 4);
    msgpack_pack_uint8(&r.pk, 0);
    msgpack_pack_uint8(&r.pk, 10);
    char longname[65];
    memset(longname, 'm', 64);
    longname[64] = 0;
    sil_rpc_pack_cstr(&r.pk, longname);
    msgpack_pack_nil(&r.pk);
    /* 6: request with 3 elements */
    msgpack_pack_array(&r.pk, 3);
    msgpack_pack_uint8(&r.pk, 0);
    msgpack_pack_uint8(&r.pk, 11);
    sil_rpc_pack_cstr(&r.pk, "x");
    /* 7: valid */
    msgpack_pack_array(&r.pk, 3);
    msgpack_pack_uint8(&r.pk, 2);
    sil_rpc_pack_cstr(&r.pk, "ping");
    msgpack_pack_map(&r.pk, 0);

    struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(0, 0);
    struct sil_rpc_msg m;
    struct sil_rpc_error e;
    assert_int_equal(sil_rpc_unpacker_feed(u, r.sb.data, r.sb.size, &e), 0);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EPROTO);
    assert_int_equal(e.code, SIL_RPC_E_INVALID_REQUEST);
    assert_false(m.has_msgid);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EPROTO);
    assert_int_equal(m.type, -1);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EPROTO);
    assert_true(m.has_msgid);
    assert_int_equal(m.msgid, 9);
    assert_non_null(strstr(e.msg, "method"));
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EPROTO);
    assert_false(m.has_msgid);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EPROTO);
    assert_int_equal(m.msgid, 10);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EPROTO);
    assert_int_equal(m.msgid, 11);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), 1);
    assert_string_equal(m.method, "ping");
    assert_non_null(m.params);
    sil_rpc_msg_release(&m);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), 0);
    sil_rpc_unpacker_free(u);
    raw_free(&r);
}

/* ---- framing ---------------------------------------------------------------------------------- */

/* Several messages of every shape, then fed split at every position and byte by byte. */
static void build_stream(struct sil_rpc_buf *b, size_t *n_msgs)
{
    sil_rpc_buf_init(b, 0);
    pack_sample_request(b, 1);
    int32_t ids[2] = {1, 2};
    assert_int_equal(sil_rpc_pack_token(b, 1, "tok", 3, ids, 2), 0);
    char big[300];
    memset(big, 'x', sizeof(big));
    msgpack_packer *pk = sil_rpc_begin_response(b, 1);
    msgpack_pack_map(pk, 3);
    sil_rpc_kv_strn(pk, "text", big, sizeof(big)); /* str16 */
    sil_rpc_kv_double(pk, "f", 1.25);
    sil_rpc_pack_cstr(pk, "bin");
    msgpack_pack_bin(pk, 4);
    msgpack_pack_bin_body(pk, "\x00\x01\x02\x03", 4);
    assert_int_equal(sil_rpc_end(b), 0);
    assert_int_equal(sil_rpc_pack_error_response(b, 2, SIL_RPC_E_INTERNAL, "boom"), 0);
    pk = sil_rpc_begin_notification(b, "ext");
    msgpack_pack_map(pk, 2);
    sil_rpc_pack_cstr(pk, "e");
    msgpack_pack_ext(pk, 2, 7);
    msgpack_pack_ext_body(pk, "ab", 2);
    sil_rpc_kv_int(pk, "neg", -1000000);
    assert_int_equal(sil_rpc_end(b), 0);
    *n_msgs = 5;
}

static size_t drain(struct sil_rpc_unpacker *u, uint32_t *types)
{
    struct sil_rpc_msg m;
    struct sil_rpc_error e;
    size_t k = 0;
    int r;
    while ((r = sil_rpc_unpacker_next(u, &m, &e)) == 1) {
        types[k++] = (uint32_t)m.type;
        sil_rpc_msg_release(&m);
    }
    assert_int_equal(r, 0);
    return k;
}

static void test_split_anywhere(void **state)
{
    struct sil_rpc_buf b;
    size_t n_msgs;
    build_stream(&b, &n_msgs);
    const char *data = sil_rpc_buf_head(&b);
    size_t n = sil_rpc_buf_size(&b);
    const uint32_t want[5] = {0, 2, 1, 1, 2};
    struct sil_rpc_error e;
    for (size_t split = 0; split <= n; split++) {
        struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(0, 0);
        uint32_t types[8];
        size_t k = 0;
        assert_int_equal(sil_rpc_unpacker_feed(u, data, split, &e), 0);
        k += drain(u, types + k);
        assert_int_equal(sil_rpc_unpacker_feed(u, data + split, n - split, &e), 0);
        k += drain(u, types + k);
        assert_int_equal(k, n_msgs);
        assert_memory_equal(types, want, sizeof(want));
        assert_int_equal(sil_rpc_unpacker_pending(u), 0);
        sil_rpc_unpacker_free(u);
    }
    /* byte by byte through the zero-copy interface */
    struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(0, 0);
    uint32_t types[8];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t avail;
        char *dst = sil_rpc_unpacker_space(u, 1, &avail);
        assert_non_null(dst);
        assert_true(avail >= 1);
        *dst = data[i];
        sil_rpc_unpacker_commit(u, 1);
        k += drain(u, types + k);
    }
    assert_int_equal(k, n_msgs);
    assert_memory_equal(types, want, sizeof(want));
    sil_rpc_unpacker_free(u);
    sil_rpc_buf_free(&b);
}

static void test_oversized(void **state)
{
    struct sil_rpc_error e;
    struct sil_rpc_msg m;
    /* a 300-byte string with a 200-byte limit: refused as soon as the header is seen */
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 0);
    char big[300];
    memset(big, 'y', sizeof(big));
    msgpack_packer *pk = sil_rpc_begin_notification(&b, "n");
    msgpack_pack_map(pk, 1);
    sil_rpc_kv_strn(pk, "t", big, sizeof(big));
    assert_int_equal(sil_rpc_end(&b), 0);
    struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(200, 0);
    assert_int_equal(sil_rpc_unpacker_feed(u, sil_rpc_buf_head(&b), 20, &e), 0);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EMSGSIZE);
    assert_int_equal(e.code, SIL_RPC_E_TOO_LARGE);
    assert_non_null(strstr(e.msg, "200"));
    /* sticky */
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EMSGSIZE);
    sil_rpc_unpacker_free(u);
    /* the same message fits a larger limit */
    assert_int_equal(sil_rpc_decode(sil_rpc_buf_head(&b), sil_rpc_buf_size(&b), 400, 0, &m, &e), 1);
    sil_rpc_msg_release(&m);
    assert_int_equal(sil_rpc_decode(sil_rpc_buf_head(&b), sil_rpc_buf_size(&b), 200, 0, &m, &e), -EMSGSIZE);
    sil_rpc_buf_free(&b);

    /* headers that declare huge sizes with a handful of bytes: str32, bin32, array32, map32, ext32 */
    const unsigned char heads[][6] = {
        {0xdb, 0x7f, 0xff, 0xff, 0xff, 0},
        {0xc6, 0xff, 0xff, 0xff, 0xff, 0},
        {0xdd, 0xff, 0xff, 0xff, 0xff, 0},
        {0xdf, 0xff, 0xff, 0xff, 0xff, 0},
        {0xc9, 0x10, 0x00, 0x00, 0x00, 1},
    };
    for (size_t i = 0; i < sizeof(heads) / sizeof(heads[0]); i++) {
        u = sil_rpc_unpacker_new(0, 0);
        unsigned char msg[8] = {0x93, 0x02};
        memcpy(msg + 2, heads[i], 6);
        assert_int_equal(sil_rpc_unpacker_feed(u, msg, 8, &e), 0);
        assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EMSGSIZE);
        sil_rpc_unpacker_free(u);
    }
    /* array16 of 1000 elements declared in a 100-byte limit: refused before they arrive */
    u = sil_rpc_unpacker_new(100, 0);
    const unsigned char arr[] = {0xdc, 0x03, 0xe8};
    assert_int_equal(sil_rpc_unpacker_feed(u, arr, sizeof(arr), &e), 0);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EMSGSIZE);
    sil_rpc_unpacker_free(u);
    /* a stream of many 1-byte elements runs into the limit without a complete message */
    u = sil_rpc_unpacker_new(64, 0);
    const unsigned char a32[] = {0xdd, 0x00, 0x00, 0x00, 0x30};
    assert_int_equal(sil_rpc_unpacker_feed(u, a32, sizeof(a32), &e), 0);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), 0);
    unsigned char ones[0x30];
    memset(ones, 1, sizeof(ones));
    assert_int_equal(sil_rpc_unpacker_feed(u, ones, sizeof(ones), &e), 0);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EPROTO); /* 53 bytes: fits, not RPC */
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), 0);
    sil_rpc_unpacker_free(u);
    /* feeding without draining is bounded */
    u = sil_rpc_unpacker_new(16, 0);
    char *junk = calloc(1, (2u << 20));
    assert_int_equal(sil_rpc_unpacker_feed(u, junk, 2u << 20, &e), -ENOBUFS);
    free(junk);
    size_t avail;
    assert_null(sil_rpc_unpacker_space(u, 1, &avail));
    assert_int_equal(avail, 0);
    sil_rpc_unpacker_free(u);
}

static void test_malformed(void **state)
{
    struct sil_rpc_error e;
    struct sil_rpc_msg m;
    struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(0, 0);
    const unsigned char bad[] = {0x94, 0x00, 0x01, 0xc1};
    assert_int_equal(sil_rpc_unpacker_feed(u, bad, sizeof(bad), &e), 0);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EBADMSG);
    assert_int_equal(e.code, SIL_RPC_E_PARSE);
    assert_non_null(strstr(e.msg, "offset 3"));
    /* sticky even if good bytes follow */
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 0);
    pack_sample_request(&b, 3);
    assert_int_equal(sil_rpc_unpacker_feed(u, sil_rpc_buf_head(&b), sil_rpc_buf_size(&b), &e), 0);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EBADMSG);
    sil_rpc_unpacker_free(u);
    /* truncated and trailing bytes in one-shot decode */
    assert_int_equal(sil_rpc_decode(sil_rpc_buf_head(&b), sil_rpc_buf_size(&b) - 1, 0, 0, &m, &e), -EBADMSG);
    assert_non_null(strstr(e.msg, "truncated"));
    char two[512];
    size_t n = sil_rpc_buf_size(&b);
    assert_true(n + 1 <= sizeof(two));
    memcpy(two, sil_rpc_buf_head(&b), n);
    two[n] = 0x00;
    assert_int_equal(sil_rpc_decode(two, n + 1, 0, 0, &m, &e), -EBADMSG);
    assert_non_null(strstr(e.msg, "trailing"));
    assert_int_equal(sil_rpc_decode(two, 0, 0, 0, &m, &e), -EBADMSG);
    sil_rpc_buf_free(&b);
}

static void pack_nested(struct raw *r, unsigned depth, bool empty_inner)
{
    /* [2, "n", [[[...]]]] : the outer array is depth 1, the params array depth 2 */
    msgpack_pack_array(&r->pk, 3);
    msgpack_pack_uint8(&r->pk, 2);
    sil_rpc_pack_cstr(&r->pk, "n");
    for (unsigned d = 2; d <= depth; d++)
        msgpack_pack_array(&r->pk, d == depth && empty_inner ? 0 : 1);
    if (!empty_inner)
        msgpack_pack_uint8(&r->pk, 7);
}

static void test_depth_limit(void **state)
{
    struct sil_rpc_error e;
    struct sil_rpc_msg m;
    for (int empty = 0; empty <= 1; empty++) {
        struct raw r;
        raw_init(&r);
        pack_nested(&r, 16, empty);
        /* fits at 16 (decodes, but params are not a map) */
        assert_int_equal(sil_rpc_decode(r.sb.data, r.sb.size, 0, 16, &m, &e), -EPROTO);
        assert_int_equal(e.code, SIL_RPC_E_INVALID_PARAMS);
        assert_int_equal(sil_rpc_decode(r.sb.data, r.sb.size, 0, 15, &m, &e), -EBADMSG);
        assert_non_null(strstr(e.msg, "nested deeper than 15"));
        raw_free(&r);
    }
    /* the hard ceiling holds even when a larger limit is asked for: 40 levels */
    struct raw r;
    raw_init(&r);
    pack_nested(&r, 40, false);
    assert_int_equal(sil_rpc_decode(r.sb.data, r.sb.size, 0, 1000, &m, &e), -EBADMSG);
    struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(0, 1000);
    assert_int_equal(sil_rpc_unpacker_feed(u, r.sb.data, r.sb.size, &e), 0);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), -EBADMSG);
    sil_rpc_unpacker_free(u);
    raw_free(&r);
    /* maps count too: {"a": {"a": ...}} */
    raw_init(&r);
    msgpack_pack_array(&r.pk, 4);
    msgpack_pack_uint8(&r.pk, 0);
    msgpack_pack_uint8(&r.pk, 1);
    sil_rpc_pack_cstr(&r.pk, "m");
    for (int d = 0; d < 20; d++) {
        msgpack_pack_map(&r.pk, 1);
        sil_rpc_pack_cstr(&r.pk, "a");
    }
    msgpack_pack_nil(&r.pk);
    assert_int_equal(sil_rpc_decode(r.sb.data, r.sb.size, 0, 0, &m, &e), -EBADMSG);
    assert_int_equal(sil_rpc_decode(r.sb.data, r.sb.size, 0, 21, &m, &e), 1);
    sil_rpc_msg_release(&m);
    raw_free(&r);
}

/* ---- field access ----------------------------------------------------------------------------- */

static void test_wrong_types(void **state)
{
    struct raw r;
    raw_init(&r);
    msgpack_pack_array(&r.pk, 4);
    msgpack_pack_uint8(&r.pk, 0);
    msgpack_pack_uint8(&r.pk, 1);
    sil_rpc_pack_cstr(&r.pk, "generate");
    msgpack_pack_map(&r.pk, 9);
    sil_rpc_kv_str(&r.pk, "s", "text");
    sil_rpc_kv_int(&r.pk, "neg", -5);
    sil_rpc_kv_uint(&r.pk, "huge", UINT64_MAX);
    sil_rpc_kv_double(&r.pk, "f", 2.0);
    sil_rpc_kv_double(&r.pk, "half", 2.5);
    sil_rpc_kv_bool(&r.pk, "b", false);
    msgpack_pack_int(&r.pk, 5); /* non-string key is skipped by lookups */
    msgpack_pack_int(&r.pk, 6);
    sil_rpc_pack_cstr(&r.pk, "m");
    msgpack_pack_map(&r.pk, 0);
    sil_rpc_pack_cstr(&r.pk, "nan");
    msgpack_pack_double(&r.pk, 0.0 / 0.0);

    struct sil_rpc_msg m;
    struct sil_rpc_error e;
    assert_int_equal(sil_rpc_decode(r.sb.data, r.sb.size, 0, 0, &m, &e), 1);
    const msgpack_object *p = m.params;
    int64_t i = 0;
    uint64_t u = 0;
    double d = 0;
    bool b = true;
    const msgpack_object *o = NULL;
    const char *s;
    size_t n;

    assert_int_equal(sil_rpc_get_int(p, "s", 0, 10, &i, 0, &e), -EINVAL);
    assert_int_equal(e.code, SIL_RPC_E_INVALID_PARAMS);
    assert_string_equal(e.msg, "field 's': expected integer, got string");
    assert_int_equal(sil_rpc_get_int(p, "neg", 0, 10, &i, 0, &e), -ERANGE);
    assert_string_equal(e.msg, "field 'neg': -5 out of range [0, 10]");
    assert_int_equal(sil_rpc_get_int(p, "neg", -10, 10, &i, 0, &e), 1);
    assert_int_equal(i, -5);
    assert_int_equal(sil_rpc_get_int(p, "huge", INT64_MIN, INT64_MAX, &i, 0, &e), -ERANGE);
    assert_int_equal(sil_rpc_get_uint(p, "huge", 0, UINT64_MAX, &u, 0, &e), 1);
    assert_true(u == UINT64_MAX);
    assert_int_equal(sil_rpc_get_uint(p, "neg", 0, 10, &u, 0, &e), -ERANGE);
    assert_non_null(strstr(e.msg, "'neg'"));
    assert_int_equal(sil_rpc_get_int(p, "f", 0, 10, &i, 0, &e), 1);
    assert_int_equal(i, 2);
    assert_int_equal(sil_rpc_get_int(p, "half", 0, 10, &i, 0, &e), -EINVAL);
    assert_int_equal(sil_rpc_get_uint(p, "half", 0, 10, &u, 0, &e), -EINVAL);
    assert_int_equal(sil_rpc_get_double(p, "neg", -100, 100, &d, 0, &e), 1);
    assert_true(d == -5.0);
    assert_int_equal(sil_rpc_get_double(p, "half", 0, 2, &d, 0, &e), -ERANGE);
    assert_int_equal(sil_rpc_get_double(p, "nan", -1e300, 1e300, &d, 0, &e), -ERANGE);
    assert_int_equal(sil_rpc_get_double(p, "b", 0, 1, &d, 0, &e), -EINVAL);
    assert_string_equal(e.msg, "field 'b': expected number, got boolean");
    assert_int_equal(sil_rpc_get_bool(p, "b", &b, 0, &e), 1);
    assert_false(b);
    assert_int_equal(sil_rpc_get_bool(p, "s", &b, 0, &e), -EINVAL);
    assert_int_equal(sil_rpc_get_str(p, "neg", &s, &n, 0, &e), -EINVAL);
    assert_string_equal(e.msg, "field 'neg': expected string, got negative integer");
    assert_int_equal(sil_rpc_get_array(p, "m", &o, 0, &e), -EINVAL);
    assert_int_equal(sil_rpc_get_map(p, "m", &o, 0, &e), 1);
    assert_int_equal(o->via.map.size, 0);
    assert_int_equal(sil_rpc_get_map(p, "s", &o, 0, &e), -EINVAL);
    char small[4];
    assert_int_equal(sil_rpc_get_strbuf(p, "s", small, sizeof(small), 0, &e), -ERANGE);
    assert_non_null(strstr(e.msg, "at most 3"));
    /* absent: optional leaves the value, required names the field */
    i = 123;
    assert_int_equal(sil_rpc_get_int(p, "missing", 0, 10, &i, SIL_RPC_OPTIONAL, &e), 0);
    assert_int_equal(i, 123);
    assert_int_equal(sil_rpc_get_str(p, "prompt", &s, &n, SIL_RPC_REQUIRED, &e), -ENOENT);
    assert_string_equal(e.msg, "field 'prompt' is required");
    /* getters on something that is not a map */
    assert_int_equal(sil_rpc_get_int(&m.root, "x", 0, 1, &i, 0, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "not a map"));
    assert_null(sil_rpc_map_get(&m.root, "s"));
    /* loose readers */
    assert_int_equal(sil_rpc_map_int(p, "s", -7), -7);
    assert_true(sil_rpc_map_double(p, "half", 0) == 2.5);
    assert_false(sil_rpc_map_bool(p, "b", true));
    assert_true(sil_rpc_map_bool(p, "nope", true));
    sil_rpc_msg_release(&m);
    raw_free(&r);
}

/* msgpack-c gives a NULL pointer for empty strings: lookups and copies must not pass it on. */
static void test_empty_strings(void **state)
{
    const unsigned char raw[] = {0x93, 0x02, 0xa5, 't', 'o', 'k', 'e', 'n', 0x91, 0x82, 0xa0, 0xa1,
                                 'v', 0xa4, 't', 'e', 'x', 't', 0xa0};
    struct sil_rpc_msg m;
    struct sil_rpc_error e;
    assert_int_equal(sil_rpc_decode(raw, sizeof(raw), 0, 0, &m, &e), 1);
    const msgpack_object *v = sil_rpc_map_get(m.params, "");
    assert_non_null(v);
    assert_int_equal(v->via.str.size, 1);
    const char *s = NULL;
    size_t n = 9;
    assert_int_equal(sil_rpc_get_str(m.params, "text", &s, &n, SIL_RPC_REQUIRED, &e), 1);
    assert_non_null(s);
    assert_int_equal(n, 0);
    char buf[4] = "xyz";
    assert_int_equal(sil_rpc_get_strbuf(m.params, "text", buf, sizeof(buf), 0, &e), 1);
    assert_string_equal(buf, "");
    sil_rpc_msg_release(&m);
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 0);
    assert_int_equal(sil_rpc_pack_token(&b, 1, NULL, 0, NULL, 0), 0);
    assert_int_equal(sil_rpc_decode(sil_rpc_buf_head(&b), sil_rpc_buf_size(&b), 0, 0, &m, &e), 1);
    sil_rpc_msg_release(&m);
    sil_rpc_buf_free(&b);
}

static void test_json(void **state)
{
    struct raw r;
    raw_init(&r);
    msgpack_pack_map(&r.pk, 6);
    sil_rpc_kv_str(&r.pk, "t", "a\"b\\c\n\x01\xc3\xa9\xff");
    sil_rpc_kv_int(&r.pk, "i", -3);
    sil_rpc_kv_double(&r.pk, "d", 0.5);
    sil_rpc_pack_cstr(&r.pk, "a");
    msgpack_pack_array(&r.pk, 3);
    msgpack_pack_true(&r.pk);
    msgpack_pack_nil(&r.pk);
    msgpack_pack_array(&r.pk, 0);
    msgpack_pack_int(&r.pk, 7);
    msgpack_pack_map(&r.pk, 0);
    sil_rpc_kv_double(&r.pk, "inf", 1.0 / 0.0);
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(&up, r.sb.data, r.sb.size, &off), MSGPACK_UNPACK_SUCCESS);
    char *s = mem_json(&up.data, -1);
    assert_string_equal(s, "{\"t\":\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\xef\xbf\xbd\",\"i\":-3,\"d\":0.5,"
                           "\"a\":[true,null,[]],\"7\":{},\"inf\":null}");
    free(s);
    s = mem_json(&up.data.via.map.ptr[3].val, 2);
    assert_string_equal(s, "[\n  true,\n  null,\n  []\n]");
    free(s);
    msgpack_unpacked_destroy(&up);
    raw_free(&r);
    /* non-string keys: printed as JSON, quoted; inside such a key, a non-string key is a
     * placeholder, so 30 nested one-entry maps as keys print in a few bytes (each level used
     * to double the escapes: gigabytes) */
    raw_init(&r);
    msgpack_pack_map(&r.pk, 1);
    msgpack_pack_map(&r.pk, 1);
    msgpack_pack_int(&r.pk, 1);
    msgpack_pack_int(&r.pk, 2);
    msgpack_pack_int(&r.pk, 3);
    msgpack_unpacked_init(&up);
    off = 0;
    assert_int_equal(msgpack_unpack_next(&up, r.sb.data, r.sb.size, &off), MSGPACK_UNPACK_SUCCESS);
    s = mem_json(&up.data, -1);
    assert_string_equal(s, "{\"{\\\"1\\\":2}\":3}");
    free(s);
    msgpack_unpacked_destroy(&up);
    raw_free(&r);
    raw_init(&r);
    for (int i = 0; i < 30; i++)
        msgpack_pack_map(&r.pk, 1);
    msgpack_pack_nil(&r.pk);
    for (int i = 0; i < 30; i++)
        msgpack_pack_nil(&r.pk);
    msgpack_unpacked_init(&up);
    off = 0;
    if (msgpack_unpack_next(&up, r.sb.data, r.sb.size, &off) == MSGPACK_UNPACK_SUCCESS) {
        s = mem_json(&up.data, -1);
        assert_true(strlen(s) < 100);
        assert_string_equal(s, "{\"{\\\"(key)\\\":null}\":null}");
        free(s);
    }
    msgpack_unpacked_destroy(&up);
    raw_free(&r);
    /* a C string alone: the same escapes; NULL is the empty string */
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    assert_non_null(f);
    assert_int_equal(sil_rpc_print_json_str(f, "a\"b\\c\n\x01\xc3\xa9\xff"), 0);
    assert_int_equal(sil_rpc_print_json_str(f, NULL), 0);
    fclose(f);
    assert_string_equal(s, "\"a\\\"b\\\\c\\n\\u0001\xc3\xa9\xef\xbf\xbd\"\"\"");
    free(s);
}

/* ---- packing ---------------------------------------------------------------------------------- */

static void test_buf_limit(void **state)
{
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 64);
    int32_t ids[1] = {5};
    assert_int_equal(sil_rpc_pack_token(&b, 1, "abc", 3, ids, 1), 0);
    size_t one = sil_rpc_buf_size(&b);
    assert_true(one < 32);
    char big[100];
    memset(big, 'z', sizeof(big));
    assert_int_equal(sil_rpc_pack_token(&b, 2, big, sizeof(big), ids, 1), -ENOBUFS);
    assert_int_equal(sil_rpc_buf_size(&b), one); /* the partial message is gone */
    assert_int_equal(sil_rpc_pack_token(&b, 3, "abc", 3, ids, 1), 0);
    assert_int_equal(sil_rpc_buf_size(&b), 2 * one);
    /* sending frees room */
    assert_int_equal(sil_rpc_pack_token(&b, 4, "abc", 3, ids, 1), -ENOBUFS);
    sil_rpc_buf_consume(&b, one);
    assert_int_equal(sil_rpc_pack_token(&b, 4, "abc", 3, ids, 1), 0);
    struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(0, 0);
    struct sil_rpc_error e;
    struct sil_rpc_msg m;
    assert_int_equal(sil_rpc_unpacker_feed(u, sil_rpc_buf_head(&b), sil_rpc_buf_size(&b), &e), 0);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), 1);
    assert_int_equal(sil_rpc_map_int(m.params, "id", 0), 3);
    sil_rpc_msg_release(&m);
    assert_int_equal(sil_rpc_unpacker_next(u, &m, &e), 1);
    assert_int_equal(sil_rpc_map_int(m.params, "id", 0), 4);
    sil_rpc_msg_release(&m);
    sil_rpc_unpacker_free(u);
    sil_rpc_buf_consume(&b, 1000);
    assert_int_equal(sil_rpc_buf_size(&b), 0);
    sil_rpc_buf_free(&b);
}

/* ---- sockets and client ----------------------------------------------------------------------- */

static void test_socket_path(void **state)
{
    char buf[256];
    setenv("SILICEO_SOCKET", "/tmp/env.sock", 1);
    assert_int_equal(sil_rpc_socket_path("/tmp/flag.sock", buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/tmp/flag.sock");
    assert_int_equal(sil_rpc_socket_path("", buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/tmp/env.sock");
    assert_int_equal(sil_rpc_socket_path(NULL, buf, sizeof(buf)), 0);
    assert_string_equal(buf, "/tmp/env.sock");
    unsetenv("SILICEO_SOCKET");
    setenv("XDG_RUNTIME_DIR", "/tmp/xdg", 1);
    assert_int_equal(sil_rpc_socket_path(NULL, buf, sizeof(buf)), 0);
    if (geteuid() == 0)
        assert_string_equal(buf, "/run/siliceo/siliceod.sock");
    else
        assert_string_equal(buf, "/tmp/xdg/siliceo/siliceod.sock");
    assert_int_equal(sil_rpc_socket_path("/a/very/long/path", buf, 8), -ENAMETOOLONG);
}

struct fake {
    int fd;
    int mode; /* 0: tokens then result, 1: error response, 2: close without answer, 3: wait for cancel */
};

static void fake_send(int fd, struct sil_rpc_buf *b)
{
    while (sil_rpc_buf_size(b) > 0) {
        ssize_t w = write(fd, sil_rpc_buf_head(b), sil_rpc_buf_size(b));
        if (w <= 0)
            return;
        sil_rpc_buf_consume(b, (size_t)w);
    }
}

/* A tiny server on one end of a socket pair: answers requests one by one. */
static void *fake_server(void *arg)
{
    struct fake *f = arg;
    struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(0, 0);
    struct sil_rpc_buf out;
    sil_rpc_buf_init(&out, 0);
    char chunk[7]; /* small reads: the server sees split messages too */
    uint32_t gen_id = 0;
    for (;;) {
        ssize_t n = read(f->fd, chunk, sizeof(chunk));
        if (n <= 0)
            break;
        struct sil_rpc_error e;
        sil_rpc_unpacker_feed(u, chunk, (size_t)n, &e);
        struct sil_rpc_msg m;
        int r;
        while ((r = sil_rpc_unpacker_next(u, &m, &e)) != 0) {
            if (r < 0) {
                if (m.has_msgid)
                    sil_rpc_pack_error_response(&out, m.msgid, e.code, e.msg);
                if (r != -EPROTO)
                    goto done;
                fake_send(f->fd, &out);
                continue;
            }
            if (strcmp(m.method, "cancel") == 0) {
                uint64_t id = 0;
                sil_rpc_get_uint(m.params, "id", 0, UINT32_MAX, &id, SIL_RPC_REQUIRED, &e);
                msgpack_packer *pk = sil_rpc_begin_response(&out, m.msgid);
                msgpack_pack_map(pk, 0);
                sil_rpc_end(&out);
                pk = sil_rpc_begin_response(&out, (uint32_t)id);
                msgpack_pack_map(pk, 1);
                sil_rpc_kv_str(pk, "stop_reason", "cancelled");
                sil_rpc_end(&out);
            } else if (f->mode == 1) {
                sil_rpc_pack_error_response(&out, m.msgid, SIL_RPC_E_METHOD_NOT_FOUND, "no such method");
            } else if (f->mode == 2) {
                sil_rpc_msg_release(&m);
                goto done;
            } else {
                gen_id = m.msgid;
                int32_t id = 10;
                sil_rpc_pack_token(&out, gen_id, "Hel", 3, &id, 1);
                /* a stray response to another id reaches the callback too */
                msgpack_packer *pk = sil_rpc_begin_response(&out, gen_id + 1000);
                msgpack_pack_nil(pk);
                sil_rpc_end(&out);
                if (f->mode == 0) {
                    sil_rpc_pack_token(&out, gen_id, "lo", 2, &id, 1);
                    pk = sil_rpc_begin_response(&out, gen_id);
                    msgpack_pack_map(pk, 2);
                    sil_rpc_kv_str(pk, "text", "Hello");
                    sil_rpc_kv_str(pk, "method", m.method);
                    sil_rpc_end(&out);
                }
            }
            sil_rpc_msg_release(&m);
            fake_send(f->fd, &out);
        }
    }
done:
    sil_rpc_buf_free(&out);
    sil_rpc_unpacker_free(u);
    close(f->fd);
    return NULL;
}

struct collected {
    char text[64];
    int tokens;
    int others;
    struct sil_rpc_client *c;
    bool cancel;
};

static int on_msg(void *ud, const struct sil_rpc_msg *m)
{
    struct collected *col = ud;
    if (!m)
        return 0;
    if (m->type == SIL_RPC_NOTIFICATION && strcmp(m->method, "token") == 0) {
        const char *s;
        size_t n;
        if (sil_rpc_get_str(m->params, "text", &s, &n, SIL_RPC_REQUIRED, NULL) == 1)
            strncat(col->text, s, n);
        col->tokens++;
        if (col->cancel && col->tokens == 1)
            return sil_rpc_client_cancel(col->c, NULL);
    } else {
        col->others++;
    }
    return 0;
}

static void start_fake(struct sil_rpc_client *c, struct fake *f, pthread_t *th, int mode)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    f->fd = sv[1];
    f->mode = mode;
    struct sil_rpc_error e;
    assert_int_equal(sil_rpc_client_init_fd(c, sv[0], &e), 0);
    assert_int_equal(pthread_create(th, NULL, fake_server, f), 0);
}

static void test_client_call(void **state)
{
    struct sil_rpc_client c;
    struct fake f;
    pthread_t th;
    start_fake(&c, &f, &th, 0);
    c.timeout_ms = 5000;
    struct sil_rpc_error e = {0};
    for (int round = 0; round < 3; round++) {
        struct collected col = {.c = &c};
        msgpack_packer *pk = sil_rpc_client_begin(&c, "generate");
        msgpack_pack_map(pk, 1);
        sil_rpc_kv_str(pk, "prompt", "hi");
        const msgpack_object *res = NULL;
        assert_int_equal(sil_rpc_client_call(&c, on_msg, &col, &res, &e), 0);
        assert_non_null(res);
        char text[16], method[16];
        assert_string_equal(sil_rpc_map_str(res, "text", text, sizeof(text), ""), "Hello");
        assert_string_equal(sil_rpc_map_str(res, "method", method, sizeof(method), ""), "generate");
        assert_string_equal(col.text, "Hello");
        assert_int_equal(col.tokens, 2);
        assert_int_equal(col.others, 1);
    }
    const msgpack_object *res = NULL;
    assert_int_equal(sil_rpc_client_call0(&c, "status", NULL, NULL, &res, &e), 0);
    sil_rpc_client_close(&c);
    pthread_join(th, NULL);
}

static void test_client_errors(void **state)
{
    struct sil_rpc_client c;
    struct fake f;
    pthread_t th;
    struct sil_rpc_error e = {0};
    const msgpack_object *res = NULL;
    /* the server answers with an error */
    start_fake(&c, &f, &th, 1);
    assert_int_equal(sil_rpc_client_call0(&c, "nope", NULL, NULL, &res, &e), -EREMOTEIO);
    assert_int_equal(e.code, SIL_RPC_E_METHOD_NOT_FOUND);
    assert_string_equal(e.msg, "no such method");
    sil_rpc_client_close(&c);
    pthread_join(th, NULL);
    /* the server hangs up */
    start_fake(&c, &f, &th, 2);
    assert_int_equal(sil_rpc_client_call0(&c, "status", NULL, NULL, &res, &e), -ECONNRESET);
    sil_rpc_client_close(&c);
    pthread_join(th, NULL);
    /* the server never finishes: timeout */
    start_fake(&c, &f, &th, 3);
    c.timeout_ms = 200;
    struct collected col = {.c = &c};
    assert_int_equal(sil_rpc_client_call0(&c, "generate", on_msg, &col, &res, &e), -ETIMEDOUT);
    assert_int_equal(col.tokens, 1);
    sil_rpc_client_close(&c);
    pthread_join(th, NULL);
    /* cancel from the callback: the generate call ends with the server's final result */
    start_fake(&c, &f, &th, 3);
    c.timeout_ms = 5000;
    struct collected col2 = {.c = &c, .cancel = true};
    assert_int_equal(sil_rpc_client_call0(&c, "generate", on_msg, &col2, &res, &e), 0);
    char reason[16];
    assert_string_equal(sil_rpc_map_str(res, "stop_reason", reason, sizeof(reason), ""), "cancelled");
    assert_int_equal(col2.others, 1); /* the stray response; the cancel's own response is swallowed */
    sil_rpc_client_close(&c);
    pthread_join(th, NULL);
}

static void test_listen_connect(void **state)
{
    char dir[] = "/tmp/test_proto.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    snprintf(path, sizeof(path), "%s/s.sock", dir);
    struct sil_rpc_error e = {0};
    assert_int_equal(sil_rpc_connect(path, &e), -ENOENT);
    assert_non_null(strstr(e.msg, "siliceod running"));
    int lfd = sil_rpc_listen(path, 0600, 4, &e);
    assert_true(lfd >= 0);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(sil_rpc_listen(path, 0600, 4, &e), -EADDRINUSE);
    int cfd = sil_rpc_connect(path, &e);
    assert_true(cfd >= 0);
    close(cfd);
    close(lfd);
    /* the file is left behind, nobody listens: replaced */
    lfd = sil_rpc_listen(path, 0660, 4, &e);
    assert_true(lfd >= 0);
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0660);
    close(lfd);
    unlink(path);
    /* a regular file is never removed */
    FILE *fp = fopen(path, "w");
    assert_non_null(fp);
    fclose(fp);
    assert_int_equal(sil_rpc_listen(path, 0600, 4, &e), -EEXIST);
    unlink(path);
    char longp[200];
    memset(longp, 'a', sizeof(longp) - 1);
    longp[sizeof(longp) - 1] = 0;
    assert_int_equal(sil_rpc_connect(longp, &e), -ENAMETOOLONG);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_codes),
        cmocka_unit_test(test_conn_error),
        cmocka_unit_test(test_round_trip_request),
        cmocka_unit_test(test_round_trip_response_and_error),
        cmocka_unit_test(test_token_notification),
        cmocka_unit_test(test_params_shapes),
        cmocka_unit_test(test_invalid_rpc_then_valid),
        cmocka_unit_test(test_split_anywhere),
        cmocka_unit_test(test_oversized),
        cmocka_unit_test(test_malformed),
        cmocka_unit_test(test_depth_limit),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_empty_strings),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_buf_limit),
        cmocka_unit_test(test_socket_path),
        cmocka_unit_test(test_client_call),
        cmocka_unit_test(test_client_errors),
        cmocka_unit_test(test_listen_connect),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
