/* Protocol error codes and the error struct. */
#include "siliceo-proto.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    const char *message;
} codes[SIL_RPC_CODE_COUNT] = {
    [SIL_RPC_OK] = {"ok", "ok"},
    [SIL_RPC_E_PARSE] = {"parse_error", "parse error"},
    [SIL_RPC_E_INVALID_REQUEST] = {"invalid_request", "invalid request"},
    [SIL_RPC_E_METHOD_NOT_FOUND] = {"method_not_found", "method not found"},
    [SIL_RPC_E_INVALID_PARAMS] = {"invalid_params", "invalid params"},
    [SIL_RPC_E_TOO_LARGE] = {"too_large", "too large"},
    [SIL_RPC_E_PERMISSION] = {"permission_denied", "permission denied"},
    [SIL_RPC_E_BUSY] = {"busy", "busy, try again later"},
    [SIL_RPC_E_CANCELLED] = {"cancelled", "cancelled"},
    [SIL_RPC_E_NOT_FOUND] = {"not_found", "not found"},
    [SIL_RPC_E_INTERNAL] = {"internal_error", "internal error"},
    [SIL_RPC_E_SHUTTING_DOWN] = {"shutting_down", "shutting down"},
    [SIL_RPC_E_VERSION] = {"version_mismatch", "no common protocol version"},
    [SIL_RPC_E_UNAVAILABLE] = {"model_unavailable", "the model is damaged or being reloaded"},
    [SIL_RPC_E_TIMEOUT] = {"timeout", "timed out"},
    [SIL_RPC_E_CONTEXT_FULL] = {"context_full", "the prompt does not fit the context"},
    [SIL_RPC_E_MODEL_NOT_FOUND] = {"model_not_found", "no model of that name"},
};

const char *sil_rpc_code_name(int code)
{
    if (code < 0 || code >= SIL_RPC_CODE_COUNT)
        return "unknown";
    return codes[code].name;
}

const char *sil_rpc_code_message(int code)
{
    if (code < 0 || code >= SIL_RPC_CODE_COUNT)
        return "unknown error";
    return codes[code].message;
}

int sil_rpc_errorf(struct sil_rpc_error *err, int ret, int code, const char *fmt, ...)
{
    if (!err)
        return ret;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    va_end(ap);
    err->code = code;
    return ret;
}

void sil_rpc_error_prefix(struct sil_rpc_error *err, const char *fmt, ...)
{
    if (!err)
        return;
    char prefix[256], old[sizeof(err->msg)];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof(old));
    size_t n = strlen(prefix);
    if (n > sizeof(err->msg) - 3)
        n = sizeof(err->msg) - 3;
    memcpy(err->msg, prefix, n);
    memcpy(err->msg + n, ": ", 2);
    size_t m = strnlen(old, sizeof(old) - 1);
    if (m > sizeof(err->msg) - n - 3)
        m = sizeof(err->msg) - n - 3;
    memcpy(err->msg + n + 2, old, m);
    err->msg[n + 2 + m] = 0;
}
