/* The memory guard (see guard.h): a list of holds and their total under one mutex, a condition
 * variable for the threads that wait for memory to free up. */
#include "engine/guard.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/log.h"

struct engine_guard {
    enum cairn_mem_domain domain;
    uint64_t limit;
    pthread_mutex_t mu;        /* guards everything below */
    pthread_cond_t cv;         /* broadcast when a hold shrinks (engine_guard_kick too) */
    struct engine_guard_hold *holds;
    uint64_t reserved;
    uint64_t by_cat[CAIRN_MEM_N_TAGS];
    uint64_t transient;
    uint64_t n_released;       /* counts releases, so a waiter knows one happened */
    uint64_t n_denied;
    int n_holds;
    int n_waiting;
};

uint64_t engine_guard_default_limit(uint64_t ram)
{
    uint64_t tenth = ram / 10, eight = 8ull << 30;
    return ram - (tenth < eight ? tenth : eight);
}

uint64_t engine_guard_default_device_limit(uint64_t total)
{
    uint64_t margin = total / 16, lo = 1ull << 30, hi = 4ull << 30;
    if (margin < lo) margin = lo;
    if (margin > hi) margin = hi;
    return total > margin ? total - margin : total / 2;
}

int engine_guard_create(enum cairn_mem_domain dom, uint64_t limit, struct engine_guard **out,
                        struct cairn_err *err)
{
    *out = NULL;
    struct engine_guard *g = calloc(1, sizeof(*g));
    if (!g) return cairn_err_set(err, CAIRN_ERR_NOMEM, "guard: out of memory");
    g->domain = dom;
    g->limit = limit ? limit : engine_guard_default_limit(cairn_mem_total_ram());
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    *out = g;
    return CAIRN_OK;
}

void engine_guard_free(struct engine_guard *g)
{
    if (!g) return;
    if (g->n_holds)
        LOG_WARN("guard", "%s budget freed with %d holds (%llu bytes) still reserved",
                 cairn_mem_domain_name(g->domain), g->n_holds, (unsigned long long)g->reserved);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}

uint64_t engine_guard_limit(const struct engine_guard *g)
{
    return g->limit;
}

void engine_guard_hold_init(struct engine_guard_hold *h, const char *owner, int transient)
{
    memset(h, 0, sizeof(*h));
    snprintf(h->owner, sizeof(h->owner), "%s", owner ? owner : "?");
    h->transient = transient;
}

static void guard_link(struct engine_guard *g, struct engine_guard_hold *h)
{
    if (h->linked) return;
    h->prev = NULL;
    h->next = g->holds;
    if (g->holds) g->holds->prev = h;
    g->holds = h;
    h->linked = 1;
    g->n_holds++;
}

static void guard_add(struct engine_guard *g, struct engine_guard_hold *h, int tag, int64_t delta)
{
    h->bytes[tag] += (uint64_t)delta;
    g->by_cat[tag] += (uint64_t)delta;
    g->reserved += (uint64_t)delta;
    if (h->transient) g->transient += (uint64_t)delta;
}

int engine_guard_reserve(struct engine_guard *g, struct engine_guard_hold *h,
                         const uint64_t need[CAIRN_MEM_N_TAGS], struct engine_guard_deny *deny,
                         struct cairn_err *err)
{
    uint64_t total = 0;
    for (int i = 0; i < CAIRN_MEM_N_TAGS; i++) total += need[i];
    pthread_mutex_lock(&g->mu);
    uint64_t avail = g->reserved < g->limit ? g->limit - g->reserved : 0;
    if (total > avail) {
        g->n_denied++;
        struct engine_guard_deny d = {.need = total, .available = avail, .limit = g->limit,
                                      .transient = g->transient};
        pthread_mutex_unlock(&g->mu);
        if (deny) *deny = d;
        return cairn_err_set(err, CAIRN_ERR_NOMEM,
                             "%s needs %llu bytes of %s memory, %llu of the %llu-byte limit are available",
                             h->owner, (unsigned long long)total, cairn_mem_domain_name(g->domain),
                             (unsigned long long)avail, (unsigned long long)g->limit);
    }
    for (int i = 0; i < CAIRN_MEM_N_TAGS; i++)
        if (need[i]) guard_add(g, h, i, (int64_t)need[i]);
    if (total) guard_link(g, h);
    pthread_mutex_unlock(&g->mu);
    return CAIRN_OK;
}

void engine_guard_set(struct engine_guard *g, struct engine_guard_hold *h, enum cairn_mem_tag tag,
                      uint64_t bytes)
{
    pthread_mutex_lock(&g->mu);
    int shrank = bytes < h->bytes[tag];
    guard_add(g, h, tag, (int64_t)bytes - (int64_t)h->bytes[tag]);
    guard_link(g, h);
    if (shrank) {
        g->n_released++;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

void engine_guard_release(struct engine_guard *g, struct engine_guard_hold *h)
{
    pthread_mutex_lock(&g->mu);
    if (h->linked) {
        for (int i = 0; i < CAIRN_MEM_N_TAGS; i++)
            if (h->bytes[i]) guard_add(g, h, i, -(int64_t)h->bytes[i]);
        if (h->prev) h->prev->next = h->next;
        else g->holds = h->next;
        if (h->next) h->next->prev = h->prev;
        h->next = h->prev = NULL;
        h->linked = 0;
        g->n_holds--;
        g->n_released++;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
}

int engine_guard_wait(struct engine_guard *g, double timeout_s)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (timeout_s < 0) timeout_s = 0;
    long long ns = (long long)ts.tv_nsec + (long long)(timeout_s * 1e9);
    ts.tv_sec += (time_t)(ns / 1000000000);
    ts.tv_nsec = (long)(ns % 1000000000);
    pthread_mutex_lock(&g->mu);
    uint64_t seen = g->n_released;
    g->n_waiting++;
    int rc = 0;
    while (g->n_released == seen && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    g->n_waiting--;
    int released = g->n_released != seen;
    pthread_mutex_unlock(&g->mu);
    return released;
}

void engine_guard_kick(struct engine_guard *g)
{
    pthread_mutex_lock(&g->mu);
    g->n_released++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void engine_guard_get_stats(struct engine_guard *g, struct engine_guard_stats *st)
{
    pthread_mutex_lock(&g->mu);
    st->domain = g->domain;
    st->limit = g->limit;
    st->reserved = g->reserved;
    memcpy(st->by_cat, g->by_cat, sizeof(st->by_cat));
    st->transient = g->transient;
    st->n_holds = g->n_holds;
    st->n_denied = g->n_denied;
    st->n_waiting = g->n_waiting;
    pthread_mutex_unlock(&g->mu);
}

void engine_guard_foreach(struct engine_guard *g,
                          void (*fn)(void *user, const struct engine_guard_hold *h), void *user)
{
    pthread_mutex_lock(&g->mu);
    for (struct engine_guard_hold *h = g->holds; h; h = h->next) fn(user, h);
    pthread_mutex_unlock(&g->mu);
}

uint64_t engine_guard_kv_bytes(const struct model_info *mi, int block_size, enum dtype kv_dtype,
                               int n_tokens)
{
    if (block_size <= 0 || n_tokens <= 0) return 0;
    uint64_t blocks = ((uint64_t)n_tokens + (uint64_t)block_size - 1) / (uint64_t)block_size;
    uint64_t per_token = 2ull * (uint64_t)mi->n_kv_layers * (uint64_t)mi->n_kv_heads *
                         (uint64_t)mi->head_dim * dtype_size(kv_dtype);
    return blocks * (uint64_t)block_size * per_token;
}

void engine_guard_request_need(const struct model_info *mi, int block_size, int cap_tokens,
                               uint64_t need[CAIRN_MEM_N_TAGS])
{
    memset(need, 0, sizeof(uint64_t) * CAIRN_MEM_N_TAGS);
    uint64_t blocks = block_size > 0 ? ((uint64_t)cap_tokens + (uint64_t)block_size - 1) / (uint64_t)block_size : 0;
    need[CAIRN_MEM_STATE] = mi->state_bytes;
    /* tokens + block table (4 bytes each); the sampler's work/probs/idx/counts/mark arrays: 17
     * bytes per vocabulary entry (engine/sampler.c); 4 KiB for the rest of the sequence */
    need[CAIRN_MEM_REQUEST] = 4ull * (uint64_t)cap_tokens + 4ull * blocks + 17ull * (uint64_t)mi->vocab_size + 4096;
}

uint64_t engine_guard_snapshot_bytes(uint64_t state_bytes, uint64_t snapshot_budget, int max_running,
                                     uint64_t n_blocks)
{
    if (!state_bytes) return 0;
    uint64_t n = snapshot_budget / state_bytes;
    if (n < 2ull * (uint64_t)max_running) n = 2ull * (uint64_t)max_running;
    if (n > n_blocks) n = n_blocks;
    return (n + 1) * state_bytes;
}
