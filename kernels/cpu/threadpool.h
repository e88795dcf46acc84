/* A small pthread pool for data-parallel kernels: sil_threadpool_run calls fn(arg, ith, nth) on
 * every thread (the caller is thread 0) and returns when all are done.
 *
 * Workers spin briefly after a task (decode issues many small tasks back to back), then sleep on
 * a condition variable, so an idle pool costs no CPU. One thread at a time may call run.
 * Ownership: the pool owns its threads; sil_threadpool_free joins them. */
#ifndef SIL_THREADPOOL_H
#define SIL_THREADPOOL_H

typedef void (*sil_task_fn)(void *arg, int ith, int nth);

struct sil_threadpool;

/* n_threads >= 1 counts the caller; returns 0 or -errno. */
int sil_threadpool_create(struct sil_threadpool **out, int n_threads);
void sil_threadpool_free(struct sil_threadpool *tp);
int sil_threadpool_n_threads(const struct sil_threadpool *tp);
/* tp may be NULL: then fn(arg, 0, 1) runs on the caller. */
void sil_threadpool_run(struct sil_threadpool *tp, sil_task_fn fn, void *arg);

/* [*lo, *hi) = the ith of nth near-equal parts of [0, n). */
static inline void sil_split_range(long n, int ith, int nth, long *lo, long *hi)
{
    long per = n / nth, rem = n % nth;
    *lo = ith * per + (ith < rem ? ith : rem);
    *hi = *lo + per + (ith < rem ? 1 : 0);
}

#endif
