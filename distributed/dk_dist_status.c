/*
 * dk_dist_status: a run's status display text. See the header.
 *
 * One line for the run, one for the ranks (a rank's state in a word, and its
 * GPU memory while it runs: the first thing to look at when a job is slow or
 * about to run out), one for where the logs are.
 */
#include "dk_dist_status.h"

#include <stdio.h>
#include <stdlib.h>

static const char *state_word(dk_rank_state_t st)
{
    switch (st) {
    case DK_RANK_STARTING: return "starting";
    case DK_RANK_RUNNING: return "running";
    case DK_RANK_DONE: return "done";
    case DK_RANK_FAILED: return "failed";
    case DK_RANK_STOPPED: return "stopped";
    }
    return "?";
}

char *dk_dist_status_text(const dk_dist_status_t *st)
{
    size_t cap = 512 + (size_t)st->world * 140;
    char *text = malloc(cap);
    if (!text)
        return NULL;
    size_t n = 0;
    n += (size_t)snprintf(text + n, cap - n, "distributed: %s · %.1f s%s%s\n", st->what,
                          st->elapsed_s, st->headline ? " · " : "",
                          st->headline ? st->headline : "");
    for (int r = 0; r < st->world && n < cap; r++) {
        const dk_dist_rank_t *ri = &st->ranks[r];
        n += (size_t)snprintf(text + n, cap - n, "%srank %d%s%.40s %s", r ? " · " : "  ", r,
                              st->hosts ? " on " : "", st->hosts ? st->hosts[r] : "",
                              state_word(ri->state));
        if (n >= cap)
            break;
        if (st->gpu && ri->gpu_index >= 0 && ri->state == DK_RANK_RUNNING && ri->pid > 0) {
            unsigned long long used = st->gpu_memory(ri->gpu_index, ri->pid);
            if (used && n < cap)
                n += (size_t)snprintf(text + n, cap - n, " (GPU %.1f GiB)",
                                      (double)used / (1024.0 * 1024.0 * 1024.0));
        }
    }
    if (n < cap)
        snprintf(text + n, cap - n, "\n  logs: %s", st->log_dir);
    return text;
}
