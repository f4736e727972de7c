/* The CUDA backend: one NVIDIA GPU behind the op table of tensor/backend.h.
 *
 * Built only when CMake finds the CUDA toolkit (CAIRN_HAVE_CUDA is then defined for the core
 * library). The runtime is linked statically, so a binary built with CUDA starts on a machine
 * with no driver or no GPU: cuda_backend_open then fails with CAIRN_ERR_UNSUPPORTED and says
 * why, and the caller runs on the CPU. Nothing CUDA-specific is visible past this header.
 *
 * Environment (read at open):
 *   CAIRN_CUDA_MEM_LIMIT=SIZE  device bytes cairn may hold (e.g. "40G"); beyond it buf_alloc and
 *                              weight_prepare fail with CAIRN_ERR_NOMEM (default: no limit
 *                              other than the device's own memory)
 *   CAIRN_CUDA_GEMV_MAX_ROWS=N matmuls of up to N rows (1..8, default 8) take the GEMV kernel,
 *                              larger ones cuBLASLt; 0 sends every matmul to cuBLASLt
 *                              (for the weights the tensor-core kernel does not take)
 *   CAIRN_CUDA_MMA=0|1|2       matmuls of 1..16 rows over dense BF16/F16 weights with rows of
 *                              8 KiB or more take the tensor-core kernel (1, the default;
 *                              batch-invariant up to 16 rows), shorter rows from 9 rows (the
 *                              GEMV keeps 1..8); 2: from 2 rows (the GEMV keeps 1); 0: never
 *                              (the GEMV up to 8 rows, cuBLASLt above)
 *   CAIRN_CUDA_MMA_PIPE=0      that kernel without its software pipeline (both register stages
 *                              loaded, then both used; the same bits), for comparison
 *   CAIRN_CUDA_ATTN=auto|split|tiled  attention kernel: auto (default) takes the tiled prefill
 *                              kernel for steps of >= 8 rows per sequence, split-K otherwise;
 *                              split or tiled force one (tiled still needs head_dim <= 128)
 *   CAIRN_CUDA_ATTN_DEC=fast|tuned|legacy  the split-K decode kernel (BF16 KV, head_dim 64/128):
 *                              fast (default) or the earlier tuned and legacy versions, for
 *                              comparison (cuda_attn.cu)
 *   CAIRN_CUDA_SYNC=1          wait for the GPU after every kernel launch, so that a fault is
 *                              reported with the launch that caused it (debugging; slow; no
 *                              graphs then)
 *   CAIRN_CUDA_GRAPHS=0        launch every op as it is called; by default the ops of decode
 *                              steps are recorded and runs seen before replayed as one CUDA
 *                              graph (cuda_graph.c) */
#ifndef CAIRN_CUDA_CUDA_H
#define CAIRN_CUDA_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "tensor/backend.h"

/* Opens GPU `device` (0-based) as a backend (name "cuda:N"). Fails with CAIRN_ERR_UNSUPPORTED
 * when there is no driver, no such device or the device is older than sm_90's PTX can run on;
 * CAIRN_ERR_NOMEM when its stream, handles or workspaces cannot be allocated. The caller frees
 * the backend with be->ops->destroy (backend_close). */
int cuda_backend_open(int device, struct backend **out, struct cairn_err *err);

/* Tensor parallel over the GPUs of one host (cuda_nccl.c): makes the CUDA backends bes[0..world)
 * (distinct GPUs, in no group yet) ranks 0..world-1 of one NCCL group, so that their op
 * `allreduce` sums over them; sets each be->tp_rank / tp_world. Loads libnccl.so.2 (dlopen),
 * sets NCCL_NVLS_ENABLE=0 in the environment first (NVLink multicast stays off), creates the
 * communicators non-blocking and waits at most timeout_s (<= 0: 60 s) for them: past it they
 * are aborted and the error says so. One host thread per rank then runs that rank's steps.
 * cuda_tp_free (before closing the backends) destroys the communicators. */
struct cuda_tp;
int cuda_tp_init(struct backend *const *bes, int world, int timeout_s, struct cuda_tp **out,
                 struct cairn_err *err);
void cuda_tp_free(struct cuda_tp *tp);

/* Number of usable GPUs (0 when there is no driver or no device; never fails). */
int cuda_device_count(void);

/* Device-to-device copy bandwidth of GPU `device` in GB/s (bytes read + bytes written per
 * second, as STREAM's copy counts them), best of several copies of `bytes`, for the decode
 * roofline of `cairn bench --device cuda`. Allocates 2 x bytes of device memory for the run. */
int cuda_probe_copy_bandwidth(int device, size_t bytes, double *gbs, struct cairn_err *err);

/* Flushes of recorded runs of backend `be` (a cuda backend) so far: launched as a cached graph,
 * captured into a new one, run eagerly (first sight); all 0 with CAIRN_CUDA_GRAPHS=0. For
 * tests and debugging. */
void cuda_graphs_counts(struct backend *be, uint64_t *n_launch, uint64_t *n_capture,
                        uint64_t *n_eager);

#endif
