/* The tier chain hot -> SSD behind struct kv_tier_ops. This file holds no lock of its own: the
 * hot tier's mutex and the SSD tier's mutex guard their state, and this layer never holds one
 * while calling into the other (the hot tier spills after releasing its lock). So lookup is
 * thread-safe, as kv_tier_ops asks of a tier that fills locate. */
#include "kv/tiers.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "base/log.h"
#include "base/mem.h"
#include "kv/tier_hot.h"
#include "kv/tier_int.h"
#include "kv/tier_slab.h"
#include "kv/tier_ssd.h"

#define TIERS_SSD_DEFAULT_CAP (50ull << 30)

struct kv_tiers {
    struct kv_tier_signature sig;
    size_t block_bytes;   /* K (= V) bytes per block */
    int write_through;
    struct kv_hot *hot;   /* NULL: no hot tier */
    struct kv_ssd *ssd;   /* NULL: no SSD tier */
    struct kv_tier_slabs *slabs; /* pinned block slabs (hot tier with a pinner), else NULL;
                                  * freed last: SSD writers and the hot tier free into it */
    char ssd_dir[4096];   /* its folder (the speeds file lives there too: tier_speeds.c) */
};

/* statvfs of dir or its nearest existing parent. */
static int tiers_statvfs(const char *dir, struct statvfs *vfs)
{
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", dir && *dir ? dir : ".");
    for (;;) {
        if (statvfs(buf, vfs) == 0) return 0;
        char *slash = strrchr(buf, '/');
        if (!slash) return statvfs(".", vfs);
        if (slash == buf) return statvfs("/", vfs);
        *slash = 0;
    }
}

uint64_t kv_tiers_slab_bytes(uint64_t hot_max_bytes)
{
    uint64_t slab = hot_max_bytes / 8;
    return slab > KV_TIER_SLAB_BYTES ? KV_TIER_SLAB_BYTES : slab;
}

uint64_t kv_tiers_default_ssd_bytes(const char *dir)
{
    struct statvfs vfs;
    if (tiers_statvfs(dir, &vfs) != 0) return 1ull << 30;
    uint64_t tenth = (uint64_t)vfs.f_bavail * (uint64_t)vfs.f_frsize / 10;
    return tenth < TIERS_SSD_DEFAULT_CAP ? tenth : TIERS_SSD_DEFAULT_CAP;
}

int kv_tiers_parse_ssd_size(const char *s, const char *dir, uint64_t *out)
{
    if (!s || !*s) return 0;
    size_t n = strlen(s);
    if (s[n - 1] == '%') {
        char *end;
        double pct = strtod(s, &end);
        if (end != s + n - 1 || !(pct >= 0) || pct > 100) return 0;
        struct statvfs vfs;
        if (tiers_statvfs(dir, &vfs) != 0) return 0;
        *out = (uint64_t)((double)vfs.f_blocks * (double)vfs.f_frsize * pct / 100.0);
        return 1;
    }
    return cairn_parse_size(s, out);
}

static int tiers_desc_ok(const struct kv_tiers *t, const struct kv_block_desc *d)
{
    if (d->block_bytes != t->block_bytes || d->n_tokens != t->sig.block_size || !d->k || !d->v)
        return 0;
    if (d->state && d->state_bytes != t->sig.state_bytes) return 0;
    return 1;
}

static void tiers_spill(void *ctx, struct kv_tier_block *b, int blocking)
{
    struct kv_tiers *t = ctx;
    if (t->ssd)
        kv_ssd_enqueue(t->ssd, b, blocking);
    else
        kv_tier_block_free(b);
}

static void tiers_on_evict(void *ctx, const struct kv_block_desc *d)
{
    struct kv_tiers *t = ctx;
    if (!tiers_desc_ok(t, d)) return;
    if (t->hot) {
        if (kv_hot_touch(t->hot, d->hash)) return;
        int dirty = t->ssd && !kv_ssd_has(t->ssd, d->hash);
        struct kv_tier_block *b = kv_tier_block_from_desc_in(t->slabs, d);
        if (b) kv_hot_put(t->hot, b, dirty);
    } else if (t->ssd) {
        if (kv_ssd_has(t->ssd, d->hash)) return;
        struct kv_tier_block *b = kv_tier_block_from_desc(d);
        if (b) kv_ssd_enqueue(t->ssd, b, 0);
    }
}

/* on_evict's own early outs, before the cache copies the block out: held already (hot: touched) */
static int tiers_evict_wanted(void *ctx, const uint8_t hash[32])
{
    struct kv_tiers *t = ctx;
    if (t->hot) return !kv_hot_touch(t->hot, hash);
    if (t->ssd) return !kv_ssd_has(t->ssd, hash);
    return 0;
}

static void tiers_on_publish(void *ctx, const struct kv_block_desc *d)
{
    struct kv_tiers *t = ctx;
    if (!t->write_through || !t->ssd || !tiers_desc_ok(t, d)) return;
    if (kv_ssd_has(t->ssd, d->hash)) return;
    /* a slot too when there are slabs: the queue is bounded, and a reused slot is already
     * faulted in where a fresh allocation is not */
    struct kv_tier_block *b = kv_tier_block_from_desc_in(t->slabs, d);
    if (b) kv_ssd_enqueue(t->ssd, b, 0);
}

static int tiers_lookup(void *ctx, const uint8_t hash[32], const int32_t *tokens, int n_tokens,
                        void *k, void *v, size_t block_bytes, void *state, size_t state_bytes,
                        int *has_state)
{
    struct kv_tiers *t = ctx;
    if (has_state) *has_state = 0;
    if (t->hot && kv_hot_lookup(t->hot, hash, tokens, n_tokens, k, v, block_bytes, state,
                                state_bytes, has_state))
        return 1;
    if (!t->ssd) return 0;
    struct kv_tier_block *promote = NULL;
    int hit = kv_ssd_lookup(t->ssd, hash, tokens, n_tokens, k, v, block_bytes, state,
                            state_bytes, has_state, t->hot ? &promote : NULL);
    if (promote) kv_hot_put(t->hot, promote, 0); /* clean: the SSD has it */
    return hit;
}

static int tiers_lookup_copy(void *ctx, const uint8_t hash[32], const int32_t *tokens, int n_tokens,
                             const struct kv_tier_copy *dst, int *has_state)
{
    struct kv_tiers *t = ctx;
    if (has_state) *has_state = 0;
    return t->hot && kv_hot_lookup_copy(t->hot, hash, tokens, n_tokens, dst, has_state);
}

static int tiers_locate(void *ctx, const uint8_t hash[32])
{
    struct kv_tiers *t = ctx;
    if (t->hot && kv_hot_touch(t->hot, hash)) return KV_TIER_LOC_FAST;
    return t->ssd ? kv_ssd_locate(t->ssd, hash) : KV_TIER_LOC_NONE;
}

int kv_tiers_open(const struct kv_tiers_opts *o, struct kv_tiers **out, struct cairn_err *err)
{
    *out = NULL;
    const struct kv_tier_signature *g = &o->sig;
    if (g->n_kv_layers < 0 || g->block_size < 1 || g->block_size > 65536 || g->n_kv_heads < 1 ||
        g->head_dim < 1 || (g->kv_dtype != DTYPE_BF16 && g->kv_dtype != DTYPE_F16 &&
                            g->kv_dtype != DTYPE_F32))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "kv tiers: bad model signature");
    struct kv_tiers *t = calloc(1, sizeof(*t));
    if (!t) return cairn_err_set(err, CAIRN_ERR_NOMEM, "kv tiers: out of memory");
    t->sig = *g;
    t->block_bytes = kv_tier_signature_block_bytes(g);
    const char *env = getenv("CAIRN_HOT_CACHE_WRITE_THROUGH");
    t->write_through = o->hot_write_through || (env && strcmp(env, "1") == 0);
    int rc = CAIRN_OK;
    if (o->hot_max_bytes && o->pin.pin && o->pin.unpin) {
        /* Slabs of a fraction of the hot budget (at most 256 MiB): the free slots of one partly
         * used slab plus the cached empty one are RAM beyond the budget. */
        rc = kv_tier_slabs_new(g->block_size, t->block_bytes, g->state_bytes,
                               (size_t)kv_tiers_slab_bytes(o->hot_max_bytes),
                               &o->pin, &t->slabs);
        if (rc != CAIRN_OK) {
            cairn_err_set(err, rc, "kv tiers: cannot make the block slabs");
            goto fail;
        }
    }
    if (o->ssd_dir && *o->ssd_dir) {
        struct kv_ssd_opts so = {
            .sig = *g,
            .dir = o->ssd_dir,
            .max_bytes = o->ssd_max_bytes ? o->ssd_max_bytes
                                          : kv_tiers_default_ssd_bytes(o->ssd_dir),
            .n_writers = o->ssd_n_writers ? o->ssd_n_writers : 1,
            .queue_max_blocks = o->ssd_queue_max_blocks ? o->ssd_queue_max_blocks : 256,
            .queue_max_bytes = o->ssd_queue_max_bytes ? o->ssd_queue_max_bytes : 256ull << 20,
            .slabs = t->slabs,
        };
        if (so.max_bytes == 0) so.max_bytes = 1;
        rc = kv_ssd_open(&so, &t->ssd, err);
        if (rc != CAIRN_OK) goto fail;
        snprintf(t->ssd_dir, sizeof(t->ssd_dir), "%s", o->ssd_dir);
    }
    if (o->hot_max_bytes) {
        rc = kv_hot_new(o->hot_max_bytes, tiers_spill, t, &t->hot);
        if (rc != CAIRN_OK) {
            cairn_err_set(err, rc, "kv tiers: out of memory");
            goto fail;
        }
    }
    LOG_INFO("kv", "tiers: hot %s (%.1f MiB%s), ssd %s, %s", t->hot ? "on" : "off",
             (double)o->hot_max_bytes / 1048576.0, t->slabs ? ", pinned slabs" : "",
             t->ssd ? o->ssd_dir : "off", t->write_through ? "write-through" : "write-back");
    *out = t;
    return CAIRN_OK;
fail:
    kv_tiers_close(t);
    return rc;
}

void kv_tiers_close(struct kv_tiers *t)
{
    if (!t) return;
    kv_hot_free(t->hot, 1); /* flushes dirty blocks into the SSD queue */
    kv_ssd_close(t->ssd);   /* drains the queue: the writers free the last blocks */
    kv_tier_slabs_free(t->slabs); /* last: every block is back (the engine went first) */
    free(t);
}

static int tiers_speeds_load(void *ctx, const char *device, struct kv_tier_speeds *sp)
{
    struct kv_tiers *t = ctx;
    return kv_tier_speeds_load(t->ssd_dir, t->sig.identity, device, sp);
}

static void tiers_speeds_save(void *ctx, const char *device, const struct kv_tier_speeds *sp)
{
    struct kv_tiers *t = ctx;
    kv_tier_speeds_save(t->ssd_dir, t->sig.identity, device, sp);
}

struct kv_tier_ops kv_tiers_ops(struct kv_tiers *t)
{
    struct kv_tier_ops ops = {0};
    if (!t || (!t->hot && !t->ssd)) return ops;
    ops.ctx = t;
    ops.on_evict = tiers_on_evict;
    ops.evict_wanted = tiers_evict_wanted;
    ops.on_publish = t->write_through && t->ssd ? tiers_on_publish : NULL;
    ops.lookup = tiers_lookup;
    ops.lookup_copy = tiers_lookup_copy;
    ops.locate = tiers_locate;
    ops.slabs = t->slabs;
    if (t->ssd) { /* the speeds outlive the process where the blocks do */
        ops.speeds_load = tiers_speeds_load;
        ops.speeds_save = tiers_speeds_save;
    }
    return ops;
}

void kv_tiers_stats(struct kv_tiers *t, struct kv_tiers_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!t) return;
    st->write_through = t->write_through;
    if (t->hot) kv_hot_stats(t->hot, &st->hot);
    if (t->ssd) kv_ssd_stats(t->ssd, &st->ssd);
    if (t->slabs) {
        struct kv_tier_slab_stats ss;
        kv_tier_slabs_stats(t->slabs, &ss);
        st->hot.n_slab_bytes = ss.mapped_bytes;
        st->hot.n_pinned_bytes = ss.pinned_bytes;
    }
}

int kv_tiers_clear(struct kv_tiers *t, enum kv_tier_which which, struct cairn_err *err)
{
    if (!t) return CAIRN_OK;
    if (which < KV_TIER_HOT || which > KV_TIER_ALL)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "kv tiers: unknown tier %d", (int)which);
    if (which == KV_TIER_ALL) {
        if (t->hot) kv_hot_clear(t->hot, 0);
        if (t->ssd) kv_ssd_clear(t->ssd);
    } else if (which == KV_TIER_HOT) {
        if (t->hot) kv_hot_clear(t->hot, 1);
    } else {
        if (t->ssd) kv_ssd_clear(t->ssd);
        if (t->hot) kv_hot_mark_all_dirty(t->hot);
    }
    return CAIRN_OK;
}

void kv_tiers_sync(struct kv_tiers *t)
{
    if (t && t->ssd) kv_ssd_sync(t->ssd);
}
