/* Private to the tokenizer's files (tokenizer_vocab.c, tokenizer_bpe.c, tokenizer_detok.c):
 * the layout of struct sil_vocab and the lookups shared by loading and encoding (hash maps of
 * token texts and bytes, the merge table), kept inline because encoding probes them per word.
 * tokenizer.h is the public contract.
 *
 * Ownership: a sil_vocab owns every array it points to (freed by sil_vocab_free) and is
 * immutable after sil_vocab_load. */
#ifndef SIL_TOKENIZER_IMPL_H
#define SIL_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "daemon/engine/tokenizer.h"

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

/* A pre-tokenizer known by its tokenizer.ggml.pre name. */
struct pre_def {
    const char *name;
    const char *regex;
    bool ignore_merges; /* a word that is itself a token is not merged (Llama 3) */
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
static inline uint64_t hash_bytes(const void *p, size_t n)
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

/* Finds key among strings base + off[id] (length off[id+1] - off[id] - extra). */
static inline int32_t str_map_get(const struct str_map *m, const char *base, const uint32_t *off,
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

static inline bool is_bpe_type(uint8_t t)
{
    return t == TT_NORMAL || t == TT_BYTE;
}

#endif
