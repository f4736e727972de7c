/* Model identity over every byte (model/model_identity.h), on a copy of the oracle checkpoint
 * qwen3-tiny in a temp folder:
 * - the identity of model_load equals model_identity_compute's, with and without the cache;
 * - a second computation of an unchanged checkpoint hashes nothing (cache hit);
 * - one byte changed in one tensor, away from the windows the old sampled hash read, changes
 *   the identity even with the old mtime put back (ctime/content), and changing it back
 *   restores the identity;
 * - a corrupt cache file costs a rehash, never a wrong identity, and is replaced. */
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_backend.h"
#include "testlib.h"

#include "base/file.h"
#include "model/model.h"
#include "model/model_identity.h"
#include "model/safetensors.h"

static char tmp[256], dir[512], cache[512];

static void copy_file(const char *from, const char *to)
{
    char *data = NULL;
    size_t n = 0;
    CHECK_EQ_INT(cairn_file_read_all(from, (size_t)1 << 30, &data, &n, NULL), 0);
    CHECK_EQ_INT(cairn_file_write_atomic(to, data, n, NULL), 0);
    free(data);
}

/* Identity of dir through an opened set, with stats. */
static int ident(const char *cache_path, uint8_t out[32], struct model_identity_stats *stats)
{
    struct safetensors_set set;
    struct cairn_err err = {0};
    memset(&set, 0, sizeof(set));
    int rc = safetensors_set_open(dir, &set, &err);
    CHECK_MSG(rc == 0, "open %s: %s", dir, err.msg);
    if (rc) return rc;
    rc = model_identity_compute(&set, cache_path, out, stats, &err);
    CHECK_MSG(rc == 0, "identity: %s", err.msg);
    safetensors_set_close(&set);
    return rc;
}

/* Flips byte `off` of the file with pwrite (same size and inode) and puts its mtime back. */
static void flip_byte(const char *path, off_t off)
{
    struct stat sb;
    CHECK_EQ_INT(stat(path, &sb), 0);
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    unsigned char c = 0;
    CHECK_EQ_INT(pread(fd, &c, 1, off), 1);
    c ^= 0x01;
    CHECK_EQ_INT(pwrite(fd, &c, 1, off), 1);
    struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
    CHECK_EQ_INT(futimens(fd, ts), 0);
    close(fd);
    struct stat sb2;
    CHECK_EQ_INT(stat(path, &sb2), 0);
    CHECK(sb2.st_ino == sb.st_ino && sb2.st_size == sb.st_size &&
          sb2.st_mtim.tv_nsec == sb.st_mtim.tv_nsec && sb2.st_mtim.tv_sec == sb.st_mtim.tv_sec);
}

int main(void)
{
    snprintf(tmp, sizeof(tmp), "/tmp/cairn-test-identity-XXXXXX");
    if (!mkdtemp(tmp)) return 1;
    snprintf(dir, sizeof(dir), "%s/qwen3-tiny", tmp);
    snprintf(cache, sizeof(cache), "%s/cache/model-identity.json", tmp);
    CHECK_EQ_INT(cairn_mkdir_p(dir, NULL), 0);
    char src[1024], dst[1024];
    const char *files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char rel[256];
        snprintf(rel, sizeof(rel), "tests/data/oracle/models/qwen3-tiny/%s", files[i]);
        snprintf(dst, sizeof(dst), "%s/%s", dir, files[i]);
        copy_file(test_src_path(rel, src, sizeof(src)), dst);
    }
    char st_path[600];
    snprintf(st_path, sizeof(st_path), "%s/model.safetensors", dir);
    struct stat sb;
    CHECK_EQ_INT(stat(st_path, &sb), 0);

    /* first: hashes the whole file, fills the cache */
    uint8_t a[32], b[32], c[32], d[32];
    struct model_identity_stats s;
    ident(cache, a, &s);
    CHECK_EQ_INT(s.n_files, 1);
    CHECK_EQ_INT(s.n_cached, 0);
    CHECK_EQ_INT(s.bytes_hashed, sb.st_size);
    CHECK(cairn_file_exists(cache));
    /* second: from the cache, same identity */
    ident(cache, b, &s);
    CHECK_EQ_INT(s.n_cached, 1);
    CHECK_EQ_INT(s.bytes_hashed, 0);
    CHECK(!memcmp(a, b, 32));
    /* without a cache: the same identity */
    ident("", b, &s);
    CHECK_EQ_INT(s.n_cached, 0);
    CHECK(!memcmp(a, b, 32));
    /* model_load computes the same, through the default cache path */
    char cache_dir[600];
    snprintf(cache_dir, sizeof(cache_dir), "%s/cache", tmp);
    setenv("CAIRN_CACHE_DIR", cache_dir, 1);
    struct model *m = NULL;
    struct cairn_err err = {0};
    CHECK_MSG(model_load(dir, test_cpu_be(), &m, &err) == 0, "%s", err.msg);
    if (m) {
        CHECK(!memcmp(model_get_info(m)->identity, a, 32));
        model_free(m);
    }

    /* one byte of the largest tensor, 5000 bytes past its first 4 KiB window and far from its
     * middle and end windows (what the sampled hash read) */
    struct safetensors_set set;
    memset(&set, 0, sizeof(set));
    CHECK_EQ_INT(safetensors_set_open(dir, &set, &err), 0);
    const struct safetensors_tensor *big = NULL;
    for (int i = 0; i < set.n_tensors; i++)
        if (!big || set.index[i]->n_bytes > big->n_bytes) big = set.index[i];
    CHECK(big && big->n_bytes > 64 * 1024);
    off_t off = big ? (off_t)(set.files[0].data_start + big->offset + 4096 + 5000) : 0;
    safetensors_set_close(&set);
    flip_byte(st_path, off);
    ident(cache, c, &s);
    CHECK_EQ_INT(s.n_cached, 0); /* ctime moved: a miss even with the old mtime */
    CHECK(memcmp(a, c, 32) != 0);
    ident(cache, d, &s); /* the changed file is cached under its new key */
    CHECK_EQ_INT(s.n_cached, 1);
    CHECK(!memcmp(c, d, 32));
    flip_byte(st_path, off);
    ident(cache, d, &s);
    CHECK_EQ_INT(s.n_cached, 0);
    CHECK(!memcmp(a, d, 32));

    /* a corrupt cache: rehash, right identity, rewritten */
    CHECK_EQ_INT(cairn_file_write_atomic(cache, "{\"version\":1,\"entries\":[{\"path\":", 31, NULL), 0);
    ident(cache, b, &s);
    CHECK_EQ_INT(s.n_cached, 0);
    CHECK(!memcmp(a, b, 32));
    ident(cache, b, &s);
    CHECK_EQ_INT(s.n_cached, 1);
    CHECK(!memcmp(a, b, 32));

    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    CHECK_EQ_INT(system(cmd), 0);
    return test_summary("test_model_identity");
}
