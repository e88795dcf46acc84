/* The CUDA backend's memory: device buffers, pinned and registered host memory, and the copies
 * between them on a stream. Contract in cuda_backend.h. */
#include <stdint.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"

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
