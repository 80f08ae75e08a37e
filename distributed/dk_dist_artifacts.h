/*
 * dk_dist_artifacts: what of a run's log folder goes with its MLflow run.
 *
 * The managed platform shows every worker's logs in the run; ours are in the
 * log folder, and a copy goes with the run as its artifacts when it ends
 * (dk_dist_mlflow_end), so that the run's page has them wherever the
 * notebook was. Bounded at any size:
 *   - up to DK_ARTIFACTS_EACH ranks: each rank's log as logs/rank-N.log;
 *   - above: rank 0, the root cause and the first failed ranks (at most
 *     DK_ARTIFACTS_PICKED) as logs/rank-N.log, every rank's log in one
 *     archive, logs/ranks.tar.gz (with the agents' and warm-start notes), and
 *     logs/index.txt, a line per rank: its node, how it ended, its log's size
 *     and how much of it the archive holds;
 *   - stacks.txt, where the ranks were, when the run did not finish;
 *   - error.txt, the run's error as the cell showed it, when it did not
 *     finish (and each failed attempt's, under restarts=).
 * A log attached on its own keeps its last DK_ARTIFACTS_LOG_MAX bytes; in the
 * archive each keeps its last DK_ARTIFACTS_ARCHIVE_MAX / world bytes (at
 * least DK_ARTIFACTS_ARCHIVE_EACH_MIN): at 1,024 ranks 256 KiB each. A log
 * cut says so in its first line. The log folder itself is never changed.
 */
#ifndef DK_DIST_ARTIFACTS_H
#define DK_DIST_ARTIFACTS_H

#include "dk_dist_rank.h"
#include "dk_tracking.h"

#include <stdbool.h>
#include <stddef.h>

#define DK_ARTIFACTS_EACH 8
/* The run's error in its log folder, as the cell showed it (dk_dist_run_end.c). */
#define DK_DIST_ERROR_FILE "error.txt"
#define DK_ARTIFACTS_PICKED 4
#define DK_ARTIFACTS_LOG_MAX (4u << 20)
#define DK_ARTIFACTS_ARCHIVE_MAX (256u << 20)
#define DK_ARTIFACTS_ARCHIVE_EACH_MIN (64u << 10)
#define DK_ARTIFACTS_STACKS_MAX (16u << 20)

typedef struct {
    const char *log_dir;
    int world;
    const dk_dist_rank_t *ranks;    /* how each ended (its state); NULL: not known */
    const char *const *hosts;       /* each rank's node; NULL, or NULL entries: this host */
    int root;                       /* the root cause, or -1 */
    bool stacks;                    /* the run did not finish: stacks.txt too */
    bool error;                     /* the run's error is in the folder: error.txt too */
    /* A folder of the run's artifacts the files go under ("attempt-1/": a
     * failed attempt of a run under restarts=); NULL: the top. */
    const char *under;
} dk_dist_artifacts_t;

/* The ranks whose logs go as files of their own, in order (at most CAP, into
 * OUT); the count. */
int dk_dist_artifacts_pick(const dk_dist_artifacts_t *a, int *out, int cap);

/* The files to store for A, read from its log folder (each file's data is
 * malloc'd); *N their count. A file that cannot be read is left out (a rank
 * that never started has no log). NULL with *N 0 when there is nothing or no
 * memory. */
dk_tracked_file_t *dk_dist_artifacts_collect(const dk_dist_artifacts_t *a, size_t *n);

void dk_dist_artifacts_free(dk_tracked_file_t *files, size_t n);

#endif
