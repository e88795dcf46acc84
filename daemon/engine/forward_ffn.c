/* Feed-forward blocks.
 *
 * ffn (qwen3, qwen35):  out = Wdown (silu(Wgate x) * Wup x)
 * moe (qwen3moe, qwen35moe):
 *   p = softmax(Wrouter x)  [n_expert];  top n_expert_used experts, weights p_e / sum(p_top)
 *   out = sum_e w_e * Wdown_e (silu(Wgate_e x) * Wup_e x)      (summed in top-k order)
 *   qwen35moe adds the shared expert: out += sigmoid(w_shgate . x) * ffn_shexp(x)
 * Expert work is grouped by expert: every (row, slot) pair routed to expert e is one job of e's
 * weights, and all experts' jobs run in one parallel matmul. */
#include <string.h>

#include "daemon/engine/forward.h"
#include "kernels/cpu/ops.h"

static const void *expert_slice(const struct sil_gguf_tensor *t, int e)
{
    return (const char *)t->data + (size_t)e * (t->nbytes / (size_t)t->ne[2]);
}

struct swiglu_task {
    float *out;
    const float *gate, *up;
    int64_t rows, width;
};

static void swiglu_run(void *arg, long lo, long hi, int ith)
{
    struct swiglu_task *t = arg;
    (void)ith;
    sil_swiglu(t->out + lo * t->width, t->gate + lo * t->width, t->up + lo * t->width,
               (hi - lo) * t->width);
}

static void swiglu(struct sil_fwd *f, float *out, const float *gate, const float *up, int64_t rows,
                   int64_t width)
{
    struct swiglu_task t = {out, gate, up, rows, width};
    if (rows * width < 16384)
        swiglu_run(&t, 0, rows, 0);
    else
        sil_threadpool_for(f->tp, rows, 0, swiglu_run, &t);
}

void sil_fwd_ffn(struct sil_fwd *f, const struct sil_ubatch *ub, int il, struct sil_act cur_,
        struct sil_act out_)
{
    const struct sil_hparams *hp = &f->model->hp;
    const struct sil_layer *l = &f->model->layers[il];
    const int n = ub->n, F = hp->n_ff, E = hp->n_embd;
    struct sil_mm_input in;
    sil_fwd_input(f, &in, 0, ((float *)cur_.data), n, E);
    struct sil_mm_job jobs[2] = {
        {.w = l->ffn_gate->data, .wtype = l->ffn_gate->type, .m = F, .in = &in, .n_rows = n, .y = f->a, .ldy = F},
        {.w = l->ffn_up->data, .wtype = l->ffn_up->type, .m = F, .in = &in, .n_rows = n, .y = f->b, .ldy = F},
    };
    sil_fwd_matmul(f, jobs, 2);
    swiglu(f, f->d, f->a, f->b, n, F);
    struct sil_mm_input in_h;
    sil_fwd_input(f, &in_h, 1, f->d, n, F);
    struct sil_mm_job jd = {.w = l->ffn_down->data, .wtype = l->ffn_down->type, .m = E, .in = &in_h,
                            .n_rows = n, .y = ((float *)out_.data), .ldy = E};
    sil_fwd_matmul(f, &jd, 1);
}

/* Softmax router + top-k for every row: fills sel_expert / sel_weight [n][K]. */
static void route(struct sil_fwd *f, int n)
{
    const struct sil_hparams *hp = &f->model->hp;
    const int X = hp->n_expert, K = hp->n_expert_used;
    for (int i = 0; i < n; i++) {
        float *p = f->router + (int64_t)i * X;
        sil_softmax(p, X);
        int32_t *sel = f->sel_expert + (int64_t)i * K;
        float *w = f->sel_weight + (int64_t)i * K;
        /* selection by repeated max: K is small (8) and this keeps ties in index order */
        float sum = 0.0f;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < X; e++) {
                bool taken = false;
                for (int j = 0; j < k; j++)
                    taken = taken || sel[j] == e;
                if (!taken && (best < 0 || p[e] > p[best]))
                    best = e;
            }
            sel[k] = best;
            w[k] = p[best];
            sum += p[best];
        }
        if (sum < 6.103515625e-5f)
            sum = 6.103515625e-5f; /* the reference clamps the sum the same way */
        for (int k = 0; k < K; k++)
            w[k] /= sum;
    }
}

void sil_fwd_moe(struct sil_fwd *f, const struct sil_ubatch *ub, int il, struct sil_act cur_,
        struct sil_act out_)
{
    const struct sil_hparams *hp = &f->model->hp;
    const struct sil_layer *l = &f->model->layers[il];
    const int n = ub->n, E = hp->n_embd, X = hp->n_expert, K = hp->n_expert_used;
    const int F = hp->n_ff_exp, S = hp->n_ff_shexp;
    const bool shexp = f->model->traits->shared_expert;
    const int64_t P = (int64_t)n * K;

    /* router logits (and the shared-expert gate logit) */
    struct sil_mm_input in;
    sil_fwd_input(f, &in, 0, ((float *)cur_.data), n, E);
    struct sil_mm_job rj[2] = {
        {.w = l->ffn_gate_inp->data, .wtype = l->ffn_gate_inp->type, .m = X, .in = &in, .n_rows = n, .y = f->router, .ldy = X},
    };
    if (shexp)
        rj[1] = (struct sil_mm_job){.w = l->ffn_gate_inp_shexp->data, .wtype = l->ffn_gate_inp_shexp->type,
                                    .m = 1, .in = &in, .n_rows = n, .y = f->sh_gate, .ldy = 1};
    sil_fwd_matmul(f, rj, shexp ? 2 : 1);
    route(f, n);

    /* pairs (row, slot) sorted by expert: pair p of expert e is at expert_off[e] + j */
    memset(f->expert_count, 0, sizeof(int32_t) * (size_t)(X + 1));
    for (int64_t q = 0; q < P; q++)
        f->expert_count[f->sel_expert[q]]++;
    f->expert_off[0] = 0;
    for (int e = 0; e < X; e++)
        f->expert_off[e + 1] = f->expert_off[e] + f->expert_count[e];
    memset(f->expert_count, 0, sizeof(int32_t) * (size_t)(X + 1));
    for (int64_t q = 0; q < P; q++) {
        int e = f->sel_expert[q];
        int32_t at = f->expert_off[e] + f->expert_count[e]++;
        f->pair_row[at] = (int32_t)(q / K);
        f->pair_slot[q] = at;
    }

    /* gate and up of every used expert (+ the shared expert) in one parallel matmul */
    int nj = 0;
    for (int e = 0; e < X; e++) {
        int32_t off = f->expert_off[e], cnt = f->expert_off[e + 1] - off;
        if (cnt == 0)
            continue;
        f->jobs[nj++] = (struct sil_mm_job){.w = expert_slice(l->ffn_gate_exps, e), .wtype = l->ffn_gate_exps->type,
                                            .m = F, .in = &in, .rows = f->pair_row + off, .n_rows = cnt,
                                            .y = f->moe_gate + (int64_t)off * F, .ldy = F};
        f->jobs[nj++] = (struct sil_mm_job){.w = expert_slice(l->ffn_up_exps, e), .wtype = l->ffn_up_exps->type,
                                            .m = F, .in = &in, .rows = f->pair_row + off, .n_rows = cnt,
                                            .y = f->moe_up + (int64_t)off * F, .ldy = F};
    }
    if (shexp) {
        f->jobs[nj++] = (struct sil_mm_job){.w = l->ffn_gate_shexp->data, .wtype = l->ffn_gate_shexp->type,
                                            .m = S, .in = &in, .n_rows = n, .y = f->a, .ldy = S};
        f->jobs[nj++] = (struct sil_mm_job){.w = l->ffn_up_shexp->data, .wtype = l->ffn_up_shexp->type,
                                            .m = S, .in = &in, .n_rows = n, .y = f->b, .ldy = S};
    }
    sil_fwd_matmul(f, f->jobs, nj);

    swiglu(f, f->moe_gate, f->moe_gate, f->moe_up, P, F);
    if (shexp)
        swiglu(f, f->d, f->a, f->b, n, S);

    /* down projections: experts into moe_down [P][E], shared expert into ((float *)out_.data) [n][E] */
    struct sil_mm_input in_h, in_s;
    sil_fwd_input(f, &in_h, 1, f->moe_gate, P, F);
    nj = 0;
    for (int e = 0; e < X; e++) {
        int32_t off = f->expert_off[e], cnt = f->expert_off[e + 1] - off;
        if (cnt == 0)
            continue;
        f->jobs[nj++] = (struct sil_mm_job){.w = expert_slice(l->ffn_down_exps, e), .wtype = l->ffn_down_exps->type,
                                            .m = E, .in = &in_h, .rows = f->iota + off, .n_rows = cnt,
                                            .y = f->moe_down + (int64_t)off * E, .ldy = E};
    }
    if (shexp) {
        /* the shared down input needs its own quantized copy: in_buf[0] is free again now */
        sil_fwd_input(f, &in_s, 0, f->d, n, S);
        f->jobs[nj++] = (struct sil_mm_job){.w = l->ffn_down_shexp->data, .wtype = l->ffn_down_shexp->type,
                                            .m = E, .in = &in_s, .n_rows = n, .y = ((float *)out_.data), .ldy = E};
    }
    sil_fwd_matmul(f, f->jobs, nj);

    for (int i = 0; i < n; i++) {
        float *out = ((float *)out_.data) + (int64_t)i * E;
        if (shexp) {
            const float g = sil_sigmoid(f->sh_gate[i]);
            for (int j = 0; j < E; j++)
                out[j] *= g;
        }
        /* experts summed in slot order first, then the shared expert added, as the reference */
        float *acc = ((float *)cur_.data) + (int64_t)i * E; /* cur is no longer needed */
        memset(acc, 0, sizeof(float) * (size_t)E);
        for (int k = 0; k < K; k++) {
            int64_t q = (int64_t)i * K + k;
            sil_axpy(acc, f->sel_weight[q], f->moe_down + (int64_t)f->pair_slot[q] * E, E);
        }
        if (shexp)
            sil_add(out, acc, E);
        else
            memcpy(out, acc, sizeof(float) * (size_t)E);
    }
}
