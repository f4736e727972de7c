/* Device-call multicall entry point (tests/cuda/devsrc): one binary is both cairn and, called
 * through a link named test_cuda_ops*, the op test, so the CUDA fatbin is built and loaded once. */
#include <string.h>

int cairn_main(int argc, char **argv);
int test_cuda_ops_main(int argc, char **argv);
int main(int argc, char **argv)
{
    const char *b = strrchr(argv[0], '/');
    b = b ? b + 1 : argv[0];
    if (strncmp(b, "test_cuda_ops", 13) == 0) return test_cuda_ops_main(argc, argv);
    return cairn_main(argc, argv);
}
