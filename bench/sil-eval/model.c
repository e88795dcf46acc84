#include "bench/sil-eval/model.h"

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench/common/common.h"
#include "bench/common/spec.h"
#include "daemon/engine/engine.h"
#include "daemon/engine/route_obs.h"
#include "daemon/engine/sampler.h"
#include "daemon/engine/size.h"
#include "daemon/engine/spec.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int parse_int(const char *what, const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "sil-eval: %s '%s' is not an integer in [%ld, %ld]\n", what, s, lo, hi);
        return -EINVAL;
    }
    *out = v;
    return 0;
}

/* Rows of one prefill evaluation: several of the engine's micro-batches, which it takes layer
 * by layer when the experts come from the host tier (each layer's read once for all). */
#define PREFILL_BATCH 4096

/* --vram-budget: a size as siliceod takes it ("8G", "512MiB"), more than 0. */
static int parse_size(const char *what, const char *s, uint64_t *out)
{
    if (sil_parse_size(s, out) < 0 || *out == 0) {
        fprintf(stderr, "sil-eval: %s must be a size such as 8G or 512M\n", what);
        return -1;
    }
    return 0;
}

/* --host-budget: a size as --vram-budget takes it, or off (the mapping as before) or auto (what
 * the host and the cgroup can spare, the default). */
static int parse_host_budget(const char *s, struct sil_engine_params *p)
{
    if (strcmp(s, "off") == 0) {
        p->host_budget_off = true;
        return 0;
    }
    if (strcmp(s, "auto") == 0)
        return 0;
    if (sil_parse_size(s, &p->host_budget) < 0 || p->host_budget == 0) {
        fprintf(stderr, "sil-eval: --host-budget must be a size such as 24G or 512M, auto or off\n");
        return -1;
    }
    return 0;
}

/* --tokens: ids and inclusive ranges A..B, comma-separated (1,5,7..9); at most TOKENS_MAX ids. */
#define TOKENS_MAX (1 << 24)
static int parse_tokens(const char *s, int32_t **ids, size_t *n)
{
    size_t cap = 16, k = 0;
    int32_t *v = malloc(cap * sizeof(*v));
    while (v && *s) {
        char *end;
        errno = 0;
        long t = strtol(s, &end, 10), u = t;
        bool ok = !errno && end != s && t >= 0 && t <= INT32_MAX;
        if (ok && end[0] == '.' && end[1] == '.') {
            const char *b = end + 2;
            u = strtol(b, &end, 10);
            ok = !errno && end != b && u >= t && u <= INT32_MAX;
        }
        ok = ok && (!*end || *end == ',') && (size_t)(u - t) < (size_t)TOKENS_MAX - k;
        if (!ok) {
            fprintf(stderr, "sil-eval: --tokens: bad id list at '%s' (ids and ranges A..B, A <= B, "
                            "at most %d ids)\n",
                    s, TOKENS_MAX);
            free(v);
            return -EINVAL;
        }
        for (long x = t; x <= u; x++) {
            if (k == cap) {
                int32_t *w = realloc(v, (cap *= 2) * sizeof(*v));
                if (!w) {
                    free(v);
                    return -ENOMEM;
                }
                v = w;
            }
            v[k++] = (int32_t)x;
        }
        s = *end ? end + 1 : end;
    }
    if (!v)
        return -ENOMEM;
    *ids = v;
    *n = k;
    return 0;
}

static int read_all(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    size_t cap = 1 << 16, n = 0;
    char *p = malloc(cap);
    while (p) {
        size_t r = fread(p + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
        if (n == cap) {
            char *q = realloc(p, cap *= 2);
            if (!q)
                free(p);
            p = q;
        }
    }
    int bad = ferror(f);
    fclose(f);
    if (!p || bad) {
        free(p);
        return p ? -EIO : -ENOMEM;
    }
    *buf = p;
    *len = n;
    return 0;
}

/* A field of /proc/self/status in MiB (kB there), -1 if unreadable. */
static double status_mib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    char line[256];
    double v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, field, n) == 0 && line[n] == ':') {
            v = strtod(line + n + 1, NULL) / 1024.0;
            break;
        }
    fclose(f);
    return v;
}

static void print_row(const float *x, int32_t n)
{
    putchar('[');
    for (int32_t i = 0; i < n; i++)
        printf(i ? ", %.9g" : "%.9g", (double)x[i]);
    putchar(']');
}

/* --heat-map: what loading it did at start, and whether the end saved it */
struct heat_run {
    const char *loaded; /* none (no file), loaded or ignored (corrupt or another model's) */
    struct sil_heat_restore r;
    double preload_s;
    bool saved;
};

/* The warm restart siliceod makes at start (sil_engine_heat_restore); a file that cannot be
 * used is ignored with a warning (the run starts cold). */
static void heat_start(struct sil_engine *e, const char *path, struct heat_run *hr)
{
    struct sil_error err = {0};
    const double t0 = now_s();
    const int rc = sil_engine_heat_restore(e, path, NULL, NULL, &hr->r, &err);
    hr->preload_s = now_s() - t0;
    if (rc == -ENOENT) return;
    if (rc < 0) {
        fprintf(stderr, "sil-eval: ignoring the expert heat map: %s\n", err.msg);
        hr->loaded = "ignored";
        return;
    }
    hr->loaded = "loaded";
    fprintf(stderr, "sil-eval: expert heat map %s: %lld experts hot after %llu tokens, %lld "
                    "preloaded in %.2f s\n",
            path, (long long)hr->r.hot, (unsigned long long)hr->r.tokens,
            (long long)hr->r.placed, hr->preload_s);
}

/* At one plain decoding step (probe_step): the top-two logit gap there, and the largest move of
 * the row's logits as the second of a two-row pass against one row at a time from the same
 * state, and between two such one-row runs (the engine's noise from its own history: which
 * experts were resident, which the CPU took). margin < 0: not probed. */
struct probe {
    float margin, two_row, rerun;
};

/* --spec: the greedy tokens again by speculative decoding, target t drafted by d, by its MTP
 * layer, or by the oracle (oref: the prompt and plain decoding's tokens; op its chance). */
struct spec_run {
    long width, depth;
    const int32_t *oref;
    int32_t n_oref;
    double op;
    struct sil_spec_stats st;
    int32_t *greedy; /* [n_predict] */
    double decode_s;
    long diverged; /* the first token unlike plain decoding's, -1: none */
    struct probe div; /* probe_step at that step */
};

/* --probe-steps takes at most this many steps */
#define PROBE_MAX 16

/* Evaluates ids[0, n) in a fresh sequence of e, without logits; the sequence or -1. */
static int prefill_quiet(struct sil_engine *e, const int32_t *ids, size_t n, int32_t *pos,
                         int32_t *seqs, bool *want)
{
    struct sil_error err = {0};
    int seq = sil_seq_create(e, &err);
    for (size_t b0 = 0; seq >= 0 && b0 < n; b0 += PREFILL_BATCH) {
        const int32_t k = (int32_t)(n - b0 < PREFILL_BATCH ? n - b0 : PREFILL_BATCH);
        for (int32_t i = 0; i < k; i++) {
            pos[i] = (int32_t)(b0 + (size_t)i);
            seqs[i] = seq;
            want[i] = false;
        }
        const struct sil_batch b = {k, ids + b0, pos, seqs, want};
        if (sil_engine_eval(e, &b, NULL, &err) < 0) seq = -1;
    }
    if (seq < 0) fprintf(stderr, "sil-eval: %s\n", err.msg);
    return seq;
}

/* prefill_quiet for MTP drafting: the sequence is sp's (made and initialized by the caller), and
 * every batch's hidden states go to its MTP layer (sil_spec_mtp_feed), so that the layer holds
 * the prompt as it was trained to; 0 or -1. */
static int prefill_mtp(struct sil_engine *e, struct sil_spec *sp, int seq, const int32_t *ids,
                       size_t n, int32_t *pos, int32_t *seqs, bool *want)
{
    struct sil_error err = {0};
    const size_t E = (size_t)sil_engine_info(e)->n_embd;
    const size_t cap = n < PREFILL_BATCH ? n : PREFILL_BATCH;
    float *hidden = malloc(sizeof(float) * cap * E);
    int32_t *am = malloc(sizeof(int32_t) * cap);
    int rc = hidden && am ? 0 : sil_errorf(&err, -ENOMEM, "out of memory");
    for (size_t b0 = 0; rc == 0 && b0 < n; b0 += PREFILL_BATCH) {
        const int32_t k = (int32_t)(n - b0 < PREFILL_BATCH ? n - b0 : PREFILL_BATCH);
        for (int32_t i = 0; i < k; i++) {
            pos[i] = (int32_t)(b0 + (size_t)i);
            seqs[i] = seq;
            want[i] = true;
        }
        const struct sil_batch b = {k, ids + b0, pos, seqs, want};
        rc = sil_engine_eval_hidden(e, &b, NULL, am, hidden, &err);
        if (rc == 0) rc = sil_spec_mtp_feed(sp, ids + b0, k, hidden, &err);
    }
    if (rc < 0) fprintf(stderr, "sil-eval: %s\n", err.msg);
    free(hidden);
    free(am);
    return rc < 0 ? -1 : 0;
}

/* Plain decoding at step d (where speculative decoding parted from it, or --probe-steps): the
 * prompt ids and plain's tokens up to d in fresh sequences prefilled alike but for the last two
 * tokens; two take them one row at a time, one in a pass of two rows (as a verify pass would).
 * r->margin: the first one-row run's top-two gap (a near tie there is rounding, not a bug);
 * r->two_row: the largest difference of its last row from the two-row pass's, r->rerun: from
 * the second one-row run's. */
static void probe_step(struct sil_engine *e, const int32_t *ids, size_t n_ids,
                       const int32_t *greedy, long d, int32_t V, struct probe *r)
{
    r->margin = r->two_row = r->rerun = -1.0f;
    const size_t n = n_ids + (size_t)d; /* hist[0, n): the row at n - 1 picks token d */
    if (n < 3) return;
    struct sil_error err = {0};
    int32_t *hist = malloc(sizeof(int32_t) * n), *pos = malloc(sizeof(int32_t) * PREFILL_BATCH),
            *seqs = malloc(sizeof(int32_t) * PREFILL_BATCH);
    bool *want = malloc(sizeof(bool) * PREFILL_BATCH);
    float *la = malloc(sizeof(float) * (size_t)V), *lb = malloc(sizeof(float) * 2 * (size_t)V),
          *lc = malloc(sizeof(float) * (size_t)V);
    int sa = -1, sb = -1;
    if (!hist || !pos || !seqs || !want || !la || !lb || !lc) goto out;
    memcpy(hist, ids, sizeof(int32_t) * n_ids);
    memcpy(hist + n_ids, greedy, sizeof(int32_t) * (size_t)d);
    /* one sequence at a time: the engine may have no more than one free */
    int32_t p2[2] = {(int32_t)n - 2, (int32_t)n - 1}, s2[2], one = -1;
    bool w2[2] = {true, true};
    for (int run = 0; run < 2; run++) {
        if ((sa = prefill_quiet(e, hist, n - 2, pos, seqs, want)) < 0) goto out;
        for (int k = 0; k < 2; k++) {
            const struct sil_batch b = {1, hist + n - 2 + k, p2 + k, &sa, NULL};
            if (sil_engine_eval_out(e, &b, k ? (run ? lc : la) : NULL, k ? NULL : &one, NULL,
                                    &err) < 0)
                goto out;
        }
        sil_seq_free(e, sa);
        sa = -1;
    }
    if ((sb = prefill_quiet(e, hist, n - 2, pos, seqs, want)) < 0) goto out;
    s2[0] = s2[1] = sb;
    const struct sil_batch b2 = {2, hist + n - 2, p2, s2, w2};
    if (sil_engine_eval(e, &b2, lb, &err) < 0) goto out;
    float t1 = -INFINITY, t2 = -INFINITY, dmax = 0.0f, rmax = 0.0f;
    for (int32_t v = 0; v < V; v++) {
        const float x = la[v], dv = fabsf(x - lb[(size_t)V + v]), dr = fabsf(x - lc[v]);
        if (!(dr <= rmax)) rmax = dr;
        if (x > t1) {
            t2 = t1;
            t1 = x;
        } else if (x > t2) {
            t2 = x;
        }
        if (!(dv <= dmax)) dmax = dv;
    }
    r->margin = t1 - t2;
    r->two_row = dmax;
    r->rerun = rmax;
out:
    if (err.msg[0]) fprintf(stderr, "sil-eval: probing the divergence: %s\n", err.msg);
    if (sa >= 0) sil_seq_free(e, sa);
    if (sb >= 0) sil_seq_free(e, sb);
    free(hist);
    free(pos);
    free(seqs);
    free(lc);
    free(want);
    free(la);
    free(lb);
}

/* A probe as JSON: {"step", "plain_margin", "two_row_max_diff", "rerun_max_diff"} */
static void print_probe(long step, const struct probe *p)
{
    printf("{\"step\": %ld, \"plain_margin\": %.6g, \"two_row_max_diff\": %.6g, "
           "\"rerun_max_diff\": %.6g}",
           step, (double)p->margin, (double)p->two_row, (double)p->rerun);
}

/* Both models hold the prompt but its last token; then steps until n_predict tokens. */
static int run_spec(struct sil_engine *t, struct sil_engine *d, const int32_t *ids, size_t n_ids,
                    long n_predict, struct spec_run *r)
{
    struct sil_error err = {0};
    int32_t *pos = malloc(sizeof(int32_t) * PREFILL_BATCH),
            *seqs = malloc(sizeof(int32_t) * PREFILL_BATCH);
    bool *want = malloc(sizeof(bool) * PREFILL_BATCH);
    int32_t *hist = malloc(sizeof(int32_t) * (n_ids + (size_t)n_predict + 1));
    r->greedy = malloc(sizeof(int32_t) * (size_t)n_predict);
    int rc = -ENOMEM, ts = -1, ds = -1;
    struct sil_spec sp = {0};
    if (!pos || !seqs || !want || !hist || !r->greedy) {
        fprintf(stderr, "sil-eval: out of memory\n");
        goto out;
    }
    const bool mtp = !r->oref && !d; /* no draft model: the target's MTP layer drafts */
    if (mtp) {
        /* the layer is fed the prompt's hidden states as the target takes it in */
        if ((ts = sil_seq_create(t, &err)) < 0 ||
            (rc = sil_spec_init_mtp(&sp, t, ts, (int32_t)r->depth, &err)) < 0) {
            fprintf(stderr, "sil-eval: %s\n", err.msg);
            goto out;
        }
        if (n_ids > 1 && prefill_mtp(t, &sp, ts, ids, n_ids - 1, pos, seqs, want) < 0) {
            rc = -1;
            goto out;
        }
    } else {
        ts = prefill_quiet(t, ids, n_ids - 1, pos, seqs, want);
        ds = ts < 0 || !d ? -1 : prefill_quiet(d, ids, n_ids - 1, pos, seqs, want);
        if (ts < 0 || (d && ds < 0)) goto out;
        rc = r->oref ? sil_spec_init_oracle(&sp, t, ts, (int32_t)r->depth, r->oref, r->n_oref,
                                            r->op, 1, &err)
                     : sil_spec_init(&sp, t, ts, d, ds, (int32_t)r->depth, &err);
    }
    if (rc == 0 && r->width > 1) rc = sil_spec_set_width(&sp, (int32_t)r->width, &err);
    if (rc < 0) {
        fprintf(stderr, "sil-eval: %s\n", err.msg);
        goto out;
    }
    memcpy(hist, ids, sizeof(int32_t) * n_ids);
    int32_t nh = (int32_t)n_ids;
    const double t0 = now_s();
    while (nh < (int32_t)n_ids + n_predict) {
        const int k = sil_spec_step(&sp, hist, nh, (int32_t)n_ids + (int32_t)n_predict - nh,
                                    hist + nh, &err);
        if (k < 0) {
            fprintf(stderr, "sil-eval: %s\n", err.msg);
            rc = k;
            goto out;
        }
        nh += k;
    }
    r->decode_s = now_s() - t0;
    r->st = sp.stats;
    memcpy(r->greedy, hist + n_ids, sizeof(int32_t) * (size_t)n_predict);
    rc = 0;
out:
    sil_spec_free(&sp);
    if (ts >= 0) sil_seq_free(t, ts); /* its sequences back: probe_step may need them */
    if (ds >= 0) sil_seq_free(d, ds);
    free(pos);
    free(seqs);
    free(want);
    free(hist);
    return rc;
}

/* --mtp-logits: the prompt through the trunk (its hidden states kept), then the MTP layer over
 * rows 0..n-2 (row t: the hidden state at t, token t + 1), its logits printed as
 * {"mtp_logits": [row 0's n_vocab floats, row 1's, ...]}. 0, or 1 with the reason printed. */
static int mtp_logits_run(struct sil_engine *e, const int32_t *ids, size_t n)
{
    const struct sil_model_info *in = sil_engine_info(e);
    const size_t V = (size_t)in->n_vocab, E = (size_t)in->n_embd;
    struct sil_error err = {0};
    if (!sil_engine_has_mtp(e)) {
        fprintf(stderr, "sil-eval: --mtp-logits: %s has no MTP layer (or not on the %s backend)\n",
                in->path, in->backend);
        return 1;
    }
    if (n < 2 || n > (size_t)sil_engine_n_batch_max(e)) {
        fprintf(stderr, "sil-eval: --mtp-logits: the prompt must have 2 to %d tokens (it has %zu)\n",
                sil_engine_n_batch_max(e), n);
        return 1;
    }
    int32_t *pos = malloc(sizeof(int32_t) * n), *seqs = malloc(sizeof(int32_t) * n);
    int32_t *am = malloc(sizeof(int32_t) * n);
    bool *want = malloc(sizeof(bool) * n);
    float *hidden = malloc(sizeof(float) * n * E), *hout = malloc(sizeof(float) * n * E);
    float *ml = malloc(sizeof(float) * (n - 1) * V);
    int rc = 1, seq = -1;
    if (!pos || !seqs || !am || !want || !hidden || !hout || !ml) {
        fprintf(stderr, "sil-eval: out of memory\n");
        goto done;
    }
    if ((seq = sil_seq_create(e, &err)) < 0) goto fail;
    for (size_t i = 0; i < n; i++) {
        pos[i] = (int32_t)i;
        seqs[i] = seq;
        want[i] = true;
    }
    struct sil_batch b = {(int32_t)n, (int32_t *)ids, pos, seqs, want};
    if (sil_engine_eval_hidden(e, &b, NULL, am, hidden, &err) < 0 ||
        sil_seq_mtp_eval_out(e, seq, (int32_t)(n - 1), ids + 1, 0, hidden, ml, NULL, hout, &err) < 0)
        goto fail;
    printf("{\"mtp_logits\": [");
    for (size_t i = 0; i < (n - 1) * V; i++)
        printf(i ? ", %.9g" : "%.9g", (double)ml[i]);
    printf("]}\n");
    rc = fflush(stdout) == 0 ? 0 : 1;
    goto done;
fail:
    fprintf(stderr, "sil-eval: --mtp-logits: %s\n", err.msg);
done:
    if (seq >= 0) sil_seq_free(e, seq);
    free(pos);
    free(seqs);
    free(am);
    free(want);
    free(hidden);
    free(hout);
    free(ml);
    return rc;
}

int sil_eval_model(const struct sil_eval_model_opts *o)
{
    long n_predict = 0, n_threads = 0, ecache_slots = 0;
    if (o->ecache_slots &&
        parse_int("--ecache-slots", o->ecache_slots, 1, 1 << 30, &ecache_slots) < 0)
        return 2;
    if (o->n_predict && parse_int("--n-predict", o->n_predict, 0, 1 << 20, &n_predict) < 0)
        return 2;
    if (o->threads && parse_int("--threads", o->threads, 1, 1024, &n_threads) < 0)
        return 2;
    const char *mode = o->logits ? o->logits : "last";
    if (strcmp(mode, "last") && strcmp(mode, "all") && strcmp(mode, "none")) {
        fprintf(stderr, "sil-eval: --logits must be last, all or none\n");
        return 2;
    }
    const bool all = strcmp(mode, "all") == 0;
    struct spec_run sr = {.width = 1, .depth = 4, .diverged = -1, .div = {-1.0f, -1.0f, -1.0f}};
    enum sil_bench_spec spec_as;
    if (sil_bench_spec_mode("sil-eval", o->spec, o->draft_model, o->spec_tree, true, &spec_as) < 0 ||
        (o->spec_tree &&
         sil_bench_spec_tree("sil-eval", o->spec_tree, &sr.width, &sr.depth) < 0))
        return 2;
    const bool spec = spec_as != SIL_BENCH_SPEC_OFF;
    const bool mtp = spec_as == SIL_BENCH_SPEC_MTP; /* the target's own MTP layer drafts */
    const bool oracle = spec_as == SIL_BENCH_SPEC_ORACLE;
    const char *spec_mode = mtp ? "mtp" : oracle ? "oracle" : "draft";
    sr.op = 0.8;
    if (o->oracle_p) {
        char *end;
        errno = 0;
        sr.op = strtod(o->oracle_p, &end);
        if (!oracle || errno || end == o->oracle_p || *end || !(sr.op >= 0.0 && sr.op <= 1.0)) {
            fprintf(stderr, oracle ? "sil-eval: --oracle-p '%s' is not a number in [0, 1]\n"
                                   : "sil-eval: --oracle-p goes with --spec oracle\n",
                    o->oracle_p);
            return 2;
        }
    }
    /* --probe-steps: step numbers, comma-separated, at most PROBE_MAX, with --spec (whose
     * engine has a sequence free once the runs are done) */
    long probe_at[PROBE_MAX];
    int n_probes = 0;
    for (const char *q = o->probe_steps; q;) {
        char *end = NULL;
        errno = 0;
        const long d = strtol(q, &end, 10);
        if (!spec || errno || end == q || d < 0 || (*end && *end != ',') ||
            n_probes == PROBE_MAX) {
            fprintf(stderr,
                    spec ? "sil-eval: --probe-steps '%s' is not a list of at most %d step "
                           "numbers (e.g. 4,12,20)\n"
                         : "sil-eval: --probe-steps goes with --spec\n",
                    o->probe_steps, PROBE_MAX);
            return 2;
        }
        probe_at[n_probes++] = d;
        q = *end ? end + 1 : NULL;
    }
    if (oracle && sr.width > 1) {
        fprintf(stderr, "sil-eval: --spec oracle drafts chains only (--spec-tree 1xDEPTH)\n");
        return 2;
    }
    if (spec && n_predict < 1) {
        fprintf(stderr, "sil-eval: --spec %s needs --n-predict N (N >= 1)\n", spec_mode);
        return 2;
    }
    if (!!o->tokens + !!o->prompt + !!o->tokenize_file != 1) {
        fprintf(stderr, "sil-eval: give exactly one of --tokens, --prompt, --tokenize-file\n");
        return 2;
    }

    struct sil_error err = {0};
    struct sil_engine_params p;
    sil_engine_params_default(&p);
    sil_dev_switches_read(&p);
    const struct {
        const char *flag, *key, *val;
    } cuda_opts[] = {{"--cuda-graphs", "cuda_graphs", o->cuda_graphs},
                     {"--cuda-zero-copy", "cuda_zero_copy", o->cuda_zero_copy},
                     {"--cuda-pin", "cuda_pin", o->cuda_pin},
                     {"--cuda-cpu-share", "cuda_cpu_share", o->cuda_cpu_share}};
    for (size_t i = 0; i < sizeof cuda_opts / sizeof cuda_opts[0]; i++) {
        char why[128];
        if (cuda_opts[i].val &&
            sil_cuda_option_set(&p.cuda, cuda_opts[i].key, cuda_opts[i].val, why, sizeof why) < 0) {
            fprintf(stderr, "sil-eval: %s: %s\n", cuda_opts[i].flag, why);
            return 2;
        }
    }
    p.n_batch_max = PREFILL_BATCH;
    p.model_path = o->model;
    p.n_threads = (int)n_threads;
    p.backend = o->backend ? o->backend : "cpu"; /* the reference unless asked */
    p.exact = o->exact;
    p.kv_type = o->kv_type;
    p.n_seq_max = spec ? 2 : 1; /* the plain decode's sequence and the speculative one's */
    p.spec_states = spec ? 1 : 0; /* a step's window keeps its start on the device */
    long n_ctx = 0;
    if (o->ctx && parse_int("--ctx", o->ctx, 1, 1 << 20, &n_ctx) < 0) return 2;
    p.n_ctx = (int32_t)n_ctx;
    long n_passes = 1;
    if (o->passes && parse_int("--passes", o->passes, 1, 1000, &n_passes) < 0) return 2;
    if (o->vram_budget && parse_size("--vram-budget", o->vram_budget, &p.vram_budget) < 0) return 2;
    if (o->host_budget && parse_host_budget(o->host_budget, &p) < 0) return 2;
    p.ecache_sim_slots = (int32_t)ecache_slots;
    p.ecache_sim_policy = o->ecache_policy;
    p.heat_map = o->heat_map != NULL;
    struct sil_route_obs *ro = NULL; /* the trace written and the one routed with */
    if ((o->route_trace || o->route_replay) &&
        sil_route_obs_create(&ro, o->route_trace, o->route_replay, &err) < 0) {
        fprintf(stderr, "sil-eval: %s\n", err.msg);
        return 1;
    }
    p.observer = ro ? sil_route_obs_observer(ro) : NULL;
    struct sil_engine *e = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    float *logits = NULL;
    int32_t *greedy = NULL;
    int rc = 1;
    /* the draft model first (--spec draft): on a device it takes its part of --vram-budget */
    struct sil_engine *de; /* the draft model's engine */
    struct sil_engine_params dp;
    sil_engine_params_default(&dp);
    dp.model_path = o->draft_model;
    dp.n_threads = p.n_threads;
    dp.backend = p.backend;
    dp.exact = p.exact;
    dp.kv_type = p.kv_type;
    dp.n_ctx = p.n_ctx;
    dp.n_seq_max = 1;
    dp.n_batch_max = PREFILL_BATCH;
    if (sil_bench_spec_draft_first("sil-eval", spec_as, &dp, &p, &de) < 0) {
        sil_route_obs_free(ro, &err);
        return 1;
    }
    if (sil_engine_open(&e, &p, &err) < 0) {
        fprintf(stderr, "sil-eval: %s\n", err.msg);
        sil_engine_close(de);
        sil_route_obs_free(ro, &err);
        return 1;
    }
    if (sil_bench_spec_check("sil-eval", spec_as, e, o->model, &de) < 0) {
        sil_engine_close(e);
        sil_route_obs_free(ro, &err);
        return 1;
    }
    struct heat_run hr = {.loaded = "none"};
    if (o->heat_map) heat_start(e, o->heat_map, &hr);
    const int32_t V = sil_engine_info(e)->n_vocab;
    if (o->backend && strcmp(o->backend, sil_engine_info(e)->backend) != 0 && strcmp(o->backend, "auto") != 0)
        fprintf(stderr, "sil-eval: backend %s is not available, running on %s\n", o->backend,
                sil_engine_info(e)->backend);
    if (o->tokens) {
        if (parse_tokens(o->tokens, &ids, &n_ids) < 0)
            goto out;
    } else {
        char *text = NULL;
        size_t len = 0;
        if (o->prompt) {
            text = strdup(o->prompt);
            len = strlen(o->prompt);
        } else {
            int r = read_all(o->tokenize_file, &text, &len);
            if (r < 0) {
                fprintf(stderr, "sil-eval: %s: %s\n", o->tokenize_file, strerror(-r));
                goto out;
            }
        }
        int r = text ? sil_tokenize(sil_engine_vocab(e), text, len, o->add_bos, o->parse_special, &ids,
                                    &n_ids, &err)
                     : -ENOMEM;
        free(text);
        if (r < 0) {
            fprintf(stderr, "sil-eval: %s\n", err.msg);
            goto out;
        }
    }
    if (n_ids == 0) {
        fprintf(stderr, "sil-eval: the prompt has no tokens\n");
        goto out;
    }
    if (o->mtp_logits) {
        rc = mtp_logits_run(e, ids, n_ids);
        goto out;
    }
    if ((int64_t)n_ids + n_predict > sil_engine_n_ctx(e)) {
        fprintf(stderr, "sil-eval: %zu prompt + %ld predicted tokens exceed the context (%d)\n", n_ids,
                n_predict, sil_engine_n_ctx(e));
        goto out;
    }
    size_t n_rows_out = all ? n_ids : 1;
    logits = malloc(sizeof(float) * (size_t)V * n_rows_out);
    greedy = malloc(sizeof(int32_t) * (size_t)(n_predict + 1));
    int32_t *pos = malloc(sizeof(int32_t) * PREFILL_BATCH),
            *seqs = malloc(sizeof(int32_t) * PREFILL_BATCH);
    bool *want = malloc(sizeof(bool) * PREFILL_BATCH);
    struct pass {
        double prefill_tok_s, decode_tok_s;
        struct sil_engine_stats pre, dec; /* counters after the prefill, after the decode */
        struct sil_engine_host_tier tpre, tdec; /* the host tier's, at the same points */
    } *ps = calloc((size_t)n_passes, sizeof(*ps));
    if (!logits || !greedy || !pos || !seqs || !want || !ps) {
        fprintf(stderr, "sil-eval: out of memory\n");
        goto out_pass;
    }
    struct sil_engine_stats st0;
    sil_engine_stats(e, &st0);
    struct sil_engine_host_tier t0h;
    sil_engine_host_tier(e, &t0h);
    long n_decoded = 0;
    for (long pi = 0; pi < n_passes; pi++) {
        int seq = sil_seq_create(e, &err);
        if (seq < 0) {
            fprintf(stderr, "sil-eval: %s\n", err.msg);
            goto out_pass;
        }
        /* prefill in batches of up to PREFILL_BATCH rows (the engine's micro-batches within) */
        double t0 = now_s();
        for (size_t b0 = 0; b0 < n_ids; b0 += PREFILL_BATCH) {
            int32_t n = (int32_t)(n_ids - b0 < PREFILL_BATCH ? n_ids - b0 : PREFILL_BATCH);
            for (int32_t i = 0; i < n; i++) {
                pos[i] = (int32_t)(b0 + (size_t)i);
                seqs[i] = seq;
                want[i] = all || b0 + (size_t)i == n_ids - 1;
            }
            struct sil_batch b = {n, ids + b0, pos, seqs, want};
            if (sil_engine_eval(e, &b, all ? logits + b0 * (size_t)V : logits, &err) < 0) {
                fprintf(stderr, "sil-eval: %s\n", err.msg);
                goto out_pass;
            }
        }
        const double t_prefill = now_s() - t0;
        sil_engine_stats(e, &ps[pi].pre);
        sil_engine_host_tier(e, &ps[pi].tpre);
        const float *last = logits + (n_rows_out - 1) * (size_t)V;

        /* greedy decode: token s comes from the logits after token s-1 */
        double t_decode = 0;
        n_decoded = 0;
        if (n_predict > 0) {
            greedy[0] = sil_argmax(last, V);
            t0 = now_s();
            for (long s = 1; s < n_predict; s++) {
                int32_t tok = greedy[s - 1], p1 = (int32_t)(n_ids + (size_t)s - 1);
                struct sil_batch b = {1, &tok, &p1, &seq, NULL};
                /* the engine's argmax: on a device only the token id comes back */
                if (sil_engine_eval_out(e, &b, NULL, &greedy[s], NULL, &err) < 0) {
                    fprintf(stderr, "sil-eval: %s\n", err.msg);
                    goto out_pass;
                }
                n_decoded++;
            }
            t_decode = now_s() - t0;
        }
        sil_engine_stats(e, &ps[pi].dec);
        sil_engine_host_tier(e, &ps[pi].tdec);
        ps[pi].prefill_tok_s = t_prefill > 0 ? (double)n_ids / t_prefill : 0.0;
        ps[pi].decode_tok_s = t_decode > 0 ? (double)n_decoded / t_decode : 0.0;
        /* the last pass keeps its sequence: its logits are the ones printed */
        if (pi + 1 < n_passes) sil_seq_free(e, seq);
    }

    /* the plain decode's tokens and time again, drafted: the same tokens and what it took */
    double plain_step_s = 0, plain_tok_s = ps[n_passes - 1].decode_tok_s;
    if (plain_tok_s > 0) plain_step_s = 1.0 / plain_tok_s;
    if (spec) {
        int32_t *oref = NULL;
        if (oracle) { /* the oracle knows the prompt and the plain decode's tokens */
            oref = malloc(sizeof(int32_t) * (n_ids + (size_t)n_predict));
            if (!oref) {
                fprintf(stderr, "sil-eval: out of memory\n");
                goto out_pass;
            }
            memcpy(oref, ids, sizeof(int32_t) * n_ids);
            memcpy(oref + n_ids, greedy, sizeof(int32_t) * (size_t)n_predict);
            sr.oref = oref;
            sr.n_oref = (int32_t)(n_ids + (size_t)n_predict);
        }
        const int src = run_spec(e, de, ids, n_ids, n_predict, &sr);
        free(oref);
        sr.oref = NULL;
        if (src < 0) goto out_pass;
        for (long i = 0; i < n_predict && sr.diverged < 0; i++)
            if (sr.greedy[i] != greedy[i]) sr.diverged = i;
        if (sr.diverged >= 0) {
            fprintf(stderr, "sil-eval: speculative decoding gave token %d at step %ld where plain "
                            "greedy decoding gave %d\n",
                    sr.greedy[sr.diverged], sr.diverged, greedy[sr.diverged]);
            probe_step(e, ids, n_ids, greedy, sr.diverged, V, &sr.div);
            if (sr.div.margin >= 0.0f)
                fprintf(stderr, "sil-eval: there plain decoding's top two logits are %.4g apart; "
                                "two rows in one pass against one at a time from the same state: "
                                "the row's logits differ by up to %.4g (one row at a time run "
                                "twice: %.4g)\n",
                        (double)sr.div.margin, (double)sr.div.two_row, (double)sr.div.rerun);
        }
    }
    /* --probe-steps: the same probe at the steps given, diverged or not */
    struct probe probes[PROBE_MAX];
    for (int i = 0; i < n_probes; i++) {
        probes[i].margin = -1.0f;
        if (probe_at[i] >= n_predict) continue;
        probe_step(e, ids, n_ids, greedy, probe_at[i], V, &probes[i]);
        fprintf(stderr, "sil-eval: probe at step %ld: top two %.4g apart, two rows vs one %.4g, "
                        "one row run twice %.4g\n",
                probe_at[i], (double)probes[i].margin, (double)probes[i].two_row,
                (double)probes[i].rerun);
    }
    const struct sil_spec_stats *ss = &sr.st;
    const double ss_steps = ss->steps ? (double)ss->steps : 1.0;

    if (o->heat_map) {
        struct sil_error herr = {0};
        hr.saved = sil_engine_heat_save(e, o->heat_map, &herr) == 0;
        if (!hr.saved) fprintf(stderr, "sil-eval: expert heat map not saved: %s\n", herr.msg);
    }
    struct sil_engine_stats st;
    sil_engine_stats(e, &st);
    struct sil_route_obs_stats rs = {0};
    if (ro) sil_route_obs_stats(ro, &rs);
    struct sil_engine_device dev;
    const bool on_dev = sil_engine_device(e, &dev) == 0;
    const char *ecm = sil_engine_ecache_mode(e);
    const bool dev_cache = ecm && strcmp(ecm, "device") == 0;
    /* the routed experts' host tier after the run: its counters cover every pass */
    struct sil_engine_host_tier ht;
    sil_engine_host_tier(e, &ht);
    if (o->json) {
        printf("{\"n_vocab\": %d, \"tokens\": [", V);
        for (size_t i = 0; i < n_ids; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        printf("], \"logits\": [");
        if (strcmp(mode, "none") != 0)
            for (size_t r = 0; r < n_rows_out; r++) {
                if (r)
                    printf(", ");
                print_row(logits + r * (size_t)V, V);
            }
        printf("], \"greedy\": [");
        for (long s = 0; s < n_predict; s++)
            printf(s ? ", %d" : "%d", greedy[s]);
        /* the first pass's figures (cold), as with one pass */
        printf("], \"timings\": {\"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f}",
               ps[0].prefill_tok_s, ps[0].decode_tok_s);
        /* anonymous memory is everything beyond the mapped weights (scratch, KV, state);
         * nothing is freed before this point, so it is also its peak */
        struct sil_kv_info kv;
        sil_engine_kv_info(e, &kv);
        printf(", \"memory\": {\"rss_anon_mib\": %.1f, \"rss_file_mib\": %.1f, "
               "\"peak_rss_mib\": %.1f, \"kv_type\": \"%s\", \"kv_bytes_per_token\": %llu}",
               status_mib("RssAnon"), status_mib("RssFile"), status_mib("VmHWM"), kv.type,
               (unsigned long long)kv.bytes_per_pos);
        if (on_dev)
            printf(", \"device\": {\"name\": \"%s\", \"weight_bytes\": %llu, \"kv_bytes\": %llu, "
                   "\"scratch_bytes\": %llu, \"budget_bytes\": %llu, \"pinned_bytes\": %llu, "
                   "\"h2d_gbs\": %.3f, \"slot_bytes_in\": %llu, \"slot_fills\": %llu, "
                   "\"zero_copy\": %s, \"zero_copy_passes\": %llu, \"cpu_misses\": %d, "
                   "\"cpu_share\": %.3f, \"host_expert_gbs\": %.1f, \"cpu_experts\": %llu}",
                   dev.name, (unsigned long long)dev.weight_bytes, (unsigned long long)dev.kv_bytes,
                   (unsigned long long)dev.scratch_bytes, (unsigned long long)dev.budget_bytes,
                   (unsigned long long)dev.pinned_bytes, dev.h2d_gbs,
                   (unsigned long long)dev.slot_bytes_in, (unsigned long long)dev.slot_fills,
                   dev.zero_copy ? "true" : "false", (unsigned long long)dev.zero_copy_passes,
                   (int)dev.cpu_misses, dev.cpu_share, dev.host_gbs,
                   (unsigned long long)dev.cpu_experts);
        if (ecache_slots > 0 || dev_cache)
            printf(", \"ecache\": {\"mode\": \"%s\", \"slots\": %ld, \"hits\": %llu, "
                   "\"misses\": %llu, \"evictions\": %llu, \"bytes_streamed\": %llu}",
                   ecm ? ecm : "none", dev_cache ? (long)sil_engine_ecache_slots(e) : ecache_slots,
                   (unsigned long long)st.ecache_hits, (unsigned long long)st.ecache_misses,
                   (unsigned long long)st.ecache_evictions,
                   (unsigned long long)st.ecache_bytes_streamed);
        printf(", \"host_tier\": {\"on\": %s, \"full\": %s, \"budget\": %llu, \"budget_from\": ",
               ht.on ? "true" : "false", ht.full ? "true" : "false",
               (unsigned long long)ht.budget);
        sil_bench_print_json_str(ht.budget_from[0] ? ht.budget_from : NULL);
        printf(", \"slots\": %d, \"slot_bytes\": %llu, \"io\": ", (int)ht.n_slot,
               (unsigned long long)ht.slot_bytes);
        sil_bench_print_json_str(ht.io);
        printf(", \"hits\": %llu, \"misses\": %llu, \"bytes_read\": %llu, \"reads\": %llu, "
               "\"wait_s\": %.6f}",
               (unsigned long long)ht.hits, (unsigned long long)ht.misses,
               (unsigned long long)ht.bytes_read, (unsigned long long)ht.reads, ht.wait_s);
        struct sil_engine_host_plan hp;
        sil_engine_host_plan(e, &hp);
        printf(", \"host_budget\": {\"budget\": %llu, \"fixed\": %llu, \"experts\": %llu, "
               "\"host_tier\": %s, \"gave_way\": %s",
               (unsigned long long)hp.budget, (unsigned long long)hp.fixed,
               (unsigned long long)hp.experts, hp.tier ? "true" : "false",
               hp.gave_way ? "true" : "false");
        for (int c = 0; c < SIL_HOST_N_CACHE; c++)
            printf(", \"%s\": %llu", sil_host_cache_name((enum sil_host_cache)c),
                   (unsigned long long)hp.cache[c]);
        printf("}");
        if (o->route_replay)
            printf(", \"route_replay\": {\"records\": %llu, \"changed\": %llu, "
                   "\"max_gap\": %.6g}",
                   (unsigned long long)rs.replay_records, (unsigned long long)rs.replay_changed,
                   (double)rs.replay_gap);
        if (o->heat_map)
            printf(", \"heat_map\": {\"loaded\": \"%s\", \"hot\": %lld, \"tokens\": %llu, "
                   "\"preloaded\": %lld, \"preload_s\": %.3f, \"saved\": %s}",
                   hr.loaded, (long long)hr.r.hot, (unsigned long long)hr.r.tokens,
                   (long long)hr.r.placed, hr.preload_s, hr.saved ? "true" : "false");
        /* per pass, per phase: the counters' growth over that phase */
        printf(", \"passes\": [");
        for (long pi = 0; pi < n_passes; pi++) {
            const struct sil_engine_stats *b4 = pi ? &ps[pi - 1].dec : &st0;
            const struct sil_engine_stats *ph[2][2] = {{b4, &ps[pi].pre},
                                                       {&ps[pi].pre, &ps[pi].dec}};
            const struct sil_engine_host_tier *tb4 = pi ? &ps[pi - 1].tdec : &t0h;
            const struct sil_engine_host_tier *th[2][2] = {{tb4, &ps[pi].tpre},
                                                           {&ps[pi].tpre, &ps[pi].tdec}};
            printf("%s{\"prefill_tok_s\": %.3f, \"decode_tok_s\": %.3f", pi ? ", " : "",
                   ps[pi].prefill_tok_s, ps[pi].decode_tok_s);
            for (int k = 0; k < 2; k++) {
                const struct sil_engine_stats *x = ph[k][0], *y = ph[k][1];
                const uint64_t h = y->ecache_hits - x->ecache_hits,
                               m = y->ecache_misses - x->ecache_misses;
                printf(", \"%s\": {\"hits\": %llu, \"misses\": %llu, \"hit_rate\": %.4f, "
                       "\"evictions\": %llu, \"bytes_streamed\": %llu, \"expert_bytes\": %llu}",
                       k ? "decode" : "prefill", (unsigned long long)h, (unsigned long long)m,
                       h + m ? (double)h / (double)(h + m) : 0.0,
                       (unsigned long long)(y->ecache_evictions - x->ecache_evictions),
                       (unsigned long long)(y->ecache_bytes_streamed - x->ecache_bytes_streamed),
                       (unsigned long long)(y->expert_bytes - x->expert_bytes));
                /* the host tier's growth over the phase: what it found, read and waited */
                const struct sil_engine_host_tier *tx = th[k][0], *ty = th[k][1];
                if (ty->on)
                    printf(", \"%s_host_tier\": {\"hits\": %llu, \"misses\": %llu, "
                           "\"bytes_read\": %llu, \"reads\": %llu, \"wait_s\": %.6f}",
                           k ? "decode" : "prefill", (unsigned long long)(ty->hits - tx->hits),
                           (unsigned long long)(ty->misses - tx->misses),
                           (unsigned long long)(ty->bytes_read - tx->bytes_read),
                           (unsigned long long)(ty->reads - tx->reads), ty->wait_s - tx->wait_s);
            }
            printf("}");
        }
        printf("]");
        if (spec) {
            /* per step: drafts accepted, tokens out (accepted + one), and the verify pass's time
             * against one plain decode step (the last pass's) */
            printf(", \"spec\": {\"mode\": \"%s\", \"draft_model\": ", spec_mode);
            if (oracle)
                printf("null, \"oracle_p\": %.4g", sr.op);
            else if (mtp)
                printf("null");
            else
                sil_bench_print_json_str(o->draft_model);
            printf(", \"tree\": \"%ldx%ld\", \"width\": %ld, \"depth\": %ld, \"greedy\": [",
                   sr.width, sr.depth, sr.width, sr.depth);
            for (long i = 0; i < n_predict; i++)
                printf(i ? ", %d" : "%d", sr.greedy[i]);
            printf("], \"identical\": %s, \"steps\": %llu, \"drafted\": %llu, "
                   "\"accepted\": %llu, \"emitted\": %llu, \"acceptance_rate\": %.4f, "
                   "\"accepted_per_step\": %.4f, \"tokens_per_step\": %.4f, "
                   "\"verify_step_ms\": %.4f, \"one_token_step_ms\": %.4f, "
                   "\"verify_vs_one_token\": %.4f, \"draft_ms_per_step\": %.4f, "
                   "\"commit_ms_per_step\": %.4f, \"decode_tok_s\": %.3f, "
                   "\"plain_decode_tok_s\": %.3f, \"speedup\": %.4f, "
                   "\"moe_layers\": %llu, \"expert_union_per_layer\": %.4f, "
                   "\"expert_pairs_per_layer\": %.4f",
                   sr.diverged < 0 ? "true" : "false", (unsigned long long)ss->steps,
                   (unsigned long long)ss->drafted, (unsigned long long)ss->accepted,
                   (unsigned long long)ss->emitted,
                   ss->drafted ? (double)ss->accepted / (double)ss->drafted : 0.0,
                   (double)ss->accepted / ss_steps, (double)ss->emitted / ss_steps,
                   1e3 * ss->verify_s / ss_steps, 1e3 * plain_step_s,
                   plain_step_s > 0 ? ss->verify_s / ss_steps / plain_step_s : 0.0,
                   1e3 * ss->draft_s / ss_steps, 1e3 * ss->commit_s / ss_steps,
                   sr.decode_s > 0 ? (double)n_predict / sr.decode_s : 0.0, plain_tok_s,
                   sr.decode_s > 0 && plain_tok_s > 0
                       ? (double)n_predict / sr.decode_s / plain_tok_s
                       : 0.0,
                   (unsigned long long)ss->moe_layers,
                   ss->moe_layers ? (double)ss->expert_union / (double)ss->moe_layers : 0.0,
                   ss->moe_layers ? (double)ss->expert_pairs / (double)ss->moe_layers : 0.0);
            if (sr.diverged >= 0 && sr.div.margin >= 0.0f) {
                printf(", \"diverged\": ");
                print_probe(sr.diverged, &sr.div);
            } else
                printf(", \"diverged\": %s", sr.diverged >= 0 ? "{}" : "null");
            /* windows cut by replaying the kept rows' delta-net cores on the device (null on
             * the host, where cuts replay from the engine's capture) */
            struct sil_engine_device sd;
            if (sil_engine_device(e, &sd) == 0)
                printf(", \"device_cut_replays\": %llu}", (unsigned long long)sd.cut_replays);
            else
                printf(", \"device_cut_replays\": null}");
        }
        if (n_probes > 0) {
            printf(", \"probes\": [");
            int np = 0;
            for (int i = 0; i < n_probes; i++) {
                if (probes[i].margin < 0.0f) continue;
                fputs(np++ ? ", " : "", stdout);
                print_probe(probe_at[i], &probes[i]);
            }
            printf("]");
        }
        printf("}\n");
    } else {
        printf("tokens: %zu, n_vocab %d\n", n_ids, V);
        if (strcmp(mode, "none") != 0)
            for (size_t r = 0; r < n_rows_out; r++) {
                printf("logits[%zu] argmax %d: ", all ? r : n_ids - 1, sil_argmax(logits + r * (size_t)V, V));
                print_row(logits + r * (size_t)V, V < 8 ? V : 8);
                printf(" ...\n");
            }
        printf("greedy:");
        for (long s = 0; s < n_predict; s++)
            printf(" %d", greedy[s]);
        printf("\n");
        for (long pi = 0; pi < n_passes; pi++)
            printf("%sprefill: %.2f tok/s (%zu tokens), decode: %.2f tok/s (%ld tokens), %d "
                   "threads\n",
                   n_passes > 1 ? (pi ? "warm " : "cold ") : "", ps[pi].prefill_tok_s, n_ids,
                   ps[pi].decode_tok_s, n_decoded, sil_engine_info(e)->n_threads);
        if (ecache_slots > 0 || dev_cache)
            printf("expert cache (%s, %ld slots): hit rate %.4f, %llu hits, %llu misses, "
                   "%llu evictions\n",
                   ecm ? ecm : "none", dev_cache ? (long)sil_engine_ecache_slots(e) : ecache_slots,
                   st.ecache_hits + st.ecache_misses
                       ? (double)st.ecache_hits / (double)(st.ecache_hits + st.ecache_misses)
                       : 0.0,
                   (unsigned long long)st.ecache_hits, (unsigned long long)st.ecache_misses,
                   (unsigned long long)st.ecache_evictions);
        if (ht.on)
            printf("expert host tier (%d slots of %llu bytes, budget %llu bytes from %s, %s "
                   "reads): %llu hits, %llu misses, %llu bytes in %llu reads, %.3f s waited\n",
                   (int)ht.n_slot, (unsigned long long)ht.slot_bytes,
                   (unsigned long long)ht.budget, ht.budget_from, ht.io ? ht.io : "?",
                   (unsigned long long)ht.hits, (unsigned long long)ht.misses,
                   (unsigned long long)ht.bytes_read, (unsigned long long)ht.reads, ht.wait_s);
        if (o->route_replay)
            printf("route replay: %llu records, %llu choices outside the top-k, largest gap "
                   "%.4g (ln p)\n",
                   (unsigned long long)rs.replay_records, (unsigned long long)rs.replay_changed,
                   (double)rs.replay_gap);
        if (o->heat_map)
            printf("expert heat map: %s at start (%lld preloaded), %s at the end\n", hr.loaded,
                   (long long)hr.r.placed, hr.saved ? "saved" : "not saved");
        if (spec) {
            printf("spec greedy:");
            for (long i = 0; i < n_predict; i++)
                printf(" %d", sr.greedy[i]);
            printf("\nspec (%s, %ldx%ld): %llu steps, %llu of %llu drafts accepted (%.1f%%), "
                   "%.2f tokens a step; verify step %.3f ms vs one-token step %.3f ms; decode "
                   "%.2f tok/s vs plain %.2f tok/s; %s plain greedy decoding\n",
                   spec_mode, sr.width, sr.depth, (unsigned long long)ss->steps,
                   (unsigned long long)ss->accepted,
                   (unsigned long long)ss->drafted,
                   ss->drafted ? 100.0 * (double)ss->accepted / (double)ss->drafted : 0.0,
                   (double)ss->emitted / ss_steps, 1e3 * ss->verify_s / ss_steps,
                   1e3 * plain_step_s, sr.decode_s > 0 ? (double)n_predict / sr.decode_s : 0.0,
                   plain_tok_s, sr.diverged < 0 ? "identical to" : "DIFFERS from");
        }
    }
    if ((o->heat_map && !hr.saved) || sr.diverged >= 0) rc = 1;
    else rc = fflush(stdout) == 0 ? 0 : 1;
out_pass:
    free(pos);
    free(seqs);
    free(want);
    free(ps);
out:
    free(ids);
    free(logits);
    free(greedy);
    free(sr.greedy);
    sil_engine_close(de);
    sil_engine_close(e);
    if (sil_route_obs_free(ro, &err) < 0) fprintf(stderr, "sil-eval: %s\n", err.msg);
    return rc;
}
