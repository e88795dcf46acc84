/* The CUDA backend's ops: weights (views of device memory, their type's kernels) and the
 * launches of kernels.cu's kernels: quantize, matvec and matmul in each type, norms, element-wise
 * ops, rope, routing, argmax, and the MoE kernels. Contract in cuda_backend.h. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"

static int mv_slot(int type)
{
    for (int t = 0; t < MV_COUNT; t++)
        if (mv_types[t] == type) return t;
    return -1;
}

bool sil_cuda_type_supported(int type)
{
    return mv_slot(type) >= 0;
}

int sil_cuda_weight_view(int type, int64_t rows, int64_t cols, sil_cuda_ptr data,
                         struct sil_cuda_weight *out, struct sil_error *err)
{
    memset(out, 0, sizeof *out);
    if (!sil_cuda_type_supported(type))
        return set_err(err, -ENOTSUP, "cuda: weight type %s has no CUDA kernel",
                       sil_type_name(type));
    const size_t row_bytes = sil_row_size(type, cols);
    if (rows <= 0 || rows > INT32_MAX || cols <= 0 || row_bytes == 0)
        return set_err(err, -EINVAL, "cuda: weight of %lld x %lld %s: bad shape", (long long)rows,
                       (long long)cols, sil_type_name(type));
    if ((uint64_t)rows > SIZE_MAX / row_bytes)
        return set_err(err, -EOVERFLOW, "cuda: weight of %lld rows of %zu bytes overflows",
                       (long long)rows, row_bytes);
    if (data % 16 != 0)
        return set_err(err, -EINVAL, "cuda: weight data at 0x%llx is not 16-byte aligned",
                       (unsigned long long)data);
    *out = (struct sil_cuda_weight){.type = type,
                                    .rows = rows,
                                    .cols = cols,
                                    .row_bytes = row_bytes,
                                    .bytes = (size_t)rows * row_bytes,
                                    .data = data};
    return 0;
}

int sil_cuda_weight_upload(struct sil_cuda *cu, int type, int64_t rows, int64_t cols,
                           const void *src, size_t bytes, struct sil_cuda_weight *out,
                           struct sil_error *err)
{
    int rc = sil_cuda_weight_view(type, rows, cols, 0, out, err);
    if (rc < 0) return rc;
    if (bytes != out->bytes)
        return set_err(err, -EINVAL, "cuda: weight of %lld x %lld %s is %zu bytes, given %zu",
                       (long long)rows, (long long)cols, sil_type_name(type), out->bytes, bytes);
    rc = sil_cuda_alloc(cu, out->bytes, &out->data, err);
    if (rc < 0) return rc;
    rc = sil_cuda_upload(cu, out->data, src, bytes, NULL, err);
    if (rc == 0) rc = sil_cuda_sync(cu, NULL, err);
    if (rc < 0) {
        sil_cuda_release(cu, out->data);
        out->data = 0;
        return rc;
    }
    out->owned = true;
    return 0;
}

void sil_cuda_weight_free(struct sil_cuda *cu, struct sil_cuda_weight *w)
{
    if (w->owned) sil_cuda_release(cu, w->data);
    memset(w, 0, sizeof *w);
}

/* Grid dimension x is limited to 2^31 - 1 blocks. */
static int grid_of(int64_t items, int64_t per_block, unsigned *g, struct sil_error *err)
{
    const int64_t n = (items + per_block - 1) / per_block;
    if (n <= 0 || n > INT32_MAX)
        return set_err(err, -EINVAL, "cuda: %lld work items out of range", (long long)items);
    *g = (unsigned)n;
    return 0;
}

size_t sil_cuda_q8_bytes(int64_t n, int64_t k)
{
    return (size_t)(n * (k / SIL_CUDA_Q8_BLOCK)) * SIL_CUDA_Q8_BLOCK_BYTES;
}

int sil_cuda_quantize_q8(struct sil_cuda *cu, sil_cuda_ptr x, int64_t n, int64_t k, sil_cuda_ptr q8,
                         struct sil_cuda_stream *s, struct sil_error *err)
{
    if (n <= 0 || k <= 0 || k % SIL_CUDA_Q8_BLOCK != 0)
        return set_err(err, -EINVAL, "cuda: quantize of %lld x %lld: k must be a multiple of 32",
                       (long long)n, (long long)k);
    int64_t nblocks = n * k / SIL_CUDA_Q8_BLOCK;
    unsigned g = 0;
    int rc = grid_of(nblocks, 8, &g, err);
    if (rc < 0) return rc;
    void *p[] = {&x, &nblocks, &q8};
    return launch(cu, cu->k[K_QUANTIZE], "quantize_q8_1", g, 1, 256, s, p, err);
}

/* The float matvec reads 8 columns at a time when rows and input are 16-byte aligned. */
static int mmvf_vec(const struct sil_cuda_weight *w, sil_cuda_ptr x)
{
    return w->cols % 8 == 0 && w->row_bytes % 16 == 0 && w->data % 16 == 0 && x % 16 == 0;
}

int sil_cuda_matvec(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr x,
                    sil_cuda_ptr q8, int n, sil_cuda_ptr y, int64_t ldy, struct sil_cuda_stream *s,
                    struct sil_error *err)
{
    const int slot = mv_slot(w->type);
    if (slot < 0 || !w->data)
        return set_err(err, -EINVAL, "cuda: matvec on an empty or unsupported weight");
    if (n < 1 || n > SIL_CUDA_MAX_BATCH || ldy < w->rows)
        return set_err(err, -EINVAL, "cuda: matvec batch %d (1..%d), ldy %lld < rows %lld", n,
                       SIL_CUDA_MAX_BATCH, (long long)ldy, (long long)w->rows);
    /* 4 warps a block; the quantized kernels take 2 rows a warp from batch 2 on (mmvq.cuh) */
    unsigned g = 0;
    int rc = grid_of(w->rows, slot < MV_F32 && n >= 2 ? 8 : 4, &g, err);
    if (rc < 0) return rc;
    uint64_t row_bytes = w->row_bytes;
    int rows = (int)w->rows;
    if (slot >= MV_F32) {
        if (!x)
            return set_err(err, -EINVAL, "cuda: matvec on %s needs the F32 input",
                           sil_type_name(w->type));
        int64_t cols = w->cols;
        int vec = mmvf_vec(w, x);
        void *p[] = {(void *)&w->data, &row_bytes, &rows, &cols, &vec, &x, &y, &ldy};
        cu->prof_bytes = w->bytes;
        return launch(cu, cu->mv[slot][n - 1], cu->what[W_MATVEC][slot], g, 1, 128, s, p, err);
    }
    if (!q8)
        return set_err(err, -EINVAL, "cuda: matvec on %s needs the q8 input",
                       sil_type_name(w->type));
    int units = (int)(w->cols / SIL_CUDA_Q8_BLOCK);
    void *p[] = {(void *)&w->data, &row_bytes, &rows, &units, &q8, &y, &ldy};
    cu->prof_bytes = w->bytes;
    return launch(cu, cu->mv[slot][n - 1], cu->what[W_MATVEC][slot], g, 1, 128, s, p, err);
}

/* The kernel's struct sil_mv_set (mmvq.cuh), field for field. */
struct mv_set {
    uint64_t w[SIL_CUDA_MV_SET_MAX];
    uint64_t row_bytes[SIL_CUDA_MV_SET_MAX];
    int32_t rows[SIL_CUDA_MV_SET_MAX];
    uint64_t y[SIL_CUDA_MV_SET_MAX];
    int64_t ldy[SIL_CUDA_MV_SET_MAX];
    int32_t blk0[SIL_CUDA_MV_SET_MAX + 1];
    int32_t n;
    int32_t type[SIL_CUDA_MV_SET_MAX]; /* the weights' slots (sil_cuda_wt), for mixed sets */
};

bool sil_cuda_mv_mixable(int type)
{
    return type == SIL_TYPE_Q4_K || type == SIL_TYPE_Q5_K || type == SIL_TYPE_Q6_K ||
           type == SIL_TYPE_Q8_0;
}

/* The kernel's struct sil_conv_ep (mmvq.cuh), field for field. */
struct conv_ep {
    uint64_t out;
    int64_t ldo;
    uint64_t w;
    uint64_t run_seq;
    uint64_t seq_state;
    int64_t cd;
    int64_t offset;
    int32_t K;
    int32_t pad;
};

static int matvec_set(struct sil_cuda *cu, const struct sil_cuda_weight *const *w, int nw,
                      sil_cuda_ptr q8, int n, const sil_cuda_ptr *y, const int64_t *ldy,
                      const struct sil_cuda_conv_ep *ep, struct sil_cuda_stream *s,
                      struct sil_error *err)
{
    if (nw < 1 || nw > SIL_CUDA_MV_SET_MAX || n < 1 || n > SIL_CUDA_MAX_BATCH || !q8)
        return set_err(err, -EINVAL, "cuda: matvec of %d weights, batch %d", nw, n);
    const int slot = mv_slot(w[0]->type);
    if (slot < 0 || slot >= MV_F32)
        return set_err(err, -EINVAL, "cuda: a matvec set needs quantized weights");
    bool mixed = false, mixable = true;
    for (int k = 0; k < nw; k++) {
        mixed = mixed || w[k]->type != w[0]->type;
        mixable = mixable && sil_cuda_mv_mixable(w[k]->type);
    }
    if (mixed && !mixable)
        return set_err(err, -EINVAL, "cuda: a matvec set mixes types other than q4_K, q5_K, "
                                     "q6_K and q8_0");
    struct mv_set set;
    memset(&set, 0, sizeof set);
    const int per_block = n >= 2 ? 8 : 4;
    int64_t blocks = 0;
    for (int k = 0; k < nw; k++) {
        if (w[k]->cols != w[0]->cols || !w[k]->data || ldy[k] < w[k]->rows)
            return set_err(err, -EINVAL, "cuda: a matvec set of mixed widths");
        set.type[k] = mv_slot(w[k]->type);
        set.w[k] = w[k]->data;
        set.row_bytes[k] = w[k]->row_bytes;
        set.rows[k] = (int32_t)w[k]->rows;
        set.y[k] = y[k];
        set.ldy[k] = ldy[k];
        set.blk0[k] = (int32_t)blocks;
        blocks += (w[k]->rows + per_block - 1) / per_block;
        cu->prof_bytes += w[k]->bytes;
    }
    set.blk0[nw] = (int32_t)blocks;
    set.n = nw;
    if (blocks > INT32_MAX) return set_err(err, -EINVAL, "cuda: matvec set too large");
    int units = (int)(w[0]->cols / SIL_CUDA_Q8_BLOCK);
    if (ep) {
        if (!mixable || ep->K < 1 || ep->K > 9 || !ep->out || !ep->w || !ep->run_seq ||
            !ep->seq_state || ep->ldo < w[0]->rows)
            return set_err(err, -EINVAL, "cuda: a matvec set with the conv1d epilogue");
        struct conv_ep e = {ep->out,     ep->ldo,    ep->w,     ep->run_seq, ep->seq_state,
                            w[0]->rows, ep->offset, ep->K,     0};
        void *pc[] = {&set, &units, &q8, &e};
        return launch(cu, cu->mvxc[n - 1], "matvec set mixed + conv1d", (unsigned)blocks, 1, 128,
                      s, pc, err);
    }
    void *p[] = {&set, &units, &q8};
    if (mixed)
        return launch(cu, cu->mvx[n - 1], "matvec set mixed", (unsigned)blocks, 1, 128, s, p,
                      err);
    return launch(cu, cu->mvm[slot][n - 1], cu->what[W_MATVEC][slot], (unsigned)blocks, 1, 128, s,
                  p, err);
}

int sil_cuda_matvec_multi(struct sil_cuda *cu, const struct sil_cuda_weight *const *w, int nw,
                          sil_cuda_ptr q8, int n, const sil_cuda_ptr *y, const int64_t *ldy,
                          struct sil_cuda_stream *s, struct sil_error *err)
{
    return matvec_set(cu, w, nw, q8, n, y, ldy, NULL, s, err);
}

int sil_cuda_matvec_multi_conv(struct sil_cuda *cu, const struct sil_cuda_weight *const *w,
                               int nw, sil_cuda_ptr q8, int n, const sil_cuda_ptr *y,
                               const int64_t *ldy, const struct sil_cuda_conv_ep *ep,
                               struct sil_cuda_stream *s, struct sil_error *err)
{
    if (!ep) return set_err(err, -EINVAL, "cuda: a conv1d epilogue without its arguments");
    return matvec_set(cu, w, nw, q8, n, y, ldy, ep, s, err);
}

int sil_cuda_set_grouped_bn(struct sil_cuda *cu, int bn, struct sil_error *err)
{
    if (bn != 0 && bn != 16 && bn != 32 && bn != 64)
        return set_err(err, -EINVAL, "cuda: grouped tiles of %d rows: 16, 32, 64 or 0", bn);
    cu->grouped_bn = bn;
    return 0;
}

int sil_cuda_set_mma(struct sil_cuda *cu, int sm, struct sil_error *err)
{
    if (sm == 0) sm = cu->mma_best;
    if (sm != 75 && sm != 80)
        return set_err(err, -EINVAL, "cuda: mma path sm_%d: 75, 80 or 0 (the best)", sm);
    if (sm > cu->mma_best)
        return set_err(err, -ENOTSUP, "cuda: mma path sm_%d needs sm_80+ SASS (%s, sm_%d%d)", sm,
                       cu->info.ptx_jit ? "PTX through the JIT" : "SASS", cu->info.cc_major,
                       cu->info.cc_minor);
    cu->mma_sm = sm;
    return 0;
}

int sil_cuda_get_mma(const struct sil_cuda *cu)
{
    return cu->mma_sm;
}

int sil_cuda_matmul(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr x,
                    sil_cuda_ptr q8, int n, sil_cuda_ptr y, int64_t ldy, struct sil_cuda_stream *s,
                    struct sil_error *err)
{
    const int slot = mv_slot(w->type);
    if (slot < 0 || !w->data)
        return set_err(err, -EINVAL, "cuda: matmul on an empty or unsupported weight");
    /* grid y counts tiles of 64 activation rows and is limited to 65535 */
    if (n < 1 || n > 65535 * 64 || ldy < w->rows)
        return set_err(err, -EINVAL, "cuda: matmul of %d rows (1..%d), ldy %lld < rows %lld", n,
                       65535 * 64, (long long)ldy, (long long)w->rows);
    const unsigned gx = (unsigned)((w->rows + 63) / 64), gy = (unsigned)((n + 63) / 64);
    uint64_t row_bytes = w->row_bytes;
    int rows = (int)w->rows;
    if (slot >= MV_F32) {
        if (!x)
            return set_err(err, -EINVAL, "cuda: matmul on %s needs the F32 input",
                           sil_type_name(w->type));
        int64_t cols = w->cols;
        void *p[] = {(void *)&w->data, &row_bytes, &rows, &cols, &x, &n, &y, &ldy};
        cu->prof_bytes = w->bytes;
        /* 64 x 64 tiles where they fill the SMs twice over, else a warp per 4 x 8 products */
        if ((uint64_t)gx * gy < 2 * (uint64_t)(cu->info.sm_count > 0 ? cu->info.sm_count : 1))
            return sil_cu_launch(cu, cu->mmf_thin[slot - MV_F32], cu->what[W_MATMUL][slot],
                                 (unsigned)((w->rows + SIL_CUDA_MMF_TR - 1) / SIL_CUDA_MMF_TR),
                                 (unsigned)((n + 63) / 64), 1, 256, s, p, err);
        return sil_cu_launch(cu, cu->mmf[slot - MV_F32], cu->what[W_MATMUL][slot], gx, gy, 1, 256,
                             s, p, err);
    } else {
        if (!q8)
            return set_err(err, -EINVAL, "cuda: matmul on %s needs the q8 input",
                           sil_type_name(w->type));
        int units = (int)(w->cols / SIL_CUDA_Q8_BLOCK);
        void *p[] = {(void *)&w->data, &row_bytes, &rows, &units, &q8, &n, &y, &ldy};
        cu->prof_bytes = w->bytes;
        return sil_cu_launch(cu, cu->mmq[slot][cu->mma_sm >= 80], cu->what[W_MATMUL][slot], gx,
                             gy, 1, 128, s, p, err);
    }
}

int sil_cuda_matmul_grouped(struct sil_cuda *cu, const struct sil_cuda_weight *w, size_t mat_bytes,
                            sil_cuda_ptr q8, int a_rows, sil_cuda_ptr grp_mat,
                            sil_cuda_ptr grp_start, int n_groups, int max_rows, sil_cuda_ptr y,
                            int64_t ldy, struct sil_cuda_stream *s, struct sil_error *err)
{
    const int slot = mv_slot(w->type);
    if (slot < 0 || slot >= MV_F32 || !w->data || !q8)
        return set_err(err, -EINVAL, "cuda: grouped matmul needs a quantized weight and q8 input");
    if (n_groups < 1 || n_groups > 65535 || max_rows < 1 || max_rows > 65535 * 64 ||
        max_rows > a_rows || ldy < w->rows || mat_bytes < w->bytes)
        return set_err(err, -EINVAL, "cuda: grouped matmul of %d groups, %d of %d rows", n_groups,
                       max_rows, a_rows);
    /* activation rows a block: the rows an expert gets on average, rounded up to 16, 32 or 64
     * (a 64-row tile over a 16-row group multiplies and scales zeros three quarters of the
     * time); the products are the same bits whichever */
    const int avg = (a_rows + n_groups - 1) / n_groups;
    const int bn = cu->grouped_bn ? cu->grouped_bn : avg <= 16 ? 16 : avg <= 32 ? 32 : 64;
    const int bi = bn == 16 ? 0 : bn == 32 ? 1 : 2;
    const unsigned gx = (unsigned)((w->rows + 63) / 64), gy = (unsigned)((max_rows + bn - 1) / bn);
    if (gy > 65535)
        return set_err(err, -EINVAL, "cuda: grouped matmul of %d rows a group in tiles of %d",
                       max_rows, bn);
    uint64_t row_bytes = w->row_bytes, mb = mat_bytes;
    int rows = (int)w->rows, units = (int)(w->cols / SIL_CUDA_Q8_BLOCK);
    void *p[] = {(void *)&w->data, &mb,      &row_bytes, &rows, &units, &q8,
                 &a_rows,          &grp_mat, &grp_start, &y,    &ldy};
    cu->prof_bytes = w->bytes * (uint64_t)n_groups;
    return sil_cu_launch(cu, cu->mmq_grp[slot][cu->mma_sm >= 80][bi], cu->what[W_MATMUL][slot],
                         gx, gy, (unsigned)n_groups, 128, s, p, err);
}

int sil_cuda_rmsnorm(struct sil_cuda *cu, sil_cuda_ptr y, sil_cuda_ptr x, sil_cuda_ptr w,
                     int64_t rows, int64_t n, float eps, struct sil_cuda_stream *s,
                     struct sil_error *err)
{
    if (rows <= 0 || rows > INT32_MAX || n <= 0)
        return set_err(err, -EINVAL, "cuda: rmsnorm of %lld x %lld", (long long)rows, (long long)n);
    void *p[] = {&y, &x, &w, &n, &eps};
    return launch(cu, cu->k[K_RMSNORM], "rmsnorm", (unsigned)rows, 1, 256, s, p, err);
}

int sil_cuda_add(struct sil_cuda *cu, sil_cuda_ptr y, sil_cuda_ptr x, int64_t n,
                 struct sil_cuda_stream *s, struct sil_error *err)
{
    unsigned g = 0;
    int rc = grid_of(n, 256, &g, err);
    if (rc < 0) return rc;
    void *p[] = {&y, &x, &n};
    return launch(cu, cu->k[K_ADD], "add", g, 1, 256, s, p, err);
}

int sil_cuda_swiglu(struct sil_cuda *cu, sil_cuda_ptr out, sil_cuda_ptr gate, sil_cuda_ptr up,
                    int64_t n, struct sil_cuda_stream *s, struct sil_error *err)
{
    unsigned g = 0;
    int rc = grid_of(n, 256, &g, err);
    if (rc < 0) return rc;
    void *p[] = {&out, &gate, &up, &n};
    return launch(cu, cu->k[K_SWIGLU], "swiglu", g, 1, 256, s, p, err);
}

int sil_cuda_rope_neox(struct sil_cuda *cu, sil_cuda_ptr x, int n_tok, int n_head, int head_dim,
                       int n_rot, sil_cuda_ptr pos, float freq_base, struct sil_cuda_stream *s,
                       struct sil_error *err)
{
    if (n_tok <= 0 || n_tok > 65535 || n_head <= 0 || n_rot <= 0 || n_rot % 2 || n_rot > head_dim)
        return set_err(err, -EINVAL, "cuda: rope of %d tokens, %d heads, n_rot %d of %d", n_tok,
                       n_head, n_rot, head_dim);
    /* The same powf as the CPU backend, so both build the same angles. */
    float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    int half = n_rot / 2;
    void *p[] = {&x, &n_head, &head_dim, &n_rot, &pos, &theta_scale};
    return launch(cu, cu->k[K_ROPE], "rope_neox", (unsigned)n_head, (unsigned)n_tok,
                  half < 128 ? (unsigned)((half + 31) / 32 * 32) : 128u, s, p, err);
}

int sil_cuda_router_topk(struct sil_cuda *cu, sil_cuda_ptr logits, int n_tok, int n_expert, int k,
                         sil_cuda_ptr ids, sil_cuda_ptr weights, struct sil_cuda_stream *s,
                         struct sil_error *err)
{
    if (n_tok <= 0 || n_expert <= 0 || n_expert > 1024 || k <= 0 || k > 32 || k > n_expert)
        return set_err(err, -EINVAL, "cuda: router of %d tokens, %d experts, top %d", n_tok,
                       n_expert, k);
    void *p[] = {&logits, &n_tok, &n_expert, &k, &ids, &weights};
    return launch(cu, cu->k[K_ROUTER], "router_topk", (unsigned)((n_tok + 3) / 4), 1, 128, s, p,
                  err);
}

int sil_cuda_router_fused(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr x,
                          int n_tok, sil_cuda_ptr logits, int k, sil_cuda_ptr ids,
                          sil_cuda_ptr weights, sil_cuda_ptr done, struct sil_cuda_stream *s,
                          struct sil_error *err)
{
    if (w->type != SIL_TYPE_F32 || !w->data || !x || !done || w->rows <= 0 || w->rows > 1024 ||
        n_tok < 1 || n_tok > SIL_CUDA_MAX_BATCH || k <= 0 || k > 32 || k > w->rows)
        return set_err(err, -EINVAL, "cuda: fused router of %d tokens, %lld %s experts, top %d",
                       n_tok, (long long)w->rows, sil_type_name(w->type), k);
    unsigned g = 0;
    int rc = grid_of(w->rows, 4, &g, err);
    if (rc < 0) return rc;
    uint64_t row_bytes = w->row_bytes;
    int rows = (int)w->rows;
    int64_t cols = w->cols;
    int vec = mmvf_vec(w, x);
    void *p[] = {(void *)&w->data, &row_bytes, &rows, &cols, &vec, &x,
                 &logits,          &k,         &ids,  &weights, &done};
    cu->prof_bytes = w->bytes;
    return launch(cu, cu->router_fused[n_tok - 1], "router f32 + top-k", g, 1, 128, s, p, err);
}

int sil_cuda_router_norm(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr d,
                         const struct sil_cuda_norm_in *nt, sil_cuda_ptr logits, int k,
                         sil_cuda_ptr ids, sil_cuda_ptr weights, struct sil_cuda_stream *s,
                         struct sil_error *err)
{
    if (w->type != SIL_TYPE_F32 || !w->data || !d || !nt || !nt->x || !nt->w || !nt->y ||
        !nt->q8 || !nt->done || w->rows <= 0 || w->rows > 1024 || k <= 0 || k > 32 ||
        k > w->rows || !sil_cuda_router_norm_ok(w->cols))
        return set_err(err, -EINVAL, "cuda: router with its norm, %lld x %lld %s, top %d",
                       (long long)w->rows, (long long)w->cols, sil_type_name(w->type), k);
    const int threads = sil_cuda_rmsnorm_threads(w->cols);
    const int ti = threads == 128 ? 0 : threads == 512 ? 1 : 2;
    unsigned g = 0;
    int rc = grid_of(w->rows, 4, &g, err);
    if (rc < 0) return rc;
    uint64_t row_bytes = w->row_bytes;
    int rows = (int)w->rows;
    int64_t cols = w->cols;
    int vec = mmvf_vec(w, nt->y);
    float eps = nt->eps;
    void *p[] = {(void *)&w->data, &row_bytes, &rows,          &cols,   &vec,
                 (void *)&nt->x,   &d,         (void *)&nt->w, &eps,    (void *)&nt->y,
                 (void *)&nt->q8,  &logits,    &k,             &ids,    &weights,
                 (void *)&nt->done};
    cu->prof_bytes = w->bytes;
    return launch(cu, cu->router_norm[ti], "add + rmsnorm + router + top-k", g, 1,
                  (unsigned)threads, s, p, err);
}

int sil_cuda_argmax(struct sil_cuda *cu, sil_cuda_ptr x, int rows, int64_t n, sil_cuda_ptr out,
                    sil_cuda_ptr scratch, struct sil_cuda_stream *s, struct sil_error *err)
{
    if (rows <= 0 || n <= 0 || n > INT32_MAX || rows > 65535 || !scratch)
        return set_err(err, -EINVAL, "cuda: argmax of %d x %lld", rows, (long long)n);
    /* blocks of a row: enough for 4 loads of each thread in flight, at most the scratch's */
    int64_t nb = (n + 4 * 256 - 1) / (4 * 256);
    if (nb > SIL_CUDA_ARGMAX_BLOCKS) nb = SIL_CUDA_ARGMAX_BLOCKS;
    int ld = 1 + 2 * SIL_CUDA_ARGMAX_BLOCKS; /* SIL_CUDA_ARGMAX_SCRATCH's ints a row */
    void *p[] = {&x, &n, &out, &scratch, &ld};
    return launch(cu, cu->k[K_ARGMAX], "argmax", (unsigned)nb, (unsigned)rows, 256, s, p, err);
}

/* The in-place fields of a MoE weight (and its partner, gate with up) are whole: the table, host
 * memory, its stride and the slot count, when a table or host memory is given. */
static bool moe_host_ok(const struct sil_cuda_weight *w, const struct sil_cuda_weight *w2)
{
    return !(w->tab || w->host) ||
           (w->host && w->tab && (!w2 || (w2->host && w2->tab)) && w->n_slot > 0 &&
            w->host_stride > 0);
}

int sil_cuda_moe_gate_up(struct sil_cuda *cu, const struct sil_cuda_weight *gate,
                         const struct sil_cuda_weight *up, int n_expert, sil_cuda_ptr q8, int n_tok,
                         sil_cuda_ptr ids, int k, sil_cuda_ptr h, sil_cuda_ptr h8,
                         sil_cuda_ptr done, struct sil_cuda_stream *s, struct sil_error *err)
{
    const int slot = mv_slot(gate->type);
    if (slot < 0 || slot >= MV_F32 || up->type != gate->type || !gate->data || !up->data)
        return set_err(err, -ENOTSUP, "cuda: moe gate/up of %s and %s: needs one quantized type",
                       sil_type_name(gate->type), sil_type_name(up->type));
    if (n_expert <= 0 || gate->rows % n_expert || up->rows != gate->rows ||
        up->cols != gate->cols || n_tok <= 0 || k <= 0 || (int64_t)n_tok * k > 65535)
        return set_err(err, -EINVAL, "cuda: moe gate/up of %lld rows over %d experts, %d x %d",
                       (long long)gate->rows, n_expert, n_tok, k);
    int n_ff = (int)(gate->rows / n_expert), units = (int)(gate->cols / SIL_CUDA_Q8_BLOCK);
    int64_t nblocks = (int64_t)n_tok * units;
    uint64_t row_bytes = gate->row_bytes;
    uint64_t stride = gate->mat_stride ? gate->mat_stride : (uint64_t)n_ff * row_bytes;
    if (!moe_host_ok(gate, up))
        return set_err(err, -EINVAL,
                       "cuda: moe slots read in place without a slot table or host memory");
    uint64_t hstride = gate->host_stride;
    int nslot = gate->n_slot;
    if (done && (n_ff % 32 != 0 || !h8))
        return set_err(err, -EINVAL, "cuda: moe gate/up q8 of h needs n_ff %% 32 == 0 (%d)", n_ff);
    int64_t h8_blocks = done ? (int64_t)n_tok * k * n_ff / 32 : 0;
    void *p[] = {(void *)&gate->data,
                 (void *)&up->data,
                 &row_bytes,
                 &stride,
                 (void *)&gate->host,
                 (void *)&up->host,
                 &hstride,
                 (void *)&gate->tab,
                 &nslot,
                 &n_ff,
                 &units,
                 &n_expert,
                 &q8,
                 &nblocks,
                 &ids,
                 &k,
                 &h,
                 &h8,
                 &h8_blocks,
                 &done};
    /* bytes: k experts a token at most (fewer when tokens share one) */
    cu->prof_bytes = (uint64_t)n_tok * (uint64_t)k * 2 * (uint64_t)n_ff * row_bytes;
    return launch(cu, cu->moe_gate_up[slot], cu->what[W_GATE_UP][slot], (unsigned)((n_ff + 3) / 4),
                  (unsigned)(n_tok * k), 128, s, p, err);
}

int sil_cuda_moe_down(struct sil_cuda *cu, const struct sil_cuda_weight *down, int n_expert,
                      sil_cuda_ptr q8h, int n_tok, sil_cuda_ptr ids, sil_cuda_ptr weights, int k,
                      sil_cuda_ptr y, struct sil_cuda_stream *s, struct sil_error *err)
{
    const int slot = mv_slot(down->type);
    if (slot < 0 || slot >= MV_F32 || !down->data)
        return set_err(err, -ENOTSUP, "cuda: moe down of %s: needs a quantized type",
                       sil_type_name(down->type));
    if (n_expert <= 0 || down->rows % n_expert || n_tok <= 0 || n_tok > 65535 || k <= 0 ||
        k > SIL_CUDA_MOE_SLOTS_MAX || (int64_t)n_tok * k > 65535)
        return set_err(err, -EINVAL, "cuda: moe down of %lld rows over %d experts, %d x %d",
                       (long long)down->rows, n_expert, n_tok, k);
    int n_embd = (int)(down->rows / n_expert), units = (int)(down->cols / SIL_CUDA_Q8_BLOCK);
    int64_t nblocks = (int64_t)n_tok * k * units;
    uint64_t row_bytes = down->row_bytes;
    uint64_t stride = down->mat_stride ? down->mat_stride : (uint64_t)n_embd * row_bytes;
    if (!moe_host_ok(down, NULL))
        return set_err(err, -EINVAL,
                       "cuda: moe slots read in place without a slot table or host memory");
    uint64_t hstride = down->host_stride;
    int nslot = down->n_slot;
    void *p[] = {(void *)&down->data,
                 &row_bytes,
                 &stride,
                 (void *)&down->host,
                 &hstride,
                 (void *)&down->tab,
                 &nslot,
                 &n_embd,
                 &units,
                 &n_expert,
                 &q8h,
                 &nblocks,
                 &ids,
                 &weights,
                 &k,
                 &y};
    cu->prof_bytes = (uint64_t)n_tok * (uint64_t)k * (uint64_t)n_embd * row_bytes;
    return launch(cu, cu->moe_down[slot], cu->what[W_DOWN][slot], (unsigned)((n_embd + 3) / 4),
                  (unsigned)n_tok, 128, s, p, err);
}

/* The launch of moe.cuh's gate/up kernel that takes the shared expert's matrices sg / su:
 * grid (n_ff / 4, n_tok * k1); mats: the matrices it may read, for the profile's bytes. */
static int gate_up_sh_launch(struct sil_cuda *cu, CUfunction f, const char *what,
                             const struct sil_cuda_weight *gate, const struct sil_cuda_weight *up,
                             sil_cuda_ptr sg, sil_cuda_ptr su, int n_expert, sil_cuda_ptr q8,
                             int n_tok, sil_cuda_ptr ids, int k, int k1, sil_cuda_ptr x,
                             sil_cuda_ptr gate_inp, sil_cuda_ptr sh_logit, sil_cuda_ptr h,
                             sil_cuda_ptr h8, sil_cuda_ptr done, uint64_t mats,
                             struct sil_cuda_stream *s, struct sil_error *err)
{
    int n_ff = (int)(gate->rows / n_expert), units = (int)(gate->cols / SIL_CUDA_Q8_BLOCK);
    int64_t nblocks = (int64_t)n_tok * units;
    uint64_t row_bytes = gate->row_bytes;
    uint64_t stride = gate->mat_stride ? gate->mat_stride : (uint64_t)n_ff * row_bytes;
    if (!moe_host_ok(gate, up))
        return set_err(err, -EINVAL,
                       "cuda: moe slots read in place without a slot table or host memory");
    uint64_t hstride = gate->host_stride;
    int nslot = gate->n_slot;
    if (done && (n_ff % 32 != 0 || !h8))
        return set_err(err, -EINVAL, "cuda: moe gate/up q8 of h needs n_ff %% 32 == 0 (%d)", n_ff);
    int64_t h8_blocks = done ? (int64_t)n_tok * k1 * n_ff / 32 : 0;
    void *p[] = {(void *)&gate->data, (void *)&up->data, &sg, &su, &row_bytes, &stride,
                 (void *)&gate->host, (void *)&up->host, &hstride, (void *)&gate->tab, &nslot,
                 &n_ff, &units, &n_expert, &q8, &nblocks, &ids, &k, &x, &gate_inp, &sh_logit, &h,
                 &h8, &h8_blocks, &done};
    cu->prof_bytes = mats * 2 * (uint64_t)n_ff * row_bytes;
    return launch(cu, f, what, (unsigned)((n_ff + 3) / 4), (unsigned)(n_tok * k1), 128, s, p,
                  err);
}

int sil_cuda_moe_gate_up_shared(struct sil_cuda *cu, const struct sil_cuda_weight *gate,
                                const struct sil_cuda_weight *up,
                                const struct sil_cuda_weight *sh_gate,
                                const struct sil_cuda_weight *sh_up, int n_expert, sil_cuda_ptr q8,
                                int n_tok, sil_cuda_ptr ids, int k, sil_cuda_ptr x,
                                sil_cuda_ptr gate_inp, sil_cuda_ptr sh_logit, sil_cuda_ptr h,
                                sil_cuda_ptr h8, sil_cuda_ptr done, struct sil_cuda_stream *s,
                                struct sil_error *err)
{
    const int slot = mv_slot(gate->type);
    if (slot < 0 || slot >= MV_F32 || up->type != gate->type || sh_gate->type != gate->type ||
        sh_up->type != gate->type || !gate->data || !up->data || !sh_gate->data || !sh_up->data ||
        !x || !gate_inp || !sh_logit)
        return set_err(err, -ENOTSUP,
                       "cuda: moe gate/up with the shared expert: one quantized "
                       "type for all four");
    if (n_expert <= 0 || gate->rows % n_expert || up->rows != gate->rows ||
        up->cols != gate->cols || sh_gate->rows != gate->rows / n_expert ||
        sh_up->rows != sh_gate->rows || sh_gate->cols != gate->cols || n_tok <= 0 || k <= 0 ||
        (int64_t)n_tok * (k + 1) > 65535)
        return set_err(err, -EINVAL,
                       "cuda: moe gate/up + shared of %lld rows over %d experts, %d x %d",
                       (long long)gate->rows, n_expert, n_tok, k);
    /* bytes: k + 1 experts a token at most (fewer when tokens share one) */
    return gate_up_sh_launch(cu, cu->moe_gate_up_sh[slot], cu->what[W_GATE_UP][slot], gate, up,
                             sh_gate->data, sh_up->data, n_expert, q8, n_tok, ids, k, k + 1, x,
                             gate_inp, sh_logit, h, h8, done, (uint64_t)n_tok * (uint64_t)(k + 1),
                             s, err);
}

int sil_cuda_rmsnorm_threads(int64_t n)
{
    return n >= 4096 ? 1024 : n >= 1024 ? 512 : 128;
}

/* ops.cuh's sil_router_norm: rows of whole q8 blocks, 8 elements a thread at most. */
bool sil_cuda_router_norm_ok(int64_t n)
{
    return n > 0 && n <= SIL_CUDA_ROUTER_NORM_MAX && n % SIL_CUDA_Q8_BLOCK == 0 &&
           n <= 8 * (int64_t)sil_cuda_rmsnorm_threads(n);
}

int sil_cuda_moe_down_shared(struct sil_cuda *cu, const struct sil_cuda_weight *down,
                             const struct sil_cuda_weight *sh_down, int n_expert, sil_cuda_ptr q8h,
                             int n_tok, sil_cuda_ptr ids, sil_cuda_ptr weights,
                             sil_cuda_ptr sh_logit, int k, sil_cuda_ptr y,
                             struct sil_cuda_stream *s, struct sil_error *err)
{
    const int slot = mv_slot(down->type);
    if (slot < 0 || slot >= MV_F32 || sh_down->type != down->type || !down->data ||
        !sh_down->data || !sh_logit)
        return set_err(err, -ENOTSUP, "cuda: moe down with the shared expert: one quantized type");
    if (n_expert <= 0 || down->rows % n_expert || sh_down->rows != down->rows / n_expert ||
        sh_down->cols != down->cols || n_tok <= 0 || n_tok > 65535 || k <= 0 ||
        k + 1 > SIL_CUDA_MOE_SLOTS_MAX || (int64_t)n_tok * (k + 1) > 65535)
        return set_err(err, -EINVAL,
                       "cuda: moe down + shared of %lld rows over %d experts, %d x %d",
                       (long long)down->rows, n_expert, n_tok, k);
    int n_embd = (int)(down->rows / n_expert), units = (int)(down->cols / SIL_CUDA_Q8_BLOCK);
    int64_t nblocks = (int64_t)n_tok * (k + 1) * units;
    uint64_t row_bytes = down->row_bytes;
    uint64_t stride = down->mat_stride ? down->mat_stride : (uint64_t)n_embd * row_bytes;
    if (!moe_host_ok(down, NULL))
        return set_err(err, -EINVAL,
                       "cuda: moe slots read in place without a slot table or host memory");
    uint64_t hstride = down->host_stride;
    int nslot = down->n_slot;
    void *p[] = {(void *)&down->data,
                 (void *)&sh_down->data,
                 &row_bytes,
                 &stride,
                 (void *)&down->host,
                 &hstride,
                 (void *)&down->tab,
                 &nslot,
                 &n_embd,
                 &units,
                 &n_expert,
                 &q8h,
                 &nblocks,
                 &ids,
                 &weights,
                 &sh_logit,
                 &k,
                 &y};
    cu->prof_bytes = (uint64_t)n_tok * (uint64_t)(k + 1) * (uint64_t)n_embd * row_bytes;
    return launch(cu, cu->moe_down_sh[slot], cu->what[W_DOWN][slot], (unsigned)((n_embd + 3) / 4),
                  (unsigned)n_tok, 128, s, p, err);
}
