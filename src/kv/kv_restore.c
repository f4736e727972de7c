/* Restore-or-recompute choice (kv_restore.h). Costs are linear per block, so the optimum is an
 * argmin over the n + 1 prefixes: one pass over L with a running read cost. */
#include "kv/kv_restore.h"

#include "kv/kv_tier.h"

double kv_restore_read_s(double n_bytes, double bps) { return bps > 0 ? n_bytes / bps : 0; }

double kv_restore_recompute_s(int block_tokens, double prefill_tok_s)
{
    return prefill_tok_s > 0 ? block_tokens / prefill_tok_s : 0;
}

int kv_restore_choose(const uint8_t *loc, int n, size_t read_bytes, int block_tokens,
                      const struct kv_restore_speeds *sp)
{
    if (n <= 0) return 0;
    if (!(sp->prefill_tok_s > 0)) return n; /* nothing to compare with: restore, as always */
    double recompute_block_s = kv_restore_recompute_s(block_tokens, sp->prefill_tok_s);
    /* cost(L) = read(blocks 0..L) + recompute(blocks L..n), L from 0 up; `<=` keeps the larger L
     * on a tie */
    int best = 0;
    double read_prefix = 0, best_cost = (double)n * recompute_block_s;
    for (int L = 1; L <= n; L++) {
        double bps = loc[L - 1] == KV_TIER_LOC_SLOW ? sp->slow_bps : sp->fast_bps;
        read_prefix += kv_restore_read_s((double)read_bytes, bps);
        double cost = read_prefix + (double)(n - L) * recompute_block_s;
        if (cost <= best_cost) {
            best_cost = cost;
            best = L;
        }
    }
    return best;
}
