/* base room: status strings, size parsing, hashing, atomic writes. */
#include <sys/stat.h>
#include <unistd.h>

#include "base/file.h"
#include "base/hash.h"
#include "base/mem.h"
#include "base/status.h"
#include "testlib.h"

static void test_sizes(void)
{
    uint64_t v = 0;
    CHECK(cairn_parse_size("123", &v) && v == 123);
    CHECK(cairn_parse_size("64K", &v) && v == 65536);
    CHECK(cairn_parse_size("1.5G", &v) && v == 1610612736ull);
    CHECK(cairn_parse_size("8MiB", &v) && v == 8ull << 20);
    CHECK(cairn_parse_size("50%", &v) && v > 0 && v <= cairn_mem_total_ram() / 2 + 1);
    CHECK(!cairn_parse_size("", &v));
    CHECK(!cairn_parse_size("12Q", &v));
    CHECK(!cairn_parse_size("150%", &v));
    CHECK(!cairn_parse_size("-5", &v));
}

static void test_hash(void)
{
    uint8_t d[32];
    char hex[65];
    cairn_sha256("abc", 3, d);
    cairn_hex(d, 32, hex);
    /* FIPS 180-2 test vector for "abc". */
    CHECK_EQ_STR(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    struct cairn_sha256 h;
    CHECK(cairn_sha256_init(&h) == 0);
    cairn_sha256_update(&h, "a", 1);
    cairn_sha256_update(&h, "bc", 2);
    uint8_t d2[32];
    cairn_sha256_final(&h, d2);
    CHECK(memcmp(d, d2, 32) == 0);
    uint8_t back[32];
    CHECK(cairn_unhex(hex, back, 32) && memcmp(back, d, 32) == 0);
    CHECK(!cairn_unhex("zz", back, 1));
    CHECK(cairn_xxh3("abc", 3) != cairn_xxh3("abd", 3));
}

static void test_atomic_write(void)
{
    char dir[] = "/tmp/cairn_test_base_XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[600], sub[300];
    snprintf(sub, sizeof(sub), "%s/a/b", dir);
    CHECK(cairn_mkdir_p(sub, NULL) == CAIRN_OK);
    snprintf(path, sizeof(path), "%s/f.txt", sub);
    CHECK(cairn_file_write_atomic(path, "hello", 5, NULL) == CAIRN_OK);
    CHECK(cairn_file_write_atomic(path, "world!", 6, NULL) == CAIRN_OK);
    char *data;
    size_t len;
    CHECK(cairn_file_read_all(path, 100, &data, &len, NULL) == CAIRN_OK);
    CHECK(len == 6 && memcmp(data, "world!", 6) == 0);
    free(data);
    struct cairn_err err;
    CHECK(cairn_file_read_all(path, 3, &data, &len, &err) == CAIRN_ERR_LIMIT);
    CHECK(strstr(err.msg, "f.txt") != NULL);
    /* A write into a missing folder fails cleanly and names the path. */
    snprintf(path, sizeof(path), "%s/missing/x", dir);
    CHECK(cairn_file_write_atomic(path, "x", 1, &err) == CAIRN_ERR_IO);
    CHECK(strstr(err.msg, "missing") != NULL);
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    test_sizes();
    test_hash();
    test_atomic_write();
    CHECK_EQ_STR(cairn_status_str(CAIRN_ERR_FORMAT), "bad format");
    return test_summary("test_base");
}
