/* Unix socket path discovery, connect and listen. */
#include "siliceo-proto.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdbool.h>
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

static bool in_groups(gid_t g, const gid_t *list, int n)
{
    for (int i = 0; i < n; i++)
        if (list[i] == g)
            return true;
    return false;
}

/* Why this user may not open the socket, from what stands in the way: the socket itself when it
 * can be looked at (connecting needs write permission), else its directory (search permission).
 * Names the group that would let the user in, or says that no group does: group root, or a mode
 * that gives the group nothing, mean only the daemon's owner and root get in. */
static void denied_hint(const char *path, char *out, size_t size)
{
    struct stat st;
    char dir[4096];
    const char *what = path;
    mode_t need = S_IWGRP;
    out[0] = 0;
    if (stat(path, &st) < 0) {
        snprintf(dir, sizeof(dir), "%s", path);
        char *slash = strrchr(dir, '/');
        if (slash && slash != dir)
            *slash = 0;
        if (stat(dir, &st) < 0)
            return;
        what = dir;
        need = S_IXGRP;
    }
    const unsigned mode = (unsigned)(st.st_mode & 07777);
    struct group *gr = getgrgid(st.st_gid);
    char g[64];
    snprintf(g, sizeof(g), "%.63s", gr ? gr->gr_name : "");
    if (!gr)
        snprintf(g, sizeof(g), "%u", (unsigned)st.st_gid);
    if (st.st_gid == 0 || !(st.st_mode & need)) {
        struct passwd *owner = getpwuid(st.st_uid);
        char o[64];
        snprintf(o, sizeof(o), "%.63s", owner ? owner->pw_name : "");
        if (!owner)
            snprintf(o, sizeof(o), "uid %u", (unsigned)st.st_uid);
        snprintf(out, size,
                 "; %.200s (owner %s, group %s, mode %04o) lets in no group: only %s%s may use "
                 "that daemon; run your own (siliceod --model FILE), or have the administrator "
                 "open it to a group (socket_group and allow_groups in siliceod.conf)",
                 what, o, g, mode, o, st.st_uid ? " and root" : "");
        return;
    }
    gid_t now[256];
    const int n_now = getgroups(256, now);
    if (st.st_gid == getegid() || (n_now > 0 && in_groups(st.st_gid, now, n_now))) {
        snprintf(out, size,
                 "; %.200s belongs to group %s, which you are in: check the modes of the "
                 "directories above it",
                 what, g);
        return;
    }
    /* In the group database but not in this process: added after this login began. */
    struct passwd *pw = getpwuid(geteuid());
    gid_t db[256];
    int n_db = 256;
    if (pw && getgrouplist(pw->pw_name, pw->pw_gid, db, &n_db) >= 0 &&
        in_groups(st.st_gid, db, n_db)) {
        snprintf(out, size,
                 "; %.200s belongs to group %s: you were added to it after this login began; "
                 "log in again (or run 'newgrp %s')",
                 what, g, g);
        return;
    }
    snprintf(out, size,
             "; %.200s belongs to group %s, which you are not in: an administrator adds you "
             "(usermod -aG %s %s, then you log in again), and the daemon lets in the users and "
             "groups its allow_users and allow_groups (siliceod.conf) name",
             what, g, g, pw ? pw->pw_name : "USER");
}

static int rank(int r)
{
    return r == -EACCES || r == -EPERM ? 3 : r == -ECONNREFUSED ? 2 : r == -ENOENT ? 1 : 0;
}

/* What the failures of every candidate say together: a socket the user may not open (and why),
 * a socket file no daemon answers on, or no daemon at all. user: the index of the per-user
 * socket among paths, -1 when it was not tried; named: the path came from --socket or
 * SILICEO_SOCKET. */
static void connect_hint(char paths[][4096], const int *rc, int n, int user, bool named,
                         char *out, size_t size)
{
    int denied = -1, stale = -1;
    for (int i = 0; i < n; i++) {
        if (denied < 0 && (rc[i] == -EACCES || rc[i] == -EPERM))
            denied = i;
        if (stale < 0 && rc[i] == -ECONNREFUSED)
            stale = i;
    }
    size_t used = 0;
    out[0] = 0;
    if (denied >= 0) {
        denied_hint(paths[denied], out, size);
        used = strlen(out);
        if (user >= 0 && user != denied && rc[user] == -ENOENT && used < size)
            snprintf(out + used, size - used,
                     "; no siliceod of yours runs (none at %.200s): 'siliceod --model FILE' "
                     "starts one there",
                     paths[user]);
        return;
    }
    if (stale >= 0) {
        snprintf(out, size,
                 "; %.200s is left from a siliceod that no longer runs (stopped or crashed): "
                 "start it again",
                 paths[stale]);
        return;
    }
    if (named)
        snprintf(out, size, "; no siliceod listens there");
    else
        snprintf(out, size,
                 "; no siliceod runs%s: 'siliceod --model FILE' starts one, or --socket or "
                 "SILICEO_SOCKET names another socket",
                 n > 1 ? ", neither yours nor the system's" : "");
}

int sil_rpc_connect_any(const char *override, struct sil_rpc_error *err)
{
    char paths[SIL_RPC_MAX_CANDIDATES][4096];
    int n = sil_rpc_socket_candidates(override, paths, SIL_RPC_MAX_CANDIDATES);
    if (n < 0)
        return sil_rpc_errorf(err, n, 0, "socket path too long");
    const char *env = getenv("SILICEO_SOCKET");
    const bool named = (override && *override) || (env && *env);
    const int user = named ? -1 : geteuid() != 0 ? 0 : n > 1 ? 1 : -1;
    char tried[SIL_RPC_MAX_CANDIDATES * 300] = "";
    size_t used = 0;
    int rc[SIL_RPC_MAX_CANDIDATES];
    int best = 0;
    for (int i = 0; i < n; i++) {
        struct sil_rpc_error e = {0};
        int fd = sil_rpc_connect(paths[i], &e);
        if (fd >= 0)
            return fd;
        rc[i] = fd;
        if (n == 1 && (fd == -ENAMETOOLONG || fd == -EINVAL)) {
            if (err)
                *err = e;
            return fd;
        }
        int k = snprintf(tried + used, sizeof(tried) - used, "%s%.200s (%s)", i ? ", " : "",
                         paths[i], strerror(-fd));
        if (k > 0 && (size_t)k < sizeof(tried) - used)
            used += (size_t)k;
        if (i == 0 || rank(fd) > rank(best))
            best = fd;
    }
    char hint[1024];
    connect_hint(paths, rc, n, user, named, hint, sizeof(hint));
    if (n == 1)
        return sil_rpc_errorf(err, best, 0, "connect %.200s: %s%s", paths[0], strerror(-best),
                              hint);
    return sil_rpc_errorf(err, best, 0, "cannot connect to siliceod: tried %s%s", tried, hint);
}
