/*
 * Turning a rank's output bytes into lines and progress (runtime/base/dk_lines.h).
 * Each test feeds chunks and compares the events with a transcript in which
 * "L:" is a finished line and "P:" a progress redraw.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dk_lines.h"

#define FFFD "\xef\xbf\xbd"

static char transcript[1 << 20];

static void record(void *data, dk_lines_event_t kind, const char *text, size_t len)
{
    (void) data;
    cr_assert_eq(strlen(text), len, "TEXT must be NUL-terminated at LEN");
    cr_assert_null(memchr(text, '\n', len));
    strcat(transcript, kind == DK_LINE ? "L:" : "P:");
    strncat(transcript, text, len);
    strcat(transcript, "|");
}

static dk_lines_t *lines;

static void setup_lines(size_t max_line)
{
    dk_lines_destroy(&lines);
    transcript[0] = '\0';
    lines = dk_lines_new(max_line);
    cr_assert_not_null(lines);
}

static void setup(void)
{
    setup_lines(0);
}

static void teardown(void)
{
    dk_lines_destroy(&lines);
    cr_assert_null(lines);
}

static void feed(const char *s)
{
    dk_lines_feed(lines, s, strlen(s), record, NULL);
}

static void feed_n(const char *s, size_t n)
{
    dk_lines_feed(lines, s, n, record, NULL);
}

static void finish(void)
{
    dk_lines_finish(lines, record, NULL);
}

static void expect(const char *expected)
{
    cr_assert_str_eq(transcript, expected);
    transcript[0] = '\0';
}

TestSuite(lines, .init = setup, .fini = teardown);

Test(lines, whole_lines_are_emitted_one_event_each)
{
    feed("one\ntwo\n\nthree\n");
    expect("L:one|L:two|L:|L:three|");
}

Test(lines, a_partial_line_shows_as_progress_until_its_newline)
{
    feed("Epoch 1");
    expect("P:Epoch 1|");
    feed(": loss 0.3");
    expect("P:Epoch 1: loss 0.3|");
    feed("\nnext");
    expect("L:Epoch 1: loss 0.3|P:next|");
}

Test(lines, progress_is_emitted_only_when_the_line_changes)
{
    feed("abc");
    expect("P:abc|");
    feed("");
    expect("");
    feed("\rabc");
    expect("");
    feed("\rabd");
    expect("P:abd|");
}

Test(lines, crlf_is_a_newline)
{
    feed("one\r\ntwo\r\n");
    expect("L:one|L:two|");
}

Test(lines, crlf_split_across_feeds_is_still_a_newline)
{
    feed("one\r");
    expect("P:one|");
    feed("\ntwo\r\n");
    expect("L:one|L:two|");
}

Test(lines, a_carriage_return_restarts_the_line)
{
    feed("aaaa\rbb\n");
    expect("L:bb|");
}

Test(lines, a_tqdm_bar_gives_progress_events_and_a_final_line)
{
    feed("\r  0%|          | 0/3 [00:00<?, ?it/s]");
    expect("P:  0%|          | 0/3 [00:00<?, ?it/s]|");
    feed("\r 33%|###       | 1/3 [00:01<00:02, 1.00it/s]");
    expect("P: 33%|###       | 1/3 [00:01<00:02, 1.00it/s]|");
    feed("\r 67%|######    | 2/3 [00:02<00:01, 1.00it/s]\r100%|##########| 3/3 [00:03<00:00, 1.00it/s]");
    expect("P:100%|##########| 3/3 [00:03<00:00, 1.00it/s]|");
    feed("\r100%|##########| 3/3 [00:03<00:00, 1.00it/s]\n");
    expect("L:100%|##########| 3/3 [00:03<00:00, 1.00it/s]|");
    feed("done\n");
    expect("L:done|");
}

Test(lines, a_bar_redrawn_many_times_uses_bounded_memory_and_one_progress_per_feed)
{
    char chunk[64];
    for (int i = 0; i < 100000; i++) {
        snprintf(chunk, sizeof chunk, "\rstep %6d", i);
        transcript[0] = '\0';
        feed(chunk);
        cr_assert_eq(strncmp(transcript, "P:step", 6), 0);
        cr_assert_null(strchr(transcript + 1, 'P'), "one progress event per feed");
    }
    transcript[0] = '\0';
    feed("\n");
    expect("L:step  99999|");
}

Test(lines, invalid_utf8_becomes_replacement_characters)
{
    feed("bad \xff\xfe byte\n");
    expect("L:bad " FFFD FFFD " byte|");
    feed("cut \xe2\x82\n");
    expect("L:cut " FFFD "|");
}

Test(lines, nul_bytes_are_replaced)
{
    feed_n("a\0b\n", 4);
    expect("L:a" FFFD "b|");
}

Test(lines, a_multibyte_character_split_across_feeds_is_held_back)
{
    feed("price: 5\xe2");
    expect("P:price: 5|");
    feed("\x82");
    expect("");
    feed("\xac\n");
    expect("L:price: 5\xe2\x82\xac|");
    feed("\xf0\x9f");
    expect("");
    feed("\x98\x80!\n");
    expect("L:\xf0\x9f\x98\x80!|");
}

Test(lines, an_over_long_line_is_emitted_in_pieces)
{
    setup_lines(8);
    feed("0123456789abcdefXY\n");
    expect("L:01234567|L:89abcdef|L:XY|");
}

Test(lines, a_line_of_exactly_max_line_bytes_is_one_line)
{
    setup_lines(8);
    feed("01234567\n");
    expect("L:01234567|");
}

Test(lines, pieces_of_an_over_long_line_never_split_a_character)
{
    setup_lines(8);
    /* 6 ASCII bytes then a 3-byte euro sign: the cut falls before the euro. */
    feed("abcdef\xe2\x82\xacgh\n");
    expect("L:abcdef|L:\xe2\x82\xacgh|");
}

Test(lines, the_default_limit_is_64_kib)
{
    size_t n = 65536 + 10;
    char *big = malloc(n + 2);
    memset(big, 'x', n);
    big[n] = '\n';
    big[n + 1] = '\0';
    transcript[0] = '\0';
    feed(big);
    /* A piece of 65536 bytes and a line of 10. */
    cr_assert_eq(strlen(transcript), 2 + 65536 + 1 + 2 + 10 + 1);
    cr_assert(strstr(transcript, "|L:xxxxxxxxxx|") != NULL);
    free(big);
}

Test(lines, finish_emits_the_unfinished_line)
{
    feed("last words");
    expect("P:last words|");
    finish();
    expect("L:last words|");
    finish();
    expect("");
}

Test(lines, finish_after_a_trailing_carriage_return_keeps_the_text)
{
    feed("100%\r");
    finish();
    expect("P:100%|L:100%|");
}

Test(lines, finish_replaces_an_incomplete_character)
{
    feed("tail \xe2\x82");
    finish();
    expect("P:tail |L:tail " FFFD "|");
}

Test(lines, finish_with_nothing_pending_emits_nothing)
{
    feed("done\n");
    expect("L:done|");
    finish();
    expect("");
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, lines_takes_null)
{
    dk_lines_destroy(NULL);
    dk_lines_t *none = NULL;
    dk_lines_destroy(&none);
    cr_assert_null(none);
}
