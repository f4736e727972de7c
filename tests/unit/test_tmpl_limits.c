/* tmpl hostile templates: each limit (steps, output bytes, memory, call depth, parse depth,
 * native nesting) triggers with CAIRN_ERR_LIMIT and a clear message; nothing crashes or hangs.
 * Also: a render of a compiled template from several threads at once gives identical output. */
#include <jansson.h>
#include <pthread.h>

#include "base/file.h"
#include "testlib.h"
#include "tmpl/tmpl.h"

static struct tmpl_limits tight(void)
{
    struct tmpl_limits l = tmpl_limits_default();
    l.max_steps = 2u * 1000 * 1000;
    l.max_output_bytes = 1u << 20;
    l.max_memory_bytes = 32u << 20;
    l.max_call_depth = 32;
    return l;
}

/* Renders src; expects status `want` and (if want != 0) `needle` in the message. */
static void expect(const char *src, int want, const char *needle)
{
    struct tmpl *t = NULL;
    struct cairn_err err = {0};
    json_t *ctx = json_pack("{s:s,s:[i,i,i]}", "big", "x", "nums", 1, 2, 3);
    int rc = tmpl_compile(src, strlen(src), &t, &err);
    char *out = NULL;
    size_t n = 0;
    if (rc == 0) {
        struct tmpl_limits l = tight();
        double t0 = cairn_now();
        rc = tmpl_render(t, ctx, &l, &out, &n, &err);
        double dt = cairn_now() - t0;
        CHECK_MSG(dt < 20.0, "render took %.1f s: %.60s", dt, src);
    }
    CHECK_MSG(rc == want, "rc %d (want %d) for %.80s: %s", rc, want, src, err.msg);
    if (want) {
        CHECK(out == NULL);
        CHECK_MSG(strstr(err.msg, needle) != NULL, "message '%s' lacks '%s' (%.80s)", err.msg, needle, src);
    }
    free(out);
    tmpl_free(t);
    json_decref(ctx);
}

static char *repeat(const char *head, const char *unit, size_t n, const char *tail)
{
    size_t hl = strlen(head), ul = strlen(unit), tl = strlen(tail);
    char *s = malloc(hl + ul * n + tl + 1);
    memcpy(s, head, hl);
    for (size_t i = 0; i < n; i++) memcpy(s + hl + i * ul, unit, ul);
    memcpy(s + hl + ul * n, tail, tl + 1);
    return s;
}

static void test_limits(void)
{
    /* steps */
    expect("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", CAIRN_ERR_LIMIT, "steps");
    expect("{% set ns = namespace(n=0) %}{% for i in range(100000) %}{% for j in range(100000) %}{% set ns.n = ns.n + 1 %}{% endfor %}{% endfor %}", CAIRN_ERR_LIMIT, "steps");
    /* output */
    expect("{% for i in range(100000) %}{{ 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxx' }}{% endfor %}", CAIRN_ERR_LIMIT, "output");
    expect("{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}", CAIRN_ERR_LIMIT, "");
    expect("{{ 'x' * 1000000000000 }}", CAIRN_ERR_LIMIT, "");
    expect("{{ 'ab'|center(1000000000) }}", CAIRN_ERR_LIMIT, "");
    /* memory: quadratic list growth */
    expect("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i, i, i, i] %}{% endfor %}{{ ns.l|length }}", CAIRN_ERR_LIMIT, "memory");
    expect("{{ [1] * 1000000000000 }}", CAIRN_ERR_LIMIT, "");
    expect("{{ range(10000000000) }}", CAIRN_ERR_LIMIT, "Range too big");
    /* call depth */
    expect("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", CAIRN_ERR_LIMIT, "macro calls nested too deeply");
    expect("{% macro f() %}{% call f() %}{{ caller() }}{% endcall %}{% endmacro %}{{ f() }}", CAIRN_ERR_LIMIT, "nested too deeply");
    /* parse depth */
    char *s = repeat("{{ ", "(", 5000, "1");
    char *s2 = repeat(s, ")", 5000, " }}");
    expect(s2, CAIRN_ERR_LIMIT, "nested too deeply");
    free(s);
    free(s2);
    s = repeat("", "{% if true %}", 1000, "x");
    expect(s, CAIRN_ERR_LIMIT, "nested too deeply");
    free(s);
    s = repeat("{{ ", "not ", 100000, "1 }}");
    expect(s, CAIRN_ERR_LIMIT, "nested too deeply");
    free(s);
    s = repeat("{{ ", "-", 100000, "1 }}");
    expect(s, CAIRN_ERR_LIMIT, "nested too deeply");
    free(s);
    s = repeat("{{ ", "[", 100000, "");
    expect(s, CAIRN_ERR_LIMIT, "nested too deeply");
    free(s);
    /* long flat chains parse fine but nest at run time: bounded by the native depth guard */
    s = repeat("{{ 1", " + 1", 100000, " }}");
    expect(s, CAIRN_ERR_LIMIT, "nested too deeply");
    free(s);
    s = repeat("{{ 'a'", "|upper", 100000, " }}");
    expect(s, CAIRN_ERR_LIMIT, "nested too deeply");
    free(s);
    s = repeat("{% filter upper", "|lower", 100000, " %}x{% endfilter %}");
    expect(s, CAIRN_ERR_LIMIT, "nested too deeply");
    free(s);
    s = repeat("{% macro m() %}{{ 1", " + 1", 200000, " }}{% endmacro %}{{ m() }}");
    expect(s, CAIRN_ERR_LIMIT, "nested too deeply");
    free(s);
    s = repeat("{{ x", ".a", 100000, " }}");
    expect(s, CAIRN_ERR_LIMIT, "nested too deeply");
    free(s);
    s = repeat("{{ 1 if ", "x or ", 100000, "y }}");
    expect(s, CAIRN_ERR_LIMIT, "nested too deeply");
    free(s);
    /* arithmetic edges: no hang, no UB */
    expect("{{ '' * 1000000000000000000 }}{{ [] * 1000000000000000000 }}|", 0, "");
    expect("{{ range(-9223372036854775807, 9223372036854775807, 4611686018427387904)|list }}", CAIRN_ERR_UNSUPPORTED, "overflow");
    expect("{{ nums[::9223372036854775807] }}{{ nums[::-9223372036854775807] }}{{ big[::-9223372036854775807 - 1] }}", 0, "");
    expect("{{ 9223372036854775807 + 1 }}", CAIRN_ERR_UNSUPPORTED, "overflow");
    expect("{{ -9223372036854775807 - 1 - 1 }}", CAIRN_ERR_UNSUPPORTED, "overflow");
    expect("{{ 3 ** 100 }}", CAIRN_ERR_UNSUPPORTED, "overflow");
    expect("{{ (-9223372036854775807 - 1) // -1 }}", CAIRN_ERR_UNSUPPORTED, "overflow");
    expect("{{ 1 // 0 }}", CAIRN_ERR_INVALID, "zero");
    /* a modest chain still works */
    s = repeat("{{ 1", " + 1", 200, " }}");
    expect(s, 0, "");
    free(s);
    /* deeply nested values built at run time: printing / tojson / compare stay bounded */
    expect("{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}", CAIRN_ERR_LIMIT, "nested too deeply");
    expect("{% set ns = namespace(l=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l|tojson }}", CAIRN_ERR_LIMIT, "nested too deeply");
    expect("{% set ns = namespace(l=[], m=[]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% set ns.m = [ns.m] %}{% endfor %}{{ ns.l == ns.m }}{{ ns.l in [ns.m] }}", 0, "");
    expect("{% set ns = namespace(l=[0], m=[1]) %}{% for i in range(5000) %}{% set ns.l = [ns.l] %}{% set ns.m = [ns.m] %}{% endfor %}{{ ns.l < ns.m }}", CAIRN_ERR_LIMIT, "nested too deeply");
    /* huge source */
    size_t big = TMPL_MAX_SOURCE_BYTES + 1;
    char *src = malloc(big);
    memset(src, 'a', big);
    struct tmpl *t = NULL;
    struct cairn_err err = {0};
    CHECK_EQ_INT(tmpl_compile(src, big, &t, &err), CAIRN_ERR_LIMIT);
    free(src);
    /* big string work is charged: 'in' on a 1 MiB string inside a long loop hits steps fast */
    expect("{% set b = 'x' * 1000000 %}{% for i in range(100000) %}{% if 'y' in b %}{% endif %}{% endfor %}", CAIRN_ERR_LIMIT, "steps");
}

/* deeply nested JSON context */
static void test_deep_context(void)
{
    json_t *root = json_array(), *cur = root;
    for (int i = 0; i < 10000; i++) {
        json_t *n = json_array();
        json_array_append_new(cur, n);
        cur = n;
    }
    json_t *ctx = json_pack("{s:o}", "deep", root);
    struct tmpl *t = NULL;
    struct cairn_err err = {0};
    CHECK_EQ_INT(tmpl_compile("{{ deep|length }}", 17, &t, &err), 0);
    char *out = NULL;
    size_t n;
    CHECK_EQ_INT(tmpl_render(t, ctx, NULL, &out, &n, &err), CAIRN_ERR_LIMIT);
    free(out);
    tmpl_free(t);
    json_decref(ctx);
}

struct thr_arg {
    const struct tmpl *t;
    json_t *ctx;
    const char *expect;
    int ok;
};

static void *thr_main(void *p)
{
    struct thr_arg *a = p;
    a->ok = 1;
    for (int i = 0; i < 50; i++) {
        char *out = NULL;
        size_t n;
        struct cairn_err err = {0};
        if (tmpl_render(a->t, a->ctx, NULL, &out, &n, &err) != 0 || strcmp(out, a->expect) != 0) a->ok = 0;
        free(out);
    }
    return NULL;
}

static void test_threads(void)
{
    const char *src = "{% set ns = namespace(s='') %}{% for m in messages %}{% set ns.s = ns.s ~ m.content|upper %}{% endfor %}{{ ns.s }}{{ messages|tojson }}";
    struct tmpl *t = NULL;
    struct cairn_err err = {0};
    CHECK_EQ_INT(tmpl_compile(src, strlen(src), &t, &err), 0);
    json_t *ctx = json_pack("{s:[{s:s},{s:s}]}", "messages", "content", "ab", "content", "cd");
    char *ref = NULL;
    size_t n;
    CHECK_EQ_INT(tmpl_render(t, ctx, NULL, &ref, &n, &err), 0);
    CHECK_EQ_STR(ref, "ABCD[{\"content\": \"ab\"}, {\"content\": \"cd\"}]");
    pthread_t th[4];
    struct thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct thr_arg){.t = t, .ctx = ctx, .expect = ref};
        pthread_create(&th[i], NULL, thr_main, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(args[i].ok);
    }
    free(ref);
    tmpl_free(t);
    json_decref(ctx);
}

int main(void)
{
    test_limits();
    test_deep_context();
    test_threads();
    return test_summary("test_tmpl_limits");
}
