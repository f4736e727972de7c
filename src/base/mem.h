/* Allocation accounting: every large allocation (weights copies, KV pool, tiers, scratch) goes
 * through cairn_mem_* with a tag so /api/status can say where memory went. Small allocations
 * use plain malloc. All functions are thread-safe (atomic counters).
 *
 * Counters are kept per domain: host RAM (what cairn_mem_alloc gives) and device memory, which a
 * GPU backend allocates itself and reports with cairn_mem_charge(CAIRN_MEM_DEVICE, ...). Memory
 * that is held but not allocated here (file pages of mmap'd weights) is charged the same way.
 * The memory guard (engine/guard.h) keeps one budget per domain over these counters. */
#ifndef CAIRN_BASE_MEM_H
#define CAIRN_BASE_MEM_H

#include <stddef.h>
#include <stdint.h>

enum cairn_mem_tag {
    CAIRN_MEM_WEIGHTS = 0, /* converted/repacked weights (mmap'd files are not counted) */
    CAIRN_MEM_KV,          /* device-tier KV pool */
    CAIRN_MEM_STATE,       /* recurrent-state buffers and snapshots */
    CAIRN_MEM_HOT,         /* hot RAM tier */
    CAIRN_MEM_SCRATCH,     /* forward-pass workspaces */
    CAIRN_MEM_OTHER,
    CAIRN_MEM_MAPPED,      /* file pages of mmap'd weights (charged by the model pool) */
    CAIRN_MEM_REQUEST,     /* memory guard category only: what a request reserves (state,
                            * token and sampler buffers); nothing allocates under it */
    CAIRN_MEM_N_TAGS,
};

enum cairn_mem_domain {
    CAIRN_MEM_HOST = 0,    /* process RAM */
    CAIRN_MEM_DEVICE,      /* accelerator memory (a GPU backend charges it) */
    CAIRN_MEM_N_DOMAINS,
};

/* 64-byte aligned, zeroed. NULL on failure. Free with cairn_mem_free(p, bytes, tag). */
void *cairn_mem_alloc(size_t bytes, enum cairn_mem_tag tag);
void cairn_mem_free(void *p, size_t bytes, enum cairn_mem_tag tag);
/* Bytes currently allocated under a tag (host). */
uint64_t cairn_mem_used(enum cairn_mem_tag tag);
const char *cairn_mem_tag_name(enum cairn_mem_tag tag);
/* Accounts memory not allocated by cairn_mem_alloc: delta > 0 when taken, < 0 when given back
 * (one negative charge per positive one, same domain and tag). */
void cairn_mem_charge(enum cairn_mem_domain dom, enum cairn_mem_tag tag, int64_t delta);
/* Bytes held in a domain under a tag (cairn_mem_alloc plus charges). */
uint64_t cairn_mem_used_in(enum cairn_mem_domain dom, enum cairn_mem_tag tag);
const char *cairn_mem_domain_name(enum cairn_mem_domain dom);

/* Abort-on-failure allocation, for start-up paths only. */
void *cairn_xmalloc(size_t bytes);
void *cairn_xcalloc(size_t n, size_t size);
char *cairn_xstrdup(const char *s);

/* Physical RAM in bytes (sysconf), for "% of RAM" settings. */
uint64_t cairn_mem_total_ram(void);
/* Parses "123", "64K", "8M", "4G", "1.5G" or "25%" (of total RAM). Returns 0 on error. */
int cairn_parse_size(const char *s, uint64_t *out);

#endif
