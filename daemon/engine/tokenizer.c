/* Byte-level BPE tokenizer (GGUF tokenizer.ggml.model "gpt2"); see tokenizer.h for the contract.
 *
 * Encoding: the text is cut at special tokens (control tokens only when parse_special is set,
 * user-defined tokens such as "<think>" always, as both reference tokenizers do), every other
 * fragment is split into words by the pre-tokenizer regex, and every word is merged by BPE
 * starting from one symbol per byte. Text is not NFC-normalized (same as the GGUF reference
 * tokenizer; the HF Qwen tokenizer composes characters first and differs on decomposed input). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "daemon/engine/tokenizer.h"

#include <errno.h>
#include <limits.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/gguf.h"

/* tokenizer.ggml.token_type values (same numbering as GGUF's). */
enum tok_type {
    TT_UNDEFINED = 0,
    TT_NORMAL = 1,
    TT_UNKNOWN = 2,
    TT_CONTROL = 3,
    TT_USER_DEFINED = 4,
    TT_UNUSED = 5,
    TT_BYTE = 6,
};

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

static const struct pre_def {
    const char *name;
    const char *regex;
    bool ignore_merges; /* a word that is itself a token is not merged (Llama 3) */
} pre_defs[] = {
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

/* Open-addressing table of int32 ids keyed by byte strings stored elsewhere. */
struct str_map {
    int32_t *slot; /* -1 = empty */
    uint32_t mask;
};

struct merge_slot {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t result;
};

struct sil_vocab {
    int32_t n_tokens;
    char pre[32];
    const struct pre_def *pre_def;
    pcre2_code *re;
    bool re_jit; /* JIT compiled: match with pcre2_jit_match, which skips the generic checks */

    uint8_t *type;      /* [n_tokens] enum tok_type */
    char *text;         /* token texts as stored in the GGUF, each NUL-terminated */
    uint32_t *text_off; /* [n_tokens + 1] */
    char *bytes;        /* decoded bytes per token (byte-level mapping undone) */
    uint32_t *bytes_off; /* [n_tokens + 1] */

    struct str_map by_text;  /* stored text -> first id with it */
    struct str_map by_bytes; /* decoded bytes -> id, BPE tokens only */
    struct merge_slot *merges;
    uint32_t merge_mask;
    int32_t byte_tok[256]; /* token of each single byte */

    /* Tokens matched in the text (control, user-defined, unknown): by text, and the distinct
     * lengths longest first, so a position costs one probe per length, not one per token. */
    struct str_map special_by_text;
    uint32_t *special_len;
    int n_special_len;
    uint8_t special_first[256]; /* 1 if some special token starts with this byte */

    int32_t bos, eos, eot, pad, im_start, im_end, think_open, think_close;
    int32_t eog[8];
    int n_eog;
    bool add_bos;
};


static inline uint64_t mix64(uint64_t x)
{
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    x *= 0xd6e8feb86659fd93ULL;
    x ^= x >> 32;
    return x;
}

static inline uint32_t load32(const unsigned char *p)
{
    uint32_t w;
    memcpy(&w, p, 4);
    return w;
}

/* One multiply per 8 bytes; words are short, so this runs once per word on the hot path. The
 * tail is read as two overlapping 4-byte loads (or 3 single bytes) instead of a variable-length
 * copy. */
static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *s = p;
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ n;
    while (n > 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    if (n >= 4)
        w = load32(s) | (uint64_t)load32(s + n - 4) << 32;
    else if (n > 0)
        w = s[0] | (uint64_t)s[n / 2] << 8 | (uint64_t)s[n - 1] << 16;
    h = (h ^ w ^ (uint64_t)n << 56) * 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 29);
}

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

/* Finds key among strings base + off[id] (length off[id+1] - off[id] - extra). */
static int32_t str_map_get(const struct str_map *m, const char *base, const uint32_t *off,
                           uint32_t extra, const void *key, size_t len)
{
    uint32_t i = (uint32_t)hash_bytes(key, len) & m->mask;
    for (;;) {
        int32_t id = m->slot[i];
        if (id < 0)
            return -1;
        size_t l = off[id + 1] - off[id] - extra;
        if (l == len && memcmp(base + off[id], key, len) == 0)
            return id;
        i = (i + 1) & m->mask;
    }
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

static inline int32_t text_lookup(const struct sil_vocab *v, const void *s, size_t n)
{
    return str_map_get(&v->by_text, v->text, v->text_off, 1, s, n);
}

static inline int32_t bytes_lookup(const struct sil_vocab *v, const void *s, size_t n)
{
    return str_map_get(&v->by_bytes, v->bytes, v->bytes_off, 0, s, n);
}

static inline const struct merge_slot *merge_get(const struct sil_vocab *v, int32_t l, int32_t r)
{
    uint64_t key = (uint64_t)(uint32_t)l << 32 | (uint32_t)r;
    uint32_t i = (uint32_t)mix64(key) & v->merge_mask;
    for (;;) {
        const struct merge_slot *s = &v->merges[i];
        if (s->key == key)
            return s;
        if (s->key == UINT64_MAX)
            return NULL;
        i = (i + 1) & v->merge_mask;
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

static bool is_bpe_type(uint8_t t)
{
    return t == TT_NORMAL || t == TT_BYTE;
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


struct id_buf {
    int32_t *ids;
    size_t n, cap;
};

static int id_push(struct id_buf *b, int32_t id)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        int32_t *p = realloc(b->ids, cap * sizeof *p);
        if (!p)
            return -ENOMEM;
        b->ids = p;
        b->cap = cap;
    }
    b->ids[b->n++] = id;
    return 0;
}

/* Heap entries are rank << 32 | position: lowest rank first, then leftmost. */
typedef uint64_t heap_ent;

/* Per-call scratch, grown as needed and freed at the end of the call. */
/* Word cache: words repeat a lot in real text, and a cached word costs one hash probe instead of
 * a BPE run. It lives for one call (the vocab stays immutable) and only for texts long enough to
 * pay for it; when full it stops growing. */
#define WC_MAX_WORD 256
#define WC_MIN_TEXT 4096
struct wc_ent {
    uint64_t h; /* 0 = empty */
    uint32_t word_off, ids_off;
    uint16_t len, n_ids;
};

struct wcache {
    struct wc_ent *ent;
    uint32_t mask, used;
    char *words;
    int32_t *ids;
    size_t words_len, words_cap, ids_len, ids_cap;
};

struct scratch {
    int32_t *sym;  /* symbol ids */
    int32_t *next; /* linked list for long words */
    int32_t *prev;
    heap_ent *heap;
    size_t cap, heap_cap;
    struct wcache wc; /* ent == NULL: no cache */
};

static void wc_init(struct wcache *c, size_t text_len)
{
    size_t cap = 1024;
    while (cap < text_len / 16 && cap < (1u << 17))
        cap <<= 1;
    c->ent = calloc(cap, sizeof *c->ent);
    c->mask = c->ent ? (uint32_t)(cap - 1) : 0;
}

static void wc_free(struct wcache *c)
{
    free(c->ent);
    free(c->words);
    free(c->ids);
}

static const struct wc_ent *wc_find(const struct wcache *c, uint64_t h, const void *w, size_t n)
{
    for (uint32_t i = (uint32_t)h & c->mask;; i = (i + 1) & c->mask) {
        const struct wc_ent *e = &c->ent[i];
        if (e->h == 0)
            return NULL;
        if (e->h == h && e->len == n && memcmp(c->words + e->word_off, w, n) == 0)
            return e;
    }
}

/* Best effort: a failed allocation only means the word is not cached. */
static void wc_add(struct wcache *c, uint64_t h, const void *w, size_t n, const int32_t *ids,
                   size_t n_ids)
{
    if (c->used >= c->mask / 2 || c->words_len + n > UINT32_MAX / 2 ||
        c->ids_len + n_ids > UINT32_MAX / 2)
        return;
    if (c->words_len + n > c->words_cap) {
        size_t cap = c->words_cap ? c->words_cap * 2 : 16384;
        char *p = realloc(c->words, cap);
        if (!p)
            return;
        c->words = p;
        c->words_cap = cap;
    }
    if (c->ids_len + n_ids > c->ids_cap) {
        size_t cap = c->ids_cap ? c->ids_cap * 2 : 4096;
        int32_t *p = realloc(c->ids, cap * sizeof *p);
        if (!p)
            return;
        c->ids = p;
        c->ids_cap = cap;
    }
    uint32_t i = (uint32_t)h & c->mask;
    while (c->ent[i].h)
        i = (i + 1) & c->mask;
    c->ent[i] = (struct wc_ent){h, (uint32_t)c->words_len, (uint32_t)c->ids_len, (uint16_t)n,
                                (uint16_t)n_ids};
    memcpy(c->words + c->words_len, w, n);
    memcpy(c->ids + c->ids_len, ids, n_ids * sizeof *ids);
    c->words_len += n;
    c->ids_len += n_ids;
    c->used++;
}

static int scratch_reserve(struct scratch *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *a = realloc(s->sym, cap * sizeof *a);
    if (!a)
        return -ENOMEM;
    s->sym = a;
    a = realloc(s->next, cap * sizeof *a);
    if (!a)
        return -ENOMEM;
    s->next = a;
    a = realloc(s->prev, cap * sizeof *a);
    if (!a)
        return -ENOMEM;
    s->prev = a;
    s->cap = cap;
    return 0;
}

static int32_t pair_rank(const struct sil_vocab *v, int32_t l, int32_t r)
{
    const struct merge_slot *m = merge_get(v, l, r);
    return m ? m->rank : INT32_MAX;
}

/* BPE on a short word: the symbols stay in one array and every step scans for the best pair.
 * Quadratic, so only used below a small length where it beats the heap. */
#define BPE_SHORT 24
static int bpe_short(const struct sil_vocab *v, int32_t *sym, int n, struct id_buf *out)
{
    int32_t rank[BPE_SHORT];
    for (int i = 0; i + 1 < n; i++)
        rank[i] = pair_rank(v, sym[i], sym[i + 1]);
    while (n > 1) {
        int best = -1;
        int32_t br = INT32_MAX;
        for (int i = 0; i + 1 < n; i++) {
            if (rank[i] < br) {
                br = rank[i];
                best = i;
            }
        }
        if (best < 0)
            break;
        sym[best] = merge_get(v, sym[best], sym[best + 1])->result;
        memmove(sym + best + 1, sym + best + 2, (size_t)(n - best - 2) * sizeof *sym);
        memmove(rank + best, rank + best + 1, (size_t)(n - best - 2) * sizeof *rank);
        n--;
        if (best > 0)
            rank[best - 1] = pair_rank(v, sym[best - 1], sym[best]);
        if (best + 1 < n)
            rank[best] = pair_rank(v, sym[best], sym[best + 1]);
    }
    for (int i = 0; i < n; i++)
        if (id_push(out, sym[i]) < 0)
            return -ENOMEM;
    return 0;
}

static void heap_push(heap_ent *h, size_t *n, heap_ent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (h[p] <= e)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n)
{
    heap_ent top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 4 * i + 1, end = c + 4 < m ? c + 4 : m;
        if (c >= m)
            break;
        for (size_t k = c + 1; k < end; k++)
            if (h[k] < h[c])
                c = k;
        if (last <= h[c])
            break;
        h[i] = h[c];
        i = c;
    }
    if (m)
        h[i] = last;
    return top;
}

static void heap_add_pair(const struct sil_vocab *v, struct scratch *s, size_t *hn, int32_t i)
{
    if (i < 0 || s->next[i] < 0)
        return;
    const struct merge_slot *m = merge_get(v, s->sym[i], s->sym[s->next[i]]);
    if (m)
        heap_push(s->heap, hn, (uint64_t)m->rank << 32 | (uint32_t)i);
}

/* BPE on a long word: symbols in a linked list, candidate pairs in a 4-ary heap. An entry made
 * stale by an earlier merge is recognized on pop: the pair now at its position is not the merge
 * of its rank (ranks identify merges). O(n log n). */
static int bpe_long(const struct sil_vocab *v, struct scratch *s, int32_t n, struct id_buf *out)
{
    if ((size_t)n * 3 > s->heap_cap) {
        /* each merge adds at most 2 entries and removes one symbol: 3n bounds the heap */
        size_t cap = (size_t)n * 3;
        heap_ent *h = realloc(s->heap, cap * sizeof *h);
        if (!h)
            return -ENOMEM;
        s->heap = h;
        s->heap_cap = cap;
    }
    for (int32_t i = 0; i < n; i++) {
        s->prev[i] = i - 1;
        s->next[i] = i + 1 < n ? i + 1 : -1;
    }
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < n; i++)
        heap_add_pair(v, s, &hn, i);
    while (hn) {
        heap_ent e = heap_pop(s->heap, &hn);
        int32_t i = (int32_t)(uint32_t)e, j = s->next[i];
        if (s->sym[i] < 0 || j < 0)
            continue;
        const struct merge_slot *m = merge_get(v, s->sym[i], s->sym[j]);
        if (!m || m->rank != (int32_t)(e >> 32))
            continue;
        s->sym[i] = m->result;
        s->sym[j] = -1;
        s->next[i] = s->next[j];
        if (s->next[j] >= 0)
            s->prev[s->next[j]] = i;
        heap_add_pair(v, s, &hn, s->prev[i]);
        heap_add_pair(v, s, &hn, i);
    }
    for (int32_t i = 0; i >= 0; i = s->next[i])
        if (id_push(out, s->sym[i]) < 0)
            return -ENOMEM;
    return 0;
}

static int encode_word(const struct sil_vocab *v, const unsigned char *w, size_t n,
                       struct scratch *s, struct id_buf *out)
{
    if (n == 0)
        return 0;
    if (n == 1)
        return id_push(out, v->byte_tok[w[0]]);
    if (v->pre_def->ignore_merges) {
        int32_t id = bytes_lookup(v, w, n);
        if (id >= 0)
            return id_push(out, id);
    }
    if (n > INT32_MAX / 4)
        return -E2BIG;
    uint64_t h = 0;
    if (s->wc.ent && n <= WC_MAX_WORD) {
        h = hash_bytes(w, n) | 1;
        const struct wc_ent *e = wc_find(&s->wc, h, w, n);
        if (e) {
            for (int i = 0; i < e->n_ids; i++)
                if (id_push(out, s->wc.ids[e->ids_off + i]) < 0)
                    return -ENOMEM;
            return 0;
        }
    }
    if (scratch_reserve(s, n) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        s->sym[i] = v->byte_tok[w[i]];
    size_t first = out->n;
    int rc = n <= BPE_SHORT ? bpe_short(v, s->sym, (int)n, out) : bpe_long(v, s, (int32_t)n, out);
    if (rc == 0 && h)
        wc_add(&s->wc, h, w, n, out->ids + first, out->n - first);
    return rc;
}

/* Per-call PCRE2 state. The match context and a large JIT stack are made only if the default
 * 32 KiB stack ever runs out, so short calls stay cheap. */
struct matcher {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
};

static int run_match(const struct sil_vocab *v, struct matcher *m, const unsigned char *t,
                     size_t len, size_t pos)
{
    for (;;) {
        int rc = v->re_jit ? pcre2_jit_match(v->re, t, len, pos, 0, m->md, m->mc)
                           : pcre2_match(v->re, t, len, pos, 0, m->md, m->mc);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || m->js)
            return rc;
        if (!m->mc && !(m->mc = pcre2_match_context_create(NULL)))
            return rc;
        if (!(m->js = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, NULL)))
            return rc;
        pcre2_jit_stack_assign(m->mc, NULL, m->js);
    }
}

/* Splits one fragment (no special tokens inside) into words with the pre-tokenizer regex. Bytes
 * the regex does not cover (invalid UTF-8, and some whitespace for gpt2) form words of their own.
 */
static int encode_fragment(const struct sil_vocab *v, const unsigned char *t, size_t len,
                           struct matcher *mt, struct scratch *s, struct id_buf *out)
{
    size_t pos = 0;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(mt->md);
    while (pos < len) {
        int rc = run_match(v, mt, t, len, pos);
        size_t ms, me;
        if (rc >= 0) {
            ms = ov[0];
            me = ov[1];
            if (me <= ms) /* cannot happen with these regexes; never loop on an empty match */
                me = ms + 1 <= len ? ms + 1 : len;
        } else if (rc == PCRE2_ERROR_NOMATCH) {
            ms = me = len;
        } else {
            /* resource limit on a pathological input: the rest is one word (still exact bytes) */
            ms = pos;
            me = len;
        }
        int e;
        if (ms > pos && (e = encode_word(v, t + pos, ms - pos, s, out)) < 0)
            return e;
        if (me > ms && (e = encode_word(v, t + ms, me - ms, s, out)) < 0)
            return e;
        pos = me;
    }
    return 0;
}

/* The special token starting at t[0..n), longest first, or -1. */
static int32_t match_special(const struct sil_vocab *v, const char *t, size_t n, bool parse_special)
{
    for (int k = 0; k < v->n_special_len; k++) {
        size_t l = v->special_len[k];
        if (l > n)
            continue;
        int32_t id = str_map_get(&v->special_by_text, v->text, v->text_off, 1, t, l);
        if (id >= 0 && (parse_special || v->type[id] == TT_USER_DEFINED))
            return id;
    }
    return -1;
}

int sil_tokenize(const struct sil_vocab *v, const char *text, size_t len, bool add_bos,
                 bool parse_special, int32_t **ids, size_t *n_ids, struct sil_error *err)
{
    *ids = NULL;
    *n_ids = 0;
    struct id_buf out = {0};
    struct scratch s = {0};
    struct matcher mt = {pcre2_match_data_create(1, NULL), NULL, NULL};
    int rc = 0;
    if (!mt.md) {
        rc = sil_errorf(err, -ENOMEM, "tokenizer: out of memory");
        goto done;
    }
    if (len >= WC_MIN_TEXT)
        wc_init(&s.wc, len);
    if (add_bos && v->bos >= 0 && (rc = id_push(&out, v->bos)) < 0)
        goto oom;

    const unsigned char *t = (const unsigned char *)text;
    size_t frag = 0;
    for (size_t i = 0; i < len; i++) {
        if (!v->special_first[t[i]])
            continue;
        int32_t id = match_special(v, text + i, len - i, parse_special);
        if (id < 0)
            continue;
        if (i > frag && (rc = encode_fragment(v, t + frag, i - frag, &mt, &s, &out)) < 0)
            goto oom;
        if ((rc = id_push(&out, id)) < 0)
            goto oom;
        i += v->text_off[id + 1] - v->text_off[id] - 2;
        frag = i + 1;
    }
    if (len > frag && (rc = encode_fragment(v, t + frag, len - frag, &mt, &s, &out)) < 0)
        goto oom;
    if (out.n == 0) {
        free(out.ids);
        out.ids = malloc(sizeof *out.ids); /* a valid pointer even for no tokens */
        if (!out.ids) {
            rc = -ENOMEM;
            goto oom;
        }
    }
    *ids = out.ids;
    *n_ids = out.n;
    out.ids = NULL;
    goto done;
oom:
    rc = sil_errorf(err, rc, "tokenizer: %s while encoding %zu bytes",
                    rc == -E2BIG ? "word too long" : "out of memory", len);
done:
    free(out.ids);
    free(s.sym);
    free(s.next);
    free(s.prev);
    free(s.heap);
    wc_free(&s.wc);
    pcre2_jit_stack_free(mt.js);
    pcre2_match_context_free(mt.mc);
    pcre2_match_data_free(mt.md);
    return rc;
}


static bool decode_shows(const struct sil_vocab *v, int32_t id, bool with_special)
{
    uint8_t t = v->type[id];
    return with_special || is_bpe_type(t) || t == TT_USER_DEFINED;
}

int sil_detokenize(const struct sil_vocab *v, const int32_t *ids, size_t n, bool with_special,
                   char **out, size_t *len, struct sil_error *err)
{
    *out = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->n_tokens)
            return sil_errorf(err, -EINVAL, "detokenize: ids[%zu] = %d is not a token id (0..%d)",
                              i, ids[i], v->n_tokens - 1);
        if (decode_shows(v, ids[i], with_special))
            total += v->bytes_off[ids[i] + 1] - v->bytes_off[ids[i]];
    }
    char *buf = malloc(total + 1);
    if (!buf)
        return sil_errorf(err, -ENOMEM, "detokenize: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (!decode_shows(v, ids[i], with_special))
            continue;
        uint32_t l = v->bytes_off[ids[i] + 1] - v->bytes_off[ids[i]];
        memcpy(buf + o, v->bytes + v->bytes_off[ids[i]], l);
        o += l;
    }
    buf[o] = 0;
    *out = buf;
    *len = o;
    return 0;
}

void sil_detok_init(struct sil_detok *d, const struct sil_vocab *v, bool with_special)
{
    d->v = v;
    d->with_special = with_special;
    d->n_pending = 0;
}

/* How many trailing bytes of s[0..n) are a proper prefix of a valid UTF-8 character, i.e. must
 * wait for more bytes. Anything else (complete or invalid) can be emitted now. */
static int utf8_incomplete_tail(const unsigned char *s, size_t n)
{
    for (int k = 1; k <= 3 && (size_t)k <= n; k++) {
        unsigned c = s[n - k];
        if ((c & 0xc0) == 0x80)
            continue; /* continuation byte: look further back for the lead */
        int need = c >= 0xc2 && c <= 0xdf   ? 2
                   : c >= 0xe0 && c <= 0xef ? 3
                   : c >= 0xf0 && c <= 0xf4 ? 4
                                            : 0;
        if (need <= k)
            return 0;
        /* second-byte ranges that keep the prefix valid (no overlong, surrogate, > U+10FFFF) */
        if (k >= 2) {
            unsigned c1 = s[n - k + 1];
            if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 > 0x9f) || (c == 0xf0 && c1 < 0x90) ||
                (c == 0xf4 && c1 > 0x8f))
                return 0;
        }
        return k;
    }
    return 0;
}

static int detok_emit(struct sil_detok *d, const char *add, size_t add_len, bool final, char *out,
                      size_t cap)
{
    unsigned char tail[8] = {0};
    size_t np = (size_t)d->n_pending;
    size_t total = np + add_len;
    /* the last few bytes of pending + add decide what is held back */
    size_t tn = total < 4 ? total : 4;
    for (size_t i = 0; i < tn; i++) {
        size_t k = total - tn + i;
        tail[i] = (unsigned char)(k < np ? d->pending[k] : add[k - np]);
    }
    size_t hold = final ? 0 : (size_t)utf8_incomplete_tail(tail, tn);
    size_t emit = total - hold;
    if (emit > cap)
        return -ENOSPC;
    char keep[8] = {0};
    for (size_t i = 0; i < hold; i++) {
        size_t k = emit + i;
        keep[i] = k < np ? d->pending[k] : add[k - np];
    }
    size_t from_pending = emit < np ? emit : np;
    memcpy(out, d->pending, from_pending);
    if (emit > np)
        memcpy(out + np, add, emit - np);
    memcpy(d->pending, keep, hold);
    d->n_pending = (int)hold;
    return (int)emit;
}

int sil_detok_push(struct sil_detok *d, int32_t id, char *out, size_t cap)
{
    const struct sil_vocab *v = d->v;
    if (id < 0 || id >= v->n_tokens)
        return -EINVAL;
    if (!decode_shows(v, id, d->with_special))
        return detok_emit(d, NULL, 0, false, out, cap);
    return detok_emit(d, v->bytes + v->bytes_off[id], v->bytes_off[id + 1] - v->bytes_off[id],
                      false, out, cap);
}

int sil_detok_flush(struct sil_detok *d, char *out, size_t cap)
{
    return detok_emit(d, NULL, 0, true, out, cap);
}
