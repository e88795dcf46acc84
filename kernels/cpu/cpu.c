/* CPU feature dispatch: detects the SIMD level once (CPUID, and XGETBV for whether the OS saves
 * the wide registers) and points the type_traits table at that level's kernels, or a lower one
 * sil_cpu_force_level asks for (tests; SIL_CPU_LEVEL through sil_dev_switches_read). */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_impl.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static enum sil_cpu_level detected;
static enum sil_cpu_level current;

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* Which register states the OS saves (XCR0): the wide registers are usable only if it does. */
static uint64_t xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (uint64_t)hi << 32 | lo;
}
#endif

/* CPUID by hand rather than __builtin_cpu_supports: clang does not know every feature name
 * (f16c), and the fuzz build compiles this file with clang. */
static enum sil_cpu_level detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return SIL_CPU_SCALAR;
    const bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28),
               f16c = c & (1u << 29);
    if (!osxsave || !avx)
        return SIL_CPU_SCALAR;
    const uint64_t xcr = xcr0();
    if ((xcr & 0x6) != 0x6) /* XMM and YMM state */
        return SIL_CPU_SCALAR;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return SIL_CPU_SCALAR;
    const bool avx2 = b & (1u << 5), avx512f = b & (1u << 16), avx512dq = b & (1u << 17),
               avx512bw = b & (1u << 30), avx512vl = b & (1u << 31), vnni = c & (1u << 11);
    if (!avx2 || !fma || !f16c)
        return SIL_CPU_SCALAR;
    if (!avx512f || !avx512dq || !avx512bw || !avx512vl || (xcr & 0xe0) != 0xe0) /* opmask, ZMM */
        return SIL_CPU_AVX2;
    return vnni ? SIL_CPU_AVX512_VNNI : SIL_CPU_AVX512;
#else
    return SIL_CPU_SCALAR;
#endif
}

static void init_once(void)
{
    detected = detect();
    current = detected;
    sil_quants_set_level(current);
}

void sil_cpu_init(void)
{
    pthread_once(&once, init_once);
}

enum sil_cpu_level sil_cpu_detected_level(void)
{
    sil_cpu_init();
    return detected;
}

enum sil_cpu_level sil_cpu_level(void)
{
    sil_cpu_init();
    return current;
}

enum sil_cpu_level sil_cpu_force_level(enum sil_cpu_level level)
{
    sil_cpu_init();
    current = level < detected ? level : detected;
    if (current < SIL_CPU_SCALAR)
        current = SIL_CPU_SCALAR;
    sil_quants_set_level(current);
    return current;
}

const char *sil_cpu_level_name(enum sil_cpu_level level)
{
    switch (level) {
    case SIL_CPU_SCALAR:
        return "scalar";
    case SIL_CPU_AVX2:
        return "avx2";
    case SIL_CPU_AVX512:
        return "avx512";
    case SIL_CPU_AVX512_VNNI:
        return "avx512_vnni";
    }
    return "unknown";
}
