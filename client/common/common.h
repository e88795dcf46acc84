/* Code shared by sil-chat, sil-probe and sil-bench: connecting, option parsing, paths, time,
 * generation parameters, and the probe's verdict and Prometheus output (kept here, out of the
 * programs, so tests/test_client.c can check them). Links libsiliceo-proto only. */
#ifndef SIL_CLIENT_COMMON_H
#define SIL_CLIENT_COMMON_H

#include <stdbool.h>
#include <stddef.h>
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
    double temperature, top_p, min_p, repeat_penalty;
    double presence_penalty; /* NAN: not sent */
    long top_k;
    long long seed;          /* < 0: not sent */
    const char *stop[16];
    int n_stop;
    const char *session;
    const char *priority;
    int think;               /* -1 not sent, 0 / 1 */
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

/* Writes a metrics result in the Prometheus text exposition format: names ending in _total as
 * counters, others as gauges, map values as labelled samples. Names are sanitised to
 * [a-zA-Z0-9_:]. Returns the number of samples written. */
int sil_probe_prom(FILE *f, const msgpack_object *metrics);

#endif
