/* A byte range of a buffer. tmpl reports which bytes of a rendered prompt came from data (message
 * contents, tool outputs, caller values) as a list of these, and tok takes the same list to
 * tokenize those bytes as plain text (see tmpl_render_chat_spans, tok_encode_plain). */
#ifndef CAIRN_BASE_SPAN_H
#define CAIRN_BASE_SPAN_H

#include <stddef.h>

struct cairn_span {
    size_t off; /* first byte */
    size_t len; /* bytes */
};

#endif
