/* --device for the subcommands that run a model (serve, bench, bench-engine, generate,
 * check-logits): opens the backend, or says why not; and their --tensor-parallel N. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

int cli_device_open(const char *cmd, const char *name, int n_threads, struct backend **out)
{
    struct cairn_err err = {0};
    if (backend_open(name ? name : "auto", n_threads, out, &err) == CAIRN_OK) return 0;
    fprintf(stderr, "cairn %s: --device %s: %s\n", cmd, name ? name : "auto", err.msg);
    return 2;
}

int cli_tp_parse(const char *cmd, const char *v, int *n)
{
    char *end = NULL;
    long k = v ? strtol(v, &end, 10) : 0;
    if (!v || !*v || *end || k < 1 || k > BACKEND_TP_MAX) {
        fprintf(stderr, "cairn %s: --tensor-parallel must be 1..%d, got '%s'\n", cmd,
                BACKEND_TP_MAX, v ? v : "");
        return 2;
    }
    *n = (int)k;
    return 0;
}

int cli_tp_wanted(int n)
{
    const char *force = getenv("CAIRN_TP_FORCE");
    return n > 1 || (force && strcmp(force, "1") == 0);
}

int cli_tp_open(const char *cmd, const char *device, int n, struct backend_tp **out)
{
    *out = NULL;
    if (!cli_tp_wanted(n)) return 0;
    struct cairn_err err = {0};
    if (backend_tp_open(device, n, out, &err) != CAIRN_OK) {
        fprintf(stderr, "cairn %s: --tensor-parallel %d --device %s: %s\n", cmd, n,
                device ? device : "auto", err.msg);
        return 2;
    }
    return 0;
}
