/* BPE encoding (sil_tokenize); see tokenizer.h for the contract.
 *
 * Encoding: the text is cut at special tokens (control tokens only when parse_special is set,
 * user-defined tokens such as "<think>" always, as both reference tokenizers do), every other
 * fragment is split into words by the pre-tokenizer regex, and every word is merged by BPE
 * starting from one symbol per byte. Text is not NFC-normalized (same as the GGUF reference
 * tokenizer; the HF Qwen tokenizer composes characters first and differs on decomposed input).
 *
 * Ownership: the vocab is only read; per-call scratch (symbols, heap, word cache, PCRE2 match
 * data) is allocated by the call and freed before it returns. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/engine/tokenizer_impl.h"
#include "kernels/vec.h"

struct id_buf {
    int32_t *ids;
    size_t n, cap;
};

static int id_push(struct id_buf *b, int32_t id)
{
    if (sil_vec_reserve(&b->ids, &b->cap, b->n + 1, 256) < 0)
        return -ENOMEM;
    b->ids[b->n++] = id;
    return 0;
}

/* Heap entries are rank << 32 | position: lowest rank first, then leftmost. */
typedef uint64_t heap_ent;

/* Per-call scratch, grown as needed and freed at the end of the call. */
/* Word cache: words repeat a lot in real text, and a cached word costs one hash probe instead of
 * a BPE run. It lives for one call (the vocab stays immutable) and only for texts long enough to
 * pay for it; when full it stops growing. */
#define WC_MAX_WORD 256
#define WC_MIN_TEXT 4096
struct wc_ent {
    uint64_t h; /* 0 = empty */
    uint32_t word_off, ids_off;
    uint16_t len, n_ids;
};

struct wcache {
    struct wc_ent *ent;
    uint32_t mask, used;
    char *words;
    int32_t *ids;
    size_t words_len, words_cap, ids_len, ids_cap;
};

struct scratch {
    int32_t *sym;  /* symbol ids */
    int32_t *next; /* linked list for long words */
    int32_t *prev;
    heap_ent *heap;
    size_t cap, heap_cap;
    struct wcache wc; /* ent == NULL: no cache */
};

static void wc_init(struct wcache *c, size_t text_len)
{
    size_t cap = 1024;
    while (cap < text_len / 16 && cap < (1u << 17))
        cap <<= 1;
    c->ent = calloc(cap, sizeof *c->ent);
    c->mask = c->ent ? (uint32_t)(cap - 1) : 0;
}

static void wc_free(struct wcache *c)
{
    free(c->ent);
    free(c->words);
    free(c->ids);
}

static const struct wc_ent *wc_find(const struct wcache *c, uint64_t h, const void *w, size_t n)
{
    for (uint32_t i = (uint32_t)h & c->mask;; i = (i + 1) & c->mask) {
        const struct wc_ent *e = &c->ent[i];
        if (e->h == 0)
            return NULL;
        if (e->h == h && e->len == n && memcmp(c->words + e->word_off, w, n) == 0)
            return e;
    }
}

/* Best effort: a failed allocation only means the word is not cached. */
static void wc_add(struct wcache *c, uint64_t h, const void *w, size_t n, const int32_t *ids,
                   size_t n_ids)
{
    if (c->used >= c->mask / 2 || c->words_len + n > UINT32_MAX / 2 ||
        c->ids_len + n_ids > UINT32_MAX / 2)
        return;
    if (sil_vec_reserve(&c->words, &c->words_cap, c->words_len + n, 16384) < 0 ||
        sil_vec_reserve(&c->ids, &c->ids_cap, c->ids_len + n_ids, 4096) < 0)
        return;
    uint32_t i = (uint32_t)h & c->mask;
    while (c->ent[i].h)
        i = (i + 1) & c->mask;
    c->ent[i] = (struct wc_ent){h, (uint32_t)c->words_len, (uint32_t)c->ids_len, (uint16_t)n,
                                (uint16_t)n_ids};
    memcpy(c->words + c->words_len, w, n);
    memcpy(c->ids + c->ids_len, ids, n_ids * sizeof *ids);
    c->words_len += n;
    c->ids_len += n_ids;
    c->used++;
}

static int scratch_reserve(struct scratch *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    size_t cap = s->cap ? s->cap : 64;
    while (cap < n)
        cap *= 2;
    int32_t *a = realloc(s->sym, cap * sizeof *a);
    if (!a)
        return -ENOMEM;
    s->sym = a;
    a = realloc(s->next, cap * sizeof *a);
    if (!a)
        return -ENOMEM;
    s->next = a;
    a = realloc(s->prev, cap * sizeof *a);
    if (!a)
        return -ENOMEM;
    s->prev = a;
    s->cap = cap;
    return 0;
}

static int32_t pair_rank(const struct sil_vocab *v, int32_t l, int32_t r)
{
    const struct merge_slot *m = merge_get(v, l, r);
    return m ? m->rank : INT32_MAX;
}

/* BPE on a short word: the symbols stay in one array and every step scans for the best pair.
 * Quadratic, so only used below a small length where it beats the heap. */
#define BPE_SHORT 24
static int bpe_short(const struct sil_vocab *v, int32_t *sym, int n, struct id_buf *out)
{
    int32_t rank[BPE_SHORT];
    for (int i = 0; i + 1 < n; i++)
        rank[i] = pair_rank(v, sym[i], sym[i + 1]);
    while (n > 1) {
        int best = -1;
        int32_t br = INT32_MAX;
        for (int i = 0; i + 1 < n; i++) {
            if (rank[i] < br) {
                br = rank[i];
                best = i;
            }
        }
        if (best < 0)
            break;
        sym[best] = merge_get(v, sym[best], sym[best + 1])->result;
        memmove(sym + best + 1, sym + best + 2, (size_t)(n - best - 2) * sizeof *sym);
        memmove(rank + best, rank + best + 1, (size_t)(n - best - 2) * sizeof *rank);
        n--;
        if (best > 0)
            rank[best - 1] = pair_rank(v, sym[best - 1], sym[best]);
        if (best + 1 < n)
            rank[best] = pair_rank(v, sym[best], sym[best + 1]);
    }
    for (int i = 0; i < n; i++)
        if (id_push(out, sym[i]) < 0)
            return -ENOMEM;
    return 0;
}

static void heap_push(heap_ent *h, size_t *n, heap_ent e)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 4;
        if (h[p] <= e)
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = e;
}

static heap_ent heap_pop(heap_ent *h, size_t *n)
{
    heap_ent top = h[0], last = h[--*n];
    size_t i = 0, m = *n;
    for (;;) {
        size_t c = 4 * i + 1, end = c + 4 < m ? c + 4 : m;
        if (c >= m)
            break;
        for (size_t k = c + 1; k < end; k++)
            if (h[k] < h[c])
                c = k;
        if (last <= h[c])
            break;
        h[i] = h[c];
        i = c;
    }
    if (m)
        h[i] = last;
    return top;
}

static void heap_add_pair(const struct sil_vocab *v, struct scratch *s, size_t *hn, int32_t i)
{
    if (i < 0 || s->next[i] < 0)
        return;
    const struct merge_slot *m = merge_get(v, s->sym[i], s->sym[s->next[i]]);
    if (m)
        heap_push(s->heap, hn, (uint64_t)m->rank << 32 | (uint32_t)i);
}

/* BPE on a long word: symbols in a linked list, candidate pairs in a 4-ary heap. An entry made
 * stale by an earlier merge is recognized on pop: the pair now at its position is not the merge
 * of its rank (ranks identify merges). O(n log n). */
static int bpe_long(const struct sil_vocab *v, struct scratch *s, int32_t n, struct id_buf *out)
{
    if ((size_t)n * 3 > s->heap_cap) {
        /* each merge adds at most 2 entries and removes one symbol: 3n bounds the heap */
        size_t cap = (size_t)n * 3;
        heap_ent *h = realloc(s->heap, cap * sizeof *h);
        if (!h)
            return -ENOMEM;
        s->heap = h;
        s->heap_cap = cap;
    }
    for (int32_t i = 0; i < n; i++) {
        s->prev[i] = i - 1;
        s->next[i] = i + 1 < n ? i + 1 : -1;
    }
    size_t hn = 0;
    for (int32_t i = 0; i + 1 < n; i++)
        heap_add_pair(v, s, &hn, i);
    while (hn) {
        heap_ent e = heap_pop(s->heap, &hn);
        int32_t i = (int32_t)(uint32_t)e, j = s->next[i];
        if (s->sym[i] < 0 || j < 0)
            continue;
        const struct merge_slot *m = merge_get(v, s->sym[i], s->sym[j]);
        if (!m || m->rank != (int32_t)(e >> 32))
            continue;
        s->sym[i] = m->result;
        s->sym[j] = -1;
        s->next[i] = s->next[j];
        if (s->next[j] >= 0)
            s->prev[s->next[j]] = i;
        heap_add_pair(v, s, &hn, s->prev[i]);
        heap_add_pair(v, s, &hn, i);
    }
    for (int32_t i = 0; i >= 0; i = s->next[i])
        if (id_push(out, s->sym[i]) < 0)
            return -ENOMEM;
    return 0;
}

static int encode_word(const struct sil_vocab *v, const unsigned char *w, size_t n,
                       struct scratch *s, struct id_buf *out)
{
    if (n == 0)
        return 0;
    if (n == 1)
        return id_push(out, v->byte_tok[w[0]]);
    if (v->pre_def->ignore_merges) {
        int32_t id = bytes_lookup(v, w, n);
        if (id >= 0)
            return id_push(out, id);
    }
    if (n > INT32_MAX / 4)
        return -E2BIG;
    uint64_t h = 0;
    if (s->wc.ent && n <= WC_MAX_WORD) {
        h = hash_bytes(w, n) | 1;
        const struct wc_ent *e = wc_find(&s->wc, h, w, n);
        if (e) {
            for (int i = 0; i < e->n_ids; i++)
                if (id_push(out, s->wc.ids[e->ids_off + i]) < 0)
                    return -ENOMEM;
            return 0;
        }
    }
    if (scratch_reserve(s, n) < 0)
        return -ENOMEM;
    for (size_t i = 0; i < n; i++)
        s->sym[i] = v->byte_tok[w[i]];
    size_t first = out->n;
    int rc = n <= BPE_SHORT ? bpe_short(v, s->sym, (int)n, out) : bpe_long(v, s, (int32_t)n, out);
    if (rc == 0 && h)
        wc_add(&s->wc, h, w, n, out->ids + first, out->n - first);
    return rc;
}

/* Per-call PCRE2 state. The match context and a large JIT stack are made only if the default
 * 32 KiB stack ever runs out, so short calls stay cheap. */
struct matcher {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
};

static int run_match(const struct sil_vocab *v, struct matcher *m, const unsigned char *t,
                     size_t len, size_t pos)
{
    for (;;) {
        int rc = v->re_jit ? pcre2_jit_match(v->re, t, len, pos, 0, m->md, m->mc)
                           : pcre2_match(v->re, t, len, pos, 0, m->md, m->mc);
        if (rc != PCRE2_ERROR_JIT_STACKLIMIT || m->js)
            return rc;
        if (!m->mc && !(m->mc = pcre2_match_context_create(NULL)))
            return rc;
        if (!(m->js = pcre2_jit_stack_create(32 * 1024, 16 * 1024 * 1024, NULL)))
            return rc;
        pcre2_jit_stack_assign(m->mc, NULL, m->js);
    }
}

/* Splits one fragment (no special tokens inside) into words with the pre-tokenizer regex. Bytes
 * the regex does not cover (invalid UTF-8, and some whitespace for gpt2) form words of their own.
 */
static int encode_fragment(const struct sil_vocab *v, const unsigned char *t, size_t len,
                           struct matcher *mt, struct scratch *s, struct id_buf *out)
{
    size_t pos = 0;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(mt->md);
    while (pos < len) {
        int rc = run_match(v, mt, t, len, pos);
        size_t ms, me;
        if (rc >= 0) {
            ms = ov[0];
            me = ov[1];
            if (me <= ms) /* cannot happen with these regexes; never loop on an empty match */
                me = ms + 1 <= len ? ms + 1 : len;
        } else if (rc == PCRE2_ERROR_NOMATCH) {
            ms = me = len;
        } else {
            /* resource limit on a pathological input: the rest is one word (still exact bytes) */
            ms = pos;
            me = len;
        }
        int e;
        if (ms > pos && (e = encode_word(v, t + pos, ms - pos, s, out)) < 0)
            return e;
        if (me > ms && (e = encode_word(v, t + ms, me - ms, s, out)) < 0)
            return e;
        pos = me;
    }
    return 0;
}

/* The special token starting at t[0..n), longest first, or -1. */
static int32_t match_special(const struct sil_vocab *v, const char *t, size_t n, bool parse_special)
{
    for (int k = 0; k < v->n_special_len; k++) {
        size_t l = v->special_len[k];
        if (l > n)
            continue;
        int32_t id = str_map_get(&v->special_by_text, v->text, v->text_off, 1, t, l);
        if (id >= 0 && (parse_special || v->type[id] == TT_USER_DEFINED))
            return id;
    }
    return -1;
}

int sil_tokenize(const struct sil_vocab *v, const char *text, size_t len, bool add_bos,
                 bool parse_special, int32_t **ids, size_t *n_ids, struct sil_error *err)
{
    *ids = NULL;
    *n_ids = 0;
    struct id_buf out = {0};
    struct scratch s = {0};
    struct matcher mt = {pcre2_match_data_create(1, NULL), NULL, NULL};
    int rc = 0;
    if (!mt.md) {
        rc = sil_errorf(err, -ENOMEM, "tokenizer: out of memory");
        goto done;
    }
    if (len >= WC_MIN_TEXT)
        wc_init(&s.wc, len);
    if (add_bos && v->bos >= 0 && (rc = id_push(&out, v->bos)) < 0)
        goto oom;

    const unsigned char *t = (const unsigned char *)text;
    size_t frag = 0;
    for (size_t i = 0; i < len; i++) {
        if (!v->special_first[t[i]])
            continue;
        int32_t id = match_special(v, text + i, len - i, parse_special);
        if (id < 0)
            continue;
        if (i > frag && (rc = encode_fragment(v, t + frag, i - frag, &mt, &s, &out)) < 0)
            goto oom;
        if ((rc = id_push(&out, id)) < 0)
            goto oom;
        i += v->text_off[id + 1] - v->text_off[id] - 2;
        frag = i + 1;
    }
    if (len > frag && (rc = encode_fragment(v, t + frag, len - frag, &mt, &s, &out)) < 0)
        goto oom;
    if (out.n == 0) {
        free(out.ids);
        out.ids = malloc(sizeof *out.ids); /* a valid pointer even for no tokens */
        if (!out.ids) {
            rc = -ENOMEM;
            goto oom;
        }
    }
    *ids = out.ids;
    *n_ids = out.n;
    out.ids = NULL;
    goto done;
oom:
    rc = sil_errorf(err, rc, "tokenizer: %s while encoding %zu bytes",
                    rc == -E2BIG ? "word too long" : "out of memory", len);
done:
    free(out.ids);
    free(s.sym);
    free(s.next);
    free(s.prev);
    free(s.heap);
    wc_free(&s.wc);
    pcre2_jit_stack_free(mt.js);
    pcre2_match_context_free(mt.mc);
    pcre2_match_data_free(mt.md);
    return rc;
}
