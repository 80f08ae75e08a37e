/*
 * dk_dist_run_start: starting a run's ranks, once it is planned.
 *
 * Part of dk_dist_run (dk_dist_run_state.h says which file holds what). In
 * order: the MLflow run (whose variables the ranks get), the run's log
 * folder, then the ranks. Fresh ranks are a job of their own: on this node
 * forked from the warm-start template when one fits (else cold, the reason
 * in the log folder); on Slurm's nodes, once the allocation is granted, by
 * node agents that fork them from templates of their own, the payload
 * carrying MLflow's secrets, the timeout cut to end before Slurm's time
 * limit would. `%distributed start` starts a persistent job the pool keeps;
 * a cell on started ranks submits a round to the pool's job instead. Once
 * the ranks run, the status display and the MLflow link say so. What is
 * found here, the job is built from by dk_dist_job_build (dk_dist_job.h),
 * which decides every field of it and is tested without Python.
 *
 * Everything here runs on the main thread with the GIL held; failures are
 * Python exceptions, and a run that could not start ends its MLflow run.
 */
#include "dk_dist_run_state.h"
#include "dk_clock.h"
#include "dk_dist_job.h"
#include "dk_dist_pool.h"
#include "dk_dist_warm.h"
#include "dk_hostlist.h"
#include "dk_logdir.h"
#include "dk_logfile.h"
#include "dk_mlflow.h"
#include "dk_slurm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *rank_exe(void)
{
    const char *exe = getenv("DISTKERNEL_RANK_EXE");
    return exe && *exe ? exe : DK_RANK_EXE;
}

/* The status while Slurm's queue holds the request. */
static void slurm_on_wait(void *data, const char *job_id, const char *state, const char *reason)
{
    dk_dist_run_t *run = data;
    char headline[256];
    bool why = reason[0] && strcmp(reason, "None") != 0;    /* Slurm's "no reason" */
    snprintf(headline, sizeof headline, "Slurm job %s %s%s%s%s", job_id, state,
             why ? " (" : "", why ? reason : "", why ? ")" : "");
    dist_run_publish_status(run, headline, true);
}

static bool slurm_shutting_down(void *data)
{
    dk_dist_run_t *run = data;
    return dk_kernel_shutting_down(run->kernel);
}

/* The timeout of work starting now on a Slurm allocation with LEFT_S
 * seconds left is CUT, less than the run's timeout= (or where none was
 * given), so that it ends before Slurm's time limit ends the ranks (they
 * would die by SIGTERM as a rank crash, not end as a timeout): the cell says
 * so, and the run's error will. */
static void note_cut(dk_dist_run_t *run, double cut, double left_s)
{
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
    dist_run_write_err(run, line);
}

/* launcher=slurm: the run's nodes from Slurm, as its job is built from them
 * (into ALLOC, which points into run->slurm). -1 with a Python exception set. */
static int slurm_nodes(dk_dist_run_t *run, dk_dist_alloc_t *alloc)
{
    char headline[128];
    if (run->plan.gpu)
        snprintf(headline, sizeof headline, "asking Slurm for %d node%s with %d GPU%s each",
                 run->plan.nodes, run->plan.nodes == 1 ? "" : "s", run->plan.per_node,
                 run->plan.per_node == 1 ? "" : "s");
    else
        snprintf(headline, sizeof headline, "asking Slurm for %d node%s", run->plan.nodes,
                 run->plan.nodes == 1 ? "" : "s");
    dist_run_publish_status(run, headline, true);
    dk_dist_slurm_hooks_t hooks = {.on_wait = slurm_on_wait,
                                   .shutting_down = slurm_shutting_down, .data = run};
    run->slurm = dk_dist_slurm_allocate(&run->opts, &run->plan, run->pool != NULL, &hooks);
    if (!run->slurm) {
        dist_run_publish_status(run,
                                PyErr_ExceptionMatches(PyExc_KeyboardInterrupt)
                                    ? "interrupted while waiting for Slurm"
                                    : "no nodes from Slurm",
                                true);
        return -1;
    }
    if (dk_dist_slurm_describe(run->slurm, alloc) < 0)
        return -1;
    run->slurm_end_s = alloc->left_s >= 0 ? dk_now_s() + alloc->left_s : 0;
    /* The run's own nodes, the ones its ranks are on: inside a larger
     * allocation, not all of the allocation's. */
    char *own = dk_hostlist_compress(alloc->rank_hosts, (size_t)run->plan.world);
    if (run->attempt <= 1) {
        dk_dist_mlflow_slurm(&run->mlflow, run->kernel, dk_dist_slurm_job_id(run->slurm),
                             own ? own : dk_dist_slurm_node_list(run->slurm));
    } else {
        /* MLflow's parameters are the first attempt's: the cell says this one's. */
        char line[1024];
        snprintf(line, sizeof line, "distkernel: attempt %d runs as Slurm job %s on %s\n",
                 run->attempt, dk_dist_slurm_job_id(run->slurm),
                 own ? own : dk_dist_slurm_node_list(run->slurm));
        dist_run_write_err(run, line);
    }
    free(own);
    run->hosts = alloc->rank_hosts;
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

/* The warm-start templates of a job whose node agents start its ranks, into
 * IN (MODULES and *PATH, which the caller frees, are what it points to); a
 * cold run's reason goes to warm.log in LOG_DIR. */
static void agents_warm(dk_dist_run_t *run, dk_dist_job_in_t *in, char *modules, size_t mlen,
                        char **path)
{
    char why[512];
    if (!dk_dist_warm_for_agents(&run->opts, modules, mlen, path, why, sizeof why)) {
        dk_dist_warm_note(in->log_dir, why);
        return;
    }
    /* A fresh run's templates serve this run only: what its code cannot use,
     * they need not import. */
    if (!run->pool)
        dk_dist_warm_for_run(in->payload, in->payload_len, modules, mlen, in->log_dir);
    in->agent_warm_modules = modules;
    in->agent_warm_path = *path;
}

/* RUN's job, started with ENV (its MLflow run's variables) in LOG_DIR. Here
 * the facts are gathered (Slurm's nodes, this node's warm template, the
 * agents' modules, MLflow's secrets and tunnel); dk_dist_job_build makes the
 * job of them. NULL with a Python exception set. */
static dk_job_t *start_job(dk_dist_run_t *run, char **env, const char *log_dir,
                           unsigned long long log_cap, const void *payload, size_t len)
{
    dk_dist_job_in_t in = {.opts = &run->opts, .plan = &run->plan, .started = run->pool != NULL,
                           .rank_exe = rank_exe(), .env = (const char *const *)env,
                           .payload = payload, .payload_len = len, .log_dir = log_dir,
                           .log_cap = log_cap};
    dk_dist_alloc_t alloc = {.left_s = -1};
    char *warm_socket = NULL;    /* ours: freed once dk_job_start copied it */
    PyObject *wrapped = NULL;    /* likewise the payload with MLflow's secrets */
    if (run->opts.launcher == DK_LAUNCHER_SLURM) {
        /* Started ranks: the allocation is asked for once, here, and is the
         * pool's from the ranks' start (it releases it when they end). A fresh
         * run's payload carries MLflow's secrets, which srun is not given. */
        if (slurm_nodes(run, &alloc) < 0 ||
            (!run->pool && !(wrapped = with_mlflow_secrets(payload, len))))
            return NULL;
        in.alloc = &alloc;
        if (wrapped) {
            in.payload = PyBytes_AsString(wrapped);
            in.payload_len = (size_t)PyBytes_Size(wrapped);
        }
    } else if (run->warm && !run->pool) {
        /* A fresh run: its ranks forked from the warm-start template when one
         * fits, else cold as always, with the reason in its log folder. */
        char why[2048];
        bool interrupted;
        warm_socket = dk_dist_warm_socket(run->warm, &run->opts, in.rank_exe, &interrupted, why,
                                          sizeof why);
        if (interrupted)
            return NULL;
        if (!warm_socket)
            dk_dist_warm_note(log_dir, why);
        in.warm_socket = warm_socket;
    }
    /* Ranks started by node agents: each agent forks its node's ranks from a
     * template of its own, as the kernel would here. */
    char agent_modules[1024], upstream[64];
    char *agent_path = NULL;
    if (in.alloc) {
        agents_warm(run, &in, agent_modules, sizeof agent_modules, &agent_path);
        in.tunnel_upstream = tunnel_upstream(run, upstream, sizeof upstream);
    }
    char err[1024];
    dk_dist_job_t built;
    dk_job_t *job = NULL;
    if (dk_dist_job_build(&in, &built, err, sizeof err) == 0) {
        if (built.timeout_cut)
            note_cut(run, built.spec.timeout_s, alloc.left_s);
        dk_sink_t sink = dist_run_sink(run);
        if (run->pool) {
            /* The job outlives this run, so its sink is the pool's, which
             * forwards to the run attached. */
            dk_dist_pool_attach(run->pool, &sink);
            sink = dk_dist_pool_sink(run->pool);
        }
        job = dk_job_start(&built.spec, &sink, err, sizeof err);
        dk_dist_job_free(&built);
    }
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
    dk_sink_t sink = dist_run_sink(run);
    dk_dist_pool_attach(run->pool, &sink);
    char upstream[64];
    double left = dk_dist_pool_slurm_left(run->pool);
    double timeout = dk_dist_job_timeout(run->opts.timeout_s, left);
    if (timeout != run->opts.timeout_s)
        note_cut(run, timeout, left);
    if (dk_job_set_tunnel_upstream(job, tunnel_upstream(run, upstream, sizeof upstream), err,
                                   sizeof err) < 0 ||
        dk_job_set_log_dir(job, log_dir, err, sizeof err) < 0 ||
        dk_job_submit(job, bytes, (size_t)n, timeout, err, sizeof err) < 0) {
        dk_dist_pool_attach(run->pool, NULL);
        PyErr_Format(PyExc_RuntimeError, "could not run the cell on the started ranks: %s", err);
        job = NULL;
    }
    Py_DECREF(wrapped);
    return job;
}

/* restarts=: the payload of this attempt, with what torchrun gives its
 * workers about restarts in the environment each rank sets before the job
 * runs: one TORCHELASTIC_RUN_ID for every attempt (the run's id), and this
 * attempt's TORCHELASTIC_RESTART_COUNT of TORCHELASTIC_MAX_RESTARTS. A new
 * reference to bytes, or NULL with a Python exception set. */
static PyObject *attempt_payload(dk_dist_run_t *run)
{
    PyObject *vars = Py_BuildValue("{s:s, s:N, s:N}", "TORCHELASTIC_RUN_ID", run->run_id,
                                   "TORCHELASTIC_RESTART_COUNT",
                                   PyUnicode_FromFormat("%d", run->attempt - 1),
                                   "TORCHELASTIC_MAX_RESTARTS",
                                   PyUnicode_FromFormat("%d", run->opts.restarts));
    return with_env(run->payload, run->payload_len, vars);
}

/* This attempt's job in LOG_DIR: the first one's payload, or, under
 * restarts=, the attempt's (attempt_payload). False with a Python exception set. */
static bool launch_attempt(dk_dist_run_t *run, char **env, const char *log_dir,
                           const void *payload, size_t len)
{
    snprintf(run->log_dir, sizeof run->log_dir, "%s", log_dir);
    if (run->opts.restarts == 0 || run->pool) {
        run->job = start_job(run, env, log_dir, run->log_cap, payload, len);
        return run->job != NULL;
    }
    if (!run->payload) {
        run->payload = malloc(len ? len : 1);
        if (!run->payload) {
            PyErr_NoMemory();
            return false;
        }
        memcpy(run->payload, payload, len);
        run->payload_len = len;
    }
    PyObject *wrapped = attempt_payload(run);
    if (!wrapped)
        return false;
    run->job = start_job(run, env, log_dir, run->log_cap, PyBytes_AsString(wrapped),
                         (size_t)PyBytes_Size(wrapped));
    Py_DECREF(wrapped);
    return run->job != NULL;
}

bool dist_run_relaunch(dk_dist_run_t *run, bool again)
{
    char err[1024], name[64], log_dir[4096];
    unsigned long long root_cap;
    snprintf(name, sizeof name, "%s-attempt-%d", run->run_id, run->attempt);
    if (again) {
        snprintf(log_dir, sizeof log_dir, "%s", run->log_dir);  /* the attempt's, made */
    } else if (dk_dist_logs_size_from_env("DISTKERNEL_LOG_ROOT_CAP", DK_LOG_ROOT_CAP_DEFAULT,
                                          &root_cap, err, sizeof err) < 0 ||
               dk_dist_logs_next(run->logs, name, root_cap, log_dir, sizeof log_dir, err,
                                 sizeof err) < 0) {
        PyErr_SetString(PyExc_RuntimeError, err);
        return false;
    }
    /* The timeout counts from the first attempt: what is left of it. */
    if (run->opts.timeout_s > 0) {
        double left = run->opts.timeout_s - (double)(dk_now_ms() - run->first_t0_ms) / 1000.0;
        run->opts.timeout_s = left > 1 ? left : 1;
    }
    char **env = dk_dist_mlflow_ranks_env(&run->mlflow);
    bool ok = launch_attempt(run, env, log_dir, run->payload, run->payload_len);
    free(env);
    return ok;
}

/* The MLflow run, the log folder, the job. False with a Python exception set. */
bool dist_run_launch(dk_dist_run_t *run, const void *payload, size_t len)
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
    run->attempt = 1;
    if (!log_cap && dk_dist_logs_size_from_env("DISTKERNEL_LOG_CAP", DK_LOG_CAP_DEFAULT,
                                               &log_cap, err, sizeof err) < 0)
        PyErr_SetString(PyExc_ValueError, err);
    else if (dk_dist_logs_size_from_env("DISTKERNEL_LOG_ROOT_CAP", DK_LOG_ROOT_CAP_DEFAULT,
                                        &root_cap, err, sizeof err) < 0)
        PyErr_SetString(PyExc_ValueError, err);
    else if (dk_dist_logs_next(run->logs, run->run_id, root_cap, log_dir, sizeof log_dir, err,
                               sizeof err) < 0)
        PyErr_SetString(PyExc_RuntimeError, err);
    else if (run->pool && !run->starting) {
        snprintf(run->log_dir, sizeof run->log_dir, "%s", log_dir);
        run->job = submit_round(run, env, log_dir, payload, len);
    } else {
        run->log_cap = log_cap;
        run->first_t0_ms = dk_now_ms();
        if (run->opts.restarts > 0)
            dk_dist_mlflow_attempt(&run->mlflow, run->kernel, 1, run->opts.restarts + 1, NULL);
        launch_attempt(run, env, log_dir, payload, len);
    }
    free(env);
    if (!run->job)
        dk_dist_mlflow_end(&run->mlflow, run->kernel,
                           PyErr_ExceptionMatches(PyExc_KeyboardInterrupt) ? "KILLED" : "FAILED",
                           NULL);
    return run->job != NULL;
}

/* The job runs: its status display, a thinning hint, the MLflow link. */
void dist_run_announce(dk_dist_run_t *run)
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
    dist_run_publish_status(run, NULL, true);
    if (run->attempt <= 1)     /* the same MLflow run for every attempt: one link */
        dk_dist_mlflow_publish_link(&run->mlflow, run->kernel);
}
