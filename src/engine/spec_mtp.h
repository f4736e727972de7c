/* MTP drafting: the model's own multi-token-prediction head (model.h: model_mtp_forward) drafts
 * for speculative decoding, chained for k > 1 (engine-internal; spec_sched.c calls it).
 *
 * DESIGN
 * - The head at position p reads the target's hidden state at p and the token after p. So every
 *   forward step asks the target for the hidden states of each MTP-speculating sequence's tokens
 *   (spec_mtp_want_hidden, while sched.c builds the batch: model_seq.n_hidden), into one
 *   engine-wide buffer of the step's rows; the sequence remembers which rows and positions.
 * - At the next step's planning (spec_mtp_draft, from spec_sched_plan), after the step's tokens
 *   were committed: one batched head step over every running MTP sequence with pending rows
 *   ("catch-up"): positions h_pos0 .. whose next token is now committed (a verify step: the last
 *   committed token and the accepted drafts; rejected positions are skipped), which writes the
 *   head's KV there; for the sequences drafting this step it ends at the position before the last
 *   committed token, whose logits give draft 1. Then chained steps, one token per drafting
 *   sequence each: position + 1, the previous draft, the head's own output as hidden. The drafts
 *   are greedy (argmax), as vLLM's MTP proposer.
 * - The head's KV is a KV layer of the pool (model.h: after the target's), in the sequence's own
 *   blocks: allocated with them, shared and cached with them, and rolled back with them. Chained
 *   steps write positions the verify will overwrite; rejected drafts' positions are rewritten by
 *   the next catch-up before anything reads them.
 * - Who feeds the head. Prefill chunks always do (the head's KV over the prompt is what copying
 *   drafts need). A decode does only in a step whose plan wanted the head for it (it drafts now,
 *   or will once the hidden state of this step is in) or in the last SPEC_MTP_BACKLOG tokens of
 *   a park before its probe (spec_sched.c sets head_step). A decode priced out (its break-even
 *   said no) or early in a park asks nothing of the forward and runs no head step: on the GPU,
 *   where a head step costs more than a graph-replayed target step, feeding it anyway cost 7 %
 *   of decode speed for drafts never made (session 12). Those positions get no head KV, like
 *   the blocks of requests that never speculate (opted out): a draft attending to them is worse,
 *   never wrong (drafts are only proposals).
 * - Rows of a fed sequence that does not draft in that step (the warm-up before a probe, a step
 *   whose blocks ran out) wait in a backlog of SPEC_MTP_BACKLOG positions, caught up as one
 *   chunk when it fills or before the sequence's next draft.
 * - Scheduler thread only. Buffers are sized at engine_create: nothing allocated per step. */
#ifndef CAIRN_ENGINE_SPEC_MTP_H
#define CAIRN_ENGINE_SPEC_MTP_H

#include "engine/engine_int.h"

#define SPEC_MTP_BACKLOG 64 /* parked: positions caught up at once */

struct spec_mtp {
    int H, V;
    float *hidden;              /* [max_batch_tokens, H] this step's target hidden states */
    float *logits;              /* [max_running, V] one head step's logits */
    float *g;                   /* [max_running, H] its outputs */
    float *g_in;                /* [max_running, H] chained steps' hidden inputs */
    struct model_mtp_seq *seqs; /* [max_running] */
    int *slot;                  /* [max_running] entry -> decode index (or -1: catch-up only) */
};

/* Allocates e->mtp when the engine drafts with the head (e->opts.speculative == MTP). */
int spec_mtp_init(struct engine *e, struct cairn_err *err);
void spec_mtp_free(struct engine *e);
/* While building the batch: the sequence's chunk is m (row offset `row` in the step): asks for
 * its hidden states when it drafts with the head. */
void spec_mtp_want_hidden(struct engine *e, struct engine_seq *s, struct model_seq *m, int row);
/* Drafts for the decodes sched[0, n_decodes): want[i] tokens (0 = none; blocks for them already
 * taken) into s->tokens + s->n_tokens; want[i] gets how many were drafted. Runs the catch-up of
 * every running MTP sequence. On a head failure (logged) no sequence drafts this step. */
void spec_mtp_draft(struct engine *e, int n_decodes, int *want);
/* Frees s's backlog (spec_sched_seq_free). */
void spec_mtp_seq_free(struct engine *e, struct spec_seq *p);

#endif
