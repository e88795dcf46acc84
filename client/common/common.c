/* Connecting, option parsing, paths, time and generation parameters for the clients. */
#include "client/common/common.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

int sil_client_connect(struct sil_rpc_client *c, const char *socket_opt, int timeout_ms,
                       struct sil_rpc_error *err)
{
    memset(c, 0, sizeof(*c));
    c->fd = -1;
    int fd = sil_rpc_connect_any(socket_opt, err);
    if (fd < 0)
        return fd;
    int r = sil_rpc_client_init_fd(c, fd, err);
    if (r < 0)
        return r;
    c->timeout_ms = timeout_ms;
    return 0;
}

void sil_client_warn(const char *prog, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void sil_client_version(const char *prog) { printf("%s %s\n", prog, SIL_VERSION); }

int sil_client_parse_long(const char *prog, const char *opt, const char *s, long min, long max,
                          long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end) {
        sil_client_usage_error(prog, "%s: '%s' is not an integer", opt, s);
        return -EINVAL;
    }
    if (v < min || v > max) {
        sil_client_usage_error(prog, "%s: %ld out of range [%ld, %ld]", opt, v, min, max);
        return -EINVAL;
    }
    *out = v;
    return 0;
}

int sil_client_parse_double(const char *prog, const char *opt, const char *s, double min,
                            double max, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || isnan(v)) {
        sil_client_usage_error(prog, "%s: '%s' is not a number", opt, s);
        return -EINVAL;
    }
    if (v < min || v > max) {
        sil_client_usage_error(prog, "%s: %g out of range [%g, %g]", opt, v, min, max);
        return -EINVAL;
    }
    *out = v;
    return 0;
}

int sil_client_parse_list(const char *prog, const char *opt, const char *s, long min, long max,
                          long *out, int max_n)
{
    int n = 0;
    const char *p = s;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char item[32];
        if (len == 0 || len >= sizeof(item)) {
            sil_client_usage_error(prog, "%s: bad list '%s'", opt, s);
            return -EINVAL;
        }
        if (n >= max_n) {
            sil_client_usage_error(prog, "%s: at most %d values", opt, max_n);
            return -EINVAL;
        }
        memcpy(item, p, len);
        item[len] = 0;
        if (sil_client_parse_long(prog, opt, item, min, max, &out[n]) < 0)
            return -EINVAL;
        n++;
        if (!comma)
            return n;
        p = comma + 1;
    }
}

double sil_client_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int mkdir_p(char *path, mode_t mode)
{
    for (char *p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        int r = mkdir(path, mode);
        *p = '/';
        if (r < 0 && errno != EEXIST)
            return -errno;
    }
    if (mkdir(path, mode) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

int sil_client_state_path(const char *file, char *buf, size_t size)
{
    const char *xdg = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (xdg && xdg[0] == '/')
        n = snprintf(buf, size, "%s/siliceo", xdg);
    else if (home && *home)
        n = snprintf(buf, size, "%s/.local/state/siliceo", home);
    else
        return -ENOENT;
    if (n < 0 || (size_t)n >= size)
        return -ENAMETOOLONG;
    int r = mkdir_p(buf, 0700);
    if (r < 0)
        return r;
    size_t used = (size_t)n;
    n = snprintf(buf + used, size - used, "/%s", file);
    if (n < 0 || (size_t)n >= size - used)
        return -ENAMETOOLONG;
    return 0;
}

int sil_client_read_all(FILE *f, size_t max, char **out, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *b = malloc(cap);
    if (!b)
        return -ENOMEM;
    for (;;) {
        if (cap - n < 2) {
            if (cap > max + 1) {
                free(b);
                return -EFBIG;
            }
            char *nb = realloc(b, cap * 2);
            if (!nb) {
                free(b);
                return -ENOMEM;
            }
            b = nb;
            cap *= 2;
        }
        size_t k = fread(b + n, 1, cap - n - 1, f);
        n += k;
        if (n > max) {
            free(b);
            return -EFBIG;
        }
        /* A terminal's Ctrl-D is one end of file: do not read past it. */
        if (k == 0 || feof(f)) {
            if (ferror(f)) {
                free(b);
                return -EIO;
            }
            break;
        }
    }
    b[n] = 0;
    *out = b;
    if (len)
        *len = n;
    return 0;
}

void sil_client_gen_init(struct sil_client_gen *g)
{
    memset(g, 0, sizeof(*g));
    g->max_tokens = -1;
    g->max_thinking_tokens = -2;
    g->grace_tokens = -1;
    g->temperature = g->top_p = g->min_p = g->repeat_penalty = -1;
    g->presence_penalty = NAN;
    g->top_k = -1;
    g->seed = -1;
    g->think = -1;
}

int sil_client_gen_count(const struct sil_client_gen *g)
{
    return (g->max_tokens >= 0) + (g->max_thinking_tokens >= -1) + (g->grace_tokens >= 0) +
           (g->temperature >= 0) +
           (g->top_p >= 0) + (g->min_p >= 0) + (g->repeat_penalty >= 0) +
           !isnan(g->presence_penalty) + (g->top_k >= 0) + (g->seed >= 0) + (g->n_stop > 0) +
           (g->session != NULL) + (g->priority != NULL) + (g->think >= 0) + (g->model != NULL);
}

void sil_client_pack_gen(msgpack_packer *pk, const struct sil_client_gen *g)
{
    if (g->max_tokens >= 0)
        sil_rpc_kv_int(pk, "max_tokens", g->max_tokens);
    if (g->max_thinking_tokens >= -1)
        sil_rpc_kv_int(pk, "max_thinking_tokens", g->max_thinking_tokens);
    if (g->grace_tokens >= 0)
        sil_rpc_kv_int(pk, "grace_tokens", g->grace_tokens);
    if (g->temperature >= 0)
        sil_rpc_kv_double(pk, "temperature", g->temperature);
    if (g->top_p >= 0)
        sil_rpc_kv_double(pk, "top_p", g->top_p);
    if (g->min_p >= 0)
        sil_rpc_kv_double(pk, "min_p", g->min_p);
    if (g->repeat_penalty >= 0)
        sil_rpc_kv_double(pk, "repeat_penalty", g->repeat_penalty);
    if (!isnan(g->presence_penalty))
        sil_rpc_kv_double(pk, "presence_penalty", g->presence_penalty);
    if (g->top_k >= 0)
        sil_rpc_kv_int(pk, "top_k", g->top_k);
    if (g->seed >= 0)
        sil_rpc_kv_uint(pk, "seed", (uint64_t)g->seed);
    if (g->n_stop > 0) {
        sil_rpc_pack_cstr(pk, "stop");
        msgpack_pack_array(pk, (uint32_t)g->n_stop);
        for (int i = 0; i < g->n_stop; i++)
            sil_rpc_pack_cstr(pk, g->stop[i]);
    }
    if (g->session)
        sil_rpc_kv_str(pk, "session", g->session);
    if (g->priority)
        sil_rpc_kv_str(pk, "priority", g->priority);
    if (g->think >= 0)
        sil_rpc_kv_bool(pk, "think", g->think != 0);
    if (g->model)
        sil_rpc_kv_str(pk, "model", g->model);
}

void sil_client_usage_error(const char *prog, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "; try '%s --help'\n", prog);
    va_end(ap);
}

/* The long options whose names start with the first n bytes of name, listed into buf. */
static int long_matches(const struct option *lo, const char *name, size_t n, char *buf,
                        size_t size)
{
    int count = 0;
    size_t used = 0;
    buf[0] = 0;
    for (const struct option *o = lo; o && o->name; o++) {
        if (strncmp(o->name, name, n) != 0)
            continue;
        if (strlen(o->name) == n)
            return 1; /* an exact match is never ambiguous */
        int k = snprintf(buf + used, size - used, "%s--%s", count ? ", " : "", o->name);
        if (k > 0 && (size_t)k < size - used)
            used += (size_t)k;
        count++;
    }
    return count;
}

void sil_client_bad_option_msg(int c, int argc, char **argv, const struct option *lo, char *buf,
                               size_t size)
{
    /* A short option in the middle of a group leaves optind on that group. */
    const char *cur = optind < argc ? argv[optind] : NULL;
    const char *prev = optind > 0 && optind <= argc ? argv[optind - 1] : NULL;
    bool in_group = optopt > 0 && optopt < 256 && cur && cur[0] == '-' && cur[1] != '-' &&
                    strchr(cur + 1, optopt);
    if (!in_group && prev && strncmp(prev, "--", 2) == 0 && prev[2]) {
        const char *name = prev + 2;
        const char *eq = strchr(name, '=');
        size_t n = eq ? (size_t)(eq - name) : strlen(name);
        char list[256];
        int m = long_matches(lo, name, n, list, sizeof(list));
        if (c == ':')
            snprintf(buf, size, "option '--%.*s' needs an argument", (int)n, name);
        else if (m > 1)
            snprintf(buf, size, "option '--%.*s' is ambiguous (%s)", (int)n, name, list);
        else if (m == 1 && eq)
            snprintf(buf, size, "option '--%.*s' takes no argument", (int)n, name);
        else
            snprintf(buf, size, "unknown option '--%.*s'", (int)n, name);
        return;
    }
    if (optopt > 0 && optopt < 256 && optopt != '?' && (unsigned char)optopt > ' ')
        snprintf(buf, size, c == ':' ? "option '-%c' needs an argument" : "unknown option '-%c'",
                 optopt);
    else
        snprintf(buf, size, "unknown option '%s'", prev ? prev : "?");
}

void sil_client_bad_option(const char *prog, int c, int argc, char **argv, const struct option *lo)
{
    char msg[400];
    sil_client_bad_option_msg(c, argc, argv, lo, msg, sizeof(msg));
    sil_client_usage_error(prog, "%s", msg);
}

void sil_client_write_tty(FILE *f, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f)) {
            fputc(c, f);
        } else if (c < 0x20 || c == 0x7f) {
            fputc('^', f);
            fputc(c == 0x7f ? '?' : c + 0x40, f);
        } else if (c == 0xc2 && i + 1 < n && (unsigned char)s[i + 1] >= 0x80 &&
                   (unsigned char)s[i + 1] <= 0x9f) {
            /* U+0080..U+009F: C1 controls, CSI (U+009B) among them. */
            fprintf(f, "\\u%04x", (unsigned char)s[i + 1]);
            i++;
        } else {
            fputc(c, f);
        }
    }
}
