// Element-wise and per-row ops of the forward pass, in the CPU backend's arithmetic
// (kernels/cpu/ops.c) so results agree to float rounding: rmsnorm, add, swiglu, NeoX rope,
// softmax router with top-k, argmax.
#pragma once

#include <math.h>
#include <stdint.h>

#define SIL_ROW_THREADS 256

// Block-wide sum over SIL_ROW_THREADS threads; every thread gets the total.
__device__ __forceinline__ float sil_block_sum(float v, float *sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads(); // sh may still be read by a previous call
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    v = lane < SIL_ROW_THREADS / 32 ? sh[lane] : 0.0f;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float sil_block_max(float v, float *sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0)
        sh[w] = v;
    __syncthreads();
    v = lane < SIL_ROW_THREADS / 32 ? sh[lane] : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// One block per row.
extern "C" __global__ void __launch_bounds__(SIL_ROW_THREADS)
    sil_rmsnorm_f32(float *y, const float *x, const float *w, int64_t n, float eps)
{
    SIL_PDL_ENTRY();
    __shared__ float sh[32];
    const float *xr = x + blockIdx.x * n;
    float *yr = y + blockIdx.x * n;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += SIL_ROW_THREADS)
        ss += xr[i] * xr[i];
    ss = sil_block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += SIL_ROW_THREADS)
        yr[i] = w ? xr[i] * scale * w[i] : xr[i] * scale;
}

extern "C" __global__ void sil_add_f32(float *y, const float *x, int64_t n)
{
    SIL_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        y[i] += x[i];
}

extern "C" __global__ void sil_swiglu_f32(float *out, const float *gate, const float *up,
                                          int64_t n)
{
    SIL_PDL_ENTRY();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

// grid (n_head, n_tok); thread i < n_rot/2 rotates the pair (i, i + n_rot/2). The angle is built
// by repeated multiplication as the CPU backend does, with theta_scale computed on the host.
extern "C" __global__ void sil_rope_neox_f32(float *x, int n_head, int head_dim, int n_rot,
                                             const int32_t *pos, float theta_scale)
{
    SIL_PDL_ENTRY();
    const int half = n_rot / 2;
    float *v = x + ((int64_t)blockIdx.y * n_head + blockIdx.x) * head_dim;
    const float p = (float)pos[blockIdx.y];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float theta = p;
        for (int k = 0; k < i; k++)
            theta *= theta_scale;
        const float cs = cosf(theta), sn = sinf(theta);
        const float a = v[i], b = v[i + half];
        v[i] = __fsub_rn(__fmul_rn(a, cs), __fmul_rn(b, sn));
        v[i + half] = __fadd_rn(__fmul_rn(a, sn), __fmul_rn(b, cs));
    }
}

// Largest (value, then lowest index) over the block; returns the index (n if none).
__device__ __forceinline__ int sil_block_argmax(float v, int idx, float *shv, int *shi)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx))
            v = ov, idx = oi;
    }
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0)
        shv[w] = v, shi[w] = idx;
    __syncthreads();
    if (lane < SIL_ROW_THREADS / 32)
        v = shv[lane], idx = shi[lane];
    else
        v = -INFINITY, idx = 0x7fffffff;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > v || (ov == v && oi < idx))
            v = ov, idx = oi;
    }
    return idx;
}

// The argmax of each row split over gridDim.x blocks (grid (blocks, rows)): block b scans
// elements b * SIL_ROW_THREADS + tid + j * stride, four loads in flight, and leaves its best
// (value, index) in scratch; the last block of the row (done counts them, zero between
// launches) merges them, ties to the lower index (a thread's candidate starts at (-inf,
// INT_MAX); NaN never compares greater): the first largest, as on the CPU. scratch: row r's
// ld ints at r * ld, whatever the rows and blocks of a launch (so a launch of fewer rows or
// blocks leaves no value where a later one counts): done int32, then value [blocks] float,
// then index [blocks] int32 (ld >= 1 + 2 blocks).
extern "C" __global__ void __launch_bounds__(SIL_ROW_THREADS)
    sil_argmax_f32(const float *x, int64_t n, int32_t *out, int *scratch, int ld)
{
    SIL_PDL_ENTRY();
    __shared__ float shv[32];
    __shared__ int shi[32];
    const int r = blockIdx.y, nb = gridDim.x;
    int *done = scratch + (int64_t)r * ld;
    float *pv = (float *)(done + 1);
    int *pi = done + 1 + nb;
    const float *xr = x + (int64_t)r * n;
    const int64_t stride = (int64_t)nb * SIL_ROW_THREADS;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int64_t i0 = (int64_t)blockIdx.x * SIL_ROW_THREADS + threadIdx.x; i0 < n;
         i0 += 4 * stride) {
        float v[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
            v[q] = i0 + q * stride < n ? xr[i0 + q * stride] : -INFINITY;
#pragma unroll
        for (int q = 0; q < 4; q++)
            if (i0 + q * stride < n && v[q] > bv)
                bv = v[q], bi = (int)(i0 + q * stride);
    }
    bi = sil_block_argmax(bv, bi, shv, shi);
    if (threadIdx.x == 0) {
        pv[blockIdx.x] = bi == 0x7fffffff ? -INFINITY : xr[bi];
        pi[blockIdx.x] = bi;
    }
    if (!sil_last_block(done, nb))
        return;
    float v = -INFINITY;
    int idx = 0x7fffffff;
    for (int b = threadIdx.x; b < nb; b += SIL_ROW_THREADS) {
        const float ov = __ldcg(pv + b);
        const int oi = __ldcg(pi + b);
        if (oi != 0x7fffffff && (idx == 0x7fffffff || ov > v || (ov == v && oi < idx)))
            v = ov, idx = oi;
    }
    idx = sil_block_argmax(v, idx, shv, shi);
    if (threadIdx.x == 0) {
        out[r] = idx == 0x7fffffff ? 0 : idx;
        *done = 0;
    }
}

#define SIL_ROUTER_MAX 1024

#define SIL_ROUTER_WARPS 4

// One warp's top-k of one token's router logits l [n_expert] (n_expert <= 32 R; lane i holds
// experts i, i + 32, ... in registers): softmax over n_expert, then k rounds of warp argmax over
// the experts not yet taken (ties to the lower id); ids and weights [k] get the choices and
// p_e / sum(p_top), the sum in selection order clamped below at 2^-14. CG: l was written by
// other blocks of this grid (read past L1). No block barrier anywhere.
template <bool CG, int R>
__device__ __forceinline__ void sil_topk_warp_reg(const float *l, int n_expert, int k,
                                                  int32_t *ids, float *weights)
{
    const int lane = threadIdx.x & 31;
    float pv[R];
#pragma unroll
    for (int m = 0; m < R; m++) {
        const int e = lane + 32 * m;
        pv[m] = e < n_expert ? (CG ? __ldcg(l + e) : l[e]) : -INFINITY;
    }
    float mx = -INFINITY;
#pragma unroll
    for (int m = 0; m < R; m++)
        if (lane + 32 * m < n_expert)
            mx = fmaxf(mx, pv[m]);
#if __CUDA_ARCH__ >= 800
    {
        // one warp reduction instruction on the float's bits made order-preserving
        const unsigned b = __float_as_uint(mx);
        const unsigned key = (b & 0x80000000u) ? ~b : b | 0x80000000u;
        const unsigned top = __reduce_max_sync(0xffffffffu, key);
        mx = __uint_as_float((top & 0x80000000u) ? top & 0x7fffffffu : ~top);
    }
#else
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
#endif
    float sum = 0.0f;
#pragma unroll
    for (int m = 0; m < R; m++)
        if (lane + 32 * m < n_expert) {
            const float v = expf(pv[m] - mx);
            pv[m] = v;
            sum += v;
        }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = 1.0f / sum;
#pragma unroll
    for (int m = 0; m < R; m++)
        pv[m] *= inv;
    const float taken = -2.0f; // below any probability
    float top = 0.0f, my_p = 0.0f;
    int my_id = 0;
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
#pragma unroll
        for (int m = 0; m < R; m++) {
            const int e = lane + 32 * m;
            const float v = pv[m];
            if (e < n_expert && v != taken && (bi == 0x7fffffff || v > bv))
                bv = v, bi = e;
        }
#if __CUDA_ARCH__ >= 800
        {
            // the probabilities are >= 0, so their bits order as they do: the largest in one
            // warp reduction, then the lowest expert holding it in another (0: no candidate)
            const unsigned key = bi == 0x7fffffff ? 0u : __float_as_uint(bv) + 1u;
            const unsigned top = __reduce_max_sync(0xffffffffu, key);
            const unsigned who = __reduce_min_sync(
                0xffffffffu, top != 0u && key == top ? (unsigned)bi : 0x7fffffffu);
            bi = (int)who;
            bv = top ? __uint_as_float(top - 1u) : -INFINITY;
        }
#else
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi != 0x7fffffff && (bi == 0x7fffffff || ov > bv || (ov == bv && oi < bi)))
                bv = ov, bi = oi;
        }
        bi = __shfl_sync(0xffffffffu, bi, 0);
        bv = __shfl_sync(0xffffffffu, bv, 0);
#endif
        const float p0 = __shfl_sync(0xffffffffu, pv[0], 0);
        if (bi == 0x7fffffff)
            bi = 0, bv = p0;
        if (lane == j)
            my_id = bi, my_p = bv;
        if (lane == (bi & 31)) {
#pragma unroll
            for (int m = 0; m < R; m++)
                if (m == (bi >> 5))
                    pv[m] = taken;
        }
        top += bv;
    }
    if (top < 6.103515625e-5f)
        top = 6.103515625e-5f;
    if (lane < k) {
        ids[lane] = my_id;
        weights[lane] = my_p / top;
    }
}

// 8 experts a lane for up to 256 (the common sizes), else 32 (SIL_ROUTER_MAX).
template <bool CG>
__device__ __forceinline__ void sil_topk_warp(const float *l, int n_expert, int k, int32_t *ids,
                                              float *weights)
{
    if (n_expert <= 256)
        sil_topk_warp_reg<CG, 8>(l, n_expert, k, ids, weights);
    else
        sil_topk_warp_reg<CG, SIL_ROUTER_MAX / 32>(l, n_expert, k, ids, weights);
}

// One warp per token (SIL_ROUTER_WARPS tokens a block): sil_topk_warp of each row of logits.
extern "C" __global__ void __launch_bounds__(SIL_ROUTER_WARPS * 32)
    sil_router_topk_f32(const float *logits, int n_tok, int n_expert, int k, int32_t *ids,
                        float *weights)
{
    SIL_PDL_ENTRY();
    const int w = threadIdx.x >> 5;
    const int t = blockIdx.x * SIL_ROUTER_WARPS + w;
    if (t >= n_tok)
        return;
    sil_topk_warp<false>(logits + (int64_t)t * n_expert, n_expert, k, ids + (int64_t)t * k,
                         weights + (int64_t)t * k);
}

// The router in one launch for N <= 8 tokens: an F32 matvec (sil_mmvf, as sil_mmvf_f32_N) into
// logits [N][rows], then the last block to finish (done: one counter, zero between launches)
// runs sil_router_topk_f32's top-k of every token: the same numbers as the two launches.
#define SIL_ROUTER_FUSED_ENTRY(N)                                                                 \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32) sil_router_f32_topk_##N(    \
        const uint8_t *w, uint64_t row_bytes, int rows, int64_t cols, int vec, const float *x,   \
        float *logits, int k, int32_t *ids, float *weights, int *done)                           \
    {                                                                                             \
        if (threadIdx.x == 0)                                                                     \
            sil_l2_prefetch_share(w, (uint64_t)rows * row_bytes, blockIdx.x, sil_pf_blocks());    \
        SIL_PDL_ENTRY();                                                                          \
        sil_mmvf<0, N>(w, row_bytes, rows, cols, vec, x, logits, rows);                           \
        if (!sil_last_block(done, (int)gridDim.x))                                                \
            return;                                                                               \
        const int wp = threadIdx.x >> 5;                                                          \
        for (int t = wp; t < N; t += SIL_MMV_WARPS)                                               \
            sil_topk_warp<true>(logits + (int64_t)t * rows, rows, k, ids + (int64_t)t * k,       \
                                weights + (int64_t)t * k);                                        \
        if (threadIdx.x == 0)                                                                     \
            *done = 0;                                                                            \
    }
SIL_ROUTER_FUSED_ENTRY(1)
SIL_ROUTER_FUSED_ENTRY(2)
SIL_ROUTER_FUSED_ENTRY(3)
SIL_ROUTER_FUSED_ENTRY(4)
SIL_ROUTER_FUSED_ENTRY(5)
SIL_ROUTER_FUSED_ENTRY(6)
SIL_ROUTER_FUSED_ENTRY(7)
SIL_ROUTER_FUSED_ENTRY(8)

// The residual add + RMSNorm + q8 before a decode MoE (one token) and its router in one launch,
// in blocks of the threads the engine's add + rmsnorm + q8 launch takes (sil_fwd_add_rmsnorm_q8
// in fwd.cu, NT = 128, 512 or 1024 as sil_cuda_rmsnorm_threads gives for n): every block
// computes y = rmsnorm(x + d) * nw as that launch does (the same elements a thread, the same
// sums in the same order, n % 32 == 0, n <= SIL_ROUTER_NORM_E NT), keeps it in shared memory
// for its rows of sil_router_f32_topk_1's matvec (a warp a row, NT / 32 rows a block) and
// writes y and its q8 blocks where q8 block b is its turn (b % gridDim.x == blockIdx.x); the
// last block to finish (done: one counter, zero between launches) writes x += d, then the
// top-k. The same numbers as the two launches.
#define SIL_ROUTER_NORM_E 8 // elements a thread
#define SIL_ROUTER_NORM_MAX 4096

// v[e] = x[i] + d[i] and w[i] for i = threadIdx.x + e NT (e < SIL_ROUTER_NORM_E, i < n), every
// load first; returns 1 / sqrt(mean(v^2) + eps), summed as sil_fwd_add_rmsnorm_q8 sums with NT
// threads. CG: d was written by other blocks of this grid (read past L1).
template <int NT, bool CG>
__device__ __forceinline__ float sil_add_rmsnorm_load(const float *x, const float *d,
                                                      const float *w, int n, float eps, float *v,
                                                      float *wv, float *sh)
{
    const int tid = threadIdx.x, lane = tid & 31;
#pragma unroll
    for (int e = 0; e < SIL_ROUTER_NORM_E; e++) {
        const int i = tid + e * NT;
        const bool in = i < n;
        v[e] = in ? x[i] + (CG ? __ldcg(d + i) : d[i]) : 0.0f;
        wv[e] = in ? w[i] : 1.0f;
    }
    float ss = 0.0f;
#pragma unroll
    for (int e = 0; e < SIL_ROUTER_NORM_E; e++) {
        if (tid + e * NT >= n)
            break;
        ss += v[e] * v[e];
    }
    // fwd_block_sum_n's steps
    ss = sil_warp_sum(ss);
    __syncthreads();
    if (lane == 0)
        sh[tid >> 5] = ss;
    __syncthreads();
    ss = sil_warp_sum(lane < NT / 32 ? sh[lane] : 0.0f);
    return 1.0f / sqrtf(ss / (float)n + eps);
}

// RW: router rows a block (a warp each; the block's other warps only share the norm), so the
// launch has rows / RW blocks. 4 spreads the weight reads over more multiprocessors than NT / 32
// (as few blocks as the norm's threads allow) did: 472.1 against 454.1 tok/s on the 35B shape
// (bench/results/cuda-35b-router-rows-h200-20261203.json). The same sums either way.
template <int NT, int RW>
__device__ __forceinline__ void
sil_router_norm(const uint8_t *w, uint64_t row_bytes, int rows, int n, int vec, float *x,
                const float *d, const float *nw, float eps, float *y, uint8_t *q8, float *logits,
                int k, int32_t *ids, float *weights, int *done)
{
    __shared__ float sh[32];
    __shared__ __align__(16) float ys[SIL_ROUTER_NORM_MAX];
    const int tid = threadIdx.x;
    float v[SIL_ROUTER_NORM_E], wv[SIL_ROUTER_NORM_E];
    const float scale = sil_add_rmsnorm_load<NT, false>(x, d, nw, n, eps, v, wv, sh);
#pragma unroll
    for (int e = 0; e < SIL_ROUTER_NORM_E; e++) {
        const int i = tid + e * NT;
        if (i >= n)
            break;
        const float o = v[e] * scale * wv[e];
        ys[i] = o;
        if ((i >> 5) % (int)gridDim.x == (int)blockIdx.x) { // the same for the whole warp
            y[i] = o;
            sil_q8_store_block(o, i >> 5, n / 32, q8);
        }
    }
    __syncthreads();
    if ((int)threadIdx.x < RW * 32)
        sil_mmvf<0, 1, RW>(w, row_bytes, rows, n, vec, ys, logits, rows);
    if (!sil_last_block(done, (int)gridDim.x))
        return;
#pragma unroll
    for (int e = 0; e < SIL_ROUTER_NORM_E; e++) {
        const int i = tid + e * NT;
        if (i < n)
            x[i] = v[e];
    }
    if (tid < 32)
        sil_topk_warp<true>(logits, rows, k, ids, weights);
    if (tid == 0)
        *done = 0;
}

#define SIL_ROUTER_NORM_ENTRY(NT, RW)                                                             \
    extern "C" __global__ void __launch_bounds__(NT) sil_router_norm_f32_topk_##NT(              \
        const uint8_t *w, uint64_t row_bytes, int rows, int64_t cols, int vec, float *x,         \
        const float *d, const float *nw, float eps, float *y, uint8_t *q8, float *logits, int k, \
        int32_t *ids, float *weights, int *done)                                                 \
    {                                                                                             \
        if (threadIdx.x == 0)                                                                     \
            sil_l2_prefetch_share(w, (uint64_t)rows * row_bytes, blockIdx.x, sil_pf_blocks());    \
        SIL_PDL_ENTRY();                                                                          \
        sil_router_norm<NT, RW>(w, row_bytes, rows, (int)cols, vec, x, d, nw, eps, y, q8, logits, k, \
                            ids, weights, done);                                                 \
    }
SIL_ROUTER_NORM_ENTRY(128, 4)
SIL_ROUTER_NORM_ENTRY(512, 4)
SIL_ROUTER_NORM_ENTRY(1024, 4)
