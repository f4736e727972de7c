/* tok utilities: growable buffers, hash maps (string -> id, u64 -> u64), UTF-8 helpers,
 * GPT-2 byte-level tables, the PCRE2 wrapper that accepts HF (Oniguruma) regex syntax, and the
 * loaders' JSON helpers. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/hash.h"
#include "tok/tok_int.h"

/* ---- buffers ---- */

unsigned long tok_n_grow;

int tok_spans_push(struct tok_spans *s, size_t off, size_t len)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 64;
        TOK_COUNT_GROW();
        struct tok_span *v = realloc(s->v, cap * sizeof(*v));
        if (!v) return CAIRN_ERR_NOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
    return CAIRN_OK;
}

int tok_ids_push(struct tok_ids *ids, int32_t id)
{
    if (ids->n == ids->cap) {
        size_t cap = ids->cap ? ids->cap * 2 : 64;
        TOK_COUNT_GROW();
        int32_t *v = realloc(ids->v, cap * sizeof(*v));
        if (!v) return CAIRN_ERR_NOMEM;
        ids->v = v;
        ids->cap = cap;
    }
    ids->v[ids->n++] = id;
    return CAIRN_OK;
}

/* ---- string map ---- */

static uint32_t tok_pow2_at_least(uint64_t x)
{
    uint32_t p = 16;
    while (p < x)
        p *= 2;
    return p;
}

int tok_smap_init(struct tok_smap *m, uint32_t expect)
{
    memset(m, 0, sizeof(*m));
    uint32_t slots = tok_pow2_at_least((uint64_t)expect * 2 + 1);
    m->slots = calloc(slots, sizeof(uint32_t));
    if (!m->slots) return CAIRN_ERR_NOMEM;
    m->mask = slots - 1;
    return CAIRN_OK;
}

static int tok_smap_grow(struct tok_smap *m)
{
    uint32_t slots = (m->mask + 1) * 2;
    uint32_t *ns = calloc(slots, sizeof(uint32_t));
    if (!ns) return CAIRN_ERR_NOMEM;
    for (uint32_t e = 0; e < m->n; e++) {
        uint64_t h = cairn_xxh3(m->arena.p + m->key_off[e], m->key_len[e]);
        uint32_t i = (uint32_t)h & (slots - 1);
        while (ns[i])
            i = (i + 1) & (slots - 1);
        ns[i] = e + 1;
    }
    free(m->slots);
    m->slots = ns;
    m->mask = slots - 1;
    return CAIRN_OK;
}

int tok_smap_put(struct tok_smap *m, const char *key, size_t len, int32_t val)
{
    uint64_t h = cairn_xxh3(key, len);
    uint32_t i = (uint32_t)h & m->mask;
    while (m->slots[i]) {
        uint32_t e = m->slots[i] - 1;
        if (m->key_len[e] == len && memcmp(m->arena.p + m->key_off[e], key, len) == 0) {
            m->val[e] = val;
            return CAIRN_OK;
        }
        i = (i + 1) & m->mask;
    }
    if (m->n == m->cap) {
        uint32_t cap = m->cap ? m->cap * 2 : 64;
        uint64_t *ko = realloc(m->key_off, cap * sizeof(*ko));
        if (!ko) return CAIRN_ERR_NOMEM;
        m->key_off = ko;
        uint32_t *kl = realloc(m->key_len, cap * sizeof(*kl));
        if (!kl) return CAIRN_ERR_NOMEM;
        m->key_len = kl;
        int32_t *v = realloc(m->val, cap * sizeof(*v));
        if (!v) return CAIRN_ERR_NOMEM;
        m->val = v;
        m->cap = cap;
    }
    uint32_t e = m->n;
    m->key_off[e] = m->arena.n;
    m->key_len[e] = (uint32_t)len;
    m->val[e] = val;
    if (cairn_buf_put(&m->arena, key, len)) return CAIRN_ERR_NOMEM;
    m->n++;
    m->slots[i] = e + 1;
    if ((uint64_t)m->n * 2 > m->mask) return tok_smap_grow(m);
    return CAIRN_OK;
}

int32_t tok_smap_get(const struct tok_smap *m, const char *key, size_t len)
{
    if (!m->slots) return -1;
    uint64_t h = cairn_xxh3(key, len);
    uint32_t i = (uint32_t)h & m->mask;
    while (m->slots[i]) {
        uint32_t e = m->slots[i] - 1;
        if (m->key_len[e] == len && memcmp(m->arena.p + m->key_off[e], key, len) == 0)
            return m->val[e];
        i = (i + 1) & m->mask;
    }
    return -1;
}

void tok_smap_free(struct tok_smap *m)
{
    free(m->slots);
    free(m->key_off);
    free(m->key_len);
    free(m->val);
    cairn_buf_free(&m->arena);
    memset(m, 0, sizeof(*m));
}

/* ---- u64 map ---- */

static inline uint32_t tok_qhash(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return (uint32_t)k;
}

int tok_qmap_init(struct tok_qmap *m, uint32_t expect)
{
    memset(m, 0, sizeof(*m));
    uint32_t slots = tok_pow2_at_least((uint64_t)expect * 2 + 1);
    m->e = malloc(slots * sizeof(*m->e));
    if (!m->e) return CAIRN_ERR_NOMEM;
    memset(m->e, 0xff, slots * sizeof(*m->e));
    m->mask = slots - 1;
    return CAIRN_OK;
}

static int tok_qmap_grow(struct tok_qmap *m)
{
    struct tok_qmap nm;
    if (tok_qmap_init(&nm, (m->mask + 1))) return CAIRN_ERR_NOMEM;
    for (uint32_t i = 0; i <= m->mask; i++)
        if (m->e[i].key != UINT64_MAX) tok_qmap_put(&nm, m->e[i].key, m->e[i].val);
    tok_qmap_free(m);
    *m = nm;
    return CAIRN_OK;
}

int tok_qmap_put(struct tok_qmap *m, uint64_t key, uint64_t val)
{
    uint32_t i = tok_qhash(key) & m->mask;
    while (m->e[i].key != UINT64_MAX) {
        if (m->e[i].key == key) {
            m->e[i].val = val;
            return CAIRN_OK;
        }
        i = (i + 1) & m->mask;
    }
    m->e[i].key = key;
    m->e[i].val = val;
    m->n++;
    if ((uint64_t)m->n * 2 > m->mask) return tok_qmap_grow(m);
    return CAIRN_OK;
}

int tok_qmap_get(const struct tok_qmap *m, uint64_t key, uint64_t *val)
{
    if (!m->e) return 0;
    uint32_t i = tok_qhash(key) & m->mask;
    while (m->e[i].key != UINT64_MAX) {
        if (m->e[i].key == key) {
            *val = m->e[i].val;
            return 1;
        }
        i = (i + 1) & m->mask;
    }
    return 0;
}

void tok_qmap_free(struct tok_qmap *m)
{
    free(m->e);
    memset(m, 0, sizeof(*m));
}

int tok_byte_piece(const char *p, size_t n)
{
    if (n != 6 || p[0] != '<' || p[1] != '0' || p[2] != 'x' || p[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = p[i];
        int d = (c >= '0' && c <= '9')   ? c - '0'
                : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                : (c >= 'A' && c <= 'F') ? c - 'A' + 10
                : (c == '+' && i == 3)   ? 0 /* Rust's from_str_radix takes a leading '+' */
                                         : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ---- byte-level (GPT-2) tables ---- */

uint32_t tok_byte_to_cp[256];
static int16_t tok_cp_byte[324];
static pthread_once_t tok_bl_once = PTHREAD_ONCE_INIT;

static void tok_bytelevel_build(void)
{
    int n = 0;
    for (int i = 0; i < 324; i++)
        tok_cp_byte[i] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        uint32_t cp = printable ? (uint32_t)b : (uint32_t)(256 + n++);
        tok_byte_to_cp[b] = cp;
        tok_cp_byte[cp] = (int16_t)b;
    }
}

void tok_bytelevel_init(void)
{
    pthread_once(&tok_bl_once, tok_bytelevel_build);
}

int tok_cp_to_byte(uint32_t cp)
{
    return cp < 324 ? tok_cp_byte[cp] : -1;
}

/* ---- regex ---- */

/* Oniguruma's \s (what HF uses) includes U+0085; PCRE2's UCP \s does not. Rewrites \s / \S
 * so both agree. Everything else in HF's patterns means the same in PCRE2. */
static int tok_re_translate(const char *p, size_t n, struct cairn_buf *o)
{
    int in_class = 0;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            int r;
            if (d == 's')
                r = cairn_buf_put(o, in_class ? "\\s\\x{85}" : "[\\s\\x{85}]", in_class ? 8 : 10);
            else if (d == 'S' && !in_class)
                r = cairn_buf_put(o, "[^\\s\\x{85}]", 11);
            else
                r = cairn_buf_put(o, p + i, 2);
            if (r) return r;
            i++;
            continue;
        }
        if (c == '[' && !in_class) {
            in_class = 1;
            if (cairn_buf_put(o, p + i, 1)) return CAIRN_ERR_NOMEM;
            /* a ']' right after '[' or '[^' is literal */
            if (i + 1 < n && p[i + 1] == '^') {
                if (cairn_buf_put(o, "^", 1)) return CAIRN_ERR_NOMEM;
                i++;
            }
            if (i + 1 < n && p[i + 1] == ']') {
                if (cairn_buf_put(o, "\\]", 2)) return CAIRN_ERR_NOMEM;
                i++;
            }
            continue;
        }
        if (c == ']' && in_class) in_class = 0;
        if (cairn_buf_put(o, p + i, 1)) return CAIRN_ERR_NOMEM;
    }
    return CAIRN_OK;
}

int tok_re_compile(struct tok_re *re, const char *pat, size_t len, struct cairn_err *err)
{
    struct cairn_buf b = {0};
    re->code = NULL;
    if (tok_re_translate(pat, len, &b) || cairn_buf_put(&b, "", 0)) {
        cairn_buf_free(&b);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory compiling regex");
    }
    int ec;
    PCRE2_SIZE eo;
    re->code = pcre2_compile((PCRE2_SPTR)b.p, b.n, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
    cairn_buf_free(&b);
    if (!re->code) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(ec, msg, sizeof(msg));
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "bad regex at offset %zu: %s", (size_t)eo,
                             (const char *)msg);
    }
    pcre2_jit_compile(re->code, PCRE2_JIT_COMPLETE); /* falls back to the interpreter */
    return CAIRN_OK;
}

void tok_re_free(struct tok_re *re)
{
    if (re->code) pcre2_code_free(re->code);
    re->code = NULL;
}

int tok_re_next(const struct tok_re *re, pcre2_match_data *md, const char *s, size_t n,
                size_t start, size_t *ms, size_t *me)
{
    while (start <= n) {
        int rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
            rc = pcre2_match(re->code, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                             md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) return 0;
        if (rc < 0) return CAIRN_ERR_LIMIT;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] > ov[0]) {
            *ms = ov[0];
            *me = ov[1];
            return 1;
        }
        /* empty match: move one character on */
        if (ov[0] >= n) return 0;
        start = ov[0] + cairn_utf8_seq_len((uint8_t)s[ov[0]]);
    }
    return 0;
}

char *tok_strndup(const char *s, size_t n)
{
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

const char *tok_jstr(json_t *o, const char *key, size_t *len)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v)) return NULL;
    if (len) *len = json_string_length(v);
    return json_string_value(v);
}

int tok_jbool(json_t *o, const char *key, int dflt)
{
    json_t *v = json_object_get(o, key);
    if (json_is_boolean(v)) return json_is_true(v);
    return dflt;
}
