/* Saved sessions (daemon/sessfile.c): the file format round-trips; every truncation, every
 * flipped byte, garbage, trailing bytes, a NUL in a string, an unknown role or flag and a count
 * the file cannot hold are refused with the offset; names of any bytes become hex file names and
 * back; the store saves atomically with private modes, indexes at open, ignores bad files, keeps
 * per-uid bounds, and is off (never fatal) without a usable directory. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/log.h"
#include "daemon/sessfile.h"
#include "tests/testutil.h"

static const struct sil_chat_msg conv[] = {
    {"system", "You are terse.", NULL},
    {"user", "My name is Bob.", NULL},
    {"assistant", "Hello Bob.", "The user gave a name."},
    {"user", "", NULL},
};
#define N_CONV (sizeof conv / sizeof conv[0])

static void encode_conv(uint8_t **b, size_t *len)
{
    struct sil_error err = {0};
    if (sil_sessfile_encode(1000, "plan", 1234567, conv, N_CONV, b, len, &err) < 0)
        fail_msg("encode: %s", err.msg);
}

static void assert_conv(const struct sil_sessfile *f)
{
    assert_int_equal(f->uid, 1000);
    assert_int_equal(f->saved_at, 1234567);
    assert_string_equal(f->name, "plan");
    assert_int_equal(f->n_msgs, N_CONV);
    for (size_t i = 0; i < N_CONV; i++) {
        assert_string_equal(f->msgs[i].role, conv[i].role);
        assert_string_equal(f->msgs[i].content, conv[i].content);
        if (conv[i].reasoning)
            assert_string_equal(f->msgs[i].reasoning, conv[i].reasoning);
        else
            assert_null(f->msgs[i].reasoning);
    }
}

static void test_round_trip(void **state)
{
    (void)state;
    uint8_t *b;
    size_t len;
    encode_conv(&b, &len);
    struct sil_sessfile f;
    struct sil_error err = {0};
    assert_int_equal(sil_sessfile_parse(b, len, "t", &f, &err), 0);
    assert_conv(&f);
    sil_sessfile_free(&f);
    free(b);
    /* no messages at all is a valid (empty) transcript */
    assert_int_equal(sil_sessfile_encode(7, "e", 0, NULL, 0, &b, &len, &err), 0);
    assert_int_equal(sil_sessfile_parse(b, len, "t", &f, &err), 0);
    assert_int_equal(f.n_msgs, 0);
    sil_sessfile_free(&f);
    free(b);
    /* what the format cannot hold is refused at encode */
    const struct sil_chat_msg tool = {"tool", "x", NULL};
    assert_int_equal(sil_sessfile_encode(7, "e", 0, &tool, 1, &b, &len, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "role 'tool'"));
    assert_int_equal(sil_sessfile_encode(7, "", 0, conv, 1, &b, &len, &err), -EINVAL);
    char longname[200];
    memset(longname, 'n', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    assert_int_equal(sil_sessfile_encode(7, longname, 0, conv, 1, &b, &len, &err), -EINVAL);
}

/* Every proper prefix, and every single-byte change, is refused with a message and no leak. */
static void test_truncated_and_flipped(void **state)
{
    (void)state;
    uint8_t *b;
    size_t len;
    encode_conv(&b, &len);
    struct sil_sessfile f;
    for (size_t n = 0; n < len; n++) {
        struct sil_error err = {0};
        uint8_t *cut = malloc(n ? n : 1); /* exactly n bytes, so ASan sees any overread */
        memcpy(cut, b, n);
        assert_int_equal(sil_sessfile_parse(cut, n, "t", &f, &err), -EINVAL);
        assert_true(err.msg[0]);
        free(cut);
    }
    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit += 3) {
            struct sil_error err = {0};
            b[i] ^= (uint8_t)(1u << bit);
            assert_int_equal(sil_sessfile_parse(b, len, "t", &f, &err), -EINVAL);
            b[i] ^= (uint8_t)(1u << bit);
        }
    /* trailing bytes, even with a checksum made to match */
    uint8_t *more = malloc(len + 1);
    memcpy(more, b, len);
    more[len] = 0;
    struct sil_error err = {0};
    assert_int_equal(sil_sessfile_parse(more, len + 1, "t", &f, &err), -EINVAL);
    free(more);
    free(b);
}

/* A body with a correct checksum, so the structural checks themselves are reached. */
static void seal(struct tu_buf *t)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < t->len; i++) {
        h ^= t->p[i];
        h *= 0x100000001b3ull;
    }
    tu_put_u64(t, h);
}

static void header(struct tu_buf *t, const char *name, uint32_t n_msgs)
{
    tu_put_bytes(t, "SILSESS", 8);
    tu_put_u32(t, 1);
    tu_put_u32(t, 1000);
    tu_put_u64(t, 1);
    tu_put_u32(t, (uint32_t)strlen(name));
    tu_put_bytes(t, name, strlen(name));
    tu_put_u32(t, n_msgs);
}

static void expect_bad(struct tu_buf *t, const char *why)
{
    seal(t);
    struct sil_sessfile f;
    struct sil_error err = {0};
    assert_int_equal(sil_sessfile_parse(t->p, t->len, "t", &f, &err), -EINVAL);
    if (!strstr(err.msg, why)) fail_msg("expected '%s' in: %s", why, err.msg);
    tu_buf_free(t);
}

static void test_structure(void **state)
{
    (void)state;
    struct tu_buf t = {0};
    header(&t, "a", 1);
    tu_put_u8(&t, 3); /* role */
    tu_put_u8(&t, 0);
    tu_put_u32(&t, 0);
    expect_bad(&t, "role 3");

    header(&t, "a", 1);
    tu_put_u8(&t, 1);
    tu_put_u8(&t, 2); /* unknown flag */
    tu_put_u32(&t, 0);
    expect_bad(&t, "flags");

    header(&t, "a", 1);
    tu_put_u8(&t, 1);
    tu_put_u8(&t, 0);
    tu_put_u32(&t, 3);
    tu_put_bytes(&t, "a\0b", 3);
    expect_bad(&t, "NUL byte in its content");

    header(&t, "a", 1);
    tu_put_u8(&t, 1);
    tu_put_u8(&t, 0);
    tu_put_u32(&t, 0xffffffffu); /* a length past the end */
    expect_bad(&t, "0 left");

    header(&t, "a", 1);
    tu_put_u8(&t, 2);
    tu_put_u8(&t, 1); /* reasoning announced, not there */
    tu_put_u32(&t, 0);
    expect_bad(&t, "reasoning's length is cut off");

    header(&t, "a", 0xffffffffu); /* a count the file cannot hold: refused before allocating */
    expect_bad(&t, "messages in");

    header(&t, "a", 0);
    tu_put_u8(&t, 0); /* after the last message */
    expect_bad(&t, "after the last message");

    header(&t, "a\nb", 0);
    t.p[28 + 1] = 0; /* a NUL in the name */
    expect_bad(&t, "NUL byte in the name");

    tu_put_bytes(&t, "SILSESS", 8);
    tu_put_u32(&t, 2);
    tu_put_zeros(&t, 40);
    expect_bad(&t, "version 2");

    header(&t, "", 0);
    tu_put_zeros(&t, 2);
    expect_bad(&t, "name of 0 bytes");
}

static void test_garbage(void **state)
{
    (void)state;
    uint64_t x = 88172645463325252ull;
    for (int round = 0; round < 2000; round++) {
        const size_t n = (size_t)(round % 300);
        uint8_t *b = malloc(n ? n : 1);
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b[i] = (uint8_t)x;
        }
        if (n >= 8 && round % 2) memcpy(b, "SILSESS", 8); /* past the magic too */
        struct sil_sessfile f;
        struct sil_error err = {0};
        assert_int_equal(sil_sessfile_parse(b, n, "t", &f, &err), -EINVAL);
        free(b);
    }
}

static void test_names(void **state)
{
    (void)state;
    const char *names[] = {"plan", "../../etc/passwd", "a/b", "..", ".", "\xff\xfe\x01", " ", "-x"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char file[256], back[128];
        assert_int_equal(sil_sessfile_name_encode(names[i], file, sizeof file), 0);
        assert_int_equal(strspn(file, "0123456789abcdef"), strlen(file));
        assert_int_equal(sil_sessfile_name_decode(file, back, sizeof back), 0);
        assert_string_equal(back, names[i]);
    }
    char longest[128], file[256], back[128];
    memset(longest, 0xc3, 127);
    longest[127] = 0;
    assert_int_equal(sil_sessfile_name_encode(longest, file, sizeof file), 0);
    assert_int_equal(strlen(file), 254); /* fits NAME_MAX */
    assert_int_equal(sil_sessfile_name_decode(file, back, sizeof back), 0);
    assert_memory_equal(back, longest, 128);
    char over[129];
    memset(over, 'a', 128);
    over[128] = 0;
    assert_int_equal(sil_sessfile_name_encode(over, file, sizeof file), -ENAMETOOLONG);
    assert_int_equal(sil_sessfile_name_encode("", file, sizeof file), -EINVAL);
    const char *bad[] = {"", "7", "7g", "7A", "00", "6100", ".partial", "../70", "70/"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(sil_sessfile_name_decode(bad[i], back, sizeof back), -EINVAL);
}

static char *uid_file(const char *dir, uint32_t uid, const char *name)
{
    char hex[256], rel[300];
    assert_int_equal(sil_sessfile_name_encode(name, hex, sizeof hex), 0);
    snprintf(rel, sizeof rel, "sessions/%u/%s", (unsigned)uid, hex);
    return tu_path_join(dir, rel);
}

static void test_store(void **state)
{
    (void)state;
    char *dir = tu_tmpdir_create();
    struct sil_sessstore st;
    struct sil_error err = {0};
    sil_sessstore_open(&st, dir, 3, 1 << 20);
    assert_true(sil_sessstore_on(&st));
    assert_int_equal(sil_sessstore_save(&st, 1000, "plan", conv, N_CONV, &err), 0);
    assert_int_equal(sil_sessstore_save(&st, 1001, "plan", conv, 1, &err), 0);
    char *f = uid_file(dir, 1000, "plan");
    struct stat sb;
    assert_int_equal(stat(f, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0600);
    char *d = tu_path_join(dir, "sessions/1000");
    assert_int_equal(stat(d, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0700);
    free(d);
    sil_sessstore_close(&st);

    /* indexed again at open: each uid's own */
    sil_sessstore_open(&st, dir, 3, 1 << 20);
    assert_int_equal(st.n, 2);
    const struct sil_sessfile_entry *e = sil_sessstore_find(&st, 1000, "plan");
    assert_non_null(e);
    assert_int_equal(e->n_msgs, N_CONV);
    struct sil_sessfile sf;
    assert_int_equal(sil_sessstore_load(&st, 1000, "plan", &sf, &err), 0);
    assert_int_equal(sf.n_msgs, N_CONV);
    assert_string_equal(sf.msgs[2].reasoning, conv[2].reasoning);
    sil_sessfile_free(&sf);
    assert_int_equal(sil_sessstore_load(&st, 1002, "plan", &sf, &err), -ENOENT);
    assert_int_equal(sil_sessstore_load(&st, 1001, "none", &sf, &err), -ENOENT);

    /* a file changed behind the store's back is refused at load and leaves the index */
    void *buf;
    size_t len;
    assert_int_equal(tu_read_file(f, &buf, &len), 0);
    assert_int_equal(tu_write_file(f, buf, len - 1), 0);
    assert_int_equal(sil_sessstore_load(&st, 1000, "plan", &sf, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "checksum"));
    assert_null(sil_sessstore_find(&st, 1000, "plan"));
    /* a save replaces the bad file */
    assert_int_equal(sil_sessstore_save(&st, 1000, "plan", conv, 2, &err), 0);
    assert_int_equal(sil_sessstore_load(&st, 1000, "plan", &sf, &err), 0);
    assert_int_equal(sf.n_msgs, 2);
    sil_sessfile_free(&sf);

    /* another uid's file copied into this uid's directory is not this uid's session */
    char *g = uid_file(dir, 1000, "copy");
    char *o = uid_file(dir, 1001, "plan");
    void *ob;
    size_t ol;
    assert_int_equal(tu_read_file(o, &ob, &ol), 0);
    assert_int_equal(tu_write_file(g, ob, ol), 0);
    sil_sessstore_close(&st);
    sil_sessstore_open(&st, dir, 3, 1 << 20);
    assert_null(sil_sessstore_find(&st, 1000, "copy"));
    assert_non_null(sil_sessstore_find(&st, 1000, "plan"));
    unlink(g);

    /* the bound on files: the least recently saved goes */
    assert_int_equal(sil_sessstore_save(&st, 1000, "b", conv, 1, &err), 0);
    assert_int_equal(sil_sessstore_save(&st, 1000, "c", conv, 1, &err), 0);
    assert_int_equal(sil_sessstore_save(&st, 1000, "d", conv, 1, &err), 0);
    assert_null(sil_sessstore_find(&st, 1000, "plan"));
    assert_int_equal(stat(f, &sb), -1);
    assert_non_null(sil_sessstore_find(&st, 1000, "d"));
    assert_non_null(sil_sessstore_find(&st, 1001, "plan")); /* another uid's bound */
    /* saving an existing one again does not count twice */
    assert_int_equal(sil_sessstore_save(&st, 1000, "b", conv, 2, &err), 0);
    assert_non_null(sil_sessstore_find(&st, 1000, "c"));
    /* remove */
    assert_int_equal(sil_sessstore_remove(&st, 1000, "c"), 0);
    assert_int_equal(sil_sessstore_remove(&st, 1000, "c"), -ENOENT);
    assert_null(sil_sessstore_find(&st, 1000, "c"));
    sil_sessstore_close(&st);

    /* the bound on bytes: a transcript over it is not saved and its old file goes */
    sil_sessstore_open(&st, dir, 3, 90);
    assert_int_equal(sil_sessstore_save(&st, 1001, "plan", conv + 1, 1, &err),
                     0); /* under 90 bytes */
    assert_int_equal(sil_sessstore_save(&st, 1001, "plan", conv, N_CONV, &err), -EFBIG);
    assert_non_null(strstr(err.msg, "saved_session_bytes"));
    assert_null(sil_sessstore_find(&st, 1001, "plan"));
    assert_int_equal(stat(o, &sb), -1);
    sil_sessstore_close(&st);

    free(ob);
    free(buf);
    free(f);
    free(g);
    free(o);
    tu_tmpdir_remove(dir);
    free(dir);
}

static void test_store_off(void **state)
{
    (void)state;
    char *dir = tu_tmpdir_create();
    struct sil_sessstore st;
    struct sil_error err = {0};
    /* a file where the directory should be */
    char *file = tu_path_join(dir, "afile");
    assert_int_equal(tu_write_file(file, "x", 1), 0);
    sil_sessstore_open(&st, file, 3, 1 << 20);
    assert_false(sil_sessstore_on(&st));
    assert_int_equal(sil_sessstore_save(&st, 1, "a", conv, 1, &err), 0); /* nothing, no error */
    struct sil_sessfile sf;
    assert_int_equal(sil_sessstore_load(&st, 1, "a", &sf, &err), -ENOENT);
    sil_sessstore_close(&st);
    /* saved_sessions = 0: off */
    sil_sessstore_open(&st, dir, 0, 1 << 20);
    assert_false(sil_sessstore_on(&st));
    sil_sessstore_close(&st);
    /* a sessions directory others may read is made private */
    char *s = tu_path_join(dir, "sessions");
    assert_int_equal(mkdir(s, 0755), 0);
    sil_sessstore_open(&st, dir, 3, 1 << 20);
    assert_true(sil_sessstore_on(&st));
    struct stat sb;
    assert_int_equal(stat(s, &sb), 0);
    assert_int_equal(sb.st_mode & 0777, 0700);
    sil_sessstore_close(&st);
    /* a link in its place is refused */
    assert_int_equal(rmdir(s), 0);
    assert_int_equal(symlink(dir, s), 0);
    sil_sessstore_open(&st, dir, 3, 1 << 20);
    assert_false(sil_sessstore_on(&st));
    sil_sessstore_close(&st);
    unlink(s);
    free(s);
    free(file);
    tu_tmpdir_remove(dir);
    free(dir);
}

int main(void)
{
    sil_log_init(SIL_LOG_ERR); /* the warnings the bad files give are expected */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip), cmocka_unit_test(test_truncated_and_flipped),
        cmocka_unit_test(test_structure),  cmocka_unit_test(test_garbage),
        cmocka_unit_test(test_names),      cmocka_unit_test(test_store),
        cmocka_unit_test(test_store_off),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
