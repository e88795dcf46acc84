#include "daemon/engine/size.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

int sil_parse_size(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    if (!isdigit((unsigned char)*s))
        return -EINVAL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -ERANGE;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': shift = 10; break;
    case 'M': shift = 20; break;
    case 'G': shift = 30; break;
    case 'T': shift = 40; break;
    default: return -EINVAL;
    }
    if (*end) {
        end++;
        if (toupper((unsigned char)*end) == 'I')
            end++;
        if (toupper((unsigned char)*end) == 'B')
            end++;
        if (*end)
            return -EINVAL;
    }
    if (shift && v > (UINT64_MAX >> shift))
        return -ERANGE;
    *out = (uint64_t)v << shift;
    return 0;
}

const char *sil_size_str(uint64_t bytes, char *buf, unsigned size)
{
    if (bytes >= (1ull << 30))
        snprintf(buf, size, "%.2f GiB", (double)bytes / (double)(1ull << 30));
    else if (bytes >= (1ull << 20))
        snprintf(buf, size, "%.1f MiB", (double)bytes / (double)(1ull << 20));
    else if (bytes >= (1ull << 10))
        snprintf(buf, size, "%.1f KiB", (double)bytes / (double)(1ull << 10));
    else
        snprintf(buf, size, "%llu B", (unsigned long long)bytes);
    return buf;
}
