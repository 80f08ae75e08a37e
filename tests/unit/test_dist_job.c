/*
 * The job a run starts (distributed/dk_dist_job.h), built from options, a
 * plan and made-up Slurm allocations up to 128 nodes of 8 ranks: no Python,
 * no Slurm, no process.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_dist_job.h"

#define NODES_MAX 128

static dk_dist_opts_t opts;
static dk_dist_plan_t plan;
static dk_dist_job_in_t in;
static dk_dist_job_t job;
static dk_dist_alloc_t alloc;
static char names_buf[NODES_MAX][16], addrs_buf[NODES_MAX][16];
static const char *names[NODES_MAX], *addrs[NODES_MAX];
static const char *hosts[NODES_MAX * 8];
static char err[1024];
static const char payload[] = "the cell";
static const char *const env[] = {"PATH=/usr/bin", "MLFLOW_RUN_ID=abc",
                                  "MLFLOW_TRACKING_TOKEN=s3cret", "WANDB_API_KEY=k",
                                  "SLURM_CPUS_PER_TASK=4", "SLURM_JOB_ID=42", NULL};

static void setup(void)
{
    memset(&opts, 0, sizeof opts);
    memset(&plan, 0, sizeof plan);
    memset(&job, 0, sizeof job);
    memset(&alloc, 0, sizeof alloc);
    err[0] = '\0';
    opts.timeout_s = 3600;
    opts.idle_timeout_s = 1800;
    plan.world = 4;
    in = (dk_dist_job_in_t){.opts = &opts, .plan = &plan, .rank_exe = "/opt/dk/bin/distkernel-rank",
                            .env = env, .payload = payload, .payload_len = sizeof payload,
                            .log_dir = "/tmp/runs/run-0001", .log_cap = 1 << 20};
}

static void teardown(void)
{
    dk_dist_job_free(&job);
}

/* COUNT nodes node001..., addressed 10.0.X.Y, WORLD ranks PER_NODE on each,
 * LEFT_S seconds left, as dk_dist_slurm_describe would say. */
static void on_slurm(size_t count, int world, int per_node, double left_s)
{
    for (size_t i = 0; i < count; i++) {
        snprintf(names_buf[i], sizeof names_buf[i], "node%03zu", i + 1);
        snprintf(addrs_buf[i], sizeof addrs_buf[i], "10.0.%zu.%zu", i / 250, i % 250 + 1);
        names[i] = names_buf[i];
        addrs[i] = addrs_buf[i];
    }
    plan.world = world;
    plan.per_node = per_node;
    plan.nodes = world / per_node;
    plan.remote = true;
    cr_assert_eq(dk_dist_job_place(names, count, world, per_node, "42", hosts, err, sizeof err),
                 0, "%s", err);
    alloc = (dk_dist_alloc_t){.job_id = "42", .names = names, .addrs = addrs, .count = count,
                              .rank_hosts = hosts, .bc_addr = "10.9.0.1", .left_s = left_s,
                              .heartbeat_s = 10, .connect_timeout_s = 120};
    in.alloc = &alloc;
}

static bool has(const char *const *list, const char *word)
{
    for (size_t i = 0; list && list[i]; i++)
        if (strcmp(list[i], word) == 0)
            return true;
    return false;
}

static const char *value_of(const char *const *list, const char *name)
{
    size_t n = strlen(name);
    for (size_t i = 0; list && list[i]; i++)
        if (strncmp(list[i], name, n) == 0 && list[i][n] == '=')
            return list[i] + n + 1;
    return NULL;
}

TestSuite(job, .init = setup, .fini = teardown);

Test(job, a_run_on_this_node_is_what_was_asked)
{
    in.warm_socket = "/tmp/dk-warm.sock";
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    const dk_job_spec_t *s = &job.spec;
    cr_assert_eq(s->world_size, 4);
    cr_assert_str_eq(s->rank_exe, "/opt/dk/bin/distkernel-rank");
    cr_assert_eq(s->env, env, "the run's environment as it is: no srun to keep secrets from");
    cr_assert_eq(s->payload, payload);
    cr_assert_eq(s->payload_len, sizeof payload);
    cr_assert_str_eq(s->log_dir, "/tmp/runs/run-0001");
    cr_assert_eq(s->log_cap, 1 << 20);
    cr_assert_eq(s->timeout_s, 3600);
    cr_assert_not(job.timeout_cut);
    cr_assert_eq(s->grace_s, DK_DIST_KILL_GRACE_S);
    cr_assert(s->stacks, "a run that ends badly says where its ranks were");
    cr_assert_str_eq(s->warm_socket, "/tmp/dk-warm.sock");
    cr_assert_not(s->persistent);
    cr_assert_null(s->bc_tcp_addr);
    cr_assert_null(s->agent_command);
    cr_assert_null(s->rank_hosts);
    cr_assert_eq(s->ranks_per_node, 0);
}

Test(job, timeout_none_stays_none_off_slurm)
{
    opts.timeout_s = 0;
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    cr_assert_eq(job.spec.timeout_s, 0);
    cr_assert_not(job.timeout_cut);
}

Test(job, started_ranks_are_kept_and_given_cells_later)
{
    on_slurm(2, 4, 2, 100);
    in.started = true;
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    cr_assert(job.spec.persistent);
    cr_assert_eq(job.spec.idle_timeout_s, 1800);
    cr_assert_null(job.spec.payload);
    cr_assert_eq(job.spec.payload_len, 0);
    cr_assert_eq(job.spec.timeout_s, 0, "each round brings its own timeout, cut then");
    cr_assert_not(job.timeout_cut);
}

Test(job, the_timeout_ends_before_slurms_limit)
{
    on_slurm(2, 4, 2, 600);
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    cr_assert_eq(job.spec.timeout_s, 540, "a tenth of what is left, at most 60 s, before it");
    cr_assert(job.timeout_cut);
}

Test(job, a_timeout_well_within_the_limit_is_kept)
{
    opts.timeout_s = 100;
    on_slurm(2, 4, 2, 600);
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    cr_assert_eq(job.spec.timeout_s, 100);
    cr_assert_not(job.timeout_cut);
}

Test(job, no_timeout_on_a_limited_allocation_gets_one)
{
    opts.timeout_s = 0;
    on_slurm(2, 4, 2, 50);
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    cr_assert_eq(job.spec.timeout_s, 40, "at least 10 s before the limit");
    cr_assert(job.timeout_cut);
}

Test(job, the_timeout_cut)
{
    cr_assert_eq(dk_dist_job_timeout(3600, -1), 3600, "no limit");
    cr_assert_eq(dk_dist_job_timeout(0, -1), 0);
    cr_assert_eq(dk_dist_job_timeout(3600, 7200), 3600);
    cr_assert_eq(dk_dist_job_timeout(0, 7200), 7140, "60 s at most");
    cr_assert_eq(dk_dist_job_timeout(3600, 5), 1, "never 0, which is none");
}

Test(job, a_thousand_ranks_on_128_nodes_are_one_srun_of_agents)
{
    on_slurm(NODES_MAX, 1024, 8, -1);
    plan.gpu = true;
    in.warm_socket = "/tmp/dk-warm.sock";
    in.agent_warm_modules = "torch,numpy";
    in.agent_warm_path = "/home/ann/env/lib";
    in.tunnel_upstream = "127.0.0.1:5000";
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    const dk_job_spec_t *s = &job.spec;
    cr_assert_eq(s->world_size, 1024);
    cr_assert_eq(s->ranks_per_node, 8);
    cr_assert_eq(s->timeout_s, 3600);
    cr_assert_not(job.timeout_cut);
    const char *const *argv = s->agent_command;
    cr_assert_str_eq(argv[0], "srun");
    cr_assert(has(argv, "--jobid=42"));
    cr_assert(has(argv, "--nodes=128"));
    cr_assert(has(argv, "--ntasks=128"), "one agent a node, not a task a rank");
    cr_assert(has(argv, "--nodelist=node[001-128]"));
    cr_assert_not(has(argv, "--gres=none"), "GPU ranks share their node's GPUs of the job");
    size_t n = 0;
    while (argv[n])
        n++;
    cr_assert_str_eq(argv[n - 2], "/opt/dk/bin/distkernel-agent", "beside distkernel-rank");
    cr_assert_str_eq(argv[n - 1], "/opt/dk/bin/distkernel-rank");
    cr_assert_str_eq(s->bc_tcp_addr, "10.9.0.1");
    cr_assert_eq(s->bc_nallow, 128);
    for (size_t i = 0; i < 128; i++)
        cr_assert_str_eq(s->bc_allow_hosts[i], addrs[i]);
    cr_assert_str_eq(s->master_addr, "10.0.0.1", "rank 0's node");
    cr_assert_eq(s->master_port, DK_JOB_PORT_FROM_RANK0);
    cr_assert_eq(s->rank_hosts, hosts);
    cr_assert_str_eq(s->rank_hosts[1023], "node128");
    cr_assert_null(s->warm_socket, "each agent forks from its own node's template");
    cr_assert_str_eq(s->agent_warm_modules, "torch,numpy");
    cr_assert_str_eq(s->agent_warm_path, "/home/ann/env/lib");
    cr_assert_str_eq(s->tunnel_upstream, "127.0.0.1:5000");
    cr_assert_eq(s->heartbeat_s, 10);
    cr_assert_eq(s->connect_timeout_s, 120);
}

Test(job, cpu_ranks_ask_for_no_gpu)
{
    on_slurm(2, 4, 2, -1);
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    cr_assert(has(job.spec.agent_command, "--gres=none"));
}

Test(job, a_run_inside_a_larger_allocation_uses_its_own_nodes)
{
    on_slurm(4, 4, 2, -1);
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    const dk_job_spec_t *s = &job.spec;
    cr_assert(has(s->agent_command, "--nodes=2"));
    cr_assert(has(s->agent_command, "--nodelist=node[001-002]"));
    cr_assert_eq(s->bc_nallow, 2, "the allocation's other nodes are strangers");
    cr_assert_str_eq(value_of(s->env, "DISTKERNEL_SLURM_RUN_NODES"), "node001,node002");
    cr_assert_str_eq(value_of(s->env, "DISTKERNEL_SLURM_JOB_NODES"),
                     "node001,node002,node003,node004");
}

Test(job, srun_is_given_no_secret_and_none_of_its_inputs)
{
    on_slurm(2, 4, 2, -1);
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    const char *const *e = job.spec.env;
    cr_assert_str_eq(value_of(e, "PATH"), "/usr/bin");
    cr_assert_str_eq(value_of(e, "MLFLOW_RUN_ID"), "abc");
    cr_assert_str_eq(value_of(e, "SLURM_JOB_ID"), "42");
    cr_assert_null(value_of(e, "MLFLOW_TRACKING_TOKEN"), "travels in the payload instead");
    cr_assert_null(value_of(e, "WANDB_API_KEY"));
    cr_assert_null(value_of(e, "SLURM_CPUS_PER_TASK"), "it would shape the agents' step");
}

Test(job, export_secrets_sends_those_named)
{
    strcpy(opts.export_secrets, "WANDB_API_KEY");
    on_slurm(2, 4, 2, -1);
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(value_of(job.spec.env, "WANDB_API_KEY"), "k");
    cr_assert_null(value_of(job.spec.env, "MLFLOW_TRACKING_TOKEN"));
}

Test(job, a_rank_program_found_on_path_has_its_agent_there_too)
{
    in.rank_exe = "distkernel-rank";
    on_slurm(2, 4, 2, -1);
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), 0, "%s", err);
    cr_assert(has(job.spec.agent_command, "distkernel-agent"));
}

Test(job, ranks_that_need_more_nodes_than_the_allocation_has_start_nothing)
{
    on_slurm(2, 4, 2, -1);
    plan.world = 8;
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), -1);
    cr_assert_str_eq(err, "8 ranks at 2 per node do not fit Slurm job 42's 2 nodes");
    cr_assert_null(job.spec.agent_command, "nothing half built");
    cr_assert_null(job.env);
}

Test(job, a_job_of_no_rank_is_refused)
{
    plan.world = 0;
    cr_assert_eq(dk_dist_job_build(&in, &job, err, sizeof err), -1);
    cr_assert_str_eq(err, "a job of 0 ranks running \"/opt/dk/bin/distkernel-rank\": nothing "
                          "to start");
}

Test(job, placing_ranks_on_nodes)
{
    on_slurm(3, 6, 2, -1);
    cr_assert_str_eq(hosts[0], "node001");
    cr_assert_str_eq(hosts[1], "node001");
    cr_assert_str_eq(hosts[2], "node002");
    cr_assert_str_eq(hosts[5], "node003");
    cr_assert_eq(dk_dist_job_place(names, 3, 8, 2, "42", hosts, err, sizeof err), -1);
    cr_assert_str_eq(err, "8 ranks at 2 per node need 4 nodes, but Slurm job 42 has 3; give "
                          "nodes= and a rank count that fit it");
    cr_assert_eq(dk_dist_job_place(names, 3, 5, 2, "42", hosts, err, sizeof err), -1);
    cr_assert_str_eq(err, "5 ranks cannot go 2 on each node: give a rank count that is a whole "
                          "number of nodes");
}

Test(job, freeing_nothing_is_harmless)
{
    dk_dist_job_free(NULL);
    dk_dist_job_free(&job);
    dk_dist_job_free(&job);
}
