/*
 * The status display of a run of many ranks (distributed/dk_dist_status.h):
 * past 8 ranks, counts, nodes, exceptions and GPU memory, within 12 lines at
 * any size. Up to 8 ranks, a word each: tests/unit/test_dist_plan.c. The line
 * that says whose output a cell shows; the started ranks' status
 * (`%distributed status`) at every size; and the lost ranks by node
 * (runtime/base/dk_lost.h) that it and the started ranks' end say.
 */
#include <criterion/criterion.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_dist_status.h"
#include "dk_lost.h"

#define GIB (1024ULL * 1024 * 1024)
#define DASH DK_EN_DASH

static dk_dist_rank_t *ranks;
static char (*names)[16];
static const char **hosts;
static dk_dist_status_t st;
static char *text;

static void teardown(void)
{
    free(ranks);
    free(names);
    free(hosts);
    free(text);
    ranks = NULL;
    names = NULL;
    hosts = NULL;
    text = NULL;
}

TestSuite(status_many, .fini = teardown);

/* WORLD running CPU ranks, PER_NODE on each of node1, node2, ... (0: all on
 * this node), pid 1000 + rank, started at 0.1 s each. */
static void world_of(int world, int per_node)
{
    ranks = calloc((size_t) world, sizeof *ranks);
    names = calloc((size_t) world, sizeof *names);
    hosts = calloc((size_t) world, sizeof *hosts);
    cr_assert(ranks && names && hosts);
    for (int r = 0; r < world; r++) {
        ranks[r] = (dk_dist_rank_t){.state = DK_RANK_RUNNING, .got_cell = true,
                                    .gpu_index = -1, .pid = 1000 + r, .running_ms = 1100};
        snprintf(names[r], sizeof names[r], "node%d", per_node ? r / per_node + 1 : 1);
        hosts[r] = names[r];
    }
    st = (dk_dist_status_t){.what = "CPU ranks", .elapsed_s = 41.0, .world = world,
                            .ranks = ranks, .log_dir = "/l", .hosts = per_node ? hosts : NULL,
                            .t0_ms = 1000};
}

static void show(void)
{
    free(text);
    text = dk_dist_status_text(&st);
    cr_assert_not_null(text);
}

static int line_count(const char *s)
{
    int n = 1;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

static unsigned long long two_or_three_gib(int index, int pid)
{
    (void) index;
    return pid == 1012 ? 8 * GIB : pid % 2 ? 3 * GIB : 2 * GIB;
}

Test(status_many, nine_ranks_are_counted_not_listed)
{
    world_of(9, 0);
    ranks[4].state = DK_RANK_FAILED;
    ranks[8].state = DK_RANK_DONE;
    for (int r = 0; r < 9; r++)
        ranks[r].running_ms = 1000 + 100 * (r + 1);
    ranks[8].running_ms = 1000 + 2500;
    show();
    cr_assert_str_eq(text, "distributed: CPU ranks · 41.0 s\n"
                           "  9 ranks: 7 running · 1 done · 1 failed\n"
                           "  failed: rank 4\n"
                           "  slowest to start: rank 8, 2.5 s (median 0.5 s)\n"
                           "  logs: /l");
}

/* restarts=: the first line says which attempt runs; without it, nothing. */
Test(status_many, the_attempt_is_on_the_first_line)
{
    world_of(2, 0);
    st.attempt = 2;
    st.attempts = 3;
    st.headline = "finished";
    show();
    cr_assert(strncmp(text, "distributed: CPU ranks · attempt 2 of 3 · 41.0 s · finished\n",
                      strlen("distributed: CPU ranks · attempt 2 of 3 · 41.0 s · finished\n")) ==
                  0,
              "%s", text);
    st.attempts = 1;        /* restarts=0 */
    show();
    cr_assert(!strstr(text, "attempt"), "%s", text);
}

Test(status_many, the_issues_256_ranks_on_16_nodes)
{
    world_of(256, 16);
    st.what = "256 × NVIDIA H100";
    st.gpu = true;
    st.gpu_memory = two_or_three_gib;
    for (int r = 0; r < 256; r++)
        ranks[r].gpu_index = r % 16;
    for (int r = 144; r < 148; r++)
        ranks[r].state = DK_RANK_DONE;
    ranks[152].state = DK_RANK_FAILED;
    ranks[153].state = DK_RANK_STARTING;
    ranks[153].running_ms = 0;
    show();
    cr_assert_str_eq(text,
                     "distributed: 256 × NVIDIA H100 · 41.0 s\n"
                     "  256 ranks on 16 nodes: 250 running · 4 done · 1 starting · 1 failed\n"
                     "  node[1-9,11-16]: 16 running on each\n"
                     "  node10: 10 running · 4 done · 1 starting · 1 failed\n"
                     "  failed: rank 152 on node10\n"
                     "  still starting after 41.0 s: rank 153 on node10\n"
                     "  GPU memory: min 2.0 GiB · median 3.0 GiB · max 8.0 GiB (rank 12 on node1)\n"
                     "  logs: /l");
}

Test(status_many, nodes_alike_say_nothing_more_than_the_counts)
{
    world_of(64, 8);
    show();
    cr_assert_str_eq(text, "distributed: CPU ranks · 41.0 s\n"
                           "  64 ranks on 8 nodes: 64 running\n"
                           "  logs: /l");
}

Test(status_many, nodes_that_all_differ_are_not_listed_by_node)
{
    world_of(64, 8);
    for (int node = 0; node < 8; node++)
        for (int k = 0; k < node; k++)
            ranks[node * 8 + k].state = DK_RANK_DONE;
    show();
    cr_assert_null(strstr(text, "  node"), "%s", text);
    cr_assert(strstr(text, "  64 ranks on 8 nodes: 36 running · 28 done\n"), "%s", text);
}

Test(status_many, a_lost_node_is_named_with_its_ranks)
{
    world_of(64, 8);
    for (int r = 16; r < 24; r++) {
        ranks[r].state = DK_RANK_FAILED;
        ranks[r].lost = true;
    }
    show();
    cr_assert_str_eq(text, "distributed: CPU ranks · 41.0 s\n"
                           "  64 ranks on 8 nodes: 56 running · 8 lost\n"
                           "  node[1-2,4-8]: 8 running on each\n"
                           "  node3: 8 lost\n"
                           "  node3 lost (ranks 16" DASH "23)\n"
                           "  logs: /l");
}

Test(status_many, many_lost_nodes_are_one_host_list)
{
    world_of(256, 8);
    for (int r = 64; r < 96; r++) {
        ranks[r].state = DK_RANK_FAILED;
        ranks[r].lost = true;
    }
    show();
    cr_assert(strstr(text, "  256 ranks on 32 nodes: 224 running · 32 lost\n"
                           "  node[1-8,13-32]: 8 running on each\n"
                           "  node[9-12]: 8 lost on each\n"
                           "  lost: node[9-12] (4 nodes, 32 ranks)\n"), "%s", text);
}

Test(status_many, the_slowest_to_start_is_named_with_its_node_and_the_median)
{
    world_of(64, 8);
    for (int r = 0; r < 64; r++)
        ranks[r].running_ms = 1000 + 1200 + (r % 3) * 10;
    ranks[37].running_ms = 1000 + 4100;
    show();
    cr_assert(strstr(text, "  slowest to start: rank 37 on node5, 4.1 s (median 1.2 s)\n"), "%s",
              text);
}

Test(status_many, a_slowest_to_start_that_does_not_stand_out_is_not_named)
{
    world_of(64, 8);
    for (int r = 0; r < 64; r++)
        ranks[r].running_ms = 1000 + 1200 + r * 10;
    show();
    cr_assert_null(strstr(text, "slowest"), "%s", text);
}

Test(status_many, failed_ranks_are_runs_cut_with_their_count)
{
    world_of(4096, 8);
    for (int r = 0; r < 4096; r += 2)
        ranks[r].state = DK_RANK_FAILED;
    show();
    const char *failed = strstr(text, "  failed: ranks 0, 2, 4, ");
    cr_assert(failed, "%s", text);
    const char *end = strchr(failed, '\n');
    cr_assert(strstr(failed, DK_EN_DASH) == NULL || strstr(failed, DK_EN_DASH) > end);
    cr_assert(strstr(failed, ", \xe2\x80\xa6 (2048) on node[1-512]\n") == end - strlen(
                  ", \xe2\x80\xa6 (2048) on node[1-512]"), "%.*s", (int) (end - failed), failed);
    cr_assert_leq(end - failed, 400);
}

Test(status_many, gpu_memory_is_min_median_max_and_whose_the_max)
{
    world_of(9, 0);
    st.gpu = true;
    st.gpu_memory = two_or_three_gib;
    for (int r = 0; r < 9; r++)
        ranks[r].gpu_index = r;
    show();
    /* pids 1000..1008: 2, 3, 2, 3, 2, 3, 2, 3, 2 GiB. */
    cr_assert(strstr(text, "  GPU memory: min 2.0 GiB · median 2.0 GiB · max 3.0 GiB (rank 1)\n"),
              "%s", text);
}

/* Ranks in every state on many nodes, some lost, some slow, the output of a
 * few shown: at every size, at most 12 lines, none of them long. */
Test(status_many, at_every_size_at_most_twelve_short_lines)
{
    int sizes[] = {1, 2, 8, 9, 64, 256, 1024, 4096};
    static bool shown[4096];
    for (int r = 0; r < 4096; r++)
        shown[r] = r % 3 == 0;
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int world = sizes[k];
        for (int mixed = 0; mixed < 3; mixed++) {
            world_of(world, 8);
            st.gpu = true;
            st.gpu_memory = two_or_three_gib;
            st.output = DK_OUTPUT_LIST;
            st.shown = shown;
            for (int r = 0; r < world; r++) {
                ranks[r].gpu_index = r % 8;
                ranks[r].state = (dk_rank_state_t) ((r * (mixed + 1)) % 5);
                ranks[r].running_ms = ranks[r].state == DK_RANK_STARTING ? 0 : 1000 + r;
                ranks[r].lost = mixed == 2 && r % 24 < 8;
            }
            show();
            cr_assert(strstr(text, "\n  output shown: rank"), "%s", text);
            int max = world <= DK_DIST_STATUS_EACH_RANK_MAX ? 4 : DK_DIST_STATUS_MAX_LINES;
            cr_assert_leq(line_count(text), max, "%d ranks:\n%s", world, text);
            for (const char *l = text, *nl; *l; l = nl + 1) {
                nl = strchr(l, '\n');
                if (!nl)
                    break;
                cr_assert_leq(nl - l, 600, "%d ranks: a line of %td bytes", world, nl - l);
            }
            teardown();
        }
    }
}

/* ---- whose output is shown ---------------------------------------------------------- */

Test(status_many, an_output_list_is_named_above_the_logs)
{
    world_of(64, 8);
    bool shown[64] = {false};
    shown[0] = shown[8] = true;
    for (int r = 16; r < 32; r++)
        shown[r] = true;
    st.output = DK_OUTPUT_LIST;
    st.shown = shown;
    show();
    cr_assert_str_eq(text, "distributed: CPU ranks · 41.0 s\n"
                           "  64 ranks on 8 nodes: 64 running\n"
                           "  output shown: ranks 0, 8, 16" DASH "31 (all in the logs)\n"
                           "  logs: /l");
}

Test(status_many, output_local0_says_so_with_the_ranks_it_shows)
{
    world_of(4, 2);
    bool shown[4] = {true, false, true, false};
    st.output = DK_OUTPUT_LOCAL0;
    st.shown = shown;
    show();
    cr_assert_str_eq(text, "distributed: CPU ranks · 41.0 s\n"
                           "  rank 0 on node1 running · rank 1 on node1 running · "
                           "rank 2 on node2 running · rank 3 on node2 running\n"
                           "  output shown: local rank 0 of each node, ranks 0, 2 "
                           "(all in the logs)\n"
                           "  logs: /l");
}

Test(status_many, output_all_and_rank0_add_no_line)
{
    world_of(2, 0);
    bool shown[2] = {true, false};
    st.output = DK_OUTPUT_RANK0;
    st.shown = shown;
    show();
    cr_assert_null(strstr(text, "output shown"), "%s", text);
    st.output = DK_OUTPUT_ALL;
    st.shown = NULL;
    show();
    cr_assert_null(strstr(text, "output shown"), "%s", text);
}

Test(status_many, a_long_output_list_is_cut_on_its_line)
{
    world_of(4096, 8);
    bool *shown = calloc(4096, sizeof *shown);
    cr_assert_not_null(shown);
    for (int r = 0; r < 4096; r += 2)
        shown[r] = true;
    st.output = DK_OUTPUT_LIST;
    st.shown = shown;
    show();
    free(shown);
    const char *line = strstr(text, "  output shown: ranks 0, 2, 4, ");
    cr_assert(line, "%s", text);
    const char *end = strchr(line, '\n');
    cr_assert(end && end - line < 160, "%s", text);
    cr_assert(strstr(line, ", \xe2\x80\xa6 (all in the logs)\n") == end - strlen(
                  ", \xe2\x80\xa6 (all in the logs)"), "%s", text);
}

/* ---- started ranks: `%distributed status` -------------------------------------------- */

static dk_dist_started_t started;

/* WORLD started ranks, PER_NODE on each node (0: this node), idle. */
static void started_of(int world, int per_node)
{
    world_of(world, per_node);
    for (int r = 0; r < world; r++) {
        ranks[r].state = DK_RANK_DONE;
        ranks[r].running_ms = 0;
    }
    started = (dk_dist_started_t){.id = "1f0c9a2e", .idle_s = 20};
    if (per_node)
        started = (dk_dist_started_t){.id = "1f0c9a2e", .idle_s = 20, .slurm_job = "4242",
                                      .slurm_nodes = "node[1-128]",
                                      .slurm_time_limit = "2:00:00"};
    st.elapsed_s = 312;
    st.log_dir = NULL;
    st.started = &started;
}

Test(status_started, one_rank_by_its_pid)
{
    started_of(1, 0);
    st.what = "1 CPU rank";
    show();
    cr_assert_str_eq(text, "started ranks 1f0c9a2e: 1 CPU rank · up 312 s · idle for 20 s\n"
                           "  rank 0 pid 1000");
}

Test(status_started, eight_ranks_each_by_pid_whatever_their_state)
{
    started_of(8, 0);
    st.what = "8 CPU ranks";
    started.idle_s = 0;
    started.idle_timeout_s = 3600;
    ranks[3].state = DK_RANK_RUNNING;
    ranks[5].state = DK_RANK_FAILED;
    show();
    cr_assert_str_eq(text, "started ranks 1f0c9a2e: 8 CPU ranks · up 312 s · running a cell "
                           "(ended after 3600 s idle)\n"
                           "  rank 0 pid 1000 · rank 1 pid 1001 · rank 2 pid 1002 · "
                           "rank 3 pid 1003 · rank 4 pid 1004 · rank 5 pid 1005 · "
                           "rank 6 pid 1006 · rank 7 pid 1007");
}

Test(status_started, on_slurms_nodes_the_job_and_each_ranks_node)
{
    started_of(4, 2);
    st.what = "4 CPU ranks";
    started.slurm_nodes = "node[1-2]";
    started.slurm_time_limit = "";
    show();
    cr_assert_str_eq(text, "started ranks 1f0c9a2e: 4 CPU ranks · up 312 s · idle for 20 s\n"
                           "  Slurm job 4242 on node[1-2] (time limit Slurm's default)\n"
                           "  rank 0 on node1 · rank 1 on node1 · rank 2 on node2 · "
                           "rank 3 on node2");
}

Test(status_started, nine_ranks_are_counted_the_raised_named)
{
    started_of(9, 0);
    st.what = "9 CPU ranks";
    ranks[4].state = DK_RANK_FAILED;
    ranks[6].state = ranks[7].state = DK_RANK_STOPPED;
    show();
    cr_assert_str_eq(text, "started ranks 1f0c9a2e: 9 CPU ranks · up 312 s · idle for 20 s\n"
                           "  9 ranks: 6 idle · 1 raised · 2 interrupted\n"
                           "  raised: rank 4");
}

/* The header's example (distributed/dk_dist_status.h). */
Test(status_started, a_thousand_ranks_running_a_cell_in_seven_lines)
{
    started_of(1024, 8);
    st.what = "1024 CPU ranks";
    started.idle_s = 0;
    for (int r = 0; r < 1024; r++)
        ranks[r].state = DK_RANK_RUNNING;
    for (int r = 72; r < 77; r++)
        ranks[r].state = DK_RANK_DONE;
    ranks[77].state = DK_RANK_FAILED;
    bool *shown = calloc(1024, sizeof *shown);
    cr_assert_not_null(shown);
    shown[0] = shown[8] = true;
    for (int r = 16; r < 32; r++)
        shown[r] = true;
    st.output = DK_OUTPUT_LIST;
    st.shown = shown;
    show();
    free(shown);
    cr_assert_str_eq(text,
                     "started ranks 1f0c9a2e: 1024 CPU ranks · up 312 s · running a cell\n"
                     "  Slurm job 4242 on node[1-128] (time limit 2:00:00)\n"
                     "  1024 ranks on 128 nodes: 1018 running · 5 idle · 1 raised\n"
                     "  node[1-9,11-128]: 8 running on each\n"
                     "  node10: 2 running · 5 idle · 1 raised\n"
                     "  raised: rank 77 on node10\n"
                     "  output shown: ranks 0, 8, 16" DASH "31 (all in the logs)");
}

Test(status_started, a_lost_node_is_named_with_all_its_ranks)
{
    started_of(64, 8);
    st.what = "64 CPU ranks";
    for (int r = 16; r < 24; r++)
        ranks[r].lost = true;
    show();
    cr_assert_str_eq(text, "started ranks 1f0c9a2e: 64 CPU ranks · up 312 s · idle for 20 s\n"
                           "  Slurm job 4242 on node[1-128] (time limit 2:00:00)\n"
                           "  64 ranks on 8 nodes: 56 idle · 8 lost\n"
                           "  node[1-2,4-8]: 8 idle on each\n"
                           "  node3: 8 lost\n"
                           "  node3 lost (ranks 16" DASH "23)");
}

static unsigned long long gib_by_pid(int index, int pid)
{
    (void) index;
    return pid == 1005 ? 9 * GIB : 2 * GIB;
}

Test(status_started, idle_ranks_hold_their_gpu_memory)
{
    started_of(16, 0);
    st.what = "16 × NVIDIA H100";
    st.gpu = true;
    st.gpu_memory = gib_by_pid;
    for (int r = 0; r < 16; r++)
        ranks[r].gpu_index = r % 8;
    show();
    cr_assert(strstr(text, "  GPU memory: min 2.0 GiB · median 2.0 GiB · max 9.0 GiB (rank 5)"),
              "%s", text);
}

/* Started ranks in every state on many nodes, some nodes lost, output shown
 * from a few: at every size, at most 12 lines, none of them long, and the
 * counts add up to the world. */
Test(status_started, at_every_size_at_most_twelve_short_lines)
{
    int sizes[] = {1, 8, 9, 64, 1024, 4096};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int world = sizes[k];
        for (int mixed = 0; mixed < 3; mixed++) {
            started_of(world, 8);
            st.gpu = true;
            st.gpu_memory = two_or_three_gib;
            bool *shown = calloc((size_t) world, sizeof *shown);
            cr_assert_not_null(shown);
            for (int r = 0; r < world; r++) {
                ranks[r].gpu_index = r % 8;
                ranks[r].state = (dk_rank_state_t) ((r * (mixed + 1)) % 5);
                ranks[r].lost = mixed == 2 && r % 24 < 8;
                shown[r] = r % 3 == 0;
            }
            st.output = DK_OUTPUT_LIST;
            st.shown = shown;
            show();
            free(shown);
            cr_assert_leq(line_count(text), DK_DIST_STATUS_MAX_LINES, "%d ranks:\n%s", world,
                          text);
            for (const char *l = text, *nl; *l; l = nl + 1) {
                nl = strchr(l, '\n');
                cr_assert_leq((nl ? nl : l + strlen(l)) - l, 600, "%d ranks:\n%s", world, text);
                if (!nl)
                    break;
            }
            if (world > DK_DIST_STATUS_EACH_RANK_MAX) {
                char head[64];
                snprintf(head, sizeof head, "\n  %d ranks on %d node%s: ", world,
                         (world + 7) / 8, world > 8 ? "s" : "");
                const char *counts = strstr(text, head);
                cr_assert(counts, "%s", text);
                int sum = 0;
                for (const char *c = counts + strlen(head); *c && *c != '\n';) {
                    sum += atoi(c);
                    const char *dot = strstr(c, " · ");
                    const char *nl = strchr(c, '\n');
                    if (!dot || (nl && dot > nl))
                        break;
                    c = dot + strlen(" · ");
                }
                cr_assert_eq(sum, world, "%s", text);
            }
            teardown();
        }
    }
}

/* ---- lost ranks by node (runtime/base/dk_lost.h) -------------------------------------------- */

Test(lost, a_node_with_one_lost_rank_loses_all_its_ranks)
{
    const char *on[] = {"node1", "node1", "node2", "node2", "node10", "node10"};
    bool lost[6] = {false, false, false, true, true, false};
    cr_assert_eq(dk_lost_whole_nodes(6, lost, on), 0);
    bool want[6] = {false, false, true, true, true, true};
    cr_assert_arr_eq(lost, want, sizeof want);
    char buf[200];
    dk_lost_format(6, lost, on, "; ", buf, sizeof buf);
    /* In the order of each node's first lost rank, not of the names. */
    cr_assert_str_eq(buf, "node2 lost (ranks 2" DASH "3); node10 lost (ranks 4" DASH "5)");
}

Test(lost, no_lost_rank_marks_none)
{
    const char *on[] = {"node1", "node2"};
    bool lost[2] = {false, false};
    cr_assert_eq(dk_lost_whole_nodes(2, lost, on), 0);
    cr_assert_not(lost[0] || lost[1]);
}

/* A rank per node, every one lost, at the largest world: grouped by sorting,
 * so this is a few thousand comparisons, not sixteen million. */
Test(lost, four_thousand_nodes_lost_are_told_in_rank_order, .timeout = 10)
{
    enum { N = 4096 };
    static char on_names[N][16];
    static const char *on[N];
    static bool lost[N];
    for (int r = 0; r < N; r++) {
        snprintf(on_names[r], sizeof on_names[r], "node%d", r + 1);
        on[r] = on_names[r];
        lost[r] = r % 8 == 0;
    }
    cr_assert_eq(dk_lost_whole_nodes(N, lost, on), 0);
    for (int r = 0; r < N; r++)
        cr_assert_eq(lost[r], r % 8 == 0);
    for (int r = 0; r < N; r++)
        lost[r] = true;
    static char buf[200000];
    dk_lost_format(N, lost, on, "; ", buf, sizeof buf);
    const char *head = "node1 lost (rank 0); node2 lost (rank 1); node3 lost (rank 2); ";
    cr_assert(strncmp(buf, head, strlen(head)) == 0, "%.200s", buf);
    cr_assert(strstr(buf, "; node4096 lost (rank 4095)") == buf + strlen(buf) -
                  strlen("; node4096 lost (rank 4095)"));
}
