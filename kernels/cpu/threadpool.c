#include "kernels/cpu/threadpool.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

/* Spin iterations before a worker sleeps: long enough to bridge the gap between two kernels of
 * one forward pass, short enough that an idle daemon does not burn a core. */
#define SPIN_ITERS 20000

struct sil_threadpool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint generation; /* bumped once per task */
    atomic_int pending;     /* workers still running the current task */
    atomic_bool stop;
    sil_task_fn fn;
    void *arg;
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

static void *worker_main(void *p)
{
    struct worker_arg wa = *(struct worker_arg *)p;
    free(p);
    struct sil_threadpool *tp = wa.tp;
    unsigned seen = 0;
    for (;;) {
        unsigned gen;
        int spins = 0;
        while ((gen = atomic_load_explicit(&tp->generation, memory_order_acquire)) == seen &&
               !atomic_load(&tp->stop)) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            pthread_mutex_lock(&tp->mu);
            while (atomic_load(&tp->generation) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->cv, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop))
            return NULL;
        seen = gen;
        tp->fn(tp->arg, wa.ith, tp->n_threads);
        atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel);
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

int sil_threadpool_n_threads(const struct sil_threadpool *tp)
{
    return tp ? tp->n_threads : 1;
}

void sil_threadpool_run(struct sil_threadpool *tp, sil_task_fn fn, void *arg)
{
    if (!tp || tp->n_threads == 1) {
        fn(arg, 0, 1);
        return;
    }
    tp->fn = fn;
    tp->arg = arg;
    atomic_store_explicit(&tp->pending, tp->n_threads - 1, memory_order_relaxed);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->generation, 1, memory_order_release);
    pthread_cond_broadcast(&tp->cv);
    pthread_mutex_unlock(&tp->mu);
    fn(arg, 0, tp->n_threads);
    int spins = 0;
    while (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0) {
        if (++spins < SPIN_ITERS)
            cpu_relax();
        else
            sched_yield();
    }
}
