/* Every CUDA kernel against the CPU backend on random inputs, as llama.cpp's test-backend-ops:
 * quantized matvec for every type (odd row counts, column counts that are multiples of the block
 * but not of 256 * 8, batch 1..8), rmsnorm, add, swiglu, NeoX rope, router top-k, argmax, and
 * the fused MoE (gate+up+SwiGLU, down + weighted sum) over an expert plan.
 *
 * Tolerances for matvec: ||gpu - ref|| / ||m|| over a row of outputs, m[r] = sum_c |w_rc x_c|
 * (the scale of each dot, which rounding follows):
 *   quantized: <= 1e-5 against the same arithmetic in double (weights dequantized by the CPU
 *              backend, activations rounded to q8 on the host as the GPU does, which must match
 *              the device's bit for bit), and <= 5e-3 against the CPU backend's own dot
 *              products (its Q8_0 / Q8_K activations round differently);
 *   float:     <= 1e-5 against double and against the CPU backend.
 *   rmsnorm, swiglu, rope: max |gpu - cpu| <= 1e-5 * max(1, |cpu|) (rope 1e-4); add exact;
 *   router: the same expert ids, weights within 1e-5; argmax: the same index;
 *   moe: h within 1e-5 of the product rule's error scale, y <= 1e-5 as matvec (same rounding).
 * Outputs are poisoned with NaN bytes before each launch, so an unwritten element fails.
 *
 * Without a driver or GPU it checks the host-side pieces (the loader's error path, the embedded
 * fatbin, weight shape checks) and skips the rest, unless SIL_CUDA_REQUIRE=1 (check-cuda). */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/quants.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_fwd.h"
#include "kernels/cuda/cuda_slots.h"

extern const unsigned char sil_cuda_fatbin[];
extern const uint64_t sil_cuda_fatbin_size;

#define CUDA_TEST_SEED 0x9E3779B97F4A7C15ull
#include "tests/cuda_testutil.h"

static void fill(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = frand() * scale;
}


/* ---- host-side pieces (no GPU needed) -------------------------------------------------------- */

static void test_host_side(void)
{
    /* A fatbin starts with its magic 0xBA55ED50 (little-endian). */
    uint32_t magic;
    memcpy(&magic, sil_cuda_fatbin, 4);
    check(magic == 0xBA55ED50u && sil_cuda_fatbin_size > 1024,
          "host: embedded fatbin (%llu bytes, magic %08x)",
          (unsigned long long)sil_cuda_fatbin_size, magic);
    /* What the fatbin holds, read from its entries (kind 2: SASS for sm_N, kind 1: PTX for
     * compute_N; the architecture at byte 28 of an entry's header), against the list the build
     * says it embedded (CUDA_ARCHS and the PTX architecture). */
    char found[256] = "";
    size_t flen = 0;
    uint64_t fat_size = 0;
    uint16_t fhs = 0;
    memcpy(&fhs, sil_cuda_fatbin + 6, 2);
    memcpy(&fat_size, sil_cuda_fatbin + 8, 8);
    int parsed = fhs >= 16 && fhs + fat_size <= sil_cuda_fatbin_size;
    for (uint64_t off = fhs; parsed && off < fhs + fat_size;) {
        uint16_t kind;
        uint32_t ehs, arch;
        uint64_t size;
        if (off + 32 > fhs + fat_size) {
            parsed = 0;
            break;
        }
        memcpy(&kind, sil_cuda_fatbin + off, 2);
        memcpy(&ehs, sil_cuda_fatbin + off + 4, 4);
        memcpy(&size, sil_cuda_fatbin + off + 8, 8);
        memcpy(&arch, sil_cuda_fatbin + off + 28, 4);
        if (ehs < 32 || (kind != 1 && kind != 2) || size > fhs + fat_size - off - ehs) {
            parsed = 0;
            break;
        }
        flen += (size_t)snprintf(found + flen, sizeof found - flen, "%s%s_%u", flen ? " " : "",
                                 kind == 2 ? "sm" : "compute", arch);
        if (flen >= sizeof found - 1) {
            parsed = 0;
            break;
        }
        off += ehs + size;
    }
    const char *archs = sil_cuda_fatbin_archs();
    char want[256];
    snprintf(want, sizeof want, "%s", archs);
    int n_want = 0, n_have = 0;
    for (char *sp = NULL, *a = strtok_r(want, " ", &sp); a; a = strtok_r(NULL, " ", &sp)) {
        n_want++;
        const char *at = strstr(found, a);
        const size_t al = strlen(a);
        n_have += at && (at == found || at[-1] == ' ') && (at[al] == ' ' || at[al] == 0);
    }
    check(parsed && n_want > 0 && n_have == n_want && strstr(found, "compute_"),
          "host: fatbin entries \"%s\", the build's list \"%s\"", found, archs);

    /* The loader's error path: a driver library that is not there. */
    const struct sil_cuda_options nodrv = {.driver = "libcuda-does-not-exist.so.1"};
    struct sil_cuda *cu = (struct sil_cuda *)1;
    struct sil_error e = {0};
    int rc = sil_cuda_init(&cu, 0, &nodrv, &e);
    check(rc == -ENOENT && e.code == -ENOENT && cu == NULL && strstr(e.msg, "not found"),
          "host: missing driver is an error: rc %d \"%s\"", rc, e.msg);

    struct sil_cuda_weight w;
    e = (struct sil_error){0};
    rc = sil_cuda_weight_view(SIL_TYPE_Q4_K, 8, 300, 0, &w, &e);
    check(rc == -EINVAL && strstr(e.msg, "bad shape"), "host: q4_K with 300 columns refused: %s",
          e.msg);
    rc = sil_cuda_weight_view(SIL_TYPE_Q2_K, 8, 256, 0, &w, &e);
    check(rc == -ENOTSUP, "host: q2_K refused: %s", e.msg);
    rc = sil_cuda_weight_view(SIL_TYPE_Q6_K, 3, 512, 0, &w, &e);
    check(rc == 0 && w.row_bytes == 420 && w.bytes == 1260, "host: q6_K 3 x 512 is 3 x 420 bytes");
    check(sil_cuda_q8_bytes(3, 64) == 3 * 2 * SIL_CUDA_Q8_BLOCK_BYTES, "host: q8 buffer size");
}

/* ---- matvec ---------------------------------------------------------------------------------- */

struct mv_stats {
    double worst_same, worst_cpu;
    int runs;
    bool q8_exact;
};

static void matvec_case(struct sil_cuda *cu, int type, int rows, int cols, int nb,
                        struct mv_stats *st)
{
    const struct sil_type_traits *tt = sil_type_traits(type);
    const size_t rb = sil_row_size(type, cols);
    float *wf = xmalloc(sizeof(float) * (size_t)rows * cols);
    uint8_t *wq = xmalloc(rb * rows);
    float *x = xmalloc(sizeof(float) * (size_t)nb * cols);
    fill(wf, (int64_t)rows * cols, 1.0f);
    for (int r = 0; r < rows; r++) /* rows of different magnitude, some offset (mins matter) */
        for (int c = 0; c < cols; c++)
            wf[(size_t)r * cols + c] = wf[(size_t)r * cols + c] * (0.5f + (r % 5)) + 0.1f * (r % 3);
    for (int r = 0; r < rows; r++)
        sil_quantize_row_ref(type, wf + (size_t)r * cols, wq + rb * r, cols);
    fill(x, (int64_t)nb * cols, 2.0f);
    for (int r = 0; r < rows; r++) /* the weights as the CPU backend reads them */
        sil_dequantize_row(type, wq + rb * r, wf + (size_t)r * cols, cols);

    struct sil_cuda_weight w;
    CK(sil_cuda_weight_upload(cu, type, rows, cols, wq, rb * rows, &w, &err));
    sil_cuda_ptr dx, dq8 = 0, dy;
    const bool quant = tt->block_size > 1;
    CK(sil_cuda_alloc(cu, sizeof(float) * nb * cols, &dx, &err));
    CK(sil_cuda_alloc(cu, sizeof(float) * nb * (rows + 3), &dy, &err));
    CK(sil_cuda_upload(cu, dx, x, sizeof(float) * nb * cols, NULL, &err));
    if (quant) {
        CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(nb, cols), &dq8, &err));
        CK(sil_cuda_quantize_q8(cu, dx, nb, cols, dq8, NULL, &err));
    }
    CK(sil_cuda_memset(cu, dy, 0xff, sizeof(float) * nb * (rows + 3), NULL, &err));
    CK(sil_cuda_matvec(cu, &w, quant ? 0 : dx, dq8, nb, dy, rows + 3, NULL, &err));
    float *y = xmalloc(sizeof(float) * nb * (rows + 3));
    CK(sil_cuda_download(cu, y, dy, sizeof(float) * nb * (rows + 3), NULL, &err));
    uint8_t *q8dev = NULL;
    if (quant) {
        q8dev = xmalloc(sil_cuda_q8_bytes(nb, cols));
        CK(sil_cuda_download(cu, q8dev, dq8, sil_cuda_q8_bytes(nb, cols), NULL, &err));
    }
    CK(sil_cuda_sync(cu, NULL, &err));

    double *ref = xmalloc(sizeof(double) * rows);
    double *refc = xmalloc(sizeof(double) * rows), *mag = xmalloc(sizeof(double) * rows);
    float *d = xmalloc(sizeof(float) * cols / 32 + 4);
    int8_t *q = xmalloc(cols);
    const struct sil_type_traits *at = sil_type_traits(tt->vec_dot_type);
    uint8_t *xa = xmalloc(sil_row_size(tt->vec_dot_type, cols) + 64);
    float *cpu = xmalloc(sizeof(float) * rows);
    for (int j = 0; j < nb; j++) {
        const float *xj = x + (size_t)j * cols;
        if (quant) {
            host_q8(xj, cols, d, q);
            const int64_t nbk = (int64_t)nb * (cols / 32);
            for (int b = 0; b < cols / 32; b++) {
                const int64_t blk = (int64_t)j * (cols / 32) + b;
                float dd;
                memcpy(&dd, q8dev + nbk * 32 + blk * 8, 4);
                if (dd != d[b] || memcmp(q8dev + blk * 32, q + b * 32, 32) != 0)
                    st->q8_exact = false;
            }
        }
        for (int r = 0; r < rows; r++) {
            double s = 0, m = 0;
            const float *wr = wf + (size_t)r * cols;
            for (int c = 0; c < cols; c++) {
                s += (double)wr[c] * (quant ? (double)d[c / 32] * q[c] : (double)xj[c]);
                m += fabs((double)wr[c] * xj[c]);
            }
            ref[r] = s;
            mag[r] = m;
        }
        at->from_float_ref(xj, xa, cols);
        sil_vec_dot_rows(type, cols, wq, rb, rows, xa, cpu);
        for (int r = 0; r < rows; r++)
            refc[r] = cpu[r];
        const float *yj = y + (size_t)j * (rows + 3);
        const double e1 = nerr(yj, ref, mag, rows), e2 = nerr(yj, refc, mag, rows);
        st->worst_same = fmax(st->worst_same, e1);
        st->worst_cpu = fmax(st->worst_cpu, e2);
        if (!(e1 <= 1e-5) || !(e2 <= (quant ? 5e-3 : 1e-5)))
            printf("     %s %d x %d batch %d row %d: err %.3g (same rounding), %.3g (cpu)\n",
                   tt->name, rows, cols, nb, j, e1, e2);
        /* the padding past rows must stay untouched (poison) */
        for (int r = rows; r < rows + 3; r++)
            if (!isnan(yj[r])) st->worst_same = INFINITY;
    }
    st->runs++;
    free(ref), free(refc), free(mag), free(d), free(q), free(xa), free(cpu), free(q8dev), free(y);
    sil_cuda_release(cu, dx), sil_cuda_release(cu, dy), sil_cuda_release(cu, dq8);
    sil_cuda_weight_free(cu, &w);
    free(wf), free(wq), free(x);
}

static void test_matvec(struct sil_cuda *cu)
{
    static const int types[] = {SIL_TYPE_Q4_K, SIL_TYPE_Q5_K, SIL_TYPE_Q6_K, SIL_TYPE_Q8_0,
                                SIL_TYPE_Q4_0, SIL_TYPE_Q4_1, SIL_TYPE_Q5_0, SIL_TYPE_Q5_1,
                                SIL_TYPE_F16,  SIL_TYPE_BF16, SIL_TYPE_F32};
    static const int rows_l[] = {1, 7, 33, 130};
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        const int type = types[t];
        const int bs = (int)sil_type_traits(type)->block_size;
        /* columns: one block, a few blocks, and more than 256 * 8 but not a multiple of it;
         * for float types odd counts too (the scalar path) */
        int cols_l[4];
        if (bs == 256)
            cols_l[0] = 256, cols_l[1] = 768, cols_l[2] = 2304, cols_l[3] = 4096;
        else if (bs == 32)
            cols_l[0] = 32, cols_l[1] = 96, cols_l[2] = 2080, cols_l[3] = 4096;
        else
            cols_l[0] = 37, cols_l[1] = 96, cols_l[2] = 2050, cols_l[3] = 2048;
        struct mv_stats st = {.q8_exact = true};
        for (int ci = 0; ci < 4; ci++)
            for (int ri = 0; ri < 4; ri++)
                for (int nb = 1; nb <= SIL_CUDA_MAX_BATCH; nb++) {
                    if (ci == 3 && nb != 1 && nb != 8) /* the large case at the ends only */
                        continue;
                    matvec_case(cu, type, rows_l[ri], cols_l[ci], nb, &st);
                }
        const bool quant = bs > 1;
        check(st.worst_same <= 1e-5 && st.worst_cpu <= (quant ? 5e-3 : 1e-5) && st.q8_exact,
              "matvec %-5s %3d cases: err %.2e vs same rounding, %.2e vs cpu backend%s",
              sil_type_name(type), st.runs, st.worst_same, st.worst_cpu,
              quant ? (st.q8_exact ? ", q8 bit-exact" : ", q8 MISMATCH") : "");
    }
}

/* ---- element-wise and per-row ops ------------------------------------------------------------ */

static double max_rel(const float *a, const float *b, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a[i]) || !isfinite(b[i])) return INFINITY;
        m = fmax(m, fabs(a[i] - b[i]) / fmax(1.0, fabs(b[i])));
    }
    return m;
}

static sil_cuda_ptr dev_copy(struct sil_cuda *cu, const void *h, size_t bytes)
{
    sil_cuda_ptr p;
    CK(sil_cuda_alloc(cu, bytes, &p, &err));
    CK(sil_cuda_upload(cu, p, h, bytes, NULL, &err));
    return p;
}

static void get(struct sil_cuda *cu, void *h, sil_cuda_ptr p, size_t bytes)
{
    CK(sil_cuda_download(cu, h, p, bytes, NULL, &err));
    CK(sil_cuda_sync(cu, NULL, &err));
}

static void test_rmsnorm(struct sil_cuda *cu)
{
    static const int ns[] = {2048, 1000, 7};
    for (int t = 0; t < 3; t++) {
        const int rows = 5, n = ns[t];
        float *x = xmalloc(sizeof(float) * rows * n), *w = xmalloc(sizeof(float) * n);
        float *y = xmalloc(sizeof(float) * rows * n), *ref = xmalloc(sizeof(float) * rows * n);
        fill(x, rows * n, 3.0f);
        fill(w, n, 1.5f);
        sil_cuda_ptr dx = dev_copy(cu, x, sizeof(float) * rows * n);
        sil_cuda_ptr dw = dev_copy(cu, w, sizeof(float) * n), dy;
        CK(sil_cuda_alloc(cu, sizeof(float) * rows * n, &dy, &err));
        CK(sil_cuda_memset(cu, dy, 0xff, sizeof(float) * rows * n, NULL, &err));
        CK(sil_cuda_rmsnorm(cu, dy, dx, t == 2 ? 0 : dw, rows, n, 1e-6f, NULL, &err));
        get(cu, y, dy, sizeof(float) * rows * n);
        for (int r = 0; r < rows; r++)
            sil_rmsnorm(ref + r * n, x + r * n, t == 2 ? NULL : w, n, 1e-6f);
        const double e1 = max_rel(y, ref, rows * n);
        CK(sil_cuda_rmsnorm(cu, dx, dx, dw, rows, n, 1e-6f, NULL, &err)); /* in place */
        get(cu, y, dx, sizeof(float) * rows * n);
        const double e2 = t == 2 ? 0 : max_rel(y, ref, rows * n);
        check(e1 <= 1e-5 && e2 <= 1e-5, "rmsnorm %d x %d%s: max err %.2e, in place %.2e", rows, n,
              t == 2 ? " (no weight)" : "", e1, e2);
        sil_cuda_release(cu, dx), sil_cuda_release(cu, dw), sil_cuda_release(cu, dy);
        free(x), free(w), free(y), free(ref);
    }
}

static void test_add_swiglu(struct sil_cuda *cu)
{
    const int n = 100003;
    float *a = xmalloc(sizeof(float) * n), *b = xmalloc(sizeof(float) * n);
    float *y = xmalloc(sizeof(float) * n), *ref = xmalloc(sizeof(float) * n);
    fill(a, n, 8.0f);
    fill(b, n, 3.0f);
    sil_cuda_ptr da = dev_copy(cu, a, sizeof(float) * n), db = dev_copy(cu, b, sizeof(float) * n);
    sil_cuda_ptr dy;
    CK(sil_cuda_alloc(cu, sizeof(float) * n, &dy, &err));
    CK(sil_cuda_memset(cu, dy, 0xff, sizeof(float) * n, NULL, &err));
    CK(sil_cuda_swiglu(cu, dy, da, db, n, NULL, &err));
    get(cu, y, dy, sizeof(float) * n);
    sil_swiglu(ref, a, b, n);
    const double es = max_rel(y, ref, n);
    check(es <= 1e-5, "swiglu %d: max err %.2e", n, es);
    CK(sil_cuda_add(cu, da, db, n, NULL, &err));
    get(cu, y, da, sizeof(float) * n);
    memcpy(ref, a, sizeof(float) * n);
    sil_add(ref, b, n);
    check(memcmp(y, ref, sizeof(float) * n) == 0, "add %d: bit-exact", n);
    sil_cuda_release(cu, da), sil_cuda_release(cu, db), sil_cuda_release(cu, dy);
    free(a), free(b), free(y), free(ref);
}

static void test_rope(struct sil_cuda *cu)
{
    static const int shapes[][4] = {{5, 16, 256, 64}, {3, 4, 128, 128}, {2, 3, 64, 34}};
    for (int t = 0; t < 3; t++) {
        const int n_tok = shapes[t][0], n_head = shapes[t][1], hd = shapes[t][2];
        const int n_rot = shapes[t][3];
        const int64_t n = (int64_t)n_tok * n_head * hd;
        float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n);
        int32_t pos[8];
        fill(x, n, 2.0f);
        for (int i = 0; i < n_tok; i++)
            pos[i] = i == 0 ? 0 : (int32_t)((frand() + 1.0f) * 20000.0f);
        sil_cuda_ptr dx = dev_copy(cu, x, sizeof(float) * n);
        sil_cuda_ptr dp = dev_copy(cu, pos, sizeof(pos));
        CK(sil_cuda_rope_neox(cu, dx, n_tok, n_head, hd, n_rot, dp, 10000000.0f, NULL, &err));
        get(cu, y, dx, sizeof(float) * n);
        for (int i = 0; i < n_tok; i++)
            sil_rope_neox(x + (int64_t)i * n_head * hd, n_head, hd, n_rot, pos[i], 10000000.0f);
        const double e = max_rel(y, x, n);
        check(e <= 1e-4, "rope %d tok x %d heads x %d, n_rot %d, pos up to 40000: max err %.2e",
              n_tok, n_head, hd, n_rot, e);
        sil_cuda_release(cu, dx), sil_cuda_release(cu, dp);
        free(x), free(y);
    }
}

/* The CPU backend's router (forward_ffn.c): softmax, top k by repeated max, renormalised. */
static void cpu_route(float *p, int X, int K, int32_t *sel, float *w)
{
    sil_softmax(p, X);
    float sum = 0.0f;
    for (int k = 0; k < K; k++) {
        int best = -1;
        for (int e = 0; e < X; e++) {
            bool taken = false;
            for (int j = 0; j < k; j++)
                taken = taken || sel[j] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        sel[k] = best;
        w[k] = p[best];
        sum += p[best];
    }
    if (sum < 6.103515625e-5f) sum = 6.103515625e-5f;
    for (int k = 0; k < K; k++)
        w[k] /= sum;
}

static void test_router(struct sil_cuda *cu)
{
    static const int shapes[][3] = {{7, 256, 8}, {3, 100, 5}, {2, 1024, 32}, {1, 8, 8}};
    for (int t = 0; t < 4; t++) {
        const int n_tok = shapes[t][0], X = shapes[t][1], K = shapes[t][2];
        float *l = xmalloc(sizeof(float) * n_tok * X), *w = xmalloc(sizeof(float) * n_tok * K);
        float *rw = xmalloc(sizeof(float) * n_tok * K);
        int32_t *ids = xmalloc(sizeof(int32_t) * n_tok * K);
        int32_t *rids = xmalloc(sizeof(int32_t) * n_tok * K);
        fill(l, n_tok * X, 4.0f);
        sil_cuda_ptr dl = dev_copy(cu, l, sizeof(float) * n_tok * X), di, dw;
        CK(sil_cuda_alloc(cu, sizeof(int32_t) * n_tok * K, &di, &err));
        CK(sil_cuda_alloc(cu, sizeof(float) * n_tok * K, &dw, &err));
        CK(sil_cuda_memset(cu, dw, 0xff, sizeof(float) * n_tok * K, NULL, &err));
        CK(sil_cuda_router_topk(cu, dl, n_tok, X, K, di, dw, NULL, &err));
        get(cu, ids, di, sizeof(int32_t) * n_tok * K);
        get(cu, w, dw, sizeof(float) * n_tok * K);
        for (int i = 0; i < n_tok; i++)
            cpu_route(l + i * X, X, K, rids + i * K, rw + i * K);
        const bool same = memcmp(ids, rids, sizeof(int32_t) * n_tok * K) == 0;
        const double e = max_rel(w, rw, n_tok * K);
        check(same && e <= 1e-5, "router %d tok, %d experts, top %d: ids %s, weights err %.2e",
              n_tok, X, K, same ? "equal" : "DIFFER", e);
        sil_cuda_release(cu, dl), sil_cuda_release(cu, di), sil_cuda_release(cu, dw);
        free(l), free(w), free(rw), free(ids), free(rids);
    }
}

/* The fused router (F32 matvec + top-k, one launch) against sil_cuda_matvec then
 * sil_cuda_router_topk: logits, ids and weights bit for bit, for 1 to 8 tokens; launched three
 * times in a row (its counter must come back to zero) with the same answer. */
static void test_router_fused(struct sil_cuda *cu)
{
    static const int shapes[][3] = {{256, 2048, 8}, {100, 64, 5}, {1024, 96, 32}};
    for (int t = 0; t < 3; t++) {
        const int X = shapes[t][0], E = shapes[t][1], K = shapes[t][2];
        float *wf = xmalloc(sizeof(float) * X * E), *x = xmalloc(sizeof(float) * 8 * E);
        fill(wf, X * E, 0.2f);
        fill(x, 8 * E, 1.0f);
        struct sil_cuda_weight w;
        CK(sil_cuda_weight_upload(cu, SIL_TYPE_F32, X, E, wf, sizeof(float) * X * E, &w, &err));
        sil_cuda_ptr dx = dev_copy(cu, x, sizeof(float) * 8 * E), dl, dl2, di, di2, dw, dw2, done;
        CK(sil_cuda_alloc(cu, sizeof(float) * 8 * X, &dl, &err));
        CK(sil_cuda_alloc(cu, sizeof(float) * 8 * X, &dl2, &err));
        CK(sil_cuda_alloc(cu, sizeof(int32_t) * 8 * K, &di, &err));
        CK(sil_cuda_alloc(cu, sizeof(int32_t) * 8 * K, &di2, &err));
        CK(sil_cuda_alloc(cu, sizeof(float) * 8 * K, &dw, &err));
        CK(sil_cuda_alloc(cu, sizeof(float) * 8 * K, &dw2, &err));
        CK(sil_cuda_alloc(cu, sizeof(int32_t), &done, &err));
        CK(sil_cuda_memset(cu, done, 0, sizeof(int32_t), NULL, &err));
        bool same = true;
        for (int n = 1; n <= 8; n++) {
            CK(sil_cuda_matvec(cu, &w, dx, 0, n, dl, X, NULL, &err));
            CK(sil_cuda_router_topk(cu, dl, n, X, K, di, dw, NULL, &err));
            float l1[8 * 1024], l2[8 * 1024], w1[8 * 32], w2[8 * 32];
            int32_t i1[8 * 32], i2[8 * 32];
            get(cu, l1, dl, sizeof(float) * n * X);
            get(cu, i1, di, sizeof(int32_t) * n * K);
            get(cu, w1, dw, sizeof(float) * n * K);
            for (int rep = 0; rep < 3; rep++) {
                CK(sil_cuda_memset(cu, di2, 0xff, sizeof(int32_t) * 8 * K, NULL, &err));
                CK(sil_cuda_router_fused(cu, &w, dx, n, dl2, K, di2, dw2, done, NULL, &err));
                get(cu, l2, dl2, sizeof(float) * n * X);
                get(cu, i2, di2, sizeof(int32_t) * n * K);
                get(cu, w2, dw2, sizeof(float) * n * K);
                same = same && !memcmp(l1, l2, sizeof(float) * n * X) &&
                       !memcmp(i1, i2, sizeof(int32_t) * n * K) &&
                       !memcmp(w1, w2, sizeof(float) * n * K);
            }
        }
        int32_t left = -1;
        get(cu, &left, done, sizeof left);
        check(same && left == 0,
              "fused router %d experts x %d, top %d, 1..8 tokens, 3 launches each: %s, counter %d",
              X, E, K, same ? "bit for bit" : "DIFFERENT", left);
        sil_cuda_release(cu, dx), sil_cuda_release(cu, dl), sil_cuda_release(cu, dl2);
        sil_cuda_release(cu, di), sil_cuda_release(cu, di2), sil_cuda_release(cu, dw);
        sil_cuda_release(cu, dw2), sil_cuda_release(cu, done);
        sil_cuda_weight_free(cu, &w);
        free(wf), free(x);
    }
}

static int32_t cpu_argmax(const float *x, int64_t n)
{
    int32_t best = 0;
    float bv = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (x[i] > bv) bv = x[i], best = (int32_t)i;
    return best;
}

/* Every row's pick out[r] is the CPU's argmax of x's row r. */
static bool argmax_rows_ok(const int32_t *out, const float *x, int rows, int64_t n)
{
    for (int r = 0; r < rows; r++)
        if (out[r] != cpu_argmax(x + r * n, n)) return false;
    return true;
}

static void test_argmax(struct sil_cuda *cu)
{
    const int rows = 4;
    const int64_t n = 248320;
    float *x = xmalloc(sizeof(float) * rows * n);
    fill(x, rows * n, 10.0f);
    x[n + 777] = 50.0f; /* row 1: a tie, the first wins */
    x[n + 200001] = 50.0f;
    x[2 * n + 5] = NAN; /* row 2: NaN never wins */
    x[2 * n + 9] = 60.0f;
    x[2 * n + 10] = NAN;
    for (int64_t i = 0; i < n; i++) /* row 3: all -inf but one NaN: index 0 as on the CPU */
        x[3 * n + i] = i == 3 ? NAN : -INFINITY;
    sil_cuda_ptr dx = dev_copy(cu, x, sizeof(float) * rows * n), dout;
    CK(sil_cuda_alloc(cu, sizeof(int32_t) * rows, &dout, &err));
    /* three launches: the scratch must be left zero for the next */
    sil_cuda_ptr scratch;
    CK(sil_cuda_alloc(cu, SIL_CUDA_ARGMAX_SCRATCH(rows), &scratch, &err));
    CK(sil_cuda_memset(cu, scratch, 0, SIL_CUDA_ARGMAX_SCRATCH(rows), NULL, &err));
    for (int pass = 0; pass < 3; pass++) {
        CK(sil_cuda_memset(cu, dout, 0xff, sizeof(int32_t) * rows, NULL, &err));
        CK(sil_cuda_argmax(cu, dx, rows, n, dout, scratch, NULL, &err));
        int32_t out[4];
        get(cu, out, dout, sizeof out);
        check(argmax_rows_ok(out, x, rows, n) && out[1] == 777 && out[2] == 9 && out[3] == 0,
              "argmax %d x %lld (ties, NaN, all -inf), launch %d: %d %d %d %d", rows,
              (long long)n, pass + 1, out[0], out[1], out[2], out[3]);
    }
    /* a short row: fewer blocks than the most */
    {
        float y[3000];
        for (int i = 0; i < 3000; i++)
            y[i] = (float)(i % 1000);
        sil_cuda_ptr dy = dev_copy(cu, y, sizeof y);
        CK(sil_cuda_argmax(cu, dy, 1, 3000, dout, scratch, NULL, &err));
        int32_t o;
        get(cu, &o, dout, sizeof o);
        check(o == 999, "argmax of 3000 split over blocks: %d (want 999, the first maximum)", o);
        sil_cuda_release(cu, dy);
    }
    /* the rows again after that launch of one row and few blocks (as a verify pass's rows
     * after single decode steps): its partials must not count as a later row's */
    {
        CK(sil_cuda_memset(cu, dout, 0xff, sizeof(int32_t) * rows, NULL, &err));
        CK(sil_cuda_argmax(cu, dx, rows, n, dout, scratch, NULL, &err));
        int32_t out[4];
        get(cu, out, dout, sizeof out);
        check(argmax_rows_ok(out, x, rows, n), "argmax %d x %lld after a launch of 1 x 3000: %d %d %d %d", rows, (long long)n,
              out[0], out[1], out[2], out[3]);
    }
    sil_cuda_release(cu, dx), sil_cuda_release(cu, dout), sil_cuda_release(cu, scratch);
    free(x);
}

/* ---- fused MoE --------------------------------------------------------------------------------
 */

/* Random quantized rows of type, and their dequantized values (what the CPU backend reads). */
static uint8_t *rand_weight(int type, int64_t rows, int64_t cols, float *deq)
{
    const size_t rb = sil_row_size(type, cols);
    uint8_t *q = xmalloc(rb * rows);
    for (int64_t r = 0; r < rows; r++) {
        fill(deq + r * cols, cols, 0.5f + (float)(r % 3));
        sil_quantize_row_ref(type, deq + r * cols, q + rb * r, cols);
        sil_dequantize_row(type, q + rb * r, deq + r * cols, cols);
    }
    return q;
}

/* sum_c w[c] * dq8(x)[c] in double, and sum |w x| (the scale for the tolerance). */
static double dot_q8(const float *w, const float *x, int64_t n, double *mag)
{
    float d[256];
    int8_t q[8192];
    host_q8(x, n, d, q);
    double s = 0, m = 0;
    for (int64_t c = 0; c < n; c++) {
        s += (double)w[c] * d[c / 32] * q[c];
        m += fabs((double)w[c] * x[c]);
    }
    *mag = m;
    return s;
}

/* gate/up, the hidden rows' q8, down of n_tok tokens (q8 of x in dq8), both outputs to h, y. */
static void moe_run(struct sil_cuda *cu, const struct sil_cuda_weight *g,
                    const struct sil_cuda_weight *u, const struct sil_cuda_weight *d, int X,
                    sil_cuda_ptr dq8, int n_tok, sil_cuda_ptr di, sil_cuda_ptr dw, int K, int F,
                    int E, sil_cuda_ptr dh, sil_cuda_ptr dh8, sil_cuda_ptr dy, float *h, float *y)
{
    CK(sil_cuda_moe_gate_up(cu, g, u, X, dq8, n_tok, di, K, dh, 0, 0, NULL, &err));
    CK(sil_cuda_quantize_q8(cu, dh, n_tok * K, F, dh8, NULL, &err));
    CK(sil_cuda_moe_down(cu, d, X, dh8, n_tok, di, dw, K, dy, NULL, &err));
    get(cu, h, dh, sizeof(float) * n_tok * K * F);
    get(cu, y, dy, sizeof(float) * n_tok * E);
}

/* Page-aligned host copy of bytes, registered for the device (as the model mapping is). */
static void *pinned_copy(struct sil_cuda *cu, const void *src, size_t bytes, sil_cuda_ptr *dev)
{
    const size_t pg = 4096, len = (bytes + pg - 1) / pg * pg;
    void *p = NULL;
    if (posix_memalign(&p, pg, len) != 0) abort();
    memset(p, 0, len);
    memcpy(p, src, bytes);
    CK(sil_cuda_host_register(cu, p, len, &err));
    CK(sil_cuda_host_device_ptr(cu, p, dev, &err));
    return p;
}

/* The fused kernels over a slot pool backed by host memory (miss path (b)): experts 1, 4 and 7
 * in slots 2, 0 and 4 of a 5-slot pool (slot stride rounded up to 256 bytes), the rest read in
 * place from registered host copies of the stacks; h and y bit for bit those of the resident
 * stacks (want_h, want_y). */
static void moe_zero_copy(struct sil_cuda *cu, const struct sil_cuda_weight *g,
                          const struct sil_cuda_weight *u, const struct sil_cuda_weight *d,
                          const uint8_t *gq, const uint8_t *uq, const uint8_t *dq, int X,
                          sil_cuda_ptr dq8, int n_tok, sil_cuda_ptr di, sil_cuda_ptr dw, int K,
                          const float *want_h, const float *want_y)
{
    const int NS = 5, F = (int)(g->rows / X), E = (int)(d->rows / X);
    const size_t mg = g->row_bytes * (size_t)F, md = d->row_bytes * (size_t)E;
    const size_t sg = (mg + 255) & ~(size_t)255, sd = (md + 255) & ~(size_t)255;
    int32_t tab[64];
    for (int e = 0; e < X; e++)
        tab[e] = -1;
    tab[1] = 2, tab[4] = 0, tab[7] = 4;
    sil_cuda_ptr pg, pu, pd, hg, hu, hd, dt;
    CK(sil_cuda_alloc(cu, sg * NS, &pg, &err));
    CK(sil_cuda_alloc(cu, sg * NS, &pu, &err));
    CK(sil_cuda_alloc(cu, sd * NS, &pd, &err));
    CK(sil_cuda_memset(cu, pg, 0, sg * NS, NULL, &err));
    CK(sil_cuda_memset(cu, pu, 0, sg * NS, NULL, &err));
    CK(sil_cuda_memset(cu, pd, 0, sd * NS, NULL, &err));
    for (int e = 0; e < X; e++) {
        if (tab[e] < 0) continue;
        const uint64_t s = (uint64_t)tab[e];
        CK(sil_cuda_upload(cu, pg + s * sg, gq + mg * (size_t)e, mg, NULL, &err));
        CK(sil_cuda_upload(cu, pu + s * sg, uq + mg * (size_t)e, mg, NULL, &err));
        CK(sil_cuda_upload(cu, pd + s * sd, dq + md * (size_t)e, md, NULL, &err));
    }
    void *h_g = pinned_copy(cu, gq, mg * (size_t)X, &hg);
    void *h_u = pinned_copy(cu, uq, mg * (size_t)X, &hu);
    void *h_d = pinned_copy(cu, dq, md * (size_t)X, &hd);
    dt = dev_copy(cu, tab, sizeof(int32_t) * (size_t)X);
    struct sil_cuda_weight zg, zu, zd;
    CK(sil_cuda_weight_view(g->type, g->rows, g->cols, pg, &zg, &err));
    CK(sil_cuda_weight_view(u->type, u->rows, u->cols, pu, &zu, &err));
    CK(sil_cuda_weight_view(d->type, d->rows, d->cols, pd, &zd, &err));
    zg.mat_stride = zu.mat_stride = sg;
    zd.mat_stride = sd;
    zg.host = hg, zu.host = hu, zd.host = hd;
    zg.host_stride = zu.host_stride = mg;
    zd.host_stride = md;
    zg.tab = zu.tab = zd.tab = dt;
    zg.n_slot = zu.n_slot = zd.n_slot = NS;
    sil_cuda_ptr dh, dh8, dy;
    CK(sil_cuda_alloc(cu, sizeof(float) * n_tok * K * F, &dh, &err));
    CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(n_tok * K, F), &dh8, &err));
    CK(sil_cuda_alloc(cu, sizeof(float) * n_tok * E, &dy, &err));
    float *h = xmalloc(sizeof(float) * n_tok * K * F), *y = xmalloc(sizeof(float) * n_tok * E);
    moe_run(cu, &zg, &zu, &zd, X, dq8, n_tok, di, dw, K, F, E, dh, dh8, dy, h, y);
    bool same = !memcmp(h, want_h, sizeof(float) * n_tok * K * F) &&
                !memcmp(y, want_y, sizeof(float) * n_tok * E);
    /* a slot out of range in the table: NaN, not a read past the pool */
    tab[1] = NS;
    CK(sil_cuda_upload(cu, dt, tab, sizeof(int32_t) * (size_t)X, NULL, &err));
    CK(sil_cuda_moe_gate_up(cu, &zg, &zu, X, dq8, n_tok, di, K, dh, 0, 0, NULL, &err));
    get(cu, h, dh, sizeof(float) * n_tok * K * F);
    int32_t ids[64];
    get(cu, ids, di, sizeof(int32_t) * n_tok * K);
    bool nan_ok = true, any1 = false;
    for (int p = 0; p < n_tok * K; p++) {
        const bool bad = ids[p] == 1;
        any1 = any1 || bad;
        nan_ok = nan_ok && (bad ? isnan(h[p * F]) : !memcmp(h + p * F, want_h + p * F, 4 * F));
    }
    check(same && nan_ok,
          "moe %s/%s %d tok, experts in slots and read in place from host memory (a slot "
          "table): %s, a bad slot %s",
          sil_type_name(g->type), sil_type_name(d->type), n_tok,
          same ? "bit for bit" : "DIFFERENT",
          !any1 ? "not routed" : nan_ok ? "gives NaN" : "MISSED");
    sil_cuda_release(cu, dh), sil_cuda_release(cu, dh8), sil_cuda_release(cu, dy);
    sil_cuda_release(cu, pg), sil_cuda_release(cu, pu), sil_cuda_release(cu, pd);
    sil_cuda_release(cu, dt);
    sil_cuda_host_unregister(cu, h_g), sil_cuda_host_unregister(cu, h_u);
    sil_cuda_host_unregister(cu, h_d);
    free(h_g), free(h_u), free(h_d), free(h), free(y);
}

static void moe_case(struct sil_cuda *cu, int type, int dtype, int n_tok)
{
    const int X = 12, K = 4, E = 256, F = 512; /* experts, top-k, n_embd, n_ff */
    float *gf = xmalloc(sizeof(float) * X * F * E), *uf = xmalloc(sizeof(float) * X * F * E);
    float *df = xmalloc(sizeof(float) * X * E * F);
    uint8_t *gq = rand_weight(type, (int64_t)X * F, E, gf);
    uint8_t *uq = rand_weight(type, (int64_t)X * F, E, uf);
    uint8_t *dq = rand_weight(dtype, (int64_t)X * E, F, df);
    float *x = xmalloc(sizeof(float) * n_tok * E), wts[8 * 4];
    int32_t ids[8 * 4];
    fill(x, n_tok * E, 2.0f);
    for (int t = 0; t < n_tok; t++)
        for (int j = 0; j < K; j++) { /* distinct experts per token, some shared across tokens */
            ids[t * K + j] = (t * 5 + j * 3 + (j > 1 ? 1 : 0)) % X;
            wts[t * K + j] = 0.1f + 0.2f * (frand() + 1.0f);
        }
    struct sil_cuda_weight g, u, d;
    CK(sil_cuda_weight_upload(cu, type, (int64_t)X * F, E, gq, sil_row_size(type, E) * X * F, &g,
                              &err));
    CK(sil_cuda_weight_upload(cu, type, (int64_t)X * F, E, uq, sil_row_size(type, E) * X * F, &u,
                              &err));
    CK(sil_cuda_weight_upload(cu, dtype, (int64_t)X * E, F, dq, sil_row_size(dtype, F) * X * E, &d,
                              &err));
    sil_cuda_ptr dx = dev_copy(cu, x, sizeof(float) * n_tok * E);
    sil_cuda_ptr di = dev_copy(cu, ids, sizeof(int32_t) * n_tok * K);
    sil_cuda_ptr dw = dev_copy(cu, wts, sizeof(float) * n_tok * K);
    sil_cuda_ptr dq8, dh, dh8, dy;
    CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(n_tok, E), &dq8, &err));
    CK(sil_cuda_alloc(cu, sizeof(float) * n_tok * K * F, &dh, &err));
    CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(n_tok * K, F), &dh8, &err));
    CK(sil_cuda_alloc(cu, sizeof(float) * n_tok * E, &dy, &err));
    CK(sil_cuda_memset(cu, dh, 0xff, sizeof(float) * n_tok * K * F, NULL, &err));
    CK(sil_cuda_memset(cu, dy, 0xff, sizeof(float) * n_tok * E, NULL, &err));
    CK(sil_cuda_quantize_q8(cu, dx, n_tok, E, dq8, NULL, &err));
    float *h = xmalloc(sizeof(float) * n_tok * K * F), *y = xmalloc(sizeof(float) * n_tok * E);
    moe_run(cu, &g, &u, &d, X, dq8, n_tok, di, dw, K, F, E, dh, dh8, dy, h, y);
    /* gate/up rounding h to q8 in its last blocks (twice: the counters come back to zero) */
    {
        sil_cuda_ptr done, dh8b;
        CK(sil_cuda_alloc(cu, sizeof(int32_t) * n_tok * K, &done, &err));
        CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(n_tok * K, F), &dh8b, &err));
        CK(sil_cuda_memset(cu, done, 0, sizeof(int32_t) * n_tok * K, NULL, &err));
        const size_t qb = sil_cuda_q8_bytes(n_tok * K, F);
        uint8_t *q1 = xmalloc(qb), *q2 = xmalloc(qb);
        get(cu, q1, dh8, sil_cuda_q8_bytes(n_tok * K, F));
        bool same = true;
        for (int rep = 0; rep < 2; rep++) {
            CK(sil_cuda_memset(cu, dh8b, 0xff, sil_cuda_q8_bytes(n_tok * K, F), NULL, &err));
            CK(sil_cuda_moe_gate_up(cu, &g, &u, X, dq8, n_tok, di, K, dh, dh8b, done, NULL, &err));
            get(cu, q2, dh8b, sil_cuda_q8_bytes(n_tok * K, F));
            same = same && !memcmp(q1, q2, sil_cuda_q8_bytes(n_tok * K, F));
        }
        int32_t cnt[64];
        get(cu, cnt, done, sizeof(int32_t) * n_tok * K);
        bool zero = true;
        for (int i = 0; i < n_tok * K; i++)
            zero = zero && cnt[i] == 0;
        check(same && zero, "moe %s gate/up, %d tok: q8 of h in its last blocks %s, counters %s",
              sil_type_name(type), n_tok, same ? "bit for bit" : "DIFFERENT",
              zero ? "back to 0" : "LEFT");
        sil_cuda_release(cu, done), sil_cuda_release(cu, dh8b);
        free(q1), free(q2);
    }

    /* h against silu(g) * u from the same-rounding dots; the error scale is the product rule's */
    double eh = 0, ey_num = 0, ey_den = 0;
    for (int p = 0; p < n_tok * K; p++) {
        const int t = p / K, e = ids[p];
        for (int r = 0; r < F; r++) {
            double mg, mu;
            const double gv = dot_q8(gf + ((int64_t)e * F + r) * E, x + t * E, E, &mg);
            const double uv = dot_q8(uf + ((int64_t)e * F + r) * E, x + t * E, E, &mu);
            const double sg = gv / (1.0 + exp(-gv));
            const double hv = sg * uv, scale = fabs(sg) * mu + fabs(uv) * 1.1 * mg + 1e-30;
            const double err1 = isfinite(h[p * F + r]) ? fabs(h[p * F + r] - hv) / scale : INFINITY;
            eh = fmax(eh, err1);
        }
    }
    /* y against the down projection of the GPU's own h (isolates the down kernel) */
    for (int t = 0; t < n_tok; t++)
        for (int r = 0; r < E; r++) {
            double sum = 0, mag = 0;
            for (int j = 0; j < K; j++) {
                const int p = t * K + j;
                double m;
                sum += wts[p] * dot_q8(df + ((int64_t)ids[p] * E + r) * F, h + p * F, F, &m);
                mag += wts[p] * m;
            }
            const double yv = y[t * E + r];
            ey_num += isfinite(yv) ? (yv - sum) * (yv - sum) : INFINITY;
            ey_den += mag * mag;
        }
    const double ey = sqrt(ey_num / ey_den);
    check(eh <= 1e-5 && ey <= 1e-5,
          "moe %s gate/up + %s down, %d experts top %d, %d tok: h err %.2e, y err %.2e",
          sil_type_name(type), sil_type_name(dtype), X, K, n_tok, eh, ey);
    moe_zero_copy(cu, &g, &u, &d, gq, uq, dq, X, dq8, n_tok, di, dw, K, h, y);
    sil_cuda_release(cu, dx), sil_cuda_release(cu, di), sil_cuda_release(cu, dw);
    sil_cuda_release(cu, dq8), sil_cuda_release(cu, dh), sil_cuda_release(cu, dh8);
    sil_cuda_release(cu, dy);
    sil_cuda_weight_free(cu, &g), sil_cuda_weight_free(cu, &u), sil_cuda_weight_free(cu, &d);
    free(gf), free(uf), free(df), free(gq), free(uq), free(dq), free(x), free(h), free(y);
}

static void test_moe(struct sil_cuda *cu)
{
    static const int types[][2] = {{SIL_TYPE_Q4_K, SIL_TYPE_Q6_K}, {SIL_TYPE_Q4_K, SIL_TYPE_Q4_K},
                                   {SIL_TYPE_Q5_K, SIL_TYPE_Q6_K}, {SIL_TYPE_Q6_K, SIL_TYPE_Q5_K},
                                   {SIL_TYPE_Q8_0, SIL_TYPE_Q8_0}, {SIL_TYPE_Q4_0, SIL_TYPE_Q4_1},
                                   {SIL_TYPE_Q5_0, SIL_TYPE_Q5_1}};
    for (size_t i = 0; i < sizeof types / sizeof *types; i++)
        for (int n_tok = 1; n_tok <= 3; n_tok += 2)
            moe_case(cu, types[i][0], types[i][1], n_tok);
}

static void test_bad_args(struct sil_cuda *cu)
{
    struct sil_cuda_weight w;
    struct sil_error e = {0};
    uint8_t blk[144] = {0};
    int rc = sil_cuda_weight_upload(cu, SIL_TYPE_Q4_K, 1, 256, blk, 143, &w, &e);
    check(rc == -EINVAL, "args: upload with the wrong byte count refused: %s", e.msg);
    CK(sil_cuda_weight_upload(cu, SIL_TYPE_Q4_K, 1, 256, blk, 144, &w, &err));
    rc = sil_cuda_matvec(cu, &w, 0, 0, 1, 0, 1, NULL, &e);
    check(rc == -EINVAL, "args: quantized matvec without q8 input refused: %s", e.msg);
    rc = sil_cuda_matvec(cu, &w, 0, 1, 9, 0, 1, NULL, &e);
    check(rc == -EINVAL, "args: batch 9 refused: %s", e.msg);
    rc = sil_cuda_argmax(cu, 1, 1, 10, 1, 0, NULL, &e);
    check(rc == -EINVAL, "args: argmax without its scratch refused: %s", e.msg);
    sil_cuda_weight_free(cu, &w);
    sil_cuda_ptr p;
    rc = sil_cuda_alloc(cu, (size_t)1 << 50, &p, &e);
    check(rc == -ENOMEM && p == 0, "args: a 1 PiB allocation fails cleanly: %s", e.msg);
}

/* Four random weights of types[k] and rows[k] rows of cols on the device, wp[k] = &w[k]. */
static void upload_four(struct sil_cuda *cu, const int types[4], const int rows[4], int64_t cols,
                        struct sil_cuda_weight w[4], const struct sil_cuda_weight *wp[4])
{
    float *deq = xmalloc(sizeof(float) * 256 * cols);
    for (int k = 0; k < 4; k++) {
        uint8_t *q = rand_weight(types[k], rows[k], cols, deq);
        CK(sil_cuda_weight_upload(cu, types[k], rows[k], cols, q,
                                  sil_row_size(types[k], cols) * rows[k], &w[k], &err));
        free(q);
        wp[k] = &w[k];
    }
    free(deq);
}

/* Four weights of types[k] and rows[k] rows sharing one input of n rows, as one matvec set and
 * as four matvecs (outputs ld[k] = rows[k] + pad apart): true when every output is the same to
 * the bit. */
static bool set_matches_matvecs(struct sil_cuda *cu, const int types[4], const int rows[4],
                                int64_t cols, int n, int pad)
{
    struct sil_cuda_weight w[4];
    const struct sil_cuda_weight *wp[4];
    sil_cuda_ptr ys[4], yr[4];
    int64_t ld[4];
    upload_four(cu, types, rows, cols, w, wp);
    for (int k = 0; k < 4; k++) {
        ld[k] = rows[k] + pad;
        CK(sil_cuda_alloc(cu, sizeof(float) * (size_t)(n * ld[k]), &ys[k], &err));
        CK(sil_cuda_alloc(cu, sizeof(float) * (size_t)(n * ld[k]), &yr[k], &err));
        CK(sil_cuda_memset(cu, ys[k], 0, sizeof(float) * (size_t)(n * ld[k]), NULL, &err));
        CK(sil_cuda_memset(cu, yr[k], 0, sizeof(float) * (size_t)(n * ld[k]), NULL, &err));
    }
    float *x = xmalloc(sizeof(float) * (size_t)(n * cols));
    fill(x, n * cols, 1.0f);
    sil_cuda_ptr xd = dev_copy(cu, x, sizeof(float) * (size_t)(n * cols)), q8;
    CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(n, cols), &q8, &err));
    CK(sil_cuda_quantize_q8(cu, xd, n, cols, q8, NULL, &err));
    CK(sil_cuda_matvec_multi(cu, wp, 4, q8, n, ys, ld, NULL, &err));
    for (int k = 0; k < 4; k++)
        CK(sil_cuda_matvec(cu, &w[k], xd, q8, n, yr[k], ld[k], NULL, &err));
    bool same = true;
    for (int k = 0; k < 4; k++) {
        const size_t bytes = sizeof(float) * (size_t)(n * ld[k]);
        float *a = xmalloc(bytes), *b = xmalloc(bytes);
        get(cu, a, ys[k], bytes);
        get(cu, b, yr[k], bytes);
        same = same && memcmp(a, b, bytes) == 0;
        free(a);
        free(b);
        sil_cuda_release(cu, ys[k]);
        sil_cuda_release(cu, yr[k]);
        sil_cuda_weight_free(cu, &w[k]);
    }
    sil_cuda_release(cu, xd);
    sil_cuda_release(cu, q8);
    free(x);
    return same;
}

/* A matvec set (several weights sharing the input, one launch) gives exactly what each weight's
 * own matvec gives, for odd row counts and every batch: of one type, and of the types that may
 * mix; a set mixing another type is refused. */
static void test_matvec_set(struct sil_cuda *cu)
{
    const int types[] = {SIL_TYPE_Q4_K, SIL_TYPE_Q6_K, SIL_TYPE_Q8_0};
    const int rows[] = {37, 256, 5, 129};
    const int64_t cols = 512;
    for (size_t t = 0; t < sizeof types / sizeof types[0]; t++)
        for (int n = 1; n <= SIL_CUDA_MAX_BATCH; n += 3) {
            const int tt[4] = {types[t], types[t], types[t], types[t]};
            check(set_matches_matvecs(cu, tt, rows, cols, n, 3),
                  "matvec set of 4 %s weights (37, 256, 5, 129 rows), batch %d: bit-identical "
                  "to 4 matvecs",
                  sil_type_name(types[t]), n);
        }
    {
        const int mt[4] = {SIL_TYPE_Q6_K, SIL_TYPE_Q4_K, SIL_TYPE_Q8_0, SIL_TYPE_Q5_K};
        for (int n = 1; n <= SIL_CUDA_MAX_BATCH; n += 7)
            check(set_matches_matvecs(cu, mt, rows, cols, n, 0),
                  "matvec set of q6_K, q4_K, q8_0 and q5_K weights, batch %d: bit-identical to "
                  "4 matvecs",
                  n);
        struct sil_cuda_weight a, c;
        float *dq = xmalloc(sizeof(float) * 4 * cols);
        uint8_t *qa = rand_weight(SIL_TYPE_Q4_K, 4, cols, dq);
        uint8_t *qc = rand_weight(SIL_TYPE_Q4_0, 4, cols, dq);
        CK(sil_cuda_weight_upload(cu, SIL_TYPE_Q4_K, 4, cols, qa,
                                  sil_row_size(SIL_TYPE_Q4_K, cols) * 4, &a, &err));
        CK(sil_cuda_weight_upload(cu, SIL_TYPE_Q4_0, 4, cols, qc,
                                  sil_row_size(SIL_TYPE_Q4_0, cols) * 4, &c, &err));
        const struct sil_cuda_weight *pair[2] = {&a, &c};
        sil_cuda_ptr yy[2] = {1, 1};
        int64_t ll[2] = {4, 4};
        struct sil_error e2 = {0};
        check(sil_cuda_matvec_multi(cu, pair, 2, 1, 1, yy, ll, NULL, &e2) == -EINVAL,
              "matvec set of q4_K and q4_0 refused: %s", e2.msg);
        sil_cuda_weight_free(cu, &a), sil_cuda_weight_free(cu, &c);
        free(qa), free(qc), free(dq);
    }
    const struct sil_cuda_weight *none[1] = {NULL};
    sil_cuda_ptr y0 = 0;
    int64_t l0 = 0;
    check(sil_cuda_matvec_multi(cu, none, 0, 0, 1, &y0, &l0, NULL, &err) == -EINVAL,
          "matvec set of 0 weights refused: %s", err.msg);
}

/* Two buffers of bytes on the device the same. */
static bool dev_same(struct sil_cuda *cu, sil_cuda_ptr a, sil_cuda_ptr b, size_t bytes)
{
    uint8_t *ha = xmalloc(bytes), *hb = xmalloc(bytes);
    get(cu, ha, a, bytes);
    get(cu, hb, b, bytes);
    const bool same = memcmp(ha, hb, bytes) == 0;
    free(ha);
    free(hb);
    return same;
}

/* The add + rmsnorm + q8 before a decode MoE done by every block of its router
 * (sil_cuda_router_norm) against the engine's own add + rmsnorm + q8 launch (fwd.cu) followed by
 * the fused router: x, y, y's q8 blocks, logits, ids and weights bit for bit, for widths of
 * each of the norm's block sizes (128, 512 and 1024 threads), whole or not; twice in a row (the
 * counter comes back to zero). Refused for rows of part of a q8 block or above 4096. */
static void test_router_norm(struct sil_cuda *cu, const struct sil_cuda_fwd *fwd)
{
    static const int widths[] = {256, 896, 1056, 1536, 2048, 4096, 100, 4128};
    const int X = 256, K = 8;
    for (size_t t = 0; t < sizeof widths / sizeof widths[0]; t++) {
        const int64_t n = widths[t];
        float *wf = xmalloc(sizeof(float) * X * n), *x = xmalloc(sizeof(float) * n);
        float *d = xmalloc(sizeof(float) * n), *nw = xmalloc(sizeof(float) * n);
        fill(wf, X * n, 0.2f);
        fill(x, n, 1.0f);
        fill(d, n, 0.5f);
        fill(nw, n, 1.0f);
        struct sil_cuda_weight w;
        CK(sil_cuda_weight_upload(cu, SIL_TYPE_F32, X, n, wf, sizeof(float) * X * n, &w, &err));
        const size_t row = sizeof(float) * (size_t)n;
        sil_cuda_ptr dd = dev_copy(cu, d, row), dn = dev_copy(cu, nw, row);
        sil_cuda_ptr xa = dev_copy(cu, x, row), xb = dev_copy(cu, x, row);
        sil_cuda_ptr ya, yb, qa, qb, la, lb, ia, ib, wa, wb, done;
        const size_t qbytes = sil_cuda_q8_bytes(1, n);
        CK(sil_cuda_alloc(cu, sizeof(float) * n, &ya, &err));
        CK(sil_cuda_alloc(cu, sizeof(float) * n, &yb, &err));
        CK(sil_cuda_alloc(cu, qbytes, &qa, &err));
        CK(sil_cuda_alloc(cu, qbytes, &qb, &err));
        CK(sil_cuda_alloc(cu, sizeof(float) * X, &la, &err));
        CK(sil_cuda_alloc(cu, sizeof(float) * X, &lb, &err));
        CK(sil_cuda_alloc(cu, sizeof(int32_t) * K, &ia, &err));
        CK(sil_cuda_alloc(cu, sizeof(int32_t) * K, &ib, &err));
        CK(sil_cuda_alloc(cu, sizeof(float) * K, &wa, &err));
        CK(sil_cuda_alloc(cu, sizeof(float) * K, &wb, &err));
        CK(sil_cuda_alloc(cu, sizeof(int32_t), &done, &err));
        CK(sil_cuda_memset(cu, done, 0, sizeof(int32_t), NULL, &err));
        bool ok_all = sil_cuda_router_norm_ok(n);
        float eps = 1e-6f;
        for (int rep = 0; rep < 2 && ok_all; rep++) {
            CK(sil_cuda_upload(cu, xa, x, sizeof(float) * n, NULL, &err));
            CK(sil_cuda_upload(cu, xb, x, sizeof(float) * n, NULL, &err));
            CK(sil_cuda_memset(cu, qb, 0x55, qbytes, NULL, &err)); /* what it leaves shows */
            CK(sil_cuda_memset(cu, yb, 0x55, sizeof(float) * n, NULL, &err));
            CK(sil_cuda_memset(cu, ib, 0xff, sizeof(int32_t) * K, NULL, &err));
            CK(sil_cuda_fwd_add_rmsnorm_q8(cu, fwd, xa, dd, ya, dn, 1, n, eps, qa, n / 32, NULL,
                                           &err));
            CK(sil_cuda_router_fused(cu, &w, ya, 1, la, K, ia, wa, done, NULL, &err));
            const struct sil_cuda_norm_in nt = {xb, dn, yb, qb, done, eps};
            CK(sil_cuda_router_norm(cu, &w, dd, &nt, lb, K, ib, wb, NULL, &err));
            ok_all = ok_all && dev_same(cu, xa, xb, sizeof(float) * n) &&
                     dev_same(cu, ya, yb, sizeof(float) * n) && dev_same(cu, qa, qb, qbytes) &&
                     dev_same(cu, la, lb, sizeof(float) * X) &&
                     dev_same(cu, ia, ib, sizeof(int32_t) * K) &&
                     dev_same(cu, wa, wb, sizeof(float) * K);
        }
        int32_t left = -1;
        get(cu, &left, done, sizeof left);
        if (sil_cuda_router_norm_ok(n)) {
            check(ok_all && left == 0,
                  "router with its add + rmsnorm + q8, width %lld, %d experts top %d, twice: %s, "
                  "counter %d",
                  (long long)n, X, K, ok_all ? "bit for bit" : "DIFFERENT", left);
        } else {
            const struct sil_cuda_norm_in nt = {xb, dn, yb, qb, done, eps};
            struct sil_error e2 = {0};
            check(sil_cuda_router_norm(cu, &w, dd, &nt, lb, K, ib, wb, NULL, &e2) == -EINVAL,
                  "router with its norm refused at width %lld: %s", (long long)n, e2.msg);
        }
        sil_cuda_ptr all[] = {dd, dn, xa, xb, ya, yb, qa, qb, la, lb, ia, ib, wa, wb, done};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            sil_cuda_release(cu, all[i]);
        sil_cuda_weight_free(cu, &w);
        free(wf), free(x), free(d), free(nw);
    }
}

/* A matvec set whose weight 0 writes the delta net's qkv_mixed with the conv1d in its launch
 * (sil_cuda_matvec_multi_conv) against the set, then the engine's conv1d kernel (fwd.cu): every
 * output, the conv's output and the conv states bit for bit, batch 1 to 8 (a run a row, two
 * sequences' states interleaved with others), conv kernels of 4 and 3 taps, types mixed. */
static void test_matvec_conv(struct sil_cuda *cu, const struct sil_cuda_fwd *fwd)
{
    const int types[4] = {SIL_TYPE_Q6_K, SIL_TYPE_Q4_K, SIL_TYPE_Q8_0, SIL_TYPE_Q4_K};
    const int rows[4] = {200, 64, 9, 9}; /* cd = 200 */
    const int64_t cols = 256, cd = 200;
    struct sil_cuda_weight w[4];
    const struct sil_cuda_weight *wp[4];
    upload_four(cu, types, rows, cols, w, wp);
    const int n_seq = 10, NB = SIL_CUDA_MAX_BATCH;
    const int64_t off = 7, st_floats = off + 8 * cd; /* per sequence: 7 others, then the state */
    for (int K = 4; K >= 3; K--) {
        bool same = true;
        for (int n = 1; n <= NB; n++) {
            float *x = xmalloc(sizeof(float) * n * cols), *cw = xmalloc(sizeof(float) * cd * K);
            float *st = xmalloc(sizeof(float) * n_seq * st_floats);
            fill(x, n * cols, 1.0f);
            fill(cw, cd * K, 0.5f);
            fill(st, n_seq * st_floats, 1.0f);
            int32_t run_start[NB + 1], run_seq[NB];
            for (int r = 0; r <= n; r++)
                run_start[r] = r;
            for (int r = 0; r < n; r++)
                run_seq[r] = (3 * r + 1) % n_seq;
            sil_cuda_ptr xd = dev_copy(cu, x, sizeof(float) * n * cols), q8;
            sil_cuda_ptr cwd = dev_copy(cu, cw, sizeof(float) * cd * K);
            sil_cuda_ptr rs = dev_copy(cu, run_start, sizeof run_start);
            sil_cuda_ptr rq = dev_copy(cu, run_seq, sizeof run_seq);
            sil_cuda_ptr sa = dev_copy(cu, st, sizeof(float) * n_seq * st_floats);
            sil_cuda_ptr sb = dev_copy(cu, st, sizeof(float) * n_seq * st_floats);
            uint64_t ta[16] = {0}, tb[16] = {0};
            for (int i = 0; i < n_seq; i++) {
                ta[i] = sa + (uint64_t)(i * st_floats) * sizeof(float);
                tb[i] = sb + (uint64_t)(i * st_floats) * sizeof(float);
            }
            sil_cuda_ptr tad = dev_copy(cu, ta, sizeof ta), tbd = dev_copy(cu, tb, sizeof tb);
            sil_cuda_ptr ya[4], yb[4], oa, ob;
            int64_t ld[4];
            for (int k = 0; k < 4; k++) {
                ld[k] = rows[k] + (k == 0 ? 0 : 3);
                CK(sil_cuda_alloc(cu, sizeof(float) * n * ld[k], &ya[k], &err));
                CK(sil_cuda_alloc(cu, sizeof(float) * n * ld[k], &yb[k], &err));
                CK(sil_cuda_memset(cu, ya[k], 0, sizeof(float) * n * ld[k], NULL, &err));
                CK(sil_cuda_memset(cu, yb[k], 0, sizeof(float) * n * ld[k], NULL, &err));
            }
            const int64_t ldo = cd + 5;
            CK(sil_cuda_alloc(cu, sizeof(float) * n * ldo, &oa, &err));
            CK(sil_cuda_alloc(cu, sizeof(float) * n * ldo, &ob, &err));
            CK(sil_cuda_memset(cu, oa, 0, sizeof(float) * n * ldo, NULL, &err));
            CK(sil_cuda_memset(cu, ob, 0, sizeof(float) * n * ldo, NULL, &err));
            CK(sil_cuda_alloc(cu, sil_cuda_q8_bytes(n, cols), &q8, &err));
            CK(sil_cuda_quantize_q8(cu, xd, n, cols, q8, NULL, &err));
            CK(sil_cuda_matvec_multi(cu, wp, 4, q8, n, ya, ld, NULL, &err));
            CK(sil_cuda_fwd_conv1d(cu, fwd, ya[0], ld[0], oa, ldo, cwd, K, cd, rs, rq, tad, off,
                                   n, NULL, &err));
            const struct sil_cuda_conv_ep ep = {ob, ldo, cwd, rq, tbd, off, K};
            CK(sil_cuda_matvec_multi_conv(cu, wp, 4, q8, n, yb, ld, &ep, NULL, &err));
            for (int k = 0; k < 4; k++)
                same = same && dev_same(cu, ya[k], yb[k], sizeof(float) * n * ld[k]);
            same = same && dev_same(cu, oa, ob, sizeof(float) * n * ldo) &&
                   dev_same(cu, sa, sb, sizeof(float) * n_seq * st_floats);
            sil_cuda_ptr all[] = {xd, q8, cwd, rs, rq, sa, sb, tad, tbd, oa, ob};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
                sil_cuda_release(cu, all[i]);
            for (int k = 0; k < 4; k++)
                sil_cuda_release(cu, ya[k]), sil_cuda_release(cu, yb[k]);
            free(x), free(cw), free(st);
        }
        check(same, "matvec set of q6_K, q4_K, q8_0, q4_K with the conv1d (%d taps) in its "
                    "launch, batch 1..8: %s to the set then the conv1d kernel",
              K, same ? "bit-identical" : "DIFFERENT");
    }
    {
        const struct sil_cuda_conv_ep bad = {1, 100, 1, 1, 1, 0, 10};
        sil_cuda_ptr y0[4] = {1, 1, 1, 1};
        int64_t l0[4] = {200, 64, 9, 9};
        struct sil_error e2 = {0};
        check(sil_cuda_matvec_multi_conv(cu, wp, 4, 1, 1, y0, l0, &bad, NULL, &e2) == -EINVAL,
              "matvec set with a conv1d of 10 taps refused: %s", e2.msg);
    }
    for (int k = 0; k < 4; k++)
        sil_cuda_weight_free(cu, &w[k]);
}

/* The mapping's ranges pinned in pieces: split at the piece bounds, device addresses that run on
 * across them, a time limit that gives up and unpins everything (a second pin then works, so
 * nothing stayed registered), and no limit that pins it all. */
static void test_pin_pieces(struct sil_cuda *cu)
{
    const size_t piece = (size_t)SIL_CUDA_PIN_PIECE_MIB << 20, big = 2 * piece + piece / 2;
    uint8_t *m = mmap(NULL, big + (2u << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                      -1, 0);
    if (m == MAP_FAILED) {
        check(false, "pin pieces: mmap");
        return;
    }
    memset(m, 1, big + (2u << 20));
    struct sil_cuda_slots s;
    memset(&s, 0, sizeof s);
    sil_cuda_slots_init(&s, cu);
    /* a range of 2.5 pieces and a separate one of a page, one page apart */
    const size_t pg = 4096;
    check(sil_cuda_slots_add_range(&s, m, big) == 0 &&
              sil_cuda_slots_add_range(&s, m + big + pg, 100) == 0,
          "pin pieces: ranges added");
    const uint64_t total = sil_cuda_slots_merge_ranges(&s);
    check(s.n_rng == 2 && total == big + pg, "pin pieces: 2 ranges of %zu bytes (%d, %llu)",
          big + pg, s.n_rng, (unsigned long long)total);
    double took = -1;
    struct sil_error e = {0};
    int rc = sil_cuda_slots_pin(&s, total, 1e-9, &took, &e);
    check(rc == -ETIMEDOUT && !s.pinned && took >= 0 && strstr(e.msg, "pinned in"),
          "pin pieces: a time limit passed gives up: %d %s", rc, e.msg);
    check(s.n_rng == 4 && s.rng[0].hi - s.rng[0].lo == piece && s.rng[1].lo == s.rng[0].hi &&
              s.rng[2].hi - s.rng[2].lo == piece / 2 && s.rng[3].lo == (uintptr_t)m + big + pg,
          "pin pieces: split into 3 pieces and the small range (%d)", s.n_rng);
    memset(&e, 0, sizeof e);
    rc = sil_cuda_slots_pin(&s, total, 0, &took, &e);
    check(rc == 0 && s.pinned && s.pinned_bytes == total && s.stage == NULL,
          "pin pieces: pinned without a limit after giving up (%d %s)", rc, e.msg);
    if (rc == 0) {
        rc = sil_cuda_slots_map_ranges(&s);
        check(rc == 0, "pin pieces: device addresses (%d)", rc);
        /* a matrix across the first piece bound: one run of device addresses, as the host's */
        const size_t off = piece - 512;
        const sil_cuda_ptr d0 = sil_cuda_slots_host_dev(&s, m), d = sil_cuda_slots_host_dev(&s, m + off);
        const sil_cuda_ptr d1 = sil_cuda_slots_host_dev(&s, m + piece + 512);
        check(rc == 0 && d0 && d == d0 + off && d1 == d0 + piece + 512,
              "pin pieces: device addresses run on across a piece bound");
    }
    sil_cuda_slots_free(&s); /* unpins every piece */
    munmap(m, big + (2u << 20));
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    test_host_side();
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
    size_t fr = 0, tot = 0;
    CK(sil_cuda_mem_info(cu, &fr, &tot, &err));
    printf("device %d: %s, sm_%d%d, %d SMs, %.1f GiB (%.1f free), driver %d.%d, %s, %s%s\n",
           in->ordinal, in->name, in->cc_major, in->cc_minor, in->sm_count,
           (double)in->total_mem / 1073741824.0, (double)fr / 1073741824.0,
           in->driver_version / 1000, in->driver_version % 1000 / 10,
           in->ptx_jit ? "PTX through the JIT" : "SASS",
           in->pdl ? "programmatic dependent launch" : "plain launches",
           in->l2_prefetch ? " with L2 prefetch" : "");
    test_bad_args(cu);
    test_pin_pieces(cu);
    test_matvec(cu);
    test_matvec_set(cu);
    test_rmsnorm(cu);
    test_add_swiglu(cu);
    test_rope(cu);
    test_router(cu);
    test_router_fused(cu);
    {
        struct sil_cuda_fwd *fwd = NULL;
        CK(sil_cuda_fwd_load(cu, &fwd, &err));
        if (fwd) {
            test_router_norm(cu, fwd);
            test_matvec_conv(cu, fwd);
            sil_cuda_fwd_unload(cu, fwd);
        }
    }
    test_argmax(cu);
    test_moe(cu);
    CK(sil_cuda_sync(cu, NULL, &err));
    sil_cuda_free(cu);
    printf("%s: %d failure%s\n", failures ? "FAILED" : "PASSED", failures,
           failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
