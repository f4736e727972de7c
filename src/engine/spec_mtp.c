/* MTP drafting with the model's own head: hidden states asked of the target, the catch-up and
 * chained head steps at planning time (see spec_mtp.h). Scheduler thread only. */
#include "engine/spec_mtp.h"

#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "base/mem.h"
#include "engine/spec_sched.h"

int spec_mtp_init(struct engine *e, struct cairn_err *err)
{
    if (e->opts.speculative != ENGINE_SPEC_MTP) return CAIRN_OK;
    struct spec_mtp *x = calloc(1, sizeof(*x));
    if (!x) return cairn_err_set(err, CAIRN_ERR_NOMEM, "engine: out of memory");
    e->mtp = x;
    x->H = e->info.hidden_size;
    x->V = e->info.vocab_size;
    size_t R = (size_t)e->opts.max_running, H = (size_t)x->H;
    x->hidden =
        cairn_mem_alloc(sizeof(float) * H * (size_t)e->opts.max_batch_tokens, CAIRN_MEM_SCRATCH);
    x->logits = cairn_mem_alloc(sizeof(float) * (size_t)x->V * R, CAIRN_MEM_SCRATCH);
    x->g = cairn_mem_alloc(sizeof(float) * H * R, CAIRN_MEM_SCRATCH);
    x->g_in = cairn_mem_alloc(sizeof(float) * H * R, CAIRN_MEM_SCRATCH);
    x->seqs = calloc(R, sizeof(*x->seqs));
    x->slot = calloc(R, sizeof(*x->slot));
    if (!x->hidden || !x->logits || !x->g || !x->g_in || !x->seqs || !x->slot)
        return cairn_err_set(err, CAIRN_ERR_NOMEM, "engine: out of memory for the MTP drafter");
    return CAIRN_OK;
}

void spec_mtp_free(struct engine *e)
{
    struct spec_mtp *x = e->mtp;
    if (!x) return;
    size_t R = (size_t)e->opts.max_running, H = (size_t)x->H;
    cairn_mem_free(x->hidden, sizeof(float) * H * (size_t)e->opts.max_batch_tokens,
                   CAIRN_MEM_SCRATCH);
    cairn_mem_free(x->logits, sizeof(float) * (size_t)x->V * R, CAIRN_MEM_SCRATCH);
    cairn_mem_free(x->g, sizeof(float) * H * R, CAIRN_MEM_SCRATCH);
    cairn_mem_free(x->g_in, sizeof(float) * H * R, CAIRN_MEM_SCRATCH);
    free(x->seqs);
    free(x->slot);
    free(x);
    e->mtp = NULL;
}

void spec_mtp_want_hidden(struct engine *e, struct engine_seq *s, struct model_seq *m, int row)
{
    m->n_hidden = 0;
    m->hidden = NULL;
    struct spec_seq *p = s->spec;
    if (!e->mtp || !p || !p->use_mtp || m->n_tokens == 0) return;
    /* a decode (one committed token, no draft) whose plan did not want the head this step: not
     * fed (spec_mtp.h); prefill chunks always are, verify chunks were planned */
    int prefill = m->pos0 < s->n_prompt;
    if (!prefill && m->n_tokens == 1 && p->head_step != e->n_steps + 1) return;
    CAIRN_ASSERT(row >= 0 && row + m->n_tokens <= e->opts.max_batch_tokens);
    m->n_hidden = m->n_tokens;
    m->hidden = e->mtp->hidden + (size_t)row * (size_t)e->mtp->H;
    p->h_row = row;
    p->h_pos0 = m->pos0;
    p->h_n = m->n_tokens;
    p->h_step = e->n_steps + 1; /* the step this forward will be counted as */
}

/* One head step over seqs (counted in n_spec_head_rows: what feeding the head costs). */
static int spec_mtp_run(struct engine *e, const struct model_mtp_seq *seqs, int n, struct cairn_err *err)
{
    for (int i = 0; i < n; i++)
        e->n_spec_head_rows += (uint64_t)seqs[i].n_tokens;
    return e->ops.mtp_forward(e->ops.ctx, &e->pool, seqs, n, err);
}

static int spec_mtp_argmax(const float *v, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* decode index of s among sched[0, n_decodes), or -1 */
static int spec_mtp_decode_index(const struct engine *e, const struct engine_seq *s, int n_decodes)
{
    for (int i = 0; i < n_decodes; i++)
        if (e->sched[i] == s) return i;
    return -1;
}

void spec_mtp_seq_free(struct engine *e, struct spec_seq *p)
{
    if (!p->backlog) return;
    cairn_mem_free(p->backlog, sizeof(float) * SPEC_MTP_BACKLOG * (size_t)e->info.hidden_size,
                   CAIRN_MEM_SCRATCH);
    p->backlog = NULL;
    p->b_n = 0;
}

/* Catches up s's backlog now: one head step over its positions, no outputs. A failure leaves
 * those positions without head KV (drafts there are worse, never wrong): logged, dropped. */
static void spec_mtp_flush(struct engine *e, struct engine_seq *s)
{
    struct spec_seq *p = s->spec;
    if (!p->b_n) return;
    if (p->b_pos0 + p->b_n > s->n_blocks * e->opts.block_size) {
        p->b_n = 0; /* preempted since: its blocks are gone (recomputed ones get no head KV) */
        return;
    }
    struct model_mtp_seq q = {
        .tokens = s->tokens + p->b_pos0 + 1,
        .hidden = p->backlog,
        .n_tokens = p->b_n,
        .pos0 = p->b_pos0,
        .block_table = s->blocks,
    };
    p->b_n = 0;
    struct cairn_err err = {0};
    if (spec_mtp_run(e, &q, 1, &err) != CAIRN_OK)
        LOG_WARN("engine", "request %llu: MTP catch-up of a parked stretch failed: %s",
                 (unsigned long long)s->id, err.msg);
}

/* n rows of hidden states (positions pos0..) of a sequence not drafting now: into its backlog
 * (1), or 0 when they cannot wait (no memory, more rows than the backlog holds: caught up now). */
static int spec_mtp_defer(struct engine *e, struct engine_seq *s, const float *hidden, int pos0,
                          int n)
{
    struct spec_seq *p = s->spec;
    size_t H = (size_t)e->info.hidden_size;
    if (p->b_n && (p->b_pos0 + p->b_n != pos0 || p->b_n + n > SPEC_MTP_BACKLOG))
        spec_mtp_flush(e, s); /* not contiguous, or full: the backlog goes first */
    if (n > SPEC_MTP_BACKLOG) return 0;
    if (!p->backlog) {
        p->backlog = cairn_mem_alloc(sizeof(float) * SPEC_MTP_BACKLOG * H, CAIRN_MEM_SCRATCH);
        if (!p->backlog) return 0;
    }
    if (!p->b_n) p->b_pos0 = pos0;
    memcpy(p->backlog + (size_t)p->b_n * H, hidden, sizeof(float) * H * (size_t)n);
    p->b_n += n;
    return 1;
}

void spec_mtp_draft(struct engine *e, int n_decodes, int *want)
{
    struct spec_mtp *x = e->mtp;
    for (int i = 0; i < n_decodes; i++)
        if (want[i] && (!e->sched[i]->spec || !e->sched[i]->spec->use_mtp)) want[i] = 0;
    /* catch-up: every running MTP sequence with hidden states from the last forward */
    int n = 0, max_want = 0;
    for (int r = 0; r < e->n_running; r++) {
        struct engine_seq *s = e->running[r];
        struct spec_seq *p = s->spec;
        if (!p || !p->use_mtp || !p->h_n) continue;
        int fresh = p->h_step == e->n_steps;
        /* positions whose next token is committed; the rest were rejected drafts */
        int n_valid = CAIRN_MIN(p->h_n, s->n_tokens - 1 - p->h_pos0);
        p->h_n = 0;
        if (!fresh || n_valid <= 0) continue;
        const float *hid = x->hidden + (size_t)p->h_row * (size_t)x->H;
        int di = spec_mtp_decode_index(e, s, n_decodes);
        int drafts = di >= 0 && want[di] > 0 && p->h_pos0 + n_valid == s->n_tokens - 1;
        /* not drafting now (parked, or this step's break-even said no): the rows wait */
        if (!drafts && spec_mtp_defer(e, s, hid, p->h_pos0, n_valid)) continue;
        spec_mtp_flush(e, s); /* drafting again (or rows that could not wait): the backlog first */
        x->slot[n] = drafts ? di : -1;
        x->seqs[n] = (struct model_mtp_seq){
            .tokens = s->tokens + p->h_pos0 + 1,
            .hidden = hid,
            .n_tokens = n_valid,
            .pos0 = p->h_pos0,
            .block_table = s->blocks,
            .n_out = drafts,
            .logits = x->logits + (size_t)n * (size_t)x->V,
            .hidden_out = x->g + (size_t)n * (size_t)x->H,
        };
        if (drafts) max_want = CAIRN_MAX(max_want, want[di]);
        n++;
    }
    /* decodes that asked but had no head row this step draft nothing */
    int n_draft_seqs = 0;
    for (int j = 0; j < n; j++)
        n_draft_seqs += x->slot[j] >= 0;
    for (int i = 0; i < n_decodes; i++) {
        int has = 0;
        for (int j = 0; j < n && !has; j++)
            has = x->slot[j] == i;
        if (!has) want[i] = 0;
    }
    if (n == 0) return;
    struct cairn_err err = {0};
    int rc = spec_mtp_run(e, x->seqs, n, &err);
    if (rc != CAIRN_OK) {
        LOG_WARN("engine", "MTP head step failed, no drafts this step: %s", err.msg);
        for (int i = 0; i < n_decodes; i++)
            want[i] = 0;
        return;
    }
    /* draft 1 of each drafting sequence; compact them to the front for the chained steps */
    int m = 0;
    for (int j = 0; j < n; j++) {
        int di = x->slot[j]; /* j >= m: compacting in place is safe */
        if (di < 0) continue;
        struct engine_seq *s = e->sched[di];
        s->tokens[s->n_tokens] = spec_mtp_argmax(x->logits + (size_t)j * (size_t)x->V, x->V);
        memcpy(x->g_in + (size_t)m * (size_t)x->H, x->g + (size_t)j * (size_t)x->H,
               sizeof(float) * (size_t)x->H);
        x->slot[m++] = di;
    }
    CAIRN_ASSERT(m == n_draft_seqs);
    /* chained steps: draft d of each sequence that wants more, at position n_tokens - 2 + d */
    for (int d = 1; d < max_want; d++) {
        int c = 0;
        for (int j = 0; j < m; j++) {
            int di = x->slot[j];
            if (want[di] <= d) continue;
            struct engine_seq *s = e->sched[di];
            /* keep entry order = slot order: compact g_in alongside */
            if (c != j) {
                memmove(x->g_in + (size_t)c * (size_t)x->H, x->g_in + (size_t)j * (size_t)x->H,
                        sizeof(float) * (size_t)x->H);
                x->slot[c] = di;
            }
            x->seqs[c] = (struct model_mtp_seq){
                .tokens = s->tokens + s->n_tokens + d - 1,
                .hidden = x->g_in + (size_t)c * (size_t)x->H,
                .n_tokens = 1,
                .pos0 = s->n_tokens - 2 + d,
                .block_table = s->blocks,
                .n_out = 1,
                .logits = x->logits + (size_t)c * (size_t)x->V,
                .hidden_out = x->g + (size_t)c * (size_t)x->H,
            };
            c++;
        }
        m = c; /* the others keep the d drafts they have */
        if (m == 0) break;
        double t0 = cairn_now();
        rc = spec_mtp_run(e, x->seqs, m, &err);
        /* the drafting cost the controllers' break-even charges per drafted token */
        spec_cost_observe_draft(&e->spec_cost, cairn_now() - t0);
        if (rc != CAIRN_OK) {
            LOG_WARN("engine", "MTP head step failed, drafts cut at %d: %s", d, err.msg);
            for (int j = 0; j < m; j++)
                want[x->slot[j]] = d;
            return;
        }
        for (int j = 0; j < m; j++) {
            struct engine_seq *s = e->sched[x->slot[j]];
            s->tokens[s->n_tokens + d] =
                spec_mtp_argmax(x->logits + (size_t)j * (size_t)x->V, x->V);
            memcpy(x->g_in + (size_t)j * (size_t)x->H, x->g + (size_t)j * (size_t)x->H,
                   sizeof(float) * (size_t)x->H);
        }
    }
}
