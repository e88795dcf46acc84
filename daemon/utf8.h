/* UTF-8 for what siliceod sends: msgpack str fields must hold valid UTF-8 (strict decoders such
 * as Python's msgpack with raw=False or Neovim's reject anything else), but a model may emit byte
 * tokens that do not form it, and detokenize accepts any ids. Every text field the daemon sends
 * goes through these: each ill-formed sequence becomes U+FFFD, one replacement per maximal subpart
 * (the Unicode / WHATWG practice: a lead byte and the continuation bytes that may still follow it
 * make one subpart; any other bad byte is one on its own), valid text is left byte for byte.
 * Streams keep whole characters together before this (the streaming detokenizer holds back an
 * incomplete character until the next token), so replacing per piece is the same as replacing
 * the whole text. */
#ifndef SIL_DAEMON_UTF8_H
#define SIL_DAEMON_UTF8_H

#include <stdbool.h>
#include <stddef.h>

#include <msgpack.h>

/* The replacement character U+FFFD, 3 bytes. */
#define SIL_UTF8_REPLACEMENT "\xef\xbf\xbd"

/* Length of the valid prefix of s[0..n) (n when all of it is valid). */
size_t sil_utf8_valid_prefix(const char *s, size_t n);
static inline bool sil_utf8_valid(const char *s, size_t n) { return sil_utf8_valid_prefix(s, n) == n; }

/* Length of s[0..n) once sanitized. */
size_t sil_utf8_sanitized_len(const char *s, size_t n);
/* Writes the sanitized s[0..n) to out, which has room for sil_utf8_sanitized_len(s, n) bytes
 * (3 * n is always enough); returns the length written. */
size_t sil_utf8_sanitize(const char *s, size_t n, char *out);

/* Packs key (a plain string) and the sanitized s[0..n) as msgpack str, without allocating. */
void sil_utf8_pack_kv(msgpack_packer *pk, const char *key, const char *s, size_t n);
/* Packs the sanitized s[0..n) as one msgpack str. */
void sil_utf8_pack_str(msgpack_packer *pk, const char *s, size_t n);

#endif
