/* Reference JSON files (tokenizer vectors, chat renders) for the tests, read with sil-mkmodel's
 * JSON reader: testutil_json.c compiles it in, so every test binary has sil_json_* (test_mkmodel
 * tests the reader itself).
 *
 * Ownership: a document is freed with sil_json_free; its values live as long as it does. */
#ifndef SIL_TESTUTIL_JSON_H
#define SIL_TESTUTIL_JSON_H

#include <stddef.h>

#include "bench/sil-mkmodel/mkmodel.h"

/* $SHARED/refdata/<rel> parsed; NULL when the file is missing (the test may skip()). A file that
 * does not parse fails the calling test. */
struct sil_json_doc *tu_json_load(const char *rel);

#endif
