/* Expert cache policy (expert_cache.h has the contract).
 *
 * State per slot: the key it holds (layer * n_expert + expert, or -1), links of the pool's
 * recency list (LRU, HEAT's probation), its place in the pool's min-heap by decayed frequency
 * (LFU, HEAT's protected segment) and the epoch of the last plan that used it (the pin).
 * Decayed frequency is kept inflated: a use at clock t adds rows * g^t, so values of experts not
 * used keep their order without being touched; everything is rescaled when g^t grows large. */
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/expert_cache.h"

struct pool {
    int32_t first, n;       /* slots [first, first + n) */
    int32_t n_free, *free;  /* stack of free slots */
    int32_t head, tail;     /* recency list, most recent at head; -1 when empty */
    int32_t n_heap, *heap;  /* min-heap of slots by frequency */
    int32_t n_prot, n_capp; /* HEAT: protected slots, and how many may be; STATIC: pinned */
};

struct sil_ecache {
    struct sil_ecache_config cfg;
    int32_t n_pool;
    struct pool *pool; /* [n_pool] */
    int32_t *key;      /* [n_slot] held key or -1 */
    int32_t *prev, *next;
    int32_t *hpos;               /* [n_slot] index in its pool's heap or -1 */
    uint64_t *pin;               /* [n_slot] epoch of the last plan that used it */
    uint8_t *prot;               /* [n_slot] HEAT: in the protected segment; STATIC: pinned */
    int32_t *slot_of;            /* [n_layer * n_expert] */
    double *freq;                /* [n_layer * n_expert] inflated decayed frequency */
    int32_t *free_stack;         /* [n_slot] backing of the pools' free stacks */
    int32_t *heap_buf;           /* [n_slot] backing of the pools' heaps */
    int32_t *miss, *used;        /* [n_expert] plan scratch: missed entries, slots used */
    struct sil_ecache_stats *st; /* [n_layer] */
    int32_t host_quota;          /* misses of each plan left on the host, the coldest first */
    double host_share;           /* of a plan's misses (0: the quota whatever their number) */
    int admit;                   /* a miss fills only a free slot or one colder than itself */
    uint64_t epoch;              /* never wraps: a stale pin would look like this plan's */
    double g, infl; /* growth per lookup, and g^(lookups since the last rescale) */
};

static struct pool *pool_of(struct sil_ecache *c, int32_t layer)
{
    return &c->pool[c->cfg.pools == SIL_ECACHE_GLOBAL ? 0 : layer];
}

/* ---- recency list ---------------------------------------------------------------------------- */

static void list_remove(struct sil_ecache *c, struct pool *p, int32_t s)
{
    if (c->prev[s] >= 0)
        c->next[c->prev[s]] = c->next[s];
    else
        p->head = c->next[s];
    if (c->next[s] >= 0)
        c->prev[c->next[s]] = c->prev[s];
    else
        p->tail = c->prev[s];
    c->prev[s] = c->next[s] = -1;
}

static void list_push_head(struct sil_ecache *c, struct pool *p, int32_t s)
{
    c->prev[s] = -1;
    c->next[s] = p->head;
    if (p->head >= 0)
        c->prev[p->head] = s;
    else
        p->tail = s;
    p->head = s;
}

static void list_push_tail(struct sil_ecache *c, struct pool *p, int32_t s)
{
    c->next[s] = -1;
    c->prev[s] = p->tail;
    if (p->tail >= 0)
        c->next[p->tail] = s;
    else
        p->head = s;
    p->tail = s;
}

/* ---- min-heap by frequency, ties to the lower slot --------------------------------------------
 */

static int less(const struct sil_ecache *c, int32_t a, int32_t b)
{
    const double fa = c->freq[c->key[a]], fb = c->freq[c->key[b]];
    return fa < fb || (fa == fb && a < b);
}

static void heap_set(struct sil_ecache *c, struct pool *p, int32_t i, int32_t s)
{
    p->heap[i] = s;
    c->hpos[s] = i;
}

static void sift_up(struct sil_ecache *c, struct pool *p, int32_t i)
{
    const int32_t s = p->heap[i];
    while (i > 0) {
        const int32_t up = (i - 1) / 2;
        if (!less(c, s, p->heap[up])) break;
        heap_set(c, p, i, p->heap[up]);
        i = up;
    }
    heap_set(c, p, i, s);
}

static void sift_down(struct sil_ecache *c, struct pool *p, int32_t i)
{
    const int32_t s = p->heap[i];
    for (;;) {
        int32_t m = 2 * i + 1;
        if (m >= p->n_heap) break;
        if (m + 1 < p->n_heap && less(c, p->heap[m + 1], p->heap[m])) m++;
        if (!less(c, p->heap[m], s)) break;
        heap_set(c, p, i, p->heap[m]);
        i = m;
    }
    heap_set(c, p, i, s);
}

static void heap_insert(struct sil_ecache *c, struct pool *p, int32_t s)
{
    heap_set(c, p, p->n_heap++, s);
    sift_up(c, p, p->n_heap - 1);
}

static void heap_remove(struct sil_ecache *c, struct pool *p, int32_t s)
{
    const int32_t i = c->hpos[s], last = p->heap[--p->n_heap];
    c->hpos[s] = -1;
    if (last == s) return;
    heap_set(c, p, i, last);
    sift_up(c, p, i);
    sift_down(c, p, c->hpos[last]);
}

static int32_t heap_pop(struct sil_ecache *c, struct pool *p)
{
    const int32_t s = p->heap[0];
    heap_remove(c, p, s);
    return s;
}

static void heaps_rebuild(struct sil_ecache *c)
{
    for (int32_t k = 0; k < c->n_pool; k++) {
        struct pool *p = &c->pool[k];
        for (int32_t i = p->n_heap / 2 - 1; i >= 0; i--)
            sift_down(c, p, i);
    }
}

/* ---- policy steps ------------------------------------------------------------------------------
 */

static int pinned(const struct sil_ecache *c, int32_t s)
{
    return c->pin[s] == c->epoch;
}

/* A hit: take it out of what can be evicted for the rest of the plan. */
static void on_hit(struct sil_ecache *c, struct pool *p, int32_t s)
{
    switch (c->cfg.policy) {
    case SIL_ECACHE_LRU:
        list_remove(c, p, s);
        list_push_head(c, p, s);
        break;
    case SIL_ECACHE_LFU:
        heap_remove(c, p, s);
        break;
    case SIL_ECACHE_HEAT:
        if (c->prot[s]) {
            heap_remove(c, p, s);
        } else {
            list_remove(c, p, s);
            list_push_head(c, p, s);
        }
        break;
    case SIL_ECACHE_STATIC:
        if (!c->prot[s]) { /* staging */
            list_remove(c, p, s);
            list_push_head(c, p, s);
        }
        break;
    default:
        break;
    }
}

/* The policy's victim that this plan does not use, still in place; -1 when none. LRU: hits and
 * fills of this plan went to the head, so a pinned tail means all are pinned; LFU: the heap
 * holds only slots this plan has not used; HEAT: probation's tail first, then protected. */
static int32_t victim(const struct sil_ecache *c, const struct pool *p)
{
    const bool tail = p->tail >= 0 && !pinned(c, p->tail);
    switch (c->cfg.policy) {
    case SIL_ECACHE_LRU:
        return tail ? p->tail : -1;
    case SIL_ECACHE_LFU:
        return p->n_heap > 0 ? p->heap[0] : -1;
    case SIL_ECACHE_HEAT:
        return tail ? p->tail : p->n_heap > 0 ? p->heap[0] : -1;
    case SIL_ECACHE_STATIC: /* only staging is in the list */
        return tail ? p->tail : -1;
    default:
        return -1;
    }
}

/* A slot for the miss `key`: a free one, else the policy's victim (taken out of the list or
 * heap it was in) when admission lets the miss in (set_admission: only when it is hotter than
 * the victim); -1 when none. */
static int32_t take_slot(struct sil_ecache *c, struct pool *p, int32_t key)
{
    if (c->cfg.policy == SIL_ECACHE_STATIC && c->cfg.n_stage == 0) return -1;
    if (p->n_free > 0) {
        const int32_t f = p->free[--p->n_free];
        if (c->cfg.policy == SIL_ECACHE_STATIC && p->n_prot < p->n_capp) {
            c->prot[f] = 1; /* the pinned part fills first */
            p->n_prot++;
        }
        return f;
    }
    const int32_t s = victim(c, p);
    if (s < 0 || (c->admit && !(c->key[s] >= 0 && c->freq[key] > c->freq[c->key[s]]))) return -1;
    if (s == p->tail && c->cfg.policy != SIL_ECACHE_LFU) {
        list_remove(c, p, s);
    } else {
        heap_pop(c, p); /* s is heap[0] */
        if (c->cfg.policy == SIL_ECACHE_HEAT) {
            c->prot[s] = 0;
            p->n_prot--;
        }
    }
    return s;
}

static void on_fill(struct sil_ecache *c, struct pool *p, int32_t s)
{
    if (c->cfg.policy == SIL_ECACHE_LRU || c->cfg.policy == SIL_ECACHE_HEAT ||
        (c->cfg.policy == SIL_ECACHE_STATIC && !c->prot[s]))
        list_push_head(c, p, s);
}

/* End of a plan: the slots it used become evictable again with their new frequencies; HEAT
 * promotes a probation expert that is now hotter than the coldest protected one. */
static void end_plan(struct sil_ecache *c, struct pool *p, const int32_t *used, int32_t n)
{
    if (c->cfg.policy == SIL_ECACHE_LFU) {
        for (int32_t i = 0; i < n; i++)
            heap_insert(c, p, used[i]);
    } else if (c->cfg.policy == SIL_ECACHE_HEAT) {
        for (int32_t i = 0; i < n; i++)
            if (c->prot[used[i]]) heap_insert(c, p, used[i]);
        for (int32_t i = 0; i < n; i++) {
            const int32_t s = used[i];
            if (c->prot[s]) continue;
            if (p->n_prot >= p->n_capp) {
                if (p->n_heap == 0 || !less(c, p->heap[0], s)) continue;
                const int32_t m = heap_pop(c, p);
                c->prot[m] = 0;
                p->n_prot--;
                list_push_head(c, p, m);
            }
            list_remove(c, p, s);
            c->prot[s] = 1;
            p->n_prot++;
            heap_insert(c, p, s);
        }
    }
}

/* ---- public ------------------------------------------------------------------------------------
 */

static void rescale(struct sil_ecache *c)
{
    const int64_t n_key = (int64_t)c->cfg.n_layer * c->cfg.n_expert;
    const double inv = 1.0 / c->infl;
    for (int64_t k = 0; k < n_key; k++)
        c->freq[k] *= inv;
    c->infl = 1.0;
    heaps_rebuild(c); /* values that underflow to equal may reorder their ties */
}

int sil_ecache_create(struct sil_ecache **out, const struct sil_ecache_config *cfg,
                      struct sil_error *err)
{
    *out = NULL;
    struct sil_ecache_config k = *cfg;
    if (k.n_layer < 1 || k.n_layer > 4096)
        return sil_errorf(err, -EINVAL, "expert cache: n_layer %d not in [1, 4096]", k.n_layer);
    if (k.n_expert < 1 || k.n_expert > 65536)
        return sil_errorf(err, -EINVAL, "expert cache: n_expert %d not in [1, 65536]", k.n_expert);
    if (k.n_slot < 0 || (int64_t)k.n_slot > (int64_t)k.n_layer * k.n_expert)
        return sil_errorf(err, -EINVAL, "expert cache: n_slot %d not in [0, n_layer * n_expert]",
                          k.n_slot);
    if ((unsigned)k.policy >= SIL_ECACHE_POLICY_COUNT)
        return sil_errorf(err, -EINVAL, "expert cache: policy %d unknown", (int)k.policy);
    if (k.pools != SIL_ECACHE_PER_LAYER && k.pools != SIL_ECACHE_GLOBAL)
        return sil_errorf(err, -EINVAL, "expert cache: pools %d unknown", (int)k.pools);
    if (k.half_life == 0) k.half_life = 64;
    if (!(k.half_life > 0 && k.half_life < 1e9))
        return sil_errorf(err, -EINVAL, "expert cache: half_life %g not > 0", k.half_life);
    if (k.n_stage < 0 || (int64_t)k.n_stage > (int64_t)k.n_slot)
        return sil_errorf(err, -EINVAL, "expert cache: n_stage %d not in [0, n_slot]", k.n_stage);
    if (k.protect == 0) k.protect = 0.5;
    if (!(k.protect > 0 && k.protect < 1))
        return sil_errorf(err, -EINVAL, "expert cache: protect %g not in (0, 1)", k.protect);

    struct sil_ecache *c = calloc(1, sizeof(*c));
    if (!c) return sil_errorf(err, -ENOMEM, "expert cache: out of memory");
    c->cfg = k;
    c->n_pool = k.pools == SIL_ECACHE_GLOBAL ? 1 : k.n_layer;
    const size_t ns = (size_t)k.n_slot + 1, nk = (size_t)k.n_layer * (size_t)k.n_expert;
    c->pool = calloc((size_t)c->n_pool, sizeof(*c->pool));
    c->key = malloc(ns * sizeof(int32_t));
    c->prev = malloc(ns * sizeof(int32_t));
    c->next = malloc(ns * sizeof(int32_t));
    c->hpos = malloc(ns * sizeof(int32_t));
    c->pin = calloc(ns, sizeof(uint64_t));
    c->prot = calloc(ns, 1);
    c->free_stack = malloc(ns * sizeof(int32_t));
    c->heap_buf = malloc(ns * sizeof(int32_t));
    c->slot_of = malloc(nk * sizeof(int32_t));
    c->freq = calloc(nk, sizeof(double));
    c->miss = malloc((size_t)k.n_expert * sizeof(int32_t));
    c->used = malloc((size_t)k.n_expert * sizeof(int32_t));
    c->st = calloc((size_t)k.n_layer, sizeof(*c->st));
    if (!c->pool || !c->key || !c->prev || !c->next || !c->hpos || !c->pin || !c->prot ||
        !c->free_stack || !c->heap_buf || !c->slot_of || !c->freq || !c->miss || !c->used ||
        !c->st) {
        sil_ecache_free(c);
        return sil_errorf(err, -ENOMEM, "expert cache: out of memory");
    }
    for (size_t s = 0; s < ns; s++)
        c->key[s] = c->prev[s] = c->next[s] = c->hpos[s] = -1;
    for (size_t i = 0; i < nk; i++)
        c->slot_of[i] = -1;
    int32_t at = 0;
    for (int32_t i = 0; i < c->n_pool; i++) {
        struct pool *p = &c->pool[i];
        p->first = at;
        p->n = c->n_pool == 1 ? k.n_slot : k.n_slot / k.n_layer + (i < k.n_slot % k.n_layer);
        at += p->n;
        p->free = c->free_stack + p->first;
        p->heap = c->heap_buf + p->first;
        p->n_free = p->n;
        for (int32_t j = 0; j < p->n; j++) /* the pool's first slot is handed out first */
            p->free[j] = p->first + p->n - 1 - j;
        p->head = p->tail = -1;
        if (k.policy == SIL_ECACHE_STATIC) {
            const int32_t st = k.n_stage < p->n / 2 ? k.n_stage : p->n / 2;
            p->n_capp = k.n_stage > 0 ? p->n - st : p->n;
        } else {
            p->n_capp = (int32_t)(k.protect * p->n);
        }
    }
    c->g = exp2(1.0 / (k.half_life * k.n_layer));
    c->infl = 1.0;
    *out = c;
    return 0;
}

void sil_ecache_free(struct sil_ecache *c)
{
    if (!c) return;
    free(c->pool);
    free(c->key);
    free(c->prev);
    free(c->next);
    free(c->hpos);
    free(c->pin);
    free(c->prot);
    free(c->free_stack);
    free(c->heap_buf);
    free(c->slot_of);
    free(c->freq);
    free(c->miss);
    free(c->used);
    free(c->st);
    free(c);
}

int sil_ecache_lookup(struct sil_ecache *c, int32_t layer, const int32_t *expert,
                      const int32_t *uses, int32_t n, struct sil_ecache_entry *res)
{
    const int32_t X = c->cfg.n_expert;
    if (layer < 0 || layer >= c->cfg.n_layer || n < 0 || n > X) return -EINVAL;
    for (int32_t i = 0; i < n; i++)
        if (expert[i] < 0 || expert[i] >= X) return -EINVAL;
    struct pool *p = pool_of(c, layer);
    struct sil_ecache_stats *st = &c->st[layer];
    c->epoch++;
    c->infl *= c->g;
    if (c->infl > 1e100) rescale(c);
    st->lookups++;

    int32_t n_miss = 0, n_used = 0, n_host = 0;
    for (int32_t i = 0; i < n; i++) {
        const int32_t key = layer * X + expert[i];
        const int32_t w = uses ? uses[i] : 1;
        c->freq[key] += (w > 0 ? w : 0) * c->infl;
        const int32_t s = c->slot_of[key];
        if (s < 0) {
            c->miss[n_miss++] = i;
            continue;
        }
        res[i] = (struct sil_ecache_entry){SIL_ECACHE_HIT, s, -1, -1};
        st->hits++;
        if (pinned(c, s)) /* the same expert twice in one plan */
            continue;
        c->pin[s] = c->epoch;
        on_hit(c, p, s);
        c->used[n_used++] = s;
    }
    /* the host's share: the coldest misses (lowest decayed frequency) are not filled */
    int32_t n_left = c->host_quota < n_miss ? c->host_quota : n_miss;
    if (c->host_share > 0) {
        const int32_t by_share = (int32_t)((double)n_miss * c->host_share + 0.5);
        if (by_share < n_left) n_left = by_share;
    }
    for (int32_t q = 0; q < n_left; q++) {
        int32_t best = q;
        for (int32_t j = q + 1; j < n_miss; j++)
            if (c->freq[layer * X + expert[c->miss[j]]] <
                c->freq[layer * X + expert[c->miss[best]]])
                best = j;
        const int32_t t = c->miss[q];
        c->miss[q] = c->miss[best];
        c->miss[best] = t;
    }
    for (int32_t j = 0; j < n_miss; j++) {
        const int32_t i = c->miss[j], key = layer * X + expert[i];
        if (c->slot_of[key] >= 0) { /* filled by an earlier duplicate of this plan */
            res[i] = (struct sil_ecache_entry){SIL_ECACHE_HIT, c->slot_of[key], -1, -1};
            st->hits++;
            continue;
        }
        st->misses++;
        st->bytes_streamed += c->cfg.expert_bytes;
        const int32_t s = j < n_left ? -1 : take_slot(c, p, key);
        if (s < 0) {
            res[i] = (struct sil_ecache_entry){SIL_ECACHE_HOST, -1, -1, -1};
            st->host++;
            n_host++;
            continue;
        }
        res[i] = (struct sil_ecache_entry){SIL_ECACHE_FILL, s, -1, -1};
        const int32_t old = c->key[s];
        if (old >= 0) {
            c->slot_of[old] = -1;
            res[i].evict_layer = old / X;
            res[i].evict_expert = old % X;
            st->evictions++;
        }
        c->key[s] = key;
        c->slot_of[key] = s;
        c->pin[s] = c->epoch;
        on_fill(c, p, s);
        c->used[n_used++] = s;
        st->fills++;
    }
    end_plan(c, p, c->used, n_used);
    return n_host;
}

void sil_ecache_set_host_misses(struct sil_ecache *c, int32_t n)
{
    c->host_quota = n > 0 ? n : 0;
}

void sil_ecache_set_host_share(struct sil_ecache *c, double share)
{
    c->host_share = share > 0 && share <= 1 ? share : share > 1 ? 1.0 : 0.0;
}

void sil_ecache_set_admission(struct sil_ecache *c, int on)
{
    c->admit = on != 0;
}

int sil_ecache_preload(struct sil_ecache *c, int32_t layer, int32_t expert)
{
    if (layer < 0 || layer >= c->cfg.n_layer || expert < 0 || expert >= c->cfg.n_expert)
        return -EINVAL;
    const int32_t key = layer * c->cfg.n_expert + expert;
    if (c->slot_of[key] >= 0) return -EEXIST;
    struct pool *p = pool_of(c, layer);
    if (p->n_free == 0) return -ENOSPC;
    const int32_t s = p->free[--p->n_free];
    c->key[s] = key;
    c->slot_of[key] = s;
    switch (c->cfg.policy) {
    case SIL_ECACHE_LRU:
        list_push_tail(c, p, s);
        break;
    case SIL_ECACHE_LFU:
        heap_insert(c, p, s);
        break;
    case SIL_ECACHE_HEAT:
        if (p->n_prot < p->n_capp) {
            c->prot[s] = 1;
            p->n_prot++;
            heap_insert(c, p, s);
        } else {
            list_push_tail(c, p, s);
        }
        break;
    case SIL_ECACHE_STATIC:
        if (p->n_prot < p->n_capp) {
            c->prot[s] = 1;
            p->n_prot++;
        } else {
            list_push_tail(c, p, s);
        }
        break;
    default:
        break;
    }
    return s;
}

void sil_ecache_demote(struct sil_ecache *c, int32_t layer, int32_t expert)
{
    if (layer < 0 || layer >= c->cfg.n_layer || expert < 0 || expert >= c->cfg.n_expert) return;
    const int32_t key = layer * c->cfg.n_expert + expert, s = c->slot_of[key];
    if (s < 0 || c->cfg.policy != SIL_ECACHE_LFU) return;
    c->freq[key] = 0.0;
    struct pool *p = pool_of(c, layer);
    if (c->hpos[s] >= 0) { /* else the plan that uses it puts it back with this value */
        heap_remove(c, p, s);
        heap_insert(c, p, s);
    }
}

int32_t sil_ecache_slot_of(const struct sil_ecache *c, int32_t layer, int32_t expert)
{
    if (layer < 0 || layer >= c->cfg.n_layer || expert < 0 || expert >= c->cfg.n_expert) return -1;
    return c->slot_of[layer * c->cfg.n_expert + expert];
}

void sil_ecache_heat_export(const struct sil_ecache *c, float *heat)
{
    const int64_t n_key = (int64_t)c->cfg.n_layer * c->cfg.n_expert;
    for (int64_t k = 0; k < n_key; k++)
        heat[k] = (float)(c->freq[k] / c->infl);
}

void sil_ecache_heat_import(struct sil_ecache *c, const float *heat)
{
    const int64_t n_key = (int64_t)c->cfg.n_layer * c->cfg.n_expert;
    for (int64_t k = 0; k < n_key; k++)
        c->freq[k] = isfinite(heat[k]) && heat[k] > 0 ? heat[k] * c->infl : 0;
    heaps_rebuild(c);
}

void sil_ecache_stats(const struct sil_ecache *c, int32_t layer, struct sil_ecache_stats *out)
{
    memset(out, 0, sizeof(*out));
    for (int32_t l = 0; l < c->cfg.n_layer; l++) {
        if (layer >= 0 && l != layer) continue;
        const struct sil_ecache_stats *s = &c->st[l];
        out->lookups += s->lookups;
        out->hits += s->hits;
        out->misses += s->misses;
        out->fills += s->fills;
        out->host += s->host;
        out->evictions += s->evictions;
        out->bytes_streamed += s->bytes_streamed;
    }
}

void sil_ecache_reset_stats(struct sil_ecache *c)
{
    memset(c->st, 0, (size_t)c->cfg.n_layer * sizeof(*c->st));
}

int32_t sil_ecache_pool_slots(const struct sil_ecache *c, int32_t layer)
{
    if (layer < 0 || layer >= c->cfg.n_layer) return 0;
    return c->pool[c->cfg.pools == SIL_ECACHE_GLOBAL ? 0 : layer].n;
}

static const char *const policy_names[SIL_ECACHE_POLICY_COUNT] = {"lru", "lfu", "heat", "static"};

const char *sil_ecache_policy_name(enum sil_ecache_policy p)
{
    return (unsigned)p < SIL_ECACHE_POLICY_COUNT ? policy_names[p] : "?";
}

int sil_ecache_policy_parse(const char *name)
{
    for (int i = 0; i < SIL_ECACHE_POLICY_COUNT; i++)
        if (strcmp(name, policy_names[i]) == 0) return i;
    return -1;
}
