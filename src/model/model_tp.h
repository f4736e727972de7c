/* A model sharded over a tensor-parallel group (issue 23): one rank model per backend of a
 * backend_tp (tensor/backend.h), each loaded with model_load_shard, and the one way to drive
 * them: model_tp_run runs a function on every rank at once, each on its own thread (one host
 * thread per GPU, as NCCL's one-process mode wants), and joins them. Every rank must do the same
 * steps: their all-reduces meet. The lm_head is replicated, so rank 0's logits are the model's.
 *
 * The engine drives a group through model_group.h (persistent rank threads, the group's KV pool
 * and states); model_tp_run (a thread per rank per call) serves check-logits and bench. */
#ifndef CAIRN_MODEL_MODEL_TP_H
#define CAIRN_MODEL_MODEL_TP_H

#include "base/status.h"
#include "model/model.h"
#include "tensor/backend.h"

struct model_tp {
    int world;
    struct model *ranks[BACKEND_TP_MAX]; /* owned */
};

/* Loads dir on every backend of g (rank r on g->bes[r]). Free with model_tp_free (before
 * closing g). */
int model_tp_load(const char *dir, struct backend_tp *g, struct model_tp **out,
                  struct cairn_err *err);
void model_tp_free(struct model_tp *t);

/* fn(rank's model, rank, ctx, err) on every rank, each on its own thread; returns when all have
 * returned: CAIRN_OK, or the lowest failing rank's status and error. */
typedef int (*model_tp_fn)(struct model *m, int rank, void *ctx, struct cairn_err *err);
int model_tp_run(struct model_tp *t, model_tp_fn fn, void *ctx, struct cairn_err *err);

#endif
