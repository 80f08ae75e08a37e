/*
 * distkernel-rank: one rank of a distributed job. This is its body, in
 * libdistkernel-rank.so, which the program (rank_launch.c) calls on the
 * environment's libpython (dk_pyload.h).
 *
 * Started by the runtime (runtime/launch/dk_job_launch.c) with the rank's environment; it
 * embeds the same CPython as the kernel and runs distkernel._rank.main(), which
 * talks to the kernel over the back channel (and decides how the rank's
 * output is buffered).
 *
 * Warm start. With DISTKERNEL_WARM_SOCKET (a template's socket, dk_template.h) it
 * first asks that template, which has imported torch already, to fork the
 * rank for it: it sends its environment (less DISTKERNEL_WARM_SOCKET), working
 * directory, process group, stdout and stderr, then waits, with SIGINT and
 * SIGTERM blocked (they reach the rank, which is in its group), and ends as
 * the rank ended: its exit code, or the same signal. So the job judges and
 * stops it exactly as a cold rank. When the template says no, or cannot be
 * reached, this process goes on as a cold rank and writes why to warm.log
 * next to its rank log.
 *
 * With DISTKERNEL_TEMPLATE it is that template (distkernel._rank.template_main).
 */
#include "dk_io.h"
#include "dk_logdir.h"
#include "dk_peer.h"
#include "dk_pyinit.h"
#include "dk_pyload.h"
#include "dk_rankpath.h"
#include "dk_rankpyenv.h"
#include "dk_rankstacks.h"
#include "dk_slurm.h"
#include "dk_template.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* A line for the run's log folder: why this rank started cold. The folder
 * is opened as every log folder is (dk_logdir: the user's, writable by
 * nobody else, through folders nobody else can rename), and warm.log in it
 * never through a symlink and only as a file of the user's: on another node
 * the kernel's log folder need not exist, and another user may have made
 * it. Ranks append a line each, so it is not O_EXCL. */
static void note_cold(const char *why)
{
    const char *log = getenv("DISTKERNEL_LOG");
    const char *slash = log ? strrchr(log, '/') : NULL;
    if (!slash || slash == log)
        return;
    char dir[PATH_MAX];
    if (snprintf(dir, sizeof dir, "%.*s", (int)(slash - log), log) >= (int)sizeof dir)
        return;
    int dfd = dk_logdir_open(dir, 0, NULL, NULL, 0);
    if (dfd < 0)
        return;
    int fd = openat(dfd, "warm.log", O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_NONBLOCK |
                    O_CLOEXEC, 0600);
    close(dfd);
    if (fd < 0)
        return;
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid())
        dprintf(fd, "rank %s started cold: %s\n", getenv("RANK") ? getenv("RANK") : "?", why);
    close(fd);
}

/* One reply line into LINE. False at EOF or error. */
static bool read_line(int fd, char *line, size_t len)
{
    size_t n = 0;
    while (n + 1 < len) {
        ssize_t r = read(fd, line + n, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        if (line[n] == '\n')
            break;
        n++;
    }
    line[n] = '\0';
    return true;
}

/* The request body: pgid | cwd NUL | environ entries NUL-separated. */
static char *request_body(size_t *len)
{
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd))
        return NULL;
    size_t n = 4 + strlen(cwd) + 1;
    for (char **e = environ; *e; e++)
        n += strlen(*e) + 1;
    char *body = malloc(n);
    if (!body)
        return NULL;
    uint32_t pgid = (uint32_t)getpgrp();
    body[0] = (char)(pgid >> 24), body[1] = (char)(pgid >> 16);
    body[2] = (char)(pgid >> 8), body[3] = (char)pgid;
    size_t at = 4;
    memcpy(body + at, cwd, strlen(cwd) + 1);
    at += strlen(cwd) + 1;
    for (char **e = environ; *e; e++) {
        memcpy(body + at, *e, strlen(*e) + 1);
        at += strlen(*e) + 1;
    }
    *len = at;
    return body;
}

/* A stop for the warm rank RANK, which leads a session and a group of its own
 * (_template.py, _become_rank: the scheduler gives each session its share,
 * dk_spawn.h). Before the fork has made its group (it does so first thing)
 * the signal goes to RANK alone, which has no child yet. */
static void pass_on(pid_t rank, int sig)
{
    if (killpg(rank, sig) < 0 && errno == ESRCH)
        kill(rank, sig);
}

/* While the warm rank RANK runs: the job signals this process's group, as a
 * cold rank's, and each stop (interrupt, terminate, hangup, quit) is passed
 * on to the rank's group; a SIGKILL of this process makes the template end
 * the rank's group (it sees this connection close). Returns true with the
 * template's "exit STATUS" line in LINE, or false (said on stderr) when the
 * template ended first, taking the rank with it. */
static bool wait_for_warm_rank(int fd, pid_t rank, char *line, size_t len)
{
    sigset_t stops;
    sigemptyset(&stops);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGHUP);
    sigaddset(&stops, SIGQUIT);
    sigprocmask(SIG_BLOCK, &stops, NULL);
    /* Those that came while we asked (SIGINT is blocked from our start) were
     * for the rank, which did not exist yet: the signalfd reads them too. */
    int sfd = signalfd(-1, &stops, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sfd < 0)    /* then a stop ends this process, and the template the rank */
        sigprocmask(SIG_UNBLOCK, &stops, NULL);
    struct pollfd fds[2] = {{.fd = fd, .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
    for (;;) {
        int n = poll(fds, sfd >= 0 ? 2 : 1, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        if (sfd >= 0 && (fds[1].revents & POLLIN)) {
            struct signalfd_siginfo si;
            while (read(sfd, &si, sizeof si) == (ssize_t) sizeof si)
                pass_on(rank, (int) si.ssi_signo);
        }
        if (fds[0].revents)
            break;
    }
    if (sfd >= 0)
        close(sfd);
    if (!read_line(fd, line, len) || strncmp(line, "exit ", 5) != 0) {
        fprintf(stderr, "distkernel-rank: the warm-start template ended before this rank "
                        "did (the rank was killed with it)\n");
        return false;
    }
    return true;
}

/* Run as a warm rank through the template at PATH: the rank's exit code
 * (or death by its signal). -1 (with the reason noted) to go on cold. */
static int warm_rank(const char *path)
{
    char why[512];
    size_t len;
    char *body = request_body(&len);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (!body || fd < 0 || strlen(path) >= sizeof addr.sun_path) {
        snprintf(why, sizeof why, "could not prepare the request (%s)", strerror(errno));
        goto cold;
    }
    strcpy(addr.sun_path, path);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        snprintf(why, sizeof why, "the template at %s cannot be reached (%s)", path,
                 strerror(errno));
        goto cold;
    }
    /* Its folder may have been removed (the agent's kernel went away) and
     * made again by someone else: the request holds the environment (the
     * run's key, exported secrets) and our output (dk_peer.h). */
    char what[PATH_MAX + 64];
    snprintf(what, sizeof what, "the warm-start template's socket %s", path);
    if (dk_peer_check(fd, what, why, sizeof why) < 0)
        goto cold;
    char head[8] = {'F', 0, 0, 0, (char)(len >> 24), (char)(len >> 16), (char)(len >> 8),
                    (char)len};
    int fds[2] = {1, 2};
    union {
        char buf[CMSG_SPACE(sizeof fds)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = head, .iov_len = sizeof head};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf,
                         .msg_controllen = sizeof ctl.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof fds);
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    char line[512];
    /* Sent, not written: a template that died mid-request must not SIGPIPE
     * us, only send us cold. */
    if (sendmsg(fd, &msg, MSG_NOSIGNAL) != (ssize_t)sizeof head ||
        dk_send_all(fd, body, len, -1) < 0 ||
        !read_line(fd, line, sizeof line)) {
        snprintf(why, sizeof why, "the template did not answer (%s)", strerror(errno));
        goto cold;
    }
    if (strncmp(line, "ok ", 3) != 0) {
        snprintf(why, sizeof why, "the template refused: %.400s",
                 strncmp(line, "no ", 3) == 0 ? line + 3 : line);
        goto cold;
    }
    free(body);
    pid_t rank = (pid_t) strtol(line + 3, NULL, 10);
    if (rank <= 0) {
        fprintf(stderr, "distkernel-rank: the warm-start template answered \"%.100s\"\n", line);
        return 137;
    }
    if (!wait_for_warm_rank(fd, rank, line, sizeof line))
        return 137;
    int status = atoi(line + 5);
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    int sig = WIFSIGNALED(status) ? WTERMSIG(status) : SIGKILL;
    /* Die of the rank's signal, without a core of our own. */
    struct rlimit none = {0, 0};
    setrlimit(RLIMIT_CORE, &none);
    signal(sig, SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    raise(sig);
    return 128 + sig;
cold:
    free(body);
    if (fd >= 0)
        close(fd);
    note_cold(why);
    return -1;
}

/* A rank that srun started for a run over Slurm: SLURM_* as the whole run's
 * step would say them, not this rank's one-task step (dk_slurm_rank.c), set
 * before any Python (or a warm template) sees the environment. */
static int slurm_run_env(void)
{
    char **words = NULL, err[512];
    size_t n = 0;
    if (dk_slurm_rank_env((const char *const *)environ, &words, &n, err, sizeof err) < 0) {
        fprintf(stderr, "distkernel-rank: cannot set this rank's SLURM_* variables: %s\n", err);
        return -1;
    }
    for (size_t i = 0; i < n; i++) {
        char *eq = strchr(words[i], '=');
        *eq = '\0';
        if (setenv(words[i], eq + 1, 1) < 0) {
            fprintf(stderr, "distkernel-rank: cannot set %s: %s\n", words[i], strerror(errno));
            dk_slurm_names_free(words, n);
            return -1;
        }
    }
    dk_slurm_names_free(words, n);
    unsetenv(DK_SLURM_RUN_NODES_ENV);
    unsetenv(DK_SLURM_JOB_NODES_ENV);
    return 0;
}

/* The back channel's key out of /proc/PID/environ: that file shows the
 * environment block the process started with, which unsetenv (Python's
 * os.environ.pop) does not touch, so the key would stay there for the rank's
 * whole life, and a warm rank's stub waits as long. The value moves to the
 * heap (setenv copies it) and the block's bytes are overwritten. */
static void hide_key(void)
{
    static const char name[] = "DISTKERNEL_BC_KEY=";
    for (char **e = environ; *e; e++) {
        if (strncmp(*e, name, sizeof name - 1) != 0)
            continue;
        char *block = *e + sizeof name - 1;
        char *value = strdup(block);
        if (!value || setenv("DISTKERNEL_BC_KEY", value, 1) != 0) {
            free(value);
            return;          /* the key stays where it was: the rank still works */
        }
        memset(block, 'x', strlen(block));
        free(value);
        return;
    }
}

/* What distkernel-rank runs once the environment's libpython is loaded
 * (rank_launch.c, dk_pyload.h). */
__attribute__((visibility("default"))) int dk_rank_main(int argc, char **argv);
int dk_rank_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    hide_key();
    /* A rank stopped while Python is still starting (another rank failed at
     * once, the cell was interrupted) would print a "Fatal Python error" in the
     * cell. SIGINT stays blocked until distkernel._rank is about to run the
     * user's code; one that came meanwhile is delivered then, and ends the
     * rank quietly. SIGTERM and SIGKILL, which follow, are not blocked. */
    sigset_t sigint;
    sigemptyset(&sigint);
    sigaddset(&sigint, SIGINT);
    sigprocmask(SIG_BLOCK, &sigint, NULL);

    /* A template (a node agent's, on a Slurm node) is no rank: the ranks it
     * forks get the environment of the distkernel-rank that asks for them,
     * rewritten there. */
    bool template = getenv("DISTKERNEL_TEMPLATE") != NULL;
    if (!template && slurm_run_env() < 0)
        return 1;
    char host[256] = "?", err[1024];
    gethostname(host, sizeof host - 1);
    /* On another node (its agent gave it the kernel's folder), the Python
     * variables are checked before CPython, or a template, reads them
     * (dk_rankpyenv.h). */
    if (getenv("DISTKERNEL_CWD") &&
        dk_rankpyenv_check(dk_pyload_python(), dk_pyinit_glue_dir(), err, sizeof err) < 0) {
        fprintf(stderr, "distkernel-rank on %s: %s\n", host, err);
        return 1;
    }
    const char *warm = getenv("DISTKERNEL_WARM_SOCKET");
    if (warm && *warm) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s", warm);
        unsetenv("DISTKERNEL_WARM_SOCKET");
        int rc = warm_rank(path);
        if (rc >= 0)
            return rc;
    }
    if (template)
        prctl(PR_SET_NAME, DK_TEMPLATE_COMM, 0, 0, 0);   /* argv[0] says it already */

    /* Which folders a rank on another node may use (dk_rankpath.h). */
    if (PyImport_AppendInittab(DK_RANKPATH_MODULE, dk_rankpath_init) < 0) {
        fprintf(stderr, "distkernel-rank: cannot register " DK_RANKPATH_MODULE "\n");
        return 1;
    }
    /* The end line after a dump of the rank's stacks (dk_rankstacks.h). */
    if (PyImport_AppendInittab(DK_RANKSTACKS_MODULE, dk_rankstacks_init) < 0) {
        fprintf(stderr, "distkernel-rank: cannot register " DK_RANKSTACKS_MODULE "\n");
        return 1;
    }
    if (dk_pyinit_start("distkernel-rank", err, sizeof err) < 0) {
        fprintf(stderr, "distkernel-rank: %s\n", err);
        return 1;
    }

    int rc = 1;
    PyObject *mod = PyImport_ImportModule("distkernel._rank");
    PyObject *res = mod ? PyObject_CallMethod(mod, template ? "template_main" : "main", NULL)
                        : NULL;
    if (res) {
        rc = (int)PyLong_AsLong(res);
        Py_DECREF(res);
    } else if (PyErr_ExceptionMatches(PyExc_SystemExit)) {
        PyErr_Print();   /* exits with the SystemExit's code */
    } else {
        PyErr_Print();
    }
    Py_XDECREF(mod);
    if (Py_FinalizeEx() < 0 && rc == 0)
        rc = 120;
    return rc;
}
