/*
 * dk_dist_slurm: the Slurm part of a run that asks for it (launcher=slurm,
 * nodes > 1, or the decorator's remote=True).
 *
 * Before anything starts, Slurm must be reachable from the kernel
 * (runtime/slurm/dk_slurm.h says what that means); otherwise the user reads what is
 * missing and what to set, and no rank, log folder or MLflow run is made.
 *
 * Then, once the run's log folder exists, the run's nodes: an allocation of
 * `nodes` nodes with world/nodes tasks each (the run's partition, account,
 * qos, constraint and slurm_args), from salloc, or the allocation the kernel
 * runs in (SLURM_JOB_ID). Its time limit follows timeout= (the ranks' timeout
 * plus a margin for their start and their ending), and timeout= also bounds
 * the wait in the queue. While the request is queued the caller hears the
 * job's id, state and Slurm's reason; an interrupt or the kernel's shutdown
 * cancels it. The GIL is released while Slurm works.
 *
 * Then what the run's job is built from (dk_dist_job.h): the allocation's
 * nodes, each rank's, and the address of this host that reaches them (the
 * route to the first node; DISTKERNEL_ADVERTISE_ADDR overrides it). Destroying the
 * object releases an allocation it asked for (scancel); one the kernel runs
 * in is left alone.
 */
#ifndef DK_DIST_SLURM_H
#define DK_DIST_SLURM_H

#include "dk_dist_opts.h"
#include "dk_dist_job.h"
#include "dk_dist_plan.h"

#include <stdbool.h>

typedef struct dk_dist_slurm_t dk_dist_slurm_t;

/* The Slurm preflight of a run with OPTS (whose launcher is slurm). Returns 0
 * when the run may go on, or -1 with a Python RuntimeError set. Holds the GIL,
 * and releases it while Slurm's commands run. */
int dk_dist_slurm_preflight(const dk_dist_opts_t *opts);

/* PLAN the run OPTS asks for against the cluster's nodes, never this host's
 * GPUs: for GPU ranks, sinfo says how many GPUs a node of the run's partition
 * (or of the allocation the kernel runs in) has, and dk_dist_plan_slurm
 * splits the world over the nodes. Holds the GIL, released while sinfo runs.
 * Returns 0, or -1 with a Python RuntimeError set (what was wrong and what to
 * give instead). */
int dk_dist_slurm_plan(const dk_dist_opts_t *opts, dk_dist_plan_t *plan);

typedef struct {
    /* The request's state changed while queued (see dk_slurm_request_t). Called
     * without the GIL. May be NULL. */
    void (*on_wait)(void *data, const char *job_id, const char *state, const char *reason);
    /* True ends the wait as a shutdown would (the kernel is going). Called
     * without the GIL. May be NULL. */
    bool (*shutting_down)(void *data);
    void *data;
} dk_dist_slurm_hooks_t;

/* The nodes for a run planned as PLAN (dk_dist_slurm_plan: its nodes, ranks
 * per node and, for GPU ranks, as many GPUs per node) as OPTS asks (Slurm
 * options, timeout). PERSISTENT: for started ranks, which live until released: the
 * time limit is the partition's MaxTime (not one from timeout=, which is per
 * cell), and the wait in the queue is unbounded (an interrupt ends it). Holds the GIL; releases it while Slurm works, taking it back about
 * every 100 ms to notice an interrupt (PyErr_CheckSignals) as a run's wait
 * does. Returns the allocation, or NULL with a Python exception set, and no
 * job of the request left in Slurm's queue: KeyboardInterrupt when
 * interrupted while queued, TimeoutError when timeout= passed in the queue,
 * RuntimeError otherwise (Slurm's words included; a time limit over the
 * partition's or QOS's, said at once with the advice for a shorter
 * timeout=). The time limit is timeout= plus 5 minutes; without timeout=,
 * no more than the partition's MaxTime; with timeout=None, that MaxTime. */
dk_dist_slurm_t *dk_dist_slurm_allocate(const dk_dist_opts_t *opts, const dk_dist_plan_t *plan,
                                        bool persistent, const dk_dist_slurm_hooks_t *hooks);

/* The allocation as the run's job is built from it (dk_dist_job_build):
 * its nodes and their addresses, each rank's node (the plan's ranks per
 * node, in rank order), this host's address that reaches the run's nodes
 * (advertise_addr=, $DISTKERNEL_ADVERTISE_ADDR, or the route to the first
 * of them that is not this host), the seconds it has left, and the site's
 * heartbeat and connect timeout (DISTKERNEL_SLURM_HEARTBEAT,
 * DISTKERNEL_SLURM_CONNECT_TIMEOUT: dk_setting.h). What OUT
 * points to belongs to SELF. Returns 0, or -1 with a Python RuntimeError set
 * (the ranks do not fit its nodes; no address reaches them). */
int dk_dist_slurm_describe(dk_dist_slurm_t *self, dk_dist_alloc_t *out);

/* The Slurm job's id, and its nodes as Slurm writes them ("node[1-16]"). */
const char *dk_dist_slurm_job_id(const dk_dist_slurm_t *self);
const char *dk_dist_slurm_node_list(const dk_dist_slurm_t *self);

/* The time limit asked for ("infinite", "2-00:00:00"), or "" for Slurm's
 * default or an allocation the kernel runs in. */
const char *dk_dist_slurm_time_limit(const dk_dist_slurm_t *self);

/* The seconds the allocation has left before Slurm ends it (squeue, without
 * the GIL), or -1 when it has no limit or Slurm does not say. */
double dk_dist_slurm_time_left(dk_dist_slurm_t *self);

/* Each rank's node name, once dk_dist_slurm_describe ran (world entries). */
const char *const *dk_dist_slurm_hosts(const dk_dist_slurm_t *self);

/* Release an allocation asked for now (scancel), without the GIL and from any
 * one thread at a time; the object stays, for its names, until destroyed.
 * Idempotent. Returns 0, or -1 with ERR (destroy tries again). */
int dk_dist_slurm_release(dk_dist_slurm_t *self, char *err, size_t errlen);

/* Release an allocation asked for (scancel; the GIL released meanwhile, when
 * held), leave one the kernel runs in, and free. *SELF_P becomes NULL. A
 * failed scancel is written to stderr: nothing else can be done then. */
void dk_dist_slurm_destroy(dk_dist_slurm_t **self_p);

#endif
