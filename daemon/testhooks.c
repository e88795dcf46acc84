/* SILICEOD_TEST_HOOKS parsing (testhooks.h). */
#include "daemon/testhooks.h"

#include <stdlib.h>
#include <string.h>

int sil_test_hook(const char *name)
{
    const char *s = getenv("SILICEOD_TEST_HOOKS");
    size_t n = strlen(name);
    while (s && *s) {
        if (strncmp(s, name, n) == 0 && s[n] == '=') {
            long v = strtol(s + n + 1, NULL, 10);
            return v > 0 && v < 1000000 ? (int)v : 0;
        }
        s = strchr(s, ',');
        if (s) s++;
    }
    return 0;
}
