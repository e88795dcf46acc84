/* Byte-level BPE tokenizer built from a GGUF vocabulary (tokenizer.ggml.model "gpt2").
 *
 * tokenizer.ggml.pre selects the pre-tokenizer regex ("qwen2", "qwen35", "llama-bpe", "gpt2"),
 * compiled once with PCRE2 (UTF, UCP, JIT). Special/control tokens are matched in the text only
 * when parse_special is set (longest match first); BPE never produces them otherwise.
 * User-defined tokens (GGUF token type 4, e.g. Qwen's "<think>", "<tool_call>") are matched
 * always, as both reference tokenizers (HF tokenizers, the GGUF reference) do. No NFC
 * normalization (same as the GGUF reference; HF's Qwen tokenizer composes first).
 * Encoding is linear-ish: hash maps for tokens and merge ranks, a heap-driven merge per word.
 *
 * Ownership: struct sil_vocab copies what it needs from the GGUF at load, so it may outlive it.
 * A sil_vocab is immutable after load and safe to share between threads; encode/decode allocate
 * only per call. */
#ifndef SIL_TOKENIZER_H
#define SIL_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/error.h"

struct sil_gguf;
struct sil_vocab;

int sil_vocab_load(struct sil_vocab **out, const struct sil_gguf *g, struct sil_error *err);
void sil_vocab_free(struct sil_vocab *v);

int32_t sil_vocab_n_tokens(const struct sil_vocab *v);
const char *sil_vocab_pre(const struct sil_vocab *v); /* the pre-tokenizer name in use */

/* Special ids; -1 where the vocab has none. think_open / think_close / im_start / im_end are
 * found by their text ("<think>", "</think>", "<|im_start|>", "<|im_end|>"), never hard-coded. */
int32_t sil_vocab_bos(const struct sil_vocab *v);
int32_t sil_vocab_eos(const struct sil_vocab *v);
int32_t sil_vocab_eot(const struct sil_vocab *v); /* end of turn (<|im_end|> for Qwen) */
int32_t sil_vocab_pad(const struct sil_vocab *v);
int32_t sil_vocab_im_start(const struct sil_vocab *v);
int32_t sil_vocab_im_end(const struct sil_vocab *v);
int32_t sil_vocab_think_open(const struct sil_vocab *v);
int32_t sil_vocab_think_close(const struct sil_vocab *v);
bool sil_vocab_add_bos(const struct sil_vocab *v); /* tokenizer.ggml.add_bos_token */
bool sil_vocab_is_eog(const struct sil_vocab *v, int32_t id); /* eos, eot, im_end, ... */
bool sil_vocab_is_special(const struct sil_vocab *v, int32_t id); /* control / user-defined */
/* Exact token text -> id, -1 if absent (text as stored in the vocab, e.g. "<think>"). */
int32_t sil_vocab_find(const struct sil_vocab *v, const char *text, size_t len);

/* Encodes text[0..len). *ids is malloc'd (caller frees) and *n_ids set. Invalid UTF-8 is
 * encoded byte-wise (never an error). add_bos adds BOS when the vocab has one. */
int sil_tokenize(const struct sil_vocab *v, const char *text, size_t len, bool add_bos,
                 bool parse_special, int32_t **ids, size_t *n_ids, struct sil_error *err);

/* The bytes a token stands for (byte-level decoding applied; special tokens give their text).
 * Returns the length and sets *bytes to storage owned by the vocab; -EINVAL for a bad id. */
int sil_token_bytes(const struct sil_vocab *v, int32_t id, const char **bytes);

/* Decodes ids into a malloc'd NUL-terminated buffer (caller frees). */
int sil_detokenize(const struct sil_vocab *v, const int32_t *ids, size_t n, bool with_special,
                   char **out, size_t *len, struct sil_error *err);

/* Streaming detokenizer: never emits half a UTF-8 character; bytes of an incomplete character
 * are held back until the next push (or emitted as they are by flush). */
struct sil_detok {
    const struct sil_vocab *v;
    bool with_special;
    char pending[8];
    int n_pending;
};
void sil_detok_init(struct sil_detok *d, const struct sil_vocab *v, bool with_special);
/* Appends the text of id to out (capacity cap); returns bytes written, or -ENOSPC if cap is too
 * small (cap >= 8 + the longest token is always enough). */
int sil_detok_push(struct sil_detok *d, int32_t id, char *out, size_t cap);
int sil_detok_flush(struct sil_detok *d, char *out, size_t cap);

#endif
