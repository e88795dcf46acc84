/* Paged KV storage for the full-attention layers. Positions live in blocks of SIL_KV_BLOCK
 * tokens taken from one pool sized at create (a byte budget); each sequence has a block table
 * (its i-th block holds positions [64 i, 64 i + 64)). A block id names the same slot in every
 * layer: block b of layer l holds K rows [64][row_bytes_k] then V rows [64][row_bytes_v] in the
 * cache's element type (f32, f16, q8_0 or q4_0, GGUF block layouts).
 *
 * Blocks are reference counted so a prefix cache can share them: a sequence may point at blocks
 * other sequences also hold (sil_kv_seq_share, sil_kv_seq_attach); a write into a shared block
 * copies it first (sil_kv_seq_reserve); a block goes back to the pool with its last reference.
 * A block may carry a hash (sil_kv_block_set_hash): when its last reference goes it stays
 * findable by sil_kv_block_lookup, and the pool reuses such cached blocks last, oldest first
 * (LRU), dropping the hash then. The pool is reserved without commit charge: its pages are
 * backed once written, and a block freed without a hash gives its pages back.
 *
 * Writing: sil_kv_seq_reserve makes positions < n_pos writable before an evaluation; running
 * out of blocks is -ENOBUFS and leaves the sequence as it was. Nothing allocates afterwards.
 * Ownership: the cache owns all storage; block pointers stay valid until sil_kv_free. */
#ifndef SIL_KV_CACHE_H
#define SIL_KV_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/error.h"

#define SIL_KV_BLOCK 64      /* positions per block */
#define SIL_KV_HEAD_MAX 1024 /* largest head dim */

/* Element types; q8_0 and q4_0 need head dims that are multiples of 32. */
enum sil_kv_type { SIL_KV_F32, SIL_KV_F16, SIL_KV_Q8_0, SIL_KV_Q4_0 };

struct sil_kv_config {
    int32_t n_layer;            /* full-attention layers (0: the cache holds nothing) */
    int32_t n_seq_max, n_ctx;   /* sequences, positions per sequence */
    int32_t n_embd_k, n_embd_v; /* elements per K / V row (kv heads x head dim) */
    int32_t head_dim;           /* elements of one head inside a row */
    enum sil_kv_type type;
    uint64_t budget; /* pool bytes; 0: enough for every sequence at n_ctx (backed lazily) */
    /* n_layer 0 (a device holds the rows): blocks in the pool, the device's; 0: every sequence
     * at n_ctx */
    int32_t n_blocks;
};

struct sil_kv_cache;

int sil_kv_create(struct sil_kv_cache **out, const struct sil_kv_config *c, struct sil_error *err);
void sil_kv_free(struct sil_kv_cache *kv);

/* "f32", "f16", "q8_0", "q4_0" -> type; -1 when unknown. */
int sil_kv_type_from_name(const char *name);
const char *sil_kv_type_name(enum sil_kv_type t);
/* The ggml type number of the element type (for the kernels). */
int sil_kv_ggml_type(enum sil_kv_type t);

enum sil_kv_type sil_kv_type(const struct sil_kv_cache *kv);
/* Bytes of n elements of type t (n a multiple of 32 for q8_0 and q4_0). */
uint64_t sil_kv_type_bytes(enum sil_kv_type t, int64_t n);
int32_t sil_kv_n_blocks(const struct sil_kv_cache *kv); /* pool size */
int32_t sil_kv_n_free(const struct sil_kv_cache *kv);   /* blocks no sequence holds */
size_t sil_kv_row_bytes_k(const struct sil_kv_cache *kv);
size_t sil_kv_row_bytes_v(const struct sil_kv_cache *kv);
size_t sil_kv_head_bytes(const struct sil_kv_cache *kv);    /* one head inside a row */
uint64_t sil_kv_block_bytes(const struct sil_kv_cache *kv); /* one block id, all layers */

/* Sequences: seq in [0, n_seq_max). Release drops every block reference the sequence holds. */
void sil_kv_seq_release(struct sil_kv_cache *kv, int seq);
int32_t sil_kv_seq_len(const struct sil_kv_cache *kv, int seq); /* positions reserved */
/* Positions < n_pos become writable: blocks are added and a shared block about to be written is
 * copied. -ENOBUFS (nothing changed) when the pool runs out, -ENOSPC beyond n_ctx. */
int sil_kv_seq_reserve(struct sil_kv_cache *kv, int seq, int32_t n_pos, struct sil_error *err);
/* The sequence now holds positions < n_pos (n_pos <= its length): blocks past them are dropped. */
void sil_kv_seq_trim(struct sil_kv_cache *kv, int seq, int32_t n_pos);
/* dst (empty) takes references on the blocks of src's positions < n_pos. */
int sil_kv_seq_share(struct sil_kv_cache *kv, int dst, int src, int32_t n_pos,
                     struct sil_error *err);
/* Appends a reference to block at the end of seq (whose length must be a whole number of
 * blocks): the sequence grows by SIL_KV_BLOCK positions. The block may be free but cached. */
int sil_kv_seq_attach(struct sil_kv_cache *kv, int seq, int32_t block, struct sil_error *err);
/* A cache without layers (n_layer 0: a device holds the rows): the copies on write that
 * sil_kv_seq_reserve decided (block src's rows into the new block dst, every layer, K and V),
 * oldest first, up to max; they are removed. The device must make them before it writes or
 * reads the new blocks. Returns how many were taken; 0 for a cache with layers. */
int32_t sil_kv_take_copies(struct sil_kv_cache *kv, int32_t *src, int32_t *dst, int32_t max);
/* The sequence's block table: its blocks for positions [0, len), in order. */
const int32_t *sil_kv_seq_table(const struct sil_kv_cache *kv, int seq, int32_t *n_blocks);

/* Block references and the prefix-cache hook. */
int32_t sil_kv_block_refs(const struct sil_kv_cache *kv, int32_t block);
void sil_kv_block_set_hash(struct sil_kv_cache *kv, int32_t block, uint64_t hash);
int32_t sil_kv_block_lookup(const struct sil_kv_cache *kv, uint64_t hash); /* -1: none */
/* Whether block carries a hash now (its rows are still the ones it was set for), and which. */
bool sil_kv_block_hash(const struct sil_kv_cache *kv, int32_t block, uint64_t *hash);
int32_t sil_kv_n_hashed(const struct sil_kv_cache *kv); /* blocks carrying a hash */
int32_t sil_kv_n_cached(const struct sil_kv_cache *kv); /* of which no sequence holds */
/* At most max_blocks cached blocks no sequence holds (-1, the default: as many as the pool
 * has free); beyond it the oldest lose their hash and give their pages back. */
void sil_kv_set_cached_max(struct sil_kv_cache *kv, int32_t max_blocks);

/* K / V rows [SIL_KV_BLOCK] of block in layer, row_bytes apart. */
void *sil_kv_block_k(const struct sil_kv_cache *kv, int layer, int32_t block);
void *sil_kv_block_v(const struct sil_kv_cache *kv, int layer, int32_t block);
/* The row of (layer, seq, pos); pos < the sequence's length. */
void *sil_kv_k(const struct sil_kv_cache *kv, int layer, int seq, int32_t pos);
void *sil_kv_v(const struct sil_kv_cache *kv, int layer, int seq, int32_t pos);

/* Copies the rows of position src to position dst of seq (both below its length; dst's block
 * held by seq alone) in every layer, K and V: a token tree's accepted node moved to the position
 * its path gives it. No-op for a cache without layers. */
void sil_kv_seq_move(struct sil_kv_cache *kv, int seq, int32_t dst, int32_t src);

/* Bytes a sequence of n_pos positions holds: whole blocks. */
uint64_t sil_kv_seq_bytes(const struct sil_kv_cache *kv, int32_t n_pos);

#endif
