/* A monotonic clock in seconds, for timing work (not wall time). */
#ifndef SIL_CLOCK_H
#define SIL_CLOCK_H

#include <time.h>

static inline double sil_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
