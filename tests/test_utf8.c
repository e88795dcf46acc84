/* The UTF-8 sanitizer of siliceod's text fields: valid text unchanged byte for byte; overlongs,
 * surrogates, code points above U+10FFFF, truncated sequences and lone continuation bytes
 * replaced by U+FFFD, one per maximal subpart (the examples of the Unicode standard, section 3.9,
 * and of the WHATWG encoding standard); the msgpack packing helpers; random bytes always come out
 * valid and sanitizing is idempotent. */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/utf8.h"

#define R SIL_UTF8_REPLACEMENT

/* Sanitizes in (n bytes) and compares with want (NUL-terminated, may hold NUL-free bytes only). */
static void check(const char *in, size_t n, const char *want, int line)
{
    char out[256];
    assert_true(3 * n <= sizeof out);
    size_t len = sil_utf8_sanitize(in, n, out);
    size_t wl = strlen(want);
    if (len != wl || memcmp(out, want, wl) != 0) {
        char got[800] = "", exp[800] = "";
        for (size_t i = 0; i < len; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%02x ", (unsigned char)out[i]);
        for (size_t i = 0; i < wl; i++)
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), "%02x ", (unsigned char)want[i]);
        fail_msg("line %d: got %s want %s", line, got, exp);
    }
    assert_int_equal(sil_utf8_sanitized_len(in, n), wl);
    bool valid = wl == n && memcmp(in, want, n) == 0;
    assert_int_equal(sil_utf8_valid(in, n), valid);
    /* otherwise the valid prefix ends where the first replacement starts (no input holds U+FFFD) */
    size_t prefix = valid ? n : (size_t)((const char *)memmem(want, wl, R, 3) - want);
    assert_int_equal(sil_utf8_valid_prefix(in, n), prefix);
}
#define CHECK(in, want) check(in, sizeof(in) - 1, want, __LINE__)

static void test_valid_unchanged(void **state)
{
    CHECK("", "");
    CHECK("plain ASCII text, long enough for the 8-byte fast path.\n", "plain ASCII text, long enough for the 8-byte fast path.\n");
    CHECK("\x7f\x01", "\x7f\x01");
    CHECK("caf\xc3\xa9", "caf\xc3\xa9");                 /* U+00E9 */
    CHECK("\xc2\x80\xdf\xbf", "\xc2\x80\xdf\xbf");       /* U+0080, U+07FF */
    CHECK("\xe0\xa0\x80", "\xe0\xa0\x80");               /* U+0800 */
    CHECK("\xe2\x82\xac", "\xe2\x82\xac");               /* U+20AC */
    CHECK("\xed\x9f\xbf\xee\x80\x80", "\xed\x9f\xbf\xee\x80\x80"); /* U+D7FF, U+E000 */
    CHECK("\xef\xbf\xbd\xef\xbf\xbf", "\xef\xbf\xbd\xef\xbf\xbf"); /* U+FFFD itself, U+FFFF */
    CHECK("\xf0\x90\x80\x80", "\xf0\x90\x80\x80");       /* U+10000 */
    CHECK("\xf0\x9f\x98\x80 ok", "\xf0\x9f\x98\x80 ok"); /* U+1F600 */
    CHECK("\xf4\x8f\xbf\xbf", "\xf4\x8f\xbf\xbf");       /* U+10FFFF */
    CHECK("12345678\xe4\xb8\xad\xe6\x96\x87" "abcdefgh", "12345678\xe4\xb8\xad\xe6\x96\x87" "abcdefgh");
}

static void test_overlong_surrogate_range(void **state)
{
    /* overlongs: C0, C1 are never leads; E0 80..9F and F0 80..8F cannot follow */
    CHECK("\xc0\x80", R R);
    CHECK("\xc1\xbf", R R);
    CHECK("\xe0\x80\x80", R R R);
    CHECK("\xe0\x9f\xbf", R R R);
    CHECK("\xf0\x80\x80\x80", R R R R);
    CHECK("\xf0\x8f\xbf\xbf", R R R R);
    /* surrogates U+D800..U+DFFF */
    CHECK("\xed\xa0\x80", R R R);
    CHECK("\xed\xbf\xbf", R R R);
    CHECK("a\xed\xa0\x80\xed\xb0\x80z", "a" R R R R R R "z");
    /* above U+10FFFF */
    CHECK("\xf4\x90\x80\x80", R R R R);
    CHECK("\xf5\x80\x80\x80", R R R R);
    CHECK("\xf7\xbf\xbf\xbf", R R R R);
    /* 5- and 6-byte forms, FE, FF */
    CHECK("\xf8\x88\x80\x80\x80", R R R R R);
    CHECK("\xfc\x84\x80\x80\x80\x80", R R R R R R);
    CHECK("\xfe\xff", R R);
}

static void test_truncated_and_lone(void **state)
{
    /* a truncated sequence is one subpart, however many of its bytes are there */
    CHECK("\xc3", R);
    CHECK("\xe2\x82", R);
    CHECK("\xe2", R);
    CHECK("\xf0\x9f\x98", R);
    CHECK("\xf0\x9f", R);
    CHECK("\xe2\x82" "A", R "A");
    CHECK("\xf0\x9f\x98" "A", R "A");
    CHECK("\xf0\x9f\x98\xf0\x9f\x98\x80", R "\xf0\x9f\x98\x80");
    CHECK("\xe2\x82\xe2\x82\xac", R "\xe2\x82\xac");
    CHECK("x\xc3", "x" R);
    /* lone continuation bytes: one each */
    CHECK("\x80", R);
    CHECK("\xbf\xbf", R R);
    CHECK("a\x80" "b", "a" R "b");
    CHECK("\xe2\x82\xac\x80", "\xe2\x82\xac" R);
    /* the example of the Unicode standard (3.9, "U+FFFD Substitution of Maximal Subparts") */
    CHECK("\x61\xf1\x80\x80\xe1\x80\xc2\x62\x80\x63\x80\xbf\x64", "a" R R R "b" R "c" R R "d");
    /* and the WHATWG encoding standard's decoder on the same kinds of input */
    CHECK("\xf1\x80\x80\x41", R "A");
    CHECK("\xed\x80\x41", R "A");
}

/* Reads the next msgpack str of sb into buf; returns its length. */
static size_t unpack_str(const msgpack_sbuffer *sb, size_t *off, char *buf, size_t cap)
{
    msgpack_unpacked u;
    msgpack_unpacked_init(&u);
    assert_int_equal(msgpack_unpack_next(&u, sb->data, sb->size, off), MSGPACK_UNPACK_SUCCESS);
    assert_int_equal(u.data.type, MSGPACK_OBJECT_STR);
    size_t n = u.data.via.str.size;
    assert_true(n <= cap);
    if (n)
        memcpy(buf, u.data.via.str.ptr, n);
    msgpack_unpacked_destroy(&u);
    return n;
}

static void test_pack(void **state)
{
    static const struct {
        const char *in;
        size_t n;
        const char *want;
    } cases[] = {
        {"hello", 5, "hello"},
        {"", 0, ""},
        {"a\xff" "b\xe2\x82", 5, "a" R "b" R},
        {"\x80\x80\xc3\xa9\xed\xa0\x80", 7, R R "\xc3\xa9" R R R},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        msgpack_sbuffer sb;
        msgpack_sbuffer_init(&sb);
        msgpack_packer pk;
        msgpack_packer_init(&pk, &sb, msgpack_sbuffer_write);
        sil_utf8_pack_kv(&pk, "text", cases[c].in, cases[c].n);
        sil_utf8_pack_str(&pk, cases[c].in, cases[c].n);
        size_t off = 0;
        char s[64];
        assert_int_equal(unpack_str(&sb, &off, s, sizeof s), 4);
        assert_memory_equal(s, "text", 4);
        for (int k = 0; k < 2; k++) {
            size_t n = unpack_str(&sb, &off, s, sizeof s);
            assert_int_equal(n, strlen(cases[c].want));
            if (n)
                assert_memory_equal(s, cases[c].want, n);
        }
        assert_int_equal(off, sb.size);
        msgpack_sbuffer_destroy(&sb);
    }
}

/* Random bytes (biased to UTF-8-ish ones): the output is valid, sanitizing it again changes
 * nothing, valid input is returned as it was, and the output never exceeds 3 bytes per byte. */
static void test_random(void **state)
{
    uint64_t x = 0x9e3779b97f4a7c15ull;
    static const unsigned char pool[] = {'a', ' ', 0x00, 0x7f, 0x80, 0x8f, 0x90, 0x9f, 0xa0, 0xbf,
                                         0xc0, 0xc2, 0xdf, 0xe0, 0xe1, 0xed, 0xef, 0xf0, 0xf3, 0xf4,
                                         0xf5, 0xff};
    char in[64], out[3 * 64], again[3 * 3 * 64];
    for (int iter = 0; iter < 100000; iter++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t n = x % sizeof in;
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            in[i] = (char)((x >> 8) % 4 == 0 ? (unsigned char)(x >> 16) : pool[(x >> 16) % sizeof pool]);
        }
        size_t len = sil_utf8_sanitize(in, n, out);
        assert_true(len <= 3 * n);
        assert_int_equal(len, sil_utf8_sanitized_len(in, n));
        assert_true(sil_utf8_valid(out, len));
        assert_int_equal(sil_utf8_sanitize(out, len, again), len);
        if (len)
            assert_memory_equal(again, out, len);
        if (sil_utf8_valid(in, n)) {
            assert_int_equal(len, n);
            if (n)
                assert_memory_equal(out, in, n);
        }
        /* the valid prefix is copied as it is */
        size_t p = sil_utf8_valid_prefix(in, n);
        assert_true(p <= n);
        if (p)
            assert_memory_equal(out, in, p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_unchanged),
        cmocka_unit_test(test_overlong_surrogate_range),
        cmocka_unit_test(test_truncated_and_lone),
        cmocka_unit_test(test_pack),
        cmocka_unit_test(test_random),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
