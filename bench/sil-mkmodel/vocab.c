/* Vocabularies: a synthetic byte-level BPE vocab (256 byte symbols, merges learned from a small
 * built-in text and then seeded random merges of existing tokens, the Qwen special tokens at the
 * end), or one imported from a Hugging Face tokenizer.json. Token strings use the byte-level
 * alphabet (byte 0x20 is "Ġ", ...), as GGUF stores them. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench/sil-mkmodel/mkmodel.h"

static const char *const specials[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"};
static const int32_t special_types[] = {3, 3, 3, 4, 4}; /* the think tags are not "special" in Qwen */
#define N_SPECIAL 5

/* Byte-level alphabet: printable bytes map to themselves, the others to U+0100 upwards. Token id
 * i < 256 is the symbol of the i-th byte in the order printable-first. */
static void byte_symbols(int order[256], unsigned cp[256])
{
    int n = 0, extra = 0;
    for (int b = 0; b < 256; b++)
        if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
            order[n++] = b;
            cp[b] = (unsigned)b;
        }
    for (int b = 0; b < 256; b++)
        if (!((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))) {
            order[n++] = b;
            cp[b] = 256u + (unsigned)extra++;
        }
}

static size_t put_cp(char *o, unsigned c)
{
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    o[0] = (char)(0xc0 | (c >> 6));
    o[1] = (char)(0x80 | (c & 0x3f));
    return 2;
}

struct set { /* open-addressing set of token strings -> id */
    char **keys;
    int64_t *ids;
    size_t cap;
};

static uint64_t hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 0x100000001b3ull;
    return h;
}

static int64_t set_find(const struct set *st, const char *s)
{
    for (size_t i = hash(s) & (st->cap - 1);; i = (i + 1) & (st->cap - 1)) {
        if (!st->keys[i])
            return -1;
        if (strcmp(st->keys[i], s) == 0)
            return st->ids[i];
    }
}

static void set_add(struct set *st, char *s, int64_t id)
{
    size_t i = hash(s) & (st->cap - 1);
    while (st->keys[i])
        i = (i + 1) & (st->cap - 1);
    st->keys[i] = s;
    st->ids[i] = id;
}

static int set_init(struct set *st, int64_t n)
{
    st->cap = 1024;
    while (st->cap < (size_t)n * 2)
        st->cap *= 2;
    st->keys = calloc(st->cap, sizeof(char *));
    st->ids = calloc(st->cap, sizeof(int64_t));
    return st->keys && st->ids ? 0 : -ENOMEM;
}

static void set_free(struct set *st)
{
    free(st->keys);
    free(st->ids);
}

void sil_mk_vocab_free(struct sil_mk_vocab *v)
{
    for (int64_t i = 0; v->tokens && i < v->n; i++)
        free(v->tokens[i]);
    for (int64_t i = 0; v->merges && i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    memset(v, 0, sizeof(*v));
}

static int vocab_alloc(struct sil_mk_vocab *v, int64_t n, int64_t n_merges)
{
    memset(v, 0, sizeof(*v));
    v->tokens = calloc((size_t)n, sizeof(char *));
    v->types = calloc((size_t)n, sizeof(int32_t));
    v->merges = calloc((size_t)(n_merges ? n_merges : 1), sizeof(char *));
    if (!v->tokens || !v->types || !v->merges)
        return -ENOMEM;
    v->n = n;
    snprintf(v->pre, sizeof(v->pre), "qwen2");
    return 0;
}

static char *concat(const char *a, const char *b, char sep)
{
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 2);
    if (!s)
        return NULL;
    memcpy(s, a, la);
    size_t o = la;
    if (sep)
        s[o++] = sep;
    memcpy(s + o, b, lb + 1);
    return s;
}

/* Built-in text the first merges are learned from, so common English and C pieces are single
 * tokens and synthetic prompts tokenize roughly like real ones. */
static const char corpus[] =
    "The quick brown fox jumps over the lazy dog. A model that runs on the machine you already own "
    "is a model you can use every day. The daemon keeps the model in memory and the clients talk to "
    "it over a socket. It is the user who asks and the model that answers; the answer is streamed "
    "token by token, and the tokens are decoded into text as they arrive. When the question is "
    "long, the prompt is processed in chunks, and the cache keeps what was computed for the next "
    "turn of the conversation. There are experts in every layer, and the router picks the ones "
    "that fit the token best. The most popular experts stay resident, the others are read from "
    "memory when they are needed. This is the reason why the first token takes longer than the "
    "rest: nothing is in the cache yet. Hello, how are you? I am fine, thank you, and you? What "
    "time is it? It is ten past nine in the morning, and the weather is nice today.\n"
    "int main(int argc, char **argv)\n{\n    for (int i = 0; i < argc; i++) {\n        printf(\"%s\\n\", "
    "argv[i]);\n    }\n    return 0;\n}\n"
    "static int read_file(const char *path, struct buffer *out)\n{\n    int fd = open(path, O_RDONLY);\n"
    "    if (fd < 0)\n        return -errno;\n    struct stat st;\n    if (fstat(fd, &st) != 0) {\n"
    "        close(fd);\n        return -errno;\n    }\n    return 0;\n}\n"
    "def main():\n    for line in open('data.txt'):\n        print(line.strip())\n\nif __name__ == "
    "'__main__':\n    main()\n"
    "1 2 3 4 5 6 7 8 9 10 100 1000 2024 3.14 0.5 -1 +1 = == != <= >= && || -> :: ... // /* */ # ## "
    "Yes. No. Maybe. Thanks! Sure, here is the answer: the sum of 2 and 2 is 4. ";

struct word {
    int64_t *ids;
    int n, count;
};

/* Pre-split like the Qwen regex does, roughly: letters with one leading non-letter, single
 * digits, punctuation runs with an optional leading space, whitespace runs. */
static int split_words(const char *text, struct word **out, int *n_out)
{
    int cap = 0, n = 0;
    struct word *w = NULL;
    const char *p = text;
    while (*p) {
        const char *s = p;
#define ALPHA(c) (((c) | 32) >= 'a' && ((c) | 32) <= 'z')
#define DIGIT(c) ((c) >= '0' && (c) <= '9')
#define SPACE(c) ((c) == ' ' || (c) == '\n' || (c) == '\t')
        if (ALPHA(*p) || (!DIGIT(*p) && *p != '\n' && ALPHA(p[1]))) {
            p++;
            while (ALPHA(*p))
                p++;
        } else if (DIGIT(*p)) {
            p++;
        } else if (SPACE(*p)) {
            while (SPACE(*p) && !(*p == ' ' && !SPACE(p[1]) && p[1]))
                p++;
            if (p == s)
                p++;
        } else {
            if (*p == ' ')
                p++;
            while (*p && !ALPHA(*p) && !DIGIT(*p) && !SPACE(*p))
                p++;
            if (p == s)
                p++;
        }
#undef ALPHA
#undef DIGIT
#undef SPACE
        int len = (int)(p - s);
        int found = -1;
        for (int i = 0; i < n && found < 0; i++)
            if (w[i].n == len) {
                found = i;
                for (int j = 0; j < len; j++)
                    if (w[i].ids[j] != (unsigned char)s[j]) {
                        found = -1;
                        break;
                    }
            }
        if (found >= 0) {
            w[found].count++;
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 256;
            struct word *nw = realloc(w, (size_t)cap * sizeof(*w));
            if (!nw)
                goto oom;
            w = nw;
        }
        w[n].ids = malloc((size_t)len * sizeof(int64_t));
        if (!w[n].ids)
            goto oom;
        for (int j = 0; j < len; j++)
            w[n].ids[j] = (unsigned char)s[j]; /* raw bytes for now; mapped to ids by the caller */
        w[n].n = len;
        w[n].count = 1;
        n++;
    }
    *out = w;
    *n_out = n;
    return 0;
oom:
    for (int i = 0; i < n; i++)
        free(w[i].ids);
    free(w);
    return -ENOMEM;
}

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9e3779b97f4a7c15ull;
    uint64_t x = *s;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Adds the merge a+b and, if the result is new, the token as id `id`. Returns 0 (new token),
 * 1 (the token existed; with `merged` set, the merge is still recorded), or -ENOMEM. */
static int add_merge(struct sil_mk_vocab *v, struct set *st, int64_t id, int64_t a, int64_t b,
                     int64_t *merged)
{
    char *tok = concat(v->tokens[a], v->tokens[b], 0);
    if (!tok)
        return -ENOMEM;
    int64_t have = set_find(st, tok);
    if (have >= 0 && !merged) {
        free(tok);
        return 1;
    }
    char *mg = concat(v->tokens[a], v->tokens[b], ' ');
    if (!mg) {
        free(tok);
        return -ENOMEM;
    }
    v->merges[v->n_merges++] = mg;
    if (have >= 0) {
        free(tok);
        *merged = have;
        return 1;
    }
    v->tokens[id] = tok;
    v->types[id] = 1;
    set_add(st, tok, id);
    if (merged)
        *merged = id;
    return 0;
}

struct pair {
    int64_t a, b;
    int count;
};

static int cmp_pair(const void *x, const void *y)
{
    const struct pair *p = x, *q = y;
    if (p->a != q->a)
        return p->a < q->a ? -1 : 1;
    if (p->b != q->b)
        return p->b < q->b ? -1 : 1;
    return 0;
}

int sil_mk_vocab_synthetic(struct sil_mk_vocab *v, int64_t n, uint64_t seed, struct sil_error *err)
{
    if (n < 256 + N_SPECIAL)
        return sil_errorf(err, -EINVAL, "--vocab %lld: need at least %d tokens", (long long)n, 256 + N_SPECIAL);
    int64_t n_bpe = n - N_SPECIAL;
    struct set st = {0};
    struct word *words = NULL;
    int n_words = 0, rc;
    if (vocab_alloc(v, n, n_bpe - 256 + (int64_t)sizeof(corpus)) || set_init(&st, n))
        goto oom;

    int order[256];
    unsigned cp[256];
    int64_t byte_id[256];
    byte_symbols(order, cp);
    for (int i = 0; i < 256; i++) {
        char s[4];
        size_t l = put_cp(s, cp[order[i]]);
        s[l] = 0;
        if (!(v->tokens[i] = strdup(s)))
            goto oom;
        v->types[i] = 1;
        byte_id[order[i]] = i;
        set_add(&st, v->tokens[i], i);
    }

    int64_t id = 256;
    /* 1) merges learned from the built-in text: repeatedly merge the most frequent pair */
    if (split_words(corpus, &words, &n_words))
        goto oom;
    for (int i = 0; i < n_words; i++)
        for (int j = 0; j < words[i].n; j++)
            words[i].ids[j] = byte_id[words[i].ids[j]];
    struct pair *pairs = NULL;
    size_t pcap = 0;
    for (int i = 0; i < n_words; i++)
        pcap += (size_t)words[i].n;
    pairs = malloc((pcap ? pcap : 1) * sizeof(*pairs));
    if (!pairs)
        goto oom;
    while (id < n_bpe) {
        size_t np = 0;
        for (int i = 0; i < n_words; i++)
            for (int j = 0; j + 1 < words[i].n; j++)
                pairs[np++] = (struct pair){words[i].ids[j], words[i].ids[j + 1], words[i].count};
        qsort(pairs, np, sizeof(*pairs), cmp_pair);
        int64_t best_a = -1, best_b = -1;
        int best = 1; /* a pair seen once teaches nothing */
        for (size_t i = 0; i < np;) {
            size_t j = i;
            int c = 0;
            for (; j < np && pairs[j].a == pairs[i].a && pairs[j].b == pairs[i].b; j++)
                c += pairs[j].count;
            if (c > best) {
                best = c;
                best_a = pairs[i].a;
                best_b = pairs[i].b;
            }
            i = j;
        }
        if (best_a < 0)
            break;
        int64_t merged;
        rc = add_merge(v, &st, id, best_a, best_b, &merged);
        if (rc < 0) {
            free(pairs);
            goto oom;
        }
        if (rc == 0)
            id++;
        for (int i = 0; i < n_words; i++) {
            int o = 0;
            for (int j = 0; j < words[i].n; j++) {
                if (j + 1 < words[i].n && words[i].ids[j] == best_a && words[i].ids[j + 1] == best_b) {
                    words[i].ids[o++] = merged;
                    j++;
                } else {
                    words[i].ids[o++] = words[i].ids[j];
                }
            }
            words[i].n = o;
        }
    }
    free(pairs);
    /* 2) seeded random merges of existing tokens, kept short */
    uint64_t s = seed ^ 0x70c3ull;
    int64_t tries = 0;
    while (id < n_bpe) {
        if (++tries > 64 * n) {
            rc = sil_errorf(err, -EINVAL, "--vocab %lld: could not make enough distinct merges", (long long)n);
            goto fail;
        }
        int64_t a = (int64_t)(rng_next(&s) % (uint64_t)id), b = (int64_t)(rng_next(&s) % (uint64_t)id);
        if (strlen(v->tokens[a]) + strlen(v->tokens[b]) > 24)
            continue;
        rc = add_merge(v, &st, id, a, b, NULL);
        if (rc < 0)
            goto oom;
        if (rc == 0)
            id++;
    }
    for (int i = 0; i < N_SPECIAL; i++) {
        if (!(v->tokens[n_bpe + i] = strdup(specials[i])))
            goto oom;
        v->types[n_bpe + i] = special_types[i];
    }
    v->bos = v->pad = n_bpe;
    v->eos = n_bpe + 2;
    for (int i = 0; i < n_words; i++)
        free(words[i].ids);
    free(words);
    set_free(&st);
    return 0;
oom:
    rc = sil_errorf(err, -ENOMEM, "vocab: out of memory");
fail:
    for (int i = 0; i < n_words; i++)
        free(words[i].ids);
    free(words);
    set_free(&st);
    sil_mk_vocab_free(v);
    return rc;
}

int sil_mk_vocab_from_hf(struct sil_mk_vocab *v, const char *path, int64_t pad_to, struct sil_error *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sil_errorf(err, -errno, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || sb.st_size <= 0) {
        close(fd);
        return sil_errorf(err, -EINVAL, "%s: empty or unreadable", path);
    }
    size_t len = (size_t)sb.st_size;
    void *map = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return sil_errorf(err, -errno, "%s: mmap: %s", path, strerror(errno));
    struct sil_json_doc *doc = NULL;
    int rc = sil_json_parse(&doc, map, len, path, err);
    munmap(map, len);
    if (rc)
        return rc;

    const struct sil_json *root = sil_json_root(doc);
    const struct sil_json *model = sil_json_get(root, "model");
    const struct sil_json *type = sil_json_get(model, "type");
    const struct sil_json *vocab = sil_json_get(model, "vocab");
    const struct sil_json *merges = sil_json_get(model, "merges");
    const struct sil_json *added = sil_json_get(root, "added_tokens");
    if (!type || type->type != SIL_JSON_STR || strcmp(type->str, "BPE") != 0) {
        rc = sil_errorf(err, -EINVAL, "%s: model.type is not \"BPE\"", path);
        goto out;
    }
    if (!vocab || vocab->type != SIL_JSON_OBJ || !merges || merges->type != SIL_JSON_ARR) {
        rc = sil_errorf(err, -EINVAL, "%s: model.vocab (object) or model.merges (array) missing", path);
        goto out;
    }
    int64_t max_id = -1;
    for (int pass = 0; pass < 2; pass++) {
        const struct sil_json *list = pass ? added : vocab;
        if (!list)
            continue;
        if (list->type != (pass ? SIL_JSON_ARR : SIL_JSON_OBJ)) {
            rc = sil_errorf(err, -EINVAL, "%s: %s has the wrong type", path, pass ? "added_tokens" : "model.vocab");
            goto out;
        }
        for (const struct sil_json *e = list->child; e; e = e->next) {
            const struct sil_json *idv = pass ? sil_json_get(e, "id") : e;
            if (!idv || idv->type != SIL_JSON_NUM || idv->num < 0 || idv->num >= (1 << 24) ||
                idv->num != (double)(int64_t)idv->num) {
                rc = sil_errorf(err, -EINVAL, "%s: bad token id in %s", path, pass ? "added_tokens" : "model.vocab");
                goto out;
            }
            if ((int64_t)idv->num > max_id)
                max_id = (int64_t)idv->num;
        }
    }
    int64_t n = max_id + 1 > pad_to ? max_id + 1 : pad_to;
    if (n < 1) {
        rc = sil_errorf(err, -EINVAL, "%s: empty vocab", path);
        goto out;
    }
    if (vocab_alloc(v, n, merges->n_children))
        goto oom;
    for (const struct sil_json *e = vocab->child; e; e = e->next) {
        int64_t id = (int64_t)e->num;
        free(v->tokens[id]);
        if (!(v->tokens[id] = strdup(e->key)))
            goto oom;
        v->types[id] = 1;
    }
    for (const struct sil_json *e = added ? added->child : NULL; e; e = e->next) {
        const struct sil_json *c = sil_json_get(e, "content"), *sp = sil_json_get(e, "special");
        if (!c || c->type != SIL_JSON_STR) {
            rc = sil_errorf(err, -EINVAL, "%s: added token without content", path);
            goto out;
        }
        int64_t id = (int64_t)sil_json_get(e, "id")->num;
        free(v->tokens[id]);
        if (!(v->tokens[id] = strdup(c->str)))
            goto oom;
        v->types[id] = sp && sp->type == SIL_JSON_BOOL && sp->b ? 3 : 4;
    }
    for (int64_t i = 0; i < n; i++)
        if (!v->tokens[i]) {
            char pad[32];
            snprintf(pad, sizeof(pad), "[PAD%lld]", (long long)i);
            if (!(v->tokens[i] = strdup(pad)))
                goto oom;
            v->types[i] = 5;
        }
    for (const struct sil_json *e = merges->child; e; e = e->next) {
        char *mg = NULL;
        if (e->type == SIL_JSON_STR) {
            mg = strdup(e->str);
        } else if (e->type == SIL_JSON_ARR && e->n_children == 2 && e->child->type == SIL_JSON_STR &&
                   e->child->next->type == SIL_JSON_STR) {
            mg = concat(e->child->str, e->child->next->str, ' ');
        } else {
            rc = sil_errorf(err, -EINVAL, "%s: merge %lld is neither \"a b\" nor [\"a\", \"b\"]", path,
                            (long long)v->n_merges);
            goto out;
        }
        if (!mg)
            goto oom;
        v->merges[v->n_merges++] = mg;
    }
    v->bos = v->pad = v->eos = 0;
    for (int64_t i = 0; i < n; i++) {
        if (strcmp(v->tokens[i], "<|endoftext|>") == 0)
            v->bos = v->pad = i;
    }
    v->eos = v->bos;
    for (int64_t i = 0; i < n; i++)
        if (strcmp(v->tokens[i], "<|im_end|>") == 0)
            v->eos = i;
    rc = 0;
    goto out;
oom:
    rc = sil_errorf(err, -ENOMEM, "%s: out of memory", path);
out:
    if (rc)
        sil_mk_vocab_free(v);
    sil_json_free(doc);
    return rc;
}
