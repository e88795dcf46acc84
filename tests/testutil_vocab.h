/* Vocabularies for the tokenizer and chat tests: the GPT-2 byte-level alphabet computed here
 * (independently of the tokenizer and of sil-mkmodel), small vocab GGUFs built in memory, and the
 * refdata vocab files.
 *
 * Ownership: a struct sil_vocab returned is freed by the caller with sil_vocab_free. */
#ifndef SIL_TESTUTIL_VOCAB_H
#define SIL_TESTUTIL_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/tokenizer.h"
#include "kernels/error.h"

/* The byte-level symbol of byte b, UTF-8 (1 or 2 bytes, not NUL-terminated); returns its length. */
size_t tu_byte_level(unsigned char b, char *out);
/* toks[0..256) := the 256 byte symbols, NUL-terminated, in byte order (static storage). */
void tu_byte_tokens(const char **toks);
/* A vocab from a GGUF built in memory holding the keys given; NULL leaves a key out.
 * 0 or the loader's -errno with err filled. */
int tu_vocab_mem(const char *model, const char *pre, const char **toks, int32_t n_tok,
                 const int32_t *types, int32_t n_types, const char **merges, int32_t n_merges,
                 struct sil_vocab **v, struct sil_error *err);
/* The vocab of $SHARED/refdata/<rel>; NULL when the file is missing (the test may skip()). A file
 * that does not load fails the calling test. The vocab outlives the file's mapping. */
struct sil_vocab *tu_vocab_load(const char *rel);

#endif
