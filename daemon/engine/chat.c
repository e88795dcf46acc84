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
#include "kernels/vec.h"

struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom || n == 0)
        return;
    if (sil_vec_reserve(&b->p, &b->cap, b->len + n + 1, 256) < 0) {
        b->oom = true;
        return;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
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

/* A template marker: its token id and its text as the vocab stores it. */
struct mark {
    int32_t id;
    struct span text;
};

struct markers {
    struct mark im_start, im_end, think_open, think_close;
};

static int marker(const struct sil_vocab *v, int32_t id, const char *what, struct mark *out,
                  struct sil_error *err)
{
    const char *p;
    int n = id >= 0 ? sil_token_bytes(v, id, &p) : -EINVAL;
    if (n <= 0)
        return sil_errorf(err, -EINVAL, "chat template: the vocab has no %s token", what);
    *out = (struct mark){id, {p, (size_t)n}};
    return 0;
}

/* Where the template goes: text (sil_chat_render), or token ids (sil_chat_tokenize), where a
 * marker is its id and the text between two markers (template text and message contents) is
 * tokenized as one piece without special-token parsing, so a message can never produce a marker
 * by its text. Cutting at the markers is what tokenizing the whole render with special-token
 * parsing does too, so both give the same ids whenever the contents hold no marker text. */
struct out {
    const struct sil_vocab *v;
    bool ids_mode;
    struct sbuf text; /* the render, or (ids mode) the text since the last marker */
    int32_t *ids;
    size_t n_ids, cap_ids;
    int rc; /* first failure */
    struct sil_error *err;
};

static int push_ids(struct out *o, const int32_t *ids, size_t n)
{
    if (sil_vec_reserve(&o->ids, &o->cap_ids, o->n_ids + n, 256) < 0)
        return -ENOMEM;
    memcpy(o->ids + o->n_ids, ids, n * sizeof(*ids));
    o->n_ids += n;
    return 0;
}

/* ids mode: tokenizes the pending text (contents never parsed for special tokens). */
static void flush_text(struct out *o)
{
    if (o->rc || !o->ids_mode || o->text.len == 0)
        return;
    if (o->text.oom) {
        o->rc = sil_errorf(o->err, -ENOMEM, "chat template: out of memory");
        return;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = sil_tokenize(o->v, o->text.p, o->text.len, false, false, &ids, &n, o->err);
    if (rc == 0 && push_ids(o, ids, n) < 0)
        rc = sil_errorf(o->err, -ENOMEM, "chat template: out of memory");
    free(ids);
    o->text.len = 0;
    if (rc)
        o->rc = rc;
}

static void emit(struct out *o, const char *s, size_t n)
{
    put(&o->text, s, n);
}

static void emits(struct out *o, const char *s)
{
    put(&o->text, s, strlen(s));
}

static void emit_mark(struct out *o, const struct mark *m)
{
    if (!o->ids_mode) {
        put(&o->text, m->text.p, m->text.n);
        return;
    }
    flush_text(o);
    if (!o->rc && push_ids(o, &m->id, 1) < 0)
        o->rc = sil_errorf(o->err, -ENOMEM, "chat template: out of memory");
}

static int build(const struct sil_vocab *v, const struct sil_chat_msg *msgs, size_t n,
                 bool add_generation_prompt, bool think, struct out *o, struct sil_error *err)
{
    const bool q35 = strcmp(sil_vocab_pre(v), "qwen35") == 0;
    struct markers m = {{-1, {"", 0}}, {-1, {"", 0}}, {-1, {"", 0}}, {-1, {"", 0}}};
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

    const char nl = '\n';
    for (size_t i = 0; i < n; i++) {
        const char *role = msgs[i].role;
        struct span content = span_of(msgs[i].content);
        if (q35)
            content = trim(content);
        if (strcmp(role, "assistant") != 0) {
            emit_mark(o, &m.im_start);
            emits(o, role);
            emit(o, &nl, 1);
            emit(o, content.p, content.n);
            emit_mark(o, &m.im_end);
            emit(o, &nl, 1);
            continue;
        }
        struct span reasoning = {"", 0};
        if (msgs[i].reasoning) {
            reasoning = span_of(msgs[i].reasoning);
        } else if (have_think && find(content, m.think_close.text.p, m.think_close.text.n)) {
            const char *first = find(content, m.think_close.text.p, m.think_close.text.n);
            const char *last = find_last(content, m.think_close.text.p, m.think_close.text.n);
            struct span before = rstrip_nl((struct span){content.p, (size_t)(first - content.p)});
            const char *open = find_last(before, m.think_open.text.p, m.think_open.text.n);
            if (open) {
                before.n -= (size_t)(open + m.think_open.text.n - before.p);
                before.p = open + m.think_open.text.n;
            }
            reasoning = lstrip_nl(before);
            size_t after = (size_t)(last + m.think_close.text.n - content.p);
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
        emit_mark(o, &m.im_start);
        emits(o, "assistant\n");
        if (keep) {
            if (!have_think)
                return sil_errorf(err, -EINVAL,
                                  "chat template: the vocab has no <think>/</think> tokens");
            emit_mark(o, &m.think_open);
            emit(o, &nl, 1);
            emit(o, reasoning.p, reasoning.n);
            emit(o, &nl, 1);
            emit_mark(o, &m.think_close);
            emits(o, "\n\n");
        }
        emit(o, content.p, content.n);
        emit_mark(o, &m.im_end);
        emit(o, &nl, 1);
    }
    if (add_generation_prompt) {
        emit_mark(o, &m.im_start);
        emits(o, "assistant\n");
        if (!think || q35) {
            if (!have_think)
                return sil_errorf(err, -EINVAL,
                                  "chat template: the vocab has no <think>/</think> tokens");
            emit_mark(o, &m.think_open);
            emit(o, &nl, 1);
            if (!think) {
                emit(o, &nl, 1);
                emit_mark(o, &m.think_close);
                emits(o, "\n\n");
            }
        }
    }
    flush_text(o);
    if (o->rc)
        return o->rc;
    if (o->text.oom)
        return sil_errorf(err, -ENOMEM, "chat template: out of memory");
    return 0;
}

int sil_chat_render(const struct sil_vocab *v, const struct sil_chat_msg *msgs, size_t n,
                    bool add_generation_prompt, bool think, char **out, size_t *len,
                    struct sil_error *err)
{
    *out = NULL;
    *len = 0;
    struct out o = {.v = v, .err = err};
    int rc = build(v, msgs, n, add_generation_prompt, think, &o, err);
    if (rc == 0 && !o.text.p) {
        o.text.p = calloc(1, 1);
        if (!o.text.p)
            rc = sil_errorf(err, -ENOMEM, "chat template: out of memory");
    }
    if (rc) {
        free(o.text.p);
        return rc;
    }
    *out = o.text.p;
    *len = o.text.len;
    /* cppcheck loses the buffer's hand-over to *out through the struct member */
    /* cppcheck-suppress memleak */
    return 0;
}

int sil_chat_tokenize(const struct sil_vocab *v, const struct sil_chat_msg *msgs, size_t n,
                      bool add_generation_prompt, bool think, int32_t **ids, size_t *n_ids,
                      struct sil_error *err)
{
    *ids = NULL;
    *n_ids = 0;
    struct out o = {.v = v, .ids_mode = true, .err = err};
    int rc = build(v, msgs, n, add_generation_prompt, think, &o, err);
    free(o.text.p);
    if (rc == 0 && !o.ids) {
        o.ids = malloc(sizeof(*o.ids));
        if (!o.ids)
            rc = sil_errorf(err, -ENOMEM, "chat template: out of memory");
    }
    if (rc) {
        free(o.ids);
        return rc;
    }
    *ids = o.ids;
    *n_ids = o.n_ids;
    return 0;
}
