/* cairn serve: the HTTP server over a model folder (or explicit model folders).
 *
 *   cairn serve --model-dir DIR | --model PATH [--model PATH ...] [options]
 *
 * The main thread parses options, starts the API and the HTTP server, then waits for SIGINT or
 * SIGTERM (blocked in every thread, taken with sigwait) and shuts down cleanly: new requests get
 * 503, in-flight streams end with an error event. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api.h"
#include "base/log.h"
#include "base/mem.h"
#include "cli/cli.h"
#include "http/http.h"
#include "kv/tiers.h"

#define SERVE_MAX_MODELS 64

static void serve_usage(FILE *f)
{
    fprintf(f,
            "usage: cairn serve (--model-dir DIR | --model PATH ...) [options]\n"
            "  --model-dir DIR              every subfolder (or org/name) with config.json is a model\n"
            "  --model PATH                 a model folder (repeatable); id = folder name\n"
            "  --host ADDR                  listen address (default 127.0.0.1)\n"
            "  --port N                     port (default 8000; 0 = any free port)\n"
            "  --api-key KEY                require Authorization: Bearer KEY or x-api-key: KEY\n"
            "  --max-concurrent-requests N  API requests in flight before 429 (default 1024)\n"
            "  --max-body-size SIZE         largest request body (default 32M)\n"
            "  --log-level LEVEL            debug|info|warn|error|off (default info)\n"
            "  --threads N                  CPU compute threads (default: one per core)\n"
            CLI_DEVICE_HELP
            CLI_TP_HELP
            "  --http-threads N             HTTP threads (default 4)\n"
            "  --kv-cache-size SIZE         device KV cache budget per model (e.g. 2G, 10%%)\n"
            "  --max-batch-tokens N         token budget per engine step\n"
            "  --max-running N              sequences decoded together per model (default 16)\n"
            "  --max-waiting N              queued requests per model before 429 (default 256)\n"
            "  --speculative MODE           off|ngram|mtp|auto: speculative decoding (ngram = prompt\n"
            "                               lookup; mtp = the model's MTP head (qwen3_next /\n"
            "                               qwen3_5 with mtp.* weights); auto = mtp where the\n"
            "                               model has a head, else ngram), parked per request\n"
            "                               when it stops paying (default off)\n"
            "  --preload                    load every model at start (default: on first use)\n"
            "  --hot-cache-max-size SIZE    hot RAM KV tier per model (e.g. 8G, 20%%; default off)\n"
            "  --hot-cache-write-through    also write every new full block to the SSD at once\n"
            "                               (or env CAIRN_HOT_CACHE_WRITE_THROUGH=1)\n"
            "  --ssd-cache-dir DIR          SSD KV tier folder (kept across restarts; default off)\n"
            "  --ssd-cache-max-size SIZE    SSD tier budget per model (e.g. 50G, 10%% of the disk;\n"
            "                               default min(10%% of free space, 50G))\n"
            "  --request-timeout MS         headers + body must arrive within MS, else 408 (default\n"
            "                               30000; 0 = none)\n"
            "  --idle-timeout S             close a connection silent for S seconds (default 120)\n"
            "  --access-log on|off          one info line per request (default on)\n"
            "  --usage-scale ID=F           multiply the token counts reported for model ID by F\n"
            "                               (repeatable; for agents that assume a bigger window)\n"
            "  --max-process-memory SIZE    memory guard: everything cairn holds (weights, KV, tiers,\n"
            "                               workspaces, requests) stays under it (e.g. 48G, 80%%;\n"
            "                               default: RAM less min(8G, 10%% of RAM))\n"
            "  --max-device-memory SIZE|PCT GPU backends: weights, KV, snapshots and workspaces on the\n"
            "                               device stay under it (e.g. 70G, 90%% of the device;\n"
            "                               default: the device's total less 1/16, at least 1G and\n"
            "                               at most 4G; ignored on the CPU)\n"
            "  --max-loaded-models N        unload the least recently used idle model past N\n"
            "  --ttl SECONDS                unload a model idle this long (0 = never; wins over\n"
            "                               the settings file)\n"
            "  --memory-wait SECONDS        how long loads and requests wait for memory (default 60)\n"
            "  --step-timeout SECONDS       bound of every wait on the device (default 30): a step\n"
            "                               past it fails its model's requests with 503s and the\n"
            "                               model reloads on its next request (settings key\n"
            "                               global.step_timeout)\n"
            "  --settings FILE              settings file (default $CAIRN_HOME/settings.json or\n"
            "                               ~/.cairn/settings.json)\n"
            "  --admin-key KEY              /admin/api/ also needs x-admin-key: KEY\n");
}

/* Closes the device, or the tensor-parallel group whose rank 0 it is. */
static void serve_close_dev(struct backend_tp *tp, struct backend *dev)
{
    if (tp) backend_tp_close(tp);
    else backend_close(dev);
}

int cmd_serve(int argc, char **argv)
{
    enum {
        O_MODEL_DIR = 1000, O_MODEL, O_HOST, O_PORT, O_API_KEY, O_MAX_CONC, O_MAX_BODY, O_LOG,
        O_THREADS, O_HTTP_THREADS, O_KV, O_MAX_BATCH, O_MAX_RUNNING, O_MAX_WAITING, O_PRELOAD, O_FAKE, O_PORT_FILE, O_KEEPALIVE,
        O_CHECK, O_HELP, O_DEVICE, O_HOT_MAX, O_HOT_WT, O_SSD_DIR, O_SSD_MAX, O_REQ_TIMEOUT,
        O_IDLE_TIMEOUT, O_ACCESS_LOG, O_USAGE_SCALE, O_MAX_MEM, O_MAX_LOADED, O_TTL, O_MEM_WAIT, O_STEP_TIMEOUT,
        O_SETTINGS, O_ADMIN_KEY, O_SPEC, O_SPEC_MIN, O_SPEC_K, O_SPEC_COST, O_SPEC_DRAFT, O_MAX_DEV_MEM,
        O_TP,
    };
    static const struct option opts[] = {
        {"model-dir", required_argument, 0, O_MODEL_DIR},
        {"model", required_argument, 0, O_MODEL},
        {"host", required_argument, 0, O_HOST},
        {"port", required_argument, 0, O_PORT},
        {"api-key", required_argument, 0, O_API_KEY},
        {"max-concurrent-requests", required_argument, 0, O_MAX_CONC},
        {"max-body-size", required_argument, 0, O_MAX_BODY},
        {"log-level", required_argument, 0, O_LOG},
        {"threads", required_argument, 0, O_THREADS},
        {"device", required_argument, 0, O_DEVICE},
        {"tensor-parallel", required_argument, 0, O_TP},
        {"http-threads", required_argument, 0, O_HTTP_THREADS},
        {"kv-cache-size", required_argument, 0, O_KV},
        {"hot-cache-max-size", required_argument, 0, O_HOT_MAX},
        {"hot-cache-write-through", no_argument, 0, O_HOT_WT},
        {"ssd-cache-dir", required_argument, 0, O_SSD_DIR},
        {"ssd-cache-max-size", required_argument, 0, O_SSD_MAX},
        {"max-batch-tokens", required_argument, 0, O_MAX_BATCH},
        {"max-running", required_argument, 0, O_MAX_RUNNING},
        {"max-waiting", required_argument, 0, O_MAX_WAITING},
        {"speculative", required_argument, 0, O_SPEC},
        {"preload", no_argument, 0, O_PRELOAD},
        {"max-process-memory", required_argument, 0, O_MAX_MEM},
        {"max-device-memory", required_argument, 0, O_MAX_DEV_MEM},
        {"max-loaded-models", required_argument, 0, O_MAX_LOADED},
        {"ttl", required_argument, 0, O_TTL},
        {"memory-wait", required_argument, 0, O_MEM_WAIT},
        {"step-timeout", required_argument, 0, O_STEP_TIMEOUT},
        {"settings", required_argument, 0, O_SETTINGS},
        {"admin-key", required_argument, 0, O_ADMIN_KEY},
        /* hidden, for tests */
        {"fake-backend", required_argument, 0, O_FAKE},
        {"port-file", required_argument, 0, O_PORT_FILE},
        {"keepalive-ms", required_argument, 0, O_KEEPALIVE},
        {"check-backend", no_argument, 0, O_CHECK}, /* create the backend, then exit */
        {"request-timeout", required_argument, 0, O_REQ_TIMEOUT},
        {"idle-timeout", required_argument, 0, O_IDLE_TIMEOUT},
        {"access-log", required_argument, 0, O_ACCESS_LOG},
        {"usage-scale", required_argument, 0, O_USAGE_SCALE},
        {"spec-ngram-min", required_argument, 0, O_SPEC_MIN}, /* speculation tuning, for bench/spec_* */
        {"spec-k-max", required_argument, 0, O_SPEC_K},
        {"spec-cost-slope", required_argument, 0, O_SPEC_COST},
        {"spec-draft-cost", required_argument, 0, O_SPEC_DRAFT}, /* tests: engine.h */
        {"help", no_argument, 0, O_HELP},
        {0, 0, 0, 0},
    };
    const char *model_dir = NULL, *fake = NULL, *port_file = NULL, *device = "auto";
    int n_tp = 1; /* --tensor-parallel */
    const char *models[SERVE_MAX_MODELS];
    int n_models = 0, preload = 0, n_threads = 0, keepalive_ms = 5000, check_only = 0;
    struct http_config hc = {.host = "127.0.0.1", .port = 8000, .n_threads = 4,
                             .max_body_bytes = 32u << 20, .max_concurrent = 1024};
    struct api_real_opts ro = {0};
    struct api_model_opt mopts[SERVE_MAX_MODELS];
    char mopt_ids[SERVE_MAX_MODELS][256];
    int n_mopts = 0;
    struct kv_tiers_opts tiers_opts = {0}; /* per model; the signature is filled at load */
    const char *ssd_max = NULL;
    uint64_t v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (c) {
        case O_MODEL_DIR: model_dir = optarg; break;
        case O_MODEL:
            if (n_models == SERVE_MAX_MODELS) {
                fprintf(stderr, "cairn serve: at most %d --model\n", SERVE_MAX_MODELS);
                return 2;
            }
            models[n_models++] = optarg;
            break;
        case O_HOST: hc.host = optarg; break;
        case O_PORT: hc.port = atoi(optarg); break;
        case O_API_KEY: hc.api_key = optarg; break;
        case O_MAX_CONC: hc.max_concurrent = atoi(optarg); break;
        case O_MAX_BODY:
            if (!cairn_parse_size(optarg, &v) || v == 0) {
                fprintf(stderr, "cairn serve: bad --max-body-size '%s'\n", optarg);
                return 2;
            }
            hc.max_body_bytes = v;
            break;
        case O_LOG: {
            int l = cairn_log_parse_level(optarg);
            if (l < 0) {
                fprintf(stderr, "cairn serve: bad --log-level '%s'\n", optarg);
                return 2;
            }
            cairn_log_set_level((enum cairn_log_level)l);
            break;
        }
        case O_THREADS: n_threads = atoi(optarg); break;
        case O_DEVICE: device = optarg; break;
        case O_TP:
            if (cli_tp_parse("serve", optarg, &n_tp) != 0) return 2;
            break;
        case O_HTTP_THREADS: hc.n_threads = atoi(optarg); break;
        case O_KV:
            if (!cairn_parse_size(optarg, &v)) {
                fprintf(stderr, "cairn serve: bad --kv-cache-size '%s'\n", optarg);
                return 2;
            }
            ro.kv_bytes = v;
            break;
        case O_MAX_BATCH: ro.max_batch_tokens = atoi(optarg); break;
        case O_MAX_RUNNING: ro.max_running = atoi(optarg); break;
        case O_MAX_WAITING: ro.max_waiting = atoi(optarg); break;
        case O_SPEC:
            ro.speculative = engine_spec_mode_parse(optarg);
            if (ro.speculative < 0) {
                fprintf(stderr, "cairn serve: bad --speculative '%s' (off, ngram, mtp or auto)\n", optarg);
                return 2;
            }
            break;
        case O_SPEC_MIN: ro.spec_ngram_min = atoi(optarg); break;
        case O_SPEC_K: ro.spec_k_max = atoi(optarg); break;
        case O_SPEC_COST: ro.spec_cost_slope = atof(optarg); break;
        case O_SPEC_DRAFT: ro.spec_draft_cost = atof(optarg); break;
        case O_HOT_MAX:
            if (!cairn_parse_size(optarg, &v)) {
                fprintf(stderr, "cairn serve: bad --hot-cache-max-size '%s'\n", optarg);
                return 2;
            }
            tiers_opts.hot_max_bytes = v;
            break;
        case O_HOT_WT: tiers_opts.hot_write_through = 1; break;
        case O_SSD_DIR: tiers_opts.ssd_dir = optarg; break;
        case O_SSD_MAX: ssd_max = optarg; break;
        case O_PRELOAD: preload = 1; break;
        case O_MAX_MEM:
            if (!cairn_parse_size(optarg, &v) || v == 0) {
                fprintf(stderr, "cairn serve: bad --max-process-memory '%s'\n", optarg);
                return 2;
            }
            ro.max_process_memory = v;
            break;
        case O_MAX_DEV_MEM: {
            size_t n = strlen(optarg);
            if (n > 1 && optarg[n - 1] == '%') { /* of the device, not of RAM (cairn_parse_size) */
                char *end;
                double pct = strtod(optarg, &end);
                if (end != optarg + n - 1 || !(pct > 0 && pct <= 100)) {
                    fprintf(stderr, "cairn serve: bad --max-device-memory '%s' (a size or 1-100%%)\n", optarg);
                    return 2;
                }
                ro.max_device_memory_pct = pct;
            } else if (!cairn_parse_size(optarg, &v) || v == 0) {
                fprintf(stderr, "cairn serve: bad --max-device-memory '%s'\n", optarg);
                return 2;
            } else {
                ro.max_device_memory = v;
            }
            break;
        }
        case O_MAX_LOADED:
            ro.max_loaded_models = atoi(optarg);
            if (ro.max_loaded_models < 1) {
                fprintf(stderr, "cairn serve: bad --max-loaded-models '%s'\n", optarg);
                return 2;
            }
            break;
        case O_TTL:
        case O_MEM_WAIT: {
            char *end;
            double d = strtod(optarg, &end);
            if (end == optarg || *end || d < 0) {
                fprintf(stderr, "cairn serve: bad --%s '%s'\n", c == O_TTL ? "ttl" : "memory-wait", optarg);
                return 2;
            }
            if (c == O_TTL) {
                ro.ttl_s = d;
                ro.has_ttl = 1;
            } else {
                ro.memory_wait_s = d > 0 ? d : 0.001;
            }
            break;
        }
        case O_STEP_TIMEOUT: {
            char *end;
            double d = strtod(optarg, &end);
            if (end == optarg || *end || !(d > 0) || d > 1e6) {
                fprintf(stderr, "cairn serve: bad --step-timeout '%s' (seconds > 0)\n", optarg);
                return 2;
            }
            ro.step_timeout_s = d;
            break;
        }
        case O_SETTINGS: ro.settings_path = optarg; break;
        case O_ADMIN_KEY: hc.admin_key = optarg; break;
        case O_FAKE: fake = optarg; break;
        case O_PORT_FILE: port_file = optarg; break;
        case O_KEEPALIVE: keepalive_ms = atoi(optarg); break;
        case O_CHECK: check_only = 1; break;
        case O_REQ_TIMEOUT: {
            char *end;
            long ms = strtol(optarg, &end, 10);
            if (*end || ms < 0 || ms > 86400000) {
                fprintf(stderr, "cairn serve: bad --request-timeout '%s' (milliseconds)\n", optarg);
                return 2;
            }
            hc.request_timeout_ms = ms ? (int)ms : -1;
            break;
        }
        case O_IDLE_TIMEOUT: {
            char *end;
            long sec = strtol(optarg, &end, 10);
            if (*end || sec <= 0 || sec > 86400) {
                fprintf(stderr, "cairn serve: bad --idle-timeout '%s' (seconds)\n", optarg);
                return 2;
            }
            hc.idle_timeout_s = (int)sec;
            break;
        }
        case O_ACCESS_LOG:
            if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
                fprintf(stderr, "cairn serve: --access-log takes on or off\n");
                return 2;
            }
            hc.access_log_off = !strcmp(optarg, "off");
            break;
        case O_USAGE_SCALE: {
            const char *eq = strrchr(optarg, '=');
            char *end = NULL;
            double f = eq ? strtod(eq + 1, &end) : 0;
            if (!eq || eq == optarg || (size_t)(eq - optarg) >= sizeof(mopt_ids[0]) || !end || *end ||
                !(f > 0 && f <= 1000)) {
                fprintf(stderr, "cairn serve: bad --usage-scale '%s' (MODEL_ID=FACTOR, factor in (0, 1000])\n", optarg);
                return 2;
            }
            if (n_mopts == SERVE_MAX_MODELS) {
                fprintf(stderr, "cairn serve: at most %d --usage-scale\n", SERVE_MAX_MODELS);
                return 2;
            }
            snprintf(mopt_ids[n_mopts], sizeof(mopt_ids[0]), "%.*s", (int)(eq - optarg), optarg);
            mopts[n_mopts].id = mopt_ids[n_mopts];
            mopts[n_mopts].usage_scale = f;
            n_mopts++;
            break;
        }
        case O_HELP:
        case 'h': serve_usage(stdout); return 0;
        default: serve_usage(stderr); return 2;
        }
    }
    if (ssd_max) {
        if (!tiers_opts.ssd_dir) {
            fprintf(stderr, "cairn serve: --ssd-cache-max-size needs --ssd-cache-dir\n");
            return 2;
        }
        uint64_t b = 0;
        if (!kv_tiers_parse_ssd_size(ssd_max, tiers_opts.ssd_dir, &b) || b == 0) {
            fprintf(stderr, "cairn serve: bad --ssd-cache-max-size '%s'\n", ssd_max);
            return 2;
        }
        tiers_opts.ssd_max_bytes = b;
    }
    if (tiers_opts.hot_max_bytes || (tiers_opts.ssd_dir && *tiers_opts.ssd_dir))
        ro.tiers_opts = &tiers_opts;
    if (!fake && !model_dir && n_models == 0) {
        fprintf(stderr, "cairn serve: give --model-dir DIR or --model PATH\n\n");
        serve_usage(stderr);
        return 2;
    }
    if (hc.port < 0 || hc.port > 65535) {
        fprintf(stderr, "cairn serve: bad --port\n");
        return 2;
    }

    /* Block the signals in every thread we start; the main thread takes them with sigwait. */
    /* A shell starts background jobs with SIGINT ignored; an ignored signal never reaches
     * sigwait, so restore the default first. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct cairn_err err = {0};
    int rc = 0;
    struct api *api = NULL;
    struct http_server *srv = NULL;
    struct backend *dev = NULL;
    struct backend_tp *tp = NULL; /* --tensor-parallel: dev is its rank 0 (closed with it) */
    if (cli_tp_wanted(n_tp) && !fake) {
        if (ro.tiers_opts) {
            fprintf(stderr, "cairn serve: --tensor-parallel %d: the lower KV tiers (--hot-cache-max-size, "
                            "--ssd-cache-dir) are not supported under tensor parallel yet\n", n_tp);
            return 2;
        }
        if (ro.speculative == ENGINE_SPEC_MTP) {
            fprintf(stderr, "cairn serve: --tensor-parallel %d: --speculative mtp is not supported under tensor "
                            "parallel yet (ngram is; auto drafts by prompt lookup)\n", n_tp);
            return 2;
        }
        if (cli_tp_open("serve", device, n_tp, &tp) != 0) return 2;
        ro.tp = tp;
        dev = tp->bes[0];
        LOG_INFO("serve", "tensor parallel: %d ranks, %s .. %s", n_tp, tp->bes[0]->name, tp->bes[n_tp - 1]->name);
    } else if (cli_device_open("serve", device, n_threads, &dev) != 0) {
        return 2;
    }
    struct api_backend be;
    if (fake) {
        rc = api_backend_fake_create(fake, &be, &err);
    } else {
        ro.model_dir = model_dir;
        ro.models = models;
        ro.n_models = n_models;
        ro.device = dev;
        /* test hook: the device-budget seam on the CPU (api_real_opts.device_budget), so the GPU
         * memory scripts (tests/cuda/serve_memory.sh) can be rehearsed without a GPU */
        const char *seam = getenv("CAIRN_TEST_DEVICE_BUDGET");
        if (seam && !strcmp(seam, "1") && ro.max_device_memory) ro.device_budget = 1;
        rc = api_backend_real_create(&ro, &be, &err);
    }
    if (rc) {
        fprintf(stderr, "cairn serve: %s\n", err.msg);
        serve_close_dev(tp, dev);
        return 1;
    }
    if (check_only) {
        be.destroy(be.ctx);
        serve_close_dev(tp, dev);
        return 0;
    }
    if (preload) {
        struct api_model_desc d[SERVE_MAX_MODELS];
        int n = be.list_models(be.ctx, d, SERVE_MAX_MODELS);
        for (int i = 0; i < n && i < SERVE_MAX_MODELS; i++) {
            int idx;
            LOG_INFO("serve", "loading %s", d[i].id);
            if (be.get_model(be.ctx, d[i].id, &idx, &err) != 0) {
                fprintf(stderr, "cairn serve: loading %s: %s\n", d[i].id, err.msg);
                be.destroy(be.ctx);
                serve_close_dev(tp, dev);
                return 1;
            }
            if (be.put_model) be.put_model(be.ctx, idx);
        }
    }
    struct api_config ac = {.keepalive_ms = keepalive_ms, .max_n = 8, .model_opts = mopts,
                            .n_model_opts = n_mopts};
    if (api_create(&ac, &be, &api, &err) != 0) {
        fprintf(stderr, "cairn serve: %s\n", err.msg);
        be.destroy(be.ctx);
        serve_close_dev(tp, dev);
        return 1;
    }
    if (http_server_start(&hc, api, &srv, &err) != 0) {
        fprintf(stderr, "cairn serve: %s\n", err.msg);
        api_destroy(api);
        serve_close_dev(tp, dev);
        return 1;
    }
    int port = http_server_port(srv);
    LOG_INFO("serve", "listening on http://%s:%d", hc.host, port);
    if (port_file) {
        FILE *f = fopen(port_file, "w");
        if (f) {
            fprintf(f, "%d\n", port);
            fclose(f);
        }
    }
    int sig = 0;
    sigwait(&sigs, &sig);
    LOG_INFO("serve", "signal %d: shutting down", sig);
    http_server_stop(srv, 5000);
    api_destroy(api);
    serve_close_dev(tp, dev);
    LOG_INFO("serve", "stopped");
    return 0;
}
