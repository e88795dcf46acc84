/* Quantized formats: table, fp16/bf16 conversions, quantize->dequantize error bounds, dot
 * products against the dequantized math, every SIMD level against scalar, and the refdata
 * quantized models against the unquantized one. */
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

/* ---- random data ------------------------------------------------------------------------------ */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static void rng_seed(uint64_t s)
{
    rng_state = s * 0x9E3779B97F4A7C15ull + 1;
}

static uint64_t rng_u64(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

static float rng_uniform(void) /* [0, 1) */
{
    return (float)(rng_u64() >> 40) / 16777216.0f;
}

static float rng_normal(void)
{
    float u = rng_uniform(), v = rng_uniform();
    if (u < 1e-7f)
        u = 1e-7f;
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* Gaussian data with a few outliers and the odd all-zero or constant block, the shapes that
 * trip scale searches. */
static void fill_weights(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = 0.05f * rng_normal();
    for (int64_t i = 0; i < n / 97; i++)
        x[rng_u64() % n] *= 8.0f;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static const int weight_types[] = {SIL_TYPE_F32,  SIL_TYPE_F16,  SIL_TYPE_BF16, SIL_TYPE_Q8_0,
                                   SIL_TYPE_Q4_0, SIL_TYPE_Q4_1, SIL_TYPE_Q5_0, SIL_TYPE_Q5_1,
                                   SIL_TYPE_Q4_K, SIL_TYPE_Q5_K, SIL_TYPE_Q6_K};
#define N_WEIGHT_TYPES (sizeof(weight_types) / sizeof(weight_types[0]))

/* ---- table ------------------------------------------------------------------------------------ */

static void test_table(void **state)
{
    (void)state;
    static const struct {
        int type;
        const char *name;
        int64_t bs;
        size_t ts;
        bool supported;
    } want[] = {
        {SIL_TYPE_F32, "f32", 1, 4, true},        {SIL_TYPE_F16, "f16", 1, 2, true},
        {SIL_TYPE_BF16, "bf16", 1, 2, true},      {SIL_TYPE_Q4_0, "q4_0", 32, 18, true},
        {SIL_TYPE_Q4_1, "q4_1", 32, 20, true},    {SIL_TYPE_Q5_0, "q5_0", 32, 22, true},
        {SIL_TYPE_Q5_1, "q5_1", 32, 24, true},    {SIL_TYPE_Q8_0, "q8_0", 32, 34, true},
        {SIL_TYPE_Q8_1, "q8_1", 32, 36, true},    {SIL_TYPE_Q2_K, "q2_K", 256, 84, false},
        {SIL_TYPE_Q3_K, "q3_K", 256, 110, false}, {SIL_TYPE_Q4_K, "q4_K", 256, 144, true},
        {SIL_TYPE_Q5_K, "q5_K", 256, 176, true},  {SIL_TYPE_Q6_K, "q6_K", 256, 210, true},
        {SIL_TYPE_Q8_K, "q8_K", 256, 292, true},
    };
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        const struct sil_type_traits *t = sil_type_traits(want[i].type);
        assert_non_null(t);
        assert_string_equal(t->name, want[i].name);
        assert_string_equal(sil_type_name(want[i].type), want[i].name);
        assert_int_equal(t->block_size, want[i].bs);
        assert_int_equal(t->type_size, want[i].ts);
        assert_true(t->known);
        assert_int_equal(t->supported, want[i].supported);
        assert_int_equal(sil_type_from_name(want[i].name), want[i].type);
        assert_int_equal(sil_row_size(want[i].type, 4096), 4096 / want[i].bs * want[i].ts);
        if (want[i].bs > 1)
            assert_int_equal(sil_row_size(want[i].type, want[i].bs + 1), 0);
        if (t->supported) {
            assert_non_null(t->to_float);
            assert_non_null(t->from_float_ref);
            assert_non_null(t->from_float);
        }
    }
    assert_int_equal(sil_type_from_name("Q4_K"), SIL_TYPE_Q4_K);
    assert_int_equal(sil_type_from_name("F16"), SIL_TYPE_F16);
    assert_int_equal(sil_type_from_name("q4_k_m"), -1);
    assert_int_equal(sil_type_from_name(""), -1);
    assert_int_equal(sil_type_from_name(NULL), -1);
    assert_null(sil_type_traits(4)); /* Q4_2, removed from GGUF */
    assert_null(sil_type_traits(-1));
    assert_null(sil_type_traits(SIL_TYPE_COUNT));
    assert_string_equal(sil_type_name(99), "type 99");
    assert_int_equal(sil_row_size(99, 256), 0);
    assert_int_equal(sil_row_size(SIL_TYPE_Q4_K, -256), 0);
    assert_int_equal(sil_row_size(SIL_TYPE_Q4_K, 0), 0);
    /* the activation formats the contract promises */
    assert_int_equal(sil_type_traits(SIL_TYPE_Q4_K)->vec_dot_type, SIL_TYPE_Q8_K);
    assert_int_equal(sil_type_traits(SIL_TYPE_Q6_K)->vec_dot_type, SIL_TYPE_Q8_K);
    assert_int_equal(sil_type_traits(SIL_TYPE_Q5_1)->vec_dot_type, SIL_TYPE_Q8_0);
    assert_int_equal(sil_type_traits(SIL_TYPE_Q4_0)->vec_dot_type, SIL_TYPE_Q8_0);
    assert_int_equal(sil_type_traits(SIL_TYPE_F16)->vec_dot_type, SIL_TYPE_F32);
    assert_int_equal(sil_type_traits(SIL_TYPE_BF16)->vec_dot_type, SIL_TYPE_F32);
}

/* ---- fp16 / bf16 ------------------------------------------------------------------------------ */

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Independent reference: exact value of a half from its fields in double arithmetic. */
static double half_value(uint16_t h)
{
    int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : ldexp(1024 + m, e - 25);
    return (h & 0x8000) ? -v : v;
}

static void test_fp16_exact(void **state)
{
    (void)state;
    /* every half widens exactly and narrows back to itself */
    for (uint32_t h = 0; h < 65536; h++) {
        const int e = (h >> 10) & 31;
        const float f = sil_fp16_to_fp32((uint16_t)h);
        if (e == 31) {
            if (h & 1023)
                assert_true(isnan(f));
            else
                assert_true(isinf(f));
            if (!(h & 1023))
                assert_int_equal(sil_fp32_to_fp16(f), h);
            continue;
        }
        assert_true((double)f == half_value((uint16_t)h));
        assert_int_equal(sil_fp32_to_fp16(f), h);
    }
    /* narrowing rounds to nearest, ties to even: check the midpoints between neighbours and
     * points just beside them, for every positive finite half */
    for (uint32_t h = 0; h < 0x7bff; h++) {
        const double lo = half_value((uint16_t)h), hi = half_value((uint16_t)(h + 1));
        const float mid = (float)((lo + hi) / 2); /* exact: halves have 11 significant bits */
        const uint16_t even = (h & 1) ? (uint16_t)(h + 1) : (uint16_t)h;
        assert_int_equal(sil_fp32_to_fp16(mid), even);
        assert_int_equal(sil_fp32_to_fp16(-mid), even | 0x8000);
        assert_int_equal(sil_fp32_to_fp16(bitsf(fbits(mid) - 1)), h);
        assert_int_equal(sil_fp32_to_fp16(bitsf(fbits(mid) + 1)), h + 1);
    }
    assert_int_equal(sil_fp32_to_fp16(65504.0f), 0x7bff);
    assert_int_equal(sil_fp32_to_fp16(65519.99f), 0x7bff);
    assert_int_equal(sil_fp32_to_fp16(65520.0f), 0x7c00);
    assert_int_equal(sil_fp32_to_fp16(1e30f), 0x7c00);
    assert_int_equal(sil_fp32_to_fp16(-INFINITY), 0xfc00);
    assert_int_equal(sil_fp32_to_fp16(1e-30f), 0);
    assert_int_equal(sil_fp32_to_fp16(-0.0f), 0x8000);
    assert_int_equal(sil_fp32_to_fp16(0x1p-25f), 0);          /* tie with 0 -> even (0) */
    assert_int_equal(sil_fp32_to_fp16(0x1.000002p-25f), 1);   /* just above the tie */
    assert_int_equal(sil_fp32_to_fp16(0x1.8p-24f), 2);        /* tie 1.5 ulp -> 2 */
    assert_true(isnan(sil_fp16_to_fp32(sil_fp32_to_fp16(NAN))));
}

static void test_bf16_exact(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = sil_bf16_to_fp32((uint16_t)h);
        assert_int_equal(fbits(f), h << 16);
        if (!isnan(f))
            assert_int_equal(sil_fp32_to_bf16(f), h);
    }
    rng_seed(7);
    for (int i = 0; i < 200000; i++) {
        const uint32_t u = (uint32_t)rng_u64();
        const float f = bitsf(u);
        if (isnan(f)) {
            assert_true(isnan(sil_bf16_to_fp32(sil_fp32_to_bf16(f))));
            continue;
        }
        /* nearest of the two neighbours, ties to even, by exact double arithmetic */
        const uint16_t dn = (uint16_t)(u >> 16), up = (uint16_t)(dn + 1);
        /* past the largest finite bf16 the next step up is the infinity, worth 2^128 here */
        const double upv = (up & 0x7f80) == 0x7f80 ? copysign(0x1p128, f) : sil_bf16_to_fp32(up);
        const double dd = fabs((double)f - sil_bf16_to_fp32(dn));
        const double du = fabs(upv - f);
        const uint16_t want = (u & 0xffff) == 0 ? dn : dd < du ? dn : du < dd ? up : (dn & 1) ? up : dn;
        assert_int_equal(sil_fp32_to_bf16(f), want);
    }
}

/* ---- quantize -> dequantize error ------------------------------------------------------------- */

/* Largest magnitude, min and max of x[0..n). */
static void stats(const float *x, int64_t n, float *amax, float *mn, float *mx)
{
    *amax = 0;
    *mn = x[0];
    *mx = x[0];
    for (int64_t i = 0; i < n; i++) {
        if (fabsf(x[i]) > *amax)
            *amax = fabsf(x[i]);
        if (x[i] < *mn)
            *mn = x[i];
        if (x[i] > *mx)
            *mx = x[i];
    }
}

/* Per-element bound of the legacy formats, derived from the format: half a step, plus the
 * rounding of the fp16 scale over the full range (2^-11 relative), plus, for the symmetric
 * formats, one whole step at the end that has one level less. */
static float legacy_bound(int type, const float *blk)
{
    float amax, mn, mx;
    stats(blk, 32, &amax, &mn, &mx);
    const float ulp = 1.0f / 1024;
    switch (type) {
    case SIL_TYPE_Q8_0:
        return amax * (0.5f / 127 + ulp) * 1.001f + 1e-30f;
    case SIL_TYPE_Q4_0:
        return amax * (1.0f / 8 + ulp) * 1.001f + 1e-30f;
    case SIL_TYPE_Q5_0:
        return amax * (1.0f / 16 + ulp) * 1.001f + 1e-30f;
    case SIL_TYPE_Q4_1:
        return ((mx - mn) * (0.5f / 15 + ulp) + fabsf(mn) * ulp) * 1.001f + 1e-30f;
    case SIL_TYPE_Q5_1:
        return ((mx - mn) * (0.5f / 31 + ulp) + fabsf(mn) * ulp) * 1.001f + 1e-30f;
    }
    return 0;
}

/* k-quants: relative RMS error rms(x - dq(x)) / rms(x) on the test data (Gaussian with 1% of
 * 8x outliers); measured with this quantizer 0.091 (q4_K), 0.045 (q5_K), 0.025 (q6_K), for
 * comparison q4_1 0.097, q5_1 0.047, q8_0 0.0085 -- bounds are about 1.2x those. And a
 * per-element bound against the super-block's largest magnitude: one step of the coarsest
 * sub-block scale (amax*2/nmax) covers rounding and the 6-bit min. */
static double kquant_rms_bound(int type)
{
    return type == SIL_TYPE_Q4_K ? 0.11 : type == SIL_TYPE_Q5_K ? 0.055 : 0.031;
}

static void test_roundtrip(void **state)
{
    (void)state;
    const int64_t n = 256 * 64;
    float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float));
    void *q = xmalloc(sil_row_size(SIL_TYPE_F32, n));
    rng_seed(11);
    fill_weights(x, n);
    for (int64_t i = 0; i < 256; i++) /* one all-zero super-block, one constant */
        x[256 + i] = 0, x[512 + i] = 0.01f;
    for (size_t k = 0; k < N_WEIGHT_TYPES; k++) {
        const int type = weight_types[k];
        const struct sil_type_traits *t = sil_type_traits(type);
        memset(q, 0xAB, sil_row_size(type, n));
        t->from_float_ref(x, q, n);
        t->to_float(q, y, n);
        double se = 0, sx = 0;
        for (int64_t i = 0; i < n; i++) {
            se += (double)(x[i] - y[i]) * (x[i] - y[i]);
            sx += (double)x[i] * x[i];
        }
        const double rel_rms = sqrt(se / sx);
        print_message("  %-5s relative rms error %.5f\n", t->name, rel_rms);
        if (type == SIL_TYPE_F32) {
            assert_memory_equal(x, y, n * sizeof(float));
        } else if (type == SIL_TYPE_F16 || type == SIL_TYPE_BF16) {
            for (int64_t i = 0; i < n; i++) {
                const float tol = fabsf(x[i]) * (type == SIL_TYPE_F16 ? 1.0f / 2048 : 1.0f / 256);
                if (fabsf(x[i] - y[i]) > tol + 6e-8f)
                    fail_msg("%s element %lld: %g -> %g", t->name, (long long)i, x[i], y[i]);
            }
        } else if (t->block_size == 32) {
            for (int64_t i = 0; i < n; i++) {
                const float b = legacy_bound(type, x + i / 32 * 32);
                if (!(fabsf(x[i] - y[i]) <= b))
                    fail_msg("%s element %lld: %g -> %g, bound %g", t->name, (long long)i, x[i],
                             y[i], b);
            }
        } else {
            assert_true(rel_rms < kquant_rms_bound(type));
            const int nmax = type == SIL_TYPE_Q4_K ? 15 : type == SIL_TYPE_Q5_K ? 31 : 32;
            for (int64_t i = 0; i < n; i++) {
                float amax, mn, mx;
                stats(x + i / 256 * 256, 256, &amax, &mn, &mx);
                if (!(fabsf(x[i] - y[i]) <= 2 * amax / nmax + 1e-30f))
                    fail_msg("%s element %lld: %g -> %g (amax %g)", t->name, (long long)i, x[i],
                             y[i], amax);
            }
            for (int64_t i = 256; i < 512; i++) /* zero block stays exactly zero */
                assert_true(y[i] == 0);
        }
        /* the reference quantizer is deterministic */
        void *q2 = xmalloc(sil_row_size(type, n));
        t->from_float_ref(x, q2, n);
        assert_memory_equal(q, q2, sil_row_size(type, n));
        free(q2);
    }
    free(x);
    free(y);
    free(q);
}

/* Activation formats: q8_0 within half a step (+fp16 scale rounding), q8_K within half a step
 * (float scale), bsums are the sums of 16. */
static void test_activation_quant(void **state)
{
    (void)state;
    const int64_t n = 4096;
    float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float));
    void *q = xmalloc(sil_row_size(SIL_TYPE_Q8_K, n) + sil_row_size(SIL_TYPE_Q8_0, n));
    rng_seed(12);
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_normal() * (1 + (i / 256) % 3);
    const struct sil_type_traits *t = sil_type_traits(SIL_TYPE_Q8_K);
    t->from_float_ref(x, q, n);
    t->to_float(q, y, n);
    for (int64_t i = 0; i < n; i++) {
        float amax, mn, mx;
        stats(x + i / 256 * 256, 256, &amax, &mn, &mx);
        assert_true(fabsf(x[i] - y[i]) <= amax * 0.5f / 127 * 1.001f);
    }
    const uint8_t *blk = q;
    for (int64_t b = 0; b < n / 256; b++, blk += 292) {
        const int8_t *qs = (const int8_t *)(blk + 4);
        for (int j = 0; j < 16; j++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += qs[16 * j + l];
            int16_t bs;
            memcpy(&bs, blk + 4 + 256 + 2 * j, 2);
            assert_int_equal(bs, s);
        }
    }
    t = sil_type_traits(SIL_TYPE_Q8_0);
    t->from_float_ref(x, q, n);
    t->to_float(q, y, n);
    for (int64_t i = 0; i < n; i++)
        assert_true(fabsf(x[i] - y[i]) <= legacy_bound(SIL_TYPE_Q8_0, x + i / 32 * 32));
    free(x);
    free(y);
    free(q);
}

/* ---- dot products ----------------------------------------------------------------------------- */

struct dot_case {
    int type;
    int64_t n;
    void *w, *a;
    float *wf, *af; /* dequantized weights and activations */
    double ref, mag; /* sum wf*af in double, sum |wf*af| */
};

static void dot_case_make(struct dot_case *c, int type, int64_t n, uint64_t seed)
{
    const struct sil_type_traits *t = sil_type_traits(type);
    const struct sil_type_traits *ta = sil_type_traits(t->vec_dot_type);
    float *x = xmalloc(n * sizeof(float));
    c->type = type;
    c->n = n;
    c->w = xmalloc(sil_row_size(type, n));
    c->a = xmalloc(sil_row_size(t->vec_dot_type, n));
    c->wf = xmalloc(n * sizeof(float));
    c->af = xmalloc(n * sizeof(float));
    rng_seed(seed);
    fill_weights(x, n);
    t->from_float_ref(x, c->w, n);
    t->to_float(c->w, c->wf, n);
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_normal();
    ta->from_float_ref(x, c->a, n);
    ta->to_float(c->a, c->af, n);
    c->ref = c->mag = 0;
    for (int64_t i = 0; i < n; i++) {
        c->ref += (double)c->wf[i] * c->af[i];
        c->mag += fabs((double)c->wf[i] * c->af[i]);
    }
    free(x);
}

static void dot_case_free(struct dot_case *c)
{
    free(c->w);
    free(c->a);
    free(c->wf);
    free(c->af);
}

static const int64_t dot_lengths[] = {256, 512, 768, 2048, 4096 + 256};

/* Scalar vec_dot = dot(dequant(w), dequant(a)) up to float rounding (1e-5 of sum |w*a|;
 * the k-quants split the sum into scale and min parts, each bounded by a few sum |w*a|). */
static void test_vec_dot_matches_dequant(void **state)
{
    (void)state;
    sil_cpu_force_level(SIL_CPU_SCALAR);
    for (size_t k = 0; k < N_WEIGHT_TYPES; k++) {
        for (size_t l = 0; l < sizeof(dot_lengths) / sizeof(dot_lengths[0]); l++) {
            struct dot_case c;
            dot_case_make(&c, weight_types[k], dot_lengths[l], 100 + k * 10 + l);
            const float got = sil_type_traits(c.type)->vec_dot(c.n, c.w, c.a);
            if (!(fabs(got - c.ref) <= 1e-5 * c.mag))
                fail_msg("%s n=%lld: vec_dot %.9g, dequantized dot %.9g (sum|wa| %g)",
                         sil_type_name(c.type), (long long)c.n, got, c.ref, c.mag);
            dot_case_free(&c);
        }
    }
    sil_cpu_force_level(SIL_CPU_AVX512_VNNI);
}

/* Every SIMD level available here against scalar: integer sums are exact, so the only
 * difference is the order of float accumulation (1e-5 of sum |w*a|). Also sil_vec_dot_rows and
 * the fast activation quantizers (bit-identical to the reference). */
static void test_simd_vs_scalar(void **state)
{
    (void)state;
    assert_int_equal(sil_cpu_force_level(SIL_CPU_SCALAR), SIL_CPU_SCALAR);
    assert_int_equal(sil_cpu_level(), SIL_CPU_SCALAR);
    const enum sil_cpu_level top = sil_cpu_force_level(SIL_CPU_AVX512_VNNI);
    assert_true(top <= sil_cpu_detected_level());
    assert_int_equal(sil_cpu_level(), top);
    assert_string_equal(sil_cpu_level_name(SIL_CPU_AVX2), "avx2");
    print_message("  detected %s, in force %s\n", sil_cpu_level_name(sil_cpu_detected_level()),
                  sil_cpu_level_name(top));
    for (size_t k = 0; k < N_WEIGHT_TYPES; k++) {
        for (size_t l = 0; l < sizeof(dot_lengths) / sizeof(dot_lengths[0]); l++) {
            struct dot_case c;
            dot_case_make(&c, weight_types[k], dot_lengths[l], 200 + k * 10 + l);
            sil_cpu_force_level(SIL_CPU_SCALAR);
            const float ref = sil_type_traits(c.type)->vec_dot(c.n, c.w, c.a);
            for (int lev = SIL_CPU_AVX2; lev <= (int)top; lev++) {
                if ((int)sil_cpu_force_level(lev) != lev)
                    continue;
                const float got = sil_type_traits(c.type)->vec_dot(c.n, c.w, c.a);
                if (!(fabs(got - ref) <= 1e-5 * c.mag))
                    fail_msg("%s n=%lld level %s: %.9g, scalar %.9g (sum|wa| %g)",
                             sil_type_name(c.type), (long long)c.n, sil_cpu_level_name(lev), got,
                             ref, c.mag);
                /* rows helper: 3 rows, the same row repeated */
                const size_t rs = sil_row_size(c.type, c.n);
                uint8_t *w3 = xmalloc(3 * rs);
                for (int r = 0; r < 3; r++)
                    memcpy(w3 + r * rs, c.w, rs);
                float out[3];
                sil_vec_dot_rows(c.type, c.n, w3, rs, 3, c.a, out);
                for (int r = 0; r < 3; r++)
                    assert_true(out[r] == got);
                free(w3);
            }
            dot_case_free(&c);
        }
    }
    /* fast activation quantizers equal the reference byte for byte, on odd inputs too */
    const int64_t n = 4096;
    float *x = xmalloc(n * sizeof(float));
    rng_seed(13);
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_normal() * (i % 7 == 0 ? 100.0f : 1.0f);
    for (int64_t i = 0; i < 256; i++) /* an all-zero block and a block of ties */
        x[i] = 0, x[256 + i] = (float)(i % 64) * 0.5f - 16.0f;
    for (int at = 0; at < 2; at++) {
        const int type = at ? SIL_TYPE_Q8_K : SIL_TYPE_Q8_0;
        const size_t sz = sil_row_size(type, n);
        uint8_t *r = xmalloc(sz), *f = xmalloc(sz);
        sil_quantize_row_ref(type, x, r, n);
        for (int lev = SIL_CPU_SCALAR; lev <= (int)top; lev++) {
            if ((int)sil_cpu_force_level(lev) != lev)
                continue;
            memset(f, 0x5A, sz);
            sil_type_traits(type)->from_float(x, f, n);
            if (memcmp(r, f, sz) != 0)
                fail_msg("%s fast quantizer at %s differs from the reference",
                         sil_type_name(type), sil_cpu_level_name(lev));
        }
        free(r);
        free(f);
    }
    free(x);
    sil_cpu_force_level(SIL_CPU_AVX512_VNNI);
}

/* SIMD tails: lengths that are not multiples of 256 (nor of the vector width), where the kernels
 * leave their unrolled loops for masked or scalar tails. The float types take any length; q8_0
 * and the other legacy formats any number of 32-element blocks, odd counts included (the
 * AVX-512 q8_0 dot runs two blocks per step). Each level against scalar, scalar against the
 * dequantized dot, sil_vec_dot_rows, and the fast q8_0 activation quantizer byte for byte. */
static void check_tail(int type, int64_t n, enum sil_cpu_level top, uint64_t seed)
{
    struct dot_case c;
    dot_case_make(&c, type, n, seed);
    sil_cpu_force_level(SIL_CPU_SCALAR);
    const float ref = sil_type_traits(type)->vec_dot(n, c.w, c.a);
    if (!(fabs(ref - c.ref) <= 1e-5 * c.mag))
        fail_msg("%s n=%lld scalar: %.9g, dequantized dot %.9g (sum|wa| %g)", sil_type_name(type),
                 (long long)n, ref, c.ref, c.mag);
    const size_t rs = sil_row_size(type, n);
    uint8_t *w2 = xmalloc(2 * rs);
    memcpy(w2, c.w, rs);
    memcpy(w2 + rs, c.w, rs);
    for (int lev = SIL_CPU_AVX2; lev <= (int)top; lev++) {
        if ((int)sil_cpu_force_level(lev) != lev)
            continue;
        const float got = sil_type_traits(type)->vec_dot(n, c.w, c.a);
        if (!(fabs(got - ref) <= 1e-5 * c.mag))
            fail_msg("%s n=%lld level %s: %.9g, scalar %.9g (sum|wa| %g)", sil_type_name(type),
                     (long long)n, sil_cpu_level_name(lev), got, ref, c.mag);
        float out[2];
        sil_vec_dot_rows(type, n, w2, rs, 2, c.a, out);
        assert_true(out[0] == got && out[1] == got);
    }
    free(w2);
    if (type == SIL_TYPE_Q8_0) {
        const size_t sz = sil_row_size(SIL_TYPE_Q8_0, n);
        float *x = xmalloc(n * sizeof(float));
        for (int64_t i = 0; i < n; i++)
            x[i] = rng_normal() * (i % 7 == 0 ? 100.0f : 1.0f);
        uint8_t *r = xmalloc(sz + 64), *f = xmalloc(sz + 64);
        memset(r + sz, 0xA5, 64);
        sil_quantize_row_ref(SIL_TYPE_Q8_0, x, r, n);
        for (int lev = SIL_CPU_SCALAR; lev <= (int)top; lev++) {
            if ((int)sil_cpu_force_level(lev) != lev)
                continue;
            memset(f, 0xA5, sz + 64); /* the bytes past the row must stay untouched */
            sil_type_traits(SIL_TYPE_Q8_0)->from_float(x, f, n);
            if (memcmp(r, f, sz + 64) != 0)
                fail_msg("q8_0 fast quantizer n=%lld at %s differs from the reference",
                         (long long)n, sil_cpu_level_name(lev));
        }
        free(x);
        free(r);
        free(f);
    }
    dot_case_free(&c);
}

static void test_simd_tails(void **state)
{
    (void)state;
    const enum sil_cpu_level top = sil_cpu_force_level(SIL_CPU_AVX512_VNNI);
    static const int float_types[] = {SIL_TYPE_F32, SIL_TYPE_F16, SIL_TYPE_BF16};
    static const int64_t float_long[] = {100, 127, 129, 255, 257, 1000, 4096 + 256 + 13};
    for (size_t k = 0; k < 3; k++) {
        for (int64_t n = 1; n <= 130; n++) /* every tail of 8-, 16-, 32- and 64-wide loops */
            check_tail(float_types[k], n, top, 300 + k * 1000 + (uint64_t)n);
        for (size_t l = 0; l < sizeof(float_long) / sizeof(float_long[0]); l++)
            check_tail(float_types[k], float_long[l], top, 400 + k * 1000 + l);
    }
    static const int legacy[] = {SIL_TYPE_Q8_0, SIL_TYPE_Q4_0, SIL_TYPE_Q4_1, SIL_TYPE_Q5_0,
                                 SIL_TYPE_Q5_1};
    for (size_t k = 0; k < sizeof(legacy) / sizeof(legacy[0]); k++) {
        for (int64_t nb = 1; nb <= 17; nb++)
            check_tail(legacy[k], nb * 32, top, 500 + k * 1000 + (uint64_t)nb);
        check_tail(legacy[k], 37 * 32, top, 600 + k * 1000);
    }
    sil_cpu_force_level(SIL_CPU_AVX512_VNNI);
}

/* ---- refdata: quantized files against the unquantized one ------------------------------------- */

/* Every quantized tensor of qwen35moe-tiny-<TYPE>.gguf, dequantized, against the same tensor of
 * the F16 file (= the unquantized weights): per element within the legacy formats' bound, and for
 * the k-quants within the per-element bound and the relative RMS bound of test_roundtrip (the
 * reference files were quantized by an independent implementation, so this checks our layout
 * reading as much as their quantizer). */
static void check_refdata_file(const char *file, const int *want_types, int n_want)
{
    char *qpath = tu_refdata_path(file), *fpath = tu_refdata_path("models/qwen35moe-tiny-F16.gguf");
    if (!tu_refdata_exists(file) || !tu_refdata_exists("models/qwen35moe-tiny-F16.gguf")) {
        free(qpath);
        free(fpath);
        tu_skip_no_refdata();
    }
    struct sil_gguf *gq = NULL, *gf = NULL;
    struct sil_error err = {0};
    if (sil_gguf_open(&gq, qpath, &err) != 0 || sil_gguf_open(&gf, fpath, &err) != 0)
        fail_msg("open: %s", err.msg);
    int seen[SIL_TYPE_COUNT] = {0};
    double worst[SIL_TYPE_COUNT] = {0};
    for (int64_t ti = 0; ti < sil_gguf_n_tensors(gq); ti++) {
        const struct sil_gguf_tensor *tq = sil_gguf_tensor(gq, ti);
        if (tq->type == SIL_TYPE_F32 || tq->type == SIL_TYPE_F16)
            continue;
        const struct sil_gguf_tensor *tf = sil_gguf_find_tensor(gf, tq->name);
        assert_non_null(tf);
        assert_int_equal(tf->type, SIL_TYPE_F16);
        for (int d = 0; d < 4; d++)
            assert_int_equal(tq->ne[d], tf->ne[d]);
        const struct sil_type_traits *t = sil_type_traits(tq->type);
        assert_non_null(t);
        assert_true(t->supported);
        const int64_t n = tq->ne[0] * tq->ne[1] * tq->ne[2] * tq->ne[3];
        assert_int_equal(tq->nbytes, sil_row_size(tq->type, tq->ne[0]) * (n / tq->ne[0]));
        float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float));
        sil_dequantize_row(SIL_TYPE_F16, tf->data, x, n);
        sil_dequantize_row(tq->type, tq->data, y, n);
        double se = 0, sx = 0;
        for (int64_t i = 0; i < n; i++) {
            se += (double)(x[i] - y[i]) * (x[i] - y[i]);
            sx += (double)x[i] * x[i];
            float b;
            if (t->block_size == 32) {
                b = legacy_bound(tq->type, x + i / 32 * 32);
            } else {
                float amax, mn, mx;
                stats(x + i / 256 * 256, 256, &amax, &mn, &mx);
                const int nmax = tq->type == SIL_TYPE_Q4_K ? 15 : tq->type == SIL_TYPE_Q5_K ? 31 : 32;
                b = 2 * amax / nmax + 1e-30f;
            }
            if (!(fabsf(x[i] - y[i]) <= b))
                fail_msg("%s %s (%s) element %lld: %g vs unquantized %g, bound %g", file, tq->name,
                         t->name, (long long)i, y[i], x[i], b);
        }
        if (t->block_size == 256 && !(sqrt(se / sx) < kquant_rms_bound(tq->type)))
            fail_msg("%s %s (%s): relative rms error %g", file, tq->name, t->name, sqrt(se / sx));
        seen[tq->type]++;
        if (sqrt(se / sx) > worst[tq->type])
            worst[tq->type] = sqrt(se / sx);
        free(x);
        free(y);
    }
    for (int k = 0; k < SIL_TYPE_COUNT; k++)
        if (seen[k])
            print_message("  %s: %d %s tensors, worst relative rms error %.4f\n", file, seen[k],
                          sil_type_name(k), worst[k]);
    for (int k = 0; k < n_want; k++)
        if (!seen[want_types[k]])
            fail_msg("%s: no %s tensor compared", file, sil_type_name(want_types[k]));
    sil_gguf_close(gq);
    sil_gguf_close(gf);
    free(qpath);
    free(fpath);
}

static void test_refdata_q8_0(void **state)
{
    (void)state;
    static const int want[] = {SIL_TYPE_Q8_0};
    check_refdata_file("models/qwen35moe-tiny-Q8_0.gguf", want, 1);
}

static void test_refdata_q4_k_m(void **state)
{
    (void)state;
    static const int want[] = {SIL_TYPE_Q4_K, SIL_TYPE_Q6_K, SIL_TYPE_Q5_0};
    check_refdata_file("models/qwen35moe-tiny-Q4_K_M.gguf", want, 3);
}

static void test_refdata_q5_k_m(void **state)
{
    (void)state;
    static const int want[] = {SIL_TYPE_Q5_K, SIL_TYPE_Q6_K, SIL_TYPE_Q5_1};
    check_refdata_file("models/qwen35moe-tiny-Q5_K_M.gguf", want, 3);
}

static void test_refdata_q6_k(void **state)
{
    (void)state;
    static const int want[] = {SIL_TYPE_Q6_K, SIL_TYPE_Q8_0};
    check_refdata_file("models/qwen35moe-tiny-Q6_K.gguf", want, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_fp16_exact),
        cmocka_unit_test(test_bf16_exact),
        cmocka_unit_test(test_roundtrip),
        cmocka_unit_test(test_activation_quant),
        cmocka_unit_test(test_vec_dot_matches_dequant),
        cmocka_unit_test(test_simd_vs_scalar),
        cmocka_unit_test(test_simd_tails),
        cmocka_unit_test(test_refdata_q8_0),
        cmocka_unit_test(test_refdata_q4_k_m),
        cmocka_unit_test(test_refdata_q5_k_m),
        cmocka_unit_test(test_refdata_q6_k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
