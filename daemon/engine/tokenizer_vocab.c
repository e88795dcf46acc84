/* Vocabulary loading: token texts, types and merges copied from the GGUF (so the vocab may outlive
 * it), the byte-level mapping undone into each token's bytes, the hash maps for lookups, the
 * pre-tokenizer regex selected by tokenizer.ggml.pre and compiled once (PCRE2, UTF, UCP, JIT),
 * the special ids found by their text, and the accessors of tokenizer.h.
 *
 * Ownership: sil_vocab_load allocates the vocab and everything it points to; sil_vocab_free
 * frees it. Immutable after load. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer_impl.h"

/* The pre-tokenizer regexes, written with case classes instead of (?i:...) so every engine reads
 * them the same way. Whitespace is spelled out as the Unicode White_Space set because PCRE2's \s
 * also matches U+180E, which the reference tokenizers treat as a non-space character. */
#define WS                                                                                         \
    "\\t\\n\\x{0b}\\f\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}" \
    "\\x{205f}\\x{3000}"
/* Letters, digits and marks added in Unicode 15.0 and 15.1 (CJK extensions H and I, Kawi, Nag
 * Mundari, Kaktovik numerals, ...), which the reference tokenizer's tables include and the PCRE2
 * of Debian 12 (Unicode 14) does not; with a newer PCRE2 they are simply redundant. */
#define L15                                                                                        \
    "\\x{1123F}-\\x{11240}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}\\x{1342F}" \
    "\\x{13441}-\\x{13446}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}" \
    "\\x{1E4D0}-\\x{1E4EB}\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
#define N15 "\\x{11F50}-\\x{11F59}\\x{1D2C0}-\\x{1D2D3}\\x{1E4F0}-\\x{1E4F9}"
#define M15                                                                                        \
    "\\x{CF3}\\x{ECE}\\x{10EFD}-\\x{10EFF}\\x{11241}\\x{11F00}-\\x{11F01}\\x{11F03}" \
    "\\x{11F34}-\\x{11F3A}\\x{11F3E}-\\x{11F42}\\x{13440}\\x{13447}-\\x{13455}\\x{1E08F}" \
    "\\x{1E4EC}-\\x{1E4EF}"
#define L_ "\\p{L}" L15 /* inside a class: \p{L} */
#define N_ "\\p{N}" N15
#define M_ "\\p{M}" M15
#define S_ "[" WS "]"   /* \s */
#define NS_ "[^" WS "]" /* \S */
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_WS_TAIL "|" S_ "*[\\r\\n]+|" S_ "+(?!" NS_ ")|" S_ "+"
static const char RE_QWEN2[] = RE_CONTRACTIONS "|[^\\r\\n" L_ N_ "]?[" L_ "]+|[" N_ "]"
                                               "| ?[^" WS L_ N_ "]+[\\r\\n]*" RE_WS_TAIL;
static const char RE_QWEN35[] = RE_CONTRACTIONS "|[^\\r\\n" L_ N_ "]?[" L_ M_ "]+|[" N_ "]"
                                                "| ?[^" WS L_ M_ N_ "]+[\\r\\n]*" RE_WS_TAIL;
static const char RE_LLAMA3[] = RE_CONTRACTIONS "|[^\\r\\n" L_ N_ "]?[" L_ "]+|[" N_ "]{1,3}"
                                                "| ?[^" WS L_ N_ "]+[\\r\\n]*" RE_WS_TAIL;
static const char RE_GPT2[] = "'s|'t|'re|'ve|'m|'ll|'d| ?[" L_ "]+| ?[" N_ "]+| ?[^" WS L_ N_
                              "]+|" S_ "+(?!" NS_ ")";

static const struct pre_def pre_defs[] = {
    {"qwen2", RE_QWEN2, false},
    {"qwen35", RE_QWEN35, false},
    {"llama-bpe", RE_LLAMA3, true},
    {"gpt2", RE_GPT2, false},
    /* other names converters write for the same pre-tokenizers */
    {"deepseek-r1-qwen", RE_QWEN2, false},
    {"stablelm2", RE_QWEN2, false},
    {"llama3", RE_LLAMA3, true},
    {"llama-v3", RE_LLAMA3, true},
    {"smaug-bpe", RE_LLAMA3, false},
    {"dbrx", RE_LLAMA3, false},
    {"gpt-2", RE_GPT2, false},
    {"phi-2", RE_GPT2, false},
};

static int str_map_init(struct str_map *m, size_t n)
{
    size_t cap = 16;
    while (cap < n * 2)
        cap <<= 1;
    m->slot = malloc(cap * sizeof *m->slot);
    if (!m->slot)
        return -ENOMEM;
    memset(m->slot, 0xff, cap * sizeof *m->slot);
    m->mask = (uint32_t)(cap - 1);
    return 0;
}

/* Inserts id unless its string is already present (the first id with a text wins). */
static void str_map_put(struct str_map *m, const char *base, const uint32_t *off, uint32_t extra,
                        int32_t id)
{
    const char *key = base + off[id];
    size_t len = off[id + 1] - off[id] - extra;
    uint32_t i = (uint32_t)hash_bytes(key, len) & m->mask;
    for (;;) {
        int32_t o = m->slot[i];
        if (o < 0) {
            m->slot[i] = id;
            return;
        }
        if (off[o + 1] - off[o] - extra == len && memcmp(base + off[o], key, len) == 0)
            return;
        i = (i + 1) & m->mask;
    }
}

/* GPT-2's byte-level alphabet: printable bytes stand for themselves, the other 68 bytes (controls,
 * space, 0x7f-0xa0, 0xad) are mapped in order to code points 256, 257, ... */

static bool byte_is_printable(unsigned b)
{
    return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
}

static void byte_level_tables(uint32_t cp_of_byte[256], int16_t byte_of_cp[512])
{
    unsigned n = 0;
    for (int i = 0; i < 512; i++)
        byte_of_cp[i] = -1;
    for (unsigned b = 0; b < 256; b++) {
        cp_of_byte[b] = byte_is_printable(b) ? b : 256 + n++;
        byte_of_cp[cp_of_byte[b]] = (int16_t)b;
    }
}

/* Length of the valid UTF-8 sequence at s[0..n), 0 if invalid; *cp gets the code point. */
static int utf8_next(const unsigned char *s, size_t n, uint32_t *cp)
{
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    uint32_t v, min;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2, v = c & 0x1f, min = 0x80;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3, v = c & 0x0f, min = 0x800;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 0;
    }
    if ((size_t)len > n)
        return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        v = v << 6 | (s[i] & 0x3f);
    }
    if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff))
        return 0;
    *cp = v;
    return len;
}

void sil_vocab_free(struct sil_vocab *v)
{
    if (!v)
        return;
    pcre2_code_free(v->re);
    free(v->type);
    free(v->text);
    free(v->text_off);
    free(v->bytes);
    free(v->bytes_off);
    free(v->by_text.slot);
    free(v->by_bytes.slot);
    free(v->merges);
    free(v->special_by_text.slot);
    free(v->special_len);
    free(v);
}

static int get_opt_id(const struct sil_gguf *g, const char *key, int32_t n_tokens, int32_t *out,
                      struct sil_error *err)
{
    uint32_t id;
    *out = -1;
    int rc = sil_gguf_get_u32(g, key, &id, err);
    if (rc == -ENOENT)
        return 0;
    if (rc < 0)
        return rc;
    if (id >= (uint32_t)n_tokens)
        return sil_errorf(err, -EINVAL, "%s: %s = %u is not a token id (vocab has %d tokens)",
                          sil_gguf_path(g), key, id, n_tokens);
    *out = (int32_t)id;
    return 0;
}

static int load_tokens(struct sil_vocab *v, const struct sil_gguf *g, struct sil_error *err)
{
    const char *path = sil_gguf_path(g);
    enum sil_gguf_vtype et;
    uint64_t n;
    int64_t ki;
    int rc = sil_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &ki, err);
    if (rc < 0)
        return rc == -ENOENT ? sil_errorf(err, rc, "%s: tokenizer.ggml.tokens: key missing", path)
                             : rc;
    if (et != SIL_GGUF_STRING)
        return sil_errorf(err, -EINVAL, "%s: tokenizer.ggml.tokens: array of %s, expected strings",
                          path, sil_gguf_vtype_name(et));
    if (n == 0 || n > (uint64_t)INT32_MAX / 2)
        return sil_errorf(err, -EINVAL, "%s: tokenizer.ggml.tokens: %llu tokens", path,
                          (unsigned long long)n);
    v->n_tokens = (int32_t)n;

    uint64_t total = 0;
    for (uint64_t j = 0; j < n; j++)
        total += sil_gguf_arr_str(g, ki, j).len + 1;
    if (total > UINT32_MAX - 1)
        return sil_errorf(err, -EINVAL, "%s: tokenizer.ggml.tokens: %llu bytes of text", path,
                          (unsigned long long)total);
    v->text = malloc(total);
    v->text_off = malloc((n + 1) * sizeof *v->text_off);
    v->type = malloc(n);
    if (!v->text || !v->text_off || !v->type)
        return sil_errorf(err, -ENOMEM, "%s: tokenizer: out of memory", path);
    uint32_t o = 0;
    for (uint64_t j = 0; j < n; j++) {
        struct sil_str s = sil_gguf_arr_str(g, ki, j);
        v->text_off[j] = o;
        if (s.len)
            memcpy(v->text + o, s.ptr, s.len);
        o += (uint32_t)s.len;
        v->text[o++] = 0;
    }
    v->text_off[n] = o;

    memset(v->type, TT_NORMAL, n);
    rc = sil_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &ki, err);
    if (rc == 0) {
        if (n != (uint64_t)v->n_tokens)
            return sil_errorf(err, -EINVAL,
                              "%s: tokenizer.ggml.token_type: %llu entries for %d tokens", path,
                              (unsigned long long)n, v->n_tokens);
        for (uint64_t j = 0; j < n; j++) {
            int64_t t;
            if (sil_gguf_arr_get_i64(g, ki, j, &t) < 0 || t < 0 || t > TT_BYTE)
                return sil_errorf(err, -EINVAL,
                                  "%s: tokenizer.ggml.token_type[%llu]: not a token type (0..6)",
                                  path, (unsigned long long)j);
            v->type[j] = (uint8_t)(t == TT_UNDEFINED ? TT_NORMAL : t);
        }
    } else if (rc != -ENOENT) {
        return rc;
    }
    return 0;
}

static bool is_matched_special(const struct sil_vocab *v, int32_t id)
{
    uint8_t t = v->type[id];
    return (t == TT_CONTROL || t == TT_USER_DEFINED || t == TT_UNKNOWN) &&
           v->text_off[id + 1] - v->text_off[id] > 1;
}

/* Decoded bytes of every token: normal tokens lose the byte-level mapping, others keep their
 * text. A code point outside the mapping is kept as its UTF-8 (it cannot come from BPE). */
static int decode_tokens(struct sil_vocab *v, struct sil_error *err)
{
    uint32_t cp_of_byte[256];
    int16_t byte_of_cp[512];
    byte_level_tables(cp_of_byte, byte_of_cp);
    int32_t n = v->n_tokens;
    v->bytes = malloc(v->text_off[n] ? v->text_off[n] : 1); /* decoding never grows the text */
    v->bytes_off = malloc(((size_t)n + 1) * sizeof *v->bytes_off);
    if (!v->bytes || !v->bytes_off)
        return sil_errorf(err, -ENOMEM, "tokenizer: out of memory");
    uint32_t o = 0;
    for (int32_t id = 0; id < n; id++) {
        const unsigned char *s = (const unsigned char *)v->text + v->text_off[id];
        size_t len = v->text_off[id + 1] - v->text_off[id] - 1;
        v->bytes_off[id] = o;
        if (!is_bpe_type(v->type[id])) {
            memcpy(v->bytes + o, s, len);
            o += (uint32_t)len;
        } else {
            size_t i = 0;
            while (i < len) {
                uint32_t cp;
                int l = utf8_next(s + i, len - i, &cp);
                if (l == 0) {
                    v->bytes[o++] = (char)s[i++];
                } else if (cp < 512 && byte_of_cp[cp] >= 0) {
                    v->bytes[o++] = (char)byte_of_cp[cp];
                    i += l;
                } else {
                    memcpy(v->bytes + o, s + i, l);
                    o += l;
                    i += l;
                }
            }
        }
    }
    v->bytes_off[n] = o;
    return 0;
}

static int build_maps(struct sil_vocab *v, const struct sil_gguf *g, struct sil_error *err)
{
    const char *path = sil_gguf_path(g);
    int32_t n = v->n_tokens;
    if (str_map_init(&v->by_text, n) < 0 || str_map_init(&v->by_bytes, n) < 0)
        return sil_errorf(err, -ENOMEM, "tokenizer: out of memory");
    for (int32_t id = 0; id < n; id++) {
        str_map_put(&v->by_text, v->text, v->text_off, 1, id);
        if (is_bpe_type(v->type[id]))
            str_map_put(&v->by_bytes, v->bytes, v->bytes_off, 0, id);
    }
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        v->byte_tok[b] = bytes_lookup(v, &c, 1);
        if (v->byte_tok[b] < 0)
            return sil_errorf(err, -EINVAL,
                              "%s: tokenizer.ggml.tokens: no token for byte 0x%02x (byte-level "
                              "BPE needs all 256)",
                              path, b);
    }

    int32_t ns = 0;
    for (int32_t id = 0; id < n; id++)
        ns += is_matched_special(v, id);
    v->special_len = malloc((ns ? ns : 1) * sizeof *v->special_len);
    if (!v->special_len || str_map_init(&v->special_by_text, ns) < 0)
        return sil_errorf(err, -ENOMEM, "tokenizer: out of memory");
    for (int32_t id = 0; id < n; id++) {
        if (!is_matched_special(v, id))
            continue;
        str_map_put(&v->special_by_text, v->text, v->text_off, 1, id);
        v->special_first[(unsigned char)v->text[v->text_off[id]]] = 1;
        uint32_t l = v->text_off[id + 1] - v->text_off[id] - 1;
        int k = 0;
        while (k < v->n_special_len && v->special_len[k] > l)
            k++;
        if (k < v->n_special_len && v->special_len[k] == l)
            continue;
        memmove(v->special_len + k + 1, v->special_len + k,
                (size_t)(v->n_special_len - k) * sizeof *v->special_len);
        v->special_len[k] = l;
        v->n_special_len++;
    }
    return 0;
}

/* True if token res decodes to the bytes of l followed by those of r. Always so in a sane vocab;
 * checking it keeps decode(encode(text)) == text for any file, even one whose token texts split
 * UTF-8 sequences. */
static bool bytes_concat(const struct sil_vocab *v, int32_t res, int32_t l, int32_t r)
{
    uint32_t nl = v->bytes_off[l + 1] - v->bytes_off[l], nr = v->bytes_off[r + 1] - v->bytes_off[r];
    const char *p = v->bytes + v->bytes_off[res];
    return v->bytes_off[res + 1] - v->bytes_off[res] == nl + nr &&
           memcmp(p, v->bytes + v->bytes_off[l], nl) == 0 &&
           memcmp(p + nl, v->bytes + v->bytes_off[r], nr) == 0;
}

static int load_merges(struct sil_vocab *v, const struct sil_gguf *g, struct sil_error *err)
{
    const char *path = sil_gguf_path(g);
    enum sil_gguf_vtype et;
    uint64_t n;
    int64_t ki;
    int rc = sil_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, &ki, err);
    if (rc == -ENOENT) {
        n = 0;
    } else if (rc < 0) {
        return rc;
    } else if (et != SIL_GGUF_STRING) {
        return sil_errorf(err, -EINVAL, "%s: tokenizer.ggml.merges: array of %s, expected strings",
                          path, sil_gguf_vtype_name(et));
    }
    if (n > (uint64_t)INT32_MAX / 4)
        return sil_errorf(err, -EINVAL, "%s: tokenizer.ggml.merges: %llu merges", path,
                          (unsigned long long)n);
    size_t cap = 16;
    while (cap < n * 2)
        cap <<= 1;
    v->merges = malloc(cap * sizeof *v->merges);
    if (!v->merges)
        return sil_errorf(err, -ENOMEM, "tokenizer: out of memory");
    for (size_t i = 0; i < cap; i++)
        v->merges[i].key = UINT64_MAX;
    v->merge_mask = (uint32_t)(cap - 1);

    char *buf = NULL;
    size_t buf_cap = 0;
    for (uint64_t j = 0; j < n; j++) {
        struct sil_str s = sil_gguf_arr_str(g, ki, j);
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) {
            free(buf);
            return sil_errorf(err, -EINVAL, "%s: tokenizer.ggml.merges[%llu]: no space in '%.*s'",
                              path, (unsigned long long)j, (int)(s.len > 64 ? 64 : s.len), s.ptr);
        }
        size_t ll = (size_t)(sp - s.ptr), rl = s.len - ll - 1;
        int32_t l = text_lookup(v, s.ptr, ll), r = text_lookup(v, sp + 1, rl);
        if (l < 0 || r < 0 || !is_bpe_type(v->type[l]) || !is_bpe_type(v->type[r]))
            continue; /* a merge of pieces that are not tokens can never fire */
        if (ll + rl > buf_cap) {
            buf_cap = (ll + rl) * 2;
            char *nb = realloc(buf, buf_cap);
            if (!nb) {
                free(buf);
                return sil_errorf(err, -ENOMEM, "tokenizer: out of memory");
            }
            buf = nb;
        }
        memcpy(buf, s.ptr, ll);
        memcpy(buf + ll, sp + 1, rl);
        int32_t res = text_lookup(v, buf, ll + rl);
        if (res < 0 || !is_bpe_type(v->type[res]) || !bytes_concat(v, res, l, r))
            continue;
        uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
        uint32_t i = (uint32_t)mix64(key) & v->merge_mask;
        while (v->merges[i].key != UINT64_MAX && v->merges[i].key != key)
            i = (i + 1) & v->merge_mask;
        if (v->merges[i].key == key)
            continue; /* the first (lowest-rank) occurrence wins */
        v->merges[i] = (struct merge_slot){key, (int32_t)j, res};
    }
    free(buf);
    return 0;
}

static int compile_pre(struct sil_vocab *v, const struct sil_gguf *g, struct sil_error *err)
{
    const char *path = sil_gguf_path(g);
    struct sil_str s;
    int rc = sil_gguf_get_str(g, "tokenizer.ggml.pre", &s, err);
    if (rc == -ENOENT)
        return sil_errorf(err, -EINVAL,
                          "%s: tokenizer.ggml.pre: key missing (the pre-tokenizer must be named: "
                          "qwen2, qwen35, llama-bpe, gpt2)",
                          path);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < sizeof pre_defs / sizeof pre_defs[0]; i++) {
        if (strlen(pre_defs[i].name) == s.len && memcmp(pre_defs[i].name, s.ptr, s.len) == 0)
            v->pre_def = &pre_defs[i];
    }
    if (!v->pre_def)
        return sil_errorf(err, -EINVAL,
                          "%s: tokenizer.ggml.pre: unknown pre-tokenizer '%.*s' (supported: "
                          "qwen2, qwen35, llama-bpe, gpt2, and the aliases deepseek-r1-qwen, "
                          "stablelm2, llama3, llama-v3, smaug-bpe, dbrx, gpt-2, phi-2)",
                          path, (int)(s.len > 64 ? 64 : s.len), s.ptr);
    snprintf(v->pre, sizeof v->pre, "%s", v->pre_def->name);

    int ec;
    PCRE2_SIZE eo;
    v->re = pcre2_compile((PCRE2_SPTR)v->pre_def->regex, PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &ec, &eo, NULL);
    if (!v->re) {
        char msg[128];
        pcre2_get_error_message(ec, (PCRE2_UCHAR *)msg, sizeof msg);
        return sil_errorf(err, -EINVAL, "tokenizer: regex of '%s' at %zu: %s", v->pre,
                          (size_t)eo, msg);
    }
    /* Without JIT the interpreter gives the same results, only slower. */
    size_t jit_size = 0;
    v->re_jit = pcre2_jit_compile(v->re, PCRE2_JIT_COMPLETE) == 0 &&
                pcre2_pattern_info(v->re, PCRE2_INFO_JITSIZE, &jit_size) == 0 && jit_size > 0;
    return 0;
}

static int32_t find_cstr(const struct sil_vocab *v, const char *s)
{
    return text_lookup(v, s, strlen(s));
}

static void add_eog(struct sil_vocab *v, int32_t id)
{
    if (id < 0 || v->n_eog >= (int)(sizeof v->eog / sizeof v->eog[0]))
        return;
    for (int i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id)
            return;
    v->eog[v->n_eog++] = id;
}

int sil_vocab_load(struct sil_vocab **out, const struct sil_gguf *g, struct sil_error *err)
{
    *out = NULL;
    const char *path = sil_gguf_path(g);
    struct sil_str model;
    int rc = sil_gguf_get_str(g, "tokenizer.ggml.model", &model, err);
    if (rc == -ENOENT)
        return sil_errorf(err, -EINVAL, "%s: tokenizer.ggml.model: key missing", path);
    if (rc < 0)
        return rc;
    if (model.len != 4 || memcmp(model.ptr, "gpt2", 4) != 0)
        return sil_errorf(err, -EINVAL,
                          "%s: tokenizer.ggml.model: '%.*s' not supported (only byte-level BPE "
                          "'gpt2')",
                          path, (int)(model.len > 64 ? 64 : model.len), model.ptr);

    struct sil_vocab *v = calloc(1, sizeof *v);
    if (!v)
        return sil_errorf(err, -ENOMEM, "tokenizer: out of memory");
    if ((rc = compile_pre(v, g, err)) < 0 || (rc = load_tokens(v, g, err)) < 0 ||
        (rc = decode_tokens(v, err)) < 0 || (rc = build_maps(v, g, err)) < 0 ||
        (rc = load_merges(v, g, err)) < 0)
        goto fail;

    int32_t n = v->n_tokens;
    if ((rc = get_opt_id(g, "tokenizer.ggml.bos_token_id", n, &v->bos, err)) < 0 ||
        (rc = get_opt_id(g, "tokenizer.ggml.eos_token_id", n, &v->eos, err)) < 0 ||
        (rc = get_opt_id(g, "tokenizer.ggml.eot_token_id", n, &v->eot, err)) < 0 ||
        (rc = get_opt_id(g, "tokenizer.ggml.padding_token_id", n, &v->pad, err)) < 0)
        goto fail;
    rc = sil_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &v->add_bos, err);
    if (rc == -ENOENT)
        v->add_bos = false;
    else if (rc < 0)
        goto fail;

    v->im_start = find_cstr(v, "<|im_start|>");
    v->im_end = find_cstr(v, "<|im_end|>");
    v->think_open = find_cstr(v, "<think>");
    v->think_close = find_cstr(v, "</think>");
    if (v->eot < 0)
        v->eot = v->im_end >= 0 ? v->im_end : find_cstr(v, "<|eot_id|>");
    add_eog(v, v->eos);
    add_eog(v, v->eot);
    add_eog(v, v->im_end);
    static const char *const eog_texts[] = {"<|endoftext|>", "<|eot_id|>", "<|eom_id|>",
                                            "<|end_of_text|>"};
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = find_cstr(v, eog_texts[i]);
        if (id >= 0 && v->type[id] == TT_CONTROL)
            add_eog(v, id);
    }
    *out = v;
    return 0;
fail:
    sil_vocab_free(v);
    return rc;
}


int32_t sil_vocab_n_tokens(const struct sil_vocab *v)
{
    return v->n_tokens;
}
const char *sil_vocab_pre(const struct sil_vocab *v)
{
    return v->pre;
}
int32_t sil_vocab_bos(const struct sil_vocab *v)
{
    return v->bos;
}
int32_t sil_vocab_eos(const struct sil_vocab *v)
{
    return v->eos;
}
int32_t sil_vocab_eot(const struct sil_vocab *v)
{
    return v->eot;
}
int32_t sil_vocab_pad(const struct sil_vocab *v)
{
    return v->pad;
}
int32_t sil_vocab_im_start(const struct sil_vocab *v)
{
    return v->im_start;
}
int32_t sil_vocab_im_end(const struct sil_vocab *v)
{
    return v->im_end;
}
int32_t sil_vocab_think_open(const struct sil_vocab *v)
{
    return v->think_open;
}
int32_t sil_vocab_think_close(const struct sil_vocab *v)
{
    return v->think_close;
}
bool sil_vocab_add_bos(const struct sil_vocab *v)
{
    return v->add_bos;
}

bool sil_vocab_is_eog(const struct sil_vocab *v, int32_t id)
{
    for (int i = 0; i < v->n_eog; i++)
        if (v->eog[i] == id)
            return true;
    return false;
}

bool sil_vocab_is_special(const struct sil_vocab *v, int32_t id)
{
    if (id < 0 || id >= v->n_tokens)
        return false;
    return !is_bpe_type(v->type[id]);
}

int32_t sil_vocab_find(const struct sil_vocab *v, const char *text, size_t len)
{
    return text_lookup(v, text, len);
}

int sil_token_bytes(const struct sil_vocab *v, int32_t id, const char **bytes)
{
    if (id < 0 || id >= v->n_tokens)
        return -EINVAL;
    *bytes = v->bytes + v->bytes_off[id];
    return (int)(v->bytes_off[id + 1] - v->bytes_off[id]);
}
