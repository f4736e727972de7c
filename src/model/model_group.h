/* A model group: a model sharded over a tensor-parallel group (model_tp.h), driven as ONE model
 * by the engine (issue 23). The engine keeps one scheduler, one prefix cache, one block table
 * per sequence; the group turns each of its calls into the same call on every rank.
 *
 * DESIGN
 * - Ranks: rank r's model (model_load_shard) on backend_tp bes[r], with its own KV pool part and
 *   recurrent states. Each step runs on every rank at once: rank 0 on the caller's thread (the
 *   engine's scheduler), ranks 1..N-1 on one persistent thread each (NCCL's one-process mode wants
 *   one host thread per GPU; a thread per step would cost a thread start per token). All group
 *   steps of the process take one lock, so two engines over the same backends never interleave
 *   their all-reduces.
 * - Memory of the engine (the KV pool, the hybrid state slots and snapshots) is allocated on the
 *   group's own backend (model_group_backend): a backend that only has buffers. A group buffer
 *   of B bytes is a host handle holding B / N bytes on every rank; the logical layout is the
 *   ranks' parts one after the other. KV: the engine sizes its pool for N x the rank's KV heads
 *   (model_group_info's n_kv_heads), so each rank's part is exactly its own pool of the same
 *   n_blocks and block ids: one logical block per position, one block table for all ranks.
 *   States: state_bytes is N x the rank's (each rank holds its DeltaNet heads' share); copies
 *   and zeroing of a whole state (a snapshot, a speculative rollback) run on every rank.
 *   A group buffer is only ever used whole: copies of part of one (a tier's block read at an
 *   offset) are refused, which is why tiers are refused under tensor parallel (api/pool.c).
 * - Logits: the lm_head is replicated, so rank 0 computes them into the engine's rows; the other
 *   ranks are asked for none (their lm_head is skipped: nothing after it all-reduces).
 *   Device sampling (model_seq.sample) is not offered over a group: engine_create_group reports
 *   no sample op, so every row's logits come back; a sampled row, if given, runs on rank 0 alone
 *   (model_forward checks its backend has the op) and the other ranks get none.
 * - Errors: the step fails for all when any rank fails. When every rank failed with the same
 *   status the step error is rank 0's (the engine fails the step's requests); when they differ
 *   (a rank failed while another waited for it at an all-reduce) the group's collectives are out
 *   of step for good, so the error is CAIRN_ERR_DEVICE: the engine stops and the model must be
 *   loaded again.
 * - Not under tensor parallel: the MTP head (model_group_info reports none, so the engine cannot
 *   draft with it: `--speculative auto` drafts by prompt lookup).
 *
 * Threading: model_group_forward / _reserve / _state_init from one thread at a time (the
 * scheduler thread); buffer calls on the group backend from any thread, outside a step. */
#ifndef CAIRN_MODEL_MODEL_GROUP_H
#define CAIRN_MODEL_MODEL_GROUP_H

#include "base/status.h"
#include "model/model.h"
#include "model/model_tp.h"
#include "tensor/backend.h"

struct model_group;

/* Loads dir on every backend of tp (which must outlive the group) and starts the rank threads.
 * Free with model_group_free. */
int model_group_load(const char *dir, struct backend_tp *tp, struct model_group **out,
                     struct cairn_err *err);
void model_group_free(struct model_group *g);

/* The model as the engine sees it: rank 0's info with the group's KV heads (N x the rank's),
 * query heads (N x) and state_bytes (N x), and no MTP head. */
const struct model_info *model_group_info(const struct model_group *g);
/* The backend the engine allocates its KV pool and states on (see DESIGN); owned by the group. */
struct backend *model_group_backend(struct model_group *g);
int model_group_world(const struct model_group *g);
/* Rank r's model (owned by the group). */
struct model *model_group_rank(struct model_group *g, int r);

/* model_reserve on every rank. */
int model_group_reserve(struct model_group *g, int max_tokens, struct cairn_err *err);
/* model_forward on every rank: kv is the view of a pool allocated on model_group_backend (its
 * k, v are group buffers), each seqs[i].state a group buffer; logits land in seqs[i].logits
 * (rank 0's). */
int model_group_forward(struct model_group *g, const struct backend_kv_view *kv,
                        const struct model_seq *seqs, int n_seqs, struct cairn_err *err);
/* A fresh recurrent state (a group buffer of model_group_info's state_bytes) on every rank. */
void model_group_state_init(struct model_group *g, void *state);

#endif
