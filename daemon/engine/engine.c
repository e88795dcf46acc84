/* The engine API (engine.h): model + vocab + a backend (backend.h; the CPU one for now) + the
 * forward pass's state (forward.h) + per-sequence state (KV for attention layers, conv + SSM
 * state for delta-net layers), all sized at open. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/forward.h"
#include "daemon/engine/kv_cache.h"
#include "daemon/engine/model.h"
#include "daemon/engine/tokenizer.h"

/* Rows per forward pass: bounds the scratch (RSS) while keeping matmuls matrix-matrix. */
#define UBATCH_MAX 128

struct sil_engine {
    struct sil_model *model;
    struct sil_vocab *vocab;
    struct sil_model_info info;
    int32_t n_ctx, n_seq_max, n_batch_max;
    struct sil_fwd f;
    bool *seq_live;
    int32_t *seq_len;
    /* eval scratch */
    int32_t *next_pos;                        /* [n_seq_max] */
    int32_t *seq_count, *seq_off;             /* [n_seq_max + 1] */
    int32_t *p_token, *p_pos, *p_seq, *p_out; /* [n_batch_max] rows grouped by sequence */
    int32_t *run_start;                       /* [UBATCH_MAX + 1] */
};

void sil_engine_params_default(struct sil_engine_params *p)
{
    memset(p, 0, sizeof(*p));
}

static void *xcalloc(size_t n, size_t sz, bool *fail)
{
    void *p = calloc(n ? n : 1, sz);
    if (!p)
        *fail = true;
    return p;
}

static int64_t max64(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int alloc_scratch(struct sil_engine *e, struct sil_error *err)
{
    struct sil_fwd *f = &e->f;
    bool fail = false;
    f->recr_state = xcalloc((size_t)e->n_seq_max, sizeof(float *), &fail);

    e->seq_live = xcalloc((size_t)e->n_seq_max, sizeof(bool), &fail);
    e->seq_len = xcalloc((size_t)e->n_seq_max, sizeof(int32_t), &fail);
    e->next_pos = xcalloc((size_t)e->n_seq_max, sizeof(int32_t), &fail);
    e->seq_count = xcalloc((size_t)e->n_seq_max + 1, sizeof(int32_t), &fail);
    e->seq_off = xcalloc((size_t)e->n_seq_max + 1, sizeof(int32_t), &fail);
    e->p_token = xcalloc((size_t)e->n_batch_max, sizeof(int32_t), &fail);
    e->p_pos = xcalloc((size_t)e->n_batch_max, sizeof(int32_t), &fail);
    e->p_seq = xcalloc((size_t)e->n_batch_max, sizeof(int32_t), &fail);
    e->p_out = xcalloc((size_t)e->n_batch_max, sizeof(int32_t), &fail);
    e->run_start = xcalloc(UBATCH_MAX + 1, sizeof(int32_t), &fail);
    if (fail)
        return sil_errorf(err, -ENOMEM, "%s: out of memory for scratch buffers", e->info.path);
    return 0;
}

static void free_scratch(struct sil_engine *e)
{
    struct sil_fwd *f = &e->f;
    void *ptrs[] = {f->dn,      e->seq_live, e->seq_len, e->next_pos, e->seq_count, e->seq_off,
                    e->p_token, e->p_pos,    e->p_seq,   e->p_out,    e->run_start};
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++)
        free(ptrs[i]);
    if (f->recr_state)
        for (int s = 0; s < e->n_seq_max; s++)
            free(f->recr_state[s]);
    free(f->recr_state);
}

static int bind_delta_net(struct sil_engine *e, struct sil_error *err)
{
    const struct sil_model *m = e->model;
    const struct sil_hparams *hp = &m->hp;
    if (hp->n_layer_recr == 0)
        return 0;
    e->f.dn = calloc((size_t)hp->n_layer_recr, sizeof(struct sil_delta_net_params));
    if (!e->f.dn)
        return sil_errorf(err, -ENOMEM, "%s: out of memory", e->info.path);
    for (int il = 0; il < hp->n_layer; il++) {
        const struct sil_layer *l = &m->layers[il];
        if (l->recr_index < 0)
            continue;
        struct sil_delta_net_params *p = &e->f.dn[l->recr_index];
        p->n_k_heads = hp->ssm_n_group;
        p->n_v_heads = hp->ssm_dt_rank;
        p->head_k_dim = hp->ssm_d_state;
        p->head_v_dim = hp->ssm_d_inner / hp->ssm_dt_rank;
        p->conv_kernel = hp->ssm_d_conv;
        p->eps = hp->rms_eps;
        p->conv1d = l->ssm_conv1d->data;
        p->dt_bias = l->ssm_dt->data;
        p->a = l->ssm_a->data;
        p->norm = l->ssm_norm->data;
        int rc = sil_delta_net_check(p, err);
        if (rc < 0) {
            sil_error_prefix(err, "%s: layer %d", e->info.path, il);
            return rc;
        }
    }
    e->f.dn_state_floats = sil_delta_net_state_floats(&e->f.dn[0]);
    return 0;
}

/* The CPU backend, sized for this model: the widest matmul input, MoE and delta-net scratch. */
static int open_backend(struct sil_engine *e, int n_threads, bool exact, struct sil_error *err)
{
    struct sil_fwd *f = &e->f;
    const struct sil_hparams *hp = &e->model->hp;
    const int64_t hd = hp->n_embd_head_k;
    const int64_t zdim =
        hp->n_layer_recr > 0 ? (int64_t)f->dn[0].n_v_heads * f->dn[0].head_v_dim : 0;
    const int64_t ff = max64(hp->n_ff, hp->n_ff_shexp);
    struct sil_cpu_config c = {
        .n_threads = n_threads,
        .exact = exact,
        .k_max = max64(max64(hp->n_embd, hp->n_head * hd), max64(max64(ff, hp->n_ff_exp), zdim)),
        .ub_max = f->ub_max,
        .n_ctx = f->n_ctx,
        .n_embd = hp->n_embd,
        .n_expert = hp->n_expert,
        .n_expert_used = hp->n_expert_used,
        .n_ff_exp = hp->n_ff_exp,
        .n_ff_shexp = hp->n_ff_shexp,
        .dn_head_scratch =
            hp->n_layer_recr > 0 ? sil_delta_net_head_scratch_floats(&f->dn[0], f->ub_max) : 0,
    };
    int rc = sil_backend_cpu_create(&f->be, &c, err);
    if (rc < 0)
        return rc;
    return sil_fwd_open(f, err);
}

int sil_engine_open(struct sil_engine **out, const struct sil_engine_params *p, struct sil_error *err)
{
    if (!p || !p->model_path)
        return sil_errorf(err, -EINVAL, "engine: no model path");
    if (p->backend && strcmp(p->backend, "cpu") != 0 && strcmp(p->backend, "auto") != 0 &&
        strcmp(p->backend, "cuda") != 0)
        return sil_errorf(err, -EINVAL, "engine: unknown backend '%s' (cpu, cuda, auto)", p->backend);
    struct sil_engine *e = calloc(1, sizeof(*e));
    if (!e)
        return sil_errorf(err, -ENOMEM, "engine: out of memory");
    int rc = sil_model_load(&e->model, p->model_path, err);
    if (rc < 0) {
        free(e);
        return rc;
    }
    if (p->progress)
        p->progress(0.5f, "model mapped and validated", p->progress_user);
    const struct sil_hparams *hp = &e->model->hp;
    e->info = e->model->info;
    rc = sil_vocab_load(&e->vocab, e->model->gguf, err);
    if (rc < 0) {
        sil_model_free(e->model);
        free(e);
        return rc;
    }
    int nt = p->n_threads > 0 ? p->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (nt < 1)
        nt = 1;
    if (nt > 256)
        nt = 256;
    e->n_ctx = p->n_ctx > 0 ? p->n_ctx : (hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    e->n_seq_max = p->n_seq_max > 0 ? p->n_seq_max : 64;
    e->n_batch_max = p->n_batch_max > 0 ? p->n_batch_max : 512;
    e->info.n_threads = nt;
    struct sil_fwd *f = &e->f;
    f->model = e->model;
    f->n_ctx = e->n_ctx;
    f->ub_max = e->n_batch_max < UBATCH_MAX ? e->n_batch_max : UBATCH_MAX;
    if ((rc = bind_delta_net(e, err)) < 0)
        goto fail;
    if ((rc = alloc_scratch(e, err)) < 0)
        goto fail;
    if ((rc = open_backend(e, nt, p->exact, err)) < 0)
        goto fail;
    e->info.backend = f->be->ops->name;
    if ((rc = sil_kv_create(&f->kv, hp->n_layer_attn, e->n_seq_max, e->n_ctx,
                            hp->n_head_kv * hp->n_embd_head_k, hp->n_head_kv * hp->n_embd_head_v, err)) < 0)
        goto fail;
    if (p->progress)
        p->progress(1.0f, "ready", p->progress_user);
    *out = e;
    return 0;
fail:
    sil_engine_close(e);
    return rc;
}

void sil_engine_close(struct sil_engine *e)
{
    if (!e)
        return;
    sil_kv_free(e->f.kv);
    sil_fwd_close(&e->f);
    if (e->f.be)
        e->f.be->ops->free(e->f.be);
    free_scratch(e);
    sil_vocab_free(e->vocab);
    sil_model_free(e->model);
    free(e);
}

const struct sil_model_info *sil_engine_info(const struct sil_engine *e)
{
    return &e->info;
}

const struct sil_vocab *sil_engine_vocab(const struct sil_engine *e)
{
    return e->vocab;
}

int32_t sil_engine_n_ctx(const struct sil_engine *e)
{
    return e->n_ctx;
}

/* ---- sequences ---------------------------------------------------------------------------- */

int sil_seq_create(struct sil_engine *e, struct sil_error *err)
{
    int s = 0;
    while (s < e->n_seq_max && e->seq_live[s])
        s++;
    if (s == e->n_seq_max)
        return sil_errorf(err, -ENOSPC, "engine: all %d sequences are in use", e->n_seq_max);
    int rc = sil_kv_seq_alloc(e->f.kv, s, err);
    if (rc < 0)
        return rc;
    const int64_t nrs = (int64_t)e->model->hp.n_layer_recr * e->f.dn_state_floats;
    if (nrs > 0 && !e->f.recr_state[s]) {
        e->f.recr_state[s] = calloc((size_t)nrs, sizeof(float));
        if (!e->f.recr_state[s]) {
            sil_kv_seq_release(e->f.kv, s);
            return sil_errorf(err, -ENOMEM, "engine: out of memory for the recurrent state");
        }
    } else if (nrs > 0) {
        memset(e->f.recr_state[s], 0, sizeof(float) * (size_t)nrs);
    }
    e->seq_live[s] = true;
    e->seq_len[s] = 0;
    return s;
}

static bool seq_ok(const struct sil_engine *e, int seq)
{
    return seq >= 0 && seq < e->n_seq_max && e->seq_live[seq];
}

void sil_seq_free(struct sil_engine *e, int seq)
{
    if (!seq_ok(e, seq))
        return;
    sil_kv_seq_release(e->f.kv, seq);
    e->seq_live[seq] = false;
    e->seq_len[seq] = 0;
}

int32_t sil_seq_len(const struct sil_engine *e, int seq)
{
    return seq_ok(e, seq) ? e->seq_len[seq] : 0;
}

int sil_seq_truncate(struct sil_engine *e, int seq, int32_t n_pos, struct sil_error *err)
{
    if (!seq_ok(e, seq))
        return sil_errorf(err, -EINVAL, "engine: sequence %d is not live", seq);
    if (n_pos < 0 || n_pos > e->seq_len[seq])
        return sil_errorf(err, -EINVAL, "engine: cannot truncate sequence %d of length %d to %d", seq,
                          e->seq_len[seq], n_pos);
    if (n_pos == e->seq_len[seq])
        return 0;
    if (n_pos == 0) {
        const int64_t nrs = (int64_t)e->model->hp.n_layer_recr * e->f.dn_state_floats;
        if (nrs > 0)
            memset(e->f.recr_state[seq], 0, sizeof(float) * (size_t)nrs);
    } else if (e->model->hp.n_layer_recr > 0) {
        return sil_errorf(err, -ENOTSUP, "engine: sequence %d: no recurrent-state checkpoint at position %d",
                          seq, n_pos);
    }
    e->seq_len[seq] = n_pos; /* attention KV past n_pos is simply overwritten later */
    return 0;
}

uint64_t sil_seq_memory(const struct sil_engine *e, int seq)
{
    if (!seq_ok(e, seq))
        return 0;
    return sil_kv_seq_bytes(e->f.kv, e->seq_len[seq]) +
           (uint64_t)e->model->hp.n_layer_recr * (uint64_t)e->f.dn_state_floats * sizeof(float);
}

/* ---- evaluation --------------------------------------------------------------------------- */

int sil_engine_eval(struct sil_engine *e, const struct sil_batch *b, float *logits, struct sil_error *err)
{
    if (!b || b->n < 0 || b->n > e->n_batch_max)
        return sil_errorf(err, -EINVAL, "engine: batch of %d rows (max %d)", b ? b->n : -1, e->n_batch_max);
    if (b->n == 0)
        return 0;
    if (!b->token || !b->pos || !b->seq)
        return sil_errorf(err, -EINVAL, "engine: batch without token, pos or seq arrays");
    const int32_t n = b->n, V = e->model->hp.n_vocab;
    /* Validate everything before touching any state: an error leaves sequences unchanged. */
    for (int s = 0; s < e->n_seq_max; s++)
        e->next_pos[s] = e->seq_len[s];
    memset(e->seq_count, 0, sizeof(int32_t) * (size_t)(e->n_seq_max + 1));
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = b->seq[i];
        if (!seq_ok(e, s))
            return sil_errorf(err, -EINVAL, "engine: batch row %d: sequence %d is not live", i, s);
        if (b->token[i] < 0 || b->token[i] >= V)
            return sil_errorf(err, -EINVAL, "engine: batch row %d: token %d outside [0, %d)", i,
                              b->token[i], V);
        if (b->pos[i] != e->next_pos[s])
            return sil_errorf(err, -EINVAL, "engine: batch row %d: position %d, sequence %d expects %d", i,
                              b->pos[i], s, e->next_pos[s]);
        if (b->pos[i] >= e->n_ctx)
            return sil_errorf(err, -ENOSPC, "engine: batch row %d: position %d beyond the context (%d)", i,
                              b->pos[i], e->n_ctx);
        e->next_pos[s]++;
        e->seq_count[s]++;
    }
    /* Rows grouped by sequence (stable), with the logits row each one writes. */
    e->seq_off[0] = 0;
    for (int s = 0; s < e->n_seq_max; s++)
        e->seq_off[s + 1] = e->seq_off[s] + e->seq_count[s];
    int32_t n_out = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t s = b->seq[i];
        bool want = b->want_logits ? b->want_logits[i] : b->pos[i] == e->next_pos[s] - 1;
        int32_t at = e->seq_off[s]++;
        e->p_token[at] = b->token[i];
        e->p_pos[at] = b->pos[i];
        e->p_seq[at] = s;
        e->p_out[at] = want ? n_out++ : -1;
    }
    if (n_out > 0 && !logits)
        return sil_errorf(err, -EINVAL, "engine: %d rows want logits but no logits buffer was given", n_out);

    for (int32_t r0 = 0; r0 < n; r0 += e->f.ub_max) {
        struct sil_ubatch ub;
        ub.n = n - r0 < e->f.ub_max ? n - r0 : e->f.ub_max;
        ub.token = e->p_token + r0;
        ub.pos = e->p_pos + r0;
        ub.seq = e->p_seq + r0;
        ub.out_row = e->p_out + r0;
        ub.n_runs = 0;
        for (int32_t i = 0; i < ub.n; i++)
            if (i == 0 || ub.seq[i] != ub.seq[i - 1])
                e->run_start[ub.n_runs++] = i;
        e->run_start[ub.n_runs] = ub.n;
        ub.run_start = e->run_start;
        sil_forward(&e->f, &ub, logits);
    }
    for (int s = 0; s < e->n_seq_max; s++)
        e->seq_len[s] = e->next_pos[s];
    return 0;
}

void sil_engine_stats(const struct sil_engine *e, struct sil_engine_stats *out)
{
    out->n_ubatch = e->f.n_ubatch;
    out->n_rows = e->f.n_rows;
    out->expert_bytes = e->f.expert_bytes;
}
