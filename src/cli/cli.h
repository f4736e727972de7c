/* Subcommands of the cairn binary. Each lives in cli/cmd_<name>.c and is listed in main.c. */
#ifndef CAIRN_CLI_CLI_H
#define CAIRN_CLI_CLI_H

struct cli_command {
    const char *name;
    const char *summary;
    int (*run)(int argc, char **argv); /* argv[0] is the subcommand name; returns exit code */
};

int cmd_version(int argc, char **argv);

#endif
