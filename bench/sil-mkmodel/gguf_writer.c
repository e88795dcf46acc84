/* Streaming GGUF v3 writer. All sizes are known up front, so the header (metadata and tensor
 * table with final offsets) is written first; then the tensors are generated and quantized chunk
 * by chunk (a fixed number of rows) by up to SIL_MK_MAX_THREADS threads, each into its own
 * fixed buffer, and written strictly in file order. Memory stays bounded by the vocab plus one
 * chunk a thread, whatever the model size. The file is written as PATH.tmp and renamed when
 * complete. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench/sil-mkmodel/mkmodel.h"
#include "kernels/cpu/quants.h"

#define ALIGN 32
#define CHUNK_ELEMS (1 << 20) /* floats generated per chunk (4 MiB) */

struct buf {
    uint8_t *p;
    size_t len, cap;
    int err;
};

static void put(struct buf *b, const void *data, size_t n)
{
    if (b->err)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            b->err = -ENOMEM;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
}

static void put_u32(struct buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(struct buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(struct buf *b, const char *s)
{
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}

struct kvs {
    struct buf b;
    uint64_t n;
    const char *arch;
};

static void key(struct kvs *k, const char *name, uint32_t vtype)
{
    k->n++;
    put_str(&k->b, name);
    put_u32(&k->b, vtype);
}

/* "%s" in a key is the architecture name. */
static void akey(struct kvs *k, const char *fmt, uint32_t vtype)
{
    char name[128];
    snprintf(name, sizeof(name), "%s.%s", k->arch, fmt);
    key(k, name, vtype);
}

static void kv_u32(struct kvs *k, const char *suffix, int64_t v)
{
    akey(k, suffix, 4);
    put_u32(&k->b, (uint32_t)v);
}

static void kv_f32(struct kvs *k, const char *suffix, float v)
{
    akey(k, suffix, 6);
    put(&k->b, &v, 4);
}

static void kv_str(struct kvs *k, const char *name, const char *v)
{
    key(k, name, 8);
    put_str(&k->b, v);
}

static const char chat_template[] =
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + message.content + "
    "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' "
    "}}{%- endif %}";

static void build_kv(struct kvs *k, const struct sil_mk_model *m)
{
    const struct sil_mk_hparams *hp = &m->hp;
    const struct sil_mk_vocab *v = &m->vocab;
    const bool moe = sil_mk_arch_is_moe(hp->arch), hybrid = sil_mk_arch_is_hybrid(hp->arch);

    kv_str(k, "general.architecture", k->arch);
    kv_str(k, "general.type", "model");
    kv_str(k, "general.name", m->name ? m->name : "sil-mkmodel synthetic");
    kv_u32(k, "block_count", hp->n_layer + hp->n_nextn); /* the MTP layers count as blocks */
    if (hp->n_nextn > 0) kv_u32(k, "nextn_predict_layers", hp->n_nextn);
    kv_u32(k, "context_length", hp->n_ctx_train);
    kv_u32(k, "embedding_length", hp->n_embd);
    if (!moe || hp->arch == SIL_MK_QWEN3MOE)
        kv_u32(k, "feed_forward_length", hp->n_ff); /* qwen3moe: the config's dense size */
    kv_u32(k, "attention.head_count", hp->n_head);
    kv_u32(k, "attention.head_count_kv", hp->n_head_kv);
    if (hybrid) {
        /* interleaved M-RoPE sections (text positions use them as plain NeoX rope) */
        int64_t half = (int64_t)lroundf(hp->rope_partial * (float)hp->head_dim) / 2;
        int64_t s0 = (half + 2) / 3, s2 = half - 2 * s0;
        akey(k, "rope.dimension_sections", 9);
        put_u32(&k->b, 5);
        put_u64(&k->b, 4);
        int32_t sec[4] = {(int32_t)s0, (int32_t)s0, (int32_t)s2, 0};
        put(&k->b, sec, sizeof(sec));
    }
    kv_f32(k, "rope.freq_base", hp->rope_base);
    kv_f32(k, "attention.layer_norm_rms_epsilon", hp->rms_eps);
    if (moe) {
        kv_u32(k, "expert_count", hp->n_expert);
        kv_u32(k, "expert_used_count", hp->n_expert_used);
    }
    kv_u32(k, "attention.key_length", hp->head_dim);
    kv_u32(k, "attention.value_length", hp->head_dim);
    key(k, "general.file_type", 4);
    put_u32(&k->b, sil_mk_recipe_file_type(m->recipe));
    if (moe) {
        kv_u32(k, "expert_feed_forward_length", hp->n_ff_exp);
        if (hp->arch == SIL_MK_QWEN35MOE)
            kv_u32(k, "expert_shared_feed_forward_length", hp->n_ff_shexp);
    }
    if (hybrid) {
        kv_u32(k, "ssm.conv_kernel", hp->ssm_d_conv);
        kv_u32(k, "ssm.state_size", hp->ssm_d_state);
        kv_u32(k, "ssm.group_count", hp->ssm_n_group);
        kv_u32(k, "ssm.time_step_rank", hp->ssm_dt_rank);
        kv_u32(k, "ssm.inner_size", hp->ssm_d_state * hp->ssm_dt_rank);
        kv_u32(k, "full_attention_interval", hp->full_attn_interval);
        kv_u32(k, "rope.dimension_count", (int64_t)lroundf(hp->rope_partial * (float)hp->head_dim));
    } else if (hp->rope_partial < 1.0f) {
        kv_u32(k, "rope.dimension_count", (int64_t)lroundf(hp->rope_partial * (float)hp->head_dim));
    }
    key(k, "general.quantization_version", 4);
    put_u32(&k->b, 2);

    kv_str(k, "tokenizer.ggml.model", "gpt2");
    kv_str(k, "tokenizer.ggml.pre", v->pre);
    key(k, "tokenizer.ggml.tokens", 9);
    put_u32(&k->b, 8);
    put_u64(&k->b, (uint64_t)v->n);
    for (int64_t i = 0; i < v->n; i++)
        put_str(&k->b, v->tokens[i]);
    key(k, "tokenizer.ggml.token_type", 9);
    put_u32(&k->b, 5);
    put_u64(&k->b, (uint64_t)v->n);
    put(&k->b, v->types, (size_t)v->n * 4);
    key(k, "tokenizer.ggml.merges", 9);
    put_u32(&k->b, 8);
    put_u64(&k->b, (uint64_t)v->n_merges);
    for (int64_t i = 0; i < v->n_merges; i++)
        put_str(&k->b, v->merges[i]);
    key(k, "tokenizer.ggml.eos_token_id", 4);
    put_u32(&k->b, (uint32_t)v->eos);
    key(k, "tokenizer.ggml.padding_token_id", 4);
    put_u32(&k->b, (uint32_t)v->pad);
    key(k, "tokenizer.ggml.bos_token_id", 4);
    put_u32(&k->b, (uint32_t)v->bos);
    key(k, "tokenizer.ggml.add_bos_token", 7);
    uint8_t f = 0;
    put(&k->b, &f, 1);
    kv_str(k, "tokenizer.chat_template", chat_template);
}

/* ---- streaming ---------------------------------------------------------------------------- */

struct chunk {
    int64_t tensor, row0, rows;
};

struct writer {
    struct sil_mk_model *m;
    int fd;
    struct chunk *chunks;
    int64_t n_chunks;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t next_write; /* chunk index whose turn it is to be written */
    int n_threads;      /* workers: worker i makes chunks i, i + n_threads, ...; 0 until known */
    int err;            /* first error, -errno */
    char errmsg[256];
    uint64_t written, total;
    bool progress, tty;
    struct timespec t0, last;
};

static double secs(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) + 1e-9 * (double)(b->tv_nsec - a->tv_nsec);
}

static int write_all(int fd, const void *p, size_t n)
{
    const uint8_t *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

static void report(struct writer *w, bool final)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (!final && secs(&w->last, &now) < (w->tty ? 0.5 : 10.0))
        return;
    w->last = now;
    double el = secs(&w->t0, &now), gib = 1024.0 * 1024.0 * 1024.0;
    double rate = el > 0 ? (double)w->written / el : 0;
    double eta = rate > 0 ? (double)(w->total - w->written) / rate : 0;
    fprintf(stderr, "%ssil-mkmodel: %.2f / %.2f GiB (%3.0f%%) %6.1f MiB/s, %4.0fs elapsed, ETA %4.0fs%s",
            w->tty ? "\r" : "", (double)w->written / gib, (double)w->total / gib,
            w->total ? 100.0 * (double)w->written / (double)w->total : 100.0, rate / (1024.0 * 1024.0),
            el, eta, w->tty && !final ? "" : "\n");
}

static void writer_fail(struct writer *w, int code, const char *msg)
{
    pthread_mutex_lock(&w->mu);
    if (!w->err) {
        w->err = code;
        snprintf(w->errmsg, sizeof(w->errmsg), "%s", msg);
    }
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void convert_row(const struct sil_mk_model *m, int type, const float *x, void *y, int64_t n)
{
    if (!m->exact_quant && sil_mk_fast_quantize_row(type, x, y, n))
        return;
    if (type == SIL_TYPE_F32) {
        memcpy(y, x, (size_t)n * sizeof(float));
    } else if (type == SIL_TYPE_F16) {
        uint16_t *h = y;
        for (int64_t i = 0; i < n; i++)
            h[i] = sil_fp32_to_fp16(x[i]);
    } else if (type == SIL_TYPE_BF16) {
        uint16_t *h = y;
        for (int64_t i = 0; i < n; i++)
            h[i] = sil_fp32_to_bf16(x[i]);
    } else {
        sil_quantize_row_ref(type, x, y, n);
    }
}

struct worker_arg {
    struct writer *w;
    int id;
};

static void *worker(void *p)
{
    struct worker_arg *a = p;
    struct writer *w = a->w;
    /* the number of workers is known once all have been started */
    pthread_mutex_lock(&w->mu);
    while (w->n_threads == 0)
        pthread_cond_wait(&w->cv, &w->mu);
    const int n_threads = w->n_threads;
    pthread_mutex_unlock(&w->mu);
    if (a->id >= n_threads) return NULL;
    const struct sil_mk_model *m = w->m;
    size_t max_row_bytes = 0;
    int64_t max_ne0 = 0;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        size_t rs = sil_row_size(m->tensors[i].type, m->tensors[i].ne[0]);
        if (rs > max_row_bytes)
            max_row_bytes = rs;
        if (m->tensors[i].ne[0] > max_ne0)
            max_ne0 = m->tensors[i].ne[0];
    }
    float *row = malloc((size_t)max_ne0 * sizeof(float));
    /* A chunk holds max(1, CHUNK_ELEMS / ne0) rows and no type takes more than 4 bytes an element. */
    size_t out_cap = CHUNK_ELEMS * sizeof(float);
    if (out_cap < max_row_bytes)
        out_cap = max_row_bytes;
    uint8_t *out = malloc(out_cap + ALIGN);
    static const uint8_t zeros[ALIGN];
    if (!row || !out) {
        writer_fail(w, -ENOMEM, "out of memory for chunk buffers");
        goto done;
    }
    for (int64_t c = a->id; c < w->n_chunks; c += n_threads) {
        const struct chunk *ch = &w->chunks[c];
        const struct sil_mk_tensor *t = &m->tensors[ch->tensor];
        size_t rs = sil_row_size(t->type, t->ne[0]), len = 0;
        for (int64_t r = 0; r < ch->rows; r++) {
            if (w->err)
                goto done;
            sil_mk_gen_row(m, t, ch->row0 + r, row);
            convert_row(m, t->type, row, out + len, t->ne[0]);
            len += rs;
        }
        /* after a tensor's last chunk comes the padding up to the next tensor's offset */
        size_t pad = 0;
        if (ch->row0 + ch->rows == t->ne[1] * t->ne[2] * t->ne[3])
            pad = (size_t)((ALIGN - (t->offset + t->nbytes) % ALIGN) % ALIGN);

        pthread_mutex_lock(&w->mu);
        while (w->next_write != c && !w->err)
            pthread_cond_wait(&w->cv, &w->mu);
        int err = w->err;
        pthread_mutex_unlock(&w->mu);
        if (err)
            goto done;
        int rc = write_all(w->fd, out, len);
        if (!rc && pad)
            rc = write_all(w->fd, zeros, pad);
        if (rc) {
            char msg[160];
            snprintf(msg, sizeof(msg), "write failed in tensor '%s': %s", t->name, strerror(-rc));
            writer_fail(w, rc, msg);
            goto done;
        }
        pthread_mutex_lock(&w->mu);
        w->next_write = c + 1;
        w->written += len + pad;
        if (w->progress)
            report(w, false);
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
    }
done:
    free(row);
    free(out);
    return NULL;
}

int sil_mk_write(struct sil_mk_model *m, const char *path, int threads, bool progress,
                 struct sil_error *err)
{
    struct kvs k = {.arch = sil_mk_arch_name(m->hp.arch)};
    struct buf ti = {0}, hdr = {0};
    struct writer w = {.m = m, .fd = -1, .progress = progress};
    char tmp[4096];
    int rc = 0;

    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return sil_errorf(err, -ENAMETOOLONG, "%s: path too long", path);
    for (int64_t i = 0; i < m->n_tensors; i++) {
        const struct sil_mk_tensor *t = &m->tensors[i];
        const struct sil_type_traits *tr = sil_type_traits(t->type);
        bool ours = t->type == SIL_TYPE_F32 || t->type == SIL_TYPE_F16 || t->type == SIL_TYPE_BF16;
        if (!ours && (!tr || !tr->from_float_ref))
            return sil_errorf(err, -ENOTSUP, "%s: no quantizer for type %s", t->name, sil_type_name(t->type));
    }

    build_kv(&k, m);
    uint64_t off = 0;
    for (int64_t i = 0; i < m->n_tensors; i++) {
        struct sil_mk_tensor *t = &m->tensors[i];
        t->offset = off;
        off += (t->nbytes + ALIGN - 1) / ALIGN * ALIGN;
        put_str(&ti, t->name);
        put_u32(&ti, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            put_u64(&ti, (uint64_t)t->ne[d]);
        put_u32(&ti, (uint32_t)t->type);
        put_u64(&ti, t->offset);
    }
    put(&hdr, "GGUF", 4);
    put_u32(&hdr, 3);
    put_u64(&hdr, (uint64_t)m->n_tensors);
    put_u64(&hdr, k.n);
    put(&hdr, k.b.p, k.b.len);
    put(&hdr, ti.p, ti.len);
    while (hdr.len % ALIGN)
        put(&hdr, "", 1);
    if (k.b.err || ti.err || hdr.err) {
        rc = sil_errorf(err, -ENOMEM, "%s: out of memory building the header", path);
        goto out;
    }

    /* chunks: whole rows, about CHUNK_ELEMS elements each */
    for (int pass = 0; pass < 2; pass++) {
        int64_t n = 0;
        for (int64_t i = 0; i < m->n_tensors; i++) {
            const struct sil_mk_tensor *t = &m->tensors[i];
            int64_t rows = t->ne[1] * t->ne[2] * t->ne[3];
            int64_t per = CHUNK_ELEMS / t->ne[0] > 0 ? CHUNK_ELEMS / t->ne[0] : 1;
            for (int64_t r = 0; r < rows; r += per, n++)
                if (pass)
                    w.chunks[n] = (struct chunk){i, r, rows - r < per ? rows - r : per};
        }
        if (!pass) {
            w.n_chunks = n;
            w.chunks = calloc((size_t)(n ? n : 1), sizeof(*w.chunks));
            if (!w.chunks) {
                rc = sil_errorf(err, -ENOMEM, "out of memory");
                goto out;
            }
        }
    }

    w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.fd < 0) {
        rc = sil_errorf(err, -errno, "%s: %s", tmp, strerror(errno));
        goto out;
    }
    rc = write_all(w.fd, hdr.p, hdr.len);
    if (rc) {
        sil_errorf(err, rc, "%s: writing the header: %s", tmp, strerror(-rc));
        goto out;
    }

    w.total = hdr.len + off;
    w.written = hdr.len;
    w.tty = isatty(2);
    clock_gettime(CLOCK_MONOTONIC, &w.t0);
    w.last = w.t0;
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    if (threads < 1)
        threads = 1;
    if (threads > SIL_MK_MAX_THREADS) threads = SIL_MK_MAX_THREADS;
    /* never more threads than chunks; a thread that cannot start makes the others fewer */
    if ((int64_t)threads > w.n_chunks) threads = w.n_chunks > 0 ? (int)w.n_chunks : 1;
    struct worker_arg args[SIL_MK_MAX_THREADS];
    pthread_t th[SIL_MK_MAX_THREADS];
    int started = 1;
    for (int i = 0; i < threads; i++)
        args[i] = (struct worker_arg){&w, i};
    while (started < threads && pthread_create(&th[started], NULL, worker, &args[started]) == 0)
        started++;
    pthread_mutex_lock(&w.mu);
    w.n_threads = started; /* the main thread is worker 0 */
    pthread_cond_broadcast(&w.cv);
    pthread_mutex_unlock(&w.mu);
    worker(&args[0]);
    for (int i = 1; i < started; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    if (w.err) {
        rc = sil_errorf(err, w.err, "%s: %s", tmp, w.errmsg);
        goto out;
    }
    if (progress)
        report(&w, true);
    if (close(w.fd) != 0) {
        w.fd = -1;
        rc = sil_errorf(err, -errno, "%s: close: %s", tmp, strerror(errno));
        goto out;
    }
    w.fd = -1;
    if (rename(tmp, path) != 0)
        rc = sil_errorf(err, -errno, "rename %s -> %s: %s", tmp, path, strerror(errno));
out:
    if (w.fd >= 0)
        close(w.fd);
    if (rc)
        unlink(tmp);
    free(w.chunks);
    free(k.b.p);
    free(ti.p);
    free(hdr.p);
    return rc;
}
