#include "daemon/engine/error.h"

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
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
}
