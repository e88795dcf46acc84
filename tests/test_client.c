/* Client helpers (option parsing, paths, generation params, probe verdict, Prometheus output)
 * and the client programs end to end against a fake server thread on a private socket. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "client/common/common.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- helpers ---------------------------------------------------------------------------------- */

static msgpack_object decode_owned(msgpack_sbuffer *sb, msgpack_unpacked *up)
{
    msgpack_unpacked_init(up);
    size_t off = 0;
    assert_int_equal(msgpack_unpack_next(up, sb->data, sb->size, &off), MSGPACK_UNPACK_SUCCESS);
    return up->data;
}

/* status {state, model{name}, backend, queue{running, queued}, uptime_s} */
static void pack_status(msgpack_packer *pk, const char *state, int queued)
{
    msgpack_pack_map(pk, 5);
    sil_rpc_kv_str(pk, "state", state);
    sil_rpc_pack_cstr(pk, "model");
    msgpack_pack_map(pk, 1);
    sil_rpc_kv_str(pk, "name", "tiny");
    sil_rpc_kv_str(pk, "backend", "cpu");
    sil_rpc_pack_cstr(pk, "queue");
    msgpack_pack_map(pk, 2);
    sil_rpc_kv_int(pk, "running", 1);
    sil_rpc_kv_int(pk, "queued", queued);
    sil_rpc_kv_double(pk, "uptime_s", 12);
}

/* ---- option parsing and paths ----------------------------------------------------------------- */

static void test_parse(void **state)
{
    long l = 0;
    double d = 0;
    assert_int_equal(sil_client_parse_long("t", "--n", "42", 1, 100, &l), 0);
    assert_int_equal(l, 42);
    assert_int_equal(sil_client_parse_long("t", "--n", "42x", 1, 100, &l), -EINVAL);
    assert_int_equal(sil_client_parse_long("t", "--n", "", 1, 100, &l), -EINVAL);
    assert_int_equal(sil_client_parse_long("t", "--n", "101", 1, 100, &l), -EINVAL);
    assert_int_equal(sil_client_parse_long("t", "--n", "99999999999999999999", 1, LONG_MAX, &l), -EINVAL);
    assert_int_equal(l, 42);
    assert_int_equal(sil_client_parse_double("t", "--x", "0.25", 0, 1, &d), 0);
    assert_true(d == 0.25);
    assert_int_equal(sil_client_parse_double("t", "--x", "nan", 0, 1, &d), -EINVAL);
    assert_int_equal(sil_client_parse_double("t", "--x", "1.5", 0, 1, &d), -EINVAL);
    long v[4];
    assert_int_equal(sil_client_parse_list("t", "-c", "1,2,4,8", 1, 256, v, 4), 4);
    assert_int_equal(v[3], 8);
    assert_int_equal(sil_client_parse_list("t", "-c", "3", 1, 256, v, 4), 1);
    assert_int_equal(v[0], 3);
    assert_int_equal(sil_client_parse_list("t", "-c", "1,,2", 1, 256, v, 4), -EINVAL);
    assert_int_equal(sil_client_parse_list("t", "-c", "1,2,", 1, 256, v, 4), -EINVAL);
    assert_int_equal(sil_client_parse_list("t", "-c", "1,2,3,4,5", 1, 256, v, 4), -EINVAL);
    assert_int_equal(sil_client_parse_list("t", "-c", "0", 1, 256, v, 4), -EINVAL);
}

static void test_state_path_and_read_all(void **state)
{
    char dir[] = "/tmp/test_client.XXXXXX";
    assert_non_null(mkdtemp(dir));
    char xdg[128], buf[256];
    snprintf(xdg, sizeof(xdg), "%s/state", dir);
    setenv("XDG_STATE_HOME", xdg, 1);
    assert_int_equal(sil_client_state_path("history", buf, sizeof(buf)), 0);
    char want[256];
    snprintf(want, sizeof(want), "%s/siliceo/history", xdg);
    assert_string_equal(buf, want);
    struct stat st;
    snprintf(want, sizeof(want), "%s/siliceo", xdg);
    assert_int_equal(stat(want, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0700);
    /* relative XDG_STATE_HOME is ignored (XDG spec): falls back to HOME */
    setenv("XDG_STATE_HOME", "relative", 1);
    setenv("HOME", dir, 1);
    assert_int_equal(sil_client_state_path("h", buf, sizeof(buf)), 0);
    snprintf(want, sizeof(want), "%s/.local/state/siliceo/h", dir);
    assert_string_equal(buf, want);
    assert_int_equal(sil_client_state_path("h", buf, 10), -ENAMETOOLONG);

    char text[10000];
    memset(text, 'a', sizeof(text));
    FILE *f = fmemopen(text, sizeof(text), "r");
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(sil_client_read_all(f, sizeof(text), &out, &len), 0);
    assert_int_equal(len, sizeof(text));
    assert_int_equal(out[len], 0);
    assert_int_equal(out[len - 1], 'a');
    free(out);
    rewind(f);
    assert_int_equal(sil_client_read_all(f, sizeof(text) - 1, &out, &len), -EFBIG);
    fclose(f);
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_gen_params(void **state)
{
    struct sil_client_gen g;
    sil_client_gen_init(&g);
    assert_int_equal(sil_client_gen_count(&g), 0);
    g.max_tokens = 10;
    g.max_thinking_tokens = -1; /* "no limit" is sent */
    g.temperature = 0;
    g.top_k = 5;
    g.seed = 7;
    g.stop[g.n_stop++] = "END";
    g.session = "s1";
    g.think = 0;
    int n = sil_client_gen_count(&g);
    assert_int_equal(n, 8);
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, (size_t)n);
    sil_client_pack_gen(&pk, &g);
    msgpack_unpacked up;
    msgpack_object o = decode_owned(&sb, &up);
    assert_int_equal(o.via.map.size, 8);
    assert_int_equal(sil_rpc_map_int(&o, "max_tokens", 0), 10);
    assert_int_equal(sil_rpc_map_int(&o, "max_thinking_tokens", 0), -1);
    assert_true(sil_rpc_map_double(&o, "temperature", 9) == 0);
    assert_int_equal(sil_rpc_map_int(&o, "seed", 0), 7);
    assert_false(sil_rpc_map_bool(&o, "think", true));
    char s[8];
    assert_string_equal(sil_rpc_map_str(&o, "session", s, sizeof(s), NULL), "s1");
    assert_null(sil_rpc_map_get(&o, "top_p"));
    const msgpack_object *stop = sil_rpc_map_get(&o, "stop");
    assert_non_null(stop);
    assert_int_equal(stop->via.array.size, 1);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
}

/* ---- probe ------------------------------------------------------------------------------------ */

static int eval(const char *state_name, int queued, const struct sil_probe_limits *lim, double ms,
                double gen_ms, char *line, size_t size)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    pack_status(&pk, state_name, queued);
    msgpack_unpacked up;
    msgpack_object o = decode_owned(&sb, &up);
    int code = sil_probe_eval(lim, &o, ms, gen_ms, line, size);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
    return code;
}

static void test_probe_eval(void **state)
{
    char line[1024];
    struct sil_probe_limits none = {-1, -1, -1, -1};
    assert_int_equal(eval("ready", 0, &none, 1.5, -1, line, sizeof(line)), SIL_PROBE_OK);
    assert_non_null(strstr(line, "SILICEO OK - ready, model tiny (cpu), 1 running, 0 queued"));
    assert_non_null(strstr(line, "| status_ms=1.500ms;;"));
    struct sil_probe_limits q = {.warn_queue = 2, .crit_queue = 5, .warn_latency_ms = -1, .crit_latency_ms = -1};
    assert_int_equal(eval("ready", 1, &q, 1, -1, line, sizeof(line)), SIL_PROBE_OK);
    assert_int_equal(eval("ready", 2, &q, 1, -1, line, sizeof(line)), SIL_PROBE_WARNING);
    assert_non_null(strstr(line, "WARNING (queue)"));
    assert_non_null(strstr(line, "queued=2;2;5"));
    assert_int_equal(eval("ready", 5, &q, 1, -1, line, sizeof(line)), SIL_PROBE_CRITICAL);
    struct sil_probe_limits l = {.warn_queue = -1, .crit_queue = -1, .warn_latency_ms = 10, .crit_latency_ms = 100};
    assert_int_equal(eval("ready", 0, &l, 9.9, -1, line, sizeof(line)), SIL_PROBE_OK);
    assert_int_equal(eval("ready", 0, &l, 10, -1, line, sizeof(line)), SIL_PROBE_WARNING);
    assert_int_equal(eval("ready", 0, &l, 150, -1, line, sizeof(line)), SIL_PROBE_CRITICAL);
    /* with --generate the generation latency is the one checked */
    assert_int_equal(eval("ready", 0, &l, 1, 50, line, sizeof(line)), SIL_PROBE_WARNING);
    assert_non_null(strstr(line, "generate 50.0 ms"));
    assert_non_null(strstr(line, "generate_ms=50.000ms;10;100"));
    assert_int_equal(eval("loading", 0, &none, 1, -1, line, sizeof(line)), SIL_PROBE_WARNING);
    assert_int_equal(eval("stopping", 0, &none, 1, -1, line, sizeof(line)), SIL_PROBE_CRITICAL);
    assert_string_equal(sil_probe_code_name(3), "UNKNOWN");
}

/* The host tier's figures join the line only while it is on. */
static void probe_tier_line(bool on, char *line, size_t size)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 4);
    sil_rpc_kv_str(&pk, "state", "ready");
    sil_rpc_kv_str(&pk, "backend", "cpu");
    sil_rpc_pack_cstr(&pk, "expert_cache"); /* none: nil, as the daemon sends it */
    msgpack_pack_nil(&pk);
    sil_rpc_pack_cstr(&pk, "host_tier");
    msgpack_pack_map(&pk, 4);
    sil_rpc_kv_bool(&pk, "on", on);
    sil_rpc_kv_uint(&pk, "hits", 12);
    sil_rpc_kv_uint(&pk, "misses", 3);
    sil_rpc_kv_uint(&pk, "bytes_read", 5u << 19);
    msgpack_unpacked up;
    msgpack_object o = decode_owned(&sb, &up);
    struct sil_probe_limits none = {-1, -1, -1, -1};
    assert_int_equal(sil_probe_eval(&none, &o, 1, -1, line, size), SIL_PROBE_OK);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
}

/* A cache's hit rate, or that there is none (status's expert_cache nil). */
static void test_probe_no_cache(void **state)
{
    (void)state;
    char line[1024];
    probe_tier_line(false, line, sizeof line);
    assert_non_null(strstr(line, ", no expert cache"));
    assert_null(strstr(line, "hit rate"));
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    msgpack_pack_map(&pk, 2);
    sil_rpc_kv_str(&pk, "state", "ready");
    sil_rpc_pack_cstr(&pk, "expert_cache");
    msgpack_pack_map(&pk, 1);
    sil_rpc_kv_double(&pk, "hit_rate", 0.875);
    msgpack_unpacked up;
    msgpack_object o = decode_owned(&sb, &up);
    struct sil_probe_limits none = {-1, -1, -1, -1};
    assert_int_equal(sil_probe_eval(&none, &o, 1, -1, line, sizeof line), SIL_PROBE_OK);
    assert_non_null(strstr(line, ", expert hit rate 87.5%"));
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
}

static void test_probe_host_tier(void **state)
{
    char line[1024];
    probe_tier_line(true, line, sizeof(line));
    assert_non_null(strstr(line, ", host tier 12 hits, 3 misses, 2.5 MiB read, up "));
    probe_tier_line(false, line, sizeof(line));
    assert_null(strstr(line, "host tier"));
}

static char *prom_fmt(void (*fill)(msgpack_packer *), int *samples, enum sil_prom_format fmt)
{
    msgpack_sbuffer sb;
    msgpack_sbuffer_init(&sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
    fill(&pk);
    msgpack_unpacked up;
    msgpack_object o = decode_owned(&sb, &up);
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    *samples = sil_probe_prom(f, &o, fmt);
    fclose(f);
    msgpack_unpacked_destroy(&up);
    msgpack_sbuffer_destroy(&sb);
    return s;
}

static char *prom_of(void (*fill)(msgpack_packer *), int *samples)
{
    return prom_fmt(fill, samples, SIL_PROM_TEXT);
}

static void fill_metrics(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 5);
    sil_rpc_kv_uint(pk, "siliceo_requests_total", 12);
    sil_rpc_kv_double(pk, "siliceo_uptime_seconds", 1.5);
    sil_rpc_kv_str(pk, "siliceo_ignored", "text");
    sil_rpc_pack_cstr(pk, "siliceo_expert hit-rate");
    msgpack_pack_map(pk, 2);
    sil_rpc_kv_double(pk, "layer=\"0\"", 0.5);
    sil_rpc_kv_double(pk, "layer=1,kind=\"a\\b\"", 0.25);
    sil_rpc_kv_int(pk, "siliceo_queue_running", 2);
}

static void fill_wrapped(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 1);
    sil_rpc_pack_cstr(pk, "metrics");
    fill_metrics(pk);
}

static void test_prom(void **state)
{
    int n = 0;
    char *s = prom_of(fill_metrics, &n);
    assert_int_equal(n, 5);
    assert_string_equal(s,
                        "# HELP siliceo_requests_total generation requests accepted\n"
                        "# TYPE siliceo_requests_total counter\nsiliceo_requests_total 12\n"
                        "# HELP siliceo_uptime_seconds seconds since siliceod started\n"
                        "# TYPE siliceo_uptime_seconds gauge\nsiliceo_uptime_seconds 1.5\n"
                        "# HELP siliceo_expert_hit_rate siliceo_expert_hit_rate as reported by "
                        "siliceod\n"
                        "# TYPE siliceo_expert_hit_rate gauge\n"
                        "siliceo_expert_hit_rate{layer=\"0\"} 0.5\n"
                        "siliceo_expert_hit_rate{layer=\"1\",kind=\"a\\\\b\"} 0.25\n"
                        "# HELP siliceo_queue_running generation requests running\n"
                        "# TYPE siliceo_queue_running gauge\nsiliceo_queue_running 2\n");
    free(s);
    char *w = prom_of(fill_wrapped, &n);
    assert_int_equal(n, 5);
    assert_non_null(strstr(w, "siliceo_requests_total 12\n"));
    free(w);
}

/* The daemon's names of today: a gauge and a counter of one OpenMetrics family; a key that
 * sanitises to a name already taken; help sent by the daemon, with a quote and a newline. */
static void fill_clashing(msgpack_packer *pk)
{
    msgpack_pack_map(pk, 2);
    sil_rpc_pack_cstr(pk, "metrics");
    msgpack_pack_map(pk, 6);
    sil_rpc_kv_uint(pk, "siliceo_clients", 2);
    sil_rpc_kv_uint(pk, "siliceo_clients_total", 7);
    sil_rpc_kv_uint(pk, "siliceo_sessions", 1);
    sil_rpc_kv_uint(pk, "siliceo sessions", 9);
    sil_rpc_kv_uint(pk, "siliceo_busy", 1);
    sil_rpc_kv_uint(pk, "siliceo_busy_total", 3);
    sil_rpc_pack_cstr(pk, "help");
    msgpack_pack_map(pk, 1);
    sil_rpc_kv_str(pk, "siliceo_sessions", "named \"sessions\"\nheld");
}

static void test_prom_families(void **state)
{
    int n = 0;
    char *s = prom_fmt(fill_clashing, &n, SIL_PROM_TEXT);
    /* renamed, counter kept, duplicate left out, the unknown clashing gauge left out */
    assert_int_equal(n, 4);
    assert_non_null(strstr(s, "# HELP siliceo_connected_clients clients connected now\n"
                              "# TYPE siliceo_connected_clients gauge\n"
                              "siliceo_connected_clients 2\n"));
    assert_non_null(strstr(s, "# TYPE siliceo_clients_total counter\nsiliceo_clients_total 7\n"));
    assert_null(strstr(s, "siliceo_clients "));
    assert_non_null(strstr(s, "# HELP siliceo_sessions named \"sessions\"\\nheld\n"));
    assert_non_null(strstr(s, "siliceo_sessions 1\n"));
    assert_null(strstr(s, "siliceo_sessions 9"));
    assert_null(strstr(s, "siliceo_busy "));
    assert_non_null(strstr(s, "siliceo_busy_total 3\n"));
    free(s);
    /* OpenMetrics: a counter's family has no _total, its sample does; quotes escaped in help */
    s = prom_fmt(fill_clashing, &n, SIL_PROM_OPENMETRICS);
    assert_int_equal(n, 4);
    assert_non_null(strstr(s, "# HELP siliceo_clients connections accepted\n"
                              "# TYPE siliceo_clients counter\nsiliceo_clients_total 7\n"));
    assert_non_null(strstr(s, "# HELP siliceo_sessions named \\\"sessions\\\"\\nheld\n"));
    free(s);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    sil_prom_gauge(f, SIL_PROM_OPENMETRICS, "siliceo_up", 1);
    sil_prom_end(f, SIL_PROM_OPENMETRICS);
    sil_prom_end(f, SIL_PROM_TEXT);
    fclose(f);
    assert_string_equal(buf, "# HELP siliceo_up 1 when sil-probe reached siliceod and read its "
                             "metrics, else 0\n# TYPE siliceo_up gauge\nsiliceo_up 1\n# EOF\n");
    free(buf);
}

/* getopt_long the way the clients call it, then the one-line message. */
static void bad_option(const char *const *args, int n, const char *want)
{
    static const struct option lo[] = {
        {"socket", required_argument, 0, 256},
        {"session", required_argument, 0, 'S'},
        {"json", no_argument, 0, 257},
        {"stdin", no_argument, 0, 's'},
        {"max-tokens", required_argument, 0, 'n'},
        {0, 0, 0, 0},
    };
    char *argv[8];
    for (int i = 0; i < n; i++)
        argv[i] = (char *)args[i];
    argv[n] = NULL;
    optind = 0;
    opterr = 0;
    int c, bad = 0;
    while ((c = getopt_long(n, argv, "+:sS:n:", lo, NULL)) != -1)
        if (c == '?' || c == ':') {
            bad = c;
            break;
        }
    assert_true(bad != 0);
    char msg[256];
    sil_client_bad_option_msg(bad, n, argv, lo, msg, sizeof(msg));
    assert_string_equal(msg, want);
}

static void test_bad_option(void **state)
{
    bad_option((const char *[]){"p", "--bogus", "x"}, 3, "unknown option '--bogus'");
    bad_option((const char *[]){"p", "--bogus=1"}, 2, "unknown option '--bogus'");
    bad_option((const char *[]){"p", "--socket"}, 2, "option '--socket' needs an argument");
    bad_option((const char *[]){"p", "--max-tokens"}, 2, "option '--max-tokens' needs an argument");
    bad_option((const char *[]){"p", "-n"}, 2, "option '-n' needs an argument");
    bad_option((const char *[]){"p", "--s", "x"}, 3,
               "option '--s' is ambiguous (--socket, --session, --stdin)");
    bad_option((const char *[]){"p", "--json=yes"}, 2, "option '--json' takes no argument");
    bad_option((const char *[]){"p", "-x"}, 2, "unknown option '-x'");
    bad_option((const char *[]){"p", "--json", "-sxs"}, 3, "unknown option '-x'");
    bad_option((const char *[]){"p", "-sx"}, 2, "unknown option '-x'");
}

static char *tty_text(const char *s, size_t n)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    sil_client_write_tty(f, s, n);
    fclose(f);
    return buf;
}

static void test_write_tty(void **state)
{
    const char in[] = "a\tb\nc\033[2J\033]0;title\007\r\bz\177 caf\xc3\xa9 \xc2\x9b"
                      "1m \xe2\x82\xac";
    char *out = tty_text(in, sizeof(in) - 1);
    assert_string_equal(out, "a\tb\nc^[[2J^[]0;title^G^M^Hz^? caf\xc3\xa9 \\u009b1m \xe2\x82\xac");
    free(out);
    out = tty_text("x\0y", 3);
    assert_string_equal(out, "x^@y");
    free(out);
}

static void test_socket_candidates(void **state)
{
    char p[SIL_RPC_MAX_CANDIDATES][4096];
    char want[4096];
    setenv("SILICEO_SOCKET", "/env.sock", 1);
    assert_int_equal(sil_rpc_socket_candidates("/opt.sock", p, 2), 1);
    assert_string_equal(p[0], "/opt.sock");
    assert_int_equal(sil_rpc_socket_candidates(NULL, p, 2), 1);
    assert_string_equal(p[0], "/env.sock");
    unsetenv("SILICEO_SOCKET");
    setenv("XDG_RUNTIME_DIR", "/xdg", 1);
    assert_int_equal(sil_rpc_socket_candidates("", p, 2), 2);
    if (geteuid() == 0) {
        assert_string_equal(p[0], "/run/siliceo/siliceod.sock");
        assert_string_equal(p[1], "/xdg/siliceo/siliceod.sock");
    } else {
        assert_string_equal(p[0], "/xdg/siliceo/siliceod.sock");
        assert_string_equal(p[1], "/run/siliceo/siliceod.sock");
    }
    unsetenv("XDG_RUNTIME_DIR");
    int n = sil_rpc_socket_candidates(NULL, p, 2);
    snprintf(want, sizeof(want), "/run/user/%u/siliceo/siliceod.sock", (unsigned)geteuid());
    assert_int_equal(n, geteuid() == 0 ? 1 : 2);
    assert_string_equal(p[0], geteuid() == 0 ? SIL_RPC_SYSTEM_SOCKET : want);
    /* Every path tried is named, with its reason. */
    char dir[] = "/tmp/test_client_sock.XXXXXX";
    assert_non_null(mkdtemp(dir));
    setenv("XDG_RUNTIME_DIR", dir, 1);
    struct sil_rpc_error e = {0};
    int r = sil_rpc_connect_any(NULL, &e);
    if (r >= 0) { /* a system daemon runs on this machine */
        close(r);
        unsetenv("XDG_RUNTIME_DIR");
        rmdir(dir);
        return;
    }
    assert_true(r == -ENOENT || r == -ECONNREFUSED || r == -EACCES);
    snprintf(want, sizeof(want), "%s/siliceo/siliceod.sock (No such file or directory)", dir);
    assert_non_null(strstr(e.msg, want));
    assert_non_null(strstr(e.msg, "cannot connect to siliceod: tried "));
    assert_non_null(strstr(e.msg, SIL_RPC_SYSTEM_SOCKET " ("));
    /* What it means: with nothing at either path, that no daemon runs (never a group to join). */
    if (r == -ENOENT)
        assert_non_null(strstr(e.msg, "; no siliceod runs, neither yours nor the system's"));
    assert_null(strstr(e.msg, "join"));
    unsetenv("XDG_RUNTIME_DIR");
    rmdir(dir);
}

/* A refused peer: the server writes an error about the connection and closes, before (the
 * client's send then fails with EPIPE) or after the client's request arrived. The error has a
 * nil msgid (siliceod now) or msgid 0 (older daemons); both end the call. */
static void send_buf(int fd, struct sil_rpc_buf *b);
static int refuse_nil; /* the form refuse_on writes */

static void refuse_on(int fd)
{
    struct sil_rpc_buf b;
    sil_rpc_buf_init(&b, 0);
    if (refuse_nil)
        sil_rpc_pack_conn_error(&b, SIL_RPC_E_PERMISSION, "permission denied: uid 7 is not allowed");
    else
        sil_rpc_pack_error_response(&b, 0, SIL_RPC_E_PERMISSION,
                                    "permission denied: uid 7 is not allowed");
    send_buf(fd, &b);
    sil_rpc_buf_free(&b);
    close(fd);
}

/* Refuses once the request is there, without reading it. */
static void *refuse_after_request(void *arg)
{
    int fd = *(int *)arg;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    poll(&p, 1, 5000);
    refuse_on(fd);
    return NULL;
}

static void test_refused(void **state)
{
    for (int run = 0; run < 4; run++) {
        int order = run & 1;
        refuse_nil = run >> 1;
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        struct sil_rpc_client c;
        assert_int_equal(sil_rpc_client_init_fd(&c, sv[0], NULL), 0);
        c.timeout_ms = 5000;
        pthread_t th;
        if (order == 0)
            refuse_on(sv[1]);
        else
            pthread_create(&th, NULL, refuse_after_request, &sv[1]);
        struct sil_rpc_error e = {0};
        int r = sil_rpc_client_call0(&c, "status", NULL, NULL, NULL, &e);
        if (order == 1)
            pthread_join(th, NULL);
        assert_int_equal(r, -EREMOTEIO);
        assert_int_equal(e.code, SIL_RPC_E_PERMISSION);
        assert_string_equal(e.msg, "permission denied: uid 7 is not allowed");
        sil_rpc_client_close(&c);
    }
}

/* A server that refuses the first `refusals` requests with error 13 and retry_after_ms 30 (a
 * reload), then answers {ok: true}; counts the requests it read. */
struct reloading {
    int fd, refusals, seen;
};

static void *reloading_main(void *arg)
{
    struct reloading *r = arg;
    struct sil_rpc_unpacker *up = sil_rpc_unpacker_new(0, 0);
    for (;;) {
        struct sil_rpc_msg m;
        struct sil_rpc_error e = {0};
        int k;
        while ((k = sil_rpc_unpacker_next(up, &m, &e)) == 1) {
            struct sil_rpc_buf b;
            sil_rpc_buf_init(&b, 0);
            if (r->seen++ < r->refusals) {
                msgpack_packer *pk = sil_rpc_begin_error_response(&b, m.msgid);
                msgpack_pack_map(pk, 3);
                sil_rpc_kv_int(pk, "code", SIL_RPC_E_UNAVAILABLE);
                sil_rpc_kv_str(pk, "message", "the model is being reloaded");
                sil_rpc_kv_int(pk, "retry_after_ms", 30);
                sil_rpc_end_error_response(&b);
            } else {
                msgpack_packer *pk = sil_rpc_begin_response(&b, m.msgid);
                msgpack_pack_map(pk, 1);
                sil_rpc_kv_bool(pk, "ok", true);
                sil_rpc_end(&b);
            }
            send_buf(r->fd, &b);
            sil_rpc_buf_free(&b);
            sil_rpc_msg_release(&m);
        }
        size_t avail;
        void *space = sil_rpc_unpacker_space(up, 4096, &avail);
        ssize_t n = space ? read(r->fd, space, avail) : -1;
        if (n <= 0) break;
        sil_rpc_unpacker_commit(up, (size_t)n);
    }
    sil_rpc_unpacker_free(up);
    close(r->fd);
    return NULL;
}

/* Error 13 with a retry_after_ms hint: the client sends the same request again after it, up to
 * retry_max_ms in all; with retry_max_ms 0 the error and its hint reach the caller. */
static void test_retry_after(void **state)
{
    (void)state;
    for (int run = 0; run < 3; run++) {
        int sv[2];
        assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        struct reloading r = {sv[1], run == 2 ? 1000 : 3, 0};
        struct sil_rpc_client c;
        assert_int_equal(sil_rpc_client_init_fd(&c, sv[0], NULL), 0);
        assert_int_equal(c.retry_max_ms, 60000);
        c.timeout_ms = 5000;
        if (run == 1) c.retry_max_ms = 0;
        if (run == 2) c.retry_max_ms = 200; /* a reload that outlasts the client's patience */
        pthread_t th;
        pthread_create(&th, NULL, reloading_main, &r);
        struct sil_rpc_error e = {0};
        const msgpack_object *res = NULL;
        msgpack_packer *pk = sil_rpc_client_begin(&c, "status");
        msgpack_pack_map(pk, 0);
        int rc = sil_rpc_client_call(&c, NULL, NULL, &res, &e);
        sil_rpc_client_close(&c);
        pthread_join(th, NULL);
        if (run == 0) {
            assert_int_equal(rc, 0);
            assert_int_equal(r.seen, 4); /* three refused, the fourth answered */
        } else {
            assert_int_equal(rc, -EREMOTEIO);
            assert_int_equal(e.code, SIL_RPC_E_UNAVAILABLE);
            assert_int_equal(e.retry_after_ms, 30);
            if (run == 1) assert_int_equal(r.seen, 1);
            else assert_true(r.seen >= 2 && r.seen <= 8);
        }
    }
}

/* ---- the programs against a fake server ------------------------------------------------------- */

struct fake {
    int lfd;
    volatile int stop;
    int queued;
    pthread_t th;
    char path[128];
    char dir[64];
    char last_content[256];
};

static void send_buf(int fd, struct sil_rpc_buf *b)
{
    while (sil_rpc_buf_size(b) > 0) {
        ssize_t w = write(fd, sil_rpc_buf_head(b), sil_rpc_buf_size(b));
        if (w <= 0)
            break;
        sil_rpc_buf_consume(b, (size_t)w);
    }
}

static void token(struct sil_rpc_buf *b, uint32_t id, const char *key, const char *text)
{
    msgpack_packer *pk = sil_rpc_begin_notification(b, "token");
    msgpack_pack_array(pk, 1);
    msgpack_pack_map(pk, 3);
    sil_rpc_kv_uint(pk, "id", id);
    sil_rpc_kv_str(pk, key, text);
    sil_rpc_pack_cstr(pk, "ids");
    msgpack_pack_array(pk, 0);
    sil_rpc_end(b);
}

/* chat: streams reasoning "hmm", then "echo: " + the last message's content. */
static void handle(struct fake *f, int fd, const struct sil_rpc_msg *m, struct sil_rpc_buf *b)
{
    if (!strcmp(m->method, "chat") || !strcmp(m->method, "generate")) {
        const char *content = "";
        size_t n = 0;
        const msgpack_object *msgs = NULL;
        if (sil_rpc_get_array(m->params, "messages", &msgs, 0, NULL) == 1 && msgs->via.array.size)
            sil_rpc_get_str(&msgs->via.array.ptr[msgs->via.array.size - 1], "content", &content, &n, 0, NULL);
        else
            sil_rpc_get_str(m->params, "prompt", &content, &n, 0, NULL);
        snprintf(f->last_content, sizeof(f->last_content), "%.*s", (int)n, content);
        token(b, m->msgid, "reasoning", "hmm");
        token(b, m->msgid, "text", "echo: ");
        token(b, m->msgid, "text", f->last_content);
        msgpack_packer *pk = sil_rpc_begin_response(b, m->msgid);
        msgpack_pack_map(pk, 4);
        char text[300];
        snprintf(text, sizeof(text), "echo: %s", f->last_content);
        sil_rpc_kv_str(pk, "text", text);
        sil_rpc_kv_str(pk, "reasoning", "hmm");
        sil_rpc_kv_str(pk, "stop_reason", "eos");
        sil_rpc_kv_int(pk, "n_generated", 3);
        sil_rpc_end(b);
    } else if (!strcmp(m->method, "status")) {
        pack_status(sil_rpc_begin_response(b, m->msgid), "ready", f->queued);
        sil_rpc_end(b);
    } else if (!strcmp(m->method, "metrics")) {
        fill_metrics(sil_rpc_begin_response(b, m->msgid));
        sil_rpc_end(b);
    } else {
        sil_rpc_pack_error_response(b, m->msgid, SIL_RPC_E_METHOD_NOT_FOUND, "unknown method");
    }
    send_buf(fd, b);
}

static void *fake_main(void *arg)
{
    struct fake *f = arg;
    while (!f->stop) {
        struct pollfd p = {.fd = f->lfd, .events = POLLIN};
        if (poll(&p, 1, 50) <= 0)
            continue;
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        struct sil_rpc_unpacker *u = sil_rpc_unpacker_new(0, 0);
        struct sil_rpc_buf b;
        sil_rpc_buf_init(&b, 0);
        char chunk[4096];
        ssize_t n;
        while ((n = read(fd, chunk, sizeof(chunk))) > 0) {
            sil_rpc_unpacker_feed(u, chunk, (size_t)n, NULL);
            struct sil_rpc_msg m;
            int r;
            while ((r = sil_rpc_unpacker_next(u, &m, NULL)) == 1) {
                handle(f, fd, &m, &b);
                sil_rpc_msg_release(&m);
            }
            if (r < 0)
                break;
        }
        sil_rpc_buf_free(&b);
        sil_rpc_unpacker_free(u);
        close(fd);
    }
    return NULL;
}

static int fake_setup(void **state)
{
    struct fake *f = calloc(1, sizeof(*f));
    if (!f)
        return -1;
    snprintf(f->dir, sizeof(f->dir), "/tmp/test_client.XXXXXX");
    if (!mkdtemp(f->dir)) {
        free(f);
        return -1;
    }
    snprintf(f->path, sizeof(f->path), "%s/s.sock", f->dir);
    f->lfd = sil_rpc_listen(f->path, 0600, 8, NULL);
    if (f->lfd < 0) {
        rmdir(f->dir);
        free(f);
        return -1;
    }
    pthread_create(&f->th, NULL, fake_main, f);
    *state = f;
    return 0;
}

static int fake_teardown(void **state)
{
    struct fake *f = *state;
    f->stop = 1;
    pthread_join(f->th, NULL);
    close(f->lfd);
    unlink(f->path);
    rmdir(f->dir);
    free(f);
    return 0;
}

/* Runs a shell command line, returns its stdout (malloc'd) and exit status. */
static char *run(const char *cmd, int *status)
{
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(sil_client_read_all(p, 1 << 20, &out, &len), 0);
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

static const char *bin_dir(void)
{
    const char *b = getenv("SIL_BUILD");
    static char dir[512];
    snprintf(dir, sizeof(dir), "%s/bin", b ? b : "build");
    char p[600];
    snprintf(p, sizeof(p), "%s/sil-chat", dir);
    return access(p, X_OK) == 0 ? dir : NULL;
}

static void test_sil_chat(void **state)
{
    struct fake *f = *state;
    const char *bin = bin_dir();
    if (!bin)
        skip();
    char cmd[1024];
    int st;
    /* one-shot; reasoning hidden off a terminal */
    snprintf(cmd, sizeof(cmd), "%s/sil-chat --socket %s What is up 2>&1", bin, f->path);
    char *out = run(cmd, &st);
    assert_int_equal(st, 0);
    assert_string_equal(out, "echo: What is up\n");
    assert_string_equal(f->last_content, "What is up");
    free(out);
    /* --show-reasoning, plain (not a tty: no escape codes) */
    snprintf(cmd, sizeof(cmd), "%s/sil-chat --show-reasoning --socket %s q 2>&1", bin, f->path);
    out = run(cmd, &st);
    assert_string_equal(out, "hmm\n\necho: q\n");
    free(out);
    /* stdin as context, the argument as instruction; $SILICEO_SOCKET */
    snprintf(cmd, sizeof(cmd), "printf 'line1\\nline2' | SILICEO_SOCKET=%s %s/sil-chat -s summarise 2>&1", f->path, bin);
    out = run(cmd, &st);
    assert_int_equal(st, 0);
    assert_string_equal(f->last_content, "line1\nline2\n\nsummarise");
    free(out);
    /* --json prints the result map */
    snprintf(cmd, sizeof(cmd), "%s/sil-chat --json --socket %s hi", bin, f->path);
    out = run(cmd, &st);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "\"stop_reason\": \"eos\""));
    assert_non_null(strstr(out, "\"text\": \"echo: hi\""));
    free(out);
    /* usage errors */
    snprintf(cmd, sizeof(cmd), "%s/sil-chat --temperature hot --socket %s hi 2>&1", bin, f->path);
    out = run(cmd, &st);
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "--temperature: 'hot' is not a number"));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s/sil-chat --socket %s/nope hi 2>&1", bin, f->dir);
    out = run(cmd, &st);
    assert_int_equal(st, 1);
    assert_non_null(strstr(out, "No such file or directory; no siliceod listens there"));
    free(out);
}

static void test_sil_probe(void **state)
{
    struct fake *f = *state;
    const char *bin = bin_dir();
    if (!bin)
        skip();
    char cmd[1024];
    int st;
    f->queued = 3;
    snprintf(cmd, sizeof(cmd), "%s/sil-probe --socket %s", bin, f->path);
    char *out = run(cmd, &st);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "SILICEO OK - ready, model tiny (cpu), 1 running, 3 queued"));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s/sil-probe --warn-queue 3 --crit-queue 10 --socket %s", bin, f->path);
    out = run(cmd, &st);
    assert_int_equal(st, 1);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s/sil-probe --crit-queue 2 --json --socket %s", bin, f->path);
    out = run(cmd, &st);
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "{\"status\":\"CRITICAL\",\"code\":2,"));
    assert_non_null(strstr(out, "\"daemon\":{\"state\":\"ready\""));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s/sil-probe --generate --socket %s", bin, f->path);
    out = run(cmd, &st);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "generate_ms="));
    assert_string_equal(f->last_content, "Hello");
    free(out);
    snprintf(cmd, sizeof(cmd), "%s/sil-probe --prom --socket %s", bin, f->path);
    out = run(cmd, &st);
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "siliceo_up 1\n"));
    assert_non_null(strstr(out, "siliceo_requests_total 12\n"));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s/sil-probe --prom --socket %s/nope", bin, f->dir);
    out = run(cmd, &st);
    assert_int_equal(st, 2);
    assert_non_null(strstr(out, "# TYPE siliceo_up gauge\nsiliceo_up 0\n"));
    assert_null(strstr(out, "siliceo_requests_total"));
    free(out);
    snprintf(cmd, sizeof(cmd), "%s/sil-probe --warn-queue x 2>/dev/null", bin);
    out = run(cmd, &st);
    assert_int_equal(st, 3);
    free(out);
}

static void test_versions_and_help(void **state)
{
    const char *bin = bin_dir();
    if (!bin)
        skip();
    const char *progs[] = {"sil-chat", "sil-probe", "sil-bench"};
    for (int i = 0; i < 3; i++) {
        char cmd[700];
        int st;
        snprintf(cmd, sizeof(cmd), "%s/%s --version", bin, progs[i]);
        char *out = run(cmd, &st);
        assert_int_equal(st, 0);
        char want[64];
        snprintf(want, sizeof(want), "%s %s\n", progs[i], SIL_VERSION);
        assert_string_equal(out, want);
        free(out);
        snprintf(cmd, sizeof(cmd), "%s/%s --help", bin, progs[i]);
        out = run(cmd, &st);
        assert_int_equal(st, 0);
        assert_non_null(strstr(out, "usage: "));
        assert_non_null(strstr(out, "--socket PATH"));
        free(out);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_state_path_and_read_all),
        cmocka_unit_test(test_gen_params),
        cmocka_unit_test(test_probe_eval),
        cmocka_unit_test(test_probe_host_tier),
        cmocka_unit_test(test_probe_no_cache),
        cmocka_unit_test(test_prom),
        cmocka_unit_test(test_prom_families),
        cmocka_unit_test(test_bad_option),
        cmocka_unit_test(test_write_tty),
        cmocka_unit_test(test_socket_candidates),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_retry_after),
        cmocka_unit_test_setup_teardown(test_sil_chat, fake_setup, fake_teardown),
        cmocka_unit_test_setup_teardown(test_sil_probe, fake_setup, fake_teardown),
        cmocka_unit_test(test_versions_and_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
