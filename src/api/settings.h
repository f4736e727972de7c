/* Durable settings: settings.json, global and per model, validated, written crash-safely.
 *
 * Where: --settings FILE, else $CAIRN_HOME/settings.json, else ~/.cairn/settings.json.
 * Shape (every key optional; unknown keys are an error that names them):
 *
 *   {"version": 1,
 *    "global": {SETTINGS},
 *    "models": {"MODEL-ID": {SETTINGS}, ...}}
 *
 *   SETTINGS: temperature, top_p, min_p, repetition_penalty (numbers), top_k (integer >= 0),
 *             context_length (integer >= 16), ttl (seconds, >= 0, 0 = never unload),
 *             pinned (bool), alias (string, per model only), chat_template_kwargs (object,
 *             e.g. {"enable_thinking": false}), kv_dtype ("bf16" | "f32"), tiers (bool: use the
 *             hot/SSD KV tiers for this model).
 *
 * Precedence, per key: the request > the model's entry > "global" > the model's
 * generation_config.json; a command-line flag for a key wins over the file for that run.
 * Sampling keys, ttl, pinned, alias and chat_template_kwargs apply at once; context_length,
 * kv_dtype and tiers at the model's next load (api_settings_is_live says which).
 *
 * Writes: cairn_file_write_atomic (per-process temp file, fsync, rename, fsync of the folder), so
 * two servers writing at once leave one valid file. A malformed file is moved aside to
 * NAME.corrupt-<UTC timestamp> with a log line, and defaults are used.
 *
 * Not thread-safe by itself: the model pool holds its lock around these calls. */
#ifndef CAIRN_API_SETTINGS_H
#define CAIRN_API_SETTINGS_H

#include <stddef.h>

#include <jansson.h>

#include "base/status.h"

/* Resolves the settings path (flag may be NULL). Returns CAIRN_OK, or CAIRN_ERR_NOT_FOUND when
 * neither CAIRN_HOME nor HOME is set. */
int api_settings_path(const char *flag, char *out, size_t cap, struct cairn_err *err);

/* Validates a settings document. On error, field names the offending key ("models.m.top_k") and
 * err says why. */
int api_settings_validate(json_t *root, char *field, size_t field_cap, struct cairn_err *err);
/* Parses and validates text. *out is a new reference (caller decrefs). */
int api_settings_parse(const char *text, size_t len, json_t **out, char *field, size_t field_cap,
                       struct cairn_err *err);
/* Reads path: a missing file gives an empty document; a malformed one is moved aside (logged)
 * and gives an empty document too. Fails only on I/O errors other than "missing". */
int api_settings_load(const char *path, json_t **out, struct cairn_err *err);
/* Writes the document crash-safely (creates the folder if needed). */
int api_settings_save(const char *path, json_t *root, struct cairn_err *err);
/* Merges patch into root ({"global": {...}, "models": {"id": {...}}}; a null value removes the
 * key, a null model entry removes the model). Both must be valid; so is the result. */
int api_settings_merge(json_t *root, json_t *patch, struct cairn_err *err);

/* The value of key for model (its entry first, then "global"), borrowed; NULL when unset.
 * model may be NULL (global only). */
json_t *api_settings_lookup(json_t *root, const char *model, const char *key);
/* 1 if a change of key applies without reloading the model. */
int api_settings_is_live(const char *key);

#endif
