/* The CUDA backend's dense ops: matmul (the matvec sets of decode, the tensor-core product of
 * prefill, the q8 of an input quantized once), embedding rows, row copies, rmsnorm with its add
 * and q8 blocks, swiglu, attention over the paged KV cache, the delta net's conv1d (alone or in
 * its projections' launch) and delta rule. */
#ifdef SIL_HAVE_CUDA

#include <errno.h>
#include <stdatomic.h>
#include <string.h>

#include "daemon/engine/backend_cuda_impl.h"

int sil_cb_view(const struct sil_weight *w, int64_t rows, struct sil_cuda_weight *cw,
                struct sil_error *err)
{
    if (w->loc != SIL_WEIGHT_DEVICE)
        return sil_errorf(err, -EINVAL, "cuda backend: a weight is not on the device");
    return sil_cuda_weight_view(w->type, rows, w->cols, dp(w->data), cw, err);
}

/* b->q8 holds the q8 of the n rows of k at xp (quantized now unless it already does). */
bool sil_cb_have_q8(struct cuda_backend *b, sil_cuda_ptr xp, int64_t n, int64_t k)
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
void sil_cb_mm_chunks(struct cuda_backend *b, struct sil_act x, const struct sil_mm_out *out,
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
        if (any_q && !sil_cb_have_q8(b, xp, n, x.width)) return;
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
                if (!ok(b, sil_cb_view(out[i].w, out[i].w->rows, &cws[m], &b->err))) return;
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
            if (!ok(b, sil_cb_view(out[j].w, out[j].w->rows, &cw, &b->err))) return;
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

void sil_cb_matmul(struct sil_backend *be, struct sil_act x, const struct sil_mm_out *out, int n)
{
    struct cuda_backend *b = cb(be);
    if (b->mode == PASS_REPLAY || b->rc) return;
    sil_cb_mm_chunks(b, x, out, n);
}

void sil_cb_get_rows(struct sil_backend *be, const struct sil_weight *w, const int32_t *ids,
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

void sil_cb_copy_rows(struct sil_backend *be, struct sil_act y, struct sil_act x,
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
bool sil_cb_norm_fuses(const struct cuda_backend *b, struct sil_act y, struct sil_act x)
{
    return x.rows > 0 && x.ld == x.width && y.ld == y.width && x.width % 32 == 0 &&
           x.width <= b->c.k_max && x.rows <= (b->c.ub_max > MB ? b->c.ub_max : MB);
}

void sil_cb_rmsnorm(struct sil_backend *be, struct sil_act y, struct sil_act x,
                    const struct sil_weight *w, float eps)
{
    struct cuda_backend *b = cb(be);
    if (!enter(b) || x.rows == 0) return;
    if (x.ld != x.width || y.ld != y.width) {
        fail(b, -EINVAL, "rmsnorm rows are not contiguous");
        return;
    }
    /* the norm and its q8 blocks in one kernel */
    if (!sil_cb_norm_fuses(b, y, x)) {
        ok(b, sil_cuda_rmsnorm(b->cu, dp(y.data), dp(x.data), dp(w->data), x.rows, x.width, eps,
                               NULL, &b->err));
        return;
    }
    launch_norm(b, x, 0, y, dp(w->data), eps);
}

void sil_cb_add(struct sil_backend *be, struct sil_act y, struct sil_act x)
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
void sil_cb_add_rmsnorm(struct sil_backend *be, struct sil_act y, struct sil_act x,
                        struct sil_act d, const struct sil_weight *w, float eps)
{
    struct cuda_backend *b = cb(be);
    if (!enter(b) || x.rows == 0) return;
    if (d.ld != d.width || !sil_cb_norm_fuses(b, y, x)) {
        sil_cb_add(be, x, d);
        sil_cb_rmsnorm(be, y, x, w, eps);
        return;
    }
    launch_norm(b, x, dp(d.data), y, dp(w->data), eps);
}

void sil_cb_swiglu(struct sil_backend *be, struct sil_act y, struct sil_act gate, struct sil_act up)
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


/* Positions, sequences and sequence runs of the ubatch on the device: staged by begin() and
 * copied up with the embedding rows; here when the ops run without begin(). */
static bool upload_meta(struct cuda_backend *b, const struct sil_ubatch *ub)
{
    if (b->meta_ok) return true;
    if (ub->n > b->c.ub_max)
        return fail(b, -EINVAL, "ubatch larger than the backend was sized for");
    int32_t n_keep;
    sil_cb_stage(b, ub, &n_keep);
    not_capturable(b);
    if (!ok(b, sil_cuda_upload(b->cu, b->meta + b->ints_off, (char *)b->h_meta + b->ints_off,
                               b->meta_bytes - b->ints_off, NULL, &b->err)))
        return false;
    b->meta_ok = true;
    return true;
}

void sil_cb_attention(struct sil_backend *be, const struct sil_ubatch *ub,
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
    /* prefill reaching flash_from: each sequence run's rows tiled (64 rows and a head a block)
     * where the head size has such a kernel */
    bool flash = !split && !b->no_flash && sil_cuda_fwd_flash_takes(hd);
    if (flash) {
        flash = false;
        for (int32_t i = 0; i < ub->n && !flash; i++)
            flash = ub->pos[i] >= b->flash_from;
    }
    if (flash) {
        for (int32_t r = 0; r < ub->n_runs && b->rc == 0; r++)
            ok(b, sil_cuda_fwd_flash(b->cu, b->fwd, &at, ub->run_start[r],
                                     ub->run_start[r + 1] - ub->run_start[r], NULL, &b->err));
        return;
    }
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
    if (!sil_cb_have_q8(b, dp(x.data), n, x.width)) return true;
    struct sil_cuda_weight cws[SIL_CUDA_MV_SET_MAX];
    const struct sil_cuda_weight *wp[SIL_CUDA_MV_SET_MAX];
    sil_cuda_ptr ys[SIL_CUDA_MV_SET_MAX];
    int64_t lds[SIL_CUDA_MV_SET_MAX];
    for (int i = 0; i < n_out; i++) {
        if (!ok(b, sil_cb_view(o[i].w, o[i].w->rows, &cws[i], &b->err))) return true;
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

void sil_cb_conv1d(struct sil_backend *be, const struct sil_ubatch *ub,
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
void sil_cb_matmul_conv1d(struct sil_backend *be, const struct sil_ubatch *ub, struct sil_act x,
                          const struct sil_mm_out *out, int n, const struct sil_delta_net_args *a)
{
    struct cuda_backend *b = cb(be);
    if (conv_in_set(b, ub, x, out, n, a)) return;
    sil_cb_matmul(be, x, out, n);
    sil_cb_conv1d(be, ub, a);
}

/* A kept window's rows (h_cap, staged with the ubatch): this layer's delta-net inputs into
 * keep_in, and the layer's weights noted for the replay (state_keep). Only a ubatch with such
 * rows makes the launch (graphs are keyed on it: graph_slot.cap). */
static void keep_capture(struct cuda_backend *b, const struct sil_ubatch *ub,
                         const struct sil_delta_net_args *a, const struct sil_cuda_dn *d)
{
    const struct sil_cuda_config *c = &b->c;
    const int64_t per = sil_delta_net_state_floats(a->p), l = per > 0 ? a->state.offset / per : -1;
    const int64_t cd = sil_delta_net_conv_dim(a->p);
    if (!b->keep_l || l < 0 || l >= c->n_layer_recr || cd != c->dn_conv_dim ||
        a->p->n_v_heads != c->dn_v_heads || a->p->head_v_dim != c->dn_head_v_dim ||
        a->p->conv_kernel < 1 || a->p->conv_kernel > 9)
        return;
    struct keep_layer *k = &b->keep_l[l];
    k->conv_w = dp(a->conv1d->data);
    k->K = a->p->conv_kernel;
    k->d = *d;
    k->set = true;
    if (b->n_cap == 0) return;
    const int64_t w = cd + 2 * c->dn_v_heads;
    const sil_cuda_ptr dst = b->keep_in + (uint64_t)(l * c->keep_states * MB * w) * sizeof(float);
    ok(b, sil_cuda_fwd_dn_capture(b->cu, b->fwd, dp(a->qkv_mixed.data), a->qkv_mixed.ld,
                                  dp(a->alpha.data), a->alpha.ld, dp(a->beta.data), a->beta.ld,
                                  b->cap, ub->n, dst, cd, (int)c->dn_v_heads, NULL, &b->err));
}

void sil_cb_delta_net(struct sil_backend *be, const struct sil_ubatch *ub,
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
    keep_capture(b, ub, a, &d);
    if (b->rc) return;
    if (!dn_rule_takes(dk)) {
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

#endif
