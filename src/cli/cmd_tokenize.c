/* cairn tokenize DIR / cairn detokenize DIR: JSON-lines front ends of the tok room.
 *   tokenize:   stdin {"text": "...", "add_special_tokens": true|false} -> {"ids": [...]}
 *               --bench FILE: encode FILE repeatedly and print MB/s (single thread).
 *   detokenize: stdin {"ids": [...], "skip_special_tokens": true|false} -> {"text": "..."}
 *               --stream: also {"stream": ...}, the text from the streaming detokenizer fed
 *               one id at a time (equal to "text" unless something is wrong). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "tok/tok.h"

static int cmd_tok_load(const char *dir, struct tok **t)
{
    struct cairn_err err = {0};
    if (tok_load(dir, t, &err)) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static int cmd_tok_bench(struct tok *t, const char *path)
{
    struct cairn_err err = {0};
    char *text;
    size_t len;
    if (cairn_file_read_all(path, 1u << 30, &text, &len, &err)) {
        fprintf(stderr, "cairn: %s\n", err.msg);
        return 1;
    }
    double t0 = cairn_now(), el;
    size_t reps = 0, n_tokens = 0;
    do {
        int32_t *ids;
        size_t n;
        if (tok_encode(t, text, len, 0, &ids, &n, &err)) {
            fprintf(stderr, "cairn: %s\n", err.msg);
            free(text);
            return 1;
        }
        free(ids);
        n_tokens = n;
        reps++;
        el = cairn_now() - t0;
    } while (el < 2.0);
    printf(
        "{\"bytes\": %zu, \"tokens\": %zu, \"reps\": %zu, \"seconds\": %.3f, \"mb_per_s\": %.2f, "
        "\"tokens_per_s\": %.0f}\n",
        len, n_tokens, reps, el, (double)len * (double)reps / el / 1e6,
        (double)n_tokens * (double)reps / el);
    free(text);
    return 0;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *dir = NULL, *bench = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--bench") && i + 1 < argc)
            bench = argv[++i];
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: cairn tokenize TOKENIZER_DIR [--bench FILE]\n"
                   "stdin: JSON lines {\"text\": ..., \"add_special_tokens\": bool}; stdout: "
                   "{\"ids\": [...]}\n");
            return 0;
        } else
            dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "usage: cairn tokenize TOKENIZER_DIR [--bench FILE]\n");
        return 2;
    }
    struct tok *t;
    if (cmd_tok_load(dir, &t)) return 1;
    if (bench) {
        int rc = cmd_tok_bench(t, bench);
        tok_free(t);
        return rc;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *in = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &je);
        json_t *text = json_object_get(in, "text");
        if (!json_is_string(text)) {
            fprintf(stderr, "cairn tokenize: bad input line: %s\n",
                    in ? "no \"text\" string" : je.text);
            json_decref(in);
            rc = 1;
            continue;
        }
        json_t *as = json_object_get(in, "add_special_tokens");
        int add = json_is_boolean(as) ? json_is_true(as) : 1;
        struct cairn_err err = {0};
        int32_t *ids;
        size_t n_ids;
        if (tok_encode(t, json_string_value(text), json_string_length(text), add, &ids, &n_ids,
                       &err)) {
            fprintf(stderr, "cairn tokenize: %s\n", err.msg);
            json_decref(in);
            rc = 1;
            continue;
        }
        fputs("{\"ids\": [", stdout);
        for (size_t i = 0; i < n_ids; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        fputs("]}\n", stdout);
        free(ids);
        json_decref(in);
    }
    free(line);
    tok_free(t);
    return rc;
}

int cmd_detokenize(int argc, char **argv)
{
    const char *dir = NULL;
    int stream = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--stream"))
            stream = 1;
        else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: cairn detokenize TOKENIZER_DIR [--stream]\n"
                   "stdin: JSON lines {\"ids\": [...], \"skip_special_tokens\": bool}; stdout: "
                   "{\"text\": ...}\n"
                   "--stream: add {\"stream\": ...}, the streaming detokenizer's output\n");
            return 0;
        } else
            dir = argv[i];
    }
    if (!dir) {
        fprintf(stderr, "usage: cairn detokenize TOKENIZER_DIR [--stream]\n");
        return 2;
    }
    struct tok *t;
    if (cmd_tok_load(dir, &t)) return 1;
    struct tok_stream *ts[2] = {tok_stream_new(t, 0), tok_stream_new(t, 1)};
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    int32_t *ids = NULL;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        json_error_t je;
        json_t *in = json_loadb(line, (size_t)n, 0, &je);
        json_t *arr = json_object_get(in, "ids");
        if (!json_is_array(arr)) {
            fprintf(stderr, "cairn detokenize: bad input line: %s\n",
                    in ? "no \"ids\" list" : je.text);
            json_decref(in);
            rc = 1;
            continue;
        }
        json_t *sk = json_object_get(in, "skip_special_tokens");
        int skip = json_is_true(sk);
        size_t n_ids = json_array_size(arr);
        free(ids);
        ids = malloc((n_ids ? n_ids : 1) * sizeof(int32_t));
        int bad = 0;
        for (size_t i = 0; i < n_ids; i++) {
            json_t *v = json_array_get(arr, i);
            bad |= !json_is_integer(v) || json_integer_value(v) < INT32_MIN ||
                   json_integer_value(v) > INT32_MAX;
            ids[i] = (int32_t)json_integer_value(v);
        }
        if (bad) {
            fprintf(stderr, "cairn detokenize: \"ids\" must be a list of integers\n");
            json_decref(in);
            rc = 1;
            continue;
        }
        struct cairn_err err = {0};
        char *out = NULL, *sout = NULL;
        size_t len = 0, slen = 0;
        int st = tok_decode(t, ids, n_ids, skip, &out, &len, &err);
        if (!st && stream) {
            struct tok_stream *s = ts[skip];
            FILE *mf = open_memstream(&sout, &slen);
            const char *piece;
            size_t pl;
            tok_stream_reset(s);
            for (size_t i = 0; i < n_ids && !st; i++)
                if (!(st = tok_stream_feed(s, ids[i], &piece, &pl))) fwrite(piece, 1, pl, mf);
            if (!st && !(st = tok_stream_flush(s, &piece, &pl))) fwrite(piece, 1, pl, mf);
            fclose(mf);
        }
        if (st) {
            fprintf(stderr, "cairn detokenize: %s\n", err.msg[0] ? err.msg : cairn_status_str(st));
            free(out);
            free(sout);
            json_decref(in);
            rc = 1;
            continue;
        }
        json_t *o = json_object();
        json_object_set_new(o, "text", json_stringn(out, len));
        if (sout) json_object_set_new(o, "stream", json_stringn(sout, slen));
        char *js = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
        if (js) puts(js);
        free(js);
        json_decref(o);
        free(out);
        free(sout);
        json_decref(in);
    }
    free(ids);
    free(line);
    tok_stream_free(ts[0]);
    tok_stream_free(ts[1]);
    tok_free(t);
    return rc;
}
