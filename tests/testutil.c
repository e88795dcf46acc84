#include "tests/testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/engine/engine.h"

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "testutil: out of memory (%zu bytes)\n", n);
        abort();
    }
    return q;
}

static char *xstrfmt2(const char *a, const char *sep, const char *b)
{
    size_t n = strlen(a) + strlen(sep) + strlen(b) + 1;
    char *s = xrealloc(NULL, n);
    snprintf(s, n, "%s%s%s", a, sep, b);
    return s;
}

const char *tu_shared_dir(void)
{
    const char *s = getenv("SHARED");
    return s && *s ? s : "../shared";
}

char *tu_refdata_path(const char *rel)
{
    char *dir = xstrfmt2(tu_shared_dir(), "/", "refdata");
    char *p = xstrfmt2(dir, "/", rel);
    free(dir);
    return p;
}

char *tu_refdata_copy(const char *rel, const char *dir, const char *name)
{
    char *src = tu_refdata_path(rel), *dst = tu_path_join(dir, name);
    void *buf = NULL;
    size_t len = 0;
    const bool ok = tu_read_file(src, &buf, &len) == 0 && tu_write_file(dst, buf, len) == 0;
    free(buf);
    free(src);
    if (!ok) {
        free(dst);
        return NULL;
    }
    return dst;
}

int tu_open_refdata_engine(struct sil_engine **e, const char *name, struct sil_engine_params *p,
                           struct sil_error *err)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "models/%s.gguf", name);
    char *path = tu_refdata_path(rel);
    p->model_path = path;
    const int rc = sil_engine_open(e, p, err);
    p->model_path = NULL;
    free(path);
    return rc;
}

bool tu_refdata_exists(const char *rel)
{
    char *p = tu_refdata_path(rel);
    bool ok = access(p, R_OK) == 0;
    free(p);
    return ok;
}

bool tu_ci(void)
{
    const char *ci = getenv("CI");
    return ci && (strcasecmp(ci, "true") == 0 || strcmp(ci, "1") == 0);
}

char *tu_tmpdir_create(void)
{
    const char *t = getenv("TMPDIR");
    char *tmpl = xstrfmt2(t && *t ? t : "/tmp", "/", "siltest.XXXXXX");
    if (!mkdtemp(tmpl)) {
        free(tmpl);
        return NULL;
    }
    return tmpl;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path) == 0 ? 0 : -errno;
}

int tu_tmpdir_remove(const char *dir)
{
    /* FTW_PHYS: never follow a symlink out of the temporary directory. */
    int r = nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    return r < 0 ? -errno : r;
}

char *tu_path_join(const char *dir, const char *name)
{
    return xstrfmt2(dir, "/", name);
}

int tu_read_file(const char *path, void **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    size_t cap = 1 << 16, n = 0;
    char *p = xrealloc(NULL, cap);
    for (;;) {
        if (n + 1 >= cap)
            p = xrealloc(p, cap *= 2);
        size_t got = fread(p + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    int e = ferror(f) ? -EIO : 0;
    fclose(f);
    if (e) {
        free(p);
        return e;
    }
    p[n] = 0;
    *buf = p;
    *len = n;
    return 0;
}

int tu_write_file(const char *path, const void *buf, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            int e = -errno;
            close(fd);
            return e;
        }
        p += w;
        len -= (size_t)w;
    }
    return close(fd) == 0 ? 0 : -errno;
}

void tu_buf_free(struct tu_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static uint8_t *grow(struct tu_buf *b, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        b->p = xrealloc(b->p, cap);
        b->cap = cap;
    }
    uint8_t *at = b->p + b->len;
    b->len += n;
    return at;
}

void tu_put_bytes(struct tu_buf *b, const void *p, size_t n)
{
    uint8_t *at = grow(b, n);
    if (n)
        memcpy(at, p, n);
}

void tu_put_zeros(struct tu_buf *b, size_t n)
{
    uint8_t *at = grow(b, n);
    if (n)
        memset(at, 0, n);
}

/* GGUF is little-endian; the tests run on little-endian hosts only (as the reader does). */
void tu_put_u8(struct tu_buf *b, uint8_t v) { tu_put_bytes(b, &v, 1); }
void tu_put_u16(struct tu_buf *b, uint16_t v) { tu_put_bytes(b, &v, 2); }
void tu_put_u32(struct tu_buf *b, uint32_t v) { tu_put_bytes(b, &v, 4); }
void tu_put_u64(struct tu_buf *b, uint64_t v) { tu_put_bytes(b, &v, 8); }
void tu_put_i32(struct tu_buf *b, int32_t v) { tu_put_bytes(b, &v, 4); }
void tu_put_i64(struct tu_buf *b, int64_t v) { tu_put_bytes(b, &v, 8); }
void tu_put_f32(struct tu_buf *b, float v) { tu_put_bytes(b, &v, 4); }
void tu_put_f64(struct tu_buf *b, double v) { tu_put_bytes(b, &v, 8); }

void tu_put_strn(struct tu_buf *b, const void *s, uint64_t len)
{
    tu_put_u64(b, len);
    tu_put_bytes(b, s, (size_t)len);
}

void tu_put_str(struct tu_buf *b, const char *s)
{
    tu_put_strn(b, s, strlen(s));
}

void tu_put_pad(struct tu_buf *b, size_t align)
{
    if (align > 1 && b->len % align)
        tu_put_zeros(b, align - b->len % align);
}

void tu_patch_u32(struct tu_buf *b, size_t off, uint32_t v)
{
    if (off + 4 > b->len)
        abort();
    memcpy(b->p + off, &v, 4);
}

void tu_patch_u64(struct tu_buf *b, size_t off, uint64_t v)
{
    if (off + 8 > b->len)
        abort();
    memcpy(b->p + off, &v, 8);
}

void tu_gguf_header(struct tu_buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    tu_put_bytes(b, "GGUF", 4);
    tu_put_u32(b, version);
    tu_put_u64(b, n_tensors);
    tu_put_u64(b, n_kv);
}

void tu_gguf_key(struct tu_buf *b, const char *key, uint32_t vtype)
{
    tu_put_str(b, key);
    tu_put_u32(b, vtype);
}

/* Value type numbers, as in gguf.h (not included here so testutil has no engine dependency). */
enum { VT_U32 = 4, VT_I32 = 5, VT_F32 = 6, VT_BOOL = 7, VT_STR = 8, VT_ARR = 9, VT_U64 = 10 };

void tu_gguf_kv_u32(struct tu_buf *b, const char *key, uint32_t v)
{
    tu_gguf_key(b, key, VT_U32);
    tu_put_u32(b, v);
}

void tu_gguf_kv_i32(struct tu_buf *b, const char *key, int32_t v)
{
    tu_gguf_key(b, key, VT_I32);
    tu_put_i32(b, v);
}

void tu_gguf_kv_u64(struct tu_buf *b, const char *key, uint64_t v)
{
    tu_gguf_key(b, key, VT_U64);
    tu_put_u64(b, v);
}

void tu_gguf_kv_f32(struct tu_buf *b, const char *key, float v)
{
    tu_gguf_key(b, key, VT_F32);
    tu_put_f32(b, v);
}

void tu_gguf_kv_bool(struct tu_buf *b, const char *key, bool v)
{
    tu_gguf_key(b, key, VT_BOOL);
    tu_put_u8(b, v ? 1 : 0);
}

void tu_gguf_kv_str(struct tu_buf *b, const char *key, const char *v)
{
    tu_gguf_key(b, key, VT_STR);
    tu_put_str(b, v);
}

void tu_gguf_kv_arr(struct tu_buf *b, const char *key, uint32_t elem_vtype, uint64_t n)
{
    tu_gguf_key(b, key, VT_ARR);
    tu_put_u32(b, elem_vtype);
    tu_put_u64(b, n);
}

void tu_gguf_kv_arr_str(struct tu_buf *b, const char *key, const char *const *v, uint64_t n)
{
    tu_gguf_kv_arr(b, key, VT_STR, n);
    for (uint64_t i = 0; i < n; i++)
        tu_put_str(b, v[i]);
}

void tu_gguf_kv_arr_i32(struct tu_buf *b, const char *key, const int32_t *v, uint64_t n)
{
    tu_gguf_kv_arr(b, key, VT_I32, n);
    for (uint64_t i = 0; i < n; i++)
        tu_put_i32(b, v[i]);
}

void tu_gguf_kv_arr_f32(struct tu_buf *b, const char *key, const float *v, uint64_t n)
{
    tu_gguf_kv_arr(b, key, VT_F32, n);
    for (uint64_t i = 0; i < n; i++)
        tu_put_f32(b, v[i]);
}

void tu_gguf_tensor_info(struct tu_buf *b, const char *name, uint32_t n_dims, const int64_t *ne,
                         uint32_t type, uint64_t offset)
{
    tu_put_str(b, name);
    tu_put_u32(b, n_dims);
    for (uint32_t i = 0; i < n_dims; i++)
        tu_put_i64(b, ne[i]);
    tu_put_u32(b, type);
    tu_put_u64(b, offset);
}
