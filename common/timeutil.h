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

/* Sleeps ms milliseconds (a signal may end it early). */
static inline void time_sleep_ms(uint64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000u), (long)(ms % 1000u) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The time ms milliseconds from now on clock clk: a pthread_cond_timedwait deadline
 * (CLOCK_REALTIME unless the condition variable was made for another clock). */
static inline struct timespec time_deadline(clockid_t clk, uint64_t ms)
{
    struct timespec ts;
    clock_gettime(clk, &ts);
    ts.tv_sec += (time_t)(ms / 1000u);
    ts.tv_nsec += (long)(ms % 1000u) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* Milliseconds since the Unix epoch (CLOCK_REALTIME). */
static inline uint64_t time_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* The time an update is applied at, in wall-clock ms: while time_op_set(ms) is in force on this
 * thread (a replicated group's operation: the time its primary logged it, so that every copy
 * applies it at the same time), that time; otherwise now. */
extern _Thread_local uint64_t time_op_ms_in_force;
/* The wall clock in ms, never less than it returned before in this process (a clock stepped
 * back holds still until it catches up: TTL and LRU ages only go forward). */
uint64_t time_wall_forward_ms(void);
static inline uint64_t time_op_ms(void)
{
    return time_op_ms_in_force ? time_op_ms_in_force : time_wall_forward_ms();
}
/* Sets the time of the operations this thread applies (0: now again). */
static inline void time_op_set(uint64_t ms)
{
    time_op_ms_in_force = ms;
}

#endif
