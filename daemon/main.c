/* siliceod: parse the configuration, then run the daemon (server.c) or inspect a model file. */
#include <stdio.h>
#include <stdlib.h>

#include "daemon/config.h"
#include "daemon/engine/engine.h"
#include "daemon/log.h"
#include "daemon/server.h"

int main(int argc, char **argv)
{
    struct sil_config cfg;
    struct sil_cli cli;
    struct sil_error err = { 0 };
    if (sil_config_from_args(&cfg, &cli, argc, argv, &err) < 0) {
        if (!cli.usage_error) {
            fprintf(stderr, "siliceod: %s\n", err.msg);
            return 1; /* siliceod(8): a bad configuration is a failure to start */
        }
        fprintf(stderr, "siliceod: %s; try 'siliceod --help'\n", err.msg); /* one line */
        return 2;
    }
    switch (cli.action) {
    case SIL_CLI_HELP:
        sil_usage(stdout);
        return 0;
    case SIL_CLI_VERSION:
        printf("siliceod %s (protocol 1)\nbackends: %s\n", SIL_VERSION, sil_engine_backends());
        return 0;
    case SIL_CLI_INSPECT:
        if (sil_model_inspect(cli.inspect_path, stdout, &err) < 0) {
            fflush(stdout);
            fprintf(stderr, "siliceod: %s\n", err.msg);
            return 1;
        }
        return 0;
    case SIL_CLI_RUN:
        break;
    }
    sil_log_init(cfg.log_level);
    return sil_daemon_run(&cfg, argc, argv);
}
