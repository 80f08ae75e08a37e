/*
 * dk_dist_outcome: what the user is told about a run that did not end well.
 *
 * From the job's end and its ranks' records to the error the cell (or the
 * .distributed() call) raises: its ename and evalue, and traceback lines that
 * say which rank failed first and how, the fate of every rank, and where the
 * logs are. Pure: data in, JSON out; no kernel, no Python, no job.
 */
#ifndef DK_DIST_OUTCOME_H
#define DK_DIST_OUTCOME_H

#include "dk_dist_rank.h"

#include <jansson.h>

typedef struct {
    dk_job_end_t end;             /* how the job ended (not DK_END_OK) */
    int root;                     /* the first rank to fail when end is DK_END_FAILED, else -1 */
    bool interrupted;             /* the user interrupted the run */
    bool shutdown;                /* the kernel was shutting down */
    double timeout_s;             /* the run's timeout=, for the timeout's wording */
    bool timeout_cut;             /* ... cut to end before the Slurm allocation's limit */
    const char *log_dir;          /* the run's log folder */
    int world;
    const dk_dist_rank_t *ranks;  /* WORLD records */
    /* A cell on started ranks (%distributed start): KEPT, the ranks are still
     * running (an interrupt, a timeout or an exception ended the cell only);
     * POOL_GONE, the ranks ended during the cell. */
    bool kept;
    bool pool_gone;
} dk_dist_outcome_t;

/* The fate of rank R in a few words into OUT ("rank 1: raised ValueError: bad"),
 * marked as the root cause when R is ROOT (-1: no root cause to name, and
 * ranks ended by distkernel say why: interrupted, shutdown or timeout). */
void dk_dist_outcome_fate(const dk_dist_outcome_t *o, int r, int root, char *out, size_t outlen);

/* The run's error, {ename, evalue, traceback}, a new reference (NULL when out
 * of memory). The traceback names the root cause (its own traceback when it
 * raised), then "Ranks:" with every rank's fate, then the logs, saying which a
 * full disk cut short and which keep only head and tail. With HEADLINE the
 * first line is "ename: evalue" (coloured as IPython colours it) and a blank
 * line follows it, for a cell's error output: some frontends show the
 * traceback and nothing else. A .distributed() call's exception gets its
 * headline in Python. */
json_t *dk_dist_outcome_error(const dk_dist_outcome_t *o, bool headline);

#endif
