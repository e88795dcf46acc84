/* The engine thread: owns the engine, the running requests and the sessions, and runs the
 * scheduler. Each step evaluates one batch: a decode row for every running sequence plus prompt
 * chunks under a token budget, then samples, applies the generation controls (genctl.h) and packs
 * the streamed notifications and final responses.
 *
 * The event loop talks to it through an inbox (submit, cancel, session operations, shutdown) and
 * reads back packed messages from an outbox; an eventfd wakes the loop when output is ready.
 * Messages name connections by id, never by pointer, so a connection may go away at any time.
 *
 * Ownership: sil_worker_submit takes the job (freed by the worker); outbox messages are taken by
 * sil_worker_take_output and freed by the caller with free(). */
#ifndef SIL_DAEMON_WORKER_H
#define SIL_DAEMON_WORKER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/config.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/expert_cache.h"
#include "daemon/genctl.h"

#define SIL_SESSION_NAME_MAX 128
#define SIL_LOGIT_BIAS_MAX 1024 /* entries in a request's logit_bias */

/* Speculation is skipped in a step with more decoding requests than this. Each speculating
 * request verifies its chain in a batch of its own (depth + 1 rows) beside the shared decode
 * step, so k of them cost k passes over the weights where plain decoding costs one shared pass;
 * and a shared pass amortizes well: on the 35B MoE shape (H100) one decode row takes 2.52 ms and
 * eight 6.86 ms, 0.86 ms a row. Past about four rows the shared step already gives what a chain
 * would, and separate verify passes only add weight reads. */
#define SIL_SPEC_MAX_ROWS 4

enum sil_priority { SIL_PRIO_INTERACTIVE = 0, SIL_PRIO_NORMAL = 1, SIL_PRIO_BATCH = 2 };

/* A generate or chat request, prepared by the loop (prompt tokenized, params checked). */
struct sil_job_req {
    uint64_t conn_id;
    uint32_t msgid;
    int32_t *prompt; /* malloc'd, owned by the job */
    size_t n_prompt;
    struct sil_sampler_params sampling; /* logit_bias points into bias_buf */
    struct sil_logit_bias *bias_buf;    /* malloc'd, owned by the job */
    struct sil_genctl_params ctl; /* stop strings point into stop_buf */
    const char *stop_ptrs[SIL_GENCTL_MAX_STOP];
    char *stop_buf;               /* malloc'd, owned by the job */
    char session[SIL_SESSION_NAME_MAX]; /* "" = none */
    uint32_t uid; /* the peer's: sessions are keyed by (uid, name) */
    /* Prompt position where a later request may diverge (a recurrent-state checkpoint is taken
     * there); 0 = none. Chat requests on a session get the end of the conversation. */
    int32_t resume;
    /* A chat request on a session: its messages (each string malloc'd, owned by the job), kept
     * as the session's transcript with the answer; with append the prompt is rendered at
     * admission from the transcript plus these. */
    struct sil_chat_msg *chat;
    size_t n_chat;
    bool think, append;
    bool progress;      /* send "progress" notifications while the prompt is evaluated */
    int priority;       /* enum sil_priority: the class */
    int priority_level; /* within the class, SIL_PRIO_LEVEL_MIN..MAX (schedpolicy.h), lower first */
    /* Speculative decoding: 0 the daemon's (spec_tree, when a draft model is set), -1 none, else
     * the tokens to draft a step (1..SIL_CONFIG_SPEC_DEPTH_MAX) */
    int32_t spec;
};

/* Figures the loop reports in status / metrics (a consistent snapshot). */
struct sil_worker_stats {
    int running, queued, sessions;
    uint64_t session_bytes, state_bytes;
    uint64_t requests_total, requests_failed, requests_cancelled;
    uint64_t tokens_prompt, tokens_cached, tokens_generated;
    /* The prefix cache: fresh sequences that reused a cached prefix or found none, the tokens
     * reused; blocks findable now, recurrent-state snapshots and their bytes. */
    bool prefix_enabled;
    uint64_t prefix_hits, prefix_misses, prefix_tokens;
    int32_t prefix_blocks, prefix_checkpoints;
    uint64_t prefix_checkpoint_bytes, prefix_cached_bytes;
    uint64_t steps, eval_errors;
    uint64_t preemptions, tokens_recomputed; /* sequences preempted, rows evaluated again */
    double eval_seconds;
    /* The expert cache (sil_engine_ecache_mode: the device's slots or one simulated on the
     * CPU): its slots (0: none), policy and counters since start. */
    int32_t ecache_slots;
    const char *ecache_mode, *ecache_policy;
    struct sil_ecache_stats ecache;
    /* Speculative decoding with the model in use (reset when another is loaded): whether a
     * draft model serves it, speculative steps, drafts proposed and accepted, tokens they
     * emitted, and the seconds of their drafting, verify passes and commits; one-token decode
     * steps timed for comparison (t_one: their mean seconds, 0 = none yet); requests that
     * stopped speculating because it did not pay, and request steps decoded plainly because the
     * batch was large. The draft's live sequences and its KV pool (blocks, free). The width of
     * the trees greedy requests draft with it (spec_tree's, or 1 where it verifies chains only). */
    bool spec_on;
    int32_t spec_width;
    uint64_t spec_steps, spec_drafted, spec_accepted, spec_emitted;
    double spec_draft_s, spec_verify_s, spec_commit_s, spec_t_one;
    uint64_t spec_stopped, spec_batch_skips;
    /* the verify passes' MoE layers, and summed over them the union of their rows' experts and
     * rows x top-k (struct sil_spec_stats) */
    uint64_t spec_moe_layers, spec_expert_union, spec_expert_pairs;
    int32_t draft_seqs, draft_kv_blocks, draft_kv_free;
};

/* Outbox messages that are news about the model rather than bytes for a client. */
enum sil_worker_event {
    SIL_WORKER_EV_NONE,
    SIL_WORKER_EV_DAMAGED,       /* data: why (NUL-terminated); the mapping is no longer read */
    SIL_WORKER_EV_RELOADED,      /* engine: the new one, in use; old_engine: the loop closes it */
    SIL_WORKER_EV_RELOAD_FAILED, /* data: why; the model in use stays */
    SIL_WORKER_EV_UNLOADED,      /* old_engine: the loop closes it; no model is loaded now */
};

struct sil_outmsg {
    struct sil_outmsg *next;
    uint64_t conn_id;
    uint32_t msgid;
    bool final;   /* the request's last message: the connection has one request less in flight */
    bool stopped; /* the worker thread has ended (shutdown done); no bytes */
    enum sil_worker_event event;
    struct sil_engine *engine, *old_engine;
    size_t len;
    char data[];  /* one or more packed msgpack-RPC messages */
};

struct sil_worker;

/* Starts the thread. e may be NULL: no model is loaded until sil_worker_reload. The engine is used by the worker thread only from now on; the loop may
 * still read the vocab and info (immutable). The thread saves the expert heat map through heat
 * (may be NULL) periodically, at shutdown and around a reload, and loads it into a reloaded
 * engine. */
struct sil_heatkeep;
/* draft (may be NULL): the draft model of speculative decoding, used by the worker thread only
 * from now on and closed by the caller after sil_worker_free; it drafts for every model whose
 * vocabulary it shares. */
int sil_worker_start(struct sil_worker **out, struct sil_engine *e, struct sil_engine *draft,
                     const struct sil_config *cfg, struct sil_heatkeep *heat,
                     struct sil_error *err);
/* Joins the thread (after sil_worker_shutdown and the stopped message) and frees everything. */
void sil_worker_free(struct sil_worker *w);
int sil_worker_eventfd(const struct sil_worker *w);
/* Liveness of the engine thread, for the watchdog (any thread): true while it waits for work or
 * made progress (went round its loop, or finished a micro-batch of an evaluation) within
 * max_age_usec. *age_s (may be NULL): seconds
 * since it last did, 0 when idle. */
bool sil_worker_alive(struct sil_worker *w, uint64_t max_age_usec, double *age_s);

/* Takes the job, or returns -ENOMEM and leaves it to the caller. */
int sil_worker_submit(struct sil_worker *w, struct sil_job_req *job);
void sil_job_req_free(struct sil_job_req *job);
/* Frees n messages whose strings are each malloc'd, and the array. */
void sil_chat_msgs_free(struct sil_chat_msg *m, size_t n);
/* Generation requests submitted and not yet finished (any thread): what max_queue limits. */
int sil_worker_jobs(struct sil_worker *w);
/* Cancels request msgid of a connection: a running one ends with stop_reason "cancelled", a
 * queued one with error 8. -ENOMEM when the message could not be made. */
int sil_worker_cancel(struct sil_worker *w, uint64_t conn_id, uint32_t msgid);
/* The connection is gone: its requests stop and free their memory, nothing is sent. The message
 * is allocated when the connection opens (sil_worker_close_msg_new), so closing needs no memory;
 * sil_worker_conn_closed takes it, else sil_worker_close_msg_free frees it. */
struct inmsg;
struct inmsg *sil_worker_close_msg_new(void);
void sil_worker_close_msg_free(struct inmsg *m);
void sil_worker_conn_closed(struct sil_worker *w, uint64_t conn_id, struct inmsg *m);
/* Answered by the worker through the outbox (a final response to msgid); -ENOMEM when the
 * message could not be made. Sessions belong to the uid that made them: the list shows uid's
 * own, or every session when all is set (the daemon's owner); drop removes (uid, name) only. */
int sil_worker_sessions_list(struct sil_worker *w, uint64_t conn_id, uint32_t msgid, uint32_t uid,
                             bool all);
int sil_worker_session_drop(struct sil_worker *w, uint64_t conn_id, uint32_t msgid, uint32_t uid,
                            const char *name);
/* Every request gets a final response with stop_reason "shutdown", then the thread ends and posts
 * a message with stopped set. */
void sil_worker_shutdown(struct sil_worker *w);
/* The model file is about to change or changed (the loop's file watch): as a fault would, it
 * fails every request and posts SIL_WORKER_EV_DAMAGED once nothing reads the mapping. The
 * engine's running evaluation stops at its next micro-batch. */
void sil_worker_model_damaged(struct sil_worker *w, struct sil_engine *e);
/* Loads the model p names on the engine thread once the running requests are done (queued ones
 * fail: they were tokenized for the old model), drops the sessions and posts RELOADED with both
 * engines, or RELOAD_FAILED. p's strings are copied. */
int sil_worker_reload(struct sil_worker *w, const struct sil_engine_params *p); /* 0 or -ENOMEM */
/* keep_alive: once no request runs or waits, saves the sessions and the heat map, drops the
 * sessions and posts UNLOADED with the engine; the worker holds no model until the next reload
 * (which, from no model, loads without failing anything). */
void sil_worker_unload(struct sil_worker *w);
/* Live settings (SIGHUP): session limits. */
void sil_worker_set_limits(struct sil_worker *w, uint64_t session_memory, int max_sessions);

/* Takes every pending output message (a list, oldest first) and clears the eventfd. */
struct sil_outmsg *sil_worker_take_output(struct sil_worker *w);
void sil_worker_stats(struct sil_worker *w, struct sil_worker_stats *st);
/* The expert cache's counters per layer, out[0..n) for n = min(max, layers): n, 0 when there is
 * none. */
int32_t sil_worker_ecache_layers(struct sil_worker *w, struct sil_ecache_stats *out, int32_t max);

#endif
