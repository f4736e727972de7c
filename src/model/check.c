/* Oracle parity check (see check.h). */
#include "model/check.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_run.h"
#include "model/safetensors.h"

struct model_check_case {
    int idx;
    const int32_t *tokens; /* [T] */
    const float *logits;   /* [K, V] expected */
    const float *margins;  /* [T] */
    int T, K, first, prompt_len;
};

struct model_check_seq {
    const struct model_check_case *c;
    int done;   /* tokens already processed */
    int prompt; /* tokens to prefill in chunks (then one per step) */
    int chunk;
    float *mine;    /* [K, V] */
};

static uint64_t model_check_rng(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* Runs seqs to completion, a step at a time, all unfinished sequences in each step, over block
 * tables shuffled across one pool (non-contiguous, with holes). */
static int model_check_run_seqs(struct model *m, struct model_check_seq *sq, int n,
                                const struct model_check_opts *o, struct cairn_err *err)
{
    int bs = o->block_size, n_blocks = 0, max_step = 0, max_T = 1;
    for (int i = 0; i < n; i++) {
        n_blocks += (sq[i].c->T + bs - 1) / bs;
        max_step += CAIRN_MIN(sq[i].chunk, sq[i].c->T);
        max_T = CAIRN_MAX(max_T, sq[i].c->T);
    }
    n_blocks += 3; /* a few that nobody uses, so the shuffle leaves holes */
    struct model_run run;
    struct model_run_opts ro = {.n_seqs = n, .max_ctx = max_T, .max_step = max_step, .block_size = bs,
                                .kv_dtype = o->kv_dtype, .n_blocks = n_blocks};
    int rc = model_run_open(&run, m, &ro, err);
    if (rc != CAIRN_OK) return rc;
    int32_t *perm = malloc(sizeof(int32_t) * (size_t)n_blocks);
    struct model_run_item *items = calloc((size_t)n, sizeof(*items));
    if (!perm || !items) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto done;
    }
    uint64_t seed = 12345;
    for (int i = 0; i < n_blocks; i++)
        perm[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        int j = (int)(model_check_rng(&seed) % (uint64_t)(i + 1));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int p = 0;
    for (int i = 0; i < n; i++) {
        int nb = (sq[i].c->T + bs - 1) / bs;
        int32_t *table = model_run_table(&run, i);
        for (int b = 0; b < nb; b++)
            table[b] = perm[p++];
        sq[i].done = 0;
    }
    for (;;) {
        int k = 0;
        for (int i = 0; i < n; i++) {
            struct model_check_seq *s = &sq[i];
            const struct model_check_case *c = s->c;
            if (s->done >= c->T) continue;
            int len = s->done < s->prompt ? CAIRN_MIN(s->chunk, s->prompt - s->done) : 1;
            len = CAIRN_MIN(len, c->T - s->done);
            int lo = CAIRN_MAX(s->done, c->first), hi = s->done + len;
            struct model_run_item *q = &items[k++];
            q->seq = i;
            q->tokens = c->tokens + s->done;
            q->n_tokens = len;
            q->n_logits = hi > lo ? hi - lo : 0;
            q->logits = q->n_logits ? s->mine + (size_t)(lo - c->first) * (size_t)model_get_info(m)->vocab_size : NULL;
            s->done += len;
        }
        if (k == 0) break;
        rc = model_run_step(&run, items, k, err);
        if (rc != CAIRN_OK) goto done;
    }
done:
    free(perm);
    free(items);
    model_run_close(&run);
    return rc;
}

static int model_check_argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Compares one sequence's logits with the oracle; prints a line; returns 1 if it passed. */
static int model_check_compare(const struct model_check_seq *s, int V, const char *mode,
                               const struct model_check_opts *o, struct model_check_result *res)
{
    const struct model_check_case *c = s->c;
    double max_abs = 0;
    int n_g = 0, n_bad = 0, worst_row = 0, first_bad = -1;
    for (int r = 0; r < c->K; r++) {
        const float *a = s->mine + (size_t)r * V, *e = c->logits + (size_t)r * V;
        for (int i = 0; i < V; i++) {
            double d = fabs((double)a[i] - (double)e[i]);
            if (!(d <= max_abs)) { /* also catches NaN */
                max_abs = isnan(d) ? INFINITY : d;
                worst_row = r;
            }
        }
        if (c->margins[c->first + r] > 2 * o->tol) {
            n_g++;
            if (model_check_argmax(a, V) != model_check_argmax(e, V)) {
                n_bad++;
                if (first_bad < 0) first_bad = c->first + r;
            }
        }
    }
    int ok = max_abs <= o->tol && n_bad == 0;
    if (max_abs > res->max_abs) res->max_abs = max_abs;
    res->n_greedy += n_g;
    res->n_greedy_bad += n_bad;
    res->n_runs++;
    if (!ok) res->n_failed++;
    if (o->out) {
        fprintf(o->out,
                "case %d %-8s T=%-4d K=%-4d max|dlogit|=%.3e (row %d)  greedy %d/%d%s  %s\n",
                c->idx, mode, c->T, c->K, max_abs, c->first + worst_row, n_g - n_bad, n_g,
                n_bad ? " (mismatch)" : "", ok ? "ok" : "FAIL");
        if (first_bad >= 0) fprintf(o->out, "  first greedy mismatch at position %d\n", first_bad);
    }
    return ok;
}

static int model_check_load_cases(const struct safetensors *st, int V,
                                  struct model_check_case **out, int *n_out, struct cairn_err *err)
{
    const char *cases_json = safetensors_meta_get(st, "cases");
    if (!cases_json)
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: no __metadata__.cases", st->path);
    json_error_t jerr;
    json_t *arr = json_loads(cases_json, 0, &jerr);
    int rc = CAIRN_OK;
    if (!json_is_array(arr)) {
        json_decref(arr);
        return cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: __metadata__.cases is not a JSON list",
                             st->path);
    }
    int n = (int)json_array_size(arr);
    struct model_check_case *cs = calloc((size_t)(n ? n : 1), sizeof(*cs));
    if (!cs) {
        json_decref(arr);
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < n && rc == CAIRN_OK; i++) {
        json_t *e = json_array_get(arr, (size_t)i);
        json_t *jc = json_object_get(e, "case"), *jp = json_object_get(e, "prompt_len");
        json_t *jf = json_object_get(e, "first_logit_pos");
        struct model_check_case *c = &cs[i];
        c->idx = json_is_integer(jc) ? (int)json_integer_value(jc) : i;
        char name[64];
        const struct safetensors_tensor *tt, *tl, *tm;
        snprintf(name, sizeof(name), "case%d.tokens", c->idx);
        tt = safetensors_find(st, name);
        snprintf(name, sizeof(name), "case%d.logits", c->idx);
        tl = safetensors_find(st, name);
        snprintf(name, sizeof(name), "case%d.margins", c->idx);
        tm = safetensors_find(st, name);
        if (!tt || !tl || !tm || tt->n_dims != 1 || !tt->dtype_ok || tt->dtype != DTYPE_I32 ||
            tl->n_dims != 2 || !tl->dtype_ok || tl->dtype != DTYPE_F32 || tm->n_dims != 1 ||
            !tm->dtype_ok || tm->dtype != DTYPE_F32 || tm->shape[0] != tt->shape[0] ||
            tl->shape[0] > tt->shape[0] || tl->shape[1] != V || tt->shape[0] < 1) {
            rc =
                cairn_err_set(err, CAIRN_ERR_FORMAT,
                              "%s: case %d: tokens/logits/margins missing or mis-shaped (vocab %d)",
                              st->path, c->idx, V);
            break;
        }
        c->tokens = (const int32_t *)tt->data;
        c->logits = (const float *)tl->data;
        c->margins = (const float *)tm->data;
        c->T = (int)tt->shape[0];
        c->K = (int)tl->shape[0];
        c->first = c->T - c->K;
        c->prompt_len = json_is_integer(jp) ? (int)json_integer_value(jp) : c->T;
        if (c->prompt_len < 1 || c->prompt_len > c->T) c->prompt_len = c->T;
        if (json_is_integer(jf) && json_integer_value(jf) != c->first)
            rc = cairn_err_set(err, CAIRN_ERR_FORMAT,
                               "%s: case %d: first_logit_pos %lld but %d logit rows of %d",
                               st->path, c->idx, (long long)json_integer_value(jf), c->K, c->T);
        if (((uintptr_t)c->tokens % 4) || ((uintptr_t)c->logits % 4) || ((uintptr_t)c->margins % 4))
            rc = cairn_err_set(err, CAIRN_ERR_FORMAT, "%s: case %d: misaligned data", st->path,
                               c->idx);
    }
    json_decref(arr);
    if (rc != CAIRN_OK) {
        free(cs);
        return rc;
    }
    *out = cs;
    *n_out = n;
    return CAIRN_OK;
}

int model_check_run(struct model *m, const char *expected_path, const struct model_check_opts *o,
                    struct model_check_result *res, struct cairn_err *err)
{
    memset(res, 0, sizeof(*res));
    const struct model_info *info = model_get_info(m);
    int V = info->vocab_size;
    struct safetensors st;
    int rc = safetensors_open(expected_path, &st, err);
    if (rc != CAIRN_OK) return rc;
    struct model_check_case *cs = NULL;
    struct model_check_seq *sq = NULL;
    int n = 0;
    rc = model_check_load_cases(&st, V, &cs, &n, err);
    if (rc != CAIRN_OK) goto done;
    for (int i = 0; i < n; i++)
        if (cs[i].T > info->max_position) {
            rc = cairn_err_set(err, CAIRN_ERR_LIMIT, "case %d: %d tokens > max_position %d",
                               cs[i].idx, cs[i].T, info->max_position);
            goto done;
        }
    res->n_cases = n;
    sq = calloc((size_t)(n ? n : 1), sizeof(*sq));
    if (!sq) {
        rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < n; i++) {
        sq[i].c = &cs[i];
        sq[i].mine = malloc(sizeof(float) * (size_t)cs[i].K * (size_t)V);
        if (!sq[i].mine) {
            rc = cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
            goto done;
        }
    }
    char mode[32];
    unsigned modes =
        o->modes ? o->modes : (MODEL_CHECK_WHOLE | MODEL_CHECK_CHUNKED | MODEL_CHECK_BATCHED);
    if (n < 2)
        modes |= MODEL_CHECK_CHUNKED; /* nothing to batch: at least run the paged decode path */
    for (int i = 0; i < n; i++) {
        if (!(modes & MODEL_CHECK_WHOLE)) goto chunked;
        /* whole: one prefill of everything */
        sq[i].prompt = cs[i].T;
        sq[i].chunk = cs[i].T;
        for (size_t j = 0; j < (size_t)cs[i].K * (size_t)V; j++)
            sq[i].mine[j] = NAN;
        rc = model_check_run_seqs(m, &sq[i], 1, o, err);
        if (rc != CAIRN_OK) goto done;
        model_check_compare(&sq[i], V, "whole", o, res);
    chunked:
        if (!(modes & MODEL_CHECK_CHUNKED)) continue;
        /* chunked prefill of the prompt, then decode steps */
        sq[i].prompt = cs[i].prompt_len;
        sq[i].chunk = o->chunk;
        for (size_t j = 0; j < (size_t)cs[i].K * (size_t)V; j++)
            sq[i].mine[j] = NAN;
        rc = model_check_run_seqs(m, &sq[i], 1, o, err);
        if (rc != CAIRN_OK) goto done;
        snprintf(mode, sizeof(mode), "chunk%d", o->chunk);
        model_check_compare(&sq[i], V, mode, o, res);
    }
    if (n >= 2 && (modes & MODEL_CHECK_BATCHED)) {
        /* every case in the same steps */
        for (int i = 0; i < n; i++) {
            sq[i].prompt = cs[i].prompt_len;
            sq[i].chunk = o->chunk;
            for (size_t j = 0; j < (size_t)cs[i].K * (size_t)V; j++)
                sq[i].mine[j] = NAN;
        }
        rc = model_check_run_seqs(m, sq, n, o, err);
        if (rc != CAIRN_OK) goto done;
        for (int i = 0; i < n; i++)
            model_check_compare(&sq[i], V, "batched", o, res);
    }
done:
    if (sq)
        for (int i = 0; i < n; i++) {
            free(sq[i].mine);
        }
    free(sq);
    free(cs);
    safetensors_close(&st);
    return rc;
}
