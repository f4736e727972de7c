/* libFuzzer target for the stop-string matcher (engine/stop.c), checked against a naive model.
 *
 * Input: byte 0 = number of stop strings (0..3), then each stop string as a length byte + bytes,
 * then the generated text, cut into "tokens" at every 0xff byte (the 0xff itself is dropped).
 * Reference (streaming semantics, as vLLM): after each token, look for the stop strings in all the
 * text so far; the first token after which one occurs stops generation, and the output is the
 * text before the earliest occurrence at that point. Properties checked: the matcher stops at that
 * token with exactly that text, never releases text that the match later excludes, and releases
 * everything when nothing matches. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/stop.h"

struct fz_stream {
    const uint8_t *tok;
    size_t n;
};

static void *fz_new(void *ctx) { return calloc(1, sizeof(struct fz_stream)); }
static int fz_feed(void *s, int32_t id, const char **t, size_t *l)
{
    struct fz_stream *f = s;
    *t = (const char *)f->tok;
    *l = f->n;
    return 0;
}
static int fz_flush(void *s, const char **t, size_t *l)
{
    *t = "";
    *l = 0;
    return 0;
}
static void fz_free(void *s) { free(s); }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    size_t pos = 1;
    int n_stop = data[0] % 4;
    char stops[3][256];
    const char *sp[3];
    size_t slen[3];
    int k = 0;
    for (int i = 0; i < n_stop; i++) {
        if (pos >= size) return 0;
        size_t L = data[pos++] % 16;
        if (L == 0 || pos + L > size) return 0;
        memcpy(stops[k], data + pos, L);
        stops[k][L] = 0;
        pos += L;
        if (strlen(stops[k]) != L) continue; /* no NUL inside stop strings */
        slen[k] = L;
        sp[k] = stops[k];
        k++;
    }
    n_stop = k;
    const uint8_t *text = data + pos;
    size_t n_text = size - pos;
    /* the full text without the separators, and the expected cut */
    char *full = malloc(n_text + 1), *got = malloc(n_text + 1);
    size_t n_full = 0, n_got = 0;
    for (size_t i = 0; i < n_text; i++)
        if (text[i] != 0xff) full[n_full++] = (char)text[i];
    /* reference: token by token over the accumulated text */
    size_t cut = n_full, acc = 0;
    for (size_t i = 0; i <= n_text && cut == n_full; i++) {
        if (i < n_text && text[i] != 0xff) {
            acc++;
            continue;
        }
        for (int q = 0; q < n_stop; q++) {
            const char *p = memmem(full, acc, sp[q], slen[q]);
            if (p && (size_t)(p - full) < cut) cut = (size_t)(p - full);
        }
    }
    struct engine_detok d = {NULL, fz_new, fz_feed, fz_flush, fz_free};
    struct stop_state st;
    if (stop_init(&st, &d, sp, n_stop, NULL, 0, NULL, 0, 0, NULL) != CAIRN_OK) abort();
    struct fz_stream *fs = st.stream;
    int stopped = 0;
    size_t i = 0, seen = 0; /* seen: bytes of full fed so far */
    while (i <= n_text && !stopped) {
        size_t j = i;
        while (j < n_text && text[j] != 0xff) j++;
        fs->tok = text + i;
        fs->n = j - i;
        seen += j - i;
        const char *t;
        size_t l;
        int rc = stop_feed(&st, 1, &t, &l);
        if (rc < 0) abort();
        memcpy(got + n_got, t, l);
        n_got += l;
        if (n_got > cut) abort(); /* released text a match would have excluded */
        if (rc == STOP_STRING) {
            stopped = 1;
            if (seen < cut) abort(); /* stopped before the match was complete */
        }
        i = j + 1;
    }
    if (!stopped) {
        const char *t;
        size_t l;
        if (stop_finish(&st, &t, &l) < 0) abort();
        memcpy(got + n_got, t, l);
        n_got += l;
    }
    if (n_got != cut || memcmp(got, full, cut) != 0) abort();
    if ((cut < n_full) != stopped) abort();
    stop_free(&st);
    free(full);
    free(got);
    return 0;
}
