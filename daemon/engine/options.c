/* The engine's settings from outside: the CUDA backend's user options by their siliceod.conf(5)
 * keys (parsed the same for the file, siliceod's flags and sil-eval's), and the developer
 * switches of siliceo-dev(7), read from the environment here and nowhere else. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "daemon/engine/engine.h"
#include "kernels/cpu/quants.h"

/* on / off and their usual spellings; -1 for anything else */
static int on_off(const char *v)
{
    static const char *const on[] = {"on", "yes", "true", "1"};
    static const char *const off[] = {"off", "no", "false", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, on[i]) == 0) return 1;
        if (strcasecmp(v, off[i]) == 0) return 0;
    }
    return -1;
}

/* A decimal number in [0, 1]: digits with at most one point, nothing else. */
static int share_of(const char *v, double *out)
{
    int digits = 0, points = 0;
    for (const char *p = v; *p; p++) {
        if (*p >= '0' && *p <= '9')
            digits++;
        else if (!(*p == '.' && points++ == 0))
            return -EINVAL;
    }
    if (digits == 0 || digits > 15) return -EINVAL;
    const double x = strtod(v, NULL);
    if (!(x >= 0 && x <= 1)) return -ERANGE;
    *out = x;
    return 0;
}

int sil_cuda_option_set(struct sil_cuda_options *o, const char *key, const char *val, char *why,
                        size_t why_size)
{
    if (strcmp(key, "cuda_graphs") == 0 || strcmp(key, "cuda_zero_copy") == 0) {
        const int v = on_off(val);
        if (v < 0) {
            snprintf(why, why_size, "expected on or off");
            return -EINVAL;
        }
        if (key[5] == 'g')
            o->no_graphs = !v;
        else
            o->zero_copy = v;
        return 0;
    }
    if (strcmp(key, "cuda_pin") == 0) {
        const int v = strcasecmp(val, "auto") == 0 ? 2 : on_off(val);
        if (v < 0) {
            snprintf(why, why_size, "expected auto, on or off");
            return -EINVAL;
        }
        o->pin = v == 2 ? SIL_CUDA_PIN_AUTO : v ? SIL_CUDA_PIN_ON : SIL_CUDA_PIN_OFF;
        return 0;
    }
    if (strcmp(key, "cuda_cpu_share") == 0) {
        double share = 0;
        if (strcasecmp(val, "auto") == 0) {
            o->cpu_off = false;
            o->cpu_share = 0;
        } else if (strcasecmp(val, "off") == 0) {
            o->cpu_off = true;
            o->cpu_share = 0;
        } else if (share_of(val, &share) == 0) {
            o->cpu_off = share == 0;
            o->cpu_share = share;
        } else {
            snprintf(why, why_size, "expected auto, off or a number in [0, 1]");
            return -EINVAL;
        }
        return 0;
    }
    return -ENOENT;
}

/* NAME=value in the environment */
static bool env_is(const char *name, const char *value)
{
    const char *v = getenv(name);
    return v && strcmp(v, value) == 0;
}

/* NAME=N with N > 0, else 0 */
static long long env_count(const char *name)
{
    const char *v = getenv(name);
    char *end = NULL;
    const long long n = v ? strtoll(v, &end, 10) : 0;
    return v && end != v && n > 0 ? n : 0;
}

/* Each switch given changes its field; one not given leaves it as it was. */
void sil_dev_switches_read(struct sil_engine_params *p)
{
    struct sil_cuda_options *o = &p->cuda;
    const char *v;
    long long n;
    /* tests */
    if ((v = getenv("SIL_CUDA_DRIVER")) && *v) o->driver = v;
    if ((n = env_count("SIL_CUDA_SLOTS"))) o->slots = n;
    if ((n = env_count("SIL_CUDA_ATTN_SPLIT"))) o->attn_split = (int32_t)n;
    if ((n = env_count("SIL_CUDA_SCORES_ROWS"))) o->scores_rows = (int32_t)n;
    if ((n = env_count("SIL_CUDA_INJECT_OOM"))) o->inject_oom = (uint64_t)n;
    if ((v = getenv("SIL_TEST_ATTN_NOISE"))) {
        const float r = strtof(v, NULL);
        p->test_attn_noise = r > 0.0f && r < 0.1f ? r : 0.0f;
    }
    /* CPU backend */
    if ((v = getenv("SIL_CPU_LEVEL")) && *v) {
        /* unknown text leaves the detected level: a typo must not slow a run down silently to
         * scalar (sil_cpu_force_level never goes above what the CPU has) */
        if (strcmp(v, "scalar") == 0)
            sil_cpu_force_level(SIL_CPU_SCALAR);
        else if (strcmp(v, "avx2") == 0)
            sil_cpu_force_level(SIL_CPU_AVX2);
        else if (strcmp(v, "avx512") == 0 || strcmp(v, "avx512_vnni") == 0)
            sil_cpu_force_level(SIL_CPU_AVX512_VNNI);
    }
    if ((v = getenv("SIL_CPU_PROFILE")) && *v) p->cpu_profile = v;
    /* CUDA backend: paths compared with the default, and what it measures */
    if ((n = env_count("SIL_CUDA_CPU_MISSES"))) o->cpu_misses = (int32_t)n;
    /* 0: none (as cuda_cpu_share = off), which the backend's message at start names */
    if (env_is("SIL_CUDA_CPU_MISSES", "0")) o->cpu_off = true;
    if ((n = env_count("SIL_CUDA_UBATCH"))) o->ubatch = (int32_t)n;
    if ((n = env_count("SIL_CUDA_GROUPED_BN"))) o->grouped_bn = (int32_t)n;
    if ((n = env_count("SIL_CUDA_PREFILL_SPLIT"))) o->prefill_split = (int32_t)n;
    o->host_route = o->host_route || env_is("SIL_CUDA_HOST_ROUTE", "1");
    o->no_grouped = o->no_grouped || env_is("SIL_CUDA_GROUPED", "0");
    o->no_shared_fuse = o->no_shared_fuse || env_is("SIL_CUDA_NO_SHARED_FUSE", "1");
    o->no_norm_router = o->no_norm_router || env_is("SIL_CUDA_NO_NORM_ROUTER", "1");
    o->no_attn_q8 = o->no_attn_q8 || env_is("SIL_CUDA_NO_ATTN_Q8", "1");
    o->no_conv_fuse = o->no_conv_fuse || env_is("SIL_CUDA_NO_CONV_FUSE", "1");
    o->no_mv_mix = o->no_mv_mix || env_is("SIL_CUDA_NO_MV_MIX", "1");
    o->no_gqa = o->no_gqa || env_is("SIL_CUDA_NO_GQA", "1");
    o->no_flash = o->no_flash || env_is("SIL_CUDA_NO_FLASH", "1");
    if ((n = env_count("SIL_CUDA_FLASH_FROM"))) o->flash_from = (int32_t)n;
    o->no_dn_fuse = o->no_dn_fuse || env_is("SIL_CUDA_NO_DN_FUSE", "1");
    o->no_router_fuse = o->no_router_fuse || env_is("SIL_CUDA_NO_ROUTER_FUSE", "1");
    o->no_h8_fuse = o->no_h8_fuse || env_is("SIL_CUDA_NO_H8_FUSE", "1");
    o->no_pdl = o->no_pdl || env_is("SIL_CUDA_PDL", "0");
    o->no_prefetch = o->no_prefetch || env_is("SIL_CUDA_PREFETCH", "0");
    /* benchmarks */
    if ((v = getenv("SIL_BENCH_H2D_GBS"))) o->h2d_cap_gbs = atof(v);
    if ((v = getenv("SIL_CUDA_PROFILE")) && *v) o->profile = v;
    if ((n = env_count("SIL_CUDA_PROFILE_ROWS"))) o->profile_rows = (int32_t)n;
}
