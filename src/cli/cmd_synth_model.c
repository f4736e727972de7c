/* cairn synth-model --config CONFIG.json --out DIR [--tokenizer DIR] [--dtype bf16|q4|q8]
 *                   [--group-size G] [--seed S] [--shard-size SIZE]
 * Writes a random-weight checkpoint (model/synth.h), in 5 GB shards by default like
 * save_pretrained (one model.safetensors when smaller). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/mem.h"
#include "cli/cli.h"
#include "model/synth.h"

static void synth_usage(FILE *f)
{
    fprintf(f, "usage: cairn synth-model --config CONFIG.json --out DIR [--tokenizer DIR]\n"
               "                         [--dtype bf16|q4|q8] [--group-size G] [--seed S] "
               "[--shard-size 5G]\n");
}

int cmd_synth_model(int argc, char **argv)
{
    struct model_synth_opts o = {
        .group_size = 64, .seed = 0, .shard_bytes = 5000000000ull}; /* HF: 5GB */
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            synth_usage(stdout);
            return 0;
        } else if (strcmp(a, "--config") == 0 && i + 1 < argc) {
            o.config_path = argv[++i];
        } else if (strcmp(a, "--out") == 0 && i + 1 < argc) {
            o.out_dir = argv[++i];
        } else if (strcmp(a, "--tokenizer") == 0 && i + 1 < argc) {
            o.tokenizer_dir = argv[++i];
        } else if (strcmp(a, "--dtype") == 0 && i + 1 < argc) {
            const char *d = argv[++i];
            if (strcmp(d, "bf16") == 0)
                o.bits = 0;
            else if (strcmp(d, "q4") == 0)
                o.bits = 4;
            else if (strcmp(d, "q8") == 0)
                o.bits = 8;
            else {
                fprintf(stderr, "synth-model: --dtype must be bf16, q4 or q8\n");
                return 2;
            }
        } else if (strcmp(a, "--group-size") == 0 && i + 1 < argc) {
            o.group_size = atoi(argv[++i]);
        } else if (strcmp(a, "--shard-size") == 0 && i + 1 < argc) {
            if (!cairn_parse_size(argv[++i], &o.shard_bytes) || o.shard_bytes == 0) {
                fprintf(stderr, "synth-model: bad --shard-size %s\n", argv[i]);
                return 2;
            }
        } else if (strcmp(a, "--seed") == 0 && i + 1 < argc) {
            o.seed = strtoull(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "synth-model: unknown option %s\n", a);
            synth_usage(stderr);
            return 2;
        }
    }
    if (!o.config_path || !o.out_dir) {
        synth_usage(stderr);
        return 2;
    }
    struct cairn_err err = {0};
    double t0 = cairn_now();
    if (model_synth(&o, &err) != CAIRN_OK) {
        fprintf(stderr, "synth-model: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "synth-model: wrote %s in %.1f s\n", o.out_dir, cairn_now() - t0);
    return 0;
}
