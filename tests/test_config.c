/* siliceod configuration: sizes, the config file (errors name file and line), flags overriding
 * the file, and what SIGHUP may change live. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "daemon/config.h"

static char dir[64];

static int setup(void **state)
{
    strcpy(dir, "/tmp/sil-test-config-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static const char *write_file(const char *name, const char *text)
{
    static char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static void test_sizes(void **state)
{
    uint64_t v;
    assert_int_equal(sil_parse_size("4G", &v), 0);
    assert_true(v == 4ull << 30);
    assert_int_equal(sil_parse_size("512MiB", &v), 0);
    assert_true(v == 512ull << 20);
    assert_int_equal(sil_parse_size("100", &v), 0);
    assert_true(v == 100);
    assert_int_equal(sil_parse_size("1k", &v), 0);
    assert_true(v == 1024);
    assert_int_equal(sil_parse_size("-1", &v), -EINVAL);
    assert_int_equal(sil_parse_size("12X", &v), -EINVAL);
    assert_int_equal(sil_parse_size("99999999999999999999", &v), -ERANGE);
    assert_int_equal(sil_parse_size("99999999999T", &v), -ERANGE);
    assert_int_equal(sil_parse_log_level("debug"), SIL_LOG_DEBUG);
    assert_int_equal(sil_parse_log_level("warning"), SIL_LOG_WARNING);
    assert_int_equal(sil_parse_log_level("loud"), -EINVAL);
}

static void test_file(void **state)
{
    const char *p = write_file("a.conf", "# comment\n"
                                         "model = /models/m.gguf\n"
                                         "  threads=6   # trailing comment\n"
                                         "socket = \"/tmp/x.sock\"\n"
                                         "vram_budget = 7G\n"
                                         "kv_type = q8_0\n"
                                         "kv_budget = 512M\n"
                                         "allow_users = 0, 1234\n"
                                         "allow_groups = 0\n"
                                         "session_memory = 256M\n"
                                         "session_checkpoints = 9\n"
                                         "prefill_budget = 16\n"
                                         "host_prefill_chunk = 2048\n"
                                         "prefill_stretch = 0\n"
                                         "priority_aging = 5\n"
                                         "prefix_cache = off\n"
                                         "prefix_checkpoint_blocks = 8\n"
                                         "prefix_checkpoint_memory = 64M\n"
                                         "prefix_cache_memory = 2G\n"
                                         "log_level = debug\n"
                                         "\n");
    struct sil_config c;
    struct sil_error err = { 0 };
    sil_config_defaults(&c);
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_string_equal(c.model, "/models/m.gguf");
    assert_int_equal(c.threads, 6);
    assert_string_equal(c.socket, "/tmp/x.sock");
    assert_true(c.vram_budget == 7ull << 30);
    assert_string_equal(c.kv_type, "q8_0");
    assert_true(c.kv_budget == 512ull << 20);
    assert_int_equal(c.n_allow_uids, 2);
    assert_int_equal(c.allow_uids[1], 1234);
    assert_int_equal(c.n_allow_gids, 1);
    assert_true(c.session_memory == 256ull << 20);
    assert_int_equal(c.session_checkpoints, 9);
    assert_int_equal(c.prefill_budget, 16);
    assert_int_equal(c.host_prefill_chunk, 2048);
    assert_true(c.prefill_stretch == 0);
    assert_int_equal(c.priority_aging, 5);
    assert_false(c.prefix_cache);
    assert_int_equal(c.prefix_checkpoint_blocks, 8);
    assert_true(c.prefix_checkpoint_memory == 64ull << 20);
    assert_true(c.prefix_cache_memory == 2ull << 30);
    assert_int_equal(c.log_level, SIL_LOG_DEBUG);
    assert_string_equal(c.config_path, p);
}

static void test_file_errors(void **state)
{
    struct sil_config c;
    struct sil_error err = { 0 };
    sil_config_defaults(&c);
    const char *p = write_file("b.conf", "threads = 2\nbogus_key = 1\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "b.conf:2: bogus_key: unknown key"));

    p = write_file("c.conf", "threads = many\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "c.conf:1: threads"));

    p = write_file("d.conf", "backend = tpu\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "backend"));

    p = write_file("d2.conf", "kv_type = q4_K\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "kv_type: expected f32, f16, q8_0 or q4_0"));

    p = write_file("e.conf", "just words\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "e.conf:1"));

    p = write_file("f.conf", "allow_users = no-such-user-here\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "no such user"));

    p = write_file("g.conf", "max_message = 10\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);

    sil_config_defaults(&c);
    assert_true(c.prefix_cache);
    p = write_file("h2.conf", "prefix_cache = maybe\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "prefix_cache: expected on or off"));
    p = write_file("h3.conf", "prefix_cache = Yes\nprefix_checkpoint_blocks = 0\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
    assert_true(c.prefix_cache);
    assert_non_null(strstr(err.msg, "prefix_checkpoint_blocks"));

    p = write_file("h.conf", "session_checkpoints = 257\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "session_checkpoints"));

    /* The scheduler's keys: aging of 0 s would make every wait infinitely urgent. */
    static const char *const bad_sched[] = {
        "priority_aging = 0\n",   "prefill_stretch = 101\n", "prefill_budget = 0\n",
        "prefill_stretch = -1\n", "prefill_stretch = 0.5\n", "prefill_stretch = 2.5.1\n",
        "prefill_stretch = nan\n", "prefill_stretch = 1e1\n", "prefill_stretch = .\n",
        "prefill_stretch = 0x2\n", "host_prefill_chunk = 0\n", "host_prefill_chunk = 65537\n",
    };
    for (size_t i = 0; i < sizeof bad_sched / sizeof *bad_sched; i++) {
        p = write_file("s.conf", bad_sched[i]);
        assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
        char key[32];
        snprintf(key, sizeof key, "%.*s", (int)strcspn(bad_sched[i], " "), bad_sched[i]);
        assert_non_null(strstr(err.msg, key));
    }

    /* the stretch is a decimal number: 2.5 x a step that only generates */
    p = write_file("s.conf", "prefill_stretch = 2.5\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_true(c.prefill_stretch == 2.5);

    char missing[128];
    snprintf(missing, sizeof missing, "%s/none.conf", dir);
    assert_int_equal(sil_config_load_file(&c, missing, &err), -ENOENT);
    assert_non_null(strstr(err.msg, "none.conf"));
}

static void test_flags_override_file(void **state)
{
    const char *p = write_file("h.conf", "model = /from/file.gguf\nthreads = 3\nmax_running = 4\n");
    char path[128];
    snprintf(path, sizeof path, "%s", p);
    char *argv[] = { "siliceod", "--config", path, "--threads", "9", "-s", "/tmp/s.sock",
                     "--log-level", "warning", "--foreground", NULL };
    struct sil_config c;
    struct sil_cli cli;
    struct sil_error err = { 0 };
    assert_int_equal(sil_config_from_args(&c, &cli, 10, argv, &err), 0);
    assert_int_equal(cli.action, SIL_CLI_RUN);
    assert_string_equal(c.model, "/from/file.gguf");
    assert_int_equal(c.threads, 9);
    assert_int_equal(c.max_running, 4);
    assert_string_equal(c.socket, "/tmp/s.sock");
    assert_int_equal(c.log_level, SIL_LOG_WARNING);
    assert_true(c.foreground);

    /* The same again (SIGHUP re-parses argv). */
    assert_int_equal(sil_config_from_args(&c, &cli, 10, argv, &err), 0);
    assert_int_equal(c.threads, 9);

    char *bad[] = { "siliceod", "--config", path, "--threads", "x", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 5, bad, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "threads"));

    char *unknown[] = { "siliceod", "--frobnicate", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 2, unknown, &err), -EINVAL);

    char *inspect[] = { "siliceod", "--inspect", "/x.gguf", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 3, inspect, &err), 0);
    assert_int_equal(cli.action, SIL_CLI_INSPECT);
    assert_string_equal(cli.inspect_path, "/x.gguf");

    const char *q = write_file("i.conf", "threads = 1\n");
    snprintf(path, sizeof path, "%s", q);
    char *nomodel[] = { "siliceod", "--config", path, NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 3, nomodel, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "no model"));
    char *diag[] = { "siliceod", "--config", path, "--no-model", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 4, diag, &err), 0);
    assert_true(c.no_model);
}

/* Speculative decoding: spec, draft_model and spec_tree from the file and the flags, each value
 * checked; spec = draft without a draft model is an error, spec = mtp needs none; none of them
 * changes live. */
static void test_spec_keys(void **state)
{
    struct sil_config c;
    struct sil_cli cli;
    struct sil_error err = { 0 };
    sil_config_defaults(&c);
    assert_int_equal(c.spec, SIL_SPEC_OFF);
    assert_int_equal(c.spec_depth, 4);
    assert_int_equal(c.spec_width, 1);
    const char *p = write_file("spec.conf", "model = /m.gguf\nspec = draft\ndraft_model = /d.gguf\n"
                                            "spec_tree = 2x8\n");
    char path[128];
    snprintf(path, sizeof path, "%s", p);
    char *argv[] = { "siliceod", "--config", path, NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 3, argv, &err), 0);
    assert_int_equal(c.spec, SIL_SPEC_DRAFT);
    assert_string_equal(c.draft_model, "/d.gguf");
    assert_int_equal(c.spec_depth, 8);
    assert_int_equal(c.spec_width, 2);
    char *flags[] = { "siliceod", "--config", path, "--spec-tree", "1x2", "--draft-model", "/e.gguf",
                      "--spec", "off", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 9, flags, &err), 0);
    assert_int_equal(c.spec, SIL_SPEC_OFF);
    assert_string_equal(c.draft_model, "/e.gguf");
    assert_int_equal(c.spec_depth, 2);
    assert_int_equal(c.spec_width, 1);
    const char *mq = write_file("mtp.conf", "model = /m.gguf\nspec = mtp\n");
    char mpath[128];
    snprintf(mpath, sizeof mpath, "%s", mq);
    char *mtp[] = { "siliceod", "--config", mpath, NULL };
    sil_config_defaults(&c);
    assert_int_equal(sil_config_from_args(&c, &cli, 3, mtp, &err), 0);
    assert_int_equal(c.spec, SIL_SPEC_MTP);
    char *mtpflag[] = { "siliceod", "--config", path, "--spec", "mtp", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 5, mtpflag, &err), 0);
    assert_int_equal(c.spec, SIL_SPEC_MTP);

    static const char *const bad[][2] = {
        { "spec", "MTP" },       { "spec", "on" },        { "spec", "" },
        { "spec_tree", "8x8" },  { "spec_tree", "1x0" },  { "spec_tree", "1x65" },
        { "spec_tree", "0x4" },  { "spec_tree", "64x1" }, { "spec_tree", "99999999999x1" },
        { "spec_tree", "1x" },   { "spec_tree", "x4" },   { "spec_tree", "1x4x" },
        { "spec_tree", "-1x4" }, { "spec_tree", "1x-4" }, { "spec_tree", "1x99999999999999999999" },
        { "spec_tree", "4" },    { "spec_tree", "1x4 4" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[256];
        snprintf(text, sizeof text, "model = /m.gguf\n%s = %s\n", bad[i][0], bad[i][1]);
        const char *q = write_file("bad.conf", text);
        assert_int_equal(sil_config_load_file(&c, q, &err), -EINVAL);
        assert_non_null(strstr(err.msg, bad[i][0]));
    }
    int32_t wd = 0, d = 0;
    char why[128];
    assert_int_equal(sil_parse_spec_tree("1x64", &wd, &d, why, sizeof why), 0);
    assert_int_equal(wd, 1);
    assert_int_equal(d, 64);
    assert_int_equal(sil_parse_spec_tree("2x3", &wd, &d, why, sizeof why), 0);
    assert_int_equal(wd, 2);
    assert_int_equal(d, 3);
    assert_int_equal(sil_parse_spec_tree("63x1", &wd, &d, why, sizeof why), 0);
    assert_int_equal(wd, 63);
    assert_int_equal(sil_parse_spec_tree("9x7", &wd, &d, why, sizeof why), 0);
    assert_int_equal(sil_parse_spec_tree("8x8", &wd, &d, why, sizeof why), -EINVAL);
    assert_non_null(strstr(why, "more than 64 rows"));
    assert_int_equal(wd, 9);
    assert_int_equal(d, 7);

    const char *q = write_file("nodraft.conf", "model = /m.gguf\nspec = draft\n");
    snprintf(path, sizeof path, "%s", q);
    char *nodraft[] = { "siliceod", "--config", path, NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 3, nodraft, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "draft model"));

    struct sil_config a, b;
    sil_config_defaults(&a);
    sil_config_defaults(&b);
    b.spec = SIL_SPEC_DRAFT;
    strcpy(b.draft_model, "/d.gguf");
    b.spec_depth = 6;
    b.spec_width = 2;
    char changed[256];
    sil_config_apply_live(&a, &b, changed, sizeof changed);
    assert_string_equal(changed, "spec, draft_model, spec_tree");
    assert_int_equal(a.spec, SIL_SPEC_OFF);
}

static void test_live_reload(void **state)
{
    struct sil_config a, b;
    sil_config_defaults(&a);
    sil_config_defaults(&b);
    strcpy(a.model, "/m1");
    strcpy(b.model, "/m2");
    b.threads = 7;
    b.log_level = SIL_LOG_DEBUG;
    b.max_clients = 3;
    b.n_allow_uids = 1;
    b.allow_uids[0] = 42;
    char changed[256];
    sil_config_apply_live(&a, &b, changed, sizeof changed);
    assert_string_equal(changed, "model, threads");
    assert_string_equal(a.model, "/m1");
    assert_int_equal(a.threads, 0);
    assert_int_equal(a.log_level, SIL_LOG_DEBUG);
    assert_int_equal(a.max_clients, 3);
    assert_int_equal(a.n_allow_uids, 1);
    assert_int_equal(a.allow_uids[0], 42);
    sil_config_apply_live(&a, &a, changed, sizeof changed);
    assert_string_equal(changed, "");
}

/* The warm-restart and simulated-cache keys, and where the state directory is by default. */
static void test_state_keys(void **state)
{
    struct sil_config c;
    struct sil_error err = { 0 };
    sil_config_defaults(&c);
    assert_true(c.heat_map && c.heat_save_interval == 300 && c.ecache_slots == 0);
    assert_string_equal(c.ecache_policy, "");
    const char *p = write_file("s.conf", "state_dir = /srv/sil\nheat_map = no\n"
                                         "heat_save_interval = 0\necache_slots = 2560\n"
                                         "ecache_policy = lru\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_string_equal(c.state_dir, "/srv/sil");
    assert_false(c.heat_map);
    assert_int_equal(c.heat_save_interval, 0);
    assert_int_equal(c.ecache_slots, 2560);
    assert_string_equal(c.ecache_policy, "lru");
    const char *bad[] = { "heat_map = maybe\n", "ecache_policy = fifo\n", "ecache_slots = -1\n",
                          "heat_save_interval = -5\n" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sil_config_defaults(&c);
        p = write_file("bad.conf", bad[i]);
        assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
        assert_non_null(strstr(err.msg, "bad.conf:1:"));
    }
    char d[4096];
    sil_config_defaults(&c);
    setenv("STATE_DIRECTORY", "/var/lib/a:/var/lib/b", 1);
    assert_int_equal(sil_config_state_dir(&c, d, sizeof d), 0);
    assert_string_equal(d, "/var/lib/a"); /* the first of systemd's list */
    strcpy(c.state_dir, "/srv/x");
    assert_int_equal(sil_config_state_dir(&c, d, sizeof d), 0);
    assert_string_equal(d, "/srv/x"); /* the key wins */
    assert_int_equal(sil_config_state_dir(&c, d, 4), -ENAMETOOLONG);
    c.state_dir[0] = 0;
    unsetenv("STATE_DIRECTORY");
    setenv("XDG_STATE_HOME", "/home/u/.st", 1);
    assert_int_equal(sil_config_state_dir(&c, d, sizeof d), 0);
    assert_string_equal(d, geteuid() == 0 ? "/var/lib/siliceo" : "/home/u/.st/siliceo");
    unsetenv("XDG_STATE_HOME");
    /* A flag sets it too, and it needs a restart. */
    struct sil_cli cli;
    char *conf = (char *)write_file("e.conf", "model = /m.gguf\n");
    char *argv[] = { "siliceod", "--config", conf, "--state-dir", "/q", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 5, argv, &err), 0);
    assert_string_equal(c.state_dir, "/q");
    struct sil_config live = c;
    char changed[256];
    live.ecache_slots = 7;
    sil_config_apply_live(&c, &live, changed, sizeof changed);
    assert_string_equal(changed, "ecache_slots");
}

/* host_budget: a size, auto (0) or off; the last setting wins (a flag over the file), and a
 * change waits for a restart. */
/* The CUDA backend's options: defaults equal to the backend's own (all zero), each key's values,
 * bad values refused with the key and what it takes, the flags over the file, and a change on
 * SIGHUP needs a restart. */
static void test_cuda_options(void **state)
{
    struct sil_config c;
    struct sil_error err = { 0 };
    sil_config_defaults(&c);
    const struct sil_cuda_options zero = { 0 };
    assert_false(c.cuda.no_graphs || c.cuda.zero_copy || c.cuda.cpu_off);
    assert_int_equal(c.cuda.pin, SIL_CUDA_PIN_AUTO);
    assert_true(c.cuda.cpu_share == 0);
    assert_memory_equal(&c.cuda, &zero, sizeof zero);
    const char *p = write_file("cu.conf", "cuda_graphs = off\ncuda_zero_copy = on\n"
                                          "cuda_pin = off\ncuda_cpu_share = 0.4\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_true(c.cuda.no_graphs && c.cuda.zero_copy && !c.cuda.cpu_off);
    assert_int_equal(c.cuda.pin, SIL_CUDA_PIN_OFF);
    assert_true(c.cuda.cpu_share == 0.4);
    p = write_file("cu.conf", "cuda_graphs = yes\ncuda_zero_copy = false\ncuda_pin = on\n"
                              "cuda_cpu_share = off\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_false(c.cuda.no_graphs || c.cuda.zero_copy);
    assert_int_equal(c.cuda.pin, SIL_CUDA_PIN_ON);
    assert_true(c.cuda.cpu_off && c.cuda.cpu_share == 0);
    p = write_file("cu.conf", "cuda_pin = auto\ncuda_cpu_share = auto\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_int_equal(c.cuda.pin, SIL_CUDA_PIN_AUTO);
    assert_true(!c.cuda.cpu_off && c.cuda.cpu_share == 0);
    p = write_file("cu.conf", "cuda_cpu_share = 0\n"); /* 0 is off */
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_true(c.cuda.cpu_off);
    p = write_file("cu.conf", "cuda_cpu_share = 1\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_true(!c.cuda.cpu_off && c.cuda.cpu_share == 1);

    static const struct {
        const char *line, *msg;
    } bad[] = {
        { "cuda_graphs = maybe\n", "cu.conf:1: cuda_graphs: expected on or off" },
        { "cuda_graphs =\n", "cu.conf:1: cuda_graphs: expected on or off" },
        { "cuda_zero_copy = 2\n", "cu.conf:1: cuda_zero_copy: expected on or off" },
        { "cuda_pin = sometimes\n", "cu.conf:1: cuda_pin: expected auto, on or off" },
        { "cuda_cpu_share = 1.5\n", "cu.conf:1: cuda_cpu_share: expected auto, off or a number" },
        { "cuda_cpu_share = -0.1\n", "cu.conf:1: cuda_cpu_share: expected auto, off or a number" },
        { "cuda_cpu_share = 0.5x\n", "cu.conf:1: cuda_cpu_share: expected auto, off or a number" },
        { "cuda_cpu_share = 1e-1\n", "cu.conf:1: cuda_cpu_share: expected auto, off or a number" },
        { "cuda_cpu_share = .\n", "cu.conf:1: cuda_cpu_share: expected auto, off or a number" },
        { "cuda_slots = 4\n", "cu.conf:1: cuda_slots: unknown key" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sil_config_defaults(&c);
        p = write_file("cu.conf", bad[i].line);
        assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
        if (!strstr(err.msg, bad[i].msg)) fail_msg("'%s': %s", bad[i].line, err.msg);
        assert_memory_equal(&c.cuda, &zero, sizeof zero);
    }

    /* the flags over the file's keys; a bad value names the option */
    struct sil_cli cli;
    char path[128];
    snprintf(path, sizeof path, "%s",
             write_file("cu2.conf", "model = /m.gguf\ncuda_graphs = off\ncuda_pin = off\n"));
    char *flags[] = { "siliceod", "--config", path, "--cuda-graphs", "on", "--cuda-zero-copy=on",
                      "--cuda-pin", "auto", "--cuda-cpu-share", "0.25", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 10, flags, &err), 0);
    assert_false(c.cuda.no_graphs);
    assert_true(c.cuda.zero_copy);
    assert_int_equal(c.cuda.pin, SIL_CUDA_PIN_AUTO);
    assert_true(c.cuda.cpu_share == 0.25 && !c.cuda.cpu_off);
    char *file_only[] = { "siliceod", "--config", path, NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 3, file_only, &err), 0);
    assert_true(c.cuda.no_graphs);
    assert_int_equal(c.cuda.pin, SIL_CUDA_PIN_OFF);
    char *badflag[] = { "siliceod", "--config", path, "--cuda-cpu-share", "most", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 5, badflag, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "option --cuda_cpu_share: expected auto, off or a number"));
    assert_true(cli.usage_error);

    /* SIGHUP: each needs a restart, and the running value stays */
    static const char *const keys[] = { "cuda_graphs", "cuda_zero_copy", "cuda_pin",
                                        "cuda_cpu_share" };
    for (int k = 0; k < 4; k++) {
        struct sil_config run, live;
        sil_config_defaults(&run);
        live = run;
        if (k == 0) live.cuda.no_graphs = true;
        if (k == 1) live.cuda.zero_copy = true;
        if (k == 2) live.cuda.pin = SIL_CUDA_PIN_ON;
        if (k == 3) live.cuda.cpu_share = 0.5;
        char changed[256];
        sil_config_apply_live(&run, &live, changed, sizeof changed);
        assert_string_equal(changed, keys[k]);
        assert_memory_equal(&run.cuda, &zero, sizeof zero);
    }
}

static void test_host_budget(void **state)
{
    struct sil_config c;
    struct sil_error err = { 0 };
    sil_config_defaults(&c);
    assert_true(c.host_budget == 0 && !c.host_budget_off);
    const char *p = write_file("hb.conf", "host_budget = 24G\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_true(c.host_budget == 24ull << 30);
    assert_false(c.host_budget_off);
    p = write_file("hb.conf", "host_budget = off\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_true(c.host_budget_off);
    assert_true(c.host_budget == 0);
    p = write_file("hb.conf", "host_budget = 512MiB\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_false(c.host_budget_off); /* a size after off turns it back on */
    assert_true(c.host_budget == 512ull << 20);
    p = write_file("hb.conf", "host_budget = auto\n");
    assert_int_equal(sil_config_load_file(&c, p, &err), 0);
    assert_true(c.host_budget == 0 && !c.host_budget_off);

    static const char *const bad[] = { "host_budget = lots\n", "host_budget = -1G\n",
                                       "host_budget = OFF\n", "host_budget = 4Q\n",
                                       "host_budget =\n", "host_budget = 99999999999T\n" };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        sil_config_defaults(&c);
        p = write_file("hb.conf", bad[i]);
        assert_int_equal(sil_config_load_file(&c, p, &err), -EINVAL);
        if (!strstr(err.msg, "hb.conf:1: host_budget: expected a size"))
            fail_msg("'%s': %s", bad[i], err.msg);
        assert_true(c.host_budget == 0 && !c.host_budget_off);
    }

    /* --host-budget over the file's key; a bad value names the key. */
    struct sil_cli cli;
    char path[128];
    snprintf(path, sizeof path, "%s", write_file("hb2.conf", "model = /m.gguf\nhost_budget = 8G\n"));
    char *off[] = { "siliceod", "--config", path, "--host-budget", "off", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 5, off, &err), 0);
    assert_true(c.host_budget_off);
    char *size[] = { "siliceod", "--config", path, "--host-budget=3G", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 4, size, &err), 0);
    assert_true(c.host_budget == 3ull << 30 && !c.host_budget_off);

    /* SIGHUP: either half changed needs a restart, and the running value stays. */
    struct sil_config live = c;
    char changed[256];
    live.host_budget = 1ull << 30;
    sil_config_apply_live(&c, &live, changed, sizeof changed);
    assert_string_equal(changed, "host_budget");
    assert_true(c.host_budget == 3ull << 30); /* kept until a restart */
    live = c;
    live.host_budget_off = true;
    sil_config_apply_live(&c, &live, changed, sizeof changed);
    assert_string_equal(changed, "host_budget");
    assert_false(c.host_budget_off);

    char *badflag[] = { "siliceod", "--config", path, "--host-budget", "huge", NULL };
    assert_int_equal(sil_config_from_args(&c, &cli, 5, badflag, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "host_budget: expected a size"));
    assert_true(cli.usage_error);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_file),
        cmocka_unit_test(test_file_errors),
        cmocka_unit_test(test_flags_override_file),
        cmocka_unit_test(test_live_reload),
        cmocka_unit_test(test_spec_keys),
        cmocka_unit_test(test_state_keys),
        cmocka_unit_test(test_host_budget),
        cmocka_unit_test(test_cuda_options),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
