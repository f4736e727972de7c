/* libFuzzer target: request JSON -> typed engine request (api_req_parse), all four APIs.
 * The first byte picks the API; the rest is the body. */
#include <stddef.h>
#include <stdint.h>

#include "api/api_req.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    enum api_kind kind = (enum api_kind)(data[0] % 5);
    struct api_req r;
    struct api_req_err e;
    if (api_req_parse(kind, (const char *)data + 1, size - 1, 8, &r, &e) == 0) {
        /* touch what the worker will use */
        if (r.messages) (void)json_array_size(r.messages);
        api_req_free(&r);
    } else if (e.status != 400) {
        __builtin_trap();
    }
    return 0;
}
