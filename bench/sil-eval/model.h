/* sil-eval's model modes: evaluate a prompt, print logits, greedy continuation and timings. */
#ifndef SIL_EVAL_MODEL_H
#define SIL_EVAL_MODEL_H

#include <stdbool.h>

struct sil_eval_model_opts {
    const char *model;
    const char *tokens;        /* "1,2,3" */
    const char *prompt;        /* text, tokenized with the model's vocab */
    const char *tokenize_file; /* a file's exact bytes, tokenized */
    const char *n_predict;     /* greedy tokens after the prompt (default 0) */
    const char *logits;        /* last | all | none (default last) */
    const char *threads;       /* default: online CPUs */
    const char *backend;       /* cpu | cuda | auto; NULL = cpu */
    const char *route_trace;   /* routing trace to write, or NULL */
    const char *route_replay;  /* routing trace to route with (cpu), or NULL */
    const char *ecache_slots;  /* simulated expert cache slots, or NULL */
    const char *ecache_policy; /* its policy, NULL = lru */
    const char *kv_type;       /* f16 | q8_0 | q4_0 | f32; NULL = the engine's default */
    bool exact, json, parse_special, add_bos;
    /* the MTP layer's logits of every prompt position but the last (row t from the hidden state
     * at t and token t + 1), printed as JSON instead of the usual run */
    bool mtp_logits;
    const char *ctx; /* context length (default: the model's, at most 4096) */
    const char *vram_budget; /* device memory cap ("8G"), NULL = none */
    const char *host_budget; /* routed experts' host memory ("24G", auto, off), NULL = auto */
    const char *passes;      /* prompt + continuation this many times (default 1) */
    const char *heat_map;    /* expert heat map: loaded and preloaded at start, saved at the end */
    /* the CUDA backend's user options, as siliceod.conf(5) takes them; NULL = the default */
    const char *cuda_graphs, *cuda_zero_copy, *cuda_pin, *cuda_cpu_share;
    /* speculative decoding after the plain decode, compared with it: off (NULL) or draft, the
     * draft model's file, and the tree (WIDTHxDEPTH; 1xDEPTH: a chain) */
    const char *spec, *draft_model, *spec_tree;
    const char *oracle_p; /* --spec oracle: the chance a draft is right (NULL: 0.8) */
    /* plain decoding's steps ("3,10,20") where one row at a time is compared with the same row
     * as the second of a two-row pass and with itself run again (NULL: none) */
    const char *probe_steps;
};

/* Returns a process exit status (0, 1 on failure, 2 on usage errors). */
int sil_eval_model(const struct sil_eval_model_opts *o);

#endif
