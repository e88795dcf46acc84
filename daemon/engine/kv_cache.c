#include "daemon/engine/kv_cache.h"

#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct sil_kv_cache {
    int32_t n_layer, n_seq_max, n_ctx, n_embd_k, n_embd_v;
    size_t seq_bytes; /* one sequence: [layer][K rows of n_ctx][V rows of n_ctx] */
    float **seq;      /* [n_seq_max], NULL when not allocated */
};

int sil_kv_create(struct sil_kv_cache **out, int32_t n_layer, int32_t n_seq_max, int32_t n_ctx,
                  int32_t n_embd_k, int32_t n_embd_v, struct sil_error *err)
{
    if (n_layer < 0 || n_seq_max < 1 || n_ctx < 1 || n_embd_k < 1 || n_embd_v < 1)
        return sil_errorf(err, -EINVAL, "kv cache: bad size (layers %d, seqs %d, ctx %d)", n_layer,
                          n_seq_max, n_ctx);
    struct sil_kv_cache *kv = calloc(1, sizeof(*kv));
    if (!kv || !(kv->seq = calloc((size_t)n_seq_max, sizeof(float *)))) {
        free(kv);
        return sil_errorf(err, -ENOMEM, "kv cache: out of memory");
    }
    kv->n_layer = n_layer;
    kv->n_seq_max = n_seq_max;
    kv->n_ctx = n_ctx;
    kv->n_embd_k = n_embd_k;
    kv->n_embd_v = n_embd_v;
    kv->seq_bytes = (size_t)n_layer * (size_t)n_ctx * (size_t)(n_embd_k + n_embd_v) * sizeof(float);
    *out = kv;
    return 0;
}

void sil_kv_free(struct sil_kv_cache *kv)
{
    if (!kv)
        return;
    for (int s = 0; s < kv->n_seq_max; s++)
        sil_kv_seq_release(kv, s);
    free(kv->seq);
    free(kv);
}

int sil_kv_seq_alloc(struct sil_kv_cache *kv, int seq, struct sil_error *err)
{
    if (seq < 0 || seq >= kv->n_seq_max)
        return sil_errorf(err, -EINVAL, "kv cache: sequence %d out of range", seq);
    if (kv->seq[seq] || kv->seq_bytes == 0)
        return 0;
    /* Anonymous mapping: untouched positions cost no memory. */
    void *p = mmap(NULL, kv->seq_bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return sil_errorf(err, -ENOMEM, "kv cache: cannot reserve %zu bytes for sequence %d",
                          kv->seq_bytes, seq);
    kv->seq[seq] = p;
    return 0;
}

void sil_kv_seq_release(struct sil_kv_cache *kv, int seq)
{
    if (seq < 0 || seq >= kv->n_seq_max || !kv->seq[seq])
        return;
    munmap(kv->seq[seq], kv->seq_bytes);
    kv->seq[seq] = NULL;
}

static size_t page_size(void)
{
    long ps = sysconf(_SC_PAGESIZE);
    return ps > 0 ? (size_t)ps : 4096;
}

/* Releases the whole pages of [from, to) inside one sequence's mapping. */
static void release_range(char *from, char *to)
{
    const size_t ps = page_size();
    uintptr_t a = ((uintptr_t)from + ps - 1) & ~(uintptr_t)(ps - 1);
    uintptr_t b = (uintptr_t)to & ~(uintptr_t)(ps - 1);
    if (b > a)
        madvise((void *)a, b - a, MADV_DONTNEED);
}

void sil_kv_seq_trim(struct sil_kv_cache *kv, int seq, int32_t n_pos)
{
    if (seq < 0 || seq >= kv->n_seq_max || !kv->seq[seq] || n_pos < 0 || n_pos >= kv->n_ctx)
        return;
    for (int l = 0; l < kv->n_layer; l++) {
        release_range((char *)sil_kv_k(kv, l, seq, n_pos), (char *)sil_kv_k(kv, l, seq, kv->n_ctx));
        release_range((char *)sil_kv_v(kv, l, seq, n_pos), (char *)sil_kv_v(kv, l, seq, kv->n_ctx));
    }
}

float *sil_kv_k(const struct sil_kv_cache *kv, int layer, int seq, int32_t pos)
{
    size_t per_layer = (size_t)kv->n_ctx * (size_t)(kv->n_embd_k + kv->n_embd_v);
    return kv->seq[seq] + (size_t)layer * per_layer + (size_t)pos * (size_t)kv->n_embd_k;
}

float *sil_kv_v(const struct sil_kv_cache *kv, int layer, int seq, int32_t pos)
{
    size_t per_layer = (size_t)kv->n_ctx * (size_t)(kv->n_embd_k + kv->n_embd_v);
    return kv->seq[seq] + (size_t)layer * per_layer + (size_t)kv->n_ctx * (size_t)kv->n_embd_k +
           (size_t)pos * (size_t)kv->n_embd_v;
}

int64_t sil_kv_row_stride_k(const struct sil_kv_cache *kv)
{
    return kv->n_embd_k;
}

int64_t sil_kv_row_stride_v(const struct sil_kv_cache *kv)
{
    return kv->n_embd_v;
}

static uint64_t pages_of(uint64_t bytes, uint64_t ps)
{
    return (bytes + ps - 1) / ps * ps;
}

uint64_t sil_kv_seq_bytes(const struct sil_kv_cache *kv, int32_t n_pos)
{
    if (n_pos <= 0)
        return 0;
    /* K and V of each layer are separate runs of rows; each is backed by whole pages (up to one
     * more where a run does not start on a page boundary). */
    const uint64_t ps = page_size();
    const uint64_t k = (uint64_t)n_pos * (uint64_t)kv->n_embd_k * sizeof(float);
    const uint64_t v = (uint64_t)n_pos * (uint64_t)kv->n_embd_v * sizeof(float);
    return (uint64_t)kv->n_layer * (pages_of(k, ps) + pages_of(v, ps));
}
