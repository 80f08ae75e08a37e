/*
 * From rank output bytes to what the cell shows (distributed/dk_dist_output.h),
 * with no kernel: its callbacks write a transcript, and the clock is
 * the test's. In the transcript "1:" and "2:" are text appended to stdout and
 * stderr (one entry per append), "D(id):" a new display, "U(id):" an update
 * of one, and "!" marks a forced display.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_dist_output.h"

#define FFFD "\xef\xbf\xbd"

static char transcript[1 << 16];
static long long clock_ms;
static bool frontend_full;   /* unforced displays are refused */
static long long append_takes_ms; /* a slow frontend: each append waits this long */
static dk_dist_output_t *the_output;

static void append(void *data, int fd, const char *text, size_t len)
{
    (void)data;
    clock_ms += append_takes_ms;
    char head[8];
    snprintf(head, sizeof head, "%d:", fd);
    strcat(transcript, head);
    strncat(transcript, text, len);
    strcat(transcript, "|");
}

static bool display(void *data, const char *display_id, bool update, const char *text, bool force)
{
    (void)data;
    if (frontend_full && !force)
        return false;
    char head[128];
    snprintf(head, sizeof head, "%s%s(%s):", force ? "!" : "", update ? "U" : "D", display_id);
    strcat(transcript, head);
    strcat(transcript, text);
    strcat(transcript, "|");
    return true;
}

static long long fake_now(void *data)
{
    (void)data;
    return clock_ms;
}

/* The output of WORLD ranks; SHOWN: whose output the cell shows (NULL: all). */
static void start(int world, const bool *shown)
{
    transcript[0] = '\0';
    clock_ms = 1000;
    frontend_full = false;
    append_takes_ms = 0;
    dk_dist_output_io_t io = {.append = append, .display = display, .now_ms = fake_now};
    the_output = dk_dist_output_new(world, "abc", shown, &io);
    cr_assert_not_null(the_output);
}

static void setup(void) { start(2, NULL); }
static void teardown(void) { dk_dist_output_destroy(&the_output); }

static void out(int rank, int fd, const char *text)
{
    dk_dist_output_write(the_output, rank, fd, text, strlen(text));
}

TestSuite(output, .init = setup, .fini = teardown);

Test(output, a_finished_line_is_labelled_with_its_rank)
{
    out(1, 1, "hello\n");
    cr_assert_str_eq(transcript, "1:[rank 1] hello\n|");
}

Test(output, two_ranks_interleaved_byte_by_byte_come_out_whole)
{
    const char *a = "from zero\n", *b = "from one\n";
    for (size_t i = 0; i < strlen(a) || i < strlen(b); i++) {
        if (i < strlen(a))
            dk_dist_output_write(the_output, 0, 1, a + i, 1);
        if (i < strlen(b))
            dk_dist_output_write(the_output, 1, 1, b + i, 1);
    }
    cr_assert_str_eq(transcript, "1:[rank 1] from one\n|1:[rank 0] from zero\n|");
}

Test(output, stderr_goes_to_stderr_and_stdout_to_stdout)
{
    out(0, 2, "oops\n");
    out(0, 1, "fine\n");
    cr_assert_str_eq(transcript, "2:[rank 0] oops\n|1:[rank 0] fine\n|");
}

Test(output, the_lines_of_one_read_are_appended_together)
{
    out(0, 1, "a\nb\nc\n");
    cr_assert_str_eq(transcript, "1:[rank 0] a\n[rank 0] b\n[rank 0] c\n|");
}

Test(output, a_line_split_across_reads_is_printed_once_whole)
{
    out(0, 1, "hel");
    cr_assert_str_eq(transcript, "");
    clock_ms += 50;
    out(0, 1, "lo wor");
    dk_dist_output_tick(the_output);
    cr_assert_str_eq(transcript, "", "a line arriving in pieces is not a progress display");
    out(0, 1, "ld\n");
    cr_assert_str_eq(transcript, "1:[rank 0] hello world\n|");
}

Test(output, invalid_utf8_becomes_the_replacement_character)
{
    out(0, 1, "a\xff" "b\n");
    cr_assert_str_eq(transcript, "1:[rank 0] a" FFFD "b\n|");
}

Test(output, a_redrawn_line_becomes_one_display_updated_in_place)
{
    out(0, 2, "\r 10%");
    cr_assert_str_eq(transcript, "");
    out(0, 2, "\r 20%");
    cr_assert_str_eq(transcript, "D(distkernel-abc-r0-fd2-0):[rank 0]  20%|");
    transcript[0] = '\0';
    clock_ms += 10;
    out(0, 2, "\r 30%");
    cr_assert_str_eq(transcript, "", "updates come at most every %d ms", DK_DIST_OUTPUT_PROGRESS_MS);
    clock_ms += DK_DIST_OUTPUT_PROGRESS_MS;
    dk_dist_output_tick(the_output);
    cr_assert_str_eq(transcript, "U(distkernel-abc-r0-fd2-0):[rank 0]  30%|");
    transcript[0] = '\0';
    clock_ms += DK_DIST_OUTPUT_PROGRESS_MS;
    out(0, 2, "\r 90%");
    cr_assert_str_eq(transcript, "U(distkernel-abc-r0-fd2-0):[rank 0]  90%|");
}

Test(output, a_finished_progress_line_stays_in_its_display_and_the_next_line_is_text)
{
    out(0, 1, "\r 10%");
    out(0, 1, "\r 50%");
    transcript[0] = '\0';
    out(0, 1, "\r100%\ndone\n");
    cr_assert_str_eq(transcript,
                     "!U(distkernel-abc-r0-fd1-0):[rank 0] 100%|1:[rank 0] done\n|");
    transcript[0] = '\0';
    out(0, 1, "\r 10%");
    out(0, 1, "\r 20%");
    cr_assert_str_eq(transcript, "D(distkernel-abc-r0-fd1-1):[rank 0]  20%|",
                     "the next bar is a display of its own");
}

Test(output, text_before_a_display_is_appended_before_it)
{
    out(1, 1, "before\n\r 1%");
    out(1, 1, "\r 2%");
    cr_assert_str_eq(transcript, "1:[rank 1] before\n|D(distkernel-abc-r1-fd1-0):[rank 1]  2%|");
}

Test(output, progress_of_two_ranks_gets_two_displays)
{
    out(0, 1, "\ra");
    out(1, 1, "\ra");
    out(0, 1, "\rb");
    out(1, 1, "\rb");
    cr_assert_str_eq(transcript, "D(distkernel-abc-r0-fd1-0):[rank 0] b|"
                                 "D(distkernel-abc-r1-fd1-0):[rank 1] b|");
}

Test(output, a_refused_update_is_sent_on_a_later_tick)
{
    out(0, 1, "\r 1%");
    out(0, 1, "\r 2%");
    transcript[0] = '\0';
    frontend_full = true;
    clock_ms += DK_DIST_OUTPUT_PROGRESS_MS;
    out(0, 1, "\r 3%");
    dk_dist_output_tick(the_output);
    cr_assert_str_eq(transcript, "");
    frontend_full = false;
    dk_dist_output_tick(the_output);
    cr_assert_str_eq(transcript, "U(distkernel-abc-r0-fd1-0):[rank 0]  3%|");
}

Test(output, a_line_left_unfinished_is_shown_once_the_rank_is_caught_up)
{
    out(0, 1, "Epoch 1... ");
    dk_dist_output_caught_up(the_output, 0, 1);
    clock_ms += DK_DIST_OUTPUT_PARTIAL_MS - 1;
    dk_dist_output_tick(the_output);
    cr_assert_str_eq(transcript, "");
    clock_ms += 1;
    dk_dist_output_tick(the_output);
    cr_assert_str_eq(transcript, "D(distkernel-abc-r0-fd1-0):[rank 0] Epoch 1... |");
    transcript[0] = '\0';
    out(0, 1, "done\n");
    cr_assert_str_eq(transcript, "!U(distkernel-abc-r0-fd1-0):[rank 0] Epoch 1... done|");
}

Test(output, the_wait_for_an_unfinished_line_counts_from_when_the_rank_was_caught_up)
{
    out(0, 1, "Epoch 1... ");
    clock_ms += 200;
    dk_dist_output_caught_up(the_output, 0, 1);
    clock_ms += DK_DIST_OUTPUT_PARTIAL_MS - 1;
    dk_dist_output_tick(the_output);
    cr_assert_str_eq(transcript, "");
    clock_ms += 1;
    dk_dist_output_tick(the_output);
    cr_assert_str_eq(transcript, "D(distkernel-abc-r0-fd1-0):[rank 0] Epoch 1... |");
}

Test(output, a_slow_frontend_makes_every_rank_be_caught_up_again)
{
    out(0, 1, "Epoch 1... ");
    dk_dist_output_caught_up(the_output, 0, 1);
    append_takes_ms = DK_DIST_OUTPUT_STALL_MS;   /* the kernel read no pipe meanwhile */
    out(1, 1, "a flood\n");
    append_takes_ms = 0;
    transcript[0] = '\0';
    clock_ms += DK_DIST_OUTPUT_PARTIAL_MS;
    dk_dist_output_tick(the_output);
    cr_assert_str_eq(transcript, "", "rank 0's rest may be in its pipe");
    dk_dist_output_caught_up(the_output, 0, 1);
    clock_ms += DK_DIST_OUTPUT_PARTIAL_MS;
    dk_dist_output_tick(the_output);
    cr_assert_str_eq(transcript, "D(distkernel-abc-r0-fd1-0):[rank 0] Epoch 1... |");
}

Test(output, an_unfinished_line_is_not_shown_while_its_rest_may_be_in_the_pipe)
{
    out(0, 1, "Epoch 1... ");
    clock_ms += 10 * DK_DIST_OUTPUT_PARTIAL_MS;
    dk_dist_output_tick(the_output);
    cr_assert_str_eq(transcript, "", "never caught up: not shown");
}

Test(output, at_the_end_an_unfinished_line_is_printed)
{
    out(1, 2, "no newline");
    dk_dist_output_finish(the_output);
    cr_assert_str_eq(transcript, "2:[rank 1] no newline\n|");
}

Test(output, at_the_end_a_held_back_update_is_forced_out)
{
    out(0, 1, "\r 1%");
    out(0, 1, "\r 2%");
    out(0, 1, "\r 3%");
    transcript[0] = '\0';
    dk_dist_output_finish(the_output);
    cr_assert_str_eq(transcript, "!U(distkernel-abc-r0-fd1-0):[rank 0]  3%|");
}

Test(output, rank0_only_drops_the_other_ranks)
{
    dk_dist_output_destroy(&the_output);
    start(3, (const bool[]){true, false, false});
    out(2, 1, "two\n");
    out(1, 2, "one\n");
    out(0, 1, "zero\n");
    cr_assert_str_eq(transcript, "1:[rank 0] zero\n|");
}

Test(output, only_the_ranks_shown_reach_the_cell_their_progress_too)
{
    dk_dist_output_destroy(&the_output);
    bool shown[5] = {false, true, false, true, false};
    start(5, shown);
    shown[3] = false;           /* the the_output keeps its own copy */
    for (int r = 0; r < 5; r++) {
        out(r, 1, "line\n");
        out(r, 2, "\r 1%");
        out(r, 2, "\r 2%");
    }
    dk_dist_output_finish(the_output);
    cr_assert_str_eq(transcript, "1:[rank 1] line\n|D(distkernel-abc-r1-fd2-0):[rank 1]  2%|"
                                 "1:[rank 3] line\n|D(distkernel-abc-r3-fd2-0):[rank 3]  2%|"
                                 "!U(distkernel-abc-r1-fd2-0):[rank 1]  2%|"
                                 "!U(distkernel-abc-r3-fd2-0):[rank 3]  2%|");
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, dist_output_takes_null)
{
    dk_dist_output_destroy(NULL);
    dk_dist_output_t *none = NULL;
    dk_dist_output_destroy(&none);
    cr_assert_null(none);
}
