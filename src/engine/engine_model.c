/* engine_create: the engine over a loaded model (model.h). Kept apart from engine.c so that code
 * driving the engine with other model ops (tests, benchmarks) does not need the model room. */
#include "engine/engine.h"
#include "kv/kv_pool.h"

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
