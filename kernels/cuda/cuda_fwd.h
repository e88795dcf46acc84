/* The forward-pass kernels of fwd.cu (attention over the paged KV cache, the gated delta net,
 * row gathers, the MoE sums, add + rmsnorm + q8), with typed host wrappers as cuda_backend.h
 * gives the op library's kernels. The module is its own fatbin (sil_cuda_fwd_fatbin), loaded into
 * a context of cuda_backend.h; its kernels launch on that context's streams.
 *
 * Errors: 0 or -errno as cuda_backend.h's ops. Every wrapper launches one kernel (none where a
 * grid dimension is 0, for those that say so); nothing allocates or synchronizes, so they may be
 * captured into graphs. Pointers are device addresses; row strides (ld*) are in floats.
 *
 * Ownership: a struct sil_cuda_fwd owns its module and is freed before the sil_cuda it was
 * loaded into. */
#ifndef SIL_CUDA_FWD_H
#define SIL_CUDA_FWD_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/cuda/cuda_backend.h"

struct sil_cuda_fwd;

/* The KV cache's element types, numbered as the engine's enum sil_kv_type: F32, F16 (rounded
 * to nearest even), q8_0 (KV8) and q4_0 (KV4) blocks of 32. */
enum sil_cuda_kv { SIL_CUDA_KV_F32, SIL_CUDA_KV_F16, SIL_CUDA_KV_Q8_0, SIL_CUDA_KV_Q4_0 };
#define SIL_CUDA_KV_TYPES 4
/* Positions a KV block holds (fwd.cu's FWD_KV_BLOCK). */
#define SIL_CUDA_KV_BLOCK 64

int sil_cuda_fwd_load(struct sil_cuda *cu, struct sil_cuda_fwd **out, struct sil_error *err);
void sil_cuda_fwd_unload(struct sil_cuda *cu, struct sil_cuda_fwd *f);

/* y[i][c] = x[rows[i]][c] for i < n, c < width; rows int32 [n]. None when n is 0. */
int sil_cuda_fwd_gather_rows(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr y,
                             int64_t ldy, sil_cuda_ptr x, int64_t ldx, sil_cuda_ptr rows,
                             int64_t width, int64_t n, struct sil_cuda_stream *s,
                             struct sil_error *err);

/* x += d (d 0: none), y = rmsnorm(x) * w (w may be 0) and y's q8 blocks (sil_cuda_quantize_q8's
 * layout, nblocks in all) in one launch, rows rows of n (n % 32 == 0, rows contiguous), with
 * sil_cuda_rmsnorm_threads(n) threads a row. */
int sil_cuda_fwd_add_rmsnorm_q8(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr x,
                                sil_cuda_ptr d, sil_cuda_ptr y, sil_cuda_ptr w, int64_t rows,
                                int64_t n, float eps, sil_cuda_ptr q8, int64_t nblocks,
                                struct sil_cuda_stream *s, struct sil_error *err);

/* One attention layer of a ubatch: q [rows][ldq] (each head q_stride floats, the output gate
 * after the head's q when gated), k, v [rows][ld*]; the layer's cache kc, vc ([block]
 * [SIL_CUDA_KV_BLOCK][n_head_kv * head_dim] of kv), a sequence's block table at btab + seq * bps
 * (int32); pos, seq int32 [rows]. */
struct sil_cuda_attn {
    sil_cuda_ptr q, k, v, o;
    int64_t ldq, ldk, ldv, ldo;
    int q_stride;
    sil_cuda_ptr q_norm, k_norm; /* [head_dim] F32 */
    sil_cuda_ptr pos, seq;
    int n_head, n_head_kv, head_dim, n_rot, n_ctx, gated;
    float freq_base, eps;
    enum sil_cuda_kv kv;
    sil_cuda_ptr kc, vc, btab;
    int bps;
};
/* q and k head-normed and roped, k and v stored in the cache at (seq, pos) of each of rows rows.
 * None when rows is 0. */
int sil_cuda_fwd_qk_prep(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                         const struct sil_cuda_attn *a, int64_t rows, struct sil_cuda_stream *s,
                         struct sil_error *err);
/* o of rows r0 .. r0 + n: softmax(q K^T / sqrt(head_dim)) V over each row's positions, block
 * per (head, row); scores [n * n_head][n_ctx] F32 scratch. None when n is 0. */
int sil_cuda_fwd_attend(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                        const struct sil_cuda_attn *a, int64_t r0, int64_t n, sil_cuda_ptr scores,
                        struct sil_cuda_stream *s, struct sil_error *err);
/* Prefill attention tiled (flash attention on f16 tensor cores): rows r0..r0 + n - 1, one
 * sequence run (rows of one sequence), each over positions 0..pos of its sequence, 64 rows and
 * a head a block. Head sizes sil_cuda_fwd_flash_takes; -EINVAL otherwise. None when n is 0. */
bool sil_cuda_fwd_flash_takes(int head_dim);
int sil_cuda_fwd_flash(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                       const struct sil_cuda_attn *a, int64_t r0, int64_t n,
                       struct sil_cuda_stream *s, struct sil_error *err);
/* The same split over nz chunks of the context a head: partial softmaxes into part
 * ([n][n_head][nz][head_dim + 2]); gqa: the kernel that reads a KV head's rows once for its
 * query heads (n_head / n_head_kv <= 8, head_dim <= 256, a warp per query head). */
int sil_cuda_fwd_attend_part(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                             const struct sil_cuda_attn *a, int64_t r0, int64_t n, int nz, bool gqa,
                             sil_cuda_ptr part, struct sil_cuda_stream *s, struct sil_error *err);
/* The partials merged into o (gated: times the sigmoid of the gate); with q8 (0: none) also
 * o's q8 blocks, nblocks in all (head_dim % 32 == 0, o's rows contiguous). */
int sil_cuda_fwd_attend_combine(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                                const struct sil_cuda_attn *a, int64_t r0, int64_t n, int nz,
                                sil_cuda_ptr part, sil_cuda_ptr q8, int64_t nblocks,
                                struct sil_cuda_stream *s, struct sil_error *err);

/* The gated delta net of a ubatch in sequence runs (run_start int32 [n_runs + 1], run_seq int32
 * [n_runs]); a sequence's state at state_tab[seq] (float * [seq] on the device) + offset
 * floats: the conv state [K-1][conv_dim], then ssm_offset floats on the heads' S [nv][dv][dk]. */
struct sil_cuda_dn {
    sil_cuda_ptr conv, z, alpha, beta, out;
    int64_t ldc, ldz, lda, ldb, ldo;
    sil_cuda_ptr a, dt_bias, norm; /* [nv], [nv], [dv] F32 */
    int nk, nv, dk, dv;
    float eps;
    sil_cuda_ptr run_start, run_seq, state_tab;
    int64_t offset, ssm_offset;
};
/* Causal depthwise conv1d + silu of x [rows][ldx] into out [rows][ldo], conv_dim channels, K
 * taps of w [conv_dim][K] (K <= 9), each run's conv state moved on. None when n_runs is 0. */
int sil_cuda_fwd_conv1d(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr x,
                        int64_t ldx, sil_cuda_ptr out, int64_t ldo, sil_cuda_ptr w, int K,
                        int64_t conv_dim, sil_cuda_ptr run_start, sil_cuda_ptr run_seq,
                        sil_cuda_ptr state_tab, int64_t offset, int32_t n_runs,
                        struct sil_cuda_stream *s, struct sil_error *err);
/* Row i < rows of qkv (conv_dim cd), alpha and beta ([nv] each) copied to row cap[i] of dst
 * ([][cd + 2 nv]) where cap[i] >= 0 (int32 on the device). None when rows is 0. */
int sil_cuda_fwd_dn_capture(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr qkv,
                            int64_t ldq, sil_cuda_ptr alpha, int64_t lda, sil_cuda_ptr beta,
                            int64_t ldb, sil_cuda_ptr cap, int64_t rows, sil_cuda_ptr dst,
                            int64_t cd, int nv, struct sil_cuda_stream *s, struct sil_error *err);
/* The delta rule and the gated norm, a block per (value head, run), any dk, dv <= 1024. None
 * when n_runs is 0. */
int sil_cuda_fwd_delta_net(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                           const struct sil_cuda_dn *d, int32_t n_runs, struct sil_cuda_stream *s,
                           struct sil_error *err);
/* The delta rule alone, S's rows over blocks of 8 (dk % 32 == 0, dk <= 256); with done (int32
 * [SIL_CUDA_MAX_BATCH][heads], zero, left zero) the last block of each head also runs the gated
 * norm and its q8 (q8 0: none; nblocks in all). */
int sil_cuda_fwd_delta_rule(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                            const struct sil_cuda_dn *d, int32_t n_runs, sil_cuda_ptr done,
                            sil_cuda_ptr q8, int64_t nblocks, struct sil_cuda_stream *s,
                            struct sil_error *err);
/* The gated norm of out in place for rows rows, with its q8 blocks where q8 is given. None when
 * rows is 0. */
int sil_cuda_fwd_gated_norm_q8(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                               const struct sil_cuda_dn *d, int64_t rows, sil_cuda_ptr q8,
                               int64_t nblocks, struct sil_cuda_stream *s, struct sil_error *err);

/* y[i][c] = sigmoid(g[i]) * y[i][c] + x[i][c] for i < rows, c < width: the shared expert's
 * gate, then the routed sum. None when rows is 0. */
int sil_cuda_fwd_gate_add(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr y,
                          int64_t ldy, sil_cuda_ptr g, sil_cuda_ptr x, int64_t ldx, int64_t width,
                          int64_t rows, struct sil_cuda_stream *s, struct sil_error *err);
/* out[i] = sum over k < K of w[i K + k] * d[pair_of[i K + k]] (d [pairs][width], w F32 and
 * pair_of int32 [rows][K]): the routed experts' weighted sum. None when rows is 0. */
int sil_cuda_fwd_moe_combine(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr out,
                             int64_t ldo, sil_cuda_ptr d, sil_cuda_ptr pair_of, sil_cuda_ptr w,
                             int K, int64_t width, int64_t rows, struct sil_cuda_stream *s,
                             struct sil_error *err);

#endif
