#include "daemon/engine/hostmem.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Every byte read here is treated as untrusted (a test tree, a container's bind mounts): reads
 * are bounded, numbers are plain decimal digits checked for overflow, paths are checked for
 * truncation, and anything that does not parse counts as not read. */

#define MEMINFO_MAX 16384 /* /proc/meminfo is about 1.5 KiB */
#define CGFILE_MAX 64     /* memory.max / memory.current: one number or "max" */
#define SELF_CGROUP_MAX (PATH_MAX + 4096)

/* The whole of path into buf (NUL-terminated), at most size - 1 bytes: the length, or -EFBIG
 * when the file is longer (a cut number would read as a smaller one), -EINVAL when it holds a
 * NUL byte (the parsers below work on C strings), else -errno. */
static ssize_t read_small(const char *path, char *buf, size_t size)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return -errno;
    size_t n = 0;
    ssize_t rc = 0;
    for (;;) {
        ssize_t got = read(fd, buf + n, size - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            rc = -errno;
            break;
        }
        if (got == 0) break;
        n += (size_t)got;
        if (n == size) { /* no room left for the NUL: longer than we take */
            rc = -EFBIG;
            break;
        }
    }
    close(fd);
    if (rc < 0) return rc;
    if (memchr(buf, 0, n)) return -EINVAL;
    buf[n] = 0;
    return (ssize_t)n;
}

/* Decimal digits s[0..len) (at least one, nothing else) into *out; -ERANGE past 64 bits. */
static int parse_u64(const char *s, size_t len, uint64_t *out)
{
    if (len == 0) return -EINVAL;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -EINVAL;
        const uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10) return -ERANGE;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* "MemAvailable:   123456 kB" at the start of a line, in bytes. */
static int mem_available(const char *root, uint64_t *out)
{
    char path[PATH_MAX], buf[MEMINFO_MAX];
    int n = snprintf(path, sizeof path, "%s/proc/meminfo", root);
    if (n < 0 || (size_t)n >= sizeof path) return -ENAMETOOLONG;
    ssize_t len = read_small(path, buf, sizeof buf);
    if (len < 0) return (int)len;
    static const char key[] = "MemAvailable:";
    for (const char *line = buf; *line;) {
        const char *eol = strchr(line, '\n');
        const size_t ll = eol ? (size_t)(eol - line) : strlen(line);
        if (ll >= sizeof key - 1 && memcmp(line, key, sizeof key - 1) == 0) {
            const char *p = line + sizeof key - 1, *end = line + ll;
            while (p < end && (*p == ' ' || *p == '\t'))
                p++;
            const char *digits = p;
            while (p < end && *p >= '0' && *p <= '9')
                p++;
            uint64_t kib;
            int rc = parse_u64(digits, (size_t)(p - digits), &kib);
            if (rc) return rc;
            if (end - p != 3 || memcmp(p, " kB", 3) != 0) return -EINVAL;
            if (kib > UINT64_MAX / 1024) return -ERANGE;
            *out = kib * 1024;
            return 0;
        }
        line += ll + (eol ? 1 : 0);
    }
    return -ENOENT;
}

/* A cgroup file of one number (or "max" where allowed, as UINT64_MAX) and a newline. */
static int cg_number(const char *dir, const char *name, bool max_ok, uint64_t *out)
{
    char path[PATH_MAX + 32], buf[CGFILE_MAX];
    int n = snprintf(path, sizeof path, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof path) return -ENAMETOOLONG;
    ssize_t len = read_small(path, buf, sizeof buf);
    if (len < 0) return (int)len;
    if (len > 0 && buf[len - 1] == '\n') buf[--len] = 0;
    if (max_ok && strcmp(buf, "max") == 0) {
        *out = UINT64_MAX;
        return 0;
    }
    return parse_u64(buf, (size_t)len, out);
}

/* The v2 path of this process ("0::/a/b" in proc/self/cgroup) into out, "" for the root: only
 * "/"-separated names, none of them empty, "." or "..", so the walk stays under the mount. */
static int self_cgroup(const char *root, char *out, size_t size)
{
    char path[PATH_MAX], buf[SELF_CGROUP_MAX];
    int n = snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    if (n < 0 || (size_t)n >= sizeof path) return -ENAMETOOLONG;
    ssize_t len = read_small(path, buf, sizeof buf);
    if (len < 0) return (int)len;
    for (const char *line = buf; *line;) {
        const char *eol = strchr(line, '\n');
        const size_t ll = eol ? (size_t)(eol - line) : strlen(line);
        if (ll >= 3 && memcmp(line, "0::", 3) == 0) {
            const char *p = line + 3, *end = line + ll;
            if (p == end || *p != '/') return -EINVAL;
            if (end - p == 1) { /* "/": the root itself */
                out[0] = 0;
                return 0;
            }
            if ((size_t)(end - p) >= size) return -ENAMETOOLONG;
            for (const char *c = p; c < end;) {
                const char *name = c + 1, *next = memchr(name, '/', (size_t)(end - name));
                if (!next) next = end;
                const size_t nl = (size_t)(next - name);
                if (nl == 0 || (nl == 1 && name[0] == '.') ||
                    (nl == 2 && name[0] == '.' && name[1] == '.'))
                    return -EINVAL;
                c = next;
            }
            memcpy(out, p, (size_t)(end - p));
            out[end - p] = 0;
            return 0;
        }
        line += ll + (eol ? 1 : 0);
    }
    return -ENOENT; /* cgroup v1 only: no unified hierarchy to read */
}

/* The least room left under memory.max from the process's cgroup up to the mount's root;
 * UINT64_MAX when no level sets a limit that can be read. */
static uint64_t cgroup_room(const char *root)
{
    char cg[PATH_MAX];
    if (self_cgroup(root, cg, sizeof cg) < 0) return UINT64_MAX;
    uint64_t room = UINT64_MAX;
    for (;;) {
        char dir[PATH_MAX];
        int n = snprintf(dir, sizeof dir, "%s/sys/fs/cgroup%s", root, cg);
        uint64_t max, cur;
        /* A level without memory.max (the root; a path the mount does not show, as in a
         * container without its own cgroup namespace) or with one that does not parse sets no
         * limit; the levels above it still count. */
        if (n >= 0 && (size_t)n < sizeof dir && cg_number(dir, "memory.max", true, &max) == 0 &&
            max != UINT64_MAX) {
            /* Without a readable memory.current the limit itself is all that is known: the
             * room is no larger than it. */
            if (cg_number(dir, "memory.current", false, &cur) < 0) cur = 0;
            const uint64_t r = cur >= max ? 0 : max - cur;
            if (r < room) room = r;
        }
        if (!cg[0]) break;
        *strrchr(cg, '/') = 0; /* self_cgroup gave "/a/b": never without a '/' */
    }
    return room;
}

void sil_host_spare(const char *root, struct sil_host_spare *out)
{
    if (!root) root = "";
    memset(out, 0, sizeof(*out));
    if (mem_available(root, &out->mem_available) < 0) out->mem_available = UINT64_MAX;
    out->cgroup_room = cgroup_room(root);
    const bool cg = out->cgroup_room < out->mem_available;
    out->bytes = cg ? out->cgroup_room : out->mem_available;
    snprintf(out->from, sizeof out->from, "%s",
             cg                                 ? "cgroup memory.max"
             : out->mem_available != UINT64_MAX ? "MemAvailable"
                                                : "unknown");
}

/* ---- the one host budget ---------------------------------------------------------------- */

const char *sil_host_cache_name(enum sil_host_cache c)
{
    switch (c) {
    case SIL_HOST_SNAPSHOTS: return "snapshots";
    case SIL_HOST_PREFIX: return "prefix_blocks";
    case SIL_HOST_SESSIONS: return "sessions";
    default: return "?";
    }
}

static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* The caches, in their order, give up to `need` bytes, none below floor[c]: what is still
 * needed after. */
static uint64_t give_way(struct sil_host_plan *out, const uint64_t *floor, uint64_t need)
{
    for (int c = 0; c < SIL_HOST_N_CACHE && need > 0; c++) {
        if (out->cache[c] <= floor[c]) continue;
        uint64_t give = out->cache[c] - floor[c];
        if (give > need) give = need;
        out->cache[c] -= give;
        need -= give;
        out->gave_way = true;
    }
    return need;
}

int sil_host_plan(const struct sil_host_plan_in *in, struct sil_host_plan *out)
{
    memset(out, 0, sizeof(*out));
    uint64_t caches = 0;
    for (int c = 0; c < SIL_HOST_N_CACHE; c++) {
        out->cache[c] = in->want[c];
        caches = add_sat(caches, in->want[c]);
    }
    out->min_budget = add_sat(in->fixed, in->experts_min ? in->experts_min : in->experts);
    out->experts = in->experts;
    if (in->budget == UINT64_MAX) return 0;
    if (in->budget < out->min_budget) {
        for (int c = 0; c < SIL_HOST_N_CACHE; c++)
            out->cache[c] = 0;
        out->gave_way = caches > 0;
        out->experts = 0;
        out->tier = in->experts_min > 0;
        return -ENOSPC;
    }
    const uint64_t room = in->budget - in->fixed;
    if (add_sat(in->experts, caches) <= room) return 0;
    /* first down to their floors: the experts whole, if that is enough */
    uint64_t floor[SIL_HOST_N_CACHE];
    for (int c = 0; c < SIL_HOST_N_CACHE; c++)
        floor[c] = in->want[c] < in->budget / 32 ? in->want[c] : in->budget / 32;
    uint64_t need = add_sat(in->experts, caches) - room;
    need = give_way(out, floor, need);
    if (need == 0) return 0;
    if (in->experts_min == 0) { /* no tier: the experts whole, the caches what is left */
        const uint64_t zero[SIL_HOST_N_CACHE] = {0};
        give_way(out, zero, need);
        return 0;
    }
    /* the experts in a tier of what the floors leave, else of their minimum, the caches giving
     * way again (in_budget >= min_budget: that always fits) */
    out->tier = true;
    caches = 0;
    for (int c = 0; c < SIL_HOST_N_CACHE; c++)
        caches += out->cache[c];
    if (caches + in->experts_min > room) {
        const uint64_t zero[SIL_HOST_N_CACHE] = {0};
        give_way(out, zero, caches + in->experts_min - room);
        caches = 0;
        for (int c = 0; c < SIL_HOST_N_CACHE; c++)
            caches += out->cache[c];
    }
    out->experts = room - caches;
    return 0;
}
