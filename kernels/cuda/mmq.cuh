// Matrix-matrix products for prefill: y[j][r] = W[r] . x[j] for n rows j of activations.
//
// Quantized weights on int8 tensor cores (mma.sync): a block of 4 warps computes a tile of 64
// weight rows x 64 activation rows. Per stage of 8 units (256 columns) it unpacks the weight tile
// to int8 in shared memory (sil_load_unit, as the matvec: w_i = d_h * q_i + m) with the unit's
// scales beside it, and copies the q8 activation tile (sil_cuda_quantize_q8's layout) next to it.
// Each warp takes 16 weight rows against all 64 activation rows: per unit, the integer dot of 32
// columns comes from the tensor cores and the epilogue applies the scales in float, as the
// matvec does: acc += da * (d0 s0 + d1 s1) + m * sa (s0, s1: the halves of 16, which only
// Q6_K's 16-element scales keep apart).
//   sm_75: mma.m8n8k16 (four per 16 x 8 x 32 step);
//   sm_80+: mma.m16n8k32 (m16n8k16 twice for Q6_K). The _sm80 entries carry it where the
//   compiling architecture has it and fall back to the sm_75 instructions otherwise (the
//   compute_75 PTX), so every entry is correct wherever it runs; the host picks _sm80 only on
//   SASS for an sm_80+ device.
// F32 / F16 / BF16 weights: a float tile kernel (64 x 64 tile, 16 columns a stage, 4 x 4 outputs
// a thread) on the F32 activations.
#pragma once

#define SIL_MMQ_BM 64                        // weight rows per block
#define SIL_MMQ_BN 64                        // activation rows per block
#define SIL_MMQ_UNITS 8                      // units of 32 columns per stage
#define SIL_MMQ_LD (SIL_MMQ_UNITS * 32 + 16) // smem row bytes: 8 rows on distinct banks
#define SIL_MMQ_THREADS 128

__device__ __forceinline__ void sil_mma_m8n8k16(int &c0, int &c1, int a, int b)
{
    asm("mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%0,%1}, {%2}, {%3}, {%0,%1};"
        : "+r"(c0), "+r"(c1)
        : "r"(a), "r"(b));
}

// c[4] += A (16 x 32: a0 rows 0-7 k 0-15, a1 rows 8-15 k 0-15, a2 / a3 the same at k 16-31) times
// B (32 x 8: b0 k 0-15, b1 k 16-31), the m16n8k32 fragment layout.
template <bool SM80>
__device__ __forceinline__ void sil_mma_k32(int *c, int a0, int a1, int a2, int a3, int b0, int b1)
{
#if __CUDA_ARCH__ >= 800
    if (SM80) {
        asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
            "{%8,%9}, {%0,%1,%2,%3};"
            : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
        return;
    }
#endif
    sil_mma_m8n8k16(c[0], c[1], a0, b0);
    sil_mma_m8n8k16(c[0], c[1], a2, b1);
    sil_mma_m8n8k16(c[2], c[3], a1, b0);
    sil_mma_m8n8k16(c[2], c[3], a3, b1);
}

// The same step with the k halves kept apart: lo += A[:, 0:16] B[0:16], hi += A[:, 16:32] B[16:32].
template <bool SM80>
__device__ __forceinline__ void sil_mma_k16x2(int *lo, int *hi, int a0, int a1, int a2, int a3,
                                              int b0, int b1)
{
#if __CUDA_ARCH__ >= 800
    if (SM80) {
        asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
            "{%0,%1,%2,%3};"
            : "+r"(lo[0]), "+r"(lo[1]), "+r"(lo[2]), "+r"(lo[3])
            : "r"(a0), "r"(a1), "r"(b0));
        asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, "
            "{%0,%1,%2,%3};"
            : "+r"(hi[0]), "+r"(hi[1]), "+r"(hi[2]), "+r"(hi[3])
            : "r"(a2), "r"(a3), "r"(b1));
        return;
    }
#endif
    sil_mma_m8n8k16(lo[0], lo[1], a0, b0);
    sil_mma_m8n8k16(lo[2], lo[3], a1, b0);
    sil_mma_m8n8k16(hi[0], hi[1], a2, b1);
    sil_mma_m8n8k16(hi[2], hi[3], a3, b1);
}

// w: rows of row_bytes, units of 32 columns; a8: q8 of a_rows rows (sil_q8_at of a_rows * units
// blocks), of which rows j0 .. j0 + n are the product's; y[(j0 + j) * ldy + r]. Grid (rows / 64,
// n / BN) rounded up, SIL_MMQ_THREADS threads. BN (16, 32 or 64 activation rows a block) changes
// which block computes a product, not its sums: each is the same float sequence over the units.
template <int T, bool SM80, int BN = SIL_MMQ_BN>
__device__ __forceinline__ void sil_mmq(const uint8_t *__restrict__ w, uint64_t row_bytes,
                                        int rows, int units, const uint8_t *__restrict__ a8,
                                        int a_rows, int j0, int n, float *__restrict__ y,
                                        int64_t ldy)
{
    constexpr bool HALVES = T == WT_Q6_K;
    __shared__ __align__(16) uint8_t sw[SIL_MMQ_BM * SIL_MMQ_LD];
    __shared__ __align__(16) uint8_t sx[BN * SIL_MMQ_LD];
    __shared__ float4 sws[SIL_MMQ_BM][SIL_MMQ_UNITS]; // d0, d1, m of each weight unit
    __shared__ float2 sxs[BN][SIL_MMQ_UNITS]; // d, d * sum of each activation block

    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int row0 = blockIdx.x * SIL_MMQ_BM, col0 = blockIdx.y * BN;
    const sil_q8_view a = sil_q8_at(a8, (int64_t)a_rows * units);
    y += (int64_t)j0 * ldy;

    float acc[BN / 8][4];
#pragma unroll
    for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[nt][i] = 0.0f;

    for (int u0 = 0; u0 < units; u0 += SIL_MMQ_UNITS) {
        __syncthreads(); // the previous stage's reads are done
        for (int i = tid; i < SIL_MMQ_BM * SIL_MMQ_UNITS; i += SIL_MMQ_THREADS) {
            const int r = i / SIL_MMQ_UNITS, uu = i % SIL_MMQ_UNITS;
            const int gr = row0 + r, gu = u0 + uu;
            int4 *dst = (int4 *)(sw + r * SIL_MMQ_LD + uu * 32);
            if (gr < rows && gu < units) {
                sil_wunit wu;
                sil_load_unit<T>(w + (uint64_t)gr * row_bytes, gu, wu);
                dst[0] = make_int4(wu.q[0], wu.q[1], wu.q[2], wu.q[3]);
                dst[1] = make_int4(wu.q[4], wu.q[5], wu.q[6], wu.q[7]);
                sws[r][uu] = make_float4(wu.d0, wu.d1, wu.m, 0.0f);
            } else {
                dst[0] = dst[1] = make_int4(0, 0, 0, 0);
                sws[r][uu] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
        for (int i = tid; i < BN * SIL_MMQ_UNITS * 2; i += SIL_MMQ_THREADS) {
            const int j = i / (SIL_MMQ_UNITS * 2), uu = (i / 2) % SIL_MMQ_UNITS, h = i & 1;
            const int gj = col0 + j, gu = u0 + uu;
            *(int4 *)(sx + j * SIL_MMQ_LD + uu * 32 + h * 16) =
                gj < n && gu < units ? a.q[2 * ((int64_t)(j0 + gj) * units + gu) + h]
                                     : make_int4(0, 0, 0, 0);
        }
        for (int i = tid; i < BN * SIL_MMQ_UNITS; i += SIL_MMQ_THREADS) {
            const int j = i / SIL_MMQ_UNITS, uu = i % SIL_MMQ_UNITS;
            const int gj = col0 + j, gu = u0 + uu;
            sxs[j][uu] =
                gj < n && gu < units ? a.ds[(int64_t)(j0 + gj) * units + gu] : make_float2(0, 0);
        }
        __syncthreads();

        const int nu = units - u0 < SIL_MMQ_UNITS ? units - u0 : SIL_MMQ_UNITS;
        const int wr = wp * 16 + g; // this thread's weight rows: wr and wr + 8
        for (int uu = 0; uu < nu; uu++) {
            const uint8_t *pa = sw + wr * SIL_MMQ_LD + uu * 32 + t4 * 4;
            const int a0 = *(const int *)pa, a1 = *(const int *)(pa + 8 * SIL_MMQ_LD);
            const int a2 = *(const int *)(pa + 16), a3 = *(const int *)(pa + 8 * SIL_MMQ_LD + 16);
            const float4 s0 = sws[wr][uu], s1 = sws[wr + 8][uu];
#pragma unroll
            for (int nt = 0; nt < BN / 8; nt++) {
                const uint8_t *pb = sx + (nt * 8 + g) * SIL_MMQ_LD + uu * 32 + t4 * 4;
                const int b0 = *(const int *)pb, b1 = *(const int *)(pb + 16);
                const float2 x0 = sxs[nt * 8 + t4 * 2][uu], x1 = sxs[nt * 8 + t4 * 2 + 1][uu];
                int lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
                if (HALVES)
                    sil_mma_k16x2<SM80>(lo, hi, a0, a1, a2, a3, b0, b1);
                else
                    sil_mma_k32<SM80>(lo, a0, a1, a2, a3, b0, b1);
                // C element i: weight row wr (+8 for i >= 2), activation row nt*8 + t4*2 + (i & 1)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float4 s = i < 2 ? s0 : s1;
                    const float2 x = i & 1 ? x1 : x0;
                    const float dot = HALVES ? s.x * (float)lo[i] + s.y * (float)hi[i]
                                             : s.x * (float)lo[i];
                    acc[nt][i] += x.x * dot + s.z * x.y;
                }
            }
        }
    }

    const int wr = row0 + wp * 16 + g;
#pragma unroll
    for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int r = wr + (i >= 2 ? 8 : 0), j = col0 + nt * 8 + t4 * 2 + (i & 1);
            if (r < rows && j < n)
                y[(int64_t)j * ldy + r] = acc[nt][i];
        }
}

#define SIL_MMF_BK 16

// Float weights (sil_wf: 0 F32, 1 F16, 2 BF16) on x [n][cols] F32: 256 threads, a 64 x 64 tile,
// thread (tx, ty) computing weight rows tx + 16 i and activation rows ty + 16 j.
template <int F>
__device__ __forceinline__ void sil_mmf(const uint8_t *__restrict__ w, uint64_t row_bytes,
                                        int rows, int64_t cols, const float *__restrict__ x, int n,
                                        float *__restrict__ y, int64_t ldy)
{
    __shared__ float sw[SIL_MMF_BK][SIL_MMQ_BM + 4];
    __shared__ float sx[SIL_MMF_BK][SIL_MMQ_BN + 4];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const int row0 = blockIdx.x * SIL_MMQ_BM, col0 = blockIdx.y * SIL_MMQ_BN;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0.0f;
    for (int64_t k0 = 0; k0 < cols; k0 += SIL_MMF_BK) {
        __syncthreads();
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int idx = tid + 256 * e, r = idx / SIL_MMF_BK, k = idx % SIL_MMF_BK;
            const int64_t gk = k0 + k;
            sw[k][r] = row0 + r < rows && gk < cols
                           ? sil_wf<F>(w + (uint64_t)(row0 + r) * row_bytes, gk)
                           : 0.0f;
            sx[k][r] = col0 + r < n && gk < cols ? x[(int64_t)(col0 + r) * cols + gk] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < SIL_MMF_BK; k++) {
            float wv[4], xv[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                wv[i] = sw[k][tx + 16 * i], xv[i] = sx[k][ty + 16 * i];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(wv[i], xv[j], acc[i][j]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int r = row0 + tx + 16 * i, c = col0 + ty + 16 * j;
            if (r < rows && c < n)
                y[(int64_t)c * ldy + r] = acc[i][j];
        }
}

// Float weights of few rows (the router, the delta net's alpha and beta, the shared expert's
// gate) on many activation rows, where sil_mmf's 64 x 64 tiles leave most SMs idle: a warp per
// SIL_MMF_TR weight rows x SIL_MMF_TC activation rows, lane l summing k = l, l + 32, ... in order,
// then the lanes' sums added in a fixed butterfly; a block's 8 warps take the same weight rows and
// 8 groups of activation rows. A product's sums do not depend on n or on where its tile lies.
#define SIL_MMF_TR 4
#define SIL_MMF_TC 8
static_assert(SIL_MMF_TR * SIL_MMF_TC == 32, "a product a lane");
template <int F>
__device__ __forceinline__ void sil_mmf_thin(const uint8_t *__restrict__ w, uint64_t row_bytes,
                                             int rows, int64_t cols, const float *__restrict__ x,
                                             int n, float *__restrict__ y, int64_t ldy)
{
    const int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * SIL_MMF_TR, c0 = (blockIdx.y * 8 + wp) * SIL_MMF_TC;
    if (c0 >= n) return;
    const uint8_t *wr[SIL_MMF_TR];
    const float *xr[SIL_MMF_TC];
#pragma unroll
    for (int i = 0; i < SIL_MMF_TR; i++)
        wr[i] = w + (uint64_t)(r0 + i < rows ? r0 + i : r0) * row_bytes;
#pragma unroll
    for (int j = 0; j < SIL_MMF_TC; j++)
        xr[j] = x + (int64_t)(c0 + j < n ? c0 + j : c0) * cols;
    float acc[SIL_MMF_TR][SIL_MMF_TC];
#pragma unroll
    for (int i = 0; i < SIL_MMF_TR; i++)
#pragma unroll
        for (int j = 0; j < SIL_MMF_TC; j++)
            acc[i][j] = 0.0f;
#pragma unroll 2
    for (int64_t k = lane; k < cols; k += 32) {
        float wv[SIL_MMF_TR], xv[SIL_MMF_TC];
#pragma unroll
        for (int i = 0; i < SIL_MMF_TR; i++)
            wv[i] = sil_wf<F>(wr[i], k);
#pragma unroll
        for (int j = 0; j < SIL_MMF_TC; j++)
            xv[j] = xr[j][k];
#pragma unroll
        for (int i = 0; i < SIL_MMF_TR; i++)
#pragma unroll
            for (int j = 0; j < SIL_MMF_TC; j++)
                acc[i][j] = fmaf(wv[i], xv[j], acc[i][j]);
    }
#pragma unroll
    for (int i = 0; i < SIL_MMF_TR; i++)
#pragma unroll
        for (int j = 0; j < SIL_MMF_TC; j++) {
            float v = acc[i][j];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                v += __shfl_xor_sync(0xffffffffu, v, o);
            // lane i * TC + j (all 32 of them) writes product (i, j)
            if (lane == i * SIL_MMF_TC + j && r0 + i < rows && c0 + j < n)
                y[(int64_t)(c0 + j) * ldy + r0 + i] = v;
        }
}

// Grouped (routed experts in prefill): group g (blockIdx.z) multiplies matrix grp_mat[g] of the
// stack at w (mat_bytes apart) by activation rows grp_start[g] .. grp_start[g + 1] of a8 (q8 of
// a_rows rows), into the same rows of y; grid y covers the largest group.
#define SIL_MMQ_GRP_ENTRY(NAME, T, SM, SM80, BN, SFX)                                              \
    extern "C" __global__ void __launch_bounds__(SIL_MMQ_THREADS) sil_mmq_grp##SFX##_##NAME##_##SM( \
        const uint8_t *w, uint64_t mat_bytes, uint64_t row_bytes, int rows, int units,            \
        const uint8_t *a, int a_rows, const int *grp_mat, const int *grp_start, float *y,         \
        int64_t ldy)                                                                              \
    {                                                                                             \
        SIL_PDL_ENTRY();                                                                          \
        const int g = blockIdx.z, j0 = grp_start[g], n = grp_start[g + 1] - j0;                   \
        if ((int)blockIdx.y * BN >= n) return;                                                    \
        sil_mmq<T, SM80, BN>(w + (uint64_t)grp_mat[g] * mat_bytes, row_bytes, rows, units, a,     \
                             a_rows, j0, n, y, ldy);                                              \
    }
// grid y: the largest group in tiles of 64 (sil_mmq_grp_), 32 (grp32) or 16 (grp16) rows
#define SIL_MMQ_ENTRY_SM(NAME, T, SM, SM80)                                                       \
    extern "C" __global__ void __launch_bounds__(SIL_MMQ_THREADS)                                 \
        sil_mmq_##NAME##_##SM(const uint8_t *w, uint64_t row_bytes, int rows, int units,          \
                              const uint8_t *a, int n, float *y, int64_t ldy)                     \
    {                                                                                             \
        SIL_PDL_ENTRY();                                                                          \
        sil_mmq<T, SM80>(w, row_bytes, rows, units, a, n, 0, n, y, ldy);                          \
    }                                                                                             \
    SIL_MMQ_GRP_ENTRY(NAME, T, SM, SM80, 64, )                                                    \
    SIL_MMQ_GRP_ENTRY(NAME, T, SM, SM80, 32, 32)                                                  \
    SIL_MMQ_GRP_ENTRY(NAME, T, SM, SM80, 16, 16)
#define SIL_MMQ_ENTRY(NAME, T) SIL_MMQ_ENTRY_SM(NAME, T, sm75, false) SIL_MMQ_ENTRY_SM(NAME, T, sm80, true)
// the float kernels' entries: the 64 x 64 tiles (sil_mmf_) and a warp per 4 x 8 (sil_mmf_thin_)
#define SIL_MMF_KERNEL(KNAME, FN, F)                                                              \
    extern "C" __global__ void __launch_bounds__(256)                                             \
        KNAME(const uint8_t *w, uint64_t row_bytes, int rows, int64_t cols, const float *x, int n, \
              float *y, int64_t ldy)                                                              \
    {                                                                                             \
        SIL_PDL_ENTRY();                                                                          \
        FN<F>(w, row_bytes, rows, cols, x, n, y, ldy);                                            \
    }
#define SIL_MMF_ENTRY(NAME, F)                                                                    \
    SIL_MMF_KERNEL(sil_mmf_##NAME, sil_mmf, F) SIL_MMF_KERNEL(sil_mmf_thin_##NAME, sil_mmf_thin, F)

SIL_MMQ_ENTRY(q4_0, WT_Q4_0)
SIL_MMQ_ENTRY(q4_1, WT_Q4_1)
SIL_MMQ_ENTRY(q5_0, WT_Q5_0)
SIL_MMQ_ENTRY(q5_1, WT_Q5_1)
SIL_MMQ_ENTRY(q8_0, WT_Q8_0)
SIL_MMQ_ENTRY(q4_K, WT_Q4_K)
SIL_MMQ_ENTRY(q5_K, WT_Q5_K)
SIL_MMQ_ENTRY(q6_K, WT_Q6_K)
SIL_MMF_ENTRY(f32, 0)
SIL_MMF_ENTRY(f16, 1)
SIL_MMF_ENTRY(bf16, 2)
