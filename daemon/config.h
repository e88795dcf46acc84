/* siliceod configuration: built-in defaults, then the config file (--config PATH, else
 * /etc/siliceo/siliceod.conf when it exists), then command-line flags. siliceod.conf(5) lists
 * every key. The file is "key = value" lines; '#' starts a comment; sizes take K/M/G suffixes.
 *
 * SIGHUP re-reads the file and re-applies the flags; what can change live is copied by
 * sil_config_apply_live(), the rest (model, socket, threads, backend, memory budgets, context, KV)
 * needs a restart. */
#ifndef SIL_DAEMON_CONFIG_H
#define SIL_DAEMON_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#include "daemon/engine/size.h" /* sil_parse_size */
#include "kernels/cuda/cuda_options.h"
#include "kernels/error.h"

#define SIL_DEFAULT_CONFIG "/etc/siliceo/siliceod.conf"
#define SIL_CONFIG_MAX_IDS 32

enum sil_spec_mode { SIL_SPEC_OFF = 0, SIL_SPEC_DRAFT = 1, SIL_SPEC_MTP = 2 };
/* The deepest chain siliceod drafts (spec.h's SIL_SPEC_DEPTH_MAX), and the most rows of a token
 * tree, 1 + WIDTH x DEPTH (spec.h's SIL_SPEC_TREE_ROWS). */
#define SIL_CONFIG_SPEC_DEPTH_MAX 64
#define SIL_CONFIG_SPEC_TREE_ROWS 64

enum sil_log_level { SIL_LOG_ERR = 3, SIL_LOG_WARNING = 4, SIL_LOG_NOTICE = 5, SIL_LOG_INFO = 6, SIL_LOG_DEBUG = 7 };

struct sil_config {
    char config_path[PATH_MAX]; /* file read, "" when none */
    char model[PATH_MAX];       /* the default model: loaded at start; "" = none (models_dir) */
    /* Models by name (models.h): the directory of GGUF files requests may name ("" = the state
     * directory's models/), and the seconds an idle model stays loaded (0 = until stopped). */
    char models_dir[PATH_MAX];
    int keep_alive;
    char socket[PATH_MAX];      /* "" = the default path (see siliceo-proto.h) */
    int threads;                /* 0 = online CPUs */
    char backend[8];            /* cpu | cuda | auto */
    uint64_t vram_budget;       /* bytes, 0 = no limit */
    /* Host memory for the routed experts' host tier: bytes, 0 = auto (what the host and the
     * cgroup can spare); host_budget_off: the model mapped as before, whatever fits. */
    uint64_t host_budget;
    bool host_budget_off;
    int32_t ctx;                /* positions per sequence, 0 = engine default */
    char kv_type[8];            /* KV elements: f32 | f16 | q8_0 | q4_0 */
    uint64_t kv_budget;         /* KV pool bytes (CPU), 0 = every sequence at the context */
    /* Who may connect besides the daemon's own uid (and root). */
    uid_t allow_uids[SIL_CONFIG_MAX_IDS];
    int n_allow_uids;
    gid_t allow_gids[SIL_CONFIG_MAX_IDS];
    int n_allow_gids;
    char socket_group[64];      /* group owning the socket ("" = the daemon's); names or numbers */
    /* Limits. */
    uint64_t max_message;       /* bytes in one incoming message */
    uint64_t max_output;        /* bytes queued for one client before it is dropped */
    int max_clients;
    int max_queue;              /* requests waiting for a sequence slot */
    int max_running;            /* sequences generating at once */
    int max_client_requests;    /* requests in flight per connection */
    int32_t max_tokens_default; /* answer budget when a request gives none */
    int32_t max_tokens_limit;   /* largest max_tokens accepted */
    int32_t prefill_chunk;      /* prompt tokens evaluated per step, across requests */
    int32_t host_prefill_chunk; /* the same with the host tier on and nothing generating */
    int32_t prefill_budget;     /* the same while sequences decode (the step stays short) */
    double prefill_stretch;     /* a step with prompt rows within this x a decode step; 0 = off */
    int priority_aging;         /* seconds of waiting that lift a request by one class */
    uint64_t session_memory;    /* engine state kept by idle sessions, bytes; LRU beyond it */
    int max_sessions;
    int session_checkpoints; /* recurrent-state checkpoints a session keeps (hybrid models) */
    /* Chat transcripts saved in state_dir/sessions (sessfile.h), per uid: files and their bytes
     * at most; 0 files = none saved. */
    int saved_sessions;
    uint64_t saved_session_bytes;
    bool prefix_cache;       /* reuse KV blocks of earlier prompts across requests */
    int prefix_checkpoint_blocks;      /* hybrid models: a snapshot every this many blocks */
    uint64_t prefix_checkpoint_memory; /* bytes of those snapshots kept at most */
    uint64_t prefix_cache_memory;      /* KV blocks no request holds kept for reuse, bytes */
    int idle_timeout;           /* seconds a connection may sit with nothing in flight, 0 = never */
    int message_timeout;        /* seconds an incomplete message may wait for its rest, 0 = never */
    uint64_t max_input;         /* unparsed input buffered across all connections */
    /* Warm restart: the expert heat map is kept in state_dir ("" = the default: $STATE_DIRECTORY,
     * else /var/lib/siliceo for root, else $XDG_STATE_HOME/siliceo or ~/.local/state/siliceo),
     * saved every heat_save_interval seconds (0 = at shutdown only) and at shutdown. */
    char state_dir[PATH_MAX];
    bool heat_map;
    int heat_save_interval;
    /* The expert cache simulated on the CPU (0 slots = off) and its policy ("" = the default). */
    int32_t ecache_slots;
    char ecache_policy[16];
    /* The CUDA backend's user options (cuda_graphs, cuda_zero_copy, cuda_pin, cuda_cpu_share);
     * all zero: the defaults. Its other fields are never set from the config. */
    struct sil_cuda_options cuda;
    /* Speculative decoding (spec.h): off, a draft model (draft_model, opened beside every
     * model served, with the same vocabulary) or the served model's own MTP layer drafting
     * chains of spec_depth tokens, or (a draft model, spec_width > 1) token trees of
     * spec_width chains; requests may ask for another depth or none (generate's spec). */
    int spec;                      /* SIL_SPEC_OFF, SIL_SPEC_DRAFT or SIL_SPEC_MTP */
    char draft_model[PATH_MAX];
    int32_t spec_width, spec_depth; /* from spec_tree = WIDTHxDEPTH */
    int log_level;
    bool foreground;
    bool no_model;              /* --no-model: protocol-only diagnostics (debug.stream) */
};

void sil_config_defaults(struct sil_config *c);

/* Reads one config file into c. -ENOENT when it does not exist (err set), -EINVAL with
 * "file:line: key: why" for a bad line. */
int sil_config_load_file(struct sil_config *c, const char *path, struct sil_error *err);

/* What the command line asked for besides configuration. */
enum sil_cli_action { SIL_CLI_RUN, SIL_CLI_HELP, SIL_CLI_VERSION, SIL_CLI_INSPECT };
struct sil_cli {
    enum sil_cli_action action;
    const char *inspect_path;
    bool usage_error; /* the error is in the command line itself (exit 2), not the settings (1) */
};

/* Defaults, the config file, then the flags in argv. Does not touch getopt's global state
 * beyond resetting it, so it can run again on SIGHUP. */
int sil_config_from_args(struct sil_config *c, struct sil_cli *cli, int argc, char *const *argv,
                         struct sil_error *err);

/* Copies the settings that can change without a restart from src into dst; names the ones that
 * differ but cannot (for a log line) in changed_static, "" if none. */
void sil_config_apply_live(struct sil_config *dst, const struct sil_config *src, char *changed_static,
                           size_t size);

/* The state directory cfg->state_dir names, or the default above, into out: -ENAMETOOLONG, or
 * -ENOENT when no default applies (no HOME). */
int sil_config_state_dir(const struct sil_config *c, char *out, size_t size);
/* The same, created when missing (mkdir -p, the last component 0750): 0 or -errno. When the
 * default of a user who is not root cannot be made (no HOME, or one not writable), it is
 * /var/tmp/siliceo-UID (0700, which must be the user's and not writable by others), and note
 * says why ("" when the first choice was used); on failure note says what failed. */
int sil_config_make_state_dir(const struct sil_config *c, char *out, size_t size, char *note,
                              size_t note_n);

int sil_parse_log_level(const char *s); /* -EINVAL for an unknown name */
/* A --spec-tree value, WIDTHxDEPTH: a chain (width 1) or a token tree, depth
 * 1..SIL_CONFIG_SPEC_DEPTH_MAX and a tree's 1 + width x depth at most SIL_CONFIG_SPEC_TREE_ROWS; -EINVAL
 * with why filled otherwise (width and depth then unchanged). */
int sil_parse_spec_tree(const char *s, int32_t *width, int32_t *depth, char *why,
                        size_t why_size);
const char *sil_log_level_name(int level);

void sil_usage(FILE *f);

#endif
