/*
 * The status display of a run of many ranks (distributed/dk_dist_status.h):
 * past 8 ranks, counts, nodes, exceptions and GPU memory, within 12 lines at
 * any size. Up to 8 ranks, a word each: tests/unit/test_dist_plan.c.
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

/* Ranks in every state on many nodes, some lost, some slow: at every size,
 * at most 12 lines, none of them long. */
Test(status_many, at_every_size_at_most_twelve_short_lines)
{
    int sizes[] = {1, 2, 8, 9, 64, 256, 1024, 4096};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int world = sizes[k];
        for (int mixed = 0; mixed < 3; mixed++) {
            world_of(world, 8);
            st.gpu = true;
            st.gpu_memory = two_or_three_gib;
            for (int r = 0; r < world; r++) {
                ranks[r].gpu_index = r % 8;
                ranks[r].state = (dk_rank_state_t) ((r * (mixed + 1)) % 5);
                ranks[r].running_ms = ranks[r].state == DK_RANK_STARTING ? 0 : 1000 + r;
                ranks[r].lost = mixed == 2 && r % 24 < 8;
            }
            show();
            int max = world <= DK_DIST_STATUS_EACH_RANK_MAX ? 3 : DK_DIST_STATUS_MAX_LINES;
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

/* ---- lost ranks by node (runtime/dk_lost.h) -------------------------------------------- */

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
