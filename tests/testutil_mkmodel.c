#include "tests/testutil_mkmodel.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <string.h>

#include <cmocka.h>

void tu_mk_write_tiny(const char *path, int arch, int64_t n_nextn, uint64_t seed,
                      void (*edit)(struct sil_mk_model *m))
{
    struct sil_mk_model m;
    struct sil_error err = {0};
    memset(&m, 0, sizeof(m));
    sil_mk_arch_defaults(arch, &m.hp);
    m.hp.n_nextn = n_nextn;
    m.seed = seed;
    m.recipe = SIL_MK_Q8_0;
    assert_int_equal(sil_mk_vocab_synthetic(&m.vocab, 512, seed, &err), 0);
    m.hp.n_vocab = m.vocab.n;
    int rc = sil_mk_check_hparams(&m.hp, &err);
    if (!rc) rc = sil_mk_build_tensors(&m, &err);
    if (!rc && edit) edit(&m);
    if (!rc) rc = sil_mk_assign_types(&m, NULL, 0, &err);
    if (!rc) rc = sil_mk_write(&m, path, 2, false, &err);
    if (rc) fail_msg("%s: %s", path, err.msg);
    sil_mk_model_free(&m);
}
