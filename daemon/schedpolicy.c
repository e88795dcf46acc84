/* Scheduler policy (schedpolicy.h): scores, order, prefill budget and its split, victims. */
#include "daemon/schedpolicy.h"

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

static double ema(double old, double x) { return old > 0 ? 0.8 * old + 0.2 * x : x; }

void sil_sched_cost_update(struct sil_sched_cost *c, int n_decode, int n_prompt, double seconds,
                           int stretch, int32_t cap)
{
    if (n_decode > 0 && n_prompt == 0) {
        c->t_decode = ema(c->t_decode, seconds);
        return;
    }
    if (n_decode == 0 || stretch <= 0 || c->t_decode <= 0 || cap < 1)
        return;
    int32_t b = c->budget > 0 && c->budget < cap ? c->budget : cap;
    /* The prompt rows' share of the step, scaled linearly: exact for dense rows, cautious for
     * MoE rows (each further one costs less). */
    double target = stretch * c->t_decode, extra = seconds - c->t_decode;
    if (seconds > target) {
        int32_t shrunk = (int32_t)(n_prompt * (target - c->t_decode) / extra);
        b = shrunk < b - 1 ? shrunk : b - 1;
    } else if (n_prompt >= b && n_prompt > 0) {
        int32_t grown = b + (b / 8 > 1 ? b / 8 : 1);
        if (c->t_decode + (extra > 0 ? extra : 0) * grown / n_prompt <= target)
            b = grown;
    }
    c->budget = b < 1 ? 1 : b > cap ? cap : b;
}

int32_t sil_sched_prefill_timed(const struct sil_sched_cost *c, int stretch, int32_t cap)
{
    if (cap < 1 || stretch <= 0 || c->t_decode <= 0 || c->budget <= 0)
        return cap;
    return c->budget < cap ? c->budget : cap;
}

int32_t sil_sched_prefill_cap(const struct sil_sched_cost *c, int stretch, int32_t cap,
                              int decode_cls, int prompt_cls)
{
    return prompt_cls < decode_cls ? cap : sil_sched_prefill_timed(c, stretch, cap);
}
