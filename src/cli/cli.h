/* Subcommands of the cairn binary. Each lives in cli/cmd_<name>.c and is listed in main.c. */
#ifndef CAIRN_CLI_CLI_H
#define CAIRN_CLI_CLI_H

#include "tensor/backend.h"

struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name; returns exit code */
};

int cmd_version(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_check_logits(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_synth_model(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_bench_engine(int argc, char **argv);
int cmd_bench_grammar(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_render_template(int argc, char **argv);

/* --device NAME (auto|cpu|cuda[:N]; NULL: auto) for subcommand cmd: 0 with *out open (close
 * with backend_close), or the exit code 2 after a message on stderr saying why (e.g. a build
 * without CUDA, no GPU). */
int cli_device_open(const char *cmd, const char *name, int n_threads, struct backend **out);
#define CLI_DEVICE_HELP "  --device auto|cpu|cuda[:N]   where the model runs (default auto: a GPU if usable, else the CPU)\n"

/* --tensor-parallel N (cli_device.c): 0 with *n in 1..BACKEND_TP_MAX, or 2 after a message. */
int cli_tp_parse(const char *cmd, const char *v, int *n);
/* For the commands that cannot run a group yet (serve, bench): N > 1 opens the group first, so
 * that a count past the visible GPUs (or no CUDA) gets its own error, then says what is not
 * done; returns 2. N == 1: returns 0 (today's path). */
int cli_tp_refuse(const char *cmd, const char *device, int n);
#define CLI_TP_HELP                                                                                \
    "  --tensor-parallel N          shard the model over GPUs 0..N-1 (default 1; see README)\n"

#endif
