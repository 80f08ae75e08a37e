/*
 * dk_agent: a node agent's poll loop. See the header.
 *
 * Everything the agent sends is sealed into one buffer and written whole and
 * in order at the end of its loop's turn (or once 256 KiB wait): a turn's
 * output, exits, relayed frames and PING in one write, on one blocking
 * socket. A kernel that takes no byte for the heartbeat deadline is gone, as
 * a silent one is. What it reads is non-blocking, into a buffer that holds
 * at least one whole frame. The ranks' pipes are read a pipe-read at a time
 * (at most DK_FRAME_OUTPUT_MAX), so one rank's flood is interleaved with the
 * others' output, the exits and the PINGs.
 */
#include "dk_agent_state.h"

#include "dk_backchan.h"
#include "dk_be32.h"
#include "dk_clock.h"
#include "dk_err.h"
#include "dk_setting.h"
#include "dk_io.h"
#include "dk_spawn.h"
#include "dk_stackreq.h"
#include "dk_stop.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#define DEFAULT_GRACE_S 2.0
/* The most a frame from the kernel may carry (a RELAY's bytes). */
#define IN_PAYLOAD_MAX DK_FRAME_RELAY_MAX
/* Frames wait in the agent's buffer until its loop turn ends (or this much
 * is waiting): a turn's output, exits and relayed frames go in one write. */
#define OUT_FLUSH_AT ((size_t) 256 << 10)
/* What one exited rank's pipes are drained of before its EXIT goes: its last
 * words; a child that keeps writing is read on afterwards. */
#define EXIT_DRAIN_MAX ((size_t) 4 << 20)
/* How often the wait for the template looks at the kernel's connection. */
#define WARM_SLICE_MS 50

static void say(agent_t *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(agent_t *a, const char *fmt, ...)
{
    if (a->spec->say_fd < 0)
        return;
    char line[1024];
    const char *host = a->spec->host;
    int k = host && *host ? snprintf(line, sizeof line, "distkernel-agent: node %d (%s): ",
                                     a->spec->node, host)
                          : snprintf(line, sizeof line, "distkernel-agent: node %d: ", a->spec->node);
    if (k < 0 || (size_t) k >= sizeof line / 2)   /* a name past half the line: no name */
        k = snprintf(line, sizeof line, "distkernel-agent: node %d: ", a->spec->node);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + k, sizeof line - (size_t) k, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    if (len + 1 < sizeof line)
        line[len++] = '\n';
    if (write(a->spec->say_fd, line, len) < 0)
        return;
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* ---- the kernel ------------------------------------------------------------ */

static void kernel_gone(agent_t *a, const char *why)
{
    if (a->gone)
        return;
    a->gone = true;
    /* Nothing will ask for stacks or fork a rank any more: the node's
     * folders go now. A kernel gone by SIGKILL takes the agents' srun with
     * it, and slurmstepd SIGKILLs the agents' step (measured on the test
     * cluster: about 0.7 s after the kernel's death, with no SIGTERM
     * before), which would take the folder watcher with it while the ranks
     * are still being ended.
     * Quickest first: a folder of one socket before one of a socket a rank. */
    if (a->relay)
        dk_relay_unlink(a->relay);
    dk_template_unlink(a->spec->template);
    dk_stackreq_destroy(&a->stacks);    /* the most files: last */
    if (a->relay)
        dk_relay_end_all(a->relay);     /* the ranks read an end of file */
    a->out_len = 0;
    if (a->live > 0)
        say(a, "%s; ending this node's %d rank%s", why, a->live, a->live == 1 ? "" : "s");
    else if (!a->shut)
        say(a, "%s", why);
    double now = dk_now_s();
    int sig = dk_stop_begin(&a->stop, now);
    for (int i = 0; sig && i < a->n; i++)
        if (!a->ranks[i].exited && a->ranks[i].pid > 0)
            killpg(a->ranks[i].pid, sig);
}

/* Write all of BUF, waiting for the socket at most the heartbeat deadline
 * each time it takes nothing. */
static bool send_to_kernel(agent_t *a, const unsigned char *buf, size_t len)
{
    if (dk_send_all(a->fd, buf, len, (int) (a->heartbeat_s * 1000)) == 0)
        return true;
    kernel_gone(a, errno == ETIMEDOUT ? "the kernel took nothing past the heartbeat deadline"
                                      : "the kernel's connection broke");
    return false;
}

/* Write the frames waiting in the buffer. */
static void flush_out(agent_t *a)
{
    if (a->out_len == 0 || a->gone)
        return;
    size_t len = a->out_len;
    a->out_len = 0;
    if (send_to_kernel(a, a->out, len))
        a->pinged_at = dk_now_s();
}

void agent_send_frame(agent_t *a, int type, uint32_t id, const void *payload, size_t len)
{
    if (a->gone || a->shut)
        return;
    size_t need = a->out_len + DK_FRAME_HEAD + len;
    if (need > a->out_cap) {
        size_t cap = a->out_cap ? a->out_cap : 65536;
        while (cap < need)
            cap *= 2;
        unsigned char *out = realloc(a->out, cap);
        if (!out) {
            kernel_gone(a, "out of memory for a message to the kernel");
            return;
        }
        a->out = out;
        a->out_cap = cap;
    }
    size_t n = dk_frame_seal(&a->side, type, id, payload, len, a->out + a->out_len);
    if (n == 0) {
        kernel_gone(a, "OpenSSL could not sign a message");
        return;
    }
    a->out_len += n;
    if (a->out_len >= OUT_FLUSH_AT)
        flush_out(a);
}

/* ---- the ranks ---------------------------------------------------------------- */

/* Pass on one read of rank I's pipe W (0 stdout, 1 stderr). False at EOF or
 * when it is empty; *SHORT (if given) when the read took less than a
 * frame's worth (the pipe was emptied). */
static bool pump_read(agent_t *a, int i, int w, bool *short_read)
{
    lrank_t *rk = &a->ranks[i];
    static unsigned char buf[2 + DK_FRAME_OUTPUT_MAX];
    if (rk->pipes[w] < 0)
        return false;
    ssize_t n;
    do
        n = read(rk->pipes[w], buf + 2, DK_FRAME_OUTPUT_MAX);
    while (n < 0 && errno == EINTR);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
        close_fd(&rk->pipes[w]);
        return false;
    }
    if (n < 0)
        return false;
    buf[0] = (unsigned char) (w + 1);
    buf[1] = (size_t) n < DK_FRAME_OUTPUT_MAX ? DK_FRAME_OUTPUT_CAUGHT_UP : 0;
    if (short_read)
        *short_read = (size_t) n < DK_FRAME_OUTPUT_MAX;
    agent_send_frame(a, DK_FRAME_OUTPUT, (uint32_t) rk->rank, buf, 2 + (size_t) n);
    return true;
}

static bool pump(agent_t *a, int i, int w)
{
    return pump_read(a, i, w, NULL);
}

/* The relay is about to pass on what a rank sent on its connection (an
 * answer): first what every rank had written to its pipes by now, so that
 * the kernel gets a rank's output before its answer (dk_relay.h). A pipe is
 * read until a read finds it emptied (or EXIT_DRAIN_MAX). */
static void relay_before(void *data)
{
    agent_t *a = data;
    for (int i = 0; i < a->n; i++)
        for (int w = 0; w < 2; w++) {
            bool short_read = false;
            size_t drained = 0;
            while (drained < EXIT_DRAIN_MAX && pump_read(a, i, w, &short_read) && !short_read)
                drained += DK_FRAME_OUTPUT_MAX;
        }
}

static void relay_send(void *data, int type, uint32_t stream, const void *bytes, size_t len)
{
    agent_send_frame(data, type, stream, bytes, len);
}

/* Rank I's process has ended: its last words, then its EXIT. */
static void reap(agent_t *a, int i)
{
    lrank_t *rk = &a->ranks[i];
    int status = 0;
    pid_t got;
    do
        got = waitpid(rk->pid, &status, WNOHANG);
    while (got < 0 && errno == EINTR);
    if (got == 0)
        return;         /* not yet (a pidfd's wake before the zombie is collectable) */
    if (a->relay)
        dk_relay_flush_in(a->relay);    /* its answer, and its close, before its exit */
    size_t drained = 0;
    for (int w = 0; w < 2; w++)
        while (drained < EXIT_DRAIN_MAX && pump(a, i, w))
            drained += DK_FRAME_OUTPUT_MAX;
    unsigned char body[8];
    int code = got < 0 ? -1 : WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    int sig = got > 0 && WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    dk_put_be32(body, (uint32_t) code);
    dk_put_be32(body + 4, (uint32_t) sig);
    agent_send_frame(a, DK_FRAME_EXIT, (uint32_t) rk->rank, body, sizeof body);
    rk->exited = true;
    close_fd(&rk->pidfd);
    if (a->stacks)
        dk_stackreq_gone(a->stacks, i);
    a->live--;
    if (a->live == 0)
        dk_stop_gone(&a->stop);
}

static void signal_ranks(agent_t *a, uint32_t id, int sig)
{
    for (int i = 0; i < a->n; i++) {
        lrank_t *rk = &a->ranks[i];
        if ((id != DK_FRAME_ALL_RANKS && id != (uint32_t) rk->rank) || rk->exited)
            continue;
        if (rk->pid > 0)
            killpg(rk->pid, sig);
        else if (sig < 64)
            rk->pending_sigs |= (uint64_t) 1 << sig;    /* sent once it starts */
    }
}

/* ---- frames from the kernel ----------------------------------------------------- */

static void on_frame(agent_t *a, const dk_frame_msg_t *f)
{
    if (f->type == DK_FRAME_PING)
        return;     /* its arrival was the point (heard_at) */
    if (f->type == DK_FRAME_SIGNAL && f->len == 4) {
        uint32_t sig = dk_get_be32(f->payload);
        if (sig >= 1 && sig < (uint32_t) NSIG)
            signal_ranks(a, f->id, (int) sig);
        return;
    }
    if ((f->type == DK_FRAME_RELAY || f->type == DK_FRAME_RELAY_END) && a->relay) {
        dk_relay_from_kernel(a->relay, f->type, f->id, f->payload, f->len);
        return;
    }
    if (f->type == DK_FRAME_STACKS && (f->len == 0 || f->len == 4)) {
        bool sample = f->len == 4 && dk_get_be32(f->payload) == DK_FRAME_STACKS_SAMPLE;
        agent_want_stacks(a, f->id, sample);
        return;
    }
    say(a, "the kernel sent a message of type %d, which this agent does not know; ignored",
        f->type);
}

static void read_kernel(agent_t *a)
{
    for (;;) {
        if (a->in_cap - a->in_len < 4096) {
            size_t cap = a->in_cap ? a->in_cap * 2 : 65536;
            unsigned char *in = realloc(a->in, cap);
            if (!in) {
                kernel_gone(a, "out of memory for the kernel's messages");
                return;
            }
            a->in = in;
            a->in_cap = cap;
        }
        ssize_t n = recv(a->fd, a->in + a->in_len, a->in_cap - a->in_len, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            if (a->shut)
                a->gone = true;     /* the close we were waiting for */
            else
                kernel_gone(a, "the kernel closed the back channel");
            return;
        }
        a->in_len += (size_t) n;
        a->heard_at = dk_now_s();
    }
    size_t at = 0;
    while (!a->gone) {
        dk_frame_msg_t f;
        const char *why;
        long took = dk_frame_open(&a->side, a->in + at, a->in_len - at, IN_PAYLOAD_MAX, &f, NULL,
                                  &why);
        if (took < 0) {
            kernel_gone(a, why);
            break;
        }
        if (took == 0)
            break;
        on_frame(a, &f);
        at += (size_t) took;
    }
    memmove(a->in, a->in + at, a->in_len - at);
    a->in_len -= at;
}

/* ---- the start ------------------------------------------------------------------ */

static bool start_ranks(agent_t *a, const char *warm_socket)
{
    const dk_agent_spec_t *s = a->spec;
    char *default_argv[2] = {(char *) s->rank_exe, NULL};
    char *const *argv = s->rank_argv ? s->rank_argv : default_argv;
    for (int i = 0; i < a->n; i++) {
        lrank_t *rk = &a->ranks[i];
        dk_rankenv_t in = s->proto;
        in.rank = rk->rank;
        in.world_size = s->world_size;
        in.ranks_per_node = s->ranks_per_node;
        char *log = NULL;
        if (asprintf(&log, "%s/rank-%d.log", s->log_dir ? s->log_dir : "/nonexistent",
                     rk->rank) < 0)
            log = NULL;
        in.log_path = log;
        in.stacks_path = a->stacks ? dk_stackreq_path(a->stacks, i) : NULL;
        in.warm_socket = warm_socket;
        in.bc_address = dk_relay_address(a->relay);   /* ranks start only with a relay */
        char **env = log ? dk_rankenv_build(s->base_env, &in) : NULL;
        free(log);
        if (!env) {
            say(a, "out of memory building rank %d's environment", rk->rank);
            return false;
        }
        dk_spawned_t sp;
        char why[512];
        dk_spawn_opts_t opts = DK_SPAWN_OPTS_INIT;
        opts.session = true;   /* as on the kernel's node: dk_job_launch.c */
        int rc = dk_spawn_with(s->rank_exe, argv, env, &opts, &sp, why, sizeof why);
        dk_spawn_env_free(env);
        if (rc != 0) {
            say(a, "cannot start rank %d: %s", rk->rank, why);
            return false;
        }
        rk->pid = sp.pid;
        rk->pidfd = sp.pidfd;
        rk->pipes[0] = sp.out_fd;
        rk->pipes[1] = sp.err_fd;
        a->live++;
        unsigned char pid[4];
        dk_put_be32(pid, (uint32_t) sp.pid);
        agent_send_frame(a, DK_FRAME_STARTED, (uint32_t) rk->rank, pid, sizeof pid);
        /* What the kernel sent while the template was awaited (the stop
         * ladder's rungs, in signal order: a rank just started ends at the
         * first it does not ignore). */
        for (int sig = 1; rk->pending_sigs && sig < 64; sig++)
            if (rk->pending_sigs & ((uint64_t) 1 << sig))
                killpg(rk->pid, sig);
        rk->pending_sigs = 0;
    }
    int *groups = calloc(a->n > 0 ? (size_t) a->n : 1, sizeof *groups);
    char why[256];
    for (int i = 0; groups && i < a->n; i++)
        groups[i] = a->ranks[i].pid;
    if (!groups || dk_spawn_sentinel(groups, a->n, &a->sentinel_pid, &a->sentinel_fd, why,
                                     sizeof why) != 0)
        say(a, "the ranks' children will not end with this agent if it is killed: %s",
            groups ? why : "out of memory");
    free(groups);
    return true;
}

/* ---- warm start ----------------------------------------------------------------- */

/* This node's template's socket once it is ready and can fork, waiting for
 * it (at most spec.warm_wait_s) while the kernel is heard and PINGed; NULL
 * when the ranks start cold (the template, if any, is then ended, and the
 * reason said once), or when the kernel went away meanwhile. */
static const char *warm_socket(agent_t *a)
{
    const dk_agent_spec_t *s = a->spec;
    char why[1024] = "";
    if (!s->template) {
        if (s->warm_failed)
            say(a, "ranks start cold: %s", s->warm_failed);
        return NULL;
    }
    /* By default as long as the kernel waits for its own (the settings table's). */
    double wait_s = s->warm_wait_s >= 0 ? s->warm_wait_s
                                        : dk_setting_find("DISTKERNEL_WARM_WAIT_S")->value;
    /* The kernel takes ranks not connected by its connect deadline (counted
     * from the job's start, before ours) for lost: half of it is left to
     * start them cold and for them to connect. */
    if (s->connect_timeout_s > 0 && wait_s > s->connect_timeout_s / 2)
        wait_s = s->connect_timeout_s / 2;
    double until = dk_now_s() + wait_s;
    int ready = 0;
    bool stopped = false;
    while (!a->gone) {
        ready = dk_template_ready(s->template, WARM_SLICE_MS, why, sizeof why);
        double now = dk_now_s();
        if (ready != 0 || now >= until)
            break;
        struct pollfd p = {.fd = a->fd, .events = POLLIN};
        if (poll(&p, 1, 0) > 0)
            read_kernel(a);
        /* A stop for every rank of the node (an interrupt, a timeout, another
         * node's failure) ends the wait: the ranks start cold and get it at
         * once, as cold ranks would have in their own imports, rather than
         * after the template's import. */
        stopped = a->n > 0;
        for (int i = 0; stopped && i < a->n; i++)
            stopped = a->ranks[i].pending_sigs != 0;
        if (stopped)
            break;
        if (!a->gone && now - a->pinged_at >= DK_BC_PING_S)
            agent_send_frame(a, DK_FRAME_PING, (uint32_t) s->node, NULL, 0);
        flush_out(a);
        if (!a->gone && now - a->heard_at > a->heartbeat_s)
            kernel_gone(a, "the kernel has been silent past the heartbeat deadline");
    }
    if (a->gone)
        return NULL;
    if (stopped)
        snprintf(why, sizeof why, "the run was stopped while this node's template imported");
    else if (ready == 0)
        snprintf(why, sizeof why, "this node's template was not ready after %.1f s (still "
                 "importing)", wait_s);
    if (ready > 0 && dk_template_check(s->template, why, sizeof why) == 0)
        return dk_template_socket(s->template);
    say(a, "ranks start cold: %s", why);
    dk_template_end(s->template);    /* its memory back to the ranks; reaped by the caller */
    return NULL;
}

/* ---- the loop ------------------------------------------------------------------- */

/* SIGTERM: Slurm ending the step (scancel, a cancelled or timed-out job, the
 * armed scancel of a SIGKILLed kernel), which signals every process of the
 * step and SIGKILLs what is left KillWait later (30 s by default), and, with
 * proctrack, whatever outlives the task at once. So the agent does not die of
 * it: it ends its ranks with the stop ladder (they may have been signalled
 * too), tells the kernel their exits while it listens, and returns without
 * waiting for the kernel's close, so that agent_main removes the node's
 * folders itself (dk_tidy_end) before Slurm's SIGKILL could take the
 * folder watcher with the agent. */
static volatile sig_atomic_t terminated;

static void on_term(int sig)
{
    (void) sig;
    terminated = 1;
}

static void terminate(agent_t *a, double now)
{
    if (dk_stop_begun(&a->stop))
        return;
    if (a->live > 0)
        say(a, "ended by a SIGTERM (Slurm ended the step); ending this node's %d rank%s", a->live,
            a->live == 1 ? "" : "s");
    int sig = dk_stop_begin(&a->stop, now);
    for (int i = 0; sig && i < a->n; i++)
        if (!a->ranks[i].exited && a->ranks[i].pid > 0)
            killpg(a->ranks[i].pid, sig);
}

static double earliest(double a, double b)
{
    return a < 0 ? b : b < 0 ? a : a < b ? a : b;
}

/* Whether the loop is over once every rank has ended: the agent closes its
 * side, then waits for the kernel to close (a heartbeat at most), or not at
 * all when it was told to end. */
static bool all_told(agent_t *a, double now)
{
    if (a->gone)
        return true;
    if (a->shut)
        return terminated || now - a->shut_at > a->heartbeat_s;
    /* Everything is told: our side is done, the kernel closes. */
    flush_out(a);
    shutdown(a->fd, SHUT_WR);
    a->shut = true;
    a->shut_at = now;
    return terminated;      /* not waiting for it: Slurm's SIGKILL comes */
}

/* With nothing to poll with (out of memory): end every rank now. */
static void kill_ranks_now(agent_t *a)
{
    for (int i = 0; i < a->n; i++)
        if (!a->ranks[i].exited && a->ranks[i].pid > 0) {
            killpg(a->ranks[i].pid, SIGKILL);
            waitpid(a->ranks[i].pid, NULL, 0);
            a->ranks[i].exited = true;
        }
}

/* What the loop waits on, in FDS with WHO saying whose each is: the
 * kernel's connection (-1), each rank's pipes and pidfd (3 * rank + 0, 1, 2),
 * the relayed connections (-2, from *RELAY_AT, *RELAY_N of them). */
static size_t fill_poll(agent_t *a, struct pollfd *fds, int *who, size_t *relay_at,
                        size_t *relay_n)
{
    size_t nf = 0;
    if (!a->gone) {
        fds[nf] = (struct pollfd){.fd = a->fd, .events = POLLIN};
        who[nf++] = -1;
    }
    for (int i = 0; i < a->n; i++) {
        lrank_t *rk = &a->ranks[i];
        for (int w = 0; w < 2; w++)
            if (rk->pipes[w] >= 0) {
                fds[nf] = (struct pollfd){.fd = rk->pipes[w], .events = POLLIN};
                who[nf++] = 3 * i + w;
            }
        if (!rk->exited && rk->pidfd >= 0) {
            fds[nf] = (struct pollfd){.fd = rk->pidfd, .events = POLLIN};
            who[nf++] = 3 * i + 2;
        }
    }
    *relay_at = nf;
    *relay_n = 0;
    if (a->relay && !a->gone) {
        *relay_n = dk_relay_poll_fill(a->relay, fds + nf);
        for (size_t k = 0; k < *relay_n; k++)
            who[nf + k] = -2;
        nf += *relay_n;
    }
    return nf;
}

/* How long poll may wait (ms, -1 for ever): until the next ping, heartbeat
 * deadline, stop step, stack request's step or the end of the wait for the
 * kernel to close, and 100 ms at most, for a rank without a pidfd (an old
 * kernel), which is looked at that often. */
static int poll_timeout(agent_t *a, double now)
{
    double next = a->gone ? -1 : earliest(a->pinged_at + DK_BC_PING_S,
                                          a->heard_at + a->heartbeat_s);
    next = earliest(next, dk_stop_next_at(&a->stop));
    if (a->stacks)
        next = earliest(next, dk_stackreq_next_at(a->stacks, now));
    if (a->shut)
        next = earliest(next, a->shut_at + a->heartbeat_s);
    next = earliest(next, now + 0.1);
    return next < 0 ? -1 : next <= now ? 0 : (int) ((next - now) * 1000) + 1;
}

/* What is due at NOW whatever poll says: the ping, the kernel's heartbeat,
 * the stop ladder's signals, the stacks. */
static void tick(agent_t *a, double now)
{
    if (!a->gone && !a->shut && now - a->pinged_at >= DK_BC_PING_S)
        agent_send_frame(a, DK_FRAME_PING, (uint32_t) a->spec->node, NULL, 0);
    if (!a->gone && now - a->heard_at > a->heartbeat_s)
        kernel_gone(a, "the kernel has been silent past the heartbeat deadline");
    for (int sig; (sig = dk_stop_due(&a->stop, now)) != 0;)
        for (int i = 0; i < a->n; i++)
            if (!a->ranks[i].exited && a->ranks[i].pid > 0)
                killpg(a->ranks[i].pid, sig);
    if (a->stacks && dk_stackreq_running(a->stacks) && dk_stackreq_poll(a->stacks, now))
        agent_stacks_send(a);
}

static void loop(agent_t *a)
{
    size_t relay_max = a->relay ? dk_relay_max_fds(a->relay) : 0;
    size_t max = 1 + 3 * (size_t) a->n + relay_max;
    struct pollfd *fds = calloc(max, sizeof *fds);
    int *who = calloc(max, sizeof *who);
    if (!fds || !who) {
        say(a, "out of memory");
        kernel_gone(a, "out of memory");
    }
    for (;;) {
        double now = dk_now_s();
        if (terminated)
            terminate(a, now);
        if (a->live == 0 && all_told(a, now))
            break;
        if (!fds || !who) {
            /* Nothing to poll with: wait for the ranks the ladder ends. */
            kill_ranks_now(a);
            break;
        }
        tick(a, now);
        size_t relay_at, relay_n;
        size_t nf = fill_poll(a, fds, who, &relay_at, &relay_n);
        flush_out(a);
        int r = poll(fds, nf, poll_timeout(a, now));
        if (r < 0 && errno != EINTR)
            break;
        for (size_t k = 0; r > 0 && k < nf; k++) {
            if (!fds[k].revents || who[k] == -2)
                continue;
            if (who[k] < 0) {
                read_kernel(a);
                continue;
            }
            int i = who[k] / 3, w = who[k] % 3;
            if (w < 2)
                pump(a, i, w);
            else if (!a->ranks[i].exited)
                reap(a, i);
        }
        if (r > 0 && relay_n && a->relay && !a->gone)
            dk_relay_poll_handle(a->relay, fds + relay_at, relay_n);
        for (int i = 0; i < a->n; i++)
            if (!a->ranks[i].exited && a->ranks[i].pidfd < 0 && a->ranks[i].pid > 0)
                reap(a, i);
    }
    flush_out(a);
    free(fds);
    free(who);
}

int dk_agent_run(const dk_agent_spec_t *spec)
{
    agent_t a;
    memset(&a, 0, sizeof a);
    a.spec = spec;
    a.fd = spec->fd;
    a.sentinel_pid = a.sentinel_fd = -1;
    a.heartbeat_s = spec->heartbeat_s > 0 ? spec->heartbeat_s : DK_BC_HEARTBEAT_DEFAULT_S;
    a.stop = dk_stop_ladder(spec->grace_s > 0 ? spec->grace_s : DEFAULT_GRACE_S);
    a.heard_at = a.pinged_at = dk_now_s();
    struct sigaction term = {.sa_handler = on_term};    /* no SA_RESTART: poll wakes */
    sigemptyset(&term.sa_mask);
    sigaction(SIGTERM, &term, NULL);
    int per = spec->ranks_per_node;
    if (per < 1 || spec->world_size < per || spec->world_size % per != 0 || spec->node < 0 ||
        (long) spec->node * per >= spec->world_size) {
        say(&a, "node %d of %d ranks at %d a node is not in the run", spec->node,
            spec->world_size, per);
        return 2;
    }
    if (!(a.key = dk_frame_key_new(spec->key))) {
        say(&a, "OpenSSL has no HMAC");
        return 2;
    }
    dk_frame_side_init(&a.side, a.key, spec->nonce, DK_FRAME_DIR_TO_RUNTIME);
    a.n = per;
    a.ranks = calloc((size_t) per, sizeof *a.ranks);
    if (!a.ranks) {
        say(&a, "out of memory");
        dk_frame_key_destroy(&a.key);
        return 2;
    }
    for (int i = 0; i < per; i++) {
        lrank_t *rk = &a.ranks[i];
        rk->rank = spec->node * per + i;
        rk->pid = -1;
        rk->pidfd = rk->pipes[0] = rk->pipes[1] = -1;
    }
    if (spec->stacks) {
        char why[512];
        if (!(a.stacks = dk_stackreq_new(per, why, sizeof why)))
            say(&a, "the ranks' stacks cannot be asked for: %s", why);
    }
    agent_send_frame(&a, DK_FRAME_AGENT_HELLO, (uint32_t) spec->node, NULL, 0);
    flush_out(&a);
    /* The ranks' connections come through this agent's (dk_relay.h). */
    char why[512];
    dk_relay_sink_t rsink = {&a, relay_send, relay_before};
    bool relayed = a.gone ||
                   (a.relay = dk_relay_new(per + DK_BC_RELAY_SLACK, &rsink, why, sizeof why));
    /* A rank reaches the kernel only through the relay (a Unix socket of
     * this node): without one, no rank of the node could, and the node
     * fails now, saying why, rather than its ranks one by one. */
    if (!relayed)
        say(&a, "no rank can start on this node: %s", why);
    int rc = 2;
    const char *warm = a.gone || !relayed ? NULL : warm_socket(&a);
    if (!a.gone && relayed && start_ranks(&a, warm)) {
        loop(&a);
        rc = a.shut ? 0 : 1;
    } else {
        /* Nothing more starts: end what did. */
        for (int i = 0; i < a.n; i++)
            if (a.ranks[i].pid > 0) {
                killpg(a.ranks[i].pid, SIGKILL);
                waitpid(a.ranks[i].pid, NULL, 0);
            }
    }
    for (int i = 0; i < a.n; i++) {
        close_fd(&a.ranks[i].pidfd);
        close_fd(&a.ranks[i].pipes[0]);
        close_fd(&a.ranks[i].pipes[1]);
    }
    dk_spawn_sentinel_end(&a.sentinel_pid, &a.sentinel_fd);
    flush_out(&a);
    dk_relay_destroy(&a.relay);
    dk_stackreq_destroy(&a.stacks);
    dk_frame_key_destroy(&a.key);
    free(a.ranks);
    free(a.in);
    free(a.out);
    return rc;
}
