/* The routed experts' host tiers (expert_store.h) on a file laid out by the test, and the engine
 * with a host budget too small for its experts against the same engine reading the mapping:
 * every refdata MoE model, normal and exact, logits bit for bit. */
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
#include "daemon/engine/expert_store.h"
#include "tests/testutil.h"

#define NL 3
#define NX 5

/* The byte at file offset o: never the same for two neighbouring offsets' pages. */
static uint8_t byte_at(uint64_t o)
{
    return (uint8_t)((o * 2654435761u) >> 13 ^ o);
}

/* A file of `bytes` pattern bytes and the layers' expert matrices at odd offsets (so every read
 * window starts and ends off the alignment), layer 1 without experts. */
struct fixture {
    char *dir, *path;
    uint64_t bytes;
    struct sil_xstore_mat mat[NL * 3];
    struct sil_xstore_config c;
    struct stat st;
};

static void write_pattern(const char *path, uint64_t bytes)
{
    uint8_t *buf = malloc(bytes);
    assert_non_null(buf);
    for (uint64_t o = 0; o < bytes; o++)
        buf[o] = byte_at(o);
    assert_int_equal(tu_write_file(path, buf, bytes), 0);
    free(buf);
}

static void fixture_init(struct fixture *f)
{
    memset(f, 0, sizeof(*f));
    f->dir = tu_tmpdir_create();
    assert_non_null(f->dir);
    f->path = tu_path_join(f->dir, "model.bin");
    const uint64_t sizes[3] = {3001, 777, 5003};
    uint64_t at = 1237;
    for (int l = 0; l < NL; l++) {
        for (int i = 0; i < 3; i++) {
            if (l == 1) continue;
            f->mat[l * 3 + i] = (struct sil_xstore_mat){at, sizes[i] + (uint64_t)l};
            at += (sizes[i] + (uint64_t)l) * NX + 33;
        }
    }
    f->bytes = at - 33 + 5; /* the last matrix ends 5 bytes before the end of the file */
    write_pattern(f->path, f->bytes);
    assert_int_equal(stat(f->path, &f->st), 0);
    f->c = (struct sil_xstore_config){
        .path = f->path,
        .dev = (uint64_t)f->st.st_dev,
        .ino = (uint64_t)f->st.st_ino,
        .file_bytes = f->bytes,
        .n_layer = NL,
        .n_expert = NX,
        .mat = f->mat,
        .n_slot = NX,
        .n_readers = 3,
    };
}

static void fixture_done(struct fixture *f)
{
    unlink(f->path);
    tu_tmpdir_remove(f->dir);
    free(f->path);
    free(f->dir);
}

/* Every byte of (layer, expert)'s three matrices where the acquire put them. */
static void assert_expert(const struct fixture *f, int l, int x, const void *const *ptr)
{
    for (int i = 0; i < 3; i++) {
        const struct sil_xstore_mat *m = &f->mat[l * 3 + i];
        const uint8_t *p = ptr[i];
        const uint64_t lo = m->off + (uint64_t)x * m->bytes;
        for (uint64_t k = 0; k < m->bytes; k++)
            if (p[k] != byte_at(lo + k))
                fail_msg("layer %d expert %d matrix %d byte %llu: %u, the file has %u", l, x, i,
                         (unsigned long long)k, p[k], byte_at(lo + k));
    }
}

static void reads_and_policy(bool buffered)
{
    struct fixture f;
    fixture_init(&f);
    f.c.buffered = buffered;
    struct sil_xstore *s = NULL;
    struct sil_error err = {0};
    assert_int_equal(sil_xstore_create(&s, &f.c, &err), 0);
    struct sil_xstore_stats st;
    sil_xstore_stats(s, &st);
    if (buffered) assert_string_equal(st.io, "buffered");
    assert_int_equal(st.n_slot, NX);
    assert_int_equal(st.slot_bytes % 4096, 0);

    const void *ptr[3 * NX];
    const int32_t all[NX] = {4, 0, 3, 1, 2};
    /* layer 0: all five read, then all five found */
    assert_int_equal(sil_xstore_acquire(s, 0, all, NULL, NX, ptr, &err), 0);
    for (int i = 0; i < NX; i++)
        assert_expert(&f, 0, all[i], &ptr[3 * i]);
    sil_xstore_stats(s, &st);
    assert_int_equal(st.misses, NX);
    assert_int_equal(st.hits, 0);
    assert_true(st.bytes_read >= 5 * (3001 + 777 + 5003));
    assert_int_equal(sil_xstore_acquire(s, 0, all, NULL, NX, ptr, &err), 0);
    for (int i = 0; i < NX; i++)
        assert_expert(&f, 0, all[i], &ptr[3 * i]);
    sil_xstore_stats(s, &st);
    assert_int_equal(st.misses, NX);
    assert_int_equal(st.hits, NX);

    /* layer 2 (the file's last bytes): two misses evict the coldest two of layer 0; expert 4 of
     * layer 0 is used most and stays */
    const int32_t hot[1] = {4}, uses[1] = {9};
    assert_int_equal(sil_xstore_acquire(s, 0, hot, uses, 1, ptr, &err), 0);
    const int32_t two[2] = {4, 1};
    assert_int_equal(sil_xstore_acquire(s, 2, two, NULL, 2, ptr, &err), 0);
    assert_expert(&f, 2, 4, &ptr[0]);
    assert_expert(&f, 2, 1, &ptr[3]);
    sil_xstore_stats(s, &st);
    const uint64_t misses = st.misses;
    assert_int_equal(misses, NX + 2);
    assert_int_equal(sil_xstore_acquire(s, 0, hot, NULL, 1, ptr, &err), 0);
    assert_expert(&f, 0, 4, &ptr[0]);
    sil_xstore_stats(s, &st);
    assert_int_equal(st.misses, misses); /* still there */

    /* a layer without experts, an id out of range, more experts than slots */
    const int32_t bad[1] = {NX};
    assert_int_equal(sil_xstore_acquire(s, 1, hot, NULL, 1, ptr, &err), -EINVAL);
    assert_int_equal(sil_xstore_acquire(s, 0, bad, NULL, 1, ptr, &err), -EINVAL);
    assert_int_equal(sil_xstore_acquire(s, NL, hot, NULL, 1, ptr, &err), -EINVAL);

    /* a warm start: the keys of layer 2 (hottest first) into free slots only */
    sil_xstore_free(s);
    assert_int_equal(sil_xstore_create(&s, &f.c, &err), 0);
    const int32_t keys[7] = {2 * NX + 3, 2 * NX + 0, 1 * NX + 2, 99, 0 * NX + 1, 2 * NX + 4,
                             2 * NX + 2};
    assert_int_equal(sil_xstore_preload(s, keys, 7, &err), 5); /* layer 1 and 99 skipped */
    assert_int_equal(sil_xstore_preload(s, keys, 7, &err), 0); /* resident or full */
    const int32_t got[2] = {3, 0};
    assert_int_equal(sil_xstore_acquire(s, 2, got, NULL, 2, ptr, &err), 0);
    assert_expert(&f, 2, 3, &ptr[0]);
    assert_expert(&f, 2, 0, &ptr[3]);
    sil_xstore_stats(s, &st);
    assert_int_equal(st.hits, 2);
    assert_int_equal(st.misses, 5);
    sil_xstore_free(s);
    fixture_done(&f);
}

static void test_reads_direct(void **state)
{
    (void)state;
    reads_and_policy(false);
}

static void test_reads_buffered(void **state)
{
    (void)state;
    reads_and_policy(true);
}

/* A demoted expert (copied to a higher level) is the next to go, whatever its use. */
static void test_demote(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f);
    struct sil_xstore *s = NULL;
    struct sil_error err = {0};
    assert_int_equal(sil_xstore_create(&s, &f.c, &err), 0);
    const void *ptr[3 * NX];
    const int32_t all[NX] = {0, 1, 2, 3, 4}, uses[NX] = {50, 1, 1, 1, 1};
    assert_int_equal(sil_xstore_acquire(s, 0, all, uses, NX, ptr, &err), 0);
    sil_xstore_demote(s, 0, 0); /* the most used one */
    const int32_t one[1] = {3};
    assert_int_equal(sil_xstore_acquire(s, 2, one, NULL, 1, ptr, &err), 0);
    struct sil_xstore_stats st;
    sil_xstore_stats(s, &st);
    const uint64_t misses = st.misses;
    /* layer 0's 1..4 are all still there, 0 was evicted */
    assert_int_equal(sil_xstore_acquire(s, 0, all + 1, NULL, NX - 1, ptr, &err), 0);
    sil_xstore_stats(s, &st);
    assert_int_equal(st.misses, misses);
    assert_int_equal(sil_xstore_acquire(s, 0, all, NULL, 1, ptr, &err), 0);
    assert_expert(&f, 0, 0, ptr);
    sil_xstore_stats(s, &st);
    assert_int_equal(st.misses, misses + 1);
    sil_xstore_free(s);
    fixture_done(&f);
}

/* Fewer slots than one layer's experts: refused, the message gives the minimum. A config whose
 * experts reach past the end of the file, another file at the path: refused. */
static void test_config_errors(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f);
    struct sil_xstore *s = NULL;
    struct sil_error err = {0};
    f.c.n_slot = NX - 1;
    assert_int_equal(sil_xstore_create(&s, &f.c, &err), -EINVAL);
    assert_null(s);
    assert_non_null(strstr(err.msg, "at least 5 slots"));
    f.c.n_slot = NX;
    f.c.file_bytes = f.bytes - 6;
    assert_int_equal(sil_xstore_create(&s, &f.c, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "outside the file"));
    f.c.file_bytes = f.bytes;
    f.c.ino++;
    assert_int_equal(sil_xstore_create(&s, &f.c, &err), -ESTALE);
    assert_non_null(strstr(err.msg, f.path));
    f.c.ino--;
    assert_int_equal(sil_xstore_create(&s, &f.c, &err), 0);
    sil_xstore_free(s);
    fixture_done(&f);
}

/* The file truncated while in use: the next read fails with -EIO naming the file, and every
 * later acquire too, resident experts included. A file renamed over the path is not seen: the
 * store reads the inode it opened. */
static void test_file_changes(void **state)
{
    (void)state;
    struct fixture f;
    fixture_init(&f);
    struct sil_xstore *s = NULL;
    struct sil_error err = {0};
    assert_int_equal(sil_xstore_create(&s, &f.c, &err), 0);
    const void *ptr[3 * NX];
    const int32_t one[1] = {2}, other[1] = {3};

    char *repl = tu_path_join(f.dir, "other.bin");
    uint8_t *zero = calloc(1, f.bytes);
    assert_int_equal(tu_write_file(repl, zero, f.bytes), 0);
    free(zero);
    assert_int_equal(rename(repl, f.path), 0);
    assert_int_equal(sil_xstore_acquire(s, 0, one, NULL, 1, ptr, &err), 0);
    assert_expert(&f, 0, 2, ptr); /* the old inode's bytes */
    sil_xstore_free(s);
    free(repl);

    /* a fresh store on the (now zero) file, then truncated under it */
    assert_int_equal(stat(f.path, &f.st), 0);
    f.c.dev = (uint64_t)f.st.st_dev;
    f.c.ino = (uint64_t)f.st.st_ino;
    assert_int_equal(sil_xstore_create(&s, &f.c, &err), 0);
    assert_int_equal(sil_xstore_acquire(s, 0, one, NULL, 1, ptr, &err), 0);
    assert_int_equal(truncate(f.path, (off_t)f.mat[2].off), 0);
    assert_int_equal(sil_xstore_acquire(s, 2, other, NULL, 1, ptr, &err), -EIO);
    assert_non_null(strstr(err.msg, f.path));
    assert_non_null(strstr(err.msg, "truncated"));
    memset(&err, 0, sizeof err);
    assert_int_equal(sil_xstore_acquire(s, 0, one, NULL, 1, ptr, &err), -EIO);
    assert_non_null(strstr(err.msg, "truncated"));
    sil_xstore_free(s);
    fixture_done(&f);
}

/* ---- the engine --------------------------------------------------------------------------- */

static const char *const moe_models[] = {
    "qwen35moe-tiny-F16",  "qwen35moe-tiny-Q4_K_M", "qwen35moe-tiny-Q5_K_M",
    "qwen35moe-tiny-Q6_K", "qwen35moe-tiny-Q8_0",   "qwen3moe-tiny-Q4_K_M",
};

/* A 40-token prompt, then 12 greedy steps, every row's logits kept: [52][n_vocab]. */
static float *run(struct sil_engine *e, int32_t *n_rows)
{
    const int32_t V = sil_engine_info(e)->n_vocab, P = 40, G = 12;
    float *all = malloc(sizeof(float) * (size_t)V * (size_t)(P + G));
    assert_non_null(all);
    struct sil_error err = {0};
    const int s = sil_seq_create(e, &err);
    assert_true(s >= 0);
    int32_t tok[40], pos[40], sq[40];
    bool want[40];
    for (int i = 0; i < P; i++) {
        tok[i] = (i * 131 + 7) % (V < 1000 ? V : 1000);
        pos[i] = i;
        sq[i] = s;
        want[i] = true;
    }
    struct sil_batch b = {P, tok, pos, sq, want};
    if (sil_engine_eval(e, &b, all, &err) < 0) fail_msg("prompt: %s", err.msg);
    for (int g = 0; g < G; g++) {
        const float *last = all + (size_t)(P + g - 1) * (size_t)V;
        int32_t t = 0;
        for (int32_t v = 1; v < V; v++)
            if (last[v] > last[t]) t = v;
        const int32_t p1 = P + g;
        struct sil_batch d = {1, &t, &p1, &s, NULL};
        if (sil_engine_eval(e, &d, all + (size_t)(P + g) * (size_t)V, &err) < 0)
            fail_msg("step %d: %s", g, err.msg);
    }
    *n_rows = P + G;
    return all;
}

static void open_with(struct sil_engine **e, const char *model, bool exact, bool off,
                      uint64_t budget)
{
    struct sil_engine_params p;
    sil_engine_params_default(&p);
    p.n_threads = 2;
    p.n_seq_max = 2;
    p.n_ctx = 128;
    p.exact = exact;
    p.host_budget_off = off;
    p.host_budget = budget;
    struct sil_error err = {0};
    if (tu_open_refdata_engine(e, model, &p, &err) < 0)
        fail_msg("open %s (budget %llu): %s", model, (unsigned long long)budget, err.msg);
}

static void test_engine_bit_identical(void **state)
{
    (void)state;
    for (size_t m = 0; m < sizeof(moe_models) / sizeof(moe_models[0]); m++) {
        char rel[128];
        snprintf(rel, sizeof rel, "models/%s.gguf", moe_models[m]);
        if (!tu_refdata_exists(rel)) tu_skip_no_refdata();
        for (int exact = 0; exact < 2; exact++) {
            struct sil_engine *e = NULL;
            open_with(&e, moe_models[m], exact, true, 0);
            struct sil_engine_host_tier t;
            sil_engine_host_tier(e, &t);
            assert_false(t.on);
            const uint64_t min = t.min_bytes;
            assert_true(min > 0);
            int32_t n = 0;
            float *ref = run(e, &n);
            const int32_t V = sil_engine_info(e)->n_vocab;
            const uint64_t routed = sil_engine_info(e)->routed_expert_bytes;
            sil_engine_close(e);
            open_with(&e, moe_models[m], exact, false, min);
            sil_engine_host_tier(e, &t);
            assert_true(t.on);
            assert_string_equal(t.budget_from, "host_budget");
            assert_int_equal(t.budget, min);
            /* the smallest tier: its slots hold less than the experts, the rest is read */
            assert_true((uint64_t)t.n_slot * t.slot_bytes < routed);
            struct sil_engine_host_plan hp;
            sil_engine_host_plan(e, &hp);
            assert_true(hp.tier && hp.budget == min);
            assert_true(hp.fixed + hp.experts + hp.cache[0] + hp.cache[1] + hp.cache[2] <= min);
            assert_true((uint64_t)t.n_slot * t.slot_bytes <= hp.experts);
            float *got = run(e, &n);
            sil_engine_host_tier(e, &t);
            /* all three kinds of lookup happened: reads from the file and host-slot hits */
            assert_true(t.misses > 0);
            assert_true(t.hits > 0);
            /* every read brings at least the expert's own bytes (its windows are wider) */
            const struct sil_model_info *mi = sil_engine_info(e);
            assert_true(t.bytes_read >=
                        t.misses * (routed / ((uint64_t)mi->n_layer * (uint64_t)mi->n_expert)));
            for (int32_t r = 0; r < n; r++)
                if (memcmp(ref + (size_t)r * (size_t)V, got + (size_t)r * (size_t)V,
                           sizeof(float) * (size_t)V) != 0)
                    fail_msg("%s%s: row %d's logits differ with the host tier", moe_models[m],
                             exact ? " (exact)" : "", r);
            sil_engine_close(e);
            free(ref);
            free(got);
        }
    }
}

/* Two sequences' prompts (120 and 80 rows) then 6 decode steps of both, every row's logits,
 * fed in batches of at most `batch` rows: [206 * 2 - 6... rows][n_vocab]. */
static float *run_two(struct sil_engine *e, int32_t batch, int32_t *n_rows)
{
    const int32_t V = sil_engine_info(e)->n_vocab, PA = 120, PB = 80, G = 6;
    const int32_t total = PA + PB + 2 * G;
    float *all = malloc(sizeof(float) * (size_t)V * (size_t)total);
    int32_t tok[200], pos[200], sq[200];
    bool want[200];
    assert_non_null(all);
    struct sil_error err = {0};
    const int a = sil_seq_create(e, &err), b = sil_seq_create(e, &err);
    assert_true(a >= 0 && b >= 0);
    for (int i = 0; i < PA + PB; i++) {
        const bool in_a = i < PA;
        tok[i] = (i * 97 + 13) % (V < 1000 ? V : 1000);
        pos[i] = in_a ? i : i - PA;
        sq[i] = in_a ? a : b;
        want[i] = true;
    }
    int32_t row = 0;
    for (int32_t r0 = 0; r0 < PA + PB; r0 += batch) {
        const int32_t n = PA + PB - r0 < batch ? PA + PB - r0 : batch;
        struct sil_batch bt = {n, tok + r0, pos + r0, sq + r0, want + r0};
        if (sil_engine_eval(e, &bt, all + (size_t)row * (size_t)V, &err) < 0)
            fail_msg("prompts: %s", err.msg);
        row += n;
    }
    for (int g = 0; g < G; g++) {
        int32_t t[2] = {(g * 31 + 5) % 500, (g * 17 + 3) % 500}, p2[2] = {PA + g, PB + g},
                s2[2] = {a, b};
        struct sil_batch d = {2, t, p2, s2, NULL};
        bool w2[2] = {true, true};
        d.want_logits = w2;
        if (sil_engine_eval(e, &d, all + (size_t)row * (size_t)V, &err) < 0)
            fail_msg("step %d: %s", g, err.msg);
        row += 2;
    }
    *n_rows = row;
    return all;
}

static void open_batch(struct sil_engine **e, const char *model, bool off, uint64_t budget,
                       int32_t batch, int32_t ubatch)
{
    struct sil_engine_params p;
    sil_engine_params_default(&p);
    p.n_threads = 2;
    p.n_seq_max = 2;
    p.n_ctx = 256;
    p.n_batch_max = batch;
    p.n_ubatch = ubatch;
    p.host_budget_off = off;
    p.host_budget = budget;
    struct sil_error err = {0};
    if (tu_open_refdata_engine(e, model, &p, &err) < 0) fail_msg("open %s: %s", model, err.msg);
}

/* With the host tier, a batch of several micro-batches (two sequences' prompts across them) goes
 * layer by layer: the logits are those of the mapping's engine taking the micro-batches one
 * after another, bit for bit, and each layer's experts are read fewer times than when the same
 * tier takes one micro-batch a call. */
static void test_engine_by_layer(void **state)
{
    (void)state;
    static const char *const models[] = {"qwen35moe-tiny-Q4_K_M", "qwen3moe-tiny-Q4_K_M"};
    for (int m = 0; m < 2; m++) {
        char rel[128];
        snprintf(rel, sizeof rel, "models/%s.gguf", models[m]);
        if (!tu_refdata_exists(rel)) tu_skip_no_refdata();
        struct sil_engine *e = NULL;
        open_batch(&e, models[m], true, 0, 200, 48);
        struct sil_engine_host_tier t;
        sil_engine_host_tier(e, &t);
        const uint64_t min = t.min_bytes;
        const int32_t V = sil_engine_info(e)->n_vocab;
        int32_t n = 0, n2 = 0;
        float *ref = run_two(e, 200, &n);
        sil_engine_close(e);

        open_batch(&e, models[m], false, min, 200, 48); /* 200 rows: 5 micro-batches a pass */
        float *got = run_two(e, 200, &n2);
        struct sil_engine_host_tier by_layer;
        sil_engine_host_tier(e, &by_layer);
        assert_true(by_layer.on);
        sil_engine_close(e);
        assert_int_equal(n, n2);
        for (int32_t r = 0; r < n; r++)
            if (memcmp(ref + (size_t)r * (size_t)V, got + (size_t)r * (size_t)V,
                       sizeof(float) * (size_t)V) != 0)
                fail_msg("%s: row %d's logits differ layer by layer", models[m], r);

        open_batch(&e, models[m], false, min, 48, 48); /* one micro-batch a call */
        float *one = run_two(e, 48, &n2);
        struct sil_engine_host_tier each;
        sil_engine_host_tier(e, &each);
        sil_engine_close(e);
        for (int32_t r = 0; r < n; r++)
            if (memcmp(ref + (size_t)r * (size_t)V, one + (size_t)r * (size_t)V,
                       sizeof(float) * (size_t)V) != 0)
                fail_msg("%s: row %d's logits differ with the tier", models[m], r);
        if (!(by_layer.misses * 2 < each.misses))
            fail_msg("%s: layer by layer read %llu experts, a micro-batch a call %llu", models[m],
                     (unsigned long long)by_layer.misses, (unsigned long long)each.misses);
        free(ref);
        free(got);
        free(one);
    }
}

/* The tier given back between evaluations: the engine goes on through the mapping, with the
 * logits of an engine that never had one. */
static void test_engine_drop(void **state)
{
    (void)state;
    if (!tu_refdata_exists("models/qwen35moe-tiny-Q4_K_M.gguf")) tu_skip_no_refdata();
    struct sil_engine *e = NULL;
    open_with(&e, "qwen35moe-tiny-Q4_K_M", false, true, 0);
    struct sil_engine_host_tier t;
    sil_engine_host_tier(e, &t);
    int32_t n = 0;
    float *ref = run(e, &n);
    const int32_t V = sil_engine_info(e)->n_vocab;
    sil_engine_close(e);
    open_with(&e, "qwen35moe-tiny-Q4_K_M", false, false, t.min_bytes);
    float *first = run(e, &n);
    sil_engine_host_tier_drop(e);
    sil_engine_host_tier(e, &t);
    assert_false(t.on);
    sil_engine_host_tier_drop(e); /* twice: nothing */
    sil_seq_free(e, 0); /* run's sequence */
    float *again = run(e, &n);
    assert_memory_equal(ref, first, sizeof(float) * (size_t)V * (size_t)n);
    assert_memory_equal(ref, again, sizeof(float) * (size_t)V * (size_t)n);
    sil_engine_close(e);
    free(ref);
    free(first);
    free(again);
}

/* A budget below the tier's minimum: a clear error giving it. Off: the mapping. A budget that
 * holds every expert: no tier. */
static void test_engine_budget(void **state)
{
    (void)state;
    if (!tu_refdata_exists("models/qwen35moe-tiny-Q4_K_M.gguf")) tu_skip_no_refdata();
    struct sil_engine_params p;
    sil_engine_params_default(&p);
    p.n_threads = 2;
    p.n_ctx = 128;
    p.n_seq_max = 1;
    p.host_budget = 4096;
    struct sil_engine *e = NULL;
    struct sil_error err = {0};
    assert_int_equal(tu_open_refdata_engine(&e, "qwen35moe-tiny-Q4_K_M", &p, &err), -EINVAL);
    assert_null(e);
    assert_non_null(strstr(err.msg, "host tier needs at least"));
    assert_non_null(strstr(err.msg, "host budget"));
    p.host_budget = 1ull << 40;
    assert_int_equal(tu_open_refdata_engine(&e, "qwen35moe-tiny-Q4_K_M", &p, &err), 0);
    struct sil_engine_host_tier t;
    sil_engine_host_tier(e, &t);
    assert_false(t.on);
    assert_true(t.min_bytes > 0);
    sil_engine_close(e);
    /* a model without experts never has one; its budget must still hold its backbone and KV */
    p.host_budget = 4096;
    assert_int_equal(tu_open_refdata_engine(&e, "qwen3-tiny-Q8_0", &p, &err), -EINVAL);
    assert_non_null(strstr(err.msg, "is under the least this model takes"));
    assert_null(strstr(err.msg, "experts"));
    p.host_budget = 1ull << 40;
    assert_int_equal(tu_open_refdata_engine(&e, "qwen3-tiny-Q8_0", &p, &err), 0);
    sil_engine_host_tier(e, &t);
    assert_false(t.on);
    assert_int_equal(t.min_bytes, 0);
    sil_engine_close(e);
}

/* The model file truncated while the tier reads it: the evaluation fails as a fault on the
 * mapping does (-EIO naming the file), and the engine is damaged for good. */
static void test_engine_truncated(void **state)
{
    (void)state;
    if (!tu_refdata_exists("models/qwen35moe-tiny-Q4_K_M.gguf")) tu_skip_no_refdata();
    char *dir = tu_tmpdir_create();
    char *path = tu_refdata_copy("models/qwen35moe-tiny-Q4_K_M.gguf", dir, "model.gguf");
    assert_non_null(path);
    struct sil_engine_params p;
    sil_engine_params_default(&p);
    p.model_path = path;
    p.n_threads = 2;
    p.n_ctx = 128;
    p.n_seq_max = 1;
    p.host_budget_off = true;
    struct sil_engine *e = NULL;
    struct sil_error err = {0};
    assert_int_equal(sil_engine_open(&e, &p, &err), 0);
    struct sil_engine_host_tier t;
    sil_engine_host_tier(e, &t);
    sil_engine_close(e);
    p.host_budget_off = false;
    p.host_budget = t.min_bytes;
    assert_int_equal(sil_engine_open(&e, &p, &err), 0);
    const int32_t V = sil_engine_info(e)->n_vocab;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t tok[16], pos[16], sq[16];
    int st[16];
    const int s = sil_seq_create(e, &err);
    for (int i = 0; i < 16; i++)
        tok[i] = (i * 37 + 11) % 500, pos[i] = i, sq[i] = s;
    struct sil_batch b = {16, tok, pos, sq, NULL};
    assert_int_equal(sil_engine_eval_rows(e, &b, lg, st, &err), 0);
    /* keep the header and the backbone's first bytes: the experts' reads end early */
    assert_int_equal(truncate(path, 4096), 0);
    sil_seq_truncate(e, s, 0, &err);
    const int rc = sil_engine_eval_rows(e, &b, lg, st, &err);
    assert_int_equal(rc, -EIO);
    assert_non_null(strstr(err.msg, path));
    assert_true(sil_engine_damaged(e));
    assert_int_equal(sil_engine_eval(e, &b, lg, &err), -EIO);
    free(lg);
    sil_engine_close(e);
    unlink(path);
    free(path);
    tu_tmpdir_remove(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_direct),
        cmocka_unit_test(test_reads_buffered),
        cmocka_unit_test(test_demote),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_file_changes),
        cmocka_unit_test(test_engine_bit_identical),
        cmocka_unit_test(test_engine_by_layer),
        cmocka_unit_test(test_engine_drop),
        cmocka_unit_test(test_engine_budget),
        cmocka_unit_test(test_engine_truncated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
