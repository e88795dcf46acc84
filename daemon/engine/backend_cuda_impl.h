/* Private to the CUDA backend's files: its state (struct cuda_backend) and what the files share.
 * backend_cuda.c: create, free, status, state and KV copies, the op table;
 * backend_cuda_ops.c: matmul, norms, element-wise ops, attention, the delta net;
 * backend_cuda_moe.c: routing and the MoE paths (fused, grouped, per expert, from slots);
 * backend_cuda_graph.c: passes (their staged inputs), graph capture and replay, the head;
 * backend_cuda_slots.c: placement and the policy of expert slots (what is pinned, reads in
 * place, the host's share of misses) over their mechanism in kernels/cuda/cuda_slots.h.
 * backend.h is the contract; this header is included only where SIL_HAVE_CUDA is defined. */
#ifndef SIL_BACKEND_CUDA_IMPL_H
#define SIL_BACKEND_CUDA_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "daemon/engine/backend.h"
#include "daemon/engine/host_experts.h"
#include "daemon/engine/kv_cache.h"
#include "kernels/cpu/quants.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_fwd.h"
#include "kernels/cuda/cuda_slots.h"

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
/* Prefill attention is tiled on f16 tensor cores (sil_cuda_fwd_flash) where a row of the
 * micro-batch reaches this position: below it the per-row kernel in float costs little (its
 * K and V reads grow with the square of the context) and keeps short prompts' logits as the
 * CPU's; past it the f16 operands' rounding (about 1e-3 of an attention output) buys the
 * tensor cores' speed, as llama.cpp's flash attention does. */
#define FLASH_FROM_DEFAULT 1024
#define N_GRAPHS 16

/* One ubatch shape and its graph. */
struct graph_slot {
    int32_t n, n_runs, n_keep;
    uint8_t head_out; /* what its head gives back (sil_ubatch.head_out) */
    bool cap;         /* it captures rows of kept windows (keep_capture's launches) */
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

/* One recurrent layer as its delta_net op last ran it, for a kept window's replay: the conv's
 * weights and state offset, the delta rule's arguments (their rows and runs set at replay). */
struct keep_layer {
    bool set;
    sil_cuda_ptr conv_w;
    int K;
    struct sil_cuda_dn d;
};

struct cuda_backend {
    struct sil_backend base;
    struct sil_cuda_config c;
    struct sil_cuda *cu;
    struct sil_cuda_fwd *fwd; /* fwd.cu's kernels */
    int rc;
    struct sil_error err;
    uint64_t used, budget; /* device bytes taken, the cap (the budget less ctx_bytes) */
    uint64_t ctx_bytes;    /* device memory in use at open, counted in --vram-budget */
    uint64_t reserved;     /* other engines' share of --vram-budget (vram_reserved) */
    uint64_t weight_bytes, kv_bytes;
    /* device allocations, freed with the backend */
    sil_cuda_ptr *allocs;
    int n_allocs;
    size_t cap_allocs;
    /* device buffers */
    sil_cuda_ptr kv_k, kv_v; /* [layer][seq][n_ctx][kv_dim] */
    sil_cuda_ptr state;      /* [seq][recr_floats] */
    sil_cuda_ptr state_tab;  /* [seq] float * */
    sil_cuda_ptr state_keep; /* [keep slot][recr_floats]: verification windows' starts */
    int32_t *keep_owner;     /* [c.keep_states]: the sequence holding each keep slot, -1 none */
    /* A kept window's rows: the delta-net cores' inputs of its first MB rows captured by every
     * recurrent layer's delta_net op (keep_in: [recurrent layer][keep slot][MB][cd + 2 nv]:
     * qkv before the conv, alpha, beta; the rows' places come up with the ubatch, in cap), so
     * SIL_STATE_BACK runs the conv and the delta rule of the rows it keeps again (into
     * keep_scr) instead of the engine evaluating those rows again. keep_pos: the window's
     * start; keep_rows: its rows captured so far, in order (-1: not capturable, a tree) */
    sil_cuda_ptr keep_in, keep_scr, keep_runs; /* keep_runs: int32 {0, n, seq} */
    int32_t *keep_pos, *keep_rows;
    struct keep_layer *keep_l; /* [n_layer_recr]: each layer's weights, noted by delta_net */
    _Atomic uint64_t keep_replays;
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
    int32_t *h_cap; /* [ub_max]: each row's place in keep_in's rows of a layer, -1 none */
    int32_t n_cap;  /* rows of the staged ubatch with a place (0: no capture launches) */
    sil_cuda_ptr cap;
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
    bool no_flash;  /* SIL_CUDA_NO_FLASH=1: prefill attention one block a row and head */
    int32_t flash_from; /* prefill attention tiled where a row reaches this position */
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
    /* expert slots (the routed experts did not all fit; es.n 0 otherwise), their pools, the
     * routed stacks' ranges in the mmap (noted at place, pinned at placed() when they can be:
     * misses are then copied straight from the mapping, else staged through the ring), pinned
     * host blocks of the engine's host tier, and the slot table of path (b) (kernels/cuda) */
    struct sil_cuda_slots es;
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
     * graph. Expert e of layer l is slot es.tab[l][e] when resident, else its matrices are read
     * in place from the pinned mapping over the bus (es.rng_dev: each pinned range's device
     * address). Every layer's choices come down with the logits (zc_ids -> zc_hids), and the
     * engine's cache sees them after the pass (routes), filling what its admission lets in
     * before the next pass; the table (es.htab, es.tab) goes up at the next pass's begin when it
     * changed. */
    bool zc, zc_pass;
    _Atomic uint64_t zc_passes;
    /* launches issued with a fusion (graph replays not counted): [0] conv1d in the matvec set,
     * [1] attention's merge with o's q8, [2] the router with its norm */
    _Atomic uint64_t fused[3];
    _Atomic uint64_t host_experts; /* miss path (c): experts the host computed since open */
    sil_cuda_ptr zc_ids;
    int32_t *zc_hids; /* pinned [n_layer][MB * K] */
    int32_t *zc_rows; /* [n_layer] rows whose choices zc_hids holds, 0: none */
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


static inline struct cuda_backend *cb(struct sil_backend *be)
{
    return (struct cuda_backend *)be;
}

static inline sil_cuda_ptr dp(const void *p)
{
    return (sil_cuda_ptr)(uintptr_t)p;
}

/* Keeps the first error; true when ops should go on. */
static inline bool ok(struct cuda_backend *b, int rc)
{
    if (rc < 0 && b->rc == 0) {
        b->rc = rc;
        if (b->err.code == 0) sil_errorf(&b->err, rc, "cuda backend: error %d", rc);
    }
    return b->rc == 0;
}

static inline bool fail(struct cuda_backend *b, int code, const char *what)
{
    if (b->rc == 0) {
        b->rc = code;
        sil_errorf(&b->err, code, "cuda backend: %s", what);
    }
    return false;
}

/* A weight in host memory: the model's mapping or a block of the engine's host tier. */
static inline bool on_host(const struct sil_weight *w)
{
    return w->loc == SIL_WEIGHT_MMAP || w->loc == SIL_WEIGHT_HOST;
}

/* The delta rule with its state rows spread over blocks (sil_cuda_fwd_delta_rule) takes these
 * key heads; others go through sil_cuda_fwd_delta_net. */
static inline bool dn_rule_takes(int dk)
{
    return dk % 32 == 0 && dk <= 256;
}

static inline bool quantized(int type)
{
    return type != SIL_TYPE_F32 && type != SIL_TYPE_F16 && type != SIL_TYPE_BF16;
}

/* Entry of an op that may write activations: the quantized copy of any activation is stale
 * after it. False when the op is to do nothing (replay, error). */
static inline bool enter(struct cuda_backend *b)
{
    if (b->mode == PASS_REPLAY) return false;
    b->q8_src = 0;
    return b->rc == 0;
}

/* An op that needs the host in the middle of the pass: this shape cannot be a graph. */
static inline void not_capturable(struct cuda_backend *b)
{
    if (b->cur) b->cur->capturable = false;
}

/* backend_cuda.c */
int sil_cb_dalloc(struct cuda_backend *b, size_t bytes, sil_cuda_ptr *out, struct sil_error *err);

/* backend_cuda_ops.c */
int sil_cb_view(const struct sil_weight *w, int64_t rows, struct sil_cuda_weight *cw,
                struct sil_error *err);
bool sil_cb_have_q8(struct cuda_backend *b, sil_cuda_ptr xp, int64_t n, int64_t k);
void sil_cb_mm_chunks(struct cuda_backend *b, struct sil_act x, const struct sil_mm_out *out,
                      int n_out);
void sil_cb_matmul(struct sil_backend *be, struct sil_act x, const struct sil_mm_out *out, int n);
void sil_cb_get_rows(struct sil_backend *be, const struct sil_weight *w, const int32_t *ids,
                     struct sil_act y);
void sil_cb_copy_rows(struct sil_backend *be, struct sil_act y, struct sil_act x,
                      const int32_t *rows);
bool sil_cb_norm_fuses(const struct cuda_backend *b, struct sil_act y, struct sil_act x);
void sil_cb_rmsnorm(struct sil_backend *be, struct sil_act y, struct sil_act x,
                    const struct sil_weight *w, float eps);
void sil_cb_add(struct sil_backend *be, struct sil_act y, struct sil_act x);
void sil_cb_add_rmsnorm(struct sil_backend *be, struct sil_act y, struct sil_act x,
                        struct sil_act d, const struct sil_weight *w, float eps);
void sil_cb_swiglu(struct sil_backend *be, struct sil_act y, struct sil_act gate,
                   struct sil_act up);
void sil_cb_attention(struct sil_backend *be, const struct sil_ubatch *ub,
                      const struct sil_attn_args *a);
void sil_cb_conv1d(struct sil_backend *be, const struct sil_ubatch *ub,
                   const struct sil_delta_net_args *a);
void sil_cb_matmul_conv1d(struct sil_backend *be, const struct sil_ubatch *ub, struct sil_act x,
                          const struct sil_mm_out *out, int n, const struct sil_delta_net_args *a);
void sil_cb_delta_net(struct sil_backend *be, const struct sil_ubatch *ub,
                      const struct sil_delta_net_args *a);

/* backend_cuda_moe.c */
bool sil_cb_fused_types(const struct sil_weight *g, const struct sil_weight *u,
                        const struct sil_weight *d, int K);
void sil_cb_route(struct sil_backend *be, struct sil_act x, const struct sil_weight *w, int n_used,
                  struct sil_moe_plan *plan);
void sil_cb_add_rmsnorm_route(struct sil_backend *be, struct sil_act y, struct sil_act x,
                              struct sil_act d, const struct sil_weight *norm, float eps,
                              const struct sil_weight *w, int n_used, struct sil_moe_plan *plan);
void sil_cb_moe(struct sil_backend *be, struct sil_act x, const struct sil_moe_plan *pl,
                struct sil_act out);

/* backend_cuda_graph.c */
void sil_cb_stage(struct cuda_backend *b, const struct sil_ubatch *ub, int32_t *n_keep);
void sil_cb_drop_segs(struct cuda_backend *b, struct graph_slot *g);
void sil_cb_abort_capture(struct cuda_backend *b);
void sil_cb_seg_end(struct cuda_backend *b);
void sil_cb_seg_begin(struct cuda_backend *b);
void sil_cb_begin(struct sil_backend *be, const struct sil_ubatch *ub);
void sil_cb_resume(struct sil_backend *be, const struct sil_ubatch *ub);
void sil_cb_head(struct sil_backend *be, struct sil_act x, const struct sil_weight *w,
                 const int32_t *out_rows, float *logits, int32_t *argmax);

/* backend_cuda_slots.c */
int sil_cb_place(struct sil_backend *be, struct sil_weight *w, bool release_host,
                 struct sil_error *err);
int sil_cb_placed(struct sil_backend *be, struct sil_error *err);
int32_t sil_cb_cpu_misses(struct sil_backend *be);
void sil_cb_measure_host(struct sil_backend *be, const struct sil_weight *gate,
                         const struct sil_weight *up, const struct sil_weight *down, int n);
double sil_cb_host_share(struct sil_backend *be);
int32_t sil_cb_expert_slots(struct sil_backend *be);
void *sil_cb_host_alloc(struct sil_backend *be, size_t bytes);
bool sil_cb_host_free(struct sil_backend *be, void *p);
void sil_cb_fill_slot(struct sil_backend *be, int32_t slot, const struct sil_weight *gate,
                      const struct sil_weight *up, const struct sil_weight *down, int32_t layer,
                      int32_t expert);
int32_t sil_cb_routes(struct sil_backend *be, int32_t layer, const int32_t **ids);

#endif
