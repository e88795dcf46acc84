/* Expert heat map file (expert_heat.h has the format and the contract). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/engine/expert_heat.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/model.h"
#include "kernels/atomicfile.h"
#include "kernels/bytes.h"

static const char heat_magic[8] = "SILHEAT";
enum { HDR = 40 };

static uint64_t fnv_u64(uint64_t h, uint64_t v)
{
    uint8_t b[8];
    sil_put_le64(b, v);
    return sil_fnv1a(h, b, 8);
}

uint64_t sil_heat_model_id(const struct sil_model *m)
{
    const struct sil_hparams *hp = &m->hp;
    uint64_t h = SIL_FNV_INIT;
    h = fnv_u64(h, (uint64_t)m->arch);
    const int32_t shape[] = {hp->n_layer,  hp->n_embd,     hp->n_expert, hp->n_expert_used,
                             hp->n_ff_exp, hp->n_ff_shexp, hp->n_vocab};
    for (size_t i = 0; i < sizeof(shape) / sizeof(shape[0]); i++)
        h = fnv_u64(h, (uint64_t)(uint32_t)shape[i]);
    const int64_t n = sil_gguf_n_tensors(m->gguf);
    h = fnv_u64(h, (uint64_t)n);
    for (int64_t i = 0; i < n; i++) {
        const struct sil_gguf_tensor *t = sil_gguf_tensor(m->gguf, i);
        h = sil_fnv1a(h, t->name, strlen(t->name) + 1);
        h = fnv_u64(h, (uint64_t)t->type);
        for (int d = 0; d < SIL_GGUF_MAX_DIMS; d++)
            h = fnv_u64(h, (uint64_t)t->ne[d]);
        h = fnv_u64(h, t->offset);
    }
    return h ? h : 1; /* 0 means "any" to the parser */
}

int sil_heat_file_name(const struct sil_model *m, char *out, size_t size)
{
    struct sil_str name = {0};
    struct sil_error err;
    if (sil_gguf_get_str(m->gguf, "general.name", &name, &err) < 0) name.len = 0;
    char slug[33];
    size_t n = 0;
    for (size_t i = 0; i < name.len && n < sizeof slug - 1; i++) {
        const unsigned char c = (unsigned char)name.ptr[i];
        const char k = c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a')
                       : (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ? (char)c
                                                                                      : '-';
        if (k == '-' && (n == 0 || slug[n - 1] == '-')) continue; /* no leading or doubled '-' */
        slug[n++] = k;
    }
    while (n > 0 && slug[n - 1] == '-')
        n--;
    slug[n] = 0;
    uint64_t h = fnv_u64(SIL_FNV_INIT, sil_heat_model_id(m));
    h = sil_fnv1a(h, name.ptr, name.len);
    const int k = snprintf(out, size, SIL_HEAT_FILE_PREFIX "%s-%016llx", n ? slug : "model",
                           (unsigned long long)h);
    return k < 0 || (size_t)k >= size ? -ENAMETOOLONG : 0;
}

int sil_heat_map_save(const char *path, const struct sil_heat_map *m, struct sil_error *err)
{
    const uint64_t n_key = (uint64_t)m->n_layer * m->n_expert;
    if (n_key == 0 || n_key > SIL_HEAT_MAX_KEYS)
        return sil_errorf(err, -EINVAL, "%s: heat map of %u x %u experts", path, m->n_layer,
                          m->n_expert);
    const size_t len = HDR + 4 * n_key + 8;
    uint8_t *buf = malloc(len);
    char *tmp = malloc(strlen(path) + 16);
    if (!buf || !tmp) {
        free(buf);
        free(tmp);
        return sil_errorf(err, -ENOMEM, "%s: out of memory", path);
    }
    memcpy(buf, heat_magic, 8);
    sil_put_le32(buf + 8, SIL_HEAT_VERSION);
    sil_put_le32(buf + 12, m->n_layer);
    sil_put_le32(buf + 16, m->n_expert);
    sil_put_le32(buf + 20, 0);
    sil_put_le64(buf + 24, m->model_id);
    sil_put_le64(buf + 32, m->tokens);
    for (uint64_t k = 0; k < n_key; k++) {
        const float v = isfinite(m->heat[k]) && m->heat[k] > 0 ? m->heat[k] : 0.0f;
        uint32_t u;
        memcpy(&u, &v, 4);
        sil_put_le32(buf + HDR + 4 * k, u);
    }
    sil_put_le64(buf + len - 8, sil_fnv1a(SIL_FNV_INIT, buf, len - 8));

    /* the temporary name is unique per process, so two writers never share one */
    sprintf(tmp, "%s.%ld~", path, (long)getpid() % 100000000);
    const char *step;
    const int rc = sil_atomic_write(AT_FDCWD, path, tmp, buf, len, 0600, &step);
    free(buf);
    if (rc != 0) sil_errorf(err, rc, "%s: %s of %s failed: %s", path, step, tmp, strerror(-rc));
    free(tmp);
    return rc;
}

int sil_heat_map_parse(const void *data, size_t len, const char *name, uint64_t model_id,
                       uint32_t n_layer, uint32_t n_expert, struct sil_heat_map *out,
                       struct sil_error *err)
{
    const uint8_t *b = data;
    memset(out, 0, sizeof(*out));
    if (len < HDR + 8)
        return sil_errorf(err, -EINVAL, "%s: %zu bytes, shorter than the %d-byte header", name, len,
                          HDR + 8);
    if (memcmp(b, heat_magic, 8) != 0)
        return sil_errorf(err, -EINVAL, "%s: offset 0: not a heat map (magic)", name);
    const uint32_t version = sil_get_le32(b + 8), L = sil_get_le32(b + 12), X = sil_get_le32(b + 16);
    if (version != SIL_HEAT_VERSION)
        return sil_errorf(err, -EINVAL, "%s: offset 8: version %u, expected %u", name, version,
                          SIL_HEAT_VERSION);
    const uint64_t n_key = (uint64_t)L * X;
    if (L == 0 || X == 0 || n_key > SIL_HEAT_MAX_KEYS)
        return sil_errorf(err, -EINVAL, "%s: offset 12: %u layers x %u experts", name, L, X);
    if ((n_layer && L != n_layer) || (n_expert && X != n_expert))
        return sil_errorf(err, -EINVAL,
                          "%s: offset 12: %u layers x %u experts, the model has %u x %u", name, L,
                          X, n_layer, n_expert);
    if (sil_get_le32(b + 20) != 0)
        return sil_errorf(err, -EINVAL, "%s: offset 20: reserved field not 0", name);
    const uint64_t id = sil_get_le64(b + 24);
    if (model_id && id != model_id)
        return sil_errorf(err, -EINVAL,
                          "%s: offset 24: made for another model (%016llx, this is %016llx)", name,
                          (unsigned long long)id, (unsigned long long)model_id);
    const size_t want = HDR + 4 * (size_t)n_key + 8;
    if (len != want)
        return sil_errorf(err, -EINVAL, "%s: %zu bytes, %u x %u experts need %zu", name, len, L, X,
                          want);
    const uint64_t sum = sil_get_le64(b + len - 8);
    if (sum != sil_fnv1a(SIL_FNV_INIT, b, len - 8))
        return sil_errorf(err, -EINVAL, "%s: offset %zu: checksum mismatch", name, len - 8);
    float *heat = malloc((size_t)n_key * sizeof(float));
    if (!heat) return sil_errorf(err, -ENOMEM, "%s: out of memory", name);
    for (uint64_t k = 0; k < n_key; k++) {
        const uint32_t u = sil_get_le32(b + HDR + 4 * k);
        float v;
        memcpy(&v, &u, 4);
        if (!isfinite(v) || v < 0) {
            free(heat);
            return sil_errorf(err, -EINVAL, "%s: offset %llu: heat of layer %llu expert %llu is %g",
                              name, (unsigned long long)(HDR + 4 * k), (unsigned long long)(k / X),
                              (unsigned long long)(k % X), (double)v);
        }
        heat[k] = v;
    }
    *out = (struct sil_heat_map){L, X, id, sil_get_le64(b + 32), heat};
    return 0;
}

int sil_heat_map_load(const char *path, uint64_t model_id, uint32_t n_layer, uint32_t n_expert,
                      struct sil_heat_map *out, struct sil_error *err)
{
    memset(out, 0, sizeof(*out));
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sil_errorf(err, -errno, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size > HDR + 4ull * SIL_HEAT_MAX_KEYS + 8) {
        close(fd);
        return sil_errorf(err, -EINVAL, "%s: not a regular file of a heat map's size", path);
    }
    const size_t len = (size_t)st.st_size;
    uint8_t *buf = malloc(len ? len : 1);
    if (!buf) {
        close(fd);
        return sil_errorf(err, -ENOMEM, "%s: out of memory", path);
    }
    size_t got = 0;
    while (got < len) {
        const ssize_t r = read(fd, buf + got, len - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    const int rc = sil_heat_map_parse(buf, got, path, model_id, n_layer, n_expert, out, err);
    free(buf);
    return rc;
}

void sil_heat_map_free(struct sil_heat_map *m)
{
    free(m->heat);
    m->heat = NULL;
}

static int hotter(const void *a, const void *b, void *arg)
{
    const float *heat = arg;
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (heat[x] != heat[y]) return heat[x] > heat[y] ? -1 : 1;
    return (x > y) - (x < y);
}

int64_t sil_heat_map_hottest(const struct sil_heat_map *m, int32_t *keys, int64_t n)
{
    const int64_t n_key = (int64_t)m->n_layer * m->n_expert;
    int32_t *all = malloc((size_t)(n_key > 0 ? n_key : 1) * sizeof(int32_t));
    if (!all) return -ENOMEM;
    int64_t nz = 0;
    for (int64_t k = 0; k < n_key; k++)
        if (m->heat[k] > 0) all[nz++] = (int32_t)k;
    qsort_r(all, (size_t)nz, sizeof(int32_t), hotter, m->heat);
    if (n > nz) n = nz;
    if (n > 0) memcpy(keys, all, (size_t)n * sizeof(int32_t));
    free(all);
    return n < 0 ? 0 : n;
}
