/* Scheduler policy as pure functions over a small array of request descriptions, so ordering,
 * aging, the prefill budget, its split and the choice of a preemption victim are unit-tested
 * without an engine (tests/test_schedpolicy.c). scheduler.c fills the array each step.
 *
 * Effective priority ("score", lower runs first) is measured in seconds of waiting:
 *   score = aging_s * (class + (level - SIL_PRIO_LEVEL_MIN) / SIL_PRIO_LEVEL_SPAN) - waited_s
 * The whole level range spans less than one class, and a request that has waited aging_s
 * seconds longer ranks one class higher: a stream of new interactive requests never starves a
 * batch request. Nothing here allocates or keeps state. */
#ifndef SIL_DAEMON_SCHEDPOLICY_H
#define SIL_DAEMON_SCHEDPOLICY_H

#include <stdbool.h>
#include <stdint.h>

#define SIL_PRIO_LEVEL_MIN (-100)
#define SIL_PRIO_LEVEL_MAX 100
#define SIL_PRIO_LEVEL_SPAN 256 /* > MAX - MIN + 1: a level never reaches the next class */

struct sil_sched_params {
    double aging_s; /* waiting that lifts a request by one class; > 0 */
};

struct sil_sched_item {
    int cls;          /* enum sil_priority: 0 interactive, 1 normal, 2 batch */
    int level;        /* within the class, SIL_PRIO_LEVEL_MIN..MAX, lower first */
    double t_submit;  /* seconds, the clock of now */
    uint64_t arrival; /* order of arrival: breaks ties */
    int32_t want;     /* sil_sched_split: prompt tokens it could take this step */
    bool preemptible; /* sil_sched_victim: its engine state may be dropped and recomputed */
    uint32_t uid;     /* the user who sent it */
    uint64_t client;  /* and the connection */
};

/* The running slots an item's user and its client hold (sil_sched_share). */
struct sil_sched_share {
    int user, client;
};

double sil_sched_score(const struct sil_sched_params *p, const struct sil_sched_item *it,
                       double now);
/* a runs before b: lower score, then earlier arrival. */
bool sil_sched_before(const struct sil_sched_params *p, const struct sil_sched_item *a,
                      const struct sil_sched_item *b, double now);
/* Fills idx[0..n) with 0..n-1, most urgent first (lowest score, then earliest arrival). */
void sil_sched_order(const struct sil_sched_params *p, const struct sil_sched_item *it, int n,
                     double now, int *idx);
/* The class an item ranks in after aging: floor(score / aging_s). Fair shares apply between
 * items of one band. */
int sil_sched_band(const struct sil_sched_params *p, const struct sil_sched_item *it, double now);
/* Counts the running items of it's user and of its client into *out. */
void sil_sched_share(const struct sil_sched_item *running, int n, const struct sil_sched_item *it,
                     struct sil_sched_share *out);
/* Admission order, fair between users and then between the clients of one user: a is admitted
 * before b when its band is more urgent; within a band when its user holds fewer running slots,
 * then its client; then as sil_sched_before. */
bool sil_sched_admit_before(const struct sil_sched_params *p, const struct sil_sched_item *a,
                            const struct sil_sched_share *sa, const struct sil_sched_item *b,
                            const struct sil_sched_share *sb, double now);
/* sil_sched_order, then within each band one item per client in turn (each client's most
 * urgent, then each one's second, ...), so one client's prompts do not take the whole prefill
 * budget while another's wait. */
void sil_sched_order_fair(const struct sil_sched_params *p, const struct sil_sched_item *it, int n,
                          double now, int *idx);
/* Fair shares within a class, when cand waits with no slot free and sil_sched_victim found
 * none: a running item of cand's class or a less urgent one whose user holds at least two
 * slots more than cand's user does, or (cand's user) whose client holds at least two more than
 * cand's client; of those, one of the user or client holding most, its least urgent. Two, so a
 * preempted item never takes its slot back at once. -1 when none qualifies. */
int sil_sched_fair_victim(const struct sil_sched_params *p, const struct sil_sched_item *running,
                          int n, const struct sil_sched_item *cand, double now);
/* Prompt rows of the next step: prefill_chunk when no sequence decodes, else prefill_budget
 * (the decode rows come first and a step stays short), never more than room (rows left). */
int32_t sil_sched_prefill_budget(int n_decoding, int32_t prefill_budget, int32_t prefill_chunk,
                                 int32_t room);
/* The prefill budget by time, learnt from the evaluations: a step with decode rows and prompt
 * rows should take at most stretch times a step of decode rows only, so a long prompt never
 * holds the streams up for longer than that. The time of a decode-only step is averaged for
 * each number of decode rows. For each number of prompt rows up to SIL_SCHED_EST the last three
 * mixed steps with that many are kept, and their median (the less of two) is what such a step
 * costs: one pause of the machine's own moves it neither way. A step that used all of its
 * budget within the target lets the next one try an eighth more (at least one row) unless a
 * number in between is known to go over; one whose cost is over goes back to the most rows
 * known to fit below it, or to the share of its rows that fit, scaled linearly. A number that
 * went over once may be tried again (it may have been a pause); what went over is forgotten
 * after SIL_SCHED_REPROBE mixed steps (the context grows, the load changes), and every estimate
 * when a step has fewer decode rows than the last (streams went). The rows a step can take
 * are not predicted from the cost of fewer: on an MoE the union of experts they touch grows
 * slower than their number, and a linear guess from one row would hold a long prompt to one row
 * a step. Above SIL_SCHED_EST rows the budget grows while a linear guess fits and shrinks by
 * the linear share. */
#define SIL_SCHED_EST 64
#define SIL_SCHED_REPROBE 512
struct sil_sched_cost {
    double t_decode; /* seconds of a decode-only step of the last step's decode rows, 0 = none */
    /* [min(decode rows, SIL_SCHED_EST)]: decode-only steps of that many rows, averaged; 0 = none */
    double t_dec[SIL_SCHED_EST + 1];
    int32_t budget;  /* prompt rows, 0 = not learnt yet (the cap) */
    uint32_t steps;  /* mixed steps learnt from (wraps; only differences are used) */
    int32_t n_dec;   /* the decode rows of the last mixed step */
    struct {
        float t[3];   /* seconds of the last mixed steps with n prompt rows, newest in t[k % 3] */
        int32_t k;    /* how many were seen (0: unknown; 3 to 5: all three) */
        uint32_t when; /* steps at the newest */
    } est[SIL_SCHED_EST + 1]; /* [n], n >= 1 */
};
void sil_sched_cost_update(struct sil_sched_cost *c, int n_decode, int n_prompt, double seconds,
                           double stretch, int32_t cap);
/* Prompt rows for the next step that has decode rows: at least 1 (every prompt goes on), at
 * most cap; cap while nothing is learnt or stretch is 0 (no limit by time). */
int32_t sil_sched_prefill_timed(const struct sil_sched_cost *c, double stretch, int32_t cap);
/* The prompt rows of a step with n_decode decode rows whose most urgent decoding stream has class
 * decode_cls and whose most urgent prompt prompt_cls: the time budget protects streams from
 * prompts of their class or a lower one; a more urgent prompt (an interactive one next to batch
 * streams) gets cap. When a decode-only step of n_decode rows has not been timed yet (streams
 * joined while a prompt was being evaluated) but others have, none: that step is timed, so the
 * target is stretch times what these streams cost, not what fewer cost. */
int32_t sil_sched_prefill_cap(const struct sil_sched_cost *c, double stretch, int32_t cap,
                              int decode_cls, int prompt_cls, int n_decode);
/* Gives the budget out in the order of idx: each item takes min(want, what is left) into
 * take[item]. Returns the tokens given. */
int32_t sil_sched_split(const struct sil_sched_item *it, const int *idx, int n, int32_t budget,
                        int32_t *take);
/* The running item to preempt for cand (NULL: the engine ran out of space and any running item
 * may go): the least urgent preemptible one (highest score, then latest arrival); with cand, only
 * one of a lower class whose score is also above cand's, so an aged request is never preempted
 * by a newer one. -1 when none qualifies. */
int sil_sched_victim(const struct sil_sched_params *p, const struct sil_sched_item *running, int n,
                     const struct sil_sched_item *cand, double now);

#endif
