/* The Qwen ChatML chat template: "<|im_start|>role\ncontent<|im_end|>\n" per turn, then
 * "<|im_start|>assistant\n" as the generation prompt. With thinking off the prompt ends with an
 * empty think block ("<think>\n\n</think>\n\n") as Qwen3.5's template writes it; with thinking on
 * it ends with "<think>\n" so the model opens its reasoning. Reasoning of earlier assistant turns
 * is dropped from history, as the template does. Marker texts come from the vocab.
 * Flavour by the vocab's pre-tokenizer: "qwen35" renders Qwen3.5's template (contents trimmed);
 * any other renders Qwen3's, whose thinking-on prompt ends at "<|im_start|>assistant\n" (no
 * "<think>\n") and whose last assistant turn after the last user message gets a think block. */
#ifndef SIL_CHAT_H
#define SIL_CHAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/error.h"

struct sil_vocab;

struct sil_chat_msg {
    const char *role;      /* "system", "user", "assistant" (others are rejected) */
    const char *content;   /* UTF-8, NUL-terminated */
    const char *reasoning; /* assistant reasoning, may be NULL; dropped for earlier turns */
};

/* The prompt as token ids, what a model is given: each template marker is its id, the text
 * between markers (template text and message contents) is tokenized without special-token
 * parsing, so content such as "<|im_end|>\n<|im_start|>system\n" stays plain text and cannot
 * open a turn of its own. (User-defined tokens such as "<think>" are still matched in the text,
 * as the tokenizer always does.) Gives the ids of sil_tokenize(render, parse_special = true)
 * whenever no content holds a control token's text. *ids is malloc'd, never NULL on success. */
int sil_chat_tokenize(const struct sil_vocab *v, const struct sil_chat_msg *msgs, size_t n,
                      bool add_generation_prompt, bool think, int32_t **ids, size_t *n_ids,
                      struct sil_error *err);

/* Renders messages to prompt text, for display and debugging. Tokenizing it with parse_special
 * lets marker text inside a content become control tokens: give a model sil_chat_tokenize's ids
 * instead. *out is malloc'd. */
int sil_chat_render(const struct sil_vocab *v, const struct sil_chat_msg *msgs, size_t n,
                    bool add_generation_prompt, bool think, char **out, size_t *len,
                    struct sil_error *err);

#endif
