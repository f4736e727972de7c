/* cuBLASLt, loaded with dlopen when the first GPU backend opens.
 *
 * Why not link it: libcublasLt is a 500+ MB library, and merely loading it at process start
 * costs every cairn command most of a second (relocations), GPU or not. The runtime (cudart) is
 * linked statically and is cheap until used. The soname and the toolkit's library folder come
 * from CMake (CAIRN_CUBLASLT_SONAME, CAIRN_CUDA_LIBDIR); LD_LIBRARY_PATH is searched first. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#include "cuda/cuda_int.h"

#ifndef CAIRN_CUBLASLT_SONAME
#define CAIRN_CUBLASLT_SONAME "libcublasLt.so"
#endif
#ifndef CAIRN_CUDA_LIBDIR
#define CAIRN_CUDA_LIBDIR "/usr/local/cuda/lib64"
#endif

struct cuda_lt_api cuda_lt;

static pthread_once_t cuda_lt_once = PTHREAD_ONCE_INIT;
static int cuda_lt_status = CAIRN_ERR_UNSUPPORTED;
static char cuda_lt_msg[256];

#define CUDA_LT_SYM(field, name)                                                                   \
    do {                                                                                           \
        *(void **)&cuda_lt.field = dlsym(h, #name);                                               \
        if (!cuda_lt.field) {                                                                      \
            snprintf(cuda_lt_msg, sizeof(cuda_lt_msg), "cuBLASLt has no symbol %s", #name);        \
            return;                                                                                \
        }                                                                                          \
    } while (0)

static void cuda_lt_load_once(void)
{
    static const char *const paths[] = {CAIRN_CUBLASLT_SONAME,
                                        (CAIRN_CUDA_LIBDIR "/" CAIRN_CUBLASLT_SONAME),
                                        ("/usr/local/cuda/lib64/" CAIRN_CUBLASLT_SONAME)};
    void *h = NULL;
    for (size_t i = 0; i < CAIRN_ARRAY_LEN(paths) && !h; i++) h = dlopen(paths[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        snprintf(cuda_lt_msg, sizeof(cuda_lt_msg), "cannot load %s: %s", CAIRN_CUBLASLT_SONAME,
                 why ? why : "not found");
        return;
    }
    CUDA_LT_SYM(create, cublasLtCreate);
    CUDA_LT_SYM(destroy, cublasLtDestroy);
    CUDA_LT_SYM(status_name, cublasLtGetStatusName);
    CUDA_LT_SYM(status_string, cublasLtGetStatusString);
    CUDA_LT_SYM(desc_create, cublasLtMatmulDescCreate);
    CUDA_LT_SYM(desc_destroy, cublasLtMatmulDescDestroy);
    CUDA_LT_SYM(desc_set, cublasLtMatmulDescSetAttribute);
    CUDA_LT_SYM(layout_create, cublasLtMatrixLayoutCreate);
    CUDA_LT_SYM(layout_destroy, cublasLtMatrixLayoutDestroy);
    CUDA_LT_SYM(pref_create, cublasLtMatmulPreferenceCreate);
    CUDA_LT_SYM(pref_destroy, cublasLtMatmulPreferenceDestroy);
    CUDA_LT_SYM(pref_set, cublasLtMatmulPreferenceSetAttribute);
    CUDA_LT_SYM(heuristic, cublasLtMatmulAlgoGetHeuristic);
    CUDA_LT_SYM(matmul, cublasLtMatmul);
    cuda_lt_status = CAIRN_OK; /* the handle stays loaded for the process */
}

int cuda_lt_load(struct cairn_err *err)
{
    pthread_once(&cuda_lt_once, cuda_lt_load_once);
    if (cuda_lt_status != CAIRN_OK)
        return cairn_err_set(err, cuda_lt_status, "cuda: %s", cuda_lt_msg);
    return CAIRN_OK;
}
