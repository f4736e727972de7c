/* libFuzzer target: a POST /admin/api/bench body through api_admin_bench_parse. A body that parses
 * must give lengths and an output length within the documented bounds and a model id; one that
 * doesn't must say why (and, for a bad field, name it within the buffer). Anything else aborts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_error_t je;
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
    if (!j) return 0;
    struct api_bench_params p;
    char field[64];
    struct cairn_err err;
    memset(&err, 0, sizeof(err));
    int rc = api_admin_bench_parse(j, &p, field, sizeof(field), &err);
    if (rc == CAIRN_OK) {
        if (!p.model[0] || p.n_lengths < 1 || p.n_lengths > API_BENCH_MAX_LENGTHS) abort();
        for (int i = 0; i < p.n_lengths; i++)
            if (p.prompt_tokens[i] < 2 || p.prompt_tokens[i] > API_BENCH_MAX_TOKENS) abort();
        if (p.output_tokens < 1 || p.output_tokens > API_BENCH_MAX_TOKENS) abort();
        if (p.prefix_hit != 0 && p.prefix_hit != 1) abort();
    } else {
        if (rc != CAIRN_ERR_INVALID || !err.msg[0]) abort();
        if (strnlen(field, sizeof(field)) == sizeof(field)) abort();
    }
    json_decref(j);
    return 0;
}
