/* Scheduler policy (daemon/schedpolicy.h): ordering by class, level and arrival; aging lifts a
 * waiting request past newer, higher classes (no starvation); the prefill budget and its split
 * by priority; the preemption victim. No engine: requests are small structs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>

#include <cmocka.h>

#include "daemon/schedpolicy.h"

static const struct sil_sched_params P = {.aging_s = 30};

static struct sil_sched_item item(int cls, int level, double t_submit, uint64_t arrival)
{
    return (struct sil_sched_item){
        .cls = cls, .level = level, .t_submit = t_submit, .arrival = arrival, .preemptible = true};
}

static void order_class_level_arrival(void **state)
{
    (void)state;
    struct sil_sched_item it[] = {
        item(2, 0, 10, 0),   /* batch */
        item(1, 5, 10, 1),   /* normal, level 5 */
        item(0, 0, 10, 2),   /* interactive */
        item(1, -5, 10, 3),  /* normal, level -5: before level 5 */
        item(1, 5, 10, 4),   /* same as 1, later arrival */
        item(0, 100, 10, 5), /* the worst interactive still beats the best normal */
        item(1, -100, 10, 6),
    };
    int idx[7];
    sil_sched_order(&P, it, 7, 10, idx);
    const int want[] = {2, 5, 6, 3, 1, 4, 0};
    for (int i = 0; i < 7; i++)
        assert_int_equal(idx[i], want[i]);
}

static void aging_lifts_a_waiting_request(void **state)
{
    (void)state;
    /* A batch request submitted at t=0 against fresh interactive ones submitted at now. */
    struct sil_sched_item it[2] = {item(2, 0, 0, 0), item(0, 0, 0, 1)};
    int idx[2];
    double now = 50;
    it[1].t_submit = now;
    sil_sched_order(&P, it, 2, now, idx);
    assert_int_equal(idx[0], 1); /* 50 s < 2 classes x 30 s: interactive first */
    now = 61;
    it[1].t_submit = now;
    sil_sched_order(&P, it, 2, now, idx);
    assert_int_equal(idx[0], 0); /* waited more than 60 s: the batch request goes first */
    /* Score is linear in the wait: one aging period is worth one class. */
    struct sil_sched_item n = item(1, 0, 100, 2), b = item(2, 0, 70, 3);
    assert_true(sil_sched_score(&P, &b, 100) - sil_sched_score(&P, &n, 100) < 1e-9);
    assert_true(sil_sched_score(&P, &b, 100) - sil_sched_score(&P, &n, 100) > -1e-9);
}

/* A simulated server under a steady load: one slot, a backlog of interactive requests, a new
 * one every step (as many as it serves), one batch request of the worst level. Each step the
 * most urgent runs and finishes. Interactive requests go first until the batch one has waited
 * 2 classes + its level range of aging (83.4 s); then it runs, not never. */
static void no_starvation(void **state)
{
    (void)state;
    struct sil_sched_item q[64];
    int n = 0;
    uint64_t arrival = 0;
    q[n++] = item(2, SIL_PRIO_LEVEL_MAX, 0, arrival++);
    for (int i = 0; i < 10; i++)
        q[n++] = item(0, SIL_PRIO_LEVEL_MIN, 0, arrival++);
    double dt = 1.0; /* seconds per step */
    int batch_ran_at = -1;
    for (int stepno = 0; stepno < 1000 && batch_ran_at < 0; stepno++) {
        double now = stepno * dt;
        q[n++] = item(0, SIL_PRIO_LEVEL_MIN, now, arrival++);
        int idx[64];
        sil_sched_order(&P, q, n, now, idx);
        if (q[idx[0]].cls == 2) batch_ran_at = stepno;
        q[idx[0]] = q[--n];
    }
    double wait =
        P.aging_s * (2 + (double)(SIL_PRIO_LEVEL_MAX - SIL_PRIO_LEVEL_MIN) / SIL_PRIO_LEVEL_SPAN);
    assert_true(batch_ran_at >= (int)wait - 1);  /* the classes did count for that long */
    assert_true(batch_ran_at <= (int)wait + 11); /* and then the backlog ahead of it, no more */
}

static void prefill_budget(void **state)
{
    (void)state;
    assert_int_equal(sil_sched_prefill_budget(0, 32, 256, 1000), 256);  /* nothing decodes */
    assert_int_equal(sil_sched_prefill_budget(3, 32, 256, 1000), 32);   /* streams decode */
    assert_int_equal(sil_sched_prefill_budget(3, 512, 256, 1000), 256); /* never above the chunk */
    assert_int_equal(sil_sched_prefill_budget(3, 32, 256, 20), 20);     /* rows left */
    assert_int_equal(sil_sched_prefill_budget(0, 32, 256, 0), 0);
}

/* A simulated engine: a step of n_dec decode rows and n prompt rows takes dec + f(n) seconds.
 * Runs 200 mixed steps with the budget the policy gives; returns the last budget and counts
 * the steps (of the last 100) that went over stretch x dec. */
static int32_t run_engine(double dec, double (*f)(int32_t), int stretch, int32_t cap, int *over)
{
    struct sil_sched_cost c = { 0 };
    sil_sched_cost_update(&c, 4, 0, dec, stretch, cap);
    int32_t b = 0;
    *over = 0;
    for (int i = 0; i < 200; i++) {
        b = sil_sched_prefill_timed(&c, stretch, cap);
        double t = dec + f(b);
        if (i >= 100 && t > stretch * dec * 1.0001)
            (*over)++;
        sil_sched_cost_update(&c, 4, b, t, stretch, cap);
    }
    return b;
}

/* The same with a machine that is not quiet: every 16th step takes 1.6x (another process, a
 * page fault). Over the last 100 steps that are not spikes: the mean budget and the steps over
 * stretch x dec. */
static double run_engine_noisy(double dec, double (*f)(int32_t), int stretch, int32_t cap,
                               int steps, int *over)
{
    struct sil_sched_cost c = { 0 };
    sil_sched_cost_update(&c, 4, 0, dec, stretch, cap);
    double sum = 0;
    int n = 0;
    *over = 0;
    for (int i = 0; i < steps; i++) {
        int32_t b = sil_sched_prefill_timed(&c, stretch, cap);
        const bool spike = i % 16 == 15;
        double t = (dec + f(b)) * (spike ? 1.6 : 1.0);
        if (i >= steps - 100 && !spike) {
            sum += b;
            n++;
            if (t > stretch * dec * 1.0001)
                (*over)++;
        }
        sil_sched_cost_update(&c, 4, b, t, stretch, cap);
    }
    return sum / n;
}

static double linear_cpu(int32_t n) { return 0.007 * n; }          /* dense: 7 ms a row */
static double moe_cpu(int32_t n) { return 0.020 * sqrt((double)n); } /* expert union ~ sqrt */
static double gpu(int32_t n) { return 0.00005 * n; }                 /* 0.05 ms a row */
/* MoE on many cores: 4.2 ms decode, the first prompt rows cost the most (2.5 ms x cbrt(rows)),
 * so 4 rows fit stretch 2 (3.97 ms) and 5 do not (4.27). */
static double moe_cpu16(int32_t n) { return 0.0025 * cbrt((double)n); }

/* The budget by time keeps a mixed step within stretch x a decode step once it has learnt. */
static void prefill_by_time(void **state)
{
    (void)state;
    struct sil_sched_cost c = { 0 };
    assert_int_equal(sil_sched_prefill_timed(&c, 2, 64), 64); /* nothing known: the cap */
    sil_sched_cost_update(&c, 0, 256, 1.0, 2, 64);            /* prefill only: says nothing */
    sil_sched_cost_update(&c, 4, 10, 1.0, 2, 64); /* mixed before any decode-only step */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, 64), 64);
    sil_sched_cost_update(&c, 4, 0, 0.013, 2, 64); /* a decode step of 13 ms */
    assert_true(c.t_decode > 0.0129 && c.t_decode < 0.0131);
    /* 64 rows took 13 + 448 ms: the 13 ms the prompt may take fit 1.86 rows at that cost. */
    sil_sched_cost_update(&c, 4, 64, 0.013 + 64 * 0.007, 2, 64);
    assert_int_equal(sil_sched_prefill_timed(&c, 2, 64), 1);
    sil_sched_cost_update(&c, 4, 1, 0.013 + 0.001, 2, 64); /* 1 row, 1 ms: room for 2 */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, 64), 2);
    sil_sched_cost_update(&c, 4, 1, 0.013 + 0.001, 2, 64); /* fewer rows than the budget: */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, 64), 2); /* says nothing of more */
    assert_int_equal(sil_sched_prefill_timed(&c, 0, 64), 64); /* stretch 0: no limit by time */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, 0), 0);   /* no room: none */

    int over;
    /* Dense CPU, 13 ms decode, 7 ms a row: stretch 2 leaves 13 ms, 1 row; stretch 4, 39 ms: 5. */
    assert_int_equal(run_engine(0.013, linear_cpu, 2, 64, &over), 1);
    assert_int_equal(over, 0);
    assert_int_equal(run_engine(0.013, linear_cpu, 4, 64, &over), 5);
    assert_int_equal(over, 0);
    /* MoE CPU, 35 ms decode, 20 ms x sqrt(rows): stretch 2 leaves 35 ms, 3 rows. */
    assert_int_equal(run_engine(0.035, moe_cpu, 2, 64, &over), 3);
    assert_int_equal(over, 0);
    /* The time budget protects streams from prompts of their class or lower, not from more
     * urgent ones: an interactive prompt next to batch streams gets the whole cap. */
    struct sil_sched_cost one = { .t_decode = 0.013, .budget = 1 };
    one.t_dec[1] = 0.013;
    assert_int_equal(sil_sched_prefill_cap(&one, 2, 64, 2, 0, 1), 64);
    assert_int_equal(sil_sched_prefill_cap(&one, 2, 64, 1, 1, 1), 1);
    assert_int_equal(sil_sched_prefill_cap(&one, 2, 64, 0, 2, 1), 1);
    /* A machine's own spikes do not hold a concave (MoE) prompt to one row a step: the budget
     * stays at the 4 rows that fit (the median of the last three such steps), and 5, over twice,
     * are tried again only every SIL_SCHED_REPROBE steps. */
    assert_true(run_engine_noisy(0.0042, moe_cpu16, 2, 256, 300, &over) > 3.5);
    assert_true(over <= 2);
    assert_true(run_engine_noisy(0.0042, moe_cpu16, 2, 256, 2000, &over) > 3.5);
    assert_true(over <= 2);
    /* Dense rows with spikes: 1 row fits, never 2 for long. */
    assert_true(run_engine_noisy(0.013, linear_cpu, 2, 64, 2000, &over) == 1.0);
    assert_true(over <= 2);
    /* GPU: rows are cheap next to the decode step: the cap. */
    assert_int_equal(run_engine(0.005, gpu, 2, 64, &over), 64);
    assert_int_equal(over, 0);
}

/* The cost of each number of prompt rows is what its last steps took: a pause in one step is
 * not held against that number, a number over twice is not tried again until it is forgotten,
 * and a step over goes back to the most rows known to fit. */
static void prefill_estimates(void **state)
{
    (void)state;
    struct sil_sched_cost c = { 0 };
    const int32_t cap = 64;
    c.steps = UINT32_MAX - 300; /* a daemon up for long: the step count wraps on the way */
    sil_sched_cost_update(&c, 1, 0, 0.010, 2, cap); /* decode 10 ms: the target is 20 */
    c.budget = 4;
    sil_sched_cost_update(&c, 1, 4, 0.015, 2, cap); /* 4 rows fit: try 5 */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 5);
    sil_sched_cost_update(&c, 1, 5, 0.025, 2, cap); /* over: back to the 4 known to fit */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 4);
    sil_sched_cost_update(&c, 1, 4, 0.015, 2, cap); /* once over may have been a pause: again */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 5);
    sil_sched_cost_update(&c, 1, 5, 0.018, 2, cap); /* it was: 5 fit, try 6 */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 6);
    sil_sched_cost_update(&c, 1, 6, 0.022, 2, cap); /* 6 over */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 5);
    sil_sched_cost_update(&c, 1, 5, 0.019, 2, cap); /* 5: the median of 25, 18, 19 fits */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 6);
    sil_sched_cost_update(&c, 1, 6, 0.023, 2, cap); /* 6 over twice: not tried again */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 5);
    sil_sched_cost_update(&c, 1, 5, 0.031, 2, cap); /* a pause at 5: median 19, no change */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 5);
    for (int i = 0; i < SIL_SCHED_REPROBE - 2; i++) {
        sil_sched_cost_update(&c, 1, 5, 0.019, 2, cap);
        assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 5);
    }
    sil_sched_cost_update(&c, 1, 5, 0.019, 2, cap); /* 6 forgotten: tried again */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 6);
    sil_sched_cost_update(&c, 1, 6, 0.019, 2, cap); /* and now it fits (a shorter context) */
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 7);
    sil_sched_cost_update(&c, 1, 7, 0.025, 2, cap); /* 7 over twice: held at 6 */
    sil_sched_cost_update(&c, 1, 6, 0.019, 2, cap);
    sil_sched_cost_update(&c, 1, 7, 0.025, 2, cap);
    sil_sched_cost_update(&c, 1, 6, 0.019, 2, cap);
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 6);
    /* a second stream: the estimates stand (a step over would say so) */
    sil_sched_cost_update(&c, 2, 6, 0.019, 2, cap);
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 6);
    /* it ends: the estimates were of steps with more decode rows, and 7 may be tried */
    sil_sched_cost_update(&c, 1, 6, 0.017, 2, cap);
    assert_int_equal(sil_sched_prefill_timed(&c, 2, cap), 7);
}

/* The target is stretch times a decode-only step of the streams there are: when more streams
 * decode than any timed step had, one step goes without prompt rows and is timed, and mixed
 * steps are judged against it, not against what fewer streams cost. */
static void prefill_target_follows_streams(void **state)
{
    (void)state;
    struct sil_sched_cost c = { 0 };
    const int32_t cap = 64;
    assert_int_equal(sil_sched_prefill_cap(&c, 2, cap, 1, 1, 1), cap); /* nothing known */
    sil_sched_cost_update(&c, 1, 0, 0.010, 2, cap); /* one stream: 10 ms */
    c.budget = 4;
    sil_sched_cost_update(&c, 1, 4, 0.018, 2, cap); /* 4 rows next to it fit 20 ms */
    assert_int_equal(sil_sched_prefill_cap(&c, 2, cap, 1, 1, 1), 5);
    /* seven streams joined while the prompt was evaluated: a step of their own first */
    assert_int_equal(sil_sched_prefill_cap(&c, 2, cap, 1, 1, 8), 0);
    sil_sched_cost_update(&c, 8, 5, 0.031, 2, cap); /* a mixed step, no target: learns nothing */
    assert_int_equal(sil_sched_prefill_cap(&c, 2, cap, 1, 1, 8), 0);
    sil_sched_cost_update(&c, 8, 0, 0.025, 2, cap); /* 8 streams take 25 ms: the target is 50 */
    assert_true(c.t_decode > 0.0249 && c.t_decode < 0.0251);
    assert_int_equal(sil_sched_prefill_cap(&c, 2, cap, 1, 1, 8), 5);
    sil_sched_cost_update(&c, 8, 5, 0.031, 2, cap); /* within 50 ms: more */
    assert_int_equal(sil_sched_prefill_cap(&c, 2, cap, 1, 1, 8), 6);
    /* back to one stream: its own time is known, no step without prompt rows */
    assert_int_equal(sil_sched_prefill_cap(&c, 2, cap, 1, 1, 1), 6);
    sil_sched_cost_update(&c, 1, 6, 0.022, 2, cap); /* over its 20 ms */
    assert_true(c.t_decode > 0.0099 && c.t_decode < 0.0101);
    assert_true(sil_sched_prefill_cap(&c, 2, cap, 1, 1, 1) < 6);
    /* past SIL_SCHED_EST decode rows the times share the last entry */
    sil_sched_cost_update(&c, SIL_SCHED_EST + 10, 0, 0.2, 2, cap);
    assert_int_equal(sil_sched_prefill_cap(&c, 2, cap, 1, 1, SIL_SCHED_EST),
                     sil_sched_prefill_timed(&c, 2, cap));
    assert_int_equal(sil_sched_prefill_cap(&c, 0, cap, 1, 1, 3), cap); /* stretch 0: no timing */
}

static void split_by_priority(void **state)
{
    (void)state;
    struct sil_sched_item it[] = {item(2, 0, 0, 0), item(0, 0, 0, 1), item(1, 0, 0, 2)};
    it[0].want = 500; /* a long batch prompt */
    it[1].want = 20;  /* a short interactive one */
    it[2].want = 40;
    int idx[3];
    int32_t take[3];
    sil_sched_order(&P, it, 3, 0, idx);
    assert_int_equal(sil_sched_split(it, idx, 3, 64, take), 64);
    assert_int_equal(take[1], 20);
    assert_int_equal(take[2], 40);
    assert_int_equal(take[0], 4);
    assert_int_equal(sil_sched_split(it, idx, 3, 10, take), 10);
    assert_int_equal(take[1], 10);
    assert_int_equal(take[2], 0);
    assert_int_equal(take[0], 0);
    assert_int_equal(sil_sched_split(it, idx, 3, 1000, take), 560); /* all they want, no more */
}

static void victim_choice(void **state)
{
    (void)state;
    struct sil_sched_item run[] = {
        item(1, 0, 10, 0),
        item(2, 0, 10, 1),
        item(2, 0, 10, 2),
        item(0, 0, 10, 3),
    };
    struct sil_sched_item cand = item(0, 0, 10, 4);
    /* The least urgent: batch, and of two equal batch ones the later arrival (less work lost). */
    assert_int_equal(sil_sched_victim(&P, run, 4, &cand, 10), 2);
    run[2].preemptible = false; /* e.g. a session's request */
    assert_int_equal(sil_sched_victim(&P, run, 4, &cand, 10), 1);
    /* A normal candidate never preempts its own class or a higher one. */
    struct sil_sched_item normal = item(1, -100, 10, 5);
    run[1].preemptible = false;
    assert_int_equal(sil_sched_victim(&P, run, 4, &normal, 10), -1);
    run[1].preemptible = true;
    assert_int_equal(sil_sched_victim(&P, run, 4, &normal, 10), 1);
    /* A batch request that has aged past the candidate's score is not preempted: the normal one
     * (fresh) goes instead, and with that one out of reach, none. */
    run[1].t_submit = 10 - 70; /* waited 70 s: scores below a fresh interactive request */
    assert_int_equal(sil_sched_victim(&P, run, 4, &cand, 10), 0);
    run[0].preemptible = false;
    assert_int_equal(sil_sched_victim(&P, run, 4, &cand, 10), -1);
    run[0].preemptible = true;
    /* Out of space (no candidate): any preemptible one, the least urgent, even interactive. */
    assert_int_equal(sil_sched_victim(&P, run, 4, NULL, 10), 0);
    struct sil_sched_item only[] = {item(0, 0, 10, 0)};
    assert_int_equal(sil_sched_victim(&P, only, 1, NULL, 10), 0);
    only[0].preemptible = false;
    assert_int_equal(sil_sched_victim(&P, only, 1, NULL, 10), -1);
}

/* An item of user uid and client (connection) c. */
static struct sil_sched_item owned(int cls, double t_submit, uint64_t arrival, uint32_t uid,
                                   uint64_t c)
{
    struct sil_sched_item it = item(cls, 0, t_submit, arrival);
    it.uid = uid;
    it.client = c;
    return it;
}

/* Fair shares: a client holding every slot of a class gives one up to another client of that
 * class (or user), never so that the one preempted could take it back; admission and the
 * prefill order go to the user, then the client, holding fewer. */
static void fair_shares(void **state)
{
    (void)state;
    /* user 1's client 10 holds four slots of normal class, client 11 of user 2 waits */
    struct sil_sched_item run[] = {
        owned(1, 0, 0, 1, 10), owned(1, 0, 1, 1, 10), owned(1, 0, 2, 1, 10), owned(1, 0, 3, 1, 10),
    };
    struct sil_sched_item cand = owned(1, 5, 9, 2, 11);
    assert_int_equal(sil_sched_victim(&P, run, 4, &cand, 10), -1); /* no lower class */
    /* the least urgent of client 10's: the latest arrival */
    assert_int_equal(sil_sched_fair_victim(&P, run, 4, &cand, 10), 3);
    run[3].preemptible = false;
    assert_int_equal(sil_sched_fair_victim(&P, run, 4, &cand, 10), 2);
    run[3].preemptible = true;
    /* 3 + 1: the one preempted (2 against 1 then) does not qualify */
    run[3] = owned(1, 5, 9, 2, 11);
    struct sil_sched_item back = owned(1, 0, 3, 1, 10);
    assert_int_equal(sil_sched_fair_victim(&P, run, 4, &back, 10), -1);
    /* a second request of client 11 takes one more: 2 + 2, then none */
    struct sil_sched_item second = owned(1, 6, 12, 2, 11);
    assert_int_equal(sil_sched_fair_victim(&P, run, 4, &second, 10), 2);
    run[2] = second;
    struct sil_sched_item third = owned(1, 7, 13, 2, 11);
    assert_int_equal(sil_sched_fair_victim(&P, run, 4, &third, 10), -1);
    /* a more urgent class is never a fair victim: interactive ones of client 10 */
    struct sil_sched_item inter[] = {
        owned(0, 0, 0, 1, 10), owned(0, 0, 1, 1, 10), owned(0, 0, 2, 1, 10), owned(0, 0, 3, 1, 10),
    };
    assert_int_equal(sil_sched_fair_victim(&P, inter, 4, &cand, 10), -1);
    /* batch ones are (cand is normal), but sil_sched_victim takes them first */
    struct sil_sched_item batch[] = {
        owned(2, 0, 0, 1, 10), owned(2, 0, 1, 1, 10), owned(2, 0, 2, 1, 10), owned(2, 0, 3, 1, 10),
    };
    assert_int_equal(sil_sched_victim(&P, batch, 4, &cand, 10), 3);
    assert_int_equal(sil_sched_fair_victim(&P, batch, 4, &cand, 10), 3);
    /* one user, two clients: the same between its clients */
    struct sil_sched_item same = owned(1, 5, 9, 1, 12);
    assert_int_equal(sil_sched_fair_victim(&P, run + 0, 2, &same, 10), 1);
    /* ... and never for a request of the client that holds them */
    struct sil_sched_item own = owned(1, 5, 9, 1, 10);
    assert_int_equal(sil_sched_fair_victim(&P, run + 0, 2, &own, 10), -1);
    /* between users first: user 1 holds 3 over two clients, user 2 one; a new client of user 2
     * still counts its user's slot */
    struct sil_sched_item mix[] = {
        owned(1, 0, 0, 1, 10), owned(1, 0, 1, 1, 13), owned(1, 0, 2, 1, 13), owned(1, 0, 3, 2, 11),
    };
    struct sil_sched_item u2 = owned(1, 5, 9, 2, 14);
    assert_int_equal(sil_sched_fair_victim(&P, mix, 4, &u2, 10), 2); /* client 13, latest */
    struct sil_sched_item u1 = owned(1, 5, 9, 1, 15);
    assert_int_equal(sil_sched_fair_victim(&P, mix, 4, &u1, 10), 2); /* within user 1: 13 */

    /* admission: the user holding fewer first, within the band; an older band first */
    struct sil_sched_share s3 = {3, 3}, s1 = {1, 1}, s1b = {1, 0};
    struct sil_sched_item a = owned(1, 0, 0, 1, 10), b = owned(1, 5, 5, 2, 11);
    assert_true(sil_sched_before(&P, &a, &b, 10));
    assert_false(sil_sched_admit_before(&P, &a, &s3, &b, &s1, 10));
    assert_true(sil_sched_admit_before(&P, &b, &s1, &a, &s3, 10));
    assert_true(sil_sched_admit_before(&P, &b, &s1b, &a, &s1, 10)); /* the client then */
    struct sil_sched_item old = owned(1, -40, 0, 1, 10); /* waited 50 s: a band up */
    assert_true(sil_sched_admit_before(&P, &old, &s3, &b, &s1, 10));
    struct sil_sched_item inter1 = owned(0, 9, 9, 1, 10);
    assert_true(sil_sched_admit_before(&P, &inter1, &s3, &b, &s1, 10));

    /* the prefill order: one item per client in turn within a band */
    struct sil_sched_item pre[] = {
        owned(1, 0, 0, 1, 10), owned(1, 0, 1, 1, 10), owned(1, 0, 2, 1, 10), owned(1, 1, 3, 2, 11),
        owned(1, 1, 4, 2, 11), owned(0, 2, 5, 3, 12),
    };
    int idx[6];
    sil_sched_order_fair(&P, pre, 6, 10, idx);
    const int want[6] = {5, 0, 3, 1, 4, 2};
    for (int i = 0; i < 6; i++)
        assert_int_equal(idx[i], want[i]);
    int32_t take[6];
    for (int i = 0; i < 6; i++)
        pre[i].want = 100;
    assert_int_equal(sil_sched_split(pre, idx, 6, 250, take), 250);
    assert_int_equal(take[5], 100);
    assert_int_equal(take[0], 100);
    assert_int_equal(take[3], 50); /* client 11 gets its turn before client 10's second */
    assert_int_equal(take[1], 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(order_class_level_arrival),
        cmocka_unit_test(aging_lifts_a_waiting_request),
        cmocka_unit_test(no_starvation),
        cmocka_unit_test(prefill_budget),
        cmocka_unit_test(prefill_by_time),           cmocka_unit_test(prefill_estimates),
        cmocka_unit_test(prefill_target_follows_streams),
        cmocka_unit_test(split_by_priority),
        cmocka_unit_test(victim_choice),
        cmocka_unit_test(fair_shares),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
