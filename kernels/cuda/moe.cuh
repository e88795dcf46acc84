// Fused MoE for decode over an explicit expert plan: ids [n_tok][k] name the experts of each
// token. Expert weights are stacked as GGUF stores them ([n_expert][rows][cols], one weight of
// n_expert * rows rows), so expert e's row r is row e * rows + r.
//   gate_up: grid (n_ff / 4, n_tok * k), a warp per (pair, row): h = silu(gate . x) * (up . x),
//            both dots from one pass over the token's q8 activations;
//   down:    grid (n_embd / 4, n_tok), a warp per (token, row): y = sum_j w_j down_{e_j} . h_j,
//            the lanes spread over (j, unit) so k * n_ff / 32 units keep all 32 lanes busy.
// An expert id out of range writes NaN (the host checks ids it builds; NaN makes a bad plan show).
#pragma once

__device__ __forceinline__ sil_q8_view sil_q8_row(sil_q8_view a, int64_t row, int units)
{
    return {a.q + 2 * row * units, a.ds + row * units};
}

// The matrix an id names:
//   tab (zero-copy misses, device routing): e is an expert id < n_expert, resident in slot
//     tab[e] of w (stride apart, n_slot of them) when tab[e] >= 0, else read in place from host
//     memory hw (h_stride apart);
//   no tab: e is matrix e < n_expert of w (a stack, or slots).
// NULL when the id (or its slot) is out of range.
__device__ __forceinline__ const uint8_t *sil_moe_mat(const uint8_t *w, uint64_t stride,
                                                      const uint8_t *hw, uint64_t h_stride,
                                                      const int32_t *__restrict__ tab, int n_slot,
                                                      int n_expert, int e)
{
    if (tab) {
        if (e < 0 || e >= n_expert)
            return nullptr;
        const int s = tab[e];
        if (s >= 0)
            return s < n_slot ? w + (uint64_t)s * stride : nullptr;
        return hw + (uint64_t)e * h_stride;
    }
    return e >= 0 && e < n_expert ? w + (uint64_t)e * stride : nullptr;
}

// One warp's gate and up dots of one row pair with one token's q8 activations: lane l takes
// units l, l + 32, ...; two units of each matrix are loaded before either is used (the same
// sums in the same order as one unit at a time).
template <int T>
__device__ __forceinline__ void sil_gate_up_dots(const uint8_t *__restrict__ g8,
                                                 const uint8_t *__restrict__ u8, sil_q8_view a,
                                                 int units, float *g, float *u)
{
    int i = threadIdx.x & 31;
    for (; i + 32 < units; i += 64) {
        sil_wunit wa, wb, wc, wd;
        sil_load_unit<T>(g8, i, wa);
        sil_load_unit<T>(u8, i, wb);
        sil_load_unit<T>(g8, i + 32, wc);
        sil_load_unit<T>(u8, i + 32, wd);
        sil_unit_dot<1>(wa, a, units, i, g);
        sil_unit_dot<1>(wb, a, units, i, u);
        sil_unit_dot<1>(wc, a, units, i + 32, g);
        sil_unit_dot<1>(wd, a, units, i + 32, u);
    }
    if (i < units) {
        sil_wunit wa, wb;
        sil_load_unit<T>(g8, i, wa);
        sil_load_unit<T>(u8, i, wb);
        sil_unit_dot<1>(wa, a, units, i, g);
        sil_unit_dot<1>(wb, a, units, i, u);
    }
}

template <int T>
__device__ __forceinline__ void sil_moe_gate_up(const uint8_t *__restrict__ wg,
                                                const uint8_t *__restrict__ wu,
                                                uint64_t row_bytes, uint64_t mat_stride,
                                                const uint8_t *hg, const uint8_t *hu,
                                                uint64_t h_stride, const int32_t *__restrict__ tab,
                                                int n_slot, int n_ff, int units,
                                                int n_expert, const uint8_t *__restrict__ a8,
                                                int64_t nblocks, const int32_t *__restrict__ ids,
                                                int k, float *__restrict__ h)
{
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * SIL_MMV_WARPS + (threadIdx.x >> 5);
    if (r >= n_ff)
        return;
    const int p = blockIdx.y, t = p / k, e = ids[p];
    const uint8_t *mg = sil_moe_mat(wg, mat_stride, hg, h_stride, tab, n_slot, n_expert, e);
    const uint8_t *mu = sil_moe_mat(wu, mat_stride, hu, h_stride, tab, n_slot, n_expert, e);
    if (!mg || !mu) {
        if (lane == 0)
            h[(int64_t)p * n_ff + r] = __int_as_float(0x7fc00000);
        return;
    }
    const sil_q8_view a = sil_q8_row(sil_q8_at(a8, nblocks), t, units);
    const uint64_t off = (uint64_t)r * row_bytes;
    float g = 0.0f, u = 0.0f;
    sil_gate_up_dots<T>(mg + off, mu + off, a, units, &g, &u);
    g = sil_warp_sum(g);
    u = sil_warp_sum(u);
    if (lane == 0)
        h[(int64_t)p * n_ff + r] = g / (1.0f + expf(-g)) * u;
}

// Down + weighted sum of one token (blockIdx.y) over its k1 slots (k1 <= SIL_MOE_K1_MAX, the
// host's SIL_CUDA_MOE_SLOTS_MAX): a warp per (token, row), the lanes spread over (slot, unit) so
// k1 * n_ff / 32 units keep all 32 lanes busy. The block first puts the slots' matrices and
// weights in shared memory (no id load between a lane's weight loads), then each lane loads
// SIL_DOWN_UNROLL units before it sums them. h8 row of slot j: t * k1 + j. SH: slot k is the
// shared expert sd, weighted sigmoid(sh_logit[t]).
#define SIL_MOE_K1_MAX 32
#define SIL_DOWN_UNROLL 6
template <int T, bool SH, int WARPS = SIL_MMV_WARPS>
__device__ __forceinline__ void sil_moe_down_fast(const uint8_t *__restrict__ wd,
                                                  const uint8_t *__restrict__ sd,
                                                  uint64_t row_bytes, uint64_t mat_stride,
                                                  const uint8_t *hd, uint64_t h_stride,
                                                  const int32_t *__restrict__ tab, int n_slot,
                                                  int n_embd, int units, int n_expert,
                                                  const uint8_t *__restrict__ h8, int64_t nblocks,
                                                  const int32_t *__restrict__ ids,
                                                  const float *__restrict__ wts,
                                                  const float *__restrict__ sh_logit, int k,
                                                  float *__restrict__ y)
{
    __shared__ const uint8_t *mats[SIL_MOE_K1_MAX];
    __shared__ float mw[SIL_MOE_K1_MAX];
    const int t = blockIdx.y, k1 = SH ? k + 1 : k;
    for (int j = threadIdx.x; j < k1; j += blockDim.x) {
        const bool shared = SH && j == k;
        mats[j] = shared ? sd
                         : sil_moe_mat(wd, mat_stride, hd, h_stride, tab, n_slot, n_expert,
                                       ids[t * k + j]);
        mw[j] = shared ? 1.0f / (1.0f + expf(-sh_logit[t])) : wts[t * k + j];
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * WARPS + (threadIdx.x >> 5);
    if (r >= n_embd)
        return;
    const sil_q8_view a = sil_q8_at(h8, nblocks);
    const uint64_t roff = (uint64_t)r * row_bytes;
    const int total = k1 * units;
    float acc = 0.0f;
    bool bad = false;
    for (int i0 = lane; i0 < total; i0 += 32 * SIL_DOWN_UNROLL) {
        sil_wunit w[SIL_DOWN_UNROLL];
        int jq[SIL_DOWN_UNROLL], uq[SIL_DOWN_UNROLL];
#pragma unroll
        for (int q = 0; q < SIL_DOWN_UNROLL; q++) {
            const int idx = i0 + 32 * q;
            jq[q] = idx < total ? idx / units : 0;
            uq[q] = idx - jq[q] * units;
            const uint8_t *m = mats[jq[q]];
            if (idx < total && m)
                sil_load_unit<T>(m + roff, uq[q], w[q]);
        }
#pragma unroll
        for (int q = 0; q < SIL_DOWN_UNROLL; q++) {
            if (i0 + 32 * q >= total)
                break;
            if (!mats[jq[q]]) {
                bad = true;
                continue;
            }
            float d = 0.0f;
            sil_unit_dot<1>(w[q], sil_q8_row(a, (int64_t)t * k1 + jq[q], units), units, uq[q], &d);
            acc += mw[jq[q]] * d;
        }
    }
    acc = sil_warp_sum(acc);
    bad = __any_sync(0xffffffffu, bad);
    if (lane == 0)
        y[(int64_t)t * n_embd + r] = bad ? __int_as_float(0x7fc00000) : acc;
}

// gate_up with the shared expert as slot k of every token (its matrices have the routed
// experts' shape and types): the grid's y is n_tok * (k + 1), h [n_tok * (k + 1)][n_ff]
// with the shared expert's row after the token's k routed ones, and the token's shared block
// (x = 0) also writes sh_logit[t] = gate_inp . x_t (F32, n_embd); down sums the k + 1 slots, the
// shared one weighted by sigmoid(sh_logit[t]), so y is the whole MoE output.
#define SIL_SH_UNROLL 8

// sh_logit[t] = gate_inp . x_t by the whole block, SIL_SH_UNROLL loads of each thread in flight
// (one warp's strided loop here made this block, and so the launch, the last to finish).
__device__ __forceinline__ void sil_moe_sh_logit(const float *__restrict__ x,
                                                 const float *__restrict__ gate_inp, int n_embd,
                                                 int t, float *__restrict__ sh_logit)
{
    __shared__ float red[SIL_MMV_WARPS];
    const int nt = SIL_MMV_WARPS * 32;
    const float *xt = x + (int64_t)t * n_embd;
    float d = 0.0f;
    for (int i0 = threadIdx.x; i0 < n_embd; i0 += nt * SIL_SH_UNROLL) {
        float xv[SIL_SH_UNROLL], gv[SIL_SH_UNROLL];
#pragma unroll
        for (int q = 0; q < SIL_SH_UNROLL; q++) {
            const int i = i0 + q * nt;
            xv[q] = i < n_embd ? xt[i] : 0.0f;
            gv[q] = i < n_embd ? gate_inp[i] : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < SIL_SH_UNROLL; q++)
            d += xv[q] * gv[q];
    }
    d = sil_warp_sum(d);
    if ((threadIdx.x & 31) == 0)
        red[threadIdx.x >> 5] = d;
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = red[0];
#pragma unroll
        for (int w = 1; w < SIL_MMV_WARPS; w++)
            v += red[w];
        sh_logit[t] = v;
    }
}

template <int T>
__device__ __forceinline__ void sil_moe_gate_up_sh(const uint8_t *__restrict__ wg,
                                                   const uint8_t *__restrict__ wu,
                                                   const uint8_t *__restrict__ sg,
                                                   const uint8_t *__restrict__ su,
                                                   uint64_t row_bytes, uint64_t mat_stride,
                                                   const uint8_t *hg, const uint8_t *hu,
                                                   uint64_t h_stride,
                                                   const int32_t *__restrict__ tab, int n_slot,
                                                   int n_ff, int units,
                                                   int n_expert, const uint8_t *__restrict__ a8,
                                                   int64_t nblocks, const int32_t *__restrict__ ids,
                                                   int k, const float *__restrict__ x,
                                                   const float *__restrict__ gate_inp,
                                                   float *__restrict__ sh_logit,
                                                   float *__restrict__ h)
{
    const int lane = threadIdx.x & 31;
    const int p = blockIdx.y, t = p / (k + 1), j = p - t * (k + 1);
    const bool shared = j == k;
    if (shared && blockIdx.x == 0)
        sil_moe_sh_logit(x, gate_inp, units * 32, t, sh_logit);
    const int r = blockIdx.x * SIL_MMV_WARPS + (threadIdx.x >> 5);
    if (r >= n_ff)
        return;
    const int e = shared ? 0 : ids[t * k + j];
    const uint8_t *mg = shared ? sg : sil_moe_mat(wg, mat_stride, hg, h_stride, tab, n_slot, n_expert, e);
    const uint8_t *mu = shared ? su : sil_moe_mat(wu, mat_stride, hu, h_stride, tab, n_slot, n_expert, e);
    if (!mg || !mu) {
        if (lane == 0)
            h[(int64_t)p * n_ff + r] = __int_as_float(0x7fc00000);
        return;
    }
    const sil_q8_view a = sil_q8_row(sil_q8_at(a8, nblocks), t, units);
    const uint64_t off = (uint64_t)r * row_bytes;
    const uint8_t *g8 = mg + off, *u8 = mu + off;
    float g = 0.0f, u = 0.0f;
    sil_gate_up_dots<T>(g8, u8, a, units, &g, &u);
    g = sil_warp_sum(g);
    u = sil_warp_sum(u);
    if (lane == 0)
        h[(int64_t)p * n_ff + r] = g / (1.0f + expf(-g)) * u;
}

// After a gate/up block: the last of pair p's blocks (done[p] counts them, zero between
// launches) rounds the pair's h row [n_ff] (n_ff % 32 == 0) into its q8 blocks as
// sil_quantize_q8_1 of all h rows would (h8 of h8_blocks blocks), so down needs no quantize
// launch. All threads of the block call it.
__device__ __forceinline__ void sil_moe_h8_tail(const float *h, int n_ff, uint8_t *h8,
                                                int64_t h8_blocks, int *done, int p)
{
    if (!sil_last_block(done + p, (int)gridDim.x))
        return;
    const int lane = threadIdx.x & 31, nb = n_ff / 32;
    for (int b0 = threadIdx.x >> 5; b0 < nb; b0 += SIL_MMV_WARPS * 4) {
        float v[4]; // four blocks' loads in flight
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int bi = b0 + q * SIL_MMV_WARPS;
            v[q] = bi < nb ? __ldcg(h + ((int64_t)p * nb + bi) * 32 + lane) : 0.0f;
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int bi = b0 + q * SIL_MMV_WARPS;
            if (bi < nb)
                sil_q8_store_block(v[q], (int64_t)p * nb + bi, h8_blocks, h8);
        }
    }
    if (threadIdx.x == 0)
        done[p] = 0;
}

// Before the wait (sil_l2_prefetch_share): thread j asks L2 for this block's rows of the matrix
// of token blockIdx.y's slot j in a down launch, where it lies in device memory. The ids were
// written by the router, two launches back, so they are there before this launch's wait.
template <bool SH>
__device__ __forceinline__ void sil_moe_down_prefetch(const uint8_t *wd, const uint8_t *sd,
                                                      uint64_t row_bytes, uint64_t mat_stride,
                                                      const int32_t *tab, int n_slot, int n_embd,
                                                      int n_expert, const int32_t *ids, int k)
{
    const int j = threadIdx.x, t = blockIdx.y;
    if (!sil_l2_pf || j >= (SH ? k + 1 : k) || j >= SIL_MOE_K1_MAX)
        return;
    const uint8_t *m = sd;
    if (!SH || j < k) {
        const int e = ids[t * k + j];
        if (e < 0 || e >= n_expert)
            return;
        const int s = tab ? tab[e] : e;
        if (s < 0 || (tab && s >= n_slot))
            return; // read from host memory (or a bad slot): nothing to ask L2 for
        m = wd + (uint64_t)s * mat_stride;
    }
    sil_l2_prefetch_share(m, (uint64_t)n_embd * row_bytes, blockIdx.x, (int)gridDim.x);
}

// Before the wait: the shared expert's gate and up rows of this block (its routed experts are
// the router's output, the launch just before, so they are not known yet).
__device__ __forceinline__ void sil_moe_gate_up_sh_prefetch(const uint8_t *sg, const uint8_t *su,
                                                            uint64_t row_bytes, int n_ff, int k)
{
    if (blockIdx.y != (unsigned)k || threadIdx.x >= 2) // token 0's shared slot
        return;
    sil_l2_prefetch_share(threadIdx.x ? su : sg, (uint64_t)n_ff * row_bytes, blockIdx.x,
                          (int)gridDim.x);
}

#define SIL_MOE_ENTRY(NAME, T)                                                                    \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32)                              \
        sil_moe_gate_up_##NAME(const uint8_t *wg, const uint8_t *wu, uint64_t row_bytes, uint64_t mat_stride,          \
                               const uint8_t *hg, const uint8_t *hu, uint64_t h_stride,           \
                               const int32_t *tab, int n_slot,                                    \
                               int n_ff, int units, int n_expert, const uint8_t *a8,              \
                               int64_t nblocks, const int32_t *ids, int k, float *h, uint8_t *h8, \
                               int64_t h8_blocks, int *done)                                      \
    {                                                                                             \
        SIL_PDL_ENTRY();                                                                          \
        sil_moe_gate_up<T>(wg, wu, row_bytes, mat_stride, hg, hu, h_stride, tab, n_slot, n_ff,    \
                           units, n_expert, a8, nblocks, ids, k, h);                              \
        if (done)                                                                                 \
            sil_moe_h8_tail(h, n_ff, h8, h8_blocks, done, blockIdx.y);                            \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32)                              \
        sil_moe_down_##NAME(const uint8_t *wd, uint64_t row_bytes, uint64_t mat_stride,           \
                            const uint8_t *hd, uint64_t h_stride, const int32_t *tab, int n_slot, \
                            int n_embd, int units,                                                \
                            int n_expert, const uint8_t *h8, int64_t nblocks, const int32_t *ids, \
                            const float *wts, int k, float *y)                                    \
    {                                                                                             \
        sil_moe_down_prefetch<false>(wd, nullptr, row_bytes, mat_stride, tab, n_slot, n_embd,     \
                                     n_expert, ids, k);                                           \
        SIL_PDL_ENTRY();                                                                          \
        sil_moe_down_fast<T, false>(wd, nullptr, row_bytes, mat_stride, hd, h_stride, tab, n_slot, \
                                    n_embd, units, n_expert, h8, nblocks, ids, wts, nullptr, k,   \
                                    y);                                                           \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32) sil_moe_gate_up_sh_##NAME(   \
        const uint8_t *wg, const uint8_t *wu, const uint8_t *sg, const uint8_t *su,               \
        uint64_t row_bytes, uint64_t mat_stride, const uint8_t *hg, const uint8_t *hu,            \
        uint64_t h_stride, const int32_t *tab, int n_slot,                                        \
        int n_ff, int units, int n_expert, const uint8_t *a8, int64_t nblocks,                    \
        const int32_t *ids, int k, const float *x, const float *gate_inp, float *sh_logit,        \
        float *h, uint8_t *h8, int64_t h8_blocks, int *done)                                      \
    {                                                                                             \
        sil_moe_gate_up_sh_prefetch(sg, su, row_bytes, n_ff, k);                                  \
        SIL_PDL_ENTRY();                                                                          \
        sil_moe_gate_up_sh<T>(wg, wu, sg, su, row_bytes, mat_stride, hg, hu, h_stride, tab,       \
                              n_slot, n_ff, units, n_expert, a8, nblocks, ids, k, x, gate_inp,    \
                              sh_logit, h);                                                       \
        if (done)                                                                                 \
            sil_moe_h8_tail(h, n_ff, h8, h8_blocks, done, blockIdx.y);                            \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32) sil_moe_down_sh_##NAME(      \
        const uint8_t *wd, const uint8_t *sd, uint64_t row_bytes, uint64_t mat_stride,            \
        const uint8_t *hd, uint64_t h_stride, const int32_t *tab, int n_slot, int n_embd,         \
        int units, int n_expert, const uint8_t *h8, int64_t nblocks, const int32_t *ids,          \
        const float *wts, const float *sh_logit, int k, float *y)                                 \
    {                                                                                             \
        sil_moe_down_prefetch<true>(wd, sd, row_bytes, mat_stride, tab, n_slot, n_embd, n_expert, \
                                    ids, k);                                                      \
        SIL_PDL_ENTRY();                                                                          \
        sil_moe_down_fast<T, true>(wd, sd, row_bytes, mat_stride, hd, h_stride, tab, n_slot,      \
                                   n_embd, units, n_expert, h8, nblocks, ids, wts, sh_logit, k,   \
                                   y);                                                            \
    }

SIL_MOE_ENTRY(q4_0, WT_Q4_0)
SIL_MOE_ENTRY(q4_1, WT_Q4_1)
SIL_MOE_ENTRY(q5_0, WT_Q5_0)
SIL_MOE_ENTRY(q5_1, WT_Q5_1)
SIL_MOE_ENTRY(q8_0, WT_Q8_0)
SIL_MOE_ENTRY(q4_K, WT_Q4_K)
SIL_MOE_ENTRY(q5_K, WT_Q5_K)
SIL_MOE_ENTRY(q6_K, WT_Q6_K)

