// Programmatic dependent launch (sm_90 and newer, SASS only). The host launches kernels so that
// the next kernel of a stream may start while this one runs (cuda_launch.c, sil_cu_launch); every
// kernel therefore begins with SIL_PDL_ENTRY() before it touches memory: wait for the previous
// kernel of the stream to finish and its writes to be visible, then let the next one be
// scheduled. The next kernel's launch and block start-up overlap this one's work; what any
// kernel reads or writes is still ordered as without it. A no-op where the launch did not ask
// for it, and compiled out below sm_90 (the compute_75 PTX has neither instruction: the host
// turns the attribute off when the module came through the JIT). tests/pdl-entry.sh checks
// that every kernel starts with it.
#pragma once

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define SIL_PDL_ENTRY()                                                                            \
    asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define SIL_PDL_ENTRY()                                                                            \
    do {                                                                                           \
    } while (0)
#endif

// L2 prefetch before the wait. A kernel that PDL starts early knows which weights it will read
// (they do not depend on the kernel before it), so it asks L2 for them before SIL_PDL_ENTRY()
// and finds them there when it may load: the weights come from HBM while the previous kernel
// runs. A hint only: nothing is read into the kernel or written, so it may name memory the
// previous kernel still writes (L2 is where the device's writes meet, so no stale line can be
// read later). sm_90 SASS only (the bulk prefetch instruction; the host clears sil_l2_pf where
// launches do not overlap, and SIL_CUDA_PREFETCH=0 clears it to measure without). Ranges are
// widened to 16 bytes each side (inside the allocation: tensors start 256-byte aligned and
// allocations end on pages).
__constant__ int sil_l2_pf;

#define SIL_PF_CHUNK 32768u  // bytes a bulk prefetch instruction asks for at most
#define SIL_PF_BLOCKS 1024   // blocks of a launch that share its prefetch at most
#define SIL_PF_MAX (24ull << 20) // a launch's ranges larger than this are not prefetched

__device__ __forceinline__ void sil_l2_prefetch(const void *p, uint64_t bytes)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    uint64_t a = (uint64_t)(uintptr_t)p & ~15ull;
    const uint64_t e = ((uint64_t)(uintptr_t)p + bytes + 15ull) & ~15ull;
    while (a < e) {
        const uint32_t n = e - a > SIL_PF_CHUNK ? SIL_PF_CHUNK : (uint32_t)(e - a);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(n) : "memory");
        a += n;
    }
#else
    (void)p;
    (void)bytes;
#endif
}

// Share b of nb of [p, p + bytes) in 16-byte units: what block b of the first nb blocks of a
// launch prefetches of a range they split (one thread a block calls it).
__device__ __forceinline__ void sil_l2_prefetch_share(const void *p, uint64_t bytes, int b, int nb)
{
    if (!sil_l2_pf || bytes == 0 || bytes > SIL_PF_MAX || b >= nb)
        return;
    const uint64_t units = (bytes + 15) / 16, per = (units + nb - 1) / nb;
    const uint64_t u0 = (uint64_t)b * per;
    if (u0 >= units)
        return;
    const uint64_t n = units - u0 < per ? units - u0 : per;
    sil_l2_prefetch((const uint8_t *)p + u0 * 16, n * 16);
}

// The launch's blocks that prefetch (the first SIL_PF_BLOCKS along x).
__device__ __forceinline__ int sil_pf_blocks(void)
{
    return (int)gridDim.x < SIL_PF_BLOCKS ? (int)gridDim.x : SIL_PF_BLOCKS;
}
