/* Fuzz target for the routing-trace reader: any bytes as a trace; every record it accepts must
 * name layers and experts inside the header's shape. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "daemon/engine/route_trace.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0) return 0;
    FILE *f = fmemopen((void *)data, size, "rb");
    if (!f) return 0;
    struct sil_route_trace t;
    struct sil_error err;
    if (sil_route_trace_fopen(&t, f, "fuzz", &err) < 0) return 0;
    int32_t *sel = malloc((size_t)SIL_ROUTE_TRACE_MAX_ROWS * t.n_used * sizeof(int32_t));
    uint32_t layer, rows;
    while (sel && sil_route_trace_read(&t, &layer, &rows, sel, &err) == 1) {
        if (layer >= t.n_layer || rows == 0 || rows > SIL_ROUTE_TRACE_MAX_ROWS) abort();
        for (uint64_t i = 0; i < (uint64_t)rows * t.n_used; i++)
            if (sel[i] < 0 || (uint32_t)sel[i] >= t.n_expert) abort();
    }
    free(sel);
    fclose(t.f);
    return 0;
}
