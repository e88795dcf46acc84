#include "daemon/genctl.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

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
    bool cut; /* a stop string or a sentence end cut the text: nothing after it belongs */
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

static int buf_append(struct buf *b, const char *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return -ENOMEM;
        b->p = p;
        b->cap = cap;
    }
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
 * (". ", "!?", "." at the end of the piece), or 0 when none. A '.' between digits is a decimal
 * point, and one at the end of a piece right after a digit is taken as such too. */
static size_t sentence_end(const char *t, size_t n, char prev)
{
    for (size_t i = 0; i < n; i++) {
        char c = t[i];
        if (c != '.' && c != '!' && c != '?')
            continue;
        size_t j = i + 1;
        while (j < n && (t[j] == '.' || t[j] == '!' || t[j] == '?'))
            j++;
        while (j < n && is_closer(t[j]))
            j++;
        char before = i > 0 ? t[i - 1] : prev;
        if (j == n) {
            if (c == '.' && isdigit((unsigned char)before))
                continue;
            return j;
        }
        if (isspace((unsigned char)t[j]))
            return j;
    }
    return 0;
}

static bool ends_sentence(const struct buf *a, const struct buf *b)
{
    /* Look at the answer as if held-back text were already out. */
    size_t n = b->n;
    const char *s = b->p;
    for (int part = 0; part < 2; part++) {
        while (n > 0 && (isspace((unsigned char)s[n - 1]) || is_closer(s[n - 1])))
            n--;
        if (n > 0)
            return s[n - 1] == '.' || s[n - 1] == '!' || s[n - 1] == '?';
        s = a->p;
        n = a->n;
    }
    return false;
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
        /* The answer after a think block starts with blank lines; drop them. */
        while (len > 0 && (*text == '\n' || *text == ' ' || *text == '\r' || *text == '\t')) {
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
        char prev = g->held.n ? g->held.p[g->held.n - 1] : g->answer.n ? g->answer.p[g->answer.n - 1] : 0;
        size_t cut = sentence_end(text, len, prev);
        if (cut > 0) {
            g->cut = true; /* what follows the sentence end, held bytes too, is dropped */
            len = cut;
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
        if (g->p.grace_tokens == 0 || ends_sentence(&g->answer, &g->held))
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
        char fix[SIL_FENCE_REPAIR_MAX];
        size_t n = sil_markdown_fence_repair(g->answer.p, g->answer.n, fix);
        if (n && buf_append(&g->answer, fix, n) < 0)
            return -ENOMEM;
    }
    set_out(out, g, a0, r0);
    return g->reason;
}

size_t sil_markdown_fence_repair(const char *text, size_t len, char out[SIL_FENCE_REPAIR_MAX])
{
    size_t open = 0; /* backticks of the open fence, 0 when none */
    size_t i = 0;
    while (i < len) {
        size_t eol = i;
        while (eol < len && text[eol] != '\n')
            eol++;
        size_t j = i, indent = 0;
        while (j < eol && text[j] == ' ' && indent < 4) {
            j++;
            indent++;
        }
        size_t ticks = 0;
        while (j + ticks < eol && text[j + ticks] == '`')
            ticks++;
        if (indent <= 3 && ticks >= 3) {
            if (!open) {
                open = ticks;
            } else if (ticks >= open) {
                size_t k = j + ticks;
                while (k < eol && (text[k] == ' ' || text[k] == '\t' || text[k] == '\r'))
                    k++;
                if (k == eol)
                    open = 0;
            }
        }
        i = eol + 1;
    }
    if (!open)
        return 0;
    if (open > SIL_FENCE_REPAIR_MAX - 2)
        open = SIL_FENCE_REPAIR_MAX - 2;
    size_t n = 0;
    if (len > 0 && text[len - 1] != '\n')
        out[n++] = '\n';
    memset(out + n, '`', open);
    n += open;
    out[n] = 0;
    return n;
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
