/* Model names (daemon/models.c): which names are valid, the name a file is listed under, the
 * listing of a directory (valid .gguf files only, sorted, the default model added once) and
 * resolution, which never yields a path outside the directory. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/models.h"

static char dir[64], models[96];

static void touch(const char *name, size_t bytes)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", models, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    for (size_t i = 0; i < bytes; i++) fputc('x', f);
    fclose(f);
}

static int setup(void **state)
{
    snprintf(dir, sizeof dir, "/tmp/test_models.XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(models, sizeof models, "%s/models", dir);
    assert_int_equal(mkdir(models, 0755), 0);
    return 0;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static bool valid(const char *s) { return sil_model_name_valid(s, strlen(s)); }

static void test_names(void **state)
{
    assert_true(valid("qwen3-tiny-Q8_0"));
    assert_true(valid("Qwen3.5-35B-A3B-Q4_K_M"));
    assert_true(valid("llama3:8b"));
    assert_true(valid("a"));
    assert_false(valid(""));
    assert_false(valid(".."));
    assert_false(valid("../x"));
    assert_false(valid("a/b"));
    assert_false(valid("/etc/passwd"));
    assert_false(valid(".hidden"));
    assert_false(valid("-flag"));
    assert_false(valid("with space"));
    assert_false(valid("tab\there"));
    assert_false(valid("caf\xc3\xa9"));
    assert_false(sil_model_name_valid("a\0b", 3)); /* a NUL inside the bytes given */
    char big[SIL_MODEL_NAME_MAX + 2];
    memset(big, 'a', sizeof big);
    assert_true(sil_model_name_valid(big, SIL_MODEL_NAME_MAX));
    assert_false(sil_model_name_valid(big, SIL_MODEL_NAME_MAX + 1));

    char out[SIL_MODEL_NAME_MAX + 1];
    assert_true(sil_model_name_of("/m/qwen3-tiny-Q8_0.gguf", out, sizeof out));
    assert_string_equal(out, "qwen3-tiny-Q8_0");
    assert_true(sil_model_name_of("x.gguf", out, sizeof out));
    assert_string_equal(out, "x");
    assert_false(sil_model_name_of("/m/.gguf", out, sizeof out));
    assert_false(sil_model_name_of("/m/notes.txt", out, sizeof out));
    assert_false(sil_model_name_of("/m/with space.gguf", out, sizeof out));
    assert_false(sil_model_name_of("/m/.hidden.gguf", out, sizeof out));
}

static void test_list(void **state)
{
    touch("b-model.gguf", 10);
    touch("a-model.gguf", 20);
    touch("with space.gguf", 1);
    touch(".hidden.gguf", 1);
    touch("notes.txt", 1);
    char sub[160];
    snprintf(sub, sizeof sub, "%s/dir.gguf", models);
    assert_int_equal(mkdir(sub, 0755), 0);
    char outside[160];
    snprintf(outside, sizeof outside, "%s/outside.gguf", dir);
    FILE *f = fopen(outside, "w");
    assert_non_null(f);
    fputs("xyz", f);
    fclose(f);

    struct sil_model_entry *l = NULL;
    size_t n = 0;
    assert_int_equal(sil_models_list(models, NULL, &l, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(l[0].name, "a-model");
    assert_int_equal(l[0].size, 20);
    assert_string_equal(l[1].name, "b-model");
    assert_int_equal(l[1].size, 10);
    sil_models_free(l);

    /* The default model elsewhere is listed after the directory's, once. */
    assert_int_equal(sil_models_list(models, outside, &l, &n), 0);
    assert_int_equal(n, 3);
    assert_string_equal(l[2].name, "outside");
    assert_string_equal(l[2].path, outside);
    sil_models_free(l);
    char same[200];
    snprintf(same, sizeof same, "%s/a-model.gguf", models);
    assert_int_equal(sil_models_list(models, same, &l, &n), 0);
    assert_int_equal(n, 2);
    sil_models_free(l);

    /* A missing directory is an empty list. */
    assert_int_equal(sil_models_list("/nonexistent/models", NULL, &l, &n), 0);
    assert_int_equal(n, 0);
    sil_models_free(l);
}

static void test_resolve(void **state)
{
    touch("c-model.gguf", 5);
    char outside[160], path[PATH_MAX], why[256];
    snprintf(outside, sizeof outside, "%s/outside.gguf", dir);
    FILE *f = fopen(outside, "w");
    assert_non_null(f);
    fclose(f);
#define RESOLVE(name, def) sil_models_resolve(models, def, name, strlen(name), path, sizeof path, why, sizeof why)
    assert_int_equal(RESOLVE("c-model", NULL), 0);
    assert_non_null(strstr(path, "/models/c-model.gguf"));
    assert_int_equal(RESOLVE("c-model.gguf", NULL), 0);
    assert_non_null(strstr(path, "/models/c-model.gguf"));
    assert_int_equal(RESOLVE("nope", NULL), -ENOENT);
    assert_non_null(strstr(why, "no model named 'nope'"));
    /* Names that would leave the directory are not names at all. */
    const char *hostile[] = { "../outside", "..", "a/b", "/etc/passwd", ".hidden",
                              "c-model/../c-model", "../models/c-model", "" };
    for (size_t i = 0; i < sizeof hostile / sizeof *hostile; i++) {
        path[0] = 0;
        assert_int_equal(RESOLVE(hostile[i], outside), -EINVAL);
        assert_non_null(strstr(why, "is not a model name"));
        assert_null(strstr(path, "outside"));
    }
    /* The default model by its own name, and only that name. */
    assert_int_equal(RESOLVE("outside", outside), 0);
    assert_string_equal(path, outside);
    assert_int_equal(RESOLVE("outside", NULL), -ENOENT);
    /* A directory named like a model is no model. */
    char sub[160];
    snprintf(sub, sizeof sub, "%s/sub.gguf", models);
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(RESOLVE("sub", NULL), -ENOENT);
#undef RESOLVE
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test_setup_teardown(test_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resolve, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
