/* Expert heat map: the decayed use count of every (layer, expert), kept across restarts so the
 * hottest experts can be preloaded into the expert cache at start.
 *
 * File (little-endian), written whole to a temporary file in the same directory, fsynced and
 * renamed over the old one, so a reader sees the old map or the new one, never a mix:
 *   0  char[8]  "SILHEAT\0"
 *   8  u32      version (1)
 *   12 u32      n_layer
 *   16 u32      n_expert
 *   20 u32      0 (reserved)
 *   24 u64      model identity (sil_heat_model_id)
 *   32 u64      tokens observed
 *   40 f32      heat[n_layer * n_expert], layer-major, finite and >= 0
 *   ..  u64     FNV-1a 64 of every byte before it
 * A file that is short, long, of another version or model or shape, or whose checksum or values
 * are wrong is refused with -EINVAL and a message naming the field and offset: the caller warns
 * and starts cold. Ownership: a loaded map owns heat until sil_heat_map_free. */
#ifndef SIL_EXPERT_HEAT_H
#define SIL_EXPERT_HEAT_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/error.h"

#define SIL_HEAT_VERSION 1u
#define SIL_HEAT_MAX_KEYS (1u << 24) /* n_layer * n_expert */

struct sil_model;

struct sil_heat_map {
    uint32_t n_layer, n_expert;
    uint64_t model_id;
    uint64_t tokens;
    float *heat; /* [n_layer * n_expert] */
};

/* Identity of a model for its heat map: a hash of the hyperparameters that shape the experts
 * and of the tensor table (names, types, shapes, offsets), so a re-quantized or other model of
 * the same name does not match. */
uint64_t sil_heat_model_id(const struct sil_model *m);

/* The map's file name in the state directory: "expert-heat-", general.name made safe for a
 * file name (lower-case letters, digits, '.', '-'; at most 32 bytes; "model" without one), '-',
 * then 16 hex digits hashing the model's identity (above) with its whole general.name. Both
 * come from the file's contents, so a copy or a rename of the model finds its map, and models of
 * another name, shape, quantization or tensor layout keep maps of their own. -ENAMETOOLONG when
 * size is short. */
#define SIL_HEAT_FILE_PREFIX "expert-heat-"
int sil_heat_file_name(const struct sil_model *m, char *out, size_t size);

/* 0, or -errno with the path and the failing step (the old file, if any, is left as it was). */
int sil_heat_map_save(const char *path, const struct sil_heat_map *m, struct sil_error *err);

/* Loads path and checks it against the expected identity and shape. 0; -ENOENT when there is
 * none; -EINVAL when it is corrupt or does not match; -ENOMEM; -errno of a read. */
int sil_heat_map_load(const char *path, uint64_t model_id, uint32_t n_layer, uint32_t n_expert,
                      struct sil_heat_map *out, struct sil_error *err);
/* The same on bytes in memory (name labels messages); model_id 0 or n_layer / n_expert 0 accept
 * any (the fuzz target parses unknown files). */
int sil_heat_map_parse(const void *buf, size_t len, const char *name, uint64_t model_id,
                       uint32_t n_layer, uint32_t n_expert, struct sil_heat_map *out,
                       struct sil_error *err);
void sil_heat_map_free(struct sil_heat_map *m);

/* keys[0..n) = the n hottest keys (layer * n_expert + expert), hottest first, ties to the lower
 * key; n is clamped to the number of keys with heat > 0, and returned. */
int64_t sil_heat_map_hottest(const struct sil_heat_map *m, int32_t *keys, int64_t n);

#endif
