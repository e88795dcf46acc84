/* Named sessions of the engine thread: an LRU list of sequences kept after their request ends,
 * with the tokens each holds so a later request reuses the common prefix. Sessions are dropped
 * from the least recently used end when over session_memory / max_sessions, or when a new
 * request needs a sequence and none is free.
 *
 * A session is keyed by (uid, name): requests of one uid never see, reuse or drop another's.
 *
 * Ownership: the worker owns every session; session_free frees the sequence and the tokens. A
 * session busy with a job is never dropped. Engine thread only. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/log.h"
#include "daemon/worker_impl.h"

struct session *session_find(struct sil_worker *w, uint32_t uid, const char *name)
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

void session_to_front(struct sil_worker *w, struct session *s)
{
    session_unlink(w, s);
    s->next = w->sessions;
    if (w->sessions)
        w->sessions->prev = s;
    w->sessions = s;
}

void session_free(struct sil_worker *w, struct session *s)
{
    session_unlink(w, s);
    if (s->seq >= 0)
        sil_seq_free(w->e, s->seq);
    free(s->tokens);
    free(s);
    w->n_sessions--;
}

/* Drops idle sessions from the least recently used end while over the limits. */
void sessions_enforce(struct sil_worker *w)
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
            session_free(w, s);
        }
        s = prev;
    }
}

/* A sequence for a new request: evicts the least recently used idle session when all are taken. */
int seq_get(struct sil_worker *w, struct sil_error *err)
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
        session_free(w, victim);
    }
}

bool session_in_use(struct sil_worker *w, uint32_t uid, const char *name)
{
    for (int pass = 0; pass < 2; pass++)
        for (struct job *j = pass ? w->running : w->queue; j; j = j->next)
            if (j->r.uid == uid && strcmp(j->r.session, name) == 0)
                return true;
    return false;
}
