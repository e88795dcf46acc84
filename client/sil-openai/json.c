/* Strict JSON parser and escaped output for sil-openai; see json.h for the contract. */
#include "client/sil-openai/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NODES_PER_CHUNK 256

struct chunk {
    struct chunk *next;
    size_t used;
    struct sil_oa_json node[NODES_PER_CHUNK];
};

struct sil_oa_json_doc {
    struct chunk *chunks;
    size_t n_values;
    char *strs; /* decoded strings; never longer than the input (quotes pay for the NULs) */
    size_t strs_len;
    struct sil_oa_json *root;
};

struct parser {
    const unsigned char *p, *end, *start;
    struct sil_oa_json_doc *doc;
    struct sil_oa_json_err *err;
};

static int fail(struct parser *ps, const unsigned char *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(struct parser *ps, const unsigned char *at, const char *fmt, ...)
{
    if (ps->err) {
        ps->err->offset = (size_t)(at - ps->start);
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->err->msg, sizeof(ps->err->msg), fmt, ap);
        va_end(ap);
    }
    return -EINVAL;
}

static struct sil_oa_json *new_node(struct sil_oa_json_doc *d)
{
    struct chunk *c = d->chunks;
    if (!c || c->used == NODES_PER_CHUNK) {
        c = malloc(sizeof(*c));
        if (!c) return NULL;
        c->next = d->chunks;
        c->used = 0;
        d->chunks = c;
    }
    struct sil_oa_json *n = &c->node[c->used++];
    memset(n, 0, sizeof(*n));
    return n;
}

size_t sil_oa_utf8_len(const unsigned char *s, size_t n)
{
    if (n == 0) return 0;
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0; /* overlong */
        if (c == 0xED) hi = 0x9F; /* surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F; /* past U+10FFFF */
    } else
        return 0;
    if (n < len || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return len;
}

static void skip_ws(struct parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int hex4(struct parser *ps, unsigned *out)
{
    if (ps->end - ps->p < 4) return fail(ps, ps->p, "truncated \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        unsigned char c = ps->p[i];
        unsigned d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return fail(ps, ps->p + i, "bad hex digit in \\u escape");
        v = v * 16 + d;
    }
    ps->p += 4;
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* At the opening quote. Decodes into the string area. */
static int parse_string(struct parser *ps, const char **out, size_t *out_len)
{
    const unsigned char *open = ps->p++;
    char *o = ps->doc->strs + ps->doc->strs_len, *o0 = o;
    for (;;) {
        if (ps->p >= ps->end) return fail(ps, open, "unterminated string");
        unsigned char c = *ps->p;
        if (c == '"') {
            ps->p++;
            break;
        }
        if (c < 0x20) return fail(ps, ps->p, "control character 0x%02x in a string", c);
        if (c == '\\') {
            const unsigned char *esc = ps->p++;
            if (ps->p >= ps->end) return fail(ps, esc, "truncated escape");
            c = *ps->p++;
            switch (c) {
            case '"':
                *o++ = '"';
                break;
            case '\\':
                *o++ = '\\';
                break;
            case '/':
                *o++ = '/';
                break;
            case 'b':
                *o++ = '\b';
                break;
            case 'f':
                *o++ = '\f';
                break;
            case 'n':
                *o++ = '\n';
                break;
            case 'r':
                *o++ = '\r';
                break;
            case 't':
                *o++ = '\t';
                break;
            case 'u': {
                unsigned cp;
                if (hex4(ps, &cp) < 0) return -EINVAL;
                if (cp >= 0xDC00 && cp <= 0xDFFF)
                    return fail(ps, esc, "lone low surrogate \\u%04X", cp);
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    unsigned lo;
                    if (ps->end - ps->p < 2 || ps->p[0] != '\\' || ps->p[1] != 'u')
                        return fail(ps, esc, "high surrogate \\u%04X not followed by a low one",
                                    cp);
                    ps->p += 2;
                    if (hex4(ps, &lo) < 0) return -EINVAL;
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return fail(ps, esc, "high surrogate \\u%04X not followed by a low one",
                                    cp);
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                o += put_utf8(o, cp);
                break;
            }
            default:
                return fail(ps, esc, "bad escape '\\%c'", c >= 0x20 && c < 0x7F ? c : '?');
            }
            continue;
        }
        size_t n = sil_oa_utf8_len(ps->p, (size_t)(ps->end - ps->p));
        if (n == 0) return fail(ps, ps->p, "invalid UTF-8 in a string");
        memcpy(o, ps->p, n);
        o += n;
        ps->p += n;
    }
    *o++ = 0;
    *out = o0;
    *out_len = (size_t)(o - o0 - 1);
    ps->doc->strs_len += (size_t)(o - o0);
    return 0;
}

static int parse_number(struct parser *ps, struct sil_oa_json *v)
{
    const unsigned char *s = ps->p, *q = s;
    bool integral = true;
    if (q < ps->end && *q == '-') q++;
    if (q >= ps->end || *q < '0' || *q > '9') return fail(ps, q, "bad number");
    if (*q == '0') {
        q++;
        if (q < ps->end && *q >= '0' && *q <= '9') return fail(ps, q, "leading zero in a number");
    } else
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    if (q < ps->end && *q == '.') {
        integral = false;
        q++;
        if (q >= ps->end || *q < '0' || *q > '9') return fail(ps, q, "digit expected after '.'");
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        integral = false;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (q >= ps->end || *q < '0' || *q > '9')
            return fail(ps, q, "digit expected in the exponent");
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    }
    size_t n = (size_t)(q - s);
    if (n > SIL_OA_JSON_MAX_NUMBER)
        return fail(ps, s, "number longer than %d bytes", SIL_OA_JSON_MAX_NUMBER);
    char *t = ps->doc->strs + ps->doc->strs_len; /* the text is no longer than the input */
    memcpy(t, s, n);
    t[n] = 0;
    ps->doc->strs_len += n + 1;
    errno = 0;
    v->num = strtod(t, NULL);
    if (!isfinite(v->num)) return fail(ps, s, "number out of range");
    if (integral) {
        errno = 0;
        long long i = strtoll(t, NULL, 10);
        if (errno == 0) {
            v->is_int = true;
            v->i = i;
        }
    }
    v->type = SIL_OA_JSON_NUMBER;
    v->str = t;
    v->len = n;
    ps->p = q;
    return 0;
}

static int parse_value(struct parser *ps, struct sil_oa_json *v, int depth);

static uint32_t hash(const char *s, size_t n) /* FNV-1a */
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

static int literal(struct parser *ps, const char *word, enum sil_oa_json_type t,
                   struct sil_oa_json *v)
{
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return fail(ps, ps->p, "unexpected character");
    ps->p += n;
    v->type = t;
    return 0;
}

static int parse_container(struct parser *ps, struct sil_oa_json *v, int depth, bool object)
{
    const unsigned char *open = ps->p++;
    if (depth >= SIL_OA_JSON_MAX_DEPTH)
        return fail(ps, open, "nested deeper than %d", SIL_OA_JSON_MAX_DEPTH);
    v->type = object ? SIL_OA_JSON_OBJECT : SIL_OA_JSON_ARRAY;
    struct sil_oa_json **tail = &v->child;
    skip_ws(ps);
    char close = object ? '}' : ']';
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 0;
    }
    for (;;) {
        if (ps->doc->n_values >= SIL_OA_JSON_MAX_VALUES)
            return fail(ps, ps->p, "more than %d values", SIL_OA_JSON_MAX_VALUES);
        if (object && v->n >= SIL_OA_JSON_MAX_MEMBERS)
            return fail(ps, ps->p, "more than %d members in an object", SIL_OA_JSON_MAX_MEMBERS);
        struct sil_oa_json *c = new_node(ps->doc);
        if (!c) return -ENOMEM;
        ps->doc->n_values++;
        skip_ws(ps);
        if (object) {
            if (ps->p >= ps->end || *ps->p != '"') return fail(ps, ps->p, "member name expected");
            const unsigned char *kat = ps->p;
            int r = parse_string(ps, &c->key, &c->key_len);
            if (r < 0) return r;
            c->key_hash = hash(c->key, c->key_len);
            for (const struct sil_oa_json *o = v->child; o; o = o->next)
                if (o->key_hash == c->key_hash && o->key_len == c->key_len &&
                    memcmp(o->key, c->key, c->key_len) == 0)
                    return fail(ps, kat, "duplicate member \"%.40s\"", c->key);
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') return fail(ps, ps->p, "':' expected");
            ps->p++;
        }
        int r = parse_value(ps, c, depth + 1);
        if (r < 0) return r;
        *tail = c;
        tail = &c->next;
        v->n++;
        skip_ws(ps);
        if (ps->p >= ps->end) return fail(ps, open, "unterminated %s", object ? "object" : "array");
        if (*ps->p == ',') {
            ps->p++;
            continue;
        }
        if (*ps->p == close) {
            ps->p++;
            return 0;
        }
        return fail(ps, ps->p, "',' or '%c' expected", close);
    }
}

static int parse_value(struct parser *ps, struct sil_oa_json *v, int depth)
{
    skip_ws(ps);
    if (ps->p >= ps->end) return fail(ps, ps->p, "value expected");
    switch (*ps->p) {
    case '{':
        return parse_container(ps, v, depth, true);
    case '[':
        return parse_container(ps, v, depth, false);
    case '"':
        v->type = SIL_OA_JSON_STRING;
        return parse_string(ps, &v->str, &v->len);
    case 't':
        return literal(ps, "true", SIL_OA_JSON_TRUE, v);
    case 'f':
        return literal(ps, "false", SIL_OA_JSON_FALSE, v);
    case 'n':
        return literal(ps, "null", SIL_OA_JSON_NULL, v);
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) return parse_number(ps, v);
        return fail(ps, ps->p, "unexpected character");
    }
}

int sil_oa_json_parse(struct sil_oa_json_doc **out, const char *text, size_t len,
                      struct sil_oa_json_err *err)
{
    *out = NULL;
    struct sil_oa_json_doc *d = calloc(1, sizeof(*d));
    if (!d) return -ENOMEM;
    d->strs = malloc(len + 1);
    if (!d->strs) {
        free(d);
        return -ENOMEM;
    }
    struct parser ps = {.p = (const unsigned char *)text,
                        .start = (const unsigned char *)text,
                        .end = (const unsigned char *)text + len,
                        .doc = d,
                        .err = err};
    int r = -ENOMEM;
    d->root = new_node(d);
    if (d->root) r = parse_value(&ps, d->root, 0);
    if (r == 0) {
        skip_ws(&ps);
        if (ps.p != ps.end) r = fail(&ps, ps.p, "trailing bytes after the value");
    }
    if (r < 0) {
        sil_oa_json_free(d);
        return r;
    }
    *out = d;
    return 0;
}

const struct sil_oa_json *sil_oa_json_root(const struct sil_oa_json_doc *doc)
{
    return doc ? doc->root : NULL;
}

void sil_oa_json_free(struct sil_oa_json_doc *d)
{
    if (!d) return;
    for (struct chunk *c = d->chunks, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    free(d->strs);
    free(d);
}

const struct sil_oa_json *sil_oa_json_get(const struct sil_oa_json *v, const char *key)
{
    if (!v || v->type != SIL_OA_JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (const struct sil_oa_json *c = v->child; c; c = c->next)
        if (c->key_len == n && memcmp(c->key, key, n) == 0) return c;
    return NULL;
}

const char *sil_oa_json_type_name(enum sil_oa_json_type t)
{
    static const char *const names[] = {"null",   "boolean", "boolean", "number",
                                        "string", "array",   "object"};
    return (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "?";
}

/* ---- output ---------------------------------------------------------------------------------- */

void sil_oa_buf_init(struct sil_oa_buf *b, size_t max)
{
    memset(b, 0, sizeof(*b));
    b->max = max;
}

void sil_oa_buf_free(struct sil_oa_buf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void sil_oa_buf_reset(struct sil_oa_buf *b)
{
    b->len = 0;
    b->failed = false;
    if (b->data) b->data[0] = 0;
}

static bool reserve(struct sil_oa_buf *b, size_t n)
{
    if (b->failed) return false;
    if (n > SIZE_MAX / 2 - b->len || (b->max && b->len + n > b->max)) {
        b->failed = true;
        return false;
    }
    if (b->len + n + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p) {
        b->failed = true;
        return false;
    }
    b->data = p;
    b->cap = cap;
    return true;
}

void sil_oa_buf_add(struct sil_oa_buf *b, const void *p, size_t n)
{
    if (!reserve(b, n)) return;
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
}

void sil_oa_buf_cstr(struct sil_oa_buf *b, const char *s)
{
    sil_oa_buf_add(b, s, strlen(s));
}

void sil_oa_buf_printf(struct sil_oa_buf *b, const char *fmt, ...)
{
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = true;
        return;
    }
    if ((size_t)n < sizeof(tmp)) {
        sil_oa_buf_add(b, tmp, (size_t)n);
        return;
    }
    if (!reserve(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void sil_oa_buf_jstr(struct sil_oa_buf *b, const char *s, size_t n)
{
    /* Worst case 6 bytes out per byte in (\u00XX), plus the quotes. */
    if (n > (SIZE_MAX - 2) / 6 || !reserve(b, n * 6 + 2)) return;
    static const char hex[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    char *o = b->data + b->len;
    *o++ = '"';
    while (p < end) {
        unsigned char c = *p;
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
            *o++ = (char)c;
            p++;
            continue;
        }
        if (c < 0x80) {
            *o++ = '\\';
            switch (c) {
            case '"':
                *o++ = '"';
                break;
            case '\\':
                *o++ = '\\';
                break;
            case '\n':
                *o++ = 'n';
                break;
            case '\r':
                *o++ = 'r';
                break;
            case '\t':
                *o++ = 't';
                break;
            default:
                *o++ = 'u';
                *o++ = '0';
                *o++ = '0';
                *o++ = hex[c >> 4];
                *o++ = hex[c & 15];
            }
            p++;
            continue;
        }
        size_t k = sil_oa_utf8_len(p, (size_t)(end - p));
        if (k == 0) {
            memcpy(o, "\xEF\xBF\xBD", 3); /* U+FFFD, 3 bytes: fits the 6 reserved */
            o += 3;
            p++;
            continue;
        }
        memcpy(o, p, k);
        o += k;
        p += k;
    }
    *o++ = '"';
    b->len = (size_t)(o - b->data);
    b->data[b->len] = 0;
}

char *sil_oa_buf_take(struct sil_oa_buf *b, size_t *len)
{
    if (b->failed || !reserve(b, 0)) {
        sil_oa_buf_free(b);
        return NULL;
    }
    b->data[b->len] = 0;
    char *p = b->data;
    if (len) *len = b->len;
    memset(b, 0, sizeof(*b));
    return p;
}
