// Matrix-vector products for decode: y[j][r] = W[r] . x[j] for a batch of up to 8 rows j.
//
// Quantized weights: one warp per output row; lane l takes the 32-element units l, l+32, ...
// of the row, unpacks each unit once to 32 int8 values q with w_i = d_h * q_i + m (d_h per
// half of 16, for Q6_K's 16-element scales) and dots it with every batch row's q8_1 block by
// dp4a: W.x = sum over units of da * (d_0 s_0 + d_1 s_1) + m * sa, sa = da * sum(qa). Adjacent
// lanes read adjacent units, so each weight byte crosses DRAM once per launch.
// F32 / F16 / BF16 weights use float math on the F32 activations.
#pragma once

#include <cuda_fp16.h>
#include <stdint.h>

#define SIL_Q8_QK 32

// Activations of n rows of `units` blocks, struct-of-arrays so the int8 values load 16 bytes at a
// time: q [n][units][32] int8, then ds [n][units] float2 (d, d * sum(q)) (SIL_CUDA_Q8_*).
struct sil_q8_view {
    const int4 *q;
    const float2 *ds;
};

__device__ __forceinline__ sil_q8_view sil_q8_at(const uint8_t *buf, int64_t nblocks)
{
    return {(const int4 *)buf, (const float2 *)(buf + nblocks * SIL_Q8_QK)};
}

// A weight unit of 32 elements: w_i = d[i / 16] * q_i + m.
struct sil_wunit {
    int q[8];
    float d0, d1, m;
};

__device__ __forceinline__ float sil_h2f(const uint8_t *p)
{
    return __half2float(__ushort_as_half(*(const uint16_t *)p));
}

// 32-bit loads at 2-byte alignment (blocks of 18, 22, 34, 210 bytes) and at 4-byte alignment.
__device__ __forceinline__ int sil_ld_b2(const uint8_t *p, int i)
{
    const uint16_t *h = (const uint16_t *)p + 2 * i;
    return (int)((uint32_t)h[0] | ((uint32_t)h[1] << 16));
}
__device__ __forceinline__ int sil_ld_b4(const uint8_t *p, int i)
{
    return ((const int *)p)[i];
}

// 8 ints from a 2-byte aligned p with aligned 4-byte loads (9 when p is not 4-aligned, joined by
// funnel shifts): a third of the loads of 16 sil_ld_b2 halves. Reads up to 2 bytes past p + 32,
// so only where the block continues (Q6_K's ql and qh).
__device__ __forceinline__ void sil_ld8_a2(const uint8_t *p, int *v)
{
    const uintptr_t a = (uintptr_t)p;
    const int *w = (const int *)(a & ~(uintptr_t)3);
    if ((a & 3) == 0) {
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = w[j];
    } else {
        int x[9];
#pragma unroll
        for (int j = 0; j < 9; j++)
            x[j] = w[j];
#pragma unroll
        for (int j = 0; j < 8; j++)
            v[j] = (int)__funnelshift_r((unsigned)x[j], (unsigned)x[j + 1], 16);
    }
}

// The 4 high bits hb (bit b -> byte b, bit 4 of that byte).
__device__ __forceinline__ int sil_spread4(uint32_t hb)
{
    return (int)(((hb & 1u) << 4) | ((hb & 2u) << 11) | ((hb & 4u) << 18) | ((hb & 8u) << 25));
}

enum sil_cuda_wt { WT_Q4_0, WT_Q4_1, WT_Q5_0, WT_Q5_1, WT_Q8_0, WT_Q4_K, WT_Q5_K, WT_Q6_K };

template <int T> struct sil_wtraits;
template <> struct sil_wtraits<WT_Q4_0> { static constexpr int qk = 32, bytes = 18; };
template <> struct sil_wtraits<WT_Q4_1> { static constexpr int qk = 32, bytes = 20; };
template <> struct sil_wtraits<WT_Q5_0> { static constexpr int qk = 32, bytes = 22; };
template <> struct sil_wtraits<WT_Q5_1> { static constexpr int qk = 32, bytes = 24; };
template <> struct sil_wtraits<WT_Q8_0> { static constexpr int qk = 32, bytes = 34; };
template <> struct sil_wtraits<WT_Q4_K> { static constexpr int qk = 256, bytes = 144; };
template <> struct sil_wtraits<WT_Q5_K> { static constexpr int qk = 256, bytes = 176; };
template <> struct sil_wtraits<WT_Q6_K> { static constexpr int qk = 256, bytes = 210; };

__device__ __forceinline__ void sil_k4_scale_min(const uint8_t *sc, int j, int *s, int *m)
{
    if (j < 4) {
        *s = sc[j] & 63;
        *m = sc[j + 4] & 63;
    } else {
        *s = (sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4);
        *m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
    }
}

// Unit u of a row (32 elements) as q, d0, d1, m.
template <int T> __device__ __forceinline__ void sil_load_unit(const uint8_t *row, int u,
                                                               sil_wunit &w);

template <> __device__ __forceinline__ void sil_load_unit<WT_Q4_0>(const uint8_t *row, int u,
                                                                   sil_wunit &w)
{
    const uint8_t *b = row + (size_t)u * 18;
    const float d = sil_h2f(b);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int v = sil_ld_b2(b + 2, j);
        w.q[j] = v & 0x0F0F0F0F;
        w.q[4 + j] = (v >> 4) & 0x0F0F0F0F;
    }
    w.d0 = w.d1 = d;
    w.m = -8.0f * d;
}

template <> __device__ __forceinline__ void sil_load_unit<WT_Q4_1>(const uint8_t *row, int u,
                                                                   sil_wunit &w)
{
    const uint8_t *b = row + (size_t)u * 20;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int v = sil_ld_b4(b + 4, j);
        w.q[j] = v & 0x0F0F0F0F;
        w.q[4 + j] = (v >> 4) & 0x0F0F0F0F;
    }
    w.d0 = w.d1 = sil_h2f(b);
    w.m = sil_h2f(b + 2);
}

template <> __device__ __forceinline__ void sil_load_unit<WT_Q5_0>(const uint8_t *row, int u,
                                                                   sil_wunit &w)
{
    const uint8_t *b = row + (size_t)u * 22;
    const float d = sil_h2f(b);
    const uint32_t qh = (uint32_t)sil_ld_b2(b + 2, 0);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int v = sil_ld_b2(b + 6, j);
        w.q[j] = (v & 0x0F0F0F0F) | sil_spread4((qh >> (4 * j)) & 0xF);
        w.q[4 + j] = ((v >> 4) & 0x0F0F0F0F) | sil_spread4((qh >> (16 + 4 * j)) & 0xF);
    }
    w.d0 = w.d1 = d;
    w.m = -16.0f * d;
}

template <> __device__ __forceinline__ void sil_load_unit<WT_Q5_1>(const uint8_t *row, int u,
                                                                   sil_wunit &w)
{
    const uint8_t *b = row + (size_t)u * 24;
    const uint32_t qh = (uint32_t)sil_ld_b4(b + 4, 0);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const int v = sil_ld_b4(b + 8, j);
        w.q[j] = (v & 0x0F0F0F0F) | sil_spread4((qh >> (4 * j)) & 0xF);
        w.q[4 + j] = ((v >> 4) & 0x0F0F0F0F) | sil_spread4((qh >> (16 + 4 * j)) & 0xF);
    }
    w.d0 = w.d1 = sil_h2f(b);
    w.m = sil_h2f(b + 2);
}

template <> __device__ __forceinline__ void sil_load_unit<WT_Q8_0>(const uint8_t *row, int u,
                                                                   sil_wunit &w)
{
    const uint8_t *b = row + (size_t)u * 34;
#pragma unroll
    for (int j = 0; j < 8; j++)
        w.q[j] = sil_ld_b2(b + 2, j);
    w.d0 = w.d1 = sil_h2f(b);
    w.m = 0.0f;
}

template <> __device__ __forceinline__ void sil_load_unit<WT_Q4_K>(const uint8_t *row, int u,
                                                                   sil_wunit &w)
{
    const uint8_t *b = row + (size_t)(u >> 3) * 144;
    const int s = u & 7, g = s >> 1, shift = (s & 1) * 4;
    int sc, mn;
    sil_k4_scale_min(b + 4, s, &sc, &mn);
    const int4 *qs = (const int4 *)(b + 16 + 32 * g); // 16-byte aligned: rows of 144-byte blocks
    const int4 v0 = qs[0], v1 = qs[1];
    const int v[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
#pragma unroll
    for (int j = 0; j < 8; j++)
        w.q[j] = (v[j] >> shift) & 0x0F0F0F0F;
    w.d0 = w.d1 = sil_h2f(b) * (float)sc;
    w.m = -sil_h2f(b + 2) * (float)mn;
}

template <> __device__ __forceinline__ void sil_load_unit<WT_Q5_K>(const uint8_t *row, int u,
                                                                   sil_wunit &w)
{
    const uint8_t *b = row + (size_t)(u >> 3) * 176;
    const int s = u & 7, g = s >> 1, shift = (s & 1) * 4;
    int sc, mn;
    sil_k4_scale_min(b + 4, s, &sc, &mn);
    const int4 *qs = (const int4 *)(b + 48 + 32 * g), *qh = (const int4 *)(b + 16);
    const int4 l0 = qs[0], l1 = qs[1], h0 = qh[0], h1 = qh[1];
    const int lv[8] = {l0.x, l0.y, l0.z, l0.w, l1.x, l1.y, l1.z, l1.w};
    const int hv[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
    for (int j = 0; j < 8; j++)
        w.q[j] = ((lv[j] >> shift) & 0x0F0F0F0F) | (((hv[j] >> s) & 0x01010101) << 4);
    w.d0 = w.d1 = sil_h2f(b) * (float)sc;
    w.m = -sil_h2f(b + 2) * (float)mn;
}

template <> __device__ __forceinline__ void sil_load_unit<WT_Q6_K>(const uint8_t *row, int u,
                                                                   sil_wunit &w)
{
    const uint8_t *b = row + (size_t)(u >> 3) * 210;
    const int s = u & 7, h = s >> 2, t = s & 3;
    const uint8_t *ql = b + 64 * h + (t & 1) * 32;
    const uint8_t *qh = b + 128 + 32 * h;
    const int nshift = (t >> 1) * 4, hshift = 2 * t;
    int lv[8], hv[8];
    sil_ld8_a2(ql, lv); // ql ends 64 bytes before the block's qh, qh 16 before its scales
    sil_ld8_a2(qh, hv);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const int lo = (lv[j] >> nshift) & 0x0F0F0F0F;
        const int hi = ((hv[j] >> hshift) & 0x03030303) << 4;
        w.q[j] = (int)__vsub4((unsigned)(lo | hi), 0x20202020u);
    }
    const int8_t *sc = (const int8_t *)(b + 192) + 8 * h + 2 * t;
    const float d = sil_h2f(b + 208);
    w.d0 = d * (float)sc[0];
    w.d1 = d * (float)sc[1];
    w.m = 0.0f;
}

__device__ __forceinline__ float sil_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#define SIL_MMV_WARPS 4

// One unit's dot with batch row j's block u: da * (d0 s0 + d1 s1) + m * sa.
template <int N>
__device__ __forceinline__ void sil_unit_dot(const sil_wunit &w, sil_q8_view a, int units, int u,
                                             float *acc)
{
#pragma unroll
    for (int j = 0; j < N; j++) {
        const int64_t blk = (int64_t)j * units + u;
        const int4 a0 = a.q[2 * blk], a1 = a.q[2 * blk + 1];
        const float2 ds = a.ds[blk];
        int s0 = __dp4a(w.q[0], a0.x, 0), s1 = __dp4a(w.q[4], a1.x, 0);
        s0 = __dp4a(w.q[1], a0.y, s0), s1 = __dp4a(w.q[5], a1.y, s1);
        s0 = __dp4a(w.q[2], a0.z, s0), s1 = __dp4a(w.q[6], a1.z, s1);
        s0 = __dp4a(w.q[3], a0.w, s0), s1 = __dp4a(w.q[7], a1.w, s1);
        acc[j] += ds.x * (w.d0 * (float)s0 + w.d1 * (float)s1) + w.m * ds.y;
    }
}

// Two weight rows against batch row j's block u: each activation block is loaded once for both.
template <int N>
__device__ __forceinline__ void sil_unit_dot2(const sil_wunit &w0, const sil_wunit &w1,
                                              sil_q8_view a, int units, int u, float *acc0,
                                              float *acc1)
{
#pragma unroll
    for (int j = 0; j < N; j++) {
        const int64_t blk = (int64_t)j * units + u;
        const int4 a0 = a.q[2 * blk], a1 = a.q[2 * blk + 1];
        const float2 ds = a.ds[blk];
        const int av[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
        int s0 = 0, s1 = 0, t0 = 0, t1 = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            s0 = __dp4a(w0.q[i], av[i], s0), s1 = __dp4a(w0.q[4 + i], av[4 + i], s1);
            t0 = __dp4a(w1.q[i], av[i], t0), t1 = __dp4a(w1.q[4 + i], av[4 + i], t1);
        }
        acc0[j] += ds.x * (w0.d0 * (float)s0 + w0.d1 * (float)s1) + w0.m * ds.y;
        acc1[j] += ds.x * (w1.d0 * (float)t0 + w1.d1 * (float)t1) + w1.m * ds.y;
    }
}

// Rows per warp: batches of 2 and more share each activation load between two weight rows.
#define SIL_MMVQ_ROWS(N) ((N) >= 2 ? 2 : 1)

// The delta net's causal conv1d + silu as the epilogue of the matvec writing its input
// (qkv_mixed): output row c of batch row j is channel c of run j (one token a run), whose conv
// state [K-1][cd] is at seq_state[run_seq[j]] + offset. The warp that wrote the row steps the
// channel as sil_fwd_conv1d does (the same sums in the same order) and shifts its state.
struct sil_conv_ep {
    float *out;
    int64_t ldo;
    const float *w; // [cd][K]
    const int *run_seq;
    float *const *seq_state;
    int64_t cd;
    int64_t offset;
    int K; // 1..9
    int pad;
};

__device__ __forceinline__ void sil_conv_ep_row(const sil_conv_ep &e, int c, int j, float xc)
{
    float *st = e.seq_state[e.run_seq[j]] + e.offset + c;
    const int H = e.K - 1;
    const float *wc = e.w + (int64_t)c * e.K;
    float acc = 0.0f;
    if (H == 3) {
        const float h0 = st[0], h1 = st[e.cd], h2 = st[2 * e.cd];
        acc += wc[0] * h0;
        acc += wc[1] * h1;
        acc += wc[2] * h2;
        acc += wc[3] * xc;
        st[0] = h1;
        st[e.cd] = h2;
        st[2 * e.cd] = xc;
    } else {
        float hist[8]; // K <= 9
        for (int i = 0; i < H; i++)
            hist[i] = st[(int64_t)i * e.cd];
        for (int i = 0; i < H; i++)
            acc += wc[i] * hist[i];
        acc += wc[H] * xc;
        for (int i = 0; i + 1 < H; i++)
            st[(int64_t)i * e.cd] = hist[i + 1];
        if (H > 0)
            st[(int64_t)(H - 1) * e.cd] = xc;
    }
    e.out[(int64_t)j * e.ldo + c] = acc / (1.0f + expf(-acc));
}

// w: rows of row_bytes; a: q8 of [N][units] blocks (sil_q8_at); y[j * ldy + r]. Each lane keeps
// two weight units' loads in flight before it uses either: units u and u + 32 of one row (batch
// 1), or unit u of two rows (batch >= 2).
// EP: each output also goes through the conv epilogue ep (sil_conv_ep).
template <int T, int N, bool EP = false>
__device__ __forceinline__ void sil_mmvq(const uint8_t *__restrict__ w, uint64_t row_bytes,
                                         int rows, int units, const uint8_t *__restrict__ a8,
                                         float *__restrict__ y, int64_t ldy, int bx,
                                         const sil_conv_ep *ep = nullptr)
{
    const int lane = threadIdx.x & 31;
    const sil_q8_view a = sil_q8_at(a8, (int64_t)N * units);
    if (SIL_MMVQ_ROWS(N) == 2) {
        const int r0 = 2 * (bx * SIL_MMV_WARPS + (threadIdx.x >> 5));
        if (r0 >= rows)
            return;
        const bool has1 = r0 + 1 < rows;
        const uint8_t *row0 = w + (uint64_t)r0 * row_bytes;
        const uint8_t *row1 = has1 ? row0 + row_bytes : row0; // a lone last row is done twice
        float acc0[N], acc1[N];
#pragma unroll
        for (int j = 0; j < N; j++)
            acc0[j] = acc1[j] = 0.0f;
        for (int u = lane; u < units; u += 32) {
            sil_wunit w0, w1;
            sil_load_unit<T>(row0, u, w0);
            sil_load_unit<T>(row1, u, w1);
            sil_unit_dot2<N>(w0, w1, a, units, u, acc0, acc1);
        }
        float e0 = 0.0f, e1 = 0.0f; // the epilogue's input: lane j row r0, lane 16 + j row r0 + 1
#pragma unroll
        for (int j = 0; j < N; j++) {
            const float v0 = sil_warp_sum(acc0[j]), v1 = sil_warp_sum(acc1[j]);
            if (lane == 0) {
                y[(int64_t)j * ldy + r0] = v0;
                if (has1)
                    y[(int64_t)j * ldy + r0 + 1] = v1;
            }
            if (EP && lane == j)
                e0 = v0;
            if (EP && lane == 16 + j)
                e1 = v1;
        }
        // The butterfly leaves every lane the same sums, so the 2N epilogues (each run is one
        // token of its own sequence) run side by side on lanes 0..N-1 and 16..16+N-1, not one
        // after another on one lane: with 8 rows that chain of state loads and stores made the
        // fused set slower than the set and a conv1d launch.
        if (EP && lane < N)
            sil_conv_ep_row(*ep, r0, lane, e0);
        if (EP && has1 && lane >= 16 && lane < 16 + N)
            sil_conv_ep_row(*ep, r0 + 1, lane - 16, e1);
        return;
    }
    const int r = bx * SIL_MMV_WARPS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const uint8_t *row = w + (uint64_t)r * row_bytes;
    float acc[N];
#pragma unroll
    for (int j = 0; j < N; j++)
        acc[j] = 0.0f;
    for (int u = lane; u < units; u += 64) {
        sil_wunit wa, wb;
        const bool second = u + 32 < units;
        sil_load_unit<T>(row, u, wa);
        if (second)
            sil_load_unit<T>(row, u + 32, wb);
        sil_unit_dot<N>(wa, a, units, u, acc);
        if (second)
            sil_unit_dot<N>(wb, a, units, u + 32, acc);
    }
#pragma unroll
    for (int j = 0; j < N; j++) {
        const float v = sil_warp_sum(acc[j]);
        if (lane == 0)
            y[(int64_t)j * ldy + r] = v;
        if (EP && lane == 1)
            sil_conv_ep_row(*ep, r, j, v);
    }
}

// Float weights: 0 F32, 1 F16, 2 BF16. vec: cols % 8 == 0 and rows 16-byte aligned.
template <int F> __device__ __forceinline__ float sil_wf(const uint8_t *row, int64_t i)
{
    if (F == 0)
        return ((const float *)row)[i];
    const uint16_t h = ((const uint16_t *)row)[i];
    if (F == 1)
        return __half2float(__ushort_as_half(h));
    return __uint_as_float((uint32_t)h << 16);
}

template <int F> __device__ __forceinline__ void sil_wf8(const uint8_t *row, int64_t c, float *v)
{
    if (F == 0) {
        const float4 a = ((const float4 *)row)[c * 2], b = ((const float4 *)row)[c * 2 + 1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
        return;
    }
    const uint4 q = ((const uint4 *)row)[c];
    const uint32_t p[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        if (F == 1) {
            v[2 * i] = __half2float(__ushort_as_half((uint16_t)(p[i] & 0xffff)));
            v[2 * i + 1] = __half2float(__ushort_as_half((uint16_t)(p[i] >> 16)));
        } else {
            v[2 * i] = __uint_as_float(p[i] << 16);
            v[2 * i + 1] = __uint_as_float(p[i] & 0xffff0000u);
        }
    }
}

#define SIL_MMVF_UNROLL 8

// Rows over blocks of WARPS warps, a warp a row (the sums of a row do not depend on WARPS).
template <int F, int N, int WARPS = SIL_MMV_WARPS>
__device__ __forceinline__ void sil_mmvf(const uint8_t *__restrict__ w, uint64_t row_bytes,
                                         int rows, int64_t cols, int vec,
                                         const float *__restrict__ x, float *__restrict__ y,
                                         int64_t ldy)
{
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (r >= rows)
        return;
    const uint8_t *row = w + (uint64_t)r * row_bytes;
    float acc[N];
#pragma unroll
    for (int j = 0; j < N; j++)
        acc[j] = 0.0f;
    if (vec) {
        // SIL_MMVF_UNROLL groups of 8 weights loaded before any is used (the loop's sums in
        // the same order)
        const int64_t nc = cols / 8;
        for (int64_t c0 = lane; c0 < nc; c0 += 32 * SIL_MMVF_UNROLL) {
            float v[SIL_MMVF_UNROLL][8];
#pragma unroll
            for (int q = 0; q < SIL_MMVF_UNROLL; q++)
                if (c0 + 32 * q < nc)
                    sil_wf8<F>(row, c0 + 32 * q, v[q]);
#pragma unroll
            for (int q = 0; q < SIL_MMVF_UNROLL; q++) {
                const int64_t c = c0 + 32 * q;
                if (c >= nc)
                    break;
#pragma unroll
                for (int j = 0; j < N; j++) {
                    const float4 *xa = (const float4 *)(x + j * cols) + 2 * c;
                    const float4 p = xa[0], r = xa[1];
                    acc[j] += v[q][0] * p.x + v[q][1] * p.y + v[q][2] * p.z + v[q][3] * p.w +
                              v[q][4] * r.x + v[q][5] * r.y + v[q][6] * r.z + v[q][7] * r.w;
                }
            }
        }
    } else {
        for (int64_t i = lane; i < cols; i += 32) {
            const float v = sil_wf<F>(row, i);
#pragma unroll
            for (int j = 0; j < N; j++)
                acc[j] += v * x[j * cols + i];
        }
    }
#pragma unroll
    for (int j = 0; j < N; j++) {
        const float v = sil_warp_sum(acc[j]);
        if (lane == 0)
            y[(int64_t)j * ldy + r] = v;
    }
}

#define SIL_MMVQ_ENTRY(NAME, T, N)                                                                \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32)                              \
        sil_mmvq_##NAME##_##N(const uint8_t *w, uint64_t row_bytes, int rows, int units,          \
                              const uint8_t *a, float *y, int64_t ldy)                            \
    {                                                                                             \
        if (threadIdx.x == 0)                                                                     \
            sil_l2_prefetch_share(w, (uint64_t)rows * row_bytes, blockIdx.x, sil_pf_blocks());    \
        SIL_PDL_ENTRY();                                                                          \
        sil_mmvq<T, N>(w, row_bytes, rows, units, a, y, ldy, blockIdx.x);                         \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32)                              \
        sil_mmvq_multi_##NAME##_##N(sil_mv_set set, int units, const uint8_t *a)                  \
    {                                                                                             \
        sil_mv_set_prefetch(set);                                                                 \
        SIL_PDL_ENTRY();                                                                          \
        int k = 0;                                                                                \
        while (k + 1 < set.n && (int)blockIdx.x >= set.blk0[k + 1])                               \
            k++;                                                                                  \
        sil_mmvq<T, N>(set.w[k], set.row_bytes[k], set.rows[k], units, a, set.y[k], set.ldy[k],   \
                       (int)blockIdx.x - set.blk0[k]);                                            \
    }
// Up to SIL_MV_SET_MAX weights of one type sharing one input, in one launch: weight k takes
// blocks blk0[k] .. blk0[k + 1] (the host lays them out), as its own matvec would.
#define SIL_MV_SET_MAX 4
struct sil_mv_set {
    const uint8_t *w[SIL_MV_SET_MAX];
    uint64_t row_bytes[SIL_MV_SET_MAX];
    int rows[SIL_MV_SET_MAX];
    float *y[SIL_MV_SET_MAX];
    int64_t ldy[SIL_MV_SET_MAX];
    int blk0[SIL_MV_SET_MAX + 1];
    int n;
    int type[SIL_MV_SET_MAX]; // sil_cuda_wt of each weight (the mixed sets)
};

// Before the wait: thread k asks L2 for this block's share of weight k (sil_l2_prefetch_share).
__device__ __forceinline__ void sil_mv_set_prefetch(const sil_mv_set &set)
{
    const int k = threadIdx.x;
    if (k < set.n && k < SIL_MV_SET_MAX)
        sil_l2_prefetch_share(set.w[k], (uint64_t)set.rows[k] * set.row_bytes[k], blockIdx.x,
                              sil_pf_blocks());
}

// A set of the K-quant and Q8_0 types mixed (the recipes' qkv in Q6_K beside its gate in Q4_K):
// weight k runs as sil_mmvq of its own type, so each output is what its own matvec gives. EP:
// weight 0 writes the delta net's qkv_mixed, with the conv epilogue ep on it.
#define SIL_MIXED_CASE(T, N)                                                                      \
    case T:                                                                                       \
        if (EP && k == 0)                                                                         \
            sil_mmvq<T, N, true>(set.w[k], set.row_bytes[k], set.rows[k], units, a, set.y[k],     \
                                 set.ldy[k], bx, ep);                                             \
        else                                                                                      \
            sil_mmvq<T, N>(set.w[k], set.row_bytes[k], set.rows[k], units, a, set.y[k],           \
                           set.ldy[k], bx);                                                       \
        break;
template <int N, bool EP>
__device__ __forceinline__ void sil_mmvq_mixed(const sil_mv_set &set, int units, const uint8_t *a,
                                               const sil_conv_ep *ep)
{
    int k = 0;
    while (k + 1 < set.n && (int)blockIdx.x >= set.blk0[k + 1])
        k++;
    const int bx = (int)blockIdx.x - set.blk0[k];
    switch (set.type[k]) {
        SIL_MIXED_CASE(WT_Q4_K, N)
        SIL_MIXED_CASE(WT_Q5_K, N)
        SIL_MIXED_CASE(WT_Q6_K, N)
        SIL_MIXED_CASE(WT_Q8_0, N)
    default:
        break;
    }
}
#define SIL_MMVQ_MIXED_ENTRY(N)                                                                    \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32)                              \
        sil_mmvq_mixed_##N(sil_mv_set set, int units, const uint8_t *a)                           \
    {                                                                                             \
        sil_mv_set_prefetch(set);                                                                 \
        SIL_PDL_ENTRY();                                                                          \
        sil_mmvq_mixed<N, false>(set, units, a, nullptr);                                         \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32)                              \
        sil_mmvq_mixed_conv_##N(sil_mv_set set, int units, const uint8_t *a, sil_conv_ep ep)       \
    {                                                                                             \
        sil_mv_set_prefetch(set);                                                                 \
        SIL_PDL_ENTRY();                                                                          \
        sil_mmvq_mixed<N, true>(set, units, a, &ep);                                              \
    }

#define SIL_MMVF_ENTRY(NAME, F, N)                                                                \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32)                              \
        sil_mmvf_##NAME##_##N(const uint8_t *w, uint64_t row_bytes, int rows, int64_t cols,       \
                              int vec, const float *x, float *y, int64_t ldy)                     \
    {                                                                                             \
        if (threadIdx.x == 0)                                                                     \
            sil_l2_prefetch_share(w, (uint64_t)rows * row_bytes, blockIdx.x, sil_pf_blocks());    \
        SIL_PDL_ENTRY();                                                                          \
        sil_mmvf<F, N>(w, row_bytes, rows, cols, vec, x, y, ldy);                                 \
    }
#define SIL_BATCHES(E, NAME, T)                                                                   \
    E(NAME, T, 1) E(NAME, T, 2) E(NAME, T, 3) E(NAME, T, 4) E(NAME, T, 5) E(NAME, T, 6)          \
        E(NAME, T, 7) E(NAME, T, 8)

// the entry points (a module that includes this file for its device functions defines
// SIL_MMVQ_NO_ENTRIES)
#ifndef SIL_MMVQ_NO_ENTRIES
SIL_BATCHES(SIL_MMVQ_ENTRY, q4_0, WT_Q4_0)
SIL_BATCHES(SIL_MMVQ_ENTRY, q4_1, WT_Q4_1)
SIL_BATCHES(SIL_MMVQ_ENTRY, q5_0, WT_Q5_0)
SIL_BATCHES(SIL_MMVQ_ENTRY, q5_1, WT_Q5_1)
SIL_BATCHES(SIL_MMVQ_ENTRY, q8_0, WT_Q8_0)
SIL_BATCHES(SIL_MMVQ_ENTRY, q4_K, WT_Q4_K)
SIL_BATCHES(SIL_MMVQ_ENTRY, q5_K, WT_Q5_K)
SIL_BATCHES(SIL_MMVQ_ENTRY, q6_K, WT_Q6_K)
SIL_MMVQ_MIXED_ENTRY(1)
SIL_MMVQ_MIXED_ENTRY(2)
SIL_MMVQ_MIXED_ENTRY(3)
SIL_MMVQ_MIXED_ENTRY(4)
SIL_MMVQ_MIXED_ENTRY(5)
SIL_MMVQ_MIXED_ENTRY(6)
SIL_MMVQ_MIXED_ENTRY(7)
SIL_MMVQ_MIXED_ENTRY(8)
SIL_BATCHES(SIL_MMVF_ENTRY, f32, 0)
SIL_BATCHES(SIL_MMVF_ENTRY, f16, 1)
SIL_BATCHES(SIL_MMVF_ENTRY, bf16, 2)
#endif

// x [n][k] F32 -> q8 blocks (sil_q8_at layout); one warp per block of 32, nblocks = n * k / 32.
// One warp rounds 32 consecutive floats (v: one a lane) into block b of a q8 buffer of nblocks
// blocks (layout: SIL_CUDA_Q8_BLOCK in cuda_backend.h). All 32 lanes call it.
__device__ __forceinline__ void sil_q8_store_block(float v, int64_t b, int64_t nblocks,
                                                   uint8_t *__restrict__ out)
{
    const int lane = threadIdx.x & 31;
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : (int)roundf(__fdiv_rn(v, d));
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    out[b * 32 + lane] = (uint8_t)(int8_t)q;
    if (lane == 0)
        ((float2 *)(out + nblocks * 32))[b] = make_float2(d, d * (float)sum);
}

extern "C" __global__ void __launch_bounds__(256)
    sil_quantize_q8_1(const float *__restrict__ x, int64_t nblocks, uint8_t *__restrict__ out)
{
    SIL_PDL_ENTRY();
    const int64_t b = (int64_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (b >= nblocks)
        return;
    sil_q8_store_block(x[b * 32 + lane], b, nblocks, out);
}
