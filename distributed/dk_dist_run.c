/*
 * dk_dist_run: a run's lifecycle. See the header.
 *
 * This file is the handle: the three ways a run is made, what it is made of,
 * and its end. dk_dist_run_state.h says which file holds the rest (starting
 * the ranks, the job's events, the wait and the end).
 *
 * A run of a cell or a function parses its options and plans its ranks on
 * this node (or Slurm's); `%distributed start` does the same and makes the
 * pool that will keep the ranks. A run on started ranks (dk_dist_pool) takes
 * the pool's options as its defaults and the pool's plan, and is one round of
 * the pool's persistent job: the same output, records, status, log folder,
 * MLflow run and outcome, but the job is borrowed and the sink reaches the
 * run through the pool while it is attached. One run at a time uses the
 * pool: it claims it (busy) when it starts and frees it when destroyed.
 *
 * Whatever the way, the rest of the start is the same (run_begin): the
 * output= list checked against the world, a word on PYTHONPATH, the
 * preflight check, the output and the stall watch, then the launch.
 */
#include "dk_dist_run_state.h"
#include "dk_clock.h"
#include "dk_setting.h"
#include "dk_codepath.h"
#include "dk_random.h"
#include "dk_dist_pool.h"
#include "dk_dist_preflight.h"
#include "dk_gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dk_dist_run_destroy(dk_dist_run_t **self_p)
{
    dk_dist_run_t *run = self_p ? *self_p : NULL;
    if (!run)
        return;
    if (run->pool) {
        /* First: the job's thread calls the output through the pool. */
        dk_dist_pool_attach(run->pool, NULL);
        run->job = NULL;        /* the pool's */
        if (run->claimed)
            dk_dist_pool_set_busy(run->pool, false);
        if (run->owns_pool)
            dk_dist_pool_destroy(&run->pool);
    }
    dk_job_destroy(&run->job);   /* first: its thread calls the output */
    dk_dist_slurm_destroy(&run->slurm);     /* after: the ranks are its steps */
    dk_dist_output_destroy(&run->output);
    dk_dist_stall_destroy(&run->stall);
    free(run->shown);
    for (int r = 0; run->ranks && r < run->plan.world; r++)
        free(run->ranks[r].message);
    free(run->ranks);
    free(run->stacks);
    free(run->payload);
    free(run->restart_error);
    for (size_t i = 0; i < run->n_lost; i++)
        free(run->lost[i]);
    free(run->lost);
    free(run->lost_list);
    pthread_mutex_destroy(&run->lock);
    free(run);
    *self_p = NULL;
}

/* Started ranks stay when a cell on them raises: there is no world to restart. */
#define RESTARTS_ON_STARTED                                                                    \
    "restarts= starts a run's own ranks again; started ranks (`%distributed start`) stay "    \
    "when a cell on them fails. Run the cell with `%%distributed restarts=K` (no ranks "       \
    "started), or `%distributed stop` first"

/* NULL with a Python exception set, after freeing RUN. */
static dk_dist_run_t *fail(dk_dist_run_t *run, PyObject *type, const char *msg)
{
    if (type == PyExc_MemoryError)
        PyErr_NoMemory();
    else if (type)
        PyErr_SetString(type, msg);
    dk_dist_run_destroy(&run);
    return NULL;
}

/* The run's id: its status display's and its log folder's name, so two
 * runs must never share one (an update to one display would change both). */
static void random_id(char out[24])
{
    dk_unique_hex(out, 8);
}

/* The run as OPTIONS asks, planned on this node (or Slurm's), with its ranks' records. */
static dk_dist_run_t *run_plan(dk_kernel_t *kernel, const char *kind, const char *options)
{
    dk_dist_run_t *run = calloc(1, sizeof *run);
    if (!run) {
        PyErr_NoMemory();
        return NULL;
    }
    pthread_mutex_init(&run->lock, NULL);
    run->kernel = kernel;
    run->kind = kind;
    char err[1024];
    if (dk_dist_opts_parse(options, &run->opts, err, sizeof err) < 0)
        return fail(run, PyExc_ValueError, err);
    run->timeout_s = run->opts.timeout_s;
    /* The decorator says its own deprecations, as Python FutureWarnings at the
     * caller's line, and only where the platform deprecates them (databricks.air;
     * under serverless_gpu, gpus= and gpu_type= are the names): python/distkernel/_api.py. */
    if (run->opts.warnings[0] && strcmp(kind, "cell") == 0) {
        char line[600];
        snprintf(line, sizeof line, "%s\n", run->opts.warnings);
        dist_run_write_err(run, line);
    }
    if (run->opts.launcher == DK_LAUNCHER_SLURM && dk_dist_slurm_preflight(&run->opts) < 0)
        return fail(run, NULL, NULL);
    if (run->opts.launcher == DK_LAUNCHER_SLURM) {
        /* The ranks run on Slurm's nodes: what this host has decides nothing. */
        if (dk_dist_slurm_plan(&run->opts, &run->plan) < 0)
            return fail(run, NULL, NULL);
    } else {
        dk_gpu_list_t gpus = {0};
        if (!run->opts.num_processes)
            dk_gpu_discover(&gpus);
        if (dk_dist_plan(&run->opts, &gpus, &run->plan, err, sizeof err) < 0)
            return fail(run, PyExc_RuntimeError, err);
    }
    if (run->plan.notice[0]) {
        char line[sizeof run->plan.notice + 16];
        snprintf(line, sizeof line, "distkernel: %s\n", run->plan.notice);
        dist_run_write_err(run, line);
    }
    run->ranks = calloc((size_t)run->plan.world, sizeof *run->ranks);
    if (!run->ranks)
        return fail(run, PyExc_MemoryError, NULL);
    for (int r = 0; r < run->plan.world; r++)
        run->ranks[r].gpu_index = dk_dist_plan_local_gpu(&run->plan, r);
    return run;
}

/* The kernel's PYTHONPATH entries that fail the rule for code (dk_codepath.h):
 * the first few names, their count, and the first one's reason. */
typedef struct {
    char names[512];
    char first_why[512];
    int n;
} refused_t;

static void note_refused(void *data, const char *entry, const char *why)
{
    refused_t *r = data;
    if (entry[0] != '/')
        return;     /* relative: on this node, the kernel's folder's, as always */
    if (r->n == 0)
        snprintf(r->first_why, sizeof r->first_why, "%s", why);
    if (r->n < 3) {
        size_t at = strlen(r->names);
        snprintf(r->names + at, sizeof r->names - at, "%s%s", at ? ", " : "", entry);
    }
    r->n++;
}

/* Say in the cell, once for each new set, which of the kernel's PYTHONPATH
 * entries another user of this machine could have put code in: ranks on
 * other nodes leave them off (dk_rankpyenv.h); on this node the kernel
 * imported from them already, and its ranks do too. SAID keeps what was
 * said last. */
static void say_pythonpath(dk_dist_run_t *run, char **said)
{
    const char *path = getenv("PYTHONPATH");
    refused_t r = {.n = 0};
    char *kept = said && path && *path ? dk_codepath_filter(path, note_refused, &r) : NULL;
    free(kept);
    if (!said)
        return;
    if (r.n == 0) {
        free(*said);
        *said = NULL;
        return;
    }
    if (*said && strcmp(*said, r.names) == 0)
        return;
    char line[1600];
    if (r.n == 1)
        snprintf(line, sizeof line, "distkernel: PYTHONPATH names %s, which another user of this "
                 "machine could put code in (%s). Ranks on other nodes leave it off; on this "
                 "node it is used. Keep your modules in a folder only you can write.\n",
                 r.names, r.first_why);
    else
        snprintf(line, sizeof line, "distkernel: PYTHONPATH names %d folders another user of "
                 "this machine could put code in: %s%s (the first: %s). Ranks on other nodes "
                 "leave them off; on this node they are used. Keep your modules in folders only "
                 "you can write.\n", r.n, r.names, r.n > 3 ? ", ..." : "", r.first_why);
    dist_run_write_err(run, line);
    free(*said);
    *said = strdup(r.names);
}

/* The rest of a start, once RUN is planned (and, on started ranks, has its
 * pool): preflight, output, launch, announce. */
static dk_dist_run_t *run_begin(dk_dist_run_t *run, const dk_dist_host_t *host,
                                const void *payload, size_t len)
{
    dk_kernel_t *kernel = host->kernel;
    run->logs = host->logs;
    run->warm = host->warm;
    run->tracking = host->tracking;
    /* output=: a list with a rank past the world is the user's to fix before
     * anything of the run exists (the check, an allocation, a log folder). */
    bool *shown;
    char err[1024];
    if (dk_dist_plan_output(&run->plan, &run->opts, &shown, err, sizeof err) < 0)
        return fail(run, PyExc_ValueError, err);
    say_pythonpath(run, host->pythonpath_said);
    if (run->opts.check && run->plan.remote)
        /* The check runs on this host's GPUs, which are not the ranks'. */
        dist_run_write_err(run, "distkernel: check=True tests this host's GPUs, not Slurm's "
                                "nodes; skipped for this run\n");
    else if (run->opts.check && dk_dist_preflight(dk_kernel_stream(kernel), run->plan.gpu) < 0) {
        free(shown);
        return fail(run, NULL, NULL);
    }
    if (!run->run_id[0])
        random_id(run->run_id);
    dk_dist_output_io_t io = dist_run_output_io(run);
    run->output = dk_dist_output_new(run->plan.world, run->run_id, shown, &io);
    run->shown = shown;
    if (!run->output)
        return fail(run, PyExc_MemoryError, NULL);
    run->t0_ms = dk_now_ms();   /* the wait for Slurm's nodes; announce starts the ranks' */
    /* Made before the job, whose sink tells it output from the start. */
    if (run->opts.stall_after_s > 0 && !run->starting) {
        char *cells = dist_run_cells_folder();
        run->stall = dk_dist_stall_new(run->plan.world, run->opts.stall_after_s,
                                       dk_setting_number(DK_DIST_STALL_EVERY_ENV), run->t0_ms,
                                       cells);
        free(cells);
        if (!run->stall)
            return fail(run, PyExc_MemoryError, NULL);
    }
    /* Ranks on other nodes need not share the notebook folder: the payload
     * carries its modules (distkernel._dist.with_local_modules). */
    PyObject *wrapped = NULL;
    if (run->opts.launcher == DK_LAUNCHER_SLURM && payload && len > 0) {
        PyObject *mod = PyImport_ImportModule("distkernel._dist");
        wrapped = mod ? PyObject_CallMethod(mod, "with_local_modules", "(y#)",
                                            (const char *)payload, (Py_ssize_t)len)
                      : NULL;
        Py_XDECREF(mod);
        char *bytes;
        Py_ssize_t n;
        if (!wrapped || PyBytes_AsStringAndSize(wrapped, &bytes, &n) < 0) {
            Py_XDECREF(wrapped);
            return fail(run, NULL, NULL);
        }
        payload = bytes;
        len = (size_t)n;
    }
    bool launched = dist_run_launch(run, payload, len);
    Py_XDECREF(wrapped);
    if (!launched)
        return fail(run, NULL, NULL);
    dist_run_announce(run);
    return run;
}

dk_dist_run_t *dk_dist_run_start(const dk_dist_host_t *host, const char *kind, const char *options,
                                 const void *payload, size_t len)
{
    dk_dist_run_t *run = run_plan(host->kernel, kind, options);
    if (!run)
        return NULL;
    if (run->opts.idle_given)
        return fail(run, PyExc_ValueError,
                    "idle_timeout= is an option of `%distributed start` (ranks kept between "
                    "cells); a %%distributed cell's ranks end with the cell");
    return run_begin(run, host, payload, len);
}

/* Seconds from DISTKERNEL_IDLE_TIMEOUT when idle_timeout= was not given. -1
 * with a Python exception set when the variable is not a number. */
static int idle_from_env(dk_dist_opts_t *opts)
{
    const char *v = getenv("DISTKERNEL_IDLE_TIMEOUT");
    if (opts->idle_given || !v || !*v)
        return 0;
    char *end;
    double t = strtod(v, &end);
    if (*end || t < 0) {
        PyErr_Format(PyExc_ValueError, "DISTKERNEL_IDLE_TIMEOUT is '%s'; it must be a number of "
                     "seconds (0: never end idle ranks)", v);
        return -1;
    }
    opts->idle_timeout_s = t;
    return 0;
}

dk_dist_run_t *dk_dist_run_start_pool(const dk_dist_host_t *host, const char *options)
{
    dk_dist_run_t *run = run_plan(host->kernel, "start", options);
    if (!run)
        return NULL;
    if (idle_from_env(&run->opts) < 0)
        return fail(run, NULL, NULL);
    if (run->opts.restarts > 0)
        return fail(run, PyExc_ValueError, RESTARTS_ON_STARTED);
    random_id(run->run_id);
    run->pool = dk_dist_pool_new(&run->opts, &run->plan, run->run_id);
    if (!run->pool)
        return fail(run, PyExc_MemoryError, NULL);
    /* No user code runs yet: the cells get MLflow runs (tracking= as given). */
    run->opts.tracking = false;
    run->owns_pool = true;
    run->starting = true;
    return run_begin(run, host, NULL, 0);
}

dk_dist_pool_t *dk_dist_run_take_pool(dk_dist_run_t *run)
{
    if (!run->owns_pool)
        return NULL;
    run->owns_pool = false;
    return run->pool;
}

dk_dist_run_t *dk_dist_run_start_on(const dk_dist_host_t *host, dk_dist_pool_t *pool,
                                    const char *kind, const char *options, const void *payload,
                                    size_t len)
{
    /* The wait releases the GIL: another thread of the kernel may get here
     * while a cell runs on the ranks, and must not take them over. */
    if (dk_dist_pool_busy(pool)) {
        PyErr_SetString(PyExc_RuntimeError, DK_DIST_POOL_BUSY_TEXT);
        return NULL;
    }
    dk_dist_run_t *run = calloc(1, sizeof *run);
    if (!run) {
        PyErr_NoMemory();
        return NULL;
    }
    pthread_mutex_init(&run->lock, NULL);
    run->kernel = host->kernel;
    run->kind = kind;
    /* Claimed from here: starting the round (MLflow, the log folder) may
     * release the GIL too. Released by dk_dist_run_destroy. */
    run->pool = pool;
    run->claimed = true;
    dk_dist_pool_set_busy(pool, true);
    /* The options the ranks were started with are the cell's defaults
     * (output=, timeout=, MLflow's...); the start's own are not repeated. */
    run->opts = *dk_dist_pool_opts(pool);
    run->opts.idle_given = false;
    run->opts.check = false;
    char err[1024];
    if (dk_dist_opts_parse_onto(options, &run->opts, err, sizeof err) < 0)
        return fail(run, PyExc_ValueError, err);
    run->timeout_s = run->opts.timeout_s;
    if (run->opts.idle_given)
        return fail(run, PyExc_ValueError, "idle_timeout= is an option of `%distributed start`");
    if (run->opts.restarts > 0)
        return fail(run, PyExc_ValueError, RESTARTS_ON_STARTED);
    /* The ranks' logs are opened, with their cap, when the ranks start. */
    if (run->opts.log_cap != dk_dist_pool_opts(pool)->log_cap)
        return fail(run, PyExc_ValueError,
                    "log_cap= is set when the ranks start: `%distributed stop`, then "
                    "`%distributed start ... log_cap=SIZE`");
    if (run->opts.warnings[0]) {
        char line[600];
        snprintf(line, sizeof line, "%s\n", run->opts.warnings);
        dist_run_write_err(run, line);
    }
    run->plan = *dk_dist_pool_plan(pool);
    run->hosts = dk_dist_pool_hosts(pool);      /* on Slurm's nodes: where each rank is */
    run->ranks = calloc((size_t)run->plan.world, sizeof *run->ranks);
    if (!run->ranks)
        return fail(run, PyExc_MemoryError, NULL);
    for (int r = 0; r < run->plan.world; r++)
        run->ranks[r].gpu_index = dk_dist_plan_local_gpu(&run->plan, r);
    return run_begin(run, host, payload, len);
}

const char *dk_dist_run_log_dir(dk_dist_run_t *run)
{
    return run->job ? dk_job_log_dir(run->job) : run->log_dir;
}

const char *dk_dist_run_url(dk_dist_run_t *run)
{
    return run->mlflow.tracked.active ? run->mlflow.tracked.url : "";
}

const char *dk_dist_run_result_name(dk_dist_run_t *run)
{
    return run->opts.result_name;
}
