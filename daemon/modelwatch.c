/* The served model file's watch (modelwatch.h): a read lease where the kernel grants one,
 * inotify otherwise. */
#include "daemon/modelwatch.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/log.h"
#include "daemon/testhooks.h"

struct sil_modelwatch {
    int fd;     /* the file, read-only: holds the lease */
    int ino_fd; /* inotify, or -1 */
    bool lease, fired;
    uint64_t size;
    char path[4096];
    sd_event_source *src;
    void (*changed)(void *user, const char *why);
    void *user;
};

static void fire(struct sil_modelwatch *w, const char *what)
{
    if (w->fired) return;
    w->fired = true;
    char why[4200];
    snprintf(why, sizeof why, "%s: the model file %s while in use", w->path, what);
    w->changed(w->user, why);
}

static int on_inotify(sd_event_source *src, int fd, uint32_t revents, void *ud)
{
    struct sil_modelwatch *w = ud;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        for (char *p = buf; p < buf + n;) {
            const struct inotify_event *ev = (const struct inotify_event *)p;
            p += sizeof *ev + ev->len;
            struct stat st;
            if (ev->mask & (IN_MODIFY | IN_CLOSE_WRITE))
                fire(w, "was written to");
            else if ((ev->mask & IN_ATTRIB) && fstat(w->fd, &st) == 0 &&
                     (uint64_t)st.st_size != w->size)
                fire(w, "changed size");
            else if (ev->mask & (IN_MOVE_SELF | IN_DELETE_SELF))
                sil_notice(
                    "%s was renamed or removed; the model in use keeps the old contents, SIGHUP "
                    "loads the file the path names then",
                    w->path);
        }
    }
    return 0;
}

int sil_modelwatch_start(struct sil_modelwatch **out, sd_event *ev,
                         const struct sil_model_info *info,
                         void (*changed)(void *user, const char *why), void *user)
{
    *out = NULL;
    struct sil_modelwatch *w = calloc(1, sizeof(*w));
    if (!w) return -ENOMEM;
    w->fd = w->ino_fd = -1;
    w->changed = changed;
    w->user = user;
    w->size = info->file_bytes;
    snprintf(w->path, sizeof w->path, "%s", info->path);
    *out = w;
    if (sil_test_hook("no_watch")) return 0;
    struct stat st;
    w->fd = open(info->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (w->fd < 0 || fstat(w->fd, &st) < 0 || (uint64_t)st.st_dev != info->file_dev ||
        (uint64_t)st.st_ino != info->file_ino) {
        sil_warn("%s: the path no longer names the file in use; its changes cannot be watched",
                 info->path);
        if (w->fd >= 0) close(w->fd);
        w->fd = -1;
        return 0;
    }
    /* The lease: SIGIO with ssi_fd set (F_SETSIG), to this process. */
    if (!sil_test_hook("no_lease") && fcntl(w->fd, F_SETSIG, SIGIO) == 0 &&
        fcntl(w->fd, F_SETOWN, getpid()) == 0 && fcntl(w->fd, F_SETLEASE, F_RDLCK) == 0) {
        w->lease = true;
        sil_info("%s: read lease taken; a writer waits until the model is no longer in use",
                 info->path);
        return 0;
    }
    int lease_errno = errno;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d",
             w->fd); /* the inode, not whatever the path names */
    w->ino_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->ino_fd < 0 ||
        inotify_add_watch(w->ino_fd, proc,
                          IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF | IN_MOVE_SELF) <
            0 ||
        sd_event_add_io(ev, &w->src, w->ino_fd, EPOLLIN, on_inotify, w) < 0) {
        sil_warn("%s: neither a read lease (%s) nor inotify (%s) works; changes to the file are "
                 "not watched",
                 info->path, strerror(lease_errno), strerror(errno));
        if (w->ino_fd >= 0) close(w->ino_fd);
        w->ino_fd = -1;
        return 0;
    }
    /* Before any client's request in the same wake-up: a change must be seen first. */
    sd_event_source_set_priority(w->src, SD_EVENT_PRIORITY_IMPORTANT);
    sil_info("%s: no read lease (%s); watching the file with inotify", info->path,
             strerror(lease_errno));
    return 0;
}

const char *sil_modelwatch_kind(const struct sil_modelwatch *w)
{
    return !w || w->fd < 0 ? "none" : w->lease ? "lease" : w->ino_fd >= 0 ? "inotify" : "none";
}

void sil_modelwatch_on_sigio(struct sil_modelwatch *w, int fd)
{
    if (!w || !w->lease || fd != w->fd) return;
    /* During a break F_GETLEASE reports what the lease is being downgraded to. */
    if (fcntl(w->fd, F_GETLEASE) != F_RDLCK) fire(w, "is being opened for writing or truncated");
}

void sil_modelwatch_release(struct sil_modelwatch *w)
{
    if (!w || !w->lease) return;
    w->lease = false;
    if (fcntl(w->fd, F_SETLEASE, F_UNLCK) < 0)
        sil_warn("%s: releasing the lease: %s", w->path, strerror(errno));
}

void sil_modelwatch_free(struct sil_modelwatch *w)
{
    if (!w) return;
    sil_modelwatch_release(w);
    sd_event_source_disable_unref(w->src);
    if (w->ino_fd >= 0) close(w->ino_fd);
    if (w->fd >= 0) close(w->fd);
    free(w);
}
