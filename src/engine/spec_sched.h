/* Speculative decoding in the scheduler (engine-internal; engine_int.h has the structs it
 * extends). Called by sched.c on the scheduler thread, and by engine.c at submit / free.
 *
 * DESIGN
 * - A request speculates when the engine's mode is not OFF and the request did not opt out; it
 *   then owns a struct spec_seq: its n-gram index, its controller (spec_ctl.h), the draft of the
 *   current step and, for hybrid models, a copy of the recurrent state taken before the step.
 *   In mode MTP (spec_mtp.h) it drafts with the model's head unless it asked for n-grams: the
 *   step before leaves its hidden states, planning runs the head over them, then chains it.
 * - Packing: after the decodes are packed (every running decode gets its one token first),
 *   spec_sched_plan extends each speculating decode with the draft its controller asks for, within
 *   what is left of the token budget and of the draft logits rows. The draft is written after the
 *   committed tokens (tokens[n_tokens, n_tokens + k)), where the forward reads its chunk, so the
 *   chunk is tokens[n_computed, n_tokens + k) with k + 1 logits rows. Drafts never preempt and
 *   never evict a cached block: a draft that needs a new block takes a free one or is cut to the
 *   block it has.
 * - Exactness: on a backend with exact_rows (tensor/backend.h: the GPU's small-batch matmuls and split-K
 *   attention give a row the same bits in any step of at most that many rows), the decodes and
 *   drafts of a step stay within it, so a verified row equals its plain decode bit for bit.
 * - After the forward, spec_sched_verify samples the rows (spec_verify.h), commits each emitted
 *   token through engine_sched_commit (events, stop rules), and rolls back: KV positions past the
 *   accepted length are just past n_computed (never read, overwritten by the next step), and the
 *   blocks that held only rejected positions go back to the free list (they were never
 *   published). Hybrid models: on a partial acceptance the recurrent state, which absorbed the
 *   rejected tokens, is restored from the copy and n_computed goes back to the step's start, so
 *   the next step recomputes the accepted tokens as a short chunk (a full acceptance keeps the
 *   state as is). Verify steps never attach prefix-cache snapshots.
 * - Step cost: every step without prefill feeds (tokens, forward seconds) to the engine's
 *   spec_cost; the controllers read it for their break-even.
 * - Requests with a grammar (constrained decoding) speculate too: a draft is cut to its longest
 *   prefix the grammar accepts before it takes a row (the matcher walks it and rolls back), and
 *   verification masks each row with the grammar's state after the tokens emitted before it
 *   (spec_verify_masked; engine_sched_grammar_mask / _accept, as sched_sample does for one row).
 *   Only emitted tokens advance the matcher, so a rejected draft token never has to be rolled
 *   back out of it; greedy output is the same as without speculation. */
#ifndef CAIRN_ENGINE_SPEC_SCHED_H
#define CAIRN_ENGINE_SPEC_SCHED_H

#include "engine/engine_int.h"
#include "engine/spec_ctl.h"
#include "engine/spec_ngram.h"

struct spec_seq {
    struct spec_ngram ngram;
    struct spec_ctl ctl;
    int32_t draft[SPEC_CTL_MAX_K]; /* this step's draft (copy: verification overwrites tokens) */
    void *state_copy;              /* hybrid: state before the verify step, state_bytes, or NULL */
    int use_mtp;                   /* drafts with the model's MTP head (spec_mtp.h), not n-grams */
    int h_row, h_pos0, h_n;        /* MTP: the last forward's hidden-state rows of this sequence
                                    * (rows h_row.. of spec_mtp.hidden = positions h_pos0..) */
    uint64_t h_step;               /* MTP: the engine step (n_steps) they are from */
    uint64_t head_step;            /* MTP: the step (n_steps + 1 at planning) whose plan wanted the
                                    * head for this decode (spec_mtp.h: who feeds the head) */
    float *backlog;                /* MTP, parked: hidden rows whose catch-up waits, host
                                    * [SPEC_MTP_BACKLOG, hidden_size] (cairn_mem), or NULL */
    int b_pos0, b_n;               /* their positions b_pos0 .. b_pos0 + b_n - 1 */
};

/* Fills the speculative defaults of o and checks them (engine_create). */
int spec_sched_opts_fill(struct engine_opts *o, struct cairn_err *err);
/* After spec_sched_opts_fill, with the model known: AUTO becomes MTP when the model has a head
 * (info->n_mtp_layers and has_mtp_op), else NGRAM; MTP without a head is CAIRN_ERR_INVALID. */
int spec_sched_mode_resolve(struct engine_opts *o, const struct model_info *info, int has_mtp_op,
                            struct cairn_err *err);
/* Rows of draft logits the engine reserves per step for filled opts (0 when speculation is off). */
int spec_sched_extra_rows(const struct engine_opts *o);
/* At submit: sets s->spec when the request speculates. Allocation failure only means no
 * speculation for it (logged), so this cannot fail. */
void spec_sched_seq_init(struct engine *e, struct engine_seq *s, const struct engine_request *r);
void spec_sched_seq_free(struct engine *e, struct engine_seq *s);
/* After the decodes sched[0, n_decodes) were packed: adds drafts to them (chunk and n_draft).
 * Returns the budget tokens used. */
int spec_sched_plan(struct engine *e, int n_decodes, int budget);
/* After the forward, for an entry with a draft: verifies it against its rows, commits the emitted
 * tokens and rolls back the rest. Returns 1 if the sequence finished (*fin filled); *n_emitted
 * gets the tokens it produced. */
int spec_sched_verify(struct engine *e, struct engine_seq *s, int n_draft, const float *rows,
                      enum engine_finish *fin, int *n_emitted);
/* A step without prefill took `seconds` for n_tokens: feeds the cost model. */
void spec_sched_observe_step(struct engine *e, int n_tokens, double seconds);

#endif
