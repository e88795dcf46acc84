/* The growable-array helper: capacities double from the first size until the request fits,
 * contents survive growth, a request that fits changes nothing, and one whose byte count would
 * overflow a size_t is refused with the array as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels/vec.h"

struct item {
    int64_t a, b, c; /* 24 bytes: elem comes from the pointer's type */
};

static void test_push_one_at_a_time(void **state)
{
    int32_t *v = NULL;
    size_t n = 0, cap = 0;
    /* the pattern it replaces: cap ? 2 * cap : first, on every full push */
    size_t want_cap = 0;
    for (int32_t i = 0; i < 1000; i++) {
        if (n == want_cap)
            want_cap = want_cap ? 2 * want_cap : 8;
        assert_int_equal(sil_vec_reserve(&v, &cap, n + 1, 8), 0);
        assert_int_equal(cap, want_cap);
        v[n++] = i * 7;
    }
    for (int32_t i = 0; i < 1000; i++)
        assert_int_equal(v[i], i * 7);
    assert_int_equal(cap, 1024);
    free(v);
}

static void test_grow_by_many(void **state)
{
    struct item *v = NULL;
    size_t cap = 0;
    assert_int_equal(sil_vec_reserve(&v, &cap, 3, 4), 0);
    assert_int_equal(cap, 4);
    for (int i = 0; i < 3; i++)
        v[i] = (struct item){i, -i, 2 * i};
    /* doubles until it fits: 4 -> 8 -> 16 -> 32 -> 64 -> 128 */
    assert_int_equal(sil_vec_reserve(&v, &cap, 100, 4), 0);
    assert_int_equal(cap, 128);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(v[i].a, i);
        assert_int_equal(v[i].b, -i);
        assert_int_equal(v[i].c, 2 * i);
    }
    memset(v, 0xab, 128 * sizeof *v); /* all 128 are there (ASan would say otherwise) */
    /* first size under the request: doubled from it */
    char *s = NULL;
    size_t scap = 0;
    assert_int_equal(sil_vec_reserve(&s, &scap, 1000, 256), 0);
    assert_int_equal(scap, 1024);
    free(s);
    free(v);
}

static void test_fits_changes_nothing(void **state)
{
    int32_t *v = NULL;
    size_t cap = 0;
    assert_int_equal(sil_vec_reserve(&v, &cap, 0, 16), 0);
    assert_null(v);
    assert_int_equal(cap, 0);
    assert_int_equal(sil_vec_reserve(&v, &cap, 10, 16), 0);
    int32_t *was = v;
    assert_int_equal(cap, 16);
    assert_int_equal(sil_vec_reserve(&v, &cap, 16, 16), 0);
    assert_ptr_equal(v, was);
    assert_int_equal(cap, 16);
    /* a first size of 0 counts as 1 */
    int32_t *w = NULL;
    size_t wcap = 0;
    assert_int_equal(sil_vec_reserve(&w, &wcap, 1, 0), 0);
    assert_int_equal(wcap, 1);
    assert_int_equal(sil_vec_reserve(&w, &wcap, 3, 0), 0);
    assert_int_equal(wcap, 4);
    free(w);
    free(v);
}

static void test_overflow_refused(void **state)
{
    struct item *v = NULL;
    size_t cap = 0;
    assert_int_equal(sil_vec_reserve(&v, &cap, 2, 2), 0);
    v[1].a = 42;
    struct item *was = v;
    /* need * sizeof(struct item) does not fit a size_t */
    assert_int_equal(sil_vec_reserve(&v, &cap, SIZE_MAX / sizeof *v + 1, 2), -ENOMEM);
    assert_int_equal(sil_vec_reserve(&v, &cap, SIZE_MAX, 2), -ENOMEM);
    assert_ptr_equal(v, was);
    assert_int_equal(cap, 2);
    assert_int_equal(v[1].a, 42);
    /* the untyped form, as the macro calls it */
    void *p = v;
    assert_int_equal(sil_vec_grow(&p, &cap, SIZE_MAX / 3 + 1, 3, 2), -ENOMEM);
    assert_ptr_equal(p, was);
    free(v);
}

static void test_arguments_once(void **state)
{
    int32_t *vs[2] = {NULL, NULL};
    size_t caps[2] = {0, 0};
    int i = 0, j = 0, k = 0;
    assert_int_equal(sil_vec_reserve(&vs[i++], &caps[j++], (size_t)(k++) + 5, 4), 0);
    assert_int_equal(i, 1);
    assert_int_equal(j, 1);
    assert_int_equal(k, 1);
    assert_non_null(vs[0]);
    assert_null(vs[1]);
    assert_int_equal(caps[0], 8);
    assert_int_equal(caps[1], 0);
    free(vs[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_push_one_at_a_time),
        cmocka_unit_test(test_grow_by_many),
        cmocka_unit_test(test_fits_changes_nothing),
        cmocka_unit_test(test_overflow_refused),
        cmocka_unit_test(test_arguments_once),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
