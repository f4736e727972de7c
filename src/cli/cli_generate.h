/* cairn generate's engine path (generate_engine.c), for --speculative. */
#ifndef CAIRN_CLI_CLI_GENERATE_H
#define CAIRN_CLI_CLI_GENERATE_H

#include <stdint.h>

#include "base/status.h"
#include "engine/engine.h"
#include "model/model.h"

struct generate_engine_opts {
    const int32_t *prompt;
    int n_prompt;
    int n_new;               /* at most this many tokens (fewer at an EOS id) */
    double temp;             /* 0 = greedy */
    uint64_t seed;
    enum dtype kv_dtype;
    enum engine_spec_mode mode;
    double spec_draft_cost;  /* > 0: a fixed MTP head cost per drafted token (engine.h); 0: priced */
};

/* Runs one request through an engine over m; out[0, *n_out) (capacity n_new) the tokens. */
int generate_engine_run(struct model *m, const struct generate_engine_opts *g, int32_t *out, int *n_out,
                        struct cairn_err *err);

#endif
