/* libFuzzer target: the incremental output parser (api_out). Byte 0: flags (bit 0: the prompt
 * opened <think>, bit 1: tools given); byte 1: split seed. The rest is fed whole and in
 * pseudo-random pieces; per kind (text, reasoning, tool calls) the output must be the same. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_out.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct fz_sink {
    char *buf;
    size_t len, cap;
};

struct fz_kinds {
    struct fz_sink k[3];
};

static void fz_add(struct fz_sink *s, const char *p, size_t n)
{
    if (s->len + n + 1 > s->cap) {
        s->cap = (s->len + n + 1) * 2;
        s->buf = realloc(s->buf, s->cap);
    }
    memcpy(s->buf + s->len, p, n);
    s->len += n;
}

static void fz_ev(void *user, const struct api_out_event *ev)
{
    struct fz_kinds *s = user;
    if (ev->kind == API_OUT_TOOL_CALL) {
        fz_add(&s->k[2], ev->name, strlen(ev->name));
        fz_add(&s->k[2], "(", 1);
        fz_add(&s->k[2], ev->arguments, strlen(ev->arguments));
        fz_add(&s->k[2], ")", 1);
    } else {
        fz_add(&s->k[ev->kind], ev->text, ev->len);
    }
}

static void fz_run(const uint8_t *d, size_t n, int flags, uint32_t seed, int whole, struct fz_kinds *s)
{
    struct api_out p;
    memset(s, 0, sizeof(*s));
    api_out_init(&p, flags & 1, (flags >> 1) & 1, fz_ev, s);
    size_t i = 0;
    while (i < n) {
        size_t k = n - i;
        if (!whole) {
            seed = seed * 1103515245u + 12345u;
            k = 1 + (seed >> 16) % 9;
            if (k > n - i) k = n - i;
        }
        api_out_feed(&p, (const char *)d + i, k);
        i += k;
    }
    api_out_finish(&p);
    api_out_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    struct fz_kinds w, s;
    fz_run(data + 2, size - 2, data[0], data[1], 1, &w);
    fz_run(data + 2, size - 2, data[0], data[1], 0, &s);
    for (int k = 0; k < 3; k++) {
        if (w.k[k].len != s.k[k].len || (w.k[k].len && memcmp(w.k[k].buf, s.k[k].buf, w.k[k].len)))
            __builtin_trap();
        free(w.k[k].buf);
        free(s.k[k].buf);
    }
    return 0;
}
