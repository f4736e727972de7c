/* Logging to stderr with a level and a room tag. Thread-safe (one fprintf per line).
 *
 * The last CAIRN_LOG_RING lines written (at the current level or above) are also kept in memory,
 * each with a sequence number, for the admin dashboard's log page (GET /admin/api/logs):
 * cairn_log_recent copies out the lines after a given sequence number. */
#ifndef CAIRN_BASE_LOG_H
#define CAIRN_BASE_LOG_H

#include <stddef.h>
#include <stdint.h>

enum cairn_log_level {
    CAIRN_LOG_DEBUG = 0,
    CAIRN_LOG_INFO = 1,
    CAIRN_LOG_WARN = 2,
    CAIRN_LOG_ERROR = 3,
    CAIRN_LOG_OFF = 4,
};

#define CAIRN_LOG_RING 512      /* lines kept in memory */
#define CAIRN_LOG_LINE_MAX 512  /* bytes of one kept line (longer ones are cut) */

void cairn_log_set_level(enum cairn_log_level level);
enum cairn_log_level cairn_log_get_level(void);
/* Parses "debug|info|warn|error|off"; returns -1 if unknown. */
int cairn_log_parse_level(const char *s);
const char *cairn_log_level_name(enum cairn_log_level level);
void cairn_log(enum cairn_log_level level, const char *room, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One kept line. text is the whole formatted line as written to stderr (time, level, room,
 * message), without the newline. */
struct cairn_log_entry {
    uint64_t seq;               /* 1, 2, ... in the order written */
    enum cairn_log_level level;
    double t;                   /* unix time */
    char text[CAIRN_LOG_LINE_MAX];
};
/* Copies up to max kept lines with seq > after, oldest first, at min_level or above, into out
 * (caller's array). Returns the number copied; *last_seq (may be NULL) gets the newest seq
 * written so far, so a poller can ask for what follows. */
int cairn_log_recent(uint64_t after, enum cairn_log_level min_level, struct cairn_log_entry *out,
                     int max, uint64_t *last_seq);

#define LOG_DEBUG(room, ...) cairn_log(CAIRN_LOG_DEBUG, room, __VA_ARGS__)
#define LOG_INFO(room, ...) cairn_log(CAIRN_LOG_INFO, room, __VA_ARGS__)
#define LOG_WARN(room, ...) cairn_log(CAIRN_LOG_WARN, room, __VA_ARGS__)
#define LOG_ERROR(room, ...) cairn_log(CAIRN_LOG_ERROR, room, __VA_ARGS__)

#endif
