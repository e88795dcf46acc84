/* The paged KV cache (kv_cache.h): blocks from a fixed pool, block tables, reference counts,
 * copy on write, exhaustion as -ENOBUFS, trim, the hash hook and its LRU reuse order; and the
 * attention kernels over cached blocks (kv_attn.h): every SIMD level against the scalar ones,
 * and the scalar ones against plain float math on dequantized rows. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/engine/kv_cache.h"
#include "kernels/cpu/kv_attn.h"
#include "kernels/cpu/quants.h"

static struct sil_kv_cache *make(int32_t n_seq, int32_t n_ctx, enum sil_kv_type t, int32_t blocks)
{
    struct sil_kv_config c = {.n_layer = 2,
                              .n_seq_max = n_seq,
                              .n_ctx = n_ctx,
                              .n_embd_k = 64,
                              .n_embd_v = 64,
                              .head_dim = 32,
                              .type = t};
    struct sil_kv_cache *kv = NULL;
    struct sil_error err = {0};
    if (blocks > 0) {
        struct sil_kv_cache *probe;
        assert_int_equal(sil_kv_create(&probe, &c, &err), 0);
        c.budget = sil_kv_block_bytes(probe) * (uint64_t)blocks + 1;
        sil_kv_free(probe);
    }
    assert_int_equal(sil_kv_create(&kv, &c, &err), 0);
    return kv;
}

static void test_sizes(void **state)
{
    (void)state;
    const struct {
        enum sil_kv_type t;
        size_t row;
    } want[] = {{SIL_KV_F32, 256}, {SIL_KV_F16, 128}, {SIL_KV_Q8_0, 68}, {SIL_KV_Q4_0, 36}};
    for (size_t i = 0; i < 4; i++) {
        struct sil_kv_cache *kv = make(2, 1000, want[i].t, 0);
        assert_int_equal(sil_kv_row_bytes_k(kv), want[i].row);
        assert_int_equal(sil_kv_type_bytes(want[i].t, 64), want[i].row); /* the device's size */
        assert_int_equal(sil_kv_head_bytes(kv), want[i].row / 2);
        /* 2 layers x 64 positions x (K + V) */
        assert_int_equal(sil_kv_block_bytes(kv), 2 * 64 * 2 * want[i].row);
        assert_int_equal(sil_kv_n_blocks(kv), 2 * 16); /* default: every sequence at n_ctx */
        assert_int_equal(sil_kv_seq_bytes(kv, 65), 2 * sil_kv_block_bytes(kv));
        assert_int_equal(sil_kv_seq_bytes(kv, 0), 0);
        sil_kv_free(kv);
    }
    assert_int_equal(sil_kv_type_from_name("q4_0"), SIL_KV_Q4_0);
    assert_int_equal(sil_kv_type_from_name("q4_K"), -1);
    assert_int_equal(sil_kv_type_from_name(NULL), -1);
    /* bad configurations are errors, not crashes */
    struct sil_kv_config c = {.n_layer = 1,
                              .n_seq_max = 1,
                              .n_ctx = 64,
                              .n_embd_k = 48,
                              .n_embd_v = 48,
                              .head_dim = 24,
                              .type = SIL_KV_Q8_0};
    struct sil_kv_cache *kv = NULL;
    struct sil_error err = {0};
    assert_int_equal(sil_kv_create(&kv, &c, &err), -EINVAL); /* head 24: not whole q8_0 blocks */
    assert_non_null(strstr(err.msg, "32"));
    c.type = SIL_KV_F16;
    c.budget = 10; /* less than one block */
    assert_int_equal(sil_kv_create(&kv, &c, &err), -EINVAL);
    c.budget = 0;
    c.type = (enum sil_kv_type)9;
    assert_int_equal(sil_kv_create(&kv, &c, &err), -EINVAL);
    /* tables only (a device holds the rows): the pool is the device's n_blocks, ids below it,
     * and running out is -ENOBUFS; a host cache ignores n_blocks */
    c.type = SIL_KV_F16;
    c.n_layer = 0;
    c.n_seq_max = 4;
    c.n_ctx = 256;
    c.n_blocks = 5;
    assert_int_equal(sil_kv_create(&kv, &c, &err), 0);
    assert_int_equal(sil_kv_n_blocks(kv), 5);
    assert_int_equal(sil_kv_block_bytes(kv), 0);
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 256, &err), 0); /* 4 blocks */
    assert_int_equal(sil_kv_seq_reserve(kv, 1, 64, &err), 0);
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 1, &err), -ENOBUFS);
    int32_t n = 0;
    const int32_t *t = sil_kv_seq_table(kv, 0, &n);
    assert_int_equal(n, 4);
    for (int i = 0; i < n; i++)
        assert_true(t[i] >= 0 && t[i] < 5);
    /* a copy on write of a shared block is left for the device, in order, taken once */
    int32_t src[4], dst[4];
    assert_int_equal(sil_kv_take_copies(kv, src, dst, 4), 0);
    sil_kv_seq_trim(kv, 0, 100); /* seq 0: blocks 0, 1 (positions 64..99) */
    sil_kv_seq_release(kv, 1);
    t = sil_kv_seq_table(kv, 0, &n);
    const int32_t b1 = t[1];
    assert_int_equal(sil_kv_seq_share(kv, 2, 0, 100, &err), 0);
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 101, &err), 0); /* seq 2 writes at 100 */
    int32_t n2 = 0;
    const int32_t *t2 = sil_kv_seq_table(kv, 2, &n2);
    assert_int_not_equal(t2[1], b1);
    assert_int_equal(sil_kv_take_copies(kv, src, dst, 4), 1);
    assert_int_equal(src[0], b1);
    assert_int_equal(dst[0], t2[1]);
    assert_int_equal(sil_kv_take_copies(kv, src, dst, 4), 0);
    /* two pending, taken one at a time */
    sil_kv_seq_release(kv, 2);
    assert_int_equal(sil_kv_seq_share(kv, 2, 0, 100, &err), 0);
    assert_int_equal(sil_kv_seq_share(kv, 3, 0, 100, &err), 0);
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 101, &err), 0);
    assert_int_equal(sil_kv_seq_reserve(kv, 3, 101, &err), 0);
    const int32_t d2 = sil_kv_seq_table(kv, 2, &n2)[1], d3 = sil_kv_seq_table(kv, 3, &n2)[1];
    assert_int_equal(sil_kv_take_copies(kv, src, dst, 1), 1);
    assert_true(src[0] == b1 && dst[0] == d2);
    assert_int_equal(sil_kv_take_copies(kv, src, dst, 4), 1);
    assert_true(src[0] == b1 && dst[0] == d3);
    sil_kv_free(kv);
    c.n_layer = 1;
    assert_int_equal(sil_kv_create(&kv, &c, &err), 0);
    assert_int_equal(sil_kv_n_blocks(kv), 16); /* 4 sequences x 256 / 64 */
    sil_kv_free(kv);
}

/* Reserve takes whole blocks, distinct ones, each in its own memory; trim and release give
 * them back; running out is -ENOBUFS and changes nothing; n_ctx is -ENOSPC. */
static void test_alloc_trim_exhaust(void **state)
{
    (void)state;
    struct sil_kv_cache *kv = make(3, 256, SIL_KV_F32, 5);
    struct sil_error err = {0};
    assert_int_equal(sil_kv_n_blocks(kv), 5);
    assert_int_equal(sil_kv_n_free(kv), 5);
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 65, &err), 0);
    assert_int_equal(sil_kv_n_free(kv), 3);
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 128, &err), 0); /* still two blocks */
    assert_int_equal(sil_kv_n_free(kv), 3);
    assert_int_equal(sil_kv_seq_reserve(kv, 1, 192, &err), 0);
    assert_int_equal(sil_kv_n_free(kv), 0);
    int32_t n0, n1;
    const int32_t *t0 = sil_kv_seq_table(kv, 0, &n0), *t1 = sil_kv_seq_table(kv, 1, &n1);
    assert_int_equal(n0, 2);
    assert_int_equal(n1, 3);
    int seen[5] = {0};
    for (int i = 0; i < n0; i++)
        seen[t0[i]]++;
    for (int i = 0; i < n1; i++)
        seen[t1[i]]++;
    for (int b = 0; b < 5; b++)
        assert_int_equal(seen[b], 1);
    /* rows land in their block, and blocks do not overlap */
    for (int l = 0; l < 2; l++)
        for (int32_t p = 0; p < 128; p++) {
            ((float *)sil_kv_k(kv, l, 0, p))[63] = (float)(p + 1000 * l);
            ((float *)sil_kv_v(kv, l, 0, p))[0] = (float)-(p + 1000 * l);
        }
    for (int l = 0; l < 2; l++)
        for (int32_t p = 0; p < 192; p++) {
            ((float *)sil_kv_k(kv, l, 1, p))[63] = 7.0f;
            ((float *)sil_kv_v(kv, l, 1, p))[0] = 7.0f;
        }
    for (int l = 0; l < 2; l++)
        for (int32_t p = 0; p < 128; p++) {
            assert_true(((float *)sil_kv_k(kv, l, 0, p))[63] == (float)(p + 1000 * l));
            assert_true(((float *)sil_kv_v(kv, l, 0, p))[0] == (float)-(p + 1000 * l));
        }
    assert_ptr_equal(sil_kv_k(kv, 1, 0, 70),
                     (char *)sil_kv_block_k(kv, 1, t0[1]) + 6 * sil_kv_row_bytes_k(kv));
    /* exhausted: an error naming the shortfall, nothing changed */
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 1, &err), -ENOBUFS);
    assert_non_null(strstr(err.msg, "0 of 5 free"));
    assert_int_equal(sil_kv_seq_len(kv, 2), 0);
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 129, &err), -ENOBUFS);
    assert_int_equal(sil_kv_seq_len(kv, 0), 128);
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 257, &err), -ENOSPC);
    /* trim inside a block keeps it; below it frees it */
    sil_kv_seq_trim(kv, 1, 100);
    assert_int_equal(sil_kv_seq_len(kv, 1), 100);
    assert_int_equal(sil_kv_n_free(kv), 1);
    sil_kv_seq_trim(kv, 1, 64);
    assert_int_equal(sil_kv_n_free(kv), 2);
    sil_kv_seq_trim(kv, 1, 500); /* beyond the length: nothing */
    assert_int_equal(sil_kv_seq_len(kv, 1), 64);
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 128, &err), 0);
    assert_int_equal(sil_kv_n_free(kv), 0);
    sil_kv_seq_release(kv, 0);
    sil_kv_seq_release(kv, 1);
    sil_kv_seq_release(kv, 2);
    assert_int_equal(sil_kv_n_free(kv), 5);
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 5 * 64, &err), -ENOSPC);
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 4 * 64, &err), 0);
    /* out-of-range sequences */
    assert_int_equal(sil_kv_seq_reserve(kv, 3, 1, &err), -EINVAL);
    assert_int_equal(sil_kv_seq_reserve(kv, -1, 1, &err), -EINVAL);
    sil_kv_seq_trim(kv, 9, 0);
    sil_kv_seq_release(kv, -1);
    sil_kv_free(kv);
}

/* Sharing: both sequences see the same blocks, each counted once per holder; a write into a
 * shared partial block copies it (the other keeps its rows); the last reference frees. */
static void test_share_refcount_cow(void **state)
{
    (void)state;
    struct sil_kv_cache *kv = make(3, 512, SIL_KV_F16, 6);
    struct sil_error err = {0};
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 100, &err), 0);
    for (int32_t p = 0; p < 100; p++)
        ((uint16_t *)sil_kv_k(kv, 1, 0, p))[5] = (uint16_t)p;
    assert_int_equal(sil_kv_seq_share(kv, 1, 0, 100, &err), 0);
    assert_int_equal(sil_kv_seq_share(kv, 1, 0, 10, &err), -EINVAL);  /* dst not empty */
    assert_int_equal(sil_kv_seq_share(kv, 2, 0, 101, &err), -EINVAL); /* past src */
    int32_t n0, n1;
    const int32_t *t0 = sil_kv_seq_table(kv, 0, &n0), *t1 = sil_kv_seq_table(kv, 1, &n1);
    assert_int_equal(n1, 2);
    assert_int_equal(t0[0], t1[0]);
    assert_int_equal(t0[1], t1[1]);
    assert_int_equal(sil_kv_block_refs(kv, t0[0]), 2);
    assert_int_equal(sil_kv_n_free(kv), 4);
    const int32_t shared_tail = t0[1];
    /* seq 1 grows into the shared partial block: it gets its own copy */
    assert_int_equal(sil_kv_seq_reserve(kv, 1, 101, &err), 0);
    t1 = sil_kv_seq_table(kv, 1, &n1);
    assert_int_not_equal(t1[1], shared_tail);
    assert_int_equal(t1[0], t0[0]);
    assert_int_equal(sil_kv_block_refs(kv, shared_tail), 1);
    assert_int_equal(sil_kv_block_refs(kv, t1[1]), 1);
    assert_int_equal(sil_kv_n_free(kv), 3);
    for (int32_t p = 0; p < 100; p++) /* the copy has every layer's rows */
        assert_int_equal(((uint16_t *)sil_kv_k(kv, 1, 1, p))[5], (uint16_t)p);
    ((uint16_t *)sil_kv_k(kv, 1, 1, 100))[5] = 999;
    ((uint16_t *)sil_kv_k(kv, 1, 1, 99))[5] = 998;
    assert_int_equal(((uint16_t *)sil_kv_k(kv, 1, 0, 99))[5], 99); /* seq 0 unchanged */
    /* a write into a full shared block is never needed: growing past 128 takes a new block */
    sil_kv_seq_release(kv, 0);
    assert_int_equal(sil_kv_block_refs(kv, t1[0]), 1);
    assert_int_equal(sil_kv_n_free(kv), 4);
    sil_kv_seq_release(kv, 1);
    assert_int_equal(sil_kv_n_free(kv), 6);
    /* cow needs a free block too: with none, -ENOBUFS and nothing changes */
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 5 * 64 + 10, &err), 0);
    assert_int_equal(sil_kv_seq_share(kv, 1, 0, 5 * 64 + 10, &err), 0);
    assert_int_equal(sil_kv_n_free(kv), 0);
    assert_int_equal(sil_kv_seq_reserve(kv, 1, 5 * 64 + 11, &err), -ENOBUFS);
    assert_int_equal(sil_kv_seq_len(kv, 1), 5 * 64 + 10);
    /* trimming the sharer to a block boundary drops only its references */
    sil_kv_seq_trim(kv, 1, 64);
    assert_int_equal(sil_kv_n_free(kv), 0);
    assert_int_equal(sil_kv_seq_reserve(kv, 1, 65, &err), -ENOBUFS); /* block 1 is seq 0's */
    sil_kv_seq_release(kv, 0);
    assert_int_equal(sil_kv_n_free(kv), 5);
    assert_int_equal(sil_kv_seq_reserve(kv, 1, 65, &err), 0);
    sil_kv_free(kv);
}

/* The prefix-cache hook: a hashed block survives its last reference as a cached block, found by
 * lookup and attached again; the pool reuses plain free blocks before cached ones, cached ones
 * oldest first, and a reused one is no longer found. */
static void test_hash_lru(void **state)
{
    (void)state;
    struct sil_kv_cache *kv = make(4, 512, SIL_KV_Q8_0, 4);
    struct sil_error err = {0};
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 128, &err), 0);
    int32_t n;
    const int32_t *t = sil_kv_seq_table(kv, 0, &n);
    const int32_t b0 = t[0], b1 = t[1];
    sil_kv_block_set_hash(kv, b0, 0xabc);
    sil_kv_block_set_hash(kv, b1, 0xabc + 4 * 1024); /* same bucket chain */
    assert_int_equal(sil_kv_block_lookup(kv, 0xabc), b0);
    assert_int_equal(sil_kv_block_lookup(kv, 0xabc + 4 * 1024), b1);
    assert_int_equal(sil_kv_block_lookup(kv, 0x123), -1);
    sil_kv_seq_release(kv, 0); /* b0 then b1 freed, both cached */
    assert_int_equal(sil_kv_n_free(kv), 4);
    assert_int_equal(sil_kv_block_lookup(kv, 0xabc), b0);
    /* a hit: attach the cached block to a new sequence */
    assert_int_equal(sil_kv_seq_attach(kv, 1, b0, &err), 0);
    assert_int_equal(sil_kv_seq_len(kv, 1), 64);
    assert_int_equal(sil_kv_block_refs(kv, b0), 1);
    assert_int_equal(sil_kv_n_free(kv), 3);
    /* the two plain blocks go first, then the cached b1 (which loses its hash) */
    assert_int_equal(sil_kv_seq_reserve(kv, 2, 128, &err), 0);
    t = sil_kv_seq_table(kv, 2, &n);
    assert_true(t[0] != b1 && t[1] != b1 && t[0] != b0 && t[1] != b0);
    assert_int_equal(sil_kv_block_lookup(kv, 0xabc + 4 * 1024), b1);
    assert_int_equal(sil_kv_seq_reserve(kv, 3, 1, &err), 0);
    t = sil_kv_seq_table(kv, 3, &n);
    assert_int_equal(t[0], b1);
    assert_int_equal(sil_kv_block_lookup(kv, 0xabc + 4 * 1024), -1);
    assert_int_equal(sil_kv_block_lookup(kv, 0xabc), b0);
    /* attach rules: whole blocks only, in range */
    assert_int_equal(sil_kv_seq_attach(kv, 3, b0, &err), -EINVAL); /* seq 3 ends mid-block */
    assert_int_equal(sil_kv_seq_attach(kv, 1, 99, &err), -EINVAL);
    assert_int_equal(sil_kv_seq_attach(kv, 1, b0, &err), 0); /* the same block twice: 2 refs */
    assert_int_equal(sil_kv_block_refs(kv, b0), 2);
    sil_kv_seq_trim(kv, 1, 64);
    assert_int_equal(sil_kv_block_refs(kv, b0), 1);
    /* writing into a hashed block that only this sequence holds: in place, and its hash goes */
    sil_kv_seq_trim(kv, 1, 40);
    assert_int_equal(sil_kv_n_free(kv), 0);
    assert_int_equal(sil_kv_seq_reserve(kv, 1, 41, &err), 0);
    assert_int_equal(sil_kv_seq_table(kv, 1, &n)[0], b0);
    assert_int_equal(sil_kv_block_lookup(kv, 0xabc), -1);
    sil_kv_free(kv);
}

/* Pages of [p, p + bytes) resident in memory (mincore). */
static size_t resident_pages(const void *p, size_t bytes)
{
    const size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)p & ~(uintptr_t)(ps - 1);
    uintptr_t b = ((uintptr_t)p + bytes + ps - 1) & ~(uintptr_t)(ps - 1);
    size_t n = (b - a) / ps, r = 0;
    unsigned char *vec = malloc(n);
    assert_int_equal(mincore((void *)a, b - a, vec), 0);
    for (size_t i = 0; i < n; i++)
        r += vec[i] & 1;
    free(vec);
    return r;
}

/* Memory follows what sequences hold: untouched blocks cost nothing, written ones are backed,
 * a freed block's pages go back (and read as zeros); a cached (hashed) free block keeps its. */
static void test_pages(void **state)
{
    (void)state;
    struct sil_kv_cache *kv = make(2, 512, SIL_KV_F32, 4); /* 32 KiB a block and layer */
    struct sil_error err = {0};
    const size_t lb = 64 * (sil_kv_row_bytes_k(kv) + sil_kv_row_bytes_v(kv));
    assert_int_equal(lb, 32768);
    assert_int_equal(sil_kv_seq_reserve(kv, 0, 128, &err), 0);
    int32_t n;
    const int32_t b0 = sil_kv_seq_table(kv, 0, &n)[0], b1 = sil_kv_seq_table(kv, 0, &n)[1];
    assert_int_equal(resident_pages(sil_kv_block_k(kv, 1, b0), lb), 0);
    for (int l = 0; l < 2; l++)
        for (int32_t p = 0; p < 128; p++) {
            memset(sil_kv_k(kv, l, 0, p), 0x3f, sil_kv_row_bytes_k(kv));
            memset(sil_kv_v(kv, l, 0, p), 0x3f, sil_kv_row_bytes_v(kv));
        }
    const size_t full = lb / (size_t)sysconf(_SC_PAGESIZE);
    assert_int_equal(resident_pages(sil_kv_block_k(kv, 1, b0), lb), full);
    sil_kv_block_set_hash(kv, b0, 77);
    sil_kv_seq_trim(kv, 0, 64); /* b1 freed: its pages go */
    assert_int_equal(resident_pages(sil_kv_block_k(kv, 0, b1), lb), 0);
    assert_int_equal(resident_pages(sil_kv_block_k(kv, 1, b1), lb), 0);
    assert_int_equal(resident_pages(sil_kv_block_k(kv, 1, b0), lb), full);
    sil_kv_seq_release(kv, 0); /* b0 is cached: its rows stay */
    assert_int_equal(resident_pages(sil_kv_block_k(kv, 1, b0), lb), full);
    assert_int_equal(((uint8_t *)sil_kv_block_v(kv, 1, b0))[5], 0x3f);
    /* a block freed and taken again reads as zeros */
    assert_int_equal(sil_kv_seq_reserve(kv, 1, 1, &err), 0);
    assert_int_equal(sil_kv_seq_table(kv, 1, &n)[0], b1);
    assert_int_equal(((uint8_t *)sil_kv_k(kv, 1, 1, 0))[0], 0);
    sil_kv_free(kv);
}

/* ---- kernels -----------------------------------------------------------------------------------
 */

static uint32_t rng = 12345;
static float frand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* n rows of hd elements of type t, stride bytes apart, from random floats; also their
 * dequantized values. */
static void fill_rows(int t, int n, int hd, size_t stride, void *rows, float *deq)
{
    float *x = malloc(sizeof(float) * (size_t)hd);
    for (int r = 0; r < n; r++) {
        for (int j = 0; j < hd; j++)
            x[j] = 3.0f * frand();
        void *dst = (char *)rows + (size_t)r * stride;
        sil_quantize_row_ref(t, x, dst, hd);
        sil_dequantize_row(t, dst, deq + (size_t)r * hd, hd);
    }
    free(x);
}

/* Scores and V sums of every type: scalar against float math on the dequantized rows (and on
 * the q8_0 query for the quantized K types), every SIMD level against scalar. Partial blocks
 * (n < 64) and a stride wider than one head, as inside a row of two heads. */
static void test_kernels(void **state)
{
    (void)state;
    const int types[] = {SIL_TYPE_F32, SIL_TYPE_F16, SIL_TYPE_Q8_0, SIL_TYPE_Q4_0};
    const int hds[] = {64, 128, 96};
    const enum sil_cpu_level top = sil_cpu_detected_level();
    for (size_t ti = 0; ti < 4; ti++)
        for (size_t hi = 0; hi < 3; hi++) {
            const int t = types[ti], hd = hds[hi], n = hi == 2 ? 37 : 64;
            const size_t head = sil_row_size(t, hd), stride = 2 * head;
            void *rows = calloc((size_t)n, stride);
            float *deq = malloc(sizeof(float) * (size_t)n * hd);
            fill_rows(t, n, hd, stride, rows, deq);
            float q[128], qdq[128], p[64];
            uint8_t qq[4 * 34];
            for (int j = 0; j < hd; j++)
                q[j] = frand();
            sil_quantize_row_ref(SIL_TYPE_Q8_0, q, qq, hd);
            sil_dequantize_row(SIL_TYPE_Q8_0, qq, qdq, hd);
            for (int i = 0; i < n; i++)
                p[i] = 0.5f + frand() * 0.4f;
            float s_ref[64], s_lvl[64], o_ref[128], o_lvl[128];
            sil_cpu_force_level(SIL_CPU_SCALAR);
            const struct sil_kv_kernels *k = sil_kv_kernels(t);
            assert_non_null(k);
            assert_int_equal(k->q8_query, t == SIL_TYPE_Q8_0 || t == SIL_TYPE_Q4_0);
            const float *qm = k->q8_query ? qdq : q;
            k->scores(q, qq, rows, stride, n, hd, 0.125f, s_ref);
            for (int i = 0; i < n; i++) {
                double d = 0;
                for (int j = 0; j < hd; j++)
                    d += (double)qm[j] * deq[(size_t)i * hd + j];
                assert_true(fabs(s_ref[i] - 0.125 * d) <= 1e-4 * (1 + fabs(d)));
            }
            for (int j = 0; j < hd; j++)
                o_ref[j] = o_lvl[j] = 0.25f;
            k->accum(o_ref, p, rows, stride, n, hd);
            for (int j = 0; j < hd; j++) {
                double d = 0.25;
                for (int i = 0; i < n; i++)
                    d += (double)p[i] * deq[(size_t)i * hd + j];
                assert_true(fabs(o_ref[j] - d) <= 1e-4 * (1 + fabs(d)));
            }
            for (int lvl = SIL_CPU_AVX2; lvl <= (int)top; lvl++) {
                sil_cpu_force_level((enum sil_cpu_level)lvl);
                const struct sil_kv_kernels *kl = sil_kv_kernels(t);
                kl->scores(q, qq, rows, stride, n, hd, 0.125f, s_lvl);
                kl->accum(o_lvl, p, rows, stride, n, hd);
                for (int i = 0; i < n; i++)
                    assert_true(fabsf(s_lvl[i] - s_ref[i]) <= 1e-5f * (1 + fabsf(s_ref[i])));
                for (int j = 0; j < hd; j++) {
                    assert_true(fabsf(o_lvl[j] - o_ref[j]) <= 1e-5f * (1 + fabsf(o_ref[j])));
                    o_lvl[j] = 0.25f;
                }
            }
            sil_cpu_force_level(top);
            free(rows);
            free(deq);
        }
    assert_null(sil_kv_kernels(SIL_TYPE_Q4_K));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_alloc_trim_exhaust),
        cmocka_unit_test(test_share_refcount_cow),
        cmocka_unit_test(test_hash_lru),
        cmocka_unit_test(test_pages),
        cmocka_unit_test(test_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
