/* Model identity: SHA-256 over every tensor's name, dtype, shape and bytes, the key the KV tiers
 * use to tell checkpoints apart (a block is reused only under the same identity).
 *
 * Each tensor's bytes are hashed with XXH3-128 (64 MiB chunks on up to 8 threads, combined in
 * chunk order, so the digest does not depend on the thread count); a file's tensor digests are
 * cached by (path, size, mtime, ctime, inode, device) in a small JSON file written crash-safely,
 * so loading an unchanged checkpoint again reads no weights for its identity. The identity
 * names the weights: the same tensors sharded differently have the same identity. */
#ifndef CAIRN_MODEL_MODEL_IDENTITY_H
#define CAIRN_MODEL_MODEL_IDENTITY_H

#include <stdint.h>

#include "base/status.h"
#include "model/safetensors.h"

struct model_identity_stats {
    int n_files;          /* files of the set */
    int n_cached;         /* of which the digest came from the cache */
    uint64_t bytes_hashed; /* bytes read and hashed */
    double seconds;        /* wall time of the whole computation */
};

/* The cache file: $CAIRN_CACHE_DIR/model-identity.json, else $XDG_CACHE_HOME/cairn/..., else
 * $HOME/.cache/cairn/...; writes buf (cap bytes) and returns 0, or -1 when none can be named. */
int model_identity_cache_path(char *buf, size_t cap);

/* Computes the identity of an opened set into out. cache_path NULL: the default above; "" for
 * no cache. A cache that can't be read or written only costs the hashing (logged once per
 * load); stats may be NULL. Fails only when the set's files can't be stat'ed or on OOM. */
int model_identity_compute(const struct safetensors_set *set, const char *cache_path,
                           uint8_t out[32], struct model_identity_stats *stats,
                           struct cairn_err *err);

#endif
