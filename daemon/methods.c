/* The RPC methods of siliceo-rpc(7): hello, status, metrics, tokenize, detokenize, generate,
 * chat, cancel, sessions.list, sessions.drop, shutdown and debug.stream, and sil_dispatch, which
 * routes a request to its method (and refuses new work while the daemon stops).
 *
 * Contract: a method answers on the loop thread (responses packed in the server's scratch
 * buffer) or hands a prepared job to the worker, which answers through the outbox. It returns 0,
 * or -1 when the connection is gone (then c is freed). Parameters are read from the message,
 * which the caller releases after the call. */
#include <errno.h>
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/engine/engine.h"
#include "daemon/log.h"
#include "daemon/schedpolicy.h"
#include "daemon/server_impl.h"
#include "daemon/utf8.h"
#include "daemon/worker.h"
#include "siliceo-proto.h"

#define MAX_DEBUG_STREAM 10000000
#define MAX_CHAT_MESSAGES 4096

/* ---- debug.stream: notifications without the model, paced by the client's reading ------------- */

int sil_pump_streams(struct conn *c)
{
    struct server *s = c->srv;
    while (c->streams) {
        struct dstream *d = c->streams;
        while (d->remaining && !d->cancelled && sil_conn_queued(c) < s->cfg->max_output / 2) {
            /* Batch a few notifications per send to keep the syscall count down. */
            for (int k = 0; k < 64 && d->remaining; k++) {
                sil_rpc_pack_token(&s->scratch, d->msgid, d->text, d->len, NULL, 0);
                d->remaining--;
                d->sent++;
            }
            if (sil_conn_send_scratch(c) < 0)
                return -1;
        }
        if (d->remaining && !d->cancelled)
            return 0; /* wait for the client to read */
        msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, d->msgid);
        msgpack_pack_map(pk, 2);
        sil_rpc_kv_uint(pk, "n_sent", d->sent);
        sil_rpc_kv_str(pk, "stop_reason", d->cancelled ? "cancelled" : "length");
        sil_rpc_end(&s->scratch);
        c->streams = d->next;
        sil_inflight_remove(c, d->msgid);
        free(d);
        if (sil_conn_send_scratch(c) < 0)
            return -1;
    }
    return 0;
}

/* ---- methods ----------------------------------------------------------------------------------- */

static const char *const capabilities[] = { "hello", "generate", "chat", "cancel", "tokenize", "detokenize",
                                            "status", "metrics", "sessions.list", "sessions.drop", "shutdown",
                                            "debug.stream", "stream", "sessions", "logit_bias",
                                            "priority", "preemption", "models", "progress",
                                            "context_full", "model", "spec" };

static void kv_text_or_nil(msgpack_packer *pk, const char *key, const char *s);

static int m_hello(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    struct sil_rpc_error err = { 0 };
    const msgpack_object *proto = sil_rpc_map_get(m->params, "protocol");
    char client[128] = "";
    if (sil_rpc_get_strbuf(m->params, "client", client, sizeof client, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE, &err) < 0)
        return sil_send_rpc_error(c, m->msgid, &err);
    bool ok = !proto || proto->type == MSGPACK_OBJECT_NIL;
    if (proto && proto->type == MSGPACK_OBJECT_ARRAY) {
        for (uint32_t i = 0; i < proto->via.array.size; i++) {
            const msgpack_object *o = &proto->via.array.ptr[i];
            if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER && o->via.u64 == SIL_RPC_PROTOCOL_VERSION)
                ok = true;
            else if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
                return sil_send_error(c, m->msgid, SIL_RPC_E_INVALID_PARAMS, "field 'protocol[%u]': expected integer", i);
        }
    } else if (proto && proto->type != MSGPACK_OBJECT_NIL) {
        int64_t v;
        if (sil_rpc_get_int(m->params, "protocol", 0, UINT32_MAX, &v, SIL_RPC_REQUIRED, &err) < 0)
            return sil_send_rpc_error(c, m->msgid, &err);
        ok = v == SIL_RPC_PROTOCOL_VERSION;
    }
    if (!ok)
        return sil_send_error(c, m->msgid, SIL_RPC_E_VERSION, "this daemon speaks protocol version %d",
                              SIL_RPC_PROTOCOL_VERSION);
    if (client[0])
        sil_debug("client %llu is %s", (unsigned long long)c->id, client);
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 6);
    sil_rpc_kv_uint(pk, "protocol", SIL_RPC_PROTOCOL_VERSION);
    sil_rpc_kv_str(pk, "server", "siliceod");
    sil_rpc_kv_str(pk, "version", SIL_VERSION);
    sil_rpc_pack_cstr(pk, "capabilities");
    size_t n_caps = sizeof capabilities / sizeof *capabilities;
    bool thinking = s->vocab && sil_vocab_think_open(s->vocab) >= 0;
    msgpack_pack_array(pk, n_caps + thinking);
    for (size_t i = 0; i < n_caps; i++)
        sil_rpc_pack_cstr(pk, capabilities[i]);
    if (thinking)
        sil_rpc_pack_cstr(pk, "thinking");
    const struct sil_model_info *info = s->engine ? sil_engine_info(s->engine) : NULL;
    sil_rpc_pack_cstr(pk, "model");
    if (info) {
        msgpack_pack_map(pk, 3);
        sil_utf8_pack_kv(pk, "name", info->name, strlen(info->name)); /* GGUF metadata: any bytes */
        kv_text_or_nil(pk, "id", s->model_name);
        sil_rpc_kv_str(pk, "arch", info->arch_name);
    } else {
        msgpack_pack_nil(pk);
    }
    sil_rpc_kv_uint(pk, "max_message", s->cfg->max_message);
    sil_rpc_end(&s->scratch);
    return sil_conn_send_scratch(c);
}

static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "re");
    unsigned long long size = 0, rss = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &size, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

/* Bytes malloc has handed out and not had back, in every thread's arena: unlike rss it does not
 * count freed memory the allocator keeps, nor the KV pool's pages (mapped apart), so a leak shows
 * here alone. 0 where the C library does not say. */
static uint64_t heap_bytes(void)
{
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
    const struct mallinfo2 mi = mallinfo2();
    return (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
#else
    return 0;
#endif
}

static void pack_rate(msgpack_packer *pk, const char *key, uint64_t hits, uint64_t lookups)
{
    sil_rpc_pack_cstr(pk, key);
    if (lookups)
        msgpack_pack_double(pk, (double)hits / (double)lookups);
    else
        msgpack_pack_nil(pk);
}

/* The expert cache: the device's slots, or one simulated on the CPU (no slots hold weights: its
 * figures say what a cache of that size would have done with the routing served); nil when
 * there is none. */
static void pack_expert_cache(struct server *s, msgpack_packer *pk,
                              const struct sil_worker_stats *st)
{
    sil_rpc_pack_cstr(pk, "expert_cache");
    if (!s->worker || !s->engine || st->ecache_slots <= 0) {
        msgpack_pack_nil(pk);
        return;
    }
    struct sil_heat_view hv;
    sil_heatkeep_view(&s->heat, &hv);
    const struct sil_ecache_stats *e = &st->ecache;
    const struct sil_model_info *info = sil_engine_info(s->engine);
    msgpack_pack_map(pk, 13);
    sil_rpc_kv_str(pk, "mode", st->ecache_mode ? st->ecache_mode : "?");
    sil_rpc_kv_str(pk, "policy", st->ecache_policy ? st->ecache_policy : "?");
    sil_rpc_kv_int(pk, "slots", st->ecache_slots);
    sil_rpc_kv_uint(pk, "experts", (uint64_t)info->n_layer * (uint64_t)info->n_expert);
    sil_rpc_kv_int(pk, "preloaded", hv.preloaded);
    /* an expert lookup per expert a layer's ubatch routed to (the cache's own "lookups" count
     * plans) */
    sil_rpc_kv_uint(pk, "lookups", e->hits + e->misses);
    sil_rpc_kv_uint(pk, "hits", e->hits);
    sil_rpc_kv_uint(pk, "misses", e->misses);
    pack_rate(pk, "hit_rate", e->hits, e->hits + e->misses);
    sil_rpc_kv_uint(pk, "evictions", e->evictions);
    sil_rpc_kv_uint(pk, "bytes_streamed", e->bytes_streamed);
    sil_rpc_kv_uint(pk, "host", e->host);
    /* per MoE layer, nil where the layer saw no lookup */
    struct sil_ecache_stats layers[512];
    const int32_t n = sil_worker_ecache_layers(s->worker, layers, 512);
    sil_rpc_pack_cstr(pk, "layers");
    msgpack_pack_array(pk, n);
    for (int32_t l = 0; l < n; l++) {
        const uint64_t n_look = layers[l].hits + layers[l].misses;
        if (n_look)
            msgpack_pack_double(pk, (double)layers[l].hits / (double)n_look);
        else
            msgpack_pack_nil(pk);
    }
}

/* key: s as valid UTF-8 (any bytes in), or nil when s is NULL or empty. */
static void kv_text_or_nil(msgpack_packer *pk, const char *key, const char *s)
{
    sil_rpc_pack_cstr(pk, key);
    if (s && s[0])
        sil_utf8_pack_str(pk, s, strlen(s));
    else
        msgpack_pack_nil(pk);
}

/* The routed experts' host tier (expert_store.h): always a map while a model is loaded, "on"
 * false where the experts fit the host budget (or it is off); nil without a model. */
static void pack_host_tier(struct server *s, msgpack_packer *pk)
{
    sil_rpc_pack_cstr(pk, "host_tier");
    if (!s->engine) {
        msgpack_pack_nil(pk);
        return;
    }
    struct sil_engine_host_tier ht;
    sil_engine_host_tier(s->engine, &ht);
    msgpack_pack_map(pk, 12);
    sil_rpc_kv_bool(pk, "on", ht.on);
    sil_rpc_kv_bool(pk, "full", ht.full);
    sil_rpc_kv_uint(pk, "budget", ht.budget);
    kv_text_or_nil(pk, "budget_from", ht.budget_from);
    sil_rpc_kv_int(pk, "slots", ht.n_slot);
    sil_rpc_kv_uint(pk, "slot_bytes", ht.slot_bytes);
    kv_text_or_nil(pk, "io", ht.io);
    sil_rpc_kv_uint(pk, "hits", ht.hits);
    sil_rpc_kv_uint(pk, "misses", ht.misses);
    sil_rpc_kv_uint(pk, "bytes_read", ht.bytes_read);
    sil_rpc_kv_uint(pk, "reads", ht.reads);
    sil_rpc_kv_double(pk, "wait_s", ht.wait_s);
}

/* The one host budget and how it was shared out when the model loaded (hostmem.h): what is
 * held whatever the plan, the routed experts' share, and each cache's limit beside what it was
 * configured to (the limit is less when the caches gave way); nil without a model. */
static void pack_host_budget(struct server *s, msgpack_packer *pk)
{
    sil_rpc_pack_cstr(pk, "host_budget");
    if (!s->engine) {
        msgpack_pack_nil(pk);
        return;
    }
    struct sil_engine_host_plan hp;
    sil_engine_host_plan(s->engine, &hp);
    msgpack_pack_map(pk, 6 + SIL_HOST_N_CACHE);
    sil_rpc_kv_uint(pk, "budget", hp.budget);
    kv_text_or_nil(pk, "budget_from", hp.budget_from);
    sil_rpc_kv_uint(pk, "fixed", hp.fixed);
    sil_rpc_kv_uint(pk, "experts", hp.experts);
    sil_rpc_kv_bool(pk, "host_tier", hp.tier);
    sil_rpc_kv_bool(pk, "gave_way", hp.gave_way);
    for (int c = 0; c < SIL_HOST_N_CACHE; c++) {
        sil_rpc_pack_cstr(pk, sil_host_cache_name((enum sil_host_cache)c));
        msgpack_pack_map(pk, 2);
        sil_rpc_kv_uint(pk, "limit", hp.cache[c]);
        sil_rpc_kv_uint(pk, "configured", hp.want[c]);
    }
}

/* The heat map kept for a warm restart; nil when none is kept. */
static void pack_heat_map(struct server *s, msgpack_packer *pk)
{
    sil_rpc_pack_cstr(pk, "heat_map");
    struct sil_heat_view hv;
    if (!s->heat_init) {
        msgpack_pack_nil(pk);
        return;
    }
    sil_heatkeep_view(&s->heat, &hv);
    if (!hv.on) {
        msgpack_pack_nil(pk);
        return;
    }
    msgpack_pack_map(pk, 9);
    kv_text_or_nil(pk, "file", hv.path); /* a path is bytes */
    sil_rpc_kv_str(pk, "loaded", hv.load);
    kv_text_or_nil(pk, "load_error", hv.load_msg);
    sil_rpc_kv_int(pk, "hot_experts", hv.hot);
    sil_rpc_kv_int(pk, "preloaded", hv.preloaded);
    sil_rpc_kv_uint(pk, "tokens_loaded", hv.tokens_loaded);
    sil_rpc_kv_uint(pk, "saves", hv.saves);
    sil_rpc_kv_uint(pk, "save_errors", hv.save_errors);
    sil_rpc_pack_cstr(pk, "last_save_age_s");
    if (hv.last_save > 0)
        msgpack_pack_double(pk, now_s() - hv.last_save);
    else
        msgpack_pack_nil(pk);
}

/* Speculative decoding with the model in use; nil when siliceod runs without it (spec = off). */
static void pack_spec(struct server *s, msgpack_packer *pk, const struct sil_worker_stats *st)
{
    sil_rpc_pack_cstr(pk, "speculative");
    const bool mtp = s->cfg->spec == SIL_SPEC_MTP;
    if (!s->draft && !mtp) {
        msgpack_pack_nil(pk);
        return;
    }
    const struct sil_model_info *di = s->draft ? sil_engine_info(s->draft) : NULL;
    const double steps = (double)st->spec_steps;
    msgpack_pack_map(pk, 25);
    sil_rpc_kv_str(pk, "mode", mtp ? "mtp" : "draft");
    /* the model's own MTP layer drafts: no draft model */
    if (mtp) {
        sil_rpc_kv_nil(pk, "draft_model");
        sil_rpc_kv_nil(pk, "draft_arch");
    } else {
        sil_utf8_pack_kv(pk, "draft_model", di->path, strlen(di->path)); /* a path is bytes */
        sil_rpc_kv_str(pk, "draft_arch", di->arch_name);
    }
    /* false when the model in use has another vocabulary (or, mtp, no MTP layer): nothing
     * speculates */
    sil_rpc_kv_bool(pk, "active", st->spec_on);
    /* the configured tree, and the width the model in use drafts greedy requests with (1 where
     * it verifies chains only) and the default depth */
    char tree[32];
    snprintf(tree, sizeof tree, "%dx%d", (int)s->cfg->spec_width, (int)s->cfg->spec_depth);
    sil_rpc_kv_str(pk, "tree", tree);
    sil_rpc_kv_int(pk, "width", st->spec_width);
    sil_rpc_kv_int(pk, "depth", s->cfg->spec_depth);
    sil_rpc_kv_int(pk, "max_rows", SIL_SPEC_MAX_ROWS);
    sil_rpc_kv_uint(pk, "steps", st->spec_steps);
    sil_rpc_kv_uint(pk, "drafted", st->spec_drafted);
    sil_rpc_kv_uint(pk, "accepted", st->spec_accepted);
    sil_rpc_kv_uint(pk, "emitted", st->spec_emitted);
    sil_rpc_kv_double(pk, "acceptance_rate",
                      st->spec_drafted ? (double)st->spec_accepted / (double)st->spec_drafted : 0);
    sil_rpc_kv_double(pk, "accepted_per_step", steps > 0 ? (double)st->spec_accepted / steps : 0);
    sil_rpc_kv_double(pk, "tokens_per_step", steps > 0 ? (double)st->spec_emitted / steps : 0);
    /* the verify pass's time a step against a one-token decode step (0: not timed yet) */
    const double verify_ms = steps > 0 ? st->spec_verify_s * 1e3 / steps : 0;
    sil_rpc_kv_double(pk, "verify_step_ms", verify_ms);
    sil_rpc_kv_double(pk, "draft_step_ms", steps > 0 ? st->spec_draft_s * 1e3 / steps : 0);
    sil_rpc_kv_double(pk, "one_token_step_ms", st->spec_t_one * 1e3);
    sil_rpc_kv_double(pk, "verify_vs_one_token",
                      st->spec_t_one > 0 ? verify_ms / (st->spec_t_one * 1e3) : 0);
    /* per MoE layer of a verify pass: the distinct experts its rows chose (each read once)
     * beside rows x top-k */
    const double ml = (double)st->spec_moe_layers;
    sil_rpc_kv_uint(pk, "moe_layers", st->spec_moe_layers);
    sil_rpc_kv_double(pk, "expert_union_per_layer",
                      ml > 0 ? (double)st->spec_expert_union / ml : 0);
    sil_rpc_kv_double(pk, "expert_pairs_per_layer",
                      ml > 0 ? (double)st->spec_expert_pairs / ml : 0);
    sil_rpc_kv_uint(pk, "stopped_requests", st->spec_stopped);
    sil_rpc_kv_uint(pk, "batch_skips", st->spec_batch_skips);
    /* the draft's engine state: live sequences, KV blocks free of the pool's */
    sil_rpc_pack_cstr(pk, "draft_state");
    msgpack_pack_map(pk, 3);
    sil_rpc_kv_int(pk, "sequences", st->draft_seqs);
    sil_rpc_kv_int(pk, "kv_blocks", st->draft_kv_blocks);
    sil_rpc_kv_int(pk, "kv_blocks_free", st->draft_kv_free);
}

static int m_status(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    struct sil_worker_stats st = { 0 };
    if (s->worker)
        sil_worker_stats(s->worker, &st);
    const struct sil_model_info *info = s->engine ? sil_engine_info(s->engine) : NULL;
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    struct sil_engine_device dev;
    const bool on_dev = s->engine && sil_engine_device(s->engine, &dev) == 0;
    msgpack_pack_map(pk, 22);
    sil_rpc_kv_str(pk, "state", s->state == RUNNING ? "ready" : "stopping");
    sil_rpc_kv_str(pk, "model_state", sil_model_state_name(s));
    sil_rpc_pack_cstr(pk, "model_problem");
    if (s->model_state == MODEL_OK)
        msgpack_pack_nil(pk);
    else
        sil_utf8_pack_str(pk, s->model_problem, strlen(s->model_problem)); /* names a path: bytes */
    sil_rpc_kv_str(pk, "version", SIL_VERSION);
    sil_rpc_kv_uint(pk, "pid", getpid());
    sil_rpc_kv_double(pk, "uptime_s", now_s() - s->t_start);
    sil_rpc_kv_str(pk, "backend", info ? info->backend : "none");
    sil_rpc_kv_int(pk, "threads", info ? info->n_threads : 0);
    /* the GPU and the device memory taken by use; nil on the CPU */
    sil_rpc_pack_cstr(pk, "device");
    if (on_dev) {
        char drv[32], cc[16];
        snprintf(drv, sizeof drv, "%d.%d", dev.driver_version / 1000, dev.driver_version % 1000 / 10);
        snprintf(cc, sizeof cc, "sm_%d%d", dev.cc_major, dev.cc_minor);
        msgpack_pack_map(pk, 18);
        sil_utf8_pack_kv(pk, "name", dev.name, strlen(dev.name));
        sil_rpc_kv_str(pk, "driver", drv);
        sil_rpc_kv_str(pk, "compute", cc);
        sil_rpc_kv_uint(pk, "vram_weights", dev.weight_bytes);
        sil_rpc_kv_uint(pk, "vram_kv", dev.kv_bytes);
        sil_rpc_kv_uint(pk, "vram_scratch", dev.scratch_bytes);
        sil_rpc_kv_uint(pk, "vram_budget", dev.budget_bytes);
        sil_rpc_kv_uint(pk, "vram_draft", dev.reserved_bytes); /* the draft model's part of it */
        /* expert slots: the pinned host memory misses are copied from, the bandwidth measured
         * from it at open (GB/s), bytes and experts copied since */
        sil_rpc_kv_uint(pk, "pinned_bytes", dev.pinned_bytes);
        sil_rpc_kv_double(pk, "h2d_gbs", dev.h2d_gbs);
        sil_rpc_kv_uint(pk, "expert_copy_bytes", dev.slot_bytes_in);
        sil_rpc_kv_uint(pk, "expert_copies", dev.slot_fills);
        /* miss path (b): decode reads misses in place from that memory; passes run so */
        sil_rpc_kv_bool(pk, "zero_copy", dev.zero_copy);
        sil_rpc_kv_uint(pk, "zero_copy_passes", dev.zero_copy_passes);
        /* miss path (c): the CPU's part of each decode layer's misses, and its measured speed */
        sil_rpc_kv_uint(pk, "cpu_misses", (uint64_t)(dev.cpu_misses > 0 ? dev.cpu_misses : 0));
        sil_rpc_kv_double(pk, "cpu_share", dev.cpu_share);
        sil_rpc_kv_double(pk, "host_expert_gbs", dev.host_gbs);
        sil_rpc_kv_uint(pk, "cpu_experts", dev.cpu_experts);
    } else {
        msgpack_pack_nil(pk);
    }
    sil_rpc_pack_cstr(pk, "model");
    if (info) {
        msgpack_pack_map(pk, 14);
        sil_utf8_pack_kv(pk, "name", info->name, strlen(info->name));
        /* the name requests give it by (its file name without .gguf); nil when that is none */
        kv_text_or_nil(pk, "id", s->model_name);
        sil_rpc_kv_str(pk, "arch", info->arch_name);
        sil_utf8_pack_kv(pk, "file", info->path, strlen(info->path)); /* a path is bytes */
        sil_rpc_kv_uint(pk, "file_bytes", info->file_bytes);
        sil_rpc_kv_uint(pk, "n_params", info->n_params);
        sil_rpc_kv_int(pk, "n_ctx", sil_engine_n_ctx(s->engine));
        sil_rpc_kv_int(pk, "n_vocab", info->n_vocab);
        sil_rpc_kv_int(pk, "n_ctx_train", info->n_ctx_train);
        sil_rpc_kv_int(pk, "n_layer", info->n_layer);
        sil_rpc_kv_int(pk, "n_expert", info->n_expert);
        sil_rpc_kv_int(pk, "n_expert_used", info->n_expert_used);
        sil_rpc_kv_uint(pk, "routed_expert_bytes", info->routed_expert_bytes);
        sil_rpc_kv_uint(pk, "backbone_bytes", info->backbone_bytes);
    } else {
        msgpack_pack_nil(pk);
    }
    sil_rpc_pack_cstr(pk, "memory");
    msgpack_pack_map(pk, 7);
    sil_rpc_kv_uint(pk, "rss", rss_bytes());
    sil_rpc_kv_uint(pk, "heap", heap_bytes());
    sil_rpc_kv_uint(pk, "model", info ? info->file_bytes : 0);
    sil_rpc_kv_uint(pk, "kv", st.state_bytes);
    sil_rpc_kv_uint(pk, "sessions", st.session_bytes);
    sil_rpc_kv_uint(pk, "prefix_checkpoints", st.prefix_checkpoint_bytes);
    sil_rpc_kv_uint(pk, "prefix_blocks", st.prefix_cached_bytes);
    sil_rpc_pack_cstr(pk, "queue");
    msgpack_pack_map(pk, 4);
    sil_rpc_kv_int(pk, "running", st.running);
    sil_rpc_kv_int(pk, "queued", st.queued);
    sil_rpc_kv_int(pk, "max_running", s->cfg->max_running);
    sil_rpc_kv_int(pk, "max_queue", s->cfg->max_queue);
    sil_rpc_kv_int(pk, "sessions", st.sessions);
    sil_rpc_kv_int(pk, "clients", s->n_conns);
    sil_rpc_pack_cstr(pk, "requests");
    msgpack_pack_map(pk, 4);
    sil_rpc_kv_uint(pk, "total", st.requests_total);
    sil_rpc_kv_uint(pk, "failed", st.requests_failed);
    sil_rpc_kv_uint(pk, "cancelled", st.requests_cancelled);
    sil_rpc_kv_uint(pk, "preempted", st.preemptions);
    sil_rpc_pack_cstr(pk, "tokens");
    msgpack_pack_map(pk, 4);
    sil_rpc_kv_uint(pk, "prompt", st.tokens_prompt);
    sil_rpc_kv_uint(pk, "cached", st.tokens_cached);
    sil_rpc_kv_uint(pk, "generated", st.tokens_generated);
    sil_rpc_kv_uint(pk, "recomputed", st.tokens_recomputed);
    pack_expert_cache(s, pk, &st);
    pack_host_tier(s, pk);
    pack_host_budget(s, pk);
    pack_heat_map(s, pk);
    sil_rpc_pack_cstr(pk, "prefix_cache");
    msgpack_pack_map(pk, 7);
    sil_rpc_kv_bool(pk, "enabled", s->cfg->prefix_cache);
    sil_rpc_kv_uint(pk, "hits", st.prefix_hits);
    sil_rpc_kv_uint(pk, "misses", st.prefix_misses);
    sil_rpc_kv_uint(pk, "tokens", st.prefix_tokens);
    sil_rpc_kv_int(pk, "blocks", st.prefix_blocks);
    sil_rpc_kv_int(pk, "checkpoints", st.prefix_checkpoints);
    sil_rpc_kv_uint(pk, "checkpoint_bytes", st.prefix_checkpoint_bytes);
    pack_spec(s, pk, &st);
    sil_rpc_end(&s->scratch);
    return sil_conn_send_scratch(c);
}

/* One metric: a counter ends in _total (OpenMetrics: the family is the name without it), a
 * gauge never does, and no gauge is named like a counter's family. */
struct metric {
    const char *name, *help;
    bool counter;
    double value;
};

/* The expert cache's metrics are named siliceo_expert_cache_sim_* while it is simulated on the
 * CPU and siliceo_expert_cache_* for the device's slots, so the two never share a series. */
static const char *ec_name(const char *sim_name, bool device, char *buf, size_t size)
{
    if (!device) return sim_name;
    const char *tail = sim_name + strlen("siliceo_expert_cache_sim_");
    snprintf(buf, size, "siliceo_expert_cache_%s", tail);
    return buf;
}

static const char *ec_help(const char *sim_help, bool device, char *buf, size_t size)
{
    if (!device) return sim_help;
    snprintf(buf, size, "Device slots: %s", sim_help + strlen("Simulated on the CPU: "));
    return buf;
}

/* The host tier's strings as one series, siliceo_host_tier_info{budget_from="...",io="..."} 1: a
 * gauge in both formats, as node_uname_info is, so every family stays a gauge or a counter. */
#define HOST_TIER_INFO_HELP "The expert host tier: what chose its budget and how the file is read."

/* A label value as the text formats want it: backslash and quote escaped, newlines dropped. */
static void label_escape(const char *v, char *out, size_t size)
{
    size_t k = 0;
    for (; *v && k + 2 < size; v++) {
        if (*v == '\n')
            continue;
        if (*v == '\\' || *v == '"')
            out[k++] = '\\';
        out[k++] = *v;
    }
    out[k] = 0;
}

static void host_tier_labels(const struct sil_engine_host_tier *ht, char *out, size_t size)
{
    char from[2 * sizeof ht->budget_from], io[64];
    label_escape(ht->budget_from, from, sizeof from);
    label_escape(ht->io ? ht->io : "", io, sizeof io);
    if (from[0] && io[0])
        snprintf(out, size, "budget_from=\"%s\",io=\"%s\"", from, io);
    else if (from[0] || io[0])
        snprintf(out, size, "%s=\"%s\"", from[0] ? "budget_from" : "io", from[0] ? from : io);
    else
        out[0] = 0;
}

/* Prometheus text (version 0.0.4) or OpenMetrics text: # HELP and # TYPE for every family. */
static int pack_metrics_text(struct sil_rpc_buf *b, uint32_t msgid, const struct metric *mt, int n,
                             const struct sil_ecache_stats *layers, int32_t n_layers, bool device,
                             const char *tier_labels, bool openmetrics)
{
    size_t cap = (size_t)n * 256 + (size_t)n_layers * 160 + strlen(tier_labels) + 1024, len = 0;
    char *text = malloc(cap);
    if (!text)
        return -ENOMEM;
    for (int i = 0; i < n; i++) {
        size_t fam = strlen(mt[i].name) - (mt[i].counter && openmetrics ? 6 : 0);
        len += snprintf(text + len, cap - len, "# HELP %.*s %s\n# TYPE %.*s %s\n%s %.17g\n", (int)fam, mt[i].name,
                        mt[i].help, (int)fam, mt[i].name, mt[i].counter ? "counter" : "gauge", mt[i].name,
                        mt[i].value);
    }
    /* The simulated expert cache per MoE layer: one labelled series per layer. */
    for (int f = 0; f < 2 && n_layers > 0; f++) {
        char nb[96], hb[160];
        const char *name = ec_name(f ? "siliceo_expert_cache_sim_layer_hits_total"
                                     : "siliceo_expert_cache_sim_layer_lookups_total",
                                   device, nb, sizeof nb);
        const size_t fam = strlen(name) - (openmetrics ? 6 : 0);
        const char *help = ec_help(f ? "Simulated on the CPU: expert lookups of one layer that hit."
                                     : "Simulated on the CPU: expert lookups of one layer.",
                                   device, hb, sizeof hb);
        len += snprintf(text + len, cap - len, "# HELP %.*s %s\n# TYPE %.*s counter\n", (int)fam,
                        name, help, (int)fam, name);
        for (int32_t l = 0; l < n_layers; l++)
            len += snprintf(
                text + len, cap - len, "%s{layer=\"%d\"} %llu\n", name, (int)l,
                (unsigned long long)(f ? layers[l].hits : layers[l].hits + layers[l].misses));
    }
    if (tier_labels[0])
        len += snprintf(text + len, cap - len,
                        "# HELP siliceo_host_tier_info " HOST_TIER_INFO_HELP "\n"
                        "# TYPE siliceo_host_tier_info gauge\nsiliceo_host_tier_info{%s} 1\n",
                        tier_labels);
    if (openmetrics)
        len += snprintf(text + len, cap - len, "# EOF\n");
    msgpack_packer *pk = sil_rpc_begin_response(b, msgid);
    msgpack_pack_map(pk, 1);
    sil_rpc_kv_strn(pk, "text", text, len);
    free(text);
    return sil_rpc_end(b);
}

static int m_metrics(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    struct sil_rpc_error err = { 0 };
    char format[16] = "map";
    if (sil_rpc_get_strbuf(m->params, "format", format, sizeof format, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE, &err) < 0)
        return sil_send_rpc_error(c, m->msgid, &err);
    bool map = strcmp(format, "map") == 0, om = strcmp(format, "openmetrics") == 0;
    if (!map && !om && strcmp(format, "prometheus") != 0)
        return sil_send_error(c, m->msgid, SIL_RPC_E_INVALID_PARAMS,
                              "field 'format': expected \"map\", \"prometheus\" or \"openmetrics\"");
    struct sil_worker_stats st = { 0 };
    if (s->worker)
        sil_worker_stats(s->worker, &st);
    struct sil_engine_device dev;
    if (!s->engine || sil_engine_device(s->engine, &dev) < 0)
        memset(&dev, 0, sizeof dev);
    struct sil_engine_host_tier ht;
    if (s->engine)
        sil_engine_host_tier(s->engine, &ht);
    else
        memset(&ht, 0, sizeof ht);
    char tier_labels[256];
    host_tier_labels(&ht, tier_labels, sizeof tier_labels);
    struct sil_engine_host_plan hp;
    if (s->engine)
        sil_engine_host_plan(s->engine, &hp);
    else
        memset(&hp, 0, sizeof hp);
    const struct metric mt[] = {
        { "siliceo_uptime_seconds", "Seconds since the daemon started.", false, now_s() - s->t_start },
        { "siliceo_rss_bytes", "Resident memory of the daemon.", false, (double)rss_bytes() },
        { "siliceo_heap_bytes", "Bytes allocated and not yet freed (malloc's count, all threads).", false,
          (double)heap_bytes() },
        { "siliceo_ready", "1 while serving, 0 while stopping.", false, s->state == RUNNING },
        { "siliceo_connected_clients", "Clients connected now.", false, s->n_conns },
        { "siliceo_clients_total", "Connections accepted.", true, s->clients_total },
        { "siliceo_clients_refused_total", "Peers refused (allow list or max_clients).", true, s->clients_refused },
        { "siliceo_clients_dropped_total", "Clients dropped for not reading their output.", true, s->clients_dropped },
        { "siliceo_clients_timed_out_total", "Connections closed by idle_timeout or message_timeout.", true,
          s->clients_timed_out },
        { "siliceo_bytes_in_total", "Socket bytes read.", true, s->bytes_in },
        { "siliceo_bytes_out_total", "Socket bytes written.", true, s->bytes_out },
        { "siliceo_messages_in_total", "Messages received.", true, s->messages_in },
        { "siliceo_bad_messages_total", "Messages received that were malformed or invalid.", true, s->bad_messages },
        { "siliceo_requests_rejected_total", "Requests refused with error 7 (queue or per-connection limit).", true,
          s->requests_rejected },
        { "siliceo_results_too_large_total", "Results refused with error 5 for passing max_output.", true,
          s->results_too_large },
        { "siliceo_requests_total", "Generation requests accepted.", true, st.requests_total },
        { "siliceo_requests_failed_total", "Generation requests ended by an error.", true, st.requests_failed },
        { "siliceo_requests_cancelled_total", "Generation requests cancelled.", true, st.requests_cancelled },
        { "siliceo_queue_running", "Generation requests running.", false, st.running },
        { "siliceo_queue_queued", "Generation requests waiting for a slot.", false, st.queued },
        { "siliceo_tokens_prompt_total", "Prompt tokens evaluated.", true, st.tokens_prompt },
        { "siliceo_tokens_cached_total", "Prompt tokens reused (sessions and the prefix cache).", true,
          st.tokens_cached },
        { "siliceo_prefix_hits_total", "Fresh sequences that reused a cached prompt prefix.", true, st.prefix_hits },
        { "siliceo_prefix_misses_total", "Fresh sequences that found no cached prompt prefix.", true,
          st.prefix_misses },
        { "siliceo_prefix_tokens_total", "Prompt tokens reused from the prefix cache.", true, st.prefix_tokens },
        { "siliceo_prefix_blocks", "KV blocks the prefix cache can find now.", false, st.prefix_blocks },
        { "siliceo_prefix_checkpoints", "Recurrent-state snapshots the prefix cache keeps.", false,
          st.prefix_checkpoints },
        { "siliceo_prefix_checkpoint_bytes", "Bytes of those snapshots.", false, st.prefix_checkpoint_bytes },
        { "siliceo_prefix_cached_bytes", "KV blocks no sequence holds, kept for later hits.", false,
          st.prefix_cached_bytes },
        { "siliceo_tokens_generated_total", "Tokens generated.", true, st.tokens_generated },
        { "siliceo_preemptions_total", "Running requests preempted (state dropped, recomputed).",
          true, st.preemptions },
        { "siliceo_tokens_recomputed_total", "Positions evaluated again after a preemption.", true,
          st.tokens_recomputed },
        { "siliceo_eval_steps_total", "Scheduler steps (engine evaluations).", true, st.steps },
        { "siliceo_eval_errors_total", "Engine evaluations that failed.", true, st.eval_errors },
        { "siliceo_eval_seconds_total", "Seconds spent in engine evaluations.", true, st.eval_seconds },
        { "siliceo_sessions", "Sessions kept.", false, st.sessions },
        { "siliceo_session_bytes", "Engine state held by sessions.", false, st.session_bytes },
        { "siliceo_state_bytes", "Engine state of all sequences.", false, st.state_bytes },
        { "siliceo_vram_weight_bytes", "Device memory holding weights (0 on the CPU).", false,
          (double)dev.weight_bytes },
        { "siliceo_vram_kv_bytes", "Device memory holding the KV cache (0 on the CPU).", false,
          (double)dev.kv_bytes },
        { "siliceo_vram_scratch_bytes", "Other device memory: recurrent state, activations, scratch.",
          false, (double)dev.scratch_bytes },
        { "siliceo_expert_copy_bytes_total", "Bytes copied into expert slots on the device (0 on the CPU).",
          true, (double)dev.slot_bytes_in },
        { "siliceo_expert_copies_total", "Experts copied into slots on the device.", true,
          (double)dev.slot_fills },
        { "siliceo_expert_pinned_bytes", "Host memory pinned for expert copies.", false,
          (double)dev.pinned_bytes },
        { "siliceo_host_tier_on", "1 while routed experts are read from the model file into host "
          "slots (they did not fit the host budget).", false, ht.on },
        { "siliceo_host_budget_bytes", "The one host budget (host_budget, else what the host and "
          "the cgroup could spare at load, less room for the system).", false, (double)hp.budget },
        { "siliceo_host_budget_fixed_bytes", "Of it, held whatever the plan: the backbone and KV "
          "pool on the CPU.", false, (double)hp.fixed },
        { "siliceo_host_budget_experts_bytes", "Of it, the routed experts' share (all of them, or "
          "the host tier's budget).", false, (double)hp.experts },
        { "siliceo_host_budget_snapshots_bytes", "Of it, the prefix cache's snapshots' limit.",
          false, (double)hp.cache[SIL_HOST_SNAPSHOTS] },
        { "siliceo_host_budget_prefix_blocks_bytes", "Of it, the limit of the prefix cache's KV "
          "blocks in host memory.", false, (double)hp.cache[SIL_HOST_PREFIX] },
        { "siliceo_host_budget_sessions_bytes", "Of it, the idle sessions' limit.", false,
          (double)hp.cache[SIL_HOST_SESSIONS] },
        { "siliceo_host_budget_gave_way", "1 when the caches got less than configured to fit the "
          "host budget.", false, hp.gave_way },
        { "siliceo_host_tier_slots", "Host slots of the expert host tier.", false, ht.n_slot },
        { "siliceo_host_tier_slot_bytes", "Bytes of one host slot.", false, (double)ht.slot_bytes },
        { "siliceo_host_tier_hits_total", "Expert lookups found in a host slot.", true,
          (double)ht.hits },
        { "siliceo_host_tier_misses_total", "Expert lookups read from the model file.", true,
          (double)ht.misses },
        { "siliceo_host_tier_read_bytes_total", "Bytes read from the model file into host slots.",
          true, (double)ht.bytes_read },
        { "siliceo_host_tier_reads_total", "Reads from the model file into host slots.", true,
          (double)ht.reads },
        { "siliceo_host_tier_read_wait_seconds_total", "Seconds evaluations waited for those reads.",
          true, ht.wait_s },
    };
    int n0 = (int)(sizeof mt / sizeof *mt);
    /* The expert cache's figures are simulated on the CPU (no slots hold weights yet): present
     * only while ecache_slots is set; the heat map's while one is kept. */
    struct sil_heat_view hv = {0};
    if (s->heat_init) sil_heatkeep_view(&s->heat, &hv);
    const struct sil_ecache_stats *ec = &st.ecache;
    const bool ec_on = s->worker && st.ecache_slots > 0;
    const struct metric mx[] = {
        {"siliceo_expert_cache_sim_slots", "Simulated on the CPU: expert cache slots.", false,
         st.ecache_slots},
        {"siliceo_expert_cache_sim_preloaded",
         "Simulated on the CPU: experts preloaded at start "
         "from the heat map.",
         false, (double)hv.preloaded},
        {"siliceo_expert_cache_sim_lookups_total",
         "Simulated on the CPU: expert lookups (one per "
         "expert a layer's ubatch routed to).",
         true, (double)(ec->hits + ec->misses)},
        {"siliceo_expert_cache_sim_hits_total", "Simulated on the CPU: expert lookups that hit.",
         true, (double)ec->hits},
        {"siliceo_expert_cache_sim_misses_total",
         "Simulated on the CPU: expert lookups that "
         "missed.",
         true, (double)ec->misses},
        {"siliceo_expert_cache_sim_evictions_total", "Simulated on the CPU: experts evicted.", true,
         (double)ec->evictions},
        {"siliceo_expert_cache_sim_streamed_bytes_total",
         "Simulated on the CPU: expert bytes "
         "that would have crossed the bus (every miss).",
         true, (double)ec->bytes_streamed},
        {"siliceo_expert_cache_sim_hit_ratio",
         "Simulated on the CPU: hits per lookup since start "
         "(0 before any).",
         false, ec->hits + ec->misses ? (double)ec->hits / (double)(ec->hits + ec->misses) : 0},
    };
    const struct metric mh[] = {
        {"siliceo_heat_map_hot_experts", "Experts with heat in the heat map loaded at start.",
         false, (double)hv.hot},
        {"siliceo_heat_map_saves_total", "Heat map saves to the state directory.", true,
         (double)hv.saves},
        {"siliceo_heat_map_save_errors_total", "Heat map saves that failed.", true,
         (double)hv.save_errors},
    };
    /* speculative decoding's, while siliceod has a draft model (the model in use's figures) */
    const double sp_steps = (double)st.spec_steps;
    const double sp_verify = sp_steps > 0 ? st.spec_verify_s / sp_steps : 0;
    const struct metric ms[] = {
        {"siliceo_spec_active", "1 while the draft model drafts for the model in use (the same "
         "vocabulary) or, with spec = mtp, its MTP layer does.", false, st.spec_on},
        {"siliceo_spec_steps_total", "Speculative steps (a draft chain verified in one batch).",
         true, (double)st.spec_steps},
        {"siliceo_spec_drafted_tokens_total", "Draft tokens proposed.", true,
         (double)st.spec_drafted},
        {"siliceo_spec_accepted_tokens_total", "Draft tokens accepted.", true,
         (double)st.spec_accepted},
        {"siliceo_spec_emitted_tokens_total", "Tokens speculative steps produced (accepted plus "
         "one a step).", true, (double)st.spec_emitted},
        {"siliceo_spec_acceptance_ratio", "Draft tokens accepted per draft token proposed (0 "
         "before any).", false,
         st.spec_drafted ? (double)st.spec_accepted / (double)st.spec_drafted : 0},
        {"siliceo_spec_tokens_per_step", "Tokens a speculative step produced, on average.", false,
         sp_steps > 0 ? (double)st.spec_emitted / sp_steps : 0},
        {"siliceo_spec_draft_seconds_total", "Seconds the draft model spent proposing.", true,
         st.spec_draft_s},
        {"siliceo_spec_verify_seconds_total", "Seconds of the model's verify passes.", true,
         st.spec_verify_s},
        {"siliceo_spec_commit_seconds_total", "Seconds of commits (rollback and recompute of "
         "kept rows).", true, st.spec_commit_s},
        {"siliceo_spec_one_token_step_seconds", "A one-token decode step, measured (0 before "
         "any).", false, st.spec_t_one},
        {"siliceo_spec_verify_cost_ratio", "A verify pass's time against a one-token decode "
         "step (0 before both are timed).", false,
         st.spec_t_one > 0 ? sp_verify / st.spec_t_one : 0},
        {"siliceo_spec_verify_moe_layers_total", "MoE layers of verify passes whose routing "
         "the host saw.", true, (double)st.spec_moe_layers},
        {"siliceo_spec_verify_expert_union_per_layer", "Distinct experts a verify pass's MoE "
         "layer read, on average (0 before any).", false,
         st.spec_moe_layers ? (double)st.spec_expert_union / (double)st.spec_moe_layers : 0},
        {"siliceo_spec_verify_expert_pairs_per_layer", "Rows times top-k of a verify pass's MoE "
         "layer, on average (0 before any).", false,
         st.spec_moe_layers ? (double)st.spec_expert_pairs / (double)st.spec_moe_layers : 0},
        {"siliceo_spec_stopped_requests_total", "Requests that stopped speculating because it "
         "did not pay.", true, (double)st.spec_stopped},
        {"siliceo_spec_batch_skips_total", "Request steps decoded plainly because more than "
         "the speculation threshold of requests were decoding.", true,
         (double)st.spec_batch_skips},
        {"siliceo_spec_draft_sequences", "Sequences the draft model holds now.", false,
         st.draft_seqs},
    };
    const int nx = ec_on ? (int)(sizeof mx / sizeof *mx) : 0,
              nh = hv.on ? (int)(sizeof mh / sizeof *mh) : 0,
              nsp = s->draft || s->cfg->spec == SIL_SPEC_MTP ? (int)(sizeof ms / sizeof *ms) : 0;
    const bool device = ec_on && st.ecache_mode && strcmp(st.ecache_mode, "device") == 0;
    char names[sizeof mx / sizeof *mx][96], helps[sizeof mx / sizeof *mx][192];
    struct metric all[sizeof mt / sizeof *mt + sizeof mx / sizeof *mx + sizeof mh / sizeof *mh +
                      sizeof ms / sizeof *ms];
    memcpy(all, mt, sizeof mt);
    memcpy(all + n0, mx, (size_t)nx * sizeof *mx);
    for (int i = 0; i < nx; i++) {
        all[n0 + i].name = ec_name(mx[i].name, device, names[i], sizeof names[i]);
        all[n0 + i].help = ec_help(mx[i].help, device, helps[i], sizeof helps[i]);
    }
    memcpy(all + n0 + nx, mh, (size_t)nh * sizeof *mh);
    memcpy(all + n0 + nx + nh, ms, (size_t)nsp * sizeof *ms);
    const int n = n0 + nx + nh + nsp;
    struct sil_ecache_stats *layers = ec_on ? calloc(512, sizeof(*layers)) : NULL;
    if (ec_on && !layers) return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    const int32_t nl = layers ? sil_worker_ecache_layers(s->worker, layers, 512) : 0;
    if (!map) {
        int prc = pack_metrics_text(&s->scratch, m->msgid, all, n, layers, nl, device, tier_labels,
                                    om);
        free(layers);
        if (prc < 0) return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
        return sil_send_result_scratch(c, m->msgid);
    }
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 1);
    sil_rpc_pack_cstr(pk, "metrics");
    msgpack_pack_map(pk, n + (nl > 0 ? 2 : 0) + (tier_labels[0] ? 1 : 0));
    /* the host tier's strings: a map from the label set to 1, as the per-layer series */
    if (tier_labels[0]) {
        sil_rpc_pack_cstr(pk, "siliceo_host_tier_info");
        msgpack_pack_map(pk, 1);
        sil_utf8_pack_str(pk, tier_labels, strlen(tier_labels));
        msgpack_pack_uint64(pk, 1);
    }
    /* per layer: a map from the label set to the number */
    for (int f = 0; f < 2 && nl > 0; f++) {
        char nb[96];
        sil_rpc_pack_cstr(pk, ec_name(f ? "siliceo_expert_cache_sim_layer_hits_total"
                                        : "siliceo_expert_cache_sim_layer_lookups_total",
                                      device, nb, sizeof nb));
        msgpack_pack_map(pk, nl);
        for (int32_t l = 0; l < nl; l++) {
            char lab[32];
            snprintf(lab, sizeof lab, "layer=\"%d\"", (int)l);
            sil_rpc_pack_cstr(pk, lab);
            msgpack_pack_uint64(pk, f ? layers[l].hits : layers[l].hits + layers[l].misses);
        }
    }
    free(layers);
    for (int i = 0; i < n; i++) {
        sil_rpc_pack_cstr(pk, all[i].name);
        double v = all[i].value;
        /* Whole numbers as integers, as before; times and ratios as floats. */
        if (v >= 0 && v == (double)(uint64_t)v && v < 1.8e19 && !strstr(all[i].name, "seconds") &&
            !strstr(all[i].name, "ratio"))
            msgpack_pack_uint64(pk, (uint64_t)v);
        else
            msgpack_pack_double(pk, v);
    }
    sil_rpc_end(&s->scratch);
    return sil_conn_send_scratch(c);
}

/* need_model and admit_request: 1 to go on, else what the method returns (0: refused with an
 * error response, -1: the connection is gone and c with it). */
static int need_model(struct conn *c, const struct sil_rpc_msg *m)
{
    if (c->srv->worker)
        return 1;
    return sil_send_error(c, m->msgid, SIL_RPC_E_METHOD_NOT_FOUND, "%s: not available, siliceod runs with --no-model",
                          m->method);
}

static int m_tokenize(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    int ok = need_model(c, m);
    if (ok > 0)
        ok = sil_model_pick(c, m);
    if (ok <= 0)
        return ok;
    struct sil_rpc_error err = { 0 };
    const char *text;
    size_t len;
    bool add_bos = false, special = false;
    if (sil_rpc_get_str(m->params, "text", &text, &len, SIL_RPC_REQUIRED, &err) < 0 ||
        sil_rpc_get_bool(m->params, "add_bos", &add_bos, SIL_RPC_OPTIONAL, &err) < 0 ||
        sil_rpc_get_bool(m->params, "special", &special, SIL_RPC_OPTIONAL, &err) < 0)
        return sil_send_rpc_error(c, m->msgid, &err);
    if (len >= TOKJOB_MIN_TEXT) {
        /* Megabytes take a tenth of a second or more: off the loop, so streams keep flowing. */
        if (sil_tokpool_submit(s, c, m->msgid, text, len, add_bos, special, NULL) < 0)
            return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
        return 0;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    struct sil_error e = { 0 };
    if (sil_tokenize(s->vocab, text, len, add_bos, special, &ids, &n, &e) < 0)
        return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "tokenize: %s", e.msg);
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 2);
    sil_rpc_pack_cstr(pk, "ids");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++)
        msgpack_pack_int32(pk, ids[i]);
    sil_rpc_kv_uint(pk, "n", n);
    free(ids);
    if (sil_rpc_end(&s->scratch) < 0)
        return sil_send_error(c, m->msgid, SIL_RPC_E_TOO_LARGE, "result too large");
    return sil_send_result_scratch(c, m->msgid);
}

/* ids: an array of token ids, each checked against the vocab. *out malloc'd. */
static int read_ids(const struct server *s, const msgpack_object *arr, const char *field, int32_t **out,
                    size_t *n, struct sil_rpc_error *err)
{
    int32_t n_vocab = sil_vocab_n_tokens(s->vocab);
    uint32_t cnt = arr->via.array.size;
    int32_t *ids = malloc((cnt ? cnt : 1) * sizeof(*ids));
    if (!ids)
        return sil_rpc_errorf(err, -ENOMEM, SIL_RPC_E_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < cnt; i++) {
        const msgpack_object *o = &arr->via.array.ptr[i];
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 >= (uint64_t)n_vocab) {
            free(ids);
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                  "%s[%u]: expected a token id in [0, %d)", field, i, n_vocab);
        }
        ids[i] = (int32_t)o->via.u64;
    }
    *out = ids;
    *n = cnt;
    return 0;
}

static int m_detokenize(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    int ok = need_model(c, m);
    if (ok > 0)
        ok = sil_model_pick(c, m);
    if (ok <= 0)
        return ok;
    struct sil_rpc_error err = { 0 };
    const msgpack_object *arr;
    bool special = false;
    int32_t *ids;
    size_t n;
    if (sil_rpc_get_array(m->params, "ids", &arr, SIL_RPC_REQUIRED, &err) < 0 ||
        sil_rpc_get_bool(m->params, "special", &special, SIL_RPC_OPTIONAL, &err) < 0 ||
        read_ids(s, arr, "ids", &ids, &n, &err) < 0)
        return sil_send_rpc_error(c, m->msgid, &err);
    char *text = NULL;
    size_t len = 0;
    struct sil_error e = { 0 };
    int rc = sil_detokenize(s->vocab, ids, n, special, &text, &len, &e);
    free(ids);
    if (rc < 0)
        return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "detokenize: %s", e.msg);
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 1);
    /* Any ids may be asked for: byte tokens that do not form UTF-8 come back as U+FFFD. */
    sil_utf8_pack_kv(pk, "text", text, len);
    free(text);
    if (sil_rpc_end(&s->scratch) < 0)
        return sil_send_error(c, m->msgid, SIL_RPC_E_TOO_LARGE, "result too large");
    return sil_send_result_scratch(c, m->msgid);
}

/* Sampling, budgets, stop strings, session and priority: the fields generate and chat share. */
/* logit_bias: {token id: bias} as in the OpenAI API; biases are clamped to [-100, 100]. */
static int read_logit_bias(const struct server *s, const msgpack_object *p, struct sil_job_req *j,
                           struct sil_rpc_error *err)
{
    const msgpack_object *lb = sil_rpc_map_get(p, "logit_bias");
    if (!lb || lb->type == MSGPACK_OBJECT_NIL)
        return 0;
    if (lb->type != MSGPACK_OBJECT_MAP || lb->via.map.size > SIL_LOGIT_BIAS_MAX)
        return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                              "logit_bias: expected a map of at most %d {token id: bias}",
                              SIL_LOGIT_BIAS_MAX);
    uint32_t n = lb->via.map.size;
    if (n == 0)
        return 0;
    int32_t n_vocab = sil_vocab_n_tokens(s->vocab);
    j->bias_buf = malloc(n * sizeof *j->bias_buf);
    if (!j->bias_buf)
        return sil_rpc_errorf(err, -ENOMEM, SIL_RPC_E_INTERNAL, "out of memory");
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *k = &lb->via.map.ptr[i].key, *v = &lb->via.map.ptr[i].val;
        if (k->type != MSGPACK_OBJECT_POSITIVE_INTEGER || k->via.u64 >= (uint64_t)n_vocab)
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                  "logit_bias: entry %u: the key is not a token id in [0, %d)", i,
                                  n_vocab);
        double x;
        if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER)
            x = (double)v->via.u64;
        else if (v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER)
            x = (double)v->via.i64;
        else if (v->type == MSGPACK_OBJECT_FLOAT32 || v->type == MSGPACK_OBJECT_FLOAT64)
            x = v->via.f64;
        else
            x = NAN;
        if (!isfinite(x))
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                  "logit_bias[%d]: expected a finite number", (int)k->via.u64);
        j->bias_buf[i].id = (int32_t)k->via.u64;
        j->bias_buf[i].bias = (float)(x < -100 ? -100 : x > 100 ? 100 : x);
    }
    j->sampling.logit_bias = j->bias_buf;
    j->sampling.n_logit_bias = (int32_t)n;
    return 0;
}

static int read_gen_params(struct server *s, const msgpack_object *p, struct sil_job_req *j,
                           struct sil_rpc_error *err)
{
    const struct sil_config *cfg = s->cfg;
    sil_sampler_params_default(&j->sampling);
    sil_genctl_params_default(&j->ctl);
    j->ctl.think_open = sil_vocab_think_open(s->vocab);
    j->ctl.think_close = sil_vocab_think_close(s->vocab);
    int64_t max_tokens = cfg->max_tokens_default, top_k = j->sampling.top_k, think = -1,
            grace = SIL_GENCTL_GRACE_MAX, rep_n = j->sampling.repeat_last_n;
    double temp = j->sampling.temperature, top_p = j->sampling.top_p, min_p = j->sampling.min_p,
           rep = j->sampling.repeat_penalty, pres = j->sampling.presence_penalty;
    uint64_t seed = 0;
    bool repair = true, progress = false;
    const unsigned O = SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE;
    if (sil_rpc_get_int(p, "max_tokens", 1, cfg->max_tokens_limit, &max_tokens, O, err) < 0 ||
        sil_rpc_get_double(p, "temperature", 0, 100, &temp, O, err) < 0 ||
        sil_rpc_get_int(p, "top_k", 0, 1 << 24, &top_k, O, err) < 0 ||
        sil_rpc_get_double(p, "top_p", 0, 1, &top_p, O, err) < 0 ||
        sil_rpc_get_double(p, "min_p", 0, 1, &min_p, O, err) < 0 ||
        sil_rpc_get_double(p, "repeat_penalty", 0.01, 100, &rep, O, err) < 0 ||
        sil_rpc_get_int(p, "repeat_last_n", 0, 1 << 20, &rep_n, O, err) < 0 ||
        sil_rpc_get_double(p, "presence_penalty", -100, 100, &pres, O, err) < 0 ||
        sil_rpc_get_uint(p, "seed", 0, UINT64_MAX, &seed, O, err) < 0 ||
        sil_rpc_get_int(p, "max_thinking_tokens", -1, 1 << 24, &think, O, err) < 0 ||
        sil_rpc_get_int(p, "grace_tokens", 0, SIL_GENCTL_GRACE_MAX, &grace, O, err) < 0 ||
        sil_rpc_get_bool(p, "repair_markdown", &repair, O, err) < 0 ||
        sil_rpc_get_bool(p, "progress", &progress, O, err) < 0 ||
        sil_rpc_get_strbuf(p, "session", j->session, sizeof j->session, O, err) < 0)
        return -EINVAL;
    j->sampling.temperature = (float)temp;
    j->sampling.top_k = (int32_t)top_k;
    j->sampling.top_p = (float)top_p;
    j->sampling.min_p = (float)min_p;
    j->sampling.repeat_penalty = (float)rep;
    j->sampling.repeat_last_n = (int32_t)rep_n;
    j->sampling.presence_penalty = (float)pres;
    j->sampling.seed = seed;
    j->ctl.max_tokens = (int32_t)max_tokens;
    j->ctl.max_thinking_tokens = (int32_t)think;
    j->ctl.grace_tokens = (int32_t)grace;
    j->ctl.repair_markdown = repair;
    j->progress = progress;

    j->priority = SIL_PRIO_NORMAL;
    const msgpack_object *prio = sil_rpc_map_get(p, "priority");
    if (prio && prio->type == MSGPACK_OBJECT_STR) {
        static const char *const names[] = { "interactive", "normal", "batch" };
        j->priority = -1;
        for (int i = 0; i < 3; i++)
            if (prio->via.str.size == strlen(names[i]) && memcmp(prio->via.str.ptr, names[i], prio->via.str.size) == 0)
                j->priority = i;
        if (j->priority < 0)
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                  "priority: expected \"interactive\", \"normal\" or \"batch\"");
    } else if (prio && prio->type != MSGPACK_OBJECT_NIL) {
        int64_t v;
        if (sil_rpc_get_int(p, "priority", 0, 2, &v, O, err) < 0)
            return -EINVAL;
        j->priority = (int)v;
    }
    /* spec: "off", or the tokens to draft a step; needs the daemon's draft model */
    const msgpack_object *spec = sil_rpc_map_get(p, "spec");
    if (spec && spec->type == MSGPACK_OBJECT_STR) {
        if (spec->via.str.size != 3 || memcmp(spec->via.str.ptr, "off", 3) != 0)
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                  "spec: expected \"off\" or a depth in [1, %d]",
                                  SIL_CONFIG_SPEC_DEPTH_MAX);
        j->spec = -1;
    } else if (spec && spec->type != MSGPACK_OBJECT_NIL) {
        int64_t v;
        if (sil_rpc_get_int(p, "spec", 1, SIL_CONFIG_SPEC_DEPTH_MAX, &v, O, err) < 0)
            return -EINVAL;
        if (cfg->spec == SIL_SPEC_OFF)
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                  "spec: siliceod runs without a draft model or MTP drafting "
                                  "(spec = off)");
        j->spec = (int32_t)v;
    }
    int64_t level = 0;
    if (sil_rpc_get_int(p, "priority_level", SIL_PRIO_LEVEL_MIN, SIL_PRIO_LEVEL_MAX, &level, O,
                        err) < 0)
        return -EINVAL;
    j->priority_level = (int)level;

    /* stop: a string or an array of strings. */
    const msgpack_object *stop = sil_rpc_map_get(p, "stop");
    if (stop && stop->type != MSGPACK_OBJECT_NIL) {
        const msgpack_object *items = stop;
        uint32_t n = 1;
        if (stop->type == MSGPACK_OBJECT_ARRAY) {
            n = stop->via.array.size;
            items = stop->via.array.ptr;
        } else if (stop->type != MSGPACK_OBJECT_STR) {
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "stop: expected a string or an array of strings");
        }
        if (n > SIL_GENCTL_MAX_STOP)
            return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "stop: at most %d strings", SIL_GENCTL_MAX_STOP);
        j->stop_buf = malloc((size_t)n * (SIL_GENCTL_MAX_STOP_LEN + 1) + 1);
        if (!j->stop_buf)
            return sil_rpc_errorf(err, -ENOMEM, SIL_RPC_E_INTERNAL, "out of memory");
        char *q = j->stop_buf;
        for (uint32_t i = 0; i < n; i++) {
            const msgpack_object *o = &items[i];
            if (o->type != MSGPACK_OBJECT_STR || o->via.str.size == 0 || o->via.str.size > SIL_GENCTL_MAX_STOP_LEN ||
                memchr(o->via.str.ptr, 0, o->via.str.size))
                return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS,
                                      "stop[%u]: expected a string of 1 to %d bytes", i, SIL_GENCTL_MAX_STOP_LEN);
            /* The text it is matched against is valid UTF-8; a string that is not could only hold
             * back part of a character. */
            if (!sil_utf8_valid(o->via.str.ptr, o->via.str.size))
                return sil_rpc_errorf(err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "stop[%u]: not valid UTF-8", i);
            memcpy(q, o->via.str.ptr, o->via.str.size);
            q[o->via.str.size] = 0;
            j->stop_ptrs[i] = q;
            q += o->via.str.size + 1;
        }
        j->ctl.stop = j->stop_ptrs;
        j->ctl.n_stop = n;
    }
    return read_logit_bias(s, p, j, err);
}

static int submit(struct conn *c, const struct sil_rpc_msg *m, struct sil_job_req *j)
{
    struct server *s = c->srv;
    int32_t n_ctx = sil_engine_n_ctx(s->engine);
    if (j->n_prompt == 0) {
        sil_job_req_free(j);
        return sil_send_error(c, m->msgid, SIL_RPC_E_INVALID_PARAMS, "empty prompt");
    }
    /* A chat on a session is checked by the engine thread, once older turns of its conversation
     * were dropped (session.c). */
    if (!j->chat && (int64_t)j->n_prompt + 1 >= n_ctx) {
        size_t n = j->n_prompt;
        sil_job_req_free(j);
        return sil_send_error(c, m->msgid, SIL_RPC_E_CONTEXT_FULL,
                              "prompt of %zu tokens does not fit the context of %d", n, n_ctx);
    }
    if (sil_inflight_has(c, m->msgid)) {
        sil_job_req_free(j);
        return sil_send_error(c, m->msgid, SIL_RPC_E_INVALID_REQUEST, "msgid %u is already in flight", m->msgid);
    }
    if (sil_inflight_add(c, m->msgid) < 0) {
        sil_job_req_free(j);
        return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    }
    j->conn_id = c->id;
    j->msgid = m->msgid;
    j->uid = c->cred.uid;
    if (sil_worker_submit(s->worker, j) < 0) {
        sil_inflight_remove(c, m->msgid);
        sil_job_req_free(j);
        return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    }
    return 0;
}

/* Admission control shared by generate, chat and debug.stream. */
static int admit_request(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    if (c->n_inflight >= s->cfg->max_client_requests) {
        s->requests_rejected++;
        return sil_send_error(c, m->msgid, SIL_RPC_E_BUSY, "more than %d requests in flight on this connection",
                              s->cfg->max_client_requests);
    }
    if (s->worker && s->model_state != MODEL_OK && strcmp(m->method, "debug.stream") != 0) {
        s->requests_rejected++;
        if (s->model_state == MODEL_RELOADING) {
            /* what the last load took, less what this reload has taken: the time to wait
             * before sending it again, so retrying clients do not spin */
            double left = s->load_s > 0 ? s->load_s - (now_s() - s->reload_t0) : 1.0;
            const int ms = left < 0.1 ? 100 : left > 5.0 ? 5000 : (int)(left * 1000);
            return sil_send_error_retry(c, m->msgid, SIL_RPC_E_UNAVAILABLE, ms,
                                        "the model is being reloaded; send the request again after "
                                        "retry_after_ms");
        }
        return sil_send_error(c, m->msgid, SIL_RPC_E_UNAVAILABLE, "%s", s->model_problem);
    }
    if (s->worker && strcmp(m->method, "debug.stream") != 0) {
        /* Every request submitted and not finished counts, those still in the worker's inbox
         * too: a burst cannot queue past the limit before the worker has seen it. */
        int jobs = sil_worker_jobs(s->worker);
        if (jobs >= s->cfg->max_running + s->cfg->max_queue) {
            s->requests_rejected++;
            return sil_send_error(c, m->msgid, SIL_RPC_E_BUSY, "queue full (%d requests running or waiting, max_queue %d)",
                                  jobs, s->cfg->max_queue);
        }
    }
    return 1;
}

bool sil_prompt_ends_in_think(const struct sil_vocab *v, const int32_t *ids, size_t n)
{
    int32_t open = sil_vocab_think_open(v);
    if (open < 0 || n == 0)
        return false;
    if (ids[n - 1] == open)
        return true;
    if (n >= 2 && ids[n - 2] == open) {
        const char *b;
        int len = sil_token_bytes(v, ids[n - 1], &b);
        for (int i = 0; i < len; i++)
            if (b[i] != '\n' && b[i] != ' ')
                return false;
        return len > 0;
    }
    return false;
}

/* The start of generate and chat: a model that serves, room in the queue, a fresh request.
 * Returns 1 with *out set, else what answering the client returned (0, or < 0 to close). */
static int new_gen_request(struct conn *c, const struct sil_rpc_msg *m, struct sil_job_req **out)
{
    int ok = need_model(c, m);
    if (ok > 0)
        ok = sil_model_pick(c, m);
    if (ok > 0)
        ok = admit_request(c, m);
    if (ok <= 0)
        return ok;
    *out = calloc(1, sizeof(**out));
    if (!*out)
        return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    return 1;
}

static int m_generate(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    struct sil_job_req *j = NULL;
    int ok = new_gen_request(c, m, &j);
    if (ok <= 0 || !j)
        return ok;
    struct sil_rpc_error err = { 0 };
    const char *text = NULL;
    size_t len = 0;
    const msgpack_object *toks = NULL;
    bool special = true, add_bos = sil_vocab_add_bos(s->vocab);
    if (read_gen_params(s, m->params, j, &err) < 0 ||
        sil_rpc_get_str(m->params, "prompt", &text, &len, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE, &err) < 0 ||
        sil_rpc_get_array(m->params, "prompt_tokens", &toks, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE, &err) < 0 ||
        sil_rpc_get_bool(m->params, "special", &special, SIL_RPC_OPTIONAL, &err) < 0 ||
        sil_rpc_get_bool(m->params, "add_bos", &add_bos, SIL_RPC_OPTIONAL, &err) < 0)
        goto bad;
    if (!text == !toks) {
        sil_rpc_errorf(&err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "give exactly one of prompt and prompt_tokens");
        goto bad;
    }
    if (toks) {
        if (read_ids(s, toks, "prompt_tokens", &j->prompt, &j->n_prompt, &err) < 0)
            goto bad;
    } else if (len >= TOKJOB_MIN_TEXT) {
        /* A long prompt is tokenized off the loop, so other streams do not wait for it. */
        if (sil_inflight_has(c, m->msgid)) {
            sil_job_req_free(j);
            return sil_send_error(c, m->msgid, SIL_RPC_E_INVALID_REQUEST, "msgid %u is already in flight", m->msgid);
        }
        j->uid = c->cred.uid; /* sessions are the caller's uid's (submit() is not reached) */
        if (sil_tokpool_submit(s, c, m->msgid, text, len, add_bos, special, j) < 0) {
            sil_job_req_free(j);
            return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
        }
        return 0;
    } else {
        struct sil_error e = { 0 };
        if (sil_tokenize(s->vocab, text, len, add_bos, special, &j->prompt, &j->n_prompt, &e) < 0) {
            sil_rpc_errorf(&err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "prompt: %s", e.msg);
            goto bad;
        }
    }
    j->ctl.in_reasoning = sil_prompt_ends_in_think(s->vocab, j->prompt, j->n_prompt);
    return submit(c, m, j);
bad:
    sil_job_req_free(j);
    return sil_send_rpc_error(c, m->msgid, &err);
}

static int m_chat(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    struct sil_job_req *j = NULL;
    int ok = new_gen_request(c, m, &j);
    if (ok <= 0 || !j)
        return ok;
    struct sil_rpc_error err = { 0 };
    struct sil_chat_msg *msgs = NULL;
    char **strs = NULL;
    uint32_t n = 0;
    const msgpack_object *arr;
    bool think = sil_vocab_think_open(s->vocab) >= 0, append = false;
    if (read_gen_params(s, m->params, j, &err) < 0 ||
        sil_rpc_get_array(m->params, "messages", &arr, SIL_RPC_REQUIRED, &err) < 0 ||
        sil_rpc_get_bool(m->params, "think", &think, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE, &err) < 0 ||
        sil_rpc_get_bool(m->params, "append", &append, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE,
                         &err) < 0)
        goto bad;
    if (append && !j->session[0]) {
        sil_rpc_errorf(&err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "append: needs a session");
        goto bad;
    }
    n = arr->via.array.size;
    if (n == 0 || n > MAX_CHAT_MESSAGES) {
        sil_rpc_errorf(&err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "messages: expected 1 to %d messages", MAX_CHAT_MESSAGES);
        goto bad;
    }
    msgs = calloc(n, sizeof(*msgs));
    strs = calloc((size_t)n * 3, sizeof(*strs));
    if (!msgs || !strs) {
        sil_rpc_errorf(&err, -ENOMEM, SIL_RPC_E_INTERNAL, "out of memory");
        goto bad;
    }
    for (uint32_t i = 0; i < n; i++) {
        const msgpack_object *o = &arr->via.array.ptr[i];
        const char *keys[3] = { "role", "content", "reasoning" };
        if (o->type != MSGPACK_OBJECT_MAP) {
            sil_rpc_errorf(&err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "messages[%u]: expected a map {role, content}", i);
            goto bad;
        }
        for (int k = 0; k < 3; k++) {
            const char *str;
            size_t len;
            int rc = sil_rpc_get_str(o, keys[k], &str, &len, k < 2 ? SIL_RPC_REQUIRED : SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE,
                                     &err);
            if (rc < 0 || (rc == 1 && memchr(str, 0, len))) {
                if (rc >= 0)
                    sil_rpc_errorf(&err, -EINVAL, SIL_RPC_E_INVALID_PARAMS, "%s: contains a NUL byte", keys[k]);
                sil_rpc_error_prefix(&err, "messages[%u]", i);
                goto bad;
            }
            if (rc == 1) {
                strs[i * 3 + k] = strndup(str, len);
                if (!strs[i * 3 + k]) {
                    sil_rpc_errorf(&err, -ENOMEM, SIL_RPC_E_INTERNAL, "out of memory");
                    goto bad;
                }
            }
        }
        msgs[i].role = strs[i * 3];
        msgs[i].content = strs[i * 3 + 1];
        msgs[i].reasoning = strs[i * 3 + 2];
    }
    /* Token ids straight from the template: message contents are never parsed for special
     * tokens, so a message cannot close its turn and open a system turn by its text. */
    struct sil_error e = { 0 };
    int rc = sil_chat_tokenize(s->vocab, msgs, n, true, think, &j->prompt, &j->n_prompt, &e);
    if (rc < 0) {
        sil_rpc_errorf(&err, rc, rc == -ENOMEM ? SIL_RPC_E_INTERNAL : SIL_RPC_E_INVALID_PARAMS, "messages: %s",
                       e.msg);
        goto bad;
    }
    j->ctl.in_reasoning = think && sil_prompt_ends_in_think(s->vocab, j->prompt, j->n_prompt);
    if (j->session[0]) {
        /* The messages go with the job: the session keeps them as its transcript. */
        j->chat = msgs;
        j->n_chat = n;
        j->think = think;
        j->append = append;
        free(strs); /* the strings now belong to msgs */
        return submit(c, m, j);
    }
    for (uint32_t i = 0; i < n * 3; i++)
        free(strs[i]);
    free(strs);
    free(msgs);
    return submit(c, m, j);
bad:
    if (strs)
        for (uint32_t i = 0; i < n * 3; i++)
            free(strs[i]);
    free(strs);
    free(msgs);
    sil_job_req_free(j);
    return sil_send_rpc_error(c, m->msgid, &err);
}

static int m_cancel(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    struct sil_rpc_error err = { 0 };
    int64_t id;
    if (sil_rpc_get_int(m->params, "id", 0, UINT32_MAX, &id, SIL_RPC_REQUIRED, &err) < 0)
        return sil_send_rpc_error(c, m->msgid, &err);
    if (!sil_inflight_has(c, (uint32_t)id))
        return sil_send_error(c, m->msgid, SIL_RPC_E_NOT_FOUND, "no request %lld in flight on this connection",
                              (long long)id);
    bool is_stream = false;
    for (struct dstream *d = c->streams; d; d = d->next)
        if (d->msgid == (uint32_t)id) {
            d->cancelled = true;
            is_stream = true;
        }
    /* a request waiting for its model ends here (error 8), one on the worker there */
    const int waited = is_stream ? 0 : sil_models_cancel(c, (uint32_t)id);
    if (waited < 0)
        return -1;
    if (!is_stream && !waited && sil_worker_cancel(s->worker, c->id, (uint32_t)id) < 0)
        return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 0);
    sil_rpc_end(&s->scratch);
    if (sil_conn_send_scratch(c) < 0)
        return -1;
    return is_stream ? sil_pump_streams(c) : 0;
}

static int m_sessions_list(struct conn *c, const struct sil_rpc_msg *m)
{
    int ok = need_model(c, m);
    if (ok <= 0)
        return ok;
    /* In flight like a generation, so a half-closed connection waits for the answer. */
    if (sil_inflight_add(c, m->msgid) < 0 ||
        sil_worker_sessions_list(c->srv->worker, c->id, m->msgid, c->cred.uid, c->owner) < 0) {
        sil_inflight_remove(c, m->msgid);
        return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    }
    return 0;
}

static int m_sessions_drop(struct conn *c, const struct sil_rpc_msg *m)
{
    int ok = need_model(c, m);
    if (ok <= 0)
        return ok;
    struct sil_rpc_error err = { 0 };
    char name[SIL_SESSION_NAME_MAX];
    uint64_t uid = c->cred.uid;
    if (sil_rpc_get_strbuf(m->params, "name", name, sizeof name, SIL_RPC_REQUIRED, &err) < 0 ||
        sil_rpc_get_uint(m->params, "uid", 0, UINT32_MAX, &uid, SIL_RPC_OPTIONAL | SIL_RPC_NULLABLE,
                         &err) < 0)
        return sil_send_rpc_error(c, m->msgid, &err);
    /* Another uid's session is only the daemon owner's to drop. */
    if (uid != c->cred.uid && !c->owner)
        return sil_send_error(c, m->msgid, SIL_RPC_E_PERMISSION,
                              "sessions.drop: only the daemon's owner may drop another uid's session");
    if (sil_inflight_add(c, m->msgid) < 0 ||
        sil_worker_session_drop(c->srv->worker, c->id, m->msgid, (uint32_t)uid, name) < 0) {
        sil_inflight_remove(c, m->msgid);
        return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    }
    return 0;
}

/* models: every model requests may name (models.h), the loaded one marked. */
static int m_models(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    char dir[PATH_MAX];
    sil_server_models_dir(s, dir, sizeof dir);
    struct sil_model_entry *list = NULL;
    size_t n = 0;
    if (sil_models_list(dir, s->cfg->model, &list, &n) < 0)
        return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    const struct sil_model_info *info = s->engine ? sil_engine_info(s->engine) : NULL;
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 4);
    sil_rpc_pack_cstr(pk, "models");
    msgpack_pack_array(pk, n);
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        const bool loaded = info && stat(list[i].path, &st) == 0 &&
                            (uint64_t)st.st_dev == info->file_dev &&
                            (uint64_t)st.st_ino == info->file_ino;
        msgpack_pack_map(pk, 4);
        sil_rpc_kv_str(pk, "name", list[i].name);
        sil_utf8_pack_kv(pk, "file", list[i].path, strlen(list[i].path)); /* a path is bytes */
        sil_rpc_kv_uint(pk, "size", list[i].size);
        sil_rpc_kv_bool(pk, "loaded", loaded);
    }
    sil_models_free(list);
    kv_text_or_nil(pk, "loaded", s->model_name);
    kv_text_or_nil(pk, "dir", dir);
    sil_rpc_kv_int(pk, "keep_alive", s->cfg->keep_alive);
    if (sil_rpc_end(&s->scratch) < 0)
        return sil_send_error(c, m->msgid, SIL_RPC_E_TOO_LARGE, "result too large");
    return sil_send_result_scratch(c, m->msgid);
}

static int m_shutdown(struct conn *c, const struct sil_rpc_msg *m)
{
    struct server *s = c->srv;
    if (!c->owner)
        return sil_send_error(c, m->msgid, SIL_RPC_E_PERMISSION, "shutdown: only the daemon's owner (uid %d) or root may",
                              (int)geteuid());
    msgpack_packer *pk = sil_rpc_begin_response(&s->scratch, m->msgid);
    msgpack_pack_map(pk, 0);
    sil_rpc_end(&s->scratch);
    if (sil_conn_send_scratch(c) < 0)
        return -1;
    char why[64];
    snprintf(why, sizeof why, "shutdown requested by pid %d", c->cred.pid);
    sil_begin_shutdown(s, why);
    return 0;
}

static int m_debug_stream(struct conn *c, const struct sil_rpc_msg *m)
{
    struct sil_rpc_error err = { 0 };
    int64_t count;
    const char *text = "x";
    size_t len = 1;
    int ok = admit_request(c, m);
    if (ok <= 0)
        return ok;
    if (sil_rpc_get_int(m->params, "count", 0, MAX_DEBUG_STREAM, &count, SIL_RPC_REQUIRED, &err) < 0 ||
        sil_rpc_get_str(m->params, "text", &text, &len, SIL_RPC_OPTIONAL, &err) < 0)
        return sil_send_rpc_error(c, m->msgid, &err);
    if (len > 4096)
        return sil_send_error(c, m->msgid, SIL_RPC_E_INVALID_PARAMS, "text: at most 4096 bytes");
    if (sil_inflight_has(c, m->msgid))
        return sil_send_error(c, m->msgid, SIL_RPC_E_INVALID_REQUEST, "msgid %u is already in flight", m->msgid);
    size_t clean_len = sil_utf8_sanitized_len(text, len); /* streamed back: valid UTF-8 only */
    struct dstream *d = calloc(1, sizeof(*d) + clean_len);
    if (!d || sil_inflight_add(c, m->msgid) < 0) {
        free(d);
        return sil_send_error(c, m->msgid, SIL_RPC_E_INTERNAL, "out of memory");
    }
    d->msgid = m->msgid;
    d->remaining = (uint64_t)count;
    d->len = sil_utf8_sanitize(text, len, d->text);
    struct dstream **p = &c->streams;
    while (*p)
        p = &(*p)->next;
    *p = d;
    return sil_pump_streams(c);
}

struct method {
    const char *name;
    int (*fn)(struct conn *c, const struct sil_rpc_msg *m);
    bool during_shutdown;
};

static const struct method methods[] = {
    { "hello", m_hello, true },
    { "status", m_status, true },
    { "metrics", m_metrics, true },
    { "generate", m_generate, false },
    { "chat", m_chat, false },
    { "cancel", m_cancel, true },
    { "tokenize", m_tokenize, true },
    { "detokenize", m_detokenize, true },
    { "sessions.list", m_sessions_list, false },
    { "sessions.drop", m_sessions_drop, false },
    { "shutdown", m_shutdown, true },
    { "models", m_models, true },
    { "debug.stream", m_debug_stream, false },
};

int sil_dispatch(struct conn *c, const struct sil_rpc_msg *m)
{
    if (m->type != SIL_RPC_REQUEST)
        return 0; /* no notifications or responses are expected from clients; ignored */
    for (size_t i = 0; i < sizeof methods / sizeof *methods; i++) {
        if (strcmp(methods[i].name, m->method) != 0)
            continue;
        if (c->srv->state != RUNNING && !methods[i].during_shutdown)
            return sil_send_error(c, m->msgid, SIL_RPC_E_SHUTTING_DOWN, "siliceod is shutting down");
        sil_debug("client %llu: %s (msgid %u)", (unsigned long long)c->id, m->method, m->msgid);
        return methods[i].fn(c, m);
    }
    return sil_send_error(c, m->msgid, SIL_RPC_E_METHOD_NOT_FOUND, "unknown method '%.64s'", m->method);
}
