/* cairn: entry point and subcommand dispatch. Add a command: write cli/cmd_<name>.c, declare it
 * in cli.h, list it here. Top level: --help/-h (usage, exit 0; none: usage on stderr, exit 2)
 * and --version/-V (as `cairn version`). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct cli_command cli_commands[] = {
    {"version", "print the version", cmd_version},
    {"bench", "CPU throughput: synthetic matmul or model prefill/decode", cmd_bench},
    {"check-logits", "compare a model's logits with an oracle file", cmd_check_logits},
    {"generate", "generate tokens from token ids (greedy or sampled)", cmd_generate},
    {"synth-model", "write a random-weight checkpoint for a config", cmd_synth_model},
    {"serve", "serve models over OpenAI/Anthropic-compatible HTTP", cmd_serve},
    {"bench-engine", "engine throughput: decode tok/s by concurrency, prefix-cache savings", cmd_bench_engine},
    {"bench-grammar", "grammar-constrained decoding: mask time per token, schema compile time", cmd_bench_grammar},
    {"tokenize", "text -> token ids (JSON lines) with a tokenizer.json", cmd_tokenize},
    {"detokenize", "token ids -> text (JSON lines) with a tokenizer.json", cmd_detokenize},
    {"render-template", "render a chat template (stdin JSON -> stdout)", cmd_render_template},
};

static void cli_usage(FILE *f)
{
    fprintf(f, "usage: cairn <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof(cli_commands) / sizeof(cli_commands[0]); i++)
        fprintf(f, "  %-16s %s\n", cli_commands[i].name, cli_commands[i].summary);
    fprintf(f, "\nrun 'cairn <command> --help' for a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        cli_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "-V") == 0)
        return cmd_version(argc - 1, argv + 1);
    for (size_t i = 0; i < sizeof(cli_commands) / sizeof(cli_commands[0]); i++)
        if (strcmp(argv[1], cli_commands[i].name) == 0) return cli_commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "cairn: unknown command '%s'\n\n", argv[1]);
    cli_usage(stderr);
    return 2;
}
