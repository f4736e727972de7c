/* --device for the subcommands that run a model (serve, bench, bench-engine, generate,
 * check-logits): opens the backend, or says why not. */
#include <stdio.h>

#include "cli/cli.h"

int cli_device_open(const char *cmd, const char *name, int n_threads, struct backend **out)
{
    struct cairn_err err = {0};
    if (backend_open(name ? name : "auto", n_threads, out, &err) == CAIRN_OK) return 0;
    fprintf(stderr, "cairn %s: --device %s: %s\n", cmd, name ? name : "auto", err.msg);
    return 2;
}
