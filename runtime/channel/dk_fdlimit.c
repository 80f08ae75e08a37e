/*
 * dk_fdlimit: raising the descriptor limit and checking a job against it.
 * See dk_fdlimit.h.
 *
 * The count of open descriptors is taken when the job starts, so descriptors
 * opened later by other threads (a frontend connecting during the run) are not
 * in it; SPARE leaves room for those.
 */
#include "dk_fdlimit.h"
#include "dk_err.h"

#include "dk_backchan.h"

#include <dirent.h>
#include <stdio.h>
#include <sys/resource.h>

#define PER_RANK 5          /* log, stdout, stderr, pidfd, back-channel connection */
#define SPAWN_TRANSIENT 7   /* dk_spawn: three pipes and /dev/null, while one rank starts */
#define PER_JOB 6           /* back-channel listener, wake pipe, the MASTER_PORT probe,
                               the owner locks of the channel's and the stacks' folders */
#define SPARE 32            /* frontends, Python, libraries, during the run */

unsigned long dk_fdlimit_raise(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (rl.rlim_cur < rl.rlim_max) {
        struct rlimit want = {rl.rlim_max, rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &want) == 0)
            rl.rlim_cur = rl.rlim_max;
    }
    return (unsigned long) rl.rlim_cur;
}

size_t dk_fdlimit_open_count(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return 0;
    size_t n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n > 0 ? n - 1 : 0;   /* the directory's own descriptor */
}

size_t dk_fdlimit_job_need(int world_size)
{
    size_t n = world_size > 0 ? (size_t) world_size : 0;
    return PER_RANK * n + DK_BC_SLACK + SPAWN_TRANSIENT + PER_JOB + SPARE;
}

bool dk_fdlimit_job_check(int world_size, char *err, size_t errlen)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return true;
    size_t open_now = dk_fdlimit_open_count();
    size_t free_now = rl.rlim_cur > open_now ? (size_t) rl.rlim_cur - open_now : 0;
    size_t need = dk_fdlimit_job_need(world_size);
    if (need <= free_now)
        return true;
    size_t fit = free_now > dk_fdlimit_job_need(0)
                     ? (free_now - dk_fdlimit_job_need(0)) / PER_RANK : 0;
    char advice[160];
    if (rl.rlim_max == RLIM_INFINITY)
        snprintf(advice, sizeof advice, "restart the kernel with a higher `ulimit -n`");
    else if (rl.rlim_max > rl.rlim_cur)
        snprintf(advice, sizeof advice, "restart the kernel with a higher `ulimit -n` "
                 "(the hard limit allows %llu)", (unsigned long long) rl.rlim_max);
    else
        snprintf(advice, sizeof advice, "raise the hard limit (`ulimit -Hn`, or LimitNOFILE= "
                 "for a service) and restart the kernel");
    dk_set_err(err, errlen,
               "%d ranks need %zu file descriptors in the kernel (%d per rank plus %zu), but only "
               "%zu of its limit of %llu are free (%zu are open). Use at most %zu ranks, or %s.",
               world_size, need, PER_RANK, dk_fdlimit_job_need(0), free_now,
               (unsigned long long) rl.rlim_cur, open_now, fit, advice);
    return false;
}
