/* Models by name: the GGUF files of the models directory (models_dir, by default the state
 * directory's models/), each named by its file name without ".gguf", plus the default model
 * (the `model` setting) when it lives elsewhere. A name a client sends is checked before any
 * path is made of it: it can never name a file outside the directory.
 *
 * Ownership: lists are malloc'd arrays freed with sil_models_free. No state; any thread. */
#ifndef SIL_DAEMON_MODELS_H
#define SIL_DAEMON_MODELS_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/config.h"

#define SIL_MODEL_NAME_MAX 128 /* bytes of a name, without the NUL */

struct sil_model_entry {
    char name[SIL_MODEL_NAME_MAX + 1];
    char path[PATH_MAX];
    uint64_t size; /* bytes of the file */
};

/* A name is 1 to SIL_MODEL_NAME_MAX bytes of letters, digits and . _ - + : @ starting with a
 * letter or a digit (so no '/', no "..", no hidden file, no space). */
bool sil_model_name_valid(const char *name, size_t len);

/* The name a file is listed under: its last path component without ".gguf"; false when that is
 * not a valid name (or the file does not end in .gguf). */
bool sil_model_name_of(const char *path, char *out, size_t size);

/* The models directory: models_dir, else STATE/models; -ENOENT when there is no state
 * directory either. *explicit_dir says whether models_dir named it. */
int sil_models_dir(const struct sil_config *c, char *out, size_t size, bool *explicit_dir);

/* The regular files (symlinks followed) of dir whose names are valid, sorted by name, then the
 * default model (may be "" or NULL) when its name is not among them. A missing directory is an
 * empty list. 0 or -errno (-ENOMEM). */
int sil_models_list(const char *dir, const char *default_path, struct sil_model_entry **out,
                    size_t *n);
void sil_models_free(struct sil_model_entry *list);

/* The file name (or NAME.gguf) names: 0 and path, -EINVAL for an invalid name, -ENOENT for no
 * such model (why says which, in both cases). */
int sil_models_resolve(const char *dir, const char *default_path, const char *name, size_t len,
                       char *path, size_t path_size, char *why, size_t why_size);

#endif
