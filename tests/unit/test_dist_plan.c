/*
 * How many ranks and where (distributed/dk_dist_plan.h), and the status
 * display's text (distributed/dk_dist_status.h), on made-up nodes and ranks.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_dist_plan.h"
#include "dk_dist_status.h"

static dk_gpu_list_t node;
static dk_dist_opts_t opts;
static dk_dist_plan_t plan;
static char err[1024];

static void add_gpu(const char *name, const char *model)
{
    dk_gpu_t *g = &node.gpus[node.count];
    g->index = node.count++;
    strcpy(g->name, name);
    strcpy(g->model, model);
}

static void setup(void)
{
    memset(&node, 0, sizeof node);
    strcpy(node.why_none, "no NVIDIA driver");
    memset(&opts, 0, sizeof opts);
    err[0] = '\0';
}

TestSuite(plan, .init = setup);

Test(plan, num_processes_asks_for_cpu_ranks_whatever_the_node_has)
{
    add_gpu("NVIDIA H100", "H100");
    opts.num_processes = 3;
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0);
    cr_assert_eq(plan.world, 3);
    cr_assert_not(plan.gpu);
    cr_assert_str_eq(plan.what, "3 CPU ranks");
    cr_assert_str_eq(plan.device, "cpu");
}

Test(plan, one_cpu_rank_is_singular)
{
    opts.num_processes = 1;
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0);
    cr_assert_str_eq(plan.what, "1 CPU rank");
}

Test(plan, no_gpu_says_why_and_how_to_run_cpu_ranks)
{
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), -1);
    cr_assert_str_eq(err, "no GPU on this node (no NVIDIA driver). To run CPU ranks instead, "
                          "give num_processes=N, for example: %%distributed num_processes=2");
}

Test(plan, every_gpu_of_the_node_by_default)
{
    add_gpu("NVIDIA H100 80GB HBM3", "H100");
    add_gpu("NVIDIA H100 80GB HBM3", "H100");
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0);
    cr_assert_eq(plan.world, 2);
    cr_assert(plan.gpu);
    cr_assert_str_eq(plan.what, "2 × NVIDIA H100 80GB HBM3");
    cr_assert_str_eq(plan.model, "H100");
    cr_assert_eq(plan.gpu_index[1], 1);
}

Test(plan, num_accelerators_takes_fewer)
{
    add_gpu("NVIDIA A100", "A100");
    add_gpu("NVIDIA A100", "A100");
    opts.num_accelerators = 1;
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0);
    cr_assert_eq(plan.world, 1);
}

Test(plan, more_gpus_than_the_node_has_is_an_error)
{
    add_gpu("NVIDIA A100", "A100");
    opts.num_accelerators = 4;
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), -1);
    cr_assert_str_eq(err, "num_accelerators=4 asks for more GPUs than this node has: 1 × NVIDIA A100");
}

Test(plan, the_nodes_own_model_runs_without_a_notice)
{
    add_gpu("NVIDIA H200", "H200");
    strcpy(opts.accelerator_model, "H200");
    strcpy(opts.accelerator_given, "accelerator_type=GPU_1xH200");
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0);
    cr_assert_str_eq(plan.notice, "");
}

Test(plan, a_platform_type_the_node_lacks_runs_on_the_nodes_gpus_with_a_notice)
{
    add_gpu("NVIDIA H200", "H200");
    add_gpu("NVIDIA H200", "H200");
    strcpy(opts.accelerator_model, "H100");
    strcpy(opts.accelerator_given, "accelerator_type=GPU_8xH100");
    opts.num_accelerators = 2;
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0, "%s", err);
    cr_assert_eq(plan.world, 2);
    cr_assert(plan.gpu);
    cr_assert_str_eq(plan.notice, "accelerator_type=GPU_8xH100 is the managed platform's H100; "
                                  "this node has 2 × NVIDIA H200 (H200), so the run uses those");
}

Test(plan, a_model_that_is_neither_the_nodes_nor_the_platforms_is_an_error_listing_both)
{
    add_gpu("NVIDIA A100", "A100");
    add_gpu("Some GPU", "");
    strcpy(opts.accelerator_model, "A100");
    strcpy(opts.accelerator_given, "gpu_type=A100");
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), -1);
    cr_assert_str_eq(err, "gpu_type=A100 asks for A100 GPUs, but this node has 2 × Some GPU "
                          "(unknown model), and A100 is not one of the managed platform's types "
                          "either (those run on whatever the node has): accelerator_type "
                          "GPU_1xA10, GPU_1xH100, GPU_8xH100, GPU_8xB300; gpu_type A10, H100, B300");
}

Test(plan, only_the_gpus_the_run_uses_must_be_the_model)
{
    add_gpu("NVIDIA A100", "A100");
    add_gpu("Some GPU", "");
    strcpy(opts.accelerator_model, "A100");
    opts.num_accelerators = 1;
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(plan.notice, "");
}

/* ---- on Slurm's nodes: the cluster's GPUs, never this host's ---------------- */

static int plan_slurm_typed(int gpus_per_node, const char *gres, const char *type)
{
    err[0] = '\0';
    return dk_dist_plan_slurm(&opts, gpus_per_node, gres, type, "partition gpu", &plan, err,
                              sizeof err);
}

static int plan_slurm(int gpus_per_node, const char *gres)
{
    return plan_slurm_typed(gpus_per_node, gres, "");
}

Test(plan, slurm_gpus_over_given_nodes_whatever_this_host_has)
{
    opts.num_accelerators = 16;
    opts.nodes = 2;
    cr_assert_eq(plan_slurm(8, "gpu:h100:8(S:0-1)"), 0, "%s", err);
    cr_assert_eq(plan.world, 16);
    cr_assert_eq(plan.nodes, 2);
    cr_assert_eq(plan.per_node, 8);
    cr_assert(plan.gpu && plan.remote);
    cr_assert_str_eq(plan.what, "16 GPU ranks on 2 nodes");
    cr_assert_str_eq(plan.device, "GPU (Slurm GRES gpu:h100:8(S:0-1))");
}

Test(plan, slurm_nodes_are_inferred_from_the_gpus_per_node)
{
    opts.num_accelerators = 16;
    cr_assert_eq(plan_slurm(8, "gpu:8"), 0, "%s", err);
    cr_assert_eq(plan.nodes, 2);
    cr_assert_eq(plan.per_node, 8);
    opts.num_accelerators = 4;          /* fewer than a node has: one node */
    cr_assert_eq(plan_slurm(8, "gpu:8"), 0, "%s", err);
    cr_assert_eq(plan.nodes, 1);
    cr_assert_eq(plan.per_node, 4);
    opts.num_accelerators = 0;          /* neither: one node's every GPU */
    cr_assert_eq(plan_slurm(4, "gpu:4"), 0, "%s", err);
    cr_assert_eq(plan.world, 4);
    cr_assert_eq(plan.nodes, 1);
    opts.nodes = 3;                     /* nodes= alone: every GPU of each */
    cr_assert_eq(plan_slurm(4, "gpu:4"), 0, "%s", err);
    cr_assert_eq(plan.world, 12);
    cr_assert_eq(plan.per_node, 4);
}

Test(plan, slurm_gpus_that_fill_no_whole_nodes_are_an_error_naming_the_multiples)
{
    opts.num_accelerators = 12;
    cr_assert_eq(plan_slurm(8, "gpu:8"), -1);
    cr_assert_str_eq(err, "num_accelerators=12 does not fill whole nodes: each node of "
                          "partition gpu has 8 GPUs (gpu:8), so without nodes= give a multiple "
                          "of 8 (8, 16), or give nodes= with num_accelerators a multiple of it");
    opts.nodes = 2;                     /* 6 of each node's 8: fine */
    cr_assert_eq(plan_slurm(8, "gpu:8"), 0, "%s", err);
    cr_assert_eq(plan.per_node, 6);
}

Test(plan, slurm_more_gpus_per_node_than_a_node_has_says_how_many_nodes)
{
    opts.num_accelerators = 16;
    opts.nodes = 1;
    cr_assert_eq(plan_slurm(8, "gpu:8"), -1);
    cr_assert_str_eq(err, "num_accelerators=16 over nodes=1 asks 16 GPUs of each node, but a "
                          "node of partition gpu has 8 (gpu:8); give nodes=2, or leave nodes= "
                          "out to take as many nodes as the GPUs need");
    opts.num_accelerators = 10;         /* 3 nodes cannot split 10: 5 */
    opts.nodes = 2;
    cr_assert_eq(plan_slurm(4, "gpu:4"), -1);
    cr_assert(strstr(err, "give nodes=5,"), "%s", err);
}

Test(plan, slurm_more_gpus_per_node_than_distkernel_nodes_gives_names_the_variable)
{
    opts.num_accelerators = 16;
    opts.nodes = 1;
    opts.nodes_from_env = true;
    cr_assert_eq(plan_slurm(8, "gpu:8"), -1);
    cr_assert_str_eq(err, "num_accelerators=16 over nodes=1 (the default from "
                          "DISTKERNEL_NODES=1) asks 16 GPUs of each node, but a node of "
                          "partition gpu has 8 (gpu:8); give nodes= in the cell (it wins over "
                          "DISTKERNEL_NODES), or change DISTKERNEL_NODES where the kernel's "
                          "environment sets it (the kernelspec's env): nodes=2, or nodes= unset "
                          "in both to take as many nodes as the GPUs need");
}

Test(plan, slurm_a_world_that_distkernel_nodes_does_not_split_names_the_variable)
{
    opts.num_processes = 8;
    opts.nodes = 3;
    opts.nodes_from_env = true;
    cr_assert_eq(plan_slurm(0, ""), -1);
    cr_assert_str_eq(err, "8 ranks (num_processes) cannot be split evenly over nodes=3 (the "
                          "default from DISTKERNEL_NODES=3): every node runs as many ranks; "
                          "give num_processes as a multiple of 3, or a number of nodes that "
                          "divides 8: give nodes= in the cell (it wins over DISTKERNEL_NODES), "
                          "or change DISTKERNEL_NODES where the kernel's environment sets it "
                          "(the kernelspec's env)");
}

Test(plan, slurm_a_partition_without_gpus_says_what_to_give)
{
    opts.num_accelerators = 2;
    cr_assert_eq(plan_slurm(0, "(null)"), -1);
    cr_assert_str_eq(err, "the run asks for GPU ranks, but the nodes of partition gpu have no "
                          "GPU (Slurm's GRES for them: (null)). Give partition= one whose "
                          "nodes have GPUs (`sinfo -o '%P %G'` lists each partition's), or run "
                          "CPU ranks with num_processes=N");
}

Test(plan, slurm_world_known_only_at_plan_time_must_split_evenly)
{
    /* The options check this too when they give the world; the plan checks
     * again whatever gave it. */
    opts.num_processes = 8;
    opts.nodes = 3;
    cr_assert_eq(plan_slurm(0, ""), -1);
    cr_assert_str_eq(err, "8 ranks (num_processes) cannot be split evenly over nodes=3: every "
                          "node runs as many ranks; give num_processes as a multiple of 3, or "
                          "nodes= a divisor of 8");
    opts.num_processes = 1;
    opts.nodes = 2;
    cr_assert_eq(plan_slurm(0, ""), -1);
    cr_assert(strstr(err, "1 rank (num_processes) cannot be split evenly over nodes=2"), "%s",
              err);
}

Test(plan, slurm_cpu_ranks_ask_for_no_gpu)
{
    opts.num_processes = 8;
    opts.nodes = 2;
    cr_assert_eq(plan_slurm(8, "gpu:8"), 0, "%s", err);
    cr_assert_not(plan.gpu);
    cr_assert_eq(plan.per_node, 4);
    cr_assert_str_eq(plan.what, "8 CPU ranks on 2 nodes");
    cr_assert_eq(dk_dist_plan_local_gpu(&plan, 0), -1);
}

Test(plan, slurm_ranks_have_no_gpu_of_this_host_and_local_ones_do)
{
    opts.num_accelerators = 4;
    opts.nodes = 2;
    cr_assert_eq(plan_slurm(2, "gpu:2"), 0, "%s", err);
    for (int r = 0; r < 4; r++)
        cr_expect_eq(dk_dist_plan_local_gpu(&plan, r), -1);
    /* a local run on the same options' GPUs keeps its NVML indexes */
    memset(&opts, 0, sizeof opts);
    add_gpu("NVIDIA H100", "H100");
    add_gpu("NVIDIA H100", "H100");
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0);
    cr_expect_eq(dk_dist_plan_local_gpu(&plan, 1), 1);
}

Test(plan, slurm_a_gpu_type_is_not_checked_and_says_so)
{
    opts.num_accelerators = 2;
    strcpy(opts.accelerator_model, "H100");
    strcpy(opts.accelerator_given, "accelerator_type=GPU_2xH100");
    cr_assert_eq(plan_slurm(2, "gpu:2"), 0, "%s", err);
    cr_assert_str_eq(plan.notice, "accelerator_type=GPU_2xH100 is not checked on Slurm's nodes "
                                  "(their GRES, gpu:2, names no GPU type); constraint= picks "
                                  "nodes by their features");
}

static unsigned long long three_gib(int index, int pid)
{
    (void)index;
    return pid > 0 ? 3ULL << 30 : 0;
}

Test(status, a_line_for_the_run_one_for_the_ranks_one_for_the_logs)
{
    dk_dist_rank_t ranks[3] = {
        {.state = DK_RANK_RUNNING, .gpu_index = 0, .pid = 42},
        {.state = DK_RANK_DONE, .gpu_index = 1, .pid = 43},
        {.state = DK_RANK_FAILED, .gpu_index = 2, .pid = 44},
    };
    dk_dist_status_t st = {.what = "3 × NVIDIA H100", .elapsed_s = 12.34, .headline = "failed",
                           .world = 3, .ranks = ranks, .gpu = true, .log_dir = "/l",
                           .gpu_memory = three_gib};
    char *text = dk_dist_status_text(&st);
    cr_assert_str_eq(text, "distributed: 3 × NVIDIA H100 · 12.3 s · failed\n"
                           "  rank 0 running (GPU 3.0 GiB) · rank 1 done · rank 2 failed\n"
                           "  logs: /l");
    free(text);
}

Test(status, cpu_ranks_without_headline)
{
    dk_dist_rank_t ranks[2] = {{.state = DK_RANK_STARTING, .gpu_index = -1},
                               {.state = DK_RANK_STOPPED, .gpu_index = -1}};
    dk_dist_status_t st = {.what = "2 CPU ranks", .elapsed_s = 0.04, .world = 2, .ranks = ranks,
                           .log_dir = "/l"};
    char *text = dk_dist_status_text(&st);
    cr_assert_str_eq(text, "distributed: 2 CPU ranks · 0.0 s\n"
                           "  rank 0 starting · rank 1 stopped\n  logs: /l");
    free(text);
}

Test(status, ranks_on_several_nodes_say_their_node)
{
    dk_dist_rank_t ranks[4] = {{.state = DK_RANK_RUNNING, .gpu_index = -1},
                               {.state = DK_RANK_RUNNING, .gpu_index = -1},
                               {.state = DK_RANK_DONE, .gpu_index = -1},
                               {.state = DK_RANK_STARTING, .gpu_index = -1}};
    const char *hosts[4] = {"node1", "node1", "node2", "node2"};
    dk_dist_status_t st = {.what = "4 CPU ranks", .elapsed_s = 1.0, .world = 4, .ranks = ranks,
                           .log_dir = "/l", .hosts = hosts, .headline = "Slurm job 7 RUNNING"};
    char *text = dk_dist_status_text(&st);
    cr_assert_str_eq(text, "distributed: 4 CPU ranks · 1.0 s · Slurm job 7 RUNNING\n"
                           "  rank 0 on node1 running · rank 1 on node1 running · "
                           "rank 2 on node2 done · rank 3 on node2 starting\n"
                           "  logs: /l");
    free(text);
}

/* The model asked for, against the nodes' GRES types. */
Test(plan, slurm_a_model_the_nodes_have_asks_for_its_type)
{
    opts.num_accelerators = 8;
    strcpy(opts.accelerator_model, "H100");
    strcpy(opts.accelerator_given, "gpu_type=H100");
    cr_assert_eq(plan_slurm_typed(4, "gpu:h100:4(S:0)", "h100"), 0, "%s", err);
    cr_assert_str_eq(plan.gpu_type, "h100");
    cr_assert_eq(plan.nodes, 2);
    cr_assert_str_eq(plan.notice, "");
}

Test(plan, slurm_a_platform_model_the_typed_nodes_lack_runs_on_theirs_with_a_notice)
{
    opts.num_accelerators = 2;
    strcpy(opts.accelerator_model, "H100");
    strcpy(opts.accelerator_given, "gpu_type=H100");
    cr_assert_eq(plan_slurm_typed(8, "gpu:h200:8", ""), 0, "%s", err);
    cr_assert_str_eq(plan.gpu_type, "");
    cr_assert(strstr(plan.notice, "gpu_type=H100 is the managed platform's H100; the nodes of "
                                  "partition gpu have h200 GPUs"), "%s", plan.notice);
}

Test(plan, slurm_another_model_the_typed_nodes_lack_is_an_error_naming_their_types)
{
    opts.num_accelerators = 2;
    strcpy(opts.accelerator_model, "MI300X");
    strcpy(opts.accelerator_given, "gpu_type=MI300X");
    cr_assert_eq(plan_slurm_typed(8, "gpu:a100:4,gpu:v100:4", ""), -1);
    cr_assert(strstr(err, "gpu_type=MI300X asks for MI300X GPUs, but the nodes of partition gpu "
                          "have a100, v100"), "%s", err);
}

Test(plan, slurm_untyped_gres_cannot_check_the_model_and_says_so)
{
    opts.num_accelerators = 2;
    strcpy(opts.accelerator_model, "MI300X");
    strcpy(opts.accelerator_given, "gpu_type=MI300X");
    cr_assert_eq(plan_slurm_typed(8, "gpu:8", ""), 0, "%s", err);
    cr_assert(strstr(plan.notice, "is not checked on Slurm's nodes"), "%s", plan.notice);
}

/* ---- whose output the cell shows (output=) ---- */

static bool *shown;

/* The ranks SHOWN flags, as a list ("0,4"). */
static const char *shown_list(void)
{
    static char out[8192];
    size_t used = 0;
    out[0] = '\0';
    for (int r = 0; r < plan.world; r++)
        if (shown[r])
            used += (size_t)snprintf(out + used, sizeof out - used, "%s%d", used ? "," : "", r);
    return out;
}

static void free_shown(void)
{
    free(shown);
    shown = NULL;
}

TestSuite(output, .init = setup, .fini = free_shown);

Test(output, all_shows_every_rank_without_a_filter)
{
    opts.num_processes = 4;
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0);
    cr_assert_eq(dk_dist_plan_output(&plan, &opts, &shown, err, sizeof err), 0);
    cr_assert_null(shown);
}

Test(output, rank0_shows_rank_0)
{
    opts.num_processes = 4;
    opts.output = DK_OUTPUT_RANK0;
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0);
    cr_assert_eq(dk_dist_plan_output(&plan, &opts, &shown, err, sizeof err), 0);
    cr_assert_str_eq(shown_list(), "0");
}

Test(output, local0_on_this_node_is_rank_0)
{
    opts.num_processes = 4;
    opts.output = DK_OUTPUT_LOCAL0;
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0);
    cr_assert_eq(dk_dist_plan_output(&plan, &opts, &shown, err, sizeof err), 0);
    cr_assert_str_eq(shown_list(), "0");
}

Test(output, local0_on_slurm_nodes_is_each_nodes_first_rank)
{
    static const struct { int world, nodes; const char *want; } cases[] = {
        {8, 2, "0,4"}, {8, 8, "0,1,2,3,4,5,6,7"}, {8, 1, "0"}, {12, 3, "0,4,8"},
        {6, 2, "0,3"},
    };
    opts.output = DK_OUTPUT_LOCAL0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        opts.num_processes = cases[i].world;
        opts.nodes = cases[i].nodes;
        cr_assert_eq(plan_slurm(0, ""), 0, "%s", err);
        cr_assert_eq(dk_dist_plan_output(&plan, &opts, &shown, err, sizeof err), 0);
        cr_assert_str_eq(shown_list(), cases[i].want, "%d ranks on %d nodes", cases[i].world,
                         cases[i].nodes);
        free_shown();
    }
}

Test(output, local0_at_1024_ranks_on_128_nodes_is_128_ranks)
{
    opts.output = DK_OUTPUT_LOCAL0;
    opts.num_processes = 1024;
    opts.nodes = 128;
    cr_assert_eq(plan_slurm(0, ""), 0, "%s", err);
    cr_assert_eq(dk_dist_plan_output(&plan, &opts, &shown, err, sizeof err), 0);
    int n = 0;
    for (int r = 0; r < 1024; r++) {
        n += shown[r];
        cr_assert_eq(shown[r], r % 8 == 0, "rank %d", r);
    }
    cr_assert_eq(n, 128);
}

Test(output, a_list_shows_its_ranks)
{
    opts.num_processes = 32;
    opts.output = DK_OUTPUT_LIST;
    strcpy(opts.output_ranks, "0,8,16-19,8");
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0);
    cr_assert_eq(dk_dist_plan_output(&plan, &opts, &shown, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(shown_list(), "0,8,16,17,18,19");
}

Test(output, a_list_past_the_world_is_an_error_before_any_rank_starts)
{
    opts.num_processes = 4;
    opts.output = DK_OUTPUT_LIST;
    strcpy(opts.output_ranks, "0,2-5");
    cr_assert_eq(dk_dist_plan(&opts, &node, &plan, err, sizeof err), 0);
    cr_assert_eq(dk_dist_plan_output(&plan, &opts, &shown, err, sizeof err), -1);
    cr_assert_null(shown);
    cr_assert_str_eq(err, "output=0,2-5: the range 2-5 goes past this run's last rank, 3 (its 4 "
                          "ranks are 0-3); list ranks from 0 to 3 (output=all shows every "
                          "rank). No rank was started.");
}
