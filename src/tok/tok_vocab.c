/* tok accessors: vocabulary (piece <-> id, special flags) and tokenizer_config.json's tokens.
 * Below both the loader and the decoder, which use them. */
#include <string.h>

#include "tok/tok_int.h"

int tok_vocab_size(const struct tok *t)
{
    return t->n_vocab;
}

int32_t tok_piece_to_id(const struct tok *t, const char *piece)
{
    size_t n = strlen(piece);
    int32_t id = tok_smap_get(&t->added_map, piece, n);
    return id >= 0 ? id : tok_smap_get(&t->model_vocab, piece, n);
}

const char *tok_id_to_piece(const struct tok *t, int32_t id)
{
    if (id < 0 || id >= t->n_vocab || t->piece_off[id] == UINT64_MAX) return NULL;
    return t->pieces.p + t->piece_off[id];
}

int tok_is_special(const struct tok *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->special[id];
}

const char *tok_bos_token(const struct tok *t)
{
    return t->bos_token;
}

const char *tok_eos_token(const struct tok *t)
{
    return t->eos_token;
}

int32_t tok_bos_id(const struct tok *t)
{
    return t->bos_id;
}

int32_t tok_eos_id(const struct tok *t)
{
    return t->eos_id;
}

int tok_add_bos(const struct tok *t)
{
    return t->add_bos;
}
