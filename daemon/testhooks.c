/* SILICEOD_TEST_HOOKS parsing, and the scheduler's hooks (testhooks.h). */
#include "daemon/testhooks.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "daemon/worker_impl.h"

int sil_test_hook(const char *name)
{
    const char *s = getenv("SILICEOD_TEST_HOOKS");
    size_t n = strlen(name);
    while (s && *s) {
        if (strncmp(s, name, n) == 0 && s[n] == '=') {
            long v = strtol(s + n + 1, NULL, 10);
            return v > 0 && v < 1000000 ? (int)v : 0;
        }
        s = strchr(s, ',');
        if (s) s++;
    }
    return 0;
}

/* Test hook (SILICEOD_TEST_HOOKS stall_ms=N): the engine thread stops for N ms before an
 * evaluation that has prompt rows, without a heartbeat, as a hung engine would. */
void sil_test_stall(struct sil_worker *w)
{
    if (w->test_stall_ms <= 0) return;
    bool prefill = false;
    for (struct job *j = w->running; j; j = j->next)
        prefill |= !j->decoding;
    if (prefill) {
        struct timespec ts = {w->test_stall_ms / 1000, (w->test_stall_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Test hook (SILICEOD_TEST_HOOKS kv_tokens=N): an engine with room for N positions over all
 * sequences. Rows past it fail their sequence with -ENOBUFS, as the paged cache out of blocks does,
 * and the batch is not evaluated (every sequence stays as it was). */
bool sil_test_kv_full(struct sil_worker *w, int n, struct sil_error *err)
{
    if (w->test_kv_tokens <= 0)
        return false;
    int64_t used = 0;
    for (struct job *j = w->running; j; j = j->next)
        used += (int64_t)j->ctx.n;
    bool full = false;
    for (int r = 0; r < n; r++)
        w->b_status[r] = 0;
    for (int r = 0; r < n; r++)
        if (++used > w->test_kv_tokens) {
            full = true;
            for (int k = 0; k < n; k++)
                if (w->b_seq[k] == w->b_seq[r])
                    w->b_status[k] = -ENOBUFS;
        }
    if (full)
        sil_errorf(err, -ENOBUFS, "no KV space for the batch (test hook kv_tokens=%d)",
                   w->test_kv_tokens);
    return full;
}
