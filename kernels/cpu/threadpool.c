#include "kernels/cpu/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu/mapguard.h"

/* How long a worker spins for the next task before it sleeps: bridges the gaps between the
 * kernels of one forward pass (a futex wake-up costs ~100 us on a VM, and PAUSE lasts from 3 to
 * 140 cycles depending on the CPU, so the budget is in time, not iterations), and an idle
 * daemon stops burning a core after it. */
#define SPIN_NS 2000000L /* every 256 pauses of the spin also yield the core */
#define SPIN_ITERS 20000
#define OPEN_BIT (1ull << 40)

struct sil_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint generation;  /* bumped when a task opens */
    atomic_int sleepers;     /* workers blocked on cv */
    atomic_ullong state;     /* OPEN_BIT while the task accepts workers | workers inside */
    atomic_long next;        /* next unclaimed item */
    atomic_bool stop;
    atomic_bool faulted; /* a task read a faulting mapping (mapguard.h); later tasks are skipped */
    /* the open task */
    sil_range_fn fn;
    void *arg;
    long n, chunk;
};

struct worker_arg {
    struct sil_threadpool *tp;
    int ith;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void claim_loop(struct sil_threadpool *tp, int ith)
{
    if (atomic_load_explicit(&tp->faulted, memory_order_relaxed)) return;
    /* A read of a truncated model file faults here (SIGBUS): this thread records it and stops,
     * and the other threads find no work left, so the caller's wait still ends. */
    struct sil_mapguard_point pt;
    sil_mapguard_push(&pt);
    if (sigsetjmp(pt.jb, 0)) {
        atomic_store(&tp->faulted, true);
        atomic_store(&tp->next, tp->n);
        return;
    }
    for (;;) {
        long lo = atomic_fetch_add_explicit(&tp->next, tp->chunk, memory_order_relaxed);
        if (lo >= tp->n) break;
        long hi = lo + tp->chunk < tp->n ? lo + tp->chunk : tp->n;
        tp->fn(tp->arg, lo, hi, ith);
    }
    sil_mapguard_pop(&pt);
}

static void *worker_main(void *p)
{
    struct worker_arg wa = *(struct worker_arg *)p;
    free(p);
    struct sil_threadpool *tp = wa.tp;
    unsigned seen = atomic_load(&tp->generation);
    for (;;) {
        int spins = 0;
        long t0 = 0;
        while (atomic_load_explicit(&tp->generation, memory_order_acquire) == seen &&
               !atomic_load(&tp->stop)) {
            cpu_relax();
            if ((++spins & 255) != 0)
                continue;
            /* on a host with more runnable threads than cores a spinning worker takes the time
             * slices its own caller needs (2 threads ran slower than 1); alone, this returns */
            sched_yield();
            long t = now_ns();
            if (t0 == 0)
                t0 = t;
            if (t - t0 < SPIN_NS)
                continue;
            pthread_mutex_lock(&tp->mu);
            atomic_fetch_add(&tp->sleepers, 1);
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            atomic_fetch_sub(&tp->sleepers, 1);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop))
            return NULL;
        /* join the task only while it is open; a late worker skips it */
        unsigned long long s = atomic_load(&tp->state);
        bool joined = false;
        while (s & OPEN_BIT) {
            if (atomic_compare_exchange_weak(&tp->state, &s, s + 1)) {
                joined = true;
                break;
            }
        }
        /* while we are inside, the caller cannot open another task: generation is stable */
        seen = atomic_load_explicit(&tp->generation, memory_order_acquire);
        if (joined) {
            claim_loop(tp, wa.ith);
            atomic_fetch_sub_explicit(&tp->state, 1, memory_order_release);
        }
    }
}

int sil_threadpool_create(struct sil_threadpool **out, int n_threads)
{
    if (n_threads < 1)
        return -EINVAL;
    struct sil_threadpool *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return -ENOMEM;
    tp->n_threads = n_threads;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->cv, NULL);
    tp->threads = calloc((size_t)n_threads, sizeof(pthread_t));
    if (!tp->threads) {
        free(tp);
        return -ENOMEM;
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker_arg *wa = malloc(sizeof(*wa));
        if (wa)
            *wa = (struct worker_arg){tp, i};
        int rc = wa ? pthread_create(&tp->threads[i], NULL, worker_main, wa) : ENOMEM;
        if (rc != 0) {
            free(wa);
            tp->n_threads = i;
            sil_threadpool_free(tp);
            return -rc;
        }
    }
    *out = tp;
    return 0;
}

void sil_threadpool_free(struct sil_threadpool *tp)
{
    if (!tp)
        return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, true);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 1; i < tp->n_threads; i++)
        pthread_join(tp->threads[i], NULL);
    pthread_mutex_destroy(&tp->mu);
    pthread_cond_destroy(&tp->cv);
    free(tp->threads);
    free(tp);
}

bool sil_threadpool_faulted(struct sil_threadpool *tp)
{
    return tp && atomic_load(&tp->faulted);
}

void sil_threadpool_clear_fault(struct sil_threadpool *tp)
{
    if (tp) atomic_store(&tp->faulted, false);
}

int sil_threadpool_n_threads(const struct sil_threadpool *tp)
{
    return tp ? tp->n_threads : 1;
}

void sil_threadpool_for(struct sil_threadpool *tp, long n, long chunk, sil_range_fn fn, void *arg)
{
    if (n <= 0)
        return;
    const int nth = tp ? tp->n_threads : 1;
    if (chunk <= 0)
        chunk = (n + 4L * nth - 1) / (4L * nth);
    if (nth == 1 || n <= chunk) {
        if (!tp || !atomic_load_explicit(&tp->faulted, memory_order_relaxed))
            fn(arg, 0, n, 0); /* a fault here reaches the caller's own guard point */
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    tp->n = n;
    tp->chunk = chunk;
    atomic_store(&tp->next, 0);
    atomic_store(&tp->state, OPEN_BIT);
    atomic_fetch_add(&tp->generation, 1);
    if (atomic_load(&tp->sleepers) > 0) {
        pthread_mutex_lock(&tp->mu);
        pthread_cond_broadcast(&tp->cv);
        pthread_mutex_unlock(&tp->mu);
    }
    claim_loop(tp, 0);
    /* close: workers that have not joined yet will skip; wait for those inside */
    atomic_fetch_and_explicit(&tp->state, ~OPEN_BIT, memory_order_acq_rel);
    int spins = 0;
    while (atomic_load_explicit(&tp->state, memory_order_acquire) != 0) {
        if (++spins < SPIN_ITERS)
            cpu_relax();
        else
            sched_yield();
    }
}
