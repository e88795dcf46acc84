/* Tokenizer: every reference vector encodes to exactly the expected ids and decodes back to its
 * text (Qwen3 "qwen2" and Llama 3 "llama-bpe" vocabs); BPE agrees with a naive reference BPE
 * written here on random long words; special tokens are matched only when asked; invalid UTF-8,
 * empty and 1 MB inputs; the streaming detokenizer under arbitrary splits; load errors from
 * generated GGUFs. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer.h"
#include "tests/testutil.h"
#include "tests/testutil_json.h"
#include "tests/testutil_vocab.h"

static struct sil_vocab *qwen3, *llama3;

static int setup(void **state)
{
    qwen3 = tu_vocab_load("tokenizer/qwen3-vocab.gguf");
    llama3 = tu_vocab_load("tokenizer/llama3-vocab.gguf");
    return 0;
}

static int teardown(void **state)
{
    sil_vocab_free(qwen3);
    sil_vocab_free(llama3);
    return 0;
}

static void encode(const struct sil_vocab *v, const char *t, size_t n, bool bos, bool special,
                   int32_t **ids, size_t *n_ids)
{
    struct sil_error err = {0};
    int rc = sil_tokenize(v, t, n, bos, special, ids, n_ids, &err);
    if (rc)
        fail_msg("tokenize: %d %s", rc, err.msg);
    assert_non_null(*ids);
}

static void assert_ids(const int32_t *got, size_t n_got, const struct sil_json *want, const char *what)
{
    assert_non_null(want);
    bool same = want->type == SIL_JSON_ARR && n_got == (size_t)want->n_children;
    const struct sil_json *e = want->child;
    for (size_t i = 0; same && i < n_got; i++, e = e->next)
        same = got[i] == (int32_t)e->num;
    if (!same) {
        char g[256] = "", w[256] = "";
        for (size_t i = 0; i < n_got && i < 16; i++)
            snprintf(g + strlen(g), sizeof g - strlen(g), "%d ", got[i]);
        e = want->child;
        for (size_t i = 0; e && i < 16; i++, e = e->next)
            snprintf(w + strlen(w), sizeof w - strlen(w), "%d ", (int32_t)e->num);
        fail_msg("%s: got %zu ids [%s...] want %lld [%s...]", what, n_got, g, (long long)want->n_children, w);
    }
}

static void roundtrip(const struct sil_vocab *v, const char *t, size_t n, const int32_t *ids,
                      size_t n_ids)
{
    char *out;
    size_t len;
    struct sil_error err = {0};
    assert_int_equal(sil_detokenize(v, ids, n_ids, false, &out, &len, &err), 0);
    assert_int_equal(len, n);
    assert_memory_equal(out, t, n);
    assert_int_equal(out[len], 0);
    free(out);
}


static void check_vectors(const struct sil_vocab *v, const char *rel, const char *pre)
{
    if (!v)
        tu_skip_no_refdata();
    assert_string_equal(sil_vocab_pre(v), pre);
    struct sil_json_doc *d = tu_json_load(rel);
    assert_non_null(d);
    const struct sil_json *vec = sil_json_get(sil_json_root(d), "vectors");
    assert_non_null(vec);
    assert_true(vec->n_children >= 90);
    size_t i = 0;
    for (const struct sil_json *e = vec->child; e; e = e->next, i++) {
        const struct sil_json *text = sil_json_get(e, "text"), *want = sil_json_get(e, "ids");
        assert_non_null(text);
        int32_t *ids;
        size_t n;
        encode(v, text->str, text->len, false, false, &ids, &n);
        char what[64];
        snprintf(what, sizeof what, "%s vector %zu", rel, i);
        assert_ids(ids, n, want, what);
        roundtrip(v, text->str, text->len, ids, n);
        free(ids);
    }
    const struct sil_json *ps = sil_json_get(sil_json_root(d), "parse_special");
    size_t checked = 0;
    for (const struct sil_json *e = ps ? ps->child : NULL; e; e = e->next) {
        if (!sil_json_get(e, "agree")->b)
            continue;
        const struct sil_json *text = sil_json_get(e, "text");
        int32_t *ids;
        size_t n;
        encode(v, text->str, text->len, false, true, &ids, &n);
        assert_ids(ids, n, sil_json_get(e, "ids_hf"), "parse_special vector");
        /* decoding with specials gives the text back */
        char *out;
        size_t len;
        assert_int_equal(sil_detokenize(v, ids, n, true, &out, &len, NULL), 0);
        assert_int_equal(len, text->len);
        assert_memory_equal(out, text->str, len);
        free(out);
        free(ids);
        checked++;
    }
    assert_true(checked >= 3);
    sil_json_free(d);
}

static void test_qwen3_vectors(void **state)
{
    check_vectors(qwen3, "tokenizer/qwen3-vectors.json", "qwen2");
}

static void test_llama3_vectors(void **state)
{
    check_vectors(llama3, "tokenizer/llama3-vectors.json", "llama-bpe");
}


static void test_special_ids(void **state)
{
    if (!qwen3 || !llama3)
        tu_skip_no_refdata();
    assert_int_equal(sil_vocab_n_tokens(qwen3), 151936);
    assert_int_equal(sil_vocab_bos(qwen3), 151643);
    assert_int_equal(sil_vocab_eos(qwen3), 151645);
    assert_int_equal(sil_vocab_pad(qwen3), 151643);
    assert_int_equal(sil_vocab_im_start(qwen3), 151644);
    assert_int_equal(sil_vocab_im_end(qwen3), 151645);
    assert_int_equal(sil_vocab_eot(qwen3), 151645);
    assert_int_equal(sil_vocab_think_open(qwen3), 151667);
    assert_int_equal(sil_vocab_think_close(qwen3), 151668);
    assert_false(sil_vocab_add_bos(qwen3));
    assert_true(sil_vocab_is_eog(qwen3, 151645));
    assert_true(sil_vocab_is_eog(qwen3, 151643));
    assert_false(sil_vocab_is_eog(qwen3, 151644));
    assert_false(sil_vocab_is_eog(qwen3, 100));
    assert_true(sil_vocab_is_special(qwen3, 151644));
    assert_true(sil_vocab_is_special(qwen3, 151667));
    assert_false(sil_vocab_is_special(qwen3, 1000));
    assert_false(sil_vocab_is_special(qwen3, -1));
    assert_int_equal(sil_vocab_find(qwen3, "<think>", 7), 151667);
    assert_int_equal(sil_vocab_find(qwen3, "\xc4\xa0the", 5), 279); /* "Ġthe" */
    assert_int_equal(sil_vocab_find(qwen3, "no such token here", 18), -1);

    assert_true(sil_vocab_add_bos(llama3));
    assert_int_equal(sil_vocab_bos(llama3), 128000);
    assert_int_equal(sil_vocab_eos(llama3), 128001);
    assert_int_equal(sil_vocab_im_start(llama3), -1);
    assert_int_equal(sil_vocab_think_open(llama3), -1);
    assert_int_equal(sil_vocab_eot(llama3), 128009);
    assert_true(sil_vocab_is_eog(llama3, 128009));
    assert_true(sil_vocab_is_eog(llama3, 128001));

    const char *b;
    assert_int_equal(sil_token_bytes(qwen3, 279, &b), 4);
    assert_memory_equal(b, " the", 4);
    assert_int_equal(sil_token_bytes(qwen3, 151644, &b), 12);
    assert_memory_equal(b, "<|im_start|>", 12);
    assert_int_equal(sil_token_bytes(qwen3, -1, &b), -EINVAL);
    assert_int_equal(sil_token_bytes(qwen3, 151936, &b), -EINVAL);
}

static void test_add_bos(void **state)
{
    if (!llama3)
        tu_skip_no_refdata();
    int32_t *ids;
    size_t n;
    encode(llama3, "hi", 2, true, false, &ids, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 128000);
    assert_int_equal(ids[1], 6151);
    free(ids);
    encode(llama3, "", 0, true, false, &ids, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 128000);
    free(ids);
}


static bool has_id(const int32_t *ids, size_t n, int32_t id)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

static void test_special_only_when_asked(void **state)
{
    if (!qwen3)
        tu_skip_no_refdata();
    static const char *const texts[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>",
                                        "x<|im_start|>user\ny<|im_end|>z"};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        const char *t = texts[i];
        int32_t *ids;
        size_t n;
        encode(qwen3, t, strlen(t), false, false, &ids, &n);
        for (size_t k = 0; k < n; k++)
            assert_false(sil_vocab_is_special(qwen3, ids[k]));
        roundtrip(qwen3, t, strlen(t), ids, n);
        free(ids);
        encode(qwen3, t, strlen(t), false, true, &ids, &n);
        assert_true(has_id(ids, n, i == 2 ? 151643 : 151644) || has_id(ids, n, 151645));
        free(ids);
    }
    int32_t *ids;
    size_t n;
    encode(qwen3, "<|im_start|>", 12, false, true, &ids, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 151644);
    free(ids);
    /* user-defined tokens (<think>) are matched always, as both reference tokenizers do */
    encode(qwen3, "a<think>b", 9, false, false, &ids, &n);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 151667);
    free(ids);
    /* longest match first: "<|im_start|>" must not be read as a shorter special */
    encode(qwen3, "<|im_start|><|im_end|>", 22, false, true, &ids, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 151644);
    assert_int_equal(ids[1], 151645);
    free(ids);
    /* a truncated special is plain text */
    encode(qwen3, "<|im_start|", 11, false, true, &ids, &n);
    for (size_t k = 0; k < n; k++)
        assert_false(sil_vocab_is_special(qwen3, ids[k]));
    free(ids);
    /* with_special=false hides control tokens, keeps user-defined ones */
    int32_t seq[] = {151644, 872, 151667, 151645};
    char *out;
    size_t len;
    assert_int_equal(sil_detokenize(qwen3, seq, 4, false, &out, &len, NULL), 0);
    assert_string_equal(out, "user<think>");
    free(out);
    assert_int_equal(sil_detokenize(qwen3, seq, 4, true, &out, &len, NULL), 0);
    assert_string_equal(out, "<|im_start|>user<think><|im_end|>");
    free(out);
    int32_t bad[] = {1, 151936};
    struct sil_error err = {0};
    assert_int_equal(sil_detokenize(qwen3, bad, 2, true, &out, &len, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "ids[1]"));
}


static uint64_t rng_state = 0x1234567887654321ULL;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static void test_empty_and_invalid_utf8(void **state)
{
    if (!qwen3)
        tu_skip_no_refdata();
    int32_t *ids;
    size_t n;
    encode(qwen3, "", 0, false, true, &ids, &n);
    assert_int_equal(n, 0);
    free(ids);
    encode(qwen3, NULL, 0, false, false, &ids, &n);
    assert_int_equal(n, 0);
    free(ids);

    const char bad[] = "ok \xff\xfe \xc3( \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 end\xc3";
    encode(qwen3, bad, sizeof bad - 1, false, false, &ids, &n);
    assert_true(n > 5);
    roundtrip(qwen3, bad, sizeof bad - 1, ids, n);
    free(ids);

    char buf[512];
    for (int it = 0; it < 300; it++) {
        size_t len = rnd() % sizeof buf;
        for (size_t i = 0; i < len; i++) {
            uint32_t r = rnd();
            /* mostly bytes that matter: ASCII, UTF-8 leads and continuations, '<' */
            buf[i] = (char)(r % 4 == 0   ? 0x80 + (r >> 8) % 0x80
                            : r % 4 == 1 ? '<' + (r >> 8) % 3
                                         : (r >> 8));
        }
        for (int sp = 0; sp < 2; sp++) {
            encode(qwen3, buf, len, false, sp, &ids, &n);
            assert_true(n <= len);
            char *out;
            size_t olen;
            assert_int_equal(sil_detokenize(qwen3, ids, n, true, &out, &olen, NULL), 0);
            assert_int_equal(olen, len);
            assert_memory_equal(out, buf, len);
            free(out);
            free(ids);
        }
    }
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 1 MB without whitespace must take well under a second; a quadratic merge or regex would take
 * minutes. The bound is loose because the test machine is shared. */
static void test_1mb_inputs(void **state)
{
    if (!qwen3 || !llama3)
        tu_skip_no_refdata();
    size_t len = 1 << 20;
    char *t = malloc(len);
    assert_non_null(t);
    for (int kind = 0; kind < 8; kind++) {
        for (size_t i = 0; i < len; i++) {
            switch (kind) {
            case 0: t[i] = 'a'; break;
            case 1: t[i] = (char)('a' + rnd() % 26); break;
            case 2: t[i] = ' '; break;
            case 3: t[i] = (char)('0' + rnd() % 10); break;
            case 4: t[i] = "!?.,;"[rnd() % 5]; break;
            case 5: t[i] = "\xe4\xb8\xad"[i % 3]; break; /* one CJK character repeated */
            case 6: t[i] = (char)(rnd() % 3 ? 'x' : '\n'); break;
            default: t[i] = "<|"[rnd() % 2]; break; /* special-token prefixes everywhere */
            }
        }
        for (int v = 0; v < 2; v++) {
            const struct sil_vocab *voc = v ? llama3 : qwen3;
            int32_t *ids;
            size_t n;
            double t0 = now();
            encode(voc, t, len, false, kind == 7, &ids, &n);
            double dt = now() - t0;
            if (dt > 3.0)
                fail_msg("1 MB input kind %d took %.2f s", kind, dt);
            assert_true(n > 0 && n <= len);
            roundtrip(voc, t, len, ids, n);
            free(ids);
        }
    }
    free(t);
}


static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

struct ref_bpe {
    char **merges; /* "A B" strings, sorted */
    int32_t *rank; /* rank of merges[i] */
    size_t n;
};

/* Independent of tokenizer_bpe.c: ranks by binary search on the merge strings, results found by
 * their stored text, one O(n^2) pass per merge. */
static void ref_load(struct ref_bpe *r)
{
    char *path = tu_refdata_path("tokenizer/qwen3-vocab.gguf");
    struct sil_gguf *g;
    struct sil_error err;
    assert_int_equal(sil_gguf_open(&g, path, &err), 0);
    enum sil_gguf_vtype et;
    uint64_t n;
    int64_t ki;
    assert_int_equal(sil_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, &ki, &err), 0);
    r->merges = malloc(n * sizeof *r->merges);
    r->rank = malloc(n * sizeof *r->rank);
    r->n = n;
    for (uint64_t j = 0; j < n; j++) {
        struct sil_str s = sil_gguf_arr_str(g, ki, j);
        r->merges[j] = malloc(s.len + 1 + 12);
        memcpy(r->merges[j], s.ptr, s.len);
        r->merges[j][s.len] = 0;
        /* remember the rank after the NUL */
        memcpy(r->merges[j] + s.len + 1, &j, sizeof(uint32_t));
    }
    qsort(r->merges, n, sizeof *r->merges, cmp_str);
    for (uint64_t j = 0; j < n; j++)
        memcpy(&r->rank[j], r->merges[j] + strlen(r->merges[j]) + 1, sizeof(uint32_t));
    sil_gguf_close(g);
    free(path);
}

static int32_t ref_rank(const struct ref_bpe *r, const char *a, const char *b)
{
    char key[1024];
    snprintf(key, sizeof key, "%s %s", a, b);
    const char *k = key;
    char **hit = bsearch(&k, r->merges, r->n, sizeof *r->merges, cmp_str);
    /* duplicates: the lowest rank among equal strings */
    if (!hit)
        return INT32_MAX;
    int32_t best = r->rank[hit - r->merges];
    for (char **p = hit; p > r->merges && !strcmp(p[-1], key); p--)
        if (r->rank[p - 1 - r->merges] < best)
            best = r->rank[p - 1 - r->merges];
    for (char **p = hit; p + 1 < r->merges + r->n && !strcmp(p[1], key); p++)
        if (r->rank[p + 1 - r->merges] < best)
            best = r->rank[p + 1 - r->merges];
    return best;
}

static size_t ref_encode(const struct ref_bpe *r, const char *w, size_t len, int32_t *out)
{
    char *sym[1024];
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        sym[n] = calloc(1, 4096);
        tu_byte_level((unsigned char)w[i], sym[n]);
        n++;
    }
    for (;;) {
        int32_t best = INT32_MAX;
        size_t at = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            int32_t rk = ref_rank(r, sym[i], sym[i + 1]);
            if (rk < best)
                best = rk, at = i;
        }
        if (best == INT32_MAX)
            break;
        strcat(sym[at], sym[at + 1]);
        free(sym[at + 1]);
        memmove(sym + at + 1, sym + at + 2, (n - at - 2) * sizeof *sym);
        n--;
    }
    for (size_t i = 0; i < n; i++) {
        out[i] = sil_vocab_find(qwen3, sym[i], strlen(sym[i]));
        free(sym[i]);
    }
    return n;
}

static void test_bpe_matches_reference(void **state)
{
    if (!qwen3)
        tu_skip_no_refdata();
    struct ref_bpe r;
    ref_load(&r);
    /* letters only (one pre-tokenizer word each), ASCII and multi-byte, short and long */
    static const char *const alpha[] = {"a", "e", "i", "n", "t", "s", "r", "th", "in", "é",
                                        "ñ", "ß", "中", "文", "Ж", "z", "q", "ing", "tion"};
    char w[700];
    int32_t want[1024];
    for (int it = 0; it < 240; it++) {
        size_t len = 0;
        if (rnd() % 2)
            w[len++] = ' ';
        size_t target = it < 200 ? 1 + rnd() % 24 : 25 + rnd() % 300;
        while (len < target) {
            const char *a = alpha[rnd() % (sizeof alpha / sizeof alpha[0])];
            memcpy(w + len, a, strlen(a));
            len += strlen(a);
        }
        int32_t *ids;
        size_t n;
        encode(qwen3, w, len, false, false, &ids, &n);
        size_t wn = ref_encode(&r, w, len, want);
        if (n != wn || memcmp(ids, want, n * sizeof *ids) != 0)
            fail_msg("word %d (%zu bytes): %zu ids vs reference %zu", it, len, n, wn);
        free(ids);
    }
    for (size_t j = 0; j < r.n; j++)
        free(r.merges[j]);
    free(r.merges);
    free(r.rank);
}

/* Whitespace is Unicode White_Space (U+0085, U+00A0, U+2028, U+3000 ...), not PCRE2's \s, which
 * also takes U+180E; letters are those of Unicode 15.1 even with an older PCRE2. Expected ids
 * measured with llama.cpp's llama-tokenize on qwen3-vocab.gguf. */
static void test_whitespace_set(void **state)
{
    if (!qwen3)
        tu_skip_no_refdata();
    static const struct {
        const char *text;
        int32_t ids[20];
        size_t n;
    } cases[] = {
        {"a  \xe1\xa0\x8e"
         "b",
         {64, 220, 86089, 254, 236, 65},
         6},
        {"x\xc2\x85y\xc2\xa0 z\xe2\x80\xa8w\xe3\x80\x80 v  \xe1\xa0\x8e\n",
         {87, 126, 227, 88, 4102, 1147, 378, 101, 86, 22441, 348, 220, 86089, 254, 236, 198},
         16},
        /* Unicode 15 letters, digits and marks: U+31350 (CJK ext. H), U+1D2C1, U+0CF3 */
        {"x \xf0\xb1\x8d\x90'd \xf0\x9d\x8b\x81\xf0\x9d\x8b\x82 \xe0\xb3\xb3",
         {87, 220, 172, 109, 235, 238, 4172, 220, 56252, 233, 223, 56252, 233, 224, 27982, 111,
          111},
         17},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int32_t *ids;
        size_t n;
        encode(qwen3, cases[c].text, strlen(cases[c].text), false, false, &ids, &n);
        assert_int_equal(n, cases[c].n);
        assert_memory_equal(ids, cases[c].ids, n * sizeof *ids);
        free(ids);
    }
}

/* Word cache: a long text with many repeated words encodes exactly like the words one by one. */
static void test_cache_consistency(void **state)
{
    if (!qwen3)
        tu_skip_no_refdata();
    static const char *const words[] = {" hello", " world", ",", " ciao", " 世界", "\n", "  ",
                                        " internationalization", " the", "123"};
    size_t cap = 64 * 1024, len = 0;
    char *t = malloc(cap + 64);
    int32_t *want = malloc(cap * sizeof *want);
    size_t nw = 0;
    while (len < cap) {
        const char *w = words[rnd() % 9]; /* not the trailing-space word: keeps words apart */
        memcpy(t + len, w, strlen(w));
        len += strlen(w);
    }
    t[len] = 0;
    int32_t *ids;
    size_t n;
    encode(qwen3, t, len, false, false, &ids, &n);
    roundtrip(qwen3, t, len, ids, n);
    int32_t *small;
    size_t ns;
    /* the same text in ~1000-byte chunks (below the cache threshold), cut before a single space
     * that starts a word, where the pre-tokenizer splits anyway */
    size_t pos = 0;
    while (pos < len) {
        size_t end = pos + 1000 < len ? pos + 1000 : len;
        while (end < len && !(t[end] == ' ' && t[end - 1] != ' ' && t[end - 1] != '\n' &&
                              t[end + 1] != ' ' && t[end + 1] != '\n'))
            end++;
        encode(qwen3, t + pos, end - pos, false, false, &small, &ns);
        memcpy(want + nw, small, ns * sizeof *small);
        nw += ns;
        free(small);
        pos = end;
    }
    assert_int_equal(n, nw);
    assert_memory_equal(ids, want, n * sizeof *ids);
    free(ids);
    free(want);
    free(t);
}


static bool valid_utf8(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = p[i];
        size_t l = c < 0x80                 ? 1
                   : c >= 0xc2 && c <= 0xdf ? 2
                   : c >= 0xe0 && c <= 0xef ? 3
                   : c >= 0xf0 && c <= 0xf4 ? 4
                                            : 0;
        if (!l || i + l > n)
            return false;
        for (size_t k = 1; k < l; k++)
            if ((p[i + k] & 0xc0) != 0x80)
                return false;
        i += l;
    }
    return true;
}

/* The text cut at random byte offsets, each piece encoded alone: the ids then split characters
 * anywhere. Streaming them must give the text back, and every chunk of valid text must itself be
 * valid UTF-8. */
static void stream_check(const struct sil_vocab *v, const char *t, size_t len, bool valid)
{
    int32_t ids[4096];
    size_t n = 0, pos = 0;
    while (pos < len) {
        size_t cut = pos + 1 + rnd() % 6;
        if (cut > len)
            cut = len;
        int32_t *p;
        size_t k;
        encode(v, t + pos, cut - pos, false, false, &p, &k);
        assert_true(n + k <= 4096);
        memcpy(ids + n, p, k * sizeof *p);
        n += k;
        free(p);
        pos = cut;
    }
    struct sil_detok d;
    sil_detok_init(&d, v, false);
    char out[8192], chunk[512];
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        int r = sil_detok_push(&d, ids[i], chunk, sizeof chunk);
        assert_true(r >= 0);
        if (valid && r > 0 && !valid_utf8(chunk, (size_t)r))
            fail_msg("chunk %zu is not valid UTF-8", i);
        assert_true(d.n_pending >= 0 && d.n_pending <= 3);
        memcpy(out + o, chunk, (size_t)r);
        o += (size_t)r;
    }
    int r = sil_detok_flush(&d, chunk, sizeof chunk);
    assert_true(r >= 0);
    memcpy(out + o, chunk, (size_t)r);
    o += (size_t)r;
    assert_int_equal(d.n_pending, 0);
    assert_int_equal(o, len);
    assert_memory_equal(out, t, len);
    if (valid)
        assert_int_equal(r, 0); /* nothing of valid text is left for flush */
}

static void test_detok_split_anywhere(void **state)
{
    if (!qwen3)
        tu_skip_no_refdata();
    static const char *const texts[] = {
        "Perfetto 👍 così è più bello — 世界 🇮🇹 ZWJ: 👨‍👩‍👧 end",
        "ascii only, nothing to hold back",
        "\xf4\x8f\xbf\xbf max code point, \xef\xbf\xbd replacement, 한국어 텍스트",
    };
    for (int it = 0; it < 200; it++) {
        const char *t = texts[it % 3];
        stream_check(qwen3, t, strlen(t), true);
    }
    /* invalid input comes back byte for byte */
    const char bad[] = "a\xe4\xb8 b\xf0\x9f\x98\x80\xf0 \xc3\xc3\xa9 \x80\x80 \xed\xa0\x80z\xe4";
    for (int it = 0; it < 200; it++)
        stream_check(qwen3, bad, sizeof bad - 1, false);
}

static void test_detok_specials_and_space(void **state)
{
    if (!qwen3)
        tu_skip_no_refdata();
    struct sil_detok d;
    char out[64];
    sil_detok_init(&d, qwen3, true);
    assert_int_equal(sil_detok_push(&d, 151644, out, sizeof out), 12);
    assert_memory_equal(out, "<|im_start|>", 12);
    sil_detok_init(&d, qwen3, false);
    assert_int_equal(sil_detok_push(&d, 151644, out, sizeof out), 0);
    assert_int_equal(sil_detok_push(&d, -1, out, sizeof out), -EINVAL);
    /* too small a buffer: -ENOSPC and nothing consumed */
    assert_int_equal(sil_detok_push(&d, 279, out, 2), -ENOSPC);
    assert_int_equal(d.n_pending, 0);
    assert_int_equal(sil_detok_push(&d, 279, out, sizeof out), 4);
    assert_memory_equal(out, " the", 4);
    /* a held-back lead byte followed by a special token is emitted, not lost */
    int32_t *ids;
    size_t n;
    encode(qwen3, "\xe4", 1, false, false, &ids, &n);
    assert_int_equal(n, 1);
    sil_detok_init(&d, qwen3, true);
    assert_int_equal(sil_detok_push(&d, ids[0], out, sizeof out), 0);
    assert_int_equal(d.n_pending, 1);
    assert_int_equal(sil_detok_push(&d, 151645, out, sizeof out), 11);
    assert_memory_equal(out, "\xe4<|im_end|>", 11);
    free(ids);
}


static void test_load_errors(void **state)
{
    const char *toks[300];
    int32_t types[300];
    tu_byte_tokens(toks);
    for (int i = 0; i < 300; i++)
        types[i] = 1;
    toks[256] = "ab";
    toks[257] = "<|im_start|>";
    types[257] = 3;
    const char *merges[] = {"a b"};
    struct sil_vocab *v = NULL;
    struct sil_error err = {0};

    assert_int_equal(tu_vocab_mem("gpt2", "qwen35", toks, 258, types, 258, merges, 1, &v, &err), 0);
    assert_string_equal(sil_vocab_pre(v), "qwen35");
    assert_int_equal(sil_vocab_im_start(v), 257);
    int32_t *ids;
    size_t n;
    encode(v, "ab", 2, false, false, &ids, &n);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 256);
    free(ids);
    sil_vocab_free(v);
    v = NULL;

    assert_int_equal(tu_vocab_mem("gpt2", "no-such-pre", toks, 258, types, 258, merges, 1, &v, &err),
                     -EINVAL);
    assert_null(v);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.pre"));
    assert_non_null(strstr(err.msg, "no-such-pre"));
    assert_non_null(strstr(err.msg, "mem.gguf"));

    assert_int_equal(tu_vocab_mem("gpt2", NULL, toks, 258, types, 258, merges, 1, &v, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.pre"));

    assert_int_equal(tu_vocab_mem("llama", "qwen2", toks, 258, types, 258, merges, 1, &v, &err),
                     -EINVAL);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.model"));

    assert_int_equal(tu_vocab_mem("gpt2", "qwen2", NULL, 0, NULL, 0, merges, 1, &v, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "tokenizer.ggml.tokens"));

    assert_int_equal(tu_vocab_mem("gpt2", "qwen2", toks, 258, types, 257, merges, 1, &v, &err),
                     -EINVAL);
    assert_non_null(strstr(err.msg, "token_type"));

    types[5] = 9;
    assert_int_equal(tu_vocab_mem("gpt2", "qwen2", toks, 258, types, 258, merges, 1, &v, &err),
                     -EINVAL);
    assert_non_null(strstr(err.msg, "token_type[5]"));
    types[5] = 1;

    /* a byte without a token */
    assert_int_equal(tu_vocab_mem("gpt2", "qwen2", toks + 1, 257, types, 257, merges, 1, &v, &err),
                     -EINVAL);
    assert_non_null(strstr(err.msg, "byte 0x00"));

    const char *bad_merge[] = {"ab"};
    assert_int_equal(tu_vocab_mem("gpt2", "qwen2", toks, 258, types, 258, bad_merge, 1, &v, &err),
                     -EINVAL);
    assert_non_null(strstr(err.msg, "merges[0]"));
    assert_null(v);
}

/* BPE order on a hand-made vocab: lowest rank first, leftmost on ties. */
static void test_merge_order(void **state)
{
    const char *toks[300];
    int32_t types[300];
    tu_byte_tokens(toks);
    for (int i = 0; i < 300; i++)
        types[i] = 1;
    toks[256] = "bc";
    toks[257] = "ab";
    toks[258] = "aa";
    toks[259] = "aaaa";
    const char *merges[] = {"b c", "a b", "a a", "aa aa"};
    struct sil_vocab *v = NULL;
    struct sil_error err = {0};
    assert_int_equal(tu_vocab_mem("gpt2", "qwen2", toks, 260, types, 260, merges, 4, &v, &err), 0);
    int32_t *ids;
    size_t n;
    encode(v, "abc", 3, false, false, &ids, &n); /* "b c" outranks "a b" */
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 'a');
    assert_int_equal(ids[1], 256);
    free(ids);
    encode(v, "aaa", 3, false, false, &ids, &n); /* leftmost "a a" first */
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 258);
    assert_int_equal(ids[1], 'a');
    free(ids);
    char many[101];
    memset(many, 'a', 100);
    encode(v, many, 100, false, false, &ids, &n); /* long path: 25 x "aaaa" */
    assert_int_equal(n, 25);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids[i], 259);
    free(ids);
    encode(v, many, 99, false, false, &ids, &n); /* 24 x "aaaa" + "aa" + "a" */
    assert_int_equal(n, 26);
    assert_int_equal(ids[23], 259);
    assert_int_equal(ids[24], 258);
    assert_int_equal(ids[25], 'a');
    free(ids);
    sil_vocab_free(v);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3_vectors),
        cmocka_unit_test(test_llama3_vectors),
        cmocka_unit_test(test_special_ids),
        cmocka_unit_test(test_add_bos),
        cmocka_unit_test(test_special_only_when_asked),
        cmocka_unit_test(test_empty_and_invalid_utf8),
        cmocka_unit_test(test_1mb_inputs),
        cmocka_unit_test(test_bpe_matches_reference),
        cmocka_unit_test(test_whitespace_set),
        cmocka_unit_test(test_cache_consistency),
        cmocka_unit_test(test_detok_split_anywhere),
        cmocka_unit_test(test_detok_specials_and_space),
        cmocka_unit_test(test_load_errors),
        cmocka_unit_test(test_merge_order),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
