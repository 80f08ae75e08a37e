/*
 * A set of ranks written as a list, "0,8,16-31" (distributed/dk_rank_list.h): what
 * output= takes. Ranks and ranges, their union, the syntax alone while the
 * world is unknown, and each refusal saying what to write.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <string.h>

#include "dk_rank_list.h"

static bool shown[DK_RANK_LIST_RANKS_MAX];
static char err[1024];

static void setup(void)
{
    memset(shown, 0xff, sizeof shown);     /* the parser must clear what it does not list */
    err[0] = '\0';
}

TestSuite(rank_list, .init = setup);

/* The ranks set in SHOWN's first WORLD, as a list again ("0,3,5"). */
static const char *listed(int world)
{
    static char out[8192];
    size_t used = 0;
    out[0] = '\0';
    for (int r = 0; r < world; r++)
        if (shown[r])
            used += (size_t)snprintf(out + used, sizeof out - used, "%s%d", used ? "," : "", r);
    return out;
}

Test(rank_list, single_ranks)
{
    cr_assert_eq(dk_rank_list_parse("0,3,5", 8, shown, err, sizeof err), 3, "%s", err);
    cr_assert_str_eq(listed(8), "0,3,5");
}

Test(rank_list, a_range_is_inclusive)
{
    cr_assert_eq(dk_rank_list_parse("2-4", 8, shown, err, sizeof err), 3, "%s", err);
    cr_assert_str_eq(listed(8), "2,3,4");
}

Test(rank_list, ranks_and_ranges_together)
{
    cr_assert_eq(dk_rank_list_parse("0,8,16-19", 32, shown, err, sizeof err), 6, "%s", err);
    cr_assert_str_eq(listed(32), "0,8,16,17,18,19");
}

Test(rank_list, a_range_of_one_rank)
{
    cr_assert_eq(dk_rank_list_parse("3-3", 4, shown, err, sizeof err), 1, "%s", err);
    cr_assert_str_eq(listed(4), "3");
}

Test(rank_list, duplicates_count_once)
{
    cr_assert_eq(dk_rank_list_parse("1,1,1", 4, shown, err, sizeof err), 1, "%s", err);
    cr_assert_str_eq(listed(4), "1");
}

Test(rank_list, overlapping_ranges_are_their_union)
{
    cr_assert_eq(dk_rank_list_parse("0-5,3-7,6", 10, shown, err, sizeof err), 8, "%s", err);
    cr_assert_str_eq(listed(10), "0,1,2,3,4,5,6,7");
}

Test(rank_list, order_does_not_matter)
{
    cr_assert_eq(dk_rank_list_parse("7,0-1,4", 8, shown, err, sizeof err), 4, "%s", err);
    cr_assert_str_eq(listed(8), "0,1,4,7");
}

Test(rank_list, blanks_around_items_are_allowed)
{
    cr_assert_eq(dk_rank_list_parse(" 0 , 2-3 ,5 ", 8, shown, err, sizeof err), 4, "%s", err);
    cr_assert_str_eq(listed(8), "0,2,3,5");
}

Test(rank_list, leading_zeros_are_the_number)
{
    cr_assert_eq(dk_rank_list_parse("007", 8, shown, err, sizeof err), 1, "%s", err);
    cr_assert_str_eq(listed(8), "7");
}

Test(rank_list, a_large_range_covers_every_rank_of_it)
{
    cr_assert_eq(dk_rank_list_parse("0-1023", 1024, shown, err, sizeof err), 1024, "%s", err);
    for (int r = 0; r < 1024; r++)
        cr_assert(shown[r], "rank %d", r);
}

Test(rank_list, the_largest_run_every_rank)
{
    cr_assert_eq(dk_rank_list_parse("0-4095", DK_RANK_LIST_RANKS_MAX, shown, err, sizeof err),
                 DK_RANK_LIST_RANKS_MAX, "%s", err);
}

Test(rank_list, a_long_list_of_single_ranks)
{
    char text[8192];
    size_t used = 0;
    for (int r = 0; r < 1024; r += 2)
        used += (size_t)snprintf(text + used, sizeof text - used, "%s%d", r ? "," : "", r);
    cr_assert_eq(dk_rank_list_parse(text, 1024, shown, err, sizeof err), 512, "%s", err);
    for (int r = 0; r < 1024; r++)
        cr_assert_eq(shown[r], r % 2 == 0, "rank %d", r);
}

Test(rank_list, ranks_not_listed_are_cleared)
{
    cr_assert_eq(dk_rank_list_parse("1", 4, shown, err, sizeof err), 1);
    cr_assert_str_eq(listed(4), "1");
}

/* ---- the world not known yet: the syntax alone ---- */

Test(rank_list, without_a_world_only_the_syntax_is_checked)
{
    cr_assert_eq(dk_rank_list_parse("0,8,16-31", 0, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(dk_rank_list_parse("4095", 0, NULL, err, sizeof err), 0, "%s", err);
}

Test(rank_list, without_a_world_a_rank_past_any_run_is_refused)
{
    cr_assert_eq(dk_rank_list_parse("0,4096", 0, NULL, err, sizeof err), -1);
    cr_assert_str_eq(err, "'4096' is past the ranks of any run (a run has at most 4096 ranks, "
                          "0-4095)");
}

Test(rank_list, a_number_with_many_digits_does_not_overflow)
{
    cr_assert_eq(dk_rank_list_parse("99999999999999999999999", 0, NULL, err, sizeof err), -1);
    cr_assert(strstr(err, "is past the ranks of any run"), "%s", err);
    cr_assert_eq(dk_rank_list_parse("0-99999999999999999999999", 8, shown, err, sizeof err), -1);
    cr_assert(strstr(err, "is past the ranks of any run"), "%s", err);
}

/* ---- against the world ---- */

Test(rank_list, a_rank_past_the_world_names_the_world)
{
    cr_assert_eq(dk_rank_list_parse("0,8", 4, shown, err, sizeof err), -1);
    cr_assert_str_eq(err, "rank 8 is not in this run (its 4 ranks are 0-3); list ranks from "
                          "0 to 3");
}

Test(rank_list, the_world_itself_is_past_the_last_rank)
{
    cr_assert_eq(dk_rank_list_parse("4", 4, shown, err, sizeof err), -1);
    cr_assert(strstr(err, "rank 4 is not in this run"), "%s", err);
}

Test(rank_list, a_range_past_the_world_names_its_last_rank)
{
    cr_assert_eq(dk_rank_list_parse("16-31", 24, shown, err, sizeof err), -1);
    cr_assert_str_eq(err, "the range 16-31 goes past this run's last rank, 23 (its 24 ranks are "
                          "0-23); list ranks from 0 to 23");
}

Test(rank_list, a_world_of_one)
{
    cr_assert_eq(dk_rank_list_parse("0", 1, shown, err, sizeof err), 1, "%s", err);
    cr_assert_eq(dk_rank_list_parse("1", 1, shown, err, sizeof err), -1);
    cr_assert_str_eq(err, "rank 1 is not in this run (its 1 rank is 0); list rank 0 only");
}

/* ---- bad input ---- */

Test(rank_list, a_backwards_range_says_how_to_write_it)
{
    cr_assert_eq(dk_rank_list_parse("3-1", 8, shown, err, sizeof err), -1);
    cr_assert_str_eq(err, "the range 3-1 runs backwards; write it from its first rank to its "
                          "last: 1-3");
    cr_assert_eq(dk_rank_list_parse("3-1", 0, NULL, err, sizeof err), -1, "syntax alone");
}

Test(rank_list, a_word_is_not_a_rank)
{
    cr_assert_eq(dk_rank_list_parse("x", 0, NULL, err, sizeof err), -1);
    cr_assert_str_eq(err, "'x' is not a rank nor a range of ranks; write ranks as whole numbers "
                          "from 0, and ranges as FIRST-LAST, like 0,8,16-31");
}

Test(rank_list, each_malformed_item_is_refused_and_quoted)
{
    static const char *const bad[][2] = {
        {"-1", "'-1'"},  {"1-", "'1-'"},   {"-", "'-'"},     {"1-2-3", "'1-2-3'"},
        {"1.5", "'1.5'"}, {"+3", "'+3'"},  {"0x1f", "'0x1f'"}, {"1 2", "'1 2'"},
        {"0,a,2", "'a'"}, {"3--4", "'3--4'"}, {"1..4", "'1..4'"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        cr_assert_eq(dk_rank_list_parse(bad[i][0], 8, shown, err, sizeof err), -1, "%s",
                     bad[i][0]);
        cr_assert(strstr(err, bad[i][1]) && strstr(err, "is not a rank"), "%s: %s", bad[i][0],
                  err);
    }
}

Test(rank_list, an_empty_item_is_refused)
{
    static const char *const bad[] = {"0,,1", "0,", ",0", "0, ,1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        cr_assert_eq(dk_rank_list_parse(bad[i], 8, shown, err, sizeof err), -1, "%s", bad[i]);
        cr_assert(strstr(err, "an empty item (a comma too many?)"), "%s: %s", bad[i], err);
    }
}

Test(rank_list, an_empty_list_is_refused)
{
    cr_assert_eq(dk_rank_list_parse("", 8, shown, err, sizeof err), -1);
    cr_assert(strstr(err, "no rank is listed"), "%s", err);
    cr_assert_eq(dk_rank_list_parse("  ", 0, NULL, err, sizeof err), -1);
    cr_assert_eq(dk_rank_list_parse(NULL, 0, NULL, err, sizeof err), -1);
}
