/* Scheduler policy (schedpolicy.h): scores, order, prefill budget and its split, victims. */
#include "daemon/schedpolicy.h"

#include <math.h>
#include <string.h>

double sil_sched_score(const struct sil_sched_params *p, const struct sil_sched_item *it,
                       double now)
{
    double level = (double)(it->level - SIL_PRIO_LEVEL_MIN) / SIL_PRIO_LEVEL_SPAN;
    double waited = now > it->t_submit ? now - it->t_submit : 0;
    return p->aging_s * (it->cls + level) - waited;
}

bool sil_sched_before(const struct sil_sched_params *p, const struct sil_sched_item *a,
                   const struct sil_sched_item *b, double now)
{
    double sa = sil_sched_score(p, a, now), sb = sil_sched_score(p, b, now);
    if (sa != sb) return sa < sb;
    return a->arrival < b->arrival;
}

void sil_sched_order(const struct sil_sched_params *p, const struct sil_sched_item *it, int n,
                     double now, int *idx)
{
    /* Insertion sort: n is at most max_running or the queue, and mostly already in order. */
    for (int i = 0; i < n; i++) {
        int k = i;
        while (k > 0 && sil_sched_before(p, &it[i], &it[idx[k - 1]], now)) {
            idx[k] = idx[k - 1];
            k--;
        }
        idx[k] = i;
    }
}

int32_t sil_sched_prefill_budget(int n_decoding, int32_t prefill_budget, int32_t prefill_chunk,
                                 int32_t room)
{
    int32_t b = n_decoding > 0 ? prefill_budget : prefill_chunk;
    if (b > prefill_chunk) b = prefill_chunk;
    if (b > room) b = room;
    return b > 0 ? b : 0;
}

int32_t sil_sched_split(const struct sil_sched_item *it, const int *idx, int n, int32_t budget,
                        int32_t *take)
{
    int32_t given = 0;
    for (int i = 0; i < n; i++)
        take[i] = 0;
    for (int i = 0; i < n && given < budget; i++) {
        int k = idx[i];
        int32_t t = it[k].want > 0 ? it[k].want : 0;
        if (t > budget - given) t = budget - given;
        take[k] = t;
        given += t;
    }
    return given;
}

int sil_sched_victim(const struct sil_sched_params *p, const struct sil_sched_item *running, int n,
                     const struct sil_sched_item *cand, double now)
{
    int best = -1;
    double cs = cand ? sil_sched_score(p, cand, now) : 0;
    for (int i = 0; i < n; i++) {
        const struct sil_sched_item *r = &running[i];
        if (!r->preemptible) continue;
        if (cand && (r->cls <= cand->cls || sil_sched_score(p, r, now) <= cs)) continue;
        if (best < 0 || sil_sched_before(p, &running[best], r, now))
            best = i; /* r ranks after the best so far: less urgent */
    }
    return best;
}

int sil_sched_band(const struct sil_sched_params *p, const struct sil_sched_item *it, double now)
{
    return (int)floor(sil_sched_score(p, it, now) / p->aging_s);
}

void sil_sched_share(const struct sil_sched_item *running, int n, const struct sil_sched_item *it,
                     struct sil_sched_share *out)
{
    out->user = out->client = 0;
    for (int i = 0; i < n; i++) {
        out->user += running[i].uid == it->uid;
        out->client += running[i].client == it->client;
    }
}

bool sil_sched_admit_before(const struct sil_sched_params *p, const struct sil_sched_item *a,
                            const struct sil_sched_share *sa, const struct sil_sched_item *b,
                            const struct sil_sched_share *sb, double now)
{
    const int ba = sil_sched_band(p, a, now), bb = sil_sched_band(p, b, now);
    if (ba != bb) return ba < bb;
    if (sa->user != sb->user) return sa->user < sb->user;
    if (sa->client != sb->client) return sa->client < sb->client;
    return sil_sched_before(p, a, b, now);
}

void sil_sched_order_fair(const struct sil_sched_params *p, const struct sil_sched_item *it, int n,
                          double now, int *idx)
{
    sil_sched_order(p, it, n, now, idx);
    /* each item's band and turn (how many of its client's come before it in its band), then a
     * stable insertion sort by (band, turn): n is at most max_running */
    int band[n > 0 ? n : 1], turn[n > 0 ? n : 1];
    for (int i = 0; i < n; i++) {
        band[i] = sil_sched_band(p, &it[idx[i]], now);
        turn[i] = 0;
        for (int k = 0; k < i; k++)
            turn[i] += band[k] == band[i] && it[idx[k]].client == it[idx[i]].client;
    }
    for (int i = 1; i < n; i++) {
        const int x = idx[i], b = band[i], t = turn[i];
        int k = i;
        while (k > 0 && (band[k - 1] > b || (band[k - 1] == b && turn[k - 1] > t))) {
            idx[k] = idx[k - 1];
            band[k] = band[k - 1];
            turn[k] = turn[k - 1];
            k--;
        }
        idx[k] = x;
        band[k] = b;
        turn[k] = t;
    }
}

int sil_sched_fair_victim(const struct sil_sched_params *p, const struct sil_sched_item *running,
                          int n, const struct sil_sched_item *cand, double now)
{
    struct sil_sched_share cs;
    sil_sched_share(running, n, cand, &cs);
    int best = -1, best_excess = 0;
    for (int i = 0; i < n; i++) {
        const struct sil_sched_item *r = &running[i];
        if (!r->preemptible || r->cls < cand->cls) continue;
        struct sil_sched_share rs;
        sil_sched_share(running, n, r, &rs);
        int excess;
        if (r->uid != cand->uid)
            excess = rs.user - cs.user;
        else if (r->client != cand->client)
            excess = rs.client - cs.client;
        else
            continue;
        if (excess < 2) continue;
        if (best < 0 || excess > best_excess ||
            (excess == best_excess && sil_sched_before(p, &running[best], r, now))) {
            best = i;
            best_excess = excess;
        }
    }
    return best;
}

static double ema(double old, double x) { return old > 0 ? 0.8 * old + 0.2 * x : x; }

/* What a mixed step of n prompt rows costs by the steps seen (the median of the last three, the
 * less of two: one of two may have been a pause), or -1: unknown, or forgotten. */
static double est_cost(const struct sil_sched_cost *c, int32_t n)
{
    if (n < 1 || n > SIL_SCHED_EST || c->est[n].k == 0 ||
        c->steps - c->est[n].when >= SIL_SCHED_REPROBE)
        return -1;
    const float *t = c->est[n].t;
    if (c->est[n].k == 1)
        return t[0];
    if (c->est[n].k == 2)
        return fminf(t[0], t[1]);
    const float lo = fminf(t[0], fminf(t[1], t[2])), hi = fmaxf(t[0], fmaxf(t[1], t[2]));
    return (double)t[0] + t[1] + t[2] - lo - hi;
}

/* The t_dec slot of n decode rows: those past SIL_SCHED_EST share the last. */
static int dec_slot(int n_decode)
{
    return n_decode < SIL_SCHED_EST ? n_decode : SIL_SCHED_EST;
}

/* A mixed step of n prompt rows took seconds (n <= SIL_SCHED_EST): into its ring, which starts
 * again when what it held was forgotten. */
static void est_add(struct sil_sched_cost *c, int32_t n, double seconds)
{
    if (c->steps - c->est[n].when >= SIL_SCHED_REPROBE)
        c->est[n].k = 0;
    c->est[n].t[c->est[n].k % 3] = (float)seconds;
    if (++c->est[n].k == 6)
        c->est[n].k = 3; /* full: the ring goes on */
    c->est[n].when = c->steps;
}

/* n prompt rows are known to go over target: twice at least (once may be a pause). */
static bool est_over(const struct sil_sched_cost *c, int32_t n, double target)
{
    return est_cost(c, n) > target && c->est[n].k >= 2;
}

void sil_sched_cost_update(struct sil_sched_cost *c, int n_decode, int n_prompt, double seconds,
                           double stretch, int32_t cap)
{
    const int d = dec_slot(n_decode);
    if (n_decode > 0 && n_prompt == 0) {
        c->t_dec[d] = ema(c->t_dec[d], seconds);
        c->t_decode = c->t_dec[d];
        return;
    }
    if (n_decode == 0 || stretch <= 0 || cap < 1)
        return;
    /* Streams went: a number of prompt rows that went over may fit now. (When streams come,
     * a step that goes over says so, and the median follows in two.) */
    if (n_decode < c->n_dec)
        memset(c->est, 0, sizeof c->est);
    c->n_dec = n_decode;
    if (c->t_dec[d] <= 0)
        return; /* no target for these streams yet: sil_sched_prefill_cap has one step timed */
    c->t_decode = c->t_dec[d];
    int32_t b = c->budget > 0 && c->budget < cap ? c->budget : cap;
    c->steps++;
    const bool table = n_prompt <= SIL_SCHED_EST;
    if (table)
        est_add(c, n_prompt, seconds);
    const double target = stretch * c->t_decode;
    const double cost = table ? est_cost(c, n_prompt) : seconds;
    if (cost > target) {
        /* The prompt rows' share of the step, scaled linearly (exact for dense rows; MoE rows
         * cost more each the fewer they are, so a later step may shrink again), or the most
         * rows below known to fit, where that is more. */
        int32_t shrunk = (int32_t)(n_prompt * (target - c->t_decode) / (cost - c->t_decode));
        const int32_t below = n_prompt - 1 < SIL_SCHED_EST ? n_prompt - 1 : SIL_SCHED_EST;
        for (int32_t m = below; m > shrunk; m--) {
            const double e = est_cost(c, m);
            if (e >= 0 && e <= target) {
                shrunk = m;
                break;
            }
        }
        b = shrunk < b - 1 ? shrunk : b - 1;
    } else if (n_prompt >= b && n_prompt > 0) {
        int32_t grown = b + (b / 8 > 1 ? b / 8 : 1);
        if (b >= SIL_SCHED_EST) {
            /* no table: a linear guess from this step must fit */
            const double extra = seconds - c->t_decode;
            if (c->t_decode + (extra > 0 ? extra : 0) * grown / n_prompt > target)
                grown = b;
        } else {
            for (int32_t m = b + 1; m <= grown && m <= SIL_SCHED_EST; m++)
                if (est_over(c, m, target)) {
                    grown = m - 1;
                    break;
                }
        }
        if (grown > b)
            b = grown;
    }
    c->budget = b < 1 ? 1 : b > cap ? cap : b;
}

int32_t sil_sched_prefill_timed(const struct sil_sched_cost *c, double stretch, int32_t cap)
{
    if (cap < 1 || stretch <= 0 || c->t_decode <= 0 || c->budget <= 0)
        return cap;
    return c->budget < cap ? c->budget : cap;
}

int32_t sil_sched_prefill_cap(const struct sil_sched_cost *c, double stretch, int32_t cap,
                              int decode_cls, int prompt_cls, int n_decode)
{
    if (prompt_cls < decode_cls)
        return cap;
    const int d = dec_slot(n_decode);
    if (stretch > 0 && c->t_decode > 0 && d > 0 && c->t_dec[d] <= 0)
        return 0;
    return sil_sched_prefill_timed(c, stretch, cap);
}
