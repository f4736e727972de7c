/* Static files of web/, embedded at build time by cmake/web_assets.cmake. */
#ifndef CAIRN_HTTP_WEB_ASSETS_H
#define CAIRN_HTTP_WEB_ASSETS_H

#include <stddef.h>

struct web_asset {
    const char *name; /* file name in web/, e.g. "index.html" */
    const char *mime;
    const unsigned char *data;
    size_t size;
};

/* Terminated by an entry with name == NULL. */
extern const struct web_asset web_assets[];

#endif
