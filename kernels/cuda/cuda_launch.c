/* The CUDA backend's launches: every kernel goes through sil_cu_launch, with programmatic
 * dependent launch where the device has it, timed per kernel while profiling, and failed on
 * purpose where a test asks (SIL_CUDA_INJECT_OOM). Contract in cuda_backend.h. */
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cuda_impl.h"

/* Every kernel launch of this file and of further modules. Profiling times each one between
 * two events on its stream and waits for it: figures for a table, not for speed. */
int sil_cu_launch(struct sil_cuda *cu, CUfunction f, const char *what, unsigned gx, unsigned gy,
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

int sil_cuda_launch(struct sil_cuda *cu, void *fn, const char *what, unsigned gx, unsigned gy,
                    unsigned gz, unsigned block, struct sil_cuda_stream *s, void **params,
                    struct sil_error *err)
{
    return sil_cu_launch(cu, (CUfunction)fn, what, gx, gy, gz, block, s, params, err);
}
