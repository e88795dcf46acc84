/* Private to the host files of kernels/cuda: the Driver API as this library reaches it, the
 * context (struct sil_cuda) and the helpers every file uses.
 * cuda_driver.c: the driver loaded, the device and its context, the module and further modules;
 * cuda_memory.c: device memory, pinned host memory, copies;
 * cuda_stream.c: streams, events, graph capture and replay;
 * cuda_launch.c: every kernel launch (programmatic dependent launch, profiling, injected faults);
 * cuda_ops.c: weights and the ops of kernels.cu.
 * The contract is cuda_backend.h; nothing outside kernels/cuda includes this header. */
#ifndef SIL_CUDA_IMPL_H
#define SIL_CUDA_IMPL_H

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

#include "kernels/cpu/quants.h"
#include "kernels/cuda/cuda_backend.h"

/* The few Driver API types and constants used, as cuda.h declares them (ABI-stable). */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef unsigned long long CUdeviceptr;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_NO_DEVICE = 100,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_STREAM_NON_BLOCKING = 1,
    CU_EVENT_DEFAULT = 0,
    CU_EVENT_DISABLE_TIMING = 2,
    CU_MEMHOSTALLOC_PORTABLE = 1,
    CU_MEMHOSTREGISTER_PORTABLE = 1,
    CU_MEMHOSTREGISTER_DEVICEMAP = 2,
    CU_MEMHOSTREGISTER_READ_ONLY = 8,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
};

/* cuLaunchKernelEx's configuration (cuda.h, CUDA 12.0 and newer), for programmatic dependent
 * launch: the attribute id 6 (CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) with the
 * int programmaticStreamSerializationAllowed first in the 64-byte value union. */
typedef struct {
    int id;
    char pad[4];
    union {
        char pad[64];
        int allowed;
    } value;
} CUlaunchAttribute;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned numAttrs;
} CUlaunchConfig;
typedef CUresult (*cu_launch_ex_fn)(const CUlaunchConfig *, CUfunction, void **, void **);
enum { CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6 };

/* Symbol names are the ones cuda.h maps its API names to (the _v2 ABI where there is one). */
#define SIL_CU_FUNCS(X)                                                                            \
    X(cuGetErrorString, CUresult, (CUresult, const char **))                                       \
    X(cuGetErrorName, CUresult, (CUresult, const char **))                                         \
    X(cuInit, CUresult, (unsigned))                                                                \
    X(cuDriverGetVersion, CUresult, (int *))                                                       \
    X(cuDeviceGetCount, CUresult, (int *))                                                         \
    X(cuDeviceGet, CUresult, (CUdevice *, int))                                                    \
    X(cuDeviceGetName, CUresult, (char *, int, CUdevice))                                          \
    X(cuDeviceGetAttribute, CUresult, (int *, int, CUdevice))                                      \
    X(cuDeviceTotalMem_v2, CUresult, (size_t *, CUdevice))                                         \
    X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice))                                 \
    X(cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice))                                          \
    X(cuCtxGetCurrent, CUresult, (CUcontext *))                                                    \
    X(cuCtxSetCurrent, CUresult, (CUcontext))                                                      \
    X(cuModuleLoadData, CUresult, (CUmodule *, const void *))                                      \
    X(cuModuleUnload, CUresult, (CUmodule))                                                        \
    X(cuModuleGetFunction, CUresult, (CUfunction *, CUmodule, const char *))                       \
    X(cuModuleGetGlobal_v2, CUresult, (CUdeviceptr *, size_t *, CUmodule, const char *))           \
    X(cuMemcpyHtoD_v2, CUresult, (CUdeviceptr, const void *, size_t))                              \
    X(cuMemGetInfo_v2, CUresult, (size_t *, size_t *))                                             \
    X(cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t))                                            \
    X(cuMemFree_v2, CUresult, (CUdeviceptr))                                                       \
    X(cuMemHostAlloc, CUresult, (void **, size_t, unsigned))                                       \
    X(cuMemFreeHost, CUresult, (void *))                                                           \
    X(cuMemHostRegister_v2, CUresult, (void *, size_t, unsigned))                                  \
    X(cuMemHostUnregister, CUresult, (void *))                                                     \
    X(cuMemHostGetDevicePointer_v2, CUresult, (CUdeviceptr *, void *, unsigned))                   \
    X(cuMemcpyHtoDAsync_v2, CUresult, (CUdeviceptr, const void *, size_t, CUstream))               \
    X(cuMemcpyDtoHAsync_v2, CUresult, (void *, CUdeviceptr, size_t, CUstream))                     \
    X(cuMemcpyDtoDAsync_v2, CUresult, (CUdeviceptr, CUdeviceptr, size_t, CUstream))                \
    X(cuMemsetD8Async, CUresult, (CUdeviceptr, unsigned char, size_t, CUstream))                   \
    X(cuStreamCreate, CUresult, (CUstream *, unsigned))                                            \
    X(cuStreamDestroy_v2, CUresult, (CUstream))                                                    \
    X(cuStreamSynchronize, CUresult, (CUstream))                                                   \
    X(cuEventCreate, CUresult, (CUevent *, unsigned))                                              \
    X(cuEventDestroy_v2, CUresult, (CUevent))                                                      \
    X(cuEventRecord, CUresult, (CUevent, CUstream))                                                \
    X(cuEventSynchronize, CUresult, (CUevent))                                                     \
    X(cuEventElapsedTime, CUresult, (float *, CUevent, CUevent))                                   \
    X(cuLaunchKernel, CUresult,                                                                    \
      (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, \
       void **, void **))                                                                          \
    X(cuStreamBeginCapture_v2, CUresult, (CUstream, int))                                          \
    X(cuStreamEndCapture, CUresult, (CUstream, CUgraph *))                                         \
    X(cuGraphInstantiateWithFlags, CUresult, (CUgraphExec *, CUgraph, unsigned long long))         \
    X(cuGraphLaunch, CUresult, (CUgraphExec, CUstream))                                            \
    X(cuGraphExecDestroy, CUresult, (CUgraphExec))                                                 \
    X(cuGraphDestroy, CUresult, (CUgraph))

struct sil_cu_api {
    void *lib;
    cu_launch_ex_fn cuLaunchKernelEx; /* optional: NULL on drivers before CUDA 12 */
#define X(name, ret, args) ret(*name) args;
    SIL_CU_FUNCS(X)
#undef X
};

/* Kernel entry points, named as in kernels.cu. The matvec ones are [type slot][batch - 1]. */
enum {
    MV_Q4_0,
    MV_Q4_1,
    MV_Q5_0,
    MV_Q5_1,
    MV_Q8_0,
    MV_Q4_K,
    MV_Q5_K,
    MV_Q6_K,
    MV_F32,
    MV_F16,
    MV_BF16,
    MV_COUNT
};
/* The types of each slot: kernel names carry the type's name from the type-traits table
 * (sil_type_name: "sil_mmvq_q4_K_1"), and so do profiles ("matvec q4_K"). */
static const int mv_types[MV_COUNT] = {
    [MV_Q4_0] = SIL_TYPE_Q4_0, [MV_Q4_1] = SIL_TYPE_Q4_1, [MV_Q5_0] = SIL_TYPE_Q5_0,
    [MV_Q5_1] = SIL_TYPE_Q5_1, [MV_Q8_0] = SIL_TYPE_Q8_0, [MV_Q4_K] = SIL_TYPE_Q4_K,
    [MV_Q5_K] = SIL_TYPE_Q5_K, [MV_Q6_K] = SIL_TYPE_Q6_K, [MV_F32] = SIL_TYPE_F32,
    [MV_F16] = SIL_TYPE_F16,   [MV_BF16] = SIL_TYPE_BF16};
/* what profiles and errors call a slot's kernels: "matvec q4_K", ... (the MoE kernels are
 * quantized slots only) */
enum { W_MATVEC, W_MATMUL, W_GATE_UP, W_DOWN, W_COUNT };
#define WHAT_MAX 24
enum { K_QUANTIZE, K_RMSNORM, K_ADD, K_SWIGLU, K_ROPE, K_ROUTER, K_ARGMAX, K_COUNT };

/* weight rows a block of sil_mmf_thin takes (SIL_MMF_TR in mmq.cuh) */
#define SIL_CUDA_MMF_TR 4

struct sil_cuda {
    struct sil_cu_api api;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUstream stream; /* the default stream of this context's ops */
    CUfunction mv[MV_COUNT][SIL_CUDA_MAX_BATCH];
    CUfunction mvm[MV_F32][SIL_CUDA_MAX_BATCH]; /* several weights of one type, one launch */
    CUfunction mvx[SIL_CUDA_MAX_BATCH];         /* several of the mixable types, one launch */
    CUfunction mvxc[SIL_CUDA_MAX_BATCH]; /* the same with the delta net's conv1d epilogue */
    CUfunction k[K_COUNT];
    CUfunction moe_gate_up[MV_F32], moe_down[MV_F32];
    CUfunction moe_gate_up_sh[MV_F32], moe_down_sh[MV_F32];
    CUfunction router_fused[SIL_CUDA_MAX_BATCH]; /* F32 router matvec + top-k, [batch - 1] */
    CUfunction router_norm[3]; /* the add + rmsnorm + q8 before it too, one token: 128, 512
                                * and 1024 threads a block, 4 router rows a block */
    CUfunction mmq[MV_F32][2]; /* [type slot][0: sm_75 mma, 1: sm_80 mma] */
    CUfunction mmq_grp[MV_F32][2][3]; /* [type][sm_80][tile: 16, 32, 64 activation rows] */
    int32_t grouped_bn;               /* options grouped_bn: 16, 32 or 64; 0: chosen a launch */
    CUfunction mmf[MV_COUNT - MV_F32];
    CUfunction mmf_thin[MV_COUNT - MV_F32]; /* few weight rows: a warp per 4 x 8 products */
    char what[W_COUNT][MV_COUNT][WHAT_MAX]; /* w_kinds[k] and the slot's type name */
    int mma_best, mma_sm; /* the newest mma path this module runs on the device; the one used */
    struct sil_cuda_info info;
    /* per-kernel profile (sil_cuda_profile): every launch timed between two events */
    bool prof;
    CUevent prof_ev[2];
    uint64_t prof_bytes; /* weight bytes the next launch reads, set by the op */
    struct sil_cuda_prof prof_tab[SIL_CUDA_PROF_MAX];
    int prof_n;
    /* tests: SIL_CUDA_INJECT_OOM=N fails the N-th launch as out of memory, once */
    uint64_t n_launch, fail_at;
};

struct sil_cuda_stream {
    CUstream s;
};
struct sil_cuda_event {
    CUevent e;
};

static inline int set_err(struct sil_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static inline int set_err(struct sil_error *err, int code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

/* Driver errors as -errno: out of memory is ENOMEM, no device ENODEV, the rest EIO. */
static inline int cu_fail(const struct sil_cu_api *api, struct sil_error *err, CUresult r,
                          const char *call)
{
    const char *name = NULL, *str = NULL;
    if (api->cuGetErrorName) api->cuGetErrorName(r, &name);
    if (api->cuGetErrorString) api->cuGetErrorString(r, &str);
    const int code = r == 2 ? -ENOMEM : r == CUDA_ERROR_NO_DEVICE ? -ENODEV : -EIO;
    return set_err(err, code, "cuda: %s failed: %s (%s, %d)", call, str ? str : "unknown error",
                   name ? name : "?", r);
}

#define CU_CHECK(cu, err, call)                                                                    \
    do {                                                                                           \
        CUresult r_ = (cu)->api.call;                                                              \
        if (r_ != CUDA_SUCCESS) return cu_fail(&(cu)->api, err, r_, #call);                        \
    } while (0)

/* Binds the context to the calling thread (a no-op when it already is). */
static inline int bind_ctx(struct sil_cuda *cu, struct sil_error *err)
{
    CUcontext cur = NULL;
    CU_CHECK(cu, err, cuCtxGetCurrent(&cur));
    if (cur != cu->ctx) CU_CHECK(cu, err, cuCtxSetCurrent(cu->ctx));
    return 0;
}

static inline CUstream stream_of(const struct sil_cuda *cu, const struct sil_cuda_stream *s)
{
    return s ? s->s : cu->stream;
}

/* Every kernel launch of these files and of further modules (cuda_launch.c). */
int sil_cu_launch(struct sil_cuda *cu, CUfunction f, const char *what, unsigned gx, unsigned gy,
                  unsigned gz, unsigned block, struct sil_cuda_stream *s, void **params,
                  struct sil_error *err);

static inline int launch(struct sil_cuda *cu, CUfunction f, const char *what, unsigned gx,
                         unsigned gy, unsigned block, struct sil_cuda_stream *s, void **params,
                         struct sil_error *err)
{
    return sil_cu_launch(cu, f, what, gx, gy, 1, block, s, params, err);
}

#endif
