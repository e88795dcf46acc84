#include "daemon/engine/host_experts.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/quants.h"
#include "kernels/cpu/threadpool.h"

#define ROWS_PER_TASK 16

struct sil_host_experts {
    struct sil_threadpool *tp;
    int64_t n_embd, n_ff;
    int max_jobs;
    size_t xq_stride, hq_stride; /* bytes of one quantized row (the widest format: f32) */
    uint8_t *xq_g, *xq_u, *hq;   /* [max_jobs] quantized inputs */
    float *g, *u;                /* [max_jobs][n_ff] */
    float *yj;                   /* [max_jobs][n_embd] each job's down output */
    /* the run in progress, for the workers */
    const struct sil_host_expert_job *jobs;
    int n_jobs;
};

int sil_host_experts_create(struct sil_host_experts **out, int n_threads, int64_t n_embd,
                            int64_t n_ff, int max_jobs, struct sil_error *err)
{
    *out = NULL;
    if (n_threads < 1 || n_embd < 1 || n_ff < 1 || max_jobs < 1)
        return sil_errorf(err, -EINVAL, "host experts: bad sizes");
    struct sil_host_experts *h = calloc(1, sizeof(*h));
    if (!h) return sil_errorf(err, -ENOMEM, "host experts: out of memory");
    h->n_embd = n_embd;
    h->n_ff = n_ff;
    h->max_jobs = max_jobs;
    h->xq_stride = ((size_t)n_embd * sizeof(float) + 63) & ~(size_t)63;
    h->hq_stride = ((size_t)n_ff * sizeof(float) + 63) & ~(size_t)63;
    const size_t J = (size_t)max_jobs;
    h->xq_g = malloc(J * h->xq_stride);
    h->xq_u = malloc(J * h->xq_stride);
    h->hq = malloc(J * h->hq_stride);
    h->g = malloc(J * (size_t)n_ff * sizeof(float));
    h->u = malloc(J * (size_t)n_ff * sizeof(float));
    h->yj = malloc(J * (size_t)n_embd * sizeof(float));
    int rc = !h->xq_g || !h->xq_u || !h->hq || !h->g || !h->u || !h->yj
                 ? sil_errorf(err, -ENOMEM, "host experts: out of memory")
                 : 0;
    if (rc == 0 && n_threads > 1 && sil_threadpool_create(&h->tp, n_threads) < 0)
        rc = sil_errorf(err, -ENOMEM, "host experts: cannot start %d threads", n_threads);
    if (rc < 0) {
        sil_host_experts_free(h);
        return rc;
    }
    *out = h;
    return 0;
}

void sil_host_experts_free(struct sil_host_experts *h)
{
    if (!h) return;
    sil_threadpool_free(h->tp);
    free(h->xq_g);
    free(h->xq_u);
    free(h->hq);
    free(h->g);
    free(h->u);
    free(h->yj);
    free(h);
}

static bool usable(const struct sil_weight *w, int64_t rows, int64_t cols)
{
    const struct sil_type_traits *t = sil_type_traits(w->type);
    return w->data && t && t->supported && t->vec_dot && w->rows == rows && w->cols == cols &&
           sil_row_size(w->type, cols) > 0 && w->mat_bytes >= sil_row_size(w->type, cols) * rows &&
           sil_row_size(sil_type_traits(w->type)->vec_dot_type, cols) <= (size_t)cols * 4;
}

/* Tasks of ROWS_PER_TASK output rows: gate and up of every job, then down. */
static void gate_up_range(void *arg, long lo, long hi, int ith)
{
    (void)ith;
    struct sil_host_experts *h = arg;
    const long per_job = 2 * ((h->n_ff + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
    for (long t = lo; t < hi; t++) {
        const int j = (int)(t / per_job);
        const long r = t % per_job, half = per_job / 2;
        const bool up = r >= half;
        const int64_t r0 = (up ? r - half : r) * ROWS_PER_TASK;
        const int n = (int)(h->n_ff - r0 < ROWS_PER_TASK ? h->n_ff - r0 : ROWS_PER_TASK);
        const struct sil_weight *w = up ? h->jobs[j].up : h->jobs[j].gate;
        const size_t rs = sil_row_size(w->type, w->cols);
        sil_vec_dot_rows(w->type, w->cols, (const uint8_t *)w->data + (size_t)r0 * rs, rs, n,
                         (up ? h->xq_u : h->xq_g) + (size_t)j * h->xq_stride,
                         (up ? h->u : h->g) + (size_t)j * (size_t)h->n_ff + r0);
    }
}

static void down_range(void *arg, long lo, long hi, int ith)
{
    (void)ith;
    struct sil_host_experts *h = arg;
    const long per_job = (h->n_embd + ROWS_PER_TASK - 1) / ROWS_PER_TASK;
    for (long t = lo; t < hi; t++) {
        const int j = (int)(t / per_job);
        const int64_t r0 = (t % per_job) * ROWS_PER_TASK;
        const int n = (int)(h->n_embd - r0 < ROWS_PER_TASK ? h->n_embd - r0 : ROWS_PER_TASK);
        const struct sil_weight *w = h->jobs[j].down;
        const size_t rs = sil_row_size(w->type, w->cols);
        sil_vec_dot_rows(w->type, w->cols, (const uint8_t *)w->data + (size_t)r0 * rs, rs, n,
                         h->hq + (size_t)j * h->hq_stride,
                         h->yj + (size_t)j * (size_t)h->n_embd + r0);
    }
}

int sil_host_experts_run(struct sil_host_experts *h, const float *x, int32_t n_rows,
                         const struct sil_host_expert_job *jobs, int n_jobs, float *y,
                         struct sil_error *err)
{
    const int64_t E = h->n_embd, F = h->n_ff;
    if (n_jobs < 0 || n_jobs > h->max_jobs || n_rows < 0)
        return sil_errorf(err, -EINVAL, "host experts: %d jobs (at most %d)", n_jobs, h->max_jobs);
    for (int j = 0; j < n_jobs; j++) {
        const char *why = jobs[j].row < 0 || jobs[j].row >= n_rows ? "its row is out of range"
                          : !isfinite(jobs[j].weight)              ? "its weight is not finite"
                          : !usable(jobs[j].gate, F, E)            ? "its gate matrix"
                          : !usable(jobs[j].up, F, E)              ? "its up matrix"
                          : !usable(jobs[j].down, E, F)            ? "its down matrix"
                                                                   : NULL;
        if (why) {
            const struct sil_weight *w = jobs[j].gate;
            return sil_errorf(err, -EINVAL,
                              "host experts: job %d of %d (row %d of %d, weight %g): %s (a "
                              "matrix must be %lld x %lld of a type with a CPU kernel; gate is "
                              "%lld x %lld of type %d at %p)",
                              j, n_jobs, (int)jobs[j].row, (int)n_rows, (double)jobs[j].weight,
                              why, (long long)F, (long long)E, (long long)w->rows,
                              (long long)w->cols, (int)w->type, w->data);
        }
    }
    memset(y, 0, sizeof(float) * (size_t)n_rows * (size_t)E);
    if (n_jobs == 0) return 0;
    h->jobs = jobs;
    h->n_jobs = n_jobs;
    for (int j = 0; j < n_jobs; j++) {
        const float *xr = x + (size_t)jobs[j].row * (size_t)E;
        const struct sil_type_traits *tg = sil_type_traits(jobs[j].gate->type),
                                     *tu = sil_type_traits(jobs[j].up->type);
        sil_type_traits(tg->vec_dot_type)->from_float(xr, h->xq_g + (size_t)j * h->xq_stride, E);
        sil_type_traits(tu->vec_dot_type)->from_float(xr, h->xq_u + (size_t)j * h->xq_stride, E);
    }
    const long gu_tasks = (long)n_jobs * 2 * ((F + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
    sil_threadpool_for(h->tp, gu_tasks, 1, gate_up_range, h);
    for (int j = 0; j < n_jobs; j++) {
        float *g = h->g + (size_t)j * (size_t)F;
        const float *u = h->u + (size_t)j * (size_t)F;
        for (int64_t i = 0; i < F; i++)
            g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        const struct sil_type_traits *td = sil_type_traits(jobs[j].down->type);
        sil_type_traits(td->vec_dot_type)->from_float(g, h->hq + (size_t)j * h->hq_stride, F);
    }
    const long d_tasks = (long)n_jobs * ((E + ROWS_PER_TASK - 1) / ROWS_PER_TASK);
    sil_threadpool_for(h->tp, d_tasks, 1, down_range, h);
    if (h->tp && sil_threadpool_faulted(h->tp)) {
        sil_threadpool_clear_fault(h->tp);
        return sil_errorf(err, -EIO, "host experts: a fault reading the model mapping");
    }
    /* in job order, so the sum does not depend on the threads */
    for (int j = 0; j < n_jobs; j++) {
        float *yr = y + (size_t)jobs[j].row * (size_t)E;
        const float *d = h->yj + (size_t)j * (size_t)E, w = jobs[j].weight;
        for (int64_t i = 0; i < E; i++)
            yr[i] += w * d[i];
    }
    return 0;
}
