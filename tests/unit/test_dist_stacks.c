/*
 * Where the ranks of an ended run were (distributed/dk_dist_stacks.h), from
 * made-up dumps: the summary the error shows, and stacks.txt with every
 * asked rank, none of the others.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dk_dist_stacks.h"

#define CELLS "/tmp/distkernel-cells-1-x/"

static const char *SLEEPING =
    "Current thread 0x00007f0be2e1d740 (most recent call first):\n"
    "  File \"" CELLS "1.py\", line 6 in <module>\n"
    "  File \"/usr/share/distkernel/python/distkernel/_rank.py\", line 43 in _run_cell\n";
static const char *REDUCING =
    "Current thread 0x00007f0be2e1d740 (most recent call first):\n"
    "  File \"/usr/lib/python3/dist-packages/torch/distributed/distributed_c10d.py\", "
    "line 1541 in all_reduce\n"
    "  File \"" CELLS "1.py\", line 7 in <module>\n";

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/test-dist-stacks-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, DK_DIST_STACKS_FILE);
    unlink(path);
    rmdir(dir);
}

TestSuite(dist_stacks, .init = setup, .fini = teardown);

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

Test(dist_stacks, the_odd_rank_first_and_every_asked_rank_in_the_file)
{
    const char *dumps[4] = {REDUCING, SLEEPING, REDUCING, NULL};
    size_t lens[4] = {strlen(REDUCING), strlen(SLEEPING), strlen(REDUCING), 0};
    char file[256], err[256];
    char *summary = dk_dist_stacks_report(4, dumps, lens, NULL, CELLS, dir, file, sizeof file,
                                          err, sizeof err);
    cr_assert_not_null(summary, "%s", err);
    cr_assert_str_eq(err, "");
    cr_assert_str_eq(summary, "  rank 1:         cell line 6\n"
                              "  ranks 0, 2 (2): torch.distributed.all_reduce  (cell line 7)\n");
    char want[128];
    snprintf(want, sizeof want, "%s/%s", dir, DK_DIST_STACKS_FILE);
    cr_assert_str_eq(file, want);
    const char *text = slurp(file);
    cr_assert_not_null(strstr(text, "--- rank 0 on localhost ---"), "%s", text);
    cr_assert_not_null(strstr(text, "--- rank 1 on localhost ---"), "%s", text);
    cr_assert_not_null(strstr(text, "--- rank 2 on localhost ---"), "%s", text);
    cr_assert_null(strstr(text, "rank 3"), "rank 3 was not asked:\n%s", text);
    free(summary);
}

Test(dist_stacks, no_rank_asked_no_summary_no_file)
{
    const char *dumps[2] = {NULL, NULL};
    size_t lens[2] = {0, 0};
    char file[256], err[256];
    cr_assert_null(dk_dist_stacks_report(2, dumps, lens, NULL, CELLS, dir, file, sizeof file,
                                         err, sizeof err));
    cr_assert_str_eq(err, "");
    cr_assert_str_eq(file, "");
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, DK_DIST_STACKS_FILE);
    cr_assert_neq(access(path, F_OK), 0);
}

Test(dist_stacks, a_rank_that_did_not_answer_has_no_python_stack)
{
    const char *dumps[2] = {"", SLEEPING};
    size_t lens[2] = {0, strlen(SLEEPING)};
    char file[256], err[256];
    char *summary = dk_dist_stacks_report(2, dumps, lens, NULL, CELLS, dir, file, sizeof file,
                                          err, sizeof err);
    cr_assert_not_null(summary);
    cr_assert_not_null(strstr(summary, "rank 0: "), "%s", summary);
    cr_assert_not_null(strstr(summary, "no Python stack"), "%s", summary);
    free(summary);
}

Test(dist_stacks, an_unwritable_folder_still_gives_the_summary_and_says_why)
{
    const char *dumps[1] = {SLEEPING};
    size_t lens[1] = {strlen(SLEEPING)};
    char file[256], err[256];
    char *summary = dk_dist_stacks_report(1, dumps, lens, NULL, CELLS, "/nonexistent/run-1", file,
                                          sizeof file, err, sizeof err);
    cr_assert_not_null(summary);
    cr_assert_str_eq(file, "");
    cr_assert_not_null(strstr(err, "cannot write /nonexistent/run-1/stacks.txt"), "%s", err);
    cr_assert_str_eq(summary, "  rank 0: cell line 6\n");
    free(summary);
}
