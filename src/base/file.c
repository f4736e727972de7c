/* Crash-safe file writes and small file utilities, and the test-only fault injection into the
 * writes (file.h). */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static unsigned long file_tmp_counter; /* atomic: makes temp names unique within the process */

/* ---- test-only fault injection (file.h) ---- */

static pthread_mutex_t file_fault_mu = PTHREAD_MUTEX_INITIALIZER; /* guards the three below */
static struct cairn_file_fault file_fault;  /* step OFF: inert */
static long file_fault_seen;                /* matching writes so far */
static long file_fault_n_hits;              /* writes a fault was injected into */
static int file_fault_armed;                /* atomic: 0 skips the lock on every write */
static pthread_once_t file_fault_env_once = PTHREAD_ONCE_INIT;

void cairn_file_fault_set(const struct cairn_file_fault *f)
{
    pthread_mutex_lock(&file_fault_mu);
    memset(&file_fault, 0, sizeof(file_fault));
    if (f) file_fault = *f;
    file_fault.match[sizeof(file_fault.match) - 1] = 0;
    file_fault_seen = file_fault_n_hits = 0;
    __atomic_store_n(&file_fault_armed, file_fault.step != CAIRN_FILE_FAULT_OFF, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&file_fault_mu);
}

long cairn_file_fault_hits(void)
{
    pthread_mutex_lock(&file_fault_mu);
    long n = file_fault_n_hits;
    pthread_mutex_unlock(&file_fault_mu);
    return n;
}

/* CAIRN_FILE_FAULT=STEP:ERROR[:MATCH[:SKIP[:COUNT]]]; a malformed value arms nothing (said on
 * stderr: the base room has no logger of its own to depend on). */
static void file_fault_from_env(void)
{
    const char *v = getenv("CAIRN_FILE_FAULT");
    if (!v || !*v) return;
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", v);
    char *fields[5] = {0};
    int n = 0;
    for (char *p = buf; n < 5;) {
        fields[n++] = p;
        char *c = strchr(p, ':');
        if (!c) break;
        *c = 0;
        p = c + 1;
    }
    static const char *const steps[] = {"", "write", "fsync", "rename", "fsync_dir"};
    struct cairn_file_fault f = {.count = -1};
    for (int i = 1; i < 5; i++)
        if (!strcmp(fields[0], steps[i])) f.step = (enum cairn_file_fault_step)i;
    int ok = f.step != CAIRN_FILE_FAULT_OFF && n >= 2;
    if (ok && !strcmp(fields[1], "ENOSPC")) f.err = ENOSPC;
    else if (ok && !strcmp(fields[1], "EIO")) f.err = EIO;
    else if (!(ok && !strcmp(fields[1], "short") && f.step == CAIRN_FILE_FAULT_WRITE)) ok = 0;
    if (n >= 3) snprintf(f.match, sizeof(f.match), "%s", fields[2]);
    if (n >= 4) f.skip = strtol(fields[3], NULL, 10);
    if (n >= 5) f.count = strtol(fields[4], NULL, 10);
    if (!ok) {
        fprintf(stderr, "CAIRN_FILE_FAULT=%s: not STEP:ERROR[:MATCH[:SKIP[:COUNT]]]; ignored\n", v);
        return;
    }
    cairn_file_fault_set(&f);
}

/* The fault this atomic write of path gets: its step (OFF: none) and *err (0: short writes). */
static enum cairn_file_fault_step file_fault_take(const char *path, int *err)
{
    pthread_once(&file_fault_env_once, file_fault_from_env);
    if (!__atomic_load_n(&file_fault_armed, __ATOMIC_ACQUIRE)) return CAIRN_FILE_FAULT_OFF;
    enum cairn_file_fault_step step = CAIRN_FILE_FAULT_OFF;
    pthread_mutex_lock(&file_fault_mu);
    if (file_fault.step != CAIRN_FILE_FAULT_OFF && strstr(path, file_fault.match)) {
        long k = file_fault_seen++;
        if (k >= file_fault.skip && (file_fault.count < 0 || k - file_fault.skip < file_fault.count)) {
            step = file_fault.step;
            *err = file_fault.err;
            file_fault_n_hits++;
        }
    }
    pthread_mutex_unlock(&file_fault_mu);
    return step;
}

int cairn_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* max_chunk: the most one write() is asked for (0: all; the short-write fault sets it). */
static int file_write_full(int fd, const void *data, size_t n, size_t max_chunk)
{
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, max_chunk && n > max_chunk ? max_chunk : n);
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
    int fault_err = 0;
    enum cairn_file_fault_step fault = file_fault_take(path, &fault_err);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return cairn_err_set(err, CAIRN_ERR_IO, "%s: %s", tmp, strerror(errno));
    for (int i = 0; i < n_parts; i++) {
        size_t max_chunk = fault == CAIRN_FILE_FAULT_WRITE && !fault_err ? sizes[i] / 2 + 1 : 0;
        if (fault == CAIRN_FILE_FAULT_WRITE && fault_err && i == n_parts - 1) {
            /* a disk that fills up mid-file: half of the last part lands, then the error */
            if (file_write_full(fd, parts[i], sizes[i] / 2, 0) == 0) errno = fault_err;
            goto fail;
        }
        if (file_write_full(fd, parts[i], sizes[i], max_chunk) != 0) goto fail;
    }
    if (fault == CAIRN_FILE_FAULT_FSYNC) {
        errno = fault_err;
        goto fail;
    }
    if (fsync(fd) != 0) goto fail;
    if (close(fd) != 0) {
        fd = -1;
        goto fail;
    }
    fd = -1;
    if (fault == CAIRN_FILE_FAULT_RENAME) {
        errno = fault_err;
        goto fail;
    }
    if (rename(tmp, path) != 0) goto fail;
    char dir[4096];
    snprintf(dir, sizeof(dir), "%s", path);
    if (fault == CAIRN_FILE_FAULT_FSYNC_DIR) {
        errno = fault_err;
        return cairn_err_set(err, CAIRN_ERR_IO, "fsync dir of %s: %s", path, strerror(errno));
    }
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
