/*
 * dk_launchout: a launcher's own lines told apart from a rank's output.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "dk_launchout.h"

typedef struct {
    char rank[8192], launcher[8192];
    size_t rank_len, launcher_len;
    int launcher_calls;
    char pieces[16][8192];          /* each launcher emission, NUL-terminated */
} got_t;

static void take(void *data, dk_launchout_kind_t kind, const char *bytes, size_t len)
{
    got_t *g = data;
    cr_assert_gt(len, 0);
    if (kind == DK_LAUNCHOUT_RANK) {
        cr_assert_lt(g->rank_len + len, sizeof g->rank);
        memcpy(g->rank + g->rank_len, bytes, len);
        g->rank_len += len;
        return;
    }
    cr_assert_lt(g->launcher_len + len, sizeof g->launcher);
    memcpy(g->launcher + g->launcher_len, bytes, len);
    g->launcher_len += len;
    if (g->launcher_calls < 16)
        memcpy(g->pieces[g->launcher_calls], bytes, len < 8191 ? len : 8191);
    g->launcher_calls++;
}

/* TEXT fed in pieces of STEP bytes (0: at once), then the end. */
static got_t *split(const char *text, size_t step)
{
    got_t *g = calloc(1, sizeof *g);
    dk_launchout_t *f = dk_launchout_new();
    cr_assert_not_null(f);
    size_t len = strlen(text);
    for (size_t at = 0; at < len;) {
        size_t n = step == 0 || len - at < step ? len - at : step;
        dk_launchout_feed(f, text + at, n, take, g);
        at += n;
    }
    dk_launchout_finish(f, take, g);
    dk_launchout_destroy(&f);
    cr_assert_null(f);
    return g;
}

static const char *const MIXED =
    "srun: error: node2: task 0: Exited with exit code 1\n"
    "Traceback (most recent call last):\n"
    "slurmstepd: error: *** STEP 12.3 ON node1 CANCELLED AT 2026-12-02T01:00:00 ***\n"
    "  File \"x.py\", line 1\n"
    "slurmstepd-node-2.cluster_a: error: couldn't chdir to `/home/u/nb': No such file\n"
    "sru\n"
    "slurmstepd-: not a node name\n"
    "slurmstepd-bad name: spaces\n"
    "s\n"
    "\n"
    "srun:no space\n"
    "srun: error: node2: task 0: Killed";
static const char *const MIXED_RANK =
    "Traceback (most recent call last):\n"
    "  File \"x.py\", line 1\n"
    "sru\n"
    "slurmstepd-: not a node name\n"
    "slurmstepd-bad name: spaces\n"
    "s\n"
    "\n"
    "srun:no space\n";
static const char *const MIXED_LAUNCHER =
    "srun: error: node2: task 0: Exited with exit code 1\n"
    "slurmstepd: error: *** STEP 12.3 ON node1 CANCELLED AT 2026-12-02T01:00:00 ***\n"
    "slurmstepd-node-2.cluster_a: error: couldn't chdir to `/home/u/nb': No such file\n"
    "srun: error: node2: task 0: Killed";

Test(launchout, launcher_lines_are_told_from_the_ranks_however_the_bytes_are_split)
{
    for (size_t step = 0; step <= 9; step++) {
        got_t *g = split(MIXED, step);
        g->rank[g->rank_len] = g->launcher[g->launcher_len] = '\0';
        cr_expect_str_eq(g->rank, MIXED_RANK, "pieces of %zu", step);
        cr_expect_str_eq(g->launcher, MIXED_LAUNCHER, "pieces of %zu", step);
        /* Whole lines, one call each, the unfinished last one at the end. */
        cr_expect_eq(g->launcher_calls, 4, "pieces of %zu", step);
        cr_expect_str_eq(g->pieces[3], "srun: error: node2: task 0: Killed");
        free(g);
    }
}

Test(launchout, a_ranks_bytes_are_passed_on_before_their_newline)
{
    got_t g = {0};
    dk_launchout_t *f = dk_launchout_new();
    dk_launchout_feed(f, "Epoch 1: 50%", 12, take, &g);
    cr_expect_eq(g.rank_len, 12, "a partial line of the rank was held");
    dk_launchout_feed(f, "\nslurmst", 8, take, &g);
    cr_expect_eq(g.rank_len, 13, "a possible launcher prefix was let through");
    dk_launchout_feed(f, "epd: error: x\n", 14, take, &g);
    cr_expect_eq(g.rank_len, 13);
    cr_expect_eq(g.launcher_len, strlen("slurmstepd: error: x\n"));
    dk_launchout_destroy(&f);
}

Test(launchout, a_start_that_never_became_a_launcher_line_is_the_ranks_at_the_end)
{
    got_t *g = split("slurmstepd-node1", 0);
    cr_expect_eq(g->rank_len, strlen("slurmstepd-node1"));
    cr_expect_eq(g->launcher_len, 0);
    free(g);
}

/* Launcher bytes and calls, counted: for lines larger than got_t holds. */
static size_t counted_bytes, counted_rank;
static int counted_calls;

static void count(void *data, dk_launchout_kind_t kind, const char *bytes, size_t len)
{
    (void) data;
    cr_assert_leq(len, DK_LAUNCHOUT_LINE_MAX);
    if (kind == DK_LAUNCHOUT_RANK) {
        counted_rank += len;
        return;
    }
    if (counted_calls == 0)
        cr_expect_eq(memcmp(bytes, "srun: ", 6), 0, "the first piece starts with the prefix");
    counted_bytes += len;
    counted_calls++;
}

Test(launchout, an_overlong_launcher_line_comes_in_pieces_of_bounded_size)
{
    size_t n = 3 * DK_LAUNCHOUT_LINE_MAX;
    char *text = malloc(n + 8);
    memcpy(text, "srun: ", 6);
    memset(text + 6, 'x', n - 6);
    memcpy(text + n, "\nok\n", 4);
    dk_launchout_t *f = dk_launchout_new();
    dk_launchout_feed(f, text, n + 4, count, NULL);
    dk_launchout_finish(f, count, NULL);
    cr_expect_eq(counted_bytes, n + 1);
    cr_expect_eq(counted_calls, 4);
    cr_expect_eq(counted_rank, 3, "the line after it is the rank's");
    dk_launchout_destroy(&f);
    free(text);
}

Test(launchout, only_lines_that_say_more_than_the_exit_status_tell)
{
    static const char *const tells[] = {
        "srun: error: node2: task 0: Killed\n",
        "srun: error: node2: task 0: Segmentation fault",
        "srun: error: Node failure on node2",
        "slurmstepd: error: *** STEP 12.3 ON node1 CANCELLED AT 2026-12-02T01:00:00 ***",
        "slurmstepd-node1: error: Detected 1 oom_kill event in StepId=12.3.",
        "srun: error: Unable to create step for job 12: Invalid generic resource (gres) "
        "specification", NULL};
    static const char *const not[] = {
        "srun: error: node2: task 0: Exited with exit code 1\n",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.",
        "srun: launch/slurm: _step_signal: Terminating StepId=12.3",
        "srun: forcing job termination", "srun: ", "srun: \n",
        "Traceback (most recent call last):", "", NULL};
    for (int i = 0; tells[i]; i++)
        cr_expect(dk_launchout_tells(tells[i], strlen(tells[i])), "%s", tells[i]);
    for (int i = 0; not[i]; i++)
        cr_expect_not(dk_launchout_tells(not[i], strlen(not[i])), "%s", not[i]);
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, launchout_takes_null)
{
    dk_launchout_destroy(NULL);
    dk_launchout_t *none = NULL;
    dk_launchout_destroy(&none);
    cr_assert_null(none);
}
