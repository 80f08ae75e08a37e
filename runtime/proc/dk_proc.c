/*
 * dk_proc: one helper program, run to its end. See dk_proc.h.
 *
 * The program is reaped only once both its pipes are at EOF and it has
 * exited: until then its pid, and so its process group id, cannot be reused,
 * so the stop ladder's killpg always reaches the helper's own group and never
 * a stranger's. The wait is a 100 ms poll, both for the cancel callback (which
 * may need to run on the caller's thread, like Python's signal check) and for
 * a program that closed its pipes but has not exited yet.
 */
#include "dk_proc.h"

#include "dk_clock.h"
#include "dk_err.h"
#include "dk_spawn.h"
#include "dk_stop.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TICK_MS 100
#define DEFAULT_GRACE_S 2.0

typedef struct {
    const dk_proc_spec_t *spec;
    dk_proc_result_t *res;
    dk_spawned_t child;
    size_t out_cap;
    dk_stop_t stop;
    int status;
    bool reaped;
} run_t;

/* Keep LEN bytes of stdout, up to the bound. Returns -1 when out of memory. */
static int keep_out(run_t *run, const char *buf, size_t len)
{
    dk_proc_result_t *res = run->res;
    size_t room = run->spec->max_out - res->out_len;
    if (len > room) {
        res->out_overflow = true;
        len = room;
    }
    if (res->out_len + len + 1 > run->out_cap) {
        size_t cap = (res->out_len + len + 1) * 2;
        char *grown = realloc(res->out, cap);
        if (!grown)
            return -1;
        res->out = grown;
        run->out_cap = cap;
    }
    memcpy(res->out + res->out_len, buf, len);
    res->out_len += len;
    res->out[res->out_len] = '\0';
    return 0;
}

/* Read what FD has. Returns false at EOF or on an error (the pipe is done). */
static bool drain(run_t *run, int fd, bool is_out)
{
    char buf[16384];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0)
        return errno == EAGAIN || errno == EINTR;
    if (n == 0)
        return false;
    if (is_out) {
        if (keep_out(run, buf, (size_t) n) < 0)
            run->res->out_overflow = true;     /* what is kept so far stays */
    } else if (run->spec->on_stderr) {
        run->spec->on_stderr(run->spec->data, buf, (size_t) n);
    }
    return true;
}

/* Ask the cancel callback, and send what the stop ladder has due. */
static void steer(run_t *run)
{
    const dk_proc_spec_t *spec = run->spec;
    double now = dk_now_s();
    int sig = 0;
    /* Asked even after a stop began: the caller may need to consume repeats
     * (Python's pending SIGINT), which must not outlive the program. */
    if (spec->cancelled && spec->cancelled(spec->data) && !run->res->cancelled) {
        run->res->cancelled = true;
        sig = dk_stop_begin(&run->stop, now);
        if (sig)
            killpg(run->child.pid, sig);
    }
    while ((sig = dk_stop_due(&run->stop, now)) != 0)
        killpg(run->child.pid, sig);
}

/* Poll once for output (or, once the pipes are closed, for the exit). */
static void wait_turn(run_t *run)
{
    dk_spawned_t *c = &run->child;
    bool pipes = c->out_fd >= 0 || c->err_fd >= 0;
    struct pollfd fds[3] = {{c->out_fd, POLLIN, 0}, {c->err_fd, POLLIN, 0},
                            {pipes ? -1 : c->pidfd, POLLIN, 0}};
    if (poll(fds, 3, TICK_MS) < 0)
        return;             /* EINTR: the caller's loop asks again */
    if (fds[0].revents && !drain(run, c->out_fd, true)) {
        close(c->out_fd);
        c->out_fd = -1;
    }
    if (fds[1].revents && !drain(run, c->err_fd, false)) {
        close(c->err_fd);
        c->err_fd = -1;
    }
    if (c->out_fd < 0 && c->err_fd < 0 &&
        waitpid(c->pid, &run->status, WNOHANG) == c->pid) {
        run->reaped = true;
        dk_stop_gone(&run->stop);
    }
}

int dk_proc_run(const dk_proc_spec_t *spec, dk_proc_result_t *res, char *err, size_t errlen)
{
    memset(res, 0, sizeof *res);
    run_t run = {.spec = spec, .res = res};
    run.stop = dk_stop_ladder(spec->grace_s > 0 ? spec->grace_s : DEFAULT_GRACE_S);
    if (dk_spawn(spec->path, spec->argv, spec->envp, &run.child, err, errlen) < 0)
        return -1;
    while (!run.reaped) {
        wait_turn(&run);
        if (!run.reaped)
            steer(&run);
    }
    if (run.child.pidfd >= 0)
        close(run.child.pidfd);
    res->exit_code = WIFEXITED(run.status) ? WEXITSTATUS(run.status) : -1;
    res->term_signal = WIFSIGNALED(run.status) ? WTERMSIG(run.status) : 0;
    if (!res->out && !(res->out = calloc(1, 1))) {
        dk_set_err(err, errlen, "out of memory after running %s", spec->path);
        return -1;
    }
    return 0;
}

void dk_proc_result_free(dk_proc_result_t *res)
{
    free(res->out);
    res->out = NULL;
    res->out_len = 0;
}
