/* GGUF reader: every refdata file parses with the expected header, keys and tensors; generated
 * files exercise every value type, both versions and the getters; broken files are rejected
 * with a message naming what was wrong and where. */
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/engine/gguf.h"
#include "kernels/cpu/quants.h"
#include "tests/testutil.h"

/* ---- reference files ---------------------------------------------------------------------- */

struct ref_model {
    const char *file, *arch;
    int64_t n_tensors, n_kv, n_tokens;
    int first_type; /* type of tensor 0 */
};

/* Counts read with an independent parser of the format. */
static const struct ref_model ref_models[] = {
    {"models/qwen3-tiny-Q8_0.gguf", "qwen3", 46, 26, 512, SIL_TYPE_F32},
    {"models/qwen35-tiny-Q4_K_M.gguf", "qwen35", 56, 34, 512, SIL_TYPE_Q6_K},
    {"models/qwen35moe-tiny-F16.gguf", "qwen35moe", 76, 37, 512, SIL_TYPE_F16},
    {"models/qwen35moe-tiny-Q4_K_M.gguf", "qwen35moe", 76, 37, 512, SIL_TYPE_Q6_K},
    {"models/qwen35moe-tiny-Q5_K_M.gguf", "qwen35moe", 76, 37, 512, SIL_TYPE_Q6_K},
    {"models/qwen35moe-tiny-Q6_K.gguf", "qwen35moe", 76, 37, 512, SIL_TYPE_Q6_K},
    {"models/qwen35moe-tiny-Q8_0.gguf", "qwen35moe", 76, 37, 512, SIL_TYPE_Q8_0},
    {"models/qwen3moe-tiny-Q4_K_M.gguf", "qwen3moe", 51, 29, 512, SIL_TYPE_Q6_K},
    {"tokenizer/llama3-vocab.gguf", "llama", 0, 27, 128256, -1},
    {"tokenizer/qwen3-vocab.gguf", "qwen3", 0, 25, 151936, -1},
};

static bool str_eq(struct sil_str s, const char *c)
{
    return s.ptr && s.len == strlen(c) && memcmp(s.ptr, c, s.len) == 0;
}

static void test_refdata_files(void **state)
{
    for (size_t m = 0; m < sizeof ref_models / sizeof ref_models[0]; m++) {
        const struct ref_model *rm = &ref_models[m];
        char *path = tu_refdata_path(rm->file);
        struct sil_gguf *g = NULL;
        struct sil_error err = {0};
        int r = sil_gguf_open(&g, path, &err);
        if (r)
            fail_msg("%s: %s", rm->file, err.msg);
        assert_non_null(g);
        assert_int_equal(sil_gguf_version(g), 3);
        assert_string_equal(sil_gguf_path(g), path);
        assert_int_equal(sil_gguf_alignment(g), SIL_GGUF_DEFAULT_ALIGNMENT);
        assert_int_equal(sil_gguf_n_kv(g), rm->n_kv);
        assert_int_equal(sil_gguf_n_tensors(g), rm->n_tensors);

        struct sil_str arch;
        assert_int_equal(sil_gguf_get_str(g, "general.architecture", &arch, &err), 0);
        if (!str_eq(arch, rm->arch))
            fail_msg("%s: architecture '%.*s', expected '%s'", rm->file, (int)arch.len, arch.ptr,
                     rm->arch);

        /* Every key is found by its own name at its own index. */
        for (int64_t i = 0; i < sil_gguf_n_kv(g); i++)
            assert_int_equal(sil_gguf_find_key(g, sil_gguf_key_name(g, i)), i);

        enum sil_gguf_vtype et;
        uint64_t n;
        int64_t ti;
        assert_int_equal(sil_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &ti, &err), 0);
        assert_int_equal(et, SIL_GGUF_STRING);
        assert_int_equal(n, rm->n_tokens);
        assert_int_equal(sil_gguf_arr_len(g, ti), rm->n_tokens);
        /* Token 100 is the byte-level symbol for 0xA7 in both byte-level vocabularies. */
        assert_true(str_eq(sil_gguf_arr_str(g, ti, 100), "\xc2\xa7"));
        assert_null(sil_gguf_arr_str(g, ti, n).ptr);

        uint64_t dofs = sil_gguf_data_offset(g);
        if (rm->n_tensors > 0) {
            assert_int_equal(dofs % sil_gguf_alignment(g), 0);
            assert_int_equal(sil_gguf_tensor(g, 0)->type, rm->first_type);
        }
        uint64_t total = 0;
        for (int64_t i = 0; i < sil_gguf_n_tensors(g); i++) {
            const struct sil_gguf_tensor *t = sil_gguf_tensor(g, i);
            assert_ptr_equal(sil_gguf_find_tensor(g, t->name), t);
            assert_ptr_equal(t->data, (const char *)sil_gguf_base(g) + dofs + t->offset);
            assert_true(t->offset + t->nbytes <= sil_gguf_file_size(g) - dofs);
            assert_int_equal(t->nbytes, sil_row_size(t->type, t->ne[0]) * t->ne[1] * t->ne[2] *
                                            t->ne[3]);
            total += t->nbytes;
        }
        assert_true(total <= sil_gguf_file_size(g));
        if (rm->n_tensors > 0) {
            const struct sil_gguf_tensor *t = sil_gguf_find_tensor(g, "output_norm.weight");
            assert_non_null(t);
            assert_int_equal(t->n_dims, 1);
            assert_int_equal(t->ne[0], 256);
            assert_int_equal(t->ne[1], 1);
            assert_int_equal(t->type, SIL_TYPE_F32);
            assert_int_equal(t->nbytes, 256 * 4);
            const struct sil_gguf_tensor *e = sil_gguf_find_tensor(g, "token_embd.weight");
            assert_non_null(e);
            assert_int_equal(e->n_dims, 2);
            assert_int_equal(e->ne[0], 256);
            assert_int_equal(e->ne[1], 512);
        }
        assert_null(sil_gguf_find_tensor(g, "no.such.tensor"));
        assert_int_equal(sil_gguf_find_key(g, "no.such.key"), -1);
        sil_gguf_close(g);
        free(path);
    }
}

/* ---- generated files ---------------------------------------------------------------------- */

static int open_buf(struct sil_gguf **g, const struct tu_buf *b, struct sil_error *err)
{
    memset(err, 0, sizeof *err);
    return sil_gguf_open_mem(g, b->p, b->len, "t.gguf", err);
}

/* A file with one key of every scalar type, arrays of each, a string array and two tensors. */
static void build_all_types(struct tu_buf *b, uint32_t version, uint32_t alignment)
{
    static const char *const strs[] = {"alpha", "", "\xc3\xa9t\xc3\xa9", "d"};
    tu_gguf_header(b, version, 2, 20);
    tu_gguf_key(b, "u8", SIL_GGUF_UINT8), tu_put_u8(b, 200);
    tu_gguf_key(b, "i8", SIL_GGUF_INT8), tu_put_u8(b, (uint8_t)-5);
    tu_gguf_key(b, "u16", SIL_GGUF_UINT16), tu_put_u16(b, 60000);
    tu_gguf_key(b, "i16", SIL_GGUF_INT16), tu_put_u16(b, (uint16_t)-300);
    tu_gguf_kv_u32(b, "u32", 4000000000u);
    tu_gguf_kv_i32(b, "i32", -7);
    tu_gguf_kv_f32(b, "f32", 1.5f);
    tu_gguf_kv_bool(b, "bool", true);
    tu_gguf_kv_str(b, "str", "hello");
    tu_gguf_kv_u64(b, "u64", UINT64_MAX);
    tu_gguf_key(b, "i64", SIL_GGUF_INT64), tu_put_i64(b, INT64_MIN);
    tu_gguf_key(b, "f64", SIL_GGUF_FLOAT64), tu_put_f64(b, 0.25);
    tu_gguf_kv_u32(b, "general.alignment", alignment);
    tu_gguf_kv_arr_str(b, "arr.str", strs, 4);
    const int32_t iv[3] = {1, -2, 3};
    tu_gguf_kv_arr_i32(b, "arr.i32", iv, 3);
    const float fv[2] = {0.5f, -1.0f};
    tu_gguf_kv_arr_f32(b, "arr.f32", fv, 2);
    tu_gguf_kv_arr(b, "arr.u64", SIL_GGUF_UINT64, 2), tu_put_u64(b, 5), tu_put_u64(b, UINT64_MAX);
    tu_gguf_kv_arr(b, "arr.bool", SIL_GGUF_BOOL, 3), tu_put_u8(b, 1), tu_put_u8(b, 0),
        tu_put_u8(b, 1);
    tu_gguf_kv_arr(b, "arr.empty", SIL_GGUF_UINT8, 0);
    tu_gguf_kv_arr(b, "arr.f64", SIL_GGUF_FLOAT64, 1), tu_put_f64(b, 2.0);
    const int64_t ne0[2] = {64, 3}, ne1[1] = {32};
    /* Q8_0: 32 elements in 34 bytes; 64x3 -> 2 blocks x 3 rows = 204 bytes. */
    uint64_t off1 = (204 + alignment - 1) / alignment * alignment;
    tu_gguf_tensor_info(b, "w.q8", 2, ne0, SIL_TYPE_Q8_0, 0);
    tu_gguf_tensor_info(b, "w.f32", 1, ne1, SIL_TYPE_F32, off1);
    tu_put_pad(b, alignment);
    for (int i = 0; i < 204; i++)
        tu_put_u8(b, (uint8_t)i);
    tu_put_zeros(b, off1 - 204);
    for (int i = 0; i < 32; i++)
        tu_put_f32(b, (float)i);
}

static void check_all_types(struct sil_gguf *g, uint32_t version, uint32_t alignment)
{
    struct sil_error err = {0};
    assert_int_equal(sil_gguf_version(g), version);
    assert_int_equal(sil_gguf_alignment(g), alignment);
    assert_int_equal(sil_gguf_n_kv(g), 20);
    assert_int_equal(sil_gguf_data_offset(g) % alignment, 0);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    bool bv;
    struct sil_str s;
    assert_int_equal(sil_gguf_get_u32(g, "u8", &u32, &err), 0);
    assert_int_equal(u32, 200);
    assert_int_equal(sil_gguf_get_i64(g, "i8", &i64, &err), 0);
    assert_int_equal(i64, -5);
    assert_int_equal(sil_gguf_get_u32(g, "u16", &u32, &err), 0);
    assert_int_equal(u32, 60000);
    assert_int_equal(sil_gguf_get_i64(g, "i16", &i64, &err), 0);
    assert_int_equal(i64, -300);
    assert_int_equal(sil_gguf_get_u32(g, "u32", &u32, &err), 0);
    assert_int_equal(u32, 4000000000u);
    assert_int_equal(sil_gguf_get_u64(g, "u32", &u64, &err), 0);
    assert_int_equal(u64, 4000000000u);
    assert_int_equal(sil_gguf_get_i64(g, "i32", &i64, &err), 0);
    assert_int_equal(i64, -7);
    assert_int_equal(sil_gguf_get_f32(g, "f32", &f, &err), 0);
    assert_true(f == 1.5f);
    assert_int_equal(sil_gguf_get_f32(g, "f64", &f, &err), 0);
    assert_true(f == 0.25f);
    assert_int_equal(sil_gguf_get_bool(g, "bool", &bv, &err), 0);
    assert_true(bv);
    assert_int_equal(sil_gguf_get_str(g, "str", &s, &err), 0);
    assert_true(str_eq(s, "hello"));
    assert_int_equal(sil_gguf_get_u64(g, "u64", &u64, &err), 0);
    assert_true(u64 == UINT64_MAX);
    assert_int_equal(sil_gguf_get_i64(g, "i64", &i64, &err), 0);
    assert_true(i64 == INT64_MIN);

    int64_t i = sil_gguf_find_key(g, "str");
    assert_true(i >= 0);
    assert_string_equal(sil_gguf_key_name(g, i), "str");
    assert_int_equal(sil_gguf_key_type(g, i), SIL_GGUF_STRING);

    enum sil_gguf_vtype et;
    uint64_t n;
    assert_int_equal(sil_gguf_get_arr(g, "arr.str", &et, &n, &i, &err), 0);
    assert_int_equal(et, SIL_GGUF_STRING);
    assert_int_equal(n, 4);
    assert_int_equal(sil_gguf_key_type(g, i), SIL_GGUF_ARRAY);
    assert_int_equal(sil_gguf_arr_type(g, i), SIL_GGUF_STRING);
    assert_true(str_eq(sil_gguf_arr_str(g, i, 0), "alpha"));
    assert_int_equal(sil_gguf_arr_str(g, i, 1).len, 0);
    assert_non_null(sil_gguf_arr_str(g, i, 1).ptr);
    assert_true(str_eq(sil_gguf_arr_str(g, i, 2), "\xc3\xa9t\xc3\xa9"));
    assert_true(str_eq(sil_gguf_arr_str(g, i, 3), "d"));
    assert_null(sil_gguf_arr_str(g, i, 4).ptr);
    assert_null(sil_gguf_arr_data(g, i));

    assert_int_equal(sil_gguf_get_arr(g, "arr.i32", &et, &n, &i, &err), 0);
    assert_int_equal(et, SIL_GGUF_INT32);
    assert_int_equal(n, 3);
    int32_t raw[3];
    memcpy(raw, sil_gguf_arr_data(g, i), sizeof raw);
    assert_int_equal(raw[1], -2);
    assert_int_equal(sil_gguf_arr_get_i64(g, i, 1, &i64), 0);
    assert_int_equal(i64, -2);
    assert_int_equal(sil_gguf_arr_get_f32(g, i, 2, &f), 0);
    assert_true(f == 3.0f);
    assert_int_equal(sil_gguf_arr_get_i64(g, i, 3, &i64), -EINVAL);
    assert_null(sil_gguf_arr_str(g, i, 0).ptr);

    assert_int_equal(sil_gguf_get_arr(g, "arr.f32", &et, &n, &i, &err), 0);
    assert_int_equal(sil_gguf_arr_get_f32(g, i, 1, &f), 0);
    assert_true(f == -1.0f);
    assert_int_equal(sil_gguf_arr_get_i64(g, i, 1, &i64), 0);
    assert_int_equal(i64, -1);
    assert_int_equal(sil_gguf_arr_get_i64(g, i, 0, &i64), -ERANGE); /* 0.5 is no integer */

    assert_int_equal(sil_gguf_get_arr(g, "arr.u64", &et, &n, &i, &err), 0);
    assert_int_equal(sil_gguf_arr_get_i64(g, i, 0, &i64), 0);
    assert_int_equal(i64, 5);
    assert_int_equal(sil_gguf_arr_get_i64(g, i, 1, &i64), -ERANGE);

    assert_int_equal(sil_gguf_get_arr(g, "arr.bool", &et, &n, &i, &err), 0);
    assert_int_equal(et, SIL_GGUF_BOOL);
    assert_int_equal(((const uint8_t *)sil_gguf_arr_data(g, i))[2], 1);
    assert_int_equal(sil_gguf_arr_get_i64(g, i, 0, &i64), -EINVAL);

    assert_int_equal(sil_gguf_get_arr(g, "arr.empty", &et, &n, &i, &err), 0);
    assert_int_equal(et, SIL_GGUF_UINT8);
    assert_int_equal(n, 0);
    assert_int_equal(sil_gguf_arr_get_i64(g, i, 0, &i64), -EINVAL);

    assert_int_equal(sil_gguf_get_arr(g, "arr.f64", &et, &n, &i, &err), 0);
    assert_int_equal(sil_gguf_arr_get_f32(g, i, 0, &f), 0);
    assert_true(f == 2.0f);

    /* Out-of-range indices never read anything. */
    assert_null(sil_gguf_key_name(g, -1));
    assert_null(sil_gguf_key_name(g, 20));
    assert_int_equal(sil_gguf_key_type(g, 20), SIL_GGUF_VTYPE_COUNT);
    assert_int_equal(sil_gguf_arr_len(g, sil_gguf_find_key(g, "u8")), 0);
    assert_null(sil_gguf_arr_data(g, sil_gguf_find_key(g, "u8")));
    assert_null(sil_gguf_tensor(g, 2));
    assert_null(sil_gguf_tensor(g, -1));

    assert_int_equal(sil_gguf_n_tensors(g), 2);
    const struct sil_gguf_tensor *t = sil_gguf_find_tensor(g, "w.q8");
    assert_non_null(t);
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->ne[0], 64);
    assert_int_equal(t->ne[1], 3);
    assert_int_equal(t->ne[2], 1);
    assert_int_equal(t->ne[3], 1);
    assert_int_equal(t->nbytes, 204);
    assert_int_equal(((const uint8_t *)t->data)[203], 203);
    t = sil_gguf_find_tensor(g, "w.f32");
    assert_non_null(t);
    assert_int_equal(t->nbytes, 128);
    float last;
    memcpy(&last, (const char *)t->data + 31 * 4, 4);
    assert_true(last == 31.0f);
    assert_ptr_equal(t, sil_gguf_tensor(g, 1));
}

static void test_all_types(void **state)
{
    static const uint32_t versions[] = {2, 3};
    static const uint32_t aligns[] = {1, 8, 32, 64, 4096};
    for (size_t v = 0; v < 2; v++) {
        for (size_t a = 0; a < sizeof aligns / sizeof aligns[0]; a++) {
            struct tu_buf b = {0};
            build_all_types(&b, versions[v], aligns[a]);
            struct sil_gguf *g = NULL;
            struct sil_error err;
            int r = open_buf(&g, &b, &err);
            if (r)
                fail_msg("v%u align %u: %s", versions[v], aligns[a], err.msg);
            check_all_types(g, versions[v], aligns[a]);
            sil_gguf_close(g);
            tu_buf_free(&b);
        }
    }
}

/* The same bytes through a real file: mmap'd, path kept, tensors in place. */
static void test_open_file(void **state)
{
    struct tu_buf b = {0};
    build_all_types(&b, 3, 32);
    char *dir = tu_tmpdir_create();
    assert_non_null(dir);
    char *path = tu_path_join(dir, "all.gguf");
    assert_int_equal(tu_write_file(path, b.p, b.len), 0);
    struct sil_gguf *g = NULL;
    struct sil_error err = {0};
    int r = sil_gguf_open(&g, path, &err);
    if (r)
        fail_msg("%s", err.msg);
    assert_string_equal(sil_gguf_path(g), path);
    assert_int_equal(sil_gguf_file_size(g), b.len);
    assert_ptr_not_equal(sil_gguf_base(g), b.p);
    assert_memory_equal(sil_gguf_base(g), b.p, b.len);
    check_all_types(g, 3, 32);
    sil_gguf_close(g);

    /* A missing file is -ENOENT naming the path; a directory is rejected. */
    char *missing = tu_path_join(dir, "missing.gguf");
    assert_int_equal(sil_gguf_open(&g, missing, &err), -ENOENT);
    assert_null(g);
    assert_non_null(strstr(err.msg, "missing.gguf"));
    assert_int_equal(sil_gguf_open(&g, dir, &err), -EINVAL);
    assert_null(g);
    /* An empty file is a truncated GGUF. */
    char *empty = tu_path_join(dir, "empty.gguf");
    assert_int_equal(tu_write_file(empty, "", 0), 0);
    assert_int_equal(sil_gguf_open(&g, empty, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "truncated"));

    free(empty);
    free(missing);
    free(path);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
    free(dir);
    tu_buf_free(&b);
}

/* ---- rejections --------------------------------------------------------------------------- */

/* Opens b, expects -EINVAL, no handle, and a message that names the file, contains want, and
 * (when at is not UINT64_MAX) names the byte offset at. */
static void expect_reject_at(const struct tu_buf *b, const char *want, uint64_t at, int line)
{
    struct sil_gguf *g = (struct sil_gguf *)&g; /* must be reset to NULL */
    struct sil_error err;
    int r = open_buf(&g, b, &err);
    if (r != -EINVAL) {
        sil_gguf_close(r == 0 ? g : NULL);
        fail_msg("line %d: expected -EINVAL with '%s', got %d (%s)", line, want, r, err.msg);
    }
    assert_null(g);
    assert_int_equal(err.code, -EINVAL);
    if (strncmp(err.msg, "t.gguf: ", 8) != 0 || !strstr(err.msg, want))
        fail_msg("line %d: message '%s' lacks '%s'", line, err.msg, want);
    if (strchr(err.msg, '\n'))
        fail_msg("line %d: message is not one line: '%s'", line, err.msg);
    char off[40];
    snprintf(off, sizeof off, "(offset 0x%llx)", (unsigned long long)at);
    if (at != UINT64_MAX && !strstr(err.msg, off))
        fail_msg("line %d: message '%s' lacks '%s'", line, err.msg, off);
}
#define expect_reject(b, want) expect_reject_at((b), (want), UINT64_MAX, __LINE__)
#define expect_reject_off(b, want, at) expect_reject_at((b), (want), (at), __LINE__)

/* A valid file with one key and one F32 tensor [8]; returns the offset of the tensor info. */
static size_t build_one(struct tu_buf *b)
{
    tu_gguf_header(b, 3, 1, 1);
    tu_gguf_kv_str(b, "general.architecture", "qwen3");
    size_t info = b->len;
    const int64_t ne[1] = {8};
    tu_gguf_tensor_info(b, "w", 1, ne, SIL_TYPE_F32, 0);
    tu_put_pad(b, 32);
    tu_put_zeros(b, 32);
    return info;
}

static void test_valid_one(void **state)
{
    struct tu_buf b = {0};
    build_one(&b);
    struct sil_gguf *g = NULL;
    struct sil_error err;
    assert_int_equal(open_buf(&g, &b, &err), 0);
    assert_int_equal(sil_gguf_n_tensors(g), 1);
    sil_gguf_close(g);
    tu_buf_free(&b);
}

/* Every prefix of a valid file fails cleanly, with a message about the end of the file and an
 * offset inside the prefix. */
static void test_truncated_everywhere(void **state)
{
    struct tu_buf full = {0};
    build_all_types(&full, 3, 32);
    for (size_t cut = 0; cut < full.len; cut++) {
        /* A private copy of exactly cut bytes so ASan sees any read past the prefix. */
        uint8_t *p = malloc(cut ? cut : 1);
        assert_non_null(p);
        memcpy(p, full.p, cut);
        struct sil_gguf *g = NULL;
        struct sil_error err = {0};
        int r = sil_gguf_open_mem(&g, p, cut, "t.gguf", &err);
        if (r != -EINVAL)
            fail_msg("prefix of %zu bytes: got %d (%s)", cut, r, err.msg);
        assert_null(g);
        if (!strstr(err.msg, "truncated") && !strstr(err.msg, "end of file"))
            fail_msg("prefix of %zu bytes: message '%s'", cut, err.msg);
        const char *o = strstr(err.msg, "(offset 0x");
        assert_non_null(o);
        unsigned long long at = strtoull(o + 10, NULL, 16);
        if (at > cut)
            fail_msg("prefix of %zu bytes: offset %llu past the cut: %s", cut, at, err.msg);
        free(p);
    }
    tu_buf_free(&full);
}

static void test_bad_header(void **state)
{
    struct tu_buf b = {0};
    build_one(&b);
    memcpy(b.p, "GGUX", 4);
    expect_reject_off(&b, "bad magic 47 47 55 58", 0);
    memcpy(b.p, "FUGG", 4); /* byte-swapped magic is still not ours */
    expect_reject(&b, "bad magic");
    memcpy(b.p, "GGUF", 4);
    static const uint32_t bad_versions[] = {0, 1, 4, 0xFFFFFFFFu, 0x03000000u};
    for (size_t i = 0; i < sizeof bad_versions / sizeof bad_versions[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "unsupported GGUF version %u", bad_versions[i]);
        tu_patch_u32(&b, 4, bad_versions[i]);
        expect_reject_off(&b, want, 4);
    }
    tu_patch_u32(&b, 4, 2);
    struct sil_gguf *g = NULL;
    struct sil_error err;
    assert_int_equal(open_buf(&g, &b, &err), 0); /* version 2 has the same layout */
    sil_gguf_close(g);
    tu_buf_free(&b);
}

static void test_absurd_counts(void **state)
{
    struct tu_buf b = {0};
    build_one(&b);
    tu_patch_u64(&b, 8, 1ull << 60);
    expect_reject_off(&b, "tensor count 1152921504606846976 cannot fit", 8);
    tu_patch_u64(&b, 8, UINT64_MAX);
    expect_reject_off(&b, "tensor count", 8);
    tu_patch_u64(&b, 8, 1);
    tu_patch_u64(&b, 16, 1ull << 60);
    expect_reject_off(&b, "kv count 1152921504606846976 cannot fit", 16);
    tu_buf_free(&b);

    /* A 2^40-byte key, and a 2^40-byte string value. */
    tu_gguf_header(&b, 3, 0, 1);
    tu_put_u64(&b, 1ull << 40);
    tu_put_zeros(&b, 64);
    expect_reject_off(&b, "string length 1099511627776 beyond end of file", 24);
    tu_buf_free(&b);
    tu_gguf_header(&b, 3, 0, 1);
    tu_gguf_key(&b, "s", SIL_GGUF_STRING);
    size_t at = b.len;
    tu_put_u64(&b, 1ull << 40);
    tu_put_zeros(&b, 64);
    expect_reject_off(&b, "string length 1099511627776 beyond end of file", at);
    tu_buf_free(&b);

    /* 2^62-element arrays of u32, of strings, and of u8. */
    static const uint32_t et[] = {SIL_GGUF_UINT32, SIL_GGUF_STRING, SIL_GGUF_UINT8};
    for (size_t i = 0; i < 3; i++) {
        tu_gguf_header(&b, 3, 0, 1);
        tu_gguf_kv_arr(&b, "a", et[i], 1ull << 62);
        tu_put_zeros(&b, 64);
        expect_reject_off(&b, "4611686018427387904", b.len - 64 - 8);
        tu_buf_free(&b);
    }
}

static void test_tensor_data_bounds(void **state)
{
    struct tu_buf b = {0};
    size_t info = build_one(&b);
    size_t off_field = info + 8 + 1 + 4 + 8 + 4;
    tu_patch_u64(&b, off_field, 32); /* [32, 64) but the file has [0, 32) of data */
    expect_reject_off(&b, "tensor 0 'w': data [32, 64)", off_field);
    expect_reject(&b, "beyond end of file");
    tu_patch_u64(&b, off_field, UINT64_MAX - 31); /* aligned, wraps when the size is added */
    expect_reject(&b, "beyond end of file");
    tu_buf_free(&b);

    /* Data ends one byte short. */
    build_one(&b);
    b.len--;
    expect_reject(&b, "beyond end of file");
    tu_buf_free(&b);

    /* Misaligned offset. */
    build_one(&b);
    tu_patch_u64(&b, off_field, 16);
    expect_reject_off(&b, "data offset 16 is not a multiple of the alignment 32", off_field);
    tu_buf_free(&b);

    /* Two tensors overlapping, then sharing one offset. */
    static const uint64_t second[] = {32, 0};
    for (int k = 0; k < 2; k++) {
        tu_gguf_header(&b, 3, 2, 0);
        const int64_t ne_a[1] = {16}, ne_b[1] = {8};
        tu_gguf_tensor_info(&b, "a", 1, ne_a, SIL_TYPE_F32, 0); /* [0, 64) */
        tu_gguf_tensor_info(&b, "b", 1, ne_b, SIL_TYPE_F32, second[k]);
        tu_put_pad(&b, 32);
        tu_put_zeros(&b, 128);
        expect_reject(&b, "overlaps tensor");
        tu_buf_free(&b);
    }
    /* Adjacent is fine. */
    tu_gguf_header(&b, 3, 2, 0);
    const int64_t ne_a[1] = {16}, ne_b[1] = {8};
    tu_gguf_tensor_info(&b, "b", 1, ne_b, SIL_TYPE_F32, 64);
    tu_gguf_tensor_info(&b, "a", 1, ne_a, SIL_TYPE_F32, 0);
    tu_put_pad(&b, 32);
    tu_put_zeros(&b, 96);
    struct sil_gguf *g = NULL;
    struct sil_error err;
    assert_int_equal(open_buf(&g, &b, &err), 0);
    sil_gguf_close(g);
    tu_buf_free(&b);
}

/* One tensor with the given shape and type, at offset 0, followed by enough zero bytes. */
static void build_tensor(struct tu_buf *b, const char *name, uint32_t n_dims, const int64_t *ne,
                         uint32_t type)
{
    tu_gguf_header(b, 3, 1, 0);
    tu_gguf_tensor_info(b, name, n_dims, ne, type, 0);
    tu_put_pad(b, 32);
    tu_put_zeros(b, 4096);
}

static void test_tensor_info(void **state)
{
    struct tu_buf b = {0};
    const int64_t ne[5] = {32, 2, 1, 1, 1};
    static const uint32_t unknown[] = {4, 5, 39, 40, 99, 0xFFFFFFFFu};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "unknown tensor type %u", unknown[i]);
        build_tensor(&b, "w", 2, ne, unknown[i]);
        expect_reject_off(&b, want, 24 + 8 + 1 + 4 + 16);
        tu_buf_free(&b);
    }
    build_tensor(&b, "w", 0, ne, SIL_TYPE_F32);
    expect_reject_off(&b, "n_dims 0 not in 1..4", 24 + 9);
    tu_buf_free(&b);
    build_tensor(&b, "w", 5, ne, SIL_TYPE_F32);
    expect_reject_off(&b, "n_dims 5 not in 1..4", 24 + 9);
    tu_buf_free(&b);

    const int64_t zero[2] = {32, 0}, neg[2] = {-32, 2};
    build_tensor(&b, "w", 2, zero, SIL_TYPE_F32);
    expect_reject_off(&b, "dim 1 is 0 (must be > 0)", 24 + 9 + 4 + 8);
    tu_buf_free(&b);
    build_tensor(&b, "w", 2, neg, SIL_TYPE_F32);
    expect_reject_off(&b, "dim 0 is -32", 24 + 9 + 4);
    tu_buf_free(&b);

    const int64_t big[4] = {1ll << 32, 1ll << 32, 1, 1};
    build_tensor(&b, "w", 2, big, SIL_TYPE_F32);
    expect_reject(&b, "element count overflows int64");
    tu_buf_free(&b);
    const int64_t wide[1] = {1ll << 62}; /* 2^62 elements fit, 2^64 bytes do not */
    build_tensor(&b, "w", 1, wide, SIL_TYPE_F32);
    expect_reject(&b, "byte size overflows int64");
    tu_buf_free(&b);
    const int64_t rows[2] = {1ll << 59, 8}; /* each row fits; 2^62 elements; 2^64 bytes */
    build_tensor(&b, "w", 2, rows, SIL_TYPE_F32);
    expect_reject(&b, "byte size overflows int64");
    tu_buf_free(&b);

    const int64_t odd[2] = {48, 2};
    build_tensor(&b, "w", 2, odd, SIL_TYPE_Q8_0);
    expect_reject(&b, "row length 48 is not a multiple of the q8_0 block size 32");
    tu_buf_free(&b);
    const int64_t odd_k[1] = {128};
    build_tensor(&b, "w", 1, odd_k, SIL_TYPE_Q4_K);
    expect_reject(&b, "row length 128 is not a multiple of the q4_K block size 256");
    tu_buf_free(&b);

    /* Duplicate tensor names. */
    tu_gguf_header(&b, 3, 2, 0);
    const int64_t ne8[1] = {8};
    tu_gguf_tensor_info(&b, "w", 1, ne8, SIL_TYPE_F32, 0);
    size_t at = b.len;
    tu_gguf_tensor_info(&b, "w", 1, ne8, SIL_TYPE_F32, 32);
    tu_put_pad(&b, 32);
    tu_put_zeros(&b, 64);
    expect_reject_off(&b, "duplicate tensor name 'w' (tensors 0 and 1)", at);
    tu_buf_free(&b);

    /* Tensor names: invalid UTF-8, NUL inside, empty. */
    build_tensor(&b, "blk.\xff", 2, ne, SIL_TYPE_F32);
    expect_reject_off(&b, "tensor 0 name is not valid UTF-8", 24 + 8 + 4);
    tu_buf_free(&b);
    build_tensor(&b, "", 2, ne, SIL_TYPE_F32);
    expect_reject(&b, "tensor 0 name is empty");
    tu_buf_free(&b);
    tu_gguf_header(&b, 3, 1, 0);
    tu_put_strn(&b, "a\0b", 3);
    tu_put_u32(&b, 1), tu_put_i64(&b, 8), tu_put_u32(&b, SIL_TYPE_F32), tu_put_u64(&b, 0);
    tu_put_pad(&b, 32);
    tu_put_zeros(&b, 32);
    expect_reject(&b, "tensor 0 name contains a NUL byte");
    tu_buf_free(&b);
}

static void test_keys(void **state)
{
    struct tu_buf b = {0};
    tu_gguf_header(&b, 3, 0, 3);
    tu_gguf_kv_u32(&b, "a", 1);
    tu_gguf_kv_u32(&b, "b", 1);
    size_t at = b.len;
    tu_gguf_kv_str(&b, "a", "x");
    expect_reject_off(&b, "duplicate key 'a' (kv 0 and 2)", at);
    tu_buf_free(&b);

    /* Not UTF-8: a stray continuation byte, an overlong NUL, a surrogate, above U+10FFFF,
     * a sequence cut short by the end of the key. */
    static const char *const bad[] = {"a\x80", "\xc0\x80", "x\xed\xa0\x80", "\xf4\x90\x80\x80",
                                      "ab\xe2\x82", "\xff"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tu_gguf_header(&b, 3, 0, 1);
        tu_gguf_kv_u32(&b, bad[i], 1);
        expect_reject(&b, "key 0 is not valid UTF-8");
        tu_buf_free(&b);
    }
    /* Valid multi-byte keys are fine. */
    tu_gguf_header(&b, 3, 0, 1);
    tu_gguf_kv_u32(&b, "cl\xc3\xa9.\xe2\x82\xac.\xf0\x9f\x98\x80", 7);
    struct sil_gguf *g = NULL;
    struct sil_error err;
    assert_int_equal(open_buf(&g, &b, &err), 0);
    uint32_t v = 0;
    assert_int_equal(sil_gguf_get_u32(g, "cl\xc3\xa9.\xe2\x82\xac.\xf0\x9f\x98\x80", &v, &err), 0);
    assert_int_equal(v, 7);
    sil_gguf_close(g);
    tu_buf_free(&b);

    tu_gguf_header(&b, 3, 0, 1);
    tu_gguf_kv_u32(&b, "", 1);
    expect_reject_off(&b, "key 0 is empty", 24);
    tu_buf_free(&b);
    tu_gguf_header(&b, 3, 0, 1);
    tu_put_strn(&b, "k\0", 2), tu_put_u32(&b, SIL_GGUF_UINT8), tu_put_u8(&b, 0);
    expect_reject(&b, "key 0 contains a NUL byte");
    tu_buf_free(&b);

    /* Unknown value types, unknown array element types, arrays of arrays. */
    tu_gguf_header(&b, 3, 0, 1);
    tu_gguf_key(&b, "k", 13), tu_put_u32(&b, 0);
    expect_reject_off(&b, "key 'k': unknown value type 13", 24 + 9);
    tu_buf_free(&b);
    tu_gguf_header(&b, 3, 0, 1);
    tu_gguf_kv_arr(&b, "k", 0xFFFFFFFFu, 0);
    expect_reject_off(&b, "key 'k': unknown array element type 4294967295", 24 + 9 + 4);
    tu_buf_free(&b);
    tu_gguf_header(&b, 3, 0, 1);
    tu_gguf_kv_arr(&b, "k", SIL_GGUF_ARRAY, 1);
    tu_put_u32(&b, SIL_GGUF_UINT8), tu_put_u64(&b, 1), tu_put_u8(&b, 1);
    expect_reject_off(&b, "key 'k': array of arrays nested deeper", 24 + 9 + 4);
    tu_buf_free(&b);

    /* Bools other than 0/1, alone and in arrays. */
    tu_gguf_header(&b, 3, 0, 1);
    tu_gguf_key(&b, "k", SIL_GGUF_BOOL), tu_put_u8(&b, 2);
    expect_reject_off(&b, "key 'k': bool value 2 (not 0 or 1)", 24 + 9 + 4);
    tu_buf_free(&b);
    tu_gguf_header(&b, 3, 0, 1);
    tu_gguf_kv_arr(&b, "k", SIL_GGUF_BOOL, 3), tu_put_u8(&b, 1), tu_put_u8(&b, 0),
        tu_put_u8(&b, 255);
    expect_reject_off(&b, "key 'k': bool array element 2 has value 255", 24 + 9 + 4 + 4 + 8 + 2);
    tu_buf_free(&b);
}

static void test_alignment_key(void **state)
{
    static const uint32_t bad[] = {0, 3, 48, 0x80000001u};
    struct tu_buf b = {0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char want[64];
        snprintf(want, sizeof want, "general.alignment %u is not a power of two", bad[i]);
        tu_gguf_header(&b, 3, 0, 1);
        tu_gguf_kv_u32(&b, "general.alignment", bad[i]);
        expect_reject_off(&b, want, b.len - 4);
        tu_buf_free(&b);
    }
    tu_gguf_header(&b, 3, 0, 1);
    tu_gguf_kv_u64(&b, "general.alignment", 32);
    expect_reject_off(&b, "general.alignment has type u64 (expected u32)", b.len - 8);
    tu_buf_free(&b);
    tu_gguf_header(&b, 3, 0, 1);
    tu_gguf_kv_str(&b, "general.alignment", "32");
    expect_reject(&b, "general.alignment has type string");
    tu_buf_free(&b);

    /* A valid alignment moves the data section; an offset aligned to 32 but not 64 fails. */
    tu_gguf_header(&b, 3, 1, 1);
    tu_gguf_kv_u32(&b, "general.alignment", 64);
    const int64_t ne[1] = {8};
    tu_gguf_tensor_info(&b, "w", 1, ne, SIL_TYPE_F32, 32);
    tu_put_pad(&b, 64);
    tu_put_zeros(&b, 128);
    expect_reject(&b, "data offset 32 is not a multiple of the alignment 64");
    tu_buf_free(&b);
}

static void test_getters(void **state)
{
    struct tu_buf b = {0};
    tu_gguf_header(&b, 3, 0, 8);
    tu_gguf_kv_i32(&b, "neg", -1);
    tu_gguf_kv_u64(&b, "huge", UINT64_MAX);
    tu_gguf_key(&b, "min", SIL_GGUF_INT64), tu_put_i64(&b, INT64_MIN);
    tu_gguf_kv_str(&b, "s", "text");
    tu_gguf_key(&b, "big", SIL_GGUF_FLOAT64), tu_put_f64(&b, 1e300);
    tu_gguf_kv_bool(&b, "flag", false);
    tu_gguf_kv_u32(&b, "n", 5);
    tu_gguf_kv_arr(&b, "arr", SIL_GGUF_UINT8, 1), tu_put_u8(&b, 9);
    struct sil_gguf *g = NULL;
    struct sil_error err = {0};
    int r = open_buf(&g, &b, &err);
    if (r)
        fail_msg("%s", err.msg);
    uint32_t u32 = 77;
    uint64_t u64 = 77;
    int64_t i64 = 77;
    float f = 77;
    bool bv = true;
    struct sil_str s;
    enum sil_gguf_vtype et;
    uint64_t len;
    int64_t idx;

    /* Absent keys. */
    assert_int_equal(sil_gguf_get_u32(g, "absent", &u32, &err), -ENOENT);
    assert_int_equal(err.code, -ENOENT);
    assert_non_null(strstr(err.msg, "key 'absent' not found"));
    assert_int_equal(sil_gguf_get_str(g, "absent", &s, &err), -ENOENT);
    assert_int_equal(sil_gguf_get_arr(g, "absent", &et, &len, &idx, &err), -ENOENT);
    assert_int_equal(sil_gguf_get_bool(g, "absent", &bv, &err), -ENOENT);
    assert_int_equal(sil_gguf_get_f32(g, "absent", &f, &err), -ENOENT);

    /* Type mismatches name key and both types, and leave the output alone. */
    assert_int_equal(sil_gguf_get_u32(g, "s", &u32, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "key 's': expected u32, found string"));
    assert_int_equal(u32, 77);
    assert_int_equal(sil_gguf_get_str(g, "n", &s, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "key 'n': expected string, found u32"));
    assert_int_equal(sil_gguf_get_bool(g, "n", &bv, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "expected bool"));
    assert_int_equal(sil_gguf_get_f32(g, "n", &f, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "expected f32, found u32"));
    assert_int_equal(sil_gguf_get_u64(g, "flag", &u64, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "found bool"));
    assert_int_equal(sil_gguf_get_arr(g, "n", &et, &len, &idx, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "expected array, found u32"));
    assert_int_equal(sil_gguf_get_i64(g, "arr", &i64, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "found array"));
    assert_int_equal(i64, 77);

    /* Range. */
    assert_int_equal(sil_gguf_get_u32(g, "neg", &u32, &err), -ERANGE);
    assert_non_null(strstr(err.msg, "key 'neg'"));
    assert_int_equal(sil_gguf_get_u64(g, "neg", &u64, &err), -ERANGE);
    assert_int_equal(sil_gguf_get_i64(g, "neg", &i64, &err), 0);
    assert_int_equal(i64, -1);
    assert_int_equal(sil_gguf_get_u32(g, "huge", &u32, &err), -ERANGE);
    assert_int_equal(sil_gguf_get_i64(g, "huge", &i64, &err), -ERANGE);
    assert_int_equal(sil_gguf_get_u64(g, "huge", &u64, &err), 0);
    assert_true(u64 == UINT64_MAX);
    assert_int_equal(sil_gguf_get_u64(g, "min", &u64, &err), -ERANGE);
    assert_int_equal(sil_gguf_get_u32(g, "min", &u32, &err), -ERANGE);
    assert_int_equal(sil_gguf_get_f32(g, "big", &f, &err), -ERANGE);
    assert_int_equal(u32, 77);
    assert_true(f == 77);
    assert_int_equal(sil_gguf_get_bool(g, "flag", &bv, &err), 0);
    assert_false(bv);
    assert_int_equal(sil_gguf_get_u32(g, "n", &u32, &err), 0);
    assert_int_equal(u32, 5);
    assert_int_equal(sil_gguf_get_arr(g, "arr", NULL, NULL, &idx, &err), 0);
    assert_int_equal(sil_gguf_arr_get_i64(g, idx, 0, &i64), 0);
    assert_int_equal(i64, 9);
    /* Array accessors on a scalar index refuse. */
    assert_int_equal(sil_gguf_arr_get_i64(g, sil_gguf_find_key(g, "n"), 0, &i64), -EINVAL);
    assert_int_equal(sil_gguf_arr_get_f32(g, -1, 0, &f), -EINVAL);
    assert_string_equal(sil_gguf_vtype_name(SIL_GGUF_FLOAT64), "f64");
    assert_string_equal(sil_gguf_vtype_name(SIL_GGUF_VTYPE_COUNT), "invalid");
    sil_gguf_close(g);
    tu_buf_free(&b);
}

/* Every single-byte corruption of a valid file either opens (and then every accessor stays in
 * bounds: the copy is exactly sized, so ASan builds catch any overread) or fails with a message. */
static void test_byte_corruptions(void **state)
{
    struct tu_buf full = {0};
    build_all_types(&full, 3, 32);
    uint8_t *p = malloc(full.len);
    assert_non_null(p);
    static const int deltas[] = {-1, 1, 0x80};
    size_t opened = 0, failed = 0;
    for (size_t at = 0; at < full.len; at++) {
        for (size_t d = 0; d < 5; d++) {
            memcpy(p, full.p, full.len);
            p[at] = d < 3 ? (uint8_t)(p[at] + deltas[d]) : d == 3 ? 0 : 0xff;
            struct sil_gguf *g = NULL;
            struct sil_error err = {0};
            int r = sil_gguf_open_mem(&g, p, full.len, "t.gguf", &err);
            if (r) {
                assert_int_equal(r, -EINVAL);
                assert_null(g);
                assert_int_equal(strncmp(err.msg, "t.gguf: ", 8), 0);
                assert_non_null(strstr(err.msg, "(offset 0x"));
                failed++;
                continue;
            }
            opened++;
            for (int64_t i = 0; i < sil_gguf_n_kv(g); i++) {
                assert_int_equal(sil_gguf_find_key(g, sil_gguf_key_name(g, i)), i);
                for (uint64_t j = 0; j < sil_gguf_arr_len(g, i); j++) {
                    struct sil_str e = sil_gguf_arr_str(g, i, j);
                    assert_true(e.ptr == NULL || (const uint8_t *)e.ptr + e.len <= p + full.len);
                }
            }
            for (int64_t i = 0; i < sil_gguf_n_tensors(g); i++) {
                const struct sil_gguf_tensor *t = sil_gguf_tensor(g, i);
                assert_true((const uint8_t *)t->data + t->nbytes <= p + full.len);
            }
            sil_gguf_close(g);
        }
    }
    /* Both outcomes occur: the loop really exercised the checks and the accessors. */
    assert_true(opened > 0);
    assert_true(failed > 0);
    free(p);
    tu_buf_free(&full);
}

/* The error for a real file names its path. */
static void test_error_names_path(void **state)
{
    struct tu_buf b = {0};
    build_one(&b);
    memcpy(b.p, "XXXX", 4);
    char *dir = tu_tmpdir_create();
    assert_non_null(dir);
    char *path = tu_path_join(dir, "bad.gguf");
    assert_int_equal(tu_write_file(path, b.p, b.len), 0);
    struct sil_gguf *g = NULL;
    struct sil_error err = {0};
    assert_int_equal(sil_gguf_open(&g, path, &err), -EINVAL);
    assert_null(g);
    assert_int_equal(strncmp(err.msg, path, strlen(path)), 0);
    assert_non_null(strstr(err.msg, "bad magic"));
    free(path);
    assert_int_equal(tu_tmpdir_remove(dir), 0);
    free(dir);
    tu_buf_free(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refdata_files),
        cmocka_unit_test(test_all_types),
        cmocka_unit_test(test_open_file),
        cmocka_unit_test(test_valid_one),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_bad_header),
        cmocka_unit_test(test_absurd_counts),
        cmocka_unit_test(test_tensor_data_bounds),
        cmocka_unit_test(test_tensor_info),
        cmocka_unit_test(test_keys),
        cmocka_unit_test(test_alignment_key),
        cmocka_unit_test(test_getters),
        cmocka_unit_test(test_byte_corruptions),
        cmocka_unit_test(test_error_names_path),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
