/* Expert slots: the host ranges experts are copied from and their pinning, pinned host blocks,
 * the staging ring, the copies of an expert into its slot, and the slot table of reads in place.
 * Contract in cuda_slots.h. */
#include "kernels/cuda/cuda_slots.h"
#include "kernels/clock.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/vec.h"

void sil_cuda_slots_init(struct sil_cuda_slots *s, struct sil_cuda *cu)
{
    s->cu = cu;
}

void sil_cuda_slots_layout(struct sil_cuda_slots *s, int32_t n, uint64_t gate, uint64_t up,
                           uint64_t down)
{
    s->n = n;
    s->slot_g = sil_cuda_slot_bytes(gate);
    s->slot_u = sil_cuda_slot_bytes(up);
    s->slot_d = sil_cuda_slot_bytes(down);
}

int sil_cuda_slots_open(struct sil_cuda_slots *s, int64_t n_keys, struct sil_error *err)
{
    const uint64_t slot_bytes = s->slot_g + s->slot_u + s->slot_d;
    s->stage_bytes = 64u << 20;
    if (s->stage_bytes < 2 * slot_bytes) s->stage_bytes = 2 * slot_bytes;
    int rc = sil_cuda_host_alloc(s->cu, s->stage_bytes, (void **)&s->stage, err);
    /* every expert in place until filled */
    const size_t nkeys = (size_t)n_keys;
    s->n_keys = n_keys;
    s->htab = malloc(sizeof(int32_t) * (nkeys ? nkeys : 1));
    s->slot_key = malloc(sizeof(int32_t) * (size_t)s->n);
    if (rc == 0 && (!s->htab || !s->slot_key))
        rc = sil_errorf(err, -ENOMEM, "cuda backend: out of memory");
    for (size_t i = 0; rc == 0 && i < nkeys; i++)
        s->htab[i] = -1;
    for (int64_t i = 0; rc == 0 && i < s->n; i++)
        s->slot_key[i] = -1;
    return rc;
}

int sil_cuda_slots_zero(struct sil_cuda_slots *s, struct sil_error *err)
{
    const uint64_t n = (uint64_t)s->n;
    int rc = sil_cuda_memset(s->cu, s->pool_g, 0, s->slot_g * n, NULL, err);
    if (rc == 0) rc = sil_cuda_memset(s->cu, s->pool_u, 0, s->slot_u * n, NULL, err);
    if (rc == 0) rc = sil_cuda_memset(s->cu, s->pool_d, 0, s->slot_d * n, NULL, err);
    return rc;
}

void sil_cuda_slots_free(struct sil_cuda_slots *s)
{
    sil_cuda_host_release(s->cu, s->stage);
    for (int i = 0; s->pinned && i < s->n_rng; i++)
        sil_cuda_host_unregister(s->cu, (void *)s->rng[i].lo);
    while (s->n_hblk > 0) /* the engine frees its host tier first; this is a safety net */
        sil_cuda_slots_host_free(s, (void *)s->hblk[0].lo);
    free(s->hblk);
    free(s->rng);
    free(s->rng_dev);
    free(s->htab);
    free(s->slot_key);
}

int sil_cuda_slots_add_range(struct sil_cuda_slots *s, const void *p, size_t bytes)
{
    if (sil_vec_reserve(&s->rng, &s->cap_rng, (size_t)s->n_rng + 1, 64) < 0) return -ENOMEM;
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)p;
    s->rng[s->n_rng++] =
        (struct sil_cuda_host_range){a & ~(pg - 1), (a + bytes + pg - 1) & ~(pg - 1)};
    return 0;
}

static int rng_cmp(const void *a, const void *b)
{
    const struct sil_cuda_host_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

uint64_t sil_cuda_slots_merge_ranges(struct sil_cuda_slots *s)
{
    qsort(s->rng, (size_t)s->n_rng, sizeof(*s->rng), rng_cmp);
    int n = 0;
    for (int i = 0; i < s->n_rng; i++) {
        if (n > 0 && s->rng[i].lo <= s->rng[n - 1].hi) {
            if (s->rng[i].hi > s->rng[n - 1].hi) s->rng[n - 1].hi = s->rng[i].hi;
        } else {
            s->rng[n++] = s->rng[i];
        }
    }
    s->n_rng = n;
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        total += s->rng[i].hi - s->rng[i].lo;
    return total;
}

/* Some kernels pin pages of a file mapping at a crawl (measured: 18 GiB not pinned in 120 s, and
 * 2 GB of it read in 60 s with the page cache dropped, all of it system time in minor faults,
 * while the first 64 MiB pinned at a rate that projected under a minute); elsewhere the same
 * 18 GiB pinned in 10-17 s. So the pins go in pieces, each judged on the rate so far. */
static int split_ranges(struct sil_cuda_slots *s)
{
    const uintptr_t piece = (uintptr_t)SIL_CUDA_PIN_PIECE_MIB << 20;
    size_t n = 0;
    for (int i = 0; i < s->n_rng; i++)
        n += (size_t)((s->rng[i].hi - s->rng[i].lo + piece - 1) / piece);
    if (n == (size_t)s->n_rng) return 0;
    struct sil_cuda_host_range *r = malloc(n * sizeof(*r));
    if (!r) return -ENOMEM;
    size_t k = 0;
    for (int i = 0; i < s->n_rng; i++)
        for (uintptr_t lo = s->rng[i].lo; lo < s->rng[i].hi; lo += piece)
            r[k++] = (struct sil_cuda_host_range){
                lo, s->rng[i].hi - lo > piece ? lo + piece : s->rng[i].hi};
    free(s->rng);
    s->rng = r;
    s->n_rng = (int)n;
    s->cap_rng = n;
    return 0;
}

int sil_cuda_slots_pin(struct sil_cuda_slots *s, uint64_t total, double max_s, double *took_s,
                       struct sil_error *err)
{
    const double t0 = sil_now_s();
    *took_s = 0;
    int rc = split_ranges(s);
    if (rc < 0) return sil_errorf(err, rc, "out of memory");
    int i = 0;
    uint64_t done = 0;
    for (; i < s->n_rng; i++) {
        rc = sil_cuda_host_register(s->cu, (void *)s->rng[i].lo, s->rng[i].hi - s->rng[i].lo, err);
        if (rc < 0) break;
        done += s->rng[i].hi - s->rng[i].lo;
        const double t = sil_now_s() - t0;
        if (max_s > 0 && done < total && (t > max_s || t * (double)total / (double)done > max_s)) {
            rc = sil_errorf(err, -ETIMEDOUT,
                            "%.2f of %.2f GiB pinned in %.1f s, all of it would take %.0f s, over "
                            "the %.0f s allowed (this kernel pins pages of a file mapping slowly)",
                            (double)done / (double)(1u << 30), (double)total / (double)(1u << 30),
                            t, t * (double)total / (double)done, max_s);
            i++;
            break;
        }
    }
    if (rc < 0) {
        while (i-- > 0)
            sil_cuda_host_unregister(s->cu, (void *)s->rng[i].lo);
        *took_s = sil_now_s() - t0;
        return rc;
    }
    s->pinned = true;
    s->pinned_bytes = total;
    /* misses no longer go through the staging ring: its pinned memory back */
    sil_cuda_host_release(s->cu, s->stage);
    s->stage = NULL;
    s->stage_bytes = 0;
    *took_s = sil_now_s() - t0;
    return 0;
}

int sil_cuda_slots_map_ranges(struct sil_cuda_slots *s)
{
    s->rng_dev = calloc((size_t)s->n_rng, sizeof(*s->rng_dev));
    int rc = s->rng_dev ? 0 : -ENOMEM;
    for (int i = 0; rc == 0 && i < s->n_rng; i++) {
        struct sil_error e = {0};
        if (sil_cuda_host_device_ptr(s->cu, (void *)s->rng[i].lo, &s->rng_dev[i], &e) < 0)
            rc = -EFAULT;
        /* pieces of one range (touching): a matrix may span them, so their device addresses
         * must run on as the host's do */
        else if (i > 0 && s->rng[i].lo == s->rng[i - 1].hi &&
                 s->rng_dev[i] - s->rng_dev[i - 1] != s->rng[i].lo - s->rng[i - 1].lo)
            rc = -EFAULT;
    }
    if (rc < 0) {
        free(s->rng_dev);
        s->rng_dev = NULL;
    }
    return rc;
}

sil_cuda_ptr sil_cuda_slots_host_dev(const struct sil_cuda_slots *s, const void *p)
{
    const uintptr_t a = (uintptr_t)p;
    for (int i = 0; s->rng_dev && i < s->n_rng; i++)
        if (a >= s->rng[i].lo && a < s->rng[i].hi) return s->rng_dev[i] + (a - s->rng[i].lo);
    return 0;
}

void sil_cuda_slots_measure_h2d(struct sil_cuda_slots *s)
{
    struct sil_cuda_event *ev[2] = {NULL, NULL};
    uint64_t bytes = s->slot_g * (uint64_t)s->n;
    if (bytes > (256u << 20)) bytes = 256u << 20;
    if (bytes > s->rng[0].hi - s->rng[0].lo) bytes = s->rng[0].hi - s->rng[0].lo;
    const void *src = s->pinned ? (const void *)s->rng[0].lo : (const void *)s->stage;
    if (!s->pinned && bytes > s->stage_bytes) bytes = s->stage_bytes;
    float ms = 0;
    if (sil_cuda_event_create(s->cu, &ev[0], NULL) == 0 &&
        sil_cuda_event_create(s->cu, &ev[1], NULL) == 0 &&
        sil_cuda_upload(s->cu, s->pool_g, src, (size_t)bytes, NULL, NULL) == 0 && /* warm */
        sil_cuda_event_record(s->cu, ev[0], NULL, NULL) == 0 &&
        sil_cuda_upload(s->cu, s->pool_g, src, (size_t)bytes, NULL, NULL) == 0 &&
        sil_cuda_event_record(s->cu, ev[1], NULL, NULL) == 0 &&
        sil_cuda_event_elapsed(s->cu, ev[0], ev[1], &ms, NULL) == 0 && ms > 0)
        s->h2d_gbs = (double)bytes / ((double)ms * 1e6);
    for (int i = 0; i < 2; i++)
        sil_cuda_event_destroy(s->cu, ev[i]);
}

/* Whether the bytes of [p, p + n) lie in one block host_alloc handed out (pinned). */
static bool in_hblk(const struct sil_cuda_slots *s, const void *p, size_t n)
{
    const uintptr_t lo = (uintptr_t)p;
    for (int i = 0; i < s->n_hblk; i++)
        if (lo >= s->hblk[i].lo && lo + n <= s->hblk[i].hi) return true;
    return false;
}

void *sil_cuda_slots_host_alloc(struct sil_cuda_slots *s, size_t bytes)
{
    if (sil_vec_reserve(&s->hblk, &s->cap_hblk, (size_t)s->n_hblk + 1, 16) < 0) return NULL;
    void *p = NULL;
    if (sil_cuda_host_alloc(s->cu, bytes, &p, NULL) < 0) return NULL;
    s->hblk[s->n_hblk++] = (struct sil_cuda_host_range){(uintptr_t)p, (uintptr_t)p + bytes};
    s->pinned_bytes += bytes;
    return p;
}

bool sil_cuda_slots_host_free(struct sil_cuda_slots *s, void *p)
{
    for (int i = 0; p && i < s->n_hblk; i++) {
        if (s->hblk[i].lo != (uintptr_t)p) continue;
        s->pinned_bytes -= s->hblk[i].hi - s->hblk[i].lo;
        s->hblk[i] = s->hblk[--s->n_hblk];
        sil_cuda_host_release(s->cu, p);
        return true;
    }
    return false;
}

/* One matrix into its slot through the staging ring, or one DMA where it is pinned: the ring is
 * reused from its start once the copies queued from it are done (a sync when it is full). rc is
 * the error of the matrices before (0: none), which stays the one returned. */
static int stage_copy(struct sil_cuda_slots *s, sil_cuda_ptr dst, const struct sil_cuda_slot_src *m,
                      uint64_t cap, int rc, struct sil_error *err)
{
    const size_t bytes = m->bytes;
    const bool direct = m->host_tier ? in_hblk(s, m->data, bytes) : s->pinned;
    if (bytes > cap || (!direct && bytes > s->stage_bytes))
        return rc ? rc
                  : sil_errorf(err, -EINVAL,
                               "cuda backend: an expert matrix is larger than its "
                               "slot");
    if (!direct && s->stage_used + bytes > s->stage_bytes) {
        const int r = sil_cuda_sync(s->cu, NULL, err);
        if (rc || r < 0) return rc ? rc : r;
        s->stage_used = 0;
    }
    if (s->h2d_cap > 0) {
        const double now = sil_now_s();
        const double start = s->h2d_next > now ? s->h2d_next : now;
        if (start > now) {
            const double d = start - now;
            struct timespec w8 = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
            nanosleep(&w8, NULL);
        }
        s->h2d_next = start + (double)bytes / s->h2d_cap;
    }
    int r;
    if (direct) {
        /* straight from pinned memory (the mapping, or a host-tier block): one DMA */
        r = sil_cuda_upload(s->cu, dst, m->data, bytes, NULL, err);
    } else {
        memcpy(s->stage + s->stage_used, m->data, bytes);
        r = sil_cuda_upload(s->cu, dst, s->stage + s->stage_used, bytes, NULL, err);
        s->stage_used += (bytes + 255) & ~(size_t)255;
    }
    atomic_fetch_add_explicit(&s->bytes_in, bytes, memory_order_relaxed);
    return rc ? rc : r;
}

int sil_cuda_slots_fill(struct sil_cuda_slots *s, int32_t slot, const struct sil_cuda_slot_src m[3],
                        struct sil_error *err)
{
    const uint64_t i = (uint64_t)slot;
    int rc = stage_copy(s, s->pool_g + i * s->slot_g, &m[0], s->slot_g, 0, err);
    rc = stage_copy(s, s->pool_u + i * s->slot_u, &m[1], s->slot_u, rc, err);
    rc = stage_copy(s, s->pool_d + i * s->slot_d, &m[2], s->slot_d, rc, err);
    atomic_fetch_add_explicit(&s->fills, 1, memory_order_relaxed);
    return rc;
}

void sil_cuda_slots_table_set(struct sil_cuda_slots *s, int32_t slot, int64_t key)
{
    const int32_t old = s->slot_key[slot];
    if (old >= 0) s->htab[old] = -1;
    s->slot_key[slot] = -1;
    if (key >= 0 && key < s->n_keys) {
        if (s->htab[key] >= 0) s->slot_key[s->htab[key]] = -1;
        s->htab[key] = slot;
        s->slot_key[slot] = (int32_t)key;
    }
    s->dirty = true;
}

int sil_cuda_slots_table_upload(struct sil_cuda_slots *s, struct sil_error *err)
{
    return sil_cuda_upload(s->cu, s->tab, s->htab, sizeof(int32_t) * (size_t)s->n_keys, NULL, err);
}
