/* The engine API (engine.h): model + vocab + a backend (backend.h: CPU or CUDA) + the
 * forward pass's state (forward.h) + per-sequence state (KV for attention layers, conv + SSM
 * state for delta-net layers), all sized at open. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/engine/engine.h"
#include "kernels/clock.h"
#include "daemon/engine/expert_heat.h"
#include "daemon/engine/forward.h"
#include "daemon/engine/hostmem.h"
#include "daemon/engine/size.h"
#include "daemon/engine/kv_cache.h"
#include "daemon/engine/model.h"
#include "daemon/engine/prefix_cache.h"
#include "daemon/engine/state_ckpt.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/cpu/mapguard.h"

/* Rows per forward pass: bounds the scratch (RSS) while keeping matmuls matrix-matrix. */
/* rows per micro-batch: the CPU's tiles are tuned at 128; a GPU reads every expert a ubatch
 * touches once per ubatch (from the bus when it misses the cache), so it takes 512 */
#define UBATCH_MAX 128
#define UBATCH_MAX_DEV 512

/* A sequence's verification window (sil_seq_spec_begin): it starts at position pos, where state
 * holds the recurrent state (models with delta-net layers), and tok the rows evaluated in it
 * since, so sil_seq_spec_commit can take a suffix back. tok and state are allocated at the first
 * begin and kept with the slot. */
struct spec_window {
    bool open;
    bool tree; /* it holds a token tree's rows (sil_batch.parent): nothing may follow them */
    int32_t pos;
    int32_t *tok; /* [n_batch_max] */
    float *state; /* [n_layer_recr * dn_state_floats] */
    bool dev_kept; /* the state at its start is kept by the backend instead (state_keep) */
    /* the delta-net cores' inputs of the window's first cap_n rows, captured as they were
     * evaluated (host backends): row r, recurrent layer l at cq[(r * n_recr + l) * conv_dim]
     * and ca, cb[(r * n_recr + l) * n_v_heads]; room for cap_rows rows. With them a cut
     * replays the cores from the window's state instead of evaluating the kept rows again. */
    bool cap_ok;
    int32_t cap_n, cap_rows;
    float *cq, *ca, *cb;
    float *rq, *ra, *rb, *rconv, *rz, *rout, *rscr; /* the replay's buffers, cap_rows rows */
};

struct sil_engine {
    struct sil_model *model;
    struct sil_vocab *vocab;
    struct sil_model_info info;
    int32_t n_ctx, n_seq_max, n_batch_max, n_ubatch;
    int64_t dev_kv_blocks; /* the device backend's KV pool (blocks), 0 on the CPU */
    enum sil_kv_type kv_type; /* sil_engine_params.kv_type, checked at open */
    struct sil_fwd f;
    bool *seq_live;
    int32_t *seq_len;
    struct sil_state_ckpt *ckpt; /* recurrent-state checkpoints per sequence */
    struct spec_window *spec;    /* [n_seq_max] speculative verification (sil_seq_spec_*) */
    int32_t *spec_pos_rows, *spec_seq_rows; /* [n_batch_max] a commit's recompute batch */
    bool *spec_want_rows;
    struct sil_prefix_cache *prefix;
    int32_t *prefix_blocks; /* [n_ctx / SIL_KV_BLOCK] a match's blocks */
    uint64_t prefix_hits, prefix_misses, prefix_tokens;
    /* eval scratch */
    int32_t *next_pos;                        /* [n_seq_max] */
    int32_t *seq_count, *seq_off;             /* [n_seq_max + 1] */
    int32_t *p_token, *p_pos, *p_seq, *p_out; /* [n_batch_max] rows grouped by sequence */
    /* a batch with a token tree (sil_batch.parent): each row's tree entry, in batch order (b_tree)
     * and grouped like p_token (p_tree) */
    struct sil_tree_row *b_tree, *p_tree;
    bool tree_batch;
    /* [n_seq_max] while a tree batch is checked (models with recurrent layers): each
     * sequence's last row so far and the row its branches fork at (-1: none) */
    int32_t *tree_prev, *tree_fork;
    int32_t *run_start;                       /* [n_batch_max + UBATCH_MAX_DEV + 2] */
    struct sil_ubatch *lm_ub;                 /* [f.n_lm] sil_forward_layers' micro-batches */
    int guard_slot;                           /* the mapping's mapguard slot, or -1 */
    atomic_bool damaged;                      /* the file changed under the mapping */
    void (*eval_progress)(void *user);
    void *eval_progress_user;
    uint64_t heat_tokens; /* tokens of the imported heat map, less the rows evaluated before */
    /* the routed experts' host tier: wanted (the experts the backend reads from the host do not
     * fit the budget), the budget and what chose it */
    bool tier_want;
    /* the experts fit whole, on a device with expert slots: a host tier of all of them
     * (pinned, read once at open with direct reads) instead of pinning the mapping */
    bool tier_full;
    uint64_t tier_budget, tier_min;
    char tier_from[48];
    /* the one host budget (hostmem.h), what is held whatever the plan, what each cache wanted,
     * and how it was shared out */
    uint64_t hp_budget, hp_fixed, hp_want[SIL_HOST_N_CACHE];
    struct sil_host_plan hp;
    const struct sil_engine_observer *observer; /* sil_engine_params.observer, once opened */
};

void sil_engine_params_default(struct sil_engine_params *p)
{
    memset(p, 0, sizeof(*p));
}

/* The engine's own observer of the expert plans (expert_obs.h), when a simulated cache or a heat
 * map is asked for. The simulated cache runs on the CPU only; a heat map is kept on any backend
 * from the plans that reach the host. */
static int open_obs(struct sil_engine *e, const struct sil_engine_params *p,
                    struct sil_error *err)
{
    if (p->ecache_sim_slots <= 0 || p->ecache_sim_soft) {
        if (!e->model->traits->moe || (!p->heat_map && p->ecache_sim_slots <= 0)) return 0;
    } else if (!e->model->traits->moe)
        return sil_errorf(err, -EINVAL, "engine: %s has no experts to trace or cache",
                          e->info.arch_name);
    const bool cpu = strcmp(e->f.be->ops->name, "cpu") == 0;
    int32_t sim_slots = p->ecache_sim_slots;
    if (!cpu && sim_slots > 0 && p->ecache_sim_soft) {
        sim_slots = 0;
        if (!p->heat_map) return 0;
    }
    if (!cpu && sim_slots > 0)
        return sil_errorf(err, -ENOTSUP, "engine: the simulated expert cache runs on the CPU "
                                         "backend only");
    const struct sil_layer_weights *w = &e->f.lw[0];
    struct sil_expert_obs_config c = {
        .n_layer = e->model->hp.n_layer,
        .n_expert = e->model->hp.n_expert,
        .n_used = e->model->hp.n_expert_used,
        .sim_slots = sim_slots > 0 ? sim_slots : -1,
        .sim_policy = p->ecache_sim_policy,
        .expert_bytes =
            w->ffn_gate_exps.mat_bytes + w->ffn_up_exps.mat_bytes + w->ffn_down_exps.mat_bytes,
        .heat = p->heat_map,
    };
    int rc = sil_expert_obs_open(&e->f.obs, &c, err);
    if (rc == 0 && e->f.obs) e->f.observer[e->f.n_observer++] = sil_expert_obs_observer(e->f.obs);
    return rc;
}

/* The observer registered at open (sil_engine_params.observer), where it can see what it asks. */
static int open_observer(struct sil_engine *e, const struct sil_engine_params *p,
                         struct sil_error *err)
{
    const struct sil_engine_observer *o = p->observer;
    if (!o) return 0;
    const bool cpu = strcmp(e->f.be->ops->name, "cpu") == 0;
    if (!cpu && o->choose)
        return sil_errorf(err, -ENOTSUP, "engine: routes chosen by an observer (a route "
                                         "replay) run on the CPU backend only");
    /* a pass that reads misses in place keeps its routing on the device and shows it to the
     * cache after the pass: an observer would not see the evaluation's order */
    if (!cpu && o->host_routes && e->f.ecache)
        return sil_errorf(err, -ENOTSUP, "engine: a route trace on the %s backend needs every "
                                         "expert resident (this budget keeps them in slots)",
                          e->f.be->ops->name);
    int rc = o->on_open ? o->on_open(o->user, &e->info, err) : 0;
    if (rc < 0) return rc;
    if (o->on_route) e->f.observer[e->f.n_observer++] = o;
    if (o->choose) e->f.chooser = o;
    e->observer = o;
    return 0;
}

bool sil_engine_kv_type_valid(const char *name)
{
    return sil_kv_type_from_name(name) >= 0;
}

/* Bytes of one KV block on a device: K and V rows of every full-attention layer. */
static uint64_t dev_kv_block_bytes(const struct sil_engine *e)
{
    const struct sil_hparams *hp = &e->model->hp;
    return 2 * (uint64_t)hp->n_layer_attn * SIL_KV_BLOCK *
           sil_kv_type_bytes(e->kv_type, (int64_t)hp->n_head_kv * hp->n_embd_head_k);
}

/* A KV pool of n_layer layers of the model's KV heads, for e's sequences and context. */
static struct sil_kv_config kv_config(const struct sil_engine *e, int32_t n_layer)
{
    const struct sil_hparams *hp = &e->model->hp;
    return (struct sil_kv_config){
        .n_layer = n_layer,
        .n_seq_max = e->n_seq_max,
        .n_ctx = e->n_ctx,
        .n_embd_k = hp->n_head_kv * hp->n_embd_head_k,
        .n_embd_v = hp->n_head_kv * hp->n_embd_head_v,
        .head_dim = hp->n_embd_head_k,
        .type = e->kv_type,
    };
}

/* The KV pool. A device backend keeps its own KV layout: the host cache then only keeps the
 * block tables (no layers, no memory). */
static int open_kv(struct sil_engine *e, const struct sil_engine_params *p, struct sil_error *err)
{
    const bool host = strcmp(e->f.be->ops->name, "cpu") == 0;
    struct sil_kv_config c = kv_config(e, host ? e->model->hp.n_layer_attn : 0);
    c.budget = p->kv_budget;
    c.n_blocks = host ? 0 : (int32_t)e->dev_kv_blocks;
    return sil_kv_create(&e->f.kv, &c, err);
}

static void *xcalloc(size_t n, size_t sz, bool *fail)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p)
        *fail = true;
    return p;
}

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int alloc_scratch(struct sil_engine *e, struct sil_error *err)
{
    struct sil_fwd *f = &e->f;
    bool fail = false;
    f->recr_state = xcalloc((size_t)e->n_seq_max, sizeof(float *), &fail);

    e->seq_live = xcalloc((size_t)e->n_seq_max, sizeof(bool), &fail);
    e->seq_len = xcalloc((size_t)e->n_seq_max, sizeof(int32_t), &fail);
    e->next_pos = xcalloc((size_t)e->n_seq_max, sizeof(int32_t), &fail);
    e->seq_count = xcalloc((size_t)e->n_seq_max + 1, sizeof(int32_t), &fail);
    e->seq_off = xcalloc((size_t)e->n_seq_max + 1, sizeof(int32_t), &fail);
    e->p_token = xcalloc((size_t)e->n_batch_max, sizeof(int32_t), &fail);
    e->p_pos = xcalloc((size_t)e->n_batch_max, sizeof(int32_t), &fail);
    e->p_seq = xcalloc((size_t)e->n_batch_max, sizeof(int32_t), &fail);
    e->p_out = xcalloc((size_t)e->n_batch_max, sizeof(int32_t), &fail);
    e->b_tree = xcalloc((size_t)e->n_batch_max, sizeof(struct sil_tree_row), &fail);
    e->p_tree = xcalloc((size_t)e->n_batch_max, sizeof(struct sil_tree_row), &fail);
    e->tree_prev = xcalloc((size_t)e->n_seq_max, sizeof(int32_t), &fail);
    e->tree_fork = xcalloc((size_t)e->n_seq_max, sizeof(int32_t), &fail);
    f->fork_state = xcalloc((size_t)e->n_seq_max, sizeof(float *), &fail);
    /* one micro-batch's runs at a time, or (sil_forward_layers) each micro-batch's at its
     * first row's index plus its own: at most n_batch_max + n_lm + 1 */
    e->run_start = xcalloc((size_t)e->n_batch_max + UBATCH_MAX_DEV + 2, sizeof(int32_t), &fail);
    e->spec = xcalloc((size_t)e->n_seq_max, sizeof(struct spec_window), &fail);
    if (fail)
        return sil_errorf(err, -ENOMEM, "%s: out of memory for scratch buffers", e->info.path);
    return 0;
}

static void free_scratch(struct sil_engine *e)
{
    struct sil_fwd *f = &e->f;
    void *ptrs[] = {f->dn,      e->seq_live, e->seq_len, e->next_pos, e->seq_count, e->seq_off,
                    e->p_token, e->p_pos,    e->p_seq,   e->p_out,    e->run_start,
                    e->spec_pos_rows, e->spec_seq_rows, e->spec_want_rows, e->b_tree,
                    e->p_tree, e->tree_prev, e->tree_fork};
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++)
        free(ptrs[i]);
    if (e->spec)
        for (int s = 0; s < e->n_seq_max; s++) {
            struct spec_window *w = &e->spec[s];
            void *wp[] = {w->tok, w->state, w->cq, w->ca, w->cb, w->rq, w->ra, w->rb,
                          w->rconv, w->rz, w->rout, w->rscr};
            for (size_t i = 0; i < sizeof(wp) / sizeof(wp[0]); i++)
                free(wp[i]);
        }
    free(e->spec);
    if (f->recr_state)
        for (int s = 0; s < e->n_seq_max; s++)
            free(f->recr_state[s]);
    free(f->recr_state);
    if (f->fork_state)
        for (int s = 0; s < e->n_seq_max; s++)
            free(f->fork_state[s]);
    free(f->fork_state);
}

static int bind_delta_net(struct sil_engine *e, struct sil_error *err)
{
    const struct sil_model *m = e->model;
    const struct sil_hparams *hp = &m->hp;
    if (hp->n_layer_recr == 0)
        return 0;
    e->f.dn = calloc((size_t)hp->n_layer_recr, sizeof(struct sil_delta_net_params));
    if (!e->f.dn)
        return sil_errorf(err, -ENOMEM, "%s: out of memory", e->info.path);
    for (int il = 0; il < hp->n_layer; il++) {
        const struct sil_layer *l = &m->layers[il];
        if (l->recr_index < 0)
            continue;
        struct sil_delta_net_params *p = &e->f.dn[l->recr_index];
        p->n_k_heads = hp->ssm_n_group;
        p->n_v_heads = hp->ssm_dt_rank;
        p->head_k_dim = hp->ssm_d_state;
        p->head_v_dim = hp->ssm_d_inner / hp->ssm_dt_rank;
        p->conv_kernel = hp->ssm_d_conv;
        p->eps = hp->rms_eps;
        p->conv1d = l->ssm_conv1d->data;
        p->dt_bias = l->ssm_dt->data;
        p->a = l->ssm_a->data;
        p->norm = l->ssm_norm->data;
        int rc = sil_delta_net_check(p, err);
        if (rc < 0) {
            sil_error_prefix(err, "%s: layer %d", e->info.path, il);
            return rc;
        }
    }
    e->f.dn_state_floats = sil_delta_net_state_floats(&e->f.dn[0]);
    return 0;
}

/* The widest matmul input of the model. */
static int64_t k_max_of(const struct sil_engine *e)
{
    const struct sil_hparams *hp = &e->model->hp;
    const int64_t zdim =
        hp->n_layer_recr > 0 ? (int64_t)e->f.dn[0].n_v_heads * e->f.dn[0].head_v_dim : 0;
    const int64_t ff = max64(hp->n_ff, hp->n_ff_shexp);
    /* the MTP layer's eh_proj reads the embedding and the hidden state side by side */
    const int64_t mtp = hp->n_nextn > 0 ? 2 * (int64_t)hp->n_embd : 0;
    return max64(max64(max64(hp->n_embd, hp->n_head * hp->n_embd_head_k), mtp),
                 max64(max64(ff, hp->n_ff_exp), zdim));
}

/* With the host tier a batch of several micro-batches goes layer by layer (sil_forward_layers):
 * n_lm micro-batches of ub_max rows a pass (f->ub_max set). 0 or -ENOMEM. */
static int layered_open(struct sil_engine *e)
{
    struct sil_fwd *f = &e->f;
    free(e->lm_ub); /* an auto backend's first try */
    e->lm_ub = NULL;
    f->n_lm = e->tier_want && e->n_batch_max > f->ub_max
                  ? (e->n_batch_max + f->ub_max - 1) / f->ub_max
                  : 0;
    if (f->n_lm > 0 && !(e->lm_ub = calloc((size_t)f->n_lm, sizeof(*e->lm_ub)))) return -ENOMEM;
    return 0;
}

/* The CPU backend, sized for this model: the widest matmul input, MoE and delta-net scratch. */
static int open_cpu(struct sil_engine *e, int n_threads, const struct sil_engine_params *p,
                    struct sil_error *err)
{
    struct sil_fwd *f = &e->f;
    const struct sil_hparams *hp = &e->model->hp;
    /* with the host tier a micro-batch reads what its layers miss from the file once for all
     * its rows: longer ones read the experts fewer times over a long prompt */
    int32_t ub = e->tier_want ? UBATCH_MAX_DEV : UBATCH_MAX;
    if (e->n_ubatch > 0 && e->n_ubatch < ub) ub = e->n_ubatch;
    f->ub_max = e->n_batch_max < ub ? e->n_batch_max : ub; /* after auto's try */
    if (layered_open(e) < 0) return sil_errorf(err, -ENOMEM, "engine: out of memory");
    struct sil_cpu_config c = {
        .n_threads = n_threads,
        .exact = p->exact,
        .k_max = k_max_of(e),
        .ub_max = f->ub_max,
        .n_ctx = f->n_ctx,
        .n_embd = hp->n_embd,
        .n_vocab = hp->n_vocab,
        .n_expert = hp->n_expert,
        .n_expert_used = hp->n_expert_used,
        .n_ff_exp = hp->n_ff_exp,
        .n_ff_shexp = hp->n_ff_shexp,
        .head_dim = hp->n_embd_head_k > hp->n_embd_head_v ? hp->n_embd_head_k : hp->n_embd_head_v,
        .dn_head_scratch =
            hp->n_layer_recr > 0 ? sil_delta_net_head_scratch_floats(&f->dn[0], f->ub_max) : 0,
        .profile = p->cpu_profile,
        .attn_noise = p->test_attn_noise,
    };
    int rc = sil_backend_cpu_create(&f->be, &c, err);
    if (rc < 0)
        return rc;
    return sil_fwd_open(f, err);
}

/* The CUDA backend with every weight resident: sized up front so a model that does not fit
 * (the device or --vram-budget) fails before anything is uploaded. */
static int open_cuda(struct sil_engine *e, const struct sil_engine_params *p, struct sil_error *err)
{
    struct sil_fwd *f = &e->f;
    const struct sil_hparams *hp = &e->model->hp;
    if (p->exact)
        return sil_errorf(err, -ENOTSUP,
                          "cuda backend: exact (F32) mode runs on the CPU backend only");
    const enum sil_kv_type kv_type = e->kv_type;
    if ((kv_type == SIL_KV_Q8_0 || kv_type == SIL_KV_Q4_0) && hp->n_layer_attn > 0 &&
        hp->n_embd_head_k % 32 != 0)
        return sil_errorf(err, -ENOTSUP,
                          "cuda backend: KV type %s needs a head size that is a multiple of 32 "
                          "(this model's is %d)",
                          p->kv_type, (int)hp->n_embd_head_k);
    /* the device's KV pool: kv_budget bytes of blocks (K and V of every attention layer), or
     * every sequence at the full context; the host cache keeps its block tables */
    const int64_t bps = ((int64_t)e->n_ctx + SIL_KV_BLOCK - 1) / SIL_KV_BLOCK;
    const uint64_t dev_block = dev_kv_block_bytes(e);
    e->dev_kv_blocks = (int64_t)e->n_seq_max * bps;
    if (p->kv_budget && dev_block) {
        e->dev_kv_blocks = (int64_t)(p->kv_budget / dev_block);
        if (e->dev_kv_blocks < 1)
            return sil_errorf(err, -EINVAL,
                              "cuda backend: a KV budget of %llu bytes holds no block (one is "
                              "%llu)",
                              (unsigned long long)p->kv_budget, (unsigned long long)dev_block);
        if (e->dev_kv_blocks > (int64_t)e->n_seq_max * bps)
            e->dev_kv_blocks = (int64_t)e->n_seq_max * bps;
    }
    /* cuda.ubatch N (tests, benchmarks) caps the rows per micro-batch lower */
    int32_t ub = p->cuda.ubatch > 0 ? p->cuda.ubatch : UBATCH_MAX_DEV;
    if (ub > UBATCH_MAX_DEV) ub = UBATCH_MAX_DEV;
    if (e->n_ubatch > 0 && e->n_ubatch < ub) ub = e->n_ubatch;
    f->ub_max = e->n_batch_max < ub ? e->n_batch_max : ub;
    if (layered_open(e) < 0) return sil_errorf(err, -ENOMEM, "engine: out of memory");
    size_t scratch = 0;
    if (hp->n_layer_attn > 0)
        scratch = sil_fwd_attention_scratch(f);
    if (hp->n_layer_recr > 0 && sil_fwd_delta_net_scratch(f) > scratch)
        scratch = sil_fwd_delta_net_scratch(f);
    if (!e->model->traits->moe && sil_fwd_ffn_scratch(f) > scratch)
        scratch = sil_fwd_ffn_scratch(f);
    struct sil_cuda_config c = {
        .ordinal = 0,
        .vram_budget = p->vram_budget,
        .vram_reserved = p->vram_reserved,
        .k_max = k_max_of(e),
        .ub_max = f->ub_max,
        .n_ctx = f->n_ctx,
        .n_seq_max = e->n_seq_max,
        .n_embd = hp->n_embd,
        .n_vocab = hp->n_vocab,
        .n_head = hp->n_head,
        .n_layer = hp->n_layer,
        .n_expert = hp->n_expert,
        .n_expert_used = hp->n_expert_used,
        .n_ff_exp = hp->n_ff_exp,
        .n_ff_shexp = hp->n_ff_shexp,
        .n_layer_attn = hp->n_layer_attn,
        .kv_dim = (int64_t)hp->n_head_kv * hp->n_embd_head_k,
        .head_dim = hp->n_embd_head_k,
        .recr_floats = (int64_t)hp->n_layer_recr * f->dn_state_floats,
        .keep_states = hp->n_layer_recr > 0 && p->spec_states > 0 ? p->spec_states : 0,
        .speculates = p->spec_states > 0,
        .n_layer_recr = hp->n_layer_recr,
        .dn_conv_dim = hp->n_layer_recr > 0 ? sil_delta_net_conv_dim(&f->dn[0]) : 0,
        .dn_v_heads = hp->n_layer_recr > 0 ? f->dn[0].n_v_heads : 0,
        .dn_head_v_dim = hp->n_layer_recr > 0 ? f->dn[0].head_v_dim : 0,
        /* x, cur, out and each layered micro-batch's x and cur */
        .act_bytes = (3 + 2 * (uint64_t)f->n_lm) * (uint64_t)f->ub_max * (uint64_t)hp->n_embd *
                         sizeof(float) +
                     scratch,
        .kv_type = kv_type,
        .kv_blocks = e->dev_kv_blocks,
        .host_route = p->observer && p->observer->host_routes, /* every layer's choices */
        .host_tier = e->tier_want || e->tier_full,
        .opt = p->cuda,
        .weight_bytes = e->info.routed_expert_bytes + e->info.backbone_bytes,
    };
    c.routed_bytes = e->info.routed_expert_bytes;
    for (int il = 0; il < hp->n_layer && hp->n_expert > 0; il++) {
        const struct sil_layer *l = &e->model->layers[il];
        const struct sil_gguf_tensor *t[3] = {l->ffn_gate_exps, l->ffn_up_exps, l->ffn_down_exps};
        uint64_t *slot[3] = {&c.slot_gate, &c.slot_up, &c.slot_down};
        for (int i = 0; i < 3; i++)
            if (t[i] && t[i]->nbytes / (uint64_t)hp->n_expert > *slot[i])
                *slot[i] = t[i]->nbytes / (uint64_t)hp->n_expert;
        c.n_layer_moe += l->ffn_gate_exps != NULL;
    }
    /* the embedding table stays in host memory (get_rows reads it there) unless it is the head */
    if (!e->model->tied_output && c.weight_bytes >= (uint64_t)e->model->tok_embd->nbytes)
        c.weight_bytes -= (uint64_t)e->model->tok_embd->nbytes;
    if (hp->n_layer_attn > 0 && hp->n_embd_head_v != hp->n_embd_head_k)
        return sil_errorf(err, -ENOTSUP, "cuda backend: K and V head sizes differ");
    int rc = sil_backend_cuda_create(&f->be, &c, err);
    if (rc == 0)
        rc = sil_fwd_open(f, err);
    if (rc == 0)
        rc = sil_fwd_place_weights(f, err);
    const int32_t slots = rc == 0 && f->be->ops->expert_slots ? f->be->ops->expert_slots(f->be) : 0;
    /* the simulated cache's policy names the device cache's too (benchmarks compare them) */
    int ec_policy = SIL_ECACHE_DEFAULT;
    if (rc == 0 && slots > 0 && p->ecache_sim_policy) {
        ec_policy = sil_ecache_policy_parse(p->ecache_sim_policy);
        if (ec_policy < 0)
            rc = sil_errorf(err, -EINVAL,
                            "unknown expert cache policy '%s' (lfu, lru, heat, static)",
                            p->ecache_sim_policy);
    }
    f->ecache_policy = ec_policy;
    f->cpu_misses =
        rc == 0 && slots > 0 && f->be->ops->cpu_misses ? f->be->ops->cpu_misses(f->be) : 0;
    if (rc == 0 && slots > 0) {
        /* one pool over all layers: a prefill plan may need every expert of a layer */
        const struct sil_ecache_config ec = {
            .n_layer = hp->n_layer,
            .n_expert = (int32_t)hp->n_expert,
            .n_slot = slots,
            .policy = ec_policy,
            .pools = SIL_ECACHE_GLOBAL,
            .expert_bytes = c.slot_gate + c.slot_up + c.slot_down,
            /* static keeps room to stream one layer's misses (the device cannot run an expert
             * from the mapping in a prefill) */
            .n_stage = (int32_t)hp->n_expert < slots ? (int32_t)hp->n_expert : slots,
        };
        rc = sil_ecache_create(&f->ecache, &ec, err);
        /* the backend's share of a decode plan's misses on the host (with cpu_misses its cap) */
        if (rc == 0 && f->cpu_misses > 0 && f->be->ops->host_share)
            sil_ecache_set_host_share(f->ecache, f->be->ops->host_share(f->be));
        f->ecache_res = calloc((size_t)hp->n_expert, sizeof(*f->ecache_res));
        f->ecache_uses = calloc((size_t)hp->n_expert, sizeof(*f->ecache_uses));
        if (rc == 0 && (!f->ecache_res || !f->ecache_uses))
            rc = sil_errorf(err, -ENOMEM, "engine: out of memory");
    }
    if (rc < 0) {
        sil_ecache_free(f->ecache);
        free(f->ecache_res);
        free(f->ecache_uses);
        f->ecache = NULL;
        f->ecache_res = NULL;
        f->ecache_uses = NULL;
        sil_fwd_close(f);
        if (f->be)
            f->be->ops->free(f->be);
        f->be = NULL;
    }
    return rc;
}

/* The host tier's config for this model (its file and every layer's expert matrices), mat
 * malloc'd; -ENOMEM. */
static int tier_config(const struct sil_engine *e, struct sil_xstore_config *c,
                      struct sil_xstore_mat **mat, int32_t *n_moe)
{
    const struct sil_hparams *hp = &e->model->hp;
    *mat = calloc((size_t)hp->n_layer * 3, sizeof(**mat));
    if (!*mat) return -ENOMEM;
    const uint64_t base = sil_gguf_data_offset(e->model->gguf);
    *n_moe = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        const struct sil_layer *l = &e->model->layers[il];
        const struct sil_gguf_tensor *t[3] = {l->ffn_gate_exps, l->ffn_up_exps, l->ffn_down_exps};
        if (!t[0] || !t[1] || !t[2] || hp->n_expert <= 0) continue;
        (*n_moe)++;
        for (int i = 0; i < 3; i++)
            (*mat)[il * 3 + i] = (struct sil_xstore_mat){base + t[i]->offset,
                                                         t[i]->nbytes / (uint64_t)hp->n_expert};
    }
    *c = (struct sil_xstore_config){
        .path = e->info.path,
        .dev = e->info.file_dev,
        .ino = e->info.file_ino,
        .file_bytes = e->info.file_bytes,
        .n_layer = hp->n_layer,
        .n_expert = (int32_t)hp->n_expert,
        .mat = *mat,
    };
    return 0;
}

/* The one host budget (hostmem.h) shared out: host_budget, else what the host and the process's
 * cgroup can spare less room for the OS and buffers (1 GiB and an eighth). Held whatever the
 * plan: on the CPU, the backbone read in place and the KV pool (kv_budget, else one sequence at
 * the full context). The routed experts read from host memory want all of their bytes; the
 * caches what they were given (the prefix cache's snapshots on models with recurrent layers, its
 * KV blocks where the KV is in host memory and not already in a kv_budget, the idle sessions).
 * The tier is wanted when the experts do not fit whole; a device backend that holds them all
 * in VRAM after all turns it off at open_host_tier. cpu: planned for the CPU backend (backend
 * auto plans for CUDA and plans again if it falls back to the CPU). -EINVAL, with the least
 * budget, when the budget is under what the plan needs. */
static int tier_plan(struct sil_engine *e, const struct sil_engine_params *p, bool cpu,
                     struct sil_error *err)
{
    const struct sil_hparams *hp = &e->model->hp;
    e->hp_budget = p->host_budget;
    snprintf(e->tier_from, sizeof e->tier_from, "host_budget");
    if (!p->host_budget) {
        struct sil_host_spare sp;
        sil_host_spare(NULL, &sp);
        snprintf(e->tier_from, sizeof e->tier_from, "%s", sp.from);
        e->hp_budget = sp.bytes;
        if (sp.bytes != UINT64_MAX) {
            const uint64_t keep = (1ull << 30) + sp.bytes / 8;
            e->hp_budget = sp.bytes > keep ? sp.bytes - keep : 0;
        }
    }
    struct sil_xstore_mat *mat = NULL;
    struct sil_xstore_config c;
    int32_t n_moe = 0;
    if (e->model->traits->moe && tier_config(e, &c, &mat, &n_moe) == 0 && n_moe > 0)
        e->tier_min = (uint64_t)sil_xstore_min_slots(&c) * sil_xstore_slot_bytes(&c);
    free(mat);
    const bool experts = !p->host_budget_off && e->model->traits->moe && n_moe > 0;
    uint64_t kv = 0;
    if (cpu && hp->n_layer_attn > 0) {
        const int64_t kd = (int64_t)hp->n_head_kv * hp->n_embd_head_k;
        const int64_t vd = (int64_t)hp->n_head_kv * hp->n_embd_head_v;
        kv = p->kv_budget ? p->kv_budget
                          : (uint64_t)hp->n_layer_attn * (uint64_t)e->n_ctx *
                                (sil_kv_type_bytes(e->kv_type, kd) +
                                 sil_kv_type_bytes(e->kv_type, vd));
    }
    struct sil_host_plan_in in = {
        .budget = e->hp_budget,
        .fixed = (cpu ? e->info.backbone_bytes : 0) + kv,
        .experts = experts ? e->info.routed_expert_bytes : 0,
        .experts_min = experts ? e->tier_min : 0,
        .want = {hp->n_layer_recr > 0 ? p->prefix_ckpt_budget : 0,
                 cpu && !p->kv_budget ? p->prefix_cache_budget : 0, p->session_budget},
    };
    e->hp_fixed = in.fixed;
    memcpy(e->hp_want, in.want, sizeof e->hp_want);
    const int rc = sil_host_plan(&in, &e->hp);
    e->tier_want = experts && e->hp.tier;
    e->tier_budget = e->hp.experts;
    /* Pinning the file mapping's pages instead (cuda_pin = on) hung on a host kernel: its first
     * cuMemHostRegister never returned (all system time in minor faults) */
    e->tier_full = rc == 0 && !cpu && experts && !e->hp.tier && p->cuda.pin == SIL_CUDA_PIN_AUTO;
    if (rc == 0) return 0;
    char what[160] = "", b[4][24];
    if (in.experts_min)
        snprintf(what, sizeof what, ", and the routed experts' host tier needs at least %s",
                 sil_size_str(in.experts_min, b[0], 24));
    else if (in.experts)
        snprintf(what, sizeof what, ", and the routed experts %s",
                 sil_size_str(in.experts, b[0], 24));
    return sil_errorf(err, -EINVAL,
                      "the host budget of %s (%s) is under the least this model takes, %s "
                      "(%llu bytes): %s for the backbone and KV%s%s",
                      sil_size_str(e->hp_budget, b[1], 24), e->tier_from,
                      sil_size_str(e->hp.min_budget, b[2], 24),
                      (unsigned long long)e->hp.min_budget, sil_size_str(in.fixed, b[3], 24), what,
                      strcmp(e->tier_from, "host_budget") == 0
                          ? ""
                          : ": free host memory or set host_budget");
}

/* One line when the caches gave way to the plan (tier_plan), once the backend is known. */
static void plan_say(const struct sil_engine *e)
{
    if (!e->hp.gave_way) return;
    char b[6][24];
    fprintf(stderr,
            "siliceo: host budget %s (%s): %s for the backbone and KV, %s for the routed "
            "experts%s; the caches gave way (in this order): snapshots %s, prefix blocks %s, "
            "sessions %s\n",
            sil_size_str(e->hp_budget, b[0], 24), e->tier_from, sil_size_str(e->hp_fixed, b[1], 24),
            sil_size_str(e->hp.experts, b[2], 24), e->hp.tier ? " (a host tier)" : "",
            sil_size_str(e->hp.cache[SIL_HOST_SNAPSHOTS], b[3], 24),
            sil_size_str(e->hp.cache[SIL_HOST_PREFIX], b[4], 24),
            sil_size_str(e->hp.cache[SIL_HOST_SESSIONS], b[5], 24));
}

/* The backend's pinned memory, else ordinary memory (its copies are then staged). */
static void *tier_alloc(void *user, size_t bytes)
{
    struct sil_backend *be = user;
    void *p = be->ops->host_alloc(be, bytes);
    if (!p && posix_memalign(&p, 4096, bytes) != 0) p = NULL;
    return p;
}

static void tier_release(void *user, void *ptr)
{
    struct sil_backend *be = user;
    if (!be->ops->host_free(be, ptr)) free(ptr);
}

static void close_host_tier(struct sil_fwd *f)
{
    sil_xstore_free(f->xstore);
    f->xstore = NULL;
    free(f->xs_which);
    free(f->xs_exp);
    free(f->xs_uses);
    free(f->xs_ptr);
    f->xs_which = f->xs_exp = f->xs_uses = NULL;
    f->xs_ptr = NULL;
}

/* A tier of all the experts (tier_full): every one read into its slot now, a layer a batch, so
 * that no miss waits on the disk and the mapping's expert pages are never touched. */
static int tier_read_all(struct sil_engine *e, const struct sil_engine_params *p, int32_t n_moe,
                         struct sil_error *err)
{
    const struct sil_hparams *hp = &e->model->hp;
    const int32_t X = hp->n_expert;
    int32_t *keys = malloc((size_t)X * sizeof(int32_t));
    if (!keys) return sil_errorf(err, -ENOMEM, "engine: out of memory");
    const double t0 = sil_now_s();
    int64_t placed = 0;
    int rc = 0;
    for (int32_t l = 0; l < hp->n_layer && rc == 0; l++) {
        for (int32_t x = 0; x < X; x++)
            keys[x] = l * X + x;
        const int64_t got = sil_xstore_preload(e->f.xstore, keys, X, err);
        if (got < 0) rc = (int)got;
        else placed += got;
        /* the load's progress: 0.7 once the vocabulary is in, 0.95 when all are read */
        if (rc == 0 && p->progress &&
            !p->progress(0.7f + 0.25f * (float)(l + 1) / (float)hp->n_layer,
                         "reading the routed experts into the host tier", p->progress_user))
            rc = sil_errorf(err, -ECANCELED, "%s: load stopped", p->model_path);
    }
    free(keys);
    if (rc < 0) return rc;
    struct sil_xstore_stats st;
    sil_xstore_stats(e->f.xstore, &st);
    const double s = sil_now_s() - t0;
    char b[24];
    fprintf(stderr, "siliceo: host tier: %lld experts of %d layers read in %.1f s (%s, %.2f GB/s)\n",
            (long long)placed, n_moe, s, sil_size_str(st.bytes_read, b, 24),
            s > 0 ? (double)st.bytes_read / s / 1e9 : 0.0);
    return 0;
}

/* The backend's host path (decode misses computed on the CPU) measured where its misses now
 * come from: up to HOST_PROBE experts of the first MoE layer read into the host tier's slots
 * (n 0: the tier is gone, no host path). The expert cache then takes the new share. */
#define HOST_PROBE 40
static void tier_measure_host(struct sil_engine *e, bool on)
{
    struct sil_fwd *f = &e->f;
    const struct sil_hparams *hp = &e->model->hp;
    if (!f->be->ops->measure_host || !f->ecache) return;
    struct sil_weight m[3][HOST_PROBE];
    int32_t ids[HOST_PROBE];
    const void *ptr[3 * HOST_PROBE];
    int32_t n = 0;
    for (int il = 0; on && f->xstore && il < hp->n_layer && n == 0; il++) {
        const struct sil_layer_weights *w = &f->lw[il];
        if (!w->ffn_gate_exps.data || w->ffn_gate_exps.n_mat != hp->n_expert) continue;
        n = hp->n_expert < HOST_PROBE ? (int32_t)hp->n_expert : HOST_PROBE;
        for (int32_t j = 0; j < n; j++)
            ids[j] = j;
        struct sil_error err = {0};
        if (sil_xstore_acquire(f->xstore, il, ids, NULL, n, ptr, &err) < 0) {
            fprintf(stderr, "siliceo: host tier: the host path's probe was not read: %s\n",
                    err.msg);
            n = 0;
            break;
        }
        const struct sil_weight *st[3] = {&w->ffn_gate_exps, &w->ffn_up_exps, &w->ffn_down_exps};
        for (int32_t j = 0; j < n; j++)
            for (int k = 0; k < 3; k++) {
                m[k][j] = sil_weight_mat(st[k], j);
                m[k][j].loc = SIL_WEIGHT_HOST;
                m[k][j].data = ptr[3 * j + k];
            }
    }
    f->be->ops->measure_host(f->be, m[0], m[1], m[2], n);
    f->cpu_misses = f->be->ops->cpu_misses ? f->be->ops->cpu_misses(f->be) : 0;
    if (f->be->ops->host_share)
        sil_ecache_set_host_share(f->ecache, f->cpu_misses > 0 ? f->be->ops->host_share(f->be) : 0);
}

/* The host tier, once the backend is open and placed: slots for what the budget holds, read
 * from the file the model was loaded from. A budget under the tier's minimum is an error that
 * gives it. */
static int open_host_tier(struct sil_engine *e, const struct sil_engine_params *p,
                          struct sil_error *err)
{
    struct sil_fwd *f = &e->f;
    const struct sil_hparams *hp = &e->model->hp;
    const bool slots = f->be->ops->expert_slots && f->be->ops->expert_slots(f->be) > 0;
    if (!(e->tier_want || e->tier_full) || (strcmp(f->be->ops->name, "cpu") != 0 && !slots)) {
        e->tier_want = e->tier_full = false;
        return 0;
    }
    struct sil_xstore_mat *mat = NULL;
    struct sil_xstore_config c;
    int32_t n_moe = 0;
    if (tier_config(e, &c, &mat, &n_moe) < 0) return sil_errorf(err, -ENOMEM, "engine: out of memory");
    if (f->be->ops->host_alloc && f->be->ops->host_free) {
        c.alloc = tier_alloc;
        c.release = tier_release;
        c.alloc_user = f->be;
    }
    const uint64_t sb = sil_xstore_slot_bytes(&c);
    const uint64_t all = (uint64_t)n_moe * (uint64_t)hp->n_expert;
    const uint64_t n = sb ? e->tier_budget / sb : 0;
    c.n_slot = (int32_t)(n < all && !e->tier_full ? n : all);
    const int32_t min = sil_xstore_min_slots(&c);
    int rc = 0;
    if (c.n_slot < min) /* tier_plan gave the tier at least its minimum */
        rc = sil_errorf(err, -EINVAL, "engine: the host tier's share (%llu bytes) is under its "
                        "minimum of %d slots of %llu bytes",
                        (unsigned long long)e->tier_budget, min, (unsigned long long)sb);
    if (rc == 0) rc = sil_xstore_create(&f->xstore, &c, err);
    free(mat);
    const size_t X = (size_t)hp->n_expert;
    if (rc == 0) {
        f->xs_which = calloc(X, sizeof(int32_t));
        f->xs_exp = calloc(X, sizeof(int32_t));
        f->xs_uses = calloc(X, sizeof(int32_t));
        f->xs_ptr = calloc(3 * X, sizeof(void *));
        if (!f->xs_which || !f->xs_exp || !f->xs_uses || !f->xs_ptr)
            rc = sil_errorf(err, -ENOMEM, "engine: out of memory");
    }
    if (rc < 0) {
        close_host_tier(f);
        return rc;
    }
    /* what was uploaded, and the experts the tier reads directly, leave the page cache: the
     * file's clean pages that nothing maps (the backbone's on a device, experts read before) */
    const int fd = open(e->info.path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
    if (e->tier_full && (rc = tier_read_all(e, p, n_moe, err)) < 0) {
        close_host_tier(f);
        return rc;
    }
    tier_measure_host(e, true);
    struct sil_xstore_stats st;
    sil_xstore_stats(f->xstore, &st);
    char b[4][24];
    fprintf(stderr,
            "siliceo: host tier: %s of routed experts, %d slots of %s (%s of a host budget of %s, "
            "%s) hold %s (%s reads)\n",
            sil_size_str(e->info.routed_expert_bytes, b[0], 24), st.n_slot,
            sil_size_str(st.slot_bytes, b[1], 24), sil_size_str(e->tier_budget, b[2], 24),
            sil_size_str(e->hp_budget, b[3], 24), e->tier_from,
            e->tier_full ? "all of them, read at open" : "some, the rest is read from the file",
            st.io);
    return 0;
}

static void spec_capture(void *user, const struct sil_ubatch *ub, int32_t l, struct sil_act qkv,
                         struct sil_act alpha, struct sil_act beta);

/* cpu, cuda (an error says why it cannot run) or auto (CUDA when it can hold the model, else
 * the CPU with one line on stderr saying why). */
static int open_backend(struct sil_engine *e, const struct sil_engine_params *p, int n_threads,
                        struct sil_error *err)
{
    const char *name = p->backend ? p->backend : "cpu";
    if (strcmp(name, "cpu") == 0)
        return open_cpu(e, n_threads, p, err);
    if (strcmp(name, "cuda") == 0)
        return open_cuda(e, p, err);
    struct sil_error why = {0};
    if (!p->exact && open_cuda(e, p, &why) == 0)
        return 0;
    fprintf(stderr, "siliceo: backend auto: using the CPU: %s\n",
            p->exact ? "exact mode runs on the CPU backend only" : why.msg);
    if (!p->exact) { /* the host budget holds the backbone and the KV too now */
        const int rc = tier_plan(e, p, true, err);
        if (rc < 0) return rc;
    }
    return open_cpu(e, n_threads, p, err);
}

int sil_engine_open(struct sil_engine **out, const struct sil_engine_params *p, struct sil_error *err)
{
    if (!p || !p->model_path)
        return sil_errorf(err, -EINVAL, "engine: no model path");
    if (p->backend && strcmp(p->backend, "cpu") != 0 && strcmp(p->backend, "auto") != 0 &&
        strcmp(p->backend, "cuda") != 0)
        return sil_errorf(err, -EINVAL, "engine: unknown backend '%s' (cpu, cuda, auto)", p->backend);
    const int kv_type = p->kv_type ? sil_kv_type_from_name(p->kv_type) : SIL_KV_F32;
    if (kv_type < 0)
        return sil_errorf(err, -EINVAL, "engine: unknown KV type '%s' (f16, q8_0, q4_0 or f32)",
                          p->kv_type);
    struct sil_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return sil_errorf(err, -ENOMEM, "engine: out of memory");
    e->guard_slot = -1;
    e->kv_type = (enum sil_kv_type)kv_type;
    int rc = sil_model_load(&e->model, p->model_path, err);
    if (rc < 0) {
        free(e);
        return rc;
    }
    e->info = e->model->info;
    if (p->progress && !p->progress(0.5f, "model mapped and validated", p->progress_user)) {
        rc = sil_errorf(err, -ECANCELED, "%s: load stopped", p->model_path);
        sil_model_free(e->model);
        free(e);
        return rc;
    }
    const struct sil_hparams *hp = &e->model->hp;
    rc = sil_vocab_load(&e->vocab, e->model->gguf, err);
    if (rc < 0) {
        sil_model_free(e->model);
        free(e);
        return rc;
    }
    e->guard_slot =
        sil_mapguard_register(sil_gguf_base(e->model->gguf), sil_gguf_file_size(e->model->gguf));
    if (e->guard_slot < 0) {
        sil_errorf(err, e->guard_slot, "%s: cannot guard the mapping against faults", e->info.path);
        goto fail;
    }
    if (p->progress && !p->progress(0.7f, "vocabulary loaded", p->progress_user)) {
        rc = sil_errorf(err, -ECANCELED, "%s: load stopped", p->model_path);
        goto fail;
    }
    int nt = p->n_threads > 0 ? p->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1)
        nt = 1;
    if (nt > 256)
        nt = 256;
    e->n_ctx = p->n_ctx > 0 ? p->n_ctx : (hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    e->n_seq_max = p->n_seq_max > 0 ? p->n_seq_max : 64;
    e->n_batch_max = p->n_batch_max > 0 ? p->n_batch_max : 512;
    e->n_ubatch = p->n_ubatch > 0 ? p->n_ubatch : 0;
    e->info.n_threads = nt;
    struct sil_fwd *f = &e->f;
    f->model = e->model;
    f->n_ctx = e->n_ctx;
    const bool plan_cpu = !p->backend || strcmp(p->backend, "cpu") == 0 ||
                          (strcmp(p->backend, "auto") == 0 && p->exact);
    /* backend auto: the batch is sized for a tier if either backend's plan has one (the CPU
     * holds more of the budget), and a budget too small for the plan on CUDA, too small on the
     * CPU too, gets the CPU's least, which opens on either */
    bool tier_any = false;
    if (!plan_cpu && strcmp(p->backend, "auto") == 0) {
        struct sil_error ignored = {0};
        tier_any = tier_plan(e, p, true, &ignored) == 0 && e->tier_want;
    }
    if ((rc = tier_plan(e, p, plan_cpu, err)) < 0 && !plan_cpu)
        rc = tier_plan(e, p, true, err);
    if (rc < 0)
        goto fail;
    tier_any = tier_any || e->tier_want;
    if (tier_any && p->n_batch_tier > e->n_batch_max) e->n_batch_max = p->n_batch_tier;
    f->ub_max = e->n_batch_max < UBATCH_MAX ? e->n_batch_max : UBATCH_MAX;
    if ((rc = bind_delta_net(e, err)) < 0)
        goto fail;
    if ((rc = alloc_scratch(e, err)) < 0)
        goto fail;
    if ((rc = open_backend(e, p, nt, err)) < 0)
        goto fail;
    e->info.backend = f->be->ops->name;
    /* host activations: a verification window's cut replays the delta-net cores */
    if (strcmp(f->be->ops->name, "cpu") == 0 && hp->n_layer_recr > 0) {
        f->dn_capture = spec_capture;
        f->dn_capture_user = e;
    }
    plan_say(e);
    if ((rc = open_host_tier(e, p, err)) < 0)
        goto fail;
    if ((rc = open_obs(e, p, err)) < 0)
        goto fail;
    if ((rc = open_observer(e, p, err)) < 0)
        goto fail;
    if ((rc = open_kv(e, p, err)) < 0)
        goto fail;
    if ((rc = sil_ckpt_create(&e->ckpt, e->n_seq_max,
                              (int64_t)hp->n_layer_recr * f->dn_state_floats, err)) < 0)
        goto fail;
    /* the prefix cache's shares of the host budget where it counts them (tier_plan) */
    const uint64_t pc_budget =
        e->hp_want[SIL_HOST_PREFIX] ? e->hp.cache[SIL_HOST_PREFIX] : p->prefix_cache_budget;
    if ((pc_budget || e->hp_want[SIL_HOST_PREFIX]) && sil_kv_block_bytes(f->kv)) {
        const uint64_t nb = pc_budget / sil_kv_block_bytes(f->kv);
        sil_kv_set_cached_max(f->kv, nb > INT32_MAX ? INT32_MAX : (int32_t)nb);
    }
    const uint64_t snap_budget =
        e->hp_want[SIL_HOST_SNAPSHOTS] ? e->hp.cache[SIL_HOST_SNAPSHOTS] : p->prefix_ckpt_budget;
    if ((rc = sil_prefix_create(&e->prefix, f->kv, (int64_t)hp->n_layer_recr * f->dn_state_floats,
                                snap_budget, err)) < 0)
        goto fail;
    if (!(e->prefix_blocks = calloc((size_t)e->n_ctx / SIL_KV_BLOCK + 1, sizeof(int32_t)))) {
        rc = sil_errorf(err, -ENOMEM, "engine: out of memory");
        goto fail;
    }
    if (p->progress && !p->progress(1.0f, "ready", p->progress_user)) {
        rc = sil_errorf(err, -ECANCELED, "%s: load stopped", p->model_path);
        goto fail;
    }
    *out = e;
    return 0;
fail:
    sil_engine_close(e);
    return rc;
}

void sil_engine_close(struct sil_engine *e)
{
    if (!e)
        return;
    sil_prefix_free(e->prefix);
    free(e->prefix_blocks);
    sil_kv_free(e->f.kv);
    sil_kv_free(e->f.mtp_kv);
    sil_ckpt_free(e->ckpt);
    sil_expert_obs_close(e->f.obs);
    e->f.obs = NULL;
    sil_ecache_free(e->f.ecache);
    free(e->f.ecache_res);
    free(e->f.ecache_uses);
    e->f.ecache = NULL;
    close_host_tier(&e->f); /* its pinned blocks go back to the backend before it is freed */
    sil_fwd_close(&e->f);
    if (e->f.be)
        e->f.be->ops->free(e->f.be);
    free_scratch(e);
    free(e->lm_ub);
    sil_vocab_free(e->vocab);
    sil_mapguard_unregister(e->guard_slot);
    sil_model_free(e->model);
    free(e);
}

const struct sil_model_info *sil_engine_info(const struct sil_engine *e)
{
    return &e->info;
}

int sil_engine_device(const struct sil_engine *e, struct sil_engine_device *d)
{
    memset(d, 0, sizeof(*d));
    if (!e->f.be || !e->f.be->ops->device) return -ENODEV;
    e->f.be->ops->device(e->f.be, d);
    return 0;
}

uint64_t sil_engine_device_bytes(const struct sil_engine *e)
{
    struct sil_engine_device d;
    if (sil_engine_device(e, &d) < 0) return 0;
    return d.weight_bytes + d.kv_bytes + d.scratch_bytes;
}

const struct sil_vocab *sil_engine_vocab(const struct sil_engine *e)
{
    return e->vocab;
}

int32_t sil_engine_n_batch_max(const struct sil_engine *e)
{
    return e->n_batch_max;
}

int32_t sil_engine_n_ctx(const struct sil_engine *e)
{
    return e->n_ctx;
}

/* ---- sequences ---------------------------------------------------------------------------- */

int sil_seq_create(struct sil_engine *e, struct sil_error *err)
{
    int s = 0;
    while (s < e->n_seq_max && e->seq_live[s])
        s++;
    if (s == e->n_seq_max)
        return sil_errorf(err, -ENOSPC, "engine: all %d sequences are in use", e->n_seq_max);
    sil_kv_seq_release(e->f.kv, s);
    const int64_t nrs = (int64_t)e->model->hp.n_layer_recr * e->f.dn_state_floats;
    if (nrs > 0 && !e->f.recr_state[s]) {
        e->f.recr_state[s] = calloc((size_t)nrs, sizeof(float));
        if (!e->f.recr_state[s])
            return sil_errorf(err, -ENOMEM, "engine: out of memory for the recurrent state");
    } else if (nrs > 0) {
        memset(e->f.recr_state[s], 0, sizeof(float) * (size_t)nrs);
    }
    sil_ckpt_clear(e->ckpt, s);
    e->spec[s].open = false;
    e->seq_live[s] = true;
    e->seq_len[s] = 0;
    return s;
}

static bool seq_ok(const struct sil_engine *e, int seq)
{
    return seq >= 0 && seq < e->n_seq_max && e->seq_live[seq];
}

/* Sequence seq's verification window closes: a start kept by the backend gives its slot back. */
static void spec_close(struct sil_engine *e, int seq)
{
    struct spec_window *w = &e->spec[seq];
    w->open = false;
    if (w->dev_kept) {
        struct sil_error ignored = {0};
        e->f.be->ops->state_keep(e->f.be, seq, SIL_STATE_DROP, 0, &ignored);
        w->dev_kept = false;
    }
}

void sil_seq_free(struct sil_engine *e, int seq)
{
    if (!seq_ok(e, seq))
        return;
    sil_kv_seq_release(e->f.kv, seq);
    if (e->f.mtp_kv) sil_kv_seq_release(e->f.mtp_kv, seq);
    sil_ckpt_clear(e->ckpt, seq);
    spec_close(e, seq);
    e->seq_live[seq] = false;
    e->seq_len[seq] = 0;
}

int32_t sil_seq_len(const struct sil_engine *e, int seq)
{
    return seq_ok(e, seq) ? e->seq_len[seq] : 0;
}

int sil_seq_truncate(struct sil_engine *e, int seq, int32_t n_pos, struct sil_error *err)
{
    if (!seq_ok(e, seq))
        return sil_errorf(err, -EINVAL, "engine: sequence %d is not live", seq);
    if (n_pos < 0 || n_pos > e->seq_len[seq])
        return sil_errorf(err, -EINVAL, "engine: cannot truncate sequence %d of length %d to %d", seq,
                          e->seq_len[seq], n_pos);
    spec_close(e, seq);
    if (n_pos == e->seq_len[seq])
        return 0;
    if (n_pos == 0) {
        const int64_t nrs = (int64_t)e->model->hp.n_layer_recr * e->f.dn_state_floats;
        if (nrs > 0)
            memset(e->f.recr_state[seq], 0, sizeof(float) * (size_t)nrs);
    } else if (e->model->hp.n_layer_recr > 0) {
        if (sil_ckpt_restore(e->ckpt, seq, n_pos, e->f.recr_state[seq]) < 0)
            return sil_errorf(err, -ENOTSUP,
                              "engine: sequence %d: no recurrent-state checkpoint at position %d",
                              seq, n_pos);
        /* a backend that keeps the state in its own memory gets the restored copy */
        const struct sil_backend *be = e->f.be;
        const int64_t nrs = (int64_t)e->model->hp.n_layer_recr * e->f.dn_state_floats;
        int rc = be->ops->state_write
                     ? be->ops->state_write(e->f.be, seq, e->f.recr_state[seq], nrs, err)
                     : 0;
        if (rc < 0) return rc;
    }
    sil_ckpt_drop_after(e->ckpt, seq, n_pos);
    sil_kv_seq_trim(e->f.kv, seq, n_pos); /* the blocks past the cut go back to the pool */
    e->seq_len[seq] = n_pos;
    return 0;
}

int sil_seq_checkpoint(struct sil_engine *e, int seq, int max_keep, struct sil_error *err)
{
    if (!seq_ok(e, seq))
        return sil_errorf(err, -EINVAL, "engine: sequence %d is not live", seq);
    if (e->model->hp.n_layer_recr == 0 || e->seq_len[seq] == 0)
        return 0;
    if (e->f.be->ops->state_read) {
        const int64_t nrs = (int64_t)e->model->hp.n_layer_recr * e->f.dn_state_floats;
        int rc = e->f.be->ops->state_read(e->f.be, seq, e->f.recr_state[seq], nrs, err);
        if (rc < 0) return rc;
    }
    return sil_ckpt_save(e->ckpt, seq, e->seq_len[seq], e->f.recr_state[seq], max_keep, err);
}

int32_t sil_seq_resume_pos(const struct sil_engine *e, int seq, int32_t n_pos)
{
    if (!seq_ok(e, seq) || n_pos <= 0)
        return 0;
    if (n_pos >= e->seq_len[seq])
        return e->seq_len[seq];
    if (e->model->hp.n_layer_recr == 0)
        return n_pos;
    int32_t at = sil_ckpt_find(e->ckpt, seq, n_pos);
    return at > 0 ? at : 0;
}

int sil_seq_n_checkpoints(const struct sil_engine *e, int seq)
{
    return seq_ok(e, seq) ? sil_ckpt_count(e->ckpt, seq) : 0;
}

/* What window w's capture and replay buffers hold (cap_room sizes them). */
static uint64_t spec_cap_bytes(const struct sil_engine *e, const struct spec_window *w)
{
    if (!w->cap_rows) return 0;
    const struct sil_delta_net_params *p = &e->f.dn[0];
    const uint64_t rows = (uint64_t)w->cap_rows, L = (uint64_t)e->model->hp.n_layer_recr,
                   cd = (uint64_t)sil_delta_net_conv_dim(p), nv = (uint64_t)p->n_v_heads,
                   ov = nv * (uint64_t)p->head_v_dim;
    return sizeof(float) * (rows * L * (cd + 2 * nv) + rows * (2 * cd + 2 * nv + 2 * ov) +
                            (uint64_t)sil_delta_net_head_scratch_floats(p, w->cap_rows));
}

uint64_t sil_seq_memory(const struct sil_engine *e, int seq)
{
    if (!seq_ok(e, seq))
        return 0;
    const struct sil_hparams *hp = &e->model->hp;
    /* a device backend's own KV layout: F32 rows of every attention layer */
    const uint64_t kv = sil_kv_block_bytes(e->f.kv)
                            ? sil_kv_seq_bytes(e->f.kv, e->seq_len[seq])
                            : (uint64_t)e->seq_len[seq] * (uint64_t)hp->n_layer_attn *
                                  (uint64_t)hp->n_head_kv *
                                  (uint64_t)(hp->n_embd_head_k + hp->n_embd_head_v) * sizeof(float);
    return kv +
           (uint64_t)e->model->hp.n_layer_recr * (uint64_t)e->f.dn_state_floats * sizeof(float) +
           sil_ckpt_bytes(e->ckpt, seq) +
           (e->spec[seq].state ? (uint64_t)e->model->hp.n_layer_recr *
                                     (uint64_t)e->f.dn_state_floats * sizeof(float)
                               : 0) +
           (e->f.fork_state[seq] ? (uint64_t)e->model->hp.n_layer_recr *
                                       (uint64_t)e->f.dn_state_floats * sizeof(float)
                                 : 0) +
           spec_cap_bytes(e, &e->spec[seq]);
}

/* ---- speculative verification --------------------------------------------------------------
 *
 * How a rejected suffix is taken back. Attention KV needs nothing: the rows past the cut are
 * dropped (their blocks go back to the pool) and rewritten by whatever comes next. The delta
 * net's recurrent state has no such cut: after a verify pass it has taken in every row. The
 * window keeps the state at its start, and a commit that drops rows restores it and evaluates
 * the kept rows again (without logits). That is exact by two properties the engine already
 * guarantees and tests: a restored state is bit-identical, and the same tokens give the same
 * state and KV whatever their split into batches. It needs no backend op (every backend that
 * can read and write its state takes part) and costs nothing on attention-only models or when
 * every row is kept. The alternative, each verify row leaving a copy of the state it produced
 * inside the delta-net ops, saves the recompute but needs a new contract from every backend's
 * conv1d and delta_net; it is worth it where the recompute measures expensive. */

/* Rows a window captures at most (a chain of the deepest drafts and its last token). */
#define SPEC_CAP_ROWS_MAX 128

/* Room in window w's capture for row r, the buffers grown (their rows kept); false when there
 * is none. */
static bool cap_room(const struct sil_engine *e, struct spec_window *w, int32_t r)
{
    if (r < w->cap_rows) return true;
    if (r >= SPEC_CAP_ROWS_MAX) return false;
    const struct sil_delta_net_params *p = &e->f.dn[0];
    const size_t L = (size_t)e->model->hp.n_layer_recr, cd = (size_t)sil_delta_net_conv_dim(p),
                 nv = (size_t)p->n_v_heads, ov = nv * (size_t)p->head_v_dim;
    size_t rows = w->cap_rows ? (size_t)w->cap_rows : 8;
    while (rows <= (size_t)r)
        rows *= 2;
    const size_t hs = (size_t)sil_delta_net_head_scratch_floats(p, (int32_t)rows);
    float **buf[] = {&w->cq, &w->ca, &w->cb, &w->rq, &w->ra, &w->rb, &w->rconv, &w->rz, &w->rout, &w->rscr};
    const size_t n[] = {rows * L * cd, rows * L * nv, rows * L * nv, rows * cd, rows * nv,
                        rows * nv, rows * cd, rows * ov, rows * ov, hs};
    for (size_t i = 0; i < sizeof(n) / sizeof(n[0]); i++) {
        float *q = realloc(*buf[i], n[i] * sizeof(float));
        if (!q) return false; /* those grown so far are kept: a later call grows the rest */
        *buf[i] = q;
    }
    memset(w->rz, 0, rows * ov * sizeof(float)); /* the gate's input: the outputs are dropped */
    w->cap_rows = (int32_t)rows;
    return true;
}

/* f->dn_capture (host backends): the delta-net cores' inputs of rows in open verification
 * windows, by their place in the window. A tree's rows, a row out of order at the last
 * recurrent layer or no room stops the window's capture (its cut then evaluates again). */
static void spec_capture(void *user, const struct sil_ubatch *ub, int32_t l, struct sil_act qkv,
                         struct sil_act alpha, struct sil_act beta)
{
    struct sil_engine *e = user;
    const struct sil_delta_net_params *p = &e->f.dn[0];
    const int64_t L = e->model->hp.n_layer_recr, cd = sil_delta_net_conv_dim(p),
                  nv = p->n_v_heads;
    for (int32_t i = 0; i < ub->n; i++) {
        struct spec_window *w = &e->spec[ub->seq[i]];
        if (!w->open || !w->cap_ok) continue;
        const int32_t r = ub->pos[i] - w->pos;
        if (e->tree_batch || r < 0 || !cap_room(e, w, r) || (l == L - 1 && r != w->cap_n)) {
            w->cap_ok = false;
            continue;
        }
        const int64_t at = (int64_t)r * L + l;
        memcpy(w->cq + at * cd, (const float *)qkv.data + i * qkv.ld, sizeof(float) * (size_t)cd);
        memcpy(w->ca + at * nv, (const float *)alpha.data + i * alpha.ld, sizeof(float) * (size_t)nv);
        memcpy(w->cb + at * nv, (const float *)beta.data + i * beta.ld, sizeof(float) * (size_t)nv);
        if (l == L - 1) w->cap_n++;
    }
}

/* The window's first n rows' delta-net cores run again from the state at its start (restored
 * by the caller) on their captured inputs: the recurrent state at the cut, as evaluating those
 * rows again would leave it (the cores give the same bits however the rows are split), without
 * their projections, attention and experts. */
static void spec_replay(struct sil_engine *e, int seq, struct spec_window *w, int32_t n)
{
    const struct sil_fwd *f = &e->f;
    const int64_t L = e->model->hp.n_layer_recr;
    for (int64_t l = 0; l < L; l++) {
        const struct sil_delta_net_params *p = &f->dn[l];
        const int64_t cd = sil_delta_net_conv_dim(p), nv = p->n_v_heads;
        for (int32_t r = 0; r < n; r++) {
            const int64_t at = (int64_t)r * L + l;
            memcpy(w->rq + r * cd, w->cq + at * cd, sizeof(float) * (size_t)cd);
            memcpy(w->ra + r * nv, w->ca + at * nv, sizeof(float) * (size_t)nv);
            memcpy(w->rb + r * nv, w->cb + at * nv, sizeof(float) * (size_t)nv);
        }
        struct sil_delta_net_state st;
        sil_delta_net_state_bind(p, &st, f->recr_state[seq] + l * f->dn_state_floats);
        sil_delta_net_conv(p, &st, n, w->rq, w->rconv, 0, cd);
        sil_delta_net_heads(p, &st, n, w->rconv, w->rz, w->ra, w->rb, w->rout, 0, p->n_v_heads,
                            w->rscr);
    }
}

int sil_seq_spec_begin(struct sil_engine *e, int seq, struct sil_error *err)
{
    if (!seq_ok(e, seq))
        return sil_errorf(err, -EINVAL, "engine: sequence %d is not live", seq);
    struct spec_window *w = &e->spec[seq];
    const int64_t nrs = (int64_t)e->model->hp.n_layer_recr * e->f.dn_state_floats;
    if (!w->tok && !(w->tok = malloc(sizeof(int32_t) * (size_t)e->n_batch_max)))
        return sil_errorf(err, -ENOMEM, "engine: out of memory for a verification window");
    if (!e->spec_pos_rows) {
        e->spec_pos_rows = malloc(sizeof(int32_t) * (size_t)e->n_batch_max);
        e->spec_seq_rows = malloc(sizeof(int32_t) * (size_t)e->n_batch_max);
        e->spec_want_rows = calloc((size_t)e->n_batch_max, sizeof(bool));
        if (!e->spec_pos_rows || !e->spec_seq_rows || !e->spec_want_rows) {
            free(e->spec_pos_rows);
            free(e->spec_seq_rows);
            free(e->spec_want_rows);
            e->spec_pos_rows = e->spec_seq_rows = NULL;
            e->spec_want_rows = NULL;
            return sil_errorf(err, -ENOMEM, "engine: out of memory for a verification window");
        }
    }
    /* the state at the start: kept by the backend where it can (no copy over the bus), else
     * here */
    struct sil_error kept_err = {0};
    w->dev_kept = nrs > 0 && e->f.be->ops->state_keep &&
                  e->f.be->ops->state_keep(e->f.be, seq, SIL_STATE_KEEP, e->seq_len[seq],
                                           &kept_err) == 0;
    if (nrs > 0 && !w->dev_kept) {
        if (!w->state && !(w->state = malloc(sizeof(float) * (size_t)nrs)))
            return sil_errorf(err, -ENOMEM, "engine: out of memory for a verification window");
        /* straight from the device where the state lives there, else the host's copy */
        if (e->f.be->ops->state_read) {
            int rc = e->f.be->ops->state_read(e->f.be, seq, w->state, nrs, err);
            if (rc < 0) return rc;
        } else {
            memcpy(w->state, e->f.recr_state[seq], sizeof(float) * (size_t)nrs);
        }
    }
    w->open = true;
    w->tree = false;
    w->pos = e->seq_len[seq];
    w->cap_ok = e->f.dn_capture != NULL;
    w->cap_n = 0;
    return 0;
}

static int spec_cut(struct sil_engine *e, int seq, int32_t n_pos, struct sil_error *err);

int sil_seq_spec_commit(struct sil_engine *e, int seq, int32_t n_pos, struct sil_error *err)
{
    if (!seq_ok(e, seq))
        return sil_errorf(err, -EINVAL, "engine: sequence %d is not live", seq);
    struct spec_window *w = &e->spec[seq];
    if (!w->open)
        return sil_errorf(err, -EINVAL, "engine: sequence %d has no verification window", seq);
    if (n_pos < w->pos || n_pos > e->seq_len[seq])
        return sil_errorf(err, -EINVAL,
                          "engine: sequence %d: cannot keep %d positions of a window [%d, %d)",
                          seq, n_pos, w->pos, e->seq_len[seq]);
    if (n_pos == e->seq_len[seq]) {
        spec_close(e, seq);
        return 0;
    }
    w->open = false;
    return spec_cut(e, seq, n_pos, err);
}

/* The window's rows w->tok[0, n_pos - w->pos) kept at [w->pos, n_pos), the rest dropped: the
 * KV rows are in place (attention-only) or the kept rows are evaluated again from the state at
 * the window's start (recurrent layers). */
static int spec_cut(struct sil_engine *e, int seq, int32_t n_pos, struct sil_error *err)
{
    struct spec_window *w = &e->spec[seq];
    sil_ckpt_drop_after(e->ckpt, seq, n_pos);
    const int64_t nrs = (int64_t)e->model->hp.n_layer_recr * e->f.dn_state_floats;
    if (nrs == 0) {
        sil_kv_seq_trim(e->f.kv, seq, n_pos); /* the blocks past the cut go back to the pool */
        e->seq_len[seq] = n_pos;
        return 0;
    }
    const int32_t n = n_pos - w->pos;
    if (w->dev_kept) {
        /* the backend puts its kept start back, and where it captured the kept rows' delta-net
         * inputs runs their cores again: the state at the cut, the KV rows kept in place */
        int rc = e->f.be->ops->state_keep(e->f.be, seq, SIL_STATE_BACK, n, err);
        spec_close(e, seq);
        if (rc < 0) return rc;
        if (rc == 1) {
            sil_kv_seq_trim(e->f.kv, seq, n_pos);
            e->seq_len[seq] = n_pos;
            return 0;
        }
    } else {
        /* back to the window's start, then the kept rows again (see above) */
        memcpy(e->f.recr_state[seq], w->state, sizeof(float) * (size_t)nrs);
        if (!w->tree && w->cap_ok && n <= w->cap_n) {
            /* their inputs were captured: only the cores again, the KV rows kept in place */
            spec_replay(e, seq, w, n);
            sil_kv_seq_trim(e->f.kv, seq, n_pos);
            e->seq_len[seq] = n_pos;
            return 0;
        }
        if (e->f.be->ops->state_write) {
            int rc = e->f.be->ops->state_write(e->f.be, seq, w->state, nrs, err);
            if (rc < 0) return rc;
        }
    }
    sil_kv_seq_trim(e->f.kv, seq, w->pos);
    e->seq_len[seq] = w->pos;
    if (n == 0)
        return 0;
    for (int32_t i = 0; i < n; i++) {
        e->spec_pos_rows[i] = w->pos + i;
        e->spec_seq_rows[i] = seq;
    }
    const struct sil_batch b = {n, w->tok, e->spec_pos_rows, e->spec_seq_rows, e->spec_want_rows};
    return sil_engine_eval_out(e, &b, NULL, NULL, NULL, err);
}

int sil_seq_spec_commit_path(struct sil_engine *e, int seq, const int32_t *keep, int32_t n,
                             struct sil_error *err)
{
    if (!seq_ok(e, seq))
        return sil_errorf(err, -EINVAL, "engine: sequence %d is not live", seq);
    struct spec_window *w = &e->spec[seq];
    if (!w->open)
        return sil_errorf(err, -EINVAL, "engine: sequence %d has no verification window", seq);
    const int32_t len = e->seq_len[seq] - w->pos;
    for (int32_t k = 0; k < n; k++)
        if (!keep || keep[k] < k || keep[k] >= len || (k > 0 && keep[k] <= keep[k - 1]))
            return sil_errorf(err, -EINVAL,
                              "engine: sequence %d: the rows to keep must rise within the "
                              "window's %d",
                              seq, len);
    if (n < 0)
        return sil_errorf(err, -EINVAL, "engine: sequence %d: %d rows to keep", seq, n);
    int32_t k0 = 0; /* the rows already in place */
    while (k0 < n && keep[k0] == k0)
        k0++;
    if (k0 == n) return sil_seq_spec_commit(e, seq, w->pos + n, err);
    w->open = false;
    const bool recr = e->model->hp.n_layer_recr > 0;
    for (int32_t k = k0; k < n; k++) {
        w->tok[k] = w->tok[keep[k]];
        /* keep[k] > k: the node's KV row to its place on the path (its rope already is) */
        if (!recr) sil_kv_seq_move(e->f.kv, seq, w->pos + k, w->pos + keep[k]);
    }
    if (!recr) {
        sil_ckpt_drop_after(e->ckpt, seq, w->pos + n);
        sil_kv_seq_trim(e->f.kv, seq, w->pos + n);
        e->seq_len[seq] = w->pos + n;
        return 0;
    }
    return spec_cut(e, seq, w->pos + n, err);
}

/* ---- prefix cache ------------------------------------------------------------------------- */

bool sil_engine_recurrent(const struct sil_engine *e)
{
    return e->model->hp.n_layer_recr > 0;
}

/* KV blocks can be shared between sequences where the host holds their rows, or where a
 * device (which reads them through the engine's block tables) copies a block on write. */
bool sil_engine_prefix_shares(const struct sil_engine *e)
{
    return e->prefix && (sil_kv_block_bytes(e->f.kv) > 0 ||
                         (e->f.be->ops->kv_copy && e->model->hp.n_layer_attn > 0));
}

/* The longest prefix of tokens[0, n) that can be reused: whole blocks, the last token left. */
static void prefix_match(struct sil_engine *e, uint64_t scope, const int32_t *tokens, int32_t n,
                         struct sil_prefix_match *m)
{
    int32_t max_blocks = (n - 1) / SIL_KV_BLOCK; /* the last token is evaluated for its logits */
    if (max_blocks > e->n_ctx / SIL_KV_BLOCK) max_blocks = e->n_ctx / SIL_KV_BLOCK;
    sil_prefix_match(e->prefix, scope, tokens, max_blocks, e->prefix_blocks, m);
}

int32_t sil_seq_prefix_peek(struct sil_engine *e, uint64_t scope, const int32_t *tokens, int32_t n)
{
    if (!sil_engine_prefix_shares(e) || n < 2) return 0;
    struct sil_prefix_match m;
    prefix_match(e, scope, tokens, n, &m);
    return m.n_usable * SIL_KV_BLOCK;
}

int sil_seq_prefix_reuse(struct sil_engine *e, int seq, uint64_t scope, const int32_t *tokens,
                         int32_t n, int32_t *n_reused, struct sil_error *err)
{
    *n_reused = 0;
    if (!seq_ok(e, seq) || e->seq_len[seq] != 0)
        return sil_errorf(err, -EINVAL, "engine: prefix reuse needs a fresh sequence (%d)", seq);
    if (!sil_engine_prefix_shares(e) || n < 2) return 0;
    struct sil_prefix_match m;
    prefix_match(e, scope, tokens, n, &m);
    if (m.n_usable == 0) {
        e->prefix_misses++;
        return 0;
    }
    for (int32_t i = 0; i < m.n_usable; i++) {
        int rc = sil_kv_seq_attach(e->f.kv, seq, e->prefix_blocks[i], err);
        if (rc < 0) {
            sil_kv_seq_release(e->f.kv, seq);
            return rc;
        }
    }
    if (m.state) {
        const int64_t nrs = (int64_t)e->model->hp.n_layer_recr * e->f.dn_state_floats;
        memcpy(e->f.recr_state[seq], m.state, sizeof(float) * (size_t)nrs);
        const struct sil_backend *be = e->f.be;
        int rc = be->ops->state_write ? be->ops->state_write(e->f.be, seq, m.state, nrs, err) : 0;
        if (rc < 0) {
            memset(e->f.recr_state[seq], 0, sizeof(float) * (size_t)nrs);
            sil_kv_seq_release(e->f.kv, seq);
            return rc;
        }
    }
    e->seq_len[seq] = m.n_usable * SIL_KV_BLOCK;
    e->prefix_hits++;
    e->prefix_tokens += (uint64_t)e->seq_len[seq];
    *n_reused = e->seq_len[seq];
    return 0;
}

int sil_seq_prefix_publish(struct sil_engine *e, int seq, uint64_t scope, const int32_t *tokens,
                           int32_t n, bool snapshot, struct sil_error *err)
{
    if (!seq_ok(e, seq) || n < 0 || n > e->seq_len[seq])
        return sil_errorf(err, -EINVAL, "engine: cannot publish %d tokens of sequence %d", n, seq);
    if (!sil_engine_prefix_shares(e)) return 0;
    const int32_t full = sil_prefix_publish(e->prefix, seq, scope, tokens, n);
    if (!snapshot || !sil_engine_recurrent(e) || full == 0 || n != e->seq_len[seq] ||
        n % SIL_KV_BLOCK)
        return 0;
    if (e->f.be->ops->state_read) {
        const int64_t nrs = (int64_t)e->model->hp.n_layer_recr * e->f.dn_state_floats;
        int rc = e->f.be->ops->state_read(e->f.be, seq, e->f.recr_state[seq], nrs, err);
        if (rc < 0) return rc;
    }
    return sil_prefix_snapshot(e->prefix, scope, tokens, full, e->f.recr_state[seq], err);
}

void sil_engine_prefix_stats(struct sil_engine *e, struct sil_prefix_stats *out)
{
    struct sil_prefix_info pi = {0};
    if (e->prefix) sil_prefix_info(e->prefix, &pi);
    out->hits = e->prefix_hits;
    out->misses = e->prefix_misses;
    out->tokens_reused = e->prefix_tokens;
    out->n_blocks = pi.n_blocks;
    const uint64_t bb = sil_kv_block_bytes(e->f.kv); /* 0: a device holds the rows */
    out->cached_bytes = (uint64_t)pi.n_cached * (bb > 0 ? bb : dev_kv_block_bytes(e));
    out->n_snapshots = pi.n_snapshots;
    out->snapshot_bytes = pi.snapshot_bytes;
}

void sil_engine_kv_info(const struct sil_engine *e, struct sil_kv_info *out)
{
    const struct sil_kv_cache *kv = e->f.kv;
    out->type = sil_kv_type_name(sil_kv_type(kv));
    out->bytes_per_pos = sil_kv_block_bytes(kv) / SIL_KV_BLOCK;
    out->block_positions = SIL_KV_BLOCK;
    out->n_blocks = sil_kv_n_blocks(kv);
    out->n_free = sil_kv_n_free(kv);
}

/* ---- evaluation --------------------------------------------------------------------------- */

/* Marks the rows of sequence seq (or every row, seq < 0) as failed with rc. */
static void fail_rows(const struct sil_batch *b, int *st, int32_t seq, int rc)
{
    if (!st) return;
    for (int32_t i = 0; i < b->n; i++)
        if (seq < 0 || b->seq[i] == seq) st[i] = rc;
}

static int damaged_error(struct sil_engine *e, const struct sil_batch *b, int *st,
                         struct sil_error *err)
{
    atomic_store(&e->damaged, true);
    fail_rows(b, st, -1, -EIO);
    size_t off = 0;
    if (sil_mapguard_faults(e->guard_slot, &off) > 0)
        return sil_errorf(
            err, -EIO,
            "%s: the model file changed while in use (a read of the mapping at offset %zu "
            "faulted: the file was truncated or rewritten)",
            e->info.path, off);
    return sil_errorf(err, -EIO, "%s: the model file changed while in use (it was written to)",
                      e->info.path);
}

void sil_engine_set_eval_progress(struct sil_engine *e, void (*fn)(void *user), void *user)
{
    e->eval_progress = fn;
    e->eval_progress_user = user;
}

void sil_engine_mark_damaged(struct sil_engine *e)
{
    atomic_store(&e->damaged, true);
}

bool sil_engine_damaged(const struct sil_engine *e)
{
    return atomic_load(&e->damaged);
}

/* The forward passes, one micro-batch at a time. Runs under the engine thread's guard point:
 * a fault in serial code jumps back to sil_engine_eval, one in the pool's tasks is recorded by
 * the pool (threadpool.h) and seen here after the micro-batch. */
static struct sil_ubatch make_ubatch(struct sil_engine *e, int32_t r0, int32_t n,
                                      int32_t *run_start, uint8_t head_out)
{
    struct sil_ubatch ub;
    ub.n = n;
    ub.token = e->p_token + r0;
    ub.pos = e->p_pos + r0;
    ub.seq = e->p_seq + r0;
    ub.out_row = e->p_out + r0;
    ub.tree = e->tree_batch ? e->p_tree + r0 : NULL;
    ub.n_runs = 0;
    for (int32_t i = 0; i < ub.n; i++)
        if (i == 0 || ub.seq[i] != ub.seq[i - 1]) run_start[ub.n_runs++] = i;
    run_start[ub.n_runs] = ub.n;
    ub.run_start = run_start;
    ub.kv = e->f.kv;
    ub.head_out = head_out;
    ub.layered = 0;
    return ub;
}

/* After a pass: 0, or its error (1: the model is damaged by a fault on the mapping). */
static int after_pass(struct sil_engine *e, struct sil_error *err)
{
    const struct sil_engine_observer *o = e->observer;
    if (o && o->on_pass_end) {
        const int rc = o->on_pass_end(o->user, err);
        if (rc < 0) return rc;
    }
    if (e->f.xs_err) { /* a read of the file failed: as a fault on the mapping, for good */
        atomic_store(&e->damaged, true);
        return sil_errorf(err, -EIO, "%s", e->f.xs_msg);
    }
    /* A backend error: the model is damaged when the mapping faulted, else the ops failed
     * (a device error) and the error is the backend's. */
    int rc = e->f.be->ops->status ? e->f.be->ops->status(e->f.be, err) : 0;
    if (rc < 0) return sil_mapguard_faults(e->guard_slot, NULL) > 0 ? 1 : rc;
    if (e->eval_progress) e->eval_progress(e->eval_progress_user);
    return 0;
}

static void pass_begin(struct sil_engine *e, int32_t n_rows)
{
    const struct sil_engine_observer *o = e->observer;
    if (o && o->on_pass_begin) o->on_pass_begin(o->user, n_rows);
}

static int run_ubatches(struct sil_engine *e, int32_t n, float *logits, int32_t *argmax,
                        struct sil_error *err)
{
    /* a batch of one row a sequence (rows grouped by sequence: no two neighbours share one)
     * goes in micro-batches the backend's decode path takes, when it has a limit */
    const int32_t dmax = e->f.be->ops->decode_rows_max ? e->f.be->ops->decode_rows_max(e->f.be) : 0;
    bool decode_only = dmax > 0 && n > dmax;
    for (int32_t i = 1; decode_only && i < n; i++)
        decode_only = e->p_seq[i] != e->p_seq[i - 1];
    const int32_t step = decode_only && dmax < e->f.ub_max ? dmax : e->f.ub_max;
    const uint8_t head_out = (uint8_t)((logits ? SIL_HEAD_LOGITS : 0) | (argmax ? SIL_HEAD_ARGMAX : 0));
    /* several micro-batches with the host tier: layer by layer (each layer's experts read once
     * for all of them), up to n_lm micro-batches a pass */
    const bool by_layer = e->f.n_lm > 0 && n > step;
    for (int32_t r0 = 0; r0 < n;) {
        if (atomic_load(&e->damaged)) return 1;
        const int32_t r_pass = r0;
        if (by_layer) {
            int k = 0;
            for (; k < e->f.n_lm && r0 < n; k++) {
                const int32_t len = n - r0 < step ? n - r0 : step;
                e->lm_ub[k] = make_ubatch(e, r0, len, e->run_start + r0 + k, head_out);
                r0 += len;
            }
            for (int j = 0; j < k; j++)
                e->lm_ub[j].layered = k > 1;
            pass_begin(e, r0 - r_pass);
            sil_forward_layers(&e->f, e->lm_ub, k, logits, argmax);
        } else {
            const int32_t len = n - r0 < step ? n - r0 : step;
            struct sil_ubatch ub = make_ubatch(e, r0, len, e->run_start, head_out);
            r0 += len;
            pass_begin(e, len);
            sil_forward(&e->f, &ub, logits, argmax);
        }
        const int rc = after_pass(e, err);
        if (rc) return rc;
    }
    return atomic_load(&e->damaged) ? 1 : 0;
}

/* The copies on write the KV cache decided, made by a device that holds the rows. */
static int kv_device_copies(struct sil_engine *e, struct sil_error *err)
{
    int32_t src[16], dst[16], n;
    while ((n = sil_kv_take_copies(e->f.kv, src, dst, 16)) > 0)
        for (int32_t i = 0; i < n; i++) {
            if (!e->f.be->ops->kv_copy)
                return sil_errorf(err, -ENOTSUP, "engine: a shared KV block written on a device "
                                                 "that cannot copy blocks");
            int rc = e->f.be->ops->kv_copy(e->f.be, dst[i], src[i], err);
            if (rc < 0) return rc;
        }
    return 0;
}

bool sil_engine_has_tree(const struct sil_engine *e)
{
    return strcmp(e->info.backend, "cpu") == 0;
}

static int tree_entry(struct sil_engine *e, const struct sil_batch *b, const int32_t *parent,
                      int32_t i, struct sil_error *err);

/* Row i of a batch with parents (its position checked): its tree entry in b_tree. A root or a
 * row outside a tree (parent -1) sees every position before it; inside its sequence's open
 * window, as bits from the window's start so children can inherit them. A child sees its
 * parent's positions and its own, at rope position parent's + 1. With recurrent layers a row
 * whose parent is not its sequence's row before it starts a branch, from the state after that
 * parent (struct sil_tree_row.fork): one such branch point a sequence, else -ENOTSUP. */
static int tree_row(struct sil_engine *e, const struct sil_batch *b, const int32_t *parent,
                    int32_t i, struct sil_error *err)
{
    int rc = tree_entry(e, b, parent, i, err);
    if (rc < 0 || e->model->hp.n_layer_recr == 0) return rc;
    const int32_t s = b->seq[i], j = parent[i];
    if (j >= 0 && j != e->tree_prev[s]) {
        if (e->tree_fork[s] >= 0 && e->tree_fork[s] != j)
            return sil_errorf(err, -ENOTSUP,
                              "engine: batch row %d: a model with recurrent layers takes trees "
                              "that branch at one node (rows %d and %d branch)",
                              i, e->tree_fork[s], j);
        e->tree_fork[s] = j;
        e->b_tree[j].fork |= SIL_TREE_SAVE;
        e->b_tree[i].fork |= SIL_TREE_RESTORE;
    }
    e->tree_prev[s] = i;
    return 0;
}

static int tree_entry(struct sil_engine *e, const struct sil_batch *b, const int32_t *parent,
                      int32_t i, struct sil_error *err)
{
    const int32_t s = b->seq[i], pos = b->pos[i], j = parent[i];
    const struct spec_window *w = &e->spec[s];
    const int32_t d = w->open ? pos - w->pos : -1;
    if (j < 0) {
        if (w->open && w->tree)
            return sil_errorf(err, -EINVAL,
                              "engine: batch row %d: sequence %d's window holds a token tree", i,
                              s);
        e->b_tree[i] = d >= 0 && d < 64
                           ? (struct sil_tree_row){pos, w->pos, (d == 63 ? 0 : (1ull << (d + 1))) - 1, 0}
                           : (struct sil_tree_row){pos, pos + 1, 0, 0};
        return 0;
    }
    if (j >= i || b->seq[j] != s)
        return sil_errorf(err, -EINVAL,
                          "engine: batch row %d: parent %d is not an earlier row of sequence %d", i,
                          j, s);
    if (d < 0 || d >= 64 || e->b_tree[j].lo != w->pos)
        return sil_errorf(err, -EINVAL,
                          "engine: batch row %d: a token tree's node must lie in the first 64 "
                          "positions of its sequence's verification window",
                          i);
    e->b_tree[i] = (struct sil_tree_row){e->b_tree[j].rope_pos + 1, w->pos,
                                         e->b_tree[j].mask | 1ull << d, 0};
    return 0;
}

int sil_engine_eval(struct sil_engine *e, const struct sil_batch *b, float *logits, struct sil_error *err)
{
    return sil_engine_eval_rows(e, b, logits, NULL, err);
}

int sil_engine_eval_rows(struct sil_engine *e, const struct sil_batch *b, float *logits, int *st,
                         struct sil_error *err)
{
    return sil_engine_eval_out(e, b, logits, NULL, st, err);
}

static int eval_batch(struct sil_engine *e, const struct sil_batch *b, const int32_t *parent,
                      float *logits, int32_t *argmax, int *st, struct sil_error *err);

int sil_engine_eval_out(struct sil_engine *e, const struct sil_batch *b, float *logits,
                        int32_t *argmax, int *st, struct sil_error *err)
{
    return eval_batch(e, b, NULL, logits, argmax, st, err);
}

int sil_engine_eval_tree(struct sil_engine *e, const struct sil_batch *b, const int32_t *parent,
                         float *logits, int32_t *argmax, struct sil_error *err)
{
    if (!parent) return sil_errorf(err, -EINVAL, "engine: a token tree without parents");
    return eval_batch(e, b, parent, logits, argmax, NULL, err);
}

static int eval_batch(struct sil_engine *e, const struct sil_batch *b, const int32_t *parent,
                      float *logits, int32_t *argmax, int *st, struct sil_error *err)
{
    if (!b || b->n < 0 || b->n > e->n_batch_max) {
        if (b && b->n > 0 && b->token && b->seq) fail_rows(b, st, -1, -EINVAL);
        return sil_errorf(err, -EINVAL, "engine: batch of %d rows (max %d)", b ? b->n : -1, e->n_batch_max);
    }
    if (b->n == 0)
        return 0;
    if (!b->token || !b->pos || !b->seq)
        return sil_errorf(err, -EINVAL, "engine: batch without token, pos or seq arrays");
    if (st) memset(st, 0, sizeof(int) * (size_t)b->n);
    if (atomic_load(&e->damaged)) return damaged_error(e, b, st, err);
    const int32_t n = b->n, V = e->model->hp.n_vocab;
    e->tree_batch = false;
    if (parent)
        for (int32_t i = 0; i < n; i++)
            e->tree_batch = e->tree_batch || parent[i] >= 0;
    if (e->tree_batch && !sil_engine_has_tree(e)) {
        fail_rows(b, st, -1, -ENOTSUP);
        return sil_errorf(err, -ENOTSUP, "engine: token trees need the CPU backend (%s on %s)",
                          e->info.arch_name, e->info.backend);
    }
    for (int s = 0; e->tree_batch && s < e->n_seq_max; s++)
        e->tree_prev[s] = e->tree_fork[s] = -1;
    /* Validate everything before touching any state: an error leaves sequences unchanged. */
    for (int s = 0; s < e->n_seq_max; s++)
        e->next_pos[s] = e->seq_len[s];
    memset(e->seq_count, 0, sizeof(int32_t) * (size_t)(e->n_seq_max + 1));
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = b->seq[i];
        int rc = 0;
        if (!seq_ok(e, s))
            rc = sil_errorf(err, -EINVAL, "engine: batch row %d: sequence %d is not live", i, s);
        else if (b->token[i] < 0 || b->token[i] >= V)
            rc = sil_errorf(err, -EINVAL, "engine: batch row %d: token %d outside [0, %d)", i,
                            b->token[i], V);
        else if (b->pos[i] != e->next_pos[s])
            rc = sil_errorf(err, -EINVAL,
                            "engine: batch row %d: position %d, sequence %d expects %d", i,
                            b->pos[i], s, e->next_pos[s]);
        else if (b->pos[i] >= e->n_ctx)
            rc = sil_errorf(err, -ENOSPC,
                            "engine: batch row %d: position %d beyond the context (%d)", i,
                            b->pos[i], e->n_ctx);
        else if (e->spec[s].open && b->pos[i] - e->spec[s].pos >= e->n_batch_max)
            rc = sil_errorf(err, -E2BIG,
                            "engine: batch row %d: sequence %d's verification window is full "
                            "(%d rows)",
                            i, s, e->n_batch_max);
        if (rc == 0 && parent) rc = tree_row(e, b, parent, i, err);
        else if (rc == 0 && e->spec[s].open && e->spec[s].tree)
            rc = sil_errorf(err, -EINVAL,
                            "engine: batch row %d: sequence %d's window holds a token tree", i, s);
        if (rc < 0) {
            fail_rows(b, st, s, rc);
            return rc;
        }
        e->next_pos[s]++;
        e->seq_count[s]++;
    }
    /* a tree that forks a recurrent state: room for the state at its branch point */
    const int64_t nrs = (int64_t)e->model->hp.n_layer_recr * e->f.dn_state_floats;
    for (int s = 0; e->tree_batch && nrs > 0 && s < e->n_seq_max; s++)
        if (e->tree_fork[s] >= 0 && !e->f.fork_state[s] &&
            !(e->f.fork_state[s] = malloc(sizeof(float) * (size_t)nrs))) {
            fail_rows(b, st, s, -ENOMEM);
            return sil_errorf(err, -ENOMEM, "engine: out of memory for a token tree's state");
        }
    /* Rows grouped by sequence (stable), with the logits row each one writes. */
    e->seq_off[0] = 0;
    for (int s = 0; s < e->n_seq_max; s++)
        e->seq_off[s + 1] = e->seq_off[s] + e->seq_count[s];
    int32_t n_out = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = b->seq[i];
        bool want = b->want_logits ? b->want_logits[i] : b->pos[i] == e->next_pos[s] - 1;
        int32_t at = e->seq_off[s]++;
        e->p_token[at] = b->token[i];
        e->p_pos[at] = b->pos[i];
        e->p_seq[at] = s;
        e->p_out[at] = want ? n_out++ : -1;
        if (e->tree_batch) e->p_tree[at] = e->b_tree[i];
    }
    if (n_out > 0 && !logits && !argmax) {
        fail_rows(b, st, -1, -EINVAL);
        return sil_errorf(err, -EINVAL,
                          "engine: %d rows want logits but no logits or argmax buffer was given",
                          n_out);
    }

    /* KV blocks for the new positions; running out fails that sequence and undoes the rest. */
    for (int s = 0; s < e->n_seq_max; s++) {
        if (e->next_pos[s] == e->seq_len[s]) continue;
        int rc = sil_kv_seq_reserve(e->f.kv, s, e->next_pos[s], err);
        if (rc == 0) rc = kv_device_copies(e, err);
        if (rc < 0) { /* s too: its reserve may have succeeded before its copy failed */
            for (int r = 0; r <= s; r++)
                sil_kv_seq_trim(e->f.kv, r, e->seq_len[r]);
            fail_rows(b, st, s, rc);
            return rc;
        }
    }

    /* A truncated model file faults on its next read (SIGBUS): caught here on this thread, and in
     * the pool's threads by the pool, so the evaluation fails instead of the process. */
    struct sil_mapguard_point pt;
    sil_mapguard_push(&pt);
    if (sigsetjmp(pt.jb, 0)) return damaged_error(e, b, st, err);
    const int rc = run_ubatches(e, n, logits, argmax, err);
    sil_mapguard_pop(&pt);
    if (rc > 0) return damaged_error(e, b, st, err);
    if (rc < 0) {
        for (int s = 0; s < e->n_seq_max; s++)
            sil_kv_seq_trim(e->f.kv, s, e->seq_len[s]);
        fail_rows(b, st, -1, rc);
        return rc;
    }
    for (int s = 0; s < e->n_seq_max; s++) {
        /* an open verification window keeps its rows' tokens (rows grouped by sequence: s's
         * end at seq_off[s]) */
        struct spec_window *w = &e->spec[s];
        if (w->open && e->seq_count[s] > 0) {
            /* a row that does not see every position of the window before it is a tree's */
            for (int32_t r = e->seq_off[s] - e->seq_count[s]; e->tree_batch && r < e->seq_off[s];
                 r++) {
                const int32_t d = e->p_pos[r] - w->pos;
                const uint64_t all = d >= 63 ? ~0ull : (1ull << (d + 1)) - 1;
                w->tree = w->tree || (e->p_tree[r].lo == w->pos && e->p_tree[r].mask != all);
            }
            memcpy(w->tok + (e->seq_len[s] - w->pos),
                   e->p_token + e->seq_off[s] - e->seq_count[s],
                   sizeof(int32_t) * (size_t)e->seq_count[s]);
        }
        e->seq_len[s] = e->next_pos[s];
    }
    return 0;
}

void sil_engine_stats(const struct sil_engine *e, struct sil_engine_stats *out)
{
    out->n_ubatch = e->f.n_ubatch;
    out->n_rows = e->f.n_rows;
    out->n_layered = e->f.n_layered;
    out->moe_plans = e->f.moe_plans;
    out->moe_experts = e->f.moe_experts;
    out->moe_pairs = e->f.moe_pairs;
    out->expert_bytes = e->f.expert_bytes;
    struct sil_ecache_stats s;
    sil_expert_obs_stats(e->f.obs, &s);
    if (e->f.ecache) /* the device's slots, not a simulation */
        sil_ecache_stats(e->f.ecache, -1, &s);
    out->ecache_hits = s.hits;
    out->ecache_misses = s.misses;
    out->ecache_evictions = s.evictions;
    out->ecache_bytes_streamed = s.bytes_streamed;
}

uint64_t sil_engine_heat_model_id(const struct sil_engine *e)
{
    return sil_heat_model_id(e->model);
}

int sil_engine_heat_file_name(const struct sil_engine *e, char *out, size_t size)
{
    return sil_heat_file_name(e->model, out, size);
}

int sil_engine_heat_export(const struct sil_engine *e, struct sil_heat_map *out,
                           struct sil_error *err)
{
    memset(out, 0, sizeof(*out));
    const struct sil_hparams *hp = &e->model->hp;
    if (!e->f.obs || hp->n_expert <= 0) return sil_errorf(err, -ENODEV, "engine: no heat map kept");
    float *heat = malloc((size_t)hp->n_layer * (size_t)hp->n_expert * sizeof(float));
    if (!heat) return sil_errorf(err, -ENOMEM, "engine: out of memory for the heat map");
    if (!sil_expert_obs_heat_export(e->f.obs, heat)) {
        free(heat);
        return sil_errorf(err, -ENODEV, "engine: no heat map kept");
    }
    out->n_layer = (uint32_t)hp->n_layer;
    out->n_expert = (uint32_t)hp->n_expert;
    out->model_id = sil_heat_model_id(e->model);
    out->tokens = e->heat_tokens + e->f.n_rows;
    out->heat = heat;
    return 0;
}

int sil_engine_heat_import(struct sil_engine *e, const struct sil_heat_map *m,
                           struct sil_error *err)
{
    const struct sil_hparams *hp = &e->model->hp;
    if (!e->f.obs || hp->n_expert <= 0) return sil_errorf(err, -ENODEV, "engine: no heat map kept");
    if (m->model_id != sil_heat_model_id(e->model))
        return sil_errorf(err, -EINVAL, "heat map: of another model (identity %016llx)",
                          (unsigned long long)m->model_id);
    if (m->n_layer != (uint32_t)hp->n_layer || m->n_expert != (uint32_t)hp->n_expert)
        return sil_errorf(err, -EINVAL, "heat map: %u layers x %u experts, the model has %d x %d",
                          m->n_layer, m->n_expert, hp->n_layer, hp->n_expert);
    if (!sil_expert_obs_heat_import(e->f.obs, m->heat))
        return sil_errorf(err, -ENODEV, "engine: no heat map kept");
    /* The device cache's frequencies too, so LFU keeps what is preloaded by its heat. */
    if (e->f.ecache) sil_ecache_heat_import(e->f.ecache, m->heat);
    if (e->f.xstore) sil_xstore_heat_import(e->f.xstore, m->heat);
    e->heat_tokens = m->tokens - e->f.n_rows;
    return 0;
}

/* Preloading goes in steps so progress can be shown; each step is one preload call. */
#define HEAT_PRELOAD_STEPS 16

int sil_engine_heat_restore(struct sil_engine *e, const char *path,
                            void (*progress)(int64_t done, int64_t total, void *user), void *user,
                            struct sil_heat_restore *out, struct sil_error *err)
{
    *out = (struct sil_heat_restore){0};
    const struct sil_hparams *hp = &e->model->hp;
    struct sil_heat_map m = {0};
    int rc = sil_heat_map_load(path, sil_heat_model_id(e->model), (uint32_t)hp->n_layer,
                               (uint32_t)hp->n_expert, &m, err);
    const int64_t n_key = (int64_t)m.n_layer * m.n_expert;
    int32_t *keys = rc == 0 ? malloc((size_t)(n_key > 0 ? n_key : 1) * sizeof(int32_t)) : NULL;
    if (rc == 0 && !keys) rc = sil_errorf(err, -ENOMEM, "heat map: out of memory for its order");
    if (rc == 0) rc = sil_engine_heat_import(e, &m, err);
    if (rc < 0) {
        free(keys);
        sil_heat_map_free(&m);
        return rc;
    }
    out->tokens = m.tokens;
    out->hot = sil_heat_map_hottest(&m, keys, n_key);
    if (sil_engine_ecache_slots(e) > 0 && out->hot > 0) {
        /* what the pools can take: each layer's hot experts up to its pool */
        int64_t total = 0;
        for (uint32_t l = 0; l < m.n_layer; l++) {
            int64_t nz = 0;
            for (uint32_t x = 0; x < m.n_expert; x++)
                nz += m.heat[(size_t)l * m.n_expert + x] > 0;
            const int32_t pool = sil_engine_ecache_pool_slots(e, (int32_t)l);
            total += nz < pool ? nz : pool;
        }
        const int64_t step = (out->hot + HEAT_PRELOAD_STEPS - 1) / HEAT_PRELOAD_STEPS;
        for (int64_t i = 0; i < out->hot && out->placed < total; i += step) {
            const int64_t n = out->hot - i < step ? out->hot - i : step;
            const int64_t placed = sil_engine_ecache_preload(e, keys + i, n);
            if (placed > 0) out->placed += placed;
            if (progress) progress(out->placed, total, user);
        }
    }
    if (e->f.xstore && out->hot > 0) {
        /* then the host tier, with the hottest of what the device did not take, in steps */
        int64_t from = 0, total = 0;
        for (int64_t i = 0; i < out->hot; i++) {
            const int32_t l = keys[i] / (int32_t)m.n_expert, x = keys[i] % (int32_t)m.n_expert;
            if (e->f.ecache && sil_ecache_slot_of(e->f.ecache, l, x) >= 0) continue;
            keys[from++] = keys[i];
        }
        struct sil_xstore_stats st;
        sil_xstore_stats(e->f.xstore, &st);
        total = from < st.n_slot ? from : st.n_slot;
        const int64_t step = (total + HEAT_PRELOAD_STEPS - 1) / HEAT_PRELOAD_STEPS;
        int64_t placed = 0;
        for (int64_t i = 0; step > 0 && i < from && placed < total; i += step) {
            const int64_t n = from - i < step ? from - i : step;
            struct sil_error xe = {0};
            const int64_t got = sil_xstore_preload(e->f.xstore, keys + i, n, &xe);
            if (got < 0) {
                fprintf(stderr, "siliceo: host tier preload stopped: %s\n", xe.msg);
                break;
            }
            placed += got;
            if (progress) progress(out->placed + placed, out->placed + total, user);
        }
        out->placed_host = placed;
    }
    free(keys);
    sil_heat_map_free(&m);
    return 0;
}

int sil_engine_heat_save(const struct sil_engine *e, const char *path, struct sil_error *err)
{
    struct sil_heat_map m = {0};
    int rc = sil_engine_heat_export(e, &m, err);
    if (rc == 0) rc = sil_heat_map_save(path, &m, err);
    sil_heat_map_free(&m);
    return rc;
}

/* The device's slots when the backend has them (f->ecache), else the simulated cache. */
const char *sil_engine_ecache_mode(const struct sil_engine *e)
{
    return e->f.ecache ? "device" : sil_expert_obs_slots(e->f.obs) > 0 ? "simulated" : NULL;
}

int32_t sil_engine_ecache_slots(const struct sil_engine *e)
{
    return e->f.ecache ? sil_ecache_pool_slots(e->f.ecache, 0) : sil_expert_obs_slots(e->f.obs);
}

int32_t sil_engine_ecache_pool_slots(const struct sil_engine *e, int32_t layer)
{
    return e->f.ecache ? sil_ecache_pool_slots(e->f.ecache, layer)
                       : sil_expert_obs_pool_slots(e->f.obs, layer);
}

int32_t sil_engine_ecache_host_misses(const struct sil_engine *e)
{
    return e->f.ecache ? e->f.cpu_misses : 0;
}

const char *sil_engine_ecache_policy(const struct sil_engine *e)
{
    return e->f.ecache ? sil_ecache_policy_name((enum sil_ecache_policy)e->f.ecache_policy)
                       : sil_expert_obs_policy(e->f.obs);
}

int64_t sil_engine_ecache_preload(struct sil_engine *e, const int32_t *keys, int64_t n)
{
    const int32_t slots = sil_engine_ecache_slots(e);
    if (slots <= 0) return -ENODEV;
    const int32_t ne = e->model->hp.n_expert;
    int64_t placed = 0;
    for (int64_t i = 0; i < n && placed < slots; i++) {
        if (keys[i] < 0 || keys[i] / ne >= e->model->hp.n_layer) continue;
        const int32_t l = keys[i] / ne, x = keys[i] % ne;
        if (!e->f.ecache) {
            if (sil_expert_obs_preload(e->f.obs, l, x) >= 0) placed++;
            continue;
        }
        /* The device's slots: the expert's matrices are copied in, as a miss would be. */
        const int32_t s = sil_ecache_preload(e->f.ecache, l, x);
        if (s < 0) continue;
        const struct sil_layer_weights *w = &e->f.lw[l];
        struct sil_weight g = sil_weight_mat(&w->ffn_gate_exps, x),
                          u = sil_weight_mat(&w->ffn_up_exps, x),
                          d = sil_weight_mat(&w->ffn_down_exps, x);
        if (e->f.xstore) {
            /* through a host slot, which the next acquire may reuse: the copy is waited for */
            const void *ptr[3];
            struct sil_error xe = {0};
            if (sil_xstore_acquire(e->f.xstore, l, &x, NULL, 1, ptr, &xe) < 0) {
                fprintf(stderr, "siliceo: expert preload stopped: %s\n", xe.msg);
                break;
            }
            struct sil_weight *m[3] = {&g, &u, &d};
            for (int k = 0; k < 3; k++) {
                m[k]->loc = SIL_WEIGHT_HOST;
                m[k]->data = ptr[k];
            }
        }
        SIL_OP(&e->f, fill_slot, s, &g, &u, &d, l, x);
        if (e->f.xstore) sil_xstore_demote(e->f.xstore, l, x);
        if (e->f.xstore && e->f.be->ops->status && e->f.be->ops->status(e->f.be, NULL) < 0) break;
        placed++;
    }
    return placed;
}

void sil_engine_ecache_layer_stats(const struct sil_engine *e, int32_t layer,
                                   struct sil_ecache_stats *out)
{
    if (e->f.ecache)
        sil_ecache_stats(e->f.ecache, layer, out);
    else
        sil_expert_obs_layer_stats(e->f.obs, layer, out);
}

void sil_engine_host_tier_drop(struct sil_engine *e)
{
    if (!e->f.xstore) return;
    /* copies queued from the tier's slots finish before the slots go */
    if (e->f.be->ops->status) e->f.be->ops->status(e->f.be, NULL);
    close_host_tier(&e->f);
    tier_measure_host(e, false); /* misses are never computed from a mapping the disk backs */
    fprintf(stderr, "siliceo: host tier of %s given back: experts are read through the mapping\n",
            e->info.path);
}

void sil_engine_host_plan(const struct sil_engine *e, struct sil_engine_host_plan *out)
{
    memset(out, 0, sizeof(*out));
    out->budget = e->hp_budget == UINT64_MAX ? 0 : e->hp_budget;
    snprintf(out->budget_from, sizeof out->budget_from, "%s", e->tier_from);
    out->fixed = e->hp_fixed;
    for (int c = 0; c < SIL_HOST_N_CACHE; c++) {
        out->want[c] = e->hp_want[c];
        out->cache[c] = e->hp.cache[c];
    }
    out->experts = e->hp.experts;
    out->tier = e->f.xstore != NULL;
    out->gave_way = e->hp.gave_way;
}

void sil_engine_host_tier(const struct sil_engine *e, struct sil_engine_host_tier *out)
{
    memset(out, 0, sizeof(*out));
    out->budget = e->hp_budget == UINT64_MAX ? 0 : e->hp_budget;
    out->min_bytes = e->tier_min ? e->hp_fixed + e->tier_min : 0;
    snprintf(out->budget_from, sizeof out->budget_from, "%s", e->tier_from);
    if (!e->f.xstore) return;
    struct sil_xstore_stats st;
    sil_xstore_stats(e->f.xstore, &st);
    out->on = true;
    out->full = e->tier_full;
    out->n_slot = st.n_slot;
    out->slot_bytes = st.slot_bytes;
    out->io = st.io;
    out->hits = st.hits;
    out->misses = st.misses;
    out->bytes_read = st.bytes_read;
    out->reads = st.reads;
    out->wait_s = st.wait_s;
}

/* ---- MTP drafting ------------------------------------------------------------------------- */

bool sil_engine_has_mtp(const struct sil_engine *e)
{
    return e->model->hp.n_nextn > 0 && strcmp(e->f.be->ops->name, "cpu") == 0;
}

int sil_engine_eval_hidden(struct sil_engine *e, const struct sil_batch *b, float *logits,
                           int32_t *argmax, float *hidden, struct sil_error *err)
{
    return sil_engine_eval_hidden_rows(e, b, logits, argmax, hidden, NULL, err);
}

int sil_engine_eval_hidden_rows(struct sil_engine *e, const struct sil_batch *b, float *logits,
                                int32_t *argmax, float *hidden, int *row_status,
                                struct sil_error *err)
{
    if (!sil_engine_has_mtp(e))
        return sil_errorf(err, -ENOTSUP, "engine: %s has no MTP layer on this backend",
                          e->info.path);
    if ((!logits && !argmax) || !hidden)
        return sil_errorf(err, -EINVAL, "engine: no logits, argmax or hidden buffer");
    e->f.hidden = hidden;
    const int rc = sil_engine_eval_out(e, b, logits, argmax, row_status, err);
    e->f.hidden = NULL;
    return rc;
}

/* The MTP layer's KV: one layer beside the sequences', made at first use. */
static int mtp_kv_open(struct sil_engine *e, struct sil_error *err)
{
    if (e->f.mtp_kv) return 0;
    const struct sil_kv_config c = kv_config(e, 1);
    return sil_kv_create(&e->f.mtp_kv, &c, err);
}

int sil_seq_mtp_eval(struct sil_engine *e, int seq, int32_t n, const int32_t *token, int32_t pos0,
                     const float *hidden_in, int32_t *argmax, float *hidden_out,
                     struct sil_error *err)
{
    if (!argmax) return sil_errorf(err, -EINVAL, "engine: an MTP evaluation needs rows and buffers");
    return sil_seq_mtp_eval_out(e, seq, n, token, pos0, hidden_in, NULL, argmax, hidden_out, err);
}

int sil_seq_mtp_eval_out(struct sil_engine *e, int seq, int32_t n, const int32_t *token,
                         int32_t pos0, const float *hidden_in, float *logits, int32_t *argmax,
                         float *hidden_out, struct sil_error *err)
{
    if (!sil_engine_has_mtp(e))
        return sil_errorf(err, -ENOTSUP, "engine: %s has no MTP layer on this backend",
                          e->info.path);
    if (!seq_ok(e, seq))
        return sil_errorf(err, -EINVAL, "engine: sequence %d is not live", seq);
    if (n < 1 || !token || !hidden_in || (!argmax && !logits) || !hidden_out)
        return sil_errorf(err, -EINVAL, "engine: an MTP evaluation needs rows and buffers");
    if (atomic_load(&e->damaged)) return damaged_error(e, NULL, NULL, err);
    for (int32_t i = 0; i < n; i++)
        if (token[i] < 0 || token[i] >= e->model->hp.n_vocab)
            return sil_errorf(err, -EINVAL, "engine: MTP row %d: token %d outside [0, %d)", i,
                              token[i], e->model->hp.n_vocab);
    int rc = mtp_kv_open(e, err);
    if (rc < 0) return rc;
    struct sil_kv_cache *kv = e->f.mtp_kv;
    const int32_t held = sil_kv_seq_len(kv, seq);
    if (pos0 < 0 || pos0 > held)
        return sil_errorf(err, -EINVAL, "engine: MTP rows of sequence %d from %d, it holds %d",
                          seq, pos0, held);
    if (pos0 + n > e->n_ctx)
        return sil_errorf(err, -ENOSPC, "engine: MTP position %d beyond the context (%d)",
                          pos0 + n - 1, e->n_ctx);
    sil_kv_seq_trim(kv, seq, pos0);
    if ((rc = sil_kv_seq_reserve(kv, seq, pos0 + n, err)) < 0) return rc;

    const int64_t E = e->model->hp.n_embd;
    struct sil_mapguard_point pt;
    sil_mapguard_push(&pt);
    if (sigsetjmp(pt.jb, 0)) {
        sil_kv_seq_trim(kv, seq, pos0);
        return damaged_error(e, NULL, NULL, err);
    }
    for (int32_t r0 = 0; r0 < n && rc == 0;) {
        const int32_t len = n - r0 < e->f.ub_max ? n - r0 : e->f.ub_max;
        for (int32_t i = 0; i < len; i++) {
            e->p_token[i] = token[r0 + i];
            e->p_pos[i] = pos0 + r0 + i;
            e->p_seq[i] = seq;
            e->p_out[i] = i;
        }
        e->run_start[0] = 0;
        e->run_start[1] = len;
        const struct sil_ubatch ub = {
            .n = len,
            .token = e->p_token,
            .pos = e->p_pos,
            .seq = e->p_seq,
            .out_row = e->p_out,
            .n_runs = 1,
            .run_start = e->run_start,
            .kv = kv,
            .head_out = (logits ? SIL_HEAD_LOGITS : 0u) | (argmax ? SIL_HEAD_ARGMAX : 0u),
        };
        sil_forward_mtp(&e->f, &ub, hidden_in + r0 * E,
                        logits ? logits + (int64_t)r0 * e->model->hp.n_vocab : NULL,
                        argmax ? argmax + r0 : NULL, hidden_out + r0 * E);
        rc = after_pass(e, err);
        r0 += len;
    }
    sil_mapguard_pop(&pt);
    if (rc != 0) sil_kv_seq_trim(kv, seq, pos0);
    if (rc > 0) return damaged_error(e, NULL, NULL, err);
    return rc;
}
