/* The SIGBUS handler behind mapguard.h. Ranges live in a fixed table of atomics, so the handler
 * reads them without a lock; it runs on the faulting thread (SIGBUS from a page fault is
 * synchronous), so the thread-local guard point it jumps to is that thread's own. */
#include "kernels/cpu/mapguard.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

#define MAX_RANGES 8

struct range {
    _Atomic(uintptr_t) base; /* 0 = free slot */
    _Atomic(size_t) len;
    atomic_uint_least64_t faults;
    _Atomic(size_t) first_offset;
};

__thread struct sil_mapguard_point *sil_mapguard_top;
static struct range ranges[MAX_RANGES];
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction prev_action; /* what ran before ours: faults not ours go back to it */

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    struct sil_mapguard_point *pt = sil_mapguard_top;
    for (int i = 0; pt && i < MAX_RANGES; i++) {
        uintptr_t b = atomic_load_explicit(&ranges[i].base, memory_order_acquire);
        if (b == 0 || a < b || a - b >= atomic_load_explicit(&ranges[i].len, memory_order_relaxed))
            continue;
        if (atomic_fetch_add(&ranges[i].faults, 1) == 0)
            atomic_store(&ranges[i].first_offset, (size_t)(a - b));
        sil_mapguard_top = pt->prev;
        siglongjmp(pt->jb, 1); /* SA_NODEFER: SIGBUS is not left blocked in this thread */
    }
    /* Not ours: the previous handler (or the default action) when the instruction runs again. */
    sigaction(sig, &prev_action, NULL);
}

int sil_mapguard_register(const void *base, size_t len)
{
    pthread_mutex_lock(&reg_mu);
    /* Installed again when someone replaced it since (a test framework does, per test). */
    struct sigaction cur;
    if (sigaction(SIGBUS, NULL, &cur) == 0 && cur.sa_sigaction != on_sigbus) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO | SA_NODEFER;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, &prev_action) < 0) {
            int e = errno;
            pthread_mutex_unlock(&reg_mu);
            return -e;
        }
    }
    int slot = -ENOSPC;
    for (int i = 0; i < MAX_RANGES; i++) {
        if (atomic_load(&ranges[i].base) != 0) continue;
        atomic_store(&ranges[i].len, len);
        atomic_store(&ranges[i].faults, 0);
        atomic_store(&ranges[i].first_offset, 0);
        atomic_store_explicit(&ranges[i].base, (uintptr_t)base ? (uintptr_t)base : 1,
                              memory_order_release);
        slot = i;
        break;
    }
    pthread_mutex_unlock(&reg_mu);
    return slot;
}

void sil_mapguard_unregister(int slot)
{
    if (slot < 0 || slot >= MAX_RANGES) return;
    pthread_mutex_lock(&reg_mu);
    atomic_store(&ranges[slot].base, 0);
    pthread_mutex_unlock(&reg_mu);
}

uint64_t sil_mapguard_faults(int slot, size_t *offset)
{
    if (slot < 0 || slot >= MAX_RANGES) return 0;
    uint64_t n = atomic_load(&ranges[slot].faults);
    if (offset) *offset = n ? atomic_load(&ranges[slot].first_offset) : 0;
    return n;
}
