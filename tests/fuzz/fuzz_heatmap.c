/* Fuzz target for the expert heat map loader: any bytes, parsed with and without an expected
 * shape and model; when accepted, the map is walked (hottest order checked) and imported into an
 * expert cache of its shape, whose lookups must then work. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/engine/expert_cache.h"
#include "daemon/engine/expert_heat.h"

static void walk(const struct sil_heat_map *m)
{
    const int64_t n_key = (int64_t)m->n_layer * m->n_expert;
    int32_t *keys = malloc((size_t)n_key * sizeof(int32_t));
    if (!keys) return;
    const int64_t n = sil_heat_map_hottest(m, keys, n_key);
    if (n < 0 || n > n_key) abort();
    for (int64_t i = 0; i < n; i++) {
        if (keys[i] < 0 || keys[i] >= n_key || !(m->heat[keys[i]] > 0)) abort();
        if (i > 0 && m->heat[keys[i - 1]] < m->heat[keys[i]]) abort();
    }
    if (m->n_layer <= 4096 && m->n_expert <= 65536 && n_key <= 1 << 16) {
        struct sil_ecache_config c = {.n_layer = (int32_t)m->n_layer,
                                      .n_expert = (int32_t)m->n_expert,
                                      .n_slot = (int32_t)(n_key / 2),
                                      .policy = SIL_ECACHE_LFU};
        struct sil_ecache *e;
        struct sil_error err;
        if (sil_ecache_create(&e, &c, &err) == 0) {
            sil_ecache_heat_import(e, m->heat);
            for (int64_t i = 0; i < n && i < 64; i++)
                sil_ecache_preload(e, keys[i] / (int32_t)m->n_expert,
                                   keys[i] % (int32_t)m->n_expert);
            struct sil_ecache_entry r;
            for (int64_t i = 0; i < n && i < 64; i++) {
                const int32_t x = keys[n - 1 - i] % (int32_t)m->n_expert;
                if (sil_ecache_lookup(e, keys[n - 1 - i] / (int32_t)m->n_expert, &x, NULL, 1, &r) <
                    0)
                    abort();
            }
            sil_ecache_free(e);
        }
    }
    free(keys);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sil_heat_map m;
    struct sil_error err;
    if (sil_heat_map_parse(data, size, "fuzz", 0, 0, 0, &m, &err) == 0) {
        if (!m.heat) abort();
        walk(&m);
        sil_heat_map_free(&m);
    } else if (m.heat) {
        abort();
    }
    if (sil_heat_map_parse(data, size, "fuzz", 42, 2, 4, &m, &err) == 0) sil_heat_map_free(&m);
    return 0;
}
