/*
 * dk_dist_stacks: where the ranks of a run that did not end by itself were.
 *
 * The runtime asks the live ranks for their stacks before it ends them
 * (dk_job_rank_stacks, runtime/stacks/dk_stackreq.h); this turns those dumps into
 * what the error shows under "Where the ranks were:" (dk_stacks_summary: the
 * ranks grouped by stack, the odd one out first, within 45 lines at any
 * size) and writes every dump to stacks.txt in the run's log folder, which
 * the error names. Pure but for that one file: no kernel, no job, no Python,
 * so a test drives it with made-up dumps.
 */
#ifndef DK_DIST_STACKS_H
#define DK_DIST_STACKS_H

#include <stddef.h>

/* The file of a run's log folder with every asked rank's full dump. */
#define DK_DIST_STACKS_FILE "stacks.txt"

/* The stacks of WORLD ranks: DUMPS[R] (LENS[R] bytes) is what rank R wrote
 * when asked, NULL when it was not asked (it had ended already). Rank R ran
 * on HOSTS[R] (HOSTS NULL: this node). Frames in files under CELLS_DIR (a
 * folder ending in '/', NULL: none) are the cells'. Writes every dump to
 * LOG_DIR/stacks.txt and puts its path in FILE ("" when it could not be
 * written: the reason goes to ERR, and the summary still comes back).
 * Returns the summary lines, each ending in '\n', naming FILE when groups
 * had to be left out (malloc'd); NULL when no rank was asked, or memory ran
 * out (ERR says which, "" for the first). */
char *dk_dist_stacks_report(int world, const char *const *dumps, const size_t *lens,
                            const char *const *hosts, const char *cells_dir, const char *log_dir,
                            char *file, size_t file_len, char *err, size_t errlen);

#endif
