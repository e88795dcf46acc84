/* GGUF reader: see gguf.h for the contract. The file is parsed with a bounds-checked cursor;
 * every count and length is checked against the bytes that remain before anything
 * proportional to it is allocated, so a hostile header cannot make us allocate or loop more
 * than the file size allows. */
#include "daemon/engine/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kernels/cpu/quants.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the GGUF reader reads little-endian values in place"
#endif

/* Smallest possible encodings, used to bound counts by the bytes left in the file:
 * a key-value is key length (8) + at least one key byte + type (4) + at least one value byte;
 * a tensor info is name length (8) + one name byte + n_dims (4) + one dim (8) + type (4) +
 * offset (8). */
#define MIN_KV_BYTES 14u
#define MIN_TENSOR_INFO_BYTES 33u
/* Arrays of arrays are not used by any model we read; refusing them keeps the accessors flat. */
#define MAX_ARRAY_NESTING 1

struct kv {
    char *key;
    enum sil_gguf_vtype type;
    enum sil_gguf_vtype arr_type; /* arrays only */
    uint64_t n;                   /* array length, or string length for a string value */
    const uint8_t *data;          /* scalar value, string bytes, or first array element */
    uint64_t *str_off;            /* string arrays: file offset of each element's length field */
    uint64_t off;                 /* file offset of the value (messages) */
};

struct sil_gguf {
    char *name;
    const uint8_t *base;
    uint64_t size;
    void *map; /* non-NULL when we own an mmap */
    uint64_t dev, ino; /* of the mapped file (0 for memory) */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    int64_t n_kv;
    struct kv *kv;
    int64_t n_tensors;
    struct sil_gguf_tensor *tensors;
    int64_t *kv_hash; /* open addressing, -1 = empty; size kv_mask + 1 */
    uint64_t kv_mask;
    int64_t *t_hash;
    uint64_t t_mask;
    uint64_t *t_info_off; /* file offset of each tensor's offset field (messages) */
};

struct cursor {
    const uint8_t *p;
    uint64_t size;
    uint64_t off;
    const char *name; /* for messages */
    struct sil_error *err;
};

static const char *const vtype_names[SIL_GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};

static const uint8_t vtype_size[SIL_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *sil_gguf_vtype_name(enum sil_gguf_vtype t)
{
    if ((unsigned)t >= SIL_GGUF_VTYPE_COUNT)
        return "invalid";
    return vtype_names[t];
}

__attribute__((format(printf, 3, 4))) static int fail(struct cursor *c, uint64_t off,
                                                      const char *fmt, ...)
{
    char what[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return sil_errorf(c->err, -EINVAL, "%s: %s (offset 0x%" PRIx64 ")", c->name, what, off);
}

static uint64_t remain(const struct cursor *c)
{
    return c->size - c->off;
}

static int need(struct cursor *c, uint64_t n, const char *what)
{
    if (n > remain(c))
        return fail(c, c->off, "truncated: %s needs %" PRIu64 " bytes, %" PRIu64 " left in file",
                    what, n, remain(c));
    return 0;
}

static int rd_u32(struct cursor *c, uint32_t *v, const char *what)
{
    int r = need(c, 4, what);
    if (r)
        return r;
    memcpy(v, c->p + c->off, 4);
    c->off += 4;
    return 0;
}

static int rd_u64(struct cursor *c, uint64_t *v, const char *what)
{
    int r = need(c, 8, what);
    if (r)
        return r;
    memcpy(v, c->p + c->off, 8);
    c->off += 8;
    return 0;
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF. Returns the offset of
 * the first bad byte, or n if the string is valid. */
static uint64_t utf8_bad(const uint8_t *s, uint64_t n)
{
    uint64_t i = 0;
    while (i < n) {
        uint8_t b = s[i];
        if (b < 0x80) {
            i++;
            continue;
        }
        unsigned len;
        uint32_t cp, min;
        if ((b & 0xE0) == 0xC0) {
            len = 2, cp = b & 0x1F, min = 0x80;
        } else if ((b & 0xF0) == 0xE0) {
            len = 3, cp = b & 0x0F, min = 0x800;
        } else if ((b & 0xF8) == 0xF0) {
            len = 4, cp = b & 0x07, min = 0x10000;
        } else {
            return i;
        }
        if (n - i < len)
            return i;
        for (unsigned k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return i;
        i += len;
    }
    return n;
}

/* Reads a GGUF string (u64 length + bytes) in place. */
static int rd_str(struct cursor *c, const uint8_t **s, uint64_t *len, const char *what)
{
    uint64_t at = c->off;
    int r = rd_u64(c, len, what);
    if (r)
        return r;
    if (*len > remain(c))
        return fail(c, at, "%s: string length %" PRIu64 " beyond end of file (%" PRIu64
                    " bytes left)", what, *len, remain(c));
    *s = c->p + c->off;
    c->off += *len;
    return 0;
}

/* A key or tensor name: non-empty valid UTF-8 without NUL, copied NUL-terminated. */
static int rd_name(struct cursor *c, char **out, const char *what)
{
    uint64_t at = c->off;
    const uint8_t *s = NULL;
    uint64_t len = 0;
    int r = rd_str(c, &s, &len, what);
    if (r)
        return r;
    if (len == 0)
        return fail(c, at, "%s is empty", what);
    uint64_t bad = utf8_bad(s, len);
    if (bad != len)
        return fail(c, at + 8 + bad, "%s is not valid UTF-8 (byte %" PRIu64 " of %" PRIu64 ")",
                    what, bad, len);
    if (memchr(s, 0, len))
        return fail(c, at, "%s contains a NUL byte", what);
    char *copy = malloc(len + 1);
    if (!copy)
        return sil_errorf(c->err, -ENOMEM, "%s: out of memory copying %s", c->name, what);
    memcpy(copy, s, len);
    copy[len] = 0;
    *out = copy;
    return 0;
}

static uint64_t hash_str(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static int64_t *hash_new(int64_t n, uint64_t *mask)
{
    uint64_t cap = 8;
    while (cap < (uint64_t)n * 2)
        cap <<= 1;
    int64_t *t = malloc(cap * sizeof *t);
    if (!t)
        return NULL;
    memset(t, 0xff, cap * sizeof *t);
    *mask = cap - 1;
    return t;
}

/* Looks up name; returns its slot index (empty or holding the match). */
static uint64_t hash_slot(const int64_t *t, uint64_t mask, const char *name,
                          const char *(*name_of)(const void *, int64_t), const void *ctx)
{
    uint64_t i = hash_str(name) & mask;
    while (t[i] >= 0 && strcmp(name_of(ctx, t[i]), name) != 0)
        i = (i + 1) & mask;
    return i;
}

static const char *kv_name_of(const void *ctx, int64_t i)
{
    return ((const struct sil_gguf *)ctx)->kv[i].key;
}

static const char *tensor_name_of(const void *ctx, int64_t i)
{
    return ((const struct sil_gguf *)ctx)->tensors[i].name;
}

static int parse_array(struct cursor *c, struct kv *kv, int depth, const char *key)
{
    uint32_t et;
    uint64_t at = c->off;
    int r = rd_u32(c, &et, "array element type");
    if (r)
        return r;
    if (et >= SIL_GGUF_VTYPE_COUNT)
        return fail(c, at, "key '%s': unknown array element type %" PRIu32, key, et);
    if (et == SIL_GGUF_ARRAY && depth + 1 > MAX_ARRAY_NESTING)
        return fail(c, at, "key '%s': array of arrays nested deeper than %d level(s)", key,
                    MAX_ARRAY_NESTING);
    uint64_t n;
    at = c->off;
    r = rd_u64(c, &n, "array length");
    if (r)
        return r;
    kv->arr_type = et;
    kv->n = n;
    kv->data = c->p + c->off;
    if (et == SIL_GGUF_STRING) {
        /* Each element takes at least its 8-byte length. */
        if (n > remain(c) / 8)
            return fail(c, at, "key '%s': string array of %" PRIu64
                        " elements cannot fit in the %" PRIu64 " bytes before end of file",
                        key, n, remain(c));
        kv->str_off = malloc((n ? n : 1) * sizeof *kv->str_off);
        if (!kv->str_off)
            return sil_errorf(c->err, -ENOMEM, "%s: key '%s': out of memory for %" PRIu64
                              " string offsets", c->name, key, n);
        for (uint64_t j = 0; j < n; j++) {
            const uint8_t *s = NULL;
            uint64_t len = 0;
            kv->str_off[j] = c->off;
            r = rd_str(c, &s, &len, "array string element");
            if (r)
                return r;
        }
        return 0;
    }
    uint64_t esz = vtype_size[et];
    if (n > remain(c) / esz)
        return fail(c, at, "key '%s': array of %" PRIu64 " %s elements (%" PRIu64
                    " bytes each) beyond end of file (%" PRIu64 " bytes left)",
                    key, n, vtype_names[et], esz, remain(c));
    if (et == SIL_GGUF_BOOL) {
        for (uint64_t j = 0; j < n; j++)
            if (c->p[c->off + j] > 1)
                return fail(c, c->off + j, "key '%s': bool array element %" PRIu64
                            " has value %u (not 0 or 1)", key, j, c->p[c->off + j]);
    }
    c->off += n * esz;
    return 0;
}

static int parse_kv(struct cursor *c, struct sil_gguf *g, int64_t i)
{
    struct kv *kv = &g->kv[i];
    uint64_t key_at = c->off;
    char what[48];
    snprintf(what, sizeof what, "key %" PRId64, i);
    int r = rd_name(c, &kv->key, what);
    if (r)
        return r;
    uint64_t slot = hash_slot(g->kv_hash, g->kv_mask, kv->key, kv_name_of, g);
    if (g->kv_hash[slot] >= 0)
        return fail(c, key_at, "duplicate key '%s' (kv %" PRId64 " and %" PRId64 ")", kv->key,
                    g->kv_hash[slot], i);
    g->kv_hash[slot] = i;

    uint32_t t;
    uint64_t at = c->off;
    r = rd_u32(c, &t, "value type");
    if (r)
        return r;
    if (t >= SIL_GGUF_VTYPE_COUNT)
        return fail(c, at, "key '%s': unknown value type %" PRIu32, kv->key, t);
    kv->type = t;
    kv->off = c->off;
    if (t == SIL_GGUF_STRING) {
        const uint8_t *s = NULL;
        r = rd_str(c, &s, &kv->n, "string value");
        kv->data = s;
        return r;
    }
    if (t == SIL_GGUF_ARRAY)
        return parse_array(c, kv, 1, kv->key);
    r = need(c, vtype_size[t], "value");
    if (r)
        return r;
    kv->data = c->p + c->off;
    if (t == SIL_GGUF_BOOL && kv->data[0] > 1)
        return fail(c, c->off, "key '%s': bool value %u (not 0 or 1)", kv->key, kv->data[0]);
    c->off += vtype_size[t];
    return 0;
}

static int mul_overflow_i64(int64_t a, int64_t b, int64_t *out)
{
    return __builtin_mul_overflow(a, b, out);
}

static int parse_tensor_info(struct cursor *c, struct sil_gguf *g, int64_t i)
{
    struct sil_gguf_tensor *t = &g->tensors[i];
    uint64_t name_at = c->off;
    char what[48];
    snprintf(what, sizeof what, "tensor %" PRId64 " name", i);
    char *name = NULL;
    int r = rd_name(c, &name, what);
    if (r)
        return r;
    t->name = name;
    uint64_t slot = hash_slot(g->t_hash, g->t_mask, name, tensor_name_of, g);
    if (g->t_hash[slot] >= 0)
        return fail(c, name_at, "duplicate tensor name '%s' (tensors %" PRId64 " and %" PRId64
                    ")", name, g->t_hash[slot], i);
    g->t_hash[slot] = i;

    uint64_t at = c->off;
    r = rd_u32(c, &t->n_dims, "tensor n_dims");
    if (r)
        return r;
    if (t->n_dims == 0 || t->n_dims > SIL_GGUF_MAX_DIMS)
        return fail(c, at, "tensor %" PRId64 " '%s': n_dims %" PRIu32 " not in 1..%d", i, name,
                    t->n_dims, SIL_GGUF_MAX_DIMS);
    for (int d = 0; d < SIL_GGUF_MAX_DIMS; d++)
        t->ne[d] = 1;
    int64_t nelem = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        uint64_t v;
        at = c->off;
        r = rd_u64(c, &v, "tensor dim");
        if (r)
            return r;
        if ((int64_t)v <= 0)
            return fail(c, at, "tensor %" PRId64 " '%s': dim %" PRIu32 " is %" PRId64
                        " (must be > 0)", i, name, d, (int64_t)v);
        t->ne[d] = (int64_t)v;
        if (mul_overflow_i64(nelem, t->ne[d], &nelem))
            return fail(c, at, "tensor %" PRId64 " '%s': element count overflows int64", i, name);
    }
    uint32_t type;
    at = c->off;
    r = rd_u32(c, &type, "tensor type");
    if (r)
        return r;
    const struct sil_type_traits *tr = type < SIL_TYPE_COUNT ? sil_type_traits((int)type) : NULL;
    if (!tr || !tr->known || tr->block_size <= 0 || tr->type_size == 0)
        return fail(c, at, "tensor %" PRId64 " '%s': unknown tensor type %" PRIu32, i, name,
                    type);
    t->type = (int)type;
    if (t->ne[0] % tr->block_size != 0)
        return fail(c, at, "tensor %" PRId64 " '%s': row length %" PRId64
                    " is not a multiple of the %s block size %" PRId64,
                    i, name, t->ne[0], tr->name, tr->block_size);
    int64_t row, nbytes;
    if (mul_overflow_i64(t->ne[0] / tr->block_size, (int64_t)tr->type_size, &row) ||
        mul_overflow_i64(row, t->ne[1], &nbytes) || mul_overflow_i64(nbytes, t->ne[2], &nbytes) ||
        mul_overflow_i64(nbytes, t->ne[3], &nbytes))
        return fail(c, at, "tensor %" PRId64 " '%s': byte size overflows int64", i, name);
    t->nbytes = (uint64_t)nbytes;
    g->t_info_off[i] = c->off;
    r = rd_u64(c, &t->offset, "tensor offset");
    if (r)
        return r;
    return 0;
}

static int cmp_by_offset(const void *a, const void *b, void *ctx)
{
    const struct sil_gguf_tensor *t = ctx;
    uint64_t x = t[*(const int64_t *)a].offset, y = t[*(const int64_t *)b].offset;
    return x < y ? -1 : x > y;
}

/* Offsets relative to the data section: aligned, inside the file, and no two tensors share
 * a byte. */
static int check_tensor_data(struct cursor *c, struct sil_gguf *g)
{
    uint64_t avail = g->size - g->data_offset;
    for (int64_t i = 0; i < g->n_tensors; i++) {
        struct sil_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0)
            return fail(c, g->t_info_off[i], "tensor %" PRId64 " '%s': data offset %" PRIu64
                        " is not a multiple of the alignment %" PRIu64,
                        i, t->name, t->offset, g->alignment);
        if (t->offset > avail || t->nbytes > avail - t->offset)
            return fail(c, g->t_info_off[i], "tensor %" PRId64 " '%s': data [%" PRIu64 ", %" PRIu64
                        ") + data section start %" PRIu64 " beyond end of file (size %" PRIu64
                        ")", i, t->name, t->offset, t->offset + t->nbytes, g->data_offset,
                        g->size);
        t->data = g->base + g->data_offset + t->offset;
    }
    if (g->n_tensors < 2)
        return 0;
    int64_t *order = malloc((size_t)g->n_tensors * sizeof *order);
    if (!order)
        return sil_errorf(c->err, -ENOMEM, "%s: out of memory", c->name);
    for (int64_t i = 0; i < g->n_tensors; i++)
        order[i] = i;
    qsort_r(order, (size_t)g->n_tensors, sizeof *order, cmp_by_offset, g->tensors);
    int r = 0;
    for (int64_t k = 1; k < g->n_tensors && !r; k++) {
        const struct sil_gguf_tensor *a = &g->tensors[order[k - 1]], *b = &g->tensors[order[k]];
        if (a->offset + a->nbytes > b->offset)
            r = fail(c, g->t_info_off[order[k]],
                     "tensor %" PRId64 " '%s' data [%" PRIu64 ", %" PRIu64
                     ") overlaps tensor %" PRId64 " '%s' data [%" PRIu64 ", %" PRIu64 ")",
                     order[k], b->name, b->offset, b->offset + b->nbytes, order[k - 1], a->name,
                     a->offset, a->offset + a->nbytes);
    }
    free(order);
    return r;
}

static int parse(struct sil_gguf *g, struct sil_error *err)
{
    struct cursor c = {.p = g->base, .size = g->size, .off = 0, .name = g->name, .err = err};
    int r;
    if (g->size < 4)
        return fail(&c, 0, "truncated: %" PRIu64 " bytes, too short for the GGUF magic", g->size);
    if (memcmp(g->base, "GGUF", 4) != 0)
        return fail(&c, 0, "bad magic %02x %02x %02x %02x (expected 'GGUF')", g->base[0],
                    g->base[1], g->base[2], g->base[3]);
    c.off = 4;
    if ((r = rd_u32(&c, &g->version, "version")))
        return r;
    if (g->version != 2 && g->version != 3)
        return fail(&c, 4, "unsupported GGUF version %" PRIu32 " (supported: 2, 3)", g->version);
    uint64_t n_tensors, n_kv;
    if ((r = rd_u64(&c, &n_tensors, "tensor count")) || (r = rd_u64(&c, &n_kv, "kv count")))
        return r;
    if (n_tensors > remain(&c) / MIN_TENSOR_INFO_BYTES)
        return fail(&c, 8, "tensor count %" PRIu64 " cannot fit in the %" PRIu64
                    " bytes before end of file", n_tensors, remain(&c));
    if (n_kv > remain(&c) / MIN_KV_BYTES)
        return fail(&c, 16, "kv count %" PRIu64 " cannot fit in the %" PRIu64
                    " bytes before end of file", n_kv, remain(&c));

    g->kv = calloc(n_kv ? n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(n_tensors ? n_tensors : 1, sizeof *g->tensors);
    g->kv_hash = hash_new((int64_t)n_kv, &g->kv_mask);
    g->t_hash = hash_new((int64_t)n_tensors, &g->t_mask);
    g->t_info_off = calloc(n_tensors ? n_tensors : 1, sizeof *g->t_info_off);
    if (!g->kv || !g->tensors || !g->kv_hash || !g->t_hash || !g->t_info_off)
        return sil_errorf(err, -ENOMEM, "%s: out of memory for %" PRIu64 " keys and %" PRIu64
                          " tensors", g->name, n_kv, n_tensors);

    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv = (int64_t)i + 1; /* so close() frees what was parsed */
        if ((r = parse_kv(&c, g, (int64_t)i)))
            return r;
    }

    g->alignment = SIL_GGUF_DEFAULT_ALIGNMENT;
    int64_t ai = sil_gguf_find_key(g, "general.alignment");
    if (ai >= 0) {
        const struct kv *kv = &g->kv[ai];
        if (kv->type != SIL_GGUF_UINT32)
            return fail(&c, kv->off, "general.alignment has type %s (expected u32)",
                        vtype_names[kv->type]);
        uint32_t a;
        memcpy(&a, kv->data, 4);
        if (a == 0 || (a & (a - 1)) != 0)
            return fail(&c, kv->off, "general.alignment %" PRIu32 " is not a power of two", a);
        g->alignment = a;
    }

    for (uint64_t i = 0; i < n_tensors; i++) {
        g->n_tensors = (int64_t)i + 1;
        if ((r = parse_tensor_info(&c, g, (int64_t)i)))
            return r;
    }

    /* Same layout as GGUF's writer: the data section starts at the next multiple of the
     * alignment, and there is no padding when there are no tensors. */
    g->data_offset = c.off;
    if (n_tensors > 0) {
        uint64_t pad = (g->alignment - c.off % g->alignment) % g->alignment;
        if (pad > remain(&c))
            return fail(&c, c.off, "truncated: data section would start at %" PRIu64
                        " beyond end of file (size %" PRIu64 ")", c.off + pad, g->size);
        g->data_offset = c.off + pad;
    }
    return check_tensor_data(&c, g);
}

static int open_common(struct sil_gguf **out, struct sil_gguf *g, struct sil_error *err)
{
    int r = parse(g, err);
    if (r) {
        sil_gguf_close(g);
        *out = NULL;
        return r;
    }
    *out = g;
    return 0;
}

int sil_gguf_open_mem(struct sil_gguf **out, const void *buf, size_t len, const char *name,
                      struct sil_error *err)
{
    *out = NULL;
    struct sil_gguf *g = calloc(1, sizeof *g);
    if (!g)
        return sil_errorf(err, -ENOMEM, "out of memory");
    g->name = strdup(name ? name : "<memory>");
    if (!g->name) {
        free(g);
        return sil_errorf(err, -ENOMEM, "out of memory");
    }
    g->base = buf;
    g->size = len;
    return open_common(out, g, err);
}

int sil_gguf_open(struct sil_gguf **out, const char *path, struct sil_error *err)
{
    *out = NULL;
    /* O_NONBLOCK: opening a FIFO (or some devices) would otherwise wait for a writer forever;
     * anything that is not a regular file is refused below before a byte is read. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        int e = errno;
        return sil_errorf(err, -e, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return sil_errorf(err, -e, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return sil_errorf(err, -EINVAL, "%s: not a regular file (%s)", path,
                          S_ISDIR(st.st_mode)    ? "a directory"
                          : S_ISFIFO(st.st_mode) ? "a FIFO"
                          : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)
                              ? "a device"
                              : "a socket or other special file");
    }
    void *map = NULL;
    if (st.st_size > 0) {
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return sil_errorf(err, -e, "%s: cannot mmap %lld bytes: %s", path,
                              (long long)st.st_size, strerror(e));
        }
    }
    close(fd); /* the mapping keeps the file */
    struct sil_gguf *g = calloc(1, sizeof *g);
    char *name = strdup(path);
    if (!g || !name) {
        free(g);
        free(name);
        if (map)
            munmap(map, (size_t)st.st_size);
        return sil_errorf(err, -ENOMEM, "%s: out of memory", path);
    }
    static const uint8_t empty[1];
    g->name = name;
    g->map = map;
    g->base = map ? map : empty;
    g->size = (uint64_t)st.st_size;
    g->dev = (uint64_t)st.st_dev;
    g->ino = (uint64_t)st.st_ino;
    return open_common(out, g, err);
}

void sil_gguf_close(struct sil_gguf *g)
{
    if (!g)
        return;
    for (int64_t i = 0; i < g->n_kv; i++) {
        free(g->kv[i].key);
        free(g->kv[i].str_off);
    }
    for (int64_t i = 0; i < g->n_tensors; i++)
        free((char *)g->tensors[i].name);
    free(g->kv);
    free(g->tensors);
    free(g->kv_hash);
    free(g->t_hash);
    free(g->t_info_off);
    if (g->map)
        munmap(g->map, g->size);
    free(g->name);
    free(g);
}

uint32_t sil_gguf_version(const struct sil_gguf *g)
{
    return g->version;
}

void sil_gguf_file_id(const struct sil_gguf *g, uint64_t *dev, uint64_t *ino)
{
    *dev = g->dev;
    *ino = g->ino;
}

const char *sil_gguf_path(const struct sil_gguf *g)
{
    return g->name;
}

uint64_t sil_gguf_file_size(const struct sil_gguf *g)
{
    return g->size;
}

uint64_t sil_gguf_alignment(const struct sil_gguf *g)
{
    return g->alignment;
}

uint64_t sil_gguf_data_offset(const struct sil_gguf *g)
{
    return g->data_offset;
}

const void *sil_gguf_base(const struct sil_gguf *g)
{
    return g->base;
}

int64_t sil_gguf_n_kv(const struct sil_gguf *g)
{
    return g->n_kv;
}

int64_t sil_gguf_find_key(const struct sil_gguf *g, const char *key)
{
    if (!key || !g->kv_hash)
        return -1;
    return g->kv_hash[hash_slot(g->kv_hash, g->kv_mask, key, kv_name_of, g)];
}

static const struct kv *kv_at(const struct sil_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? &g->kv[i] : NULL;
}

const char *sil_gguf_key_name(const struct sil_gguf *g, int64_t i)
{
    const struct kv *kv = kv_at(g, i);
    return kv ? kv->key : NULL;
}

enum sil_gguf_vtype sil_gguf_key_type(const struct sil_gguf *g, int64_t i)
{
    const struct kv *kv = kv_at(g, i);
    return kv ? kv->type : SIL_GGUF_VTYPE_COUNT;
}

static const struct kv *arr_at(const struct sil_gguf *g, int64_t i)
{
    const struct kv *kv = kv_at(g, i);
    return kv && kv->type == SIL_GGUF_ARRAY ? kv : NULL;
}

enum sil_gguf_vtype sil_gguf_arr_type(const struct sil_gguf *g, int64_t i)
{
    const struct kv *kv = arr_at(g, i);
    return kv ? kv->arr_type : SIL_GGUF_VTYPE_COUNT;
}

uint64_t sil_gguf_arr_len(const struct sil_gguf *g, int64_t i)
{
    const struct kv *kv = arr_at(g, i);
    return kv ? kv->n : 0;
}

const void *sil_gguf_arr_data(const struct sil_gguf *g, int64_t i)
{
    const struct kv *kv = arr_at(g, i);
    return kv && kv->arr_type != SIL_GGUF_STRING && kv->arr_type != SIL_GGUF_ARRAY ? kv->data
                                                                                     : NULL;
}

struct sil_str sil_gguf_arr_str(const struct sil_gguf *g, int64_t i, uint64_t j)
{
    struct sil_str s = {NULL, 0};
    const struct kv *kv = arr_at(g, i);
    if (!kv || kv->arr_type != SIL_GGUF_STRING || j >= kv->n)
        return s;
    memcpy(&s.len, g->base + kv->str_off[j], 8);
    s.ptr = (const char *)g->base + kv->str_off[j] + 8;
    return s;
}

/* An integer value widened: either as signed or as unsigned, whichever holds it exactly. */
struct ival {
    bool neg;   /* value is negative: use s */
    int64_t s;
    uint64_t u; /* value when !neg */
};

static bool read_int(enum sil_gguf_vtype t, const uint8_t *p, struct ival *v)
{
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        uint64_t u64;
        int64_t i64;
    } x;
    int64_t s = 0;
    uint64_t u = 0;
    bool is_signed = false;
    switch (t) {
    case SIL_GGUF_UINT8: memcpy(&x.u8, p, 1), u = x.u8; break;
    case SIL_GGUF_INT8: memcpy(&x.i8, p, 1), s = x.i8, is_signed = true; break;
    case SIL_GGUF_UINT16: memcpy(&x.u16, p, 2), u = x.u16; break;
    case SIL_GGUF_INT16: memcpy(&x.i16, p, 2), s = x.i16, is_signed = true; break;
    case SIL_GGUF_UINT32: memcpy(&x.u32, p, 4), u = x.u32; break;
    case SIL_GGUF_INT32: memcpy(&x.i32, p, 4), s = x.i32, is_signed = true; break;
    case SIL_GGUF_UINT64: memcpy(&x.u64, p, 8), u = x.u64; break;
    case SIL_GGUF_INT64: memcpy(&x.i64, p, 8), s = x.i64, is_signed = true; break;
    default: return false;
    }
    if (is_signed && s < 0) {
        v->neg = true;
        v->s = s;
        v->u = 0;
    } else {
        v->neg = false;
        v->u = is_signed ? (uint64_t)s : u;
        v->s = 0;
    }
    return true;
}

static bool read_float(enum sil_gguf_vtype t, const uint8_t *p, double *v)
{
    if (t == SIL_GGUF_FLOAT32) {
        float f;
        memcpy(&f, p, 4);
        *v = f;
        return true;
    }
    if (t == SIL_GGUF_FLOAT64) {
        memcpy(v, p, 8);
        return true;
    }
    return false;
}

static int lookup(const struct sil_gguf *g, const char *key, const struct kv **kv,
                  struct sil_error *err)
{
    int64_t i = sil_gguf_find_key(g, key);
    if (i < 0)
        return sil_errorf(err, -ENOENT, "%s: key '%s' not found", g->name, key ? key : "(null)");
    *kv = &g->kv[i];
    return 0;
}

static int mismatch(const struct sil_gguf *g, const struct kv *kv, const char *want,
                    struct sil_error *err)
{
    return sil_errorf(err, -EINVAL, "%s: key '%s': expected %s, found %s (offset 0x%" PRIx64 ")",
                      g->name, kv->key, want,
                      kv->type == SIL_GGUF_ARRAY ? "array" : vtype_names[kv->type], kv->off);
}

static int out_of_range(const struct sil_gguf *g, const struct kv *kv, const char *want,
                        struct sil_error *err)
{
    return sil_errorf(err, -ERANGE, "%s: key '%s': %s value does not fit %s (offset 0x%" PRIx64
                      ")", g->name, kv->key, vtype_names[kv->type], want, kv->off);
}

static int get_int(const struct sil_gguf *g, const char *key, struct ival *v, const char *want,
                   const struct kv **kvp, struct sil_error *err)
{
    int r = lookup(g, key, kvp, err);
    if (r)
        return r;
    if (!read_int((*kvp)->type, (*kvp)->data, v))
        return mismatch(g, *kvp, want, err);
    return 0;
}

int sil_gguf_get_u32(const struct sil_gguf *g, const char *key, uint32_t *out,
                     struct sil_error *err)
{
    struct ival v = {0};
    const struct kv *kv = NULL;
    int r = get_int(g, key, &v, "u32", &kv, err);
    if (r)
        return r;
    if (v.neg || v.u > UINT32_MAX)
        return out_of_range(g, kv, "u32", err);
    *out = (uint32_t)v.u;
    return 0;
}

int sil_gguf_get_u64(const struct sil_gguf *g, const char *key, uint64_t *out,
                     struct sil_error *err)
{
    struct ival v = {0};
    const struct kv *kv = NULL;
    int r = get_int(g, key, &v, "u64", &kv, err);
    if (r)
        return r;
    if (v.neg)
        return out_of_range(g, kv, "u64", err);
    *out = v.u;
    return 0;
}

int sil_gguf_get_i64(const struct sil_gguf *g, const char *key, int64_t *out,
                     struct sil_error *err)
{
    struct ival v = {0};
    const struct kv *kv = NULL;
    int r = get_int(g, key, &v, "i64", &kv, err);
    if (r)
        return r;
    if (!v.neg && v.u > INT64_MAX)
        return out_of_range(g, kv, "i64", err);
    *out = v.neg ? v.s : (int64_t)v.u;
    return 0;
}

int sil_gguf_get_f32(const struct sil_gguf *g, const char *key, float *out,
                     struct sil_error *err)
{
    const struct kv *kv = NULL;
    int r = lookup(g, key, &kv, err);
    if (r)
        return r;
    double d = 0;
    if (!read_float(kv->type, kv->data, &d))
        return mismatch(g, kv, "f32", err);
    if (isfinite(d) && fabs(d) > FLT_MAX)
        return out_of_range(g, kv, "f32", err);
    *out = (float)d;
    return 0;
}

int sil_gguf_get_bool(const struct sil_gguf *g, const char *key, bool *out,
                      struct sil_error *err)
{
    const struct kv *kv = NULL;
    int r = lookup(g, key, &kv, err);
    if (r)
        return r;
    if (kv->type != SIL_GGUF_BOOL)
        return mismatch(g, kv, "bool", err);
    *out = kv->data[0] != 0;
    return 0;
}

int sil_gguf_get_str(const struct sil_gguf *g, const char *key, struct sil_str *out,
                     struct sil_error *err)
{
    const struct kv *kv = NULL;
    int r = lookup(g, key, &kv, err);
    if (r)
        return r;
    if (kv->type != SIL_GGUF_STRING)
        return mismatch(g, kv, "string", err);
    out->ptr = (const char *)kv->data;
    out->len = kv->n;
    return 0;
}

int sil_gguf_get_arr(const struct sil_gguf *g, const char *key, enum sil_gguf_vtype *elem_type,
                     uint64_t *len, int64_t *index, struct sil_error *err)
{
    const struct kv *kv = NULL;
    int r = lookup(g, key, &kv, err);
    if (r)
        return r;
    if (kv->type != SIL_GGUF_ARRAY)
        return mismatch(g, kv, "array", err);
    if (elem_type)
        *elem_type = kv->arr_type;
    if (len)
        *len = kv->n;
    if (index)
        *index = kv - g->kv;
    return 0;
}

static const uint8_t *arr_elem(const struct sil_gguf *g, int64_t i, uint64_t j,
                               enum sil_gguf_vtype *t)
{
    const struct kv *kv = arr_at(g, i);
    if (!kv || j >= kv->n || kv->arr_type == SIL_GGUF_STRING || kv->arr_type == SIL_GGUF_ARRAY)
        return NULL;
    *t = kv->arr_type;
    return kv->data + j * vtype_size[kv->arr_type];
}

int sil_gguf_arr_get_i64(const struct sil_gguf *g, int64_t i, uint64_t j, int64_t *out)
{
    enum sil_gguf_vtype t;
    const uint8_t *p = arr_elem(g, i, j, &t);
    if (!p)
        return -EINVAL;
    struct ival v = {0};
    if (read_int(t, p, &v)) {
        if (!v.neg && v.u > INT64_MAX)
            return -ERANGE;
        *out = v.neg ? v.s : (int64_t)v.u;
        return 0;
    }
    double d = 0;
    if (!read_float(t, p, &d))
        return -EINVAL; /* bool */
    /* A float converts only when it is an integer that int64 holds. */
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0) || d != trunc(d))
        return -ERANGE;
    *out = (int64_t)d;
    return 0;
}

int sil_gguf_arr_get_f32(const struct sil_gguf *g, int64_t i, uint64_t j, float *out)
{
    enum sil_gguf_vtype t;
    const uint8_t *p = arr_elem(g, i, j, &t);
    if (!p)
        return -EINVAL;
    double d = 0;
    struct ival v = {0};
    if (read_float(t, p, &d)) {
        if (isfinite(d) && fabs(d) > FLT_MAX)
            return -ERANGE;
        *out = (float)d;
        return 0;
    }
    if (!read_int(t, p, &v))
        return -EINVAL;
    *out = v.neg ? (float)v.s : (float)v.u;
    return 0;
}

int64_t sil_gguf_n_tensors(const struct sil_gguf *g)
{
    return g->n_tensors;
}

const struct sil_gguf_tensor *sil_gguf_tensor(const struct sil_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct sil_gguf_tensor *sil_gguf_find_tensor(const struct sil_gguf *g, const char *name)
{
    if (!name || !g->t_hash)
        return NULL;
    int64_t i = g->t_hash[hash_slot(g->t_hash, g->t_mask, name, tensor_name_of, g)];
    return i >= 0 ? &g->tensors[i] : NULL;
}
