/*
 * What of a run's log folder goes with its MLflow run
 * (distributed/dk_dist_artifacts.h), and the archive it is sent in
 * (runtime/mlflow/dk_tgz.h): which ranks' logs go as files of their own at
 * 2 and at 1,024 ranks, a log cut to its tail saying so, and an archive that
 * the system's tar reads back whole.
 */
#include <criterion/criterion.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dk_dist_artifacts.h"
#include "dk_tgz.h"

static char dir[64];

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/dk-test-artifacts-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    cr_assert_eq(system(cmd), 0);
}

static void write_file(const char *name, const char *text, size_t len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(text, 1, len, f), len);
    fclose(f);
}

static void write_logs(int world)
{
    for (int r = 0; r < world; r++) {
        char name[32], text[64];
        snprintf(name, sizeof name, "rank-%d.log", r);
        int n = snprintf(text, sizeof text, "output of rank %d\n", r);
        write_file(name, text, (size_t) n);
    }
}

static const dk_tracked_file_t *find(const dk_tracked_file_t *f, size_t n, const char *path)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(f[i].path, path) == 0)
            return &f[i];
    return NULL;
}

Test(pick, up_to_eight_ranks_every_log_is_a_file_of_its_own)
{
    dk_dist_artifacts_t a = {.world = 2, .root = -1};
    int out[8];
    cr_assert_eq(dk_dist_artifacts_pick(&a, out, 8), 2);
    cr_assert(out[0] == 0 && out[1] == 1);
}

Test(pick, at_1024_ranks_rank_0_the_root_cause_and_the_first_failed)
{
    static dk_dist_rank_t ranks[1024];
    memset(ranks, 0, sizeof ranks);
    for (int r = 0; r < 1024; r++)
        ranks[r].state = DK_RANK_DONE;
    int failed[] = {5, 300, 301, 302, 900};
    for (size_t i = 0; i < sizeof failed / sizeof *failed; i++)
        ranks[failed[i]].state = DK_RANK_FAILED;
    ranks[5].lost = true;   /* a lost node's ranks say nothing of their own */
    dk_dist_artifacts_t a = {.world = 1024, .ranks = ranks, .root = 900};
    int out[8];
    cr_assert_eq(dk_dist_artifacts_pick(&a, out, 8), DK_ARTIFACTS_PICKED);
    cr_assert_eq(out[0], 0);
    cr_assert_eq(out[1], 900);
    cr_assert_eq(out[2], 300);
    cr_assert_eq(out[3], 301);
}

Test(collect, a_small_run_sends_each_log_and_stacks_only_when_asked)
{
    make_dir();
    write_logs(2);
    write_file("stacks.txt", "where they were\n", 16);
    dk_dist_artifacts_t a = {.log_dir = dir, .world = 3, .root = -1};  /* rank 2 has no log */
    size_t n;
    dk_tracked_file_t *f = dk_dist_artifacts_collect(&a, &n);
    cr_assert_eq(n, 2);
    cr_assert_str_eq(f[0].path, "logs/rank-0.log");
    cr_assert_eq(f[0].len, strlen("output of rank 0\n"));
    cr_assert(memcmp(f[1].data, "output of rank 1\n", f[1].len) == 0);
    dk_dist_artifacts_free(f, n);
    a.stacks = true;
    f = dk_dist_artifacts_collect(&a, &n);
    cr_assert_eq(n, 3);
    cr_assert_not_null(find(f, n, "stacks.txt"));
    dk_dist_artifacts_free(f, n);
    remove_dir();
}

Test(collect, a_failed_attempts_files_go_under_its_folder_with_its_error)
{
    make_dir();
    write_logs(12);
    write_file("error.txt", "ValueError: rank 1\n", 19);
    write_file("stacks.txt", "where they were\n", 16);
    dk_dist_artifacts_t a = {.log_dir = dir, .world = 12, .root = 1, .stacks = true};
    size_t n;
    dk_tracked_file_t *f = dk_dist_artifacts_collect(&a, &n);
    cr_assert_null(find(f, n, "error.txt"), "only when the run kept its error");
    dk_dist_artifacts_free(f, n);
    a.under = "attempt-100/";
    a.error = true;
    f = dk_dist_artifacts_collect(&a, &n);
    cr_assert_eq(n, 6);
    for (size_t i = 0; i < n; i++)
        cr_assert(strncmp(f[i].path, "attempt-100/", 12) == 0, "%s", f[i].path);
    cr_assert_not_null(find(f, n, "attempt-100/logs/rank-0.log"));
    cr_assert_not_null(find(f, n, "attempt-100/logs/rank-1.log"));
    cr_assert_not_null(find(f, n, "attempt-100/logs/ranks.tar.gz"));
    cr_assert_not_null(find(f, n, "attempt-100/logs/index.txt"));
    cr_assert_not_null(find(f, n, "attempt-100/stacks.txt"));
    const dk_tracked_file_t *e = find(f, n, "attempt-100/error.txt");
    cr_assert_not_null(e);
    cr_assert(memcmp(e->data, "ValueError: rank 1\n", e->len) == 0);
    dk_dist_artifacts_free(f, n);
    remove_dir();
}

Test(collect, a_log_larger_than_the_bound_keeps_its_end_and_says_so)
{
    make_dir();
    size_t len = DK_ARTIFACTS_LOG_MAX + 1000;
    char *big = malloc(len);
    memset(big, 'x', len);
    memcpy(big + len - 5, "LAST\n", 5);
    write_file("rank-0.log", big, len);
    free(big);
    dk_dist_artifacts_t a = {.log_dir = dir, .world = 1, .root = -1};
    size_t n;
    dk_tracked_file_t *f = dk_dist_artifacts_collect(&a, &n);
    cr_assert_eq(n, 1);
    const char *text = f[0].data;
    cr_assert(strncmp(text, "[distkernel] the first 1000 bytes of this log are left out here; "
                            "the whole log is ", 82) == 0, "%.120s", text);
    cr_assert(strstr(text, dir), "names the whole log");
    cr_assert_lt(f[0].len, DK_ARTIFACTS_LOG_MAX + 300);
    cr_assert(memcmp(text + f[0].len - 5, "LAST\n", 5) == 0, "the end is kept");
    dk_dist_artifacts_free(f, n);
    remove_dir();
}

Test(collect, above_eight_ranks_an_archive_tar_reads_and_an_index)
{
    make_dir();
    write_logs(20);
    write_file("agents.log", "agent line\n", 11);
    static dk_dist_rank_t ranks[20];
    memset(ranks, 0, sizeof ranks);
    for (int r = 0; r < 20; r++)
        ranks[r].state = DK_RANK_DONE;
    ranks[13].state = DK_RANK_FAILED;
    const char *hosts[20];
    for (int r = 0; r < 20; r++)
        hosts[r] = r < 10 ? "node1" : "node2";
    dk_dist_artifacts_t a = {.log_dir = dir, .world = 20, .ranks = ranks, .hosts = hosts,
                             .root = 13};
    size_t n;
    dk_tracked_file_t *f = dk_dist_artifacts_collect(&a, &n);
    cr_assert_eq(n, 4, "rank 0, rank 13, the index and the archive");
    cr_assert_str_eq(f[0].path, "logs/rank-0.log");
    cr_assert_str_eq(f[1].path, "logs/rank-13.log");
    const dk_tracked_file_t *index = find(f, n, "logs/index.txt");
    cr_assert_not_null(index);
    char *text = strndup(index->data, index->len);
    cr_assert(strstr(text, "rank 13\tnode2\tfailed (root cause)\t18\twhole\n"), "%s", text);
    cr_assert(strstr(text, "rank 19\tnode2\tfinished\t18\twhole\n"), "%s", text);
    free(text);
    const dk_tracked_file_t *tgz = find(f, n, "logs/ranks.tar.gz");
    cr_assert_not_null(tgz);
    /* What the system's tar makes of it. */
    char path[512], cmd[2048];
    snprintf(path, sizeof path, "%s/out", dir);
    cr_assert_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s/ranks.tar.gz", dir);
    FILE *out = fopen(path, "w");
    cr_assert_eq(fwrite(tgz->data, 1, tgz->len, out), tgz->len);
    fclose(out);
    snprintf(cmd, sizeof cmd, "tar -xzf '%s' -C '%s/out' && cmp -s '%s/out/rank-19.log' "
             "'%s/rank-19.log' && cmp -s '%s/out/agents.log' '%s/agents.log' && "
             "test $(ls '%s/out' | wc -l) = 21", path, dir, dir, dir, dir, dir, dir);
    cr_assert_eq(system(cmd), 0, "tar read back every rank's log and agents.log whole");
    dk_dist_artifacts_free(f, n);
    remove_dir();
}

Test(tgz, names_tar_cannot_hold_or_that_climb_out_are_refused)
{
    dk_tgz_t *t = dk_tgz_new();
    cr_assert_not(dk_tgz_add(t, "../etc/passwd", "x", 1, 0));
    dk_tgz_destroy(t);
    t = dk_tgz_new();
    cr_assert_not(dk_tgz_add(t, "/abs", "x", 1, 0));
    size_t len;
    cr_assert_null(dk_tgz_finish(t, &len), "an archive that refused a file is not made");
    char longname[120];
    memset(longname, 'a', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    t = dk_tgz_new();
    cr_assert_not(dk_tgz_add(t, longname, "x", 1, 0));
    dk_tgz_destroy(t);
}
