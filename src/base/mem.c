/* Tagged allocation accounting. */
#include "base/mem.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t mem_used[CAIRN_MEM_N_DOMAINS][CAIRN_MEM_N_TAGS]; /* atomic */

static const char *const mem_names[CAIRN_MEM_N_TAGS] = {
    "weights", "kv", "state", "hot", "scratch", "other", "mapped", "request"};

void *cairn_mem_alloc(size_t bytes, enum cairn_mem_tag tag)
{
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes) return NULL;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p) return NULL;
    memset(p, 0, rounded ? rounded : 64);
    __atomic_add_fetch(&mem_used[CAIRN_MEM_HOST][tag], bytes, __ATOMIC_RELAXED);
    return p;
}

void cairn_mem_free(void *p, size_t bytes, enum cairn_mem_tag tag)
{
    if (!p) return;
    free(p);
    __atomic_sub_fetch(&mem_used[CAIRN_MEM_HOST][tag], bytes, __ATOMIC_RELAXED);
}

uint64_t cairn_mem_used(enum cairn_mem_tag tag)
{
    return __atomic_load_n(&mem_used[CAIRN_MEM_HOST][tag], __ATOMIC_RELAXED);
}

void cairn_mem_charge(enum cairn_mem_domain dom, enum cairn_mem_tag tag, int64_t delta)
{
    if ((unsigned)dom >= CAIRN_MEM_N_DOMAINS || (unsigned)tag >= CAIRN_MEM_N_TAGS) return;
    __atomic_add_fetch(&mem_used[dom][tag], (uint64_t)delta, __ATOMIC_RELAXED); /* wraps back */
}

uint64_t cairn_mem_used_in(enum cairn_mem_domain dom, enum cairn_mem_tag tag)
{
    if ((unsigned)dom >= CAIRN_MEM_N_DOMAINS || (unsigned)tag >= CAIRN_MEM_N_TAGS) return 0;
    return __atomic_load_n(&mem_used[dom][tag], __ATOMIC_RELAXED);
}

const char *cairn_mem_domain_name(enum cairn_mem_domain dom)
{
    return dom == CAIRN_MEM_HOST ? "host" : dom == CAIRN_MEM_DEVICE ? "device" : "?";
}

const char *cairn_mem_tag_name(enum cairn_mem_tag tag)
{
    return (unsigned)tag < CAIRN_MEM_N_TAGS ? mem_names[tag] : "?";
}

static void mem_die(size_t bytes)
{
    fprintf(stderr, "cairn: out of memory allocating %zu bytes at start-up\n", bytes);
    abort();
}

void *cairn_xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) mem_die(bytes);
    return p;
}

void *cairn_xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) mem_die(n * size);
    return p;
}

char *cairn_xstrdup(const char *s)
{
    char *p = strdup(s);
    if (!p) mem_die(strlen(s));
    return p;
}

uint64_t cairn_mem_total_ram(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

int cairn_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s) return 0;
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) return 0;
    while (isspace((unsigned char)*end)) end++;
    double mult = 1;
    switch (toupper((unsigned char)*end)) {
    case 0: break;
    case 'K': mult = 1024.0; end++; break;
    case 'M': mult = 1024.0 * 1024; end++; break;
    case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    case '%':
        if (v > 100) return 0;
        mult = (double)cairn_mem_total_ram() / 100.0;
        end++;
        break;
    default: return 0;
    }
    if (*end == 'B' || *end == 'b' || (*end == 'i' && end[1] == 'B')) end += (*end == 'i') ? 2 : 1;
    if (*end) return 0;
    double bytes = v * mult;
    if (bytes > 1.8e19) return 0;
    *out = (uint64_t)bytes;
    return 1;
}
