/* GGUF reader: the whole file is mmap'd read-only and tensors are used in place.
 *
 * sil_gguf_open validates everything before returning: header, every metadata key and value
 * (counts and lengths against the file size, UTF-8 keys, known value types), the tensor table
 * (known types, dims, no overflow of the dim product, row length a multiple of the block size,
 * data inside the file, aligned to general.alignment, no overlaps, no duplicate names).
 * After a successful open no accessor can read outside the mapping.
 *
 * Ownership: a struct sil_gguf owns its mapping; every pointer it hands out (names, strings,
 * tensor data, array data) lives until sil_gguf_close. Strings in GGUF are NOT NUL-terminated in
 * the file: accessors return pointer + length (struct sil_str). Keys and tensor names are copied
 * NUL-terminated at open, so they can be used as C strings. */
#ifndef SIL_GGUF_H
#define SIL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/error.h"

#define SIL_GGUF_MAX_DIMS 4
#define SIL_GGUF_DEFAULT_ALIGNMENT 32

enum sil_gguf_vtype {
    SIL_GGUF_UINT8 = 0,
    SIL_GGUF_INT8 = 1,
    SIL_GGUF_UINT16 = 2,
    SIL_GGUF_INT16 = 3,
    SIL_GGUF_UINT32 = 4,
    SIL_GGUF_INT32 = 5,
    SIL_GGUF_FLOAT32 = 6,
    SIL_GGUF_BOOL = 7,
    SIL_GGUF_STRING = 8,
    SIL_GGUF_ARRAY = 9,
    SIL_GGUF_UINT64 = 10,
    SIL_GGUF_INT64 = 11,
    SIL_GGUF_FLOAT64 = 12,
    SIL_GGUF_VTYPE_COUNT
};

struct sil_str {
    const char *ptr; /* not NUL-terminated; points into the mapping */
    uint64_t len;
};

struct sil_gguf_tensor {
    const char *name;              /* NUL-terminated copy */
    uint32_t n_dims;               /* 1..4 */
    int64_t ne[SIL_GGUF_MAX_DIMS]; /* ne[0] is the row length (contiguous); unused dims are 1 */
    int type;                      /* enum sil_type number (kernels/cpu/quants.h) */
    uint64_t offset;               /* relative to the start of the data section */
    uint64_t nbytes;               /* sil_row_size(type, ne[0]) * ne[1] * ne[2] * ne[3] */
    const void *data;              /* inside the mapping */
};

struct sil_gguf;

/* Opens and validates path. On error returns -errno (-EINVAL for a malformed file) and err->msg
 * reads like "model.gguf: tensor 12 'blk.0.attn_q.weight': data [off, off+n) beyond end of file
 * (size S) (offset 0x1234)". */
int sil_gguf_open(struct sil_gguf **out, const char *path, struct sil_error *err);
/* The same on a caller-owned buffer (fuzzing, tests); buf must outlive the result. */
int sil_gguf_open_mem(struct sil_gguf **out, const void *buf, size_t len, const char *name,
                      struct sil_error *err);
void sil_gguf_close(struct sil_gguf *g);

uint32_t sil_gguf_version(const struct sil_gguf *g);
const char *sil_gguf_path(const struct sil_gguf *g);
/* st_dev and st_ino of the mapped file (0, 0 for a buffer): names the inode the mapping keeps. */
void sil_gguf_file_id(const struct sil_gguf *g, uint64_t *dev, uint64_t *ino);
uint64_t sil_gguf_file_size(const struct sil_gguf *g);
uint64_t sil_gguf_alignment(const struct sil_gguf *g);
uint64_t sil_gguf_data_offset(const struct sil_gguf *g); /* start of tensor data in the file */
const void *sil_gguf_base(const struct sil_gguf *g);     /* start of the mapping */

/* Metadata. Keys are looked up by exact name (hash table built at open). */
int64_t sil_gguf_n_kv(const struct sil_gguf *g);
int64_t sil_gguf_find_key(const struct sil_gguf *g, const char *key); /* index or -1 */
const char *sil_gguf_key_name(const struct sil_gguf *g, int64_t i);
enum sil_gguf_vtype sil_gguf_key_type(const struct sil_gguf *g, int64_t i);
enum sil_gguf_vtype sil_gguf_arr_type(const struct sil_gguf *g, int64_t i); /* element type */
uint64_t sil_gguf_arr_len(const struct sil_gguf *g, int64_t i);
/* Element data of a non-string array (little-endian, packed, possibly unaligned). */
const void *sil_gguf_arr_data(const struct sil_gguf *g, int64_t i);
/* Element j of a string array; O(1) (offsets are indexed at open). */
struct sil_str sil_gguf_arr_str(const struct sil_gguf *g, int64_t i, uint64_t j);
const char *sil_gguf_vtype_name(enum sil_gguf_vtype t);

/* Typed getters by key. Integer getters accept any integer type whose value fits the result
 * (a u32 key read with get_u64 is fine; a negative i32 read with get_u32 is -ERANGE).
 * Return 0, -ENOENT if the key is absent, -EINVAL on a type mismatch (err names key and types). */
int sil_gguf_get_u32(const struct sil_gguf *g, const char *key, uint32_t *out, struct sil_error *err);
int sil_gguf_get_u64(const struct sil_gguf *g, const char *key, uint64_t *out, struct sil_error *err);
int sil_gguf_get_i64(const struct sil_gguf *g, const char *key, int64_t *out, struct sil_error *err);
int sil_gguf_get_f32(const struct sil_gguf *g, const char *key, float *out, struct sil_error *err);
int sil_gguf_get_bool(const struct sil_gguf *g, const char *key, bool *out, struct sil_error *err);
int sil_gguf_get_str(const struct sil_gguf *g, const char *key, struct sil_str *out, struct sil_error *err);
/* An array key: element type, length and the key index for the arr_* accessors. */
int sil_gguf_get_arr(const struct sil_gguf *g, const char *key, enum sil_gguf_vtype *elem_type,
                     uint64_t *len, int64_t *index, struct sil_error *err);
/* Element j of an integer/float array converted to the requested type (-ERANGE if it does not fit). */
int sil_gguf_arr_get_i64(const struct sil_gguf *g, int64_t i, uint64_t j, int64_t *out);
int sil_gguf_arr_get_f32(const struct sil_gguf *g, int64_t i, uint64_t j, float *out);

/* Tensors (hash table by name built at open). */
int64_t sil_gguf_n_tensors(const struct sil_gguf *g);
const struct sil_gguf_tensor *sil_gguf_tensor(const struct sil_gguf *g, int64_t i);
const struct sil_gguf_tensor *sil_gguf_find_tensor(const struct sil_gguf *g, const char *name);

#endif
