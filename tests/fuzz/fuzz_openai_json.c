/* sil-openai's request parser on arbitrary bytes: the strict JSON parser must accept or refuse
 * with an offset inside the input, never crash; an accepted chat or completion request must pack
 * into a daemon message that decodes as a valid request; a parsed string written back with the
 * escaper must parse again to the same bytes. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/sil-openai/openai.h"

static void roundtrip(const struct sil_oa_json *v)
{
    if (v->type == SIL_OA_JSON_STRING) {
        struct sil_oa_buf b;
        sil_oa_buf_init(&b, 0);
        sil_oa_buf_jstr(&b, v->str, v->len);
        struct sil_oa_json_doc *d;
        struct sil_oa_json_err e;
        if (b.failed) __builtin_trap();
        if (sil_oa_json_parse(&d, b.data, b.len, &e) != 0) __builtin_trap();
        const struct sil_oa_json *r = sil_oa_json_root(d);
        if (r->type != SIL_OA_JSON_STRING || r->len != v->len || memcmp(r->str, v->str, v->len))
            __builtin_trap();
        sil_oa_json_free(d);
        sil_oa_buf_free(&b);
    }
    size_t n = 0;
    for (const struct sil_oa_json *c = v->child; c; c = c->next, n++)
        roundtrip(c);
    if (n != v->n) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sil_oa_json_doc *d;
    struct sil_oa_json_err e = {0};
    int r = sil_oa_json_parse(&d, (const char *)data, size, &e);
    if (r == 0) {
        roundtrip(sil_oa_json_root(d));
        sil_oa_json_free(d);
    } else if (r != -EINVAL || e.offset > size || !e.msg[0]) {
        __builtin_trap();
    }
    for (int k = 0; k < 2; k++) {
        struct sil_rpc_buf out;
        sil_rpc_buf_init(&out, 0);
        struct sil_oa_req req;
        struct sil_oa_fail f = {0};
        struct sil_oa_caps caps = {.logit_bias = size & 1};
        r = sil_oa_request(k ? SIL_OA_COMPLETION : SIL_OA_CHAT, (const char *)data, size, &caps, 7,
                           &out, &req, &f);
        if (r == 0) {
            struct sil_rpc_msg m;
            struct sil_rpc_error re;
            if (sil_rpc_decode(sil_rpc_buf_head(&out), sil_rpc_buf_size(&out), 0, 0, &m, &re) != 1)
                __builtin_trap();
            if (m.type != SIL_RPC_REQUEST || m.msgid != 7 || !m.params) __builtin_trap();
            sil_rpc_msg_release(&m);
        } else if (f.status < 400 || f.status > 599 || !f.msg[0]) {
            __builtin_trap();
        } else {
            struct sil_oa_buf b;
            sil_oa_buf_init(&b, 0);
            sil_oa_format_error(&b, &f);
            struct sil_oa_json_doc *ed;
            if (sil_oa_json_parse(&ed, b.data, b.len, &e) != 0) /* the error is valid JSON */
                __builtin_trap();
            sil_oa_json_free(ed);
            sil_oa_buf_free(&b);
        }
        sil_rpc_buf_free(&out);
    }
    return 0;
}
