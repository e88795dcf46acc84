/* Every setting of the CUDA backend, in one struct: the device layer (sil_cuda_init) and the
 * engine's backend (backend_cuda.c) read these fields and nothing else. All zero is the default
 * behaviour, so a caller sets only what it changes.
 *
 * The first group is what a user may set: siliceod.conf(5) cuda_* keys, siliceod's and sil-eval's
 * --cuda-* options (sil_cuda_option_set parses them). The rest is for tests and benchmarks
 * only: tests set the fields, siliceod and the benchmark tools fill them from the environment in
 * one place (sil_dev_switches_read, siliceo-dev(7)). */
#ifndef SIL_CUDA_OPTIONS_H
#define SIL_CUDA_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

enum sil_cuda_pin {
    SIL_CUDA_PIN_AUTO, /* the engine's host tier of all the experts when they fit its budget;
                        * with no budget, pinned when they fit 3/4 of the available host
                        * memory and pin fast */
    SIL_CUDA_PIN_ON,   /* when they fit, however slowly this kernel pins a file mapping */
    SIL_CUDA_PIN_OFF,  /* never: misses staged through a pinned buffer */
};

struct sil_cuda_options {
    /* cuda_graphs = off: every decode pass op by op instead of a CUDA graph replayed per shape */
    bool no_graphs;
    /* cuda_zero_copy = on: miss path (b), decode reads experts missing from the slots in place
     * from pinned host memory (the CPU's share of misses is then off) */
    bool zero_copy;
    enum sil_cuda_pin pin; /* cuda_pin: the routed experts' pages of the model file */
    /* cuda_cpu_share, miss path (c): the share of each decode layer's expert misses computed on
     * the CPU while the rest are copied into slots. cpu_off: none; else cpu_share in (0, 1],
     * or 0: host / (host + link) from the speeds measured at start (auto) */
    bool cpu_off;
    double cpu_share;

    /* Tests and benchmarks (siliceo-dev(7)). */
    const char *driver;    /* the driver library to open; NULL: libcuda.so.1 */
    int32_t cpu_misses;    /* > 0: up to this many misses a decode layer on the CPU, whatever the
                            * speeds */
    int64_t slots;         /* > 0: the routed experts in this many slots even when they fit */
    int32_t attn_split;    /* > 0: decode attention's chunks a head */
    int32_t scores_rows;   /* > 0: at most this many rows a launch of prefill attention */
    int32_t ubatch;        /* > 0: at most this many rows a micro-batch */
    int32_t prefill_split; /* > 0: prefill attention from this position on through the decode
                            * kernels */
    bool host_route;       /* every MoE layer's choices brought to the host */
    bool no_grouped;       /* prefill's routed experts through the fused decode kernels */
    int32_t grouped_bn;    /* 16, 32 or 64: the grouped products' activation rows a block
                            * (0: from the micro-batch's rows per expert) */
    /* fusions off, each to compare with its parts (the parts' launches are what shapes the
     * fusion does not take run anyway) */
    bool no_shared_fuse, no_norm_router, no_attn_q8, no_conv_fuse, no_mv_mix, no_gqa, no_dn_fuse,
        no_router_fuse, no_h8_fuse;
    bool no_flash;        /* prefill attention one block a row and head, never tiled */
    int32_t flash_from;   /* > 0: prefill attention tiled from this position on (default
                           * FLASH_FROM_DEFAULT in the backend) */
    bool no_pdl;          /* plain launches instead of programmatic dependent launch */
    bool no_prefetch;     /* no L2 prefetch of weights before the PDL wait */
    uint64_t inject_oom;  /* > 0: the n-th kernel launch fails as out of memory, once */
    double h2d_cap_gbs;   /* > 0: expert copies into slots no faster than this */
    const char *profile;  /* a file for the per-kernel times of one decode pass */
    int32_t profile_rows; /* > 1: profile the first pass of this many rows instead */
};

#endif
