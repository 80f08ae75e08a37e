/*
 * dk_dist_job: the job a run starts, built from what was asked and what was
 * found, and nothing else.
 *
 * A run decides its ranks in steps that talk to the world: the options are
 * parsed, the ranks planned against this node's GPUs or Slurm's nodes, an
 * allocation granted, a warm-start template found, MLflow's run made. What
 * those steps found goes in a dk_dist_job_in_t; dk_dist_job_build turns it
 * into the dk_job_spec_t that dk_job_start takes (runtime/launch/dk_job.h),
 * reading no environment variable, starting no process, calling no Python.
 * So every choice about the job (the timeout and its cut before Slurm's time
 * limit, started ranks' persistence, which nodes may connect, the node
 * agents' srun, the ranks' node lists, the secrets left out of srun's
 * environment) is here, in one place, and tested alone
 * (tests/unit/test_dist_job.c); dk_dist_run_start.c gathers the facts and
 * starts what this builds.
 */
#ifndef DK_DIST_JOB_H
#define DK_DIST_JOB_H

#include "dk_dist_opts.h"
#include "dk_dist_plan.h"
#include "dk_job.h"
#include "dk_slurm.h"

#include <stdbool.h>
#include <stddef.h>

/* Between SIGINT, SIGTERM and SIGKILL when the runtime ends a run's ranks. */
#define DK_DIST_KILL_GRACE_S 2.0

/* A Slurm allocation the run's ranks go on, as dk_dist_slurm found it. */
typedef struct {
    const char *job_id;                 /* Slurm's job id */
    const char *const *names;           /* its nodes' names, in Slurm's order */
    const char *const *addrs;           /* their addresses (NodeAddr: the name when none) */
    size_t count;                       /* how many nodes */
    const char *const *rank_hosts;      /* each rank's node name (dk_dist_job_place) */
    const char *bc_addr;                /* this host's numeric address the nodes reach */
    double left_s;                      /* seconds before Slurm ends it; -1: no limit */
    double heartbeat_s;                 /* the site's silence deadline for a node */
    double connect_timeout_s;           /* the site's wait for a node agent's connection */
} dk_dist_alloc_t;

typedef struct {
    const dk_dist_opts_t *opts;         /* timeout_s, idle_timeout_s, export_secrets */
    const dk_dist_plan_t *plan;         /* world; on Slurm, per_node and gpu */
    /* `%distributed start`: ranks the pool keeps, given cells later as
     * rounds (dk_job_submit), so no payload, no timeout, opts' idle timeout. */
    bool started;
    const char *rank_exe;               /* distkernel-rank */
    const char *const *env;             /* the ranks' environment; NULL: the process's */
    const void *payload;                /* the cell or function, every rank's */
    size_t payload_len;
    const char *log_dir;                /* the run's log folder, made */
    unsigned long long log_cap;         /* each rank-N.log's bytes at most */
    /* This node's warm-start template (dk_dist_warm_socket), NULL: cold.
     * Unused on Slurm, where each node agent forks from its own. */
    const char *warm_socket;
    /* Slurm's nodes, NULL: this node. The rest is for Slurm's nodes only. */
    const dk_dist_alloc_t *alloc;
    const char *agent_warm_modules;     /* what the agents' templates import; NULL: cold */
    const char *agent_warm_path;        /* the kernel's sys.path for them, newline-separated */
    const char *tunnel_upstream;        /* MLflow on this host's loopback, "127.0.0.1:PORT" */
} dk_dist_job_in_t;

typedef struct {
    dk_job_spec_t spec;
    /* The timeout was cut below the one asked for (or given where none was)
     * to end before the allocation's time limit: the run says so. */
    bool timeout_cut;
    /* What spec points to that is the build's own (dk_dist_job_free). */
    char **env;
    const char **allow;
    char *agent_exe;
    dk_slurm_agents_t agents;
} dk_dist_job_t;

/* Build IN's job into OUT (whose spec points into IN, and into OUT itself:
 * keep OUT where it is, and free it with dk_dist_job_free once dk_job_start
 * has copied what it needs). Returns 0, or
 * -1 with ERR saying what does not fit (OUT is then empty: freeing it is
 * harmless). */
int dk_dist_job_build(const dk_dist_job_in_t *in, dk_dist_job_t *out, char *err,
                      size_t errlen);

/* Free what OUT owns. NULL is accepted. */
void dk_dist_job_free(dk_dist_job_t *out);

/* Where each of WORLD ranks goes on COUNT nodes NAMES, PER_NODE on each in
 * rank order: HOSTS[r] (WORLD entries) is NAMES[r / PER_NODE]. Returns 0, or
 * -1 with ERR when the ranks need more nodes than there are (JOB_ID names
 * the allocation in it), or the numbers are not whole. */
int dk_dist_job_place(const char *const *names, size_t count, int world, int per_node,
                      const char *job_id, const char **hosts, char *err, size_t errlen);

/* A timeout for work starting now on an allocation with LEFT_S seconds left
 * (-1: no limit): TIMEOUT_S (0: none), or less, to end a margin before the
 * limit (a tenth of what is left, 10 s to 60 s), when Slurm's SIGTERM
 * would come first. */
double dk_dist_job_timeout(double timeout_s, double left_s);

#endif
