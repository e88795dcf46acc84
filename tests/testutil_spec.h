/* What the speculative-decoding tests (test_spec, test_spec_tree) share: an engine on a refdata
 * model and a fixed token list. */
#ifndef SIL_TESTUTIL_SPEC_H
#define SIL_TESTUTIL_SPEC_H

#include <stdbool.h>
#include <stdint.h>

#include "daemon/engine/engine.h"

/* The refdata model (file name) on 2 threads with n_seq sequences, a context of 256, n_batch
 * rows a batch (0: the default), exact or not, kv_type (NULL: the default). Fails the test on an
 * error. Needs <cmocka.h>'s setup. */
struct sil_engine *tu_spec_engine(const char *model, int n_seq, int32_t n_batch, bool exact,
                                  const char *kv_type);

/* n token ids of the tiny vocabulary (no special tokens), the same for every call. */
void tu_spec_ids(int32_t *ids, int32_t n);

#endif
