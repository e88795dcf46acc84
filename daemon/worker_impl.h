/* Private to the engine thread's files (worker.c, session.c, scheduler.c): the worker, job and
 * session structs and the functions they share. Everything here runs on the engine thread
 * unless a field says "under mu" (worker.c's queues) or is atomic.
 *
 * Ownership: the worker owns its jobs (queue and running lists) and its sessions (an LRU list);
 * a running job that uses a session holds it through sess / busy until sil_job_finish gives
 * the sequence back. Outbox messages are malloc'd by sil_post and freed by the event loop. */
#ifndef SIL_DAEMON_WORKER_IMPL_H
#define SIL_DAEMON_WORKER_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "daemon/engine/spec.h"
#include "daemon/schedpolicy.h"
#include "daemon/sessfile.h"
#include "daemon/worker.h"
#include "siliceo-proto.h"

struct session {
    struct session *prev, *next; /* most recently used first */
    char name[SIL_SESSION_NAME_MAX];
    uint32_t uid; /* owner: another uid's same name is another session */
    int seq;
    int32_t *tokens; /* what the sequence holds */
    size_t n_tokens;
    uint64_t memory; /* engine state (KV, recurrent state, checkpoints) + transcript */
    struct sil_chat_msg *log; /* chat transcript (strings malloc'd), NULL after a generate */
    size_t n_log;
    double last_used;
    struct job *busy;
    bool drop_when_idle;
    bool saved; /* the transcript as it is now is in the state directory (or nothing to save) */
};

struct tokvec {
    int32_t *p;
    size_t n, cap;
};

struct job {
    struct job *next;
    struct sil_job_req r;
    uint64_t arrival;
    int seq;
    struct session *sess;
    bool cancelled, conn_gone, decoding;
    /* What the sequence is filled with before decoding: the prompt, or after a preemption while
     * decoding the replay (the tokens the dropped sequence held plus the pending one, so the fill's
     * last logits give the next token as a decode row would have). */
    const int32_t *fill;
    size_t n_fill;
    size_t n_done;   /* fill tokens in the sequence */
    size_t snap_at;  /* the prefix-cache snapshot point this step's chunk may end at (0: none) */
    size_t n_cached; /* of which reused (from the session or the prefix cache) */
    int32_t pending; /* sampled token to evaluate next */
    struct tokvec ctx; /* tokens in the sequence, in order */
    struct tokvec gen; /* generated tokens */
    struct tokvec replay;
    int n_preempted;
    size_t n_evaluated; /* most positions its sequence ever held: rows below are recomputed */
    struct sil_sampler *smp;
    struct sil_genctl *gc;
    struct sil_detok dt;
    double t_submit, t_admit, t_first, t_end;
    /* The last "progress" notification (r.progress): when, and the prompt tokens evaluated it
     * reported (never fewer in a later one, a preempted prompt's recompute included). */
    double t_progress;
    size_t n_progress;
    int logit_row;
    int err_code; /* protocol error code of a failed final response; 0 = internal error */
    /* A chat on a session that no longer fit: the messages of its conversation (the transcript,
     * then the request's) from drop_at on that its prompt leaves out, n_dropped of them. */
    size_t drop_at, n_dropped;
    /* Its final response when memory runs out: allocated with the job, so the loop always learns
     * the request ended (the client gets error 10, not silence). NULL once used. */
    struct sil_outmsg *oom;
    /* Speculative decoding (scheduler.c): the chain state with the draft's sequence (NULL until
     * its first speculative step, dropped with the target's sequence), the depth it may draft
     * (its own or the daemon's) and the one it drafts now (adaptive), the same for the width of
     * its token trees (1: chains), its acceptance as a moving average, its counters, and
     * whether it stopped (speculation did not pay). */
    struct sil_spec *spec;
    int dseq;
    /* the draft's draws: the request's settings, a seed of its own; made at the first sampled
     * speculative step, kept while speculation stops and resumes, freed with the job */
    struct sil_sampler *dsmp;
    int32_t spec_max, spec_depth;
    int32_t spec_wmax, spec_width;
    double spec_acc;
    uint64_t spec_steps, spec_emitted, spec_dec_steps;
    double spec_s;
    bool spec_stopped;
    bool spec_ran; /* this step's token came from a speculative step */
    /* spec's MTP layer has every position the sequence holds but the last, whose hidden state
     * waits in spec: each row of the job a step evaluates is fed to it (sil_spec_mtp_feed) */
    bool mtp_fed;
};

enum in_type { IN_SUBMIT, IN_CANCEL, IN_CONN_CLOSED, IN_SESS_LIST, IN_SESS_DROP, IN_DAMAGED, IN_RELOAD,
              IN_UNLOAD };

/* What a reload opens (IN_RELOAD): the engine parameters with their strings. */
struct reload {
    struct sil_engine_params p;
    char *path, *backend;
};

struct inmsg {
    struct inmsg *next;
    enum in_type type;
    uint64_t conn_id;
    uint32_t msgid;
    struct job *job; /* IN_SUBMIT: prepared by the loop thread */
    struct reload *reload;
    struct sil_engine *engine; /* IN_DAMAGED: the engine whose file changed */
    char name[SIL_SESSION_NAME_MAX];
    uint32_t uid; /* session operations: the caller's uid */
    bool all;     /* sessions.list by the daemon's owner */
};

struct sil_worker {
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int efd;
    /* Under mu. */
    struct inmsg *in_head, *in_tail;
    struct sil_outmsg *out_head, *out_tail;
    bool stop;
    struct sil_worker_stats stats;
    struct sil_ecache_stats *ec_layers; /* [ec_n], the simulated cache per layer */
    int32_t ec_n;
    /* Liveness for the watchdog, read by the loop without the lock: the time the engine thread
     * last went round its loop, and whether it is blocked waiting for work (then an old
     * heartbeat is no sign of a hang). */
    atomic_int_least64_t heartbeat_ns;
    atomic_bool idle;
    atomic_int n_jobs; /* generation requests submitted and not yet freed (max_queue) */
    uint64_t session_memory_limit;
    int max_sessions_limit;
    /* Engine thread only. */
    struct sil_engine *e;
    /* The draft model (NULL: none) or, with spec_mtp, e's own MTP layer drafting; whether
     * speculation can run for e (the draft's vocabulary is e's, or e has an MTP layer), the
     * depth requests get by default, the width of the trees (spec_tree; 1: chains) and the one
     * e takes (1 where it cannot verify trees), and the draft's live sequences. */
    struct sil_engine *draft;
    bool spec_mtp;
    bool spec_ok;
    int32_t spec_depth;
    int32_t spec_width, spec_width_ok;
    int32_t draft_seqs;
    const struct sil_vocab *v;
    int32_t n_vocab, n_ctx;
    int max_running, prefill_chunk, prefill_budget, n_batch_max;
    /* the host tier is on: with nothing generating a step takes host_prefill_chunk prompt
     * tokens (each layer's missing experts read once for all of them) */
    bool tier;
    int host_prefill_chunk;
    struct sil_sched_params sp;
    struct sil_sched_cost cost; /* learnt from the steps: the prefill budget by time */
    double prefill_stretch;
    /* After the engine ran out of space: no more sequences than this until one finishes (0 =
     * no such limit), so a preempted request does not come straight back to fail again. */
    int space_cap;
    /* Per step, max_running entries each: the running jobs as policy items. */
    struct sil_sched_item *s_items;
    struct job **s_jobs;
    int *s_idx;
    int32_t *s_take;
    uint64_t session_memory;
    int max_sessions;
    int checkpoints; /* recurrent-state checkpoints per session */
    bool prefix_cache;
    int32_t prefix_every; /* positions between prefix-cache snapshots (hybrid models) */
    struct job *queue, *running;
    int n_running, n_queued;
    struct session *sessions;
    int n_sessions;
    struct sil_sessstore store; /* transcripts kept in the state directory (sessfile.h) */
    uint64_t arrivals;
    int32_t *b_tok, *b_pos, *b_seq;
    bool *b_want;
    int *b_status; /* per row, from sil_engine_eval */
    int32_t *b_pick; /* per logits row: the engine's argmax, in a step where every pick is greedy */
    float *b_hidden; /* per logits row: the hidden state the MTP layer reads (steps that feed it) */
    size_t b_hidden_cap; /* floats */
    float *logits;
    /* The model: damaged once its file changed (no evaluation reads the mapping after that), and
     * a reload waiting for the running requests to end. */
    bool damaged;
    struct reload *reload;
    bool unload; /* keep_alive: give the engine back once nothing runs (e is NULL after) */
    int test_stall_ms, test_ubatch_ms; /* SILICEOD_TEST_HOOKS */
    int test_kv_tokens; /* test hook: the engine holds this many positions in all, then -ENOSPC */
    struct sil_worker_stats local;
    struct sil_heatkeep *heat; /* NULL: no heat map saved */
    struct sil_ecache_stats *ec_local; /* [ec_cap] */
    int32_t ec_cap;
    /* Messages of this loop iteration, handed to the event loop together (one wake-up per step
     * instead of one per token), and the buffer they are packed in (no allocation per token). */
    struct sil_outmsg *pend_head, *pend_tail;
    struct sil_rpc_buf pk;
};

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* worker.c: the outbox (messages handed to the event loop when the step ends) and statistics. */
void sil_post_raw(struct sil_worker *w, struct sil_outmsg *m);
/* Moves what the packing buffer holds into a new pending message; false (buffer emptied, error
 * logged) when there is no memory for it. */
bool sil_post(struct sil_worker *w, uint64_t conn_id, uint32_t msgid, bool final);
/* A job's final response failed to post: its preallocated error 10 (or, for a connection that is
 * gone, an empty final message) goes instead. */
void sil_post_job_oom(struct sil_worker *w, struct job *j);
/* An error response whose message passes the UTF-8 sanitizer (engine errors quote paths and
 * metadata: any bytes). */
void sil_pack_error_clean(struct sil_rpc_buf *b, uint32_t msgid, int code, const char *msg);
void sil_publish_stats(struct sil_worker *w);
/* The model file changed (why names it): every request fails with what to do, sessions go, the
 * loop is told (SIL_WORKER_EV_DAMAGED), and nothing reads the mapping any more. */
void sil_model_damaged(struct sil_worker *w, const char *why);

/* session.c: named sessions and the sequences they hold. */
struct session *sil_session_find(struct sil_worker *w, uint32_t uid, const char *name);
void sil_session_to_front(struct sil_worker *w, struct session *s);
void sil_session_free(struct sil_worker *w, struct session *s);
/* Drops idle sessions from the least recently used end while over the limits. */
void sil_sessions_enforce(struct sil_worker *w);
/* A sequence for a new request: evicts the least recently used idle session when all are taken. */
int sil_seq_get(struct sil_worker *w, struct sil_error *err);
bool sil_session_in_use(struct sil_worker *w, uint32_t uid, const char *name);
/* A chat job on a session: with append, the prompt becomes the transcript of s (may be NULL)
 * plus the job's messages; the resume point is the conversation's end before the generation
 * prompt. A conversation that leaves too little room for the answer loses its oldest turns
 * (the system message stays; j->drop_at, j->n_dropped say which). -E2BIG (err set,
 * j->err_code SIL_RPC_E_CONTEXT_FULL) when even its last turn does not fit the context. */
int sil_session_chat_prompt(struct sil_worker *w, struct job *j, const struct session *s,
                            struct sil_error *err);
/* Saves s's transcript in the state directory (removes its file when it has none); a failure is
 * a warning and leaves s unsaved, to be tried again at its next change and at shutdown. */
void sil_session_save(struct sil_worker *w, struct session *s);
/* The saved transcript of (uid, name), for a session that is not in memory: 0 (*log, *n_log
 * malloc'd), -ENOENT when none is saved; a bad file is a warning and -ENOENT. */
int sil_session_restore(struct sil_worker *w, uint32_t uid, const char *name, struct sil_chat_msg **log,
                        size_t *n_log);
/* After a chat job on s: the transcript becomes (append ? the old one : nothing) + the job's
 * messages (moved) + the answer, less the turns its prompt left out (j->n_dropped); after any
 * other job it is cleared. Updates s->memory. */
void sil_session_keep_transcript(struct sil_worker *w, struct session *s, struct job *j,
                                 const char *answer, size_t n_answer, const char *reasoning,
                                 size_t n_reasoning);

/* scheduler.c: jobs and the scheduler step. */
void sil_job_free(struct sil_worker *w, struct job *j);
/* Final response, the sequence back to its session (or freed), the job freed. */
void sil_job_finish(struct sil_worker *w, struct job *j, enum sil_stop_reason why, const char *errmsg);
void sil_list_remove(struct job **head, struct job *j);
void sil_list_append(struct job **head, struct job *j);
/* Moves queued jobs to running while sequences and max_running allow. */
void sil_admit(struct sil_worker *w);
/* One scheduler step: speculative steps for the requests that speculate, decode rows for every
 * other decoding request, then prompt chunks. */
void sil_step(struct sil_worker *w);
/* The job's speculative state and draft sequence go (its target sequence is left alone). */
void sil_job_spec_drop(struct sil_worker *w, struct job *j);
/* Whether w->draft, or with spec_mtp w->e's MTP layer, can draft for w->e (logs why not); sets
 * w->spec_ok. */
void sil_spec_check(struct sil_worker *w);

#endif
