/*
 * dk_stop: the one stop ladder of the runtime, as data and a step function.
 *
 * Stopping a process (or a process group) the runtime started is always the
 * same schedule: a first signal, and if it is still there after the grace the
 * next, and so on up the ladder; the default ladder is SIGINT (Python turns it
 * into KeyboardInterrupt, so cleanup runs), SIGTERM, SIGKILL, each one grace
 * after the one before. Who is signalled, and how, is the caller's business:
 * dk_job signals the groups of its ranks (skipping some), dk_proc one helper's
 * group. The ladder only says which signal is due when, by the caller's clock
 * (any unit, as long as the grace is in the same one), so it can be tested
 * without real time and used where only async-signal-safe code may run (it
 * makes no calls at all).
 *
 * A dk_stop_t is a plain value the caller owns; nothing to free.
 */
#ifndef DK_STOP_H
#define DK_STOP_H

#include <stdbool.h>

#define DK_STOP_MAX_SIGNALS 4

typedef struct {
    int signals[DK_STOP_MAX_SIGNALS];  /* the ladder, first rung first */
    int nsignals;
    double grace;           /* between one rung and the next, in the caller's unit */
    double began_at;        /* when the first signal was due (valid once sent > 0) */
    int sent;               /* how many rungs have been handed out */
    bool gone;              /* the target is gone: nothing more is due */
} dk_stop_t;

/* The default ladder, SIGINT -> SIGTERM -> SIGKILL, with GRACE between rungs. */
dk_stop_t dk_stop_ladder(double grace);

/* A ladder of the NSIGNALS (1..DK_STOP_MAX_SIGNALS, else clamped) SIGNALS. */
dk_stop_t dk_stop_custom(const int *signals, int nsignals, double grace);

/* Start the stop at NOW. Returns the first rung's signal, to be sent now, or 0
 * when the stop had already begun (the first start decides the schedule) or
 * the target is gone. */
int dk_stop_begin(dk_stop_t *stop, double now);

/* The signal due at NOW, or 0 if none is. Each call hands out at most one
 * rung, so a caller that slept through several calls it until it returns 0;
 * rung K (K = 0, 1, ...) is due at began_at + K * grace. */
int dk_stop_due(dk_stop_t *stop, double now);

/* When the next rung falls due (the caller's clock), or a negative value when
 * none will: not begun, every rung sent, or the target gone. For poll
 * timeouts. */
double dk_stop_next_at(const dk_stop_t *stop);

/* The target is gone (reaped): nothing more will be due. */
void dk_stop_gone(dk_stop_t *stop);

/* Whether the stop has begun. */
bool dk_stop_begun(const dk_stop_t *stop);

#endif
