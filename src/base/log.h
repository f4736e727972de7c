/* Logging to stderr with a level and a room tag. Thread-safe (one fprintf per line). */
#ifndef CAIRN_BASE_LOG_H
#define CAIRN_BASE_LOG_H

enum cairn_log_level {
    CAIRN_LOG_DEBUG = 0,
    CAIRN_LOG_INFO = 1,
    CAIRN_LOG_WARN = 2,
    CAIRN_LOG_ERROR = 3,
    CAIRN_LOG_OFF = 4,
};

void cairn_log_set_level(enum cairn_log_level level);
enum cairn_log_level cairn_log_get_level(void);
/* Parses "debug|info|warn|error|off"; returns -1 if unknown. */
int cairn_log_parse_level(const char *s);
void cairn_log(enum cairn_log_level level, const char *room, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#define LOG_DEBUG(room, ...) cairn_log(CAIRN_LOG_DEBUG, room, __VA_ARGS__)
#define LOG_INFO(room, ...) cairn_log(CAIRN_LOG_INFO, room, __VA_ARGS__)
#define LOG_WARN(room, ...) cairn_log(CAIRN_LOG_WARN, room, __VA_ARGS__)
#define LOG_ERROR(room, ...) cairn_log(CAIRN_LOG_ERROR, room, __VA_ARGS__)

#endif
