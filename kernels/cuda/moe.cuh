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

// The residual add + RMSNorm + q8 of token row t after a decode MoE, as the last block (NT =
// 512 threads, what sil_cuda_rmsnorm_threads gives for the row) of the row's down launch does
// it instead of a launch of its own: x[t] += d[t] (d written by the grid's other blocks),
// y[t] = rmsnorm(x[t]) * w and its q8 blocks (n_tok rows of n); the same elements a thread and
// the same sums in the same order as sil_fwd_add_rmsnorm_q8, so the same numbers.
template <int NT>
__device__ __forceinline__ void sil_add_rmsnorm_tail(float *x, const float *d, const float *w,
                                                     float eps, float *y, uint8_t *q8, int n,
                                                     int n_tok, int t)
{
    __shared__ float sh[32];
    float v[SIL_ROUTER_NORM_E], wv[SIL_ROUTER_NORM_E];
    float *xr = x + (int64_t)t * n, *yr = y + (int64_t)t * n;
    const float *dr = d + (int64_t)t * n;
    const float scale = sil_add_rmsnorm_load<NT, true>(xr, dr, w, n, eps, v, wv, sh);
#pragma unroll
    for (int e = 0; e < SIL_ROUTER_NORM_E; e++) {
        const int i = threadIdx.x + e * NT;
        if (i >= n)
            break;
        xr[i] = v[e];
        const float o = v[e] * scale * wv[e];
        yr[i] = o;
        sil_q8_store_block(o, ((int64_t)t * n + i) >> 5, (int64_t)n_tok * n / 32, q8);
    }
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

// ---- grouped by expert: decode batches of several tokens ----------------------------------
// The pairs of a launch that name one expert are that expert's group; the block of the group's
// first pair (its owner) reads the expert's rows once for all of them and the other pairs'
// blocks leave at once, so a step reads each distinct expert once however many tokens chose
// it. With SH the shared expert is one group of every token, owned by token 0's slot k.
// h rows keep the per-pair kernels' order (token t's slot j is row t * K1 + j). On the H200 these
// measured slower (fewer, longer blocks; the per-pair kernels' repeats most likely hit L2): the backend
// takes them only when asked (SIL_CUDA_MOE_GROUP=1).
#define SIL_MOE_GRP 8          // rows of a group a pass (a larger group takes more passes)
#define SIL_MOE_GRP_PAIRS 256  // n_tok * k at most (the host's check)
#define SIL_DOWN_GRP_NR 4      // down rows a lane group takes

// The h rows of block p's group in lst (increasing), their count when the block owns the
// group, else -1. All threads call it; ids [n_tok * k].
__device__ __forceinline__ int sil_moe_group(const int32_t *__restrict__ ids, int n_tok, int k,
                                             bool sh, int p, int *lst)
{
    __shared__ int cnt;
    const int K1 = sh ? k + 1 : k, t = p / K1, j = p - t * K1;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        if (sh && j == k) {
            for (int i = lane; t == 0 && i < n_tok; i += 32)
                lst[i] = i * K1 + k;
            if (lane == 0)
                cnt = t == 0 ? n_tok : -1;
        } else {
            const int e = ids[t * k + j], np = n_tok * k;
            int c = 0;
            for (int q0 = 0; q0 < np; q0 += 32) {
                const int q = q0 + lane;
                const bool m = q < np && ids[q] == e;
                const unsigned b = __ballot_sync(0xffffffffu, m);
                if (m) {
                    const int tq = q / k;
                    lst[c + __popc(b & ((1u << lane) - 1u))] = tq * K1 + (q - tq * k);
                }
                c += __popc(b);
            }
            __syncwarp();
            if (lane == 0)
                cnt = lst[0] == p ? c : -1;
        }
    }
    __syncthreads();
    return cnt;
}

// One warp's gate and up dots of one row pair with the q8 activations of cc tokens (h rows
// rows[q], token rows[q] / K1): each unit of the weights is loaded once for all of them. Each
// token's sums are those of sil_gate_up_dots in the same order (to the bit where the compiler
// contracts them alike: the K-quants' differ in the last bits, test_cuda_ops).
template <int T>
__device__ __forceinline__ void sil_gate_up_dots_grp(const uint8_t *__restrict__ g8,
                                                     const uint8_t *__restrict__ u8,
                                                     sil_q8_view a, int units, const int *rows,
                                                     int K1, int cc, float *g, float *u)
{
    int tq[SIL_MOE_GRP];
#pragma unroll
    for (int q = 0; q < SIL_MOE_GRP; q++)
        tq[q] = q < cc ? rows[q] / K1 : 0;
    int i = threadIdx.x & 31;
    for (; i + 32 < units; i += 64) {
        sil_wunit wa, wb, wc, wd;
        sil_load_unit<T>(g8, i, wa);
        sil_load_unit<T>(u8, i, wb);
        sil_load_unit<T>(g8, i + 32, wc);
        sil_load_unit<T>(u8, i + 32, wd);
#pragma unroll
        for (int q = 0; q < SIL_MOE_GRP; q++) {
            if (q >= cc)
                break;
            const sil_q8_view at = sil_q8_row(a, tq[q], units);
            sil_unit_dot<1>(wa, at, units, i, &g[q]);
            sil_unit_dot<1>(wb, at, units, i, &u[q]);
            sil_unit_dot<1>(wc, at, units, i + 32, &g[q]);
            sil_unit_dot<1>(wd, at, units, i + 32, &u[q]);
        }
    }
    if (i < units) {
        sil_wunit wa, wb;
        sil_load_unit<T>(g8, i, wa);
        sil_load_unit<T>(u8, i, wb);
#pragma unroll
        for (int q = 0; q < SIL_MOE_GRP; q++) {
            if (q >= cc)
                break;
            const sil_q8_view at = sil_q8_row(a, tq[q], units);
            sil_unit_dot<1>(wa, at, units, i, &g[q]);
            sil_unit_dot<1>(wb, at, units, i, &u[q]);
        }
    }
}

// gate_up grouped: grid (n_ff / 4, n_tok * K1), a warp per row of the owner's expert for all
// the group's tokens; h and (with done) h8 as sil_moe_gate_up(_sh) write them.
template <int T, bool SH>
__device__ __forceinline__ void
sil_moe_gate_up_grp(const uint8_t *__restrict__ wg, const uint8_t *__restrict__ wu,
                    const uint8_t *__restrict__ sg, const uint8_t *__restrict__ su,
                    uint64_t row_bytes, uint64_t mat_stride, const uint8_t *hg, const uint8_t *hu,
                    uint64_t h_stride, const int32_t *__restrict__ tab, int n_slot, int n_ff,
                    int units, int n_expert, const uint8_t *__restrict__ a8, int64_t nblocks,
                    const int32_t *__restrict__ ids, int k, const float *__restrict__ x,
                    const float *__restrict__ gate_inp, float *__restrict__ sh_logit,
                    float *__restrict__ h, uint8_t *h8, int64_t h8_blocks, int *done)
{
    __shared__ int lst[SIL_MOE_GRP_PAIRS];
    const int K1 = SH ? k + 1 : k, n_tok = (int)gridDim.y / K1;
    const int p = blockIdx.y, t = p / K1, j = p - t * K1;
    const bool shared = SH && j == k;
    if (shared && blockIdx.x == 0)
        sil_moe_sh_logit(x, gate_inp, units * 32, t, sh_logit);
    const int c = sil_moe_group(ids, n_tok, k, SH, p, lst);
    if (c < 0)
        return;
    const int e = shared ? 0 : ids[t * k + j];
    const uint8_t *mg = shared ? sg : sil_moe_mat(wg, mat_stride, hg, h_stride, tab, n_slot, n_expert, e);
    const uint8_t *mu = shared ? su : sil_moe_mat(wu, mat_stride, hu, h_stride, tab, n_slot, n_expert, e);
    const int lane = threadIdx.x & 31;
    const int r = blockIdx.x * SIL_MMV_WARPS + (threadIdx.x >> 5);
    if (r < n_ff) {
        const sil_q8_view a = sil_q8_at(a8, nblocks);
        const uint64_t off = (uint64_t)r * row_bytes;
        for (int c0 = 0; c0 < c; c0 += SIL_MOE_GRP) {
            const int cc = c - c0 < SIL_MOE_GRP ? c - c0 : SIL_MOE_GRP;
            float g[SIL_MOE_GRP], u[SIL_MOE_GRP];
#pragma unroll
            for (int q = 0; q < SIL_MOE_GRP; q++)
                g[q] = u[q] = 0.0f;
            if (mg && mu)
                sil_gate_up_dots_grp<T>(mg + off, mu + off, a, units, lst + c0, K1, cc, g, u);
#pragma unroll
            for (int q = 0; q < SIL_MOE_GRP; q++) {
                if (q >= cc)
                    break;
                const float gs = sil_warp_sum(g[q]), us = sil_warp_sum(u[q]);
                if (lane == 0)
                    h[(int64_t)lst[c0 + q] * n_ff + r] =
                        mg && mu ? gs / (1.0f + expf(-gs)) * us : __int_as_float(0x7fc00000);
            }
        }
    }
    for (int i = 0; done && i < c; i++)
        sil_moe_h8_tail(h, n_ff, h8, h8_blocks, done, lst[i]);
}

// The lanes that share a down row (a power of two covering its units where it can) and the rows
// a block of the grouped down takes.
__device__ __host__ __forceinline__ int sil_down_grp_lanes(int units)
{
    return units > 16 ? 32 : units > 8 ? 16 : 8;
}
__device__ __host__ __forceinline__ int sil_down_grp_rows(int units)
{
    return SIL_MMV_WARPS * (32 / sil_down_grp_lanes(units)) * SIL_DOWN_GRP_NR;
}

// down grouped: grid (ceil(n_embd / rows), n_tok * K1); the owner's lane groups take
// SIL_DOWN_GRP_NR rows each and write every group row's product part[h row][r]; the last block
// of each column (done[blockIdx.x], zero between launches) sums token t's slots in slot order,
// y[t][r] = sum_j w_tj part[t * K1 + j][r] (+ sigmoid(sh_logit[t]) * the shared one's).
template <int T, bool SH>
__device__ __forceinline__ void
sil_moe_down_grp(const uint8_t *__restrict__ wd, const uint8_t *__restrict__ sd,
                 uint64_t row_bytes, uint64_t mat_stride, const uint8_t *hd, uint64_t h_stride,
                 const int32_t *__restrict__ tab, int n_slot, int n_embd, int units, int n_expert,
                 const uint8_t *__restrict__ h8, int64_t nblocks, const int32_t *__restrict__ ids,
                 const float *__restrict__ wts, const float *__restrict__ sh_logit, int k,
                 float *part, float *__restrict__ y, int *done)
{
    __shared__ int lst[SIL_MOE_GRP_PAIRS];
    const int K1 = SH ? k + 1 : k, n_tok = (int)gridDim.y / K1;
    const int p = blockIdx.y, t = p / K1, j = p - t * K1;
    const int L = sil_down_grp_lanes(units), RW = 32 / L, RB = sil_down_grp_rows(units);
    const int c = sil_moe_group(ids, n_tok, k, SH, p, lst);
    if (c >= 0) {
        const bool shared = SH && j == k;
        const uint8_t *m = shared ? sd
                                  : sil_moe_mat(wd, mat_stride, hd, h_stride, tab, n_slot,
                                                n_expert, ids[t * k + j]);
        const int lane = threadIdx.x & 31, sub = lane & (L - 1);
        const int r0 = blockIdx.x * RB + (threadIdx.x >> 5) * RW * SIL_DOWN_GRP_NR + lane / L;
        const sil_q8_view a = sil_q8_at(h8, nblocks);
        for (int c0 = 0; c0 < c; c0 += SIL_MOE_GRP) {
            const int cc = c - c0 < SIL_MOE_GRP ? c - c0 : SIL_MOE_GRP;
            float acc[SIL_DOWN_GRP_NR][SIL_MOE_GRP];
#pragma unroll
            for (int rr = 0; rr < SIL_DOWN_GRP_NR; rr++)
#pragma unroll
                for (int q = 0; q < SIL_MOE_GRP; q++)
                    acc[rr][q] = 0.0f;
            for (int i = sub; m && i < units; i += L) {
                sil_wunit w[SIL_DOWN_GRP_NR];
#pragma unroll
                for (int rr = 0; rr < SIL_DOWN_GRP_NR; rr++) {
                    const int r = r0 + rr * RW;
                    if (r < n_embd)
                        sil_load_unit<T>(m + (uint64_t)r * row_bytes, i, w[rr]);
                }
#pragma unroll
                for (int rr = 0; rr < SIL_DOWN_GRP_NR; rr++) {
                    if (r0 + rr * RW >= n_embd)
                        break;
#pragma unroll
                    for (int q = 0; q < SIL_MOE_GRP; q++) {
                        if (q >= cc)
                            break;
                        sil_unit_dot<1>(w[rr], sil_q8_row(a, lst[c0 + q], units), units, i,
                                        &acc[rr][q]);
                    }
                }
            }
#pragma unroll
            for (int rr = 0; rr < SIL_DOWN_GRP_NR; rr++) {
                const int r = r0 + rr * RW;
#pragma unroll
                for (int q = 0; q < SIL_MOE_GRP; q++) {
                    if (q >= cc)
                        break;
                    float v = acc[rr][q];
                    for (int o = L / 2; o > 0; o >>= 1)
                        v += __shfl_xor_sync(0xffffffffu, v, o);
                    if (sub == 0 && r < n_embd)
                        part[(int64_t)lst[c0 + q] * n_embd + r] = m ? v : __int_as_float(0x7fc00000);
                }
            }
        }
    }
    if (!sil_last_block(done + blockIdx.x, (int)gridDim.y))
        return;
    for (int it = threadIdx.x; it < n_tok * RB; it += blockDim.x) {
        const int tt = it / RB, r = blockIdx.x * RB + (it - tt * RB);
        if (r >= n_embd)
            continue;
        const float *pr = part + (int64_t)tt * K1 * n_embd + r;
        float acc = 0.0f;
        for (int jj = 0; jj < k; jj++)
            acc += wts[tt * k + jj] * __ldcg(pr + (int64_t)jj * n_embd);
        if (SH)
            acc += 1.0f / (1.0f + expf(-sh_logit[tt])) * __ldcg(pr + (int64_t)k * n_embd);
        y[(int64_t)tt * n_embd + r] = acc;
    }
    if (threadIdx.x == 0)
        done[blockIdx.x] = 0;
}

// Before the wait: this block's rows of its pair's expert, where it lies in device memory (the
// ids were written two launches back), shared one included.
__device__ __forceinline__ void sil_moe_down_grp_prefetch(const uint8_t *wd, const uint8_t *sd,
                                                          uint64_t row_bytes, uint64_t mat_stride,
                                                          const int32_t *tab, int n_slot,
                                                          int n_embd, int units, int n_expert,
                                                          const int32_t *ids, int k)
{
    if (!sil_l2_pf || threadIdx.x != 0)
        return;
    const int K1 = sd ? k + 1 : k, t = blockIdx.y / K1, j = blockIdx.y - t * K1;
    const uint8_t *m = sd;
    if (!sd || j < k) {
        const int e = ids[t * k + j];
        if (e < 0 || e >= n_expert)
            return;
        const int s = tab ? tab[e] : e;
        if (s < 0 || (tab && s >= n_slot))
            return;
        m = wd + (uint64_t)s * mat_stride;
    }
    const int RB = sil_down_grp_rows(units), r0 = blockIdx.x * RB;
    const int nr = n_embd - r0 < RB ? n_embd - r0 : RB;
    if (nr > 0)
        sil_l2_prefetch(m + (uint64_t)r0 * row_bytes, (uint64_t)nr * row_bytes);
}

// Before the wait: the shared expert's gate and up rows, where there is one (sg).
__device__ __forceinline__ void sil_moe_gate_up_grp_prefetch(const uint8_t *sg, const uint8_t *su,
                                                             uint64_t row_bytes, int n_ff, int k)
{
    if (sg)
        sil_moe_gate_up_sh_prefetch(sg, su, row_bytes, n_ff, k);
}

#define SIL_MOE_GRP_ENTRY(NAME, T)                                                                \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32) sil_moe_gate_up_grp_##NAME(  \
        const uint8_t *wg, const uint8_t *wu, const uint8_t *sg, const uint8_t *su,               \
        uint64_t row_bytes, uint64_t mat_stride, const uint8_t *hg, const uint8_t *hu,            \
        uint64_t h_stride, const int32_t *tab, int n_slot, int n_ff, int units, int n_expert,     \
        const uint8_t *a8, int64_t nblocks, const int32_t *ids, int k, const float *x,            \
        const float *gate_inp, float *sh_logit, float *h, uint8_t *h8, int64_t h8_blocks,         \
        int *done)                                                                                \
    {                                                                                             \
        sil_moe_gate_up_grp_prefetch(sg, su, row_bytes, n_ff, k);                                 \
        SIL_PDL_ENTRY();                                                                          \
        if (sg)                                                                                   \
            sil_moe_gate_up_grp<T, true>(wg, wu, sg, su, row_bytes, mat_stride, hg, hu, h_stride, \
                                         tab, n_slot, n_ff, units, n_expert, a8, nblocks, ids, k, \
                                         x, gate_inp, sh_logit, h, h8, h8_blocks, done);          \
        else                                                                                      \
            sil_moe_gate_up_grp<T, false>(wg, wu, sg, su, row_bytes, mat_stride, hg, hu,          \
                                          h_stride, tab, n_slot, n_ff, units, n_expert, a8,       \
                                          nblocks, ids, k, x, gate_inp, sh_logit, h, h8,          \
                                          h8_blocks, done);                                       \
    }                                                                                             \
    extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32) sil_moe_down_grp_##NAME(     \
        const uint8_t *wd, const uint8_t *sd, uint64_t row_bytes, uint64_t mat_stride,            \
        const uint8_t *hd, uint64_t h_stride, const int32_t *tab, int n_slot, int n_embd,         \
        int units, int n_expert, const uint8_t *h8, int64_t nblocks, const int32_t *ids,          \
        const float *wts, const float *sh_logit, int k, float *part, float *y, int *done)         \
    {                                                                                             \
        sil_moe_down_grp_prefetch(wd, sd, row_bytes, mat_stride, tab, n_slot, n_embd, units,      \
                                  n_expert, ids, k);                                              \
        SIL_PDL_ENTRY();                                                                          \
        if (sd)                                                                                   \
            sil_moe_down_grp<T, true>(wd, sd, row_bytes, mat_stride, hd, h_stride, tab, n_slot,   \
                                      n_embd, units, n_expert, h8, nblocks, ids, wts, sh_logit,   \
                                      k, part, y, done);                                          \
        else                                                                                      \
            sil_moe_down_grp<T, false>(wd, sd, row_bytes, mat_stride, hd, h_stride, tab, n_slot,  \
                                       n_embd, units, n_expert, h8, nblocks, ids, wts, sh_logit,  \
                                       k, part, y, done);                                         \
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
    extern "C" __global__ void __launch_bounds__(512) sil_moe_down_sh_norm_##NAME(               \
        const uint8_t *wd, const uint8_t *sd, uint64_t row_bytes, uint64_t mat_stride,            \
        const uint8_t *hd, uint64_t h_stride, const int32_t *tab, int n_slot, int n_embd,         \
        int units, int n_expert, const uint8_t *h8, int64_t nblocks, const int32_t *ids,          \
        const float *wts, const float *sh_logit, int k, float *y, float *x, const float *nw,      \
        float eps, float *ny, uint8_t *q8, int *done)                                             \
    {                                                                                             \
        sil_moe_down_prefetch<true>(wd, sd, row_bytes, mat_stride, tab, n_slot, n_embd, n_expert, \
                                    ids, k);                                                      \
        SIL_PDL_ENTRY();                                                                          \
        sil_moe_down_fast<T, true, 16>(wd, sd, row_bytes, mat_stride, hd, h_stride, tab, n_slot,  \
                                       n_embd, units, n_expert, h8, nblocks, ids, wts, sh_logit,  \
                                       k, y);                                                     \
        if (!sil_last_block(done + blockIdx.y, (int)gridDim.x))                                   \
            return;                                                                               \
        sil_add_rmsnorm_tail<512>(x, y, nw, eps, ny, q8, n_embd, (int)gridDim.y, blockIdx.y);     \
        if (threadIdx.x == 0)                                                                     \
            done[blockIdx.y] = 0;                                                                 \
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

SIL_MOE_GRP_ENTRY(q4_0, WT_Q4_0)
SIL_MOE_GRP_ENTRY(q4_1, WT_Q4_1)
SIL_MOE_GRP_ENTRY(q5_0, WT_Q5_0)
SIL_MOE_GRP_ENTRY(q5_1, WT_Q5_1)
SIL_MOE_GRP_ENTRY(q8_0, WT_Q8_0)
SIL_MOE_GRP_ENTRY(q4_K, WT_Q4_K)
SIL_MOE_GRP_ENTRY(q5_K, WT_Q5_K)
SIL_MOE_GRP_ENTRY(q6_K, WT_Q6_K)
