/* The CUDA backend's passes: a ubatch's inputs staged in pinned memory at begin(), its shape
 * matched to a graph (eager, then captured, then replayed), segmented passes cut where the host
 * routes a MoE layer, and the head, which ends the pass: logits or argmax, the graph launched,
 * the rows copied back. With SIL_CUDA_PROFILE, the per-kernel table of one pass. */
#ifdef SIL_HAVE_CUDA

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "daemon/engine/backend_cuda_impl.h"
#include "kernels/vec.h"

/* The ubatch's int32 inputs into pinned memory: positions, sequences, runs and their sequences,
 * and the rows that want logits (in order: what the forward pass keeps for the head). */
void sil_cb_stage(struct cuda_backend *b, const struct sil_ubatch *ub, int32_t *n_keep)
{
    memcpy(b->h_pos, ub->pos, sizeof(int32_t) * (size_t)ub->n);
    memcpy(b->h_seq, ub->seq, sizeof(int32_t) * (size_t)ub->n);
    memcpy(b->h_run_start, ub->run_start, sizeof(int32_t) * (size_t)(ub->n_runs + 1));
    for (int32_t r = 0; r < ub->n_runs; r++)
        b->h_run_seq[r] = ub->seq[ub->run_start[r]];
    int32_t j = 0;
    for (int32_t i = 0; i < ub->n; i++)
        if (ub->out_row[i] >= 0) b->h_keep[j++] = i;
    *n_keep = j;
    /* rows of kept windows, in order from their start, to the capture of their delta-net
     * inputs (keep_in's row slot * MB + r): a row out of order or in a tree ends the window's
     * capture (its cut then evaluates the rows again); rows past the first MB are not taken */
    b->n_cap = 0;
    for (int32_t i = 0; i < ub->n; i++) {
        b->h_cap[i] = -1;
        for (int32_t k = 0; b->keep_l && k < (int32_t)b->c.keep_states; k++) {
            if (b->keep_owner[k] != ub->seq[i] || b->keep_rows[k] < 0) continue;
            const int64_t r = (int64_t)ub->pos[i] - b->keep_pos[k];
            if (!ub->tree && r == b->keep_rows[k] && r < MB) {
                b->h_cap[i] = k * MB + (int32_t)r;
                b->keep_rows[k]++;
                b->n_cap++;
            } else if (ub->tree || r < b->keep_rows[k] || b->keep_rows[k] < MB) {
                b->keep_rows[k] = -1;
            } /* else a row past the first MB: not captured, the first MB still are */
        }
    }
    /* the block tables of the ubatch's sequences; without the engine's, blocks in order */
    const int32_t bps = b->kv_bps, nb = b->kv_nb;
    for (int32_t r = 0; r < ub->n_runs && bps > 0; r++) {
        const int32_t s = b->h_run_seq[r];
        if (s < 0 || s >= b->c.n_seq_max) continue;
        int32_t *t = b->h_btab + (int64_t)s * bps;
        int32_t n = 0;
        const int32_t *tab = ub->kv ? sil_kv_seq_table(ub->kv, s, &n) : NULL;
        for (int32_t k = 0; k < bps; k++)
            t[k] = !ub->kv ? s * bps + k : k < n && tab[k] >= 0 && tab[k] < nb ? tab[k] : 0;
    }
}

void sil_cb_drop_segs(struct cuda_backend *b, struct graph_slot *g)
{
    for (int i = 0; i < g->n_seg; i++)
        sil_cuda_graph_destroy(b->cu, g->seg[i]);
    g->n_seg = 0;
}

void sil_cb_abort_capture(struct cuda_backend *b)
{
    if (b->mode != PASS_CAPTURE) return;
    if (!b->seg_gap) {
        struct sil_cuda_graph *g = NULL;
        struct sil_error e = {0};
        sil_cuda_capture_end(b->cu, NULL, &g, &e);
        sil_cuda_graph_destroy(b->cu, g);
    }
    b->mode = PASS_EAGER;
    b->seg_gap = false;
    if (b->cur) {
        b->cur->capturable = false;
        sil_cb_drop_segs(b, b->cur);
    }
    b->cur = NULL;
}

/* Segmented passes. At a host-routed layer, the segment up to its router's choices (copied to
 * pinned memory) ends: captured and launched, replayed, or (eager) just run; the host then
 * waits for the choices, plans, fills slots, uploads slot ids, and the next segment begins at
 * the layer's experts. */
void sil_cb_seg_end(struct cuda_backend *b)
{
    if (!b->segmented || b->seg_gap || b->rc) return;
    struct graph_slot *c = b->cur;
    if (b->mode == PASS_CAPTURE) {
        struct sil_cuda_graph *g = NULL;
        if (sil_vec_reserve(&c->seg, &c->cap_seg, (size_t)c->n_seg + 1, 64) < 0) {
            sil_cb_abort_capture(b);
            fail(b, -ENOMEM, "out of memory for graph segments");
            return;
        }
        b->seg_gap = true;
        if (!ok(b, sil_cuda_capture_end(b->cu, NULL, &g, &b->err))) {
            b->mode = PASS_EAGER;
            c->capturable = false;
            sil_cb_drop_segs(b, c);
            b->cur = NULL;
            b->segmented = false;
            b->seg_gap = false;
            return;
        }
        c->seg[c->n_seg++] = g;
        ok(b, sil_cuda_graph_launch(b->cu, g, NULL, &b->err));
    } else if (b->mode == PASS_REPLAY) {
        b->seg_gap = true;
        if (b->seg_i >= c->n_seg) {
            fail(b, -EINVAL, "a replayed pass has more segments than were captured");
            return;
        }
        ok(b, sil_cuda_graph_launch(b->cu, c->seg[b->seg_i], NULL, &b->err));
    } else {
        b->seg_gap = true;
    }
    b->seg_i++;
}

void sil_cb_seg_begin(struct cuda_backend *b)
{
    if (!b->seg_gap || b->rc) return; /* after an error no capture is open: sil_cb_abort_capture knows */
    b->seg_gap = false;
    if (b->mode != PASS_CAPTURE) return;
    struct sil_error e = {0};
    if (sil_cuda_capture_begin(b->cu, NULL, &e) < 0) {
        /* run the rest of this pass eagerly; the shape stays eager */
        b->mode = PASS_EAGER;
        b->cur->capturable = false;
        sil_cb_drop_segs(b, b->cur);
        b->cur = NULL;
        b->segmented = false;
    }
}

/* A decode-sized shape with no run starting a sequence (those reset state from the host) can
 * have a graph; it is matched on its rows, runs and kept rows. */
static struct graph_slot *shape_slot(struct cuda_backend *b, const struct sil_ubatch *ub,
                                     int32_t n_keep)
{
    if (!b->graphs || ub->layered || ub->n > MB || ub->n_runs > MB || ub->n_runs < 1 ||
        n_keep < 1)
        return NULL;
    for (int32_t r = 0; r < ub->n_runs; r++)
        if (ub->pos[ub->run_start[r]] == 0) return NULL;
    struct graph_slot *lru = &b->slots[0];
    for (int i = 0; i < N_GRAPHS; i++) {
        struct graph_slot *g = &b->slots[i];
        if (g->n == ub->n && g->n_runs == ub->n_runs && g->n_keep == n_keep &&
            g->head_out == ub->head_out && g->cap == (b->n_cap > 0) &&
            !memcmp(g->run_start, ub->run_start, sizeof(int32_t) * (size_t)(ub->n_runs + 1)) &&
            !memcmp(g->keep, b->h_keep, sizeof(int32_t) * (size_t)n_keep))
            return g;
        if (g->used < lru->used) lru = g;
    }
    sil_cuda_graph_destroy(b->cu, lru->g);
    sil_cb_drop_segs(b, lru);
    struct sil_cuda_graph **keep_seg = lru->seg;
    const size_t keep_cap = lru->cap_seg;
    memset(lru, 0, sizeof(*lru));
    lru->seg = keep_seg;
    lru->cap_seg = keep_cap;
    lru->n = ub->n;
    lru->n_runs = ub->n_runs;
    lru->n_keep = n_keep;
    lru->head_out = ub->head_out;
    lru->cap = b->n_cap > 0;
    memcpy(lru->run_start, ub->run_start, sizeof(int32_t) * (size_t)(ub->n_runs + 1));
    memcpy(lru->keep, b->h_keep, sizeof(int32_t) * (size_t)n_keep);
    return lru;
}

void sil_cb_begin(struct sil_backend *be, const struct sil_ubatch *ub)
{
    struct cuda_backend *b = cb(be);
    sil_cb_abort_capture(b); /* a pass that ended early (an error) */
    if (b->gev[0]) clock_gettime(CLOCK_MONOTONIC, &b->t_begin);
    b->meta_ok = false;
    b->q8_src = 0;
    b->mode = PASS_EAGER;
    b->cur = NULL;
    b->segmented = false;
    b->seg_gap = false;
    b->seg_i = 0;
    b->zc_pass = false;
    if (b->zc) memset(b->zc_rows, 0, sizeof(int32_t) * (size_t)b->c.n_layer);
    if (b->rc || ub->n <= 0 || ub->n > b->c.ub_max) return;
    /* the micro-batch before (layer by layer) may still be copying up from the staging */
    if (ub->layered && !ok(b, sil_cuda_sync(b->cu, NULL, &b->err))) return;
    int32_t n_keep = 0;
    sil_cb_stage(b, ub, &n_keep);
    b->meta_ok = true; /* staged; copied up by get_rows */
    /* path (b) for decode passes that end in logits (the choices come down with them) */
    b->zc_pass = b->zc && !ub->layered && ub->n <= MB && n_keep >= 1;
    if (b->zc_pass && b->es.dirty) {
        /* from pageable memory: the copy is taken before this returns, then ordered before
         * the pass on the stream */
        if (!ok(b, sil_cuda_slots_table_upload(&b->es, &b->err))) return;
        b->es.dirty = false;
    }
    if (b->prof_path && !b->prof_done &&
        (b->prof_rows > 1 ? ub->n == b->prof_rows : ub->n == 1 && ub->pos[0] >= 16)) {
        struct sil_error e = {0};
        b->profiling = sil_cuda_profile(b->cu, true, &e) == 0;
        b->prof_done = true;
        return; /* eager, every launch timed */
    }
    struct graph_slot *g = shape_slot(b, ub, n_keep);
    if (!g) return;
    g->used = ++b->clock;
    b->cur = g;
    b->segmented = b->es.n > 0 && !b->zc_pass;
    if (g->g || g->n_seg > 0) {
        b->mode = PASS_REPLAY;
    } else if (g->seen >= 1 && g->capturable) {
        struct sil_error e = {0};
        if (sil_cuda_capture_begin(b->cu, NULL, &e) == 0)
            b->mode = PASS_CAPTURE;
        else
            g->capturable = false;
    } else {
        g->capturable = true; /* until an op of this pass syncs */
    }
}

/* Layer by layer: micro-batch ub's ops follow another's. ub's inputs are staged and copied up
 * again once the copies of the last staging are done. Such passes are eager (begin records no
 * graph). */
void sil_cb_resume(struct sil_backend *be, const struct sil_ubatch *ub)
{
    struct cuda_backend *b = cb(be);
    b->q8_src = 0;
    b->meta_ok = false;
    if (b->rc) return;
    if (b->mode != PASS_EAGER || ub->n <= 0 || ub->n > b->c.ub_max) {
        fail(b, -EINVAL, "a micro-batch resumed in a recorded pass or out of size");
        return;
    }
    if (!ok(b, sil_cuda_sync(b->cu, NULL, &b->err))) return;
    int32_t n_keep;
    sil_cb_stage(b, ub, &n_keep);
    if (!ok(b, sil_cuda_upload(b->cu, b->meta + b->ints_off, (char *)b->h_meta + b->ints_off,
                               b->meta_bytes - b->ints_off, NULL, &b->err)))
        return;
    b->meta_ok = true;
}


/* The per-kernel table of the profiled pass: name, launches, microseconds, weight bytes read,
 * GB/s; the last line sums them. */
static void write_profile(struct cuda_backend *b)
{
    const struct sil_cuda_prof *t = NULL;
    const int n = sil_cuda_profile_get(b->cu, &t);
    FILE *fp = fopen(b->prof_path, "w");
    double ms = 0, bytes = 0;
    uint64_t calls = 0;
    for (int i = 0; fp && i < n; i++) {
        fprintf(fp, "%s\t%llu\t%.2f\t%llu\t%.1f\n", t[i].name, (unsigned long long)t[i].calls,
                t[i].ms * 1e3, (unsigned long long)t[i].bytes,
                t[i].ms > 0 ? (double)t[i].bytes / (t[i].ms * 1e6) : 0.0);
        ms += t[i].ms;
        bytes += (double)t[i].bytes;
        calls += t[i].calls;
    }
    if (fp) {
        fprintf(fp, "total\t%llu\t%.2f\t%.0f\t%.1f\n", (unsigned long long)calls, ms * 1e3, bytes,
                ms > 0 ? bytes / (ms * 1e6) : 0.0);
        fclose(fp);
    }
    struct sil_error e = {0};
    sil_cuda_profile(b->cu, false, &e);
    b->profiling = false;
}

/* Ends this pass's capture and replays it; false (and the error kept) when that fails. */
static bool finish_graph(struct cuda_backend *b)
{
    if (b->segmented) {
        sil_cb_seg_end(b); /* the last segment, up to the logits */
        b->seg_gap = false;
        if (b->mode == PASS_CAPTURE)
            b->n_captures++;
        else
            b->n_replays++;
        b->mode = PASS_EAGER;
        return b->rc == 0;
    }
    const bool replay = b->mode == PASS_REPLAY;
    if (b->mode == PASS_CAPTURE) {
        struct sil_cuda_graph *g = NULL;
        b->mode = PASS_EAGER;
        if (!ok(b, sil_cuda_capture_end(b->cu, NULL, &g, &b->err))) {
            b->cur->capturable = false;
            return false;
        }
        b->cur->g = g;
        b->n_captures++;
    } else {
        b->n_replays++;
    }
    const bool timed = b->gev[0] && replay;
    b->timed_pass = timed;
    if (timed) ok(b, sil_cuda_event_record(b->cu, b->gev[0], NULL, &b->err));
    ok(b, sil_cuda_graph_launch(b->cu, b->cur->g, NULL, &b->err));
    if (timed) ok(b, sil_cuda_event_record(b->cu, b->gev[1], NULL, &b->err));
    return b->rc == 0;
}

void sil_cb_head(struct sil_backend *be, struct sil_act x, const struct sil_weight *w,
                 const int32_t *out_rows, float *logits, int32_t *argmax)
{
    struct cuda_backend *b = cb(be);
    const int64_t V = w->rows;
    const bool graph = b->mode != PASS_EAGER;
    const uint8_t hm = (uint8_t)((logits ? SIL_HEAD_LOGITS : 0) | (argmax ? SIL_HEAD_ARGMAX : 0));
    if (b->rc == 0 && (hm == 0 || (graph && b->cur && b->cur->head_out != hm)))
        fail(b, -EINVAL, hm ? "the head is asked for other outputs than the ubatch said"
                            : "the head has neither logits nor argmax to give back");
    if (b->rc) {
        sil_cb_abort_capture(b);
        return;
    }
    for (int64_t r0 = 0; r0 < x.rows && b->rc == 0; r0 += MB) {
        const int64_t n = x.rows - r0 < MB ? x.rows - r0 : MB;
        if (b->mode != PASS_REPLAY) {
            const struct sil_mm_out lo = {w, {(void *)(uintptr_t)b->logits, n, V, V}};
            sil_cb_mm_chunks(b, sil_act_rows(x, r0, n), &lo, 1);
            /* argmax on the device: only the ids come down */
            if (argmax && b->rc == 0 &&
                ok(b, sil_cuda_argmax(b->cu, b->logits, (int)n, V, b->am, b->am_scratch, NULL,
                                   &b->err)))
                ok(b, sil_cuda_download(b->cu, b->h_am, b->am, sizeof(int32_t) * (size_t)n, NULL,
                                        &b->err));
            if (logits && b->rc == 0)
                ok(b, sil_cuda_download(b->cu, b->h_logits, b->logits,
                                        sizeof(float) * (size_t)(n * V), NULL, &b->err));
            /* path (b): every layer's choices, for the cache after the pass */
            if (b->rc == 0 && b->zc_pass && r0 == 0)
                ok(b, sil_cuda_download(b->cu, b->zc_hids, b->zc_ids,
                                        sizeof(int32_t) * (size_t)(b->c.n_layer * MB *
                                                                   b->c.n_expert_used),
                                        NULL, &b->err));
        }
        if (graph && (b->rc || !finish_graph(b))) {
            sil_cb_abort_capture(b);
            return;
        }
        if (b->rc == 0) ok(b, sil_cuda_sync(b->cu, NULL, &b->err));
        if (graph && b->timed_pass && b->rc == 0) {
            b->timed_pass = false;
            float ms = 0.0f;
            struct timespec t1;
            clock_gettime(CLOCK_MONOTONIC, &t1);
            if (sil_cuda_event_elapsed(b->cu, b->gev[0], b->gev[1], &ms, NULL) == 0) {
                b->graph_ms += ms;
                b->pass_ms += (double)(t1.tv_sec - b->t_begin.tv_sec) * 1e3 +
                              (double)(t1.tv_nsec - b->t_begin.tv_nsec) / 1e6;
                b->n_timed++;
            }
        }
        for (int64_t i = 0; i < n && b->rc == 0; i++) {
            if (logits)
                memcpy(logits + (int64_t)out_rows[r0 + i] * V, b->h_logits + i * V,
                       sizeof(float) * (size_t)V);
            if (argmax) argmax[out_rows[r0 + i]] = b->h_am[i];
        }
    }
    if (b->zc_pass && b->rc == 0) atomic_fetch_add_explicit(&b->zc_passes, 1, memory_order_relaxed);
    if (b->mode == PASS_EAGER && b->cur && b->rc == 0) b->cur->seen++;
    b->mode = PASS_EAGER;
    b->cur = NULL;
    b->segmented = false;
    if (b->profiling) write_profile(b);
}

#endif
