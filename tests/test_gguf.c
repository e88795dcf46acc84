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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_refdata_files),
        cmocka_unit_test(test_all_types),
        cmocka_unit_test(test_open_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
