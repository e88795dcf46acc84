/* Routing traces: which experts each row of each MoE layer was routed to, recorded from the
 * engine and replayed by the expert-cache simulator (sil-cachesim).
 *
 * File (little-endian): a 32-byte header
 *   0  char[8] "SILROUTE"
 *   8  u32     version (1)
 *   12 u32     n_layer
 *   16 u32     n_expert (at most 65535)
 *   20 u32     n_used (experts per row, K)
 *   24 u64     0 (reserved)
 * then records, one per (ubatch, MoE layer) in evaluation order, each one layer's plan:
 *   u32 layer, u32 n_rows, then n_rows * n_used u16 expert ids, row by row, each row's in the
 *   router's top-k order.
 * A decode step of one sequence is one record of one row per layer; a prefill ubatch of 512
 * rows is one record of 512 rows per layer. Tokens are counted at each record of layer 0.
 * Ownership: the writer owns its FILE; records read are copied into the caller's buffer. */
#ifndef SIL_ROUTE_TRACE_H
#define SIL_ROUTE_TRACE_H

#include <stdint.h>
#include <stdio.h>

#include "kernels/error.h"

#define SIL_ROUTE_TRACE_VERSION 1u
#define SIL_ROUTE_TRACE_MAX_ROWS 65536

struct sil_route_trace {
    FILE *f;
    uint32_t n_layer, n_expert, n_used;
    uint64_t records;
    int error; /* first write error (-errno), sticky */
};

/* Creates path and writes the header. 0 or -errno. */
int sil_route_trace_create(struct sil_route_trace *t, const char *path, uint32_t n_layer,
                           uint32_t n_expert, uint32_t n_used, struct sil_error *err);
/* One layer's plan: sel[n_rows * n_used] expert ids. Errors stick in t->error. */
void sil_route_trace_write(struct sil_route_trace *t, uint32_t layer, uint32_t n_rows,
                           const int32_t *sel);
/* Flushes and closes; the first error of any write or of the close, or 0. */
int sil_route_trace_close(struct sil_route_trace *t, struct sil_error *err);

/* Opens path for reading and checks the header; on failure nothing stays open. */
int sil_route_trace_open(struct sil_route_trace *t, const char *path, struct sil_error *err);
/* The same on an open stream (taken over: closed on failure, else with t->f); name labels
 * messages. */
int sil_route_trace_fopen(struct sil_route_trace *t, FILE *f, const char *name,
                          struct sil_error *err);
/* The next record: 1 with *layer, *n_rows and sel[0..n_rows * n_used) filled (sel holds
 * SIL_ROUTE_TRACE_MAX_ROWS * n_used), 0 at the end, -EINVAL for a malformed record (a layer
 * or expert out of range, too many rows, a truncated record). */
int sil_route_trace_read(struct sil_route_trace *t, uint32_t *layer, uint32_t *n_rows, int32_t *sel,
                         struct sil_error *err);

#endif
