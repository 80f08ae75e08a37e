/*
 * Where every rank is (runtime/stacks/dk_stacks.h): faulthandler dumps grouped by
 * the ranks' main-thread stacks, library frames folded to the user's call,
 * cell frames as cell lines, within the summary's line budget at any size.
 * The dumps under stacks/ were captured from /usr/bin/python3 by
 * stacks/capture.sh (a stand-in torch under dist-packages, cells in a
 * distkernel-cells folder).
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dk_lost.h"
#include "dk_stacks.h"

#define CELLS "/tmp/distkernel-cells-1-fixture/"
#define TORCH "/usr/lib/python3/dist-packages/torch/distributed/"

static char *fixture(const char *name, size_t *len)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", STACKS_DIR, name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "fixture %s", path);
    static char buf[1 << 16];
    *len = fread(buf, 1, sizeof buf - 1, f);
    buf[*len] = '\0';
    fclose(f);
    char *copy = malloc(*len + 1);
    cr_assert_not_null(copy);
    memcpy(copy, buf, *len + 1);
    return copy;
}

static dk_stacks_t *stacks;

static void setup(void)
{
    stacks = dk_stacks_new(dk_stacks_is_under, (void *) CELLS);
    cr_assert_not_null(stacks);
}

static void teardown(void)
{
    dk_stacks_destroy(&stacks);
    cr_assert_null(stacks);
}

TestSuite(stacks, .init = setup, .fini = teardown);

static void add(int rank, const char *dump)
{
    cr_assert_eq(dk_stacks_add(stacks, rank, "node1", dump, strlen(dump)), 0, "rank %d", rank);
}

static void add_fixture(int rank, const char *name)
{
    size_t len;
    char *dump = fixture(name, &len);
    cr_assert_eq(dk_stacks_add(stacks, rank, "node1", dump, len), 0);
    free(dump);
}

static size_t count_lines(const char *text)
{
    size_t n = 0;
    for (; *text; text++)
        n += *text == '\n';
    return n;
}

/* A main thread in the cell at LINE, optionally inside CALL_FILE's CALL. */
static char *dump_at(int line, const char *call_file, const char *call)
{
    char *text = malloc(1024);
    cr_assert_not_null(text);
    int n = snprintf(text, 1024, "Thread 0x00007f0000000001 (most recent call first):\n");
    if (call)
        n += snprintf(text + n, 1024 - n, "  File \"%s\", line 12 in %s\n", call_file, call);
    snprintf(text + n, 1024 - n,
             "  File \"" CELLS "1.py\", line %d in <module>\n"
             "  File \"<string>\", line 13 in <module>\n", line);
    return text;
}

/* The issue's example: three ranks wait in all_reduce at cell line 8, rank 2
 * sleeps at cell line 6; the odd one out comes first, columns aligned. */
Test(stacks, the_issue_example_shows_the_odd_rank_first)
{
    add_fixture(0, "rank0.txt");
    add_fixture(1, "rank0.txt");
    add_fixture(2, "rank2.txt");
    add_fixture(3, "rank0.txt");
    cr_assert_eq(dk_stacks_groups(stacks), 2);
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_not_null(text);
    cr_assert_str_eq(text,
        "  rank 2:            cell line 6\n"
        "  ranks 0, 1, 3 (3): torch.distributed.all_reduce  (cell line 8)\n");
    free(text);
}

/* The dumping thread is "Current thread" and listed first; the main thread,
 * listed last, is the one in the cell; the loader thread counts for nothing. */
Test(stacks, the_main_thread_is_the_last_listed_thread_in_the_cell)
{
    add_fixture(0, "rank2.txt");
    add(1, "Thread 0x1 (most recent call first):\n"
           "  File \"/usr/lib/python3.11/queue.py\", line 99 in get\n"
           "\n"
           "Current thread 0x2 (most recent call first):\n"
           "  File \"" CELLS "3163812341.py\", line 6 in <module>\n");
    cr_assert_eq(dk_stacks_groups(stacks), 1);
}

Test(stacks, torch_frames_fold_to_the_public_call)
{
    char *name = dk_stacks_call_name(TORCH "distributed_c10d.py", "all_reduce");
    cr_assert_str_eq(name, "torch.distributed.all_reduce");
    free(name);
    name = dk_stacks_call_name("/home/u/.venv/lib/python3.11/site-packages/torch/utils/data/"
                               "_utils/fetch.py", "fetch");
    cr_assert_str_eq(name, "torch.utils.data.fetch.fetch");
    free(name);
    name = dk_stacks_call_name("/usr/lib/python3/dist-packages/torch/cuda/__init__.py",
                               "synchronize");
    cr_assert_str_eq(name, "torch.cuda.synchronize");
    free(name);
}

Test(stacks, standard_library_and_odd_files_fold_by_their_module)
{
    char *name = dk_stacks_call_name("/usr/lib/python3.11/threading.py", "wait");
    cr_assert_str_eq(name, "threading.wait");
    free(name);
    name = dk_stacks_call_name("/usr/lib/python3.11/concurrent/futures/_base.py", "result");
    cr_assert_str_eq(name, "concurrent.futures.result");
    free(name);
    name = dk_stacks_call_name("<frozen importlib._bootstrap>", "_find_and_load");
    cr_assert_str_eq(name, "_find_and_load");
    free(name);
    name = dk_stacks_call_name("???", "???");
    cr_assert_str_eq(name, "???");
    free(name);
    name = dk_stacks_call_name("/opt/code/helpers.py", "<module>");
    cr_assert_str_eq(name, "helpers");
    free(name);
}

/* torch's collectives are wrapped (c10d_logger's wrapper): the call shown is
 * the wrapped function, not the wrapper. */
Test(stacks, a_decorator_frame_gives_way_to_the_function_it_wraps)
{
    add(0, "Thread 0x1 (most recent call first):\n"
           "  File \"" TORCH "distributed_c10d.py\", line 3 in barrier\n"
           "  File \"" TORCH "c10d_logger.py\", line 5 in wrapper\n"
           "  File \"" CELLS "1.py\", line 4 in <module>\n");
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_str_eq(text, "  rank 0: torch.distributed.barrier  (cell line 4)\n");
    free(text);
}

Test(stacks, a_cell_function_shows_its_line_and_its_caller)
{
    add(0, "Thread 0x1 (most recent call first):\n"
           "  File \"/usr/lib/python3.11/threading.py\", line 320 in wait\n"
           "  File \"" CELLS "1.py\", line 3 in step\n"
           "  File \"" CELLS "1.py\", line 10 in <module>\n");
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_str_eq(text, "  rank 0: threading.wait  (cell line 3 in step \xe2\x86\x90 line 10)\n");
    free(text);
}

/* faulthandler stops at 100 frames ("  ..."): the recursion is one run. */
Test(stacks, a_deep_recursion_is_one_line)
{
    add_fixture(0, "deep.txt");
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_str_eq(text, "  rank 0: cell line 4 in f \xc3\x97" "100+\n");
    free(text);
}

Test(stacks, sixty_four_ranks_in_four_groups_are_four_lines_smallest_first)
{
    for (int r = 0; r < 64; r++) {
        int line = r == 5 ? 6 : r < 4 ? 7 : r < 24 ? 8 : 9;
        char *dump = dump_at(line, TORCH "distributed_c10d.py", line == 6 ? NULL : "all_reduce");
        add(r, dump);
        free(dump);
    }
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_eq(count_lines(text), 4, "%s", text);
    cr_assert_str_eq(text,
        "  rank 5:             cell line 6\n"
        "  ranks 0" DK_EN_DASH "3 (4):      torch.distributed.all_reduce  (cell line 7)\n"
        "  ranks 4, 6" DK_EN_DASH "23 (19): torch.distributed.all_reduce  (cell line 8)\n"
        "  ranks 24" DK_EN_DASH "63 (40):   torch.distributed.all_reduce  (cell line 9)\n");
    free(text);
}

static bool valid_utf8(const char *s)
{
    const unsigned char *p = (const unsigned char *) s;
    while (*p) {
        int n = *p < 0x80 ? 0 : (*p & 0xE0) == 0xC0 ? 1 : (*p & 0xF0) == 0xE0 ? 2
              : (*p & 0xF8) == 0xF0 ? 3 : -1;
        if (n < 0)
            return false;
        p++;
        for (int i = 0; i < n; i++, p++)
            if ((*p & 0xC0) != 0x80)
                return false;
    }
    return true;
}

/* 1,024 ranks, each somewhere else: 44 groups and a line for the rest. */
Test(stacks, a_thousand_ranks_with_distinct_stacks_fit_in_45_lines)
{
    clock_t start = clock();
    for (int r = 0; r < 1024; r++) {
        char *dump = dump_at(r + 1, TORCH "distributed_c10d.py", "all_reduce");
        add(r, dump);
        free(dump);
    }
    cr_assert_eq(dk_stacks_groups(stacks), 1024);
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_eq(count_lines(text), DK_STACKS_MAX_LINES, "%s", text);
    cr_assert(valid_utf8(text));
    cr_assert_not_null(strstr(text, "  \xe2\x80\xa6 and 980 more groups (980 ranks): see stacks.txt\n"),
                       "%s", text);
    cr_assert(strncmp(text, "  rank 0:", 9) == 0, "ties go to the lowest rank: %s", text);
    free(text);
    /* Well under a second: the groups are hashed, not compared pairwise. */
    cr_assert_lt((double) (clock() - start) / CLOCKS_PER_SEC, 2.0);
}

Test(stacks, the_line_budget_is_the_callers)
{
    for (int r = 0; r < 10; r++) {
        char *dump = dump_at(r + 1, NULL, NULL);
        add(r, dump);
        free(dump);
    }
    char *text = dk_stacks_summary(stacks, 3, "/logs/run-1/stacks.txt");
    cr_assert_eq(count_lines(text), 3);
    cr_assert_not_null(strstr(text, "and 8 more groups (8 ranks): see /logs/run-1/stacks.txt\n"));
    free(text);
}

Test(stacks, garbage_empty_and_cut_dumps_say_no_python_stack)
{
    static const char nul_bytes[] = "Thread 0x1\0\0\xff\xfe  File \"x\", line";
    cr_assert_eq(dk_stacks_add(stacks, 0, NULL, "", 0), 0);
    cr_assert_eq(dk_stacks_add(stacks, 1, NULL, NULL, 0), 0);
    cr_assert_eq(dk_stacks_add(stacks, 2, NULL, nul_bytes, sizeof nul_bytes - 1), 0);
    add(3, "  File \"" CELLS "1.py\", line 8 in");
    add(4, "\x1b[31mnot a dump at all\r\n\n\n");
    cr_assert_eq(dk_stacks_groups(stacks), 1);
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_str_eq(text, "  ranks 0" DK_EN_DASH "4 (5): no Python stack\n");
    free(text);
}

/* A dump cut in its last frame still tells the frames before the cut. */
Test(stacks, a_dump_cut_short_keeps_the_frames_it_has)
{
    size_t len;
    char *dump = fixture("rank0.txt", &len);
    char *cut = strstr(dump, "  File \"" CELLS);
    cr_assert_not_null(cut);
    cr_assert_eq(dk_stacks_add(stacks, 0, NULL, dump, (size_t) (cut - dump) + 20), 0);
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_str_eq(text, "  rank 0: torch.distributed.all_reduce  (not in the cell)\n");
    free(text);
    free(dump);
}

/* A huge dump keeps its tail, where the main thread is listed. */
Test(stacks, a_huge_dump_keeps_its_tail)
{
    size_t len;
    char *tail = fixture("rank2.txt", &len);
    size_t junk = 4 * DK_STACKS_MAX_DUMP;
    char *dump = malloc(junk + len);
    memset(dump, 'x', junk);
    memcpy(dump + junk, tail, len);
    cr_assert_eq(dk_stacks_add(stacks, 7, "node9", dump, junk + len), 0);
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_str_eq(text, "  rank 7: cell line 6\n");
    free(text);
    free(dump);
    free(tail);
}

Test(stacks, ranks_are_shown_as_runs)
{
    int ranks[255];
    size_t n = 0;
    for (int r = 0; r < 256; r++)
        if (r != 152)
            ranks[n++] = r;
    char buf[64];
    size_t at = 0;
    buf[0] = '\0';
    dk_ranks_format(ranks, n, 3, buf, sizeof buf, &at);
    cr_assert_str_eq(buf, "0" DK_EN_DASH "151, 153" DK_EN_DASH "255");
    int one = 2;
    at = 0;
    dk_ranks_format(&one, 1, 3, buf, sizeof buf, &at);
    cr_assert_str_eq(buf, "2");
    /* Two in a row: rank by rank for the groups, a run for lost ranks. */
    int pair[] = {0, 1, 3};
    at = 0;
    dk_ranks_format(pair, 3, 3, buf, sizeof buf, &at);
    cr_assert_str_eq(buf, "0, 1, 3");
    at = 0;
    dk_ranks_format(pair, 3, 2, buf, sizeof buf, &at);
    cr_assert_str_eq(buf, "0" DK_EN_DASH "1, 3");
    /* Every other rank does not fit: cut at a run, with an ellipsis. */
    int even[100];
    for (int i = 0; i < 100; i++)
        even[i] = 2 * i;
    at = 0;
    dk_ranks_format(even, 100, 3, buf, 16, &at);
    cr_assert_str_eq(buf, "0, 2, 4, 6, \xe2\x80\xa6");
    cr_assert_lt(at, 16);
}

Test(stacks, a_group_label_names_its_ranks_as_runs_and_count)
{
    for (int r = 0; r < 256; r++) {
        char *dump = dump_at(r == 152 ? 6 : 8, NULL, NULL);
        add(r, dump);
        free(dump);
    }
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_str_eq(text,
        "  rank 152:                   cell line 6\n"
        "  ranks 0" DK_EN_DASH "151, 153" DK_EN_DASH "255 (255): cell line 8\n");
    free(text);
}

Test(stacks, a_rank_is_added_once)
{
    add(3, "");
    cr_assert_eq(dk_stacks_add(stacks, 3, NULL, "", 0), -1);
    cr_assert_eq(dk_stacks_add(stacks, -1, NULL, "", 0), -1);
    cr_assert_eq(dk_stacks_add(stacks, DK_STACKS_MAX_RANK + 1, NULL, "", 0), -1);
    cr_assert_eq(dk_stacks_ranks(stacks), 1);
}

/* stacks.txt: the groups in the summary's order, every rank's dump whole. */
Test(stacks, the_full_dumps_are_written_grouped)
{
    add_fixture(3, "rank0.txt");
    add_fixture(0, "rank0.txt");
    add_fixture(2, "rank2.txt");
    char *out = NULL;
    size_t out_len = 0;
    FILE *f = open_memstream(&out, &out_len);
    cr_assert_eq(dk_stacks_write(stacks, f), 0);
    fclose(f);
    const char *head = strstr(out, "# 3 ranks in 2 groups");
    const char *g1 = strstr(out, "== rank 2: cell line 6\n");
    const char *r2 = strstr(out, "--- rank 2 on node1 ---\n");
    const char *g2 = strstr(out, "== ranks 0, 3 (2): torch.distributed.all_reduce (cell line 8)\n");
    const char *r0 = strstr(out, "--- rank 0 on node1 ---\n");
    const char *r3 = strstr(out, "--- rank 3 on node1 ---\n");
    cr_assert(head && g1 && r2 && g2 && r0 && r3, "%s", out);
    cr_assert(head < g1 && g1 < r2 && r2 < g2 && g2 < r0 && r0 < r3, "%s", out);
    cr_assert_not_null(strstr(r0, "distributed_c10d.py\", line 5 in all_reduce\n"));
    free(out);
}
