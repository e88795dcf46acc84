/* What the host can spare (daemon/engine/hostmem.c), on fake trees laid out under a temporary
 * directory that stands for /: MemAvailable alone, a limit on the process's cgroup, a tighter one
 * on an ancestor, a cgroup over its limit, numbers that must not parse, missing files, cgroup v1
 * only, and cgroup paths that would leave the mount. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "daemon/engine/hostmem.h"
#include "tests/testutil.h"

/* root/rel with len bytes of text, its directories made as needed. */
static void put_n(const char *root, const char *rel, const char *text, size_t len)
{
    char path[4096];
    int n = snprintf(path, sizeof path, "%s/%s", root, rel);
    assert_true(n > 0 && (size_t)n < sizeof path);
    for (char *s = path + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = 0;
        assert_true(mkdir(path, 0755) == 0 || errno == EEXIST);
        *s = '/';
    }
    assert_int_equal(tu_write_file(path, text, len), 0);
}

static void put(const char *root, const char *rel, const char *text)
{
    put_n(root, rel, text, strlen(text));
}

/* A cgroup directory's limit and use, under the fake mount. */
static void cg(const char *root, const char *cgpath, const char *max, const char *cur)
{
    char rel[512];
    if (max) {
        snprintf(rel, sizeof rel, "sys/fs/cgroup%s/memory.max", cgpath);
        put(root, rel, max);
    }
    if (cur) {
        snprintf(rel, sizeof rel, "sys/fs/cgroup%s/memory.current", cgpath);
        put(root, rel, cur);
    }
}

static const char meminfo_1g[] = "MemTotal:       16384000 kB\n"
                                 "MemFree:          100000 kB\n"
                                 "MemAvailable:    1048576 kB\n"
                                 "Buffers:            1000 kB\n";

static char *tree(void)
{
    char *root = tu_tmpdir_create();
    assert_non_null(root);
    return root;
}

static void drop(char *root)
{
    assert_int_equal(tu_tmpdir_remove(root), 0);
    free(root);
}

static void test_no_limit(void **state)
{
    char *root = tree();
    put(root, "proc/meminfo", meminfo_1g);
    put(root, "proc/self/cgroup", "0::/user.slice/u.scope\n");
    cg(root, "/user.slice/u.scope", "max\n", "5000\n");
    cg(root, "/user.slice", "max\n", "9000\n");
    struct sil_host_spare s;
    sil_host_spare(root, &s);
    assert_true(s.mem_available == 1048576ull * 1024);
    assert_true(s.cgroup_room == UINT64_MAX);
    assert_true(s.bytes == s.mem_available);
    assert_string_equal(s.from, "MemAvailable");
    drop(root);
}

static void test_leaf_limit(void **state)
{
    char *root = tree();
    put(root, "proc/meminfo", meminfo_1g);
    put(root, "proc/self/cgroup", "0::/system.slice/siliceod.service\n");
    cg(root, "/system.slice/siliceod.service", "1048576\n", "262144\n");
    cg(root, "/system.slice", "max\n", "9000000\n");
    struct sil_host_spare s;
    sil_host_spare(root, &s);
    assert_true(s.mem_available == 1048576ull * 1024);
    assert_true(s.cgroup_room == 1048576 - 262144);
    assert_true(s.bytes == 1048576 - 262144);
    assert_string_equal(s.from, "cgroup memory.max");

    /* A limit looser than MemAvailable is reported but does not bind. */
    cg(root, "/system.slice/siliceod.service", "8589934592\n", "1073741824\n");
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 8589934592ull - 1073741824ull);
    assert_true(s.bytes == 1048576ull * 1024);
    assert_string_equal(s.from, "MemAvailable");
    drop(root);
}

static void test_ancestor_tighter(void **state)
{
    char *root = tree();
    put(root, "proc/meminfo", meminfo_1g);
    put(root, "proc/self/cgroup", "0::/a/b/c\n");
    cg(root, "/a/b/c", "1048576\n", "262144\n"); /* 786432 left */
    cg(root, "/a/b", "600000\n", "500000\n");    /* 100000 left: the tightest */
    cg(root, "/a", "10000000\n", "0\n");
    struct sil_host_spare s;
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 100000);
    assert_true(s.bytes == 100000);
    assert_string_equal(s.from, "cgroup memory.max");

    /* The mount's root counts too (a container's own cgroup namespace shows "0::/"). */
    cg(root, "", "50000\n", "20000\n");
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 30000);

    /* A path the mount does not show (a container without its own namespace): the levels that
     * exist still count. */
    put(root, "proc/self/cgroup", "0::/docker/0123abcd\n");
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 30000);
    put(root, "proc/self/cgroup", "0::/\n");
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 30000);
    drop(root);
}

static void test_current_over_max(void **state)
{
    char *root = tree();
    put(root, "proc/meminfo", meminfo_1g);
    put(root, "proc/self/cgroup", "0::/s\n");
    cg(root, "/s", "1000\n", "5000\n");
    struct sil_host_spare s;
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 0);
    assert_true(s.bytes == 0);
    assert_string_equal(s.from, "cgroup memory.max");
    cg(root, "/s", "5000\n", "5000\n"); /* exactly at the limit */
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 0);
    drop(root);
}

static void test_garbage_cgroup(void **state)
{
    char digits[200];
    memset(digits, '7', sizeof digits - 2);
    digits[sizeof digits - 2] = '\n';
    digits[sizeof digits - 1] = 0;
    const char *const bad[] = {
        "",
        "\n",
        "12abc\n",
        "-5\n",
        " 5\n",
        "5 \n",
        "0x10\n",
        "1e6\n",
        "maxx\n",
        "Max\n",
        "5\n\n",
        "+5\n",
        "18446744073709551616\n", /* 2^64 */
        "99999999999999999999999\n",
        digits,
    };
    char *root = tree();
    put(root, "proc/meminfo", meminfo_1g);
    put(root, "proc/self/cgroup", "0::/p/leaf\n");
    cg(root, "/p", "10000\n", "3000\n"); /* 7000 left above the garbage */
    struct sil_host_spare s;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cg(root, "/p/leaf", bad[i], "1\n");
        sil_host_spare(root, &s);
        if (s.cgroup_room != 7000)
            fail_msg("memory.max \"%.40s\": room %llu, not the parent's 7000", bad[i],
                     (unsigned long long)s.cgroup_room);
    }
    /* A NUL inside the number: "5\0" must not read as 5. */
    put_n(root, "sys/fs/cgroup/p/leaf/memory.max", "5\0\n", 3);
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 7000);

    /* The largest number that fits is read. */
    cg(root, "/p", "max\n", NULL);
    cg(root, "/p/leaf", "18446744073709551614\n", "4\n");
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 18446744073709551610ull);

    /* A memory.current that does not parse: the limit alone bounds the room. */
    cg(root, "/p", "10000\n", "3000\n");
    cg(root, "/p/leaf", "5000\n", "lots\n");
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 5000);
    cg(root, "/p/leaf", "5000\n", "99999999999999999999999\n");
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 5000);
    drop(root);
}

static void test_garbage_meminfo(void **state)
{
    const char *const bad[] = {
        "MemAvailable: 12x kB\n",
        "MemAvailable: kB\n",
        "MemAvailable: -5 kB\n",
        "MemAvailable: 5 MB\n",
        "MemAvailable: 5\n",
        "MemAvailable: 5 kB trailing\n",
        "MemAvailable: 18014398509481984 kB\n", /* 2^54 KiB: past 64 bits in bytes */
        "MemAvailable: 99999999999999999999999 kB\n",
        "MemTotal: 5 kB\n XMemAvailable: 5 kB\n",
        "MemTotal: 5 kB\nMemAvail: 5 kB\n",
    };
    char *root = tree();
    struct sil_host_spare s;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        put(root, "proc/meminfo", bad[i]);
        sil_host_spare(root, &s);
        if (s.mem_available != UINT64_MAX)
            fail_msg("meminfo \"%s\" read as %llu", bad[i], (unsigned long long)s.mem_available);
        assert_true(s.bytes == UINT64_MAX);
        assert_string_equal(s.from, "unknown");
    }
    /* The largest that fits, the line not first and without a final newline. */
    put(root, "proc/meminfo", "MemTotal: 5 kB\nMemAvailable:\t18014398509481983 kB");
    sil_host_spare(root, &s);
    assert_true(s.mem_available == 18014398509481983ull * 1024);

    /* A file longer than any meminfo: not read, though its first line would parse. */
    size_t len = 64 * 1024;
    char *big = malloc(len);
    assert_non_null(big);
    memset(big, 'x', len);
    memcpy(big, "MemAvailable: 7 kB\n", 19);
    put_n(root, "proc/meminfo", big, len);
    free(big);
    sil_host_spare(root, &s);
    assert_true(s.mem_available == UINT64_MAX);
    drop(root);
}

static void test_missing(void **state)
{
    char *root = tree();
    struct sil_host_spare s;
    sil_host_spare(root, &s); /* nothing at all */
    assert_true(s.mem_available == UINT64_MAX && s.cgroup_room == UINT64_MAX);
    assert_true(s.bytes == UINT64_MAX);
    assert_string_equal(s.from, "unknown");

    /* No meminfo: the cgroup alone binds. */
    put(root, "proc/self/cgroup", "0::/s\n");
    cg(root, "/s", "4096\n", "1024\n");
    sil_host_spare(root, &s);
    assert_true(s.mem_available == UINT64_MAX);
    assert_true(s.bytes == 3072);
    assert_string_equal(s.from, "cgroup memory.max");

    /* memory.current missing: the limit is the most the room can be. */
    char p[4096];
    snprintf(p, sizeof p, "%s/sys/fs/cgroup/s/memory.current", root);
    assert_int_equal(remove(p), 0);
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 4096);

    /* memory.max missing: no limit at that level. */
    snprintf(p, sizeof p, "%s/sys/fs/cgroup/s/memory.max", root);
    assert_int_equal(remove(p), 0);
    cg(root, "/s", NULL, "1024\n");
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == UINT64_MAX);

    /* No proc/self/cgroup: no cgroup is read, though a limit sits at the mount's root. */
    cg(root, "", "4096\n", "0\n");
    snprintf(p, sizeof p, "%s/proc/self/cgroup", root);
    assert_int_equal(remove(p), 0);
    put(root, "proc/meminfo", meminfo_1g);
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == UINT64_MAX);
    assert_true(s.bytes == 1048576ull * 1024);
    assert_string_equal(s.from, "MemAvailable");
    drop(root);
}

static void test_cgroup_v1(void **state)
{
    char *root = tree();
    put(root, "proc/meminfo", meminfo_1g);
    cg(root, "/lim", "4096\n", "1024\n");
    cg(root, "", "8192\n", "0\n");
    /* v1 lines only: there is no unified hierarchy for this process, so nothing is read. */
    put(root, "proc/self/cgroup", "12:memory:/lim\n4:cpu,cpuacct:/lim\n1:name=systemd:/lim\n");
    struct sil_host_spare s;
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == UINT64_MAX);
    assert_string_equal(s.from, "MemAvailable");
    /* v1 lines that look like the unified one but are not ("1::", "10::" are not "0::"). */
    put(root, "proc/self/cgroup", "1::/lim\n10::/lim\n");
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == UINT64_MAX);
    /* Hybrid: the "0::" line among v1 lines is the one used. */
    put(root, "proc/self/cgroup", "12:memory:/other\n0::/lim\n1:name=systemd:/other\n");
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 3072);
    assert_true(s.bytes == 3072);
    drop(root);
}

/* A cgroup path is a name under the mount: one that would leave it, or is not absolute, is not
 * followed (and no limit outside the mount is read). */
static void test_cgroup_path_checked(void **state)
{
    char *root = tree();
    put(root, "proc/meminfo", meminfo_1g);
    put(root, "sys/fs/escape/memory.max", "100\n"); /* sys/fs/cgroup/../escape */
    put(root, "sys/fs/escape/memory.current", "0\n");
    cg(root, "/escape", "200\n", "0\n");
    const char *const bad[] = {
        "0::/../escape\n", "0::/a/../../escape\n", "0::escape\n",   "0::\n",
        "0::/./escape\n",  "0:://escape\n",        "0::/escape/\n", "0::/escape/..\n",
    };
    struct sil_host_spare s;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        put(root, "proc/self/cgroup", bad[i]);
        sil_host_spare(root, &s);
        if (s.cgroup_room != UINT64_MAX)
            fail_msg("cgroup \"%s\" followed: room %llu", bad[i],
                     (unsigned long long)s.cgroup_room);
    }
    /* A NUL byte cuts nothing short: "/escape\0/x" is not read as "/escape". */
    put_n(root, "proc/self/cgroup", "0::/escape\0/x\n", 14);
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == UINT64_MAX);
    put(root, "proc/self/cgroup", "0::/escape\n"); /* the same name, inside the mount */
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == 200);

    /* A path longer than any the walk takes. */
    char *line = malloc(8192);
    assert_non_null(line);
    memcpy(line, "0::", 3);
    for (int i = 0; i < 1600; i++)
        memcpy(line + 3 + 4 * i, "/abc", 4);
    memcpy(line + 3 + 4 * 1600, "\n", 2);
    put(root, "proc/self/cgroup", line);
    free(line);
    sil_host_spare(root, &s);
    assert_true(s.cgroup_room == UINT64_MAX);
    drop(root);
}

/* A root so long that no path fits: nothing read, nothing overrun. */
static void test_root_too_long(void **state)
{
    char *root = malloc(6000);
    assert_non_null(root);
    memset(root, 'r', 5999);
    root[0] = '/';
    root[5999] = 0;
    struct sil_host_spare s;
    sil_host_spare(root, &s);
    assert_true(s.mem_available == UINT64_MAX && s.cgroup_room == UINT64_MAX);
    assert_string_equal(s.from, "unknown");
    free(root);
}

/* This machine: whatever its cgroups, MemAvailable is read and the smaller figure wins. */
static void test_this_host(void **state)
{
    const char *const roots[] = {NULL, ""};
    for (int i = 0; i < 2; i++) {
        struct sil_host_spare s;
        sil_host_spare(roots[i], &s);
        assert_true(s.mem_available != UINT64_MAX && s.mem_available > 0);
        assert_true(s.bytes == (s.cgroup_room < s.mem_available ? s.cgroup_room : s.mem_available));
        assert_string_equal(s.from,
                            s.cgroup_room < s.mem_available ? "cgroup memory.max" : "MemAvailable");
    }
}

/* ---- sil_host_plan ------------------------------------------------------------------------ */

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static struct sil_host_plan_in plan_in(uint64_t budget, uint64_t fixed, uint64_t experts,
                                       uint64_t experts_min)
{
    struct sil_host_plan_in in = {budget, fixed, experts, experts_min, {GiB, GiB, GiB}};
    return in;
}

static uint64_t plan_total(const struct sil_host_plan *p)
{
    uint64_t t = p->experts;
    for (int c = 0; c < SIL_HOST_N_CACHE; c++)
        t += p->cache[c];
    return t;
}

/* Room for everything: every cache what it wanted, the experts whole, no tier. */
static void test_plan_fits(void **state)
{
    (void)state;
    struct sil_host_plan_in in = plan_in(64 * GiB, 2 * GiB, 18 * GiB, 40 * MiB);
    struct sil_host_plan p;
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_false(p.tier);
    assert_false(p.gave_way);
    assert_true(p.experts == 18 * GiB);
    for (int c = 0; c < SIL_HOST_N_CACHE; c++)
        assert_true(p.cache[c] == GiB);
    assert_true(p.min_budget == 2 * GiB + 40 * MiB);
    /* an unknown budget grants everything too */
    in.budget = UINT64_MAX;
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_false(p.tier || p.gave_way);
}

/* A little short: the snapshots give way first, and only as much as the experts need to fit
 * whole; then the prefix blocks. */
static void test_plan_order(void **state)
{
    (void)state;
    struct sil_host_plan_in in = {32 * GiB, 0, 27 * GiB, 40 * MiB, {2 * GiB, 2 * GiB, 2 * GiB}};
    struct sil_host_plan p;
    /* 1 GiB short; the floors are 32/32 = 1 GiB: the snapshots alone give way */
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_false(p.tier);
    assert_true(p.gave_way);
    assert_true(p.experts == 27 * GiB);
    assert_true(p.cache[SIL_HOST_SNAPSHOTS] == GiB);
    assert_true(p.cache[SIL_HOST_PREFIX] == 2 * GiB);
    assert_true(p.cache[SIL_HOST_SESSIONS] == 2 * GiB);
    /* 1.5 GiB short: the snapshots down to their floor, then the prefix blocks */
    in.experts = 27 * GiB + 512 * MiB;
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_false(p.tier);
    assert_true(p.experts == in.experts);
    assert_true(p.cache[SIL_HOST_SNAPSHOTS] == GiB);
    assert_true(p.cache[SIL_HOST_PREFIX] == GiB + 512 * MiB);
    assert_true(p.cache[SIL_HOST_SESSIONS] == 2 * GiB);
    assert_true(plan_total(&p) == 32 * GiB);
}

/* Far short (a 16 GiB machine and a 20 GiB model): every cache at its floor, the experts in a
 * tier of the rest. */
static void test_plan_tier(void **state)
{
    (void)state;
    struct sil_host_plan_in in = plan_in(10 * GiB + 2 * GiB, 2 * GiB, 18 * GiB, 40 * MiB);
    struct sil_host_plan p;
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_true(p.tier && p.gave_way);
    for (int c = 0; c < SIL_HOST_N_CACHE; c++)
        assert_true(p.cache[c] == 384 * MiB); /* 12 GiB / 32 */
    assert_true(p.experts == 10 * GiB - 3 * 384 * MiB);
    assert_true(plan_total(&p) == 10 * GiB);
    /* a cache that wanted less than its floor keeps what it wanted */
    in.want[SIL_HOST_SESSIONS] = 100 * MiB;
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_true(p.cache[SIL_HOST_SESSIONS] == 100 * MiB);
    assert_true(p.experts == 10 * GiB - 2 * 384 * MiB - 100 * MiB);
}

/* Near the minimum: the floors stay while the tier still gets its minimum; just above the
 * minimum the caches give way down to nothing, in order; under it, -ENOSPC and the minimum. */
static void test_plan_minimum(void **state)
{
    (void)state;
    /* room 256 MiB beside a fixed 1.75 GiB: floors of 64 MiB each leave the tier 64 */
    struct sil_host_plan_in in = plan_in(2 * GiB, 2 * GiB - 256 * MiB, 18 * GiB, 40 * MiB);
    struct sil_host_plan p;
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_true(p.tier);
    for (int c = 0; c < SIL_HOST_N_CACHE; c++)
        assert_true(p.cache[c] == 64 * MiB);
    assert_true(p.experts == 64 * MiB);
    /* room 192 MiB: the floors would leave the tier nothing; the snapshots give it 40 MiB */
    in.fixed = 2 * GiB - 192 * MiB;
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_true(p.tier);
    assert_true(p.experts == 40 * MiB);
    assert_true(p.cache[SIL_HOST_SNAPSHOTS] == 24 * MiB);
    assert_true(p.cache[SIL_HOST_PREFIX] == 64 * MiB);
    assert_true(p.cache[SIL_HOST_SESSIONS] == 64 * MiB);
    /* room 100 MiB: the snapshots and the prefix blocks give way to nothing, the sessions 4 MiB */
    in.fixed = 2 * GiB - 100 * MiB;
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_true(p.experts == 40 * MiB);
    assert_true(p.cache[SIL_HOST_SNAPSHOTS] == 0);
    assert_true(p.cache[SIL_HOST_PREFIX] == 0);
    assert_true(p.cache[SIL_HOST_SESSIONS] == 60 * MiB);
    in.fixed = 2 * GiB - 40 * MiB; /* room for the tier's minimum alone */
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_true(p.experts == 40 * MiB && plan_total(&p) == 40 * MiB);
    in.fixed = 2 * GiB - 40 * MiB + 1;
    assert_int_equal(sil_host_plan(&in, &p), -ENOSPC);
    assert_true(p.min_budget == 2 * GiB + 1);
    /* under the fixed part alone */
    in.fixed = 3 * GiB;
    assert_int_equal(sil_host_plan(&in, &p), -ENOSPC);
    assert_true(p.min_budget == 3 * GiB + 40 * MiB);
}

/* No tier possible (no experts, or experts that must fit whole): the caches give way to nothing
 * before the plan fails, and the minimum is the fixed part and all the experts. */
static void test_plan_no_tier(void **state)
{
    (void)state;
    struct sil_host_plan_in in = plan_in(4 * GiB, 3 * GiB, 0, 0);
    struct sil_host_plan p;
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_false(p.tier);
    /* room 1 GiB for 3 wanted: floors of 128 MiB, the sessions give the last 256 MiB */
    assert_true(p.cache[SIL_HOST_SNAPSHOTS] == 128 * MiB);
    assert_true(p.cache[SIL_HOST_PREFIX] == 128 * MiB);
    assert_true(p.cache[SIL_HOST_SESSIONS] == GiB - 256 * MiB);
    in = plan_in(4 * GiB, GiB, 2 * GiB, 0);
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_false(p.tier);
    assert_true(p.experts == 2 * GiB && plan_total(&p) == 3 * GiB);
    in.budget = 3 * GiB + MiB; /* the floors do not fit beside the experts: to nothing, in order */
    assert_int_equal(sil_host_plan(&in, &p), 0);
    assert_false(p.tier);
    assert_true(p.experts == 2 * GiB);
    assert_true(p.cache[SIL_HOST_SNAPSHOTS] == 0);
    assert_true(p.cache[SIL_HOST_PREFIX] == 0);
    assert_true(p.cache[SIL_HOST_SESSIONS] == MiB);
    in.budget = 3 * GiB - 1;
    assert_int_equal(sil_host_plan(&in, &p), -ENOSPC);
    assert_true(p.min_budget == 3 * GiB);
    assert_string_equal(sil_host_cache_name(SIL_HOST_PREFIX), "prefix_blocks");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_limit),
        cmocka_unit_test(test_leaf_limit),
        cmocka_unit_test(test_ancestor_tighter),
        cmocka_unit_test(test_current_over_max),
        cmocka_unit_test(test_garbage_cgroup),
        cmocka_unit_test(test_garbage_meminfo),
        cmocka_unit_test(test_missing),
        cmocka_unit_test(test_cgroup_v1),
        cmocka_unit_test(test_cgroup_path_checked),
        cmocka_unit_test(test_root_too_long),
        cmocka_unit_test(test_this_host),
        cmocka_unit_test(test_plan_fits),
        cmocka_unit_test(test_plan_order),
        cmocka_unit_test(test_plan_tier),
        cmocka_unit_test(test_plan_minimum),
        cmocka_unit_test(test_plan_no_tier),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
