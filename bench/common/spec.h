/* The speculative-decoding options sil-eval and sil-batchbench share: --spec off|draft|mtp,
 * --draft-model FILE, --spec-tree WIDTHxDEPTH, and the drafter they name. Links the engine. */
#ifndef SIL_BENCH_SPEC_H
#define SIL_BENCH_SPEC_H

#include <stdbool.h>

#include "daemon/engine/engine.h"

/* ORACLE: sil-eval's benchmark drafter (sil_spec_init_oracle), which knows the plain decode's
 * tokens */
enum sil_bench_spec { SIL_BENCH_SPEC_OFF, SIL_BENCH_SPEC_DRAFT, SIL_BENCH_SPEC_MTP, SIL_BENCH_SPEC_ORACLE };

/* The mode --spec names (NULL: off), checked against --draft-model and --spec-tree (NULL when
 * not given): 0, or -EINVAL with "prog: why" printed on stderr. "oracle" only where
 * with_oracle. */
int sil_bench_spec_mode(const char *prog, const char *spec, const char *draft_model,
                        const char *spec_tree, bool with_oracle, enum sil_bench_spec *mode);

/* --spec-tree WIDTHxDEPTH: a chain (width 1) or a token tree of at most SIL_SPEC_TREE_ROWS
 * rows; depth at most SIL_SPEC_DEPTH_MAX. 0, or -EINVAL (message printed). */
int sil_bench_spec_tree(const char *prog, const char *s, long *width, long *depth);

/* With draft, the draft model dp->model_path opened with dp into *de before the target, so that
 * on a device its memory is part of the target's vram budget: p->vram_reserved is set to what it
 * took (when p has a budget, which must exceed it). *de NULL for other modes. 0, or a negative
 * errno with "prog: why" printed and nothing left open. */
int sil_bench_spec_draft_first(const char *prog, enum sil_bench_spec mode,
                               const struct sil_engine_params *dp, struct sil_engine_params *p,
                               struct sil_engine **de);

/* Once the target e (opened from model) is open: with mtp, e has its MTP layer; with draft, *de
 * shares e's vocabulary. 0, or a negative errno with "prog: why" printed and *de closed (set
 * NULL); e is the caller's. */
int sil_bench_spec_check(const char *prog, enum sil_bench_spec mode, struct sil_engine *e,
                         const char *model, struct sil_engine **de);

#endif
