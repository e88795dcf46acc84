/* Warm restart of the expert cache (daemon/heatkeep.c) on the tiny MoE reference model: a
 * missing file is a cold start, a saved map loads and preloads the simulated cache, a corrupt one
 * or one of another shape is ignored (counted, nothing preloaded), a failed save leaves the old
 * file and is counted, and the periodic save runs only when due and when the map changed. */
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

#include "daemon/engine/engine.h"
#include "daemon/engine/expert_heat.h"
#include "daemon/heatkeep.h"
#include "daemon/log.h"
#include "tests/testutil.h"

static char dir[64];
static const char *model = "qwen35moe-tiny-Q4_K_M";

static struct sil_engine *open_moe(int32_t slots)
{
    struct sil_engine_params p;
    sil_engine_params_default(&p);
    p.n_threads = 2;
    p.n_seq_max = 2;
    p.n_ctx = 128;
    p.heat_map = true;
    p.ecache_sim_slots = slots;
    struct sil_error err = {0};
    struct sil_engine *e = NULL;
    if (tu_open_refdata_engine(&e, model, &p, &err) < 0) fail_msg("open %s: %s", model, err.msg);
    return e;
}

/* n tokens of one new sequence, as one prefill. */
static void eval_tokens(struct sil_engine *e, int32_t n, int32_t first)
{
    struct sil_error err = {0};
    const int seq = sil_seq_create(e, &err);
    assert_true(seq >= 0);
    int32_t tok[64], pos[64], sq[64];
    assert_true(n <= 64);
    for (int32_t i = 0; i < n; i++) {
        tok[i] = (first + 37 * i) % 500;
        pos[i] = i;
        sq[i] = seq;
    }
    struct sil_batch b = {n, tok, pos, sq, NULL};
    float *logits = malloc(sizeof(float) * (size_t)sil_engine_info(e)->n_vocab);
    if (sil_engine_eval(e, &b, logits, &err) < 0) fail_msg("eval: %s", err.msg);
    free(logits);
    sil_seq_free(e, seq);
}

static void conf(struct sil_config *c, const char *sub, int interval)
{
    sil_config_defaults(c);
    snprintf(c->state_dir, sizeof c->state_dir, "%s/%s", dir, sub);
    c->heat_save_interval = interval;
}

struct progress {
    int64_t done, total, calls;
};

/* Progress only grows, and never past its total. */
static void on_progress(int64_t done, int64_t total, void *user)
{
    struct progress *p = user;
    assert_true(done >= p->done && done <= total);
    p->done = done;
    p->total = total;
    p->calls++;
}

static void test_cold_save_load(void **state)
{
    (void)state;
    struct sil_config c;
    conf(&c, "a/b", 0); /* parents made too */
    struct sil_heatkeep h;
    struct sil_heat_view v;
    struct sil_engine *e = open_moe(32);
    sil_heatkeep_init(&h, &c, true);
    struct stat st;
    assert_int_equal(stat(c.state_dir, &st), 0);
    assert_true(S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0750);
    sil_heatkeep_load(&h, e, NULL, NULL);
    sil_heatkeep_view(&h, &v);
    /* the model's own file, named for it (expert-heat-NAME-ID) */
    char name[128], want[256];
    assert_int_equal(sil_engine_heat_file_name(e, name, sizeof name), 0);
    assert_true(strncmp(name, "expert-heat-", 12) == 0);
    snprintf(want, sizeof want, "%s/a/b/%s", dir, name);
    assert_string_equal(v.path, want);
    assert_string_equal(v.load, "none");
    assert_true(v.hot == 0 && v.preloaded == 0);
    eval_tokens(e, 40, 1);
    assert_int_equal(sil_heatkeep_save(&h, e), 0);
    sil_heatkeep_view(&h, &v);
    assert_true(v.saves == 1 && v.save_errors == 0 && v.last_save > 0);
    sil_heatkeep_destroy(&h);
    sil_engine_close(e);

    /* The next start: loaded, and the pools take each layer's hottest up to their size. */
    struct sil_engine *e2 = open_moe(32);
    sil_heatkeep_init(&h, &c, true);
    struct progress pr = {-1, -1, 0};
    sil_heatkeep_load(&h, e2, on_progress, &pr);
    sil_heatkeep_view(&h, &v);
    assert_string_equal(v.load, "loaded");
    assert_true(v.tokens_loaded == 40 && v.hot > 0);
    assert_true(v.preloaded > 0 && v.preloaded <= 32 && v.preloaded <= v.hot);
    assert_true(pr.calls > 0 && pr.done == v.preloaded && pr.total == v.preloaded);
    struct sil_heat_map m;
    struct sil_error err = {0};
    assert_int_equal(sil_engine_heat_export(e2, &m, &err), 0);
    assert_true(m.tokens == 40);
    sil_heat_map_free(&m);
    sil_heatkeep_destroy(&h);
    sil_engine_close(e2);
}

static void test_bad_files(void **state)
{
    (void)state;
    struct sil_config c;
    conf(&c, "bad", 0);
    struct sil_heatkeep h;
    struct sil_heat_view v;
    struct sil_engine *e = open_moe(32);
    sil_heatkeep_init(&h, &c, true);
    sil_heatkeep_load(&h, e, NULL, NULL); /* names the model's file */
    eval_tokens(e, 20, 3);
    assert_int_equal(sil_heatkeep_save(&h, e), 0);
    sil_heatkeep_view(&h, &v);
    char path[PATH_MAX];
    memcpy(path, v.path, sizeof path);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, 60, SEEK_SET);
    fputc(0x7f, f); /* a heat value: the checksum no longer matches */
    fclose(f);
    sil_heatkeep_load(&h, e, NULL, NULL);
    sil_heatkeep_view(&h, &v);
    assert_string_equal(v.load, "ignored");
    assert_non_null(strstr(v.load_msg, "checksum"));
    assert_true(v.preloaded == 0 && v.hot == 0);
    assert_int_equal(truncate(path, 10), 0);
    sil_heatkeep_load(&h, e, NULL, NULL);
    sil_heatkeep_view(&h, &v);
    assert_string_equal(v.load, "ignored");
    assert_non_null(strstr(v.load_msg, "shorter"));

    /* A save that cannot be written leaves the old file and is counted. */
    assert_int_equal(sil_heatkeep_save(&h, e), 0);
    struct stat before, after;
    assert_int_equal(stat(path, &before), 0);
    char sub[128];
    snprintf(sub, sizeof sub, "%s/bad", dir);
    char moved[160];
    snprintf(moved, sizeof moved, "%s.d", sub);
    assert_int_equal(rename(sub, moved), 0);
    assert_int_equal(sil_heatkeep_save(&h, e), -ENOENT); /* its directory is gone */
    sil_heatkeep_view(&h, &v);
    assert_true(v.save_errors == 1 && v.save_error[0]);
    assert_int_equal(rename(moved, sub), 0);
    assert_int_equal(stat(path, &after), 0);
    assert_true(after.st_ino == before.st_ino && after.st_size == before.st_size);
    sil_heatkeep_destroy(&h);
    sil_engine_close(e);
}

static void test_periodic(void **state)
{
    (void)state;
    struct sil_config c;
    conf(&c, "tick", 60);
    struct sil_heatkeep h;
    struct sil_heat_view v;
    struct sil_engine *e = open_moe(0); /* the heat map alone, no simulated cache */
    sil_heatkeep_init(&h, &c, true);
    sil_heatkeep_load(&h, e, NULL, NULL);
    assert_true(sil_heatkeep_due(&h, e) == 0); /* nothing seen: nothing to save */
    const double t0 = h.next_save - 60;
    sil_heatkeep_tick(&h, e, t0 + 61);
    sil_heatkeep_view(&h, &v);
    assert_true(v.saves == 0);
    eval_tokens(e, 8, 5);
    assert_true(sil_heatkeep_due(&h, e) == h.next_save);
    sil_heatkeep_tick(&h, e, t0 + 30); /* not yet due */
    sil_heatkeep_view(&h, &v);
    assert_true(v.saves == 0);
    sil_heatkeep_tick(&h, e, t0 + 61);
    sil_heatkeep_view(&h, &v);
    assert_true(v.saves == 1);
    assert_true(sil_heatkeep_due(&h, e) == 0); /* saved: clean again */
    sil_heatkeep_tick(&h, e, t0 + 200);
    sil_heatkeep_view(&h, &v);
    assert_true(v.saves == 1);
    eval_tokens(e, 8, 9);
    sil_heatkeep_tick(&h, e, t0 + 200);
    sil_heatkeep_view(&h, &v);
    assert_true(v.saves == 2);
    sil_heatkeep_destroy(&h);
    sil_engine_close(e);

    /* Off: nothing loaded, nothing saved. */
    sil_heatkeep_init(&h, &c, false);
    sil_heatkeep_view(&h, &v);
    assert_string_equal(v.load, "off");
    assert_string_equal(v.path, "");
    sil_heatkeep_destroy(&h);
}

static int setup(void **state)
{
    (void)state;
    sil_log_init(SIL_LOG_ERR); /* the warnings are expected */
    strcpy(dir, "/tmp/sil-test-heatkeep-XXXXXX");
    return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
    char rel[256];
    snprintf(rel, sizeof(rel), "models/%s.gguf", model);
    if (!tu_refdata_exists(rel)) {
        fprintf(stderr, "test_heatkeep: no reference data under %s\n", tu_shared_dir());
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cold_save_load),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_periodic),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
