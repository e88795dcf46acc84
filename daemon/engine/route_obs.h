/* Route tracing and replay for tests and benchmarks, as an engine observer (engine.h):
 * - trace: every MoE layer's choices written to a routing trace (route_trace.h), record by
 *   record in evaluation order (on CUDA the routing is then brought to the host, and every
 *   expert must be resident);
 * - replay: every MoE layer routed with the choices of a trace, record by record in evaluation
 *   order (the trace of the same evaluations, from another backend or run), each choice weighted
 *   by the engine's router probabilities (CPU backend); the stats say how far they were from
 *   the engine's own top-k. A record that does not fit (another layer or row count, the trace
 *   ended, an expert repeated in a row) fails that evaluation and every later one with -EINVAL.
 * Neither changes a logit when the trace is the engine's own. The files are opened when the
 * engine opens (they take the model's shape).
 * Ownership: the observer owns its files and scratch; it outlives the engine it is registered
 * on (sil_engine_params.observer); one thread (the engine's) at a time. */
#ifndef SIL_ROUTE_OBS_H
#define SIL_ROUTE_OBS_H

#include <stdint.h>

#include "daemon/engine/engine.h"
#include "kernels/error.h"

struct sil_route_obs;

/* trace_path, replay_path: the trace to write, the one to route with; either may be NULL. The
 * strings are kept until sil_route_obs_free. 0 or -ENOMEM. */
int sil_route_obs_create(struct sil_route_obs **out, const char *trace_path,
                         const char *replay_path, struct sil_error *err);
/* What to register on the engine; it lives as long as o. */
const struct sil_engine_observer *sil_route_obs_observer(struct sil_route_obs *o);

/* The records replayed, the choices among them outside the engine's own top-k, and the largest
 * ln(p of its own k-th choice / p of such a choice) (0: none). */
struct sil_route_obs_stats {
    uint64_t replay_records, replay_changed;
    float replay_gap;
};
void sil_route_obs_stats(const struct sil_route_obs *o, struct sil_route_obs_stats *out);

/* Closes the files and frees o (may be NULL): the trace's first write error, or 0. */
int sil_route_obs_free(struct sil_route_obs *o, struct sil_error *err);

#endif
