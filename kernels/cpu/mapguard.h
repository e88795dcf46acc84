/* Reads of a file mapping that can fault: when the file under a MAP_PRIVATE mapping is truncated,
 * touching a page past the new end raises SIGBUS. A process-wide SIGBUS handler turns a fault
 * whose address lies in a registered range into a siglongjmp to the innermost guard point of the
 * faulting thread and records the fault against the range; a fault anywhere else, or on a thread
 * with no guard point, keeps the default action (the process dies with a core, as before).
 *
 * Use: sil_mapguard_push(&pt); if (sigsetjmp(pt.jb, 0)) { recover: the point is already popped }
 * ... guarded reads ...; sil_mapguard_pop(&pt). Code between push and pop must hold no lock and
 * allocate nothing: a fault abandons it mid-way. Thread-safe; registration is rare (model load). */
#ifndef SIL_MAPGUARD_H
#define SIL_MAPGUARD_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct sil_mapguard_point {
    sigjmp_buf jb;
    struct sil_mapguard_point *prev;
};

extern __thread struct sil_mapguard_point *sil_mapguard_top;

static inline void sil_mapguard_push(struct sil_mapguard_point *pt)
{
    pt->prev = sil_mapguard_top;
    sil_mapguard_top = pt;
}

static inline void sil_mapguard_pop(struct sil_mapguard_point *pt)
{
    sil_mapguard_top = pt->prev;
}

/* Registers [base, base + len) (installing the handler on first use). Returns a slot >= 0 or
 * -ENOSPC (too many live ranges) / -errno from sigaction. */
int sil_mapguard_register(const void *base, size_t len);
void sil_mapguard_unregister(int slot);
/* Faults caught in the slot's range so far; *offset (may be NULL): the first one's offset. */
uint64_t sil_mapguard_faults(int slot, size_t *offset);

#endif
