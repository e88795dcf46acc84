#include "bench/common/spec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/spec.h"

int sil_bench_spec_mode(const char *prog, const char *spec, const char *draft_model,
                        const char *spec_tree, bool with_oracle, enum sil_bench_spec *mode)
{
    *mode = SIL_BENCH_SPEC_OFF;
    if (spec && strcmp(spec, "off") != 0) {
        if (strcmp(spec, "draft") == 0) {
            *mode = SIL_BENCH_SPEC_DRAFT;
        } else if (strcmp(spec, "mtp") == 0) {
            *mode = SIL_BENCH_SPEC_MTP;
        } else if (with_oracle && strcmp(spec, "oracle") == 0) {
            *mode = SIL_BENCH_SPEC_ORACLE;
        } else {
            fprintf(stderr, "%s: --spec must be off, draft%s or mtp\n", prog,
                    with_oracle ? ", oracle" : "");
            return -EINVAL;
        }
    }
    if (*mode == SIL_BENCH_SPEC_DRAFT && !draft_model) {
        fprintf(stderr, "%s: --spec draft needs --draft-model FILE\n", prog);
        return -EINVAL;
    }
    if ((*mode == SIL_BENCH_SPEC_MTP || *mode == SIL_BENCH_SPEC_ORACLE) && draft_model) {
        fprintf(stderr, "%s: --draft-model goes with --spec draft, not %s\n", prog, spec);
        return -EINVAL;
    }
    if (*mode == SIL_BENCH_SPEC_OFF && (draft_model || spec_tree)) {
        fprintf(stderr, "%s: --draft-model and --spec-tree need --spec draft%s or mtp\n", prog,
                with_oracle ? ", oracle" : "");
        return -EINVAL;
    }
    return 0;
}

int sil_bench_spec_tree(const char *prog, const char *s, long *width, long *depth)
{
    char *x, *end;
    errno = 0;
    const long w = strtol(s, &x, 10);
    if (errno || x == s || *x != 'x') goto bad;
    const long d = strtol(x + 1, &end, 10);
    if (errno || end == x + 1 || *end || w < 1 || d < 1) goto bad;
    if (w > 1 && 1 + w * d > SIL_SPEC_TREE_ROWS) {
        fprintf(stderr, "%s: --spec-tree %s: a tree has at most %d rows (1 + width x depth)\n",
                prog, s, SIL_SPEC_TREE_ROWS);
        return -EINVAL;
    }
    if (d > SIL_SPEC_DEPTH_MAX) {
        fprintf(stderr, "%s: --spec-tree %s: depth at most %d\n", prog, s, SIL_SPEC_DEPTH_MAX);
        return -EINVAL;
    }
    *width = w;
    *depth = d;
    return 0;
bad:
    fprintf(stderr, "%s: --spec-tree '%s' is not WIDTHxDEPTH (such as 1x4)\n", prog, s);
    return -EINVAL;
}

int sil_bench_spec_draft_first(const char *prog, enum sil_bench_spec mode,
                               const struct sil_engine_params *dp, struct sil_engine_params *p,
                               struct sil_engine **de)
{
    *de = NULL;
    if (mode != SIL_BENCH_SPEC_DRAFT) return 0;
    struct sil_error err = {0};
    int rc = sil_engine_open(de, dp, &err);
    if (rc < 0) {
        fprintf(stderr, "%s: draft model %s: %s\n", prog, dp->model_path, err.msg);
        *de = NULL;
        return rc;
    }
    const uint64_t took = sil_engine_device_bytes(*de);
    if (p->vram_budget && took >= p->vram_budget) {
        fprintf(stderr, "%s: --vram-budget of %llu MiB: the draft model %s takes %llu MiB of it\n",
                prog, (unsigned long long)(p->vram_budget >> 20), dp->model_path,
                (unsigned long long)(took >> 20));
        sil_engine_close(*de);
        *de = NULL;
        return -ENOMEM;
    }
    p->vram_reserved = p->vram_budget ? took : 0;
    return 0;
}

int sil_bench_spec_check(const char *prog, enum sil_bench_spec mode, struct sil_engine *e,
                         const char *model, struct sil_engine **de)
{
    if (mode == SIL_BENCH_SPEC_MTP && !sil_engine_has_mtp(e)) {
        fprintf(stderr, "%s: --spec mtp: %s has no MTP layer (or not on the %s backend)\n", prog,
                model, sil_engine_info(e)->backend);
        return -ENOTSUP;
    }
    if (mode != SIL_BENCH_SPEC_DRAFT || !*de) return 0;
    struct sil_error err = {0};
    const int rc = sil_spec_vocab_check(sil_engine_vocab(e), sil_engine_vocab(*de), &err);
    if (rc < 0) {
        fprintf(stderr, "%s: draft model %s: %s\n", prog, sil_engine_info(*de)->path, err.msg);
        sil_engine_close(*de);
        *de = NULL;
    }
    return rc;
}
