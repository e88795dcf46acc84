/* The CUDA backend's streams, events (timing), and graphs: a stream's work captured once and
 * replayed. Contract in cuda_backend.h. */
#include <stdlib.h>

#include "kernels/cuda/cuda_impl.h"

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
