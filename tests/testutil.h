/* Shared helpers for the cmocka tests: reference data paths, temporary directories, whole-file
 * I/O, and a raw GGUF byte builder for writing valid and deliberately broken files.
 *
 * Ownership: every char * returned is malloc'd and freed by the caller; a struct tu_buf owns its
 * bytes until tu_buf_free. Helpers that cannot fail usefully (out of memory) abort the test. */
#ifndef SIL_TESTUTIL_H
#define SIL_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* $SHARED, or "../shared" relative to the working directory when unset. Static storage. */
const char *tu_shared_dir(void);
/* "$SHARED/refdata/<rel>" (malloc'd). */
char *tu_refdata_path(const char *rel);
/* Opens the reference model models/<name>.gguf with p's settings (p->model_path is set to it
 * for the call and cleared after): sil_engine_open's result, err saying why. */
struct sil_engine;
struct sil_engine_params;
struct sil_error;
int tu_open_refdata_engine(struct sil_engine **e, const char *name, struct sil_engine_params *p,
                           struct sil_error *err);
/* True if the reference file exists (tests call tu_skip_no_refdata() when it is missing). */
bool tu_refdata_exists(const char *rel);
/* True when the environment has CI=true (or CI=1): a CI run must have the reference data. */
bool tu_ci(void);
/* skip() for a test whose reference data is missing, but a failure under CI=true, so a CI machine
 * without refdata cannot pass by skipping. Needs <cmocka.h>. */
#define tu_skip_no_refdata()                                                                       \
    do {                                                                                           \
        if (tu_ci())                                                                               \
            fail_msg("reference data missing under %s/refdata (CI=true)", tu_shared_dir());        \
        skip();                                                                                    \
    } while (0)

/* A fresh directory under $TMPDIR (or /tmp), malloc'd path; NULL on failure. */
char *tu_tmpdir_create(void);
/* Removes dir and everything under it; 0 or -errno. */
int tu_tmpdir_remove(const char *dir);
/* "dir/name" (malloc'd). */
char *tu_path_join(const char *dir, const char *name);

/* A private copy of the reference file rel at dir/name, for tests that change it (truncate,
 * replace): its path (malloc'd), NULL when it cannot be copied. */
char *tu_refdata_copy(const char *rel, const char *dir, const char *name);

/* Reads a whole file into a malloc'd buffer (NUL-terminated one past len for text use). */
int tu_read_file(const char *path, void **buf, size_t *len);
int tu_write_file(const char *path, const void *buf, size_t len);

/* A growable byte buffer. Zero-initialize it: struct tu_buf b = {0}; */
struct tu_buf {
    uint8_t *p;
    size_t len, cap;
};
void tu_buf_free(struct tu_buf *b);
void tu_put_bytes(struct tu_buf *b, const void *p, size_t n);
void tu_put_zeros(struct tu_buf *b, size_t n);
void tu_put_u8(struct tu_buf *b, uint8_t v);
void tu_put_u16(struct tu_buf *b, uint16_t v);
void tu_put_u32(struct tu_buf *b, uint32_t v);
void tu_put_u64(struct tu_buf *b, uint64_t v);
void tu_put_i32(struct tu_buf *b, int32_t v);
void tu_put_i64(struct tu_buf *b, int64_t v);
void tu_put_f32(struct tu_buf *b, float v);
void tu_put_f64(struct tu_buf *b, double v);
/* GGUF string: u64 length + bytes (no NUL). tu_put_strn takes explicit bytes (may be invalid). */
void tu_put_str(struct tu_buf *b, const char *s);
void tu_put_strn(struct tu_buf *b, const void *s, uint64_t len);
/* Zero bytes up to the next multiple of align (from the start of the buffer). */
void tu_put_pad(struct tu_buf *b, size_t align);
/* Overwrites bytes already written (to break a field after the fact). */
void tu_patch_u32(struct tu_buf *b, size_t off, uint32_t v);
void tu_patch_u64(struct tu_buf *b, size_t off, uint64_t v);

/* GGUF pieces, written in file order: header, n_kv key-values, n_tensors tensor infos,
 * tu_put_pad(b, alignment), then tensor data. Value types are enum sil_gguf_vtype numbers. */
void tu_gguf_header(struct tu_buf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv);
/* Key + value type; the value follows with tu_put_*. */
void tu_gguf_key(struct tu_buf *b, const char *key, uint32_t vtype);
void tu_gguf_kv_u32(struct tu_buf *b, const char *key, uint32_t v);
void tu_gguf_kv_i32(struct tu_buf *b, const char *key, int32_t v);
void tu_gguf_kv_u64(struct tu_buf *b, const char *key, uint64_t v);
void tu_gguf_kv_f32(struct tu_buf *b, const char *key, float v);
void tu_gguf_kv_bool(struct tu_buf *b, const char *key, bool v);
void tu_gguf_kv_str(struct tu_buf *b, const char *key, const char *v);
/* Key + array header (element type, length); the n elements follow with tu_put_*. */
void tu_gguf_kv_arr(struct tu_buf *b, const char *key, uint32_t elem_vtype, uint64_t n);
void tu_gguf_kv_arr_str(struct tu_buf *b, const char *key, const char *const *v, uint64_t n);
void tu_gguf_kv_arr_i32(struct tu_buf *b, const char *key, const int32_t *v, uint64_t n);
void tu_gguf_kv_arr_f32(struct tu_buf *b, const char *key, const float *v, uint64_t n);
/* Tensor info: name, n_dims, ne[0..n_dims), ggml type number, offset in the data section. */
void tu_gguf_tensor_info(struct tu_buf *b, const char *name, uint32_t n_dims, const int64_t *ne,
                         uint32_t type, uint64_t offset);

#endif
