/* The packed copy of an MLX q4/q8 weight that the VNNI kernels read (x86_avx512_vnni.c,
 * x86_avx2_vnni.c). The file's layout (row-major codes, scales and biases in separate
 * tensors) makes a 16-row tile read 48 streams; packed, each block of 16 rows is one contiguous
 * stream, group by group, in the order the kernel consumes it:
 *
 *   block b (rows 16b .. 16b+15), group g, then for each 8 inputs 8s .. 8s+7 of the group,
 *   with lane i = bytes 4i .. 4i+3 (row i):
 *     q4: 64 bytes; byte k of lane i = code(i, 8s+2k) | code(i, 8s+2k+1) << 4 (MLX's byte)
 *     q8: 128 bytes; byte k of lane i = code(i, 8s+k), then byte k of lane i = code(i, 8s+4+k)
 *   then the group's 16 scales and 16 biases (bf16, unchanged).
 *
 * A q4 lane's low nibbles are its row's 4 even inputs of the 8 and the high nibbles the 4 odd
 * ones: one mask or shift gives vpdpbusd 16 rows × 4 inputs. Rows past the end are zero codes
 * with zero scale and bias. Same size as the file's data, plus that padding. */
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/cpu_int.h"

static int cpu_pack_shape_ok(const struct tensor *w)
{
    return w->dtype == DTYPE_Q && w->n_dims == 2 && (w->bits == 4 || w->bits == 8) && w->group_size % 32 == 0 &&
           w->shape[1] > 0 && w->shape[1] % w->group_size == 0 && w->shape[0] > 0;
}

static int64_t cpu_pack_group_bytes(const struct tensor *w)
{
    return (int64_t)CPU_VNNI_ROWS * w->group_size * w->bits / 8 + 4 * CPU_VNNI_ROWS;
}

size_t cpu_pack_bytes(const struct tensor *w)
{
    if (!cpu_pack_shape_ok(w) || !cpu_vnni_active()) return 0;
    int64_t blocks = (w->shape[0] + CPU_VNNI_ROWS - 1) / CPU_VNNI_ROWS, groups = w->shape[1] / w->group_size;
    return (size_t)(blocks * groups * cpu_pack_group_bytes(w));
}

struct cpu_pack_job {
    const struct tensor *w;
    uint8_t *dst;
    int64_t blocks;
};

static void cpu_pack_task(void *ctx, int ith, int nth)
{
    const struct cpu_pack_job *j = ctx;
    const struct tensor *w = j->w;
    const int64_t rows = w->shape[0], gs = w->group_size, groups = w->shape[1] / gs;
    const int64_t gbytes = cpu_pack_group_bytes(w), gcode = gbytes - 4 * CPU_VNNI_ROWS;
    const int64_t row_bytes = w->shape[1] * w->bits / 8;
    for (int64_t b = ith; b < j->blocks; b += nth)
        for (int64_t g = 0; g < groups; g++) {
            uint8_t *o = j->dst + (b * groups + g) * gbytes;
            memset(o, 0, (size_t)gbytes);
            for (int i = 0; i < CPU_VNNI_ROWS; i++) {
                int64_t row = b * CPU_VNNI_ROWS + i;
                if (row >= rows) break;
                /* A lane's 4 bytes are 4 consecutive bytes of the row (q4: codes 2k, 2k+1 share
                 * byte k in MLX's little-endian words too), so packing moves words. */
                const uint8_t *src = (const uint8_t *)w->data + row * row_bytes + g * gs * w->bits / 8;
                for (int64_t s = 0; s < gs / 8; s++) {
                    if (w->bits == 4) memcpy(o + s * 64 + 4 * i, src + 4 * s, 4);
                    else {
                        memcpy(o + s * 128 + 4 * i, src + 8 * s, 4);
                        memcpy(o + s * 128 + 64 + 4 * i, src + 8 * s + 4, 4);
                    }
                }
                memcpy(o + gcode + 2 * i, &w->scales[row * groups + g], 2);
                memcpy(o + gcode + 2 * CPU_VNNI_ROWS + 2 * i, &w->biases[row * groups + g], 2);
            }
        }
}

void cpu_pack(const struct tensor *w, void *dst)
{
    struct cpu_pack_job j = {.w = w, .dst = dst, .blocks = (w->shape[0] + CPU_VNNI_ROWS - 1) / CPU_VNNI_ROWS};
    cpu_lock();
    cpu_pool_run(cpu_pack_task, &j, cpu_pool_size() > 0 ? cpu_pool_size() : 1);
    cpu_unlock();
}

void *cpu_packed_rows(const struct tensor *w, int64_t row0)
{
    if (!w->be_data || row0 % CPU_VNNI_ROWS) return NULL;
    int64_t groups = w->shape[1] / w->group_size;
    return (uint8_t *)w->be_data + row0 / CPU_VNNI_ROWS * groups * cpu_pack_group_bytes(w);
}
