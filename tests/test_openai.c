/* sil-openai's HTTP-free parts: the strict JSON parser and escaper, the request mapping to daemon
 * params, and the response objects built from daemon results. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "client/sil-openai/openai.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse(const char *s, struct sil_oa_json_doc **d, struct sil_oa_json_err *e)
{
    return sil_oa_json_parse(d, s, strlen(s), e);
}

static void json_accepts(void **state)
{
    struct sil_oa_json_doc *d;
    struct sil_oa_json_err e;
    assert_int_equal(parse(" {\"a\": [1, -0.5e2, true, false, null, \"x\\u00e9\\ud83d\\ude00\\n\"],"
                           " \"b\": {}} ",
                           &d, &e),
                     0);
    const struct sil_oa_json *r = sil_oa_json_root(d);
    assert_int_equal(r->type, SIL_OA_JSON_OBJECT);
    assert_int_equal(r->n, 2);
    const struct sil_oa_json *a = sil_oa_json_get(r, "a");
    assert_non_null(a);
    assert_int_equal(a->n, 6);
    const struct sil_oa_json *v = a->child;
    assert_true(v->is_int);
    assert_int_equal(v->i, 1);
    v = v->next;
    assert_false(v->is_int);
    assert_true(v->num == -50.0);
    assert_int_equal(v->next->type, SIL_OA_JSON_TRUE);
    assert_int_equal(v->next->next->type, SIL_OA_JSON_FALSE);
    assert_int_equal(v->next->next->next->type, SIL_OA_JSON_NULL);
    v = v->next->next->next->next;
    assert_int_equal(v->type, SIL_OA_JSON_STRING);
    assert_int_equal(v->len, 1 + 2 + 4 + 1);
    assert_memory_equal(v->str, "x\xc3\xa9\xf0\x9f\x98\x80\n", 8);
    assert_int_equal(sil_oa_json_get(r, "b")->type, SIL_OA_JSON_OBJECT);
    assert_null(sil_oa_json_get(r, "c"));
    sil_oa_json_free(d);
    /* A NUL escaped in a string is kept, with its length. */
    assert_int_equal(parse("\"a\\u0000b\"", &d, &e), 0);
    assert_int_equal(sil_oa_json_root(d)->len, 3);
    sil_oa_json_free(d);
}

static void json_rejects(void **state)
{
    static const struct {
        const char *text;
        size_t offset;
    } bad[] = {
        {"", 0},
        {"{", 1},
        {"[1,]", 3},
        {"{\"a\":1,}", 7},
        {"01", 1},
        {"1.", 2},
        {"-", 1},
        {"1e", 2},
        {"+1", 0},
        {"'a'", 0},
        {"\"\\x\"", 1},
        {"\"\\ud800\"", 1},
        {"\"\\udc00\"", 1},
        {"\"a", 0},
        {"\"\x01\"", 1},
        {"\"\xc0\xaf\"", 1},
        {"\"\xed\xa0\x80\"", 1},
        {"\"\xf4\x90\x80\x80\"", 1},
        {"\"\xe2\x82\"", 1},
        {"{\"a\":1,\"a\":2}", 7},
        {"[1] x", 4},
        {"nul", 0},
        {"\xef\xbb\xbf{}", 0},
        {"1e999", 0},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sil_oa_json_doc *d = (void *)1;
        struct sil_oa_json_err e = {0};
        int r = parse(bad[i].text, &d, &e);
        if (r != -EINVAL) fail_msg("case %zu (%s): %d", i, bad[i].text, r);
        assert_null(d);
        if (e.offset != bad[i].offset)
            fail_msg("case %zu (%s): offset %zu, want %zu (%s)", i, bad[i].text, e.offset,
                     bad[i].offset, e.msg);
        assert_true(e.msg[0] != 0);
    }
    /* Depth: 64 levels pass, 65 do not. */
    char deep[200];
    memset(deep, '[', 64);
    memset(deep + 64, ']', 64);
    struct sil_oa_json_doc *d;
    struct sil_oa_json_err e;
    assert_int_equal(sil_oa_json_parse(&d, deep, 128, &e), 0);
    sil_oa_json_free(d);
    memset(deep, '[', 65);
    memset(deep + 65, ']', 65);
    assert_int_equal(sil_oa_json_parse(&d, deep, 130, &e), -EINVAL);
    /* Bounds on values and on members of one object. */
    size_t n = 2 * (SIL_OA_JSON_MAX_VALUES + 1) + 1;
    char *big = malloc(n + 1);
    assert_non_null(big);
    big[0] = '[';
    for (size_t i = 1; i < n; i += 2) {
        big[i] = '0';
        big[i + 1] = ',';
    }
    big[n - 1] = ']';
    assert_int_equal(sil_oa_json_parse(&d, big, n, &e), -EINVAL); /* one value over */
    assert_non_null(strstr(e.msg, "values"));
    memcpy(big + n - 3, "]  ", 3); /* one fewer: at the limit */
    assert_int_equal(sil_oa_json_parse(&d, big, n, &e), 0);
    sil_oa_json_free(d);
    free(big);
    struct sil_oa_buf ob;
    sil_oa_buf_init(&ob, 0);
    sil_oa_buf_cstr(&ob, "{");
    for (int i = 0; i <= SIL_OA_JSON_MAX_MEMBERS; i++)
        sil_oa_buf_printf(&ob, "%s\"k%d\":0", i ? "," : "", i);
    sil_oa_buf_cstr(&ob, "}");
    assert_int_equal(sil_oa_json_parse(&d, ob.data, ob.len, &e), -EINVAL);
    assert_non_null(strstr(e.msg, "members"));
    sil_oa_buf_free(&ob);
}

static void escaper(void **state)
{
    struct sil_oa_buf b;
    sil_oa_buf_init(&b, 0);
    sil_oa_buf_jstr(&b, "a\"\\\n\x01\xc3\xa9\xff", 8);
    /* The bad byte 0xFF becomes U+FFFD; controls are escaped. */
    assert_string_equal(b.data, "\"a\\\"\\\\\\n\\u0001\xc3\xa9\xef\xbf\xbd\"");
    sil_oa_buf_free(&b);
    sil_oa_buf_init(&b, 8);
    sil_oa_buf_cstr(&b, "12345");
    sil_oa_buf_cstr(&b, "6789");
    assert_true(b.failed);
    assert_string_equal(b.data, "12345");
    assert_null(sil_oa_buf_take(&b, NULL));
}

/* Decodes the packed request and returns its params map (msg must be released). */
static const msgpack_object *decode(struct sil_rpc_buf *out, struct sil_rpc_msg *m,
                                    const char *method)
{
    struct sil_rpc_error re;
    assert_int_equal(sil_rpc_decode(sil_rpc_buf_head(out), sil_rpc_buf_size(out), 0, 0, m, &re), 1);
    assert_int_equal(m->type, SIL_RPC_REQUEST);
    assert_string_equal(m->method, method);
    return m->params;
}

static void chat_request(void **state)
{
    const char *body =
        "{\"model\":\"x\",\"messages\":[{\"role\":\"developer\",\"content\":\"sys\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
        "{\"type\":\"text\",\"text\":\"b\"}]},{\"role\":\"assistant\",\"content\":null,"
        "\"reasoning_content\":\"r\"}],\"max_completion_tokens\":7,\"temperature\":0.5,"
        "\"stop\":[\"x\",\"y\"],\"seed\":9,\"stream\":true,\"stream_options\":"
        "{\"include_usage\":true},\"n\":1,\"max_thinking_tokens\":3,\"frequency_penalty\":0,"
        "\"logit_bias\":{\"12\":-100}}";
    struct sil_rpc_buf out;
    sil_rpc_buf_init(&out, 0);
    struct sil_oa_req req;
    struct sil_oa_fail f;
    struct sil_oa_caps caps = {.logit_bias = true};
    int r = sil_oa_request(SIL_OA_CHAT, body, strlen(body), &caps, 5, &out, &req, &f);
    if (r) fail_msg("%s", f.msg);
    assert_true(req.stream && req.include_usage);
    struct sil_rpc_msg m;
    const msgpack_object *p = decode(&out, &m, "chat");
    assert_int_equal(m.msgid, 5);
    assert_int_equal(sil_rpc_map_int(p, "max_tokens", 0), 7);
    assert_int_equal(sil_rpc_map_int(p, "grace_tokens", -1), 0);
    assert_int_equal(sil_rpc_map_int(p, "max_thinking_tokens", 0), 3);
    assert_int_equal(sil_rpc_map_int(p, "seed", 0), 9);
    assert_true(sil_rpc_map_double(p, "temperature", 0) == 0.5);
    const msgpack_object *msgs = sil_rpc_map_get(p, "messages");
    assert_int_equal(msgs->via.array.size, 3);
    char buf[32];
    assert_string_equal(sil_rpc_map_str(&msgs->via.array.ptr[0], "role", buf, 32, ""), "system");
    assert_string_equal(sil_rpc_map_str(&msgs->via.array.ptr[1], "content", buf, 32, ""), "ab");
    assert_string_equal(sil_rpc_map_str(&msgs->via.array.ptr[2], "content", buf, 32, "?"), "");
    assert_string_equal(sil_rpc_map_str(&msgs->via.array.ptr[2], "reasoning", buf, 32, ""), "r");
    assert_int_equal(sil_rpc_map_get(p, "stop")->via.array.size, 2);
    const msgpack_object *lb = sil_rpc_map_get(p, "logit_bias");
    assert_int_equal(lb->type, MSGPACK_OBJECT_MAP);
    assert_int_equal(lb->via.map.ptr[0].key.via.u64, 12);
    /* the model asked for goes to the daemon, which picks it from its models directory */
    assert_string_equal(sil_rpc_map_str(p, "model", buf, 32, ""), "x");
    sil_rpc_msg_release(&m);
    sil_rpc_buf_free(&out);
}

static void completion_request(void **state)
{
    struct sil_rpc_buf out;
    sil_rpc_buf_init(&out, 0);
    struct sil_oa_req req;
    struct sil_oa_fail f;
    struct sil_oa_caps caps = {0};
    const char *body = "{\"prompt\":[[5,6,7]],\"max_tokens\":2}";
    assert_int_equal(
        sil_oa_request(SIL_OA_COMPLETION, body, strlen(body), &caps, 1, &out, &req, &f), 0);
    struct sil_rpc_msg m;
    const msgpack_object *p = decode(&out, &m, "generate");
    const msgpack_object *t = sil_rpc_map_get(p, "prompt_tokens");
    assert_int_equal(t->via.array.size, 3);
    assert_int_equal(t->via.array.ptr[2].via.u64, 7);
    assert_false(req.stream);
    sil_rpc_msg_release(&m);
    sil_rpc_buf_free(&out);
}

/* service_tier names the class, priority the level; a daemon without priorities gets neither. */
static void priority_request(void **state)
{
    static const struct {
        const char *extra, *cls;
        int level;
    } cases[] = {
        {",\"service_tier\":\"priority\",\"priority\":-3", "interactive", -3},
        {",\"service_tier\":\"flex\"", "batch", 0},
        {",\"service_tier\":\"auto\",\"priority\":100", NULL, 100},
        {",\"service_tier\":\"default\"", NULL, 0},
        {"", NULL, 0},
    };
    for (int with = 0; with < 2; with++)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            char body[256];
            snprintf(body, sizeof body, "{\"prompt\":\"a\"%s}", cases[i].extra);
            struct sil_rpc_buf out;
            sil_rpc_buf_init(&out, 0);
            struct sil_oa_req req;
            struct sil_oa_fail f = {0};
            struct sil_oa_caps caps = {.priority = with};
            int r = sil_oa_request(SIL_OA_COMPLETION, body, strlen(body), &caps, 1, &out, &req, &f);
            if (!with && cases[i].level) {
                assert_int_equal(r, -EINVAL); /* a level it cannot honour */
                assert_string_equal(f.param, "priority");
                sil_rpc_buf_free(&out);
                continue;
            }
            if (r) fail_msg("case %zu: %s", i, f.msg);
            struct sil_rpc_msg m;
            const msgpack_object *p = decode(&out, &m, "generate");
            char buf[32];
            const char *cls = sil_rpc_map_str(p, "priority", buf, sizeof buf, "");
            assert_string_equal(cls, with && cases[i].cls ? cases[i].cls : "");
            assert_int_equal(sil_rpc_map_int(p, "priority_level", 0), with ? cases[i].level : 0);
            assert_true(cases[i].level != 0 || !sil_rpc_map_get(p, "priority_level"));
            sil_rpc_msg_release(&m);
            sil_rpc_buf_free(&out);
        }
}

static void refusals(void **state)
{
    static const struct {
        const char *body, *param;
        int status;
    } bad[] = {
        {"[]", "", 400},
        {"{}", "messages", 400},
        {"{\"messages\":[]}", "messages", 400},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "messages[0].role", 400},
        {"{\"messages\":[{\"role\":\"user\"}]}", "messages[0].content", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}",
         "messages[0].content", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000\"}]}", "messages[0].content",
         400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":2}", "n", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"max_tokens\":1.5}", "max_tokens",
         400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"seed\":1e300}", "seed", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"seed\":-1}", "seed", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"temperature\":3}", "temperature",
         400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stop\":[1]}", "stop", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logit_bias\":{\"x\":1}}",
         "logit_bias", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logit_bias\":{\"1\":1}}",
         "logit_bias", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"tools\":[{}]}", "tools", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"service_tier\":\"x\"}",
         "service_tier", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"service_tier\":1}",
         "service_tier", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"priority\":2}", "priority",
         400}, /* no priority in the capabilities */
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stream\":1}", "stream", 400},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"frequency_penalty\":0.5}",
         "frequency_penalty", 400},
    };
    struct sil_oa_caps caps = {0}; /* no logit_bias: a non-empty one is refused */
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sil_rpc_buf out;
        sil_rpc_buf_init(&out, 0);
        struct sil_oa_req req;
        struct sil_oa_fail f = {0};
        int r =
            sil_oa_request(SIL_OA_CHAT, bad[i].body, strlen(bad[i].body), &caps, 1, &out, &req, &f);
        if (r != -EINVAL || f.status != bad[i].status || strcmp(f.param, bad[i].param) != 0)
            fail_msg("case %zu: r %d status %d param '%s' (%s)", i, r, f.status, f.param, f.msg);
        assert_int_equal(sil_rpc_buf_size(&out), 0);
        sil_rpc_buf_free(&out);
    }
}

static void responses(void **state)
{
    /* A daemon result, packed and decoded as it arrives. */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 7);
    sil_rpc_kv_str(&pk, "text", "Hi \"you\"");
    sil_rpc_kv_str(&pk, "reasoning", "hmm");
    sil_rpc_kv_str(&pk, "stop_reason", "eos");
    sil_rpc_kv_int(&pk, "n_prompt", 10);
    sil_rpc_kv_int(&pk, "n_generated", 4);
    sil_rpc_kv_int(&pk, "n_reasoning", 2);
    sil_rpc_kv_int(&pk, "n_cached", 3);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, sb.data, sb.size, NULL), MSGPACK_UNPACK_SUCCESS);
    struct sil_oa_resp r = {.kind = SIL_OA_CHAT, .id = "chatcmpl-1", .created = 5, .model = "m"};
    struct sil_oa_buf b;
    sil_oa_buf_init(&b, 0);
    struct sil_oa_fail f;
    assert_int_equal(sil_oa_format_result(&b, &r, &u.data, &f), 0);
    assert_string_equal(
        b.data,
        "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":5,\"model\":\"m\","
        "\"system_fingerprint\":\"siliceo-" SIL_VERSION "\",\"choices\":[{\"index\":0,"
        "\"message\":{\"role\":\"assistant\",\"content\":\"Hi \\\"you\\\"\","
        "\"reasoning_content\":\"hmm\"},\"logprobs\":null,\"finish_reason\":\"stop\"}],"
        "\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":4,\"total_tokens\":14,"
        "\"prompt_tokens_details\":{\"cached_tokens\":3},"
        "\"completion_tokens_details\":{\"reasoning_tokens\":2}}}");
    struct sil_oa_json_doc *d;
    struct sil_oa_json_err e;
    assert_int_equal(sil_oa_json_parse(&d, b.data, b.len, &e), 0);
    sil_oa_json_free(d);
    sil_oa_buf_reset(&b);
    sil_oa_format_chunk(&b, &r, false, "", 0, "th", 2, NULL, false);
    assert_non_null(strstr(b.data, "\"delta\":{\"reasoning_content\":\"th\"},\"logprobs\":null,"
                                   "\"finish_reason\":null}]}\n\n"));
    assert_int_equal(strncmp(b.data, "data: {", 7), 0);
    sil_oa_buf_free(&b);
    assert_string_equal(sil_oa_finish_reason("length", 6), "length");
    assert_string_equal(sil_oa_finish_reason("context", 7), "length");
    assert_null(sil_oa_finish_reason("cancelled", 9));
    sil_oa_fail_from_rpc(&f, SIL_RPC_E_CONTEXT_FULL, "prompt of 300 tokens does not fit");
    assert_int_equal(f.status, 400);
    assert_string_equal(f.code, "context_length_exceeded");
    sil_oa_fail_from_rpc(&f, SIL_RPC_E_TOO_LARGE, "result too large");
    assert_int_equal(f.status, 400);
    assert_null(f.code);
    sil_oa_fail_from_rpc(&f, SIL_RPC_E_INVALID_PARAMS, "field 'top_k': expected integer");
    assert_int_equal(f.status, 400);
    assert_string_equal(f.param, "top_k");
    sil_oa_fail_from_rpc(&f, SIL_RPC_E_BUSY, "queue full");
    assert_int_equal(f.status, 429);
    sil_oa_fail_from_rpc(&f, SIL_RPC_E_UNAVAILABLE, "model damaged");
    assert_int_equal(f.status, 503);
    sil_oa_fail_from_rpc(&f, SIL_RPC_E_TIMEOUT, "idle");
    assert_int_equal(f.status, 504);
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
}

/* The request log line: counts from the result, the peer's bytes escaped, a long path cut with
 * "...", a short buffer cut but NUL-terminated with the full length returned. */
static void request_log_line(void **state)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 5);
    sil_rpc_kv_str(&pk, "text", "the answer, never logged");
    sil_rpc_kv_str(&pk, "stop_reason", "length");
    sil_rpc_kv_int(&pk, "n_prompt", 21);
    sil_rpc_kv_int(&pk, "n_generated", 7);
    sil_rpc_kv_int(&pk, "n_cached", 16);
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, sb.data, sb.size, NULL), MSGPACK_UNPACK_SUCCESS);

    struct sil_oa_reqlog l;
    char line[512];
    sil_oa_reqlog_start(&l, "POST", "/v1/chat/completions", 10.0);
    strcpy(l.id, "chatcmpl-1");
    strcpy(l.model, "m 1");
    l.status = 200;
    l.stream = true;
    sil_oa_reqlog_counts(&l, &u.data);
    size_t n = sil_oa_reqlog_format(line, sizeof(line), &l, 10.25);
    assert_string_equal(line, "POST /v1/chat/completions chatcmpl-1: 200, model m 1, streamed, "
                              "length, 21 prompt tokens (16 cached), 7 generated, 250.0 ms");
    assert_int_equal(n, strlen(line));

    sil_oa_reqlog_start(&l, "GE\tT", "/a\nb\\c\x7f\xc3\xa9", 1.0);
    l.client_gone = true;
    sil_oa_reqlog_format(line, sizeof(line), &l, 1.0);
    assert_string_equal(line,
                        "GE\\x09T /a\\x0ab\\x5cc\\x7f\\xc3\\xa9: no answer, 0.0 ms, client gone");

    char path[400];
    memset(path, 'p', sizeof(path) - 1);
    path[0] = '/';
    path[sizeof(path) - 1] = 0;
    sil_oa_reqlog_start(&l, "GET", path, 1.0);
    l.status = 404;
    l.ended_early = "timed out";
    n = sil_oa_reqlog_format(line, sizeof(line), &l, 1.0);
    assert_int_equal(n, strlen(line));
    assert_int_equal(strlen(line), 4 + sizeof(l.path) - 1 + 3 + strlen(": 404, 0.0 ms, timed out"));
    assert_non_null(strstr(line, "ppp...: 404, 0.0 ms, timed out"));
    char small[8];
    size_t full = n;
    n = sil_oa_reqlog_format(small, sizeof(small), &l, 1.0);
    assert_int_equal(n, full);
    assert_string_equal(small, "GET /pp");
    msgpack_unpacked_destroy(&u);
    msgpack_sbuffer_destroy(&sb);
}

static void assert_page_file(const char *url, const char *path, const char *type)
{
    struct sil_oa_page_file f;
    assert_int_equal(sil_oa_page_file(url, &f), 0);
    assert_string_equal(f.type, type);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    char *file = malloc(f.len + 1);
    assert_non_null(file);
    assert_int_equal(fread(file, 1, f.len + 1, fp), f.len);
    fclose(fp);
    assert_memory_equal(f.data, file, f.len);
    free(file);
    char etag[24], again[24];
    sil_oa_page_etag(&f, etag, sizeof(etag));
    sil_oa_page_etag(&f, again, sizeof(again));
    assert_int_equal(strlen(etag), 18);
    assert_true(etag[0] == '"' && etag[17] == '"');
    assert_string_equal(etag, again);
    assert_int_equal(strspn(etag + 1, "0123456789abcdef"), 16);
}

/* The embedded chat page's files are chat.html, chat.css and chat.js byte for byte (the test runs
 * from the source tree), each with its type and an ETag, a quoted hash that follows its bytes;
 * other URLs are none of them; the policy lets nothing inline run. */
static void chat_page(void **state)
{
    assert_page_file("/", "client/sil-openai/chat.html", "text/html; charset=utf-8");
    assert_page_file("/index.html", "client/sil-openai/chat.html", "text/html; charset=utf-8");
    assert_page_file("/chat.css", "client/sil-openai/chat.css", "text/css; charset=utf-8");
    assert_page_file("/chat.js", "client/sil-openai/chat.js", "text/javascript; charset=utf-8");
    const char *none[] = {"",   "/index.htm", "/chat.js/", "/CHAT.JS", "/chat.css?x",
                          "//", "chat.js"};
    for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++)
        assert_int_equal(sil_oa_page_file(none[i], NULL), -ENOENT);
    struct sil_oa_page_file html, js;
    assert_int_equal(sil_oa_page_file("/", &html), 0);
    assert_int_equal(sil_oa_page_file("/chat.js", &js), 0);
    char a[24], b[24];
    sil_oa_page_etag(&html, a, sizeof(a));
    sil_oa_page_etag(&js, b, sizeof(b));
    assert_string_not_equal(a, b);
    assert_non_null(strstr(SIL_OA_PAGE_CSP, "default-src 'none'"));
    assert_non_null(strstr(SIL_OA_PAGE_CSP, "script-src 'self';"));
    assert_non_null(strstr(SIL_OA_PAGE_CSP, "style-src 'self';"));
    assert_null(strstr(SIL_OA_PAGE_CSP, "unsafe"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(json_accepts),
        cmocka_unit_test(json_rejects),
        cmocka_unit_test(escaper),
        cmocka_unit_test(chat_request),
        cmocka_unit_test(completion_request),
        cmocka_unit_test(priority_request),
        cmocka_unit_test(refusals),
        cmocka_unit_test(responses),
        cmocka_unit_test(request_log_line),
        cmocka_unit_test(chat_page),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
