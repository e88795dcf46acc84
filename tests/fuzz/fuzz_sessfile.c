/* Fuzz target for the saved-session file parser: any bytes; when accepted, the transcript is
 * encoded again and must parse to the same messages (no string holds a NUL, every role is one
 * the format knows). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/sessfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sil_sessfile f, g;
    struct sil_error err;
    if (sil_sessfile_parse(data, size, "fuzz", &f, &err) < 0) return 0;
    uint8_t *b;
    size_t len;
    if (sil_sessfile_encode(f.uid, f.name, f.saved_at, f.msgs, f.n_msgs, &b, &len, &err) < 0)
        abort();
    if (len != size || memcmp(b, data, size) != 0) abort(); /* one encoding per transcript */
    if (sil_sessfile_parse(b, len, "again", &g, &err) < 0 || g.n_msgs != f.n_msgs) abort();
    for (size_t i = 0; i < f.n_msgs; i++)
        if (strcmp(f.msgs[i].role, g.msgs[i].role) || strcmp(f.msgs[i].content, g.msgs[i].content))
            abort();
    sil_sessfile_free(&g);
    sil_sessfile_free(&f);
    free(b);
    return 0;
}
