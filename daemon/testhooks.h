/* Test-only hooks for the integration tests, read from the environment variable
 * SILICEOD_TEST_HOOKS ("name=value,name=value"). They make timing tests deterministic (an engine
 * that stalls, a slow but live evaluation, a slow model load) and switch the model-file watch
 * off. Unset, every hook is 0 and the daemon behaves normally. */
#ifndef SIL_DAEMON_TESTHOOKS_H
#define SIL_DAEMON_TESTHOOKS_H

/* The value of hook name (a non-negative integer), or 0 when it is not set. */
int sil_test_hook(const char *name);

#endif
