/*
 * Slurm through its commands (runtime/slurm/dk_slurm.h).
 *
 * Three groups:
 *  - slurm_text: the host list, word splitting, squeue and salloc formats; pure.
 *  - slurm_fake: Slurm's commands replaced by small sh scripts on PATH, for what
 *    a real cluster will not do on demand: a command that hangs, a salloc that
 *    dies before saying its job's id. They check that nothing hangs and that a
 *    job is cancelled whatever happened. Run everywhere.
 *  - slurm_cluster: against the simulated cluster (tests/slurm/), which meson
 *    brings up around this program through tests/slurm/with_cluster.sh and
 *    names in DISTKERNEL_TEST_SLURM_CONF. Skipped, with the reason, only where
 *    it cannot run (not root); on CI the wrapper fails instead.
 */
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dk_clock.h"
#include "dk_slurm.h"
#include "dk_spawn.h"

/* ---- slurm_text ----------------------------------------------------------- */

static void expect_hosts(const char *list, const char *joined)
{
    char **names = NULL, err[256] = "", buf[4096] = "";
    size_t n = 0;
    cr_assert_eq(dk_slurm_hostlist_expand(list, &names, &n, err, sizeof err), 0, "%s: %s",
                 list, err);
    for (size_t i = 0; i < n; i++) {
        strcat(buf, i ? " " : "");
        strcat(buf, names[i]);
    }
    cr_expect_str_eq(buf, joined, "%s", list);
    dk_slurm_names_free(names, n);
}

static void expect_bad_hosts(const char *list, const char *words)
{
    char **names = NULL, err[256] = "";
    size_t n = 0;
    cr_assert_eq(dk_slurm_hostlist_expand(list, &names, &n, err, sizeof err), -1, "%s", list);
    cr_expect(strstr(err, words), "%s: %s", list, err);
}

Test(slurm_text, hostlist_expands_ranges_lists_and_plain_names)
{
    expect_hosts("node1", "node1");
    expect_hosts("node[1-3,5]", "node1 node2 node3 node5");
    expect_hosts("node[1-2],login", "node1 node2 login");
    expect_hosts("a,b[7],c", "a b7 c");
}

Test(slurm_text, hostlist_keeps_zero_padding_and_expands_several_brackets)
{
    expect_hosts("gpu[08-11]", "gpu08 gpu09 gpu10 gpu11");
    expect_hosts("r[1-2]n[1-2]", "r1n1 r1n2 r2n1 r2n2");
    expect_hosts("gpu-a[01-02]-ib", "gpu-a01-ib gpu-a02-ib");
}

Test(slurm_text, hostlist_refuses_malformed_lists)
{
    expect_bad_hosts("node[1-3", "not a Slurm host list");
    expect_bad_hosts("node[3-1]", "node[3-1]");
    expect_bad_hosts("node[]", "node[]");
    expect_bad_hosts("node[1,,2]", "node[1,,2]");
    expect_bad_hosts("node[a-b]", "node[a-b]");
    expect_bad_hosts("node1,", "ends with a comma");
    expect_bad_hosts("", "empty");
    expect_bad_hosts("node1 node2", "not a Slurm host list");
    expect_bad_hosts("n[[1]]", "not a Slurm host list");
}

Test(slurm_text, hostlist_refuses_more_than_65536_hosts_without_building_them)
{
    expect_bad_hosts("n[0-99999999]", "more than 65536");
    expect_bad_hosts("a[1-300]b[1-300]", "more than 65536");
}

Test(slurm_text, words_split_like_a_shell)
{
    char **w = NULL, err[256] = "";
    size_t n = 0;
    cr_assert_eq(dk_slurm_split_words("  --exclusive --comment='a b' \"--x=\\\"q\\\"\" c\\ d ",
                                      &w, &n, err, sizeof err), 0, "%s", err);
    cr_assert_eq(n, 4);
    cr_expect_str_eq(w[0], "--exclusive");
    cr_expect_str_eq(w[1], "--comment=a b");
    cr_expect_str_eq(w[2], "--x=\"q\"");
    cr_expect_str_eq(w[3], "c d");
    dk_slurm_names_free(w, n);
    cr_assert_eq(dk_slurm_split_words("", &w, &n, err, sizeof err), 0);
    cr_expect_eq(n, 0);
    dk_slurm_names_free(w, n);
    cr_assert_eq(dk_slurm_split_words("--comment='open", &w, &n, err, sizeof err), -1);
    cr_expect(strstr(err, "unterminated"), "%s", err);
}

Test(slurm_text, squeue_lines_give_id_state_reason_and_nodes)
{
    dk_slurm_squeue_t q;
    cr_assert_eq(dk_slurm_parse_squeue("42|PENDING|PartitionDown|\n", &q), 0);
    cr_expect_str_eq(q.job_id, "42");
    cr_expect_str_eq(q.state, "PENDING");
    cr_expect_str_eq(q.reason, "PartitionDown");
    cr_expect_str_eq(q.nodes, "");
    cr_assert_eq(dk_slurm_parse_squeue("7|RUNNING|None|node[1-2]", &q), 0);
    cr_expect_str_eq(q.nodes, "node[1-2]");
    cr_expect_eq(dk_slurm_parse_squeue("squeue: error: Invalid job id specified", &q), -1);
    cr_expect_eq(dk_slurm_parse_squeue("x|RUNNING|None|n1", &q), -1);
    cr_expect_eq(dk_slurm_parse_squeue("7|RUNNING|None", &q), -1);
}

Test(slurm_text, a_partitions_time_limit_is_read_from_sinfo)
{
    const char *text = "debug 30:00\nsim* infinite\ngpu 2-00:00:00\nlone\nold n/a\n";
    char out[64] = "";
    cr_assert(dk_slurm_partition_limit(text, NULL, out, sizeof out));
    cr_expect_str_eq(out, "infinite");          /* the default, marked '*' */
    cr_assert(dk_slurm_partition_limit(text, "", out, sizeof out));
    cr_expect_str_eq(out, "infinite");
    cr_assert(dk_slurm_partition_limit(text, "gpu", out, sizeof out));
    cr_expect_str_eq(out, "2-00:00:00");
    cr_assert(dk_slurm_partition_limit(text, "debug,gpu", out, sizeof out));
    cr_expect_str_eq(out, "30:00");             /* a list: its first */
    cr_expect_not(dk_slurm_partition_limit(text, "nope", out, sizeof out));
    cr_expect_not(dk_slurm_partition_limit(text, "lone", out, sizeof out));
    cr_expect_not(dk_slurm_partition_limit(text, "old", out, sizeof out));
    cr_expect_not(dk_slurm_partition_limit("debug 30:00\n", NULL, out, sizeof out));
}

Test(slurm_text, salloc_says_the_job_id_pending_queued_or_granted)
{
    char id[32];
    cr_assert(dk_slurm_salloc_job_id("salloc: Pending job allocation 12\n", id, sizeof id));
    cr_expect_str_eq(id, "12");
    cr_assert(dk_slurm_salloc_job_id("salloc: job 345 queued and waiting for resources\n", id,
                                     sizeof id));
    cr_expect_str_eq(id, "345");
    cr_assert(dk_slurm_salloc_job_id("salloc: Granted job allocation 6789\n", id, sizeof id));
    cr_expect_str_eq(id, "6789");
    cr_expect_not(dk_slurm_salloc_job_id("salloc: error: Invalid partition name specified\n",
                                         id, sizeof id));
}

Test(slurm_text, a_nodes_gpus_are_counted_from_its_gres)
{
    cr_expect_eq(dk_slurm_gres_gpus("gpu:8"), 8);
    cr_expect_eq(dk_slurm_gres_gpus("gpu:h100:8(S:0-1)"), 8);
    cr_expect_eq(dk_slurm_gres_gpus("gpu:a100:4,gpu:v100:2"), 6);
    cr_expect_eq(dk_slurm_gres_gpus("mps:100,gpu:2"), 2);
    cr_expect_eq(dk_slurm_gres_gpus("gpu:tesla:2(S:0,1),nic:1"), 2);
    cr_expect_eq(dk_slurm_gres_gpus("gpu_mem:40000,gpus:3,shard:8"), 0);
    cr_expect_eq(dk_slurm_gres_gpus("(null)"), 0);
    cr_expect_eq(dk_slurm_gres_gpus(""), 0);
    cr_expect_eq(dk_slurm_gres_gpus(NULL), 0);
    cr_expect_eq(dk_slurm_gres_gpus("gpu"), 0);      /* no count */
}

Test(slurm_text, a_partitions_gpus_per_node_are_its_nodes_most)
{
    const char *text = "cpu|(null)\ngpu*|gpu:a100:4(S:0)\ngpu*|gpu:h100:8(S:0-1)\n"
                       "mixed|gpu:2,mps:100\nmixed|(null)\n";
    char gres[64] = "";
    cr_expect_eq(dk_slurm_partition_gpus(text, NULL, false, gres, sizeof gres), 8);
    cr_expect_str_eq(gres, "gpu:h100:8(S:0-1)");    /* the default, marked '*' */
    cr_expect_eq(dk_slurm_partition_gpus(text, "cpu", false, gres, sizeof gres), 0);
    cr_expect_str_eq(gres, "(null)");
    cr_expect_eq(dk_slurm_partition_gpus(text, "mixed,gpu", false, gres, sizeof gres), 2);
    cr_expect_eq(dk_slurm_partition_gpus(text, "nope", false, gres, sizeof gres), -1);
    cr_expect_eq(dk_slurm_partition_gpus("cpu|(null)\n", NULL, false, gres, sizeof gres), -1);
    /* asked about given nodes: every line is theirs, whatever the partition */
    cr_expect_eq(dk_slurm_partition_gpus(text, NULL, true, gres, sizeof gres), 8);
}

Test(slurm_text, gpus_of_a_model_are_counted_by_their_gres_type)
{
    char type[64] = "";
    cr_expect_eq(dk_slurm_gres_gpus_of("gpu:h100:8(S:0-1)", "H100", type, sizeof type), 8);
    cr_expect_str_eq(type, "h100");
    cr_expect_eq(dk_slurm_gres_gpus_of("gpu:nvidia_h100_80gb_hbm3:4", "H100", type,
                                       sizeof type), 4);
    cr_expect_str_eq(type, "nvidia_h100_80gb_hbm3");     /* Slurm's NVML autodetection */
    cr_expect_eq(dk_slurm_gres_gpus_of("gpu:H100-SXM:2", "h100", type, sizeof type), 2);
    cr_expect_eq(dk_slurm_gres_gpus_of("gpu:a100:4,gpu:v100:2", "V100", type, sizeof type), 2);
    cr_expect_str_eq(type, "v100");
    /* "a100" is no A10, "h200" no H20; untyped GRES and no model count nothing */
    cr_expect_eq(dk_slurm_gres_gpus_of("gpu:a100:4", "A10", type, sizeof type), 0);
    cr_expect_str_eq(type, "");
    cr_expect_eq(dk_slurm_gres_gpus_of("gpu:h200:8", "H20", type, sizeof type), 0);
    cr_expect_eq(dk_slurm_gres_gpus_of("gpu:8", "H100", type, sizeof type), 0);
    cr_expect_eq(dk_slurm_gres_gpus_of("gpu:h100:8", "", type, sizeof type), 0);
    char types[64];
    dk_slurm_gres_gpu_types("gpu:a100:4(S:0,1),gpu:v100:2,gpu:a100:1,mps:100", types,
                            sizeof types);
    cr_expect_str_eq(types, "a100, v100");
    dk_slurm_gres_gpu_types("gpu:8", types, sizeof types);
    cr_expect_str_eq(types, "");
}

Test(slurm_text, a_partitions_gpus_of_a_model_are_its_nodes_most_of_that_type)
{
    const char *text = "gpu*|gpu:a100:8(S:0-1)\ngpu*|gpu:h100:4(S:0)\ngpu*|gpu:8\n";
    char gres[64] = "x", type[64] = "x";
    cr_expect_eq(dk_slurm_partition_gpus_of(text, NULL, false, "H100", gres, sizeof gres, type,
                                            sizeof type), 4);
    cr_expect_str_eq(gres, "gpu:h100:4(S:0)");
    cr_expect_str_eq(type, "h100");
    cr_expect_eq(dk_slurm_partition_gpus_of(text, NULL, false, "B300", gres, sizeof gres, type,
                                            sizeof type), 0);
    cr_expect_str_eq(gres, "");
    cr_expect_str_eq(type, "");
}

Test(slurm_text, the_most_cpus_of_a_partitions_nodes_are_read_from_sinfo)
{
    const char *text = "small|2\nsim*|4\nsim*|16\nhetero|8+\nodd|n/a\n";
    cr_expect_eq(dk_slurm_partition_cpus(text, NULL), 16);     /* the default, marked '*' */
    cr_expect_eq(dk_slurm_partition_cpus(text, "small"), 2);
    cr_expect_eq(dk_slurm_partition_cpus(text, "hetero,sim"), 8);
    cr_expect_eq(dk_slurm_partition_cpus(text, "odd"), -1);
    cr_expect_eq(dk_slurm_partition_cpus(text, "nope"), -1);
    cr_expect_eq(dk_slurm_partition_cpus("small|2\n", NULL), -1);
}

Test(slurm_text, slurm_times_are_read_in_seconds)
{
    cr_expect_eq(dk_slurm_time_s("30:00"), 1800);
    cr_expect_eq(dk_slurm_time_s("5"), 300);
    cr_expect_eq(dk_slurm_time_s("1:00:00"), 3600);
    cr_expect_eq(dk_slurm_time_s("2-00:00:00"), 172800);
    cr_expect_eq(dk_slurm_time_s("1-02"), 93600);
    cr_expect_eq(dk_slurm_time_s("1-02:30"), 95400);
    cr_expect_eq(dk_slurm_time_s("185:00"), 11100);
    cr_expect_eq(dk_slurm_time_s("infinite"), -1);
    cr_expect_eq(dk_slurm_time_s("UNLIMITED"), -1);
    cr_expect_eq(dk_slurm_time_s("n/a"), -1);
    cr_expect_eq(dk_slurm_time_s("1:"), -1);
    cr_expect_eq(dk_slurm_time_s("1:2:3:4"), -1);
    cr_expect_eq(dk_slurm_time_s(""), -1);
}

Test(slurm_text, reasons_that_a_time_limit_never_gets_past)
{
    cr_expect(dk_slurm_time_limit_reason("PartitionTimeLimit"));
    cr_expect(dk_slurm_time_limit_reason("QOSMaxWallDurationPerJobLimit"));
    cr_expect(dk_slurm_time_limit_reason("AssocMaxWallDurationPerJobLimit"));
    cr_expect_not(dk_slurm_time_limit_reason("Resources"));
    cr_expect_not(dk_slurm_time_limit_reason("PartitionDown"));
    cr_expect_not(dk_slurm_time_limit_reason("Priority"));
}

/* The value of NAME among WORDS ("NAME=VALUE"), or NULL. */
static const char *word_value(char **words, size_t n, const char *name)
{
    size_t len = strlen(name);
    for (size_t i = 0; i < n; i++)
        if (strncmp(words[i], name, len) == 0 && words[i][len] == '=')
            return words[i] + len + 1;
    return NULL;
}

Test(slurm_text, a_ranks_slurm_variables_describe_the_run_not_its_step)
{
    /* rank 5 of 8, 4 on each of 2 nodes, in an allocation of 3 */
    const char *env[] = {"RANK=5", "LOCAL_RANK=1", "GROUP_RANK=1", "WORLD_SIZE=8",
                         "LOCAL_WORLD_SIZE=4", "SLURM_STEP_ID=7", "SLURM_PROCID=0",
                         DK_SLURM_RUN_NODES_ENV "=gpu1,gpu2",
                         DK_SLURM_JOB_NODES_ENV "=gpu1,gpu2,gpu3", NULL};
    char **w = NULL, err[512] = "";
    size_t n = 0;
    cr_assert_eq(dk_slurm_rank_env(env, &w, &n, err, sizeof err), 0, "%s", err);
    const char *want[][2] = {
        {"SLURM_PROCID", "5"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"},
        {"SLURM_NTASKS", "8"}, {"SLURM_NPROCS", "8"}, {"SLURM_STEP_NUM_TASKS", "8"},
        {"SLURM_NNODES", "2"}, {"SLURM_STEP_NUM_NODES", "2"}, {"SLURM_JOB_NUM_NODES", "3"},
        {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
        {"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_STEP_NODELIST", "gpu1,gpu2"},
        {"SLURM_JOB_NODELIST", "gpu1,gpu2,gpu3"}, {"SLURM_NODELIST", "gpu1,gpu2,gpu3"},
        {"SLURM_GTIDS", "4,5,6,7"}, {"SLURM_DISTRIBUTION", "block"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const char *v = word_value(w, n, want[i][0]);
        cr_expect(v && strcmp(v, want[i][1]) == 0, "%s=%s, want %s", want[i][0],
                  v ? v : "(unset)", want[i][1]);
    }
    dk_slurm_names_free(w, n);

    /* one node: "2", not "2(x1)"; the allocation's list defaults to the run's */
    const char *one[] = {"RANK=0", "LOCAL_RANK=0", "GROUP_RANK=0", "WORLD_SIZE=2",
                         "LOCAL_WORLD_SIZE=2", "SLURM_STEP_ID=0",
                         DK_SLURM_RUN_NODES_ENV "=node1", NULL};
    cr_assert_eq(dk_slurm_rank_env(one, &w, &n, err, sizeof err), 0, "%s", err);
    cr_expect_str_eq(word_value(w, n, "SLURM_TASKS_PER_NODE"), "2");
    cr_expect_str_eq(word_value(w, n, "SLURM_JOB_NUM_NODES"), "1");
    cr_expect_str_eq(word_value(w, n, "SLURM_GTIDS"), "0,1");
    dk_slurm_names_free(w, n);
}

Test(slurm_text, only_a_slurm_runs_ranks_have_their_variables_rewritten)
{
    char **w = NULL, err[512] = "";
    size_t n = 1;
    /* a local run inside an allocation: no node lists from the launcher */
    const char *local[] = {"RANK=1", "LOCAL_RANK=1", "GROUP_RANK=0", "WORLD_SIZE=2",
                           "LOCAL_WORLD_SIZE=2", "SLURM_STEP_ID=0", NULL};
    cr_expect_eq(dk_slurm_rank_env(local, &w, &n, err, sizeof err), 0);
    cr_expect_eq(n, 0);
    /* not started by srun */
    const char *no_step[] = {"RANK=1", DK_SLURM_RUN_NODES_ENV "=a,b", NULL};
    n = 1;
    cr_expect_eq(dk_slurm_rank_env(no_step, &w, &n, err, sizeof err), 0);
    cr_expect_eq(n, 0);
    /* what does not add up is said */
    const char *bad[] = {"RANK=1", "LOCAL_RANK=1", "GROUP_RANK=0", "WORLD_SIZE=6",
                         "LOCAL_WORLD_SIZE=2", "SLURM_STEP_ID=0",
                         DK_SLURM_RUN_NODES_ENV "=a,b", NULL};
    cr_expect_eq(dk_slurm_rank_env(bad, &w, &n, err, sizeof err), -1);
    cr_expect(strstr(err, "does not add up") && strstr(err, "over 2 nodes (a,b)"), "%s", err);
    const char *missing[] = {"SLURM_STEP_ID=0", DK_SLURM_RUN_NODES_ENV "=a", NULL};
    cr_expect_eq(dk_slurm_rank_env(missing, &w, &n, err, sizeof err), -1);
    cr_expect(strstr(err, "RANK is '(unset)'"), "%s", err);
}

static size_t argv_count(const char *const *argv)
{
    size_t n = 0;
    while (argv[n])
        n++;
    return n;
}

static bool argv_has(const char *const *argv, const char *word)
{
    for (size_t i = 0; argv[i]; i++)
        if (strcmp(argv[i], word) == 0)
            return true;
    return false;
}

Test(slurm_text, the_agents_step_is_one_task_a_node_that_overlaps_the_jobs_other_steps)
{
    dk_slurm_agents_t cpu, gpu;
    cr_assert_eq(dk_slurm_agents_argv(&cpu, "4711", "node[2-17]", 16, false,
                                      "/p/distkernel-agent", "/p/distkernel-rank"), 0);
    const char *want[] = {"srun", "--jobid=4711", "--nodes=16", "--ntasks=16",
                          "--ntasks-per-node=1", "--overlap", "--gres=none",
                          "--nodelist=node[2-17]", "--kill-on-bad-exit=0", "--cpu-bind=none",
                          "--export=ALL", "--quiet", "--chdir=/", "/p/distkernel-agent",
                          "/p/distkernel-rank", NULL};
    cr_assert_eq(argv_count(cpu.argv), sizeof want / sizeof want[0] - 1);
    for (size_t i = 0; want[i]; i++)
        cr_expect_str_eq(cpu.argv[i], want[i]);
    /* one CPU per task would pin a node's every rank to the agent's one */
    cr_expect(!argv_has(cpu.argv, "--exact"));
    dk_slurm_agents_free(&cpu);
    /* GPU ranks: every GPU of the job on the node, shared by its ranks */
    cr_assert_eq(dk_slurm_agents_argv(&gpu, "4711", "gpu7", 1, true, "agent", "rank"), 0);
    cr_expect(argv_has(gpu.argv, "--overlap") && argv_has(gpu.argv, "--nodelist=gpu7"));
    cr_expect(argv_has(gpu.argv, "--nodes=1") && argv_has(gpu.argv, "--ntasks=1"));
    cr_expect(!argv_has(gpu.argv, "--gres=none") && !argv_has(gpu.argv, "--exact"));
    cr_expect_str_eq(gpu.argv[argv_count(gpu.argv) - 2], "agent");
    cr_expect_str_eq(gpu.argv[argv_count(gpu.argv) - 1], "rank");
    dk_slurm_agents_free(&gpu);
    /* what makes no command is refused */
    char longid[100];
    memset(longid, '7', sizeof longid - 1);
    longid[sizeof longid - 1] = 0;
    cr_expect_eq(dk_slurm_agents_argv(&gpu, longid, "node1", 1, true, "agent", "rank"), -1);
    cr_expect_eq(dk_slurm_agents_argv(&gpu, "", "node1", 1, true, "agent", "rank"), -1);
    cr_expect_eq(dk_slurm_agents_argv(&gpu, "1", "", 1, true, "agent", "rank"), -1);
    cr_expect_eq(dk_slurm_agents_argv(&gpu, "1", "node1", 0, true, "agent", "rank"), -1);
    cr_expect_eq(dk_slurm_agents_argv(&gpu, "1", "node1", 1, true, "", "rank"), -1);
    cr_expect_eq(dk_slurm_agents_argv(&gpu, "1", "node1", 1, true, "agent", ""), -1);
    dk_slurm_agents_free(&gpu);
}

Test(slurm_text, a_steps_environment_has_no_srun_input_variables_but_the_jobs)
{
    /* a kernel started by `sbatch -c2 --mem=900G --ntasks-per-node=4`, inside
     * `srun --pty --label`: what srun would read as the ranks' step's shape */
    const char *base[] = {"PATH=/usr/bin", "SLURM_JOB_ID=12", "SLURM_JOB_NODELIST=node[1-2]",
                          "SLURM_CONF=/etc/slurm/slurm.conf", "SLURM_STEP_ID=0",
                          "SLURM_JOB_NAME=nb", "SLURM_CPUS_PER_TASK=2", "SRUN_CPUS_PER_TASK=2",
                          "SLURM_MEM_PER_NODE=921600", "SLURM_MEM_PER_CPU=4000",
                          "SLURM_NTASKS_PER_NODE=4", "SLURM_NTASKS=8", "SLURM_NPROCS=8",
                          "SLURM_DISTRIBUTION=cyclic", "SLURM_CPU_BIND=cores",
                          "SLURM_LABELIO=1", "SLURM_STDOUTMODE=out.%t", "SLURM_WAIT=5",
                          "SLURM_EXACT=1", "SLURM_GPUS_PER_TASK=1", "SLURM_TIMELIMIT=1",
                          "SLURM_MEM_PER_NODEX=keep", "MY_SLURM_MEM_PER_NODE=keep",
                          "DISTKERNEL_SLURM_RUN_NODES=old", NULL};
    const char *set[] = {"DISTKERNEL_SLURM_RUN_NODES=node1,node2"};
    char **env = dk_slurm_step_env(base, set, 1, NULL);
    cr_assert(env);
    const char *gone[] = {"SLURM_CPUS_PER_TASK", "SRUN_CPUS_PER_TASK", "SLURM_MEM_PER_NODE",
                          "SLURM_MEM_PER_CPU", "SLURM_NTASKS_PER_NODE", "SLURM_NTASKS",
                          "SLURM_NPROCS", "SLURM_DISTRIBUTION", "SLURM_CPU_BIND",
                          "SLURM_LABELIO", "SLURM_STDOUTMODE", "SLURM_WAIT", "SLURM_EXACT",
                          "SLURM_GPUS_PER_TASK", "SLURM_TIMELIMIT"};
    for (size_t i = 0; i < sizeof gone / sizeof gone[0]; i++)
        cr_expect_null(dk_spawn_env_get((const char *const *)env, gone[i]), "%s kept", gone[i]);
    const char *kept[][2] = {{"PATH", "/usr/bin"}, {"SLURM_JOB_ID", "12"},
                             {"SLURM_JOB_NODELIST", "node[1-2]"},
                             {"SLURM_CONF", "/etc/slurm/slurm.conf"}, {"SLURM_STEP_ID", "0"},
                             {"SLURM_JOB_NAME", "nb"}, {"SLURM_MEM_PER_NODEX", "keep"},
                             {"MY_SLURM_MEM_PER_NODE", "keep"},
                             {"DISTKERNEL_SLURM_RUN_NODES", "node1,node2"}};
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        const char *v = dk_spawn_env_get((const char *const *)env, kept[i][0]);
        cr_expect(v && strcmp(v, kept[i][1]) == 0, "%s=%s, want %s", kept[i][0],
                  v ? v : "(unset)", kept[i][1]);
    }
    size_t n = 0;
    while (env[n])
        n++;
    cr_expect_eq(n, 9);
    dk_spawn_env_free(env);
    cr_expect(dk_slurm_srun_input("SLURM_MEM_PER_NODE"));
    cr_expect(!dk_slurm_srun_input("SLURM_MEM_PER"));
    cr_expect(!dk_slurm_srun_input("") && !dk_slurm_srun_input("=1"));
}

static void expect_refused(const char *args, const char *option)
{
    char err[1024] = "";
    cr_expect_eq(dk_slurm_check_args(args, err, sizeof err), -1, "%s accepted", args);
    cr_expect(strstr(err, option), "%s: %s", args, err);
}

Test(slurm_text, extra_args_may_not_name_the_job_nor_shape_it)
{
    expect_refused("-J exp1", "may not set --job-name (-J), as '-J' does");
    expect_refused("-Jexp1", "--job-name");
    expect_refused("--job-name=exp1", "--job-name");
    expect_refused("--exclusive --job-name exp1", "--job-name");
    expect_refused("--job-n=exp1", "--job-name");         /* salloc's prefix */
    expect_refused("-N 2", "may not set --nodes (-N)");
    expect_refused("-N2", "--nodes");
    expect_refused("--nodes=1-3", "--nodes");
    expect_refused("-vN2", "--nodes");                    /* run together */
    expect_refused("-n 4", "may not set --ntasks (-n)");
    expect_refused("--ntasks=4", "--ntasks");
    expect_refused("--ntasks-per-node=2", "may not set --ntasks-per-node, as");
    expect_refused("--ntasks-per-n 2", "--ntasks-per-node");
    /* After an option that takes no argument, or one given with '=' or
     * attached, the next word is an option again. */
    expect_refused("--exclusive -N 2", "--nodes");
    expect_refused("--comment=x -N 2", "--nodes");
    expect_refused("-pdebug -N 2", "--nodes");
    expect_refused("-k -N 2", "--nodes");                 /* -k's argument is attached only */
    expect_refused("--ex -N 2", "--nodes");               /* ambiguous: salloc refuses it */
    expect_refused("--comment x -J y", "--job-name");
    char err[1024] = "";
    const char *fine[] = {"", "--exclusive --mem=0", "--ntasks-per-core=1", "--nodelist=n1",
                          "-pdebugN", "-w node1", "--comment='-J x'", "--gres=gpu:8",
                          /* an option's argument in the next word is not an option */
                          "--comment -N", "--comment -J", "--comm -n4", "-p -N", "--qos -J",
                          "-w -n", "--nodelist -N", NULL};
    for (int i = 0; fine[i]; i++)
        cr_expect_eq(dk_slurm_check_args(fine[i], err, sizeof err), 0, "%s: %s", fine[i], err);
    cr_expect_eq(dk_slurm_check_args("--comment='open", err, sizeof err), -1);
}

/* ---- slurm_fake ----------------------------------------------------------- */

static char fakedir[256];
static char logpath[300];

/* A folder on PATH holding sinfo, salloc, srun, squeue and scancel: each the
 * given script (NULL: exit 0), every call logged to fakedir/calls. */
static void fake_slurm(const char *sinfo, const char *salloc, const char *squeue)
{
    snprintf(fakedir, sizeof fakedir, "/tmp/dk-test-slurm-%d", (int) getpid());
    mkdir(fakedir, 0700);
    snprintf(logpath, sizeof logpath, "%s/calls", fakedir);
    unlink(logpath);
    const char *names[] = {"sinfo", "salloc", "srun", "squeue", "scancel"};
    const char *bodies[] = {sinfo, salloc, NULL, squeue, NULL};
    for (int i = 0; i < 5; i++) {
        char path[400];
        snprintf(path, sizeof path, "%s/%s", fakedir, names[i]);
        FILE *f = fopen(path, "w");
        cr_assert(f);
        fprintf(f, "#!/bin/sh\necho \"%s $*\" >> %s\n%s\n", names[i], logpath,
                bodies[i] ? bodies[i] : "exit 0");
        fclose(f);
        chmod(path, 0755);
    }
    char path[1024];
    snprintf(path, sizeof path, "%s:/usr/bin:/bin", fakedir);
    setenv("PATH", path, 1);
    unsetenv("SLURM_JOB_ID");
}

static char *calls(void)
{
    static char buf[4096];
    buf[0] = '\0';
    FILE *f = fopen(logpath, "r");
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

/* After each test, passed or failed (an assert ends the test before its end). */
static void remove_fakes(void)
{
    if (!fakedir[0])
        return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fakedir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", fakedir);
}

TestSuite(slurm_fake, .fini = remove_fakes);

/* A question to Slurm with a deadline of 5 s and no cancel. */
static const dk_slurm_query_t within_5s = {.timeout_s = 5};

Test(slurm_fake, missing_commands_are_named_with_what_to_set)
{
    setenv("PATH", "/nonexistent", 1);
    char err[1024] = "";
    cr_assert_eq(dk_slurm_reachable(&within_5s, err, sizeof err), -1);
    cr_expect(strstr(err, "sinfo, salloc, srun, squeue, scancel"), "%s", err);
    cr_expect(strstr(err, "PATH"), "%s", err);
}

Test(slurm_fake, a_failing_sinfo_is_quoted_and_points_at_slurm_conf)
{
    fake_slurm("echo 'sinfo: error: Could not establish a configuration source' >&2; exit 1",
               NULL, NULL);
    setenv("SLURM_CONF", "/dev/null", 1);
    char err[1024] = "";
    cr_assert_eq(dk_slurm_reachable(&within_5s, err, sizeof err), -1);
    cr_expect(strstr(err, "sinfo failed: sinfo: error: Could not establish a configuration "
                          "source"), "%s", err);
    cr_expect(strstr(err, "SLURM_CONF is '/dev/null'; set it to the cluster's slurm.conf"),
              "%s", err);
}

Test(slurm_fake, a_hung_sinfo_is_ended_at_its_deadline)
{
    fake_slurm("trap '' INT TERM; sleep 60", NULL, NULL);
    char err[1024] = "";
    double t0 = dk_now_s();
    cr_assert_eq(dk_slurm_reachable(&(dk_slurm_query_t){.timeout_s = 1}, err, sizeof err), -1);
    /* 1 s, then SIGINT, SIGTERM (both ignored) and SIGKILL 0.5 s apart */
    cr_expect_lt(dk_now_s() - t0, 10.0);
    cr_expect(strstr(err, "did not answer within 1 s"), "%s", err);
}

/* A sinfo that says nothing for a minute, and writes its pid (it execs
 * sleep, so the pid is the one dk_proc waits for) where the test reads it. */
#define SLOW_SINFO "echo $$ > \"$(dirname \"$0\")/sinfo.pid\"; exec sleep 60"

/* The caller's cancel: true once the slow sinfo runs (an interrupt then). */
static bool once_sinfo_runs(void *data)
{
    char path[600];
    snprintf(path, sizeof path, "%s/sinfo.pid", fakedir);
    (*(int *) data)++;
    return access(path, F_OK) == 0;
}

static pid_t sinfo_pid(void)
{
    char path[600];
    snprintf(path, sizeof path, "%s/sinfo.pid", fakedir);
    FILE *f = fopen(path, "r");
    int pid = 0;
    cr_assert(f && fscanf(f, "%d", &pid) == 1, "no pid in %s", path);
    fclose(f);
    unlink(path);
    return pid;
}

/* An interrupt during a question before a run (is Slurm there, its nodes'
 * GPUs and CPUs) ends sinfo at once, not at its deadline, and leaves no
 * process: the question fails saying it was cancelled. */
Test(slurm_fake, a_cancelled_question_ends_sinfo_at_once, .timeout = 60)
{
    fake_slurm(SLOW_SINFO, NULL, NULL);
    for (int which = 0; which < 3; which++) {
        int asked = 0, gpus = 0, cpus = 0;
        char gres[64], err[1024] = "";
        dk_slurm_query_t query = {.timeout_s = 30, .cancelled = once_sinfo_runs, .data = &asked};
        double t0 = dk_now_s();
        int rc = which == 0 ? dk_slurm_reachable(&query, err, sizeof err)
                 : which == 1 ? dk_slurm_gpus_per_node(NULL, NULL, &query, NULL, &gpus, gres,
                                                       sizeof gres, NULL, 0, err, sizeof err)
                              : dk_slurm_cpus_per_node(NULL, &query, &cpus, err, sizeof err);
        double took = dk_now_s() - t0;
        cr_assert_eq(rc, -1, "question %d", which);
        cr_expect_gt(asked, 0);
        /* Ended by the cancel, not at its 30 s deadline: half of it tells
         * the two apart on a loaded machine. */
        cr_expect_lt(took, 15.0, "question %d took %.1f s", which, took);
        cr_expect(strstr(err, "Slurm's sinfo was cancelled before it answered"), "%d: %s", which,
                  err);
        pid_t pid = sinfo_pid();
        cr_expect(kill(pid, 0) == -1 && errno == ESRCH, "sinfo %d is still there", (int) pid);
    }
}

Test(slurm_fake, a_salloc_that_hangs_silently_is_ended_and_its_job_cancelled_by_name)
{
    fake_slurm(NULL, "trap '' INT TERM; sleep 60", NULL);
    dk_slurm_request_t req = {.nodes = 2, .tasks_per_node = 2, .command_timeout_s = 1};
    char err[1024] = "";
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    cr_expect(strstr(err, "salloc did not answer"), "%s", err);
    char *log = calls();
    cr_expect(strstr(log, "scancel --name=distkernel-"), "%s", log);
    /* the name cancelled is the name asked for */
    const char *asked = strstr(log, "--job-name=");
    const char *cancelled = strstr(log, "scancel --name=");
    cr_assert(asked && cancelled);
    cr_expect_eq(strncmp(asked + 11, cancelled + 15, 23), 0, "%s", log);
}

Test(slurm_fake, a_request_cancelled_while_queued_is_cancelled_by_id)
{
    fake_slurm(NULL, "echo 'salloc: Pending job allocation 4242' >&2; sleep 60",
               "echo '4242|PENDING|Priority|'");
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .wait_s = 1.5};
    char err[1024] = "";
    int why = 0;
    cr_assert_null(dk_slurm_allocate(&req, &why, err, sizeof err));
    cr_expect_eq(why, 2);
    cr_expect(strstr(err, "4242") && strstr(err, "PENDING: Priority"), "%s", err);
    cr_expect(strstr(calls(), "scancel 4242"), "%s", calls());
}

Test(slurm_fake, options_and_extra_args_reach_salloc)
{
    fake_slurm(NULL, "echo 'salloc: error: no' >&2; exit 1", NULL);
    dk_slurm_request_t req = {.nodes = 3, .tasks_per_node = 4, .partition = "gpu",
                              .account = "proj1", .qos = "high", .constraint = "h100",
                              .time_limit_s = 90, .extra_args = "--exclusive --comment='a b'"};
    char err[1024] = "";
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    cr_expect(strstr(err, "salloc could not allocate 3 nodes: salloc: error: no"), "%s", err);
    char *log = calls();
    cr_expect(strstr(log, "--no-shell --job-name=distkernel-"), "%s", log);
    cr_expect(strstr(log, " --nodes=3 --ntasks-per-node=4 --partition=gpu --account=proj1 "
                          "--qos=high --constraint=h100 --time=1:30 --exclusive --comment=a b\n"),
              "%s", log);
}

Test(slurm_fake, the_longest_time_is_the_partitions_and_extra_args_still_win)
{
    fake_slurm("echo 'sim* 1:00:00'; echo 'gpu 3-00:00:00'",
               "echo 'salloc: error: no' >&2; exit 1", NULL);
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .partition = "gpu",
                              .longest_time = true, .extra_args = "--time=5:00"};
    char err[1024] = "";
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    char *log = calls();
    cr_expect(strstr(log, "sinfo -h -o %P %l\n"), "%s", log);
    cr_expect(strstr(log, " --partition=gpu --time=3-00:00:00 --time=5:00\n"), "%s", log);

    /* No partition named: the default's. */
    fake_slurm("echo 'sim* 1:00:00'; echo 'gpu 3-00:00:00'",
               "echo 'salloc: error: no' >&2; exit 1", NULL);
    dk_slurm_request_t dflt = {.nodes = 1, .tasks_per_node = 1, .longest_time = true};
    cr_assert_null(dk_slurm_allocate(&dflt, NULL, err, sizeof err));
    log = calls();
    cr_expect(strstr(log, " --ntasks-per-node=1 --time=1:00:00\n"), "%s", log);
}

Test(slurm_fake, gpus_per_node_reach_salloc_and_none_for_cpu_ranks)
{
    fake_slurm(NULL, "echo 'salloc: error: no' >&2; exit 1", NULL);
    dk_slurm_request_t req = {.nodes = 2, .tasks_per_node = 8, .gpus_per_node = 8};
    char err[1024] = "";
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    cr_expect(strstr(calls(), " --nodes=2 --ntasks-per-node=8 --gpus-per-node=8\n"), "%s",
              calls());
    fake_slurm(NULL, "echo 'salloc: error: no' >&2; exit 1", NULL);
    req.gpus_per_node = 0;
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    cr_expect(strstr(calls(), " --ntasks-per-node=8\n"), "%s", calls());
    cr_expect_not(strstr(calls(), "gpu"), "%s", calls());
    /* a GRES type: the nodes that have it */
    fake_slurm(NULL, "echo 'salloc: error: no' >&2; exit 1", NULL);
    req.gpus_per_node = 4;
    req.gpu_type = "h100";
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    cr_expect(strstr(calls(), " --ntasks-per-node=8 --gpus-per-node=h100:4\n"), "%s", calls());
}

Test(slurm_fake, gpus_per_node_of_a_model_count_the_nodes_of_its_type)
{
    fake_slurm("echo 'gpu*|gpu:a100:8(S:0-1)'; echo 'gpu*|gpu:h100:4(S:0)'", NULL, NULL);
    int gpus = -1;
    char gres[64] = "", type[32] = "x", err[1024] = "";
    cr_assert_eq(dk_slurm_gpus_per_node(NULL, NULL, &within_5s,
                                        "H100", &gpus, gres, sizeof gres, type, sizeof type, err,
                                        sizeof err), 0, "%s", err);
    cr_expect_eq(gpus, 4);
    cr_expect_str_eq(gres, "gpu:h100:4(S:0)");
    cr_expect_str_eq(type, "h100");
    /* a model no node has: every GPU counts, no type */
    cr_assert_eq(dk_slurm_gpus_per_node(NULL, NULL, &within_5s,
                                        "B300", &gpus, gres, sizeof gres, type, sizeof type, err,
                                        sizeof err), 0, "%s", err);
    cr_expect_eq(gpus, 8);
    cr_expect_str_eq(gres, "gpu:a100:8(S:0-1)");
    cr_expect_str_eq(type, "");
}

Test(slurm_fake, gpus_per_node_come_from_sinfo_for_the_partition_or_the_allocation)
{
    fake_slurm("echo 'cpu*|(null)'; echo 'gpu|gpu:h100:8(S:0-1)'", NULL, NULL);
    int gpus = -1;
    char gres[64] = "", err[1024] = "";
    cr_assert_eq(dk_slurm_gpus_per_node("gpu", NULL, &within_5s,
                                        NULL, &gpus, gres, sizeof gres, NULL, 0, err, sizeof err),
                 0, "%s", err);
    cr_expect_eq(gpus, 8);
    cr_expect_str_eq(gres, "gpu:h100:8(S:0-1)");
    cr_expect(strstr(calls(), "sinfo -h -o %P|%G\n"), "%s", calls());
    cr_assert_eq(dk_slurm_gpus_per_node(NULL, NULL, &within_5s,
                                        NULL, &gpus, gres, sizeof gres, NULL, 0, err, sizeof err),
                 0, "%s", err);
    cr_expect_eq(gpus, 0);
    cr_assert_eq(dk_slurm_gpus_per_node("nope", NULL, &within_5s,
                                        NULL, &gpus, gres, sizeof gres, NULL, 0, err, sizeof err),
                 -1);
    cr_expect(strstr(err, "Slurm has no partition 'nope'"), "%s", err);
    /* inside an allocation: its nodes, whatever their partition */
    cr_assert_eq(dk_slurm_gpus_per_node(NULL, "n[1-2]", &within_5s,
                                        NULL, &gpus, gres, sizeof gres, NULL, 0, err, sizeof err),
                 0, "%s", err);
    cr_expect_eq(gpus, 8);
    cr_expect(strstr(calls(), "sinfo -h -o %P|%G -n n[1-2]\n"), "%s", calls());
}

Test(slurm_fake, a_failing_sinfo_for_the_gpus_is_quoted)
{
    fake_slurm("echo 'sinfo: error: slurm_load_partitions: Unable to contact slurm "
               "controller' >&2; exit 1", NULL, NULL);
    int gpus = -1;
    char gres[64] = "", err[1024] = "";
    cr_assert_eq(dk_slurm_gpus_per_node(NULL, NULL, &within_5s,
                                        NULL, &gpus, gres, sizeof gres, NULL, 0, err, sizeof err),
                 -1);
    cr_expect(strstr(err, "sinfo could not say the nodes' GPUs: sinfo: error: "
                          "slurm_load_partitions"), "%s", err);
}

Test(slurm_fake, salloc_never_gets_a_job_name_or_shape_from_extra_args)
{
    fake_slurm(NULL, "echo 'salloc: Granted job allocation 7' >&2", NULL);
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .extra_args = "-J mine"};
    char err[1024] = "";
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    cr_expect(strstr(err, "may not set --job-name"), "%s", err);
    cr_expect_null(strstr(calls(), "salloc"), "%s", calls());
}

Test(slurm_fake, a_wished_time_limit_is_clamped_to_the_partitions_max_time)
{
    const char *sinfo = "echo 'sim* infinite'; echo 'debug 30:00'";
    fake_slurm(sinfo, "echo 'salloc: error: no' >&2; exit 1", NULL);
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .partition = "debug",
                              .time_limit_s = 11100, .clamp_time = true};
    char err[1024] = "";
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    cr_expect(strstr(calls(), " --partition=debug --time=30:00\n"), "%s", calls());

    /* under the MaxTime, or on a partition without one: the wish stands */
    fake_slurm(sinfo, "echo 'salloc: error: no' >&2; exit 1", NULL);
    req.time_limit_s = 600;
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    cr_expect(strstr(calls(), " --time=10:00\n"), "%s", calls());
    fake_slurm(sinfo, "echo 'salloc: error: no' >&2; exit 1", NULL);
    req.partition = NULL;
    req.time_limit_s = 11100;
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    cr_expect(strstr(calls(), " --time=185:00\n"), "%s", calls());

    /* a limit the user gave is not clamped */
    fake_slurm(sinfo, "echo 'salloc: error: no' >&2; exit 1", NULL);
    dk_slurm_request_t given = {.nodes = 1, .tasks_per_node = 1, .partition = "debug",
                                .time_limit_s = 11100};
    cr_assert_null(dk_slurm_allocate(&given, NULL, err, sizeof err));
    cr_expect(strstr(calls(), " --partition=debug --time=185:00\n"), "%s", calls());
    cr_expect_null(strstr(calls(), "sinfo"), "%s", calls());
}

Test(slurm_fake, a_request_over_a_time_limit_fails_at_once_and_is_cancelled)
{
    fake_slurm(NULL, "echo 'salloc: Pending job allocation 77' >&2; sleep 30",
               "echo '77|PENDING|PartitionTimeLimit|'");
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .time_limit_s = 3600,
                              .wait_s = 60};
    char err[1024] = "";
    int why = 0;
    double t0 = dk_now_s();
    cr_assert_null(dk_slurm_allocate(&req, &why, err, sizeof err));
    cr_expect_lt(dk_now_s() - t0, 20.0);
    cr_expect_eq(why, 3);
    cr_expect(strstr(err, "Slurm will not run job 77: its time limit (60:00) is over a limit "
                          "of the partition (PENDING: PartitionTimeLimit)"), "%s", err);
    cr_expect(strstr(calls(), "scancel 77"), "%s", calls());
}

/* squeue that says CONFIGURING to its first N calls, then RUNNING on node1
 * (or CONFIGURING for ever when N is 0). */
static void configuring_squeue(int n)
{
    char squeue[512];
    fake_slurm(NULL, NULL, NULL);       /* fakedir, for the script's count */
    if (n)
        snprintf(squeue, sizeof squeue,
                 "c=$(grep -c '^squeue' %s/calls); if [ \"$c\" -le %d ]; then "
                 "echo '55|CONFIGURING|None|node1'; else echo '55|RUNNING|None|node1'; fi",
                 fakedir, n);
    else
        snprintf(squeue, sizeof squeue, "echo '55|CONFIGURING|None|node1'");
    fake_slurm("echo 'node1|10.9.9.1'", "echo 'salloc: Granted job allocation 55' >&2", squeue);
}

static char states_seen[256];

static void note_wait(void *data, const char *id, const char *state, const char *reason)
{
    (void) data, (void) id, (void) reason;
    strncat(states_seen, state, sizeof states_seen - strlen(states_seen) - 2);
    strcat(states_seen, " ");
}

Test(slurm_fake, a_job_configuring_once_granted_is_waited_for_until_running)
{
    configuring_squeue(2);
    states_seen[0] = '\0';
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .wait_s = 60,
                              .on_wait = note_wait};
    char err[1024] = "";
    dk_slurm_t *job = dk_slurm_allocate(&req, NULL, err, sizeof err);
    cr_assert_not_null(job, "%s", err);
    cr_expect_str_eq(dk_slurm_job_id(job), "55");
    cr_assert_eq(dk_slurm_node_count(job), 1);
    cr_expect_str_eq(dk_slurm_node_addr(job, 0), "10.9.9.1");
    cr_expect(strstr(states_seen, "CONFIGURING "), "%s", states_seen);
    dk_slurm_destroy(&job);
    cr_expect(strstr(calls(), "scancel 55"), "%s", calls());
}

Test(slurm_fake, a_job_configuring_for_ever_ends_with_the_wait)
{
    configuring_squeue(0);
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .wait_s = 1.5};
    char err[1024] = "";
    int why = 0;
    cr_assert_null(dk_slurm_allocate(&req, &why, err, sizeof err));
    cr_expect_eq(why, 2);
    cr_expect(strstr(err, "did not grant the request 55 within 2 s (CONFIGURING: None)"), "%s",
              err);
    cr_expect(strstr(calls(), "scancel 55"), "%s", calls());
}

/* What is left of the job's time limit: squeue's %L, in seconds; -1 for
 * a job without a limit. (A run's or a cell's timeout is cut to it; end to
 * end, a 1-minute allocation takes that path in the default build's e2e.) */
static void write_left(const char *text)
{
    char path[400];
    snprintf(path, sizeof path, "%s/left", fakedir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "%s\n", text);
    fclose(f);
}

Test(slurm_fake, the_time_left_of_the_job_is_read_in_seconds)
{
    fake_slurm(NULL, NULL, NULL);       /* fakedir, for the script's file */
    char squeue[600];
    snprintf(squeue, sizeof squeue,
             "case \"$*\" in *%%L*) cat %s/left ;; *) echo '55|RUNNING|None|node1' ;; esac",
             fakedir);
    fake_slurm("echo 'node1|10.9.9.1'", "echo 'salloc: Granted job allocation 55' >&2", squeue);
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .wait_s = 60};
    char err[1024] = "";
    dk_slurm_t *job = dk_slurm_allocate(&req, NULL, err, sizeof err);
    cr_assert_not_null(job, "%s", err);
    long left = 0;
    write_left("1:05");
    cr_expect_eq(dk_slurm_time_left(job, &left, err, sizeof err), 0, "%s", err);
    cr_expect_eq(left, 65);
    write_left("1-02:00:00");
    cr_expect_eq(dk_slurm_time_left(job, &left, err, sizeof err), 0, "%s", err);
    cr_expect_eq(left, 26 * 3600);
    write_left("UNLIMITED");
    cr_expect_eq(dk_slurm_time_left(job, &left, err, sizeof err), 0, "%s", err);
    cr_expect_eq(left, -1);
    cr_expect(strstr(calls(), "squeue -h -j 55 -o %L"), "%s", calls());
    dk_slurm_destroy(&job);
}

Test(slurm_fake, a_long_banner_before_the_job_id_does_not_hide_it)
{
    /* 3000 bytes of a site's banner, then the id, in one write */
    fake_slurm(NULL, "{ i=0; while [ $i -lt 60 ]; do printf '%049d\\n' $i; i=$((i+1)); done; "
               "echo 'salloc: Pending job allocation 4243'; } >&2; sleep 30",
               "echo '4243|PENDING|Priority|'");
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .wait_s = 1.5,
                              .command_timeout_s = 5};
    char err[1024] = "";
    int why = 0;
    cr_assert_null(dk_slurm_allocate(&req, &why, err, sizeof err));
    cr_expect_eq(why, 2, "%s", err);
    cr_expect(strstr(err, "did not grant the request 4243 within 2 s (PENDING: Priority)"),
              "%s", err);
    cr_expect(strstr(calls(), "scancel 4243"), "%s", calls());
}

static int polls;

static void count_polls(void *data, const char *id, const char *state, const char *reason)
{
    (void) data, (void) id, (void) state, (void) reason;
    polls++;
}

Test(slurm_fake, a_queued_request_is_reported_at_each_poll_not_only_on_a_change)
{
    fake_slurm(NULL, "echo 'salloc: Pending job allocation 4244' >&2; sleep 30",
               "echo '4244|PENDING|Priority|'");
    polls = 0;
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .wait_s = 3.5,
                              .on_wait = count_polls};
    char err[1024] = "";
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    cr_expect_geq(polls, 2, "%d reports in 3.5 s of the same state", polls);
}

static int id_fd = -1;

static void tell_id(void *data, const char *id, const char *state, const char *reason)
{
    (void) data, (void) state, (void) reason;
    if (id_fd >= 0) {
        dprintf(id_fd, "%s\n", id);
        close(id_fd);
        id_fd = -1;
    }
}

Test(slurm_fake, once_the_id_is_known_a_killed_owner_cancels_by_id)
{
    fake_slurm(NULL, "echo 'salloc: Pending job allocation 4242' >&2; sleep 30",
               "echo '4242|PENDING|Priority|'");
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t h = fork();
    cr_assert_geq(h, 0);
    if (h == 0) {
        close(p[0]);
        id_fd = p[1];
        dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .on_wait = tell_id};
        char err[1024];
        dk_slurm_allocate(&req, NULL, err, sizeof err);
        _exit(3);
    }
    close(p[1]);
    char id[32] = "";
    FILE *f = fdopen(p[0], "r");
    cr_assert(f);
    bool got = fgets(id, sizeof id, f) != NULL;
    fclose(f);
    kill(h, SIGKILL);
    waitpid(h, NULL, 0);
    cr_assert(got, "the owner said no id");
    /* After the last word's grace (3 s: the node agents' head start). */
    bool by_id = false;
    for (int i = 0; i < 200 && !by_id; i++) {
        by_id = strstr(calls(), "scancel 4242\n") != NULL;
        usleep(50000);
    }
    cr_expect(by_id, "%s", calls());
    cr_expect_null(strstr(calls(), "scancel --name"), "%s", calls());
}

/* ---- slurm_cluster -------------------------------------------------------- */

static void need_cluster(void)
{
    const char *conf = getenv("DISTKERNEL_TEST_SLURM_CONF");
    if (!conf || !conf[0]) {
        const char *why = getenv("DISTKERNEL_TEST_SLURM_SKIP");
        cr_skip_test("no test cluster: %s", why ? why : "run through tests/slurm/with_cluster.sh "
                     "(meson test does)");
    }
    setenv("SLURM_CONF", conf, 1);
    unsetenv("SLURM_JOB_ID");
    unsetenv("SLURM_JOB_NODELIST");
}

/* The job's state as squeue says it now ("" when Slurm no longer lists it). */
static char *squeue_state(const char *id)
{
    static char state[64];
    char cmd[256];
    snprintf(cmd, sizeof cmd, "squeue -h -j %s -o %%T 2>/dev/null", id);
    FILE *p = popen(cmd, "r");
    state[0] = '\0';
    if (p) {
        if (!fgets(state, sizeof state, p))
            state[0] = '\0';
        pclose(p);
    }
    state[strcspn(state, "\n")] = '\0';
    return state;
}

/* Whether the job is gone or going (nothing of it will run any more). */
static bool ended(const char *id)
{
    for (int i = 0; i < 100; i++) {
        const char *s = squeue_state(id);
        if (!s[0] || strcmp(s, "CANCELLED") == 0 || strcmp(s, "COMPLETED") == 0)
            return true;
        usleep(50000);
    }
    return false;
}

Test(slurm_cluster, reachable_when_sinfo_answers)
{
    need_cluster();
    char err[1024] = "";
    cr_expect_eq(dk_slurm_reachable(NULL, err, sizeof err), 0, "%s", err);
}

Test(slurm_cluster, a_wrong_slurm_conf_is_unreachable_and_says_so)
{
    need_cluster();
    setenv("SLURM_CONF", "/nowhere/slurm.conf", 1);
    char err[1024] = "";
    cr_assert_eq(dk_slurm_reachable(NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "Slurm is not reachable from here: SLURM_CONF is "
                          "'/nowhere/slurm.conf', which cannot be read"), "%s", err);
}

Test(slurm_cluster, without_a_configuration_sinfo_is_quoted)
{
    need_cluster();
    unsetenv("SLURM_CONF");
    if (access("/etc/slurm/slurm.conf", F_OK) == 0)
        cr_skip_test("this machine has a Slurm configuration of its own");
    char err[1024] = "";
    cr_assert_eq(dk_slurm_reachable(NULL, err, sizeof err), -1);
    cr_expect(strstr(err, "sinfo failed: "), "%s", err);
    cr_expect(strstr(err, "Could not establish a configuration source"), "%s", err);
    cr_expect(strstr(err, "SLURM_CONF is not set"), "%s", err);
}

Test(slurm_cluster, an_allocation_has_its_nodes_and_addresses_and_release_ends_it)
{
    need_cluster();
    dk_slurm_request_t req = {.nodes = 2, .tasks_per_node = 2, .time_limit_s = 600};
    char err[1024] = "", state[32], reason[128];
    dk_slurm_t *job = dk_slurm_allocate(&req, NULL, err, sizeof err);
    cr_assert_not_null(job, "%s", err);
    cr_expect(dk_slurm_owned(job));
    char id[32];
    snprintf(id, sizeof id, "%s", dk_slurm_job_id(job));
    cr_assert_eq(dk_slurm_node_count(job), 2);
    cr_expect_str_eq(dk_slurm_node_name(job, 0), "node1");
    cr_expect_str_eq(dk_slurm_node_name(job, 1), "node2");
    cr_expect(strncmp(dk_slurm_node_addr(job, 0), "10.", 3) == 0 &&
              strcmp(strrchr(dk_slurm_node_addr(job, 0), '.'), ".11") == 0,
              "%s", dk_slurm_node_addr(job, 0));
    cr_expect(strcmp(strrchr(dk_slurm_node_addr(job, 1), '.'), ".12") == 0);
    cr_assert_eq(dk_slurm_state(job, state, sizeof state, reason, sizeof reason, err,
                                sizeof err), 0, "%s", err);
    cr_expect_str_eq(state, "RUNNING");
    cr_expect_eq(dk_slurm_release(job, err, sizeof err), 0, "%s", err);
    cr_expect(ended(id), "job %s is %s after release", id, squeue_state(id));
    dk_slurm_destroy(&job);
    cr_expect_null(job);
}

Test(slurm_cluster, destroy_without_release_cancels_the_job)
{
    need_cluster();
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1};
    char err[1024] = "", id[32];
    dk_slurm_t *job = dk_slurm_allocate(&req, NULL, err, sizeof err);
    cr_assert_not_null(job, "%s", err);
    snprintf(id, sizeof id, "%s", dk_slurm_job_id(job));
    cr_expect_str_eq(squeue_state(id), "RUNNING");
    dk_slurm_destroy(&job);
    cr_expect(ended(id), "job %s is %s", id, squeue_state(id));
}

static int waits;
static char seen_state[32], seen_reason[128], seen_id[32];

static void on_wait(void *data, const char *id, const char *state, const char *reason)
{
    waits++;
    snprintf(seen_id, sizeof seen_id, "%s", id);
    snprintf(seen_state, sizeof seen_state, "%s", state);
    snprintf(seen_reason, sizeof seen_reason, "%s", reason);
}

static bool cancel_once_seen(void *data)
{
    return waits > 0;
}

Test(slurm_cluster, a_queued_request_reports_state_and_reason_and_its_wait_limit_cancels_it)
{
    need_cluster();
    waits = 0;
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .partition = "stuck",
                              .wait_s = 3, .on_wait = on_wait};
    char err[1024] = "";
    int why = 0;
    cr_assert_null(dk_slurm_allocate(&req, &why, err, sizeof err));
    cr_expect_eq(why, 2);
    cr_expect_gt(waits, 0);
    cr_expect_str_eq(seen_state, "PENDING");
    cr_expect_str_eq(seen_reason, "PartitionDown");
    cr_expect(strstr(err, "within 3 s (PENDING: PartitionDown)"), "%s", err);
    cr_expect(ended(seen_id), "job %s is %s", seen_id, squeue_state(seen_id));
}

Test(slurm_cluster, cancelling_a_queued_request_leaves_no_job)
{
    need_cluster();
    waits = 0;
    dk_slurm_request_t req = {.nodes = 2, .tasks_per_node = 1, .partition = "stuck",
                              .on_wait = on_wait, .cancelled = cancel_once_seen};
    char err[1024] = "";
    int why = 0;
    double t0 = dk_now_s();
    cr_assert_null(dk_slurm_allocate(&req, &why, err, sizeof err));
    cr_expect_eq(why, 1);
    cr_expect_lt(dk_now_s() - t0, 20.0);
    cr_expect(strstr(err, "cancelled while PENDING: PartitionDown"), "%s", err);
    cr_expect(ended(seen_id), "job %s is %s", seen_id, squeue_state(seen_id));
}

/* The host below says its job's id once, queued or granted. */
static int said_fd = -1;

static void say_id(void *data, const char *id, const char *state, const char *reason)
{
    (void) data, (void) state, (void) reason;
    if (said_fd >= 0 && id[0]) {
        dprintf(said_fd, "%s\n", id);
        close(said_fd);
        said_fd = -1;
    }
}

/* A host process asks for an allocation on PARTITION, says the job's id
 * (while queued, or once granted) and is SIGKILLed by the test, as a kernel
 * killed outright would be: the job must end all the same. */
static void killed_host_leaves_no_job(const char *partition, const char *state)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t h = fork();
    cr_assert_geq(h, 0);
    if (h == 0) {
        close(p[0]);
        said_fd = p[1];
        dk_slurm_request_t req = {.nodes = 2, .tasks_per_node = 1, .partition = partition,
                                  .on_wait = say_id};
        char err[1024] = "";
        dk_slurm_t *job = dk_slurm_allocate(&req, NULL, err, sizeof err);
        if (!job)
            _exit(3);
        say_id(NULL, dk_slurm_job_id(job), "", "");
        pause();
        _exit(4);
    }
    close(p[1]);
    char id[32] = "";
    FILE *f = fdopen(p[0], "r");
    cr_assert(f);
    bool got = fgets(id, sizeof id, f) != NULL;
    fclose(f);
    id[strcspn(id, "\n")] = '\0';
    if (!got || !id[0]) {
        kill(h, SIGKILL);
        waitpid(h, NULL, 0);
        cr_assert_fail("the host said no job id");
    }
    cr_expect_str_eq(squeue_state(id), state);
    kill(h, SIGKILL);
    waitpid(h, NULL, 0);
    cr_expect(ended(id), "job %s is %s after its owner was SIGKILLed", id, squeue_state(id));
}

Test(slurm_cluster, an_owner_killed_outright_leaves_no_running_job)
{
    need_cluster();
    killed_host_leaves_no_job("sim", "RUNNING");
}

Test(slurm_cluster, an_owner_killed_while_queued_leaves_no_queued_job)
{
    need_cluster();
    killed_host_leaves_no_job("stuck", "PENDING");
}

Test(slurm_cluster, slurms_refusal_is_quoted)
{
    need_cluster();
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .partition = "nosuch"};
    char err[1024] = "";
    cr_assert_null(dk_slurm_allocate(&req, NULL, err, sizeof err));
    cr_expect(strstr(err, "salloc could not allocate 1 node: "), "%s", err);
    cr_expect(strstr(err, "Invalid partition name specified"), "%s", err);
}

Test(slurm_cluster, extra_args_and_time_limit_reach_the_job)
{
    need_cluster();
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .time_limit_s = 120,
                              .extra_args = "--comment='from a test'"};
    char err[1024] = "", cmd[256], line[256] = "";
    dk_slurm_t *job = dk_slurm_allocate(&req, NULL, err, sizeof err);
    cr_assert_not_null(job, "%s", err);
    snprintf(cmd, sizeof cmd, "squeue -h -j %s -o '%%k|%%l'", dk_slurm_job_id(job));
    FILE *p = popen(cmd, "r");
    cr_assert(p && fgets(line, sizeof line, p));
    pclose(p);
    cr_expect_str_eq(line, "from a test|2:00\n");
    dk_slurm_destroy(&job);
}

Test(slurm_cluster, the_longest_time_is_the_partitions_max_time)
{
    need_cluster();
    dk_slurm_request_t req = {.nodes = 1, .tasks_per_node = 1, .longest_time = true};
    char err[1024] = "", cmd[256], line[256] = "";
    dk_slurm_t *job = dk_slurm_allocate(&req, NULL, err, sizeof err);
    cr_assert_not_null(job, "%s", err);
    cr_expect_str_eq(dk_slurm_time_limit(job), "infinite");    /* sim: MaxTime=INFINITE */
    snprintf(cmd, sizeof cmd, "squeue -h -j %s -o '%%l'", dk_slurm_job_id(job));
    FILE *p = popen(cmd, "r");
    cr_assert(p && fgets(line, sizeof line, p));
    pclose(p);
    cr_expect_str_eq(line, "UNLIMITED\n");
    dk_slurm_destroy(&job);
}

Test(slurm_cluster, inside_an_allocation_it_is_used_and_never_cancelled)
{
    need_cluster();
    dk_slurm_request_t req = {.nodes = 2, .tasks_per_node = 1};
    char err[1024] = "", id[32];
    dk_slurm_t *outer = dk_slurm_allocate(&req, NULL, err, sizeof err);
    cr_assert_not_null(outer, "%s", err);
    snprintf(id, sizeof id, "%s", dk_slurm_job_id(outer));
    setenv("SLURM_JOB_ID", id, 1);
    setenv("SLURM_JOB_NODELIST", "node[1-2]", 1);
    dk_slurm_t *inner = dk_slurm_allocate(&req, NULL, err, sizeof err);
    cr_assert_not_null(inner, "%s", err);
    cr_expect_not(dk_slurm_owned(inner));
    cr_expect_str_eq(dk_slurm_job_id(inner), id);
    cr_assert_eq(dk_slurm_node_count(inner), 2);
    cr_expect_str_eq(dk_slurm_node_name(inner, 1), "node2");
    cr_expect_neq(strcmp(dk_slurm_node_addr(inner, 1), "node2"), 0);
    dk_slurm_destroy(&inner);
    cr_expect_str_eq(squeue_state(id), "RUNNING");

    dk_slurm_request_t three = {.nodes = 3, .tasks_per_node = 1};
    cr_assert_null(dk_slurm_allocate(&three, NULL, err, sizeof err));
    cr_expect(strstr(err, "needs 3 nodes but this kernel runs inside Slurm job"), "%s", err);
    cr_expect_str_eq(squeue_state(id), "RUNNING");
    unsetenv("SLURM_JOB_ID");
    dk_slurm_destroy(&outer);
    cr_expect(ended(id));
}

Test(slurm_text, variables_that_name_secrets_are_known_by_their_names)
{
    const char *secret[] = {"JUPYTERHUB_API_TOKEN=x", "MLFLOW_TRACKING_TOKEN=x",
                            "MLFLOW_TRACKING_PASSWORD=x", "AWS_SECRET_ACCESS_KEY=x",
                            "WANDB_API_KEY=x", "HF_TOKEN", "db_passwd=x", "github_token=x",
                            "MY_SECRET_THING=x", "OPENAI_API_KEY="};
    for (size_t i = 0; i < sizeof secret / sizeof secret[0]; i++)
        cr_expect(dk_slurm_secret_name(secret[i]), "%s not taken for a secret", secret[i]);
    const char *plain[] = {"PATH=/usr/bin", "MLFLOW_TRACKING_URI=http://h",
                           "MLFLOW_TRACKING_USERNAME=ann", "SSH_AUTH_SOCK=/tmp/s",
                           "KEYBOARD=us", "MY_KEYS=x", "AWS_ACCESS_KEY_ID=AKIA", "TOKENIZERS_PARALLELISM=false",
                           "VALUE=my_token"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        cr_expect_not(dk_slurm_secret_name(plain[i]), "%s taken for a secret", plain[i]);
}

Test(slurm_text, a_url_with_a_password_is_a_secret_whatever_its_name)
{
    const char *secret[] = {"MLFLOW_TRACKING_URI=https://ann:pw@mlflow.example:5000/",
                            "DATABASE_URL=postgres://u:p@db/x", "X=a,http://u:p@h",
                            "HF_TOKEN=plain", "Y=https://u:p%40x@h?q=1"};
    for (size_t i = 0; i < sizeof secret / sizeof secret[0]; i++)
        cr_expect(dk_slurm_secret(secret[i]), "%s not taken for a secret", secret[i]);
    const char *plain[] = {"MLFLOW_TRACKING_URI=http://mlflow.example:5000",
                           "MLFLOW_TRACKING_URI=https://ann@mlflow.example/",
                           "U=https://h/path:with@colon", "V=https://u:@h/", "W=user:pw@host",
                           "PATH=/usr/bin", "NO_VALUE"};
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        cr_expect_not(dk_slurm_secret(plain[i]), "%s taken for a secret", plain[i]);
    const char *base[] = {"MLFLOW_TRACKING_URI=https://ann:pw@m/", "KEEP=1", NULL};
    char **env = dk_slurm_step_env(base, NULL, 0, "");
    cr_assert_not_null(env);
    cr_expect_str_eq(env[0], "KEEP=1");
    cr_expect_null(env[1], "a URL with a password reached the step: %s", env[1]);
    dk_spawn_env_free(env);
    env = dk_slurm_step_env(base, NULL, 0, "MLFLOW_TRACKING_URI");
    cr_expect(env && env[1], "a listed variable was kept back");
    dk_spawn_env_free(env);
}

Test(slurm_text, a_steps_environment_has_no_secret_unless_it_is_listed)
{
    const char *base[] = {"PATH=/usr/bin", "JUPYTERHUB_API_TOKEN=hub",
                          "MLFLOW_TRACKING_TOKEN=ml", "AWS_SECRET_ACCESS_KEY=aws",
                          "WANDB_API_KEY=wandb", "HF_TOKEN=hf", NULL};
    const char *set[] = {"DISTKERNEL_BC_KEY=the-runs-own"};
    char **env = dk_slurm_step_env(base, set, 1, "WANDB_API_KEY,HF_TOKEN");
    cr_assert(env);
    const char *const *e = (const char *const *)env;
    cr_expect_null(dk_spawn_env_get(e, "JUPYTERHUB_API_TOKEN"));
    cr_expect_null(dk_spawn_env_get(e, "MLFLOW_TRACKING_TOKEN"));
    cr_expect_null(dk_spawn_env_get(e, "AWS_SECRET_ACCESS_KEY"));
    cr_expect_str_eq(dk_spawn_env_get(e, "WANDB_API_KEY"), "wandb");
    cr_expect_str_eq(dk_spawn_env_get(e, "HF_TOKEN"), "hf");
    cr_expect_str_eq(dk_spawn_env_get(e, "PATH"), "/usr/bin");
    cr_expect_str_eq(dk_spawn_env_get(e, "DISTKERNEL_BC_KEY"), "the-runs-own",
                     "the run's own variables are not filtered");
    dk_spawn_env_free(env);
}

Test(slurm_text, a_listed_name_matches_whole_names_only)
{
    cr_expect(dk_slurm_name_listed("HF_TOKEN=x", "A,HF_TOKEN"));
    cr_expect(dk_slurm_name_listed("HF_TOKEN", "HF_TOKEN"));
    cr_expect_not(dk_slurm_name_listed("HF_TOKEN=x", "HF_TOKENS,HF"));
    cr_expect_not(dk_slurm_name_listed("HF_TOKEN=x", ""));
    cr_expect_not(dk_slurm_name_listed("HF_TOKEN=x", NULL));
    cr_expect_not(dk_slurm_name_listed("=x", ","));
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, slurm_takes_null)
{
    dk_slurm_destroy(NULL);
    dk_slurm_t *none = NULL;
    dk_slurm_destroy(&none);
    cr_assert_null(none);
}
