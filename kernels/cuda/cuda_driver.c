/* The CUDA backend's driver: libcuda through dlopen, the device and its primary context, the
 * embedded fatbin's module and its kernels, further modules. Contract in cuda_backend.h. */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"

#ifndef SIL_CUDA_ARCHS
#define SIL_CUDA_ARCHS "unknown"
#endif

static const char *const w_kinds[W_COUNT] = {"matvec", "matmul", "moe_gate_up", "moe_down"};
static const char *const k_names[K_COUNT] = {
    "sil_quantize_q8_1", "sil_rmsnorm_f32",     "sil_add_f32",    "sil_swiglu_f32",
    "sil_rope_neox_f32", "sil_router_topk_f32", "sil_argmax_f32",
};

extern const unsigned char sil_cuda_fatbin[];
extern const uint64_t sil_cuda_fatbin_size;

const char *sil_cuda_fatbin_archs(void)
{
    return SIL_CUDA_ARCHS;
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
            if (t >= MV_F32) {
                snprintf(name, sizeof name, "sil_mmf_thin_%s", mv_names[t]);
                r = cu->api.cuModuleGetFunction(&cu->mmf_thin[t - MV_F32], cu->mod, name);
                if (r != CUDA_SUCCESS) return cu_fail(&cu->api, err, r, name);
                continue;
            }
            static const char *const bn_names[3] = {"16", "32", ""};
            for (int bi = 0; bi < 3 && r == CUDA_SUCCESS; bi++) {
                snprintf(name, sizeof name, "sil_mmq_grp%s_%s_%s", bn_names[bi], mv_names[t],
                         v ? "sm80" : "sm75");
                r = cu->api.cuModuleGetFunction(&cu->mmq_grp[t][v][bi], cu->mod, name);
            }
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
    struct sil_error gerr = {0}; /* a benchmark switch's typo: the default stays */
    if (opt->grouped_bn && sil_cuda_set_grouped_bn(cu, opt->grouped_bn, &gerr) < 0)
        fprintf(stderr, "siliceo: %s: ignored\n", gerr.msg);
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
