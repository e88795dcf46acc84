/* Jobs and the scheduler step of the engine thread. sil_admit places queued jobs on sequences
 * (reusing a session's common prefix); sil_step evaluates one batch, a decode row for every
 * running sequence plus prompt chunks under the prefill budget, then samples, applies the
 * generation controls (genctl.h) and packs the streamed notifications; sil_job_finish packs the
 * final response.
 * On a session, recurrent-state checkpoints are taken where a later request may resume: a prompt
 * chunk ends at the request's resume point (the conversation before the generation prompt), and
 * at the end of the prompt and of the answer; admission cuts back to the nearest one.
 * The prefix cache (engine.h): a fresh sequence first attaches the longest cached prefix of its
 * prompt; evaluated blocks are published after each prompt chunk and when the request ends. On
 * hybrid models chunks also end every prefix_checkpoint_blocks blocks and at the prompt's last
 * full block, where a recurrent-state snapshot is kept for later hits.
 *
 * Order (schedpolicy.h): queued requests start, and prompts get the step's prefill budget, by
 * class, level and time waited (aging). Preemption by recompute: when a more urgent request
 * finds no room, or the engine reports a sequence it has no space for (row status -ENOBUFS, the
 * KV pool out of blocks, or -ENOMEM; the test hook kv_tokens fakes that), the least urgent
 * running request loses its
 * sequence and goes back to the queue with its tokens, sampler and output so far; when it starts
 * again the sequence is filled anew with prompt + evaluated answer + its pending token, and
 * decoding goes on from the last logits: nothing is streamed twice or lost.
 * A session's request keeps its session busy meanwhile (sequence -1); its refill takes the
 * session's checkpoints again at the resume point, and if it ends while preempted the session
 * goes (it holds no engine state).
 *
 * Ownership: a job owns its request (prompt, stop strings, chat messages), sampler, genctl state
 * and token vectors; sil_job_free frees them all. Engine thread only. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/log.h"
#include "daemon/testhooks.h"
#include "daemon/utf8.h"
#include "daemon/worker_impl.h"
#include "kernels/vec.h"
#include "siliceo-proto.h"

static int tokvec_push(struct tokvec *t, const int32_t *ids, size_t n)
{
    if (n == 0)
        return 0; /* t->p may still be NULL: NULL + 0 is undefined */
    if (sil_vec_reserve(&t->p, &t->cap, t->n + n, 64) < 0)
        return -ENOMEM;
    memcpy(t->p + t->n, ids, n * sizeof(*ids));
    t->n += n;
    return 0;
}

/* ---- jobs -------------------------------------------------------------------------------------- */

void sil_job_req_free(struct sil_job_req *r)
{
    if (!r)
        return;
    free(r->prompt);
    free(r->stop_buf);
    free(r->bias_buf);
    sil_chat_msgs_free(r->chat, r->n_chat);
    free(r);
}

void sil_job_free(struct sil_worker *w, struct job *j)
{
    atomic_fetch_sub(&w->n_jobs, 1);
    sil_job_spec_drop(w, j);
    free(j->oom);
    sil_sampler_free(j->smp);
    sil_sampler_free(j->dsmp);
    sil_genctl_free(j->gc);
    free(j->ctx.p);
    free(j->gen.p);
    free(j->replay.p);
    free(j->r.prompt);
    free(j->r.stop_buf);
    free(j->r.bias_buf);
    sil_chat_msgs_free(j->r.chat, j->r.n_chat);
    free(j);
}

/* A recurrent-state checkpoint where a later request on the job's session may resume (no-op on
 * attention-only models). Failing to take one only costs reuse later. */
static void job_checkpoint(struct sil_worker *w, struct job *j)
{
    struct sil_error err = { 0 };
    if (j->sess && j->seq >= 0 && sil_seq_checkpoint(w->e, j->seq, w->checkpoints, &err) < 0)
        sil_debug("session '%s': no checkpoint: %s", j->sess->name, err.msg);
}

/* Publishes the blocks the job's sequence holds (snapshot: and the recurrent state, at a block
 * boundary). Failing only costs later reuse. */
static void job_publish(struct sil_worker *w, struct job *j, bool snapshot)
{
    struct sil_error err = { 0 };
    if (w->prefix_cache && j->seq >= 0 &&
        sil_seq_prefix_publish(w->e, j->seq, j->r.uid, j->ctx.p, (int32_t)j->ctx.n, snapshot,
                               &err) < 0)
        sil_debug("request %u: prefix not published: %s", j->r.msgid, err.msg);
}

/* A fresh (empty) sequence: attaches the longest cached prefix of the prompt. */
static int job_prefix_reuse(struct sil_worker *w, struct job *j)
{
    if (!w->prefix_cache || sil_seq_len(w->e, j->seq) != 0)
        return 0;
    int32_t got = 0;
    struct sil_error err = { 0 };
    if (sil_seq_prefix_reuse(w->e, j->seq, j->r.uid, j->r.prompt, (int32_t)j->r.n_prompt, &got,
                             &err) < 0) {
        sil_debug("request %u: no prefix reuse: %s", j->r.msgid, err.msg);
        return 0;
    }
    if (got > 0) {
        w->local.prefix_hits++;
        w->local.prefix_tokens += (uint64_t)got;
    } else {
        w->local.prefix_misses++;
    }
    j->n_cached = j->n_done = (size_t)got;
    j->ctx.n = 0;
    return tokvec_push(&j->ctx, j->r.prompt, (size_t)got);
}

/* The next prompt position after n_done where a hybrid model keeps a prefix-cache snapshot:
 * every prefix_every positions and the prompt's last full block; 0 when none is left. */
static size_t snapshot_boundary(const struct sil_worker *w, const struct job *j, size_t span)
{
    if (!w->prefix_cache || !sil_engine_recurrent(w->e) || !sil_engine_prefix_shares(w->e) ||
        w->prefix_every <= 0)
        return 0;
    const size_t every = (size_t)w->prefix_every, last = j->r.n_prompt / 64 * 64;
    size_t next = (j->n_done / every + 1) * every;
    if (last > j->n_done && last < next)
        next = last;
    if (next > last)
        return 0;
    /* a long step (span > 0) ends at the farthest snapshot point within span tokens, the ones
     * before it not taken */
    while (span > 0) {
        size_t after = (next / every + 1) * every;
        if (last > next && last < after)
            after = last;
        if (after > last || after > j->n_done + span)
            break;
        next = after;
    }
    return next;
}

static void pack_token(struct sil_rpc_buf *b, uint32_t msgid, const struct sil_genctl_out *o,
                       const int32_t *ids, size_t n_ids)
{
    msgpack_packer *pk = sil_rpc_begin_notification(b, "token");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, o->n_reasoning ? 4 : 3);
    sil_rpc_kv_uint(pk, "id", msgid);
    /* Already valid UTF-8 (job_token sanitizes each piece); packing checks it again for free. */
    sil_utf8_pack_kv(pk, "text", o->answer, o->n_answer);
    if (o->n_reasoning)
        sil_utf8_pack_kv(pk, "reasoning", o->reasoning, o->n_reasoning);
    sil_rpc_pack_cstr(pk, "ids");
    msgpack_pack_array(pk, (uint32_t)n_ids);
    for (size_t i = 0; i < n_ids; i++)
        msgpack_pack_int32(pk, ids[i]);
    sil_rpc_end(b);
}

/* At most one "progress" notification a request in this many seconds, besides the one that
 * completes its prompt. */
#define PROGRESS_INTERVAL_S 0.25

static void pack_progress(struct sil_rpc_buf *b, const struct job *j, size_t n_evaluated)
{
    msgpack_packer *pk = sil_rpc_begin_notification(b, "progress");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 4);
    sil_rpc_kv_uint(pk, "id", j->r.msgid);
    sil_rpc_kv_uint(pk, "n_prompt", j->r.n_prompt);
    sil_rpc_kv_uint(pk, "n_cached", j->n_cached);
    sil_rpc_kv_uint(pk, "n_evaluated", n_evaluated);
    sil_rpc_end(b);
}

/* After a step that evaluated part of j's prompt: tells a client that asked how far it is, once
 * after the first chunk, then at most every PROGRESS_INTERVAL_S, and when the prompt is done
 * (before the first token). A replay after a preemption while decoding is no prompt to report,
 * and a prompt recomputed after one reports nothing until it passes what was already said. */
static void job_progress(struct sil_worker *w, struct job *j)
{
    if (!j->r.progress || j->conn_gone || j->cancelled || j->t_first || j->fill != j->r.prompt)
        return;
    const size_t total = j->r.n_prompt - j->n_cached;
    size_t done = j->n_done > j->n_cached ? j->n_done - j->n_cached : 0;
    if (done > total)
        done = total;
    const double now = now_s();
    if (done <= j->n_progress || (done < total && now - j->t_progress < PROGRESS_INTERVAL_S))
        return;
    pack_progress(&w->pk, j, done);
    if (sil_post(w, j->r.conn_id, j->r.msgid, false)) {
        j->t_progress = now;
        j->n_progress = done;
    }
}

static double ms(double a, double b) { return a > 0 && b >= a ? (b - a) * 1e3 : 0; }

/* Final response, the sequence back to its session (or freed), the job freed. */
void sil_job_finish(struct sil_worker *w, struct job *j, enum sil_stop_reason why, const char *errmsg)
{
    j->t_end = now_s();
    sil_job_spec_drop(w, j); /* the draft's sequence is free before the stats are published */
    struct sil_genctl_out tail = { 0 };
    int reason = why;
    if (j->gc) {
        /* Bytes the detokenizer still holds are a character that never completed: U+FFFD
         * (genctl drops it when a stop string or a sentence end cut the text before it). The
         * last text to stream is everything the totals gained from here on. */
        size_t a0, r0;
        sil_genctl_answer(j->gc, &a0);
        sil_genctl_reasoning(j->gc, &r0);
        char held[16], clean[3 * sizeof held];
        int n = sil_detok_flush(&j->dt, held, sizeof held);
        if (n > 0) {
            size_t len = sil_utf8_sanitize(held, (size_t)n, clean);
            struct sil_genctl_out o;
            sil_genctl_push_text(j->gc, clean, len, &o);
        }
        reason = sil_genctl_finish(j->gc, why, &tail);
        size_t na, nr;
        const char *a = sil_genctl_answer(j->gc, &na), *r = sil_genctl_reasoning(j->gc, &nr);
        if (!a)
            a = "";
        if (!r)
            r = "";
        tail = (struct sil_genctl_out){ a + a0, na - a0, r + r0, nr - r0 };
    }
    if (reason < 0)
        reason = SIL_STOP_ERROR;

    if (reason == SIL_STOP_CANCELLED)
        w->local.requests_cancelled++;
    if (reason == SIL_STOP_ERROR)
        w->local.requests_failed++;

    /* Status read right after the final response must not count this request as running. */
    sil_publish_stats(w);
    /* From reaching the scheduler to starting, or to the end for a request that never started. */
    double queue_ms = ms(j->t_submit, j->t_admit ? j->t_admit : j->t_end);
    /* One line a request, counts and times only: no prompt or answer text, no session name */
    sil_info("request %u of uid %u%s: %s, %zu prompt tokens (%zu cached), %zu generated, "
             "queue %.1f ms, prefill %.1f ms, decode %.1f ms%s",
             (unsigned)j->r.msgid, (unsigned)j->r.uid, j->r.session[0] ? " on a session" : "",
             sil_stop_reason_name(reason),
             j->r.n_prompt, j->n_cached, j->gen.n, queue_ms,
             j->t_first ? ms(j->t_admit, j->t_first) : 0.0,
             j->t_first ? ms(j->t_first, j->t_end) : 0.0, j->conn_gone ? ", client gone" : "");
    if (!j->conn_gone) {
        if (tail.n_answer || tail.n_reasoning)
            pack_token(&w->pk, j->r.msgid, &tail, NULL, 0);
        if (reason == SIL_STOP_ERROR && j->gen.n == 0) {
            sil_pack_error_clean(&w->pk, j->r.msgid, j->err_code ? j->err_code : SIL_RPC_E_INTERNAL,
                                 errmsg);
        } else if (reason == SIL_STOP_CANCELLED && !j->t_admit) {
            /* Cancelled while queued: error 8, as siliceo-rpc(7) gives it, with the real wait. */
            char msg[128];
            snprintf(msg, sizeof msg, "cancelled before it started, after %.1f ms in the queue", queue_ms);
            msgpack_packer *pk = sil_rpc_begin_error_response(&w->pk, j->r.msgid);
            msgpack_pack_map(pk, 3);
            sil_rpc_kv_int(pk, "code", SIL_RPC_E_CANCELLED);
            sil_rpc_kv_str(pk, "message", msg);
            sil_rpc_kv_double(pk, "queue_ms", queue_ms);
            sil_rpc_end_error_response(&w->pk);
        } else {
            size_t n_text = 0, n_reason = 0;
            const char *text = j->gc ? sil_genctl_answer(j->gc, &n_text) : "";
            const char *reasoning = j->gc ? sil_genctl_reasoning(j->gc, &n_reason) : "";
            double prefill = ms(j->t_admit, j->t_first), decode = ms(j->t_first, j->t_end);
            size_t n_eval = j->r.n_prompt - j->n_cached;
            msgpack_packer *pk = sil_rpc_begin_response(&w->pk, j->r.msgid);
            int n = 12 + (j->r.session[0] != 0) + (errmsg != NULL) + (j->r.chat != NULL);
            msgpack_pack_map(pk, n);
            sil_utf8_pack_kv(pk, "text", text, n_text);
            sil_utf8_pack_kv(pk, "reasoning", reasoning, n_reason);
            sil_rpc_pack_cstr(pk, "tokens");
            msgpack_pack_array(pk, (uint32_t)j->gen.n);
            for (size_t i = 0; i < j->gen.n; i++)
                msgpack_pack_int32(pk, j->gen.p[i]);
            sil_rpc_kv_uint(pk, "n_prompt", j->r.n_prompt);
            sil_rpc_kv_uint(pk, "n_cached", j->n_cached);
            sil_rpc_kv_uint(pk, "n_generated", j->gen.n);
            sil_rpc_kv_uint(pk, "n_preempted", (uint64_t)j->n_preempted);
            sil_rpc_kv_uint(pk, "n_reasoning", j->gc ? (uint64_t)sil_genctl_n_reasoning_tokens(j->gc) : 0);
            sil_rpc_kv_str(pk, "stop_reason", sil_stop_reason_name(reason));
            sil_rpc_kv_uint(pk, "seed", j->smp ? sil_sampler_seed(j->smp) : j->r.sampling.seed);
            const char *model = sil_engine_info(w->e)->name;
            sil_utf8_pack_kv(pk, "model", model, strlen(model)); /* GGUF metadata: any bytes */
            if (j->r.session[0])
                sil_utf8_pack_kv(pk, "session", j->r.session, strlen(j->r.session));
            if (errmsg)
                sil_utf8_pack_kv(pk, "error", errmsg, strlen(errmsg));
            if (j->r.chat) /* a chat on a session: the oldest messages its prompt left out */
                sil_rpc_kv_uint(pk, "dropped_messages", j->n_dropped);
            sil_rpc_pack_cstr(pk, "timings");
            msgpack_pack_map(pk, 6);
            sil_rpc_kv_double(pk, "queue_ms", queue_ms);
            sil_rpc_kv_double(pk, "prefill_ms", prefill);
            sil_rpc_kv_double(pk, "decode_ms", decode);
            sil_rpc_kv_double(pk, "time_to_first_token_ms", ms(j->t_submit, j->t_first));
            sil_rpc_kv_double(pk, "prefill_tok_s", prefill > 0 ? n_eval / (prefill * 1e-3) : 0);
            sil_rpc_kv_double(pk, "decode_tok_s",
                              decode > 0 && j->gen.n > 1 ? (j->gen.n - 1) / (decode * 1e-3) : 0);
            sil_rpc_end(&w->pk);
        }
        if (!sil_post(w, j->r.conn_id, j->r.msgid, true))
            sil_post_job_oom(w, j);
    } else {
        /* Nothing to send, but the loop still counts requests in flight per connection. */
        struct sil_outmsg *m = calloc(1, sizeof(*m));
        if (m) {
            m->conn_id = j->r.conn_id;
            m->msgid = j->r.msgid;
            m->final = true;
            sil_post_raw(w, m);
        } else {
            sil_post_job_oom(w, j);
        }
    }

    if (j->seq >= 0 && reason != SIL_STOP_ERROR)
        job_publish(w, j, false); /* the prompt and the answer, for later requests */
    if (j->seq >= 0) {
        w->space_cap = 0; /* engine space is given back: admission may try again */
        struct session *s = j->sess;
        bool keep = s && reason != SIL_STOP_ERROR && !s->drop_when_idle;
        if (keep) {
            job_checkpoint(w, j); /* a continuation of this answer resumes here */
            free(s->tokens);
            s->tokens = j->ctx.p;
            s->n_tokens = j->ctx.n;
            j->ctx.p = NULL;
            size_t na = 0, nr = 0;
            const char *a = j->gc ? sil_genctl_answer(j->gc, &na) : NULL;
            const char *r = j->gc ? sil_genctl_reasoning(j->gc, &nr) : NULL;
            sil_session_keep_transcript(w, s, j, a ? a : "", a ? na : 0, r ? r : "", r ? nr : 0);
            sil_session_save(w, s);
            s->last_used = now_s();
            s->busy = NULL;
            sil_session_to_front(w, s);
        } else if (s) {
            s->busy = NULL;
            sil_session_free(w, s);
        } else {
            sil_seq_free(w->e, j->seq);
        }
        j->seq = -1;
    } else if (j->sess) {
        /* Ended while preempted: the session has no engine state left to keep. */
        j->sess->busy = NULL;
        sil_session_free(w, j->sess);
        j->sess = NULL;
    }
    sil_debug("request %u done: %s, %zu prompt (%zu cached), %zu generated", j->r.msgid,
              sil_stop_reason_name(reason), j->r.n_prompt, j->n_cached, j->gen.n);
    sil_job_free(w, j);
}

void sil_list_remove(struct job **head, struct job *j)
{
    for (struct job **p = head; *p; p = &(*p)->next)
        if (*p == j) {
            *p = j->next;
            j->next = NULL;
            return;
        }
}

void sil_list_append(struct job **head, struct job *j)
{
    struct job **p = head;
    while (*p)
        p = &(*p)->next;
    j->next = NULL;
    *p = j;
}

/* Places the job's sequence: reuses its session's common prefix where it can. */
static int job_admit(struct sil_worker *w, struct job *j, struct sil_error *err)
{
    if (j->smp) {
        /* Resumed after a preemption: only a sequence is new (its session's, if it has one). */
        int seq = sil_seq_get(w, err);
        if (seq < 0)
            return seq;
        j->seq = seq;
        if (j->sess)
            j->sess->seq = seq;
        return 0;
    }
    struct session *s = NULL;
    /* A session no longer in memory whose transcript was saved: the conversation is rendered
     * from it and the engine state recomputed (prefix cache permitting). */
    struct session saved = { 0 };
    if (j->r.session[0]) {
        s = sil_session_find(w, j->r.uid, j->r.session);
        if (s && s->busy)
            return -EBUSY;
        if (!s && j->r.chat && j->r.append && w->max_sessions > 0)
            sil_session_restore(w, j->r.uid, j->r.session, &saved.log, &saved.n_log);
        snprintf(saved.name, sizeof saved.name, "%s", j->r.session);
    }
    j->t_admit = now_s();
    int rc0 = sil_session_chat_prompt(w, j, s ? s : saved.n_log ? &saved : NULL, err);
    if (rc0 < 0) {
        sil_chat_msgs_free(saved.log, saved.n_log);
        return rc0;
    }
    if (s) {
        size_t common = 0;
        while (common < s->n_tokens && common < j->r.n_prompt && s->tokens[common] == j->r.prompt[common])
            common++;
        if (common == j->r.n_prompt)
            common--; /* the last prompt token must be evaluated for its logits */
        if ((int32_t)common < sil_seq_len(w->e, s->seq)) {
            /* Recurrent state can only go back to a checkpoint: the nearest at or below. */
            common = (size_t)sil_seq_resume_pos(w->e, s->seq, (int32_t)common);
            int rc = sil_seq_truncate(w->e, s->seq, (int32_t)common, err);
            if (rc) {
                /* the engine state goes, the conversation stays with the session made anew */
                saved.log = s->log;
                saved.n_log = s->n_log;
                s->log = NULL;
                s->n_log = 0;
                sil_session_free(w, s);
                s = NULL;
            }
        }
        /* The prefix cache may resume nearer than the session's own checkpoints (a hybrid
         * model, a prompt that diverges long after the last one kept): start over from it. */
        if (s && w->prefix_cache &&
            sil_seq_prefix_peek(w->e, j->r.uid, j->r.prompt, (int32_t)j->r.n_prompt) >
                (int32_t)common &&
            sil_seq_truncate(w->e, s->seq, 0, err) == 0)
            common = 0;
        if (s) {
            j->seq = s->seq;
            j->n_cached = j->n_done = common;
            s->busy = j;
            if (tokvec_push(&j->ctx, j->r.prompt, common))
                return -ENOMEM;
            if (common == 0 && job_prefix_reuse(w, j)) /* nothing of its own: try the cache */
                return -ENOMEM;
        }
    }
    if (!s) {
        int seq = sil_seq_get(w, err);
        if (seq < 0) {
            sil_chat_msgs_free(saved.log, saved.n_log);
            return seq;
        }
        j->seq = seq;
        if (j->r.session[0] && w->max_sessions > 0) {
            s = calloc(1, sizeof(*s));
            if (!s) {
                sil_chat_msgs_free(saved.log, saved.n_log);
                return -ENOMEM;
            }
            snprintf(s->name, sizeof s->name, "%s", j->r.session);
            s->log = saved.log; /* the transcript it continues */
            s->n_log = saved.n_log;
            s->saved = saved.n_log > 0;
            saved.log = NULL;
            saved.n_log = 0;
            s->uid = j->r.uid;
            s->seq = seq;
            s->busy = j;
            s->last_used = now_s();
            s->next = w->sessions;
            if (w->sessions)
                w->sessions->prev = s;
            w->sessions = s;
            w->n_sessions++;
        }
        if (job_prefix_reuse(w, j))
            return -ENOMEM;
    }
    j->sess = s;
    struct sil_sampler *smp = sil_sampler_new(&j->r.sampling, w->n_vocab);
    if (!smp)
        return -ENOMEM;
    j->smp = smp;
    sil_detok_init(&j->dt, w->v, false);
    int rc = sil_genctl_new(&j->gc, &j->r.ctl);
    if (rc)
        return rc;
    j->fill = j->r.prompt; /* sil_session_chat_prompt may have rendered it anew */
    j->n_fill = j->r.n_prompt;
    w->local.tokens_cached += j->n_cached;
    return 0;
}

static struct sil_sched_item job_item(const struct job *j)
{
    return (struct sil_sched_item){ .cls = j->r.priority,
                                    .level = j->r.priority_level,
                                    .t_submit = j->t_submit,
                                    .arrival = j->arrival,
                                    .preemptible = !j->cancelled,
                                    .uid = j->r.uid,
                                    .client = j->r.conn_id };
}

/* The running jobs as policy items in w->s_items / s_jobs; returns how many. */
static int running_items(struct sil_worker *w)
{
    int n = 0;
    for (struct job *j = w->running; j && n < w->max_running; j = j->next) {
        w->s_items[n] = job_item(j);
        w->s_jobs[n++] = j;
    }
    return n;
}

/* Preemption by recompute: the sequence goes, the job back to the queue with what it has
 * (tokens, sampler, generation controls, streamed text). When it decodes, the replay holds the
 * tokens the sequence held plus the sampled token it had yet to evaluate. */
static void job_preempt(struct sil_worker *w, struct job *j, const char *why)
{
    sil_list_remove(&w->running, j);
    w->n_running--;
    if (j->ctx.n > j->n_evaluated)
        j->n_evaluated = j->ctx.n;
    if (j->decoding) {
        j->replay.n = 0;
        if (tokvec_push(&j->replay, j->ctx.p, j->ctx.n) ||
            tokvec_push(&j->replay, &j->pending, 1)) {
            sil_job_finish(w, j, SIL_STOP_ERROR, "out of memory");
            return;
        }
        j->fill = j->replay.p;
        j->n_fill = j->replay.n;
    }
    sil_job_spec_drop(w, j);
    sil_seq_free(w->e, j->seq);
    j->seq = -1;
    if (j->sess)
        j->sess->seq = -1; /* still busy with j: nothing else uses or drops it meanwhile */
    j->ctx.n = 0;
    j->n_done = 0;
    j->decoding = false;
    j->n_preempted++;
    w->local.preemptions++;
    sil_list_append(&w->queue, j);
    w->n_queued++;
    sil_info("request %u preempted (%s): %zu positions to recompute", j->r.msgid, why,
             j->n_fill);
}

/* Makes room for cand (NULL: for a sequence the engine had no space for). */
static bool preempt_for(struct sil_worker *w, const struct job *cand)
{
    int n = running_items(w);
    struct sil_sched_item ci;
    if (cand)
        ci = job_item(cand);
    else if (n < 2)
        return false; /* alone, it does not fit at all */
    int v = sil_sched_victim(&w->sp, w->s_items, n, cand ? &ci : NULL, now_s());
    if (v < 0)
        return false;
    job_preempt(w, w->s_jobs[v], cand ? "a more urgent request" : "out of engine space");
    return true;
}

/* Makes room for cand, of a user or client holding two slots fewer than another of its class. */
static bool preempt_fair(struct sil_worker *w, const struct job *cand)
{
    int n = running_items(w);
    const struct sil_sched_item ci = job_item(cand);
    int v = sil_sched_fair_victim(&w->sp, w->s_items, n, &ci, now_s());
    if (v < 0)
        return false;
    job_preempt(w, w->s_jobs[v], "a fair share for another client");
    return true;
}

void sil_admit(struct sil_worker *w)
{
    while (w->queue) {
        /* Most urgent first (schedpolicy.h): class after aging, then the user and the client
         * holding fewer slots, then level, time waited, arrival. */
        double now = now_s();
        const int nr = running_items(w);
        struct job *best = NULL;
        struct sil_sched_item bi = { 0 };
        struct sil_sched_share bs = { 0 };
        for (struct job *j = w->queue; j; j = j->next) {
            if (j->r.session[0]) {
                struct session *s = sil_session_find(w, j->r.uid, j->r.session);
                if (s && s->busy && s->busy != j) /* a preempted job keeps its session busy */
                    continue;
            }
            struct sil_sched_item it = job_item(j);
            struct sil_sched_share sh;
            sil_sched_share(w->s_items, nr, &it, &sh);
            if (!best || sil_sched_admit_before(&w->sp, &it, &sh, &bi, &bs, now)) {
                best = j;
                bi = it;
                bs = sh;
            }
        }
        if (!best)
            return;
        bool room = w->n_running < w->max_running && (!w->space_cap || w->n_running < w->space_cap);
        /* the slot a preemption frees is best's: the request preempted, back in the queue,
         * must not take it back first */
        if (!room && !preempt_for(w, best) && !preempt_fair(w, best))
            return;
        struct sil_error err = { 0 };
        int rc = job_admit(w, best, &err);
        if (rc == -ENOSPC && w->running) {
            if (preempt_for(w, best))
                continue;
            return; /* a running request will free a sequence */
        }
        sil_list_remove(&w->queue, best);
        w->n_queued--;
        if (rc) {
            char msg[600];
            snprintf(msg, sizeof msg, "cannot start the request: %s", err.msg[0] ? err.msg : strerror(-rc));
            sil_job_finish(w, best, SIL_STOP_ERROR, msg);
            continue;
        }
        sil_list_append(&w->running, best);
        w->n_running++;
    }
}

static void running_finish(struct sil_worker *w, struct job *j, enum sil_stop_reason why, const char *msg)
{
    sil_list_remove(&w->running, j);
    w->n_running--;
    sil_job_finish(w, j, why, msg);
}

/* Streams the text of one new token and applies the generation controls. false when the job
 * finished (it is freed). */
static bool job_token(struct sil_worker *w, struct job *j, int32_t id)
{
    if (!j->t_first)
        j->t_first = now_s();
    if (tokvec_push(&j->gen, &id, 1)) {
        running_finish(w, j, SIL_STOP_ERROR, "out of memory");
        return false;
    }
    w->local.tokens_generated++;
    if (sil_vocab_is_eog(w->v, id)) {
        /* Its id is streamed like every other token's, so the pieces' ids add up to `tokens`. */
        if (!j->conn_gone) {
            struct sil_genctl_out none = { 0 };
            pack_token(&w->pk, j->r.msgid, &none, &id, 1);
            sil_post(w, j->r.conn_id, j->r.msgid, false);
        }
        running_finish(w, j, SIL_STOP_EOS, NULL);
        return false;
    }
    /* The detokenizer gives whole characters (an incomplete one waits for the next token) but
     * passes invalid bytes on: those become U+FFFD here, before the generation controls, so stop
     * strings, the streamed pieces and the result text all see the text the client gets. */
    char piece[4096], clean[3 * sizeof piece];
    int n = sil_detok_push(&j->dt, id, piece, sizeof piece);
    if (n < 0)
        n = 0;
    const char *text = piece;
    size_t len = (size_t)n;
    if (!sil_utf8_valid(piece, len)) {
        len = sil_utf8_sanitize(piece, len, clean);
        text = clean;
    }
    /* A NUL byte (a byte token) adds nothing to the text: a client sends the answer back as a
     * chat message, where NUL is refused, and a session's transcript drops it too. */
    if (memchr(text, 0, len)) {
        size_t k = 0;
        for (size_t i = 0; i < len; i++)
            if (text[i]) clean[k++] = text[i];
        text = clean;
        len = k;
    }
    struct sil_genctl_out o;
    int rc = sil_genctl_push(j->gc, id, text, len, &o);
    if (!j->conn_gone) {
        pack_token(&w->pk, j->r.msgid, &o, &id, 1);
        sil_post(w, j->r.conn_id, j->r.msgid, false);
    }
    enum sil_stop_reason why = SIL_STOP_NONE;
    const char *msg = NULL;
    if (rc < 0) {
        why = SIL_STOP_ERROR;
        msg = "out of memory";
    } else if (rc != SIL_STOP_NONE) {
        why = rc;
    } else if ((int32_t)j->ctx.n + 1 >= w->n_ctx) {
        why = SIL_STOP_CONTEXT;
    }
    if (why != SIL_STOP_NONE) {
        running_finish(w, j, why, msg);
        return false;
    }
    j->pending = id;
    j->decoding = true;
    return true;
}

/* A failed evaluation fails the requests whose rows the engine marked (row_status), or every
 * request in the batch when it marked none; the others were left as they were and go on. */
static void eval_failed(struct sil_worker *w, int n, const char *why)
{
    bool any = false;
    for (int r = 0; r < n; r++)
        any |= w->b_status[r] < 0;
    char msg[700];
    snprintf(msg, sizeof msg, "evaluation failed: %s", why);
    for (struct job *j = w->running, *next; j; j = next) {
        next = j->next;
        bool hit = false;
        for (int r = 0; r < n && !hit; r++)
            hit = w->b_seq[r] == j->seq && (!any || w->b_status[r] < 0);
        if (hit) running_finish(w, j, SIL_STOP_ERROR, msg);
    }
}

/* The engine had no space for some sequence (paged KV out of blocks, device memory). */
static bool out_of_space(const struct sil_worker *w, int n, int rc)
{
    /* -ENOBUFS: the KV pool ran out (kv_cache.h); -ENOSPC there is a context overflow, which no
     * preemption cures */
    if (rc == -ENOBUFS)
        return true;
    for (int r = 0; r < n; r++)
        if (w->b_status[r] == -ENOBUFS || w->b_status[r] == -ENOMEM)
            return true;
    return false;
}


/* ---- speculative decoding ---------------------------------------------------------------------- */

/* Adaptive depth: the acceptance's moving average (weight of a step) below which the depth
 * shrinks by one, and above which it grows back by one, up to the request's. */
#define SPEC_ACC_ALPHA 0.3
#define SPEC_ACC_LOW 0.4
#define SPEC_ACC_HIGH 0.75
/* A request stops speculating when, after this many speculative steps, its tokens a second are
 * fewer than one-token decode steps give (1 / their measured time). */
#define SPEC_JUDGE_STEPS 8
/* While no one-token step has been timed, every this many steps of a speculating request is a
 * plain one, so there is a figure to judge by. */
#define SPEC_PROBE_EVERY 8

void sil_job_spec_drop(struct sil_worker *w, struct job *j)
{
    if (!j->spec)
        return;
    sil_spec_free(j->spec);
    free(j->spec);
    j->spec = NULL;
    j->mtp_fed = false;
    if (w->draft && j->dseq >= 0) {
        sil_seq_free(w->draft, j->dseq);
        w->draft_seqs--;
    }
    j->dseq = -1;
}

void sil_spec_check(struct sil_worker *w)
{
    w->spec_ok = false;
    w->spec_width_ok = 1;
    if (w->spec_mtp && w->e) {
        /* the MTP layer of each model served; one without it decodes plainly */
        w->spec_ok = sil_engine_has_mtp(w->e);
        if (!w->spec_ok)
            sil_notice("speculative decoding off for %s: no MTP layer (or not on the %s backend)",
                       sil_engine_info(w->e)->path, sil_engine_info(w->e)->backend);
        return;
    }
    if (!w->draft || !w->e)
        return;
    struct sil_error err = { 0 };
    if (sil_spec_vocab_check(sil_engine_vocab(w->e), sil_engine_vocab(w->draft), &err) < 0) {
        sil_notice("speculative decoding off for %s: %s", sil_engine_info(w->e)->path, err.msg);
        return;
    }
    w->spec_ok = true;
    /* a model loaded by name that cannot verify trees drafts chains (the one served at start
     * was checked by the server) */
    if (w->spec_width > 1 && !sil_engine_has_tree(w->e))
        sil_notice("token trees off for %s: the %s backend verifies chains only (1x%d)",
                   sil_engine_info(w->e)->path, sil_engine_info(w->e)->backend, w->spec_depth);
    else
        w->spec_width_ok = w->spec_width;
}

/* The depth the job drafts at most: its own, else the daemon's; 0 when it does not speculate. */
static int32_t job_spec_max(const struct sil_worker *w, const struct job *j)
{
    if (!w->spec_ok || j->r.spec < 0)
        return 0;
    return j->r.spec > 0 ? j->r.spec : w->spec_depth;
}

/* The width of the job's trees at most: the model's, narrowed so that 1 + width x depth rows
 * fit a tree and a batch (a request's own depth may be deeper than the daemon's). */
static int32_t job_spec_wmax(const struct sil_worker *w, const struct job *j)
{
    int32_t wd = w->spec_width_ok;
    while (wd > 1 && (1 + wd * j->spec_max > SIL_SPEC_TREE_ROWS ||
                      1 + wd * j->spec_max > sil_engine_n_batch_max(w->e)))
        wd--;
    return wd;
}

/* Tokens a step of j may emit (the verified chain and the target's own token after it), within
 * its depth and the thinking budget: genctl forces think-close when reasoning reaches
 * max_thinking_tokens, and a chain must end right before that point for the forced token to
 * come where plain decoding puts it. Stop strings, EOS and the answer budget end the request
 * at a token, after which nothing more of the chain is used. */
static int32_t job_spec_out(const struct job *j)
{
    int32_t out = j->spec_depth + 1;
    const struct sil_genctl_params *c = &j->r.ctl;
    if (c->max_thinking_tokens >= 0 && c->think_close >= 0) {
        const int32_t left = sil_genctl_in_reasoning(j->gc)
                                 ? c->max_thinking_tokens - sil_genctl_n_reasoning_tokens(j->gc)
                                 : c->max_thinking_tokens + 1; /* think-open, then the budget */
        if (left < out)
            out = left < 1 ? 1 : left;
    }
    return out;
}

/* After a speculative step: the acceptance's moving average moves the tree, and after
 * SPEC_JUDGE_STEPS steps a request whose speculative tokens a second fall below what one-token
 * steps give stops speculating. A tree's acceptance is the share of one branch's drafts
 * accepted (width rows drafted at each depth, one path kept). Low, the width shrinks first (a
 * narrower tree costs fewer rows for the same depth), then the depth; high, the depth grows back
 * first, then the width. */
static void job_spec_adapt(struct sil_worker *w, struct job *j, int32_t drafted, int32_t accepted,
                           int32_t width)
{
    if (drafted > 0) {
        double a = (double)accepted * width / drafted;
        if (a > 1)
            a = 1;
        j->spec_acc = j->spec_steps == 1 ? a : (1 - SPEC_ACC_ALPHA) * j->spec_acc + SPEC_ACC_ALPHA * a;
        if (j->spec_acc < SPEC_ACC_LOW && j->spec_width > 1)
            j->spec_width--;
        else if (j->spec_acc < SPEC_ACC_LOW && j->spec_depth > 1)
            j->spec_depth--;
        else if (j->spec_acc > SPEC_ACC_HIGH && j->spec_depth < j->spec_max)
            j->spec_depth++;
        else if (j->spec_acc > SPEC_ACC_HIGH && j->spec_width < j->spec_wmax)
            j->spec_width++;
    }
    const double t_one = w->cost.t_dec[1];
    if (j->spec_steps >= SPEC_JUDGE_STEPS && t_one > 0 && j->spec_s > 0 &&
        (double)j->spec_emitted / j->spec_s < 1.0 / t_one) {
        j->spec_stopped = true;
        w->local.spec_stopped++;
        sil_info("request %u: speculation stopped, %.1f tokens/s against %.1f plain "
                 "(acceptance %.0f%%, tree %dx%d)",
                 j->r.msgid, j->spec_emitted / j->spec_s, 1.0 / t_one, 100 * j->spec_acc,
                 j->spec_width, j->spec_depth);
        sil_job_spec_drop(w, j);
    }
}

/* One speculative step for a decoding job: the draft proposes, the target verifies, and the
 * tokens that come out are streamed as plain decoding streams them. Returns true when the job's
 * token(s) of this step were produced so (it may have finished: do not touch j then), false
 * when it decodes plainly this step (nothing changed). */
static bool job_spec_step(struct sil_worker *w, struct job *j)
{
    struct sil_error err = { 0 };
    if (!sil_sampler_plain_greedy(j->smp) && !j->dsmp) {
        struct sil_sampler_params dp = j->r.sampling;
        dp.seed = sil_sampler_seed(j->smp) ^ 0x9e3779b97f4a7c15ull;
        if (!dp.seed)
            dp.seed = 1;
        if (!(j->dsmp = sil_sampler_new(&dp, w->n_vocab)))
            return false;
    }
    if (!j->spec && w->spec_mtp) {
        /* the model's MTP layer drafts, in the request's own sequence */
        j->spec = calloc(1, sizeof(*j->spec));
        if (!j->spec || sil_spec_init_mtp(j->spec, w->e, j->seq, j->spec_max, &err) < 0) {
            sil_info("request %u: speculation off: %s", j->r.msgid, j->spec ? err.msg : "out of memory");
            free(j->spec);
            j->spec = NULL;
            j->spec_stopped = true;
            return false;
        }
    }
    if (!j->spec) {
        int dseq = sil_seq_create(w->draft, &err);
        if (dseq < 0) {
            sil_debug("request %u: no draft sequence: %s", j->r.msgid, err.msg);
            return false;
        }
        w->draft_seqs++;
        j->dseq = dseq;
        j->spec = calloc(1, sizeof(*j->spec));
        if (!j->spec || sil_spec_init(j->spec, w->e, j->seq, w->draft, dseq, j->spec_max, &err) < 0) {
            sil_info("request %u: speculation off: %s", j->r.msgid, j->spec ? err.msg : "out of memory");
            free(j->spec);
            j->spec = NULL;
            sil_seq_free(w->draft, dseq);
            w->draft_seqs--;
            j->dseq = -1;
            j->spec_stopped = true;
            return false;
        }
    }
    /* hist: what the sequence holds and the pending token, one array (room made, n unchanged) */
    if (tokvec_push(&j->ctx, &j->pending, 1))
        return false;
    j->ctx.n--;
    int32_t out[SIL_SPEC_DEPTH_MAX + 1];
    struct sil_spec *sp = j->spec;
    if (sp->width != j->spec_width) {
        /* its buffers made for the deepest tree the job may draft */
        sp->depth = j->spec_max;
        if (sil_spec_set_width(sp, j->spec_width, &err) < 0) {
            sil_info("request %u: chains instead of trees: %s", j->r.msgid, err.msg);
            j->spec_wmax = j->spec_width = 1;
            sil_spec_set_width(sp, 1, &err);
        }
    }
    sp->depth = j->spec_depth;
    /* greedy steps verify the tree, sampled ones a chain (spec.h) */
    const int32_t width = sil_sampler_plain_greedy(j->smp) ? sp->width : 1;
    const struct sil_spec_stats before = sp->stats;
    const double t0 = now_s();
    /* plain greedy: the argmax of every row, no logits to the host; else speculative sampling
     * with the request's sampler settings on both models */
    const int k = sil_sampler_plain_greedy(j->smp)
                      ? sil_spec_step(sp, j->ctx.p, (int32_t)j->ctx.n + 1, job_spec_out(j), out, &err)
                      : sil_spec_step_sampled(sp, j->ctx.p, (int32_t)j->ctx.n + 1, job_spec_out(j),
                                              j->smp, j->dsmp, out, &err);
    const double dt = now_s() - t0;
    w->local.eval_seconds += dt;
    if (k < 0) {
        /* both sequences are as they were: plain decoding from here on */
        sil_info("request %u: speculation off after a failed step: %s", j->r.msgid, err.msg);
        j->spec_stopped = true;
        sil_job_spec_drop(w, j);
        return false;
    }
    const int32_t drafted = (int32_t)(sp->stats.drafted - before.drafted),
                  accepted = (int32_t)(sp->stats.accepted - before.accepted);
    w->local.spec_steps++;
    w->local.spec_drafted += (uint64_t)drafted;
    w->local.spec_accepted += (uint64_t)accepted;
    w->local.spec_emitted += (uint64_t)k;
    w->local.spec_draft_s += sp->stats.draft_s - before.draft_s;
    w->local.spec_verify_s += sp->stats.verify_s - before.verify_s;
    w->local.spec_commit_s += sp->stats.commit_s - before.commit_s;
    w->local.spec_moe_layers += sp->stats.moe_layers - before.moe_layers;
    w->local.spec_expert_union += sp->stats.expert_union - before.expert_union;
    w->local.spec_expert_pairs += sp->stats.expert_pairs - before.expert_pairs;
    j->spec_steps++;
    j->spec_emitted += (uint64_t)k;
    j->spec_s += dt;
    /* each token as a decode row would give it: the one before it joins the context */
    for (int i = 0; i < k; i++) {
        if (tokvec_push(&j->ctx, &j->pending, 1)) {
            running_finish(w, j, SIL_STOP_ERROR, "out of memory");
            return true;
        }
        if (!job_token(w, j, out[i]))
            return true;
    }
    job_spec_adapt(w, j, drafted, accepted, width);
    return true;
}

/* The speculative steps of this scheduler step, for the decoding jobs that speculate: none when
 * more than SIL_SPEC_MAX_ROWS requests decode. Marks the jobs it served (spec_ran). */
static void spec_steps(struct sil_worker *w)
{
    if (!w->spec_ok)
        return;
    int n_dec = 0;
    for (struct job *j = w->running; j; j = j->next)
        n_dec += j->decoding && !j->cancelled;
    for (struct job *j = w->running, *next; j; j = next) {
        next = j->next;
        j->spec_ran = false;
        if (!j->decoding || j->cancelled || j->spec_stopped)
            continue;
        if (!j->spec_max) {
            j->spec_max = job_spec_max(w, j);
            j->spec_depth = j->spec_max;
            j->spec_wmax = j->spec_width =
                sil_sampler_plain_greedy(j->smp) ? job_spec_wmax(w, j) : 1;
            if (!j->spec_max)
                j->spec_stopped = true; /* never speculates */
        }
        if (j->spec_stopped)
            continue;
        if (n_dec > SIL_SPEC_MAX_ROWS) {
            w->local.spec_batch_skips++;
            continue;
        }
        /* a forced token goes as a decode row */
        if (sil_genctl_forced(j->gc) >= 0)
            continue;
        /* the first decode step, and a probe now and then while no one-token step is timed,
         * go plainly */
        j->spec_dec_steps++;
        if (j->spec_dec_steps == 1 ||
            (w->cost.t_dec[1] <= 0 && j->spec_dec_steps % SPEC_PROBE_EVERY == 0))
            continue;
        j->spec_ran = true;
        if (!job_spec_step(w, j))
            j->spec_ran = false;
    }
}

/* MTP drafting that reads the prompt, as the layer was trained to: a greedy request whose
 * sequence holds nothing yet gets its drafter at its first prompt chunk, and each of its rows a
 * step evaluates is fed to the layer (sil_spec_mtp_feed). Those rows want the engine's argmax
 * and hidden state, so a step feeds only when every pick in it is greedy (no logits buffer
 * holds a prompt's rows); a request that meets another kind of step, or a prefix restored from
 * the cache, drafts from its first speculative step on, without the positions before. */
static bool job_mtp_feeds(struct sil_worker *w, struct job *j)
{
    return w->spec_ok && w->spec_mtp && !j->spec && !j->decoding && !j->spec_stopped &&
           j->seq >= 0 && sil_seq_len(w->e, j->seq) == 0 && job_spec_max(w, j) > 0 &&
           sil_sampler_plain_greedy(j->smp);
}

static void job_mtp_start(struct sil_worker *w, struct job *j)
{
    struct sil_error err = { 0 };
    j->spec = calloc(1, sizeof(*j->spec));
    if (!j->spec || sil_spec_init_mtp(j->spec, w->e, j->seq, job_spec_max(w, j), &err) < 0) {
        free(j->spec);
        j->spec = NULL; /* made at its first speculative step, as without feeding */
        return;
    }
    j->mtp_fed = true;
}

/* Whether this step may feed MTP layers: every running request picks greedily, and the hidden
 * states of a full batch have room. */
static bool step_feeds_mtp(struct sil_worker *w)
{
    if (!w->spec_ok || !w->spec_mtp || !w->e)
        return false;
    for (struct job *g = w->running; g; g = g->next)
        if (!sil_sampler_plain_greedy(g->smp))
            return false;
    const size_t need = (size_t)w->n_batch_max * (size_t)sil_engine_info(w->e)->n_embd;
    if (w->b_hidden_cap < need) {
        float *h = realloc(w->b_hidden, need * sizeof(float));
        if (!h)
            return false;
        w->b_hidden = h;
        w->b_hidden_cap = need;
    }
    return true;
}

/* One scheduler step: the speculative steps (spec_steps), then a decode row for every other
 * decoding request and prompt chunks under the prefill budget, given out by priority
 * (schedpolicy.h). */
void sil_step(struct sil_worker *w)
{
    int n = 0, n_logits = 0, n_dec = 0;
    int dec_cls = SIL_PRIO_BATCH + 1, pre_cls = SIL_PRIO_BATCH + 1; /* most urgent of each */
    spec_steps(w);
    const bool feed_ok = step_feeds_mtp(w);
    bool feeding = false;
    for (struct job *j = w->running; j; j = j->next) {
        if (j->mtp_fed && !feed_ok)
            sil_job_spec_drop(w, j); /* its rows of this step would not be fed */
        feeding = feeding || (j->mtp_fed && j->decoding && !j->spec_ran);
    }
    for (struct job *j = w->running; j; j = j->next) {
        j->logit_row = -1;
        if (j->decoding && !j->spec_ran && n < w->n_batch_max) {
            if (j->r.priority < dec_cls)
                dec_cls = j->r.priority;
            w->b_tok[n] = j->pending;
            w->b_pos[n] = (int32_t)j->ctx.n;
            w->b_seq[n] = j->seq;
            w->b_want[n] = true;
            j->logit_row = n_logits++;
            n++;
            n_dec++;
        }
    }
    /* with the host tier and nothing generating, a long step: each layer's missing experts are
     * read from the file once for all of its prompt tokens */
    const bool long_step = w->tier && n_dec == 0 && w->host_prefill_chunk > w->prefill_chunk;
    const int32_t chunk = long_step ? w->host_prefill_chunk : w->prefill_chunk;
    const int32_t eng_max = sil_engine_n_batch_max(w->e);
    const int32_t rows_max = eng_max < w->n_batch_max ? eng_max : w->n_batch_max;
    int np = 0;
    for (struct job *j = w->running; j && np < w->max_running; j = j->next) {
        if (j->decoding)
            continue;
        size_t take = j->n_fill - j->n_done;
        /* A chunk ends at the resume point so its checkpoint can be taken there. */
        if (j->sess && j->r.resume > 0 && j->n_done < (size_t)j->r.resume)
            take = (size_t)j->r.resume - j->n_done;
        /* ... and at the next prefix-cache snapshot. */
        const size_t snap = snapshot_boundary(w, j, long_step ? (size_t)chunk : 0);
        j->snap_at = snap;
        if (snap > j->n_done && snap - j->n_done < take)
            take = snap - j->n_done;
        if (j->r.priority < pre_cls)
            pre_cls = j->r.priority;
        w->s_items[np] = job_item(j);
        w->s_items[np].want = take > INT32_MAX ? INT32_MAX : (int32_t)take;
        w->s_jobs[np++] = j;
    }
    int32_t timed =
        sil_sched_prefill_cap(&w->cost, w->prefill_stretch, w->prefill_budget, dec_cls, pre_cls,
                              n_dec);
    int32_t budget = sil_sched_prefill_budget(n_dec, timed, chunk, rows_max - n);
    sil_sched_order_fair(&w->sp, w->s_items, np, now_s(), w->s_idx);
    sil_sched_split(w->s_items, w->s_idx, np, budget, w->s_take);
    for (int i = 0; i < np; i++) {
        int k = w->s_idx[i];
        struct job *j = w->s_jobs[k];
        size_t take = (size_t)w->s_take[k];
        if (take == 0)
            continue;
        if (feed_ok && job_mtp_feeds(w, j))
            job_mtp_start(w, j);
        const bool feed = j->mtp_fed; /* every row wants its argmax and hidden state */
        feeding = feeding || feed;
        for (size_t t = 0; t < take; t++) {
            w->b_tok[n] = j->fill[j->n_done + t];
            w->b_pos[n] = (int32_t)(j->ctx.n + t);
            w->b_seq[n] = j->seq;
            w->b_want[n] = feed;
            n_logits += feed;
            n++;
        }
        if (j->n_done + take == j->n_fill) {
            if (!feed) {
                w->b_want[n - 1] = true;
                n_logits++;
            }
            j->logit_row = n_logits - 1;
        }
    }
    if (n == 0)
        return;

    struct sil_batch batch = { .n = n, .token = w->b_tok, .pos = w->b_pos, .seq = w->b_seq, .want_logits = w->b_want };
    struct sil_error err = { 0 };
    /* every pick of this step greedy: the engine's argmax, and no logits cross to the host */
    bool greedy = n_logits > 0;
    for (struct job *g = w->running; g && greedy; g = g->next)
        if (g->logit_row >= 0)
            greedy = sil_genctl_forced(g->gc) >= 0 || sil_sampler_plain_greedy(g->smp);
    sil_test_stall(w);
    double t0 = now_s();
    /* a feeding step is greedy (step_feeds_mtp) */
    int rc = sil_test_kv_full(w, n, &err) ? -ENOBUFS
             : feeding && greedy
                 ? sil_engine_eval_hidden_rows(w->e, &batch, NULL, w->b_pick, w->b_hidden,
                                               w->b_status, &err)
                 : sil_engine_eval_out(w->e, &batch, greedy ? NULL : w->logits,
                                       greedy ? w->b_pick : NULL, w->b_status, &err);
    double dt = now_s() - t0;
    w->local.eval_seconds += dt;
    w->local.steps++;
    if (rc == 0)
        sil_sched_cost_update(&w->cost, n_dec, n - n_dec, dt, w->prefill_stretch,
                              w->prefill_budget);
    if (rc) {
        w->local.eval_errors++;
        if (rc == -EIO) {
            sil_err("evaluation failed (%d rows): %s", n, err.msg);
            sil_model_damaged(w, err.msg); /* fails every request, with what to do */
            return;
        }
        /* Out of space: the least urgent request makes room and is recomputed later; the
         * others were left as they were and go again next step. */
        if (out_of_space(w, n, rc) && preempt_for(w, NULL)) {
            w->space_cap = w->n_running;
            sil_debug("evaluation out of space (%d rows): %s", n, err.msg);
            return;
        }
        sil_err("evaluation failed (%d rows): %s", n, err.msg);
        eval_failed(w, n, err.msg);
        return;
    }

    /* Account for what was evaluated, row by row, before anything finishes. */
    const size_t E = w->e ? (size_t)sil_engine_info(w->e)->n_embd : 0;
    for (int r = 0, want0 = 0; r < n;) {
        struct job *j = NULL;
        for (struct job *k = w->running; k; k = k->next)
            if (k->seq == w->b_seq[r]) {
                j = k;
                break;
            }
        int start = r;
        while (r < n && w->b_seq[r] == w->b_seq[start])
            r++;
        const int hrow = want0; /* the first of these rows' hidden states, when they wanted */
        for (int q = start; q < r; q++)
            want0 += w->b_want[q];
        if (!j)
            continue;
        int cnt = r - start;
        if (j->mtp_fed && feeding && greedy && hrow + cnt <= want0) {
            struct sil_error ferr = { 0 };
            if (sil_spec_mtp_feed(j->spec, w->b_tok + start, cnt, w->b_hidden + (size_t)hrow * E,
                                  &ferr) < 0) {
                sil_debug("request %u: its MTP layer goes on without the prompt: %s", j->r.msgid,
                          ferr.msg);
                sil_job_spec_drop(w, j);
            }
        }
        if (tokvec_push(&j->ctx, w->b_tok + start, cnt)) {
            j->cancelled = true; /* finished below with what it has */
            continue;
        }
        if (!j->decoding) {
            const size_t snap = j->snap_at;
            /* Positions the sequence held before a preemption are recomputed; a replay's pending
             * token is an answer token, neither. */
            size_t first = j->ctx.n - (size_t)cnt, redo = 0;
            if (first < j->n_evaluated)
                redo = j->n_evaluated - first < (size_t)cnt ? j->n_evaluated - first : (size_t)cnt;
            w->local.tokens_recomputed += redo;
            if (j->fill == j->r.prompt)
                w->local.tokens_prompt += (size_t)cnt - redo;
            j->n_done += cnt;
            if (j->n_done == j->n_fill || (j->r.resume > 0 && j->n_done == (size_t)j->r.resume))
                job_checkpoint(w, j);
            if (w->prefix_cache && (j->n_done / 64 > (j->n_done - cnt) / 64 || j->n_done == snap))
                job_publish(w, j, j->n_done == snap);
            job_progress(w, j);
        }
    }

    struct job *j = w->running;
    while (j) {
        struct job *next = j->next;
        if (j->logit_row >= 0 && !j->cancelled) {
            const float *lg = w->logits + (size_t)j->logit_row * w->n_vocab;
            int32_t forced = sil_genctl_forced(j->gc);
            int32_t id = forced >= 0 ? forced
                         : greedy    ? w->b_pick[j->logit_row]
                                     : sil_sampler_sample(j->smp, lg, j->ctx.p, j->ctx.n);
            job_token(w, j, id);
        }
        j = next;
    }
}
