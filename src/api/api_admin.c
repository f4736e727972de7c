/* The admin API under /admin/api/ (JSON throughout, OpenAI-style error objects):
 *
 *   GET  models                      every model with its state and memory (and a rescan of the
 *                                    model folder when the last one is 5 s old)
 *   POST models/rescan               look at the model folder now: {"added", "removed", "models"}
 *   GET  models/ID                   one model (ID may be "org/name" or an alias)
 *   POST models/ID/load              start loading (202; poll the state)
 *   POST models/ID/unload            unload an idle model (409 if busy or pinned)
 *   POST models/ID/pin | unpin       set `pinned` in the settings file
 *   GET  settings                    {"path", "settings"}
 *   PUT  settings                    merge a patch (null removes), validated: 400 names the field
 *   GET  cache                       KV cache statistics per model and tier
 *   POST cache/clear                 {"tier": "device" | "hot" | "ssd" | "all"}
 *   GET  stats                       the engine's live statistics (as /api/status)
 *   GET  memory                      the memory guard: budget, holders, state
 *   GET  logs[/AFTER[/LEVEL]]        recent log lines (base/log.h's ring): those after sequence
 *                                    number AFTER, at LEVEL (debug|info|warn|error) or above
 *   GET  bench | POST bench          the benchmark (api_admin_bench.c): state and results; POST
 *                                    starts a run (202), 409 while one runs
 *
 * Auth is the HTTP room's: the API key, and --admin-key when set (http_server.c). Nothing here
 * blocks: loads and unloads run on the model pool's thread. */
#include "api/api_int.h"
#include "base/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *api_admin_err(int *status, int st, const char *code, const char *msg, const char *param)
{
    *status = st;
    return api_error_body(0, st, code, msg, param);
}

char *api_admin_dump(int *status, int st, json_t *o)
{
    *status = st;
    char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return s ? s : api_admin_err(status, 500, NULL, "out of memory", NULL);
}

static char *api_admin_models(struct api *a, const char *method, const char *rest, int *status)
{
    int is_get = !strcmp(method, "GET"), is_post = !strcmp(method, "POST");
    if (!strcmp(rest, "rescan")) {
        if (!is_post) return api_admin_err(status, 405, NULL, "method not allowed: use POST", NULL);
        if (!a->be.admin_rescan) return api_admin_err(status, 501, NULL, "this backend has no model folder", NULL);
        json_t *out = NULL;
        struct cairn_err err = {0};
        int rc = a->be.admin_rescan(a->be.ctx, 1, &out, &err);
        if (rc) return api_admin_err(status, 500, NULL, err.msg[0] ? err.msg : cairn_status_str(rc), NULL);
        return api_admin_dump(status, 200, out);
    }
    if (!*rest) {
        if (!is_get) return api_admin_err(status, 405, NULL, "method not allowed: use GET", NULL);
        return api_admin_dump(status, 200, json_pack("{s:s,s:o}", "object", "list", "data", a->be.admin_models(a->be.ctx)));
    }
    char id[300];
    const char *action = "get";
    snprintf(id, sizeof(id), "%s", rest);
    if (is_post) {
        char *slash = strrchr(id, '/');
        if (!slash) return api_admin_err(status, 404, NULL, "use POST models/ID/load, unload, pin or unpin", NULL);
        *slash = 0;
        action = rest + (slash - id) + 1;
        if (strcmp(action, "load") && strcmp(action, "unload") && strcmp(action, "pin") && strcmp(action, "unpin"))
            return api_admin_err(status, 404, NULL, "unknown action: use load, unload, pin or unpin", NULL);
    } else if (!is_get) {
        return api_admin_err(status, 405, NULL, "method not allowed: use GET, or POST for an action", NULL);
    }
    json_t *out = NULL;
    struct cairn_err err = {0};
    int rc = a->be.admin_model(a->be.ctx, id, action, &out, &err);
    if (rc == CAIRN_ERR_NOT_FOUND) {
        char msg[400];
        snprintf(msg, sizeof(msg), "The model '%.300s' does not exist", id);
        return api_admin_err(status, 404, "model_not_found", msg, "model");
    }
    if (rc == CAIRN_ERR_BUSY) return api_admin_err(status, 409, "model_busy", err.msg, NULL);
    if (rc) return api_admin_err(status, 500, NULL, err.msg[0] ? err.msg : cairn_status_str(rc), NULL);
    return api_admin_dump(status, !strcmp(action, "load") ? 202 : 200, out);
}

static char *api_admin_settings(struct api *a, const char *method, const char *body, size_t len, int *status)
{
    if (!strcmp(method, "GET")) return api_admin_dump(status, 200, a->be.admin_settings_get(a->be.ctx));
    if (strcmp(method, "PUT") && strcmp(method, "PATCH"))
        return api_admin_err(status, 405, NULL, "method not allowed: use GET or PUT", NULL);
    json_error_t je;
    json_t *patch = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!patch) {
        char msg[300];
        snprintf(msg, sizeof(msg), "the body is not valid JSON (line %d: %s)", je.line, je.text);
        return api_admin_err(status, 400, NULL, msg, NULL);
    }
    json_t *changes = NULL;
    char field[300];
    struct cairn_err err = {0};
    int rc = a->be.admin_settings_put(a->be.ctx, patch, &changes, field, sizeof(field), &err);
    json_decref(patch);
    if (rc == CAIRN_ERR_INVALID || rc == CAIRN_ERR_FORMAT)
        return api_admin_err(status, 400, "invalid_setting", err.msg, field[0] ? field : NULL);
    if (rc) return api_admin_err(status, 500, NULL, err.msg[0] ? err.msg : cairn_status_str(rc), NULL);
    json_t *cur = a->be.admin_settings_get(a->be.ctx);
    json_object_set(changes, "settings", json_object_get(cur, "settings"));
    json_decref(cur);
    return api_admin_dump(status, 200, changes);
}

static char *api_admin_cache(struct api *a, int *status)
{
    struct api_model_desc *d = calloc(256, sizeof(*d));
    if (!d) return api_admin_err(status, 503, NULL, "out of memory", NULL);
    int n = a->be.list_models(a->be.ctx, d, 256);
    if (n > 256) n = 256;
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        int idx;
        struct engine_stats st;
        if (!d[i].loaded || !a->be.peek_model || !a->be.peek_model(a->be.ctx, d[i].id, &idx)) continue;
        json_t *m = json_pack("{s:s}", "id", d[i].id);
        if (a->be.stats(a->be.ctx, idx, &st)) {
            double hit = st.n_prefix_lookups ? (double)st.n_prefix_hits / (double)st.n_prefix_lookups : 0.0;
            json_object_set_new(m, "device", json_pack("{s:i,s:i,s:i,s:i,s:I,s:I,s:f,s:I}", "blocks_total", st.n_blocks_total,
                                                       "blocks_used", st.n_blocks_used, "blocks_cached", st.n_blocks_cached,
                                                       "blocks_free", st.n_blocks_free, "evictions", (json_int_t)st.n_evictions,
                                                       "promotions", (json_int_t)st.n_promotions, "prefix_hit_rate", hit,
                                                       "cached_tokens", (json_int_t)st.n_cached_tokens));
        }
        struct kv_tiers_stats ts;
        if (a->be.tier_stats && a->be.tier_stats(a->be.ctx, idx, &ts)) {
            json_object_set_new(m, "hot", json_pack("{s:b,s:I,s:I,s:I,s:I,s:I}", "enabled", ts.hot.enabled, "blocks",
                                                    (json_int_t)ts.hot.n_blocks, "bytes", (json_int_t)ts.hot.n_bytes, "max_bytes",
                                                    (json_int_t)ts.hot.max_bytes, "hits", (json_int_t)ts.hot.n_hits, "misses",
                                                    (json_int_t)ts.hot.n_misses));
            json_object_set_new(m, "ssd", json_pack("{s:b,s:I,s:I,s:I,s:I,s:I}", "enabled", ts.ssd.enabled, "blocks",
                                                    (json_int_t)ts.ssd.n_blocks, "bytes", (json_int_t)ts.ssd.n_bytes, "max_bytes",
                                                    (json_int_t)ts.ssd.max_bytes, "hits", (json_int_t)ts.ssd.n_hits, "misses",
                                                    (json_int_t)ts.ssd.n_misses));
        }
        if (a->be.put_model) a->be.put_model(a->be.ctx, idx);
        json_array_append_new(arr, m);
    }
    free(d);
    return api_admin_dump(status, 200, json_pack("{s:o}", "models", arr));
}

/* GET logs[/AFTER[/LEVEL]]: {"last_seq", "lines": [{"seq", "time", "level", "text"}]}. */
static char *api_admin_logs(const char *rest, int *status)
{
    uint64_t after = 0;
    int level = CAIRN_LOG_DEBUG;
    if (*rest) {
        char *end;
        if (*rest < '0' || *rest > '9') return api_admin_err(status, 400, NULL, "use logs/AFTER (a sequence number)", "after");
        unsigned long long v = strtoull(rest, &end, 10);
        if (*end && *end != '/') return api_admin_err(status, 400, NULL, "use logs/AFTER (a sequence number)", "after");
        after = v;
        if (*end == '/') {
            level = cairn_log_parse_level(end + 1);
            if (level < 0 || level == CAIRN_LOG_OFF)
                return api_admin_err(status, 400, NULL, "level must be debug, info, warn or error", "level");
        }
    }
    struct cairn_log_entry *e = malloc(sizeof(*e) * CAIRN_LOG_RING);
    if (!e) return api_admin_err(status, 503, NULL, "out of memory", NULL);
    uint64_t last = 0;
    int n = cairn_log_recent(after, (enum cairn_log_level)level, e, CAIRN_LOG_RING, &last);
    json_t *arr = json_array();
    for (int i = 0; i < n; i++) {
        json_t *text = json_string(e[i].text); /* NULL: not UTF-8 (a cut multi-byte character) */
        json_array_append_new(arr, json_pack("{s:I,s:f,s:s,s:o}", "seq", (json_int_t)e[i].seq, "time", e[i].t, "level",
                                             cairn_log_level_name(e[i].level), "text",
                                             text ? text : json_string("(a line that is not UTF-8)")));
    }
    free(e);
    return api_admin_dump(status, 200, json_pack("{s:I,s:o}", "last_seq", (json_int_t)last, "lines", arr));
}

char *api_admin_call(struct api *a, const char *method, const char *sub, const char *body, size_t len,
                     int *status)
{
    int is_get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    /* these two need no model pool */
    if (!strcmp(sub, "logs") || !strncmp(sub, "logs/", 5)) {
        if (!is_get) return api_admin_err(status, 405, NULL, "method not allowed: use GET", NULL);
        return api_admin_logs(sub[4] ? sub + 5 : "", status);
    }
    if (!strcmp(sub, "bench")) return api_admin_bench_call(a, method, body, len, status);
    if (!a->be.admin_models || !a->be.admin_model || !a->be.admin_settings_get || !a->be.admin_settings_put)
        return api_admin_err(status, 501, NULL, "this backend has no admin API", NULL);
    if (!strcmp(sub, "models") || !strncmp(sub, "models/", 7))
        return api_admin_models(a, is_get ? "GET" : method, sub[6] ? sub + 7 : "", status);
    if (!strcmp(sub, "settings")) return api_admin_settings(a, is_get ? "GET" : method, body, len, status);
    if (!strcmp(sub, "cache")) {
        if (!is_get) return api_admin_err(status, 405, NULL, "method not allowed: use GET", NULL);
        return api_admin_cache(a, status);
    }
    if (!strcmp(sub, "cache/clear")) {
        if (strcmp(method, "POST")) return api_admin_err(status, 405, NULL, "method not allowed: use POST", NULL);
        return api_info_cache_clear(a, body, len, status);
    }
    if (!strcmp(sub, "stats")) {
        if (!is_get) return api_admin_err(status, 405, NULL, "method not allowed: use GET", NULL);
        return api_info_status(a, status);
    }
    if (!strcmp(sub, "memory")) {
        if (!is_get) return api_admin_err(status, 405, NULL, "method not allowed: use GET", NULL);
        if (!a->be.memory_json) return api_admin_err(status, 501, NULL, "this backend has no memory guard", NULL);
        return api_admin_dump(status, 200, a->be.memory_json(a->be.ctx));
    }
    char msg[300];
    snprintf(msg, sizeof(msg), "no admin route %s /admin/api/%.200s", method, sub);
    return api_admin_err(status, 404, NULL, msg, NULL);
}
