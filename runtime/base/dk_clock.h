/*
 * dk_clock: the clocks distkernel's C code reads, defined once.
 *
 * Deadlines, graces and intervals use the monotonic clock (it never jumps
 * when the wall clock is set); only times shown to people or recorded in
 * MLflow use the wall clock. Header-only, like dk_err.h, so every layer can
 * use it without a link dependency. None of these can fail on Linux.
 */
#ifndef DK_CLOCK_H
#define DK_CLOCK_H

#include <time.h>

/* Milliseconds on the monotonic clock (an arbitrary origin: only differences
 * mean anything). */
static inline long long dk_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Seconds on the monotonic clock, with sub-millisecond precision. */
static inline double dk_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* Milliseconds since the Unix epoch (the wall clock), for records. */
static inline long long dk_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
