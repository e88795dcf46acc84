#include "kernels/atomicfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        const ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? -errno : -EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* The rename is durable once the directory holding name is synced; a failure here is not the
 * write's (the new contents are in place), so it is not reported. */
static void sync_dir(int dir_fd, const char *name)
{
    const char *slash = strrchr(name, '/');
    if (!slash && dir_fd != AT_FDCWD) {
        fsync(dir_fd);
        return;
    }
    char *dir = slash ? strndup(name, slash == name ? 1 : (size_t)(slash - name)) : NULL;
    if (slash && !dir) return;
    const int fd = openat(dir_fd, dir ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

int sil_atomic_write(int dir_fd, const char *name, const char *tmp_name, const void *data,
                     size_t len, mode_t mode, const char **step)
{
    const char *s = "create";
    int rc = 0;
    unlinkat(dir_fd, tmp_name, 0);
    const int fd =
        openat(dir_fd, tmp_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0) {
        rc = -errno;
    } else {
        s = "write";
        rc = write_all(fd, data, len);
        if (rc == 0 && fsync(fd) < 0) {
            s = "fsync";
            rc = -errno;
        }
        if (close(fd) < 0 && rc == 0) {
            s = "close";
            rc = -errno;
        }
        if (rc == 0 && renameat(dir_fd, tmp_name, dir_fd, name) < 0) {
            s = "rename";
            rc = -errno;
        }
        if (rc)
            unlinkat(dir_fd, tmp_name, 0);
        else
            sync_dir(dir_fd, name);
    }
    if (step) *step = rc ? s : NULL;
    return rc;
}
