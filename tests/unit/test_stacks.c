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
#include <unistd.h>

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

/* ---- the last collective (torch's NCCL flight recorder) ------------------ */

/* dump_at, then the flight line a rank's sampler adds (python/distkernel/_flight.py). */
static void add_flight(int rank, int line, const char *flight)
{
    char *dump = dump_at(line, TORCH "distributed_c10d.py", "all_reduce");
    char text[2048];
    snprintf(text, sizeof text, "%s%s%s", dump, flight ? flight : "", flight ? "\n" : "");
    free(dump);
    add(rank, text);
}

#define FLIGHT(seq, state) \
    DK_STACKS_FLIGHT "op=all_reduce seq=" #seq " state=" state " bytes=4194304 pg=0"

Test(stacks, a_flight_line_is_read_whatever_its_field_order_and_extra_fields)
{
    dk_flight_t f;
    cr_assert(dk_flight_parse("Thread 0x1 (most recent call first):\n" DK_STACKS_FLIGHT
                              "pg=default_pg state=started future=1 seq=12 op=all_gather "
                              "shape=[8,16] \n", &f));
    cr_assert_eq(f.seq, 12);
    cr_assert_str_eq(f.op, "all_gather");
    cr_assert_str_eq(f.state, "started");
    cr_assert_str_eq(f.shape, "[8,16]");
    cr_assert_str_eq(f.pg, "default_pg");
    cr_assert_eq(f.bytes, -1);
}

Test(stacks, the_last_flight_line_of_a_dump_counts)
{
    dk_flight_t f;
    cr_assert(dk_flight_parse(FLIGHT(3, "completed") "\n" FLIGHT(4, "started"), &f));
    cr_assert_eq(f.seq, 4);
    cr_assert_eq(f.bytes, 4194304);
}

Test(stacks, a_malformed_flight_line_is_no_line)
{
    static const char *const bad[] = {
        DK_STACKS_FLIGHT "seq=12 state=started",               /* no op */
        DK_STACKS_FLIGHT "op=all_reduce",                      /* no seq */
        DK_STACKS_FLIGHT "op=all_reduce seq=-1",
        DK_STACKS_FLIGHT "op=all_reduce seq=12x",
        DK_STACKS_FLIGHT "op=all_reduce seq=99999999999999999999",
        DK_STACKS_FLIGHT "op= seq=1",
        DK_STACKS_FLIGHT,
        "distkernel flight:op=all_reduce seq=1",                 /* not the line's start */
        "  " DK_STACKS_FLIGHT "op=all_reduce seq=1",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dk_flight_t f;
        cr_assert_not(dk_flight_parse(bad[i], &f), "%s", bad[i]);
        cr_assert_eq(f.seq, -1);
    }
    dk_flight_t f;
    cr_assert_not(dk_flight_parse(NULL, &f));
}

Test(stacks, a_flight_lines_fields_are_bounded_and_printable)
{
    char line[4096];
    int n = snprintf(line, sizeof line, DK_STACKS_FLIGHT "seq=1 op=");
    memset(line + n, 'a', 1000);
    snprintf(line + n + 1000, sizeof line - n - 1000, " state=st\x01rt\xc3\xa9\xe2\x80\x93zzzzzzzzzz");
    dk_flight_t f;
    cr_assert(dk_flight_parse(line, &f));
    cr_assert_eq(strlen(f.op), sizeof f.op - 1);
    cr_assert_str_eq(f.state, "st?rt?????zzzzz");
}

Test(stacks, sizes_are_written_in_binary_units)
{
    char buf[32];
    dk_flight_size(512, buf, sizeof buf);
    cr_assert_str_eq(buf, "512 B");
    dk_flight_size(4194304, buf, sizeof buf);
    cr_assert_str_eq(buf, "4 MiB");
    dk_flight_size(1536LL << 20, buf, sizeof buf);
    cr_assert_str_eq(buf, "1.5 GiB");
    dk_flight_size(100LL << 10, buf, sizeof buf);
    cr_assert_str_eq(buf, "100 KiB");
}

Test(stacks, a_group_that_agrees_shows_its_last_collective)
{
    for (int r = 0; r < 4; r++)
        add_flight(r, r == 2 ? 6 : 8, r == 2 ? NULL : FLIGHT(12, "started"));
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_str_eq(text,
        "  rank 2:            torch.distributed.all_reduce  (cell line 6)\n"
        "  ranks 0, 1, 3 (3): torch.distributed.all_reduce  (cell line 8)  "
        "last all_reduce #12, 4 MiB, started\n");
    free(text);
}

Test(stacks, a_rank_one_collective_behind_stands_out_in_its_group)
{
    for (int r = 0; r < 4; r++)
        add_flight(r, 8, r == 3 ? FLIGHT(11, "completed") : FLIGHT(12, "started"));
    cr_assert_eq(dk_stacks_groups(stacks), 1, "the flight line does not split groups");
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_str_eq(text,
        "  ranks 0" DK_EN_DASH "3 (4): torch.distributed.all_reduce  (cell line 8)  "
        "last all_reduce #11" DK_EN_DASH "12, 4 MiB, started; at #11 (completed): rank 3\n");
    free(text);
}

Test(stacks, ranks_without_a_flight_line_are_counted_not_guessed)
{
    add_flight(0, 8, FLIGHT(5, "started"));
    add_flight(1, 8, NULL);
    add_flight(2, 8, DK_STACKS_FLIGHT "op=all_reduce");            /* malformed */
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_not_null(strstr(text, "last all_reduce #5, 4 MiB, started; 2 ranks not recorded\n"),
                       "%s", text);
    free(text);
}

Test(stacks, ranks_that_disagree_on_op_size_and_state_say_so)
{
    add_flight(0, 8, DK_STACKS_FLIGHT "op=all_reduce seq=7 state=started bytes=16");
    add_flight(1, 8, DK_STACKS_FLIGHT "op=broadcast seq=7 state=scheduled bytes=32");
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_not_null(strstr(text, "last collective #7, sizes differ (ops differ), states differ\n"),
                       "%s", text);
    free(text);
}

/* 4,096 ranks in 4 groups, every 101st rank one collective behind: 4 lines,
 * each naming its laggards as bounded runs, valid UTF-8, under 512 bytes. */
Test(stacks, four_thousand_ranks_with_laggards_stay_four_bounded_lines)
{
    clock_t start = clock();
    for (int r = 0; r < 4096; r++)
        add_flight(r, 7 + r % 4, r % 101 == 0 ? FLIGHT(1999, "completed") : FLIGHT(2000, "started"));
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert_eq(count_lines(text), 4, "%s", text);
    cr_assert(valid_utf8(text), "%s", text);
    for (const char *line = text; *line;) {
        const char *nl = strchr(line, '\n');
        cr_assert_lt((size_t) (nl - line), 512);
        cr_assert_not_null(strstr(line, "#1999" DK_EN_DASH "2000"), "%.*s", (int) (nl - line), line);
        line = nl + 1;
    }
    cr_assert_not_null(strstr(text, "at #1999 (completed), 11 ranks: 0, 404, 808"), "%s", text);
    free(text);
    char *out = NULL;
    size_t out_len = 0;
    FILE *f = open_memstream(&out, &out_len);
    cr_assert_eq(dk_stacks_write(stacks, f), 0);
    fclose(f);
    cr_assert_not_null(strstr(out, "--- rank 4095 on node1 ---\n"));
    cr_assert_not_null(strstr(out, FLIGHT(1999, "completed") "\n"), "each rank's line in full");
    free(out);
    cr_assert_lt((double) (clock() - start) / CLOCKS_PER_SEC, 2.0);
}

/* The longest stack part a line can have (a long call, three runs of long
 * cell functions at nine-digit lines): the flight text gets what is left,
 * and the line stays under 512 bytes. */
Test(stacks, a_long_stack_leaves_the_flight_text_what_fits_in_the_line)
{
    char fn[200], call[300], dump[4096];
    memset(fn, 'f', sizeof fn - 1);
    fn[sizeof fn - 1] = '\0';
    snprintf(call, sizeof call, TORCH "%s.py", fn);
    for (int r = 0; r < 2; r++) {
        int n = snprintf(dump, sizeof dump, "Thread 0x1 (most recent call first):\n"
                         "  File \"%s\", line 1 in %s\n", call, fn);
        for (int k = 0; k < 5; k++)
            n += snprintf(dump + n, sizeof dump - n,
                          "  File \"" CELLS "1.py\", line %d in %s%d\n", 123456789 - k, fn, k);
        snprintf(dump + n, sizeof dump - n, DK_STACKS_FLIGHT
                 "op=%s seq=%d state=completed bytes=999999999999 shape=[1]\n", fn, 100000 + r);
        add(r * 1000, dump);
    }
    char *text = dk_stacks_summary(stacks, 0, NULL);
    cr_assert(valid_utf8(text), "%s", text);
    const char *nl = strchr(text, '\n');
    cr_assert_lt((size_t) (nl - text), 512, "%s", text);
    cr_assert_not_null(strstr(text, "  last "), "%s", text);
    free(text);
}

/* The innermost cell line shows its source, read from the kernel's own copy
 * of the cell, as a traceback does: a call into C (time.sleep) shows no
 * frame of its own, and the source says which call it is. */
Test(stacks, the_innermost_cell_line_shows_its_source)
{
    char dir[64] = "/tmp/dk-test-cells-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char folder[80], file[96];
    snprintf(folder, sizeof folder, "%s/", dir);
    snprintf(file, sizeof file, "%s/1.py", dir);
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fputs("import time, torch.distributed as dist\n"
          "    dist.all_reduce(t)   \n"
          "time.sleep(600)\n"
          "x = '", f);
    for (int i = 0; i < 200; i++)
        fputc('y', f);
    fputs("'\n", f);
    fclose(f);
    dk_stacks_t *own = dk_stacks_new(dk_stacks_is_under, folder);
    cr_assert_not_null(own);
    char dump[1024];
    const char *lines[] = {"3", "4", "9"};
    for (int r = 0; r < 3; r++) {
        snprintf(dump, sizeof dump, "Thread 0x1 (most recent call first):\n"
                                    "  File \"%s\", line %s in <module>\n", file, lines[r]);
        cr_assert_eq(dk_stacks_add(own, r, "node1", dump, strlen(dump)), 0);
    }
    snprintf(dump, sizeof dump, "Thread 0x1 (most recent call first):\n"
                                "  File \"" TORCH "distributed_c10d.py\", line 3 in all_reduce\n"
                                "  File \"%s\", line 2 in <module>\n", file);
    cr_assert_eq(dk_stacks_add(own, 3, "node1", dump, strlen(dump)), 0);
    char *text = dk_stacks_summary(own, 0, NULL);
    char want[1024], ys[80];
    memset(ys, 'y', 75);
    ys[75] = '\0';
    snprintf(want, sizeof want,
             "  rank 0: cell line 3: time.sleep(600)\n"
             "  rank 1: cell line 4: x = '%s\xe2\x80\xa6\n"
             "  rank 2: cell line 9\n"     /* past the cell's end: the line alone */
             "  rank 3: torch.distributed.all_reduce  (cell line 2: dist.all_reduce(t))\n",
             ys);
    cr_assert_str_eq(text, want);
    free(text);
    dk_stacks_destroy(&own);
    unlink(file);
    rmdir(dir);
}

/* Like every _destroy: NULL, or a pointer to NULL, is nothing to do. */
Test(destroy, stacks_takes_null)
{
    dk_stacks_destroy(NULL);
    dk_stacks_t *none = NULL;
    dk_stacks_destroy(&none);
    cr_assert_null(none);
}
