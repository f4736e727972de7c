/* cairn version */
#include <stdio.h>

#include "cli/cli.h"

int cmd_version(int argc, char **argv)
{
    printf("cairn 0.1.0\n");
    return 0;
}
