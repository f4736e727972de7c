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
/* Whether --tensor-parallel n takes the sharded path: n > 1, or CAIRN_TP_FORCE=1 (a group of
 * one, the NCCL path on one GPU: tests/cuda/tp1.sh). */
int cli_tp_wanted(int n);
/* When cli_tp_wanted(n): opens the group of n ranks on device (GPUs 0..n-1 with NCCL, or
 * simulated CPU ranks) into *out (close with backend_tp_close), or returns 2 after a message
 * saying why (more ranks than GPUs, no CUDA). Otherwise *out = NULL and 0 (the plain path). */
int cli_tp_open(const char *cmd, const char *device, int n, struct backend_tp **out);
/* cairn bench --allreduce (bench_allreduce.c): the all-reduce of [rows, hidden] f32 over a group
 * of world ranks on device, iters per timed step, reps steps; exit code. */
int bench_allreduce(const char *device, int world, int hidden, int rows, int iters, int reps, int json);
#define CLI_TP_HELP                                                                                \
    "  --tensor-parallel N          shard the model over GPUs 0..N-1 (default 1; see README)\n"

#endif
