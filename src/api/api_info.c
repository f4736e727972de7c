/* GET /v1/models, /api/status, /metrics and POST /api/cache/clear: answers built from the
 * backend's model list and engine stats. Cheap and non-blocking (never loads a model). */
#include "api/api_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/mem.h"

#define API_INFO_MAX_MODELS 256

/* A loaded model's index with a user reference (api_info_unpeek drops it), without ever
 * starting a load. Returns 0 if it is not loaded. */
static int api_info_peek(struct api *a, const char *id, int *idx)
{
    struct cairn_err err;
    if (a->be.peek_model) return a->be.peek_model(a->be.ctx, id, idx);
    return a->be.get_model(a->be.ctx, id, idx, &err) == 0; /* backends that never load */
}

static void api_info_unpeek(struct api *a, int idx)
{
    if (a->be.put_model) a->be.put_model(a->be.ctx, idx);
}


/* OpenAI's model object plus the context length (as LM Studio / vLLM-style servers add it, so
 * agents can size their window); Anthropic's when asked with anthropic-version. context_length
 * is the real one: a usage scale (api.h) does not change it. */
static json_t *api_info_model_obj(const struct api_model_desc *d, int anthropic)
{
    json_t *o;
    if (anthropic) {
        char when[32];
        time_t t = (time_t)d->created;
        struct tm tm;
        gmtime_r(&t, &tm);
        strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
        o = json_pack("{s:s,s:s,s:s,s:s}", "type", "model", "id", d->id, "display_name", d->id, "created_at", when);
    } else {
        o = json_pack("{s:s,s:s,s:I,s:s}", "id", d->id, "object", "model", "created", (json_int_t)d->created,
                      "owned_by", "cairn");
    }
    if (o && d->context_length > 0) {
        json_object_set_new(o, "context_length", json_integer(d->context_length));
        json_object_set_new(o, "max_model_len", json_integer(d->context_length));
    }
    return o;
}

char *api_info_models(struct api *a, const char *id, int anthropic, int *status)
{
    struct api_model_desc *d = api_calloc(API_INFO_MAX_MODELS, sizeof(*d));
    if (!d) {
        *status = 503;
        return api_error_body(anthropic, 503, NULL, "out of memory", NULL);
    }
    int n = a->be.list_models(a->be.ctx, d, API_INFO_MAX_MODELS);
    if (n > API_INFO_MAX_MODELS) n = API_INFO_MAX_MODELS;
    json_t *o = NULL;
    *status = 200;
    if (id) {
        int found = 0;
        for (int i = 0; i < n && !found; i++)
            if (!strcmp(d[i].id, id)) {
                o = api_info_model_obj(&d[i], anthropic);
                found = 1;
            }
        if (!found) {
            char msg[400];
            snprintf(msg, sizeof(msg), anthropic ? "model: %.300s" : "The model '%.300s' does not exist", id);
            free(d);
            *status = 404;
            return api_error_body(anthropic, 404, "model_not_found", msg, "model");
        }
    } else {
        json_t *arr = json_array();
        for (int i = 0; i < n; i++) json_array_append_new(arr, api_info_model_obj(&d[i], anthropic));
        if (anthropic)
            o = json_pack("{s:o,s:b,s:s?,s:s?}", "data", arr, "has_more", 0, "first_id", n ? d[0].id : NULL,
                          "last_id", n ? d[n - 1].id : NULL);
        else
            o = json_pack("{s:s,s:o}", "object", "list", "data", arr);
    }
    free(d);
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!s) *status = 503; /* the caller answers the static out-of-memory body */
    return s;
}


static json_t *api_info_tier_json(const struct kv_tier_stats *t)
{
    json_t *o = json_object();
    json_object_set_new(o, "enabled", json_boolean(t->enabled));
    if (!t->enabled) return o;
    struct {
        const char *k;
        uint64_t v;
    } f[] = {{"blocks", t->n_blocks},       {"bytes", t->n_bytes},
             {"max_bytes", t->max_bytes},   {"hits", t->n_hits},
             {"misses", t->n_misses},       {"writes", t->n_writes},
             {"drops", t->n_drops},         {"evictions", t->n_evictions},
             {"damaged", t->n_damaged},     {"foreign", t->n_foreign},
             {"queued", t->n_queued},       {"write_errors", t->n_write_errors},
             {"read_errors", t->n_read_errors},
             /* hot tier in pinned slabs (kv/tier_slab.h): RAM mapped, free slots included */
             {"slab_bytes", t->n_slab_bytes},   {"pinned_bytes", t->n_pinned_bytes}};
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(f); i++)
        json_object_set_new(o, f[i].k, json_integer((json_int_t)f[i].v));
    return o;
}

/* The model's lower KV tiers (hot RAM, SSD): counters from kv_tiers_stats. */
static json_t *api_info_tiers_json(const struct kv_tiers_stats *ts)
{
    json_t *o = json_object();
    json_object_set_new(o, "write_through", json_boolean(ts->write_through));
    json_object_set_new(o, "hot", api_info_tier_json(&ts->hot));
    json_object_set_new(o, "ssd", api_info_tier_json(&ts->ssd));
    return o;
}

/* engine_step_sum as {"steps", "rows", "ctx", "forward_s", "wall_s"} */
static json_t *api_info_step_sum(const struct engine_step_sum *k)
{
    return json_pack("{s:I,s:I,s:I,s:f,s:f}", "steps", (json_int_t)k->n_steps, "rows", (json_int_t)k->n_rows,
                     "ctx", (json_int_t)k->n_ctx, "forward_s", k->forward_s, "wall_s", k->wall_s);
}

/* The scheduler's accounting (engine.h's engine_sched_acct), merged into "steps": the thread's
 * time (elapsed = idle + between + steps), steps by kind and by rows (every step), the rows,
 * and what preemption and eviction cost. */
static void api_info_acct_json(json_t *steps, const struct engine_stats *st)
{
    const struct engine_sched_acct *a = &st->acct;
    static const char *const kinds[ENGINE_STEP_N_KINDS] = {"decode", "prefill", "mixed"};
    json_object_set_new(steps, "thread_s",
                        json_pack("{s:f,s:f,s:f,s:f,s:f,s:f}", "elapsed", a->t_elapsed_s, "idle", a->t_idle_s,
                                  "between", a->t_between_s, "steps", a->t_steps_s, "pre", a->t_pre_s, "post",
                                  a->t_post_s));
    json_t *by_kind = json_object();
    for (int k = 0; k < ENGINE_STEP_N_KINDS; k++) json_object_set_new(by_kind, kinds[k], api_info_step_sum(&a->kind[k]));
    json_object_set_new(steps, "by_kind", by_kind);
    json_t *by_rows = json_array();
    for (int b = 0; b < ENGINE_STEP_ROW_BUCKETS; b++) {
        if (!a->by_rows[b].n_steps) continue;
        int lo, hi;
        engine_step_row_range(b, &lo, &hi);
        json_t *o = api_info_step_sum(&a->by_rows[b]);
        json_object_set_new(o, "rows_min", json_integer(lo));
        json_object_set_new(o, "rows_max", json_integer(hi));
        json_array_append_new(by_rows, o);
    }
    json_object_set_new(steps, "by_rows", by_rows);
    json_object_set_new(steps, "new_rows", api_info_step_sum(&a->new_rows));
    json_object_set_new(steps, "rows",
                        json_pack("{s:I,s:I,s:I,s:I}", "decode", (json_int_t)a->n_rows_decode, "verify",
                                  (json_int_t)a->n_rows_verify, "prefill", (json_int_t)a->n_rows_prefill,
                                  "recomputed", (json_int_t)a->n_rows_recomputed));
    json_object_set_new(steps, "sched",
                        json_pack("{s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "empty_passes", (json_int_t)a->n_empty_passes,
                                  "repreemptions", (json_int_t)a->n_repreemptions,
                                  "evicted_blocks", (json_int_t)st->n_evictions,
                                  "preempted_blocks", (json_int_t)a->n_preempted_blocks, "readmissions",
                                  (json_int_t)a->n_readmissions, "readmit_same_step",
                                  (json_int_t)a->n_readmit_same_step, "admit_deferred",
                                  (json_int_t)a->n_admit_deferred));
    json_object_set_new(json_object_get(steps, "sched"), "growth_ratio", json_real(a->growth_ratio));
}

char *api_info_health(struct api *a)
{
    struct api_model_desc *d = calloc(API_INFO_MAX_MODELS, sizeof(*d));
    if (!d) return NULL;
    int n = a->be.list_models(a->be.ctx, d, API_INFO_MAX_MODELS);
    if (n > API_INFO_MAX_MODELS) n = API_INFO_MAX_MODELS;
    json_t *failed = json_array();
    for (int i = 0; i < n; i++)
        if (d[i].failed) json_array_append_new(failed, json_pack("{s:s,s:s}", "id", d[i].id, "reason", d[i].failure));
    free(d);
    json_t *o = json_object();
    json_object_set_new(o, "status", json_string(json_array_size(failed) ? "degraded" : "ok"));
    if (json_array_size(failed)) json_object_set_new(o, "failed_models", failed);
    else json_decref(failed);
    char *out = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return out;
}

int api_n_active(struct api *a)
{
    pthread_mutex_lock(&a->mu);
    int n = 0;
    for (struct api_call *c = a->active; c; c = c->next) n++;
    pthread_mutex_unlock(&a->mu);
    return n;
}

char *api_info_status(struct api *a, int *status)
{
    struct api_model_desc *d = calloc(API_INFO_MAX_MODELS, sizeof(*d));
    if (!d) {
        *status = 503;
        return api_error_body(0, 503, NULL, "out of memory", NULL);
    }
    int n = a->be.list_models(a->be.ctx, d, API_INFO_MAX_MODELS);
    if (n > API_INFO_MAX_MODELS) n = API_INFO_MAX_MODELS;
    json_t *models = json_array();
    for (int i = 0; i < n; i++) {
        json_t *m = json_object();
        json_object_set_new(m, "id", json_string(d[i].id));
        struct engine_stats st;
        memset(&st, 0, sizeof(st));
        int idx = -1;
        int loaded = d[i].loaded;
        if (loaded && !api_info_peek(a, d[i].id, &idx)) loaded = 0;
        if (loaded) loaded = a->be.stats(a->be.ctx, idx, &st);
        json_object_set_new(m, "loaded", json_boolean(loaded));
        if (d[i].failed) json_object_set_new(m, "failed", json_string(d[i].failure));
        json_object_set_new(m, "context_length", json_integer(d[i].context_length));
        json_object_set_new(m, "running", json_integer(st.n_running));
        json_object_set_new(m, "waiting", json_integer(st.n_waiting));
        json_object_set_new(m, "decode_tokens_per_s", json_real(st.decode_tok_s));
        json_object_set_new(m, "prefill_tokens_per_s", json_real(st.prefill_tok_s));
        json_object_set_new(m, "kv_blocks", json_pack("{s:i,s:i,s:i,s:i}", "total", st.n_blocks_total, "used",
                                                      st.n_blocks_used, "free", st.n_blocks_free, "cached",
                                                      st.n_blocks_cached));
        double hit = st.n_prefix_lookups ? (double)st.n_prefix_hits / (double)st.n_prefix_lookups : 0.0;
        json_object_set_new(m, "prefix_hit_rate", json_real(hit));
        json_object_set_new(m, "cached_tokens_served", json_integer((json_int_t)st.n_cached_tokens));
        json_object_set_new(m, "requests_done", json_integer((json_int_t)st.n_requests_done));
        json_object_set_new(m, "prompt_tokens", json_integer((json_int_t)st.n_prompt_tokens));
        json_object_set_new(m, "generated_tokens", json_integer((json_int_t)st.n_generated_tokens));
        json_object_set_new(m, "preemptions", json_integer((json_int_t)st.n_preemptions));
        json_object_set_new(m, "speculative",
                            json_pack("{s:I,s:I,s:I,s:I,s:I,s:f}", "drafted", (json_int_t)st.n_spec_drafted, "accepted",
                                      (json_int_t)st.n_spec_accepted, "verify_steps", (json_int_t)st.n_spec_steps,
                                      "parks", (json_int_t)st.n_spec_parks, "head_rows",
                                      (json_int_t)st.n_spec_head_rows, "step_cost_slope", st.spec_cost_slope));
        /* restore vs recompute of prefix hits in the lower tiers (kv/kv_restore.h) */
        json_object_set_new(
            m, "prefix_restore",
            json_pack("{s:i,s:I,s:I,s:I,s:I,s:I,s:I,s:f,s:f,s:f}", "fetching", st.n_fetching, "fetches",
                      (json_int_t)st.n_fetches, "fetches_cut", (json_int_t)st.n_fetches_cut, "fetched_blocks",
                      (json_int_t)st.n_fetched_blocks,
                      "restored", (json_int_t)st.n_plans_restore, "recomputed",
                      (json_int_t)st.n_plans_recompute, "blocks_recomputed",
                      (json_int_t)st.n_blocks_recomputed, "hot_read_bytes_per_s", st.tier_fast_read_bps,
                      "ssd_read_bytes_per_s", st.tier_slow_read_bps, "prefill_tokens_per_s",
                      st.prefill_tok_s));
        /* where the scheduler's time went, summed since start: steps that decoded only vs the
         * rest (prefill chunks, mixed), and the host phases of every step (engine.h); two reads'
         * difference is a run's share (bench/http_load.py prints it) */
        json_t *steps =
            json_pack("{s:I,s:f,s:I,s:{s:f,s:f,s:f,s:f,s:f,s:f},s:I,s:I}", "count", (json_int_t)st.n_steps,
                      "decode_only_s", st.decode_step_s, "decode_only_tokens", (json_int_t)st.n_decode_step_tokens,
                      "host_s", "plan", st.t_plan_s, "issue", st.t_issue_s, "wait", st.t_wait_s, "sample",
                      st.t_sample_s, "detok", st.t_detok_s, "emit", st.t_emit_s, "rows_sampled_device",
                      (json_int_t)st.n_rows_device, "rows_sampled_host", (json_int_t)st.n_rows_host);
        api_info_acct_json(steps, &st);
        json_object_set_new(m, "steps", steps);
        struct kv_tiers_stats ts;
        if (loaded && a->be.tier_stats && a->be.tier_stats(a->be.ctx, idx, &ts))
            json_object_set_new(m, "tiers", api_info_tiers_json(&ts));
        if (idx >= 0) api_info_unpeek(a, idx);
        json_array_append_new(models, m);
    }
    free(d);
    json_t *mem = json_object();
    for (int t = 0; t < CAIRN_MEM_N_TAGS; t++)
        json_object_set_new(mem, cairn_mem_tag_name((enum cairn_mem_tag)t),
                            json_integer((json_int_t)cairn_mem_used((enum cairn_mem_tag)t)));
    json_t *o = json_object();
    json_object_set_new(o, "models", models);
    json_object_set_new(o, "active_requests", json_integer(api_n_active(a) - 1)); /* minus this one */
    json_object_set_new(o, "requests_total", json_integer((json_int_t)__atomic_load_n(&a->n_requests, __ATOMIC_RELAXED)));
    json_object_set_new(o, "errors_total", json_integer((json_int_t)__atomic_load_n(&a->n_errors, __ATOMIC_RELAXED)));
    json_object_set_new(o, "memory_bytes", mem);
    if (a->be.memory_json) json_object_set_new(o, "memory_guard", a->be.memory_json(a->be.ctx));
    if (a->be.devices_json) { /* "tensor_parallel": N and "devices": one name per rank */
        json_t *dev = a->be.devices_json(a->be.ctx);
        json_object_update(o, dev);
        json_decref(dev);
    }
    /* sums since start: (total1 - total0) / (count1 - count0) between two reads is the mean */
    json_object_set_new(o, "latency", json_pack("{s:I,s:f,s:I,s:f}", "ttft_count",
                                                (json_int_t)__atomic_load_n(&a->lat.n_ttft, __ATOMIC_RELAXED), "ttft_s_total",
                                                (double)__atomic_load_n(&a->lat.ttft_us, __ATOMIC_RELAXED) / 1e6,
                                                "inter_token_count", (json_int_t)__atomic_load_n(&a->lat.n_itl, __ATOMIC_RELAXED),
                                                "inter_token_s_total",
                                                (double)__atomic_load_n(&a->lat.itl_us, __ATOMIC_RELAXED) / 1e6));
    json_object_set_new(o, "shutting_down", json_boolean(API_SHUTTING(a)));
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    *status = 200;
    return s;
}

/* Prometheus label values escape \, " and newline. */
static void api_info_label(struct api_sbuf *b, const char *v)
{
    for (; *v; v++) {
        if (*v == '\\' || *v == '"') api_sbuf_add(b, "\\", 1);
        if (*v == '\n') {
            api_sbuf_adds(b, "\\n");
            continue;
        }
        api_sbuf_add(b, v, 1);
    }
}

struct api_metric {
    const char *name, *type, *help;
};

/* Lower-tier counters, one series per model and tier. */
static void api_info_tier_metrics(struct api *a, struct api_sbuf *b, const struct api_model_desc *d,
                                  const int *loaded, int n)
{
    static const struct api_metric tm[] = {
        {"cairn_kv_tier_blocks", "gauge", "blocks held by a lower KV tier"},
        {"cairn_kv_tier_bytes", "gauge", "bytes held by a lower KV tier"},
        {"cairn_kv_tier_hits_total", "counter", "lower KV tier lookup hits"},
        {"cairn_kv_tier_misses_total", "counter", "lower KV tier lookup misses"},
        {"cairn_kv_tier_writes_total", "counter", "blocks written to a lower KV tier"},
        {"cairn_kv_tier_drops_total", "counter", "blocks dropped (queue full, write error)"},
        {"cairn_kv_tier_damaged_total", "counter", "damaged blocks found and removed"},
        {"cairn_kv_tier_foreign_files", "gauge", "files of other models left alone in the SSD folder"},
    };
    if (!a->be.tier_stats) return;
    struct kv_tiers_stats *ts = calloc((size_t)(n > 0 ? n : 1), sizeof(*ts));
    int *has = calloc((size_t)(n > 0 ? n : 1), sizeof(int));
    if (!ts || !has) {
        free(ts);
        free(has);
        return;
    }
    for (int i = 0; i < n; i++) {
        int idx;
        if (loaded[i] && api_info_peek(a, d[i].id, &idx)) {
            has[i] = a->be.tier_stats(a->be.ctx, idx, &ts[i]);
            api_info_unpeek(a, idx);
        }
    }
    char line[200];
    for (size_t k = 0; k < CAIRN_ARRAY_LEN(tm); k++) {
        snprintf(line, sizeof(line), "# HELP %s %s\n# TYPE %s %s\n", tm[k].name, tm[k].help,
                 tm[k].name, tm[k].type);
        api_sbuf_adds(b, line);
        for (int i = 0; i < n; i++) {
            if (!has[i]) continue;
            for (int t = 0; t < 2; t++) {
                const struct kv_tier_stats *s = t ? &ts[i].ssd : &ts[i].hot;
                if (!s->enabled) continue;
                uint64_t v = k == 0 ? s->n_blocks : k == 1 ? s->n_bytes : k == 2 ? s->n_hits
                           : k == 3 ? s->n_misses : k == 4 ? s->n_writes : k == 5 ? s->n_drops
                           : k == 6 ? s->n_damaged : s->n_foreign;
                api_sbuf_adds(b, tm[k].name);
                api_sbuf_adds(b, "{model=\"");
                api_info_label(b, d[i].id);
                snprintf(line, sizeof(line), "\",tier=\"%s\"} %llu\n", t ? "ssd" : "hot",
                         (unsigned long long)v);
                api_sbuf_adds(b, line);
            }
        }
    }
    free(ts);
    free(has);
}

char *api_info_metrics(struct api *a, int *status)
{
    static const struct api_metric mets[] = {
        {"cairn_model_loaded", "gauge", "1 if the model is loaded"},
        {"cairn_requests_running", "gauge", "sequences being generated"},
        {"cairn_requests_waiting", "gauge", "requests queued in the engine"},
        {"cairn_kv_blocks_used", "gauge", "device KV blocks referenced by running sequences"},
        {"cairn_kv_blocks_cached", "gauge", "device KV blocks holding an evictable cached prefix"},
        {"cairn_kv_blocks_free", "gauge", "free device KV blocks"},
        {"cairn_decode_tokens_per_second", "gauge", "recent decode throughput"},
        {"cairn_prefill_tokens_per_second", "gauge", "recent prefill throughput"},
        {"cairn_prompt_tokens_total", "counter", "prompt tokens processed"},
        {"cairn_cached_tokens_total", "counter", "prompt tokens served from the prefix cache"},
        {"cairn_generated_tokens_total", "counter", "tokens generated"},
        {"cairn_requests_done_total", "counter", "requests finished"},
        {"cairn_prefix_lookups_total", "counter", "prefix cache lookups"},
        {"cairn_prefix_hits_total", "counter", "prefix cache hits"},
        {"cairn_spec_drafted_tokens_total", "counter", "speculative draft tokens verified"},
        {"cairn_spec_accepted_tokens_total", "counter", "speculative draft tokens accepted"},
    };
    struct api_model_desc *d = calloc(API_INFO_MAX_MODELS, sizeof(*d));
    struct engine_stats *st = calloc(API_INFO_MAX_MODELS, sizeof(*st));
    int *loaded = calloc(API_INFO_MAX_MODELS, sizeof(int));
    struct api_sbuf b = {0};
    if (!d || !st || !loaded) {
        free(d);
        free(st);
        free(loaded);
        *status = 503;
        return strdup("# out of memory\n");
    }
    int n = a->be.list_models(a->be.ctx, d, API_INFO_MAX_MODELS);
    if (n > API_INFO_MAX_MODELS) n = API_INFO_MAX_MODELS;
    for (int i = 0; i < n; i++) {
        int idx;
        if (d[i].loaded && api_info_peek(a, d[i].id, &idx)) {
            loaded[i] = a->be.stats(a->be.ctx, idx, &st[i]);
            api_info_unpeek(a, idx);
        }
    }
    char line[160];
    for (size_t k = 0; k < CAIRN_ARRAY_LEN(mets); k++) {
        snprintf(line, sizeof(line), "# HELP %s %s\n# TYPE %s %s\n", mets[k].name, mets[k].help, mets[k].name, mets[k].type);
        api_sbuf_adds(&b, line);
        for (int i = 0; i < n; i++) {
            double v = 0;
            const struct engine_stats *s = &st[i];
            switch (k) {
            case 0: v = loaded[i]; break;
            case 1: v = s->n_running; break;
            case 2: v = s->n_waiting; break;
            case 3: v = s->n_blocks_used; break;
            case 4: v = s->n_blocks_cached; break;
            case 5: v = s->n_blocks_free; break;
            case 6: v = s->decode_tok_s; break;
            case 7: v = s->prefill_tok_s; break;
            case 8: v = (double)s->n_prompt_tokens; break;
            case 9: v = (double)s->n_cached_tokens; break;
            case 10: v = (double)s->n_generated_tokens; break;
            case 11: v = (double)s->n_requests_done; break;
            case 12: v = (double)s->n_prefix_lookups; break;
            case 13: v = (double)s->n_prefix_hits; break;
            case 14: v = (double)s->n_spec_drafted; break;
            case 15: v = (double)s->n_spec_accepted; break;
            }
            api_sbuf_adds(&b, mets[k].name);
            api_sbuf_adds(&b, "{model=\"");
            api_info_label(&b, d[i].id);
            snprintf(line, sizeof(line), "\"} %.17g\n", v);
            api_sbuf_adds(&b, line);
        }
    }
    api_info_tier_metrics(a, &b, d, loaded, n);
    snprintf(line, sizeof(line),
             "# HELP cairn_http_requests_total generation requests received\n# TYPE cairn_http_requests_total counter\ncairn_http_requests_total %llu\n",
             (unsigned long long)__atomic_load_n(&a->n_requests, __ATOMIC_RELAXED));
    api_sbuf_adds(&b, line);
    snprintf(line, sizeof(line),
             "# HELP cairn_http_errors_total answers with status >= 400\n# TYPE cairn_http_errors_total counter\ncairn_http_errors_total %llu\n",
             (unsigned long long)__atomic_load_n(&a->n_errors, __ATOMIC_RELAXED));
    api_sbuf_adds(&b, line);
    api_sbuf_adds(&b, "# HELP cairn_memory_bytes bytes allocated per tag\n# TYPE cairn_memory_bytes gauge\n");
    for (int t = 0; t < CAIRN_MEM_N_TAGS; t++) {
        snprintf(line, sizeof(line), "cairn_memory_bytes{tag=\"%s\"} %llu\n", cairn_mem_tag_name((enum cairn_mem_tag)t),
                 (unsigned long long)cairn_mem_used((enum cairn_mem_tag)t));
        api_sbuf_adds(&b, line);
    }
    free(d);
    free(st);
    free(loaded);
    *status = 200;
    return b.p;
}

char *api_info_cache_clear(struct api *a, const char *body, size_t len, int *status)
{
    const char *tier = "all";
    json_t *o = NULL;
    if (len) {
        json_error_t je;
        o = json_loadb(body, len, 0, &je);
        if (!o || !json_is_object(o)) {
            json_decref(o);
            *status = 400;
            return api_error_body(0, 400, NULL, "the request body must be a JSON object", NULL);
        }
        json_t *t = json_object_get(o, "tier");
        if (t && !json_is_string(t)) {
            json_decref(o);
            *status = 400;
            return api_error_body(0, 400, NULL, "'tier' must be a string", "tier");
        }
        if (t) tier = json_string_value(t);
    }
    char *out;
    if (strcmp(tier, "device") && strcmp(tier, "hot") && strcmp(tier, "ssd") && strcmp(tier, "all")) {
        *status = 400;
        out = api_error_body(0, 400, NULL, "'tier' must be device, hot, ssd or all", "tier");
    } else {
        struct cairn_err err = {0};
        int rc = a->be.cache_clear(a->be.ctx, tier, &err);
        if (rc < 0) {
            *status = rc == CAIRN_ERR_UNSUPPORTED ? 400 : 500;
            out = api_error_body(0, *status, NULL, err.msg[0] ? err.msg : cairn_status_str(rc), "tier");
        } else {
            json_t *r = json_pack("{s:s,s:s,s:i}", "status", "ok", "tier", tier, "tiers_cleared", rc);
            out = json_dumps(r, JSON_COMPACT);
            json_decref(r);
            *status = 200;
        }
    }
    json_decref(o);
    return out;
}
