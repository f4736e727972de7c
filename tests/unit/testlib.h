/* Minimal test helpers: CHECK macros that count failures, and the summary line CI reads.
 * Usage: call checks, then `return test_summary("name");`. A test that ran no check fails; one
 * that can't run here (a missing dependency) returns test_skip(why): exit code 77, which ctest
 * reports as skipped (SKIP_RETURN_CODE in CMakeLists.txt), never as passed. */
#ifndef CAIRN_TESTLIB_H
#define CAIRN_TESTLIB_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_n_pass, test_n_fail;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (cond) {                                                                                \
            test_n_pass++;                                                                         \
        } else {                                                                                   \
            test_n_fail++;                                                                         \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);                        \
        }                                                                                          \
    } while (0)

#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (cond) {                                                                                \
            test_n_pass++;                                                                         \
        } else {                                                                                   \
            test_n_fail++;                                                                         \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

#define CHECK_EQ_INT(a, b) CHECK_MSG((long long)(a) == (long long)(b), "%lld != %lld", (long long)(a), (long long)(b))
#define CHECK_EQ_STR(a, b) CHECK_MSG(strcmp((a), (b)) == 0, "\"%s\" != \"%s\"", (a), (b))
#define CHECK_NEAR(a, b, tol) CHECK_MSG(fabs((double)(a) - (double)(b)) <= (tol), "%g vs %g (tol %g)", (double)(a), (double)(b), (double)(tol))

/* Path of a file in the source tree (CAIRN_SRC is set by ctest; falls back to "."). */
static inline const char *test_src_path(const char *rel, char *buf, size_t n)
{
    const char *root = getenv("CAIRN_SRC");
    snprintf(buf, n, "%s/%s", root ? root : ".", rel);
    return buf;
}

static inline int test_summary(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, test_n_pass, test_n_fail);
    if (test_n_pass + test_n_fail == 0) {
        printf("%s: FAIL: ran no checks\n", name);
        return 1;
    }
    return test_n_fail ? 1 : 0;
}

#define TEST_SKIP_CODE 77
static inline int test_skip(const char *name, const char *why)
{
    printf("%s: SKIP: %s\n", name, why);
    return TEST_SKIP_CODE;
}

#endif
