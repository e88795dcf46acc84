/* Expert slots: the mechanism under the CUDA backend's expert cache. n equal slots on the
 * device, each one expert's gate, up and down matrices, and what it takes to fill them from host
 * memory: the host ranges the routed experts lie in (pinned where the caller asks, with their
 * device addresses for reads in place), pinned host blocks (the engine's host tier), a pinned
 * staging ring for copies from memory that is not pinned, the link's measured bandwidth, and the
 * slot table of reads in place (zero-copy: expert -> slot, or -1 where the expert is read from
 * host memory over the bus).
 *
 * Policy is the caller's (daemon/engine/backend_cuda_slots.c): which weights go to slots,
 * whether to pin, when to read in place, the CPU's share of misses. Nothing here knows a model:
 * a matrix to copy is a pointer, a byte count and where it lies.
 *
 * Ownership: the caller owns struct sil_cuda_slots (zeroed, then sil_cuda_slots_init) and
 * allocates its device memory, the pools and the table (so that its own budget counts them, in
 * its order): it sets pool_g, pool_u, pool_d (n * slot_g, n * slot_u, n * slot_d bytes) after
 * sil_cuda_slots_layout and tab (n_keys int32) after sil_cuda_slots_open, and frees them. The
 * host memory made here (staging ring, host blocks, tables, pinned registrations) is freed by
 * sil_cuda_slots_free. Fields are read-only to the caller except where a comment says.
 *
 * Errors: 0 or -errno, with the struct sil_error (may be NULL) filled; copies go on the context's
 * default stream. One thread (the engine's) calls these; the counters may be read from any. */
#ifndef SIL_CUDA_SLOTS_H
#define SIL_CUDA_SLOTS_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda_backend.h"

/* The pieces the ranges are pinned in (sil_cuda_slots_pin). */
#define SIL_CUDA_PIN_PIECE_MIB 128

/* [lo, hi) of host memory, page-aligned where it is a range of the mapping. */
struct sil_cuda_host_range {
    uintptr_t lo, hi;
};

/* One matrix of an expert in host memory, for sil_cuda_slots_fill. */
struct sil_cuda_slot_src {
    const void *data;
    size_t bytes;
    /* true: in the caller's host tier, one DMA where it lies in a block of
     * sil_cuda_slots_host_alloc (else staged); false: in the ranges (the mapping), one DMA
     * when they are pinned */
    bool host_tier;
};

struct sil_cuda_slots {
    struct sil_cuda *cu;
    /* n slots of a gate, up and down matrix each, slot_g, slot_u, slot_d bytes apart in the
     * pools (device memory the caller allocates) */
    int32_t n;
    uint64_t slot_g, slot_u, slot_d;
    sil_cuda_ptr pool_g, pool_u, pool_d;
    /* the pinned staging ring: reused from its start once the copies queued from it are done */
    uint8_t *stage;
    size_t stage_bytes, stage_used;
    /* expert copies and their bytes since open (read from other threads) */
    _Atomic uint64_t fills, bytes_in;
    /* the host ranges the routed experts lie in (sil_cuda_slots_add_range), sorted and merged by
     * sil_cuda_slots_merge_ranges; pinned when sil_cuda_slots_pin succeeded, and then, after
     * sil_cuda_slots_map_ranges, rng_dev[i] is range i's device address */
    struct sil_cuda_host_range *rng;
    int n_rng;
    size_t cap_rng;
    sil_cuda_ptr *rng_dev;
    bool pinned;
    uint64_t pinned_bytes; /* the ranges pinned and the host blocks */
    double h2d_gbs;        /* host-to-device bandwidth measured, GB/s (0: not measured) */
    /* pinned host blocks handed out by sil_cuda_slots_host_alloc */
    struct sil_cuda_host_range *hblk;
    int n_hblk;
    size_t cap_hblk;
    /* benchmarks only, set by the caller: copies are issued no faster than h2d_cap bytes a
     * second (0: as fast as they go), to measure a slower link on a fast one */
    double h2d_cap, h2d_next;
    /* the slot table of reads in place: htab[key] is the slot holding expert key (the caller's
     * numbering, 0 <= key < n_keys) or -1; slot_key[slot] the other way; tab the device copy
     * (the caller allocates it); dirty: htab changed since the caller last uploaded it (the
     * caller clears it) */
    int32_t *htab, *slot_key;
    int64_t n_keys;
    sil_cuda_ptr tab;
    bool dirty;
};

/* Bytes a slot takes for a matrix of `bytes`: rounded up to 256, as the pools lay them out. */
static inline uint64_t sil_cuda_slot_bytes(uint64_t bytes)
{
    return (bytes + 255) & ~(uint64_t)255;
}

/* Binds s (zeroed) to the context cu. No allocation; s may be freed from here on. */
void sil_cuda_slots_init(struct sil_cuda_slots *s, struct sil_cuda *cu);

/* n slots of matrices of gate, up and down bytes (each rounded by sil_cuda_slot_bytes). No
 * allocation: the caller allocates the pools next, then calls sil_cuda_slots_open. */
void sil_cuda_slots_layout(struct sil_cuda_slots *s, int32_t n, uint64_t gate, uint64_t up,
                           uint64_t down);

/* The staging ring (64 MiB, or two slots when a slot is larger; pinned host memory) and the host
 * side of the slot table for n_keys experts (every one read in place, every slot empty).
 * -ENOMEM or the driver's error. */
int sil_cuda_slots_open(struct sil_cuda_slots *s, int64_t n_keys, struct sil_error *err);

/* Zeroes the pools (so a slot never filled reads finite numbers). The driver's error. */
int sil_cuda_slots_zero(struct sil_cuda_slots *s, struct sil_error *err);

/* Unpins and frees what this module made (staging ring, host blocks, registrations, tables);
 * the pools and tab stay the caller's. s is not used again. */
void sil_cuda_slots_free(struct sil_cuda_slots *s);

/* Notes [p, p + bytes) of host memory as a range experts are copied from, widened to whole
 * pages. -ENOMEM. */
int sil_cuda_slots_add_range(struct sil_cuda_slots *s, const void *p, size_t bytes);

/* Sorts the ranges and merges those that share or touch a page; their total bytes. */
uint64_t sil_cuda_slots_merge_ranges(struct sil_cuda_slots *s);

/* Pins every range (read-only, with device addresses) in pieces of SIL_CUDA_PIN_PIECE_MIB,
 * splitting the ranges at the pieces' bounds; `total` is their bytes. With max_s > 0 it gives
 * up (-ETIMEDOUT) as soon as the time taken, or the time projected for all of it from the rate
 * so far, passes max_s: some kernels pin pages of a file mapping at a crawl. On success the
 * staging ring is given back (copies from the ranges are one DMA each); on failure the pieces
 * pinned so far are unpinned again and the error returned; *took_s is the time spent. */
int sil_cuda_slots_pin(struct sil_cuda_slots *s, uint64_t total, double max_s, double *took_s,
                       struct sil_error *err);

/* The device address of every pinned range (rng_dev), for reads in place: -ENOMEM, or -EFAULT
 * when a range has none or the pieces of one range have no contiguous device addresses (a
 * matrix may span two pieces; rng_dev is then NULL). Needs the ranges pinned. */
int sil_cuda_slots_map_ranges(struct sil_cuda_slots *s);

/* The device address of host pointer p in the mapped ranges, 0 when it is not in them. */
sil_cuda_ptr sil_cuda_slots_host_dev(const struct sil_cuda_slots *s, const void *p);

/* Measures the host-to-device bandwidth into h2d_gbs: up to 256 MiB (and one pool's size) from
 * the start of the first range when pinned, else from the staging ring, one copy to warm and one
 * timed. Leaves h2d_gbs as it was when a step fails. Needs a range and the pools. */
void sil_cuda_slots_measure_h2d(struct sil_cuda_slots *s);

/* Pinned host memory of `bytes` (counted in pinned_bytes): a copy from it is one DMA. NULL when
 * the driver refuses it or out of memory. */
void *sil_cuda_slots_host_alloc(struct sil_cuda_slots *s, size_t bytes);

/* Frees a block of sil_cuda_slots_host_alloc; false when p is not one. */
bool sil_cuda_slots_host_free(struct sil_cuda_slots *s, void *p);

/* Copies an expert's matrices m[0] (gate), m[1] (up), m[2] (down) into slot (0 <= slot < n):
 * one DMA each from pinned memory, else through the staging ring (which syncs the stream when
 * it is full), no faster than h2d_cap; counts the fill and its bytes. After a failure the other
 * matrices are still tried as far as they can be; the first error is returned (-EINVAL when a
 * matrix is larger than its slot or the ring, else the driver's). */
int sil_cuda_slots_fill(struct sil_cuda_slots *s, int32_t slot, const struct sil_cuda_slot_src m[3],
                        struct sil_error *err);

/* The slot table after slot was filled: what it held is read in place again, and expert key
 * (0 <= key < n_keys; any other value: none) is now read from it. Sets dirty. */
void sil_cuda_slots_table_set(struct sil_cuda_slots *s, int32_t slot, int64_t key);

/* Copies htab up to tab on the default stream (from pageable memory: taken before it returns).
 * The driver's error. dirty is left to the caller. */
int sil_cuda_slots_table_upload(struct sil_cuda_slots *s, struct sil_error *err);

#endif
