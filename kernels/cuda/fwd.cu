// Forward-pass kernels the op library of kernels.cu lacks, for the CUDA backend of the engine
// (daemon/engine/backend_cuda.c): attention over the KV cache with optional output gate, the
// gated delta net (conv1d with state, the delta rule per value head) and a strided row gather.
// Simple first versions: one block per (row, head) for attention, one block per (sequence run,
// value head) walking the run's tokens in order for the delta net. Arithmetic follows the CPU
// backend (kernels/cpu/ops.c, daemon/engine/delta_net.c) to float rounding.
#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/sync.cuh"

// KV rows live in blocks of FWD_KV_BLOCK positions (SIL_KV_BLOCK): row of position p of a
// sequence whose block table is bt.
#define FWD_KV_BLOCK 64
__device__ __forceinline__ int64_t fwd_kv_row(const int *bt, int p)
{
    return (int64_t)bt[p / FWD_KV_BLOCK] * FWD_KV_BLOCK + p % FWD_KV_BLOCK;
}

// KV cache elements: F32, F16 (--kv-type f16) rounded to nearest even as the CPU stores it,
// or blocks of 32 elements as the CPU's q8_0 (KV8: F16 scale, 32 int8) and q4_0 (KV4: F16
// scale, 16 bytes, element j in the low nibble of byte j and j + 16 in its high nibble). A
// kernel reads the cache through a view: a pointer for F32 and F16, for the block types the
// cache's base and an element offset (a head's row starts on a block: the host checks that
// the head size is a multiple of 32). Views add element offsets as pointers do.
struct kv_q8_0;  // the kernels' parameter types for the block caches (never dereferenced)
struct kv_q4_0;
struct kvq8v {
    const uint8_t *b;
    int64_t e;
};
struct kvq4v {
    const uint8_t *b;
    int64_t e;
};
__device__ __forceinline__ kvq8v operator+(kvq8v v, int64_t d)
{
    v.e += d;
    return v;
}
__device__ __forceinline__ kvq4v operator+(kvq4v v, int64_t d)
{
    v.e += d;
    return v;
}
__device__ __forceinline__ const float *kv_view(const float *p)
{
    return p;
}
__device__ __forceinline__ const __half *kv_view(const __half *p)
{
    return p;
}
__device__ __forceinline__ kvq8v kv_view(const kv_q8_0 *p)
{
    return kvq8v{(const uint8_t *)p, 0};
}
__device__ __forceinline__ kvq4v kv_view(const kv_q4_0 *p)
{
    return kvq4v{(const uint8_t *)p, 0};
}
#define KV_Q8_BYTES 34 // one q8_0 block of 32 elements
#define KV_Q4_BYTES 18 // one q4_0 block
__device__ __forceinline__ float kvl(const float *p, int64_t i)
{
    return p[i];
}
__device__ __forceinline__ float kvl(const __half *p, int64_t i)
{
    return __half2float(p[i]);
}
__device__ __forceinline__ float kvl(kvq8v v, int64_t i)
{
    const int64_t e = v.e + i;
    const uint8_t *blk = v.b + (e >> 5) * KV_Q8_BYTES;
    return __half2float(*(const __half *)blk) * (float)(int8_t)blk[2 + (e & 31)];
}
__device__ __forceinline__ float kvl(kvq4v v, int64_t i)
{
    const int64_t e = v.e + i;
    const uint8_t *blk = v.b + (e >> 5) * KV_Q4_BYTES;
    const int j = (int)(e & 31);
    const int q = j < 16 ? blk[2 + j] & 15 : blk[2 + j - 16] >> 4;
    return __half2float(*(const __half *)blk) * (float)(q - 8);
}
__device__ __forceinline__ void kvs(float *p, int64_t i, float v)
{
    p[i] = v;
}
__device__ __forceinline__ void kvs(__half *p, int64_t i, float v)
{
    p[i] = __float2half_rn(v);
}

// The block of 32 elements x (lane's element x, a warp's lanes in order) written at block
// index blk of the cache c, as the CPU quantizes it (kernels/cpu/quants.c): q8_0 with d =
// amax / 127 (0 under 1e-30), q4_0 with d = (the element of largest magnitude, the first of
// equals) / -8; elements rounded to nearest even.
__device__ __forceinline__ void kv_store_block(kv_q8_0 *c, int64_t blk, float x, int lane)
{
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax < 1e-30f ? 0.0f : amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t *b = (uint8_t *)c + blk * KV_Q8_BYTES;
    if (lane == 0) *(__half *)b = __float2half_rn(d);
    b[2 + lane] = (uint8_t)(int8_t)__float2int_rn(x * id);
}
__device__ __forceinline__ void kv_store_block(kv_q4_0 *c, int64_t blk, float x, int lane)
{
    // the signed element of largest magnitude, the lowest lane of equals
    float am = fabsf(x), mx = x;
    int at = lane;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float am2 = __shfl_xor_sync(0xffffffffu, am, o);
        const float mx2 = __shfl_xor_sync(0xffffffffu, mx, o);
        const int at2 = __shfl_xor_sync(0xffffffffu, at, o);
        if (am2 > am || (am2 == am && at2 < at)) am = am2, mx = mx2, at = at2;
    }
    // the CPU keeps max 0 while every element is 0 (its test is amax > the largest so far)
    const float d = am > 0.0f ? mx / -8 : 0.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = min(max(__float2int_rn(x * id) + 8, 0), 15);
    const int hi = __shfl_down_sync(0xffffffffu, q, 16); // lane l < 16 gets element l + 16
    uint8_t *b = (uint8_t *)c + blk * KV_Q4_BYTES;
    if (lane == 0) *(__half *)b = __float2half_rn(d);
    if (lane < 16) b[2 + lane] = (uint8_t)(q | hi << 4);
}
template <typename KV> struct kv_is_block {
    static constexpr bool value = false;
};
template <> struct kv_is_block<kv_q8_0> {
    static constexpr bool value = true;
};
template <> struct kv_is_block<kv_q4_0> {
    static constexpr bool value = true;
};

#define FWD_THREADS 128

__device__ __forceinline__ float fwd_warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over a block of FWD_THREADS threads; every thread gets it. sh: 32 floats.
__device__ __forceinline__ float fwd_block_sum(float v, float *sh)
{
    v = fwd_warp_sum(v);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < FWD_THREADS / 32 ? sh[lane] : 0.0f;
    return fwd_warp_sum(v);
}

// Sum over a block of any multiple of 32 threads up to 1024; every thread gets it. sh: 32 floats.
__device__ __forceinline__ float fwd_block_sum_n(float v, float *sh)
{
    v = fwd_warp_sum(v);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? sh[lane] : 0.0f;
    return fwd_warp_sum(v);
}

__device__ __forceinline__ float fwd_block_max(float v, float *sh)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = lane < FWD_THREADS / 32 ? sh[lane] : -INFINITY;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// y[i][c] = x[rows[i]][c]; grid (n rows), rows int32 on the device.
extern "C" __global__ void __launch_bounds__(FWD_THREADS)
    sil_fwd_gather_rows(float *y, int64_t ldy, const float *x, int64_t ldx, const int *rows,
                        int64_t width)
{
    SIL_PDL_ENTRY();
    const float *src = x + (int64_t)rows[blockIdx.x] * ldx;
    float *dst = y + (int64_t)blockIdx.x * ldy;
    for (int64_t c = threadIdx.x; c < width; c += FWD_THREADS)
        dst[c] = src[c];
}

// Per row i (blockIdx.y) and head h (blockIdx.x over n_head + n_head_kv): rmsnorm with the
// head norm, NeoX rope on the first n_rot dims at pos[i]; k heads and the row's v go to the
// cache rows of (seq[i], pos[i]). kv: [block][FWD_KV_BLOCK][kv_dim] of this layer, seq's blocks
// btab[seq * bps ..].
template <typename KV>
__device__ __forceinline__ void
sil_fwd_qk_prep_body(float *q, int64_t ldq, int q_stride, float *k, int64_t ldk, const float *v,
                     int64_t ldv, const float *q_norm, const float *k_norm, const int *pos,
                     const int *seq, int n_head, int n_head_kv, int hd, int n_rot, float freq_base,
                     float eps, KV *kc, KV *vc, int n_ctx, const int *btab, int bps)
{
    __shared__ float sh[32];
    __shared__ float buf[1024];
    const int i = blockIdx.y, h = blockIdx.x;
    const bool is_q = h < n_head;
    float *x = is_q ? q + (int64_t)i * ldq + (int64_t)h * q_stride
                    : k + (int64_t)i * ldk + (int64_t)(h - n_head) * hd;
    const float *w = is_q ? q_norm : k_norm;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < hd; j += FWD_THREADS)
        ss += x[j] * x[j];
    ss = fwd_block_sum(ss, sh);
    const float scale = 1.0f / sqrtf(ss / (float)hd + eps);
    for (int j = threadIdx.x; j < hd; j += FWD_THREADS)
        buf[j] = x[j] * scale * w[j];
    __syncthreads();
    const int half = n_rot / 2;
    const float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    for (int j = threadIdx.x; j < hd; j += FWD_THREADS) {
        float r = buf[j];
        if (j < n_rot) {
            const int t = j < half ? j : j - half;
            // theta = pos * theta_scale^t, formed by repeated products as the CPU does
            float theta = (float)pos[i];
            for (int u = 0; u < t; u++)
                theta *= theta_scale;
            const float c = cosf(theta), s = sinf(theta);
            r = j < half ? buf[j] * c - buf[j + half] * s : buf[j - half] * s + buf[j] * c;
        }
        x[j] = r;
        if constexpr (!kv_is_block<KV>::value) {
            if (!is_q) {
                const int64_t row =
                    (int64_t)btab[(int64_t)seq[i] * bps + pos[i] / FWD_KV_BLOCK] * FWD_KV_BLOCK +
                    pos[i] % FWD_KV_BLOCK;
                const int64_t at = row * (int64_t)n_head_kv * hd + (int64_t)(h - n_head) * hd + j;
                kvs(kc, at, r);
                kvs(vc, at, v[(int64_t)i * ldv + (int64_t)(h - n_head) * hd + j]);
            }
        }
    }
    if constexpr (kv_is_block<KV>::value) {
        // blocks of 32: warp w takes the head's blocks w, w + 4, ... (the rotated row in x is
        // the block's own writes, visible after the barrier)
        __syncthreads();
        if (is_q) return;
        const int64_t row =
            (int64_t)btab[(int64_t)seq[i] * bps + pos[i] / FWD_KV_BLOCK] * FWD_KV_BLOCK +
            pos[i] % FWD_KV_BLOCK;
        const int64_t e0 = row * (int64_t)n_head_kv * hd + (int64_t)(h - n_head) * hd;
        const float *vr = v + (int64_t)i * ldv + (int64_t)(h - n_head) * hd;
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        for (int blk = warp; blk < hd / 32; blk += FWD_THREADS / 32) {
            kv_store_block(kc, (e0 >> 5) + blk, x[blk * 32 + lane], lane);
            kv_store_block(vc, (e0 >> 5) + blk, vr[blk * 32 + lane], lane);
        }
    }
}
// The entry points the host loads, one for each KV element type (F32; F16 as _h; q8_0 and q4_0
// as _q8 and _q4).
#define QK_PREP_ENTRY(NAME, KV)                                                                    \
    extern "C" __global__ void __launch_bounds__(FWD_THREADS)                                     \
        NAME(float *q, int64_t ldq, int q_stride, float *k, int64_t ldk, const float *v,          \
             int64_t ldv, const float *q_norm, const float *k_norm, const int *pos,               \
             const int *seq, int n_head, int n_head_kv, int hd, int n_rot, float freq_base,       \
             float eps, KV *kc, KV *vc, int n_ctx, const int *btab, int bps)                      \
    {                                                                                            \
        SIL_PDL_ENTRY();                                                                         \
        sil_fwd_qk_prep_body<KV>(q, ldq, q_stride, k, ldk, v, ldv, q_norm, k_norm, pos, seq,     \
                                 n_head, n_head_kv, hd, n_rot, freq_base, eps, kc, vc, n_ctx,    \
                                 btab, bps);                                                     \
    }
QK_PREP_ENTRY(sil_fwd_qk_prep, float)
QK_PREP_ENTRY(sil_fwd_qk_prep_h, __half)
QK_PREP_ENTRY(sil_fwd_qk_prep_q8, kv_q8_0)
QK_PREP_ENTRY(sil_fwd_qk_prep_q4, kv_q4_0)

// o_h = softmax(q_h K^T / sqrt(hd)) V over positions 0..pos[i] of seq[i]; gated: o *= sigmoid
// of the gate that follows q_h. Block per (head, row); scores: [rows * n_head][n_ctx] scratch.
template <typename KP>
__device__ __forceinline__ void
sil_fwd_attend_body(const float *q, int64_t ldq, int q_stride, float *o, int64_t ldo, KP kc,
                    KP vc, const int *pos, const int *seq, int n_head, int n_head_kv, int hd,
                    int n_ctx, const int *btab, int bps, int gated, float *scores)
{
    __shared__ float sh[32];
    __shared__ float qs[1024];
    const int i = blockIdx.y, h = blockIdx.x;
    const int kvh = h / (n_head / n_head_kv);
    const int np = pos[i] + 1;
    const int64_t kv_dim = (int64_t)n_head_kv * hd;
    const float *qh = q + (int64_t)i * ldq + (int64_t)h * q_stride;
    const int *bt = btab + (int64_t)seq[i] * bps; /* the sequence's KV blocks */
    const KP k0 = kc + (int64_t)kvh * hd, v0 = vc + (int64_t)kvh * hd;
    float *s = scores + ((int64_t)i * n_head + h) * n_ctx;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int j = threadIdx.x; j < hd; j += FWD_THREADS)
        qs[j] = qh[j];
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int p = warp; p < np; p += FWD_THREADS / 32) {
        const KP kp = k0 + fwd_kv_row(bt, p) * kv_dim;
        float d = 0.0f;
        for (int j = lane; j < hd; j += 32)
            d += qs[j] * kvl(kp, j);
        d = fwd_warp_sum(d);
        if (lane == 0) s[p] = d * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int p = threadIdx.x; p < np; p += FWD_THREADS)
        mx = fmaxf(mx, s[p]);
    mx = fwd_block_max(mx, sh);
    float sum = 0.0f;
    for (int p = threadIdx.x; p < np; p += FWD_THREADS) {
        const float e = expf(s[p] - mx);
        s[p] = e;
        sum += e;
    }
    sum = fwd_block_sum(sum, sh); // its barriers also publish s[]
    const float inv = 1.0f / sum;
    float *oh = o + (int64_t)i * ldo + (int64_t)h * hd;
    for (int j = threadIdx.x; j < hd; j += FWD_THREADS) {
        float acc = 0.0f;
        for (int p = 0; p < np; p++)
            acc += s[p] * inv * kvl(v0, fwd_kv_row(bt, p) * kv_dim + j);
        if (gated) acc *= 1.0f / (1.0f + expf(-qh[hd + j]));
        oh[j] = acc;
    }
}
#define ATTEND_ENTRY(NAME, KV)                                                                     \
    extern "C" __global__ void __launch_bounds__(FWD_THREADS)                                     \
        NAME(const float *q, int64_t ldq, int q_stride, float *o, int64_t ldo, const KV *kc,      \
             const KV *vc, const int *pos, const int *seq, int n_head, int n_head_kv, int hd,     \
             int n_ctx, const int *btab, int bps, int gated, float *scores)                       \
    {                                                                                            \
        SIL_PDL_ENTRY();                                                                         \
        sil_fwd_attend_body(q, ldq, q_stride, o, ldo, kv_view(kc), kv_view(vc), pos, seq,        \
                            n_head, n_head_kv, hd, n_ctx, btab, bps, gated, scores);             \
    }
ATTEND_ENTRY(sil_fwd_attend, float)
ATTEND_ENTRY(sil_fwd_attend_h, __half)
ATTEND_ENTRY(sil_fwd_attend_q8, kv_q8_0)
ATTEND_ENTRY(sil_fwd_attend_q4, kv_q4_0)

// ---- prefill attention, tiled: flash attention on f16 tensor cores ----
// A block of 4 warps takes FA_ROWS query rows of one sequence run (consecutive rows of one
// sequence) for query head h (blockIdx.y): each warp 16 rows, their q (scaled by log2(e) /
// sqrt(HD)) as f16 fragments in registers; the run's KV positions 0..(the block's last) go
// through shared memory FA_COLS at a time as f16 (any cache type, positions past the last
// zero). S = q K^T and o += P V on mma.sync (m16n8k16 on sm_80+, two m16n8k8 on sm_75),
// accumulated in float, with the online softmax (running max and sum a row, in base 2).
// Rows see positions <= their own (pos[]). The per-row kernel above is the reference: the
// same math, other rounding (f16 operands) and summation order.
#define FA_ROWS 64
#define FA_COLS 32

__device__ __forceinline__ uint32_t fa_pack(float a, float b)
{
    const __half2 v = __floats2half2_rn(a, b); // a in the low half: the lower column
    return *(const uint32_t *)&v;
}

__device__ __forceinline__ uint32_t fa_pack_h(__half a, __half b)
{
    const __half2 v = __halves2half2(a, b);
    return *(const uint32_t *)&v;
}

// c += a b for a 16x16 (rows g, g + 8; columns 2t.., 2t + 8..) and b 16x8 (k 2t.., 2t + 8..;
// column g) in the mma.sync fragment layouts, g = lane / 4, t = lane % 4.
__device__ __forceinline__ void fa_mma(float c[4], const uint32_t a[4], const uint32_t b[2])
{
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, "
                 "{%6}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b[0]));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, "
                 "{%6}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[2]), "r"(a[3]), "r"(b[1]));
#endif
}

// Positions p0..p0 + FA_COLS - 1 of a KV head (view base) into dst as f16; past pmax zero (so
// a masked position's V adds nothing, whatever the cache holds there).
template <int HD, typename KP>
__device__ __forceinline__ void fa_tile(__half (*dst)[HD + 8], KP base, const int *bt,
                                        int64_t kv_dim, int p0, int pmax)
{
    for (int i = threadIdx.x; i < FA_COLS * HD / 2; i += FWD_THREADS) {
        const int r = i / (HD / 2), c = (i % (HD / 2)) * 2, p = p0 + r;
        float a = 0.0f, b = 0.0f;
        if (p <= pmax) {
            const KP row = base + fwd_kv_row(bt, p) * kv_dim;
            a = kvl(row, c);
            b = kvl(row, c + 1);
        }
        *(__half2 *)&dst[r][c] = __floats2half2_rn(a, b);
    }
}

template <int HD, typename KP>
__device__ __forceinline__ void
sil_fwd_flash_body(const float *q, int64_t ldq, int q_stride, float *o, int64_t ldo, KP kc, KP vc,
                   const int *pos, const int *seq, int n_rows, int n_head, int n_head_kv,
                   const int *btab, int bps, int gated)
{
    __shared__ __align__(16) __half sk[FA_COLS][HD + 8]; // + 8: rows 4 banks apart
    __shared__ __align__(16) __half sv[FA_COLS][HD + 8];
    __shared__ int last;
    const int h = blockIdx.y, kvh = h / (n_head / n_head_kv);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int r0 = blockIdx.x * FA_ROWS;
    const int64_t kv_dim = (int64_t)n_head_kv * HD;
    if (threadIdx.x == 0) last = -1;
    __syncthreads();
    if (threadIdx.x < FA_ROWS && r0 + (int)threadIdx.x < n_rows)
        atomicMax(&last, pos[r0 + threadIdx.x]);
    __syncthreads();
    const int pmax = last;
    const int *bt = btab + (int64_t)seq[r0] * bps;
    const int ra = r0 + warp * 16 + g, rb = ra + 8;
    const int pa = ra < n_rows ? pos[ra] : -1, pb = rb < n_rows ? pos[rb] : -1;
    int wmax = max(pa, pb); // the warp's last position: tiles past it are all masked
#pragma unroll
    for (int d = 16; d > 0; d >>= 1)
        wmax = max(wmax, __shfl_xor_sync(0xffffffffu, wmax, d));
    const float qs = 1.4426950408889634f / sqrtf((float)HD);
    uint32_t qf[HD / 16][4];
    {
        const float *qa = q + (int64_t)(pa >= 0 ? ra : r0) * ldq + (int64_t)h * q_stride;
        const float *qb = q + (int64_t)(pb >= 0 ? rb : r0) * ldq + (int64_t)h * q_stride;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            const int c = kk * 16 + 2 * t;
            qf[kk][0] = fa_pack(qa[c] * qs, qa[c + 1] * qs);
            qf[kk][1] = fa_pack(qb[c] * qs, qb[c + 1] * qs);
            qf[kk][2] = fa_pack(qa[c + 8] * qs, qa[c + 9] * qs);
            qf[kk][3] = fa_pack(qb[c + 8] * qs, qb[c + 9] * qs);
        }
    }
    float acc[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; d++)
        acc[d][0] = acc[d][1] = acc[d][2] = acc[d][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const KP k0 = kc + (int64_t)kvh * HD, v0 = vc + (int64_t)kvh * HD;
    for (int p0 = 0; p0 <= pmax; p0 += FA_COLS) {
        __syncthreads(); // the last tile is read
        fa_tile<HD>(sk, k0, bt, kv_dim, p0, pmax);
        fa_tile<HD>(sv, v0, bt, kv_dim, p0, pmax);
        __syncthreads();
        if (p0 > wmax) continue;
        float s[FA_COLS / 8][4];
#pragma unroll
        for (int n = 0; n < FA_COLS / 8; n++)
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
            for (int n = 0; n < FA_COLS / 8; n++) {
                const __half *kr = &sk[n * 8 + g][kk * 16 + 2 * t];
                const uint32_t b[2] = {*(const uint32_t *)kr, *(const uint32_t *)(kr + 8)};
                fa_mma(s[n], qf[kk], b);
            }
        // causal mask, the tile's max a row (the quad's four lanes hold a row's columns)
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < FA_COLS / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int p = p0 + n * 8 + 2 * t + (e & 1);
                if (p > (e < 2 ? pa : pb)) s[n][e] = -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
            }
        float mu[2], al[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            const float mn = fmaxf(m[r], mx[r]);
            mu[r] = mn == -INFINITY ? 0.0f : mn; // a row with nothing yet: exp2(-inf) = 0
            al[r] = exp2f(m[r] - mu[r]);
            m[r] = mn;
            l[r] *= al[r];
        }
#pragma unroll
        for (int n = 0; n < FA_COLS / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[n][e] = exp2f(s[n][e] - mu[e >> 1]);
                l[e >> 1] += s[n][e];
            }
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            acc[d][0] *= al[0];
            acc[d][1] *= al[0];
            acc[d][2] *= al[1];
            acc[d][3] *= al[1];
        }
        // o += P V: P's accumulators are already the A fragments of positions 16j..16j + 15
#pragma unroll
        for (int j = 0; j < FA_COLS / 16; j++) {
            const uint32_t a[4] = {fa_pack(s[2 * j][0], s[2 * j][1]),
                                   fa_pack(s[2 * j][2], s[2 * j][3]),
                                   fa_pack(s[2 * j + 1][0], s[2 * j + 1][1]),
                                   fa_pack(s[2 * j + 1][2], s[2 * j + 1][3])};
            const int k = j * 16 + 2 * t;
#pragma unroll
            for (int d = 0; d < HD / 8; d++) {
                const int c = d * 8 + g;
                const uint32_t b[2] = {fa_pack_h(sv[k][c], sv[k + 1][c]),
                                       fa_pack_h(sv[k + 8][c], sv[k + 9][c])};
                fa_mma(acc[d], a, b);
            }
        }
    }
    // the sums a row over its quad, then o = acc / l (and the gate)
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        l[r] = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = r ? rb : ra;
        if ((r ? pb : pa) < 0) continue;
        float *orow = o + (int64_t)row * ldo + (int64_t)h * HD;
        const float *gate = q + (int64_t)row * ldq + (int64_t)h * q_stride + HD;
#pragma unroll
        for (int d = 0; d < HD / 8; d++) {
            const int c = d * 8 + 2 * t;
            float x0 = acc[d][2 * r] * l[r], x1 = acc[d][2 * r + 1] * l[r];
            if (gated) {
                x0 *= 1.0f / (1.0f + expf(-gate[c]));
                x1 *= 1.0f / (1.0f + expf(-gate[c + 1]));
            }
            orow[c] = x0;
            orow[c + 1] = x1;
        }
    }
}
#define FLASH_ENTRY(NAME, HD, KV)                                                                  \
    extern "C" __global__ void __launch_bounds__(FWD_THREADS)                                     \
        NAME(const float *q, int64_t ldq, int q_stride, float *o, int64_t ldo, const KV *kc,      \
             const KV *vc, const int *pos, const int *seq, int n_rows, int n_head, int n_head_kv, \
             const int *btab, int bps, int gated)                                                 \
    {                                                                                            \
        SIL_PDL_ENTRY();                                                                         \
        sil_fwd_flash_body<HD>(q, ldq, q_stride, o, ldo, kv_view(kc), kv_view(vc), pos, seq,     \
                               n_rows, n_head, n_head_kv, btab, bps, gated);                    \
    }
#define FLASH_ENTRIES(HD)                                                                          \
    FLASH_ENTRY(sil_fwd_flash##HD, HD, float)                                                    \
    FLASH_ENTRY(sil_fwd_flash##HD##_h, HD, __half)                                               \
    FLASH_ENTRY(sil_fwd_flash##HD##_q8, HD, kv_q8_0)                                             \
    FLASH_ENTRY(sil_fwd_flash##HD##_q4, HD, kv_q4_0)
FLASH_ENTRIES(64)
FLASH_ENTRIES(128)
FLASH_ENTRIES(256)

// Causal depthwise conv1d + silu for every sequence run, advancing its conv state.
// Grid (channel blocks, runs); state of run r at state[seq of run] + offset: [K-1][cd].
extern "C" __global__ void __launch_bounds__(FWD_THREADS)
    sil_fwd_conv1d(const float *x, int64_t ldx, float *out, int64_t ldo, const float *w, int K,
                   int64_t cd, const int *run_start, const int *run_seq, float *const *seq_state,
                   int64_t offset)
{
    SIL_PDL_ENTRY();
    const int64_t c = (int64_t)blockIdx.x * FWD_THREADS + threadIdx.x;
    if (c >= cd) return;
    const int r = blockIdx.y;
    const int r0 = run_start[r], nt = run_start[r + 1] - r0;
    float *st = seq_state[run_seq[r]] + offset;
    const int H = K - 1;
    const float *wc = w + c * K;
    float hist[8]; // K <= 9
    for (int j = 0; j < H; j++)
        hist[j] = st[(int64_t)j * cd + c];
    for (int t = 0; t < nt; t++) {
        const float xc = x[(int64_t)(r0 + t) * ldx + c];
        float acc = 0.0f;
        for (int j = 0; j < H; j++)
            acc += wc[j] * hist[j];
        acc += wc[H] * xc;
        out[(int64_t)(r0 + t) * ldo + c] = acc / (1.0f + expf(-acc));
        for (int j = 0; j + 1 < H; j++)
            hist[j] = hist[j + 1];
        if (H > 0) hist[H - 1] = xc;
    }
    for (int j = 0; j < H; j++)
        st[(int64_t)j * cd + c] = hist[j];
}

// The delta-net cores' inputs of row i (blockIdx.x) copied to row cap[i] of dst ([][cd + 2 nv]:
// qkv before the conv, alpha, beta) where cap[i] >= 0: a kept verification window's rows, run
// again from them when the window is cut (sil_fwd_conv1d, then the delta rule).
extern "C" __global__ void __launch_bounds__(FWD_THREADS)
    sil_fwd_dn_capture(const float *qkv, int64_t ldq, const float *alpha, int64_t lda,
                       const float *beta, int64_t ldb, const int *cap, float *dst, int64_t cd,
                       int nv)
{
    SIL_PDL_ENTRY();
    const int i = blockIdx.x, to = cap[i];
    if (to < 0) return;
    const int64_t w = cd + 2 * (int64_t)nv;
    float *d = dst + (int64_t)to * w;
    const float *q = qkv + (int64_t)i * ldq;
    for (int64_t c = threadIdx.x; c < cd; c += FWD_THREADS)
        d[c] = q[c];
    for (int c = threadIdx.x; c < nv; c += FWD_THREADS) {
        d[cd + c] = alpha[(int64_t)i * lda + c];
        d[cd + nv + c] = beta[(int64_t)i * ldb + c];
    }
}

// The delta rule and gated RMSNorm for value head h (blockIdx.x) of run r (blockIdx.y), the
// run's tokens in order. S_h [dv][dk] at seq_state[seq] + offset + (K-1)*cd + h*dv*dk.
// A warp per row of S, lanes over dk; dk, dv <= 1024.
extern "C" __global__ void __launch_bounds__(FWD_THREADS)
    sil_fwd_delta_net(const float *conv, int64_t ldc, const float *z, int64_t ldz,
                      const float *alpha, int64_t lda, const float *beta_raw, int64_t ldb,
                      float *out, int64_t ldo, const float *ssm_a, const float *dt_bias,
                      const float *norm, int nk, int nv, int dk, int dv, float eps,
                      const int *run_start, const int *run_seq, float *const *seq_state,
                      int64_t offset, int64_t ssm_offset)
{
    SIL_PDL_ENTRY();
    __shared__ float sh[32];
    __shared__ float qs[1024], ks[1024], os[1024];
    const int h = blockIdx.x, r = blockIdx.y, kh = h % nk;
    const int r0 = run_start[r], nt = run_start[r + 1] - r0;
    float *S = seq_state[run_seq[r]] + offset + ssm_offset + (int64_t)h * dv * dk;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int t = 0; t < nt; t++) {
        const float *row = conv + (int64_t)(r0 + t) * ldc;
        float sq = 0.0f, sk = 0.0f;
        for (int j = threadIdx.x; j < dk; j += FWD_THREADS) {
            const float a = row[(int64_t)kh * dk + j], b = row[(int64_t)nk * dk + kh * dk + j];
            qs[j] = a;
            ks[j] = b;
            sq += a * a;
            sk += b * b;
        }
        sq = fwd_block_sum(sq, sh);
        sk = fwd_block_sum(sk, sh);
        const float qscale = 1.0f / fmaxf(sqrtf(sq), eps) / sqrtf((float)dk);
        const float kscale = 1.0f / fmaxf(sqrtf(sk), eps);
        for (int j = threadIdx.x; j < dk; j += FWD_THREADS) {
            qs[j] *= qscale;
            ks[j] *= kscale;
        }
        __syncthreads();
        const float ar = alpha[(int64_t)(r0 + t) * lda + h] + dt_bias[h];
        const float sp = ar > 20.0f ? ar : log1pf(expf(ar));
        const float decay = expf(ssm_a[h] * sp);
        const float b = 1.0f / (1.0f + expf(-beta_raw[(int64_t)(r0 + t) * ldb + h]));
        const float *v = row + 2 * (int64_t)nk * dk + (int64_t)h * dv;
        for (int j = warp; j < dv; j += FWD_THREADS / 32) {
            float *Sj = S + (int64_t)j * dk;
            float p = 0.0f;
            for (int i = lane; i < dk; i += 32)
                p += Sj[i] * ks[i];
            p = fwd_warp_sum(p);
            const float d = b * (v[j] - decay * p);
            float o = 0.0f;
            for (int i = lane; i < dk; i += 32) {
                const float s = decay * Sj[i] + d * ks[i];
                Sj[i] = s;
                o += s * qs[i];
            }
            o = fwd_warp_sum(o);
            if (lane == 0) os[j] = o;
        }
        __syncthreads();
        float ss = 0.0f;
        for (int j = threadIdx.x; j < dv; j += FWD_THREADS)
            ss += os[j] * os[j];
        ss = fwd_block_sum(ss, sh);
        const float rs = 1.0f / sqrtf(ss / (float)dv + eps);
        const float *zr = z + (int64_t)(r0 + t) * ldz + (int64_t)h * dv;
        float *orow = out + (int64_t)(r0 + t) * ldo + (int64_t)h * dv;
        for (int j = threadIdx.x; j < dv; j += FWD_THREADS) {
            const float g = zr[j] / (1.0f + expf(-zr[j]));
            orow[j] = os[j] * rs * norm[j] * g;
        }
        __syncthreads(); // qs, ks, os are rewritten by the next token
    }
}

// y[i][c] = sigmoid(g[i]) * y[i][c] + x[i][c]: the shared expert's gate, then the routed sum.
extern "C" __global__ void __launch_bounds__(FWD_THREADS)
    sil_fwd_gate_add(float *y, int64_t ldy, const float *g, const float *x, int64_t ldx,
                     int64_t width)
{
    SIL_PDL_ENTRY();
    const int i = blockIdx.y;
    const int64_t c = (int64_t)blockIdx.x * FWD_THREADS + threadIdx.x;
    if (c >= width) return;
    const float s = 1.0f / (1.0f + expf(-g[i]));
    y[(int64_t)i * ldy + c] = s * y[(int64_t)i * ldy + c] + x[(int64_t)i * ldx + c];
}

// out[i] = sum over slots k (in order) of w[i*K+k] * d[pair_of[i*K+k]]: the routed experts'
// weighted sum from per-pair down outputs d [pairs][width]. Grid (column blocks, rows).
extern "C" __global__ void __launch_bounds__(FWD_THREADS)
    sil_fwd_moe_combine(float *out, int64_t ldo, const float *d, const int *pair_of,
                        const float *w, int K, int64_t width)
{
    SIL_PDL_ENTRY();
    const int i = blockIdx.y;
    const int64_t c = (int64_t)blockIdx.x * FWD_THREADS + threadIdx.x;
    if (c >= width) return;
    float acc = 0.0f;
    for (int k = 0; k < K; k++)
        acc += w[i * K + k] * d[(int64_t)pair_of[i * K + k] * width + c];
    out[(int64_t)i * ldo + c] = acc;
}

// One warp's 32 consecutive values v (one per lane) rounded as sil_quantize_q8_1 does into q8
// block bi: int8 q at q8 + 32 bi, (d, d * sum q) at dq[bi]. All 32 lanes call it.
__device__ __forceinline__ void fwd_q8_store(float v, int64_t bi, int lane, uint8_t *q8, float2 *dq)
{
    float amax = fabsf(v);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, m));
    const float dd = amax / 127.0f;
    const int q = amax == 0.0f ? 0 : (int)roundf(__fdiv_rn(v, dd));
    int sum = q;
#pragma unroll
    for (int m = 16; m > 0; m >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, m);
    q8[bi * 32 + lane] = (uint8_t)(int8_t)q;
    if (lane == 0) dq[bi] = make_float2(dd, dd * (float)sum);
}

// Residual add, RMSNorm and the q8 blocks of the result, one block per row of n (n % 32 == 0),
// blockDim.x a multiple of 32 (up to 1024: wide blocks keep more loads in flight):
//   d != NULL: x += d (written back); y = x / sqrt(mean(x^2) + eps) * w (w may be NULL);
//   q8: y rounded as sil_quantize_q8_1 does, blocks of row r at r * n / 32 of nblocks in all.
// Each warp takes whole 32-element blocks (element i = threadIdx.x + blockDim.x j), so a block's
// amax and sum are warp reductions.
#define RMS_E 8 // elements a thread keeps in registers (n <= RMS_E * blockDim.x)

extern "C" __global__ void __launch_bounds__(1024)
    sil_fwd_add_rmsnorm_q8(float *x, const float *d, float *y, const float *w, int64_t n, float eps,
                           uint8_t *q8, int64_t nblocks)
{
    SIL_PDL_ENTRY();
    __shared__ float sh[32];
    float *xr = x + (int64_t)blockIdx.x * n;
    float *yr = y + (int64_t)blockIdx.x * n;
    const int nt = blockDim.x;
    const int lane = threadIdx.x & 31;
    float2 *dq = (float2 *)(q8 + nblocks * 32);
    if (n <= (int64_t)RMS_E * nt) {
        // every load of the row issued before any use (one memory round trip, not 2 RMS_E);
        // the same sums in the same order as the loop below
        float v[RMS_E], dv[RMS_E], wv[RMS_E];
#pragma unroll
        for (int e = 0; e < RMS_E; e++) {
            const int64_t i = threadIdx.x + (int64_t)e * nt;
            const bool in = i < n;
            v[e] = in ? xr[i] : 0.0f;
            dv[e] = in && d ? d[(int64_t)blockIdx.x * n + i] : 0.0f;
            wv[e] = in && w ? w[i] : 1.0f;
        }
        float ss = 0.0f;
#pragma unroll
        for (int e = 0; e < RMS_E; e++) {
            const int64_t i = threadIdx.x + (int64_t)e * nt;
            if (i >= n) break;
            if (d) {
                v[e] += dv[e];
                xr[i] = v[e];
            }
            ss += v[e] * v[e];
        }
        ss = fwd_block_sum_n(ss, sh);
        const float scale = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
        for (int e = 0; e < RMS_E; e++) {
            const int64_t i = threadIdx.x + (int64_t)e * nt;
            if (i >= n) break;
            const float o = w ? v[e] * scale * wv[e] : v[e] * scale;
            yr[i] = o;
            fwd_q8_store(o, ((int64_t)blockIdx.x * n + i) / 32, lane, q8, dq);
        }
        return;
    }
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += nt) {
        float v = xr[i];
        if (d) {
            v += d[(int64_t)blockIdx.x * n + i];
            xr[i] = v;
        }
        ss += v * v;
    }
    ss = fwd_block_sum_n(ss, sh);
    const float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int64_t i = threadIdx.x; i < n; i += nt) {
        const float v = w ? xr[i] * scale * w[i] : xr[i] * scale;
        yr[i] = v;
        fwd_q8_store(v, ((int64_t)blockIdx.x * n + i) / 32, lane, q8, dq);
    }
}

// The delta net's gated norm of row i, value head h, by a block of FWD_THREADS threads:
// o = o / sqrt(mean(o^2) + eps) * norm * silu(z) in place; with q8 (dv % 32 == 0, rows of out
// contiguous), also its q8 blocks (sil_quantize_q8_1's rounding) of nblocks in all. CG: o was
// written by other blocks of this grid (read past L1).
template <bool CG>
__device__ __forceinline__ void fwd_gated_norm_row(float *out, int64_t ldo, const float *z,
                                                   int64_t ldz, const float *norm, int dv,
                                                   float eps, uint8_t *q8, int64_t nblocks,
                                                   int i, int h, float *sh)
{
    const int lane = threadIdx.x & 31;
    float *o = out + (int64_t)i * ldo + (int64_t)h * dv;
    const float *zr = z + (int64_t)i * ldz + (int64_t)h * dv;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < dv; j += FWD_THREADS) {
        const float oj = CG ? __ldcg(o + j) : o[j];
        ss += oj * oj;
    }
    ss = fwd_block_sum(ss, sh);
    const float rs = 1.0f / sqrtf(ss / (float)dv + eps);
    float2 *dq = q8 ? (float2 *)(q8 + nblocks * 32) : NULL;
    for (int j = threadIdx.x; j < dv; j += FWD_THREADS) {
        const float oj = CG ? __ldcg(o + j) : o[j];
        const float g = zr[j] / (1.0f + expf(-zr[j]));
        const float v = oj * rs * norm[j] * g;
        o[j] = v;
        if (!q8) continue;
        fwd_q8_store(v, ((int64_t)i * ldo + (int64_t)h * dv + j) / 32, lane, q8, dq);
    }
}

#define DN_R 2    // rows of S a warp keeps
#define DN_MAXC 8 // dk / 32 at most (dk <= 256)

// Before the wait: this block's rows of its sequence's state (written by this layer's delta rule
// a token earlier, not by the launch before; run_seq and seq_state are the host's).
__device__ __forceinline__ void dn_state_prefetch(const int *run_seq, float *const *seq_state,
                                                  int64_t offset, int dk, int dv)
{
    if (!sil_l2_pf)
        return;
    const int jb = blockIdx.z * (FWD_THREADS / 32) * DN_R;
    const int nr = min(dv - jb, (FWD_THREADS / 32) * DN_R);
    if (nr > 0)
        sil_l2_prefetch(seq_state[run_seq[blockIdx.y]] + offset +
                            ((int64_t)blockIdx.x * dv + jb) * dk,
                        (uint64_t)nr * dk * sizeof(float));
}

// The delta rule alone, its state rows spread over blocks: grid (value head h, run r, row group
// z), each warp keeping DN_R rows of S_h [dv][dk] in registers (lanes over dk) through all of the
// run's tokens, as sil_fwd_delta_net computes each row (the same sums in the same order). out
// gets o_h before the gated norm (sil_fwd_gated_norm_q8). dk % 32 == 0, dk <= 256.
extern "C" __global__ void __launch_bounds__(FWD_THREADS)
    sil_fwd_delta_rule(const float *conv, int64_t ldc, const float *alpha, int64_t lda,
                       const float *beta_raw, int64_t ldb, float *out, int64_t ldo,
                       const float *ssm_a, const float *dt_bias, int nk, int dk, int dv, float eps,
                       const int *run_start, const int *run_seq, float *const *seq_state,
                       int64_t offset, int64_t ssm_offset, int *done, const float *z, int64_t ldz,
                       const float *norm, uint8_t *q8, int64_t nblocks)
{
    if (threadIdx.x == 0)
        dn_state_prefetch(run_seq, seq_state, offset + ssm_offset, dk, dv);
    SIL_PDL_ENTRY();
    __shared__ float sh[32];
    __shared__ float qs[32 * DN_MAXC], ks[32 * DN_MAXC];
    const int h = blockIdx.x, r = blockIdx.y, kh = h % nk;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j0 = (blockIdx.z * (FWD_THREADS / 32) + warp) * DN_R;
    const int r0 = run_start[r], nt = run_start[r + 1] - r0;
    const int nc = dk / 32;
    float *S = seq_state[run_seq[r]] + offset + ssm_offset + (int64_t)h * dv * dk;
    float s[DN_R][DN_MAXC];
#pragma unroll
    for (int a = 0; a < DN_R; a++)
#pragma unroll
        for (int c = 0; c < DN_MAXC; c++)
            s[a][c] = j0 + a < dv && c < nc ? S[(int64_t)(j0 + a) * dk + c * 32 + lane] : 0.0f;
    for (int t = 0; t < nt; t++) {
        const float *row = conv + (int64_t)(r0 + t) * ldc;
        const float *v = row + 2 * (int64_t)nk * dk + (int64_t)h * dv;
        // the token's scalars and this warp's v loaded with its q and k, before the barriers
        const float a_raw = alpha[(int64_t)(r0 + t) * lda + h], dtb = dt_bias[h], sa = ssm_a[h];
        const float b_raw = beta_raw[(int64_t)(r0 + t) * ldb + h];
        float vj[DN_R];
#pragma unroll
        for (int a = 0; a < DN_R; a++)
            vj[a] = j0 + a < dv ? v[j0 + a] : 0.0f;
        float sq = 0.0f, sk = 0.0f;
        for (int j = threadIdx.x; j < dk; j += FWD_THREADS) {
            const float a = row[(int64_t)kh * dk + j], b = row[(int64_t)nk * dk + kh * dk + j];
            qs[j] = a;
            ks[j] = b;
            sq += a * a;
            sk += b * b;
        }
        sq = fwd_block_sum(sq, sh);
        sk = fwd_block_sum(sk, sh);
        const float qscale = 1.0f / fmaxf(sqrtf(sq), eps) / sqrtf((float)dk);
        const float kscale = 1.0f / fmaxf(sqrtf(sk), eps);
        __syncthreads();
        const float ar = a_raw + dtb;
        const float sp = ar > 20.0f ? ar : log1pf(expf(ar));
        const float decay = expf(sa * sp);
        const float b = 1.0f / (1.0f + expf(-b_raw));
        float kk[DN_MAXC], qq[DN_MAXC];
#pragma unroll
        for (int c = 0; c < DN_MAXC; c++) {
            kk[c] = c < nc ? ks[c * 32 + lane] * kscale : 0.0f;
            qq[c] = c < nc ? qs[c * 32 + lane] * qscale : 0.0f;
        }
#pragma unroll
        for (int a = 0; a < DN_R; a++) {
            const int j = j0 + a;
            if (j >= dv) break;
            float p = 0.0f;
#pragma unroll
            for (int c = 0; c < DN_MAXC; c++)
                if (c < nc) p += s[a][c] * kk[c];
            p = fwd_warp_sum(p);
            const float d = b * (vj[a] - decay * p);
            float o = 0.0f;
#pragma unroll
            for (int c = 0; c < DN_MAXC; c++)
                if (c < nc) {
                    s[a][c] = decay * s[a][c] + d * kk[c];
                    o += s[a][c] * qq[c];
                }
            o = fwd_warp_sum(o);
            if (lane == 0) out[(int64_t)(r0 + t) * ldo + (int64_t)h * dv + j] = o;
        }
        __syncthreads(); // qs, ks are rewritten by the next token
    }
#pragma unroll
    for (int a = 0; a < DN_R; a++)
#pragma unroll
        for (int c = 0; c < DN_MAXC; c++)
            if (j0 + a < dv && c < nc) S[(int64_t)(j0 + a) * dk + c * 32 + lane] = s[a][c];
    if (!done) return;
    // done (one counter per run and head, zero between launches): the last of the head's row
    // groups to finish runs the gated norm of the run's rows, as sil_fwd_gated_norm_q8 would
    if (!sil_last_block(done + (int64_t)r * gridDim.x + h, (int)gridDim.z)) return;
    for (int t = 0; t < nt; t++)
        fwd_gated_norm_row<true>(out, ldo, z, ldz, norm, dv, eps, q8, nblocks, r0 + t, h, sh);
    if (threadIdx.x == 0) done[(int64_t)r * gridDim.x + h] = 0;
}

// The delta net's gated norm in place, per row i (blockIdx.y) and value head h (blockIdx.x):
// o = o / sqrt(mean(o^2) + eps) * norm * silu(z); with q8 (dv % 32 == 0, rows of out
// contiguous), also its q8 blocks (sil_quantize_q8_1's rounding) of nblocks in all.
extern "C" __global__ void __launch_bounds__(FWD_THREADS)
    sil_fwd_gated_norm_q8(float *out, int64_t ldo, const float *z, int64_t ldz, const float *norm,
                          int dv, float eps, uint8_t *q8, int64_t nblocks)
{
    SIL_PDL_ENTRY();
    __shared__ float sh[32];
    fwd_gated_norm_row<false>(out, ldo, z, ldz, norm, dv, eps, q8, nblocks, blockIdx.y, blockIdx.x,
                              sh);
}

// Positions a block of the split takes: the context in gridDim.z equal chunks (a short context
// leaves the last blocks empty: they write an empty partial and stop).
__device__ __forceinline__ int attn_chunk(int np, int nz)
{
    return (np + nz - 1) / nz;
}

// Decode attention split over the context (for a few rows): block (h, i, z) takes the z-th of
// gridDim.z equal chunks of positions 0..pos[i] and writes its partial softmax: m (max score),
// l (sum of exp(score - m)) and o[hd] = sum exp(score - m) V, at part + ((i * n_head + h) *
// gridDim.z + z) * (hd + 2). Chunks are at most 1024 positions (the host sizes the grid).
template <typename KP>
__device__ __forceinline__ void
sil_fwd_attend_part_body(const float *q, int64_t ldq, int q_stride, KP kc, KP vc,
                         const int *pos, const int *seq, int n_head, int n_head_kv, int hd,
                         int n_ctx, const int *btab, int bps, float *part)
{
    __shared__ float sh[32];
    __shared__ float qs[1024];
    __shared__ float s[1024];
    const int i = blockIdx.y, h = blockIdx.x, z = blockIdx.z, nz = gridDim.z;
    const int kvh = h / (n_head / n_head_kv);
    const int np = pos[i] + 1, chunk = attn_chunk(np, nz);
    const int c0 = min(np, z * chunk), c1 = min(np, c0 + chunk);
    const int64_t kv_dim = (int64_t)n_head_kv * hd;
    const float *qh = q + (int64_t)i * ldq + (int64_t)h * q_stride;
    const int *bt = btab + (int64_t)seq[i] * bps; /* the sequence's KV blocks */
    const KP k0 = kc + (int64_t)kvh * hd, v0 = vc + (int64_t)kvh * hd;
    float *out = part + (((int64_t)i * n_head + h) * nz + z) * (hd + 2);
    if (c0 >= c1) { // past the context: an empty partial, which the merge skips
        if (threadIdx.x == 0) out[0] = -INFINITY, out[1] = 0.0f;
        return;
    }
    const float scale = 1.0f / sqrtf((float)hd);
    for (int j = threadIdx.x; j < hd; j += FWD_THREADS)
        qs[j] = qh[j];
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int p = c0 + warp; p < c1; p += FWD_THREADS / 32) {
        const KP kp = k0 + fwd_kv_row(bt, p) * kv_dim;
        float d = 0.0f;
        for (int j = lane; j < hd; j += 32)
            d += qs[j] * kvl(kp, j);
        d = fwd_warp_sum(d);
        if (lane == 0) s[p - c0] = d * scale;
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int p = c0 + threadIdx.x; p < c1; p += FWD_THREADS)
        mx = fmaxf(mx, s[p - c0]);
    mx = fwd_block_max(mx, sh);
    float sum = 0.0f;
    for (int p = c0 + threadIdx.x; p < c1; p += FWD_THREADS) {
        const float e = expf(s[p - c0] - mx);
        s[p - c0] = e;
        sum += e;
    }
    sum = fwd_block_sum(sum, sh); // its barriers also publish s[]
    for (int j = threadIdx.x; j < hd; j += FWD_THREADS) {
        float acc = 0.0f;
        for (int p = c0; p < c1; p++)
            acc += s[p - c0] * kvl(v0, fwd_kv_row(bt, p) * kv_dim + j);
        out[2 + j] = acc;
    }
    if (threadIdx.x == 0) {
        out[0] = c1 > c0 ? mx : -INFINITY;
        out[1] = sum;
    }
}
// sil_fwd_attend_part and sil_fwd_attend_part_gqa take the same arguments.
#define PART_ENTRY(NAME, BODY, KV)                                                                 \
    extern "C" __global__ void __launch_bounds__(FWD_THREADS)                                     \
        NAME(const float *q, int64_t ldq, int q_stride, const KV *kc, const KV *vc,               \
             const int *pos, const int *seq, int n_head, int n_head_kv, int hd, int n_ctx,        \
             const int *btab, int bps, float *part)                                               \
    {                                                                                            \
        SIL_PDL_ENTRY();                                                                         \
        BODY(q, ldq, q_stride, kv_view(kc), kv_view(vc), pos, seq, n_head, n_head_kv, hd, n_ctx, \
             btab, bps, part);                                                                   \
    }
PART_ENTRY(sil_fwd_attend_part, sil_fwd_attend_part_body, float)
PART_ENTRY(sil_fwd_attend_part_h, sil_fwd_attend_part_body, __half)
PART_ENTRY(sil_fwd_attend_part_q8, sil_fwd_attend_part_body, kv_q8_0)
PART_ENTRY(sil_fwd_attend_part_q4, sil_fwd_attend_part_body, kv_q4_0)

#define GQA_MAX 8      // query heads per KV head the grouped kernel takes
#define GQA_HD 256     // head size it takes at most
#define GQA_CHUNK 512  // positions a block takes at most (the host's split keeps to it)
#define GQA_UNROLL 4   // K rows a warp loads before it sums

// The rows p0 .. p0 + GQA_UNROLL - 1 (those before c1; zeros past it) of one KV head's cache,
// lane's columns lane + 32 t, loaded together so their latencies overlap.
template <typename KP>
__device__ __forceinline__ void gqa_rows(float r[GQA_UNROLL][GQA_HD / 32], KP head,
                                         const int *bt, int p0, int c1, int64_t kv_dim, int hd,
                                         int lane)
{
#pragma unroll
    for (int u = 0; u < GQA_UNROLL; u++) {
        const bool in = p0 + u < c1;
        const KP rp = head + (in ? fwd_kv_row(bt, p0 + u) : 0) * kv_dim;
#pragma unroll
        for (int t = 0; t < GQA_HD / 32; t++)
            r[u][t] = in && lane + 32 * t < hd ? kvl(rp, lane + 32 * t) : 0.0f;
    }
}

// sil_fwd_attend_part for the G = n_head / n_head_kv query heads sharing one KV head at once
// (2 <= G <= GQA_MAX, hd <= GQA_HD): block (KV head, row, z) of GQA_MAX warps, warp g taking
// query head g of the KV head over the chunk: K and V rows are read from memory once for the
// block (the other warps find them in L1), and no warp waits for another (no block barrier).
// Each head's scores, exponentials and V sums are those of sil_fwd_attend_part (the same
// products in the same order); its softmax sum l is a warp's sum, so it may differ from that
// kernel's in the last bits. Partials as it writes them.
template <typename KP>
__device__ __forceinline__ void
sil_fwd_attend_part_gqa_body(const float *q, int64_t ldq, int q_stride, KP kc, KP vc,
                             const int *pos, const int *seq, int n_head, int n_head_kv, int hd,
                             int n_ctx, const int *btab, int bps, float *part)
{
    __shared__ float s[GQA_MAX][GQA_CHUNK];
    const int i = blockIdx.y, kvh = blockIdx.x, z = blockIdx.z, nz = gridDim.z;
    const int G = n_head / n_head_kv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (warp >= G) return;
    const int h = kvh * G + warp;
    const int np = pos[i] + 1, chunk = attn_chunk(np, nz);
    const int c0 = min(np, z * chunk), c1 = min(np, c0 + chunk);
    float *out = part + (((int64_t)i * n_head + h) * nz + z) * (hd + 2);
    if (c0 >= c1) { // past the context: an empty partial, which the merge skips
        if (lane == 0) out[0] = -INFINITY, out[1] = 0.0f;
        return;
    }
    const int64_t kv_dim = (int64_t)n_head_kv * hd;
    const int *bt = btab + (int64_t)seq[i] * bps; /* the sequence's KV blocks */
    const KP k0 = kc + (int64_t)kvh * hd, v0 = vc + (int64_t)kvh * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    const float *qh = q + (int64_t)i * ldq + (int64_t)h * q_stride;
    float qr[GQA_HD / 32];
#pragma unroll
    for (int t = 0; t < GQA_HD / 32; t++)
        qr[t] = lane + 32 * t < hd ? qh[lane + 32 * t] : 0.0f;
    float *sg = s[warp];
    // scores: GQA_UNROLL K rows loaded before any sum; lane the columns lane + 32 t (each lane's
    // products added in t order, then across the warp)
    for (int p0 = c0; p0 < c1; p0 += GQA_UNROLL) {
        float kr[GQA_UNROLL][GQA_HD / 32];
        gqa_rows(kr, k0, bt, p0, c1, kv_dim, hd, lane);
#pragma unroll
        for (int u = 0; u < GQA_UNROLL; u++) {
            float d = 0.0f;
#pragma unroll
            for (int t = 0; t < GQA_HD / 32; t++)
                d += qr[t] * kr[u][t];
            d = fwd_warp_sum(d);
            if (lane == 0 && p0 + u < c1) sg[p0 + u - c0] = d * scale;
        }
    }
    __syncwarp();
    float mx = -INFINITY;
    for (int p = c0 + lane; p < c1; p += 32)
        mx = fmaxf(mx, sg[p - c0]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0.0f;
    for (int p = c0 + lane; p < c1; p += 32) {
        const float e = expf(sg[p - c0] - mx);
        sg[p - c0] = e;
        sum += e;
    }
    sum = fwd_warp_sum(sum);
    __syncwarp();
    // V: lane the columns lane + 32 t, positions in order (as sil_fwd_attend_part adds them)
    float acc[GQA_HD / 32];
#pragma unroll
    for (int t = 0; t < GQA_HD / 32; t++)
        acc[t] = 0.0f;
    for (int p0 = c0; p0 < c1; p0 += GQA_UNROLL) {
        float vr[GQA_UNROLL][GQA_HD / 32];
        gqa_rows(vr, v0, bt, p0, c1, kv_dim, hd, lane);
#pragma unroll
        for (int u = 0; u < GQA_UNROLL; u++) {
            if (p0 + u >= c1) break;
            const float w = sg[p0 + u - c0];
#pragma unroll
            for (int t = 0; t < GQA_HD / 32; t++)
                acc[t] += w * vr[u][t];
        }
    }
#pragma unroll
    for (int t = 0; t < GQA_HD / 32; t++)
        if (lane + 32 * t < hd) out[2 + lane + 32 * t] = acc[t];
    if (lane == 0) out[0] = mx, out[1] = sum;
}
// Where n elements of a view start, and their bytes (a head's row starts on a block).
__device__ __forceinline__ const void *kv_addr(const float *p, int64_t e) { return p + e; }
__device__ __forceinline__ const void *kv_addr(const __half *p, int64_t e) { return p + e; }
__device__ __forceinline__ const void *kv_addr(kvq8v v, int64_t e)
{
    return v.b + ((v.e + e) >> 5) * KV_Q8_BYTES;
}
__device__ __forceinline__ const void *kv_addr(kvq4v v, int64_t e)
{
    return v.b + ((v.e + e) >> 5) * KV_Q4_BYTES;
}
__device__ __forceinline__ uint64_t kv_bytes(const float *, int n) { return 4ull * n; }
__device__ __forceinline__ uint64_t kv_bytes(const __half *, int n) { return 2ull * n; }
__device__ __forceinline__ uint64_t kv_bytes(kvq8v, int n)
{
    return (uint64_t)n / 32 * KV_Q8_BYTES;
}
__device__ __forceinline__ uint64_t kv_bytes(kvq4v, int n)
{
    return (uint64_t)n / 32 * KV_Q4_BYTES;
}

// Before the wait: the K and V rows of the block's chunk, a position a thread (the cache holds
// them from earlier steps; the newest row is the previous launch's, which L2 sees as it is).
template <typename KP>
__device__ __forceinline__ void gqa_prefetch(KP kc, KP vc, const int *pos, const int *seq,
                                             int n_head_kv, int hd, const int *btab, int bps)
{
    if (!sil_l2_pf)
        return;
    const int i = blockIdx.y, kvh = blockIdx.x, z = blockIdx.z, nz = gridDim.z;
    const int np = pos[i] + 1, chunk = attn_chunk(np, nz);
    const int c0 = min(np, z * chunk), c1 = min(min(np, c0 + chunk), bps * FWD_KV_BLOCK);
    const int64_t kv_dim = (int64_t)n_head_kv * hd;
    const int *bt = btab + (int64_t)seq[i] * bps;
    for (int p = c0 + threadIdx.x; p < c1; p += blockDim.x) {
        const int64_t e = fwd_kv_row(bt, p) * kv_dim + (int64_t)kvh * hd;
        sil_l2_prefetch(kv_addr(kc, e), kv_bytes(kc, hd));
        sil_l2_prefetch(kv_addr(vc, e), kv_bytes(vc, hd));
    }
}

// GQA_MAX warps a block
#define PART_GQA_ENTRY(NAME, KV)                                                                   \
    extern "C" __global__ void __launch_bounds__(GQA_MAX * 32, 2)                                 \
        NAME(const float *q, int64_t ldq, int q_stride, const KV *kc, const KV *vc,               \
             const int *pos, const int *seq, int n_head, int n_head_kv, int hd, int n_ctx,        \
             const int *btab, int bps, float *part)                                               \
    {                                                                                            \
        gqa_prefetch(kv_view(kc), kv_view(vc), pos, seq, n_head_kv, hd, btab, bps);              \
        SIL_PDL_ENTRY();                                                                         \
        sil_fwd_attend_part_gqa_body(q, ldq, q_stride, kv_view(kc), kv_view(vc), pos, seq,       \
                                     n_head, n_head_kv, hd, n_ctx, btab, bps, part);            \
    }
PART_GQA_ENTRY(sil_fwd_attend_part_gqa, float)
PART_GQA_ENTRY(sil_fwd_attend_part_gqa_h, __half)
PART_GQA_ENTRY(sil_fwd_attend_part_gqa_q8, kv_q8_0)
PART_GQA_ENTRY(sil_fwd_attend_part_gqa_q4, kv_q4_0)

// The partials of sil_fwd_attend_part (nz per head and row) merged: o_h = sum_z exp(m_z - M) o_z
// / sum_z exp(m_z - M) l_z; gated: o *= sigmoid of the gate after q_h. Grid (n_head, rows,
// ceil(hd / 32)).
#define COMBINE_MAX 1024 // partials a head the merge takes (the host's split keeps to it)

__device__ __forceinline__ float fwd_block_reduce(float v, bool is_max, float *red)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float t = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, t) : v + t;
    }
    __syncthreads(); // red is free again
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = red[0];
    for (int w = 1; w < FWD_THREADS / 32; w++)
        v = is_max ? fmaxf(v, red[w]) : v + red[w];
    return v;
}

extern "C" __global__ void __launch_bounds__(FWD_THREADS)
    sil_fwd_attend_combine(const float *q, int64_t ldq, int q_stride, float *o, int64_t ldo,
                           const float *part, int nz, int n_head, int hd, int gated, uint8_t *q8,
                           int64_t nblocks)
{
    SIL_PDL_ENTRY();
    __shared__ float wz[COMBINE_MAX];
    __shared__ float red[FWD_THREADS / 32];
    __shared__ float sum[FWD_THREADS / 32][32];
    const int i = blockIdx.y, h = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float *pt = part + ((int64_t)i * n_head + h) * nz * (hd + 2);
    if (nz > COMBINE_MAX) nz = COMBINE_MAX; /* never: the host keeps to it */
    float M = -INFINITY;
    for (int z = threadIdx.x; z < nz; z += FWD_THREADS)
        M = fmaxf(M, pt[(int64_t)z * (hd + 2)]);
    M = fwd_block_reduce(M, true, red);
    float L = 0.0f;
    for (int z = threadIdx.x; z < nz; z += FWD_THREADS) {
        const float m = pt[(int64_t)z * (hd + 2)];
        const float w = m != -INFINITY ? expf(m - M) : 0.0f;
        wz[z] = w;
        L += w * pt[(int64_t)z * (hd + 2) + 1];
    }
    L = fwd_block_reduce(L, false, red); /* its barriers also publish wz */
    const float inv = 1.0f / L;
    const float *qh = q + (int64_t)i * ldq + (int64_t)h * q_stride;
    float *oh = o + (int64_t)i * ldo + (int64_t)h * hd;
    // block z takes the columns 32 z + lane; warp w sums the partials w, w + 4, ..., four at a
    // time (their loads first); the warps' sums are then added in warp order
    const int j = blockIdx.z * 32 + lane;
    float acc = 0.0f;
    for (int z0 = warp * 4; z0 < nz; z0 += FWD_THREADS / 32 * 4) {
        float v[4];
#pragma unroll
        for (int u = 0; u < 4; u++)
            v[u] = z0 + u < nz && j < hd && wz[z0 + u] != 0.0f
                       ? pt[(int64_t)(z0 + u) * (hd + 2) + 2 + j]
                       : 0.0f;
#pragma unroll
        for (int u = 0; u < 4; u++)
            if (z0 + u < nz && wz[z0 + u] != 0.0f) acc += wz[z0 + u] * v[u];
    }
    sum[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && j < hd) {
        float a = sum[0][lane];
        for (int w = 1; w < FWD_THREADS / 32; w++)
            a += sum[w][lane];
        a *= inv;
        if (gated) a *= 1.0f / (1.0f + expf(-qh[hd + j]));
        oh[j] = a;
        // q8 (hd % 32 == 0, rows of o contiguous, so every lane is here): these 32 columns
        // are one q8 block of the output projection's input, rounded as sil_quantize_q8_1 does
        if (q8) fwd_q8_store(a, ((int64_t)i * ldo + (int64_t)h * hd + j) / 32, lane, q8,
                             (float2 *)(q8 + nblocks * 32));
    }
}
