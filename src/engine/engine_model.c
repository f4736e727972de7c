/* engine_create: the engine over a loaded model (model.h). Kept apart from engine.c so that code
 * driving the engine with other model ops (tests, benchmarks) does not need the model room. */
#include "engine/engine.h"
#include "kv/kv_pool.h"
#include "model/model_group.h"

static const struct model_info *engine_model_info_op(void *ctx) { return model_get_info(ctx); }

static int engine_model_reserve_op(void *ctx, int max_tokens, struct cairn_err *err)
{
    return model_reserve(ctx, max_tokens, err);
}

static int engine_model_forward_op(void *ctx, struct kv_pool *kv, const struct model_seq *seqs,
                                   int n_seqs, struct cairn_err *err)
{
    return model_forward(ctx, kv_pool_view(kv), seqs, n_seqs, err);
}

static void engine_model_step_times_op(void *ctx, double *issue_s, double *wait_s)
{
    model_last_step_times(ctx, issue_s, wait_s);
}

static void engine_model_state_init_op(void *ctx, void *state) { model_state_init(ctx, state); }

static int engine_model_mtp_op(void *ctx, struct kv_pool *kv, const struct model_mtp_seq *seqs, int n_seqs,
                               struct cairn_err *err)
{
    return model_mtp_forward(ctx, kv_pool_view(kv), seqs, n_seqs, err);
}

int engine_create(struct model *m, const struct engine_opts *opts, struct engine **out,
                  struct cairn_err *err)
{
    struct engine_model_ops ops = {
        .ctx = m,
        .info = engine_model_info_op,
        .reserve = engine_model_reserve_op,
        .forward = engine_model_forward_op,
        .state_init = engine_model_state_init_op,
        .mtp_forward = model_get_info(m)->n_mtp_layers > 0 ? engine_model_mtp_op : NULL,
        .be = model_backend(m),
        .can_sample = model_can_sample(m),
        .step_times = engine_model_step_times_op,
    };
    return engine_create_ops(&ops, opts, out, err);
}

/* ---- a tensor-parallel model group ---- */

static const struct model_info *engine_group_info_op(void *ctx) { return model_group_info(ctx); }

static int engine_group_reserve_op(void *ctx, int max_tokens, struct cairn_err *err)
{
    return model_group_reserve(ctx, max_tokens, err);
}

static int engine_group_forward_op(void *ctx, struct kv_pool *kv, const struct model_seq *seqs, int n_seqs,
                                   struct cairn_err *err)
{
    return model_group_forward(ctx, kv_pool_view(kv), seqs, n_seqs, err);
}

static void engine_group_state_init_op(void *ctx, void *state) { model_group_state_init(ctx, state); }

int engine_create_group(struct model_group *g, const struct engine_opts *opts, struct engine **out,
                        struct cairn_err *err)
{
    *out = NULL;
    /* a tier copies one block of one backend's pool; a group's block is one part per rank */
    if (opts->tiers.lookup || opts->tiers.on_evict || opts->tiers.on_publish)
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED,
                             "tensor parallel: the lower KV tiers (hot RAM, SSD) are not supported yet; serve "
                             "without --hot-cache-max-size and --ssd-cache-dir");
    if (opts->speculative == ENGINE_SPEC_MTP)
        return cairn_err_set(err, CAIRN_ERR_UNSUPPORTED,
                             "tensor parallel: the MTP head does not run sharded yet; use --speculative ngram "
                             "(or auto, which drafts by prompt lookup here)");
    struct engine_model_ops ops = {
        .ctx = g,
        .info = engine_group_info_op,
        .reserve = engine_group_reserve_op,
        .forward = engine_group_forward_op,
        .state_init = engine_group_state_init_op,
        .be = model_group_backend(g),
        /* no device sampling over a group: its backend has buffers only (no sample op), so every
         * row's logits come back from rank 0 and the host samples them */
        .can_sample = 0,
    };
    return engine_create_ops(&ops, opts, out, err);
}
