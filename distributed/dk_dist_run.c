/*
 * dk_dist_run: a run's lifecycle. See the header.
 *
 * A run is three parties. The runtime thread calls the sink: output goes to
 * the relay, which has a lock of its own (it may wait on a slow frontend, and
 * the status display must not wait with it); states and messages go to the
 * ranks' records under the run's lock. The main thread waits with the GIL
 * released and, between slices, honours interrupts and shutdown, ticks the
 * relay and refreshes the status display. Once the job has ended, the runtime
 * thread is gone and the records are the main thread's alone.
 *
 * On started ranks (dk_dist_pool) a run is one round of the pool's persistent
 * job instead: the same relay, records, status, log folder, MLflow run and
 * outcome, but the job is borrowed, the sink reaches the run through the pool
 * while it is attached, waiting is for the round (dk_job_round_wait), and an
 * interrupt interrupts the round rather than ending the ranks. When the round
 * ends the runtime thread goes on (the ranks stay), so the run detaches from
 * the pool as soon as the round ends: output written after that goes only to
 * the ranks' logs, never after the cell's result. One run at a time uses the
 * pool: it claims it (busy) when it starts and frees it when destroyed.
 */
#include "dk_dist_run.h"
#include "dk_clock.h"
#include "dk_codepath.h"
#include "dk_random.h"
#include "dk_dist_artifacts.h"
#include "dk_dist_mlflow.h"
#include "dk_dist_opts.h"
#include "dk_dist_outcome.h"
#include "dk_dist_plan.h"
#include "dk_dist_pool.h"
#include "dk_dist_preflight.h"
#include "dk_dist_rank.h"
#include "dk_dist_relay.h"
#include "dk_dist_slurm.h"
#include "dk_dist_stacks.h"
#include "dk_dist_stall.h"
#include "dk_dist_status.h"
#include "dk_dist_warm.h"
#include "dk_gpu.h"
#include "dk_hostlist.h"
#include "dk_logdir.h"
#include "dk_logfile.h"
#include "dk_mlflow.h"
#include "dk_slurm.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
    dk_dist_relay_t *relay;
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
};

static void write_err(dk_dist_run_t *run, const char *text)
{
    dk_stream_write(dk_kernel_stream(run->kernel), DK_STDERR, text, strlen(text));
}

/* ---- displays ----------------------------------------------------------------- */

/* Publish TEXT as display DISPLAY_ID: FORCE queues it behind a frontend that is
 * behind (the first and last states of a display must arrive); otherwise it is
 * offered after the stream text before it, and false means IOPub was full and
 * nothing was sent. */
static bool publish_display(dk_kernel_t *kernel, const char *display_id, bool update,
                            const char *text, bool force)
{
    const char *msg_type = update ? "update_display_data" : "display_data";
    json_t *content = json_pack("{s:{s:s}, s:{}, s:{s:s}}", "data", "text/plain", text,
                                "metadata", "transient", "display_id", display_id);
    if (!content)
        return false;
    dk_stream_t *stream = dk_kernel_stream(kernel);
    dk_iopub_t *iopub = dk_kernel_iopub(kernel);
    bool sent = true;
    if (force) {
        dk_stream_flush(stream);
        dk_iopub_publish(iopub, msg_type, content, NULL);
    } else if (!dk_stream_offer(stream)) {
        sent = false;
    } else {
        char *dumped = json_dumps(content, JSON_COMPACT);
        sent = (dumped ? dk_iopub_offer_text(iopub, msg_type, dumped) : -1) != DK_IOPUB_FULL;
        free(dumped);
    }
    json_decref(content);
    return sent;
}

static void relay_append(void *data, int fd, const char *text, size_t len)
{
    dk_dist_run_t *run = data;
    dk_stream_append(dk_kernel_stream(run->kernel), fd == 2 ? DK_STDERR : DK_STDOUT, text, len);
}

static bool relay_display(void *data, const char *display_id, bool update, const char *text,
                          bool force)
{
    dk_dist_run_t *run = data;
    return publish_display(run->kernel, display_id, update, text, force);
}

/* The run's status display. FORCE: the first and last states, which must arrive;
 * the updates in between are skipped while a frontend is behind. */
static char *cells_folder(void);

static char *stall_where(void *data, size_t max_lines)
{
    return dk_dist_stall_lines(data, dk_now_ms(), max_lines);
}

static void publish_status(dk_dist_run_t *run, const char *headline, bool force)
{
    dk_dist_status_t st = {.what = run->plan.what,
                           .elapsed_s = (double)(dk_now_ms() - run->t0_ms) / 1000.0,
                           .headline = headline, .world = run->plan.world, .ranks = run->ranks,
                           .gpu = run->plan.gpu,
                           .log_dir = run->job ? dk_job_log_dir(run->job) : run->log_dir,
                           .hosts = run->hosts, .gpu_memory = dk_gpu_process_memory,
                           .t0_ms = run->t0_ms, .output = run->opts.output,
                           .shown = run->shown, .where = run->stall ? stall_where : NULL,
                           .where_data = run->stall};
    /* Ranks on other nodes gone silent: the status names their nodes. Only
     * this thread writes LOST, so it needs not the run's lock. */
    for (int r = 0; run->job && run->hosts && r < run->plan.world; r++)
        run->ranks[r].lost = dk_job_rank_lost(run->job, r);
    pthread_mutex_lock(&run->lock);
    char *text = dk_dist_status_text(&st);
    run->status_dirty = false;
    pthread_mutex_unlock(&run->lock);
    if (!text)
        return;
    char display_id[64];
    snprintf(display_id, sizeof display_id, "distkernel-%s-status", run->run_id);
    if (publish_display(run->kernel, display_id, run->status_shown, text,
                        force || !run->status_shown))
        run->status_shown = true;
    else
        run->status_dirty = true;
    free(text);
}

/* ---- the sink: runs on the runtime thread ------------------------------------- */

static void sink_output(void *data, int rank, int fd, const char *bytes, size_t len)
{
    dk_dist_run_t *run = data;
    if (run->stall)
        dk_dist_stall_output(run->stall, dk_now_ms());
    dk_dist_relay_output(run->relay, rank, fd, bytes, len);
}

static void sink_stacks(void *data, int world, const char *const *dumps, const size_t *lens)
{
    dk_dist_run_t *run = data;
    if (run->stall)
        dk_dist_stall_sampled(run->stall, world, dumps, lens);
}

static void sink_caught_up(void *data, int rank, int fd)
{
    dk_dist_run_t *run = data;
    dk_dist_relay_caught_up(run->relay, rank, fd);
}

static void sink_state(void *data, int rank, dk_rank_state_t state, int exit_code, int term_signal)
{
    dk_dist_run_t *run = data;
    pthread_mutex_lock(&run->lock);
    run->ranks[rank].state = state;
    if (state == DK_RANK_RUNNING && !run->ranks[rank].got_cell)
        run->ranks[rank].running_ms = dk_now_ms();
    if (state == DK_RANK_RUNNING)
        run->ranks[rank].got_cell = true;
    run->ranks[rank].exit_code = exit_code;
    run->ranks[rank].term_signal = term_signal;
    run->status_dirty = true;
    pthread_mutex_unlock(&run->lock);
}

static void sink_message(void *data, int rank, bool is_error, const void *bytes, size_t len)
{
    dk_dist_run_t *run = data;
    void *copy = malloc(len ? len : 1);
    if (!copy)
        return;
    memcpy(copy, bytes, len);
    pthread_mutex_lock(&run->lock);
    free(run->ranks[rank].message);
    run->ranks[rank].message = copy;
    run->ranks[rank].message_len = len;
    run->ranks[rank].is_error = is_error;
    pthread_mutex_unlock(&run->lock);
}

static void sink_warning(void *data, const char *text)
{
    dk_dist_run_t *run = data;
    char line[1024];
    int n = snprintf(line, sizeof line, "[distkernel] %s\n", text);
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    dk_stream_write(dk_kernel_stream(run->kernel), DK_STDERR, line, (size_t)n);
}

/* ---- start -------------------------------------------------------------------- */

void dk_dist_run_destroy(dk_dist_run_t **self_p)
{
    dk_dist_run_t *run = self_p ? *self_p : NULL;
    if (!run)
        return;
    if (run->pool) {
        /* First: the job's thread calls the relay through the pool. */
        dk_dist_pool_attach(run->pool, NULL);
        run->job = NULL;        /* the pool's */
        if (run->claimed)
            dk_dist_pool_set_busy(run->pool, false);
        if (run->owns_pool)
            dk_dist_pool_destroy(&run->pool);
    }
    dk_job_destroy(&run->job);   /* first: its thread calls the relay */
    dk_dist_slurm_destroy(&run->slurm);     /* after: the ranks are its steps */
    dk_dist_relay_destroy(&run->relay);
    dk_dist_stall_destroy(&run->stall);
    free(run->shown);
    for (int r = 0; run->ranks && r < run->plan.world; r++)
        free(run->ranks[r].message);
    free(run->ranks);
    free(run->stacks);
    pthread_mutex_destroy(&run->lock);
    free(run);
    *self_p = NULL;
}

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
        write_err(run, line);
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
        write_err(run, line);
    }
    run->ranks = calloc((size_t)run->plan.world, sizeof *run->ranks);
    if (!run->ranks)
        return fail(run, PyExc_MemoryError, NULL);
    for (int r = 0; r < run->plan.world; r++)
        run->ranks[r].gpu_index = dk_dist_plan_local_gpu(&run->plan, r);
    return run;
}

static const char *rank_exe(void)
{
    const char *exe = getenv("DISTKERNEL_RANK_EXE");
    return exe && *exe ? exe : DK_RANK_EXE;
}

/* The job, its output and states to RUN. NULL with a Python exception set. */
static dk_sink_t run_sink(dk_dist_run_t *run)
{
    return (dk_sink_t){.data = run, .on_output = sink_output, .on_caught_up = sink_caught_up,
                       .on_state = sink_state, .on_message = sink_message,
                       .on_warning = sink_warning, .on_stacks = sink_stacks};
}

/* The status while Slurm's queue holds the request. */
static void slurm_on_wait(void *data, const char *job_id, const char *state, const char *reason)
{
    dk_dist_run_t *run = data;
    char headline[256];
    bool why = reason[0] && strcmp(reason, "None") != 0;    /* Slurm's "no reason" */
    snprintf(headline, sizeof headline, "Slurm job %s %s%s%s%s", job_id, state,
             why ? " (" : "", why ? reason : "", why ? ")" : "");
    publish_status(run, headline, true);
}

static bool slurm_shutting_down(void *data)
{
    dk_dist_run_t *run = data;
    return dk_kernel_shutting_down(run->kernel);
}

/* The run's timeout for work starting now on a Slurm allocation with LEFT_S
 * seconds left (-1: no limit): cut to end before Slurm's time limit ends the
 * ranks (they would die by SIGTERM as a rank crash, not end as a timeout),
 * and the cell says so. */
static double cut_timeout(dk_dist_run_t *run, double left_s)
{
    double cut = dk_dist_slurm_cut_timeout(run->opts.timeout_s, left_s);
    if (cut == run->opts.timeout_s)
        return run->timeout_s = run->opts.timeout_s;
    run->timeout_s = cut;
    run->timeout_cut = true;
    char line[512], given[64];
    if (run->opts.timeout_s > 0)
        snprintf(given, sizeof given, "timeout=%g s would outlast it", run->opts.timeout_s);
    else
        snprintf(given, sizeof given, "no timeout= was given");
    snprintf(line, sizeof line, "distkernel: Slurm job %s has %.0f s left of its time limit "
             "(%s): this %s ends as a timeout after %.0f s, before Slurm would kill its ranks\n",
             run->slurm ? dk_dist_slurm_job_id(run->slurm)
                        : run->pool ? dk_dist_pool_slurm_job_id(run->pool) : "", left_s, given,
             run->pool ? "cell" : "run", cut);
    write_err(run, line);
    return cut;
}

/* launcher=slurm: the run's nodes from Slurm, and SPEC's ranks started on
 * them by node agents. -1 with a Python exception set. */
static int slurm_nodes(dk_dist_run_t *run, dk_job_spec_t *spec)
{
    char headline[128];
    if (run->plan.gpu)
        snprintf(headline, sizeof headline, "asking Slurm for %d node%s with %d GPU%s each",
                 run->plan.nodes, run->plan.nodes == 1 ? "" : "s", run->plan.per_node,
                 run->plan.per_node == 1 ? "" : "s");
    else
        snprintf(headline, sizeof headline, "asking Slurm for %d node%s", run->plan.nodes,
                 run->plan.nodes == 1 ? "" : "s");
    publish_status(run, headline, true);
    dk_dist_slurm_hooks_t hooks = {.on_wait = slurm_on_wait,
                                   .shutting_down = slurm_shutting_down, .data = run};
    run->slurm = dk_dist_slurm_allocate(&run->opts, &run->plan, run->pool != NULL, &hooks);
    if (!run->slurm) {
        publish_status(run, PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)
                                ? "interrupted while waiting for Slurm" : "no nodes from Slurm",
                       true);
        return -1;
    }
    if (dk_dist_slurm_spec(run->slurm, spec->rank_exe, spec) < 0)
        return -1;
    double left = dk_dist_slurm_time_left(run->slurm);
    run->slurm_end_s = left >= 0 ? dk_now_s() + left : 0;
    if (!run->pool)
        spec->timeout_s = cut_timeout(run, left);
    /* The run's own nodes, the ones its ranks are on: inside a larger
     * allocation, not all of the allocation's. */
    char *own = dk_hostlist_compress(spec->rank_hosts, (size_t)spec->world_size);
    dk_dist_mlflow_slurm(&run->mlflow, run->kernel, dk_dist_slurm_job_id(run->slurm),
                         own ? own : dk_dist_slurm_node_list(run->slurm));
    free(own);
    run->hosts = spec->rank_hosts;
    return 0;
}

extern char **environ;

/* PAYLOAD with VARS (a dict, or NULL with a Python exception set; the
 * reference is taken) in its "env", which each rank sets before the job runs
 * (distkernel._dist.with_env). A new reference to bytes, or NULL with a
 * Python exception set. */
static PyObject *with_env(const void *payload, size_t len, PyObject *vars)
{
    PyObject *mod = vars ? PyImport_ImportModule("distkernel._dist") : NULL;
    PyObject *wrapped = mod ? PyObject_CallMethod(mod, "with_env", "(y#O)", (const char *)payload,
                                                  (Py_ssize_t)len, vars)
                            : NULL;
    Py_XDECREF(mod);
    Py_XDECREF(vars);
    if (wrapped && !PyBytes_Check(wrapped)) {
        Py_CLEAR(wrapped);
        PyErr_SetString(PyExc_TypeError, "distkernel._dist.with_env did not give bytes");
    }
    return wrapped;
}

/* PAYLOAD with the kernel's MLflow variables that are secrets
 * (MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_PASSWORD, an MLFLOW_TRACKING_URI
 * with a password in it: dk_slurm_secret) in its "env", which each
 * rank sets before the job runs: ranks on Slurm's nodes are not sent them
 * through srun (dk_slurm_step_env), so they travel in the job, over the
 * authenticated back channel, seen by no other process on the nodes. A new
 * reference to bytes, or NULL with a Python exception set. */
static PyObject *with_mlflow_secrets(const void *payload, size_t len)
{
    PyObject *vars = PyDict_New();
    for (size_t i = 0; vars && environ[i]; i++) {
        const char *eq = strchr(environ[i], '=');
        if (!eq || strncmp(environ[i], "MLFLOW_", 7) != 0 || !dk_slurm_secret(environ[i]))
            continue;
        PyObject *k = PyUnicode_FromStringAndSize(environ[i], eq - environ[i]);
        PyObject *v = PyUnicode_FromString(eq + 1);
        if (!k || !v || PyDict_SetItem(vars, k, v) < 0)
            Py_CLEAR(vars);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return with_env(payload, len, vars);
}

/* The tracking server of RUN's MLflow run, when ranks on other nodes reach
 * it only through the job's gate (dk_tunnel.h: it is on this host's
 * loopback), as "127.0.0.1:PORT" in BUF; else NULL. */
static const char *tunnel_upstream(dk_dist_run_t *run, char *buf, size_t len)
{
    return run->mlflow.tracked.active &&
                   dk_mlflow_loopback_addr(run->mlflow.tracked.tracking_uri, buf, len)
               ? buf
               : NULL;
}

static dk_job_t *start_job(dk_dist_run_t *run, char **env, const char *log_dir,
                           unsigned long long log_cap, const void *payload, size_t len)
{
    dk_job_spec_t spec = {
        .log_cap = log_cap,
        .log_dir = log_dir,
        .env = (const char *const *)env,
        .world_size = run->plan.world,
        .rank_exe = rank_exe(),
        .payload = payload,
        .payload_len = len,
        .timeout_s = run->opts.timeout_s,
        .grace_s = DK_DIST_KILL_GRACE_S,
        .stacks = true,     /* a run that ends badly says where its ranks were */
    };
    char *warm_socket = NULL;    /* ours: freed once dk_job_start copied it */
    PyObject *wrapped = NULL;    /* likewise the payload with MLflow's secrets */
    dk_sink_t sink = run_sink(run);
    if (run->pool) {
        /* Started ranks: the job outlives this run, so its sink is the pool's,
         * which forwards to the run attached. */
        spec.persistent = true;
        spec.idle_timeout_s = run->opts.idle_timeout_s;
        spec.payload = NULL;
        spec.payload_len = 0;
        spec.timeout_s = 0;
        /* On Slurm's nodes: the allocation is asked for once, here, and is
         * the pool's from the ranks' start (it releases it when they end). */
        if (run->opts.launcher == DK_LAUNCHER_SLURM && slurm_nodes(run, &spec) < 0)
            return NULL;
        dk_dist_pool_attach(run->pool, &sink);
        sink = dk_dist_pool_sink(run->pool);
    } else if (run->opts.launcher == DK_LAUNCHER_SLURM) {
        /* Ranks on Slurm's nodes: warm through their node agents (below). */
        if (slurm_nodes(run, &spec) < 0 || !(wrapped = with_mlflow_secrets(payload, len)))
            return NULL;
        spec.payload = PyBytes_AsString(wrapped);
        spec.payload_len = (size_t)PyBytes_Size(wrapped);
    } else if (run->warm) {
        /* A fresh run: its ranks forked from the warm-start template when one
         * fits, else cold as always, with the reason in its log folder. */
        char why[2048];
        bool interrupted;
        warm_socket = dk_dist_warm_socket(run->warm, &run->opts, spec.rank_exe,
                                          &interrupted, why, sizeof why);
        if (interrupted)
            return NULL;
        if (!warm_socket)
            dk_dist_warm_note(log_dir, why);
        spec.warm_socket = warm_socket;
    }
    /* Ranks started by node agents (fresh or started ones): each agent forks
     * its node's ranks from a template of its own, as the kernel would here. */
    char agent_modules[1024];
    char *agent_path = NULL;
    if (spec.agent_command) {
        char why[512];
        if (dk_dist_warm_for_agents(&run->opts, agent_modules, sizeof agent_modules,
                                    &agent_path, why, sizeof why)) {
            /* A fresh run's templates serve this run only: what its code
             * cannot use, they need not import. */
            if (!run->pool)
                dk_dist_warm_for_run(payload, len, agent_modules, sizeof agent_modules, log_dir);
            spec.agent_warm_modules = agent_modules;
            spec.agent_warm_path = agent_path;
        } else {
            dk_dist_warm_note(log_dir, why);
        }
    }
    char upstream[64];
    if (spec.agent_command)
        spec.tunnel_upstream = tunnel_upstream(run, upstream, sizeof upstream);
    char err[1024];
    dk_job_t *job = dk_job_start(&spec, &sink, err, sizeof err);
    free(agent_path);
    free(warm_socket);
    Py_XDECREF(wrapped);
    if (job && run->pool) {
        dk_dist_pool_set_job(run->pool, job);
        if (run->slurm) {
            dk_dist_pool_set_slurm(run->pool, run->slurm);
            dk_dist_pool_set_slurm_end(run->pool, run->slurm_end_s);
            run->slurm = NULL;  /* the pool's; run->hosts point into it still */
        }
    }
    if (!job)
        PyErr_Format(PyExc_RuntimeError, "could not start the ranks: %s", err);
    return job;
}

/* The MLflow variables of ENV (the run's, from dk_dist_mlflow_begin; NULL when
 * untracked) as a dict for the ranks, which set them before the cell runs. */
static PyObject *mlflow_env_dict(char **env)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && env && env[i]; i++) {
        if (strncmp(env[i], "MLFLOW_", 7) != 0)
            continue;
        const char *eq = strchr(env[i], '=');
        PyObject *k = eq ? PyUnicode_FromStringAndSize(env[i], eq - env[i]) : NULL;
        PyObject *v = eq ? PyUnicode_FromString(eq + 1) : NULL;
        if (!k || !v || PyDict_SetItem(d, k, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return d;
}

/* A round on the started ranks: this run's log folder, its MLflow variables
 * added to the payload, the TASK. The pool's job, or NULL with a Python
 * exception set. */
static dk_job_t *submit_round(dk_dist_run_t *run, char **env, const char *log_dir,
                              const void *payload, size_t len)
{
    dk_job_t *job = dk_dist_pool_job(run->pool);
    char err[1024];
    PyObject *wrapped = with_env(payload, len, mlflow_env_dict(env));
    char *bytes;
    Py_ssize_t n;
    if (!wrapped || PyBytes_AsStringAndSize(wrapped, &bytes, &n) < 0) {
        Py_XDECREF(wrapped);
        return NULL;
    }
    dk_sink_t sink = run_sink(run);
    dk_dist_pool_attach(run->pool, &sink);
    char upstream[64];
    if (dk_job_set_tunnel_upstream(job, tunnel_upstream(run, upstream, sizeof upstream), err,
                                   sizeof err) < 0 ||
        dk_job_set_log_dir(job, log_dir, err, sizeof err) < 0 ||
        dk_job_submit(job, bytes, (size_t)n,
                      cut_timeout(run, dk_dist_pool_slurm_left(run->pool)), err,
                      sizeof err) < 0) {
        dk_dist_pool_attach(run->pool, NULL);
        PyErr_Format(PyExc_RuntimeError, "could not run the cell on the started ranks: %s", err);
        job = NULL;
    }
    Py_DECREF(wrapped);
    return job;
}

/* The MLflow run, the log folder, the job. False with a Python exception set. */
static bool launch(dk_dist_run_t *run, const void *payload, size_t len)
{
    dk_tracking_request_t req = {.opts = &run->opts, .world_size = run->plan.world,
                                 .gpu = run->plan.gpu, .device = run->plan.device,
                                 .accelerator_model = run->plan.model, .kind = run->kind,
                                 .pool_id = run->pool ? dk_dist_pool_id(run->pool) : NULL};
    char **env = dk_dist_mlflow_begin(&run->mlflow, run->tracking, run->kernel, req);
    if (PyErr_CheckSignals() < 0) {
        /* Interrupted while the run was being recorded: start nothing. */
        free(env);
        dk_dist_mlflow_end(&run->mlflow, run->kernel, "KILLED", NULL);
        return false;
    }
    char err[1024], log_dir[4096];
    unsigned long long log_cap = run->opts.log_cap, root_cap;
    if (!log_cap && dk_dist_logs_size_from_env("DISTKERNEL_LOG_CAP", DK_LOG_CAP_DEFAULT,
                                               &log_cap, err, sizeof err) < 0)
        PyErr_SetString(PyExc_ValueError, err);
    else if (dk_dist_logs_size_from_env("DISTKERNEL_LOG_ROOT_CAP", DK_LOG_ROOT_CAP_DEFAULT,
                                        &root_cap, err, sizeof err) < 0)
        PyErr_SetString(PyExc_ValueError, err);
    else if (dk_dist_logs_next(run->logs, run->run_id, root_cap, log_dir, sizeof log_dir, err,
                               sizeof err) < 0)
        PyErr_SetString(PyExc_RuntimeError, err);
    else {
        snprintf(run->log_dir, sizeof run->log_dir, "%s", log_dir);
        if (run->pool && !run->starting)
            run->job = submit_round(run, env, log_dir, payload, len);
        else
            run->job = start_job(run, env, log_dir, log_cap, payload, len);
    }
    free(env);
    if (!run->job)
        dk_dist_mlflow_end(&run->mlflow, run->kernel,
                           PyErr_ExceptionMatches(PyExc_KeyboardInterrupt) ? "KILLED" : "FAILED",
                           NULL);
    return run->job != NULL;
}

/* The job runs: its status display, a thinning hint, the MLflow link. */
static void announce(dk_dist_run_t *run)
{
    for (int r = 0; r < run->plan.world; r++)
        run->ranks[r].pid = dk_job_rank_pid(run->job, r);
    /* A frontend too slow for the ranks is shown less, and told where it all is. */
    dk_stream_t *stream = dk_kernel_stream(run->kernel);
    unsigned long long bytes;
    dk_stream_thinned(stream, &run->thinned_at_start, &bytes);
    char hint[4200];
    snprintf(hint, sizeof hint, "; every rank's full output is in %s", dk_job_log_dir(run->job));
    dk_stream_set_thin_hint(stream, hint);
    run->t0_ms = dk_now_ms();
    if (run->stall)
        dk_dist_stall_output(run->stall, run->t0_ms);     /* silent from the ranks' start */
    publish_status(run, NULL, true);
    dk_dist_mlflow_publish_link(&run->mlflow, run->kernel);
}

/* The rest of a start, once RUN is planned (and, on started ranks, has its
 * pool): preflight, relay, launch, announce. */
static dk_dist_run_t *run_begin(dk_dist_run_t *run, const dk_dist_host_t *host,
                                const void *payload, size_t len);

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
    /* The ranks' logs are opened, with their cap, when the ranks start. */
    if (run->opts.log_cap != dk_dist_pool_opts(pool)->log_cap)
        return fail(run, PyExc_ValueError,
                    "log_cap= is set when the ranks start: `%distributed stop`, then "
                    "`%distributed start ... log_cap=SIZE`");
    if (run->opts.warnings[0]) {
        char line[600];
        snprintf(line, sizeof line, "%s\n", run->opts.warnings);
        write_err(run, line);
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
    write_err(run, line);
    free(*said);
    *said = strdup(r.names);
}

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
        write_err(run, "distkernel: check=True tests this host's GPUs, not Slurm's nodes; "
                       "skipped for this run\n");
    else if (run->opts.check && dk_dist_preflight(dk_kernel_stream(kernel), run->plan.gpu) < 0) {
        free(shown);
        return fail(run, NULL, NULL);
    }
    if (!run->run_id[0])
        random_id(run->run_id);
    dk_dist_relay_io_t io = {.data = run, .append = relay_append, .display = relay_display};
    run->relay = dk_dist_relay_new(run->plan.world, run->run_id, shown, &io);
    run->shown = shown;
    if (!run->relay)
        return fail(run, PyExc_MemoryError, NULL);
    run->t0_ms = dk_now_ms();   /* the wait for Slurm's nodes; announce starts the ranks' */
    /* Made before the job, whose sink tells it output from the start. */
    if (run->opts.stall_after_s > 0 && !run->starting) {
        const char *every = getenv(DK_DIST_STALL_EVERY_ENV);
        char *cells = cells_folder();
        run->stall = dk_dist_stall_new(run->plan.world, run->opts.stall_after_s,
                                       every ? atof(every) : 0, run->t0_ms, cells);
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
    bool launched = launch(run, payload, len);
    Py_XDECREF(wrapped);
    if (!launched)
        return fail(run, NULL, NULL);
    announce(run);
    return run;
}

/* ---- wait and end ------------------------------------------------------------- */

/* Between two slices of the wait: an interrupt or a shutdown ends every rank. */
static void honour_signals(dk_dist_run_t *run)
{
    if (PyErr_CheckSignals() < 0) {
        PyErr_Clear();
        if (!run->interrupted) {
            run->interrupted = true;
            if (run->pool && !run->starting) {
                dk_job_interrupt(run->job);
                write_err(run, "[distkernel] interrupted: KeyboardInterrupt in every rank\n");
            } else {
                dk_job_cancel(run->job);
                write_err(run, "[distkernel] interrupted: ending every rank\n");
            }
        }
    }
    if (!run->shutdown && dk_kernel_shutting_down(run->kernel)) {
        run->shutdown = true;
        dk_job_cancel(run->job);
    }
}

static void make_stacks(dk_dist_run_t *run);

/* Every rank has exited: the last output, the records' final facts, MLflow's
 * status, and a word on output the frontend did not get. */
static void finish(dk_dist_run_t *run, dk_job_end_t end)
{
    dk_dist_relay_finish(run->relay);
    for (int r = 0; r < run->plan.world; r++) {
        dk_dist_rank_t *ri = &run->ranks[r];
        ri->state = dk_job_rank_state(run->job, r);
        ri->exit_code = dk_job_rank_exit_code(run->job, r);
        ri->term_signal = dk_job_rank_signal(run->job, r);
        ri->log_complete = dk_job_rank_log_complete(run->job, r);
        ri->log_capped = dk_job_rank_log_capped(run->job, r);
    }
    /* A run that did not finish has its stacks.txt made now, to go with the
     * ranks' logs to the MLflow run. */
    if (end != DK_END_OK && run->mlflow.tracked.active)
        make_stacks(run);
    bool gone = run->pool && dk_job_end(run->job) != DK_END_NONE;
    dk_dist_artifacts_t files = {
        .log_dir = dk_job_log_dir(run->job), .world = run->plan.world, .ranks = run->ranks,
        .hosts = run->hosts, .stacks = end != DK_END_OK && run->stacks_file[0],
        .root = end != DK_END_FAILED      ? -1
                : run->pool && !gone      ? dk_job_round_root_cause(run->job)
                                          : dk_job_root_cause(run->job)};
    pthread_mutex_lock(&run->lock);
    for (int r = 0; r < run->plan.world; r++)
        run->ranks[r].lost = dk_job_rank_lost(run->job, r);
    pthread_mutex_unlock(&run->lock);
    dk_dist_mlflow_end(&run->mlflow, run->kernel,
                       end == DK_END_OK       ? "FINISHED"
                       : end == DK_END_FAILED ? "FAILED"
                                              : "KILLED",
                       &files);
    dk_stream_t *stream = dk_kernel_stream(run->kernel);
    dk_stream_flush(stream);
    unsigned long long lines, bytes;
    dk_stream_thinned(stream, &lines, &bytes);
    if (lines > run->thinned_at_start) {
        char line[4400];
        snprintf(line, sizeof line,
                 "[distkernel] output thinned: %llu lines of this run were not shown "
                 "here; every rank's full output is in %s/rank-N.log\n",
                 lines - run->thinned_at_start, dk_job_log_dir(run->job));
        write_err(run, line);
        dk_stream_flush(stream);
    }
    dk_stream_set_thin_hint(stream, NULL);
}

/* How the run ended: the job's, or on started ranks the round's. */
static dk_job_end_t run_end(dk_dist_run_t *run)
{
    return run->pool ? dk_job_round_end(run->job) : dk_job_end(run->job);
}

dk_job_end_t dk_dist_run_wait(dk_dist_run_t *run)
{
    long long last_status = dk_now_ms();
    for (;;) {
        bool done;
        Py_BEGIN_ALLOW_THREADS
        done = run->pool ? dk_job_round_wait(run->job, DK_DIST_WAIT_SLICE_MS)
                         : dk_job_wait(run->job, DK_DIST_WAIT_SLICE_MS);
        Py_END_ALLOW_THREADS
        if (done)
            break;
        honour_signals(run);
        dk_dist_relay_tick(run->relay);
        /* Silent past stall_after: where are the ranks? (dk_dist_stall.h) */
        if (run->stall && !run->interrupted && dk_dist_stall_due(run->stall, dk_now_ms()))
            dk_job_sample_stacks(run->job);
        if (run->stall && dk_dist_stall_changed(run->stall, dk_now_ms()))
            run->status_dirty = true;
        if (run->status_dirty || dk_now_ms() - last_status >= DK_DIST_STATUS_EVERY_MS) {
            publish_status(run, run->interrupted ? "ending ranks" : NULL, false);
            last_status = dk_now_ms();
        }
    }
    /* On started ranks the round is over but the ranks go on: what a rank's
     * background thread writes from now on belongs to no cell (it goes to the
     * rank's log), not after this cell's result. The rank drained its output
     * before answering, so the cell's own output is in the relay already. */
    if (run->pool)
        dk_dist_pool_attach(run->pool, NULL);
    /* No sink calls it any more; the final status says no silence. */
    dk_dist_stall_destroy(&run->stall);
    dk_job_end_t end = run_end(run);
    finish(run, end);
    publish_status(run, end == DK_END_OK ? "finished" : run->interrupted ? "interrupted" : "failed",
                   true);
    return end;
}

PyObject *dk_dist_run_results(dk_dist_run_t *run)
{
    PyObject *list = PyList_New(run->plan.world);
    for (int r = 0; list && r < run->plan.world; r++) {
        dk_dist_rank_t *ri = &run->ranks[r];
        PyObject *item = ri->message && !ri->is_error
                             ? PyBytes_FromStringAndSize(ri->message, (Py_ssize_t)ri->message_len)
                             : Py_NewRef(Py_None);
        if (!item) {
            Py_CLEAR(list);
            break;
        }
        if (PyList_SetItem(list, r, item) < 0) {   /* steals item */
            Py_CLEAR(list);
            break;
        }
    }
    return list;
}

/* The cell files' folder, ending in '/' (malloc'd), or NULL when no cell
 * has been written (python/distkernel/_cells.py). Needs the GIL. */
static char *cells_folder(void)
{
    PyObject *mod = PyImport_ImportModule("distkernel._cells");
    PyObject *folder = mod ? PyObject_CallMethod(mod, "folder", NULL) : NULL;
    const char *text = folder && PyUnicode_Check(folder) ? dk_py_utf8(folder) : NULL;
    char *out = text ? strdup(text) : NULL;
    if (PyErr_Occurred()) {
        dk_log("distributed: cannot tell the cell files' folder (stacks show no cell lines)");
        PyErr_Clear();
    }
    Py_XDECREF(folder);
    Py_XDECREF(mod);
    return out;
}

/* Where the ranks were, from the stacks the runtime asked them for before it
 * ended them (none on a run that ended by itself): made once, with
 * stacks.txt in the run's log folder. */
static void make_stacks(dk_dist_run_t *run)
{
    if (run->stacks_made)
        return;
    run->stacks_made = true;
    int world = run->plan.world;
    const char **dumps = calloc((size_t) world, sizeof *dumps);
    size_t *lens = calloc((size_t) world, sizeof *lens);
    bool any = false;
    for (int r = 0; dumps && lens && r < world; r++) {
        dumps[r] = dk_job_rank_stacks(run->job, r, &lens[r]);
        any = any || dumps[r];
    }
    if (any) {
        char *cells = cells_folder();
        char err[4400];
        run->stacks = dk_dist_stacks_report(world, dumps, lens, run->hosts, cells,
                                            dk_job_log_dir(run->job), run->stacks_file,
                                            sizeof run->stacks_file, err, sizeof err);
        if (*err)
            dk_log("distributed: %s", err);
        free(cells);
    }
    free(dumps);
    free(lens);
}

json_t *dk_dist_run_error(dk_dist_run_t *run, bool headline)
{
    make_stacks(run);
    dk_job_end_t end = run_end(run);
    bool gone = run->pool && dk_job_end(run->job) != DK_END_NONE;
    int root = end != DK_END_FAILED ? -1
               : run->pool && !gone ? dk_job_round_root_cause(run->job)
                                    : dk_job_root_cause(run->job);
    /* Ranks on other nodes: which went silent, and where they ran. */
    pthread_mutex_lock(&run->lock);
    for (int r = 0; r < run->plan.world; r++) {
        run->ranks[r].lost = dk_job_rank_lost(run->job, r);
        run->ranks[r].host = run->hosts ? run->hosts[r] : NULL;
    }
    pthread_mutex_unlock(&run->lock);
    dk_dist_outcome_t o = {.end = end, .root = root,
                           .kept = run->pool && !gone, .pool_gone = gone && !run->starting,
                           .interrupted = run->interrupted, .shutdown = run->shutdown,
                           .timeout_s = run->timeout_s, .timeout_cut = run->timeout_cut,
                           .log_dir = dk_job_log_dir(run->job),
                           .world = run->plan.world, .ranks = run->ranks,
                           .stacks = run->stacks,
                           .stacks_file = run->stacks_file[0] ? run->stacks_file : NULL};
    /* Above a few ranks the error groups them by fate; every rank's own line
     * goes to the log folder, which the error names (or not, if unwritable). */
    char path[4200], err[4300];
    if (o.world > DK_DIST_OUTCOME_EACH_RANK_MAX) {
        snprintf(path, sizeof path, "%s/%s", o.log_dir, DK_DIST_OUTCOME_FATES_FILE);
        if (dk_dist_outcome_write_fates(&o, path, err, sizeof err) == 0)
            o.ranks_file = path;
        else
            dk_log("distributed: %s", err);
    }
    return dk_dist_outcome_error(&o, headline);
}

bool dk_dist_run_pool_gone_before_cell(dk_dist_run_t *run)
{
    if (!run->pool || run->starting || run->interrupted || run->shutdown ||
        dk_job_end(run->job) != DK_END_FAILED)
        return false;
    int root = dk_job_root_cause(run->job);
    pthread_mutex_lock(&run->lock);
    bool early = root >= 0 && !run->ranks[root].got_cell;
    pthread_mutex_unlock(&run->lock);
    return early;
}

const char *dk_dist_run_log_dir(dk_dist_run_t *run)
{
    return dk_job_log_dir(run->job);
}

const char *dk_dist_run_url(dk_dist_run_t *run)
{
    return run->mlflow.tracked.active ? run->mlflow.tracked.url : "";
}

const char *dk_dist_run_result_name(dk_dist_run_t *run)
{
    return run->opts.result_name;
}
