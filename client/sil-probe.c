/* sil-probe: health check of siliceod for monitoring (exit codes 0 OK, 1 WARNING, 2 CRITICAL,
 * 3 UNKNOWN), JSON, or Prometheus text. See sil-probe(1). */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "client/common/common.h"

#define PROG "sil-probe"

struct opts {
    const char *socket;
    bool json, prom, generate;
    enum sil_prom_format prom_format;
    const char *prompt;
    long gen_tokens;
    double timeout_s;
    struct sil_probe_limits lim;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: " PROG " [OPTIONS]\n"
            "Check siliceod's health: one line and an exit code (0 OK, 1 WARNING, 2 CRITICAL,\n"
            "3 UNKNOWN), as monitoring plugins do.\n"
            "\n"
            "      --warn-queue N         WARNING when N or more requests wait\n"
            "      --crit-queue N         CRITICAL when N or more requests wait\n"
            "      --warn-latency-ms MS   WARNING when the round trip takes MS or more\n"
            "      --crit-latency-ms MS   CRITICAL when the round trip takes MS or more\n"
            "  -g, --generate             also time a tiny generation (its latency is\n"
            "                             checked)\n"
            "      --prompt TEXT          prompt for --generate (default \"Hello\")\n"
            "      --generate-tokens N    tokens for --generate (default 4)\n"
            "      --json                 print the verdict and the status as JSON\n"
            "      --prom                 print the metrics in the Prometheus text format\n"
            "      --openmetrics          print the metrics in the OpenMetrics text format\n"
            "      --timeout SECONDS      give up (CRITICAL) after this long (default 10)\n"
            "      --socket PATH          daemon socket\n"
            "  -h, --help                 this help\n"
            "  -V, --version              version\n");
}

enum {
    O_WQ = 256, O_CQ, O_WL, O_CL, O_PROMPT, O_GT, O_JSON, O_PROM, O_OPENMETRICS, O_TIMEOUT, O_SOCKET
};

static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option lo[] = {
        {"warn-queue", required_argument, 0, O_WQ},
        {"crit-queue", required_argument, 0, O_CQ},
        {"warn-latency-ms", required_argument, 0, O_WL},
        {"crit-latency-ms", required_argument, 0, O_CL},
        {"generate", no_argument, 0, 'g'},
        {"prompt", required_argument, 0, O_PROMPT},
        {"generate-tokens", required_argument, 0, O_GT},
        {"json", no_argument, 0, O_JSON},
        {"prom", no_argument, 0, O_PROM},
        {"openmetrics", no_argument, 0, O_OPENMETRICS},
        {"timeout", required_argument, 0, O_TIMEOUT},
        {"socket", required_argument, 0, O_SOCKET},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":ghV", lo, NULL)) != -1) {
        int r = 0;
        switch (c) {
        case O_WQ: r = sil_client_parse_long(PROG, "--warn-queue", optarg, 0, 1000000000, &o->lim.warn_queue); break;
        case O_CQ: r = sil_client_parse_long(PROG, "--crit-queue", optarg, 0, 1000000000, &o->lim.crit_queue); break;
        case O_WL: r = sil_client_parse_double(PROG, "--warn-latency-ms", optarg, 0, 1e9, &o->lim.warn_latency_ms); break;
        case O_CL: r = sil_client_parse_double(PROG, "--crit-latency-ms", optarg, 0, 1e9, &o->lim.crit_latency_ms); break;
        case 'g': o->generate = true; break;
        case O_PROMPT: o->prompt = optarg; break;
        case O_GT: r = sil_client_parse_long(PROG, "--generate-tokens", optarg, 1, 4096, &o->gen_tokens); break;
        case O_JSON: o->json = true; break;
        case O_PROM: o->prom = true; o->prom_format = SIL_PROM_TEXT; break;
        case O_OPENMETRICS: o->prom = true; o->prom_format = SIL_PROM_OPENMETRICS; break;
        case O_TIMEOUT: r = sil_client_parse_double(PROG, "--timeout", optarg, 0.001, 86400, &o->timeout_s); break;
        case O_SOCKET: o->socket = optarg; break;
        case 'h': usage(stdout); exit(0);
        case 'V': sil_client_version(PROG); exit(0);
        default: sil_client_bad_option(PROG, c, argc, argv, lo); return -1;
        }
        if (r < 0)
            return -1;
    }
    if (optind < argc) {
        sil_client_usage_error(PROG, "unexpected argument '%s'", argv[optind]);
        return -1;
    }
    if (o->json && o->prom) {
        sil_client_usage_error(PROG, "--json and --prom (or --openmetrics) exclude each other");
        return -1;
    }
    return 0;
}

/* Prints the verdict as JSON: {status, code, summary, status_ms, generate_ms?, error?, daemon}. */
static void print_json(int code, const char *line, double status_ms, double gen_ms,
                       const char *error, const msgpack_object *status)
{
    printf("{\"status\":\"%s\",\"code\":%d,\"summary\":", sil_probe_code_name(code), code);
    sil_rpc_print_json_str(stdout, line);
    if (status_ms >= 0)
        printf(",\"status_ms\":%.3f", status_ms);
    if (gen_ms >= 0)
        printf(",\"generate_ms\":%.3f", gen_ms);
    if (error) {
        printf(",\"error\":");
        sil_rpc_print_json_str(stdout, error);
    }
    if (status) {
        printf(",\"daemon\":");
        sil_rpc_print_json(stdout, status, -1);
    }
    printf("}\n");
}

/* Connection or protocol failure: CRITICAL (the daemon is not serving). */
static int fail(const struct opts *o, const char *what, const struct sil_rpc_error *e, int r)
{
    char line[768];
    int code = SIL_PROBE_CRITICAL;
    snprintf(line, sizeof(line), "SILICEO %s - %s: %s", sil_probe_code_name(code), what,
             e->msg[0] ? e->msg : strerror(-r));
    if (o->prom) {
        /* The scrape still parses; the reason goes to stderr (the journal, or a cron mail). */
        sil_prom_gauge(stdout, o->prom_format, "siliceo_up", 0);
        sil_prom_end(stdout, o->prom_format);
        fprintf(stderr, "%s\n", line);
    }
    else if (o->json)
        print_json(code, line, -1, -1, e->msg, NULL);
    else
        printf("%s\n", line);
    return code;
}

int main(int argc, char **argv)
{
    struct opts o = {
        .prompt = "Hello",
        .gen_tokens = 4,
        .timeout_s = 10,
        .lim = {.warn_queue = -1, .crit_queue = -1, .warn_latency_ms = -1, .crit_latency_ms = -1},
    };
    if (parse_args(argc, argv, &o) < 0)
        return SIL_PROBE_UNKNOWN;

    struct sil_rpc_client c;
    struct sil_rpc_error e = {0};
    double t0 = sil_client_now();
    int r = sil_client_connect(&c, o.socket, (int)(o.timeout_s * 1000), &e);
    if (r < 0)
        return fail(&o, "cannot connect", &e, r);

    if (o.prom) {
        const msgpack_object *m = NULL;
        r = sil_rpc_client_call0(&c, "metrics", NULL, NULL, &m, &e);
        if (r < 0) {
            int code = fail(&o, "metrics", &e, r);
            sil_rpc_client_close(&c);
            return code;
        }
        double ms = (sil_client_now() - t0) * 1e3;
        sil_prom_gauge(stdout, o.prom_format, "siliceo_up", 1);
        sil_prom_gauge(stdout, o.prom_format, "siliceo_probe_latency_seconds", ms / 1e3);
        sil_probe_prom(stdout, m, o.prom_format);
        sil_prom_end(stdout, o.prom_format);
        sil_rpc_client_close(&c);
        return SIL_PROBE_OK;
    }

    const msgpack_object *st = NULL;
    r = sil_rpc_client_call0(&c, "status", NULL, NULL, &st, &e);
    double status_ms = (sil_client_now() - t0) * 1e3;
    if (r < 0) {
        int code = fail(&o, "status", &e, r);
        sil_rpc_client_close(&c);
        return code;
    }
    /* Keep the status: the next call on this client releases it. */
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer spk;
    msgpack_packer_init(&spk, &sb, msgpack_sbuffer_write);
    msgpack_pack_object(&spk, *st);
    msgpack_unpacked kept;
    msgpack_unpacked_init(&kept);
    size_t off = 0;
    msgpack_unpack_next(&kept, sb.data, sb.size, &off);

    double gen_ms = -1;
    char gen_err[600] = "";
    if (o.generate) {
        msgpack_packer *pk = sil_rpc_client_begin(&c, "generate");
        msgpack_pack_map(pk, 4);
        sil_rpc_kv_str(pk, "prompt", o.prompt);
        sil_rpc_kv_int(pk, "max_tokens", o.gen_tokens);
        sil_rpc_kv_double(pk, "temperature", 0);
        sil_rpc_kv_str(pk, "priority", "interactive");
        double g0 = sil_client_now();
        const msgpack_object *res = NULL;
        r = sil_rpc_client_call(&c, NULL, NULL, &res, &e);
        gen_ms = (sil_client_now() - g0) * 1e3;
        char reason[32];
        if (r < 0)
            snprintf(gen_err, sizeof(gen_err), "%s", e.msg);
        else if (strcmp(sil_rpc_map_str(res, "stop_reason", reason, sizeof(reason), ""), "error") == 0)
            snprintf(gen_err, sizeof(gen_err), "generation ended with an error");
    }
    sil_rpc_client_close(&c);

    char line[1024];
    int code = sil_probe_eval(&o.lim, &kept.data, status_ms, gen_ms, line, sizeof(line));
    if (gen_err[0]) {
        code = SIL_PROBE_CRITICAL;
        snprintf(line, sizeof(line), "SILICEO CRITICAL - generate failed: %s", gen_err);
    }
    if (o.json)
        print_json(code, line, status_ms, gen_ms, gen_err[0] ? gen_err : NULL, &kept.data);
    else
        printf("%s\n", line);
    msgpack_unpacked_destroy(&kept);
    msgpack_sbuffer_destroy(&sb);
    return code;
}
