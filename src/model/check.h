/* Oracle parity check: runs every case of an expected.safetensors (tests/data/oracle/README.md)
 * through model_forward and compares logits. Used by `cairn check-logits` and the oracle tests.
 *
 * Each case runs three ways, all through the paged, batched path over a shuffled
 * (non-contiguous) block table:
 *   whole    one prefill of all tokens;
 *   chunked  prefill of the prompt in `chunk`-token pieces, then one token per step;
 *   batched  all cases of the file together, one model_forward per step (prefill chunks of
 *            some sequences mixed with decode steps of others).
 * A mode fails if max |logit - expected| > tol, or if the greedy token differs at a position
 * where the oracle's top-1/top-2 margin exceeds 2 * tol (where the error could not flip it). */
#ifndef CAIRN_MODEL_CHECK_H
#define CAIRN_MODEL_CHECK_H

#include <stdio.h>

#include "base/status.h"
#include "model/model.h"
#include "tensor/tensor.h"

struct model_check_opts {
    double tol;          /* max |Δlogit| allowed */
    enum dtype kv_dtype; /* DTYPE_F32 or DTYPE_BF16 */
    int chunk;           /* prefill chunk size of the chunked and batched modes */
    int block_size;      /* KV block size */
    FILE *out;           /* per-case report lines (NULL: quiet) */
    unsigned modes;      /* MODEL_CHECK_* bits; 0 = all */
};

#define MODEL_CHECK_WHOLE 1u
#define MODEL_CHECK_CHUNKED 2u
#define MODEL_CHECK_BATCHED 4u

struct model_check_result {
    int n_cases;
    int n_runs;     /* case x mode runs */
    int n_failed;   /* runs that failed */
    double max_abs; /* max |Δlogit| over everything */
    long n_greedy;  /* positions checked for greedy agreement */
    long n_greedy_bad;
};

/* Runs the check with an already loaded model. Returns CAIRN_OK if it could run (see
 * res->n_failed for the verdict), an error if the files are malformed or a forward fails. */
int model_check_run(struct model *m, const char *expected_path, const struct model_check_opts *o,
                    struct model_check_result *res, struct cairn_err *err);

#endif
