/* Typed access to the named fields of a params / result map, and JSON output of any object. */
#include "siliceo-proto.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <string.h>

static const char *type_name(const msgpack_object *o)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return "nil";
    case MSGPACK_OBJECT_BOOLEAN: return "boolean";
    case MSGPACK_OBJECT_POSITIVE_INTEGER: return "unsigned integer";
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return "negative integer";
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return "float";
    case MSGPACK_OBJECT_STR: return "string";
    case MSGPACK_OBJECT_ARRAY: return "array";
    case MSGPACK_OBJECT_MAP: return "map";
    case MSGPACK_OBJECT_BIN: return "binary";
    case MSGPACK_OBJECT_EXT: return "ext";
    }
    return "unknown";
}

const msgpack_object *sil_rpc_map_get(const msgpack_object *map, const char *key)
{
    if (!map || map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    size_t klen = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object *k = &map->via.map.ptr[i].key;
        const char *s;
        size_t n;
        if (k->type == MSGPACK_OBJECT_STR) {
            s = k->via.str.ptr;
            n = k->via.str.size;
        } else if (k->type == MSGPACK_OBJECT_BIN) {
            s = k->via.bin.ptr;
            n = k->via.bin.size;
        } else {
            continue;
        }
        if (n == klen && (n == 0 || memcmp(s, key, n) == 0))
            return &map->via.map.ptr[i].val;
    }
    return NULL;
}

/* Common start of every getter: 1 and *v set when there is a value to convert, else the
 * getter's final return value. */
static int lookup(const msgpack_object *map, const char *key, unsigned flags,
                  const msgpack_object **v, struct sil_rpc_error *err)
{
    if (!map || map->type != MSGPACK_OBJECT_MAP) {
        if (!map && !(flags & SIL_RPC_REQUIRED))
            return 0; /* no params at all: every optional field is absent */
        if (!map)
            return sil_rpc_errorf(err, -ENOENT, SIL_RPC_E_INVALID_PARAMS,
                                  "field '%s' is required (no params given)", key);
        return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                              "field '%s': params is a %s, not a map", key, type_name(map));
    }
    *v = sil_rpc_map_get(map, key);
    if (*v && (*v)->type == MSGPACK_OBJECT_NIL && (flags & SIL_RPC_NULLABLE))
        *v = NULL;
    if (!*v) {
        if (flags & SIL_RPC_REQUIRED)
            return sil_rpc_errorf(err, -ENOENT, SIL_RPC_E_INVALID_PARAMS,
                                  "field '%s' is required", key);
        return 0;
    }
    return 1;
}

static int wrong_type(const char *key, const char *want, const msgpack_object *v,
                      struct sil_rpc_error *err)
{
    return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                          "field '%s': expected %s, got %s", key, want, type_name(v));
}

int sil_rpc_get_str(const msgpack_object *map, const char *key, const char **s, size_t *len,
                    unsigned flags, struct sil_rpc_error *err)
{
    const msgpack_object *v;
    int r = lookup(map, key, flags, &v, err);
    if (r <= 0)
        return r;
    if (v->type == MSGPACK_OBJECT_STR) {
        *s = v->via.str.ptr;
        if (len)
            *len = v->via.str.size;
    } else if (v->type == MSGPACK_OBJECT_BIN) {
        *s = v->via.bin.ptr;
        if (len)
            *len = v->via.bin.size;
    } else {
        return wrong_type(key, "string", v, err);
    }
    if (!*s)
        *s = ""; /* msgpack-c gives NULL for an empty string; callers may pass it to memcpy */
    return 1;
}

int sil_rpc_get_strbuf(const msgpack_object *map, const char *key, char *buf, size_t size,
                       unsigned flags, struct sil_rpc_error *err)
{
    const char *s;
    size_t n;
    int r = sil_rpc_get_str(map, key, &s, &n, flags, err);
    if (r <= 0)
        return r;
    if (n >= size)
        return sil_rpc_errorf(err, -ERANGE, SIL_RPC_E_INVALID_PARAMS,
                              "field '%s': string of %zu bytes, at most %zu allowed", key, n,
                              size ? size - 1 : 0);
    if (memchr(s, 0, n))
        return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                              "field '%s': string contains a NUL byte", key);
    memcpy(buf, s, n);
    buf[n] = 0;
    return 1;
}

int sil_rpc_get_int(const msgpack_object *map, const char *key, int64_t min, int64_t max,
                    int64_t *out, unsigned flags, struct sil_rpc_error *err)
{
    const msgpack_object *v;
    int r = lookup(map, key, flags, &v, err);
    if (r <= 0)
        return r;
    int64_t x;
    switch (v->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        if (v->via.u64 > (uint64_t)INT64_MAX)
            goto range_u;
        x = (int64_t)v->via.u64;
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        x = v->via.i64;
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!(v->via.f64 >= -9.2e18 && v->via.f64 <= 9.2e18) || v->via.f64 != floor(v->via.f64))
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                  "field '%s': expected integer, got %g", key, v->via.f64);
        x = (int64_t)v->via.f64;
        break;
    default:
        return wrong_type(key, "integer", v, err);
    }
    if (x < min || x > max)
        return sil_rpc_errorf(err, -ERANGE, SIL_RPC_E_INVALID_PARAMS,
                              "field '%s': %" PRId64 " out of range [%" PRId64 ", %" PRId64 "]",
                              key, x, min, max);
    *out = x;
    return 1;
range_u:
    return sil_rpc_errorf(err, -ERANGE, SIL_RPC_E_INVALID_PARAMS,
                          "field '%s': %" PRIu64 " out of range [%" PRId64 ", %" PRId64 "]", key,
                          v->via.u64, min, max);
}

int sil_rpc_get_uint(const msgpack_object *map, const char *key, uint64_t min, uint64_t max,
                     uint64_t *out, unsigned flags, struct sil_rpc_error *err)
{
    const msgpack_object *v;
    int r = lookup(map, key, flags, &v, err);
    if (r <= 0)
        return r;
    uint64_t x;
    switch (v->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        x = v->via.u64;
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return sil_rpc_errorf(err, -ERANGE, SIL_RPC_E_INVALID_PARAMS,
                              "field '%s': %" PRId64 " out of range [%" PRIu64 ", %" PRIu64 "]",
                              key, v->via.i64, min, max);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (!(v->via.f64 >= 0 && v->via.f64 <= 1.8e19) || v->via.f64 != floor(v->via.f64))
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                  "field '%s': expected unsigned integer, got %g", key,
                                  v->via.f64);
        x = (uint64_t)v->via.f64;
        break;
    default:
        return wrong_type(key, "unsigned integer", v, err);
    }
    if (x < min || x > max)
        return sil_rpc_errorf(err, -ERANGE, SIL_RPC_E_INVALID_PARAMS,
                              "field '%s': %" PRIu64 " out of range [%" PRIu64 ", %" PRIu64 "]",
                              key, x, min, max);
    *out = x;
    return 1;
}

int sil_rpc_get_double(const msgpack_object *map, const char *key, double min, double max,
                       double *out, unsigned flags, struct sil_rpc_error *err)
{
    const msgpack_object *v;
    int r = lookup(map, key, flags, &v, err);
    if (r <= 0)
        return r;
    double x;
    switch (v->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: x = (double)v->via.u64; break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: x = (double)v->via.i64; break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: x = v->via.f64; break;
    default: return wrong_type(key, "number", v, err);
    }
    if (!(x >= min && x <= max))
        return sil_rpc_errorf(err, -ERANGE, SIL_RPC_E_INVALID_PARAMS,
                              "field '%s': %g out of range [%g, %g]", key, x, min, max);
    *out = x;
    return 1;
}

int sil_rpc_get_bool(const msgpack_object *map, const char *key, bool *out, unsigned flags,
                     struct sil_rpc_error *err)
{
    const msgpack_object *v;
    int r = lookup(map, key, flags, &v, err);
    if (r <= 0)
        return r;
    if (v->type != MSGPACK_OBJECT_BOOLEAN)
        return wrong_type(key, "boolean", v, err);
    *out = v->via.boolean;
    return 1;
}

int sil_rpc_get_array(const msgpack_object *map, const char *key, const msgpack_object **out,
                      unsigned flags, struct sil_rpc_error *err)
{
    const msgpack_object *v;
    int r = lookup(map, key, flags, &v, err);
    if (r <= 0)
        return r;
    if (v->type != MSGPACK_OBJECT_ARRAY)
        return wrong_type(key, "array", v, err);
    *out = v;
    return 1;
}

int sil_rpc_get_map(const msgpack_object *map, const char *key, const msgpack_object **out,
                    unsigned flags, struct sil_rpc_error *err)
{
    const msgpack_object *v;
    int r = lookup(map, key, flags, &v, err);
    if (r <= 0)
        return r;
    if (v->type != MSGPACK_OBJECT_MAP)
        return wrong_type(key, "map", v, err);
    *out = v;
    return 1;
}

int64_t sil_rpc_map_int(const msgpack_object *map, const char *key, int64_t def)
{
    int64_t v = def;
    sil_rpc_get_int(map, key, INT64_MIN, INT64_MAX, &v, SIL_RPC_OPTIONAL, NULL);
    return v;
}

double sil_rpc_map_double(const msgpack_object *map, const char *key, double def)
{
    double v = def;
    sil_rpc_get_double(map, key, -INFINITY, INFINITY, &v, SIL_RPC_OPTIONAL, NULL);
    return v;
}

bool sil_rpc_map_bool(const msgpack_object *map, const char *key, bool def)
{
    bool v = def;
    sil_rpc_get_bool(map, key, &v, SIL_RPC_OPTIONAL, NULL);
    return v;
}

const char *sil_rpc_map_str(const msgpack_object *map, const char *key, char *buf, size_t size,
                            const char *def)
{
    const char *s;
    size_t n;
    if (size == 0)
        return def;
    if (sil_rpc_get_str(map, key, &s, &n, SIL_RPC_OPTIONAL, NULL) <= 0) {
        snprintf(buf, size, "%s", def ? def : "");
        return def ? buf : NULL;
    }
    if (n >= size)
        n = size - 1;
    memcpy(buf, s, n);
    buf[n] = 0;
    return buf;
}

void sil_rpc_read_error(const msgpack_object *error, struct sil_rpc_error *err)
{
    if (!err)
        return;
    err->code = SIL_RPC_E_INTERNAL;
    err->retry_after_ms = 0;
    snprintf(err->msg, sizeof(err->msg), "%s", sil_rpc_code_message(SIL_RPC_E_INTERNAL));
    if (!error)
        return;
    if (error->type == MSGPACK_OBJECT_STR || error->type == MSGPACK_OBJECT_BIN) {
        const char *s = error->type == MSGPACK_OBJECT_STR ? error->via.str.ptr : error->via.bin.ptr;
        if (!s)
            s = "";
        uint32_t n = error->type == MSGPACK_OBJECT_STR ? error->via.str.size : error->via.bin.size;
        snprintf(err->msg, sizeof(err->msg), "%.*s", (int)(n > 511 ? 511 : n), s);
        return;
    }
    if (error->type == MSGPACK_OBJECT_POSITIVE_INTEGER && error->via.u64 < 1u << 30) {
        err->code = (int)error->via.u64;
        snprintf(err->msg, sizeof(err->msg), "%s", sil_rpc_code_message(err->code));
        return;
    }
    int64_t code = SIL_RPC_E_INTERNAL;
    sil_rpc_get_int(error, "code", 0, INT32_MAX, &code, SIL_RPC_OPTIONAL, NULL);
    err->code = (int)code;
    int64_t retry = 0;
    if (sil_rpc_get_int(error, "retry_after_ms", 1, 3600000, &retry, SIL_RPC_OPTIONAL, NULL) == 1)
        err->retry_after_ms = (int)retry;
    if (!sil_rpc_map_str(error, "message", err->msg, sizeof(err->msg), NULL))
        snprintf(err->msg, sizeof(err->msg), "%s", sil_rpc_code_message(err->code));
}

/* ---- JSON ------------------------------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (n bytes left), 0 if invalid. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

static void json_str(FILE *f, const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc((int)c, f);
            i++;
        } else if (c == '\n') {
            fputs("\\n", f);
            i++;
        } else if (c == '\t') {
            fputs("\\t", f);
            i++;
        } else if (c == '\r') {
            fputs("\\r", f);
            i++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
            i++;
        } else {
            size_t k = utf8_len(p + i, n - i);
            if (k == 0) {
                fputs("\xef\xbf\xbd", f); /* U+FFFD keeps the output valid UTF-8 */
                i++;
            } else {
                fwrite(p + i, 1, k, f);
                i += k;
            }
        }
    }
    fputc('"', f);
}

static void newline(FILE *f, int indent, int level)
{
    if (indent < 0)
        return;
    fputc('\n', f);
    for (int i = 0; i < indent * level; i++)
        fputc(' ', f);
}

/* in_key: o is (inside) a map key being rendered as the text of a JSON key. Such text is
 * quoted once more, which doubles its escapes: keys of keys would grow exponentially with their
 * nesting (a hostile peer's 30 nested one-entry maps are gigabytes), so inside a key, a map or
 * array key is rendered as the placeholder "(key)". */
static void json_obj_in(FILE *f, const msgpack_object *o, int indent, int level, bool in_key);

static void json_obj(FILE *f, const msgpack_object *o, int indent, int level)
{
    json_obj_in(f, o, indent, level, false);
}

static void json_obj_in(FILE *f, const msgpack_object *o, int indent, int level, bool in_key)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL:
    case MSGPACK_OBJECT_EXT:
        fputs("null", f);
        break;
    case MSGPACK_OBJECT_BOOLEAN:
        fputs(o->via.boolean ? "true" : "false", f);
        break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        fprintf(f, "%" PRIu64, o->via.u64);
        break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        fprintf(f, "%" PRId64, o->via.i64);
        break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        if (isfinite(o->via.f64))
            fprintf(f, "%.*g", o->type == MSGPACK_OBJECT_FLOAT32 ? 9 : 17, o->via.f64);
        else
            fputs("null", f);
        break;
    case MSGPACK_OBJECT_STR:
        json_str(f, o->via.str.ptr, o->via.str.size);
        break;
    case MSGPACK_OBJECT_BIN:
        json_str(f, o->via.bin.ptr, o->via.bin.size);
        break;
    case MSGPACK_OBJECT_ARRAY:
        fputc('[', f);
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            if (i)
                fputc(',', f);
            newline(f, indent, level + 1);
            json_obj_in(f, &o->via.array.ptr[i], indent, level + 1, in_key);
        }
        if (o->via.array.size)
            newline(f, indent, level);
        fputc(']', f);
        break;
    case MSGPACK_OBJECT_MAP:
        fputc('{', f);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object *k = &o->via.map.ptr[i].key;
            if (i)
                fputc(',', f);
            newline(f, indent, level + 1);
            if (k->type == MSGPACK_OBJECT_STR) {
                json_str(f, k->via.str.ptr, k->via.str.size);
            } else if (k->type == MSGPACK_OBJECT_BIN) {
                json_str(f, k->via.bin.ptr, k->via.bin.size);
            } else if (in_key &&
                       (k->type == MSGPACK_OBJECT_MAP || k->type == MSGPACK_OBJECT_ARRAY)) {
                fputs("\"(key)\"", f);
            } else {
                /* JSON keys are strings: print the key as JSON, then quote that text. */
                char *text = NULL;
                size_t len = 0;
                FILE *m = open_memstream(&text, &len);
                if (m) {
                    json_obj_in(m, k, -1, 0, true);
                    fclose(m);
                }
                json_str(f, text ? text : "", text ? len : 0);
                free(text);
            }
            fputs(indent < 0 ? ":" : ": ", f);
            json_obj_in(f, &o->via.map.ptr[i].val, indent, level + 1, in_key);
        }
        if (o->via.map.size)
            newline(f, indent, level);
        fputc('}', f);
        break;
    }
}

int sil_rpc_print_json(FILE *f, const msgpack_object *o, int indent)
{
    json_obj(f, o, indent, 0);
    return ferror(f) ? -EIO : 0;
}

int sil_rpc_print_json_str(FILE *f, const char *s)
{
    json_str(f, s ? s : "", s ? strlen(s) : 0);
    return ferror(f) ? -EIO : 0;
}
