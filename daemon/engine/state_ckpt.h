/* Recurrent-state checkpoints: snapshots of a sequence's whole recurrent state (conv + SSM state
 * of every gated delta-net layer, one flat vector) taken at a position, so the sequence can be
 * cut back to that position and continued as if the tokens after it had never been evaluated.
 * Attention KV needs no snapshot (positions past the cut are simply rewritten).
 *
 * A store holds, per owner (an index: the engine's stores are per sequence; a prefix cache can
 * keep one of its own, per cached block chain), a bounded list of (position, snapshot); what
 * keeps them (a session's turns, a prefix cache taking one every N blocks of a long prompt)
 * chooses where and how many. Restoring copies the snapshot back: bit-identical state, so a continuation gives the
 * same outputs as evaluating the whole prefix. Snapshots are malloc'd when taken (between
 * evaluations, never inside one) and freed when dropped.
 * Ownership: the store owns every snapshot; one thread at a time (the engine's). */
#ifndef SIL_STATE_CKPT_H
#define SIL_STATE_CKPT_H

#include <stdint.h>

#include "kernels/error.h"

struct sil_state_ckpt;

/* floats: size of one sequence's recurrent state (0: the model has none; every call is a no-op). */
int sil_ckpt_create(struct sil_state_ckpt **out, int32_t n_seq_max, int64_t floats,
                    struct sil_error *err);
void sil_ckpt_free(struct sil_state_ckpt *c);

/* Snapshot of state at pos (replacing one at the same position). With max_keep already held,
 * the one at the lowest position goes first; max_keep <= 0 keeps none (and drops all). -ENOMEM
 * leaves the list as it was. */
int sil_ckpt_save(struct sil_state_ckpt *c, int seq, int32_t pos, const float *state, int max_keep,
                  struct sil_error *err);
/* The highest checkpointed position <= pos, or -1. */
int32_t sil_ckpt_find(const struct sil_state_ckpt *c, int seq, int32_t pos);
/* Copies the snapshot at exactly pos into state; -ENOENT when there is none. */
int sil_ckpt_restore(const struct sil_state_ckpt *c, int seq, int32_t pos, float *state);
/* Drops the checkpoints at positions > pos (they describe tokens that are gone). */
void sil_ckpt_drop_after(struct sil_state_ckpt *c, int seq, int32_t pos);
void sil_ckpt_clear(struct sil_state_ckpt *c, int seq);
int sil_ckpt_count(const struct sil_state_ckpt *c, int seq);
/* Bytes of the snapshots one sequence holds. */
uint64_t sil_ckpt_bytes(const struct sil_state_ckpt *c, int seq);

#endif
