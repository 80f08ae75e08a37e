/*
 * dk_stop: the stop ladder. See dk_stop.h.
 *
 * Rungs are timed from the start of the stop, not from the rung before, so a
 * caller that looks late sends the overdue rungs at once instead of pushing
 * the whole schedule back by its lateness. No library calls: the MLflow
 * server's guard runs it between fork and nothing (async-signal-safe only).
 */
#include "dk_stop.h"

#include <signal.h>

dk_stop_t dk_stop_ladder(double grace)
{
    static const int ladder[] = {SIGINT, SIGTERM, SIGKILL};
    return dk_stop_custom(ladder, 3, grace);
}

dk_stop_t dk_stop_custom(const int *signals, int nsignals, double grace)
{
    dk_stop_t stop = {.grace = grace};
    if (nsignals < 1)
        nsignals = 1;
    if (nsignals > DK_STOP_MAX_SIGNALS)
        nsignals = DK_STOP_MAX_SIGNALS;
    for (int i = 0; i < nsignals; i++)
        stop.signals[i] = signals ? signals[i] : SIGKILL;
    stop.nsignals = nsignals;
    return stop;
}

int dk_stop_begin(dk_stop_t *stop, double now)
{
    if (stop->sent > 0 || stop->gone)
        return 0;
    stop->began_at = now;
    stop->sent = 1;
    return stop->signals[0];
}

double dk_stop_next_at(const dk_stop_t *stop)
{
    if (stop->sent == 0 || stop->gone || stop->sent >= stop->nsignals)
        return -1;
    return stop->began_at + stop->sent * stop->grace;
}

int dk_stop_due(dk_stop_t *stop, double now)
{
    double next = dk_stop_next_at(stop);
    if (next < 0 || now < next)
        return 0;
    return stop->signals[stop->sent++];
}

void dk_stop_gone(dk_stop_t *stop)
{
    stop->gone = true;
}

bool dk_stop_begun(const dk_stop_t *stop)
{
    return stop->sent > 0;
}
