/* A model: the GGUF mapping, the hyperparameters read from its keys and every tensor bound and
 * checked (name, shape, type) against the architecture table. Weights stay in the mapping.
 *
 * Ownership: struct sil_model owns the struct sil_gguf; every tensor pointer lives until
 * sil_model_free. Immutable after load, so any thread may read it. */
#ifndef SIL_MODEL_H
#define SIL_MODEL_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/engine/engine.h"
#include "daemon/engine/gguf.h"
#include "kernels/cpu/quants.h"
#include "kernels/error.h"

#define SIL_MAX_LAYERS 512

/* What an architecture has; one row per enum sil_arch. */
struct sil_arch_traits {
    const char *name;    /* general.architecture, also the key prefix */
    bool hybrid;         /* gated delta-net layers + full attention every full_attention_interval */
    bool moe;            /* routed experts */
    bool shared_expert;  /* shared expert with a sigmoid gate */
    bool gated_attn;     /* q projection carries a sigmoid output gate (2x wide) */
    bool post_attn_norm; /* FFN norm is "post_attention_norm" (else "ffn_norm") */
};
const struct sil_arch_traits *sil_arch_traits(enum sil_arch a);
int sil_arch_from_name(const char *name, size_t len); /* enum sil_arch or -1 */

struct sil_hparams {
    int32_t n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv;
    int32_t n_embd_head_k, n_embd_head_v; /* attention.key_length / value_length */
    int32_t n_ff;                          /* dense FFN width (qwen3, qwen35) */
    int32_t n_expert, n_expert_used, n_ff_exp, n_ff_shexp;
    float rms_eps;
    float rope_freq_base;
    int32_t n_rot;                         /* rope.dimension_count (head dim if absent) */
    int32_t rope_sections[4];
    /* gated delta net */
    int32_t ssm_d_conv, ssm_d_inner, ssm_d_state, ssm_dt_rank, ssm_n_group;
    int32_t full_attn_interval;
    bool recurrent[SIL_MAX_LAYERS];        /* layer il is a gated delta-net layer */
    int32_t n_layer_attn, n_layer_recr;
    /* MTP (next-token prediction) layers after the trunk ({arch}.nextn_predict_layers, 0 or 1):
     * block_count counts them, n_layer does not */
    int32_t n_nextn;
};

/* Tensors of one block; NULL where the architecture or layer kind has none. */
struct sil_layer {
    const struct sil_gguf_tensor *attn_norm, *ffn_norm; /* ffn_norm = post_attention_norm (qwen35) */
    /* full attention */
    const struct sil_gguf_tensor *wq, *wk, *wv, *wo, *q_norm, *k_norm;
    /* gated delta net */
    const struct sil_gguf_tensor *wqkv, *wgate, *ssm_conv1d, *ssm_dt, *ssm_a, *ssm_beta,
        *ssm_alpha, *ssm_norm, *ssm_out;
    /* dense FFN */
    const struct sil_gguf_tensor *ffn_gate, *ffn_up, *ffn_down;
    /* MoE */
    const struct sil_gguf_tensor *ffn_gate_inp, *ffn_gate_exps, *ffn_up_exps, *ffn_down_exps;
    const struct sil_gguf_tensor *ffn_gate_inp_shexp, *ffn_gate_shexp, *ffn_up_shexp,
        *ffn_down_shexp;
    int32_t attn_index; /* index among full-attention layers (KV cache) or -1 */
    int32_t recr_index; /* index among delta-net layers (recurrent state) or -1 */
};

/* The MTP layer's own tensors (llama.cpp's names, blk.{n_layer}.nextn.*): h' = eh_proj
 * [enorm(embed(next token)), hnorm(h)], then layers[n_layer] (a full-attention block), then
 * shared_head_norm and the head. embed_tokens, shared_head_head and shared_head_norm may be
 * absent (Qwen3.5 files leave them to token_embd, output and output_norm): bound to those. */
struct sil_nextn {
    const struct sil_gguf_tensor *eh_proj, *enorm, *hnorm, *shared_head_norm;
    const struct sil_gguf_tensor *embed_tokens, *shared_head_head;
};

struct sil_model {
    struct sil_gguf *gguf;
    enum sil_arch arch;
    const struct sil_arch_traits *traits;
    struct sil_hparams hp;
    const struct sil_gguf_tensor *tok_embd, *output_norm, *output; /* output may be tok_embd */
    bool tied_output;
    struct sil_layer *layers; /* [n_layer + n_nextn]: the trunk, then the MTP block */
    struct sil_nextn nextn;   /* when hp.n_nextn > 0 */
    struct sil_model_info info;
    char name[128];
    int type_hist[SIL_TYPE_COUNT]; /* tensors per type */
};

int sil_model_load(struct sil_model **out, const char *path, struct sil_error *err);
/* The same on a caller-owned buffer (fuzzing); buf must outlive the model. */
int sil_model_load_mem(struct sil_model **out, const void *buf, size_t len, const char *name,
                       struct sil_error *err);
/* What sil_model_inspect prints, for a loaded model. */
void sil_model_print(const struct sil_model *m, FILE *out);
void sil_model_free(struct sil_model *m);

#endif
