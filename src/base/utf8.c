/* UTF-8 (base/utf8.h). */
#include "base/utf8.h"

#include "base/status.h"

size_t cairn_utf8_seq_len(uint8_t c)
{
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) return 2;
    if ((c & 0xf0) == 0xe0) return 3;
    if ((c & 0xf8) == 0xf0) return 4;
    return 1;
}

size_t cairn_utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xe0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        o[2] = (char)(0x80 | (cp & 0x3f));
        return 3;
    }
    o[0] = (char)(0xf0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[3] = (char)(0x80 | (cp & 0x3f));
    return 4;
}

size_t cairn_utf8_get(const char *s, size_t n, size_t i, uint32_t *cp)
{
    const uint8_t *u = (const uint8_t *)s + i;
    size_t l = cairn_utf8_seq_len(u[0]);
    if (i + l > n) l = 1;
    switch (l) {
    case 1:
        *cp = u[0];
        break;
    case 2:
        *cp = ((uint32_t)(u[0] & 0x1f) << 6) | (u[1] & 0x3f);
        break;
    case 3:
        *cp = ((uint32_t)(u[0] & 0x0f) << 12) | ((uint32_t)(u[1] & 0x3f) << 6) | (u[2] & 0x3f);
        break;
    default:
        *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3f) << 12) |
              ((uint32_t)(u[2] & 0x3f) << 6) | (u[3] & 0x3f);
    }
    return l;
}

long cairn_utf8_check(const char *str, size_t n, size_t i)
{
    const uint8_t *s = (const uint8_t *)str;
    uint8_t c = s[i];
    if (c < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c == 0xe0)
        need = 2, lo = 0xa0;
    else if (c >= 0xe1 && c <= 0xec)
        need = 2;
    else if (c == 0xed)
        need = 2, hi = 0x9f;
    else if (c >= 0xee && c <= 0xef)
        need = 2;
    else if (c == 0xf0)
        need = 3, lo = 0x90;
    else if (c >= 0xf1 && c <= 0xf3)
        need = 3;
    else if (c == 0xf4)
        need = 3, hi = 0x8f;
    else
        return -1;
    for (size_t k = 1; k <= need; k++) {
        if (i + k >= n) return -(long)k;
        uint8_t d = s[i + k];
        if (k == 1 ? (d < lo || d > hi) : (d < 0x80 || d > 0xbf)) return -(long)k;
    }
    return (long)(need + 1);
}

int cairn_utf8_valid(const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        long l = cairn_utf8_check(s, n, i);
        if (l < 0) return 0;
        i += (size_t)l;
    }
    return 1;
}

int cairn_utf8_tail_open(const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    for (size_t i = n; i-- > 0 && i + 4 >= n;) {
        if ((u[i] & 0xc0) == 0x80) continue;
        if (u[i] < 0xc2 || u[i] > 0xf4) return 0; /* ASCII or a byte that never starts one */
        long r = cairn_utf8_check(s, n, i);
        return r < 0 && i + (size_t)(-r) >= n;
    }
    return 0;
}

int cairn_utf8_lossy(struct cairn_buf *out, const char *s, size_t n)
{
    const uint8_t *u = (const uint8_t *)s;
    size_t i = 0, run = 0;
    if (cairn_buf_reserve(out, n + 1)) return CAIRN_ERR_NOMEM;
    while (i < n) {
        long l = u[i] < 0x80 ? 1 : cairn_utf8_check(s, n, i);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        if (cairn_buf_put(out, s + run, i - run)) return CAIRN_ERR_NOMEM;
        if (cairn_buf_put(out, "\xef\xbf\xbd", 3)) return CAIRN_ERR_NOMEM;
        i += (size_t)(-l);
        run = i;
    }
    return cairn_buf_put(out, s + run, n - run);
}

uint32_t cairn_utf8_next(const char *s, size_t n, size_t *i)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    uint32_t c = u[k];
    if (c < 0x80 || k + 1 >= n) {
        *i = k + 1;
        return c;
    }
    if (c < 0xE0) {
        *i = k + 2;
        return ((c & 0x1F) << 6) | (u[k + 1] & 0x3F);
    }
    if (c < 0xF0) {
        if (k + 2 >= n) {
            *i = n;
            return 0xFFFD;
        }
        *i = k + 3;
        return ((c & 0x0F) << 12) | ((uint32_t)(u[k + 1] & 0x3F) << 6) | (u[k + 2] & 0x3F);
    }
    if (k + 3 >= n) {
        *i = n;
        return 0xFFFD;
    }
    *i = k + 4;
    return ((c & 0x07) << 18) | ((uint32_t)(u[k + 1] & 0x3F) << 12) |
           ((uint32_t)(u[k + 2] & 0x3F) << 6) | (u[k + 3] & 0x3F);
}

size_t cairn_utf8_count(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80) k++;
    return k;
}
