/* The per-request speculative-decoding extension field ("speculative": "off" | "ngram" | "auto" | "mtp")
 * in every API that generates: parsed into the typed request, absent = the server's mode, a bad
 * value is a 400 naming the field. */
#include "api/api_req.h"
#include "testlib.h"

static int parse(enum api_kind k, const char *body, struct api_req *r, struct api_req_err *e)
{
    return api_req_parse(k, body, strlen(body), 8, r, e);
}

int main(void)
{
    static const char *const chat =
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]%s}";
    static const char *const compl = "{\"model\":\"m\",\"prompt\":\"hi\"%s}";
    static const char *const msgs = "{\"model\":\"m\",\"max_tokens\":8,\"messages\":[{\"role\":"
                                    "\"user\",\"content\":\"hi\"}]%s}";
    static const char *const resp = "{\"model\":\"m\",\"input\":\"hi\"%s}";
    struct {
        enum api_kind kind;
        const char *fmt;
    } kinds[] = {{API_KIND_CHAT, chat},
                 {API_KIND_COMPLETIONS, compl },
                 {API_KIND_MESSAGES, msgs},
                 {API_KIND_RESPONSES, resp}};
    struct {
        const char *field;
        int want; /* -1: a 400 */
    } cases[] = {
        {"", ENGINE_SPEC_DEFAULT},
        {",\"speculative\":null", ENGINE_SPEC_DEFAULT},
        {",\"speculative\":\"off\"", ENGINE_SPEC_OFF},
        {",\"speculative\":\"ngram\"", ENGINE_SPEC_NGRAM},
        {",\"speculative\":\"auto\"", ENGINE_SPEC_AUTO},
        {",\"speculative\":\"mtp\"", ENGINE_SPEC_MTP},
        {",\"speculative\":\"eagle\"", -1},
        {",\"speculative\":true", -1},
        {",\"speculative\":3", -1},
    };
    for (size_t k = 0; k < CAIRN_ARRAY_LEN(kinds); k++) {
        for (size_t c = 0; c < CAIRN_ARRAY_LEN(cases); c++) {
            char body[512];
            snprintf(body, sizeof(body), kinds[k].fmt, cases[c].field);
            struct api_req r;
            struct api_req_err e;
            int rc = parse(kinds[k].kind, body, &r, &e);
            if (cases[c].want < 0) {
                CHECK_MSG(rc == -1, "accepted: %s", body);
                if (rc == 0) {
                    api_req_free(&r);
                    continue;
                }
                CHECK_EQ_INT(e.status, 400);
                CHECK_EQ_STR(e.param, "speculative");
            } else {
                CHECK_MSG(rc == 0, "%s: %s", body, e.message);
                if (rc) continue;
                CHECK_EQ_INT(r.speculative, cases[c].want);
                api_req_free(&r);
            }
        }
    }
    return test_summary("test_spec_api");
}
