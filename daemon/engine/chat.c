/* The Qwen ChatML template (see chat.h). Two flavours, chosen by the vocab's pre-tokenizer:
 *
 *   Qwen3 ("qwen2" pre-tokenizer): contents as given; an assistant turn after the last user query
 *   keeps a think block when it is the last message or has reasoning; thinking on adds nothing
 *   after "<|im_start|>assistant\n", thinking off adds the empty think block.
 *   Qwen3.5 ("qwen35"): contents and reasoning are trimmed; a later assistant turn keeps a think
 *   block only when it has reasoning; thinking on adds "<think>\n", off the empty think block.
 *
 * Reasoning comes from msg->reasoning, else from a "<think>...</think>" prefix of the content
 * (split as the templates split it). Tools and tool roles are not rendered. */
#include "daemon/engine/chat.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/tokenizer.h"

struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom || n == 0)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void puts_(struct sbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* A slice of a message string. */
struct span {
    const char *p;
    size_t n;
};

static struct span span_of(const char *s)
{
    return (struct span){s, s ? strlen(s) : 0};
}

static bool is_ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

static struct span lstrip_nl(struct span s)
{
    while (s.n && s.p[0] == '\n')
        s.p++, s.n--;
    return s;
}

static struct span rstrip_nl(struct span s)
{
    while (s.n && s.p[s.n - 1] == '\n')
        s.n--;
    return s;
}

static struct span trim(struct span s)
{
    while (s.n && is_ws(s.p[0]))
        s.p++, s.n--;
    while (s.n && is_ws(s.p[s.n - 1]))
        s.n--;
    return s;
}

static const char *find(struct span s, const char *needle, size_t nn)
{
    return nn <= s.n ? memmem(s.p, s.n, needle, nn) : NULL;
}

static const char *find_last(struct span s, const char *needle, size_t nn)
{
    const char *last = NULL, *p;
    struct span rest = s;
    while ((p = find(rest, needle, nn))) {
        last = p;
        rest.n -= (size_t)(p + 1 - rest.p);
        rest.p = p + 1;
    }
    return last;
}

static bool starts_with(struct span s, const char *w)
{
    size_t n = strlen(w);
    return s.n >= n && memcmp(s.p, w, n) == 0;
}

static bool ends_with(struct span s, const char *w)
{
    size_t n = strlen(w);
    return s.n >= n && memcmp(s.p + s.n - n, w, n) == 0;
}

/* Marker texts as the vocab stores them. */
struct markers {
    struct span im_start, im_end, think_open, think_close;
};

static int marker(const struct sil_vocab *v, int32_t id, const char *what, struct span *out,
                  struct sil_error *err)
{
    const char *p;
    int n = id >= 0 ? sil_token_bytes(v, id, &p) : -EINVAL;
    if (n <= 0)
        return sil_errorf(err, -EINVAL, "chat template: the vocab has no %s token", what);
    *out = (struct span){p, (size_t)n};
    return 0;
}

int sil_chat_render(const struct sil_vocab *v, const struct sil_chat_msg *msgs, size_t n,
                    bool add_generation_prompt, bool think, char **out, size_t *len,
                    struct sil_error *err)
{
    *out = NULL;
    *len = 0;
    const bool q35 = strcmp(sil_vocab_pre(v), "qwen35") == 0;
    struct markers m = {{"", 0}, {"", 0}, {"", 0}, {"", 0}};
    int rc;
    if ((rc = marker(v, sil_vocab_im_start(v), "<|im_start|>", &m.im_start, err)) < 0 ||
        (rc = marker(v, sil_vocab_im_end(v), "<|im_end|>", &m.im_end, err)) < 0)
        return rc;
    struct sil_error ignored; /* the think markers are only needed where a think block is written */
    bool have_think =
        marker(v, sil_vocab_think_open(v), "<think>", &m.think_open, &ignored) == 0 &&
        marker(v, sil_vocab_think_close(v), "</think>", &m.think_close, &ignored) == 0;

    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || !msgs[i].content)
            return sil_errorf(err, -EINVAL, "chat template: message %zu: %s missing", i,
                              r ? "content" : "role");
        if (strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0 && strcmp(r, "system") != 0)
            return sil_errorf(err, -EINVAL,
                              "chat template: message %zu: role '%.32s' (expected system, user "
                              "or assistant)",
                              i, r);
        if (q35 && i > 0 && strcmp(r, "system") == 0)
            return sil_errorf(err, -EINVAL,
                              "chat template: message %zu: a system message must come first", i);
    }

    /* The last user message that is not a tool response: reasoning before it is history. */
    size_t last_query = n ? n - 1 : 0;
    bool found = false;
    for (size_t k = n; k-- > 0;) {
        struct span c = span_of(msgs[k].content);
        if (q35)
            c = trim(c);
        if (strcmp(msgs[k].role, "user") == 0 &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = k;
            found = true;
            break;
        }
    }
    if (q35 && n && !found)
        return sil_errorf(err, -EINVAL, "chat template: no user message");

    struct sbuf b = {0};
    const char nl = '\n';
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        struct span content = span_of(msgs[i].content);
        if (q35)
            content = trim(content);
        if (strcmp(role, "assistant") != 0) {
            put(&b, m.im_start.p, m.im_start.n);
            puts_(&b, role);
            put(&b, &nl, 1);
            put(&b, content.p, content.n);
            put(&b, m.im_end.p, m.im_end.n);
            put(&b, &nl, 1);
            continue;
        }
        struct span reasoning = {"", 0};
        if (msgs[i].reasoning) {
            reasoning = span_of(msgs[i].reasoning);
        } else if (have_think && find(content, m.think_close.p, m.think_close.n)) {
            const char *first = find(content, m.think_close.p, m.think_close.n);
            const char *last = find_last(content, m.think_close.p, m.think_close.n);
            struct span before = rstrip_nl((struct span){content.p, (size_t)(first - content.p)});
            const char *open = find_last(before, m.think_open.p, m.think_open.n);
            if (open) {
                before.n -= (size_t)(open + m.think_open.n - before.p);
                before.p = open + m.think_open.n;
            }
            reasoning = lstrip_nl(before);
            size_t after = (size_t)(last + m.think_close.n - content.p);
            content = lstrip_nl((struct span){content.p + after, content.n - after});
        }
        bool keep;
        if (q35) {
            reasoning = trim(reasoning);
            keep = i > last_query && reasoning.n > 0;
        } else {
            keep = i > last_query && (i == n - 1 || reasoning.n > 0);
            reasoning = lstrip_nl(rstrip_nl(reasoning));
            if (keep)
                content = lstrip_nl(content);
        }
        put(&b, m.im_start.p, m.im_start.n);
        puts_(&b, "assistant\n");
        if (keep) {
            if (!have_think) {
                free(b.p);
                return sil_errorf(err, -EINVAL,
                                  "chat template: the vocab has no <think>/</think> tokens");
            }
            put(&b, m.think_open.p, m.think_open.n);
            put(&b, &nl, 1);
            put(&b, reasoning.p, reasoning.n);
            put(&b, &nl, 1);
            put(&b, m.think_close.p, m.think_close.n);
            puts_(&b, "\n\n");
        }
        put(&b, content.p, content.n);
        put(&b, m.im_end.p, m.im_end.n);
        put(&b, &nl, 1);
    }
    if (add_generation_prompt) {
        put(&b, m.im_start.p, m.im_start.n);
        puts_(&b, "assistant\n");
        if (!think || q35) {
            if (!have_think) {
                free(b.p);
                return sil_errorf(err, -EINVAL,
                                  "chat template: the vocab has no <think>/</think> tokens");
            }
            put(&b, m.think_open.p, m.think_open.n);
            put(&b, &nl, 1);
            if (!think) {
                put(&b, &nl, 1);
                put(&b, m.think_close.p, m.think_close.n);
                puts_(&b, "\n\n");
            }
        }
    }
    put(&b, "", 0);
    if (!b.p && !b.oom) {
        b.p = calloc(1, 1);
        b.oom = !b.p;
    }
    if (b.oom) {
        free(b.p);
        return sil_errorf(err, -ENOMEM, "chat template: out of memory");
    }
    *out = b.p;
    *len = b.len;
    return 0;
}
