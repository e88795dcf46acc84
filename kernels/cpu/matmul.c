#include "kernels/cpu/matmul.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_impl.h"

/* Weight rows per work chunk: a chunk's rows stay in L1/L2 while every input row passes. With
 * few input rows (decode) a chunk is a few microseconds of work, so chunks grow until each
 * thread claims about CHUNKS_PER_THREAD of them: every claim is a cache-line round trip. */
#define CHUNK_ROWS 16
#define CHUNKS_PER_THREAD 8
#define SIL_MM_MAX_JOBS 1024
/* Input rows from which a job goes through the tiled kernel. Now that the tiles prefetch as
 * vec_dot does, one row (a decode row, an expert with one row of the batch) is also faster
 * through 4 weight rows at a time: 1 thread, 16 rows, 146 -> 139 ms per step. */
#define TILE_MIN_ROWS 1

static int format_of_type(int t)
{
    return t == SIL_TYPE_Q8_0 ? 1 : t == SIL_TYPE_Q8_K ? 2 : 0;
}

/* The activation format (index) weight type wtype is multiplied with. */
static int input_format(const struct sil_mm_input *in, int wtype)
{
    if (in->exact)
        return 0;
    const struct sil_type_traits *tt = sil_type_traits(wtype);
    return format_of_type(tt->vec_dot_type);
}

static int format_type(int f)
{
    return f == 1 ? SIL_TYPE_Q8_0 : f == 2 ? SIL_TYPE_Q8_K : SIL_TYPE_F32;
}

size_t sil_mm_input_bytes(int wtype, int64_t k, int64_t n)
{
    const struct sil_type_traits *tt = sil_type_traits(wtype);
    int f = tt ? format_of_type(tt->vec_dot_type) : 0;
    if (f == 0)
        return 0;
    return sil_row_size(format_type(f), k) * (size_t)n;
}

static size_t format_bytes(int f, int64_t k, int64_t n)
{
    if (f == 0)
        return 0;
    /* Round k up to the block so a buffer sized for k_max holds any smaller k's rows. */
    int64_t bs = sil_type_traits(format_type(f))->block_size;
    int64_t kk = (k + bs - 1) / bs * bs;
    return sil_row_size(format_type(f), kk) * (size_t)n;
}

size_t sil_mm_input_bytes_all(int64_t k, int64_t n)
{
    size_t total = 0;
    for (int f = 1; f < SIL_MM_FORMATS; f++)
        total += (format_bytes(f, k, n) + 63) & ~(size_t)63;
    return total;
}

void sil_mm_input_init(struct sil_mm_input *in, const float *x, int64_t n, int64_t k, bool exact,
                       void *buf, int64_t k_max, int64_t n_max)
{
    memset(in, 0, sizeof(*in));
    in->x = x;
    in->n = n;
    in->k = k;
    in->exact = exact;
    char *p = buf;
    for (int f = 1; f < SIL_MM_FORMATS; f++) {
        size_t b = (format_bytes(f, k_max, n_max) + 63) & ~(size_t)63;
        in->buf[f] = p;
        in->buf_bytes[f] = b;
        p += b;
    }
}

struct prep_task {
    struct sil_mm_input *in;
    int f;
};

static void prep_run(void *arg, long lo, long hi, int ith)
{
    struct prep_task *t = arg;
    struct sil_mm_input *in = t->in;
    const struct sil_type_traits *tt = sil_type_traits(format_type(t->f));
    size_t rs = sil_row_size(format_type(t->f), in->k);
    (void)ith;
    for (long j = lo; j < hi; j++)
        tt->from_float(in->x + j * in->k, (char *)in->buf[t->f] + (size_t)j * rs, in->k);
}

void sil_mm_input_prepare(struct sil_threadpool *tp, struct sil_mm_input *in, int wtype)
{
    int f = input_format(in, wtype);
    if (f == 0 || in->ready[f])
        return;
    struct prep_task t = {in, f};
    if (in->n * in->k < 16384)
        prep_run(&t, 0, in->n, 0); /* decode rows: microseconds, less than waking the pool */
    else
        sil_threadpool_for(tp, in->n, 0, prep_run, &t);
    in->ready[f] = true;
}

int64_t sil_matmul_scratch_floats(int64_t k_max)
{
    return (k_max + 15) / 16 * 16;
}

struct mm_task {
    const struct sil_mm_job *jobs;
    int n_jobs;
    long chunk_start[SIL_MM_MAX_JOBS + 1]; /* first chunk index of each job */
    long chunk_rows;
    float *scratch;
    int64_t scratch_stride;
};

/* Batches through a tiled kernel: for each SIL_TILE_C input rows, every SIL_TILE_R weight rows
 * of the chunk (which stays in L1 while the input rows pass). */
static void run_chunk_tiled(const struct sil_mm_job *jb, sil_vec_dot_tile_fn tile, long r0, long r1,
                            const char *abase, size_t ars, size_t wrs)
{
    const int64_t k = jb->in->k;
    float *y[SIL_TILE_C];
    const void *a[SIL_TILE_C];
    for (int64_t j0 = 0; j0 < jb->n_rows; j0 += SIL_TILE_C) {
        const int nc = jb->n_rows - j0 < SIL_TILE_C ? (int)(jb->n_rows - j0) : SIL_TILE_C;
        for (int c = 0; c < nc; c++) {
            a[c] = abase + (size_t)(jb->rows ? jb->rows[j0 + c] : j0 + c) * ars;
            y[c] = jb->y + (jb->out_rows ? jb->out_rows[j0 + c] : j0 + c) * jb->ldy + r0;
        }
        for (long r = r0; r < r1; r += SIL_TILE_R) {
            const int nr = r1 - r < SIL_TILE_R ? (int)(r1 - r) : SIL_TILE_R;
            tile(k, (const char *)jb->w + (size_t)r * wrs, wrs, nr, a, nc, y);
            for (int c = 0; c < nc; c++)
                y[c] += nr;
        }
    }
}

static void run_chunk_one(const struct sil_mm_job *jb, long r0, long r1, float *scratch)
{
    const struct sil_mm_input *in = jb->in;
    const int64_t k = in->k;
    const struct sil_type_traits *wt = sil_type_traits(jb->wtype);
    const size_t wrs = sil_row_size(jb->wtype, k);
    int f = input_format(in, jb->wtype);
    const bool dequant = f == 0 && jb->wtype != SIL_TYPE_F32 && in->exact;
    const size_t ars = f == 0 ? (size_t)k * sizeof(float) : sil_row_size(format_type(f), k);
    const char *abase = f == 0 ? (const char *)in->x : (const char *)in->buf[f];
    const sil_vec_dot_tile_fn tile =
        f != 0 && jb->n_rows >= TILE_MIN_ROWS ? sil_vec_dot_tile(jb->wtype) : NULL;
    if (tile) {
        run_chunk_tiled(jb, tile, r0, r1, abase, ars, wrs);
        return;
    }
    for (long r = r0; r < r1; r++) {
        const void *wrow = (const char *)jb->w + (size_t)r * wrs;
        if (dequant) {
            wt->to_float(wrow, scratch, k);
            for (int64_t j = 0; j < jb->n_rows; j++) {
                int64_t src = jb->rows ? jb->rows[j] : j;
                jb->y[(jb->out_rows ? jb->out_rows[j] : j) * jb->ldy + r] = sil_dot_f32(scratch, in->x + src * k, k);
            }
        } else {
            for (int64_t j = 0; j < jb->n_rows; j++) {
                int64_t src = jb->rows ? jb->rows[j] : j;
                jb->y[(jb->out_rows ? jb->out_rows[j] : j) * jb->ldy + r] = wt->vec_dot(k, wrow, abase + (size_t)src * ars);
            }
        }
    }
}

static void run_chunk(const struct sil_mm_job *jb, long r0, long r1, float *scratch)
{
    run_chunk_one(jb, r0, r1, scratch);
    if (!jb->w_up) return;
    struct sil_mm_job up = *jb;
    up.w = jb->w_up;
    up.y = jb->y_up;
    up.w_up = NULL;
    run_chunk_one(&up, r0, r1, scratch);
    for (int64_t j = 0; j < jb->n_rows; j++) {
        const int64_t o = (jb->out_rows ? jb->out_rows[j] : j) * jb->ldy + r0;
        sil_swiglu(jb->y + o, jb->y + o, jb->y_up + o, r1 - r0);
    }
}

static void mm_run(void *arg, long c0, long c1, int ith)
{
    struct mm_task *t = arg;
    float *scratch = t->scratch + (int64_t)ith * t->scratch_stride;
    int job = 0;
    for (long c = c0; c < c1; c++) {
        while (c >= t->chunk_start[job + 1])
            job++;
        while (c < t->chunk_start[job])
            job--;
        const struct sil_mm_job *jb = &t->jobs[job];
        long r0 = (c - t->chunk_start[job]) * t->chunk_rows;
        long r1 = r0 + t->chunk_rows < jb->m ? r0 + t->chunk_rows : jb->m;
        run_chunk(jb, r0, r1, scratch);
    }
}

void sil_matmul(struct sil_threadpool *tp, const struct sil_mm_job *jobs, int n_jobs,
                float *scratch, int64_t k_max)
{
    while (n_jobs > SIL_MM_MAX_JOBS) { /* the chunk table is fixed-size: run in slices */
        sil_matmul(tp, jobs, SIL_MM_MAX_JOBS, scratch, k_max);
        jobs += SIL_MM_MAX_JOBS;
        n_jobs -= SIL_MM_MAX_JOBS;
    }
    struct mm_task t;
    t.jobs = jobs;
    t.n_jobs = n_jobs;
    t.chunk_start[0] = 0;
    int64_t work = 0, rows = 0, pairs = 0;
    for (int i = 0; i < n_jobs; i++) {
        /* the scratch holds rows of k_max: a wider input is the caller's bug, which would
         * otherwise write past it (an MTP layer's eh_proj once did, on a tiny model) */
        if (jobs[i].in->k > k_max) {
            fprintf(stderr, "sil_matmul: an input of %lld columns, the scratch is sized for %lld\n",
                    (long long)jobs[i].in->k, (long long)k_max);
            abort();
        }
        /* a SwiGLU pair's chunk covers its rows of both matrices: twice the work a row */
        work += (jobs[i].w_up ? 2 : 1) * jobs[i].m * jobs[i].n_rows * jobs[i].in->k;
        rows += jobs[i].n_rows > 0 ? jobs[i].m : 0;
        pairs += jobs[i].m * jobs[i].n_rows;
    }
    const int nth = sil_threadpool_n_threads(tp);
    long cr = CHUNK_ROWS;
    /* decode-sized work: input rows per weight row over all jobs, not the first job's (in a
     * batch's MoE call the lowest expert may have many rows and the others one) */
    if (pairs <= 4 * rows && rows > (int64_t)CHUNK_ROWS * CHUNKS_PER_THREAD * nth)
        cr = (long)(rows / ((int64_t)CHUNKS_PER_THREAD * nth)) / CHUNK_ROWS * CHUNK_ROWS;
    t.chunk_rows = cr;
    for (int i = 0; i < n_jobs; i++) {
        long nc = jobs[i].n_rows > 0 ? (long)((jobs[i].m + cr - 1) / cr) : 0;
        t.chunk_start[i + 1] = t.chunk_start[i] + nc;
    }
    t.scratch = scratch;
    t.scratch_stride = sil_matmul_scratch_floats(k_max);
    if (work < 32768)
        mm_run(&t, 0, t.chunk_start[n_jobs], 0); /* tiny: waking workers costs more than it saves */
    else
        sil_threadpool_for(tp, t.chunk_start[n_jobs], 1, mm_run, &t);
}
