/* Errors as values: functions return 0 or a negative errno and fill a struct sil_error whose
 * message names the file, the field and the byte offset where that applies. */
#ifndef SIL_ERROR_H
#define SIL_ERROR_H

#include <stdarg.h>

struct sil_error {
    int code;       /* the negative errno that was returned, 0 if none */
    char msg[512];  /* one line, no trailing newline */
};

/* Sets err (which may be NULL) and returns code, so callers can `return sil_errorf(err, -EINVAL, ...)`. */
int sil_errorf(struct sil_error *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int sil_verrorf(struct sil_error *err, int code, const char *fmt, va_list ap);
/* Prefixes an already-set message: "prefix: old message". */
void sil_error_prefix(struct sil_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
