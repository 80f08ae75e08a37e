/*
 * dk_dist_rank: what the feature knows about one rank of a run.
 *
 * The runtime thread fills it as the rank moves on (dk_dist_run's sink, under
 * the run's lock); the status display reads it while the job runs, and the
 * outcome (dk_dist_outcome) reads it once every rank has exited, to say what
 * became of each. A plain record, so that both can be tested on made-up ranks.
 */
#ifndef DK_DIST_RANK_H
#define DK_DIST_RANK_H

#include "dk_job.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct {
    dk_rank_state_t state;
    int exit_code;              /* -1 when ended by a signal */
    int term_signal;            /* 0 if none */
    void *message;              /* the RESULT or ERROR bytes it sent, or NULL */
    size_t message_len;
    bool is_error;              /* MESSAGE is an ERROR: {ename, evalue, traceback} */
    bool got_cell;              /* reached RUNNING: its cell or function was delivered */
    long long running_ms;       /* dk_now_ms when it first reached RUNNING (0: not yet),
                                 * for the status's slowest to start */
    bool log_complete;          /* its log has every byte (no disk refused a write) */
    bool log_capped;            /* its log keeps only head and tail (log_cap) */
    int gpu_index;              /* NVML index, -1 for CPU ranks */
    int pid;
    /* Ranks on other nodes: its node's name (borrowed; NULL: this node), and
     * whether it went silent past the heartbeat deadline (dk_job_rank_lost):
     * the outcome then says which nodes were lost, and their ranks. */
    const char *host;
    bool lost;
} dk_dist_rank_t;

#endif
