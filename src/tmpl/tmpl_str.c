/* tmpl support: the arena that holds ASTs and render-time values, and UTF-8 / Python-string
 * helpers (code-point decoding, Python's str.isspace). */
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "tmpl/tmpl_int.h"

/* Chunks come from cairn_mem_alloc (tag OTHER), so /api/status sees template memory; they are
 * zeroed there and never reused, so allocations need no memset. */
struct tarena_chunk {
    struct tarena_chunk *next;
    size_t cap, used, total;
    _Alignas(16) unsigned char data[];
};

#define TARENA_CHUNK (64 * 1024)

void *tarena_alloc(struct tarena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    struct tarena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > TARENA_CHUNK / 4 ? n : TARENA_CHUNK;
        if (cap > SIZE_MAX - sizeof(*c)) return NULL;
        size_t total = sizeof(*c) + cap;
        if (a->limit_bytes && (total > a->limit_bytes || a->used_bytes > a->limit_bytes - total))
            return NULL;
        struct tarena_chunk *nc = cairn_mem_alloc(total, CAIRN_MEM_OTHER);
        if (!nc) return NULL;
        nc->total = total;
        nc->cap = cap;
        nc->used = 0;
        a->used_bytes += total;
        if (cap == n && c) {
            /* big one-off allocation: keep the current chunk in front for small ones */
            nc->next = c->next;
            c->next = nc;
        } else {
            nc->next = c;
            a->head = nc;
        }
        c = nc;
    }
    void *p = c->data + c->used;
    c->used += n;
    return p;
}

void tarena_free_all(struct tarena *a)
{
    struct tarena_chunk *c = a->head;
    while (c) {
        struct tarena_chunk *next = c->next;
        cairn_mem_free(c, c->total, CAIRN_MEM_OTHER);
        c = next;
    }
    a->head = NULL;
    a->used_bytes = 0;
}

uint32_t tutf8_next(const char *s, size_t n, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    uint32_t c = u[k];
    if (c < 0x80 || k + 1 >= n) {
        *i = k + 1;
        return c;
    }
    if (c < 0xE0) {
        *i = k + 2;
        return ((c & 0x1F) << 6) | (u[k + 1] & 0x3F);
    }
    if (c < 0xF0) {
        if (k + 2 >= n) {
            *i = n;
            return 0xFFFD;
        }
        *i = k + 3;
        return ((c & 0x0F) << 12) | ((uint32_t)(u[k + 1] & 0x3F) << 6) | (u[k + 2] & 0x3F);
    }
    if (k + 3 >= n) {
        *i = n;
        return 0xFFFD;
    }
    *i = k + 4;
    return ((c & 0x07) << 18) | ((uint32_t)(u[k + 1] & 0x3F) << 12) |
           ((uint32_t)(u[k + 2] & 0x3F) << 6) | (u[k + 3] & 0x3F);
}

size_t tutf8_put(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t tutf8_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}

int tutf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        unsigned c = u[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) {
            len = 2, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            len = 3, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            len = 4, cp = c & 0x07, min = 0x10000;
        } else {
            return 0;
        }
        if (i + len > n) return 0;
        for (size_t k = 1; k < len; k++) {
            if ((u[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (u[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += len;
    }
    return 1;
}

/* Python's str.isspace() (Unicode White_Space plus the \x1c-\x1f separators). */
int tpy_isspace(uint32_t cp)
{
    switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E:
    case 0x1F: case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
        return 1;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}
