/* The models directory (models.h): names, the listing and a name's file. */
#include "daemon/models.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kernels/vec.h"

static const char suffix[] = ".gguf";
#define SUFFIX_LEN (sizeof suffix - 1)

bool sil_model_name_valid(const char *name, size_t len)
{
    if (len == 0 || len > SIL_MODEL_NAME_MAX || !isalnum((unsigned char)name[0])) return false;
    for (size_t i = 0; i < len; i++) {
        const unsigned char ch = (unsigned char)name[i];
        if (ch >= 0x80 || !(isalnum(ch) || strchr("._-+:@", ch)) || ch == 0) return false;
    }
    return true;
}

bool sil_model_name_of(const char *path, char *out, size_t size)
{
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const size_t n = strlen(base);
    if (n <= SUFFIX_LEN || strcmp(base + n - SUFFIX_LEN, suffix) != 0) return false;
    const size_t len = n - SUFFIX_LEN;
    if (!sil_model_name_valid(base, len) || len >= size) return false;
    memcpy(out, base, len);
    out[len] = 0;
    return true;
}

int sil_models_dir(const struct sil_config *c, char *out, size_t size, bool *explicit_dir)
{
    *explicit_dir = c->models_dir[0] != 0;
    if (*explicit_dir)
        return snprintf(out, size, "%s", c->models_dir) < (int)size ? 0 : -ENAMETOOLONG;
    char state[PATH_MAX];
    const int rc = sil_config_state_dir(c, state, sizeof state);
    if (rc < 0) return rc;
    return snprintf(out, size, "%s/models", state) < (int)size ? 0 : -ENAMETOOLONG;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const struct sil_model_entry *)a)->name,
                  ((const struct sil_model_entry *)b)->name);
}

/* A regular file (after symlinks) at path: its size, else -errno. */
static int file_size(const char *path, uint64_t *size)
{
    struct stat st;
    if (stat(path, &st) < 0) return -errno;
    if (!S_ISREG(st.st_mode)) return -EISDIR;
    *size = (uint64_t)st.st_size;
    return 0;
}

static int push(struct sil_model_entry **list, size_t *n, size_t *cap, const char *name,
                const char *path, uint64_t size)
{
    if (sil_vec_reserve(list, cap, *n + 1, 16) < 0) return -ENOMEM;
    struct sil_model_entry *e = &(*list)[(*n)++];
    snprintf(e->name, sizeof e->name, "%s", name);
    snprintf(e->path, sizeof e->path, "%s", path);
    e->size = size;
    return 0;
}

int sil_models_list(const char *dir, const char *default_path, struct sil_model_entry **out,
                    size_t *n_out)
{
    struct sil_model_entry *list = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    DIR *d = dir && dir[0] ? opendir(dir) : NULL;
    for (struct dirent *de; d && (de = readdir(d));) {
        char name[SIL_MODEL_NAME_MAX + 1], path[PATH_MAX];
        uint64_t size = 0;
        if (!sil_model_name_of(de->d_name, name, sizeof name) ||
            snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path ||
            file_size(path, &size) < 0)
            continue;
        if ((rc = push(&list, &n, &cap, name, path, size)) < 0) break;
    }
    if (d) closedir(d);
    if (n) qsort(list, n, sizeof *list, by_name);
    char name[SIL_MODEL_NAME_MAX + 1];
    uint64_t size = 0;
    if (rc == 0 && default_path && default_path[0] &&
        sil_model_name_of(default_path, name, sizeof name)) {
        bool listed = false;
        for (size_t i = 0; i < n && !listed; i++) listed = strcmp(list[i].name, name) == 0;
        if (!listed && file_size(default_path, &size) == 0)
            rc = push(&list, &n, &cap, name, default_path, size);
    }
    if (rc < 0) {
        free(list);
        return rc;
    }
    *out = list;
    *n_out = n;
    return 0;
}

void sil_models_free(struct sil_model_entry *list) { free(list); }

int sil_models_resolve(const char *dir, const char *default_path, const char *name, size_t len,
                       char *path, size_t path_size, char *why, size_t why_size)
{
    if (len > SUFFIX_LEN && memcmp(name + len - SUFFIX_LEN, suffix, SUFFIX_LEN) == 0)
        len -= SUFFIX_LEN;
    if (!sil_model_name_valid(name, len)) {
        snprintf(why, why_size,
                 "'%.*s' is not a model name (letters, digits and . _ - + : @, at most %d bytes, "
                 "starting with a letter or a digit)",
                 (int)(len < 64 ? len : 64), name, SIL_MODEL_NAME_MAX);
        return -EINVAL;
    }
    uint64_t size = 0;
    if (dir && dir[0] &&
        snprintf(path, path_size, "%s/%.*s%s", dir, (int)len, name, suffix) < (int)path_size &&
        file_size(path, &size) == 0)
        return 0;
    char dname[SIL_MODEL_NAME_MAX + 1];
    if (default_path && default_path[0] && sil_model_name_of(default_path, dname, sizeof dname) &&
        strlen(dname) == len && memcmp(dname, name, len) == 0) {
        snprintf(path, path_size, "%s", default_path);
        return 0;
    }
    snprintf(why, why_size, "no model named '%.*s'", (int)len, name);
    return -ENOENT;
}
