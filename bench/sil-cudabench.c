/* sil-cudabench: per-kernel times of the CUDA backend for the Qwen3.5-35B-A3B decode shapes
 * (n_embd 2048, expert ffn 512, 256 experts top-8, output head 248320 rows), with the bytes each
 * launch must move and the bandwidth reached, against a device-to-device copy measured in the
 * same run. Weights are rotated over enough copies to exceed the L2, so the figures are DRAM's.
 * Then prefill's products (sil_cuda_matmul) at the pp512 shapes, with TFLOP/s beside GB/s.
 *
 *   sil-cudabench [--json PATH] [--commit ID] [--reps N] [--chain-only]
 *
 * The stage chain (kernels/cuda/chain.cu): 64 ordered batch-1 Q4_K matvecs (each stage its own
 * weights, the same q8 input), as a graph of 64 launches (programmatic dependent launch where the
 * backend uses it) and as one persistent launch with a grid-wide barrier between stages (with
 * and without the next stage's weights asked of L2 before the barrier): what a stage boundary
 * costs each way, the measurement of a persistent decode kernel where it could pay.
 * --chain-only runs the copy and the chain alone.
 *
 * Each figure is the median over 5 timed loops of N launches (default 100) after a warm-up. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cpu/quants.h"
#include "kernels/cuda/cuda_backend.h"

#define MAX_COPIES 512
#define ROTATE_BYTES ((size_t)512 << 20)

struct result {
    char name[64], config[128];
    double us, us_min, us_max, bytes, gbs, flops; /* flops: 0 where not a product */
};

static struct result results[128];
static int n_results;
static struct sil_cuda *cu;
static struct sil_cuda_event *ev0, *ev1;
static int reps = 100;
static struct sil_error err;

#define CK(call)                                                                                   \
    do {                                                                                           \
        if ((call) < 0) {                                                                          \
            fprintf(stderr, "sil-cudabench: %s\n", err.msg);                                       \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static int cmp_d(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)(rng >> 40) / 8388608.0f - 1.0f;
}

/* A weight of rows x cols: 256 distinct quantized rows tiled, then copies for rotation. */
struct bweight {
    struct sil_cuda_weight w[MAX_COPIES];
    int copies;
    sil_cuda_ptr base;
};

static void bweight_make(struct bweight *b, int type, int64_t rows, int64_t cols)
{
    const size_t rb = sil_row_size(type, cols);
    const int64_t distinct = rows < 256 ? rows : 256;
    uint8_t *q = malloc(rb * distinct);
    float *x = malloc(sizeof(float) * cols);
    if (!q || !x) exit(1);
    for (int64_t r = 0; r < distinct; r++) {
        for (int64_t c = 0; c < cols; c++)
            x[c] = frand();
        sil_quantize_row_ref(type, x, q + rb * r, cols);
    }
    const size_t bytes = rb * rows;
    b->copies = (int)((ROTATE_BYTES + bytes - 1) / bytes);
    if (b->copies > MAX_COPIES) b->copies = MAX_COPIES;
    if (b->copies < 1) b->copies = 1;
    const size_t stride = (bytes + 255) / 256 * 256;
    CK(sil_cuda_alloc(cu, stride * b->copies, &b->base, &err));
    for (int64_t r = 0; r < rows; r += distinct) {
        const int64_t n = rows - r < distinct ? rows - r : distinct;
        CK(sil_cuda_upload(cu, b->base + rb * r, q, rb * n, NULL, &err));
        CK(sil_cuda_sync(cu, NULL, &err));
    }
    for (int i = 0; i < b->copies; i++) {
        if (i > 0) CK(sil_cuda_copy_d2d(cu, b->base + stride * i, b->base, bytes, NULL, &err));
        CK(sil_cuda_weight_view(type, rows, cols, b->base + stride * i, &b->w[i], &err));
    }
    CK(sil_cuda_sync(cu, NULL, &err));
    free(q), free(x);
}

static void bweight_free(struct bweight *b)
{
    sil_cuda_release(cu, b->base);
}

typedef int (*launch_fn)(void *ctx, int i);

static double last_min, last_max; /* of the last time_launches */

/* Median microseconds per launch (last_min / last_max: the fastest and slowest loop). */
static double time_launches(launch_fn f, void *ctx)
{
    for (int i = 0; i < 10; i++)
        CK(f(ctx, i));
    CK(sil_cuda_sync(cu, NULL, &err));
    double t[5];
    for (int k = 0; k < 5; k++) {
        CK(sil_cuda_event_record(cu, ev0, NULL, &err));
        for (int i = 0; i < reps; i++)
            CK(f(ctx, i));
        CK(sil_cuda_event_record(cu, ev1, NULL, &err));
        float ms;
        CK(sil_cuda_event_elapsed(cu, ev0, ev1, &ms, &err));
        t[k] = ms * 1000.0 / reps;
    }
    qsort(t, 5, sizeof *t, cmp_d);
    last_min = t[0];
    last_max = t[4];
    return t[2];
}

static void record(const char *name, const char *config, double us, double bytes)
{
    struct result *r = &results[n_results++];
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->config, sizeof r->config, "%s", config);
    r->us = us;
    r->us_min = last_min;
    r->us_max = last_max;
    r->bytes = bytes;
    r->gbs = bytes / (us * 1e3);
    r->flops = 0;
    printf("%-22s %-44s %10.2f us %12.0f B %8.1f GB/s\n", name, config, us, bytes, r->gbs);
}

struct mv_ctx {
    struct bweight *b;
    sil_cuda_ptr x, q8, y;
    int n;
};
static int mv_launch(void *p, int i)
{
    struct mv_ctx *c = p;
    const struct sil_cuda_weight *w = &c->b->w[i % c->b->copies];
    return sil_cuda_matvec(cu, w, c->x, c->q8, c->n, c->y, w->rows, NULL, &err);
}

static sil_cuda_ptr x_dev, q8_dev, y_dev, ids_dev, wts_dev, am_scratch;

static void bench_matvec(const char *name, int type, int64_t rows, int64_t cols, int n)
{
    struct bweight *b = calloc(1, sizeof *b);
    if (!b) exit(1);
    bweight_make(b, type, rows, cols);
    const bool quant = sil_type_traits(type)->block_size > 1;
    if (quant) CK(sil_cuda_quantize_q8(cu, x_dev, n, cols, q8_dev, NULL, &err));
    struct mv_ctx c = {b, x_dev, q8_dev, y_dev, n};
    const double us = time_launches(mv_launch, &c);
    const double bytes = (double)b->w[0].bytes +
                         (quant ? (double)sil_cuda_q8_bytes(n, cols) : 4.0 * n * cols) +
                         4.0 * n * rows;
    char cfg[128];
    snprintf(cfg, sizeof cfg, "type=%s,rows=%lld,cols=%lld,batch=%d", sil_type_name(type),
             (long long)rows, (long long)cols, n);
    record(name, cfg, us, bytes);
    bweight_free(b);
    free(b);
}

/* Prefill products (sil_cuda_matmul) of n activation rows: TFLOP/s counts 2 * rows * cols * n. */
static sil_cuda_ptr xmm_dev, q8mm_dev, ymm_dev;
#define MM_MAX_N 512
#define MM_MAX_COLS 4096
#define MM_MAX_ROWS 248320

struct mm_ctx {
    struct bweight *b;
    int n;
};
static int mm_launch(void *p, int i)
{
    struct mm_ctx *c = p;
    const struct sil_cuda_weight *w = &c->b->w[i % c->b->copies];
    return sil_cuda_matmul(cu, w, xmm_dev, q8mm_dev, c->n, ymm_dev, w->rows, NULL, &err);
}

static void bench_matmul(const char *name, int type, int64_t rows, int64_t cols, int n, int mma)
{
    if (sil_cuda_set_mma(cu, mma, &err) < 0) {
        printf("%-22s skipped: %s\n", name, err.msg);
        return;
    }
    struct bweight *b = calloc(1, sizeof *b);
    if (!b) exit(1);
    bweight_make(b, type, rows, cols);
    const bool quant = sil_type_traits(type)->block_size > 1;
    if (quant) CK(sil_cuda_quantize_q8(cu, xmm_dev, n, cols, q8mm_dev, NULL, &err));
    struct mm_ctx c = {b, n};
    const double us = time_launches(mm_launch, &c);
    const double bytes = (double)b->w[0].bytes +
                         (quant ? (double)sil_cuda_q8_bytes(n, cols) : 4.0 * n * cols) +
                         4.0 * n * rows;
    char cfg[128];
    snprintf(cfg, sizeof cfg, "type=%s,rows=%lld,cols=%lld,n=%d,mma=sm_%d", sil_type_name(type),
             (long long)rows, (long long)cols, n, sil_cuda_get_mma(cu));
    record(name, cfg, us, bytes);
    struct result *r = &results[n_results - 1];
    r->flops = 2.0 * (double)rows * (double)cols * n;
    printf("%-22s %-44s %10.2f TFLOP/s\n", "", "", r->flops / (us * 1e6));
    CK(sil_cuda_set_mma(cu, 0, &err));
    bweight_free(b);
    free(b);
}

/* MoE at uniform routing: each launch takes the next of 64 random top-8 plans over 256 experts,
 * so the expert tensors (>= 151 MB each) are read from DRAM, as in decode. */
#define MOE_PLANS 64
struct moe_ctx {
    struct bweight *g, *u, *d;
    sil_cuda_ptr ids, wts, q8, h, h8, y;
    int n_expert, k;
};
static int moe_gate_up_launch(void *p, int i)
{
    struct moe_ctx *c = p;
    return sil_cuda_moe_gate_up(cu, &c->g->w[0], &c->u->w[0], c->n_expert, c->q8, 1,
                                c->ids + sizeof(int32_t) * c->k * (i % MOE_PLANS), c->k, c->h, 0,
                                0, NULL, &err);
}
static int moe_down_launch(void *p, int i)
{
    struct moe_ctx *c = p;
    const size_t off = sizeof(int32_t) * c->k * (i % MOE_PLANS);
    return sil_cuda_moe_down(cu, &c->d->w[0], c->n_expert, c->h8, 1, c->ids + off, c->wts + off,
                             c->k, c->y, NULL, &err);
}

static void bench_moe(int type, int dtype, int n_expert, int k, int64_t n_embd, int64_t n_ff)
{
    struct bweight *g = calloc(1, sizeof *g), *u = calloc(1, sizeof *u), *d = calloc(1, sizeof *d);
    if (!g || !u || !d) exit(1);
    bweight_make(g, type, n_expert * n_ff, n_embd);
    bweight_make(u, type, n_expert * n_ff, n_embd);
    bweight_make(d, dtype, n_expert * n_embd, n_ff);
    int32_t ids[MOE_PLANS * 8];
    float wts[MOE_PLANS * 8];
    for (int p = 0; p < MOE_PLANS; p++)
        for (int j = 0; j < k; j++) {
            int e;
            bool dup;
            do { /* distinct experts within a plan */
                e = (int)((frand() + 1.0f) * 0.5f * n_expert) % n_expert;
                dup = false;
                for (int i = 0; i < j; i++)
                    dup = dup || ids[p * k + i] == e;
            } while (dup);
            ids[p * k + j] = e;
            wts[p * k + j] = 1.0f / k;
        }
    struct moe_ctx c = {g, u, d, 0, 0, q8_dev, 0, 0, y_dev, n_expert, k};
    CK(sil_cuda_alloc(cu, sizeof ids, &c.ids, &err));
    CK(sil_cuda_alloc(cu, sizeof wts, &c.wts, &err));
    CK(sil_cuda_alloc(cu, sizeof(float) * k * n_ff, &c.h, &err));
    CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(k, n_ff), &c.h8, &err));
    CK(sil_cuda_upload(cu, c.ids, ids, sizeof ids, NULL, &err));
    CK(sil_cuda_upload(cu, c.wts, wts, sizeof wts, NULL, &err));
    CK(sil_cuda_quantize_q8(cu, x_dev, 1, n_embd, q8_dev, NULL, &err));
    CK(sil_cuda_quantize_q8(cu, y_dev, k, n_ff, c.h8, NULL, &err));
    char cfg[128];
    snprintf(cfg, sizeof cfg, "type=%s,experts=%d,top=%d,n_embd=%lld,n_ff=%lld,tokens=1",
             sil_type_name(type), n_expert, k, (long long)n_embd, (long long)n_ff);
    record("moe_gate_up_swiglu", cfg, time_launches(moe_gate_up_launch, &c),
           2.0 * k * n_ff * g->w[0].row_bytes + sil_cuda_q8_bytes(1, n_embd) + 4.0 * k * n_ff);
    snprintf(cfg, sizeof cfg, "type=%s,experts=%d,top=%d,n_embd=%lld,n_ff=%lld,tokens=1",
             sil_type_name(dtype), n_expert, k, (long long)n_embd, (long long)n_ff);
    record("moe_down_weighted", cfg, time_launches(moe_down_launch, &c),
           (double)k * n_embd * d->w[0].row_bytes + sil_cuda_q8_bytes(k, n_ff) + 4.0 * n_embd);
    sil_cuda_release(cu, c.ids), sil_cuda_release(cu, c.wts), sil_cuda_release(cu, c.h);
    sil_cuda_release(cu, c.h8);
    bweight_free(g), bweight_free(u), bweight_free(d);
    free(g), free(u), free(d);
}

struct op_ctx {
    int op;
    int64_t a, b;
};
static int op_launch(void *p, int i)
{
    struct op_ctx *c = p;
    (void)i;
    switch (c->op) {
    case 0:
        return sil_cuda_quantize_q8(cu, x_dev, c->a, c->b, q8_dev, NULL, &err);
    case 1:
        return sil_cuda_rmsnorm(cu, y_dev, x_dev, x_dev, c->a, c->b, 1e-6f, NULL, &err);
    case 2:
        return sil_cuda_router_topk(cu, x_dev, (int)c->a, (int)c->b, 8, ids_dev, wts_dev, NULL,
                                    &err);
    case 3:
        return sil_cuda_argmax(cu, y_dev, (int)c->a, c->b, ids_dev, am_scratch, NULL, &err);
    case 4:
        return sil_cuda_swiglu(cu, y_dev, x_dev, x_dev, c->a * c->b, NULL, &err);
    default:
        return sil_cuda_add(cu, y_dev, x_dev, c->a * c->b, NULL, &err);
    }
}

static void bench_op(const char *name, int op, int64_t a, int64_t b, double bytes)
{
    struct op_ctx c = {op, a, b};
    char cfg[128];
    snprintf(cfg, sizeof cfg, "rows=%lld,n=%lld", (long long)a, (long long)b);
    record(name, cfg, time_launches(op_launch, &c), bytes);
}

struct cp_ctx {
    sil_cuda_ptr a, b;
    size_t bytes;
};
static int cp_launch(void *p, int i)
{
    struct cp_ctx *c = p;
    (void)i;
    return sil_cuda_copy_d2d(cu, c->b, c->a, c->bytes, NULL, &err);
}

/* ---- the stage chain (chain.cu) ------------------------------------------------------------ */
extern const unsigned char sil_cuda_chain_fatbin[];
#define CHAIN_STAGES 64
#define CHAIN_MAX_ROWS 4096 /* of the output buffer */

struct chain_ctx {
    struct sil_cuda_graph *g;
    void *fn;
    void **params;
    unsigned grid;
};
static int chain_graph_launch(void *p, int i)
{
    struct chain_ctx *c = p;
    (void)i;
    return sil_cuda_graph_launch(cu, c->g, NULL, &err);
}
static int chain_persist_launch(void *p, int i)
{
    struct chain_ctx *c = p;
    (void)i;
    return sil_cuda_launch(cu, c->fn, "chain persist", c->grid, 1, 1, 128, NULL, c->params, &err);
}

/* us per stage of each form; rows <= CHAIN_MAX_ROWS, cols <= 8 * vocab (x_dev's q8), cols % 256
 * == 0 (Q4_K). */
static void bench_chain(struct sil_cuda_module *m, int64_t rows, int64_t cols)
{
    void *stage_fn = NULL, *persist_fn = NULL;
    CK(sil_cuda_module_function(cu, m, "sil_chain_stage", &stage_fn, &err));
    CK(sil_cuda_module_function(cu, m, "sil_chain_persist", &persist_fn, &err));
    struct bweight *b = calloc(1, sizeof *b);
    if (!b) exit(1);
    bweight_make(b, SIL_TYPE_Q4_K, rows, cols);
    if (b->copies < CHAIN_STAGES) {
        printf("chain %lldx%lld skipped: %d copies of the weight, %d stages\n", (long long)rows,
               (long long)cols, b->copies, CHAIN_STAGES);
        bweight_free(b), free(b);
        return;
    }
    const uint64_t stride = b->w[1].data - b->w[0].data, row_bytes = b->w[0].row_bytes;
    const double bytes = (double)b->w[0].bytes;
    int r = (int)rows, c = (int)cols, stages = CHAIN_STAGES;
    sil_cuda_ptr buf = 0, bar = 0;
    CK(sil_cuda_alloc(cu, sizeof(float) * CHAIN_MAX_ROWS, &buf, &err));
    CK(sil_cuda_quantize_q8(cu, x_dev, 1, cols, q8_dev, NULL, &err));
    CK(sil_cuda_alloc(cu, 3 * sizeof(unsigned), &bar, &err));
    CK(sil_cuda_memset(cu, bar, 0, 3 * sizeof(unsigned), NULL, &err));
    char cfg[128];
    snprintf(cfg, sizeof cfg, "type=q4_K,rows=%lld,cols=%lld,stages=%d", (long long)rows,
             (long long)cols, stages);

    /* a graph of one launch a stage */
    struct chain_ctx gc = {0};
    const unsigned nblk = (unsigned)((rows + 3) / 4);
    CK(sil_cuda_capture_begin(cu, NULL, &err));
    for (int st = 0; st < stages; st++) {
        sil_cuda_ptr w = b->w[0].data + (uint64_t)st * stride;
        sil_cuda_ptr a8 = q8_dev, y = buf;
        uint64_t rb = row_bytes;
        void *params[] = {&w, &rb, &r, &c, &a8, &y};
        CK(sil_cuda_launch(cu, stage_fn, "chain stage", nblk, 1, 1, 128, NULL, params, &err));
    }
    CK(sil_cuda_capture_end(cu, NULL, &gc.g, &err));
    double us = time_launches(chain_graph_launch, &gc);
    last_min /= stages, last_max /= stages;
    record("chain_graph_stage", cfg, us / stages, bytes);
    sil_cuda_graph_destroy(cu, gc.g);

    /* one persistent launch, a grid barrier between stages */
    const unsigned resident = 4u * (unsigned)sil_cuda_get_info(cu)->sm_count;
    for (int pf = 0; pf <= 1; pf++) {
        sil_cuda_ptr w = b->w[0].data, a8 = q8_dev;
        uint64_t st = stride, rb = row_bytes;
        int p = pf;
        void *params[] = {&w, &st, &rb, &r, &c, &stages, &a8, &buf, &bar, &p};
        struct chain_ctx pc = {NULL, persist_fn, params, nblk < resident ? nblk : resident};
        us = time_launches(chain_persist_launch, &pc);
        last_min /= stages, last_max /= stages;
        unsigned hb[3] = {0};
        CK(sil_cuda_download(cu, hb, bar, sizeof hb, NULL, &err));
        CK(sil_cuda_sync(cu, NULL, &err));
        if (hb[2]) {
            printf("chain_persist %s: a barrier timed out (blocks not resident together)\n", cfg);
            CK(sil_cuda_memset(cu, bar, 0, 3 * sizeof(unsigned), NULL, &err));
            continue;
        }
        record(pf ? "chain_persist_pf_stage" : "chain_persist_stage", cfg, us / stages, bytes);
    }
    sil_cuda_release(cu, buf), sil_cuda_release(cu, bar);
    bweight_free(b), free(b);
}

int main(int argc, char **argv)
{
    const char *json = NULL, *commit = "unknown";
    bool chain_only = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--chain-only"))
            chain_only = true;
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
        else if (!strcmp(argv[i], "--commit") && i + 1 < argc)
            commit = argv[++i];
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            char *end;
            const long v = strtol(argv[++i], &end, 10);
            if (*end || v < 1 || v > 100000) {
                fprintf(stderr, "sil-cudabench: --reps takes 1 to 100000\n");
                return 2;
            }
            reps = (int)v;
        } else if (!strcmp(argv[i], "--version")) {
            printf("sil-cudabench %s (fatbin: %s)\n", SIL_VERSION, sil_cuda_fatbin_archs());
            return 0;
        } else {
            const bool help = !strcmp(argv[i], "--help");
            fprintf(help ? stdout : stderr,
                    "usage: sil-cudabench [--json PATH] [--commit ID] [--reps N] [--chain-only] "
                    "[--help] [--version]\n");
            return help ? 0 : 2;
        }
    }
    CK(sil_cuda_init(&cu, 0, NULL, &err));
    const struct sil_cuda_info *in = sil_cuda_get_info(cu);
    printf("device: %s, sm_%d%d, %d SMs, driver %d.%d, %s\n", in->name, in->cc_major, in->cc_minor,
           in->sm_count, in->driver_version / 1000, in->driver_version % 1000 / 10,
           in->ptx_jit ? "PTX JIT" : "SASS");
    CK(sil_cuda_event_create(cu, &ev0, &err));
    CK(sil_cuda_event_create(cu, &ev1, &err));
    const int64_t vocab = 248320, n_embd = 2048, n_ff = 512, n_expert = 256;
    CK(sil_cuda_alloc(cu, sizeof(float) * 8 * vocab, &x_dev, &err));
    CK(sil_cuda_alloc(cu, sizeof(float) * 8 * vocab, &y_dev, &err));
    CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(8, vocab), &q8_dev, &err));
    CK(sil_cuda_alloc(cu, 4096, &ids_dev, &err));
    CK(sil_cuda_alloc(cu, 4096, &wts_dev, &err));
    CK(sil_cuda_alloc(cu, SIL_CUDA_ARGMAX_SCRATCH(8), &am_scratch, &err));
    CK(sil_cuda_memset(cu, am_scratch, 0, SIL_CUDA_ARGMAX_SCRATCH(8), NULL, &err));
    {
        float *x = malloc(sizeof(float) * 8 * vocab);
        if (!x) return 1;
        for (int64_t i = 0; i < 8 * vocab; i++)
            x[i] = frand();
        CK(sil_cuda_upload(cu, x_dev, x, sizeof(float) * 8 * vocab, NULL, &err));
        CK(sil_cuda_upload(cu, y_dev, x, sizeof(float) * 8 * vocab, NULL, &err));
        CK(sil_cuda_sync(cu, NULL, &err));
        free(x);
    }

    /* The ceiling: a 1 GiB device-to-device copy, bytes read plus written. */
    struct cp_ctx cp = {.bytes = (size_t)1 << 30};
    CK(sil_cuda_alloc(cu, cp.bytes, &cp.a, &err));
    CK(sil_cuda_alloc(cu, cp.bytes, &cp.b, &err));
    CK(sil_cuda_memset(cu, cp.a, 0x5a, cp.bytes, NULL, &err));
    const int saved = reps;
    reps = 10;
    const double cp_us = time_launches(cp_launch, &cp);
    reps = saved;
    const double peak = 2.0 * (double)cp.bytes / (cp_us * 1e3);
    printf("d2d copy 1 GiB: %.1f us, %.1f GB/s (read + write)\n", cp_us, peak);
    sil_cuda_release(cu, cp.a);
    sil_cuda_release(cu, cp.b);

    /* A stage boundary: a graph of launches against one persistent launch. */
    {
        struct sil_cuda_module *m = NULL;
        CK(sil_cuda_module_load(cu, sil_cuda_chain_fatbin, &m, &err));
        bench_chain(m, n_embd, n_embd);
        bench_chain(m, 2 * n_embd, n_embd);
        bench_chain(m, n_embd, 2 * n_embd);
        sil_cuda_module_unload(cu, m);
    }
    if (chain_only) goto done;

    /* One decode token's kernels at the 35B-A3B shapes. */
    bench_op("quantize_q8", 0, 1, n_embd, 4.0 * n_embd + sil_cuda_q8_bytes(1, n_embd));
    bench_op("rmsnorm", 1, 1, n_embd, 4.0 * 3 * n_embd);
    bench_matvec("router", SIL_TYPE_F32, n_expert, n_embd, 1);
    bench_op("router_topk", 2, 1, n_expert, 4.0 * n_expert + 64);
    bench_matvec("expert_gate_or_up", SIL_TYPE_Q4_K, n_ff, n_embd, 1);
    bench_matvec("experts_gate_up_x16", SIL_TYPE_Q4_K, 16 * n_ff, n_embd, 1);
    bench_matvec("expert_down", SIL_TYPE_Q4_K, n_embd, n_ff, 1);
    bench_matvec("expert_down", SIL_TYPE_Q6_K, n_embd, n_ff, 1);
    bench_moe(SIL_TYPE_Q4_K, SIL_TYPE_Q4_K, (int)n_expert, 8, n_embd, n_ff);
    bench_moe(SIL_TYPE_Q4_K, SIL_TYPE_Q6_K, (int)n_expert, 8, n_embd, n_ff);
    bench_op("swiglu", 4, 16, n_ff, 4.0 * 3 * 16 * n_ff);
    bench_op("add", 5, 1, n_embd, 4.0 * 3 * n_embd);
    bench_matvec("output_head", SIL_TYPE_Q6_K, vocab, n_embd, 1);
    bench_matvec("output_head", SIL_TYPE_Q8_0, vocab, n_embd, 1);
    bench_matvec("output_head", SIL_TYPE_Q4_K, vocab, n_embd, 1);
    bench_op("argmax", 3, 1, vocab, 4.0 * vocab);
    /* Every type on a matrix that fills the GPU, batch 1 and 8. */
    static const int types[] = {SIL_TYPE_Q4_K, SIL_TYPE_Q5_K, SIL_TYPE_Q6_K, SIL_TYPE_Q8_0,
                                SIL_TYPE_Q4_0, SIL_TYPE_Q4_1, SIL_TYPE_Q5_0, SIL_TYPE_Q5_1,
                                SIL_TYPE_F16,  SIL_TYPE_BF16, SIL_TYPE_F32};
    for (size_t t = 0; t < sizeof types / sizeof *types; t++)
        for (int n = 1; n <= 8; n += 7)
            bench_matvec("matvec_16384x2048", types[t], 16384, n_embd, n);

    /* pp512's products at the 35B-A3B shapes: attention q+gate / k / v / output, the delta net's
     * qkv / z / output, the shared expert (all 512 tokens), one routed expert at uniform routing
     * (512 * 8 / 256 = 16 tokens), and the output head. */
    CK(sil_cuda_alloc(cu, sizeof(float) * MM_MAX_N * MM_MAX_COLS, &xmm_dev, &err));
    CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(MM_MAX_N, MM_MAX_COLS), &q8mm_dev, &err));
    CK(sil_cuda_alloc(cu, sizeof(float) * MM_MAX_N * (size_t)MM_MAX_ROWS, &ymm_dev, &err));
    for (int i = 0; i < MM_MAX_N * MM_MAX_COLS; i += 8 * (int)vocab)
        CK(sil_cuda_copy_d2d(cu, xmm_dev + sizeof(float) * i, x_dev,
                             sizeof(float) * (MM_MAX_N * MM_MAX_COLS - i < 8 * vocab
                                                  ? MM_MAX_N * MM_MAX_COLS - i
                                                  : 8 * vocab),
                             NULL, &err));
    bench_matmul("pp512_attn_q_gate", SIL_TYPE_Q4_K, 8192, n_embd, 512, 0);
    bench_matmul("pp512_attn_q_gate", SIL_TYPE_Q4_K, 8192, n_embd, 512, 75);
    bench_matmul("pp512_attn_k_or_v", SIL_TYPE_Q4_K, 512, n_embd, 512, 0);
    bench_matmul("pp512_attn_v", SIL_TYPE_Q6_K, 512, n_embd, 512, 0);
    bench_matmul("pp512_attn_out", SIL_TYPE_Q4_K, n_embd, 4096, 512, 0);
    bench_matmul("pp512_dn_qkv", SIL_TYPE_Q4_K, 8192, n_embd, 512, 0);
    bench_matmul("pp512_dn_z", SIL_TYPE_Q4_K, 4096, n_embd, 512, 0);
    bench_matmul("pp512_dn_out", SIL_TYPE_Q4_K, n_embd, 4096, 512, 0);
    bench_matmul("pp512_shexp_gate_up", SIL_TYPE_Q4_K, n_ff, n_embd, 512, 0);
    bench_matmul("pp512_shexp_down", SIL_TYPE_Q6_K, n_embd, n_ff, 512, 0);
    bench_matmul("pp512_expert_gate_up", SIL_TYPE_Q4_K, n_ff, n_embd, 16, 0);
    bench_matmul("pp512_expert_down", SIL_TYPE_Q6_K, n_embd, n_ff, 16, 0);
    bench_matmul("pp512_output_head", SIL_TYPE_Q6_K, vocab, n_embd, 512, 0);
    bench_matmul("pp512_output_head", SIL_TYPE_Q6_K, vocab, n_embd, 512, 75);
    for (size_t t = 0; t < sizeof types / sizeof *types; t++)
        bench_matmul("matmul_8192x2048", types[t], 8192, n_embd, 512, 0);
    sil_cuda_release(cu, xmm_dev), sil_cuda_release(cu, q8mm_dev), sil_cuda_release(cu, ymm_dev);

done:
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) {
            fprintf(stderr, "sil-cudabench: %s: %s\n", json, strerror(errno));
            return 1;
        }
        char date[32];
        const time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        fprintf(
            f,
            "{\n  \"benchmark\": \"cuda-kernels\",\n  \"date\": \"%s\",\n  \"commit\": \"%s\",\n"
            "  \"command\": \"sil-cudabench --reps %d\",\n"
            "  \"machine\": {\"gpu\": \"%s\", \"sm\": \"sm_%d%d\", \"sms\": %d, "
            "\"driver_api\": \"%d.%d\", \"module\": \"%s\"},\n"
            "  \"results\": [\n",
            date, commit, reps, in->name, in->cc_major, in->cc_minor, in->sm_count,
            in->driver_version / 1000, in->driver_version % 1000 / 10,
            in->ptx_jit ? "ptx-jit" : "sass");
        fprintf(f,
                "    {\"metric\": \"gb_s\", \"config\": \"kernel=d2d_copy,bytes=1073741824\", "
                "\"value\": %.1f, \"unit\": \"GB/s\", \"runs\": 5}",
                peak);
        for (int i = 0; i < n_results; i++) {
            const struct result *r = &results[i];
            fprintf(f,
                    ",\n    {\"metric\": \"us_per_call\", \"config\": \"kernel=%s,%s\", \"value\": "
                    "%.3f, \"unit\": \"us\", \"runs\": 5, \"min\": %.3f, \"max\": %.3f}",
                    r->name, r->config, r->us, r->us_min, r->us_max);
            fprintf(f,
                    ",\n    {\"metric\": \"gb_s\", \"config\": \"kernel=%s,%s\", \"value\": %.1f, "
                    "\"unit\": \"GB/s\", \"floor\": %.1f, \"floor_basis\": \"d2d copy bandwidth "
                    "measured in this run; bytes = weights + activations + outputs, each once\", "
                    "\"bytes\": %.0f, \"runs\": 5, \"min\": %.1f, \"max\": %.1f}",
                    r->name, r->config, r->gbs, peak, r->bytes, r->bytes / (r->us_max * 1e3),
                    r->bytes / (r->us_min * 1e3));
            if (r->flops > 0)
                fprintf(f,
                        ",\n    {\"metric\": \"tflop_s\", \"config\": \"kernel=%s,%s\", \"value\": "
                        "%.2f, \"unit\": \"TFLOP/s\", \"flops\": %.0f, \"runs\": 5, \"min\": %.2f, "
                        "\"max\": %.2f}",
                        r->name, r->config, r->flops / (r->us * 1e6), r->flops,
                        r->flops / (r->us_max * 1e6), r->flops / (r->us_min * 1e6));
        }
        fprintf(f,
                "\n  ],\n  \"notes\": \"value is the median of 5 timed loops of %d launches "
                "(event-timed, after 10 warm-up launches); weights rotated over copies "
                "totalling >= 512 MiB so each launch reads DRAM, not L2. Single kernels, no "
                "CUDA graph: small launches are launch-bound.\"\n}\n",
                reps);
        fclose(f);
    }
    sil_cuda_release(cu, x_dev), sil_cuda_release(cu, y_dev), sil_cuda_release(cu, q8_dev);
    sil_cuda_release(cu, ids_dev), sil_cuda_release(cu, wts_dev);
    sil_cuda_release(cu, am_scratch);
    sil_cuda_event_destroy(cu, ev0);
    sil_cuda_event_destroy(cu, ev1);
    sil_cuda_free(cu);
    return 0;
}
