/* Routed experts computed on the host, from their matrices where they lie (the model file's
 * mapping): the CPU's share of a decode step's expert-cache misses, while the rest stream to
 * the device (miss path (c) of the expert cache). For each job,
 *     y[row] += weight * down(silu(gate x[row]) * up x[row])
 * with the activations quantized to each weight's vec_dot type, as the CPU backend does.
 * Engine thread only; the work is spread over the object's own thread pool. */
#ifndef SIL_HOST_EXPERTS_H
#define SIL_HOST_EXPERTS_H

#include <stdint.h>

#include "daemon/engine/backend.h"
#include "kernels/error.h"

struct sil_host_expert_job {
    int32_t row;                               /* row of x and y */
    float weight;                              /* the router's weight of this expert for that row */
    const struct sil_weight *gate, *up, *down; /* one expert: [n_ff][n_embd] x2, [n_embd][n_ff] */
};

struct sil_host_experts;

/* Scratch for up to max_jobs jobs of one model's expert shape; n_threads >= 1. */
int sil_host_experts_create(struct sil_host_experts **out, int n_threads, int64_t n_embd,
                            int64_t n_ff, int max_jobs, struct sil_error *err);
void sil_host_experts_free(struct sil_host_experts *h);

/* y[0..n_rows) (n_embd floats each) = the sum of the jobs' outputs for each row (rows without a
 * job are 0). -EINVAL (err says which) for a job out of range or a weight of another shape or
 * a type without a CPU kernel; y is then untouched. */
int sil_host_experts_run(struct sil_host_experts *h, const float *x, int32_t n_rows,
                         const struct sil_host_expert_job *jobs, int n_jobs, float *y,
                         struct sil_error *err);

#endif
