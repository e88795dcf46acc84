/* Replacing a file atomically: a reader finds the old contents or the new, never a mix, and the
 * new ones survive a crash once the call returns 0. What the daemon's files (the expert heat map,
 * saved sessions) are written with. */
#ifndef SIL_ATOMICFILE_H
#define SIL_ATOMICFILE_H

#include <stddef.h>
#include <sys/types.h>

/* name (relative to dir_fd, which may be AT_FDCWD) becomes the len bytes at data, with mode:
 * they are written to tmp_name, which must be in name's directory, fsync'd, renamed over name,
 * and the directory is fsync'd. A tmp_name left by a write cut short is removed first (it is
 * never followed if a link), and tmp_name is removed again on any failure, which leaves name as
 * it was. 0 or -errno; on failure *step (when step is not NULL) names what failed: "create",
 * "write", "fsync", "close" or "rename". dir_fd stays the caller's. */
int sil_atomic_write(int dir_fd, const char *name, const char *tmp_name, const void *data,
                     size_t len, mode_t mode, const char **step);

#endif
