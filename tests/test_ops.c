/* Per-row operations of the forward pass against direct double-precision formulas, and the
 * properties the model relies on (rope is a rotation whose dot products depend only on the
 * position difference; softmax is a distribution even with large inputs). */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "kernels/cpu/ops.h"

static void fill(float *x, int n, float scale)
{
    uint32_t s = 12345u;
    for (int i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f * 2.0f - 1.0f) * scale;
    }
}

static void test_rmsnorm(void **state)
{
    (void)state;
    float x[300], w[300], y[300];
    fill(x, 300, 3.0f);
    fill(w, 300, 1.0f);
    sil_rmsnorm(y, x, w, 300, 1e-6f);
    double ss = 0;
    for (int i = 0; i < 300; i++)
        ss += (double)x[i] * x[i];
    double scale = 1.0 / sqrt(ss / 300 + 1e-6);
    for (int i = 0; i < 300; i++)
        assert_true(fabs(y[i] - x[i] * scale * w[i]) < 1e-5);
    sil_rmsnorm(x, x, NULL, 300, 1e-6f); /* in place, no weight: unit RMS */
    ss = 0;
    for (int i = 0; i < 300; i++)
        ss += (double)x[i] * x[i];
    assert_true(fabs(ss / 300 - 1.0) < 1e-4);
}

static void test_rope(void **state)
{
    (void)state;
    enum { HD = 64, NROT = 16 };
    float q[HD], k[HD], q0[HD];
    fill(q, HD, 1.0f);
    fill(k, HD, 0.5f);
    for (int i = 0; i < HD; i++)
        q0[i] = q[i];
    sil_rope_neox(q, 1, HD, NROT, 0, 1e7f); /* position 0: identity */
    for (int i = 0; i < HD; i++)
        assert_true(q[i] == q0[i]);
    /* pair (0, NROT/2) at position 5 turns by exactly 5 radians; dims past n_rot untouched */
    sil_rope_neox(q, 1, HD, NROT, 5, 1e7f);
    assert_true(fabs(q[0] - (q0[0] * cos(5.0) - q0[NROT / 2] * sin(5.0))) < 1e-5);
    assert_true(fabs(q[NROT / 2] - (q0[0] * sin(5.0) + q0[NROT / 2] * cos(5.0))) < 1e-5);
    for (int i = NROT; i < HD; i++)
        assert_true(q[i] == q0[i]);
    /* relative: <rope(q, a), rope(k, b)> depends on a - b only */
    float qa[HD], kb[HD], qc[HD], kd[HD];
    for (int i = 0; i < HD; i++) {
        qa[i] = qc[i] = q0[i];
        kb[i] = kd[i] = k[i];
    }
    sil_rope_neox(qa, 1, HD, NROT, 17, 1e4f);
    sil_rope_neox(kb, 1, HD, NROT, 10, 1e4f);
    sil_rope_neox(qc, 1, HD, NROT, 107, 1e4f);
    sil_rope_neox(kd, 1, HD, NROT, 100, 1e4f);
    assert_true(fabs(sil_dot_f32(qa, kb, HD) - sil_dot_f32(qc, kd, HD)) < 1e-4);
}

static void test_softmax_and_activations(void **state)
{
    (void)state;
    float x[5] = {1000.0f, 999.0f, -1000.0f, 0.0f, 1000.0f};
    sil_softmax(x, 5);
    double s = 0;
    for (int i = 0; i < 5; i++) {
        assert_true(x[i] >= 0.0f && isfinite(x[i]));
        s += x[i];
    }
    assert_true(fabs(s - 1.0) < 1e-6);
    assert_true(fabs(x[0] - x[4]) < 1e-7 && x[0] > x[1] && x[2] == 0.0f);
    assert_true(fabs(sil_silu(2.0f) - 2.0 / (1.0 + exp(-2.0))) < 1e-6);
    assert_true(fabs(sil_sigmoid(-3.0f) - 1.0 / (1.0 + exp(3.0))) < 1e-7);
    assert_true(fabs(sil_softplus(0.5f) - log1p(exp(0.5))) < 1e-6);
    assert_true(sil_softplus(100.0f) == 100.0f); /* no overflow */
    float g[3] = {1.0f, -2.0f, 0.0f}, u[3] = {3.0f, 4.0f, 5.0f}, o[3];
    sil_swiglu(o, g, u, 3);
    for (int i = 0; i < 3; i++)
        assert_true(fabs(o[i] - sil_silu(g[i]) * u[i]) < 1e-6);
    float y[19], z[19];
    fill(y, 19, 1.0f);
    fill(z, 19, 2.0f);
    double d = 0;
    for (int i = 0; i < 19; i++)
        d += (double)y[i] * z[i];
    assert_true(fabs(sil_dot_f32(y, z, 19) - d) < 1e-5);
    float y0[19];
    for (int i = 0; i < 19; i++)
        y0[i] = y[i];
    sil_axpy(y, 2.0f, z, 19);
    sil_add(y, z, 19);
    for (int i = 0; i < 19; i++)
        assert_true(fabs(y[i] - (y0[i] + 3.0f * z[i])) < 1e-6);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_softmax_and_activations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
