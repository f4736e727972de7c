/* Crash-safe file writes and small file utilities. */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static unsigned long file_tmp_counter; /* atomic: makes temp names unique within the process */

int cairn_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

static int file_write_full(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int cairn_file_write_atomic_iov(const char *path, const void *const *parts, const size_t *sizes,
                                int n_parts, struct cairn_err *err)
{
    char tmp[4096];
    unsigned long seq = __atomic_add_fetch(&file_tmp_counter, 1, __ATOMIC_RELAXED);
    int n = snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%lu", path, (int)getpid(), seq);
    if (n < 0 || (size_t)n >= sizeof(tmp))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return cairn_err_set(err, CAIRN_ERR_IO, "%s: %s", tmp, strerror(errno));
    for (int i = 0; i < n_parts; i++) {
        if (file_write_full(fd, parts[i], sizes[i]) != 0) goto fail;
    }
    if (fsync(fd) != 0) goto fail;
    if (close(fd) != 0) {
        fd = -1;
        goto fail;
    }
    fd = -1;
    if (rename(tmp, path) != 0) goto fail;
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    if (cairn_fsync_dir(dirname(dir)) != 0)
        return cairn_err_set(err, CAIRN_ERR_IO, "fsync dir of %s: %s", path, strerror(errno));
    return CAIRN_OK;
fail:;
    int e = errno;
    if (fd >= 0) close(fd);
    unlink(tmp);
    return cairn_err_set(err, CAIRN_ERR_IO, "%s: %s", path, strerror(e));
}

int cairn_file_write_atomic(const char *path, const void *data, size_t n, struct cairn_err *err)
{
    const void *parts[1] = {data};
    size_t sizes[1] = {n};
    return cairn_file_write_atomic_iov(path, parts, sizes, 1, err);
}

int cairn_file_read_all(const char *path, size_t max_bytes, char **out, size_t *len,
                        struct cairn_err *err)
{
    *out = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return cairn_err_set(err, errno == ENOENT ? CAIRN_ERR_NOT_FOUND : CAIRN_ERR_IO, "%s: %s",
                             path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return cairn_err_set(err, CAIRN_ERR_IO, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > max_bytes) {
        close(fd);
        return cairn_err_set(err, CAIRN_ERR_LIMIT, "%s: %lld bytes, over the limit of %zu", path,
                             (long long)st.st_size, max_bytes);
    }
    size_t size = (size_t)st.st_size;
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "%s: out of memory", path);
    }
    size_t got = 0;
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != size) {
        free(buf);
        return cairn_err_set(err, CAIRN_ERR_IO, "%s: short read", path);
    }
    buf[size] = 0;
    *out = buf;
    *len = size;
    return CAIRN_OK;
}

int cairn_mkdir_p(const char *path, struct cairn_err *err)
{
    char buf[4096];
    int n = snprintf(buf, sizeof(buf), "%s", path);
    if (n < 0 || (size_t)n >= sizeof(buf))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "path too long: %s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return cairn_err_set(err, CAIRN_ERR_IO, "mkdir %s: %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return cairn_err_set(err, CAIRN_ERR_IO, "mkdir %s: %s", buf, strerror(errno));
    return CAIRN_OK;
}

int cairn_file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int cairn_dir_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

double cairn_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t cairn_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
