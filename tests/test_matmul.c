/* The quantized matmul: y[j][r] = W[r] . x[j] for every supported weight type, in normal mode
 * (activations converted once to the type's vec_dot format: must equal vec_dot on the converted
 * row, bit for bit) and exact mode (dequantized weights, F32 activations: must match a double
 * reference). Row lists, output row maps and several jobs with different formats sharing one
 * input in one call. Batches through the tiled kernels at every tile edge. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_impl.h"

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static const int types[] = {SIL_TYPE_F32, SIL_TYPE_F16, SIL_TYPE_Q8_0, SIL_TYPE_Q5_0, SIL_TYPE_Q5_1,
                            SIL_TYPE_Q4_0, SIL_TYPE_Q4_K, SIL_TYPE_Q5_K, SIL_TYPE_Q6_K};

#define K 512
#define M 37 /* not a multiple of the 16-row chunk */
#define N 5

struct fixture {
    struct sil_threadpool *tp;
    float x[N * K];
    float *scratch;
    void *inbuf;
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof(*f));
    if (sil_threadpool_create(&f->tp, 2) != 0)
        return -1;
    for (int i = 0; i < N * K; i++)
        f->x[i] = frand();
    f->scratch = calloc(2 * (size_t)sil_matmul_scratch_floats(K), sizeof(float));
    f->inbuf = calloc(1, sil_mm_input_bytes_all(K, N));
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    sil_threadpool_free(f->tp);
    free(f->scratch);
    free(f->inbuf);
    free(f);
    return 0;
}

/* Random weights of type t: m rows of k, quantized with the reference quantizer. */
static void *make_weights(int t, int m, int k)
{
    size_t rs = sil_row_size(t, k);
    char *w = malloc(rs * (size_t)m);
    float row[K];
    for (int r = 0; r < m; r++) {
        for (int i = 0; i < k; i++)
            row[i] = frand() * (1.0f + (float)(r % 3));
        sil_quantize_row_ref(t, row, w + rs * (size_t)r, k);
    }
    return w;
}

static void test_types(void **state)
{
    struct fixture *f = *state;
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const int t = types[ti];
        const struct sil_type_traits *tt = sil_type_traits(t);
        assert_non_null(tt);
        if (!tt->supported)
            continue;
        void *w = make_weights(t, M, K);
        const size_t rs = sil_row_size(t, K);
        for (int exact = 0; exact < 2; exact++) {
            float y[N * M];
            struct sil_mm_input in;
            sil_mm_input_init(&in, f->x, N, K, exact, f->inbuf, K, N);
            sil_mm_input_prepare(f->tp, &in, t);
            struct sil_mm_job j = {.w = w, .wtype = t, .m = M, .in = &in, .n_rows = N, .y = y, .ldy = M};
            sil_matmul(f->tp, &j, 1, f->scratch, K);
            for (int jj = 0; jj < N; jj++)
                for (int r = 0; r < M; r++) {
                    float got = y[jj * M + r];
                    if (exact) {
                        float wr[K];
                        sil_dequantize_row(t, (char *)w + rs * (size_t)r, wr, K);
                        double ref = 0;
                        for (int i = 0; i < K; i++)
                            ref += (double)wr[i] * f->x[jj * K + i];
                        if (fabs(got - ref) > 1e-4 * (1 + fabs(ref)))
                            fail_msg("%s exact: y[%d][%d] = %g, reference %g", tt->name, jj, r, got, ref);
                    } else {
                        /* the same conversion and dot product the matmul promises */
                        const int at = tt->vec_dot_type;
                        float want;
                        if (at == SIL_TYPE_F32) {
                            want = tt->vec_dot(K, (char *)w + rs * (size_t)r, f->x + jj * K);
                        } else {
                            char q[sizeof(float) * K * 2];
                            sil_type_traits(at)->from_float(f->x + jj * K, q, K);
                            want = tt->vec_dot(K, (char *)w + rs * (size_t)r, q);
                        }
                        if (got != want)
                            fail_msg("%s: y[%d][%d] = %.9g, vec_dot gives %.9g", tt->name, jj, r, got, want);
                    }
                }
        }
        free(w);
    }
}

/* Row lists and output maps (MoE-style gathers and scatters), two formats in one call. */
static void test_rows_and_jobs(void **state)
{
    struct fixture *f = *state;
    void *wa = make_weights(SIL_TYPE_Q4_K, M, K), *wb = make_weights(SIL_TYPE_Q8_0, M, K);
    float full_a[N * M], full_b[N * M], ya[N * M], yb[3 * M];
    struct sil_mm_input in;
    sil_mm_input_init(&in, f->x, N, K, false, f->inbuf, K, N);
    struct sil_mm_job jobs[2] = {
        {.w = wa, .wtype = SIL_TYPE_Q4_K, .m = M, .in = &in, .n_rows = N, .y = full_a, .ldy = M},
        {.w = wb, .wtype = SIL_TYPE_Q8_0, .m = M, .in = &in, .n_rows = N, .y = full_b, .ldy = M},
    };
    sil_mm_input_prepare(f->tp, &in, SIL_TYPE_Q4_K);
    sil_mm_input_prepare(f->tp, &in, SIL_TYPE_Q8_0);
    sil_matmul(f->tp, jobs, 2, f->scratch, K);

    const int32_t rows[3] = {4, 0, 2}, outs[3] = {2, 0, 4};
    memset(ya, 0, sizeof(ya));
    struct sil_mm_job j2[2] = {
        {.w = wa, .wtype = SIL_TYPE_Q4_K, .m = M, .in = &in, .rows = rows, .n_rows = 3, .y = ya,
         .out_rows = outs, .ldy = M},
        {.w = wb, .wtype = SIL_TYPE_Q8_0, .m = M, .in = &in, .rows = rows, .n_rows = 3, .y = yb, .ldy = M},
    };
    sil_matmul(f->tp, j2, 2, f->scratch, K);
    for (int j = 0; j < 3; j++)
        for (int r = 0; r < M; r++) {
            assert_true(ya[outs[j] * M + r] == full_a[rows[j] * M + r]);
            assert_true(yb[j * M + r] == full_b[rows[j] * M + r]);
        }
    for (int r = 0; r < M; r++) /* rows not in the output map stay untouched */
        assert_true(ya[1 * M + r] == 0.0f && ya[3 * M + r] == 0.0f);
    free(wa);
    free(wb);
}

/* A SwiGLU pair (w_up, y_up): the bits of the two products and sil_swiglu after, for every
 * type, exact or not, over a row list and an output map, next to a plain job in one call. */
static void test_swiglu_pair(void **state)
{
    struct fixture *f = *state;
    const int32_t rows[3] = {4, 0, 2}, outs[3] = {2, 0, 4};
    for (size_t ti = 0; ti < sizeof(types) / sizeof(types[0]); ti++) {
        const int t = types[ti];
        if (!sil_type_traits(t)->supported)
            continue;
        void *wg = make_weights(t, M, K), *wu = make_weights(t, M, K), *wo = make_weights(t, M, K);
        for (int exact = 0; exact < 2; exact++) {
            float g[N * M] = {0}, u[N * M] = {0}, g2[N * M] = {0}, u2[N * M] = {0}, o[3 * M], o2[3 * M];
            struct sil_mm_input in;
            sil_mm_input_init(&in, f->x, N, K, exact, f->inbuf, K, N);
            sil_mm_input_prepare(f->tp, &in, t);
            struct sil_mm_job sep[3] = {
                {.w = wg, .wtype = t, .m = M, .in = &in, .rows = rows, .n_rows = 3, .y = g,
                 .out_rows = outs, .ldy = M},
                {.w = wu, .wtype = t, .m = M, .in = &in, .rows = rows, .n_rows = 3, .y = u,
                 .out_rows = outs, .ldy = M},
                {.w = wo, .wtype = t, .m = M, .in = &in, .n_rows = 3, .y = o, .ldy = M},
            };
            sil_matmul(f->tp, sep, 3, f->scratch, K);
            for (int j = 0; j < 3; j++)
                sil_swiglu(g + outs[j] * M, g + outs[j] * M, u + outs[j] * M, M);
            struct sil_mm_job pair[2] = {
                {.w = wg, .wtype = t, .m = M, .in = &in, .rows = rows, .n_rows = 3, .y = g2,
                 .out_rows = outs, .ldy = M, .w_up = wu, .y_up = u2},
                {.w = wo, .wtype = t, .m = M, .in = &in, .n_rows = 3, .y = o2, .ldy = M},
            };
            sil_matmul(f->tp, pair, 2, f->scratch, K);
            if (memcmp(g, g2, sizeof(g)) || memcmp(u, u2, sizeof(u)) || memcmp(o, o2, sizeof(o)))
                fail_msg("%s%s: the SwiGLU pair differs from the products and sil_swiglu",
                         sil_type_traits(t)->name, exact ? " exact" : "");
        }
        free(wg);
        free(wu);
        free(wo);
    }
}

/* The tiled kernel directly (every nr x nc up to one past a tile, activation rows scattered in
 * memory) and through sil_matmul (every batch size and matrix height across a few tiles, with a
 * row list): bitwise equal to vec_dot, which sums the same integers in the same float order. */
static void check_tiles(struct fixture *f, int t)
{
    enum { TK = 768, TM = 11, TN = 2 * SIL_TILE_C + 1 };
    const struct sil_type_traits *tt = sil_type_traits(t);
    const sil_vec_dot_tile_fn tile = sil_vec_dot_tile(t);
    if (sil_cpu_level() >= SIL_CPU_AVX2)
        assert_non_null(tile);
    else
        assert_null(tile);
    const size_t rs = sil_row_size(t, TK), ars = sil_row_size(SIL_TYPE_Q8_K, TK);
    char *w = malloc(rs * TM);
    float *x = malloc(sizeof(float) * TK * TN), row[TK];
    char *q = malloc(ars * TN);
    for (int r = 0; r < TM; r++) {
        for (int i = 0; i < TK; i++)
            row[i] = frand() * (1.0f + (float)(r % 4));
        sil_quantize_row_ref(t, row, w + rs * (size_t)r, TK);
    }
    for (int i = 0; i < TK * TN; i++)
        x[i] = frand() * (i % 7 == 0 ? 4.0f : 1.0f);
    for (int j = 0; j < TN; j++)
        sil_type_traits(SIL_TYPE_Q8_K)->from_float(x + (size_t)j * TK, q + ars * (size_t)j, TK);
    float want[TN][TM];
    for (int j = 0; j < TN; j++)
        for (int r = 0; r < TM; r++)
            want[j][r] = tt->vec_dot(TK, w + rs * (size_t)r, q + ars * (size_t)j);

    if (tile) {
        const void *a[SIL_TILE_C + 1];
        float buf[(SIL_TILE_C + 1) * 2 * (SIL_TILE_R + 1)], *out[SIL_TILE_C + 1];
        for (int c = 0; c < SIL_TILE_C + 1; c++) /* columns in reverse order, with gaps */
            out[c] = buf + (SIL_TILE_C - c) * 2 * (SIL_TILE_R + 1);
        for (int nr = 1; nr <= SIL_TILE_R; nr++)
            for (int nc = 1; nc <= SIL_TILE_C; nc++) {
                for (int c = 0; c < nc; c++)
                    a[c] = q + ars * (size_t)(TN - 1 - 2 * c);
                memset(buf, 0, sizeof(buf));
                tile(TK, w + rs * 2, rs, nr, a, nc, out);
                for (int c = 0; c < SIL_TILE_C + 1; c++)
                    for (int r = 0; r < 2 * (SIL_TILE_R + 1); r++) {
                        const float exp = r < nr && c < nc ? want[TN - 1 - 2 * c][2 + r] : 0.0f;
                        if (out[c][r] != exp)
                            fail_msg("%s %s tile %dx%d: out[%d][%d] = %.9g, want %.9g", tt->name,
                                     sil_cpu_level_name(sil_cpu_level()), nr, nc, c, r, out[c][r],
                                     exp);
                    }
            }
    }

    void *inbuf = calloc(1, sil_mm_input_bytes_all(TK, TN));
    float *scratch = calloc(2 * (size_t)sil_matmul_scratch_floats(TK), sizeof(float));
    int32_t rows[TN];
    for (int j = 0; j < TN; j++)
        rows[j] = (int32_t)((j * 3 + 1) % TN);
    for (int m = 1; m <= TM; m++)
        for (int n = 1; n <= TN; n++) {
            float y[TN * TM];
            struct sil_mm_input in;
            sil_mm_input_init(&in, x, TN, TK, false, inbuf, TK, TN);
            sil_mm_input_prepare(f->tp, &in, t);
            struct sil_mm_job j = {
                .w = w, .wtype = t, .m = m, .in = &in, .rows = rows, .n_rows = n, .y = y, .ldy = m};
            sil_matmul(f->tp, &j, 1, scratch, TK);
            for (int jj = 0; jj < n; jj++)
                for (int r = 0; r < m; r++)
                    if (y[jj * m + r] != want[rows[jj]][r])
                        fail_msg("%s m %d n %d: y[%d][%d] = %.9g, vec_dot gives %.9g", tt->name, m,
                                 n, jj, r, y[jj * m + r], want[rows[jj]][r]);
        }
    free(inbuf);
    free(scratch);
    free(w);
    free(x);
    free(q);
}

/* At every SIMD level this CPU has: AVX2 and AVX-512 each have their own tiled kernels (the
 * scalar level none), each held to its own level's vec_dot. */
static void test_tiles(void **state)
{
    const enum sil_cpu_level top = sil_cpu_level();
    for (int lev = SIL_CPU_SCALAR; lev <= (int)top; lev++) {
        if ((int)sil_cpu_force_level((enum sil_cpu_level)lev) != lev)
            continue;
        check_tiles(*state, SIL_TYPE_Q4_K);
        check_tiles(*state, SIL_TYPE_Q6_K);
    }
    sil_cpu_force_level(top);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_types),
        cmocka_unit_test(test_rows_and_jobs),
        cmocka_unit_test(test_swiglu_pair),
        cmocka_unit_test(test_tiles),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
