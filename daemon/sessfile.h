/* Saved sessions: a chat session's transcript (its messages, never engine state) kept in the
 * state directory, so a conversation survives a restart, an upgrade, a model reload and an LRU
 * eviction; the engine state is recomputed from it on first use.
 *
 * Layout: STATE/sessions/UID/NAME, directories 0700 and files 0600, all the daemon's; NAME is the
 * session name in lower-case hex (any bytes a name may hold give a safe file name of at most 254
 * characters). The daemon opens a uid's directory only for that uid's requests (and the owner's
 * sessions.list / sessions.drop), so no user reads or continues another's conversation.
 *
 * File format, little-endian, version 1; every byte is checked on load:
 *    0  magic "SILSESS\0"
 *    8  u32 version (1)
 *   12  u32 uid: the directory's
 *   16  u64 saved_at: microseconds since the epoch
 *   24  u32 name length (1..127), the name (no NUL): the file's name decoded
 *       u32 message count, then per message:
 *       u8 role (0 system, 1 user, 2 assistant), u8 flags (bit 0: reasoning follows; others 0),
 *       u32 content length, content, [u32 reasoning length, reasoning]; strings hold no NUL
 *  end-8 u64 FNV-1a of every byte before it; nothing follows.
 *
 * Bounds per uid: saved_sessions files and saved_session_bytes bytes; a save over either removes
 * that uid's least recently saved files first. A state directory that cannot be used (missing and
 * not creatable, read-only, another user's) is a warning: sessions then live in memory only.
 *
 * Threads: the store is opened before the engine thread starts and used by it alone after.
 * Ownership: the store owns its index; a loaded file's strings belong to the caller. */
#ifndef SIL_DAEMON_SESSFILE_H
#define SIL_DAEMON_SESSFILE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/engine/engine.h"

#define SIL_SESSFILE_VERSION 1
#define SIL_SESSFILE_NAME_MAX 127           /* bytes of a session name (SIL_SESSION_NAME_MAX - 1) */
#define SIL_SESSFILE_MAX_BYTES (1ull << 30) /* no file is read past this, whatever the limits */

/* A parsed file. */
struct sil_sessfile {
    uint32_t uid;
    uint64_t saved_at;
    char name[SIL_SESSFILE_NAME_MAX + 1];
    struct sil_chat_msg *msgs; /* [n_msgs], every string malloc'd */
    size_t n_msgs;
};

/* The file's bytes for these messages (roles system, user or assistant, strings without NUL):
 * *out malloc'd. -EINVAL (err names the message) for a role or name the format cannot hold. */
int sil_sessfile_encode(uint32_t uid, const char *name, uint64_t saved_at,
                        const struct sil_chat_msg *msgs, size_t n_msgs, uint8_t **out, size_t *len,
                        struct sil_error *err);
/* Parses len bytes (what names them in err). 0, or -EINVAL with the offset of the first bad
 * byte, or -ENOMEM; out is filled only on success. */
int sil_sessfile_parse(const void *data, size_t len, const char *what, struct sil_sessfile *out,
                       struct sil_error *err);
void sil_sessfile_free(struct sil_sessfile *f);

/* The file name of a session name: lower-case hex. -ENAMETOOLONG for a name over the limit,
 * -EINVAL for an empty one. */
int sil_sessfile_name_encode(const char *name, char *out, size_t size);
/* The session name a file name holds: -EINVAL when it is not one encode makes. */
int sil_sessfile_name_decode(const char *file, char *name, size_t size);

/* What the store knows of one saved file (scanned at open, kept up to date by save / remove). */
struct sil_sessfile_entry {
    uint32_t uid;
    char name[SIL_SESSFILE_NAME_MAX + 1];
    uint64_t bytes, saved_at;
    uint32_t n_msgs;
};

struct sil_sessstore {
    int dfd;                        /* STATE/sessions, -1: nothing saved */
    char path[PATH_MAX];            /* of dfd, for log lines */
    int max_files;                  /* per uid */
    uint64_t max_bytes;             /* per uid */
    struct sil_sessfile_entry *ent; /* [n], in no order */
    size_t n, cap;
};

/* Opens (creating it, 0700) state_dir/sessions and indexes every file in it, checking each one
 * whole: a bad one is left alone with a warning, a stray temporary file is removed. Never fails:
 * with no usable directory (or max_files 0) the store is off (dfd -1) and a line says why. */
void sil_sessstore_open(struct sil_sessstore *st, const char *state_dir, int max_files,
                        uint64_t max_bytes);
void sil_sessstore_close(struct sil_sessstore *st);
static inline bool sil_sessstore_on(const struct sil_sessstore *st)
{
    return st->dfd >= 0;
}

const struct sil_sessfile_entry *sil_sessstore_find(const struct sil_sessstore *st, uint32_t uid,
                                                    const char *name);
/* Saves (uid, name)'s transcript atomically (a temporary file, fsync, rename, fsync of the
 * directory), then removes the uid's oldest files while over its bounds. A transcript larger than
 * max_bytes is not saved (-EFBIG) and its older file goes. 0 or -errno with err set. */
int sil_sessstore_save(struct sil_sessstore *st, uint32_t uid, const char *name,
                       const struct sil_chat_msg *msgs, size_t n_msgs, struct sil_error *err);
/* Loads (uid, name): 0, -ENOENT (none saved), or another -errno with err set (the file is bad:
 * it leaves the index and stays on disk until a save replaces it). */
int sil_sessstore_load(struct sil_sessstore *st, uint32_t uid, const char *name,
                       struct sil_sessfile *out, struct sil_error *err);
/* Removes (uid, name)'s file: 0, or -ENOENT when there was none. */
int sil_sessstore_remove(struct sil_sessstore *st, uint32_t uid, const char *name);

#endif
