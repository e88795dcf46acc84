/* siliceod's event loop: the listening socket (bound here or passed by systemd), one connection
 * per client with a bounded output queue, the RPC methods of siliceo-rpc(7), signals, sd_notify
 * readiness / status / watchdog, and the orderly shutdown. The model runs on the worker thread
 * (worker.h); this thread never waits for it. */
#ifndef SIL_DAEMON_SERVER_H
#define SIL_DAEMON_SERVER_H

#include "daemon/config.h"
#include "kernels/error.h"

/* Runs the daemon until SIGTERM / SIGINT / the shutdown method. argv is kept for SIGHUP, which
 * re-reads the configuration. Returns the process exit status. */
int sil_daemon_run(struct sil_config *cfg, int argc, char *const *argv);

#endif
