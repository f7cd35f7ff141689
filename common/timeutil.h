/* Monotonic and wall clock helpers. */
#ifndef PSD_COMMON_TIMEUTIL_H
#define PSD_COMMON_TIMEUTIL_H

#include <stdint.h>
#include <time.h>

/* Nanoseconds on CLOCK_MONOTONIC. Never fails. */
static inline uint64_t time_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t time_now_ms(void)
{
    return time_now_ns() / 1000000u;
}

#endif
