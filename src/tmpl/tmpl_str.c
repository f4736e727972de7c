/* tmpl string helpers: UTF-8 code points (as Python sees them) and Python's str.isspace. */
#include <stdlib.h>
#include <string.h>

#include "tmpl/tmpl_int.h"


/* Python's str.isspace() (Unicode White_Space plus the \x1c-\x1f separators). */
int tmpl_py_isspace(uint32_t cp)
{
    switch (cp) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x1C: case 0x1D: case 0x1E:
    case 0x1F: case 0x20: case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029:
    case 0x202F: case 0x205F: case 0x3000:
        return 1;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}
