/* Named sessions of the engine thread: an LRU list of sequences kept after their request ends,
 * with the tokens each holds so a later request reuses the common prefix. Sessions are dropped
 * from the least recently used end when over session_memory / max_sessions, or when a new
 * request needs a sequence and none is free.
 *
 * A chat session also keeps its transcript (the messages and answers so far), so a chat
 * request with append continues the conversation without resending it. A conversation that
 * leaves too little room in the context for the answer loses its oldest turns (the system
 * message stays); the transcript, and so its saved file, keeps only what the model was given.
 *
 * A session is keyed by (uid, name): requests of one uid never see, reuse or drop another's.
 *
 * A chat transcript is also saved in the state directory (sessfile.h) each time it changes, so
 * a session dropped from memory (LRU, a reload, a restart) keeps its conversation: its first
 * request after that renders the saved transcript again and the engine state is recomputed
 * (from the prefix cache where it still holds the blocks).
 *
 * Ownership: the worker owns every session; sil_session_free frees the sequence and the
 * tokens. A session busy with a job is never dropped. Engine thread only. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/worker_impl.h"

struct session *sil_session_find(struct sil_worker *w, uint32_t uid, const char *name)
{
    for (struct session *s = w->sessions; s; s = s->next)
        if (s->uid == uid && strcmp(s->name, name) == 0)
            return s;
    return NULL;
}

static void session_unlink(struct sil_worker *w, struct session *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        w->sessions = s->next;
    if (s->next)
        s->next->prev = s->prev;
    s->prev = s->next = NULL;
}

void sil_session_to_front(struct sil_worker *w, struct session *s)
{
    session_unlink(w, s);
    s->next = w->sessions;
    if (w->sessions)
        w->sessions->prev = s;
    w->sessions = s;
}

void sil_session_free(struct sil_worker *w, struct session *s)
{
    session_unlink(w, s);
    if (s->seq >= 0)
        sil_seq_free(w->e, s->seq);
    free(s->tokens);
    sil_chat_msgs_free(s->log, s->n_log);
    free(s);
    w->n_sessions--;
}

/* Drops idle sessions from the least recently used end while over the limits. */
void sil_sessions_enforce(struct sil_worker *w)
{
    uint64_t total = 0;
    struct session *tail = NULL;
    for (struct session *s = w->sessions; s; s = s->next) {
        total += s->memory;
        tail = s;
    }
    for (struct session *s = tail; s;) {
        struct session *prev = s->prev;
        if (!s->busy && (total > w->session_memory || w->n_sessions > w->max_sessions)) {
            sil_debug("session '%s' dropped (LRU; %llu bytes)", s->name, (unsigned long long)s->memory);
            total -= s->memory;
            sil_session_free(w, s);
        }
        s = prev;
    }
}

/* A sequence for a new request: evicts the least recently used idle session when all are taken. */
int sil_seq_get(struct sil_worker *w, struct sil_error *err)
{
    for (;;) {
        int seq = sil_seq_create(w->e, err);
        if (seq != -ENOSPC)
            return seq;
        struct session *victim = NULL;
        for (struct session *s = w->sessions; s; s = s->next)
            if (!s->busy)
                victim = s;
        if (!victim)
            return -ENOSPC;
        sil_debug("session '%s' dropped to free a sequence", victim->name);
        sil_session_free(w, victim);
    }
}

bool sil_session_in_use(struct sil_worker *w, uint32_t uid, const char *name)
{
    for (int pass = 0; pass < 2; pass++)
        for (struct job *j = pass ? w->running : w->queue; j; j = j->next)
            if (j->r.uid == uid && strcmp(j->r.session, name) == 0)
                return true;
    return false;
}

_Static_assert(SIL_SESSFILE_NAME_MAX == SIL_SESSION_NAME_MAX - 1, "a session name fits a file");

void sil_session_save(struct sil_worker *w, struct session *s)
{
    s->saved = true;
    if (!sil_sessstore_on(&w->store))
        return;
    if (s->n_log == 0) {
        sil_sessstore_remove(&w->store, s->uid, s->name);
        return;
    }
    struct sil_error err = { 0 };
    if (sil_sessstore_save(&w->store, s->uid, s->name, s->log, s->n_log, &err) < 0) {
        /* no session name in the log: it is the user's text */
        sil_warn("uid %u: a session's transcript was not saved, it lives in memory only: %s",
                 (unsigned)s->uid, err.msg);
        s->saved = false;
    }
}

int sil_session_restore(struct sil_worker *w, uint32_t uid, const char *name, struct sil_chat_msg **log,
                        size_t *n_log)
{
    *log = NULL;
    *n_log = 0;
    struct sil_sessfile f;
    struct sil_error err = { 0 };
    const int rc = sil_sessstore_load(&w->store, uid, name, &f, &err);
    if (rc == -ENOENT)
        return rc;
    if (rc < 0) {
        sil_warn("ignoring the saved session file %s; the session starts over", err.msg);
        return -ENOENT;
    }
    sil_info("uid %u: a session restored from its saved transcript (%zu messages)", (unsigned)uid,
             f.n_msgs);
    *log = f.msgs;
    *n_log = f.n_msgs;
    return 0;
}

/* Frees the strings of m[0, n), not the array. */
static void msgs_clear(struct sil_chat_msg *m, size_t n)
{
    for (size_t i = 0; m && i < n; i++) {
        free((char *)m[i].role);
        free((char *)m[i].content);
        free((char *)m[i].reasoning);
    }
}

void sil_chat_msgs_free(struct sil_chat_msg *m, size_t n)
{
    msgs_clear(m, n);
    free(m);
}

/* Room a chat on a session keeps for its answer: its budget (answer, grace tokens, bounded
 * reasoning), at least a quarter of the context and at most half. */
static size_t answer_reserve(const struct sil_worker *w, const struct job *j)
{
    const struct sil_genctl_params *c = &j->r.ctl;
    const int64_t lo = w->n_ctx / 4, hi = w->n_ctx / 2;
    int64_t want = hi; /* no answer budget: the context ends it */
    if (c->max_tokens > 0)
        want = (int64_t)c->max_tokens + c->grace_tokens +
               (j->r.think && c->max_thinking_tokens > 0 ? c->max_thinking_tokens : 0);
    return (size_t)(want < lo ? lo : want > hi ? hi : want);
}

/* The conversation msgs[0, n) with msgs[k0, from) left out (k0: 1 when it opens with a system
 * message, which always stays), rendered to ids; view holds n messages. */
static int render_kept(struct sil_worker *w, const struct job *j, const struct sil_chat_msg *msgs,
                       size_t n, size_t k0, size_t from, bool gen_prompt,
                       struct sil_chat_msg *view, int32_t **ids, size_t *n_ids,
                       struct sil_error *err)
{
    memcpy(view, msgs, sizeof(*view) * k0);
    memcpy(view + k0, msgs + from, sizeof(*view) * (n - from));
    return sil_chat_tokenize(w->v, view, k0 + n - from, gen_prompt, j->r.think, ids, n_ids, err);
}

int sil_session_chat_prompt(struct sil_worker *w, struct job *j, const struct session *s,
                            struct sil_error *err)
{
    if (!j->r.chat)
        return 0;
    const bool joined = j->r.append && s && s->n_log > 0;
    const size_t n = (joined ? s->n_log : 0) + j->r.n_chat;
    struct sil_chat_msg *all = malloc(sizeof(*all) * n), *view = malloc(sizeof(*all) * n);
    size_t *cuts = malloc(sizeof(*cuts) * n);
    if (!all || !view || !cuts) {
        free(all);
        free(view);
        free(cuts);
        return sil_errorf(err, -ENOMEM, "out of memory");
    }
    if (joined)
        memcpy(all, s->log, sizeof(*all) * s->n_log);
    memcpy(all + (joined ? s->n_log : 0), j->r.chat, sizeof(*all) * j->r.n_chat);
    const size_t k0 = n > 0 && strcmp(all[0].role, "system") == 0;
    /* Where older turns may be cut off: at a user message after the first kept one, up to the
     * last (the question being asked stays). */
    size_t n_cuts = 0;
    for (size_t i = k0 + 1; i < n; i++)
        if (strcmp(all[i].role, "user") == 0)
            cuts[n_cuts++] = i;
    int32_t *ids = NULL, *hist = NULL;
    size_t n_ids = 0, n_hist = 0, from = k0;
    int rc = 0;
    if (joined) {
        rc = render_kept(w, j, all, n, k0, from, true, view, &ids, &n_ids, err);
    } else if (!(ids = malloc(sizeof(*ids) * (j->r.n_prompt ? j->r.n_prompt : 1)))) {
        rc = sil_errorf(err, -ENOMEM, "out of memory");
    } else { /* the request's messages alone: the loop rendered them already */
        memcpy(ids, j->r.prompt, sizeof(*ids) * j->r.n_prompt);
        n_ids = j->r.n_prompt;
    }
    const size_t n_full = n_ids;
    const size_t limit = (size_t)w->n_ctx - answer_reserve(w, j);
    if (rc == 0 && n_ids > limit && n_cuts > 0) {
        /* Fewest turns dropped to take at most half the context (or as many as there are), so
         * the turns that follow extend what is kept instead of cutting again at once. */
        const size_t target = (size_t)w->n_ctx / 2;
        size_t lo = 0, hi = n_cuts - 1;
        while (rc == 0 && lo < hi) {
            const size_t mid = lo + (hi - lo) / 2;
            int32_t *t = NULL;
            size_t n_t = 0;
            rc = render_kept(w, j, all, n, k0, cuts[mid], true, view, &t, &n_t, err);
            free(t);
            if (n_t <= target)
                hi = mid;
            else
                lo = mid + 1;
        }
        from = cuts[lo];
        free(ids);
        ids = NULL;
        if (rc == 0)
            rc = render_kept(w, j, all, n, k0, from, true, view, &ids, &n_ids, err);
    }
    if (rc == 0 && (int64_t)n_ids + 1 >= w->n_ctx) {
        j->err_code = SIL_RPC_E_CONTEXT_FULL;
        if (from > k0)
            rc = sil_errorf(err, -E2BIG,
                            "the last question (%zu tokens with the system prompt) does not fit "
                            "the context of %d, even with the conversation's %zu older messages "
                            "dropped",
                            n_ids, w->n_ctx, from - k0);
        else
            rc = sil_errorf(err, -E2BIG, "prompt of %zu tokens does not fit the context of %d",
                            n_ids, w->n_ctx);
    }
    if (rc == 0 && from > k0) {
        sil_info("uid %u: a session's conversation of %zu tokens leaves too little room for the "
                 "answer in the context of %d: its %zu oldest messages dropped (%zu tokens left)",
                 (unsigned)j->r.uid, n_full, w->n_ctx, from - k0, n_ids);
        j->drop_at = k0;
        j->n_dropped = from - k0;
    }
    if (rc == 0) {
        free(j->r.prompt);
        j->r.prompt = ids;
        j->r.n_prompt = n_ids;
        ids = NULL;
    }
    /* The conversation without the generation prompt: where the next turn diverges. */
    if (rc == 0 &&
        render_kept(w, j, all, n, k0, from, false, view, &hist, &n_hist, err) == 0 &&
        n_hist < j->r.n_prompt && memcmp(hist, j->r.prompt, n_hist * sizeof(*hist)) == 0)
        j->r.resume = (int32_t)n_hist;
    free(ids);
    free(hist);
    free(all);
    free(view);
    free(cuts);
    return rc;
}

static uint64_t log_bytes(const struct session *s)
{
    uint64_t b = sizeof(*s->log) * s->n_log;
    for (size_t i = 0; i < s->n_log; i++)
        b += strlen(s->log[i].role) + strlen(s->log[i].content) + 2 +
             (s->log[i].reasoning ? strlen(s->log[i].reasoning) + 1 : 0);
    return b;
}

void sil_session_keep_transcript(struct sil_worker *w, struct session *s, struct job *j,
                                 const char *answer, size_t n_answer, const char *reasoning,
                                 size_t n_reasoning)
{
    if (!j->r.chat || !j->r.append) {
        sil_chat_msgs_free(s->log, s->n_log);
        s->log = NULL;
        s->n_log = 0;
    }
    if (j->r.chat) {
        /* the answer holds no NUL (job_token leaves a token's NUL bytes out) */
        size_t n = s->n_log + j->r.n_chat + 1;
        struct sil_chat_msg *log = realloc(s->log, sizeof(*log) * n);
        char *role = strdup("assistant"), *content = strndup(answer, n_answer);
        char *why = n_reasoning ? strndup(reasoning, n_reasoning) : NULL;
        if (!log || !role || !content || (n_reasoning && !why)) {
            /* A transcript with a hole would mislead the next turn: start over instead. */
            free(role);
            free(content);
            free(why);
            sil_chat_msgs_free(log ? log : s->log, s->n_log);
            s->log = NULL;
            s->n_log = 0;
        } else {
            memcpy(log + s->n_log, j->r.chat, sizeof(*log) * j->r.n_chat);
            log[n - 1] = (struct sil_chat_msg){ role, content, why };
            free(j->r.chat); /* the strings moved into the transcript */
            j->r.chat = NULL;
            j->r.n_chat = 0;
            /* the turns the prompt left out go: the transcript is what the model saw */
            const size_t at = j->drop_at, k = j->n_dropped;
            if (k > 0 && at + k < n) {
                msgs_clear(log + at, k);
                memmove(log + at, log + at + k, sizeof(*log) * (n - at - k));
                n -= k;
            }
            s->log = log;
            s->n_log = n;
        }
    }
    s->memory = sil_seq_memory(w->e, s->seq) + log_bytes(s);
}
