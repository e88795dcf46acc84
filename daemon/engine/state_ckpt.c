/* Recurrent-state checkpoints (state_ckpt.h): per sequence, an array of (position, snapshot)
 * kept sorted by position. Lists are short (a handful per session), so linear scans. */
#include "daemon/engine/state_ckpt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/vec.h"

struct ckpt {
    int32_t pos;
    float *state;
};

struct seq_ckpts {
    struct ckpt *v; /* sorted by pos, ascending */
    int n;
    size_t cap;
};

struct sil_state_ckpt {
    int32_t n_seq_max;
    int64_t floats;
    struct seq_ckpts *seq;
};

int sil_ckpt_create(struct sil_state_ckpt **out, int32_t n_seq_max, int64_t floats,
                    struct sil_error *err)
{
    struct sil_state_ckpt *c = calloc(1, sizeof(*c));
    if (!c || !(c->seq = calloc((size_t)(n_seq_max > 0 ? n_seq_max : 1), sizeof(*c->seq)))) {
        free(c);
        return sil_errorf(err, -ENOMEM, "checkpoints: out of memory");
    }
    c->n_seq_max = n_seq_max;
    c->floats = floats;
    *out = c;
    return 0;
}

void sil_ckpt_free(struct sil_state_ckpt *c)
{
    if (!c)
        return;
    for (int s = 0; s < c->n_seq_max; s++) {
        sil_ckpt_clear(c, s);
        free(c->seq[s].v);
    }
    free(c->seq);
    free(c);
}

static struct seq_ckpts *list(const struct sil_state_ckpt *c, int seq)
{
    return c && c->floats > 0 && seq >= 0 && seq < c->n_seq_max ? &c->seq[seq] : NULL;
}

static void drop_at(struct seq_ckpts *l, int i)
{
    free(l->v[i].state);
    memmove(l->v + i, l->v + i + 1, sizeof(*l->v) * (size_t)(l->n - i - 1));
    l->n--;
}

int sil_ckpt_save(struct sil_state_ckpt *c, int seq, int32_t pos, const float *state, int max_keep,
                  struct sil_error *err)
{
    struct seq_ckpts *l = list(c, seq);
    if (!l)
        return 0;
    if (max_keep <= 0) {
        sil_ckpt_clear(c, seq);
        return 0;
    }
    const size_t bytes = sizeof(float) * (size_t)c->floats;
    for (int i = 0; i < l->n; i++)
        if (l->v[i].pos == pos) {
            memcpy(l->v[i].state, state, bytes);
            return 0;
        }
    if (l->n >= max_keep && l->v[0].pos > pos)
        return 0; /* older than everything kept: it would be the first to go */
    float *snap;
    if (l->n >= max_keep) {
        /* Reuse the lowest one's buffer; drop more while over (max_keep lowered since). */
        snap = l->v[0].state;
        l->v[0].state = NULL;
        drop_at(l, 0);
        while (l->n >= max_keep)
            drop_at(l, 0);
    } else {
        if (sil_vec_reserve(&l->v, &l->cap, (size_t)l->n + 1, 4) < 0)
            return sil_errorf(err, -ENOMEM, "checkpoints: out of memory");
        snap = malloc(bytes);
        if (!snap)
            return sil_errorf(err, -ENOMEM, "checkpoints: out of memory for a %zu-byte snapshot",
                              bytes);
    }
    memcpy(snap, state, bytes);
    int at = l->n;
    while (at > 0 && l->v[at - 1].pos > pos)
        at--;
    memmove(l->v + at + 1, l->v + at, sizeof(*l->v) * (size_t)(l->n - at));
    l->v[at] = (struct ckpt){ pos, snap };
    l->n++;
    return 0;
}

int32_t sil_ckpt_find(const struct sil_state_ckpt *c, int seq, int32_t pos)
{
    const struct seq_ckpts *l = list(c, seq);
    int32_t best = -1;
    for (int i = 0; l && i < l->n && l->v[i].pos <= pos; i++)
        best = l->v[i].pos;
    return best;
}

int sil_ckpt_restore(const struct sil_state_ckpt *c, int seq, int32_t pos, float *state)
{
    const struct seq_ckpts *l = list(c, seq);
    for (int i = 0; l && i < l->n; i++)
        if (l->v[i].pos == pos) {
            memcpy(state, l->v[i].state, sizeof(float) * (size_t)c->floats);
            return 0;
        }
    return -ENOENT;
}

void sil_ckpt_drop_after(struct sil_state_ckpt *c, int seq, int32_t pos)
{
    struct seq_ckpts *l = list(c, seq);
    while (l && l->n > 0 && l->v[l->n - 1].pos > pos)
        drop_at(l, l->n - 1);
}

void sil_ckpt_clear(struct sil_state_ckpt *c, int seq)
{
    sil_ckpt_drop_after(c, seq, -1);
}

int sil_ckpt_count(const struct sil_state_ckpt *c, int seq)
{
    const struct seq_ckpts *l = list(c, seq);
    return l ? l->n : 0;
}

uint64_t sil_ckpt_bytes(const struct sil_state_ckpt *c, int seq)
{
    return (uint64_t)sil_ckpt_count(c, seq) * (c ? (uint64_t)c->floats : 0) * sizeof(float);
}
