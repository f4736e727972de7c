/* libFuzzer target: settings.json text through api_settings_parse; a document that parses is
 * merged as a patch into a fixed valid one (null removals included), the result re-validated,
 * and looked up. A valid document must stay valid after the merge: anything else aborts. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/settings.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    json_t *doc = NULL;
    char field[300];
    struct cairn_err err;
    if (api_settings_parse((const char *)data, size, &doc, field, sizeof(field), &err) != CAIRN_OK) {
        if (!err.msg[0]) abort(); /* a refusal always says why */
        return 0;
    }
    static const char base_text[] = "{\"global\":{\"temperature\":0.7,\"ttl\":60},"
                                    "\"models\":{\"a\":{\"alias\":\"x\",\"pinned\":true}}}";
    json_t *base = NULL;
    if (api_settings_parse(base_text, sizeof(base_text) - 1, &base, field, sizeof(field), &err) != CAIRN_OK) abort();
    if (api_settings_merge(base, doc, &err) != CAIRN_OK) abort();
    if (api_settings_validate(base, field, sizeof(field), &err) != CAIRN_OK) abort();
    api_settings_lookup(base, "a", "temperature");
    api_settings_lookup(doc, NULL, "ttl");
    json_decref(base);
    json_decref(doc);
    return 0;
}
