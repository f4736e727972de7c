/* The CPU backend for unit tests: opened on first use (one compute thread per core), closed at
 * exit so LeakSanitizer sees nothing left. */
#ifndef CAIRN_TEST_BACKEND_H
#define CAIRN_TEST_BACKEND_H

#include <stdio.h>
#include <stdlib.h>

#include "tensor/backend.h"

static struct backend *test_be_cpu_handle;

static void test_be_cpu_close(void)
{
    backend_close(test_be_cpu_handle);
    test_be_cpu_handle = NULL;
}

static inline struct backend *test_cpu_be(void)
{
    if (!test_be_cpu_handle) {
        struct cairn_err err = {0};
        if (backend_open("cpu", 0, &test_be_cpu_handle, &err) != CAIRN_OK) {
            fprintf(stderr, "FAIL: cannot open the cpu backend: %s\n", err.msg);
            abort();
        }
        atexit(test_be_cpu_close);
    }
    return test_be_cpu_handle;
}

#endif
