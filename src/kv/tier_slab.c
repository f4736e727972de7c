/* The slab pool of tier blocks: large pinned mappings cut into equal slots. Design, accounting
 * and the lock rules are in tier_slab.h. */
#include "kv/tier_slab.h"

#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/log.h"
#include "base/mem.h"
#include "kv/tier_int.h"

struct kv_tier_slab {
    struct kv_tier_slabs *pool;
    uint8_t *base; /* the mapping: n_slots * slot_bytes, rounded to pages */
    size_t map_bytes;
    int pinned; /* the pinner's pin succeeded: unpin before unmapping */
    uint32_t n_slots;
    uint32_t n_free; /* guarded by pool->mu */
    uint32_t *free;  /* [n_slots] stack of free slot indices, guarded by pool->mu */
    struct kv_tier_slab *prev, *next; /* pool->slabs, guarded by pool->mu */
};

struct kv_tier_slabs {
    pthread_mutex_t mu;
    int n_tokens; /* what fits a slot (kv_tier_slabs_fits) */
    size_t block_bytes;
    size_t state_bytes;
    size_t slot_bytes;
    uint32_t n_slots_per_slab;
    size_t map_bytes; /* a slab's mapping length */
    struct kv_tier_pinner pin;
    struct kv_tier_slab *slabs;   /* every mapped slab; guarded by mu */
    int n_empty;                  /* slabs with every slot free (at most one stays); mu */
    int warned;                   /* a pin failure was logged; mu */
    struct kv_tier_slab_stats st; /* counters; guarded by mu */
};

int kv_tier_slabs_new(int n_tokens, size_t block_bytes, size_t state_bytes, size_t slab_bytes,
                      const struct kv_tier_pinner *pin, struct kv_tier_slabs **out)
{
    *out = NULL;
    size_t slot = kv_tier_block_layout_bytes(n_tokens, block_bytes, state_bytes);
    if (slot == 0) return CAIRN_ERR_INVALID;
    slot = (slot + 63) & ~(size_t)63;
    size_t n = slab_bytes / slot;
    if (n < 1) n = 1;
    if (n > UINT32_MAX || n > SIZE_MAX / slot) return CAIRN_ERR_INVALID;
    long page = sysconf(_SC_PAGESIZE);
    size_t pg = page > 0 ? (size_t)page : 4096;
    size_t map = (n * slot + pg - 1) / pg * pg;
    if (map < n * slot) return CAIRN_ERR_INVALID;
    struct kv_tier_slabs *p = calloc(1, sizeof(*p));
    if (!p) return CAIRN_ERR_NOMEM;
    pthread_mutex_init(&p->mu, NULL);
    p->n_tokens = n_tokens;
    p->block_bytes = block_bytes;
    p->state_bytes = state_bytes;
    p->slot_bytes = slot;
    p->n_slots_per_slab = (uint32_t)n;
    p->map_bytes = map;
    if (pin && pin->pin && pin->unpin) p->pin = *pin;
    *out = p;
    return CAIRN_OK;
}

size_t kv_tier_slabs_slot_bytes(const struct kv_tier_slabs *p)
{
    return p->slot_bytes;
}

int kv_tier_slabs_fits(const struct kv_tier_slabs *p, int n_tokens, size_t block_bytes,
                       size_t state_bytes)
{
    return p && n_tokens == p->n_tokens && block_bytes == p->block_bytes &&
           (state_bytes == 0 || state_bytes == p->state_bytes);
}

/* Maps and pins one slab (without the lock: the pin is the slow part). NULL on out of memory. */
static struct kv_tier_slab *tier_slab_map(struct kv_tier_slabs *p)
{
    struct kv_tier_slab *s = calloc(1, sizeof(*s));
    uint32_t *fr = malloc((size_t)p->n_slots_per_slab * sizeof(*fr));
    void *base =
        mmap(NULL, p->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (!s || !fr || base == MAP_FAILED) {
        if (base != MAP_FAILED) munmap(base, p->map_bytes);
        free(fr);
        free(s);
        return NULL;
    }
    s->pool = p;
    s->base = base;
    s->map_bytes = p->map_bytes;
    s->n_slots = s->n_free = p->n_slots_per_slab;
    s->free = fr;
    for (uint32_t i = 0; i < s->n_slots; i++)
        fr[i] = s->n_slots - 1 - i; /* slot 0 on top */
    s->pinned = p->pin.pin && p->pin.pin(p->pin.ctx, base, s->map_bytes) == 0;
    cairn_mem_charge(CAIRN_MEM_HOST, CAIRN_MEM_HOT, (int64_t)s->map_bytes);
    return s;
}

/* Unpins and unmaps a slab that is out of the list (without the lock). */
static void tier_slab_unmap(struct kv_tier_slab *s)
{
    struct kv_tier_slabs *p = s->pool;
    if (s->pinned) p->pin.unpin(p->pin.ctx, s->base);
    munmap(s->base, s->map_bytes);
    cairn_mem_charge(CAIRN_MEM_HOST, CAIRN_MEM_HOT, -(int64_t)s->map_bytes);
    free(s->free);
    free(s);
}

/* Takes the top free slot of s. Call with mu held, s->n_free > 0. */
static void *tier_slab_take_locked(struct kv_tier_slabs *p, struct kv_tier_slab *s)
{
    if (s->n_free == s->n_slots) p->n_empty--;
    uint32_t i = s->free[--s->n_free];
    p->st.n_slots_used++;
    return s->base + (size_t)i * p->slot_bytes;
}

void *kv_tier_slabs_get(struct kv_tier_slabs *p, struct kv_tier_slab **slab)
{
    *slab = NULL;
    pthread_mutex_lock(&p->mu);
    struct kv_tier_slab *best = NULL;
    for (struct kv_tier_slab *s = p->slabs; s; s = s->next)
        if (s->n_free && (!best || s->n_free < best->n_free)) best = s;
    if (best) {
        void *slot = tier_slab_take_locked(p, best);
        pthread_mutex_unlock(&p->mu);
        *slab = best;
        return slot;
    }
    pthread_mutex_unlock(&p->mu);

    /* Every slab is full: map another. Two threads may both get here; the second slab is
     * simply more room (given back once it drains, past the one cached). */
    struct kv_tier_slab *s = tier_slab_map(p);
    if (!s) return NULL;
    pthread_mutex_lock(&p->mu);
    if (p->pin.pin && !s->pinned) {
        p->st.n_pin_failures++;
        if (!p->warned) {
            p->warned = 1;
            LOG_WARN("kv",
                     "hot tier: cannot pin a %.1f MiB slab (page-locked memory limit?); "
                     "its blocks stay usable, uploads to the device run at pageable speed",
                     (double)s->map_bytes / 1048576.0);
        }
    }
    s->next = p->slabs;
    if (p->slabs) p->slabs->prev = s;
    p->slabs = s;
    p->n_empty++;
    p->st.n_slabs++;
    p->st.n_slabs_pinned += s->pinned;
    p->st.n_slots += s->n_slots;
    p->st.mapped_bytes += s->map_bytes;
    if (s->pinned) p->st.pinned_bytes += s->map_bytes;
    void *slot = tier_slab_take_locked(p, s);
    pthread_mutex_unlock(&p->mu);
    *slab = s;
    return slot;
}

void kv_tier_slabs_put(struct kv_tier_slab *s, void *slot)
{
    struct kv_tier_slabs *p = s->pool;
    size_t off = (size_t)((uint8_t *)slot - s->base);
    CAIRN_ASSERT((uint8_t *)slot >= s->base && off % p->slot_bytes == 0 &&
                 off / p->slot_bytes < s->n_slots);
    struct kv_tier_slab *drop = NULL;
    pthread_mutex_lock(&p->mu);
    CAIRN_ASSERT(s->n_free < s->n_slots); /* a slot given back twice */
    s->free[s->n_free++] = (uint32_t)(off / p->slot_bytes);
    p->st.n_slots_used--;
    if (s->n_free == s->n_slots && ++p->n_empty > 1) {
        /* keep one empty slab for the next burst of evictions; give the others back */
        if (s->prev)
            s->prev->next = s->next;
        else
            p->slabs = s->next;
        if (s->next) s->next->prev = s->prev;
        p->n_empty--;
        p->st.n_slabs--;
        p->st.n_slabs_pinned -= s->pinned;
        p->st.n_slots -= s->n_slots;
        p->st.mapped_bytes -= s->map_bytes;
        if (s->pinned) p->st.pinned_bytes -= s->map_bytes;
        drop = s;
    }
    pthread_mutex_unlock(&p->mu);
    if (drop) tier_slab_unmap(drop);
}

void kv_tier_slabs_stats(struct kv_tier_slabs *p, struct kv_tier_slab_stats *st)
{
    pthread_mutex_lock(&p->mu);
    *st = p->st;
    pthread_mutex_unlock(&p->mu);
}

void kv_tier_slabs_free(struct kv_tier_slabs *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    uint64_t used = p->st.n_slots_used;
    pthread_mutex_unlock(&p->mu);
    if (used) {
        /* A block outlives its tiers (a bug elsewhere): unmapping would turn it into a use
         * after free on whichever thread holds it. Keep everything mapped instead. */
        LOG_ERROR("kv",
                  "hot tier: %llu blocks still held when their slab pool was freed; "
                  "%.1f MiB leaked",
                  (unsigned long long)used, (double)p->st.mapped_bytes / 1048576.0);
        return;
    }
    while (p->slabs) {
        struct kv_tier_slab *s = p->slabs;
        p->slabs = s->next;
        tier_slab_unmap(s);
    }
    pthread_mutex_destroy(&p->mu);
    free(p);
}
