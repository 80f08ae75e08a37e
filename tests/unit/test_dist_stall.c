/*
 * Where the ranks of a silent run are, live (distributed/dk_dist_stall.h),
 * on a made-up clock with made-up dumps: nothing is asked before
 * stall_after, then a sample every few seconds; the status gets the groups
 * within the lines it gives, and loses them as soon as a rank prints.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_dist_stall.h"
#include "dk_dist_status.h"
#include "dk_lost.h"
#include "dk_stacks.h"

#define CELLS "/tmp/distkernel-cells-1-x/"

static const char *SLEEPING =
    "Current thread 0x00007f0be2e1d740 (most recent call first):\n"
    "  File \"" CELLS "1.py\", line 6 in <module>\n";
static const char *REDUCING =
    "Current thread 0x00007f0be2e1d740 (most recent call first):\n"
    "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", "
    "line 1541 in all_reduce\n"
    "  File \"" CELLS "1.py\", line 8 in <module>\n";

static dk_dist_stall_t *stall;
static char *text;

static void teardown(void)
{
    dk_dist_stall_destroy(&stall);
    free(text);
    text = NULL;
}

TestSuite(dist_stall, .fini = teardown);

/* Four ranks: rank 1 sleeps at line 6, the others reduce at line 8. */
static void sample_four(void)
{
    const char *dumps[4] = {REDUCING, SLEEPING, REDUCING, REDUCING};
    size_t lens[4];
    for (int r = 0; r < 4; r++)
        lens[r] = strlen(dumps[r]);
    dk_dist_stall_sampled(stall, 4, dumps, lens);
}

static int lines_of(const char *s)
{
    int n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

Test(dist_stall, nothing_is_asked_before_stall_after)
{
    stall = dk_dist_stall_new(4, 60, 0, 1000, CELLS);
    cr_assert_not_null(stall);
    cr_assert_not(dk_dist_stall_due(stall, 1000));
    cr_assert_not(dk_dist_stall_due(stall, 60999));
    cr_assert_null(dk_dist_stall_lines(stall, 60999, 10));
    cr_assert(dk_dist_stall_due(stall, 61000));
}

Test(dist_stall, output_restarts_the_silence)
{
    stall = dk_dist_stall_new(4, 2, 0, 0, CELLS);
    dk_dist_stall_output(stall, 1500);
    cr_assert_not(dk_dist_stall_due(stall, 2500), "silent for 1 s only");
    cr_assert(dk_dist_stall_due(stall, 3500));
}

Test(dist_stall, samples_come_every_few_seconds_while_the_silence_lasts)
{
    stall = dk_dist_stall_new(4, 2, 0, 0, CELLS);
    long long every = (long long) (DK_DIST_STALL_EVERY_S * 1000);
    cr_assert(dk_dist_stall_due(stall, 2000));
    cr_assert_not(dk_dist_stall_due(stall, 2050), "asked twice at once");
    cr_assert_not(dk_dist_stall_due(stall, 2000 + every - 1));
    cr_assert(dk_dist_stall_due(stall, 2000 + every));
    /* Output, then silence again: the first ask comes at stall_after. */
    dk_dist_stall_output(stall, 2000 + every + 100);
    cr_assert(dk_dist_stall_due(stall, 2000 + every + 100 + 2000));
}

Test(dist_stall, the_status_gets_the_odd_rank_first_in_the_cells_lines)
{
    stall = dk_dist_stall_new(4, 60, 0, 0, CELLS);
    cr_assert(dk_dist_stall_due(stall, 75000));
    sample_four();
    cr_assert(dk_dist_stall_changed(stall, 75500));
    text = dk_dist_stall_lines(stall, 75500, 10);
    cr_assert_not_null(text);
    cr_assert_str_eq(text, "  silent 76 s; where the ranks are:\n"
                           "    rank 1:            cell line 6\n"
                           "    ranks 0, 2, 3 (3): torch.distributed.all_reduce  (cell line 8)\n");
    cr_assert_not(dk_dist_stall_changed(stall, 76000), "shown already");
}

Test(dist_stall, output_clears_the_groups_at_once)
{
    stall = dk_dist_stall_new(4, 2, 0, 0, CELLS);
    cr_assert(dk_dist_stall_due(stall, 2000));
    sample_four();
    text = dk_dist_stall_lines(stall, 2500, 10);
    cr_assert_not_null(text);
    dk_dist_stall_output(stall, 2600);
    cr_assert(dk_dist_stall_changed(stall, 2600), "the status must drop them now");
    cr_assert_null(dk_dist_stall_lines(stall, 2600, 10));
    cr_assert_not(dk_dist_stall_changed(stall, 2700));
}

Test(dist_stall, a_sample_asked_before_output_is_dropped)
{
    stall = dk_dist_stall_new(4, 2, 0, 0, CELLS);
    cr_assert(dk_dist_stall_due(stall, 2000));
    dk_dist_stall_output(stall, 2100);      /* a rank printed while the answers came */
    sample_four();
    cr_assert_not(dk_dist_stall_changed(stall, 2200));
    cr_assert_null(dk_dist_stall_lines(stall, 2200, 10));
}

Test(dist_stall, a_sample_without_any_rank_shows_nothing)
{
    stall = dk_dist_stall_new(2, 2, 0, 0, CELLS);
    cr_assert(dk_dist_stall_due(stall, 2000));
    const char *dumps[2] = {NULL, NULL};
    size_t lens[2] = {0, 0};
    dk_dist_stall_sampled(stall, 2, dumps, lens);
    cr_assert_null(dk_dist_stall_lines(stall, 2100, 10));
}

/* 64 ranks in 12 places: the lines given are never passed, and the last
 * says how many groups were left out. */
Test(dist_stall, many_groups_stay_within_the_lines_given)
{
    stall = dk_dist_stall_new(64, 2, 0, 0, CELLS);
    cr_assert(dk_dist_stall_due(stall, 2000));
    static char bufs[64][256];
    const char *dumps[64];
    size_t lens[64];
    for (int r = 0; r < 64; r++) {
        snprintf(bufs[r], sizeof bufs[r],
                 "Current thread 0x1 (most recent call first):\n"
                 "  File \"" CELLS "1.py\", line %d in <module>\n", 10 + r % 12);
        dumps[r] = bufs[r];
        lens[r] = strlen(bufs[r]);
    }
    dk_dist_stall_sampled(stall, 64, dumps, lens);
    for (size_t max = 1; max <= 14; max++) {
        free(text);
        text = dk_dist_stall_lines(stall, 3000, max);
        cr_assert_not_null(text);
        cr_assert_leq(lines_of(text), (int) max, "%zu lines given: %s", max, text);
    }
    free(text);
    text = dk_dist_stall_lines(stall, 3000, 4);
    cr_assert(strstr(text, "and 10 more groups (54 ranks)\n"), "%s", text);
    cr_assert_null(strstr(text, "see "), "no file to see yet: %s", text);
    free(text);
    text = dk_dist_stall_lines(stall, 3000, 1);
    cr_assert_str_eq(text, "  silent 3 s; the ranks are in 12 places (no room here to show "
                           "them)\n");
}

/* ---- in the status display ---- */

static char *where_of(void *data, size_t max_lines)
{
    return dk_dist_stall_lines(data, 75000, max_lines);
}

Test(dist_stall, the_status_shows_the_groups_above_the_logs_within_12_lines)
{
    stall = dk_dist_stall_new(4, 60, 0, 0, CELLS);
    cr_assert(dk_dist_stall_due(stall, 75000));
    sample_four();
    dk_dist_rank_t ranks[4] = {0};
    for (int r = 0; r < 4; r++)
        ranks[r] = (dk_dist_rank_t){.state = DK_RANK_RUNNING, .got_cell = true,
                                    .gpu_index = -1, .pid = 100 + r};
    dk_dist_status_t st = {.what = "4 CPU ranks", .elapsed_s = 75.0, .world = 4,
                           .ranks = ranks, .log_dir = "/l", .where = where_of,
                           .where_data = stall};
    text = dk_dist_status_text(&st);
    cr_assert_str_eq(text, "distributed: 4 CPU ranks · 75.0 s\n"
                           "  rank 0 running · rank 1 running · rank 2 running · rank 3 running\n"
                           "  silent 75 s; where the ranks are:\n"
                           "    rank 1:            cell line 6\n"
                           "    ranks 0, 2, 3 (3): torch.distributed.all_reduce  (cell line 8)\n"
                           "  logs: /l");
}

/* The status's other lines come first: the groups get what is left, and a
 * status of 1,024 ranks in hundreds of places is still 12 lines. */
Test(dist_stall, the_status_gives_the_groups_only_the_lines_it_has_left)
{
    int world = 1024;
    stall = dk_dist_stall_new(world, 60, 0, 0, CELLS);
    cr_assert(dk_dist_stall_due(stall, 75000));
    const char **dumps = calloc((size_t) world, sizeof *dumps);
    size_t *lens = calloc((size_t) world, sizeof *lens);
    char (*bufs)[256] = calloc((size_t) world, sizeof *bufs);
    dk_dist_rank_t *ranks = calloc((size_t) world, sizeof *ranks);
    const char **hosts = calloc((size_t) world, sizeof *hosts);
    static char names[128][16];
    for (int r = 0; r < world; r++) {
        snprintf(bufs[r], sizeof bufs[r],
                 "Current thread 0x1 (most recent call first):\n"
                 "  File \"" CELLS "1.py\", line %d in <module>\n", r % 300);
        dumps[r] = bufs[r];
        lens[r] = strlen(bufs[r]);
        ranks[r] = (dk_dist_rank_t){.state = r % 7 ? DK_RANK_RUNNING : DK_RANK_DONE,
                                    .got_cell = true, .gpu_index = -1, .pid = 100 + r,
                                    .running_ms = 1100};
        snprintf(names[r / 8], sizeof names[r / 8], "node%d", r / 8 + 1);
        hosts[r] = names[r / 8];
    }
    ranks[5].state = DK_RANK_FAILED;
    dk_dist_stall_sampled(stall, world, dumps, lens);
    bool shown[1024] = {false};
    shown[0] = true;
    dk_dist_status_t st = {.what = "1024 CPU ranks", .elapsed_s = 75.0, .world = world,
                           .ranks = ranks, .log_dir = "/l", .hosts = hosts, .t0_ms = 1000,
                           .output = DK_OUTPUT_LIST, .shown = shown,
                           .where = where_of, .where_data = stall};
    text = dk_dist_status_text(&st);
    cr_assert_not_null(text);
    cr_assert_leq(lines_of(text) + 1, DK_DIST_STATUS_MAX_LINES, "%s", text);
    cr_assert(strstr(text, "  silent 75 s;"), "%s", text);
    cr_assert(strstr(text, "more groups"), "%s", text);
    cr_assert(strstr(text, "\n  logs: /l"), "%s", text);
    free(dumps);
    free(lens);
    free(bufs);
    free(ranks);
    free(hosts);
}

/* GPU runs with torch's flight recorder: each group line ends in its ranks'
 * last collective, and a rank one behind is named, in the same lines. */
Test(dist_stall, the_status_shows_each_groups_last_collective)
{
    stall = dk_dist_stall_new(4, 60, 0, 0, CELLS);
    cr_assert(dk_dist_stall_due(stall, 75000));
    char reducing[512], behind[512];
    snprintf(reducing, sizeof reducing, "%s" DK_STACKS_FLIGHT
             "op=all_reduce seq=12 state=started bytes=4194304\n", REDUCING);
    snprintf(behind, sizeof behind, "%s" DK_STACKS_FLIGHT
             "op=all_reduce seq=11 state=completed bytes=4194304\n", REDUCING);
    const char *dumps[4] = {reducing, SLEEPING, behind, reducing};
    size_t lens[4];
    for (int r = 0; r < 4; r++)
        lens[r] = strlen(dumps[r]);
    dk_dist_stall_sampled(stall, 4, dumps, lens);
    text = dk_dist_stall_lines(stall, 75500, 3);
    cr_assert_str_eq(text, "  silent 76 s; where the ranks are:\n"
                           "    rank 1:            cell line 6\n"
                           "    ranks 0, 2, 3 (3): torch.distributed.all_reduce  (cell line 8)  "
                           "last all_reduce #11" DK_EN_DASH "12, 4 MiB, started; "
                           "at #11 (completed): rank 2\n");
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, dist_stall_takes_null)
{
    dk_dist_stall_destroy(NULL);
    dk_dist_stall_t *none = NULL;
    dk_dist_stall_destroy(&none);
    cr_assert_null(none);
}
