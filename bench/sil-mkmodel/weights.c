/* Seeded weights at sane scales, and the routing skew.
 *
 * Every row has its own random stream keyed by (model seed, tensor name, row), so rows can be
 * made in any order, by any thread, and regenerated alone by a test.
 *
 * Values are triangular (the sum of two uniforms): bell-shaped, bounded, cheap.
 *
 * Skew (--skew S > 0, MoE only): real routers have popular experts. We reserve one channel k0
 * of the residual stream as a constant "bias channel": every token embedding holds B = sqrt(n_embd)
 * there, no block writes to it (row k0 of every output projection is zero) and no projection
 * other than the routers reads it (element k0 of their rows is zero). After RMSNorm the channel
 * is B / rms(x), about sqrt(n_embd / 2) (it shrinks slowly as the blocks add to the stream), so
 * the router logit of expert e gets a constant term w_e[k0] * h[k0] on every token. We set
 * w_e[k0] = -S * ln(rank_e + 1) / sqrt(n_embd / 2), with rank_e a per-layer random permutation
 * of the experts: logit offsets of -S ln(rank), i.e. selection odds roughly proportional to
 * (rank + 1)^-S, a Zipf law of exponent S on top of the random per-token routing. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/sil-mkmodel/mkmodel.h"

static inline uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline uint64_t next64(uint64_t *s)
{
    *s += 0xa0761d6478bd642full;
    __uint128_t t = (__uint128_t)*s * (*s ^ 0xe7037ed1a0b428dbull);
    return (uint64_t)(t >> 64) ^ (uint64_t)t;
}

static inline float uniform01(uint32_t u) { return (float)(u >> 8) * (1.0f / 16777216.0f); }

/* Triangular on [-sqrt(6), sqrt(6)] * std: mean 0, standard deviation std. */
static inline float tri(uint64_t *s, float std)
{
    uint64_t r = next64(s);
    return (uniform01((uint32_t)r) + uniform01((uint32_t)(r >> 32)) - 1.0f) * 2.4494897f * std;
}

int64_t sil_mk_bias_channel(const struct sil_mk_model *m)
{
    (void)m;
    return 0;
}

static bool skewed(const struct sil_mk_model *m) { return m->skew > 0 && sil_mk_arch_is_moe(m->hp.arch); }

/* Popularity rank (0 = most popular) of expert e in a layer: a seeded permutation. */
static int64_t expert_rank(const struct sil_mk_model *m, int layer, int64_t e)
{
    int64_t n = m->hp.n_expert;
    uint64_t s = splitmix64(m->seed ^ 0x5eedf00dull ^ ((uint64_t)layer << 32));
    /* Walk a Fisher-Yates shuffle of 0..n-1 and report where e lands; n is at most a few
     * hundred and this runs once per router row. */
    int64_t perm[4096];
    if (n > 4096)
        return e;
    for (int64_t i = 0; i < n; i++)
        perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(next64(&s) % (uint64_t)(i + 1));
        int64_t tmp = perm[i];
        perm[i] = perm[j];
        perm[j] = tmp;
    }
    for (int64_t i = 0; i < n; i++)
        if (perm[i] == e)
            return i;
    return e;
}

void sil_mk_gen_row(const struct sil_mk_model *m, const struct sil_mk_tensor *t, int64_t row, float *out)
{
    const int64_t n = t->ne[0];
    uint64_t s = splitmix64(t->seed ^ splitmix64((uint64_t)row + 1));

    if (t->src) {
        memcpy(out, t->src + row * n, (size_t)n * sizeof(float));
        return;
    }
    switch (t->init) {
    case SIL_MK_INIT_NORM:
        for (int64_t i = 0; i < n; i++)
            out[i] = 1.0f + tri(&s, 0.02f);
        return;
    case SIL_MK_INIT_SSM_A:
        /* A = -exp(A_log) with A_log = log U(0.5, 8): per-head decay rates */
        for (int64_t i = 0; i < n; i++)
            out[i] = -(0.5f + 7.5f * uniform01((uint32_t)next64(&s)));
        return;
    case SIL_MK_INIT_SSM_DT:
        for (int64_t i = 0; i < n; i++)
            out[i] = -0.5f + 1.5f * uniform01((uint32_t)next64(&s));
        return;
    default:
        break;
    }
    for (int64_t i = 0; i < n; i++)
        out[i] = tri(&s, t->scale);

    if (!skewed(m))
        return;
    const int64_t k0 = sil_mk_bias_channel(m);
    if (t->init == SIL_MK_INIT_EMBD) {
        out[k0] = sqrtf((float)m->hp.n_embd);
    } else if (t->init == SIL_MK_INIT_ROUTER) {
        int64_t rank = expert_rank(m, t->layer, row);
        out[k0] = -m->skew * logf((float)(rank + 1)) / sqrtf((float)m->hp.n_embd / 2.0f);
    } else {
        if (t->flags & SIL_MK_IN_EMBD)
            out[k0] = 0.0f;
        /* rows of an output projection: the row index (within one expert) is the output channel */
        if ((t->flags & SIL_MK_OUT_EMBD) && row % t->ne[1] == k0)
            memset(out, 0, (size_t)n * sizeof(float));
    }
}

/* Reads the whole of path into t->src; its size must be the tensor's element count * 4. */
static int read_tensor(struct sil_mk_tensor *t, const char *path, struct sil_error *err)
{
    const int64_t elems = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
    const size_t want = (size_t)elems * sizeof(float);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sil_errorf(err, -errno, "%s: %s (tensor '%s' needs %lld floats)", path,
                          strerror(errno), t->name, (long long)elems);
    struct stat st;
    const int64_t got = fstat(fd, &st) < 0 ? -1 : (int64_t)st.st_size;
    if (got < 0 || (uint64_t)got != want) {
        close(fd);
        return sil_errorf(err, -EINVAL, "%s: %lld bytes, tensor '%s' [%lld, %lld, %lld] needs %zu",
                          path, (long long)got, t->name, (long long)t->ne[0], (long long)t->ne[1],
                          (long long)t->ne[2], want);
    }
    t->src = malloc(want ? want : 1);
    if (!t->src) {
        close(fd);
        return sil_errorf(err, -ENOMEM, "%s: out of memory", path);
    }
    size_t done = 0;
    while (done < want) {
        ssize_t r = read(fd, (char *)t->src + done, want - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? -errno : -EIO;
            close(fd);
            return sil_errorf(err, e, "%s: read failed at byte %zu", path, done);
        }
        done += (size_t)r;
    }
    close(fd);
    for (int64_t i = 0; i < elems; i++)
        if (!isfinite(t->src[i]))
            return sil_errorf(err, -EINVAL, "%s: element %lld is not finite", path, (long long)i);
    return 0;
}

int sil_mk_weights_from_dir(struct sil_mk_model *m, const char *dir, struct sil_error *err)
{
    char path[4096];
    for (int64_t i = 0; i < m->n_tensors; i++) {
        struct sil_mk_tensor *t = &m->tensors[i];
        snprintf(path, sizeof(path), "%s/%s.f32", dir, t->name);
        int rc = read_tensor(t, path, err);
        if (rc)
            return rc;
    }
    /* A file the shape does not use means the flags and the weights disagree (tied vs untied,
     * layer count, which layers are full attention). */
    DIR *d = opendir(dir);
    if (!d)
        return sil_errorf(err, -errno, "%s: %s", dir, strerror(errno));
    int rc = 0;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 5 || strcmp(e->d_name + len - 4, ".f32") != 0)
            continue;
        bool known = false;
        for (int64_t i = 0; i < m->n_tensors && !known; i++)
            known = strlen(m->tensors[i].name) == len - 4 &&
                    strncmp(m->tensors[i].name, e->d_name, len - 4) == 0;
        if (!known)
            rc = sil_errorf(err, -EINVAL, "%s/%s: no tensor of this shape has that name", dir,
                            e->d_name);
    }
    closedir(d);
    return rc;
}
