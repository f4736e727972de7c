/* Grammar-constrained requests in the engine (synthetic model through engine_create_ops): the
 * output of a constrained request matches its regex (checked by PCRE2), greedy and sampled; an
 * unconstrained request batched with constrained ones (a lazy one too) gets exactly the tokens it
 * gets alone; a lazy grammar's calls come out in their constrained form; a
 * completed grammar ends the request even with ignore_eos; a grammar without a vocabulary is
 * refused at submit. With speculation (a scripted drafter: the reference continuation with
 * some tokens wrong, many of them ones the grammar rejects) the constrained requests give
 * exactly their tokens without it, greedy and seeded sampled, and a drafter whose every token
 * the grammar rejects has all its drafts cut before verification. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "engine/engine.h"
#include "engine_testutil.h"
#include "grammar/grammar.h"
#include "testlib.h"

#define GV 40 /* vocab: 0..25 letters, 26..38 multi-letter pieces, 39 eos */
#define GEOS 39

static const char *gv_piece[GV] = {
    "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q", "r", "s", "t",
    "u", "v", "w", "x", "y", "z", "ab", "abc", "xx", "xyz", "ca", "ba", "-", "--", "0", "12", "9", "a-", NULL, NULL};

struct gfake {
    struct model_info info;
};

static const struct model_info *gfake_info(void *ctx) { return &((struct gfake *)ctx)->info; }

/* logits from a hash of (position, last token): any batch gives the same rows */
static int gfake_forward(void *ctx, struct kv_pool *kv, const struct model_seq *seqs, int n_seqs, struct cairn_err *err)
{
    for (int si = 0; si < n_seqs; si++) {
        const struct model_seq *s = &seqs[si];
        for (int r = 0; r < s->n_logits; r++) {
            int i = s->n_tokens - s->n_logits + r;
            uint64_t h = ((uint64_t)(s->pos0 + i) * 0x9e3779b97f4a7c15ull) ^ (uint64_t)(s->tokens[i] + 7) * 0xbf58476d1ce4e5b9ull;
            float *lg = s->logits + (size_t)r * GV;
            for (int j = 0; j < GV; j++) {
                h ^= h >> 29;
                h *= 0x94d049bb133111ebull;
                lg[j] = (float)((h >> 40) % 1000) / 100.0f;
            }
        }
    }
    return CAIRN_OK;
}

static void *gd_new(void *ctx) { return calloc(1, 8); }
static int gd_feed(void *stream, int32_t id, const char **text, size_t *len)
{
    *text = id >= 0 && id < GV && gv_piece[id] ? gv_piece[id] : "";
    *len = strlen(*text);
    return 0;
}
static int gd_flush(void *stream, const char **text, size_t *len)
{
    *text = "";
    *len = 0;
    return 0;
}
static void gd_free(void *stream) { free(stream); }

static int pcre_full(const char *pat, const char *s)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "^(?:%s)$", pat);
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *c = pcre2_compile((PCRE2_SPTR)buf, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_DOLLAR_ENDONLY, &ec, &eo, NULL);
    if (!c) return -1;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(c, NULL);
    int rc = pcre2_match(c, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL);
    pcre2_match_data_free(md);
    pcre2_code_free(c);
    return rc >= 0;
}

/* The scripted drafter: the reference continuation of whichever constrained output the
 * generated tokens so far are a prefix of, with about one token in five replaced by the next
 * vocabulary id (mostly one the grammar rejects there); `only_bad` drafts 'z' throughout, which
 * no pattern of spec_check allows. */
static struct gscript {
    const struct collect *ref;
    int n, n_prompt, only_bad;
} gscript;

static int gscript_draft(void *ctx, const int32_t *tokens, int n_tokens, int max_k, int32_t *out)
{
    struct gscript *sc = ctx;
    int g = n_tokens - sc->n_prompt;
    if (sc->only_bad) {
        for (int j = 0; j < max_k; j++) out[j] = 25; /* "z" */
        return max_k;
    }
    for (int r = 0; r < sc->n; r++) {
        const struct collect *c = &sc->ref[r];
        if (c->n_tokens <= g || memcmp(c->tokens, tokens + sc->n_prompt, sizeof(int32_t) * (size_t)g) != 0) continue;
        for (int j = 0; j < max_k; j++) {
            out[j] = c->tokens[CAIRN_MIN(g + j, c->n_tokens - 1)];
            if ((n_tokens * 7 + j * 3) % 5 == 0) out[j] = (out[j] + 1) % GV;
        }
        return max_k;
    }
    return 0;
}

/* Two regex-constrained requests per pattern (greedy; sampled with a seed) on engine e, into cs. */
static void spec_submit(struct engine *e, struct grammar_vocab *v, struct collect *cs, const int32_t *prompt)
{
    static const char *pats[] = {"(ab|c)+x{2}", "[a-e]{3,6}-[0-9]{1,3}", "(ca|ab)+-(ba)*9"};
    struct cairn_err err = {0};
    for (int k = 0; k < 3; k++) {
        struct grammar *g;
        CHECK(grammar_from_regex(pats[k], strlen(pats[k]), &g, NULL) == CAIRN_OK);
        for (int smp = 0; smp < 2; smp++) {
            struct engine_request r = collect_request(&cs[k * 2 + smp], prompt, 4, 40);
            r.grammar = g;
            r.grammar_vocab = v;
            if (smp) {
                r.sampling.temperature = 1.0f;
                r.sampling.seed = 21 + (uint64_t)k;
                r.sampling.has_seed = 1;
            }
            CHECK_MSG(engine_submit(e, &r, NULL, &err) == CAIRN_OK, "%s", err.msg);
        }
        grammar_free(g);
    }
    CHECK(collect_wait(cs, 6));
}

static void spec_check(const struct engine_model_ops *ops, const struct engine_opts *base, struct grammar_vocab *v)
{
    int32_t prompt[4] = {1, 2, 3, 4};
    struct cairn_err err = {0};
    struct engine *e0 = NULL, *e1 = NULL;
    CHECK(engine_create_ops(ops, base, &e0, &err) == CAIRN_OK);
    if (!e0) return;
    static struct collect ref[6], got[6], bad[6];
    spec_submit(e0, v, ref, prompt);
    engine_destroy(e0);

    struct engine_opts o = *base;
    o.speculative = ENGINE_SPEC_NGRAM;
    o.spec_cost_slope = 0.05; /* fixed: which steps draft must not depend on timings */
    o.drafter = (struct engine_drafter){.ctx = &gscript, .draft = gscript_draft};
    gscript = (struct gscript){.ref = ref, .n = 6, .n_prompt = 4};
    CHECK(engine_create_ops(ops, &o, &e1, &err) == CAIRN_OK);
    if (!e1) return;
    spec_submit(e1, v, got, prompt);
    struct engine_stats st;
    engine_get_stats(e1, &st);
    for (int i = 0; i < 6; i++) {
        CHECK_MSG(got[i].n_tokens == ref[i].n_tokens && got[i].finish == ref[i].finish &&
                      memcmp(got[i].tokens, ref[i].tokens, sizeof(int32_t) * (size_t)ref[i].n_tokens) == 0,
                  "request %d: '%s' with speculation, '%s' without", i, got[i].text, ref[i].text);
    }
    printf("grammar + speculation: %llu drafted, %llu accepted in %llu verify steps\n",
           (unsigned long long)st.n_spec_drafted, (unsigned long long)st.n_spec_accepted,
           (unsigned long long)st.n_spec_steps);
    CHECK(st.n_spec_accepted > 0 && st.n_spec_accepted < st.n_spec_drafted);
    engine_destroy(e1);

    /* every draft token rejected by the grammar: cut before verification, none verified */
    gscript.only_bad = 1;
    CHECK(engine_create_ops(ops, &o, &e1, &err) == CAIRN_OK);
    if (!e1) return;
    spec_submit(e1, v, bad, prompt);
    engine_get_stats(e1, &st);
    CHECK_EQ_INT((int)st.n_spec_drafted, 0);
    for (int i = 0; i < 6; i++)
        CHECK(bad[i].n_tokens == ref[i].n_tokens &&
              memcmp(bad[i].tokens, ref[i].tokens, sizeof(int32_t) * (size_t)ref[i].n_tokens) == 0);
    engine_destroy(e1);
}

int main(void)
{
    struct gfake f;
    memset(&f, 0, sizeof(f));
    f.info.arch = MODEL_ARCH_LLAMA;
    snprintf(f.info.model_type, sizeof(f.info.model_type), "fake");
    f.info.vocab_size = GV;
    f.info.n_layers = 1;
    f.info.n_kv_layers = 1;
    f.info.n_heads = 1;
    f.info.n_kv_heads = 1;
    f.info.head_dim = 2;
    f.info.max_position = 256;
    f.info.bos_id = -1;
    f.info.eos_ids[0] = GEOS;
    f.info.n_eos = 1;
    struct engine_opts o;
    memset(&o, 0, sizeof(o));
    engine_opts_default(&o);
    o.kv_dtype = DTYPE_F32;
    o.block_size = 16;
    o.kv_bytes = 64ull * 2 * 16 * 2 * sizeof(float);
    o.detok = (struct engine_detok){NULL, gd_new, gd_feed, gd_flush, gd_free};
    struct engine_model_ops ops = {.ctx = &f, .info = gfake_info, .forward = gfake_forward};
    struct engine *e = NULL;
    struct cairn_err err = {0};
    CHECK(engine_create_ops(&ops, &o, &e, &err) == CAIRN_OK);

    const uint8_t *bytes[GV];
    size_t lens[GV];
    for (int i = 0; i < GV; i++) {
        bytes[i] = (const uint8_t *)gv_piece[i];
        lens[i] = gv_piece[i] ? strlen(gv_piece[i]) : 0;
    }
    int32_t eos = GEOS;
    struct grammar_vocab *v = NULL;
    CHECK(grammar_vocab_create(bytes, lens, GV, &eos, 1, &v, NULL) == CAIRN_OK);
    static const char *pats[] = {"(ab|c)+x{2}", "[a-e]{3,6}-[0-9]{1,3}", "zz?y(ba|ca)*"};
    int32_t prompt[4] = {1, 2, 3, 4};

    /* baseline: the unconstrained request alone */
    struct collect alone;
    struct engine_request r0 = collect_request(&alone, prompt, 4, 24);
    r0.ignore_eos = 1;
    CHECK(engine_submit(e, &r0, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&alone, 1));

    /* the same beside constrained ones (greedy and sampled) in shared steps */
    struct collect cs[1 + 2 * 3];
    struct grammar *gs[3];
    struct engine_request rq = collect_request(&cs[0], prompt, 4, 24);
    rq.ignore_eos = 1;
    CHECK(engine_submit(e, &rq, NULL, &err) == CAIRN_OK);
    for (int k = 0; k < 3; k++) {
        CHECK(grammar_from_regex(pats[k], strlen(pats[k]), &gs[k], NULL) == CAIRN_OK);
        for (int smp = 0; smp < 2; smp++) {
            struct engine_request r = collect_request(&cs[1 + k * 2 + smp], prompt, 4, 40);
            r.grammar = gs[k];
            r.grammar_vocab = v;
            if (smp) {
                r.sampling.temperature = 1.0f;
                r.sampling.seed = 11 + (uint64_t)k;
                r.sampling.has_seed = 1;
                r.sampling.top_logprobs = 3;
            }
            CHECK_MSG(engine_submit(e, &r, NULL, &err) == CAIRN_OK, "%s", err.msg);
        }
        grammar_free(gs[k]); /* the engine holds its own references */
    }
    CHECK(collect_wait(cs, 7));
    CHECK_EQ_INT(cs[0].n_tokens, alone.n_tokens);
    CHECK(memcmp(cs[0].tokens, alone.tokens, (size_t)alone.n_tokens * sizeof(int32_t)) == 0);
    for (int k = 0; k < 3; k++)
        for (int smp = 0; smp < 2; smp++) {
            struct collect *c = &cs[1 + k * 2 + smp];
            CHECK_MSG(c->finish == ENGINE_FINISH_STOP && c->stop_token == GEOS, "%s: finish %d", pats[k], (int)c->finish);
            CHECK_MSG(pcre_full(pats[k], c->text) == 1, "%s: output '%s' does not match", pats[k], c->text);
        }

    /* a lazy grammar (tool_choice auto): free text until "xx", then xx[a-c]{2}9, free again;
     * biased toward "xx" so the envelope comes. The unconstrained request beside it keeps its
     * solo tokens; the output holds calls only in their constrained form. */
    struct grammar *gl;
    CHECK(grammar_from_regex("xx[a-c]{2}9", 11, &gl, NULL) == CAIRN_OK);
    CHECK(grammar_set_trigger(gl, NULL, "xx", GRAMMAR_LAZY_REPEAT, &err) == CAIRN_OK);
    struct collect cl[3];
    struct engine_request rl0 = collect_request(&cl[0], prompt, 4, 24);
    rl0.ignore_eos = 1;
    CHECK(engine_submit(e, &rl0, NULL, &err) == CAIRN_OK);
    struct engine_logit_bias lb = {28, 4.0f}; /* "xx" */
    for (int smp = 0; smp < 2; smp++) {
        struct engine_request r = collect_request(&cl[1 + smp], prompt, 4, 30);
        r.grammar = gl;
        r.grammar_vocab = v;
        r.sampling.logit_bias = &lb;
        r.sampling.n_logit_bias = 1;
        if (smp) {
            r.sampling.temperature = 1.0f;
            r.sampling.seed = 5;
            r.sampling.has_seed = 1;
        }
        CHECK_MSG(engine_submit(e, &r, NULL, &err) == CAIRN_OK, "%s", err.msg);
    }
    grammar_free(gl);
    CHECK(collect_wait(cl, 3));
    CHECK_EQ_INT(cl[0].n_tokens, alone.n_tokens);
    CHECK(memcmp(cl[0].tokens, alone.tokens, (size_t)alone.n_tokens * sizeof(int32_t)) == 0);
    for (int smp = 0; smp < 2; smp++) {
        const char *t = cl[1 + smp].text;
        CHECK_MSG(cl[1 + smp].finish != ENGINE_FINISH_ERROR && strstr(t, "xx"), "lazy %d: finish %d, '%s'", smp,
                  (int)cl[1 + smp].finish, t);
        /* complete calls only, or a last one cut by max_tokens */
        CHECK_MSG(pcre_full("(?:[^x]|x(?!x)|xx[a-c]{2}9)*(?:xx[a-c]{0,2})?", t) == 1, "lazy %d: '%s'", smp, t);
    }

    /* ignore_eos: a complete grammar still ends the request (no error) */
    struct grammar *g1;
    CHECK(grammar_from_regex("abc", 3, &g1, NULL) == CAIRN_OK);
    struct collect ce;
    struct engine_request re = collect_request(&ce, prompt, 4, 30);
    re.grammar = g1;
    re.grammar_vocab = v;
    re.ignore_eos = 1;
    CHECK(engine_submit(e, &re, NULL, &err) == CAIRN_OK);
    CHECK(collect_wait(&ce, 1));
    CHECK_MSG(ce.finish == ENGINE_FINISH_STOP && !strcmp(ce.text, "abc"), "finish %d text '%s'", (int)ce.finish, ce.text);
    CHECK(ce.n_tokens <= 4);
    /* a grammar without its vocabulary is refused */
    struct collect cx;
    struct engine_request rx = collect_request(&cx, prompt, 4, 5);
    rx.grammar = g1;
    CHECK(engine_submit(e, &rx, NULL, &err) == CAIRN_ERR_INVALID && strstr(err.msg, "grammar"));
    grammar_free(g1);
    engine_destroy(e);
    spec_check(&ops, &o, v);
    grammar_vocab_free(v);
    return test_summary("test_grammar_engine");
}
