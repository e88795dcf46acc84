/* The CUDA backend's host side: the Driver API through dlopen, the embedded fatbin, buffers,
 * streams, events, and the launches of the kernels in kernels.cu. Contract in cuda_backend.h. */
#include "kernels/cuda/cuda_backend.h"

#include <dlfcn.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/quants.h"

#ifndef SIL_CUDA_ARCHS
#define SIL_CUDA_ARCHS "unknown"
#endif

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
static const char *const w_kinds[W_COUNT] = {"matvec", "matmul", "moe_gate_up", "moe_down"};
#define WHAT_MAX 24
enum { K_QUANTIZE, K_RMSNORM, K_ADD, K_SWIGLU, K_ROPE, K_ROUTER, K_ARGMAX, K_COUNT };
static const char *const k_names[K_COUNT] = {
    "sil_quantize_q8_1", "sil_rmsnorm_f32",     "sil_add_f32",    "sil_swiglu_f32",
    "sil_rope_neox_f32", "sil_router_topk_f32", "sil_argmax_f32",
};

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
    CUfunction mmq_grp[MV_F32][2];
    CUfunction mmf[MV_COUNT - MV_F32];
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

extern const unsigned char sil_cuda_fatbin[];
extern const uint64_t sil_cuda_fatbin_size;

const char *sil_cuda_fatbin_archs(void)
{
    return SIL_CUDA_ARCHS;
}

static int set_err(struct sil_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int set_err(struct sil_error *err, int code, const char *fmt, ...)
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
static int cu_fail(const struct sil_cu_api *api, struct sil_error *err, CUresult r,
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
static int bind_ctx(struct sil_cuda *cu, struct sil_error *err)
{
    CUcontext cur = NULL;
    CU_CHECK(cu, err, cuCtxGetCurrent(&cur));
    if (cur != cu->ctx) CU_CHECK(cu, err, cuCtxSetCurrent(cu->ctx));
    return 0;
}

static CUstream stream_of(const struct sil_cuda *cu, const struct sil_cuda_stream *s)
{
    return s ? s->s : cu->stream;
}

static int load_api(struct sil_cu_api *api, const char *lib, struct sil_error *err)
{
    if (!lib || !*lib) lib = "libcuda.so.1";
    api->lib = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!api->lib) {
        const char *why = dlerror();
        return set_err(err, -ENOENT, "cuda: %s not found (no NVIDIA driver installed?): %s", lib,
                       why ? why : "dlopen failed");
    }
#define X(name, ret, args)                                                                         \
    *(void **)&api->name = dlsym(api->lib, #name);                                                 \
    if (!api->name) {                                                                              \
        dlclose(api->lib);                                                                         \
        api->lib = NULL;                                                                           \
        return set_err(err, -ENOSYS, "cuda: %s lacks %s (driver too old?)", lib, #name);           \
    }
    SIL_CU_FUNCS(X)
#undef X
    *(void **)&api->cuLaunchKernelEx = dlsym(api->lib, "cuLaunchKernelEx");
    return 0;
}

/* A module's sil_l2_pf (pdl.cuh) from info.l2_prefetch; a module without it is left alone. */
static int set_prefetch_flag(struct sil_cuda *cu, CUmodule mod, struct sil_error *err)
{
    CUdeviceptr p = 0;
    size_t bytes = 0;
    if (cu->api.cuModuleGetGlobal_v2(&p, &bytes, mod, "sil_l2_pf") != CUDA_SUCCESS ||
        bytes != sizeof(int))
        return 0;
    const int on = cu->info.l2_prefetch;
    CU_CHECK(cu, err, cuMemcpyHtoD_v2(p, &on, sizeof on));
    return 0;
}

static int load_functions(struct sil_cuda *cu, struct sil_error *err)
{
    char name[64];
    const char *mv_names[MV_COUNT];
    for (int t = 0; t < MV_COUNT; t++) {
        mv_names[t] = sil_type_name(mv_types[t]);
        for (int k = 0; k < W_COUNT; k++)
            snprintf(cu->what[k][t], WHAT_MAX, "%s %s", w_kinds[k], mv_names[t]);
    }
    for (int t = 0; t < MV_COUNT; t++)
        for (int n = 1; n <= SIL_CUDA_MAX_BATCH; n++) {
            snprintf(name, sizeof name, "sil_%s_%s_%d", t >= MV_F32 ? "mmvf" : "mmvq", mv_names[t],
                     n);
            CUresult r = cu->api.cuModuleGetFunction(&cu->mv[t][n - 1], cu->mod, name);
            if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, name);
            if (t >= MV_F32) continue;
            snprintf(name, sizeof name, "sil_mmvq_multi_%s_%d", mv_names[t], n);
            r = cu->api.cuModuleGetFunction(&cu->mvm[t][n - 1], cu->mod, name);
            if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, name);
        }
    for (int n = 1; n <= SIL_CUDA_MAX_BATCH; n++) {
        snprintf(name, sizeof name, "sil_mmvq_mixed_%d", n);
        CUresult r = cu->api.cuModuleGetFunction(&cu->mvx[n - 1], cu->mod, name);
        if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, name);
        snprintf(name, sizeof name, "sil_mmvq_mixed_conv_%d", n);
        r = cu->api.cuModuleGetFunction(&cu->mvxc[n - 1], cu->mod, name);
        if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, name);
    }
    for (int i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "sil_router_norm_f32_topk_%d", i ? 256 << i : 128);
        CUresult r = cu->api.cuModuleGetFunction(&cu->router_norm[i], cu->mod, name);
        if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, name);
    }
    for (int n = 1; n <= SIL_CUDA_MAX_BATCH; n++) {
        snprintf(name, sizeof name, "sil_router_f32_topk_%d", n);
        CUresult r = cu->api.cuModuleGetFunction(&cu->router_fused[n - 1], cu->mod, name);
        if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, name);
    }
    for (int t = 0; t < MV_F32; t++) {
        snprintf(name, sizeof name, "sil_moe_gate_up_%s", mv_names[t]);
        CUresult r = cu->api.cuModuleGetFunction(&cu->moe_gate_up[t], cu->mod, name);
        if (r == CUDA_SUCCESS) {
            snprintf(name, sizeof name, "sil_moe_down_%s", mv_names[t]);
            r = cu->api.cuModuleGetFunction(&cu->moe_down[t], cu->mod, name);
        }
        if (r == CUDA_SUCCESS) {
            snprintf(name, sizeof name, "sil_moe_gate_up_sh_%s", mv_names[t]);
            r = cu->api.cuModuleGetFunction(&cu->moe_gate_up_sh[t], cu->mod, name);
        }
        if (r == CUDA_SUCCESS) {
            snprintf(name, sizeof name, "sil_moe_down_sh_%s", mv_names[t]);
            r = cu->api.cuModuleGetFunction(&cu->moe_down_sh[t], cu->mod, name);
        }
        if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, name);
    }
    for (int t = 0; t < MV_COUNT; t++)
        for (int v = 0; v < (t < MV_F32 ? 2 : 1); v++) {
            if (t < MV_F32)
                snprintf(name, sizeof name, "sil_mmq_%s_%s", mv_names[t], v ? "sm80" : "sm75");
            else
                snprintf(name, sizeof name, "sil_mmf_%s", mv_names[t]);
            CUfunction *f = t < MV_F32 ? &cu->mmq[t][v] : &cu->mmf[t - MV_F32];
            CUresult r = cu->api.cuModuleGetFunction(f, cu->mod, name);
            if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, name);
            if (t >= MV_F32) continue;
            snprintf(name, sizeof name, "sil_mmq_grp_%s_%s", mv_names[t], v ? "sm80" : "sm75");
            r = cu->api.cuModuleGetFunction(&cu->mmq_grp[t][v], cu->mod, name);
            if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, name);
        }
    for (int i = 0; i < K_COUNT; i++) {
        CUresult r = cu->api.cuModuleGetFunction(&cu->k[i], cu->mod, k_names[i]);
        if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, k_names[i]);
    }
    return 0;
}

static bool arch_in_fatbin(int major, int minor)
{
    char want[16];
    snprintf(want, sizeof want, "sm_%d%d", major, minor);
    const char *a = SIL_CUDA_ARCHS;
    for (const char *p = strstr(a, want); p; p = strstr(p + 1, want))
        if ((p == a || p[-1] == ' ') && (p[strlen(want)] == ' ' || p[strlen(want)] == 0))
            return true;
    return false;
}

int sil_cuda_init(struct sil_cuda **out, int ordinal, const struct sil_cuda_options *opt,
                  struct sil_error *err)
{
    static const struct sil_cuda_options defaults;
    if (!opt) opt = &defaults;
    *out = NULL;
    struct sil_cuda *cu = calloc(1, sizeof *cu);
    if (!cu) return set_err(err, -ENOMEM, "cuda: out of memory");
    int rc = load_api(&cu->api, opt->driver, err);
    if (rc < 0) {
        free(cu);
        return rc;
    }
    struct sil_cu_api *a = &cu->api;
    CUresult r = a->cuInit(0);
    int count = 0;
    if (r == CUDA_SUCCESS) r = a->cuDeviceGetCount(&count);
    if (r == CUDA_ERROR_NO_DEVICE || (r == CUDA_SUCCESS && count == 0)) {
        rc = set_err(err, -ENODEV, "cuda: no CUDA device (the driver sees none)");
        goto fail_lib;
    }
    if (r != CUDA_SUCCESS) {
        rc = cu_fail(a, err, r, "cuInit");
        goto fail_lib;
    }
    if (ordinal < 0 || ordinal >= count) {
        rc = set_err(err, -ENODEV, "cuda: no device %d (the driver sees %d)", ordinal, count);
        goto fail_lib;
    }
    struct sil_cuda_info *in = &cu->info;
    in->ordinal = ordinal;
#define STEP(call)                                                                                 \
    do {                                                                                           \
        r = a->call;                                                                               \
        if (r != CUDA_SUCCESS) {                                                                   \
            rc = cu_fail(a, err, r, #call);                                                        \
            goto fail_ctx;                                                                         \
        }                                                                                          \
    } while (0)
    STEP(cuDeviceGet(&cu->dev, ordinal));
    STEP(cuDriverGetVersion(&in->driver_version));
    STEP(cuDeviceGetName(in->name, (int)sizeof in->name, cu->dev));
    STEP(
        cuDeviceGetAttribute(&in->cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, cu->dev));
    STEP(
        cuDeviceGetAttribute(&in->cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, cu->dev));
    STEP(cuDeviceGetAttribute(&in->sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, cu->dev));
    STEP(cuDeviceTotalMem_v2(&in->total_mem, cu->dev));
    if (in->cc_major * 10 + in->cc_minor < 75) {
        rc = set_err(err, -ENOTSUP, "cuda: %s is sm_%d%d; the kernels need sm_75 or newer",
                     in->name, in->cc_major, in->cc_minor);
        goto fail_lib;
    }
    STEP(cuDevicePrimaryCtxRetain(&cu->ctx, cu->dev));
    STEP(cuCtxSetCurrent(cu->ctx));
    STEP(cuModuleLoadData(&cu->mod, sil_cuda_fatbin));
    const char *jit = getenv("CUDA_FORCE_PTX_JIT");
    in->ptx_jit =
        (jit && *jit && strcmp(jit, "0") != 0) || !arch_in_fatbin(in->cc_major, in->cc_minor);
    rc = load_functions(cu, err);
    if (rc < 0) goto fail_ctx;
    /* m16n8k32 is in the sm_80+ SASS only; the compute_75 PTX carries m8n8k16 in both entries */
    cu->mma_best = cu->mma_sm = in->cc_major >= 8 && !in->ptx_jit ? 80 : 75;
    /* programmatic dependent launch: the sm_90 SASS has the waits (pdl.cuh), the PTX not */
    in->pdl = in->cc_major >= 9 && !in->ptx_jit && cu->api.cuLaunchKernelEx && !opt->no_pdl;
    /* L2 prefetch before the PDL wait (pdl.cuh): only where launches overlap */
    in->l2_prefetch = in->pdl && !opt->no_prefetch;
    rc = set_prefetch_flag(cu, cu->mod, err);
    if (rc < 0) goto fail_ctx;
    cu->fail_at = opt->inject_oom;
    STEP(cuStreamCreate(&cu->stream, CU_STREAM_NON_BLOCKING));
#undef STEP
    *out = cu;
    return 0;

fail_ctx:
    if (cu->mod) a->cuModuleUnload(cu->mod);
    if (cu->ctx) a->cuDevicePrimaryCtxRelease_v2(cu->dev);
fail_lib:
    dlclose(a->lib);
    free(cu);
    return rc;
}

void sil_cuda_free(struct sil_cuda *cu)
{
    if (!cu) return;
    if (bind_ctx(cu, NULL) == 0) {
        for (int i = 0; i < 2; i++)
            if (cu->prof_ev[i]) cu->api.cuEventDestroy_v2(cu->prof_ev[i]);
        if (cu->stream) cu->api.cuStreamDestroy_v2(cu->stream);
        cu->api.cuModuleUnload(cu->mod);
    }
    cu->api.cuDevicePrimaryCtxRelease_v2(cu->dev);
    dlclose(cu->api.lib);
    free(cu);
}

const struct sil_cuda_info *sil_cuda_get_info(const struct sil_cuda *cu)
{
    return &cu->info;
}

int sil_cuda_mem_info(struct sil_cuda *cu, size_t *free_bytes, size_t *total_bytes,
                      struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CU_CHECK(cu, err, cuMemGetInfo_v2(free_bytes, total_bytes));
    return 0;
}

int sil_cuda_alloc(struct sil_cuda *cu, size_t bytes, sil_cuda_ptr *out, struct sil_error *err)
{
    *out = 0;
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CUdeviceptr p = 0;
    CUresult r = cu->api.cuMemAlloc_v2(&p, bytes ? bytes : 1);
    if (r != CUDA_SUCCESS) {
        struct sil_error e;
        const int code = cu_fail(&cu->api, &e, r, "cuMemAlloc");
        return set_err(err, code, "%.400s (%zu bytes)", e.msg, bytes);
    }
    *out = p;
    return 0;
}

void sil_cuda_release(struct sil_cuda *cu, sil_cuda_ptr p)
{
    if (p && bind_ctx(cu, NULL) == 0) cu->api.cuMemFree_v2(p);
}

int sil_cuda_memset(struct sil_cuda *cu, sil_cuda_ptr p, uint8_t value, size_t bytes,
                    struct sil_cuda_stream *s, struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CU_CHECK(cu, err, cuMemsetD8Async(p, value, bytes, stream_of(cu, s)));
    return 0;
}

int sil_cuda_upload(struct sil_cuda *cu, sil_cuda_ptr dst, const void *src, size_t bytes,
                    struct sil_cuda_stream *s, struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CU_CHECK(cu, err, cuMemcpyHtoDAsync_v2(dst, src, bytes, stream_of(cu, s)));
    return 0;
}

int sil_cuda_download(struct sil_cuda *cu, void *dst, sil_cuda_ptr src, size_t bytes,
                      struct sil_cuda_stream *s, struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CU_CHECK(cu, err, cuMemcpyDtoHAsync_v2(dst, src, bytes, stream_of(cu, s)));
    return 0;
}

int sil_cuda_copy_d2d(struct sil_cuda *cu, sil_cuda_ptr dst, sil_cuda_ptr src, size_t bytes,
                      struct sil_cuda_stream *s, struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CU_CHECK(cu, err, cuMemcpyDtoDAsync_v2(dst, src, bytes, stream_of(cu, s)));
    return 0;
}

int sil_cuda_host_alloc(struct sil_cuda *cu, size_t bytes, void **out, struct sil_error *err)
{
    *out = NULL;
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CU_CHECK(cu, err, cuMemHostAlloc(out, bytes ? bytes : 1, CU_MEMHOSTALLOC_PORTABLE));
    return 0;
}

void sil_cuda_host_release(struct sil_cuda *cu, void *p)
{
    if (p && bind_ctx(cu, NULL) == 0) cu->api.cuMemFreeHost(p);
}

int sil_cuda_host_register(struct sil_cuda *cu, void *p, size_t bytes, struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CU_CHECK(
        cu, err,
        cuMemHostRegister_v2(p, bytes,
                             CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP |
                                 CU_MEMHOSTREGISTER_READ_ONLY));
    return 0;
}

int sil_cuda_host_device_ptr(struct sil_cuda *cu, void *p, sil_cuda_ptr *out, struct sil_error *err)
{
    *out = 0;
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CUdeviceptr d = 0;
    CU_CHECK(cu, err, cuMemHostGetDevicePointer_v2(&d, p, 0));
    *out = (sil_cuda_ptr)d;
    return 0;
}

void sil_cuda_host_unregister(struct sil_cuda *cu, void *p)
{
    if (p && bind_ctx(cu, NULL) == 0) cu->api.cuMemHostUnregister(p);
}

int sil_cuda_stream_create(struct sil_cuda *cu, struct sil_cuda_stream **out, struct sil_error *err)
{
    *out = NULL;
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    struct sil_cuda_stream *s = calloc(1, sizeof *s);
    if (!s) return set_err(err, -ENOMEM, "cuda: out of memory");
    CUresult r = cu->api.cuStreamCreate(&s->s, CU_STREAM_NON_BLOCKING);
    if (r != CUDA_SUCCESS) {
        free(s);
        return cu_fail(&cu->api, err, r, "cuStreamCreate");
    }
    *out = s;
    return 0;
}

void sil_cuda_stream_destroy(struct sil_cuda *cu, struct sil_cuda_stream *s)
{
    if (!s) return;
    if (bind_ctx(cu, NULL) == 0) cu->api.cuStreamDestroy_v2(s->s);
    free(s);
}

int sil_cuda_sync(struct sil_cuda *cu, struct sil_cuda_stream *s, struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CU_CHECK(cu, err, cuStreamSynchronize(stream_of(cu, s)));
    return 0;
}

int sil_cuda_event_create(struct sil_cuda *cu, struct sil_cuda_event **out, struct sil_error *err)
{
    *out = NULL;
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    struct sil_cuda_event *e = calloc(1, sizeof *e);
    if (!e) return set_err(err, -ENOMEM, "cuda: out of memory");
    CUresult r = cu->api.cuEventCreate(&e->e, CU_EVENT_DEFAULT);
    if (r != CUDA_SUCCESS) {
        free(e);
        return cu_fail(&cu->api, err, r, "cuEventCreate");
    }
    *out = e;
    return 0;
}

void sil_cuda_event_destroy(struct sil_cuda *cu, struct sil_cuda_event *e)
{
    if (!e) return;
    if (bind_ctx(cu, NULL) == 0) cu->api.cuEventDestroy_v2(e->e);
    free(e);
}

int sil_cuda_event_record(struct sil_cuda *cu, struct sil_cuda_event *e, struct sil_cuda_stream *s,
                          struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CU_CHECK(cu, err, cuEventRecord(e->e, stream_of(cu, s)));
    return 0;
}

int sil_cuda_event_elapsed(struct sil_cuda *cu, struct sil_cuda_event *start,
                           struct sil_cuda_event *end, float *ms, struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CU_CHECK(cu, err, cuEventSynchronize(end->e));
    CU_CHECK(cu, err, cuEventElapsedTime(ms, start->e, end->e));
    return 0;
}

/* ---- weights ------------------------------------------------------------------------------- */

static int mv_slot(int type)
{
    for (int t = 0; t < MV_COUNT; t++)
        if (mv_types[t] == type) return t;
    return -1;
}

bool sil_cuda_type_supported(int type)
{
    return mv_slot(type) >= 0;
}

int sil_cuda_weight_view(int type, int64_t rows, int64_t cols, sil_cuda_ptr data,
                         struct sil_cuda_weight *out, struct sil_error *err)
{
    memset(out, 0, sizeof *out);
    if (!sil_cuda_type_supported(type))
        return set_err(err, -ENOTSUP, "cuda: weight type %s has no CUDA kernel",
                       sil_type_name(type));
    const size_t row_bytes = sil_row_size(type, cols);
    if (rows <= 0 || rows > INT32_MAX || cols <= 0 || row_bytes == 0)
        return set_err(err, -EINVAL, "cuda: weight of %lld x %lld %s: bad shape", (long long)rows,
                       (long long)cols, sil_type_name(type));
    if ((uint64_t)rows > SIZE_MAX / row_bytes)
        return set_err(err, -EOVERFLOW, "cuda: weight of %lld rows of %zu bytes overflows",
                       (long long)rows, row_bytes);
    if (data % 16 != 0)
        return set_err(err, -EINVAL, "cuda: weight data at 0x%llx is not 16-byte aligned",
                       (unsigned long long)data);
    *out = (struct sil_cuda_weight){.type = type,
                                    .rows = rows,
                                    .cols = cols,
                                    .row_bytes = row_bytes,
                                    .bytes = (size_t)rows * row_bytes,
                                    .data = data};
    return 0;
}

int sil_cuda_weight_upload(struct sil_cuda *cu, int type, int64_t rows, int64_t cols,
                           const void *src, size_t bytes, struct sil_cuda_weight *out,
                           struct sil_error *err)
{
    int rc = sil_cuda_weight_view(type, rows, cols, 0, out, err);
    if (rc < 0) return rc;
    if (bytes != out->bytes)
        return set_err(err, -EINVAL, "cuda: weight of %lld x %lld %s is %zu bytes, given %zu",
                       (long long)rows, (long long)cols, sil_type_name(type), out->bytes, bytes);
    rc = sil_cuda_alloc(cu, out->bytes, &out->data, err);
    if (rc < 0) return rc;
    rc = sil_cuda_upload(cu, out->data, src, bytes, NULL, err);
    if (rc == 0) rc = sil_cuda_sync(cu, NULL, err);
    if (rc < 0) {
        sil_cuda_release(cu, out->data);
        out->data = 0;
        return rc;
    }
    out->owned = true;
    return 0;
}

void sil_cuda_weight_free(struct sil_cuda *cu, struct sil_cuda_weight *w)
{
    if (w->owned) sil_cuda_release(cu, w->data);
    memset(w, 0, sizeof *w);
}

/* ---- ops ----------------------------------------------------------------------------------- */

/* Every kernel launch of this file and of further modules. Profiling times each one between
 * two events on its stream and waits for it: figures for a table, not for speed. */
static int cu_launch(struct sil_cuda *cu, CUfunction f, const char *what, unsigned gx, unsigned gy,
                     unsigned gz, unsigned block, struct sil_cuda_stream *s, void **params,
                     struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    const CUstream st = stream_of(cu, s);
    const uint64_t bytes = cu->prof_bytes;
    cu->prof_bytes = 0;
    if (cu->fail_at && ++cu->n_launch == cu->fail_at)
        return set_err(err, -ENOMEM,
                       "cuda: %s: out of memory (injected at launch %llu by SIL_CUDA_INJECT_OOM)",
                       what, (unsigned long long)cu->fail_at);
    if (cu->prof) CU_CHECK(cu, err, cuEventRecord(cu->prof_ev[0], st));
    CUresult r;
    if (cu->info.pdl && !cu->prof) {
        /* the next kernel may start while this one runs; each waits at SIL_PDL_ENTRY */
        CUlaunchAttribute at;
        memset(&at, 0, sizeof at);
        at.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        at.value.allowed = 1;
        const CUlaunchConfig c = {gx, gy, gz, block, 1, 1, 0, st, &at, 1};
        r = cu->api.cuLaunchKernelEx(&c, f, params, NULL);
    } else {
        r = cu->api.cuLaunchKernel(f, gx, gy, gz, block, 1, 1, 0, st, params, NULL);
    }
    if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, what);
    if (!cu->prof) return 0;
    float ms = 0.0f;
    CU_CHECK(cu, err, cuEventRecord(cu->prof_ev[1], st));
    CU_CHECK(cu, err, cuEventSynchronize(cu->prof_ev[1]));
    CU_CHECK(cu, err, cuEventElapsedTime(&ms, cu->prof_ev[0], cu->prof_ev[1]));
    int i = 0;
    while (i < cu->prof_n && strcmp(cu->prof_tab[i].name, what) != 0)
        i++;
    if (i == cu->prof_n) {
        if (i == SIL_CUDA_PROF_MAX) return 0;
        cu->prof_n++;
        memset(&cu->prof_tab[i], 0, sizeof cu->prof_tab[i]);
        snprintf(cu->prof_tab[i].name, sizeof cu->prof_tab[i].name, "%s", what);
    }
    cu->prof_tab[i].calls++;
    cu->prof_tab[i].ms += ms;
    cu->prof_tab[i].bytes += bytes;
    return 0;
}

static int launch(struct sil_cuda *cu, CUfunction f, const char *what, unsigned gx, unsigned gy,
                  unsigned block, struct sil_cuda_stream *s, void **params, struct sil_error *err)
{
    return cu_launch(cu, f, what, gx, gy, 1, block, s, params, err);
}

int sil_cuda_profile(struct sil_cuda *cu, bool on, struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    if (on && !cu->prof_ev[0]) {
        for (int i = 0; i < 2; i++)
            CU_CHECK(cu, err, cuEventCreate(&cu->prof_ev[i], CU_EVENT_DEFAULT));
    }
    cu->prof = on;
    cu->prof_n = 0;
    return 0;
}

int sil_cuda_profile_get(const struct sil_cuda *cu, const struct sil_cuda_prof **tab)
{
    *tab = cu->prof_tab;
    return cu->prof_n;
}

/* ---- graphs -------------------------------------------------------------------------------- */

struct sil_cuda_graph {
    CUgraphExec exec;
};

int sil_cuda_capture_begin(struct sil_cuda *cu, struct sil_cuda_stream *s, struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    if (cu->prof) return set_err(err, -EBUSY, "cuda: no graph capture while profiling");
    CU_CHECK(cu, err,
             cuStreamBeginCapture_v2(stream_of(cu, s), CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    return 0;
}

int sil_cuda_capture_end(struct sil_cuda *cu, struct sil_cuda_stream *s,
                         struct sil_cuda_graph **out, struct sil_error *err)
{
    *out = NULL;
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CUgraph g = NULL;
    CUresult r = cu->api.cuStreamEndCapture(stream_of(cu, s), &g);
    /* out == NULL: the caller abandons a capture that failed part way */
    if (r != CUDA_SUCCESS || !g) {
        if (g) cu->api.cuGraphDestroy(g);
        return r != CUDA_SUCCESS ? cu_fail(&cu->api, err, r, "cuStreamEndCapture")
                                 : set_err(err, -EIO, "cuda: the capture made no graph");
    }
    struct sil_cuda_graph *cg = calloc(1, sizeof *cg);
    if (!cg) {
        cu->api.cuGraphDestroy(g);
        return set_err(err, -ENOMEM, "cuda: out of memory");
    }
    r = cu->api.cuGraphInstantiateWithFlags(&cg->exec, g, 0);
    cu->api.cuGraphDestroy(g);
    if (r != CUDA_SUCCESS) {
        free(cg);
        return cu_fail(&cu->api, err, r, "cuGraphInstantiateWithFlags");
    }
    *out = cg;
    return 0;
}

int sil_cuda_graph_launch(struct sil_cuda *cu, struct sil_cuda_graph *g, struct sil_cuda_stream *s,
                          struct sil_error *err)
{
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    CU_CHECK(cu, err, cuGraphLaunch(g->exec, stream_of(cu, s)));
    return 0;
}

void sil_cuda_graph_destroy(struct sil_cuda *cu, struct sil_cuda_graph *g)
{
    if (!g) return;
    if (bind_ctx(cu, NULL) == 0) cu->api.cuGraphExecDestroy(g->exec);
    free(g);
}

/* Grid dimension x is limited to 2^31 - 1 blocks. */
static int grid_of(int64_t items, int64_t per_block, unsigned *g, struct sil_error *err)
{
    const int64_t n = (items + per_block - 1) / per_block;
    if (n <= 0 || n > INT32_MAX)
        return set_err(err, -EINVAL, "cuda: %lld work items out of range", (long long)items);
    *g = (unsigned)n;
    return 0;
}

size_t sil_cuda_q8_bytes(int64_t n, int64_t k)
{
    return (size_t)(n * (k / SIL_CUDA_Q8_BLOCK)) * SIL_CUDA_Q8_BLOCK_BYTES;
}

int sil_cuda_quantize_q8(struct sil_cuda *cu, sil_cuda_ptr x, int64_t n, int64_t k, sil_cuda_ptr q8,
                         struct sil_cuda_stream *s, struct sil_error *err)
{
    if (n <= 0 || k <= 0 || k % SIL_CUDA_Q8_BLOCK != 0)
        return set_err(err, -EINVAL, "cuda: quantize of %lld x %lld: k must be a multiple of 32",
                       (long long)n, (long long)k);
    int64_t nblocks = n * k / SIL_CUDA_Q8_BLOCK;
    unsigned g = 0;
    int rc = grid_of(nblocks, 8, &g, err);
    if (rc < 0) return rc;
    void *p[] = {&x, &nblocks, &q8};
    return launch(cu, cu->k[K_QUANTIZE], "quantize_q8_1", g, 1, 256, s, p, err);
}

/* The float matvec reads 8 columns at a time when rows and input are 16-byte aligned. */
static int mmvf_vec(const struct sil_cuda_weight *w, sil_cuda_ptr x)
{
    return w->cols % 8 == 0 && w->row_bytes % 16 == 0 && w->data % 16 == 0 && x % 16 == 0;
}

int sil_cuda_matvec(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr x,
                    sil_cuda_ptr q8, int n, sil_cuda_ptr y, int64_t ldy, struct sil_cuda_stream *s,
                    struct sil_error *err)
{
    const int slot = mv_slot(w->type);
    if (slot < 0 || !w->data)
        return set_err(err, -EINVAL, "cuda: matvec on an empty or unsupported weight");
    if (n < 1 || n > SIL_CUDA_MAX_BATCH || ldy < w->rows)
        return set_err(err, -EINVAL, "cuda: matvec batch %d (1..%d), ldy %lld < rows %lld", n,
                       SIL_CUDA_MAX_BATCH, (long long)ldy, (long long)w->rows);
    /* 4 warps a block; the quantized kernels take 2 rows a warp from batch 2 on (mmvq.cuh) */
    unsigned g = 0;
    int rc = grid_of(w->rows, slot < MV_F32 && n >= 2 ? 8 : 4, &g, err);
    if (rc < 0) return rc;
    uint64_t row_bytes = w->row_bytes;
    int rows = (int)w->rows;
    if (slot >= MV_F32) {
        if (!x)
            return set_err(err, -EINVAL, "cuda: matvec on %s needs the F32 input",
                           sil_type_name(w->type));
        int64_t cols = w->cols;
        int vec = mmvf_vec(w, x);
        void *p[] = {(void *)&w->data, &row_bytes, &rows, &cols, &vec, &x, &y, &ldy};
        cu->prof_bytes = w->bytes;
        return launch(cu, cu->mv[slot][n - 1], cu->what[W_MATVEC][slot], g, 1, 128, s, p, err);
    }
    if (!q8)
        return set_err(err, -EINVAL, "cuda: matvec on %s needs the q8 input",
                       sil_type_name(w->type));
    int units = (int)(w->cols / SIL_CUDA_Q8_BLOCK);
    void *p[] = {(void *)&w->data, &row_bytes, &rows, &units, &q8, &y, &ldy};
    cu->prof_bytes = w->bytes;
    return launch(cu, cu->mv[slot][n - 1], cu->what[W_MATVEC][slot], g, 1, 128, s, p, err);
}

/* The kernel's struct sil_mv_set (mmvq.cuh), field for field. */
struct mv_set {
    uint64_t w[SIL_CUDA_MV_SET_MAX];
    uint64_t row_bytes[SIL_CUDA_MV_SET_MAX];
    int32_t rows[SIL_CUDA_MV_SET_MAX];
    uint64_t y[SIL_CUDA_MV_SET_MAX];
    int64_t ldy[SIL_CUDA_MV_SET_MAX];
    int32_t blk0[SIL_CUDA_MV_SET_MAX + 1];
    int32_t n;
    int32_t type[SIL_CUDA_MV_SET_MAX]; /* the weights' slots (sil_cuda_wt), for mixed sets */
};

bool sil_cuda_mv_mixable(int type)
{
    return type == SIL_TYPE_Q4_K || type == SIL_TYPE_Q5_K || type == SIL_TYPE_Q6_K ||
           type == SIL_TYPE_Q8_0;
}

/* The kernel's struct sil_conv_ep (mmvq.cuh), field for field. */
struct conv_ep {
    uint64_t out;
    int64_t ldo;
    uint64_t w;
    uint64_t run_seq;
    uint64_t seq_state;
    int64_t cd;
    int64_t offset;
    int32_t K;
    int32_t pad;
};

static int matvec_set(struct sil_cuda *cu, const struct sil_cuda_weight *const *w, int nw,
                      sil_cuda_ptr q8, int n, const sil_cuda_ptr *y, const int64_t *ldy,
                      const struct sil_cuda_conv_ep *ep, struct sil_cuda_stream *s,
                      struct sil_error *err)
{
    if (nw < 1 || nw > SIL_CUDA_MV_SET_MAX || n < 1 || n > SIL_CUDA_MAX_BATCH || !q8)
        return set_err(err, -EINVAL, "cuda: matvec of %d weights, batch %d", nw, n);
    const int slot = mv_slot(w[0]->type);
    if (slot < 0 || slot >= MV_F32)
        return set_err(err, -EINVAL, "cuda: a matvec set needs quantized weights");
    bool mixed = false, mixable = true;
    for (int k = 0; k < nw; k++) {
        mixed = mixed || w[k]->type != w[0]->type;
        mixable = mixable && sil_cuda_mv_mixable(w[k]->type);
    }
    if (mixed && !mixable)
        return set_err(err, -EINVAL, "cuda: a matvec set mixes types other than q4_K, q5_K, "
                                     "q6_K and q8_0");
    struct mv_set set;
    memset(&set, 0, sizeof set);
    const int per_block = n >= 2 ? 8 : 4;
    int64_t blocks = 0;
    for (int k = 0; k < nw; k++) {
        if (w[k]->cols != w[0]->cols || !w[k]->data || ldy[k] < w[k]->rows)
            return set_err(err, -EINVAL, "cuda: a matvec set of mixed widths");
        set.type[k] = mv_slot(w[k]->type);
        set.w[k] = w[k]->data;
        set.row_bytes[k] = w[k]->row_bytes;
        set.rows[k] = (int32_t)w[k]->rows;
        set.y[k] = y[k];
        set.ldy[k] = ldy[k];
        set.blk0[k] = (int32_t)blocks;
        blocks += (w[k]->rows + per_block - 1) / per_block;
        cu->prof_bytes += w[k]->bytes;
    }
    set.blk0[nw] = (int32_t)blocks;
    set.n = nw;
    if (blocks > INT32_MAX) return set_err(err, -EINVAL, "cuda: matvec set too large");
    int units = (int)(w[0]->cols / SIL_CUDA_Q8_BLOCK);
    if (ep) {
        if (!mixable || ep->K < 1 || ep->K > 9 || !ep->out || !ep->w || !ep->run_seq ||
            !ep->seq_state || ep->ldo < w[0]->rows)
            return set_err(err, -EINVAL, "cuda: a matvec set with the conv1d epilogue");
        struct conv_ep e = {ep->out,     ep->ldo,    ep->w,     ep->run_seq, ep->seq_state,
                            w[0]->rows, ep->offset, ep->K,     0};
        void *pc[] = {&set, &units, &q8, &e};
        return launch(cu, cu->mvxc[n - 1], "matvec set mixed + conv1d", (unsigned)blocks, 1, 128,
                      s, pc, err);
    }
    void *p[] = {&set, &units, &q8};
    if (mixed)
        return launch(cu, cu->mvx[n - 1], "matvec set mixed", (unsigned)blocks, 1, 128, s, p,
                      err);
    return launch(cu, cu->mvm[slot][n - 1], cu->what[W_MATVEC][slot], (unsigned)blocks, 1, 128, s,
                  p, err);
}

int sil_cuda_matvec_multi(struct sil_cuda *cu, const struct sil_cuda_weight *const *w, int nw,
                          sil_cuda_ptr q8, int n, const sil_cuda_ptr *y, const int64_t *ldy,
                          struct sil_cuda_stream *s, struct sil_error *err)
{
    return matvec_set(cu, w, nw, q8, n, y, ldy, NULL, s, err);
}

int sil_cuda_matvec_multi_conv(struct sil_cuda *cu, const struct sil_cuda_weight *const *w,
                               int nw, sil_cuda_ptr q8, int n, const sil_cuda_ptr *y,
                               const int64_t *ldy, const struct sil_cuda_conv_ep *ep,
                               struct sil_cuda_stream *s, struct sil_error *err)
{
    if (!ep) return set_err(err, -EINVAL, "cuda: a conv1d epilogue without its arguments");
    return matvec_set(cu, w, nw, q8, n, y, ldy, ep, s, err);
}

int sil_cuda_set_mma(struct sil_cuda *cu, int sm, struct sil_error *err)
{
    if (sm == 0) sm = cu->mma_best;
    if (sm != 75 && sm != 80)
        return set_err(err, -EINVAL, "cuda: mma path sm_%d: 75, 80 or 0 (the best)", sm);
    if (sm > cu->mma_best)
        return set_err(err, -ENOTSUP, "cuda: mma path sm_%d needs sm_80+ SASS (%s, sm_%d%d)", sm,
                       cu->info.ptx_jit ? "PTX through the JIT" : "SASS", cu->info.cc_major,
                       cu->info.cc_minor);
    cu->mma_sm = sm;
    return 0;
}

int sil_cuda_get_mma(const struct sil_cuda *cu)
{
    return cu->mma_sm;
}

int sil_cuda_matmul(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr x,
                    sil_cuda_ptr q8, int n, sil_cuda_ptr y, int64_t ldy, struct sil_cuda_stream *s,
                    struct sil_error *err)
{
    const int slot = mv_slot(w->type);
    if (slot < 0 || !w->data)
        return set_err(err, -EINVAL, "cuda: matmul on an empty or unsupported weight");
    /* grid y counts tiles of 64 activation rows and is limited to 65535 */
    if (n < 1 || n > 65535 * 64 || ldy < w->rows)
        return set_err(err, -EINVAL, "cuda: matmul of %d rows (1..%d), ldy %lld < rows %lld", n,
                       65535 * 64, (long long)ldy, (long long)w->rows);
    const unsigned gx = (unsigned)((w->rows + 63) / 64), gy = (unsigned)((n + 63) / 64);
    uint64_t row_bytes = w->row_bytes;
    int rows = (int)w->rows;
    if (slot >= MV_F32) {
        if (!x)
            return set_err(err, -EINVAL, "cuda: matmul on %s needs the F32 input",
                           sil_type_name(w->type));
        int64_t cols = w->cols;
        void *p[] = {(void *)&w->data, &row_bytes, &rows, &cols, &x, &n, &y, &ldy};
        cu->prof_bytes = w->bytes;
        return cu_launch(cu, cu->mmf[slot - MV_F32], cu->what[W_MATMUL][slot], gx, gy, 1, 256, s, p,
                         err);
    } else {
        if (!q8)
            return set_err(err, -EINVAL, "cuda: matmul on %s needs the q8 input",
                           sil_type_name(w->type));
        int units = (int)(w->cols / SIL_CUDA_Q8_BLOCK);
        void *p[] = {(void *)&w->data, &row_bytes, &rows, &units, &q8, &n, &y, &ldy};
        cu->prof_bytes = w->bytes;
        return cu_launch(cu, cu->mmq[slot][cu->mma_sm >= 80], cu->what[W_MATMUL][slot], gx, gy, 1,
                         128, s, p, err);
    }
}

int sil_cuda_matmul_grouped(struct sil_cuda *cu, const struct sil_cuda_weight *w, size_t mat_bytes,
                            sil_cuda_ptr q8, int a_rows, sil_cuda_ptr grp_mat,
                            sil_cuda_ptr grp_start, int n_groups, int max_rows, sil_cuda_ptr y,
                            int64_t ldy, struct sil_cuda_stream *s, struct sil_error *err)
{
    const int slot = mv_slot(w->type);
    if (slot < 0 || slot >= MV_F32 || !w->data || !q8)
        return set_err(err, -EINVAL, "cuda: grouped matmul needs a quantized weight and q8 input");
    if (n_groups < 1 || n_groups > 65535 || max_rows < 1 || max_rows > 65535 * 64 ||
        max_rows > a_rows || ldy < w->rows || mat_bytes < w->bytes)
        return set_err(err, -EINVAL, "cuda: grouped matmul of %d groups, %d of %d rows", n_groups,
                       max_rows, a_rows);
    const unsigned gx = (unsigned)((w->rows + 63) / 64), gy = (unsigned)((max_rows + 63) / 64);
    uint64_t row_bytes = w->row_bytes, mb = mat_bytes;
    int rows = (int)w->rows, units = (int)(w->cols / SIL_CUDA_Q8_BLOCK);
    void *p[] = {(void *)&w->data, &mb,      &row_bytes, &rows, &units, &q8,
                 &a_rows,          &grp_mat, &grp_start, &y,    &ldy};
    cu->prof_bytes = w->bytes * (uint64_t)n_groups;
    return cu_launch(cu, cu->mmq_grp[slot][cu->mma_sm >= 80], cu->what[W_MATMUL][slot], gx, gy,
                     (unsigned)n_groups, 128, s, p, err);
}

int sil_cuda_rmsnorm(struct sil_cuda *cu, sil_cuda_ptr y, sil_cuda_ptr x, sil_cuda_ptr w,
                     int64_t rows, int64_t n, float eps, struct sil_cuda_stream *s,
                     struct sil_error *err)
{
    if (rows <= 0 || rows > INT32_MAX || n <= 0)
        return set_err(err, -EINVAL, "cuda: rmsnorm of %lld x %lld", (long long)rows, (long long)n);
    void *p[] = {&y, &x, &w, &n, &eps};
    return launch(cu, cu->k[K_RMSNORM], "rmsnorm", (unsigned)rows, 1, 256, s, p, err);
}

int sil_cuda_add(struct sil_cuda *cu, sil_cuda_ptr y, sil_cuda_ptr x, int64_t n,
                 struct sil_cuda_stream *s, struct sil_error *err)
{
    unsigned g = 0;
    int rc = grid_of(n, 256, &g, err);
    if (rc < 0) return rc;
    void *p[] = {&y, &x, &n};
    return launch(cu, cu->k[K_ADD], "add", g, 1, 256, s, p, err);
}

int sil_cuda_swiglu(struct sil_cuda *cu, sil_cuda_ptr out, sil_cuda_ptr gate, sil_cuda_ptr up,
                    int64_t n, struct sil_cuda_stream *s, struct sil_error *err)
{
    unsigned g = 0;
    int rc = grid_of(n, 256, &g, err);
    if (rc < 0) return rc;
    void *p[] = {&out, &gate, &up, &n};
    return launch(cu, cu->k[K_SWIGLU], "swiglu", g, 1, 256, s, p, err);
}

int sil_cuda_rope_neox(struct sil_cuda *cu, sil_cuda_ptr x, int n_tok, int n_head, int head_dim,
                       int n_rot, sil_cuda_ptr pos, float freq_base, struct sil_cuda_stream *s,
                       struct sil_error *err)
{
    if (n_tok <= 0 || n_tok > 65535 || n_head <= 0 || n_rot <= 0 || n_rot % 2 || n_rot > head_dim)
        return set_err(err, -EINVAL, "cuda: rope of %d tokens, %d heads, n_rot %d of %d", n_tok,
                       n_head, n_rot, head_dim);
    /* The same powf as the CPU backend, so both build the same angles. */
    float theta_scale = powf(freq_base, -2.0f / (float)n_rot);
    int half = n_rot / 2;
    void *p[] = {&x, &n_head, &head_dim, &n_rot, &pos, &theta_scale};
    return launch(cu, cu->k[K_ROPE], "rope_neox", (unsigned)n_head, (unsigned)n_tok,
                  half < 128 ? (unsigned)((half + 31) / 32 * 32) : 128u, s, p, err);
}

int sil_cuda_router_topk(struct sil_cuda *cu, sil_cuda_ptr logits, int n_tok, int n_expert, int k,
                         sil_cuda_ptr ids, sil_cuda_ptr weights, struct sil_cuda_stream *s,
                         struct sil_error *err)
{
    if (n_tok <= 0 || n_expert <= 0 || n_expert > 1024 || k <= 0 || k > 32 || k > n_expert)
        return set_err(err, -EINVAL, "cuda: router of %d tokens, %d experts, top %d", n_tok,
                       n_expert, k);
    void *p[] = {&logits, &n_tok, &n_expert, &k, &ids, &weights};
    return launch(cu, cu->k[K_ROUTER], "router_topk", (unsigned)((n_tok + 3) / 4), 1, 128, s, p,
                  err);
}

int sil_cuda_router_fused(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr x,
                          int n_tok, sil_cuda_ptr logits, int k, sil_cuda_ptr ids,
                          sil_cuda_ptr weights, sil_cuda_ptr done, struct sil_cuda_stream *s,
                          struct sil_error *err)
{
    if (w->type != SIL_TYPE_F32 || !w->data || !x || !done || w->rows <= 0 || w->rows > 1024 ||
        n_tok < 1 || n_tok > SIL_CUDA_MAX_BATCH || k <= 0 || k > 32 || k > w->rows)
        return set_err(err, -EINVAL, "cuda: fused router of %d tokens, %lld %s experts, top %d",
                       n_tok, (long long)w->rows, sil_type_name(w->type), k);
    unsigned g = 0;
    int rc = grid_of(w->rows, 4, &g, err);
    if (rc < 0) return rc;
    uint64_t row_bytes = w->row_bytes;
    int rows = (int)w->rows;
    int64_t cols = w->cols;
    int vec = mmvf_vec(w, x);
    void *p[] = {(void *)&w->data, &row_bytes, &rows, &cols, &vec, &x,
                 &logits,          &k,         &ids,  &weights, &done};
    cu->prof_bytes = w->bytes;
    return launch(cu, cu->router_fused[n_tok - 1], "router f32 + top-k", g, 1, 128, s, p, err);
}

int sil_cuda_router_norm(struct sil_cuda *cu, const struct sil_cuda_weight *w, sil_cuda_ptr d,
                         const struct sil_cuda_norm_in *nt, sil_cuda_ptr logits, int k,
                         sil_cuda_ptr ids, sil_cuda_ptr weights, struct sil_cuda_stream *s,
                         struct sil_error *err)
{
    if (w->type != SIL_TYPE_F32 || !w->data || !d || !nt || !nt->x || !nt->w || !nt->y ||
        !nt->q8 || !nt->done || w->rows <= 0 || w->rows > 1024 || k <= 0 || k > 32 ||
        k > w->rows || !sil_cuda_router_norm_ok(w->cols))
        return set_err(err, -EINVAL, "cuda: router with its norm, %lld x %lld %s, top %d",
                       (long long)w->rows, (long long)w->cols, sil_type_name(w->type), k);
    const int threads = sil_cuda_rmsnorm_threads(w->cols);
    const int ti = threads == 128 ? 0 : threads == 512 ? 1 : 2;
    unsigned g = 0;
    int rc = grid_of(w->rows, 4, &g, err);
    if (rc < 0) return rc;
    uint64_t row_bytes = w->row_bytes;
    int rows = (int)w->rows;
    int64_t cols = w->cols;
    int vec = mmvf_vec(w, nt->y);
    float eps = nt->eps;
    void *p[] = {(void *)&w->data, &row_bytes, &rows,          &cols,   &vec,
                 (void *)&nt->x,   &d,         (void *)&nt->w, &eps,    (void *)&nt->y,
                 (void *)&nt->q8,  &logits,    &k,             &ids,    &weights,
                 (void *)&nt->done};
    cu->prof_bytes = w->bytes;
    return launch(cu, cu->router_norm[ti], "add + rmsnorm + router + top-k", g, 1,
                  (unsigned)threads, s, p, err);
}

int sil_cuda_argmax(struct sil_cuda *cu, sil_cuda_ptr x, int rows, int64_t n, sil_cuda_ptr out,
                    sil_cuda_ptr scratch, struct sil_cuda_stream *s, struct sil_error *err)
{
    if (rows <= 0 || n <= 0 || n > INT32_MAX || rows > 65535 || !scratch)
        return set_err(err, -EINVAL, "cuda: argmax of %d x %lld", rows, (long long)n);
    /* blocks of a row: enough for 4 loads of each thread in flight, at most the scratch's */
    int64_t nb = (n + 4 * 256 - 1) / (4 * 256);
    if (nb > SIL_CUDA_ARGMAX_BLOCKS) nb = SIL_CUDA_ARGMAX_BLOCKS;
    void *p[] = {&x, &n, &out, &scratch};
    return launch(cu, cu->k[K_ARGMAX], "argmax", (unsigned)nb, (unsigned)rows, 256, s, p, err);
}

/* The in-place fields of a MoE weight (and its partner, gate with up) are whole: the table, host
 * memory, its stride and the slot count, when a table or host memory is given. */
static bool moe_host_ok(const struct sil_cuda_weight *w, const struct sil_cuda_weight *w2)
{
    return !(w->tab || w->host) ||
           (w->host && w->tab && (!w2 || (w2->host && w2->tab)) && w->n_slot > 0 &&
            w->host_stride > 0);
}

int sil_cuda_moe_gate_up(struct sil_cuda *cu, const struct sil_cuda_weight *gate,
                         const struct sil_cuda_weight *up, int n_expert, sil_cuda_ptr q8, int n_tok,
                         sil_cuda_ptr ids, int k, sil_cuda_ptr h, sil_cuda_ptr h8,
                         sil_cuda_ptr done, struct sil_cuda_stream *s, struct sil_error *err)
{
    const int slot = mv_slot(gate->type);
    if (slot < 0 || slot >= MV_F32 || up->type != gate->type || !gate->data || !up->data)
        return set_err(err, -ENOTSUP, "cuda: moe gate/up of %s and %s: needs one quantized type",
                       sil_type_name(gate->type), sil_type_name(up->type));
    if (n_expert <= 0 || gate->rows % n_expert || up->rows != gate->rows ||
        up->cols != gate->cols || n_tok <= 0 || k <= 0 || (int64_t)n_tok * k > 65535)
        return set_err(err, -EINVAL, "cuda: moe gate/up of %lld rows over %d experts, %d x %d",
                       (long long)gate->rows, n_expert, n_tok, k);
    int n_ff = (int)(gate->rows / n_expert), units = (int)(gate->cols / SIL_CUDA_Q8_BLOCK);
    int64_t nblocks = (int64_t)n_tok * units;
    uint64_t row_bytes = gate->row_bytes;
    uint64_t stride = gate->mat_stride ? gate->mat_stride : (uint64_t)n_ff * row_bytes;
    if (!moe_host_ok(gate, up))
        return set_err(err, -EINVAL,
                       "cuda: moe slots read in place without a slot table or host memory");
    uint64_t hstride = gate->host_stride;
    int nslot = gate->n_slot;
    if (done && (n_ff % 32 != 0 || !h8))
        return set_err(err, -EINVAL, "cuda: moe gate/up q8 of h needs n_ff %% 32 == 0 (%d)", n_ff);
    int64_t h8_blocks = done ? (int64_t)n_tok * k * n_ff / 32 : 0;
    void *p[] = {(void *)&gate->data,
                 (void *)&up->data,
                 &row_bytes,
                 &stride,
                 (void *)&gate->host,
                 (void *)&up->host,
                 &hstride,
                 (void *)&gate->tab,
                 &nslot,
                 &n_ff,
                 &units,
                 &n_expert,
                 &q8,
                 &nblocks,
                 &ids,
                 &k,
                 &h,
                 &h8,
                 &h8_blocks,
                 &done};
    /* bytes: k experts a token at most (fewer when tokens share one) */
    cu->prof_bytes = (uint64_t)n_tok * (uint64_t)k * 2 * (uint64_t)n_ff * row_bytes;
    return launch(cu, cu->moe_gate_up[slot], cu->what[W_GATE_UP][slot], (unsigned)((n_ff + 3) / 4),
                  (unsigned)(n_tok * k), 128, s, p, err);
}

int sil_cuda_moe_down(struct sil_cuda *cu, const struct sil_cuda_weight *down, int n_expert,
                      sil_cuda_ptr q8h, int n_tok, sil_cuda_ptr ids, sil_cuda_ptr weights, int k,
                      sil_cuda_ptr y, struct sil_cuda_stream *s, struct sil_error *err)
{
    const int slot = mv_slot(down->type);
    if (slot < 0 || slot >= MV_F32 || !down->data)
        return set_err(err, -ENOTSUP, "cuda: moe down of %s: needs a quantized type",
                       sil_type_name(down->type));
    if (n_expert <= 0 || down->rows % n_expert || n_tok <= 0 || n_tok > 65535 || k <= 0 ||
        k > SIL_CUDA_MOE_SLOTS_MAX || (int64_t)n_tok * k > 65535)
        return set_err(err, -EINVAL, "cuda: moe down of %lld rows over %d experts, %d x %d",
                       (long long)down->rows, n_expert, n_tok, k);
    int n_embd = (int)(down->rows / n_expert), units = (int)(down->cols / SIL_CUDA_Q8_BLOCK);
    int64_t nblocks = (int64_t)n_tok * k * units;
    uint64_t row_bytes = down->row_bytes;
    uint64_t stride = down->mat_stride ? down->mat_stride : (uint64_t)n_embd * row_bytes;
    if (!moe_host_ok(down, NULL))
        return set_err(err, -EINVAL,
                       "cuda: moe slots read in place without a slot table or host memory");
    uint64_t hstride = down->host_stride;
    int nslot = down->n_slot;
    void *p[] = {(void *)&down->data,
                 &row_bytes,
                 &stride,
                 (void *)&down->host,
                 &hstride,
                 (void *)&down->tab,
                 &nslot,
                 &n_embd,
                 &units,
                 &n_expert,
                 &q8h,
                 &nblocks,
                 &ids,
                 &weights,
                 &k,
                 &y};
    cu->prof_bytes = (uint64_t)n_tok * (uint64_t)k * (uint64_t)n_embd * row_bytes;
    return launch(cu, cu->moe_down[slot], cu->what[W_DOWN][slot], (unsigned)((n_embd + 3) / 4),
                  (unsigned)n_tok, 128, s, p, err);
}

/* The launch of moe.cuh's gate/up kernel that takes the shared expert's matrices sg / su:
 * grid (n_ff / 4, n_tok * k1); mats: the matrices it may read, for the profile's bytes. */
static int gate_up_sh_launch(struct sil_cuda *cu, CUfunction f, const char *what,
                             const struct sil_cuda_weight *gate, const struct sil_cuda_weight *up,
                             sil_cuda_ptr sg, sil_cuda_ptr su, int n_expert, sil_cuda_ptr q8,
                             int n_tok, sil_cuda_ptr ids, int k, int k1, sil_cuda_ptr x,
                             sil_cuda_ptr gate_inp, sil_cuda_ptr sh_logit, sil_cuda_ptr h,
                             sil_cuda_ptr h8, sil_cuda_ptr done, uint64_t mats,
                             struct sil_cuda_stream *s, struct sil_error *err)
{
    int n_ff = (int)(gate->rows / n_expert), units = (int)(gate->cols / SIL_CUDA_Q8_BLOCK);
    int64_t nblocks = (int64_t)n_tok * units;
    uint64_t row_bytes = gate->row_bytes;
    uint64_t stride = gate->mat_stride ? gate->mat_stride : (uint64_t)n_ff * row_bytes;
    if (!moe_host_ok(gate, up))
        return set_err(err, -EINVAL,
                       "cuda: moe slots read in place without a slot table or host memory");
    uint64_t hstride = gate->host_stride;
    int nslot = gate->n_slot;
    if (done && (n_ff % 32 != 0 || !h8))
        return set_err(err, -EINVAL, "cuda: moe gate/up q8 of h needs n_ff %% 32 == 0 (%d)", n_ff);
    int64_t h8_blocks = done ? (int64_t)n_tok * k1 * n_ff / 32 : 0;
    void *p[] = {(void *)&gate->data, (void *)&up->data, &sg, &su, &row_bytes, &stride,
                 (void *)&gate->host, (void *)&up->host, &hstride, (void *)&gate->tab, &nslot,
                 &n_ff, &units, &n_expert, &q8, &nblocks, &ids, &k, &x, &gate_inp, &sh_logit, &h,
                 &h8, &h8_blocks, &done};
    cu->prof_bytes = mats * 2 * (uint64_t)n_ff * row_bytes;
    return launch(cu, f, what, (unsigned)((n_ff + 3) / 4), (unsigned)(n_tok * k1), 128, s, p,
                  err);
}

int sil_cuda_moe_gate_up_shared(struct sil_cuda *cu, const struct sil_cuda_weight *gate,
                                const struct sil_cuda_weight *up,
                                const struct sil_cuda_weight *sh_gate,
                                const struct sil_cuda_weight *sh_up, int n_expert, sil_cuda_ptr q8,
                                int n_tok, sil_cuda_ptr ids, int k, sil_cuda_ptr x,
                                sil_cuda_ptr gate_inp, sil_cuda_ptr sh_logit, sil_cuda_ptr h,
                                sil_cuda_ptr h8, sil_cuda_ptr done, struct sil_cuda_stream *s,
                                struct sil_error *err)
{
    const int slot = mv_slot(gate->type);
    if (slot < 0 || slot >= MV_F32 || up->type != gate->type || sh_gate->type != gate->type ||
        sh_up->type != gate->type || !gate->data || !up->data || !sh_gate->data || !sh_up->data ||
        !x || !gate_inp || !sh_logit)
        return set_err(err, -ENOTSUP,
                       "cuda: moe gate/up with the shared expert: one quantized "
                       "type for all four");
    if (n_expert <= 0 || gate->rows % n_expert || up->rows != gate->rows ||
        up->cols != gate->cols || sh_gate->rows != gate->rows / n_expert ||
        sh_up->rows != sh_gate->rows || sh_gate->cols != gate->cols || n_tok <= 0 || k <= 0 ||
        (int64_t)n_tok * (k + 1) > 65535)
        return set_err(err, -EINVAL,
                       "cuda: moe gate/up + shared of %lld rows over %d experts, %d x %d",
                       (long long)gate->rows, n_expert, n_tok, k);
    /* bytes: k + 1 experts a token at most (fewer when tokens share one) */
    return gate_up_sh_launch(cu, cu->moe_gate_up_sh[slot], cu->what[W_GATE_UP][slot], gate, up,
                             sh_gate->data, sh_up->data, n_expert, q8, n_tok, ids, k, k + 1, x,
                             gate_inp, sh_logit, h, h8, done, (uint64_t)n_tok * (uint64_t)(k + 1),
                             s, err);
}

int sil_cuda_rmsnorm_threads(int64_t n)
{
    return n >= 4096 ? 1024 : n >= 1024 ? 512 : 128;
}

/* ops.cuh's sil_router_norm: rows of whole q8 blocks, 8 elements a thread at most. */
bool sil_cuda_router_norm_ok(int64_t n)
{
    return n > 0 && n <= SIL_CUDA_ROUTER_NORM_MAX && n % SIL_CUDA_Q8_BLOCK == 0 &&
           n <= 8 * (int64_t)sil_cuda_rmsnorm_threads(n);
}

int sil_cuda_moe_down_shared(struct sil_cuda *cu, const struct sil_cuda_weight *down,
                             const struct sil_cuda_weight *sh_down, int n_expert, sil_cuda_ptr q8h,
                             int n_tok, sil_cuda_ptr ids, sil_cuda_ptr weights,
                             sil_cuda_ptr sh_logit, int k, sil_cuda_ptr y,
                             struct sil_cuda_stream *s, struct sil_error *err)
{
    const int slot = mv_slot(down->type);
    if (slot < 0 || slot >= MV_F32 || sh_down->type != down->type || !down->data ||
        !sh_down->data || !sh_logit)
        return set_err(err, -ENOTSUP, "cuda: moe down with the shared expert: one quantized type");
    if (n_expert <= 0 || down->rows % n_expert || sh_down->rows != down->rows / n_expert ||
        sh_down->cols != down->cols || n_tok <= 0 || n_tok > 65535 || k <= 0 ||
        k + 1 > SIL_CUDA_MOE_SLOTS_MAX || (int64_t)n_tok * (k + 1) > 65535)
        return set_err(err, -EINVAL,
                       "cuda: moe down + shared of %lld rows over %d experts, %d x %d",
                       (long long)down->rows, n_expert, n_tok, k);
    int n_embd = (int)(down->rows / n_expert), units = (int)(down->cols / SIL_CUDA_Q8_BLOCK);
    int64_t nblocks = (int64_t)n_tok * (k + 1) * units;
    uint64_t row_bytes = down->row_bytes;
    uint64_t stride = down->mat_stride ? down->mat_stride : (uint64_t)n_embd * row_bytes;
    if (!moe_host_ok(down, NULL))
        return set_err(err, -EINVAL,
                       "cuda: moe slots read in place without a slot table or host memory");
    uint64_t hstride = down->host_stride;
    int nslot = down->n_slot;
    void *p[] = {(void *)&down->data,
                 (void *)&sh_down->data,
                 &row_bytes,
                 &stride,
                 (void *)&down->host,
                 &hstride,
                 (void *)&down->tab,
                 &nslot,
                 &n_embd,
                 &units,
                 &n_expert,
                 &q8h,
                 &nblocks,
                 &ids,
                 &weights,
                 &sh_logit,
                 &k,
                 &y};
    cu->prof_bytes = (uint64_t)n_tok * (uint64_t)(k + 1) * (uint64_t)n_embd * row_bytes;
    return launch(cu, cu->moe_down_sh[slot], cu->what[W_DOWN][slot], (unsigned)((n_embd + 3) / 4),
                  (unsigned)n_tok, 128, s, p, err);
}

/* ---- further modules ----------------------------------------------------------------------- */

struct sil_cuda_module {
    CUmodule m;
};

int sil_cuda_module_load(struct sil_cuda *cu, const void *image, struct sil_cuda_module **out,
                         struct sil_error *err)
{
    *out = NULL;
    int rc = bind_ctx(cu, err);
    if (rc < 0) return rc;
    struct sil_cuda_module *m = calloc(1, sizeof *m);
    if (!m) return set_err(err, -ENOMEM, "cuda: out of memory");
    CUresult r = cu->api.cuModuleLoadData(&m->m, image);
    if (r != CUDA_SUCCESS) {
        free(m);
        return cu_fail(&cu->api, err, r, "cuModuleLoadData");
    }
    rc = set_prefetch_flag(cu, m->m, err);
    if (rc < 0) {
        cu->api.cuModuleUnload(m->m);
        free(m);
        return rc;
    }
    *out = m;
    return 0;
}

void sil_cuda_module_unload(struct sil_cuda *cu, struct sil_cuda_module *m)
{
    if (!m) return;
    if (bind_ctx(cu, NULL) == 0) cu->api.cuModuleUnload(m->m);
    free(m);
}

int sil_cuda_module_function(struct sil_cuda *cu, struct sil_cuda_module *m, const char *name,
                             void **fn, struct sil_error *err)
{
    CUfunction f = NULL;
    CUresult r = cu->api.cuModuleGetFunction(&f, m->m, name);
    if (r != CUDA_SUCCESS)
        return set_err(err, -ENOENT, "cuda: kernel %s not in the module (driver error %d)", name,
                       r);
    *fn = f;
    return 0;
}

int sil_cuda_launch(struct sil_cuda *cu, void *fn, const char *what, unsigned gx, unsigned gy,
                    unsigned gz, unsigned block, struct sil_cuda_stream *s, void **params,
                    struct sil_error *err)
{
    return cu_launch(cu, (CUfunction)fn, what, gx, gy, gz, block, s, params, err);
}
