/*
 * dk_spawn: fork+exec of one rank, the way a multi-threaded host must do it.
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
 * Every descriptor the child is given is first lifted above 3, so the dup2s
 * onto 0..3 cannot overwrite one before it is used (a host may have closed its
 * own stdin, making pipe() return 0).
 */
#include "dk_spawn.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

/* How long the parent waits to hear that exec happened. Only reached when
 * another thread of the host forks without exec at that moment and so holds
 * the report pipe open; then the rank is taken as started. */
#define EXEC_REPORT_TIMEOUT_MS 10000

#define REPORT_FD 3

typedef enum { STEP_PDEATHSIG = 1, STEP_REDIRECT, STEP_EXEC } child_step_t;

typedef struct {
    int step;
    int err;
} child_report_t;

/* Move FD to a number above REPORT_FD (close-on-exec). */
static int lift_fd(int fd)
{
    if (fd < 0 || fd > REPORT_FD)
        return fd;
    int high = fcntl(fd, F_DUPFD_CLOEXEC, REPORT_FD + 1);
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

/* The child, between fork and exec: async-signal-safe calls only. */
static _Noreturn void child_run(const char *path, char *const argv[], char *const envp[],
                                pid_t parent, int in_fd, int out_fd, int err_fd,
                                int report_fd, long max_fd)
{
    if (dup2(report_fd, REPORT_FD) < 0)
        _exit(127);
    fcntl(REPORT_FD, F_SETFD, FD_CLOEXEC);
    setpgid(0, 0);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
        child_fail(STEP_PDEATHSIG);
    if (getppid() != parent)
        _exit(127);

    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (int sig = 1; sig < NSIG; sig++) {
        if (sig != SIGKILL && sig != SIGSTOP)
            sigaction(sig, &dfl, NULL);     /* EINVAL for libc-reserved ones: fine */
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0)
        child_fail(STEP_REDIRECT);
    if (syscall(SYS_close_range, REPORT_FD + 1, ~0U, 0) != 0) {
        for (long fd = REPORT_FD + 1; fd < max_fd; fd++)
            close((int) fd);
    }
    execve(path, argv, envp);
    child_fail(STEP_EXEC);
}

/* Highest descriptor number to sweep if close_range is missing (kernel < 5.9). */
static long sweep_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur > (1 << 20))
        return 1 << 20;
    return (long) rl.rlim_cur;
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

int dk_spawn(const char *path, char *const argv[], char *const envp[], dk_spawned_t *out,
             char *err, size_t errlen)
{
    int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, report[2] = {-1, -1};
    int devnull = -1;

    if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0 ||
        pipe2(report, O_CLOEXEC) != 0 ||
        (devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0) {
        snprintf(err, errlen, "cannot create the pipes for a rank: %s", strerror(errno));
        goto fail;
    }
    out_pipe[1] = lift_fd(out_pipe[1]);
    err_pipe[1] = lift_fd(err_pipe[1]);
    report[1] = lift_fd(report[1]);
    devnull = lift_fd(devnull);
    if (out_pipe[1] < 0 || err_pipe[1] < 0 || report[1] < 0 || devnull < 0) {
        snprintf(err, errlen, "cannot create the pipes for a rank: %s", strerror(errno));
        goto fail;
    }

    long max_fd = sweep_limit();
    pid_t parent = getpid();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0)
        child_run(path, argv, envp, parent, devnull, out_pipe[1], err_pipe[1], report[1],
                  max_fd);
    int fork_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close_fd(&out_pipe[1]);
    close_fd(&err_pipe[1]);
    close_fd(&report[1]);
    close_fd(&devnull);
    if (pid < 0) {
        snprintf(err, errlen, "cannot start a rank process (fork): %s", strerror(fork_errno));
        goto fail;
    }
    setpgid(pid, pid);      /* also done by the child; whichever runs first wins */

    child_report_t rep;
    bool failed = read_report(report[0], &rep);
    close_fd(&report[0]);
    if (failed) {
        waitpid(pid, NULL, 0);
        if (rep.step == STEP_EXEC)
            snprintf(err, errlen, "cannot run %s: %s", path, strerror(rep.err));
        else
            snprintf(err, errlen, "cannot prepare the rank process for %s (%s): %s", path,
                     rep.step == STEP_PDEATHSIG ? "PR_SET_PDEATHSIG" : "redirecting output",
                     strerror(rep.err));
        goto fail;
    }

    set_nonblocking(out_pipe[0]);
    set_nonblocking(err_pipe[0]);
    out->pid = pid;
    out->pidfd = (int) syscall(SYS_pidfd_open, pid, 0);   /* close-on-exec by definition */
    out->out_fd = out_pipe[0];
    out->err_fd = err_pipe[0];
    return 0;

fail:
    close_fd(&out_pipe[0]);
    close_fd(&out_pipe[1]);
    close_fd(&err_pipe[0]);
    close_fd(&err_pipe[1]);
    close_fd(&report[0]);
    close_fd(&report[1]);
    close_fd(&devnull);
    return -1;
}

char *dk_spawn_find_program(const char *program, char *err, size_t errlen)
{
    if (!program || !*program) {
        snprintf(err, errlen, "no rank executable was given");
        return NULL;
    }
    if (strchr(program, '/')) {
        char *copy = strdup(program);
        if (!copy)
            snprintf(err, errlen, "out of memory");
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
            snprintf(err, errlen, "out of memory");
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
    snprintf(err, errlen, "cannot find the rank executable \"%s\" on PATH (%s); give a full path",
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

int dk_spawn_free_port(char *err, size_t errlen)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        snprintf(err, errlen, "cannot pick a MASTER_PORT (socket): %s", strerror(errno));
        return -1;
    }
    struct sockaddr_in addr;
    memset(&addr, 0, sizeof addr);
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof addr;
    int port = -1;
    if (bind(fd, (struct sockaddr *) &addr, sizeof addr) != 0 ||
        getsockname(fd, (struct sockaddr *) &addr, &alen) != 0)
        snprintf(err, errlen, "cannot pick a MASTER_PORT on 127.0.0.1: %s", strerror(errno));
    else
        port = ntohs(addr.sin_port);
    close(fd);
    return port;
}
