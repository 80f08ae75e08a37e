/*
 * A kernel's run folders (distributed/dk_dist_logs.h): the root is measured
 * and pruned before the first run, and again only once the kernel's own runs
 * have written more than the room it had left, or when the cap changes.
 * Each test works in a fresh directory under /tmp (DISTKERNEL_LOG_DIR).
 */
#include <criterion/criterion.h>

#include "dk_dist_logs.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tmp_base.h"

#define KIB 1024ULL
#define MIB (1024 * KIB)

static char err[1024];

static void setup(void)
{
    tmp_base_make("dist-logs");
    setenv("DISTKERNEL_LOG_DIR", base, 1);
}

TestSuite(dist_logs, .init = setup, .fini = tmp_base_remove);

/* BYTES of real data (not a hole) in PATH. */
static void fill(const char *path, unsigned long long bytes)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0, "%s", path);
    char block[65536];
    memset(block, 'x', sizeof block);
    for (unsigned long long done = 0; done < bytes; done += sizeof block)
        cr_assert_eq(write(fd, block, sizeof block), (ssize_t) sizeof block);
    close(fd);
}

/* A run folder of an exited kernel, holding BYTES: the first that pruning takes. */
static const char *foreign_run(unsigned long long bytes)
{
    int pid = 4000000;
    while (kill(pid, 0) == 0)
        pid++;
    static char run[512];
    snprintf(run, sizeof run, "%s/kernel-%d", base, pid);
    cr_assert_eq(mkdir(run, 0700), 0);
    strcat(run, "/run-0001-old");
    cr_assert_eq(mkdir(run, 0700), 0);
    char file[600];
    snprintf(file, sizeof file, "%s/rank-0.log", run);
    fill(file, bytes);
    return run;
}

static void next(dk_dist_logs_t *logs, const char *id, unsigned long long cap, char *out)
{
    cr_assert_eq(dk_dist_logs_next(logs, id, cap, out, 4096, err, sizeof err), 0, "%s", err);
}

Test(dist_logs, the_root_is_measured_again_only_once_the_kernel_wrote_its_room)
{
    dk_dist_logs_t logs = {0};
    char first[4096], second[4096], third[4096];
    next(&logs, "first", 4 * MIB, first);
    /* Another kernel's run puts the root over its cap behind this kernel's back;
     * this kernel's runs have written nothing, so it does not look. */
    const char *other = foreign_run(5 * MIB);
    next(&logs, "second", 4 * MIB, second);
    cr_assert(exists(other), "the root was measured although the kernel wrote nothing");
    /* The second run writes more than the room the root had: the next run
     * measures it, and the oldest runs go until it fits. */
    char file[4200];
    snprintf(file, sizeof file, "%s/rank-0.log", second);
    fill(file, 4 * MIB + 64 * KIB);
    next(&logs, "third", 4 * MIB, third);
    cr_assert_not(exists(other), "the root was not measured after the kernel filled its room");
    cr_assert(exists(third));
}

Test(dist_logs, a_new_cap_is_measured_at_once)
{
    dk_dist_logs_t logs = {0};
    char out[4096];
    next(&logs, "first", 64 * MIB, out);
    const char *other = foreign_run(2 * MIB);
    next(&logs, "second", 64 * MIB, out);
    cr_assert(exists(other));
    next(&logs, "third", 1 * MIB, out);
    cr_assert_not(exists(other), "a smaller cap was not applied before the run");
}
