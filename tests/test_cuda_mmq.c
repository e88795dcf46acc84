/* sil_cuda_matmul (prefill's matrix-matrix product) against the CPU backend on random inputs:
 * every type, n in {3, 9, 16, 31, 64, 100, 512} activation rows, odd weight row counts and a
 * count over one tile (7, 130), columns that end in a partial stage (Q*_0/Q*_1: 65 units of 32;
 * K-quants: 9 blocks of 256; float: 2050 and 37), and both int8 mma paths where the device has
 * them (sm_75's m8n8k16 always; sm_80's m16n8k32 on an sm_80+ device running SASS).
 *
 * Tolerances, as the matvec test (tests/test_cuda_ops.c): ||gpu - ref|| / ||m|| over a row of
 * outputs, m[r] = sum_c |w_rc x_c|:
 *   quantized: <= 1e-5 against the same arithmetic in double (weights dequantized by the CPU
 *              backend, activations rounded to q8 on the host as the GPU does) and <= 5e-3
 *              against the CPU backend's own dot products (its activations round differently);
 *   float:     <= 1e-5 against double and against the CPU backend, through both kernels
 *              (64 x 64 tiles where they fill the device, else a warp per 4 x 8 products).
 * The grouped product (prefill's routed experts) in each tile height: the same bits as the plain
 * product of each group's matrix.
 * Outputs are poisoned with NaN bytes and y has 3 padding rows per activation row: an unwritten
 * element or a write past the rows fails.
 *
 * Without a driver or GPU only the host-side checks run, unless SIL_CUDA_REQUIRE=1 (check-cuda). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/quants.h"
#include "kernels/cuda/cuda_backend.h"

#define CUDA_TEST_SEED 0x2545F4914F6CDD1Dull
#include "tests/cuda_testutil.h"

struct stats {
    double worst_same, worst_cpu;
    int runs;
};

/* One weight and input; the product on every path in paths[0..npaths) against both references. */
static void mm_case(struct sil_cuda *cu, int type, int rows, int cols, int n, const int *paths,
                    int npaths, struct stats *st)
{
    const struct sil_type_traits *tt = sil_type_traits(type);
    const bool quant = tt->block_size > 1;
    const size_t rb = sil_row_size(type, cols);
    const int ldy = rows + 3;
    float *wf = xmalloc(sizeof(float) * (size_t)rows * cols);
    uint8_t *wq = xmalloc(rb * rows);
    float *x = xmalloc(sizeof(float) * (size_t)n * cols);
    for (int r = 0; r < rows; r++) /* rows of different magnitude, some offset (mins matter) */
        for (int c = 0; c < cols; c++)
            wf[(size_t)r * cols + c] = frand() * (0.5f + (r % 5)) + 0.1f * (r % 3);
    for (int r = 0; r < rows; r++)
        sil_quantize_row_ref(type, wf + (size_t)r * cols, wq + rb * r, cols);
    for (int64_t i = 0; i < (int64_t)n * cols; i++) /* rows of x of different magnitude too */
        x[i] = frand() * (0.25f + (float)(i / cols % 7));
    for (int r = 0; r < rows; r++) /* the weights as the CPU backend reads them */
        sil_dequantize_row(type, wq + rb * r, wf + (size_t)r * cols, cols);

    /* references, once for all paths */
    double *ref = xmalloc(sizeof(double) * (size_t)n * rows);
    double *refc = xmalloc(sizeof(double) * (size_t)n * rows);
    double *mag = xmalloc(sizeof(double) * (size_t)n * rows);
    float *d = xmalloc(sizeof(float) * (cols / 32 + 1));
    int8_t *q = xmalloc(cols);
    double *xd = xmalloc(sizeof(double) * cols);
    const struct sil_type_traits *at = sil_type_traits(tt->vec_dot_type);
    uint8_t *xa = xmalloc(sil_row_size(tt->vec_dot_type, cols) + 64);
    float *cpu = xmalloc(sizeof(float) * rows);
    for (int j = 0; j < n; j++) {
        const float *xj = x + (size_t)j * cols;
        if (quant) {
            host_q8(xj, cols, d, q);
            for (int c = 0; c < cols; c++)
                xd[c] = (double)d[c / 32] * q[c];
        } else {
            for (int c = 0; c < cols; c++)
                xd[c] = xj[c];
        }
        for (int r = 0; r < rows; r++) {
            double s = 0, m = 0;
            const float *wr = wf + (size_t)r * cols;
            for (int c = 0; c < cols; c++) {
                s += (double)wr[c] * xd[c];
                m += fabs((double)wr[c] * xj[c]);
            }
            ref[(size_t)j * rows + r] = s;
            mag[(size_t)j * rows + r] = m;
        }
        at->from_float_ref(xj, xa, cols);
        sil_vec_dot_rows(type, cols, wq, rb, rows, xa, cpu);
        for (int r = 0; r < rows; r++)
            refc[(size_t)j * rows + r] = cpu[r];
    }

    struct sil_cuda_weight w;
    CK(sil_cuda_weight_upload(cu, type, rows, cols, wq, rb * rows, &w, &err));
    sil_cuda_ptr dx, dq8 = 0, dy;
    const size_t ybytes = sizeof(float) * (size_t)n * ldy;
    CK(sil_cuda_alloc(cu, sizeof(float) * (size_t)n * cols, &dx, &err));
    CK(sil_cuda_alloc(cu, ybytes, &dy, &err));
    CK(sil_cuda_upload(cu, dx, x, sizeof(float) * (size_t)n * cols, NULL, &err));
    if (quant) {
        CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(n, cols), &dq8, &err));
        CK(sil_cuda_quantize_q8(cu, dx, n, cols, dq8, NULL, &err));
    }
    float *y = xmalloc(ybytes);
    for (int p = 0; p < npaths; p++) {
        CK(sil_cuda_set_mma(cu, paths[p], &err));
        CK(sil_cuda_memset(cu, dy, 0xff, ybytes, NULL, &err));
        CK(sil_cuda_matmul(cu, &w, quant ? 0 : dx, dq8, n, dy, ldy, NULL, &err));
        CK(sil_cuda_download(cu, y, dy, ybytes, NULL, &err));
        CK(sil_cuda_sync(cu, NULL, &err));
        int shown = 0;
        for (int j = 0; j < n; j++) {
            const float *yj = y + (size_t)j * ldy;
            double e1 = nerr(yj, ref + (size_t)j * rows, mag + (size_t)j * rows, rows);
            const double e2 = nerr(yj, refc + (size_t)j * rows, mag + (size_t)j * rows, rows);
            bool pad_ok = true;
            for (int r = rows; r < ldy; r++)
                pad_ok = pad_ok && isnan(yj[r]);
            if (!(e1 <= 1e-5) || !(e2 <= (quant ? 5e-3 : 1e-5)) || !pad_ok) {
                if (shown++ < 3) /* the first few bad rows of a run */
                    printf("     %s %d x %d, n %d, sm_%d mma, row %d: err %.3g (same rounding), "
                           "%.3g (cpu)%s\n",
                           tt->name, rows, cols, n, paths[p], j, e1, e2,
                           pad_ok ? "" : ", padding written");
                if (!pad_ok) e1 = INFINITY;
            }
            st->worst_same = fmax(st->worst_same, e1);
            st->worst_cpu = fmax(st->worst_cpu, e2);
        }
        st->runs++;
    }
    CK(sil_cuda_set_mma(cu, 0, &err));
    free(ref), free(refc), free(mag), free(d), free(q), free(xd), free(xa), free(cpu), free(y);
    sil_cuda_release(cu, dx), sil_cuda_release(cu, dy), sil_cuda_release(cu, dq8);
    sil_cuda_weight_free(cu, &w);
    free(wf), free(wq), free(x);
}

static void test_matmul(struct sil_cuda *cu)
{
    static const int types[] = {SIL_TYPE_Q4_K, SIL_TYPE_Q5_K, SIL_TYPE_Q6_K, SIL_TYPE_Q8_0,
                                SIL_TYPE_Q4_0, SIL_TYPE_Q4_1, SIL_TYPE_Q5_0, SIL_TYPE_Q5_1,
                                SIL_TYPE_F16,  SIL_TYPE_BF16, SIL_TYPE_F32};
    static const int ns[] = {3, 9, 16, 31, 64, 100, 512};
    static const int rows_l[] = {7, 130};
    int paths[2] = {75, 80}, npaths = 1;
    struct sil_error e = {0};
    if (sil_cuda_set_mma(cu, 80, &e) == 0) npaths = 2;
    CK(sil_cuda_set_mma(cu, 0, &err));
    printf("     mma paths tested: sm_75%s (default sm_%d)\n", npaths == 2 ? ", sm_80" : "",
           sil_cuda_get_mma(cu));
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        const int type = types[t];
        const int bs = (int)sil_type_traits(type)->block_size;
        const bool quant = bs > 1;
        const int cols = bs == 256 ? 2304 : bs == 32 ? 2080 : 2050;
        struct stats st = {0};
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (int ri = 0; ri < 2; ri++)
                mm_case(cu, type, rows_l[ri], cols, ns[ni], paths, npaths, &st);
        /* a single stage (one K-quant block, one unit), more row tiles, and odd float columns */
        mm_case(cu, type, 333, bs == 256 ? 256 : bs == 32 ? 32 : 37, 100, paths, npaths, &st);
        /* float weights take 64 x 64 tiles only where those fill the SMs twice over (288
         * tiles here, up to 144 SMs); the few-row cases above take a warp per 4 x 8 products */
        if (!quant) mm_case(cu, type, 1100, 37, 1000, paths, npaths, &st);
        check(st.worst_same <= 1e-5 && st.worst_cpu <= (quant ? 5e-3 : 1e-5),
              "matmul %-5s %3d runs: err %.2e vs same rounding, %.2e vs cpu backend",
              sil_type_name(type), st.runs, st.worst_same, st.worst_cpu);
    }
}

/* sil_cuda_matmul_grouped over a stack of 5 matrices (72 rows each, a partial tile; every matrix
 * 16-byte aligned, as slots are), 4 groups of
 * 1, 17, 35 and 8 activation rows, in tiles of 16, 32, 64 rows and the default: every product
 * the same bits as sil_cuda_matmul of its matrix over all rows (the same sums in the same order),
 * the padding of y untouched. */
static void test_grouped(struct sil_cuda *cu)
{
    static const int types[] = {SIL_TYPE_Q4_K, SIL_TYPE_Q6_K, SIL_TYPE_Q8_0};
    enum { E = 5, ROWS = 72, COLS = 512, NG = 4, N = 61 };
    static const int gmat[NG] = {3, 0, 4, 1}, gstart[NG + 1] = {0, 1, 18, 53, N};
    const int ldy = ROWS + 3;
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        const int type = types[t];
        const size_t rb = sil_row_size(type, COLS), mat = rb * ROWS;
        float *wf = xmalloc(sizeof(float) * COLS), *x = xmalloc(sizeof(float) * N * COLS);
        uint8_t *wq = xmalloc(mat * E);
        for (int r = 0; r < E * ROWS; r++) {
            for (int c = 0; c < COLS; c++)
                wf[c] = frand() * (0.5f + (r % 5)) + 0.1f * (r % 3);
            sil_quantize_row_ref(type, wf, wq + rb * r, COLS);
        }
        for (int i = 0; i < N * COLS; i++)
            x[i] = frand() * (0.25f + (float)(i / COLS % 7));
        struct sil_cuda_weight w, v;
        CK(sil_cuda_weight_upload(cu, type, E * ROWS, COLS, wq, mat * E, &w, &err));
        sil_cuda_ptr dx, dq8, dy, dm, ds;
        const size_t yb = sizeof(float) * N * ldy;
        CK(sil_cuda_alloc(cu, sizeof(float) * N * COLS, &dx, &err));
        CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(N, COLS), &dq8, &err));
        CK(sil_cuda_alloc(cu, yb, &dy, &err));
        CK(sil_cuda_alloc(cu, sizeof gmat + sizeof gstart, &dm, &err));
        ds = dm + sizeof gmat;
        CK(sil_cuda_upload(cu, dx, x, sizeof(float) * N * COLS, NULL, &err));
        CK(sil_cuda_upload(cu, dm, gmat, sizeof gmat, NULL, &err));
        CK(sil_cuda_upload(cu, ds, gstart, sizeof gstart, NULL, &err));
        CK(sil_cuda_quantize_q8(cu, dx, N, COLS, dq8, NULL, &err));
        /* each matrix over all rows, plainly */
        float *ref = xmalloc(yb * E), *y = xmalloc(yb);
        for (int e = 0; e < E; e++) {
            CK(sil_cuda_weight_view(type, ROWS, COLS, w.data + mat * e, &v, &err));
            CK(sil_cuda_matmul(cu, &v, 0, dq8, N, dy, ldy, NULL, &err));
            CK(sil_cuda_download(cu, ref + (size_t)e * N * ldy, dy, yb, NULL, &err));
        }
        CK(sil_cuda_sync(cu, NULL, &err));
        CK(sil_cuda_weight_view(type, ROWS, COLS, w.data, &v, &err));
        static const int bns[] = {16, 32, 64, 0};
        static const char *const bn_label[] = {"16", "32", "64", "the chosen"};
        for (size_t b = 0; b < sizeof bns / sizeof *bns; b++) {
            CK(sil_cuda_set_grouped_bn(cu, bns[b], &err));
            CK(sil_cuda_memset(cu, dy, 0xff, yb, NULL, &err));
            CK(sil_cuda_matmul_grouped(cu, &v, mat, dq8, N, dm, ds, NG, 35, dy, ldy, NULL, &err));
            CK(sil_cuda_download(cu, y, dy, yb, NULL, &err));
            CK(sil_cuda_sync(cu, NULL, &err));
            int bad = 0, pad = 0;
            for (int g = 0; g < NG; g++)
                for (int j = gstart[g]; j < gstart[g + 1]; j++) {
                    const float *rj = ref + ((size_t)gmat[g] * N + j) * ldy, *yj = y + j * ldy;
                    bad += memcmp(rj, yj, sizeof(float) * ROWS) != 0;
                    for (int r = ROWS; r < ldy; r++)
                        pad += !isnan(yj[r]);
                }
            check(bad == 0 && pad == 0,
                  "grouped %-4s tiles of %s rows: %d of %d rows unlike the plain product, "
                  "%d padding values written",
                  sil_type_name(type), bn_label[b], bad, N, pad);
        }
        CK(sil_cuda_set_grouped_bn(cu, 0, &err));
        free(ref), free(y), free(wf), free(x), free(wq);
        sil_cuda_release(cu, dx), sil_cuda_release(cu, dq8), sil_cuda_release(cu, dy);
        sil_cuda_release(cu, dm);
        sil_cuda_weight_free(cu, &w);
    }
    struct sil_error e = {0};
    check(sil_cuda_set_grouped_bn(cu, 48, &e) == -EINVAL, "args: grouped tiles of 48 refused: %s",
          e.msg);
}

static void test_bad_args(struct sil_cuda *cu)
{
    struct sil_cuda_weight w;
    struct sil_error e = {0};
    uint8_t blk[144] = {0};
    CK(sil_cuda_weight_upload(cu, SIL_TYPE_Q4_K, 1, 256, blk, 144, &w, &err));
    int rc = sil_cuda_matmul(cu, &w, 0, 0, 16, 0, 1, NULL, &e);
    check(rc == -EINVAL && strstr(e.msg, "q8"), "args: quantized matmul without q8 refused: %s",
          e.msg);
    rc = sil_cuda_matmul(cu, &w, 0, 1, 0, 0, 1, NULL, &e);
    check(rc == -EINVAL, "args: matmul of 0 rows refused: %s", e.msg);
    rc = sil_cuda_matmul(cu, &w, 0, 1, 16, 0, 0, NULL, &e);
    check(rc == -EINVAL, "args: ldy below rows refused: %s", e.msg);
    sil_cuda_weight_free(cu, &w);
    rc = sil_cuda_matmul(cu, &w, 1, 1, 16, 1, 1, NULL, &e);
    check(rc == -EINVAL, "args: matmul on a freed weight refused: %s", e.msg);
    rc = sil_cuda_set_mma(cu, 70, &e);
    check(rc == -EINVAL, "args: mma path sm_70 refused: %s", e.msg);
    const struct sil_cuda_info *in = sil_cuda_get_info(cu);
    rc = sil_cuda_set_mma(cu, 80, &e);
    const bool want80 = in->cc_major >= 8 && !in->ptx_jit;
    check(want80 ? rc == 0 : rc == -ENOTSUP, "args: mma path sm_80 %s on sm_%d%d (%s)%s%s",
          want80 ? "taken" : "refused", in->cc_major, in->cc_minor, in->ptx_jit ? "PTX" : "SASS",
          rc ? ": " : "", rc ? e.msg : "");
    check(sil_cuda_get_mma(cu) == (want80 ? 80 : 75), "args: mma path now sm_%d",
          sil_cuda_get_mma(cu));
    CK(sil_cuda_set_mma(cu, 0, &err));
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* host side: the q8 buffer a matmul of 512 rows reads */
    check(sil_cuda_q8_bytes(512, 2048) == (size_t)512 * 64 * SIL_CUDA_Q8_BLOCK_BYTES,
          "host: q8 of 512 x 2048 is %zu bytes", sil_cuda_q8_bytes(512, 2048));
    const char *req = getenv("SIL_CUDA_REQUIRE");
    const bool require = req && *req && strcmp(req, "0") != 0;
    struct sil_cuda *cu = NULL;
    struct sil_error e = {0};
    int rc = sil_cuda_init(&cu, 0, NULL, &e);
    if (rc < 0) {
        check(cu == NULL && e.code == rc && e.msg[0] != 0, "init fails cleanly: %s", e.msg);
        if (!require) {
            printf("SKIP GPU tests: %s\n", e.msg);
            return failures ? 1 : 0;
        }
        printf("FAIL no usable GPU and SIL_CUDA_REQUIRE is set\n");
        return 1;
    }
    const struct sil_cuda_info *in = sil_cuda_get_info(cu);
    printf("device %d: %s, sm_%d%d, %d SMs, %s\n", in->ordinal, in->name, in->cc_major,
           in->cc_minor, in->sm_count, in->ptx_jit ? "PTX through the JIT" : "SASS");
    test_bad_args(cu);
    test_matmul(cu);
    test_grouped(cu);
    CK(sil_cuda_sync(cu, NULL, &err));
    sil_cuda_free(cu);
    printf("%s: %d failure%s\n", failures ? "FAILED" : "PASSED", failures,
           failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
