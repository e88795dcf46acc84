/* sil-eval: offline evaluation tool. Modes so far: --tokenize-file (encode a file's exact bytes
 * with the model's tokenizer). Options are one table (opt_defs); a new option is a new row and a
 * field in struct opts. Unknown options and options of modes not built yet are usage errors. */
#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/sil-eval/model.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer.h"

#define EXIT_USAGE 2

struct opts {
    const char *model;
    const char *tokenize_file;
    bool parse_special;
    bool add_bos;
    bool json;
    bool mtp_logits;
    bool help;
    bool version;
    /* model evaluation (bench/sil-eval/model.c) */
    const char *tokens, *prompt, *n_predict, *logits, *threads, *backend, *ctx, *kv_type;
    const char *route_trace, *route_replay, *ecache_slots, *ecache_policy, *vram_budget, *passes;
    const char *heat_map, *host_budget;
    const char *cuda_graphs, *cuda_zero_copy, *cuda_pin, *cuda_cpu_share;
    const char *spec, *draft_model, *spec_tree, *oracle_p, *probe_steps;
    bool exact;
};

enum opt_kind { OPT_FLAG, OPT_STR };

static const struct opt_def {
    const char *name;
    enum opt_kind kind;
    size_t off;
    const char *metavar;
    const char *help;
} opt_defs[] = {
    {"--model", OPT_STR, offsetof(struct opts, model), "FILE", "GGUF model or vocab-only GGUF"},
    {"--tokenize-file", OPT_STR, offsetof(struct opts, tokenize_file), "FILE",
     "tokenize the exact bytes of FILE and print the ids"},
    {"--parse-special", OPT_FLAG, offsetof(struct opts, parse_special), NULL,
     "match control-token text (e.g. <|im_start|>) in the input"},
    {"--add-bos", OPT_FLAG, offsetof(struct opts, add_bos), NULL,
     "prepend the BOS token when the vocab has one"},
    {"--json", OPT_FLAG, offsetof(struct opts, json), NULL, "print JSON: {\"ids\": [...]}"},
    {"--tokens", OPT_STR, offsetof(struct opts, tokens), "IDS",
     "evaluate these token ids (1,2,3; ranges too: 1..512)"},
    {"--prompt", OPT_STR, offsetof(struct opts, prompt), "TEXT", "evaluate TEXT (tokenized)"},
    {"--n-predict", OPT_STR, offsetof(struct opts, n_predict), "N",
     "greedy tokens after the prompt"},
    {"--logits", OPT_STR, offsetof(struct opts, logits), "MODE", "last (default), all or none"},
    {"--threads", OPT_STR, offsetof(struct opts, threads), "N", "worker threads (default: CPUs)"},
    {"--backend", OPT_STR, offsetof(struct opts, backend), "NAME", "cpu (default), cuda or auto"},
    {"--context", OPT_STR, offsetof(struct opts, ctx), "N",
     "context length (default: the model's, at most 4096), as siliceod's --context"},
    {"--ctx", OPT_STR, offsetof(struct opts, ctx), "N", "the same as --context"},
    {"--route-trace", OPT_STR, offsetof(struct opts, route_trace), "FILE",
     "write every MoE layer's routing to FILE (sil-cachesim's trace format; on cuda the "
     "routing comes to the host)"},
    {"--route-replay", OPT_STR, offsetof(struct opts, route_replay), "FILE",
     "route every MoE layer with FILE's choices (a --route-trace of the same tokens; cpu "
     "backend) and report how far they are from the top-k"},
    {"--ecache-slots", OPT_STR, offsetof(struct opts, ecache_slots), "N",
     "simulate an expert cache of N slots on the plans and report its hit rate (cpu backend)"},
    {"--ecache-policy", OPT_STR, offsetof(struct opts, ecache_policy), "NAME",
     "the simulated cache's policy: lfu (default), lru, heat or static"},
    {"--vram-budget", OPT_STR, offsetof(struct opts, vram_budget), "SIZE",
     "cap the device memory the cuda backend takes (e.g. 8G); experts that do not fit are "
     "cached in slots"},
    {"--host-budget", OPT_STR, offsetof(struct opts, host_budget), "SIZE",
     "host memory for everything kept there (e.g. 12G: on the cpu backend the backbone and KV "
     "first, then the routed experts; auto, the default: what the host and the cgroup can spare; "
     "off: the experts through the mapping as before); experts that do not fit are read from the "
     "file into host slots"},
    {"--passes", OPT_STR, offsetof(struct opts, passes), "N",
     "evaluate the prompt and its continuation N times in fresh sequences of one engine "
     "(pass 1 cold, then warm; default 1)"},
    {"--heat-map", OPT_STR, offsetof(struct opts, heat_map), "FILE",
     "keep an expert heat map in FILE, as siliceod does in its state directory: when FILE is "
     "there its hottest experts are preloaded into the expert cache at start (a warm restart); "
     "the map is saved to FILE at the end"},
    {"--cuda-graphs", OPT_STR, offsetof(struct opts, cuda_graphs), "on|off",
     "replay decode passes as CUDA graphs (on, the default) or run them op by op"},
    {"--cuda-zero-copy", OPT_STR, offsetof(struct opts, cuda_zero_copy), "on|off",
     "with experts in slots, decode reads the missing ones in place from pinned host memory "
     "(default off)"},
    {"--cuda-pin", OPT_STR, offsetof(struct opts, cuda_pin), "auto|on|off",
     "where misses are copied from when the experts fit the host budget (auto, the default: a "
     "host tier of all of them read at start; on: the file's pages pinned; off: staged)"},
    {"--cuda-cpu-share", OPT_STR, offsetof(struct opts, cuda_cpu_share), "SHARE",
     "the share of each decode layer's expert misses computed on the CPU: auto (the "
     "default: from the measured speeds), off, or a number in [0, 1]"},
    {"--kv-type", OPT_STR, offsetof(struct opts, kv_type), "TYPE",
     "KV cache elements: f32 (default), f16, q8_0 or q4_0"},
    {"--exact", OPT_FLAG, offsetof(struct opts, exact), NULL,
     "reference mode: weights dequantized to F32, F32 activations"},
    {"--spec", OPT_STR, offsetof(struct opts, spec), "MODE",
     "speculative decoding after the plain decode: off (default), draft, mtp or oracle"},
    {"--oracle-p", OPT_STR, offsetof(struct opts, oracle_p), "P",
     "--spec oracle (a benchmark drafter): the chance each draft is the plain decode's token "
     "(default 0.8)"},
    {"--probe-steps", OPT_STR, offsetof(struct opts, probe_steps), "LIST",
     "with --spec: at these plain decoding steps (e.g. 4,12,20; at most 16), how far a row's "
     "logits move as the second row of a two-row pass, and run again one row at a time"},
    {"--draft-model", OPT_STR, offsetof(struct opts, draft_model), "FILE",
     "the draft model of --spec draft (the target's vocabulary)"},
    {"--mtp-logits", OPT_FLAG, offsetof(struct opts, mtp_logits), NULL,
     "print the MTP layer's logits of every prompt position but the last (JSON), and stop"},
    {"--spec-tree", OPT_STR, offsetof(struct opts, spec_tree), "WxD",
     "drafts a step: 1xDEPTH, a chain (default 1x4), or a tree WIDTHxDEPTH"},
    {"--help", OPT_FLAG, offsetof(struct opts, help), NULL, "show this help and exit"},
    {"--version", OPT_FLAG, offsetof(struct opts, version), NULL, "show the version and exit"},
};
#define N_OPTS (sizeof opt_defs / sizeof opt_defs[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: sil-eval --model FILE --tokenize-file FILE [--parse-special] [--add-bos] "
               "[--json]\n"
               "       sil-eval --model FILE (--tokens IDS | --prompt TEXT | --tokenize-file FILE)\n"
               "                [--n-predict N] [--logits last|all|none] [--threads N] [--exact] "
               "[--kv-type TYPE] [--json]\n"
               "                [--spec off|draft|mtp [--draft-model FILE] [--spec-tree WxDEPTH]]\n"
               "\noptions:\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        char left[64];
        snprintf(left, sizeof left, "%s%s%s", opt_defs[i].name, opt_defs[i].metavar ? " " : "",
                 opt_defs[i].metavar ? opt_defs[i].metavar : "");
        fprintf(f, "  %-24s %s\n", left, opt_defs[i].help);
    }
}

/* Parses argv into o; "--name value" and "--name=value" both work. Returns 0 or EXIT_USAGE. */
static int parse_args(int argc, char **argv, struct opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *eq = strchr(a, '=');
        size_t nl = eq ? (size_t)(eq - a) : strlen(a);
        const struct opt_def *d = NULL;
        for (size_t k = 0; k < N_OPTS; k++)
            if (strlen(opt_defs[k].name) == nl && strncmp(opt_defs[k].name, a, nl) == 0)
                d = &opt_defs[k];
        if (!d) {
            fprintf(stderr, "sil-eval: unknown option '%s' (see sil-eval --help)\n", a);
            return EXIT_USAGE;
        }
        char *field = (char *)o + d->off;
        if (d->kind == OPT_FLAG) {
            if (eq) {
                fprintf(stderr, "sil-eval: %s takes no value\n", d->name);
                return EXIT_USAGE;
            }
            *(bool *)field = true;
        } else {
            const char *val = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!val) {
                fprintf(stderr, "sil-eval: %s needs a value (%s)\n", d->name, d->metavar);
                return EXIT_USAGE;
            }
            *(const char **)field = val;
        }
    }
    return 0;
}

static int read_file(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    int rc = 0;
    while (p) {
        size_t r = fread(p + n, 1, cap - n, f);
        n += r;
        if (r == 0) {
            if (ferror(f))
                rc = errno ? -errno : -EIO;
            break;
        }
        if (n == cap) {
            char *q = realloc(p, cap *= 2);
            if (!q) {
                free(p);
                p = NULL;
            }
            p = q;
        }
    }
    fclose(f);
    if (!p)
        return -ENOMEM;
    if (rc < 0) {
        free(p);
        return rc;
    }
    *buf = p;
    *len = n;
    return 0;
}

/* printf per id dominated the run time of large files; ids are formatted by hand. */
static int print_ids(const int32_t *ids, size_t n, bool json)
{
    char buf[1 << 16];
    size_t o = 0;
    const char *sep = json ? ", " : " ";
    if (json)
        fputs("{\"ids\": [", stdout);
    for (size_t i = 0; i < n; i++) {
        if (o > sizeof buf - 32) {
            fwrite(buf, 1, o, stdout);
            o = 0;
        }
        if (i)
            for (const char *p = sep; *p; p++)
                buf[o++] = *p;
        char digits[16];
        int nd = 0;
        int64_t x = ids[i];
        if (x < 0) {
            buf[o++] = '-';
            x = -x;
        }
        do {
            digits[nd++] = (char)('0' + x % 10);
            x /= 10;
        } while (x);
        while (nd)
            buf[o++] = digits[--nd];
    }
    if (o)
        fwrite(buf, 1, o, stdout);
    fputs(json ? "]}\n" : "\n", stdout);
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : -EIO;
}

static int run_tokenize(const struct opts *o)
{
    struct sil_error err = {0};
    struct sil_gguf *g = NULL;
    struct sil_vocab *v = NULL;
    char *text = NULL;
    int32_t *ids = NULL;
    size_t len = 0, n = 0;
    int rc = EXIT_FAILURE;

    int e = read_file(o->tokenize_file, &text, &len);
    if (e < 0) {
        fprintf(stderr, "sil-eval: %s: %s\n", o->tokenize_file, strerror(-e));
        return EXIT_FAILURE;
    }
    if (sil_gguf_open(&g, o->model, &err) < 0 || sil_vocab_load(&v, g, &err) < 0 ||
        sil_tokenize(v, text, len, o->add_bos, o->parse_special, &ids, &n, &err) < 0) {
        fprintf(stderr, "sil-eval: %s\n", err.msg);
        goto out;
    }
    rc = print_ids(ids, n, o->json) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
out:
    free(ids);
    free(text);
    sil_vocab_free(v);
    if (g)
        sil_gguf_close(g);
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o = {0};
    int rc = parse_args(argc, argv, &o);
    if (rc)
        return rc;
    if (o.help) {
        usage(stdout);
        return EXIT_SUCCESS;
    }
    if (o.version) {
        printf("sil-eval %s\nbackends: %s\n", SIL_VERSION, sil_engine_backends());
        return EXIT_SUCCESS;
    }
    if ((o.draft_model || o.spec_tree || o.spec || o.oracle_p) &&
        !(o.tokens || o.prompt || o.tokenize_file)) {
        fprintf(stderr, "sil-eval: --spec, --draft-model and --spec-tree need a prompt "
                        "(--tokens, --prompt or --tokenize-file) and --n-predict\n");
        return EXIT_USAGE;
    }
    if (o.tokens || o.prompt || (o.tokenize_file && (o.n_predict || o.logits || o.spec))) {
        if (!o.model) {
            fprintf(stderr, "sil-eval: model evaluation needs --model FILE\n");
            return EXIT_USAGE;
        }
        struct sil_eval_model_opts mo = {
            .model = o.model,
            .tokens = o.tokens,
            .prompt = o.prompt,
            .tokenize_file = o.tokenize_file,
            .n_predict = o.n_predict,
            .logits = o.logits,
            .threads = o.threads,
            .backend = o.backend,
            .route_trace = o.route_trace,
            .route_replay = o.route_replay,
            .ecache_slots = o.ecache_slots,
            .ecache_policy = o.ecache_policy,
            .kv_type = o.kv_type,
            .vram_budget = o.vram_budget,
            .host_budget = o.host_budget,
            .passes = o.passes,
            .heat_map = o.heat_map,
            .cuda_graphs = o.cuda_graphs,
            .cuda_zero_copy = o.cuda_zero_copy,
            .cuda_pin = o.cuda_pin,
            .cuda_cpu_share = o.cuda_cpu_share,
            .exact = o.exact,
            .json = o.json,
            .mtp_logits = o.mtp_logits,
            .parse_special = o.parse_special,
            .add_bos = o.add_bos,
            .ctx = o.ctx,
            .spec = o.spec,
            .draft_model = o.draft_model,
            .spec_tree = o.spec_tree,
            .oracle_p = o.oracle_p,
            .probe_steps = o.probe_steps,
        };
        return sil_eval_model(&mo);
    }
    if (!o.tokenize_file) {
        fprintf(stderr, "sil-eval: no mode given: use --tokens, --prompt or --tokenize-file; "
                        "see sil-eval --help\n");
        return EXIT_USAGE;
    }
    if (!o.model) {
        fprintf(stderr, "sil-eval: --tokenize-file needs --model FILE\n");
        return EXIT_USAGE;
    }
    return run_tokenize(&o);
}
