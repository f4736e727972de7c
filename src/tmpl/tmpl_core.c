/* tmpl render core: the arena that holds ASTs and render-time values, the render's failure path
 * (tmpl_fail longjmps to tmpl_render), step and memory accounting, and output buffers. The
 * floor under values, builtins and the evaluator: it calls none of them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "tmpl/tmpl_int.h"

#define TMPL_ARENA_CHUNK (64 * 1024)

/* Chunks come from cairn_mem_alloc (tag OTHER), so /api/status sees template memory; they are
 * zeroed there and never reused, so allocations need no memset. */
struct tmpl_arena_chunk {
    struct tmpl_arena_chunk *next;
    size_t cap, used, total;
    _Alignas(16) unsigned char data[];
};

void *tmpl_arena_alloc(struct tmpl_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (n == 0) n = 16;
    struct tmpl_arena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > TMPL_ARENA_CHUNK / 4 ? n : TMPL_ARENA_CHUNK;
        if (cap > SIZE_MAX - sizeof(*c)) return NULL;
        size_t total = sizeof(*c) + cap;
        if (a->limit_bytes && (total > a->limit_bytes || a->used_bytes > a->limit_bytes - total))
            return NULL;
        struct tmpl_arena_chunk *nc = cairn_mem_alloc(total, CAIRN_MEM_OTHER);
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

void tmpl_arena_free_all(struct tmpl_arena *a)
{
    struct tmpl_arena_chunk *c = a->head;
    while (c) {
        struct tmpl_arena_chunk *next = c->next;
        cairn_mem_free(c, c->total, CAIRN_MEM_OTHER);
        c = next;
    }
    a->head = NULL;
    a->used_bytes = 0;
}

void tmpl_fail(struct tmpl_rstate *r, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->err->msg, sizeof(r->err->msg), fmt, ap);
    va_end(ap);
    r->err->status = status;
    longjmp(r->jmp, 1);
}

void tmpl_step(struct tmpl_rstate *r)
{
    if (++r->steps > r->lim.max_steps)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "template took too many steps (limit %llu)",
                  (unsigned long long)r->lim.max_steps);
}

void tmpl_step_bytes(struct tmpl_rstate *r, size_t n_bytes)
{
    r->steps += n_bytes >> 10;
    tmpl_step(r);
}

char *tmpl_printf(struct tmpl_rstate *r, const char *fmt, ...)
{
    char buf[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    size_t n = strlen(buf);
    char *c = tmpl_alloc(r, n + 1);
    memcpy(c, buf, n);
    return c;
}

void *tmpl_alloc(struct tmpl_rstate *r, size_t n)
{
    void *p = tmpl_arena_alloc(&r->arena, n);
    if (!p)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "template used too much memory (limit %zu bytes)",
                  r->lim.max_memory_bytes);
    return p;
}

void tmpl_buf_put(struct tmpl_rstate *r, struct tmpl_buf *b, const char *p, size_t n)
{
    if (n == 0) return;
    if (n >= 1024) tmpl_step_bytes(r, n);
    if (b->n + n > r->lim.max_output_bytes || b->n + n < b->n)
        tmpl_fail(r, CAIRN_ERR_LIMIT, "template output too large (limit %zu bytes)",
                  r->lim.max_output_bytes);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *np;
        if (b == &r->main_out) {
            np = realloc(b->p, cap);
            if (!np) tmpl_fail(r, CAIRN_ERR_NOMEM, "out of memory");
        } else {
            np = tmpl_alloc(r, cap);
            if (b->n) memcpy(np, b->p, b->n);
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tmpl_buf_putc(struct tmpl_rstate *r, struct tmpl_buf *b, char c) { tmpl_buf_put(r, b, &c, 1); }
void tmpl_buf_puts(struct tmpl_rstate *r, struct tmpl_buf *b, const char *s) { tmpl_buf_put(r, b, s, strlen(s)); }
