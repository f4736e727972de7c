/* stderr logger. The level is read without a lock: a stale read only changes verbosity. */
#include "base/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int log_level = -1; /* -1: not yet read from CAIRN_LOG_LEVEL */

static const char *const log_names[] = {"debug", "info", "warn", "error", "off"};

int cairn_log_parse_level(const char *s)
{
    for (int i = 0; i < 5; i++)
        if (s && strcmp(s, log_names[i]) == 0) return i;
    return -1;
}

void cairn_log_set_level(enum cairn_log_level level)
{
    __atomic_store_n(&log_level, (int)level, __ATOMIC_RELAXED);
}

enum cairn_log_level cairn_log_get_level(void)
{
    int l = __atomic_load_n(&log_level, __ATOMIC_RELAXED);
    if (l < 0) {
        l = cairn_log_parse_level(getenv("CAIRN_LOG_LEVEL"));
        if (l < 0) l = CAIRN_LOG_INFO;
        __atomic_store_n(&log_level, l, __ATOMIC_RELAXED);
    }
    return (enum cairn_log_level)l;
}

void cairn_log(enum cairn_log_level level, const char *room, const char *fmt, ...)
{
    if (level < cairn_log_get_level()) return;
    char line[2048];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    int n = snprintf(line, sizeof(line), "%02d:%02d:%02d.%03ld %-5s %-6s ", tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, log_names[level], room);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof(line)) vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}
