/* Generation controls, above the engine and independent of it: pure logic over the token ids and
 * text pieces the scheduler feeds in, so every rule is unit-tested without a model.
 *
 *  - reasoning / answer split on the think-open / think-close ids;
 *  - max_thinking_tokens: when reasoning reaches the budget the next token is forced to be the
 *    think-close id (sil_genctl_forced());
 *  - stop strings, matched in the answer text across token boundaries: text that could be the
 *    start of a stop string is held back until it is decided, and the match itself is never
 *    emitted;
 *  - answer budget (max_tokens) with up to SIL_GENCTL_GRACE_MAX grace tokens to end the sentence
 *    on '.', '!' or '?' (text after the sentence end is dropped); a '.' after a digit ends it
 *    when a space follows ("in 2024. "), not a digit ("3.14"), the next token deciding;
 *  - markdown repair: an unterminated ``` or ~~~ fence in the answer is closed at the end.
 *
 * Ownership: struct sil_genctl owns its text buffers (malloc'd, grown as needed) and copies the
 * stop strings; free with sil_genctl_free. Not thread-safe; one per request. */
#ifndef SIL_GENCTL_H
#define SIL_GENCTL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SIL_GENCTL_GRACE_MAX 64
#define SIL_GENCTL_MAX_STOP 16
#define SIL_GENCTL_MAX_STOP_LEN 256

enum sil_stop_reason {
    SIL_STOP_NONE = 0, /* still running */
    SIL_STOP_EOS,
    SIL_STOP_STOP,
    SIL_STOP_LENGTH,
    SIL_STOP_CANCELLED,
    SIL_STOP_SHUTDOWN,
    SIL_STOP_ERROR,
    SIL_STOP_CONTEXT, /* the context is full: no position left for another token */
};
const char *sil_stop_reason_name(enum sil_stop_reason r); /* "eos", "stop", ... */

struct sil_genctl_params {
    int32_t max_tokens;          /* answer tokens; <= 0 = no limit (the context still ends it) */
    int32_t max_thinking_tokens; /* reasoning tokens before think-close is forced; < 0 = no limit */
    int32_t grace_tokens;        /* extra tokens to end the sentence, 0..SIL_GENCTL_GRACE_MAX */
    bool in_reasoning;           /* the prompt already opened a think block */
    bool repair_markdown;        /* close an unterminated ``` or ~~~ fence at the end */
    int32_t think_open, think_close; /* ids from the vocab, -1 if none */
    const char *const *stop;     /* stop strings (copied), at most SIL_GENCTL_MAX_STOP */
    size_t n_stop;
};
void sil_genctl_params_default(struct sil_genctl_params *p);

/* Where a piece of text goes. */
struct sil_genctl_out {
    const char *answer;    /* answer text to stream now (valid until the next call) */
    size_t n_answer;
    const char *reasoning; /* reasoning text to stream now */
    size_t n_reasoning;
};

struct sil_genctl;

/* -EINVAL for a bad parameter (too many / too long / empty stop strings), -ENOMEM. */
int sil_genctl_new(struct sil_genctl **out, const struct sil_genctl_params *p);
void sil_genctl_free(struct sil_genctl *g);

/* The token the next step must produce instead of sampling, or -1. */
int32_t sil_genctl_forced(const struct sil_genctl *g);

/* Feeds one generated token and its text (from a streaming detokenizer: whole UTF-8 characters).
 * End-of-generation tokens are not fed: call sil_genctl_finish(g, SIL_STOP_EOS) instead.
 * Returns SIL_STOP_NONE to go on, or the reason to stop (stop string, answer budget); after a
 * reason, call sil_genctl_finish (held-back text and markdown repair come out there). *out gets
 * the text that may be streamed now. -ENOMEM on allocation failure. */
int sil_genctl_push(struct sil_genctl *g, int32_t id, const char *text, size_t len,
                    struct sil_genctl_out *out);

/* Text that comes with no token of its own, before sil_genctl_finish: what the streaming
 * detokenizer still held at the end (an incomplete character, given as U+FFFD). It goes where the
 * last token's text went (reasoning or answer, stop strings applied); no token is counted and no
 * budget rule runs. Ignored after finish and when a stop string or a sentence end cut the text
 * (it came after the cut). Returns as push. */
int sil_genctl_push_text(struct sil_genctl *g, const char *text, size_t len,
                         struct sil_genctl_out *out);

/* Ends generation for the given reason (ignored if push already returned one): releases text
 * held back for stop-string matching and applies markdown repair. *out gets the last text to
 * stream. Returns the final reason. */
int sil_genctl_finish(struct sil_genctl *g, enum sil_stop_reason why, struct sil_genctl_out *out);

/* Totals, valid at any time: the whole answer and reasoning texts streamed so far (after finish:
 * the final texts, repaired), and token counts. */
const char *sil_genctl_answer(const struct sil_genctl *g, size_t *len);
const char *sil_genctl_reasoning(const struct sil_genctl *g, size_t *len);
int32_t sil_genctl_n_answer_tokens(const struct sil_genctl *g);
int32_t sil_genctl_n_reasoning_tokens(const struct sil_genctl *g);
bool sil_genctl_in_reasoning(const struct sil_genctl *g);
bool sil_genctl_in_grace(const struct sil_genctl *g);
enum sil_stop_reason sil_genctl_reason(const struct sil_genctl *g);

/* Markdown repair on its own: the suffix that closes an unterminated fenced code block in text (a
 * newline if text does not end in one, then the opening fence's char as many times as it has),
 * 0 when every fence is closed. Fences follow CommonMark: a line of up to 3 spaces, then 3 or
 * more '`' (the rest of the line holding no '`') or '~'; closed by a line of up to 3 spaces, at
 * least as many of the same char, then only spaces or tabs. Returns the suffix length; writes
 * at most cap - 1 bytes of it and a NUL to out (as snprintf: cap 0 only measures). */
size_t sil_markdown_fence_repair(const char *text, size_t len, char *out, size_t cap);

#endif
