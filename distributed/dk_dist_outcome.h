/*
 * dk_dist_outcome: what the user is told about a run that did not end well.
 *
 * From the job's end and its ranks' records to the error the cell (or the
 * .distributed() call) raises: its ename and evalue, and traceback lines that
 * say which rank failed first and how, the fate of every rank, and where the
 * logs are. Pure: data in, JSON out; no kernel, no Python, no job (but for
 * the one file dk_dist_outcome_write_fates writes).
 *
 * At any world size the error stays readable: up to
 * DK_DIST_OUTCOME_EACH_RANK_MAX ranks it gives every rank a line; above, one
 * line per fate with its ranks as runs ("ranks 0–151, 153–255 (255): ended
 * by distkernel after rank 152 failed"), the root cause's first, and the
 * whole error within DK_DIST_OUTCOME_MAX_LINES lines besides the root cause's
 * own traceback (the rank's, whatever the size); where the ranks were
 * (dk_dist_stacks) counts within them and leaves the fates fewer lines, but
 * it may take its own 45 and the fates keep at least 4. Every rank's fate, one line each, then goes to a file of the
 * run's log folder that the error names.
 */
#ifndef DK_DIST_OUTCOME_H
#define DK_DIST_OUTCOME_H

#include "dk_dist_rank.h"

#include <jansson.h>

/* Up to this many ranks, the error gives each its own line. */
#define DK_DIST_OUTCOME_EACH_RANK_MAX 8
/* Above, the error's lines at most, its root cause's traceback aside. */
#define DK_DIST_OUTCOME_MAX_LINES 40
/* The file of a run's log folder with every rank's fate (grouped errors). */
#define DK_DIST_OUTCOME_FATES_FILE "ranks.txt"

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
    /* Where dk_dist_outcome_write_fates wrote every rank's fate, named by an
     * error that groups them; NULL when not written. */
    const char *ranks_file;
    /* Where the live ranks were when the run was ended (dk_dist_stacks: lines
     * ending in '\n'), shown first under "Where the ranks were:"; NULL or ""
     * when no rank was asked. STACKS_FILE: the file with every dump (NULL:
     * not written). */
    const char *stacks;
    const char *stacks_file;
} dk_dist_outcome_t;

/* The fate of rank R in a few words into OUT ("rank 1: raised ValueError: bad"),
 * marked as the root cause when R is ROOT (-1: no root cause to name, and
 * ranks ended by distkernel say why: interrupted, shutdown or timeout). */
void dk_dist_outcome_fate(const dk_dist_outcome_t *o, int r, int root, char *out, size_t outlen);

/* The run's error, {ename, evalue, traceback}, a new reference (NULL when out
 * of memory). The traceback says first where the live ranks were when the
 * run was ended (STACKS, under "Where the ranks were:", then the stacks
 * file), then names the root cause (its own traceback when it
 * raised, under a line with its rank and node), then "Ranks:" with every
 * rank's fate (grouped above DK_DIST_OUTCOME_EACH_RANK_MAX ranks, and then
 * the ranks file named), then the logs, saying which a full disk cut short
 * and which keep only head and tail. With HEADLINE the
 * first line is "ename: evalue" (coloured as IPython colours it) and a blank
 * line follows it, for a cell's error output: some frontends show the
 * traceback and nothing else. A .distributed() call's exception gets its
 * headline in Python. */
json_t *dk_dist_outcome_error(const dk_dist_outcome_t *o, bool headline);

/* Write every rank's fate, one line each in rank order ("rank 7: finished"),
 * to PATH (created 0600, replaced if there, never through a symlink).
 * Returns 0, or -1 with ERR. */
int dk_dist_outcome_write_fates(const dk_dist_outcome_t *o, const char *path, char *err,
                                size_t errlen);

#endif
