/* stderr logger with an in-memory ring of recent lines. The level is read without a lock: a
 * stale read only changes verbosity. The ring (CAIRN_LOG_RING entries, ~256 KiB, static) is
 * guarded by one mutex taken for a memcpy per line. */
#include "base/log.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int log_level = -1; /* -1: not yet read from CAIRN_LOG_LEVEL */

static const char *const log_names[] = {"debug", "info", "warn", "error", "off"};

static pthread_mutex_t log_ring_mu = PTHREAD_MUTEX_INITIALIZER;
static struct cairn_log_entry log_ring[CAIRN_LOG_RING]; /* entry seq lives at (seq - 1) % RING */
static uint64_t log_ring_seq;                           /* newest seq written (under the mutex) */

int cairn_log_parse_level(const char *s)
{
    for (int i = 0; i < 5; i++)
        if (s && strcmp(s, log_names[i]) == 0) return i;
    return -1;
}

const char *cairn_log_level_name(enum cairn_log_level level)
{
    return (unsigned)level < 5 ? log_names[level] : "?";
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

static void log_ring_put(enum cairn_log_level level, const struct timespec *ts, const char *line)
{
    pthread_mutex_lock(&log_ring_mu);
    struct cairn_log_entry *e = &log_ring[log_ring_seq % CAIRN_LOG_RING];
    e->seq = ++log_ring_seq;
    e->level = level;
    e->t = (double)ts->tv_sec + (double)ts->tv_nsec * 1e-9;
    size_t n = strnlen(line, sizeof(e->text) - 1); /* a longer line is cut in the ring only, */
    if (line[n])
        while (n > 0 && ((unsigned char)line[n] & 0xC0) == 0x80) n--; /* before a whole character */
    memcpy(e->text, line, n);
    e->text[n] = 0;
    pthread_mutex_unlock(&log_ring_mu);
}

int cairn_log_recent(uint64_t after, enum cairn_log_level min_level, struct cairn_log_entry *out,
                     int max, uint64_t *last_seq)
{
    int n = 0;
    pthread_mutex_lock(&log_ring_mu);
    uint64_t first = log_ring_seq > CAIRN_LOG_RING ? log_ring_seq - CAIRN_LOG_RING + 1 : 1;
    if (after + 1 > first) first = after + 1;
    for (uint64_t s = first; s <= log_ring_seq && n < max; s++) {
        const struct cairn_log_entry *e = &log_ring[(s - 1) % CAIRN_LOG_RING];
        if (e->level >= min_level) out[n++] = *e;
    }
    if (last_seq) *last_seq = log_ring_seq;
    pthread_mutex_unlock(&log_ring_mu);
    return n;
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
    log_ring_put(level, &ts, line);
}
