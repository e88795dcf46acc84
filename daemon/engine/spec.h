/* Speculative decoding with a separate draft model: a chain (tree 1xN), greedy.
 *
 * Per step, the draft model proposes depth tokens greedily, one row at a time; the target
 * evaluates the last emitted token and the drafts in one batch with the argmax of every row
 * (sil_seq_spec_begin), accepts the longest run of drafts equal to its own greedy choices, and
 * adds its own token after them (the correction, or a bonus when every draft was right). Both
 * sequences keep only the accepted positions (sil_seq_spec_commit), so the tokens are those of
 * plain greedy decoding of the target, token for token, and 1..depth+1 come out of a step.
 *
 * The two models must share the vocabulary: the same size and the same token texts
 * (sil_spec_vocab_check). They may be the same engine (two sequences) or two engines.
 *
 * Ownership: a struct sil_spec borrows the engines and sequences (the caller creates and frees
 * them) and owns its row buffers until sil_spec_free. One thread at a time (the engines'). */
#ifndef SIL_SPEC_H
#define SIL_SPEC_H

#include <stdint.h>

#include "daemon/engine/engine.h"
#include "kernels/error.h"

/* The deepest chain a step drafts. */
#define SIL_SPEC_DEPTH_MAX 64

/* 0 when draft can draft for target: the same number of tokens and the same bytes for every
 * token; else -EINVAL with err naming the first difference. */
int sil_spec_vocab_check(const struct sil_vocab *target, const struct sil_vocab *draft,
                         struct sil_error *err);

/* Counters since init: verify passes (steps), draft tokens proposed and accepted, tokens
 * emitted (accepted + one a step), and the seconds spent drafting (the draft's catch-up and
 * proposals), verifying (the target's batch) and committing (rollback, with the recompute of
 * the kept rows on models with recurrent layers). */
struct sil_spec_stats {
    uint64_t steps, drafted, accepted, emitted;
    double draft_s, verify_s, commit_s;
    /* The verify passes' MoE layers (those whose routing the host saw, sil_engine_stats): how
     * many, and summed over them the union of the rows' experts (each read and multiplied once
     * for every row that chose it) and rows x top-k. union / layers beside pairs / layers is
     * what verifying many rows at once saves on expert reads. */
    uint64_t moe_layers, expert_union, expert_pairs;
};

struct sil_spec {
    struct sil_engine *target, *draft;
    int tseq, dseq;
    int32_t depth;
    /* a token tree's width (sil_spec_set_width; 1: a chain), its parents, drafts and the
     * draft's logits of the first level: par [1 + width * depth], tt [width * depth], dlg
     * [n_vocab], keep [depth + 1] */
    int32_t width;
    int32_t *par, *tt, *keep;
    float *dlg;
    struct sil_spec_stats stats;
    /* row buffers: [depth + 1] for a verify batch, [n_batch_max of the draft] for a catch-up */
    int32_t *tok, *pos, *seq, *am, *dtok;
    bool *want;
    int32_t n_rows_max;
    /* sil_spec_step_sampled's buffers, made at its first call: the draft's distributions
     * q[depth][n_vocab], the target's logits lg[depth + 1][n_vocab] (while the MTP layer drafts,
     * its catch-up rows' logits first) and one distribution p, a scratch row, and the history
     * with the drafts (hist[hcap]) */
    float *q, *lg, *p, *scratch;
    int32_t *hbuf;
    size_t hcap;
    /* MTP drafting (sil_spec_init_mtp; draft NULL): the target's MTP layer holds entries for
     * target positions [mbase, mbase + mlen) (its own positions from 0); hid holds the target's
     * hidden states of the last verify pass ([depth + 1][n_embd]), rows for positions
     * [hpos, hpos + hn); hin / hout [depth + 1][n_embd] and mtok / mam [depth + 1] the MTP
     * layer's rows */
    bool mtp;
    int32_t mbase, mlen, hpos, hn;
    /* oracle drafting (sil_spec_init_oracle; draft NULL): the tokens it knows, the chance of
     * proposing the right one, the sampler whose generator draws (owned) */
    bool oracle;
    const int32_t *oref;
    int32_t n_oref;
    double op;
    struct sil_sampler *orng;
    float *hid, *hin, *hout;
    int32_t *mtok, *mam;
};

/* target/tseq: the model whose greedy tokens come out; draft/dseq: the one that proposes
 * (draft may be target, with another sequence). depth: drafts a step, 1..SIL_SPEC_DEPTH_MAX,
 * and fewer than the target's sil_engine_n_batch_max. Checks the vocabularies. -EINVAL, -ENOMEM. */
int sil_spec_init(struct sil_spec *s, struct sil_engine *target, int tseq, struct sil_engine *draft,
                  int dseq, int32_t depth, struct sil_error *err);
void sil_spec_free(struct sil_spec *s);
/* The same with the target's own MTP layer as the drafter (sil_engine_has_mtp): per step the
 * layer catches up on the positions the last verify pass kept, from the target's hidden states
 * there, then proposes depth tokens one row at a time, each from the hidden state of the row
 * before (Qwen3.5's recursive MTP). The first step of a sequence has no hidden state to start
 * from and drafts nothing, unless the prompt was fed (sil_spec_mtp_feed). Greedy (sil_spec_step) or
 * sampled (sil_spec_step_sampled: the layer's logits under dsmp's settings are the draft's
 * distribution). -EINVAL, -ENOTSUP (no MTP layer), -ENOMEM. */
int sil_spec_init_mtp(struct sil_spec *s, struct sil_engine *target, int tseq, int32_t depth,
                      struct sil_error *err);
/* The MTP layer reads the history too, as it was trained to (each row attends to the layer's
 * rows of every earlier position): after sil_spec_init_mtp, while the target's sequence is
 * prefilled, each evaluation of n rows (the sequence's next positions, tokens tok[0, n), from
 * position 0 on) hands its hidden states (sil_engine_eval_hidden's, n_embd floats a row) here:
 * the layer takes the rows whose next token is known (all but the last; the previous call's last
 * with tok[0]), and the last hidden state waits for the next call or the first step, which
 * then drafts at once. Without it the layer starts at the first step, blind to the prompt.
 * -EINVAL (not MTP drafting, or not the positions the layer has), -ENOMEM, the engine's errors
 * (the layer then starts over at the first step). */
int sil_spec_mtp_feed(struct sil_spec *s, const int32_t *tok, int32_t n, const float *hidden,
                      struct sil_error *err);

/* A drafter for tests and benchmarks, no model: an oracle that knows the target's greedy
 * continuation, ref[i] being the token at index i of the history (the prompt, then plain
 * greedy decoding's tokens; n_ref of them, borrowed until sil_spec_free). Each draft of a step
 * is ref's token at its index with probability p, else one surely wrong ((ref + 1) % n_vocab;
 * past ref, token 0), the draws from a generator seeded with seed. What comes out is still the
 * target's greedy decoding (the verify pass decides); the oracle shows what a drafter whose
 * every draft is right with probability p gives, without a drafter's cost. Greedy chains only
 * (sil_spec_step_sampled and trees: -ENOTSUP).
 * -EINVAL (depth, p outside [0, 1], no ref), -ENOMEM. */
int sil_spec_init_oracle(struct sil_spec *s, struct sil_engine *target, int tseq, int32_t depth,
                         const int32_t *ref, int32_t n_ref, double p, uint64_t seed,
                         struct sil_error *err);

/* The largest tree: 1 + width x depth rows (sil_engine_eval_tree's 64 positions). */
#define SIL_SPEC_TREE_ROWS 64

/* Greedy steps of a draft-model spec verify a token tree of width x depth: the draft's width
 * most likely tokens after the last one, each followed by the draft's greedy chain of depth - 1,
 * all in one verify pass (sil_engine_eval_tree: each node sees its ancestors only); the longest
 * path the target's greedy choices agree with is kept (sil_seq_spec_commit_path), so the tokens
 * stay plain greedy decoding's. Width 1 is the chain. Sampled steps still draft a chain.
 * On models with recurrent layers every branch starts from the state after the root (one
 * verify pass still; engine.h) and the kept path is evaluated again at the commit, as a chain's.
 * -ENOTSUP where the target cannot verify trees (sil_engine_has_tree: the CPU backend) or the
 * MTP layer or the oracle drafts; -EINVAL beyond SIL_SPEC_TREE_ROWS or a batch; -ENOMEM. */
int sil_spec_set_width(struct sil_spec *s, int32_t width, struct sil_error *err);

/* One step. hist[0, n_hist) are the tokens so far (prompt and output); the target's sequence
 * holds hist[0, n_hist - 1) (the last token is not evaluated yet) and the draft's any prefix of
 * that (it catches up here). Writes 1..min(depth + 1, max_out) tokens, the target's
 * greedy continuation of hist, to out and returns how many; after it the target holds hist and
 * out but the last of out, and the draft at most that. Fewer drafts are made near the end of a
 * context. On error (-EINVAL, -ENOBUFS, -ENOSPC, -EIO...) nothing is emitted and both sequences
 * are left at positions that still fit hist (the target as it was), so the step can be tried
 * again. */
int sil_spec_step(struct sil_spec *s, const int32_t *hist, int32_t n_hist, int32_t max_out,
                  int32_t *out, struct sil_error *err);

/* Speculative sampling (Leviathan et al., Chen et al.): the target's distribution p and the
 * draft's q over n tokens, and x, a token the draft drew from q. x is accepted with probability
 * min(1, p(x) / q(x)) (rng's uniform draw); otherwise a token is drawn from max(0, p - q)
 * normalized (from p if that is all zero, which exact arithmetic never gives). So the token
 * returned follows p whatever q is. *accepted says which; scratch holds n floats. */
int32_t sil_spec_accept(const float *p, const float *q, int32_t n, int32_t x,
                        struct sil_sampler *rng, float *scratch, bool *accepted);

/* sil_spec_step for a sampled request: the drafter (the draft model or the MTP layer) draws
 * each draft token from its distribution under dsmp's settings, the target's distributions come from tsmp (the same settings: bias,
 * penalties over hist and the drafts before, top-k, top-p, min-p, temperature), and each draft
 * goes through sil_spec_accept in order; the first rejection gives the replacement token and ends
 * the step, and a chain accepted whole gets a bonus token drawn from the target's distribution
 * after it. The tokens that come out follow the target's sampling distribution, token after
 * token, as sil_sampler_sample would draw them (not the same draws). With temperature <= 0 the
 * distributions are one-hot and the step gives greedy decoding's tokens. Same contract for the
 * sequences and errors as sil_spec_step, plus -ENOMEM. */
int sil_spec_step_sampled(struct sil_spec *s, const int32_t *hist, int32_t n_hist, int32_t max_out,
                          struct sil_sampler *tsmp, struct sil_sampler *dsmp, int32_t *out,
                          struct sil_error *err);

#endif
