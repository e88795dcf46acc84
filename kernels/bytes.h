/* Little-endian integers in byte buffers and the 64-bit FNV-1a hash: what the daemon's files
 * (the expert heat map, saved sessions) are written and checked with. */
#ifndef SIL_BYTES_H
#define SIL_BYTES_H

#include <stddef.h>
#include <stdint.h>

#define SIL_FNV_INIT 0xcbf29ce484222325ull

/* h folded with n bytes of p (start from SIL_FNV_INIT) */
static inline uint64_t sil_fnv1a(uint64_t h, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static inline void sil_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void sil_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint32_t sil_get_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t sil_get_le64(const uint8_t *p)
{
    return (uint64_t)sil_get_le32(p) | (uint64_t)sil_get_le32(p + 4) << 32;
}

#endif
