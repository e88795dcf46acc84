/* OpenAI request bodies -> daemon params, daemon results -> OpenAI objects; see openai.h. */
#include "client/sil-openai/openai.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef const struct sil_oa_json jv;

int sil_oa_failf(struct sil_oa_fail *f, int status, const char *param, const char *fmt, ...)
{
    f->status = status;
    f->type = status >= 500 ? "server_error" : "invalid_request_error";
    f->code = NULL;
    snprintf(f->param, sizeof(f->param), "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->msg, sizeof(f->msg), fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* A member, with null counting as absent. */
static jv *opt(jv *o, const char *key)
{
    jv *v = sil_oa_json_get(o, key);
    return v && v->type != SIL_OA_JSON_NULL ? v : NULL;
}

static int want(struct sil_oa_fail *f, jv *v, enum sil_oa_json_type t, const char *param)
{
    bool ok = v->type == t || (t == SIL_OA_JSON_TRUE && v->type == SIL_OA_JSON_FALSE);
    if (ok) return 0;
    return sil_oa_failf(f, 400, param, "'%s' must be %s, got %s", param,
                        t == SIL_OA_JSON_TRUE     ? "a boolean"
                        : t == SIL_OA_JSON_NUMBER ? "a number"
                        : t == SIL_OA_JSON_STRING ? "a string"
                        : t == SIL_OA_JSON_ARRAY  ? "an array"
                                                  : "an object",
                        sil_oa_json_type_name(v->type));
}

static int get_int(struct sil_oa_fail *f, jv *o, const char *key, int64_t min, int64_t max,
                   int64_t *out)
{
    jv *v = opt(o, key);
    if (!v) return 0;
    if (want(f, v, SIL_OA_JSON_NUMBER, key) < 0) return -EINVAL;
    if (v->num != floor(v->num))
        return sil_oa_failf(f, 400, key, "'%s' must be an integer, got %s", key, v->str);
    /* Past int64 the double cannot be converted: out of range whatever min and max are. */
    if (v->num < (double)min || v->num > (double)max ||
        (!v->is_int && (v->num >= 0x1p63 || v->num < -0x1p63)))
        return sil_oa_failf(f, 400, key, "'%s' is %s, out of range [%lld, %lld]", key, v->str,
                            (long long)min, (long long)max);
    *out = v->is_int ? v->i : (int64_t)v->num;
    return 1;
}

static int get_num(struct sil_oa_fail *f, jv *o, const char *key, double *out)
{
    jv *v = opt(o, key);
    if (!v) return 0;
    if (want(f, v, SIL_OA_JSON_NUMBER, key) < 0) return -EINVAL;
    *out = v->num;
    return 1;
}

static int get_bool(struct sil_oa_fail *f, jv *o, const char *key, bool *out)
{
    jv *v = opt(o, key);
    if (!v) return 0;
    if (want(f, v, SIL_OA_JSON_TRUE, key) < 0) return -EINVAL;
    *out = v->type == SIL_OA_JSON_TRUE;
    return 1;
}

static bool has_nul(const char *s, size_t n)
{
    return memchr(s, 0, n) != NULL;
}

/* One message's content as text parts: a string, or an array of {type: "text", text}. */
static int content_len(struct sil_oa_fail *f, jv *c, size_t i, size_t *len)
{
    char param[64];
    snprintf(param, sizeof(param), "messages[%zu].content", i);
    *len = 0;
    if (!c) return 0;
    if (c->type == SIL_OA_JSON_STRING) {
        if (has_nul(c->str, c->len))
            return sil_oa_failf(f, 400, param, "'%s' holds a NUL character", param);
        *len = c->len;
        return 0;
    }
    if (c->type != SIL_OA_JSON_ARRAY)
        return sil_oa_failf(f, 400, param, "'%s' must be a string or an array of parts", param);
    size_t k = 0;
    for (jv *p = c->child; p; p = p->next, k++) {
        jv *type = sil_oa_json_get(p, "type"), *text = sil_oa_json_get(p, "text");
        if (!type || type->type != SIL_OA_JSON_STRING || strcmp(type->str, "text") != 0)
            return sil_oa_failf(f, 400, param,
                                "'%s[%zu]': only parts of type \"text\" are supported", param, k);
        if (!text || text->type != SIL_OA_JSON_STRING)
            return sil_oa_failf(f, 400, param, "'%s[%zu].text' must be a string", param, k);
        if (has_nul(text->str, text->len))
            return sil_oa_failf(f, 400, param, "'%s[%zu].text' holds a NUL character", param, k);
        *len += text->len;
    }
    return 0;
}

static void pack_content(msgpack_packer *pk, jv *c, size_t len)
{
    msgpack_pack_str(pk, len);
    if (!c) return;
    if (c->type == SIL_OA_JSON_STRING) {
        msgpack_pack_str_body(pk, c->str, c->len);
        return;
    }
    for (jv *p = c->child; p; p = p->next) {
        jv *text = sil_oa_json_get(p, "text");
        msgpack_pack_str_body(pk, text->str, text->len);
    }
}

static int check_messages(struct sil_oa_fail *f, jv *msgs)
{
    if (!msgs) return sil_oa_failf(f, 400, "messages", "'messages' is required");
    if (want(f, msgs, SIL_OA_JSON_ARRAY, "messages") < 0) return -EINVAL;
    if (msgs->n == 0) return sil_oa_failf(f, 400, "messages", "'messages' must not be empty");
    if (msgs->n > 4096) return sil_oa_failf(f, 400, "messages", "more than 4096 messages");
    size_t i = 0;
    for (jv *m = msgs->child; m; m = m->next, i++) {
        char param[64];
        snprintf(param, sizeof(param), "messages[%zu]", i);
        if (m->type != SIL_OA_JSON_OBJECT)
            return sil_oa_failf(f, 400, param, "'%s' must be an object", param);
        jv *role = sil_oa_json_get(m, "role");
        snprintf(param, sizeof(param), "messages[%zu].role", i);
        if (!role || role->type != SIL_OA_JSON_STRING)
            return sil_oa_failf(f, 400, param, "'%s' must be a string", param);
        if (strcmp(role->str, "system") && strcmp(role->str, "developer") &&
            strcmp(role->str, "user") && strcmp(role->str, "assistant"))
            return sil_oa_failf(f, 400, param,
                                "'%s': role \"%.32s\" is not supported (system, developer, user, "
                                "assistant)",
                                param, role->str);
        jv *tc = opt(m, "tool_calls");
        if (tc && !(tc->type == SIL_OA_JSON_ARRAY && tc->n == 0))
            return sil_oa_failf(f, 400, "tool_calls", "tool calls are not supported");
        jv *c = sil_oa_json_get(m, "content");
        if (c && c->type == SIL_OA_JSON_NULL) c = NULL;
        snprintf(param, sizeof(param), "messages[%zu].content", i);
        if (!c && strcmp(role->str, "assistant") != 0)
            return sil_oa_failf(f, 400, param, "'%s' is required", param);
        size_t len;
        if (content_len(f, c, i, &len) < 0) return -EINVAL;
        jv *r = opt(m, "reasoning_content");
        snprintf(param, sizeof(param), "messages[%zu].reasoning_content", i);
        if (r && (r->type != SIL_OA_JSON_STRING || has_nul(r->str, r->len)))
            return sil_oa_failf(f, 400, param, "'%s' must be a string without NUL", param);
    }
    return 0;
}

static int check_stop(struct sil_oa_fail *f, jv *stop)
{
    if (!stop || stop->type == SIL_OA_JSON_STRING) return 0;
    if (stop->type != SIL_OA_JSON_ARRAY)
        return sil_oa_failf(f, 400, "stop", "'stop' must be a string or an array of strings");
    for (jv *s = stop->child; s; s = s->next)
        if (s->type != SIL_OA_JSON_STRING)
            return sil_oa_failf(f, 400, "stop", "'stop' must be a string or an array of strings");
    return 0;
}

static int check_logit_bias(struct sil_oa_fail *f, jv *lb, const struct sil_oa_caps *caps)
{
    if (!lb) return 0;
    if (want(f, lb, SIL_OA_JSON_OBJECT, "logit_bias") < 0) return -EINVAL;
    for (jv *e = lb->child; e; e = e->next) {
        char *end;
        errno = 0;
        long id = strtol(e->key, &end, 10);
        if (e->key_len == 0 || e->key[0] < '0' || e->key[0] > '9' || *end || errno ||
            id > INT32_MAX || (size_t)(end - e->key) != e->key_len)
            return sil_oa_failf(f, 400, "logit_bias",
                                "'logit_bias': key \"%.32s\" is not a token id", e->key);
        if (e->type != SIL_OA_JSON_NUMBER || e->num < -100 || e->num > 100)
            return sil_oa_failf(f, 400, "logit_bias",
                                "'logit_bias[%ld]' must be a number in [-100, 100]", id);
    }
    if (lb->n > 0 && !caps->logit_bias)
        return sil_oa_failf(f, 400, "logit_bias",
                            "'logit_bias' is not supported by this siliceod (no logit_bias in its "
                            "capabilities)");
    return 0;
}

/* Fields the daemon has no counterpart for: refused when set to something but the default. */
static int check_unsupported(struct sil_oa_fail *f, jv *o)
{
    int64_t n = 1;
    if (get_int(f, o, "n", INT32_MIN, INT32_MAX, &n) < 0) return -EINVAL;
    if (n != 1)
        return sil_oa_failf(f, 400, "n",
                            "'n' is %lld: only n = 1 is supported (siliceod generates one choice "
                            "per request; send several requests instead)",
                            (long long)n);
    int64_t best_of = 1;
    if (get_int(f, o, "best_of", INT32_MIN, INT32_MAX, &best_of) < 0) return -EINVAL;
    if (best_of != 1) return sil_oa_failf(f, 400, "best_of", "only best_of = 1 is supported");
    double fp = 0;
    if (get_num(f, o, "frequency_penalty", &fp) < 0) return -EINVAL;
    if (fp != 0)
        return sil_oa_failf(f, 400, "frequency_penalty",
                            "'frequency_penalty' is not supported (use presence_penalty or "
                            "repeat_penalty)");
    jv *lp = opt(o, "logprobs");
    if (lp && lp->type != SIL_OA_JSON_FALSE)
        return sil_oa_failf(f, 400, "logprobs", "'logprobs' is not supported");
    bool echo = false;
    if (get_bool(f, o, "echo", &echo) < 0) return -EINVAL;
    if (echo) return sil_oa_failf(f, 400, "echo", "'echo' is not supported");
    jv *tools = opt(o, "tools");
    if (tools && !(tools->type == SIL_OA_JSON_ARRAY && tools->n == 0))
        return sil_oa_failf(f, 400, "tools", "tools are not supported");
    if (opt(o, "functions"))
        return sil_oa_failf(f, 400, "functions", "functions are not supported");
    jv *rf = opt(o, "response_format");
    if (rf) {
        jv *t = sil_oa_json_get(rf, "type");
        if (!t || t->type != SIL_OA_JSON_STRING || strcmp(t->str, "text") != 0)
            return sil_oa_failf(f, 400, "response_format",
                                "only response_format {\"type\": \"text\"} is supported");
    }
    jv *suffix = opt(o, "suffix");
    if (suffix && !(suffix->type == SIL_OA_JSON_STRING && suffix->len == 0))
        return sil_oa_failf(f, 400, "suffix", "'suffix' is not supported");
    return 0;
}

struct params {
    jv *messages, *prompt, *stop, *logit_bias;
    jv *model; /* a non-empty string, else NULL */
    const char *priority_class; /* from service_tier; NULL = the daemon's default */
    int64_t max_tokens, max_thinking, seed, top_k, priority_level;
    double temperature, top_p, presence, min_p, repeat_penalty;
    bool think;
    int has_max, has_thinking, has_seed, has_top_k, has_temp, has_top_p, has_presence, has_min_p,
        has_repeat, has_think, has_level;
};

static int collect(struct sil_oa_fail *f, enum sil_oa_kind kind, jv *o,
                   const struct sil_oa_caps *caps, struct params *p, struct sil_oa_req *req)
{
    memset(p, 0, sizeof(*p));
    req->model[0] = 0;
    jv *model = opt(o, "model");
    if (model && want(f, model, SIL_OA_JSON_STRING, "model") < 0) return -EINVAL;
    if (model && model->len >= sizeof req->model)
        return sil_oa_failf(f, 400, "model", "'model' must be at most %zu bytes",
                            sizeof req->model - 1);
    if (model && model->len && !has_nul(model->str, model->len)) {
        p->model = model;
        memcpy(req->model, model->str, model->len);
        req->model[model->len] = 0;
    }
    if (check_unsupported(f, o) < 0) return -EINVAL;
    if (kind == SIL_OA_CHAT) {
        p->messages = sil_oa_json_get(o, "messages");
        if (check_messages(f, p->messages) < 0) return -EINVAL;
    } else {
        jv *pr = opt(o, "prompt");
        if (!pr) return sil_oa_failf(f, 400, "prompt", "'prompt' is required");
        if (pr->type == SIL_OA_JSON_ARRAY && pr->n == 1 && pr->child->type != SIL_OA_JSON_NUMBER)
            pr = pr->child; /* ["text"] or [[ids]] */
        if (pr->type == SIL_OA_JSON_STRING) {
            if (pr->len == 0 || has_nul(pr->str, pr->len))
                return sil_oa_failf(f, 400, "prompt", "'prompt' must be non-empty, without NUL");
        } else if (pr->type == SIL_OA_JSON_ARRAY) {
            if (pr->n == 0) return sil_oa_failf(f, 400, "prompt", "'prompt' must not be empty");
            for (jv *t = pr->child; t; t = t->next)
                if (t->type != SIL_OA_JSON_NUMBER || !t->is_int || t->i < 0 || t->i > INT32_MAX)
                    return sil_oa_failf(f, 400, "prompt",
                                        "'prompt' must be a string, one string, or an array of "
                                        "token ids (one prompt per request)");
        } else
            return sil_oa_failf(f, 400, "prompt", "'prompt' must be a string");
        p->prompt = pr;
    }
    int r;
    if ((r = get_int(f, o, "max_tokens", 1, INT32_MAX, &p->max_tokens)) < 0) return r;
    p->has_max = r;
    if ((r = get_int(f, o, "max_completion_tokens", 1, INT32_MAX, &p->max_tokens)) < 0) return r;
    p->has_max |= r;
    if ((r = get_int(f, o, "max_thinking_tokens", -1, 16777216, &p->max_thinking)) < 0) return r;
    p->has_thinking = r;
    if ((r = get_int(f, o, "seed", 0, INT64_MAX, &p->seed)) < 0) return r;
    p->has_seed = r;
    if ((r = get_int(f, o, "top_k", 0, 16777216, &p->top_k)) < 0) return r;
    p->has_top_k = r;
    if ((r = get_num(f, o, "temperature", &p->temperature)) < 0) return r;
    p->has_temp = r;
    if (r && (p->temperature < 0 || p->temperature > 2))
        return sil_oa_failf(f, 400, "temperature", "'temperature' must be in [0, 2]");
    if ((r = get_num(f, o, "top_p", &p->top_p)) < 0) return r;
    p->has_top_p = r;
    if (r && (p->top_p < 0 || p->top_p > 1))
        return sil_oa_failf(f, 400, "top_p", "'top_p' must be in [0, 1]");
    if ((r = get_num(f, o, "presence_penalty", &p->presence)) < 0) return r;
    p->has_presence = r;
    if (r && (p->presence < -2 || p->presence > 2))
        return sil_oa_failf(f, 400, "presence_penalty", "'presence_penalty' must be in [-2, 2]");
    if ((r = get_num(f, o, "min_p", &p->min_p)) < 0) return r;
    p->has_min_p = r;
    if ((r = get_num(f, o, "repeat_penalty", &p->repeat_penalty)) < 0) return r;
    p->has_repeat = r;
    if ((r = get_bool(f, o, "think", &p->think)) < 0) return r;
    p->has_think = r;
    jv *ctk = opt(o, "chat_template_kwargs");
    if (ctk && !p->has_think) {
        if (want(f, ctk, SIL_OA_JSON_OBJECT, "chat_template_kwargs") < 0) return -EINVAL;
        if ((r = get_bool(f, ctk, "enable_thinking", &p->think)) < 0) return r;
        p->has_think = r;
    }
    if (kind != SIL_OA_CHAT) p->has_think = 0;
    p->stop = opt(o, "stop");
    if (check_stop(f, p->stop) < 0) return -EINVAL;
    p->logit_bias = opt(o, "logit_bias");
    if (check_logit_bias(f, p->logit_bias, caps) < 0) return -EINVAL;
    if (p->logit_bias && p->logit_bias->n == 0) p->logit_bias = NULL;
    /* OpenAI's service_tier names the class ("priority" interactive, "flex" batch); an integer
     * priority, lower first as in vLLM, is the level within it. Both are hints: a daemon
     * without priorities ignores the tier, but a level it cannot honour is refused. */
    jv *tier = opt(o, "service_tier");
    if (tier) {
        if (want(f, tier, SIL_OA_JSON_STRING, "service_tier") < 0) return -EINVAL;
        if (!strcmp(tier->str, "priority"))
            p->priority_class = "interactive";
        else if (!strcmp(tier->str, "flex"))
            p->priority_class = "batch";
        else if (strcmp(tier->str, "auto") && strcmp(tier->str, "default"))
            return sil_oa_failf(f, 400, "service_tier",
                                "'service_tier' must be \"auto\", \"default\", \"flex\" or "
                                "\"priority\"");
        if (!caps->priority) p->priority_class = NULL;
    }
    if ((r = get_int(f, o, "priority", -100, 100, &p->priority_level)) < 0) return r;
    p->has_level = r && p->priority_level != 0;
    if (p->has_level && !caps->priority)
        return sil_oa_failf(f, 400, "priority",
                            "'priority' is not supported by this siliceod (no priority in its "
                            "capabilities)");
    req->kind = kind;
    req->stream = false;
    req->include_usage = false;
    if (get_bool(f, o, "stream", &req->stream) < 0) return -EINVAL;
    jv *so = opt(o, "stream_options");
    if (so) {
        if (want(f, so, SIL_OA_JSON_OBJECT, "stream_options") < 0) return -EINVAL;
        if (get_bool(f, so, "include_usage", &req->include_usage) < 0) return -EINVAL;
    }
    return 0;
}

static void pack_params(msgpack_packer *pk, enum sil_oa_kind kind, const struct params *p)
{
    uint32_t n = 1 + 2 * p->has_max + p->has_thinking + p->has_seed + p->has_top_k + p->has_temp +
                 p->has_top_p + p->has_presence + p->has_min_p + p->has_repeat + p->has_think +
                 (p->stop != NULL) + (p->logit_bias != NULL) + (p->priority_class != NULL) +
                 p->has_level + (p->model != NULL);
    msgpack_pack_map(pk, n);
    if (p->model) sil_rpc_kv_strn(pk, "model", p->model->str, p->model->len);
    if (kind == SIL_OA_CHAT) {
        sil_rpc_pack_cstr(pk, "messages");
        msgpack_pack_array(pk, (uint32_t)p->messages->n);
        size_t i = 0;
        for (jv *m = p->messages->child; m; m = m->next, i++) {
            jv *role = sil_oa_json_get(m, "role");
            jv *c = opt(m, "content");
            jv *r = opt(m, "reasoning_content");
            size_t len;
            content_len(NULL, c, i, &len); /* checked already: cannot fail */
            msgpack_pack_map(pk, r ? 3 : 2);
            sil_rpc_kv_str(pk, "role", strcmp(role->str, "developer") ? role->str : "system");
            sil_rpc_pack_cstr(pk, "content");
            pack_content(pk, c, len);
            if (r) sil_rpc_kv_strn(pk, "reasoning", r->str, r->len);
        }
    } else if (p->prompt->type == SIL_OA_JSON_STRING) {
        sil_rpc_kv_strn(pk, "prompt", p->prompt->str, p->prompt->len);
    } else {
        sil_rpc_pack_cstr(pk, "prompt_tokens");
        msgpack_pack_array(pk, (uint32_t)p->prompt->n);
        for (jv *t = p->prompt->child; t; t = t->next)
            msgpack_pack_int64(pk, t->i);
    }
    if (p->has_max) {
        /* OpenAI's max_tokens is a hard cap: no grace tokens to end the sentence. */
        sil_rpc_kv_int(pk, "max_tokens", p->max_tokens);
        sil_rpc_kv_int(pk, "grace_tokens", 0);
    }
    if (p->has_thinking) sil_rpc_kv_int(pk, "max_thinking_tokens", p->max_thinking);
    if (p->has_seed) sil_rpc_kv_uint(pk, "seed", (uint64_t)p->seed);
    if (p->has_top_k) sil_rpc_kv_int(pk, "top_k", p->top_k);
    if (p->has_temp) sil_rpc_kv_double(pk, "temperature", p->temperature);
    if (p->has_top_p) sil_rpc_kv_double(pk, "top_p", p->top_p);
    if (p->has_presence) sil_rpc_kv_double(pk, "presence_penalty", p->presence);
    if (p->has_min_p) sil_rpc_kv_double(pk, "min_p", p->min_p);
    if (p->has_repeat) sil_rpc_kv_double(pk, "repeat_penalty", p->repeat_penalty);
    if (p->has_think) sil_rpc_kv_bool(pk, "think", p->think);
    if (p->priority_class) sil_rpc_kv_str(pk, "priority", p->priority_class);
    if (p->has_level) sil_rpc_kv_int(pk, "priority_level", p->priority_level);
    if (p->stop) {
        sil_rpc_pack_cstr(pk, "stop");
        if (p->stop->type == SIL_OA_JSON_STRING) {
            sil_rpc_pack_strn(pk, p->stop->str, p->stop->len);
        } else {
            msgpack_pack_array(pk, (uint32_t)p->stop->n);
            for (jv *s = p->stop->child; s; s = s->next)
                sil_rpc_pack_strn(pk, s->str, s->len);
        }
    }
    if (p->logit_bias) {
        sil_rpc_pack_cstr(pk, "logit_bias");
        msgpack_pack_map(pk, (uint32_t)p->logit_bias->n);
        for (jv *e = p->logit_bias->child; e; e = e->next) {
            msgpack_pack_int64(pk, strtol(e->key, NULL, 10));
            msgpack_pack_double(pk, e->num);
        }
    }
}

int sil_oa_request(enum sil_oa_kind kind, const char *body, size_t len,
                   const struct sil_oa_caps *caps, uint32_t msgid, struct sil_rpc_buf *out,
                   struct sil_oa_req *req, struct sil_oa_fail *f)
{
    struct sil_oa_json_doc *doc;
    struct sil_oa_json_err je = {0};
    int r = sil_oa_json_parse(&doc, body, len, &je);
    if (r == -ENOMEM) return sil_oa_failf(f, 500, NULL, "out of memory"), -ENOMEM;
    if (r < 0) return sil_oa_failf(f, 400, NULL, "invalid JSON at byte %zu: %s", je.offset, je.msg);
    jv *o = sil_oa_json_root(doc);
    struct params p;
    if (o->type != SIL_OA_JSON_OBJECT)
        r = sil_oa_failf(f, 400, NULL, "the request body must be a JSON object");
    else
        r = collect(f, kind, o, caps, &p, req);
    if (r == 0) {
        msgpack_packer *pk =
            sil_rpc_begin_request(out, msgid, kind == SIL_OA_CHAT ? "chat" : "generate");
        pack_params(pk, kind, &p);
        if (sil_rpc_end(out) < 0)
            r = sil_oa_failf(f, 413, NULL, "request too large for the daemon");
    }
    sil_oa_json_free(doc);
    return r;
}

void sil_oa_fail_from_rpc(struct sil_oa_fail *f, int code, const char *message)
{
    int status = 502;
    switch (code) {
    case SIL_RPC_E_INVALID_PARAMS:
        status = 400;
        break;
    case SIL_RPC_E_TOO_LARGE:
    case SIL_RPC_E_CONTEXT_FULL:
        status = 400;
        break;
    case SIL_RPC_E_PERMISSION:
        status = 403;
        break;
    case SIL_RPC_E_BUSY:
        status = 429;
        break;
    case SIL_RPC_E_NOT_FOUND:
    case SIL_RPC_E_MODEL_NOT_FOUND:
        status = 404;
        break;
    case SIL_RPC_E_METHOD_NOT_FOUND:
        status = 503;
        break; /* e.g. --no-model */
    case SIL_RPC_E_SHUTTING_DOWN:
        status = 503;
        break;
    case SIL_RPC_E_INTERNAL:
        status = 500;
        break;
    case SIL_RPC_E_UNAVAILABLE: /* the model is damaged or reloading: try again later */
        status = 503;
        break;
    case SIL_RPC_E_TIMEOUT:
        status = 504;
        break;
    }
    /* The daemon names the field as "field 'x': ...": that is the OpenAI param. */
    char param[64] = "";
    const char *q = message ? strstr(message, "field '") : NULL;
    if (q) {
        q += 7;
        const char *e = strchr(q, '\'');
        if (e && (size_t)(e - q) < sizeof(param)) {
            memcpy(param, q, (size_t)(e - q));
            param[e - q] = 0;
        }
    }
    sil_oa_failf(f, status, param, "siliceod: %s", message ? message : sil_rpc_code_message(code));
    if (code == SIL_RPC_E_CONTEXT_FULL)
        f->code = "context_length_exceeded";
    else if (code == SIL_RPC_E_MODEL_NOT_FOUND) {
        f->code = "model_not_found";
        snprintf(f->param, sizeof f->param, "model");
    }
    else if (code == SIL_RPC_E_BUSY) {
        f->type = "rate_limit_error";
        f->code = "rate_limit_exceeded";
    }
}

void sil_oa_format_error(struct sil_oa_buf *b, const struct sil_oa_fail *f)
{
    sil_oa_buf_cstr(b, "{\"error\":{\"message\":");
    sil_oa_buf_jstr(b, f->msg, strlen(f->msg));
    sil_oa_buf_cstr(b, ",\"type\":");
    sil_oa_buf_jstr(b, f->type, strlen(f->type));
    sil_oa_buf_cstr(b, ",\"param\":");
    if (f->param[0])
        sil_oa_buf_jstr(b, f->param, strlen(f->param));
    else
        sil_oa_buf_cstr(b, "null");
    sil_oa_buf_cstr(b, ",\"code\":");
    if (f->code)
        sil_oa_buf_jstr(b, f->code, strlen(f->code));
    else
        sil_oa_buf_cstr(b, "null");
    sil_oa_buf_cstr(b, "}}");
}

const char *sil_oa_finish_reason(const char *s, size_t n)
{
    if ((n == 3 && !memcmp(s, "eos", 3)) || (n == 4 && !memcmp(s, "stop", 4))) return "stop";
    /* the context full is a length, as OpenAI counts it */
    if ((n == 6 && !memcmp(s, "length", 6)) || (n == 7 && !memcmp(s, "context", 7)))
        return "length";
    return NULL;
}

static void map_str(const msgpack_object *m, const char *key, const char **s, size_t *n)
{
    const msgpack_object *v = sil_rpc_map_get(m, key);
    *s = "";
    *n = 0;
    if (v && (v->type == MSGPACK_OBJECT_STR || v->type == MSGPACK_OBJECT_BIN)) {
        *s = v->via.str.ptr;
        *n = v->via.str.size;
    }
}

void sil_oa_format_usage(struct sil_oa_buf *b, const msgpack_object *res)
{
    long long np = sil_rpc_map_int(res, "n_prompt", 0), ng = sil_rpc_map_int(res, "n_generated", 0);
    sil_oa_buf_printf(b,
                      "\"usage\":{\"prompt_tokens\":%lld,\"completion_tokens\":%lld,"
                      "\"total_tokens\":%lld,\"prompt_tokens_details\":{\"cached_tokens\":%lld},"
                      "\"completion_tokens_details\":{\"reasoning_tokens\":%lld}}",
                      np, ng, np + ng, (long long)sil_rpc_map_int(res, "n_cached", 0),
                      (long long)sil_rpc_map_int(res, "n_reasoning", 0));
}

static void head(struct sil_oa_buf *b, const struct sil_oa_resp *r, const char *object)
{
    sil_oa_buf_cstr(b, "{\"id\":");
    sil_oa_buf_jstr(b, r->id, strlen(r->id));
    sil_oa_buf_printf(b, ",\"object\":\"%s\",\"created\":%lld,\"model\":", object, r->created);
    sil_oa_buf_jstr(b, r->model, strlen(r->model));
    sil_oa_buf_cstr(b, ",\"system_fingerprint\":\"siliceo-" SIL_VERSION "\"");
}

int sil_oa_format_result(struct sil_oa_buf *b, const struct sil_oa_resp *r,
                         const msgpack_object *res, struct sil_oa_fail *f)
{
    const char *sr, *text, *reasoning;
    size_t srn, tn, rn;
    map_str(res, "stop_reason", &sr, &srn);
    const char *finish = sil_oa_finish_reason(sr, srn);
    if (!finish) {
        char err[256];
        sil_rpc_map_str(res, "error", err, sizeof(err), "");
        return sil_oa_failf(f, srn == 8 && !memcmp(sr, "shutdown", 8) ? 503 : 500, NULL,
                            "generation ended: %.*s%s%s", (int)(srn > 32 ? 32 : srn), sr,
                            err[0] ? ": " : "", err);
    }
    map_str(res, "text", &text, &tn);
    map_str(res, "reasoning", &reasoning, &rn);
    if (r->kind == SIL_OA_CHAT) {
        head(b, r, "chat.completion");
        sil_oa_buf_cstr(b, ",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
                           "\"content\":");
        sil_oa_buf_jstr(b, text, tn);
        if (rn) {
            sil_oa_buf_cstr(b, ",\"reasoning_content\":");
            sil_oa_buf_jstr(b, reasoning, rn);
        }
        sil_oa_buf_printf(b, "},\"logprobs\":null,\"finish_reason\":\"%s\"}],", finish);
    } else {
        head(b, r, "text_completion");
        sil_oa_buf_cstr(b, ",\"choices\":[{\"index\":0,\"text\":");
        sil_oa_buf_jstr(b, text, tn);
        sil_oa_buf_printf(b, ",\"logprobs\":null,\"finish_reason\":\"%s\"}],", finish);
    }
    sil_oa_format_usage(b, res);
    sil_oa_buf_cstr(b, "}");
    return 0;
}

void sil_oa_format_chunk(struct sil_oa_buf *b, const struct sil_oa_resp *r, bool first,
                         const char *text, size_t text_len, const char *reasoning,
                         size_t reasoning_len, const char *finish, bool usage_null)
{
    sil_oa_buf_cstr(b, "data: ");
    if (r->kind == SIL_OA_CHAT) {
        head(b, r, "chat.completion.chunk");
        sil_oa_buf_cstr(b, ",\"choices\":[{\"index\":0,\"delta\":{");
        bool comma = false;
        if (first) {
            sil_oa_buf_cstr(b, "\"role\":\"assistant\"");
            comma = true;
        }
        if (text_len || (first && !reasoning_len)) {
            sil_oa_buf_cstr(b, comma ? ",\"content\":" : "\"content\":");
            sil_oa_buf_jstr(b, text, text_len);
            comma = true;
        }
        if (reasoning_len) {
            sil_oa_buf_cstr(b, comma ? ",\"reasoning_content\":" : "\"reasoning_content\":");
            sil_oa_buf_jstr(b, reasoning, reasoning_len);
        }
        sil_oa_buf_cstr(b, "},\"logprobs\":null,\"finish_reason\":");
    } else {
        head(b, r, "text_completion");
        sil_oa_buf_cstr(b, ",\"choices\":[{\"index\":0,\"text\":");
        sil_oa_buf_jstr(b, text, text_len);
        sil_oa_buf_cstr(b, ",\"logprobs\":null,\"finish_reason\":");
    }
    if (finish)
        sil_oa_buf_printf(b, "\"%s\"}]", finish);
    else
        sil_oa_buf_cstr(b, "null}]");
    sil_oa_buf_cstr(b, usage_null ? ",\"usage\":null}\n\n" : "}\n\n");
}

void sil_oa_format_usage_chunk(struct sil_oa_buf *b, const struct sil_oa_resp *r,
                               const msgpack_object *res)
{
    sil_oa_buf_cstr(b, "data: ");
    head(b, r, r->kind == SIL_OA_CHAT ? "chat.completion.chunk" : "text_completion");
    sil_oa_buf_cstr(b, ",\"choices\":[],");
    sil_oa_format_usage(b, res);
    sil_oa_buf_cstr(b, "}\n\n");
}
