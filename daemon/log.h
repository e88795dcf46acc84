/* Logging with levels to stderr. Under systemd (stderr connected to the journal) every line gets
 * the "<N>" priority prefix journald understands; on a terminal, a level word instead. Safe to
 * call from any thread (one write(2) per line). */
#ifndef SIL_DAEMON_LOG_H
#define SIL_DAEMON_LOG_H

#include "daemon/config.h"

void sil_log_init(int level);
void sil_log_set_level(int level);
int sil_log_level(void);
void sil_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define sil_err(...) sil_log(SIL_LOG_ERR, __VA_ARGS__)
#define sil_warn(...) sil_log(SIL_LOG_WARNING, __VA_ARGS__)
#define sil_notice(...) sil_log(SIL_LOG_NOTICE, __VA_ARGS__)
#define sil_info(...) sil_log(SIL_LOG_INFO, __VA_ARGS__)
#define sil_debug(...) sil_log(SIL_LOG_DEBUG, __VA_ARGS__)

#endif
