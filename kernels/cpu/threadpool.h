/* A small pthread pool for data-parallel kernels: sil_threadpool_for(tp, n, chunk, fn, arg)
 * covers [0, n) with calls fn(arg, lo, hi, ith), chunks claimed dynamically by whichever threads
 * show up. The caller (ith 0) always takes part, and a worker that arrives after the work is
 * gone simply skips it: on a loaded machine a descheduled worker delays nothing, the caller does
 * its share (spin-waiting for absent workers cost 10x at decode on a busy 2-core host).
 * ith < n_threads identifies the thread, for per-thread scratch.
 *
 * Workers spin briefly between tasks, then sleep on a condition variable, so an idle pool costs
 * no CPU. One thread at a time may call sil_threadpool_for.
 * A task that reads a file mapping which faults (mapguard.h) stops on the thread that faulted;
 * the pool then skips every task until sil_threadpool_clear_fault, and sil_threadpool_faulted
 * says so (the caller abandons the work).
 * Ownership: the pool owns its threads; sil_threadpool_free joins them. */
#ifndef SIL_THREADPOOL_H
#define SIL_THREADPOOL_H

#include <stdbool.h>

typedef void (*sil_range_fn)(void *arg, long lo, long hi, int ith);

struct sil_threadpool;

/* n_threads >= 1 counts the caller; returns 0 or -errno. */
int sil_threadpool_create(struct sil_threadpool **out, int n_threads);
void sil_threadpool_free(struct sil_threadpool *tp);
int sil_threadpool_n_threads(const struct sil_threadpool *tp);
/* tp may be NULL (runs on the caller). chunk <= 0: n split into about 4 chunks per thread. */
bool sil_threadpool_faulted(struct sil_threadpool *tp);
void sil_threadpool_clear_fault(struct sil_threadpool *tp);
void sil_threadpool_for(struct sil_threadpool *tp, long n, long chunk, sil_range_fn fn, void *arg);

/* [*lo, *hi) = the ith of nth near-equal parts of [0, n). */
static inline void sil_split_range(long n, int ith, int nth, long *lo, long *hi)
{
    long per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}

#endif
