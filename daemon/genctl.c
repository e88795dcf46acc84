#include "daemon/genctl.h"

#include <ctype.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vec.h"

struct buf {
    char *p;
    size_t n, cap;
};

struct sil_genctl {
    struct sil_genctl_params p;
    char *stop[SIL_GENCTL_MAX_STOP];
    size_t stop_len[SIL_GENCTL_MAX_STOP];
    size_t max_stop_len;
    struct buf answer, held, reasoning;
    bool in_reasoning, in_grace, answer_started, finished;
    bool after_think; /* a think block closed: the blank lines the format puts after it go */
    bool cut; /* a stop string or a sentence end cut the text: nothing after it belongs */
    bool dot_pending; /* answer ends in digit + '.': the next text says decimal or sentence end */
    int32_t n_answer, n_reasoning, n_grace;
    int32_t forced;
    enum sil_stop_reason reason;
};

const char *sil_stop_reason_name(enum sil_stop_reason r)
{
    switch (r) {
    case SIL_STOP_NONE: return "none";
    case SIL_STOP_EOS: return "eos";
    case SIL_STOP_STOP: return "stop";
    case SIL_STOP_LENGTH: return "length";
    case SIL_STOP_CANCELLED: return "cancelled";
    case SIL_STOP_SHUTDOWN: return "shutdown";
    case SIL_STOP_ERROR: return "error";
    case SIL_STOP_CONTEXT: return "context";
    }
    return "error";
}

void sil_genctl_params_default(struct sil_genctl_params *p)
{
    memset(p, 0, sizeof(*p));
    p->max_tokens = 0;
    p->max_thinking_tokens = -1;
    p->grace_tokens = SIL_GENCTL_GRACE_MAX;
    p->repair_markdown = true;
    p->think_open = -1;
    p->think_close = -1;
}

/* Room for n more bytes and a NUL. */
static int buf_reserve(struct buf *b, size_t n)
{
    return sil_vec_reserve(&b->p, &b->cap, b->n + n + 1, 256);
}

static int buf_append(struct buf *b, const char *s, size_t n)
{
    if (buf_reserve(b, n) < 0)
        return -ENOMEM;
    if (n)
        memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return 0;
}

int sil_genctl_new(struct sil_genctl **out, const struct sil_genctl_params *p)
{
    *out = NULL;
    if (p->n_stop > SIL_GENCTL_MAX_STOP || p->grace_tokens < 0 || p->grace_tokens > SIL_GENCTL_GRACE_MAX)
        return -EINVAL;
    for (size_t i = 0; i < p->n_stop; i++) {
        size_t n = p->stop[i] ? strlen(p->stop[i]) : 0;
        if (n == 0 || n > SIL_GENCTL_MAX_STOP_LEN)
            return -EINVAL;
    }
    struct sil_genctl *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    g->p = *p;
    g->p.stop = NULL;
    for (size_t i = 0; i < p->n_stop; i++) {
        g->stop[i] = strdup(p->stop[i]);
        if (!g->stop[i]) {
            g->p.n_stop = i;
            sil_genctl_free(g);
            return -ENOMEM;
        }
        g->stop_len[i] = strlen(p->stop[i]);
        if (g->stop_len[i] > g->max_stop_len)
            g->max_stop_len = g->stop_len[i];
    }
    g->in_reasoning = p->in_reasoning;
    g->forced = -1;
    if (g->in_reasoning && p->max_thinking_tokens == 0 && p->think_close >= 0)
        g->forced = p->think_close;
    if (buf_append(&g->answer, "", 0) || buf_append(&g->reasoning, "", 0) || buf_append(&g->held, "", 0)) {
        sil_genctl_free(g);
        return -ENOMEM;
    }
    *out = g;
    return 0;
}

void sil_genctl_free(struct sil_genctl *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->p.n_stop; i++)
        free(g->stop[i]);
    free(g->answer.p);
    free(g->held.p);
    free(g->reasoning.p);
    free(g);
}

int32_t sil_genctl_forced(const struct sil_genctl *g)
{
    return g->reason == SIL_STOP_NONE ? g->forced : -1;
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of some stop string: that much
 * must be held back because the next token may complete the match. */
static size_t stop_prefix_suffix(const struct sil_genctl *g, const char *s, size_t n)
{
    size_t best = 0;
    for (size_t i = 0; i < g->p.n_stop; i++) {
        size_t lim = g->stop_len[i] - 1;
        if (lim > n)
            lim = n;
        for (size_t k = lim; k > best; k--) {
            if (memcmp(s + n - k, g->stop[i], k) == 0) {
                best = k;
                break;
            }
        }
    }
    return best;
}

/* Earliest occurrence of any stop string in s[0..n), or n when none. */
static size_t stop_find(const struct sil_genctl *g, const char *s, size_t n)
{
    size_t best = n;
    for (size_t i = 0; i < g->p.n_stop; i++) {
        const char *hit = memmem(s, n, g->stop[i], g->stop_len[i]);
        if (hit && (size_t)(hit - s) < best)
            best = (size_t)(hit - s);
    }
    return best;
}

static bool is_closer(char c)
{
    return c == '"' || c == '\'' || c == ')' || c == ']' || c == '*' || c == '_' || c == '`';
}

/* Where a sentence ends inside a grace token's text: the index just past the terminator run
 * (". ", "!?", "." at the end of the piece), or -1 when none. A '.' right after a digit may be a
 * decimal point: inside the piece the next char decides ("3.14" goes on, "in 2024. Then" ends);
 * at the end of the piece *pending is set and the next piece decides. With *pending set on entry
 * the text follows such a '.': whitespace (after closers) ends the sentence before it, 0. */
static ptrdiff_t sentence_end(const char *t, size_t n, char prev, bool *pending)
{
    size_t i = 0;
    if (*pending) {
        if (n == 0)
            return -1; /* still undecided */
        *pending = false;
        while (i < n && is_closer(t[i]))
            i++;
        if (i == n || isspace((unsigned char)t[i]))
            return (ptrdiff_t)i;
    }
    for (; i < n; i++) {
        char c = t[i];
        if (c != '.' && c != '!' && c != '?')
            continue;
        size_t j = i + 1;
        while (j < n && (t[j] == '.' || t[j] == '!' || t[j] == '?'))
            j++;
        if (c == '.' && j == i + 1 && j == n && isdigit((unsigned char)(i > 0 ? t[i - 1] : prev))) {
            *pending = true;
            return -1;
        }
        while (j < n && is_closer(t[j]))
            j++;
        if (j == n || isspace((unsigned char)t[j]))
            return (ptrdiff_t)j;
    }
    return -1;
}

/* The k-th char from the end (1 = last) of the answer as if held-back text were already out; 0
 * before the start. */
static char char_back(const struct sil_genctl *g, size_t k)
{
    if (k <= g->held.n)
        return g->held.p[g->held.n - k];
    k -= g->held.n;
    return k <= g->answer.n ? g->answer.p[g->answer.n - k] : 0;
}

/* Whether the answer so far ends a sentence. A final '.' right after a digit ("in 2024.", "3.")
 * is undecided: it sets dot_pending and says no, so the grace token after it decides. */
static bool ends_sentence(struct sil_genctl *g)
{
    size_t k = 1;
    char c;
    while ((c = char_back(g, k)) && (isspace((unsigned char)c) || is_closer(c)))
        k++;
    if (c != '.' && c != '!' && c != '?')
        return false;
    if (k == 1 && c == '.' && isdigit((unsigned char)char_back(g, 2))) {
        g->dot_pending = true;
        return false;
    }
    return true;
}

static void set_out(struct sil_genctl_out *out, struct sil_genctl *g, size_t a0, size_t r0)
{
    out->answer = g->answer.p + a0;
    out->n_answer = g->answer.n - a0;
    out->reasoning = g->reasoning.p + r0;
    out->n_reasoning = g->reasoning.n - r0;
}

/* Appends answer text: the held-back tail plus the new text is checked for stop strings; what
 * can no longer start a match is released. Returns 1 when a stop string matched. */
static int answer_text(struct sil_genctl *g, const char *text, size_t len)
{
    if (!g->answer_started) {
        /* The answer after a think block starts with blank lines; drop them. Elsewhere leading
         * blanks are the model's text (prompt + text must be what the tokens say). */
        while (g->after_think && len > 0 &&
               (*text == '\n' || *text == ' ' || *text == '\r' || *text == '\t')) {
            text++;
            len--;
        }
        if (len == 0)
            return 0;
        g->answer_started = true;
    }
    if (g->p.n_stop == 0)
        return buf_append(&g->answer, text, len);
    int rc = buf_append(&g->held, text, len);
    if (rc)
        return rc;
    size_t hit = stop_find(g, g->held.p, g->held.n);
    if (hit < g->held.n) {
        rc = buf_append(&g->answer, g->held.p, hit);
        g->held.n = 0;
        g->held.p[0] = 0;
        return rc ? rc : 1;
    }
    size_t keep = stop_prefix_suffix(g, g->held.p, g->held.n);
    size_t emit = g->held.n - keep;
    rc = buf_append(&g->answer, g->held.p, emit);
    if (rc)
        return rc;
    memmove(g->held.p, g->held.p + emit, keep + 1);
    g->held.n = keep;
    return 0;
}

int sil_genctl_push(struct sil_genctl *g, int32_t id, const char *text, size_t len,
                    struct sil_genctl_out *out)
{
    size_t a0 = g->answer.n, r0 = g->reasoning.n;
    set_out(out, g, a0, r0);
    if (g->reason != SIL_STOP_NONE)
        return g->reason;

    if (g->in_reasoning) {
        /* The model's own think-close is part of its reasoning; one forced by the budget is not. */
        if (!(id >= 0 && id == g->p.think_close && g->forced == id))
            g->n_reasoning++;
        if (id >= 0 && id == g->p.think_close) {
            g->in_reasoning = false;
            g->after_think = true;
            g->forced = -1;
            return SIL_STOP_NONE;
        }
        if (g->reasoning.n == 0)
            while (len > 0 && *text == '\n') {
                text++;
                len--;
            }
        int rc = buf_append(&g->reasoning, text, len);
        if (rc)
            return rc;
        if (g->p.max_thinking_tokens >= 0 && g->n_reasoning >= g->p.max_thinking_tokens && g->p.think_close >= 0)
            g->forced = g->p.think_close;
        set_out(out, g, a0, r0);
        return SIL_STOP_NONE;
    }

    if (id >= 0 && id == g->p.think_open && g->n_answer == 0 && !g->answer_started) {
        /* A raw prompt may leave the model to open its own think block. */
        g->in_reasoning = true;
        g->n_reasoning++;
        if (g->p.max_thinking_tokens == 0 && g->p.think_close >= 0)
            g->forced = g->p.think_close;
        return SIL_STOP_NONE;
    }

    g->n_answer++;
    bool grace_done = false;
    if (g->in_grace) {
        g->n_grace++;
        ptrdiff_t cut = sentence_end(text, len, char_back(g, 1), &g->dot_pending);
        if (cut >= 0) {
            g->cut = true; /* what follows the sentence end is dropped */
            len = (size_t)cut;
            grace_done = true;
        } else if (g->n_grace >= g->p.grace_tokens) {
            grace_done = true;
        }
    }
    int rc = answer_text(g, text, len);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        g->reason = SIL_STOP_STOP;
        g->cut = true;
    } else if (grace_done)
        g->reason = SIL_STOP_LENGTH;
    else if (!g->in_grace && g->p.max_tokens > 0 && g->n_answer >= g->p.max_tokens) {
        if (g->p.grace_tokens == 0 || ends_sentence(g))
            g->reason = SIL_STOP_LENGTH;
        else
            g->in_grace = true;
    }
    /* Held-back text and markdown repair come with sil_genctl_finish, which the caller calls
     * next: text without a token of its own may still come before it (sil_genctl_push_text). */
    set_out(out, g, a0, r0);
    return g->reason;
}

int sil_genctl_push_text(struct sil_genctl *g, const char *text, size_t len,
                         struct sil_genctl_out *out)
{
    size_t a0 = g->answer.n, r0 = g->reasoning.n;
    set_out(out, g, a0, r0);
    if (g->finished || g->cut || len == 0)
        return g->reason;
    if (g->in_reasoning) {
        int rc = buf_append(&g->reasoning, text, len);
        if (rc)
            return rc;
    } else {
        int rc = answer_text(g, text, len);
        if (rc < 0)
            return rc;
        if (rc == 1) {
            g->reason = SIL_STOP_STOP;
            g->cut = true;
        }
    }
    set_out(out, g, a0, r0);
    return g->reason;
}

int sil_genctl_finish(struct sil_genctl *g, enum sil_stop_reason why, struct sil_genctl_out *out)
{
    size_t a0 = g->answer.n, r0 = g->reasoning.n;
    set_out(out, g, a0, r0);
    if (g->finished)
        return g->reason;
    if (g->reason == SIL_STOP_NONE)
        g->reason = why;
    /* Held-back text is part of the answer unless a stop string matched it (then it was cut). */
    if (g->held.n && buf_append(&g->answer, g->held.p, g->held.n) < 0)
        return -ENOMEM;
    g->held.n = 0;
    g->finished = true;
    if (g->p.repair_markdown) {
        size_t n = sil_markdown_fence_repair(g->answer.p, g->answer.n, NULL, 0);
        if (n) { /* the closer goes straight into the answer: an opener may be any length */
            if (buf_reserve(&g->answer, n) < 0)
                return -ENOMEM;
            sil_markdown_fence_repair(g->answer.p, g->answer.n, g->answer.p + g->answer.n, n + 1);
            g->answer.n += n;
        }
    }
    set_out(out, g, a0, r0);
    return g->reason;
}

/* A fence line (CommonMark): up to 3 spaces, then a run of 3 or more '`' or '~'. Returns the run
 * length (0 when the line is no fence), its char in *c and where the run ends in *end. */
static size_t fence_run(const char *line, size_t n, char *c, size_t *end)
{
    size_t j = 0;
    while (j < n && j < 4 && line[j] == ' ')
        j++;
    if (j > 3 || j == n || (line[j] != '`' && line[j] != '~'))
        return 0;
    size_t k = j;
    while (k < n && line[k] == line[j])
        k++;
    if (k - j < 3)
        return 0;
    *c = line[j];
    *end = k;
    return k - j;
}

size_t sil_markdown_fence_repair(const char *text, size_t len, char *out, size_t cap)
{
    size_t open = 0; /* length of the open fence's run, 0 when none */
    char open_c = 0;
    for (size_t i = 0; i < len;) {
        const char *line = text + i;
        const char *nl = memchr(line, '\n', len - i);
        size_t n = nl ? (size_t)(nl - line) : len - i;
        i += n + 1;
        char c;
        size_t end;
        size_t run = fence_run(line, n, &c, &end);
        if (!run)
            continue;
        if (!open) {
            /* a backtick opener's info string has no backtick (else it is inline code) */
            if (c == '`' && memchr(line + end, '`', n - end))
                continue;
            open = run;
            open_c = c;
        } else if (c == open_c && run >= open) {
            /* a closer has nothing but spaces after its run */
            while (end < n && (line[end] == ' ' || line[end] == '\t' || line[end] == '\r'))
                end++;
            if (end == n)
                open = 0;
        }
    }
    const bool nl = open && len > 0 && text[len - 1] != '\n';
    const size_t need = open ? nl + open : 0;
    if (cap > 0) {
        size_t w = need < cap - 1 ? need : cap - 1;
        if (nl && w > 0)
            out[0] = '\n';
        if (w > nl)
            memset(out + nl, open_c, w - nl);
        out[w] = 0;
    }
    return need;
}

const char *sil_genctl_answer(const struct sil_genctl *g, size_t *len)
{
    if (len)
        *len = g->answer.n;
    return g->answer.p;
}

const char *sil_genctl_reasoning(const struct sil_genctl *g, size_t *len)
{
    if (len)
        *len = g->reasoning.n;
    return g->reasoning.p;
}

int32_t sil_genctl_n_answer_tokens(const struct sil_genctl *g) { return g->n_answer; }
int32_t sil_genctl_n_reasoning_tokens(const struct sil_genctl *g) { return g->n_reasoning; }
bool sil_genctl_in_reasoning(const struct sil_genctl *g) { return g->in_reasoning; }
bool sil_genctl_in_grace(const struct sil_genctl *g) { return g->in_grace; }
enum sil_stop_reason sil_genctl_reason(const struct sil_genctl *g) { return g->reason; }
