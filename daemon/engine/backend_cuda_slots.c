/* The CUDA backend's policy for weights off the device: placement (the backbone uploaded,
 * routed experts left in the mapping when they go to slots), whether the experts' pages are
 * pinned (host memory, cuda_pin, the host tier) or misses staged, when misses are read in place
 * (cuda_zero_copy), and the share of each decode layer's misses the host computes, from the
 * speeds measured at start. The mechanism (slots, ranges, pinning, copies, the slot table) is
 * kernels/cuda/cuda_slots.h. */
#ifdef SIL_HAVE_CUDA

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "daemon/engine/backend_cuda_impl.h"
#include "kernels/clock.h"
#include "daemon/engine/hostmem.h"

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
    if (b->es.n > 0 && w->n_mat > 1 && w->n_mat == b->c.n_expert) {
        if (!quantized(w->type)) b->float_experts = true; /* no host path (c) for them */
        if (w->rows == b->c.n_ff_exp && w->cols == b->c.n_embd && b->n_probe_fe < 2)
            b->probe[b->n_probe_fe++] = *w;
        else if (w->rows == b->c.n_embd && w->cols == b->c.n_ff_exp && b->n_probe_ef < 1)
            b->probe[2 + b->n_probe_ef++] = *w;
        if (sil_cuda_slots_add_range(&b->es, w->data, w->mat_bytes * (size_t)w->n_mat) < 0)
            return sil_errorf(err, -ENOMEM, "cuda backend: out of memory");
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

/* Pins the routed stacks' pages (merged where they share or touch a page) so a miss is one DMA
 * from the mapping. Not an error when the system refuses (memory locked limits, a driver
 * without read-only registration): misses are then staged, with one line saying so. Then the
 * host-to-device bandwidth from that memory is measured once, into the first slots. */
/* Path (b) once the experts are pinned, when asked for (cuda_zero_copy) and possible:
 * the fused kernels must run every layer's experts, and the benchmark cap on copies cannot
 * govern reads the kernels make. */
static void zc_enable(struct cuda_backend *b)
{
    if (!b->c.opt.zero_copy || !b->es.htab) return;
    /* with a host share (a count of CPU misses) it gave non-finite MoE outputs on the GPU
     * (cuda_fwd_parity check 15): refused until that is understood */
    const char *why = b->float_experts    ? "float experts have no fused kernel"
                      : b->es.h2d_cap > 0 ? "SIL_BENCH_H2D_GBS caps copies, not reads in place"
                      : b->hx ? "not combined with a count of CPU misses (SIL_CUDA_CPU_MISSES)"
                              : NULL;
    if (!why) {
        const int rc = sil_cuda_slots_map_ranges(&b->es);
        why = rc == -ENOMEM ? "out of memory"
              : rc < 0      ? "the pinned mapping has no device address"
                            : NULL;
    }
    if (why) {
        fprintf(stderr, "siliceo: cuda backend: cuda_zero_copy ignored: %s\n", why);
        return;
    }
    b->zc = true;
    b->es.dirty = true;
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
    if (b->hx && !b->float_experts && sets >= 2 && b->es.h2d_gbs > 0 &&
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
            const double t0 = sil_now_s();
            if (sil_host_experts_run(b->hx, b->h_x, 1, b->jobs, K, b->h_y, &e) < 0) {
                nt = 0;
                break;
            }
            const double t = sil_now_s() - t0;
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
    const struct sil_cuda_slots *es = &b->es;
    const double link =
        es->h2d_cap > 0 && es->h2d_cap / 1e9 < es->h2d_gbs ? es->h2d_cap / 1e9 : es->h2d_gbs;
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

/* cuda_pin = auto gives up pinning the mapping's pages (and stages misses) once all of them
 * would take over PIN_MAX_S: some kernels pin pages of a file mapping at a crawl, which would
 * hold the start up for minutes. */
#define PIN_MAX_S 60.0

int sil_cb_placed(struct sil_backend *be, struct sil_error *err)
{
    struct cuda_backend *b = cb(be);
    (void)err;
    if (b->es.n <= 0 || b->es.n_rng == 0) return 0;
    const uint64_t total = sil_cuda_slots_merge_ranges(&b->es);
    const enum sil_cuda_pin pin = b->c.opt.pin;
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
    if (fits && pin != SIL_CUDA_PIN_OFF) {
        double took = 0;
        struct sil_error e = {0};
        /* cuda_pin = on: pinned however slowly */
        if (sil_cuda_slots_pin(&b->es, total, pin == SIL_CUDA_PIN_AUTO ? PIN_MAX_S : 0, &took,
                               &e) == 0) {
            fprintf(stderr, "siliceo: cuda backend: %.2f GiB of routed experts pinned in %.1f s\n",
                    (double)total / (double)(1u << 30), took);
            zc_enable(b);
        } else {
            fprintf(stderr,
                    "siliceo: cuda backend: the routed experts are not pinned (%s, after %.1f s); "
                    "misses are staged through a pinned buffer\n",
                    e.msg, took);
        }
    }
    /* bandwidth: up to 256 MiB from the start of the experts' memory (pinned or staged) */
    sil_cuda_slots_measure_h2d(&b->es);
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
    return cb(be)->es.n;
}

/* Pinned host memory for the engine's host tier; NULL when the driver refuses it (the tier
 * then uses ordinary memory, and its copies are staged). */
void *sil_cb_host_alloc(struct sil_backend *be, size_t bytes)
{
    return sil_cuda_slots_host_alloc(&cb(be)->es, bytes);
}

bool sil_cb_host_free(struct sil_backend *be, void *p)
{
    return sil_cuda_slots_host_free(&cb(be)->es, p);
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
    if (slot < 0 || slot >= b->es.n || !on_host(gate) || !on_host(up) || !on_host(down)) {
        fail(b, -EINVAL, "expert slot copy of a weight not in host memory, or slot out of range");
        return;
    }
    const struct sil_cuda_slot_src m[3] = {
        {gate->data, gate->mat_bytes, gate->loc == SIL_WEIGHT_HOST},
        {up->data, up->mat_bytes, up->loc == SIL_WEIGHT_HOST},
        {down->data, down->mat_bytes, down->loc == SIL_WEIGHT_HOST},
    };
    ok(b, sil_cuda_slots_fill(&b->es, slot, m, &b->err));
    if (b->zc && b->rc == 0) {
        /* the table: what the slot held is read in place again, the new expert from the slot
         * (uploaded before the next pass of path (b), after this copy on the stream) */
        const int64_t X = b->c.n_expert;
        const bool named = layer >= 0 && layer < b->c.n_layer && expert >= 0 && expert < X;
        sil_cuda_slots_table_set(&b->es, slot, named ? (int64_t)layer * X + expert : -1);
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
