/* KV storage for the full-attention layers, behind a small interface so a paged cache (blocks,
 * block tables, prefix sharing) can replace it without touching the forward pass: the forward
 * pass only asks for the K or V row of (layer, sequence, position).
 *
 * This version gives each live sequence one F32 region of n_ctx positions per layer, reserved
 * at sil_kv_seq_alloc with mmap (MAP_NORESERVE: no commit charge for the reserve) so pages are
 * only backed once written: memory grows with the positions actually used, a cut gives the pages
 * past it back (MADV_DONTNEED), and nothing is allocated while evaluating.
 * Ownership: the cache owns all storage; row pointers stay valid until the sequence is released. */
#ifndef SIL_KV_CACHE_H
#define SIL_KV_CACHE_H

#include <stdint.h>

#include "daemon/engine/error.h"

struct sil_kv_cache;

/* n_layer: full-attention layers; n_embd_k / n_embd_v: floats per K / V row (kv heads x dim). */
int sil_kv_create(struct sil_kv_cache **out, int32_t n_layer, int32_t n_seq_max, int32_t n_ctx,
                  int32_t n_embd_k, int32_t n_embd_v, struct sil_error *err);
void sil_kv_free(struct sil_kv_cache *kv);

int sil_kv_seq_alloc(struct sil_kv_cache *kv, int seq, struct sil_error *err);
void sil_kv_seq_release(struct sil_kv_cache *kv, int seq);
/* The sequence now holds positions < n_pos: the whole pages past them are released (they read
 * as zeros if touched again). */
void sil_kv_seq_trim(struct sil_kv_cache *kv, int seq, int32_t n_pos);

/* Row of (layer, seq, pos); rows of consecutive positions are sil_kv_row_stride floats apart. */
float *sil_kv_k(const struct sil_kv_cache *kv, int layer, int seq, int32_t pos);
float *sil_kv_v(const struct sil_kv_cache *kv, int layer, int seq, int32_t pos);
int64_t sil_kv_row_stride_k(const struct sil_kv_cache *kv);
int64_t sil_kv_row_stride_v(const struct sil_kv_cache *kv);

/* Bytes held by n_pos positions of one sequence: the pages they touch. */
uint64_t sil_kv_seq_bytes(const struct sil_kv_cache *kv, int32_t n_pos);

#endif
