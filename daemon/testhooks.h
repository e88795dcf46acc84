/* Test-only hooks for the integration tests, read from the environment variable
 * SILICEOD_TEST_HOOKS ("name=value,name=value"). They make timing tests deterministic (an engine
 * that stalls, a slow but live evaluation, a slow model load) and switch the model-file watch
 * off. Unset, every hook is 0 and the daemon behaves normally. */
#ifndef SIL_DAEMON_TESTHOOKS_H
#define SIL_DAEMON_TESTHOOKS_H

#include <stdbool.h>

/* The value of hook name (a non-negative integer), or 0 when it is not set. */
int sil_test_hook(const char *name);

/* The scheduler's hooks (values read once at worker start, worker_impl.h), called before each
 * evaluation of a step. */
struct sil_worker;
struct sil_error;
/* stall_ms=N: the engine thread stops for N ms before an evaluation that has prompt rows,
 * without a heartbeat, as a hung engine would. */
void sil_test_stall(struct sil_worker *w);
/* kv_tokens=N: true (err and the rows' status set) when the n rows of the batch do not fit an
 * engine with room for N positions over all sequences. */
bool sil_test_kv_full(struct sil_worker *w, int n, struct sil_error *err);

#endif
