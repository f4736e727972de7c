/* Restore or recompute: on a prefix hit in the lower tiers, reading a block back can be slower
 * than computing its KV again (a slow disk under a fast GPU). This is the choice, as a pure
 * function of speeds measured at run time (kv_cache.h measures the reads, the engine its
 * prefill); unit-tested with injected speeds in tests/unit/test_kv_restore.c. */
#ifndef CAIRN_KV_KV_RESTORE_H
#define CAIRN_KV_KV_RESTORE_H

#include <stddef.h>
#include <stdint.h>

/* What one choice needs. A speed of 0 means "not measured yet": an unmeasured tier's reads cost
 * nothing (so it is restored from, which measures it), and with the prefill speed unmeasured
 * everything is restored (what the cache did before it could choose). */
struct kv_restore_speeds {
    double fast_bps;      /* bytes/s of recent copies out of RAM tiers (hot hits) */
    double slow_bps;      /* bytes/s of recent disk reads (SSD hits, fetch thread) */
    double prefill_tok_s; /* tokens/s of this model's recent prefill */
};

/* The tier blocks of a prefix in chain order: loc[i] is KV_TIER_LOC_FAST or _SLOW (kv_tier.h);
 * each block is read_bytes to read and block_tokens to recompute. Returns how many leading
 * blocks to restore, L in [0, n]: the one that minimises read(blocks < L) + recompute(blocks >=
 * L) (a chain can only be restored from its start). Ties go to restoring more. */
int kv_restore_choose(const uint8_t *loc, int n, size_t read_bytes, int block_tokens,
                      const struct kv_restore_speeds *sp);

/* Estimated seconds to read n_bytes at bps (0 when bps is 0: unmeasured). */
double kv_restore_read_s(double n_bytes, double bps);
/* Estimated seconds to recompute a block of block_tokens at prefill_tok_s (0: unmeasured). The
 * fetch thread holds a disk read against it too (kv_fetch_job.recompute_block_s). */
double kv_restore_recompute_s(int block_tokens, double prefill_tok_s);

#endif
