#include "daemon/engine/model.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const struct sil_arch_traits arch_table[SIL_ARCH_COUNT] = {
    [SIL_ARCH_QWEN35MOE] = {"qwen35moe", true, true, true, true, true},
    [SIL_ARCH_QWEN35] = {"qwen35", true, false, false, true, true},
    [SIL_ARCH_QWEN3MOE] = {"qwen3moe", false, true, false, false, false},
    [SIL_ARCH_QWEN3] = {"qwen3", false, false, false, false, false},
};

const struct sil_arch_traits *sil_arch_traits(enum sil_arch a)
{
    return (unsigned)a < SIL_ARCH_COUNT ? &arch_table[a] : NULL;
}

int sil_arch_from_name(const char *name, size_t len)
{
    for (int a = 0; a < SIL_ARCH_COUNT; a++)
        if (strlen(arch_table[a].name) == len && memcmp(arch_table[a].name, name, len) == 0)
            return a;
    return -1;
}

/* ---- hyperparameters ---------------------------------------------------------------------- */

struct loader {
    struct sil_model *m;
    const char *path;
    const char *arch;
    struct sil_error *err;
};

/* Reads {arch}.key as u32 into *out; absent -> def (def < 0: required). Range [lo, hi]. */
static int key_u32(struct loader *L, const char *key, int32_t *out, int64_t def, int64_t lo,
                   int64_t hi)
{
    char full[160];
    snprintf(full, sizeof(full), "%s.%s", L->arch, key);
    uint32_t v;
    int rc = sil_gguf_get_u32(L->m->gguf, full, &v, L->err);
    if (rc == -ENOENT) {
        if (def < 0)
            return sil_errorf(L->err, -EINVAL, "%s: required key '%s' is missing", L->path, full);
        *out = (int32_t)def;
        return 0;
    }
    if (rc < 0) {
        sil_error_prefix(L->err, "%s", L->path);
        return rc == -ERANGE ? -EINVAL : rc;
    }
    if ((int64_t)v < lo || (int64_t)v > hi)
        return sil_errorf(L->err, -EINVAL, "%s: key '%s' = %" PRIu32 " outside [%" PRId64 ", %" PRId64 "]",
                          L->path, full, v, lo, hi);
    *out = (int32_t)v;
    return 0;
}

static int key_f32(struct loader *L, const char *key, float *out, float def, bool required)
{
    char full[160];
    snprintf(full, sizeof(full), "%s.%s", L->arch, key);
    int rc = sil_gguf_get_f32(L->m->gguf, full, out, L->err);
    if (rc == -ENOENT) {
        if (required)
            return sil_errorf(L->err, -EINVAL, "%s: required key '%s' is missing", L->path, full);
        *out = def;
        return 0;
    }
    if (rc < 0) {
        sil_error_prefix(L->err, "%s", L->path);
        return rc;
    }
    if (!isfinite(*out) || *out <= 0.0f)
        return sil_errorf(L->err, -EINVAL, "%s: key '%s' = %g must be finite and > 0", L->path, full,
                          (double)*out);
    return 0;
}

static int load_hparams(struct loader *L)
{
    struct sil_model *m = L->m;
    struct sil_hparams *hp = &m->hp;
    const struct sil_arch_traits *t = m->traits;
    int rc;
#define U32(key, field, def, lo, hi)                                                               \
    do {                                                                                           \
        if ((rc = key_u32(L, key, &hp->field, def, lo, hi)) < 0)                                  \
            return rc;                                                                             \
    } while (0)
    U32("context_length", n_ctx_train, -1, 1, INT32_MAX);
    U32("embedding_length", n_embd, -1, 1, 65536);
    U32("block_count", n_layer, -1, 1, SIL_MAX_LAYERS);
    /* llama.cpp's converters count the MTP layers in block_count (the trunk is the rest) */
    U32("nextn_predict_layers", n_nextn, 0, 0, hp->n_layer - 1);
    if (hp->n_nextn > 1)
        return sil_errorf(L->err, -ENOTSUP, "%s: key '%s.nextn_predict_layers' = %d: one MTP layer is supported",
                          L->path, L->arch, hp->n_nextn);
    hp->n_layer -= hp->n_nextn;
    U32("attention.head_count", n_head, -1, 1, 1024);
    U32("attention.head_count_kv", n_head_kv, hp->n_head, 1, 1024);
    U32("attention.key_length", n_embd_head_k, hp->n_embd / hp->n_head, 1, 1024);
    U32("attention.value_length", n_embd_head_v, hp->n_embd_head_k, 1, 1024);
    U32("rope.dimension_count", n_rot, hp->n_embd_head_k, 2, 1024);
    if (hp->n_head % hp->n_head_kv != 0)
        return sil_errorf(L->err, -EINVAL, "%s: key '%s.attention.head_count' = %d is not a multiple of head_count_kv = %d",
                          L->path, L->arch, hp->n_head, hp->n_head_kv);
    if (hp->n_rot > hp->n_embd_head_k || hp->n_rot % 2 != 0)
        return sil_errorf(L->err, -EINVAL, "%s: key '%s.rope.dimension_count' = %d must be even and <= key_length %d",
                          L->path, L->arch, hp->n_rot, hp->n_embd_head_k);
    if (hp->n_embd_head_k != hp->n_embd_head_v)
        return sil_errorf(L->err, -EINVAL, "%s: key_length %d != value_length %d (not supported)",
                          L->path, hp->n_embd_head_k, hp->n_embd_head_v);
    if ((rc = key_f32(L, "attention.layer_norm_rms_epsilon", &hp->rms_eps, 1e-6f, true)) < 0)
        return rc;
    if ((rc = key_f32(L, "rope.freq_base", &hp->rope_freq_base, 10000.0f, false)) < 0)
        return rc;
    if (t->moe) {
        U32("expert_count", n_expert, -1, 1, 4096);
        U32("expert_used_count", n_expert_used, -1, 1, hp->n_expert);
        U32("feed_forward_length", n_ff, 0, 0, 1 << 20);
        U32("expert_feed_forward_length", n_ff_exp, hp->n_ff ? hp->n_ff / hp->n_expert_used : -1, 1, 1 << 20);
        if (t->shared_expert)
            U32("expert_shared_feed_forward_length", n_ff_shexp, hp->n_ff ? hp->n_ff : -1, 1, 1 << 20);
    } else {
        U32("feed_forward_length", n_ff, -1, 1, 1 << 20);
    }
    if (t->hybrid) {
        U32("ssm.conv_kernel", ssm_d_conv, -1, 1, 64);
        U32("ssm.inner_size", ssm_d_inner, -1, 1, 1 << 20);
        U32("ssm.state_size", ssm_d_state, -1, 1, 1024);
        U32("ssm.time_step_rank", ssm_dt_rank, -1, 1, 4096);
        U32("ssm.group_count", ssm_n_group, -1, 1, 4096);
        U32("full_attention_interval", full_attn_interval, 4, 1, SIL_MAX_LAYERS);
        if (hp->ssm_dt_rank % hp->ssm_n_group != 0 || hp->ssm_d_inner % hp->ssm_dt_rank != 0)
            return sil_errorf(L->err, -EINVAL, "%s: ssm.time_step_rank %d must be a multiple of ssm.group_count %d and divide ssm.inner_size %d",
                              L->path, hp->ssm_dt_rank, hp->ssm_n_group, hp->ssm_d_inner);
        char full[160];
        snprintf(full, sizeof(full), "%s.rope.dimension_sections", L->arch);
        enum sil_gguf_vtype et;
        uint64_t len;
        int64_t idx;
        rc = sil_gguf_get_arr(m->gguf, full, &et, &len, &idx, L->err);
        if (rc == 0) {
            for (uint64_t j = 0; j < len && j < 4; j++) {
                int64_t v;
                if (sil_gguf_arr_get_i64(m->gguf, idx, j, &v) < 0 || v < 0 || v > 1024)
                    return sil_errorf(L->err, -EINVAL, "%s: key '%s'[%" PRIu64 "] is not a small integer",
                                      L->path, full, j);
                hp->rope_sections[j] = (int32_t)v;
            }
        } else if (rc != -ENOENT) {
            sil_error_prefix(L->err, "%s", L->path);
            return rc;
        }
    }
#undef U32
    hp->n_layer_attn = hp->n_layer_recr = 0;
    for (int il = 0; il < hp->n_layer; il++) {
        hp->recurrent[il] = t->hybrid && (il + 1) % hp->full_attn_interval != 0;
        if (hp->recurrent[il])
            hp->n_layer_recr++;
        else
            hp->n_layer_attn++;
    }
    return 0;
}

/* ---- tensors ------------------------------------------------------------------------------ */

/* Binds tensor `name`; shape must be exactly {ne0, ne1, ne2} (0 = dimension absent). f32 forces
 * the type (element-wise weights). Absent and !required -> *out = NULL, 0. */
static int bind(struct loader *L, const struct sil_gguf_tensor **out, const char *name, int64_t ne0,
                int64_t ne1, int64_t ne2, bool required, bool f32)
{
    const struct sil_gguf_tensor *t = sil_gguf_find_tensor(L->m->gguf, name);
    *out = NULL;
    if (!t) {
        if (!required)
            return 0;
        return sil_errorf(L->err, -EINVAL, "%s: tensor '%s' is missing (architecture %s)", L->path,
                          name, L->arch);
    }
    uint64_t off = sil_gguf_data_offset(L->m->gguf) + t->offset;
    int64_t want[3] = {ne0, ne1, ne2};
    uint32_t nd = ne2 ? 3 : ne1 ? 2 : 1;
    bool ok = t->n_dims >= nd;
    for (uint32_t d = 0; d < SIL_GGUF_MAX_DIMS; d++)
        ok = ok && t->ne[d] == (d < nd ? want[d] : 1);
    if (!ok)
        return sil_errorf(L->err, -EINVAL,
                          "%s: tensor '%s' has shape [%" PRId64 ", %" PRId64 ", %" PRId64 ", %" PRId64
                          "], expected [%" PRId64 ", %" PRId64 ", %" PRId64 "] (data at offset 0x%" PRIx64 ")",
                          L->path, name, t->ne[0], t->ne[1], t->ne[2], t->ne[3], ne0, ne1 ? ne1 : 1,
                          ne2 ? ne2 : 1, off);
    const struct sil_type_traits *tt = sil_type_traits(t->type);
    /* q8_1 / q8_K are activation formats: known, but no weight is multiplied from them */
    if (!tt || !tt->supported || !tt->vec_dot || !tt->to_float ||
        (f32 && t->type != SIL_TYPE_F32))
        return sil_errorf(L->err, -EINVAL, "%s: tensor '%s' has type %s, %s (data at offset 0x%" PRIx64 ")",
                          L->path, name, sil_type_name(t->type),
                          f32 ? "expected f32" : "which is not supported", off);
    *out = t;
    return 0;
}

static int bind_blk(struct loader *L, const struct sil_gguf_tensor **out, int il, const char *what,
                    int64_t ne0, int64_t ne1, int64_t ne2, bool f32)
{
    char name[128];
    snprintf(name, sizeof(name), "blk.%d.%s", il, what);
    return bind(L, out, name, ne0, ne1, ne2, true, f32);
}

/* Layouts a converter can write on request (fused projections) that we do not read yet: one
 * clear -ENOTSUP instead of a "missing tensor" that would send the user looking for damage. */
static int check_fused(struct loader *L, int il, const char *fused, const char *separate)
{
    char a[128], b[128];
    snprintf(a, sizeof(a), "blk.%d.%s", il, fused);
    snprintf(b, sizeof(b), "blk.%d.%s", il, separate);
    if (sil_gguf_find_tensor(L->m->gguf, a) && !sil_gguf_find_tensor(L->m->gguf, b))
        return sil_errorf(L->err, -ENOTSUP, "%s: tensor '%s' (fused layout) is not supported yet; convert without fusing (separate '%s')",
                          L->path, a, b);
    return 0;
}

/* The MTP layer's stem and head (struct sil_nextn). A file that declares the layer carries all
 * of it: a missing or misshapen tensor is an error, as in the trunk, rather than a layer
 * silently dropped (a broken conversion should not pass for a model without MTP). */
static int bind_nextn(struct loader *L)
{
    struct sil_model *m = L->m;
    struct sil_nextn *n = &m->nextn;
    const int64_t E = m->hp.n_embd, V = m->hp.n_vocab;
    const int il = m->hp.n_layer;
    char name[128];
    int rc;
#define NX(field, what, ne0, ne1, required, f32)                                                   \
    do {                                                                                           \
        snprintf(name, sizeof(name), "blk.%d.nextn.%s", il, what);                                 \
        if ((rc = bind(L, &n->field, name, ne0, ne1, 0, required, f32)) < 0)                      \
            return rc;                                                                             \
    } while (0)
    NX(eh_proj, "eh_proj.weight", 2 * E, E, true, false);
    NX(enorm, "enorm.weight", E, 0, true, true);
    NX(hnorm, "hnorm.weight", E, 0, true, true);
    NX(shared_head_norm, "shared_head_norm.weight", E, 0, false, true);
    NX(embed_tokens, "embed_tokens.weight", E, V, false, false);
    NX(shared_head_head, "shared_head_head.weight", E, V, false, false);
#undef NX
    if (!n->shared_head_norm) n->shared_head_norm = m->output_norm;
    if (!n->embed_tokens) n->embed_tokens = m->tok_embd;
    if (!n->shared_head_head) n->shared_head_head = m->output;
    return 0;
}

static int bind_tensors(struct loader *L)
{
    struct sil_model *m = L->m;
    const struct sil_hparams *hp = &m->hp;
    const struct sil_arch_traits *t = m->traits;
    const int64_t E = hp->n_embd, V = hp->n_vocab, hd = hp->n_embd_head_k;
    int rc;
#define B(...)                                                                                     \
    do {                                                                                           \
        if ((rc = bind_blk(L, __VA_ARGS__)) < 0)                                                  \
            return rc;                                                                             \
    } while (0)
    if ((rc = bind(L, &m->tok_embd, "token_embd.weight", E, V, 0, true, false)) < 0 ||
        (rc = bind(L, &m->output_norm, "output_norm.weight", E, 0, 0, true, true)) < 0 ||
        (rc = bind(L, &m->output, "output.weight", E, V, 0, false, false)) < 0)
        return rc;
    m->tied_output = m->output == NULL;
    if (m->tied_output)
        m->output = m->tok_embd;
    int ia = 0, ir = 0;
    for (int il = 0; il < hp->n_layer + hp->n_nextn; il++) {
        struct sil_layer *l = &m->layers[il];
        l->attn_index = l->recr_index = -1;
        if (il == hp->n_layer) { /* the MTP block: full attention, its own KV (layer 0 there) */
            if ((rc = bind_nextn(L)) < 0)
                return rc;
            ia = 0;
        }
        B(&l->attn_norm, il, "attn_norm.weight", E, 0, 0, true);
        B(&l->ffn_norm, il, t->post_attn_norm ? "post_attention_norm.weight" : "ffn_norm.weight", E, 0, 0, true);
        if (hp->recurrent[il]) {
            const int64_t dk = hp->ssm_d_state, nk = hp->ssm_n_group, nv = hp->ssm_dt_rank;
            const int64_t dv = hp->ssm_d_inner / nv;
            const int64_t conv_dim = 2 * nk * dk + nv * dv;
            l->recr_index = ir++;
            B(&l->wqkv, il, "attn_qkv.weight", E, conv_dim, 0, false);
            B(&l->wgate, il, "attn_gate.weight", E, nv * dv, 0, false);
            B(&l->ssm_conv1d, il, "ssm_conv1d.weight", hp->ssm_d_conv, conv_dim, 0, true);
            B(&l->ssm_dt, il, "ssm_dt.bias", nv, 0, 0, true);
            B(&l->ssm_a, il, "ssm_a", nv, 0, 0, true);
            B(&l->ssm_beta, il, "ssm_beta.weight", E, nv, 0, false);
            B(&l->ssm_alpha, il, "ssm_alpha.weight", E, nv, 0, false);
            B(&l->ssm_norm, il, "ssm_norm.weight", dv, 0, 0, true);
            B(&l->ssm_out, il, "ssm_out.weight", nv * dv, E, 0, false);
        } else {
            l->attn_index = ia++;
            if ((rc = check_fused(L, il, "attn_qkv.weight", "attn_q.weight")) < 0)
                return rc;
            const int64_t q_out = hd * hp->n_head * (t->gated_attn ? 2 : 1);
            B(&l->wq, il, "attn_q.weight", E, q_out, 0, false);
            B(&l->wk, il, "attn_k.weight", E, hd * hp->n_head_kv, 0, false);
            B(&l->wv, il, "attn_v.weight", E, hd * hp->n_head_kv, 0, false);
            B(&l->wo, il, "attn_output.weight", hd * hp->n_head, E, 0, false);
            B(&l->q_norm, il, "attn_q_norm.weight", hd, 0, 0, true);
            B(&l->k_norm, il, "attn_k_norm.weight", hd, 0, 0, true);
        }
        if (t->moe) {
            const int64_t X = hp->n_expert, F = hp->n_ff_exp;
            if ((rc = check_fused(L, il, "ffn_gate_up_exps.weight", "ffn_gate_exps.weight")) < 0)
                return rc;
            B(&l->ffn_gate_inp, il, "ffn_gate_inp.weight", E, X, 0, false);
            B(&l->ffn_gate_exps, il, "ffn_gate_exps.weight", E, F, X, false);
            B(&l->ffn_up_exps, il, "ffn_up_exps.weight", E, F, X, false);
            B(&l->ffn_down_exps, il, "ffn_down_exps.weight", F, E, X, false);
            if (t->shared_expert) {
                const int64_t S = hp->n_ff_shexp;
                B(&l->ffn_gate_inp_shexp, il, "ffn_gate_inp_shexp.weight", E, 0, 0, false);
                B(&l->ffn_gate_shexp, il, "ffn_gate_shexp.weight", E, S, 0, false);
                B(&l->ffn_up_shexp, il, "ffn_up_shexp.weight", E, S, 0, false);
                B(&l->ffn_down_shexp, il, "ffn_down_shexp.weight", S, E, 0, false);
            }
        } else {
            B(&l->ffn_gate, il, "ffn_gate.weight", E, hp->n_ff, 0, false);
            B(&l->ffn_up, il, "ffn_up.weight", E, hp->n_ff, 0, false);
            B(&l->ffn_down, il, "ffn_down.weight", hp->n_ff, E, 0, false);
        }
    }
#undef B
    return 0;
}

static bool is_routed_expert(const char *name)
{
    return strstr(name, "_exps.") != NULL;
}

static void fill_info(struct sil_model *m, const char *path)
{
    struct sil_model_info *in = &m->info;
    const struct sil_hparams *hp = &m->hp;
    in->arch = m->arch;
    in->arch_name = m->traits->name;
    in->path = sil_gguf_path(m->gguf);
    in->file_bytes = sil_gguf_file_size(m->gguf);
    sil_gguf_file_id(m->gguf, &in->file_dev, &in->file_ino);
    struct sil_str s;
    struct sil_error e;
    if (sil_gguf_get_str(m->gguf, "general.name", &s, &e) == 0 && s.len > 0) {
        size_t n = s.len < sizeof(m->name) - 1 ? s.len : sizeof(m->name) - 1;
        memcpy(m->name, s.ptr, n);
        m->name[n] = 0;
    } else {
        const char *b = strrchr(path, '/');
        snprintf(m->name, sizeof(m->name), "%s", b ? b + 1 : path);
    }
    in->name = m->name;
    in->n_vocab = hp->n_vocab;
    in->n_ctx_train = hp->n_ctx_train;
    in->n_embd = hp->n_embd;
    in->n_layer = hp->n_layer;
    in->n_head = hp->n_head;
    in->n_head_kv = hp->n_head_kv;
    in->n_expert = hp->n_expert;
    in->n_expert_used = hp->n_expert_used;
    in->backend = "cpu";
    for (int64_t i = 0; i < sil_gguf_n_tensors(m->gguf); i++) {
        const struct sil_gguf_tensor *t = sil_gguf_tensor(m->gguf, i);
        in->n_params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3]);
        if (is_routed_expert(t->name))
            in->routed_expert_bytes += t->nbytes;
        else
            in->backbone_bytes += t->nbytes;
        if (t->type >= 0 && t->type < SIL_TYPE_COUNT)
            m->type_hist[t->type]++;
    }
}

/* Takes ownership of g (closed on error). */
static int model_from_gguf(struct sil_model **out, struct sil_gguf *g, const char *path,
                           struct sil_error *err)
{
    struct sil_model *m = calloc(1, sizeof(*m));
    if (!m) {
        sil_gguf_close(g);
        return sil_errorf(err, -ENOMEM, "%s: out of memory", path);
    }
    m->gguf = g;
    int rc;
    struct sil_str arch;
    rc = sil_gguf_get_str(m->gguf, "general.architecture", &arch, err);
    if (rc < 0) {
        if (rc == -ENOENT)
            sil_errorf(err, -EINVAL, "%s: key 'general.architecture' is missing", path);
        else
            sil_error_prefix(err, "%s", path);
        sil_model_free(m);
        return rc == -ENOENT ? -EINVAL : rc;
    }
    int a = sil_arch_from_name(arch.ptr, arch.len);
    if (a < 0) {
        sil_errorf(err, -ENOTSUP, "%s: key 'general.architecture' = '%.*s' is not supported (qwen35moe, qwen35, qwen3moe, qwen3)",
                   path, (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
        sil_model_free(m);
        return -ENOTSUP;
    }
    m->arch = (enum sil_arch)a;
    m->traits = &arch_table[a];
    struct loader L = {m, path, m->traits->name, err};
    const struct sil_gguf_tensor *te = sil_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!te || te->ne[1] < 1 || te->ne[1] > INT32_MAX) {
        sil_errorf(err, -EINVAL, "%s: tensor 'token_embd.weight' is missing or has no rows", path);
        sil_model_free(m);
        return -EINVAL;
    }
    m->hp.n_vocab = (int32_t)te->ne[1];
    if ((rc = load_hparams(&L)) < 0) {
        sil_model_free(m);
        return rc;
    }
    m->layers = calloc((size_t)(m->hp.n_layer + m->hp.n_nextn), sizeof(*m->layers));
    if (!m->layers) {
        sil_model_free(m);
        return sil_errorf(err, -ENOMEM, "%s: out of memory", path);
    }
    if ((rc = bind_tensors(&L)) < 0) {
        sil_model_free(m);
        return rc;
    }
    fill_info(m, path);
    *out = m;
    return 0;
}

int sil_model_load(struct sil_model **out, const char *path, struct sil_error *err)
{
    struct sil_gguf *g;
    int rc = sil_gguf_open(&g, path, err);
    return rc < 0 ? rc : model_from_gguf(out, g, path, err);
}

int sil_model_load_mem(struct sil_model **out, const void *buf, size_t len, const char *name,
                       struct sil_error *err)
{
    struct sil_gguf *g;
    int rc = sil_gguf_open_mem(&g, buf, len, name, err);
    return rc < 0 ? rc : model_from_gguf(out, g, name, err);
}

void sil_model_free(struct sil_model *m)
{
    if (!m)
        return;
    sil_gguf_close(m->gguf);
    free(m->layers);
    free(m);
}

/* ---- inspect ------------------------------------------------------------------------------ */

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

int sil_model_inspect(const char *path, FILE *out, struct sil_error *err)
{
    struct sil_model *m;
    int rc = sil_model_load(&m, path, err);
    if (rc < 0)
        return rc;
    sil_model_print(m, out);
    sil_model_free(m);
    return 0;
}

void sil_model_print(const struct sil_model *m, FILE *out)
{
    const char *path = m->info.path;
    const struct sil_hparams *hp = &m->hp;
    const struct sil_model_info *in = &m->info;
    fprintf(out, "file:            %s (%" PRIu64 " bytes, GGUF v%u)\n", path, in->file_bytes,
            sil_gguf_version(m->gguf));
    fprintf(out, "name:            %s\n", in->name);
    fprintf(out, "architecture:    %s\n", in->arch_name);
    fprintf(out, "parameters:      %" PRIu64 "\n", in->n_params);
    fprintf(out, "vocab:           %d\n", hp->n_vocab);
    fprintf(out, "context (train): %d\n", hp->n_ctx_train);
    fprintf(out, "embedding:       %d\n", hp->n_embd);
    fprintf(out, "layers:          %d (%d full attention, %d gated delta-net)\n", hp->n_layer,
            hp->n_layer_attn, hp->n_layer_recr);
    fprintf(out, "attention:       %d heads, %d kv heads, head dim %d, rope dims %d, rope base %g%s\n",
            hp->n_head, hp->n_head_kv, hp->n_embd_head_k, hp->n_rot, (double)hp->rope_freq_base,
            m->traits->gated_attn ? ", sigmoid output gate" : "");
    if (m->traits->hybrid)
        fprintf(out, "delta net:       %d key heads, %d value heads, head dim %d/%d, conv kernel %d, full attention every %d\n",
                hp->ssm_n_group, hp->ssm_dt_rank, hp->ssm_d_state, hp->ssm_d_inner / hp->ssm_dt_rank,
                hp->ssm_d_conv, hp->full_attn_interval);
    if (m->traits->moe) {
        fprintf(out, "experts:         %d, %d used, expert FFN %d", hp->n_expert, hp->n_expert_used,
                hp->n_ff_exp);
        if (m->traits->shared_expert)
            fprintf(out, ", shared expert FFN %d", hp->n_ff_shexp);
        fprintf(out, "\n");
    } else {
        fprintf(out, "FFN:             %d\n", hp->n_ff);
    }
    if (hp->n_nextn > 0)
        fprintf(out, "MTP layer:       block %d (nextn: full attention, %s)\n", hp->n_layer,
                m->traits->moe ? "experts" : "dense FFN");
    fprintf(out, "rms eps:         %g\n", (double)hp->rms_eps);
    fprintf(out, "output head:     %s\n", m->tied_output ? "tied to token_embd" : "output.weight");
    fprintf(out, "tensors:         %" PRId64 "\n", sil_gguf_n_tensors(m->gguf));
    fprintf(out, "tensor types:   ");
    for (int t = 0; t < SIL_TYPE_COUNT; t++)
        if (m->type_hist[t])
            fprintf(out, " %s:%d", sil_type_name(t), m->type_hist[t]);
    fprintf(out, "\n");
    uint64_t total = in->routed_expert_bytes + in->backbone_bytes;
    fprintf(out, "tensor bytes:    %" PRIu64 " (%.1f MiB)\n", total, mib(total));
    fprintf(out, "routed experts:  %" PRIu64 " (%.1f MiB)\n", in->routed_expert_bytes,
            mib(in->routed_expert_bytes));
    fprintf(out, "backbone:        %" PRIu64 " (%.1f MiB)\n", in->backbone_bytes, mib(in->backbone_bytes));
    if (m->traits->moe && hp->n_expert > 0) {
        uint64_t per = in->routed_expert_bytes /
                       ((uint64_t)hp->n_expert * (uint64_t)(hp->n_layer + hp->n_nextn));
        fprintf(out, "bytes/expert:    %" PRIu64 " (gate+up+down of one expert in one layer)\n", per);
    }
}
