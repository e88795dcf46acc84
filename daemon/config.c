#include "daemon/config.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/engine/engine.h"

void sil_config_defaults(struct sil_config *c)
{
    memset(c, 0, sizeof(*c));
    strcpy(c->backend, "auto");
    strcpy(c->kv_type, "f32");
    c->max_message = 4u << 20;
    c->max_output = 8u << 20;
    c->max_clients = 256;
    c->max_queue = 256;
    c->max_running = 16;
    c->max_client_requests = 8;
    c->max_tokens_default = 1024;
    c->max_tokens_limit = 1 << 20;
    c->prefill_chunk = 256;
    c->host_prefill_chunk = 4096;
    c->prefill_budget = 64;
    c->prefill_stretch = 2;
    c->priority_aging = 30;
    c->session_memory = 1ull << 30;
    c->max_sessions = 32;
    c->session_checkpoints = 4;
    c->saved_sessions = 32;
    c->saved_session_bytes = 32ull << 20;
    c->prefix_cache = true;
    c->prefix_checkpoint_blocks = 4;
    c->prefix_checkpoint_memory = 1ull << 30;
    c->prefix_cache_memory = 1ull << 30;
    c->idle_timeout = 0;
    c->message_timeout = 30;
    c->max_input = 64u << 20;
    c->log_level = SIL_LOG_INFO;
    c->heat_map = true;
    c->heat_save_interval = 300;
    c->spec = SIL_SPEC_OFF;
    c->spec_width = 1;
    c->spec_depth = 4;
}

int sil_parse_spec_tree(const char *s, int32_t *width, int32_t *depth, char *why,
                        size_t why_size)
{
    char *end;
    errno = 0;
    const long w = strtol(s, &end, 10);
    if (!isdigit((unsigned char)*s) || (*end != 'x' && *end != 'X') || errno || w < 1) {
        snprintf(why, why_size, "expected WIDTHxDEPTH, a chain being 1xDEPTH (e.g. 1x4)");
        return -EINVAL;
    }
    const char *d = end + 1;
    errno = 0;
    const long n = strtol(d, &end, 10);
    if (end == d || *end || errno || !isdigit((unsigned char)*d)) {
        snprintf(why, why_size, "expected WIDTHxDEPTH, a chain being 1xDEPTH (e.g. 1x4)");
        return -EINVAL;
    }
    if (n < 1 || n > SIL_CONFIG_SPEC_DEPTH_MAX) {
        snprintf(why, why_size, "depth outside [1, %d]", SIL_CONFIG_SPEC_DEPTH_MAX);
        return -EINVAL;
    }
    if (w > 1 && (w > SIL_CONFIG_SPEC_TREE_ROWS || 1 + w * n > SIL_CONFIG_SPEC_TREE_ROWS)) {
        snprintf(why, why_size, "a tree of %ldx%ld has more than %d rows (1 + WIDTH x DEPTH)",
                 w, n, SIL_CONFIG_SPEC_TREE_ROWS);
        return -EINVAL;
    }
    *width = (int32_t)w;
    *depth = (int32_t)n;
    return 0;
}

int sil_config_state_dir(const struct sil_config *c, char *out, size_t size)
{
    int n;
    out[0] = 0;
    const char *sd = getenv("STATE_DIRECTORY"), *xdg = getenv("XDG_STATE_HOME");
    const char *home = getenv("HOME");
    if (c->state_dir[0])
        n = snprintf(out, size, "%s", c->state_dir);
    else if (sd && *sd) /* systemd's StateDirectory=: a colon-separated list, the first is ours */
        n = snprintf(out, size, "%.*s", (int)strcspn(sd, ":"), sd);
    else if (geteuid() == 0)
        n = snprintf(out, size, "/var/lib/siliceo");
    else if (xdg && xdg[0] == '/')
        n = snprintf(out, size, "%s/siliceo", xdg);
    else if (home && home[0] == '/')
        n = snprintf(out, size, "%s/.local/state/siliceo", home);
    else
        return -ENOENT;
    return n < 0 || (size_t)n >= size ? -ENAMETOOLONG : 0;
}

/* mkdir -p, the last component 0750: the heat map says which experts a workload uses. */
static int make_dir(char *out)
{
    int rc;
    for (char *p = out + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        rc = mkdir(out, 0755) < 0 && errno != EEXIST ? -errno : 0;
        *p = '/';
        if (rc < 0) return rc;
    }
    if (mkdir(out, 0750) < 0 && errno != EEXIST) return -errno;
    struct stat st;
    if (stat(out, &st) < 0) return -errno;
    return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

/* A user whose HOME gives no usable directory (cron, runuser, a container, a system user with
 * HOME=/nonexistent) keeps state in /var/tmp/siliceo-UID, which outlives a reboot as state
 * should. /var/tmp is everyone's, so the directory must be the user's and closed to others'
 * writes, as the socket's fallback in /tmp is. */
static int fallback_state_dir(char *out, size_t size, char *why, size_t why_n)
{
    const int n = snprintf(out, size, "/var/tmp/siliceo-%u", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= size) return -ENAMETOOLONG;
    if (mkdir(out, 0700) < 0 && errno != EEXIST) {
        const int rc = -errno;
        snprintf(why, why_n, "%s: %s", out, strerror(-rc));
        return rc;
    }
    struct stat st;
    if (lstat(out, &st) < 0) return -errno;
    if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
        snprintf(why, why_n,
                 "%s belongs to uid %u with mode %03o%s: not this user's, or writable by "
                 "others; remove it, or set state_dir",
                 out, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777),
                 S_ISDIR(st.st_mode) ? "" : " and is not a directory");
        return -EPERM;
    }
    return 0;
}

int sil_config_make_state_dir(const struct sil_config *c, char *out, size_t size, char *note,
                              size_t note_n)
{
    const char *sd = getenv("STATE_DIRECTORY");
    note[0] = 0;
    int rc = sil_config_state_dir(c, out, size);
    if (rc == 0) rc = make_dir(out);
    /* Only the default of a user without root falls back: a directory named by the key, the
     * flag or systemd is what the administrator asked for. */
    if (rc == 0 || rc == -ENAMETOOLONG || c->state_dir[0] || (sd && *sd) || geteuid() == 0)
        return rc;
    char first[PATH_MAX + 64], why[PATH_MAX + 160] = "";
    if (rc == -ENOENT && !out[0])
        snprintf(first, sizeof first, "no HOME or XDG_STATE_HOME");
    else
        snprintf(first, sizeof first, "%s: %s", out, strerror(-rc));
    rc = fallback_state_dir(out, size, why, sizeof why);
    if (rc == 0)
        snprintf(note, note_n, "%s; using %s", first, out);
    else
        snprintf(note, note_n, "%s; %s", first, why[0] ? why : strerror(-rc));
    return rc;
}

static const char *const level_names[] = { [SIL_LOG_ERR] = "err", [SIL_LOG_WARNING] = "warning",
                                           [SIL_LOG_NOTICE] = "notice", [SIL_LOG_INFO] = "info",
                                           [SIL_LOG_DEBUG] = "debug" };

int sil_parse_log_level(const char *s)
{
    for (int i = SIL_LOG_ERR; i <= SIL_LOG_DEBUG; i++)
        if (strcasecmp(s, level_names[i]) == 0)
            return i;
    if (strcasecmp(s, "error") == 0)
        return SIL_LOG_ERR;
    if (strcasecmp(s, "warn") == 0)
        return SIL_LOG_WARNING;
    return -EINVAL;
}

const char *sil_log_level_name(int level)
{
    if (level < SIL_LOG_ERR || level > SIL_LOG_DEBUG)
        return "?";
    return level_names[level];
}

static int parse_int(const char *s, long long min, long long max, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end)
        return -EINVAL;
    if (errno || v < min || v > max)
        return -ERANGE;
    *out = v;
    return 0;
}

/* A decimal number: digits with at most one point (no sign, exponent or hex), in [min, max]. */
static int parse_num(const char *s, double min, double max, double *out)
{
    int digits = 0, points = 0;
    for (const char *p = s; *p; p++) {
        if (*p >= '0' && *p <= '9')
            digits++;
        else if (*p == '.' && points++ == 0)
            continue;
        else
            return -EINVAL;
    }
    if (digits == 0 || digits > 15)
        return -EINVAL;
    const double v = strtod(s, NULL);
    if (!(v >= min && v <= max))
        return -ERANGE;
    *out = v;
    return 0;
}

static int resolve_uid(const char *s, uid_t *out)
{
    long long v;
    if (parse_int(s, 0, 0x7fffffff, &v) == 0) {
        *out = (uid_t)v;
        return 0;
    }
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwnam_r(s, &pw, buf, sizeof buf, &res) != 0 || !res)
        return -ENOENT;
    *out = res->pw_uid;
    return 0;
}

static int resolve_gid(const char *s, gid_t *out)
{
    long long v;
    if (parse_int(s, 0, 0x7fffffff, &v) == 0) {
        *out = (gid_t)v;
        return 0;
    }
    struct group gr, *res = NULL;
    char buf[8192];
    if (getgrnam_r(s, &gr, buf, sizeof buf, &res) != 0 || !res)
        return -ENOENT;
    *out = res->gr_gid;
    return 0;
}

/* A comma/space separated list of user or group names / numbers. */
static int parse_id_list(const char *val, bool groups, struct sil_config *c, char *why, size_t why_size)
{
    char tmp[1024];
    if (strlen(val) >= sizeof tmp) {
        snprintf(why, why_size, "list too long");
        return -EINVAL;
    }
    strcpy(tmp, val);
    char *save = NULL;
    for (char *tok = strtok_r(tmp, ", \t", &save); tok; tok = strtok_r(NULL, ", \t", &save)) {
        int *n = groups ? &c->n_allow_gids : &c->n_allow_uids;
        if (*n >= SIL_CONFIG_MAX_IDS) {
            snprintf(why, why_size, "more than %d entries", SIL_CONFIG_MAX_IDS);
            return -EINVAL;
        }
        int rc = groups ? resolve_gid(tok, &c->allow_gids[*n]) : resolve_uid(tok, &c->allow_uids[*n]);
        if (rc) {
            snprintf(why, why_size, "no such %s '%.64s'", groups ? "group" : "user", tok);
            return -EINVAL;
        }
        (*n)++;
    }
    return 0;
}

static int set_str(char *dst, size_t size, const char *val, char *why, size_t why_size)
{
    if (strlen(val) >= size) {
        snprintf(why, why_size, "value longer than %zu bytes", size - 1);
        return -EINVAL;
    }
    strcpy(dst, val);
    return 0;
}

#define INT_KEY(name, field, lo, hi)                                                               \
    if (strcmp(key, name) == 0) {                                                                  \
        long long v;                                                                               \
        int rc = parse_int(val, lo, hi, &v);                                                       \
        if (rc) {                                                                                  \
            snprintf(why, why_size, "expected an integer in [%lld, %lld]", (long long)(lo),        \
                     (long long)(hi));                                                             \
            return rc;                                                                             \
        }                                                                                          \
        c->field = v;                                                                              \
        return 0;                                                                                  \
    }
#define SIZE_KEY(name, field, lo)                                                                  \
    if (strcmp(key, name) == 0) {                                                                  \
        uint64_t v;                                                                                \
        int rc = sil_parse_size(val, &v);                                                          \
        if (rc == 0 && v + 1 < (uint64_t)(lo) + 1)                                                                 \
            rc = -ERANGE;                                                                          \
        if (rc) {                                                                                  \
            snprintf(why, why_size, "expected a size (e.g. 512M, 4G) of at least %llu",            \
                     (unsigned long long)(lo));                                                    \
            return rc;                                                                             \
        }                                                                                          \
        c->field = v;                                                                              \
        return 0;                                                                                  \
    }

/* One setting, from the file or a flag. */
static int set_key(struct sil_config *c, const char *key, const char *val, char *why, size_t why_size)
{
    if (strcmp(key, "model") == 0)
        return set_str(c->model, sizeof c->model, val, why, why_size);
    if (strcmp(key, "socket") == 0)
        return set_str(c->socket, sizeof c->socket, val, why, why_size);
    if (strcmp(key, "backend") == 0) {
        if (strcmp(val, "cpu") && strcmp(val, "cuda") && strcmp(val, "auto")) {
            snprintf(why, why_size, "expected cpu, cuda or auto");
            return -EINVAL;
        }
        strcpy(c->backend, val);
        return 0;
    }
    if (strcmp(key, "kv_type") == 0) {
        if (!sil_engine_kv_type_valid(val) || strlen(val) >= sizeof c->kv_type) {
            snprintf(why, why_size, "expected f32, f16, q8_0 or q4_0");
            return -EINVAL;
        }
        strcpy(c->kv_type, val);
        return 0;
    }
    if (strcmp(key, "spec") == 0) {
        if (strcmp(val, "off") == 0)
            c->spec = SIL_SPEC_OFF;
        else if (strcmp(val, "draft") == 0)
            c->spec = SIL_SPEC_DRAFT;
        else if (strcmp(val, "mtp") == 0)
            c->spec = SIL_SPEC_MTP;
        else {
            snprintf(why, why_size, "expected off, draft or mtp");
            return -EINVAL;
        }
        return 0;
    }
    if (strcmp(key, "draft_model") == 0)
        return set_str(c->draft_model, sizeof c->draft_model, val, why, why_size);
    if (strcmp(key, "spec_tree") == 0)
        return sil_parse_spec_tree(val, &c->spec_width, &c->spec_depth, why, why_size);
    if (strcmp(key, "log_level") == 0) {
        int l = sil_parse_log_level(val);
        if (l < 0) {
            snprintf(why, why_size, "expected err, warning, notice, info or debug");
            return -EINVAL;
        }
        c->log_level = l;
        return 0;
    }
    if (strcmp(key, "allow_users") == 0) {
        c->n_allow_uids = 0;
        return parse_id_list(val, false, c, why, why_size);
    }
    if (strcmp(key, "allow_groups") == 0) {
        c->n_allow_gids = 0;
        return parse_id_list(val, true, c, why, why_size);
    }
    if (strcmp(key, "socket_group") == 0) {
        gid_t g;
        if (*val && resolve_gid(val, &g)) {
            snprintf(why, why_size, "no such group '%.64s'", val);
            return -EINVAL;
        }
        return set_str(c->socket_group, sizeof c->socket_group, val, why, why_size);
    }
    if (strcmp(key, "state_dir") == 0)
        return set_str(c->state_dir, sizeof c->state_dir, val, why, why_size);
    if (strcmp(key, "models_dir") == 0)
        return set_str(c->models_dir, sizeof c->models_dir, val, why, why_size);
    if (strcmp(key, "heat_map") == 0) {
        if (!strcasecmp(val, "yes") || !strcasecmp(val, "true") || !strcmp(val, "1")) {
            c->heat_map = true;
        } else if (!strcasecmp(val, "no") || !strcasecmp(val, "false") || !strcmp(val, "0")) {
            c->heat_map = false;
        } else {
            snprintf(why, why_size, "expected yes or no");
            return -EINVAL;
        }
        return 0;
    }
    if (strcmp(key, "ecache_policy") == 0) {
        if (*val && strcmp(val, "lru") && strcmp(val, "lfu") && strcmp(val, "heat") &&
            strcmp(val, "static")) {
            snprintf(why, why_size, "expected lru, lfu, heat or static");
            return -EINVAL;
        }
        strcpy(c->ecache_policy, val);
        return 0;
    }
    if (strcmp(key, "host_budget") == 0) {
        uint64_t v = 0;
        const bool off = strcmp(val, "off") == 0;
        if (!off && strcmp(val, "auto") != 0 && sil_parse_size(val, &v) < 0) {
            snprintf(why, why_size, "expected a size (e.g. 512M, 24G), auto or off");
            return -EINVAL;
        }
        c->host_budget = v;
        c->host_budget_off = off;
        return 0;
    }
    if (strncmp(key, "cuda_", 5) == 0) {
        const int rc = sil_cuda_option_set(&c->cuda, key, val, why, why_size);
        if (rc != -ENOENT) return rc;
    }
    INT_KEY("heat_save_interval", heat_save_interval, 0, 1 << 30)
    INT_KEY("ecache_slots", ecache_slots, 0, 1 << 24)
    INT_KEY("threads", threads, 0, 1024)
    INT_KEY("context", ctx, 0, 1 << 24)
    INT_KEY("max_clients", max_clients, 1, 65536)
    INT_KEY("max_queue", max_queue, 0, 1 << 20)
    INT_KEY("max_running", max_running, 1, 1024)
    INT_KEY("max_client_requests", max_client_requests, 1, 1 << 16)
    INT_KEY("max_tokens_default", max_tokens_default, 1, 1 << 24)
    INT_KEY("max_tokens_limit", max_tokens_limit, 1, 1 << 24)
    INT_KEY("prefill_chunk", prefill_chunk, 1, 1 << 16)
    INT_KEY("host_prefill_chunk", host_prefill_chunk, 1, 1 << 16)
    INT_KEY("prefill_budget", prefill_budget, 1, 1 << 16)
    if (strcmp(key, "prefill_stretch") == 0) { /* 0: off; under 1 no step could have prompt rows */
        double v;
        int rc = parse_num(val, 0, 100, &v);
        if (rc == 0 && v > 0 && v < 1)
            rc = -ERANGE;
        if (rc) {
            snprintf(why, why_size, "expected 0 or a number in [1, 100]");
            return rc;
        }
        c->prefill_stretch = v;
        return 0;
    }
    INT_KEY("priority_aging", priority_aging, 1, 86400)
    INT_KEY("max_sessions", max_sessions, 0, 4096)
    INT_KEY("session_checkpoints", session_checkpoints, 0, 256)
    INT_KEY("saved_sessions", saved_sessions, 0, 4096)
    INT_KEY("prefix_checkpoint_blocks", prefix_checkpoint_blocks, 1, 1 << 16)
    if (strcmp(key, "prefix_cache") == 0) {
        static const char *const on[] = {"on", "yes", "true", "1"};
        static const char *const off[] = {"off", "no", "false", "0"};
        for (int i = 0; i < 4; i++)
            if (strcasecmp(val, on[i]) == 0 || strcasecmp(val, off[i]) == 0) {
                c->prefix_cache = strcasecmp(val, on[i]) == 0;
                return 0;
            }
        snprintf(why, why_size, "expected on or off");
        return -EINVAL;
    }
    INT_KEY("idle_timeout", idle_timeout, 0, 1 << 30)
    INT_KEY("keep_alive", keep_alive, 0, 1 << 30)
    INT_KEY("message_timeout", message_timeout, 0, 1 << 30)
    SIZE_KEY("max_input", max_input, 65536)
    SIZE_KEY("vram_budget", vram_budget, 0)
    SIZE_KEY("kv_budget", kv_budget, 0)
    SIZE_KEY("max_message", max_message, 1024)
    SIZE_KEY("max_output", max_output, 4096)
    SIZE_KEY("session_memory", session_memory, 0)
    SIZE_KEY("saved_session_bytes", saved_session_bytes, 0)
    SIZE_KEY("prefix_checkpoint_memory", prefix_checkpoint_memory, 0)
    SIZE_KEY("prefix_cache_memory", prefix_cache_memory, 0)
    snprintf(why, why_size, "unknown key");
    return -EINVAL;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    char *e = s + strlen(s);
    while (e > s && isspace((unsigned char)e[-1]))
        *--e = 0;
    return s;
}

int sil_config_load_file(struct sil_config *c, const char *path, struct sil_error *err)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return sil_errorf(err, -errno, "%s: %s", path, strerror(errno));
    char line[4096];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        size_t n = strlen(line);
        if (n == sizeof line - 1 && line[n - 1] != '\n') {
            rc = sil_errorf(err, -EINVAL, "%s:%d: line longer than %zu bytes", path, lineno, sizeof line - 2);
            break;
        }
        char *hash = strchr(line, '#');
        if (hash)
            *hash = 0;
        char *s = trim(line);
        if (!*s)
            continue;
        char *eq = strchr(s, '=');
        if (!eq) {
            rc = sil_errorf(err, -EINVAL, "%s:%d: expected 'key = value'", path, lineno);
            break;
        }
        *eq = 0;
        char *key = trim(s), *val = trim(eq + 1);
        size_t vl = strlen(val);
        if (vl >= 2 && val[0] == '"' && val[vl - 1] == '"') {
            val[vl - 1] = 0;
            val++;
        }
        char why[256];
        if (set_key(c, key, val, why, sizeof why)) {
            rc = sil_errorf(err, -EINVAL, "%s:%d: %s: %s", path, lineno, key, why);
            break;
        }
    }
    fclose(f);
    if (rc == 0)
        snprintf(c->config_path, sizeof c->config_path, "%s", path);
    return rc;
}

enum {
    OPT_INSPECT = 256,
    OPT_LOG_LEVEL,
    OPT_VRAM,
    OPT_NO_MODEL,
    OPT_CTX,
    OPT_IDLE_TIMEOUT,
    OPT_MESSAGE_TIMEOUT,
    OPT_STATE_DIR,
    OPT_KV_TYPE,
    OPT_KV_BUDGET,
    OPT_HOST_BUDGET,
    OPT_MODELS_DIR,
    OPT_KEEP_ALIVE,
    OPT_CUDA_GRAPHS,
    OPT_CUDA_ZERO_COPY,
    OPT_CUDA_PIN,
    OPT_CUDA_CPU_SHARE,
    OPT_SPEC,
    OPT_DRAFT_MODEL,
    OPT_SPEC_TREE,
};

static const struct option long_opts[] = {
    { "model", required_argument, NULL, 'm' },
    { "socket", required_argument, NULL, 's' },
    { "threads", required_argument, NULL, 't' },
    { "backend", required_argument, NULL, 'b' },
    { "config", required_argument, NULL, 'c' },
    { "foreground", no_argument, NULL, 'f' },
    { "help", no_argument, NULL, 'h' },
    { "inspect", required_argument, NULL, OPT_INSPECT },
    { "log-level", required_argument, NULL, OPT_LOG_LEVEL },
    { "vram-budget", required_argument, NULL, OPT_VRAM },
    { "host-budget", required_argument, NULL, OPT_HOST_BUDGET },
    { "context", required_argument, NULL, OPT_CTX },
    { "kv-type", required_argument, NULL, OPT_KV_TYPE },
    { "kv-budget", required_argument, NULL, OPT_KV_BUDGET },
    { "no-model", no_argument, NULL, OPT_NO_MODEL },
    { "idle-timeout", required_argument, NULL, OPT_IDLE_TIMEOUT },
    { "message-timeout", required_argument, NULL, OPT_MESSAGE_TIMEOUT },
    { "state-dir", required_argument, NULL, OPT_STATE_DIR },
    { "models-dir", required_argument, NULL, OPT_MODELS_DIR },
    { "keep-alive", required_argument, NULL, OPT_KEEP_ALIVE },
    { "cuda-graphs", required_argument, NULL, OPT_CUDA_GRAPHS },
    { "cuda-zero-copy", required_argument, NULL, OPT_CUDA_ZERO_COPY },
    { "cuda-pin", required_argument, NULL, OPT_CUDA_PIN },
    { "cuda-cpu-share", required_argument, NULL, OPT_CUDA_CPU_SHARE },
    { "spec", required_argument, NULL, OPT_SPEC },
    { "draft-model", required_argument, NULL, OPT_DRAFT_MODEL },
    { "spec-tree", required_argument, NULL, OPT_SPEC_TREE },
    { "version", no_argument, NULL, 'V' },
    { 0, 0, 0, 0 },
};

static const char short_opts[] = "+m:s:t:b:c:fhV";

static int flag_key(int opt, const char **key)
{
    switch (opt) {
    case 'm': *key = "model"; return 1;
    case 's': *key = "socket"; return 1;
    case 't': *key = "threads"; return 1;
    case 'b': *key = "backend"; return 1;
    case OPT_LOG_LEVEL: *key = "log_level"; return 1;
    case OPT_VRAM: *key = "vram_budget"; return 1;
    case OPT_HOST_BUDGET: *key = "host_budget"; return 1;
    case OPT_CTX: *key = "context"; return 1;
    case OPT_KV_TYPE: *key = "kv_type"; return 1;
    case OPT_KV_BUDGET: *key = "kv_budget"; return 1;
    case OPT_IDLE_TIMEOUT: *key = "idle_timeout"; return 1;
    case OPT_MESSAGE_TIMEOUT: *key = "message_timeout"; return 1;
    case OPT_STATE_DIR: *key = "state_dir"; return 1;
    case OPT_MODELS_DIR: *key = "models_dir"; return 1;
    case OPT_KEEP_ALIVE: *key = "keep_alive"; return 1;
    case OPT_CUDA_GRAPHS: *key = "cuda_graphs"; return 1;
    case OPT_CUDA_ZERO_COPY: *key = "cuda_zero_copy"; return 1;
    case OPT_CUDA_PIN: *key = "cuda_pin"; return 1;
    case OPT_CUDA_CPU_SHARE: *key = "cuda_cpu_share"; return 1;
    case OPT_SPEC: *key = "spec"; return 1;
    case OPT_DRAFT_MODEL: *key = "draft_model"; return 1;
    case OPT_SPEC_TREE: *key = "spec_tree"; return 1;
    }
    return 0;
}

int sil_config_from_args(struct sil_config *c, struct sil_cli *cli, int argc, char *const *argv,
                         struct sil_error *err)
{
    sil_config_defaults(c);
    memset(cli, 0, sizeof(*cli));
    const char *config_path = NULL;
    int opt;

    /* First pass: which config file, and errors in the flags themselves. */
    optind = 0;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, short_opts, long_opts, NULL)) != -1) {
        switch (opt) {
        case 'c': config_path = optarg; break;
        case 'h': cli->action = SIL_CLI_HELP; break;
        case 'V': cli->action = SIL_CLI_VERSION; break;
        case OPT_INSPECT:
            cli->action = SIL_CLI_INSPECT;
            cli->inspect_path = optarg;
            break;
        case '?':
            cli->usage_error = true;
            if (optopt)
                return sil_errorf(err, -EINVAL, "unknown option or missing argument: -%c", optopt);
            return sil_errorf(err, -EINVAL, "unknown option or missing argument: %s", argv[optind - 1]);
        }
    }
    if (optind < argc) {
        cli->usage_error = true;
        return sil_errorf(err, -EINVAL, "unexpected argument '%s'", argv[optind]);
    }
    if (cli->action != SIL_CLI_RUN)
        return 0;

    if (config_path) {
        int rc = sil_config_load_file(c, config_path, err);
        if (rc)
            return rc;
    } else {
        int rc = sil_config_load_file(c, SIL_DEFAULT_CONFIG, err);
        if (rc && rc != -ENOENT)
            return rc;
        memset(err, 0, sizeof(*err));
    }

    optind = 0;
    while ((opt = getopt_long(argc, argv, short_opts, long_opts, NULL)) != -1) {
        const char *key;
        if (opt == 'f') {
            c->foreground = true;
        } else if (opt == OPT_NO_MODEL) {
            c->no_model = true;
        } else if (flag_key(opt, &key)) {
            char why[256];
            if (set_key(c, key, optarg, why, sizeof why)) {
                cli->usage_error = true;
                return sil_errorf(err, -EINVAL, "option --%s: %s", key, why);
            }
        }
    }
    optind = 0;
    if (!c->no_model && !c->model[0] && !c->models_dir[0])
        return sil_errorf(err, -EINVAL,
                          "no model: give --model FILE or --models-dir DIR ('model =' or "
                          "'models_dir =' in %s)",
                          config_path ? config_path : SIL_DEFAULT_CONFIG);
    if (c->spec == SIL_SPEC_DRAFT && !c->draft_model[0])
        return sil_errorf(err, -EINVAL,
                          "spec = draft needs a draft model: give --draft-model FILE "
                          "('draft_model =' in %s)",
                          config_path ? config_path : SIL_DEFAULT_CONFIG);
    if (c->max_tokens_default > c->max_tokens_limit)
        c->max_tokens_default = c->max_tokens_limit;
    /* One whole message must always fit, or a client alone could never finish one. */
    if (c->max_input < c->max_message)
        c->max_input = c->max_message;
    return 0;
}

void sil_config_apply_live(struct sil_config *dst, const struct sil_config *src, char *changed_static,
                           size_t size)
{
    changed_static[0] = 0;
    size_t n = 0;
#define STATIC(cond, name)                                                                         \
    if (cond)                                                                                      \
        n += snprintf(changed_static + n, n < size ? size - n : 0, "%s%s", n ? ", " : "", name);
    STATIC(strcmp(dst->model, src->model), "model")
    STATIC(strcmp(dst->socket, src->socket), "socket")
    STATIC(dst->threads != src->threads, "threads")
    STATIC(strcmp(dst->backend, src->backend), "backend")
    STATIC(dst->vram_budget != src->vram_budget, "vram_budget")
    STATIC(dst->host_budget != src->host_budget || dst->host_budget_off != src->host_budget_off,
           "host_budget")
    STATIC(dst->ctx != src->ctx, "context")
    STATIC(strcmp(dst->kv_type, src->kv_type), "kv_type")
    STATIC(dst->kv_budget != src->kv_budget, "kv_budget")
    STATIC(strcmp(dst->socket_group, src->socket_group), "socket_group")
    STATIC(dst->max_running != src->max_running, "max_running")
    STATIC(dst->prefill_chunk != src->prefill_chunk, "prefill_chunk")
    STATIC(dst->host_prefill_chunk != src->host_prefill_chunk, "host_prefill_chunk")
    STATIC(dst->prefill_budget != src->prefill_budget, "prefill_budget")
    STATIC(dst->prefill_stretch != src->prefill_stretch, "prefill_stretch")
    STATIC(dst->priority_aging != src->priority_aging, "priority_aging")
    STATIC(strcmp(dst->state_dir, src->state_dir), "state_dir")
    STATIC(dst->heat_map != src->heat_map, "heat_map")
    STATIC(dst->heat_save_interval != src->heat_save_interval, "heat_save_interval")
    STATIC(dst->saved_sessions != src->saved_sessions, "saved_sessions")
    STATIC(dst->saved_session_bytes != src->saved_session_bytes, "saved_session_bytes")
    STATIC(dst->ecache_slots != src->ecache_slots, "ecache_slots")
    STATIC(strcmp(dst->ecache_policy, src->ecache_policy), "ecache_policy")
    STATIC(dst->prefix_cache != src->prefix_cache, "prefix_cache")
    STATIC(dst->prefix_checkpoint_blocks != src->prefix_checkpoint_blocks,
           "prefix_checkpoint_blocks")
    STATIC(dst->prefix_checkpoint_memory != src->prefix_checkpoint_memory,
           "prefix_checkpoint_memory")
    STATIC(dst->prefix_cache_memory != src->prefix_cache_memory, "prefix_cache_memory")
    STATIC(dst->cuda.no_graphs != src->cuda.no_graphs, "cuda_graphs")
    STATIC(dst->cuda.zero_copy != src->cuda.zero_copy, "cuda_zero_copy")
    STATIC(dst->cuda.pin != src->cuda.pin, "cuda_pin")
    STATIC(dst->cuda.cpu_off != src->cuda.cpu_off || dst->cuda.cpu_share != src->cuda.cpu_share,
           "cuda_cpu_share")
    STATIC(dst->spec != src->spec, "spec")
    STATIC(strcmp(dst->draft_model, src->draft_model), "draft_model")
    STATIC(dst->spec_depth != src->spec_depth || dst->spec_width != src->spec_width, "spec_tree")
#undef STATIC
    if (n >= size && size > 4)
        strcpy(changed_static + size - 4, "...");
    memcpy(dst->allow_uids, src->allow_uids, sizeof dst->allow_uids);
    dst->n_allow_uids = src->n_allow_uids;
    memcpy(dst->allow_gids, src->allow_gids, sizeof dst->allow_gids);
    dst->n_allow_gids = src->n_allow_gids;
    dst->max_message = src->max_message;
    dst->max_output = src->max_output;
    dst->max_clients = src->max_clients;
    dst->max_queue = src->max_queue;
    dst->max_client_requests = src->max_client_requests;
    dst->max_tokens_default = src->max_tokens_default;
    dst->max_tokens_limit = src->max_tokens_limit;
    dst->session_memory = src->session_memory;
    dst->max_sessions = src->max_sessions;
    dst->idle_timeout = src->idle_timeout;
    dst->message_timeout = src->message_timeout;
    dst->max_input = src->max_input;
    dst->log_level = src->log_level;
    memcpy(dst->models_dir, src->models_dir, sizeof dst->models_dir);
    dst->keep_alive = src->keep_alive;
}

void sil_usage(FILE *f)
{
    fputs("usage: siliceod [--model FILE] [--models-dir DIR] [--keep-alive SECONDS]\n"
          "                [--socket PATH] [--threads N] [--backend cpu|cuda|auto]\n"
          "                [--config PATH] [--vram-budget SIZE] [--host-budget SIZE|auto|off]\n"
          "                [--context N]\n"
          "                [--kv-type f32|f16|q8_0|q4_0] [--kv-budget SIZE]\n"
          "                [--log-level err|warning|notice|info|debug] [--foreground]\n"
          "                [--idle-timeout SECONDS] [--message-timeout SECONDS]\n"
          "                [--state-dir DIR] [--cuda-graphs on|off]\n"
          "                [--cuda-zero-copy on|off] [--cuda-pin auto|on|off]\n"
          "                [--cuda-cpu-share auto|off|SHARE]\n"
          "                [--spec off|draft|mtp] [--draft-model FILE]\n"
          "                [--spec-tree WIDTHxDEPTH]\n"
          "       siliceod --no-model [--socket PATH]   (protocol diagnostics only)\n"
          "       siliceod --inspect FILE\n"
          "       siliceod --help | --version\n"
          "Settings are read from " SIL_DEFAULT_CONFIG " (or --config PATH) and overridden by\n"
          "flags; see siliceod(8) and siliceod.conf(5).\n"
          "\n"
          "  -m, --model FILE        GGUF model to serve (the default one, loaded at start)\n"
          "      --models-dir DIR    GGUF files requests may name, NAME.gguf each (default:\n"
          "                          the state directory's models/); needed without --model\n"
          "      --keep-alive S      unload a model idle this long; the next request loads\n"
          "                          it again (default 0: never)\n"
          "  -s, --socket PATH       listening socket (default: $SILICEO_SOCKET, else\n"
          "                          $XDG_RUNTIME_DIR/siliceo/siliceod.sock or, without it,\n"
          "                          /tmp/siliceo-UID/siliceod.sock; /run/siliceo/siliceod.sock\n"
          "                          for root)\n"
          "  -t, --threads N         engine threads (default: online CPUs)\n"
          "  -b, --backend NAME      cpu, cuda or auto\n"
          "  -c, --config PATH       configuration file\n"
          "      --vram-budget SIZE  device memory cap (CUDA backend)\n"
          "      --host-budget SIZE  host memory for everything kept there (backbone and KV\n"
          "                          on the CPU, routed experts, caches, sessions); experts\n"
          "                          beyond it are read from the file into host slots\n"
          "                          (default auto: what the host and the cgroup can spare;\n"
          "                          off: experts through the mapping as before)\n"
          "      --context N         positions per sequence\n"
          "      --kv-type TYPE      KV cache elements: f32 (default), f16, q8_0, q4_0\n"
          "      --kv-budget SIZE    KV cache memory (CPU backend; default: every sequence\n"
          "                          at the full context, backed as it is used)\n"
          "      --log-level LEVEL   err, warning, notice, info or debug\n"
          "      --idle-timeout S    close connections idle this long (default 0: never)\n"
          "      --message-timeout S drop a client whose message stays incomplete this long (30)\n"
          "      --cuda-graphs on|off  replay decode passes as CUDA graphs (default on)\n"
          "      --cuda-zero-copy on|off  with experts in slots, decode reads the ones\n"
          "                          missing in place from pinned host memory (default off)\n"
          "      --cuda-pin auto|on|off  pin the model file's expert pages for copies into\n"
          "                          slots (default auto: when they fit and pin fast)\n"
          "      --cuda-cpu-share auto|off|SHARE  share in [0, 1] of each decode layer's\n"
          "                          expert misses computed on the CPU (default auto: from\n"
          "                          the measured host and link speeds)\n"
          "      --spec off|draft|mtp  speculative decoding: a draft model (draft) or the\n"
          "                          model's own MTP layer (mtp) proposes tokens the model\n"
          "                          verifies in one batch (default off)\n"
          "      --draft-model FILE  the draft model (the same vocabulary as every model\n"
          "                          served)\n"
          "      --spec-tree WIDTHxDEPTH  the tokens drafted a step: a chain of DEPTH\n"
          "                          (1 to 64, default 1x4) or, with a draft model on the\n"
          "                          CPU backend, a tree of WIDTH such chains (at most 64\n"
          "                          rows, 1 + WIDTH x DEPTH)\n"
          "      --state-dir DIR     where heat maps and saved sessions are kept\n"
          "                          (default: $STATE_DIRECTORY, /var/lib/siliceo for\n"
          "                          root, else $XDG_STATE_HOME/siliceo or\n"
          "                          ~/.local/state/siliceo, failing that\n"
          "                          /var/tmp/siliceo-UID)\n"
          "  -f, --foreground        log to stderr (the daemon never forks)\n"
          "      --no-model          protocol diagnostics without a model\n"
          "      --inspect FILE      validate and describe a model file, then exit\n"
          "  -h, --help              this text\n"
          "  -V, --version           the version\n"
          "\n"
          "Environment: SILICEO_SOCKET, the socket path when --socket and 'socket =' are not given.\n",
          f);
}
