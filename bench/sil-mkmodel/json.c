/* A small JSON reader, enough for Hugging Face tokenizer.json files (tens of MB): builds a tree
 * in one arena; strings are decoded (escapes, \u surrogate pairs) and NUL-terminated. Depth is
 * limited so hostile input cannot exhaust the stack. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "bench/sil-mkmodel/mkmodel.h"

#define MAX_DEPTH 64

struct block {
    struct block *next;
    size_t used, cap;
    char data[];
};

struct sil_json_doc {
    struct block *blocks;
    struct sil_json *root;
};

struct parser {
    struct sil_json_doc *doc;
    const char *p, *start, *end, *name;
    struct sil_error *err;
    int rc;
};

static void *alloc(struct parser *ps, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    struct block *b = ps->doc->blocks;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > (1 << 20) ? n : (1 << 20);
        b = malloc(sizeof(*b) + cap);
        if (!b) {
            ps->rc = sil_errorf(ps->err, -ENOMEM, "%s: out of memory", ps->name);
            return NULL;
        }
        b->cap = cap;
        b->used = 0;
        b->next = ps->doc->blocks;
        ps->doc->blocks = b;
    }
    void *r = b->data + b->used;
    b->used += n;
    return r;
}

static int bad(struct parser *ps, const char *what)
{
    if (!ps->rc)
        ps->rc = sil_errorf(ps->err, -EINVAL, "%s: JSON: %s (offset %zu)", ps->name, what,
                            (size_t)(ps->p - ps->start));
    return ps->rc;
}

static void ws(struct parser *ps)
{
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\n' || *ps->p == '\r' || *ps->p == '\t'))
        ps->p++;
}

static int hex4(struct parser *ps, unsigned *out)
{
    if (ps->end - ps->p < 4)
        return bad(ps, "short \\u escape");
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = ps->p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return bad(ps, "bad \\u escape");
    }
    ps->p += 4;
    *out = v;
    return 0;
}

static size_t utf8(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

/* ps->p is just past the opening quote. Decoded text is never longer than the source. */
static char *string(struct parser *ps, size_t *len)
{
    const char *q = ps->p;
    while (q < ps->end && *q != '"') {
        if (*q == '\\')
            q++;
        q++;
    }
    if (q >= ps->end) {
        bad(ps, "unterminated string");
        return NULL;
    }
    char *out = alloc(ps, (size_t)(q - ps->p) + 1);
    if (!out)
        return NULL;
    size_t n = 0;
    while (*ps->p != '"') {
        char c = *ps->p++;
        if ((unsigned char)c < 0x20) {
            bad(ps, "control character in string");
            return NULL;
        }
        if (c != '\\') {
            out[n++] = c;
            continue;
        }
        c = *ps->p++;
        switch (c) {
        case '"': case '\\': case '/': out[n++] = c; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (hex4(ps, &cp))
                return NULL;
            if (cp >= 0xd800 && cp < 0xdc00 && ps->end - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u') {
                ps->p += 2;
                if (hex4(ps, &lo))
                    return NULL;
                if (lo < 0xdc00 || lo >= 0xe000) {
                    bad(ps, "unpaired surrogate");
                    return NULL;
                }
                cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else if (cp >= 0xd800 && cp < 0xe000) {
                bad(ps, "unpaired surrogate");
                return NULL;
            }
            n += utf8(out + n, cp); /* \uXXXX is 6 source bytes, at most 4 decoded */
            break;
        }
        default: bad(ps, "bad escape"); return NULL;
        }
    }
    ps->p++;
    out[n] = 0;
    *len = n;
    return out;
}

static struct sil_json *value(struct parser *ps, int depth)
{
    ws(ps);
    if (ps->p >= ps->end) {
        bad(ps, "unexpected end");
        return NULL;
    }
    if (depth > MAX_DEPTH) {
        bad(ps, "nested too deeply");
        return NULL;
    }
    struct sil_json *v = alloc(ps, sizeof(*v));
    if (!v)
        return NULL;
    memset(v, 0, sizeof(*v));
    char c = *ps->p;
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        v->type = obj ? SIL_JSON_OBJ : SIL_JSON_ARR;
        ps->p++;
        ws(ps);
        struct sil_json **tail = &v->child;
        if (ps->p < ps->end && *ps->p == (obj ? '}' : ']')) {
            ps->p++;
            return v;
        }
        for (;;) {
            char *k = NULL;
            size_t kl;
            if (obj) {
                ws(ps);
                if (ps->p >= ps->end || *ps->p != '"') {
                    bad(ps, "expected a member name");
                    return NULL;
                }
                ps->p++;
                if (!(k = string(ps, &kl)))
                    return NULL;
                ws(ps);
                if (ps->p >= ps->end || *ps->p != ':') {
                    bad(ps, "expected ':'");
                    return NULL;
                }
                ps->p++;
            }
            struct sil_json *e = value(ps, depth + 1);
            if (!e)
                return NULL;
            e->key = k;
            *tail = e;
            tail = &e->next;
            v->n_children++;
            ws(ps);
            if (ps->p < ps->end && *ps->p == ',') {
                ps->p++;
                continue;
            }
            if (ps->p < ps->end && *ps->p == (obj ? '}' : ']')) {
                ps->p++;
                return v;
            }
            bad(ps, obj ? "expected ',' or '}'" : "expected ',' or ']'");
            return NULL;
        }
    }
    if (c == '"') {
        ps->p++;
        v->type = SIL_JSON_STR;
        v->str = string(ps, &v->len);
        return v->str ? v : NULL;
    }
    static const struct {
        const char *w;
        int type;
        bool b;
    } words[] = {{"true", SIL_JSON_BOOL, true}, {"false", SIL_JSON_BOOL, false}, {"null", SIL_JSON_NULL, false}};
    for (size_t i = 0; i < 3; i++) {
        size_t l = strlen(words[i].w);
        if ((size_t)(ps->end - ps->p) >= l && memcmp(ps->p, words[i].w, l) == 0) {
            ps->p += l;
            v->type = words[i].type;
            v->b = words[i].b;
            return v;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char tmp[64];
        size_t l = 0;
        while (ps->p + l < ps->end && l < sizeof(tmp) - 1 && strchr("+-0123456789.eE", ps->p[l]))
            l++;
        memcpy(tmp, ps->p, l);
        tmp[l] = 0;
        char *e;
        v->num = strtod(tmp, &e);
        if (e != tmp + l) {
            bad(ps, "bad number");
            return NULL;
        }
        ps->p += l;
        v->type = SIL_JSON_NUM;
        return v;
    }
    bad(ps, "unexpected character");
    return NULL;
}

void sil_json_free(struct sil_json_doc *d)
{
    if (!d)
        return;
    for (struct block *b = d->blocks, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    free(d);
}

int sil_json_parse(struct sil_json_doc **out, const char *buf, size_t len, const char *name,
                   struct sil_error *err)
{
    struct sil_json_doc *d = calloc(1, sizeof(*d));
    if (!d)
        return sil_errorf(err, -ENOMEM, "%s: out of memory", name);
    struct parser ps = {.doc = d, .p = buf, .start = buf, .end = buf + len, .name = name, .err = err};
    d->root = value(&ps, 0);
    if (d->root) {
        ws(&ps);
        if (ps.p != ps.end)
            bad(&ps, "trailing data");
    }
    if (ps.rc || !d->root) {
        int rc = ps.rc ? ps.rc : -EINVAL;
        sil_json_free(d);
        return rc;
    }
    *out = d;
    return 0;
}

const struct sil_json *sil_json_root(const struct sil_json_doc *d) { return d->root; }

const struct sil_json *sil_json_get(const struct sil_json *obj, const char *key)
{
    if (!obj || obj->type != SIL_JSON_OBJ)
        return NULL;
    for (const struct sil_json *c = obj->child; c; c = c->next)
        if (strcmp(c->key, key) == 0)
            return c;
    return NULL;
}
