/* settings.json: paths, validation against one table of keys, load (corrupt files moved aside),
 * crash-safe save, merge and lookup. See settings.h. */
#include "api/settings.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/file.h"
#include "base/log.h"

#define SETTINGS_MAX_BYTES (4u << 20)

enum settings_type { SET_NUMBER, SET_INT, SET_BOOL, SET_STRING, SET_OBJECT, SET_DTYPE };

static const struct settings_key {
    const char *name;
    enum settings_type type;
    double lo, hi;  /* numbers and integers */
    int live;       /* applies without a reload */
    int per_model;  /* only in a model's entry */
} settings_keys[] = {
    {"temperature", SET_NUMBER, 0, 100, 1, 0},
    {"top_p", SET_NUMBER, 0, 1, 1, 0},
    {"min_p", SET_NUMBER, 0, 1, 1, 0},
    {"repetition_penalty", SET_NUMBER, 0, 100, 1, 0},
    {"top_k", SET_INT, 0, 1e9, 1, 0},
    {"context_length", SET_INT, 16, 1e9, 0, 0},
    {"ttl", SET_NUMBER, 0, 1e9, 1, 0},
    {"pinned", SET_BOOL, 0, 0, 1, 0},
    {"alias", SET_STRING, 0, 0, 1, 1},
    {"chat_template_kwargs", SET_OBJECT, 0, 0, 1, 0},
    {"kv_dtype", SET_DTYPE, 0, 0, 0, 0},
    {"tiers", SET_BOOL, 0, 0, 0, 0},
    /* the stall watchdog's bound on device waits (--step-timeout), global: read at start */
    {"step_timeout", SET_NUMBER, 0.001, 1e6, 0, 0},
    /* true: control-token text inside messages becomes control tokens, as before issue 19's
     * fix (injectable: only for clients that rely on it); default false */
    {"special_tokens_in_content", SET_BOOL, 0, 0, 1, 0},
};

static const struct settings_key *settings_key_find(const char *name)
{
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(settings_keys); i++)
        if (!strcmp(settings_keys[i].name, name)) return &settings_keys[i];
    return NULL;
}

int api_settings_is_live(const char *key)
{
    const struct settings_key *k = settings_key_find(key);
    return k ? k->live : 0;
}

int api_settings_path(const char *flag, char *out, size_t cap, struct cairn_err *err)
{
    const char *home = getenv("CAIRN_HOME");
    if (flag && *flag) snprintf(out, cap, "%s", flag);
    else if (home && *home) snprintf(out, cap, "%s/settings.json", home);
    else if ((home = getenv("HOME")) && *home) snprintf(out, cap, "%s/.cairn/settings.json", home);
    else return cairn_err_set(err, CAIRN_ERR_NOT_FOUND, "settings: set HOME, CAIRN_HOME or --settings");
    return CAIRN_OK;
}

/* One SETTINGS object; prefix is "global" or "models.ID". */
static int settings_check_entry(json_t *o, const char *prefix, int is_model, char *field, size_t cap,
                                struct cairn_err *err)
{
    if (!json_is_object(o)) {
        snprintf(field, cap, "%s", prefix);
        return cairn_err_set(err, CAIRN_ERR_INVALID, "%s must be an object", prefix);
    }
    const char *name;
    json_t *v;
    json_object_foreach(o, name, v) {
        snprintf(field, cap, "%s.%s", prefix, name);
        const struct settings_key *k = settings_key_find(name);
        if (!k) return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: unknown setting", field);
        if (k->per_model && !is_model)
            return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: only a model's entry may set it", field);
        switch (k->type) {
        case SET_NUMBER:
        case SET_INT: {
            if (!json_is_number(v) || (k->type == SET_INT && !json_is_integer(v)))
                return cairn_err_set(err, CAIRN_ERR_INVALID, "%s must be %s", field,
                                     k->type == SET_INT ? "an integer" : "a number");
            double d = json_number_value(v);
            if (!isfinite(d) || d < k->lo || d > k->hi)
                return cairn_err_set(err, CAIRN_ERR_INVALID, "%s must be in [%g, %g]", field, k->lo, k->hi);
            break;
        }
        case SET_BOOL:
            if (!json_is_boolean(v)) return cairn_err_set(err, CAIRN_ERR_INVALID, "%s must be true or false", field);
            break;
        case SET_STRING:
            if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) > 200)
                return cairn_err_set(err, CAIRN_ERR_INVALID, "%s must be a string of 1 to 200 bytes", field);
            break;
        case SET_OBJECT:
            if (!json_is_object(v)) return cairn_err_set(err, CAIRN_ERR_INVALID, "%s must be an object", field);
            break;
        case SET_DTYPE:
            if (!json_is_string(v) || (strcmp(json_string_value(v), "bf16") && strcmp(json_string_value(v), "f32")))
                return cairn_err_set(err, CAIRN_ERR_INVALID, "%s must be \"bf16\" or \"f32\"", field);
            break;
        }
    }
    field[0] = 0;
    return CAIRN_OK;
}

int api_settings_validate(json_t *root, char *field, size_t cap, struct cairn_err *err)
{
    field[0] = 0;
    if (!json_is_object(root)) return cairn_err_set(err, CAIRN_ERR_INVALID, "settings must be a JSON object");
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        if (!strcmp(name, "version")) {
            if (!json_is_integer(v) || json_integer_value(v) != 1) {
                snprintf(field, cap, "version");
                return cairn_err_set(err, CAIRN_ERR_INVALID, "version must be 1");
            }
        } else if (!strcmp(name, "global")) {
            int rc = settings_check_entry(v, "global", 0, field, cap, err);
            if (rc) return rc;
        } else if (!strcmp(name, "models")) {
            if (!json_is_object(v)) {
                snprintf(field, cap, "models");
                return cairn_err_set(err, CAIRN_ERR_INVALID, "models must be an object of model ids");
            }
            const char *id;
            json_t *m;
            json_object_foreach(v, id, m) {
                char prefix[300];
                snprintf(prefix, sizeof(prefix), "models.%.280s", id);
                int rc = settings_check_entry(m, prefix, 1, field, cap, err);
                if (rc) return rc;
            }
        } else {
            snprintf(field, cap, "%.200s", name);
            return cairn_err_set(err, CAIRN_ERR_INVALID, "%s: unknown key (expected version, global, models)", field);
        }
    }
    return CAIRN_OK;
}

int api_settings_parse(const char *text, size_t len, json_t **out, char *field, size_t cap,
                       struct cairn_err *err)
{
    *out = NULL;
    field[0] = 0;
    json_error_t je;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
    if (!root) return cairn_err_set(err, CAIRN_ERR_FORMAT, "settings: bad JSON at line %d: %s", je.line, je.text);
    int rc = api_settings_validate(root, field, cap, err);
    if (rc) {
        json_decref(root);
        return rc;
    }
    *out = root;
    return CAIRN_OK;
}

int api_settings_load(const char *path, json_t **out, struct cairn_err *err)
{
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    struct cairn_err e2 = {0};
    int rc = cairn_file_read_all(path, SETTINGS_MAX_BYTES, &text, &len, &e2);
    if (rc && !cairn_file_exists(path)) {
        *out = json_object();
        return *out ? CAIRN_OK : cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
    }
    char field[300];
    if (rc == CAIRN_OK) rc = api_settings_parse(text, len, out, field, sizeof(field), &e2);
    free(text);
    if (rc == CAIRN_OK) return CAIRN_OK;
    if (rc == CAIRN_ERR_IO) return cairn_err_set(err, rc, "%s", e2.msg);
    /* malformed (or too large): keep it for the user, start from defaults */
    char aside[1200], stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof(stamp), "%Y%m%dT%H%M%SZ", &tm);
    snprintf(aside, sizeof(aside), "%s.corrupt-%s", path, stamp);
    if (rename(path, aside) != 0)
        LOG_ERROR("settings", "%s is malformed (%s) and cannot be moved aside: %s; using defaults", path,
                  e2.msg, strerror(errno));
    else
        LOG_WARN("settings", "%s is malformed (%s): moved to %s, using defaults", path, e2.msg, aside);
    *out = json_object();
    return *out ? CAIRN_OK : cairn_err_set(err, CAIRN_ERR_NOMEM, "out of memory");
}

int api_settings_save(const char *path, json_t *root, struct cairn_err *err)
{
    char dir[1100];
    snprintf(dir, sizeof(dir), "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        int rc = cairn_mkdir_p(dir, err);
        if (rc) return rc;
    }
    if (!json_object_get(root, "version")) json_object_set_new(root, "version", json_integer(1));
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (!text) return cairn_err_set(err, CAIRN_ERR_NOMEM, "settings: out of memory");
    size_t n = strlen(text);
    text[n] = 0;
    int rc = cairn_file_write_atomic(path, text, n, err);
    free(text);
    return rc;
}

/* Merges one SETTINGS patch object into dst (null removes). */
static void settings_merge_entry(json_t *dst, json_t *patch)
{
    const char *k;
    json_t *v;
    json_object_foreach(patch, k, v) {
        if (json_is_null(v)) json_object_del(dst, k);
        else json_object_set(dst, k, v);
    }
}

static json_t *settings_child(json_t *o, const char *key)
{
    json_t *c = json_object_get(o, key);
    if (!json_is_object(c)) {
        c = json_object();
        json_object_set_new(o, key, c);
    }
    return c;
}

int api_settings_merge(json_t *root, json_t *patch, struct cairn_err *err)
{
    if (!json_is_object(patch)) return cairn_err_set(err, CAIRN_ERR_INVALID, "settings must be a JSON object");
    json_t *g = json_object_get(patch, "global");
    if (json_is_object(g)) settings_merge_entry(settings_child(root, "global"), g);
    json_t *ms = json_object_get(patch, "models");
    if (json_is_object(ms)) {
        json_t *dst = settings_child(root, "models");
        const char *id;
        json_t *m;
        json_object_foreach(ms, id, m) {
            if (json_is_null(m)) {
                json_object_del(dst, id);
                continue;
            }
            settings_merge_entry(settings_child(dst, id), m);
            if (json_object_size(json_object_get(dst, id)) == 0) json_object_del(dst, id);
        }
    }
    return CAIRN_OK;
}

json_t *api_settings_lookup(json_t *root, const char *model, const char *key)
{
    json_t *v = NULL;
    if (model) v = json_object_get(json_object_get(json_object_get(root, "models"), model), key);
    if (!v) v = json_object_get(json_object_get(root, "global"), key);
    return v;
}
