/* Detokenizing: sil_detokenize (ids to a buffer) and the streaming detokenizer (sil_detok_*),
 * which never emits half a UTF-8 character.
 *
 * Ownership: a struct sil_detok is the caller's, points at the vocab (which must outlive it) and
 * holds at most one incomplete character; nothing is allocated except sil_detokenize's result. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/tokenizer_impl.h"

static bool decode_shows(const struct sil_vocab *v, int32_t id, bool with_special)
{
    uint8_t t = v->type[id];
    return with_special || is_bpe_type(t) || t == TT_USER_DEFINED;
}

int sil_detokenize(const struct sil_vocab *v, const int32_t *ids, size_t n, bool with_special,
                   char **out, size_t *len, struct sil_error *err)
{
    *out = NULL;
    *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->n_tokens)
            return sil_errorf(err, -EINVAL, "detokenize: ids[%zu] = %d is not a token id (0..%d)",
                              i, ids[i], v->n_tokens - 1);
        if (decode_shows(v, ids[i], with_special))
            total += v->bytes_off[ids[i] + 1] - v->bytes_off[ids[i]];
    }
    char *buf = malloc(total + 1);
    if (!buf)
        return sil_errorf(err, -ENOMEM, "detokenize: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        if (!decode_shows(v, ids[i], with_special))
            continue;
        uint32_t l = v->bytes_off[ids[i] + 1] - v->bytes_off[ids[i]];
        memcpy(buf + o, v->bytes + v->bytes_off[ids[i]], l);
        o += l;
    }
    buf[o] = 0;
    *out = buf;
    *len = o;
    return 0;
}

void sil_detok_init(struct sil_detok *d, const struct sil_vocab *v, bool with_special)
{
    d->v = v;
    d->with_special = with_special;
    d->n_pending = 0;
}

/* How many trailing bytes of s[0..n) are a proper prefix of a valid UTF-8 character, i.e. must
 * wait for more bytes. Anything else (complete or invalid) can be emitted now. */
static int utf8_incomplete_tail(const unsigned char *s, size_t n)
{
    for (int k = 1; k <= 3 && (size_t)k <= n; k++) {
        unsigned c = s[n - k];
        if ((c & 0xc0) == 0x80)
            continue; /* continuation byte: look further back for the lead */
        int need = c >= 0xc2 && c <= 0xdf   ? 2
                   : c >= 0xe0 && c <= 0xef ? 3
                   : c >= 0xf0 && c <= 0xf4 ? 4
                                            : 0;
        if (need <= k)
            return 0;
        /* second-byte ranges that keep the prefix valid (no overlong, surrogate, > U+10FFFF) */
        if (k >= 2) {
            unsigned c1 = s[n - k + 1];
            if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 > 0x9f) || (c == 0xf0 && c1 < 0x90) ||
                (c == 0xf4 && c1 > 0x8f))
                return 0;
        }
        return k;
    }
    return 0;
}

static int detok_emit(struct sil_detok *d, const char *add, size_t add_len, bool final, char *out,
                      size_t cap)
{
    unsigned char tail[8] = {0};
    size_t np = (size_t)d->n_pending;
    size_t total = np + add_len;
    /* the last few bytes of pending + add decide what is held back */
    size_t tn = total < 4 ? total : 4;
    for (size_t i = 0; i < tn; i++) {
        size_t k = total - tn + i;
        tail[i] = (unsigned char)(k < np ? d->pending[k] : add[k - np]);
    }
    size_t hold = final ? 0 : (size_t)utf8_incomplete_tail(tail, tn);
    size_t emit = total - hold;
    if (emit > cap)
        return -ENOSPC;
    char keep[8] = {0};
    for (size_t i = 0; i < hold; i++) {
        size_t k = emit + i;
        keep[i] = k < np ? d->pending[k] : add[k - np];
    }
    size_t from_pending = emit < np ? emit : np;
    memcpy(out, d->pending, from_pending);
    if (emit > np)
        memcpy(out + np, add, emit - np);
    memcpy(d->pending, keep, hold);
    d->n_pending = (int)hold;
    return (int)emit;
}

int sil_detok_push(struct sil_detok *d, int32_t id, char *out, size_t cap)
{
    const struct sil_vocab *v = d->v;
    if (id < 0 || id >= v->n_tokens)
        return -EINVAL;
    if (!decode_shows(v, id, d->with_special))
        return detok_emit(d, NULL, 0, false, out, cap);
    return detok_emit(d, v->bytes + v->bytes_off[id], v->bytes_off[id + 1] - v->bytes_off[id],
                      false, out, cap);
}

int sil_detok_flush(struct sil_detok *d, char *out, size_t cap)
{
    return detok_emit(d, NULL, 0, true, out, cap);
}
