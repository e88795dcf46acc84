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
 * wrote (q8_src), which a matmul of exactly those rows reads instead of quantizing again.
 *
 * This file creates and frees the backend and holds its op table; the ops live by concept in
 * backend_cuda_ops.c, backend_cuda_moe.c, backend_cuda_graph.c and backend_cuda_slots.c, over
 * the state in backend_cuda_impl.h. */
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

#include "daemon/engine/backend_cuda_impl.h"
#include "kernels/cpu/quants.h"
#include "kernels/vec.h"

const char *sil_engine_backends(void)
{
    static char text[160];
    if (!text[0]) snprintf(text, sizeof text, "cpu, cuda (%s)", sil_cuda_fatbin_archs());
    return text;
}

int sil_cb_dalloc(struct cuda_backend *b, size_t bytes, sil_cuda_ptr *out, struct sil_error *err)
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

static int cuda_status(struct sil_backend *be, struct sil_error *err)
{
    struct cuda_backend *b = cb(be);
    sil_cb_abort_capture(b);
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

/* The first n rows of the window kept in slot `slot` run again from its start (put back by the
 * caller): per recurrent layer, the conv over their captured qkv, then the delta rule over its
 * output and their alpha and beta, as the passes ran them (one run of n tokens: the same sums
 * in the same order, so the same state). 1 when done, 0 when the rows were not all captured. */
static int keep_replay(struct cuda_backend *b, int seq, int slot, int32_t n, struct sil_error *err)
{
    const struct sil_cuda_config *c = &b->c;
    if (!b->keep_l || n < 1 || n > MB || n > b->keep_rows[slot]) return 0;
    for (int64_t l = 0; l < c->n_layer_recr; l++)
        if (!b->keep_l[l].set) return 0;
    const int32_t runs[3] = {0, n, seq}; /* run_start[2], run_seq[1] */
    int rc = sil_cuda_upload(b->cu, b->keep_runs, runs, sizeof runs, NULL, err);
    const int64_t cd = c->dn_conv_dim, nv = c->dn_v_heads, w = cd + 2 * nv;
    const sil_cuda_ptr conv = b->keep_scr, out = b->keep_scr + (uint64_t)(MB * cd) * 4;
    for (int64_t l = 0; rc == 0 && l < c->n_layer_recr; l++) {
        const struct keep_layer *k = &b->keep_l[l];
        const sil_cuda_ptr in =
            b->keep_in + (uint64_t)(((l * c->keep_states) + slot) * MB * w) * sizeof(float);
        struct sil_cuda_dn d = k->d;
        rc = sil_cuda_fwd_conv1d(b->cu, b->fwd, in, w, conv, cd, k->conv_w, k->K, cd, b->keep_runs,
                                 b->keep_runs + 8, b->state_tab, d.offset, 1, NULL, err);
        d.conv = conv;
        d.ldc = cd;
        d.alpha = in + (uint64_t)cd * 4;
        d.lda = w;
        d.beta = in + (uint64_t)(cd + nv) * 4;
        d.ldb = w;
        d.out = d.z = out; /* the cores' output is not wanted: only the state */
        d.ldo = d.ldz = nv * d.dv;
        d.run_start = b->keep_runs;
        d.run_seq = b->keep_runs + 8;
        if (rc == 0)
            rc = dn_rule_takes(d.dk)
                     ? sil_cuda_fwd_delta_rule(b->cu, b->fwd, &d, 1, 0, 0, 0, NULL, err)
                     : sil_cuda_fwd_delta_net(b->cu, b->fwd, &d, 1, NULL, err);
    }
    if (rc < 0) return rc;
    atomic_fetch_add_explicit(&b->keep_replays, 1, memory_order_relaxed);
    return 1;
}

static int cuda_state_keep(struct sil_backend *be, int seq, enum sil_state_keep how, int32_t n,
                           struct sil_error *err)
{
    struct cuda_backend *b = cb(be);
    int rc = state_check(b, seq, b->c.recr_floats, err);
    if (rc < 0) return rc;
    int slot = -1, free_slot = -1;
    for (int i = 0; i < (int)b->c.keep_states; i++) {
        if (b->keep_owner[i] == seq) slot = i;
        if (b->keep_owner[i] < 0 && free_slot < 0) free_slot = i;
    }
    if (how == SIL_STATE_DROP) {
        if (slot >= 0) b->keep_owner[slot] = -1;
        return 0;
    }
    if (how == SIL_STATE_KEEP && slot < 0) slot = free_slot;
    if (slot < 0)
        return sil_errorf(err, -ENOSPC, "cuda backend: %s", how == SIL_STATE_KEEP
                                                                 ? "every kept state's slot is taken"
                                                                 : "no kept state to put back");
    const size_t bytes = (size_t)b->c.recr_floats * sizeof(float);
    const sil_cuda_ptr live = b->state + (uint64_t)seq * bytes,
                       kept = b->state_keep + (uint64_t)slot * bytes;
    rc = how == SIL_STATE_KEEP ? sil_cuda_copy_d2d(b->cu, kept, live, bytes, NULL, err)
                               : sil_cuda_copy_d2d(b->cu, live, kept, bytes, NULL, err);
    if (rc < 0) return rc;
    b->keep_owner[slot] = seq;
    if (how == SIL_STATE_KEEP) {
        b->keep_pos[slot] = n;
        b->keep_rows[slot] = b->keep_l ? 0 : -1;
        return 0;
    }
    return n == 0 ? 1 : keep_replay(b, seq, slot, n, err);
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
    if (sil_cb_dalloc(b, bytes ? bytes : 4, &p, &e) < 0) {
        if (b->rc == 0) {
            b->rc = e.code;
            b->err = e;
        }
        return NULL;
    }
    return (void *)(uintptr_t)p;
}


static void cuda_free(struct sil_backend *be)
{
    struct cuda_backend *b = cb(be);
    if (!b) return;
    if (b->cu) {
        sil_cb_abort_capture(b);
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
            sil_cb_drop_segs(b, &b->slots[i]);
            free(b->slots[i].seg);
        }
        sil_cuda_host_release(b->cu, b->h_ids);
        sil_cuda_host_release(b->cu, b->zc_hids);
        sil_cuda_host_release(b->cu, b->h_x);
        sil_cuda_host_release(b->cu, b->h_y);
        sil_cuda_host_release(b->cu, b->h_meta);
        sil_cuda_host_release(b->cu, b->h_logits);
        sil_cuda_host_release(b->cu, b->h_am);
        sil_cuda_slots_free(&b->es);
        for (int i = 0; i < b->n_allocs; i++)
            sil_cuda_release(b->cu, b->allocs[i]);
        sil_cuda_fwd_unload(b->cu, b->fwd);
        sil_cuda_free(b->cu);
    }
    free(b->allocs);
    free(b->keep_owner);
    free(b->keep_pos);
    free(b->keep_rows);
    free(b->keep_l);
    free(b->tmp);
    free(b->slot_ids);
    free(b->zc_rows);
    sil_host_experts_free(b->hx);
    free(b->jobs);
    free(b->h_wts);
    free(b);
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
    d->reserved_bytes = b->reserved;
    d->context_bytes = b->ctx_bytes - b->reserved;
    d->pinned_bytes = b->es.pinned_bytes;
    d->h2d_gbs = b->es.h2d_gbs;
    d->slot_bytes_in = atomic_load_explicit(&b->es.bytes_in, memory_order_relaxed);
    d->slot_fills = atomic_load_explicit(&b->es.fills, memory_order_relaxed);
    d->zero_copy = b->zc;
    d->zero_copy_passes = atomic_load_explicit(&b->zc_passes, memory_order_relaxed);
    d->cpu_misses = sil_cb_cpu_misses(be);
    d->cpu_share = sil_cb_host_share(be);
    d->host_gbs = b->host_gbs;
    d->cpu_experts = atomic_load_explicit(&b->host_experts, memory_order_relaxed);
    d->fused_conv = atomic_load_explicit(&b->fused[0], memory_order_relaxed);
    d->fused_attn_q8 = atomic_load_explicit(&b->fused[1], memory_order_relaxed);
    d->fused_norm_router = atomic_load_explicit(&b->fused[2], memory_order_relaxed);
    d->cut_replays = atomic_load_explicit(&b->keep_replays, memory_order_relaxed);
}

static int32_t cuda_decode_rows_max(struct sil_backend *be)
{
    (void)be;
    return MB; /* the batch-8 decode kernels, graphs and device routing */
}

static const struct sil_backend_ops cuda_ops = {
    .name = "cuda",
    .free = cuda_free,
    .alloc_act = cuda_alloc_act,
    .begin = sil_cb_begin,
    .resume = sil_cb_resume,
    .get_rows = sil_cb_get_rows,
    .copy_rows = sil_cb_copy_rows,
    .matmul = sil_cb_matmul,
    .rmsnorm = sil_cb_rmsnorm,
    .add = sil_cb_add,
    .add_rmsnorm = sil_cb_add_rmsnorm,
    .swiglu = sil_cb_swiglu,
    .attention = sil_cb_attention,
    .conv1d = sil_cb_conv1d,
    .matmul_conv1d = sil_cb_matmul_conv1d,
    .delta_net = sil_cb_delta_net,
    .route = sil_cb_route,
    .add_rmsnorm_route = sil_cb_add_rmsnorm_route,
    .moe = sil_cb_moe,
    .head = sil_cb_head,
    .place = sil_cb_place,
    .placed = sil_cb_placed,
    .status = cuda_status,
    .state_read = cuda_state_read,
    .state_write = cuda_state_write,
    .state_keep = cuda_state_keep,
    .kv_copy = cuda_kv_copy,
    .device = cuda_device,
    .decode_rows_max = cuda_decode_rows_max,
    .expert_slots = sil_cb_expert_slots,
    .cpu_misses = sil_cb_cpu_misses,
    .host_share = sil_cb_host_share,
    .measure_host = sil_cb_measure_host,
    .fill_slot = sil_cb_fill_slot,
    .routes = sil_cb_routes,
    .host_alloc = sil_cb_host_alloc,
    .host_free = sil_cb_host_free,
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
    sil_cuda_slots_init(&b->es, b->cu);
    const int64_t U = c->ub_max, K = c->n_expert_used > 0 ? c->n_expert_used : 1;
    const int64_t X = c->n_expert, E = c->n_embd, S = c->n_ff_shexp, F = c->n_ff_exp;
    const uint64_t f4 = sizeof(float);
    const int64_t kv_nb = c->kv_blocks > 0
                              ? c->kv_blocks
                              : c->n_seq_max * ((c->n_ctx + SIL_KV_BLOCK - 1) / SIL_KV_BLOCK);
    const int64_t kv_pos = kv_nb * SIL_KV_BLOCK; /* the block pool's positions a layer */
    const uint64_t kv =
        2 * (uint64_t)(c->n_layer_attn * kv_pos) * sil_kv_type_bytes(c->kv_type, c->kv_dim);
    /* a kept window: its start, its rows' delta-net inputs, the replay's conv and rule output */
    const int64_t keep_w = c->dn_conv_dim + 2 * c->dn_v_heads;
    const bool keep_cap = c->keep_states > 0 && c->n_layer_recr > 0 && keep_w > 0;
    const uint64_t keep_in =
        keep_cap ? (uint64_t)(c->n_layer_recr * c->keep_states * MB * keep_w) * f4 : 0;
    const uint64_t keep_scr =
        keep_cap ? (uint64_t)(MB * (c->dn_conv_dim + c->dn_v_heads * c->dn_head_v_dim)) * f4 : 0;
    const uint64_t st_keep = (uint64_t)(c->keep_states * c->recr_floats) * f4;
    const uint64_t st = (uint64_t)(c->n_seq_max * c->recr_floats) * f4 + st_keep + keep_in +
                        keep_scr + (keep_cap ? 16 : 0);
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
        (uint64_t)(U * E) * f4 + 7 * (uint64_t)(U + 1) * 4 + (uint64_t)c->n_seq_max * 8 + moe;
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
    /* what other engines of this process hold (a draft model) is theirs, not the context's */
    const uint64_t reserved = c->vram_budget ? c->vram_reserved : 0;
    ctx_bytes = ctx_bytes > reserved ? ctx_bytes - reserved : 0;
    if (ctx_bytes > (1u << 30)) ctx_bytes = 1u << 30;
    b->ctx_bytes = c->vram_budget ? ctx_bytes : 0;
    b->reserved = reserved;
    if (rc == 0 && c->vram_budget && c->vram_budget <= reserved + ctx_bytes + (256u << 20))
        rc = sil_errorf(err, -ENOMEM,
                        "cuda backend: --vram-budget of %llu MiB leaves nothing beside the "
                        "%llu MiB the device context takes%s",
                        (unsigned long long)(c->vram_budget >> 20),
                        (unsigned long long)(ctx_bytes >> 20),
                        reserved ? " and what the draft model holds" : "");
    if (reserved && rc == 0)
        b->ctx_bytes += reserved; /* the budget's cap below leaves it out */
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
    const uint64_t slot_bytes = sil_cuda_slot_bytes(c->slot_gate) +
                                sil_cuda_slot_bytes(c->slot_up) + sil_cuda_slot_bytes(c->slot_down);
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
                        (unsigned long long)((need + ctx_bytes + reserved + (1u << 20) - 1) >> 20));
    else if (rc == 0 && need > free_b)
        rc = sil_errorf(err, -ENOMEM,
                        "cuda backend: the model needs %llu MiB of device memory, %s has %llu MiB "
                        "free",
                        (unsigned long long)(need >> 20), in->name,
                        (unsigned long long)(free_b >> 20));
    b->budget = budget;
    /* the staged block: embedding rows, then 6 int32 arrays of U (+1) */
    const size_t ints_off = (size_t)(U * E) * sizeof(float);
    const int64_t bps = (c->n_ctx + SIL_KV_BLOCK - 1) / SIL_KV_BLOCK;
    const size_t meta_bytes =
        ints_off + (size_t)(6 * U + 1 + (c->n_layer_attn > 0 ? c->n_seq_max * bps : 0)) *
                       sizeof(int32_t);
    struct {
        sil_cuda_ptr *p;
        uint64_t bytes;
    } bufs[] = {
        {&b->kv_k, kv / 2},
        {&b->kv_v, kv / 2},
        {&b->state, st - st_keep - keep_in - keep_scr - (keep_cap ? 16 : 0)},
        {&b->state_keep, st_keep},
        {&b->keep_in, keep_in},
        {&b->keep_scr, keep_scr},
        {&b->keep_runs, keep_cap ? 16 : 0},
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
        rc = sil_cb_dalloc(b, bufs[i].bytes, bufs[i].p, err);
    if (rc == 0 && c->keep_states > 0) {
        b->keep_owner = malloc(sizeof(int32_t) * (size_t)c->keep_states);
        b->keep_pos = calloc((size_t)c->keep_states, sizeof(int32_t));
        b->keep_rows = calloc((size_t)c->keep_states, sizeof(int32_t));
        if (keep_cap) b->keep_l = calloc((size_t)c->n_layer_recr, sizeof(struct keep_layer));
        if (!b->keep_owner || !b->keep_pos || !b->keep_rows || (keep_cap && !b->keep_l))
            rc = sil_errorf(err, -ENOMEM, "cuda backend: out of memory");
        for (int64_t i = 0; rc == 0 && i < c->keep_states; i++) {
            b->keep_owner[i] = -1;
            b->keep_rows[i] = -1;
        }
    }
    b->attn_split = attn_split;
    if (rc == 0 && n_slots > 0) {
        struct sil_cuda_slots *es = &b->es;
        sil_cuda_slots_layout(es, (int32_t)n_slots, c->slot_gate, c->slot_up, c->slot_down);
        rc = sil_cb_dalloc(b, (size_t)(es->slot_g * (uint64_t)n_slots), &es->pool_g, err);
        if (rc == 0)
            rc = sil_cb_dalloc(b, (size_t)(es->slot_u * (uint64_t)n_slots), &es->pool_u, err);
        if (rc == 0)
            rc = sil_cb_dalloc(b, (size_t)(es->slot_d * (uint64_t)n_slots), &es->pool_d, err);
        /* the staging ring, path (b)'s table (every expert in place until filled) and choices */
        const size_t nkeys = (size_t)(c->n_layer * X);
        if (rc == 0) rc = sil_cuda_slots_open(es, (int64_t)nkeys, err);
        b->zc_rows = calloc((size_t)c->n_layer + 1, sizeof(int32_t));
        if (rc == 0 && !b->zc_rows) rc = sil_errorf(err, -ENOMEM, "cuda backend: out of memory");
        if (rc == 0) rc = sil_cb_dalloc(b, sizeof(int32_t) * (nkeys ? nkeys : 1), &es->tab, err);
        if (rc == 0)
            rc = sil_cb_dalloc(b, sizeof(int32_t) * (size_t)(c->n_layer * MB * K) + 4, &b->zc_ids,
                               err);
        if (rc == 0)
            rc = sil_cuda_host_alloc(b->cu, sizeof(int32_t) * (size_t)(c->n_layer * MB * K) + 4,
                                     (void **)&b->zc_hids, err);
        /* zeroed, so a slot id given to a pair of weight 0 reads finite numbers */
        if (rc == 0) rc = sil_cuda_slots_zero(es, err);
        /* path (c): cpu_misses N (tests, benchmarks) takes up to N misses of each decode layer
         * to the CPU; else the share is chosen at placed() from the host's and the link's
         * measured speeds (or given, cpu_share); cpu_off turns it off. Asking for reads in
         * place (path (b)) turns the automatic share off. */
        const struct sil_cuda_options *o = &c->opt;
        /* a speculating engine takes a share only when one is given (cuda_cpu_share = F) */
        const bool share = o->cpu_misses <= 0 && !o->cpu_off && !o->zero_copy;
        const bool spec_off = share && c->speculates && o->cpu_share <= 0;
        b->cpu_auto = share && !spec_off;
        if (spec_off)
            fprintf(stderr, "siliceo: cuda backend: speculative decoding: expert misses are not "
                            "computed on the CPU (its products round differently from the "
                            "device's: tokens would depend on what the cache held); "
                            "cuda_cpu_share = SHARE takes a share anyway\n");
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
            if (rc == 0) rc = sil_cb_dalloc(b, sizeof(float) * (size_t)(MB * E), &b->cpu_y, err);
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
        b->h_cap = hi + 5 * U + 1;
        b->h_btab = hi + 6 * U + 1;
        b->kv_bps = c->n_layer_attn > 0 ? (int32_t)bps : 0;
        b->kv_nb = (int32_t)kv_nb;
        b->pos = b->meta + ints_off;
        b->seq = b->pos + (uint64_t)U * 4;
        b->run_start = b->pos + (uint64_t)(2 * U) * 4;
        b->run_seq = b->pos + (uint64_t)(3 * U + 1) * 4;
        b->keep = b->pos + (uint64_t)(4 * U + 1) * 4;
        b->cap = b->pos + (uint64_t)(5 * U + 1) * 4;
        b->btab = b->pos + (uint64_t)(6 * U + 1) * 4;
        b->meta_bytes = meta_bytes;
        b->ints_off = ints_off;
        const struct sil_cuda_options *o = &c->opt;
        b->graphs = !o->no_graphs;
        b->host_route = c->host_route || o->host_route;
        b->es.h2d_cap = o->h2d_cap_gbs > 0 ? o->h2d_cap_gbs * 1e9 : 0.0;
        if (b->es.h2d_cap > 0 && b->es.n > 0)
            fprintf(stderr,
                    "siliceo: cuda backend: expert copies capped at %.2f GB/s "
                    "(SIL_BENCH_H2D_GBS, a benchmark setting)\n",
                    b->es.h2d_cap / 1e9);
        b->no_shared_fuse = o->no_shared_fuse;
        b->no_norm_router = o->no_norm_router;
        b->no_attn_q8 = o->no_attn_q8;
        b->no_conv_fuse = o->no_conv_fuse;
        b->no_mv_mix = o->no_mv_mix;
        b->no_gqa = o->no_gqa;
        b->no_flash = o->no_flash;
        b->flash_from = o->flash_from > 0 ? o->flash_from : FLASH_FROM_DEFAULT;
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
