/* Device-call build (tests/cuda/devsrc): the commands it leaves out (their libraries, libmicrohttpd
 * and libutf8proc, and their headers are not on the GPU image). */
#include <stdio.h>

static int devsrc_stub(const char *n)
{
    fprintf(stderr, "cairn: %s: not in this device-call build (tests/cuda/devsrc)\n", n);
    return 2;
}
#define DEVSRC_STUB(fn, name)                                                                      \
    int fn(int argc, char **argv);                                                                 \
    int fn(int argc, char **argv)                                                                  \
    {                                                                                              \
        (void)argc, (void)argv;                                                                    \
        return devsrc_stub(name);                                                                  \
    }
DEVSRC_STUB(cmd_generate, "generate")
DEVSRC_STUB(cmd_serve, "serve")
DEVSRC_STUB(cmd_bench_engine, "bench-engine")
DEVSRC_STUB(cmd_bench_grammar, "bench-grammar")
DEVSRC_STUB(cmd_tokenize, "tokenize")
DEVSRC_STUB(cmd_detokenize, "detokenize")
DEVSRC_STUB(cmd_render_template, "render-template")
