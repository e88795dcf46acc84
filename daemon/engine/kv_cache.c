#include "daemon/engine/kv_cache.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/cpu/quants.h"

struct sil_kv_cache {
    struct sil_kv_config c;
    size_t row_k, row_v, head_bytes;
    size_t layer_block; /* K then V rows of one block in one layer */
    int32_t n_blocks, max_seq_blocks, n_free;
    char *pool; /* [layer][block][K rows | V rows], reserved without commit charge */
    size_t pool_bytes;
    int32_t *refs;
    /* Free list (blocks with no reference), doubly linked: plain blocks at the head, blocks
     * with a hash at the tail in the order they were freed, so allocation reuses those last. */
    int32_t *prev, *next, free_head, free_tail;
    /* The oldest free block with a hash (the cached part of the free list starts there), how
     * many there are, and how many may be (-1: as many as the pool holds). */
    int32_t cached_first, n_cached_free, cached_max;
    /* Hash -> block: chains through hnext from bucket[hash & (n_bucket - 1)]. */
    uint64_t *hash;
    bool *hashed;
    int32_t *hnext, *bucket;
    uint32_t n_bucket;
    int32_t n_hashed;
    int32_t *table; /* [n_seq_max][max_seq_blocks] */
    int32_t *len;   /* [n_seq_max] positions */
    /* n_layer 0 (a device holds the rows): copies on write the device has yet to make, in the
     * order they were decided; at most one a block allocated, so n_blocks entries */
    int32_t *copy_src, *copy_dst, n_copy;
};

static const struct {
    const char *name;
    int ggml;
} kv_types[] = {
    [SIL_KV_F32] = {"f32", SIL_TYPE_F32},
    [SIL_KV_F16] = {"f16", SIL_TYPE_F16},
    [SIL_KV_Q8_0] = {"q8_0", SIL_TYPE_Q8_0},
    [SIL_KV_Q4_0] = {"q4_0", SIL_TYPE_Q4_0},
};
#define N_KV_TYPES ((int)(sizeof kv_types / sizeof kv_types[0]))

int sil_kv_type_from_name(const char *name)
{
    for (int i = 0; name && i < N_KV_TYPES; i++)
        if (strcmp(name, kv_types[i].name) == 0) return i;
    return -1;
}

const char *sil_kv_type_name(enum sil_kv_type t)
{
    return (int)t >= 0 && (int)t < N_KV_TYPES ? kv_types[t].name : "?";
}

int sil_kv_ggml_type(enum sil_kv_type t)
{
    return (int)t >= 0 && (int)t < N_KV_TYPES ? kv_types[t].ggml : -1;
}

static int32_t blocks_of(int32_t n_pos)
{
    return (n_pos + SIL_KV_BLOCK - 1) / SIL_KV_BLOCK;
}

/* ---- free list and hash table --------------------------------------------------------------- */

static void free_unlink(struct sil_kv_cache *kv, int32_t b)
{
    const int32_t p = kv->prev[b], n = kv->next[b];
    if (b == kv->cached_first) kv->cached_first = n;
    if (kv->hashed[b]) kv->n_cached_free--;
    if (p >= 0)
        kv->next[p] = n;
    else
        kv->free_head = n;
    if (n >= 0)
        kv->prev[n] = p;
    else
        kv->free_tail = p;
    kv->prev[b] = kv->next[b] = -1;
    kv->n_free--;
}

static void free_push(struct sil_kv_cache *kv, int32_t b, bool at_tail)
{
    if (kv->hashed[b]) { /* only ever at the tail: the list is plain blocks, then cached ones */
        kv->n_cached_free++;
        if (kv->cached_first < 0) kv->cached_first = b;
    }
    if (at_tail) {
        kv->prev[b] = kv->free_tail;
        kv->next[b] = -1;
        if (kv->free_tail >= 0)
            kv->next[kv->free_tail] = b;
        else
            kv->free_head = b;
        kv->free_tail = b;
    } else {
        kv->next[b] = kv->free_head;
        kv->prev[b] = -1;
        if (kv->free_head >= 0)
            kv->prev[kv->free_head] = b;
        else
            kv->free_tail = b;
        kv->free_head = b;
    }
    kv->n_free++;
}

static void hash_drop(struct sil_kv_cache *kv, int32_t b)
{
    if (!kv->hashed[b]) return;
    int32_t *at = &kv->bucket[kv->hash[b] & (kv->n_bucket - 1)];
    while (*at != b)
        at = &kv->hnext[*at];
    *at = kv->hnext[b];
    kv->hashed[b] = false;
    kv->n_hashed--;
}

static void block_release_pages(const struct sil_kv_cache *kv, int32_t b);

/* Beyond cached_max, the oldest cached blocks become plain free blocks (pages given back). */
static void cache_trim(struct sil_kv_cache *kv)
{
    while (kv->cached_max >= 0 && kv->n_cached_free > kv->cached_max) {
        const int32_t b = kv->cached_first;
        free_unlink(kv, b);
        hash_drop(kv, b);
        block_release_pages(kv, b);
        free_push(kv, b, false);
    }
}

void sil_kv_set_cached_max(struct sil_kv_cache *kv, int32_t max_blocks)
{
    kv->cached_max = max_blocks < 0 ? -1 : max_blocks;
    cache_trim(kv);
}

void sil_kv_block_set_hash(struct sil_kv_cache *kv, int32_t block, uint64_t hash)
{
    if (block < 0 || block >= kv->n_blocks) return;
    const bool is_free = kv->refs[block] == 0;
    if (is_free) free_unlink(kv, block); /* relinked below as a cached one: reused last */
    hash_drop(kv, block);
    kv->hash[block] = hash;
    kv->hashed[block] = true;
    kv->n_hashed++;
    int32_t *head = &kv->bucket[hash & (kv->n_bucket - 1)];
    kv->hnext[block] = *head;
    *head = block;
    if (is_free) {
        free_push(kv, block, true);
        cache_trim(kv);
    }
}

int32_t sil_kv_block_lookup(const struct sil_kv_cache *kv, uint64_t hash)
{
    for (int32_t b = kv->bucket[hash & (kv->n_bucket - 1)]; b >= 0; b = kv->hnext[b])
        if (kv->hash[b] == hash) return b;
    return -1;
}

bool sil_kv_block_hash(const struct sil_kv_cache *kv, int32_t block, uint64_t *hash)
{
    if (block < 0 || block >= kv->n_blocks || !kv->hashed[block]) return false;
    *hash = kv->hash[block];
    return true;
}

int32_t sil_kv_n_hashed(const struct sil_kv_cache *kv)
{
    return kv->n_hashed;
}

int32_t sil_kv_n_cached(const struct sil_kv_cache *kv)
{
    return kv->n_cached_free;
}

int32_t sil_kv_block_refs(const struct sil_kv_cache *kv, int32_t block)
{
    return block >= 0 && block < kv->n_blocks ? kv->refs[block] : 0;
}

/* A block with one reference; the caller checked n_free. A cached block taken here loses its
 * hash: its contents are about to change. */
static int32_t block_alloc(struct sil_kv_cache *kv)
{
    const int32_t b = kv->free_head;
    free_unlink(kv, b);
    hash_drop(kv, b);
    kv->refs[b] = 1;
    return b;
}

/* Gives the whole pages of block b back to the system (they read as zeros when next touched):
 * memory follows the positions held, as a sequence's release or cut promises. */
static void block_release_pages(const struct sil_kv_cache *kv, int32_t b)
{
    const uintptr_t ps = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (int l = 0; l < kv->c.n_layer; l++) {
        const uintptr_t from = (uintptr_t)sil_kv_block_k(kv, l, b);
        const uintptr_t a = (from + ps - 1) & ~(ps - 1), e = (from + kv->layer_block) & ~(ps - 1);
        if (e > a) madvise((void *)a, e - a, MADV_DONTNEED);
    }
}

static void block_unref(struct sil_kv_cache *kv, int32_t b)
{
    if (--kv->refs[b] > 0) return;
    free_push(kv, b, kv->hashed[b]);
    if (!kv->hashed[b]) /* a cached block keeps its rows for a later hit */
        block_release_pages(kv, b);
    else
        cache_trim(kv);
}

/* ---- create / free ----------------------------------------------------------------------------
 */

void sil_kv_free(struct sil_kv_cache *kv)
{
    if (!kv) return;
    if (kv->pool) munmap(kv->pool, kv->pool_bytes);
    free(kv->refs);
    free(kv->prev);
    free(kv->next);
    free(kv->hash);
    free(kv->hashed);
    free(kv->hnext);
    free(kv->bucket);
    free(kv->table);
    free(kv->len);
    free(kv->copy_src);
    free(kv->copy_dst);
    free(kv);
}

int sil_kv_create(struct sil_kv_cache **out, const struct sil_kv_config *c, struct sil_error *err)
{
    if (c->n_layer < 0 || c->n_seq_max < 1 || c->n_ctx < 1 || c->n_embd_k < 1 || c->n_embd_v < 1 ||
        c->head_dim < 1 || c->head_dim > SIL_KV_HEAD_MAX || c->n_embd_k % c->head_dim ||
        c->n_embd_v % c->head_dim)
        return sil_errorf(err, -EINVAL, "kv cache: bad size (layers %d, seqs %d, ctx %d, head %d)",
                          c->n_layer, c->n_seq_max, c->n_ctx, c->head_dim);
    const int gt = sil_kv_ggml_type(c->type);
    if (gt < 0) return sil_errorf(err, -EINVAL, "kv cache: unknown element type %d", (int)c->type);
    const size_t head_bytes = sil_row_size(gt, c->head_dim);
    if (head_bytes == 0)
        return sil_errorf(err, -EINVAL, "kv cache: %s needs head dims in multiples of 32, not %d",
                          sil_kv_type_name(c->type), c->head_dim);
    struct sil_kv_cache *kv = calloc(1, sizeof(*kv));
    if (!kv) return sil_errorf(err, -ENOMEM, "kv cache: out of memory");
    kv->c = *c;
    kv->head_bytes = head_bytes;
    kv->row_k = head_bytes * (size_t)(c->n_embd_k / c->head_dim);
    kv->row_v = head_bytes * (size_t)(c->n_embd_v / c->head_dim);
    kv->layer_block = SIL_KV_BLOCK * (kv->row_k + kv->row_v);
    kv->max_seq_blocks = blocks_of(c->n_ctx);
    const uint64_t block_bytes = (uint64_t)c->n_layer * kv->layer_block;
    int64_t nb = (int64_t)c->n_seq_max * kv->max_seq_blocks;
    if (c->budget && block_bytes) {
        nb = (int64_t)(c->budget / block_bytes);
        if (nb < 1) {
            sil_kv_free(kv);
            return sil_errorf(err, -EINVAL,
                              "kv cache: a budget of %llu bytes holds no block (one is %llu)",
                              (unsigned long long)c->budget, (unsigned long long)block_bytes);
        }
    }
    if (c->n_layer == 0 && c->n_blocks > 0) nb = c->n_blocks;
    if (nb > INT32_MAX / 2) nb = INT32_MAX / 2;
    kv->n_blocks = (int32_t)nb;
    kv->n_bucket = 1;
    while (kv->n_bucket < (uint32_t)kv->n_blocks && kv->n_bucket < (1u << 30))
        kv->n_bucket <<= 1;
    const size_t n = (size_t)kv->n_blocks;
    kv->refs = calloc(n, sizeof(int32_t));
    kv->prev = malloc(n * sizeof(int32_t));
    kv->next = malloc(n * sizeof(int32_t));
    kv->hash = calloc(n, sizeof(uint64_t));
    kv->hashed = calloc(n, sizeof(bool));
    kv->hnext = malloc(n * sizeof(int32_t));
    kv->bucket = malloc(kv->n_bucket * sizeof(int32_t));
    kv->table = malloc((size_t)c->n_seq_max * (size_t)kv->max_seq_blocks * sizeof(int32_t));
    kv->len = calloc((size_t)c->n_seq_max, sizeof(int32_t));
    if (c->n_layer == 0) {
        kv->copy_src = malloc(n * sizeof(int32_t));
        kv->copy_dst = malloc(n * sizeof(int32_t));
    }
    if (!kv->refs || !kv->prev || !kv->next || !kv->hash || !kv->hashed || !kv->hnext ||
        !kv->bucket || !kv->table || !kv->len ||
        (c->n_layer == 0 && (!kv->copy_src || !kv->copy_dst))) {
        sil_kv_free(kv);
        return sil_errorf(err, -ENOMEM, "kv cache: out of memory for %d blocks", (int)nb);
    }
    kv->pool_bytes = (size_t)block_bytes * n;
    if (kv->pool_bytes) {
        /* Only touched pages are backed: the default pool covers every sequence at n_ctx. */
        void *p = mmap(NULL, kv->pool_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            const size_t want = kv->pool_bytes;
            kv->pool_bytes = 0;
            sil_kv_free(kv);
            return sil_errorf(err, -ENOMEM, "kv cache: cannot reserve %zu bytes", want);
        }
        kv->pool = p;
    }
    memset(kv->bucket, 0xff, kv->n_bucket * sizeof(int32_t));
    kv->free_head = kv->free_tail = kv->cached_first = -1;
    kv->cached_max = -1;
    for (int32_t b = kv->n_blocks - 1; b >= 0; b--) /* block 0 first: low addresses get reused */
        free_push(kv, b, false);
    *out = kv;
    return 0;
}

/* ---- queries ----------------------------------------------------------------------------------
 */

enum sil_kv_type sil_kv_type(const struct sil_kv_cache *kv)
{
    return kv->c.type;
}
int32_t sil_kv_n_blocks(const struct sil_kv_cache *kv)
{
    return kv->n_blocks;
}
int32_t sil_kv_n_free(const struct sil_kv_cache *kv)
{
    return kv->n_free;
}
uint64_t sil_kv_type_bytes(enum sil_kv_type t, int64_t n)
{
    return (uint64_t)sil_row_size(sil_kv_ggml_type(t), n);
}

size_t sil_kv_row_bytes_k(const struct sil_kv_cache *kv)
{
    return kv->row_k;
}
size_t sil_kv_row_bytes_v(const struct sil_kv_cache *kv)
{
    return kv->row_v;
}
size_t sil_kv_head_bytes(const struct sil_kv_cache *kv)
{
    return kv->head_bytes;
}

uint64_t sil_kv_block_bytes(const struct sil_kv_cache *kv)
{
    return (uint64_t)kv->c.n_layer * kv->layer_block;
}

uint64_t sil_kv_seq_bytes(const struct sil_kv_cache *kv, int32_t n_pos)
{
    return n_pos > 0 ? (uint64_t)blocks_of(n_pos) * sil_kv_block_bytes(kv) : 0;
}

static bool seq_in_range(const struct sil_kv_cache *kv, int seq)
{
    return seq >= 0 && seq < kv->c.n_seq_max;
}

static int32_t *table_of(const struct sil_kv_cache *kv, int seq)
{
    return kv->table + (size_t)seq * (size_t)kv->max_seq_blocks;
}

int32_t sil_kv_seq_len(const struct sil_kv_cache *kv, int seq)
{
    return seq_in_range(kv, seq) ? kv->len[seq] : 0;
}

const int32_t *sil_kv_seq_table(const struct sil_kv_cache *kv, int seq, int32_t *n_blocks)
{
    *n_blocks = seq_in_range(kv, seq) ? blocks_of(kv->len[seq]) : 0;
    return seq_in_range(kv, seq) ? table_of(kv, seq) : NULL;
}

void *sil_kv_block_k(const struct sil_kv_cache *kv, int layer, int32_t block)
{
    return kv->pool + ((size_t)layer * (size_t)kv->n_blocks + (size_t)block) * kv->layer_block;
}

void *sil_kv_block_v(const struct sil_kv_cache *kv, int layer, int32_t block)
{
    return (char *)sil_kv_block_k(kv, layer, block) + SIL_KV_BLOCK * kv->row_k;
}

void *sil_kv_k(const struct sil_kv_cache *kv, int layer, int seq, int32_t pos)
{
    const int32_t b = table_of(kv, seq)[pos / SIL_KV_BLOCK];
    return (char *)sil_kv_block_k(kv, layer, b) + (size_t)(pos % SIL_KV_BLOCK) * kv->row_k;
}

void *sil_kv_v(const struct sil_kv_cache *kv, int layer, int seq, int32_t pos)
{
    const int32_t b = table_of(kv, seq)[pos / SIL_KV_BLOCK];
    return (char *)sil_kv_block_v(kv, layer, b) + (size_t)(pos % SIL_KV_BLOCK) * kv->row_v;
}

void sil_kv_seq_move(struct sil_kv_cache *kv, int seq, int32_t dst, int32_t src)
{
    for (int l = 0; l < kv->c.n_layer; l++) {
        memcpy(sil_kv_k(kv, l, seq, dst), sil_kv_k(kv, l, seq, src), kv->row_k);
        memcpy(sil_kv_v(kv, l, seq, dst), sil_kv_v(kv, l, seq, src), kv->row_v);
    }
}

/* ---- sequences --------------------------------------------------------------------------------
 */

void sil_kv_seq_trim(struct sil_kv_cache *kv, int seq, int32_t n_pos)
{
    if (!seq_in_range(kv, seq) || n_pos < 0 || n_pos >= kv->len[seq]) return;
    int32_t *t = table_of(kv, seq);
    /* Last block first: a cached chain is then evicted from its end, its start kept longest. */
    for (int32_t i = blocks_of(kv->len[seq]) - 1; i >= blocks_of(n_pos); i--)
        block_unref(kv, t[i]);
    kv->len[seq] = n_pos;
}

void sil_kv_seq_release(struct sil_kv_cache *kv, int seq)
{
    sil_kv_seq_trim(kv, seq, 0);
}

int sil_kv_seq_reserve(struct sil_kv_cache *kv, int seq, int32_t n_pos, struct sil_error *err)
{
    if (!seq_in_range(kv, seq))
        return sil_errorf(err, -EINVAL, "kv cache: sequence %d out of range", seq);
    if (n_pos > kv->c.n_ctx)
        return sil_errorf(err, -ENOSPC,
                          "kv cache: sequence %d: %d positions beyond the context (%d)", seq, n_pos,
                          kv->c.n_ctx);
    const int32_t len = kv->len[seq];
    if (n_pos <= len) return 0;
    int32_t *t = table_of(kv, seq);
    /* The block holding position len is written in place only when nobody else sees it. */
    const int32_t part = len % SIL_KV_BLOCK ? t[len / SIL_KV_BLOCK] : -1;
    const int32_t cow = part >= 0 && kv->refs[part] > 1;
    const int32_t need = blocks_of(n_pos) - blocks_of(len) + cow;
    if (need > kv->n_free)
        return sil_errorf(
            err, -ENOBUFS,
            "kv cache: sequence %d needs %d more blocks of %d positions, %d of %d free", seq, need,
            SIL_KV_BLOCK, kv->n_free, kv->n_blocks);
    if (cow) {
        const int32_t b = block_alloc(kv);
        for (int l = 0; l < kv->c.n_layer; l++)
            memcpy(sil_kv_block_k(kv, l, b), sil_kv_block_k(kv, l, part), kv->layer_block);
        if (kv->copy_src && kv->n_copy < kv->n_blocks) { /* the device copies it */
            kv->copy_src[kv->n_copy] = part;
            kv->copy_dst[kv->n_copy++] = b;
        }
        block_unref(kv, part);
        t[len / SIL_KV_BLOCK] = b;
    } else if (part >= 0) {
        hash_drop(kv, part); /* its contents are about to change */
    }
    for (int32_t i = blocks_of(len); i < blocks_of(n_pos); i++)
        t[i] = block_alloc(kv);
    kv->len[seq] = n_pos;
    return 0;
}

int sil_kv_seq_share(struct sil_kv_cache *kv, int dst, int src, int32_t n_pos,
                     struct sil_error *err)
{
    if (!seq_in_range(kv, dst) || !seq_in_range(kv, src) || dst == src)
        return sil_errorf(err, -EINVAL, "kv cache: cannot share sequence %d into %d", src, dst);
    if (kv->len[dst] != 0 || n_pos < 0 || n_pos > kv->len[src])
        return sil_errorf(err, -EINVAL,
                          "kv cache: share of %d positions from sequence %d (length %d) into %d "
                          "(length %d)",
                          n_pos, src, kv->len[src], dst, kv->len[dst]);
    const int32_t *s = table_of(kv, src);
    int32_t *d = table_of(kv, dst);
    for (int32_t i = 0; i < blocks_of(n_pos); i++) {
        d[i] = s[i];
        kv->refs[s[i]]++;
    }
    kv->len[dst] = n_pos;
    return 0;
}

int sil_kv_seq_attach(struct sil_kv_cache *kv, int seq, int32_t block, struct sil_error *err)
{
    if (!seq_in_range(kv, seq) || block < 0 || block >= kv->n_blocks)
        return sil_errorf(err, -EINVAL, "kv cache: cannot attach block %d to sequence %d", block,
                          seq);
    const int32_t len = kv->len[seq];
    if (len % SIL_KV_BLOCK)
        return sil_errorf(err, -EINVAL, "kv cache: sequence %d ends inside a block (%d)", seq, len);
    if (len + SIL_KV_BLOCK > kv->c.n_ctx)
        return sil_errorf(err, -ENOSPC, "kv cache: sequence %d is at the context (%d)", seq,
                          kv->c.n_ctx);
    if (kv->refs[block] == 0) free_unlink(kv, block);
    kv->refs[block]++;
    table_of(kv, seq)[len / SIL_KV_BLOCK] = block;
    kv->len[seq] = len + SIL_KV_BLOCK;
    return 0;
}

int32_t sil_kv_take_copies(struct sil_kv_cache *kv, int32_t *src, int32_t *dst, int32_t max)
{
    const int32_t n = kv->n_copy < max ? kv->n_copy : max;
    for (int32_t i = 0; i < n; i++) {
        src[i] = kv->copy_src[i];
        dst[i] = kv->copy_dst[i];
    }
    if (n > 0) {
        memmove(kv->copy_src, kv->copy_src + n, sizeof(int32_t) * (size_t)(kv->n_copy - n));
        memmove(kv->copy_dst, kv->copy_dst + n, sizeof(int32_t) * (size_t)(kv->n_copy - n));
        kv->n_copy -= n;
    }
    return n;
}
