/* sil-mkmodel internals: hyperparameters, the tensor list, type recipes, weight generation,
 * vocabularies and the streaming GGUF writer. Only the sil-mkmodel binary (and its unit test,
 * which compiles these sources in) uses this header.
 *
 * Ownership: a struct sil_mk_model owns its tensor array and its vocab; sil_mk_model_free
 * releases both. Strings handed to the writer are copied. */
#ifndef SIL_MKMODEL_H
#define SIL_MKMODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/error.h"

enum sil_mk_arch { SIL_MK_QWEN35MOE, SIL_MK_QWEN35, SIL_MK_QWEN3MOE, SIL_MK_QWEN3, SIL_MK_ARCH_COUNT };

const char *sil_mk_arch_name(int arch);
int sil_mk_arch_from_name(const char *name); /* -1 if unknown */
bool sil_mk_arch_is_moe(int arch);
bool sil_mk_arch_is_hybrid(int arch); /* gated delta net + full attention (Qwen3.5 family) */

struct sil_mk_hparams {
    int arch;
    int64_t n_layer, n_embd, n_head, n_head_kv, head_dim;
    int64_t n_ff;                        /* dense FFN (qwen35, qwen3; also written for qwen3moe) */
    int64_t n_expert, n_expert_used;     /* MoE */
    int64_t n_ff_exp, n_ff_shexp;        /* expert FFN, shared expert FFN (0 = none) */
    int64_t ssm_d_state;                 /* delta-net head dim (keys and values) */
    int64_t ssm_n_group;                 /* delta-net key heads */
    int64_t ssm_dt_rank;                 /* delta-net value heads */
    int64_t ssm_d_conv;                  /* conv kernel */
    int64_t full_attn_interval;          /* every n-th layer is full attention */
    int64_t n_ctx_train;
    float rope_base, rope_partial, rms_eps;
    bool tied;                           /* output head tied to token_embd (no output.weight) */
    int64_t n_nextn;                     /* MTP (nextn) layers after the trunk: 0 or 1 */
    int64_t n_vocab;                     /* set from the vocab */
};

/* Fills hp from a preset ("qwen35-35b-a3b", "qwen35-0.8b", "demo", "tiny", "bench", ...);
 * -ENOENT if unknown. */
int sil_mk_preset(const char *name, struct sil_mk_hparams *hp);
/* Defaults of an architecture (the tiny shape), used when no preset is given. */
void sil_mk_arch_defaults(int arch, struct sil_mk_hparams *hp);
void sil_mk_list_presets(void *file); /* FILE * */
/* Checks divisibility and ranges; err says which flag is wrong. */
int sil_mk_check_hparams(const struct sil_mk_hparams *hp, struct sil_error *err);

/* How a tensor's values are made (see weights.c for the scales). */
enum sil_mk_init {
    SIL_MK_INIT_MATRIX,   /* random, std scale */
    SIL_MK_INIT_EMBD,     /* token embedding */
    SIL_MK_INIT_NORM,     /* 1 + small noise */
    SIL_MK_INIT_SSM_A,    /* -exp(A_log), in [-8, -0.5] */
    SIL_MK_INIT_SSM_DT,   /* dt bias, in [-0.5, 1] */
    SIL_MK_INIT_ROUTER,   /* random + per-expert skew component */
};

/* Residual-stream roles, used by the skew mechanism (a reserved "bias channel"). */
#define SIL_MK_IN_EMBD 1u  /* reads the residual stream (rows have n_embd elements) */
#define SIL_MK_OUT_EMBD 2u /* writes the residual stream (n_embd output rows) */

struct sil_mk_tensor {
    char name[64];
    char cls[32];          /* "ffn_down_exps", "attn_qkv", "token_embd", "output_norm", ... */
    int layer;             /* -1 outside blocks */
    uint32_t n_dims;
    int64_t ne[4];         /* ne[0] is the row length */
    int type;              /* enum sil_type */
    int init;              /* enum sil_mk_init */
    unsigned flags;        /* SIL_MK_IN_EMBD | SIL_MK_OUT_EMBD */
    float scale;           /* std of the random part */
    uint64_t seed;         /* per-tensor stream, from the model seed and the name */
    uint64_t offset;       /* in the data section */
    uint64_t nbytes;
    float *src;            /* given values (--weights-from), all ne[0]*ne[1]*ne[2] of them; or
                              NULL: generated. Owned by the tensor. */
};

struct sil_mk_vocab {
    int64_t n;
    char **tokens;         /* byte-level BPE strings, NUL-terminated */
    int32_t *types;        /* 1 normal, 3 control, 4 user-defined, 5 unused */
    int64_t n_merges;
    char **merges;         /* "a b" */
    int64_t bos, eos, pad;
    char pre[32];
};

struct sil_mk_model {
    struct sil_mk_hparams hp;
    struct sil_mk_vocab vocab;
    struct sil_mk_tensor *tensors;
    int64_t n_tensors;
    uint64_t seed;
    float skew;            /* Zipf exponent of expert popularity; 0 = none */
    int recipe;            /* enum sil_mk_recipe */
    bool exact_quant;      /* reference quantizers for q4_K/q6_K instead of the fast ones */
    const char *name;      /* general.name */
};

/* Type recipes (the llama.cpp file types of the same name). */
enum sil_mk_recipe {
    SIL_MK_F32, SIL_MK_F16, SIL_MK_BF16, SIL_MK_Q8_0, SIL_MK_Q4_0, SIL_MK_Q4_1, SIL_MK_Q5_0,
    SIL_MK_Q5_1, SIL_MK_Q4_K_S, SIL_MK_Q4_K_M, SIL_MK_Q5_K_S, SIL_MK_Q5_K_M, SIL_MK_Q6_K,
    SIL_MK_RECIPE_COUNT
};
int sil_mk_recipe_from_name(const char *name); /* -1 if unknown */
const char *sil_mk_recipe_name(int recipe);
uint32_t sil_mk_recipe_file_type(int recipe); /* general.file_type */

/* Builds the tensor list for m->hp (names, shapes, init, flags), no types yet. */
int sil_mk_build_tensors(struct sil_mk_model *m, struct sil_error *err);
/* Assigns types from the recipe, then applies "pattern=type" overrides (fnmatch on the class,
 * or on the full name when the pattern has a '.'). */
int sil_mk_assign_types(struct sil_mk_model *m, char *const *overrides, int n_overrides,
                        struct sil_error *err);
void sil_mk_model_free(struct sil_mk_model *m);

/* Weight generation: row `row` (0 .. ne[1]*ne[2]*ne[3]-1) of tensor t, ne[0] floats.
 * Deterministic in (model seed, tensor name, row): any row can be regenerated alone. */
void sil_mk_gen_row(const struct sil_mk_model *m, const struct sil_mk_tensor *t, int64_t row,
                    float *out);
/* Takes every tensor's values from DIR/<tensor name>.f32 (raw little-endian F32, ne[0] fastest,
 * exactly the tensor's element count) instead of generating them, so a trained model is written
 * with the same names, layouts, recipes and quantizers. A missing, short or long file, or a .f32
 * file that names no tensor of the shape, is an error. */
int sil_mk_weights_from_dir(struct sil_mk_model *m, const char *dir, struct sil_error *err);
/* The residual channel reserved for skew (only used when m->skew > 0). */
int64_t sil_mk_bias_channel(const struct sil_mk_model *m);

/* Fast min/max q4_K / q6_K quantizers (fastquant.c); false if type/n is not theirs. */
bool sil_mk_fast_quantize_row(int type, const float *x, void *y, int64_t n);

/* Vocabularies. */
int sil_mk_vocab_synthetic(struct sil_mk_vocab *v, int64_t n, uint64_t seed, struct sil_error *err);
/* Imports a Hugging Face tokenizer.json; pads with unused "[PADi]" tokens up to pad_to if larger. */
int sil_mk_vocab_from_hf(struct sil_mk_vocab *v, const char *path, int64_t pad_to,
                         struct sil_error *err);
void sil_mk_vocab_free(struct sil_mk_vocab *v);

/* Writes the whole file; the bytes do not depend on threads (1 to SIL_MK_MAX_THREADS, more are
 * taken as the most). progress: print a progress line on stderr. */
#define SIL_MK_MAX_THREADS 64
int sil_mk_write(struct sil_mk_model *m, const char *path, int threads, bool progress,
                 struct sil_error *err);

/* Small JSON reader (tokenizer.json). Values live in one arena freed by sil_json_free. */
enum sil_json_type { SIL_JSON_NULL, SIL_JSON_BOOL, SIL_JSON_NUM, SIL_JSON_STR, SIL_JSON_ARR, SIL_JSON_OBJ };
struct sil_json {
    int type;
    bool b;
    double num;
    char *str;             /* strings (decoded, NUL-terminated; may contain no NUL) */
    size_t len;
    char *key;             /* member name when inside an object */
    struct sil_json *child, *next;
    int64_t n_children;
};
struct sil_json_doc;
int sil_json_parse(struct sil_json_doc **out, const char *buf, size_t len, const char *name,
                   struct sil_error *err);
const struct sil_json *sil_json_root(const struct sil_json_doc *d);
const struct sil_json *sil_json_get(const struct sil_json *obj, const char *key);
void sil_json_free(struct sil_json_doc *d);

#endif
