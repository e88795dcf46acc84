/* Fuzz target for the config file reader: any bytes, read as a config file (through a memfd)
 * over the defaults. Accepted or refused (a refusal must say why), every setting must stay in
 * the range siliceod.conf(5) gives it, since a refused line leaves the lines before it applied,
 * the strings stay terminated, and the live-reload copy of it into a default config must take
 * what may change live and name what may not. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "daemon/config.h"

static void terminated(const char *s, size_t size)
{
    if (!memchr(s, 0, size)) abort();
}

static void in(long long v, long long lo, long long hi)
{
    if (v < lo || v > hi) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > 1 << 16) return 0;
    int fd = memfd_create("fuzz-config", 0);
    if (fd < 0) return 0;
    if (write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    struct sil_config c;
    struct sil_error err = { 0 };
    sil_config_defaults(&c);
    const int rc = sil_config_load_file(&c, path, &err);
    close(fd);
    if (rc != 0 && (rc != -EINVAL || !err.msg[0])) abort();
    terminated(c.model, sizeof c.model);
    terminated(c.socket, sizeof c.socket);
    terminated(c.backend, sizeof c.backend);
    terminated(c.kv_type, sizeof c.kv_type);
    terminated(c.socket_group, sizeof c.socket_group);
    terminated(c.state_dir, sizeof c.state_dir);
    terminated(c.ecache_policy, sizeof c.ecache_policy);
    in(c.n_allow_uids, 0, SIL_CONFIG_MAX_IDS);
    in(c.n_allow_gids, 0, SIL_CONFIG_MAX_IDS);
    in(c.threads, 0, 1024);
    in(c.ctx, 0, 1 << 24);
    in(c.max_clients, 1, 65536);
    in(c.max_running, 1, 1024);
    in(c.max_tokens_default, 1, 1 << 24);
    in(c.max_tokens_limit, 1, 1 << 24);
    in(c.prefill_chunk, 1, 1 << 16);
    in(c.prefill_budget, 1, 1 << 16);
    in(c.priority_aging, 1, 86400);
    in(c.prefix_checkpoint_blocks, 1, 1 << 16);
    in(c.log_level, SIL_LOG_ERR, SIL_LOG_DEBUG);
    if (c.prefill_stretch != 0 && !(c.prefill_stretch >= 1 && c.prefill_stretch <= 100)) abort();
    struct sil_config live;
    sil_config_defaults(&live);
    char changed[256];
    sil_config_apply_live(&live, &c, changed, sizeof changed);
    terminated(changed, sizeof changed);
    if (live.log_level != c.log_level || live.max_queue != c.max_queue ||
        live.n_allow_uids != c.n_allow_uids)
        abort();
    struct sil_config def;
    sil_config_defaults(&def);
    if ((def.prefill_stretch != c.prefill_stretch) != (strstr(changed, "prefill_stretch") != NULL))
        abort();
    return 0;
}
