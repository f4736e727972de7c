/* Stop handling for one request: EOS / stop ids, and stop strings matched on the detokenized
 * text across token boundaries.
 *
 * Text flows: token -> engine_detok stream -> `pending` (text not yet released). After each token
 * the longest suffix of `pending` that could still begin a stop string is held back; everything
 * before it is released. When a stop string appears, the text before it is released and the stop
 * string (and anything after it) is dropped. Buffers are sized at init; `pending` only grows if a
 * single token decodes to more than its spare room (rare). Length limits (max_tokens, context)
 * are the caller's business: it calls stop_finish to flush what is held. */
#ifndef CAIRN_ENGINE_STOP_H
#define CAIRN_ENGINE_STOP_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/engine.h"

enum stop_result {
    STOP_CONTINUE = 0,
    STOP_TOKEN,   /* EOS or a stop id */
    STOP_STRING,  /* a stop string matched */
};

struct stop_state {
    const struct engine_detok *detok; /* not owned; NULL or NULL stream_new = no text */
    void *stream;
    char **stops;        /* [n_stop] copies */
    size_t *stop_lens;
    int n_stop;
    int32_t *ids;        /* EOS ids (unless ignore_eos) + stop ids */
    int n_ids;
    char *pending;       /* text not yet released */
    size_t n_pending, cap_pending;
    char *out;           /* text released by the last call (valid until the next) */
    size_t cap_out, n_out;
    int matched;         /* index of the stop string that matched, or -1 */
    int32_t stop_token;  /* id that matched, or -1 */
    int done;
};

int stop_init(struct stop_state *s, const struct engine_detok *detok, const char *const *stops,
              int n_stop, const int32_t *stop_ids, int n_stop_ids, const int32_t *eos_ids,
              int n_eos, int ignore_eos, struct cairn_err *err);
void stop_free(struct stop_state *s);

/* Feeds one generated token. Sets *text and *len to the text released with it (possibly empty; valid
 * until the next call). On STOP_TOKEN everything held is released (the stop token's own text is
 * not); on STOP_STRING the text before the match is released. Returns a negative status if the
 * detokenizer failed. */
int stop_feed(struct stop_state *s, int32_t token, const char **text, size_t *len);
/* End of generation for another reason (length, cancel): flushes the detokenizer and releases
 * what is held, unless that flush completes a stop string (then returns STOP_STRING and releases
 * the text before it). Returns STOP_CONTINUE otherwise. */
int stop_finish(struct stop_state *s, const char **text, size_t *len);

/* stop_feed, then (if it did not stop) stop_finish, with both releases in one text: for the
 * last token of a request that ends for length. */
int stop_feed_final(struct stop_state *s, int32_t token, const char **text, size_t *len);

/* The stop string that matched, or NULL. */
const char *stop_matched(const struct stop_state *s);

#endif
