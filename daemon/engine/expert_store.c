/* The routed experts' host tiers (expert_store.h has the contract).
 *
 * A slot holds three read windows, one per matrix (gate, up, down), each as wide as the widest
 * such matrix over the layers rounded up to the alignment, plus one alignment unit: a matrix
 * at any file offset is read from the aligned offset below it to the aligned end above it, and
 * its bytes start (offset mod alignment) into the window. Reads are handed to the reader threads
 * as one batch per acquire; the caller reads from the same batch and waits until it is done. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/engine/expert_cache.h"
#include "daemon/engine/expert_store.h"

#define ALIGN 4096u
#define BLOCK_MAX (256u << 20)

struct rd_req {
    uint64_t off;  /* aligned file offset */
    size_t len;    /* aligned length (may reach past the end of the file) */
    size_t need;   /* bytes from off that must arrive */
    char *dst;     /* aligned */
};

struct sil_xstore {
    struct sil_xstore_config c;
    struct sil_xstore_mat *mat; /* [n_layer * 3] */
    int fd;
    bool direct;
    uint64_t win[3]; /* window bytes of each matrix within a slot */
    uint64_t slot_bytes;
    char **block;
    int32_t n_block, per_block;
    struct sil_ecache *pol;
    struct sil_ecache_entry *res; /* [n_expert] */

    pthread_mutex_t mu;
    pthread_cond_t work, done;
    struct rd_req *q; /* [n_expert * 3] one batch */
    int32_t q_fill; /* requests queued by the caller, not yet handed over (its thread only) */
    int32_t q_n, q_next, q_pending; /* the batch the readers see (mu) */
    int q_err; /* first error of the batch (-errno, -EIO for a short read) */
    uint64_t q_err_off;
    bool stop;
    pthread_t *th;
    int n_th;

    int sticky; /* a read failed: every later acquire fails */
    char sticky_msg[200];

    _Atomic uint64_t hits, misses, bytes_read, reads, wait_ns;
};

static uint64_t align_up(uint64_t x)
{
    return (x + ALIGN - 1) & ~(uint64_t)(ALIGN - 1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void windows(const struct sil_xstore_config *c, uint64_t win[3])
{
    for (int i = 0; i < 3; i++) {
        uint64_t w = 0;
        for (int32_t l = 0; l < c->n_layer; l++)
            if (c->mat[l * 3 + i].bytes > w) w = c->mat[l * 3 + i].bytes;
        win[i] = w ? align_up(w) + ALIGN : 0;
    }
}

uint64_t sil_xstore_slot_bytes(const struct sil_xstore_config *c)
{
    uint64_t win[3];
    windows(c, win);
    return win[0] + win[1] + win[2];
}

int32_t sil_xstore_min_slots(const struct sil_xstore_config *c)
{
    return c->n_expert;
}

/* ---- reads -------------------------------------------------------------------------------- */

/* One request: 0, -errno, or -EIO when the file ended before need bytes arrived. */
static int read_one(struct sil_xstore *s, const struct rd_req *r)
{
    size_t got = 0;
    while (got < r->need) {
        const ssize_t n = pread(s->fd, r->dst + got, r->len - got, (off_t)(r->off + got));
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return -errno;
        atomic_fetch_add_explicit(&s->reads, 1, memory_order_relaxed);
        if (n == 0) return -EIO;
        got += (size_t)n;
        atomic_fetch_add_explicit(&s->bytes_read, (uint64_t)n, memory_order_relaxed);
    }
    if (!s->direct) posix_fadvise(s->fd, (off_t)r->off, (off_t)r->len, POSIX_FADV_DONTNEED);
    return 0;
}

/* Takes and runs requests of the current batch until none is left; mu held on entry and exit. */
static void drain(struct sil_xstore *s)
{
    while (s->q_next < s->q_n) {
        const int32_t i = s->q_next++;
        pthread_mutex_unlock(&s->mu);
        const int rc = read_one(s, &s->q[i]);
        pthread_mutex_lock(&s->mu);
        if (rc < 0 && s->q_err == 0) {
            s->q_err = rc;
            s->q_err_off = s->q[i].off;
        }
        if (--s->q_pending == 0) pthread_cond_broadcast(&s->done);
    }
}

static void *reader(void *arg)
{
    struct sil_xstore *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        if (s->q_next < s->q_n)
            drain(s);
        else
            pthread_cond_wait(&s->work, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Runs the q_fill requests queued in s->q on the readers and this thread (handed over under
 * the lock: a reader woken early never sees a batch being filled); 0 or the sticky error. */
static int run_batch(struct sil_xstore *s, struct sil_error *err)
{
    if (s->q_fill == 0) return 0;
    const uint64_t t0 = now_ns();
    pthread_mutex_lock(&s->mu);
    s->q_n = s->q_fill;
    s->q_next = 0;
    s->q_pending = s->q_n;
    s->q_err = 0;
    pthread_cond_broadcast(&s->work);
    drain(s);
    while (s->q_pending > 0)
        pthread_cond_wait(&s->done, &s->mu);
    const int rc = s->q_err;
    const uint64_t off = s->q_err_off;
    s->q_n = 0;
    s->q_next = 0;
    s->q_fill = 0;
    pthread_mutex_unlock(&s->mu);
    atomic_fetch_add_explicit(&s->wait_ns, now_ns() - t0, memory_order_relaxed);
    if (rc == 0) return 0;
    s->sticky = -EIO;
    if (rc == -EIO)
        snprintf(s->sticky_msg, sizeof s->sticky_msg,
                 "%s: the file ended before an expert read at offset %llu (it was truncated "
                 "while in use)",
                 s->c.path, (unsigned long long)off);
    else
        snprintf(s->sticky_msg, sizeof s->sticky_msg, "%s: an expert read at offset %llu: %s",
                 s->c.path, (unsigned long long)off, strerror(-rc));
    return sil_errorf(err, -EIO, "%s", s->sticky_msg);
}

static char *slot_base(const struct sil_xstore *s, int32_t slot)
{
    return s->block[slot / s->per_block] + (uint64_t)(slot % s->per_block) * s->slot_bytes;
}

/* Where matrix i of (layer, expert) lies in its slot, and the read that brings it there. */
static const char *place(const struct sil_xstore *s, int32_t slot, int32_t layer, int32_t expert,
                         int i, struct rd_req *r)
{
    const struct sil_xstore_mat *m = &s->mat[layer * 3 + i];
    const uint64_t lo = m->off + (uint64_t)expert * m->bytes, a = lo & ~(uint64_t)(ALIGN - 1);
    uint64_t w = 0;
    for (int j = 0; j < i; j++)
        w += s->win[j];
    char *dst = slot_base(s, slot) + w;
    if (r) *r = (struct rd_req){a, (size_t)(align_up(lo + m->bytes) - a), (size_t)(lo + m->bytes - a), dst};
    return dst + (lo - a);
}

static void queue_reads(struct sil_xstore *s, int32_t slot, int32_t layer, int32_t expert)
{
    for (int i = 0; i < 3; i++)
        if (s->mat[layer * 3 + i].bytes) place(s, slot, layer, expert, i, &s->q[s->q_fill++]);
}

/* ---- public ------------------------------------------------------------------------------- */

static int check_config(const struct sil_xstore_config *c, struct sil_error *err)
{
    if (!c->path || !c->mat || c->n_layer < 1 || c->n_layer > 4096 || c->n_expert < 1 ||
        c->n_expert > 4096)
        return sil_errorf(err, -EINVAL, "expert store: bad shape (%d layers, %d experts)",
                          c->n_layer, c->n_expert);
    bool any = false;
    for (int32_t k = 0; k < c->n_layer * 3; k++) {
        const struct sil_xstore_mat *m = &c->mat[k];
        if (m->bytes == 0) continue;
        any = true;
        const uint64_t span = m->bytes * (uint64_t)c->n_expert;
        if (m->bytes > (1ull << 34) || span / (uint64_t)c->n_expert != m->bytes ||
            m->off > c->file_bytes || span > c->file_bytes - m->off)
            return sil_errorf(err, -EINVAL,
                              "expert store: layer %d's experts [%llu, +%llu x %d) are outside "
                              "the file (%llu bytes)",
                              k / 3, (unsigned long long)m->off, (unsigned long long)m->bytes,
                              c->n_expert, (unsigned long long)c->file_bytes);
    }
    if (!any) return sil_errorf(err, -EINVAL, "expert store: the model has no routed experts");
    const int32_t min = sil_xstore_min_slots(c);
    if (c->n_slot < min)
        return sil_errorf(err, -EINVAL,
                          "host budget too small for the routed experts' host tier: it needs at "
                          "least %d slots of %llu bytes (%.1f MiB, one layer's every expert), "
                          "%d given",
                          min, (unsigned long long)sil_xstore_slot_bytes(c),
                          (double)min * (double)sil_xstore_slot_bytes(c) / (1 << 20), c->n_slot);
    return 0;
}

/* Opens path for direct reads when the file system takes them (checked with one read). */
static int open_file(struct sil_xstore *s, struct sil_error *err)
{
    const struct sil_xstore_config *c = &s->c;
    s->fd = -1;
    int fd = c->buffered ? -1 : open(c->path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    s->direct = fd >= 0;
    if (fd < 0) fd = open(c->path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return sil_errorf(err, -errno, "%s: %s", c->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) < 0 || (uint64_t)st.st_dev != c->dev || (uint64_t)st.st_ino != c->ino ||
        (uint64_t)st.st_size < c->file_bytes) {
        close(fd);
        return sil_errorf(err, -ESTALE, "%s: not the file the model was loaded from any more",
                          c->path);
    }
    if (s->direct) {
        void *probe = NULL;
        if (posix_memalign(&probe, ALIGN, ALIGN) != 0) {
            close(fd);
            return sil_errorf(err, -ENOMEM, "expert store: out of memory");
        }
        const ssize_t n = pread(fd, probe, ALIGN, 0);
        free(probe);
        if (n < 0) { /* the file system takes O_DIRECT at open but not the read */
            close(fd);
            fd = open(c->path, O_RDONLY | O_CLOEXEC);
            s->direct = false;
            if (fd < 0) return sil_errorf(err, -errno, "%s: %s", c->path, strerror(errno));
        }
    }
    s->fd = fd;
    return 0;
}

int sil_xstore_create(struct sil_xstore **out, const struct sil_xstore_config *c,
                      struct sil_error *err)
{
    *out = NULL;
    int rc = check_config(c, err);
    if (rc < 0) return rc;
    struct sil_xstore *s = calloc(1, sizeof(*s));
    if (!s) return sil_errorf(err, -ENOMEM, "expert store: out of memory");
    s->c = *c;
    s->fd = -1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->done, NULL);
    const size_t nm = (size_t)c->n_layer * 3;
    s->mat = malloc(nm * sizeof(*s->mat));
    s->res = calloc((size_t)c->n_expert, sizeof(*s->res));
    s->q = calloc((size_t)c->n_expert * 3, sizeof(*s->q));
    if (!s->mat || !s->res || !s->q) {
        sil_xstore_free(s);
        return sil_errorf(err, -ENOMEM, "expert store: out of memory");
    }
    memcpy(s->mat, c->mat, nm * sizeof(*s->mat));
    s->c.mat = s->mat;
    windows(&s->c, s->win);
    s->slot_bytes = s->win[0] + s->win[1] + s->win[2];
    if ((rc = open_file(s, err)) < 0) {
        sil_xstore_free(s);
        return rc;
    }
    const struct sil_ecache_config pc = {
        .n_layer = c->n_layer,
        .n_expert = c->n_expert,
        .n_slot = c->n_slot,
        .policy = SIL_ECACHE_LFU,
        .pools = SIL_ECACHE_GLOBAL,
        .expert_bytes = s->slot_bytes,
    };
    if ((rc = sil_ecache_create(&s->pol, &pc, err)) < 0) {
        sil_xstore_free(s);
        return rc;
    }
    s->per_block = s->slot_bytes >= BLOCK_MAX ? 1 : (int32_t)(BLOCK_MAX / s->slot_bytes);
    s->n_block = (c->n_slot + s->per_block - 1) / s->per_block;
    s->block = calloc((size_t)s->n_block, sizeof(*s->block));
    for (int32_t b = 0; s->block && b < s->n_block; b++) {
        const int32_t n = b + 1 < s->n_block ? s->per_block : c->n_slot - b * s->per_block;
        const size_t bytes = (size_t)n * s->slot_bytes;
        void *p = NULL;
        if (c->alloc)
            p = c->alloc(c->alloc_user, bytes);
        else if (posix_memalign(&p, ALIGN, bytes) != 0)
            p = NULL;
        if (!p) {
            rc = sil_errorf(err, -ENOMEM,
                            "expert store: out of host memory for %d slots of %llu bytes "
                            "(%.2f GiB)",
                            c->n_slot, (unsigned long long)s->slot_bytes,
                            (double)c->n_slot * (double)s->slot_bytes / (double)(1u << 30));
            sil_xstore_free(s);
            return rc;
        }
        s->block[b] = p;
    }
    if (!s->block) {
        sil_xstore_free(s);
        return sil_errorf(err, -ENOMEM, "expert store: out of memory");
    }
    const int n_th = c->n_readers > 0 ? (c->n_readers < 64 ? c->n_readers : 64) : 7;
    s->th = calloc((size_t)n_th, sizeof(*s->th));
    for (int i = 0; s->th && i < n_th; i++) {
        if (pthread_create(&s->th[i], NULL, reader, s) != 0) break;
        s->n_th++;
    }
    if (!s->th || s->n_th == 0) {
        sil_xstore_free(s);
        return sil_errorf(err, -ENOMEM, "expert store: cannot start its reader threads");
    }
    *out = s;
    return 0;
}

void sil_xstore_free(struct sil_xstore *s)
{
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->n_th; i++)
        pthread_join(s->th[i], NULL);
    free(s->th);
    for (int32_t b = 0; s->block && b < s->n_block; b++) {
        if (!s->block[b]) continue;
        if (s->c.alloc)
            s->c.release(s->c.alloc_user, s->block[b]);
        else
            free(s->block[b]);
    }
    free(s->block);
    if (s->fd >= 0) close(s->fd);
    sil_ecache_free(s->pol);
    free(s->mat);
    free(s->res);
    free(s->q);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
    free(s);
}

int sil_xstore_acquire(struct sil_xstore *s, int32_t layer, const int32_t *experts,
                       const int32_t *uses, int32_t n, const void **ptr, struct sil_error *err)
{
    if (s->sticky) return sil_errorf(err, s->sticky, "%s", s->sticky_msg);
    if (layer < 0 || layer >= s->c.n_layer || n < 0 || n > s->c.n_expert || n > s->c.n_slot ||
        s->mat[layer * 3].bytes == 0)
        return sil_errorf(err, -EINVAL, "expert store: %d experts of layer %d", n, layer);
    const int rc = sil_ecache_lookup(s->pol, layer, experts, uses, n, s->res);
    if (rc != 0) /* out of range, or (n <= n_slot) never: the plan did not fit */
        return sil_errorf(err, -EINVAL, "expert store: layer %d's plan of %d experts", layer, n);
    s->q_fill = 0;
    uint64_t hits = 0, misses = 0;
    for (int32_t i = 0; i < n; i++) {
        const struct sil_ecache_entry *r = &s->res[i];
        if (r->kind == SIL_ECACHE_FILL) {
            queue_reads(s, r->slot, layer, experts[i]);
            misses++;
        } else {
            hits++;
        }
        for (int m = 0; m < 3; m++)
            ptr[3 * i + m] = place(s, r->slot, layer, experts[i], m, NULL);
    }
    atomic_fetch_add_explicit(&s->hits, hits, memory_order_relaxed);
    atomic_fetch_add_explicit(&s->misses, misses, memory_order_relaxed);
    return run_batch(s, err);
}

int64_t sil_xstore_preload(struct sil_xstore *s, const int32_t *keys, int64_t n,
                           struct sil_error *err)
{
    if (s->sticky) return sil_errorf(err, s->sticky, "%s", s->sticky_msg);
    const int32_t X = s->c.n_expert;
    int64_t placed = 0;
    s->q_fill = 0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t l = keys[i] / X, x = keys[i] % X;
        if (keys[i] < 0 || l >= s->c.n_layer || s->mat[l * 3].bytes == 0) continue;
        const int32_t slot = sil_ecache_preload(s->pol, l, x);
        if (slot == -ENOSPC) break;
        if (slot < 0) continue;
        queue_reads(s, slot, l, x);
        placed++;
        /* a batch holds one layer's worth of reads */
        if (s->q_fill + 3 > X * 3) {
            const int rc = run_batch(s, err);
            if (rc < 0) return rc;
        }
    }
    atomic_fetch_add_explicit(&s->misses, (uint64_t)placed, memory_order_relaxed);
    const int rc = run_batch(s, err);
    return rc < 0 ? rc : placed;
}

void sil_xstore_demote(struct sil_xstore *s, int32_t layer, int32_t expert)
{
    sil_ecache_demote(s->pol, layer, expert);
}

void sil_xstore_heat_import(struct sil_xstore *s, const float *heat)
{
    sil_ecache_heat_import(s->pol, heat);
}

void sil_xstore_stats(const struct sil_xstore *s, struct sil_xstore_stats *out)
{
    struct sil_xstore *m = (struct sil_xstore *)s; /* atomics are read, never changed */
    *out = (struct sil_xstore_stats){
        .n_slot = s->c.n_slot,
        .slot_bytes = s->slot_bytes,
        .hits = atomic_load_explicit(&m->hits, memory_order_relaxed),
        .misses = atomic_load_explicit(&m->misses, memory_order_relaxed),
        .bytes_read = atomic_load_explicit(&m->bytes_read, memory_order_relaxed),
        .reads = atomic_load_explicit(&m->reads, memory_order_relaxed),
        .wait_s = (double)atomic_load_explicit(&m->wait_ns, memory_order_relaxed) * 1e-9,
        .io = s->direct ? "direct" : "buffered",
    };
}
