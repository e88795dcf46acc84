/* Byte sizes as users write them ("8G", "512MiB", "100"): shared by siliceod's options and
 * configuration and the tools' command lines. */
#ifndef SIL_SIZE_H
#define SIL_SIZE_H

#include <stdint.h>

/* "4G" -> 4 << 30 (K, M, G, T are powers of 1024; an optional "i" and "B" after them);
 * -EINVAL for anything else, -ERANGE past 64 bits. */
int sil_parse_size(const char *s, uint64_t *out);
/* bytes for a person: "12.34 GiB", "640.0 MiB", "2.5 KiB", "512 B" (into buf, which is returned). */
const char *sil_size_str(uint64_t bytes, char *buf, unsigned size);

#endif
