/* UTF-8: the one codec of cairn (tok, tmpl and api use it). "Valid" is Unicode's definition (no
 * overlongs, surrogates or code points past U+10FFFF), as Rust's str and Python's decoder. */
#ifndef CAIRN_BASE_UTF8_H
#define CAIRN_BASE_UTF8_H

#include <stddef.h>
#include <stdint.h>

#include "base/buf.h"

/* Sequence length announced by a lead byte: 1-4, 1 for a byte that can't lead one. */
size_t cairn_utf8_seq_len(uint8_t lead);
/* Writes code point cp as 1-4 bytes to out; returns the count. */
size_t cairn_utf8_put(uint32_t cp, char *out);
/* Decodes the sequence at s[i] into *cp without checking it (a sequence cut short by n reads
 * as its lead byte); returns its length. */
size_t cairn_utf8_get(const char *s, size_t n, size_t i, uint32_t *cp);
/* Decodes the code point at s[*i] of valid UTF-8 and advances *i (a sequence cut short by n
 * gives U+FFFD and *i = n). */
uint32_t cairn_utf8_next(const char *s, size_t n, size_t *i);
/* Length of the valid sequence at s[i] (1-4), or -(length of the maximal invalid prefix): the
 * unit one U+FFFD replaces in Rust's from_utf8_lossy. */
long cairn_utf8_check(const char *s, size_t n, size_t i);
int cairn_utf8_valid(const char *s, size_t n);
/* Code points in s[0..n) (counts lead bytes). */
size_t cairn_utf8_count(const char *s, size_t n);
/* 1 if s ends inside a sequence that more bytes could still complete. */
int cairn_utf8_tail_open(const char *s, size_t n);
/* Appends s with each maximal invalid subpart replaced by U+FFFD (from_utf8_lossy).
 * CAIRN_OK or CAIRN_ERR_NOMEM. */
int cairn_utf8_lossy(struct cairn_buf *out, const char *s, size_t n);

#endif
