/* The forward pass, one function per block (engine-internal), written once for every
 * architecture against the backend ops of backend.h. Its state (struct sil_fwd) is
 * backend-neutral: weight handles, activation views, the MoE expert plan; each backend keeps its
 * own context (thread pool, device buffers) behind struct sil_backend.
 * Every buffer is sized at sil_fwd_open for ub_max rows; nothing here allocates afterwards. */
#ifndef SIL_FORWARD_H
#define SIL_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/engine/backend.h"
#include "daemon/engine/delta_net.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/expert_cache.h"
#include "daemon/engine/expert_obs.h"
#include "daemon/engine/expert_store.h"
#include "daemon/engine/kv_cache.h"
#include "daemon/engine/model.h"

/* Handles of one block's weights, named as struct sil_layer names the tensors; zeroed (data
 * NULL) where the architecture or layer kind has none. */
struct sil_layer_weights {
    struct sil_weight attn_norm, ffn_norm;
    struct sil_weight wq, wk, wv, wo, q_norm, k_norm;
    struct sil_weight wqkv, wgate, ssm_conv1d, ssm_dt, ssm_a, ssm_beta, ssm_alpha, ssm_norm,
        ssm_out;
    struct sil_weight ffn_gate, ffn_up, ffn_down;
    struct sil_weight ffn_gate_inp, ffn_gate_exps, ffn_up_exps, ffn_down_exps;
    struct sil_weight ffn_gate_inp_shexp, ffn_gate_shexp, ffn_up_shexp, ffn_down_shexp;
};

/* Block-local activations are carved in order from one scratch area, fresh for every block:
 * a block names each one with its shape. With base NULL the arena only counts (sizing). */
struct sil_fwd_arena {
    char *base;
    size_t used, size;
};
struct sil_act sil_fwd_take(struct sil_fwd_arena *a, int64_t rows, int64_t width);

struct sil_fwd {
    const struct sil_model *model;
    struct sil_backend *be;
    int32_t ub_max, n_ctx;
    /* per-sequence state, owned by the engine */
    struct sil_kv_cache *kv;
    float **recr_state;              /* [seq] -> n_layer_recr * dn_state_floats floats */
    /* [seq] -> as recr_state, or NULL: the state at a token tree's branch point, kept while
     * its branches run (struct sil_tree_row.fork; the engine makes it before such a pass) */
    float **fork_state;
    int32_t *tree_runs; /* [ub_max + 1] the runs of a part of a ubatch (forward_delta.c) */
    struct sil_delta_net_params *dn; /* [n_layer_recr] */
    int64_t dn_state_floats;
    /* the engine's capture of the delta-net cores' inputs (engine.c: verification windows), or
     * NULL: called by sil_fwd_delta_net with each micro-batch's projections, before the core
     * runs; host memory backends only */
    void (*dn_capture)(void *user, const struct sil_ubatch *ub, int32_t recr_index,
                       struct sil_act qkv, struct sil_act alpha, struct sil_act beta);
    void *dn_capture_user;

    struct sil_weight tok_embd, output_norm, output;
    struct sil_layer_weights *lw; /* [n_layer] */

    /* activations, [ub_max][n_embd] */
    struct sil_act x;   /* residual stream */
    struct sil_act cur; /* normed input of a block */
    /* sil_forward_layers: the residual and normed rows of each of n_lm micro-batches, kept
     * between layers (n_lm 0: none; set before sil_fwd_open) */
    int32_t n_lm;
    struct sil_act *lm_x, *lm_cur;
    struct sil_act out; /* a block's output */
    void *scratch;      /* block-local activations (struct sil_fwd_arena) */
    size_t scratch_bytes;

    struct sil_moe_plan plan;            /* host arrays for ub_max rows */
    int32_t *expert_pairs, *expert_next; /* [n_expert] while building the plan */
    int32_t *keep_rows;                  /* [ub_max] rows kept for the last layer's FFN */
    int32_t *keep_out;                   /* [ub_max] their logits rows */
    /* work counters since open (benchmarks' byte bounds): ubatches, rows, and the routed-expert
     * weight bytes the MoE layers' plans named (each active expert's matrices once a layer) */
    uint64_t n_ubatch, n_rows, expert_bytes;
    uint64_t n_layered; /* micro-batches run by sil_forward_layers with others */
    /* host-routed MoE plans since open: how many (a layer of a pass each), their distinct
     * experts and their (row, slot) pairs, summed */
    uint64_t moe_plans, moe_experts, moe_pairs;
    struct sil_expert_obs *obs; /* NULL, or the heat map and simulated cache (expert_obs.h) */
    /* what every MoE plan is shown to (forward_ffn.c): obs's observer and the one registered
     * at open; chooser: the registered one when it chooses the routes (engine.h) */
    const struct sil_engine_observer *observer[2];
    int n_observer;
    const struct sil_engine_observer *chooser;
    /* NULL, or the slots of a backend whose experts do not all fit (expert_cache.h): each MoE
     * plan's experts get slots, misses copied in (fill_slot); [n_expert] scratch for a lookup */
    struct sil_ecache *ecache;
    int ecache_policy;  /* enum sil_ecache_policy of ecache */
    int32_t cpu_misses; /* misses of a decode plan the backend computes on the host */
    struct sil_ecache_entry *ecache_res;
    int32_t *ecache_uses;
    /* NULL, or the routed experts' host tier (expert_store.h): the experts a plan needs in
     * host memory (every one on the CPU, a device's misses) are made resident there and their
     * handles point there (SIL_WEIGHT_HOST), never into the mapping. [n_expert] scratch for an
     * acquire ([3 * n_expert] pointers); xs_err: the first acquire that failed (sticky, -EIO,
     * xs_msg says why) */
    struct sil_xstore *xstore;
    int32_t *xs_which, *xs_exp, *xs_uses;
    const void **xs_ptr;
    int xs_err;
    char xs_msg[200];
    /* The MTP layer (models with one): its stem and head weights (lw[n_layer] has its block),
     * its own KV cache (one layer; the engine makes it at first use) and the [ub_max, 2 n_embd]
     * input of eh_proj. hidden: NULL, or host rows [rows wanting logits][n_embd] that a pass
     * fills with the output norm's rows, what the MTP layer reads (host activations only). */
    struct sil_weight mtp_eh_proj, mtp_enorm, mtp_hnorm, mtp_head_norm, mtp_embd, mtp_head;
    struct sil_kv_cache *mtp_kv;
    struct sil_act mtp_cat;
    float *hidden;
};

/* A block's arena: all of the scratch area, nothing taken yet. */
static inline struct sil_fwd_arena sil_fwd_scratch(const struct sil_fwd *f)
{
    return (struct sil_fwd_arena){f->scratch, 0, f->scratch_bytes};
}

/* Calls op of the backend: SIL_OP(f, rmsnorm, y, x, w, eps). */
#define SIL_OP(f, op, ...) (f)->be->ops->op((f)->be, __VA_ARGS__)
/* One matmul of input x into any number of outputs: SIL_MATMUL(f, x, {&w->wq, q}, {&w->wk, k}). */
#define SIL_MATMUL(f, x, ...)                                                                      \
    (f)->be->ops->matmul(                                                                          \
        (f)->be, (x), (const struct sil_mm_out[]){__VA_ARGS__},                                    \
        (int)(sizeof((const struct sil_mm_out[]){__VA_ARGS__}) / sizeof(struct sil_mm_out)))

/* Binds the weight handles and allocates activations and the plan; model, be, ub_max, n_ctx
 * and dn must be set. 0 or -ENOMEM. sil_fwd_close frees what open allocated (not the backend). */
int sil_fwd_open(struct sil_fwd *f, struct sil_error *err);
void sil_fwd_close(struct sil_fwd *f);
/* Hands every weight to the backend's place op (where it has one): after this the handles
 * point where the backend keeps them. 0 or the backend's error. */
int sil_fwd_place_weights(struct sil_fwd *f, struct sil_error *err);

void sil_forward(struct sil_fwd *f, const struct sil_ubatch *ub, float *logits, int32_t *argmax);
/* The same for n_ub <= n_lm micro-batches of one evaluation, layer by layer: every micro-batch
 * goes through a layer before any goes on to the next, so a layer's experts are fetched once
 * for all of them (the host tier reads each from the file at most once a layer). Rows of one
 * sequence must be in position order across the micro-batches, as sil_forward takes them one
 * after another; the logits are the same, bit for bit. A backend with begin takes up each
 * micro-batch's inputs again at its resume op, and records no graph of a ubatch marked
 * layered (set it when n_ub > 1). */
void sil_forward_layers(struct sil_fwd *f, const struct sil_ubatch *ubs, int n_ub, float *logits,
                        int32_t *argmax);

/* The MTP layer over ub (forward_mtp.c; host activations, ub->kv the MTP cache): row i reads
 * the hidden row h_in[i] (a pass's output-norm row, or the MTP layer's own h_out) and its next
 * token ub->token[i]; writes its logits for the token after that to logits[i] (n_vocab floats,
 * when logits is not NULL), the greedy one to argmax[i] (when not NULL; one of the two at
 * least) and its own hidden row to h_out[i] ([n, n_embd], for the next draft). */
void sil_forward_mtp(struct sil_fwd *f, const struct sil_ubatch *ub, const float *h_in,
                     float *logits, int32_t *argmax, float *h_out);

/* x += d, then y = rmsnorm(x) * w: one op where the backend has add_rmsnorm. */
void sil_fwd_add_norm(struct sil_fwd *f, struct sil_act y, struct sil_act x, struct sil_act d,
                      const struct sil_weight *w, float eps);

/* The norm before a block, left to the block: x += d, then cur = rmsnorm(x) * w. */
struct sil_fwd_norm {
    struct sil_act x, d; /* [n, n_embd] the residual stream, what is added to it */
    const struct sil_weight *w;
    float eps;
};

/* Blocks: cur [n, n_embd] -> out [n, n_embd]. *_scratch: bytes of block-local activations for
 * ub_max rows. */
void sil_fwd_attention(struct sil_fwd *f, const struct sil_ubatch *ub, int il, struct sil_act cur,
                       struct sil_act out);
size_t sil_fwd_attention_scratch(const struct sil_fwd *f);
void sil_fwd_delta_net(struct sil_fwd *f, const struct sil_ubatch *ub, int il, struct sil_act cur,
                       struct sil_act out);
size_t sil_fwd_delta_net_scratch(const struct sil_fwd *f);
/* The FFN blocks take their norm (NULL: cur is normed already) and make cur first; the MoE
 * block's router may take it (add_rmsnorm_route). */
void sil_fwd_ffn(struct sil_fwd *f, const struct sil_ubatch *ub, int il,
                 const struct sil_fwd_norm *norm, struct sil_act cur, struct sil_act out);
size_t sil_fwd_ffn_scratch(const struct sil_fwd *f);
void sil_fwd_moe(struct sil_fwd *f, const struct sil_ubatch *ub, int il,
                 const struct sil_fwd_norm *norm, struct sil_act cur, struct sil_act out);
/* Layer il's FFN block (the MoE one or the dense one, taking norm as they do) on cur into out,
 * then x += out and cur = rmsnorm(x) * next: what the next block, or the head, reads. */
void sil_fwd_ffn_add_norm(struct sil_fwd *f, const struct sil_ubatch *ub, int il,
                          const struct sil_fwd_norm *norm, struct sil_act x, struct sil_act cur,
                          struct sil_act out, const struct sil_weight *next);
/* After a pass's head: the routing a device-routed pass over expert slots kept (backend op
 * routes) goes through the expert cache. */
void sil_fwd_moe_deferred(struct sil_fwd *f);

#endif
