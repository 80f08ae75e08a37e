/*
 * dk_dist_run: one run of a cell or a function as N ranks, start to end.
 *
 * Start: parse the options, plan the ranks (dk_dist_plan), run the preflight
 * check when asked (dk_dist_preflight), create the MLflow run
 * (dk_dist_mlflow), make the log folder (dk_dist_logs) and start the job
 * (runtime/launch/dk_job) with a sink: output goes to dk_dist_output,
 * states and messages to the ranks' records (dk_dist_rank). Wait: with the GIL
 * released, waking every DK_DIST_WAIT_SLICE_MS to honour an interrupt or a
 * shutdown (which end every rank), to tick the output and to refresh the status
 * display (dk_dist_status). End: the result bytes, or the error
 * (dk_dist_outcome).
 *
 * Called from Python entry points with the GIL held; errors are Python
 * exceptions, which is how the cell or the caller reads them.
 */
#ifndef DK_DIST_RUN_H
#define DK_DIST_RUN_H

#include "dk_pyabi.h"

#include "dk_dist_logs.h"
#include "dk_dist_pool.h"
#include "dk_job.h"
#include "dk_kernel.h"
#include "dk_template.h"
#include "dk_tracking.h"

#include <jansson.h>

#define DK_DIST_WAIT_SLICE_MS 50
#define DK_DIST_STATUS_EVERY_MS 1000

typedef struct dk_dist_run_t dk_dist_run_t;

/* What a run uses of the feature, which outlives it (borrowed). */
typedef struct {
    dk_kernel_t *kernel;        /* the run writes into its current cell */
    dk_dist_logs_t *logs;       /* the run folders the kernel keeps */
    dk_tracking_t *tracking;    /* MLflow's server and experiment cache */
    dk_template_t **warm;       /* the warm-start template (dk_dist_warm), or a NULL slot */
    char **pythonpath_said;     /* the refused PYTHONPATH entries last said, or a NULL slot */
} dk_dist_host_t;

/* Start a run of PAYLOAD (LEN bytes: the pickled cell or function, which the
 * ranks unpickle) as the OPTIONS text asks ("num_processes=2 timeout=60"), for
 * KIND "cell" or "function", in HOST's kernel's current cell, its log folder
 * made in HOST's logs. Returns the running run, or NULL with a Python exception set
 * (ValueError for bad options, RuntimeError when no rank could start,
 * KeyboardInterrupt when interrupted while starting). */
dk_dist_run_t *dk_dist_run_start(const dk_dist_host_t *host, const char *kind, const char *options,
                                 const void *payload, size_t len);

/* `%distributed start OPTIONS`: start ranks that stay (a persistent job),
 * with a status display and log folder like a run's; dk_dist_run_wait waits
 * until every rank is ready. After DK_END_OK, dk_dist_run_take_pool hands the
 * ranks over; otherwise destroying the run ends them. NULL with a Python
 * exception set, as dk_dist_run_start. */
dk_dist_run_t *dk_dist_run_start_pool(const dk_dist_host_t *host, const char *options);
dk_dist_pool_t *dk_dist_run_take_pool(dk_dist_run_t *self);

/* Start a run of PAYLOAD on the started ranks of POOL (their size; OPTIONS
 * give the rest: timeout=, output=, result=, MLflow's). The run is one round
 * of the pool's job: waiting, results and errors as for dk_dist_run_start,
 * except that an exception, an interrupt or the timeout leaves the ranks
 * running. NULL with a Python exception set. */
dk_dist_run_t *dk_dist_run_start_on(const dk_dist_host_t *host, dk_dist_pool_t *pool,
                                    const char *kind, const char *options, const void *payload,
                                    size_t len);

/* Wait until every rank has exited, honouring interrupts and a kernel shutdown
 * (which end every rank); the cell then has all the ranks' output and the
 * status display its final state. Returns how the job ended. */
dk_job_end_t dk_dist_run_wait(dk_dist_run_t *self);

/* After a run that ended DK_END_OK: every rank's value bytes as a new list
 * (None where a rank sent none), or NULL with a Python exception set. */
PyObject *dk_dist_run_results(dk_dist_run_t *self);

/* After a run that did not end OK: its error, {ename, evalue, traceback}, as
 * dk_dist_outcome_error (HEADLINE: its first line says what happened). New
 * reference, NULL when out of memory. */
json_t *dk_dist_run_error(dk_dist_run_t *self, bool headline);

/* Whether a run on started ranks failed because they were gone before its
 * cell reached them: the root cause is a rank that ended (killed, exited)
 * without taking the cell. A rank killed just before the cell was sent is
 * news about the ranks, not about the cell (the same news a cell gets when the
 * kernel had noticed first). */
bool dk_dist_run_pool_gone_before_cell(dk_dist_run_t *self);

/* The run's log folder. */
const char *dk_dist_run_log_dir(dk_dist_run_t *self);

/* The MLflow run's page, "" when not tracked. */
const char *dk_dist_run_url(dk_dist_run_t *self);

/* The result= option: the name the cell's results go under, "" for none. */
const char *dk_dist_run_result_name(dk_dist_run_t *self);

/* End the job if it still runs and free the run. */
void dk_dist_run_destroy(dk_dist_run_t **self_p);

#endif
