/* Fuzz target: encode arbitrary bytes, then decode them back in one piece and through the
 * streaming detokenizer; both must give the input back exactly. The first byte picks options:
 * bit 0 parse_special, bit 1 the real Qwen3 vocab ($SHARED/refdata/tokenizer/qwen3-vocab.gguf,
 * when present) instead of a small generated one, bit 2 also render the text as a chat turn.
 * With bit 7 set the rest of the input instead patches the small vocab's GGUF bytes (3 bytes per
 * patch: offset low, offset high, value) and the result is loaded: a vocab that loads must then
 * encode and decode text exactly; one that does not must fail cleanly. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/chat.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer.h"

static struct sil_vocab *small_vocab, *real_vocab;
static unsigned char *small_gguf;
static size_t small_gguf_len;

struct wbuf {
    unsigned char *p;
    size_t n;
};

static void w(struct wbuf *b, const void *p, size_t n)
{
    b->p = realloc(b->p, b->n + n);
    if (!b->p)
        abort();
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

static void w_u32(struct wbuf *b, uint32_t v)
{
    w(b, &v, 4);
}

static void w_u64(struct wbuf *b, uint64_t v)
{
    w(b, &v, 8);
}

static void w_str(struct wbuf *b, const char *s)
{
    w_u64(b, strlen(s));
    w(b, s, strlen(s));
}

/* GPT-2 byte-level text of byte c. */
static void byte_text(unsigned c, char *o)
{
    unsigned n = 0;
    for (unsigned x = 0; x < c; x++)
        n += !((x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || x >= 0xae);
    bool printable = (c >= 0x21 && c <= 0x7e) || (c >= 0xa1 && c <= 0xac) || c >= 0xae;
    unsigned cp = printable ? c : 256 + n;
    if (cp < 0x80) {
        o[0] = (char)cp;
        o[1] = 0;
    } else {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        o[2] = 0;
    }
}

/* 256 byte tokens, a few merges and the ChatML specials. */
static void make_small(void)
{
    static const char *extra[] = {"he", "ll", "hell", "hello", "\xc4\xa0t", "\xc4\xa0th",
                                  "<|im_start|>", "<|im_end|>", "<think>", "</think>",
                                  "<|endoftext|>"};
    static const char *merges[] = {"h e", "l l", "he ll", "hell o", "\xc4\xa0 t", "\xc4\xa0t h"};
    static const int32_t extra_type[] = {1, 1, 1, 1, 1, 1, 3, 3, 4, 4, 3};
    const uint32_t n_tok = 256 + sizeof extra / sizeof extra[0];
    struct wbuf b = {0};
    w(&b, "GGUF", 4);
    w_u32(&b, 3);
    w_u64(&b, 0);
    w_u64(&b, 6);
    w_str(&b, "tokenizer.ggml.model");
    w_u32(&b, 8);
    w_str(&b, "gpt2");
    w_str(&b, "tokenizer.ggml.pre");
    w_u32(&b, 8);
    w_str(&b, "qwen2");
    w_str(&b, "tokenizer.ggml.tokens");
    w_u32(&b, 9);
    w_u32(&b, 8);
    w_u64(&b, n_tok);
    for (unsigned c = 0; c < 256; c++) {
        char t[4];
        byte_text(c, t);
        w_str(&b, t);
    }
    for (size_t i = 0; i < sizeof extra / sizeof extra[0]; i++)
        w_str(&b, extra[i]);
    w_str(&b, "tokenizer.ggml.token_type");
    w_u32(&b, 9);
    w_u32(&b, 5);
    w_u64(&b, n_tok);
    for (unsigned i = 0; i < n_tok; i++)
        w_u32(&b, i < 256 ? 1 : (uint32_t)extra_type[i - 256]);
    w_str(&b, "tokenizer.ggml.merges");
    w_u32(&b, 9);
    w_u32(&b, 8);
    w_u64(&b, sizeof merges / sizeof merges[0]);
    for (size_t i = 0; i < sizeof merges / sizeof merges[0]; i++)
        w_str(&b, merges[i]);
    w_str(&b, "tokenizer.ggml.bos_token_id");
    w_u32(&b, 4);
    w_u32(&b, n_tok - 1);
    while (b.n % 32)
        w(&b, "", 1);
    small_gguf = b.p;
    small_gguf_len = b.n;
    struct sil_gguf *g = NULL;
    struct sil_error err = {0};
    if (sil_gguf_open_mem(&g, b.p, b.n, "small.gguf", &err) < 0 ||
        sil_vocab_load(&small_vocab, g, &err) < 0) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err.msg);
        abort();
    }
    sil_gguf_close(g);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    make_small();
    const char *shared = getenv("SHARED");
    char path[4096];
    snprintf(path, sizeof path, "%s/refdata/tokenizer/qwen3-vocab.gguf",
             shared ? shared : "../shared");
    struct sil_gguf *g = NULL;
    struct sil_error err = {0};
    if (sil_gguf_open(&g, path, &err) == 0) {
        if (sil_vocab_load(&real_vocab, g, &err) < 0)
            real_vocab = NULL;
        sil_gguf_close(g);
    }
    return 0;
}

static void fuzz_load(const uint8_t *p, size_t n)
{
    unsigned char *buf = malloc(small_gguf_len);
    memcpy(buf, small_gguf, small_gguf_len);
    for (size_t i = 0; i + 3 <= n; i += 3)
        buf[(p[i] | (size_t)p[i + 1] << 8) % small_gguf_len] = p[i + 2];
    struct sil_gguf *g = NULL;
    struct sil_vocab *v = NULL;
    struct sil_error err = {0};
    if (sil_gguf_open_mem(&g, buf, small_gguf_len, "patched.gguf", &err) == 0) {
        if (sil_vocab_load(&v, g, &err) == 0) {
            sil_gguf_close(g); /* the vocab must not need the mapping */
            g = NULL;
            static const char text[] = "hello <|im_start|>the\xff\xc3 <think>\n  x";
            int32_t *ids = NULL;
            size_t k = 0;
            char *dec = NULL;
            size_t dlen = 0;
            if (sil_tokenize(v, text, sizeof text - 1, true, true, &ids, &k, &err) < 0 ||
                sil_detokenize(v, ids, k, true, &dec, &dlen, &err) < 0)
                abort();
            int32_t bos = sil_vocab_bos(v);
            const char *bt = "";
            int bl = bos >= 0 ? sil_token_bytes(v, bos, &bt) : 0;
            if (bl < 0 || dlen != (size_t)bl + sizeof text - 1 ||
                memcmp(dec + bl, text, sizeof text - 1) != 0)
                abort();
            free(dec);
            free(ids);
            sil_vocab_free(v);
        } else if (err.msg[0] == 0) {
            abort(); /* a failure must say why */
        }
    }
    if (g)
        sil_gguf_close(g);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned flags = data[0];
    if (flags & 0x80) {
        fuzz_load(data + 1, size - 1);
        return 0;
    }
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    const struct sil_vocab *v = (flags & 2) && real_vocab ? real_vocab : small_vocab;
    bool parse_special = flags & 1;

    int32_t *ids = NULL;
    size_t n = 0;
    struct sil_error err = {0};
    if (sil_tokenize(v, text, len, false, parse_special, &ids, &n, &err) < 0)
        abort();
    if (n > len)
        abort();
    char *dec = NULL;
    size_t dlen = 0;
    if (sil_detokenize(v, ids, n, true, &dec, &dlen, &err) < 0)
        abort();
    if (dlen != len || memcmp(dec, text, len) != 0)
        abort();

    struct sil_detok d;
    sil_detok_init(&d, v, true);
    char *stream = malloc(len + 16);
    char chunk[4096];
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int r = sil_detok_push(&d, ids[i], chunk, sizeof chunk);
        if (r < 0 || o + (size_t)r > len)
            abort();
        memcpy(stream + o, chunk, (size_t)r);
        o += (size_t)r;
    }
    int r = sil_detok_flush(&d, chunk, sizeof chunk);
    if (r < 0 || o + (size_t)r != len)
        abort();
    memcpy(stream + o, chunk, (size_t)r);
    if (memcmp(stream, text, len) != 0)
        abort();

    if (flags & 4) {
        char *content = malloc(len + 1);
        memcpy(content, text, len);
        content[len] = 0;
        struct sil_chat_msg m[3] = {{"user", content, NULL},
                                    {"assistant", content, NULL},
                                    {"user", content, NULL}};
        char *out = NULL;
        size_t olen = 0;
        if (sil_chat_render(v, m, 1 + (flags >> 3) % 3, flags & 8, flags & 16, &out, &olen,
                            &err) == 0)
            free(out);
        free(content);
    }
    free(stream);
    free(dec);
    free(ids);
    return 0;
}
