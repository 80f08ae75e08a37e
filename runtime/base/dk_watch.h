/*
 * dk_watch: the steps a watcher process shares, a forked child of a threaded
 * host that never execs and acts when the host ends: the sentinel and the
 * last word (proc/dk_spawn.c), the folder watcher (logs/dk_tidy.c). Async-
 * signal-safe between fork and exit, header-only so every layer can use it.
 */
#ifndef DK_WATCH_H
#define DK_WATCH_H

#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* The highest descriptor number to sweep where close_range is missing
 * (Linux before 5.9). Call before the fork: getrlimit is not on the list. */
static inline long dk_watch_fd_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur > (1 << 20))
        return 1 << 20;
    return (long) rl.rlim_cur;
}

/* In the child, every signal still blocked as at the fork: SIGINT, SIGTERM,
 * SIGHUP and SIGPIPE ignored (a Ctrl-C or a hangup meant for the host's
 * session must not end the watcher, and one already pending is discarded),
 * every other one default, then the mask opened. */
static inline void dk_watch_quiet_signals(void)
{
    struct sigaction act;
    memset(&act, 0, sizeof act);
    sigemptyset(&act.sa_mask);
    for (int sig = 1; sig < NSIG; sig++) {
        bool quiet = sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGPIPE;
        act.sa_handler = quiet ? SIG_IGN : SIG_DFL;
        if (sig != SIGKILL && sig != SIGSTOP)
            sigaction(sig, &act, NULL);     /* EINVAL for libc-reserved ones: fine */
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* In the child: keep only FD, as fd 0 (MAX_FD: dk_watch_fd_limit's, taken
 * before the fork), and return a pidfd of HOST, or -1 where pidfd_open is
 * missing (Linux before 5.3) or the host is gone already. The caller then
 * compares getppid() with HOST: a host that ended before the pidfd was taken
 * is not its parent any more. _exit(127) when fd 0 cannot be had. */
static inline int dk_watch_keep_only(int fd, pid_t host, long max_fd)
{
    if (dup2(fd, 0) < 0)
        _exit(127);
    if (syscall(SYS_close_range, 1, ~0U, 0) != 0) {
        for (long i = 1; i < max_fd; i++)
            close((int) i);
    }
    int pidfd = -1;
#ifdef SYS_pidfd_open
    pidfd = (int) syscall(SYS_pidfd_open, host, 0);
#endif
    return pidfd;
}

#endif
