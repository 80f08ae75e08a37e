/*
 * dk_tracking: every distributed run is an MLflow run.
 *
 * Before the ranks start, the kernel finds or creates the experiment, creates
 * the run (a child of the notebook's active run, if any) with its tags and
 * parameters, and hands the ranks MLFLOW_TRACKING_URI, MLFLOW_RUN_ID and
 * MLFLOW_EXPERIMENT_ID, so `mlflow.log_metric` in rank code lands in it. After
 * every rank has exited it writes the true final status, which wins over the
 * FINISHED a rank's own MLflow client writes at its exit.
 *
 * Where the run is recorded: MLFLOW_TRACKING_URI (http or https); without it,
 * when the `mlflow` command is installed, a tracking server the kernel starts on
 * a free loopback port with MLflow's own default store (sqlite:///mlflow.db in
 * the notebook's directory) and stops when it exits; otherwise nowhere, said
 * once in one line. A tracking server that is down, slow or failing costs a
 * bounded few seconds and one warning line, never the run.
 */
#ifndef DK_TRACKING_H
#define DK_TRACKING_H

#include "dk_dist_opts.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    bool active;                /* a run was created */
    char tracking_uri[1024];    /* as given, credentials included (for requests; never shown) */
    char experiment_id[128];
    char run_id[128];
    char run_name[256];
    char url[2048];             /* the run's page */
    long long start_ms;
} dk_tracked_run_t;

typedef struct {
    const dk_dist_opts_t *opts;
    int world_size;
    bool gpu;
    const char *device;         /* "NVIDIA H100 80GB HBM3" or "cpu" */
    const char *accelerator_model; /* "H100" or "" */
    const char *kind;           /* "cell" or "function" */
    const char *parent_run_id;  /* the notebook's active run, or NULL */
    const char *pool_id;        /* the started ranks the run ran on (tag distkernel.pool), or NULL */
} dk_tracking_request_t;

/* What tracking remembers between runs: the server the kernel started, the
 * experiment id last used, whether "tracking is off" was said. One per kernel,
 * owned by the distributed feature. */
typedef struct dk_tracking_t dk_tracking_t;

/* A new tracking state (no server yet), or NULL when out of memory. */
dk_tracking_t *dk_tracking_new(void);

/* Stop the server, if any, and free the state. */
void dk_tracking_destroy(dk_tracking_t **self_p);

/* Create the run for REQ. On success OUT->active is true. Whatever happens, a
 * line for the user may be written into NOTE ("" if none): why tracking is off,
 * or a warning that the server could not be reached. */
void dk_tracking_begin(dk_tracking_t *self, const dk_tracking_request_t *req, dk_tracked_run_t *out, char *note,
                       size_t notelen);

/* Write the final STATUS ("FINISHED", "FAILED", "KILLED") and end time of RUN
 * (no-op if it is not active). A warning for the user may go into NOTE. */
void dk_tracking_end(dk_tracked_run_t *run, const char *status, char *note, size_t notelen);

/* A file to store with a run (an MLflow artifact): PATH in the run's
 * artifacts ("logs/rank-0.log"), LEN bytes at DATA. */
typedef struct {
    char path[64];
    const void *data;
    size_t len;
} dk_tracked_file_t;

/* Store FILES (N of them) with RUN, in order, stopping at the first that
 * fails (a server that is down fails them all: it is asked once). Returns
 * how many were stored; on a failure, why goes into WHY. No-op (0) if RUN is
 * not active. */
size_t dk_tracking_attach(dk_tracked_run_t *run, const dk_tracked_file_t *files, size_t n,
                          char *why, size_t whylen);

/* Record where a run on a Slurm cluster ran: parameters slurm_job_id (JOB_ID)
 * and nodes (NODES, the nodes the run's ranks are on, as Slurm writes a node
 * list: "node[1-16]"), once Slurm has given them (after the run
 * was created). No-op if RUN is not active; a warning may go into NOTE. */
void dk_tracking_log_slurm(dk_tracked_run_t *run, const char *job_id, const char *nodes,
                           char *note, size_t notelen);

/* Set TAGS (a JSON object of strings, borrowed) on RUN: its attempts under
 * restarts=. No-op if RUN is not active; a warning may go into NOTE. */
void dk_tracking_tag(dk_tracked_run_t *run, json_t *tags, char *note, size_t notelen);

/* Stop the tracking server SELF started, if any. Safe to call from any
 * thread, more than once, and on the way out of the process. */
void dk_tracking_stop_server(dk_tracking_t *self);

#endif
