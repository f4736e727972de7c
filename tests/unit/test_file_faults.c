/* Faults injected into the crash-safe writes (base/file.c's test hook): ENOSPC, EIO and short
 * writes at each step (write, fsync, rename, fsync of the folder), first into
 * cairn_file_write_atomic itself, then through the two writers that use it: the SSD tier (a
 * logged error, a counted drop, a miss, never a wrong block, before and after a restart on the
 * same folder) and the settings file (an error, the old file kept and still loadable). Also the
 * CAIRN_FILE_FAULT variable a whole server is run with, in a child process. */
#include <errno.h>
#include <sys/wait.h>

#include "api/settings.h"
#include "base/file.h"
#include "base/log.h"
#include "kv/tiers.h"
#include "testlib.h"
#include "tier_testutil.h"

static struct kv_tier_signature sig;

static const struct {
    enum cairn_file_fault_step step;
    const char *name;
} steps[] = {
    {CAIRN_FILE_FAULT_WRITE, "write"},
    {CAIRN_FILE_FAULT_FSYNC, "fsync"},
    {CAIRN_FILE_FAULT_RENAME, "rename"},
    {CAIRN_FILE_FAULT_FSYNC_DIR, "fsync_dir"},
};
static const int errnos[] = {ENOSPC, EIO};

static void arm(enum cairn_file_fault_step step, int e, const char *match, long skip, long count)
{
    struct cairn_file_fault f = {.step = step, .err = e, .skip = skip, .count = count};
    snprintf(f.match, sizeof(f.match), "%s", match);
    cairn_file_fault_set(&f);
}

static int file_is(const char *path, const char *want)
{
    char *got = NULL;
    size_t n = 0;
    if (cairn_file_read_all(path, 1 << 20, &got, &n, NULL) != CAIRN_OK) return 0;
    int same = n == strlen(want) && memcmp(got, want, n) == 0;
    free(got);
    return same;
}

/* 1 if a kept log line after seq contains both strings. */
static int logged_since(uint64_t seq, const char *a, const char *b)
{
    static struct cairn_log_entry lines[64];
    int n = cairn_log_recent(seq, CAIRN_LOG_WARN, lines, 64, NULL);
    for (int i = 0; i < n; i++)
        if (strstr(lines[i].text, a) && strstr(lines[i].text, b)) return 1;
    return 0;
}

static uint64_t log_seq(void)
{
    uint64_t last = 0;
    cairn_log_recent(UINT64_MAX, CAIRN_LOG_DEBUG, NULL, 0, &last);
    return last;
}

static void test_atomic_write(void)
{
    char dir[256], path[512];
    tt_tmpdir(dir, sizeof(dir), "faults-file");
    snprintf(path, sizeof(path), "%s/f.json", dir);
    for (size_t s = 0; s < CAIRN_ARRAY_LEN(steps); s++)
        for (size_t k = 0; k < CAIRN_ARRAY_LEN(errnos); k++) {
            CHECK(cairn_file_write_atomic(path, "old", 3, NULL) == CAIRN_OK);
            arm(steps[s].step, errnos[k], "f.json", 0, -1);
            struct cairn_err err = {0};
            int rc = cairn_file_write_atomic(path, "new contents", 12, &err);
            CHECK_MSG(rc == CAIRN_ERR_IO, "%s/%d: rc %d", steps[s].name, errnos[k], rc);
            CHECK_MSG(strstr(err.msg, strerror(errnos[k])) != NULL, "%s: %s", steps[s].name,
                      err.msg);
            CHECK_EQ_INT(cairn_file_fault_hits(), 1);
            /* before the rename the old file stands; fsync_dir fails after it (new file whole) */
            const char *want = steps[s].step == CAIRN_FILE_FAULT_FSYNC_DIR ? "new contents" : "old";
            CHECK_MSG(file_is(path, want), "%s: file is not \"%s\"", steps[s].name, want);
            CHECK_EQ_INT(tt_count_files(dir, ".tmp."), 0);
            cairn_file_fault_set(NULL);
        }

    /* short writes: every write() gets at most half; the file still comes out whole */
    size_t n = 300001;
    char *big = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        big[i] = (char)('a' + i % 23);
    big[n] = 0;
    arm(CAIRN_FILE_FAULT_WRITE, 0, "", 0, -1);
    const void *parts[3] = {big, "|", big + 1000};
    size_t sizes[3] = {1000, 1, n - 1000};
    CHECK(cairn_file_write_atomic_iov(path, parts, sizes, 3, NULL) == CAIRN_OK);
    CHECK_EQ_INT(cairn_file_fault_hits(), 1);
    cairn_file_fault_set(NULL);
    char *want = malloc(n + 2);
    memcpy(want, big, 1000);
    want[1000] = '|';
    memcpy(want + 1001, big + 1000, n - 1000 + 1);
    CHECK(file_is(path, want));
    free(want);
    free(big);

    /* match, skip and count: only the 2nd and 3rd writes of g.json fail */
    char other[512];
    snprintf(other, sizeof(other), "%s/g.json", dir);
    arm(CAIRN_FILE_FAULT_RENAME, EIO, "g.json", 1, 2);
    int rcs[5];
    for (int i = 0; i < 5; i++) {
        CHECK(cairn_file_write_atomic(path, "x", 1, NULL) == CAIRN_OK); /* never matches */
        rcs[i] = cairn_file_write_atomic(other, "y", 1, NULL);
    }
    CHECK(rcs[0] == CAIRN_OK && rcs[1] == CAIRN_ERR_IO && rcs[2] == CAIRN_ERR_IO &&
          rcs[3] == CAIRN_OK && rcs[4] == CAIRN_OK);
    CHECK_EQ_INT(cairn_file_fault_hits(), 2);
    cairn_file_fault_set(NULL);
    tt_rm_rf(dir);
}

static struct kv_tiers *open_ssd(const char *dir)
{
    struct kv_tiers_opts o = {.sig = sig, .ssd_dir = dir, .ssd_n_writers = 2};
    struct kv_tiers *t = NULL;
    struct cairn_err err = {0};
    CHECK_MSG(kv_tiers_open(&o, &t, &err) == CAIRN_OK, "%s", err.msg);
    return t;
}

/* Blocks 0..3 are written under the fault, 4..5 after it: the faulted ones miss (or, after an
 * fsync_dir fault whose file did land whole, hit with the right payload), the others hit, in
 * the same process and after a restart on the same folder. A wrong payload never comes back. */
static void ssd_case(enum cairn_file_fault_step step, int e, const char *what)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "faults-ssd");
    struct kv_tiers *t = open_ssd(dir);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    uint64_t seq = log_seq();
    arm(step, e, ".safetensors", 0, -1);
    for (int i = 0; i < 4; i++)
        tt_evict(&ops, &sig, i, 0);
    kv_tiers_sync(t);
    cairn_file_fault_set(NULL);
    for (int i = 4; i < 6; i++)
        tt_evict(&ops, &sig, i, 0);
    kv_tiers_sync(t);
    struct kv_tiers_stats ts;
    kv_tiers_stats(t, &ts);
    int landed = step == CAIRN_FILE_FAULT_FSYNC_DIR;
    if (e) {
        CHECK_MSG(ts.ssd.n_write_errors == 4, "%s: %llu write errors", what,
                  (unsigned long long)ts.ssd.n_write_errors);
        CHECK_MSG(logged_since(seq, "ssd tier: write failed", strerror(e)), "%s: no log line",
                  what);
        for (int i = 0; i < 4; i++)
            CHECK_MSG(tt_lookup_check(&ops, &sig, i, NULL) == 0, "%s: block %d", what, i);
        if (!landed) CHECK_EQ_INT(tt_count_suffix(dir, ".safetensors"), 2);
    } else {
        CHECK_EQ_INT(ts.ssd.n_write_errors, 0);
        for (int i = 0; i < 4; i++)
            CHECK_EQ_INT(tt_lookup_check(&ops, &sig, i, NULL), 1);
    }
    for (int i = 4; i < 6; i++)
        CHECK_MSG(tt_lookup_check(&ops, &sig, i, NULL) == 1, "%s: block %d", what, i);
    CHECK_EQ_INT(tt_count_files(dir, ".tmp."), 0);
    kv_tiers_close(t);

    t = open_ssd(dir); /* restart on the same folder */
    ops = kv_tiers_ops(t);
    for (int i = 0; i < 6; i++) {
        int r = tt_lookup_check(&ops, &sig, i, NULL);
        if (landed &&
            i < 4) /* a whole file whose folder fsync failed: a hit or a miss, never wrong */
            CHECK_MSG(r >= 0, "%s: block %d after restart: a wrong payload", what, i);
        else
            CHECK_MSG(r == (i >= 4 || !e), "%s: block %d after restart: %d", what, i, r);
    }
    kv_tiers_close(t);
    tt_rm_rf(dir);
}

static void test_ssd_tier(void)
{
    char what[64];
    for (size_t s = 0; s < CAIRN_ARRAY_LEN(steps); s++)
        for (size_t k = 0; k < CAIRN_ARRAY_LEN(errnos); k++) {
            snprintf(what, sizeof(what), "ssd %s %s", steps[s].name, strerror(errnos[k]));
            ssd_case(steps[s].step, errnos[k], what);
        }
    ssd_case(CAIRN_FILE_FAULT_WRITE, 0, "ssd short writes");
}

static void test_settings(void)
{
    char dir[256], path[512];
    tt_tmpdir(dir, sizeof(dir), "faults-settings");
    snprintf(path, sizeof(path), "%s/settings.json", dir);
    json_t *root = json_pack("{s:{s:i}}", "global", "top_k", 3);
    CHECK(api_settings_save(path, root, NULL) == CAIRN_OK);
    char *before = NULL;
    size_t n_before = 0;
    CHECK(cairn_file_read_all(path, 1 << 20, &before, &n_before, NULL) == CAIRN_OK);
    json_object_set_new(json_object_get(root, "global"), "top_k", json_integer(9));
    for (size_t s = 0; s < CAIRN_ARRAY_LEN(steps); s++) {
        if (steps[s].step == CAIRN_FILE_FAULT_FSYNC_DIR) continue; /* after the rename: see above */
        for (size_t k = 0; k < CAIRN_ARRAY_LEN(errnos); k++) {
            arm(steps[s].step, errnos[k], "settings.json", 0, -1);
            struct cairn_err err = {0};
            CHECK_MSG(api_settings_save(path, root, &err) == CAIRN_ERR_IO, "%s", steps[s].name);
            CHECK_MSG(strstr(err.msg, "settings.json") && strstr(err.msg, strerror(errnos[k])),
                      "%s", err.msg);
            cairn_file_fault_set(NULL);
            CHECK_MSG(file_is(path, before), "settings %s: the old file changed", steps[s].name);
            json_t *loaded = NULL;
            CHECK(api_settings_load(path, &loaded, NULL) == CAIRN_OK);
            CHECK_EQ_INT(
                json_integer_value(json_object_get(json_object_get(loaded, "global"), "top_k")), 3);
            json_decref(loaded);
            CHECK_EQ_INT(tt_count_files(dir, ".tmp."), 0);
            CHECK_EQ_INT(tt_count_files(dir, ".corrupt-"), 0);
        }
    }
    CHECK(api_settings_save(path, root, NULL) == CAIRN_OK); /* the disk is back */
    json_t *loaded = NULL;
    CHECK(api_settings_load(path, &loaded, NULL) == CAIRN_OK);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(loaded, "global"), "top_k")),
                 9);
    json_decref(loaded);
    json_decref(root);
    free(before);
    tt_rm_rf(dir);
}

/* CAIRN_FILE_FAULT is read at a process's first atomic write: checked in children (this
 * process has not read it yet when they fork, see main). Exit status: 0 as expected. */
static int env_child(const char *value, int want_rc, const char *dir)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("CAIRN_FILE_FAULT", value, 1);
        char p[512], q[512];
        snprintf(p, sizeof(p), "%s/a.safetensors", dir);
        snprintf(q, sizeof(q), "%s/b.json", dir);
        int bad = cairn_file_write_atomic(p, "a", 1, NULL) != want_rc;
        bad |= (cairn_file_write_atomic(q, "b", 1, NULL) != CAIRN_OK) << 1; /* no match */
        _exit(bad);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 100;
}

static void test_env(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "faults-env");
    CHECK_EQ_INT(env_child("write:ENOSPC:.safetensors", CAIRN_ERR_IO, dir), 0);
    CHECK_EQ_INT(env_child("rename:EIO:.safetensors:0:-1", CAIRN_ERR_IO, dir), 0);
    CHECK_EQ_INT(env_child("fsync:EIO:.safetensors:1", CAIRN_OK, dir),
                 0); /* the first is let through */
    CHECK_EQ_INT(env_child("write:short:.safetensors", CAIRN_OK, dir), 0);
    CHECK_EQ_INT(env_child("rename:short", CAIRN_OK, dir), 0); /* malformed: inert */
    CHECK_EQ_INT(env_child("bogus", CAIRN_OK, dir), 0);
    tt_rm_rf(dir);
}

int main(void)
{
    unsetenv("CAIRN_FILE_FAULT");
    test_env(); /* first: before this process's own first write reads the variable */
    tt_sig(&sig, 0);
    test_atomic_write();
    test_ssd_tier();
    test_settings();
    return test_summary("test_file_faults");
}
