/* sil-mkmodel: files written into a temp dir and read back with the GGUF reader (keys, shapes,
 * types, values against regenerated rows), the type recipes against llama-quantize's choices on
 * the refdata models, the fast quantizers against the reference ones, vocabularies (synthetic and
 * imported), the JSON reader, routing skew, determinism, and the command line.
 *
 * The Makefile links bench sources only into the bench binary, so the sources are compiled into
 * this test here (json.c comes with tests/testutil_json.c, linked into every test). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "daemon/engine/gguf.h"
#include "daemon/engine/tokenizer.h"
#include "kernels/cpu/quants.h"
#include "tests/testutil.h"
#include "tests/testutil_json.h"

#include "bench/sil-mkmodel/arch.c"
#include "bench/sil-mkmodel/fastquant.c"
#include "bench/sil-mkmodel/gguf_writer.c"
#include "bench/sil-mkmodel/recipe.c"
#include "bench/sil-mkmodel/vocab.c"
#include "bench/sil-mkmodel/weights.c"

static char *tmpdir;

static int setup(void **state)
{
    (void)state;
    tmpdir = tu_tmpdir_create();
    return tmpdir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    tu_tmpdir_remove(tmpdir);
    free(tmpdir);
    return 0;
}

/* A model from a preset/arch, synthetic vocab of the preset size, types assigned. */
static void make_model(struct sil_mk_model *m, const char *preset, int arch, int recipe, uint64_t seed)
{
    struct sil_error err = {0};
    memset(m, 0, sizeof(*m));
    if (preset)
        assert_int_equal(sil_mk_preset(preset, &m->hp), 0);
    else
        sil_mk_arch_defaults(arch, &m->hp);
    m->seed = seed;
    m->recipe = recipe;
    assert_int_equal(sil_mk_vocab_synthetic(&m->vocab, m->hp.n_vocab, seed, &err), 0);
    m->hp.n_vocab = m->vocab.n;
    int rc = sil_mk_check_hparams(&m->hp, &err);
    if (!rc)
        rc = sil_mk_build_tensors(m, &err);
    if (!rc)
        rc = sil_mk_assign_types(m, NULL, 0, &err);
    if (rc)
        fail_msg("%s", err.msg);
}

static struct sil_gguf *write_and_open(struct sil_mk_model *m, const char *name, int threads)
{
    struct sil_error err = {0};
    char *path = tu_path_join(tmpdir, name);
    if (sil_mk_write(m, path, threads, false, &err))
        fail_msg("write: %s", err.msg);
    struct sil_gguf *g = NULL;
    if (sil_gguf_open(&g, path, &err))
        fail_msg("read back: %s", err.msg);
    free(path);
    return g;
}

static double rel_rms_error(const float *a, const float *b, int64_t n)
{
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return s > 0 ? sqrt(e / s) : sqrt(e);
}

/* Every tensor as written: name, dims, type; values of sampled rows against regenerated ones
 * within a bound per type (exact for f32). */
static void check_tensors(const struct sil_mk_model *m, const struct sil_gguf *g)
{
    assert_int_equal(sil_gguf_n_tensors(g), m->n_tensors);
    float *want = malloc(4 * 65536), *got = malloc(4 * 65536);
    assert_non_null(want);
    assert_non_null(got);
    for (int64_t i = 0; i < m->n_tensors; i++) {
        const struct sil_mk_tensor *t = &m->tensors[i];
        const struct sil_gguf_tensor *gt = sil_gguf_find_tensor(g, t->name);
        if (!gt)
            fail_msg("tensor %s missing", t->name);
        assert_int_equal(gt->n_dims, t->n_dims);
        assert_int_equal(gt->type, t->type);
        for (int d = 0; d < 4; d++)
            assert_int_equal(gt->ne[d], t->ne[d]);
        int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
        size_t rs = sil_row_size(t->type, t->ne[0]);
        assert_true(t->ne[0] <= 65536);
        for (int64_t r = 0; r < rows; r += rows / 7 + 1) {
            sil_mk_gen_row(m, t, r, want);
            sil_dequantize_row(t->type, (const uint8_t *)gt->data + (size_t)r * rs, got, t->ne[0]);
            double e = rel_rms_error(got, want, t->ne[0]);
            double bound = t->type == SIL_TYPE_F32 ? 0 : t->type == SIL_TYPE_F16 ? 1e-3
                         : t->type == SIL_TYPE_Q8_0 ? 0.01 : t->type == SIL_TYPE_Q6_K ? 0.04
                         : t->type == SIL_TYPE_Q5_0 || t->type == SIL_TYPE_Q5_1 ? 0.06 : 0.12;
            if (!(e <= bound))
                fail_msg("%s row %lld (%s): relative error %g > %g", t->name, (long long)r,
                         sil_type_name(t->type), e, bound);
        }
    }
    free(want);
    free(got);
}

static void test_roundtrip_f32(void **state)
{
    (void)state;
    struct sil_mk_model m;
    make_model(&m, "tiny", 0, SIL_MK_F32, 7);
    struct sil_gguf *g = write_and_open(&m, "f32.gguf", 2);
    struct sil_error err = {0};
    struct sil_str s;
    uint32_t u;
    float f;
    assert_int_equal(sil_gguf_get_str(g, "general.architecture", &s, &err), 0);
    assert_int_equal(s.len, 9);
    assert_memory_equal(s.ptr, "qwen35moe", 9);
    assert_int_equal(sil_gguf_get_u32(g, "qwen35moe.block_count", &u, &err), 0);
    assert_int_equal(u, 4);
    assert_int_equal(sil_gguf_get_u32(g, "qwen35moe.expert_used_count", &u, &err), 0);
    assert_int_equal(u, 4);
    assert_int_equal(sil_gguf_get_u32(g, "qwen35moe.ssm.inner_size", &u, &err), 0);
    assert_int_equal(u, 256);
    assert_int_equal(sil_gguf_get_u32(g, "qwen35moe.rope.dimension_count", &u, &err), 0);
    assert_int_equal(u, 16);
    assert_int_equal(sil_gguf_get_f32(g, "qwen35moe.rope.freq_base", &f, &err), 0);
    assert_float_equal(f, 1e7f, 1);
    assert_int_equal(sil_gguf_get_u32(g, "general.file_type", &u, &err), 0);
    assert_int_equal(u, 0);
    assert_int_equal(sil_gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &u, &err), 0);
    assert_int_equal(u, 509);
    check_tensors(&m, g);
    sil_gguf_close(g);
    sil_mk_model_free(&m);
}

/* The bytes written do not depend on the number of worker threads (1, 2, 3, 8, and more threads
 * than chunks). */
static void test_threads_same_bytes(void **state)
{
    (void)state;
    struct sil_mk_model m;
    make_model(&m, "tiny", 0, SIL_MK_Q4_K_M, 5);
    void *first = NULL;
    size_t first_len = 0;
    static const int counts[] = {1, 2, 3, 8, SIL_MK_MAX_THREADS};
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        struct sil_error err = {0};
        char *path = tu_path_join(tmpdir, "thr.gguf");
        if (sil_mk_write(&m, path, counts[k], false, &err))
            fail_msg("write with %d threads: %s", counts[k], err.msg);
        void *buf = NULL;
        size_t len = 0;
        assert_int_equal(tu_read_file(path, &buf, &len), 0);
        free(path);
        if (!first) {
            first = buf;
            first_len = len;
            continue;
        }
        assert_int_equal(len, first_len);
        if (memcmp(buf, first, len) != 0) fail_msg("%d threads wrote other bytes", counts[k]);
        free(buf);
    }
    free(first);
    sil_mk_model_free(&m);
}

static void test_roundtrip_quantized(void **state)
{
    (void)state;
    static const int recipes_to_test[] = {SIL_MK_Q4_K_M, SIL_MK_Q8_0, SIL_MK_F16, SIL_MK_Q6_K};
    for (size_t k = 0; k < sizeof(recipes_to_test) / sizeof(recipes_to_test[0]); k++) {
        struct sil_mk_model m;
        make_model(&m, "tiny", 0, recipes_to_test[k], 3);
        struct sil_gguf *g = write_and_open(&m, "q.gguf", 2);
        check_tensors(&m, g);
        sil_gguf_close(g);
        sil_mk_model_free(&m);
    }
}

static void test_exact_quant_roundtrip(void **state)
{
    (void)state;
    struct sil_mk_model m;
    make_model(&m, "tiny", 0, SIL_MK_Q4_K_M, 5);
    m.exact_quant = true;
    struct sil_gguf *g = write_and_open(&m, "exact.gguf", 1);
    check_tensors(&m, g);
    sil_gguf_close(g);
    sil_mk_model_free(&m);
}

/* Tensor names, dims and types, and metadata key names and types, as llama-quantize and the
 * converter made them for the refdata tiny models. */
static void compare_with_refdata(const char *ref, const char *preset, int arch, int recipe)
{
    char *rp = tu_refdata_path(ref);
    if (!tu_refdata_exists(ref)) {
        free(rp);
        tu_skip_no_refdata();
    }
    struct sil_error err = {0};
    struct sil_gguf *r = NULL;
    if (sil_gguf_open(&r, rp, &err))
        fail_msg("%s", err.msg);
    struct sil_mk_model m;
    make_model(&m, preset, arch, recipe, 1);
    struct sil_gguf *g = write_and_open(&m, "cmp.gguf", 2);
    assert_int_equal(sil_gguf_n_tensors(g), sil_gguf_n_tensors(r));
    for (int64_t i = 0; i < sil_gguf_n_tensors(r); i++) {
        const struct sil_gguf_tensor *rt = sil_gguf_tensor(r, i);
        const struct sil_gguf_tensor *gt = sil_gguf_find_tensor(g, rt->name);
        if (!gt)
            fail_msg("%s: tensor %s missing", ref, rt->name);
        if (gt->type != rt->type || gt->n_dims != rt->n_dims)
            fail_msg("%s: %s is %s/%u-D, reference %s/%u-D", ref, rt->name, sil_type_name(gt->type),
                     gt->n_dims, sil_type_name(rt->type), rt->n_dims);
        for (int d = 0; d < 4; d++)
            assert_int_equal(gt->ne[d], rt->ne[d]);
    }
    for (int64_t i = 0; i < sil_gguf_n_kv(r); i++) {
        const char *k = sil_gguf_key_name(r, i);
        if (strcmp(k, "general.size_label") == 0)
            continue;
        int64_t j = sil_gguf_find_key(g, k);
        if (j < 0)
            fail_msg("%s: key %s missing", ref, k);
        assert_int_equal(sil_gguf_key_type(g, j), sil_gguf_key_type(r, i));
        if (sil_gguf_key_type(r, i) == SIL_GGUF_UINT32 && strstr(k, "token_id") == NULL) {
            uint32_t a, b;
            assert_int_equal(sil_gguf_get_u32(r, k, &a, &err), 0);
            assert_int_equal(sil_gguf_get_u32(g, k, &b, &err), 0);
            if (a != b)
                fail_msg("%s: %s = %u, reference %u", ref, k, b, a);
        }
    }
    sil_gguf_close(g);
    sil_gguf_close(r);
    sil_mk_model_free(&m);
    free(rp);
}

static void test_refdata_qwen35moe(void **state)
{
    (void)state;
    compare_with_refdata("models/qwen35moe-tiny-F16.gguf", "tiny", 0, SIL_MK_F16);
    compare_with_refdata("models/qwen35moe-tiny-Q4_K_M.gguf", "tiny", 0, SIL_MK_Q4_K_M);
    compare_with_refdata("models/qwen35moe-tiny-Q5_K_M.gguf", "tiny", 0, SIL_MK_Q5_K_M);
    compare_with_refdata("models/qwen35moe-tiny-Q6_K.gguf", "tiny", 0, SIL_MK_Q6_K);
    compare_with_refdata("models/qwen35moe-tiny-Q8_0.gguf", "tiny", 0, SIL_MK_Q8_0);
}

static void test_refdata_other_archs(void **state)
{
    (void)state;
    compare_with_refdata("models/qwen35-tiny-Q4_K_M.gguf", NULL, SIL_MK_QWEN35, SIL_MK_Q4_K_M);
    compare_with_refdata("models/qwen3moe-tiny-Q4_K_M.gguf", NULL, SIL_MK_QWEN3MOE, SIL_MK_Q4_K_M);
    compare_with_refdata("models/qwen3-tiny-Q8_0.gguf", NULL, SIL_MK_QWEN3, SIL_MK_Q8_0);
}

/* The 40-layer recipe: layer counters follow name order, as the quantizer's do. */
static void test_recipe_35b(void **state)
{
    (void)state;
    struct sil_mk_model m = {0};
    struct sil_error err = {0};
    assert_int_equal(sil_mk_preset("qwen35-35b-a3b", &m.hp), 0);
    m.recipe = SIL_MK_Q4_K_M;
    assert_int_equal(sil_mk_build_tensors(&m, &err), 0);
    assert_int_equal(sil_mk_assign_types(&m, NULL, 0, &err), 0);
    int q6 = 0, n_down = 0;
    uint64_t bytes = 0;
    for (int64_t i = 0; i < m.n_tensors; i++) {
        const struct sil_mk_tensor *t = &m.tensors[i];
        bytes += t->nbytes;
        if (strcmp(t->cls, "ffn_down_exps") == 0) {
            n_down++;
            int l = t->layer;
            bool more = l < 5 || l >= 35 || (l - 5) % 3 == 2;
            assert_int_equal(t->type, more ? SIL_TYPE_Q6_K : SIL_TYPE_Q4_K);
            q6 += more;
        }
        if (strcmp(t->name, "output.weight") == 0)
            assert_int_equal(t->type, SIL_TYPE_Q6_K);
        if (strcmp(t->cls, "ffn_gate_inp") == 0)
            assert_int_equal(t->type, SIL_TYPE_F32);
    }
    assert_int_equal(n_down, 40);
    assert_int_equal(q6, 20);
    /* a real Qwen3.5-35B-A3B Q4_K_M is about 20-21 GiB */
    assert_true(bytes > 19ull << 30 && bytes < 22ull << 30);
    /* blk.10.attn_qkv is the 3rd attention-v-like tensor in name order: more bits */
    for (int64_t i = 0; i < m.n_tensors; i++)
        if (strcmp(m.tensors[i].name, "blk.10.attn_qkv.weight") == 0)
            assert_int_equal(m.tensors[i].type, SIL_TYPE_Q6_K);
    sil_mk_model_free(&m);
}

static void test_type_overrides(void **state)
{
    (void)state;
    struct sil_mk_model m;
    struct sil_error err = {0};
    make_model(&m, "demo", 0, SIL_MK_Q4_K_M, 1);
    char *ok[] = {"ffn_down_exps=q6_k", "blk.0.attn_qkv.weight=q8_0", "ffn_*_shexp=f16"};
    assert_int_equal(sil_mk_assign_types(&m, ok, 3, &err), 0);
    for (int64_t i = 0; i < m.n_tensors; i++) {
        const struct sil_mk_tensor *t = &m.tensors[i];
        if (strcmp(t->cls, "ffn_down_exps") == 0)
            assert_int_equal(t->type, SIL_TYPE_Q6_K);
        if (strcmp(t->name, "blk.0.attn_qkv.weight") == 0)
            assert_int_equal(t->type, SIL_TYPE_Q8_0);
        if (strcmp(t->name, "blk.1.attn_qkv.weight") == 0)
            assert_int_not_equal(t->type, SIL_TYPE_Q8_0);
        if (strstr(t->cls, "_shexp") && strcmp(t->cls, "ffn_gate_inp_shexp") != 0)
            assert_int_equal(t->type, SIL_TYPE_F16);
    }
    char *bad1[] = {"nosuchclass=q8_0"}, *bad2[] = {"ffn_down_exps=q9_9"}, *bad3[] = {"novalue"},
         *bad4[] = {"ssm_conv1d=q8_0"};
    assert_int_equal(sil_mk_assign_types(&m, bad1, 1, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "nosuchclass"));
    assert_int_equal(sil_mk_assign_types(&m, bad2, 1, &err), -EINVAL);
    assert_int_equal(sil_mk_assign_types(&m, bad3, 1, &err), -EINVAL);
    /* conv rows have 4 elements: no 32-block fits */
    assert_int_equal(sil_mk_assign_types(&m, bad4, 1, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "ssm_conv1d"));
    sil_mk_model_free(&m);
}

/* Fast quantizers: valid blocks whose error is within 1.6x of the reference's. */
static void test_fast_quant(void **state)
{
    (void)state;
    enum { N = 4096 };
    static float x[N], y[N];
    static uint8_t q[N * 2];
    uint64_t s = 42;
    for (int i = 0; i < N; i++)
        x[i] = tri(&s, 0.05f) + (i % 97 == 0 ? 0.3f : 0.0f);
    const int types[] = {SIL_TYPE_Q4_K, SIL_TYPE_Q6_K};
    for (int k = 0; k < 2; k++) {
        assert_true(sil_mk_fast_quantize_row(types[k], x, q, N));
        sil_dequantize_row(types[k], q, y, N);
        double fast = rel_rms_error(y, x, N);
        sil_quantize_row_ref(types[k], x, q, N);
        sil_dequantize_row(types[k], q, y, N);
        double ref = rel_rms_error(y, x, N);
        if (!(fast < 1.6 * ref && fast < (k ? 0.03 : 0.12)))
            fail_msg("%s: fast error %g, reference %g", sil_type_name(types[k]), fast, ref);
    }
    assert_false(sil_mk_fast_quantize_row(SIL_TYPE_Q8_0, x, q, N));
    assert_false(sil_mk_fast_quantize_row(SIL_TYPE_Q4_K, x, q, 100));
    /* all zeros and a constant row quantize without NaNs */
    memset(x, 0, sizeof(x));
    x[5] = -1;
    for (int k = 0; k < 2; k++) {
        assert_true(sil_mk_fast_quantize_row(types[k], x, q, N));
        sil_dequantize_row(types[k], q, y, N);
        for (int i = 0; i < N; i++)
            assert_true(isfinite(y[i]) && fabsf(y[i] - x[i]) < 0.05f);
    }
}

static void test_synthetic_vocab(void **state)
{
    (void)state;
    struct sil_mk_vocab v = {0}, v2 = {0};
    struct sil_error err = {0};
    assert_int_equal(sil_mk_vocab_synthetic(&v, 4096, 9, &err), 0);
    assert_int_equal(v.n, 4096);
    assert_string_equal(v.tokens[0], "!");
    assert_string_equal(v.tokens[188], "\xc4\x80"); /* byte 0 -> U+0100 */
    assert_string_equal(v.tokens[220], "\xc4\xa0"); /* byte 0x20 -> U+0120 */
    assert_string_equal(v.tokens[4091], "<|endoftext|>");
    assert_string_equal(v.tokens[4093], "<|im_end|>");
    assert_string_equal(v.tokens[4095], "</think>");
    assert_int_equal(v.types[4092], 3);
    assert_int_equal(v.types[4094], 4);
    assert_int_equal(v.bos, 4091);
    assert_int_equal(v.eos, 4093);
    assert_true(v.n_merges >= 4091 - 256);
    /* every merge joins two tokens into a token; all tokens distinct */
    struct set st = {0};
    assert_int_equal(set_init(&st, v.n), 0);
    for (int64_t i = 0; i < v.n; i++) {
        assert_true(set_find(&st, v.tokens[i]) < 0);
        set_add(&st, v.tokens[i], i);
    }
    for (int64_t i = 0; i < v.n_merges; i++) {
        char a[256], *sp = strchr(v.merges[i], ' ');
        assert_non_null(sp);
        assert_true((size_t)(sp - v.merges[i]) < sizeof(a));
        memcpy(a, v.merges[i], (size_t)(sp - v.merges[i]));
        a[sp - v.merges[i]] = 0;
        char *ab = concat(a, sp + 1, 0);
        assert_true(set_find(&st, a) >= 0);
        assert_true(set_find(&st, sp + 1) >= 0);
        assert_true(set_find(&st, ab) >= 0);
        free(ab);
    }
    set_free(&st);
    /* learned from the built-in text first: " the" is a token */
    bool the = false;
    for (int64_t i = 256; i < 1024; i++)
        the |= strcmp(v.tokens[i], "\xc4\xa0the") == 0;
    assert_true(the);
    /* seeded: same seed same vocab, other seed other random merges */
    assert_int_equal(sil_mk_vocab_synthetic(&v2, 4096, 9, &err), 0);
    for (int64_t i = 0; i < v.n; i++)
        assert_string_equal(v.tokens[i], v2.tokens[i]);
    sil_mk_vocab_free(&v2);
    assert_int_equal(sil_mk_vocab_synthetic(&v2, 4096, 10, &err), 0);
    bool differ = false;
    for (int64_t i = 0; i < v.n; i++)
        differ |= strcmp(v.tokens[i], v2.tokens[i]) != 0;
    assert_true(differ);
    sil_mk_vocab_free(&v2);
    sil_mk_vocab_free(&v);
    assert_int_equal(sil_mk_vocab_synthetic(&v, 100, 1, &err), -EINVAL);
}

/* The tiny tokenizer.json imports to exactly the vocab the converter wrote into the refdata. */
static void test_vocab_from_hf(void **state)
{
    (void)state;
    if (!tu_refdata_exists("models/tiny-tokenizer.json") || !tu_refdata_exists("models/qwen3-tiny-Q8_0.gguf"))
        tu_skip_no_refdata();
    char *jp = tu_refdata_path("models/tiny-tokenizer.json"), *gp = tu_refdata_path("models/qwen3-tiny-Q8_0.gguf");
    struct sil_mk_vocab v = {0};
    struct sil_error err = {0};
    if (sil_mk_vocab_from_hf(&v, jp, 0, &err))
        fail_msg("%s", err.msg);
    struct sil_gguf *g = NULL;
    assert_int_equal(sil_gguf_open(&g, gp, &err), 0);
    enum sil_gguf_vtype et;
    uint64_t n;
    int64_t ti, yi, mi;
    assert_int_equal(sil_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &ti, &err), 0);
    assert_int_equal(n, v.n);
    assert_int_equal(sil_gguf_get_arr(g, "tokenizer.ggml.token_type", &et, &n, &yi, &err), 0);
    for (uint64_t i = 0; i < n; i++) {
        struct sil_str s = sil_gguf_arr_str(g, ti, i);
        assert_int_equal(s.len, strlen(v.tokens[i]));
        assert_memory_equal(s.ptr, v.tokens[i], s.len);
        int64_t ty;
        assert_int_equal(sil_gguf_arr_get_i64(g, yi, i, &ty), 0);
        assert_int_equal(ty, v.types[i]);
    }
    assert_int_equal(sil_gguf_get_arr(g, "tokenizer.ggml.merges", &et, &n, &mi, &err), 0);
    assert_int_equal(n, v.n_merges);
    for (uint64_t i = 0; i < n; i++) {
        struct sil_str s = sil_gguf_arr_str(g, mi, i);
        assert_int_equal(s.len, strlen(v.merges[i]));
        assert_memory_equal(s.ptr, v.merges[i], s.len);
    }
    assert_int_equal(v.bos, 507);
    assert_int_equal(v.eos, 509);
    sil_gguf_close(g);
    sil_mk_vocab_free(&v);
    /* padding with unused tokens */
    assert_int_equal(sil_mk_vocab_from_hf(&v, jp, 600, &err), 0);
    assert_int_equal(v.n, 600);
    assert_string_equal(v.tokens[599], "[PAD599]");
    assert_int_equal(v.types[599], 5);
    sil_mk_vocab_free(&v);
    char *np = tu_path_join(tmpdir, "nope.json");
    assert_int_equal(sil_mk_vocab_from_hf(&v, np, 0, &err), -ENOENT);
    const char *uni = "{\"model\": {\"type\": \"Unigram\"}}";
    assert_int_equal(tu_write_file(np, uni, strlen(uni)), 0);
    assert_int_equal(sil_mk_vocab_from_hf(&v, np, 0, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "BPE"));
    free(np);
    free(jp);
    free(gp);
}

static void test_json(void **state)
{
    (void)state;
    struct sil_json_doc *d = NULL;
    struct sil_error err = {0};
    const char *ok = " {\"a\": [1, -2.5e1, true, false, null], \"s\": \"x\\n\\u00e9\\ud83d\\ude00\\\"\", \"o\": {}} ";
    assert_int_equal(sil_json_parse(&d, ok, strlen(ok), "t", &err), 0);
    const struct sil_json *a = sil_json_get(sil_json_root(d), "a"), *s = sil_json_get(sil_json_root(d), "s");
    assert_non_null(a);
    assert_int_equal(a->n_children, 5);
    assert_float_equal(a->child->next->num, -25.0, 0);
    assert_int_equal(a->child->next->next->b, true);
    assert_int_equal(a->child->next->next->next->next->type, SIL_JSON_NULL);
    assert_string_equal(s->str, "x\n\xc3\xa9\xf0\x9f\x98\x80\"");
    assert_int_equal(sil_json_get(sil_json_root(d), "o")->type, SIL_JSON_OBJ);
    assert_null(sil_json_get(sil_json_root(d), "missing"));
    sil_json_free(d);
    const char *bad[] = {"", "{", "[1,]", "{\"a\" 1}", "\"abc", "\"\\x\"", "[1] 2", "\"\\ud800\"",
                         "tru", "{\"a\":1,}", "\"a\tb\""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        d = NULL;
        if (sil_json_parse(&d, bad[i], strlen(bad[i]), "t", &err) != -EINVAL)
            fail_msg("accepted bad JSON '%s'", bad[i]);
        assert_null(d);
    }
    char deep[300];
    memset(deep, '[', sizeof(deep));
    assert_int_equal(sil_json_parse(&d, deep, sizeof(deep), "t", &err), -EINVAL);
    assert_non_null(strstr(err.msg, "deep"));
}

/* Routing histogram at layer 0 over all token embeddings (attention's contribution left out):
 * router input h = RMSNorm(embedding) * post_attention_norm, top-k of router . h. */
static void routing_histogram(const struct sil_mk_model *m, int layer, int64_t *count_by_rank)
{
    const int64_t d = m->hp.n_embd, ne = m->hp.n_expert, k = m->hp.n_expert_used;
    const struct sil_mk_tensor *router = NULL, *norm = NULL, *embd = &m->tensors[0];
    char rn[64], nn[64];
    snprintf(rn, sizeof(rn), "blk.%d.ffn_gate_inp.weight", layer);
    snprintf(nn, sizeof(nn), "blk.%d.post_attention_norm.weight", layer);
    for (int64_t i = 0; i < m->n_tensors; i++) {
        if (strcmp(m->tensors[i].name, rn) == 0)
            router = &m->tensors[i];
        if (strcmp(m->tensors[i].name, nn) == 0)
            norm = &m->tensors[i];
    }
    assert_non_null(router);
    assert_non_null(norm);
    float *w = malloc(sizeof(float) * (size_t)(d * ne)), *g = malloc(sizeof(float) * (size_t)d);
    float *x = malloc(sizeof(float) * (size_t)d), *logit = malloc(sizeof(float) * (size_t)ne);
    for (int64_t e = 0; e < ne; e++)
        sil_mk_gen_row(m, router, e, w + e * d);
    sil_mk_gen_row(m, norm, 0, g);
    memset(count_by_rank, 0, sizeof(int64_t) * (size_t)ne);
    for (int64_t t = 0; t < m->hp.n_vocab; t++) {
        sil_mk_gen_row(m, embd, t, x);
        double ss = 0;
        for (int64_t i = 0; i < d; i++)
            ss += (double)x[i] * x[i];
        float inv = (float)(1.0 / sqrt(ss / (double)d + 1e-6));
        for (int64_t i = 0; i < d; i++)
            x[i] *= inv * g[i];
        for (int64_t e = 0; e < ne; e++) {
            double acc = 0;
            for (int64_t i = 0; i < d; i++)
                acc += (double)w[e * d + i] * x[i];
            logit[e] = (float)acc;
        }
        for (int64_t j = 0; j < k; j++) {
            int64_t best = 0;
            for (int64_t e = 1; e < ne; e++)
                if (logit[e] > logit[best])
                    best = e;
            count_by_rank[expert_rank(m, layer, best)]++;
            logit[best] = -INFINITY;
        }
    }
    free(w);
    free(g);
    free(x);
    free(logit);
}

static void test_skew(void **state)
{
    (void)state;
    struct sil_mk_model m;
    int64_t flat[32], skew[32];
    make_model(&m, "demo", 0, SIL_MK_Q4_K_M, 1); /* 32 experts top-4, 4096 tokens */
    routing_histogram(&m, 0, flat);
    m.skew = 1.2f;
    routing_histogram(&m, 0, skew);
    int64_t total = m.hp.n_vocab * m.hp.n_expert_used, fmax = 0, fmin = total;
    for (int e = 0; e < 32; e++) {
        fmax = flat[e] > fmax ? flat[e] : fmax;
        fmin = flat[e] < fmin ? flat[e] : fmin;
    }
    print_message("routing, layer 0, 4096 tokens x top-4 of 32 experts, by popularity rank:\n  skew 0:  ");
    for (int e = 0; e < 32; e++)
        print_message("%lld ", (long long)flat[e]);
    print_message("\n  skew 1.2: ");
    for (int e = 0; e < 32; e++)
        print_message("%lld ", (long long)skew[e]);
    print_message("\n");
    /* without skew every expert gets a share near 1/32 */
    assert_true(fmax < 3 * total / 32 && fmin > total / 32 / 3);
    /* with skew the most popular expert takes several times its uniform share, the top 4 more
     * than a third, and the counts fall with the rank */
    assert_true(skew[0] > 4 * total / 32);
    assert_true(skew[0] + skew[1] + skew[2] + skew[3] > total / 3);
    assert_true(skew[0] > skew[3] && skew[3] > skew[15] && skew[15] >= skew[31]);
    /* the layers have different popular experts */
    int64_t r0 = -1, r1 = -1;
    for (int64_t e = 0; e < 32; e++) {
        if (expert_rank(&m, 0, e) == 0)
            r0 = e;
        if (expert_rank(&m, 1, e) == 0)
            r1 = e;
    }
    assert_true(r0 >= 0 && r1 >= 0 && r0 != r1);
    sil_mk_model_free(&m);
}

/* Same seed, same bytes, whatever the thread count; another seed, other weights. */
static void test_deterministic(void **state)
{
    (void)state;
    struct sil_mk_model m;
    struct sil_error err = {0};
    void *a, *b;
    size_t la, lb;
    char *pa = tu_path_join(tmpdir, "a.gguf"), *pb = tu_path_join(tmpdir, "b.gguf");
    make_model(&m, "tiny", 0, SIL_MK_Q4_K_M, 11);
    assert_int_equal(sil_mk_write(&m, pa, 1, false, &err), 0);
    assert_int_equal(sil_mk_write(&m, pb, 2, false, &err), 0);
    assert_int_equal(tu_read_file(pa, &a, &la), 0);
    assert_int_equal(tu_read_file(pb, &b, &lb), 0);
    assert_int_equal(la, lb);
    assert_memory_equal(a, b, la);
    free(b);
    sil_mk_model_free(&m);
    make_model(&m, "tiny", 0, SIL_MK_Q4_K_M, 12);
    assert_int_equal(sil_mk_write(&m, pb, 2, false, &err), 0);
    struct sil_gguf *ga = NULL, *gb = NULL;
    assert_int_equal(sil_gguf_open(&ga, pa, &err), 0);
    assert_int_equal(sil_gguf_open(&gb, pb, &err), 0);
    const struct sil_gguf_tensor *ta = sil_gguf_find_tensor(ga, "blk.3.ffn_up_exps.weight");
    const struct sil_gguf_tensor *tb = sil_gguf_find_tensor(gb, "blk.3.ffn_up_exps.weight");
    assert_int_equal(ta->nbytes, tb->nbytes);
    assert_memory_not_equal(ta->data, tb->data, ta->nbytes);
    sil_gguf_close(ga);
    sil_gguf_close(gb);
    free(a);
    sil_mk_model_free(&m);
    /* an unwritable path leaves nothing behind */
    char *bad = tu_path_join(tmpdir, "no/such/dir.gguf");
    make_model(&m, "tiny", 0, SIL_MK_F16, 1);
    assert_int_equal(sil_mk_write(&m, bad, 2, false, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "no/such/dir.gguf.tmp"));
    sil_mk_model_free(&m);
    free(bad);
    free(pa);
    free(pb);
}

static void test_hparams_checks(void **state)
{
    (void)state;
    struct sil_mk_hparams hp;
    struct sil_error err = {0};
    assert_int_equal(sil_mk_preset("nope", &hp), -ENOENT);
    for (int a = 0; a < SIL_MK_ARCH_COUNT; a++) {
        sil_mk_arch_defaults(a, &hp);
        assert_int_equal(sil_mk_check_hparams(&hp, &err), 0);
    }
    const char *presets_ok[] = {"qwen35-35b-a3b", "qwen35-0.8b", "bench", "demo", "tiny"};
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(sil_mk_preset(presets_ok[i], &hp), 0);
        assert_int_equal(sil_mk_check_hparams(&hp, &err), 0);
    }
    sil_mk_preset("tiny", &hp);
    hp.n_head = 5;
    assert_int_equal(sil_mk_check_hparams(&hp, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "--heads"));
    sil_mk_preset("tiny", &hp);
    hp.n_expert_used = 17;
    assert_int_equal(sil_mk_check_hparams(&hp, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "--experts-used"));
    sil_mk_preset("tiny", &hp);
    hp.ssm_dt_rank = 6;
    assert_int_equal(sil_mk_check_hparams(&hp, &err), -EINVAL);
    sil_mk_preset("tiny", &hp);
    hp.rope_partial = 0.01f;
    assert_int_equal(sil_mk_check_hparams(&hp, &err), -EINVAL);
    /* the 0.8B preset: dense, tied, 6 full-attention layers */
    struct sil_mk_model m = {0};
    assert_int_equal(sil_mk_preset("qwen35-0.8b", &m.hp), 0);
    assert_int_equal(sil_mk_build_tensors(&m, &err), 0);
    int attn = 0, out = 0;
    for (int64_t i = 0; i < m.n_tensors; i++) {
        attn += strcmp(m.tensors[i].cls, "attn_q") == 0;
        out += strcmp(m.tensors[i].name, "output.weight") == 0;
    }
    assert_int_equal(attn, 6);
    assert_int_equal(out, 0);
    sil_mk_model_free(&m);
}

/* Our tokenizer loads a synthetic vocab and splits text exactly as llama.cpp does: the ids below
 * are llama-tokenize's (parse_special) on the file this test writes (tiny, --vocab 4096, seed 1). */
static void test_tokenizer_agrees(void **state)
{
    (void)state;
    static const int32_t want[] = {4092, 84, 82, 263, 198, 39, 68, 75, 358, 11, 220, 355, 86, 301, 306,
                                   30, 341, 320, 1790, 77, 82, 371, 260, 268, 323, 71, 302, 13, 4093,
                                   198, 4094, 198, 303, 336, 321, 220, 90, 318, 220, 15, 26, 220, 92};
    const char *text = "<|im_start|>user\nHello, how are you? The model runs on the machine.<|im_end|>\n"
                       "<think>\nint main() { return 0; }";
    struct sil_mk_model m;
    struct sil_error err = {0};
    memset(&m, 0, sizeof(m));
    assert_int_equal(sil_mk_preset("tiny", &m.hp), 0);
    m.seed = 1;
    m.recipe = SIL_MK_F16;
    assert_int_equal(sil_mk_vocab_synthetic(&m.vocab, 4096, 1, &err), 0);
    m.hp.n_vocab = m.vocab.n;
    assert_int_equal(sil_mk_build_tensors(&m, &err), 0);
    assert_int_equal(sil_mk_assign_types(&m, NULL, 0, &err), 0);
    struct sil_gguf *g = write_and_open(&m, "tok.gguf", 2);
    struct sil_vocab *v = NULL;
    if (sil_vocab_load(&v, g, &err))
        fail_msg("vocab load: %s", err.msg);
    assert_int_equal(sil_vocab_n_tokens(v), 4096);
    assert_int_equal(sil_vocab_im_start(v), 4092);
    assert_int_equal(sil_vocab_think_close(v), 4095);
    int32_t *ids = NULL;
    size_t n = 0;
    if (sil_tokenize(v, text, strlen(text), false, true, &ids, &n, &err))
        fail_msg("tokenize: %s", err.msg);
    assert_int_equal(n, sizeof(want) / sizeof(want[0]));
    assert_memory_equal(ids, want, sizeof(want));
    free(ids);
    sil_vocab_free(v);
    sil_gguf_close(g);
    sil_mk_model_free(&m);
}

/* The binary: exit codes and a file the reader accepts. */
static int run_cli(const char *args, char *out, size_t outsz)
{
    const char *b = getenv("SIL_BUILD");
    char cmd[2048];
    snprintf(cmd, sizeof(cmd), "%s/bin/sil-mkmodel %s 2>&1", b ? b : "build", args);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t n = fread(out, 1, outsz - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static void test_cli(void **state)
{
    (void)state;
    const char *b = getenv("SIL_BUILD");
    char bin[1024], out[8192], args[1024];
    snprintf(bin, sizeof(bin), "%s/bin/sil-mkmodel", b ? b : "build");
    FILE *f = fopen(bin, "r");
    if (!f)
        skip();
    fclose(f);
    assert_int_equal(run_cli("--help", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "--skew"));
    assert_non_null(strstr(out, "qwen35-35b-a3b"));
    assert_int_equal(run_cli("--preset nope --out x", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "unknown preset"));
    assert_int_equal(run_cli("--version", out, sizeof(out)), 0);
    assert_non_null(strstr(out, "sil-mkmodel " SIL_VERSION));
    assert_int_equal(run_cli("--layers abc --out x", out, sizeof(out)), 2);
    assert_non_null(strstr(out, "--layers: 'abc' is not an integer"));
    assert_int_equal(run_cli("--type q3_x --out x", out, sizeof(out)), 2);
    assert_int_equal(run_cli("--preset tiny", out, sizeof(out)), 2);
    assert_int_equal(run_cli("--preset tiny --heads 3 --dry-run", out, sizeof(out)), 1);
    assert_non_null(strstr(out, "--heads"));
    snprintf(args, sizeof(args), "--arch qwen3moe --layers 2 --experts 8 --experts-used 2 --vocab 300 "
             "--type q8_0 --type-override ffn_down_exps=f16 --skew 1 --seed 3 --quiet --out %s/cli.gguf", tmpdir);
    assert_int_equal(run_cli(args, out, sizeof(out)), 0);
    char *p = tu_path_join(tmpdir, "cli.gguf");
    struct sil_gguf *g = NULL;
    struct sil_error err = {0};
    assert_int_equal(sil_gguf_open(&g, p, &err), 0);
    uint32_t u;
    assert_int_equal(sil_gguf_get_u32(g, "qwen3moe.expert_count", &u, &err), 0);
    assert_int_equal(u, 8);
    assert_int_equal(sil_gguf_find_tensor(g, "blk.1.ffn_down_exps.weight")->type, SIL_TYPE_F16);
    assert_int_equal(sil_gguf_find_tensor(g, "blk.1.ffn_up_exps.weight")->type, SIL_TYPE_Q8_0);
    /* 8 experts: attn_v and attn_k go to q8_0 as the quantizer does for 8-expert models */
    assert_int_equal(sil_gguf_find_tensor(g, "blk.0.attn_k.weight")->type, SIL_TYPE_Q8_0);
    enum sil_gguf_vtype et;
    uint64_t n;
    int64_t idx;
    assert_int_equal(sil_gguf_get_arr(g, "tokenizer.ggml.tokens", &et, &n, &idx, &err), 0);
    assert_int_equal(n, 300);
    sil_gguf_close(g);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_f32),
        cmocka_unit_test(test_roundtrip_quantized),
        cmocka_unit_test(test_threads_same_bytes),
        cmocka_unit_test(test_exact_quant_roundtrip),
        cmocka_unit_test(test_refdata_qwen35moe),
        cmocka_unit_test(test_refdata_other_archs),
        cmocka_unit_test(test_recipe_35b),
        cmocka_unit_test(test_type_overrides),
        cmocka_unit_test(test_fast_quant),
        cmocka_unit_test(test_synthetic_vocab),
        cmocka_unit_test(test_vocab_from_hf),
        cmocka_unit_test(test_json),
        cmocka_unit_test(test_skew),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_hparams_checks),
        cmocka_unit_test(test_tokenizer_agrees),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
