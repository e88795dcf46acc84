/* Saved sessions (sessfile.h has the layout, the format and the contract). */
#include "daemon/sessfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "daemon/log.h"
#include "kernels/atomicfile.h"
#include "kernels/bytes.h"
#include "kernels/vec.h"

static const uint8_t magic[8] = {'S', 'I', 'L', 'S', 'E', 'S', 'S', 0};
static const char *const roles[] = {"system", "user", "assistant"};
#define HDR 24              /* magic, version, uid, saved_at */
#define TMP_NAME ".partial" /* never a name encode makes: it is not hex */
/* the checksum: FNV-1a of every byte before it */
static uint64_t fnv1a(const uint8_t *p, size_t n)
{
    return sil_fnv1a(SIL_FNV_INIT, p, n);
}

static int role_code(const char *role)
{
    for (int i = 0; i < 3; i++)
        if (role && strcmp(role, roles[i]) == 0) return i;
    return -1;
}

/* ---- the format --------------------------------------------------------------------------------
 */

int sil_sessfile_encode(uint32_t uid, const char *name, uint64_t saved_at,
                        const struct sil_chat_msg *msgs, size_t n_msgs, uint8_t **out, size_t *len,
                        struct sil_error *err)
{
    *out = NULL;
    *len = 0;
    const size_t nn = strlen(name);
    if (nn == 0 || nn > SIL_SESSFILE_NAME_MAX)
        return sil_errorf(err, -EINVAL, "session name of %zu bytes (1 to %d)", nn,
                          SIL_SESSFILE_NAME_MAX);
    if (n_msgs > UINT32_MAX) return sil_errorf(err, -EINVAL, "%zu messages", n_msgs);
    uint64_t total = HDR + 4 + nn + 4 + 8;
    for (size_t i = 0; i < n_msgs; i++) {
        if (role_code(msgs[i].role) < 0)
            return sil_errorf(err, -EINVAL, "message %zu: role '%.32s'", i,
                              msgs[i].role ? msgs[i].role : "(none)");
        const size_t nc = strlen(msgs[i].content);
        const size_t nr = msgs[i].reasoning ? strlen(msgs[i].reasoning) : 0;
        if (nc > UINT32_MAX || nr > UINT32_MAX)
            return sil_errorf(err, -EFBIG, "message %zu: over 4 GiB", i);
        total += 2 + 4 + nc + (msgs[i].reasoning ? 4 + nr : 0);
    }
    if (total > SIL_SESSFILE_MAX_BYTES)
        return sil_errorf(err, -EFBIG, "a transcript of %llu bytes", (unsigned long long)total);
    uint8_t *b = malloc((size_t)total), *p = b;
    if (!b) return sil_errorf(err, -ENOMEM, "out of memory");
    memcpy(p, magic, 8);
    sil_put_le32(p + 8, SIL_SESSFILE_VERSION);
    sil_put_le32(p + 12, uid);
    sil_put_le64(p + 16, saved_at);
    p += HDR;
    sil_put_le32(p, (uint32_t)nn);
    memcpy(p + 4, name, nn);
    p += 4 + nn;
    sil_put_le32(p, (uint32_t)n_msgs);
    p += 4;
    for (size_t i = 0; i < n_msgs; i++) {
        const size_t nc = strlen(msgs[i].content);
        *p++ = (uint8_t)role_code(msgs[i].role);
        *p++ = msgs[i].reasoning ? 1 : 0;
        sil_put_le32(p, (uint32_t)nc);
        memcpy(p + 4, msgs[i].content, nc);
        p += 4 + nc;
        if (msgs[i].reasoning) {
            const size_t nr = strlen(msgs[i].reasoning);
            sil_put_le32(p, (uint32_t)nr);
            memcpy(p + 4, msgs[i].reasoning, nr);
            p += 4 + nr;
        }
    }
    sil_put_le64(p, fnv1a(b, (size_t)(p - b)));
    *out = b;
    *len = (size_t)total;
    return 0;
}

void sil_sessfile_free(struct sil_sessfile *f)
{
    for (size_t i = 0; f->msgs && i < f->n_msgs; i++) {
        free((char *)f->msgs[i].role);
        free((char *)f->msgs[i].content);
        free((char *)f->msgs[i].reasoning);
    }
    free(f->msgs);
    f->msgs = NULL;
    f->n_msgs = 0;
}

/* A length-prefixed string at *off of b[0..end): copied (NUL-terminated) into *out. */
static int take_str(const uint8_t *b, size_t end, size_t *off, const char *what, const char *field,
                    size_t i, char **out, struct sil_error *err)
{
    if (end - *off < 4)
        return sil_errorf(err, -EINVAL, "%s: offset %zu: message %zu: the %s's length is cut off",
                          what, *off, i, field);
    const uint32_t n = sil_get_le32(b + *off);
    if (n > end - *off - 4)
        return sil_errorf(err, -EINVAL, "%s: offset %zu: message %zu: a %s of %u bytes, %zu left",
                          what, *off, i, field, n, end - *off - 4);
    const uint8_t *s = b + *off + 4;
    const uint8_t *nul = memchr(s, 0, n);
    if (nul)
        return sil_errorf(err, -EINVAL, "%s: offset %zu: message %zu: a NUL byte in its %s", what,
                          (size_t)(nul - b), i, field);
    *out = malloc((size_t)n + 1);
    if (!*out) return sil_errorf(err, -ENOMEM, "%s: out of memory", what);
    memcpy(*out, s, n);
    (*out)[n] = 0;
    *off += 4 + (size_t)n;
    return 0;
}

int sil_sessfile_parse(const void *data, size_t len, const char *what, struct sil_sessfile *out,
                       struct sil_error *err)
{
    const uint8_t *b = data;
    memset(out, 0, sizeof(*out));
    if (len < HDR + 4 + 1 + 4 + 8)
        return sil_errorf(err, -EINVAL, "%s: %zu bytes, shorter than any session file", what, len);
    if (len > SIL_SESSFILE_MAX_BYTES)
        return sil_errorf(err, -EINVAL, "%s: %zu bytes, over the %llu a session file may have",
                          what, len, SIL_SESSFILE_MAX_BYTES);
    if (memcmp(b, magic, 8) != 0)
        return sil_errorf(err, -EINVAL, "%s: offset 0: not a session file (magic)", what);
    const uint32_t version = sil_get_le32(b + 8);
    if (version != SIL_SESSFILE_VERSION)
        return sil_errorf(err, -EINVAL, "%s: offset 8: version %u, expected %u", what, version,
                          SIL_SESSFILE_VERSION);
    const size_t end = len - 8; /* the checksum's offset */
    if (sil_get_le64(b + end) != fnv1a(b, end))
        return sil_errorf(err, -EINVAL, "%s: offset %zu: checksum mismatch", what, end);
    struct sil_sessfile f = {.uid = sil_get_le32(b + 12), .saved_at = sil_get_le64(b + 16)};
    size_t off = HDR;
    const uint32_t nn = sil_get_le32(b + off);
    if (nn == 0 || nn > SIL_SESSFILE_NAME_MAX || nn > end - off - 4)
        return sil_errorf(err, -EINVAL, "%s: offset %zu: a name of %u bytes (1 to %d)", what, off,
                          nn, SIL_SESSFILE_NAME_MAX);
    const uint8_t *nul = memchr(b + off + 4, 0, nn);
    if (nul)
        return sil_errorf(err, -EINVAL, "%s: offset %zu: a NUL byte in the name", what,
                          (size_t)(nul - b));
    memcpy(f.name, b + off + 4, nn);
    f.name[nn] = 0;
    off += 4 + nn;
    if (end - off < 4)
        return sil_errorf(err, -EINVAL, "%s: offset %zu: the message count is cut off", what, off);
    const uint32_t n = sil_get_le32(b + off);
    off += 4;
    /* every message takes at least 6 bytes: a count the file cannot hold allocates nothing */
    if (n > (end - off) / 6)
        return sil_errorf(err, -EINVAL, "%s: offset %zu: %u messages in %zu bytes", what, off - 4,
                          n, end - off);
    f.msgs = calloc(n ? n : 1, sizeof(*f.msgs));
    if (!f.msgs) return sil_errorf(err, -ENOMEM, "%s: out of memory", what);
    int rc = 0;
    for (uint32_t i = 0; i < n && rc == 0; i++) {
        if (end - off < 2) {
            rc = sil_errorf(err, -EINVAL, "%s: offset %zu: message %u is cut off", what, off, i);
            break;
        }
        const uint8_t role = b[off], flags = b[off + 1];
        if (role > 2) {
            rc = sil_errorf(err, -EINVAL, "%s: offset %zu: message %u: role %u (0 to 2)", what, off,
                            i, role);
            break;
        }
        if (flags & ~1u) {
            rc = sil_errorf(err, -EINVAL, "%s: offset %zu: message %u: flags %#x", what, off + 1, i,
                            flags);
            break;
        }
        off += 2;
        f.msgs[i].role = strdup(roles[role]);
        f.n_msgs = i + 1; /* freed from here on, whatever follows */
        if (!f.msgs[i].role) {
            rc = sil_errorf(err, -ENOMEM, "%s: out of memory", what);
            break;
        }
        char *content = NULL, *reasoning = NULL;
        rc = take_str(b, end, &off, what, "content", i, &content, err);
        f.msgs[i].content = content;
        if (rc == 0 && (flags & 1)) {
            rc = take_str(b, end, &off, what, "reasoning", i, &reasoning, err);
            f.msgs[i].reasoning = reasoning;
        }
    }
    if (rc == 0 && off != end)
        rc = sil_errorf(err, -EINVAL, "%s: offset %zu: %zu bytes after the last message", what, off,
                        end - off);
    if (rc) {
        sil_sessfile_free(&f);
        return rc;
    }
    f.n_msgs = n;
    *out = f;
    return 0;
}

int sil_sessfile_name_encode(const char *name, char *out, size_t size)
{
    static const char hex[] = "0123456789abcdef";
    const size_t n = strlen(name);
    if (n == 0) return -EINVAL;
    if (n > SIL_SESSFILE_NAME_MAX || 2 * n + 1 > size) return -ENAMETOOLONG;
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hex[(unsigned char)name[i] >> 4];
        out[2 * i + 1] = hex[(unsigned char)name[i] & 15];
    }
    out[2 * n] = 0;
    return 0;
}

static int hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

int sil_sessfile_name_decode(const char *file, char *name, size_t size)
{
    const size_t n = strlen(file);
    if (n == 0 || n % 2 || n / 2 > SIL_SESSFILE_NAME_MAX || n / 2 + 1 > size) return -EINVAL;
    for (size_t i = 0; i < n / 2; i++) {
        const int hi = hexval(file[2 * i]), lo = hexval(file[2 * i + 1]);
        if (hi < 0 || lo < 0 || (hi | lo) == 0)
            return -EINVAL; /* not hex, or a NUL byte: no name encodes to it */
        name[i] = (char)(hi << 4 | lo);
    }
    name[n / 2] = 0;
    return 0;
}

/* ---- the store ---------------------------------------------------------------------------------
 */

/* A directory of ours for saved transcripts: created 0700, or an existing one checked (ours, not a
 * link) and tightened to 0700. The fd, or -errno with why set. */
static int open_private_dir(int at, const char *name, bool create, const char **why)
{
    if (create && mkdirat(at, name, 0700) < 0 && errno != EEXIST) {
        *why = "cannot create it";
        return -errno;
    }
    const int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        *why = "cannot open it";
        return -errno;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        const int e = errno;
        close(fd);
        *why = "cannot stat it";
        return -e;
    }
    if (st.st_uid != geteuid()) {
        close(fd);
        *why = "it belongs to another user";
        return -EPERM;
    }
    if ((st.st_mode & 077) && fchmod(fd, 0700) < 0) {
        const int e = errno;
        close(fd);
        *why = "others may read it and it cannot be made 0700";
        return -e;
    }
    return fd;
}

static int uid_dir(const struct sil_sessstore *st, uint32_t uid, bool create)
{
    char d[16];
    snprintf(d, sizeof d, "%u", (unsigned)uid);
    const char *why;
    return open_private_dir(st->dfd, d, create, &why);
}

/* Reads a whole regular file of ours (not a link), at most SIL_SESSFILE_MAX_BYTES. */
static int read_file(int dfd, const char *file, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    const int fd = openat(dfd, file, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -errno;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) < 0)
        rc = -errno;
    else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid())
        rc = -EPERM;
    else if ((uint64_t)st.st_size > SIL_SESSFILE_MAX_BYTES)
        rc = -EFBIG;
    uint8_t *b = rc ? NULL : malloc(st.st_size ? (size_t)st.st_size : 1);
    if (!rc && !b) rc = -ENOMEM;
    size_t got = 0;
    while (!rc && got < (size_t)st.st_size) {
        const ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : -EIO;
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    if (rc) {
        free(b);
        return rc;
    }
    *out = b;
    *len = got;
    return 0;
}

/* Reads and checks one file: the name and uid inside must be the ones its path gives. */
static int load_at(int dfd, uint32_t uid, const char *file, const char *name, const char *what,
                   struct sil_sessfile *out, struct sil_error *err)
{
    uint8_t *b;
    size_t len;
    int rc = read_file(dfd, file, &b, &len);
    if (rc == -ENOENT) return rc;
    if (rc)
        return sil_errorf(err, rc, "%s: %s", what,
                          rc == -EPERM ? "not a regular file of the daemon's user" : strerror(-rc));
    rc = sil_sessfile_parse(b, len, what, out, err);
    free(b);
    if (rc) return rc;
    if (out->uid != uid || strcmp(out->name, name) != 0) {
        sil_sessfile_free(out);
        return sil_errorf(err, -EINVAL, "%s: offset 12: the file is another session's", what);
    }
    return 0;
}

static struct sil_sessfile_entry *find(const struct sil_sessstore *st, uint32_t uid,
                                       const char *name)
{
    for (size_t i = 0; i < st->n; i++)
        if (st->ent[i].uid == uid && strcmp(st->ent[i].name, name) == 0) return &st->ent[i];
    return NULL;
}

const struct sil_sessfile_entry *sil_sessstore_find(const struct sil_sessstore *st, uint32_t uid,
                                                    const char *name)
{
    return find(st, uid, name);
}

static void forget(struct sil_sessstore *st, struct sil_sessfile_entry *e)
{
    *e = st->ent[--st->n];
}

static int remember(struct sil_sessstore *st, const struct sil_sessfile_entry *e)
{
    struct sil_sessfile_entry *old = find(st, e->uid, e->name);
    if (old) {
        *old = *e;
        return 0;
    }
    if (sil_vec_reserve(&st->ent, &st->cap, st->n + 1, 16) < 0) return -ENOMEM;
    st->ent[st->n++] = *e;
    return 0;
}

static int unlink_entry(struct sil_sessstore *st, uint32_t uid, const char *name)
{
    char file[2 * SIL_SESSFILE_NAME_MAX + 1];
    if (sil_sessfile_name_encode(name, file, sizeof file) < 0) return -EINVAL;
    const int dfd = uid_dir(st, uid, false);
    int rc = dfd < 0 ? dfd : unlinkat(dfd, file, 0) < 0 ? -errno : 0;
    if (dfd >= 0) close(dfd);
    struct sil_sessfile_entry *e = find(st, uid, name);
    if (e) forget(st, e);
    return rc;
}

/* Removes uid's least recently saved files (not keep) while it has more than max_files, or more
 * than max_bytes with extra bytes to come. */
static void enforce(struct sil_sessstore *st, uint32_t uid, const char *keep, uint64_t extra)
{
    for (;;) {
        int n = 0;
        uint64_t bytes = extra;
        struct sil_sessfile_entry *oldest = NULL;
        for (size_t i = 0; i < st->n; i++) {
            struct sil_sessfile_entry *e = &st->ent[i];
            if (e->uid != uid || (keep && strcmp(e->name, keep) == 0)) continue;
            n++;
            bytes += e->bytes;
            if (!oldest || e->saved_at < oldest->saved_at) oldest = e;
        }
        if (!oldest || (n + (keep != NULL) <= st->max_files && bytes <= st->max_bytes)) return;
        sil_info("uid %u: over saved_sessions / saved_session_bytes, its least recently saved "
                 "session transcript (%llu bytes) removed",
                 (unsigned)uid, (unsigned long long)oldest->bytes);
        char name[sizeof oldest->name];
        memcpy(name, oldest->name, sizeof name);
        unlink_entry(st, uid, name);
    }
}

static void scan_uid(struct sil_sessstore *st, uint32_t uid, int dfd, const char *dname, int *n_bad)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    for (struct dirent *de; (de = readdir(d));) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0) continue;
        char what[PATH_MAX + 300];
        snprintf(what, sizeof what, "%s/%s/%s", st->path, dname, de->d_name);
        if (strcmp(de->d_name, TMP_NAME) == 0) { /* a save cut short */
            unlinkat(dirfd(d), de->d_name, 0);
            continue;
        }
        char name[SIL_SESSFILE_NAME_MAX + 1];
        if (sil_sessfile_name_decode(de->d_name, name, sizeof name) < 0) {
            sil_warn("ignoring %s: not a saved session's file name", what);
            (*n_bad)++;
            continue;
        }
        struct sil_sessfile f;
        struct sil_error err = {0};
        if (load_at(dirfd(d), uid, de->d_name, name, what, &f, &err) < 0) {
            sil_warn("ignoring the saved session file %s", err.msg);
            (*n_bad)++;
            continue;
        }
        struct stat sb;
        struct sil_sessfile_entry e = {
            .uid = uid, .saved_at = f.saved_at, .n_msgs = (uint32_t)f.n_msgs};
        e.bytes =
            fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 ? (uint64_t)sb.st_size : 0;
        memcpy(e.name, name, sizeof e.name);
        sil_sessfile_free(&f);
        if (remember(st, &e) < 0) break;
    }
    closedir(d);
}

/* A directory name that is a uid as the store writes it: decimal, no sign, no leading zero. */
static bool uid_name(const char *s, uint32_t *uid)
{
    uint64_t v = 0;
    if (!*s || (s[0] == '0' && s[1]) || strlen(s) > 10) return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return false;
        v = v * 10 + (uint64_t)(*s - '0');
    }
    if (v > UINT32_MAX) return false;
    *uid = (uint32_t)v;
    return true;
}

void sil_sessstore_open(struct sil_sessstore *st, const char *state_dir, int max_files,
                        uint64_t max_bytes)
{
    memset(st, 0, sizeof(*st));
    st->dfd = -1;
    st->max_files = max_files;
    st->max_bytes = max_bytes;
    if (max_files <= 0 || !state_dir) return;
    if (snprintf(st->path, sizeof st->path, "%s/sessions", state_dir) >= (int)sizeof st->path) {
        sil_warn("state directory %s: name too long; sessions are kept in memory only", state_dir);
        return;
    }
    const int sfd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const char *why = "cannot open it";
    const int dfd = sfd < 0 ? -errno : open_private_dir(sfd, "sessions", true, &why);
    if (sfd >= 0) close(sfd);
    if (dfd < 0) {
        sil_warn("%s: %s (%s); sessions are kept in memory only", sfd < 0 ? state_dir : st->path,
                 why, strerror(-dfd));
        return;
    }
    st->dfd = dfd;
    int n_bad = 0, n_uid = 0;
    DIR *d = fdopendir(dup(dfd));
    for (struct dirent *de; d && (de = readdir(d));) {
        uint32_t uid;
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0 ||
            strcmp(de->d_name, TMP_NAME) == 0)
            continue;
        if (!uid_name(de->d_name, &uid)) {
            sil_warn("ignoring %s/%s: not a uid's directory", st->path, de->d_name);
            continue;
        }
        const int ufd = open_private_dir(dfd, de->d_name, false, &why);
        if (ufd < 0) {
            sil_warn("ignoring %s/%s: %s", st->path, de->d_name, why);
            continue;
        }
        n_uid++;
        scan_uid(st, uid, ufd, de->d_name, &n_bad);
        enforce(st, uid, NULL, 0);
    }
    if (d) closedir(d);
    sil_notice("saved sessions: %zu transcripts of %d uids in %s%s", st->n, n_uid, st->path,
               n_bad ? " (some files ignored, see above)" : "");
}

void sil_sessstore_close(struct sil_sessstore *st)
{
    if (st->dfd >= 0) close(st->dfd);
    st->dfd = -1;
    free(st->ent);
    st->ent = NULL;
    st->n = st->cap = 0;
}

int sil_sessstore_save(struct sil_sessstore *st, uint32_t uid, const char *name,
                       const struct sil_chat_msg *msgs, size_t n_msgs, struct sil_error *err)
{
    if (st->dfd < 0) return 0;
    char file[2 * SIL_SESSFILE_NAME_MAX + 1];
    if (sil_sessfile_name_encode(name, file, sizeof file) < 0)
        return sil_errorf(err, -EINVAL, "a session name of %zu bytes", strlen(name));
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    /* saved_at orders the uid's files: a later save is always later, whatever the clock did */
    uint64_t at = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
    for (size_t i = 0; i < st->n; i++)
        if (st->ent[i].uid == uid && st->ent[i].saved_at >= at) at = st->ent[i].saved_at + 1;
    uint8_t *b;
    size_t len;
    int rc = sil_sessfile_encode(uid, name, at, msgs, n_msgs, &b, &len, err);
    if (rc == 0 && len > st->max_bytes)
        rc = sil_errorf(err, -EFBIG,
                        "the transcript takes %zu bytes, over saved_session_bytes (%llu)", len,
                        (unsigned long long)st->max_bytes);
    if (rc) {
        free(b);
        unlink_entry(st, uid, name); /* an older conversation must not come back instead */
        return rc;
    }
    enforce(st, uid, name, len);
    const int dfd = uid_dir(st, uid, true);
    const char *step = "open the directory";
    if (dfd < 0) {
        rc = dfd;
    } else {
        rc = sil_atomic_write(dfd, file, TMP_NAME, b, len, 0600, &step);
        if (rc && strcmp(step, "create") == 0) step = "create " TMP_NAME;
        close(dfd);
    }
    free(b);
    if (rc)
        return sil_errorf(err, rc, "%s/%u: %s failed: %s", st->path, (unsigned)uid, step,
                          strerror(-rc));
    struct sil_sessfile_entry e = {
        .uid = uid, .bytes = len, .saved_at = at, .n_msgs = (uint32_t)n_msgs};
    memcpy(e.name, name, strlen(name) + 1);
    if (remember(st, &e) < 0) return sil_errorf(err, -ENOMEM, "out of memory");
    return 0;
}

int sil_sessstore_load(struct sil_sessstore *st, uint32_t uid, const char *name,
                       struct sil_sessfile *out, struct sil_error *err)
{
    memset(out, 0, sizeof(*out));
    if (st->dfd < 0 || !find(st, uid, name)) return -ENOENT;
    char file[2 * SIL_SESSFILE_NAME_MAX + 1];
    if (sil_sessfile_name_encode(name, file, sizeof file) < 0) return -ENOENT;
    const int dfd = uid_dir(st, uid, false);
    char what[PATH_MAX + 300];
    snprintf(what, sizeof what, "%s/%u/%s", st->path, (unsigned)uid, file);
    int rc = dfd < 0 ? dfd : load_at(dfd, uid, file, name, what, out, err);
    if (dfd >= 0)
        close(dfd);
    else
        sil_errorf(err, rc, "%s/%u: %s", st->path, (unsigned)uid, strerror(-rc));
    if (rc < 0) {
        if (rc == -ENOENT) sil_errorf(err, rc, "%s: removed meanwhile", what);
        struct sil_sessfile_entry *e = find(st, uid, name);
        if (e) forget(st, e);
    }
    return rc;
}

int sil_sessstore_remove(struct sil_sessstore *st, uint32_t uid, const char *name)
{
    if (st->dfd < 0 || !find(st, uid, name)) return -ENOENT;
    return unlink_entry(st, uid, name);
}
