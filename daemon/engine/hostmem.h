/* What the host can spare for new memory: MemAvailable of /proc/meminfo, held to what the
 * process's cgroup (v2) still allows (memory.max less memory.current, the tightest of the
 * cgroup and its ancestors), so a systemd MemoryMax= or a container's limit is seen. Read at
 * the moment of the call; nothing is cached. */
#ifndef SIL_HOSTMEM_H
#define SIL_HOSTMEM_H

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

#endif
