/* The layer loop shared by all four architectures:
 *
 *   x = token_embd[token]                                    [n, n_embd]
 *   for each layer:
 *     x += attention(rmsnorm(x) * attn_norm)     (or the gated delta net on Qwen3.5's
 *                                                 linear-attention layers)
 *     x += ffn_or_moe(rmsnorm(x) * ffn_norm)     (Qwen3.5 names it post_attention_norm)
 *   logits = output(rmsnorm(x) * output_norm)    only for rows that want logits */
#include <string.h>

#include "daemon/engine/forward.h"
#include "kernels/cpu/ops.h"

void sil_fwd_matmul(struct sil_fwd *f, struct sil_mm_job *jobs, int n_jobs)
{
    for (int i = 0; i < n_jobs; i++)
        sil_mm_input_prepare(f->tp, jobs[i].in, jobs[i].wtype);
    sil_matmul(f->tp, jobs, n_jobs, f->mm_scratch, f->k_max);
}

void sil_fwd_input(struct sil_fwd *f, struct sil_mm_input *in, int which, const float *x, int64_t n,
                   int64_t k)
{
    const int64_t rows = (int64_t)f->ub_max * (f->model->hp.n_expert_used > 0 ? f->model->hp.n_expert_used : 1);
    sil_mm_input_init(in, x, n, k, f->exact, f->in_buf[which], f->k_max, rows);
}

struct norm_task {
    float *y;
    const float *x, *w;
    int64_t rows, width;
    float eps;
};

static void norm_run(void *arg, long lo, long hi, int ith)
{
    struct norm_task *t = arg;
    (void)ith;
    for (long i = lo; i < hi; i++)
        sil_rmsnorm(t->y + i * t->width, t->x + i * t->width, t->w, t->width, t->eps);
}

static void rmsnorm_rows(struct sil_fwd *f, float *y, const float *x, const struct sil_gguf_tensor *w,
                         int64_t rows)
{
    struct norm_task t = {y, x, w->data, rows, f->model->hp.n_embd, f->model->hp.rms_eps};
    if (rows < 8)
        norm_run(&t, 0, rows, 0);
    else
        sil_threadpool_for(f->tp, rows, 0, norm_run, &t);
}

static void embed(struct sil_fwd *f, const struct sil_ubatch *ub)
{
    const struct sil_gguf_tensor *te = f->model->tok_embd;
    const int64_t E = f->model->hp.n_embd;
    const size_t rs = sil_row_size(te->type, E);
    for (int i = 0; i < ub->n; i++)
        sil_dequantize_row(te->type, (const char *)te->data + (size_t)ub->token[i] * rs, f->x + i * E, E);
}

void sil_fwd_output(struct sil_fwd *f, const struct sil_ubatch *ub, float *logits)
{
    const struct sil_model *m = f->model;
    const int64_t E = m->hp.n_embd;
    int n_out = 0;
    for (int i = 0; i < ub->n; i++) {
        if (ub->out_row[i] < 0)
            continue;
        sil_rmsnorm(f->cur + n_out * E, f->x + i * E, m->output_norm->data, E, m->hp.rms_eps);
        f->out_rows[n_out++] = ub->out_row[i];
    }
    if (n_out == 0)
        return;
    struct sil_mm_input in;
    sil_fwd_input(f, &in, 0, f->cur, n_out, E);
    struct sil_mm_job j = {.w = m->output->data, .wtype = m->output->type, .m = m->hp.n_vocab, .in = &in,
                           .n_rows = n_out, .y = logits, .out_rows = f->out_rows, .ldy = m->hp.n_vocab};
    sil_fwd_matmul(f, &j, 1);
}

/* After the last layer's attention only rows that want logits matter: they are moved to the
 * front of x and the last FFN runs on them alone (prefill with logits for the last row skips
 * 1/n_layer of the FFN work). Returns the reduced ubatch. */
static struct sil_ubatch keep_output_rows(struct sil_fwd *f, const struct sil_ubatch *ub)
{
    const int64_t E = f->model->hp.n_embd;
    struct sil_ubatch r = *ub;
    int32_t j = 0;
    for (int32_t i = 0; i < ub->n; i++) {
        if (ub->out_row[i] < 0)
            continue;
        if (j != i)
            memmove(f->x + j * E, f->x + i * E, sizeof(float) * (size_t)E);
        f->last_out[j++] = ub->out_row[i];
    }
    r.n = j;
    r.out_row = f->last_out;
    r.token = r.pos = r.seq = NULL; /* the FFN and the output head use neither */
    r.n_runs = 0;
    return r;
}

void sil_forward(struct sil_fwd *f, const struct sil_ubatch *ub, float *logits)
{
    const struct sil_model *m = f->model;
    const int64_t E = m->hp.n_embd;
    struct sil_ubatch last;
    embed(f, ub);
    for (int il = 0; il < m->hp.n_layer; il++) {
        const struct sil_layer *l = &m->layers[il];
        rmsnorm_rows(f, f->cur, f->x, l->attn_norm, ub->n);
        if (m->hp.recurrent[il])
            sil_fwd_delta_net(f, ub, il);
        else
            sil_fwd_attention(f, ub, il);
        sil_add(f->x, f->tmp, (int64_t)ub->n * E);
        if (il == m->hp.n_layer - 1) {
            last = keep_output_rows(f, ub);
            ub = &last;
            if (ub->n == 0)
                return;
        }
        rmsnorm_rows(f, f->cur, f->x, l->ffn_norm, ub->n);
        if (m->traits->moe)
            sil_fwd_moe(f, ub, il);
        else
            sil_fwd_ffn(f, ub, il);
        sil_add(f->x, f->tmp, (int64_t)ub->n * E);
    }
    sil_fwd_output(f, ub, logits);
}
