/* Unix socket path discovery, connect and listen. */
#include "siliceo-proto.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

int sil_rpc_socket_path(const char *override, char *buf, size_t size)
{
    int n;
    const char *env = getenv("SILICEO_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    if (override && *override)
        n = snprintf(buf, size, "%s", override);
    else if (env && *env)
        n = snprintf(buf, size, "%s", env);
    else if (geteuid() == 0)
        n = snprintf(buf, size, "/run/siliceo/siliceod.sock");
    else if (xdg && *xdg)
        n = snprintf(buf, size, "%s/siliceo/siliceod.sock", xdg);
    else
        n = snprintf(buf, size, "/run/user/%u/siliceo/siliceod.sock", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= size)
        return -ENAMETOOLONG;
    return 0;
}

static int make_addr(const char *path, struct sockaddr_un *sa, struct sil_rpc_error *err)
{
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(sa->sun_path))
        return sil_rpc_errorf(err, -ENAMETOOLONG, 0,
                              "socket path '%s': %zu bytes, must be 1 to %zu", path, n,
                              sizeof(sa->sun_path) - 1);
    memcpy(sa->sun_path, path, n);
    return 0;
}

int sil_rpc_connect(const char *path, struct sil_rpc_error *err)
{
    struct sockaddr_un sa;
    int r = make_addr(path, &sa, err);
    if (r < 0)
        return r;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return sil_rpc_errorf(err, -errno, 0, "socket: %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        r = -errno;
        close(fd);
        const char *hint = r == -ENOENT || r == -ECONNREFUSED ? " (is siliceod running?)" : "";
        return sil_rpc_errorf(err, r, 0, "connect %s: %s%s", path, strerror(-r), hint);
    }
    return fd;
}

int sil_rpc_listen(const char *path, mode_t mode, int backlog, struct sil_rpc_error *err)
{
    struct sockaddr_un sa;
    int r = make_addr(path, &sa, err);
    if (r < 0)
        return r;
    struct stat st;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return sil_rpc_errorf(err, -EEXIST, 0, "listen %s: exists and is not a socket", path);
        /* Someone answering means a live daemon; refused means a stale file we may replace. */
        int probe = sil_rpc_connect(path, NULL);
        if (probe >= 0) {
            close(probe);
            return sil_rpc_errorf(err, -EADDRINUSE, 0,
                                  "listen %s: another server is listening there", path);
        }
        if (unlink(path) < 0 && errno != ENOENT)
            return sil_rpc_errorf(err, -errno, 0, "unlink stale %s: %s", path, strerror(errno));
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return sil_rpc_errorf(err, -errno, 0, "socket: %s", strerror(errno));
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        r = -errno;
        close(fd);
        return sil_rpc_errorf(err, r, 0, "bind %s: %s", path, strerror(-r));
    }
    /* Before listen(): nobody can connect while the mode is still the umask's. */
    if (chmod(path, mode) < 0) {
        r = -errno;
        unlink(path);
        close(fd);
        return sil_rpc_errorf(err, r, 0, "chmod %s: %s", path, strerror(-r));
    }
    if (listen(fd, backlog > 0 ? backlog : 64) < 0) {
        r = -errno;
        unlink(path);
        close(fd);
        return sil_rpc_errorf(err, r, 0, "listen %s: %s", path, strerror(-r));
    }
    return fd;
}
