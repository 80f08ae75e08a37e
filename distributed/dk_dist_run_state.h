/*
 * dk_dist_run_state: one run's state, shared by the files that run it.
 *
 * Private to distributed/ (dk_dist_run.h is the API). A run is five files,
 * one idea each, over this one state:
 *   dk_dist_run.c         the handle: the three ways to make a run (a cell or
 *                         a function, `%distributed start`, a round on started
 *                         ranks), its options, plan and ranks' records, what
 *                         is said before anything starts; freeing it;
 *   dk_dist_run_start.c   starting the ranks: the MLflow run, the log folder,
 *                         what the job is built from (Slurm's nodes, the
 *                         warm socket, the agents' templates, MLflow's
 *                         secrets), which dk_dist_job.c builds without
 *                         Python, or a round on the started ranks; then the
 *                         status that says so;
 *   dk_dist_run_events.c  the job's events and what the cell shows of them:
 *                         the sink (on the runtime thread), the output's io,
 *                         the status display;
 *   dk_dist_run_end.c     the wait and the end: interrupts, the last facts,
 *                         the results, the error and where the ranks were;
 *   dk_dist_run_restart.c restarts=: the next attempt after a failed one.
 *
 * Three parties touch the state. The runtime thread calls the sink: output
 * goes to dk_dist_output, which has a lock of its own (it may wait on a slow
 * frontend, and the status display must not wait with it); states and
 * messages go to the ranks' records under LOCK. The main thread does the
 * rest, with the GIL held except while it waits. Once the job has ended, the
 * runtime thread is gone and the records are the main thread's alone.
 */
#ifndef DK_DIST_RUN_STATE_H
#define DK_DIST_RUN_STATE_H

#include "dk_dist_run.h"

#include "dk_dist_mlflow.h"
#include "dk_dist_opts.h"
#include "dk_dist_plan.h"
#include "dk_dist_rank.h"
#include "dk_dist_output.h"
#include "dk_dist_slurm.h"
#include "dk_dist_stall.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

struct dk_dist_run_t {
    dk_kernel_t *kernel;
    dk_dist_logs_t *logs;       /* the feature's, outlive the run */
    dk_template_t **warm;       /* the feature's warm-start template slot, or NULL */
    dk_tracking_t *tracking;
    const char *kind;           /* "cell" or "function" */
    dk_dist_opts_t opts;
    dk_dist_plan_t plan;
    char run_id[24];
    dk_job_t *job;
    dk_dist_output_t *output;
    bool *shown;                /* whose output the cell shows (dk_dist_plan_output), for
                                   the status; NULL: every rank's */
    pthread_mutex_t lock;       /* guards ranks */
    dk_dist_rank_t *ranks;      /* plan.world records */
    atomic_bool status_dirty;   /* set by the sink, read by the wait loop */
    bool status_shown;          /* the status display exists */
    long long t0_ms;
    bool interrupted, shutdown;
    dk_dist_mlflow_t mlflow;
    unsigned long long thinned_at_start;   /* the stream's thinned lines, before the run */
    /* On started ranks: the pool whose job this run borrows for one round (or,
     * for `%distributed start`, owns until dk_dist_run_take_pool). */
    dk_dist_pool_t *pool;
    bool owns_pool;
    /* The timeout the ranks got: opts.timeout_s, or less where the Slurm
     * allocation's time limit comes first (timeout_cut). */
    double timeout_s;
    bool timeout_cut;
    double slurm_end_s;         /* dk_now_s when the allocation's time limit ends it; 0: none */
    bool starting;              /* the run is the pool's start (round 0) */
    bool claimed;               /* this run set the pool busy */
    /* launcher=slurm: the run's allocation (released when the run is
     * destroyed), and the node of each rank (the allocation's), for the status. */
    dk_dist_slurm_t *slurm;
    const char *const *hosts;
    char log_dir[4096];         /* the run's log folder, once made */
    /* Where the ranks were when the run was ended (dk_dist_stacks), made
     * with the error once: the summary (NULL: none) and stacks.txt's path. */
    bool stacks_made;
    char *stacks;
    char stacks_file[4200];
    /* Where the ranks are while they are silent past stall_after (NULL:
     * off): told output and samples by the sink, asked by the wait. */
    dk_dist_stall_t *stall;
    /* restarts=: the attempt that runs (1 the first); the payload as the
     * first attempt got it, kept to start the next; each attempt's ranks'
     * log cap; when the first attempt started (timeout= counts from it); why
     * the next attempt could not start (malloc'd; NULL: none); the nodes
     * lost so far (N_LOST names, malloc'd), which a new Slurm allocation
     * leaves out, and the same as one Slurm host list ("node[3,7]"; NULL:
     * none). */
    int attempt;
    void *payload;
    size_t payload_len;
    unsigned long long log_cap;
    long long first_t0_ms;
    char *restart_error;
    char restart_ename[32];     /* its exception: RuntimeError, KeyboardInterrupt */
    char **lost;
    size_t n_lost;
    char *lost_list;
};

/* ---- dk_dist_run_events.c ---- */

/* TEXT to the cell's stderr. */
void dist_run_write_err(dk_dist_run_t *run, const char *text);
/* The run's status display, HEADLINE its first line (NULL: the usual).
 * FORCE: the first and last states, which must arrive; the updates in
 * between are skipped while a frontend is behind. */
void dist_run_publish_status(dk_dist_run_t *run, const char *headline, bool force);
/* What dk_dist_output calls to write the run's output into the cell. */
dk_dist_output_io_t dist_run_output_io(dk_dist_run_t *run);
/* The job's sink: its output and states to RUN. */
dk_sink_t dist_run_sink(dk_dist_run_t *run);

/* ---- dk_dist_run_start.c ---- */

/* The MLflow run, the log folder, the job (or the round on started ranks).
 * False with a Python exception set. */
bool dist_run_launch(dk_dist_run_t *run, const void *payload, size_t len);
/* The job runs: its status display, a thinning hint, the MLflow link. */
void dist_run_announce(dk_dist_run_t *run);
/* restarts=: the next attempt's ranks, once the last attempt's job is
 * destroyed: a log folder of its own (AGAIN: the one made by the try before,
 * which could not start), the same MLflow run, a new Slurm allocation without
 * the lost nodes. False with a Python exception set. */
bool dist_run_relaunch(dk_dist_run_t *run, bool again);

/* ---- dk_dist_run_end.c ---- */

/* The cell files' folder, ending in '/' (malloc'd), or NULL when no cell
 * has been written (python/distkernel/_cells.py). Needs the GIL. */
char *dist_run_cells_folder(void);
/* The run's error as it stands ({ename, evalue, traceback}, as
 * dk_dist_outcome_error), without what restarts= adds to it. */
json_t *dist_run_error(dk_dist_run_t *run, bool headline);
/* RUN's error E (dist_run_error's or dk_dist_run_error's) as the cell shows
 * it, without the terminal's colours, into DK_DIST_ERROR_FILE in the log
 * folder of its job. Whether it was written (why not goes to the log). */
bool dist_run_keep_error(dk_dist_run_t *run, json_t *e);
/* restarts=: the logs of the attempt that just failed go with the MLflow run
 * under attempt-N/ (the last attempt's, at its end, at the top, as a run
 * without restarts has them), its error.txt too when ERROR (it was kept),
 * before the next attempt's records replace its own. */
void dist_run_attempt_logs(dk_dist_run_t *run, bool error);

/* ---- dk_dist_run_restart.c ---- */

/* restarts=: whether the attempt that ended END is followed by another. A
 * failure is (a rank raised, exited or was killed, its node was lost), as
 * torchrun restarts its workers; an interrupt, a shutdown and the timeout
 * are the user's or the kernel's choice, and are not. */
bool dist_run_restartable(dk_dist_run_t *run, dk_job_end_t end);
/* restarts=: every rank of the failed attempt has ended; start the next. False
 * when it could not start (run->restart_error says why, and the run has no job).
 * GIVEN_ARGS (GIVEN_LEN bytes, "" at first) keeps the user's slurm_args. */
bool dist_run_restart(dk_dist_run_t *run, char *given_args, size_t given_len);

#endif
