/* Host side of fwd.cu's kernels: the module, its functions by name, and one typed wrapper a
 * kernel (cuda_fwd.h). Parameter lists are fwd.cu's entry points', in order and in type. */
#include "kernels/cuda/cuda_fwd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

extern const unsigned char sil_cuda_fwd_fatbin[];

enum {
    F_GATHER,
    F_CONV1D,
    F_DELTA_NET,
    F_GATE_ADD,
    F_MOE_COMBINE,
    F_ADD_RMSNORM_Q8,
    F_DELTA_RULE,
    F_GATED_NORM_Q8,
    F_ATTEND_COMBINE,
    F_DN_CAPTURE,
    F_COUNT
};
static const char *const f_names[F_COUNT] = {
    "sil_fwd_gather_rows", "sil_fwd_conv1d",        "sil_fwd_delta_net",
    "sil_fwd_gate_add",    "sil_fwd_moe_combine",   "sil_fwd_add_rmsnorm_q8",
    "sil_fwd_delta_rule",  "sil_fwd_gated_norm_q8", "sil_fwd_attend_combine",
    "sil_fwd_dn_capture",
};
/* The kernels that touch the KV cache, one entry point a KV type: the name, then the type's
 * suffix (fwd.cu's QK_PREP_ENTRY, ATTEND_ENTRY, PART_ENTRY, PART_GQA_ENTRY and FLASH_ENTRIES
 * lines). */
enum { KV_QK_PREP, KV_ATTEND, KV_PART, KV_PART_GQA, KV_FLASH64, KV_FLASH128, KV_FLASH256, KV_FNS };
static const char *const kv_names[KV_FNS] = {
    "sil_fwd_qk_prep",     "sil_fwd_attend",  "sil_fwd_attend_part", "sil_fwd_attend_part_gqa",
    "sil_fwd_flash64",     "sil_fwd_flash128", "sil_fwd_flash256"};
static const char *const kv_suffix[SIL_CUDA_KV_TYPES] = {[SIL_CUDA_KV_F32] = "",
                                                         [SIL_CUDA_KV_F16] = "_h",
                                                         [SIL_CUDA_KV_Q8_0] = "_q8",
                                                         [SIL_CUDA_KV_Q4_0] = "_q4"};
#define KV_NAME_MAX 40

struct sil_cuda_fwd {
    struct sil_cuda_module *mod;
    void *fn[F_COUNT];
    void *kv_fn[SIL_CUDA_KV_TYPES][KV_FNS];
    char kv_name[SIL_CUDA_KV_TYPES][KV_FNS][KV_NAME_MAX]; /* also what profiles call them */
};

int sil_cuda_fwd_load(struct sil_cuda *cu, struct sil_cuda_fwd **out, struct sil_error *err)
{
    *out = NULL;
    struct sil_cuda_fwd *f = calloc(1, sizeof *f);
    if (!f) return sil_errorf(err, -ENOMEM, "cuda: out of memory");
    int rc = sil_cuda_module_load(cu, sil_cuda_fwd_fatbin, &f->mod, err);
    for (int i = 0; rc == 0 && i < F_COUNT; i++)
        rc = sil_cuda_module_function(cu, f->mod, f_names[i], &f->fn[i], err);
    for (int t = 0; rc == 0 && t < SIL_CUDA_KV_TYPES; t++)
        for (int k = 0; rc == 0 && k < KV_FNS; k++) {
            snprintf(f->kv_name[t][k], KV_NAME_MAX, "%s%s", kv_names[k], kv_suffix[t]);
            rc = sil_cuda_module_function(cu, f->mod, f->kv_name[t][k], &f->kv_fn[t][k], err);
        }
    if (rc < 0) {
        sil_cuda_fwd_unload(cu, f);
        return rc;
    }
    *out = f;
    return 0;
}

void sil_cuda_fwd_unload(struct sil_cuda *cu, struct sil_cuda_fwd *f)
{
    if (!f) return;
    sil_cuda_module_unload(cu, f->mod);
    free(f);
}

static unsigned cdiv(int64_t a, int64_t b)
{
    return (unsigned)((a + b - 1) / b);
}

/* A launch of 128 threads a block on grid (gx, gy), none when either is 0. */
static int launch(struct sil_cuda *cu, const struct sil_cuda_fwd *f, int k, unsigned gx,
                  unsigned gy, void **p, struct sil_cuda_stream *s, struct sil_error *err)
{
    if (gx == 0 || gy == 0) return 0;
    return sil_cuda_launch(cu, f->fn[k], f_names[k], gx, gy, 1, 128, s, p, err);
}

static int launch_kv(struct sil_cuda *cu, const struct sil_cuda_fwd *f, enum sil_cuda_kv t, int k,
                     unsigned gx, unsigned gy, void **p, struct sil_cuda_stream *s,
                     struct sil_error *err)
{
    if (gx == 0 || gy == 0) return 0;
    return sil_cuda_launch(cu, f->kv_fn[t][k], f->kv_name[t][k], gx, gy, 1, 128, s, p, err);
}

int sil_cuda_fwd_gather_rows(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr y,
                             int64_t ldy, sil_cuda_ptr x, int64_t ldx, sil_cuda_ptr rows,
                             int64_t width, int64_t n, struct sil_cuda_stream *s,
                             struct sil_error *err)
{
    void *p[] = {&y, &ldy, &x, &ldx, &rows, &width};
    return launch(cu, f, F_GATHER, (unsigned)n, 1, p, s, err);
}

int sil_cuda_fwd_add_rmsnorm_q8(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr x,
                                sil_cuda_ptr d, sil_cuda_ptr y, sil_cuda_ptr w, int64_t rows,
                                int64_t n, float eps, sil_cuda_ptr q8, int64_t nblocks,
                                struct sil_cuda_stream *s, struct sil_error *err)
{
    void *p[] = {&x, &d, &y, &w, &n, &eps, &q8, &nblocks};
    const unsigned threads = (unsigned)sil_cuda_rmsnorm_threads(n);
    return sil_cuda_launch(cu, f->fn[F_ADD_RMSNORM_Q8], f_names[F_ADD_RMSNORM_Q8], (unsigned)rows,
                           1, 1, threads, s, p, err);
}

int sil_cuda_fwd_qk_prep(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                         const struct sil_cuda_attn *a, int64_t rows, struct sil_cuda_stream *s,
                         struct sil_error *err)
{
    sil_cuda_ptr q = a->q, k = a->k, v = a->v, qn = a->q_norm, kn = a->k_norm, pos = a->pos,
                 seq = a->seq, kc = a->kc, vc = a->vc, btab = a->btab;
    int64_t ldq = a->ldq, ldk = a->ldk, ldv = a->ldv;
    int q_stride = a->q_stride, n_head = a->n_head, n_kv = a->n_head_kv, hd = a->head_dim;
    int n_rot = a->n_rot, n_ctx = a->n_ctx, bps = a->bps;
    float fb = a->freq_base, eps = a->eps;
    void *p[] = {&q,      &ldq,  &q_stride, &k,     &ldk, &v,   &ldv, &qn, &kn,    &pos,  &seq,
                 &n_head, &n_kv, &hd,       &n_rot, &fb,  &eps, &kc,  &vc, &n_ctx, &btab, &bps};
    return launch_kv(cu, f, a->kv, KV_QK_PREP, (unsigned)(n_head + n_kv), (unsigned)rows, p, s,
                     err);
}

int sil_cuda_fwd_attend(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                        const struct sil_cuda_attn *a, int64_t r0, int64_t n, sil_cuda_ptr scores,
                        struct sil_cuda_stream *s, struct sil_error *err)
{
    int64_t ldq = a->ldq, ldo = a->ldo;
    sil_cuda_ptr qr = a->q + (uint64_t)(r0 * ldq) * 4, orr = a->o + (uint64_t)(r0 * ldo) * 4;
    sil_cuda_ptr pr = a->pos + (uint64_t)r0 * 4, sr = a->seq + (uint64_t)r0 * 4;
    sil_cuda_ptr kc = a->kc, vc = a->vc, btab = a->btab;
    int q_stride = a->q_stride, n_head = a->n_head, n_kv = a->n_head_kv, hd = a->head_dim;
    int n_ctx = a->n_ctx, bps = a->bps, gated = a->gated;
    void *p[] = {&qr,     &ldq,  &q_stride, &orr,   &ldo,  &kc,  &vc,    &pr,    &sr,
                 &n_head, &n_kv, &hd,       &n_ctx, &btab, &bps, &gated, &scores};
    return launch_kv(cu, f, a->kv, KV_ATTEND, (unsigned)n_head, (unsigned)n, p, s, err);
}

bool sil_cuda_fwd_flash_takes(int head_dim)
{
    return head_dim == 64 || head_dim == 128 || head_dim == 256;
}

int sil_cuda_fwd_flash(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                       const struct sil_cuda_attn *a, int64_t r0, int64_t n,
                       struct sil_cuda_stream *s, struct sil_error *err)
{
    const int hd = a->head_dim;
    const int k = hd == 64 ? KV_FLASH64 : hd == 128 ? KV_FLASH128 : hd == 256 ? KV_FLASH256 : -1;
    if (k < 0) return sil_errorf(err, -EINVAL, "cuda: tiled attention of head size %d", hd);
    int64_t ldq = a->ldq, ldo = a->ldo;
    sil_cuda_ptr qr = a->q + (uint64_t)(r0 * ldq) * 4, orr = a->o + (uint64_t)(r0 * ldo) * 4;
    sil_cuda_ptr pr = a->pos + (uint64_t)r0 * 4, sr = a->seq + (uint64_t)r0 * 4;
    sil_cuda_ptr kc = a->kc, vc = a->vc, btab = a->btab;
    int q_stride = a->q_stride, n_head = a->n_head, n_kv = a->n_head_kv, rows = (int)n;
    int bps = a->bps, gated = a->gated;
    void *p[] = {&qr, &ldq,  &q_stride, &orr,  &ldo, &kc,   &vc,  &pr,
                 &sr, &rows, &n_head,   &n_kv, &btab, &bps, &gated};
    return launch_kv(cu, f, a->kv, k, (unsigned)((n + 63) / 64), (unsigned)n_head, p, s, err);
}

int sil_cuda_fwd_attend_part(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                             const struct sil_cuda_attn *a, int64_t r0, int64_t n, int nz, bool gqa,
                             sil_cuda_ptr part, struct sil_cuda_stream *s, struct sil_error *err)
{
    int64_t ldq = a->ldq;
    sil_cuda_ptr qr = a->q + (uint64_t)(r0 * ldq) * 4;
    sil_cuda_ptr pr = a->pos + (uint64_t)r0 * 4, sr = a->seq + (uint64_t)r0 * 4;
    sil_cuda_ptr kc = a->kc, vc = a->vc, btab = a->btab;
    int q_stride = a->q_stride, n_head = a->n_head, n_kv = a->n_head_kv, hd = a->head_dim;
    int n_ctx = a->n_ctx, bps = a->bps;
    void *p[] = {&qr,     &ldq,  &q_stride, &kc,    &vc,   &pr,  &sr,
                 &n_head, &n_kv, &hd,       &n_ctx, &btab, &bps, &part};
    const int k = gqa ? KV_PART_GQA : KV_PART;
    /* the grouped kernel: a warp per query head of the KV head (GQA_MAX 8 warps) */
    return sil_cuda_launch(cu, f->kv_fn[a->kv][k], f->kv_name[a->kv][k],
                           (unsigned)(gqa ? n_kv : n_head), (unsigned)n, (unsigned)nz,
                           gqa ? 256 : 128, s, p, err);
}

int sil_cuda_fwd_attend_combine(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                                const struct sil_cuda_attn *a, int64_t r0, int64_t n, int nz,
                                sil_cuda_ptr part, sil_cuda_ptr q8, int64_t nblocks,
                                struct sil_cuda_stream *s, struct sil_error *err)
{
    int64_t ldq = a->ldq, ldo = a->ldo;
    sil_cuda_ptr qr = a->q + (uint64_t)(r0 * ldq) * 4, orr = a->o + (uint64_t)(r0 * ldo) * 4;
    int q_stride = a->q_stride, n_head = a->n_head, hd = a->head_dim, gated = a->gated;
    void *p[] = {&qr, &ldq, &q_stride, &orr, &ldo, &part, &nz, &n_head, &hd, &gated, &q8, &nblocks};
    return sil_cuda_launch(cu, f->fn[F_ATTEND_COMBINE], f_names[F_ATTEND_COMBINE], (unsigned)n_head,
                           (unsigned)n, cdiv(hd, 32), 128, s, p, err);
}

int sil_cuda_fwd_conv1d(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr x,
                        int64_t ldx, sil_cuda_ptr out, int64_t ldo, sil_cuda_ptr w, int K,
                        int64_t conv_dim, sil_cuda_ptr run_start, sil_cuda_ptr run_seq,
                        sil_cuda_ptr state_tab, int64_t offset, int32_t n_runs,
                        struct sil_cuda_stream *s, struct sil_error *err)
{
    void *p[] = {&x,        &ldx,       &out,     &ldo,       &w,     &K,
                 &conv_dim, &run_start, &run_seq, &state_tab, &offset};
    return launch(cu, f, F_CONV1D, cdiv(conv_dim, 128), (unsigned)n_runs, p, s, err);
}

int sil_cuda_fwd_dn_capture(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr qkv,
                            int64_t ldq, sil_cuda_ptr alpha, int64_t lda, sil_cuda_ptr beta,
                            int64_t ldb, sil_cuda_ptr cap, int64_t rows, sil_cuda_ptr dst,
                            int64_t cd, int nv, struct sil_cuda_stream *s, struct sil_error *err)
{
    void *p[] = {&qkv, &ldq, &alpha, &lda, &beta, &ldb, &cap, &dst, &cd, &nv};
    return launch(cu, f, F_DN_CAPTURE, (unsigned)rows, 1, p, s, err);
}

int sil_cuda_fwd_delta_net(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                           const struct sil_cuda_dn *d, int32_t n_runs, struct sil_cuda_stream *s,
                           struct sil_error *err)
{
    sil_cuda_ptr conv = d->conv, z = d->z, al = d->alpha, be = d->beta, out = d->out;
    sil_cuda_ptr sa = d->a, dt = d->dt_bias, nw = d->norm;
    sil_cuda_ptr rs = d->run_start, rq = d->run_seq, st = d->state_tab;
    int64_t ldc = d->ldc, ldz = d->ldz, lda = d->lda, ldb = d->ldb, ldo = d->ldo;
    int64_t off = d->offset, ssm_off = d->ssm_offset;
    int nk = d->nk, nv = d->nv, dk = d->dk, dv = d->dv;
    float eps = d->eps;
    void *p[] = {&conv, &ldc, &z,  &ldz, &al, &lda, &be, &ldb, &out, &ldo, &sa,     &dt,
                 &nw,   &nk,  &nv, &dk,  &dv, &eps, &rs, &rq,  &st,  &off, &ssm_off};
    return launch(cu, f, F_DELTA_NET, (unsigned)nv, (unsigned)n_runs, p, s, err);
}

int sil_cuda_fwd_delta_rule(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                            const struct sil_cuda_dn *d, int32_t n_runs, sil_cuda_ptr done,
                            sil_cuda_ptr q8, int64_t nblocks, struct sil_cuda_stream *s,
                            struct sil_error *err)
{
    sil_cuda_ptr conv = d->conv, z = d->z, al = d->alpha, be = d->beta, out = d->out;
    sil_cuda_ptr sa = d->a, dt = d->dt_bias, nw = d->norm;
    sil_cuda_ptr rs = d->run_start, rq = d->run_seq, st = d->state_tab;
    int64_t ldc = d->ldc, ldz = d->ldz, lda = d->lda, ldb = d->ldb, ldo = d->ldo;
    int64_t off = d->offset, ssm_off = d->ssm_offset;
    int nk = d->nk, dk = d->dk, dv = d->dv;
    float eps = d->eps;
    void *p[] = {&conv, &ldc, &al, &lda, &be,  &ldb,     &out,  &ldo, &sa,  &dt, &nk, &dk,     &dv,
                 &eps,  &rs,  &rq, &st,  &off, &ssm_off, &done, &z,   &ldz, &nw, &q8, &nblocks};
    return sil_cuda_launch(cu, f->fn[F_DELTA_RULE], f_names[F_DELTA_RULE], (unsigned)d->nv,
                           (unsigned)n_runs, cdiv(dv, 8), 128, s, p, err);
}

int sil_cuda_fwd_gated_norm_q8(struct sil_cuda *cu, const struct sil_cuda_fwd *f,
                               const struct sil_cuda_dn *d, int64_t rows, sil_cuda_ptr q8,
                               int64_t nblocks, struct sil_cuda_stream *s, struct sil_error *err)
{
    sil_cuda_ptr out = d->out, z = d->z, nw = d->norm;
    int64_t ldo = d->ldo, ldz = d->ldz;
    int dv = d->dv;
    float eps = d->eps;
    void *p[] = {&out, &ldo, &z, &ldz, &nw, &dv, &eps, &q8, &nblocks};
    return launch(cu, f, F_GATED_NORM_Q8, (unsigned)d->nv, (unsigned)rows, p, s, err);
}

int sil_cuda_fwd_gate_add(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr y,
                          int64_t ldy, sil_cuda_ptr g, sil_cuda_ptr x, int64_t ldx, int64_t width,
                          int64_t rows, struct sil_cuda_stream *s, struct sil_error *err)
{
    void *p[] = {&y, &ldy, &g, &x, &ldx, &width};
    return launch(cu, f, F_GATE_ADD, cdiv(width, 128), (unsigned)rows, p, s, err);
}

int sil_cuda_fwd_moe_combine(struct sil_cuda *cu, const struct sil_cuda_fwd *f, sil_cuda_ptr out,
                             int64_t ldo, sil_cuda_ptr d, sil_cuda_ptr pair_of, sil_cuda_ptr w,
                             int K, int64_t width, int64_t rows, struct sil_cuda_stream *s,
                             struct sil_error *err)
{
    void *p[] = {&out, &ldo, &d, &pair_of, &w, &K, &width};
    return launch(cu, f, F_MOE_COMBINE, cdiv(width, 128), (unsigned)rows, p, s, err);
}
