/* tok: Hugging Face tokenizer.json (BPE: byte-level and SentencePiece-style with byte fallback),
 * tokenizer_config.json (bos/eos, add_bos_token), and a streaming detokenizer. Chat templates
 * are tmpl's (tmpl_load_from_dir).
 *
 * Parity target: `tokenizers` (Rust) encode/decode, including added tokens, normalizers,
 * pre-tokenizers (PCRE2 JIT with UTF+UCP), post-processors and decoders.
 *
 * Threads: a loaded struct tok is immutable; tok_encode/tok_decode may be called concurrently
 * on one tok from any number of threads (all scratch memory is per call). A tok_stream belongs
 * to one thread at a time.
 *
 * Input text that is not valid UTF-8 is first repaired the way Rust's from_utf8_lossy does it
 * (each maximal invalid subpart becomes U+FFFD), since HF tokenizers only ever see valid str. */
#ifndef CAIRN_TOK_TOK_H
#define CAIRN_TOK_TOK_H

#include <stddef.h>
#include <stdint.h>

#include "base/span.h"
#include "base/status.h"

struct tok;
struct tok_stream;

/* Loads DIR/tokenizer.json plus, when present, DIR/tokenizer_config.json. Free with tok_free. */
int tok_load(const char *dir, struct tok **out, struct cairn_err *err);
/* Parses tokenizer.json content from memory (no config). Used by the fuzzer. */
int tok_load_json(const char *json, size_t len, struct tok **out, struct cairn_err *err);
void tok_free(struct tok *t);

/* Encodes text[0..len). add_special: apply the post-processor (e.g. BOS of TemplateProcessing).
 * Added tokens in the text are always recognised (HF's split_special_tokens=false).
 * On success *ids is malloc'd (caller frees; may be NULL when *n_ids == 0). */
int tok_encode(const struct tok *t, const char *text, size_t len, int add_special, int32_t **ids,
               size_t *n_ids, struct cairn_err *err);
/* tok_encode with flags: TOK_ENC_ADD_SPECIAL as add_special above; TOK_ENC_SPLIT_SPECIAL treats
 * special added tokens as plain text (HF's split_special_tokens=True), e.g. for user content
 * that must not be able to inject "<|im_end|>"; non-special added tokens are still matched. */
#define TOK_ENC_ADD_SPECIAL 1u
#define TOK_ENC_SPLIT_SPECIAL 2u
int tok_encode_flags(const struct tok *t, const char *text, size_t len, unsigned flags,
                     int32_t **ids, size_t *n_ids, struct cairn_err *err);
/* tok_encode_flags where the bytes in plain[0..n_plain) (sorted, disjoint; e.g. the data spans
 * of tmpl_render_chat_spans) match no added token, special or not, so message text can't
 * produce control tokens (DeepSeek's <｜User｜> is a non-special added token, hence stricter
 * than TOK_ENC_SPLIT_SPECIAL); an added token is matched only if none of its bytes is plain.
 * Everything is tokenized in one pass, so the result equals tok_encode_flags when the plain
 * bytes hold no added-token text. Unsorted spans: CAIRN_ERR_INVALID. */
int tok_encode_plain(const struct tok *t, const char *text, size_t len, unsigned flags,
                     const struct cairn_span *plain, size_t n_plain, int32_t **ids, size_t *n_ids,
                     struct cairn_err *err);

/* Decodes ids to text. Unknown ids are skipped (as HF does). skip_special drops added tokens
 * marked special. *out is malloc'd and NUL-terminated (caller frees); *len excludes the NUL. */
int tok_decode(const struct tok *t, const int32_t *ids, size_t n, int skip_special, char **out,
               size_t *len, struct cairn_err *err);

/* Streaming detokenizer: feed ids one at a time; each call returns (in *text, *len) the newly
 * completed text, which is always whole UTF-8 characters; the concatenation of all feeds plus
 * the final flush equals tok_decode of the whole sequence. Text that may still change (an
 * unfinished byte sequence, a byte-fallback group, a strippable tail) is held back. The
 * returned pointer is into the stream's own buffer, valid until the next call on the stream.
 * No allocation per token once the buffers have grown. Unknown ids (and, with skip_special,
 * special ones) produce nothing, as in tok_decode. Byte-fallback pieces (<0xXX>) come out when
 * their group ends (next normal piece or flush), since HF turns a whole group into U+FFFDs if
 * any byte in it is bad. */
struct tok_stream *tok_stream_new(const struct tok *t, int skip_special); /* NULL on OOM */
int tok_stream_feed(struct tok_stream *s, int32_t id, const char **text, size_t *len);
int tok_stream_flush(struct tok_stream *s, const char **text, size_t *len);
void tok_stream_reset(struct tok_stream *s); /* start a new sequence, keep the buffers */
void tok_stream_free(struct tok_stream *s);

/* Vocabulary: size is 1 + the largest id (model vocab and added tokens). */
int tok_vocab_size(const struct tok *t);
int32_t tok_piece_to_id(const struct tok *t, const char *piece); /* -1 if none */
const char *tok_id_to_piece(const struct tok *t, int32_t id);    /* NULL if none; owned by t */
int tok_is_special(const struct tok *t, int32_t id);             /* added token with special */

/* The bytes each token adds to a decoded text when it is not the first token (byte-level pieces
 * mapped back to bytes, byte-fallback pieces as their byte, SentencePiece's U+2581 as a space),
 * for grammar-constrained decoding. Special added tokens get no bytes (length 0). bytes[i]
 * points into *blob, lens[i] is its length, for i < tok_vocab_size. The caller frees *blob,
 * *bytes and *lens. */
int tok_vocab_bytes(const struct tok *t, uint8_t **blob, const uint8_t ***bytes, size_t **lens,
                    struct cairn_err *err);

/* From tokenizer_config.json (NULL if absent); owned by t. */
const char *tok_bos_token(const struct tok *t);
const char *tok_eos_token(const struct tok *t);
int32_t tok_bos_id(const struct tok *t); /* -1 if none */
int32_t tok_eos_id(const struct tok *t); /* -1 if none */
/* add_bos_token from the config (0 if absent). Informational: tok_encode's add_special follows
 * tokenizer.json's post-processor only, as HF does. */
int tok_add_bos(const struct tok *t);

#endif
