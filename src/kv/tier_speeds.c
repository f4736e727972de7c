/* The run-time speeds of kv_tier.h kept in the SSD tier's folder, one small JSON file per model
 * and device: <ssd_dir>/speeds-<first 8 bytes of the model identity, hex>-<device>.json, e.g.
 *   {"prefill_tokens_per_s": 12230.5, "hot_read_bytes_per_s": 9.1e9, "ssd_read_bytes_per_s": 1.0e9}
 * Written with cairn_file_write_atomic (temp, fsync, rename, fsync of the folder); a missing,
 * damaged or foreign file reads as "none" (the choice then restores, as without it). The SSD
 * scan leaves speeds-* files alone (tier_ssd_scan.c). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/file.h"
#include "base/log.h"
#include "kv/tier_int.h"

#define SPEEDS_MAX_BYTES 4096

/* path of the file, or 0 when there is no SSD folder or the name does not fit */
static int speeds_path(const char *dir, const uint8_t identity[32], const char *device, char *buf, size_t n)
{
    if (!dir || !*dir || !device) return 0;
    char dev[32];
    size_t j = 0;
    for (size_t i = 0; device[i] && j + 1 < sizeof(dev); i++) /* "cuda:0" -> "cuda0" */
        if ((device[i] >= 'a' && device[i] <= 'z') || (device[i] >= '0' && device[i] <= '9')) dev[j++] = device[i];
    dev[j] = 0;
    if (!j) return 0;
    int len = snprintf(buf, n, "%s/speeds-%02x%02x%02x%02x%02x%02x%02x%02x-%s.json", dir, identity[0], identity[1],
                       identity[2], identity[3], identity[4], identity[5], identity[6], identity[7], dev);
    return len > 0 && (size_t)len < n;
}

static double speeds_get(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    double x = json_is_number(v) ? json_number_value(v) : 0;
    return isfinite(x) && x > 0 ? x : 0;
}

int kv_tier_speeds_load(const char *dir, const uint8_t identity[32], const char *device, struct kv_tier_speeds *sp)
{
    char path[4096];
    memset(sp, 0, sizeof(*sp));
    if (!speeds_path(dir, identity, device, path, sizeof(path)) || !cairn_file_exists(path)) return 0;
    char *text = NULL;
    size_t len = 0;
    struct cairn_err err = {0};
    if (cairn_file_read_all(path, SPEEDS_MAX_BYTES, &text, &len, &err) != CAIRN_OK) {
        LOG_WARN("kv", "tier speeds: %s", err.msg);
        return 0;
    }
    json_error_t je;
    json_t *o = json_loadb(text, len, 0, &je);
    free(text);
    if (!json_is_object(o)) {
        LOG_WARN("kv", "tier speeds: %s is not a JSON object: ignored", path);
        json_decref(o);
        return 0;
    }
    sp->prefill_tok_s = speeds_get(o, "prefill_tokens_per_s");
    sp->fast_bps = speeds_get(o, "hot_read_bytes_per_s");
    sp->slow_bps = speeds_get(o, "ssd_read_bytes_per_s");
    json_decref(o);
    return sp->prefill_tok_s > 0 || sp->fast_bps > 0 || sp->slow_bps > 0;
}

void kv_tier_speeds_save(const char *dir, const uint8_t identity[32], const char *device,
                         const struct kv_tier_speeds *sp)
{
    char path[4096];
    if (!speeds_path(dir, identity, device, path, sizeof(path))) return;
    if (!(sp->prefill_tok_s > 0 || sp->fast_bps > 0 || sp->slow_bps > 0)) return; /* nothing measured */
    json_t *o = json_pack("{s:f,s:f,s:f}", "prefill_tokens_per_s", sp->prefill_tok_s, "hot_read_bytes_per_s",
                          sp->fast_bps, "ssd_read_bytes_per_s", sp->slow_bps);
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) return;
    struct cairn_err err = {0};
    if (cairn_file_write_atomic(path, text, strlen(text), &err) != CAIRN_OK)
        LOG_WARN("kv", "tier speeds not kept: %s", err.msg);
    free(text);
}
