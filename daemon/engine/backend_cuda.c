/* The CUDA backend: the ops of backend.h on one GPU, over kernels/cuda (the op library of
 * cuda_backend.h and the forward-pass kernels of fwd.cu). Everything is resident: weights are
 * uploaded by place() at load, activations, KV cache and recurrent state live on the device,
 * and only the logits rows that are wanted (and the router's choices, for the expert plan)
 * come back to the host.
 *
 * Activation pointers (struct sil_act.data) are device addresses; weight handles placed here
 * are SIL_WEIGHT_DEVICE with data a device address. The embedding table stays in the mmap:
 * get_rows dequantizes the ubatch's rows on the host and uploads them (n * n_embd floats).
 * KV: [attention layer][sequence][n_ctx][kv_dim] F32. Recurrent state: per sequence the
 * layout of the engine's host state (n_layer_recr * state floats), reset on the device when a
 * sequence run starts at position 0 (the engine zeroes its host copy at exactly those points).
 *
 * Routing stays on the device when every routed expert is resident and of a fused type: the
 * MoE kernels read the router's choices where it wrote them (SIL_CUDA_HOST_ROUTE=1 brings them
 * back to the host and builds the plan there, as an expert cache will).
 *
 * Graphs: a ubatch's inputs (embedding rows, positions, runs, the rows kept for the head) are
 * staged in pinned host memory at begin() and copied up inside the pass, and logits come back
 * to pinned memory, so a whole decode pass is replayable: the first pass of a shape (rows,
 * sequence runs, rows wanting logits) runs eagerly and notes whether it was capturable (no host
 * sync: device routing; no run starting a sequence), the second is captured into a CUDA graph,
 * later ones replay it, the ops then only staging inputs on the host. cuda_graphs = off turns
 * graphs off. Prefill's routed experts go through grouped tensor-core products (each active
 * expert read once per ubatch, from the weights or from the slot pools alike, so a budget that
 * puts experts in slots gives the logits of everything resident); SIL_CUDA_GROUPED=0 takes the
 * batch-8 fused decode kernels instead (35B shape pp512 2093 against 2978 tok/s grouped).
 *
 * SIL_CUDA_PROFILE=FILE (benchmarks): the per-kernel table of one decode pass at position 16 or
 * later (of the first pass of SIL_CUDA_PROFILE_ROWS rows instead, when set), and the device and
 * host time of the graph replays, appended at close.
 *
 * Errors: ops cannot return one; the first failure is kept and later ops do nothing until
 * status reports it; our own checks and out-of-memory then clear (a device fault stays).
 * Ops run in order on the context's default stream; head() synchronizes (logits download).
 * Nothing on the per-token path allocates.
 *
 * Fusion: every op launches its work before it returns. A launch that does two ops' work is an
 * op of backend.h (add_rmsnorm, matmul_conv1d, add_rmsnorm_route), which runs the two parts
 * where its fused kernel does not take the shape or is switched off. What an op leaves for the
 * next is a cache only: the q8 blocks of the rows a norm, attention's merge or the delta rule
 * wrote (q8_src), which a matmul of exactly those rows reads instead of quantizing again. */
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "daemon/engine/backend.h"
#include "daemon/engine/hostmem.h"
#include "daemon/engine/host_experts.h"
#include "daemon/engine/kv_cache.h"

#ifndef SIL_HAVE_CUDA

const char *sil_engine_backends(void)
{
    return "cpu (built without CUDA)";
}

int sil_backend_cuda_create(struct sil_backend **out, const struct sil_cuda_config *c,
                            struct sil_error *err)
{
    (void)c;
    *out = NULL;
    return sil_errorf(err, -ENOTSUP, "cuda backend: built without CUDA");
}

#else

#include "kernels/cpu/quants.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_fwd.h"
#include "kernels/vec.h"

const char *sil_engine_backends(void)
{
    static char text[160];
    if (!text[0]) snprintf(text, sizeof text, "cpu, cuda (%s)", sil_cuda_fatbin_archs());
    return text;
}

#define MB SIL_CUDA_MAX_BATCH
/* Decode rows up to which a matvec set does the delta net's conv1d in its launch. Above it the
 * epilogue's state loads, a chain in the last lanes of each warp, cost more than the conv1d
 * launch they save (35B-A3B shape on the H200, aggregate tok/s fused against
 * SIL_CUDA_NO_CONV_FUSE=1, one call: 1 row 473.6 / 458.3, 2 681.2 / 673.0, 4 966.7 / 961.0,
 * 8 1174.2 / 1192.8). */
#define CONV_FUSE_ROWS 4
#define SCORES_MAX ((uint64_t)256 << 20) /* prefill attention's scores buffer */
_Static_assert(SIL_KV_BLOCK == SIL_CUDA_KV_BLOCK, "fwd.cu's FWD_KV_BLOCK is SIL_KV_BLOCK");
_Static_assert(SIL_KV_F32 == (int)SIL_CUDA_KV_F32 && SIL_KV_F16 == (int)SIL_CUDA_KV_F16 &&
                   SIL_KV_Q8_0 == (int)SIL_CUDA_KV_Q8_0 && SIL_KV_Q4_0 == (int)SIL_CUDA_KV_Q4_0,
               "the KV types are numbered alike");
#define DN_DONE_HEADS 1024 /* value heads the fused delta-rule + gated norm takes */
#define N_GRAPHS 16

/* One ubatch shape and its graph. */
struct graph_slot {
    int32_t n, n_runs, n_keep;
    uint8_t head_out; /* what its head gives back (sil_ubatch.head_out) */
    int32_t run_start[MB + 1];
    int32_t keep[MB];
    int seen;        /* eager passes of this shape */
    bool capturable; /* the last eager pass synced nowhere */
    uint64_t used;   /* LRU clock */
    struct sil_cuda_graph *g;
    /* with expert slots, the pass as segments cut where the host routes a MoE layer: seg[i]
     * runs from layer i-1's experts to layer i's router (seg[0] from the start, the last one
     * to the head); n_seg 0 until captured */
    struct sil_cuda_graph **seg;
    int n_seg;
    size_t cap_seg;
};

enum pass_mode { PASS_EAGER, PASS_CAPTURE, PASS_REPLAY };

struct cuda_backend {
    struct sil_backend base;
    struct sil_cuda_config c;
    struct sil_cuda *cu;
    struct sil_cuda_fwd *fwd; /* fwd.cu's kernels */
    int rc;
    struct sil_error err;
    uint64_t used, budget; /* device bytes taken, the cap (the budget less ctx_bytes) */
    uint64_t ctx_bytes;    /* device memory in use at open, counted in --vram-budget */
    uint64_t weight_bytes, kv_bytes;
    /* device allocations, freed with the backend */
    sil_cuda_ptr *allocs;
    int n_allocs;
    size_t cap_allocs;
    /* device buffers */
    sil_cuda_ptr kv_k, kv_v; /* [layer][seq][n_ctx][kv_dim] */
    sil_cuda_ptr state;      /* [seq][recr_floats] */
    sil_cuda_ptr state_tab;  /* [seq] float * */
    sil_cuda_ptr q8;         /* quantized matmul inputs */
    sil_cuda_ptr q8h;        /* quantized expert hidden rows */
    sil_cuda_ptr scores;     /* [scores_rows][n_head][n_ctx] */
    int32_t scores_rows;     /* prefill attention's rows a launch (SCORES_MAX caps the buffer) */
    sil_cuda_ptr attn_part;  /* [MB][n_head][attn_split][head_dim + 2] */
    int attn_split;
    sil_cuda_ptr pos, seq, rows;              /* [ub_max] int32 */
    sil_cuda_ptr run_start, run_seq, keep;    /* in meta */
    sil_cuda_ptr logits;                      /* [MB][n_vocab] */
    sil_cuda_ptr am;                          /* [MB] int32 argmax of the logits rows */
    sil_cuda_ptr am_scratch; /* SIL_CUDA_ARGMAX_SCRATCH(MB): the split argmax (zero between) */
    sil_cuda_ptr router;                      /* [ub_max][n_expert] */
    sil_cuda_ptr ids, wts, pair_of, pair_row; /* [ub_max * K] */
    sil_cuda_ptr h_gate, h_up, d_pair;        /* [ub_max * K][n_ff_exp], [..][n_embd] */
    sil_cuda_ptr x_pair, q8p;                 /* prefill: rows gathered per pair, their q8 */
    sil_cuda_ptr grp;                         /* [n_expert] expert ids, [n_expert + 1] starts */
    sil_cuda_ptr x_g;                         /* [MB][k_max] gathered rows */
    sil_cuda_ptr routed;                      /* [ub_max][n_embd] */
    sil_cuda_ptr sh_gate, sh_up, sh_logit;    /* [ub_max][n_ff_shexp], [ub_max] */
    sil_cuda_ptr meta;                        /* the staged block below, on the device */
    /* host */
    int32_t *tmp; /* [ub_max * K + max(ub_max, n_expert) + 1] */
    bool meta_ok; /* pos / seq / runs of the current ubatch are on the device */
    /* pinned staging: [ub_max][n_embd] embedding rows, then int32 pos, seq, run_start,
     * run_seq, keep [ub_max (+1)] each; logits [MB][n_vocab] */
    void *h_meta;
    float *emb;
    int32_t *h_pos, *h_seq, *h_run_start, *h_run_seq, *h_keep;
    /* KV in blocks of SIL_KV_BLOCK positions: the pool holds n_seq_max * kv_bps blocks a layer;
     * a sequence's table [kv_bps] block ids (the engine's, kv_cache.h) in the staged block */
    int32_t kv_bps, kv_nb; /* table width, pool blocks */
    int32_t *h_btab;
    sil_cuda_ptr btab;
    size_t meta_bytes, ints_off;
    float *h_logits;
    int32_t *h_am; /* [MB] pinned: the argmax rows come down here */
    /* graphs */
    bool graphs, host_route, no_grouped, no_shared_fuse, no_gqa, no_dn_fuse, no_router_fuse;
    bool no_mv_mix; /* SIL_CUDA_NO_MV_MIX=1: matvec sets of one type only */
    /* matmul_conv1d: a decode matvec set of four outputs does the delta net's conv1d in its
     * launch (the mixed set kernel with the conv epilogue), for up to CONV_FUSE_ROWS rows;
     * SIL_CUDA_NO_CONV_FUSE=1: never (the matmul, then the conv1d) */
    bool no_conv_fuse;
    bool no_attn_q8; /* SIL_CUDA_NO_ATTN_Q8=1: decode attention's merge leaves o's q8 to the
                      * output projection's own quantize launch */
    /* add_rmsnorm_route: a one-token add + rmsnorm + q8 in the launch of the F32 router after
     * it (sil_cuda_router_norm); SIL_CUDA_NO_NORM_ROUTER=1: never (add_rmsnorm, then route) */
    bool no_norm_router;
    int32_t split_from; /* SIL_CUDA_PREFILL_SPLIT=P: prefill attention of rows at positions
                         * >= P through the decode kernels (context split), MB rows a launch;
                         * 0: never (the default until measured) */
    bool no_h8_fuse;
    sil_cuda_ptr moe_done; /* [MB * (K + 1)] int32: gate/up blocks done per pair (zero between) */
    sil_cuda_ptr router_done; /* int32 counter of the fused router (zero between launches) */
    sil_cuda_ptr dn_done; /* [MB][DN_DONE_HEADS] int32 row groups of a head done (zero between) */
    enum pass_mode mode;
    struct graph_slot slots[N_GRAPHS];
    struct graph_slot *cur; /* the shape of the pass running, or NULL (not graphable) */
    /* segmented passes (expert slots, a graphable shape): the segment index, and whether the
     * pass is between segments (the host routes and fills slots there, outside any graph) */
    bool segmented, seg_gap;
    int seg_i;
    int32_t *h_ids; /* pinned [ub_max * K] router choices, then [ub_max * K] their weights */
    uint64_t clock;
    uint64_t n_replays, n_captures;
    /* expert slots (the routed experts did not all fit): n_slots gate, up and down matrices,
     * slot_g/u/d bytes apart; copies into them go through the pinned staging ring */
    int32_t n_slots;
    sil_cuda_ptr pool_g, pool_u, pool_d;
    uint64_t slot_g, slot_u, slot_d;
    uint8_t *stage;
    size_t stage_bytes, stage_used;
    /* read by status from other threads (cuda_device) while the engine thread adds */
    _Atomic uint64_t slot_fills, slot_bytes_in;
    /* the routed stacks' bytes in the mmap (noted at place), pinned at placed() when they can
     * be: misses are then copied straight from the mapping, else staged through the ring */
    struct host_range {
        uintptr_t lo, hi;
    } * rng;
    int n_rng;
    size_t cap_rng;
    bool pinned;
    uint64_t pinned_bytes;
    double h2d_gbs;
    /* pinned host blocks handed out by host_alloc (the engine's host tier of experts): a miss
     * whose handle points into one is one DMA, like the pinned mapping */
    struct host_range *hblk;
    int n_hblk;
    size_t cap_hblk;
    /* miss path (c), SIL_CUDA_CPU_MISSES=N: up to N misses of each decode layer computed on the
     * host from the mapping while the rest stream; the MoE input comes down with the router's
     * choices (h_x), the host's sum goes up (h_y -> cpu_y) and is added to the layer's output */
    struct sil_host_experts *hx;
    int32_t cpu_misses, cpu_misses_max; /* now (0 while the share is off), and at most */
    bool cpu_auto; /* the host's share measured (no count of CPU misses given): choose_host_share */
    double host_share; /* of each decode plan's misses, rounded (0: up to cpu_misses) */
    double host_gbs;   /* the host's expert speed measured at placed() (0: not measured) */
    struct sil_weight probe[3]; /* one layer's routed stacks (two F x E, one E x F) */
    int n_probe_fe, n_probe_ef;
    bool float_experts; /* a routed stack is F32/F16/BF16: the fused kernels cannot run it */
    float *h_x, *h_y;
    sil_cuda_ptr cpu_y;
    struct sil_host_expert_job *jobs;
    float *h_wts;
    int32_t *slot_ids; /* host [ub_max * K] */
    /* miss path (b), cuda_zero_copy: a decode pass routes on the device and stays one
     * graph. Expert e of layer l is slot zc_tab[l][e] when resident, else its matrices are read
     * in place from the pinned mapping over the bus (rng_dev: each pinned range's device
     * address). Every layer's choices come down with the logits (zc_ids -> zc_hids), and the
     * engine's cache sees them after the pass (routes), filling what its admission lets in
     * before the next pass; the table goes up at the next pass's begin when it changed. */
    bool zc, zc_pass, zc_dirty;
    _Atomic uint64_t zc_passes;
    /* launches issued with a fusion (graph replays not counted): [0] conv1d in the matvec set,
     * [1] attention's merge with o's q8, [2] the router with its norm */
    _Atomic uint64_t fused[3];
    _Atomic uint64_t host_experts; /* miss path (c): experts the host computed since open */
    sil_cuda_ptr zc_tab, zc_ids;
    int32_t *zc_htab;  /* host [n_layer][n_expert] copy of the table */
    int32_t *zc_hids;  /* pinned [n_layer][MB * K] */
    int32_t *zc_rows;  /* [n_layer] rows whose choices zc_hids holds, 0: none */
    int32_t *slot_key; /* [n_slots] layer * n_expert + expert a slot holds, or -1 */
    sil_cuda_ptr *rng_dev;
    /* benchmarks only (SIL_BENCH_H2D_GBS): expert copies are issued no faster than this many
     * bytes a second, to measure a slower link (PCIe 3) on a fast one */
    double h2d_cap, h2d_next;
    /* q8 holds the quantized rows of q8_src ([q8_n][q8_k]) until an op may write them */
    sil_cuda_ptr q8_src;
    int64_t q8_n, q8_k;
    /* SIL_CUDA_PROFILE=FILE: one decode pass (at position 16 or later) profiled per kernel */
    const char *prof_path;
    int prof_rows; /* SIL_CUDA_PROFILE_ROWS: profile the first pass of this many rows instead */
    bool profiling, prof_done;
    /* with SIL_CUDA_PROFILE: device time of each graph replay, host time of each replayed pass */
    struct sil_cuda_event *gev[2];
    double graph_ms, pass_ms;
    uint64_t n_timed;
    bool timed_pass;
    struct timespec t_begin;
};

static struct cuda_backend *cb(struct sil_backend *be)
{
    return (struct cuda_backend *)be;
}

static sil_cuda_ptr dp(const void *p)
{
    return (sil_cuda_ptr)(uintptr_t)p;
}

/* Keeps the first error; true when ops should go on. */
static bool ok(struct cuda_backend *b, int rc)
{
    if (rc < 0 && b->rc == 0) {
        b->rc = rc;
        if (b->err.code == 0) sil_errorf(&b->err, rc, "cuda backend: error %d", rc);
    }
    return b->rc == 0;
}

static bool fail(struct cuda_backend *b, int code, const char *what)
{
    if (b->rc == 0) {
        b->rc = code;
        sil_errorf(&b->err, code, "cuda backend: %s", what);
    }
    return false;
}

static int dalloc(struct cuda_backend *b, size_t bytes, sil_cuda_ptr *out, struct sil_error *err)
{
    *out = 0;
    if (bytes == 0) return 0;
    bytes = (bytes + 255) & ~(size_t)255;
    if (b->budget && b->used + bytes > b->budget)
        return sil_errorf(err, -ENOMEM,
                          "cuda backend: --vram-budget of %llu MiB exceeded (%llu MiB in use, "
                          "%zu more needed)",
                          (unsigned long long)(b->budget >> 20),
                          (unsigned long long)(b->used >> 20), bytes);
    if (sil_vec_reserve(&b->allocs, &b->cap_allocs, (size_t)b->n_allocs + 1, 256) < 0)
        return sil_errorf(err, -ENOMEM, "cuda backend: out of memory");
    int rc = sil_cuda_alloc(b->cu, bytes, out, err);
    if (rc < 0) return rc;
    rc = sil_cuda_memset(b->cu, *out, 0, bytes, NULL, err);
    if (rc < 0) {
        sil_cuda_release(b->cu, *out);
        *out = 0;
        return rc;
    }
    b->allocs[b->n_allocs++] = *out;
    b->used += bytes;
    return 0;
}

/* ---- matmul ----------------------------------------------------------------------------- */

static int view(const struct sil_weight *w, int64_t rows, struct sil_cuda_weight *cw,
                struct sil_error *err)
{
    if (w->loc != SIL_WEIGHT_DEVICE)
        return sil_errorf(err, -EINVAL, "cuda backend: a weight is not on the device");
    return sil_cuda_weight_view(w->type, rows, w->cols, dp(w->data), cw, err);
}

/* A weight in host memory: the model's mapping or a block of the engine's host tier. */
static bool on_host(const struct sil_weight *w)
{
    return w->loc == SIL_WEIGHT_MMAP || w->loc == SIL_WEIGHT_HOST;
}

static bool quantized(int type)
{
    return type != SIL_TYPE_F32 && type != SIL_TYPE_F16 && type != SIL_TYPE_BF16;
}

/* b->q8 holds the q8 of the n rows of k at xp (quantized now unless it already does). */
static bool have_q8(struct cuda_backend *b, sil_cuda_ptr xp, int64_t n, int64_t k)
{
    if (b->q8_src == xp && b->q8_n == n && b->q8_k == k) return true;
    if (!ok(b, sil_cuda_quantize_q8(b->cu, xp, n, k, b->q8, NULL, &b->err))) return false;
    b->q8_src = xp;
    b->q8_n = n;
    b->q8_k = k;
    return true;
}

/* y = x W^T for each output, x quantized once. Up to MB rows: the matvec, which reads each
 * weight once; more (prefill): the tensor-core product over all rows in one launch. */
static void mm_chunks(struct cuda_backend *b, struct sil_act x, const struct sil_mm_out *out,
                      int n_out)
{
    if (x.ld != x.width) {
        fail(b, -EINVAL, "matmul input rows are not contiguous");
        return;
    }
    bool any_q = false;
    for (int j = 0; j < n_out; j++)
        any_q = any_q || quantized(out[j].w->type);
    const int64_t step = x.rows > MB ? x.rows : MB;
    for (int64_t r0 = 0; r0 < x.rows && b->rc == 0; r0 += step) {
        const int n = (int)(x.rows - r0 < step ? x.rows - r0 : step);
        const sil_cuda_ptr xp = dp(x.data) + (uint64_t)(r0 * x.ld) * sizeof(float);
        if (any_q && !have_q8(b, xp, n, x.width)) return;
        uint32_t done = 0; /* outputs already computed by a matvec set */
        for (int j = 0; j < n_out && j < 32 && n <= MB; j++) {
            if (done >> j & 1 || !quantized(out[j].w->type)) continue;
            struct sil_cuda_weight cws[SIL_CUDA_MV_SET_MAX];
            const struct sil_cuda_weight *wp[SIL_CUDA_MV_SET_MAX];
            sil_cuda_ptr ys[SIL_CUDA_MV_SET_MAX];
            int64_t lds[SIL_CUDA_MV_SET_MAX];
            int m = 0, idx[SIL_CUDA_MV_SET_MAX];
            for (int i = j; i < n_out && i < 32 && m < SIL_CUDA_MV_SET_MAX; i++) {
                const bool mix = sil_cuda_mv_mixable(out[i].w->type) &&
                                 sil_cuda_mv_mixable(out[j].w->type) && !b->no_mv_mix;
                if (done >> i & 1 || (out[i].w->type != out[j].w->type && !mix) ||
                    out[i].w->cols != out[j].w->cols)
                    continue;
                if (!ok(b, view(out[i].w, out[i].w->rows, &cws[m], &b->err))) return;
                wp[m] = &cws[m];
                ys[m] = dp(out[i].y.data) + (uint64_t)(r0 * out[i].y.ld) * sizeof(float);
                lds[m] = out[i].y.ld;
                idx[m++] = i;
            }
            if (m < 2) continue;
            if (!ok(b, sil_cuda_matvec_multi(b->cu, wp, m, b->q8, n, ys, lds, NULL, &b->err)))
                return;
            for (int i = 0; i < m; i++)
                done |= 1u << idx[i];
        }
        for (int j = 0; j < n_out; j++) {
            if (j < 32 && done >> j & 1) continue;
            struct sil_cuda_weight cw;
            const struct sil_act y = out[j].y;
            if (!ok(b, view(out[j].w, out[j].w->rows, &cw, &b->err))) return;
            const sil_cuda_ptr yp = dp(y.data) + (uint64_t)(r0 * y.ld) * sizeof(float);
            const int rc = n > MB
                               ? sil_cuda_matmul(b->cu, &cw, xp, b->q8, n, yp, y.ld, NULL, &b->err)
                               : sil_cuda_matvec(b->cu, &cw, xp, b->q8, n, yp, y.ld, NULL, &b->err);
            if (!ok(b, rc)) return;
        }
    }
}

/* x += d (d 0: none), y = rmsnorm(x) * w and y's q8 blocks in one launch, x.rows rows. */
static void launch_norm(struct cuda_backend *b, struct sil_act x, sil_cuda_ptr d, struct sil_act y,
                        sil_cuda_ptr w, float eps)
{
    const sil_cuda_ptr yp = dp(y.data);
    if (!ok(b, sil_cuda_fwd_add_rmsnorm_q8(b->cu, b->fwd, dp(x.data), d, yp, w, x.rows, x.width,
                                           eps, b->q8, x.rows * x.width / 32, NULL, &b->err)))
        return;
    b->q8_src = yp;
    b->q8_n = x.rows;
    b->q8_k = x.width;
}

/* Entry of an op that may write activations: the quantized copy of any activation is stale
 * after it. False when the op is to do nothing (replay, error). */
static bool enter(struct cuda_backend *b)
{
    if (b->mode == PASS_REPLAY) return false;
    b->q8_src = 0;
    return b->rc == 0;
}

static void cuda_matmul(struct sil_backend *be, struct sil_act x, const struct sil_mm_out *out,
                        int n)
{
    struct cuda_backend *b = cb(be);
    if (b->mode == PASS_REPLAY || b->rc) return;
    mm_chunks(b, x, out, n);
}

/* ---- element-wise and per-row ops -------------------------------------------------------- */

/* ---- passes and graphs ------------------------------------------------------------------- */

/* The ubatch's int32 inputs into pinned memory: positions, sequences, runs and their sequences,
 * and the rows that want logits (in order: what the forward pass keeps for the head). */
static void stage(struct cuda_backend *b, const struct sil_ubatch *ub, int32_t *n_keep)
{
    memcpy(b->h_pos, ub->pos, sizeof(int32_t) * (size_t)ub->n);
    memcpy(b->h_seq, ub->seq, sizeof(int32_t) * (size_t)ub->n);
    memcpy(b->h_run_start, ub->run_start, sizeof(int32_t) * (size_t)(ub->n_runs + 1));
    for (int32_t r = 0; r < ub->n_runs; r++)
        b->h_run_seq[r] = ub->seq[ub->run_start[r]];
    int32_t j = 0;
    for (int32_t i = 0; i < ub->n; i++)
        if (ub->out_row[i] >= 0) b->h_keep[j++] = i;
    *n_keep = j;
    /* the block tables of the ubatch's sequences; without the engine's, blocks in order */
    const int32_t bps = b->kv_bps, nb = b->kv_nb;
    for (int32_t r = 0; r < ub->n_runs && bps > 0; r++) {
        const int32_t s = b->h_run_seq[r];
        if (s < 0 || s >= b->c.n_seq_max) continue;
        int32_t *t = b->h_btab + (int64_t)s * bps;
        int32_t n = 0;
        const int32_t *tab = ub->kv ? sil_kv_seq_table(ub->kv, s, &n) : NULL;
        for (int32_t k = 0; k < bps; k++)
            t[k] = !ub->kv ? s * bps + k : k < n && tab[k] >= 0 && tab[k] < nb ? tab[k] : 0;
    }
}

static void drop_segs(struct cuda_backend *b, struct graph_slot *g)
{
    for (int i = 0; i < g->n_seg; i++)
        sil_cuda_graph_destroy(b->cu, g->seg[i]);
    g->n_seg = 0;
}

static void abort_capture(struct cuda_backend *b)
{
    if (b->mode != PASS_CAPTURE) return;
    if (!b->seg_gap) {
        struct sil_cuda_graph *g = NULL;
        struct sil_error e = {0};
        sil_cuda_capture_end(b->cu, NULL, &g, &e);
        sil_cuda_graph_destroy(b->cu, g);
    }
    b->mode = PASS_EAGER;
    b->seg_gap = false;
    if (b->cur) {
        b->cur->capturable = false;
        drop_segs(b, b->cur);
    }
    b->cur = NULL;
}

/* Segmented passes. At a host-routed layer, the segment up to its router's choices (copied to
 * pinned memory) ends: captured and launched, replayed, or (eager) just run; the host then
 * waits for the choices, plans, fills slots, uploads slot ids, and the next segment begins at
 * the layer's experts. */
static void seg_end(struct cuda_backend *b)
{
    if (!b->segmented || b->seg_gap || b->rc) return;
    struct graph_slot *c = b->cur;
    if (b->mode == PASS_CAPTURE) {
        struct sil_cuda_graph *g = NULL;
        if (sil_vec_reserve(&c->seg, &c->cap_seg, (size_t)c->n_seg + 1, 64) < 0) {
            abort_capture(b);
            fail(b, -ENOMEM, "out of memory for graph segments");
            return;
        }
        b->seg_gap = true;
        if (!ok(b, sil_cuda_capture_end(b->cu, NULL, &g, &b->err))) {
            b->mode = PASS_EAGER;
            c->capturable = false;
            drop_segs(b, c);
            b->cur = NULL;
            b->segmented = false;
            b->seg_gap = false;
            return;
        }
        c->seg[c->n_seg++] = g;
        ok(b, sil_cuda_graph_launch(b->cu, g, NULL, &b->err));
    } else if (b->mode == PASS_REPLAY) {
        b->seg_gap = true;
        if (b->seg_i >= c->n_seg) {
            fail(b, -EINVAL, "a replayed pass has more segments than were captured");
            return;
        }
        ok(b, sil_cuda_graph_launch(b->cu, c->seg[b->seg_i], NULL, &b->err));
    } else {
        b->seg_gap = true;
    }
    b->seg_i++;
}

static void seg_begin(struct cuda_backend *b)
{
    if (!b->seg_gap || b->rc) return; /* after an error no capture is open: abort_capture knows */
    b->seg_gap = false;
    if (b->mode != PASS_CAPTURE) return;
    struct sil_error e = {0};
    if (sil_cuda_capture_begin(b->cu, NULL, &e) < 0) {
        /* run the rest of this pass eagerly; the shape stays eager */
        b->mode = PASS_EAGER;
        b->cur->capturable = false;
        drop_segs(b, b->cur);
        b->cur = NULL;
        b->segmented = false;
    }
}

/* A decode-sized shape with no run starting a sequence (those reset state from the host) can
 * have a graph; it is matched on its rows, runs and kept rows. */
static struct graph_slot *shape_slot(struct cuda_backend *b, const struct sil_ubatch *ub,
                                     int32_t n_keep)
{
    if (!b->graphs || ub->layered || ub->n > MB || ub->n_runs > MB || ub->n_runs < 1 ||
        n_keep < 1)
        return NULL;
    for (int32_t r = 0; r < ub->n_runs; r++)
        if (ub->pos[ub->run_start[r]] == 0) return NULL;
    struct graph_slot *lru = &b->slots[0];
    for (int i = 0; i < N_GRAPHS; i++) {
        struct graph_slot *g = &b->slots[i];
        if (g->n == ub->n && g->n_runs == ub->n_runs && g->n_keep == n_keep &&
            g->head_out == ub->head_out &&
            !memcmp(g->run_start, ub->run_start, sizeof(int32_t) * (size_t)(ub->n_runs + 1)) &&
            !memcmp(g->keep, b->h_keep, sizeof(int32_t) * (size_t)n_keep))
            return g;
        if (g->used < lru->used) lru = g;
    }
    sil_cuda_graph_destroy(b->cu, lru->g);
    drop_segs(b, lru);
    struct sil_cuda_graph **keep_seg = lru->seg;
    const size_t keep_cap = lru->cap_seg;
    memset(lru, 0, sizeof(*lru));
    lru->seg = keep_seg;
    lru->cap_seg = keep_cap;
    lru->n = ub->n;
    lru->n_runs = ub->n_runs;
    lru->n_keep = n_keep;
    lru->head_out = ub->head_out;
    memcpy(lru->run_start, ub->run_start, sizeof(int32_t) * (size_t)(ub->n_runs + 1));
    memcpy(lru->keep, b->h_keep, sizeof(int32_t) * (size_t)n_keep);
    return lru;
}

static void cuda_begin(struct sil_backend *be, const struct sil_ubatch *ub)
{
    struct cuda_backend *b = cb(be);
    abort_capture(b); /* a pass that ended early (an error) */
    if (b->gev[0]) clock_gettime(CLOCK_MONOTONIC, &b->t_begin);
    b->meta_ok = false;
    b->q8_src = 0;
    b->mode = PASS_EAGER;
    b->cur = NULL;
    b->segmented = false;
    b->seg_gap = false;
    b->seg_i = 0;
    b->zc_pass = false;
    if (b->zc) memset(b->zc_rows, 0, sizeof(int32_t) * (size_t)b->c.n_layer);
    if (b->rc || ub->n <= 0 || ub->n > b->c.ub_max) return;
    /* the micro-batch before (layer by layer) may still be copying up from the staging */
    if (ub->layered && !ok(b, sil_cuda_sync(b->cu, NULL, &b->err))) return;
    int32_t n_keep = 0;
    stage(b, ub, &n_keep);
    b->meta_ok = true; /* staged; copied up by get_rows */
    /* path (b) for decode passes that end in logits (the choices come down with them) */
    b->zc_pass = b->zc && !ub->layered && ub->n <= MB && n_keep >= 1;
    if (b->zc_pass && b->zc_dirty) {
        /* from pageable memory: the copy is taken before this returns, then ordered before
         * the pass on the stream */
        if (!ok(b, sil_cuda_upload(b->cu, b->zc_tab, b->zc_htab,
                                   sizeof(int32_t) * (size_t)(b->c.n_layer * b->c.n_expert), NULL,
                                   &b->err)))
            return;
        b->zc_dirty = false;
    }
    if (b->prof_path && !b->prof_done &&
        (b->prof_rows > 1 ? ub->n == b->prof_rows : ub->n == 1 && ub->pos[0] >= 16)) {
        struct sil_error e = {0};
        b->profiling = sil_cuda_profile(b->cu, true, &e) == 0;
        b->prof_done = true;
        return; /* eager, every launch timed */
    }
    struct graph_slot *g = shape_slot(b, ub, n_keep);
    if (!g) return;
    g->used = ++b->clock;
    b->cur = g;
    b->segmented = b->n_slots > 0 && !b->zc_pass;
    if (g->g || g->n_seg > 0) {
        b->mode = PASS_REPLAY;
    } else if (g->seen >= 1 && g->capturable) {
        struct sil_error e = {0};
        if (sil_cuda_capture_begin(b->cu, NULL, &e) == 0)
            b->mode = PASS_CAPTURE;
        else
            g->capturable = false;
    } else {
        g->capturable = true; /* until an op of this pass syncs */
    }
}

/* Layer by layer: micro-batch ub's ops follow another's. ub's inputs are staged and copied up
 * again once the copies of the last staging are done. Such passes are eager (begin records no
 * graph). */
static void cuda_resume(struct sil_backend *be, const struct sil_ubatch *ub)
{
    struct cuda_backend *b = cb(be);
    b->q8_src = 0;
    b->meta_ok = false;
    if (b->rc) return;
    if (b->mode != PASS_EAGER || ub->n <= 0 || ub->n > b->c.ub_max) {
        fail(b, -EINVAL, "a micro-batch resumed in a recorded pass or out of size");
        return;
    }
    if (!ok(b, sil_cuda_sync(b->cu, NULL, &b->err))) return;
    int32_t n_keep;
    stage(b, ub, &n_keep);
    if (!ok(b, sil_cuda_upload(b->cu, b->meta + b->ints_off, (char *)b->h_meta + b->ints_off,
                               b->meta_bytes - b->ints_off, NULL, &b->err)))
        return;
    b->meta_ok = true;
}

/* An op that needs the host in the middle of the pass: this shape cannot be a graph. */
static void not_capturable(struct cuda_backend *b)
{
    if (b->cur) b->cur->capturable = false;
}

static void cuda_get_rows(struct sil_backend *be, const struct sil_weight *w, const int32_t *ids,
                          struct sil_act y)
{
    struct cuda_backend *b = cb(be);
    b->q8_src = 0;
    if (b->rc) return;
    if (w->loc != SIL_WEIGHT_MMAP && w->loc != SIL_WEIGHT_HOST) {
        fail(b, -EINVAL, "the embedding table is not in host memory");
        return;
    }
    if (y.ld != y.width || y.width != b->c.n_embd || y.rows > b->c.ub_max) {
        fail(b, -EINVAL, "embedding rows are not contiguous");
        return;
    }
    const size_t rs = sil_row_size(w->type, w->cols);
    for (int64_t i = 0; i < y.rows; i++)
        sil_dequantize_row(w->type, (const char *)w->data + (size_t)ids[i] * rs,
                           b->emb + i * w->cols, w->cols);
    if (b->mode == PASS_REPLAY) return;
    /* y is the first rows of the activation the staged block's device copy sits beside */
    ok(b, sil_cuda_upload(b->cu, dp(y.data), b->emb, sizeof(float) * (size_t)(y.rows * y.width),
                          NULL, &b->err));
    if (b->meta_ok)
        ok(b, sil_cuda_upload(b->cu, b->meta + b->ints_off, (char *)b->h_meta + b->ints_off,
                              b->meta_bytes - b->ints_off, NULL, &b->err));
}

static void cuda_copy_rows(struct sil_backend *be, struct sil_act y, struct sil_act x,
                           const int32_t *rows)
{
    struct cuda_backend *b = cb(be);
    b->q8_src = 0;
    if (b->rc || y.rows == 0) return;
    sil_cuda_ptr rp = b->keep;
    if (!b->meta_ok || memcmp(rows, b->h_keep, sizeof(int32_t) * (size_t)y.rows) != 0) {
        /* not the staged rows: copied up from pageable memory, outside any graph */
        if (b->mode != PASS_EAGER) {
            fail(b, -EINVAL, "copy_rows of unstaged rows in a graph");
            return;
        }
        not_capturable(b);
        if (!ok(b, sil_cuda_upload(b->cu, b->rows, rows, sizeof(int32_t) * (size_t)y.rows, NULL,
                                   &b->err)))
            return;
        rp = b->rows;
    }
    if (b->mode == PASS_REPLAY) return;
    ok(b, sil_cuda_fwd_gather_rows(b->cu, b->fwd, dp(y.data), y.ld, dp(x.data), x.ld, rp, y.width,
                                   y.rows, NULL, &b->err));
}

/* The rows launch_norm takes: contiguous, whole q8 blocks, within the q8 buffer. */
static bool norm_fuses(const struct cuda_backend *b, struct sil_act y, struct sil_act x)
{
    return x.rows > 0 && x.ld == x.width && y.ld == y.width && x.width % 32 == 0 &&
           x.width <= b->c.k_max && x.rows <= (b->c.ub_max > MB ? b->c.ub_max : MB);
}

static void cuda_rmsnorm(struct sil_backend *be, struct sil_act y, struct sil_act x,
                         const struct sil_weight *w, float eps)
{
    struct cuda_backend *b = cb(be);
    if (!enter(b) || x.rows == 0) return;
    if (x.ld != x.width || y.ld != y.width) {
        fail(b, -EINVAL, "rmsnorm rows are not contiguous");
        return;
    }
    /* the norm and its q8 blocks in one kernel */
    if (!norm_fuses(b, y, x)) {
        ok(b, sil_cuda_rmsnorm(b->cu, dp(y.data), dp(x.data), dp(w->data), x.rows, x.width, eps,
                               NULL, &b->err));
        return;
    }
    launch_norm(b, x, 0, y, dp(w->data), eps);
}

static void cuda_add(struct sil_backend *be, struct sil_act y, struct sil_act x)
{
    struct cuda_backend *b = cb(be);
    if (!enter(b) || y.rows == 0) return;
    if (y.ld == y.width && x.ld == x.width) {
        ok(b, sil_cuda_add(b->cu, dp(y.data), dp(x.data), y.rows * y.width, NULL, &b->err));
        return;
    }
    for (int64_t i = 0; i < y.rows && b->rc == 0; i++)
        ok(b, sil_cuda_add(b->cu, dp(y.data) + (uint64_t)(i * y.ld) * 4,
                           dp(x.data) + (uint64_t)(i * x.ld) * 4, y.width, NULL, &b->err));
}

/* x += d, the norm and its q8 blocks in one kernel where the rows are contiguous; else the add,
 * then the norm. */
static void cuda_add_rmsnorm(struct sil_backend *be, struct sil_act y, struct sil_act x,
                             struct sil_act d, const struct sil_weight *w, float eps)
{
    struct cuda_backend *b = cb(be);
    if (!enter(b) || x.rows == 0) return;
    if (d.ld != d.width || !norm_fuses(b, y, x)) {
        cuda_add(be, x, d);
        cuda_rmsnorm(be, y, x, w, eps);
        return;
    }
    launch_norm(b, x, dp(d.data), y, dp(w->data), eps);
}

static void cuda_swiglu(struct sil_backend *be, struct sil_act y, struct sil_act gate,
                        struct sil_act up)
{
    struct cuda_backend *b = cb(be);
    if (!enter(b) || y.rows == 0) return;
    if (y.ld != y.width || gate.ld != gate.width || up.ld != up.width) {
        fail(b, -EINVAL, "swiglu rows are not contiguous");
        return;
    }
    ok(b, sil_cuda_swiglu(b->cu, dp(y.data), dp(gate.data), dp(up.data), y.rows * y.width, NULL,
                          &b->err));
}

/* ---- attention and the delta net --------------------------------------------------------- */

/* Positions, sequences and sequence runs of the ubatch on the device: staged by begin() and
 * copied up with the embedding rows; here when the ops run without begin(). */
static bool upload_meta(struct cuda_backend *b, const struct sil_ubatch *ub)
{
    if (b->meta_ok) return true;
    if (ub->n > b->c.ub_max)
        return fail(b, -EINVAL, "ubatch larger than the backend was sized for");
    int32_t n_keep;
    stage(b, ub, &n_keep);
    not_capturable(b);
    if (!ok(b, sil_cuda_upload(b->cu, b->meta + b->ints_off, (char *)b->h_meta + b->ints_off,
                               b->meta_bytes - b->ints_off, NULL, &b->err)))
        return false;
    b->meta_ok = true;
    return true;
}

static void cuda_attention(struct sil_backend *be, const struct sil_ubatch *ub,
                           const struct sil_attn_args *a)
{
    struct cuda_backend *b = cb(be);
    if (!enter(b)) return;
    if (b->rc || ub->n == 0 || !upload_meta(b, ub)) return;
    const int hd = a->head_dim;
    const bool kv_blocks = b->c.kv_type == SIL_KV_Q8_0 || b->c.kv_type == SIL_KV_Q4_0;
    if (hd > 1024 || (int64_t)a->n_head_kv * hd != b->c.kv_dim || a->n_head % a->n_head_kv ||
        (kv_blocks && hd % 32)) {
        fail(b, -EINVAL, "attention shape outside what the kernels take");
        return;
    }
    if (b->kv_bps <= 0) {
        fail(b, -EINVAL, "attention without KV blocks");
        return;
    }
    const uint64_t layer = (uint64_t)a->layer * (uint64_t)(b->kv_nb * SIL_KV_BLOCK) *
                           sil_kv_type_bytes(b->c.kv_type, b->c.kv_dim);
    const struct sil_cuda_attn at = {
        .q = dp(a->q.data),
        .k = dp(a->k.data),
        .v = dp(a->v.data),
        .o = dp(a->o.data),
        .ldq = a->q.ld,
        .ldk = a->k.ld,
        .ldv = a->v.ld,
        .ldo = a->o.ld,
        .q_stride = a->gated ? 2 * hd : hd,
        .q_norm = dp(a->q_norm->data),
        .k_norm = dp(a->k_norm->data),
        .pos = b->pos,
        .seq = b->seq,
        .n_head = a->n_head,
        .n_head_kv = a->n_head_kv,
        .head_dim = hd,
        .n_rot = a->n_rot,
        .n_ctx = (int)b->c.n_ctx,
        .gated = a->gated,
        .freq_base = a->rope_freq_base,
        .eps = a->eps,
        .kv = (enum sil_cuda_kv)b->c.kv_type,
        .kc = b->kv_k + layer,
        .vc = b->kv_v + layer,
        .btab = b->btab,
        .bps = b->kv_bps,
    };
    const int n_head = at.n_head, n_kv = at.n_head_kv;
    const sil_cuda_ptr o = at.o;
    const int64_t ldo = at.ldo;
    if (!ok(b, sil_cuda_fwd_qk_prep(b->cu, b->fwd, &at, ub->n, NULL, &b->err))) return;
    /* decode: the context split over attn_split blocks a head, then merged; prefill rows too,
     * MB a launch, where SIL_CUDA_PREFILL_SPLIT asks for it and the ubatch reaches that far */
    const bool part_ok = b->attn_part && hd == b->c.head_dim;
    bool split = part_ok && ub->n <= MB;
    if (part_ok && !split && b->split_from > 0)
        for (int32_t i = 0; i < ub->n && !split; i++)
            split = ub->pos[i] >= b->split_from;
    const int nz = b->attn_split;
    /* query heads sharing a KV head read its rows once (GQA_MAX 8, GQA_HD 256 in fwd.cu) */
    const int G = n_head / n_kv;
    const bool gqa = G >= 2 && G <= 8 && hd <= 256 && !b->no_gqa;
    /* the rows in launches: MB for the split, else as many as the scores buffer holds */
    const int64_t step = split ? MB : b->scores_rows;
    for (int64_t r0 = 0; r0 < ub->n && b->rc == 0; r0 += step) {
        const int64_t n = ub->n - r0 < step ? ub->n - r0 : step;
        if (!split) {
            ok(b, sil_cuda_fwd_attend(b->cu, b->fwd, &at, r0, n, b->scores, NULL, &b->err));
            continue;
        }
        if (!ok(b, sil_cuda_fwd_attend_part(b->cu, b->fwd, &at, r0, n, nz, gqa, b->attn_part,
                                            NULL, &b->err)))
            return;
        /* one launch for the ubatch: the merge also writes the q8 of o that the output
         * projection reads (its blocks are the merge's 32-column blocks) */
        const int64_t width = (int64_t)n_head * hd;
        const bool q8o = !b->no_attn_q8 && n == ub->n && hd % 32 == 0 && ldo == width &&
                         width <= b->c.k_max;
        if (!ok(b, sil_cuda_fwd_attend_combine(b->cu, b->fwd, &at, r0, n, nz, b->attn_part,
                                               q8o ? b->q8 : 0, q8o ? n * width / 32 : 0, NULL,
                                               &b->err)))
            return;
        if (q8o) {
            atomic_fetch_add_explicit(&b->fused[1], 1, memory_order_relaxed);
            b->q8_src = o;
            b->q8_n = (int)n;
            b->q8_k = width;
        }
    }
}

/* A run from position 0 starts from the empty state, as the engine's host copy does. */
static bool fresh_states(struct cuda_backend *b, const struct sil_ubatch *ub,
                         const struct sil_delta_net_args *a)
{
    const int64_t st_floats = sil_delta_net_state_floats(a->p);
    for (int32_t r = 0; r < ub->n_runs; r++) {
        const int32_t i = ub->run_start[r];
        if (ub->pos[i] != 0) continue;
        const sil_cuda_ptr s =
            b->state +
            (uint64_t)((int64_t)ub->seq[i] * b->c.recr_floats + a->state.offset) * sizeof(float);
        if (!ok(b, sil_cuda_memset(b->cu, s, 0, sizeof(float) * (size_t)st_floats, NULL, &b->err)))
            return false;
    }
    return true;
}

/* The conv1d in the launch of the matvec set o[0..n_out) of x, where the set writes its input
 * and every run is one token of the ubatch's rows in order; false: not taken. */
static bool conv_in_set(struct cuda_backend *b, const struct sil_ubatch *ub, struct sil_act x,
                        const struct sil_mm_out *o, int n_out, const struct sil_delta_net_args *a)
{
    const int K = a->p->conv_kernel;
    if (b->no_conv_fuse || n_out != SIL_CUDA_MV_SET_MAX || x.rows < 1 || x.rows > CONV_FUSE_ROWS ||
        b->rc || b->mode == PASS_REPLAY || o[0].y.data != a->qkv_mixed.data || ub->n != x.rows ||
        ub->n_runs != ub->n || ub->n > MB || K < 1 || K > 9 || x.ld != x.width ||
        x.width % SIL_CUDA_Q8_BLOCK || o[0].w->rows != sil_delta_net_conv_dim(a->p) ||
        a->conv1d->type != SIL_TYPE_F32 || a->conv_out.ld < o[0].w->rows)
        return false;
    for (int32_t r = 0; r < ub->n_runs; r++)
        if (ub->run_start[r] != r) return false;
    for (int i = 0; i < n_out; i++)
        if (!sil_cuda_mv_mixable(o[i].w->type) || o[i].w->cols != x.width) return false;
    if (!upload_meta(b, ub) || !fresh_states(b, ub, a)) return true;
    const int n = (int)x.rows;
    if (!have_q8(b, dp(x.data), n, x.width)) return true;
    struct sil_cuda_weight cws[SIL_CUDA_MV_SET_MAX];
    const struct sil_cuda_weight *wp[SIL_CUDA_MV_SET_MAX];
    sil_cuda_ptr ys[SIL_CUDA_MV_SET_MAX];
    int64_t lds[SIL_CUDA_MV_SET_MAX];
    for (int i = 0; i < n_out; i++) {
        if (!ok(b, view(o[i].w, o[i].w->rows, &cws[i], &b->err))) return true;
        wp[i] = &cws[i];
        ys[i] = dp(o[i].y.data);
        lds[i] = o[i].y.ld;
    }
    const struct sil_cuda_conv_ep ep = {dp(a->conv_out.data), a->conv_out.ld,
                                        dp(a->conv1d->data),  b->run_seq,
                                        b->state_tab,         a->state.offset,
                                        K};
    if (ok(b, sil_cuda_matvec_multi_conv(b->cu, wp, n_out, b->q8, n, ys, lds, &ep, NULL, &b->err)))
        atomic_fetch_add_explicit(&b->fused[0], 1, memory_order_relaxed);
    return true;
}

static void cuda_conv1d(struct sil_backend *be, const struct sil_ubatch *ub,
                        const struct sil_delta_net_args *a)
{
    struct cuda_backend *b = cb(be);
    if (!enter(b)) return;
    if (b->rc || ub->n == 0 || !upload_meta(b, ub)) return;
    const struct sil_delta_net_params *p = a->p;
    if (!fresh_states(b, ub, a)) return;
    if (p->conv_kernel < 1 || p->conv_kernel > 9) {
        fail(b, -EINVAL, "conv1d kernel longer than 9 taps");
        return;
    }
    ok(b, sil_cuda_fwd_conv1d(b->cu, b->fwd, dp(a->qkv_mixed.data), a->qkv_mixed.ld,
                              dp(a->conv_out.data), a->conv_out.ld, dp(a->conv1d->data),
                              p->conv_kernel, sil_delta_net_conv_dim(p), b->run_start, b->run_seq,
                              b->state_tab, a->state.offset, ub->n_runs, NULL, &b->err));
}

/* The matvec set with the conv1d in its launch where conv_in_set takes the shape; else the
 * matmul, then the conv1d. */
static void cuda_matmul_conv1d(struct sil_backend *be, const struct sil_ubatch *ub,
                               struct sil_act x, const struct sil_mm_out *out, int n,
                               const struct sil_delta_net_args *a)
{
    struct cuda_backend *b = cb(be);
    if (conv_in_set(b, ub, x, out, n, a)) return;
    cuda_matmul(be, x, out, n);
    cuda_conv1d(be, ub, a);
}

static void cuda_delta_net(struct sil_backend *be, const struct sil_ubatch *ub,
                           const struct sil_delta_net_args *a)
{
    struct cuda_backend *b = cb(be);
    if (!enter(b)) return;
    if (b->rc || ub->n == 0 || !upload_meta(b, ub)) return;
    const struct sil_delta_net_params *p = a->p;
    if (p->head_k_dim > 1024 || p->head_v_dim > 1024) {
        fail(b, -EINVAL, "delta-net head dims above 1024");
        return;
    }
    const struct sil_cuda_dn d = {
        .conv = dp(a->conv_out.data),
        .z = dp(a->z.data),
        .alpha = dp(a->alpha.data),
        .beta = dp(a->beta.data),
        .out = dp(a->out.data),
        .ldc = a->conv_out.ld,
        .ldz = a->z.ld,
        .lda = a->alpha.ld,
        .ldb = a->beta.ld,
        .ldo = a->out.ld,
        .a = dp(a->a->data),
        .dt_bias = dp(a->dt_bias->data),
        .norm = dp(a->norm->data),
        .nk = p->n_k_heads,
        .nv = p->n_v_heads,
        .dk = p->head_k_dim,
        .dv = p->head_v_dim,
        .eps = p->eps,
        .run_start = b->run_start,
        .run_seq = b->run_seq,
        .state_tab = b->state_tab,
        .offset = a->state.offset,
        .ssm_offset = sil_delta_net_conv_floats(p),
    };
    const int nv = d.nv, dk = d.dk, dv = d.dv;
    const sil_cuda_ptr out = d.out;
    if (dk % 32 != 0 || dk > 256) {
        ok(b, sil_cuda_fwd_delta_net(b->cu, b->fwd, &d, ub->n_runs, NULL, &b->err));
        return;
    }
    /* state rows over blocks (8 a block), then the gated norm with its q8 blocks: in decode
     * the last block of each head runs it (dn_done counts them), in prefill its own launch */
    const int64_t width = (int64_t)nv * dv, n = ub->n;
    const bool q = d.ldo == width && dv % 32 == 0 && width <= b->c.k_max &&
                   n <= (b->c.ub_max > MB ? b->c.ub_max : MB);
    const sil_cuda_ptr q8 = q ? b->q8 : 0;
    const int64_t nblocks = q ? n * width / 32 : 0;
    const bool fuse = !b->no_dn_fuse && b->dn_done && n <= MB && nv <= DN_DONE_HEADS;
    if (!ok(b, sil_cuda_fwd_delta_rule(b->cu, b->fwd, &d, ub->n_runs, fuse ? b->dn_done : 0, q8,
                                       nblocks, NULL, &b->err)))
        return;
    if (!fuse && !ok(b, sil_cuda_fwd_gated_norm_q8(b->cu, b->fwd, &d, n, q8, nblocks, NULL,
                                                   &b->err)))
        return;
    if (!q) return;
    b->q8_src = out;
    b->q8_n = n;
    b->q8_k = width;
}

/* ---- router and experts ------------------------------------------------------------------ */

/* The fused kernels take these experts straight from the router's output. */
/* Experts the fused kernels run: quantized, gate and up of one type, and K routed experts a token
 * (plus the shared one) within the slots down takes; the others take the per-expert path. */
static bool fused_types(const struct sil_weight *g, const struct sil_weight *u,
                        const struct sil_weight *d, int K)
{
    return quantized(g->type) && u->type == g->type && quantized(d->type) &&
           K + 1 <= SIL_CUDA_MOE_SLOTS_MAX;
}

static bool device_routable(const struct cuda_backend *b, const struct sil_moe_plan *pl)
{
    const struct sil_weight *g = pl->gate_exps, *u = pl->up_exps, *d = pl->down_exps;
    return !b->host_route && g && u && d && g->loc == SIL_WEIGHT_DEVICE &&
           u->loc == SIL_WEIGHT_DEVICE && d->loc == SIL_WEIGHT_DEVICE &&
           fused_types(g, u, d, pl->n_used) && g->n_mat == b->c.n_expert;
}

/* A decode pass of path (b), and a layer whose experts the fused kernels run from slots or
 * from the pinned mapping. */
static bool zc_routable(const struct cuda_backend *b, const struct sil_moe_plan *pl, int n)
{
    const struct sil_weight *g = pl->gate_exps, *u = pl->up_exps, *d = pl->down_exps;
    return b->zc_pass && n <= MB && pl->layer >= 0 && pl->layer < b->c.n_layer && g && u && d &&
           g->loc == SIL_WEIGHT_MMAP && u->loc == SIL_WEIGHT_MMAP && d->loc == SIL_WEIGHT_MMAP &&
           fused_types(g, u, d, pl->n_used) && g->n_mat == b->c.n_expert && u->n_mat == g->n_mat &&
           d->n_mat == g->n_mat;
}

static sil_cuda_ptr zc_ids_of(const struct cuda_backend *b, int32_t layer)
{
    return b->zc_ids + (uint64_t)layer * (uint64_t)(MB * b->c.n_expert_used) * 4;
}

/* The device address of p in the pinned mapping, 0 when it is not there. */
static sil_cuda_ptr host_dev(const struct cuda_backend *b, const void *p)
{
    const uintptr_t a = (uintptr_t)p;
    for (int i = 0; b->rng_dev && i < b->n_rng; i++)
        if (a >= b->rng[i].lo && a < b->rng[i].hi) return b->rng_dev[i] + (a - b->rng[i].lo);
    return 0;
}

/* The norm of add_rmsnorm_route (x += d, y = rmsnorm(x) * w) in its router's launch. */
struct router_norm {
    struct sil_act x;
    sil_cuda_ptr d, w;
    float eps;
};

/* add_rmsnorm_route's norm and router in one launch: one token whose norm kernel takes the
 * width, into an F32 router on the device that the fused kernel with the norm takes. */
static bool router_takes_norm(const struct cuda_backend *b, struct sil_act y, struct sil_act x,
                              struct sil_act d, const struct sil_weight *w, int K)
{
    return b->mode != PASS_REPLAY && b->rc == 0 && x.rows == 1 && y.rows == 1 &&
           y.width == x.width && d.ld == d.width && norm_fuses(b, y, x) &&
           sil_cuda_router_norm_ok(x.width) && !b->no_norm_router && !b->no_router_fuse &&
           b->router_done && w->cols == x.width && w->type == SIL_TYPE_F32 &&
           w->loc == SIL_WEIGHT_DEVICE && w->rows <= 1024 && K <= 32 && K <= w->rows;
}

/* The router's choices for x's n rows on the device: ids, and b->wts. A decode batch with an F32
 * router of at most 1024 experts takes one launch (matvec and top-k; for one token with the
 * norm that makes x when rn is given), else two. */
static void router(struct cuda_backend *b, struct sil_act x, const struct sil_weight *w, int n,
                   int X, int K, sil_cuda_ptr ids, const struct router_norm *rn)
{
    if (rn) {
        struct sil_cuda_weight cw;
        const struct sil_cuda_norm_in nt = {dp(rn->x.data), rn->w,          dp(x.data),
                                            b->q8,          b->router_done, rn->eps};
        if (ok(b, view(w, w->rows, &cw, &b->err)) &&
            ok(b, sil_cuda_router_norm(b->cu, &cw, rn->d, &nt, b->router, K, ids, b->wts, NULL,
                                       &b->err))) {
            atomic_fetch_add_explicit(&b->fused[2], 1, memory_order_relaxed);
            b->q8_src = dp(x.data);
            b->q8_n = 1;
            b->q8_k = x.width;
        }
        return;
    }
    if (!b->no_router_fuse && b->router_done && n <= MB && w->type == SIL_TYPE_F32 &&
        w->loc == SIL_WEIGHT_DEVICE && X <= 1024 && K <= 32 && x.ld == x.width) {
        struct sil_cuda_weight cw;
        if (ok(b, view(w, w->rows, &cw, &b->err)))
            ok(b, sil_cuda_router_fused(b->cu, &cw, dp(x.data), n, b->router, K, ids, b->wts,
                                        b->router_done, NULL, &b->err));
        return;
    }
    const struct sil_mm_out lo = {w, {(void *)(uintptr_t)b->router, x.rows, X, X}};
    mm_chunks(b, x, &lo, 1);
    if (b->rc == 0)
        ok(b, sil_cuda_router_topk(b->cu, b->router, n, X, K, ids, b->wts, NULL, &b->err));
}

/* route, with the norm that makes x in the router's launch when rn is given. */
static void route(struct cuda_backend *b, struct sil_act x, const struct sil_weight *w, int n_used,
                  struct sil_moe_plan *plan, const struct router_norm *rn)
{
    const int X = (int)w->rows, K = n_used, n = (int)x.rows;
    plan->n_rows = n;
    plan->n_used = K;
    /* path (b): routed on the device over the slot table; the choices stay in zc_ids */
    if (b->rc == 0 && n > 0 && zc_routable(b, plan, n)) {
        plan->device_routed = true;
        b->zc_rows[plan->layer] = n;
        if (b->mode == PASS_REPLAY) return;
        router(b, x, w, n, X, K, zc_ids_of(b, plan->layer), rn);
        return;
    }
    /* prefill brings the choices back for the grouped products */
    if (b->rc == 0 && n > 0 && (n <= MB || b->no_grouped) && device_routable(b, plan)) {
        plan->device_routed = true;
        if (b->mode == PASS_REPLAY) return;
        router(b, x, w, n, X, K, b->ids, rn);
        return;
    }
    if (b->rc || n == 0 || (b->mode != PASS_EAGER && !b->segmented)) {
        if (b->rc == 0 && n > 0) fail(b, -EINVAL, "host routing inside a graph");
        /* keep the plan well-formed for moe_plan() even after an error */
        for (int64_t q = 0; q < (int64_t)n * K; q++) {
            plan->sel_expert[q] = (int32_t)(q % K) % X;
            plan->sel_weight[q] = 0.0f;
        }
        return;
    }
    if (!b->segmented) not_capturable(b);
    /* the plan is built on the host: the choices come back (n * K * 8 bytes, pinned) */
    const size_t bytes = sizeof(int32_t) * (size_t)(n * K);
    int32_t *h_ids = b->h_ids;
    float *h_wts = (float *)(b->h_ids + b->c.ub_max * K);
    if (b->mode != PASS_REPLAY) {
        router(b, x, w, n, X, K, b->ids, rn);
        if (b->rc == 0) ok(b, sil_cuda_download(b->cu, h_ids, b->ids, bytes, NULL, &b->err));
        if (b->rc == 0) ok(b, sil_cuda_download(b->cu, h_wts, b->wts, bytes, NULL, &b->err));
        /* path (c): the MoE input too, for the experts the host computes */
        if (b->rc == 0 && b->hx && n <= MB) {
            if (x.ld != x.width)
                fail(b, -EINVAL, "router rows are not contiguous");
            else
                ok(b, sil_cuda_download(b->cu, b->h_x, dp(x.data),
                                        sizeof(float) * (size_t)(n * x.width), NULL, &b->err));
        }
    }
    seg_end(b);
    if (b->rc == 0) ok(b, sil_cuda_sync(b->cu, NULL, &b->err));
    if (b->rc == 0) {
        memcpy(plan->sel_expert, h_ids, bytes);
        memcpy(plan->sel_weight, h_wts, bytes);
    }
    for (int64_t q = 0; q < (int64_t)n * K; q++)
        if (b->rc || plan->sel_expert[q] < 0 || plan->sel_expert[q] >= X) {
            fail(b, -EIO, "router returned an expert id out of range");
            plan->sel_expert[q] = 0;
        }
}

static void cuda_route(struct sil_backend *be, struct sil_act x, const struct sil_weight *w,
                       int n_used, struct sil_moe_plan *plan)
{
    route(cb(be), x, w, n_used, plan, NULL);
}

/* The norm in the router's launch where router_takes_norm; else add_rmsnorm, then route. */
static void cuda_add_rmsnorm_route(struct sil_backend *be, struct sil_act y, struct sil_act x,
                                   struct sil_act d, const struct sil_weight *norm, float eps,
                                   const struct sil_weight *w, int n_used,
                                   struct sil_moe_plan *plan)
{
    struct cuda_backend *b = cb(be);
    if (!router_takes_norm(b, y, x, d, w, n_used)) {
        cuda_add_rmsnorm(be, y, x, d, norm, eps);
        cuda_route(be, y, w, n_used, plan);
        return;
    }
    b->q8_src = 0; /* x and y are written */
    const struct router_norm rn = {x, dp(d.data), dp(norm->data), eps};
    route(b, y, w, n_used, plan, &rn);
}

/* Shared expert into out: sigmoid(gate_inp . x) * down(silu(gate x) * up x), then out +=
 * routed (already in b->routed). x is quantized in b->q8 for chunk [r0, r0 + n). */
static void shared_and_sum(struct cuda_backend *b, struct sil_act x, const struct sil_moe_plan *pl,
                           struct sil_act out)
{
    const int64_t E = out.width;
    sil_cuda_ptr outp = dp(out.data);
    if (!pl->sh_gate_inp) {
        ok(b, sil_cuda_copy_d2d(b->cu, outp, b->routed, sizeof(float) * (size_t)(x.rows * E), NULL,
                                &b->err));
        return;
    }
    const int64_t S = pl->sh_gate->rows;
    const struct sil_mm_out gu[] = {
        {pl->sh_gate, {(void *)(uintptr_t)b->sh_gate, x.rows, S, S}},
        {pl->sh_up, {(void *)(uintptr_t)b->sh_up, x.rows, S, S}},
        {pl->sh_gate_inp, {(void *)(uintptr_t)b->sh_logit, x.rows, 1, 1}},
    };
    mm_chunks(b, x, gu, 3);
    if (b->rc ||
        !ok(b, sil_cuda_swiglu(b->cu, b->sh_gate, b->sh_gate, b->sh_up, x.rows * S, NULL, &b->err)))
        return;
    const struct sil_mm_out d = {pl->sh_down, out};
    mm_chunks(b, (struct sil_act){(void *)(uintptr_t)b->sh_gate, x.rows, S, S}, &d, 1);
    if (b->rc) return;
    ok(b, sil_cuda_fwd_gate_add(b->cu, b->fwd, outp, out.ld, b->sh_logit, b->routed, E, E, x.rows,
                                NULL, &b->err));
}

/* Quantized experts: the fused kernels over the stacked tensors, 8 rows at a time. */
/* The shared expert can ride in the fused kernels as slot k: a routed expert's shape and types,
 * resident, with an F32 gate over the embedding. */
static bool shared_fusable(const struct cuda_backend *b, const struct sil_moe_plan *pl, int64_t E)
{
    const struct sil_weight *gi = pl->sh_gate_inp, *sg = pl->sh_gate, *su = pl->sh_up,
                            *sd = pl->sh_down;
    return gi && sg && su && sd && !b->no_shared_fuse && gi->loc == SIL_WEIGHT_DEVICE &&
           sg->loc == SIL_WEIGHT_DEVICE && su->loc == SIL_WEIGHT_DEVICE &&
           sd->loc == SIL_WEIGHT_DEVICE && gi->type == SIL_TYPE_F32 && gi->cols == E &&
           gi->rows == 1 && sg->type == pl->gate_exps->type && su->type == pl->gate_exps->type &&
           sd->type == pl->down_exps->type && sg->rows == pl->gate_exps->rows &&
           su->rows == sg->rows && sg->cols == E && sd->rows == pl->down_exps->rows &&
           sd->cols == pl->down_exps->cols;
}

/* The routed stacks in the pinned mapping behind slot views g, u, d (reads in place) with the
 * layer's slot table tab [n_expert]. False (the backend failed) when the stacks are not in the
 * mapping. */
static bool host_views(struct cuda_backend *b, const struct sil_moe_plan *pl, sil_cuda_ptr tab,
                       struct sil_cuda_weight *g, struct sil_cuda_weight *u,
                       struct sil_cuda_weight *d)
{
    const int n_slot = (int)b->n_slots;
    g->host = host_dev(b, pl->gate_exps->data);
    u->host = host_dev(b, pl->up_exps->data);
    d->host = host_dev(b, pl->down_exps->data);
    g->host_stride = pl->gate_exps->mat_bytes;
    u->host_stride = pl->up_exps->mat_bytes;
    d->host_stride = pl->down_exps->mat_bytes;
    g->tab = u->tab = d->tab = tab;
    g->n_slot = u->n_slot = d->n_slot = n_slot;
    if (g->host && u->host && d->host) return true;
    fail(b, -EINVAL, "routed experts outside the pinned mapping");
    return false;
}

/* Quantized experts: the fused kernels over the stacked tensors, 8 rows at a time, into
 * b->routed; with the shared expert fused (true returned), the whole MoE output into out. */
static bool moe_fused(struct cuda_backend *b, struct sil_act x, const struct sil_moe_plan *pl,
                      int X, struct sil_act out)
{
    const int K = pl->n_used;
    const int64_t E = x.width;
    const bool sh = shared_fusable(b, pl, E);
    /* path (b): the router's expert ids stay as they are, the kernels look them up */
    const bool zc = b->n_slots > 0 && pl->device_routed && b->zc_pass;
    const sil_cuda_ptr ids0 = zc ? zc_ids_of(b, pl->layer) : b->ids;
    struct sil_cuda_weight g = {0}, u = {0}, d = {0}, sg, su, sd;
    if (b->n_slots > 0) {
        /* the slot pools as stacks of n_slots matrices, b->ids holding slot numbers */
        const int64_t F = pl->gate_exps->rows, R = pl->down_exps->rows;
        if (!ok(b, sil_cuda_weight_view(pl->gate_exps->type, F * X, E, b->pool_g, &g, &b->err)) ||
            !ok(b, sil_cuda_weight_view(pl->up_exps->type, F * X, E, b->pool_u, &u, &b->err)) ||
            !ok(b, sil_cuda_weight_view(pl->down_exps->type, R * X, pl->down_exps->cols, b->pool_d,
                                        &d, &b->err)))
            return false;
        g.mat_stride = b->slot_g;
        u.mat_stride = b->slot_u;
        d.mat_stride = b->slot_d;
        /* path (b): slots where the table says, the mapping in place elsewhere */
        if (zc && !host_views(b, pl, b->zc_tab + (uint64_t)pl->layer * (uint64_t)X * 4, &g, &u,
                              &d))
            return false;
    } else if (!ok(b, view(pl->gate_exps, pl->gate_exps->rows * X, &g, &b->err)) ||
               !ok(b, view(pl->up_exps, pl->up_exps->rows * X, &u, &b->err)) ||
               !ok(b, view(pl->down_exps, pl->down_exps->rows * X, &d, &b->err)))
        return false;
    if (sh && (!ok(b, view(pl->sh_gate, pl->sh_gate->rows, &sg, &b->err)) ||
               !ok(b, view(pl->sh_up, pl->sh_up->rows, &su, &b->err)) ||
               !ok(b, view(pl->sh_down, pl->sh_down->rows, &sd, &b->err))))
        return false;
    const int64_t F = pl->gate_exps->rows, K1 = sh ? K + 1 : K;
    for (int64_t r0 = 0; r0 < x.rows && b->rc == 0; r0 += MB) {
        const int n = (int)(x.rows - r0 < MB ? x.rows - r0 : MB);
        const sil_cuda_ptr xp = dp(x.data) + (uint64_t)(r0 * E) * 4;
        const sil_cuda_ptr ids = ids0 + (uint64_t)(r0 * K) * 4,
                           w = b->wts + (uint64_t)(r0 * K) * 4;
        const sil_cuda_ptr lg = b->sh_logit + (uint64_t)r0 * 4;
        if (!have_q8(b, xp, n, E)) return sh;
        /* the hidden rows' q8 by gate/up's last block of each row, or a launch of its own;
         * decode only: a prefill's chunks ran 8% slower fused (resident 35B shape, pp512) */
        const bool hq = !b->no_h8_fuse && b->moe_done && F % 32 == 0 && x.rows <= MB;
        const sil_cuda_ptr h8 = hq ? b->q8h : 0, done = hq ? b->moe_done : 0;
        const int rc =
            sh ? sil_cuda_moe_gate_up_shared(b->cu, &g, &u, &sg, &su, X, b->q8, n, ids, K, xp,
                                             dp(pl->sh_gate_inp->data), lg, b->h_gate, h8, done,
                                             NULL, &b->err)
               : sil_cuda_moe_gate_up(b->cu, &g, &u, X, b->q8, n, ids, K, b->h_gate, h8, done, NULL,
                                      &b->err);
        if (!ok(b, rc) || (!hq && !ok(b, sil_cuda_quantize_q8(b->cu, b->h_gate, (int64_t)n * K1, F,
                                                              b->q8h, NULL, &b->err))))
            return sh;
        if (sh)
            ok(b, sil_cuda_moe_down_shared(b->cu, &d, &sd, X, b->q8h, n, ids, w, lg, K,
                                           dp(out.data) + (uint64_t)(r0 * E) * 4, NULL, &b->err));
        else
            ok(b, sil_cuda_moe_down(b->cu, &d, X, b->q8h, n, ids, w, K,
                                    b->routed + (uint64_t)(r0 * E) * 4, NULL, &b->err));
    }
    return sh;
}

/* Any type: per active expert, its rows gathered, matvecs, then the weighted sum per row. */
static void moe_generic(struct cuda_backend *b, struct sil_act x, const struct sil_moe_plan *pl)
{
    const int K = pl->n_used;
    const int64_t E = x.width, P = (int64_t)pl->n_rows * K;
    const int64_t F = pl->gate[0].rows;
    for (int64_t q = 0; q < P; q++)
        b->tmp[q] = pl->pair_row[q];
    if (!ok(b, sil_cuda_upload(b->cu, b->pair_row, b->tmp, sizeof(int32_t) * (size_t)P, NULL,
                               &b->err)) ||
        !ok(b, sil_cuda_upload(b->cu, b->pair_of, pl->pair_of, sizeof(int32_t) * (size_t)P, NULL,
                               &b->err)))
        return;
    const sil_cuda_ptr xp = dp(x.data);
    for (int a = 0; a < pl->n_active && b->rc == 0; a++) {
        for (int32_t j0 = pl->pair_start[a]; j0 < pl->pair_start[a + 1] && b->rc == 0; j0 += MB) {
            const int32_t cnt = pl->pair_start[a + 1] - j0 < MB ? pl->pair_start[a + 1] - j0 : MB;
            if (!ok(b, sil_cuda_fwd_gather_rows(b->cu, b->fwd, b->x_g, E, xp, E,
                                                b->pair_row + (uint64_t)j0 * 4, E, cnt, NULL,
                                                &b->err)))
                return;
            const struct sil_mm_out gu[] = {
                {&pl->gate[a],
                 {(void *)(uintptr_t)(b->h_gate + (uint64_t)(j0 * F) * 4), cnt, F, F}},
                {&pl->up[a], {(void *)(uintptr_t)(b->h_up + (uint64_t)(j0 * F) * 4), cnt, F, F}},
            };
            mm_chunks(b, (struct sil_act){(void *)(uintptr_t)b->x_g, cnt, E, E}, gu, 2);
        }
    }
    if (b->rc ||
        !ok(b, sil_cuda_swiglu(b->cu, b->h_gate, b->h_gate, b->h_up, P * F, NULL, &b->err)))
        return;
    for (int a = 0; a < pl->n_active && b->rc == 0; a++) {
        const int32_t j0 = pl->pair_start[a], cnt = pl->pair_start[a + 1] - j0;
        const struct sil_mm_out d = {
            &pl->down[a], {(void *)(uintptr_t)(b->d_pair + (uint64_t)(j0 * E) * 4), cnt, E, E}};
        mm_chunks(
            b, (struct sil_act){(void *)(uintptr_t)(b->h_gate + (uint64_t)(j0 * F) * 4), cnt, F, F},
            &d, 1);
    }
    if (b->rc) return;
    ok(b, sil_cuda_fwd_moe_combine(b->cu, b->fwd, b->routed, E, b->d_pair, b->pair_of, b->wts, K,
                                   E, pl->n_rows, NULL, &b->err));
}

/* Prefill (more rows than a decode batch), quantized experts: each active expert's matrices
 * read once for all its rows, on tensor cores. Rows are gathered in pair order (grouped by
 * expert), quantized once, multiplied by their expert's gate and up, silu-gated, quantized, by
 * down, then summed per row with the router's weights. slots: the plan's experts are in slots
 * (their handles name them) and the pools stand for the stacks. */
static void moe_grouped(struct cuda_backend *b, struct sil_act x, const struct sil_moe_plan *pl,
                        bool slots)
{
    const int K = pl->n_used, A = pl->n_active, X = (int)b->c.n_expert; /* grp's layout */
    const int64_t E = x.width, P = (int64_t)pl->n_rows * K, F = pl->gate_exps->rows;
    int32_t max_rows = 0;
    for (int a = 0; a < A; a++) {
        const int32_t c = pl->pair_start[a + 1] - pl->pair_start[a];
        if (c > max_rows) max_rows = c;
    }
    for (int64_t q = 0; q < P; q++)
        b->tmp[q] = pl->pair_row[q];
    /* slot experts: each active expert's matrices are its slot in the pools */
    for (int a = 0; slots && a < A; a++)
        b->tmp[P + a] = (int32_t)(uintptr_t)pl->gate[a].data;
    if (!ok(b, sil_cuda_upload(b->cu, b->pair_row, b->tmp, sizeof(int32_t) * (size_t)P, NULL,
                               &b->err)) ||
        !ok(b, sil_cuda_upload(b->cu, b->pair_of, pl->pair_of, sizeof(int32_t) * (size_t)P, NULL,
                               &b->err)) ||
        !ok(b, sil_cuda_upload(b->cu, b->grp, slots ? b->tmp + P : pl->expert,
                               sizeof(int32_t) * (size_t)A, NULL, &b->err)) ||
        !ok(b, sil_cuda_upload(b->cu, b->grp + (uint64_t)X * 4, pl->pair_start,
                               sizeof(int32_t) * (size_t)(A + 1), NULL, &b->err)))
        return;
    struct sil_cuda_weight g, u, d;
    size_t sg = pl->gate_exps->mat_bytes, su = pl->up_exps->mat_bytes,
           sd = pl->down_exps->mat_bytes;
    if (slots) {
        const int64_t R = pl->down_exps->rows;
        if (!ok(b, sil_cuda_weight_view(pl->gate_exps->type, F, E, b->pool_g, &g, &b->err)) ||
            !ok(b, sil_cuda_weight_view(pl->up_exps->type, F, E, b->pool_u, &u, &b->err)) ||
            !ok(b, sil_cuda_weight_view(pl->down_exps->type, R, pl->down_exps->cols, b->pool_d, &d,
                                        &b->err)))
            return;
        sg = b->slot_g;
        su = b->slot_u;
        sd = b->slot_d;
    } else if (!ok(b, view(pl->gate_exps, F, &g, &b->err)) ||
               !ok(b, view(pl->up_exps, F, &u, &b->err)) ||
               !ok(b, view(pl->down_exps, pl->down_exps->rows, &d, &b->err)))
        return;
    const sil_cuda_ptr xg = b->x_pair;
    const sil_cuda_ptr gm = b->grp, gs = b->grp + (uint64_t)X * 4;
    if (!ok(b, sil_cuda_fwd_gather_rows(b->cu, b->fwd, xg, E, dp(x.data), E, b->pair_row, E, P,
                                        NULL, &b->err)) ||
        !ok(b, sil_cuda_quantize_q8(b->cu, xg, P, E, b->q8p, NULL, &b->err)) ||
        !ok(b, sil_cuda_matmul_grouped(b->cu, &g, sg, b->q8p, (int)P, gm, gs, A, max_rows,
                                       b->h_gate, F, NULL, &b->err)) ||
        !ok(b, sil_cuda_matmul_grouped(b->cu, &u, su, b->q8p, (int)P, gm, gs, A, max_rows, b->h_up,
                                       F, NULL, &b->err)) ||
        !ok(b, sil_cuda_swiglu(b->cu, b->h_gate, b->h_gate, b->h_up, P * F, NULL, &b->err)) ||
        !ok(b, sil_cuda_quantize_q8(b->cu, b->h_gate, P, F, b->q8p, NULL, &b->err)) ||
        !ok(b, sil_cuda_matmul_grouped(b->cu, &d, sd, b->q8p, (int)P, gm, gs, A, max_rows,
                                       b->d_pair, E, NULL, &b->err)))
        return;
    ok(b, sil_cuda_fwd_moe_combine(b->cu, b->fwd, b->routed, E, b->d_pair, b->pair_of, b->wts, K,
                                   E, pl->n_rows, NULL, &b->err));
}

/* Slot experts (the plan's handles name slots): their slot numbers per (row, k) replace the
 * router's expert ids on the device, and the fused kernels run over the slot pools. */
static void moe_slots(struct cuda_backend *b, struct sil_act x, const struct sil_moe_plan *pl,
                      struct sil_act out)
{
    const int K = pl->n_used;
    const int64_t P = (int64_t)pl->n_rows * K;
    /* path (c): experts left in the mapping are the host's (tmp -1) in a decode step */
    const bool cpu =
        b->hx && pl->n_rows <= MB &&
        fused_types(pl->gate_exps, pl->up_exps, pl->down_exps, pl->n_used);
    /* per pair, tmp holds the slot (>= 0) or -1 (the host's) */
    int32_t any_slot = -1, n_host = 0;
    for (int a = 0; a < pl->n_active; a++) {
        const bool slot_e = pl->gate[a].loc == SIL_WEIGHT_SLOT &&
                            pl->up[a].loc == SIL_WEIGHT_SLOT && pl->down[a].loc == SIL_WEIGHT_SLOT;
        const bool host_e =
            cpu && on_host(&pl->gate[a]) && on_host(&pl->up[a]) && on_host(&pl->down[a]);
        if (!slot_e && !host_e) {
            fail(b, -ENOSPC,
                 b->hx && pl->n_rows <= MB
                     ? "misses on the CPU need quantized experts whose gate and up share a type"
                     : "a layer needs more experts at once than the expert slots hold "
                       "(raise --vram-budget or evaluate fewer rows at a time)");
            return;
        }
        const int32_t slot = slot_e ? (int32_t)(uintptr_t)pl->gate[a].data : -1;
        if (slot_e) any_slot = slot;
        n_host += !slot_e;
        for (int32_t j = pl->pair_start[a]; j < pl->pair_start[a + 1]; j++)
            b->tmp[j] = slot;
    }
    if (!fused_types(pl->gate_exps, pl->up_exps, pl->down_exps, pl->n_used)) {
        /* no fused kernel for these experts (float, or more a token than down's slots): the
         * per-expert path on views of their slots
         * (it uploads its pairs from the host: never part of a graph) */
        if (b->mode != PASS_EAGER) {
            fail(b, -EINVAL, "unfused experts in slots inside a graph");
            return;
        }
        not_capturable(b);
        b->segmented = false;
        b->seg_gap = false;
        for (int a = 0; a < pl->n_active; a++) {
            const uint64_t slot = (uint64_t)(uintptr_t)pl->gate[a].data;
            pl->gate[a].loc = pl->up[a].loc = pl->down[a].loc = SIL_WEIGHT_DEVICE;
            pl->gate[a].data = (const void *)(uintptr_t)(b->pool_g + slot * b->slot_g);
            pl->up[a].data = (const void *)(uintptr_t)(b->pool_u + slot * b->slot_u);
            pl->down[a].data = (const void *)(uintptr_t)(b->pool_d + slot * b->slot_d);
        }
        moe_generic(b, x, pl);
        if (b->rc == 0) shared_and_sum(b, x, pl, out);
        return;
    }
    /* prefill (unless SIL_CUDA_GROUPED=0): grouped products over the slot pools, each expert
     * read once, as everything resident does (the same kernels on the same bytes) */
    if (!cpu && !b->no_grouped && pl->n_rows > MB && n_host == 0) {
        if (b->rc == 0) moe_grouped(b, x, pl, true);
        if (b->rc == 0) shared_and_sum(b, x, pl, out);
        return;
    }
    /* the host's pairs keep a valid slot (the pools start zeroed) with weight 0 on the device */
    int n_jobs = 0;
    for (int64_t q = 0; q < P; q++) {
        const int32_t pair = pl->pair_of[q], slot = b->tmp[pair];
        b->slot_ids[q] = slot >= 0 ? slot : any_slot >= 0 ? any_slot : 0;
        if (!n_host) continue;
        b->h_wts[q] = slot >= 0 ? pl->sel_weight[q] : 0.0f;
        if (slot >= 0) continue;
        int a = 0;
        while (a + 1 < pl->n_active && pl->pair_start[a + 1] <= pair)
            a++;
        b->jobs[n_jobs++] = (struct sil_host_expert_job){(int32_t)(q / K), pl->sel_weight[q],
                                                         &pl->gate[a], &pl->up[a], &pl->down[a]};
    }
    if (!ok(b, sil_cuda_upload(b->cu, b->ids, b->slot_ids, sizeof(int32_t) * (size_t)P, NULL,
                               &b->err)))
        return;
    if (n_host &&
        !ok(b, sil_cuda_upload(b->cu, b->wts, b->h_wts, sizeof(float) * (size_t)P, NULL, &b->err)))
        return;
    seg_begin(b);
    if (b->mode != PASS_REPLAY) {
        if (b->rc) return;
        if (!moe_fused(b, x, pl, b->n_slots, out) && b->rc == 0) shared_and_sum(b, x, pl, out);
    }
    if (!cpu || b->rc) return;
    /* path (c): the device part runs (the segment is cut here in every decode pass, so the
     * segments stay the same whatever the host gets) while the host computes its experts */
    seg_end(b);
    if (n_jobs > 0) {
        const int64_t E = out.width;
        struct sil_error e = {0};
        if (sil_host_experts_run(b->hx, b->h_x, pl->n_rows, b->jobs, n_jobs, b->h_y, &e) < 0) {
            b->rc = e.code ? e.code : -EIO;
            b->err = e;
            return;
        }
        atomic_fetch_add_explicit(&b->host_experts, (uint64_t)n_host, memory_order_relaxed);
        if (out.ld != E) {
            fail(b, -EINVAL, "moe rows are not contiguous");
            return;
        }
        ok(b, sil_cuda_upload(b->cu, b->cpu_y, b->h_y, sizeof(float) * (size_t)(pl->n_rows * E),
                              NULL, &b->err));
        if (b->rc == 0)
            ok(b, sil_cuda_add(b->cu, dp(out.data), b->cpu_y, pl->n_rows * E, NULL, &b->err));
        b->q8_src = 0;
    }
    seg_begin(b);
}

static void cuda_moe(struct sil_backend *be, struct sil_act x, const struct sil_moe_plan *pl,
                     struct sil_act out)
{
    struct cuda_backend *b = cb(be);
    if (b->seg_gap) {
        /* a segmented pass: slot ids up, then the next segment starts with these experts */
        if (b->rc == 0 && x.rows > 0 && pl->n_active > 0 && b->n_slots > 0)
            moe_slots(b, x, pl, out);
        else
            seg_begin(b);
        return;
    }
    if (b->mode == PASS_REPLAY) return;
    if (b->rc || x.rows == 0 || (pl->n_active == 0 && !pl->device_routed)) return;
    if (x.ld != x.width || out.ld != out.width) {
        fail(b, -EINVAL, "moe rows are not contiguous");
        return;
    }
    if (pl->n_active > 0 && b->n_slots > 0) {
        moe_slots(b, x, pl, out);
        return;
    }
    const int X = (int)b->c.n_expert;
    const bool stacked = pl->gate_exps && pl->gate_exps->loc == SIL_WEIGHT_DEVICE &&
                         pl->up_exps->loc == SIL_WEIGHT_DEVICE &&
                         pl->down_exps->loc == SIL_WEIGHT_DEVICE;
    const bool fused =
        stacked && fused_types(pl->gate_exps, pl->up_exps, pl->down_exps, pl->n_used);
    if (fused && !pl->device_routed && x.rows > MB && pl->gate_exps->n_mat == X && !b->no_grouped)
        moe_grouped(b, x, pl, false);
    else if (pl->device_routed || fused) {
        if (moe_fused(b, x, pl, X, out)) return; /* the shared expert is in */
    } else
        moe_generic(b, x, pl);
    if (b->rc == 0) shared_and_sum(b, x, pl, out);
}

/* ---- output head ------------------------------------------------------------------------ */

/* The per-kernel table of the profiled pass: name, launches, microseconds, weight bytes read,
 * GB/s; the last line sums them. */
static void write_profile(struct cuda_backend *b)
{
    const struct sil_cuda_prof *t = NULL;
    const int n = sil_cuda_profile_get(b->cu, &t);
    FILE *fp = fopen(b->prof_path, "w");
    double ms = 0, bytes = 0;
    uint64_t calls = 0;
    for (int i = 0; fp && i < n; i++) {
        fprintf(fp, "%s\t%llu\t%.2f\t%llu\t%.1f\n", t[i].name, (unsigned long long)t[i].calls,
                t[i].ms * 1e3, (unsigned long long)t[i].bytes,
                t[i].ms > 0 ? (double)t[i].bytes / (t[i].ms * 1e6) : 0.0);
        ms += t[i].ms;
        bytes += (double)t[i].bytes;
        calls += t[i].calls;
    }
    if (fp) {
        fprintf(fp, "total\t%llu\t%.2f\t%.0f\t%.1f\n", (unsigned long long)calls, ms * 1e3, bytes,
                ms > 0 ? bytes / (ms * 1e6) : 0.0);
        fclose(fp);
    }
    struct sil_error e = {0};
    sil_cuda_profile(b->cu, false, &e);
    b->profiling = false;
}

/* Ends this pass's capture and replays it; false (and the error kept) when that fails. */
static bool finish_graph(struct cuda_backend *b)
{
    if (b->segmented) {
        seg_end(b); /* the last segment, up to the logits */
        b->seg_gap = false;
        if (b->mode == PASS_CAPTURE)
            b->n_captures++;
        else
            b->n_replays++;
        b->mode = PASS_EAGER;
        return b->rc == 0;
    }
    const bool replay = b->mode == PASS_REPLAY;
    if (b->mode == PASS_CAPTURE) {
        struct sil_cuda_graph *g = NULL;
        b->mode = PASS_EAGER;
        if (!ok(b, sil_cuda_capture_end(b->cu, NULL, &g, &b->err))) {
            b->cur->capturable = false;
            return false;
        }
        b->cur->g = g;
        b->n_captures++;
    } else {
        b->n_replays++;
    }
    const bool timed = b->gev[0] && replay;
    b->timed_pass = timed;
    if (timed) ok(b, sil_cuda_event_record(b->cu, b->gev[0], NULL, &b->err));
    ok(b, sil_cuda_graph_launch(b->cu, b->cur->g, NULL, &b->err));
    if (timed) ok(b, sil_cuda_event_record(b->cu, b->gev[1], NULL, &b->err));
    return b->rc == 0;
}

static void cuda_head(struct sil_backend *be, struct sil_act x, const struct sil_weight *w,
                      const int32_t *out_rows, float *logits, int32_t *argmax)
{
    struct cuda_backend *b = cb(be);
    const int64_t V = w->rows;
    const bool graph = b->mode != PASS_EAGER;
    const uint8_t hm = (uint8_t)((logits ? SIL_HEAD_LOGITS : 0) | (argmax ? SIL_HEAD_ARGMAX : 0));
    if (b->rc == 0 && (hm == 0 || (graph && b->cur && b->cur->head_out != hm)))
        fail(b, -EINVAL, hm ? "the head is asked for other outputs than the ubatch said"
                            : "the head has neither logits nor argmax to give back");
    if (b->rc) {
        abort_capture(b);
        return;
    }
    for (int64_t r0 = 0; r0 < x.rows && b->rc == 0; r0 += MB) {
        const int64_t n = x.rows - r0 < MB ? x.rows - r0 : MB;
        if (b->mode != PASS_REPLAY) {
            const struct sil_mm_out lo = {w, {(void *)(uintptr_t)b->logits, n, V, V}};
            mm_chunks(b, sil_act_rows(x, r0, n), &lo, 1);
            /* argmax on the device: only the ids come down */
            if (argmax && b->rc == 0 &&
                ok(b, sil_cuda_argmax(b->cu, b->logits, (int)n, V, b->am, b->am_scratch, NULL,
                                   &b->err)))
                ok(b, sil_cuda_download(b->cu, b->h_am, b->am, sizeof(int32_t) * (size_t)n, NULL,
                                        &b->err));
            if (logits && b->rc == 0)
                ok(b, sil_cuda_download(b->cu, b->h_logits, b->logits,
                                        sizeof(float) * (size_t)(n * V), NULL, &b->err));
            /* path (b): every layer's choices, for the cache after the pass */
            if (b->rc == 0 && b->zc_pass && r0 == 0)
                ok(b, sil_cuda_download(b->cu, b->zc_hids, b->zc_ids,
                                        sizeof(int32_t) * (size_t)(b->c.n_layer * MB *
                                                                   b->c.n_expert_used),
                                        NULL, &b->err));
        }
        if (graph && (b->rc || !finish_graph(b))) {
            abort_capture(b);
            return;
        }
        if (b->rc == 0) ok(b, sil_cuda_sync(b->cu, NULL, &b->err));
        if (graph && b->timed_pass && b->rc == 0) {
            b->timed_pass = false;
            float ms = 0.0f;
            struct timespec t1;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (sil_cuda_event_elapsed(b->cu, b->gev[0], b->gev[1], &ms, NULL) == 0) {
                b->graph_ms += ms;
                b->pass_ms += (double)(t1.tv_sec - b->t_begin.tv_sec) * 1e3 +
                              (double)(t1.tv_nsec - b->t_begin.tv_nsec) / 1e6;
                b->n_timed++;
            }
        }
        for (int64_t i = 0; i < n && b->rc == 0; i++) {
            if (logits)
                memcpy(logits + (int64_t)out_rows[r0 + i] * V, b->h_logits + i * V,
                       sizeof(float) * (size_t)V);
            if (argmax) argmax[out_rows[r0 + i]] = b->h_am[i];
        }
    }
    if (b->zc_pass && b->rc == 0) atomic_fetch_add_explicit(&b->zc_passes, 1, memory_order_relaxed);
    if (b->mode == PASS_EAGER && b->cur && b->rc == 0) b->cur->seen++;
    b->mode = PASS_EAGER;
    b->cur = NULL;
    b->segmented = false;
    if (b->profiling) write_profile(b);
}

/* ---- placement, status, lifetime ------------------------------------------------------------ */

/* Private read-only file mappings only: dropping their pages loses nothing (they are read
 * back from the file if touched again). The model is mapped that way (model.c). */
static void release_pages(const void *p, size_t bytes)
{
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)p + pg - 1) & ~(pg - 1), hi = ((uintptr_t)p + bytes) & ~(pg - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static int cuda_place(struct sil_backend *be, struct sil_weight *w, bool release_host,
                      struct sil_error *err)
{
    struct cuda_backend *b = cb(be);
    if (!w->data || w->loc == SIL_WEIGHT_DEVICE) return 0;
    /* with expert slots the routed stacks stay in the mmap, copied in per expert on a miss */
    if (b->n_slots > 0 && w->n_mat > 1 && w->n_mat == b->c.n_expert) {
        if (!quantized(w->type)) b->float_experts = true; /* no host path (c) for them */
        if (w->rows == b->c.n_ff_exp && w->cols == b->c.n_embd && b->n_probe_fe < 2)
            b->probe[b->n_probe_fe++] = *w;
        else if (w->rows == b->c.n_embd && w->cols == b->c.n_ff_exp && b->n_probe_ef < 1)
            b->probe[2 + b->n_probe_ef++] = *w;
        if (sil_vec_reserve(&b->rng, &b->cap_rng, (size_t)b->n_rng + 1, 64) < 0)
            return sil_errorf(err, -ENOMEM, "cuda backend: out of memory");
        const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), p = (uintptr_t)w->data;
        b->rng[b->n_rng++] = (struct host_range){
            p & ~(pg - 1), (p + w->mat_bytes * (size_t)w->n_mat + pg - 1) & ~(pg - 1)};
        return 0;
    }
    const size_t bytes = w->mat_bytes * (size_t)w->n_mat;
    if (w->rows > 1 && !sil_cuda_type_supported(w->type))
        return sil_errorf(err, -ENOTSUP, "cuda backend: weight type %s has no CUDA kernel",
                          sil_type_name(w->type));
    sil_cuda_ptr d = 0;
    int rc = dalloc(b, bytes, &d, err);
    if (rc == 0) rc = sil_cuda_upload(b->cu, d, w->data, bytes, NULL, err);
    if (rc == 0) rc = sil_cuda_sync(b->cu, NULL, err);
    if (rc < 0) return rc;
    if (release_host && w->loc == SIL_WEIGHT_MMAP) release_pages(w->data, bytes);
    b->weight_bytes += bytes;
    w->loc = SIL_WEIGHT_DEVICE;
    w->data = (const void *)(uintptr_t)d;
    return 0;
}

static int rng_cmp(const void *a, const void *b)
{
    const struct host_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Pins the routed stacks' pages (merged where they share or touch a page) so a miss is one DMA
 * from the mapping. Not an error when the system refuses (memory locked limits, a driver
 * without read-only registration): misses are then staged, with one line saying so. Then the
 * host-to-device bandwidth from that memory is measured once, into the first slots. */
/* Path (b) once the experts are pinned, when asked for (cuda_zero_copy) and possible:
 * the fused kernels must run every layer's experts, and the benchmark cap on copies cannot
 * govern reads the kernels make. */
static void zc_enable(struct cuda_backend *b)
{
    if (!b->c.opt.zero_copy || !b->zc_htab) return;
    /* with a host share (a count of CPU misses) it gave non-finite MoE outputs on the GPU
     * (cuda_fwd_parity check 15): refused until that is understood */
    const char *why = b->float_experts ? "float experts have no fused kernel"
                      : b->h2d_cap > 0  ? "SIL_BENCH_H2D_GBS caps copies, not reads in place"
                      : b->hx ? "not combined with a count of CPU misses (SIL_CUDA_CPU_MISSES)"
                              : NULL;
    b->rng_dev = why ? NULL : calloc((size_t)b->n_rng, sizeof(*b->rng_dev));
    if (!why && !b->rng_dev) why = "out of memory";
    for (int i = 0; !why && i < b->n_rng; i++) {
        struct sil_error e = {0};
        if (sil_cuda_host_device_ptr(b->cu, (void *)b->rng[i].lo, &b->rng_dev[i], &e) < 0)
            why = "the pinned mapping has no device address";
    }
    if (why) {
        free(b->rng_dev);
        b->rng_dev = NULL;
        fprintf(stderr, "siliceo: cuda backend: cuda_zero_copy ignored: %s\n", why);
        return;
    }
    b->zc = true;
    b->zc_dirty = true;
    fprintf(stderr, "siliceo: cuda backend: decode reads expert misses in place from host "
                    "memory (cuda_zero_copy)\n");
}

/* Path (c) by itself: the host computes its experts while the device copies the others in, so
 * a layer's misses split in proportion to the two speeds, host / (host + link), are done at
 * about the same time. The host's speed is measured on the n experts g[i], u[i], d[i] in host
 * memory where misses come from (the mapping, or the host tier's slots): one set of K warms the
 * threads, then each other set of K is run once, as a miss is read once (from memory, not from
 * the CPU's caches), and the median counts; the link's is the copy bandwidth measured at open
 * (or the benchmark cap). A share under 5% is not worth the segment cut: the host path is off
 * (cpu_misses 0) until measured again. n == 0: off. */
#define HOST_PROBE_SETS 5
static void choose_host_share(struct cuda_backend *b, const struct sil_weight *g,
                              const struct sil_weight *u, const struct sil_weight *d, int n,
                              const char *where)
{
    const int K = (int)b->c.n_expert_used;
    double host_gbs = 0.0;
    const int sets = K > 0 ? (n / K < HOST_PROBE_SETS ? n / K : HOST_PROBE_SETS) : 0;
    if (b->hx && !b->float_experts && sets >= 2 && b->h2d_gbs > 0 && fused_types(g, u, d, K)) {
        double dt[HOST_PROBE_SETS];
        int nt = 0;
        uint64_t bytes = 0;
        memset(b->h_x, 0, sizeof(float) * (size_t)b->c.n_embd);
        struct sil_error e = {0};
        for (int s = 0; s < sets; s++) {
            uint64_t sb = 0;
            for (int j = 0; j < K; j++) {
                const int x = s * K + j;
                sb += g[x].mat_bytes + u[x].mat_bytes + d[x].mat_bytes;
                b->jobs[j] = (struct sil_host_expert_job){0, 1.0f, &g[x], &u[x], &d[x]};
            }
            const double t0 = now_s();
            if (sil_host_experts_run(b->hx, b->h_x, 1, b->jobs, K, b->h_y, &e) < 0) {
                nt = 0;
                break;
            }
            const double t = now_s() - t0;
            if (s > 0 && t > 0) {
                dt[nt++] = t;
                bytes = sb; /* the sets are of one layer: the same bytes */
            }
        }
        if (nt > 0) {
            for (int a = 1; a < nt; a++) /* the median of a handful */
                for (int c = a; c > 0 && dt[c] < dt[c - 1]; c--) {
                    const double t = dt[c];
                    dt[c] = dt[c - 1];
                    dt[c - 1] = t;
                }
            host_gbs = (double)bytes / dt[nt / 2] / 1e9;
        }
    }
    b->host_gbs = host_gbs;
    const double link = b->h2d_cap > 0 && b->h2d_cap / 1e9 < b->h2d_gbs ? b->h2d_cap / 1e9
                                                                          : b->h2d_gbs;
    double share = host_gbs > 0 && link > 0 ? host_gbs / (host_gbs + link) : 0.0;
    /* cuda_cpu_share = F (0 < F <= 1) in place of the measured ratio */
    const double forced = b->c.opt.cpu_share;
    const bool force = forced > 0 && forced <= 1;
    if (force && n > 0) share = forced;
    if (share < 0.05) {
        b->host_share = 0.0;
        b->cpu_misses = 0;
        if (n > 0)
            fprintf(stderr,
                    "siliceo: cuda backend: decode misses all copied (host experts %.1f GB/s from "
                    "%s, link %.1f GB/s)\n",
                    host_gbs, where, link);
        else
            fprintf(stderr, "siliceo: cuda backend: decode misses all copied (%s)\n", where);
        return;
    }
    b->host_share = share;
    b->cpu_misses = b->cpu_misses_max;
    fprintf(stderr,
            "siliceo: cuda backend: host experts %.1f GB/s from %s, link %.1f GB/s: %.0f%% of each "
            "decode layer's misses computed on the CPU%s (cuda_cpu_share = off turns it off)\n",
            host_gbs, where, link, 100.0 * share, force ? ", set by cuda_cpu_share" : "");
}

/* The probe layer's first experts in the mapping, for choose_host_share. */
static void choose_host_share_mapped(struct cuda_backend *b)
{
    const int K = (int)b->c.n_expert_used, X = (int)b->c.n_expert;
    struct sil_weight m[3][HOST_PROBE_SETS * SIL_CUDA_MOE_SLOTS_MAX];
    int n = 0;
    if (b->n_probe_fe == 2 && b->n_probe_ef == 1 && K > 0) {
        n = HOST_PROBE_SETS * K < X ? HOST_PROBE_SETS * K : X / K * K;
        if (n > HOST_PROBE_SETS * SIL_CUDA_MOE_SLOTS_MAX) n = 0;
        for (int j = 0; j < n; j++)
            for (int i = 0; i < 3; i++)
                m[i][j] = sil_weight_mat(&b->probe[i], j);
    }
    choose_host_share(b, m[0], m[1], m[2], n, "the mapping");
}

/* Pinning the mapping's pages, a probe: the first PIN_PROBE_MIB of the experts pinned and
 * unpinned again; false when pinning all of them (total bytes) at that rate would
 * take over PIN_MAX_S. Some kernels pin pages of a file mapping at a crawl (measured: 18 GiB not
 * pinned in 120 s, all of it system time in minor faults, the file in the page cache), which
 * would hold the start up for minutes; elsewhere the same 18 GiB pinned in 10-17 s. */
#define PIN_PROBE_MIB 64
#define PIN_MAX_S 60.0
static bool pin_probe(struct cuda_backend *b, uint64_t total, double *projected)
{
    const uintptr_t lo = b->rng[0].lo;
    uint64_t bytes = b->rng[0].hi - lo;
    if (bytes > (uint64_t)PIN_PROBE_MIB << 20) bytes = (uint64_t)PIN_PROBE_MIB << 20;
    const double t0 = now_s();
    struct sil_error e = {0};
    *projected = 0;
    if (sil_cuda_host_register(b->cu, (void *)lo, bytes, &e) < 0) return true; /* said below */
    const double took = now_s() - t0;
    sil_cuda_host_unregister(b->cu, (void *)lo);
    *projected = bytes ? took * (double)total / (double)bytes : 0;
    return *projected <= PIN_MAX_S;
}

static int cuda_placed(struct sil_backend *be, struct sil_error *err)
{
    struct cuda_backend *b = cb(be);
    (void)err;
    if (b->n_slots <= 0 || b->n_rng == 0) return 0;
    qsort(b->rng, (size_t)b->n_rng, sizeof(*b->rng), rng_cmp);
    int n = 0;
    for (int i = 0; i < b->n_rng; i++) {
        if (n > 0 && b->rng[i].lo <= b->rng[n - 1].hi) {
            if (b->rng[i].hi > b->rng[n - 1].hi) b->rng[n - 1].hi = b->rng[i].hi;
        } else {
            b->rng[n++] = b->rng[i];
        }
    }
    b->n_rng = n;
    const enum sil_cuda_pin pin = b->c.opt.pin;
    uint64_t total = 0;
    for (int i = 0; i < n; i++)
        total += b->rng[i].hi - b->rng[i].lo;
    /* pinned pages cannot be reclaimed: never more than 3/4 of what the host has available;
     * with a host tier the engine reads misses into its own pinned slots, never the mapping */
    struct sil_host_spare spare; /* MemAvailable held to the cgroup's room */
    sil_host_spare(NULL, &spare);
    const uint64_t avail = spare.bytes == UINT64_MAX ? 0 : spare.bytes;
    const bool fits = !b->c.host_tier && (avail == 0 || total <= avail / 4 * 3);
    if (!fits && !b->c.host_tier && pin != SIL_CUDA_PIN_OFF)
        fprintf(stderr,
                "siliceo: cuda backend: the routed experts (%.2f GiB) are not pinned: the host "
                "has %.2f GiB available; misses are staged through a pinned buffer\n",
                (double)total / (double)(1u << 30), (double)avail / (double)(1u << 30));
    bool want_pin = fits && pin != SIL_CUDA_PIN_OFF;
    double projected = 0;
    /* cuda_pin = on: pinned however slowly (the probe not asked) */
    if (want_pin && pin == SIL_CUDA_PIN_AUTO && !pin_probe(b, total, &projected)) {
        want_pin = false;
        fprintf(stderr,
                "siliceo: cuda backend: the routed experts (%.2f GiB) are not pinned: at the rate "
                "their first %d MiB pinned, all of them would take %.0f s (this kernel pins pages "
                "of a file mapping slowly); misses are staged through a pinned buffer\n",
                (double)total / (double)(1u << 30), PIN_PROBE_MIB, projected);
    }
    if (want_pin) {
        const double t0 = now_s();
        struct sil_error e = {0};
        int i = 0;
        for (; i < n; i++)
            if (sil_cuda_host_register(b->cu, (void *)b->rng[i].lo, b->rng[i].hi - b->rng[i].lo,
                                       &e) < 0)
                break;
        if (i == n) {
            b->pinned = true;
            b->pinned_bytes = total;
            /* misses no longer go through the staging ring: its pinned memory back */
            sil_cuda_host_release(b->cu, b->stage);
            b->stage = NULL;
            b->stage_bytes = 0;
            fprintf(stderr, "siliceo: cuda backend: %.2f GiB of routed experts pinned in %.1f s\n",
                    (double)total / (double)(1u << 30), now_s() - t0);
            zc_enable(b);
        } else {
            while (i-- > 0)
                sil_cuda_host_unregister(b->cu, (void *)b->rng[i].lo);
            fprintf(stderr,
                    "siliceo: cuda backend: the routed experts could not be pinned (%s); "
                    "misses are staged through a pinned buffer\n",
                    e.msg);
        }
    }
    /* bandwidth: up to 256 MiB from the start of the experts' memory (pinned or staged) */
    struct sil_cuda_event *ev[2] = {NULL, NULL};
    uint64_t bytes = b->slot_g * (uint64_t)b->n_slots;
    if (bytes > (256u << 20)) bytes = 256u << 20;
    if (bytes > b->rng[0].hi - b->rng[0].lo) bytes = b->rng[0].hi - b->rng[0].lo;
    const void *src = b->pinned ? (const void *)b->rng[0].lo : (const void *)b->stage;
    if (!b->pinned && bytes > b->stage_bytes) bytes = b->stage_bytes;
    float ms = 0;
    if (sil_cuda_event_create(b->cu, &ev[0], NULL) == 0 &&
        sil_cuda_event_create(b->cu, &ev[1], NULL) == 0 &&
        sil_cuda_upload(b->cu, b->pool_g, src, (size_t)bytes, NULL, NULL) == 0 && /* warm */
        sil_cuda_event_record(b->cu, ev[0], NULL, NULL) == 0 &&
        sil_cuda_upload(b->cu, b->pool_g, src, (size_t)bytes, NULL, NULL) == 0 &&
        sil_cuda_event_record(b->cu, ev[1], NULL, NULL) == 0 &&
        sil_cuda_event_elapsed(b->cu, ev[0], ev[1], &ms, NULL) == 0 && ms > 0)
        b->h2d_gbs = (double)bytes / ((double)ms * 1e6);
    for (int i = 0; i < 2; i++)
        sil_cuda_event_destroy(b->cu, ev[i]);
    /* with a host tier the misses come from its slots: measured there once it is open
     * (cuda_measure_host); the mapping would be read from the disk */
    if (b->cpu_auto && b->hx) {
        if (b->c.host_tier)
            choose_host_share(b, NULL, NULL, NULL, 0, "not measured until the host tier opens");
        else
            choose_host_share_mapped(b);
    }
    return 0;
}

static int cuda_status(struct sil_backend *be, struct sil_error *err)
{
    struct cuda_backend *b = cb(be);
    abort_capture(b);
    if (b->rc == 0) ok(b, sil_cuda_sync(b->cu, NULL, &b->err));
    const int rc = b->rc;
    if (rc && err) *err = b->err;
    /* Reported once. A check of ours (-EINVAL, -ENOSPC) or an allocation that failed (-ENOMEM)
     * leaves the device usable: once the stream drains cleanly the next evaluation may run.
     * A device fault (-EIO) stays: the context is gone. */
    if (rc == -EINVAL || rc == -ENOSPC || rc == -ENOMEM) {
        b->rc = 0;
        if (sil_cuda_sync(b->cu, NULL, NULL) == 0)
            memset(&b->err, 0, sizeof b->err);
        else
            b->rc = rc;
    }
    return rc;
}

static int state_check(struct cuda_backend *b, int seq, int64_t n, struct sil_error *err)
{
    if (seq < 0 || seq >= b->c.n_seq_max || n != b->c.recr_floats)
        return sil_errorf(err, -EINVAL, "cuda backend: state of sequence %d, %lld floats", seq,
                          (long long)n);
    return cuda_status(&b->base, err);
}

static int cuda_state_read(struct sil_backend *be, int seq, float *dst, int64_t n,
                           struct sil_error *err)
{
    struct cuda_backend *b = cb(be);
    int rc = state_check(b, seq, n, err);
    if (rc < 0) return rc;
    const sil_cuda_ptr src = b->state + (uint64_t)(seq * b->c.recr_floats) * sizeof(float);
    rc = sil_cuda_download(b->cu, dst, src, (size_t)n * sizeof(float), NULL, err);
    return rc < 0 ? rc : sil_cuda_sync(b->cu, NULL, err);
}

static int cuda_state_write(struct sil_backend *be, int seq, const float *src, int64_t n,
                            struct sil_error *err)
{
    struct cuda_backend *b = cb(be);
    int rc = state_check(b, seq, n, err);
    if (rc < 0) return rc;
    const sil_cuda_ptr dst = b->state + (uint64_t)(seq * b->c.recr_floats) * sizeof(float);
    rc = sil_cuda_upload(b->cu, dst, src, (size_t)n * sizeof(float), NULL, err);
    return rc < 0 ? rc : sil_cuda_sync(b->cu, NULL, err);
}

static int cuda_kv_copy(struct sil_backend *be, int32_t dst, int32_t src, struct sil_error *err)
{
    struct cuda_backend *b = cb(be);
    int rc = cuda_status(&b->base, err);
    if (rc < 0) return rc;
    if (dst < 0 || src < 0 || dst >= b->kv_nb || src >= b->kv_nb || dst == src)
        return sil_errorf(err, -EINVAL, "cuda backend: KV block copy %d -> %d outside the pool",
                          (int)src, (int)dst);
    const uint64_t row = sil_kv_type_bytes(b->c.kv_type, b->c.kv_dim),
                   blk = (uint64_t)SIL_KV_BLOCK * row, layer = (uint64_t)b->kv_nb * blk;
    for (int64_t l = 0; l < b->c.n_layer_attn && rc == 0; l++) {
        const uint64_t o = (uint64_t)l * layer;
        rc = sil_cuda_copy_d2d(b->cu, b->kv_k + o + (uint64_t)dst * blk,
                               b->kv_k + o + (uint64_t)src * blk, (size_t)blk, NULL, err);
        if (rc == 0)
            rc = sil_cuda_copy_d2d(b->cu, b->kv_v + o + (uint64_t)dst * blk,
                                   b->kv_v + o + (uint64_t)src * blk, (size_t)blk, NULL, err);
    }
    return rc;
}

static void *cuda_alloc_act(struct sil_backend *be, size_t bytes)
{
    struct cuda_backend *b = cb(be);
    sil_cuda_ptr p = 0;
    struct sil_error e = {0};
    if (dalloc(b, bytes ? bytes : 4, &p, &e) < 0) {
        if (b->rc == 0) {
            b->rc = e.code;
            b->err = e;
        }
        return NULL;
    }
    return (void *)(uintptr_t)p;
}

static bool cuda_host_free(struct sil_backend *be, void *p);

static void cuda_free(struct sil_backend *be)
{
    struct cuda_backend *b = cb(be);
    if (!b) return;
    if (b->cu) {
        abort_capture(b);
        if (b->n_timed && b->prof_path) {
            FILE *fp = fopen(b->prof_path, "a");
            if (fp) {
                fprintf(fp, "graph replays\t%llu\tdevice ms each %.4f\thost ms a pass %.4f\n",
                        (unsigned long long)b->n_timed, b->graph_ms / (double)b->n_timed,
                        b->pass_ms / (double)b->n_timed);
                fclose(fp);
            }
        }
        for (int i = 0; i < 2; i++)
            sil_cuda_event_destroy(b->cu, b->gev[i]);
        sil_cuda_sync(b->cu, NULL, NULL);
        for (int i = 0; i < N_GRAPHS; i++) {
            sil_cuda_graph_destroy(b->cu, b->slots[i].g);
            drop_segs(b, &b->slots[i]);
            free(b->slots[i].seg);
        }
        sil_cuda_host_release(b->cu, b->h_ids);
        sil_cuda_host_release(b->cu, b->zc_hids);
        sil_cuda_host_release(b->cu, b->h_x);
        sil_cuda_host_release(b->cu, b->h_y);
        sil_cuda_host_release(b->cu, b->h_meta);
        sil_cuda_host_release(b->cu, b->h_logits);
        sil_cuda_host_release(b->cu, b->h_am);
        sil_cuda_host_release(b->cu, b->stage);
        for (int i = 0; b->pinned && i < b->n_rng; i++)
            sil_cuda_host_unregister(b->cu, (void *)b->rng[i].lo);
        while (b->n_hblk > 0) /* the engine frees its host tier first; this is a safety net */
            cuda_host_free(be, (void *)b->hblk[0].lo);
        free(b->hblk);
        for (int i = 0; i < b->n_allocs; i++)
            sil_cuda_release(b->cu, b->allocs[i]);
        sil_cuda_fwd_unload(b->cu, b->fwd);
        sil_cuda_free(b->cu);
    }
    free(b->allocs);
    free(b->tmp);
    free(b->slot_ids);
    free(b->rng);
    free(b->rng_dev);
    free(b->zc_htab);
    free(b->zc_rows);
    free(b->slot_key);
    sil_host_experts_free(b->hx);
    free(b->jobs);
    free(b->h_wts);
    free(b);
}

static int32_t cuda_cpu_misses(struct sil_backend *be)
{
    return cb(be)->hx && !cb(be)->float_experts ? cb(be)->cpu_misses : 0;
}

static void cuda_measure_host(struct sil_backend *be, const struct sil_weight *gate,
                              const struct sil_weight *up, const struct sil_weight *down, int n)
{
    struct cuda_backend *b = cb(be);
    if (!b->cpu_auto || !b->hx) return;
    choose_host_share(b, gate, up, down, n,
                      n > 0 ? "the host tier" : "the host tier given back: no host path");
}

static double cuda_host_share(struct sil_backend *be)
{
    return cb(be)->hx ? cb(be)->host_share : 0.0;
}

static void cuda_device(struct sil_backend *be, struct sil_engine_device *d)
{
    struct cuda_backend *b = cb(be);
    const struct sil_cuda_info *in = sil_cuda_get_info(b->cu);
    snprintf(d->name, sizeof d->name, "%s", in->name);
    d->driver_version = in->driver_version;
    d->cc_major = in->cc_major;
    d->cc_minor = in->cc_minor;
    d->weight_bytes = b->weight_bytes;
    d->kv_bytes = b->kv_bytes;
    d->scratch_bytes = b->used - b->weight_bytes - b->kv_bytes;
    d->budget_bytes = b->budget ? b->budget + b->ctx_bytes : 0;
    d->context_bytes = b->ctx_bytes;
    d->pinned_bytes = b->pinned_bytes;
    d->h2d_gbs = b->h2d_gbs;
    d->slot_bytes_in = atomic_load_explicit(&b->slot_bytes_in, memory_order_relaxed);
    d->slot_fills = atomic_load_explicit(&b->slot_fills, memory_order_relaxed);
    d->zero_copy = b->zc;
    d->zero_copy_passes = atomic_load_explicit(&b->zc_passes, memory_order_relaxed);
    d->cpu_misses = cuda_cpu_misses(be);
    d->cpu_share = cuda_host_share(be);
    d->host_gbs = b->host_gbs;
    d->cpu_experts = atomic_load_explicit(&b->host_experts, memory_order_relaxed);
    d->fused_conv = atomic_load_explicit(&b->fused[0], memory_order_relaxed);
    d->fused_attn_q8 = atomic_load_explicit(&b->fused[1], memory_order_relaxed);
    d->fused_norm_router = atomic_load_explicit(&b->fused[2], memory_order_relaxed);
}

static int32_t cuda_decode_rows_max(struct sil_backend *be)
{
    (void)be;
    return MB; /* the batch-8 decode kernels, graphs and device routing */
}

static int32_t cuda_expert_slots(struct sil_backend *be)
{
    return cb(be)->n_slots;
}

/* Whether the bytes of [p, p + n) lie in one block host_alloc handed out (pinned). */
static bool in_hblk(const struct cuda_backend *b, const void *p, size_t n)
{
    const uintptr_t lo = (uintptr_t)p;
    for (int i = 0; i < b->n_hblk; i++)
        if (lo >= b->hblk[i].lo && lo + n <= b->hblk[i].hi) return true;
    return false;
}

/* Pinned host memory for the engine's host tier; NULL when the driver refuses it (the tier
 * then uses ordinary memory, and its copies are staged). */
static void *cuda_host_alloc(struct sil_backend *be, size_t bytes)
{
    struct cuda_backend *b = cb(be);
    if (sil_vec_reserve(&b->hblk, &b->cap_hblk, (size_t)b->n_hblk + 1, 16) < 0) return NULL;
    void *p = NULL;
    if (sil_cuda_host_alloc(b->cu, bytes, &p, NULL) < 0) return NULL;
    b->hblk[b->n_hblk++] = (struct host_range){(uintptr_t)p, (uintptr_t)p + bytes};
    b->pinned_bytes += bytes;
    return p;
}

static bool cuda_host_free(struct sil_backend *be, void *p)
{
    struct cuda_backend *b = cb(be);
    for (int i = 0; p && i < b->n_hblk; i++) {
        if (b->hblk[i].lo != (uintptr_t)p) continue;
        b->pinned_bytes -= b->hblk[i].hi - b->hblk[i].lo;
        b->hblk[i] = b->hblk[--b->n_hblk];
        sil_cuda_host_release(b->cu, p);
        return true;
    }
    return false;
}

/* One matrix into its slot through the staging ring: the ring is reused from its start once
 * the copies queued from it are done (a sync when it is full). */
static void stage_copy(struct cuda_backend *b, sil_cuda_ptr dst, const struct sil_weight *w,
                       uint64_t cap)
{
    const size_t bytes = w->mat_bytes;
    const bool direct = w->loc == SIL_WEIGHT_HOST ? in_hblk(b, w->data, bytes) : b->pinned;
    if (bytes > cap || (!direct && bytes > b->stage_bytes)) {
        fail(b, -EINVAL, "an expert matrix is larger than its slot");
        return;
    }
    if (!direct && b->stage_used + bytes > b->stage_bytes) {
        if (!ok(b, sil_cuda_sync(b->cu, NULL, &b->err))) return;
        b->stage_used = 0;
    }
    if (b->h2d_cap > 0) {
        const double now = now_s();
        const double start = b->h2d_next > now ? b->h2d_next : now;
        if (start > now) {
            const double d = start - now;
            struct timespec w8 = {(time_t)d, (long)((d - (double)(time_t)d) * 1e9)};
            nanosleep(&w8, NULL);
        }
        b->h2d_next = start + (double)bytes / b->h2d_cap;
    }
    if (direct) {
        /* straight from pinned memory (the mapping, or a host-tier block): one DMA */
        ok(b, sil_cuda_upload(b->cu, dst, w->data, bytes, NULL, &b->err));
    } else {
        memcpy(b->stage + b->stage_used, w->data, bytes);
        ok(b, sil_cuda_upload(b->cu, dst, b->stage + b->stage_used, bytes, NULL, &b->err));
        b->stage_used += (bytes + 255) & ~(size_t)255;
    }
    atomic_fetch_add_explicit(&b->slot_bytes_in, bytes, memory_order_relaxed);
}

static void cuda_fill_slot(struct sil_backend *be, int32_t slot, const struct sil_weight *gate,
                           const struct sil_weight *up, const struct sil_weight *down,
                           int32_t layer, int32_t expert)
{
    struct cuda_backend *b = cb(be);
    /* between the segments of a segmented pass no graph is open: the copy runs in any mode */
    if (b->mode == PASS_REPLAY && !b->seg_gap) return;
    if (b->rc) return;
    if (b->mode != PASS_EAGER && !b->seg_gap) {
        fail(b, -EINVAL, "an expert copy inside a graph");
        return;
    }
    if (!b->segmented) not_capturable(b);
    if (slot < 0 || slot >= b->n_slots || !on_host(gate) || !on_host(up) || !on_host(down)) {
        fail(b, -EINVAL, "expert slot copy of a weight not in host memory, or slot out of range");
        return;
    }
    const uint64_t s = (uint64_t)slot;
    stage_copy(b, b->pool_g + s * b->slot_g, gate, b->slot_g);
    stage_copy(b, b->pool_u + s * b->slot_u, up, b->slot_u);
    stage_copy(b, b->pool_d + s * b->slot_d, down, b->slot_d);
    atomic_fetch_add_explicit(&b->slot_fills, 1, memory_order_relaxed);
    if (b->zc && b->rc == 0) {
        /* the table: what the slot held is read in place again, the new expert from the slot
         * (uploaded before the next pass of path (b), after this copy on the stream) */
        const int64_t X = b->c.n_expert;
        const int32_t old = b->slot_key[slot];
        if (old >= 0) b->zc_htab[old] = -1;
        b->slot_key[slot] = -1;
        if (layer >= 0 && layer < b->c.n_layer && expert >= 0 && expert < X) {
            const int32_t key = (int32_t)(layer * X + expert);
            if (b->zc_htab[key] >= 0) b->slot_key[b->zc_htab[key]] = -1;
            b->zc_htab[key] = slot;
            b->slot_key[slot] = key;
        }
        b->zc_dirty = true;
    }
}

static int32_t cuda_routes(struct sil_backend *be, int32_t layer, const int32_t **ids)
{
    struct cuda_backend *b = cb(be);
    *ids = NULL;
    if (!b->zc || b->rc || layer < 0 || layer >= b->c.n_layer || b->zc_rows[layer] <= 0) return 0;
    *ids = b->zc_hids + (int64_t)layer * MB * b->c.n_expert_used;
    return b->zc_rows[layer];
}

static const struct sil_backend_ops cuda_ops = {
    .name = "cuda",
    .free = cuda_free,
    .alloc_act = cuda_alloc_act,
    .begin = cuda_begin,
    .resume = cuda_resume,
    .get_rows = cuda_get_rows,
    .copy_rows = cuda_copy_rows,
    .matmul = cuda_matmul,
    .rmsnorm = cuda_rmsnorm,
    .add = cuda_add,
    .add_rmsnorm = cuda_add_rmsnorm,
    .swiglu = cuda_swiglu,
    .attention = cuda_attention,
    .conv1d = cuda_conv1d,
    .matmul_conv1d = cuda_matmul_conv1d,
    .delta_net = cuda_delta_net,
    .route = cuda_route,
    .add_rmsnorm_route = cuda_add_rmsnorm_route,
    .moe = cuda_moe,
    .head = cuda_head,
    .place = cuda_place,
    .placed = cuda_placed,
    .status = cuda_status,
    .state_read = cuda_state_read,
    .state_write = cuda_state_write,
    .kv_copy = cuda_kv_copy,
    .device = cuda_device,
    .decode_rows_max = cuda_decode_rows_max,
    .expert_slots = cuda_expert_slots,
    .cpu_misses = cuda_cpu_misses,
    .host_share = cuda_host_share,
    .measure_host = cuda_measure_host,
    .fill_slot = cuda_fill_slot,
    .routes = cuda_routes,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
};

static uint64_t max_u(uint64_t a, uint64_t b)
{
    return a > b ? a : b;
}

int sil_backend_cuda_create(struct sil_backend **out, const struct sil_cuda_config *c,
                            struct sil_error *err)
{
    *out = NULL;
    struct cuda_backend *b = calloc(1, sizeof(*b));
    if (!b) return sil_errorf(err, -ENOMEM, "cuda backend: out of memory");
    b->base.ops = &cuda_ops;
    b->c = *c;
    int rc = sil_cuda_init(&b->cu, c->ordinal, &c->opt, err);
    if (rc < 0) {
        free(b);
        return rc;
    }
    const int64_t U = c->ub_max, K = c->n_expert_used > 0 ? c->n_expert_used : 1;
    const int64_t X = c->n_expert, E = c->n_embd, S = c->n_ff_shexp, F = c->n_ff_exp;
    const uint64_t f4 = sizeof(float);
    const int64_t kv_nb = c->kv_blocks > 0
                              ? c->kv_blocks
                              : c->n_seq_max * ((c->n_ctx + SIL_KV_BLOCK - 1) / SIL_KV_BLOCK);
    const int64_t kv_pos = kv_nb * SIL_KV_BLOCK; /* the block pool's positions a layer */
    const uint64_t kv =
        2 * (uint64_t)(c->n_layer_attn * kv_pos) * sil_kv_type_bytes(c->kv_type, c->kv_dim);
    const uint64_t st = (uint64_t)(c->n_seq_max * c->recr_floats) * f4;
    const uint64_t q8 = max_u(sil_cuda_q8_bytes(U > MB ? U : MB, c->k_max),
                              X > 0 ? sil_cuda_q8_bytes(MB * K, F) : 0) +
                        256;
    const uint64_t moe = X > 0 ? (uint64_t)(U * X + 2 * U * K * F + U * K * E + MB * c->k_max +
                                            U * E + 2 * U * S + U) *
                                         f4 +
                                     4 * (uint64_t)(U * K) * 4
                               : 0;
    const uint64_t grouped = X > 0 ? (uint64_t)(U * K * E) * f4 +
                                         sil_cuda_q8_bytes(U * K, E > F ? E : F) + 256 +
                                         (uint64_t)(2 * X + 1) * 4
                                   : 0;
    /* decode attention splits the context in attn_split chunks a head (fixed, so a graph keeps
     * its grid): at least 64; about 64 positions a chunk up to 512 chunks (many blocks, so each
     * has few positions and the loads' latency is hidden across blocks); never more than 512
     * positions a chunk (the grouped kernel's scores in shared memory) nor more than 1024
     * chunks (COMBINE_MAX in fwd.cu) */
    int64_t split = c->n_ctx / 64 + 1;
    if (split > 512) split = 512;
    if (split < c->n_ctx / 512 + 1) split = c->n_ctx / 512 + 1;
    if (split < 64) split = 64;
    /* attn_split N (tests): N chunks, so short contexts put many positions in a block; never
     * fewer than the longest chunk allows */
    if (c->opt.attn_split > 0) {
        split = c->opt.attn_split;
        if (split < c->n_ctx / 512 + 1) split = c->n_ctx / 512 + 1;
    }
    if (split > 1024)
        return sil_errorf(err, -EINVAL,
                          "cuda backend: a context of %lld positions is more than decode "
                          "attention takes (524288)",
                          (long long)c->n_ctx);
    const int attn_split = (int)split;
    /* prefill attention's scores, one row of the context a (row, head): at most SCORES_MAX
     * bytes, the ubatch's rows in launches of as many rows as fit, at least one
     * (scores_rows N caps the rows a launch lower, for tests) */
    const uint64_t score_row = (uint64_t)(c->n_head * c->n_ctx) * f4;
    int64_t scores_rows = score_row > 0 ? (int64_t)(SCORES_MAX / score_row) : U;
    if (c->opt.scores_rows > 0 && c->opt.scores_rows < scores_rows)
        scores_rows = c->opt.scores_rows;
    if (scores_rows > U) scores_rows = U;
    if (scores_rows < 1) scores_rows = 1;
    b->scores_rows = (int32_t)scores_rows;
    const uint64_t part_bytes =
        c->n_layer_attn > 0 && c->head_dim > 0
            ? (uint64_t)(MB * c->n_head * attn_split) * (uint64_t)(c->head_dim + 2) * f4
            : 0;
    const uint64_t scratch =
        part_bytes + grouped + q8 +
        (X > 0 ? sil_cuda_q8_bytes(MB * (K + 1), F) + 256 + (uint64_t)(MB * (K + 1) * F) * f4 : 0) +
        (uint64_t)scores_rows * score_row + (uint64_t)(MB * c->n_vocab) * f4 +
        (uint64_t)(U * E) * f4 + 6 * (uint64_t)(U + 1) * 4 + (uint64_t)c->n_seq_max * 8 + moe;
    /* each allocation rounds up to 256 bytes: a few MiB of slack covers it */
    uint64_t need = c->weight_bytes + kv + st + scratch + c->act_bytes + (8u << 20);
    size_t free_b = 0, total_b = 0;
    /* the kernels first: their code and local memory count with the context below */
    rc = sil_cuda_fwd_load(b->cu, &b->fwd, err);
    if (rc == 0) rc = sil_cuda_mem_info(b->cu, &free_b, &total_b, err);
    const struct sil_cuda_info *in = sil_cuda_get_info(b->cu);
    /* The budget counts the device memory in use as the backend opens (the CUDA context and the
     * loaded kernels, up to 1 GiB), so that a budget of a card's size leaves what such a card
     * would have. */
    uint64_t ctx_bytes = rc == 0 && total_b > free_b ? (uint64_t)(total_b - free_b) : 0;
    if (ctx_bytes > (1u << 30)) ctx_bytes = 1u << 30;
    b->ctx_bytes = c->vram_budget ? ctx_bytes : 0;
    if (rc == 0 && c->vram_budget && c->vram_budget <= ctx_bytes + (256u << 20))
        rc = sil_errorf(err, -ENOMEM,
                        "cuda backend: --vram-budget of %llu MiB leaves nothing beside the "
                        "%llu MiB the device context takes",
                        (unsigned long long)(c->vram_budget >> 20),
                        (unsigned long long)(ctx_bytes >> 20));
    /* and what the driver takes later, as kernels first run (local memory) and graphs are made:
     * 177 MiB past the budget on an H200 before this was kept back, and with 192 MiB kept back
     * 17 MiB past after decode graphs of 1 to 16 rows (nvidia-smi) */
    const uint64_t drv_later = 256u << 20;
    if (c->vram_budget) b->ctx_bytes += drv_later; /* the budget exceeds both (checked above) */
    const uint64_t budget = rc == 0 && c->vram_budget && c->vram_budget > b->ctx_bytes
                                ? c->vram_budget - b->ctx_bytes
                                : 0;
    /* the routed experts do not all fit: the backbone resident, the rest of the budget slots */
    const uint64_t limit = budget ? budget : (uint64_t)free_b;
    /* each slot matrix rounded up to 256 bytes, as the pools lay them out */
    const uint64_t slot_bytes = ((c->slot_gate + 255) & ~(uint64_t)255) +
                                ((c->slot_up + 255) & ~(uint64_t)255) +
                                ((c->slot_down + 255) & ~(uint64_t)255);
    int64_t n_slots = 0;
    /* tests: slots N puts the routed experts in N slots even when they would fit */
    const int64_t forced = c->opt.slots;
    if (rc == 0 && forced > 0 && c->routed_bytes > 0 && slot_bytes > 0 && c->n_expert > 0) {
        n_slots = forced < c->n_expert ? c->n_expert : forced;
        need -= c->routed_bytes;
        need += (uint64_t)n_slots * slot_bytes;
    } else if (rc == 0 && need > limit && c->routed_bytes > 0 && slot_bytes > 0 &&
               c->n_expert > 0 && need - c->routed_bytes < limit) {
        const uint64_t rest = limit - (need - c->routed_bytes), reserve = 16u << 20;
        n_slots = rest > reserve ? (int64_t)((rest - reserve) / slot_bytes) : 0;
        if (n_slots < c->n_expert)
            rc = sil_errorf(
                err, -ENOMEM,
                "cuda backend: the model needs %llu MiB of device memory with its "
                "routed experts in slots (backbone, KV, scratch and one layer's "
                "experts): the limit is %llu MiB, give at least %llu MiB",
                (unsigned long long)((need - c->routed_bytes + (uint64_t)c->n_expert * slot_bytes +
                                      reserve) >>
                                     20),
                (unsigned long long)(limit >> 20),
                (unsigned long long)((need - c->routed_bytes + (uint64_t)c->n_expert * slot_bytes +
                                      reserve + b->ctx_bytes + (1u << 20) - 1) >>
                                     20));
        /* never more slots than experts */
        const int64_t all = c->n_layer_moe > 0 ? c->n_layer_moe * c->n_expert : n_slots;
        if (n_slots > all) n_slots = all;
        if (n_slots > INT32_MAX) n_slots = INT32_MAX;
        need -= c->routed_bytes;
        need += (uint64_t)n_slots * slot_bytes;
    }
    if (rc == 0 && budget && need > budget)
        rc = sil_errorf(err, -ENOMEM,
                        "cuda backend: the model needs %llu MiB of device memory (weights %llu, "
                        "KV %llu, state and scratch %llu MiB, the context %llu MiB): "
                        "--vram-budget is %llu MiB, give at least %llu MiB",
                        (unsigned long long)((need + ctx_bytes) >> 20),
                        (unsigned long long)(c->weight_bytes >> 20), (unsigned long long)(kv >> 20),
                        (unsigned long long)((st + scratch + c->act_bytes) >> 20),
                        (unsigned long long)(ctx_bytes >> 20),
                        (unsigned long long)(c->vram_budget >> 20),
                        (unsigned long long)((need + ctx_bytes + (1u << 20) - 1) >> 20));
    else if (rc == 0 && need > free_b)
        rc = sil_errorf(err, -ENOMEM,
                        "cuda backend: the model needs %llu MiB of device memory, %s has %llu MiB "
                        "free",
                        (unsigned long long)(need >> 20), in->name,
                        (unsigned long long)(free_b >> 20));
    b->budget = budget;
    /* the staged block: embedding rows, then 5 int32 arrays of U (+1) */
    const size_t ints_off = (size_t)(U * E) * sizeof(float);
    const int64_t bps = (c->n_ctx + SIL_KV_BLOCK - 1) / SIL_KV_BLOCK;
    const size_t meta_bytes =
        ints_off + (size_t)(5 * U + 1 + (c->n_layer_attn > 0 ? c->n_seq_max * bps : 0)) *
                       sizeof(int32_t);
    struct {
        sil_cuda_ptr *p;
        uint64_t bytes;
    } bufs[] = {
        {&b->kv_k, kv / 2},
        {&b->kv_v, kv / 2},
        {&b->state, st},
        {&b->state_tab, (uint64_t)c->n_seq_max * 8},
        {&b->q8, q8},
        {&b->q8h, X > 0 ? sil_cuda_q8_bytes(MB * (K + 1), F) + 256 : 0},
        {&b->scores, (uint64_t)scores_rows * score_row},
        {&b->attn_part, part_bytes},
        {&b->meta, meta_bytes},
        {&b->rows, (uint64_t)U * 4},
        {&b->logits, (uint64_t)(MB * c->n_vocab) * f4},
        {&b->am, (uint64_t)MB * 4},
        {&b->am_scratch, (uint64_t)SIL_CUDA_ARGMAX_SCRATCH(MB)},
        {&b->router, (uint64_t)(U * X) * f4},
        {&b->ids, (uint64_t)(U * K) * 4},
        {&b->wts, (uint64_t)(U * K) * 4},
        {&b->pair_of, (uint64_t)(U * K) * 4},
        {&b->pair_row, (uint64_t)(U * K) * 4},
        {&b->h_gate, (uint64_t)((U * K > MB * (K + 1) ? U * K : MB * (K + 1)) * F) * f4},
        {&b->h_up, (uint64_t)(U * K * F) * f4},
        {&b->d_pair, (uint64_t)(U * K * E) * f4},
        {&b->x_pair, X > 0 ? (uint64_t)(U * K * E) * f4 : 0},
        {&b->q8p, X > 0 ? sil_cuda_q8_bytes(U * K, E > F ? E : F) + 256 : 0},
        {&b->grp, (uint64_t)(2 * X + 1) * 4},
        {&b->x_g, (uint64_t)(MB * c->k_max) * f4},
        {&b->routed, (uint64_t)(U * E) * f4},
        {&b->sh_gate, (uint64_t)(U * S) * f4},
        {&b->sh_up, (uint64_t)(U * S) * f4},
        {&b->sh_logit, (uint64_t)U * f4},
        {&b->dn_done, c->recr_floats > 0 ? (uint64_t)(MB * DN_DONE_HEADS) * 4 : 0},
        {&b->router_done, X > 0 ? 4 : 0},
        {&b->moe_done, X > 0 ? (uint64_t)(MB * (K + 1)) * 4 : 0},
    };
    for (size_t i = 0; rc == 0 && i < sizeof(bufs) / sizeof(bufs[0]); i++)
        rc = dalloc(b, bufs[i].bytes, bufs[i].p, err);
    b->attn_split = attn_split;
    if (rc == 0 && n_slots > 0) {
        b->n_slots = (int32_t)n_slots;
        b->slot_g = (c->slot_gate + 255) & ~(uint64_t)255;
        b->slot_u = (c->slot_up + 255) & ~(uint64_t)255;
        b->slot_d = (c->slot_down + 255) & ~(uint64_t)255;
        rc = dalloc(b, (size_t)(b->slot_g * (uint64_t)n_slots), &b->pool_g, err);
        if (rc == 0) rc = dalloc(b, (size_t)(b->slot_u * (uint64_t)n_slots), &b->pool_u, err);
        if (rc == 0) rc = dalloc(b, (size_t)(b->slot_d * (uint64_t)n_slots), &b->pool_d, err);
        b->stage_bytes = 64u << 20;
        if (b->stage_bytes < 2 * slot_bytes) b->stage_bytes = 2 * slot_bytes;
        if (rc == 0) rc = sil_cuda_host_alloc(b->cu, b->stage_bytes, (void **)&b->stage, err);
        /* path (b)'s table (every expert in place until filled) and choices */
        const size_t nkeys = (size_t)(c->n_layer * X);
        b->zc_htab = malloc(sizeof(int32_t) * (nkeys ? nkeys : 1));
        b->zc_rows = calloc((size_t)c->n_layer + 1, sizeof(int32_t));
        b->slot_key = malloc(sizeof(int32_t) * (size_t)n_slots);
        if (rc == 0 && (!b->zc_htab || !b->zc_rows || !b->slot_key))
            rc = sil_errorf(err, -ENOMEM, "cuda backend: out of memory");
        for (size_t i = 0; rc == 0 && i < nkeys; i++)
            b->zc_htab[i] = -1;
        for (int64_t i = 0; rc == 0 && i < n_slots; i++)
            b->slot_key[i] = -1;
        if (rc == 0) rc = dalloc(b, sizeof(int32_t) * (nkeys ? nkeys : 1), &b->zc_tab, err);
        if (rc == 0)
            rc = dalloc(b, sizeof(int32_t) * (size_t)(c->n_layer * MB * K) + 4, &b->zc_ids, err);
        if (rc == 0)
            rc = sil_cuda_host_alloc(b->cu, sizeof(int32_t) * (size_t)(c->n_layer * MB * K) + 4,
                                     (void **)&b->zc_hids, err);
        /* zeroed, so a slot id given to a pair of weight 0 reads finite numbers */
        if (rc == 0)
            rc = sil_cuda_memset(b->cu, b->pool_g, 0, b->slot_g * (uint64_t)n_slots, NULL, err);
        if (rc == 0)
            rc = sil_cuda_memset(b->cu, b->pool_u, 0, b->slot_u * (uint64_t)n_slots, NULL, err);
        if (rc == 0)
            rc = sil_cuda_memset(b->cu, b->pool_d, 0, b->slot_d * (uint64_t)n_slots, NULL, err);
        /* path (c): cpu_misses N (tests, benchmarks) takes up to N misses of each decode layer
         * to the CPU; else the share is chosen at placed() from the host's and the link's
         * measured speeds (or given, cpu_share); cpu_off turns it off. Asking for reads in
         * place (path (b)) turns the automatic share off. */
        const struct sil_cuda_options *o = &c->opt;
        b->cpu_auto = o->cpu_misses <= 0 && !o->cpu_off && !o->zero_copy;
        const long ncm = b->cpu_auto ? (long)K : o->cpu_misses > 0 ? (long)o->cpu_misses : 0;
        if (rc == 0 && ncm > 0 && c->n_ff_exp > 0) {
            b->cpu_misses = b->cpu_misses_max = (int32_t)(ncm < K ? ncm : K);
            long nt = sysconf(_SC_NPROCESSORS_ONLN);
            rc = sil_host_experts_create(&b->hx, nt > 0 ? (int)(nt < 256 ? nt : 256) : 1, E,
                                         c->n_ff_exp, MB * (int)K, err);
            b->jobs = calloc((size_t)(MB * K), sizeof(*b->jobs));
            b->h_wts = calloc((size_t)(MB * K), sizeof(float));
            if (rc == 0 && (!b->jobs || !b->h_wts))
                rc = sil_errorf(err, -ENOMEM, "cuda backend: out of memory");
            if (rc == 0)
                rc = sil_cuda_host_alloc(b->cu, sizeof(float) * (size_t)(MB * E), (void **)&b->h_x,
                                         err);
            if (rc == 0)
                rc = sil_cuda_host_alloc(b->cu, sizeof(float) * (size_t)(MB * E), (void **)&b->h_y,
                                         err);
            if (rc == 0) rc = dalloc(b, sizeof(float) * (size_t)(MB * E), &b->cpu_y, err);
            if (rc == 0 && !b->cpu_auto)
                fprintf(stderr,
                        "siliceo: cuda backend: up to %d misses of each decode layer computed on "
                        "the CPU (SIL_CUDA_CPU_MISSES)\n",
                        (int)b->cpu_misses);
        }
    }
    b->kv_bytes = kv;
    if (rc == 0) rc = sil_cuda_host_alloc(b->cu, meta_bytes, &b->h_meta, err);
    if (rc == 0)
        rc = sil_cuda_host_alloc(b->cu, sizeof(int32_t) * 2 * (size_t)(U * K), (void **)&b->h_ids,
                                 err);
    if (rc == 0)
        rc = sil_cuda_host_alloc(b->cu, (size_t)(MB * c->n_vocab) * sizeof(float),
                                 (void **)&b->h_logits, err);
    if (rc == 0) rc = sil_cuda_host_alloc(b->cu, (size_t)MB * sizeof(int32_t), (void **)&b->h_am, err);
    if (rc == 0) {
        int32_t *hi = (int32_t *)((char *)b->h_meta + ints_off);
        b->emb = b->h_meta;
        b->h_pos = hi;
        b->h_seq = hi + U;
        b->h_run_start = hi + 2 * U;
        b->h_run_seq = hi + 3 * U + 1;
        b->h_keep = hi + 4 * U + 1;
        b->h_btab = hi + 5 * U + 1;
        b->kv_bps = c->n_layer_attn > 0 ? (int32_t)bps : 0;
        b->kv_nb = (int32_t)kv_nb;
        b->pos = b->meta + ints_off;
        b->seq = b->pos + (uint64_t)U * 4;
        b->run_start = b->pos + (uint64_t)(2 * U) * 4;
        b->run_seq = b->pos + (uint64_t)(3 * U + 1) * 4;
        b->keep = b->pos + (uint64_t)(4 * U + 1) * 4;
        b->btab = b->pos + (uint64_t)(5 * U + 1) * 4;
        b->meta_bytes = meta_bytes;
        b->ints_off = ints_off;
        const struct sil_cuda_options *o = &c->opt;
        b->graphs = !o->no_graphs;
        b->host_route = c->host_route || o->host_route;
        b->h2d_cap = o->h2d_cap_gbs > 0 ? o->h2d_cap_gbs * 1e9 : 0.0;
        if (b->h2d_cap > 0 && b->n_slots > 0)
            fprintf(stderr,
                    "siliceo: cuda backend: expert copies capped at %.2f GB/s "
                    "(SIL_BENCH_H2D_GBS, a benchmark setting)\n",
                    b->h2d_cap / 1e9);
        b->no_shared_fuse = o->no_shared_fuse;
        b->no_norm_router = o->no_norm_router;
        b->no_attn_q8 = o->no_attn_q8;
        b->no_conv_fuse = o->no_conv_fuse;
        b->no_mv_mix = o->no_mv_mix;
        b->no_gqa = o->no_gqa;
        b->split_from = o->prefill_split > 0 ? o->prefill_split : 0;
        b->no_dn_fuse = o->no_dn_fuse;
        b->no_router_fuse = o->no_router_fuse;
        b->no_h8_fuse = o->no_h8_fuse;
        b->no_grouped = o->no_grouped;
        b->prof_path = o->profile && *o->profile ? o->profile : NULL;
        b->prof_rows = o->profile_rows;
        for (int i = 0; b->prof_path && i < 2 && rc == 0; i++)
            rc = sil_cuda_event_create(b->cu, &b->gev[i], err);
        b->tmp = calloc((size_t)(U * K + (U > X ? U : X) + 1), sizeof(int32_t));
        b->slot_ids = calloc((size_t)(U * K), sizeof(int32_t));
        uint64_t *tab = calloc((size_t)c->n_seq_max + 1, sizeof(uint64_t));
        if (!b->tmp || !b->slot_ids || !tab)
            rc = sil_errorf(err, -ENOMEM, "cuda backend: out of memory");
        for (int64_t s = 0; tab && s < c->n_seq_max; s++)
            tab[s] = b->state + (uint64_t)(s * c->recr_floats) * f4;
        if (rc == 0 && c->n_seq_max > 0)
            rc = sil_cuda_upload(b->cu, b->state_tab, tab, (size_t)c->n_seq_max * 8, NULL, err);
        if (rc == 0) rc = sil_cuda_sync(b->cu, NULL, err);
        free(tab);
    }
    if (rc < 0) {
        cuda_free(&b->base);
        return rc;
    }
    *out = &b->base;
    return 0;
}

#endif
