/* SSD tier robustness: damaged, renamed, foreign and other-model files; stale temp files; crash
 * (kill -9 mid-write) safety; unwritable folder; the queue-full drop path; the header format. */
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>

#include "base/file.h"
#include "base/hash.h"
#include "kv/tier_file.h"
#include "kv/tier_int.h"
#include "kv/tier_ssd.h"
#include "kv/tiers.h"
#include "testlib.h"
#include "tier_testutil.h"

static struct kv_tier_signature sig;

static struct kv_tiers *open_ssd(const struct kv_tier_signature *g, const char *dir, int writers)
{
    struct kv_tiers_opts o = {.sig = *g, .ssd_dir = dir, .ssd_n_writers = writers};
    struct kv_tiers *t = NULL;
    struct cairn_err err = {0};
    int rc = kv_tiers_open(&o, &t, &err);
    CHECK_MSG(rc == CAIRN_OK, "%s", err.msg);
    return t;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static pid_t dead_pid(void)
{
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    return p;
}

static void test_damaged_and_foreign(void)
{
    char dir[256], p[512], q[512];
    tt_tmpdir(dir, sizeof(dir), "tiers-ssd");
    struct kv_tiers *t = open_ssd(&sig, dir, 1);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    for (int i = 0; i < 6; i++) tt_evict(&ops, &sig, i, 0);
    kv_tiers_close(t);
    CHECK_EQ_INT(tt_count_suffix(dir, ".safetensors"), 6);

    /* 0: truncated */
    tt_path(dir, &sig, 0, p, sizeof(p));
    struct stat st;
    stat(p, &st);
    CHECK(truncate(p, st.st_size - 10) == 0);
    char p0[512];
    snprintf(p0, sizeof(p0), "%s", p);
    /* 1: one bit flipped in the payload */
    char p1[512];
    tt_path(dir, &sig, 1, p1, sizeof(p1));
    int fd = open(p1, O_RDWR);
    stat(p1, &st);
    uint8_t byte;
    CHECK(pread(fd, &byte, 1, st.st_size - 7) == 1);
    byte ^= 0x10;
    CHECK(pwrite(fd, &byte, 1, st.st_size - 7) == 1);
    close(fd);
    /* 3: renamed to another block's name (hash mismatch) */
    tt_path(dir, &sig, 3, p, sizeof(p));
    tt_path(dir, &sig, 10, q, sizeof(q));
    char qdir[512];
    snprintf(qdir, sizeof(qdir), "%s", q);
    *strrchr(qdir, '/') = 0;
    cairn_mkdir_p(qdir, NULL);
    CHECK(rename(p, q) == 0);
    /* another model's block in the same folder */
    struct kv_tier_signature other = sig;
    other.identity[0] ^= 1;
    t = open_ssd(&other, dir, 1);
    struct kv_tiers_stats ts;
    kv_tiers_stats(t, &ts);
    CHECK_EQ_INT(ts.ssd.n_blocks, 0); /* ours are foreign to it */
    CHECK(ts.ssd.n_foreign >= 5);
    struct kv_tier_ops oops = kv_tiers_ops(t);
    tt_evict(&oops, &other, 20, 0);
    kv_tiers_close(t);
    char pf[512];
    tt_path(dir, &other, 20, pf, sizeof(pf));
    CHECK(cairn_file_exists(pf));
    /* 2: bad header (after the other model's open, which would remove it too: a file with our
     * naming and a broken header belongs to nobody) */
    char p2[512];
    tt_path(dir, &sig, 2, p2, sizeof(p2));
    fd = open(p2, O_RDWR);
    CHECK(pwrite(fd, "garbage!", 8, 8) == 8);
    close(fd);
    /* unknown files and folders */
    char n1[600], n2[600], n3[600], tmp_dead[600], tmp_live[600];
    snprintf(n1, sizeof(n1), "%s/notes.txt", dir);
    write_file(n1, "hello");
    snprintf(n2, sizeof(n2), "%s/zz", dir);
    mkdir(n2, 0755);
    snprintf(n3, sizeof(n3), "%s/readme.txt", qdir);
    write_file(n3, "x");
    /* a temp file of a dead writer is removed; one of a live process is left alone */
    snprintf(tmp_dead, sizeof(tmp_dead), "%s.tmp.%d.1", p2, (int)dead_pid());
    write_file(tmp_dead, "partial");
    snprintf(tmp_live, sizeof(tmp_live), "%s.tmp.1.1", p2);
    write_file(tmp_live, "partial");

    t = open_ssd(&sig, dir, 1);
    ops = kv_tiers_ops(t);
    kv_tiers_stats(t, &ts);
    CHECK_EQ_INT(ts.ssd.n_damaged, 3);   /* truncated, bad header, renamed */
    CHECK_EQ_INT(ts.ssd.n_foreign, 5);   /* other model, notes.txt, zz, readme.txt, live tmp */
    CHECK_EQ_INT(ts.ssd.n_stale_tmp, 1);
    CHECK_EQ_INT(ts.ssd.n_blocks, 3);    /* 1 (not yet known bad), 4, 5 */
    CHECK(!cairn_file_exists(p0));
    CHECK(!cairn_file_exists(p2));
    CHECK(!cairn_file_exists(q));
    CHECK(!cairn_file_exists(tmp_dead));
    CHECK(cairn_file_exists(tmp_live));
    CHECK(cairn_file_exists(pf));
    CHECK(cairn_file_exists(n1));
    CHECK(cairn_file_exists(n3));
    CHECK(cairn_dir_exists(n2));
    for (int i = 0; i < 4; i++) CHECK_EQ_INT(tt_lookup_check(&ops, &sig, i, NULL), 0);
    for (int i = 4; i < 6; i++) CHECK_EQ_INT(tt_lookup_check(&ops, &sig, i, NULL), 1);
    kv_tiers_stats(t, &ts);
    CHECK_EQ_INT(ts.ssd.n_damaged, 4); /* + bit flip, found by the checksum */
    CHECK(!cairn_file_exists(p1));
    CHECK_EQ_INT(ts.ssd.n_blocks, 2);
    /* the same file replaced by another model's while indexed: foreign, left alone */
    char p4[512];
    tt_path(dir, &sig, 4, p4, sizeof(p4));
    CHECK(rename(pf, p4) == 0);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 4, NULL), 0);
    kv_tiers_stats(t, &ts);
    CHECK_EQ_INT(ts.ssd.n_foreign, 6);
    CHECK(cairn_file_exists(p4));
    /* a file that vanished: a miss, forgotten */
    char p5[512];
    tt_path(dir, &sig, 5, p5, sizeof(p5));
    unlink(p5);
    CHECK_EQ_INT(tt_lookup_check(&ops, &sig, 5, NULL), 0);
    kv_tiers_stats(t, &ts);
    CHECK_EQ_INT(ts.ssd.n_read_errors, 1);
    CHECK_EQ_INT(ts.ssd.n_blocks, 0);
    kv_tiers_close(t);
    tt_rm_rf(dir);
}

/* A child writes many blocks and is killed with SIGKILL mid-way; every block the reopened tier
 * returns must be byte-identical to what was written. */
static void test_crash_kill9(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "tiers-crash");
    struct kv_tier_signature big = sig;
    big.n_kv_layers = 4;
    big.n_kv_heads = 8;
    big.head_dim = 512; /* 256 KiB K + 256 KiB V per block: kills land mid-write */
    big.state_bytes = 1000;
    const int n = 400;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        struct kv_tiers_opts o = {.sig = big, .ssd_dir = dir, .ssd_n_writers = 2};
        struct kv_tiers *t = NULL;
        if (kv_tiers_open(&o, &t, NULL) != CAIRN_OK) _exit(3);
        struct kv_tier_ops ops = kv_tiers_ops(t);
        for (int i = 0; i < n; i++) {
            tt_evict(&ops, &big, i, i % 3 == 0);
            usleep(500);
        }
        kv_tiers_sync(t);
        for (;;) pause();
    }
    CHECK(pid > 0);
    double t0 = cairn_now();
    int seen = 0;
    while (cairn_now() - t0 < 20 && (seen = tt_count_suffix(dir, ".safetensors")) < 40)
        usleep(2000);
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    CHECK_MSG(seen >= 40, "only %d files written before the kill", seen);

    struct kv_tiers_opts o = {.sig = big, .ssd_dir = dir};
    struct kv_tiers *t = NULL;
    CHECK(kv_tiers_open(&o, &t, NULL) == CAIRN_OK);
    struct kv_tiers_stats ts;
    kv_tiers_stats(t, &ts);
    CHECK_EQ_INT(ts.ssd.n_damaged, 0);
    CHECK_EQ_INT(tt_count_files(dir, ".tmp."), 0); /* stale temp files removed */
    CHECK((int)ts.ssd.n_blocks >= seen);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    int hits = 0, wrong = 0, with_state = 0;
    for (int i = 0; i < n; i++) {
        int hs = 0;
        int r = tt_lookup_check(&ops, &big, i, &hs);
        if (r == 1) hits++;
        if (r < 0) wrong++;
        if (r == 1 && hs) with_state++;
    }
    CHECK_EQ_INT(wrong, 0);
    CHECK_EQ_INT(hits, (int)ts.ssd.n_blocks);
    CHECK(with_state > 0);
    printf("crash test: %d files before kill, %llu stale temp removed, %d blocks verified\n",
           seen, (unsigned long long)ts.ssd.n_stale_tmp, hits);
    kv_tiers_close(t);
    tt_rm_rf(dir);
}

static void test_unwritable(void)
{
    char dir[256], bad[512];
    tt_tmpdir(dir, sizeof(dir), "tiers-unw");
    snprintf(bad, sizeof(bad), "%s/file", dir);
    write_file(bad, "not a folder");
    snprintf(bad, sizeof(bad), "%s/file/cache", dir);
    struct kv_tiers_opts o = {.sig = sig, .ssd_dir = bad, .hot_max_bytes = 4096};
    struct kv_tiers *t = NULL;
    CHECK(kv_tiers_open(&o, &t, NULL) == CAIRN_OK);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    for (int i = 0; i < 10; i++) tt_evict(&ops, &sig, i, 0);
    kv_tiers_sync(t);
    for (int i = 0; i < 10; i++) CHECK(tt_lookup_check(&ops, &sig, i, NULL) >= 0);
    kv_tiers_close(t); /* flush of dirty hot blocks fails quietly too */

    /* the folder disappears (replaced by a file) while running */
    char d2[512];
    snprintf(d2, sizeof(d2), "%s/gone", dir);
    o.ssd_dir = d2;
    o.hot_max_bytes = 0;
    CHECK(kv_tiers_open(&o, &t, NULL) == CAIRN_OK);
    ops = kv_tiers_ops(t);
    tt_evict(&ops, &sig, 0, 0);
    kv_tiers_sync(t);
    tt_rm_rf(d2);
    write_file(d2, "now a file");
    for (int i = 1; i < 6; i++) tt_evict(&ops, &sig, i, 0);
    kv_tiers_sync(t);
    struct kv_tiers_stats ts;
    kv_tiers_stats(t, &ts);
    CHECK_EQ_INT(ts.ssd.n_writes, 1);
    CHECK_EQ_INT(ts.ssd.n_write_errors, 5);
    CHECK_EQ_INT(ts.ssd.n_drops, 5);
    for (int i = 0; i < 6; i++) CHECK_EQ_INT(tt_lookup_check(&ops, &sig, i, NULL), 0);
    kv_tiers_close(t);
    tt_rm_rf(dir);
}

/* Disk full, simulated with RLIMIT_FSIZE in a child (writes past the limit fail with EFBIG):
 * writes become counted drops, no temp file is left, lookups miss, nothing crashes. */
static void test_disk_full(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "tiers-full");
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {.rlim_cur = 1200, .rlim_max = RLIM_INFINITY};
        setrlimit(RLIMIT_FSIZE, &rl);
        struct kv_tiers_opts o = {.sig = sig, .ssd_dir = dir, .hot_max_bytes = 1 << 20};
        struct kv_tiers *t = NULL;
        if (kv_tiers_open(&o, &t, NULL) != CAIRN_OK) _exit(10);
        struct kv_tier_ops ops = kv_tiers_ops(t);
        for (int i = 0; i < 4; i++) tt_evict(&ops, &sig, i, 0);
        kv_tiers_clear(t, KV_TIER_HOT, NULL); /* flush: every write fails */
        kv_tiers_sync(t);
        struct kv_tiers_stats st;
        kv_tiers_stats(t, &st);
        int bad = 0;
        bad |= (st.ssd.n_write_errors != 4) << 0;
        bad |= (st.ssd.n_drops != 4) << 1;
        bad |= (st.ssd.n_blocks != 0) << 2;
        for (int i = 0; i < 4; i++) bad |= (tt_lookup_check(&ops, &sig, i, NULL) != 0) << 3;
        bad |= (tt_count_files(dir, NULL) != 0) << 4; /* no temp file left behind */
        kv_tiers_close(t);
        _exit(bad);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
    tt_rm_rf(dir);
}

static struct kv_tier_block *mk_block(int i)
{
    struct tt_block b;
    tt_block_make(&b, &sig, i, 0);
    struct kv_tier_block *k = kv_tier_block_from_desc(&b.d);
    tt_block_free(&b);
    return k;
}

static void test_queue_full(void)
{
    char dir[256];
    tt_tmpdir(dir, sizeof(dir), "tiers-q");
    struct kv_ssd_opts o = {.sig = sig, .dir = dir, .max_bytes = 1 << 20, .n_writers = 1,
                            .queue_max_blocks = 2, .queue_max_bytes = 1 << 20};
    struct kv_ssd *s = NULL;
    CHECK(kv_ssd_open(&o, &s, NULL) == CAIRN_OK);
    kv_ssd_pause_writers(s, 1);
    for (int i = 0; i < 5; i++) kv_ssd_enqueue(s, mk_block(i), 0);
    struct kv_tier_stats st;
    kv_ssd_stats(s, &st);
    CHECK_EQ_INT(st.n_queued, 2);
    CHECK_EQ_INT(st.n_drops, 3);
    CHECK_EQ_INT(st.n_blocks, 2);
    /* queued blocks are readable before they reach the disk */
    struct tt_block b;
    tt_block_make(&b, &sig, 1, 0);
    uint8_t *k = malloc(b.block_bytes), *v = malloc(b.block_bytes);
    CHECK(kv_ssd_lookup(s, b.hash, b.tokens, 4, k, v, b.block_bytes, NULL, 0, NULL, NULL) == 1);
    CHECK(memcmp(k, b.k, b.block_bytes) == 0 && memcmp(v, b.v, b.block_bytes) == 0);
    CHECK(kv_ssd_has(s, b.hash));
    tt_block_free(&b);
    tt_block_make(&b, &sig, 3, 0);
    CHECK(kv_ssd_lookup(s, b.hash, b.tokens, 4, k, v, b.block_bytes, NULL, 0, NULL, NULL) == 0);
    tt_block_free(&b);
    CHECK_EQ_INT(tt_count_suffix(dir, ".safetensors"), 0);
    kv_ssd_pause_writers(s, 0);
    kv_ssd_sync(s);
    kv_ssd_stats(s, &st);
    CHECK_EQ_INT(st.n_writes, 2);
    CHECK_EQ_INT(st.n_queued, 0);
    CHECK_EQ_INT(st.n_queued_bytes, 0);
    CHECK_EQ_INT(tt_count_suffix(dir, ".safetensors"), 2);
    /* a duplicate is not queued again */
    kv_ssd_enqueue(s, mk_block(0), 0);
    kv_ssd_sync(s);
    kv_ssd_stats(s, &st);
    CHECK_EQ_INT(st.n_writes, 2);
    /* blocking enqueue (flush path) waits instead of dropping */
    kv_ssd_pause_writers(s, 1);
    for (int i = 10; i < 12; i++) kv_ssd_enqueue(s, mk_block(i), 0);
    kv_ssd_pause_writers(s, 0);
    for (int i = 12; i < 20; i++) kv_ssd_enqueue(s, mk_block(i), 1);
    kv_ssd_sync(s);
    kv_ssd_stats(s, &st);
    CHECK_EQ_INT(st.n_writes, 12);
    CHECK_EQ_INT(st.n_drops, 3);
    /* clear drops what is queued and removes the files */
    kv_ssd_pause_writers(s, 1);
    kv_ssd_enqueue(s, mk_block(30), 0);
    kv_ssd_clear(s);
    kv_ssd_pause_writers(s, 0);
    kv_ssd_sync(s);
    kv_ssd_stats(s, &st);
    CHECK_EQ_INT(st.n_blocks, 0);
    CHECK_EQ_INT(st.n_bytes, 0);
    CHECK_EQ_INT(tt_count_suffix(dir, ".safetensors"), 0);
    free(k);
    free(v);
    kv_ssd_close(s);
    tt_rm_rf(dir);
}

static void test_header_format(void)
{
    char hex[65];
    kv_tier_signature_hex(&sig, hex);
    struct kv_tier_signature s2 = sig;
    s2.block_size = 8;
    char hex2[65];
    kv_tier_signature_hex(&s2, hex2);
    CHECK(strcmp(hex, hex2) != 0);
    struct kv_tier_block *b = mk_block(3);
    char *h = NULL;
    size_t len = 0;
    CHECK(kv_tier_header_build(&sig, hex, b, 0x0123456789abcdefull, &h, &len, NULL) == 0);
    CHECK(len % 8 == 0);
    struct kv_tier_header hd;
    struct cairn_err err = {0};
    CHECK_MSG(kv_tier_header_parse((uint8_t *)h, len, &hd, &err) == CAIRN_OK, "%s", err.msg);
    CHECK_EQ_INT(hd.version, 1);
    CHECK_EQ_STR(hd.signature, hex);
    CHECK(memcmp(hd.hash, b->hash, 32) == 0 && memcmp(hd.parent, b->parent, 32) == 0);
    CHECK_EQ_INT(hd.n_tokens, 4);
    CHECK(memcmp(hd.tokens, b->tokens, 16) == 0);
    CHECK(hd.checksum == 0x0123456789abcdefull);
    CHECK_EQ_INT(hd.kv_dtype, DTYPE_F32);
    CHECK(hd.kv_shape[0] == 2 && hd.kv_shape[1] == 4 && hd.kv_shape[2] == 2 &&
          hd.kv_shape[3] == 8);
    CHECK_EQ_INT(hd.kv_bytes, b->block_bytes);
    CHECK_EQ_INT(hd.data_offset, len);
    CHECK_EQ_INT(hd.data_bytes, 2 * b->block_bytes);
    CHECK(!hd.has_state);
    kv_tier_header_free(&hd);
    /* every truncation fails cleanly */
    int bad = 0;
    for (size_t n = 0; n < len; n++) bad += kv_tier_header_parse((uint8_t *)h, n, &hd, NULL) != 0;
    CHECK_EQ_INT(bad, (int)len);
    free(h);
    kv_tier_block_free(b);

    /* hand-made headers: each one thing wrong */
    const char *meta =
        "{\"__metadata__\":{\"format\":\"cairn-kv-block\",\"version\":\"1\",\"signature\":"
        "\"%s\",\"hash\":\"%s\",\"parent\":\"%s\",\"n_tokens\":\"%s\",\"checksum\":"
        "\"00000000000000ff\",\"tokens\":\"%s\"},"
        "\"K\":{\"dtype\":\"%s\",\"shape\":[1,2,1,1],\"data_offsets\":[0,8]},"
        "\"V\":{\"dtype\":\"F32\",\"shape\":[1,2,1,1],\"data_offsets\":[%s]}%s}";
    const char *z = "0000000000000000000000000000000000000000000000000000000000000000";
    struct {
        const char *n_tokens, *tokens, *kdt, *voff, *extra;
        int ok;
    } cases[] = {
        {"2", "5,-6", "F32", "8,16", "", 1},
        {"2", "5,-6", "F32", "8,16", ",\"state\":{\"dtype\":\"U8\",\"shape\":[3],"
                                     "\"data_offsets\":[16,19]}", 1},
        {"3", "5,-6", "F32", "8,16", "", 0},           /* count differs from the list */
        {"2", "5,,6", "F32", "8,16", "", 0},
        {"2", "5,99999999999", "F32", "8,16", "", 0},  /* out of int32 range */
        {"2", "5,6", "U8", "8,16", "", 0},             /* dtype U8 for K; size mismatch too */
        {"2", "5,6", "F32", "8,17", "", 0},            /* V length wrong */
        {"2", "5,6", "F32", "0,8", "", 0},             /* V overlaps K */
        {"2", "5,6", "F32", "8,16", ",\"x\":{}", 0},   /* unknown tensor */
        {"2", "5,6", "F32", "8,16", ",\"state\":{\"dtype\":\"U8\",\"shape\":[3],"
                                    "\"data_offsets\":[17,20]}", 0}, /* gap */
        {"02", "5,6", "F32", "8,16", "", 0},
        {"-1", "", "F32", "8,16", "", 0},
    };
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(cases); i++) {
        char json[2048];
        int jn = snprintf(json + 8, sizeof(json) - 8, meta, hex, z, z, cases[i].n_tokens,
                          cases[i].tokens, cases[i].kdt, cases[i].voff, cases[i].extra);
        for (int j = 0; j < 8; j++) json[j] = (char)(((uint64_t)jn >> (8 * j)) & 255);
        int rc = kv_tier_header_parse((uint8_t *)json, (size_t)jn + 8, &hd, NULL);
        CHECK_MSG((rc == CAIRN_OK) == cases[i].ok, "case %zu rc %d", i, rc);
        if (rc == CAIRN_OK) {
            CHECK(hd.tokens[1] == -6);
            kv_tier_header_free(&hd);
        }
    }
    /* duplicate keys are rejected */
    const char *dup = "{\"__metadata__\":{},\"__metadata__\":{}}";
    char dbuf[128];
    size_t dn = strlen(dup);
    for (int j = 0; j < 8; j++) dbuf[j] = (char)((dn >> (8 * j)) & 255);
    memcpy(dbuf + 8, dup, dn);
    CHECK(kv_tier_header_parse((uint8_t *)dbuf, dn + 8, &hd, NULL) == CAIRN_ERR_FORMAT);
    uint8_t name_hash[32];
    CHECK(!kv_tier_file_name_hash("abc.safetensors", name_hash));
    char nm[100];
    snprintf(nm, sizeof(nm), "%s.safetensors", hex);
    CHECK(kv_tier_file_name_hash(nm, name_hash));
    nm[3] = 'A';
    CHECK(!kv_tier_file_name_hash(nm, name_hash));
}

/* The stored checksum is cairn_xxh3 of the data section, as the format says. */
static void test_checksum_is_xxh3_of_data(void)
{
    char dir[256], p[512];
    tt_tmpdir(dir, sizeof(dir), "tiers-ck");
    struct kv_tier_signature g;
    tt_sig(&g, 24);
    struct kv_tiers *t = open_ssd(&g, dir, 1);
    struct kv_tier_ops ops = kv_tiers_ops(t);
    tt_evict(&ops, &g, 9, 1);
    kv_tiers_close(t);
    tt_path(dir, &g, 9, p, sizeof(p));
    char *buf = NULL;
    size_t len = 0;
    CHECK(cairn_file_read_all(p, 1 << 20, &buf, &len, NULL) == CAIRN_OK);
    struct kv_tier_header hd;
    CHECK(kv_tier_header_parse((uint8_t *)buf, len, &hd, NULL) == CAIRN_OK);
    CHECK(hd.has_state && hd.state_bytes == 24);
    CHECK_EQ_INT(hd.data_offset + hd.data_bytes, len);
    CHECK(cairn_xxh3(buf + hd.data_offset, hd.data_bytes) == hd.checksum);
    struct tt_block b;
    tt_block_make(&b, &g, 9, 1);
    CHECK(memcmp(buf + hd.data_offset, b.k, b.block_bytes) == 0);
    CHECK(memcmp(buf + hd.data_offset + b.block_bytes, b.v, b.block_bytes) == 0);
    CHECK(memcmp(buf + hd.data_offset + 2 * b.block_bytes, b.state, 24) == 0);
    tt_block_free(&b);
    kv_tier_header_free(&hd);
    free(buf);
    tt_rm_rf(dir);
}

int main(void)
{
    tt_sig(&sig, 0);
    test_header_format();
    test_checksum_is_xxh3_of_data();
    test_queue_full();
    test_damaged_and_foreign();
    test_unwritable();
    test_disk_full();
    test_crash_kill9();
    return test_summary("test_tiers_ssd");
}
