/* Unix socket path discovery, connect and listen. */
#include "siliceo-proto.h"

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* A user's own socket: in $XDG_RUNTIME_DIR; without it in /run/user/UID when that is the
 * user's directory, else (no login session: cron, runuser, a container) in /tmp/siliceo-UID,
 * which the daemon makes private to the user. Returns snprintf's count. */
static int user_socket(char *buf, size_t size)
{
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    const unsigned uid = (unsigned)geteuid();
    if (xdg && *xdg)
        return snprintf(buf, size, "%s/siliceo/siliceod.sock", xdg);
    char run[64];
    snprintf(run, sizeof run, "/run/user/%u", uid);
    struct stat st;
    if (stat(run, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == (uid_t)uid)
        return snprintf(buf, size, "%s/siliceo/siliceod.sock", run);
    return snprintf(buf, size, "/tmp/siliceo-%u/siliceod.sock", uid);
}

int sil_rpc_socket_path(const char *override, char *buf, size_t size)
{
    int n;
    const char *env = getenv("SILICEO_SOCKET");
    if (override && *override)
        n = snprintf(buf, size, "%s", override);
    else if (env && *env)
        n = snprintf(buf, size, "%s", env);
    else if (geteuid() == 0)
        n = snprintf(buf, size, "/run/siliceo/siliceod.sock");
    else
        n = user_socket(buf, size);
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

int sil_rpc_socket_candidates(const char *override, char paths[][4096], int max)
{
    const char *env = getenv("SILICEO_SOCKET");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    const char *one[SIL_RPC_MAX_CANDIDATES];
    char user[4096];
    int n = 0;
    if (override && *override) {
        one[n++] = override;
    } else if (env && *env) {
        one[n++] = env;
    } else {
        const int k = user_socket(user, sizeof(user));
        if (k < 0 || (size_t)k >= sizeof(user))
            return -ENAMETOOLONG;
        /* Root's default is the system socket; a root session's own daemon comes second. */
        if (geteuid() == 0) {
            one[n++] = SIL_RPC_SYSTEM_SOCKET;
            if (xdg && *xdg)
                one[n++] = user;
        } else {
            one[n++] = user;
            one[n++] = SIL_RPC_SYSTEM_SOCKET;
        }
    }
    if (n > max)
        n = max;
    for (int i = 0; i < n; i++) {
        size_t len = strlen(one[i]);
        if (len >= sizeof(paths[i]))
            return -ENAMETOOLONG;
        memcpy(paths[i], one[i], len + 1);
    }
    return n;
}

/* Why a user may not open the socket: its group (or its directory's, when the socket itself
 * cannot be looked at) and the allow lists. */
static void access_hint(const char *path, char *out, size_t size)
{
    struct stat st;
    char dir[4096];
    const char *what = path;
    if (stat(path, &st) < 0) {
        snprintf(dir, sizeof(dir), "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir)
            *slash = 0;
        if (stat(dir, &st) < 0) {
            out[0] = 0;
            return;
        }
        what = dir;
    }
    struct group *gr = getgrgid(st.st_gid);
    char gid[16];
    snprintf(gid, sizeof(gid), "%u", (unsigned)st.st_gid);
    const char *g = gr ? gr->gr_name : gid;
    snprintf(out, size,
             "; %.200s belongs to group %.64s: join that group, and have the daemon's "
             "allow_users or allow_groups (siliceod.conf) name you or it",
             what, g);
}

static int rank(int r)
{
    return r == -EACCES || r == -EPERM ? 3 : r == -ECONNREFUSED ? 2 : r == -ENOENT ? 1 : 0;
}

int sil_rpc_connect_any(const char *override, struct sil_rpc_error *err)
{
    char paths[SIL_RPC_MAX_CANDIDATES][4096];
    int n = sil_rpc_socket_candidates(override, paths, SIL_RPC_MAX_CANDIDATES);
    if (n < 0)
        return sil_rpc_errorf(err, n, 0, "socket path too long");
    char tried[SIL_RPC_MAX_CANDIDATES * 300] = "";
    size_t used = 0;
    int best = 0, best_i = 0;
    for (int i = 0; i < n; i++) {
        struct sil_rpc_error e = {0};
        int fd = sil_rpc_connect(paths[i], &e);
        if (fd >= 0)
            return fd;
        if (n == 1) {
            if (err)
                *err = e;
            if (fd == -EACCES || fd == -EPERM) {
                char hint[512];
                access_hint(paths[i], hint, sizeof(hint));
                sil_rpc_errorf(err, fd, 0, "connect %.200s: %s%s", paths[i], strerror(-fd), hint);
            }
            return fd;
        }
        int k = snprintf(tried + used, sizeof(tried) - used, "%s%.200s (%s)", i ? ", " : "",
                         paths[i], strerror(-fd));
        if (k > 0 && (size_t)k < sizeof(tried) - used)
            used += (size_t)k;
        if (i == 0 || rank(fd) > rank(best)) {
            best = fd;
            best_i = i;
        }
    }
    char hint[512] = "";
    if (best == -EACCES || best == -EPERM)
        access_hint(paths[best_i], hint, sizeof(hint));
    else if (best == -ENOENT || best == -ECONNREFUSED)
        snprintf(hint, sizeof(hint), "; is siliceod running? --socket or SILICEO_SOCKET name "
                                     "another socket");
    return sil_rpc_errorf(err, best, 0, "cannot connect to siliceod: tried %s%s", tried, hint);
}
