/* The CPU backend: the ops of backend.h over kernels/cpu (quantized matmul, element-wise ops)
 * and the gated delta net of delta_net.h, spread over one thread pool. Activations are host
 * memory; weights are read where their handles point (the mmap or host memory).
 *
 * Everything an op needs is sized at create (sil_cpu_config): no op allocates. Results do not
 * depend on the number of threads or on how work is split: every output element is computed
 * by one thread in a fixed order. This backend is the reference other backends are tested
 * against. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/engine/backend.h"
#include "daemon/engine/sampler.h"
#include "kernels/cpu/kv_attn.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/threadpool.h"

struct cpu_backend {
    struct sil_backend base;
    struct sil_cpu_config c;
    struct sil_threadpool *tp;
    void **acts; /* alloc_act's blocks, freed with the backend */
    int n_acts;
    /* matmul: quantized copies of up to two inputs at a time, per-thread scratch, jobs */
    void *in_buf[2];
    float *mm_scratch;       /* [n_threads][matmul scratch] */
    struct sil_mm_job *jobs; /* [2 * n_expert + 8] */
    float *attn_scratch;     /* [n_threads][attn_scratch_floats]: scores */
    int64_t attn_scratch_floats;
    /* split attention (long contexts): partials of (row, head, split), [n_threads][max splits]
     * for a thread that does a head's splits itself, [attn_items] shared when the pool does */
    float *attn_part, *attn_shared;
    int64_t attn_part_floats, attn_items;
    int32_t *attn_start; /* [ub_max + 1]: a shared pass's first item of each row */
    int32_t *attn_group; /* [ub_max + 1]: attend_group's first row of each row group */
    /* tests (SIL_TEST_ATTN_NOISE=R): every attention output element times 1 + R or 1 - R, a
     * sign hashed from (layer, sequence position, column): how far a model's logits move for a
     * change of the size of another summation order (cuda_fwd_parity bounds such variants of
     * the CUDA attention by it); 0: off */
    float attn_noise;
    float *dn_scratch;       /* [n_threads][dn_head_scratch] */
    /* MoE */
    float *router;            /* [ub_max][n_expert] */
    float *moe_gate, *moe_up; /* [ub_max * n_expert_used][n_ff_exp] per pair, in pair order */
    float *moe_down;          /* [ub_max * n_expert_used][n_embd] */
    float *sh_gate, *sh_up;   /* [ub_max][n_ff_shexp] */
    float *sh_logit;          /* [ub_max] */
    float *acc;               /* [n_threads][n_embd] */
    int32_t *iota;            /* [ub_max * n_expert_used] */
    float *head_scratch;      /* [HEAD_ROWS][n_vocab]: the head's logits when none are wanted */
    struct cpu_prof *prof;    /* SIL_CPU_PROFILE, or NULL */
    int mm_cat;               /* the profile category of run_jobs' products */
};

#define HEAD_ROWS 8

/* ---- profile (sil_cpu_config.profile, SIL_CPU_PROFILE=FILE) ------------------------------------------------------------
 * For benchmarks: the wall time of every op, summed per pass size (the rows of a forward pass,
 * 1..PROF_ROWS-1, larger passes together in the last bucket), written to FILE when the backend
 * is freed. "between ops" is what a pass spent outside the ops (the layer loop's own work, such
 * as the MoE plan). Off, each op reads one flag. */
enum {
    P_GET_ROWS,
    P_COPY_ROWS,
    P_QUANT,
    P_MATMUL,
    P_RMSNORM,
    P_ADD,
    P_ADD_NORM,
    P_SWIGLU,
    P_ATTN_PREP,
    P_ATTN,
    P_CONV,
    P_DELTA,
    P_ROUTE_MM,
    P_ROUTE_TOPK,
    P_MOE_GATE_UP,
    P_MOE_SWIGLU,
    P_MOE_DOWN,
    P_MOE_COMBINE,
    P_HEAD,
    P_N
};
static const char *const prof_names[P_N] = {
    "get_rows",     "copy_rows",   "quantize inputs", "matmul (dense)", "rmsnorm",
    "add",          "add+rmsnorm", "swiglu",          "attention prep", "attention",
    "conv1d",       "delta rule",  "router matmul",   "router top-k",   "moe gate/up",
    "moe swiglu",   "moe down",    "moe combine",     "head",
};
#define PROF_ROWS 33
struct cpu_prof {
    char *path;
    int bucket;       /* of the open pass, -1: none */
    double pass_t0;   /* its start */
    double t[PROF_ROWS][P_N];
    uint64_t calls[PROF_ROWS][P_N];
    double pass_t[PROF_ROWS];
    uint64_t passes[PROF_ROWS];
};

static struct cpu_backend *cpu(struct sil_backend *be)
{
    return (struct cpu_backend *)be;
}

static double prof_now(const struct cpu_backend *b)
{
    if (!b->prof) return 0.0;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void prof_add(struct cpu_backend *b, int cat, double t0)
{
    struct cpu_prof *p = b->prof;
    if (!p || p->bucket < 0) return;
    p->t[p->bucket][cat] += prof_now(b) - t0;
    p->calls[p->bucket][cat]++;
}

static void prof_write(const struct cpu_backend *b)
{
    const struct cpu_prof *p = b->prof;
    FILE *fp = fopen(p->path, "w");
    if (!fp) {
        fprintf(stderr, "cpu backend: cannot write the profile %s\n", p->path);
        return;
    }
    fprintf(fp, "# cpu backend profile: %d threads; per pass: ms, calls\n", b->c.n_threads);
    for (int r = 1; r < PROF_ROWS; r++) {
        if (!p->passes[r]) continue;
        const double np = (double)p->passes[r];
        double sum = 0.0;
        fprintf(fp, "rows %s%d: %llu passes, %.3f ms a pass\n", r == PROF_ROWS - 1 ? ">=" : "", r,
                (unsigned long long)p->passes[r], p->pass_t[r] / np * 1e3);
        for (int c = 0; c < P_N; c++) {
            if (!p->calls[r][c]) continue;
            sum += p->t[r][c];
            fprintf(fp, "  %-16s %9.3f ms %7.1f calls\n", prof_names[c], p->t[r][c] / np * 1e3,
                    (double)p->calls[r][c] / np);
        }
        fprintf(fp, "  %-16s %9.3f ms\n", "between ops", (p->pass_t[r] - sum) / np * 1e3);
    }
    fclose(fp);
}

static float *rowp(struct sil_act a, int64_t r)
{
    return (float *)a.data + r * a.ld;
}

/* ---- matmul ----------------------------------------------------------------------------- */

/* Points in at x (rows of x.width, contiguous) with quantized-copy buffer `which`. */
static void mm_input(struct cpu_backend *b, struct sil_mm_input *in, int which, struct sil_act x)
{
    const int64_t rows = b->c.ub_max * (b->c.n_expert_used > 0 ? b->c.n_expert_used : 1);
    sil_mm_input_init(in, x.data, x.rows, x.width, b->c.exact, b->in_buf[which], b->c.k_max, rows);
}

/* y = x W^T over input rows `rows` of in (NULL: rows 0..y.rows-1) */
static struct sil_mm_job mm_job(const struct sil_weight *w, struct sil_mm_input *in,
                                const int32_t *rows, struct sil_act y)
{
    return (struct sil_mm_job){.w = w->data,
                               .wtype = w->type,
                               .m = w->rows,
                               .in = in,
                               .rows = rows,
                               .n_rows = y.rows,
                               .y = y.data,
                               .ldy = y.ld};
}

static void run_jobs(struct cpu_backend *b, struct sil_mm_job *jobs, int n_jobs)
{
    double t0 = prof_now(b);
    for (int i = 0; i < n_jobs; i++)
        sil_mm_input_prepare(b->tp, jobs[i].in, jobs[i].wtype);
    prof_add(b, P_QUANT, t0);
    t0 = prof_now(b);
    sil_matmul(b->tp, jobs, n_jobs, b->mm_scratch, b->c.k_max);
    prof_add(b, b->mm_cat, t0);
}

static void cpu_matmul(struct sil_backend *be, struct sil_act x, const struct sil_mm_out *out,
                       int n)
{
    struct cpu_backend *b = cpu(be);
    struct sil_mm_input in;
    mm_input(b, &in, 0, x);
    for (int i = 0; i < n; i++)
        b->jobs[i] = mm_job(out[i].w, &in, NULL, out[i].y);
    run_jobs(b, b->jobs, n);
}

/* ---- element-wise and per-row ops -------------------------------------------------------- */

/* the first op of a forward pass: opens the pass in the profile (head closes it) */
static void prof_pass(struct cpu_backend *b, int64_t rows, bool open)
{
    struct cpu_prof *p = b->prof;
    if (!p) return;
    const double t = prof_now(b);
    if (p->bucket >= 0) { /* the open pass ends here (a pass without logits has no head) */
        p->pass_t[p->bucket] += t - p->pass_t0;
        p->passes[p->bucket]++;
        p->bucket = -1;
    }
    if (open) {
        p->bucket = rows < PROF_ROWS - 1 ? (int)rows : PROF_ROWS - 1;
        p->pass_t0 = t;
    }
}

static void cpu_get_rows(struct sil_backend *be, const struct sil_weight *w, const int32_t *ids,
                         struct sil_act y)
{
    struct cpu_backend *b = cpu(be);
    prof_pass(b, y.rows, true);
    const double t0 = prof_now(b);
    const size_t rs = sil_row_size(w->type, w->cols);
    for (int64_t i = 0; i < y.rows; i++)
        sil_dequantize_row(w->type, (const char *)w->data + (size_t)ids[i] * rs, rowp(y, i),
                           w->cols);
    prof_add(b, P_GET_ROWS, t0);
}

static void cpu_copy_rows(struct sil_backend *be, struct sil_act y, struct sil_act x,
                          const int32_t *rows)
{
    struct cpu_backend *b = cpu(be);
    const double t0 = prof_now(b);
    for (int64_t i = 0; i < y.rows; i++)
        memcpy(rowp(y, i), rowp(x, rows[i]), sizeof(float) * (size_t)y.width);
    prof_add(b, P_COPY_ROWS, t0);
}

struct norm_task {
    struct sil_act y, x;
    const float *w;
    float eps;
};

static void norm_run(void *arg, long lo, long hi, int ith)
{
    struct norm_task *t = arg;
    (void)ith;
    for (long i = lo; i < hi; i++)
        sil_rmsnorm(rowp(t->y, i), rowp(t->x, i), t->w, t->x.width, t->eps);
}

static void cpu_rmsnorm(struct sil_backend *be, struct sil_act y, struct sil_act x,
                        const struct sil_weight *w, float eps)
{
    struct cpu_backend *b = cpu(be);
    const double t0 = prof_now(b);
    struct norm_task t = {y, x, w->data, eps};
    if (x.rows < 8)
        norm_run(&t, 0, x.rows, 0);
    else
        sil_threadpool_for(b->tp, x.rows, 0, norm_run, &t);
    prof_add(b, P_RMSNORM, t0);
}

static void cpu_add(struct sil_backend *be, struct sil_act y, struct sil_act x)
{
    struct cpu_backend *b = cpu(be);
    const double t0 = prof_now(b);
    if (y.ld == y.width && x.ld == x.width)
        sil_add(y.data, x.data, y.rows * y.width);
    else
        for (int64_t i = 0; i < y.rows; i++)
            sil_add(rowp(y, i), rowp(x, i), y.width);
    prof_add(b, P_ADD, t0);
}

struct add_norm_task {
    struct sil_act y, x, d;
    const float *w;
    float eps;
};

static void add_norm_run(void *arg, long lo, long hi, int ith)
{
    struct add_norm_task *t = arg;
    (void)ith;
    for (long i = lo; i < hi; i++) {
        sil_add(rowp(t->x, i), rowp(t->d, i), t->x.width);
        sil_rmsnorm(rowp(t->y, i), rowp(t->x, i), t->w, t->x.width, t->eps);
    }
}

static void cpu_add_rmsnorm(struct sil_backend *be, struct sil_act y, struct sil_act x,
                            struct sil_act d, const struct sil_weight *w, float eps)
{
    struct cpu_backend *b = cpu(be);
    const double t0 = prof_now(b);
    struct add_norm_task t = {y, x, d, w->data, eps};
    /* from 4 rows the pool pays: the rows were written by other threads (the last matmul) and
     * each reads its own share from their caches */
    if (x.rows < 4)
        add_norm_run(&t, 0, x.rows, 0);
    else
        sil_threadpool_for(b->tp, x.rows, 0, add_norm_run, &t);
    prof_add(b, P_ADD_NORM, t0);
}

struct swiglu_task {
    float *out;
    const float *gate, *up;
    int64_t n;
};

/* item = SWIGLU_SPAN elements */
#define SWIGLU_SPAN 256
static void swiglu_run(void *arg, long lo, long hi, int ith)
{
    struct swiglu_task *t = arg;
    (void)ith;
    const int64_t e0 = lo * SWIGLU_SPAN, e1 = hi * SWIGLU_SPAN < t->n ? hi * SWIGLU_SPAN : t->n;
    sil_swiglu(t->out + e0, t->gate + e0, t->up + e0, e1 - e0);
}

/* rows of width contiguous floats. An element costs an expf (~10 ns): a decode row's experts
 * (8 x 512) are already worth the pool, split by elements, not rows. */
static void swiglu(struct cpu_backend *b, float *out, const float *gate, const float *up,
                   int64_t rows, int64_t width)
{
    struct swiglu_task t = {out, gate, up, rows * width};
    const long items = (long)((t.n + SWIGLU_SPAN - 1) / SWIGLU_SPAN);
    if (t.n < 2048)
        swiglu_run(&t, 0, items, 0);
    else
        sil_threadpool_for(b->tp, items, 0, swiglu_run, &t);
}

static void cpu_swiglu(struct sil_backend *be, struct sil_act y, struct sil_act gate,
                       struct sil_act up)
{
    struct cpu_backend *b = cpu(be);
    const double t0 = prof_now(b);
    swiglu(b, y.data, gate.data, up.data, y.rows, y.width);
    prof_add(b, P_SWIGLU, t0);
}

/* ---- attention ---------------------------------------------------------------------------- */

struct attn_task {
    struct cpu_backend *b;
    const struct sil_ubatch *ub;
    const struct sil_attn_args *a;
    int64_t q_stride; /* floats from one q head to the next inside a row of q */
    sil_from_float_fn to_kv; /* F32 row -> the cache's element type */
    const struct sil_kv_kernels *kk;
    int heads_per_item; /* attend_group: query heads of one KV head an item takes */
};

/* Per row: q/k norm, rope, K and V into the cache (converted to its element type). */
static void qk_prep(void *arg, long lo, long hi, int ith)
{
    struct attn_task *t = arg;
    const struct sil_attn_args *a = t->a;
    const int hd = a->head_dim, nkv = a->n_head_kv;
    const float *qn = a->q_norm->data, *kn = a->k_norm->data;
    (void)ith;
    for (long i = lo; i < hi; i++) {
        const int32_t pos = t->ub->pos[i], seq = t->ub->seq[i];
        const int32_t rp = t->ub->tree ? t->ub->tree[i].rope_pos : pos; /* a tree node: depth */
        float *q = rowp(a->q, i);
        for (int h = 0; h < a->n_head; h++) {
            float *qh = q + h * t->q_stride;
            sil_rmsnorm(qh, qh, qn, hd, a->eps);
            sil_rope_neox(qh, 1, hd, a->n_rot, rp, a->rope_freq_base);
        }
        float *k = rowp(a->k, i);
        for (int h = 0; h < nkv; h++)
            sil_rmsnorm(k + h * hd, k + h * hd, kn, hd, a->eps);
        sil_rope_neox(k, nkv, hd, a->n_rot, rp, a->rope_freq_base);
        t->to_kv(k, sil_kv_k(a->kv, a->layer, seq, pos), (int64_t)nkv * hd);
        t->to_kv(rowp(a->v, i), sil_kv_v(a->kv, a->layer, seq, pos), (int64_t)nkv * hd);
    }
}

/* Positions per split of a long context: a row at position pos attends in
 * ceil((pos + 1) / ATTN_SPAN) splits, each with its own max and sum, merged in split order; one
 * split is the plain softmax. The split depends on the position alone, never on the batch or the
 * threads, so a row's result is the same whoever computes it: a thread alone over all splits of
 * a head (many rows and heads), or the pool over every (row, head, split) item (a decode of few
 * rows, where heads alone would leave threads idle over the whole context). */
#define ATTN_SPAN (8 * SIL_KV_BLOCK)
/* (row, head) pairs of one item of attend_group */
#define ATTN_PAIRS 16

static int32_t attn_splits(int32_t n)
{
    return (n + ATTN_SPAN - 1) / ATTN_SPAN;
}

/* One (row, head): its query (quantized into qq when the kernels want it), KV head, table, and
 * for a token tree's row the positions it sees (struct sil_tree_row; NULL: all). */
struct attn_head {
    const float *q;
    const void *qq;
    int kvh;
    const int32_t *table;
    const struct sil_tree_row *tree;
};

static struct attn_head attn_head_of(const struct attn_task *t, long i, int h, uint8_t *qq)
{
    const struct sil_attn_args *a = t->a;
    struct attn_head ah = {rowp(a->q, i) + h * t->q_stride, qq, h / (a->n_head / a->n_head_kv),
                           NULL, t->ub->tree ? &t->ub->tree[i] : NULL};
    int32_t nb;
    ah.table = sil_kv_seq_table(a->kv, t->ub->seq[i], &nb);
    if (t->kk->q8_query) sil_type_traits(SIL_TYPE_Q8_0)->from_float(ah.q, qq, a->head_dim);
    return ah;
}

/* o *= sigmoid(g) for a gated head, g the second half of its q */
static void head_gate(const struct attn_task *t, const float *q, float *o)
{
    if (!t->a->gated) return;
    const float *g = q + t->a->head_dim;
    for (int j = 0; j < t->a->head_dim; j++)
        o[j] *= sil_sigmoid(g[j]);
}

/* o = the splits' partials (each hd + 2 floats) merged in split order */
static void head_merge(const float *parts, int32_t n_split, int hd, float *o)
{
    float mx = -INFINITY;
    for (int32_t s = 0; s < n_split; s++)
        mx = parts[(int64_t)s * (hd + 2)] > mx ? parts[(int64_t)s * (hd + 2)] : mx;
    double sum = 0.0;
    memset(o, 0, sizeof(float) * (size_t)hd);
    for (int32_t s = 0; s < n_split; s++) {
        const float *p = parts + (int64_t)s * (hd + 2);
        const float w = expf(p[0] - mx);
        sum += (double)w * p[1];
        for (int j = 0; j < hd; j++)
            o[j] += w * p[2 + j];
    }
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < hd; j++)
        o[j] *= inv;
}

/* The one place attention's arithmetic happens: split s of np (row, head) pairs of one sequence
 * and one KV head, block by block together, so a K or V block is read from memory once for all
 * of them and from L1 after. Pair j (context n[j]) with one split (n[j] <= ATTN_SPAN) gets its
 * plain softmax attention in dst[j] (the head's output, ungated); with more, the split's partial
 * {max, sum of exp(score - max), sum of exp(score - max) V} in dst[j] (hd + 2 floats). A pair
 * whose context ends before the split is left alone. Scores go to sc[j * ATTN_SPAN ...]. Every
 * caller goes through here, so a pair's bits do not depend on which pairs share the call. */
static void attend_pairs(const struct attn_task *t, const struct attn_head *ah, const int32_t *n,
                         int np, int32_t s, float *sc, float *const *dst)
{
    const struct sil_attn_args *a = t->a;
    const struct sil_kv_cache *kv = a->kv;
    const int hd = a->head_dim;
    const size_t rk = sil_kv_row_bytes_k(kv), rv = sil_kv_row_bytes_v(kv);
    const size_t hb = sil_kv_head_bytes(kv);
    const float scale = 1.0f / sqrtf((float)hd);
    const int32_t p0 = s * ATTN_SPAN;
    int32_t p1[ATTN_PAIRS], pe = p0;
    for (int j = 0; j < np; j++) {
        p1[j] = p0 + ATTN_SPAN < n[j] ? p0 + ATTN_SPAN : n[j];
        pe = p1[j] > pe ? p1[j] : pe;
    }
    for (int32_t p = p0; p < pe; p += SIL_KV_BLOCK) {
        const char *kb = (const char *)sil_kv_block_k(kv, a->layer, ah[0].table[p / SIL_KV_BLOCK]) +
                         ah[0].kvh * hb;
        for (int j = 0; j < np; j++)
            if (p < p1[j])
                t->kk->scores(ah[j].q, ah[j].qq, kb, rk,
                              p1[j] - p < SIL_KV_BLOCK ? p1[j] - p : SIL_KV_BLOCK, hd, scale,
                              sc + (int64_t)j * ATTN_SPAN + (p - p0));
    }
    float *acc[ATTN_PAIRS];
    for (int j = 0; j < np; j++) {
        float *scj = sc + (int64_t)j * ATTN_SPAN;
        acc[j] = dst[j];
        /* a tree's row: the positions it does not see score -inf, so they weigh exactly 0 and
         * the sums over those it sees are a plain row's of its path, term for term */
        bool none = false;
        if (ah[j].tree && p0 < n[j]) {
            const struct sil_tree_row *tr = ah[j].tree;
            int32_t seen = tr->lo > p0 ? (tr->lo < p1[j] ? tr->lo : p1[j]) - p0 : 0;
            for (int32_t p = tr->lo > p0 ? tr->lo : p0; p < p1[j]; p++) {
                const int32_t d = p - tr->lo;
                if (d < 64 && (tr->mask >> d) & 1u)
                    seen++;
                else
                    scj[p - p0] = -INFINITY;
            }
            none = seen == 0;
        }
        if (p0 >= n[j]) {
            acc[j] = NULL;
        } else if (none) { /* a split of none but hidden positions: nothing to add */
            dst[j][0] = -INFINITY;
            dst[j][1] = 0.0f;
            memset(dst[j] + 2, 0, sizeof(float) * (size_t)hd);
            acc[j] = NULL;
        } else if (n[j] <= ATTN_SPAN) {
            sil_softmax(scj, n[j]);
            memset(dst[j], 0, sizeof(float) * (size_t)hd);
        } else {
            double sum;
            dst[j][0] = sil_softmax_exp(scj, p1[j] - p0, &sum);
            dst[j][1] = (float)sum;
            memset(dst[j] + 2, 0, sizeof(float) * (size_t)hd);
            acc[j] = dst[j] + 2;
        }
    }
    for (int32_t p = p0; p < pe; p += SIL_KV_BLOCK) {
        const char *vb = (const char *)sil_kv_block_v(kv, a->layer, ah[0].table[p / SIL_KV_BLOCK]) +
                         ah[0].kvh * hb;
        for (int j = 0; j < np; j++)
            if (acc[j] && p < p1[j])
                t->kk->accum(acc[j], sc + (int64_t)j * ATTN_SPAN + (p - p0), vb, rv,
                             p1[j] - p < SIL_KV_BLOCK ? p1[j] - p : SIL_KV_BLOCK, hd);
    }
}

/* item = (group of rows of one sequence, group of query heads of one KV head): every split of
 * its pairs one after another into this thread's partials, then their merge */
static void attend_group(void *arg, long lo, long hi, int ith)
{
    struct attn_task *t = arg;
    const struct sil_attn_args *a = t->a;
    const int hd = a->head_dim, hg = t->heads_per_item, n_hgroup = a->n_head / hg;
    float *sc = t->b->attn_scratch + (int64_t)ith * t->b->attn_scratch_floats;
    float *parts = t->b->attn_part + (int64_t)ith * t->b->attn_part_floats;
    _Alignas(32) uint8_t qq[ATTN_PAIRS][SIL_KV_HEAD_MAX / 32 * 34];
    for (long it = lo; it < hi; it++) {
        const int32_t g = (int32_t)(it / n_hgroup), h0 = (int)(it % n_hgroup) * hg;
        const int32_t i0 = t->b->attn_group[g], i1 = t->b->attn_group[g + 1];
        struct attn_head ah[ATTN_PAIRS];
        int32_t n[ATTN_PAIRS], np = 0, max_split = 0;
        float *o[ATTN_PAIRS], *dst[ATTN_PAIRS];
        for (int32_t i = i0; i < i1; i++)
            for (int h = h0; h < h0 + hg; h++, np++) {
                ah[np] = attn_head_of(t, i, h, qq[np]);
                n[np] = t->ub->pos[i] + 1;
                o[np] = rowp(a->o, i) + h * hd;
                max_split = attn_splits(n[np]) > max_split ? attn_splits(n[np]) : max_split;
            }
        for (int32_t s = 0; s < max_split; s++) {
            for (int j = 0; j < np; j++)
                dst[j] = n[j] <= ATTN_SPAN ? o[j]
                                           : parts + ((int64_t)j * max_split + s) * (hd + 2);
            attend_pairs(t, ah, n, np, s, sc, dst);
        }
        for (int j = 0; j < np; j++) {
            if (n[j] > ATTN_SPAN)
                head_merge(parts + (int64_t)j * max_split * (hd + 2), attn_splits(n[j]), hd, o[j]);
            head_gate(t, ah[j].q, o[j]);
        }
    }
}

/* item = (row, head, split) of a row with splits, its partial into attn_shared at the item's
 * index (merged by the caller); (row, head) of a row without, its output whole */
static void attend_split(void *arg, long lo, long hi, int ith)
{
    struct attn_task *t = arg;
    const int hd = t->a->head_dim;
    const int32_t *start = t->b->attn_start;
    float *sc = t->b->attn_scratch + (int64_t)ith * t->b->attn_scratch_floats;
    _Alignas(32) uint8_t qq[SIL_KV_HEAD_MAX / 32 * 34];
    long i = 0;
    for (long it = lo; it < hi; it++) {
        while (it >= start[i + 1])
            i++;
        const int32_t n = t->ub->pos[i] + 1, n_split = attn_splits(n);
        const long local = it - start[i];
        const int h = (int)(local / n_split);
        const struct attn_head ah = attn_head_of(t, i, h, qq);
        float *o = rowp(t->a->o, i) + h * hd;
        float *dst = n_split == 1 ? o : t->b->attn_shared + it * (hd + 2);
        attend_pairs(t, &ah, &n, 1, (int32_t)(local % n_split), sc, &dst);
        if (n_split == 1) head_gate(t, ah.q, o);
    }
}

static void cpu_attention(struct sil_backend *be, const struct sil_ubatch *ub,
                          const struct sil_attn_args *a)
{
    const int gt = sil_kv_ggml_type(sil_kv_type(a->kv));
    struct attn_task t = {cpu(be), ub, a, a->gated ? 2 * a->head_dim : a->head_dim,
                          sil_type_traits(gt)->from_float, sil_kv_kernels(gt), 1};
    double t0 = prof_now(t.b);
    sil_threadpool_for(t.b->tp, ub->n, 0, qk_prep, &t);
    prof_add(t.b, P_ATTN_PREP, t0);
    t0 = prof_now(t.b);
    /* items of (rows of one sequence, query heads of one KV head), up to ATTN_PAIRS pairs */
    const int group = a->n_head / a->n_head_kv;
    int hg = group < ATTN_PAIRS ? group : ATTN_PAIRS;
    while (group % hg)
        hg--;
    t.heads_per_item = hg;
    const int32_t rows_max = ATTN_PAIRS / hg;
    int32_t *gs = t.b->attn_group, n_groups = 0;
    gs[0] = 0;
    for (int32_t i = 1; i <= ub->n; i++)
        if (i == ub->n || ub->seq[i] != ub->seq[i - 1] || i - gs[n_groups] == rows_max)
            gs[++n_groups] = i;
    int32_t *start = t.b->attn_start;
    const long items = (long)n_groups * (a->n_head / hg);
    /* few items for the threads and a long context: the pool takes (row, head, split) items */
    bool split = items < 4L * t.b->c.n_threads && t.b->c.n_threads > 1;
    if (split) {
        bool any = false;
        start[0] = 0;
        for (int32_t i = 0; i < ub->n; i++) {
            const int32_t ns = attn_splits(ub->pos[i] + 1);
            any = any || ns > 1;
            start[i + 1] = start[i] + a->n_head * ns;
        }
        split = any && start[ub->n] <= t.b->attn_items;
    }
    if (!split) {
        sil_threadpool_for(t.b->tp, items, 1, attend_group, &t);
    } else {
        sil_threadpool_for(t.b->tp, start[ub->n], 1, attend_split, &t);
        const int hd = a->head_dim;
        for (int32_t i = 0; i < ub->n; i++) {
            const int32_t ns = attn_splits(ub->pos[i] + 1);
            if (ns == 1) continue; /* done whole */
            for (int h = 0; h < a->n_head; h++) {
                float *o = rowp(a->o, i) + h * hd;
                head_merge(t.b->attn_shared + (int64_t)(start[i] + h * ns) * (hd + 2), ns, hd, o);
                head_gate(&t, rowp(a->q, i) + h * t.q_stride, o);
            }
        }
    }
    prof_add(t.b, P_ATTN, t0);
    if (t.b->attn_noise > 0.0f)
        for (int32_t i = 0; i < ub->n; i++) {
            float *o = (float *)a->o.data + (int64_t)i * a->o.ld;
            for (int64_t c = 0; c < (int64_t)a->n_head * a->head_dim; c++) {
                uint32_t h = (uint32_t)a->layer * 0x9e3779b1u ^ (uint32_t)ub->pos[i] * 0x85ebca6bu ^
                             (uint32_t)c * 0xc2b2ae35u;
                h ^= h >> 15;
                h *= 0x2c1b3c6du;
                h ^= h >> 12;
                o[c] *= h & 1u ? 1.0f + t.b->attn_noise : 1.0f - t.b->attn_noise;
            }
        }
}

/* ---- gated delta net ------------------------------------------------------------------------ */

struct dn_task {
    struct cpu_backend *b;
    const struct sil_ubatch *ub;
    const struct sil_delta_net_args *a;
    long conv_chunks; /* channel ranges per sequence in the conv phase */
};

/* The sequence run r: its rows [*r0, *r0 + *nt) and its state for this layer. */
static void run_state(const struct dn_task *t, long r, int32_t *r0, int32_t *nt,
                      struct sil_delta_net_state *st)
{
    const struct sil_ubatch *ub = t->ub;
    *r0 = ub->run_start[r];
    *nt = ub->run_start[r + 1] - *r0;
    float *state = t->a->state.seq_state[ub->seq[*r0]] + t->a->state.offset;
    sil_delta_net_state_bind(t->a->p, st, state);
}

/* item = (sequence run, channel range) */
static void dn_conv(void *arg, long lo, long hi, int ith)
{
    struct dn_task *t = arg;
    const struct sil_delta_net_args *a = t->a;
    (void)ith;
    for (long it = lo; it < hi; it++) {
        const long r = it / t->conv_chunks, ci = it % t->conv_chunks;
        int32_t r0, nt;
        struct sil_delta_net_state st;
        run_state(t, r, &r0, &nt, &st);
        long c0, c1;
        sil_split_range((long)a->qkv_mixed.width, (int)ci, (int)t->conv_chunks, &c0, &c1);
        sil_delta_net_conv(a->p, &st, nt, rowp(a->qkv_mixed, r0), rowp(a->conv_out, r0), c0, c1);
    }
}

static void cpu_conv1d(struct sil_backend *be, const struct sil_ubatch *ub,
                       const struct sil_delta_net_args *a)
{
    const long nth = cpu(be)->c.n_threads;
    /* decode of N sequences is one task, not N: few runs are split over channel ranges */
    const long chunks = ub->n_runs >= 4 * nth ? 1 : (4 * nth + ub->n_runs - 1) / ub->n_runs;
    struct dn_task t = {cpu(be), ub, a, chunks};
    const double t0 = prof_now(t.b);
    sil_threadpool_for(t.b->tp, (long)ub->n_runs * chunks, 0, dn_conv, &t);
    prof_add(t.b, P_CONV, t0);
}

/* The reference of the fused op: the two ops in turn. */
static void cpu_matmul_conv1d(struct sil_backend *be, const struct sil_ubatch *ub, struct sil_act x,
                              const struct sil_mm_out *out, int n,
                              const struct sil_delta_net_args *a)
{
    cpu_matmul(be, x, out, n);
    cpu_conv1d(be, ub, a);
}

/* item = (sequence run, value head) */
static void dn_heads(void *arg, long lo, long hi, int ith)
{
    struct dn_task *t = arg;
    const struct sil_delta_net_args *a = t->a;
    const int nv = a->p->n_v_heads;
    for (long it = lo; it < hi; it++) {
        const long r = it / nv;
        const int32_t h = (int32_t)(it % nv);
        int32_t r0, nt;
        struct sil_delta_net_state st;
        run_state(t, r, &r0, &nt, &st);
        sil_delta_net_heads(a->p, &st, nt, rowp(a->conv_out, r0), rowp(a->z, r0),
                            rowp(a->alpha, r0), rowp(a->beta, r0), rowp(a->out, r0), h, h + 1,
                            t->b->dn_scratch + (int64_t)ith * t->b->c.dn_head_scratch);
    }
}

static void cpu_delta_net(struct sil_backend *be, const struct sil_ubatch *ub,
                          const struct sil_delta_net_args *a)
{
    struct dn_task t = {cpu(be), ub, a, 1};
    const double t0 = prof_now(t.b);
    sil_threadpool_for(t.b->tp, (long)ub->n_runs * a->p->n_v_heads, 0, dn_heads, &t);
    prof_add(t.b, P_DELTA, t0);
}

/* ---- router and experts ------------------------------------------------------------------ */

/* Rows from which the per-row steps of route and moe (softmax and top-k, the weighted sum of
 * the experts) go to the pool: below it they are a few microseconds of caller time. */
#define PAR_ROWS 4

struct route_task {
    const float *router; /* [n][X] logits, softmaxed in place */
    int X, K;
    struct sil_moe_plan *plan;
};

static void route_rows(void *arg, long lo, long hi, int ith)
{
    struct route_task *t = arg;
    const int X = t->X, K = t->K;
    (void)ith;
    for (long i = lo; i < hi; i++) {
        float *p = (float *)t->router + (int64_t)i * X;
        sil_softmax(p, X);
        int32_t *sel = t->plan->sel_expert + (int64_t)i * K;
        float *wt = t->plan->sel_weight + (int64_t)i * K;
        /* selection by repeated max: K is small (8) and this keeps ties in index order */
        float sum = 0.0f;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < X; e++) {
                bool taken = false;
                for (int j = 0; j < k; j++)
                    taken = taken || sel[j] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            sel[k] = best;
            wt[k] = p[best];
            sum += p[best];
        }
        if (t->plan->force_sel) { /* a replay: its choices, measured against the top-k */
            const int32_t *fs = t->plan->force_sel + (int64_t)i * K;
            const float kth = p[sel[K - 1]];
            bool bad = false;
            for (int k = 0; k < K && !bad; k++) {
                bad = fs[k] < 0 || fs[k] >= X;
                for (int j = 0; j < k && !bad; j++)
                    bad = fs[j] == fs[k];
            }
            if (bad) {
                t->plan->force_bad = true;
                continue;
            }
            for (int k = 0; k < K; k++) {
                bool own = false;
                for (int j = 0; j < K; j++)
                    own = own || sel[j] == fs[k];
                if (!own) {
                    const float gap = logf(kth / fmaxf(p[fs[k]], 1e-30f));
                    t->plan->force_changed++;
                    if (gap > t->plan->force_gap) t->plan->force_gap = gap;
                }
            }
            sum = 0.0f;
            for (int k = 0; k < K; k++) {
                sel[k] = fs[k];
                wt[k] = p[fs[k]];
                sum += wt[k];
            }
        }
        if (sum < 6.103515625e-5f) sum = 6.103515625e-5f; /* the reference clamps the sum so */
        for (int k = 0; k < K; k++)
            wt[k] /= sum;
    }
}

static void cpu_route(struct sil_backend *be, struct sil_act x, const struct sil_weight *w,
                      int n_used, struct sil_moe_plan *plan)
{
    struct cpu_backend *b = cpu(be);
    const int X = (int)w->rows, K = n_used, n = (int)x.rows;
    struct sil_mm_out logits = {w, {b->router, x.rows, X, X}};
    b->mm_cat = P_ROUTE_MM;
    cpu_matmul(be, x, &logits, 1);
    b->mm_cat = P_MATMUL;
    const double t0 = prof_now(b);
    plan->n_rows = n;
    plan->n_used = K;
    /* rows are independent: with many threads the serial per-row steps would bound the step */
    struct route_task t = {b->router, X, K, plan};
    if (n < PAR_ROWS || plan->force_sel) /* a replay's counts are summed by one thread */
        route_rows(&t, 0, n, 0);
    else
        sil_threadpool_for(b->tp, n, 1, route_rows, &t);
    prof_add(b, P_ROUTE_TOPK, t0);
}

struct combine_task {
    struct cpu_backend *b;
    const struct sil_moe_plan *pl;
    struct sil_act out;
};

/* out row i = its experts' down outputs weighted in slot order (+ the gated shared expert,
 * already in out); each thread sums into its own accumulator */
/* The reference of the fused op: the two ops in turn. */
static void cpu_add_rmsnorm_route(struct sil_backend *be, struct sil_act y, struct sil_act x,
                                  struct sil_act d, const struct sil_weight *norm, float eps,
                                  const struct sil_weight *w, int n_used, struct sil_moe_plan *plan)
{
    cpu_add_rmsnorm(be, y, x, d, norm, eps);
    cpu_route(be, y, w, n_used, plan);
}

static void combine_rows(void *arg, long lo, long hi, int ith)
{
    const struct combine_task *t = arg;
    const struct sil_moe_plan *pl = t->pl;
    const int64_t K = pl->n_used, E = t->out.width;
    const bool shexp = pl->sh_gate_inp != NULL;
    float *acc = t->b->acc + (int64_t)ith * E;
    for (long i = lo; i < hi; i++) {
        float *o = rowp(t->out, i);
        if (shexp) {
            const float g = sil_sigmoid(t->b->sh_logit[i]);
            for (int64_t j = 0; j < E; j++)
                o[j] *= g;
        }
        /* experts summed in slot order first, then the shared expert added, as the reference */
        memset(acc, 0, sizeof(float) * (size_t)E);
        for (int64_t k = 0; k < K; k++) {
            const int64_t q = i * K + k;
            sil_axpy(acc, pl->sel_weight[q], t->b->moe_down + (int64_t)pl->pair_of[q] * E, E);
        }
        if (shexp)
            sil_add(o, acc, E);
        else
            memcpy(o, acc, sizeof(float) * (size_t)E);
    }
}

static void cpu_moe(struct sil_backend *be, struct sil_act x, const struct sil_moe_plan *pl,
                    struct sil_act out)
{
    struct cpu_backend *b = cpu(be);
    const int64_t n = pl->n_rows, K = pl->n_used, E = out.width, P = n * K;
    const bool shexp = pl->sh_gate_inp != NULL;
    const int64_t F = pl->n_active > 0 ? pl->gate[0].rows : 0;
    const int64_t S = shexp ? pl->sh_gate->rows : 0;

    /* gate and up of every active expert (+ the shared expert and its gate logit) in one
     * parallel matmul; pair j's rows land at row j of moe_gate / moe_up. Where gate and up are
     * of one type a job takes both and applies the SwiGLU to its rows as they are done (the
     * bits of the separate products and sil_swiglu after). */
    struct sil_mm_input in, in_h, in_s;
    mm_input(b, &in, 0, x);
    int nj = 0;
    const bool fuse = pl->n_active > 0 && pl->gate[0].type == pl->up[0].type;
    for (int a = 0; a < pl->n_active; a++) {
        const int32_t off = pl->pair_start[a], cnt = pl->pair_start[a + 1] - off;
        const int32_t *rows = pl->pair_row + off;
        b->jobs[nj++] =
            mm_job(&pl->gate[a], &in, rows, (struct sil_act){b->moe_gate + off * F, cnt, F, F});
        if (fuse) {
            b->jobs[nj - 1].w_up = pl->up[a].data;
            b->jobs[nj - 1].y_up = b->moe_up + off * F;
        } else {
            b->jobs[nj++] =
                mm_job(&pl->up[a], &in, rows, (struct sil_act){b->moe_up + off * F, cnt, F, F});
        }
    }
    const bool sh_fuse = shexp && pl->sh_gate->type == pl->sh_up->type;
    if (shexp) {
        b->jobs[nj++] = mm_job(pl->sh_gate, &in, NULL, (struct sil_act){b->sh_gate, n, S, S});
        if (sh_fuse) {
            b->jobs[nj - 1].w_up = pl->sh_up->data;
            b->jobs[nj - 1].y_up = b->sh_up;
        } else {
            b->jobs[nj++] = mm_job(pl->sh_up, &in, NULL, (struct sil_act){b->sh_up, n, S, S});
        }
        b->jobs[nj++] = mm_job(pl->sh_gate_inp, &in, NULL, (struct sil_act){b->sh_logit, n, 1, 1});
    }
    b->mm_cat = P_MOE_GATE_UP;
    run_jobs(b, b->jobs, nj);

    double t0 = prof_now(b);
    if (!fuse) swiglu(b, b->moe_gate, b->moe_gate, b->moe_up, P, F);
    if (shexp && !sh_fuse) swiglu(b, b->sh_gate, b->sh_gate, b->sh_up, n, S);
    if (!fuse || (shexp && !sh_fuse)) prof_add(b, P_MOE_SWIGLU, t0);

    /* down projections: experts into moe_down [P][E], the shared expert into out [n][E] */
    mm_input(b, &in_h, 1, (struct sil_act){b->moe_gate, P, F, F});
    nj = 0;
    for (int a = 0; a < pl->n_active; a++) {
        const int32_t off = pl->pair_start[a], cnt = pl->pair_start[a + 1] - off;
        b->jobs[nj++] = mm_job(&pl->down[a], &in_h, b->iota + off,
                               (struct sil_act){b->moe_down + off * E, cnt, E, E});
    }
    if (shexp) {
        /* the shared down input needs its own quantized copy: buffer 0 is free again now */
        mm_input(b, &in_s, 0, (struct sil_act){b->sh_gate, n, S, S});
        b->jobs[nj++] = mm_job(pl->sh_down, &in_s, NULL, out);
    }
    b->mm_cat = P_MOE_DOWN;
    run_jobs(b, b->jobs, nj);
    b->mm_cat = P_MATMUL;

    t0 = prof_now(b);
    struct combine_task t = {b, pl, out};
    if (n < PAR_ROWS)
        combine_rows(&t, 0, n, 0);
    else
        sil_threadpool_for(b->tp, n, 1, combine_rows, &t);
    prof_add(b, P_MOE_COMBINE, t0);
}

/* ---- output head ------------------------------------------------------------------------ */

static void cpu_head(struct sil_backend *be, struct sil_act x, const struct sil_weight *w,
                     const int32_t *out_rows, float *logits, int32_t *argmax)
{
    struct cpu_backend *b = cpu(be);
    const int64_t V = w->rows;
    struct sil_mm_input in;
    /* into logits all at once, or (argmax alone) a few rows at a time through scratch: no op
     * allocates */
    static const int32_t local[] = {0, 1, 2, 3, 4, 5, 6, 7};
    _Static_assert(sizeof(local) / sizeof(local[0]) == HEAD_ROWS, "one index a scratch row");
    if (!logits && (!argmax || !b->head_scratch || V > b->c.n_vocab)) {
        prof_pass(b, 0, false);
        return;
    }
    b->mm_cat = P_HEAD;
    const int64_t step = logits ? x.rows : HEAD_ROWS;
    for (int64_t r0 = 0; r0 < x.rows; r0 += step) {
        const int64_t n = x.rows - r0 < step ? x.rows - r0 : step;
        float *dst = logits ? logits : b->head_scratch;
        const int32_t *rows = logits ? out_rows : local;
        mm_input(b, &in, 0, sil_act_rows(x, r0, n));
        struct sil_mm_job j = mm_job(w, &in, NULL, (struct sil_act){dst, n, V, V});
        j.out_rows = rows;
        run_jobs(b, &j, 1);
        for (int64_t i = 0; argmax && i < n; i++)
            argmax[out_rows[r0 + i]] = sil_argmax(dst + (int64_t)rows[i] * V, (int32_t)V);
    }
    b->mm_cat = P_MATMUL;
    prof_pass(b, 0, false);
}

/* ---- lifetime ------------------------------------------------------------------------------ */

static void *cpu_alloc_act(struct sil_backend *be, size_t bytes)
{
    struct cpu_backend *b = cpu(be);
    void **acts = realloc(b->acts, sizeof(void *) * (size_t)(b->n_acts + 1));
    if (!acts) return NULL;
    b->acts = acts;
    void *p = calloc(bytes ? bytes : 1, 1);
    if (p) b->acts[b->n_acts++] = p;
    return p;
}

static void cpu_free(struct sil_backend *be)
{
    struct cpu_backend *b = cpu(be);
    if (!b) return;
    if (b->prof) {
        prof_pass(b, 0, false);
        prof_write(b);
        free(b->prof->path);
        free(b->prof);
    }
    void *ptrs[] = {b->in_buf[0],  b->in_buf[1], b->mm_scratch, b->jobs,   b->attn_scratch, b->attn_part, b->attn_shared, b->attn_start, b->attn_group,
                    b->dn_scratch, b->router,    b->moe_gate,   b->moe_up, b->moe_down,
                    b->sh_gate,    b->sh_up,     b->sh_logit,   b->acc,    b->iota,
                    b->head_scratch};
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++)
        free(ptrs[i]);
    for (int i = 0; i < b->n_acts; i++)
        free(b->acts[i]);
    free(b->acts);
    sil_threadpool_free(b->tp);
    free(b);
}

static int cpu_status(struct sil_backend *be, struct sil_error *err)
{
    if (!sil_threadpool_faulted(cpu(be)->tp)) return 0;
    return sil_errorf(err, -EIO, "cpu backend: a worker's read of the model mapping faulted");
}

static const struct sil_backend_ops cpu_ops = {
    .name = "cpu",
    .free = cpu_free,
    .status = cpu_status,
    .alloc_act = cpu_alloc_act,
    .get_rows = cpu_get_rows,
    .copy_rows = cpu_copy_rows,
    .matmul = cpu_matmul,
    .rmsnorm = cpu_rmsnorm,
    .add = cpu_add,
    .add_rmsnorm = cpu_add_rmsnorm,
    .swiglu = cpu_swiglu,
    .attention = cpu_attention,
    .conv1d = cpu_conv1d,
    .matmul_conv1d = cpu_matmul_conv1d,
    .delta_net = cpu_delta_net,
    .route = cpu_route,
    .add_rmsnorm_route = cpu_add_rmsnorm_route,
    .moe = cpu_moe,
    .head = cpu_head,
};

static void *xcalloc(size_t n, size_t sz, bool *fail)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p) *fail = true;
    return p;
}

int sil_backend_cpu_create(struct sil_backend **out, const struct sil_cpu_config *c,
                           struct sil_error *err)
{
    struct cpu_backend *b = calloc(1, sizeof(*b));
    if (!b) return sil_errorf(err, -ENOMEM, "cpu backend: out of memory");
    b->base.ops = &cpu_ops;
    b->c = *c;
    b->attn_noise = c->attn_noise > 0.0f && c->attn_noise < 0.1f ? c->attn_noise : 0.0f;
    b->mm_cat = P_MATMUL;
    const char *pf = c->profile;
    if (pf && *pf) {
        b->prof = calloc(1, sizeof(*b->prof));
        if (b->prof) b->prof->path = strdup(pf);
        if (!b->prof || !b->prof->path) {
            free(b->prof);
            free(b);
            return sil_errorf(err, -ENOMEM, "cpu backend: out of memory");
        }
        b->prof->bucket = -1;
    }
    int rc = sil_threadpool_create(&b->tp, c->n_threads);
    if (rc < 0) {
        if (b->prof) free(b->prof->path);
        free(b->prof);
        free(b);
        return sil_errorf(err, rc, "cpu backend: cannot start %d threads", c->n_threads);
    }
    const int64_t U = c->ub_max, K = c->n_expert_used, X = c->n_expert, nth = c->n_threads;
    bool fail = false;
    const size_t ib = sil_mm_input_bytes_all(c->k_max, U * (K > 0 ? K : 1));
    b->in_buf[0] = xcalloc(ib, 1, &fail);
    b->in_buf[1] = xcalloc(ib, 1, &fail);
    b->mm_scratch =
        xcalloc((size_t)(nth * sil_matmul_scratch_floats(c->k_max)), sizeof(float), &fail);
    b->jobs = xcalloc((size_t)(2 * X + 8), sizeof(struct sil_mm_job), &fail);
    {
        const int64_t hd = c->head_dim > 0 ? c->head_dim : SIL_KV_HEAD_MAX;
        const int64_t max_split = (c->n_ctx + ATTN_SPAN - 1) / ATTN_SPAN;
        b->attn_scratch_floats = ATTN_PAIRS * ATTN_SPAN; /* a split's scores of every pair */
        b->attn_scratch = xcalloc((size_t)(nth * b->attn_scratch_floats), sizeof(float), &fail);
        b->attn_part_floats = ATTN_PAIRS * max_split * (hd + 2);
        b->attn_part = xcalloc((size_t)(nth * b->attn_part_floats), sizeof(float), &fail);
        /* a shared pass has fewer than 4 * n_threads items of at most ATTN_PAIRS (row, head)
         * pairs; one of more (row, head, split) items than this goes through the groups */
        b->attn_items = 16 * nth * max_split;
        b->attn_shared = xcalloc((size_t)(b->attn_items * (hd + 2)), sizeof(float), &fail);
        b->attn_start = xcalloc((size_t)U + 1, sizeof(int32_t), &fail);
        b->attn_group = xcalloc((size_t)U + 1, sizeof(int32_t), &fail);
    }
    if (c->n_vocab > 0)
        b->head_scratch = xcalloc((size_t)(HEAD_ROWS * c->n_vocab), sizeof(float), &fail);
    if (c->dn_head_scratch > 0)
        b->dn_scratch = xcalloc((size_t)(nth * c->dn_head_scratch), sizeof(float), &fail);
    if (X > 0) {
        b->router = xcalloc((size_t)(U * X), sizeof(float), &fail);
        b->moe_gate = xcalloc((size_t)(U * K * c->n_ff_exp), sizeof(float), &fail);
        b->moe_up = xcalloc((size_t)(U * K * c->n_ff_exp), sizeof(float), &fail);
        b->moe_down = xcalloc((size_t)(U * K * c->n_embd), sizeof(float), &fail);
        b->sh_gate = xcalloc((size_t)(U * c->n_ff_shexp), sizeof(float), &fail);
        b->sh_up = xcalloc((size_t)(U * c->n_ff_shexp), sizeof(float), &fail);
        b->sh_logit = xcalloc((size_t)U, sizeof(float), &fail);
        b->acc = xcalloc((size_t)(nth * c->n_embd), sizeof(float), &fail);
        b->iota = xcalloc((size_t)(U * K), sizeof(int32_t), &fail);
        if (b->iota)
            for (int64_t i = 0; i < U * K; i++)
                b->iota[i] = (int32_t)i;
    }
    if (fail) {
        cpu_free(&b->base);
        return sil_errorf(err, -ENOMEM, "cpu backend: out of memory for scratch buffers");
    }
    *out = &b->base;
    return 0;
}
