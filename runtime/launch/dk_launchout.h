/*
 * dk_launchout: a launcher's own lines told apart from its tasks' output.
 *
 * The node agents' launcher (srun, dk_job_agents.c) writes on its pipes what
 * its tasks, the agents, say about themselves, and the lines srun and
 * slurmstepd write themselves ("srun: error: node2: task 0: Killed",
 * "slurmstepd: error: *** STEP 12.3 ON node1 CANCELLED AT ... ***",
 * "slurmstepd-node1: error: couldn't chdir to ..."). Both go to agents.log;
 * an agent's own lines are read for what it says (why it gave up), and the
 * last launcher line that says more than an exit status is kept, for what is
 * said of agents that never connected.
 *
 * A filter per pipe splits the bytes: a line that starts with "srun: ",
 * "slurmstepd: " or "slurmstepd-NODE: " is a launcher line and is passed on
 * whole (held until its newline, the pipe's end, or LINE_MAX bytes); every
 * other byte is passed on as the task's, at once, since only a line start
 * that could still become a launcher prefix ("s", "slurmst", "slurmstepd-no")
 * has to wait for the bytes that decide it. Memory is bounded and fixed.
 */
#ifndef DK_LAUNCHOUT_H
#define DK_LAUNCHOUT_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    DK_LAUNCHOUT_RANK = 0,      /* a task's own bytes (an agent's), as read */
    DK_LAUNCHOUT_LAUNCHER = 1   /* a launcher line, '\n' included when it had one */
} dk_launchout_kind_t;

/* BYTES (LEN > 0) are valid only during the call. A launcher line longer than
 * DK_LAUNCHOUT_LINE_MAX arrives in pieces, the first starting with its prefix. */
typedef void (*dk_launchout_fn)(void *data, dk_launchout_kind_t kind, const char *bytes,
                                size_t len);

#define DK_LAUNCHOUT_LINE_MAX 4096

typedef struct dk_launchout_t dk_launchout_t;

/* A filter for one pipe, or NULL when out of memory. */
dk_launchout_t *dk_launchout_new(void);
void dk_launchout_destroy(dk_launchout_t **self_p);

/* Feed LEN bytes read from the pipe; FN(DATA, ...) gets them, in order,
 * split as the top of this file says. */
void dk_launchout_feed(dk_launchout_t *self, const char *bytes, size_t len, dk_launchout_fn fn,
                       void *data);

/* End of the pipe: what is held goes out (an unfinished launcher line as
 * one, the start of a line that never became one as the task's). */
void dk_launchout_finish(dk_launchout_t *self, dk_launchout_fn fn, void *data);

/* Whether LINE (LEN bytes, a trailing newline allowed) is a launcher line
 * that says more than its process's exit status: not "srun: error: node2:
 * task 0: Exited with exit code 1" (the exit code says that), nor srun's
 * own bookkeeping while a step ends ("Job step aborted: Waiting up to 32
 * seconds ...", "Terminating StepId=...", "forcing job termination"), but
 * "task 0: Killed", "Segmentation fault", "Node failure on node2", a step
 * CANCELLED, an out-of-memory kill, a step that could not be created. */
bool dk_launchout_tells(const char *line, size_t len);

#endif
