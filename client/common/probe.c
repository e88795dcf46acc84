/* sil-probe's verdict (monitoring-plugin exit codes) and Prometheus text output. */
#include "client/common/common.h"

#include <ctype.h>
#include <inttypes.h>
#include <math.h>
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
    char hit[48] = "";
    const msgpack_object *ec = sil_rpc_map_get(status, "expert_cache");
    if (ec)
        snprintf(hit, sizeof(hit), ", expert hit rate %.1f%%", 100 * sil_rpc_map_double(ec, "hit_rate", 0));
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
             " queued, status %.1f ms%s%s, up %.0f s | status_ms=%.3fms;%s;%s%s running=%" PRId64
             " queued=%" PRId64 ";%s;%s",
             sil_probe_code_name(code), why, state, name, backend, running, queued, status_ms, gen,
             hit, uptime, status_ms, gen_ms >= 0 ? "" : lw, gen_ms >= 0 ? "" : lc, perf_gen,
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
    else
        fprintf(f, "%.17g", v);
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
                if (s[k] == '"' || s[k] == '\\')
                    fputc('\\', f);
                if (s[k] == '\n')
                    fputs("\\n", f);
                else
                    fputc(s[k], f);
            }
            fputc('"', f);
            first = false;
        }
        i = j > i ? j : n;
    }
    fputc('}', f);
}

int sil_probe_prom(FILE *f, const msgpack_object *metrics)
{
    if (!metrics || metrics->type != MSGPACK_OBJECT_MAP)
        return 0;
    /* Also accept the samples wrapped as {metrics: {...}}. */
    const msgpack_object *inner = sil_rpc_map_get(metrics, "metrics");
    if (metrics->via.map.size == 1 && inner && inner->type == MSGPACK_OBJECT_MAP)
        metrics = inner;
    int samples = 0;
    for (uint32_t i = 0; i < metrics->via.map.size; i++) {
        const msgpack_object *k = &metrics->via.map.ptr[i].key;
        const msgpack_object *v = &metrics->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_STR || k->via.str.size == 0)
            continue;
        char name[128];
        prom_name(k->via.str.ptr, k->via.str.size, name, sizeof(name));
        size_t len = strlen(name);
        bool counter = len > 6 && strcmp(name + len - 6, "_total") == 0;
        double x;
        if (number_of(v, &x)) {
            fprintf(f, "# TYPE %s %s\n%s ", name, counter ? "counter" : "gauge", name);
            prom_value(f, x);
            fputc('\n', f);
            samples++;
        } else if (v->type == MSGPACK_OBJECT_MAP) {
            bool typed = false;
            for (uint32_t j = 0; j < v->via.map.size; j++) {
                const msgpack_object *lk = &v->via.map.ptr[j].key;
                if (lk->type != MSGPACK_OBJECT_STR || !number_of(&v->via.map.ptr[j].val, &x))
                    continue;
                if (!typed)
                    fprintf(f, "# TYPE %s %s\n", name, counter ? "counter" : "gauge");
                typed = true;
                fputs(name, f);
                prom_labels(f, lk->via.str.ptr, lk->via.str.size);
                fputc(' ', f);
                prom_value(f, x);
                fputc('\n', f);
                samples++;
            }
        }
    }
    return samples;
}
