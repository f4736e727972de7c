/* api/settings.c: validation names the field, lookup precedence, merge, a restart (save then
 * load), a corrupt file moved aside with its log line, and two processes writing the file 1,000
 * times each while every read in between finds a valid document. */
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "api/settings.h"
#include "base/file.h"
#include "testlib.h"

static json_t *parse_ok(const char *text)
{
    json_t *o = NULL;
    char field[300];
    struct cairn_err err = {0};
    int rc = api_settings_parse(text, strlen(text), &o, field, sizeof(field), &err);
    CHECK_MSG(rc == CAIRN_OK, "%s: %s", text, err.msg);
    return o;
}

static void check_bad(const char *text, const char *want_field)
{
    json_t *o = NULL;
    char field[300];
    struct cairn_err err = {0};
    int rc = api_settings_parse(text, strlen(text), &o, field, sizeof(field), &err);
    CHECK_MSG(rc != CAIRN_OK && o == NULL, "accepted %s", text);
    CHECK_MSG(!strcmp(field, want_field), "%s: field '%s', want '%s'", text, field, want_field);
    CHECK_MSG(err.msg[0] && strstr(err.msg, want_field[0] ? want_field : "settings"), "%s: message '%s'", text, err.msg);
    json_decref(o);
}

static void test_validate(void)
{
    json_t *o = parse_ok("{\"version\":1,\"global\":{\"temperature\":0.5,\"ttl\":30,\"chat_template_kwargs\":"
                         "{\"enable_thinking\":false}},\"models\":{\"org/m\":{\"alias\":\"m\",\"pinned\":true,"
                         "\"top_k\":4,\"kv_dtype\":\"f32\",\"tiers\":false,\"context_length\":1024}}}");
    json_decref(o);
    json_decref(parse_ok("{}"));
    check_bad("{\"global\":{\"top_k\":-1}}", "global.top_k");
    check_bad("{\"global\":{\"top_k\":1.5}}", "global.top_k");
    check_bad("{\"global\":{\"top_p\":2}}", "global.top_p");
    check_bad("{\"models\":{\"m\":{\"tempreature\":1}}}", "models.m.tempreature");
    check_bad("{\"global\":{\"alias\":\"x\"}}", "global.alias");
    check_bad("{\"models\":{\"m\":{\"kv_dtype\":\"f16\"}}}", "models.m.kv_dtype");
    check_bad("{\"models\":{\"m\":{\"pinned\":1}}}", "models.m.pinned");
    check_bad("{\"models\":{\"m\":{\"chat_template_kwargs\":[]}}}", "models.m.chat_template_kwargs");
    check_bad("{\"models\":[]}", "models");
    check_bad("{\"globals\":{}}", "globals");
    check_bad("{\"version\":2}", "version");
    /* not JSON at all: no field, a message */
    json_t *x = NULL;
    char field[300];
    struct cairn_err err = {0};
    CHECK(api_settings_parse("{nope", 5, &x, field, sizeof(field), &err) == CAIRN_ERR_FORMAT && !x && err.msg[0]);
    CHECK(api_settings_is_live("temperature") && api_settings_is_live("pinned") && !api_settings_is_live("kv_dtype") &&
          !api_settings_is_live("context_length") && !api_settings_is_live("tiers"));
}

static void test_lookup_merge(void)
{
    json_t *o = parse_ok("{\"global\":{\"temperature\":0.5,\"top_k\":7},\"models\":{\"a\":{\"temperature\":0.1}}}");
    CHECK_NEAR(json_number_value(api_settings_lookup(o, "a", "temperature")), 0.1, 1e-9);  /* model wins */
    CHECK_EQ_INT(json_integer_value(api_settings_lookup(o, "a", "top_k")), 7);            /* then global */
    CHECK_NEAR(json_number_value(api_settings_lookup(o, "b", "temperature")), 0.5, 1e-9);
    CHECK(api_settings_lookup(o, "a", "min_p") == NULL);
    json_t *patch = parse_ok("{\"models\":{\"b\":{\"top_k\":3}}}");
    json_object_set_new(json_object_get(patch, "models"), "a", json_null()); /* null removes a */
    json_object_set_new(patch, "global", json_pack("{s:n}", "top_k"));
    struct cairn_err err = {0};
    CHECK(api_settings_merge(o, patch, &err) == CAIRN_OK);
    CHECK_NEAR(json_number_value(api_settings_lookup(o, "a", "temperature")), 0.5, 1e-9);
    CHECK(api_settings_lookup(o, "a", "top_k") == NULL);
    CHECK_EQ_INT(json_integer_value(api_settings_lookup(o, "b", "top_k")), 3);
    char field[300];
    CHECK(api_settings_validate(o, field, sizeof(field), &err) == CAIRN_OK);
    json_decref(patch);
    json_decref(o);
}

static int count_prefix(const char *dir, const char *prefix)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (!strncmp(de->d_name, prefix, strlen(prefix))) n++;
    if (d) closedir(d);
    return n;
}

static void test_restart_and_corrupt(const char *dir)
{
    char path[600], p2[700];
    snprintf(path, sizeof(path), "%s/sub/settings.json", dir);
    struct cairn_err err = {0};
    json_t *o = NULL;
    CHECK(api_settings_load(path, &o, &err) == CAIRN_OK && json_is_object(o) && json_object_size(o) == 0);
    json_decref(o);
    o = parse_ok("{\"models\":{\"a\":{\"alias\":\"alpha\",\"top_k\":5}}}");
    CHECK_MSG(api_settings_save(path, o, &err) == CAIRN_OK, "%s", err.msg); /* creates sub/ */
    json_t *back = NULL;
    CHECK(api_settings_load(path, &back, &err) == CAIRN_OK);
    CHECK_EQ_STR(json_string_value(api_settings_lookup(back, "a", "alias")), "alpha");
    CHECK(json_equal(o, back));
    json_decref(o);
    json_decref(back);
    snprintf(p2, sizeof(p2), "%s/sub", dir);
    CHECK_EQ_INT(count_prefix(p2, "settings.json.tmp"), 0);

    /* corrupt: moved aside, logged, defaults */
    const char *junk = "{\"models\": {\"a\": ";
    CHECK(cairn_file_write_atomic(path, junk, strlen(junk), &err) == CAIRN_OK);
    char logp[700];
    snprintf(logp, sizeof(logp), "%s/log.txt", dir);
    fflush(stderr);
    int saved = dup(2), fd = open(logp, O_CREAT | O_TRUNC | O_WRONLY, 0644);
    dup2(fd, 2);
    close(fd);
    int rc = api_settings_load(path, &back, &err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    CHECK(rc == CAIRN_OK && json_is_object(back) && json_object_size(back) == 0);
    json_decref(back);
    CHECK(!cairn_file_exists(path));
    CHECK_EQ_INT(count_prefix(p2, "settings.json.corrupt-"), 1);
    char *log = NULL, *aside = NULL;
    size_t n;
    CHECK(cairn_file_read_all(logp, 1 << 20, &log, &n, &err) == CAIRN_OK);
    CHECK_MSG(log && strstr(log, "malformed") && strstr(log, "moved to") && strstr(log, ".corrupt-"), "log: %s", log ? log : "");
    /* the moved file keeps the user's bytes */
    DIR *d = opendir(p2);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, "settings.json.corrupt-", 22)) continue;
        char ap[1200]; /* p2 (up to 900) + "/" + a d_name (up to 255) */
        snprintf(ap, sizeof(ap), "%s/%s", p2, de->d_name);
        cairn_file_read_all(ap, 1 << 20, &aside, &n, &err);
    }
    if (d) closedir(d);
    CHECK(aside && !strcmp(aside, junk));
    free(aside);
    free(log);
}

/* Writer process: 1,000 saves of its own document; after each, the file must parse. */
static int writer(const char *path, int who)
{
    struct cairn_err err = {0};
    int bad = 0;
    for (int i = 0; i < 1000 && !bad; i++) {
        json_t *o = json_pack("{s:{s:{s:i,s:s}}}", "models", who ? "b" : "a", "top_k", i, "alias",
                              who ? "writer-b-with-a-longer-alias-than-a" : "wa");
        if (api_settings_save(path, o, &err) != CAIRN_OK) bad = 1;
        json_decref(o);
        char *text = NULL;
        size_t n;
        json_t *back = NULL;
        char field[300];
        if (cairn_file_read_all(path, 1 << 20, &text, &n, &err) != CAIRN_OK ||
            api_settings_parse(text, n, &back, field, sizeof(field), &err) != CAIRN_OK)
            bad = 2;
        json_decref(back);
        free(text);
    }
    return bad;
}

static void test_two_writers(const char *dir)
{
    char path[600];
    snprintf(path, sizeof(path), "%s/race/settings.json", dir);
    pid_t kids[2];
    for (int k = 0; k < 2; k++) {
        kids[k] = fork();
        if (kids[k] == 0) _exit(writer(path, k));
    }
    for (int k = 0; k < 2; k++) {
        int st = 0;
        waitpid(kids[k], &st, 0);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "writer %d: status %d", k, st);
    }
    json_t *o = NULL;
    struct cairn_err err = {0};
    char *text = NULL;
    size_t n;
    char field[300];
    CHECK(cairn_file_read_all(path, 1 << 20, &text, &n, &err) == CAIRN_OK);
    CHECK(text && api_settings_parse(text, n, &o, field, sizeof(field), &err) == CAIRN_OK);
    CHECK(o && json_integer_value(api_settings_lookup(o, json_object_get(json_object_get(o, "models"), "a") ? "a" : "b",
                                                      "top_k")) == 999);
    json_decref(o);
    free(text);
    char race[600];
    snprintf(race, sizeof(race), "%s/race", dir);
    CHECK_EQ_INT(count_prefix(race, "settings.json.tmp"), 0);
}

static void rm_rf(const char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", dir);
}

int main(void)
{
    char dir[] = "/tmp/cairn-settings-test.XXXXXX";
    if (!mkdtemp(dir)) return 1;
    test_validate();
    test_lookup_merge();
    test_restart_and_corrupt(dir);
    /* the race runs on tmpfs when there is one: rename is as atomic there and 4,000 fsyncs of a
     * disk would take most of the test's time budget (the disk path is covered above) */
    char shm[] = "/dev/shm/cairn-settings-race.XXXXXX";
    int on_shm = cairn_dir_exists("/dev/shm") && mkdtemp(shm);
    test_two_writers(on_shm ? shm : dir);
    if (on_shm) rm_rf(shm);
    rm_rf(dir);
    return test_summary("test_settings");
}
