/* Architecture presets and the tensor list of each architecture: names, shapes and roles exactly
 * as a converted Hugging Face checkpoint has them in GGUF. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/sil-mkmodel/mkmodel.h"

static const char *const arch_names[SIL_MK_ARCH_COUNT] = {"qwen35moe", "qwen35", "qwen3moe", "qwen3"};

const char *sil_mk_arch_name(int arch)
{
    return arch >= 0 && arch < SIL_MK_ARCH_COUNT ? arch_names[arch] : "?";
}

int sil_mk_arch_from_name(const char *name)
{
    for (int i = 0; i < SIL_MK_ARCH_COUNT; i++)
        if (strcmp(name, arch_names[i]) == 0)
            return i;
    return -1;
}

bool sil_mk_arch_is_moe(int arch) { return arch == SIL_MK_QWEN35MOE || arch == SIL_MK_QWEN3MOE; }
bool sil_mk_arch_is_hybrid(int arch) { return arch == SIL_MK_QWEN35MOE || arch == SIL_MK_QWEN35; }

/* The tiny shapes of the reference models (hidden 256, 4 layers, 4/2 heads of 64). */
void sil_mk_arch_defaults(int arch, struct sil_mk_hparams *hp)
{
    memset(hp, 0, sizeof(*hp));
    hp->arch = arch;
    hp->n_layer = 4;
    hp->n_embd = 256;
    hp->n_head = 4;
    hp->n_head_kv = 2;
    hp->head_dim = 64;
    hp->n_ff = 512;
    hp->rms_eps = 1e-6f;
    if (sil_mk_arch_is_moe(arch)) {
        hp->n_expert = 16;
        hp->n_expert_used = 4;
        hp->n_ff_exp = 64;
        hp->n_ff_shexp = arch == SIL_MK_QWEN35MOE ? 128 : 0;
    }
    if (sil_mk_arch_is_hybrid(arch)) {
        hp->ssm_d_state = 32;
        hp->ssm_n_group = 4;
        hp->ssm_dt_rank = 8;
        hp->ssm_d_conv = 4;
        hp->full_attn_interval = 4;
        hp->n_ctx_train = 262144;
        hp->rope_base = 1e7f;
        hp->rope_partial = 0.25f;
    } else {
        hp->n_ctx_train = 40960;
        hp->rope_base = 1e6f;
        hp->rope_partial = 1.0f;
    }
    hp->tied = arch == SIL_MK_QWEN3;
    hp->n_vocab = 512;
}

struct preset {
    const char *name, *what;
    int arch;
    int64_t layers, embd, heads, kv, head_dim, ff, experts, used, ff_exp, ff_sh;
    int64_t dn_kheads, dn_vheads, dn_dim;
    int64_t vocab;
    bool tied;
};

static const struct preset presets[] = {
    {"qwen35-35b-a3b", "Qwen3.5-35B-A3B shape (~20 GiB at q4_k_m)", SIL_MK_QWEN35MOE, 40, 2048, 16,
     2, 256, 0, 256, 8, 512, 512, 16, 32, 128, 248320, false},
    {"qwen35-0.8b", "Qwen3.5-0.8B shape (dense, tied embeddings)", SIL_MK_QWEN35, 24, 1024, 8, 2,
     256, 3584, 0, 0, 0, 0, 16, 16, 128, 248320, true},
    {"bench", "engine benchmark model (~800 MiB at q4_k_m)", SIL_MK_QWEN35MOE, 12, 1024, 8, 2, 128,
     0, 64, 8, 512, 512, 8, 16, 128, 32768, false},
    {"demo", "small qwen35moe for `make demo` (tens of MB)", SIL_MK_QWEN35MOE, 8, 512, 4, 2, 128, 0,
     32, 4, 256, 256, 4, 8, 64, 4096, false},
    {"tiny", "reference tiny qwen35moe shape (tests)", SIL_MK_QWEN35MOE, 4, 256, 4, 2, 64, 0, 16, 4,
     64, 128, 4, 8, 32, 512, false},
};

int sil_mk_preset(const char *name, struct sil_mk_hparams *hp)
{
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        const struct preset *p = &presets[i];
        if (strcmp(name, p->name) != 0)
            continue;
        sil_mk_arch_defaults(p->arch, hp);
        hp->n_layer = p->layers;
        hp->n_embd = p->embd;
        hp->n_head = p->heads;
        hp->n_head_kv = p->kv;
        hp->head_dim = p->head_dim;
        hp->n_ff = p->ff;
        hp->n_expert = p->experts;
        hp->n_expert_used = p->used;
        hp->n_ff_exp = p->ff_exp;
        hp->n_ff_shexp = p->ff_sh;
        hp->ssm_n_group = p->dn_kheads;
        hp->ssm_dt_rank = p->dn_vheads;
        hp->ssm_d_state = p->dn_dim;
        hp->n_vocab = p->vocab;
        hp->tied = p->tied;
        return 0;
    }
    return -ENOENT;
}

void sil_mk_list_presets(void *file)
{
    FILE *f = file;
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
        fprintf(f, "  %-16s %-10s %s\n", presets[i].name, arch_names[presets[i].arch], presets[i].what);
}

int sil_mk_check_hparams(const struct sil_mk_hparams *hp, struct sil_error *err)
{
    const int64_t lim = 1 << 20;
#define RANGE(v, lo, flag)                                                                         \
    if ((v) < (lo) || (v) > lim)                                                                   \
        return sil_errorf(err, -EINVAL, "%s %lld out of range [%lld, %lld]", flag, (long long)(v),   \
                          (long long)(lo), (long long)lim);
    RANGE(hp->n_layer, 1, "--layers");
    RANGE(hp->n_embd, 32, "--embd");
    RANGE(hp->n_head, 1, "--heads");
    RANGE(hp->n_head_kv, 1, "--kv-heads");
    RANGE(hp->head_dim, 2, "--head-dim");
    if (hp->n_head % hp->n_head_kv)
        return sil_errorf(err, -EINVAL, "--heads %lld is not a multiple of --kv-heads %lld",
                          (long long)hp->n_head, (long long)hp->n_head_kv);
    if (sil_mk_arch_is_moe(hp->arch)) {
        RANGE(hp->n_expert, 1, "--experts");
        RANGE(hp->n_expert_used, 1, "--experts-used");
        RANGE(hp->n_ff_exp, 1, "--expert-ffn");
        if (hp->n_expert_used > hp->n_expert)
            return sil_errorf(err, -EINVAL, "--experts-used %lld > --experts %lld",
                              (long long)hp->n_expert_used, (long long)hp->n_expert);
        if (hp->arch == SIL_MK_QWEN35MOE)
            RANGE(hp->n_ff_shexp, 1, "--shared-ffn");
    } else {
        RANGE(hp->n_ff, 1, "--ffn");
    }
    if (sil_mk_arch_is_hybrid(hp->arch)) {
        RANGE(hp->ssm_n_group, 1, "--dn-key-heads");
        RANGE(hp->ssm_dt_rank, 1, "--dn-value-heads");
        RANGE(hp->ssm_d_state, 1, "--dn-head-dim");
        RANGE(hp->ssm_d_conv, 1, "--dn-conv");
        RANGE(hp->full_attn_interval, 1, "--full-attn-interval");
        if (hp->ssm_dt_rank % hp->ssm_n_group)
            return sil_errorf(err, -EINVAL, "--dn-value-heads %lld is not a multiple of --dn-key-heads %lld",
                              (long long)hp->ssm_dt_rank, (long long)hp->ssm_n_group);
    }
    int64_t rot = (int64_t)lroundf(hp->rope_partial * (float)hp->head_dim);
    if (!(hp->rope_partial > 0 && hp->rope_partial <= 1) || rot < 2 || rot % 2)
        return sil_errorf(err, -EINVAL, "--rope-partial %g of head dim %lld gives %lld rotary dims (need an even number >= 2)",
                          hp->rope_partial, (long long)hp->head_dim, (long long)rot);
    if (!(hp->rope_base > 1))
        return sil_errorf(err, -EINVAL, "--rope-base %g must be > 1", hp->rope_base);
    RANGE(hp->n_ctx_train, 1, "--ctx");
    if (hp->n_vocab < 256 + 5 || hp->n_vocab > (1 << 24))
        return sil_errorf(err, -EINVAL, "--vocab %lld out of range [261, %d]", (long long)hp->n_vocab, 1 << 24);
#undef RANGE
    return 0;
}

struct tlist {
    struct sil_mk_model *m;
    int64_t cap;
    int err;
};

static void add(struct tlist *l, int layer, const char *cls, const char *suffix, uint32_t n_dims,
                int64_t ne0, int64_t ne1, int64_t ne2, int init, unsigned flags)
{
    struct sil_mk_model *m = l->m;
    if (l->err)
        return;
    if (m->n_tensors == l->cap) {
        int64_t cap = l->cap ? 2 * l->cap : 64;
        void *p = realloc(m->tensors, (size_t)cap * sizeof(*m->tensors));
        if (!p) {
            l->err = -ENOMEM;
            return;
        }
        m->tensors = p;
        l->cap = cap;
    }
    struct sil_mk_tensor *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof(*t));
    if (layer >= 0)
        snprintf(t->name, sizeof(t->name), "blk.%d.%s%s", layer, cls, suffix);
    else
        snprintf(t->name, sizeof(t->name), "%s%s", cls, suffix);
    snprintf(t->cls, sizeof(t->cls), "%s", cls);
    t->layer = layer;
    t->n_dims = n_dims;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->ne[3] = 1;
    t->init = init;
    t->flags = flags;
    /* Random matrices keep the norm of what they read (std 1/sqrt(fan-in)); what writes into
     * the residual stream is scaled down by sqrt(2 * n_layer) so the stream stays O(1) deep
     * into the stack. */
    t->scale = 1.0f / sqrtf((float)ne0);
    if (flags & SIL_MK_OUT_EMBD)
        t->scale /= sqrtf(2.0f * (float)m->hp.n_layer);
}

#define W ".weight"
#define MAT2(cls, a, b, fl) add(&l, il, cls, W, 2, a, b, 1, SIL_MK_INIT_MATRIX, fl)
#define NORM(cls, a) add(&l, il, cls, W, 1, a, 1, 1, SIL_MK_INIT_NORM, 0)

static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

int sil_mk_build_tensors(struct sil_mk_model *m, struct sil_error *err)
{
    const struct sil_mk_hparams *hp = &m->hp;
    struct tlist l = {.m = m};
    const int64_t d = hp->n_embd, hd = hp->head_dim;
    const bool qwen35 = sil_mk_arch_is_hybrid(hp->arch);
    const int64_t key_dim = hp->ssm_d_state * hp->ssm_n_group;
    const int64_t value_dim = hp->ssm_d_state * hp->ssm_dt_rank;

    for (int64_t i = 0; i < m->n_tensors; i++)
        free(m->tensors[i].src);
    free(m->tensors);
    m->tensors = NULL;
    m->n_tensors = 0;

    int il = -1;
    add(&l, -1, "token_embd", W, 2, d, hp->n_vocab, 1, SIL_MK_INIT_EMBD, 0);
    /* An MTP layer (llama.cpp's nextn naming) is block n_layer: a full-attention block of the
     * architecture plus its stem (enorm, hnorm, eh_proj) and head norm. */
    for (il = 0; il < hp->n_layer + hp->n_nextn; il++) {
        bool recurrent = qwen35 && il < hp->n_layer && (il + 1) % hp->full_attn_interval != 0;
        if (il >= hp->n_layer) {
            MAT2("nextn.eh_proj", 2 * d, d, 0);
            NORM("nextn.enorm", d);
            NORM("nextn.hnorm", d);
            NORM("nextn.shared_head_norm", d);
        }
        NORM("attn_norm", d);
        if (recurrent) {
            MAT2("attn_qkv", d, 2 * key_dim + value_dim, SIL_MK_IN_EMBD);
            MAT2("attn_gate", d, value_dim, SIL_MK_IN_EMBD);
            MAT2("ssm_conv1d", hp->ssm_d_conv, 2 * key_dim + value_dim, 0);
            add(&l, il, "ssm_dt", ".bias", 1, hp->ssm_dt_rank, 1, 1, SIL_MK_INIT_SSM_DT, 0);
            add(&l, il, "ssm_a", "", 1, hp->ssm_dt_rank, 1, 1, SIL_MK_INIT_SSM_A, 0);
            MAT2("ssm_beta", d, hp->ssm_dt_rank, SIL_MK_IN_EMBD);
            MAT2("ssm_alpha", d, hp->ssm_dt_rank, SIL_MK_IN_EMBD);
            NORM("ssm_norm", hp->ssm_d_state);
            MAT2("ssm_out", value_dim, d, SIL_MK_OUT_EMBD);
        } else {
            /* Qwen3.5 attention: q_proj is twice as wide (query + sigmoid output gate). */
            MAT2("attn_q", d, hd * hp->n_head * (qwen35 ? 2 : 1), SIL_MK_IN_EMBD);
            MAT2("attn_k", d, hd * hp->n_head_kv, SIL_MK_IN_EMBD);
            MAT2("attn_v", d, hd * hp->n_head_kv, SIL_MK_IN_EMBD);
            MAT2("attn_output", hd * hp->n_head, d, SIL_MK_OUT_EMBD);
            NORM("attn_q_norm", hd);
            NORM("attn_k_norm", hd);
        }
        NORM(qwen35 ? "post_attention_norm" : "ffn_norm", d);
        if (sil_mk_arch_is_moe(hp->arch)) {
            add(&l, il, "ffn_gate_inp", W, 2, d, hp->n_expert, 1, SIL_MK_INIT_ROUTER, SIL_MK_IN_EMBD);
            add(&l, il, "ffn_gate_exps", W, 3, d, hp->n_ff_exp, hp->n_expert, SIL_MK_INIT_MATRIX, SIL_MK_IN_EMBD);
            add(&l, il, "ffn_up_exps", W, 3, d, hp->n_ff_exp, hp->n_expert, SIL_MK_INIT_MATRIX, SIL_MK_IN_EMBD);
            add(&l, il, "ffn_down_exps", W, 3, hp->n_ff_exp, d, hp->n_expert, SIL_MK_INIT_MATRIX, SIL_MK_OUT_EMBD);
            if (hp->arch == SIL_MK_QWEN35MOE) {
                /* The shared-expert gate is one row; converters store it as [n_embd, 1]. */
                MAT2("ffn_gate_inp_shexp", d, 1, SIL_MK_IN_EMBD);
                MAT2("ffn_gate_shexp", d, hp->n_ff_shexp, SIL_MK_IN_EMBD);
                MAT2("ffn_up_shexp", d, hp->n_ff_shexp, SIL_MK_IN_EMBD);
                MAT2("ffn_down_shexp", hp->n_ff_shexp, d, SIL_MK_OUT_EMBD);
            }
        } else {
            MAT2("ffn_gate", d, hp->n_ff, SIL_MK_IN_EMBD);
            MAT2("ffn_up", d, hp->n_ff, SIL_MK_IN_EMBD);
            MAT2("ffn_down", hp->n_ff, d, SIL_MK_OUT_EMBD);
        }
    }
    il = -1;
    NORM("output_norm", d);
    if (!hp->tied)
        MAT2("output", d, hp->n_vocab, SIL_MK_IN_EMBD);
    if (l.err)
        return sil_errorf(err, l.err, "tensor list: out of memory");

    /* Logits of std ~2 at the output head (tied or not); one random stream per tensor. */
    for (int64_t i = 0; i < m->n_tensors; i++) {
        struct sil_mk_tensor *t = &m->tensors[i];
        if (strcmp(t->name, "output.weight") == 0 || (hp->tied && t->init == SIL_MK_INIT_EMBD))
            t->scale = 2.0f / sqrtf((float)d);
        else if (t->init == SIL_MK_INIT_EMBD)
            t->scale = 1.0f;
        t->seed = m->seed ^ fnv1a(t->name);
    }
    return 0;
}

#undef W
#undef MAT2
#undef NORM

void sil_mk_model_free(struct sil_mk_model *m)
{
    for (int64_t i = 0; i < m->n_tensors; i++)
        free(m->tensors[i].src);
    free(m->tensors);
    m->tensors = NULL;
    m->n_tensors = 0;
    sil_mk_vocab_free(&m->vocab);
}
