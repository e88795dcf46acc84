/* Growable arrays: the caller keeps a pointer, a count and a capacity (size_t, in items);
 * sil_vec_reserve makes room. The capacity doubles, from a first size when the array is empty,
 * until what is asked for fits, so n pushes cost O(n) copies in all.
 *
 * Ownership: the array is the caller's, allocated with realloc and freed with free. */
#ifndef SIL_VEC_H
#define SIL_VEC_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Room for need items of elem bytes in *p, which holds *cap: when need > *cap, the capacity
 * becomes *cap (min_cap when 0) doubled until it holds need, and *p is reallocated. 0, or
 * -ENOMEM (out of memory, or need items would not fit in a size_t of bytes) with *p and *cap
 * as they were. */
static inline int sil_vec_grow(void **p, size_t *cap, size_t need, size_t elem, size_t min_cap)
{
    if (need <= *cap)
        return 0;
    const size_t max = SIZE_MAX / elem;
    if (need > max)
        return -ENOMEM;
    size_t c = *cap ? *cap : min_cap ? min_cap : 1;
    while (c < need)
        c = c > max / 2 ? need : 2 * c;
    if (c > max)
        c = need;
    void *q = realloc(*p, c * elem);
    if (!q)
        return -ENOMEM;
    *p = q;
    *cap = c;
    return 0;
}

/* sil_vec_reserve(&v, &cap, need, min_cap) for any T *v and size_t cap: sil_vec_grow with
 * elem = sizeof(T); v keeps its type. Evaluates each argument once. */
#define sil_vec_reserve(pv, pcap, need, min_cap)                                                  \
    __extension__({                                                                               \
        __typeof__(*(pv)) *sil_vec_pv_ = (pv);                                                    \
        void *sil_vec_p_ = *sil_vec_pv_;                                                          \
        int sil_vec_rc_ =                                                                         \
            sil_vec_grow(&sil_vec_p_, (pcap), (need), sizeof **sil_vec_pv_, (min_cap));           \
        *sil_vec_pv_ = sil_vec_p_;                                                                \
        sil_vec_rc_;                                                                              \
    })

#endif
