/* The bridge's request log line; see openai.h. */
#include "client/sil-openai/openai.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void sil_oa_reqlog_start(struct sil_oa_reqlog *l, const char *method, const char *path, double now)
{
    memset(l, 0, sizeof(*l));
    snprintf(l->method, sizeof(l->method), "%s", method);
    snprintf(l->path, sizeof(l->path), "%s", path);
    l->path_cut = strlen(path) >= sizeof(l->path);
    l->n_prompt = l->n_cached = l->n_generated = -1;
    l->t_start = now;
}

void sil_oa_reqlog_counts(struct sil_oa_reqlog *l, const msgpack_object *result)
{
    char why[sizeof(l->stop)];
    sil_rpc_map_str(result, "stop_reason", why, sizeof(why), "");
    if (why[0]) memcpy(l->stop, why, sizeof(why));
    l->n_prompt = sil_rpc_map_int(result, "n_prompt", -1);
    l->n_cached = sil_rpc_map_int(result, "n_cached", -1);
    l->n_generated = sil_rpc_map_int(result, "n_generated", -1);
}

/* Appends to buf at *n, never past size - 1; *n counts what would have been written. */
static void put(char *buf, size_t size, size_t *n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void put(char *buf, size_t size, size_t *n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(buf + (*n < size ? *n : size - 1), *n < size ? size - *n : 1, fmt, ap);
    va_end(ap);
    if (m > 0) *n += (size_t)m;
}

/* A peer's bytes as printable ASCII: anything else, and the backslash, as \xHH. */
static void put_clean(char *buf, size_t size, size_t *n, const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c >= 0x7f || c == '\\')
            put(buf, size, n, "\\x%02x", c);
        else
            put(buf, size, n, "%c", c);
    }
}

size_t sil_oa_reqlog_format(char *buf, size_t size, const struct sil_oa_reqlog *l, double now)
{
    size_t n = 0;
    buf[0] = 0;
    put_clean(buf, size, &n, l->method);
    put(buf, size, &n, " ");
    put_clean(buf, size, &n, l->path);
    if (l->path_cut) put(buf, size, &n, "...");
    if (l->id[0]) put(buf, size, &n, " %s", l->id);
    if (l->status)
        put(buf, size, &n, ": %d", l->status);
    else
        put(buf, size, &n, ": no answer");
    if (l->model[0]) {
        put(buf, size, &n, ", model ");
        put_clean(buf, size, &n, l->model);
    }
    if (l->stream) put(buf, size, &n, ", streamed");
    if (l->stop[0]) {
        put(buf, size, &n, ", ");
        put_clean(buf, size, &n, l->stop);
    }
    if (l->n_prompt >= 0) {
        put(buf, size, &n, ", %lld prompt tokens", l->n_prompt);
        if (l->n_cached >= 0) put(buf, size, &n, " (%lld cached)", l->n_cached);
    }
    if (l->n_generated >= 0) put(buf, size, &n, ", %lld generated", l->n_generated);
    put(buf, size, &n, ", %.1f ms", (now - l->t_start) * 1e3);
    if (l->client_gone)
        put(buf, size, &n, ", client gone");
    else if (l->ended_early)
        put(buf, size, &n, ", %s", l->ended_early);
    return n;
}
