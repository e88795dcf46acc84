/* CPU feature dispatch: detects the SIMD level once (CPUID through the compiler's builtins,
 * which also check that the OS saves the wide registers), lets SIL_CPU_LEVEL cap it, and points
 * the type_traits table at that level's kernels. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/quants.h"
#include "kernels/cpu/quants_impl.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;
static enum sil_cpu_level detected;
static enum sil_cpu_level cap; /* from SIL_CPU_LEVEL; detected when unset */
static enum sil_cpu_level current;

static enum sil_cpu_level detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma") ||
        !__builtin_cpu_supports("f16c"))
        return SIL_CPU_SCALAR;
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq"))
        return SIL_CPU_AVX2;
    if (!__builtin_cpu_supports("avx512vnni"))
        return SIL_CPU_AVX512;
    return SIL_CPU_AVX512_VNNI;
#else
    return SIL_CPU_SCALAR;
#endif
}

static void init_once(void)
{
    detected = detect();
    cap = detected;
    const char *env = getenv("SIL_CPU_LEVEL");
    if (env && *env) {
        /* unknown text leaves the detected level: a typo must not slow a run down silently
         * to scalar, nor raise it above what the CPU has */
        if (strcmp(env, "scalar") == 0)
            cap = SIL_CPU_SCALAR;
        else if (strcmp(env, "avx2") == 0)
            cap = SIL_CPU_AVX2;
        else if (strcmp(env, "avx512") == 0 || strcmp(env, "avx512_vnni") == 0)
            cap = SIL_CPU_AVX512_VNNI;
        if (cap > detected)
            cap = detected;
    }
    current = cap;
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
    current = level < cap ? level : cap;
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
