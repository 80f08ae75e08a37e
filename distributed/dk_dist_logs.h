/*
 * dk_dist_logs: where a kernel's runs leave their rank-N.log files, and how
 * many it keeps.
 *
 * A run's folder is ROOT/kernel-PID/run-NNNN-ID, ROOT being DISTKERNEL_LOG_DIR
 * or the user's state directory (dk_logdir_default_root), checked to be the
 * user's alone on every run (the notebook may change DISTKERNEL_LOG_DIR).
 * Retention (runtime/logs/dk_logdir does the removing, never through a symlink,
 * never a running job's folder):
 *   - a kernel keeps its last DK_DIST_KEEP_RUN_LOGS runs, so a long session does
 *     not fill the disk with logs nobody will read;
 *   - folders of exited kernels are kept for reading after the fact, the newest
 *     DK_DIST_KEEP_DEAD_KERNELS always, the others until DK_DIST_DEAD_KERNEL_AGE_S
 *     old; a folder whose kernel still runs is not touched by that rule; they
 *     are looked at once per kernel, before its first run;
 *   - the whole root holds at most DISTKERNEL_LOG_ROOT_CAP (default
 *     DK_LOG_ROOT_CAP_DEFAULT): before a run, the oldest runs of any kernel go
 *     first until it fits. Measuring the root reads every file's size, which
 *     costs more than a `pass` cell on started ranks once the root holds
 *     hundreds of runs; so the kernel measures it before its first run and
 *     again only once its own runs since then have written more than the room
 *     the root had left (each finished run's folder is measured, which is
 *     cheap), or when the cap changes. Other kernels measure before their own
 *     runs, so the root is over its cap by at most what runs write meanwhile.
 * A run folder is made fresh here and held by the job from its start; a pruner of
 * another kernel in between could only take it if it were the oldest run of an
 * over-full root, and then the run fails to start with a message, nothing worse.
 */
#ifndef DK_DIST_LOGS_H
#define DK_DIST_LOGS_H

#include <stddef.h>

#define DK_DIST_KEEP_RUN_LOGS 20
#define DK_DIST_KEEP_DEAD_KERNELS 10
#define DK_DIST_DEAD_KERNEL_AGE_S (24 * 3600)

/* One kernel's run folders: how many runs it started and its newest ones, a
 * ring. Zeroed is empty; it owns nothing. */
typedef struct {
    char kept[DK_DIST_KEEP_RUN_LOGS][128];
    unsigned long runs;
    unsigned long long cap_seen;    /* the root cap at the last measurement */
    unsigned long long room;        /* what the root had left then, less what
                                       this kernel's runs wrote since */
} dk_dist_logs_t;

/* Make the next run's log folder (RUN_ID in its name), pruning as above with
 * ROOT_CAP bytes for the whole root; its path goes in OUT. Returns 0, or -1
 * with ERR ("no rank was started: ...", saying what to do) when the root is
 * not safe or the folder cannot be made. */
int dk_dist_logs_next(dk_dist_logs_t *self, const char *run_id, unsigned long long root_cap,
                      char *out, size_t outlen, char *err, size_t errlen);

/* The size in the environment variable NAME into OUT, DFLT when it is unset or
 * empty. Returns 0, or -1 with ERR when it is not a size. */
int dk_dist_logs_size_from_env(const char *name, unsigned long long dflt,
                               unsigned long long *out, char *err, size_t errlen);

#endif
