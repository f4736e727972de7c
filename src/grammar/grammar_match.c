/* The matcher: interned stack frames, interned sets of live stacks, the memoized byte step,
 * history / rollback, and the token-mask walk over the vocabulary trie (see grammar.h).
 *
 * DESIGN. A frame is (state, frame below), interned in `fh` so a stack is one int; frame 0 is the
 * bottom. A set is a sorted list of frames whose states have byte edges, plus an accepting flag
 * (some stack can end here), interned in `sh`. step(set, byte) moves every stack along its byte
 * edges and closes the result: call edges push (rule start over a return frame), final states
 * pop (the frame below continues at its return state). Each set keeps a 256-entry transition row
 * filled on demand, so walking the trie is mostly one load per edge. Sets are never freed while
 * the matcher lives (history and caches refer to them); GM_MAX_SETS / GM_MAX_FRAMES bound the
 * memory of one matcher, after which it answers CAIRN_ERR_LIMIT.
 *
 * Lazy grammars (grammar_set_trigger): each history step also keeps a free state (hf, -1 inside
 * the grammar). Free text moves only the trigger automaton (gram_lz_step); the trigger's last
 * byte enters the grammar at trig_set (the start set after the trigger's bytes); a REPEAT
 * sentence's end (a set with no byte edges) goes back to free. While free, only the tokens that
 * can complete the trigger (gram_vocab_lz_cands) are tried: none rejected means no mask at all
 * (f_res), otherwise a mask of all tokens but those, cached per free state. */
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

/* Per-matcher caps: sets (with their 1 KiB transition rows) and frames are the memory; about
 * 80 MiB at most, far above what the schemas here use (a few thousand sets). */
#define GM_MAX_FRAMES (1 << 20)
#define GM_MAX_SETS (1 << 16)
#define GM_MAX_CONFIGS (1 << 22)
#define GM_MAX_MASKS 64
#define GM_UNKNOWN (-2)
#define GM_DEAD (-1)
#define GM_FAIL (-3)
#define GM_AFTER_EOS (-4)   /* history entry after an accepted eos */
#define GM_STRLIKE_MAX_PAIRS 64

struct gm_frame {
    int32_t state, below, depth;
};

struct gm_set {
    uint32_t off, n;     /* configs[off .. off + n) */
    uint32_t hash;
    uint8_t accepting;
    uint8_t strlike;     /* 0 unknown, 1 inside a JSON string (gm_strlike), 2 not */
    int32_t mask;        /* index into masks, -1 */
    int32_t mask_count;
    int32_t *trans;      /* [256] or NULL */
};

struct grammar_matcher {
    struct grammar *g;
    const struct grammar_vocab *v;
    struct gm_frame *fr;
    int n_fr, cap_fr;
    int32_t *fh;         /* frame hash: ids, -1 empty */
    uint32_t fh_mask;
    struct gm_set *sets;
    int n_sets, cap_sets;
    int32_t *sh;
    uint32_t sh_mask;
    int32_t *cfg;        /* set members */
    size_t n_cfg, cap_cfg;
    uint32_t **masks;
    int n_masks;
    int32_t *hist;       /* [n_hist + 1]: hist[n_hist] is the current set */
    int n_hist, cap_hist;
    /* closure scratch */
    int32_t *work, *out, *seen;
    int cap_work, cap_out, cap_seen;
    int32_t stamp;
    int32_t *walk;       /* [max_depth + 1] trie walk sets by depth */
    int failed;
    /* lazy grammars only */
    const struct gram_trigger *lz; /* g->lazy or NULL */
    int32_t *hf;         /* [cap_hf] free state per history step, -1: in the grammar */
    int cap_hf;
    int32_t trig_set;    /* the set after the trigger's bytes from the start */
    int8_t *f_res;       /* [n_free] 0 unknown, 1 no mask needed, 2 f_masks[f] */
    uint32_t **f_masks;  /* [n_free] all tokens but the rejected trigger completions */
    int32_t *f_count;    /* [n_free] tokens allowed by f_masks[f] */
};

static uint32_t gm_mix(uint32_t h, uint32_t x)
{
    h ^= x * 0x9e3779b1u;
    h = (h << 13) | (h >> 19);
    return h * 5 + 0xe6546b64u;
}

static int gm_grow(void **p, int *cap, int need, size_t elem)
{
    if (need <= *cap) return 0;
    int c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * elem);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

static int gm_rehash(int32_t **tab, uint32_t *mask, uint32_t n_items, uint32_t (*hash)(struct grammar_matcher *, int32_t),
                     struct grammar_matcher *m)
{
    uint32_t size = (*mask + 1) * 2;
    while (size < n_items * 2) size *= 2;
    int32_t *t = malloc(size * sizeof(int32_t));
    if (!t) return -1;
    memset(t, 0xff, size * sizeof(int32_t));
    for (uint32_t i = 0; i <= *mask; i++) {
        int32_t id = (*tab)[i];
        if (id < 0) continue;
        uint32_t h = hash(m, id) & (size - 1);
        while (t[h] >= 0) h = (h + 1) & (size - 1);
        t[h] = id;
    }
    free(*tab);
    *tab = t;
    *mask = size - 1;
    return 0;
}

static uint32_t gm_frame_hash_of(int32_t state, int32_t below) { return gm_mix(gm_mix(0x12345u, (uint32_t)state), (uint32_t)below); }

static uint32_t gm_frame_hash(struct grammar_matcher *m, int32_t id)
{
    return gm_frame_hash_of(m->fr[id].state, m->fr[id].below);
}

static uint32_t gm_set_hash(struct grammar_matcher *m, int32_t id) { return m->sets[id].hash; }

/* Interned frame (state, below); GM_FAIL when out of room, GM_DEAD when too deep. */
static int32_t gm_frame(struct grammar_matcher *m, int32_t state, int32_t below)
{
    uint32_t h = gm_frame_hash_of(state, below) & m->fh_mask;
    for (;;) {
        int32_t id = m->fh[h];
        if (id < 0) break;
        if (m->fr[id].state == state && m->fr[id].below == below) return id;
        h = (h + 1) & m->fh_mask;
    }
    int depth = m->fr[below].depth + 1;
    if (depth > GRAM_MAX_DEPTH) return GM_DEAD;
    if (m->n_fr >= GM_MAX_FRAMES || gm_grow((void **)&m->fr, &m->cap_fr, m->n_fr + 1, sizeof(*m->fr)) ||
        gm_grow((void **)&m->seen, &m->cap_seen, m->n_fr + 1, sizeof(int32_t)))
        return GM_FAIL;
    int32_t id = m->n_fr++;
    m->fr[id] = (struct gm_frame){state, below, depth};
    m->seen[id] = 0;
    m->fh[h] = id;
    if ((uint32_t)m->n_fr * 2 > m->fh_mask && gm_rehash(&m->fh, &m->fh_mask, (uint32_t)m->n_fr, gm_frame_hash, m))
        return GM_FAIL;
    return id;
}

static int gm_cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return x < y ? -1 : x > y;
}

/* Interns the set out[0..n) (sorted) with the accepting flag. */
static int32_t gm_set(struct grammar_matcher *m, const int32_t *c, int n, int accepting)
{
    uint32_t hv = gm_mix(0x51u, (uint32_t)accepting);
    for (int i = 0; i < n; i++) hv = gm_mix(hv, (uint32_t)c[i]);
    uint32_t h = hv & m->sh_mask;
    for (;;) {
        int32_t id = m->sh[h];
        if (id < 0) break;
        const struct gm_set *s = &m->sets[id];
        if (s->hash == hv && (int)s->n == n && s->accepting == accepting &&
            (n == 0 || !memcmp(m->cfg + s->off, c, (size_t)n * sizeof(int32_t))))
            return id;
        h = (h + 1) & m->sh_mask;
    }
    if (m->n_sets >= GM_MAX_SETS || m->n_cfg + (size_t)n > GM_MAX_CONFIGS ||
        gm_grow((void **)&m->sets, &m->cap_sets, m->n_sets + 1, sizeof(*m->sets)))
        return GM_FAIL;
    if (m->n_cfg + (size_t)n > m->cap_cfg) {
        size_t cap = m->cap_cfg ? m->cap_cfg : 1024;
        while (cap < m->n_cfg + (size_t)n) cap *= 2;
        int32_t *p = realloc(m->cfg, cap * sizeof(int32_t));
        if (!p) return GM_FAIL;
        m->cfg = p;
        m->cap_cfg = cap;
    }
    if (n) memcpy(m->cfg + m->n_cfg, c, (size_t)n * sizeof(int32_t));
    int32_t id = m->n_sets++;
    struct gm_set *s = &m->sets[id];
    memset(s, 0, sizeof(*s));
    s->off = (uint32_t)m->n_cfg;
    s->n = (uint32_t)n;
    s->hash = hv;
    s->accepting = (uint8_t)accepting;
    s->mask = -1;
    m->n_cfg += (size_t)n;
    m->sh[h] = id;
    if ((uint32_t)m->n_sets * 2 > m->sh_mask && gm_rehash(&m->sh, &m->sh_mask, (uint32_t)m->n_sets, gm_set_hash, m))
        return GM_FAIL;
    return id;
}

static int gm_push(struct grammar_matcher *m, int32_t **arr, int *cap, int n, int32_t x)
{
    (void)m;
    if (gm_grow((void **)arr, cap, n + 1, sizeof(int32_t))) return -1;
    (*arr)[n] = x;
    return 0;
}

/* Closes the frames in m->work[0..n_work) into a set id (GM_DEAD if empty, GM_FAIL). */
static int32_t gm_close(struct grammar_matcher *m, int n_work)
{
    const struct grammar *g = m->g;
    int32_t stamp = ++m->stamp;
    int n_out = 0, accepting = 0;
    while (n_work) {
        int32_t c = m->work[--n_work];
        if (m->seen[c] == stamp) continue;
        m->seen[c] = stamp;
        int32_t q = m->fr[c].state, below = m->fr[c].below;
        if (g->be_off[q + 1] > g->be_off[q]) {
            if (gm_push(m, &m->out, &m->cap_out, n_out, c)) return GM_FAIL;
            n_out++;
        }
        for (int i = g->ce_off[q]; i < g->ce_off[q + 1]; i++) {
            int32_t ret = gm_frame(m, g->ce[i].ret, below);
            if (ret == GM_FAIL) return GM_FAIL;
            if (ret == GM_DEAD) continue;
            int32_t nc = gm_frame(m, g->rule_start[g->ce[i].rule], ret);
            if (nc == GM_FAIL) return GM_FAIL;
            if (nc == GM_DEAD) continue;
            if (gm_push(m, &m->work, &m->cap_work, n_work, nc)) return GM_FAIL;
            n_work++;
        }
        if (g->final[q]) {
            if (below == 0) accepting = 1;
            else {
                if (gm_push(m, &m->work, &m->cap_work, n_work, below)) return GM_FAIL;
                n_work++;
            }
        }
    }
    if (n_out == 0 && !accepting) return GM_DEAD;
    if (n_out > 1) qsort(m->out, (size_t)n_out, sizeof(int32_t), gm_cmp_i32);
    return gm_set(m, m->out, n_out, accepting);
}

/* The set after `byte` from set s: GM_DEAD, GM_FAIL or a set id. */
static int32_t gm_step(struct grammar_matcher *m, int32_t s, uint8_t byte)
{
    struct gm_set *st = &m->sets[s];
    if (st->trans && st->trans[byte] != GM_UNKNOWN) return st->trans[byte];
    const struct grammar *g = m->g;
    int n_work = 0;
    for (uint32_t k = 0; k < st->n; k++) {
        int32_t c = m->cfg[st->off + k];
        int32_t q = m->fr[c].state, below = m->fr[c].below;
        for (int i = g->be_off[q]; i < g->be_off[q + 1]; i++) {
            const struct gram_edge *e = &g->be[i];
            if (e->lo > byte) break;
            if (e->hi < byte) continue;
            int32_t nc = gm_frame(m, e->to, below);
            if (nc == GM_FAIL) return GM_FAIL;
            if (nc == GM_DEAD) continue;
            if (gm_push(m, &m->work, &m->cap_work, n_work, nc)) return GM_FAIL;
            n_work++;
        }
    }
    int32_t r = n_work ? gm_close(m, n_work) : GM_DEAD;
    if (r == GM_FAIL) return r;
    st = &m->sets[s]; /* sets may have moved */
    if (!st->trans) {
        st->trans = malloc(256 * sizeof(int32_t));
        if (!st->trans) return GM_FAIL;
        for (int i = 0; i < 256; i++) st->trans[i] = GM_UNKNOWN;
    }
    st->trans[byte] = r;
    return r;
}

int grammar_matcher_create(struct grammar *g, const struct grammar_vocab *v, struct grammar_matcher **out,
                           struct cairn_err *err)
{
    *out = NULL;
    struct grammar_matcher *m = calloc(1, sizeof(*m));
    if (!m) return cairn_err_set(err, CAIRN_ERR_NOMEM, "grammar: out of memory");
    m->g = grammar_retain(g);
    m->v = v;
    m->fh_mask = 1023;
    m->sh_mask = 1023;
    m->fh = malloc(1024 * sizeof(int32_t));
    m->sh = malloc(1024 * sizeof(int32_t));
    m->walk = malloc(((size_t)(v ? v->max_depth : 0) + 2) * sizeof(int32_t));
    int rc = CAIRN_OK;
    if (!m->fh || !m->sh || !m->walk || gm_grow((void **)&m->fr, &m->cap_fr, 1, sizeof(*m->fr)) ||
        gm_grow((void **)&m->seen, &m->cap_seen, 1, sizeof(int32_t)) ||
        gm_grow((void **)&m->hist, &m->cap_hist, 1, sizeof(int32_t))) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "grammar: out of memory");
        goto fail;
    }
    memset(m->fh, 0xff, 1024 * sizeof(int32_t));
    memset(m->sh, 0xff, 1024 * sizeof(int32_t));
    m->fr[0] = (struct gm_frame){-1, 0, 0}; /* bottom */
    m->seen[0] = 0;
    m->n_fr = 1;
    int32_t f0 = gm_frame(m, g->rule_start[0], 0);
    int32_t s0 = GM_FAIL;
    if (f0 >= 0 && !gm_push(m, &m->work, &m->cap_work, 0, f0)) s0 = gm_close(m, 1);
    if (s0 < 0) {
        rc = s0 == GM_DEAD ? cairn_err_set(err, CAIRN_ERR_INVALID, "grammar: the language is empty")
                           : cairn_err_set(err, CAIRN_ERR_NOMEM, "grammar: out of memory");
        goto fail;
    }
    m->hist[0] = s0;
    if (g->lazy) {
        m->lz = g->lazy;
        m->hf = malloc((size_t)m->cap_hist * sizeof(int32_t));
        m->cap_hf = m->cap_hist;
        m->f_res = calloc((size_t)m->lz->n_free, 1);
        m->f_masks = calloc((size_t)m->lz->n_free, sizeof(*m->f_masks));
        m->f_count = calloc((size_t)m->lz->n_free, sizeof(int32_t));
        m->trig_set = s0;
        for (int i = 0; i < m->lz->n_trig && m->trig_set >= 0; i++) m->trig_set = gm_step(m, m->trig_set, m->lz->trig[i]);
        if (!m->hf || !m->f_res || !m->f_masks || !m->f_count || m->trig_set < 0) {
            rc = m->trig_set == GM_DEAD ? cairn_err_set(err, CAIRN_ERR_INVALID, "grammar: the trigger does not start the language")
                                        : cairn_err_set(err, CAIRN_ERR_NOMEM, "grammar: out of memory");
            goto fail;
        }
        m->hf[0] = 0;
    }
    *out = m;
    return CAIRN_OK;
fail:
    grammar_matcher_free(m);
    return rc;
}

void grammar_matcher_free(struct grammar_matcher *m)
{
    if (!m) return;
    for (int i = 0; i < m->n_sets; i++) free(m->sets[i].trans);
    for (int i = 0; i < m->n_masks; i++) free(m->masks[i]);
    free(m->masks);
    free(m->sets);
    free(m->sh);
    free(m->cfg);
    free(m->fr);
    free(m->fh);
    free(m->hist);
    free(m->work);
    free(m->out);
    free(m->seen);
    free(m->walk);
    free(m->hf);
    if (m->f_masks)
        for (int i = 0; i < m->lz->n_free; i++) free(m->f_masks[i]);
    free(m->f_masks);
    free(m->f_count);
    free(m->f_res);
    grammar_free(m->g);
    free(m);
}

static int gm_cur(const struct grammar_matcher *m) { return m->hist[m->n_hist]; }

static int gm_cur_f(const struct grammar_matcher *m) { return m->hf ? m->hf[m->n_hist] : -1; }

static int gm_push_hist(struct grammar_matcher *m, int32_t s, int32_t f)
{
    if (gm_grow((void **)&m->hist, &m->cap_hist, m->n_hist + 2, sizeof(int32_t))) return CAIRN_ERR_NOMEM;
    if (m->hf && gm_grow((void **)&m->hf, &m->cap_hf, m->n_hist + 2, sizeof(int32_t))) return CAIRN_ERR_NOMEM;
    m->hist[++m->n_hist] = s;
    if (m->hf) m->hf[m->n_hist] = f;
    return CAIRN_OK;
}

/* Lazy: runs bytes from (free state *f, set *s); 0, GM_DEAD or GM_FAIL. */
static int32_t gm_lazy_run(struct grammar_matcher *m, int32_t *f, int32_t *s, const uint8_t *b, size_t n)
{
    const struct gram_trigger *t = m->lz;
    if (*s == GM_AFTER_EOS) return n ? GM_DEAD : 0;
    for (size_t i = 0; i < n; i++) {
        if (*f >= 0) {
            int nf = gram_lz_step(t, *f, b[i]);
            if (nf != GRAM_LZ_TRIGGERED) {
                *f = nf;
                continue;
            }
            *f = -1;
            *s = m->trig_set;
        } else {
            int32_t ns = gm_step(m, *s, b[i]);
            if (ns < 0) return ns;
            *s = ns;
        }
        if ((t->flags & GRAMMAR_LAZY_REPEAT) && m->sets[*s].n == 0) *f = t->n_arm; /* the sentence ended */
    }
    return 0;
}

/* Runs bytes from the current set: the set after them, GM_DEAD or GM_FAIL. */
static int32_t gm_run(struct grammar_matcher *m, const uint8_t *b, size_t n)
{
    int32_t s = gm_cur(m);
    if (s == GM_AFTER_EOS) return n ? GM_DEAD : s;
    for (size_t i = 0; i < n && s >= 0; i++) s = gm_step(m, s, b[i]);
    return s;
}

int grammar_matcher_try_bytes(struct grammar_matcher *m, const uint8_t *b, size_t n)
{
    if (m->lz) {
        int32_t f = gm_cur_f(m), s = gm_cur(m), r = gm_lazy_run(m, &f, &s, b, n);
        return r == GM_FAIL ? CAIRN_ERR_LIMIT : r != GM_DEAD;
    }
    int32_t s = gm_run(m, b, n);
    return s == GM_FAIL ? CAIRN_ERR_LIMIT : s != GM_DEAD;
}

int grammar_matcher_accept_bytes(struct grammar_matcher *m, const uint8_t *b, size_t n)
{
    if (m->lz) {
        int32_t f = gm_cur_f(m), s = gm_cur(m), r = gm_lazy_run(m, &f, &s, b, n);
        if (r == GM_FAIL) return CAIRN_ERR_LIMIT;
        if (r == GM_DEAD) return CAIRN_ERR_INVALID;
        return gm_push_hist(m, s, f);
    }
    int32_t s = gm_run(m, b, n);
    if (s == GM_FAIL) return CAIRN_ERR_LIMIT;
    if (s == GM_DEAD) return CAIRN_ERR_INVALID;
    return gm_push_hist(m, s, -1);
}

static int gm_is_eos(const struct grammar_vocab *v, int32_t id)
{
    for (int i = 0; i < v->n_eos; i++)
        if (v->eos[i] == id) return 1;
    return 0;
}

int grammar_matcher_accept_token(struct grammar_matcher *m, int32_t id)
{
    const struct grammar_vocab *v = m->v;
    if (!v || id < 0 || id >= v->n_vocab) return CAIRN_ERR_INVALID;
    if (gm_is_eos(v, id)) {
        if (!grammar_matcher_accepting(m)) return CAIRN_ERR_INVALID;
        return gm_push_hist(m, GM_AFTER_EOS, -1);
    }
    size_t n = (size_t)(v->tb_off[id + 1] - v->tb_off[id]);
    if (n == 0) { /* no bytes (a special token): free text takes it as it is, a grammar never */
        if (gm_cur_f(m) < 0) return CAIRN_ERR_INVALID;
        return gm_push_hist(m, gm_cur(m), gm_cur_f(m));
    }
    return grammar_matcher_accept_bytes(m, v->tb + v->tb_off[id], n);
}

int grammar_matcher_rollback(struct grammar_matcher *m, int n)
{
    if (n < 0 || n > m->n_hist) return CAIRN_ERR_INVALID;
    m->n_hist -= n;
    return CAIRN_OK;
}

int grammar_matcher_n_steps(const struct grammar_matcher *m) { return m->n_hist; }

int grammar_matcher_accepting(const struct grammar_matcher *m)
{
    int32_t s = gm_cur(m);
    if (s != GM_AFTER_EOS && gm_cur_f(m) >= 0) return 1; /* free text may end anywhere */
    return s >= 0 && m->sets[s].accepting;
}

int grammar_matcher_finished(const struct grammar_matcher *m)
{
    int32_t s = gm_cur(m);
    if (s != GM_AFTER_EOS && gm_cur_f(m) >= 0) return 0;
    return s == GM_AFTER_EOS || (s >= 0 && m->sets[s].n == 0);
}

/* ---- masks ---- */

/* 1 if set s behaves as the inside of an unbounded JSON string: every clean character (see
 * gram_u8_next) leads back to s, and every valid unfinished one stays alive. Checked by walking
 * the product of the sets and the UTF-8 DFA over all bytes; computed once per set. <0: error. */
static int gm_strlike(struct grammar_matcher *m, int32_t s)
{
    if (m->sets[s].strlike) return m->sets[s].strlike == 1;
    int32_t ps[GM_STRLIKE_MAX_PAIRS];
    uint8_t pu[GM_STRLIKE_MAX_PAIRS];
    int n = 0, ok = 1;
    ps[n] = s;
    pu[n++] = 0;
    for (int k = 0; k < n && ok; k++) {
        for (int b = 0; b < 256 && ok; b++) {
            uint8_t u = gram_u8_next(pu[k], (uint8_t)b);
            if (u == GRAM_U8_BAD) continue;
            int32_t t = gm_step(m, ps[k], (uint8_t)b);
            if (t == GM_FAIL) return -1;
            if (t == GM_DEAD) ok = 0;
            else if (u == 0) ok = t == s;
            else {
                int seen = 0;
                for (int j = 0; j < n && !seen; j++) seen = ps[j] == t && pu[j] == u;
                if (!seen) {
                    if (n == GM_STRLIKE_MAX_PAIRS) ok = 0;
                    else {
                        ps[n] = t;
                        pu[n++] = u;
                    }
                }
            }
        }
    }
    m->sets[s].strlike = ok ? 1 : 2;
    return ok;
}

static void gm_set_bits(uint32_t *mask, const int32_t *ids, int32_t lo, int32_t hi)
{
    for (int32_t k = lo; k < hi; k++) mask[ids[k] >> 5] |= 1u << (ids[k] & 31);
}

/* Lazy, free state f: tries the tokens that can complete the trigger from f (f_res). */
static int gm_free_res(struct grammar_matcher *m, int f)
{
    if (m->f_res[f]) return CAIRN_OK;
    const struct grammar_vocab *v = m->v;
    const int32_t *ids;
    int n, count = v->n_vocab;
    int rc = gram_vocab_lz_cands(v, m->lz, f, &ids, &n);
    if (rc) return rc;
    uint32_t *mk = NULL;
    size_t n_words = ((size_t)v->n_vocab + 31) / 32;
    for (int k = 0; k < n; k++) {
        int32_t id = ids[k], ff = f, ss = m->hist[0];
        int32_t r = gm_lazy_run(m, &ff, &ss, v->tb + v->tb_off[id], (size_t)(v->tb_off[id + 1] - v->tb_off[id]));
        if (r == GM_FAIL) {
            free(mk);
            return CAIRN_ERR_LIMIT;
        }
        if (r != GM_DEAD) continue;
        if (!mk) {
            if (!(mk = malloc(n_words * sizeof(uint32_t)))) return CAIRN_ERR_NOMEM;
            memset(mk, 0xff, n_words * sizeof(uint32_t));
            if (v->n_vocab % 32) mk[n_words - 1] = (1u << (v->n_vocab % 32)) - 1;
        }
        mk[id >> 5] &= ~(1u << (id & 31));
        count--;
    }
    m->f_masks[f] = mk;
    m->f_count[f] = count;
    m->f_res[f] = mk ? 2 : 1;
    return CAIRN_OK;
}

int grammar_matcher_unconstrained(struct grammar_matcher *m)
{
    int f = gm_cur_f(m);
    if (!m->lz || !m->v || f < 0 || gm_cur(m) == GM_AFTER_EOS) return 0;
    int rc = gm_free_res(m, f);
    if (rc) return rc;
    return m->f_res[f] == 1;
}

int grammar_matcher_fill_mask(struct grammar_matcher *m, uint32_t *mask)
{
    const struct grammar_vocab *v = m->v;
    if (!v) return CAIRN_ERR_INVALID;
    size_t n_words = ((size_t)v->n_vocab + 31) / 32;
    int32_t s0 = gm_cur(m);
    memset(mask, 0, n_words * sizeof(uint32_t));
    if (s0 == GM_AFTER_EOS) return 0;
    int f = gm_cur_f(m);
    if (f >= 0) { /* lazy, free text */
        int rc = gm_free_res(m, f);
        if (rc) return rc;
        if (m->f_res[f] == 2) {
            memcpy(mask, m->f_masks[f], n_words * sizeof(uint32_t));
        } else {
            memset(mask, 0xff, n_words * sizeof(uint32_t));
            if (v->n_vocab % 32) mask[n_words - 1] = (1u << (v->n_vocab % 32)) - 1;
        }
        return m->f_count[f];
    }
    int repeat = m->lz && (m->lz->flags & GRAMMAR_LAZY_REPEAT);
    if (m->sets[s0].mask >= 0) {
        memcpy(mask, m->masks[m->sets[s0].mask], n_words * sizeof(uint32_t));
        return m->sets[s0].mask_count;
    }
    if (m->sets[s0].accepting)
        for (size_t w = 0; w < n_words; w++) mask[w] |= v->eos_mask[w];
    if (m->sets[s0].n) {
        int32_t *walk = m->walk;
        walk[0] = s0;
        for (int32_t i = 1; i < v->n_nodes;) {
            int d = v->depth[i];
            int32_t ns = gm_step(m, walk[d - 1], v->byte[i]);
            if (ns == GM_FAIL) return CAIRN_ERR_LIMIT;
            if (ns == GM_DEAD) {
                i = v->end[i];
                continue;
            }
            walk[d] = ns;
            gm_set_bits(mask, v->ids, v->tok_lo[i], v->tok_mid[i]);
            if (repeat && m->sets[ns].n == 0) { /* the sentence ends here: free text below */
                for (int32_t k = v->tok_mid[i]; k < v->tok_hi[i]; k++) {
                    int32_t id = v->ids[k], ff = m->lz->n_arm, ss = ns;
                    int64_t at = v->tb_off[id] + d;
                    int32_t r = gm_lazy_run(m, &ff, &ss, v->tb + at, (size_t)(v->tb_off[id + 1] - at));
                    if (r == GM_FAIL) return CAIRN_ERR_LIMIT;
                    if (r == 0) mask[id >> 5] |= 1u << (id & 31);
                }
                i = v->end[i];
                continue;
            }
            if (v->sclean[i] && m->sets[ns].n) {
                int sl = gm_strlike(m, ns);
                if (sl < 0) return CAIRN_ERR_LIMIT;
                if (sl) { /* inside a string and only clean text below: the whole subtree */
                    gm_set_bits(mask, v->ids, v->tok_mid[i], v->tok_hi[i]);
                    i = v->end[i];
                    continue;
                }
            }
            i++;
        }
    }
    int count = 0;
    for (size_t w = 0; w < n_words; w++) count += __builtin_popcount(mask[w]);
    if (m->n_masks < GM_MAX_MASKS) {
        uint32_t *copy = malloc(n_words * sizeof(uint32_t));
        uint32_t **p = copy ? realloc(m->masks, ((size_t)m->n_masks + 1) * sizeof(*p)) : NULL;
        if (p) {
            m->masks = p;
            memcpy(copy, mask, n_words * sizeof(uint32_t));
            m->masks[m->n_masks] = copy;
            m->sets[s0].mask = m->n_masks++;
            m->sets[s0].mask_count = count;
        } else {
            free(copy);
        }
    }
    return count;
}
