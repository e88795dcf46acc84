/* sil-chat: ask siliceod a question (one-shot, from a pipe, or in a REPL), streaming the answer.
 * See sil-chat(1). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <locale.h>
#include <getopt.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <editline/readline.h>

#include "client/common/common.h"

#define PROG "sil-chat"
#define MAX_STDIN (8u << 20)
#define MAX_TURNS 256
#define SIL_SESSION_NAME_BUF 256
/* A pasted block arrives at once: input already waiting this long after a line is more of it. */
#define PASTE_MS 30

/* Set by the signal handler: SIGINT cancels the answer or the line being typed; SIGTERM and
 * SIGHUP end the REPL after it saved its history and dropped its private session. */
static volatile sig_atomic_t interrupted, terminating;

static void on_signal(int sig)
{
    if (sig == SIGINT)
        interrupted = 1;
    else
        terminating = sig;
}

struct turn {
    const char *role;
    char *content;
};

struct opts {
    const char *socket;
    const char *system;
    bool from_stdin, json, raw;
    bool stats;         /* --verbose, /stats on: prompt and decode speed after each answer */
    bool append;        /* chat continues the daemon's transcript of the -S session */
    bool list_sessions; /* --sessions */
    bool list_models;   /* --models */
    const char *drop;   /* --drop NAME */
    int show_reasoning; /* -1 auto (on a tty), 0 hide, 1 show */
    int timeout_s;
    struct sil_client_gen gen;
};

/* What the daemon reports of one answer, for --verbose and /stats. */
struct answer_stats {
    bool valid;
    int64_t n_prompt, n_cached, n_generated;
    int64_t n_dropped; /* oldest messages of the conversation the daemon left out */
    double prefill_ms, prefill_tok_s, decode_ms, decode_tok_s;
};

struct stream {
    bool tty, dim, show_reasoning;
    bool in_reasoning; /* the dim attribute is on */
    bool printed_any;
    char last;         /* last answer byte written, to end with a newline */
    struct sil_rpc_client *c;
    bool cancel_sent;
    /* stderr is a terminal: the daemon is asked for progress notifications, shown as one line
     * (progress_len columns now, 0 when none) that the first piece of the answer erases */
    bool progress;
    bool answering; /* a piece of the answer came: no more progress lines */
    int progress_len;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [OPTIONS] [QUESTION...]\n"
            "Ask siliceod a question and stream the answer. Without a question and with a\n"
            "terminal on stdin, starts an interactive session.\n"
            "\n"
            "  -m, --model NAME           the model to ask (a name --models lists); the\n"
            "                             daemon loads it if another is loaded (default: the\n"
            "                             loaded one)\n"
            "      --models               list the models the daemon can load\n"
            "  -s, --stdin                read stdin as context; the question is the\n"
            "                             instruction\n"
            "  -S, --session NAME         keep the conversation in the daemon under NAME:\n"
            "                             each call continues it\n"
            "      --sessions             list your sessions\n"
            "      --drop NAME            drop session NAME\n"
            "      --system TEXT          system prompt\n"
            "      --think / --no-think   let the model reason first, or not\n"
            "      --hide-reasoning       do not print the reasoning (default off a terminal)\n"
            "      --show-reasoning       print the reasoning even off a terminal\n"
            "      --raw                  send QUESTION as a raw prompt (generate, no\n"
            "                             template)\n"
            "      --json                 print the final result as JSON instead of streaming\n"
            "  -v, --verbose              after each answer, the prompt and decode speed on\n"
            "                             stderr\n"
            "  -n, --max-tokens N         answer budget: N tokens, then up to --grace more to\n"
            "                             end the sentence\n"
            "      --grace N              tokens past the budget to end a sentence, 0 to 64\n"
            "                             (default 64; 0: -n is a hard cap)\n"
            "      --max-thinking-tokens N  reasoning budget (-1: none)\n"
            "  -t, --temperature X        sampling temperature (0: greedy)\n"
            "      --top-k N  --top-p X   --min-p X  --repeat-penalty X  --presence-penalty X\n"
            "      --seed N               sampling seed\n"
            "      --stop STRING          stop string (repeatable, up to 16)\n"
            "      --priority P           interactive, normal or batch\n"
            "      --timeout SECONDS      give up after this long (default: none)\n"
            "      --socket PATH          daemon socket (default: $SILICEO_SOCKET, then the\n"
            "                             per-user or system socket)\n"
            "  -h, --help                 this help\n"
            "  -V, --version              version\n");
}

enum {
    O_SYSTEM = 256, O_GRACE, O_THINK, O_NO_THINK, O_HIDE, O_SHOW, O_RAW, O_JSON, O_MAXTHINK, O_TOPK,
    O_TOPP, O_MINP, O_REPEAT, O_PRESENCE, O_SEED, O_STOP, O_PRIORITY, O_TIMEOUT, O_SOCKET,
    O_SESSIONS, O_DROP, O_MODELS,
};

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        {"model", required_argument, 0, 'm'},
        {"models", no_argument, 0, O_MODELS},
        {"stdin", no_argument, 0, 's'},
        {"session", required_argument, 0, 'S'},
        {"sessions", no_argument, 0, O_SESSIONS},
        {"drop", required_argument, 0, O_DROP},
        {"system", required_argument, 0, O_SYSTEM},
        {"think", no_argument, 0, O_THINK},
        {"no-think", no_argument, 0, O_NO_THINK},
        {"hide-reasoning", no_argument, 0, O_HIDE},
        {"show-reasoning", no_argument, 0, O_SHOW},
        {"raw", no_argument, 0, O_RAW},
        {"json", no_argument, 0, O_JSON},
        {"verbose", no_argument, 0, 'v'},
        {"max-tokens", required_argument, 0, 'n'},
        {"max-thinking-tokens", required_argument, 0, O_MAXTHINK},
        {"grace", required_argument, 0, O_GRACE},
        {"temperature", required_argument, 0, 't'},
        {"top-k", required_argument, 0, O_TOPK},
        {"top-p", required_argument, 0, O_TOPP},
        {"min-p", required_argument, 0, O_MINP},
        {"repeat-penalty", required_argument, 0, O_REPEAT},
        {"presence-penalty", required_argument, 0, O_PRESENCE},
        {"seed", required_argument, 0, O_SEED},
        {"stop", required_argument, 0, O_STOP},
        {"priority", required_argument, 0, O_PRIORITY},
        {"timeout", required_argument, 0, O_TIMEOUT},
        {"socket", required_argument, 0, O_SOCKET},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    long l;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "+:m:sS:n:t:vhV", lo, NULL)) != -1) {
        switch (c) {
        case 'm':
            if (!optarg[0]) {
                sil_client_usage_error(PROG, "--model: expected a model name (see --models)");
                return -1;
            }
            o->gen.model = optarg;
            break;
        case O_MODELS: o->list_models = true; break;
        case 's': o->from_stdin = true; break;
        case 'S': o->gen.session = optarg; break;
        case O_SYSTEM: o->system = optarg; break;
        case O_THINK: o->gen.think = 1; break;
        case O_NO_THINK: o->gen.think = 0; break;
        case O_HIDE: o->show_reasoning = 0; break;
        case O_SHOW: o->show_reasoning = 1; break;
        case O_RAW: o->raw = true; break;
        case O_JSON: o->json = true; break;
        case 'v': o->stats = true; break;
        case 'n':
            if (sil_client_parse_long(PROG, "--max-tokens", optarg, 1, 10000000, &o->gen.max_tokens) < 0)
                return -1;
            break;
        case O_GRACE:
            if (sil_client_parse_long(PROG, "--grace", optarg, 0, 64, &o->gen.grace_tokens) < 0)
                return -1;
            break;
        case O_MAXTHINK:
            if (sil_client_parse_long(PROG, "--max-thinking-tokens", optarg, -1, 10000000,
                                      &o->gen.max_thinking_tokens) < 0)
                return -1;
            break;
        case 't':
            if (sil_client_parse_double(PROG, "--temperature", optarg, 0, 100, &o->gen.temperature) < 0)
                return -1;
            break;
        case O_TOPK:
            if (sil_client_parse_long(PROG, "--top-k", optarg, 0, 1000000, &o->gen.top_k) < 0)
                return -1;
            break;
        case O_TOPP:
            if (sil_client_parse_double(PROG, "--top-p", optarg, 0, 1, &o->gen.top_p) < 0)
                return -1;
            break;
        case O_MINP:
            if (sil_client_parse_double(PROG, "--min-p", optarg, 0, 1, &o->gen.min_p) < 0)
                return -1;
            break;
        case O_REPEAT:
            if (sil_client_parse_double(PROG, "--repeat-penalty", optarg, 0, 100, &o->gen.repeat_penalty) < 0)
                return -1;
            break;
        case O_PRESENCE:
            if (sil_client_parse_double(PROG, "--presence-penalty", optarg, -100, 100,
                                        &o->gen.presence_penalty) < 0)
                return -1;
            break;
        case O_SEED:
            if (sil_client_parse_long(PROG, "--seed", optarg, 0, LONG_MAX, &l) < 0)
                return -1;
            o->gen.seed = l;
            break;
        case O_STOP:
            if (o->gen.n_stop >= 16) {
                sil_client_warn(PROG, "--stop: at most 16 stop strings");
                return -1;
            }
            o->gen.stop[o->gen.n_stop++] = optarg;
            break;
        case O_PRIORITY:
            if (strcmp(optarg, "interactive") && strcmp(optarg, "normal") && strcmp(optarg, "batch")) {
                sil_client_warn(PROG, "--priority: interactive, normal or batch");
                return -1;
            }
            o->gen.priority = optarg;
            break;
        case O_TIMEOUT:
            if (sil_client_parse_long(PROG, "--timeout", optarg, 0, 86400 * 365, &l) < 0)
                return -1;
            o->timeout_s = (int)l;
            break;
        case O_SOCKET: o->socket = optarg; break;
        case O_SESSIONS: o->list_sessions = true; break;
        case O_DROP: o->drop = optarg; break;
        case 'h': usage(stdout); exit(0);
        case 'V': sil_client_version(PROG); exit(0);
        default: sil_client_bad_option(PROG, c, argc, argv, lo); return -1;
        }
    }
    return optind;
}

/* Joins argv words with spaces (malloc'd), NULL when there are none. */
static char *join_args(int argc, char **argv)
{
    size_t n = 0;
    for (int i = 0; i < argc; i++)
        n += strlen(argv[i]) + 1;
    if (n == 0)
        return NULL;
    char *s = malloc(n);
    if (!s)
        return NULL;
    s[0] = 0;
    for (int i = 0; i < argc; i++) {
        if (i)
            strcat(s, " ");
        strcat(s, argv[i]);
    }
    return s;
}

static void dim(struct stream *st, bool on)
{
    if (st->dim && st->in_reasoning != on)
        fputs(on ? "\033[2m" : "\033[0m", stdout);
    st->in_reasoning = on;
}

/* Model text: escaped on a terminal, the bytes as they are into a pipe or file. */
static void emit(const struct stream *st, const char *s, size_t n)
{
    if (st->tty)
        sil_client_write_tty(stdout, s, n);
    else
        fwrite(s, 1, n, stdout);
}

/* v with a comma between each group of three digits ("3,492"). */
static const char *group_digits(uint64_t v, char buf[32])
{
    char digits[24];
    int n = snprintf(digits, sizeof digits, "%" PRIu64, v), k = 0;
    for (int i = 0; i < n; i++) {
        if (i > 0 && (n - i) % 3 == 0)
            buf[k++] = ',';
        buf[k++] = digits[i];
    }
    buf[k] = 0;
    return buf;
}

/* Clears the progress line's row and leaves the cursor at its start: the whole row, for what
 * the terminal echoed after the line (^C), or blanks over the line on a dumb terminal. */
static void progress_erase(struct stream *st)
{
    if (st->progress_len == 0)
        return;
    const char *term = getenv("TERM");
    if (term && strcmp(term, "dumb") != 0)
        fputs("\r\033[K", stderr);
    else
        fprintf(stderr, "\r%*s\r", st->progress_len, "");
    st->progress_len = 0;
    fflush(stderr);
}

/* A "progress" notification: how much of the prompt the daemon has read. Shown only while the
 * prompt is not done; figures that make no sense are ignored. */
static void on_progress(struct stream *st, const msgpack_object *p)
{
    const int64_t n_prompt = sil_rpc_map_int(p, "n_prompt", -1),
                  n_cached = sil_rpc_map_int(p, "n_cached", -1),
                  done = sil_rpc_map_int(p, "n_evaluated", -1);
    if (!st->progress || st->answering || n_prompt <= 0 || n_cached < 0 || n_cached >= n_prompt ||
        done < 0 || done > n_prompt - n_cached)
        return;
    const int64_t total = n_prompt - n_cached;
    if (done == total && st->progress_len == 0)
        return; /* done at once: nothing to wait for */
    char a[32], b[32], c[32], cached[64] = "", line[160];
    if (n_cached > 0)
        snprintf(cached, sizeof cached, " (%s cached)", group_digits((uint64_t)n_cached, c));
    int n = snprintf(line, sizeof line, "reading the prompt: %s / %s tokens%s",
                     group_digits((uint64_t)done, a), group_digits((uint64_t)total, b), cached);
    /* one row: a line that wrapped could not be taken back with a carriage return */
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 && n >= ws.ws_col) {
        n = ws.ws_col - 1;
        line[n] = 0;
    }
    /* a shorter line than the last leaves no characters of it behind */
    fprintf(stderr, "\r%s%*s", line, st->progress_len > n ? st->progress_len - n : 0, "");
    if (st->progress_len < n)
        st->progress_len = n;
    fflush(stderr);
}

static int on_msg(void *ud, const struct sil_rpc_msg *m)
{
    struct stream *st = ud;
    /* Asked on every message, not only when a wait is interrupted: a Ctrl-C that lands while
     * tokens are being written interrupts no wait. */
    if ((interrupted || terminating) && st && !st->cancel_sent) {
        st->cancel_sent = true;
        struct sil_rpc_error e;
        if (sil_rpc_client_cancel(st->c, &e) < 0)
            return -EINTR;
    }
    if (!m)
        return 0;
    if (m->type != SIL_RPC_NOTIFICATION || !st)
        return 0;
    if (strcmp(m->method, "progress") == 0) {
        on_progress(st, m->params);
        return 0;
    }
    if (strcmp(m->method, "token") != 0)
        return 0;
    st->answering = true;
    progress_erase(st);
    const char *s;
    size_t n;
    if (st->show_reasoning &&
        sil_rpc_get_str(m->params, "reasoning", &s, &n, SIL_RPC_OPTIONAL, NULL) == 1 && n > 0) {
        dim(st, true);
        emit(st, s, n);
        st->printed_any = true;
        st->last = s[n - 1];
    }
    if (sil_rpc_get_str(m->params, "text", &s, &n, SIL_RPC_OPTIONAL, NULL) == 1 && n > 0) {
        if (st->in_reasoning) {
            dim(st, false);
            if (st->last != '\n')
                fputc('\n', stdout);
            fputc('\n', stdout);
        }
        emit(st, s, n);
        st->printed_any = true;
        st->last = s[n - 1];
    }
    fflush(stdout);
    return 0;
}

static void read_stats(const msgpack_object *res, struct answer_stats *st)
{
    const msgpack_object *t = sil_rpc_map_get(res, "timings");
    *st = (struct answer_stats){
        .valid = true,
        .n_prompt = sil_rpc_map_int(res, "n_prompt", 0),
        .n_cached = sil_rpc_map_int(res, "n_cached", 0),
        .n_generated = sil_rpc_map_int(res, "n_generated", 0),
        .n_dropped = sil_rpc_map_int(res, "dropped_messages", 0),
        .prefill_ms = sil_rpc_map_double(t, "prefill_ms", 0),
        .prefill_tok_s = sil_rpc_map_double(t, "prefill_tok_s", 0),
        .decode_ms = sil_rpc_map_double(t, "decode_ms", 0),
        .decode_tok_s = sil_rpc_map_double(t, "decode_tok_s", 0),
    };
}

/* One line on stderr, so a pipe still receives the answer only. The prompt's speed counts the
 * tokens evaluated, not those the session or the prefix cache already held. */
static void print_stats(const struct answer_stats *st)
{
    if (!st->valid) {
        fprintf(stderr, "no answer yet\n");
        return;
    }
    fprintf(stderr,
            "prompt %" PRId64 " tokens (%" PRId64 " cached, %" PRId64 " evaluated at %.1f tok/s in "
            "%.2f s), answer %" PRId64 " tokens at %.1f tok/s in %.2f s\n",
            st->n_prompt, st->n_cached, st->n_prompt - st->n_cached, st->prefill_tok_s,
            st->prefill_ms / 1e3, st->n_generated, st->decode_tok_s, st->decode_ms / 1e3);
}

/* Sends one request (chat or generate); streams or prints JSON; returns the exit status and,
 * for the REPL, a copy of the answer text in *answer and the daemon's figures in *stats. */
static int ask(struct sil_rpc_client *c, const struct opts *o, const struct turn *turns, int n_turns,
               const char *raw_prompt, char **answer, struct answer_stats *stats)
{
    struct stream st = {.c = c};
    st.tty = isatty(STDOUT_FILENO);
    st.dim = st.tty && !getenv("NO_COLOR");
    st.show_reasoning = o->show_reasoning < 0 ? st.tty : o->show_reasoning;
    st.last = '\n';
    st.progress = !o->json && isatty(STDERR_FILENO);

    msgpack_packer *pk = sil_rpc_client_begin(c, raw_prompt ? "generate" : "chat");
    struct sil_client_gen gen = o->gen;
    if (raw_prompt)
        gen.think = -1; /* chat only */
    const bool append = o->append && !raw_prompt;
    msgpack_pack_map(pk, 1 + append + st.progress + sil_client_gen_count(&gen));
    if (append)
        sil_rpc_kv_bool(pk, "append", true);
    if (st.progress)
        sil_rpc_kv_bool(pk, "progress", true);
    if (raw_prompt) {
        sil_rpc_kv_str(pk, "prompt", raw_prompt);
    } else {
        sil_rpc_pack_cstr(pk, "messages");
        msgpack_pack_array(pk, (uint32_t)n_turns);
        for (int i = 0; i < n_turns; i++) {
            msgpack_pack_map(pk, 2);
            sil_rpc_kv_str(pk, "role", turns[i].role);
            sil_rpc_kv_str(pk, "content", turns[i].content);
        }
    }
    sil_client_pack_gen(pk, &gen);

    struct sigaction sa = {.sa_handler = on_signal}, old; /* no SA_RESTART: poll wakes up */
    sigemptyset(&sa.sa_mask);
    interrupted = 0;
    sigaction(SIGINT, &sa, &old);
    const msgpack_object *res = NULL;
    struct sil_rpc_error e = {0};
    int r = sil_rpc_client_call(c, o->json ? NULL : on_msg, o->json ? NULL : &st, &res, &e);
    sigaction(SIGINT, &old, NULL);
    progress_erase(&st); /* no answer came: an error, a cancel */
    dim(&st, false);
    if (!o->json && st.printed_any && st.last != '\n')
        fputc('\n', stdout);
    fflush(stdout);
    if (r < 0) {
        if (r == -EREMOTEIO)
            sil_client_warn(PROG, "%s (error %d, %s)", e.msg, e.code, sil_rpc_code_name(e.code));
        else
            sil_client_warn(PROG, "%s", e.msg[0] ? e.msg : strerror(-r));
        return SIL_EXIT_ERROR;
    }
    if (o->json) {
        sil_rpc_print_json(stdout, res, 2);
        fputc('\n', stdout);
    }
    struct answer_stats figures;
    read_stats(res, &figures);
    if (stats)
        *stats = figures;
    if (o->stats)
        print_stats(&figures);
    char reason[32], msg[256];
    sil_rpc_map_str(res, "stop_reason", reason, sizeof(reason), "");
    if (answer) {
        const char *s;
        size_t n;
        *answer = NULL;
        if (sil_rpc_get_str(res, "text", &s, &n, SIL_RPC_OPTIONAL, NULL) == 1)
            *answer = strndup(s, n);
    }
    if (strcmp(reason, "error") == 0) {
        sil_client_warn(PROG, "generation failed: %s", sil_rpc_map_str(res, "error", msg, sizeof(msg), "unknown error"));
        return SIL_EXIT_ERROR;
    }
    if (strcmp(reason, "cancelled") == 0 || strcmp(reason, "shutdown") == 0) {
        if (!o->json)
            fprintf(stderr, "[%s]\n", reason);
        return interrupted || terminating ? 130 : SIL_EXIT_ERROR;
    }
    if (figures.n_dropped > 0)
        sil_client_warn(PROG,
                        "the conversation no longer fitted the daemon's context: its %" PRId64
                        " oldest messages were dropped (the system prompt stays)",
                        figures.n_dropped);
    if (strcmp(reason, "context") == 0) {
        const char *s;
        size_t n = 0;
        sil_rpc_get_str(res, "text", &s, &n, SIL_RPC_OPTIONAL, NULL);
        if (n == 0) {
            sil_client_warn(PROG,
                            "no answer: the daemon's context filled up after %" PRId64
                            " prompt and %" PRId64 " generated tokens%s",
                            figures.n_prompt, figures.n_generated,
                            o->append ? "; --drop the session to start over" : "");
            return SIL_EXIT_ERROR;
        }
        sil_client_warn(PROG,
                        "the answer was cut: the daemon's context is full (%" PRId64
                        " prompt and %" PRId64 " generated tokens)",
                        figures.n_prompt, figures.n_generated);
    }
    return SIL_EXIT_OK;
}

/* sessions.list: *out the caller's sessions (an array inside the result, valid until the
 * next call) or NULL on error (printed). */
static const msgpack_object *list_sessions(struct sil_rpc_client *c)
{
    msgpack_packer *pk = sil_rpc_client_begin(c, "sessions.list");
    msgpack_pack_map(pk, 0);
    const msgpack_object *res = NULL, *arr = NULL;
    struct sil_rpc_error e = {0};
    if (sil_rpc_client_call(c, NULL, NULL, &res, &e) < 0 ||
        sil_rpc_get_array(res, "sessions", &arr, SIL_RPC_REQUIRED, &e) < 0) {
        sil_client_warn(PROG, "sessions.list: %s", e.msg);
        return NULL;
    }
    return arr;
}

/* Messages the daemon holds for session name: 0 when it is new (or unknown). */
static int64_t session_messages(struct sil_rpc_client *c, const char *name)
{
    const msgpack_object *arr = list_sessions(c);
    char buf[SIL_SESSION_NAME_BUF];
    for (uint32_t i = 0; arr && i < arr->via.array.size; i++) {
        const msgpack_object *s = &arr->via.array.ptr[i];
        if (strcmp(sil_rpc_map_str(s, "name", buf, sizeof buf, ""), name) == 0 &&
            sil_rpc_map_int(s, "uid", -1) == (int64_t)getuid())
            return sil_rpc_map_int(s, "messages", 0);
    }
    return 0;
}

/* sessions.drop; a session that is not there is no error. */
static int forget_session(struct sil_rpc_client *c, const char *name)
{
    msgpack_packer *pk = sil_rpc_client_begin(c, "sessions.drop");
    msgpack_pack_map(pk, 1);
    sil_rpc_kv_str(pk, "name", name);
    struct sil_rpc_error e = {0};
    if (sil_rpc_client_call(c, NULL, NULL, NULL, &e) < 0 && e.code != SIL_RPC_E_NOT_FOUND) {
        sil_client_warn(PROG, "sessions.drop: %s", e.msg);
        return -EIO;
    }
    return 0;
}

static void free_turns(struct turn *t, int *n, int keep)
{
    for (int i = keep; i < *n; i++)
        free(t[i].content);
    *n = keep;
}

/* Keys the REPL's reader hands editline after a Ctrl-C: end of line, then newline, so the
 * line is shown whole, marked ^C and left behind; repl() drops it. */
static int pending_keys[2], n_pending;
static bool line_cancelled;

/* Reads one character for editline (a UTF-8 sequence as its code point) and turns SIGINT into
 * "abandon this line": editline's own signal handling would kill sil-chat. */
static int repl_getc(FILE *f)
{
    if (n_pending > 0) {
        int k = pending_keys[--n_pending];
        if (k == '\n') {
            fputs("^C", stdout);
            fflush(stdout);
        }
        return k;
    }
    int fd = fileno(f);
    unsigned char b[4];
    int need = 1, have = 0;
    while (have < need) {
        if (terminating)
            return EOF;
        if (interrupted && have == 0) {
            interrupted = 0;
            line_cancelled = true;
            pending_keys[0] = '\n';
            n_pending = 1;
            return 0x05; /* ^E: editline's end of line */
        }
        ssize_t r = read(fd, &b[have], 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return EOF;
        if (have == 0)
            need = b[0] < 0x80 ? 1 : (b[0] & 0xe0) == 0xc0 ? 2 : (b[0] & 0xf0) == 0xe0 ? 3
                 : (b[0] & 0xf8) == 0xf0 ? 4 : 1;
        else if ((b[have] & 0xc0) != 0x80)
            return 0xfffd;
        have++;
    }
    if (need == 1)
        return b[0] < 0x80 ? b[0] : 0xfffd;
    int cp = b[0] & (0x7f >> need);
    for (int i = 1; i < need; i++)
        cp = cp << 6 | (b[i] & 0x3f);
    return cp;
}

/* Is more typed input already waiting (repl_getc reads a byte at a time, so editline keeps none
 * of it)? */
static bool input_waiting(int ms)
{
    struct pollfd p = {.fd = STDIN_FILENO, .events = POLLIN};
    return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

enum { READ_EOF = -1, READ_CANCELLED = 0, READ_OK = 1 };

/* One question: a line, joined (with a newline) to the next while it ends in a backslash, which
 * is dropped, or while more input is already waiting: the lines of a paste arrive at once, and a
 * person does not type the next line within PASTE_MS of Enter. Ctrl-C drops the whole question;
 * end of input sends what was typed. *out is malloc'd. */
static int read_question(char **out)
{
    char *q = NULL;
    size_t len = 0;
    const char *prompt = "> ";
    *out = NULL;
    for (;;) {
        line_cancelled = false;
        char *line = readline(prompt);
        if (!line && !q)
            return READ_EOF;
        if (!line)
            break;
        if (line_cancelled) {
            free(line);
            free(q);
            return READ_CANCELLED;
        }
        size_t n = strlen(line);
        const bool more = n > 0 && line[n - 1] == '\\';
        n -= more;
        char *grown = realloc(q, len + n + 2);
        if (!grown) {
            free(line);
            break;
        }
        q = grown;
        if (len)
            q[len++] = '\n';
        memcpy(q + len, line, n);
        q[len += n] = 0;
        free(line);
        if (!more && !input_waiting(PASTE_MS))
            break;
        prompt = "... ";
    }
    *out = q;
    return READ_OK;
}

static void repl_help(void)
{
    printf("/help           these commands\n"
           "/reset          forget the conversation (a -S session's too)\n"
           "/think on|off   let the model reason before answering, or not\n"
           "/stats on|off   print prompt and decode speed after each answer\n"
           "/stats          the figures of the last answer\n"
           "/quit, /exit    leave (or Ctrl-D)\n"
           "A line ending in \\ goes on on the next line; pasted lines are one question.\n"
           "Ctrl-C abandons the line, or cancels the answer being written.\n");
}

/* The REPL's conversation. A private session is sent whole each turn (the daemon's copy is only
 * what saves evaluating it again); a named one (-S) lives in the daemon, which may hold turns
 * of earlier calls, so only what is new is sent, with append. */
struct convo {
    struct turn t[MAX_TURNS];
    int n, base;  /* turns held here; base: the system prompt's */
    bool named;
    int64_t held; /* messages the daemon holds for the named session */
};

/* Handles a /command; false for /quit. */
static bool repl_command(struct sil_rpc_client *c, struct opts *o, struct convo *cv,
                         const char *cmd, const struct answer_stats *last)
{
    if (!strcmp(cmd, "/quit") || !strcmp(cmd, "/exit"))
        return false;
    if (!strcmp(cmd, "/reset")) {
        free_turns(cv->t, &cv->n, cv->base);
        if (cv->named && forget_session(c, o->gen.session) == 0)
            cv->held = 0;
        printf("conversation cleared\n");
    } else if (!strcmp(cmd, "/think on") || !strcmp(cmd, "/think off")) {
        o->gen.think = !strcmp(cmd, "/think on");
    } else if (!strcmp(cmd, "/stats on") || !strcmp(cmd, "/stats off")) {
        o->stats = !strcmp(cmd, "/stats on");
    } else if (!strcmp(cmd, "/stats")) {
        print_stats(last);
    } else if (!strcmp(cmd, "/help")) {
        repl_help();
    } else {
        printf("unknown command %s; /help lists them\n", cmd);
    }
    return true;
}

/* Asks question q (taken over) in the conversation; the exit status of ask(). */
static int repl_ask(struct sil_rpc_client *c, struct opts *o, struct convo *cv, char *q,
                    struct answer_stats *last)
{
    if (cv->n + 2 > MAX_TURNS)
        free_turns(cv->t, &cv->n, cv->base); /* start over rather than grow without end */
    cv->t[cv->n].role = "user";
    cv->t[cv->n++].content = q;
    /* A named session gets the system prompt only when its conversation starts. */
    const int first = cv->named && cv->held > 0 ? cv->base : 0;
    char *answer = NULL;
    o->append = cv->named;
    int status = ask(c, o, cv->t + first, cv->n - first, NULL, &answer, last);
    if (status == SIL_EXIT_OK && answer) {
        cv->held += cv->n - first + 1 - last->n_dropped;
        cv->t[cv->n].role = "assistant";
        cv->t[cv->n++].content = answer;
        /* The daemon left the oldest turns out (after the system prompt): so does this copy. */
        const int k = (int)(last->n_dropped < cv->n - cv->base ? last->n_dropped : 0);
        if (!cv->named && k > 0) {
            for (int i = cv->base; i < cv->base + k; i++)
                free(cv->t[i].content);
            memmove(cv->t + cv->base, cv->t + cv->base + k, sizeof(*cv->t) * (cv->n - cv->base - k));
            cv->n -= k;
        }
    } else {
        free(answer);
        free(cv->t[--cv->n].content); /* the question goes with its failed answer */
    }
    if (cv->named)
        free_turns(cv->t, &cv->n, cv->base); /* the daemon holds them now */
    return status;
}

static int repl(struct sil_rpc_client *c, struct opts *o)
{
    /* Before editline's first use: it reads our way and leaves the signals to us. */
    rl_catch_signals = 0;
    rl_getc_function = repl_getc;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    char hist[4096] = "";
    if (sil_client_state_path("history", hist, sizeof(hist)) == 0) {
        stifle_history(1000);
        read_history(hist);
    }
    struct convo cv = {0};
    cv.named = o->gen.session != NULL;
    /* Without -S, a private session keeps the conversation evaluated between turns. */
    char auto_session[64] = "";
    if (!cv.named) {
        snprintf(auto_session, sizeof(auto_session), "sil-chat-%ld-%ld", (long)getpid(), (long)time(NULL));
        o->gen.session = auto_session;
    }
    if (o->system) {
        cv.t[cv.n].role = "system";
        cv.t[cv.n++].content = strdup(o->system);
        cv.base = 1;
    }
    printf("siliceo chat; /help for commands, Ctrl-D to quit.\n");
    if (cv.named && (cv.held = session_messages(c, o->gen.session)) > 0)
        printf("continuing session %s: %" PRId64 " messages\n", o->gen.session, cv.held);
    int status = SIL_EXIT_OK;
    struct answer_stats last = {0};
    for (;;) {
        interrupted = 0; /* a Ctrl-C that cancelled the last answer is spent */
        char *q;
        int r = read_question(&q);
        if (r == READ_EOF) {
            fputc('\n', stdout); /* Ctrl-D or a signal: the shell's prompt on a line of its own */
            break;
        }
        if (r == READ_CANCELLED)
            continue;
        char *p = q + strspn(q, " \t\n");
        if (*p == 0) {
            free(q);
            continue;
        }
        add_history(p);
        if (*p == '/' && !strchr(p, '\n')) {
            bool go_on = repl_command(c, o, &cv, p, &last);
            free(q);
            if (!go_on)
                break;
            continue;
        }
        if (p != q)
            memmove(q, p, strlen(p) + 1);
        status = repl_ask(c, o, &cv, q, &last);
        if (terminating)
            break;
        if (status != SIL_EXIT_OK && (c->fd < 0 || status == SIL_EXIT_ERROR)) {
            struct sil_rpc_error e;
            /* the connection may be gone: reconnect for the next turn */
            sil_rpc_client_close(c);
            if (sil_client_connect(c, o->socket, o->timeout_s * 1000, &e) < 0) {
                sil_client_warn(PROG, "%s", e.msg);
                break;
            }
        }
    }
    if (auto_session[0])
        forget_session(c, auto_session);
    free_turns(cv.t, &cv.n, 0);
    if (hist[0])
        write_history(hist);
    if (terminating)
        return 128 + terminating;
    return status == 130 ? SIL_EXIT_OK : status;
}

static int print_sessions(struct sil_rpc_client *c)
{
    const msgpack_object *arr = list_sessions(c);
    if (!arr)
        return SIL_EXIT_ERROR;
    char buf[SIL_SESSION_NAME_BUF];
    printf("%-24s %8s %8s %10s %8s\n", "NAME", "MESSAGES", "TOKENS", "MEMORY", "IDLE");
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *s = &arr->via.array.ptr[i];
        int64_t uid = sil_rpc_map_int(s, "uid", -1);
        printf("%-24s %8lld %8lld %9.1fM %7.0fs%s",
               sil_rpc_map_str(s, "name", buf, sizeof buf, "?"),
               (long long)sil_rpc_map_int(s, "messages", 0),
               (long long)sil_rpc_map_int(s, "n_tokens", 0),
               sil_rpc_map_int(s, "memory", 0) / 1048576.0, sil_rpc_map_double(s, "idle_s", 0),
               sil_rpc_map_bool(s, "busy", false) ? " busy" : "");
        if (uid != (int64_t)getuid())
            printf(" (uid %lld)", (long long)uid); /* the daemon's owner sees everyone's */
        putchar('\n');
    }
    return SIL_EXIT_OK;
}

/* models: one line a model, the loaded one marked. */
static int print_models(struct sil_rpc_client *c)
{
    msgpack_packer *pk = sil_rpc_client_begin(c, "models");
    msgpack_pack_map(pk, 0);
    const msgpack_object *res = NULL, *arr = NULL;
    struct sil_rpc_error e = {0};
    if (sil_rpc_client_call(c, NULL, NULL, &res, &e) < 0 ||
        sil_rpc_get_array(res, "models", &arr, SIL_RPC_REQUIRED, &e) < 0) {
        sil_client_warn(PROG, "models: %s", e.msg);
        return SIL_EXIT_ERROR;
    }
    char name[256], dir[4096];
    if (arr->via.array.size == 0) {
        fprintf(stderr, PROG ": no models in %s\n",
                sil_rpc_map_str(res, "dir", dir, sizeof dir, "(no models directory)"));
        return SIL_EXIT_OK;
    }
    printf("%-40s %10s\n", "NAME", "SIZE");
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *m = &arr->via.array.ptr[i];
        printf("%-40s %9.1fM%s\n", sil_rpc_map_str(m, "name", name, sizeof name, "?"),
               sil_rpc_map_int(m, "size", 0) / 1048576.0,
               sil_rpc_map_bool(m, "loaded", false) ? "  loaded" : "");
    }
    return SIL_EXIT_OK;
}

static int drop_session(struct sil_rpc_client *c, const char *name)
{
    msgpack_packer *pk = sil_rpc_client_begin(c, "sessions.drop");
    msgpack_pack_map(pk, 1);
    sil_rpc_kv_str(pk, "name", name);
    struct sil_rpc_error e = {0};
    if (sil_rpc_client_call(c, NULL, NULL, NULL, &e) < 0) {
        if (e.code == SIL_RPC_E_NOT_FOUND)
            sil_client_warn(PROG, "no session '%s'", name);
        else
            sil_client_warn(PROG, "sessions.drop: %s", e.msg);
        return SIL_EXIT_ERROR;
    }
    return SIL_EXIT_OK;
}

int main(int argc, char **argv)
{
    setlocale(LC_CTYPE, ""); /* editline reads and shows UTF-8 by the locale */
    struct opts o = {.show_reasoning = -1};
    sil_client_gen_init(&o.gen);
    int first = parse_args(argc, argv, &o);
    if (first < 0)
        return SIL_EXIT_USAGE;
    if (o.list_sessions || o.drop || o.list_models) {
        struct sil_rpc_client c;
        struct sil_rpc_error e = {0};
        if (sil_client_connect(&c, o.socket, o.timeout_s * 1000, &e) < 0) {
            sil_client_warn(PROG, "%s", e.msg);
            return SIL_EXIT_ERROR;
        }
        int st = o.drop ? drop_session(&c, o.drop) : SIL_EXIT_OK;
        if (st == SIL_EXIT_OK && o.list_sessions)
            st = print_sessions(&c);
        if (st == SIL_EXIT_OK && o.list_models)
            st = print_models(&c);
        sil_rpc_client_close(&c);
        return st;
    }
    char *question = join_args(argc - first, argv + first);
    char *context = NULL;
    bool stdin_tty = isatty(STDIN_FILENO);
    if (o.from_stdin || (!question && !stdin_tty)) {
        if (stdin_tty)
            fprintf(stderr, PROG ": reading the context from standard input; end it with Ctrl-D\n");
        size_t len;
        int r = sil_client_read_all(stdin, MAX_STDIN, &context, &len);
        if (r < 0) {
            sil_client_warn(PROG, "reading stdin: %s", r == -EFBIG ? "more than 8 MiB" : strerror(-r));
            free(question);
            return SIL_EXIT_ERROR;
        }
    }
    if (context && context[strspn(context, " \t\r\n")] == 0) {
        free(context); /* only blanks: no context */
        context = NULL;
    }
    if (!question && !context && (!stdin_tty || o.from_stdin)) {
        sil_client_warn(PROG, "nothing to ask: no question given and standard input is empty");
        return SIL_EXIT_USAGE;
    }
    /* a question of blanks only ("") is none: with no context there is nothing to send */
    if (question && question[strspn(question, " \t\r\n")] == 0) {
        free(question);
        question = NULL;
        if (!context) {
            sil_client_warn(PROG, "nothing to ask: the question is empty");
            return SIL_EXIT_USAGE;
        }
    }

    struct sil_rpc_client c;
    struct sil_rpc_error e = {0};
    if (sil_client_connect(&c, o.socket, o.timeout_s * 1000, &e) < 0) {
        sil_client_warn(PROG, "%s", e.msg);
        free(question);
        free(context);
        return SIL_EXIT_ERROR;
    }
    int status;
    if (!question && !context) {
        status = repl(&c, &o);
    } else {
        /* context then instruction, separated by a blank line */
        size_t n = (context ? strlen(context) : 0) + (question ? strlen(question) : 0) + 3;
        char *content = malloc(n);
        if (!content) {
            sil_client_warn(PROG, "out of memory");
            return SIL_EXIT_ERROR;
        }
        snprintf(content, n, "%s%s%s", context ? context : "", context && question ? "\n\n" : "",
                 question ? question : "");
        struct turn turns[2];
        int nt = 0;
        /* -S: the daemon keeps the transcript; send only what is new (the system prompt only
         * when the conversation starts). */
        o.append = o.gen.session != NULL && !o.raw;
        if (o.system && !(o.append && session_messages(&c, o.gen.session) > 0))
            turns[nt++] = (struct turn){"system", (char *)o.system};
        turns[nt++] = (struct turn){"user", content};
        status = ask(&c, &o, turns, nt, o.raw ? content : NULL, NULL, NULL);
        free(content);
    }
    sil_rpc_client_close(&c);
    free(question);
    free(context);
    return status;
}
