/* SSD tier, recovery at open: the scan of <dir>/<xx>/ that rebuilds the index from the files'
 * headers (several threads, the work is waiting on metadata), oldest mtime first, removing
 * damaged files and temp files whose writer is gone. See tier_ssd_int.h. */
#include "kv/tier_ssd_int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"

struct ssd_found {
    uint8_t hash[32];
    uint64_t mtime_ns;
    uint64_t size;
};

/* One scan thread's findings and counters (merged into s->st after the threads join). */
struct ssd_scan {
    struct kv_ssd *s;
    int top;                 /* fd of the cache folder */
    char (*subs)[3];         /* the <xx> subfolders to scan */
    int n_subs, i_first, stride;
    struct ssd_found *v;
    size_t n, cap;
    uint64_t n_foreign, n_damaged, n_stale_tmp;
};

static int ssd_found_cmp(const void *a, const void *b)
{
    const struct ssd_found *x = a, *y = b;
    if (x->mtime_ns != y->mtime_ns) return x->mtime_ns < y->mtime_ns ? -1 : 1;
    return memcmp(x->hash, y->hash, 32);
}

/* "<64 hex>.safetensors.tmp.<pid>.<n>": a temp file of cairn_file_write_atomic. Returns its
 * pid, or 0 if the name is not one. */
static long ssd_tmp_pid(const char *name)
{
    const char *t = strstr(name, ".safetensors.tmp.");
    if (!t) return 0;
    char *end;
    long pid = strtol(t + 17, &end, 10);
    return (pid > 0 && *end == '.') ? pid : 0;
}

static void ssd_scan_file(struct kv_ssd *s, int dfd, const char *sub, const char *name,
                          struct ssd_scan *sc)
{
    uint8_t hash[32];
    if (!kv_tier_file_name_hash(name, hash)) {
        long pid = ssd_tmp_pid(name);
        /* A temp file whose writer is gone is a write that never finished. */
        if (pid && (pid == (long)getpid() || (kill((pid_t)pid, 0) != 0 && errno == ESRCH))) {
            if (unlinkat(dfd, name, 0) == 0) sc->n_stale_tmp++;
        } else {
            sc->n_foreign++;
        }
        return;
    }
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    struct kv_tier_header h;
    struct cairn_err err = {0};
    const char *why = "bad header";
    int res = SSD_READ_DAMAGED;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        sc->n_foreign++;
        return;
    }
    int rc = kv_ssd_read_header(fd, &h, &err);
    close(fd);
    if (rc == CAIRN_OK) {
        res = kv_ssd_check_header(s, &h, hash, (uint64_t)st.st_size, &why);
        kv_tier_header_free(&h);
        char hex[3];
        snprintf(hex, sizeof(hex), "%02x", hash[0]);
        if (res == SSD_READ_OK && strcmp(hex, sub) != 0) {
            res = SSD_READ_DAMAGED;
            why = "in the wrong folder";
        }
    } else if (rc == CAIRN_ERR_IO || rc == CAIRN_ERR_NOMEM) {
        return; /* unreadable now: leave it, do not index it */
    }
    if (res == SSD_READ_FOREIGN) {
        sc->n_foreign++;
        return;
    }
    if (res == SSD_READ_DAMAGED) {
        sc->n_damaged++;
        if (sc->n_damaged <= 10)
            LOG_WARN("kv", "ssd tier: %s/%s/%s: %s, removed", s->dir, sub, name, why);
        unlinkat(dfd, name, 0);
        return;
    }
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 1024;
        struct ssd_found *nv = realloc(sc->v, cap * sizeof(*nv));
        if (!nv) return;
        sc->v = nv;
        sc->cap = cap;
    }
    struct ssd_found *f = &sc->v[sc->n++];
    memcpy(f->hash, hash, 32);
    f->mtime_ns = (uint64_t)st.st_mtim.tv_sec * 1000000000ull + (uint64_t)st.st_mtim.tv_nsec;
    f->size = (uint64_t)st.st_size;
}

static void ssd_scan_subdir(struct kv_ssd *s, int top, const char *sub, struct ssd_scan *sc)
{
    int dfd = openat(top, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return;
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    __atomic_store_n(&s->subdir_ok[strtol(sub, NULL, 16) & 255], 1, __ATOMIC_RELAXED);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' && (!de->d_name[1] || (de->d_name[1] == '.' && !de->d_name[2])))
            continue;
        ssd_scan_file(s, dirfd(d), sub, de->d_name, sc);
    }
    closedir(d);
}

static int ssd_is_subdir_name(const char *n)
{
    for (int i = 0; i < 2; i++)
        if (!((n[i] >= '0' && n[i] <= '9') || (n[i] >= 'a' && n[i] <= 'f'))) return 0;
    return n[2] == 0;
}

static void *ssd_scan_main(void *arg)
{
    struct ssd_scan *sc = arg;
    for (int i = sc->i_first; i < sc->n_subs; i += sc->stride)
        ssd_scan_subdir(sc->s, sc->top, sc->subs[i], sc);
    return NULL;
}

#define SSD_SCAN_THREADS 8 /* the scan waits on file metadata and headers: overlap the I/O */

int kv_ssd_scan(struct kv_ssd *s)
{
    double t0 = cairn_now();
    int top = open(s->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (top < 0) return CAIRN_OK; /* logged by the caller's mkdir; nothing to index */
    int top2 = dup(top);          /* readdir's fd; `top` stays for openat */
    DIR *d = top2 >= 0 ? fdopendir(top2) : NULL;
    if (!d) {
        if (top2 >= 0) close(top2);
        close(top);
        return CAIRN_OK;
    }
    char subs[256][3];
    int n_subs = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        const char *n = de->d_name;
        if (n[0] == '.' && (!n[1] || (n[1] == '.' && !n[2]))) continue;
        if (ssd_is_subdir_name(n) && n_subs < 256)
            memcpy(subs[n_subs++], n, 3);
        else if (strncmp(n, "speeds-", 7) != 0) /* tier_speeds.c's files are ours */
            s->st.n_foreign++;
    }
    closedir(d);
    struct ssd_scan sc[SSD_SCAN_THREADS];
    pthread_t th[SSD_SCAN_THREADS];
    int started[SSD_SCAN_THREADS] = {0};
    int n_threads = n_subs < SSD_SCAN_THREADS ? (n_subs ? n_subs : 1) : SSD_SCAN_THREADS;
    memset(sc, 0, sizeof(sc));
    for (int i = 0; i < n_threads; i++) {
        sc[i] = (struct ssd_scan){.s = s, .top = top, .subs = subs, .n_subs = n_subs,
                                  .i_first = i, .stride = n_threads};
        if (i > 0) started[i] = pthread_create(&th[i], NULL, ssd_scan_main, &sc[i]) == 0;
    }
    ssd_scan_main(&sc[0]);
    for (int i = 1; i < n_threads; i++) {
        if (started[i])
            pthread_join(th[i], NULL);
        else
            ssd_scan_main(&sc[i]); /* no thread: do its share here */
    }
    close(top);
    /* merge */
    size_t total = 0;
    for (int i = 0; i < n_threads; i++) total += sc[i].n;
    struct ssd_found *all = malloc((total ? total : 1) * sizeof(*all));
    int rc = all ? CAIRN_OK : CAIRN_ERR_NOMEM;
    size_t k = 0;
    for (int i = 0; i < n_threads; i++) {
        if (all && sc[i].n) memcpy(all + k, sc[i].v, sc[i].n * sizeof(*all));
        k += sc[i].n;
        free(sc[i].v);
        s->st.n_foreign += sc[i].n_foreign;
        s->st.n_damaged += sc[i].n_damaged;
        s->st.n_stale_tmp += sc[i].n_stale_tmp;
    }
    if (all && total) qsort(all, total, sizeof(*all), ssd_found_cmp);
    for (size_t i = 0; all && i < total; i++) {
        struct ssd_entry *e = calloc(1, sizeof(*e));
        if (!e) {
            rc = CAIRN_ERR_NOMEM;
            break;
        }
        memcpy(e->link.key, all[i].hash, 32);
        e->file_bytes = all[i].size;
        if (kv_tier_map_insert(&s->map, &e->link) != 0) {
            free(e);
            rc = CAIRN_ERR_NOMEM;
            break;
        }
        s->bytes += e->file_bytes;
    }
    free(all);
    struct ssd_victims v = {0};
    kv_ssd_evict_locked(s, &v); /* the budget may have shrunk since the last run */
    kv_ssd_victims_unlink(s, &v);
    s->st.scan_s = cairn_now() - t0;
    return rc;
}
