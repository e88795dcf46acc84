#include "kernels/error.h"

#include <stdio.h>
#include <string.h>

int sil_verrorf(struct sil_error *err, int code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

int sil_errorf(struct sil_error *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sil_verrorf(err, code, fmt, ap);
    va_end(ap);
    return code;
}

void sil_error_prefix(struct sil_error *err, const char *fmt, ...)
{
    if (!err)
        return;
    char prefix[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    /* Built piecewise: the message is cut at the buffer's end, on purpose. */
    size_t n = strnlen(prefix, sizeof prefix - 1);
    memcpy(err->msg, prefix, n);
    size_t room = sizeof err->msg - 1 - n;
    if (room >= 2) {
        memcpy(err->msg + n, ": ", 2);
        n += 2;
        room -= 2;
        size_t m = strnlen(old, room);
        memcpy(err->msg + n, old, m);
        n += m;
    }
    err->msg[n] = '\0';
}
