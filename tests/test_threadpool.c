/* The thread pool: every item of [0, n) is visited exactly once per task whatever the chunk
 * size, ith stays below n_threads, thousands of back-to-back tasks (decode's pattern) do not
 * lose or repeat work, and a task still completes when the caller is the only one working. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/cpu/mapguard.h"
#include "kernels/cpu/threadpool.h"

struct visit {
    atomic_int *count;
    int n_threads;
    atomic_int bad_ith;
};

static void visit_fn(void *arg, long lo, long hi, int ith)
{
    struct visit *v = arg;
    if (ith < 0 || ith >= v->n_threads || lo >= hi)
        atomic_fetch_add(&v->bad_ith, 1);
    for (long i = lo; i < hi; i++)
        atomic_fetch_add(&v->count[i], 1);
}

static void check_once(struct sil_threadpool *tp, int nth, long n, long chunk)
{
    struct visit v = {calloc((size_t)n + 1, sizeof(atomic_int)), nth, 0};
    sil_threadpool_for(tp, n, chunk, visit_fn, &v);
    for (long i = 0; i < n; i++)
        if (atomic_load(&v.count[i]) != 1)
            fail_msg("n %ld chunk %ld: item %ld visited %d times", n, chunk, i, atomic_load(&v.count[i]));
    assert_int_equal(atomic_load(&v.bad_ith), 0);
    free(v.count);
}

static void test_cover(void **state)
{
    (void)state;
    for (int nth = 1; nth <= 4; nth++) {
        struct sil_threadpool *tp = NULL;
        assert_int_equal(sil_threadpool_create(&tp, nth), 0);
        assert_int_equal(sil_threadpool_n_threads(tp), nth);
        const long ns[] = {1, 2, 3, 7, 64, 1000, 4097};
        const long chunks[] = {0, 1, 3, 64, 5000};
        for (size_t a = 0; a < sizeof(ns) / sizeof(ns[0]); a++)
            for (size_t b = 0; b < sizeof(chunks) / sizeof(chunks[0]); b++)
                check_once(tp, nth, ns[a], chunks[b]);
        sil_threadpool_free(tp);
    }
    check_once(NULL, 1, 100, 7); /* no pool: the caller does everything */
    assert_int_equal(sil_threadpool_create(&(struct sil_threadpool *){NULL}, 0), -EINVAL);
}

struct sum {
    atomic_long total;
};

static void sum_fn(void *arg, long lo, long hi, int ith)
{
    (void)ith;
    struct sum *s = arg;
    long t = 0;
    for (long i = lo; i < hi; i++)
        t += i;
    atomic_fetch_add(&s->total, t);
}

static void test_many_tasks(void **state)
{
    (void)state;
    struct sil_threadpool *tp = NULL;
    assert_int_equal(sil_threadpool_create(&tp, 2), 0);
    for (int k = 0; k < 20000; k++) {
        struct sum s = {0};
        long n = 1 + k % 97;
        sil_threadpool_for(tp, n, 1, sum_fn, &s);
        if (atomic_load(&s.total) != n * (n - 1) / 2)
            fail_msg("task %d: sum %ld, expected %ld", k, atomic_load(&s.total), n * (n - 1) / 2);
    }
    sil_threadpool_free(tp);
}

static void test_split_range(void **state)
{
    (void)state;
    for (long n = 0; n < 50; n++)
        for (int nth = 1; nth < 7; nth++) {
            long prev = 0;
            for (int i = 0; i < nth; i++) {
                long lo, hi;
                sil_split_range(n, i, nth, &lo, &hi);
                assert_int_equal(lo, prev);
                assert_true(hi - lo == n / nth || hi - lo == n / nth + 1);
                prev = hi;
            }
            assert_int_equal(prev, n);
        }
}

struct pages {
    const volatile char *base;
    long page;
    atomic_long sum, done;
};

static void read_pages(void *arg, long lo, long hi, int ith)
{
    struct pages *p = arg;
    for (long i = lo; i < hi; i++) {
        atomic_fetch_add(&p->sum, p->base[i * p->page]);
        atomic_fetch_add(&p->done, 1);
    }
}

/* A file truncated under its mapping: the pool's threads and the caller fault (SIGBUS) reading
 * it; each fault is caught, the task ends, the pool says it faulted and skips later tasks until
 * cleared. Without the guard the process would die here. */
static void test_mapping_fault(void **state)
{
    char path[] = "/tmp/test_threadpool.XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    const long page = sysconf(_SC_PAGESIZE), n_pages = 256;
    assert_int_equal(ftruncate(fd, page * n_pages), 0);
    char *map = mmap(NULL, (size_t)(page * n_pages), PROT_READ, MAP_PRIVATE, fd, 0);
    assert_true(map != MAP_FAILED);
    int slot = sil_mapguard_register(map, (size_t)(page * n_pages));
    assert_true(slot >= 0);
    struct sil_threadpool *tp;
    assert_int_equal(sil_threadpool_create(&tp, 4), 0);
    struct pages p = {.base = map, .page = page};
    sil_threadpool_for(tp, n_pages, 1, read_pages, &p);
    assert_int_equal(atomic_load(&p.done), n_pages);
    assert_false(sil_threadpool_faulted(tp));
    assert_int_equal(sil_mapguard_faults(slot, NULL), 0);

    assert_int_equal(ftruncate(fd, page), 0); /* every page past the first now faults */
    atomic_store(&p.done, 0);
    sil_threadpool_for(tp, n_pages, 1, read_pages, &p);
    assert_true(sil_threadpool_faulted(tp));
    size_t off = 0;
    assert_true(sil_mapguard_faults(slot, &off) >= 1);
    assert_true(off >= (size_t)page && off < (size_t)(page * n_pages));
    assert_true(atomic_load(&p.done) < n_pages);
    /* skipped while the fault stands, run again once cleared (on pages that still exist) */
    atomic_store(&p.done, 0);
    sil_threadpool_for(tp, 64, 1, read_pages, &p);
    assert_int_equal(atomic_load(&p.done), 0);
    sil_threadpool_clear_fault(tp);
    p.page = 0; /* every item reads page 0, which is still in the file */
    sil_threadpool_for(tp, 64, 1, read_pages, &p);
    assert_int_equal(atomic_load(&p.done), 64);
    assert_false(sil_threadpool_faulted(tp));

    /* the caller's own guard point catches a fault outside the pool */
    struct sil_mapguard_point pt;
    volatile int caught = 0;
    sil_mapguard_push(&pt);
    if (sigsetjmp(pt.jb, 0)) {
        caught = 1;
    } else {
        (void)*(const volatile char *)(map + 3 * page);
        sil_mapguard_pop(&pt);
    }
    assert_int_equal(caught, 1);

    sil_threadpool_free(tp);
    sil_mapguard_unregister(slot);
    munmap(map, (size_t)(page * n_pages));
    close(fd);
    unlink(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cover),
        cmocka_unit_test(test_many_tasks),
        cmocka_unit_test(test_split_range),
        cmocka_unit_test(test_mapping_fault),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
