/* The engine: the only header the daemon includes. It loads a model (weights stay in the mmap),
 * keeps per-sequence state (KV for full-attention layers, conv + SSM state for gated delta-net
 * layers) and evaluates batches of tokens that may mix sequences and mix prefill with decode.
 *
 * Threading: a struct sil_engine is used by one thread at a time (the daemon's engine thread);
 * it runs its own worker pool inside sil_engine_eval. The vocab it exposes is immutable and may
 * be read from any thread.
 *
 * Room for what comes next: the KV cache (kv_cache.h) is paged with reference-counted blocks the
 * prefix cache (prefix_cache.h, sil_seq_prefix_*) shares across sequences; a batch row carries its
 * sequence so decode of N sequences is one call; speculative decoding verifies a chain of draft
 * tokens in one batch and keeps the accepted prefix (sil_seq_spec_*), or a token tree whose
 * rows see their ancestors only (sil_batch.parent) and keeps its accepted path; a backend other
 * than the CPU (CUDA) is chosen with sil_engine_params.backend. */
#ifndef SIL_ENGINE_H
#define SIL_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "daemon/engine/chat.h"
#include "daemon/engine/hostmem.h"
#include "daemon/engine/sampler.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/cuda/cuda_options.h"
#include "kernels/error.h"

enum sil_arch { SIL_ARCH_QWEN35MOE, SIL_ARCH_QWEN35, SIL_ARCH_QWEN3MOE, SIL_ARCH_QWEN3, SIL_ARCH_COUNT };

/* What one MoE layer routed to, as an observer sees it (engine thread; valid for the call). */
struct sil_route_event {
    int32_t layer, n_rows, n_used;
    const int32_t *expert; /* [n_rows * n_used] the expert of each (row, slot) */
    const float *weight;   /* [n_rows * n_used] its router weight; NULL when seen after a pass */
    /* the distinct experts in the order the layer runs them, and their (row, slot) pairs:
     * active[a]'s are [active_start[a], active_start[a + 1]) */
    int32_t n_active;
    const int32_t *active, *active_start;
    /* when the observer's choose gave this layer's choices: those outside the engine's own
     * top-k, the largest ln(p of its own k-th / p of such a choice) (0: none), and whether one
     * could not be taken (out of range or repeated in a row) */
    bool forced;
    int32_t forced_changed;
    float forced_gap;
    bool forced_bad;
};

/* An observer of the engine's routing, for tests and benchmarks (route tracing and replay,
 * route_obs.h): registered at open (sil_engine_params.observer) and called on the engine thread
 * from sil_engine_open and sil_engine_eval. Any callback may be NULL. A layer whose routing
 * stays on the device (CUDA) reaches on_route after its pass where the device's expert cache
 * needs it, else not at all, unless host_routes. The engine's own heat map and
 * simulated cache (heat_map, ecache_sim_slots) watch the plans through the same interface. With
 * no observer the MoE layers only test that there is none. */
struct sil_model_info;
struct sil_engine_observer {
    void *user;
    /* Every MoE layer's choices reach on_route, in evaluation order: on CUDA the routing is
     * then brought to the host, and every expert must be resident (-ENOTSUP at open). */
    bool host_routes;
    /* At open, the model and backend known: 0, or -errno with err filled (the open fails). */
    int (*on_open)(void *user, const struct sil_model_info *info, struct sil_error *err);
    /* A forward pass of n_rows rows starts (one micro-batch; with the host tier, several run
     * layer by layer). */
    void (*on_pass_begin)(void *user, int32_t n_rows);
    /* The choices [n_rows * n_used] (distinct ids a row, in slot order) to route layer with
     * instead of the top-k, each weighted by the router's probability; NULL: the top-k. Read
     * until on_route. CPU backend only (-ENOTSUP at open elsewhere). */
    const int32_t *(*choose)(void *user, int32_t layer, int32_t n_rows);
    void (*on_route)(void *user, const struct sil_route_event *ev);
    /* The pass ended: 0, or -errno with err filled to fail the evaluation. */
    int (*on_pass_end)(void *user, struct sil_error *err);
};

struct sil_engine_params {
    const char *model_path;
    int n_threads;        /* 0 = number of online CPUs */
    const char *backend;  /* "cpu", "cuda" or "auto" (NULL = cpu, the reference) */
    uint64_t vram_budget; /* bytes; 0 = no limit (CUDA only) */
    /* bytes of the device other engines of this process hold (a draft model opened first), part
     * of vram_budget: this engine gets the rest (CUDA only) */
    uint64_t vram_reserved;
    /* sequences whose verification windows (sil_seq_spec_begin) may keep their recurrent state
     * on the device at once (a copy of the state each, taken from vram_budget); a window past
     * them, or with 0, keeps it in host memory, which costs two copies over the bus a step
     * (CUDA only; models with recurrent layers). Above 0 the engine speculates: on CUDA no
     * automatic share of expert misses goes to the CPU (cuda_cpu_share auto), whose products
     * round differently from the device's, so that decoding does not depend on what the
     * expert cache held and verified tokens are plain decoding's */
    int32_t spec_states;
    int32_t n_ctx;        /* max positions per sequence; 0 = min(model context, 4096) */
    int32_t n_seq_max;    /* max live sequences; 0 = 64 */
    int32_t n_batch_max;  /* max rows per sil_engine_eval; 0 = 512 */
    /* max rows per sil_engine_eval when the host tier is on, when more than n_batch_max (a
     * batch reads each layer's missing experts from the file once); 0 = n_batch_max */
    int32_t n_batch_tier;
    /* rows per micro-batch (a forward pass); 0 = the backend's (CPU 128, or 512 with the host
     * tier; CUDA 512); at most those. With the host tier a batch of several micro-batches goes
     * layer by layer: each layer's experts are read once for all of them. */
    int32_t n_ubatch;
    bool exact;           /* weights dequantized to F32, F32 activations (reference mode) */
    /* Look each MoE plan up in a simulated expert cache of this many slots (CPU backend; 0:
     * none) and policy (NULL: the measured best, lfu), whose counters sil_engine_stats reports
     * (siliceod.conf(5) ecache_slots). It changes no logit. The policy is also the device cache's
     * where the CUDA backend keeps experts in slots (an unknown name is then an error). */
    int32_t ecache_sim_slots;
    const char *ecache_sim_policy;
    /* No simulated cache where it cannot run (another backend than the CPU, a model without
     * experts) instead of -ENOTSUP / -EINVAL. */
    bool ecache_sim_soft;
    /* Keep a heat map (the decayed use of every routed expert) from the plans the engine sees,
     * on any backend: what sil_engine_heat_export saves for a warm restart. Only host-routed
     * plans are seen; where CUDA keeps the routing on the device the map is not updated (it
     * stays as imported). No effect on models without experts; changes no logit. */
    bool heat_map;
    /* KV element type of the full-attention layers on the CPU backend: "f32", "f16", "q8_0"
     * (KV8) or "q4_0" (KV4); NULL = f32, the type the reference logits were made with. */
    const char *kv_type;
    /* The one host budget (hostmem.h): everything the engine and the daemon keep in host
     * memory. On the CPU the backbone and the KV pool are held first; the caches (prefix
     * snapshots and blocks, session_budget) and the routed experts the backend reads from the
     * host share the rest, the caches giving way when it is short. When the experts do not fit
     * whole, they are read from the file with direct reads into a host tier of slots (pinned
     * where the backend copies from them, expert_store.h), never through the mapping's page
     * faults. 0: what the host and the process's cgroup can spare (sil_host_spare) less room
     * for the OS; host_budget_off: the experts through the mapping as before, whatever fits. */
    uint64_t host_budget;
    bool host_budget_off;
    /* Host memory the daemon's idle sessions may keep (its session_memory): not used by the
     * engine, only counted in the host budget, which may give it less (sil_engine_host_plan). */
    uint64_t session_budget;
    uint64_t kv_budget; /* KV pool bytes (host memory on the CPU, device memory on CUDA); 0 = every
                         * sequence at n_ctx (backed lazily on the CPU) */
    /* Bytes of recurrent-state snapshots the prefix cache keeps (models with delta-net layers;
     * 0: none, so the prefix cache never hits on them). */
    uint64_t prefix_ckpt_budget;
    /* Bytes of KV blocks no sequence holds that the prefix cache keeps for later hits (the
     * oldest go beyond it); 0: as many as the pool has free. */
    uint64_t prefix_cache_budget;
    /* Load progress in [0,1], called from the loading thread between the stages of the load;
     * may be NULL. Returning false stops the load: sil_engine_open fails with -ECANCELED. */
    bool (*progress)(float fraction, const char *what, void *user);
    void *progress_user;
    /* The CUDA backend's settings (kernels/cuda/cuda_options.h; all zero: the defaults). */
    struct sil_cuda_options cuda;
    /* Tests and benchmarks (siliceo-dev(7)), CPU backend: a file its per-op profile is written
     * to at close (NULL: none), and a ratio in (0, 0.1) its attention outputs are moved by,
     * each element times 1 + r or 1 - r (0: none). */
    const char *cpu_profile;
    float test_attn_noise;
    /* Tests and benchmarks: an observer of the MoE layers' routing (struct
     * sil_engine_observer, e.g. route_obs.h's trace and replay), or NULL. It outlives the
     * engine. */
    const struct sil_engine_observer *observer;
};
void sil_engine_params_default(struct sil_engine_params *p);
/* Sets one of the CUDA backend's user options by its siliceod.conf(5) key: cuda_graphs (on,
 * off), cuda_zero_copy (on, off), cuda_pin (auto, on, off), cuda_cpu_share (auto, off, or a
 * number in [0, 1], 0 being off). -ENOENT for another key; -EINVAL with why filled for a value
 * the key does not take. */
int sil_cuda_option_set(struct sil_cuda_options *o, const char *key, const char *val, char *why,
                        size_t why_size);
/* For tests and benchmarks only: the developer switches of siliceo-dev(7) from the environment
 * into p (its CUDA options and CPU settings) and the CPU kernels' level cap. The one place the
 * engine's SIL_* variables are read; siliceod and the benchmark tools call it once, before
 * sil_engine_open. Values that do not parse are ignored, as unset. */
void sil_dev_switches_read(struct sil_engine_params *p);
/* Whether name is a kv_type sil_engine_open accepts. */
bool sil_engine_kv_type_valid(const char *name);

struct sil_model_info {
    enum sil_arch arch;
    const char *arch_name;  /* "qwen35moe" */
    const char *name;       /* general.name or the file's base name */
    const char *path;
    uint64_t file_bytes;
    uint64_t file_dev,
        file_ino; /* the inode the mapping keeps (a rename over the path is another) */
    int32_t n_vocab, n_ctx_train, n_embd, n_layer, n_head, n_head_kv, n_expert, n_expert_used;
    uint64_t n_params;
    uint64_t routed_expert_bytes, backbone_bytes;
    const char *backend;    /* backend in use: "cpu" or "cuda" */
    int n_threads;
};

struct sil_engine;

int sil_engine_open(struct sil_engine **out, const struct sil_engine_params *p, struct sil_error *err);
void sil_engine_close(struct sil_engine *e);
const struct sil_model_info *sil_engine_info(const struct sil_engine *e);

/* The backends this build has, for --version: "cpu, cuda (sm_75 ... compute_75)" or
 * "cpu (built without CUDA)". */
const char *sil_engine_backends(void);

/* The device a GPU backend runs on and the device memory it took (fixed after open), and the
 * expert-slot copy counters (any thread may read them while the engine runs). */
struct sil_engine_device {
    char name[128];
    int driver_version; /* 13000 for 13.0 */
    int cc_major, cc_minor;
    uint64_t weight_bytes, kv_bytes, scratch_bytes; /* by use; their sum is all it took */
    uint64_t budget_bytes;                          /* --vram-budget, 0: none */
    /* expert slots: host memory pinned for the copies (0: staged through a pinned ring), the
     * host-to-device bandwidth measured from it at open (GB/s, 0 when not measured), bytes
     * copied into slots and copies made since open */
    uint64_t context_bytes; /* in use at open (the context), counted in budget_bytes */
    uint64_t reserved_bytes; /* other engines' share of budget_bytes (vram_reserved) */
    uint64_t pinned_bytes;
    double h2d_gbs;
    uint64_t slot_bytes_in, slot_fills;
    /* decode misses are read in place from pinned host memory (miss path (b)), not copied;
     * the passes that ran so */
    bool zero_copy;
    uint64_t zero_copy_passes;
    /* miss path (c): at most cpu_misses of each decode layer's misses are computed on the CPU,
     * cpu_share of them (rounded; 0: the quota whatever their number), chosen from the host's
     * expert speed measured at open (host_gbs, 0 when not measured) against h2d_gbs; the
     * experts the CPU has computed so since open (a share that rounds to none of a layer's
     * misses computes none) */
    int32_t cpu_misses;
    double cpu_share, host_gbs;
    uint64_t cpu_experts;
    /* decode launches issued with a fusion since open (a graph's replays not counted): the
     * delta net's conv1d in the launch of its input's matvec set, attention's merge writing the
     * q8 of its output, a MoE's add + rmsnorm + q8 in its router */
    uint64_t fused_conv, fused_attn_q8, fused_norm_router;
    /* verification windows cut by running their kept rows' delta-net cores again on the
     * device (state_keep), not by evaluating those rows again */
    uint64_t cut_replays;
};
/* 0 with *d filled on a device backend; -ENODEV on the CPU. */
int sil_engine_device(const struct sil_engine *e, struct sil_engine_device *d);
/* The device memory the engine took (weights, KV, scratch; not the context), 0 on the CPU: what
 * a draft model opened first reserves of the served model's vram_budget (vram_reserved). */
uint64_t sil_engine_device_bytes(const struct sil_engine *e);
const struct sil_vocab *sil_engine_vocab(const struct sil_engine *e);
int32_t sil_engine_n_ctx(const struct sil_engine *e);
/* The most rows one evaluation takes (n_batch_max, or n_batch_tier with the host tier on). */
int32_t sil_engine_n_batch_max(const struct sil_engine *e);

/* Sequences. A sequence id is a small integer >= 0; -ENOSPC when n_seq_max are live. */
int sil_seq_create(struct sil_engine *e, struct sil_error *err);
void sil_seq_free(struct sil_engine *e, int seq);
int32_t sil_seq_len(const struct sil_engine *e, int seq); /* positions evaluated so far */
/* Drops positions >= n_pos. Attention KV can always be cut; recurrent (delta-net) state only
 * where a checkpoint exists at n_pos (n_pos == 0 always works): else -ENOTSUP. The cut restores
 * that checkpoint, drops those past it and gives the KV blocks past n_pos back to the pool. */
int sil_seq_truncate(struct sil_engine *e, int seq, int32_t n_pos, struct sil_error *err);
/* Recurrent-state checkpoint at the sequence's current length (conv + SSM state of every
 * delta-net layer), so a later sil_seq_truncate can cut back to here. At most max_keep per
 * sequence: the lowest positions go first (max_keep <= 0 drops them all). Take them between
 * evaluations where a later request may diverge (end of a prompt, end of a turn, every N blocks
 * of a long prompt). No-op on models without recurrent layers. -ENOMEM. */
int sil_seq_checkpoint(struct sil_engine *e, int seq, int max_keep, struct sil_error *err);
/* The highest position <= n_pos that sil_seq_truncate accepts: n_pos itself on attention-only
 * models, else the nearest checkpoint (0 when none). */
int32_t sil_seq_resume_pos(const struct sil_engine *e, int seq, int32_t n_pos);
int sil_seq_n_checkpoints(const struct sil_engine *e, int seq);
/* Speculative verification. sil_seq_spec_begin opens a window at the sequence's end; the rows
 * evaluated after it (a verify pass: draft tokens with the logits or argmax of every row, in
 * any batches) can then be taken back in part: sil_seq_spec_commit keeps positions [0, n_pos)
 * (window start <= n_pos <= length) and drops the rest, KV and recurrent state, so that the
 * logits that follow are bit-identical to those of a sequence that only ever evaluated the
 * kept rows. The commit closes the window; so do truncate, free and a begin on an open window
 * (which moves it to the end). A window holds at most sil_engine_n_batch_max rows (a row
 * beyond is -E2BIG). On models with recurrent layers, a commit that drops rows goes back to the
 * window's start and runs the delta-net cores again over the kept rows on their inputs as the
 * pass captured them (the CPU backend), or evaluates the kept rows again (state on a device, a
 * token tree, a window past 128 rows; engine.c says why); if that fails (-ENOBUFS, -EIO) the
 * sequence ends at the window's start, exact there. -EINVAL (no window, n_pos outside it),
 * -ENOMEM. */
int sil_seq_spec_begin(struct sil_engine *e, int seq, struct sil_error *err);
int sil_seq_spec_commit(struct sil_engine *e, int seq, int32_t n_pos, struct sil_error *err);
/* The same for a token tree's verification (sil_engine_eval_tree): keeps the window's rows
 * keep[0, n) (offsets from its start, rising; a path from the root) at the window's first n
 * positions and drops the rest at once, KV blocks back to the pool. The kept rows' KV rows move
 * to their places (their rope is their depth already), so the logits that follow are those of a
 * sequence that only ever evaluated the path, bit for bit on f32 KV (kv_cache.h's types keep
 * rows whole, so any KV type gives the same). Recurrent models evaluate the path again, as a
 * commit does. Errors as sil_seq_spec_commit. */
int sil_seq_spec_commit_path(struct sil_engine *e, int seq, const int32_t *keep, int32_t n,
                             struct sil_error *err);
/* Bytes of state (KV + recurrent + checkpoints + its verification window's buffers) the sequence
 * holds now. */
uint64_t sil_seq_memory(const struct sil_engine *e, int seq);

/* The automatic prefix cache (prefix_cache.h): full KV blocks published by one sequence are
 * attached by another whose tokens start the same way, across requests and sessions.
 * Attention-only models reuse any cached chain; models with recurrent layers only up to a
 * block boundary where a recurrent-state snapshot was kept, so the recurrence resumes exactly
 * where a cold run would be. Only the CPU backend's KV pool can be shared (elsewhere reuse
 * finds nothing). scope: chains published in one scope are found only in it (the daemon uses
 * the client's uid, so no user learns from a hit what another one's prompts held). */
/* Before evaluating a fresh sequence (length 0) whose prompt is tokens[0, n): attaches the
 * longest usable cached prefix (whole blocks, always leaving the last token to evaluate) and
 * restores the snapshot there; *n_reused = the sequence's length now (0 on a miss). Counts a
 * hit or a miss. On error the sequence is empty again. */
int sil_seq_prefix_reuse(struct sil_engine *e, int seq, uint64_t scope, const int32_t *tokens,
                         int32_t n, int32_t *n_reused, struct sil_error *err);
/* What sil_seq_prefix_reuse would reuse now for tokens[0, n) in scope (positions), without
 * attaching anything or counting. */
int32_t sil_seq_prefix_peek(struct sil_engine *e, uint64_t scope, const int32_t *tokens,
                            int32_t n);
/* After an evaluation: the sequence holds tokens[0, n) (n <= its length); its full blocks
 * become findable. snapshot: also keep the recurrent state at the sequence's end when that is a
 * block boundary and equals n (take it at the boundaries where later prompts may diverge: every
 * few blocks of a long prompt and the prompt's last full block). -ENOMEM (the blocks stay
 * published). */
int sil_seq_prefix_publish(struct sil_engine *e, int seq, uint64_t scope, const int32_t *tokens,
                           int32_t n, bool snapshot, struct sil_error *err);
/* Whether the model has recurrent layers (prefix hits need snapshots, sil_seq_prefix_publish). */
bool sil_engine_recurrent(const struct sil_engine *e);
/* Whether the backend's KV can be shared at all (the CPU's pool); else reuse finds nothing. */
bool sil_engine_prefix_shares(const struct sil_engine *e);
struct sil_prefix_stats {
    uint64_t hits, misses, tokens_reused;
    int32_t n_blocks;      /* blocks findable by hash now */
    uint64_t cached_bytes; /* of those, the ones no sequence holds: memory kept for later hits */
    int32_t n_snapshots;
    uint64_t snapshot_bytes;
};
void sil_engine_prefix_stats(struct sil_engine *e, struct sil_prefix_stats *out);

/* The KV pool: element type name, bytes of one position (every attention layer, K and V, as
 * stored: whole blocks are SIL_KV_BLOCK of them), blocks in the pool and free now. */
struct sil_kv_info {
    const char *type;
    uint64_t bytes_per_pos;
    int32_t block_positions, n_blocks, n_free;
};
void sil_engine_kv_info(const struct sil_engine *e, struct sil_kv_info *out);

/* One row per token. Rows of one sequence must be in position order and continue it
 * (pos == sil_seq_len at the first row of that sequence). */
struct sil_batch {
    int32_t n;
    const int32_t *token;
    const int32_t *pos;
    const int32_t *seq;
    const bool *want_logits; /* NULL = logits for the last row of each sequence only */
};

/* Evaluates the batch. Logits of the rows that want them are written to logits in row order,
 * n_vocab floats each (the caller sizes it: rows wanting logits x n_vocab). On error the
 * sequences in the batch are left as they were before the call, except after -EIO.
 * -ENOBUFS: the KV pool has no free block left for a sequence of the batch (a scheduler frees
 * or preempts a sequence and retries); -ENOSPC: a position beyond the context.
 * -EIO: the model file changed under the mapping (a read faulted: the file was truncated) or
 * sil_engine_mark_damaged was called; err names the file. The engine is then damaged for good:
 * every later evaluation fails the same way, and it is only fit for sil_engine_close. */
int sil_engine_eval(struct sil_engine *e, const struct sil_batch *b, float *logits, struct sil_error *err);
/* The same, and says which sequences failed: row_status (b->n entries, may be NULL) gets 0 or the
 * -errno that failed the row's sequence. On success all 0; on failure the rows of the sequences
 * that caused it (every row when the whole batch failed) are < 0, and a sequence whose rows are
 * all 0 may be evaluated again unchanged (e.g. after another sequence ran out of device memory). */
int sil_engine_eval_rows(struct sil_engine *e, const struct sil_batch *b, float *logits,
                         int *row_status, struct sil_error *err);
/* The same, where argmax (not NULL) gets for the k-th row wanting logits the token of its
 * largest logit (ties to the lower id, NaN never), found where the logits are: a device backend
 * then copies only the ids. logits may then be NULL (not written): a greedy pick without the
 * logits crossing to the host. */
int sil_engine_eval_out(struct sil_engine *e, const struct sil_batch *b, float *logits,
                        int32_t *argmax, int *row_status, struct sil_error *err);

/* Token trees (speculative verification of several drafts at once): sil_engine_eval_out where
 * parent[i] is -1 (row i follows its sequence as usual) or an earlier row of this batch and of
 * the same sequence, its parent in a tree. A tree's node takes the next free position (so a
 * tree's rows lie one after another) but attends only to the positions before the tree and to
 * its ancestors and itself, with rope at its depth (its parent's + 1), so its logits are those
 * of a sequence made of its path. A tree lies in the first 64 positions of its sequence's open
 * verification window (sil_seq_spec_begin) and is its last rows until sil_seq_spec_commit_path
 * keeps a path. On models with recurrent layers a row whose parent is not its sequence's row
 * before it starts a branch from the recurrent state after that parent (kept aside during the
 * pass, in a buffer of the sequence's size made at its first such tree and kept with its slot,
 * sil_seq_memory counts it), so its logits are still its path's, bit for bit; all of a
 * sequence's branches must start at one node (a root with chains below it), else -ENOTSUP. CPU
 * backend (sil_engine_has_tree), else -ENOTSUP; a parent that breaks these rules is -EINVAL. */
int sil_engine_eval_tree(struct sil_engine *e, const struct sil_batch *b, const int32_t *parent,
                         float *logits, int32_t *argmax, struct sil_error *err);
/* Whether sil_engine_eval_tree can run here. */
bool sil_engine_has_tree(const struct sil_engine *e);

/* MTP drafting: the next-token prediction layer some files carry (Qwen3.5's nextn layer,
 * forward_mtp.c has its math), on the CPU backend. Whether the engine can run it. */
bool sil_engine_has_mtp(const struct sil_engine *e);
/* sil_engine_eval_out (logits and/or greedy ids, one of them at least) that also writes, for
 * the k-th row wanting logits, the target's hidden state after its output norm to
 * hidden[k * n_embd, (k + 1) * n_embd): what the MTP layer reads. -ENOTSUP without the MTP
 * layer. */
int sil_engine_eval_hidden(struct sil_engine *e, const struct sil_batch *b, float *logits,
                           int32_t *argmax, float *hidden, struct sil_error *err);
/* The same with sil_engine_eval_out's row_status (may be NULL). */
int sil_engine_eval_hidden_rows(struct sil_engine *e, const struct sil_batch *b, float *logits,
                                int32_t *argmax, float *hidden, int *row_status,
                                struct sil_error *err);
/* The MTP layer for sequence seq, with a KV of its own (freed with the sequence), in its own
 * positions: those below pos0 are kept (pos0 <= what it holds), the rest dropped, and row i goes
 * at pos0 + i, reading hidden_in[i] (n_embd floats: the target's hidden state at some position
 * t, or the layer's own hidden_out of the row before) and token[i] (the token after t). Writes
 * the token it predicts after token[i] to argmax[i] and its hidden state to hidden_out[i]. On
 * error (-EINVAL, -ENOSPC, -ENOBUFS, -ENOMEM, -EIO) it holds the positions below pos0. */
int sil_seq_mtp_eval(struct sil_engine *e, int seq, int32_t n, const int32_t *token, int32_t pos0,
                     const float *hidden_in, int32_t *argmax, float *hidden_out,
                     struct sil_error *err);
/* The same with the layer's logits of every row to logits[i * n_vocab, (i + 1) * n_vocab) (a
 * sampled draft's distribution); logits or argmax may be NULL, not both. */
int sil_seq_mtp_eval_out(struct sil_engine *e, int seq, int32_t n, const int32_t *token,
                         int32_t pos0, const float *hidden_in, float *logits, int32_t *argmax,
                         float *hidden_out, struct sil_error *err);

/* fn (may be NULL) is called on the evaluating thread after each micro-batch of sil_engine_eval,
 * so a watchdog sees progress inside a long evaluation. */
void sil_engine_set_eval_progress(struct sil_engine *e, void (*fn)(void *user), void *user);

/* Any thread: stops a running sil_engine_eval at its next micro-batch and fails every later one
 * (-EIO), e.g. because the file is about to be written. */
void sil_engine_mark_damaged(struct sil_engine *e);
bool sil_engine_damaged(const struct sil_engine *e);

/* Work counters since open, for benchmarks: forward passes (ubatches), rows evaluated, and the
 * routed-expert weight bytes the MoE layers read (every expert a ubatch routed to, once per
 * layer: the union of the rows' experts). */
struct sil_engine_stats {
    uint64_t n_ubatch, n_rows, expert_bytes;
    uint64_t n_layered; /* of the micro-batches, those run layer by layer with others */
    /* MoE layers whose routing the host saw (each a layer of one micro-batch; on CUDA those
     * routed on the device are not counted): how many, and summed over them the distinct
     * experts (each read and multiplied once for all its rows) and the rows x top-k pairs */
    uint64_t moe_plans, moe_experts, moe_pairs;
    /* the simulated expert cache (sil_engine_params.ecache_sim_slots), zero without one */
    uint64_t ecache_hits, ecache_misses, ecache_evictions, ecache_bytes_streamed;
};
void sil_engine_stats(const struct sil_engine *e, struct sil_engine_stats *out);

/* Expert heat map and the simulated expert cache (sil_engine_params.heat_map and
 * ecache_sim_slots); engine thread only, like eval. */
struct sil_heat_map;
struct sil_ecache_stats;
/* Identity of the model for its heat map (sil_heat_model_id). */
uint64_t sil_engine_heat_model_id(const struct sil_engine *e);
/* The heat map's file name for this model (sil_heat_file_name): 0 or -ENAMETOOLONG. */
int sil_engine_heat_file_name(const struct sil_engine *e, char *out, size_t size);
/* The heat map now, with its shape, identity and the tokens it has seen (those imported plus
 * the rows evaluated since); out->heat is malloc'd (sil_heat_map_free). -ENODEV when the engine
 * keeps none, -ENOMEM. */
int sil_engine_heat_export(const struct sil_engine *e, struct sil_heat_map *out,
                           struct sil_error *err);
/* Replaces the heat map with m (a map loaded at start; the device cache's frequencies too):
 * -ENODEV when the engine keeps none,
 * -EINVAL when m is of another model or shape (err says which). */
int sil_engine_heat_import(struct sil_engine *e, const struct sil_heat_map *m,
                           struct sil_error *err);
/* A warm restart from the map at path (sil_heat_map_load): when it is of this model it replaces
 * the engine's (sil_engine_heat_import) and its hottest experts are placed in the expert cache,
 * each layer's pool until full, in steps that call progress(placed, of total) when it is not
 * NULL. 0 when loaded; -ENOENT when there is none (a cold start); another -errno when it cannot
 * be used (corrupt, another model's, out of memory: err says why; nothing changed). */
struct sil_heat_restore {
    int64_t hot;     /* experts with heat in the map */
    int64_t placed;  /* of which placed in the expert cache */
    int64_t placed_host; /* and of the rest, read into the host tier (expert_store.h) */
    uint64_t tokens; /* tokens the map had seen */
};
int sil_engine_heat_restore(struct sil_engine *e, const char *path,
                            void (*progress)(int64_t done, int64_t total, void *user), void *user,
                            struct sil_heat_restore *out, struct sil_error *err);
/* Saves the engine's heat map to path, atomically (sil_heat_map_save): 0 or -errno. */
int sil_engine_heat_save(const struct sil_engine *e, const char *path, struct sil_error *err);
/* The expert cache: the device's slots where the backend made them (the routed experts did not
 * fit), else the one simulated on the CPU. Its mode ("device", "simulated", NULL: none), slots
 * (0 without one) and policy name (NULL without one). */
const char *sil_engine_ecache_mode(const struct sil_engine *e);
int32_t sil_engine_ecache_slots(const struct sil_engine *e);
/* Slots of one layer's pool (the cache splits its slots over the layers); 0 without one. */
int32_t sil_engine_ecache_pool_slots(const struct sil_engine *e, int32_t layer);
const char *sil_engine_ecache_policy(const struct sil_engine *e);
/* How many misses of each decode plan the backend computes on the host (miss path (c),
 * SIL_CUDA_CPU_MISSES), 0 where it does not. */
int32_t sil_engine_ecache_host_misses(const struct sil_engine *e);
/* Places the experts keys[0..n) (layer * n_expert + expert, hottest first) in the expert cache
 * until it is full, without evicting (on the device each is copied into its slot): how many it
 * placed (already resident and full pools skipped), or -ENODEV without a cache. */
int64_t sil_engine_ecache_preload(struct sil_engine *e, const int32_t *keys, int64_t n);
/* The expert cache's counters of one layer (-1: all), zero without one. */
void sil_engine_ecache_layer_stats(const struct sil_engine *e, int32_t layer,
                                   struct sil_ecache_stats *out);

/* The routed experts' host tier (expert_store.h): on when the experts the backend reads from
 * the host did not fit the host budget. The budget and what chose it ("host_budget" when set,
 * else what sil_host_spare said: "MemAvailable" or "cgroup memory.max"), its slots, how the
 * file is read ("direct": O_DIRECT; "buffered" where the file system refuses it, each range
 * dropped from the page cache after its read), and counters since open: lookups that found
 * the expert in a host slot (hits), those read from the file (misses), bytes and reads from
 * the file, and the seconds reads were waited for. Any thread may read it while the engine
 * runs (the counters are atomics). min_bytes is known for any model with experts, tier on or
 * off. */
struct sil_engine_host_tier {
    bool on;
    /* on, holding every routed expert (read once at open): nothing is read from the file after,
     * and nothing is evicted (a device with expert slots whose experts fit the host budget) */
    bool full;
    uint64_t budget;
    uint64_t min_bytes; /* the smallest budget the tier takes (one layer's every expert) */
    char budget_from[48];
    int32_t n_slot;
    uint64_t slot_bytes;
    const char *io;
    uint64_t hits, misses, bytes_read, reads;
    double wait_s;
};
/* The one host budget and how it was shared out at open (hostmem.h: the order in which the
 * caches give way): the budget and what chose it, what is held whatever the plan (on the CPU,
 * the backbone and the KV pool), what each cache (enum sil_host_cache) wanted and got, and the
 * routed experts' share (all of them, or the host tier's budget when tier). The daemon holds its
 * idle sessions to cache[SIL_HOST_SESSIONS]. */
struct sil_engine_host_plan {
    uint64_t budget; /* 0: unknown */
    char budget_from[48];
    uint64_t fixed;
    uint64_t want[SIL_HOST_N_CACHE], cache[SIL_HOST_N_CACHE];
    uint64_t experts;
    bool tier, gave_way;
};
void sil_engine_host_plan(const struct sil_engine *e, struct sil_engine_host_plan *out);
/* 0 with *out filled; out->on false (and the budget chosen) when the tier is off. */
void sil_engine_host_tier(const struct sil_engine *e, struct sil_engine_host_tier *out);
/* Gives the host tier's memory back (engine thread, between evaluations): the engine goes on
 * reading its experts through the mapping, with the same logits. For a reload, which opens the
 * new engine beside this one: its tier then has the memory this one held. No-op without one. */
void sil_engine_host_tier_drop(struct sil_engine *e);

/* Validates a file as a loadable model without building an engine, and prints what
 * `siliceod --inspect` shows (architecture, hyperparameters, tensor count, type histogram,
 * total / routed-expert / backbone bytes, bytes per expert). Returns 0 or -errno with err set. */
int sil_model_inspect(const char *path, FILE *out, struct sil_error *err);

#endif
