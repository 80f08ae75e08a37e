/*
 * Capped log files (runtime/logs/dk_logfile.h): head, marker, tail, bounded on disk.
 * Each test works in a fresh directory under /tmp.
 */
#include <criterion/criterion.h>

#include "dk_logdir.h"
#include "dk_logfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "tmp_base.h"

#define OTHER_UID 65534   /* nobody */

static char err[1024];

static void setup(void)
{
    tmp_base_make("logfile");
}

TestSuite(logfile, .init = setup, .fini = tmp_base_remove);

/* ---- capped logs --------------------------------------------------------- */

Test(logfile, a_log_under_its_cap_is_kept_whole)
{
    int root = open(base, O_RDONLY | O_DIRECTORY);
    dk_logfile_t *log = dk_logfile_new(root, "rank-0.log", 64 << 10, err, sizeof err);
    cr_assert_not_null(log, "%s", err);
    for (int i = 0; i < 100; i++) {
        char line[32];
        int n = snprintf(line, sizeof line, "line %d\n", i);
        cr_assert_eq(dk_logfile_write(log, line, (size_t) n), 0);
    }
    cr_assert(!dk_logfile_capped(log));
    cr_assert_eq(dk_logfile_close(&log), 0);
    cr_assert_null(log);
    char *text = read_file(at("rank-0.log"), NULL);
    cr_assert(strncmp(text, "line 0\n", 7) == 0 && strstr(text, "line 99\n"));
    cr_assert_null(strstr(text, "[distkernel]"));
    free(text);
    close(root);
}

Test(logfile, a_log_past_its_cap_keeps_head_and_tail_with_a_marker)
{
    const unsigned long long cap = 64 << 10;
    int root = open(base, O_RDONLY | O_DIRECTORY);
    dk_logfile_t *log = dk_logfile_new(root, "rank-0.log", cap, err, sizeof err);
    cr_assert_not_null(log, "%s", err);
    const int lines = 100000;   /* ~1.3 MB, twenty times the cap */
    for (int i = 0; i < lines; i++) {
        char line[32];
        int n = snprintf(line, sizeof line, "line %07d\n", i);
        cr_assert_eq(dk_logfile_write(log, line, (size_t) n), 0);
        if (i % 1000 == 0) {
            struct stat a, b, c;
            unsigned long long on_disk = 0;
            if (stat(at("rank-0.log"), &a) == 0) on_disk += (unsigned long long) a.st_size;
            if (stat(at("rank-0.log.tail-0"), &b) == 0) on_disk += (unsigned long long) b.st_size;
            if (stat(at("rank-0.log.tail-1"), &c) == 0) on_disk += (unsigned long long) c.st_size;
            cr_assert_leq(on_disk, cap, "bounded on disk while written: %llu", on_disk);
        }
    }
    cr_assert(dk_logfile_capped(log));
    cr_assert_eq(dk_logfile_total(log), (unsigned long long) lines * 13);
    cr_assert_eq(dk_logfile_close(&log), 0);
    size_t len;
    char *text = read_file(at("rank-0.log"), &len);
    cr_assert_leq(len, cap + 512);
    cr_assert(strncmp(text, "line 0000000\nline 0000001\n", 26) == 0, "the head");
    char *marker = strstr(text, "\n[distkernel] ");
    cr_assert_not_null(marker);
    cr_assert(strstr(marker, "bytes of output left out here") && strstr(marker, "log_cap="));
    char *after = strchr(marker + 1, '\n');
    cr_assert(after && strncmp(after + 1, "line ", 5) == 0, "the tail starts at a line: %.40s",
              after ? after + 1 : "");
    cr_assert(len > 26 && strcmp(text + len - 13, "line 0099999\n") == 0, "the tail ends it");
    cr_assert_not_null(strstr(marker, "line 0099000\n"), "the tail holds at least cap/4");
    cr_assert(!exists(at("rank-0.log.tail-0")) && !exists(at("rank-0.log.tail-1")));
    free(text);
    close(root);
}

Test(logfile, a_tiny_cap_is_raised_to_the_minimum)
{
    int root = open(base, O_RDONLY | O_DIRECTORY);
    dk_logfile_t *log = dk_logfile_new(root, "rank-0.log", 10, err, sizeof err);
    cr_assert_not_null(log, "%s", err);
    cr_assert_eq(dk_logfile_cap(log), DK_LOG_CAP_MIN);
    dk_logfile_close(&log);
    close(root);
}

Test(logfile, output_that_exactly_fills_the_head_then_goes_on_is_kept)
{
    int root = open(base, O_RDONLY | O_DIRECTORY);
    dk_logfile_t *log = dk_logfile_new(root, "rank-0.log", DK_LOG_CAP_MIN, err, sizeof err);
    cr_assert_not_null(log, "%s", err);
    char head[DK_LOG_CAP_MIN / 2];
    memset(head, 'h', sizeof head);
    cr_assert_eq(dk_logfile_write(log, head, sizeof head), 0);
    cr_assert(!dk_logfile_capped(log));
    cr_assert_eq(dk_logfile_write(log, "tail\n", 5), 0, "%s", strerror(errno));
    cr_assert(dk_logfile_capped(log));
    cr_assert_eq(dk_logfile_close(&log), 0);
    size_t len;
    char *text = read_file(at("rank-0.log"), &len);
    cr_assert(len > 5 && strcmp(text + len - 5, "tail\n") == 0);
    cr_assert_not_null(strstr(text, "0 bytes of output left out here"));
    free(text);
    close(root);
}

Test(logfile, a_capped_tail_starts_at_a_line_not_in_the_middle_of_one)
{
    int root = open(base, O_RDONLY | O_DIRECTORY);
    dk_logfile_t *log = dk_logfile_new(root, "rank-0.log", DK_LOG_CAP_MIN, err, sizeof err);
    cr_assert_not_null(log, "%s", err);
    char head[DK_LOG_CAP_MIN / 2];
    memset(head, 'h', sizeof head);
    cr_assert_eq(dk_logfile_write(log, head, sizeof head), 0);
    cr_assert_eq(dk_logfile_write(log, "...rest of a line\n", 18), 0);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(dk_logfile_write(log, "line\n", 5), 0);
    cr_assert_eq(dk_logfile_close(&log), 0);
    char *text = read_file(at("rank-0.log"), NULL);
    char *marker = strstr(text, "\n[distkernel] ");
    cr_assert_not_null(marker);
    cr_assert(strstr(marker, "\n[distkernel] 18 bytes of output left out here"), "%.80s", marker);
    char *after = strchr(marker + 1, '\n') + 1;
    cr_assert(strncmp(after, "line\n", 5) == 0 && !strstr(text, "rest of a line"), "%.40s", after);
    free(text);
    close(root);
}

/* Like every _destroy (here a close, which also writes the log): NULL, or a
 * pointer to NULL, is nothing to do. */
Test(destroy, logfile_close_takes_null)
{
    cr_assert_eq(dk_logfile_close(NULL), 0);
    dk_logfile_t *none = NULL;
    cr_assert_eq(dk_logfile_close(&none), 0);
    cr_assert_null(none);
}
