/*
 * dk_dist_mlflow: one run's MLflow bookkeeping, as the run sees it.
 *
 * dk_tracking creates and ends the MLflow run; this gives the ranks the run's
 * MLFLOW_TRACKING_URI, MLFLOW_RUN_ID and MLFLOW_EXPERIMENT_ID (the kernel's own
 * environment, those three replaced), tells the user what tracking had to say,
 * and links the run's page in the cell. It nests the run under the notebook's
 * active MLflow run when the notebook's Python has one.
 */
#ifndef DK_DIST_MLFLOW_H
#define DK_DIST_MLFLOW_H

#include "dk_kernel.h"
#include "dk_dist_artifacts.h"
#include "dk_tracking.h"

/* One run's tracking; zeroed is "not tracked". Owns nothing. */
typedef struct {
    dk_tracked_run_t tracked;
    char env[4][1400];           /* the run's MLFLOW_* variables, for the ranks */
} dk_dist_mlflow_t;

/* Create the MLflow run for REQ in TRACKING (its parent_run_id is filled here) and write
 * tracking's note, if any, to KERNEL's stderr. Returns the ranks' environment
 * (malloc'd array of pointers into environ and SELF; free the array alone), or
 * NULL for the kernel's own: tracking is off, or out of memory. Holds the GIL. */
char **dk_dist_mlflow_begin(dk_dist_mlflow_t *self, dk_tracking_t *tracking, dk_kernel_t *kernel,
                            dk_tracking_request_t req);

/* End the MLflow run with STATUS ("FINISHED", "FAILED", "KILLED"), if there is
 * one, and store what FILES picks of the log folder with it (NULL: nothing;
 * dk_dist_artifacts.h). What could not be recorded is said in one line on
 * KERNEL's stderr, with where the logs are. */
void dk_dist_mlflow_end(dk_dist_mlflow_t *self, dk_kernel_t *kernel, const char *status,
                        const dk_dist_artifacts_t *files);

/* Store what FILES picks of a log folder with the MLflow run, if there is
 * one, under FILES->under; what could not be stored is said in one line on
 * KERNEL's stderr, with where the logs are. */
void dk_dist_mlflow_attach(dk_dist_mlflow_t *self, dk_kernel_t *kernel,
                           const dk_dist_artifacts_t *files);

/* Record the Slurm job and the nodes a run got (dk_tracking_log_slurm);
 * tracking's note goes to KERNEL's stderr. */
void dk_dist_mlflow_slurm(dk_dist_mlflow_t *self, dk_kernel_t *kernel, const char *job_id,
                          const char *nodes);

/* The ranks' environment for another attempt of the same MLflow run (as
 * dk_dist_mlflow_begin returned it), or NULL for the kernel's own. */
char **dk_dist_mlflow_ranks_env(dk_dist_mlflow_t *self);

/* Record in the MLflow run that attempt ATTEMPT of ATTEMPTS runs, and, when
 * ENDED is not NULL, how the one before it ended (one line). Tracking's
 * note goes to KERNEL's stderr. */
void dk_dist_mlflow_attempt(dk_dist_mlflow_t *self, dk_kernel_t *kernel, int attempt,
                            int attempts, const char *ended);

/* Show a link to the run's page in the cell (nothing when not tracked). */
void dk_dist_mlflow_publish_link(dk_dist_mlflow_t *self, dk_kernel_t *kernel);

#endif
