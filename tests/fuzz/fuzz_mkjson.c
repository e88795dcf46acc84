/* The JSON reader of sil-mkmodel (tokenizer.json import) on arbitrary bytes: it must return 0 or
 * -EINVAL with a message, never crash, and a parsed tree must be walkable. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <errno.h>

#include "bench/sil-mkmodel/mkmodel.h"

static size_t walk(const struct sil_json *v, int depth)
{
    size_t n = 1;
    if (v->type == SIL_JSON_STR && strlen(v->str) > v->len)
        __builtin_trap();
    for (const struct sil_json *c = v->child; c; c = c->next) {
        if ((v->type == SIL_JSON_OBJ) != (c->key != NULL))
            __builtin_trap();
        n += walk(c, depth + 1);
    }
    return n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sil_json_doc *d = NULL;
    struct sil_error err = {0};
    int rc = sil_json_parse(&d, (const char *)data, size, "fuzz", &err);
    if (rc == 0) {
        walk(sil_json_root(d), 0);
        sil_json_get(sil_json_root(d), "model");
        sil_json_free(d);
    } else if (rc != -EINVAL && rc != -ENOMEM) {
        __builtin_trap();
    }
    return 0;
}
