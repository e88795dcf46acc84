/* Routing trace files (route_trace.h has the format). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/route_trace.h"

static const char trace_magic[8] = {'S', 'I', 'L', 'R', 'O', 'U', 'T', 'E'};

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int sil_route_trace_create(struct sil_route_trace *t, const char *path, uint32_t n_layer,
                           uint32_t n_expert, uint32_t n_used, struct sil_error *err)
{
    memset(t, 0, sizeof(*t));
    if (n_layer == 0 || n_expert == 0 || n_expert > 65535 || n_used == 0 || n_used > n_expert)
        return sil_errorf(err, -EINVAL, "%s: a trace of %u layers, %u experts, %u used", path,
                          n_layer, n_expert, n_used);
    t->f = fopen(path, "wbe");
    if (!t->f) return sil_errorf(err, -errno, "%s: %s", path, strerror(errno));
    uint8_t h[32] = {0};
    memcpy(h, trace_magic, 8);
    put32(h + 8, SIL_ROUTE_TRACE_VERSION);
    put32(h + 12, n_layer);
    put32(h + 16, n_expert);
    put32(h + 20, n_used);
    t->n_layer = n_layer;
    t->n_expert = n_expert;
    t->n_used = n_used;
    if (fwrite(h, 1, sizeof(h), t->f) != sizeof(h)) t->error = -EIO;
    return 0;
}

void sil_route_trace_write(struct sil_route_trace *t, uint32_t layer, uint32_t n_rows,
                           const int32_t *sel)
{
    if (!t->f || t->error) return;
    uint8_t h[8], ids[2 * 256];
    put32(h, layer);
    put32(h + 4, n_rows);
    if (fwrite(h, 1, 8, t->f) != 8) t->error = -EIO;
    const uint64_t n = (uint64_t)n_rows * t->n_used;
    for (uint64_t i = 0; i < n && !t->error; i += 256) {
        const uint64_t m = n - i < 256 ? n - i : 256;
        for (uint64_t j = 0; j < m; j++) {
            const uint32_t e = (uint32_t)sel[i + j];
            ids[2 * j] = (uint8_t)e;
            ids[2 * j + 1] = (uint8_t)(e >> 8);
        }
        if (fwrite(ids, 2, m, t->f) != m) t->error = -EIO;
    }
    t->records++;
}

int sil_route_trace_close(struct sil_route_trace *t, struct sil_error *err)
{
    int rc = t->error;
    if (t->f && fclose(t->f) != 0 && rc == 0) rc = -errno;
    t->f = NULL;
    if (rc) sil_errorf(err, rc, "route trace: write failed: %s", strerror(-rc));
    return rc;
}

int sil_route_trace_open(struct sil_route_trace *t, const char *path, struct sil_error *err)
{
    FILE *f = fopen(path, "rbe");
    if (!f) {
        memset(t, 0, sizeof(*t));
        return sil_errorf(err, -errno, "%s: %s", path, strerror(errno));
    }
    return sil_route_trace_fopen(t, f, path, err);
}

int sil_route_trace_fopen(struct sil_route_trace *t, FILE *f, const char *path,
                          struct sil_error *err)
{
    memset(t, 0, sizeof(*t));
    t->f = f;
    uint8_t h[32];
    int rc = 0;
    if (fread(h, 1, 32, t->f) != 32 || memcmp(h, trace_magic, 8) != 0)
        rc = sil_errorf(err, -EINVAL, "%s: offset 0: not a routing trace", path);
    else if (get32(h + 8) != SIL_ROUTE_TRACE_VERSION)
        rc = sil_errorf(err, -EINVAL, "%s: offset 8: version %u, expected %u", path, get32(h + 8),
                        SIL_ROUTE_TRACE_VERSION);
    t->n_layer = get32(h + 12);
    t->n_expert = get32(h + 16);
    t->n_used = get32(h + 20);
    if (!rc && (t->n_layer == 0 || t->n_layer > 4096 || t->n_expert == 0 || t->n_expert > 65535 ||
                t->n_used == 0 || t->n_used > t->n_expert || t->n_used > 256))
        rc = sil_errorf(err, -EINVAL, "%s: offset 12: %u layers, %u experts, %u used", path,
                        t->n_layer, t->n_expert, t->n_used);
    if (rc) {
        fclose(t->f);
        t->f = NULL;
    }
    return rc;
}

int sil_route_trace_read(struct sil_route_trace *t, uint32_t *layer, uint32_t *n_rows, int32_t *sel,
                         struct sil_error *err)
{
    uint8_t h[8], ids[2 * 256];
    const size_t got = fread(h, 1, 8, t->f);
    if (got == 0 && feof(t->f)) return 0;
    if (got != 8)
        return sil_errorf(err, -EINVAL, "route trace: record %llu: truncated header",
                          (unsigned long long)t->records);
    *layer = get32(h);
    *n_rows = get32(h + 4);
    if (*layer >= t->n_layer || *n_rows == 0 || *n_rows > SIL_ROUTE_TRACE_MAX_ROWS)
        return sil_errorf(err, -EINVAL, "route trace: record %llu: layer %u of %u, %u rows",
                          (unsigned long long)t->records, *layer, t->n_layer, *n_rows);
    const uint64_t n = (uint64_t)*n_rows * t->n_used;
    for (uint64_t i = 0; i < n; i += 256) {
        const uint64_t m = n - i < 256 ? n - i : 256;
        if (fread(ids, 2, m, t->f) != m)
            return sil_errorf(err, -EINVAL, "route trace: record %llu: truncated",
                              (unsigned long long)t->records);
        for (uint64_t j = 0; j < m; j++) {
            const uint32_t e = (uint32_t)ids[2 * j] | (uint32_t)ids[2 * j + 1] << 8;
            if (e >= t->n_expert)
                return sil_errorf(err, -EINVAL, "route trace: record %llu: expert %u of %u",
                                  (unsigned long long)t->records, e, t->n_expert);
            sel[i + j] = (int32_t)e;
        }
    }
    t->records++;
    return 1;
}
