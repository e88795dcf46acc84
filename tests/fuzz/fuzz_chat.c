/* Fuzz target: chat prompts as token ids (sil_chat_tokenize) with arbitrary message contents, on
 * the Qwen3 vocab ($SHARED/refdata/tokenizer/qwen3-vocab.gguf; nothing to do without it).
 * Input: a flags byte (bits 0-1: 1 to 4 messages, bit 2 generation prompt, bit 3 thinking, bit 4
 * reasoning fields), then the contents separated by NUL bytes. Checked:
 *  - no content produces a marker: exactly one <|im_start|> per message (plus the generation
 *    prompt) and one <|im_end|> per message, whatever the contents hold;
 *  - contents without control-token text ("<|" never appears) give the ids of the rendered text
 *    tokenized with special-token parsing, as the model was trained on;
 *  - the ids are valid and sanitizing the render's UTF-8 never grows it past 3 bytes a byte. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/chat.h"
#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer.h"
#include "daemon/utf8.h"

static struct sil_vocab *vocab;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *shared = getenv("SHARED");
    char path[4096];
    snprintf(path, sizeof path, "%s/refdata/tokenizer/qwen3-vocab.gguf", shared ? shared : "../shared");
    struct sil_gguf *g = NULL;
    struct sil_error err = {0};
    if (sil_gguf_open(&g, path, &err) == 0) {
        if (sil_vocab_load(&vocab, g, &err) < 0)
            vocab = NULL;
        sil_gguf_close(g);
    }
    if (!vocab)
        fprintf(stderr, "fuzz_chat: no Qwen3 vocab at %s: nothing is checked\n", path);
    return 0;
}

static size_t count(const int32_t *ids, size_t n, int32_t id)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ids[i] == id;
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!vocab || size < 1)
        return 0;
    unsigned flags = data[0];
    size_t n_msgs = 1 + (flags & 3);
    bool gen = flags & 4, think = flags & 8, with_reasoning = flags & 16;

    /* contents: the rest split at NUL bytes (missing ones are empty) */
    char *copy = malloc(size);
    if (!copy)
        return 0;
    memcpy(copy, data + 1, size - 1);
    copy[size - 1] = 0;
    const char *parts[4] = {"", "", "", ""};
    char *p = copy, *end = copy + size - 1;
    for (size_t i = 0; i < 4 && p <= end; i++) {
        parts[i] = p;
        p += strlen(p) + 1;
    }
    static const char *const roles[4] = {"system", "user", "assistant", "user"};
    struct sil_chat_msg m[4];
    for (size_t i = 0; i < n_msgs; i++) {
        /* a lone message is a user's; otherwise system, user, assistant, user */
        m[i].role = n_msgs == 1 ? "user" : roles[i];
        m[i].content = parts[i];
        m[i].reasoning = with_reasoning && strcmp(m[i].role, "assistant") == 0 ? parts[3] : NULL;
    }

    int32_t *ids = NULL;
    size_t n = 0;
    struct sil_error err = {0};
    if (sil_chat_tokenize(vocab, m, n_msgs, gen, think, &ids, &n, &err) < 0)
        abort(); /* valid roles in a valid order: it must work */
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= sil_vocab_n_tokens(vocab))
            abort();
    int32_t eot = sil_vocab_find(vocab, "<|endoftext|>", 13);
    if (count(ids, n, sil_vocab_im_start(vocab)) != n_msgs + gen ||
        count(ids, n, sil_vocab_im_end(vocab)) != n_msgs || (eot >= 0 && count(ids, n, eot) != 0))
        abort();

    char *out = NULL;
    size_t len = 0;
    if (sil_chat_render(vocab, m, n_msgs, gen, think, &out, &len, &err) < 0)
        abort();
    if (sil_utf8_sanitized_len(out, len) > 3 * len)
        abort();
    bool markers_in_content = false;
    for (size_t i = 0; i < n_msgs; i++)
        markers_in_content |= strstr(m[i].content, "<|") || (m[i].reasoning && strstr(m[i].reasoning, "<|"));
    if (!markers_in_content) {
        int32_t *want = NULL;
        size_t nw = 0;
        if (sil_tokenize(vocab, out, len, false, true, &want, &nw, &err) < 0)
            abort();
        if (nw != n || memcmp(want, ids, n * sizeof(*ids)) != 0)
            abort();
        free(want);
    }
    free(out);
    free(ids);
    free(copy);
    return 0;
}
