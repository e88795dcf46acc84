/* Speculative decoding with a draft model, a greedy chain (spec.h). */
#include "daemon/engine/spec.h"
#include "daemon/engine/sampler.h"
#include "kernels/clock.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The target's MoE counters before a verify pass (mark) and what the pass added (count). */
static void moe_mark(const struct sil_spec *s, struct sil_engine_stats *at)
{
    sil_engine_stats(s->target, at);
}

static void moe_count(struct sil_spec *s, const struct sil_engine_stats *at)
{
    struct sil_engine_stats now;
    sil_engine_stats(s->target, &now);
    s->stats.moe_layers += now.moe_plans - at->moe_plans;
    s->stats.expert_union += now.moe_experts - at->moe_experts;
    s->stats.expert_pairs += now.moe_pairs - at->moe_pairs;
}

int sil_spec_vocab_check(const struct sil_vocab *target, const struct sil_vocab *draft,
                         struct sil_error *err)
{
    const int32_t nt = sil_vocab_n_tokens(target), nd = sil_vocab_n_tokens(draft);
    if (nt != nd)
        return sil_errorf(err, -EINVAL,
                          "spec: the draft model's vocabulary has %d tokens, the target's %d", nd,
                          nt);
    for (int32_t id = 0; id < nt; id++) {
        const char *a, *b;
        const int la = sil_token_bytes(target, id, &a), lb = sil_token_bytes(draft, id, &b);
        if (la < 0 || lb < 0 || la != lb || memcmp(a, b, (size_t)la) != 0)
            return sil_errorf(err, -EINVAL,
                              "spec: token %d differs between the target's and the draft "
                              "model's vocabulary",
                              id);
    }
    return 0;
}

int sil_spec_init(struct sil_spec *s, struct sil_engine *target, int tseq, struct sil_engine *draft,
                  int dseq, int32_t depth, struct sil_error *err)
{
    memset(s, 0, sizeof(*s));
    if (!target || !draft) return sil_errorf(err, -EINVAL, "spec: no target or draft engine");
    if (target == draft && tseq == dseq)
        return sil_errorf(err, -EINVAL, "spec: the draft needs a sequence of its own");
    if (depth < 1 || depth > SIL_SPEC_DEPTH_MAX || depth >= sil_engine_n_batch_max(target) ||
        depth >= sil_engine_n_batch_max(draft))
        return sil_errorf(err, -EINVAL, "spec: depth %d outside [1, %d] or beyond a batch", depth,
                          SIL_SPEC_DEPTH_MAX);
    if (sil_engine_info(target)->n_vocab != sil_engine_info(draft)->n_vocab)
        return sil_errorf(err, -EINVAL, "spec: the draft model has %d logits a row, the target %d",
                          sil_engine_info(draft)->n_vocab, sil_engine_info(target)->n_vocab);
    int rc = sil_spec_vocab_check(sil_engine_vocab(target), sil_engine_vocab(draft), err);
    if (rc < 0) return rc;
    s->target = target;
    s->draft = draft;
    s->tseq = tseq;
    s->dseq = dseq;
    s->depth = depth;
    s->width = 1;
    /* rows of a verify batch (depth + 1) or of a draft catch-up (the draft's batch) */
    const int32_t n =
        sil_engine_n_batch_max(draft) > depth + 1 ? sil_engine_n_batch_max(draft) : depth + 1;
    s->n_rows_max = n;
    s->tok = malloc(sizeof(int32_t) * (size_t)n);
    s->pos = malloc(sizeof(int32_t) * (size_t)n);
    s->seq = malloc(sizeof(int32_t) * (size_t)n);
    s->am = malloc(sizeof(int32_t) * (size_t)n);
    s->dtok = malloc(sizeof(int32_t) * (size_t)(depth + 1));
    s->want = malloc(sizeof(bool) * (size_t)n);
    if (!s->tok || !s->pos || !s->seq || !s->am || !s->dtok || !s->want) {
        sil_spec_free(s);
        return sil_errorf(err, -ENOMEM, "spec: out of memory");
    }
    return 0;
}

void sil_spec_free(struct sil_spec *s)
{
    sil_sampler_free(s->orng);
    free(s->tok);
    free(s->pos);
    free(s->seq);
    free(s->am);
    free(s->dtok);
    free(s->want);
    free(s->q);
    free(s->lg);
    free(s->p);
    free(s->scratch);
    free(s->hbuf);
    free(s->hid);
    free(s->hin);
    free(s->hout);
    free(s->mtok);
    free(s->mam);
    free(s->par);
    free(s->tt);
    free(s->keep);
    free(s->dlg);
    memset(s, 0, sizeof(*s));
}

/* Rows [0, n) of the batch arrays: seq at positions p0 .. p0 + n - 1, every row's output
 * wanted (all) or the last one's only. */
static void set_rows(struct sil_spec *s, int seq, int32_t n, int32_t p0, bool all)
{
    for (int32_t i = 0; i < n; i++) {
        s->pos[i] = p0 + i;
        s->seq[i] = seq;
        s->want[i] = all || i == n - 1;
    }
}

/* Evaluates n rows tok[] of seq from position p0; the argmax of the last row (or of every row
 * when all) into am. */
static int eval_rows(struct sil_spec *s, struct sil_engine *e, int seq, const int32_t *tok,
                     int32_t n, int32_t p0, bool all, int32_t *am, struct sil_error *err)
{
    set_rows(s, seq, n, p0, all);
    const struct sil_batch b = {n, tok, s->pos, s->seq, s->want};
    return sil_engine_eval_out(e, &b, NULL, am, NULL, err);
}

/* Evaluates one row tok of seq at position pos with its logits into lg. */
static int eval_row_logits(struct sil_spec *s, struct sil_engine *e, int seq, int32_t tok,
                           int32_t pos, float *lg, struct sil_error *err)
{
    s->tok[0] = tok;
    set_rows(s, seq, 1, pos, true);
    const struct sil_batch b = {1, s->tok, s->pos, s->seq, s->want};
    return sil_engine_eval_out(e, &b, lg, NULL, NULL, err);
}

/* The draft catches up on hist but its last token, a batch at a time. */
static int draft_catch_up(struct sil_spec *s, const int32_t *hist, int32_t n_hist,
                          struct sil_error *err)
{
    struct sil_engine *e = s->draft;
    const int32_t bmax = sil_engine_n_batch_max(e);
    int32_t at = sil_seq_len(e, s->dseq), am;
    while (at < n_hist - 1) {
        const int32_t k = n_hist - 1 - at < bmax ? n_hist - 1 - at : bmax;
        int rc = eval_rows(s, e, s->dseq, hist + at, k, at, false, &am, err);
        if (rc < 0) return rc;
        at += k;
    }
    return 0;
}

/* How many drafts a step makes: within depth, what may come out, and the contexts (the target
 * evaluates positions up to n_hist - 1 + n, a draft model up to n_hist - 2 + n). */
static int32_t step_drafts(const struct sil_spec *s, int32_t n_hist, int32_t max_out)
{
    int32_t n = s->depth;
    if (n > max_out - 1) n = max_out - 1;
    if (n > sil_engine_n_ctx(s->target) - n_hist) n = sil_engine_n_ctx(s->target) - n_hist;
    if (s->draft && n > sil_engine_n_ctx(s->draft) - n_hist + 1)
        n = sil_engine_n_ctx(s->draft) - n_hist + 1;
    return n < 0 ? 0 : n;
}

/* A draft model's step: the target holds hist but its last token, the draft no more; returns
 * the drafts this step makes, or -EINVAL. */
static int32_t chain_drafts(const struct sil_spec *s, int32_t n_hist, int32_t max_out,
                            struct sil_error *err)
{
    const int32_t tlen = sil_seq_len(s->target, s->tseq),
                  dlen = s->draft ? sil_seq_len(s->draft, s->dseq) : 0;
    if (tlen != n_hist - 1 || dlen > n_hist - 1)
        return sil_errorf(err, -EINVAL,
                          "spec: the target holds %d positions and the draft %d of %d tokens", tlen,
                          dlen, n_hist);
    return step_drafts(s, n_hist, max_out);
}

/* After a draft model's verify pass (rc its result) of n drafts, m of them accepted: the
 * target keeps the last token and the accepted drafts, the draft the accepted ones it
 * evaluated (it never evaluated the last draft); on an error both keep hist but its last
 * token. */
static int chain_commit(struct sil_spec *s, int rc, int32_t n_hist, int32_t n, int32_t m,
                        struct sil_error *err)
{
    struct sil_engine *t = s->target, *d = s->draft;
    struct sil_error ignored = {0};
    if (rc < 0) {
        sil_seq_spec_commit(t, s->tseq, n_hist - 1, &ignored);
        if (n > 0 && d) sil_seq_spec_commit(d, s->dseq, n_hist - 1, &ignored);
        return rc;
    }
    rc = sil_seq_spec_commit(t, s->tseq, n_hist + m, err);
    if (n > 0 && d) {
        const int32_t keep = rc < 0 ? n_hist - 1 : n_hist + (m < n - 1 ? m : n - 1);
        const int drc = sil_seq_spec_commit(d, s->dseq, keep, rc < 0 ? &ignored : err);
        if (rc == 0) rc = drc;
    }
    return rc;
}

/* A step's tokens out: the m accepted drafts dr, then last; its counts. */
static int32_t step_out(struct sil_spec *s, const int32_t *dr, int32_t drafted, int32_t m,
                        int32_t last, int32_t *out)
{
    memcpy(out, dr, sizeof(int32_t) * (size_t)m);
    out[m] = last;
    s->stats.steps++;
    s->stats.drafted += (uint64_t)drafted;
    s->stats.accepted += (uint64_t)m;
    s->stats.emitted += (uint64_t)m + 1;
    return m + 1;
}

/* The draft's proposals d[0, n): catch up on hist but its last token, then, in a verification
 * window of the draft's sequence (so any error, or a rejection, can take them back), the last
 * token and one greedy row per draft. */
static int draft_chain(struct sil_spec *s, const int32_t *hist, int32_t n_hist, int32_t n,
                       int32_t *d, struct sil_error *err)
{
    struct sil_engine *e = s->draft;
    int rc = draft_catch_up(s, hist, n_hist, err);
    if (rc < 0) return rc;
    rc = sil_seq_spec_begin(e, s->dseq, err);
    if (rc < 0) return rc;
    rc = eval_rows(s, e, s->dseq, &hist[n_hist - 1], 1, n_hist - 1, false, &d[0], err);
    for (int32_t i = 1; i < n && rc == 0; i++)
        rc = eval_rows(s, e, s->dseq, &d[i - 1], 1, n_hist + i - 1, false, &d[i], err);
    if (rc < 0) {
        struct sil_error ignored = {0};
        sil_seq_spec_commit(e, s->dseq, n_hist - 1, &ignored);
    }
    return rc;
}

/* What every drafter without a draft model (the MTP layer, the oracle) sets: the target and
 * its sequence, the depth (checked), a chain, and the row buffers of depth + 1 rows. */
static int init_modelless(struct sil_spec *s, struct sil_engine *target, int tseq, int32_t depth,
                          struct sil_error *err)
{
    if (depth < 1 || depth > SIL_SPEC_DEPTH_MAX || depth >= sil_engine_n_batch_max(target))
        return sil_errorf(err, -EINVAL, "spec: depth %d outside [1, %d] or beyond a batch", depth,
                          SIL_SPEC_DEPTH_MAX);
    s->target = target;
    s->tseq = tseq;
    s->depth = depth;
    s->width = 1;
    const size_t n = (size_t)depth + 1;
    s->n_rows_max = (int32_t)n;
    s->tok = malloc(sizeof(int32_t) * n);
    s->pos = malloc(sizeof(int32_t) * n);
    s->seq = malloc(sizeof(int32_t) * n);
    s->am = malloc(sizeof(int32_t) * n);
    s->dtok = malloc(sizeof(int32_t) * n);
    s->want = malloc(sizeof(bool) * n);
    if (!s->tok || !s->pos || !s->seq || !s->am || !s->dtok || !s->want) {
        sil_spec_free(s);
        return sil_errorf(err, -ENOMEM, "spec: out of memory");
    }
    return 0;
}

int sil_spec_init_mtp(struct sil_spec *s, struct sil_engine *target, int tseq, int32_t depth,
                      struct sil_error *err)
{
    memset(s, 0, sizeof(*s));
    if (!target) return sil_errorf(err, -EINVAL, "spec: no target engine");
    if (!sil_engine_has_mtp(target))
        return sil_errorf(err, -ENOTSUP, "spec: %s has no MTP layer to draft with (or not on "
                                         "this backend)", sil_engine_info(target)->path);
    int rc = init_modelless(s, target, tseq, depth, err);
    if (rc < 0) return rc;
    s->mtp = true;
    const size_t n = (size_t)depth + 1, E = (size_t)sil_engine_info(target)->n_embd;
    s->mtok = malloc(sizeof(int32_t) * n);
    s->mam = malloc(sizeof(int32_t) * n);
    s->hid = malloc(sizeof(float) * n * E);
    s->hin = malloc(sizeof(float) * n * E);
    s->hout = malloc(sizeof(float) * n * E);
    if (!s->mtok || !s->mam || !s->hid || !s->hin || !s->hout) {
        sil_spec_free(s);
        return sil_errorf(err, -ENOMEM, "spec: out of memory");
    }
    return 0;
}

int sil_spec_mtp_feed(struct sil_spec *s, const int32_t *tok, int32_t n, const float *hidden,
                      struct sil_error *err)
{
    if (!s->mtp || n < 1 || !tok || !hidden)
        return sil_errorf(err, -EINVAL, "spec: nothing to feed the MTP layer");
    /* the positions fed so far: the layer's rows [0, mlen), then the waiting hidden state */
    const int32_t p = s->hn > 0 ? s->hpos + s->hn : s->mlen;
    if (s->mbase != 0 || (s->hn > 0 && (s->hn != 1 || s->hpos != s->mlen)) ||
        sil_seq_len(s->target, s->tseq) != p + n)
        return sil_errorf(err, -EINVAL, "spec: the MTP layer holds %d positions of %d, %d more fed",
                          s->mlen, sil_seq_len(s->target, s->tseq), n);
    const int64_t E = sil_engine_info(s->target)->n_embd;
    const int32_t w = s->hn; /* 1: the waiting row goes first, with tok[0] */
    const int32_t rows = w + n - 1;
    int rc = 0;
    if (rows > 0) {
        /* a decode row (the daemon feeds one a step) fits the step buffers; a prompt chunk
         * gets its own */
        const bool own = rows > s->depth + 1;
        float *hin = own ? malloc(sizeof(float) * (size_t)rows * (size_t)E) : s->hin;
        float *hout = own ? malloc(sizeof(float) * (size_t)rows * (size_t)E) : s->hout;
        int32_t *am = own ? malloc(sizeof(int32_t) * (size_t)rows) : s->mam;
        if (!hin || !hout || !am) {
            rc = sil_errorf(err, -ENOMEM, "spec: out of memory");
        } else {
            if (w) memcpy(hin, s->hid, sizeof(float) * (size_t)E);
            memcpy(hin + w * E, hidden, sizeof(float) * (size_t)(n - 1) * (size_t)E);
            /* row r reads the hidden state at position mlen + r and the token after it */
            rc = sil_seq_mtp_eval(s->target, s->tseq, rows, w ? tok : tok + 1, s->mlen, hin, am,
                                  hout, err);
        }
        if (own) {
            free(hin);
            free(hout);
            free(am);
        }
    }
    if (rc < 0) {
        s->mlen = 0;
        s->hn = 0;
        return rc;
    }
    s->mlen += rows;
    memcpy(s->hid, hidden + (int64_t)(n - 1) * E, sizeof(float) * (size_t)E);
    s->hpos = p + n - 1;
    s->hn = 1;
    return 0;
}

int sil_spec_init_oracle(struct sil_spec *s, struct sil_engine *target, int tseq, int32_t depth,
                         const int32_t *ref, int32_t n_ref, double p, uint64_t seed,
                         struct sil_error *err)
{
    memset(s, 0, sizeof(*s));
    if (!target || !ref || n_ref < 1) return sil_errorf(err, -EINVAL, "spec: no target or tokens");
    if (!(p >= 0.0 && p <= 1.0))
        return sil_errorf(err, -EINVAL, "spec: the oracle's chance %g is outside [0, 1]", p);
    int rc = init_modelless(s, target, tseq, depth, err);
    if (rc < 0) return rc;
    s->oracle = true;
    s->oref = ref;
    s->n_oref = n_ref;
    s->op = p;
    struct sil_sampler_params sp;
    sil_sampler_params_default(&sp);
    sp.seed = seed ? seed : 1; /* 0 would take one from the clock: the runs would not repeat */
    s->orng = sil_sampler_new(&sp, sil_engine_info(target)->n_vocab);
    if (!s->orng) {
        sil_spec_free(s);
        return sil_errorf(err, -ENOMEM, "spec: out of memory");
    }
    return 0;
}

/* The oracle's drafts d[0, n) for history indexes n_hist .. n_hist + n - 1, a draw from its
 * sampler's generator for each. */
static void oracle_chain(struct sil_spec *s, int32_t n_hist, int32_t n, int32_t *d)
{
    const int32_t nv = sil_engine_info(s->target)->n_vocab;
    for (int32_t i = 0; i < n; i++) {
        const double u = sil_sampler_uniform(s->orng);
        const int32_t at = n_hist + i;
        if (at >= s->n_oref)
            d[i] = 0;
        else
            d[i] = u < s->op ? s->oref[at] : (s->oref[at] + 1) % nv;
    }
}

int32_t sil_spec_accept(const float *p, const float *q, int32_t n, int32_t x,
                        struct sil_sampler *rng, float *scratch, bool *accepted)
{
    const double u = sil_sampler_uniform(rng);
    /* u < p/q, written so q(x) = 0 (a draw q cannot give) never divides */
    if ((double)p[x] > 0 && u * (double)q[x] < (double)p[x]) {
        *accepted = true;
        return x;
    }
    *accepted = false;
    for (int32_t i = 0; i < n; i++)
        scratch[i] = p[i] > q[i] ? p[i] - q[i] : 0.0f;
    int32_t t = sil_sampler_draw(rng, scratch);
    return t >= 0 ? t : sil_sampler_draw(rng, p);
}

/* The acceptance rule, draft by draft, on the target's logits lg[i] after each prefix (the
 * history being hbuf: hist, then the drafts), the draft's distributions in q: *m gets the
 * number of drafts dr[0, n) accepted; returns the token after them, the replacement of the
 * first one rejected or, when all were accepted, a bonus drawn from the target's distribution. */
static int32_t accept_drafts(struct sil_spec *s, struct sil_sampler *tsmp, int32_t n_hist,
                             int32_t n, const int32_t *dr, int32_t *m)
{
    const size_t nv = (size_t)sil_engine_info(s->target)->n_vocab;
    for (int32_t i = 0; i <= n; i++) {
        *m = i;
        sil_sampler_probs(tsmp, s->lg + (size_t)i * nv, s->hbuf, (size_t)(n_hist + i), s->p);
        if (i == n) {
            /* every draft accepted: the bonus (p always has mass) */
            const int32_t t = sil_sampler_draw(tsmp, s->p);
            return t >= 0 ? t : 0;
        }
        bool ok;
        const int32_t x =
            sil_spec_accept(s->p, s->q + (size_t)i * nv, (int32_t)nv, dr[i], tsmp, s->scratch, &ok);
        if (!ok) return x;
    }
    return 0; /* unreachable */
}

/* The sampled step's buffers for n_hist tokens of history: -ENOMEM. */
static int sampled_buffers(struct sil_spec *s, int32_t n_hist, struct sil_error *err)
{
    const size_t nv = (size_t)sil_engine_info(s->target)->n_vocab, d = (size_t)s->n_rows_max;
    if (!s->q) {
        s->q = malloc(sizeof(float) * nv * d);
        s->lg = malloc(sizeof(float) * nv * d);
        s->p = malloc(sizeof(float) * nv);
        s->scratch = malloc(sizeof(float) * nv);
        if (!s->q || !s->lg || !s->p || !s->scratch)
            return sil_errorf(err, -ENOMEM, "spec: out of memory");
    }
    const size_t need = (size_t)n_hist + d + 1;
    if (need > s->hcap) {
        int32_t *h = realloc(s->hbuf, sizeof(int32_t) * (need + need / 2));
        if (!h) return sil_errorf(err, -ENOMEM, "spec: out of memory");
        s->hbuf = h;
        s->hcap = need + need / 2;
    }
    return 0;
}

/* The MTP layer's proposals d[0, n) after hist (the target holds hist but its last token, L
 * positions): the catch-up rows c .. L - 1 (each the target's hidden state at p with token
 * p + 1; the last one, at L - 1 with the last token, proposes d[0]), then one row per draft. */
static int mtp_chain(struct sil_spec *s, const int32_t *hist, int32_t L, int32_t n, int32_t *d,
                     struct sil_error *err)
{
    struct sil_engine *t = s->target;
    const int64_t E = sil_engine_info(t)->n_embd;
    const int32_t c = s->mbase + s->mlen, k = L - c;
    for (int32_t i = 0; i < k; i++) {
        s->mtok[i] = hist[c + i + 1];
        memcpy(s->hin + i * E, s->hid + (int64_t)(c + i - s->hpos) * E, sizeof(float) * (size_t)E);
    }
    int rc = sil_seq_mtp_eval(t, s->tseq, k, s->mtok, c - s->mbase, s->hin, s->mam, s->hout, err);
    if (rc < 0) return rc;
    s->mlen = L - s->mbase; /* the catch-up rows are the target's: kept */
    d[0] = s->mam[k - 1];
    /* each draft row reads the hidden state of the row before */
    memcpy(s->hin, s->hout + (k - 1) * E, sizeof(float) * (size_t)E);
    for (int32_t i = 1; i < n; i++) {
        rc = sil_seq_mtp_eval(t, s->tseq, 1, &d[i - 1], L + i - 1 - s->mbase, s->hin, &d[i],
                              s->hout, err);
        if (rc < 0) return rc;
        memcpy(s->hin, s->hout, sizeof(float) * (size_t)E);
    }
    return 0;
}

/* mtp_chain for a sampled request: each draft is drawn from the distribution dsmp makes of the
 * MTP layer's logits (q[i], the history being hbuf: hist, then the drafts so far); lg holds the
 * catch-up rows' logits for a while. */
static int mtp_chain_sampled(struct sil_spec *s, const int32_t *hist, int32_t L, int32_t n,
                             struct sil_sampler *dsmp, int32_t *d, struct sil_error *err)
{
    struct sil_engine *t = s->target;
    const int64_t E = sil_engine_info(t)->n_embd;
    const size_t nv = (size_t)sil_engine_info(t)->n_vocab;
    const int32_t c = s->mbase + s->mlen, k = L - c;
    for (int32_t i = 0; i < k; i++) {
        s->mtok[i] = hist[c + i + 1];
        memcpy(s->hin + i * E, s->hid + (int64_t)(c + i - s->hpos) * E, sizeof(float) * (size_t)E);
    }
    int rc = sil_seq_mtp_eval_out(t, s->tseq, k, s->mtok, c - s->mbase, s->hin, s->lg, NULL,
                                  s->hout, err);
    if (rc < 0) return rc;
    s->mlen = L - s->mbase;
    const float *row = s->lg + (size_t)(k - 1) * nv;
    memcpy(s->hin, s->hout + (k - 1) * E, sizeof(float) * (size_t)E);
    for (int32_t i = 0; i < n; i++) {
        if (i > 0) {
            rc = sil_seq_mtp_eval_out(t, s->tseq, 1, &d[i - 1], L + i - 1 - s->mbase, s->hin, s->lg,
                                      NULL, s->hout, err);
            if (rc < 0) return rc;
            memcpy(s->hin, s->hout, sizeof(float) * (size_t)E);
            row = s->lg;
        }
        float *q = s->q + (size_t)i * nv;
        sil_sampler_probs(dsmp, row, s->hbuf, (size_t)(L + 1 + i), q);
        d[i] = sil_sampler_draw(dsmp, q);
        s->hbuf[L + 1 + i] = d[i];
    }
    return 0;
}

/* One MTP step, greedy (tsmp NULL) or sampled (tsmp and dsmp, the buffers made). */
static int mtp_step(struct sil_spec *s, const int32_t *hist, int32_t n_hist, int32_t max_out,
                    struct sil_sampler *tsmp, struct sil_sampler *dsmp, int32_t *out,
                    struct sil_error *err)
{
    struct sil_engine *t = s->target;
    const int32_t L = n_hist - 1;
    if (sil_seq_len(t, s->tseq) != L)
        return sil_errorf(err, -EINVAL, "spec: the target holds %d positions of %d tokens",
                          sil_seq_len(t, s->tseq), n_hist);
    int32_t n = step_drafts(s, n_hist, max_out);
    /* drafting needs the target's hidden state at L - 1 (the last pass) and the MTP layer's
     * entries up to where those start; otherwise this step only verifies and starts over */
    const bool cont = s->hn > 0 && s->hpos + s->hn == L && s->mbase + s->mlen >= s->hpos &&
                      s->mbase + s->mlen < L;
    if (!cont) n = 0;

    double t0 = sil_now_s();
    int32_t *dr = s->dtok;
    if (tsmp) memcpy(s->hbuf, hist, sizeof(int32_t) * (size_t)n_hist);
    if (n > 0) {
        int rc = tsmp ? mtp_chain_sampled(s, hist, L, n, dsmp, dr, err)
                      : mtp_chain(s, hist, L, n, dr, err);
        if (rc < 0) return rc;
    }
    const double t1 = sil_now_s();
    s->stats.draft_s += t1 - t0;

    struct sil_engine_stats at;
    moe_mark(s, &at);
    int rc = sil_seq_spec_begin(t, s->tseq, err);
    if (rc == 0) {
        s->tok[0] = hist[L];
        memcpy(s->tok + 1, dr, sizeof(int32_t) * (size_t)n);
        set_rows(s, s->tseq, n + 1, L, true);
        const struct sil_batch b = {n + 1, s->tok, s->pos, s->seq, s->want};
        /* greedy: the argmax of every row; sampled: the logits, the drafts' acceptance */
        rc = sil_engine_eval_hidden(t, &b, tsmp ? s->lg : NULL, tsmp ? NULL : s->am, s->hid, err);
    }
    moe_count(s, &at);
    const double t2 = sil_now_s();
    s->stats.verify_s += t2 - t1;
    struct sil_error ignored = {0};
    if (rc < 0) {
        sil_seq_spec_commit(t, s->tseq, L, &ignored);
        s->hn = 0; /* hid is spoilt: the next step starts over */
        return rc;
    }
    int32_t m = 0, last;
    if (tsmp) {
        last = accept_drafts(s, tsmp, n_hist, n, dr, &m);
    } else {
        while (m < n && dr[m] == s->am[m])
            m++;
        last = s->am[m];
    }
    rc = sil_seq_spec_commit(t, s->tseq, n_hist + m, err);
    s->stats.commit_s += sil_now_s() - t2;
    if (rc < 0) {
        s->hn = 0;
        return rc;
    }
    if (!cont) { /* the MTP layer starts at L, the first position with a hidden state */
        s->mbase = L;
        s->mlen = 0;
    }
    s->hpos = L;
    s->hn = m + 1;
    return step_out(s, dr, n, m, last, out);
}

int sil_spec_set_width(struct sil_spec *s, int32_t width, struct sil_error *err)
{
    if (width == 1) {
        s->width = 1;
        return 0;
    }
    if (s->mtp || s->oracle || !sil_engine_has_tree(s->target))
        return sil_errorf(err, -ENOTSUP,
                          "spec: token trees (width %d) need a draft model and a target on the "
                          "CPU backend (%s on %s%s)",
                          width, sil_engine_info(s->target)->arch_name,
                          sil_engine_info(s->target)->backend,
                          s->mtp ? ", MTP drafting" : s->oracle ? ", the oracle drafting" : "");
    const int64_t rows = 1 + (int64_t)width * s->depth;
    if (width < 1 || rows > SIL_SPEC_TREE_ROWS || rows > sil_engine_n_batch_max(s->target))
        return sil_errorf(err, -EINVAL, "spec: a tree of %dx%d has %lld rows (at most %d)", width,
                          s->depth, (long long)rows, SIL_SPEC_TREE_ROWS);
    const size_t n = (size_t)rows, nv = (size_t)sil_engine_info(s->target)->n_vocab;
    if ((int32_t)n > s->n_rows_max) {
        int32_t *tok = realloc(s->tok, sizeof(int32_t) * n);
        if (tok) s->tok = tok;
        int32_t *pos = realloc(s->pos, sizeof(int32_t) * n);
        if (pos) s->pos = pos;
        int32_t *seq = realloc(s->seq, sizeof(int32_t) * n);
        if (seq) s->seq = seq;
        int32_t *am = realloc(s->am, sizeof(int32_t) * n);
        if (am) s->am = am;
        bool *want = realloc(s->want, sizeof(bool) * n);
        if (want) s->want = want;
        if (!tok || !pos || !seq || !am || !want)
            return sil_errorf(err, -ENOMEM, "spec: out of memory");
        s->n_rows_max = (int32_t)n;
    }
    free(s->par);
    free(s->tt);
    free(s->keep);
    free(s->dlg);
    s->par = malloc(sizeof(int32_t) * n);
    s->tt = malloc(sizeof(int32_t) * n);
    s->keep = malloc(sizeof(int32_t) * ((size_t)s->depth + 1));
    s->dlg = malloc(sizeof(float) * nv);
    if (!s->par || !s->tt || !s->keep || !s->dlg)
        return sil_errorf(err, -ENOMEM, "spec: out of memory");
    s->width = width;
    return 0;
}

/* The w most likely tokens of lg[n] (ties to the lower id), most likely first. */
static void top_tokens(const float *lg, int32_t n, int32_t w, int32_t *out)
{
    for (int32_t k = 0; k < w; k++) {
        int32_t best = -1;
        for (int32_t v = 0; v < n; v++) {
            bool taken = false;
            for (int32_t q = 0; q < k && !taken; q++)
                taken = out[q] == v;
            if (!taken && (best < 0 || lg[v] > lg[best])) best = v;
        }
        out[k] = best;
    }
}

/* The draft's tree tt[j * n + i] (branch j, depth i): catch up on hist, evaluate its last
 * token (kept: it is history), take its w most likely next tokens, and below each the draft's
 * greedy chain of n - 1, each in a verification window taken back after it. */
static int draft_tree(struct sil_spec *s, const int32_t *hist, int32_t n_hist, int32_t w,
                      int32_t n, struct sil_error *err)
{
    struct sil_engine *e = s->draft;
    int rc = draft_catch_up(s, hist, n_hist, err);
    if (rc < 0) return rc;
    rc = eval_row_logits(s, e, s->dseq, hist[n_hist - 1], n_hist - 1, s->dlg, err);
    if (rc < 0) return rc;
    int32_t first[SIL_SPEC_TREE_ROWS];
    top_tokens(s->dlg, sil_engine_info(e)->n_vocab, w, first);
    for (int32_t j = 0; j < w; j++) {
        int32_t *br = s->tt + (size_t)j * (size_t)n;
        br[0] = first[j];
        if (n == 1) continue;
        rc = sil_seq_spec_begin(e, s->dseq, err);
        for (int32_t i = 1; i < n && rc == 0; i++)
            rc = eval_rows(s, e, s->dseq, &br[i - 1], 1, n_hist + i - 1, false, &br[i], err);
        struct sil_error ignored = {0};
        const int crc = sil_seq_spec_commit(e, s->dseq, n_hist, rc < 0 ? &ignored : err);
        if (rc == 0) rc = crc;
        if (rc < 0) return rc;
    }
    return 0;
}

/* A greedy step verifying the draft's tree of w x n (w > 1). */
static int tree_step(struct sil_spec *s, const int32_t *hist, int32_t n_hist, int32_t w,
                     int32_t n, int32_t *out, struct sil_error *err)
{
    struct sil_engine *t = s->target;
    const double t0 = sil_now_s();
    int rc = draft_tree(s, hist, n_hist, w, n, err);
    if (rc < 0) return rc;
    const double t1 = sil_now_s();
    s->stats.draft_s += t1 - t0;

    /* the root (the last token), then each branch's nodes one after another */
    const int32_t rows = 1 + w * n, L = n_hist - 1;
    s->tok[0] = hist[L];
    s->par[0] = -1;
    for (int32_t j = 0; j < w; j++)
        for (int32_t i = 0; i < n; i++) {
            const int32_t r = 1 + j * n + i;
            s->tok[r] = s->tt[j * n + i];
            s->par[r] = i == 0 ? 0 : r - 1;
        }
    set_rows(s, s->tseq, rows, L, true);
    struct sil_engine_stats at;
    moe_mark(s, &at);
    rc = sil_seq_spec_begin(t, s->tseq, err);
    if (rc == 0) {
        const struct sil_batch b = {rows, s->tok, s->pos, s->seq, s->want};
        rc = sil_engine_eval_tree(t, &b, s->par, NULL, s->am, err);
    }
    moe_count(s, &at);
    const double t2 = sil_now_s();
    s->stats.verify_s += t2 - t1;
    if (rc < 0) {
        struct sil_error ignored = {0};
        sil_seq_spec_commit(t, s->tseq, L, &ignored);
        return rc;
    }
    /* the branch that starts with the target's choice after the root (the first level's
     * tokens differ), followed while its drafts are the target's choices */
    int32_t m = 0, r = 0, jb = -1;
    for (int32_t j = 0; j < w && jb < 0; j++)
        if (s->tt[j * n] == s->am[0]) jb = j;
    s->keep[0] = 0;
    if (jb >= 0) {
        r = 1 + jb * n;
        s->keep[++m] = r;
        while (m < n && s->tt[jb * n + m] == s->am[r]) {
            r++;
            s->keep[++m] = r;
        }
    }
    const int32_t last = s->am[r];
    rc = sil_seq_spec_commit_path(t, s->tseq, s->keep, m + 1, err);
    s->stats.commit_s += sil_now_s() - t2;
    if (rc < 0) return rc;
    for (int32_t i = 0; i < m; i++)
        out[i] = s->tt[jb * n + i];
    out[m] = last;
    s->stats.steps++;
    s->stats.drafted += (uint64_t)(w * n);
    s->stats.accepted += (uint64_t)m;
    s->stats.emitted += (uint64_t)m + 1;
    return m + 1;
}

int sil_spec_step(struct sil_spec *s, const int32_t *hist, int32_t n_hist, int32_t max_out,
                  int32_t *out, struct sil_error *err)
{
    if (!s->target || !hist || !out || n_hist < 1 || max_out < 1)
        return sil_errorf(err, -EINVAL, "spec: a step needs tokens and room for one out");
    if (s->mtp) return mtp_step(s, hist, n_hist, max_out, NULL, NULL, out, err);
    struct sil_engine *t = s->target;
    const int32_t n = chain_drafts(s, n_hist, max_out, err);
    if (n < 0) return n;
    /* a tree: its nodes take positions up to n_hist - 1 + w * n of the target's context */
    int32_t w = s->width;
    while (w > 1 && n > 0 && (int64_t)n_hist - 1 + (int64_t)w * n >= sil_engine_n_ctx(t))
        w--;
    if (w > 1 && n > 0) return tree_step(s, hist, n_hist, w, n, out, err);

    double t0 = sil_now_s();
    int32_t *dr = s->dtok;
    if (n > 0 && s->oracle) {
        oracle_chain(s, n_hist, n, dr);
    } else if (n > 0) {
        int rc = draft_chain(s, hist, n_hist, n, dr, err);
        if (rc < 0) return rc;
    }
    const double t1 = sil_now_s();
    s->stats.draft_s += t1 - t0;

    /* the verify pass: the last token and the drafts, the target's greedy pick after each */
    struct sil_engine_stats at;
    moe_mark(s, &at);
    int rc = sil_seq_spec_begin(t, s->tseq, err);
    if (rc == 0) {
        s->tok[0] = hist[n_hist - 1];
        memcpy(s->tok + 1, dr, sizeof(int32_t) * (size_t)n);
        rc = eval_rows(s, t, s->tseq, s->tok, n + 1, n_hist - 1, true, s->am, err);
    }
    moe_count(s, &at);
    const double t2 = sil_now_s();
    s->stats.verify_s += t2 - t1;
    int32_t m = 0;
    while (rc == 0 && m < n && dr[m] == s->am[m])
        m++;
    rc = chain_commit(s, rc, n_hist, n, m, err);
    s->stats.commit_s += sil_now_s() - t2;
    if (rc < 0) return rc;
    return step_out(s, dr, n, m, s->am[m], out);
}

/* The draft's sampled proposals d[0, n) and their distributions q[i]: as draft_chain, each row
 * with its logits, each draft drawn from the distribution dsmp makes of them (the history being
 * hbuf: hist, then the drafts so far). */
static int draft_chain_sampled(struct sil_spec *s, const int32_t *hist, int32_t n_hist, int32_t n,
                               struct sil_sampler *dsmp, int32_t *d, struct sil_error *err)
{
    struct sil_engine *e = s->draft;
    const size_t nv = (size_t)sil_engine_info(e)->n_vocab;
    int rc = draft_catch_up(s, hist, n_hist, err);
    if (rc < 0) return rc;
    rc = sil_seq_spec_begin(e, s->dseq, err);
    if (rc < 0) return rc;
    for (int32_t i = 0; i < n && rc == 0; i++) {
        float *q = s->q + (size_t)i * nv;
        rc = eval_row_logits(s, e, s->dseq, i == 0 ? hist[n_hist - 1] : d[i - 1], n_hist - 1 + i,
                             s->scratch, err);
        if (rc == 0) {
            sil_sampler_probs(dsmp, s->scratch, s->hbuf, (size_t)(n_hist + i), q);
            d[i] = sil_sampler_draw(dsmp, q);
            s->hbuf[n_hist + i] = d[i];
        }
    }
    if (rc < 0) {
        struct sil_error ignored = {0};
        sil_seq_spec_commit(e, s->dseq, n_hist - 1, &ignored);
    }
    return rc;
}

int sil_spec_step_sampled(struct sil_spec *s, const int32_t *hist, int32_t n_hist, int32_t max_out,
                          struct sil_sampler *tsmp, struct sil_sampler *dsmp, int32_t *out,
                          struct sil_error *err)
{
    if (!s->target || !hist || !out || !tsmp || !dsmp || n_hist < 1 || max_out < 1)
        return sil_errorf(err, -EINVAL, "spec: a step needs tokens, samplers and room for one out");
    int rc = sampled_buffers(s, n_hist, err);
    if (rc < 0) return rc;
    if (s->mtp) return mtp_step(s, hist, n_hist, max_out, tsmp, dsmp, out, err);
    if (s->oracle)
        return sil_errorf(err, -ENOTSUP, "spec: the oracle drafts greedy steps only");
    struct sil_engine *t = s->target;
    const int32_t n = chain_drafts(s, n_hist, max_out, err);
    if (n < 0) return n;
    memcpy(s->hbuf, hist, sizeof(int32_t) * (size_t)n_hist);

    double t0 = sil_now_s();
    int32_t *dr = s->dtok;
    if (n > 0) {
        rc = draft_chain_sampled(s, hist, n_hist, n, dsmp, dr, err);
        if (rc < 0) return rc;
    }
    const double t1 = sil_now_s();
    s->stats.draft_s += t1 - t0;

    /* the verify pass: the last token and the drafts, with the logits of every row */
    struct sil_engine_stats at;
    moe_mark(s, &at);
    rc = sil_seq_spec_begin(t, s->tseq, err);
    if (rc == 0) {
        s->tok[0] = hist[n_hist - 1];
        memcpy(s->tok + 1, dr, sizeof(int32_t) * (size_t)n);
        set_rows(s, s->tseq, n + 1, n_hist - 1, true);
        const struct sil_batch b = {n + 1, s->tok, s->pos, s->seq, s->want};
        rc = sil_engine_eval_out(t, &b, s->lg, NULL, NULL, err);
    }
    moe_count(s, &at);
    const double t2 = sil_now_s();
    s->stats.verify_s += t2 - t1;
    int32_t m = 0, last = 0;
    if (rc == 0) last = accept_drafts(s, tsmp, n_hist, n, dr, &m);
    rc = chain_commit(s, rc, n_hist, n, m, err);
    s->stats.commit_s += sil_now_s() - t2;
    if (rc < 0) return rc;
    return step_out(s, dr, n, m, last, out);
}
