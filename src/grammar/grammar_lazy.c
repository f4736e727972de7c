/* Lazy grammars (see grammar.h, grammar_set_trigger): the trigger and its free-text automaton,
 * and the per-vocabulary cache of the tokens that can complete a trigger.
 *
 * DESIGN. Free text is followed by a small KMP automaton over the arm string, then the trigger
 * (gram_lz_step); the matcher (grammar_match.c) keeps one free state per history step and, while
 * free, needs to look only at the tokens that can complete the trigger from that state: those are
 * listed here once per (vocabulary, trigger, free state) by one pass over the vocabulary's
 * bytes, on first use, and kept with the vocabulary (a vocabulary serves every request of a
 * model, so the pass is paid once per model and trigger; lz_mu guards the list). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_int.h"

#define GRAM_LZ_MAX_KEYS 16 /* distinct triggers cached per vocabulary (Hermes, JSON, with arms) */

struct gram_lz_entry {
    struct gram_trigger key;  /* arm, trig, flags: what the lists depend on */
    int32_t **ids;            /* [n_free] candidate lists, NULL until computed */
    int *n;                   /* [n_free] */
};

struct gram_lz_cache {
    pthread_mutex_t mu;
    struct gram_lz_entry e[GRAM_LZ_MAX_KEYS];
    int n_e;
};

static void gram_lz_borders(const uint8_t *t, int n, uint8_t *fail)
{
    if (n) fail[0] = 0;
    for (int i = 1, k = 0; i < n; i++) {
        while (k > 0 && t[i] != t[k]) k = fail[k - 1];
        if (t[i] == t[k]) k++;
        fail[i] = (uint8_t)k;
    }
}

static int gram_lz_kmp(const uint8_t *t, const uint8_t *fail, int k, uint8_t b)
{
    while (k > 0 && t[k] != b) k = fail[k - 1];
    return t[k] == b ? k + 1 : 0;
}

int gram_lz_step(const struct gram_trigger *t, int f, uint8_t byte)
{
    if (f < t->n_arm) {
        int k = gram_lz_kmp(t->arm, t->arm_fail, f, byte);
        return k == t->n_arm ? t->n_arm : k;
    }
    if (f == t->n_free - 1) return f; /* free for good */
    int k = f - t->n_arm;
    if (t->flags & GRAMMAR_LAZY_AT_START) {
        if (k == 0 && (byte == ' ' || byte == '\n' || byte == '\t' || byte == '\r')) return f;
        if (byte != t->trig[k]) return t->n_free - 1;
        k++;
    } else {
        k = gram_lz_kmp(t->trig, t->trig_fail, k, byte);
    }
    return k == t->n_trig ? GRAM_LZ_TRIGGERED : t->n_arm + k;
}

int grammar_set_trigger(struct grammar *g, const char *arm, const char *trigger, unsigned flags, struct cairn_err *err)
{
    size_t na = arm ? strlen(arm) : 0, nt = trigger ? strlen(trigger) : 0;
    if (g->lazy) return cairn_err_set(err, CAIRN_ERR_INVALID, "grammar: the trigger is already set");
    if (nt == 0 || nt >= GRAMMAR_TRIGGER_MAX || na >= GRAMMAR_TRIGGER_MAX)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "grammar: a trigger of 1 to %d bytes (and an arm below that)",
                             GRAMMAR_TRIGGER_MAX - 1);
    struct gram_trigger *t = calloc(1, sizeof(*t));
    if (!t) return cairn_err_set(err, CAIRN_ERR_NOMEM, "grammar: out of memory");
    memcpy(t->arm, arm ? arm : "", na);
    memcpy(t->trig, trigger, nt);
    t->n_arm = (int)na;
    t->n_trig = (int)nt;
    t->n_free = t->n_arm + t->n_trig + 1;
    t->flags = flags;
    gram_lz_borders(t->arm, t->n_arm, t->arm_fail);
    gram_lz_borders(t->trig, t->n_trig, t->trig_fail);
    /* g's language must begin with the trigger: checked on a matcher without a vocabulary */
    struct grammar_matcher *m = NULL;
    int rc = grammar_matcher_create(g, NULL, &m, err);
    if (rc == CAIRN_OK) {
        int ok = grammar_matcher_try_bytes(m, t->trig, (size_t)t->n_trig);
        if (ok <= 0)
            rc = cairn_err_set(err, ok < 0 ? CAIRN_ERR_LIMIT : CAIRN_ERR_INVALID,
                               "grammar: the language does not begin with the trigger '%s'", trigger);
    }
    grammar_matcher_free(m);
    if (rc) {
        free(t);
        return rc;
    }
    g->lazy = t;
    return CAIRN_OK;
}

void gram_lz_cache_free(struct gram_lz_cache *c)
{
    if (!c) return;
    for (int i = 0; i < c->n_e; i++) {
        for (int f = 0; f < c->e[i].key.n_free; f++) free(c->e[i].ids[f]);
        free(c->e[i].ids);
        free(c->e[i].n);
    }
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int gram_lz_same(const struct gram_trigger *a, const struct gram_trigger *b)
{
    unsigned fa = a->flags & GRAMMAR_LAZY_AT_START, fb = b->flags & GRAMMAR_LAZY_AT_START; /* REPEAT: no matter */
    return a->n_arm == b->n_arm && a->n_trig == b->n_trig && fa == fb &&
           !memcmp(a->arm, b->arm, (size_t)a->n_arm) && !memcmp(a->trig, b->trig, (size_t)a->n_trig);
}

/* One pass over the vocabulary: the tokens that reach GRAM_LZ_TRIGGERED from f. */
static int gram_lz_scan(const struct grammar_vocab *v, const struct gram_trigger *t, int f, int32_t **ids, int *n)
{
    int cap = 16, k = 0;
    int32_t *out = malloc((size_t)cap * sizeof(int32_t));
    if (!out) return CAIRN_ERR_NOMEM;
    for (int id = 0; id < v->n_vocab; id++) {
        int s = f;
        for (int64_t i = v->tb_off[id]; i < v->tb_off[id + 1] && s >= 0; i++) s = gram_lz_step(t, s, v->tb[i]);
        if (s != GRAM_LZ_TRIGGERED) continue;
        if (k == cap) {
            int32_t *p = realloc(out, (size_t)cap * 2 * sizeof(int32_t));
            if (!p) {
                free(out);
                return CAIRN_ERR_NOMEM;
            }
            out = p;
            cap *= 2;
        }
        out[k++] = id;
    }
    *ids = out;
    *n = k;
    return CAIRN_OK;
}

static pthread_mutex_t gram_lz_create_mu = PTHREAD_MUTEX_INITIALIZER; /* makes v->lz once */

int gram_vocab_lz_cands(const struct grammar_vocab *v, const struct gram_trigger *t, int f, const int32_t **ids, int *n)
{
    struct grammar_vocab *mv = (struct grammar_vocab *)v; /* the cache is the one mutable part (see grammar_int.h) */
    pthread_mutex_lock(&gram_lz_create_mu);
    if (!mv->lz) {
        mv->lz = calloc(1, sizeof(*mv->lz));
        if (mv->lz) pthread_mutex_init(&mv->lz->mu, NULL);
    }
    pthread_mutex_unlock(&gram_lz_create_mu);
    struct gram_lz_cache *c = mv->lz;
    if (!c) return CAIRN_ERR_NOMEM;
    int rc = CAIRN_OK;
    pthread_mutex_lock(&c->mu);
    struct gram_lz_entry *e = NULL;
    for (int i = 0; i < c->n_e && !e; i++)
        if (gram_lz_same(&c->e[i].key, t)) e = &c->e[i];
    if (!e) {
        if (c->n_e == GRAM_LZ_MAX_KEYS) { /* the API's few envelopes never fill it; lists stay
                                            * while the vocabulary lives, so none is dropped */
            rc = CAIRN_ERR_LIMIT;
            goto out;
        }
        e = &c->e[c->n_e];
        e->key = *t;
        e->ids = calloc((size_t)t->n_free, sizeof(*e->ids));
        e->n = calloc((size_t)t->n_free, sizeof(int));
        if (!e->ids || !e->n) {
            free(e->ids);
            free(e->n);
            rc = CAIRN_ERR_NOMEM;
            goto out;
        }
        c->n_e++;
    }
    if (!e->ids[f]) rc = gram_lz_scan(v, t, f, &e->ids[f], &e->n[f]);
    if (rc == CAIRN_OK) {
        *ids = e->ids[f];
        *n = e->n[f];
    }
out:
    pthread_mutex_unlock(&c->mu);
    return rc;
}
