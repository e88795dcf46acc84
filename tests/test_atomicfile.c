/* Atomic file replacement (kernels/atomicfile.c): a new file and a replaced one hold exactly the
 * bytes given, with the mode given, and no temporary is left; a temporary left by a write cut
 * short (even a link) is replaced, never followed; names relative to a directory fd and to the
 * working directory both work; and a failed write (an unwritable directory, a temporary that
 * cannot be created, a rename that cannot happen) leaves the old file as it was. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/atomicfile.h"
#include "tests/testutil.h"

static const char old_text[] = "the old contents\n";
static const char new_text[] = "the new contents, longer than the old\n";

static void assert_file(const char *path, const char *want)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char buf[256];
    const size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_int_equal(n, strlen(want));
    assert_memory_equal(buf, want, n);
}

static void assert_absent(const char *dir, const char *name)
{
    char *p = tu_path_join(dir, name);
    struct stat st;
    assert_int_equal(lstat(p, &st), -1);
    assert_int_equal(errno, ENOENT);
    free(p);
}

static int open_dir(const char *dir)
{
    const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(fd >= 0);
    return fd;
}

static void write_at(int dfd, const char *name, const char *text)
{
    const char *step = "unset";
    assert_int_equal(sil_atomic_write(dfd, name, ".tmp", text, strlen(text), 0600, &step), 0);
    assert_null(step);
}

static void test_new_and_replaced(void **state)
{
    char *dir = tu_tmpdir_create(), *path = tu_path_join(dir, "f");
    const int dfd = open_dir(dir);
    write_at(dfd, "f", old_text);
    assert_file(path, old_text);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);
    write_at(dfd, "f", new_text);
    assert_file(path, new_text);
    write_at(dfd, "f", ""); /* an empty file is a file too */
    assert_file(path, "");
    assert_absent(dir, ".tmp");
    assert_int_equal(sil_atomic_write(dfd, "g", ".tmp", "x", 1, 0640, NULL), 0);
    char *g = tu_path_join(dir, "g");
    assert_int_equal(stat(g, &st), 0);
    const mode_t mask = umask(0);
    umask(mask);
    assert_int_equal(st.st_mode & 0777, 0640 & ~mask);
    close(dfd);
    free(g);
    free(path);
    tu_tmpdir_remove(dir);
    free(dir);
}

/* A temporary of an earlier, interrupted write is removed; a link there is not followed. */
static void test_stale_temporary(void **state)
{
    char *dir = tu_tmpdir_create(), *tmp = tu_path_join(dir, ".tmp"),
         *victim = tu_path_join(dir, "victim"), *path = tu_path_join(dir, "f");
    const int dfd = open_dir(dir);
    FILE *f = fopen(tmp, "w");
    assert_non_null(f);
    fputs("half a file", f);
    fclose(f);
    write_at(dfd, "f", old_text);
    assert_file(path, old_text);
    assert_absent(dir, ".tmp");

    f = fopen(victim, "w");
    assert_non_null(f);
    fputs("not to be touched", f);
    fclose(f);
    assert_int_equal(symlink(victim, tmp), 0);
    write_at(dfd, "f", new_text);
    assert_file(path, new_text);
    assert_file(victim, "not to be touched");
    assert_absent(dir, ".tmp");
    close(dfd);
    free(path);
    free(victim);
    free(tmp);
    tu_tmpdir_remove(dir);
    free(dir);
}

/* AT_FDCWD with a path in another directory, as the heat map is written; and a bare name in the
 * working directory. */
static void test_cwd_paths(void **state)
{
    char *dir = tu_tmpdir_create(), *path = tu_path_join(dir, "heat"),
         *tmp = tu_path_join(dir, "heat.1~");
    const char *step;
    assert_int_equal(sil_atomic_write(AT_FDCWD, path, tmp, old_text, strlen(old_text), 0600, &step),
                     0);
    assert_file(path, old_text);
    assert_absent(dir, "heat.1~");

    char cwd[4096];
    assert_non_null(getcwd(cwd, sizeof cwd));
    assert_int_equal(chdir(dir), 0);
    assert_int_equal(
        sil_atomic_write(AT_FDCWD, "heat", "heat.2~", new_text, strlen(new_text), 0600, &step), 0);
    assert_int_equal(chdir(cwd), 0);
    assert_file(path, new_text);
    assert_absent(dir, "heat.2~");
    free(tmp);
    free(path);
    tu_tmpdir_remove(dir);
    free(dir);
}

/* In a directory the caller may not write, the old file stays. Root writes anywhere, so then the
 * write is tried by a child that has given up root. */
static void test_unwritable_directory(void **state)
{
    char *dir = tu_tmpdir_create(), *path = tu_path_join(dir, "f");
    int dfd = open_dir(dir);
    write_at(dfd, "f", old_text);
    close(dfd);
    assert_int_equal(chmod(path, 0644), 0);
    assert_int_equal(chmod(dir, 0555), 0);
    const pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (geteuid() == 0 && (setgid(65534) < 0 || setuid(65534) < 0)) _exit(10);
        const int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) _exit(11);
        const char *step = NULL;
        const int rc = sil_atomic_write(fd, "f", ".tmp", new_text, strlen(new_text), 0600, &step);
        _exit(rc == -EACCES && step && strcmp(step, "create") == 0 ? 0 : 12);
    }
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    assert_file(path, old_text);
    assert_absent(dir, ".tmp");
    assert_int_equal(chmod(dir, 0700), 0);
    free(path);
    tu_tmpdir_remove(dir);
    free(dir);
}

/* Failures any user meets: a temporary that cannot be created (a directory is in its place) and
 * a rename that cannot happen (the name is a directory that is not empty). */
static void test_failed_steps_keep_the_old_file(void **state)
{
    char *dir = tu_tmpdir_create(), *path = tu_path_join(dir, "f"),
         *tmp = tu_path_join(dir, ".tmp");
    const int dfd = open_dir(dir);
    write_at(dfd, "f", old_text);
    assert_int_equal(mkdir(tmp, 0700), 0);
    const char *step = NULL;
    assert_int_equal(sil_atomic_write(dfd, "f", ".tmp", new_text, strlen(new_text), 0600, &step),
                     -EEXIST);
    assert_string_equal(step, "create");
    assert_file(path, old_text);
    assert_int_equal(rmdir(tmp), 0);

    assert_int_equal(mkdirat(dfd, "d", 0700), 0);
    assert_int_equal(sil_atomic_write(dfd, "d/x", "d/.tmp", "x", 1, 0600, NULL), 0);
    step = NULL;
    const int rc = sil_atomic_write(dfd, "d", ".tmp", new_text, strlen(new_text), 0600, &step);
    assert_true(rc == -EISDIR || rc == -ENOTEMPTY || rc == -EEXIST);
    assert_string_equal(step, "rename");
    assert_absent(dir, ".tmp");
    char *x = tu_path_join(dir, "d/x");
    assert_file(x, "x");
    assert_file(path, old_text);
    free(x);
    close(dfd);
    free(tmp);
    free(path);
    tu_tmpdir_remove(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_new_and_replaced),
        cmocka_unit_test(test_stale_temporary),
        cmocka_unit_test(test_cwd_paths),
        cmocka_unit_test(test_unwritable_directory),
        cmocka_unit_test(test_failed_steps_keep_the_old_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
