/* tmpl data spans (tmpl_render_chat_spans): which output bytes came from data. Each case
 * renders a template with messages/kwargs and compares the output with its data spans shown
 * as {...} against what the rule in tmpl.h says: context strings are data, template literals
 * and the tokenizer's bos/eos are not, concatenation and captures keep exact spans, any other
 * operation on data makes data. */
#include <jansson.h>

#include "testlib.h"
#include "tmpl/tmpl.h"

/* Renders src with messages [{user, content}], kwargs {"x": x} (+ extra) and bos "<s>"; returns
 * the output with each data span wrapped in {} (malloc'd), or NULL on error. */
static char *render_marked(const char *src, const char *content, const char *x, json_t *extra)
{
    struct cairn_err err = {0};
    struct tmpl *t = NULL;
    int rc = tmpl_compile(src, strlen(src), &t, &err);
    CHECK_MSG(rc == 0, "compile %s: %s", src, err.msg);
    if (rc) return NULL;
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", content);
    json_t *kw = json_pack("{s:s}", "x", x);
    if (extra) json_object_update(kw, extra);
    char *out = NULL;
    size_t len = 0, n_sp = 0;
    struct cairn_span *sp = NULL;
    rc = tmpl_render_chat_spans(t, msgs, NULL, 0, "<s>", NULL, kw, &out, &len, &sp, &n_sp, &err);
    CHECK_MSG(rc == 0, "render %s: %s", src, err.msg);
    char *marked = NULL;
    if (rc == 0) {
        /* the same text as tmpl_render_chat, and well-formed spans */
        char *plain = NULL;
        size_t plen = 0;
        CHECK_EQ_INT(tmpl_render_chat(t, msgs, NULL, 0, "<s>", NULL, kw, &plain, &plen, &err), 0);
        CHECK(plain && plen == len && !memcmp(plain, out, len));
        free(plain);
        marked = malloc(len + 2 * n_sp + 1);
        size_t o = 0, k = 0;
        for (size_t i = 0; i <= len; i++) {
            if (k < n_sp && sp[k].off + sp[k].len == i) {
                marked[o++] = '}';
                k++;
            }
            if (k < n_sp && sp[k].off == i) {
                CHECK(sp[k].len > 0);
                CHECK(k == 0 || sp[k - 1].off + sp[k - 1].len < sp[k].off);
                marked[o++] = '{';
            }
            if (i < len) marked[o++] = out[i];
        }
        marked[o] = 0;
        CHECK_EQ_INT(k, n_sp);
    }
    free(out);
    free(sp);
    json_decref(msgs);
    json_decref(kw);
    tmpl_free(t);
    return marked;
}

static void expect(const char *src, const char *content, const char *x, json_t *extra,
                   const char *want)
{
    char *got = render_marked(src, content, x, extra);
    CHECK_MSG(got && !strcmp(got, want), "%s\n  want [%s]\n  got  [%s]", src, want, got ? got : "(error)");
    free(got);
}

int main(void)
{
    const char *x = "DATA";
    expect("{{ '<|a|>' + x + '<|b|>' }}", "c", x, NULL, "<|a|>{DATA}<|b|>");
    expect("<|a|>{{ x }}<|b|>", "c", x, NULL, "<|a|>{DATA}<|b|>");
    expect("{{ '<|a|>' ~ x ~ 1 ~ '<|b|>' }}", "c", x, NULL, "<|a|>{DATA}1<|b|>");
    expect("{% for m in messages %}<|{{ m.role }}|>{{ m['content'] }}<|end|>{% endfor %}", "hi", x,
           NULL, "<|{user}|>{hi}<|end|>");
    expect("{% set y %}[{{ x }}]{% endset %}{{ y }}{{ y }}", "c", x, NULL, "[{DATA}][{DATA}]");
    expect("{% macro m(v) %}<{{ v }}>{% endmacro %}{{ m(x) }}{{ m('t') }}", "c", x, NULL,
           "<{DATA}><t>");
    expect("{% macro m() %}({{ caller() }}){% endmacro %}{% call m() %}{{ x }}!{% endcall %}",
           "c", x, NULL, "({DATA}!)");
    /* a filter over a mix of data and markup makes it all data (over-reporting is the safe side) */
    expect("{{ (x + '<|c|>') | upper }}|{{ '<|c|>' | upper }}", "c", x, NULL, "{DATA<|C|>}|<|C|>");
    expect("[{{ x | trim }}]", "c", "  DATA ", NULL, "[{DATA}]");
    expect("{{ x.split('T') | join('<|s|>') }}", "c", x, NULL, "{DA<|s|>A}");
    expect("{{ '%s<|e|>' % x }}|{{ '<|e|>%d' % 3 }}", "c", x, NULL, "{DATA<|e|>}|<|e|>3");
    expect("{{ x | tojson }}{{ messages | tojson }}", "c", "D", NULL,
           "{\"D\"[{\"role\": \"user\", \"content\": \"c\"}]}");
    expect("{% for ch in x %}{{ ch }}|{% endfor %}", "c", "ab", NULL, "{a}|{b}|");
    expect("{{ [x] }}{{ [1] }}", "c", x, NULL, "{['DATA']}[1]");
    expect("{{ x * 2 }}", "c", "ab", NULL, "{abab}");
    /* data that only picks among template values leaves them template text */
    expect("{{ {'user': '<|u|>', 'DATA': '<|d|>'}[x] }}{{ {'user': '<|u|>'}[messages[0].role] }}",
           "c", x, NULL, "<|d|><|u|>");
    expect("{% if x == 'DATA' %}<|y|>{% endif %}{{ x | length }}", "c", x, NULL, "<|y|>4");
    /* bos_token is the tokenizer's (template text) unless the caller's kwargs replace it */
    expect("{{ bos_token }}{{ x }}", "c", x, NULL, "<s>{DATA}");
    json_t *kw = json_pack("{s:s}", "bos_token", "<b>");
    expect("{{ bos_token }}{{ x }}", "c", x, kw, "{<b>DATA}");
    json_decref(kw);
    /* namespaces carry data through */
    expect("{% set ns = namespace(v='<|n|>') %}{% set ns.v = ns.v + x %}{{ ns.v }}", "c", x, NULL,
           "<|n|>{DATA}");
    return test_summary("test_tmpl_taint");
}
