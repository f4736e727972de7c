/* Subcommands of the cairn binary. Each lives in cli/cmd_<name>.c and is listed in main.c. */
#ifndef CAIRN_CLI_CLI_H
#define CAIRN_CLI_CLI_H

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

#endif
