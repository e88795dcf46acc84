/* The routed experts' host tiers when host memory is smaller than the model: L2, a cache of
 * equal host slots (one expert of one layer each: its gate, up and down matrices), and L3, the
 * model file itself, read into those slots with aligned direct reads (O_DIRECT) on a pool of
 * reader threads, never through the mapping's page faults, so the page cache cannot evict what
 * the next token needs and the process does not fault pages in one at a time.
 *
 * Which experts stay is the expert cache's policy (expert_cache.h, LFU with decay over one
 * global pool): one policy for both cache levels. A device backend asks only for its own
 * misses (what its VRAM slots hold is never looked up here) and demotes what it copied up, so
 * an expert promoted to VRAM gives its host slot up first and the levels stay nearly
 * exclusive.
 *
 * An acquire makes one layer's experts resident, issuing every read of its misses at once (the
 * calling thread reads too) and waiting for them; the pointers it returns stay valid until the
 * next acquire or preload, so a device copy queued from them must be complete by then (the
 * engine's next acquire follows a routing the host waited for, which orders it after them).
 * Slot memory comes from the caller's allocator (pinned by a device backend, so a slot is one
 * DMA away from VRAM) or from ordinary aligned memory.
 *
 * Errors are sticky: a read that fails or comes short (the file was truncated or damaged while
 * in use) fails that acquire and every later one with -EIO, as a fault on the mapping does.
 * The store keeps its own descriptor of the inode the model was loaded from: a file renamed over
 * the path is not seen. One thread at a time calls it; the counters may be read from any. */
#ifndef SIL_EXPERT_STORE_H
#define SIL_EXPERT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/error.h"

/* One layer's stacked matrix of n_expert experts in the file: the offset of expert 0 and the
 * bytes of one (the next expert follows at off + bytes). bytes 0: the layer has none. */
struct sil_xstore_mat {
    uint64_t off, bytes;
};

struct sil_xstore_config {
    const char *path;
    uint64_t dev, ino; /* the inode the model was loaded from: another file at path is refused */
    uint64_t file_bytes;
    int32_t n_layer, n_expert;
    const struct sil_xstore_mat *mat; /* [n_layer * 3]: gate, up, down of each layer */
    int32_t n_slot;                   /* at least sil_xstore_min_slots */
    int n_readers;                    /* reader threads besides the caller; 0: 7 */
    bool buffered;                    /* no O_DIRECT: page-cache reads, each range dropped after */
    /* Slot memory, in blocks of at most 256 MiB: alloc(user, bytes) (NULL on failure; aligned to
     * 4096) and release(user, p). alloc NULL: posix_memalign and free. */
    void *(*alloc)(void *user, size_t bytes);
    void (*release)(void *user, void *p);
    void *alloc_user;
};

/* Bytes of one host slot for this config's widest matrices (each read window rounded out to
 * the direct-read alignment at both ends). */
uint64_t sil_xstore_slot_bytes(const struct sil_xstore_config *c);
/* The fewest slots that work: one layer's every expert (a prefill plan may route to all). */
int32_t sil_xstore_min_slots(const struct sil_xstore_config *c);

struct sil_xstore;

/* Opens the file (O_DIRECT, or buffered reads when the file system refuses it, or c->buffered)
 * and allocates the slots. -EINVAL (a config out of range, fewer slots than the minimum: the
 * message gives it in bytes), -ENOENT/-EACCES (the file), -ESTALE (another file is at the path
 * now), -ENOMEM. */
int sil_xstore_create(struct sil_xstore **out, const struct sil_xstore_config *c,
                      struct sil_error *err);
void sil_xstore_free(struct sil_xstore *s);

/* Makes experts[0..n) of layer resident (distinct ids, n <= n_slot; uses[i] the rows routed to
 * each for the policy's frequencies, NULL: 1 each) and sets ptr[3 * i + 0/1/2] to its gate, up
 * and down matrix in host memory. -EINVAL (out of range), -EIO (a read failed: err says where;
 * sticky). */
int sil_xstore_acquire(struct sil_xstore *s, int32_t layer, const int32_t *experts,
                       const int32_t *uses, int32_t n, const void **ptr, struct sil_error *err);
/* Reads the experts keys[0..n) (layer * n_expert + expert, hottest first) into free slots
 * without evicting, for a warm start, all in one batch of reads: how many it placed (resident
 * ones and keys out of range skipped; it stops when no slot is free), or -EIO. Invalidates
 * earlier acquires' pointers. */
int64_t sil_xstore_preload(struct sil_xstore *s, const int32_t *keys, int64_t n,
                           struct sil_error *err);
/* (layer, expert) was copied to a higher level (a device's slot): its host slot goes first, so
 * the two levels hold different experts. Its pointers stay valid until the next acquire. */
void sil_xstore_demote(struct sil_xstore *s, int32_t layer, int32_t expert);
/* Replaces the policy's frequencies (a heat map, [n_layer * n_expert]). */
void sil_xstore_heat_import(struct sil_xstore *s, const float *heat);

struct sil_xstore_stats {
    int32_t n_slot;
    uint64_t slot_bytes;
    uint64_t hits, misses;   /* experts found in a slot / read from the file */
    uint64_t bytes_read;     /* from the file, the alignment's extra bytes included */
    uint64_t reads;          /* read calls */
    double wait_s;           /* time acquires and preloads spent waiting for reads */
    const char *io;          /* "direct" or "buffered" */
};
void sil_xstore_stats(const struct sil_xstore *s, struct sil_xstore_stats *out);

#endif
