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
 * Then the job's spec: each rank is one step of the allocation on its node,
 * started by srun, reaching the kernel over TCP on the address that routes to
 * the first node (DISTKERNEL_ADVERTISE_ADDR overrides it). Destroying the
 * object releases an allocation it asked for (scancel); one the kernel runs
 * in is left alone.
 */
#ifndef DK_DIST_SLURM_H
#define DK_DIST_SLURM_H

#include "dk_dist_opts.h"
#include "dk_dist_plan.h"
#include "dk_job.h"

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

/* Fill SPEC's fields for ranks on the allocation's nodes: bc_tcp_addr and
 * bc_allow_hosts (the run's nodes), rank_hosts, agent_command (one srun
 * step of node agents, one per node, each starting RANK_EXE for its node's
 * ranks: dk_slurm_agents_argv; GPU ranks share their node's GPUs of the
 * job, CPU ranks take none), ranks_per_node, master_addr, master_port,
 * heartbeat_s (longer than on one node: see HEARTBEAT_S in the .c),
 * connect_timeout_s, and env (SPEC's env, or the process's, with the run's
 * and the allocation's node lists from which each rank rewrites its SLURM_*
 * variables: dk_slurm_rank_env). It is called after SPEC's env is set. What
 * SPEC points to belongs to SELF (dk_job_start copies it). Returns 0, or -1
 * with a Python RuntimeError set. spec.warm_socket is left NULL: the
 * agents' templates are spec.agent_warm_modules' (dk_dist_warm_for_run). */
int dk_dist_slurm_spec(dk_dist_slurm_t *self, const char *rank_exe, dk_job_spec_t *spec);

/* The Slurm job's id, and its nodes as Slurm writes them ("node[1-16]"). */
const char *dk_dist_slurm_job_id(const dk_dist_slurm_t *self);
const char *dk_dist_slurm_node_list(const dk_dist_slurm_t *self);

/* The time limit asked for ("infinite", "2-00:00:00"), or "" for Slurm's
 * default or an allocation the kernel runs in. */
const char *dk_dist_slurm_time_limit(const dk_dist_slurm_t *self);

/* The seconds the allocation has left before Slurm ends it (squeue, without
 * the GIL), or -1 when it has no limit or Slurm does not say. */
double dk_dist_slurm_time_left(dk_dist_slurm_t *self);

/* TIMEOUT_S (<= 0: none) for work that starts now on an allocation with
 * LEFT_S seconds left (< 0: no limit): cut so that the work ends as a timeout,
 * with the ranks ended by distkernel, before Slurm's time limit kills them
 * (a margin of a tenth of LEFT_S, 10 to 60 s). The cut value, or TIMEOUT_S. */
double dk_dist_slurm_cut_timeout(double timeout_s, double left_s);

/* Each rank's node name, once dk_dist_slurm_spec ran (world entries). */
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
