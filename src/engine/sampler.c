/* Token sampler (see sampler.h for the pipeline and its order). */
#include "engine/sampler.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/mem.h"

#define SAMPLER_DEFAULT_REP_CTX 20

/* ---- PRNG: splitmix64 to seed xoshiro256** ---- */

static uint64_t sampler_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t sampler_rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t sampler_next(uint64_t s[4])
{
    uint64_t r = sampler_rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = sampler_rotl(s[3], 45);
    return r;
}

/* uniform in [0, 1) with 53 bits */
static double sampler_uniform(uint64_t s[4]) { return (double)(sampler_next(s) >> 11) * 0x1.0p-53; }

static uint64_t sampler_seed_counter; /* atomic */

/* ---- validation ---- */

int sampler_validate(const struct engine_sampling *p, int vocab_size, struct cairn_err *err)
{
    if (!(p->temperature >= 0.0f) || !isfinite(p->temperature))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "temperature must be >= 0 (got %g)", (double)p->temperature);
    if (p->top_k < 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "top_k must be >= 0 (got %d)", p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "top_p must be in (0, 1] (got %g)", (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "min_p must be in [0, 1] (got %g)", (double)p->min_p);
    /* 0 is accepted as "off" (like 1) so that a zeroed struct is valid */
    if (!(p->repetition_penalty >= 0.0f) || !isfinite(p->repetition_penalty))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "repetition_penalty must be > 0 (got %g)",
                             (double)p->repetition_penalty);
    if (p->repetition_context_size < 0)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "repetition_context_size must be >= 0 (got %d)",
                             p->repetition_context_size);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "presence_penalty must be in [-2, 2] (got %g)",
                             (double)p->presence_penalty);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "frequency_penalty must be in [-2, 2] (got %g)",
                             (double)p->frequency_penalty);
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && !p->logit_bias))
        return cairn_err_set(err, CAIRN_ERR_INVALID, "logit_bias: bad count %d", p->n_logit_bias);
    for (int i = 0; i < p->n_logit_bias; i++) {
        const struct engine_logit_bias *b = &p->logit_bias[i];
        if (b->id < 0 || b->id >= vocab_size)
            return cairn_err_set(err, CAIRN_ERR_INVALID, "logit_bias: token id %d out of range [0, %d)",
                                 (int)b->id, vocab_size);
        if (!(b->bias >= -100.0f && b->bias <= 100.0f))
            return cairn_err_set(err, CAIRN_ERR_INVALID, "logit_bias: bias for token %d must be in [-100, 100]",
                                 (int)b->id);
    }
    if (p->top_logprobs < 0 || p->top_logprobs > SAMPLER_MAX_TOP_LOGPROBS)
        return cairn_err_set(err, CAIRN_ERR_INVALID, "top_logprobs must be in [0, %d] (got %d)",
                             SAMPLER_MAX_TOP_LOGPROBS, p->top_logprobs);
    return CAIRN_OK;
}

int sampler_init(struct sampler *s, const struct engine_sampling *p, int vocab_size,
                 struct cairn_err *err)
{
    memset(s, 0, sizeof(*s));
    int rc = sampler_validate(p, vocab_size, err);
    if (rc) return rc;
    s->p = *p;
    s->vocab_size = vocab_size;
    s->rep_ctx = 0;
    if (p->repetition_penalty != 1.0f && p->repetition_penalty != 0.0f)
        s->rep_ctx = p->repetition_context_size ? p->repetition_context_size : SAMPLER_DEFAULT_REP_CTX;
    uint64_t seed = p->seed;
    if (!p->has_seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = __atomic_add_fetch(&sampler_seed_counter, 1, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ull ^
               ((uint64_t)ts.tv_sec * 1000000007ull + (uint64_t)ts.tv_nsec);
    }
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) s->rng[i] = sampler_splitmix64(&x);

    size_t V = (size_t)vocab_size;
    if (p->n_logit_bias) {
        s->bias = malloc((size_t)p->n_logit_bias * sizeof(*s->bias));
        if (!s->bias) goto nomem;
        memcpy(s->bias, p->logit_bias, (size_t)p->n_logit_bias * sizeof(*s->bias));
    }
    s->p.logit_bias = s->bias;
    s->work = malloc(V * sizeof(float));
    s->probs = malloc(V * sizeof(float));
    s->idx = malloc(V * sizeof(int32_t));
    s->bucket_mass = malloc(SAMPLER_N_BUCKETS * sizeof(double));
    s->bucket_count = malloc(SAMPLER_N_BUCKETS * sizeof(int32_t));
    if (!s->work || !s->probs || !s->idx || !s->bucket_mass || !s->bucket_count) goto nomem;
    if (p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        s->counts = calloc(V, sizeof(int32_t));
        if (!s->counts) goto nomem;
    }
    if (s->rep_ctx) {
        s->mark = calloc(V, 1);
        if (!s->mark) goto nomem;
    }
    /* at most one edit per context token, per distinct generated token and per bias entry */
    s->cap_edits = s->rep_ctx + p->n_logit_bias + (s->counts ? vocab_size : 0);
    if (s->cap_edits) {
        s->edits = malloc((size_t)s->cap_edits * sizeof(*s->edits));
        if (!s->edits) goto nomem;
    }
    return CAIRN_OK;
nomem:
    sampler_free(s);
    return cairn_err_set(err, CAIRN_ERR_NOMEM, "sampler: cannot allocate buffers for vocab %d", vocab_size);
}

void sampler_free(struct sampler *s)
{
    free(s->bias);
    free(s->work);
    free(s->probs);
    free(s->idx);
    free(s->bucket_mass);
    free(s->bucket_count);
    free(s->counts);
    free(s->mark);
    free(s->edits);
    memset(s, 0, sizeof(*s));
}

/* ---- top-k selection with a bounded min-heap (root = worst kept) ---- */

/* a ranks above b: larger value, ties -> lower index */
static int sampler_above(const float *v, int32_t a, int32_t b)
{
    return v[a] > v[b] || (v[a] == v[b] && a < b);
}

static void sampler_sift_down(const float *v, int32_t *h, int n, int i)
{
    for (;;) {
        int l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && sampler_above(v, h[m], h[l])) m = l;
        if (r < n && sampler_above(v, h[m], h[r])) m = r;
        if (m == i) return;
        int32_t t = h[i];
        h[i] = h[m];
        h[m] = t;
        i = m;
    }
}

void sampler_top_k_indices(const float *v, int n, int k, int32_t *out)
{
    if (k > n) k = n;
    if (k <= 0) return;
    for (int i = 0; i < k; i++) out[i] = i;
    for (int i = k / 2 - 1; i >= 0; i--) sampler_sift_down(v, out, k, i);
    for (int i = k; i < n; i++) {
        if (sampler_above(v, i, out[0])) {
            out[0] = i;
            sampler_sift_down(v, out, k, 0);
        }
    }
    /* heap sort: repeatedly move the worst to the end -> descending order */
    for (int end = k - 1; end > 0; end--) {
        int32_t t = out[0];
        out[0] = out[end];
        out[end] = t;
        sampler_sift_down(v, out, end, 0);
    }
}

/* ---- sampling ---- */

static int32_t sampler_pick(struct sampler *s, const float *w, int have_u, double u_given);

/* The penalties and the bias as a list of edits (tensor/backend.h's backend_logit_edit), in the
 * order they apply: the one description of step 1-3 that the host (sampler_edits_apply) and a
 * backend's sample op both follow, so both get the same bits. Returns the count (in s->edits). */
static int sampler_edits_build(struct sampler *s, const int32_t *history, int n_history, int n_generated)
{
    struct backend_logit_edit *e = s->edits;
    int V = s->vocab_size, n = 0;
    if (s->rep_ctx) {
        float rp = s->p.repetition_penalty;
        int start = n_history > s->rep_ctx ? n_history - s->rep_ctx : 0;
        for (int i = start; i < n_history; i++) {
            int32_t t = history[i];
            if (t < 0 || t >= V || s->mark[t]) continue;
            s->mark[t] = 1;
            e[n++] = (struct backend_logit_edit){t, BACKEND_EDIT_REPETITION, rp};
        }
        for (int i = start; i < n_history; i++)
            if (history[i] >= 0 && history[i] < V) s->mark[history[i]] = 0;
    }
    if (s->counts) {
        /* counts[t] is flipped negative once listed so each distinct token is penalized once */
        const int32_t *gen = history + n_history - n_generated;
        for (int i = 0; i < n_generated; i++) {
            int32_t t = gen[i];
            if (t < 0 || t >= V || s->counts[t] <= 0) continue;
            int c = s->counts[t];
            e[n++] = (struct backend_logit_edit){t, BACKEND_EDIT_SUB,
                                                 (float)c * s->p.frequency_penalty + s->p.presence_penalty};
            s->counts[t] = -c;
        }
        for (int i = 0; i < n_generated; i++) {
            int32_t t = gen[i];
            if (t >= 0 && t < V && s->counts[t] < 0) s->counts[t] = -s->counts[t];
        }
    }
    for (int i = 0; i < s->p.n_logit_bias; i++)
        e[n++] = (struct backend_logit_edit){s->bias[i].id, BACKEND_EDIT_ADD, s->bias[i].bias};
    CAIRN_ASSERT(n <= s->cap_edits);
    return n;
}

void sampler_edits_apply(float *w, const struct backend_logit_edit *e, int n)
{
    for (int i = 0; i < n; i++) {
        float *x = &w[e[i].id];
        switch (e[i].kind) {
        case BACKEND_EDIT_REPETITION: *x = *x > 0 ? *x / e[i].v : *x * e[i].v; break;
        case BACKEND_EDIT_SUB: *x -= e[i].v; break;
        default: *x += e[i].v; break;
        }
    }
}

/* Grammar mask: disallowed tokens to -inf. Whole words are the common case either way (inside a
 * string nearly everything is allowed, elsewhere nearly nothing). */
static void sampler_apply_mask(float *w, int V, const uint32_t *allowed)
{
    int n_words = (V + 31) / 32;
    for (int k = 0; k < n_words; k++) {
        uint32_t m = allowed[k];
        if (m == 0xffffffffu) continue;
        int base = k * 32, end = base + 32 < V ? base + 32 : V;
        if (m == 0) {
            for (int i = base; i < end; i++) w[i] = -INFINITY;
            continue;
        }
        for (int i = base; i < end; i++)
            if (!(m >> (i - base) & 1)) w[i] = -INFINITY;
    }
}

/* Greedy argmax with the scalar loop's exact result: `best = 0; for i: if (w[i] > w[best]) best = i`
 * (ties -> lowest id; NaN never wins, except at id 0 where nothing beats it). One pass: each block
 * of SAMPLER_ARGMAX_BLOCK logits gets its maximum (NaN ignored, as maxps does), and only a block
 * whose maximum beats the best so far is rescanned by the scalar rule, so the id is the same
 * bit for bit. Intrinsics because compilers do not vectorise a float max reduction without
 * -ffinite-math-only: SSE is in every x86-64; AVX2 is taken when the CPU has it. */
#define SAMPLER_ARGMAX_BLOCK 64

static int32_t sampler_argmax_ref(const float *w, int i0, int V, int32_t best)
{
    for (int i = i0; i < V; i++)
        if (w[i] > w[best]) best = i;
    return best;
}

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2"))) static int32_t sampler_argmax_avx2(const float *w, int V)
{
    int32_t best = 0;
    float bv = w[0];
    if (bv != bv) return 0; /* NaN at 0: nothing is greater */
    int i = 0;
    for (; i + SAMPLER_ARGMAX_BLOCK <= V; i += SAMPLER_ARGMAX_BLOCK) {
        /* max_ps(x, m) is m when x is NaN, and m starts at -inf: m is the block's maximum over
         * its non-NaN logits */
        __m256 m0 = _mm256_set1_ps(-INFINITY), m1 = m0, m2 = m0, m3 = m0;
        for (int j = 0; j < SAMPLER_ARGMAX_BLOCK; j += 32) {
            m0 = _mm256_max_ps(_mm256_loadu_ps(w + i + j), m0);
            m1 = _mm256_max_ps(_mm256_loadu_ps(w + i + j + 8), m1);
            m2 = _mm256_max_ps(_mm256_loadu_ps(w + i + j + 16), m2);
            m3 = _mm256_max_ps(_mm256_loadu_ps(w + i + j + 24), m3);
        }
        __m256 b = _mm256_set1_ps(bv);
        __m256 gt = _mm256_or_ps(_mm256_or_ps(_mm256_cmp_ps(m0, b, _CMP_GT_OQ), _mm256_cmp_ps(m1, b, _CMP_GT_OQ)),
                                 _mm256_or_ps(_mm256_cmp_ps(m2, b, _CMP_GT_OQ), _mm256_cmp_ps(m3, b, _CMP_GT_OQ)));
        if (!_mm256_movemask_ps(gt)) continue; /* nothing here beats the best: the scalar loop keeps it too */
        for (int j = i; j < i + SAMPLER_ARGMAX_BLOCK; j++) {
            if (w[j] > bv) {
                bv = w[j];
                best = j;
            }
        }
    }
    return sampler_argmax_ref(w, i, V, best);
}
#endif

static int32_t sampler_argmax(const float *w, int V)
{
#if defined(__x86_64__)
    if (V >= SAMPLER_ARGMAX_BLOCK && __builtin_cpu_supports("avx2")) return sampler_argmax_avx2(w, V);
#endif
    return sampler_argmax_ref(w, 1, V, 0);
}

/* Top-p without top-k: the ids that can be in the nucleus, sorted by decreasing probability, in
 * s->idx; returns their count. Sorting the whole vocabulary per token would cost milliseconds, so
 * a histogram of -log p (which is (max - logit) / T) finds the bucket where the cumulative mass
 * crosses `target`; only the ids in and above that bucket are sorted. Exact: every id below the
 * boundary bucket is less probable than every id kept. */
static int sampler_cmp_ctx_desc(const void *a, const void *b, void *ctx)
{
    const float *pr = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (pr[x] != pr[y]) return pr[x] > pr[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

#define SAMPLER_BUCKET_SPAN 32.0f /* -log p range covered; rarer ids share the last bucket */

static int sampler_nucleus_candidates(struct sampler *s, const float *w, float mx, float inv_t, double target)
{
    int V = s->vocab_size;
    const float *pr = s->probs;
    float scale = (float)SAMPLER_N_BUCKETS / SAMPLER_BUCKET_SPAN;
    memset(s->bucket_mass, 0, SAMPLER_N_BUCKETS * sizeof(double));
    memset(s->bucket_count, 0, SAMPLER_N_BUCKETS * sizeof(int32_t));
    for (int i = 0; i < V; i++) {
        float d = (mx - w[i]) * inv_t * scale;
        int b = d < (float)(SAMPLER_N_BUCKETS - 1) ? (int)d : SAMPLER_N_BUCKETS - 1;
        s->bucket_mass[b] += pr[i];
        s->bucket_count[b]++;
    }
    int boundary = SAMPLER_N_BUCKETS - 1;
    double cum = 0;
    for (int b = 0; b < SAMPLER_N_BUCKETS; b++) {
        cum += s->bucket_mass[b];
        if (cum >= target) {
            boundary = b;
            break;
        }
    }
    int n = 0;
    for (int i = 0; i < V; i++) {
        float d = (mx - w[i]) * inv_t * scale;
        int b = d < (float)(SAMPLER_N_BUCKETS - 1) ? (int)d : SAMPLER_N_BUCKETS - 1;
        if (b <= boundary) s->idx[n++] = i;
    }
    qsort_r(s->idx, (size_t)n, sizeof(int32_t), sampler_cmp_ctx_desc, s->probs);
    return n;
}

int32_t sampler_sample(struct sampler *s, const float *logits, const int32_t *history,
                       int n_history, int n_generated)
{
    int V = s->vocab_size;
    /* w: the processed logits; without penalties or bias that is the input itself (no copy) */
    const float *w = logits;
    if (s->rep_ctx || s->counts || s->p.n_logit_bias || s->allowed) {
        memcpy(s->work, logits, (size_t)V * sizeof(float));
        sampler_edits_apply(s->work, s->edits, sampler_edits_build(s, history, n_history, n_generated));
        w = s->work;
    }
    if (s->allowed) {
        sampler_apply_mask(s->work, V, s->allowed);
        s->allowed = NULL;
    }
    return sampler_pick(s, w, 0, 0);
}

/* Steps 4 and the logprobs over the processed logits w; the draw is u when have_u (a row
 * prepared by sampler_row_prepare), else taken from s's PRNG here. */
static int32_t sampler_pick(struct sampler *s, const float *w, int have_u, double u_given)
{
    int V = s->vocab_size;
    int32_t tok;
    if (s->p.temperature == 0.0f) {
        tok = sampler_argmax(w, V);
    } else {
        float inv_t = 1.0f / s->p.temperature;
        float *pr = s->probs;
        int32_t *idx = s->idx;
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = w[i] > mx ? w[i] : mx;
        /* probabilities (unnormalized) of the tempered distribution */
        double sum = 0;
        for (int i = 0; i < V; i++) {
            pr[i] = expf((w[i] - mx) * inv_t);
            sum += pr[i];
        }
        int n_cand = V;
        int sorted = 0;
        if (s->p.top_k > 0 && s->p.top_k < V) {
            n_cand = s->p.top_k;
            sampler_top_k_indices(pr, V, n_cand, idx);
            sorted = 1;
            sum = 0;
            for (int i = 0; i < n_cand; i++) sum += pr[idx[i]];
        }
        if (s->p.top_p < 1.0f) {
            double target = (double)s->p.top_p * sum;
            if (!sorted) {
                n_cand = sampler_nucleus_candidates(s, w, mx, inv_t, target);
                sorted = 1;
            }
            double c = 0;
            int keep = n_cand;
            for (int i = 0; i < n_cand; i++) {
                c += pr[idx[i]];
                if (c >= target) {
                    keep = i + 1;
                    break;
                }
            }
            n_cand = keep;
        }
        /* min_p: relative to the top probability (which is exp(0) = 1 here, unnormalized) */
        float floor_p = s->p.min_p > 0.0f ? s->p.min_p : 0.0f;
        double total = 0;
        if (sorted) {
            if (floor_p > 0)
                while (n_cand > 1 && pr[idx[n_cand - 1]] < floor_p) n_cand--;
            for (int i = 0; i < n_cand; i++) total += pr[idx[i]];
        } else {
            for (int i = 0; i < V; i++) {
                if (pr[i] < floor_p) pr[i] = 0;
                total += pr[i];
            }
        }
        double u = (have_u ? u_given : sampler_uniform(s->rng)) * total;
        double c = 0;
        if (sorted) {
            tok = idx[n_cand - 1];
            for (int i = 0; i < n_cand; i++) {
                c += pr[idx[i]];
                if (u < c) {
                    tok = idx[i];
                    break;
                }
            }
        } else {
            tok = sampler_argmax(w, V); /* fallback for rounding at the very end */
            for (int i = 0; i < V; i++) {
                c += pr[i];
                if (pr[i] > 0 && u < c) {
                    tok = i;
                    break;
                }
            }
        }
    }

    s->n_top = 0;
    if (s->p.logprobs || s->p.top_logprobs) {
        float mx = -INFINITY;
        for (int i = 0; i < V; i++) mx = w[i] > mx ? w[i] : mx;
        double sum = 0;
        for (int i = 0; i < V; i++) sum += expf(w[i] - mx);
        float lse = mx + (float)log(sum);
        s->logprob = w[tok] - lse;
        if (s->p.top_logprobs) {
            s->n_top = s->p.top_logprobs < V ? s->p.top_logprobs : V;
            sampler_top_k_indices(w, V, s->n_top, s->top_ids);
            /* masked-out tokens (-inf) are no alternatives */
            while (s->n_top > 1 && w[s->top_ids[s->n_top - 1]] == -INFINITY) s->n_top--;
            for (int i = 0; i < s->n_top; i++) s->top_logprobs[i] = w[s->top_ids[i]] - lse;
        }
    }
    return tok;
}

void sampler_accept(struct sampler *s, int32_t token)
{
    if (s->counts && token >= 0 && token < s->vocab_size) s->counts[token]++;
}

/* ---- rows sampled by a backend (tensor/backend.h's sample op) ---- */

int sampler_row_eligible(const struct sampler *s, int max_top_k)
{
    /* the op has no grammar mask and no top-p without top-k (those rows stay here); top-k up to
     * what the backend takes (with temperature: greedy ignores it) */
    if (s->allowed) return 0;
    if (s->p.temperature == 0.0f) return 1;
    int has_k = s->p.top_k > 0 && s->p.top_k < s->vocab_size;
    if (!has_k) return !(s->p.top_p < 1.0f);
    return s->p.top_k <= max_top_k;
}

void sampler_row_prepare(struct sampler *s, const int32_t *history, int n_history, int n_generated,
                         struct backend_sample_row *row)
{
    memset(row, 0, sizeof(*row));
    row->temperature = s->p.temperature;
    row->min_p = s->p.min_p;
    row->logprobs = s->p.logprobs;
    row->top_logprobs = s->p.top_logprobs;
    int has_k = s->p.temperature != 0.0f && s->p.top_k > 0 && s->p.top_k < s->vocab_size;
    row->top_k = has_k ? s->p.top_k : 0;
    row->top_p = has_k ? s->p.top_p : 1.0f;
    row->edits = s->edits;
    row->n_edits = (s->rep_ctx || s->counts || s->p.n_logit_bias)
                       ? sampler_edits_build(s, history, n_history, n_generated) : 0;
    /* the draw sampler_sample would take, at the same point of the PRNG's stream */
    row->u = s->p.temperature != 0.0f ? sampler_uniform(s->rng) : 0;
}

int32_t sampler_row_finish(struct sampler *s, const struct backend_sample_out *out)
{
    s->n_top = 0;
    if (s->p.logprobs || s->p.top_logprobs) {
        s->logprob = out->logprob;
        s->n_top = out->n_top;
        memcpy(s->top_ids, out->top_ids, sizeof(int32_t) * (size_t)out->n_top);
        memcpy(s->top_logprobs, out->top_logprobs, sizeof(float) * (size_t)out->n_top);
    }
    return out->id;
}

int sampler_row_reference(const float *logits, int vocab_size, const struct backend_sample_row *row,
                          struct backend_sample_out *out)
{
    struct engine_sampling p;
    engine_sampling_default(&p);
    p.temperature = row->temperature;
    p.min_p = row->min_p;
    p.logprobs = row->logprobs;
    p.top_logprobs = row->top_logprobs;
    if (row->top_k > 0) {
        p.top_k = row->top_k;
        p.top_p = row->top_p;
    }
    struct sampler s;
    int rc = sampler_init(&s, &p, vocab_size, NULL);
    if (rc != CAIRN_OK) return rc;
    memcpy(s.work, logits, sizeof(float) * (size_t)vocab_size);
    sampler_edits_apply(s.work, row->edits, row->n_edits);
    memset(out, 0, sizeof(*out));
    out->id = sampler_pick(&s, s.work, 1, row->u);
    out->logprob = s.logprob;
    out->n_top = s.n_top;
    memcpy(out->top_ids, s.top_ids, sizeof(int32_t) * (size_t)s.n_top);
    memcpy(out->top_logprobs, s.top_logprobs, sizeof(float) * (size_t)s.n_top);
    sampler_free(&s);
    return CAIRN_OK;
}
