/*
 * What the user is told about a run that did not end well
 * (distributed/dk_dist_outcome.h), from made-up ranks: the error's ename,
 * evalue and traceback lines, word for word as the e2e tests see them.
 */
#include <criterion/criterion.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "dk_dist_outcome.h"
#include "dk_lost.h"

#include <stdlib.h>
#include <unistd.h>

#define RED "\x1b[0;31m"
#define RESET "\x1b[0m"

static dk_dist_rank_t ranks[4];
static dk_dist_outcome_t o;
static json_t *error;

static void setup(void)
{
    memset(ranks, 0, sizeof ranks);
    for (int r = 0; r < 4; r++) {
        ranks[r] = (dk_dist_rank_t){.state = DK_RANK_STOPPED, .got_cell = true,
                                    .log_complete = true, .gpu_index = -1};
    }
    o = (dk_dist_outcome_t){.end = DK_END_FAILED, .root = -1, .log_dir = "/logs/run-1",
                            .world = 2, .ranks = ranks};
    error = NULL;
}

static void teardown(void)
{
    json_decref(error);
}

TestSuite(outcome, .init = setup, .fini = teardown);

static const char *ERROR_MSG =
    "{\"ename\": \"ValueError\", \"evalue\": \"bad shape\","
    " \"traceback\": [\"Traceback (most recent call last):\", \"  File x\", \"ValueError: bad shape\"]}";

static void raised(int r)
{
    ranks[r].state = DK_RANK_FAILED;
    ranks[r].is_error = true;
    ranks[r].message = (void *)ERROR_MSG;
    ranks[r].message_len = strlen(ERROR_MSG);
    ranks[r].exit_code = 1;
}

static const char *field(const char *key)
{
    return json_string_value(json_object_get(error, key));
}

static const char *line(size_t i)
{
    json_t *tb = json_object_get(error, "traceback");
    cr_assert(i < json_array_size(tb), "the traceback has %zu lines, not %zu",
              json_array_size(tb), i + 1);
    return json_string_value(json_array_get(tb, i));
}

static size_t lines(void)
{
    return json_array_size(json_object_get(error, "traceback"));
}

static void build(bool headline)
{
    error = dk_dist_outcome_error(&o, headline);
    cr_assert_not_null(error);
}

Test(outcome, a_rank_that_raised_is_the_root_cause_with_its_traceback)
{
    raised(1);
    o.root = 1;
    build(false);
    cr_assert_str_eq(field("ename"), "ValueError");
    cr_assert_str_eq(field("evalue"), "[rank 1] bad shape");
    const char *want[] = {"Rank 1 failed first (root cause):",
                          "Traceback (most recent call last):",
                          "  File x",
                          "ValueError: bad shape",
                          "",
                          "Ranks:",
                          "  rank 0: ended by distkernel after rank 1 failed",
                          "  rank 1: raised ValueError: bad shape   <- root cause (first failure)",
                          "Full output of every rank: /logs/run-1/rank-N.log"};
    cr_assert_eq(lines(), sizeof want / sizeof want[0]);
    for (size_t i = 0; i < lines(); i++)
        cr_assert_str_eq(line(i), want[i], "line %zu", i);
}

Test(outcome, the_headline_comes_first_then_a_blank_line)
{
    raised(0);
    o.root = 0;
    build(true);
    cr_assert_str_eq(line(0), RED "ValueError" RESET ": [rank 0] bad shape");
    cr_assert_str_eq(line(1), "");
    cr_assert_str_eq(line(2), "Rank 0 failed first (root cause):");
}

Test(outcome, the_headline_of_a_rank_without_traceback_has_one_blank_line_after_it)
{
    ranks[1] = (dk_dist_rank_t){.state = DK_RANK_FAILED, .exit_code = 3, .got_cell = true,
                                .log_complete = true};
    o.root = 1;
    build(true);
    cr_assert_str_eq(line(0), RED "RankExited" RESET
                     ": rank 1: exited with code 3 before returning a result");
    cr_assert_str_eq(line(1), "");
    cr_assert_str_eq(line(2), "Ranks:");
}

Test(outcome, without_headline_there_is_none)
{
    raised(0);
    o.root = 0;
    build(false);
    cr_assert_str_eq(line(0), "Rank 0 failed first (root cause):");
}

Test(outcome, a_rank_killed_by_a_signal_is_named_with_the_signal)
{
    ranks[1] = (dk_dist_rank_t){.state = DK_RANK_FAILED, .exit_code = -1,
                                .term_signal = SIGSEGV, .got_cell = true, .log_complete = true};
    o.root = 1;
    build(false);
    cr_assert_str_eq(field("ename"), "RankKilled");
    char want[128];
    snprintf(want, sizeof want, "rank 1: killed by signal %d (SIGSEGV)", SIGSEGV);
    cr_assert_str_eq(field("evalue"), want);
    strcat(want, "   <- root cause (first failure)");
    cr_assert_str_eq(line(3) + 2, want);
}

Test(outcome, sigkill_suggests_the_out_of_memory_killer)
{
    ranks[0] = (dk_dist_rank_t){.state = DK_RANK_FAILED, .exit_code = -1,
                                .term_signal = SIGKILL, .got_cell = true, .log_complete = true};
    o.root = 0;
    build(false);
    cr_assert_str_eq(field("evalue"), "rank 0: killed by signal 9 (SIGKILL), often the "
                                      "out-of-memory killer (see dmesg)");
}

Test(outcome, an_unknown_signal_is_a_signal)
{
    ranks[0] = (dk_dist_rank_t){.state = DK_RANK_FAILED, .term_signal = 63, .got_cell = true,
                                .log_complete = true};
    o.root = 0;
    build(false);
    cr_assert_str_eq(field("evalue"), "rank 0: killed by signal 63 (a signal)");
}

Test(outcome, an_exit_code_before_the_cell_says_start_up)
{
    ranks[1] = (dk_dist_rank_t){.state = DK_RANK_FAILED, .exit_code = 3, .got_cell = false,
                                .log_complete = true};
    o.root = 1;
    build(false);
    cr_assert_str_eq(field("ename"), "RankExited");
    cr_assert_str_eq(field("evalue"),
                     "rank 1: exited with code 3 during start-up, before it received the cell");
}

Test(outcome, an_exit_without_result_says_so)
{
    ranks[0] = (dk_dist_rank_t){.state = DK_RANK_FAILED, .exit_code = 0, .got_cell = true,
                                .log_complete = true};
    o.root = 0;
    build(false);
    cr_assert_str_eq(field("evalue"), "rank 0: exited without returning a result");
}

Test(outcome, interrupted)
{
    o.end = DK_END_CANCELLED;
    o.interrupted = true;
    ranks[1].term_signal = SIGKILL;
    build(true);
    cr_assert_str_eq(field("ename"), "KeyboardInterrupt");
    cr_assert_str_eq(field("evalue"), "interrupted: every rank was ended");
    cr_assert_str_eq(line(0), RED "KeyboardInterrupt" RESET ": interrupted: every rank was ended");
    cr_assert_str_eq(line(1), "");
    cr_assert_str_eq(line(2), "Ranks:");
    cr_assert_str_eq(line(3), "  rank 0: ended by distkernel (interrupted)");
    cr_assert_str_eq(line(4), "  rank 1: ended by distkernel (interrupted); it outlived SIGINT "
                              "and SIGTERM and was killed with SIGKILL");
}

Test(outcome, kernel_shutting_down)
{
    o.end = DK_END_CANCELLED;
    o.shutdown = true;
    build(false);
    cr_assert_str_eq(field("ename"), "KernelShutdown");
    cr_assert_str_eq(field("evalue"), "the kernel is shutting down: every rank was ended");
    cr_assert_str_eq(line(2), "  rank 0: ended by distkernel (kernel shutting down)");
}

Test(outcome, timeout)
{
    o.end = DK_END_TIMEOUT;
    o.timeout_s = 2.5;
    build(false);
    cr_assert_str_eq(field("ename"), "TimeoutError");
    cr_assert_str_eq(field("evalue"), "the job ran past timeout=2.5 s and every rank was ended; "
                                      "give a larger timeout= or timeout=None");
    cr_assert_str_eq(line(2), "  rank 0: ended by distkernel (timeout)");
}

/* A timeout cut to end before the Slurm allocation's time limit says so, and
 * what to ask Slurm for (the 1-minute allocations of test_slurm_runs.py and
 * test_slurm_pool.py run it end to end, in the default build only). */
Test(outcome, a_timeout_cut_to_the_allocations_time_limit_says_why)
{
    o.end = DK_END_TIMEOUT;
    o.timeout_s = 49.6;
    o.timeout_cut = true;
    build(false);
    cr_assert_str_eq(field("ename"), "TimeoutError");
    cr_assert_str_eq(field("evalue"), "the job ran past 50 s, all its Slurm allocation had left "
                                      "of its time limit, and every rank was ended; ask Slurm "
                                      "for more time (a partition with a longer MaxTime, or "
                                      "slurm_args='--time=...' where the site allows it)");
    cr_assert_str_eq(line(2), "  rank 0: ended by distkernel (timeout)");

    o.kept = true;      /* started ranks: interrupted, and Slurm ends them at the limit */
    json_decref(error);
    build(false);
    cr_assert_str_eq(field("evalue"), "the cell ran past 50 s, all the started ranks' Slurm "
                                      "allocation had left of its time limit, and every rank "
                                      "was interrupted; Slurm ends the ranks at that limit");
}

Test(outcome, a_finished_rank_is_finished)
{
    ranks[0].state = DK_RANK_DONE;
    raised(1);
    o.root = 1;
    build(false);
    cr_assert_str_eq(line(6), "  rank 0: finished");
}

Test(outcome, logs_cut_short_by_a_full_disk_are_named)
{
    o.world = 4;
    o.end = DK_END_TIMEOUT;
    ranks[0].log_complete = false;
    ranks[2].log_complete = false;
    build(false);
    cr_assert_str_eq(line(lines() - 1), "Full output of every rank: /logs/run-1/rank-N.log "
                                        "(cut short, the disk refused writes: rank 0, 2)");
}

Test(outcome, capped_logs_are_named)
{
    o.end = DK_END_TIMEOUT;
    ranks[1].log_capped = true;
    build(false);
    cr_assert_str_eq(line(lines() - 1), "Full output of every rank: /logs/run-1/rank-N.log "
                                        "(head and tail only, past log_cap: rank 1)");
}

Test(outcome, cut_short_and_capped_are_both_named)
{
    o.end = DK_END_TIMEOUT;
    ranks[0].log_capped = true;
    ranks[1].log_complete = false;
    build(false);
    cr_assert_str_eq(line(lines() - 1), "Full output of every rank: /logs/run-1/rank-N.log "
                                        "(cut short, the disk refused writes: rank 1)"
                                        " (head and tail only, past log_cap: rank 0)");
}

Test(outcome, a_fate_can_be_asked_alone)
{
    raised(0);
    char fate[256];
    dk_dist_outcome_fate(&o, 0, 0, fate, sizeof fate);
    cr_assert_str_eq(fate, "rank 0: raised ValueError: bad shape   <- root cause (first failure)");
    dk_dist_outcome_fate(&o, 1, 0, fate, sizeof fate);
    cr_assert_str_eq(fate, "rank 1: ended by distkernel after rank 0 failed");
}

/* ---- cells on started ranks (%distributed start) ---------------------------------- */

Test(outcome, an_interrupted_cell_on_started_ranks_says_they_still_run)
{
    o.end = DK_END_CANCELLED;
    o.interrupted = true;
    o.kept = true;
    ranks[0].state = DK_RANK_DONE;
    build(false);
    cr_assert_str_eq(field("ename"), "KeyboardInterrupt");
    cr_assert_str_eq(field("evalue"), "interrupted: every rank raised KeyboardInterrupt; the "
                                      "started ranks are still running");
    cr_assert_str_eq(line(2), "  rank 0: finished");
    cr_assert_str_eq(line(3), "  rank 1: interrupted (KeyboardInterrupt; still running)");
}

Test(outcome, a_timed_out_cell_on_started_ranks_says_they_still_run)
{
    o.end = DK_END_TIMEOUT;
    o.timeout_s = 2;
    o.kept = true;
    build(false);
    cr_assert_str_eq(field("ename"), "TimeoutError");
    cr_assert_str_eq(field("evalue"), "the cell ran past timeout=2 s and every rank was "
                                      "interrupted; the started ranks are still running");
    cr_assert_str_eq(line(2), "  rank 0: interrupted (timeout; still running)");
}

Test(outcome, an_exception_on_started_ranks_names_the_root_and_the_interrupted)
{
    raised(1);
    o.root = 1;
    o.kept = true;
    build(false);
    cr_assert_str_eq(field("ename"), "ValueError");
    cr_assert_str_eq(field("evalue"), "[rank 1] bad shape");
    size_t n = json_array_size(json_object_get(error, "traceback"));
    bool found = false;
    for (size_t i = 0; i < n; i++)
        found = found || strcmp(line(i), "  rank 0: interrupted after rank 1 failed (still "
                                         "running)") == 0;
    cr_assert(found, "no line for rank 0's interrupt");
}

Test(outcome, started_ranks_that_ended_during_the_cell_say_how_to_start_again)
{
    o.end = DK_END_FAILED;
    o.root = 0;
    o.pool_gone = true;
    ranks[0] = (dk_dist_rank_t){.state = DK_RANK_FAILED, .exit_code = 3, .got_cell = true,
                                .log_complete = true};
    build(false);
    size_t n = json_array_size(json_object_get(error, "traceback"));
    cr_assert_str_eq(line(n - 1), "The started ranks have ended; %distributed start starts "
                                  "new ones (their variables are lost).");
}

Test(outcome, ranks_ended_for_being_idle)
{
    o.end = DK_END_IDLE;
    build(false);
    cr_assert_str_eq(field("evalue"), "the started ranks were idle past idle_timeout and ended");
    cr_assert_str_eq(line(2), "  rank 0: ended by distkernel (idle_timeout)");
}

/* Ranks on other nodes: RANKS_PER_NODE each on node1, node2, ...; the ranks
 * in LOST (ending with -1) went silent. */
static dk_dist_rank_t big[12];
static void nodes_lost(int world, int ranks_per_node, const int *lost)
{
    static char names[12][16];
    for (int r = 0; r < world; r++) {
        snprintf(names[r], sizeof names[r], "node%d", r / ranks_per_node + 1);
        big[r] = (dk_dist_rank_t){.state = DK_RANK_STOPPED, .got_cell = true,
                                  .log_complete = true, .gpu_index = -1, .host = names[r]};
    }
    for (int i = 0; lost[i] >= 0; i++) {
        big[lost[i]].state = DK_RANK_FAILED;
        big[lost[i]].lost = true;
    }
    o.world = world;
    o.ranks = big;
    o.root = lost[0];
}

Test(outcome, a_lost_node_is_named_with_its_ranks_as_a_range)
{
    nodes_lost(12, 4, (const int[]){5, 4, 6, 7, -1});
    build(true);
    cr_assert_str_eq(field("ename"), "NodeLost");
    cr_assert_str_eq(field("evalue"), "node2 lost (ranks 4–7)");
    cr_assert_str_eq(line(0), RED "NodeLost" RESET ": node2 lost (ranks 4–7)");
    cr_assert_str_eq(line(1), "");
    cr_assert_str_eq(line(2), "node2 lost (ranks 4–7)");
    cr_assert(strstr(line(3), "heartbeat deadline"), "%s", line(3));
    /* Twelve ranks: one line per fate, the root cause's first. */
    cr_assert_str_eq(line(6), "  rank 5: lost with node2 (nothing heard from it past the "
                              "heartbeat deadline)   <- root cause (first failure)");
    cr_assert_str_eq(line(7), "  ranks 0" DK_EN_DASH "3, 8" DK_EN_DASH "11 (8): ended by "
                              "distkernel after rank 5 failed");
    cr_assert_str_eq(line(8), "  ranks 4, 6" DK_EN_DASH "7 (3): lost with node2 (nothing "
                              "heard from it past the heartbeat deadline)");
}

Test(outcome, several_lost_nodes_get_one_clause_and_one_line_each)
{
    nodes_lost(12, 4, (const int[]){8, 4, 5, 7, -1});
    build(false);
    cr_assert_str_eq(field("evalue"), "node2 lost (ranks 4–5, 7); node3 lost (rank 8)");
    cr_assert_str_eq(line(0), "node2 lost (ranks 4–5, 7)");
    cr_assert_str_eq(line(1), "node3 lost (rank 8)");
    cr_assert(strstr(line(2), "heartbeat deadline"), "%s", line(2));
}

Test(outcome, a_lost_rank_after_another_root_cause_keeps_that_root)
{
    nodes_lost(8, 4, (const int[]){6, -1});
    big[1].state = DK_RANK_FAILED;
    big[1].is_error = true;
    big[1].message = (void *)ERROR_MSG;
    big[1].message_len = strlen(ERROR_MSG);
    o.root = 1;
    build(false);
    cr_assert_str_eq(field("ename"), "ValueError");
    bool said = false;
    for (size_t i = 0; i < lines(); i++)
        said |= !strcmp(line(i), "  rank 6: lost with node2 (nothing heard from it past the "
                                 "heartbeat deadline)");
    cr_assert(said, "rank 6's fate does not say it was lost");
}

/* A node cut off mid-collective: its peers' connections fail
 * before the heartbeat deadline tells the loss, so the first failure is a
 * rank of a node that was not lost, without a Python error. The node leads. */
Test(outcome, a_lost_node_leads_the_error_when_the_first_failure_is_no_python_error)
{
    nodes_lost(4, 2, (const int[]){2, 3, -1});
    big[0].state = DK_RANK_FAILED;
    big[0].exit_code = 143;
    o.root = 0;
    build(false);
    cr_assert_str_eq(field("ename"), "NodeLost");
    cr_assert_str_eq(field("evalue"), "node2 lost (ranks 2–3)");
    bool said = false;
    for (size_t i = 0; i < lines(); i++)
        said |= strstr(line(i), "rank 0: exited with code 143") != NULL;
    cr_assert(said, "rank 0's own fate is not listed");
}

Test(outcome, a_rank_that_raised_or_was_lost_keeps_its_own_words)
{
    raised(0);
    ranks[1] = (dk_dist_rank_t){.state = DK_RANK_FAILED, .exit_code = 1, .got_cell = true,
                                .log_complete = true, .lost = true, .host = "node2"};
    char fate[2048];
    dk_dist_outcome_fate(&o, 0, -1, fate, sizeof fate);
    cr_assert_str_eq(fate, "rank 0: raised ValueError: bad shape");
    dk_dist_outcome_fate(&o, 1, -1, fate, sizeof fate);
    cr_assert_str_eq(fate, "rank 1: lost with node2 (nothing heard from it past the heartbeat "
                           "deadline)");
}

/* ---- at any world size: fates grouped, the error bounded ---------------------------- */

/* WORLD ranks (freed by the test's teardown), every one ended by distkernel;
 * HOSTS_PER_NODE ranks on each of node1, node2, ... (0: all on this node). */
static dk_dist_rank_t *many;
static char (*many_hosts)[16];

static void world_of(int world, int ranks_per_node)
{
    many = calloc((size_t) world, sizeof *many);
    many_hosts = calloc((size_t) world, sizeof *many_hosts);
    cr_assert(many && many_hosts);
    for (int r = 0; r < world; r++) {
        many[r] = (dk_dist_rank_t){.state = DK_RANK_STOPPED, .got_cell = true,
                                   .log_complete = true, .gpu_index = -1};
        if (ranks_per_node) {
            snprintf(many_hosts[r], sizeof many_hosts[r], "node%d", r / ranks_per_node + 1);
            many[r].host = many_hosts[r];
        }
    }
    o.world = world;
    o.ranks = many;
}

static void many_raised(int r, const char *message)
{
    many[r].state = DK_RANK_FAILED;
    many[r].is_error = true;
    many[r].message = (void *) message;
    many[r].message_len = strlen(message);
    many[r].exit_code = 1;
}

static void free_world(void)
{
    free(many);
    free(many_hosts);
    many = NULL;
    many_hosts = NULL;
}

/* The lines of the error besides the root cause's own traceback (3 lines). */
static size_t bounded_lines(void)
{
    return lines() - (o.root >= 0 && o.ranks[o.root].is_error ? 3 : 0);
}

static bool has_line(const char *want)
{
    for (size_t i = 0; i < lines(); i++)
        if (!strcmp(line(i), want))
            return true;
    return false;
}

static void dump(void)
{
    for (size_t i = 0; i < lines(); i++)
        fprintf(stderr, "%2zu|%s\n", i, line(i));
}

Test(outcome, eight_ranks_keep_a_line_each, .fini = free_world)
{
    world_of(8, 0);
    many_raised(3, ERROR_MSG);
    o.root = 3;
    build(false);
    cr_assert(has_line("  rank 0: ended by distkernel after rank 3 failed"));
    cr_assert(has_line("  rank 7: ended by distkernel after rank 3 failed"));
    cr_assert_eq(lines(), 4 + 2 + 8 + 1);
}

Test(outcome, nine_ranks_are_grouped_by_fate_the_root_cause_first, .fini = free_world)
{
    world_of(9, 0);
    many_raised(4, ERROR_MSG);
    many[8].state = DK_RANK_DONE;
    o.root = 4;
    o.ranks_file = "/logs/run-1/ranks.txt";
    build(true);
    const char *want[] = {
        RED "ValueError" RESET ": [rank 4] bad shape",
        "",
        "Rank 4 failed first (root cause):",
        "Traceback (most recent call last):",
        "  File x",
        "ValueError: bad shape",
        "",
        "Ranks:",
        "  rank 4: raised ValueError: bad shape   <- root cause (first failure)",
        "  ranks 0" DK_EN_DASH "3, 5" DK_EN_DASH "7 (7): ended by distkernel after rank 4 failed",
        "  rank 8: finished",
        "Every rank's fate, one line each: /logs/run-1/ranks.txt",
        "Full output of every rank: /logs/run-1/rank-N.log"};
    if (lines() != sizeof want / sizeof want[0])
        dump();
    cr_assert_eq(lines(), sizeof want / sizeof want[0]);
    for (size_t i = 0; i < lines(); i++)
        cr_assert_str_eq(line(i), want[i], "line %zu", i);
}

Test(outcome, the_issues_256_ranks_read_in_a_few_lines, .fini = free_world)
{
    world_of(256, 16);
    many[152] = (dk_dist_rank_t){.state = DK_RANK_FAILED, .exit_code = 1, .got_cell = false,
                                 .log_complete = true, .host = many_hosts[152]};
    o.root = 152;
    build(false);
    cr_assert_str_eq(field("ename"), "RankExited");
    cr_assert(has_line("  rank 152: exited with code 1 during start-up, before it received the "
                       "cell   <- root cause (first failure)"));
    cr_assert(has_line("  ranks 0" DK_EN_DASH "151, 153" DK_EN_DASH "255 (255): ended by "
                       "distkernel after rank 152 failed"));
    cr_assert_leq(lines(), 6);
}

Test(outcome, the_root_cause_names_its_node, .fini = free_world)
{
    world_of(256, 16);
    many_raised(152, ERROR_MSG);
    o.root = 152;
    build(false);
    cr_assert_str_eq(line(0), "Rank 152 on node10 failed first (root cause):");
}

/* Every rank raising words of its own: as many fates as ranks. */
static char (*own_words)[160];

static void each_its_own(int world)
{
    own_words = calloc((size_t) world, sizeof *own_words);
    for (int r = 0; r < world; r++) {
        snprintf(own_words[r], sizeof own_words[r],
                 "{\"ename\": \"ValueError\", \"evalue\": \"rank %d is odd\", "
                 "\"traceback\": [\"a\", \"b\", \"c\"]}", r);
        many_raised(r, own_words[r]);
    }
}

static void free_all(void)
{
    free_world();
    free(own_words);
    own_words = NULL;
}

Test(outcome, at_every_size_the_error_stays_within_forty_lines, .fini = free_all)
{
    int sizes[] = {1, 2, 8, 9, 64, 256, 1024, 4096};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        int world = sizes[k];
        /* Mixed: a root cause, finished ranks, ended ones, killed ones, a lost node. */
        world_of(world, 8);
        for (int r = 0; r < world; r++) {
            if (r % 5 == 1)
                many[r].state = DK_RANK_DONE;
            else if (r % 7 == 2)
                many[r] = (dk_dist_rank_t){.state = DK_RANK_FAILED, .exit_code = -1,
                                           .term_signal = SIGKILL, .got_cell = true,
                                           .log_complete = true, .host = many_hosts[r]};
            else if (r >= 16 && r < 24)
                many[r].lost = true, many[r].state = DK_RANK_FAILED;
        }
        many_raised(world - 1, ERROR_MSG);
        o.root = world - 1;
        o.ranks_file = "/logs/run-1/ranks.txt";
        build(true);
        cr_assert_leq(bounded_lines(), DK_DIST_OUTCOME_MAX_LINES, "%d ranks: %zu lines", world,
                      bounded_lines());
        json_decref(error);
        error = NULL;
        free_world();

        /* Each rank its own words: the fates left over share a last line. */
        world_of(world, 0);
        each_its_own(world);
        o.root = 0;
        build(false);
        cr_assert_leq(bounded_lines(), DK_DIST_OUTCOME_MAX_LINES, "%d ranks: %zu lines", world,
                      bounded_lines());
        if (world > DK_DIST_OUTCOME_MAX_LINES) {
            /* 4 lines of root cause, a blank, "Ranks:", the groups shown,
             * the rest, the ranks file, the logs. */
            const char *last = line(lines() - 3);
            cr_assert(strstr(last, " other fates; every rank's is in the file below"), "%s", last);
            char count[32];
            snprintf(count, sizeof count, "(%d): ", world - (int) (lines() - 9));
            cr_assert(strstr(last, count), "%s lacks %s", last, count);
        }
        json_decref(error);
        error = NULL;
        free_all();
    }
}

Test(outcome, many_lost_nodes_end_in_one_host_list, .fini = free_world)
{
    world_of(1024, 8);
    for (int r = 64; r < 64 + 16 * 8; r++) {
        many[r].lost = true;
        many[r].state = DK_RANK_FAILED;
    }
    o.root = 64;
    build(false);
    cr_assert_str_eq(field("ename"), "NodeLost");
    cr_assert_str_eq(field("evalue"), "16 nodes lost (128 ranks): node[9-24]");
    cr_assert_str_eq(line(0), "node9 lost (ranks 64" DK_EN_DASH "71)");
    cr_assert_str_eq(line(6), "node15 lost (ranks 112" DK_EN_DASH "119)");
    cr_assert_str_eq(line(7), "\xe2\x80\xa6; in all, 16 nodes lost (128 ranks): node[9-24]");
    cr_assert(strstr(line(8), "heartbeat deadline"), "%s", line(8));
    cr_assert_leq(lines(), DK_DIST_OUTCOME_MAX_LINES);
}

Test(outcome, eight_lost_nodes_get_a_line_each, .fini = free_world)
{
    world_of(128, 8);
    for (int r = 0; r < 64; r++) {
        many[r].lost = true;
        many[r].state = DK_RANK_FAILED;
    }
    o.root = 0;
    build(false);
    cr_assert_str_eq(line(7), "node8 lost (ranks 56" DK_EN_DASH "63)");
    cr_assert(strstr(line(8), "heartbeat deadline"), "%s", line(8));
    cr_assert(strstr(field("evalue"), "; node8 lost (ranks 56" DK_EN_DASH "63)"), "%s",
              field("evalue"));
}

Test(outcome, lost_nodes_past_what_a_line_holds_end_in_an_ellipsis, .fini = free_world)
{
    world_of(4096, 1);
    for (int r = 0; r < 4096; r += 2) {
        many[r].lost = true;
        many[r].state = DK_RANK_FAILED;
    }
    o.root = 0;
    build(false);
    const char *all = line(7);
    cr_assert(!strncmp(all, "\xe2\x80\xa6; in all, 2048 nodes lost (2048 ranks): node[1,3,5,",
                       strlen("\xe2\x80\xa6; in all, 2048 nodes lost (2048 ranks): node[1,3,5,")),
              "%s", all);
    cr_assert_leq(strlen(all), 400);
    cr_assert(!strcmp(all + strlen(all) - 3, "\xe2\x80\xa6"), "%s", all);
    cr_assert_leq(bounded_lines(), DK_DIST_OUTCOME_MAX_LINES);
}

Test(outcome, logs_not_whole_are_named_as_runs, .fini = free_world)
{
    world_of(256, 0);
    o.end = DK_END_TIMEOUT;
    for (int r = 0; r < 100; r++)
        many[r].log_complete = false;
    many[200].log_capped = true;
    build(false);
    cr_assert_str_eq(line(lines() - 1), "Full output of every rank: /logs/run-1/rank-N.log "
                                        "(cut short, the disk refused writes: rank 0" DK_EN_DASH
                                        "99) (head and tail only, past log_cap: rank 200)");
}

Test(outcome, every_fate_is_written_one_line_per_rank, .fini = free_world)
{
    world_of(300, 0);
    many_raised(152, ERROR_MSG);
    many[7].state = DK_RANK_DONE;
    o.root = 152;
    char path[] = "/tmp/dk-fates-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
    char err[256] = "";
    cr_assert_eq(dk_dist_outcome_write_fates(&o, path, err, sizeof err), 0, "%s", err);
    FILE *f = fopen(path, "r");
    char text[512];
    int n = 0;
    while (fgets(text, sizeof text, f)) {
        char want[512];
        dk_dist_outcome_fate(&o, n, o.root, want, sizeof want);
        strcat(want, "\n");
        cr_assert_str_eq(text, want, "line %d", n);
        n++;
    }
    fclose(f);
    unlink(path);
    cr_assert_eq(n, 300);
}

Test(outcome, the_fates_file_is_not_written_through_a_symlink, .fini = free_world)
{
    world_of(9, 0);
    char dir[] = "/tmp/dk-fates-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char link[64], target[64];
    snprintf(link, sizeof link, "%s/ranks.txt", dir);
    snprintf(target, sizeof target, "%s/elsewhere", dir);
    cr_assert_eq(symlink(target, link), 0);
    char err[256] = "";
    cr_assert_eq(dk_dist_outcome_write_fates(&o, link, err, sizeof err), -1);
    cr_assert(strstr(err, "cannot write"), "%s", err);
    cr_assert_neq(access(target, F_OK), 0);
    unlink(link);
    rmdir(dir);
}

/* ---- where the ranks were ---------------------------------------------------------- */

static const char *WHERE = "  rank 1:         cell line 6\n"
                           "  ranks 0, 2 (2): torch.distributed.all_reduce  (cell line 7)\n";

Test(outcome, where_the_ranks_were_comes_right_after_the_headline)
{
    o.end = DK_END_TIMEOUT;
    o.timeout_s = 30;
    o.stacks = WHERE;
    o.stacks_file = "/logs/run-1/stacks.txt";
    build(true);
    const char *want[] = {RED "TimeoutError" RESET ": the job ran past timeout=30 s and every "
                          "rank was ended; give a larger timeout= or timeout=None",
                          "Where the ranks were:",
                          "  rank 1:         cell line 6",
                          "  ranks 0, 2 (2): torch.distributed.all_reduce  (cell line 7)",
                          "Every rank's stacks, in full: /logs/run-1/stacks.txt",
                          "",
                          "Ranks:",
                          "  rank 0: ended by distkernel (timeout)",
                          "  rank 1: ended by distkernel (timeout)",
                          "Full output of every rank: /logs/run-1/rank-N.log"};
    cr_assert_eq(lines(), sizeof want / sizeof want[0]);
    for (size_t i = 0; i < lines(); i++)
        cr_assert_str_eq(line(i), want[i], "line %zu", i);
}

Test(outcome, where_the_ranks_were_comes_before_the_root_causes_traceback)
{
    raised(1);
    o.root = 1;
    o.stacks = "  rank 0: cell line 3\n";
    build(false);
    cr_assert_str_eq(line(0), "Where the ranks were:");
    cr_assert_str_eq(line(1), "  rank 0: cell line 3");
    cr_assert_str_eq(line(2), "");     /* no stacks file: none named */
    cr_assert_str_eq(line(3), "Rank 1 failed first (root cause):");
}

Test(outcome, no_stacks_no_heading)
{
    o.end = DK_END_TIMEOUT;
    o.stacks = "";
    build(true);
    for (size_t i = 0; i < lines(); i++)
        cr_assert_str_neq(line(i), "Where the ranks were:");
    cr_assert_str_eq(line(1), "");
}
