/*
 * dk_slurm_command: one Slurm command run to its end, within a deadline.
 *
 * Private to runtime/slurm/: dk_slurm.c runs salloc, squeue and scancel for
 * an allocation, dk_slurm_query.c runs sinfo for the questions before a run,
 * both through slurm_run (see the top of dk_slurm.c, "Bounded time").
 */
#ifndef DK_SLURM_COMMAND_H
#define DK_SLURM_COMMAND_H

#include "dk_slurm.h"

#include <stdbool.h>
#include <stddef.h>

#define SAY_MAX 2048            /* what a command said on stderr, kept for messages */

typedef struct {
    double deadline;                /* monotonic s */
    bool timed_out;
    char said[SAY_MAX];             /* stderr, what fits */
    size_t said_len;
    const dk_slurm_query_t *query;  /* a question's caller, whose cancel stops it; or NULL */
    /* while salloc waits */
    const dk_slurm_request_t *req;
    dk_slurm_t *job;                /* its job_id is filled from stderr */
    double wait_end;                /* 0: no wait limit */
    double next_poll;
    int stop;                       /* 1 cancelled, 2 wait limit */
    char state[32], reason[128];
} command_t;

/* Run Slurm's PROGRAM with ARGS (NULL-terminated, argv[0] excluded) to its end,
 * within TIMEOUT_S (0: none; C->deadline is set here). Its stdout into *OUT when
 * OUT is not NULL. Returns its exit code (>= 0), or -1 with ERR when it could
 * not run, was ended by a signal, or passed its deadline. */
int slurm_run(const char *program, const char *const *args, double timeout_s, command_t *c,
              char **out, char *err, size_t errlen);

/* The stderr a message quotes: its last line that says something, trimmed. */
const char *slurm_said_text(command_t *c);

#endif
