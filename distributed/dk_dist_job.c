/*
 * dk_dist_job: the job a run starts. See the header.
 *
 * On Slurm's nodes the job is one srun step of node agents, one per node of
 * the run, each starting its node's ranks (runtime/agent/dk_agent.h). srun
 * tells each agent's task only its own part of the step, so the ranks are
 * given the run's and the allocation's node lists, from which each rewrites
 * its SLURM_* variables before any Python runs (runtime/slurm/dk_slurm_rank.c).
 * The step's environment is the kernel's less srun's input variables and
 * less the variables that name secrets (unless export_secrets= lists them):
 * srun --export=ALL would put them in every rank's environment on every
 * node. MLflow's credentials reach those ranks inside the payload instead,
 * over the authenticated back channel (dk_dist_run_start.c).
 */
#include "dk_dist_job.h"
#include "dk_err.h"
#include "dk_hostlist.h"
#include "dk_spawn.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

double dk_dist_job_timeout(double timeout_s, double left_s)
{
    if (left_s < 0)
        return timeout_s;
    double margin = left_s / 10;
    margin = margin < 10 ? 10 : margin > 60 ? 60 : margin;
    double most = left_s - margin > 1 ? left_s - margin : 1;
    return timeout_s > 0 && timeout_s <= most ? timeout_s : most;
}

int dk_dist_job_place(const char *const *names, size_t count, int world, int per_node,
                      const char *job_id, const char **hosts, char *err, size_t errlen)
{
    if (world < 1 || per_node < 1 || world % per_node) {
        dk_set_err(err, errlen, "%d ranks cannot go %d on each node: give a rank count that "
                   "is a whole number of nodes", world, per_node);
        return -1;
    }
    size_t need = (size_t)(world / per_node);
    if (need > count) {
        dk_set_err(err, errlen, "%d ranks at %d per node need %zu nodes, but Slurm job %s has "
                   "%zu; give nodes= and a rank count that fit it", world, per_node, need,
                   job_id, count);
        return -1;
    }
    for (int r = 0; r < world; r++)
        hosts[r] = names[r / per_node];
    return 0;
}

/* "RUN_NODES=a,b" and "JOB_NODES=a,b,c" (NULL: out of memory), the node lists
 * each rank rewrites its SLURM_* variables from: the run's first RUN_NODES
 * nodes, and all of the allocation's. Free both. */
static int node_lists(const dk_dist_alloc_t *a, size_t run_nodes, char *lists[2])
{
    size_t lens[2];
    FILE *f[2] = {open_memstream(&lists[0], &lens[0]), open_memstream(&lists[1], &lens[1])};
    bool ok = f[0] && f[1];
    if (ok) {
        fputs(DK_SLURM_RUN_NODES_ENV "=", f[0]);
        fputs(DK_SLURM_JOB_NODES_ENV "=", f[1]);
    }
    for (size_t i = 0; ok && i < a->count; i++) {
        if (i < run_nodes)
            fprintf(f[0], "%s%s", i ? "," : "", a->names[i]);
        fprintf(f[1], "%s%s", i ? "," : "", a->names[i]);
    }
    for (int i = 0; i < 2; i++)
        if (f[i] && fclose(f[i]) != 0)
            ok = false;
    return ok ? 0 : -1;
}

/* srun ... distkernel-agent RANK_EXE on the run's first RUN_NODES nodes; the
 * agent is beside the rank's program (or on PATH, as it is). */
static int agents(const dk_dist_job_in_t *in, size_t run_nodes, dk_dist_job_t *out)
{
    const char *slash = strrchr(in->rank_exe, '/');
    if (slash ? asprintf(&out->agent_exe, "%.*s/distkernel-agent",
                         (int)(slash - in->rank_exe), in->rank_exe) < 0
              : !(out->agent_exe = strdup("distkernel-agent"))) {
        out->agent_exe = NULL;
        return -1;
    }
    char *list = dk_hostlist_compress(in->alloc->names, run_nodes);
    int rc = list ? dk_slurm_agents_argv(&out->agents, in->alloc->job_id, list, (int)run_nodes,
                                         in->plan->gpu, out->agent_exe, in->rank_exe)
                  : -1;
    free(list);
    return rc;
}

/* The part of the job for ranks on IN's Slurm nodes. */
static int on_nodes(const dk_dist_job_in_t *in, dk_dist_job_t *out, char *err, size_t errlen)
{
    const dk_dist_alloc_t *a = in->alloc;
    const dk_dist_plan_t *plan = in->plan;
    dk_job_spec_t *spec = &out->spec;
    if (plan->per_node < 1 || plan->world % plan->per_node ||
        (size_t)(plan->world / plan->per_node) > a->count || !a->rank_hosts || !a->bc_addr) {
        dk_set_err(err, errlen, "%d ranks at %d per node do not fit Slurm job %s's %zu "
                   "node%s", plan->world, plan->per_node, a->job_id, a->count,
                   a->count == 1 ? "" : "s");
        return -1;
    }
    size_t run_nodes = (size_t)(plan->world / plan->per_node);
    char *lists[2] = {NULL, NULL};
    if (node_lists(a, run_nodes, lists) == 0)
        out->env = dk_slurm_step_env(in->env ? in->env : (const char *const *)environ,
                                     (const char *const *)lists, 2, in->opts->export_secrets);
    free(lists[0]);
    free(lists[1]);
    /* Only the run's own nodes may connect to the back channel: the login
     * host and the allocation's other nodes are strangers to it (dk_accept.h). */
    out->allow = calloc(run_nodes, sizeof *out->allow);
    if (!out->env || !out->allow) {
        dk_set_err(err, errlen, "out of memory building the job for Slurm job %s", a->job_id);
        return -1;
    }
    memcpy(out->allow, a->addrs, run_nodes * sizeof *out->allow);
    if (agents(in, run_nodes, out) < 0) {
        dk_set_err(err, errlen, "Slurm job %s's nodes make no srun command for the node "
                   "agents (an id too long, or out of memory)", a->job_id);
        return -1;
    }
    spec->env = (const char *const *)out->env;
    spec->bc_tcp_addr = a->bc_addr;
    spec->bc_allow_hosts = out->allow;
    spec->bc_nallow = run_nodes;
    spec->rank_hosts = a->rank_hosts;
    spec->agent_command = out->agents.argv;
    spec->ranks_per_node = plan->per_node;
    /* Rank 0's store is on the first node, on a port rank 0 finds free there. */
    spec->master_addr = a->addrs[0];
    spec->master_port = DK_JOB_PORT_FROM_RANK0;
    spec->warm_socket = NULL;   /* each agent forks from a template of its own node */
    spec->agent_warm_modules = in->agent_warm_modules;
    spec->agent_warm_path = in->agent_warm_modules ? in->agent_warm_path : NULL;
    spec->tunnel_upstream = in->tunnel_upstream;
    spec->heartbeat_s = a->heartbeat_s;
    spec->connect_timeout_s = a->connect_timeout_s;
    return 0;
}

int dk_dist_job_build(const dk_dist_job_in_t *in, dk_dist_job_t *out, char *err,
                      size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (in->plan->world < 1 || !in->rank_exe || !in->rank_exe[0]) {
        dk_set_err(err, errlen, "a job of %d ranks running \"%s\": nothing to start",
                   in->plan->world, in->rank_exe ? in->rank_exe : "");
        return -1;
    }
    out->spec = (dk_job_spec_t){
        .world_size = in->plan->world,
        .rank_exe = in->rank_exe,
        .env = in->env,
        .payload = in->payload,
        .payload_len = in->payload_len,
        .log_dir = in->log_dir,
        .log_cap = in->log_cap,
        .grace_s = DK_DIST_KILL_GRACE_S,
        .stacks = true,     /* a run that ends badly says where its ranks were */
        .warm_socket = in->warm_socket,
    };
    if (in->started) {
        /* Each round brings its cell and its timeout (dk_job_submit). */
        out->spec.persistent = true;
        out->spec.idle_timeout_s = in->opts->idle_timeout_s;
        out->spec.payload = NULL;
        out->spec.payload_len = 0;
        out->spec.timeout_s = 0;
    } else {
        /* Ranks Slurm's time limit would end by SIGTERM would read as a crash:
         * the run ends as a timeout before it instead. */
        double left = in->alloc ? in->alloc->left_s : -1;
        out->spec.timeout_s = dk_dist_job_timeout(in->opts->timeout_s, left);
        out->timeout_cut = out->spec.timeout_s != in->opts->timeout_s;
    }
    if (in->alloc && on_nodes(in, out, err, errlen) < 0) {
        dk_dist_job_free(out);
        return -1;
    }
    return 0;
}

void dk_dist_job_free(dk_dist_job_t *out)
{
    if (!out)
        return;
    dk_spawn_env_free(out->env);
    free(out->allow);
    free(out->agent_exe);
    dk_slurm_agents_free(&out->agents);
    memset(out, 0, sizeof *out);
}
