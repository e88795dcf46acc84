/* Tensor-type recipes: the same per-tensor choices llama-quantize makes for its file types of
 * the same name (so a synthetic Q4_K_M file has the byte layout of a real one), plus overrides. */
#include <errno.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/sil-mkmodel/mkmodel.h"
#include "kernels/cpu/quants.h"

static const struct {
    const char *name;
    int base;           /* enum sil_type of the bulk of the weights */
    uint32_t file_type; /* general.file_type (llama_ftype) */
} recipes[SIL_MK_RECIPE_COUNT] = {
    [SIL_MK_F32] = {"f32", SIL_TYPE_F32, 0},       [SIL_MK_F16] = {"f16", SIL_TYPE_F16, 1},
    [SIL_MK_BF16] = {"bf16", SIL_TYPE_BF16, 32},   [SIL_MK_Q8_0] = {"q8_0", SIL_TYPE_Q8_0, 7},
    [SIL_MK_Q4_0] = {"q4_0", SIL_TYPE_Q4_0, 2},    [SIL_MK_Q4_1] = {"q4_1", SIL_TYPE_Q4_1, 3},
    [SIL_MK_Q5_0] = {"q5_0", SIL_TYPE_Q5_0, 8},    [SIL_MK_Q5_1] = {"q5_1", SIL_TYPE_Q5_1, 9},
    [SIL_MK_Q4_K_S] = {"q4_k_s", SIL_TYPE_Q4_K, 14}, [SIL_MK_Q4_K_M] = {"q4_k_m", SIL_TYPE_Q4_K, 15},
    [SIL_MK_Q5_K_S] = {"q5_k_s", SIL_TYPE_Q5_K, 16}, [SIL_MK_Q5_K_M] = {"q5_k_m", SIL_TYPE_Q5_K, 17},
    [SIL_MK_Q6_K] = {"q6_k", SIL_TYPE_Q6_K, 18},
};

int sil_mk_recipe_from_name(const char *name)
{
    for (int i = 0; i < SIL_MK_RECIPE_COUNT; i++)
        if (strcasecmp(name, recipes[i].name) == 0)
            return i;
    return -1;
}

const char *sil_mk_recipe_name(int r) { return r >= 0 && r < SIL_MK_RECIPE_COUNT ? recipes[r].name : "?"; }
uint32_t sil_mk_recipe_file_type(int r) { return recipes[r].file_type; }

static int64_t block_size(int type)
{
    const struct sil_type_traits *tr = sil_type_traits(type);
    return tr && tr->known ? tr->block_size : 0;
}

/* A row length the type's block does not divide falls back to a 32-block type, then to F16. */
static int fallback(int type, int64_t ncols)
{
    int64_t bs = block_size(type);
    if (bs && ncols % bs == 0)
        return type;
    switch (type) {
    case SIL_TYPE_Q2_K:
    case SIL_TYPE_Q3_K: type = SIL_TYPE_Q4_0; break;
    case SIL_TYPE_Q4_K: type = SIL_TYPE_Q5_0; break;
    case SIL_TYPE_Q5_K: type = SIL_TYPE_Q5_1; break;
    case SIL_TYPE_Q6_K: type = SIL_TYPE_Q8_0; break;
    default: type = SIL_TYPE_F16; break;
    }
    bs = block_size(type);
    return bs && ncols % bs == 0 ? type : SIL_TYPE_F16;
}

static bool is_quant(int type) { return type != SIL_TYPE_F32 && type != SIL_TYPE_F16 && type != SIL_TYPE_BF16; }

/* Layers at the ends and every third one in between get more bits. */
static bool use_more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

static bool only_f32(const struct sil_mk_tensor *t)
{
    /* Vectors (and [n, 1] tensors), the small conv taps and the router stay F32. */
    return t->n_dims < 2 || t->ne[1] == 1 || strcmp(t->cls, "ssm_conv1d") == 0 ||
           strcmp(t->cls, "ffn_gate_inp") == 0;
}

static bool is_attn_v_like(const struct sil_mk_tensor *t)
{
    return strcmp(t->cls, "attn_v") == 0 || strcmp(t->cls, "attn_qkv") == 0;
}

/* Index of t among the tensors matching `pred`, in name order ("blk.10" sorts before "blk.2"),
 * because that is the order in which the layer counters of the quantizer advance. */
static int sorted_index(const struct sil_mk_model *m, const struct sil_mk_tensor *t,
                        bool (*pred)(const struct sil_mk_tensor *), int *count)
{
    int n = 0, idx = 0;
    for (int64_t i = 0; i < m->n_tensors; i++)
        if (pred(&m->tensors[i])) {
            n++;
            if (strcmp(m->tensors[i].name, t->name) < 0)
                idx++;
        }
    *count = n;
    return idx;
}

static bool is_ffn_down(const struct sil_mk_tensor *t) { return strncmp(t->cls, "ffn_down", 8) == 0; }

static int recipe_type(const struct sil_mk_model *m, const struct sil_mk_tensor *t)
{
    const int r = m->recipe, base = recipes[r].base;
    const int64_t n_expert = m->hp.n_expert;
    int type = base;

    if (r == SIL_MK_F32 || only_f32(t))
        return SIL_TYPE_F32;
    if (!is_quant(base))
        return base;

    bool output = strcmp(t->name, "output.weight") == 0 ||
                  (m->hp.tied && strcmp(t->name, "token_embd.weight") == 0);
    if (output) {
        if (t->ne[0] % block_size(base) != 0)
            return SIL_TYPE_Q8_0;
        return base == SIL_TYPE_Q8_0 ? base : SIL_TYPE_Q6_K;
    }
    if (strcmp(t->name, "token_embd.weight") == 0)
        return fallback(base, t->ne[0]);

    if (is_attn_v_like(t)) {
        int n, i = sorted_index(m, t, is_attn_v_like, &n);
        if ((r == SIL_MK_Q4_K_M || r == SIL_MK_Q5_K_M) && use_more_bits(i, n))
            type = SIL_TYPE_Q6_K;
        else if (r == SIL_MK_Q4_K_S && i < 4)
            type = SIL_TYPE_Q5_K;
        if (n_expert == 8)
            type = SIL_TYPE_Q8_0;
    } else if (strcmp(t->cls, "attn_k") == 0) {
        if (n_expert == 8)
            type = SIL_TYPE_Q8_0;
    } else if (is_ffn_down(t)) {
        int n = (int)m->hp.n_layer, i = t->layer;
        if (n_expert <= 1) {
            int cnt;
            i = sorted_index(m, t, is_ffn_down, &cnt);
        }
        if ((r == SIL_MK_Q4_K_M || r == SIL_MK_Q5_K_M) && use_more_bits(i, n))
            type = SIL_TYPE_Q6_K;
        else if (r == SIL_MK_Q4_K_S && i < n / 8)
            type = SIL_TYPE_Q5_K;
    } else if (strcmp(t->cls, "attn_output") == 0) {
        if (n_expert == 8 && (r == SIL_MK_Q4_K_S || r == SIL_MK_Q4_K_M))
            type = SIL_TYPE_Q5_K;
    }
    return fallback(type, t->ne[0]);
}

int sil_mk_assign_types(struct sil_mk_model *m, char *const *overrides, int n_overrides,
                        struct sil_error *err)
{
    for (int64_t i = 0; i < m->n_tensors; i++) {
        struct sil_mk_tensor *t = &m->tensors[i];
        t->type = recipe_type(m, t);
        /* converters write [n, 1] tensors as 2-D, the quantizer rewrites them as 1-D */
        if (t->n_dims == 2 && t->ne[1] == 1 && is_quant(recipes[m->recipe].base))
            t->n_dims = 1;
    }

    for (int k = 0; k < n_overrides; k++) {
        const char *o = overrides[k];
        const char *eq = strchr(o, '=');
        if (!eq || eq == o || !eq[1])
            return sil_errorf(err, -EINVAL, "--type-override '%s': expected CLASS=TYPE", o);
        char pat[128];
        size_t pl = (size_t)(eq - o);
        if (pl >= sizeof(pat))
            return sil_errorf(err, -EINVAL, "--type-override '%s': pattern too long", o);
        memcpy(pat, o, pl);
        pat[pl] = 0;
        int type = sil_type_from_name(eq + 1);
        if (type < 0 || block_size(type) == 0)
            return sil_errorf(err, -EINVAL, "--type-override '%s': unknown type '%s'", o, eq + 1);
        bool full = strchr(pat, '.') != NULL;
        int hits = 0;
        for (int64_t i = 0; i < m->n_tensors; i++) {
            struct sil_mk_tensor *t = &m->tensors[i];
            if (fnmatch(pat, full ? t->name : t->cls, 0) != 0)
                continue;
            hits++;
            if (t->ne[0] % block_size(type) != 0)
                return sil_errorf(err, -EINVAL, "--type-override '%s': %s has rows of %lld, not a multiple of the %s block (%lld)",
                                  o, t->name, (long long)t->ne[0], sil_type_name(type), (long long)block_size(type));
            t->type = type;
        }
        if (!hits)
            return sil_errorf(err, -ENOENT, "--type-override '%s': no tensor matches '%s'", o, pat);
    }
    for (int64_t i = 0; i < m->n_tensors; i++) {
        struct sil_mk_tensor *t = &m->tensors[i];
        size_t rs = sil_row_size(t->type, t->ne[0]);
        if (rs == 0)
            return sil_errorf(err, -EINVAL, "%s: type %s cannot hold rows of %lld", t->name,
                              sil_type_name(t->type), (long long)t->ne[0]);
        t->nbytes = (uint64_t)rs * (uint64_t)(t->ne[1] * t->ne[2] * t->ne[3]);
    }
    return 0;
}
