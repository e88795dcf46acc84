/* Strict JSON (RFC 8259) for sil-openai: a parser for request bodies and an output buffer for
 * responses. The parser checks every byte: UTF-8 (no overlongs, surrogates or bytes past
 * U+10FFFF), escapes (\u surrogate pairs must pair), the number grammar, nesting depth and
 * duplicate keys; anything else is an error naming the byte offset. The tree lives in the
 * document's own memory (chunks of nodes plus one string area the size of the input) and is
 * freed with it. Output: a growable buffer with a hard size limit; strings are escaped and any
 * ill-formed UTF-8 in them is written as U+FFFD. */
#ifndef SIL_OPENAI_JSON_H
#define SIL_OPENAI_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SIL_OA_JSON_MAX_DEPTH 64
#define SIL_OA_JSON_MAX_NUMBER 64 /* bytes in a number's text */
/* Bounds on what a peer can make the parser allocate and compare: values in a document (about
 * 100 bytes each) and members of one object (duplicate names are checked pairwise by hash). */
#define SIL_OA_JSON_MAX_VALUES (1 << 17)
#define SIL_OA_JSON_MAX_MEMBERS 8192

enum sil_oa_json_type {
    SIL_OA_JSON_NULL,
    SIL_OA_JSON_FALSE,
    SIL_OA_JSON_TRUE,
    SIL_OA_JSON_NUMBER,
    SIL_OA_JSON_STRING,
    SIL_OA_JSON_ARRAY,
    SIL_OA_JSON_OBJECT,
};

struct sil_oa_json {
    enum sil_oa_json_type type;
    const char *key; /* member of an object: its name (NUL-terminated, may hold \u0000) */
    size_t key_len;
    const char *str; /* string: decoded UTF-8, NUL-terminated; number: its text */
    size_t len;
    double num;        /* number */
    bool is_int;       /* number: no fraction or exponent, and fits int64 */
    int64_t i;         /* number when is_int */
    size_t n;          /* array / object: number of children */
    uint32_t key_hash; /* of key, for the duplicate check */
    struct sil_oa_json *child, *next;
};

struct sil_oa_json_doc;

struct sil_oa_json_err {
    size_t offset; /* byte offset of the error in the input */
    char msg[160];
};

/* Parses exactly one JSON value (whitespace around it allowed). 0 and *doc set, or -EINVAL
 * (bad JSON, err filled) / -ENOMEM. */
int sil_oa_json_parse(struct sil_oa_json_doc **doc, const char *text, size_t len,
                      struct sil_oa_json_err *err);
const struct sil_oa_json *sil_oa_json_root(const struct sil_oa_json_doc *doc);
void sil_oa_json_free(struct sil_oa_json_doc *doc);

/* The member named key of an object, NULL if absent or v is not an object. */
const struct sil_oa_json *sil_oa_json_get(const struct sil_oa_json *v, const char *key);
const char *sil_oa_json_type_name(enum sil_oa_json_type t);

/* ---- output ---------------------------------------------------------------------------------- */

struct sil_oa_buf {
    char *data;
    size_t len, cap, max; /* max 0: unlimited */
    bool failed;          /* a write was refused (limit or allocation); data stays valid */
};

void sil_oa_buf_init(struct sil_oa_buf *b, size_t max);
void sil_oa_buf_free(struct sil_oa_buf *b);
void sil_oa_buf_reset(struct sil_oa_buf *b);
/* Appends; on failure sets b->failed and leaves the content as it was. */
void sil_oa_buf_add(struct sil_oa_buf *b, const void *p, size_t n);
void sil_oa_buf_cstr(struct sil_oa_buf *b, const char *s);
void sil_oa_buf_printf(struct sil_oa_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* A JSON string: quotes, escapes, ill-formed UTF-8 as U+FFFD. */
void sil_oa_buf_jstr(struct sil_oa_buf *b, const char *s, size_t n);
/* Returns the data (NUL-terminated) and gives up ownership; NULL after a failure. */
char *sil_oa_buf_take(struct sil_oa_buf *b, size_t *len);

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if the bytes there are ill-formed. */
size_t sil_oa_utf8_len(const unsigned char *s, size_t n);

#endif
