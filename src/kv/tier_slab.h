/* A slab pool for tier blocks (issue 15): slots of one size carved out of large anonymous
 * mappings that are page-locked once per slab, so that a hot-tier hit uploads to a GPU at DMA
 * speed (pinned H2D ~36 GB/s on an H200 against ~6 GB/s from pageable memory) without paying
 * the pin per block (cudaHostRegister: 219 us for 2 MiB, 15 ms for 256 MiB). Internal to kv/:
 * kv_tiers_open makes one per model when a hot tier and a pinner exist (kv/tiers.h); blocks
 * come from it through kv_tier_block_new_in / kv_tier_block_from_desc_in (tier_int.h), which
 * fall back to cairn_mem_alloc for any block that does not fit a slot.
 *
 * DESIGN
 * - One slot size per pool: what kv_tier_block_new lays out for a full block of the model
 *   (header, block_size token ids, K, V, state), rounded to 64 bytes. A slot holds any block of
 *   exactly that n_tokens and block_bytes with state_bytes 0 or the pool's (a hybrid model's
 *   block without a snapshot still takes a whole slot: alloc_bytes is the slot size).
 * - A slab is mmap(anonymous, private) of whole slots (about slab_bytes, at least one slot),
 *   pinned once through the pinner when it is mapped and unpinned once before it is unmapped.
 *   A pin that fails leaves the slab usable unpinned (logged once at WARN): correctness never
 *   depends on pinning, only upload speed does.
 * - Each slab keeps a stack of its free slot indices. kv_tier_slabs_get takes a slot from the
 *   fullest slab that has one (so the others can drain and be given back), mapping a new slab
 *   when none has. A slab that becomes empty is unmapped, except that one empty slab is kept
 *   for reuse (a clear followed by new evictions must not pin again).
 * - Accounting: every mapped slab is charged whole to cairn_mem (CAIRN_MEM_HOST, CAIRN_MEM_HOT)
 *   while it is mapped: /api/status's "hot" memory figure counts the free slots of partly used
 *   slabs and the one cached empty slab (real RAM held), while the hot tier's budget and its
 *   n_bytes count the blocks' alloc_bytes (the slot size each), as before.
 *
 * Threads: every function is thread-safe; p->mu guards the slab list, every slab's free stack
 * and the counters. Blocks are freed from any thread (SSD writers, the fetch thread, the
 * scheduler), so the pool must outlive every block taken from it: kv_tiers_close frees it last,
 * after the hot tier and the SSD writers are done. Mapping, pinning, unpinning and unmapping run
 * without the lock (a pin of a 256 MiB slab takes ~15 ms). */
#ifndef CAIRN_KV_TIER_SLAB_H
#define CAIRN_KV_TIER_SLAB_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "kv/tiers.h"

#define KV_TIER_SLAB_BYTES (256u << 20) /* a slab's size when the hot tier is large enough */

struct kv_tier_slabs;
struct kv_tier_slab;

struct kv_tier_slab_stats {
    uint64_t n_slabs;        /* mapped now (including the cached empty one) */
    uint64_t n_slabs_pinned; /* of them, pinned */
    uint64_t n_slots;        /* slots in the mapped slabs */
    uint64_t n_slots_used;   /* slots holding a block */
    uint64_t mapped_bytes;   /* bytes mapped (= charged to CAIRN_MEM_HOT) */
    uint64_t pinned_bytes;   /* of them, pinned */
    uint64_t n_pin_failures; /* pins that failed since the pool was made */
};

/* A pool whose slots fit blocks of n_tokens tokens, block_bytes K (= V) bytes and up to
 * state_bytes of state; slabs of about slab_bytes (rounded down to whole slots, at least one).
 * pin may be NULL or have NULL pin/unpin: slabs are then never pinned. Maps nothing yet.
 * CAIRN_ERR_INVALID on bad sizes, CAIRN_ERR_NOMEM. Free with kv_tier_slabs_free. */
int kv_tier_slabs_new(int n_tokens, size_t block_bytes, size_t state_bytes, size_t slab_bytes,
                      const struct kv_tier_pinner *pin, struct kv_tier_slabs **out);
/* Unpins and unmaps every slab. Every slot must be back: a pool with blocks still out is
 * logged and leaked (never unmapped under a block a thread still holds). NULL is fine. */
void kv_tier_slabs_free(struct kv_tier_slabs *p);
/* The slot size (what alloc_bytes of a block in a slot is). */
size_t kv_tier_slabs_slot_bytes(const struct kv_tier_slabs *p);
/* 1 if a block of these sizes fits a slot of p (see DESIGN), else 0; 0 for NULL p. */
int kv_tier_slabs_fits(const struct kv_tier_slabs *p, int n_tokens, size_t block_bytes,
                       size_t state_bytes);
/* A free slot (slot_bytes, 64-byte aligned, contents undefined) and the slab it belongs to, or
 * NULL when no slab can be mapped (out of memory). */
void *kv_tier_slabs_get(struct kv_tier_slabs *p, struct kv_tier_slab **slab);
/* Gives a slot back to its slab (any thread). */
void kv_tier_slabs_put(struct kv_tier_slab *slab, void *slot);
void kv_tier_slabs_stats(struct kv_tier_slabs *p, struct kv_tier_slab_stats *st);

#endif
