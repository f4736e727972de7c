/* The API room's small helpers, below everything else in it: allocation with the tests' failure
 * hook (api_test_fail_alloc), the growable string buffer every encoder writes into, and call /
 * item ids. api_call.c, api_emit.c and api_info.c all use these and this file uses none of them,
 * so the three no longer call one another in a circle. */
#include "api/api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- allocation (with the tests' failure hook) ---- */

static long api_fail_at;     /* atomic: 0 off; n > 0: allocation n fails; n < 0: from -n on */
static long api_n_allocs;    /* atomic: allocations counted since the last api_test_fail_alloc */

long api_test_fail_alloc(long n)
{
    long counted = __atomic_exchange_n(&api_n_allocs, 0, __ATOMIC_RELAXED);
    __atomic_store_n(&api_fail_at, n, __ATOMIC_RELAXED);
    return counted;
}

static int api_alloc_fails(void)
{
    long at = __atomic_load_n(&api_fail_at, __ATOMIC_RELAXED);
    long k = __atomic_add_fetch(&api_n_allocs, 1, __ATOMIC_RELAXED);
    if (at == 0) return 0;
    return at > 0 ? k == at : k >= -at;
}

void *api_malloc(size_t n)
{
    return api_alloc_fails() ? NULL : malloc(n);
}

void *api_calloc(size_t n, size_t size)
{
    return api_alloc_fails() ? NULL : calloc(n, size);
}

void *api_realloc(void *p, size_t n)
{
    return api_alloc_fails() ? NULL : realloc(p, n);
}

char *api_strdup(const char *s)
{
    return api_alloc_fails() ? NULL : strdup(s);
}

int api_sbuf_add(struct api_sbuf *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = api_realloc(b->p, cap);
        if (!p) return CAIRN_ERR_NOMEM;
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
    return CAIRN_OK;
}

int api_sbuf_adds(struct api_sbuf *b, const char *s)
{
    return api_sbuf_add(b, s, strlen(s));
}

void api_sbuf_free(struct api_sbuf *b)
{
    free(b->p);
    memset(b, 0, sizeof(*b));
}

void api_new_id(struct api *a, const char *prefix, char *out, size_t cap)
{
    /* atomic: called under call locks, which come after api->mu in the lock order */
    uint64_t n = __atomic_add_fetch(&a->id_counter, 1, __ATOMIC_RELAXED);
    if (a->cfg.deterministic) {
        snprintf(out, cap, "%s%llu", prefix, (unsigned long long)n);
        return;
    }
    uint64_t x = (n * 0x9E3779B97F4A7C15ull) ^ a->id_salt;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    snprintf(out, cap, "%s%016llx%08llx", prefix, (unsigned long long)x,
             (unsigned long long)(n & 0xffffffffu));
}
