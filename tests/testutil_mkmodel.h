/* Models written by sil-mkmodel's pieces for the tests that need a file of a given shape (an MTP
 * layer, a tensor missing): small, seeded, q8_0. */
#ifndef SIL_TESTUTIL_MKMODEL_H
#define SIL_TESTUTIL_MKMODEL_H

#include <stdint.h>

#include "bench/sil-mkmodel/mkmodel.h"

/* A tiny model of arch (its defaults, a synthetic vocabulary of 512 tokens, q8_0) with n_nextn
 * MTP layers, seeded with seed, written to path; edit (may be NULL) may change its tensor list
 * before the types are assigned. Fails the test on an error. Needs <cmocka.h>'s setup. */
void tu_mk_write_tiny(const char *path, int arch, int64_t n_nextn, uint64_t seed,
                      void (*edit)(struct sil_mk_model *m));

#endif
