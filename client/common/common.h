/* Code shared by sil-chat, sil-probe and sil-bench: connecting, option parsing, paths, time,
 * generation parameters, and the probe's verdict and Prometheus output (kept here, out of the
 * programs, so tests/test_client.c can check them). Links libsiliceo-proto only. */
#ifndef SIL_CLIENT_COMMON_H
#define SIL_CLIENT_COMMON_H

#include <stdbool.h>
#include <stddef.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>

#include "siliceo-proto.h"

/* Exit codes shared by the clients (sil-probe uses the monitoring-plugin ones instead). */
#define SIL_EXIT_OK 0
#define SIL_EXIT_ERROR 1
#define SIL_EXIT_USAGE 2

/* Resolves --socket / $SILICEO_SOCKET / the default and connects; timeout_ms <= 0: none.
 * On failure prints nothing; err says what happened. */
int sil_client_connect(struct sil_rpc_client *c, const char *socket_opt, int timeout_ms,
                       struct sil_rpc_error *err);

/* "prog: message" on stderr. */
void sil_client_warn(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sil_client_version(const char *prog);

/* A command-line mistake in one line: "prog: <message>; try 'prog --help'". */
void sil_client_usage_error(const char *prog, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* After getopt_long (with opterr = 0 and ':' leading the short options) returned '?' or ':':
 * writes what was wrong with the option it stopped at (unknown, ambiguous, missing or
 * unexpected argument), naming it as typed. */
void sil_client_bad_option_msg(int c, int argc, char **argv, const struct option *lo, char *buf,
                               size_t size);
/* The same, printed by sil_client_usage_error(). */
void sil_client_bad_option(const char *prog, int c, int argc, char **argv, const struct option *lo);

/* Writes model text for a terminal: C0 control bytes (but \n and \t), DEL and C1 controls
 * shown in caret or \u form (ESC as ^[), so the model cannot move the cursor, retitle the window
 * or hide text. Everything else, UTF-8 included, as is. */
void sil_client_write_tty(FILE *f, const char *s, size_t n);

/* Strict numeric option parsing: the whole string, in range; prints "prog: --opt: ..." and
 * returns -EINVAL otherwise. */
int sil_client_parse_long(const char *prog, const char *opt, const char *s, long min, long max,
                          long *out);
int sil_client_parse_double(const char *prog, const char *opt, const char *s, double min,
                            double max, double *out);
/* "1,2,4,8" -> values (each in [min, max]); returns the count or -EINVAL. */
int sil_client_parse_list(const char *prog, const char *opt, const char *s, long min, long max,
                          long *out, int max_n);

/* Monotonic seconds. */
double sil_client_now(void);

/* $XDG_STATE_HOME/siliceo/<file>, else $HOME/.local/state/siliceo/<file>; creates the
 * directory (0700). 0 or a negative errno. */
int sil_client_state_path(const char *file, char *buf, size_t size);

/* Reads a whole stream (stdin) into a NUL-terminated malloc'd buffer, at most max bytes;
 * -EFBIG beyond. */
int sil_client_read_all(FILE *f, size_t max, char **out, size_t *len);

/* Generation parameters shared by sil-chat and sil-bench; a field < 0 (or NULL) is not sent. */
struct sil_client_gen {
    long max_tokens;
    long max_thinking_tokens; /* -2: not sent (-1 means "no limit" on the wire) */
    long grace_tokens;        /* tokens past max_tokens to end a sentence; -1: not sent */
    double temperature, top_p, min_p, repeat_penalty;
    double presence_penalty; /* NAN: not sent */
    long top_k;
    long long seed;          /* < 0: not sent */
    const char *stop[16];
    int n_stop;
    const char *session;
    const char *priority;
    int think;               /* -1 not sent, 0 / 1 */
    const char *model;       /* the model's name (siliceo-rpc(7) models); NULL: not sent */
};
void sil_client_gen_init(struct sil_client_gen *g);
/* Number of map entries sil_client_pack_gen() will write. */
int sil_client_gen_count(const struct sil_client_gen *g);
/* Packs the entries (the caller packs the map header with count + its own fields). */
void sil_client_pack_gen(msgpack_packer *pk, const struct sil_client_gen *g);

/* ---- sil-probe -------------------------------------------------------------------------------- */

enum sil_probe_code { SIL_PROBE_OK = 0, SIL_PROBE_WARNING = 1, SIL_PROBE_CRITICAL = 2, SIL_PROBE_UNKNOWN = 3 };
const char *sil_probe_code_name(int code); /* "OK", "WARNING", ... */

struct sil_probe_limits {
    long warn_queue, crit_queue;           /* queued requests; < 0: no check */
    double warn_latency_ms, crit_latency_ms; /* < 0: no check */
};

/* The verdict from a status result and the measured latency (of status, or of the generation
 * round trip when gen_ms >= 0). Writes the one-line summary (Nagios style: text | perfdata). */
int sil_probe_eval(const struct sil_probe_limits *lim, const msgpack_object *status,
                   double status_ms, double gen_ms, char *line, size_t size);

/* Prometheus output: the classic text format (0.0.4, what Prometheus and node_exporter's
 * textfile collector read) or OpenMetrics 1.0 (counter families named without _total, # EOF). */
enum sil_prom_format { SIL_PROM_TEXT, SIL_PROM_OPENMETRICS };

/* Writes a metrics result ({metrics: {name: number or {labels: number}}, help?: {name: text}}):
 * names sanitised to [a-zA-Z0-9_:], those ending in _total as counters, others as gauges, each
 * family with # HELP (the daemon's, else the known one, else a generic line) and # TYPE. Keys
 * that would make two families of one name (siliceo_clients beside siliceo_clients_total; it is
 * renamed siliceo_connected_clients) are renamed or left out. Returns the samples written. */
int sil_probe_prom(FILE *f, const msgpack_object *metrics, enum sil_prom_format fmt);
/* One gauge family with its help (sil-probe's own siliceo_up, siliceo_probe_latency_seconds). */
void sil_prom_gauge(FILE *f, enum sil_prom_format fmt, const char *name, double v);
/* The end of the exposition: # EOF for OpenMetrics, nothing for the text format. */
void sil_prom_end(FILE *f, enum sil_prom_format fmt);

#endif
