/* sil-mkmodel: writes synthetic GGUF models (random weights, real architectures and layouts) for
 * tests, the demo and benchmarks. See sil-mkmodel(1). */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/common/common.h"
#include "bench/sil-mkmodel/mkmodel.h"
#include "kernels/cpu/quants.h"

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: sil-mkmodel [--preset NAME | --arch ARCH] [options] --out FILE.gguf\n"
        "\n"
        "Writes a GGUF v3 model with seeded random weights, streamed tensor by tensor.\n"
        "\n"
        "shape:\n"
        "  --preset NAME         a known shape (below); later flags override it\n"
        "  --arch ARCH           qwen35moe, qwen35, qwen3moe, qwen3 (default qwen35moe)\n"
        "  --layers N            block count\n"
        "  --embd N              hidden size\n"
        "  --heads N             query heads         --kv-heads N   key/value heads\n"
        "  --head-dim N          attention head dim\n"
        "  --ffn N               dense FFN size (qwen35, qwen3)\n"
        "  --experts N           routed experts      --experts-used N   top-k\n"
        "  --expert-ffn N        FFN size of a routed expert\n"
        "  --shared-ffn N        FFN size of the shared expert (qwen35moe)\n"
        "  --dn-key-heads N      gated delta net key heads (qwen35*)\n"
        "  --dn-value-heads N    gated delta net value heads\n"
        "  --dn-head-dim N       gated delta net head dim  --dn-conv N  conv kernel\n"
        "  --full-attn-interval N  every N-th layer is full attention (qwen35*, default 4)\n"
        "  --rope-base F         rope theta          --rope-partial F  rotary fraction of the "
        "head\n"
        "  --ctx N               training context length written to the file\n"
        "  --tied | --untied     output head tied to the token embedding or not\n"
        "  --mtp                 one MTP (next-token prediction) layer after the blocks, as\n"
        "                        Qwen3.5 files carry it (nextn_predict_layers, blk.N.nextn.*)\n"
        "\n"
        "vocab:\n"
        "  --vocab N             synthetic byte-level BPE vocab of N tokens: 256 byte tokens,\n"
        "                        merges, then <|endoftext|> <|im_start|> <|im_end|> <think> "
        "</think>\n"
        "  --vocab-from FILE     import a Hugging Face tokenizer.json (with --vocab N: pad to N)\n"
        "  --pre NAME            tokenizer.ggml.pre (default qwen2; qwen35 for Qwen3.5 vocabs)\n"
        "\n"
        "weights:\n"
        "  --type RECIPE         f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q4_k_s q4_k_m q5_k_s\n"
        "                        q5_k_m q6_k (default q4_k_m; per-tensor choices as "
        "llama-quantize)\n"
        "  --type-override P=T   tensor type T for the tensor class P (glob, e.g. ffn_down_exps,\n"
        "                        'ffn_*_exps'), or for full names when P has a '.'; repeatable\n"
        "  --skew S              expert popularity follows a Zipf law of exponent S (MoE only;\n"
        "                        default 0 = uniform): a constant residual channel feeds every "
        "router,\n"
        "                        whose weight on it is -S*ln(rank+1)/sqrt(n_embd/2), rank a "
        "per-layer\n"
        "                        random order of the experts\n"
        "  --seed N              random seed (default 1)\n"
        "  --exact-quant         q4_K/q6_K through the reference quantizers (slow) instead of\n"
        "                        fast min/max scales\n"
        "  --weights-from DIR    the values of each tensor from DIR/NAME.f32 (raw F32, ne[0]\n"
        "                        fastest) instead of random ones: export of a trained model\n"
        "\n"
        "output:\n"
        "  --out FILE            the model file (written as FILE.tmp, then renamed)\n"
        "  --threads N           1 to 64 (default: the CPUs, at most 64)\n"
        "  --name TEXT           general.name\n"
        "  --dry-run             print the tensor table and the size, write nothing\n"
        "  --quiet               no progress line\n"
        "  --list-presets        the presets, then exit\n"
        "  --help                this help       --version   the version\n"
        "\n"
        "presets:\n");
    sil_mk_list_presets(f);
}

enum {
    O_PRESET = 256, O_ARCH, O_LAYERS, O_EMBD, O_HEADS, O_KV, O_HEAD_DIM, O_FFN, O_EXPERTS, O_USED,
    O_EXP_FFN, O_SH_FFN, O_DN_K, O_DN_V, O_DN_DIM, O_DN_CONV, O_FAI, O_ROPE_BASE, O_ROPE_PARTIAL,
    O_CTX, O_TIED, O_UNTIED, O_MTP, O_VOCAB, O_VOCAB_FROM, O_PRE, O_TYPE, O_OVERRIDE, O_SKEW, O_SEED, O_OUT,
    O_THREADS, O_NAME, O_EXACT, O_WEIGHTS, O_DRY, O_QUIET, O_LIST, O_HELP, O_VERSION,
};

static const struct option opts[] = {
    {"preset", 1, 0, O_PRESET}, {"arch", 1, 0, O_ARCH}, {"layers", 1, 0, O_LAYERS},
    {"embd", 1, 0, O_EMBD}, {"heads", 1, 0, O_HEADS}, {"kv-heads", 1, 0, O_KV},
    {"head-dim", 1, 0, O_HEAD_DIM}, {"ffn", 1, 0, O_FFN}, {"experts", 1, 0, O_EXPERTS},
    {"experts-used", 1, 0, O_USED}, {"expert-ffn", 1, 0, O_EXP_FFN}, {"shared-ffn", 1, 0, O_SH_FFN},
    {"dn-key-heads", 1, 0, O_DN_K}, {"dn-value-heads", 1, 0, O_DN_V}, {"dn-head-dim", 1, 0, O_DN_DIM},
    {"dn-conv", 1, 0, O_DN_CONV}, {"full-attn-interval", 1, 0, O_FAI}, {"rope-base", 1, 0, O_ROPE_BASE},
    {"rope-partial", 1, 0, O_ROPE_PARTIAL}, {"ctx", 1, 0, O_CTX}, {"tied", 0, 0, O_TIED},
    {"untied", 0, 0, O_UNTIED}, {"mtp", 0, 0, O_MTP}, {"vocab", 1, 0, O_VOCAB}, {"vocab-from", 1, 0, O_VOCAB_FROM},
    {"pre", 1, 0, O_PRE}, {"type", 1, 0, O_TYPE}, {"type-override", 1, 0, O_OVERRIDE},
    {"skew", 1, 0, O_SKEW}, {"seed", 1, 0, O_SEED}, {"out", 1, 0, O_OUT}, {"threads", 1, 0, O_THREADS},
    {"name", 1, 0, O_NAME}, {"exact-quant", 0, 0, O_EXACT}, {"dry-run", 0, 0, O_DRY}, {"quiet", 0, 0, O_QUIET},
    {"weights-from", 1, 0, O_WEIGHTS},
    {"list-presets", 0, 0, O_LIST}, {"help", 0, 0, O_HELP}, {"version", 0, 0, O_VERSION}, {0, 0, 0, 0},
};

#define PROG "sil-mkmodel"

static int parse_int(const char *flag, const char *s, int64_t *out)
{
    return sil_bench_parse_i64(PROG, flag, s, 0, INT64_MAX, out);
}

static int parse_float(const char *flag, const char *s, float *out)
{
    double v;
    if (sil_bench_parse_double(PROG, flag, s, -HUGE_VAL, HUGE_VAL, &v))
        return -1;
    *out = (float)v;
    return 0;
}

/* A shape flag; they are applied after the preset, in the order given. */
struct setting {
    int opt;
    const char *val;
};

/* The exit status; overrides and set hold argc entries each, owned by the caller. */
static int mkmodel(int argc, char **argv, char **overrides, struct setting *set)
{
    const char *preset = NULL, *arch = NULL, *vocab_from = NULL, *pre = NULL, *out = NULL, *name = NULL;
    const char *weights_from = NULL;
    const char *type = "q4_k_m";
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t vocab = -1,
            threads = ncpu < 1                    ? 1
                      : ncpu > SIL_MK_MAX_THREADS ? SIL_MK_MAX_THREADS
                                                  : ncpu,
            seed = 1;
    float skew = 0;
    bool dry = false, quiet = false, exact = false;
    int n_overrides = 0, n_set = 0;
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case O_PRESET: preset = optarg; break;
        case O_ARCH: arch = optarg; break;
        case O_VOCAB:
            if (parse_int("--vocab", optarg, &vocab))
                return 2;
            break;
        case O_VOCAB_FROM: vocab_from = optarg; break;
        case O_PRE: pre = optarg; break;
        case O_TYPE: type = optarg; break;
        case O_OVERRIDE: overrides[n_overrides++] = optarg; break;
        case O_SKEW:
            if (parse_float("--skew", optarg, &skew) || skew < 0 || skew > 10) {
                fprintf(stderr, PROG ": --skew must be in [0, 10]\n");
                return 2;
            }
            break;
        case O_SEED:
            if (parse_int("--seed", optarg, &seed))
                return 2;
            break;
        case O_OUT: out = optarg; break;
        case O_THREADS:
            if (parse_int("--threads", optarg, &threads) || threads < 1 ||
                threads > SIL_MK_MAX_THREADS) {
                fprintf(stderr, "sil-mkmodel: --threads must be 1 to %d\n", SIL_MK_MAX_THREADS);
                return 2;
            }
            break;
        case O_NAME: name = optarg; break;
        case O_DRY: dry = true; break;
        case O_EXACT: exact = true; break;
        case O_WEIGHTS: weights_from = optarg; break;
        case O_QUIET: quiet = true; break;
        case O_LIST: sil_mk_list_presets(stdout); return 0;
        case O_HELP: usage(stdout); return 0;
        case O_VERSION: sil_bench_version(PROG); return 0;
        case '?': usage(stderr); return 2;
        default: set[n_set++] = (struct setting){c, optarg}; break;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "sil-mkmodel: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (!out && !dry) {
        fprintf(stderr, "sil-mkmodel: --out FILE is required (or --dry-run)\n");
        return 2;
    }

    struct sil_mk_model m = {.seed = (uint64_t)seed, .skew = skew, .name = name, .exact_quant = exact};
    struct sil_error err = {0};
    if (preset) {
        if (sil_mk_preset(preset, &m.hp) != 0) {
            fprintf(stderr, "sil-mkmodel: unknown preset '%s'; known presets:\n", preset);
            sil_mk_list_presets(stderr);
            return 2;
        }
        if (arch && sil_mk_arch_from_name(arch) != m.hp.arch) {
            fprintf(stderr, "sil-mkmodel: --arch %s contradicts --preset %s (%s)\n", arch, preset,
                    sil_mk_arch_name(m.hp.arch));
            return 2;
        }
    } else {
        int a = sil_mk_arch_from_name(arch ? arch : "qwen35moe");
        if (a < 0) {
            fprintf(stderr, "sil-mkmodel: unknown --arch '%s' (qwen35moe, qwen35, qwen3moe, qwen3)\n", arch);
            return 2;
        }
        sil_mk_arch_defaults(a, &m.hp);
    }
    for (int i = 0; i < n_set; i++) {
        struct sil_mk_hparams *hp = &m.hp;
        char flag[32] = "";
        for (const struct option *o = opts; o->name; o++)
            if (o->val == set[i].opt)
                snprintf(flag, sizeof(flag), "--%s", o->name);
        int64_t v = 0;
        int rc = 0;
        switch (set[i].opt) {
        case O_TIED: hp->tied = true; continue;
        case O_UNTIED: hp->tied = false; continue;
        case O_MTP: hp->n_nextn = 1; continue;
        case O_ROPE_BASE: rc = parse_float("--rope-base", set[i].val, &hp->rope_base); break;
        case O_ROPE_PARTIAL: rc = parse_float("--rope-partial", set[i].val, &hp->rope_partial); break;
        default: rc = parse_int(flag, set[i].val, &v); break;
        }
        if (rc)
            return 2;
        switch (set[i].opt) {
        case O_LAYERS: hp->n_layer = v; break;
        case O_EMBD: hp->n_embd = v; break;
        case O_HEADS: hp->n_head = v; break;
        case O_KV: hp->n_head_kv = v; break;
        case O_HEAD_DIM: hp->head_dim = v; break;
        case O_FFN: hp->n_ff = v; break;
        case O_EXPERTS: hp->n_expert = v; break;
        case O_USED: hp->n_expert_used = v; break;
        case O_EXP_FFN: hp->n_ff_exp = v; break;
        case O_SH_FFN: hp->n_ff_shexp = v; break;
        case O_DN_K: hp->ssm_n_group = v; break;
        case O_DN_V: hp->ssm_dt_rank = v; break;
        case O_DN_DIM: hp->ssm_d_state = v; break;
        case O_DN_CONV: hp->ssm_d_conv = v; break;
        case O_FAI: hp->full_attn_interval = v; break;
        case O_CTX: hp->n_ctx_train = v; break;
        default: break;
        }
    }
    if (skew > 0 && !sil_mk_arch_is_moe(m.hp.arch))
        fprintf(stderr, "sil-mkmodel: --skew ignored: %s has no experts\n", sil_mk_arch_name(m.hp.arch));

    m.recipe = sil_mk_recipe_from_name(type);
    if (m.recipe < 0) {
        fprintf(stderr, "sil-mkmodel: unknown --type '%s'\n", type);
        return 2;
    }

    int rc;
    if (vocab_from)
        rc = sil_mk_vocab_from_hf(&m.vocab, vocab_from, vocab > 0 ? vocab : 0, &err);
    else
        rc = sil_mk_vocab_synthetic(&m.vocab, vocab > 0 ? vocab : m.hp.n_vocab, m.seed, &err);
    if (rc)
        goto fail;
    if (pre)
        snprintf(m.vocab.pre, sizeof(m.vocab.pre), "%s", pre);
    m.hp.n_vocab = m.vocab.n;
    if ((rc = sil_mk_check_hparams(&m.hp, &err)) || (rc = sil_mk_build_tensors(&m, &err)) ||
        (rc = sil_mk_assign_types(&m, overrides, n_overrides, &err)))
        goto fail;
    if (weights_from && (rc = sil_mk_weights_from_dir(&m, weights_from, &err)))
        goto fail;

    uint64_t total = 0, params = 0;
    for (int64_t i = 0; i < m.n_tensors; i++) {
        const struct sil_mk_tensor *t = &m.tensors[i];
        total += (t->nbytes + 31) / 32 * 32;
        params += (uint64_t)(t->ne[0] * t->ne[1] * t->ne[2]);
        if (dry)
            printf("%-36s %-6s [%lld, %lld, %lld] %llu bytes\n", t->name, sil_type_name(t->type),
                   (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (unsigned long long)t->nbytes);
    }
    fprintf(dry ? stdout : stderr,
            "sil-mkmodel: %s, %lld layers, hidden %lld, vocab %lld, %s, %lld tensors, %.3f B params, "
            "%.2f MiB of tensor data\n",
            sil_mk_arch_name(m.hp.arch), (long long)m.hp.n_layer, (long long)m.hp.n_embd,
            (long long)m.hp.n_vocab, sil_mk_recipe_name(m.recipe), (long long)m.n_tensors,
            (double)params / 1e9, (double)total / (1024.0 * 1024.0));
    if (!dry && (rc = sil_mk_write(&m, out, (int)threads, !quiet, &err)))
        goto fail;
    sil_mk_model_free(&m);
    return 0;
fail:
    fprintf(stderr, "sil-mkmodel: %s\n", err.msg);
    sil_mk_model_free(&m);
    return 1;
}

int main(int argc, char **argv)
{
    char **overrides = calloc((size_t)argc, sizeof(char *));
    struct setting *set = calloc((size_t)argc, sizeof(*set));
    int rc = 1;
    if (overrides && set)
        rc = mkmodel(argc, argv, overrides, set);
    else
        fprintf(stderr, "sil-mkmodel: out of memory\n");
    free(overrides);
    free(set);
    return rc;
}
