/* Generation controls: stop strings across token boundaries, the thinking budget, the answer
 * budget with grace tokens, markdown fence repair. No model: token ids and pieces are made up. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/genctl.h"

enum { THINK_OPEN = 100, THINK_CLOSE = 101, TOK = 5 };

struct run {
    char streamed_answer[4096];
    char streamed_reasoning[4096];
    int reason;
    int n_pushed;
};

static void collect(struct run *r, const struct sil_genctl_out *o)
{
    strncat(r->streamed_answer, o->answer, o->n_answer);
    strncat(r->streamed_reasoning, o->reasoning, o->n_reasoning);
}

/* Pushes pieces (NULL-terminated) until a stop reason, then finishes with EOS if none. */
static void feed(struct sil_genctl *g, struct run *r, const char *const *pieces)
{
    memset(r, 0, sizeof(*r));
    struct sil_genctl_out o;
    for (; *pieces; pieces++) {
        int rc = sil_genctl_push(g, TOK, *pieces, strlen(*pieces), &o);
        assert_true(rc >= 0);
        collect(r, &o);
        r->n_pushed++;
        if (rc != SIL_STOP_NONE) {
            r->reason = rc;
            break;
        }
    }
    r->reason = sil_genctl_finish(g, SIL_STOP_EOS, &o);
    collect(r, &o);
}

static struct sil_genctl *make(const char *const *stop, size_t n_stop, int32_t max_tokens)
{
    struct sil_genctl_params p;
    sil_genctl_params_default(&p);
    p.stop = stop;
    p.n_stop = n_stop;
    p.max_tokens = max_tokens;
    p.think_open = THINK_OPEN;
    p.think_close = THINK_CLOSE;
    struct sil_genctl *g;
    assert_int_equal(sil_genctl_new(&g, &p), 0);
    return g;
}

static void test_stop_across_tokens(void **state)
{
    const char *stop[] = { "STOP", "\n\nUser:" };
    struct sil_genctl *g = make(stop, 2, 0);
    const char *pieces[] = { "Hello ", "wor", "ld S", "T", "O", "P and more", "never", NULL };
    struct run r;
    feed(g, &r, pieces);
    assert_int_equal(r.reason, SIL_STOP_STOP);
    assert_string_equal(r.streamed_answer, "Hello world ");
    size_t n;
    assert_string_equal(sil_genctl_answer(g, &n), "Hello world ");
    assert_int_equal(n, strlen("Hello world "));
    assert_int_equal(r.n_pushed, 6);
    sil_genctl_free(g);
}

static void test_stop_prefix_released(void **state)
{
    /* "ST" looked like the start of "STOP" and is held back, then released when it is not. */
    const char *stop[] = { "STOP" };
    struct sil_genctl *g = make(stop, 1, 0);
    struct sil_genctl_out o;
    assert_int_equal(sil_genctl_push(g, TOK, "a ST", 4, &o), SIL_STOP_NONE);
    assert_int_equal(o.n_answer, 2);
    assert_memory_equal(o.answer, "a ", 2);
    assert_int_equal(sil_genctl_push(g, TOK, "ART", 3, &o), SIL_STOP_NONE);
    assert_int_equal(o.n_answer, 5);
    assert_memory_equal(o.answer, "START", 5);
    /* Held text at the end of generation is part of the answer. */
    assert_int_equal(sil_genctl_push(g, TOK, " STO", 4, &o), SIL_STOP_NONE);
    assert_int_equal(o.n_answer, 1);
    assert_int_equal(sil_genctl_finish(g, SIL_STOP_EOS, &o), SIL_STOP_EOS);
    assert_int_equal(o.n_answer, 3);
    assert_string_equal(sil_genctl_answer(g, NULL), "a START STO");
    sil_genctl_free(g);
}

static void test_stop_within_one_token(void **state)
{
    const char *stop[] = { "</s>" };
    struct sil_genctl *g = make(stop, 1, 0);
    const char *pieces[] = { "x</s>y", NULL };
    struct run r;
    feed(g, &r, pieces);
    assert_int_equal(r.reason, SIL_STOP_STOP);
    assert_string_equal(sil_genctl_answer(g, NULL), "x");
    sil_genctl_free(g);
}

/* Without a think block the answer is the tokens' text, leading blanks included (a completion
 * client appends it to its prompt). */
static void test_leading_blanks_kept(void **state)
{
    struct sil_genctl *g = make(NULL, 0, 0);
    const char *pieces[] = { " \t", "\n", " world", NULL };
    struct run r;
    feed(g, &r, pieces);
    assert_string_equal(sil_genctl_answer(g, NULL), " \t\n world");
    assert_string_equal(r.streamed_answer, " \t\n world");
    sil_genctl_free(g);
}

static void test_bad_params(void **state)
{
    struct sil_genctl_params p;
    struct sil_genctl *g = NULL;
    sil_genctl_params_default(&p);
    const char *empty[] = { "" };
    p.stop = empty;
    p.n_stop = 1;
    assert_int_equal(sil_genctl_new(&g, &p), -EINVAL);
    assert_null(g);
    sil_genctl_params_default(&p);
    p.grace_tokens = SIL_GENCTL_GRACE_MAX + 1;
    assert_int_equal(sil_genctl_new(&g, &p), -EINVAL);
    sil_genctl_params_default(&p);
    p.n_stop = SIL_GENCTL_MAX_STOP + 1;
    assert_int_equal(sil_genctl_new(&g, &p), -EINVAL);
}

static void test_thinking_budget(void **state)
{
    struct sil_genctl_params p;
    sil_genctl_params_default(&p);
    p.think_open = THINK_OPEN;
    p.think_close = THINK_CLOSE;
    p.in_reasoning = true;
    p.max_thinking_tokens = 3;
    struct sil_genctl *g;
    assert_int_equal(sil_genctl_new(&g, &p), 0);
    struct sil_genctl_out o;
    assert_int_equal(sil_genctl_forced(g), -1);
    assert_int_equal(sil_genctl_push(g, TOK, "\nHmm", 4, &o), 0);
    assert_int_equal(o.n_reasoning, 3); /* leading newline dropped */
    assert_int_equal(sil_genctl_forced(g), -1);
    assert_int_equal(sil_genctl_push(g, TOK, " let", 4, &o), 0);
    assert_int_equal(sil_genctl_forced(g), -1);
    assert_int_equal(sil_genctl_push(g, TOK, " me", 3, &o), 0);
    /* Budget reached: the next token must be the think-close id. */
    assert_int_equal(sil_genctl_forced(g), THINK_CLOSE);
    assert_true(sil_genctl_in_reasoning(g));
    assert_int_equal(sil_genctl_push(g, THINK_CLOSE, "", 0, &o), 0);
    assert_false(sil_genctl_in_reasoning(g));
    assert_int_equal(sil_genctl_forced(g), -1);
    assert_int_equal(sil_genctl_push(g, TOK, "\n\n", 2, &o), 0);
    assert_int_equal(sil_genctl_push(g, TOK, "Yes.", 4, &o), 0);
    assert_int_equal(o.n_answer, 4);
    sil_genctl_finish(g, SIL_STOP_EOS, &o);
    assert_string_equal(sil_genctl_reasoning(g, NULL), "Hmm let me");
    assert_string_equal(sil_genctl_answer(g, NULL), "Yes.");
    /* The three reasoning tokens; the think-close the budget forced is not the model's reasoning. */
    assert_int_equal(sil_genctl_n_reasoning_tokens(g), 3);
    assert_int_equal(sil_genctl_n_answer_tokens(g), 2);
    sil_genctl_free(g);
}

static void test_thinking_zero_and_model_opened(void **state)
{
    struct sil_genctl_params p;
    sil_genctl_params_default(&p);
    p.think_open = THINK_OPEN;
    p.think_close = THINK_CLOSE;
    p.in_reasoning = true;
    p.max_thinking_tokens = 0;
    struct sil_genctl *g;
    assert_int_equal(sil_genctl_new(&g, &p), 0);
    assert_int_equal(sil_genctl_forced(g), THINK_CLOSE);
    sil_genctl_free(g);

    /* Raw prompt: the model opens the think block itself. */
    p.in_reasoning = false;
    p.max_thinking_tokens = 1;
    assert_int_equal(sil_genctl_new(&g, &p), 0);
    struct sil_genctl_out o;
    assert_int_equal(sil_genctl_push(g, THINK_OPEN, "", 0, &o), 0);
    assert_true(sil_genctl_in_reasoning(g));
    assert_int_equal(sil_genctl_forced(g), -1);
    assert_int_equal(sil_genctl_push(g, TOK, "idea", 4, &o), 0);
    assert_int_equal(sil_genctl_forced(g), THINK_CLOSE);
    sil_genctl_free(g);
}

static void test_stop_strings_ignore_reasoning(void **state)
{
    const char *stop[] = { "X" };
    struct sil_genctl_params p;
    sil_genctl_params_default(&p);
    p.think_open = THINK_OPEN;
    p.think_close = THINK_CLOSE;
    p.in_reasoning = true;
    p.stop = stop;
    p.n_stop = 1;
    struct sil_genctl *g;
    assert_int_equal(sil_genctl_new(&g, &p), 0);
    struct sil_genctl_out o;
    assert_int_equal(sil_genctl_push(g, TOK, "aXb", 3, &o), 0);
    assert_int_equal(sil_genctl_push(g, THINK_CLOSE, "", 0, &o), 0);
    assert_int_equal(sil_genctl_push(g, TOK, "cXd", 3, &o), SIL_STOP_STOP);
    assert_string_equal(sil_genctl_reasoning(g, NULL), "aXb");
    assert_string_equal(sil_genctl_answer(g, NULL), "c");
    /* A think-close the model chose itself is part of its reasoning. */
    assert_int_equal(sil_genctl_n_reasoning_tokens(g), 2);
    sil_genctl_free(g);
}

static void test_budget_on_sentence_end(void **state)
{
    struct sil_genctl *g = make(NULL, 0, 3);
    const char *pieces[] = { "It", " is", " done.", " More", NULL };
    struct run r;
    feed(g, &r, pieces);
    assert_int_equal(r.reason, SIL_STOP_LENGTH);
    assert_int_equal(r.n_pushed, 3);
    assert_string_equal(sil_genctl_answer(g, NULL), "It is done.");
    assert_false(sil_genctl_in_grace(g));
    sil_genctl_free(g);
}

static void test_grace_finishes_sentence(void **state)
{
    struct sil_genctl *g = make(NULL, 0, 2);
    const char *pieces[] = { "The", " sky", " is", " blue", ". It", " is", NULL };
    struct run r;
    feed(g, &r, pieces);
    assert_int_equal(r.reason, SIL_STOP_LENGTH);
    assert_int_equal(r.n_pushed, 5);
    assert_string_equal(sil_genctl_answer(g, NULL), "The sky is blue.");
    assert_string_equal(r.streamed_answer, "The sky is blue.");
    assert_int_equal(sil_genctl_n_answer_tokens(g), 5);
    sil_genctl_free(g);
}

static void test_grace_decimal_and_limit(void **state)
{
    /* "3." at the end of a piece is a number, not a sentence end; "!" ends it. */
    struct sil_genctl *g = make(NULL, 0, 1);
    const char *pieces[] = { "pi", " is 3.", "14 wow!", " tail", NULL };
    struct run r;
    feed(g, &r, pieces);
    assert_int_equal(r.reason, SIL_STOP_LENGTH);
    assert_string_equal(sil_genctl_answer(g, NULL), "pi is 3.14 wow!");
    sil_genctl_free(g);

    /* A '.' after a digit at the end of a piece ends the sentence when the next piece starts
     * with a space ("in 2024." + " Then"): that piece is dropped. */
    g = make(NULL, 0, 1);
    const char *year[] = { "It", " was in 2024.", " Then", " more.", NULL };
    feed(g, &r, year);
    assert_int_equal(r.reason, SIL_STOP_LENGTH);
    assert_int_equal(r.n_pushed, 3);
    assert_string_equal(sil_genctl_answer(g, NULL), "It was in 2024.");
    assert_string_equal(r.streamed_answer, "It was in 2024.");
    sil_genctl_free(g);
    /* the same with the '.' a token of its own, and a closing quote after it */
    g = make(NULL, 0, 1);
    const char *quoted[] = { "Say", " \"2024", ".", "\"", " next", " words.", NULL };
    feed(g, &r, quoted);
    assert_int_equal(r.n_pushed, 4);
    assert_string_equal(sil_genctl_answer(g, NULL), "Say \"2024.\"");
    sil_genctl_free(g);
    /* in one piece: "2024. T" ends at the space, "3.14." only after the last '.' */
    g = make(NULL, 0, 1);
    const char *inside[] = { "A", " 3.14. B", NULL };
    feed(g, &r, inside);
    assert_string_equal(sil_genctl_answer(g, NULL), "A 3.14.");
    sil_genctl_free(g);
    /* The budget reached right after "2024." or "3.": the next token decides. */
    g = make(NULL, 0, 2);
    const char *at_budget[] = { "In", " 2024.", " Then", " more.", NULL };
    feed(g, &r, at_budget);
    assert_int_equal(r.reason, SIL_STOP_LENGTH);
    assert_int_equal(r.n_pushed, 3);
    assert_string_equal(sil_genctl_answer(g, NULL), "In 2024.");
    sil_genctl_free(g);
    g = make(NULL, 0, 2);
    const char *pi_budget[] = { "pi", " 3.", "14", " is", " it.", " no", NULL };
    feed(g, &r, pi_budget);
    assert_int_equal(r.n_pushed, 5);
    assert_string_equal(sil_genctl_answer(g, NULL), "pi 3.14 is it.");
    sil_genctl_free(g);

    /* Without a sentence end the grace stops after grace_tokens extra tokens. */
    struct sil_genctl_params p;
    sil_genctl_params_default(&p);
    p.max_tokens = 2;
    p.grace_tokens = 3;
    assert_int_equal(sil_genctl_new(&g, &p), 0);
    const char *words[] = { "a", " b", " c", " d", " e", " f", " g", NULL };
    feed(g, &r, words);
    assert_int_equal(r.reason, SIL_STOP_LENGTH);
    assert_int_equal(r.n_pushed, 5);
    assert_string_equal(sil_genctl_answer(g, NULL), "a b c d e");
    sil_genctl_free(g);

    /* grace_tokens 0: a hard cut. */
    p.grace_tokens = 0;
    assert_int_equal(sil_genctl_new(&g, &p), 0);
    feed(g, &r, words);
    assert_int_equal(r.n_pushed, 2);
    assert_string_equal(sil_genctl_answer(g, NULL), "a b");
    sil_genctl_free(g);
}

/* The repair suffix of text, in a static buffer. */
static const char *repair(const char *text)
{
    static char fix[256];
    size_t n = sil_markdown_fence_repair(text, strlen(text), fix, sizeof fix);
    assert_int_equal(n, strlen(fix));
    assert_int_equal(sil_markdown_fence_repair(text, strlen(text), NULL, 0), n);
    return fix;
}

/* n copies of c. */
static const char *run_of(char c, int n)
{
    static char s[4][256];
    static int k;
    char *r = s[k++ % 4];
    memset(r, c, (size_t)n);
    r[n] = 0;
    return r;
}

static void test_markdown_repair(void **state)
{
    assert_string_equal(repair("text\n```c\nint x;\n```\nafter"), "");
    assert_string_equal(repair("text\n```c\nint x;"), "\n```");
    assert_string_equal(repair("```\ncode\n"), "```");
    /* A four-backtick fence is not closed by three, nor by a fence with an info string. */
    assert_string_equal(repair("````md\n```\ninner\n```python\n"), "````");
    /* Inline backticks and indented code are not fences. */
    assert_string_equal(repair("use ```x``` here\n    ```\n"), "");
    /* nor is a backtick line whose info string holds a backtick (it is inline code) */
    assert_string_equal(repair("``` a`b\ntext"), "");
    /* A closer may have trailing blanks and up to 3 spaces before it, not 4. */
    assert_string_equal(repair("```\nx\n   ```  \t\r\n"), "");
    assert_string_equal(repair("```\nx\n    ```\n"), "```");

    /* ~~~ fences: closed only by ~~~ (at least as many), and ``` inside them is content. */
    assert_string_equal(repair("~~~\ncode"), "\n~~~");
    assert_string_equal(repair("~~~~ info `with` ticks\n~~~\n```\n"), "~~~~");
    assert_string_equal(repair("~~~\ncode\n~~~~~\nafter ~~~"), "");
    assert_string_equal(repair("```\ncode\n~~~\n"), "```");
    assert_string_equal(repair("~~~\ncode\n```\n"), "~~~");
    assert_string_equal(repair("~~\n``\n"), "");

    /* An opener of any length gets a closer as long (a 38-tick cap used to leave 39+ open). */
    for (int n = 37; n <= 200; n += 163 == n ? 37 : 1) {
        char text[512];
        snprintf(text, sizeof text, "%s\nbody\n", run_of('`', n));
        assert_string_equal(repair(text), run_of('`', n));
        snprintf(text, sizeof text, "%s\nbody\n%s\n", run_of('`', n), run_of('`', n - 1));
        assert_string_equal(repair(text), run_of('`', n));
        snprintf(text, sizeof text, "%s\nbody\n%s\n", run_of('~', n), run_of('~', n));
        assert_string_equal(repair(text), "");
    }
    /* snprintf-style: a short buffer gets what fits and a NUL, the length is the whole suffix */
    char small[4];
    assert_int_equal(sil_markdown_fence_repair("`````\nx", 7, small, sizeof small), 6);
    assert_string_equal(small, "\n``");

    /* In a generation the fix is streamed at the end and is part of the answer. */
    struct sil_genctl *g = make(NULL, 0, 0);
    const char *pieces[] = { "```", "python\n", "print(1)", NULL };
    struct run r;
    feed(g, &r, pieces);
    assert_int_equal(r.reason, SIL_STOP_EOS);
    assert_string_equal(sil_genctl_answer(g, NULL), "```python\nprint(1)\n```");
    assert_string_equal(r.streamed_answer, "```python\nprint(1)\n```");
    sil_genctl_free(g);

    struct sil_genctl_params p;
    sil_genctl_params_default(&p);
    p.repair_markdown = false;
    assert_int_equal(sil_genctl_new(&g, &p), 0);
    feed(g, &r, pieces);
    assert_string_equal(sil_genctl_answer(g, NULL), "```python\nprint(1)");
    sil_genctl_free(g);

    /* ~~~ and a 50-backtick opener in a generation */
    g = make(NULL, 0, 0);
    const char *tilde[] = { "~~~", "\nx = 1", NULL };
    feed(g, &r, tilde);
    assert_string_equal(sil_genctl_answer(g, NULL), "~~~\nx = 1\n~~~");
    assert_string_equal(r.streamed_answer, "~~~\nx = 1\n~~~");
    sil_genctl_free(g);
    g = make(NULL, 0, 0);
    const char *long_fence[] = { run_of('`', 50), "\ncode\n", NULL };
    feed(g, &r, long_fence);
    char want[128];
    snprintf(want, sizeof want, "%s\ncode\n%s", run_of('`', 50), run_of('`', 50));
    assert_string_equal(sil_genctl_answer(g, NULL), want);
    assert_string_equal(r.streamed_answer, want);
    sil_genctl_free(g);
}

static void test_finish_reasons(void **state)
{
    struct sil_genctl *g = make(NULL, 0, 0);
    struct sil_genctl_out o;
    assert_int_equal(sil_genctl_push(g, TOK, "x", 1, &o), 0);
    assert_int_equal(sil_genctl_finish(g, SIL_STOP_CANCELLED, &o), SIL_STOP_CANCELLED);
    /* A second finish or push changes nothing. */
    assert_int_equal(sil_genctl_finish(g, SIL_STOP_EOS, &o), SIL_STOP_CANCELLED);
    assert_int_equal(o.n_answer, 0);
    assert_int_equal(sil_genctl_push(g, TOK, "y", 1, &o), SIL_STOP_CANCELLED);
    assert_string_equal(sil_genctl_answer(g, NULL), "x");
    assert_string_equal(sil_stop_reason_name(SIL_STOP_SHUTDOWN), "shutdown");
    assert_string_equal(sil_stop_reason_name(SIL_STOP_LENGTH), "length");
    assert_string_equal(sil_stop_reason_name(SIL_STOP_CONTEXT), "context");
    sil_genctl_free(g);
}

/* Text without a token (the detokenizer's last held bytes, as U+FFFD) joins the text unless a stop
 * string or a sentence end cut it; it counts no token. */
static void test_push_text(void **state)
{
    struct sil_genctl_out o;
    /* a hard budget cut (no grace): the text is the last token's, kept */
    struct sil_genctl_params p;
    sil_genctl_params_default(&p);
    p.max_tokens = 2;
    p.grace_tokens = 0;
    struct sil_genctl *g;
    assert_int_equal(sil_genctl_new(&g, &p), 0);
    assert_int_equal(sil_genctl_push(g, TOK, "a", 1, &o), SIL_STOP_NONE);
    assert_int_equal(sil_genctl_push(g, TOK, " b", 2, &o), SIL_STOP_LENGTH);
    assert_int_equal(sil_genctl_push_text(g, "\xef\xbf\xbd", 3, &o), SIL_STOP_LENGTH);
    assert_int_equal(o.n_answer, 3);
    assert_memory_equal(o.answer, "\xef\xbf\xbd", 3);
    assert_int_equal(sil_genctl_finish(g, SIL_STOP_EOS, &o), SIL_STOP_LENGTH);
    assert_string_equal(sil_genctl_answer(g, NULL), "a b\xef\xbf\xbd");
    assert_int_equal(sil_genctl_n_answer_tokens(g), 2);
    /* after finish: ignored */
    assert_int_equal(sil_genctl_push_text(g, "x", 1, &o), SIL_STOP_LENGTH);
    assert_int_equal(o.n_answer, 0);
    assert_string_equal(sil_genctl_answer(g, NULL), "a b\xef\xbf\xbd");
    sil_genctl_free(g);

    /* a stop string matched: what follows it is dropped */
    const char *stop[] = {"END"};
    g = make(stop, 1, 0);
    assert_int_equal(sil_genctl_push(g, TOK, "xEND", 4, &o), SIL_STOP_STOP);
    assert_int_equal(sil_genctl_push_text(g, "\xef\xbf\xbd", 3, &o), SIL_STOP_STOP);
    assert_int_equal(o.n_answer, 0);
    sil_genctl_finish(g, SIL_STOP_EOS, &o);
    assert_string_equal(sil_genctl_answer(g, NULL), "x");
    sil_genctl_free(g);

    /* the text may complete a stop string (held back until then) */
    g = make(stop, 1, 0);
    assert_int_equal(sil_genctl_push(g, TOK, "yEN", 3, &o), SIL_STOP_NONE);
    assert_int_equal(sil_genctl_push_text(g, "D!", 2, &o), SIL_STOP_STOP);
    sil_genctl_finish(g, SIL_STOP_EOS, &o);
    assert_string_equal(sil_genctl_answer(g, NULL), "y");
    sil_genctl_free(g);

    /* a sentence end in the grace tokens cut the text: dropped */
    g = make(NULL, 0, 1);
    assert_int_equal(sil_genctl_push(g, TOK, "Hi", 2, &o), SIL_STOP_NONE);
    assert_int_equal(sil_genctl_push(g, TOK, " there.", 7, &o), SIL_STOP_LENGTH);
    assert_int_equal(sil_genctl_push_text(g, "\xef\xbf\xbd", 3, &o), SIL_STOP_LENGTH);
    sil_genctl_finish(g, SIL_STOP_EOS, &o);
    assert_string_equal(sil_genctl_answer(g, NULL), "Hi there.");
    sil_genctl_free(g);

    /* in reasoning it is reasoning; an open fence is still repaired after it */
    sil_genctl_params_default(&p);
    p.think_open = THINK_OPEN;
    p.think_close = THINK_CLOSE;
    p.in_reasoning = true;
    assert_int_equal(sil_genctl_new(&g, &p), 0);
    assert_int_equal(sil_genctl_push(g, TOK, "hmm", 3, &o), SIL_STOP_NONE);
    assert_int_equal(sil_genctl_push_text(g, "\xef\xbf\xbd", 3, &o), SIL_STOP_NONE);
    assert_int_equal(o.n_reasoning, 3);
    assert_int_equal(sil_genctl_push(g, THINK_CLOSE, "", 0, &o), SIL_STOP_NONE);
    assert_int_equal(sil_genctl_push(g, TOK, "```c\nx", 6, &o), SIL_STOP_NONE);
    assert_int_equal(sil_genctl_push_text(g, "\xef\xbf\xbd", 3, &o), SIL_STOP_NONE);
    sil_genctl_finish(g, SIL_STOP_EOS, &o);
    assert_string_equal(sil_genctl_reasoning(g, NULL), "hmm\xef\xbf\xbd");
    assert_string_equal(sil_genctl_answer(g, NULL), "```c\nx\xef\xbf\xbd\n```");
    assert_int_equal(sil_genctl_n_reasoning_tokens(g), 2);
    assert_int_equal(sil_genctl_n_answer_tokens(g), 1);
    sil_genctl_free(g);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_across_tokens),
        cmocka_unit_test(test_push_text),
        cmocka_unit_test(test_stop_prefix_released),
        cmocka_unit_test(test_stop_within_one_token),
        cmocka_unit_test(test_bad_params),
        cmocka_unit_test(test_leading_blanks_kept),
        cmocka_unit_test(test_thinking_budget),
        cmocka_unit_test(test_thinking_zero_and_model_opened),
        cmocka_unit_test(test_stop_strings_ignore_reasoning),
        cmocka_unit_test(test_budget_on_sentence_end),
        cmocka_unit_test(test_grace_finishes_sentence),
        cmocka_unit_test(test_grace_decimal_and_limit),
        cmocka_unit_test(test_markdown_repair),
        cmocka_unit_test(test_finish_reasons),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
