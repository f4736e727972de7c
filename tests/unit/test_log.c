/* base/log.c's ring of recent lines: the lines come back in order with their sequence numbers,
 * level and text; `after` gives only newer ones; a level filter drops the lower ones; past
 * CAIRN_LOG_RING lines the oldest go; a long line is cut before a whole UTF-8 character, never
 * overflows; several threads writing at once lose nothing (every sequence number appears once). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "testlib.h"

static struct cairn_log_entry out[CAIRN_LOG_RING];

static void *log_many(void *arg)
{
    int t = (int)(long)arg;
    for (int i = 0; i < 200; i++)
        LOG_INFO("test", "thread %d line %d", t, i);
    return NULL;
}

int main(void)
{
    cairn_log_set_level(CAIRN_LOG_DEBUG);
    uint64_t last = 0;
    CHECK_EQ_INT(cairn_log_recent(0, CAIRN_LOG_DEBUG, out, CAIRN_LOG_RING, &last), 0);
    CHECK_EQ_INT(last, 0);
    LOG_DEBUG("test", "one %d", 1);
    LOG_INFO("test", "two");
    LOG_WARN("test", "three");
    LOG_ERROR("test", "four");
    int n = cairn_log_recent(0, CAIRN_LOG_DEBUG, out, CAIRN_LOG_RING, &last);
    CHECK_EQ_INT(n, 4);
    CHECK_EQ_INT(last, 4);
    CHECK_EQ_INT(out[0].seq, 1);
    CHECK_EQ_INT(out[3].seq, 4);
    CHECK_EQ_INT(out[0].level, CAIRN_LOG_DEBUG);
    CHECK_EQ_INT(out[2].level, CAIRN_LOG_WARN);
    CHECK_MSG(strstr(out[0].text, "debug test   one 1") != NULL, "%s", out[0].text);
    CHECK(strstr(out[3].text, "error test   four") != NULL);
    CHECK(out[0].t > 1.6e9);
    /* after: only what follows; level: only warn and error */
    n = cairn_log_recent(2, CAIRN_LOG_DEBUG, out, CAIRN_LOG_RING, NULL);
    CHECK_EQ_INT(n, 2);
    CHECK_EQ_INT(out[0].seq, 3);
    n = cairn_log_recent(0, CAIRN_LOG_WARN, out, CAIRN_LOG_RING, NULL);
    CHECK_EQ_INT(n, 2);
    CHECK(strstr(out[0].text, "three") && strstr(out[1].text, "four"));
    CHECK_EQ_INT(cairn_log_recent(0, CAIRN_LOG_DEBUG, out, 3, NULL), 3); /* max */
    /* lines below the level are not written, so not kept */
    cairn_log_set_level(CAIRN_LOG_WARN);
    LOG_INFO("test", "hidden");
    cairn_log_recent(0, CAIRN_LOG_DEBUG, out, CAIRN_LOG_RING, &last);
    CHECK_EQ_INT(last, 4);
    cairn_log_set_level(CAIRN_LOG_DEBUG);
    /* a line longer than a kept entry is cut and terminated */
    char big[3000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = 0;
    LOG_INFO("test", "%s", big);
    n = cairn_log_recent(4, CAIRN_LOG_DEBUG, out, CAIRN_LOG_RING, &last);
    CHECK_EQ_INT(n, 1);
    CHECK_EQ_INT(strlen(out[0].text), CAIRN_LOG_LINE_MAX - 1);
    /* cut before a whole UTF-8 character, never inside one (the admin API sends it as JSON) */
    char wide[1200] = "";
    for (int i = 0; i < 300; i++)
        strcat(wide, "\xc3\xa9"); /* é, 2 bytes each */
    LOG_INFO("test", "%s", wide);
    n = cairn_log_recent(last, CAIRN_LOG_DEBUG, out, CAIRN_LOG_RING, &last);
    CHECK_EQ_INT(n, 1);
    size_t len = strlen(out[0].text), pre = (size_t)(strstr(out[0].text, "\xc3") - out[0].text);
    /* the time/level/room prefix, then as many whole 2-byte characters as fit in 511 bytes */
    CHECK_EQ_INT(len, pre + (CAIRN_LOG_LINE_MAX - 1 - pre) / 2 * 2);
    CHECK(((unsigned char)out[0].text[len - 1]) == 0xa9); /* ends on a whole é */
    /* 4 threads x 200 lines: the ring holds the newest CAIRN_LOG_RING, each seq once, in order */
    pthread_t th[4];
    for (long t = 0; t < 4; t++)
        pthread_create(&th[t], NULL, log_many, (void *)t);
    for (int t = 0; t < 4; t++)
        pthread_join(th[t], NULL);
    n = cairn_log_recent(0, CAIRN_LOG_DEBUG, out, CAIRN_LOG_RING, &last);
    CHECK_EQ_INT(last, 6 + 800);
    CHECK_EQ_INT(n, CAIRN_LOG_RING);
    int in_order = 1;
    for (int i = 0; i < n; i++)
        in_order &= out[i].seq == last - (uint64_t)CAIRN_LOG_RING + 1 + (uint64_t)i;
    CHECK(in_order);
    /* an `after` older than the ring starts at its oldest line */
    CHECK_EQ_INT(cairn_log_recent(1, CAIRN_LOG_DEBUG, out, CAIRN_LOG_RING, NULL), CAIRN_LOG_RING);
    CHECK_EQ_INT(cairn_log_recent(last, CAIRN_LOG_DEBUG, out, CAIRN_LOG_RING, NULL), 0);
    cairn_log_set_level(CAIRN_LOG_INFO);
    return test_summary("test_log");
}
