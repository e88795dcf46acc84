/* The CUDA backend's device layer: a context on one GPU, device buffers, weight upload, streams,
 * events, and the forward pass's ops as kernels taking device pointers.
 *
 * The CUDA Driver API is reached through dlopen("libcuda.so.1") (no CUDA runtime is linked); the
 * kernels come from one fatbin embedded in the binary (SASS for SIL_CUDA_ARCHS, compute_75 PTX
 * for newer GPUs) loaded with cuModuleLoadData. Without a driver or a GPU, sil_cuda_init fails
 * with a message saying which; nothing here aborts.
 *
 * Errors: 0 or -errno; the struct sil_error (may be NULL) names the driver call and its error
 * string. A launch error inside an op is reported by that op; an error raised while kernels run
 * is reported by the next sync.
 *
 * Ownership: a struct sil_cuda owns its context, module and default stream; buffers, weights,
 * streams, events and pinned host memory are owned by the caller and freed before
 * sil_cuda_free. Ops are asynchronous on the stream given (NULL: the context's default stream);
 * their pointers must stay valid until that stream is synced. No op allocates. */
#ifndef SIL_CUDA_BACKEND_H
#define SIL_CUDA_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cuda/cuda_options.h"
#include "kernels/error.h"

typedef uint64_t sil_cuda_ptr; /* a device address (CUdeviceptr); 0 is none */
struct sil_cuda;
struct sil_cuda_stream;
struct sil_cuda_event;

struct sil_cuda_info {
    int ordinal;
    char name[128];
    int cc_major, cc_minor;
    int sm_count;
    int driver_version; /* 13000 for 13.0 */
    size_t total_mem;
    bool ptx_jit; /* the module was built from PTX (CUDA_FORCE_PTX_JIT or no SASS match) */
    /* kernels launch with programmatic dependent launch (sm_90+ SASS; options no_pdl: off) */
    bool pdl;
    /* kernels ask L2 for their weights before the PDL wait (with pdl; no_prefetch: off) */
    bool l2_prefetch;
};

/* The architectures the embedded fatbin carries, e.g. "sm_75 sm_86 sm_89 sm_90 compute_75". */
const char *sil_cuda_fatbin_archs(void);

/* Opens device `ordinal`: loads the driver, creates a context and loads the kernels. Of opt
 * (NULL: the defaults) it reads driver, no_pdl, no_prefetch and inject_oom. */
int sil_cuda_init(struct sil_cuda **out, int ordinal, const struct sil_cuda_options *opt,
                  struct sil_error *err);
void sil_cuda_free(struct sil_cuda *cu);
const struct sil_cuda_info *sil_cuda_get_info(const struct sil_cuda *cu);
int sil_cuda_mem_info(struct sil_cuda *cu, size_t *free_bytes, size_t *total_bytes,
                      struct sil_error *err);

/* Device memory (256-byte aligned). */
int sil_cuda_alloc(struct sil_cuda *cu, size_t bytes, sil_cuda_ptr *out, struct sil_error *err);
void sil_cuda_release(struct sil_cuda *cu, sil_cuda_ptr p);
int sil_cuda_memset(struct sil_cuda *cu, sil_cuda_ptr p, uint8_t value, size_t bytes,
                    struct sil_cuda_stream *s, struct sil_error *err);
/* Copies; asynchronous on s (pageable host memory makes them synchronous in effect). */
int sil_cuda_upload(struct sil_cuda *cu, sil_cuda_ptr dst, const void *src, size_t bytes,
                    struct sil_cuda_stream *s, struct sil_error *err);
int sil_cuda_download(struct sil_cuda *cu, void *dst, sil_cuda_ptr src, size_t bytes,
                      struct sil_cuda_stream *s, struct sil_error *err);
int sil_cuda_copy_d2d(struct sil_cuda *cu, sil_cuda_ptr dst, sil_cuda_ptr src, size_t bytes,
                      struct sil_cuda_stream *s, struct sil_error *err);

/* Pinned host memory (staging buffers for async copies). */
int sil_cuda_host_alloc(struct sil_cuda *cu, size_t bytes, void **out, struct sil_error *err);
void sil_cuda_host_release(struct sil_cuda *cu, void *p);
/* Pins existing host memory read-only for the device (a file mapping: the model's experts), so
 * copies from it are DMA without a staging copy; p and bytes page-aligned. */
int sil_cuda_host_register(struct sil_cuda *cu, void *p, size_t bytes, struct sil_error *err);
void sil_cuda_host_unregister(struct sil_cuda *cu, void *p);
/* The device's address of registered host memory p (kernels read it in place over the bus). */
int sil_cuda_host_device_ptr(struct sil_cuda *cu, void *p, sil_cuda_ptr *out, struct sil_error *err);

int sil_cuda_stream_create(struct sil_cuda *cu, struct sil_cuda_stream **out,
                           struct sil_error *err);
void sil_cuda_stream_destroy(struct sil_cuda *cu, struct sil_cuda_stream *s);
/* Waits for s (NULL: the default stream); reports errors raised by kernels run on it. */
int sil_cuda_sync(struct sil_cuda *cu, struct sil_cuda_stream *s, struct sil_error *err);

int sil_cuda_event_create(struct sil_cuda *cu, struct sil_cuda_event **out, struct sil_error *err);
void sil_cuda_event_destroy(struct sil_cuda *cu, struct sil_cuda_event *e);
int sil_cuda_event_record(struct sil_cuda *cu, struct sil_cuda_event *e, struct sil_cuda_stream *s,
                          struct sil_error *err);
/* Milliseconds between two recorded events (waits for `end`). */
int sil_cuda_event_elapsed(struct sil_cuda *cu, struct sil_cuda_event *start,
                           struct sil_cuda_event *end, float *ms, struct sil_error *err);

/* ---- graphs and profiles ------------------------------------------------------------------ */

/* Stream capture: every op launched on s between begin and end is recorded (nothing runs) and
 * instantiated as one graph, replayed by sil_cuda_graph_launch with the same pointers and
 * parameters. Nothing in between may synchronize or copy from pageable host memory; an op that
 * fails there leaves the capture broken, and end then fails (the graph is not made). */
struct sil_cuda_graph;
int sil_cuda_capture_begin(struct sil_cuda *cu, struct sil_cuda_stream *s, struct sil_error *err);
int sil_cuda_capture_end(struct sil_cuda *cu, struct sil_cuda_stream *s,
                         struct sil_cuda_graph **out, struct sil_error *err);
int sil_cuda_graph_launch(struct sil_cuda *cu, struct sil_cuda_graph *g, struct sil_cuda_stream *s,
                          struct sil_error *err);
void sil_cuda_graph_destroy(struct sil_cuda *cu, struct sil_cuda_graph *g);

/* Per-kernel profile: while on, every launch is timed between two events and waited for, and
 * summed by kernel name with the weight bytes it reads (benchmarks only; no graphs meanwhile).
 * Turning it on clears the table. */
#define SIL_CUDA_PROF_MAX 64
struct sil_cuda_prof {
    char name[40];
    uint64_t calls, bytes;
    double ms;
};
int sil_cuda_profile(struct sil_cuda *cu, bool on, struct sil_error *err);
int sil_cuda_profile_get(const struct sil_cuda *cu, const struct sil_cuda_prof **tab);

/* ---- weights ------------------------------------------------------------------------------- */

/* A weight matrix on the device: rows x cols of a GGUF type, rows contiguous, GGUF's block
 * layout unchanged (the handle lets a later version repack behind it). */
struct sil_cuda_weight {
    int type; /* enum sil_type */
    int64_t rows, cols;
    size_t row_bytes;
    size_t bytes;
    sil_cuda_ptr data;
    bool owned; /* data was allocated by sil_cuda_weight_upload */
    /* a stack of matrices (routed experts, expert slots): bytes from one matrix to the next;
     * 0: packed (rows / n_expert rows apart) */
    size_t mat_stride;
    /* the MoE kernels only: a slot pool (data, mat_stride apart, n_slot of them) backed by the
     * whole stack in host memory (host, a device address of registered memory, host_stride
     * apart): expert e is slot tab[e] when tab[e] >= 0 (tab int32 [n_expert] on the device),
     * else read in place from host + e * host_stride. tab 0 (and host 0): ids name matrices of
     * data. */
    sil_cuda_ptr host, tab;
    size_t host_stride;
    int n_slot;
};

/* Types sil_cuda_matvec and sil_cuda_matmul compute with. */
bool sil_cuda_type_supported(int type);
/* Checks the shape (cols a multiple of the type's block, bytes == rows * row size), allocates
 * and copies. `src` is host memory (the mmap); the copy is complete when this returns. */
int sil_cuda_weight_upload(struct sil_cuda *cu, int type, int64_t rows, int64_t cols,
                           const void *src, size_t bytes, struct sil_cuda_weight *out,
                           struct sil_error *err);
/* Describes memory already on the device (an expert slot, 16-byte aligned); nothing is copied
 * or owned. */
int sil_cuda_weight_view(int type, int64_t rows, int64_t cols, sil_cuda_ptr data,
                         struct sil_cuda_weight *out, struct sil_error *err);
void sil_cuda_weight_free(struct sil_cuda *cu, struct sil_cuda_weight *w);

/* ---- ops ----------------------------------------------------------------------------------- */

/* Activations for the quantized matvec: x [n][k] F32 rounded to blocks of 32 int8 with a float
 * scale d = amax / 127 and the sum d * sum(q). Layout, for nb = n * k / 32 blocks: int8 q[nb][32],
 * then float2 (d, d * sum(q))[nb]. Quantize once, use for every weight of that input; a matvec
 * reads it with the same n it was quantized with. */
#define SIL_CUDA_Q8_BLOCK 32
#define SIL_CUDA_Q8_BLOCK_BYTES 40 /* 32 int8 + float d + float d * sum */
#define SIL_CUDA_MAX_BATCH 8
size_t sil_cuda_q8_bytes(int64_t n, int64_t k);
int sil_cuda_quantize_q8(struct sil_cuda *cu, sil_cuda_ptr x, int64_t n, int64_t k, sil_cuda_ptr q8,
                         struct sil_cuda_stream *s, struct sil_error *err);

/* y[j][r] = W[r] . x[j] for j < n (1..SIL_CUDA_MAX_BATCH), r < rows; y row stride ldy floats.
 * Quantized weights read q8 (sil_cuda_quantize_q8 of the n rows of x), F32/F16/BF16 read
 * x [n][cols] (16-byte aligned rows take the vector path). */
int sil_cuda_matvec(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr x,
                    sil_cuda_ptr q8, int n, sil_cuda_ptr y, int64_t ldy, struct sil_cuda_stream *s,
                    struct sil_error *err);

/* Several quantized weights of one width sharing the input (its q8), in one launch: y[k] = W_k x
 * as sil_cuda_matvec would give it, for k < nw <= SIL_CUDA_MV_SET_MAX. One type, or types that
 * sil_cuda_mv_mixable says may share a set. */
bool sil_cuda_mv_mixable(int type);
#define SIL_CUDA_MV_SET_MAX 4
int sil_cuda_matvec_multi(struct sil_cuda *cu, const struct sil_cuda_weight *const *w, int nw,
                          sil_cuda_ptr q8, int n, const sil_cuda_ptr *y, const int64_t *ldy,
                          struct sil_cuda_stream *s, struct sil_error *err);

/* A set of the mixable types (sil_cuda_mv_mixable) whose weight 0 writes the delta net's
 * qkv_mixed, with the causal conv1d + silu of each of its outputs in the same launch, as the
 * engine's conv1d kernel computes it: batch row j is a run of one token of sequence run_seq[j],
 * whose conv state [K-1][cd] (cd = weight 0's rows) is at seq_state[run_seq[j]] + offset floats;
 * out[j * ldo + c] gets the channel's output and the state moves on by the token. */
struct sil_cuda_conv_ep {
    sil_cuda_ptr out;
    int64_t ldo;
    sil_cuda_ptr w; /* [cd][K] F32 */
    sil_cuda_ptr run_seq;
    sil_cuda_ptr seq_state;
    int64_t offset;
    int32_t K; /* 1..9 */
};
int sil_cuda_matvec_multi_conv(struct sil_cuda *cu, const struct sil_cuda_weight *const *w,
                               int nw, sil_cuda_ptr q8, int n, const sil_cuda_ptr *y,
                               const int64_t *ldy, const struct sil_cuda_conv_ep *ep,
                               struct sil_cuda_stream *s, struct sil_error *err);

/* The same product for prefill, any n >= 1 (meant for n > SIL_CUDA_MAX_BATCH): quantized
 * weights on int8 tensor cores (weights unpacked to int8 per 32 columns, their scales applied in
 * float per 32 columns), reading q8 (sil_cuda_quantize_q8 of the n rows, the same layout);
 * F32/F16/BF16 in float from x [n][cols]. y[j * ldy + r] for j < n, r < rows; nothing else of y
 * is written. */
int sil_cuda_matmul(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr x,
                    sil_cuda_ptr q8, int n, sil_cuda_ptr y, int64_t ldy, struct sil_cuda_stream *s,
                    struct sil_error *err);
/* sil_cuda_matmul over groups of activation rows, each with its own matrix of a stack (routed
 * experts in prefill): group g multiplies matrix grp_mat[g] (w describes one matrix, the stack's
 * matrices mat_bytes apart from w->data) by rows grp_start[g] .. grp_start[g + 1] of the q8 of
 * a_rows rows, into the same rows of y. grp_mat [n_groups] and grp_start [n_groups + 1] are int32
 * on the device; max_rows bounds every group's rows. Quantized types only. */
int sil_cuda_matmul_grouped(struct sil_cuda *cu, const struct sil_cuda_weight *w, size_t mat_bytes,
                            sil_cuda_ptr q8, int a_rows, sil_cuda_ptr grp_mat,
                            sil_cuda_ptr grp_start, int n_groups, int max_rows, sil_cuda_ptr y,
                            int64_t ldy, struct sil_cuda_stream *s, struct sil_error *err);
/* The int8 mma path of sil_cuda_matmul: 75 (mma.m8n8k16, every GPU), 80 (mma.m16n8k32, sm_80+
 * devices running the fatbin's SASS), 0 the best the device runs (the default). -ENOTSUP for 80
 * where it is not there. For tests and benchmarks of both paths. */
int sil_cuda_set_mma(struct sil_cuda *cu, int sm, struct sil_error *err);
int sil_cuda_get_mma(const struct sil_cuda *cu);
/* The activation rows a block of sil_cuda_matmul_grouped takes: 16, 32 or 64, or 0 (the
 * default: the average group rounded up to one of them). The products are the same bits
 * whichever; for tests and benchmarks (options grouped_bn sets it at init). */
int sil_cuda_set_grouped_bn(struct sil_cuda *cu, int bn, struct sil_error *err);

/* y = x / sqrt(mean(x^2) + eps) * w per row of n (w may be 0). y may equal x. */
int sil_cuda_rmsnorm(struct sil_cuda *cu, sil_cuda_ptr y, sil_cuda_ptr x, sil_cuda_ptr w,
                     int64_t rows, int64_t n, float eps, struct sil_cuda_stream *s,
                     struct sil_error *err);
/* y[i] += x[i] */
int sil_cuda_add(struct sil_cuda *cu, sil_cuda_ptr y, sil_cuda_ptr x, int64_t n,
                 struct sil_cuda_stream *s, struct sil_error *err);
/* out[i] = silu(gate[i]) * up[i] */
int sil_cuda_swiglu(struct sil_cuda *cu, sil_cuda_ptr out, sil_cuda_ptr gate, sil_cuda_ptr up,
                    int64_t n, struct sil_cuda_stream *s, struct sil_error *err);
/* NeoX rope in place on x [n_tok][n_head][head_dim], first n_rot dims, position pos[t] (int32
 * on the device), as sil_rope_neox. */
int sil_cuda_rope_neox(struct sil_cuda *cu, sil_cuda_ptr x, int n_tok, int n_head, int head_dim,
                       int n_rot, sil_cuda_ptr pos, float freq_base, struct sil_cuda_stream *s,
                       struct sil_error *err);
/* Router per row of logits [n_tok][n_expert]: softmax, the top k (ties to the lower id), weights
 * renormalised over the k (sum clamped below at 2^-14, as the CPU backend): ids, weights
 * [n_tok][k]. n_expert <= 1024, k <= 32. */
int sil_cuda_router_topk(struct sil_cuda *cu, sil_cuda_ptr logits, int n_tok, int n_expert, int k,
                         sil_cuda_ptr ids, sil_cuda_ptr weights, struct sil_cuda_stream *s,
                         struct sil_error *err);
/* The router of a decode batch in one launch: logits [n_tok][w->rows] = x w^T (F32 weight of at
 * most 1024 rows, F32 x [n_tok][w->cols], n_tok <= SIL_CUDA_MAX_BATCH) as sil_cuda_matvec gives
 * them, then sil_cuda_router_topk's ids and weights, the same numbers. done: one int32 on the
 * device, zero, left zero. */
int sil_cuda_router_fused(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr x,
                          int n_tok, sil_cuda_ptr logits, int k, sil_cuda_ptr ids,
                          sil_cuda_ptr weights, sil_cuda_ptr done, struct sil_cuda_stream *s,
                          struct sil_error *err);
/* out[r] = index of the largest of x[r][0..n) (first on ties, NaN never wins), int32, each row
 * split over up to SIL_CUDA_ARGMAX_BLOCKS blocks. scratch: SIL_CUDA_ARGMAX_SCRATCH(rows) bytes on
 * the device, zero (left zero). */
#define SIL_CUDA_ARGMAX_BLOCKS 64
#define SIL_CUDA_ARGMAX_SCRATCH(rows) ((size_t)(rows) * (4 + 8 * SIL_CUDA_ARGMAX_BLOCKS))
int sil_cuda_argmax(struct sil_cuda *cu, sil_cuda_ptr x, int rows, int64_t n, sil_cuda_ptr out,
                    sil_cuda_ptr scratch, struct sil_cuda_stream *s, struct sil_error *err);

/* Fused MoE over an explicit expert plan, for decode batches (n_tok * k <= 65535). Expert
 * weights are one handle each for gate, up and down, experts stacked as GGUF stores them
 * (rows = n_expert * n_ff for gate/up, n_expert * n_embd for down); ids [n_tok][k] int32 and
 * weights [n_tok][k] F32 on the device (sil_cuda_router_topk's output). Quantized types only;
 * gate and up of one type. down takes at most SIL_CUDA_MOE_SLOTS_MAX slots a token (k, or k + 1
 * with the shared expert). */
#define SIL_CUDA_MOE_SLOTS_MAX 32
/*
 * gate_up: h [n_tok * k][n_ff] = silu(gate_e . x_t) * (up_e . x_t), q8 of x [n_tok][n_embd];
 * with done (int32 [n_tok * k] on the device, zero, left zero; n_ff % 32 == 0) also h8, the q8
 * of h rows as sil_cuda_quantize_q8 of h gives it, by the last block of each row: no launch of
 * its own. h8 and done 0: h only. */
int sil_cuda_moe_gate_up(struct sil_cuda *cu, const struct sil_cuda_weight *gate,
                         const struct sil_cuda_weight *up, int n_expert, sil_cuda_ptr q8, int n_tok,
                         sil_cuda_ptr ids, int k, sil_cuda_ptr h, sil_cuda_ptr h8,
                         sil_cuda_ptr done, struct sil_cuda_stream *s, struct sil_error *err);
/* down: y [n_tok][n_embd] = sum_j weights[t][j] * down_{ids[t][j]} . h[t * k + j], q8 of h
 * [n_tok * k][n_ff]. y is written, not added to. */
int sil_cuda_moe_down(struct sil_cuda *cu, const struct sil_cuda_weight *down, int n_expert,
                      sil_cuda_ptr q8h, int n_tok, sil_cuda_ptr ids, sil_cuda_ptr weights, int k,
                      sil_cuda_ptr y, struct sil_cuda_stream *s, struct sil_error *err);

/* The two fused kernels with the shared expert as a (k + 1)-th slot of every token, for models
 * whose shared expert has a routed expert's shape and types: gate_up writes h [n_tok * (k + 1)]
 * [n_ff] (the shared row after the token's k) and sh_logit [n_tok] = gate_inp . x (F32 x
 * [n_tok][n_embd], gate_inp F32 [n_embd]); down (q8 of that h) writes y = sum of the k routed
 * outputs by their weights + sigmoid(sh_logit) * the shared one: the whole MoE output. */
int sil_cuda_moe_gate_up_shared(struct sil_cuda *cu, const struct sil_cuda_weight *gate,
                                const struct sil_cuda_weight *up,
                                const struct sil_cuda_weight *sh_gate,
                                const struct sil_cuda_weight *sh_up, int n_expert, sil_cuda_ptr q8,
                                int n_tok, sil_cuda_ptr ids, int k, sil_cuda_ptr x,
                                sil_cuda_ptr gate_inp, sil_cuda_ptr sh_logit, sil_cuda_ptr h,
                                sil_cuda_ptr h8, sil_cuda_ptr done, struct sil_cuda_stream *s,
                                struct sil_error *err);
int sil_cuda_moe_down_shared(struct sil_cuda *cu, const struct sil_cuda_weight *down,
                             const struct sil_cuda_weight *sh_down, int n_expert, sil_cuda_ptr q8h,
                             int n_tok, sil_cuda_ptr ids, sil_cuda_ptr weights,
                             sil_cuda_ptr sh_logit, int k, sil_cuda_ptr y,
                             struct sil_cuda_stream *s, struct sil_error *err);
/* The threads a row of n gets in the backend's add + rmsnorm + q8 launch (fwd.cu). */
int sil_cuda_rmsnorm_threads(int64_t n);
/* The residual add + rmsnorm + q8 of one token before a decode MoE and its F32 router (as
 * sil_cuda_router_fused) in one launch: x += d, y = rmsnorm(x) * w with its q8 blocks in q8, to
 * the bit what the separate add + rmsnorm + q8 launch gives, for rows of n = the router's cols
 * where sil_cuda_router_norm_ok(n); then the router's logits, ids and weights from y. done is
 * the router's counter (zero between launches). */
struct sil_cuda_norm_in {
    sil_cuda_ptr x, w, y, q8, done;
    float eps;
};
#define SIL_CUDA_ROUTER_NORM_MAX 4096
bool sil_cuda_router_norm_ok(int64_t n);
int sil_cuda_router_norm(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr d,
                         const struct sil_cuda_norm_in *nt, sil_cuda_ptr logits, int k,
                         sil_cuda_ptr ids, sil_cuda_ptr weights, struct sil_cuda_stream *s,
                         struct sil_error *err);
/* ---- further modules ----------------------------------------------------------------------- */

/* A second fatbin (kernels outside kernels.cu, e.g. the engine's forward-pass kernels in
 * fwd.cu), loaded into this context; its functions launch on the same streams as the ops above.
 * Freed before sil_cuda_free. */
struct sil_cuda_module;
int sil_cuda_module_load(struct sil_cuda *cu, const void *image, struct sil_cuda_module **out,
                         struct sil_error *err);
void sil_cuda_module_unload(struct sil_cuda *cu, struct sil_cuda_module *m);
/* *fn: an opaque function handle, valid while the module is loaded. */
int sil_cuda_module_function(struct sil_cuda *cu, struct sil_cuda_module *m, const char *name,
                             void **fn, struct sil_error *err);
/* Launches fn on grid (gx, gy, gz) of `block` threads with params as cuLaunchKernel takes them. */
int sil_cuda_launch(struct sil_cuda *cu, void *fn, const char *what, unsigned gx, unsigned gy,
                    unsigned gz, unsigned block, struct sil_cuda_stream *s, void **params,
                    struct sil_error *err);

#endif
