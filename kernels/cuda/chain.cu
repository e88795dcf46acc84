// Measurement kernels for sil-cudabench (not used by the engine): a chain of ordered decode
// stages, each a batch-1 Q4_K matvec of the backend (sil_mmvq) over the same q8 input, each
// stage's weights its own (stage s reads w + s * stride), run two ways so the cost of a stage
// boundary can be measured on the device:
//   sil_chain_stage:   one stage a launch (the host captures the launches into a graph, with
//                      programmatic dependent launch where the backend uses it), as decode runs:
//                      a stage starts its loads only after the stage before has finished;
//   sil_chain_persist: every stage in one launch, a grid-wide barrier between stages (calm's
//                      persistent style); pf: the next stage's weights are asked of L2 before
//                      the barrier.
// The input is not the stage before's output, so a stage's time is its matvec plus the boundary
// and nothing else (a q8 rounding of the input in every block would add a chain of its own).
// Timing only: the outputs are not checked.
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/sync.cuh"
#define SIL_MMVQ_NO_ENTRIES // the device functions only: the matvec kernels are kernels.cu's
#include "kernels/cuda/mmvq.cuh"

__device__ __forceinline__ void chain_rows(const uint8_t *w, uint64_t row_bytes, int rows, int cols,
                                           const uint8_t *a8, float *y, int bx)
{
    sil_mmvq<WT_Q4_K, 1>(w, row_bytes, rows, cols / 32, a8, y, rows, bx);
}

extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32)
    sil_chain_stage(const uint8_t *w, uint64_t row_bytes, int rows, int cols, const uint8_t *a8,
                    float *y)
{
    SIL_PDL_ENTRY();
    chain_rows(w, row_bytes, rows, cols, a8, y, blockIdx.x);
}

// All blocks of the grid (resident together: the host sizes the grid by occupancy) meet here:
// bar[0] counts arrivals, bar[1] is the generation the last one to arrive advances. A block that
// waits longer than about a second sets bar[2] and goes on (no hang if blocks were not
// resident; the host reports the run as failed).
__device__ __forceinline__ void chain_barrier(unsigned *bar)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        volatile unsigned *gen = bar + 1;
        const unsigned g = *gen;
        __threadfence();
        if (atomicAdd(bar, 1u) == gridDim.x - 1) {
            atomicExch(bar, 0u);
            __threadfence();
            atomicAdd(bar + 1, 1u);
        } else {
            long long spins = 0;
            while (*gen == g) {
                if (++spins > (1ll << 26)) {
                    atomicExch(bar + 2, 1u);
                    break;
                }
            }
        }
        __threadfence();
    }
    __syncthreads();
}

// 4 blocks an SM at most 128 registers a thread: the host's grid of 4 blocks an SM is resident.
extern "C" __global__ void __launch_bounds__(SIL_MMV_WARPS * 32, 4)
    sil_chain_persist(const uint8_t *w, uint64_t stride, uint64_t row_bytes, int rows, int cols,
                      int stages, const uint8_t *a8, float *y, unsigned *bar, int pf)
{
    SIL_PDL_ENTRY();
    const int nblk = (rows + SIL_MMV_WARPS - 1) / SIL_MMV_WARPS;
    const uint64_t bytes = (uint64_t)rows * row_bytes;
    if (pf && threadIdx.x == 0)
        sil_l2_prefetch_share(w, bytes, blockIdx.x, gridDim.x);
    for (int s = 0; s < stages; s++) {
        const uint8_t *ws = w + (uint64_t)s * stride;
        for (int b = blockIdx.x; b < nblk; b += gridDim.x)
            chain_rows(ws, row_bytes, rows, cols, a8, y, b);
        if (pf && threadIdx.x == 0 && s + 1 < stages)
            sil_l2_prefetch_share(ws + stride, bytes, blockIdx.x, gridDim.x);
        chain_barrier(bar);
    }
}
