/* Fuzz target for the GGUF reader: open any bytes, and when they are accepted, walk every key,
 * every array element and every tensor, touching the bytes each accessor points at, so that
 * any pointer the reader hands out beyond the input is caught by ASan. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/gguf.h"
#include "kernels/cpu/quants.h"

static volatile uint8_t sink;

static void touch(const void *p, uint64_t n)
{
    const uint8_t *b = p;
    uint8_t acc = 0;
    for (uint64_t i = 0; i < n; i++)
        acc ^= b[i];
    sink ^= acc;
}

static void walk_key(const struct sil_gguf *g, int64_t i)
{
    struct sil_error err;
    const char *key = sil_gguf_key_name(g, i);
    if (!key || sil_gguf_find_key(g, key) != i)
        abort();
    touch(key, strlen(key) + 1);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    bool b;
    struct sil_str s;
    sil_gguf_get_u32(g, key, &u32, &err);
    sil_gguf_get_u64(g, key, &u64, &err);
    sil_gguf_get_i64(g, key, &i64, &err);
    sil_gguf_get_f32(g, key, &f, &err);
    sil_gguf_get_bool(g, key, &b, &err);
    if (sil_gguf_get_str(g, key, &s, &err) == 0)
        touch(s.ptr, s.len);

    enum sil_gguf_vtype et;
    uint64_t n;
    int64_t idx;
    if (sil_gguf_get_arr(g, key, &et, &n, &idx, &err) != 0) {
        if (sil_gguf_key_type(g, i) == SIL_GGUF_ARRAY)
            abort();
        return;
    }
    if (idx != i || sil_gguf_arr_type(g, i) != et || sil_gguf_arr_len(g, i) != n)
        abort();
    if (et == SIL_GGUF_STRING) {
        for (uint64_t j = 0; j < n; j++) {
            struct sil_str e = sil_gguf_arr_str(g, i, j);
            if (!e.ptr)
                abort();
            touch(e.ptr, e.len);
        }
        if (sil_gguf_arr_str(g, i, n).ptr)
            abort();
        return;
    }
    const void *data = sil_gguf_arr_data(g, i);
    if (!data)
        abort();
    static const uint8_t esz[SIL_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    touch(data, n * esz[et]);
    for (uint64_t j = 0; j < n; j++) {
        sil_gguf_arr_get_i64(g, i, j, &i64);
        sil_gguf_arr_get_f32(g, i, j, &f);
    }
}

static void walk_tensor(const struct sil_gguf *g, int64_t i)
{
    const struct sil_gguf_tensor *t = sil_gguf_tensor(g, i);
    if (!t || sil_gguf_find_tensor(g, t->name) != t)
        abort();
    if (t->n_dims < 1 || t->n_dims > SIL_GGUF_MAX_DIMS)
        abort();
    for (int d = 0; d < SIL_GGUF_MAX_DIMS; d++)
        if (t->ne[d] <= 0)
            abort();
    if (sil_row_size(t->type, t->ne[0]) == 0)
        abort();
    const uint8_t *p = t->data;
    const uint8_t *base = sil_gguf_base(g);
    if (p < base || (uint64_t)(p - base) + t->nbytes > sil_gguf_file_size(g))
        abort();
    /* Ends of the data are enough for ASan; the whole tensor would make the fuzzer slow. */
    touch(p, 1);
    touch(p + t->nbytes - 1, 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sil_gguf *g = NULL;
    struct sil_error err;
    int r = sil_gguf_open_mem(&g, data, size, "fuzz.gguf", &err);
    if (r != 0) {
        if (g || err.code != r || err.msg[0] == 0)
            abort();
        return 0;
    }
    for (int64_t i = 0; i < sil_gguf_n_kv(g); i++)
        walk_key(g, i);
    for (int64_t i = 0; i < sil_gguf_n_tensors(g); i++)
        walk_tensor(g, i);
    sil_gguf_close(g);
    return 0;
}
