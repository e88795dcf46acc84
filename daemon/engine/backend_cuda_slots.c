/* The CUDA backend's weights off the device: placement (the backbone uploaded, routed experts
 * left in the mapping when they go to slots), pinning the experts' pages (or a staging ring
 * when that is refused), the copies of an expert into its slot, pinned host blocks for the
 * engine's host tier, the slot table of reads in place (cuda_zero_copy), and the share of each
 * decode layer's misses the host computes, from the speeds measured at start. */
#ifdef SIL_HAVE_CUDA

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "daemon/engine/backend_cuda_impl.h"
#include "daemon/engine/hostmem.h"
#include "kernels/vec.h"

/* The device address of p in the pinned mapping, 0 when it is not there. */
sil_cuda_ptr sil_cb_host_dev(const struct cuda_backend *b, const void *p)
{
    const uintptr_t a = (uintptr_t)p;
    for (int i = 0; b->rng_dev && i < b->n_rng; i++)
        if (a >= b->rng[i].lo && a < b->rng[i].hi) return b->rng_dev[i] + (a - b->rng[i].lo);
    return 0;
}


/* Private read-only file mappings only: dropping their pages loses nothing (they are read
 * back from the file if touched again). The model is mapped that way (model.c). */
static void release_pages(const void *p, size_t bytes)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + pg - 1) & ~(pg - 1), hi = ((uintptr_t)p + bytes) & ~(pg - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

int sil_cb_place(struct sil_backend *be, struct sil_weight *w, bool release_host,
                 struct sil_error *err)
{
    struct cuda_backend *b = cb(be);
    if (!w->data || w->loc == SIL_WEIGHT_DEVICE) return 0;
    /* with expert slots the routed stacks stay in the mmap, copied in per expert on a miss */
    if (b->n_slots > 0 && w->n_mat > 1 && w->n_mat == b->c.n_expert) {
        if (!quantized(w->type)) b->float_experts = true; /* no host path (c) for them */
        if (w->rows == b->c.n_ff_exp && w->cols == b->c.n_embd && b->n_probe_fe < 2)
            b->probe[b->n_probe_fe++] = *w;
        else if (w->rows == b->c.n_embd && w->cols == b->c.n_ff_exp && b->n_probe_ef < 1)
            b->probe[2 + b->n_probe_ef++] = *w;
        if (sil_vec_reserve(&b->rng, &b->cap_rng, (size_t)b->n_rng + 1, 64) < 0)
            return sil_errorf(err, -ENOMEM, "cuda backend: out of memory");
        const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), p = (uintptr_t)w->data;
        b->rng[b->n_rng++] = (struct host_range){
            p & ~(pg - 1), (p + w->mat_bytes * (size_t)w->n_mat + pg - 1) & ~(pg - 1)};
        return 0;
    }
    const size_t bytes = w->mat_bytes * (size_t)w->n_mat;
    if (w->rows > 1 && !sil_cuda_type_supported(w->type))
        return sil_errorf(err, -ENOTSUP, "cuda backend: weight type %s has no CUDA kernel",
                          sil_type_name(w->type));
    sil_cuda_ptr d = 0;
    int rc = sil_cb_dalloc(b, bytes, &d, err);
    if (rc == 0) rc = sil_cuda_upload(b->cu, d, w->data, bytes, NULL, err);
    if (rc == 0) rc = sil_cuda_sync(b->cu, NULL, err);
    if (rc < 0) return rc;
    if (release_host && w->loc == SIL_WEIGHT_MMAP) release_pages(w->data, bytes);
    b->weight_bytes += bytes;
    w->loc = SIL_WEIGHT_DEVICE;
    w->data = (const void *)(uintptr_t)d;
    return 0;
}

static int rng_cmp(const void *a, const void *b)
{
    const struct host_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Pins the routed stacks' pages (merged where they share or touch a page) so a miss is one DMA
 * from the mapping. Not an error when the system refuses (memory locked limits, a driver
 * without read-only registration): misses are then staged, with one line saying so. Then the
 * host-to-device bandwidth from that memory is measured once, into the first slots. */
/* Path (b) once the experts are pinned, when asked for (cuda_zero_copy) and possible:
 * the fused kernels must run every layer's experts, and the benchmark cap on copies cannot
 * govern reads the kernels make. */
static void zc_enable(struct cuda_backend *b)
{
    if (!b->c.opt.zero_copy || !b->zc_htab) return;
    /* with a host share (a count of CPU misses) it gave non-finite MoE outputs on the GPU
     * (cuda_fwd_parity check 15): refused until that is understood */
    const char *why = b->float_experts ? "float experts have no fused kernel"
                      : b->h2d_cap > 0  ? "SIL_BENCH_H2D_GBS caps copies, not reads in place"
                      : b->hx ? "not combined with a count of CPU misses (SIL_CUDA_CPU_MISSES)"
                              : NULL;
    b->rng_dev = why ? NULL : calloc((size_t)b->n_rng, sizeof(*b->rng_dev));
    if (!why && !b->rng_dev) why = "out of memory";
    for (int i = 0; !why && i < b->n_rng; i++) {
        struct sil_error e = {0};
        if (sil_cuda_host_device_ptr(b->cu, (void *)b->rng[i].lo, &b->rng_dev[i], &e) < 0)
            why = "the pinned mapping has no device address";
    }
    if (why) {
        free(b->rng_dev);
        b->rng_dev = NULL;
        fprintf(stderr, "siliceo: cuda backend: cuda_zero_copy ignored: %s\n", why);
        return;
    }
    b->zc = true;
    b->zc_dirty = true;
    fprintf(stderr, "siliceo: cuda backend: decode reads expert misses in place from host "
                    "memory (cuda_zero_copy)\n");
}

/* Path (c) by itself: the host computes its experts while the device copies the others in, so
 * a layer's misses split in proportion to the two speeds, host / (host + link), are done at
 * about the same time. The host's speed is measured on the n experts g[i], u[i], d[i] in host
 * memory where misses come from (the mapping, or the host tier's slots): one set of K warms the
 * threads, then each other set of K is run once, as a miss is read once (from memory, not from
 * the CPU's caches), and the median counts; the link's is the copy bandwidth measured at open
 * (or the benchmark cap). A share under 5% is not worth the segment cut: the host path is off
 * (cpu_misses 0) until measured again. n == 0: off. */
#define HOST_PROBE_SETS 5
static void choose_host_share(struct cuda_backend *b, const struct sil_weight *g,
                              const struct sil_weight *u, const struct sil_weight *d, int n,
                              const char *where)
{
    const int K = (int)b->c.n_expert_used;
    double host_gbs = 0.0;
    const int sets = K > 0 ? (n / K < HOST_PROBE_SETS ? n / K : HOST_PROBE_SETS) : 0;
    if (b->hx && !b->float_experts && sets >= 2 && b->h2d_gbs > 0 &&
        sil_cb_fused_types(g, u, d, K)) {
        double dt[HOST_PROBE_SETS];
        int nt = 0;
        uint64_t bytes = 0;
        memset(b->h_x, 0, sizeof(float) * (size_t)b->c.n_embd);
        struct sil_error e = {0};
        for (int s = 0; s < sets; s++) {
            uint64_t sb = 0;
            for (int j = 0; j < K; j++) {
                const int x = s * K + j;
                sb += g[x].mat_bytes + u[x].mat_bytes + d[x].mat_bytes;
                b->jobs[j] = (struct sil_host_expert_job){0, 1.0f, &g[x], &u[x], &d[x]};
            }
            const double t0 = now_s();
            if (sil_host_experts_run(b->hx, b->h_x, 1, b->jobs, K, b->h_y, &e) < 0) {
                nt = 0;
                break;
            }
            const double t = now_s() - t0;
            if (s > 0 && t > 0) {
                dt[nt++] = t;
                bytes = sb; /* the sets are of one layer: the same bytes */
            }
        }
        if (nt > 0) {
            for (int a = 1; a < nt; a++) /* the median of a handful */
                for (int c = a; c > 0 && dt[c] < dt[c - 1]; c--) {
                    const double t = dt[c];
                    dt[c] = dt[c - 1];
                    dt[c - 1] = t;
                }
            host_gbs = (double)bytes / dt[nt / 2] / 1e9;
        }
    }
    b->host_gbs = host_gbs;
    const double link = b->h2d_cap > 0 && b->h2d_cap / 1e9 < b->h2d_gbs ? b->h2d_cap / 1e9
                                                                          : b->h2d_gbs;
    double share = host_gbs > 0 && link > 0 ? host_gbs / (host_gbs + link) : 0.0;
    /* cuda_cpu_share = F (0 < F <= 1) in place of the measured ratio */
    const double forced = b->c.opt.cpu_share;
    const bool force = forced > 0 && forced <= 1;
    if (force && n > 0) share = forced;
    if (share < 0.05) {
        b->host_share = 0.0;
        b->cpu_misses = 0;
        if (n > 0)
            fprintf(stderr,
                    "siliceo: cuda backend: decode misses all copied (host experts %.1f GB/s from "
                    "%s, link %.1f GB/s)\n",
                    host_gbs, where, link);
        else
            fprintf(stderr, "siliceo: cuda backend: decode misses all copied (%s)\n", where);
        return;
    }
    b->host_share = share;
    b->cpu_misses = b->cpu_misses_max;
    fprintf(stderr,
            "siliceo: cuda backend: host experts %.1f GB/s from %s, link %.1f GB/s: %.0f%% of each "
            "decode layer's misses computed on the CPU%s (cuda_cpu_share = off turns it off)\n",
            host_gbs, where, link, 100.0 * share, force ? ", set by cuda_cpu_share" : "");
}

/* The probe layer's first experts in the mapping, for choose_host_share. */
static void choose_host_share_mapped(struct cuda_backend *b)
{
    const int K = (int)b->c.n_expert_used, X = (int)b->c.n_expert;
    struct sil_weight m[3][HOST_PROBE_SETS * SIL_CUDA_MOE_SLOTS_MAX];
    int n = 0;
    if (b->n_probe_fe == 2 && b->n_probe_ef == 1 && K > 0) {
        n = HOST_PROBE_SETS * K < X ? HOST_PROBE_SETS * K : X / K * K;
        if (n > HOST_PROBE_SETS * SIL_CUDA_MOE_SLOTS_MAX) n = 0;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < 3; i++)
                m[i][j] = sil_weight_mat(&b->probe[i], j);
    }
    choose_host_share(b, m[0], m[1], m[2], n, "the mapping");
}

/* Pinning the mapping's pages, a probe: the first PIN_PROBE_MIB of the experts pinned and
 * unpinned again; false when pinning all of them (total bytes) at that rate would
 * take over PIN_MAX_S. Some kernels pin pages of a file mapping at a crawl (measured: 18 GiB not
 * pinned in 120 s, all of it system time in minor faults, the file in the page cache), which
 * would hold the start up for minutes; elsewhere the same 18 GiB pinned in 10-17 s. */
#define PIN_PROBE_MIB 64
#define PIN_MAX_S 60.0
static bool pin_probe(struct cuda_backend *b, uint64_t total, double *projected)
{
    const uintptr_t lo = b->rng[0].lo;
    uint64_t bytes = b->rng[0].hi - lo;
    if (bytes > (uint64_t)PIN_PROBE_MIB << 20) bytes = (uint64_t)PIN_PROBE_MIB << 20;
    const double t0 = now_s();
    struct sil_error e = {0};
    *projected = 0;
    if (sil_cuda_host_register(b->cu, (void *)lo, bytes, &e) < 0) return true; /* said below */
    const double took = now_s() - t0;
    sil_cuda_host_unregister(b->cu, (void *)lo);
    *projected = bytes ? took * (double)total / (double)bytes : 0;
    return *projected <= PIN_MAX_S;
}

int sil_cb_placed(struct sil_backend *be, struct sil_error *err)
{
    struct cuda_backend *b = cb(be);
    (void)err;
    if (b->n_slots <= 0 || b->n_rng == 0) return 0;
    qsort(b->rng, (size_t)b->n_rng, sizeof(*b->rng), rng_cmp);
    int n = 0;
    for (int i = 0; i < b->n_rng; i++) {
        if (n > 0 && b->rng[i].lo <= b->rng[n - 1].hi) {
            if (b->rng[i].hi > b->rng[n - 1].hi) b->rng[n - 1].hi = b->rng[i].hi;
        } else {
            b->rng[n++] = b->rng[i];
        }
    }
    b->n_rng = n;
    const enum sil_cuda_pin pin = b->c.opt.pin;
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        total += b->rng[i].hi - b->rng[i].lo;
    /* pinned pages cannot be reclaimed: never more than 3/4 of what the host has available;
     * with a host tier the engine reads misses into its own pinned slots, never the mapping */
    struct sil_host_spare spare; /* MemAvailable held to the cgroup's room */
    sil_host_spare(NULL, &spare);
    const uint64_t avail = spare.bytes == UINT64_MAX ? 0 : spare.bytes;
    const bool fits = !b->c.host_tier && (avail == 0 || total <= avail / 4 * 3);
    if (!fits && !b->c.host_tier && pin != SIL_CUDA_PIN_OFF)
        fprintf(stderr,
                "siliceo: cuda backend: the routed experts (%.2f GiB) are not pinned: the host "
                "has %.2f GiB available; misses are staged through a pinned buffer\n",
                (double)total / (double)(1u << 30), (double)avail / (double)(1u << 30));
    bool want_pin = fits && pin != SIL_CUDA_PIN_OFF;
    double projected = 0;
    /* cuda_pin = on: pinned however slowly (the probe not asked) */
    if (want_pin && pin == SIL_CUDA_PIN_AUTO && !pin_probe(b, total, &projected)) {
        want_pin = false;
        fprintf(stderr,
                "siliceo: cuda backend: the routed experts (%.2f GiB) are not pinned: at the rate "
                "their first %d MiB pinned, all of them would take %.0f s (this kernel pins pages "
                "of a file mapping slowly); misses are staged through a pinned buffer\n",
                (double)total / (double)(1u << 30), PIN_PROBE_MIB, projected);
    }
    if (want_pin) {
        const double t0 = now_s();
        struct sil_error e = {0};
        int i = 0;
        for (; i < n; i++)
            if (sil_cuda_host_register(b->cu, (void *)b->rng[i].lo, b->rng[i].hi - b->rng[i].lo,
                                       &e) < 0)
                break;
        if (i == n) {
            b->pinned = true;
            b->pinned_bytes = total;
            /* misses no longer go through the staging ring: its pinned memory back */
            sil_cuda_host_release(b->cu, b->stage);
            b->stage = NULL;
            b->stage_bytes = 0;
            fprintf(stderr, "siliceo: cuda backend: %.2f GiB of routed experts pinned in %.1f s\n",
                    (double)total / (double)(1u << 30), now_s() - t0);
            zc_enable(b);
        } else {
            while (i-- > 0)
                sil_cuda_host_unregister(b->cu, (void *)b->rng[i].lo);
            fprintf(stderr,
                    "siliceo: cuda backend: the routed experts could not be pinned (%s); "
                    "misses are staged through a pinned buffer\n",
                    e.msg);
        }
    }
    /* bandwidth: up to 256 MiB from the start of the experts' memory (pinned or staged) */
    struct sil_cuda_event *ev[2] = {NULL, NULL};
    uint64_t bytes = b->slot_g * (uint64_t)b->n_slots;
    if (bytes > (256u << 20)) bytes = 256u << 20;
    if (bytes > b->rng[0].hi - b->rng[0].lo) bytes = b->rng[0].hi - b->rng[0].lo;
    const void *src = b->pinned ? (const void *)b->rng[0].lo : (const void *)b->stage;
    if (!b->pinned && bytes > b->stage_bytes) bytes = b->stage_bytes;
    float ms = 0;
    if (sil_cuda_event_create(b->cu, &ev[0], NULL) == 0 &&
        sil_cuda_event_create(b->cu, &ev[1], NULL) == 0 &&
        sil_cuda_upload(b->cu, b->pool_g, src, (size_t)bytes, NULL, NULL) == 0 && /* warm */
        sil_cuda_event_record(b->cu, ev[0], NULL, NULL) == 0 &&
        sil_cuda_upload(b->cu, b->pool_g, src, (size_t)bytes, NULL, NULL) == 0 &&
        sil_cuda_event_record(b->cu, ev[1], NULL, NULL) == 0 &&
        sil_cuda_event_elapsed(b->cu, ev[0], ev[1], &ms, NULL) == 0 && ms > 0)
        b->h2d_gbs = (double)bytes / ((double)ms * 1e6);
    for (int i = 0; i < 2; i++)
        sil_cuda_event_destroy(b->cu, ev[i]);
    /* with a host tier the misses come from its slots: measured there once it is open
     * (sil_cb_measure_host); the mapping would be read from the disk */
    if (b->cpu_auto && b->hx) {
        if (b->c.host_tier)
            choose_host_share(b, NULL, NULL, NULL, 0, "not measured until the host tier opens");
        else
            choose_host_share_mapped(b);
    }
    return 0;
}

int32_t sil_cb_cpu_misses(struct sil_backend *be)
{
    return cb(be)->hx && !cb(be)->float_experts ? cb(be)->cpu_misses : 0;
}

void sil_cb_measure_host(struct sil_backend *be, const struct sil_weight *gate,
                         const struct sil_weight *up, const struct sil_weight *down, int n)
{
    struct cuda_backend *b = cb(be);
    if (!b->cpu_auto || !b->hx) return;
    choose_host_share(b, gate, up, down, n,
                      n > 0 ? "the host tier" : "the host tier given back: no host path");
}

double sil_cb_host_share(struct sil_backend *be)
{
    return cb(be)->hx ? cb(be)->host_share : 0.0;
}

int32_t sil_cb_expert_slots(struct sil_backend *be)
{
    return cb(be)->n_slots;
}

/* Whether the bytes of [p, p + n) lie in one block host_alloc handed out (pinned). */
static bool in_hblk(const struct cuda_backend *b, const void *p, size_t n)
{
    const uintptr_t lo = (uintptr_t)p;
    for (int i = 0; i < b->n_hblk; i++)
        if (lo >= b->hblk[i].lo && lo + n <= b->hblk[i].hi) return true;
    return false;
}

/* Pinned host memory for the engine's host tier; NULL when the driver refuses it (the tier
 * then uses ordinary memory, and its copies are staged). */
void *sil_cb_host_alloc(struct sil_backend *be, size_t bytes)
{
    struct cuda_backend *b = cb(be);
    if (sil_vec_reserve(&b->hblk, &b->cap_hblk, (size_t)b->n_hblk + 1, 16) < 0) return NULL;
    void *p = NULL;
    if (sil_cuda_host_alloc(b->cu, bytes, &p, NULL) < 0) return NULL;
    b->hblk[b->n_hblk++] = (struct host_range){(uintptr_t)p, (uintptr_t)p + bytes};
    b->pinned_bytes += bytes;
    return p;
}

bool sil_cb_host_free(struct sil_backend *be, void *p)
{
    struct cuda_backend *b = cb(be);
    for (int i = 0; p && i < b->n_hblk; i++) {
        if (b->hblk[i].lo != (uintptr_t)p) continue;
        b->pinned_bytes -= b->hblk[i].hi - b->hblk[i].lo;
        b->hblk[i] = b->hblk[--b->n_hblk];
        sil_cuda_host_release(b->cu, p);
        return true;
    }
    return false;
}

/* One matrix into its slot through the staging ring: the ring is reused from its start once
 * the copies queued from it are done (a sync when it is full). */
static void stage_copy(struct cuda_backend *b, sil_cuda_ptr dst, const struct sil_weight *w,
                       uint64_t cap)
{
    const size_t bytes = w->mat_bytes;
    const bool direct = w->loc == SIL_WEIGHT_HOST ? in_hblk(b, w->data, bytes) : b->pinned;
    if (bytes > cap || (!direct && bytes > b->stage_bytes)) {
        fail(b, -EINVAL, "an expert matrix is larger than its slot");
        return;
    }
    if (!direct && b->stage_used + bytes > b->stage_bytes) {
        if (!ok(b, sil_cuda_sync(b->cu, NULL, &b->err))) return;
        b->stage_used = 0;
    }
    if (b->h2d_cap > 0) {
        const double now = now_s();
        const double start = b->h2d_next > now ? b->h2d_next : now;
        if (start > now) {
            const double d = start - now;
            struct timespec w8 = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
            nanosleep(&w8, NULL);
        }
        b->h2d_next = start + (double)bytes / b->h2d_cap;
    }
    if (direct) {
        /* straight from pinned memory (the mapping, or a host-tier block): one DMA */
        ok(b, sil_cuda_upload(b->cu, dst, w->data, bytes, NULL, &b->err));
    } else {
        memcpy(b->stage + b->stage_used, w->data, bytes);
        ok(b, sil_cuda_upload(b->cu, dst, b->stage + b->stage_used, bytes, NULL, &b->err));
        b->stage_used += (bytes + 255) & ~(size_t)255;
    }
    atomic_fetch_add_explicit(&b->slot_bytes_in, bytes, memory_order_relaxed);
}

void sil_cb_fill_slot(struct sil_backend *be, int32_t slot, const struct sil_weight *gate,
                      const struct sil_weight *up, const struct sil_weight *down, int32_t layer,
                      int32_t expert)
{
    struct cuda_backend *b = cb(be);
    /* between the segments of a segmented pass no graph is open: the copy runs in any mode */
    if (b->mode == PASS_REPLAY && !b->seg_gap) return;
    if (b->rc) return;
    if (b->mode != PASS_EAGER && !b->seg_gap) {
        fail(b, -EINVAL, "an expert copy inside a graph");
        return;
    }
    if (!b->segmented) not_capturable(b);
    if (slot < 0 || slot >= b->n_slots || !on_host(gate) || !on_host(up) || !on_host(down)) {
        fail(b, -EINVAL, "expert slot copy of a weight not in host memory, or slot out of range");
        return;
    }
    const uint64_t s = (uint64_t)slot;
    stage_copy(b, b->pool_g + s * b->slot_g, gate, b->slot_g);
    stage_copy(b, b->pool_u + s * b->slot_u, up, b->slot_u);
    stage_copy(b, b->pool_d + s * b->slot_d, down, b->slot_d);
    atomic_fetch_add_explicit(&b->slot_fills, 1, memory_order_relaxed);
    if (b->zc && b->rc == 0) {
        /* the table: what the slot held is read in place again, the new expert from the slot
         * (uploaded before the next pass of path (b), after this copy on the stream) */
        const int64_t X = b->c.n_expert;
        const int32_t old = b->slot_key[slot];
        if (old >= 0) b->zc_htab[old] = -1;
        b->slot_key[slot] = -1;
        if (layer >= 0 && layer < b->c.n_layer && expert >= 0 && expert < X) {
            const int32_t key = (int32_t)(layer * X + expert);
            if (b->zc_htab[key] >= 0) b->slot_key[b->zc_htab[key]] = -1;
            b->zc_htab[key] = slot;
            b->slot_key[slot] = key;
        }
        b->zc_dirty = true;
    }
}

int32_t sil_cb_routes(struct sil_backend *be, int32_t layer, const int32_t **ids)
{
    struct cuda_backend *b = cb(be);
    *ids = NULL;
    if (!b->zc || b->rc || layer < 0 || layer >= b->c.n_layer || b->zc_rows[layer] <= 0) return 0;
    *ids = b->zc_hids + (int64_t)layer * MB * b->c.n_expert_used;
    return b->zc_rows[layer];
}

#endif
