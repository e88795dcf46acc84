#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "tests/testutil.h"
#include "tests/testutil_spec.h"

struct sil_engine *tu_spec_engine(const char *model, int n_seq, int32_t n_batch, bool exact,
                                  const char *kv_type)
{
    struct sil_engine_params p;
    sil_engine_params_default(&p);
    p.n_threads = 2;
    p.n_seq_max = n_seq;
    p.n_ctx = 256;
    if (n_batch > 0) p.n_batch_max = n_batch;
    p.exact = exact;
    p.kv_type = kv_type;
    struct sil_error err = {0};
    struct sil_engine *e = NULL;
    if (tu_open_refdata_engine(&e, model, &p, &err) < 0) fail_msg("open %s: %s", model, err.msg);
    return e;
}

void tu_spec_ids(int32_t *ids, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        ids[i] = 1 + (int32_t)(((uint32_t)i * 7919u + 13u) % 500u);
}
