/*
 * dk_spawn: fork+exec of one process (a rank, a helper, a server's guard), the
 * way a multi-threaded host must do it; and the sentinel that ends process
 * groups when the host dies.
 *
 * The host (the kernel) has threads, an interpreter and perhaps a CUDA
 * context, so the child runs only async-signal-safe calls between fork and
 * exec: setpgid, prctl, sigaction, dup2, close_range, execve, write, _exit.
 * The order matters:
 *
 *   - all signals are blocked in the parent around fork, so no handler the host
 *     installed (Python's writes to its wakeup fd) can run in the child before
 *     the child has reset every disposition to SIG_DFL; only then is the mask
 *     cleared;
 *   - PR_SET_PDEATHSIG is armed first, then getppid() is compared with the pid
 *     read before fork: if the host died in between, the signal was missed and
 *     the child leaves at once instead of becoming an orphan;
 *   - the child joins a new process group itself, and the parent sets it too,
 *     so a killpg right after fork cannot miss it whichever runs first.
 *
 * An exec failure travels back on a close-on-exec pipe kept at fd 3 through the
 * fd sweep: EOF means exec succeeded, a record means it did not and says why.
 * So a wrong program path is an error from dk_job_start, not a crashed rank.
 * Every descriptor the child is given is first lifted above 4, so the dup2s
 * onto 0..4 cannot overwrite one before it is used (a host may have closed its
 * own stdin, making pipe() return 0); fd 4 is the folder a guard keeps.
 * A guard closes fd 3 once it has forked the program, so the report's EOF
 * still means "the program's exec happened".
 */
#include "dk_spawn.h"

#include "dk_clock.h"
#include "dk_err.h"
#include "dk_stop.h"
#include "dk_watch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* How long the parent waits to hear that exec happened. Only reached when
 * another thread of the host forks without exec at that moment and so holds
 * the report pipe open; then the rank is taken as started. */
#define EXEC_REPORT_TIMEOUT_MS 10000

#define REPORT_FD 3
#define KEEP_FD 4           /* dk_spawn_opts_t.keep_fd, in a guard */
#define GUARD_GRACE_S 3.0   /* the server's SIGTERM to SIGKILL, in a guard */

typedef enum { STEP_PDEATHSIG = 1, STEP_REDIRECT, STEP_EXEC, STEP_GUARD_FORK } child_step_t;

/* What the child needs, all prepared before fork. */
typedef struct {
    const char *path;
    char *const *argv;
    char *const *envp;
    pid_t parent;
    int in_fd, out_fd, err_fd, report_fd, keep_fd;
    long max_fd;
    const dk_spawn_opts_t *opts;
} child_args_t;

typedef struct {
    int step;
    int err;
} child_report_t;

/* Move FD to a number above KEEP_FD (close-on-exec). */
static int lift_fd(int fd)
{
    if (fd < 0 || fd > KEEP_FD)
        return fd;
    int high = fcntl(fd, F_DUPFD_CLOEXEC, KEEP_FD + 1);
    close(fd);
    return high;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static void set_nonblocking(int fd)
{
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0)
        fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

static _Noreturn void child_fail(int step)
{
    child_report_t report = {step, errno};
    ssize_t n = write(REPORT_FD, &report, sizeof report);
    (void) n;
    _exit(127);
}

/* ---- the guard ---------------------------------------------------------------
 *
 * A server such as `mlflow server` runs its workers as children of its own,
 * which PR_SET_PDEATHSIG (it reaches only the direct child) would leave behind
 * when the host is SIGKILLed. So in guard mode the spawned process is a guard:
 * it leads the process group, starts the program in it, and when the host goes
 * away (its PDEATHSIG, here SIGTERM) or stops it (SIGTERM), ends the whole
 * group by the ladder SIGTERM, then SIGKILL after GUARD_GRACE_S. It is the
 * forked child of a threaded host and never execs: async-signal-safe calls only
 * (dk_stop makes none; dk_now_s is one clock_gettime, which is safe).
 */
static volatile sig_atomic_t guard_stop;

static void guard_on_term(int sig)
{
    (void) sig;
    guard_stop = 1;
}

/* Stop the group: SIGTERM, wait for the program until the next rung is due,
 * remove the file the host asked for, then SIGKILL (this guard included). */
static _Noreturn void guard_end(pid_t prog, const dk_spawn_opts_t *opts)
{
    static const int ladder[] = {SIGTERM, SIGKILL};
    dk_stop_t stop = dk_stop_custom(ladder, 2, GUARD_GRACE_S);
    kill(-getpgrp(), dk_stop_begin(&stop, dk_now_s()));   /* this guard: handled */
    struct timespec tick = {0, 50 * 1000 * 1000};
    int sig = 0;
    while (waitpid(prog, NULL, WNOHANG) == 0 && (sig = dk_stop_due(&stop, dk_now_s())) == 0)
        nanosleep(&tick, NULL);
    if (opts->keep_fd >= 0 && opts->unlink_at_end)
        unlinkat(KEEP_FD, opts->unlink_at_end, 0);
    signal(SIGTERM, SIG_DFL);
    kill(-getpgrp(), sig ? sig : SIGKILL);   /* whatever is left, this guard included */
    _exit(0);
}

/* The guard, once its descriptors are in place: start the program, wait. */
static _Noreturn void guard_run(const child_args_t *a)
{
    if (a->keep_fd >= 0)
        fcntl(KEEP_FD, F_SETFD, FD_CLOEXEC);    /* the guard's, not the program's */
    pid_t prog = fork();
    if (prog == 0) {
        signal(SIGTERM, SIG_DFL);
        execve(a->path, a->argv, a->envp);
        child_fail(STEP_EXEC);      /* the report pipe is still open here */
    }
    if (prog < 0)
        child_fail(STEP_GUARD_FORK);
    close(REPORT_FD);       /* the program's exec (close-on-exec) now ends the report */
    int status = 0;
    while (!guard_stop) {
        if (waitpid(prog, &status, 0) == prog)  /* EINTR when SIGTERM comes */
            _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);   /* it ended itself */
    }
    guard_end(prog, a->opts);
}

/* The child's signals: every disposition back to SIG_DFL (a guard catches
 * SIGTERM), then an empty mask. */
static void child_signals(bool guard)
{
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP)
            sigaction(sig, &dfl, NULL);     /* EINVAL for libc-reserved ones: fine */
    }
    if (guard) {
        struct sigaction term = dfl;
        term.sa_handler = guard_on_term;
        sigaction(SIGTERM, &term, NULL);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
}

/* The child, between fork and exec: async-signal-safe calls only. */
static _Noreturn void child_run(const child_args_t *a)
{
    bool guard = a->opts->guard;
    if (dup2(a->report_fd, REPORT_FD) < 0)
        _exit(127);
    fcntl(REPORT_FD, F_SETFD, FD_CLOEXEC);
    if (!a->opts->session || setsid() < 0)
        setpgid(0, 0);
    if (prctl(PR_SET_PDEATHSIG, guard ? SIGTERM : SIGKILL) != 0)
        child_fail(STEP_PDEATHSIG);
    if (getppid() != a->parent)
        _exit(127);
    child_signals(guard);

    if (dup2(a->in_fd, 0) < 0 || dup2(a->out_fd, 1) < 0 || dup2(a->err_fd, 2) < 0 ||
        (a->keep_fd >= 0 && dup2(a->keep_fd, KEEP_FD) < 0))
        child_fail(STEP_REDIRECT);
    int first = a->keep_fd >= 0 ? KEEP_FD + 1 : REPORT_FD + 1;
    if (syscall(SYS_close_range, first, ~0U, 0) != 0) {
        for (long fd = first; fd < a->max_fd; fd++)
            close((int) fd);
    }
    if (guard)
        guard_run(a);
    execve(a->path, a->argv, a->envp);
    child_fail(STEP_EXEC);
}

/* Highest descriptor number to sweep if close_range is missing (kernel < 5.9). */
static long sweep_limit(void)
{
    return dk_watch_fd_limit();
}

/* ---- the sentinel --------------------------------------------------------------
 *
 * Like a guard, a forked child of a threaded host that never execs, so
 * async-signal-safe calls only. It holds the read end of a pipe on fd 0 and a
 * pidfd of the host, nothing else; the host holds the write end (close-on-exec,
 * and every child dk_spawn starts closes it). It acts when the host process
 * ends, however it ends (the pidfd; the pipe's EOF where there is none), and
 * never when the host stops it on purpose (it SIGKILLs it first).
 * A group whose leader has died and been reaped still exists while any member
 * does, so its id cannot have been reused when the sentinel signals it.
 */

/* In a watcher (a sentinel, a last word): keep only WATCH_FD, as fd 0, and
 * return when the host HOST has ended or the pipe reaches EOF (the host's copy
 * of the write end is closed, on purpose or at its end).
 *
 * The pipe alone is not enough: a child the host forks without exec (os.fork,
 * multiprocessing's fork start method, a DataLoader worker of the kernel)
 * inherits the write end, and while it lives the pipe never reaches EOF, so a
 * SIGKILLed kernel would keep its ranks or its Slurm allocation. A pidfd of the
 * host becomes readable when the host process itself exits, whoever holds the
 * pipe; the pipe stays for kernels without pidfd_open (before Linux 5.3). */
static void wait_for_host(int watch_fd, pid_t host, long max_fd)
{
    int pidfd = dk_watch_keep_only(watch_fd, host, max_fd);
    /* The host may have ended before the pidfd was taken (the pid then names
     * no process, or another one, no longer our parent). */
    if (getppid() != host)
        return;
    struct pollfd fds[2] = {{.fd = 0, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
    for (;;) {
        int n = poll(fds, pidfd >= 0 ? 2 : 1, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || fds[1].revents || !(fds[0].revents & POLLIN))
            return;     /* the host ended (or the pipe broke: act as if it did) */
        char byte;
        ssize_t got = read(0, &byte, 1);
        if (got <= 0 && !(got < 0 && errno == EINTR))
            return;     /* EOF: the host's end is closed */
    }
}

/* What a watcher does when its host is gone: SIGKILL PGIDS (a sentinel), or
 * exec PATH with ARGV (a last word). */
typedef struct {
    const int *pgids;
    int n;
    const char *path;
    char *const *argv;
} watch_t;

static _Noreturn void sentinel_run(int watch_fd, pid_t host, const watch_t *w, long max_fd)
{
    setpgid(0, 0);      /* not ended with the host's group */
    child_signals(false);
    wait_for_host(watch_fd, host, max_fd);
    for (int i = 0; i < w->n; i++) {
        if (w->pgids[i] > 1)
            kill(-w->pgids[i], SIGKILL);
    }
    _exit(0);
}

/* ---- the last word ------------------------------------------------------------
 *
 * A sentinel that runs a command in place of signalling groups: it waits on
 * the pipe with SIGINT, SIGTERM and SIGHUP ignored (a Ctrl-C or a hangup meant
 * for the host's session must not disarm it), then, on EOF, restores default
 * signals, puts /dev/null on 0-2 and execs the command, which was resolved
 * and built before the fork. */
static _Noreturn void last_word_run(int watch_fd, pid_t host, const watch_t *w, long max_fd)
{
    setpgid(0, 0);
    /* Every signal is still blocked (as at the fork): ignore these before the
     * mask opens, so one already pending is discarded, not acted on. */
    dk_watch_quiet_signals();
    wait_for_host(watch_fd, host, max_fd);
    int null = open("/dev/null", O_RDWR);
    if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 || dup2(null, 2) < 0)
        _exit(127);
    if (null > 2)
        close(null);
    child_signals(false);
    execve(w->path, w->argv, environ);
    _exit(127);
}

/* Fork a watcher of the host doing W (WHAT names it in errors). */
static int fork_watcher(const watch_t *w, const char *what, int *pid, int *fd, char *err,
                        size_t errlen)
{
    *pid = *fd = -1;
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        dk_set_err(err, errlen, "cannot create %s's pipe: %s", what, strerror(errno));
        return -1;
    }
    long max_fd = sweep_limit();
    pid_t host = getpid();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t child = fork();
    if (child == 0) {
        if (w->path)
            last_word_run(p[0], host, w, max_fd);
        sentinel_run(p[0], host, w, max_fd);
    }
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(p[0]);
    if (child < 0) {
        close(p[1]);
        dk_set_err(err, errlen, "cannot fork %s: %s", what, strerror(fork_errno));
        return -1;
    }
    setpgid(child, child);
    *pid = child;
    *fd = p[1];
    return 0;
}

int dk_spawn_sentinel(const int *pgids, int n, int *pid, int *fd, char *err, size_t errlen)
{
    watch_t w = {.pgids = pgids, .n = n};
    return fork_watcher(&w, "the sentinel", pid, fd, err, errlen);
}

int dk_spawn_last_word(char *const argv[], int *pid, int *fd, char *err, size_t errlen)
{
    *pid = *fd = -1;
    if (!argv || !argv[0]) {
        dk_set_err(err, errlen, "no command was given for the host's death");
        return -1;
    }
    char *path = dk_spawn_find_program(argv[0], err, errlen);
    if (!path)
        return -1;
    watch_t w = {.path = path, .argv = argv};
    int rc = fork_watcher(&w, "the process that acts at the host's death", pid, fd, err,
                          errlen);
    free(path);
    return rc;
}

static void *reap_one(void *arg)
{
    pid_t pid = (pid_t)(intptr_t) arg;
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
        ;
    return NULL;
}

void dk_spawn_last_word_now(int *pid, int *fd)
{
    if (*pid <= 0) {
        close_fd(fd);
        return;
    }
    pid_t p = *pid;
    *pid = -1;
    close_fd(fd);               /* its EOF: it acts now */
    /* Its command (scancel) may take seconds; a thread waits so that the
     * caller does not, and the process is collected, not left a zombie. With
     * no thread to be had it is collected if already done. */
    pthread_attr_t attr;
    pthread_t t;
    bool started = pthread_attr_init(&attr) == 0 &&
                   pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED) == 0 &&
                   pthread_create(&t, &attr, reap_one, (void *)(intptr_t) p) == 0;
    pthread_attr_destroy(&attr);
    if (!started)
        waitpid(p, NULL, WNOHANG);
}

void dk_spawn_sentinel_end(int *pid, int *fd)
{
    if (*pid > 0) {
        kill(*pid, SIGKILL);
        while (waitpid(*pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    close_fd(fd);
    *pid = -1;
}

/* Wait for the child's exec report. Returns true and fills REPORT if the child
 * failed before or at exec. */
static bool read_report(int fd, child_report_t *report)
{
    size_t got = 0;
    while (got < sizeof *report) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, EXEC_REPORT_TIMEOUT_MS);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        ssize_t n = read(fd, (char *) report + got, sizeof *report - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return false;
        got += (size_t) n;
    }
    return true;
}

/* The descriptors of one start: the parent's ends and the child's. */
typedef struct {
    int out_r, out_w, err_r, err_w, report_r, report_w, devnull, keep;
} fds_t;

static void close_fds(fds_t *f)
{
    int *all[] = {&f->out_r, &f->out_w, &f->err_r, &f->err_w, &f->report_r, &f->report_w,
                  &f->devnull, &f->keep};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        close_fd(all[i]);
}

/* A close-on-exec copy of the caller's FD above KEEP_FD (the caller keeps its own). */
static int copy_fd(int fd)
{
    return fd < 0 ? -1 : fcntl(fd, F_DUPFD_CLOEXEC, KEEP_FD + 1);
}

/* Make the pipes (or copies of OPTS's descriptors) the child is given, every
 * one above KEEP_FD. Returns 0, or -1 with ERR filled (F then holds what was
 * made, for close_fds). */
static int make_fds(const dk_spawn_opts_t *opts, fds_t *f, char *err, size_t errlen)
{
    int p[2];
    if (opts->out_fd >= 0) {
        if ((f->out_w = copy_fd(opts->out_fd)) < 0 || (f->err_w = copy_fd(opts->out_fd)) < 0)
            goto fail;
    } else {
        if (pipe2(p, O_CLOEXEC) != 0)
            goto fail;
        f->out_r = p[0], f->out_w = lift_fd(p[1]);
        if (pipe2(p, O_CLOEXEC) != 0)
            goto fail;
        f->err_r = p[0], f->err_w = lift_fd(p[1]);
    }
    if (pipe2(p, O_CLOEXEC) != 0)
        goto fail;
    f->report_r = p[0], f->report_w = lift_fd(p[1]);
    f->devnull = lift_fd(open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (opts->keep_fd >= 0 && (f->keep = copy_fd(opts->keep_fd)) < 0)
        goto fail;
    if (f->out_w >= 0 && f->err_w >= 0 && f->report_w >= 0 && f->devnull >= 0)
        return 0;
fail:
    dk_set_err(err, errlen, "cannot create the pipes for the %s: %s", opts->what,
               strerror(errno));
    return -1;
}

/* Fork the child of ARGS with every signal blocked around the fork. */
static pid_t fork_child(const child_args_t *args, int *fork_errno)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0)
        child_run(args);
    *fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    return pid;
}

/* After fork: hear whether the exec happened. Returns 0, or -1 with ERR (the
 * child then reaped). */
static int await_exec(pid_t pid, int report_fd, const char *path, const char *what, char *err,
                      size_t errlen)
{
    child_report_t rep;
    if (!read_report(report_fd, &rep))
        return 0;
    waitpid(pid, NULL, 0);
    if (rep.step == STEP_EXEC)
        dk_set_err(err, errlen, "cannot run %s: %s", path, strerror(rep.err));
    else
        dk_set_err(err, errlen, "cannot prepare the %s for %s (%s): %s", what, path,
                   rep.step == STEP_PDEATHSIG ? "PR_SET_PDEATHSIG"
                   : rep.step == STEP_GUARD_FORK ? "fork in its guard" : "redirecting output",
                   strerror(rep.err));
    return -1;
}

int dk_spawn_with(const char *path, char *const argv[], char *const envp[],
                  const dk_spawn_opts_t *opts, dk_spawned_t *out, char *err, size_t errlen)
{
    fds_t f = {-1, -1, -1, -1, -1, -1, -1, -1};
    if (make_fds(opts, &f, err, errlen) < 0) {
        close_fds(&f);
        return -1;
    }
    child_args_t args = {path, argv, envp, getpid(), f.devnull, f.out_w, f.err_w, f.report_w,
                         f.keep, sweep_limit(), opts};
    int fork_errno = 0;
    pid_t pid = fork_child(&args, &fork_errno);
    close_fd(&f.out_w);
    close_fd(&f.err_w);
    close_fd(&f.report_w);
    close_fd(&f.devnull);
    close_fd(&f.keep);
    if (pid < 0) {
        dk_set_err(err, errlen, "cannot start the %s (fork): %s", opts->what,
                   strerror(fork_errno));
        close_fds(&f);
        return -1;
    }
    if (!opts->session)
        setpgid(pid, pid);  /* also done by the child; whichever runs first wins */
    int rc = await_exec(pid, f.report_r, path, opts->what, err, errlen);
    close_fd(&f.report_r);
    if (rc < 0) {
        close_fds(&f);
        return -1;
    }
    if (f.out_r >= 0)
        set_nonblocking(f.out_r);
    if (f.err_r >= 0)
        set_nonblocking(f.err_r);
    out->pid = pid;
    out->pidfd = (int) syscall(SYS_pidfd_open, pid, 0);   /* close-on-exec by definition */
    out->out_fd = f.out_r;
    out->err_fd = f.err_r;
    return 0;
}

int dk_spawn(const char *path, char *const argv[], char *const envp[], dk_spawned_t *out,
             char *err, size_t errlen)
{
    dk_spawn_opts_t opts = DK_SPAWN_OPTS_INIT;
    return dk_spawn_with(path, argv, envp, &opts, out, err, errlen);
}

char *dk_spawn_find_program(const char *program, char *err, size_t errlen)
{
    if (!program || !*program) {
        dk_set_err(err, errlen, "no program was given");
        return NULL;
    }
    if (strchr(program, '/')) {
        char *copy = strdup(program);
        if (!copy)
            dk_set_err(err, errlen, "out of memory");
        return copy;
    }
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/local/bin:/usr/bin:/bin";
    size_t plen = strlen(program);
    for (const char *dir = path; *dir;) {
        const char *end = strchr(dir, ':');
        size_t dlen = end ? (size_t) (end - dir) : strlen(dir);
        char *cand = malloc(dlen + plen + 3);
        if (!cand) {
            dk_set_err(err, errlen, "out of memory");
            return NULL;
        }
        /* An empty PATH entry means the current directory. */
        snprintf(cand, dlen + plen + 3, "%.*s/%s", dlen ? (int) dlen : 1,
                 dlen ? dir : ".", program);
        if (access(cand, X_OK) == 0)
            return cand;
        free(cand);
        if (!end)
            break;
        dir = end + 1;
    }
    dk_set_err(err, errlen, "cannot find the program \"%s\" on PATH (%s); give a full path",
               program, path);
    return NULL;
}

/* Length of the NAME in "NAME=value" (the whole string if there is no '='). */
static size_t name_len(const char *entry)
{
    const char *eq = strchr(entry, '=');
    return eq ? (size_t) (eq - entry) : strlen(entry);
}

char **dk_spawn_env_build(const char *const *base, const char *const *set, size_t nset)
{
    size_t nbase = 0;
    while (base && base[nbase])
        nbase++;
    char **env = calloc(nbase + nset + 1, sizeof *env);
    if (!env)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < nbase; i++) {
        size_t len = name_len(base[i]);
        bool overridden = false;
        for (size_t k = 0; k < nset && !overridden; k++)
            overridden = name_len(set[k]) == len && strncmp(set[k], base[i], len) == 0;
        if (overridden)
            continue;
        if (!(env[n++] = strdup(base[i])))
            goto oom;
    }
    for (size_t k = 0; k < nset; k++) {
        if (!(env[n++] = strdup(set[k])))
            goto oom;
    }
    return env;
oom:
    dk_spawn_env_free(env);
    return NULL;
}

void dk_spawn_env_free(char **env)
{
    for (size_t i = 0; env && env[i]; i++)
        free(env[i]);
    free(env);
}

const char *dk_spawn_env_get(const char *const *env, const char *name)
{
    size_t len = strlen(name);
    for (size_t i = 0; env && env[i]; i++) {
        if (strncmp(env[i], name, len) == 0 && env[i][len] == '=')
            return env[i] + len + 1;
    }
    return NULL;
}

/* Bind a TCP socket to PORT (0: any) on every address, IPv4 and, where
 * this host has IPv6, IPv6 as well, as a rank's TCPStore will; close them.
 * The port bound, or -1 with errno set. */
static int probe_port(int port)
{
    int fd4 = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd4 < 0)
        return -1;
    struct sockaddr_in a4;
    memset(&a4, 0, sizeof a4);
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons((uint16_t) port);
    socklen_t alen = sizeof a4;
    if (bind(fd4, (struct sockaddr *) &a4, sizeof a4) != 0 ||
        getsockname(fd4, (struct sockaddr *) &a4, &alen) != 0) {
        int e = errno;
        close(fd4);
        errno = e;
        return -1;
    }
    port = ntohs(a4.sin_port);
    int fd6 = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd6 >= 0) {
        int one = 1;
        struct sockaddr_in6 a6;
        memset(&a6, 0, sizeof a6);
        a6.sin6_family = AF_INET6;
        a6.sin6_addr = in6addr_any;
        a6.sin6_port = htons((uint16_t) port);
        if (setsockopt(fd6, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) == 0 &&
            bind(fd6, (struct sockaddr *) &a6, sizeof a6) != 0 && errno != EADDRNOTAVAIL) {
            int e = errno;
            close(fd6);
            close(fd4);
            errno = e;
            return -1;
        }
        close(fd6);
    }
    close(fd4);
    return port;
}

int dk_spawn_free_port(char *err, size_t errlen)
{
    /* Outside the ephemeral range, where this host's outgoing connections
     * (other runs' ranks among them) take their ports and one could take
     * this port between now and rank 0's bind; the range rank 0 also looks
     * in on other nodes (python/distkernel/_rendezvous.py, _PORT_RANGE). */
    for (int i = 0; i < DK_SPAWN_PORT_TRIES; i++) {
        uint32_t r;
        if (getrandom(&r, sizeof r, 0) != (ssize_t) sizeof r)
            break;
        int port = probe_port(DK_SPAWN_PORT_LOW + (int) (r % (DK_SPAWN_PORT_HIGH -
                                                              DK_SPAWN_PORT_LOW)));
        if (port > 0)
            return port;
    }
    int port = probe_port(0);
    if (port < 0)
        dk_set_err(err, errlen, "cannot pick a free TCP port: %s", strerror(errno));
    return port;
}
