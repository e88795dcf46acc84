/* What the host can spare for new memory: MemAvailable of /proc/meminfo, held to what the
 * process's cgroup (v2) still allows (memory.max less memory.current, the tightest of the
 * cgroup and its ancestors), so a systemd MemoryMax= or a container's limit is seen. Read at
 * the moment of the call; nothing is cached. */
#ifndef SIL_HOSTMEM_H
#define SIL_HOSTMEM_H

#include <stdbool.h>
#include <stdint.h>

struct sil_host_spare {
    uint64_t bytes;         /* the smaller of the two below (UINT64_MAX: neither was read) */
    uint64_t mem_available; /* MemAvailable, UINT64_MAX when /proc/meminfo could not be read */
    uint64_t cgroup_room;   /* memory.max - memory.current, UINT64_MAX without a limit */
    char from[48];          /* "MemAvailable", "cgroup memory.max" or "unknown" */
};

/* root: NULL or "" for this system, else a directory that stands for / (tests lay out
 * proc/meminfo, proc/self/cgroup and sys/fs/cgroup/... under it). Always fills *out. */
void sil_host_spare(const char *root, struct sil_host_spare *out);

/* One host budget (host_budget) shared out between everything the engine and the daemon keep in
 * host memory. What is held whatever the plan (the backbone's weights and the KV pool where the
 * CPU reads them) comes first; the routed experts want all of their bytes, and the caches what
 * they were given. When it all does not fit, the caches give way in the order of enum
 * sil_host_cache, first each down to a floor (1/32 of the budget, or less when it wanted
 * less), which is often enough for the experts to fit whole; when it is not,
 * the experts get a host tier of what the floors leave; when that is under the tier's minimum,
 * the caches give way again, in the same order, down to nothing. */
enum sil_host_cache {
    SIL_HOST_SNAPSHOTS, /* the prefix cache's recurrent-state snapshots */
    SIL_HOST_PREFIX,    /* the prefix cache's KV blocks (where the KV is in host memory) */
    SIL_HOST_SESSIONS,  /* the state idle sessions keep */
    SIL_HOST_N_CACHE
};

struct sil_host_plan_in {
    uint64_t budget;      /* all of it (UINT64_MAX: unknown, everything is granted) */
    uint64_t fixed;       /* held whatever the plan */
    uint64_t experts;     /* the routed experts read from host memory (0: none) */
    uint64_t experts_min; /* the least host tier of them (0: no tier, they fit whole or fail) */
    uint64_t want[SIL_HOST_N_CACHE];
};

struct sil_host_plan {
    uint64_t cache[SIL_HOST_N_CACHE]; /* what each cache gets */
    uint64_t experts;                 /* the experts' share: all of them, or the tier's budget */
    bool tier;                        /* the experts do not fit whole: a host tier of that share */
    bool gave_way;                    /* some cache got less than it wanted */
    uint64_t min_budget;              /* the least budget that plans: fixed + the least of them */
};

/* 0 with *out filled, or -ENOSPC when the budget is under out->min_budget (out still says it). */
int sil_host_plan(const struct sil_host_plan_in *in, struct sil_host_plan *out);
/* "snapshots", "prefix_blocks", "sessions" */
const char *sil_host_cache_name(enum sil_host_cache c);

#endif
