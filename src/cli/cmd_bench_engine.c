/* cairn bench-engine: engine throughput on a model folder (real or `cairn synth-model`).
 *
 *   cairn bench-engine --model DIR [--kv bf16|f32] [--block-size N] [--prompt N] [--gen N]
 *                      [--concurrency 1,4,16] [--max-running N] [--max-batch-tokens N] [--kv-gb G]
 *                      [--fake-forward]
 *                      [--prefix-len N] [--block-sizes 16,32,64,128]
 *                      [--sweep-prompt N] [--device auto|cpu|cuda[:N]] [--tensor-parallel N]
 *   cairn bench-engine --attn-sweep CTX[,CTX...] [--block-sizes 16,32,64,128,256] [--device D]
 *
 * Reports (1) with each concurrency N (N streams submitted at once, each a random --prompt-token
 * prompt and --gen new tokens, EOS ignored, greedy): the aggregate output tok/s over the wall
 * time from submit to the last token, the decode-only rate (decode steps: forward + sampling,
 * from engine_get_stats), the mean decode step time, and the scheduler thread's host cost per
 * generated token by phase (engine_stats t_*: plan, issue, wait for the device, sample, detok +
 * stop rules, emit) with how many rows were sampled on the device (CAIRN_CUDA_SAMPLE=0: none);
 * the model folder's tokenizer (when it has one) is the detokenizer, as in `cairn serve`.
 * --fake-forward runs the same streams over a forward that computes nothing and returns ids as
 * a device sampler would: the engine's own host cost per token at that concurrency, alone.
 * (2) prefill time of a cold prompt vs the same prompt with
 * its last 10% changed (90% served from the prefix cache), (3) with --block-sizes, decode tok/s
 * at a long context per block size; --attn-sweep times the decode attention kernel alone over
 * paged bf16 KV (Qwen3-0.6B attention shape: 16 query heads, 8 KV heads, head_dim 128, shuffled
 * block table) per block size, the best of interleaved rounds, without a model (the backend's
 * attention op, one step per call): the measurement behind ENGINE_DEFAULT_BLOCK_SIZE. */
#include <getopt.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "engine/engine.h"
#include "kv/kv_pool.h"
#include "model/model.h"
#include "model/model_group.h"
#include "tok/tok.h"

struct bench_req {
    int done;
    struct engine_usage usage;
    int n_tokens;
};

static pthread_mutex_t bench_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bench_cv = PTHREAD_COND_INITIALIZER;

static void bench_event(void *user, const struct engine_event *ev)
{
    struct bench_req *r = user;
    pthread_mutex_lock(&bench_mu);
    if (ev->kind == ENGINE_EVENT_TOKEN) {
        r->n_tokens++;
    } else {
        r->usage = ev->usage;
        r->done = 1;
        pthread_cond_broadcast(&bench_cv);
    }
    pthread_mutex_unlock(&bench_mu);
}

static void bench_wait(struct bench_req *r, int n)
{
    pthread_mutex_lock(&bench_mu);
    for (int i = 0; i < n; i++)
        while (!r[i].done) pthread_cond_wait(&bench_cv, &bench_mu);
    pthread_mutex_unlock(&bench_mu);
}

static void bench_tokens(int32_t *t, int n, int vocab, uint64_t seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (int i = 0; i < n; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (int32_t)((x >> 33) % (uint64_t)vocab);
    }
}

static int bench_submit(struct engine *e, const int32_t *prompt, int n, int gen, struct bench_req *r)
{
    struct engine_request q;
    memset(&q, 0, sizeof(q));
    memset(r, 0, sizeof(*r));
    q.prompt = prompt;
    q.n_prompt = n;
    engine_sampling_default(&q.sampling);
    q.sampling.temperature = 0;
    q.max_tokens = gen;
    q.ignore_eos = 1;
    q.on_event = bench_event;
    q.user = r;
    struct cairn_err err = {0};
    int rc = engine_submit(e, &q, NULL, &err);
    if (rc) fprintf(stderr, "bench-engine: submit: %s\n", err.msg);
    return rc;
}

static double bench_wall_now(void);

/* One concurrency level: `conc` sequences of `prompt` + `gen` tokens submitted at once. */
static double bench_decode_report(struct engine *e, int vocab, int conc, int prompt, int gen, uint64_t seed,
                                  int report)
{
    int32_t *p = malloc(sizeof(int32_t) * (size_t)prompt * (size_t)conc);
    struct bench_req *r = calloc((size_t)conc, sizeof(*r));
    struct engine_stats a, b;
    engine_cache_clear(e);
    engine_get_stats(e, &a);
    for (int i = 0; i < conc; i++) bench_tokens(p + (size_t)i * (size_t)prompt, prompt, vocab, seed + (uint64_t)i);
    double t0 = bench_wall_now();
    for (int i = 0; i < conc; i++)
        if (bench_submit(e, p + (size_t)i * (size_t)prompt, prompt, gen, &r[i])) conc = i;
    bench_wait(r, conc);
    double wall = bench_wall_now() - t0;
    /* the last DONE is emitted before that step's stats are published: wait for them */
    do {
        engine_get_stats(e, &b);
    } while (b.n_requests_done < a.n_requests_done + (uint64_t)conc);
    double s = b.decode_step_s - a.decode_step_s;
    double tok = (double)(b.n_decode_step_tokens - a.n_decode_step_tokens);
    uint64_t n_gen = b.n_generated_tokens - a.n_generated_tokens, n_steps = b.n_steps - a.n_steps;
    if (report && n_gen > 0) {
        double us = 1e6 / (double)n_gen;
        double plan = b.t_plan_s - a.t_plan_s, issue = b.t_issue_s - a.t_issue_s, wait = b.t_wait_s - a.t_wait_s;
        double samp = b.t_sample_s - a.t_sample_s, detok = b.t_detok_s - a.t_detok_s, emit = b.t_emit_s - a.t_emit_s;
        double host = plan + issue + samp + detok + emit;
        printf("decode: %3d streams x (prompt %d, gen %d): %9.1f tok/s aggregate (wall %.2f s, %llu tokens); "
               "decode steps %9.1f tok/s, %.2f ms per decode step\n",
               conc, prompt, gen, wall > 0 ? (double)n_gen / wall : 0, wall, (unsigned long long)n_gen,
               s > 0 ? tok / s : 0, tok > 0 ? 1e3 * s / (tok / conc) : 0);
        printf("  host us/token: plan %.2f, issue %.2f, wait(device) %.2f, sample %.2f, detok+stop %.2f, emit %.2f;"
               " host total %.2f (%.1f%% of wall); %llu steps, %.2f ms per step; rows sampled on device %llu, "
               "host %llu\n",
               plan * us, issue * us, wait * us, samp * us, detok * us, emit * us, host * us,
               wall > 0 ? 100.0 * host / wall : 0, (unsigned long long)n_steps,
               n_steps ? 1e3 * (plan + issue + wait + samp + detok + emit) / (double)n_steps : 0,
               (unsigned long long)(b.n_rows_device - a.n_rows_device),
               (unsigned long long)(b.n_rows_host - a.n_rows_host));
        fflush(stdout);
    }
    free(p);
    free(r);
    return s > 0 ? tok / s : 0;
}

/* Aggregate decode tok/s of `conc` sequences of `prompt` + `gen` tokens. */
static double bench_decode(struct engine *e, int vocab, int conc, int prompt, int gen, uint64_t seed)
{
    return bench_decode_report(e, vocab, conc, prompt, gen, seed, 0);
}

static int bench_max_batch_tokens; /* --max-batch-tokens, 0: the engine default */
static struct tok *bench_tok;      /* the model's tokenizer (detokenizer), or NULL */
static int bench_fake;             /* --fake-forward */

static void *bench_detok_new(void *ctx) { return tok_stream_new(ctx, 1); }
static int bench_detok_feed(void *st, int32_t id, const char **text, size_t *len)
{
    return tok_stream_feed(st, id, text, len);
}
static int bench_detok_flush(void *st, const char **text, size_t *len) { return tok_stream_flush(st, text, len); }
static void bench_detok_free(void *st) { tok_stream_free(st); }

/* --fake-forward: a model that computes nothing. Rows the engine asks it to sample get an id
 * from a hash of the position (as a device sampler's result would come back), the others
 * logits with that id on top; the KV pool is never touched. */
struct bench_fake {
    struct model_info info;
};
static const struct model_info *bench_fake_info(void *ctx) { return &((struct bench_fake *)ctx)->info; }
static int bench_fake_forward(void *ctx, struct kv_pool *kv, const struct model_seq *seqs, int n_seqs,
                              struct cairn_err *err)
{
    (void)kv;
    (void)err;
    int V = ((struct bench_fake *)ctx)->info.vocab_size;
    for (int i = 0; i < n_seqs; i++) {
        const struct model_seq *q = &seqs[i];
        if (!q->n_logits) continue;
        int32_t id = (int32_t)(((uint64_t)(q->pos0 + q->n_tokens) * 2654435761u + (uint64_t)q->tokens[0]) % (uint64_t)V);
        if (q->sample) {
            memset(q->sample_out, 0, sizeof(*q->sample_out));
            q->sample_out->id = id;
            continue;
        }
        for (int r = 0; r < q->n_logits; r++) {
            float *l = q->logits + (size_t)r * (size_t)V;
            memset(l, 0, sizeof(float) * (size_t)V);
            l[id] = 1.0f;
        }
    }
    return CAIRN_OK;
}
static struct bench_fake bench_fake_model;

/* An engine over m, or over the tensor-parallel group g when it is set (--fake-forward: over
 * neither, the model's info only). */
static struct engine *bench_engine(struct model *m, struct model_group *g, enum dtype kv, int bs, int running,
                                   uint64_t kv_bytes)
{
    struct engine_opts o;
    memset(&o, 0, sizeof(o));
    engine_opts_default(&o);
    o.kv_dtype = kv;
    o.block_size = bs;
    o.max_running = running;
    o.kv_bytes = kv_bytes;
    if (bench_max_batch_tokens) o.max_batch_tokens = bench_max_batch_tokens;
    if (o.max_batch_tokens < running) o.max_batch_tokens = running;
    if (bench_tok)
        o.detok = (struct engine_detok){bench_tok, bench_detok_new, bench_detok_feed, bench_detok_flush,
                                        bench_detok_free};
    struct engine *e = NULL;
    struct cairn_err err = {0};
    int rc;
    if (bench_fake) {
        bench_fake_model.info = g ? *model_group_info(g) : *model_get_info(m);
        struct engine_model_ops ops = {.ctx = &bench_fake_model, .info = bench_fake_info,
                                       .forward = bench_fake_forward, .can_sample = 1};
        o.kv_dtype = DTYPE_F32; /* host memory: the pool lives on no device here */
        rc = engine_create_ops(&ops, &o, &e, &err);
    } else {
        rc = g ? engine_create_group(g, &o, &e, &err) : engine_create(m, &o, &e, &err);
    }
    if (rc) {
        fprintf(stderr, "bench-engine: %s\n", err.msg);
        return NULL;
    }
    return e;
}


static double bench_wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double bench_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Decode attention (one query token, one layer) per block size; best of interleaved rounds so a
 * noisy machine affects every size alike. Each call is one step of the backend (step_begin, the
 * attention op, step_end), as the forward pass runs it. */
static int bench_attn_sweep(struct backend *be, const int *ctxs, int n_ctx, const int *sizes, int n_sizes)
{
    enum { H = 16, KVH = 8, HD = 128, ROUNDS = 15 };
    struct cairn_err err = {0};
    const struct backend_ops *op = be->ops;
    static float q[H * HD];
    float *dq = NULL, *dout = NULL;
    int32_t *dmeta = NULL; /* pos [1] | seq_off [2] | block table */
    int rc = 1, max_nb = 0;
    for (int c = 0; c < n_ctx; c++)
        for (int s = 0; s < n_sizes; s++) max_nb = CAIRN_MAX(max_nb, (ctxs[c] + sizes[s] - 1) / sizes[s]);
    size_t meta_bytes = sizeof(int32_t) * (size_t)(3 + max_nb);
    int32_t *meta = malloc(meta_bytes);
    if (!meta || op->buf_alloc(be, sizeof(q), CAIRN_MEM_SCRATCH, (void **)&dq, &err) ||
        op->buf_alloc(be, sizeof(q), CAIRN_MEM_SCRATCH, (void **)&dout, &err) ||
        op->buf_alloc(be, meta_bytes, CAIRN_MEM_SCRATCH, (void **)&dmeta, &err))
        goto fail;
    for (int i = 0; i < H * HD; i++) q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    if (op->buf_upload(be, dq, q, sizeof(q), &err)) goto fail;
    for (int c = 0; c < n_ctx; c++) {
        int ctx = ctxs[c];
        struct kv_pool pools[8];
        int32_t *tables[8];
        double best[8];
        for (int s = 0; s < n_sizes; s++) {
            int bs = sizes[s], nb = (ctx + bs - 1) / bs;
            if (kv_pool_init(&pools[s], be, 1, nb, bs, KVH, HD, DTYPE_BF16, &err)) goto fail;
            size_t n = pools[s].block_bytes / 2;
            uint16_t *k = malloc(n * 2), *v = malloc(n * 2);
            if (!k || !v) {
                free(k);
                free(v);
                goto fail;
            }
            for (int b = 0; b < nb; b++) {
                for (size_t i = 0; i < n; i++) {
                    size_t j = (size_t)b * n + i;
                    k[i] = f32_to_bf16((float)((j * 2654435761u) % 1000) / 1000.0f - 0.5f);
                    v[i] = f32_to_bf16((float)((j * 40503u) % 1000) / 1000.0f - 0.5f);
                }
                if (kv_pool_block_write(&pools[s], b, k, v, &err)) break;
            }
            free(k);
            free(v);
            if (err.status) goto fail;
            tables[s] = malloc(sizeof(int32_t) * (size_t)nb);
            for (int i = 0; i < nb; i++) tables[s][i] = i;
            for (int i = nb - 1; i > 0; i--) { /* a scattered table, as after hours of serving */
                int j = (int)((unsigned)(i * 7919 + 13) % (unsigned)(i + 1));
                int32_t t = tables[s][i];
                tables[s][i] = tables[s][j];
                tables[s][j] = t;
            }
            best[s] = 1e30;
        }
        int reps = ctx > 2048 ? 10 : 30;
        for (int r = 0; r < ROUNDS; r++) {
            for (int s = 0; s < n_sizes; s++) {
                int nb = (ctx + sizes[s] - 1) / sizes[s];
                int32_t seq_off[2] = {0, 1}, ctx_len = ctx;
                meta[0] = ctx - 1;
                meta[1] = 0;
                meta[2] = 1;
                memcpy(meta + 3, tables[s], sizeof(int32_t) * (size_t)nb);
                if (op->buf_upload(be, dmeta, meta, sizeof(int32_t) * (size_t)(3 + nb), &err)) goto fail;
                struct backend_attn a = {.q = dq, .out = dout, .n_tokens = 1, .n_seqs = 1, .n_heads = H,
                                         .pos = dmeta, .seq_off = dmeta + 1, .block_tables = dmeta + 3,
                                         .bt_stride = nb, .seq_off_host = seq_off, .ctx_len_host = &ctx_len,
                                         .kv = kv_pool_view(&pools[s]), .layer = 0, .scale = 0.0883883f};
                double t0 = bench_now();
                for (int i = 0; i < reps; i++) {
                    if (op->step_begin(be, &err)) goto fail;
                    op->attention(be, &a);
                    if (op->step_end(be, &err)) goto fail;
                }
                double dt = (bench_now() - t0) / reps;
                if (dt < best[s]) best[s] = dt;
            }
        }
        for (int s = 0; s < n_sizes; s++) {
            printf("attention: context %5d, block %4d: %8.1f us per decode step and layer\n", ctx, sizes[s],
                   best[s] * 1e6);
            kv_pool_free(&pools[s]);
            free(tables[s]);
        }
        fflush(stdout);
    }
    rc = 0;
fail:
    if (rc) fprintf(stderr, "bench-engine: %s\n", err.msg[0] ? err.msg : "out of memory");
    if (dq) op->buf_free(be, dq, sizeof(q), CAIRN_MEM_SCRATCH);
    if (dout) op->buf_free(be, dout, sizeof(q), CAIRN_MEM_SCRATCH);
    if (dmeta) op->buf_free(be, dmeta, meta_bytes, CAIRN_MEM_SCRATCH);
    free(meta);
    return rc;
}

static int bench_parse_list(const char *s, int *out, int max)
{
    int n = 0;
    while (*s && n < max) {
        out[n++] = atoi(s);
        const char *c = strchr(s, ',');
        if (!c) break;
        s = c + 1;
    }
    return n;
}

static void bench_engine_usage(FILE *f)
{
    fprintf(f, "usage: cairn bench-engine --model DIR [--kv bf16|f32] [--block-size N] [--prompt N]\n"
               "       [--gen N] [--concurrency 1,4,16] [--max-running N] [--max-batch-tokens N] [--kv-gb G]\n"
               "       [--fake-forward]\n"
               "       [--prefix-len N] [--block-sizes 16,32,64,128]\n"
               "       [--sweep-prompt N] [--device auto|cpu|cuda[:N]] [--tensor-parallel N]\n"
               "       cairn bench-engine --attn-sweep CTX[,CTX] [--block-sizes 16,32,64,128,256] [--device D]\n");
}

int cmd_bench_engine(int argc, char **argv)
{
    const char *dir = NULL, *device = "auto";
    enum dtype kv = DTYPE_BF16;
    int bs = ENGINE_DEFAULT_BLOCK_SIZE, prompt = 128, gen = 64, prefix_len = 1024, sweep_prompt = 1024;
    int conc[8] = {1, 4, 16}, n_conc = 3, sizes[8], n_sizes = 0, attn_ctx[8], n_attn = 0, max_running = 0;
    uint64_t kv_bytes = 2ull << 30;
    int n_tp = 1;
    enum { O_MODEL = 256, O_KV, O_BS, O_PROMPT, O_GEN, O_CONC, O_PREFIX, O_SIZES, O_SWEEP, O_ATTN, O_DEVICE, O_TP, O_HELP,
           O_MAX_RUNNING, O_MAX_BATCH, O_KV_GB, O_FAKE };
    static const struct option opts[] = {
        {"model", required_argument, 0, O_MODEL},
        {"kv", required_argument, 0, O_KV},
        {"block-size", required_argument, 0, O_BS},
        {"prompt", required_argument, 0, O_PROMPT},
        {"gen", required_argument, 0, O_GEN},
        {"concurrency", required_argument, 0, O_CONC},
        {"prefix-len", required_argument, 0, O_PREFIX},
        {"block-sizes", required_argument, 0, O_SIZES},
        {"sweep-prompt", required_argument, 0, O_SWEEP},
        {"attn-sweep", required_argument, 0, O_ATTN},
        {"device", required_argument, 0, O_DEVICE},
        {"tensor-parallel", required_argument, 0, O_TP},
        {"max-running", required_argument, 0, O_MAX_RUNNING},
        {"max-batch-tokens", required_argument, 0, O_MAX_BATCH},
        {"kv-gb", required_argument, 0, O_KV_GB},
        {"fake-forward", no_argument, 0, O_FAKE},
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    int c;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL: dir = optarg; break;
        case O_KV:
            if (strcmp(optarg, "f32") && strcmp(optarg, "bf16")) {
                fprintf(stderr, "bench-engine: --kv must be bf16 or f32\n");
                return 2;
            }
            kv = !strcmp(optarg, "f32") ? DTYPE_F32 : DTYPE_BF16;
            break;
        case O_BS: bs = atoi(optarg); break;
        case O_PROMPT: prompt = atoi(optarg); break;
        case O_GEN: gen = atoi(optarg); break;
        case O_CONC: n_conc = bench_parse_list(optarg, conc, 8); break;
        case O_PREFIX: prefix_len = atoi(optarg); break;
        case O_SIZES: n_sizes = bench_parse_list(optarg, sizes, 8); break;
        case O_SWEEP: sweep_prompt = atoi(optarg); break;
        case O_ATTN: n_attn = bench_parse_list(optarg, attn_ctx, 8); break;
        case O_DEVICE: device = optarg; break;
        case O_TP:
            if (cli_tp_parse("bench-engine", optarg, &n_tp) != 0) return 2;
            break;
        case O_MAX_RUNNING: max_running = atoi(optarg); break;
        case O_MAX_BATCH: bench_max_batch_tokens = atoi(optarg); break;
        case O_KV_GB: kv_bytes = (uint64_t)(atof(optarg) * (double)(1ull << 30)); break;
        case O_FAKE: bench_fake = 1; break;
        case 'h':
        case O_HELP: bench_engine_usage(stdout); return 0;
        case ':':
            fprintf(stderr, "bench-engine: %s needs a value\n", argv[optind - 1]);
            return 2;
        default:
            fprintf(stderr, "bench-engine: unknown option %s\n", argv[optind - 1]);
            bench_engine_usage(stderr);
            return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "bench-engine: unexpected argument %s\n", argv[optind]);
        return 2;
    }
    struct backend *be = NULL;
    if (n_attn > 0) {
        static const int def[5] = {16, 32, 64, 128, 256};
        if (cli_device_open("bench-engine", device, 0, &be) != 0) return 2;
        int rc = bench_attn_sweep(be, attn_ctx, n_attn, n_sizes ? sizes : def, n_sizes ? n_sizes : 5);
        backend_close(be);
        return rc;
    }
    if (!dir) {
        fprintf(stderr, "bench-engine: --model DIR is required\n");
        return 2;
    }
    struct backend_tp *tp = NULL; /* --tensor-parallel: the engine drives a model group on it */
    struct model_group *g = NULL;
    struct model *m = NULL;
    struct cairn_err err = {0};
    if (cli_tp_open("bench-engine", device, n_tp, &tp) != 0) return 2;
    if (tp) {
        be = tp->bes[0];
        if (model_group_load(dir, tp, &g, &err)) {
            fprintf(stderr, "bench-engine: --tensor-parallel %d: %s\n", n_tp, err.msg);
            backend_tp_close(tp);
            return 1;
        }
    } else {
        if (cli_device_open("bench-engine", device, 0, &be) != 0) return 2;
        if (model_load(dir, be, &m, &err)) {
            fprintf(stderr, "bench-engine: %s\n", err.msg);
            backend_close(be);
            return 1;
        }
    }
    const struct model_info *info = g ? model_group_info(g) : model_get_info(m);
    int vocab = info->vocab_size;
    {
        char path[4096];
        snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
        struct cairn_err terr = {0};
        FILE *tf = fopen(path, "rb");
        if (tf) {
            fclose(tf);
            if (tok_load(dir, &bench_tok, &terr) != CAIRN_OK) {
                fprintf(stderr, "bench-engine: tokenizer: %s (no detokenizer)\n", terr.msg);
                bench_tok = NULL;
            }
        }
    }
    printf("model %s: %d layers, hidden %d, vocab %d, %.2f GB weights; kv %s, block %d; device %s\n",
           dir, info->n_layers, info->hidden_size, vocab, (double)info->weight_bytes / 1e9, dtype_name(kv), bs,
           be->name);
    if (tp) printf("tensor parallel: %d ranks, %s .. %s\n", n_tp, tp->bes[0]->name, tp->bes[n_tp - 1]->name);
    int rc = 0;
    if (max_running <= 0) {
        max_running = 16;
        for (int i = 0; i < n_conc; i++) max_running = CAIRN_MAX(max_running, conc[i]);
    }
    struct engine *e = bench_engine(m, g, kv, bs, max_running, kv_bytes);
    if (!e) {
        rc = 1;
        goto out;
    }
    printf("engine: max_running %d, kv %.1f GiB; device sampling %s; detokenizer %s%s\n", max_running,
           (double)kv_bytes / (double)(1ull << 30), bench_fake ? "fake" : be->ops->sample ? "on" : "off",
           bench_tok ? "the model's" : "none", bench_fake ? "; fake forward (host cost alone)" : "");
    if (n_conc > 0) bench_decode(e, vocab, CAIRN_MIN(conc[0], 4), CAIRN_MIN(prompt, 32), 8, 99); /* warm-up */
    for (int i = 0; i < n_conc; i++) bench_decode_report(e, vocab, conc[i], prompt, gen, 100 + (uint64_t)i, 1);
    if (prefix_len > 0) {
        int32_t *a = malloc(sizeof(int32_t) * (size_t)prefix_len), *b = malloc(sizeof(int32_t) * (size_t)prefix_len);
        bench_tokens(a, prefix_len, vocab, 7);
        memcpy(b, a, sizeof(int32_t) * (size_t)prefix_len);
        int keep = prefix_len * 9 / 10;
        bench_tokens(b + keep, prefix_len - keep, vocab, 8);
        struct bench_req r1, r2;
        engine_cache_clear(e);
        bench_submit(e, a, prefix_len, 1, &r1);
        bench_wait(&r1, 1);
        bench_submit(e, b, prefix_len, 1, &r2);
        bench_wait(&r2, 1);
        printf("prefix: cold prompt %d tokens: prefill %.3f s; 90%%-shared prompt: %d cached, prefill %.3f s "
               "(%.1fx faster, %.0f%% saved)\n",
               prefix_len, r1.usage.prefill_s, r2.usage.cached_tokens, r2.usage.prefill_s,
               r2.usage.prefill_s > 0 ? r1.usage.prefill_s / r2.usage.prefill_s : 0,
               r1.usage.prefill_s > 0 ? 100.0 * (1 - r2.usage.prefill_s / r1.usage.prefill_s) : 0);
        free(a);
        free(b);
    }
    engine_destroy(e);
    e = NULL;
    for (int i = 0; i < n_sizes; i++) {
        e = bench_engine(m, g, kv, sizes[i], 16, kv_bytes);
        if (!e) {
            rc = 1;
            break;
        }
        double t1 = bench_decode(e, vocab, 1, sweep_prompt, 32, 300);
        double t4 = bench_decode(e, vocab, 4, sweep_prompt, 32, 400);
        printf("block size %4d: decode at context %d: %8.1f tok/s (1 seq), %8.1f tok/s (4 seqs)\n", sizes[i],
               sweep_prompt, t1, t4);
        fflush(stdout);
        engine_destroy(e);
        e = NULL;
    }
out:
    model_free(m);
    model_group_free(g);
    if (tp) backend_tp_close(tp);
    else backend_close(be);
    tok_free(bench_tok);
    bench_tok = NULL;
    return rc;
}
