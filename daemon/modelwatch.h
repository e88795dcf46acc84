/* The watch on the served model file: tells the event loop when the file under the mapping is
 * about to be written or was written, so no answer is computed from changed weights.
 *
 * Preferred: a read lease (F_SETLEASE F_RDLCK), possible when the daemon owns the file or has
 * CAP_LEASE and nobody has it open for writing. The kernel signals the holder (SIGIO, which the
 * event loop takes through sd-event) when another process opens the file for writing or
 * truncates it, and holds that open back until the lease is released or lease-break-time
 * (/proc/sys/fs/lease-break-time) passes: the daemon stops using the mapping first, then calls
 * sil_modelwatch_release. Otherwise: inotify on the inode (IN_MODIFY, IN_CLOSE_WRITE, IN_ATTRIB
 * with a changed size), which reports a write only after it happened.
 * A rename over the path is not a change: the mapping keeps the old inode, which is what is
 * watched.
 *
 * Ownership: the watch owns its fds and event sources; sil_modelwatch_free releases the lease.
 * Event-loop thread only. */
#ifndef SIL_DAEMON_MODELWATCH_H
#define SIL_DAEMON_MODELWATCH_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-event.h>

#include "daemon/engine/engine.h"

struct sil_modelwatch;

/* changed(user, why) is called once, on the loop thread, when the file is being changed. The
 * caller must have SIGIO blocked in every thread and route it to sil_modelwatch_on_sigio.
 * Returns 0 (the watch may be of kind "none" when neither a lease nor inotify works) or -errno. */
int sil_modelwatch_start(struct sil_modelwatch **out, sd_event *ev,
                         const struct sil_model_info *info,
                         void (*changed)(void *user, const char *why), void *user);
void sil_modelwatch_free(struct sil_modelwatch *w);
/* "lease", "inotify" or "none". */
const char *sil_modelwatch_kind(const struct sil_modelwatch *w);
/* The mapping is no longer read: a writer held back by the lease may go on. */
void sil_modelwatch_release(struct sil_modelwatch *w);
/* A SIGIO arrived (ssi_fd from the signalfd): a lease break when it names the watch's file. */
void sil_modelwatch_on_sigio(struct sil_modelwatch *w, int fd);

#endif
