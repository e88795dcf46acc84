/* The forward pass, one function per block (engine-internal). A ubatch is a list of rows
 * (token, position, sequence) grouped by sequence, each sequence's rows in position order.
 * Every buffer is sized at engine open for ub_max rows; nothing here allocates. */
#ifndef SIL_FORWARD_H
#define SIL_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/engine/delta_net.h"
#include "daemon/engine/kv_cache.h"
#include "daemon/engine/model.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/threadpool.h"

struct sil_ubatch {
    int32_t n;
    const int32_t *token, *pos, *seq;
    const int32_t *out_row; /* logits row for this row, or -1 */
    /* runs of one sequence: rows [run_start[i], run_start[i+1]) */
    int32_t n_runs;
    const int32_t *run_start;
};

struct sil_fwd {
    const struct sil_model *model;
    struct sil_threadpool *tp;
    int n_threads;
    bool exact;
    int32_t ub_max, n_ctx;
    int64_t k_max; /* widest matmul input */
    struct sil_kv_cache *kv;
    float **recr_state;                  /* [seq] -> n_layer_recr * dn_state_floats floats */
    struct sil_delta_net_params *dn;     /* [n_layer_recr] */
    int64_t dn_state_floats;

    /* scratch, [ub_max][...] unless noted */
    float *x;        /* [E] residual stream */
    float *cur;      /* [E] normed input of a block */
    float *tmp;      /* [E] block output */
    float *a;        /* widest projection output (q_full, qkv_mixed, gate) */
    float *b;        /* k / z / up */
    float *c;        /* v / alpha+beta */
    float *d;        /* attention output / delta-net output / swiglu */
    float *e;        /* conv_out */
    float *moe_gate, *moe_up; /* [ub_max * n_expert_used][n_ff_exp] */
    float *moe_down;          /* [ub_max * n_expert_used][E] */
    float *router;            /* [ub_max][n_expert] */
    float *sh_gate;           /* [ub_max] */
    int32_t *sel_expert;      /* [ub_max * n_expert_used] */
    float *sel_weight;        /* [ub_max * n_expert_used] */
    int32_t *pair_row, *pair_slot, *iota; /* [ub_max * n_expert_used] */
    int32_t *expert_count, *expert_off;   /* [n_expert + 1] */
    float *attn_scratch;      /* [n_threads][n_ctx] */
    float *dn_scratch;        /* [n_threads][dn head scratch] */
    int64_t dn_head_scratch;
    float *mm_scratch;        /* [n_threads][matmul scratch] */
    void *in_buf[2];          /* quantized copies of matmul inputs */
    struct sil_mm_job *jobs;  /* [2 * n_expert + 8] */
    int32_t *out_rows;        /* [ub_max] */
    int32_t *last_out;        /* [ub_max] out_row of the rows kept for the last layer's FFN */
};

void sil_forward(struct sil_fwd *f, const struct sil_ubatch *ub, float *logits);

/* blocks: input f->cur [n][E], output f->tmp [n][E] */
void sil_fwd_attention(struct sil_fwd *f, const struct sil_ubatch *ub, int il);
void sil_fwd_delta_net(struct sil_fwd *f, const struct sil_ubatch *ub, int il);
void sil_fwd_ffn(struct sil_fwd *f, const struct sil_ubatch *ub, int il);
void sil_fwd_moe(struct sil_fwd *f, const struct sil_ubatch *ub, int il);
/* final norm + output head for rows with out_row >= 0, into logits[out_row][n_vocab] */
void sil_fwd_output(struct sil_fwd *f, const struct sil_ubatch *ub, float *logits);

/* helpers shared by the blocks */
void sil_fwd_matmul(struct sil_fwd *f, struct sil_mm_job *jobs, int n_jobs);
void sil_fwd_input(struct sil_fwd *f, struct sil_mm_input *in, int which, const float *x, int64_t n,
                   int64_t k);

#endif
