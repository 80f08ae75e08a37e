/*
 * dk_dist_slurm: the Slurm part of a run. See the header.
 *
 * The wait in Slurm's queue runs in this thread (dk_slurm_allocate), with the
 * GIL released; dk_slurm asks its `cancelled` callback about every 100 ms,
 * and that is where the GIL is taken back for a moment to let Python run its
 * signal handlers: the kernel's interrupt is a SIGINT, which Python only
 * turns into a KeyboardInterrupt in the main thread, holding the GIL. The
 * questions before a run (sinfo: is Slurm there, what do its nodes have),
 * which a slow controller may hold for their whole 15 s deadline, are waited
 * on the same way, so an interrupt ends them (and sinfo) at once.
 *
 * The ranks of a run on N nodes are started by N node agents, one srun step
 * of N tasks, one per node (built by dk_dist_job.c from what
 * dk_dist_slurm_describe says of the allocation; docs/slurm.md says why one
 * step rather than N): each agent starts its node's ranks, warm from a
 * template that imported torch once on that node, and speaks for them over
 * one connection to the kernel's back channel (runtime/agent/dk_agent.h).
 * srun tells each agent of its own task of that step (SLURM_PROCID is its
 * node, SLURM_NTASKS the nodes): the ranks get the run's node lists in their
 * environment and rewrite those variables to the whole run's before any
 * Python runs (runtime/slurm/dk_slurm_rank.c, from distkernel-rank's main).
 * The step shares the job's resources (--overlap) and gets none of srun's
 * input variables from the kernel's environment (a batch script's
 * SLURM_MEM_PER_NODE ...), so that it never waits for another step of the
 * job (runtime/slurm/dk_slurm_step.c says why each).
 */
#include "dk_pyabi.h"

#include "dk_dist_slurm.h"
#include "dk_log.h"
#include "dk_hostlist.h"
#include "dk_netaddr.h"
#include "dk_setting.h"
#include "dk_slurm.h"

#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* sinfo's deadline here: a cell waits on it, and a healthy controller answers
 * in milliseconds. */
#define PREFLIGHT_TIMEOUT_S 15.0

/* The allocation outlives the ranks' timeout by this much: their start
 * (import torch on a busy node), the stop ladder, and the kernel's release. */
#define TIME_LIMIT_MARGIN_S 300.0

/* How long a node agent may be silent before its node is lost
 * (DISTKERNEL_SLURM_HEARTBEAT, 10 s unless a site or a test sets its own):
 * longer than on one machine's loopback (a busy network, a node swapping),
 * still "within seconds", and well under Slurm's own node failure detection
 * (SlurmdTimeout, 300 s by default). The agent sends its PINGs from its own
 * loop, whatever its ranks do, so a node whose ranks hold the GIL (torch's
 * rendezvous waiting for a late peer) is not silent. */
static double heartbeat_s(void)
{
    return dk_setting_number("DISTKERNEL_SLURM_HEARTBEAT");
}

/* How long a node agent may take to connect after the agents' srun started
 * before its node is taken for lost (dk_job_spec_t.connect_timeout_s): srun
 * and distkernel-agent start, no Python. A site with slow shared filesystems
 * or a slow controller may want more (DISTKERNEL_SLURM_CONNECT_TIMEOUT). */
static double connect_timeout_s(void)
{
    return dk_setting_number("DISTKERNEL_SLURM_CONNECT_TIMEOUT");
}

struct dk_dist_slurm_t {
    dk_slurm_t *alloc;
    int world, per_node;
    char *node_list;            /* the nodes as Slurm writes them, "node[1-16]" */
    char bc_addr[64];
    char advertise[64];         /* advertise_addr=, "" if not given */
    const char **names;         /* the allocation's nodes' names, in its order */
    const char **addrs;         /* and their addresses (NodeAddr) */
    const char **hosts;         /* per rank: its node's name (the allocation's) */
};

/* ---- waiting on Slurm with the GIL released ---------------------------------- */

typedef struct {
    const dk_dist_slurm_hooks_t *hooks;
    PyThreadState *ts;          /* ours while the GIL is released */
    bool interrupted, shutdown;
} waiter_t;

static void waiter_on_wait(void *data, const char *job_id, const char *state, const char *reason)
{
    waiter_t *w = data;
    if (w->hooks && w->hooks->on_wait)
        w->hooks->on_wait(w->hooks->data, job_id, state, reason);
}

static bool waiter_cancelled(void *data)
{
    waiter_t *w = data;
    PyEval_RestoreThread(w->ts);
    if (PyErr_CheckSignals() < 0) {
        /* Ours to report, as a KeyboardInterrupt saying what was cancelled. */
        PyErr_Clear();
        w->interrupted = true;
    }
    w->ts = PyEval_SaveThread();
    if (w->hooks && w->hooks->shutting_down && w->hooks->shutting_down(w->hooks->data))
        w->shutdown = true;
    return w->interrupted || w->shutdown;
}

/* A question to Slurm before anything starts (sinfo, up to
 * PREFLIGHT_TIMEOUT_S) for a waiter W of no hooks: its cancel is W's, so an
 * interrupt ends the command within about 100 ms instead of the deadline. */
static dk_slurm_query_t preflight_query(waiter_t *w)
{
    return (dk_slurm_query_t){.timeout_s = PREFLIGHT_TIMEOUT_S, .cancelled = waiter_cancelled,
                              .data = w};
}

/* The KeyboardInterrupt of a question an interrupt ended; WHAT: what it
 * asked ("for the GPUs of its nodes"). Returns -1. */
static int preflight_interrupted(const char *what)
{
    PyErr_Format(PyExc_KeyboardInterrupt, "interrupted while asking Slurm %s (sinfo). No rank "
                 "was started.", what);
    return -1;
}

/* "nodes=2", "remote=True / launcher=slurm": what asked for Slurm, for messages. */
static void what_asked(const dk_dist_opts_t *opts, char *out, size_t len)
{
    if (opts->nodes > 1)
        snprintf(out, len, "nodes=%d", opts->nodes);
    else
        snprintf(out, len, "launcher=slurm (or remote=True)");
}

int dk_dist_slurm_preflight(const dk_dist_opts_t *opts)
{
    char err[2048], asked[64];
    what_asked(opts, asked, sizeof asked);
    /* A given address is checked before Slurm is asked for anything (the
     * route, when none is given, needs the nodes: dk_dist_slurm_describe). */
    if ((opts->advertise_addr[0] || (getenv(DK_NETADDR_ENV) && *getenv(DK_NETADDR_ENV)))) {
        char addr[64];
        if (dk_netaddr_advertise(opts->advertise_addr, NULL, 0, addr, sizeof addr, err,
                                 sizeof err) < 0) {
            PyErr_Format(PyExc_ValueError, "%s: %s. No rank was started.", asked, err);
            return -1;
        }
    }
    waiter_t w = {0};
    dk_slurm_query_t query = preflight_query(&w);
    w.ts = PyEval_SaveThread();
    int rc = dk_slurm_reachable(&query, err, sizeof err);
    PyEval_RestoreThread(w.ts);
    if (w.interrupted)
        return preflight_interrupted("whether it is reachable");
    if (rc < 0) {
        PyErr_Format(PyExc_RuntimeError, "%s asks for a Slurm cluster, but %s. No rank was "
                     "started.", asked, err);
        return -1;
    }
    return 0;
}

/* ---- the plan ------------------------------------------------------------------ */

/* Outside an allocation: whether PLAN's ranks per node fit a node of the
 * partition, each rank a task of one CPU. Slurm queues a request that does
 * not (reason PartitionConfig) and it would wait for the whole timeout; say
 * so now, with what to give. Where sinfo cannot say, the request goes as it
 * is. -1 with a Python exception when it does not fit. */
static int fits_the_cpus(const dk_dist_opts_t *opts, const dk_dist_plan_t *plan)
{
    const char *job = getenv("SLURM_JOB_ID");
    if ((job && job[0]) || plan->per_node <= 0)
        return 0;
    char err[1024];
    int cpus = 0;
    waiter_t w = {0};
    dk_slurm_query_t query = preflight_query(&w);
    w.ts = PyEval_SaveThread();
    int rc = dk_slurm_cpus_per_node(opts->partition, &query, &cpus, err, sizeof err);
    PyEval_RestoreThread(w.ts);
    if (w.interrupted)
        return preflight_interrupted("for the CPUs of its nodes");
    if (rc < 0 || cpus <= 0 || plan->per_node <= cpus)
        return 0;
    int nodes = (plan->world + cpus - 1) / cpus;
    while (nodes < plan->world && plan->world % nodes)
        nodes++;
    char asked[64];
    what_asked(opts, asked, sizeof asked);
    PyErr_Format(PyExc_ValueError,
                 "%s: %d ranks on %d node%s puts %d on each, but a node of %s%s has at most "
                 "%d CPU%s and Slurm gives each rank one of its own, so the request would wait "
                 "forever: give nodes=%d (or more nodes), or at most %d ranks. No rank was "
                 "started.", asked, plan->world, plan->world / plan->per_node,
                 plan->world / plan->per_node == 1 ? "" : "s", plan->per_node,
                 opts->partition[0] ? "partition " : "the default partition",
                 opts->partition, cpus, cpus == 1 ? "" : "s", nodes,
                 cpus * (plan->world / plan->per_node));
    return -1;
}

int dk_dist_slurm_plan(const dk_dist_opts_t *opts, dk_dist_plan_t *plan)
{
    char err[2048] = "", gres[512] = "", where[600] = "", type[64] = "";
    int gpus = 0, rc = 0;
    if (!opts->num_processes) {
        /* Inside an allocation its nodes are the run's; else the partition's. */
        const char *job = getenv("SLURM_JOB_ID");
        const char *nodes = job && job[0] ? getenv("SLURM_JOB_NODELIST") : NULL;
        if (nodes && nodes[0])
            snprintf(where, sizeof where, "Slurm job %s (%s)", job, nodes);
        else if (opts->partition[0])
            snprintf(where, sizeof where, "partition %s", opts->partition);
        else
            snprintf(where, sizeof where, "the default partition");
        waiter_t w = {0};
        dk_slurm_query_t query = preflight_query(&w);
        w.ts = PyEval_SaveThread();
        rc = dk_slurm_gpus_per_node(opts->partition, nodes, &query, opts->accelerator_model,
                                    &gpus, gres, sizeof gres, type, sizeof type, err,
                                    sizeof err);
        PyEval_RestoreThread(w.ts);
        if (w.interrupted)
            return preflight_interrupted("for the GPUs of its nodes");
        if (rc < 0) {
            PyErr_Format(PyExc_RuntimeError, "could not learn the GPUs of %s: %s. No rank was "
                         "started.", where, err);
            return -1;
        }
    }
    if (dk_dist_plan_slurm(opts, gpus, gres, type, where, plan, err, sizeof err) < 0) {
        PyErr_Format(PyExc_RuntimeError, "%s. No rank was started.", err);
        return -1;
    }
    return fits_the_cpus(opts, plan);
}

/* ---- the wait ------------------------------------------------------------------ */

/* The request for OPTS: PLAN's nodes and ranks (and a GPU per rank), a time
 * limit after the ranks' timeout, a wait no longer than it. */
static dk_slurm_request_t request_for(const dk_dist_opts_t *opts, const dk_dist_plan_t *plan,
                                      bool persistent, waiter_t *w)
{
    dk_slurm_request_t req = {
        .nodes = plan->nodes, .tasks_per_node = plan->per_node,
        .gpus_per_node = plan->gpu ? plan->per_node : 0, .gpu_type = plan->gpu_type,
        .partition = opts->partition, .account = opts->account, .qos = opts->qos,
        .constraint = opts->constraint, .extra_args = opts->slurm_args,
        .on_wait = waiter_on_wait, .cancelled = waiter_cancelled, .data = w,
    };
    if (persistent) {
        /* Started ranks live until stopped, idle past idle_timeout=, or the
         * kernel ends, and timeout= is per cell: no limit follows from the
         * options. Slurm's default would be the partition's DefaultTime, which
         * sites keep short, and would end the ranks under the user; the
         * partition's MaxTime is the longest Slurm allows, and the pool
         * releases the allocation as soon as the ranks end. The queue wait is
         * the user's to interrupt. */
        req.longest_time = true;
    } else if (opts->timeout_s > 0) {
        /* Slurm counts its limits in whole minutes: round up, never under. */
        double limit = opts->timeout_s + TIME_LIMIT_MARGIN_S;
        req.time_limit_s = 60.0 * (double)(long)((limit + 59.999) / 60.0);
        req.wait_s = opts->timeout_s;
        /* The default timeout is no one's wish: on a partition whose MaxTime
         * is shorter (a 30-minute debug partition) the run gets that rather
         * than a request that waits for ever. A timeout= given is the
         * user's: over the MaxTime, the wait ends at once saying so. */
        req.clamp_time = !opts->timeout_given;
    } else {
        /* timeout=None: no end of ours, so the longest Slurm allows, not the
         * partition's DefaultTime, which would end the ranks as failures. */
        req.longest_time = true;
    }
    return req;
}

static void allocation_error(const dk_dist_opts_t *opts, bool persistent, const waiter_t *w,
                             int stopped, const char *err)
{
    char asked[64];
    what_asked(opts, asked, sizeof asked);
    if (w->interrupted)
        PyErr_Format(PyExc_KeyboardInterrupt, "interrupted while waiting for Slurm's nodes: %s. "
                     "No rank was started.", err);
    else if (w->shutdown)
        PyErr_Format(PyExc_RuntimeError, "the kernel is shutting down: %s. No rank was started.",
                     err);
    else if (stopped == 2) {
        char timeout[32];       /* PyErr_Format knows no %g */
        snprintf(timeout, sizeof timeout, "%g", opts->timeout_s);
        PyErr_Format(PyExc_TimeoutError, "%s: timeout=%s passed while waiting for Slurm's nodes: "
                     "%s. No rank was started. Ask for a partition with free nodes "
                     "(partition=), or fewer nodes.", asked, timeout, err);
    }
    else if (stopped == 3 && persistent) {
        /* Started ranks ask for the partition's MaxTime, not for timeout=. */
        PyErr_Format(PyExc_RuntimeError, "%s: Slurm will not run the request: %s. No rank was "
                     "started. Started ranks ask for the partition's MaxTime: give a shorter "
                     "one in slurm_args='--time=H:MM:SS', or a %s whose limit allows it.", asked,
                     err, strstr(err, "MaxWall") ? "qos= (or account=)" : "partition=");
    }
    else if (stopped == 3) {
        /* The time limit asked for is timeout= plus the margin: a shorter
         * timeout= is what makes it fit. */
        char timeout[32];
        snprintf(timeout, sizeof timeout, "%g", opts->timeout_s);
        PyErr_Format(PyExc_RuntimeError, "%s: Slurm will not run the request: %s. No rank was "
                     "started. The allocation asks for timeout= (%s s%s) plus %d minutes: give a "
                     "shorter timeout=, or a %s whose limit allows it.", asked, err, timeout,
                     opts->timeout_given ? "" : ", the default", (int)(TIME_LIMIT_MARGIN_S / 60),
                     strstr(err, "MaxWall") ? "qos= (or account=)" : "partition=");
    }
    else
        PyErr_Format(PyExc_RuntimeError, "%s: Slurm gave no nodes: %s. No rank was started.",
                     asked, err);
}

static dk_dist_slurm_t *slurm_new(dk_slurm_t *alloc, int world, int per_node)
{
    dk_dist_slurm_t *self = calloc(1, sizeof *self);
    if (!self)
        return NULL;
    self->alloc = alloc;
    self->world = world;
    self->per_node = per_node;
    size_t nodes = dk_slurm_node_count(alloc);
    self->hosts = calloc((size_t)world, sizeof *self->hosts);
    self->names = calloc(nodes + 1, sizeof *self->names);
    self->addrs = calloc(nodes + 1, sizeof *self->addrs);
    for (size_t i = 0; self->names && self->addrs && i < nodes; i++) {
        self->names[i] = dk_slurm_node_name(alloc, i);
        self->addrs[i] = dk_slurm_node_addr(alloc, i);
    }
    self->node_list = self->names ? dk_hostlist_compress(self->names, nodes) : NULL;
    if (!self->hosts || !self->addrs || !self->node_list) {
        self->alloc = NULL;     /* the caller's still */
        dk_dist_slurm_destroy(&self);
        return NULL;
    }
    return self;
}

dk_dist_slurm_t *dk_dist_slurm_allocate(const dk_dist_opts_t *opts, const dk_dist_plan_t *plan,
                                        bool persistent, const dk_dist_slurm_hooks_t *hooks)
{
    waiter_t w = {.hooks = hooks};
    dk_slurm_request_t req = request_for(opts, plan, persistent, &w);
    char err[2048] = "";
    int stopped = 0;
    w.ts = PyEval_SaveThread();
    dk_slurm_t *alloc = dk_slurm_allocate(&req, &stopped, err, sizeof err);
    PyEval_RestoreThread(w.ts);
    if (!alloc) {
        allocation_error(opts, persistent, &w, stopped, err);
        return NULL;
    }
    if (dk_slurm_node_count(alloc) < (size_t)req.nodes) {
        PyErr_Format(PyExc_RuntimeError, "Slurm job %s has %zu nodes, the run needs %d",
                     dk_slurm_job_id(alloc), dk_slurm_node_count(alloc), req.nodes);
        dk_slurm_t *a = alloc;
        dk_slurm_destroy(&a);
        return NULL;
    }
    dk_dist_slurm_t *self = slurm_new(alloc, plan->world, req.tasks_per_node);
    if (!self) {
        dk_slurm_destroy(&alloc);
        PyErr_NoMemory();
        return NULL;
    }
    snprintf(self->advertise, sizeof self->advertise, "%s", opts->advertise_addr);
    return self;
}

/* ---- the job -------------------------------------------------------------------- */

int dk_dist_slurm_describe(dk_dist_slurm_t *self, dk_dist_alloc_t *out)
{
    char err[1024];
    size_t count = dk_slurm_node_count(self->alloc);
    if (dk_dist_job_place(self->names, count, self->world, self->per_node,
                          dk_slurm_job_id(self->alloc), self->hosts, err, sizeof err) < 0) {
        PyErr_Format(PyExc_RuntimeError, "%s (its nodes: %s)", err, self->node_list);
        return -1;
    }
    /* The nodes the run uses, in its order: the route to the first that is
     * not this host gives the address (dk_netaddr_advertise). */
    size_t used = (size_t)(self->world / self->per_node);
    if (dk_netaddr_advertise(self->advertise, self->addrs, used, self->bc_addr,
                             sizeof self->bc_addr, err, sizeof err) < 0) {
        PyErr_Format(PyExc_RuntimeError, "no address of this host reaches Slurm job %s's "
                     "nodes (%s): %s", dk_slurm_job_id(self->alloc), self->node_list, err);
        return -1;
    }
    *out = (dk_dist_alloc_t){
        .job_id = dk_slurm_job_id(self->alloc),
        .names = self->names,
        .addrs = self->addrs,
        .count = count,
        .rank_hosts = self->hosts,
        .bc_addr = self->bc_addr,
        .left_s = dk_dist_slurm_time_left(self),
        .heartbeat_s = heartbeat_s(),
        .connect_timeout_s = connect_timeout_s(),
    };
    return 0;
}

const char *dk_dist_slurm_job_id(const dk_dist_slurm_t *self)
{
    return dk_slurm_job_id(self->alloc);
}

const char *dk_dist_slurm_node_list(const dk_dist_slurm_t *self)
{
    return self->node_list;
}

double dk_dist_slurm_time_left(dk_dist_slurm_t *self)
{
    long left = -1;
    char err[512];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dk_slurm_time_left(self->alloc, &left, err, sizeof err);
    Py_END_ALLOW_THREADS
    return rc == 0 && left >= 0 ? (double)left : -1;
}

const char *dk_dist_slurm_time_limit(const dk_dist_slurm_t *self)
{
    return dk_slurm_time_limit(self->alloc);
}

const char *const *dk_dist_slurm_hosts(const dk_dist_slurm_t *self)
{
    return self->hosts;
}

int dk_dist_slurm_release(dk_dist_slurm_t *self, char *err, size_t errlen)
{
    return dk_slurm_release(self->alloc, err, errlen);
}

void dk_dist_slurm_destroy(dk_dist_slurm_t **self_p)
{
    dk_dist_slurm_t *self = self_p ? *self_p : NULL;
    if (!self)
        return;
    if (self->alloc) {
        char err[1024] = "";
        int rc;
        PyThreadState *ts = PyGILState_Check() ? PyEval_SaveThread() : NULL;
        rc = dk_slurm_release(self->alloc, err, sizeof err);
        if (ts)
            PyEval_RestoreThread(ts);
        if (rc < 0)
            dk_log("could not release Slurm job %s: %s", dk_slurm_job_id(self->alloc), err);
        dk_slurm_destroy(&self->alloc);
    }
    free(self->hosts);
    free(self->names);
    free(self->addrs);
    free(self->node_list);
    free(self);
    *self_p = NULL;
}
