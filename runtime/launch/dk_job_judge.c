/*
 * dk_job_judge: how each rank of a job ended, and the stop that follows.
 *
 * Judging a rank. A rank's exit is seen on its pidfd and collected with
 * waitpid(pid, WNOHANG) (never waitpid(-1): the host has other children).
 * Before the exit is judged, its pipes and the back channel are drained, so a
 * RESULT sent just before exit is never mistaken for "exited without a
 * result", and its last output precedes its state change. Then:
 *   - it had already failed (sent ERROR before the runtime signalled it): FAILED;
 *   - it exited 0 with a RESULT: DONE, even if it was being stopped;
 *   - the runtime had signalled it: STOPPED (a Python rank answers SIGINT with
 *     a KeyboardInterrupt ERROR; that is our doing, not a failure);
 *   - otherwise (non-zero exit, signal, no RESULT): FAILED.
 * Over TCP, a connection its rank's side closes before an answer starts a
 * wait for the exit, bounded by the heartbeat deadline (bc_closed): a rank
 * still running then is lost.
 * The first failure is the root cause and starts the stop: SIGINT to the
 * process group of every rank not yet reaped, SIGTERM after the grace, SIGKILL
 * after another. A rank that has already sent its RESULT or ERROR is spared the
 * SIGINT (it is past its code and exiting; interrupting its cleanup would only
 * blur its exit status) but not the later two, so a rank that hangs after
 * reporting still ends. Cancel and the timeout start the same stop; whichever
 * stop comes first decides how the job ends, and a failure seen after the stop
 * began is recorded on its rank but is not a root cause (it is most likely an
 * echo: a peer losing its NCCL connection to the rank that failed).
 * Before that first signal (and before a round's interrupt) the live ranks
 * are asked for their stacks (dk_stackreq), once per job or round: the
 * signal is deferred until they answered or the wait is over, so what the
 * host shows is where they were, not where a KeyboardInterrupt took them.
 */
#include "dk_job_state.h"
#include "dk_clock.h"
#include "dk_lost.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* On this node, how long a rank's error that says a peer went away (gloo's
 * "Connection closed by peer") waits for that peer's exit: a rank killed by a
 * signal closes its sockets at once, but the process we reap for it, the warm
 * launcher, learns of the death from the template a moment later. */
#define LOCAL_ECHO_GRACE_S 2.0

/* ------------------------------------------------------------------------ */
/* Rank states and the stop                                                  */

void job_set_state(dk_job_t *job, int r, dk_rank_state_t state)
{
    rank_t *rk = &job->ranks[r];
    pthread_mutex_lock(&job->lock);
    rk->state = state;
    int code = rk->exit_code, sig = rk->term_signal;
    pthread_mutex_unlock(&job->lock);
    if (job->sink.on_state)
        job->sink.on_state(job->sink.data, r, state, code, sig);
}

static void signal_ranks(dk_job_t *job, int sig)
{
    if (sig == 0)
        return;             /* the ladder has nothing due */
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (rk->reaped)
            continue;       /* its pid, and so its group id, may belong to another now */
        if (sig == SIGINT && rk->reported)
            continue;       /* past its code and on its way out: let it exit cleanly */
        rk->signalled = true;
        if (rk->by_agent)   /* its agent signals its group on its node */
            dk_backchan_agent_send(job->chan, r / job->ranks_per_node, DK_FRAME_SIGNAL,
                                   (uint32_t) r, sig);
        else
            killpg(rk->pid, sig);
    }
}

/* Ask every rank that may answer for its stacks (dk_stackreq.h;
 * dk_stackreq_sample for a live SAMPLE): a rank of this node through its
 * file, one started by a node agent through its agent. A rank that has
 * answered is past its code; a lost one is not asked. Returns how many
 * were asked. */
static int begin_stacks(dk_job_t *job, bool sample)
{
    pid_t *groups = calloc((size_t) job->world_size, sizeof *groups);
    if (!groups)
        return 0;
    for (int r = 0; r < job->world_size; r++) {
        const rank_t *rk = &job->ranks[r];
        if (rk->reaped || rk->reported || rk->lost)
            groups[r] = 0;
        else if (rk->by_agent)     /* its agent signals it there (a sample: its sampler thread) */
            groups[r] = dk_backchan_agent_send(job->chan, r / job->ranks_per_node,
                                               DK_FRAME_STACKS, (uint32_t) r,
                                               sample ? (int) DK_FRAME_STACKS_SAMPLE : 0)
                            ? DK_STACKREQ_BY_CHANNEL : 0;
        else
            groups[r] = rk->pid;
    }
    int asked = sample ? dk_stackreq_sample(job->stacks, groups, dk_now_s(), job->stacks_wait_s)
                       : dk_stackreq_begin(job->stacks, groups, dk_now_s(), job->stacks_wait_s);
    free(groups);
    return asked;
}

/* Ask the live ranks for their stacks, once per job or round. True while
 * the request runs: what the caller was about to signal waits for it
 * (job_stacks_over), so the ranks are seen where they were, not where a
 * KeyboardInterrupt took them. */
bool job_ask_stacks(dk_job_t *job)
{
    if (!job->stacks)
        return false;
    if (dk_stackreq_running(job->stacks)) {
        /* A live sample asked a moment ago: its answers are the end's. */
        if (job->sampling) {
            job->sampling = false;
            job->stacks_asked = true;
        }
        return true;
    }
    /* Between rounds no rank runs a cell, and the host may be reading the
     * last round's answers. */
    if (job->stacks_asked || (job->persistent && job->round_pending == 0))
        return false;
    job->stacks_asked = true;
    return begin_stacks(job, false) > 0;
}

/* A live sample's answers to the host (dk_job_sample_stacks), then
 * forgotten: they are not the stacks of an end. */
void job_sample_over(dk_job_t *job)
{
    job->sampling = false;
    int world = job->world_size;
    const char **dumps = calloc((size_t) world, sizeof *dumps);
    size_t *lens = calloc((size_t) world, sizeof *lens);
    if (dumps && lens && job->sink.on_stacks) {
        for (int r = 0; r < world; r++)
            dumps[r] = dk_stackreq_dump(job->stacks, r, &lens[r]);
        job->sink.on_stacks(job->sink.data, world, dumps, lens);
    }
    free(dumps);
    free(lens);
    dk_stackreq_clear(job->stacks);
}

/* Begin a live sample, unless the job ends, a request runs already, or (a
 * persistent job) no round is running or it is being interrupted. The
 * request is polled as any (loop_once); nothing waits for it. */
void job_sample_stacks(dk_job_t *job)
{
    if (!job->stacks || job->stop_reason != DK_END_NONE || job->stacks_asked ||
        dk_stackreq_running(job->stacks) ||
        (job->persistent && (job->round_pending == 0 || job->round_reason != DK_END_NONE)))
        return;
    job->sampling = true;
    if (begin_stacks(job, true) == 0)
        job_sample_over(job);
}

static void stop_now(dk_job_t *job);

/* The stacks are in (or their wait is over): what waited for them goes on. */
void job_stacks_over(dk_job_t *job)
{
    if (job->interrupt_deferred) {
        job->interrupt_deferred = false;
        if (job->round_pending > 0) {
            job_signal_unanswered(job);
            if (job->round_deadline < 0)
                job->round_deadline = dk_now_s() + job->stop.grace;
        }
    }
    if (job->stop_deferred) {
        job->stop_deferred = false;
        stop_now(job);
    }
}

void job_begin_stop(dk_job_t *job, dk_job_end_t reason)
{
    if (job->stop_reason != DK_END_NONE)
        return;
    job->stop_reason = reason;
    /* An idle timeout ends ranks that are in no cell: nowhere to be seen. */
    if (reason != DK_END_IDLE && job_ask_stacks(job)) {
        job->stop_deferred = true;
        return;
    }
    stop_now(job);
}

static void stop_now(dk_job_t *job)
{
    /* An idle rank of a persistent job ignores SIGINT and waits on the channel:
     * EOF is its cue to exit. Node agents keep theirs, to tell those exits. */
    if (job->persistent) {
        dk_backchan_close_ranks(job->chan);
        for (int r = 0; r < job->world_size; r++)
            job->ranks[r].signalled = !job->ranks[r].reaped;   /* their exit is our doing */
    }
    signal_ranks(job, dk_stop_begin(&job->stop, dk_now_s()));
}

/* ------------------------------------------------------------------------ */
/* Failures and the root cause                                               */

#define PF_EXITING_FLAG 0x00000004   /* the kernel's PF_EXITING: in do_exit */
#define PF_DUMPCORE_FLAG 0x00000200  /* the kernel's PF_DUMPCORE: writing a core */

/* The fields of /proc/PID/stat after the command name (which may hold
 * anything, ')' included), read into BUF: "S ppid pgrp ...", or NULL (with
 * *GONE set when there is no such process). */
static const char *proc_stat_fields(pid_t pid, char *buf, size_t len, bool *gone)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int) pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    *gone = fd < 0 && (errno == ENOENT || errno == ESRCH);
    if (fd < 0)
        return NULL;
    ssize_t n = read(fd, buf, len - 1);
    close(fd);
    if (n <= 0)
        return NULL;
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' ? p + 2 : NULL;
}

/* Whether PID is on its way out: exiting, or writing a core dump, though not
 * yet reaped (the flags field of /proc/PID/stat). */
static bool process_exiting(pid_t pid)
{
    char buf[1024];
    bool gone;
    const char *p = proc_stat_fields(pid, buf, sizeof buf, &gone);
    /* state, ppid, pgrp, session, tty_nr, tpgid, then flags */
    unsigned long flags = 0;
    if (!p || sscanf(p, "%*c %*d %*d %*d %*d %*d %lu", &flags) != 1)
        return false;
    return (flags & (PF_EXITING_FLAG | PF_DUMPCORE_FLAG)) != 0;
}

/* Whether rank RK's connection closed unanswered and its process is still
 * awaited (bc_closed). */
bool job_closing(const rank_t *rk)
{
    return rk->closed_until > 0 && !rk->reaped && !rk->signalled && !rk->lost;
}

/* Rank R failed on its own. The first such failure is the root cause, judged
 * at the end of the poll turn (job_resolve_failure): other frames and exits of
 * the same turn are in by then. */
void job_note_failure(dk_job_t *job, int r)
{
    rank_t *rk = &job->ranks[r];
    if (rk->signalled || rk->failed)
        return;
    rk->failed = true;
    if (job->stop_reason != DK_END_NONE || job->failure_pending >= 0)
        return;             /* the stop already has its cause; this may be its echo */
    job->failure_pending = r;
    job->failure_at = dk_now_s();
}

/* Until when a pending failure that is most likely an echo (see below)
 * waits for the peer it echoes. */
double job_echo_deadline(const dk_job_t *job)
{
    return job->failure_at +
           (job->heartbeat_s > 0 ? job->heartbeat_s + DK_BC_PING_S : LOCAL_ECHO_GRACE_S);
}

/* The first failure seen this turn, rank R's, is the root cause unless a peer
 * failed first and R most likely only saw it go (gloo's or NCCL's "connection
 * closed"). Three kinds of peer are taken to have failed first:
 *   - one whose connection closed before it answered (bc_closed): its
 *     process's exit, or the deadline that makes it lost, is awaited first,
 *     so the failure stays pending meanwhile; the back channel is drained
 *     first, so a close that arrived just after R's ERROR is seen;
 *   - one that was already on its way out on its own (not stopped by us)
 *     without having answered: a crashing rank can take a while to be reaped
 *     (its core dump), while the error it caused arrives at once. A peer
 *     exiting because it finished has sent its RESULT before it began to
 *     exit, but that frame may still wait in the socket behind R's (or may
 *     have lost the race with R's ERROR to this turn): so the peers on their
 *     way out are noted first, the back channel is drained, and only those
 *     still without an answer count;
 *   - when R's error says a peer went away: one that has died without a word
 *     (reaped, no ERROR of its own), waited for until job_echo_deadline. On this
 *     node a killed rank is not always reaped by the time its peers' errors
 *     arrive: a warm rank's process is its launcher, which hears of the death
 *     from the template.
 * Then the stop begins. */
void job_resolve_failure(dk_job_t *job)
{
    int r = job->failure_pending;
    if (r < 0 || job->stop_reason != DK_END_NONE) {
        job->failure_pending = -1;
        return;
    }
    if (job->heartbeat_s > 0)
        dk_backchan_drain(job->chan);
    bool peer_gone = false;
    for (int q = 0; q < job->world_size; q++) {
        const rank_t *peer = &job->ranks[q];
        if (q != r && job_closing(peer))
            return;         /* still pending: judged again each turn */
        /* A peer that raised the same echo (its own "connection closed") is
         * no news of who went: on a node that lost its neighbour every rank
         * in a collective raises it at once. */
        bool echoed = peer->reported && peer->echo;
        peer_gone = peer_gone || (q != r && (peer->lost || (peer->failed && !echoed)));
    }
    /* Rank R says a peer's connection went away, and no peer is known to
     * have gone yet: wait for the kernel to learn whose, within the
     * heartbeat deadline (a killed node's connections close; a cut one's go
     * silent), or on this node until the dead peer is reaped, rather than
     * blame R. */
    if (job->ranks[r].echo && !peer_gone && dk_now_s() < job_echo_deadline(job))
        return;
    job->failure_pending = -1;
    int cause = job->ranks[r].closed_unanswered ? r : -1;
    for (int q = 0; q < job->world_size && cause < 0 && !job->ranks[r].lost; q++) {
        if (q != r && job->ranks[q].lost)
            cause = q;      /* a lost node's rank: R's error was its echo */
    }
    for (int q = 0; q < job->world_size && cause < 0 && job->ranks[r].echo; q++) {
        if (q != r && job->ranks[q].failed && !job->ranks[q].reported)
            cause = q;      /* a peer that died without a word: R's error was its echo */
    }
    for (int q = 0; q < job->world_size && cause < 0; q++) {
        if (job->ranks[q].closed_unanswered && job->ranks[q].failed)
            cause = q;
    }
    bool any = false;
    for (int q = 0; q < job->world_size && cause < 0; q++) {
        rank_t *rk = &job->ranks[q];
        rk->was_exiting = q != r && !rk->reaped && !rk->signalled && !rk->failed &&
                          !rk->reported && process_exiting(rk->pid);
        any = any || rk->was_exiting;
    }
    if (any)
        dk_backchan_drain(job->chan);
    for (int q = 0; q < job->world_size && cause < 0 && any; q++) {
        if (job->ranks[q].was_exiting && !job->ranks[q].reported)
            cause = q;
    }
    if (cause >= 0)
        job->ranks[cause].failed = true;   /* judged FAILED when reaped, not STOPPED */
    pthread_mutex_lock(&job->lock);
    job->root_cause = cause >= 0 ? cause : r;
    pthread_mutex_unlock(&job->lock);
    job_begin_stop(job, DK_END_FAILED);
}

void job_escalate(dk_job_t *job)
{
    double t = dk_now_s();
    if (job->stop_reason == DK_END_NONE && job->timeout_s > 0 &&
        t >= job->started_at + job->timeout_s)
        job_begin_stop(job, DK_END_TIMEOUT);
    if (job->persistent && job->stop_reason == DK_END_NONE) {
        pthread_mutex_lock(&job->lock);
        bool active = job->round_active && !job->submit_pending;
        bool idle = !job->round_active;   /* a submit on its way is not idleness */
        double idle_since = job->idle_since;
        pthread_mutex_unlock(&job->lock);
        if (active && job->round_deadline >= 0 && t < job->round_deadline &&
            t >= job->round_resend_at)
            job_signal_unanswered(job);
        if (active && job->round > 0 && job->round_reason == DK_END_NONE &&
            job->round_timeout_s > 0 && t >= job->round_started_at + job->round_timeout_s) {
            job->round_reason = DK_END_TIMEOUT;
            job_interrupt_round(job);
        }
        if (active && job->round_deadline >= 0 && t >= job->round_deadline)
            job_round_stuck(job);
        if (idle && job->idle_timeout_s > 0 && t >= idle_since + job->idle_timeout_s) {
            job_warn(job, "the started ranks were idle for %g s (idle_timeout=, "
                 "DISTKERNEL_IDLE_TIMEOUT) and are being ended", job->idle_timeout_s);
            job_begin_stop(job, DK_END_IDLE);
        }
    }
    for (int sig; (sig = dk_stop_due(&job->stop, t)) != 0;)
        signal_ranks(job, sig);
}

/* ------------------------------------------------------------------------ */
/* Lost ranks                                                                */

static void mark_lost(dk_job_t *job, int r)
{
    rank_t *rk = &job->ranks[r];
    pthread_mutex_lock(&job->lock);
    rk->lost = true;
    pthread_mutex_unlock(&job->lock);
    if (job->sink.on_lost)
        job->sink.on_lost(job->sink.data, r, rk->host);
}

/* Lost-node warnings a run writes in the cell, one per node; past this many
 * one line says that more went (the run's error names every lost node). */
#define LOST_NODES_TOLD_MAX 8

/* Whether a rank of R's node other than R was lost already (its node's loss
 * was told then). */
static bool node_lost_before(const dk_job_t *job, int r)
{
    const char *host = job->ranks[r].host;
    for (int q = 0; host && q < job->world_size; q++)
        if (q != r && job->ranks[q].lost && job->ranks[q].host &&
            strcmp(job->ranks[q].host, host) == 0)
            return true;
    return false;
}

/* Whether a node's loss may be warned of in the cell: up to
 * LOST_NODES_TOLD_MAX nodes, then one line for all the others. */
static bool may_tell_lost_node(dk_job_t *job)
{
    if (job->lost_nodes_told < LOST_NODES_TOLD_MAX) {
        job->lost_nodes_told++;
        return true;
    }
    if (job->lost_nodes_told++ == LOST_NODES_TOLD_MAX)
        job_warn(job, "more nodes were lost; the run's error names every one");
    return false;
}

/* "rank 5" or "ranks 5" DK_EN_DASH "7" for RANKS[0..N), N >= 1. */
static void told_ranks(const int *ranks, size_t n, char *buf, size_t len)
{
    size_t at = (size_t) snprintf(buf, len, n == 1 ? "rank " : "ranks ");
    if (at < len)
        dk_ranks_format(ranks, n, 2, buf, len, &at);
}

/* Rank R is lost (WHY says how that was found), and that is a failure. The
 * ranks of its node with no connection left to tell of them are lost with
 * it: those that have not connected yet (still starting when the node went
 * quiet), and those whose connection closed unanswered and whose exit has
 * not been told (the node's processes were killed). The cell is told once per node, with its
 * ranks lost with it as runs, so a run of 1,024 ranks whose nodes go down
 * says at most LOST_NODES_TOLD_MAX + 1 such things at all. */
void job_lose(dk_job_t *job, int r, const char *why)
{
    rank_t *rk = &job->ranks[r];
    bool tell = !node_lost_before(job, r) && may_tell_lost_node(job);
    mark_lost(job, r);
    if (tell)
        job_warn(job, "rank %d on %s lost: %s", r, rk->host, why);
    job_note_failure(job, r);
    int *never = calloc((size_t) job->world_size, sizeof *never);
    int *closed = calloc((size_t) job->world_size, sizeof *closed);
    size_t nnever = 0, nclosed = 0;
    for (int q = 0; rk->host && q < job->world_size; q++) {
        rank_t *mate = &job->ranks[q];
        if (q == r || mate->lost || (mate->reaped && !mate->deferred) || !mate->host ||
            strcmp(mate->host, rk->host))
            continue;
        bool not_yet = !dk_backchan_rank_connected_once(job->chan, q);
        if (!not_yet && !job_closing(mate))
            continue;
        mark_lost(job, q);
        if (not_yet && never)
            never[nnever++] = q;
        else if (!not_yet && closed)
            closed[nclosed++] = q;
    }
    char ranks[256];
    if (tell && nnever) {
        told_ranks(never, nnever, ranks, sizeof ranks);
        job_warn(job, "%s on %s lost with it: %s not connected yet", ranks, rk->host,
                 nnever == 1 ? "it had" : "they had");
    }
    if (tell && nclosed) {
        told_ranks(closed, nclosed, ranks, sizeof ranks);
        job_warn(job, "%s on %s lost with it: %s connection had closed and %s not "
                 "exited", ranks, rk->host, nclosed == 1 ? "its" : "their",
                 nclosed == 1 ? "it had" : "they had");
    }
    free(never);
    free(closed);
}

/* The ranks whose connection closed unanswered and that have not exited by
 * the deadline (bc_closed): lost. */
void job_judge_closed(dk_job_t *job)
{
    double now = dk_now_s();
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (!job_closing(rk) || now < rk->closed_until)
            continue;
        rk->closed_until = 0;
        char why[160];
        if (rk->by_agent)
            snprintf(why, sizeof why, "its connection closed without an answer, and its agent "
                     "had not told its exit %.1f s later", job->heartbeat_s);
        else
            snprintf(why, sizeof why, "its connection closed without an answer, and its "
                     "process (pid %d) was still running %.1f s later", (int) rk->pid,
                     job->heartbeat_s);
        job_lose(job, r, why);
    }
}

/* ------------------------------------------------------------------------ */
/* Exits                                                                     */

static void judge(dk_job_t *job, int r, int status, bool known);

/* Collect rank R if it has exited, and judge it (see the top of the file). */
void job_reap(dk_job_t *job, int r)
{
    rank_t *rk = &job->ranks[r];
    int status = 0;
    pid_t got;
    /* A rank that has exited may have left children running in its process
     * group (a background `subprocess.Popen`, a worker it never joined). They
     * end with it: while the rank is a zombie its pid, and so the group's id,
     * cannot be reused, so signalling the group now reaches only them. */
    siginfo_t si;
    memset(&si, 0, sizeof si);
    int wrc;
    do
        wrc = waitid(P_PID, (id_t) rk->pid, &si, WEXITED | WNOHANG | WNOWAIT);
    while (wrc < 0 && errno == EINTR);
    if (wrc == 0 && si.si_pid == rk->pid)
        kill(-rk->pid, SIGKILL);
    do
        got = waitpid(rk->pid, &status, WNOHANG);
    while (got < 0 && errno == EINTR);
    if (got == 0)
        return;
    job_reaped(job, r, status, got == rk->pid);
}

/* Rank R ended with STATUS (KNOWN: as waitpid tells it; or as its agent
 * told it): its last words, then its verdict, or its deferral. */
void job_reaped(dk_job_t *job, int r, int status, bool known)
{
    rank_t *rk = &job->ranks[r];
    job_drain_pipe(job, r, 0, REAP_DRAIN_BUDGET);
    job_drain_pipe(job, r, 1, REAP_DRAIN_BUDGET);
    dk_backchan_drain(job->chan);

    rk->reaped = true;
    job_close_fd(&rk->pidfd);
    if (job->stacks)
        dk_stackreq_gone(job->stacks, r);
    /* Over TCP, a rank that ends while its connection is still open and
     * unanswered (a child of its holds it) may have its answer still on the
     * way: its verdict waits until the connection closes, the rank is lost,
     * or the heartbeat deadline passes. */
    if (job->heartbeat_s > 0 && !rk->reported && !rk->signalled && !rk->lost &&
        dk_backchan_rank_open(job->chan, r)) {
        rk->deferred = true;
        /* The backchannel judges silence at the start of a poll turn, this
         * verdict at its end: give the heartbeats a ping's margin to speak first. */
        rk->deferred_until = dk_now_s() + job->heartbeat_s + DK_BC_PING_S;
        rk->deferred_status = status;
        rk->deferred_known = known;
        return;
    }
    judge(job, r, status, known);
}

/* Rank R, started by an agent that is gone, will never be told to have
 * exited: it is lost with its node (job_agent_gone), and ended here. */
void job_judge_gone(dk_job_t *job, int r)
{
    rank_t *rk = &job->ranks[r];
    if (rk->reaped && !rk->deferred)
        return;
    rk->reaped = true;
    rk->deferred = false;
    if (job->stacks)
        dk_stackreq_gone(job->stacks, r);
    job->unreaped--;
    job->last_reap_at = dk_now_s();
    pthread_mutex_lock(&job->lock);
    rk->exit_code = -1;
    rk->term_signal = 0;
    pthread_mutex_unlock(&job->lock);
    job_set_state(job, r, DK_RANK_FAILED);
}

/* Rank R's deferred verdict is due (see job_reap). */
void job_judge_deferred(dk_job_t *job)
{
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (rk->deferred && (rk->lost || !dk_backchan_rank_open(job->chan, r) ||
                             dk_now_s() >= rk->deferred_until)) {
            rk->deferred = false;
            judge(job, r, rk->deferred_status, rk->deferred_known);
        }
    }
}

/* Rank R has been collected with STATUS (KNOWN: by us): its verdict. */
static void judge(dk_job_t *job, int r, int status, bool known)
{
    rank_t *rk = &job->ranks[r];
    job->unreaped--;
    job->last_reap_at = dk_now_s();
    bool clean = known && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    pthread_mutex_lock(&job->lock);
    rk->exit_code = known && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    rk->term_signal = known && WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    pthread_mutex_unlock(&job->lock);
    if (!known)
        job_warn(job, "rank %d (pid %d) was collected by another part of this program "
             "(waitpid(-1)?); how it ended is unknown", r, (int) rk->pid);

    if (job->persistent) {
        /* Its ranks only exit when we end them: any other exit is a failure. */
        if (rk->failed || !rk->signalled) {
            job_set_state(job, r, DK_RANK_FAILED);
            job_note_failure(job, r);
        } else {
            job_set_state(job, r, DK_RANK_STOPPED);
        }
    } else if (rk->failed) {
        job_set_state(job, r, DK_RANK_FAILED);
    } else if ((clean || !known) && rk->got_result) {
        job_set_state(job, r, DK_RANK_DONE);
    } else if (rk->signalled) {
        job_set_state(job, r, DK_RANK_STOPPED);
    } else {
        job_set_state(job, r, DK_RANK_FAILED);
        job_note_failure(job, r);
    }
}

/* Whether PID, a child not yet collected, is a zombie thread-group leader:
 * SIGKILLed with other threads still tearing down (Python's, and under the
 * sanitizers that takes long), it is dead to anyone looking at /proc while
 * waitid and its pidfd wait for the last thread. */
static bool leader_dead(pid_t pid)
{
    char buf[512];
    bool gone;
    const char *state = proc_stat_fields(pid, buf, sizeof buf, &gone);
    return gone || (state && (*state == 'Z' || *state == 'X' || *state == 'x'));
}

bool dk_job_any_rank_exited(dk_job_t *job)
{
    for (int r = 0; r < job->world_size; r++) {
        pid_t pid = job->ranks[r].pid;     /* set before the runtime thread starts */
        if (pid <= 0)
            continue;
        siginfo_t si;
        memset(&si, 0, sizeof si);
        int rc;
        do
            rc = waitid(P_PID, (id_t) pid, &si, WEXITED | WNOHANG | WNOWAIT);
        while (rc < 0 && errno == EINTR);
        /* exited and not yet collected, or collected already (ECHILD) */
        if ((rc == 0 && si.si_pid == pid) || (rc < 0 && errno == ECHILD))
            return true;
        /* Not collectable yet, so the pid is still ours: /proc is about it. */
        if (rc == 0 && leader_dead(pid))
            return true;
    }
    return false;
}
