/* cairn generate --model DIR (--tokens 1,2,3 | --prompt TEXT) -n N [--temp T] [--seed S]
 *                [--kv f32|bf16] [--tokenizer DIR] [--device auto|cpu|cuda[:N]]
 *                [--speculative off|ngram|mtp|auto] [--spec-draft-cost C]
 * Prefills the prompt, then decodes N tokens (greedy when temp is 0, else softmax sampling
 * with a seeded generator), stopping at an eos id. With --tokens prints the generated ids,
 * comma-separated; with --prompt (tokenized by DIR/tokenizer.json with its post-processor)
 * streams the generated text. --speculative runs the request through the engine instead
 * (generate_engine.c: its sampler, and drafts of that mode verified), whose greedy tokens are
 * the same. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "cli/cli.h"
#include "cli/cli_generate.h"
#include "model/model.h"
#include "model/model_run.h"
#include "tok/tok.h"

static void generate_usage(FILE *f)
{
    fprintf(f,
            "usage: cairn generate --model DIR (--tokens 1,2,3 | --prompt TEXT) [-n N] [--temp T]\n"
            "                      [--seed S] [--kv f32|bf16] [--tokenizer DIR]\n"
            "                      [--device auto|cpu|cuda[:N]] [--speculative off|ngram|mtp|auto]\n"
            "                      [--spec-draft-cost C]  (a fixed MTP head cost per drafted token,\n"
            "                      relative to a one-token step, in [0, 1]; 0: priced by the engine)\n");
}

static int generate_parse_ids(const char *s, int32_t **out, int *n)
{
    int cap = 16, k = 0;
    int32_t *v = malloc(sizeof(int32_t) * (size_t)cap);
    if (!v) return -1;
    while (*s) {
        char *end;
        long x = strtol(s, &end, 10);
        if (end == s || x < 0 || x > INT32_MAX) {
            free(v);
            return -1;
        }
        if (k == cap) {
            cap *= 2;
            int32_t *nv = realloc(v, sizeof(int32_t) * (size_t)cap);
            if (!nv) {
                free(v);
                return -1;
            }
            v = nv;
        }
        v[k++] = (int32_t)x;
        s = end;
        if (*s == ',')
            s++;
        else if (*s) {
            free(v);
            return -1;
        }
    }
    *out = v;
    *n = k;
    return k > 0 ? 0 : -1;
}

static uint64_t generate_rng(uint64_t *s)
{
    /* splitmix64 */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int generate_pick(const float *logits, int V, double temp, uint64_t *rng)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best]) best = i;
    if (temp <= 0) return best;
    double sum = 0;
    for (int i = 0; i < V; i++)
        sum += exp((logits[i] - logits[best]) / temp);
    double u = (double)(generate_rng(rng) >> 11) / 9007199254740992.0 * sum, acc = 0;
    for (int i = 0; i < V; i++) {
        acc += exp((logits[i] - logits[best]) / temp);
        if (acc >= u) return i;
    }
    return best;
}

int cmd_generate(int argc, char **argv)
{
    const char *dir = NULL, *ids = NULL, *text = NULL, *tok_dir = NULL, *device = "auto";
    int n_new = 16;
    double temp = 0;
    uint64_t seed = 0;
    enum dtype kv_dtype = DTYPE_BF16;
    int spec = -1; /* engine_spec_mode, or -1: the plain loop */
    double draft_cost = 0; /* --spec-draft-cost: 0 = the engine prices the MTP head */
    char timing[160] = "";
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            generate_usage(stdout);
            return 0;
        } else if (strcmp(a, "--model") == 0 && i + 1 < argc) {
            dir = argv[++i];
        } else if (strcmp(a, "--tokens") == 0 && i + 1 < argc) {
            ids = argv[++i];
        } else if ((strcmp(a, "-n") == 0 || strcmp(a, "--max-tokens") == 0) && i + 1 < argc) {
            n_new = atoi(argv[++i]);
        } else if (strcmp(a, "--temp") == 0 && i + 1 < argc) {
            temp = atof(argv[++i]);
        } else if (strcmp(a, "--seed") == 0 && i + 1 < argc) {
            seed = strtoull(argv[++i], NULL, 10);
        } else if (strcmp(a, "--kv") == 0 && i + 1 < argc) {
            kv_dtype = strcmp(argv[++i], "f32") == 0 ? DTYPE_F32 : DTYPE_BF16;
        } else if (strcmp(a, "--prompt") == 0 && i + 1 < argc) {
            text = argv[++i];
        } else if (strcmp(a, "--tokenizer") == 0 && i + 1 < argc) {
            tok_dir = argv[++i];
        } else if (strcmp(a, "--device") == 0 && i + 1 < argc) {
            device = argv[++i];
        } else if (strcmp(a, "--spec-draft-cost") == 0 && i + 1 < argc) {
            char *end;
            draft_cost = strtod(argv[++i], &end);
            if (*end || !(draft_cost >= 0 && draft_cost <= 1)) {
                fprintf(stderr, "generate: bad --spec-draft-cost '%s' (a number in [0, 1])\n", argv[i]);
                return 2;
            }
        } else if (strcmp(a, "--speculative") == 0 && i + 1 < argc) {
            spec = engine_spec_mode_parse(argv[++i]);
            if (spec < 0) {
                fprintf(stderr, "generate: bad --speculative '%s' (off, ngram, mtp or auto)\n", argv[i]);
                return 2;
            }
        } else {
            fprintf(stderr, "generate: unknown option %s\n", a);
            generate_usage(stderr);
            return 2;
        }
    }
    int32_t *prompt = NULL;
    int n_prompt = 0;
    struct cairn_err err = {0};
    struct tok *tk = NULL;
    struct tok_stream *ts = NULL;
    if (!dir || (!ids == !text) || n_new < 0) {
        generate_usage(stderr);
        return 2;
    }
    if (ids && generate_parse_ids(ids, &prompt, &n_prompt) != 0) {
        fprintf(stderr, "generate: --tokens must be comma-separated non-negative ids\n");
        return 2;
    }
    if (text) {
        size_t n = 0;
        if (tok_load(tok_dir ? tok_dir : dir, &tk, &err) != CAIRN_OK) {
            fprintf(stderr, "generate: --prompt needs a tokenizer: %s\n", err.msg);
            return 2;
        }
        if (tok_encode(tk, text, strlen(text), 1, &prompt, &n, &err) != CAIRN_OK || n == 0 ||
            n > INT32_MAX) {
            fprintf(stderr, "generate: cannot tokenize the prompt: %s\n",
                    err.msg[0] ? err.msg : "empty");
            tok_free(tk);
            free(prompt);
            return 2;
        }
        n_prompt = (int)n;
        ts = tok_stream_new(tk, 1);
    }
    struct model *m = NULL;
    struct backend *be = NULL;
    struct model_run run = {0};
    float *logits = NULL;
    int rc = 2;
    if (text && !ts) goto done;
    if (cli_device_open("generate", device, 0, &be) != 0) {
        err.msg[0] = 0;
        goto quiet;
    }
    if (model_load(dir, be, &m, &err) != CAIRN_OK) goto done;
    const struct model_info *info = model_get_info(m);
    if (spec >= 0) {
        struct generate_engine_opts g = {.prompt = prompt, .n_prompt = n_prompt, .n_new = n_new, .temp = temp,
                                         .seed = seed, .kv_dtype = kv_dtype, .mode = (enum engine_spec_mode)spec,
                                         .spec_draft_cost = draft_cost};
        int32_t *out = malloc(sizeof(int32_t) * (size_t)(n_new > 0 ? n_new : 1));
        int n_out = 0;
        if (!out) goto done;
        int grc = generate_engine_run(m, &g, out, &n_out, &err);
        for (int i = 0; i < n_out; i++) {
            const char *piece;
            size_t plen;
            if (!ts) printf("%s%d", i ? "," : "", out[i]);
            else if (tok_stream_feed(ts, out[i], &piece, &plen) == CAIRN_OK) fwrite(piece, 1, plen, stdout);
        }
        free(out);
        if (grc != CAIRN_OK) goto done;
        goto finish;
    }
    int chunk = CAIRN_MIN(n_prompt, 256);
    struct model_run_opts ro = {.n_seqs = 1, .max_ctx = n_prompt + n_new, .max_step = chunk, .block_size = 16,
                                .kv_dtype = kv_dtype};
    if (model_run_open(&run, m, &ro, &err) != CAIRN_OK) goto done;
    logits = malloc(sizeof(float) * (size_t)info->vocab_size);
    if (!logits) goto done;
    double t0 = cairn_now();
    if (model_run_prefill(&run, 0, prompt, n_prompt, chunk, logits, &err) != CAIRN_OK) goto done;
    double t1 = cairn_now();
    int n_gen = 0;
    for (; n_gen < n_new; n_gen++) {
        int32_t tok = generate_pick(logits, info->vocab_size, temp, &seed);
        if (ts) {
            const char *piece;
            size_t plen;
            if (tok_stream_feed(ts, tok, &piece, &plen) == CAIRN_OK) fwrite(piece, 1, plen, stdout);
        } else {
            printf("%s%d", n_gen ? "," : "", tok);
        }
        fflush(stdout);
        int stop = 0;
        for (int e = 0; e < info->n_eos; e++)
            stop |= tok == info->eos_ids[e];
        if (stop || n_gen + 1 == n_new) {
            n_gen++;
            break;
        }
        struct model_run_item it = {.seq = 0, .tokens = &tok, .n_tokens = 1, .n_logits = 1, .logits = logits};
        if (model_run_step(&run, &it, 1, &err) != CAIRN_OK) goto done;
    }
    double t2 = cairn_now();
    snprintf(timing, sizeof(timing), "generate: prefill %d tokens in %.3f s, %d generated in %.3f s\n", n_prompt,
             t1 - t0, n_gen, t2 - t1);
finish:
    if (ts) {
        const char *piece;
        size_t plen;
        if (tok_stream_flush(ts, &piece, &plen) == CAIRN_OK) fwrite(piece, 1, plen, stdout);
    }
    printf("\n");
    fputs(timing, stderr);
    rc = 0;
done:
    if (rc) fprintf(stderr, "generate: %s\n", err.msg[0] ? err.msg : "out of memory");
quiet:
    free(prompt);
    free(logits);
    model_run_close(&run);
    model_free(m);
    backend_close(be);
    tok_stream_free(ts);
    tok_free(tk);
    return rc;
}
