/* The restore-or-recompute choice (kv/kv_restore.h) with injected speeds. Expected answers are
 * worked out by hand below from the cost model the header states: read time = bytes / speed per
 * restored block, recompute time = block tokens / prefill speed per block not restored, and a
 * chain can only be restored from its start. */
#include "kv/kv_restore.h"
#include "kv/kv_tier.h"
#include "testlib.h"

#define MB (1024.0 * 1024.0)
#define F KV_TIER_LOC_FAST
#define S KV_TIER_LOC_SLOW

int main(void)
{
    const size_t bytes = (size_t)(2 * MB); /* K + V of one block */
    const int tok = 64;                    /* tokens per block */

    /* Nothing measured: restore everything (the cache's behaviour before it could choose). */
    struct kv_restore_speeds none = {0};
    uint8_t sss[3] = {S, S, S};
    CHECK_EQ_INT(kv_restore_choose(sss, 3, bytes, tok, &none), 3);
    /* Prefill unknown but the disk measured slow: still restore (nothing to compare with). */
    struct kv_restore_speeds only_disk = {.slow_bps = 1 * MB};
    CHECK_EQ_INT(kv_restore_choose(sss, 3, bytes, tok, &only_disk), 3);

    /* Disk 1 MB/s: 2 s per block; prefill 1000 tok/s: 0.064 s per block -> recompute all. */
    struct kv_restore_speeds slow_disk = {.fast_bps = 10000 * MB, .slow_bps = 1 * MB,
                                          .prefill_tok_s = 1000};
    CHECK_EQ_INT(kv_restore_choose(sss, 3, bytes, tok, &slow_disk), 0);
    /* Disk 1000 MB/s: 2 ms per block < 64 ms -> restore all. */
    struct kv_restore_speeds fast_disk = {.fast_bps = 10000 * MB, .slow_bps = 1000 * MB,
                                          .prefill_tok_s = 1000};
    CHECK_EQ_INT(kv_restore_choose(sss, 3, bytes, tok, &fast_disk), 3);
    /* Unmeasured disk, measured prefill: restore (the read measures the disk). */
    struct kv_restore_speeds disk_unknown = {.fast_bps = 10000 * MB, .prefill_tok_s = 1000};
    CHECK_EQ_INT(kv_restore_choose(sss, 3, bytes, tok, &disk_unknown), 3);

    /* Hot blocks then disk blocks on the slow disk: keep the hot part (0.2 ms each), recompute
     * the disk part: L = 2. */
    uint8_t ffss[4] = {F, F, S, S};
    CHECK_EQ_INT(kv_restore_choose(ffss, 4, bytes, tok, &slow_disk), 2);
    /* A disk block in front of hot ones: restoring any hot block means reading the disk one
     * first (2 s) against recomputing all three (0.192 s): L = 0. */
    uint8_t sff[3] = {S, F, F};
    CHECK_EQ_INT(kv_restore_choose(sff, 3, bytes, tok, &slow_disk), 0);
    /* ... but a disk block worth 0.1 s in front of ten hot ones beats recomputing eleven
     * (0.704 s): disk 20 MB/s. */
    struct kv_restore_speeds mid_disk = {.fast_bps = 10000 * MB, .slow_bps = 20 * MB,
                                         .prefill_tok_s = 1000};
    uint8_t s10f[11] = {S, F, F, F, F, F, F, F, F, F, F};
    CHECK_EQ_INT(kv_restore_choose(s10f, 11, bytes, tok, &mid_disk), 11);
    /* With one hot block behind it: reading both (0.1 + 0.0002 s) beats recomputing two
     * (0.128 s); with the disk at 10 MB/s (0.2 s per block) recomputing wins. */
    CHECK_EQ_INT(kv_restore_choose(s10f, 2, bytes, tok, &mid_disk), 2);
    struct kv_restore_speeds disk10 = {.fast_bps = 10000 * MB, .slow_bps = 10 * MB,
                                       .prefill_tok_s = 1000};
    CHECK_EQ_INT(kv_restore_choose(s10f, 2, bytes, tok, &disk10), 0);

    /* A tie (read time == recompute time: 2 MB at 31.25 MB/s = 0.064 s) restores. */
    struct kv_restore_speeds tie = {.slow_bps = 31.25 * MB, .prefill_tok_s = 1000};
    CHECK_EQ_INT(kv_restore_choose(sss, 1, bytes, tok, &tie), 1);
    /* No tier blocks: nothing to choose. */
    CHECK_EQ_INT(kv_restore_choose(sss, 0, bytes, tok, &slow_disk), 0);
    CHECK_NEAR(kv_restore_read_s(2 * MB, 1 * MB), 2.0, 1e-12);
    CHECK_NEAR(kv_restore_read_s(2 * MB, 0), 0.0, 0);
    return test_summary("test_kv_restore");
}
