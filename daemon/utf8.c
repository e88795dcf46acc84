/* UTF-8 validation and U+FFFD replacement (see utf8.h). The well-formed sequences are those of
 * the Unicode standard's table 3-7: the second byte's range depends on the lead byte (which rules
 * out overlongs, surrogates and code points above U+10FFFF), later bytes are 80..BF. */
#include "daemon/utf8.h"

#include <stdint.h>
#include <string.h>

/* At s[0] (n >= 1 bytes left): the length of the character there and *ok = true, or the length
 * of the maximal subpart of an ill-formed sequence (>= 1) and *ok = false. */
static size_t next_char(const unsigned char *s, size_t n, bool *ok)
{
    unsigned c = s[0];
    *ok = true;
    if (c < 0x80)
        return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf) {
        need = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        need = 3;
        if (c == 0xe0)
            lo = 0xa0; /* overlong */
        else if (c == 0xed)
            hi = 0x9f; /* surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        need = 4;
        if (c == 0xf0)
            lo = 0x90; /* overlong */
        else if (c == 0xf4)
            hi = 0x8f; /* above U+10FFFF */
    } else {
        *ok = false; /* continuation byte, C0, C1, F5..FF: never a lead */
        return 1;
    }
    size_t k = 1;
    for (; k < need && k < n; k++) {
        unsigned b = s[k];
        if (b < lo || b > hi)
            break;
        lo = 0x80;
        hi = 0xbf;
    }
    if (k < need)
        *ok = false; /* lead + the continuation bytes that fit it: one subpart */
    return k;
}

size_t sil_utf8_valid_prefix(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* ASCII runs, 8 bytes at a time: most text is mostly ASCII */
        while (i + 8 <= n) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        bool ok;
        size_t k = next_char(p + i, n - i, &ok);
        if (!ok)
            return i;
        i += k;
    }
    return n;
}

size_t sil_utf8_sanitized_len(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = sil_utf8_valid_prefix(s, n), len = i;
    while (i < n) {
        bool ok;
        size_t k = next_char(p + i, n - i, &ok);
        len += ok ? k : 3;
        i += k;
    }
    return len;
}

size_t sil_utf8_sanitize(const char *s, size_t n, char *out)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = sil_utf8_valid_prefix(s, n), o = i;
    memcpy(out, s, i);
    while (i < n) {
        bool ok;
        size_t k = next_char(p + i, n - i, &ok);
        if (ok)
            memcpy(out + o, s + i, k), o += k;
        else
            memcpy(out + o, SIL_UTF8_REPLACEMENT, 3), o += 3;
        i += k;
    }
    return o;
}

void sil_utf8_pack_str(msgpack_packer *pk, const char *s, size_t n)
{
    size_t good = sil_utf8_valid_prefix(s, n);
    if (good == n) {
        msgpack_pack_str(pk, n);
        msgpack_pack_str_body(pk, s, n);
        return;
    }
    /* Length first (the str header comes before the body), then the body run by run. */
    const unsigned char *p = (const unsigned char *)s;
    msgpack_pack_str(pk, sil_utf8_sanitized_len(s, n));
    size_t i = good, run = 0; /* s[run..i) is valid and not yet packed */
    while (i < n) {
        bool ok;
        size_t k = next_char(p + i, n - i, &ok);
        if (!ok) {
            if (i > run)
                msgpack_pack_str_body(pk, s + run, i - run);
            msgpack_pack_str_body(pk, SIL_UTF8_REPLACEMENT, 3);
            run = i + k;
        }
        i += k;
    }
    if (n > run)
        msgpack_pack_str_body(pk, s + run, n - run);
}

void sil_utf8_pack_kv(msgpack_packer *pk, const char *key, const char *s, size_t n)
{
    size_t kl = strlen(key);
    msgpack_pack_str(pk, kl);
    msgpack_pack_str_body(pk, key, kl);
    sil_utf8_pack_str(pk, s, n);
}
