/* sil-probe's verdict (monitoring-plugin exit codes) and Prometheus text output. */
#include "client/common/common.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *sil_probe_code_name(int code)
{
    switch (code) {
    case SIL_PROBE_OK: return "OK";
    case SIL_PROBE_WARNING: return "WARNING";
    case SIL_PROBE_CRITICAL: return "CRITICAL";
    default: return "UNKNOWN";
    }
}

static int worse(int a, int b) { return a > b ? a : b; }

int sil_probe_eval(const struct sil_probe_limits *lim, const msgpack_object *status,
                   double status_ms, double gen_ms, char *line, size_t size)
{
    char state[32], name[128], backend[32];
    const msgpack_object *model = sil_rpc_map_get(status, "model");
    const msgpack_object *queue = sil_rpc_map_get(status, "queue");
    sil_rpc_map_str(status, "state", state, sizeof(state), "ready");
    sil_rpc_map_str(model, "name", name, sizeof(name), "?");
    sil_rpc_map_str(status, "backend", backend, sizeof(backend), "?");
    int64_t running = sil_rpc_map_int(queue, "running", 0);
    int64_t queued = sil_rpc_map_int(queue, "queued", 0);
    double uptime = sil_rpc_map_double(status, "uptime_s", 0);
    double lat = gen_ms >= 0 ? gen_ms : status_ms;

    int code = SIL_PROBE_OK;
    const char *why = "";
    if (strcmp(state, "ready") != 0) {
        code = strcmp(state, "loading") == 0 ? SIL_PROBE_WARNING : SIL_PROBE_CRITICAL;
        why = " (not ready)";
    }
    if (lim->crit_queue >= 0 && queued >= lim->crit_queue) {
        code = worse(code, SIL_PROBE_CRITICAL);
        why = " (queue)";
    } else if (lim->warn_queue >= 0 && queued >= lim->warn_queue && code < SIL_PROBE_WARNING) {
        code = SIL_PROBE_WARNING;
        why = " (queue)";
    }
    if (lim->crit_latency_ms >= 0 && lat >= lim->crit_latency_ms) {
        code = worse(code, SIL_PROBE_CRITICAL);
        why = " (latency)";
    } else if (lim->warn_latency_ms >= 0 && lat >= lim->warn_latency_ms && code < SIL_PROBE_WARNING) {
        code = SIL_PROBE_WARNING;
        why = " (latency)";
    }

    char gen[64] = "";
    if (gen_ms >= 0)
        snprintf(gen, sizeof(gen), ", generate %.1f ms", gen_ms);
    /* status's expert_cache is nil where there is none (every expert resident, the CPU) */
    char hit[48] = ", no expert cache";
    const msgpack_object *ec = sil_rpc_map_get(status, "expert_cache");
    if (ec && ec->type == MSGPACK_OBJECT_MAP)
        snprintf(hit, sizeof(hit), ", expert hit rate %.1f%%", 100 * sil_rpc_map_double(ec, "hit_rate", 0));
    /* the routed experts' host tier, while experts are read from the file */
    char tier[96] = "";
    const msgpack_object *ht = sil_rpc_map_get(status, "host_tier");
    if (ht && sil_rpc_map_bool(ht, "on", false))
        snprintf(tier, sizeof(tier), ", host tier %" PRId64 " hits, %" PRId64 " misses, %.1f MiB read",
                 sil_rpc_map_int(ht, "hits", 0), sil_rpc_map_int(ht, "misses", 0),
                 (double)sil_rpc_map_int(ht, "bytes_read", 0) / (1 << 20));
    /* Nagios perfdata: label=value[unit];warn;crit */
    char lw[32] = "", lc[32] = "", qw[32] = "", qc[32] = "";
    if (lim->warn_latency_ms >= 0)
        snprintf(lw, sizeof(lw), "%g", lim->warn_latency_ms);
    if (lim->crit_latency_ms >= 0)
        snprintf(lc, sizeof(lc), "%g", lim->crit_latency_ms);
    if (lim->warn_queue >= 0)
        snprintf(qw, sizeof(qw), "%ld", lim->warn_queue);
    if (lim->crit_queue >= 0)
        snprintf(qc, sizeof(qc), "%ld", lim->crit_queue);
    char perf_gen[96] = "";
    if (gen_ms >= 0)
        snprintf(perf_gen, sizeof(perf_gen), " generate_ms=%.3fms;%s;%s", gen_ms, lw, lc);
    snprintf(line, size,
             "SILICEO %s%s - %s, model %s (%s), %" PRId64 " running, %" PRId64
             " queued, status %.1f ms%s%s%s, up %.0f s | status_ms=%.3fms;%s;%s%s running=%" PRId64
             " queued=%" PRId64 ";%s;%s",
             sil_probe_code_name(code), why, state, name, backend, running, queued, status_ms, gen,
             hit, tier, uptime, status_ms, gen_ms >= 0 ? "" : lw, gen_ms >= 0 ? "" : lc, perf_gen,
             running, queued, qw, qc);
    return code;
}

static void prom_name(const char *s, size_t n, char *out, size_t size)
{
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < size; i++) {
        unsigned char c = (unsigned char)s[i];
        bool ok = (isalnum(c) || c == '_' || c == ':') && !(k == 0 && isdigit(c));
        out[k++] = ok ? (char)c : '_';
    }
    out[k] = 0;
}

static bool number_of(const msgpack_object *v, double *out)
{
    switch (v->type) {
    case MSGPACK_OBJECT_POSITIVE_INTEGER: *out = (double)v->via.u64; return true;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: *out = (double)v->via.i64; return true;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: *out = v->via.f64; return true;
    case MSGPACK_OBJECT_BOOLEAN: *out = v->via.boolean; return true;
    default: return false;
    }
}

static void prom_value(FILE *f, double v)
{
    if (isnan(v))
        fputs("NaN", f);
    else if (isinf(v))
        fputs(v > 0 ? "+Inf" : "-Inf", f);
    else if (v == floor(v) && fabs(v) < 1e15)
        fprintf(f, "%.0f", v);
    else {
        /* The shortest of %.15g and %.17g that reads back as v. */
        char b[32];
        snprintf(b, sizeof(b), "%.15g", v);
        if (strtod(b, NULL) != v)
            snprintf(b, sizeof(b), "%.17g", v);
        fputs(b, f);
    }
}

/* A label set as sent by the daemon (layer="3" or layer=3,kind="x"): label values are quoted
 * and escaped, names sanitised. */
static void prom_labels(FILE *f, const char *s, size_t n)
{
    fputc('{', f);
    size_t i = 0;
    bool first = true;
    while (i < n) {
        size_t eq = i;
        while (eq < n && s[eq] != '=')
            eq++;
        char name[64];
        prom_name(s + i, eq - i, name, sizeof(name));
        size_t j = eq < n ? eq + 1 : n;
        bool quoted = j < n && s[j] == '"';
        if (quoted)
            j++;
        size_t vstart = j;
        while (j < n && (quoted ? s[j] != '"' : s[j] != ','))
            j++;
        size_t vend = j;
        if (quoted && j < n)
            j++;
        if (j < n && s[j] == ',')
            j++;
        if (name[0]) {
            fprintf(f, "%s%s=\"", first ? "" : ",", name);
            for (size_t k = vstart; k < vend; k++) {
                if (s[k] == '\n') {
                    fputs("\\n", f);
                    continue;
                }
                if (s[k] == '"' || s[k] == '\\')
                    fputc('\\', f);
                fputc(s[k], f);
            }
            fputc('"', f);
            first = false;
        }
        i = j > i ? j : n;
    }
    fputc('}', f);
}

/* Help for the daemon's metrics (siliceo-rpc(7)); a daemon may send its own in `help`. */
static const struct {
    const char *name, *help;
} known_help[] = {
    {"siliceo_up", "1 when sil-probe reached siliceod and read its metrics, else 0"},
    {"siliceo_probe_latency_seconds", "time sil-probe took to connect and read the metrics"},
    {"siliceo_uptime_seconds", "seconds since siliceod started"},
    {"siliceo_rss_bytes", "resident memory of siliceod"},
    {"siliceo_ready", "1 while siliceod serves, 0 while it stops"},
    {"siliceo_connected_clients", "clients connected now"},
    {"siliceo_clients_total", "connections accepted"},
    {"siliceo_clients_refused_total", "peers refused (allow list or max_clients)"},
    {"siliceo_clients_dropped_total", "clients dropped for not reading their output"},
    {"siliceo_bytes_in_total", "bytes read from client sockets"},
    {"siliceo_bytes_out_total", "bytes written to client sockets"},
    {"siliceo_messages_in_total", "messages received"},
    {"siliceo_bad_messages_total", "messages received malformed or invalid"},
    {"siliceo_requests_rejected_total", "requests refused with error 7 (queue or client limit)"},
    {"siliceo_requests_total", "generation requests accepted"},
    {"siliceo_requests_failed_total", "generation requests that ended with an error"},
    {"siliceo_requests_cancelled_total", "generation requests cancelled"},
    {"siliceo_queue_running", "generation requests running"},
    {"siliceo_queue_queued", "generation requests waiting"},
    {"siliceo_tokens_prompt_total", "prompt tokens of all requests"},
    {"siliceo_tokens_cached_total", "prompt tokens found in a session's state, not evaluated"},
    {"siliceo_tokens_generated_total", "tokens generated"},
    {"siliceo_eval_steps_total", "scheduler steps (engine evaluations)"},
    {"siliceo_eval_errors_total", "engine evaluations that failed"},
    {"siliceo_eval_seconds_total", "seconds spent in engine evaluations"},
    {"siliceo_sessions", "named sessions held"},
    {"siliceo_session_bytes", "bytes of engine state held by sessions"},
    {"siliceo_state_bytes", "bytes of engine state of all sequences"},
};

/* Older daemons' names that clash in OpenMetrics: the gauge siliceo_clients and the counter
 * siliceo_clients_total are one family there. */
static const struct {
    const char *from, *to;
} renamed[] = {
    {"siliceo_clients", "siliceo_connected_clients"},
};

static const char *help_for(const char *name, const msgpack_object *help, char *buf, size_t size)
{
    const msgpack_object *h = NULL;
    if (help && help->type == MSGPACK_OBJECT_MAP)
        h = sil_rpc_map_get(help, name);
    if (h && h->type == MSGPACK_OBJECT_STR && h->via.str.size > 0) {
        size_t n = h->via.str.size < size - 1 ? h->via.str.size : size - 1;
        memcpy(buf, h->via.str.ptr, n);
        buf[n] = 0;
        return buf;
    }
    for (size_t i = 0; i < sizeof(known_help) / sizeof(known_help[0]); i++)
        if (strcmp(known_help[i].name, name) == 0)
            return known_help[i].help;
    snprintf(buf, size, "%s as reported by siliceod", name);
    return buf;
}

static void prom_help_text(FILE *f, const char *s, enum sil_prom_format fmt)
{
    for (; *s; s++) {
        if (*s == '\n')
            fputs("\\n", f);
        else if (*s == '\\' || (*s == '"' && fmt == SIL_PROM_OPENMETRICS))
            fprintf(f, "\\%c", *s);
        else
            fputc(*s, f);
    }
}

/* # HELP and # TYPE of one family. OpenMetrics names a counter's family without its _total,
 * which only the sample keeps; the classic text format names the family as the sample. */
static void prom_family(FILE *f, enum sil_prom_format fmt, const char *name, bool counter,
                        const char *help)
{
    size_t len = strlen(name);
    int base = (int)(counter && fmt == SIL_PROM_OPENMETRICS ? len - 6 : len);
    fprintf(f, "# HELP %.*s ", base, name);
    prom_help_text(f, help, fmt);
    fprintf(f, "\n# TYPE %.*s %s\n", base, name, counter ? "counter" : "gauge");
}

void sil_prom_gauge(FILE *f, enum sil_prom_format fmt, const char *name, double v)
{
    char buf[160];
    prom_family(f, fmt, name, false, help_for(name, NULL, buf, sizeof(buf)));
    fprintf(f, "%s ", name);
    prom_value(f, v);
    fputc('\n', f);
}

void sil_prom_end(FILE *f, enum sil_prom_format fmt)
{
    if (fmt == SIL_PROM_OPENMETRICS)
        fputs("# EOF\n", f);
}

static bool is_counter(const char *name)
{
    size_t len = strlen(name);
    return len > 6 && strcmp(name + len - 6, "_total") == 0;
}

#define MAX_FAMILIES 256

int sil_probe_prom(FILE *f, const msgpack_object *metrics, enum sil_prom_format fmt)
{
    if (!metrics || metrics->type != MSGPACK_OBJECT_MAP)
        return 0;
    /* The method's result is {metrics: {...}, help?: {...}}; a bare map of samples is accepted. */
    const msgpack_object *help = sil_rpc_map_get(metrics, "help");
    const msgpack_object *inner = sil_rpc_map_get(metrics, "metrics");
    if (inner && inner->type == MSGPACK_OBJECT_MAP)
        metrics = inner;
    struct {
        char name[128];
        const msgpack_object *v;
    } fam[MAX_FAMILIES];
    int n_fam = 0;
    for (uint32_t i = 0; i < metrics->via.map.size && n_fam < MAX_FAMILIES; i++) {
        const msgpack_object *k = &metrics->via.map.ptr[i].key;
        const msgpack_object *v = &metrics->via.map.ptr[i].val;
        double x;
        if (k->type != MSGPACK_OBJECT_STR || k->via.str.size == 0 ||
            (!number_of(v, &x) && v->type != MSGPACK_OBJECT_MAP))
            continue;
        char *name = fam[n_fam].name;
        prom_name(k->via.str.ptr, k->via.str.size, name, sizeof(fam[0].name));
        for (size_t r = 0; r < sizeof(renamed) / sizeof(renamed[0]); r++)
            if (strcmp(name, renamed[r].from) == 0)
                snprintf(name, sizeof(fam[0].name), "%s", renamed[r].to);
        /* sil-probe writes these itself. */
        if (!strcmp(name, "siliceo_up") || !strcmp(name, "siliceo_probe_latency_seconds"))
            continue;
        fam[n_fam++].v = v;
    }
    /* One family per name: a second key that sanitises or renames to a name already taken, or a
     * gauge named as a counter's family (X beside X_total), would be rejected by a parser. */
    bool skip[MAX_FAMILIES] = {false};
    for (int i = 0; i < n_fam; i++) {
        for (int j = 0; j < n_fam && !skip[i]; j++) {
            if (j == i || skip[j])
                continue;
            size_t lj = strlen(fam[j].name);
            bool same = j < i && strcmp(fam[i].name, fam[j].name) == 0;
            bool clash = !is_counter(fam[i].name) && is_counter(fam[j].name) &&
                         strlen(fam[i].name) == lj - 6 &&
                         strncmp(fam[i].name, fam[j].name, lj - 6) == 0;
            skip[i] = same || clash;
        }
    }
    int samples = 0;
    for (int i = 0; i < n_fam; i++) {
        if (skip[i])
            continue;
        const char *name = fam[i].name;
        const msgpack_object *v = fam[i].v;
        bool counter = is_counter(name);
        char buf[160];
        const char *h = help_for(name, help, buf, sizeof(buf));
        double x;
        if (number_of(v, &x)) {
            prom_family(f, fmt, name, counter, h);
            fprintf(f, "%s ", name);
            prom_value(f, x);
            fputc('\n', f);
            samples++;
            continue;
        }
        bool typed = false;
        for (uint32_t j = 0; j < v->via.map.size; j++) {
            const msgpack_object *lk = &v->via.map.ptr[j].key;
            if (lk->type != MSGPACK_OBJECT_STR || !number_of(&v->via.map.ptr[j].val, &x))
                continue;
            if (!typed)
                prom_family(f, fmt, name, counter, h);
            typed = true;
            fputs(name, f);
            prom_labels(f, lk->via.str.ptr, lk->via.str.size);
            fputc(' ', f);
            prom_value(f, x);
            fputc('\n', f);
            samples++;
        }
    }
    return samples;
}
