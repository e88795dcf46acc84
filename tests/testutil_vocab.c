#include "tests/testutil_vocab.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>

#include <cmocka.h>

#include "daemon/engine/gguf.h"
#include "tests/testutil.h"

static bool printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
}

size_t tu_byte_level(unsigned char b, char *out)
{
    unsigned cp = b;
    if (!printable(b)) { /* the n-th unprintable byte is U+0100 + n */
        cp = 256;
        for (unsigned x = 0; x < b; x++)
            cp += !printable(x);
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xc0 | cp >> 6); /* cp < 0x144 */
    out[1] = (char)(0x80 | (cp & 0x3f));
    return 2;
}

void tu_byte_tokens(const char **toks)
{
    static char store[256][4];
    for (int b = 0; b < 256; b++) {
        size_t l = tu_byte_level((unsigned char)b, store[b]);
        store[b][l] = 0;
        toks[b] = store[b];
    }
}

int tu_vocab_mem(const char *model, const char *pre, const char **toks, int32_t n_tok,
                 const int32_t *types, int32_t n_types, const char **merges, int32_t n_merges,
                 struct sil_vocab **v, struct sil_error *err)
{
    struct tu_buf b = {0};
    uint64_t nkv = (model != NULL) + (pre != NULL) + (toks != NULL) + (types != NULL) +
                   (merges != NULL);
    tu_gguf_header(&b, 3, 0, nkv);
    if (model)
        tu_gguf_kv_str(&b, "tokenizer.ggml.model", model);
    if (pre)
        tu_gguf_kv_str(&b, "tokenizer.ggml.pre", pre);
    if (toks)
        tu_gguf_kv_arr_str(&b, "tokenizer.ggml.tokens", toks, (uint64_t)n_tok);
    if (types)
        tu_gguf_kv_arr_i32(&b, "tokenizer.ggml.token_type", types, (uint64_t)n_types);
    if (merges)
        tu_gguf_kv_arr_str(&b, "tokenizer.ggml.merges", merges, (uint64_t)n_merges);
    tu_put_pad(&b, 32);
    struct sil_gguf *g = NULL;
    int rc = sil_gguf_open_mem(&g, b.p, b.len, "mem.gguf", err);
    if (rc == 0) {
        rc = sil_vocab_load(v, g, err);
        sil_gguf_close(g);
    }
    tu_buf_free(&b);
    return rc;
}

struct sil_vocab *tu_vocab_load(const char *rel)
{
    if (!tu_refdata_exists(rel))
        return NULL;
    char *path = tu_refdata_path(rel);
    struct sil_gguf *g = NULL;
    struct sil_vocab *v = NULL;
    struct sil_error err = {0};
    if (sil_gguf_open(&g, path, &err) < 0 || sil_vocab_load(&v, g, &err) < 0)
        fail_msg("%s: %s", rel, err.msg);
    sil_gguf_close(g); /* the vocab must not depend on the mapping */
    free(path);
    return v;
}
