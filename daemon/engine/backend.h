/* The backend operations the forward pass (forward*.c) is written against. A backend is a
 * table of ops plus its own context (the CPU backend: thread pool, quantized-input buffers,
 * per-thread scratch; a device backend: its streams and device buffers); the forward pass keeps
 * only backend-neutral state: activation views, weight handles, the MoE expert plan.
 *
 * Activations (struct sil_act) are F32 row-major views into memory the backend allocated
 * (alloc_act): host memory on the CPU, device memory elsewhere. The forward pass computes views
 * (rows, widths, offsets) but never reads or writes their elements; only ops do.
 * Weights (struct sil_weight) are handles: type, shape and where the bytes live (the mmap,
 * host or device memory, an expert slot), so placement can change without touching the blocks.
 * Host arrays in op arguments (token ids, positions, sequences, output rows, the expert plan)
 * are the forward pass's and stay valid for the duration of the call.
 *
 * Ownership: a backend owns everything alloc_act returned until free; ops keep no pointer to
 * their arguments after they return. One thread at a time drives a backend.
 *
 * Fusion is named here: where a device backend runs two ops of the forward pass in one launch,
 * the pair is an optional op of its own (add_rmsnorm, matmul_conv1d, add_rmsnorm_route) whose
 * contract is the two ops one after the other, bit for bit; the forward pass calls it where the
 * model has that shape and the two ops where a backend leaves it NULL. A backend runs the parts
 * itself where its fused launch does not take the shape (or is switched off). Every op finishes
 * its work in the call: nothing is left pending for the next op to launch. (Chosen over
 * recording a micro-batch as an op list that the backend compiles per shape: the three fusions
 * are pairs the forward pass already knows it makes, the CPU backend runs ops as they come,
 * and CUDA graphs already record a pass per shape below the ops.) */
#ifndef SIL_BACKEND_H
#define SIL_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/delta_net.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/kv_cache.h"
#include "kernels/error.h"

enum sil_weight_loc {
    SIL_WEIGHT_MMAP,   /* in place in the model file's mapping */
    SIL_WEIGHT_HOST,   /* host memory the backend owns */
    SIL_WEIGHT_DEVICE, /* resident in device memory */
    SIL_WEIGHT_SLOT,   /* a slot of the expert cache */
};

/* One weight matrix (or a stack of n_mat equal ones: routed experts), or a vector (rows 1). */
struct sil_weight {
    int type;           /* enum sil_type */
    int64_t rows, cols; /* of one matrix: output x input elements (GGUF ne[1] x ne[0]) */
    int64_t n_mat;      /* stacked matrices (experts, GGUF ne[2]); 1 otherwise */
    size_t mat_bytes;   /* bytes of one matrix */
    enum sil_weight_loc loc;
    const void *data; /* address of matrix 0 in the memory loc names */
};

/* Handle of matrix i of a stack (one routed expert), in the same memory. */
static inline struct sil_weight sil_weight_mat(const struct sil_weight *w, int64_t i)
{
    struct sil_weight m = *w;
    m.n_mat = 1;
    m.data = (const char *)w->data + (size_t)i * w->mat_bytes;
    return m;
}

/* rows x width F32 values, row r at data + r * ld floats, in backend memory. */
struct sil_act {
    void *data;
    int64_t rows, width, ld;
};

/* Rows [r0, r0 + n) of a. */
static inline struct sil_act sil_act_rows(struct sil_act a, int64_t r0, int64_t n)
{
    a.data = (char *)a.data + (size_t)(r0 * a.ld) * sizeof(float);
    a.rows = n;
    return a;
}

/* One output of a matmul: y = x W^T, y [x.rows, w->rows]. */
struct sil_mm_out {
    const struct sil_weight *w;
    struct sil_act y;
};

/* A token tree's row (sil_batch.parent): rope at rope_pos (its depth below the sequence), and
 * it sees the KV positions below lo and those of [lo, lo + 64) whose bit is set in mask (its
 * ancestors and itself). A row outside any tree in a ubatch with some: rope_pos = its position,
 * lo = position + 1, mask 0. On models with recurrent layers, fork (enum sil_tree_fork) marks
 * the one row of a sequence where its tree branches and the rows that start its branches. */
enum sil_tree_fork {
    SIL_TREE_SAVE = 1,    /* the recurrent state after this row is where the branches start */
    SIL_TREE_RESTORE = 2, /* a branch starts here: the recurrent state before it is that one */
};
struct sil_tree_row {
    int32_t rope_pos, lo;
    uint64_t mask;
    uint8_t fork;
};

/* A ubatch: rows (token, position, sequence) grouped by sequence, each sequence's rows in
 * position order; runs of one sequence are rows [run_start[i], run_start[i+1]). */
struct sil_kv_cache;
struct sil_ubatch {
    int32_t n;
    const int32_t *token, *pos, *seq;
    const int32_t *out_row; /* logits row for this row, or -1 */
    /* NULL, or per row what a token tree lets it see (the CPU backend's attention) and where
     * its branches fork the recurrent state (forward_delta.c); the engine gives trees to no
     * other backend */
    const struct sil_tree_row *tree;
    int32_t n_runs;
    const int32_t *run_start;
    /* the KV block tables of the sequences (kv_cache.h; positions reserved before the pass), or
     * NULL: a device backend then lays a sequence's blocks out one after another */
    const struct sil_kv_cache *kv;
    /* what the head gives back for the rows that want logits: SIL_HEAD_LOGITS and/or
     * SIL_HEAD_ARGMAX, as the head will be asked; a device backend keys its graphs on it */
    uint8_t head_out;
    /* 1: one of several micro-batches of a pass run layer by layer (sil_forward_layers), whose
     * ops interleave with the others': a device backend records no graph of it */
    uint8_t layered;
};

#define SIL_HEAD_LOGITS 1u
#define SIL_HEAD_ARGMAX 2u

/* Full attention of one layer over the KV layout (kv_cache.h). Per row i and head h:
 * q_h, k_h = rmsnorm(.) * q_norm / k_norm, NeoX rope on the first n_rot dims at pos[i];
 * K, V of the row stored at (layer, seq[i], pos[i]); o_h = softmax(q_h K^T / sqrt(hd)) V over
 * positions 0..pos[i] of seq[i] with kv head h / (n_head / n_head_kv); gated: o_h *= sigmoid(g_h).
 * With ub->tree: rope at tree[i].rope_pos, and only the positions the row's tree entry shows.
 * where q holds per head [q_h, g_h]. q and k are overwritten (normed and rotated). */
struct sil_attn_args {
    int n_head, n_head_kv, head_dim, n_rot;
    float rope_freq_base, eps;
    bool gated;
    const struct sil_weight *q_norm, *k_norm; /* [head_dim] F32 */
    struct sil_kv_cache *kv;
    int layer;        /* index among the full-attention layers */
    struct sil_act q; /* [n, n_head * head_dim * (gated ? 2 : 1)] */
    struct sil_act k; /* [n, n_head_kv * head_dim] */
    struct sil_act v; /* [n, n_head_kv * head_dim] */
    struct sil_act o; /* [n, n_head * head_dim] */
};

/* Recurrent state of one gated delta-net layer: sequence s's state is
 * seq_state[s] + offset floats (sil_delta_net_state_bind's layout). */
struct sil_recr_state {
    float *const *seq_state;
    int64_t offset;
};

/* The two steps of a gated delta-net layer (delta_net.h has the math), each over all sequence
 * runs of the ubatch with their own state. conv1d: conv_out = silu(causal conv1d(qkv_mixed)),
 * advancing the conv state. delta_net: the delta rule and gated norm per value head, advancing
 * S; a run of one row is the decode step, longer runs are prefill (a backend may chunk them). */
struct sil_delta_net_args {
    const struct sil_delta_net_params *p; /* dims (and the CPU's host pointers) */
    const struct sil_weight *conv1d, *dt_bias, *a, *norm;
    struct sil_recr_state state;
    struct sil_act qkv_mixed; /* [n, conv_dim] */
    struct sil_act conv_out;  /* [n, conv_dim] */
    struct sil_act z;         /* [n, n_v_heads * head_v_dim] */
    struct sil_act alpha;     /* [n, n_v_heads] */
    struct sil_act beta;      /* [n, n_v_heads] */
    struct sil_act out;       /* [n, n_v_heads * head_v_dim] */
};

/* Which experts run on which rows with which weights: the step between routing and the expert
 * matmuls (the expert cache decides hits and misses here by choosing each expert's handles).
 * A pair is one (row, top-k slot); pairs are grouped by expert, experts in ascending id. The
 * arrays are host memory: a device backend's route copies the ids and weights back (n_rows *
 * n_used * 8 bytes per MoE layer) until plans are built on the device. */
struct sil_moe_plan {
    int32_t n_rows, n_used; /* ubatch rows, experts per row (K) */
    int32_t *sel_expert;    /* [n_rows * n_used] routed expert per (row, slot) */
    float *sel_weight;      /* [n_rows * n_used] its normalised router weight */
    int32_t n_active;       /* experts with at least one row */
    int32_t *expert;        /* [n_active] expert id */
    int32_t *pair_start;    /* [n_active + 1] pairs of active expert a: [start[a], start[a+1]) */
    int32_t *pair_row;      /* [n_rows * n_used] input row of each pair */
    int32_t *pair_of;       /* [n_rows * n_used] pair index of (row, slot) */
    struct sil_weight *gate, *up, *down; /* [n_active] the expert's matrices */
    /* the layer's stacked expert tensors, set before route */
    const struct sil_weight *gate_exps, *up_exps, *down_exps;
    /* Set by a route that kept the choices on the device (every expert resident): sel_*, the
     * grouping and the per-expert handles are then not filled (n_active 0) and moe reads the
     * choices where route left them. */
    bool device_routed;
    int32_t layer; /* the model layer (set before route) */
    /* Optional (NULL: each row's top-k): route with these choices instead, [n_rows * n_used]
     * distinct ids a row in slot order, weighted by their router probabilities as the top-k
     * would be (an observer's choose, engine.h: a replayed trace; the CPU backend only). The
     * route then reports how far they are from its own top-k: force_changed, the choices outside
     * it; force_gap, the largest ln(p of its own k-th / p of a choice outside it) (0: none);
     * force_bad, choices it cannot take (out of range or repeated in a row). */
    const int32_t *force_sel;
    int32_t force_changed;
    float force_gap;
    bool force_bad;
    /* shared expert, always run on every row; gate_inp NULL when the model has none */
    const struct sil_weight *sh_gate_inp, *sh_gate, *sh_up, *sh_down;
};

struct sil_backend;

/* state_keep's operations */
enum sil_state_keep { SIL_STATE_KEEP, SIL_STATE_BACK, SIL_STATE_DROP };

struct sil_backend_ops {
    const char *name;
    void (*free)(struct sil_backend *be);
    /* Activation memory for the lifetime of the backend; NULL on failure. */
    void *(*alloc_act)(struct sil_backend *be, size_t bytes);

    /* Optional: a ubatch's forward pass starts (the first op of it comes next). A device
     * backend stages the ubatch's positions and runs here, and may replay a recorded pass. */
    void (*begin)(struct sil_backend *be, const struct sil_ubatch *ub);
    /* Optional: the ops that follow are micro-batch ub's again (sil_forward_layers, between
     * the micro-batches of one layer; ub's begin came earlier in the pass). A device backend
     * stages ub's positions and runs again here. NULL: the backend keeps nothing of a ubatch
     * between its ops. */
    void (*resume)(struct sil_backend *be, const struct sil_ubatch *ub);
    /* y[i] = dequantized row ids[i] of w (an embedding table). */
    void (*get_rows)(struct sil_backend *be, const struct sil_weight *w, const int32_t *ids,
                     struct sil_act y);
    /* y[i] = x[rows[i]] for i < y.rows; y and x do not overlap. */
    void (*copy_rows)(struct sil_backend *be, struct sil_act y, struct sil_act x,
                      const int32_t *rows);
    /* Every out[j].y = x W_j^T; outputs sharing one input run together. */
    void (*matmul)(struct sil_backend *be, struct sil_act x, const struct sil_mm_out *out, int n);
    /* y = x / sqrt(mean(x^2) + eps) * w per row; y may be x. */
    void (*rmsnorm)(struct sil_backend *be, struct sil_act y, struct sil_act x,
                    const struct sil_weight *w, float eps);
    /* y += x */
    void (*add)(struct sil_backend *be, struct sil_act y, struct sil_act x);
    /* Optional (NULL: add, then rmsnorm): x += d, then y = rmsnorm(x) * w, with the bits of the
     * two ops one after the other. */
    void (*add_rmsnorm)(struct sil_backend *be, struct sil_act y, struct sil_act x,
                        struct sil_act d, const struct sil_weight *w, float eps);
    /* Optional (NULL: matmul, then conv1d): every out[j].y = x W_j^T, then conv1d(ub, a), where
     * out[0].y is a->qkv_mixed (the delta net's input projections and its conv), with the bits
     * of the two ops one after the other. */
    void (*matmul_conv1d)(struct sil_backend *be, const struct sil_ubatch *ub, struct sil_act x,
                          const struct sil_mm_out *out, int n, const struct sil_delta_net_args *a);
    /* y = silu(gate) * up; y may be gate */
    void (*swiglu)(struct sil_backend *be, struct sil_act y, struct sil_act gate,
                   struct sil_act up);
    void (*attention)(struct sil_backend *be, const struct sil_ubatch *ub,
                      const struct sil_attn_args *a);
    void (*conv1d)(struct sil_backend *be, const struct sil_ubatch *ub,
                   const struct sil_delta_net_args *a);
    void (*delta_net)(struct sil_backend *be, const struct sil_ubatch *ub,
                      const struct sil_delta_net_args *a);
    /* p = softmax(x W^T) per row; plan->sel_expert / sel_weight = the n_used largest (ties to the
     * lower id, in descending order) and p_e / max(sum of them, 2^-14). Fills n_rows, n_used. */
    void (*route)(struct sil_backend *be, struct sil_act x, const struct sil_weight *w, int n_used,
                  struct sil_moe_plan *plan);
    /* Optional (NULL: add_rmsnorm, then route): x += d, y = rmsnorm(x) * norm, then route(y, w,
     * n_used, plan) (the norm before a MoE block and its router), with the bits of the two ops
     * one after the other. */
    void (*add_rmsnorm_route)(struct sil_backend *be, struct sil_act y, struct sil_act x,
                              struct sil_act d, const struct sil_weight *norm, float eps,
                              const struct sil_weight *w, int n_used, struct sil_moe_plan *plan);
    /* out = sum over slots k (in order) of w_k * down_e(silu(gate_e x) * up_e x) per row, plus
     * sigmoid(sh_gate_inp . x) * shared expert(x) when there is one. */
    void (*moe)(struct sil_backend *be, struct sil_act x, const struct sil_moe_plan *plan,
                struct sil_act out);
    /* logits[out_rows[i]] (n_vocab = w->rows floats each, host memory; when logits is not NULL)
     * = x[i] W^T; argmax[out_rows[i]] (when not NULL) its largest entry, ties to the lower id,
     * NaN never the largest. At least one of the two is given. */
    void (*head)(struct sil_backend *be, struct sil_act x, const struct sil_weight *w,
                 const int32_t *out_rows, float *logits, int32_t *argmax);

    /* Optional (NULL: weights stay where they are). Moves w into the backend's memory for good
     * and rewrites the handle; release_host: the bytes in the mmap are not needed any more. */
    int (*place)(struct sil_backend *be, struct sil_weight *w, bool release_host,
                 struct sil_error *err);
    /* Optional (NULL: nothing to do). Every weight has been placed; a backend with expert
     * slots pins the host memory its misses are copied from here. An error fails the open. */
    int (*placed)(struct sil_backend *be, struct sil_error *err);
    /* Optional (NULL: ops cannot fail). The first error any op met since create (a fault on the
     * model mapping in a CPU worker: -EIO; a device error); ops after an error do nothing. Ops
     * return nothing, so the engine asks here after each micro-batch. */
    int (*status)(struct sil_backend *be, struct sil_error *err);
    /* Optional (NULL: a sequence's recurrent state is the host array the forward pass hands the
     * ops). Copies sequence seq's recurrent state, n floats in the engine's layout, out of or
     * into the backend's memory, for checkpoints taken and restored between evaluations. */
    int (*state_read)(struct sil_backend *be, int seq, float *dst, int64_t n, struct sil_error *err);
    int (*state_write)(struct sil_backend *be, int seq, const float *src, int64_t n,
                       struct sil_error *err);
    /* Optional (NULL, or -ENOSPC: the engine keeps a verification window's starting state in
     * host memory, through state_read and state_write). Sequence seq's recurrent state kept in
     * the backend's own memory: SIL_STATE_KEEP copies it into a keep slot the sequence takes
     * (or already holds), n the position the window starts at; -ENOSPC when every slot is
     * taken. SIL_STATE_BACK copies the kept state back (the slot stays the sequence's) and
     * returns 0; where the backend captured the delta-net cores' inputs of the window's first n
     * rows in the passes since SIL_STATE_KEEP, it runs those cores again on the state put back
     * and returns 1: the state is then the one at the window's start + n, as those passes left
     * it (the same bits). SIL_STATE_DROP gives the slot back (n unused). Ordered with the passes
     * before and after it. */
    int (*state_keep)(struct sil_backend *be, int seq, enum sil_state_keep how, int32_t n,
                      struct sil_error *err);
    /* Optional (NULL: KV rows live in the host cache, or blocks are never shared). Block src's
     * KV rows into block dst in every full-attention layer (a copy on write of a shared block,
     * kv_cache.h), ordered before the next pass. */
    int (*kv_copy)(struct sil_backend *be, int32_t dst, int32_t src, struct sil_error *err);
    /* Optional (NULL: the host). The device and the device memory taken, by use. */
    void (*device)(struct sil_backend *be, struct sil_engine_device *d);
    /* Optional (NULL or 0: no limit). The most rows of a micro-batch the backend's decode path
     * takes (its decode kernels and graphs): the engine splits a batch of one row a sequence
     * (all decoding) into micro-batches of at most this many rows, which are cheaper than one
     * through the prefill path. */
    int32_t (*decode_rows_max)(struct sil_backend *be);
    /* Optional (NULL or 0: every weight placed is resident). The number of expert slots the
     * backend made because the routed experts did not all fit: routed expert stacks then stay
     * in the mmap, and the expert cache (expert_cache.h) assigns slots in each MoE plan. */
    int32_t (*expert_slots)(struct sil_backend *be);
    /* Optional (NULL or 0: none). How many of each decode plan's misses the backend computes
     * from host memory instead of copying them into slots (plan handles left in the mmap). */
    int32_t (*cpu_misses)(struct sil_backend *be);
    /* Optional (NULL or 0: up to cpu_misses of them, whatever their number). The fraction of
     * each decode plan's misses, rounded and at most cpu_misses, the backend computes on the
     * host: host speed / (host speed + link speed), measured by the backend. */
    double (*host_share)(struct sil_backend *be);
    /* Optional (NULL: measured once, by the backend). Measures the host's speed again on the n
     * experts gate[i], up[i], down[i] (single-expert handles into host memory: where decode
     * misses now come from, the host tier's slots) and sets cpu_misses and host_share from it;
     * n == 0: no host path (cpu_misses 0). For the engine when the host tier opens or goes. */
    void (*measure_host)(struct sil_backend *be, const struct sil_weight *gate,
                         const struct sil_weight *up, const struct sil_weight *down, int n);
    /* Copies one expert's matrices (handles into the mmap or host_alloc memory) into slot; ordered before any later
     * op that reads the slot. Plan handles of slot experts are SIL_WEIGHT_SLOT with data the
     * slot index. layer and expert name what the slot now holds (what it held is gone). */
    void (*fill_slot)(struct sil_backend *be, int32_t slot, const struct sil_weight *gate,
                      const struct sil_weight *up, const struct sil_weight *down, int32_t layer,
                      int32_t expert);
    /* Optional (NULL: never). A pass whose routing stayed on the device although experts are
     * in slots (misses read in place from host memory): after its head, the choices of MoE
     * layer `layer`, [n_rows][n_used] expert ids; returns n_rows, 0 when that layer's choices
     * are not there (a host-routed pass). The cache then sees them as plans (hits, misses, and
     * the fills its admission allows) before the next pass. Valid until the next begin. */
    int32_t (*routes)(struct sil_backend *be, int32_t layer, const int32_t **ids);
    /* Optional (NULL: ordinary memory). Host memory the backend copies from fastest (pinned),
     * for the engine's host tier of experts (expert_store.h), aligned to 4096 bytes; NULL when
     * it cannot. fill_slot and the host's miss path take handles into it (SIL_WEIGHT_HOST). Freed
     * with host_free before the backend is; host_free of memory it did not hand out returns
     * false and does nothing. */
    void *(*host_alloc)(struct sil_backend *be, size_t bytes);
    bool (*host_free)(struct sil_backend *be, void *p);
};

struct sil_backend {
    const struct sil_backend_ops *ops;
};

/* Sizes the CPU backend needs at open: the widest matmul input (k_max), rows per ubatch (ub_max),
 * attention context, the widest router (n_expert), experts per row, the widest expert and
 * shared expert, the embedding width, the delta-net head scratch of one thread. */
struct sil_cpu_config {
    int n_threads;
    bool exact; /* weights dequantized to F32, F32 activations */
    int64_t k_max, ub_max, n_ctx;
    int64_t n_embd, n_expert, n_expert_used, n_ff_exp, n_ff_shexp, dn_head_scratch;
    int64_t n_vocab; /* the head's rows: argmax without a logits buffer goes through scratch of
                      * a few rows of them (0: the head always needs logits) */
    int64_t head_dim; /* attention's (sizes the split attention's partials; 0: SIL_KV_HEAD_MAX) */
    /* tests and benchmarks: sil_engine_params' cpu_profile and test_attn_noise */
    const char *profile;
    float attn_noise;
};

int sil_backend_cpu_create(struct sil_backend **out, const struct sil_cpu_config *c,
                           struct sil_error *err);

/* Sizes the CUDA backend needs at open: everything above that applies, plus the KV cache
 * (n_layer_attn layers of n_seq_max sequences of n_ctx rows of kv_dim floats), the recurrent
 * state (n_seq_max * recr_floats floats), the logits rows, and what the caller will allocate
 * and place (act_bytes, weight_bytes), so a model that does not fit fails at create. */
struct sil_cuda_config {
    int ordinal;
    uint64_t vram_budget; /* 0: all free device memory */
    /* device memory other engines of this process hold (a draft model), counted in vram_budget
     * and left out of what is measured in use at open */
    uint64_t vram_reserved;
    int64_t k_max, ub_max, n_ctx, n_seq_max;
    int64_t n_embd, n_vocab, n_head, n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    int64_t n_layer_attn, kv_dim, head_dim, recr_floats;
    /* recurrent states kept on the device for verification windows (state_keep's slots;
     * sil_engine_params.spec_states), counted in vram_budget */
    int64_t keep_states;
    /* the engine verifies drafts (spec_states > 0): its decode must not depend on what the
     * expert cache held, so no automatic share of misses goes to the CPU */
    bool speculates;
    /* the delta net's shape (every recurrent layer's the same): a kept window's rows have their
     * cores' inputs captured for SIL_STATE_BACK's replay (conv channels, value heads, their
     * width); 0 layers: none */
    int64_t n_layer_recr, dn_conv_dim, dn_v_heads, dn_head_v_dim;
    uint64_t act_bytes, weight_bytes;
    /* of weight_bytes, the routed experts' (the slot pool takes their place when they do not
     * fit), and the largest gate, up and down matrix of one expert over the layers */
    uint64_t routed_bytes, slot_gate, slot_up, slot_down;
    int64_t n_layer_moe; /* layers with routed experts */
    int64_t n_layer;
    enum sil_kv_type kv_type; /* KV elements (--kv-type): F32, F16, q8_0 or q4_0 */
    int64_t kv_blocks; /* KV pool blocks of SIL_KV_BLOCK positions; 0: every sequence at n_ctx */
    /* every MoE layer's choices copied to the host into the plan (route traces need them), as
     * opt.host_route asks; else they stay on the device where every expert is resident */
    bool host_route;
    /* the routed experts the slots miss come from the engine's host tier (expert_store.h):
     * the mapping's pages of the routed stacks are never pinned or read for copies */
    bool host_tier;
    struct sil_cuda_options opt; /* the backend's settings (sil_engine_params.cuda) */
};

/* -ENOTSUP when built without CUDA; -ENODEV / -ENOENT / -ENOMEM with the reason otherwise. */
int sil_backend_cuda_create(struct sil_backend **out, const struct sil_cuda_config *c,
                            struct sil_error *err);

#endif
