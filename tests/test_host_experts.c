/* Routed experts on the host (host_experts.c): random experts quantized to the types the
 * recipes give routed experts, against a float reference computed in double from the
 * dequantized weights (the difference is the activation quantization: a stated tolerance);
 * 1 thread and 4 threads bit for bit; rows without a job are 0; bad jobs are refused with y
 * untouched. */
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

#include "daemon/engine/host_experts.h"
#include "kernels/cpu/quants.h"

#define E 512
#define F 256
#define N_EXP 3

struct expert {
    void *g, *u, *d;
    float *gf, *uf, *df; /* dequantized */
    struct sil_weight wg, wu, wd;
};

static uint64_t rng = 88172645463325252ull;
static float frand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void mk_mat(int type, int64_t rows, int64_t cols, void **q, float **f, struct sil_weight *w)
{
    const size_t rs = sil_row_size(type, cols);
    assert_true(rs > 0);
    float *src = malloc(sizeof(float) * (size_t)(rows * cols));
    *q = malloc(rs * (size_t)rows);
    *f = malloc(sizeof(float) * (size_t)(rows * cols));
    assert_non_null(src);
    assert_non_null(*q);
    assert_non_null(*f);
    for (int64_t i = 0; i < rows * cols; i++)
        src[i] = frand() * 0.1f;
    for (int64_t r = 0; r < rows; r++) {
        sil_quantize_row_ref(type, src + r * cols, (uint8_t *)*q + (size_t)r * rs, cols);
        sil_dequantize_row(type, (uint8_t *)*q + (size_t)r * rs, *f + r * cols, cols);
    }
    free(src);
    *w = (struct sil_weight){.type = type,
                             .rows = rows,
                             .cols = cols,
                             .n_mat = 1,
                             .mat_bytes = rs * (size_t)rows,
                             .loc = SIL_WEIGHT_MMAP,
                             .data = *q};
}

static void mk_expert(struct expert *x, int tg, int td)
{
    mk_mat(tg, F, E, &x->g, &x->gf, &x->wg);
    mk_mat(tg, F, E, &x->u, &x->uf, &x->wu);
    mk_mat(td, E, F, &x->d, &x->df, &x->wd);
}

static void free_expert(struct expert *x)
{
    free(x->g);
    free(x->u);
    free(x->d);
    free(x->gf);
    free(x->uf);
    free(x->df);
}

/* y[row] += w * down(silu(gate x) * up x), in double from the dequantized weights */
static void reference(const struct expert *x, const float *in, float w, double *y)
{
    double h[F];
    for (int i = 0; i < F; i++) {
        double g = 0, u = 0;
        for (int k = 0; k < E; k++) {
            g += (double)x->gf[i * E + k] * in[k];
            u += (double)x->uf[i * E + k] * in[k];
        }
        h[i] = g / (1.0 + exp(-g)) * u;
    }
    for (int o = 0; o < E; o++) {
        double s = 0;
        for (int i = 0; i < F; i++)
            s += (double)x->df[o * F + i] * h[i];
        y[o] += w * s;
    }
}

static void run_types(int tg, int td)
{
    struct expert ex[N_EXP];
    for (int i = 0; i < N_EXP; i++)
        mk_expert(&ex[i], tg, td);
    const int R = 3; /* row 2 gets no job */
    float *x = malloc(sizeof(float) * R * E), *y1 = malloc(sizeof(float) * R * E),
          *y4 = malloc(sizeof(float) * R * E);
    double *ref = calloc((size_t)R * E, sizeof(double));
    for (int i = 0; i < R * E; i++)
        x[i] = frand();
    const struct sil_host_expert_job jobs[] = {
        {0, 0.6f, &ex[0].wg, &ex[0].wu, &ex[0].wd},
        {0, 0.4f, &ex[1].wg, &ex[1].wu, &ex[1].wd},
        {1, 1.0f, &ex[2].wg, &ex[2].wu, &ex[2].wd},
        {1, 0.25f, &ex[0].wg, &ex[0].wu, &ex[0].wd},
    };
    for (int j = 0; j < 4; j++)
        reference(&ex[jobs[j].gate == &ex[0].wg   ? 0
                      : jobs[j].gate == &ex[1].wg ? 1
                                                  : 2],
                  x + jobs[j].row * E, jobs[j].weight, ref + jobs[j].row * E);
    struct sil_host_experts *h1 = NULL, *h4 = NULL;
    struct sil_error err = {0};
    assert_int_equal(sil_host_experts_create(&h1, 1, E, F, 8, &err), 0);
    assert_int_equal(sil_host_experts_create(&h4, 4, E, F, 8, &err), 0);
    assert_int_equal(sil_host_experts_run(h1, x, R, jobs, 4, y1, &err), 0);
    assert_int_equal(sil_host_experts_run(h4, x, R, jobs, 4, y4, &err), 0);
    assert_memory_equal(y1, y4, sizeof(float) * R * E);
    double worst = 0, scale = 0;
    for (int i = 0; i < 2 * E; i++) {
        const double d = fabs((double)y1[i] - ref[i]);
        if (d > worst) worst = d;
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    }
    for (int i = 2 * E; i < 3 * E; i++)
        assert_true(y1[i] == 0.0f);
    /* activations quantized to 8 bits (q8_K / q8_0): about 1% of the largest output */
    printf("%s/%s: max |host - reference| = %.3g of max |reference| %.3g\n", sil_type_name(tg),
           sil_type_name(td), worst, scale);
    assert_true(scale > 0);
    assert_true(worst <= 0.02 * scale);

    /* refused: a row out of range, a weight of another shape; y untouched */
    memcpy(y4, y1, sizeof(float) * R * E);
    struct sil_host_expert_job bad = jobs[0];
    bad.row = R;
    assert_int_equal(sil_host_experts_run(h1, x, R, &bad, 1, y4, &err), -EINVAL);
    bad = jobs[0];
    bad.down = &ex[0].wg; /* [F][E], not [E][F] */
    assert_int_equal(sil_host_experts_run(h1, x, R, &bad, 1, y4, &err), -EINVAL);
    assert_int_equal(sil_host_experts_run(h1, x, R, jobs, 9, y4, &err), -EINVAL);
    assert_memory_equal(y4, y1, sizeof(float) * R * E);
    /* no jobs: all zero */
    assert_int_equal(sil_host_experts_run(h1, x, R, jobs, 0, y4, &err), 0);
    for (int i = 0; i < R * E; i++)
        assert_true(y4[i] == 0.0f);
    sil_host_experts_free(h1);
    sil_host_experts_free(h4);
    for (int i = 0; i < N_EXP; i++)
        free_expert(&ex[i]);
    free(x);
    free(y1);
    free(y4);
    free(ref);
}

static void test_q4k_q6k(void **state)
{
    (void)state;
    run_types(sil_type_from_name("q4_K"), sil_type_from_name("q6_K"));
}

static void test_q8_0_q5_0(void **state)
{
    (void)state;
    run_types(sil_type_from_name("q8_0"), sil_type_from_name("q5_0"));
}

static void test_f16(void **state)
{
    (void)state;
    run_types(sil_type_from_name("f16"), sil_type_from_name("f16"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_q4k_q6k),
        cmocka_unit_test(test_q8_0_q5_0),
        cmocka_unit_test(test_f16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
