/*
 * dk_job: one distributed job, from fork to the last reaped rank.
 *
 * dk_job_start does everything that can fail before any rank exists
 * (log files, the back channel, the port, the environments) and then forks the
 * ranks from the calling thread (PR_SET_PDEATHSIG follows that thread). From
 * then on a single runtime thread owns the job and runs one poll loop, in the
 * manner of Redis's ae: every descriptor is non-blocking, every event is
 * handled to completion, and time-based work (the job's timeout, the kill
 * escalation, the drain window) is a deadline that bounds the poll timeout.
 * Because one thread owns all state, the only locking is for what other threads
 * read: the end, the root cause, per-rank facts, and the cancel request, which
 * reaches the loop as a byte on a wake pipe.
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
 * wait for the exit, bounded by the heartbeat deadline (bc_closed): the
 * process we see may be an srun that never exits after its node is lost.
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
 *
 * Ending. The job ends when every rank is reaped and its pipes reached EOF.
 * What a rank leaves running in its process group is SIGKILLed when the rank
 * exits (see reap), so no process of a cell outlives it. A process that left
 * the group (setsid, a daemon) can still hold the pipes; its output is relayed,
 * but only for DRAIN_S after the last rank is reaped, so it never keeps a cell
 * running.
 *
 * Output goes to the sink and to rank-N.log as it is read, stdout and stderr
 * into the same file in arrival order. A launched rank's pipes are its
 * launcher's (srun's): its own output comes over the back channel, and what
 * the pipes carry is read through a filter per pipe (dk_launchout) that
 * sends the launcher's own lines to the log only, since a local run shows
 * none of them, and keeps the last one that says more than the exit status
 * for the outcome; a local rank's bytes go on as read, unbuffered. A log that cannot be written (full
 * disk) is reported once and abandoned; the relay goes on. The log directory
 * is opened and checked with dk_logdir (nobody else can write it), held with
 * flock while the job runs so no pruning removes it, and every log is created
 * relative to its descriptor with O_EXCL | O_NOFOLLOW. A log that passes its
 * cap keeps its head and tail (dk_logfile_t); the sink is warned once per rank.
 */
#include "dk_job.h"
#include "dk_err.h"
#include "dk_clock.h"

#include "dk_backchan.h"
#include "dk_fdlimit.h"
#include "dk_launchout.h"
#include "dk_logdir.h"
#include "dk_logfile.h"
#include "dk_spawn.h"
#include "dk_stackreq.h"
#include "dk_stop.h"
#include "dk_utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <openssl/rand.h>

extern char **environ;

#define DEFAULT_GRACE_S 2.0
#define DRAIN_S 1.0                         /* pipes held open by a grandchild */
#define WORLD_MAX 65536
#define PIPE_BUDGET ((size_t) 1 << 20)      /* bytes per pipe per poll turn */
#define REAP_DRAIN_BUDGET ((size_t) 16 << 20)
#define NO_PIDFD_TICK_MS 50                 /* kernels before 5.3: poll waitpid */
#define ENV_VARS 22
/* The raw bytes of a launcher line kept for the outcome: enough for srun's
 * and slurmstepd's messages; sanitized, at most 3 times as much. */
#define LAUNCHER_LINE_KEEP 320
/* On this node, how long a rank's error that says a peer went away (gloo's
 * "Connection closed by peer") waits for that peer's exit: a rank killed by a
 * signal closes its sockets at once, but the process we reap for it, the warm
 * launcher, learns of the death from the template a moment later. */
#define LOCAL_ECHO_GRACE_S 2.0

typedef struct {
    pid_t pid;
    int pidfd;
    int pipe_fd[2];         /* read ends of stdout, stderr; -1 at EOF */
    dk_logfile_t *log;      /* NULL once a write failed */
    bool log_failed;        /* a write to the log failed: it is incomplete */
    bool log_capped;        /* the log passed its cap (the sink was told); guarded */
    char *log_path;
    bool reaped;
    bool signalled;         /* the runtime has sent its group a stop signal */
    bool got_result;
    bool reported;          /* sent RESULT or ERROR */
    bool failed;            /* failed on its own, before any stop signal */
    bool was_exiting;       /* resolve_failure's note: exiting, unanswered */
    bool echo;              /* its ERROR says a peer's connection went away */
    bool interrupted;       /* persistent: sent SIGINT this round */
    char *host;             /* its node, for what is said when it is lost */
    bool launched;          /* through a launcher (srun): SIGINT goes over the channel */
    dk_launchout_t *filter[2];  /* launched: the launcher's lines out of its pipes */
    char *launcher_line;    /* launched: its last telling launcher line, or NULL; guarded */
    bool lost;              /* silent past the heartbeat deadline; guarded */
    bool closed_unanswered; /* its connection was ended by its side before it answered */
    double closed_until;    /* > 0: its exit is awaited until then (bc_closed) */
    bool deferred;          /* collected, its verdict waiting (see reap) */
    double deferred_until;
    int deferred_status;
    bool deferred_known;
    /* guarded by job->lock */
    dk_rank_state_t state;
    int exit_code;
    int term_signal;
} rank_t;

struct dk_job_t {
    dk_sink_t sink;
    int world_size;
    double timeout_s;
    rank_t *ranks;
    dk_backchan_t *chan;
    char *log_dir;
    int log_dirfd;          /* held (dk_logdir_hold) while the job exists */
    unsigned long long log_cap;
    int master_port;
    char *master_addr;      /* NULL: 127.0.0.1 */
    int ranks_per_node;     /* >= 1 */
    int wake[2];
    pthread_t thread;

    pthread_mutex_t lock;
    pthread_cond_t cond;
    /* The sentinel that ends the ranks' process groups (their
     * children too) if the host dies (dk_spawn_sentinel); -1 when none. Set at
     * start, ended by the runtime thread once every rank is reaped. */
    int sentinel_pid, sentinel_fd;
    bool cancel_requested;  /* guarded */
    bool ended;             /* guarded */
    dk_job_end_t end;       /* guarded */
    int root_cause;         /* guarded */
    int failure_pending;    /* runtime thread: the turn's first failure, or -1 */
    double failure_at;      /* ... when it was noted */

    /* persistent jobs (see dk_job.h); guarded by lock unless said */
    bool persistent;
    double idle_timeout_s;
    char *warm_socket;          /* spec.warm_socket (copied), or NULL */
    double heartbeat_s;         /* > 0: ranks over TCP, with heartbeats */
    pthread_mutex_t log_lock;   /* the ranks' log objects: swapped between rounds */
    bool round_active;
    dk_job_end_t round_end;
    int round_root;
    double idle_since;
    bool submit_pending;
    void *submit_payload;
    size_t submit_len;
    double submit_timeout_s;
    bool interrupt_requested;
    bool sample_requested;      /* dk_job_sample_stacks */
    /* runtime thread only */
    uint32_t round;
    int round_pending;          /* ranks that have not answered this round */
    double round_started_at;
    double round_timeout_s;
    dk_job_end_t round_reason;  /* CANCELLED or TIMEOUT once interrupted */
    double round_deadline;      /* the grace after our SIGINT ends; -1: none */
    double round_resend_at;     /* the next SIGINT to ranks still not answering */

    /* runtime thread only */
    struct pollfd *fds;
    int *slot_rank;         /* for each pollfd after the back channel's: rank and */
    int *slot_kind;         /* which descriptor (0 stdout, 1 stderr, 2 pidfd) */
    size_t max_fds;
    double started_at;
    double connect_timeout_s;   /* spec's (launched ranks over TCP); see judge_unconnected */
    dk_job_end_t stop_reason;
    dk_stop_t stop;         /* SIGINT, SIGTERM, SIGKILL: a grace apart (seconds) */
    int unreaped;
    double last_reap_at;
    bool drain_cut;         /* cancel during the drain window: stop waiting */
    /* spec.stacks: the live ranks' stacks are asked for before they are
     * signalled, once per job (per round of a persistent one); the stop or
     * the round's interrupt waits for the answers (stacks_over). NULL: never.
     * Read by others once the job or the round has ended. */
    dk_stackreq_t *stacks;
    double stacks_wait_s;
    bool stacks_asked;
    bool sampling;              /* the running request is a live sample (sample_stacks) */
    bool stop_deferred;
    bool interrupt_deferred;
};

static void warn(dk_job_t *job, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void warn(dk_job_t *job, const char *fmt, ...)
{
    if (!job->sink.on_warning)
        return;
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    job->sink.on_warning(job->sink.data, text);
}

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* ------------------------------------------------------------------------ */
/* Rank states and the stop                                                  */

static void set_state(dk_job_t *job, int r, dk_rank_state_t state)
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
        /* srun takes a SIGINT as "print the tasks' state", and passes nothing
         * on: the rank is asked over its connection. SIGTERM to srun ends
         * the step (the tasks get SIGTERM, then SIGKILL), as the ladder means. */
        if (sig == SIGINT && rk->launched && dk_backchan_interrupt(job->chan, r))
            continue;
        killpg(rk->pid, sig);
    }
}

/* Ask every live rank of this node for its stacks (dk_stackreq.h), once
 * per job or round. True while the request runs: what the caller was about
 * to signal waits for it (stacks_over), so the ranks are seen where they
 * were, not where a KeyboardInterrupt took them. A rank that has answered
 * is past its code; one started through a launcher, on another node, is
 * asked over its connection; a lost one is not asked. */
static int begin_stacks(dk_job_t *job)
{
    pid_t *groups = calloc((size_t) job->world_size, sizeof *groups);
    if (!groups)
        return 0;
    for (int r = 0; r < job->world_size; r++) {
        const rank_t *rk = &job->ranks[r];
        if (rk->reaped || rk->reported || rk->lost)
            groups[r] = 0;
        else if (!rk->launched)
            groups[r] = rk->pid;
        else        /* on another node: over its connection, if it has one */
            groups[r] = dk_backchan_ask_stacks(job->chan, r) ? DK_STACKREQ_BY_CHANNEL : 0;
    }
    int asked = dk_stackreq_begin(job->stacks, groups, dk_now_s(), job->stacks_wait_s);
    free(groups);
    return asked;
}

static bool ask_stacks(dk_job_t *job)
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
    return begin_stacks(job) > 0;
}

/* A live sample's answers to the host (dk_job_sample_stacks), then
 * forgotten: they are not the stacks of an end. */
static void sample_over(dk_job_t *job)
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
static void sample_stacks(dk_job_t *job)
{
    if (!job->stacks || job->stop_reason != DK_END_NONE || job->stacks_asked ||
        dk_stackreq_running(job->stacks) ||
        (job->persistent && (job->round_pending == 0 || job->round_reason != DK_END_NONE)))
        return;
    job->sampling = true;
    if (begin_stacks(job) == 0)
        sample_over(job);
}

static void stop_now(dk_job_t *job);
static void signal_unanswered(dk_job_t *job);

/* The stacks are in (or their wait is over): what waited for them goes on. */
static void stacks_over(dk_job_t *job)
{
    if (job->interrupt_deferred) {
        job->interrupt_deferred = false;
        if (job->round_pending > 0) {
            signal_unanswered(job);
            if (job->round_deadline < 0)
                job->round_deadline = dk_now_s() + job->stop.grace;
        }
    }
    if (job->stop_deferred) {
        job->stop_deferred = false;
        stop_now(job);
    }
}

static void begin_stop(dk_job_t *job, dk_job_end_t reason)
{
    if (job->stop_reason != DK_END_NONE)
        return;
    job->stop_reason = reason;
    /* An idle timeout ends ranks that are in no cell: nowhere to be seen. */
    if (reason != DK_END_IDLE && ask_stacks(job)) {
        job->stop_deferred = true;
        return;
    }
    stop_now(job);
}

static void stop_now(dk_job_t *job)
{
    /* An idle rank of a persistent job ignores SIGINT and waits on the channel:
     * EOF is its cue to exit. */
    if (job->persistent) {
        dk_backchan_close_all(job->chan);
        for (int r = 0; r < job->world_size; r++)
            job->ranks[r].signalled = !job->ranks[r].reaped;   /* their exit is our doing */
    }
    signal_ranks(job, dk_stop_begin(&job->stop, dk_now_s()));
}

/* ------------------------------------------------------------------------ */
/* Rounds of a persistent job                                                */

/* Every rank has answered (or said HELLO, in round 0): the round is over. */
static void round_complete(dk_job_t *job)
{
    /* The round's stacks are final before the host can read them; a live
     * sample's are not the round's. */
    if (job->stacks)
        dk_stackreq_end(job->stacks);
    if (job->sampling)
        sample_over(job);
    pthread_mutex_lock(&job->lock);
    job->round_active = false;
    /* A rank's error is the root cause even when an interrupt or the timeout
     * came while the others unwound from it. */
    job->round_end = job->round_root >= 0             ? DK_END_FAILED
                     : job->round_reason != DK_END_NONE ? job->round_reason
                                                       : DK_END_OK;
    job->idle_since = dk_now_s();
    pthread_cond_broadcast(&job->cond);
    pthread_mutex_unlock(&job->lock);
    job->round_deadline = -1;
}

static void round_answered(dk_job_t *job)
{
    if (--job->round_pending == 0)
        round_complete(job);
}

/* SIGINT to every rank that has not answered. A rank ignores SIGINT between
 * cells (its answer may be on its way), so one that has not yet read its
 * TASK would lose a single signal: it is sent again every
 * ROUND_RESEND_S until the rank answers or the grace ends. The rank takes
 * only the first as a KeyboardInterrupt (python/distkernel/_rank.py). */
#define ROUND_RESEND_S 0.1

static void signal_unanswered(dk_job_t *job)
{
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (rk->reaped || rk->reported)
            continue;
        if (!rk->launched || !dk_backchan_interrupt(job->chan, r))
            killpg(rk->pid, SIGINT);
        rk->interrupted = true;
    }
    job->round_resend_at = dk_now_s() + ROUND_RESEND_S;
}

/* The round is interrupted: SIGINT to the ranks that have not answered; the
 * grace starts. */
static void interrupt_round(dk_job_t *job)
{
    if (ask_stacks(job)) {
        job->interrupt_deferred = true;
        return;
    }
    signal_unanswered(job);
    if (job->round_deadline < 0)
        job->round_deadline = dk_now_s() + job->stop.grace;
}

/* A rank has not answered within the grace after our SIGINT: stuck (most
 * likely in a collective whose peer has left it). Every rank ends. */
static void round_stuck(dk_job_t *job)
{
    char who[256];
    size_t n = 0;
    who[0] = '\0';
    for (int r = 0; r < job->world_size && n < sizeof who - 16; r++) {
        if (!job->ranks[r].reported && !job->ranks[r].reaped)
            n += (size_t) snprintf(who + n, sizeof who - n, "%s%d", n ? ", " : "", r);
    }
    pthread_mutex_lock(&job->lock);
    int root = job->round_root;
    if (root >= 0)
        job->root_cause = root;
    pthread_mutex_unlock(&job->lock);
    warn(job, "rank %s did not return to the prompt within %.0f s of being interrupted "
         "(stuck in a collective?); every rank is being ended", who,
         job->stop.grace);
    begin_stop(job, root >= 0 ? DK_END_FAILED : job->round_reason);
}

static void start_round(dk_job_t *job)
{
    pthread_mutex_lock(&job->lock);
    void *payload = job->submit_payload;
    size_t len = job->submit_len;
    job->submit_payload = NULL;
    job->submit_pending = false;
    job->round_timeout_s = job->submit_timeout_s;
    pthread_mutex_unlock(&job->lock);
    job->round++;
    job->round_pending = 0;
    job->round_reason = DK_END_NONE;
    job->round_deadline = -1;
    job->round_started_at = dk_now_s();
    job->stacks_asked = false;
    if (job->stacks)
        dk_stackreq_clear(job->stacks);
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        rk->reported = rk->got_result = rk->interrupted = false;
        if (!rk->reaped)
            job->round_pending++;
    }
    char err[256];
    if (dk_backchan_send_task(job->chan, job->round, payload, len, err, sizeof err) < 0) {
        warn(job, "cannot hand the cell to the ranks: %s", err);
        begin_stop(job, DK_END_FAILED);
    }
    free(payload);
    if (job->round_pending == 0)
        round_complete(job);
}

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
static bool closing(const rank_t *rk)
{
    return rk->closed_until > 0 && !rk->reaped && !rk->signalled && !rk->lost;
}

/* Rank R failed on its own. The first such failure is the root cause, judged
 * at the end of the poll turn (resolve_failure): other frames and exits of
 * the same turn are in by then. */
static void note_failure(dk_job_t *job, int r)
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

/* What a rank raises when a peer's connection went away under it: gloo's
 * "Connection closed by peer [ADDR]:PORT", a reset, a write to a closed
 * socket. On other nodes that is most often the echo of a lost node, which
 * the kernel learns of a little later (a close, a silence, srun's word). */
static const char *const echo_marks[] = {"Connection closed by peer",
                                         "Connection reset by peer", "Broken pipe"};

static bool says_peer_went_away(const void *bytes, size_t len)
{
    for (size_t i = 0; i < sizeof echo_marks / sizeof echo_marks[0]; i++)
        if (memmem(bytes, len, echo_marks[i], strlen(echo_marks[i])))
            return true;
    return false;
}

/* Until when a pending failure that is most likely an echo (see below)
 * waits for the peer it echoes. */
static double echo_deadline(const dk_job_t *job)
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
 *     (reaped, no ERROR of its own), waited for until echo_deadline. On this
 *     node a killed rank is not always reaped by the time its peers' errors
 *     arrive: a warm rank's process is its launcher, which hears of the death
 *     from the template.
 * Then the stop begins. */
static void resolve_failure(dk_job_t *job)
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
        if (q != r && closing(&job->ranks[q]))
            return;         /* still pending: judged again each turn */
        peer_gone = peer_gone || (q != r && (job->ranks[q].lost || job->ranks[q].failed));
    }
    /* Rank R says a peer's connection went away, and no peer is known to
     * have gone yet: wait for the kernel to learn whose, within the
     * heartbeat deadline (a killed node's connections close; a cut one's go
     * silent), or on this node until the dead peer is reaped, rather than
     * blame R. */
    if (job->ranks[r].echo && !peer_gone && dk_now_s() < echo_deadline(job))
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
    begin_stop(job, DK_END_FAILED);
}

static void escalate(dk_job_t *job)
{
    double t = dk_now_s();
    if (job->stop_reason == DK_END_NONE && job->timeout_s > 0 &&
        t >= job->started_at + job->timeout_s)
        begin_stop(job, DK_END_TIMEOUT);
    if (job->persistent && job->stop_reason == DK_END_NONE) {
        pthread_mutex_lock(&job->lock);
        bool active = job->round_active && !job->submit_pending;
        bool idle = !job->round_active;   /* a submit on its way is not idleness */
        double idle_since = job->idle_since;
        pthread_mutex_unlock(&job->lock);
        if (active && job->round_deadline >= 0 && t < job->round_deadline &&
            t >= job->round_resend_at)
            signal_unanswered(job);
        if (active && job->round > 0 && job->round_reason == DK_END_NONE &&
            job->round_timeout_s > 0 && t >= job->round_started_at + job->round_timeout_s) {
            job->round_reason = DK_END_TIMEOUT;
            interrupt_round(job);
        }
        if (active && job->round_deadline >= 0 && t >= job->round_deadline)
            round_stuck(job);
        if (idle && job->idle_timeout_s > 0 && t >= idle_since + job->idle_timeout_s) {
            warn(job, "the started ranks were idle for %g s (idle_timeout=, "
                 "DISTKERNEL_IDLE_TIMEOUT) and are being ended", job->idle_timeout_s);
            begin_stop(job, DK_END_IDLE);
        }
    }
    for (int sig; (sig = dk_stop_due(&job->stop, t)) != 0;)
        signal_ranks(job, sig);
}

/* ------------------------------------------------------------------------ */
/* Back-channel events                                                       */

static void bc_delivered(void *data, int r)
{
    dk_job_t *job = data;
    if (job->persistent ? !job->ranks[r].reported && job->stop_reason == DK_END_NONE
                        : job->ranks[r].state == DK_RANK_STARTING)
        if (!job->ranks[r].reaped)
            set_state(job, r, DK_RANK_RUNNING);
}

static void bc_hello(void *data, int r)
{
    dk_job_t *job = data;
    if (job->ranks[r].reaped || job->ranks[r].reported)
        return;
    job->ranks[r].reported = true;
    set_state(job, r, DK_RANK_DONE);
    round_answered(job);
}

static void drain_pipe(dk_job_t *job, int r, int which, size_t budget);
static void judge(dk_job_t *job, int r, int status, bool known);
static void deliver(dk_job_t *job, int r, int fd, const char *buf, size_t n);
static void log_bytes(dk_job_t *job, int r, const char *buf, size_t n);

/* A remote rank's output: the same path as a pipe's; its notes about itself
 * (DK_BC_OUTPUT_LOG) to its log only, as a launcher's own lines go. */
/* A rank on another node answered for its stacks (dk_backchan_ask_stacks). */
static void bc_stacks(void *data, int r, const void *bytes, size_t len)
{
    dk_job_t *job = data;
    if (job->stacks)
        dk_stackreq_answer(job->stacks, r, bytes, len);
}

static void bc_output(void *data, int r, int fd, const void *bytes, size_t len, bool caught_up)
{
    dk_job_t *job = data;
    if (fd == DK_BC_OUTPUT_LOG) {
        pthread_mutex_lock(&job->log_lock);
        log_bytes(job, r, bytes, len);
        pthread_mutex_unlock(&job->log_lock);
        return;
    }
    if (len > 0)
        deliver(job, r, fd, bytes, len);
    if (caught_up && job->sink.on_caught_up)
        job->sink.on_caught_up(job->sink.data, r, fd);
}

static void mark_lost(dk_job_t *job, int r)
{
    rank_t *rk = &job->ranks[r];
    pthread_mutex_lock(&job->lock);
    rk->lost = true;
    pthread_mutex_unlock(&job->lock);
    if (job->sink.on_lost)
        job->sink.on_lost(job->sink.data, r, rk->host);
}

/* Rank R is lost (WHY says how that was found), and that is a failure. The
 * ranks of its node with no connection left to tell of them are lost with
 * it: those that have not connected yet (still starting when the node went
 * quiet), whose launchers only wait on a node they cannot reach, and those
 * whose connection closed unanswered while their launcher still runs (the
 * node's processes were killed). */
static void lose(dk_job_t *job, int r, const char *why)
{
    rank_t *rk = &job->ranks[r];
    mark_lost(job, r);
    warn(job, "rank %d on %s lost: %s", r, rk->host, why);
    note_failure(job, r);
    for (int q = 0; rk->host && q < job->world_size; q++) {
        rank_t *mate = &job->ranks[q];
        if (q == r || mate->lost || (mate->reaped && !mate->deferred) || !mate->host ||
            strcmp(mate->host, rk->host))
            continue;
        bool never = !dk_backchan_rank_connected_once(job->chan, q);
        if (!never && !closing(mate))
            continue;
        mark_lost(job, q);
        warn(job, "rank %d on %s lost with it: %s", q, mate->host,
             never ? "it had not connected yet"
                   : "its connection had closed and its launcher was still running");
    }
}

/* Rank R's connection went silent: it is lost. */
static void bc_lost(void *data, int r, double silent_s)
{
    dk_job_t *job = data;
    rank_t *rk = &job->ranks[r];
    if (rk->reaped && !rk->deferred)
        return;
    char why[96];
    snprintf(why, sizeof why, "nothing heard from it for %.1f s", silent_s);
    lose(job, r, why);
}

/* Rank R's connection was ended by its side before it answered. Its process
 * usually exits at once (a crash, a rank that gave up), and that exit is
 * judged as any other. But the processes of a lost node can be killed rather
 * than fall silent (FIN or RST), and srun, the process we see, may then never
 * exit: Slurm 22.05.8 run from a host that is not a node of the cluster
 * (Slurm bug 16401). So its exit is awaited for the heartbeat deadline, as
 * silence would be, and a process still running then has lost its rank
 * (judge_closed). Meanwhile a peer's failure waits (resolve_failure): that is
 * most likely its echo, gloo's "Connection closed by peer". */
static void bc_closed(void *data, int r)
{
    dk_job_t *job = data;
    rank_t *rk = &job->ranks[r];
    if (job->heartbeat_s <= 0 || rk->reaped || rk->signalled || rk->lost || rk->reported)
        return;
    rk->closed_unanswered = true;
    rk->closed_until = dk_now_s() + job->heartbeat_s;
}

/* The ranks whose connection closed unanswered and whose process has not
 * exited by the deadline (bc_closed): lost. */
static void judge_closed(dk_job_t *job)
{
    double now = dk_now_s();
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (!closing(rk) || now < rk->closed_until)
            continue;
        rk->closed_until = 0;
        char why[160];
        snprintf(why, sizeof why, "its connection closed without an answer, and its %s "
                 "(pid %d) was still running %.1f s later", rk->launched ? "launcher" : "process",
                 (int) rk->pid, job->heartbeat_s);
        lose(job, r, why);
    }
}

/* Launched ranks that have not connected by the connect deadline while their
 * launcher still runs: lost. A node that goes down while its ranks start
 * (Python starting, the rank connecting) leaves no connection whose silence
 * would tell; srun may wait on it far longer than any cell should. Their
 * node-mates that never connected go with them (lose).
 *
 * The ranks keep trying for the same deadline from their own start, which is
 * later than the job's, then exit saying why ("could not connect to the
 * kernel's back channel ... within N s"): that exit is the better root cause,
 * so it is given one heartbeat deadline more to reach us before the node is
 * taken for lost. */
static void judge_unconnected(dk_job_t *job)
{
    if (job->heartbeat_s <= 0 || job->stop_reason != DK_END_NONE)
        return;
    double now = dk_now_s();
    if (now < job->started_at + job->connect_timeout_s + job->heartbeat_s)
        return;
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (!rk->launched || rk->reaped || rk->lost || rk->signalled || rk->reported ||
            dk_backchan_rank_connected_once(job->chan, r))
            continue;
        char why[200];
        snprintf(why, sizeof why, "it had not connected %.0f s after its launch, and its "
                 "launcher (pid %d) still runs: its node may be down or its start stuck",
                 job->connect_timeout_s, (int) rk->pid);
        lose(job, r, why);
        return;     /* the stop that follows ends the others */
    }
}

/* A persistent job's rank answered the round. */
static void round_message(dk_job_t *job, int r, bool is_error, const void *bytes, size_t len)
{
    rank_t *rk = &job->ranks[r];
    rk->reported = true;
    rk->got_result = !is_error;
    /* It flushed its output before answering: let that output come first. */
    drain_pipe(job, r, 0, REAP_DRAIN_BUDGET);
    drain_pipe(job, r, 1, REAP_DRAIN_BUDGET);
    if (job->sink.on_message)
        job->sink.on_message(job->sink.data, r, is_error, bytes, len);
    dk_rank_state_t state = DK_RANK_DONE;
    if (is_error && rk->interrupted) {
        state = DK_RANK_STOPPED;
    } else if (is_error) {
        state = DK_RANK_FAILED;
        pthread_mutex_lock(&job->lock);
        bool first = job->round_root < 0;
        if (first)
            job->round_root = r;
        pthread_mutex_unlock(&job->lock);
        if (first)
            interrupt_round(job);   /* the others may wait for it in a collective */
    }
    set_state(job, r, state);
    round_answered(job);
}

static void bc_message(void *data, int r, bool is_error, const void *bytes, size_t len)
{
    dk_job_t *job = data;
    if (job->persistent) {
        round_message(job, r, is_error, bytes, len);
        return;
    }
    job->ranks[r].reported = true;
    if (!is_error)
        job->ranks[r].got_result = true;
    if (is_error)
        job->ranks[r].echo = says_peer_went_away(bytes, len);
    if (job->sink.on_message)
        job->sink.on_message(job->sink.data, r, is_error, bytes, len);
    if (is_error)
        note_failure(job, r);
}

static void bc_warning(void *data, const char *text)
{
    dk_job_t *job = data;
    if (job->sink.on_warning)
        job->sink.on_warning(job->sink.data, text);
}

/* ------------------------------------------------------------------------ */
/* Output                                                                    */

static void log_bytes(dk_job_t *job, int r, const char *buf, size_t n)
{
    rank_t *rk = &job->ranks[r];
    if (!rk->log)
        return;
    if (dk_logfile_write(rk->log, buf, n) != 0) {
        warn(job, "cannot write rank %d's log file %s (%s); its output is still shown "
             "but no longer saved there", r, rk->log_path, strerror(errno));
        dk_logfile_close(&rk->log);
        pthread_mutex_lock(&job->lock);
        rk->log_failed = true;
        pthread_mutex_unlock(&job->lock);
        return;
    }
    if (!rk->log_capped && dk_logfile_capped(rk->log)) {
        pthread_mutex_lock(&job->lock);
        rk->log_capped = true;
        pthread_mutex_unlock(&job->lock);
        unsigned long long cap = dk_logfile_cap(rk->log);
        warn(job, "rank %d's output passed its log cap of %llu bytes (log_cap=, "
             "DISTKERNEL_LOG_CAP): %s keeps its first %llu bytes and its last, with a line "
             "saying how much was left out between them", r, cap, rk->log_path, cap / 2);
    }
}

/* Assemble each capped log (its head, a marker, its tail) and close it. */
static void close_logs(dk_job_t *job)
{
    pthread_mutex_lock(&job->log_lock);
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (rk->log && dk_logfile_close(&rk->log) != 0) {
            warn(job, "cannot finish rank %d's log file %s (%s); it may be cut short", r,
                 rk->log_path, strerror(errno));
            pthread_mutex_lock(&job->lock);
            rk->log_failed = true;
            pthread_mutex_unlock(&job->lock);
        }
    }
    pthread_mutex_unlock(&job->log_lock);
}

/* Rank R's output on FD (1 or 2), from its pipe or its OUTPUT frames: to the
 * log and the sink. */
static void deliver(dk_job_t *job, int r, int fd, const char *buf, size_t n)
{
    pthread_mutex_lock(&job->log_lock);
    log_bytes(job, r, buf, n);
    pthread_mutex_unlock(&job->log_lock);
    if (job->sink.on_output)
        job->sink.on_output(job->sink.data, r, fd, buf, n);
}

/* Keep LINE, a launcher line that says more than the exit status, as rank
 * R's reason (dk_job_rank_launcher_line): its first LAUNCHER_LINE_KEEP bytes,
 * as valid UTF-8, without its newline. */
static void keep_launcher_line(dk_job_t *job, int r, const char *line, size_t len)
{
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        len--;
    if (len > LAUNCHER_LINE_KEEP)
        len = dk_utf8_complete_prefix(line, LAUNCHER_LINE_KEEP);
    size_t out_len = 0;
    char *text = dk_utf8_sanitize(line, len, &out_len);
    if (!text)
        return;
    pthread_mutex_lock(&job->lock);
    free(job->ranks[r].launcher_line);
    job->ranks[r].launcher_line = text;
    pthread_mutex_unlock(&job->lock);
}

typedef struct {
    dk_job_t *job;
    int rank, fd;
} filtered_t;

/* What a launched rank's pipe filter passes on: the rank's own bytes as any
 * output; the launcher's lines to the log only (see dk_launchout.h). */
static void filtered(void *data, dk_launchout_kind_t kind, const char *bytes, size_t len)
{
    filtered_t *f = data;
    if (kind == DK_LAUNCHOUT_RANK) {
        deliver(f->job, f->rank, f->fd, bytes, len);
        return;
    }
    pthread_mutex_lock(&f->job->log_lock);
    log_bytes(f->job, f->rank, bytes, len);
    pthread_mutex_unlock(&f->job->log_lock);
    if (dk_launchout_tells(bytes, len))
        keep_launcher_line(f->job, f->rank, bytes, len);
}

/* Read pipe WHICH of rank R until EAGAIN, EOF or BUDGET bytes. A launched
 * rank's pipes are its launcher's (srun's): they go through its filter,
 * which holds a launcher line to its end; a local rank's bytes go on as read. */
static void drain_pipe(dk_job_t *job, int r, int which, size_t budget)
{
    rank_t *rk = &job->ranks[r];
    char buf[65536];
    filtered_t f = {job, r, which + 1};
    while (rk->pipe_fd[which] >= 0 && budget > 0) {
        ssize_t n = read(rk->pipe_fd[which], buf, sizeof buf);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (job->sink.on_caught_up)
                job->sink.on_caught_up(job->sink.data, r, which + 1);
            return;
        }
        if (n <= 0) {
            if (rk->filter[which])
                dk_launchout_finish(rk->filter[which], filtered, &f);
            close_fd(&rk->pipe_fd[which]);
            return;
        }
        if (rk->filter[which])
            dk_launchout_feed(rk->filter[which], buf, (size_t) n, filtered, &f);
        else
            deliver(job, r, which + 1, buf, (size_t) n);
        budget -= (size_t) n < budget ? (size_t) n : budget;
    }
}

/* ------------------------------------------------------------------------ */
/* Exits                                                                     */

/* Collect rank R if it has exited, and judge it (see the top of the file). */
static void reap(dk_job_t *job, int r)
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
    bool known = got == rk->pid;

    drain_pipe(job, r, 0, REAP_DRAIN_BUDGET);
    drain_pipe(job, r, 1, REAP_DRAIN_BUDGET);
    dk_backchan_drain(job->chan);

    rk->reaped = true;
    close_fd(&rk->pidfd);
    if (job->stacks)
        dk_stackreq_gone(job->stacks, r);
    /* A launcher (srun) that exits on its own while its rank's connection is
     * still open and unanswered may be telling of a lost node before the
     * heartbeats can: its verdict waits until the connection closes, goes
     * silent past the deadline (then the rank is lost), or the deadline
     * passes. */
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

/* Rank R's deferred verdict is due (see reap). */
static void judge_deferred(dk_job_t *job)
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
/* Whether rank R's launcher said, in its last telling line, that the rank's
 * node failed: srun's "srun: error: Node failure on node2", or a step
 * "CANCELLED ... DUE TO NODE FAILURE". WHY gets the line. */
static bool launcher_says_node_failed(dk_job_t *job, int r, char *why, size_t len)
{
    pthread_mutex_lock(&job->lock);
    const char *line = job->ranks[r].launcher_line;
    bool failed = line && (strstr(line, "Node failure") || strstr(line, "NODE FAILURE"));
    if (failed)
        snprintf(why, len, "its launcher said \"%s\"", line);
    pthread_mutex_unlock(&job->lock);
    return failed;
}

static void judge(dk_job_t *job, int r, int status, bool known)
{
    rank_t *rk = &job->ranks[r];
    job->unreaped--;
    job->last_reap_at = dk_now_s();
    bool clean = known && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    /* srun heard of the node's loss before the heartbeats did (Slurm says so
     * once slurmctld marks the node down): the rank is lost with its node,
     * not a rank that exited. */
    char why[LAUNCHER_LINE_KEEP + 64];
    if (rk->launched && !clean && !rk->lost && !rk->signalled && !rk->reported &&
        launcher_says_node_failed(job, r, why, sizeof why))
        lose(job, r, why);
    pthread_mutex_lock(&job->lock);
    rk->exit_code = known && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    rk->term_signal = known && WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    pthread_mutex_unlock(&job->lock);
    if (!known)
        warn(job, "rank %d (pid %d) was collected by another part of this program "
             "(waitpid(-1)?); how it ended is unknown", r, (int) rk->pid);

    if (job->persistent) {
        /* Its ranks only exit when we end them: any other exit is a failure. */
        if (rk->failed || !rk->signalled) {
            set_state(job, r, DK_RANK_FAILED);
            note_failure(job, r);
        } else {
            set_state(job, r, DK_RANK_STOPPED);
        }
    } else if (rk->failed) {
        set_state(job, r, DK_RANK_FAILED);
    } else if ((clean || !known) && rk->got_result) {
        set_state(job, r, DK_RANK_DONE);
    } else if (rk->signalled) {
        set_state(job, r, DK_RANK_STOPPED);
    } else {
        set_state(job, r, DK_RANK_FAILED);
        note_failure(job, r);
    }
}

/* ------------------------------------------------------------------------ */
/* The runtime thread                                                        */

static bool pipes_open(const dk_job_t *job)
{
    for (int r = 0; r < job->world_size; r++) {
        if (job->ranks[r].pipe_fd[0] >= 0 || job->ranks[r].pipe_fd[1] >= 0)
            return true;
    }
    return false;
}

static bool finished(const dk_job_t *job)
{
    if (job->unreaped > 0)
        return false;
    return !pipes_open(job) || job->drain_cut || dk_now_s() >= job->last_reap_at + DRAIN_S;
}

/* Keep the earliest of the deadlines offered (NEXT < 0: none yet). */
static void earliest(double *next, double t)
{
    if (*next < 0 || t < *next)
        *next = t;
}

static int poll_timeout_ms(const dk_job_t *job)
{
    double next = -1;
    if (job->stop_reason == DK_END_NONE && job->timeout_s > 0)
        earliest(&next, job->started_at + job->timeout_s);
    if (dk_stop_next_at(&job->stop) >= 0)
        earliest(&next, dk_stop_next_at(&job->stop));
    if (job->unreaped == 0)
        earliest(&next, job->last_reap_at + DRAIN_S);
    if (job->stacks && dk_stackreq_running(job->stacks))
        earliest(&next, dk_stackreq_next_at(job->stacks, dk_now_s()));
    if (dk_backchan_deadline(job->chan) >= 0)
        earliest(&next, dk_backchan_deadline(job->chan));
    if (job->failure_pending >= 0 && job->stop_reason == DK_END_NONE)
        earliest(&next, echo_deadline(job));
    if (job->persistent && job->stop_reason == DK_END_NONE) {
        pthread_mutex_lock((pthread_mutex_t *) &job->lock);
        bool active = job->round_active;
        double idle_since = job->idle_since;
        pthread_mutex_unlock((pthread_mutex_t *) &job->lock);
        if (active && job->round_deadline >= 0) {
            earliest(&next, job->round_deadline);
            earliest(&next, job->round_resend_at);
        }
        if (active && job->round > 0 && job->round_timeout_s > 0)
            earliest(&next, job->round_started_at + job->round_timeout_s);
        if (!active && job->idle_timeout_s > 0)
            earliest(&next, idle_since + job->idle_timeout_s);
    }
    int ms = -1;
    if (next >= 0) {
        double wait = (next - dk_now_s()) * 1000.0 + 1;   /* +1: never wake just before */
        ms = wait <= 0 ? 0 : wait > 60000 ? 60000 : (int) wait;
    }
    for (int r = 0; r < job->world_size; r++) {
        if (!job->ranks[r].reaped && job->ranks[r].pidfd < 0 && (ms < 0 || ms > NO_PIDFD_TICK_MS))
            ms = NO_PIDFD_TICK_MS;
        if (closing(&job->ranks[r])) {
            double wait = (job->ranks[r].closed_until - dk_now_s()) * 1000.0 + 1;
            int d = wait <= 0 ? 0 : wait > 60000 ? 60000 : (int) wait;
            if (ms < 0 || d < ms)
                ms = d;
        }
        if (job->ranks[r].deferred) {
            double wait = (job->ranks[r].deferred_until - dk_now_s()) * 1000.0 + 1;
            int d = wait <= 0 ? 0 : wait > 60000 ? 60000 : (int) wait;
            if (ms < 0 || d < ms)
                ms = d;
        }
    }
    return ms;
}

static void handle_wake(dk_job_t *job)
{
    char buf[64];
    while (read(job->wake[0], buf, sizeof buf) > 0)
        ;
    pthread_mutex_lock(&job->lock);
    bool cancel = job->cancel_requested;
    bool submit = job->submit_pending, interrupt = job->interrupt_requested;
    bool sample = job->sample_requested;
    job->interrupt_requested = job->sample_requested = false;
    pthread_mutex_unlock(&job->lock);
    if (submit && !cancel && job->stop_reason == DK_END_NONE)
        start_round(job);
    if (interrupt && job->round_reason == DK_END_NONE && job->round_pending > 0) {
        job->round_reason = DK_END_CANCELLED;
        interrupt_round(job);
    }
    if (sample && !cancel)
        sample_stacks(job);
    if (!cancel)
        return;
    if (job->unreaped > 0)
        begin_stop(job, DK_END_CANCELLED);
    else
        job->drain_cut = true;      /* every rank has ended already: only stop waiting */
}

static void loop_once(dk_job_t *job)
{
    struct pollfd *fds = job->fds;
    size_t n = 0;
    fds[n++] = (struct pollfd) {.fd = job->wake[0], .events = POLLIN};
    size_t bc_first = n;
    size_t bc_n = dk_backchan_poll_fill(job->chan, fds + n);
    n += bc_n;
    size_t own_first = n;
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        int want[3] = {rk->pipe_fd[0], rk->pipe_fd[1], rk->reaped ? -1 : rk->pidfd};
        for (int kind = 0; kind < 3; kind++) {
            if (want[kind] < 0)
                continue;
            job->slot_rank[n - own_first] = r;
            job->slot_kind[n - own_first] = kind;
            fds[n++] = (struct pollfd) {.fd = want[kind], .events = POLLIN};
        }
    }

    int rc = poll(fds, (nfds_t) n, poll_timeout_ms(job));
    if (rc < 0 && errno != EINTR)
        usleep(10000);      /* ENOMEM: retry soon rather than spin */
    if (rc > 0) {
        if (fds[0].revents)
            handle_wake(job);
        /* Back channel first: a RESULT must be in before its sender's exit. */
        dk_backchan_poll_handle(job->chan, fds + bc_first, bc_n);
        for (size_t i = own_first; i < n; i++) {
            int r = job->slot_rank[i - own_first], kind = job->slot_kind[i - own_first];
            if (!fds[i].revents)
                continue;
            if (kind < 2 && job->ranks[r].pipe_fd[kind] == fds[i].fd)
                drain_pipe(job, r, kind, PIPE_BUDGET);
            else if (kind == 2 && !job->ranks[r].reaped)
                reap(job, r);
        }
    }
    for (int r = 0; r < job->world_size; r++) {
        if (!job->ranks[r].reaped && job->ranks[r].pidfd < 0)
            reap(job, r);
    }
    judge_deferred(job);
    judge_closed(job);
    judge_unconnected(job);
    resolve_failure(job);
    if (job->stacks && dk_stackreq_poll(job->stacks, dk_now_s())) {
        if (job->sampling)
            sample_over(job);
        else if (job->stop_deferred || job->interrupt_deferred)
            stacks_over(job);
    }
    escalate(job);
}

static void *job_thread(void *arg)
{
    dk_job_t *job = arg;
    for (int r = 0; r < job->world_size; r++)
        set_state(job, r, DK_RANK_STARTING);
    while (!finished(job))
        loop_once(job);

    for (int r = 0; r < job->world_size; r++) {
        close_fd(&job->ranks[r].pipe_fd[0]);
        close_fd(&job->ranks[r].pipe_fd[1]);
    }
    close_logs(job);
    dk_backchan_close_all(job->chan);
    if (job->stacks)
        dk_stackreq_end(job->stacks);     /* every rank is gone: final before the end is told */
    if (job->sampling)
        sample_over(job);                 /* the job ended by itself: no end's stacks */
    /* Every rank is reaped and its group was ended as it was (reap): the
     * sentinel has nothing left to guard. */
    dk_spawn_sentinel_end(&job->sentinel_pid, &job->sentinel_fd);

    pthread_mutex_lock(&job->lock);
    /* With no stop, every rank was judged DONE (any other verdict starts one). */
    job->end = job->stop_reason == DK_END_NONE ? DK_END_OK : job->stop_reason;
    job->ended = true;
    if (job->round_active) {    /* the job ended during a round: so did the round */
        job->round_active = false;
        job->round_end = job->end;
        job->round_root = job->root_cause;
    }
    pthread_cond_broadcast(&job->cond);
    pthread_mutex_unlock(&job->lock);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Start                                                                     */

#define LOG_DIR_HINT "set DISTKERNEL_LOG_DIR to a directory that is yours alone"

/* The job's log directory, checked, held and kept open (logs can hold anything
 * a cell prints: it must be the user's alone). */
static bool open_log_dir(dk_job_t *job, char *err, size_t errlen)
{
    job->log_dirfd = dk_logdir_open(job->log_dir, DK_LOGDIR_CREATE, LOG_DIR_HINT, err, errlen);
    if (job->log_dirfd < 0)
        return false;
    if (dk_logdir_hold(job->log_dirfd) != 0) {
        dk_set_err(err, errlen, "the log directory %s is in use by another job (%s)", job->log_dir,
                   strerror(errno));
        return false;
    }
    return true;
}

/* No log_dir given: a fresh ROOT/kernel-PID/run-RANDOM under the default root. */
static char *fresh_log_dir(char *err, size_t errlen)
{
    char *root = dk_logdir_default_root(err, errlen);
    if (!root)
        return NULL;
    unsigned char id[8];
    char *dir = NULL;
    if (RAND_bytes(id, sizeof id) == 1 &&
        asprintf(&dir, "%s/kernel-%d/run-%02x%02x%02x%02x%02x%02x%02x%02x", root, (int) getpid(),
                 id[0], id[1], id[2], id[3], id[4], id[5], id[6], id[7]) < 0)
        dir = NULL;
    if (!dir)
        dk_set_err(err, errlen, "out of memory or no random bytes for a log directory name");
    free(root);
    return dir;
}

static bool check_spec(const dk_job_spec_t *spec, char *err, size_t errlen)
{
    if (!spec)
        dk_set_err(err, errlen, "no job description was given");
    else if (spec->world_size < 1 || spec->world_size > WORLD_MAX)
        dk_set_err(err, errlen, "world_size is %d; it must be between 1 and %d",
                   spec->world_size, WORLD_MAX);
    else if (!spec->rank_exe || !*spec->rank_exe)
        dk_set_err(err, errlen, "no rank executable was given");
    else if (!spec->persistent && spec->payload_len > 0 && !spec->payload)
        dk_set_err(err, errlen, "payload_len is %zu but payload is NULL", spec->payload_len);
    else if (spec->bc_tcp_addr && spec->heartbeat_s > 0 &&
             spec->heartbeat_s < 2 * DK_BC_PING_S)
        /* One late PING must not make a rank lost. */
        dk_set_err(err, errlen, "heartbeat_s is %g; it must be at least %g (a PING goes every "
                   "%g s) or 0 for the default of %g", spec->heartbeat_s, 2 * DK_BC_PING_S,
                   DK_BC_PING_S, DK_BC_HEARTBEAT_DEFAULT_S);
    else if (spec->ranks_per_node < 0 ||
             (spec->ranks_per_node > 0 && spec->world_size % spec->ranks_per_node != 0))
        dk_set_err(err, errlen, "ranks_per_node is %d; it must divide world_size (%d)",
                   spec->ranks_per_node, spec->world_size);
    else if (spec->master_addr && (!*spec->master_addr || strlen(spec->master_addr) > 100))
        dk_set_err(err, errlen, "master_addr must be a host name or address of 1 to 100 "
                   "characters");
    else if ((spec->master_port < 0 && spec->master_port != DK_JOB_PORT_FROM_RANK0) ||
             spec->master_port > 65535 ||
             (spec->master_port == DK_JOB_PORT_FROM_RANK0 && !spec->bc_tcp_addr))
        dk_set_err(err, errlen, "master_port is %d; it must be a TCP port (1-65535), 0, or "
                   "DK_JOB_PORT_FROM_RANK0 with bc_tcp_addr", spec->master_port);
    else if (spec->payload_len > DK_BC_PAYLOAD_MAX)
        dk_set_err(err, errlen, "the payload is %zu bytes; a job can carry at most 1 GiB to its "
                   "ranks (pass large data through files instead)", spec->payload_len);
    else
        return true;
    return false;
}

static void job_free(dk_job_t *job)
{
    for (int r = 0; job->ranks && r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        close_fd(&rk->pidfd);
        close_fd(&rk->pipe_fd[0]);
        close_fd(&rk->pipe_fd[1]);
        dk_logfile_close(&rk->log);
        free(rk->log_path);
        free(rk->host);
        free(rk->launcher_line);
        dk_launchout_destroy(&rk->filter[0]);
        dk_launchout_destroy(&rk->filter[1]);
    }
    dk_spawn_sentinel_end(&job->sentinel_pid, &job->sentinel_fd);
    dk_stackreq_destroy(&job->stacks);
    free(job->master_addr);
    dk_backchan_destroy(&job->chan);
    close_fd(&job->wake[0]);
    close_fd(&job->wake[1]);
    pthread_mutex_destroy(&job->lock);
    pthread_mutex_destroy(&job->log_lock);
    pthread_cond_destroy(&job->cond);
    free(job->submit_payload);
    free(job->ranks);
    free(job->fds);
    free(job->slot_rank);
    free(job->slot_kind);
    close_fd(&job->log_dirfd);
    free(job->log_dir);
    free(job->warm_socket);
    free(job);
}

/* Start failed after some ranks were forked: end them, leave nothing behind. */
static void kill_started(dk_job_t *job)
{
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (rk->pid > 0 && !rk->reaped) {
            killpg(rk->pid, SIGKILL);
            waitpid(rk->pid, NULL, 0);
            rk->reaped = true;
        }
    }
}

static bool open_logs(dk_job_t *job, char *err, size_t errlen)
{
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        size_t len = strlen(job->log_dir) + 32;
        if (!(rk->log_path = malloc(len))) {
            dk_set_err(err, errlen, "out of memory");
            return false;
        }
        snprintf(rk->log_path, len, "%s/rank-%d.log", job->log_dir, r);
        /* A file left by an earlier job of this directory is ours (the folder is
         * ours alone): start afresh, and never through a link. */
        const char *name = rk->log_path + strlen(job->log_dir) + 1;
        unlinkat(job->log_dirfd, name, 0);
        char why[512];
        if (!(rk->log = dk_logfile_new(job->log_dirfd, name, job->log_cap, why, sizeof why))) {
            dk_set_err(err, errlen, "cannot create rank %d's log file %s: %s", r, rk->log_path, why);
            return false;
        }
    }
    return true;
}

/* Fork rank R with the torch.distributed (torchrun-compatible) environment. */
static bool start_rank(dk_job_t *job, int r, const char *program, char *const argv[],
                       const char *const *base, const char *run_id, char *err, size_t errlen)
{
    rank_t *rk = &job->ranks[r];
    int n = job->world_size;
    char vars[ENV_VARS][128];
    const char *set[ENV_VARS + 5];
    size_t k = 0;
#define SETF(...) (snprintf(vars[k], sizeof vars[k], __VA_ARGS__), set[k] = vars[k], k++)
    int per = job->ranks_per_node;
    SETF("RANK=%d", r);
    SETF("LOCAL_RANK=%d", r % per);
    SETF("WORLD_SIZE=%d", n);
    SETF("LOCAL_WORLD_SIZE=%d", per);
    SETF("GROUP_RANK=%d", r / per);
    SETF("NODE_RANK=%d", r / per);
    SETF("ROLE_RANK=%d", r);
    SETF("ROLE_NAME=default");
    SETF("GROUP_WORLD_SIZE=%d", n / per);
    SETF("ROLE_WORLD_SIZE=%d", n);
    SETF("MASTER_ADDR=%s", job->master_addr ? job->master_addr : "127.0.0.1");
    if (job->master_port > 0)
        SETF("MASTER_PORT=%d", job->master_port);
    else
        SETF("DISTKERNEL_MASTER_PORT=rank0");   /* a PORT frame brings it */
    SETF("TORCHELASTIC_RUN_ID=%s", run_id);
    SETF("TORCHELASTIC_RESTART_COUNT=0");
    SETF("TORCHELASTIC_MAX_RESTARTS=0");
    SETF("DISTKERNEL_BC_KEY=%s", dk_backchan_key_hex(job->chan));
    if (job->heartbeat_s > 0) {
        SETF("DISTKERNEL_BC_HEARTBEAT=%g", job->heartbeat_s);
        SETF("DISTKERNEL_BC_CONNECT_TIMEOUT=%g", job->connect_timeout_s);
    }
    if (!dk_spawn_env_get(base, "OMP_NUM_THREADS"))
        SETF("OMP_NUM_THREADS=1");
#undef SETF
    /* Paths can be long: these two point at strings that outlive the call. */
    char *bc = NULL, *log = NULL;
    if (asprintf(&bc, "DISTKERNEL_BC=%s", dk_backchan_address(job->chan)) < 0)
        bc = NULL;
    if (asprintf(&log, "DISTKERNEL_LOG=%s", rk->log_path) < 0)
        log = NULL;
    char *warm = NULL;
    if (job->warm_socket && asprintf(&warm, "DISTKERNEL_WARM_SOCKET=%s", job->warm_socket) < 0)
        warm = NULL;
    /* A launcher starts its rank where it chooses (srun in a folder every
     * node has): the rank goes to ours itself where its node has it. A
     * folder that no longer exists here is none to go to. */
    char *cwd = NULL, here[PATH_MAX];
    if (rk->launched && getcwd(here, sizeof here) && asprintf(&cwd, "DISTKERNEL_CWD=%s", here) < 0)
        cwd = NULL;
    /* Where it answers for its stacks (dk_stackreq.h); a rank on another
     * node has no such file. */
    char *stacks = NULL;
    bool want_stacks = job->stacks && !rk->launched;
    if (want_stacks && asprintf(&stacks, DK_STACKS_ENV "=%s", dk_stackreq_path(job->stacks, r)) < 0)
        stacks = NULL;
    char **env = NULL;
    if (bc && log && (warm || !job->warm_socket) && (stacks || !want_stacks)) {
        if (stacks)
            set[k++] = stacks;
        set[k++] = bc;
        set[k++] = log;
        if (warm)
            set[k++] = warm;
        if (cwd)
            set[k++] = cwd;
        env = dk_spawn_env_build(base, set, k);
    }
    free(bc);
    free(log);
    free(warm);
    free(cwd);
    free(stacks);
    if (!env) {
        dk_set_err(err, errlen, "out of memory building rank %d's environment", r);
        return false;
    }

    dk_spawned_t sp;
    char why[512];
    int rc = dk_spawn(program, argv, env, &sp, why, sizeof why);
    dk_spawn_env_free(env);
    if (rc != 0) {
        dk_set_err(err, errlen, "cannot start rank %d: %s", r, why);
        return false;
    }
    rk->pid = sp.pid;
    rk->pidfd = sp.pidfd;
    rk->pipe_fd[0] = sp.out_fd;
    rk->pipe_fd[1] = sp.err_fd;
    job->unreaped++;
    return true;
}

/* The sentinel for every rank's process group (each rank leads its own). */
static bool start_sentinel(dk_job_t *job, char *err, size_t errlen)
{
    int *pgids = calloc((size_t) job->world_size, sizeof *pgids);
    if (!pgids) {
        dk_set_err(err, errlen, "out of memory");
        return false;
    }
    for (int r = 0; r < job->world_size; r++)
        pgids[r] = job->ranks[r].pid;
    char why[256];
    int rc = dk_spawn_sentinel(pgids, job->world_size, &job->sentinel_pid, &job->sentinel_fd,
                               why, sizeof why);
    free(pgids);
    if (rc != 0)
        dk_set_err(err, errlen, "cannot start the process that ends the ranks' children with "
                   "the kernel: %s", why);
    return rc == 0;
}

static bool start_thread(dk_job_t *job, char *err, size_t errlen)
{
    /* The runtime thread takes no signals: the host's SIGINT belongs to its main
     * thread (Python's handler expects it there). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&job->thread, NULL, job_thread, job);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        dk_set_err(err, errlen, "cannot start the runtime thread: %s", strerror(rc));
        return false;
    }
    return true;
}

static dk_job_t *job_alloc(const dk_job_spec_t *spec, const dk_sink_t *sink)
{
    dk_job_t *job = calloc(1, sizeof *job);
    if (!job)
        return NULL;
    job->wake[0] = job->wake[1] = job->log_dirfd = -1;
    job->sentinel_pid = job->sentinel_fd = -1;
    job->log_cap = spec->log_cap;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&job->cond, &attr);
    pthread_condattr_destroy(&attr);
    pthread_mutex_init(&job->lock, NULL);
    pthread_mutex_init(&job->log_lock, NULL);
    job->persistent = spec->persistent;
    job->idle_timeout_s = spec->idle_timeout_s;
    job->round_root = -1;
    job->round_deadline = -1;
    /* Round 0 of a persistent job is its start: every rank says HELLO. */
    job->round_active = spec->persistent;
    job->round_pending = spec->world_size;
    if (sink)
        job->sink = *sink;
    job->world_size = spec->world_size;
    job->ranks_per_node = spec->ranks_per_node > 0 ? spec->ranks_per_node : spec->world_size;
    if (spec->master_addr && !(job->master_addr = strdup(spec->master_addr))) {
        job_free(job);
        return NULL;
    }
    job->timeout_s = spec->timeout_s;
    job->stop = dk_stop_ladder(spec->grace_s > 0 ? spec->grace_s : DEFAULT_GRACE_S);
    job->root_cause = -1;
    job->failure_pending = -1;
    job->ranks = calloc((size_t) spec->world_size, sizeof *job->ranks);
    if (!job->ranks) {
        job_free(job);
        return NULL;
    }
    if (spec->bc_tcp_addr)
        job->heartbeat_s = spec->heartbeat_s > 0 ? spec->heartbeat_s : DK_BC_HEARTBEAT_DEFAULT_S;
    job->connect_timeout_s = spec->connect_timeout_s > 0 ? spec->connect_timeout_s
                                                         : DK_JOB_CONNECT_DEFAULT_S;
    for (int r = 0; r < spec->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        rk->pid = -1;
        rk->pidfd = rk->pipe_fd[0] = rk->pipe_fd[1] = -1;
        rk->exit_code = -1;
    }
    for (int r = 0; r < spec->world_size; r++) {
        const char *host = spec->rank_hosts && spec->rank_hosts[r] ? spec->rank_hosts[r]
                                                                   : "localhost";
        if (!(job->ranks[r].host = strdup(host))) {
            job_free(job);
            return NULL;
        }
    }
    return job;
}

dk_job_t *dk_job_start(const dk_job_spec_t *spec, const dk_sink_t *sink, char *err,
                       size_t errlen)
{
    char scratch[1];
    if (!err || errlen == 0) {
        err = scratch;
        errlen = sizeof scratch;
    }
    if (!check_spec(spec, err, errlen) || !dk_fdlimit_job_check(spec->world_size, err, errlen))
        return NULL;
    dk_job_t *job = job_alloc(spec, sink);
    if (!job) {
        dk_set_err(err, errlen, "out of memory");
        return NULL;
    }
    char *program = dk_spawn_find_program(spec->rank_exe, err, errlen);
    if (!program)
        goto fail;
    if (spec->warm_socket && !(job->warm_socket = strdup(spec->warm_socket))) {
        dk_set_err(err, errlen, "out of memory");
        goto fail;
    }

    if (spec->log_dir ? !(job->log_dir = strdup(spec->log_dir))
                      : !(job->log_dir = fresh_log_dir(err, errlen))) {
        if (spec->log_dir)
            dk_set_err(err, errlen, "out of memory");
        goto fail;
    }
    if (!open_log_dir(job, err, errlen))
        goto fail;
    dk_backchan_sink_t bcsink = {job,       bc_delivered, bc_message, bc_warning,
                                 bc_hello,  bc_output,    bc_lost,    bc_closed, bc_stacks};
    dk_backchan_opts_t opts = {spec->bc_tcp_addr, spec->bc_tcp_port, 0,
                               spec->master_port == DK_JOB_PORT_FROM_RANK0,
                               spec->bc_allow_hosts, spec->bc_nallow};
    if (spec->bc_tcp_addr)
        opts.heartbeat_s = spec->heartbeat_s > 0 ? spec->heartbeat_s : DK_BC_HEARTBEAT_DEFAULT_S;
    job->chan = dk_backchan_new_opts(spec->world_size, spec->persistent, spec->payload,
                                     spec->payload_len, &bcsink, &opts, err, errlen);
    if (!job->chan)
        goto fail;
    if (spec->master_port > 0 || spec->master_port == DK_JOB_PORT_FROM_RANK0)
        job->master_port = spec->master_port > 0 ? spec->master_port : 0;
    else if ((job->master_port = dk_spawn_free_port(err, errlen)) < 0)
        goto fail;
    unsigned char id[16];
    char run_id[2 * sizeof id + 1];
    if (RAND_bytes(id, sizeof id) != 1) {
        dk_set_err(err, errlen, "OpenSSL cannot provide random bytes for TORCHELASTIC_RUN_ID");
        goto fail;
    }
    for (size_t i = 0; i < sizeof id; i++)
        snprintf(run_id + 2 * i, 3, "%02x", id[i]);
    if (pipe2(job->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        dk_set_err(err, errlen, "cannot create the runtime's wake pipe: %s", strerror(errno));
        goto fail;
    }
    job->max_fds = 1 + dk_backchan_max_fds(job->chan) + 3 * (size_t) spec->world_size;
    job->fds = calloc(job->max_fds, sizeof *job->fds);
    job->slot_rank = calloc(3 * (size_t) spec->world_size, sizeof *job->slot_rank);
    job->slot_kind = calloc(3 * (size_t) spec->world_size, sizeof *job->slot_kind);
    if (!job->fds || !job->slot_rank || !job->slot_kind) {
        dk_set_err(err, errlen, "out of memory");
        goto fail;
    }
    if (!open_logs(job, err, errlen))
        goto fail;
    /* A folder that cannot be made costs the stacks only. */
    if (spec->stacks) {
        char why[512];
        if (!(job->stacks = dk_stackreq_new(spec->world_size, why, sizeof why)))
            warn(job, "the ranks' stacks will not be shown if the run hangs: %s", why);
        job->stacks_wait_s = spec->stacks_wait_s;
    }

    char *default_argv[2] = {program, NULL};
    char *const *argv = spec->rank_argv ? (char *const *) spec->rank_argv : default_argv;
    const char *const *base = spec->env ? spec->env : (const char *const *) environ;
    job->started_at = dk_now_s();
    for (int r = 0; r < spec->world_size; r++) {
        bool ok;
        if (spec->rank_commands && spec->rank_commands[r]) {
            /* Through a launcher (srun on another node): its own program. */
            char *const *cmd = (char *const *) spec->rank_commands[r];
            char *launcher = cmd[0] ? dk_spawn_find_program(cmd[0], err, errlen) : NULL;
            if (!cmd[0])
                dk_set_err(err, errlen, "rank %d's command is empty", r);
            rank_t *rk = &job->ranks[r];
            rk->launched = true;
            rk->filter[0] = dk_launchout_new();
            rk->filter[1] = dk_launchout_new();
            if (launcher && (!rk->filter[0] || !rk->filter[1])) {
                dk_set_err(err, errlen, "out of memory");
                free(launcher);
                launcher = NULL;
            }
            ok = launcher && start_rank(job, r, launcher, cmd, base, run_id, err, errlen);
            free(launcher);
        } else {
            ok = start_rank(job, r, program, argv, base, run_id, err, errlen);
        }
        if (!ok)
            goto fail;
    }
    /* What a rank starts (a subprocess, a DataLoader's workers) ends with the
     * host too, even when it is SIGKILLed: the ranks die of PR_SET_PDEATHSIG,
     * their children would not. */
    if (!start_sentinel(job, err, errlen))
        goto fail;
    if (!start_thread(job, err, errlen))
        goto fail;
    free(program);
    return job;

fail:
    kill_started(job);
    free(program);
    job_free(job);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* The handle                                                                */

/* Wait on the job's condition until DONE(job) holds (lock held when it is
 * asked), up to TIMEOUT_MS (< 0: no limit; 0: do not wait). Returns DONE's
 * last answer. */
static bool wait_for(dk_job_t *job, int timeout_ms, bool (*done)(const dk_job_t *))
{
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (timeout_ms > 0) {
        deadline.tv_sec += timeout_ms / 1000;
        deadline.tv_nsec += (long) (timeout_ms % 1000) * 1000000L;
        if (deadline.tv_nsec >= 1000000000L) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000L;
        }
    }
    pthread_mutex_lock(&job->lock);
    while (!done(job)) {
        if (timeout_ms < 0)
            pthread_cond_wait(&job->cond, &job->lock);
        else if (timeout_ms == 0 ||
                 pthread_cond_timedwait(&job->cond, &job->lock, &deadline) == ETIMEDOUT)
            break;
    }
    bool over = done(job);
    pthread_mutex_unlock(&job->lock);
    return over;
}

/* Set the request FLAG of a job that has not ended, and wake its thread. */
static void request(dk_job_t *job, bool *flag)
{
    pthread_mutex_lock(&job->lock);
    bool ended = job->ended;
    if (!ended)
        *flag = true;
    pthread_mutex_unlock(&job->lock);
    if (!ended) {
        char byte = 1;
        ssize_t n = write(job->wake[1], &byte, 1);     /* full pipe: already woken */
        (void) n;
    }
}

static bool job_ended(const dk_job_t *job)
{
    return job->ended;
}

bool dk_job_wait(dk_job_t *job, int timeout_ms)
{
    return wait_for(job, timeout_ms, job_ended);
}

void dk_job_cancel(dk_job_t *job)
{
    request(job, &job->cancel_requested);
}

dk_job_end_t dk_job_end(dk_job_t *job)
{
    pthread_mutex_lock(&job->lock);
    dk_job_end_t end = job->ended ? job->end : DK_END_NONE;
    pthread_mutex_unlock(&job->lock);
    return end;
}

int dk_job_root_cause(dk_job_t *job)
{
    pthread_mutex_lock(&job->lock);
    int r = job->root_cause;
    pthread_mutex_unlock(&job->lock);
    return r;
}

static bool rank_ok(const dk_job_t *job, int rank)
{
    return job && rank >= 0 && rank < job->world_size;
}

dk_rank_state_t dk_job_rank_state(dk_job_t *job, int rank)
{
    if (!rank_ok(job, rank))
        return DK_RANK_STARTING;
    pthread_mutex_lock(&job->lock);
    dk_rank_state_t state = job->ranks[rank].state;
    pthread_mutex_unlock(&job->lock);
    return state;
}

bool dk_job_rank_log_complete(dk_job_t *job, int rank)
{
    if (!rank_ok(job, rank))
        return false;
    pthread_mutex_lock(&job->lock);
    bool failed = job->ranks[rank].log_failed;
    pthread_mutex_unlock(&job->lock);
    return !failed;
}

bool dk_job_rank_log_capped(dk_job_t *job, int rank)
{
    if (!rank_ok(job, rank))
        return false;
    pthread_mutex_lock(&job->lock);
    bool capped = job->ranks[rank].log_capped;
    pthread_mutex_unlock(&job->lock);
    return capped;
}

int dk_job_rank_exit_code(dk_job_t *job, int rank)
{
    if (!rank_ok(job, rank))
        return -1;
    pthread_mutex_lock(&job->lock);
    int code = job->ranks[rank].exit_code;
    pthread_mutex_unlock(&job->lock);
    return code;
}

int dk_job_rank_signal(dk_job_t *job, int rank)
{
    if (!rank_ok(job, rank))
        return 0;
    pthread_mutex_lock(&job->lock);
    int sig = job->ranks[rank].term_signal;
    pthread_mutex_unlock(&job->lock);
    return sig;
}

int dk_job_rank_pid(dk_job_t *job, int rank)
{
    return rank_ok(job, rank) ? (int) job->ranks[rank].pid : -1;
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

bool dk_job_rank_lost(dk_job_t *job, int rank)
{
    if (!rank_ok(job, rank))
        return false;
    pthread_mutex_lock(&job->lock);
    bool lost = job->ranks[rank].lost;
    pthread_mutex_unlock(&job->lock);
    return lost;
}

void dk_job_rank_launcher_line(dk_job_t *job, int rank, char *buf, size_t len)
{
    if (len == 0)
        return;
    buf[0] = '\0';
    if (!rank_ok(job, rank))
        return;
    pthread_mutex_lock(&job->lock);
    const char *line = job->ranks[rank].launcher_line;
    if (line) {
        /* Cut on a character, never inside one: the text goes into JSON. */
        size_t n = strlen(line);
        if (n >= len)
            n = dk_utf8_complete_prefix(line, len - 1);
        memcpy(buf, line, n);
        buf[n] = '\0';
    }
    pthread_mutex_unlock(&job->lock);
}

void dk_job_lost_summary(dk_job_t *job, char *buf, size_t len)
{
    if (!buf || len == 0)
        return;
    buf[0] = '\0';
    int n = job->world_size;
    bool *lost = calloc((size_t) n, sizeof *lost);
    const char **hosts = calloc((size_t) n, sizeof *hosts);
    if (lost && hosts) {
        pthread_mutex_lock(&job->lock);
        for (int r = 0; r < n; r++) {
            lost[r] = job->ranks[r].lost;
            hosts[r] = job->ranks[r].host;
        }
        pthread_mutex_unlock(&job->lock);
        dk_lost_format(n, lost, hosts, "; ", buf, len);
    }
    free(lost);
    free(hosts);
}

const char *dk_job_bc_address(dk_job_t *job)
{
    return dk_backchan_address(job->chan);
}

const char *dk_job_log_dir(dk_job_t *job)
{
    return job->log_dir;
}

int dk_job_master_port(dk_job_t *job)
{
    return job->master_port;
}

void dk_job_destroy(dk_job_t **job_p)
{
    if (!job_p || !*job_p)
        return;
    dk_job_t *job = *job_p;
    dk_job_cancel(job);
    dk_job_wait(job, -1);
    pthread_join(job->thread, NULL);
    job_free(job);
    *job_p = NULL;
}

/* ------------------------------------------------------------------------ */
/* Persistent jobs                                                           */

int dk_job_set_log_dir(dk_job_t *job, const char *log_dir, char *err, size_t errlen)
{
    /* Everything that can fail happens on the side, before the swap. */
    dk_job_t fresh;
    memset(&fresh, 0, sizeof fresh);
    fresh.world_size = job->world_size;
    fresh.log_cap = job->log_cap;
    fresh.log_dirfd = -1;
    rank_t *ranks = calloc((size_t) job->world_size, sizeof *ranks);
    fresh.ranks = ranks;
    fresh.log_dir = strdup(log_dir);
    bool ok = ranks && fresh.log_dir;
    if (!ok)
        dk_set_err(err, errlen, "out of memory");
    ok = ok && open_log_dir(&fresh, err, errlen) && open_logs(&fresh, err, errlen);
    if (ok) {
        pthread_mutex_lock(&job->log_lock);
        for (int r = 0; r < job->world_size; r++) {
            rank_t *rk = &job->ranks[r];
            dk_logfile_t *old = rk->log;
            char *old_path = rk->log_path;
            rk->log = ranks[r].log;
            rk->log_path = ranks[r].log_path;
            ranks[r].log = old;
            ranks[r].log_path = old_path;
            pthread_mutex_lock(&job->lock);
            rk->log_failed = rk->log_capped = false;
            pthread_mutex_unlock(&job->lock);
        }
        char *old_dir = job->log_dir;
        int old_fd = job->log_dirfd;
        job->log_dir = fresh.log_dir;
        job->log_dirfd = fresh.log_dirfd;
        fresh.log_dir = old_dir;
        fresh.log_dirfd = old_fd;
        pthread_mutex_unlock(&job->log_lock);
    }
    /* FRESH now holds what is no longer used: the old logs, or the new ones
     * that could not all be made. */
    for (int r = 0; ranks && r < job->world_size; r++) {
        dk_logfile_close(&ranks[r].log);
        free(ranks[r].log_path);
    }
    free(ranks);
    close_fd(&fresh.log_dirfd);
    free(fresh.log_dir);
    return ok ? 0 : -1;
}

int dk_job_submit(dk_job_t *job, const void *payload, size_t len, double timeout_s, char *err,
                  size_t errlen)
{
    if (len > DK_BC_TASK_MAX) {
        dk_set_err(err, errlen, "the payload is %zu bytes; a cell can carry at most 1 GiB to its "
                 "ranks (pass large data through files instead)", len);
        return -1;
    }
    void *copy = malloc(len ? len : 1);
    if (!copy) {
        dk_set_err(err, errlen, "out of memory (payload of %zu bytes)", len);
        return -1;
    }
    if (len)
        memcpy(copy, payload, len);
    pthread_mutex_lock(&job->lock);
    const char *why = !job->persistent ? "this job does not keep its ranks"
                      : job->ended || job->cancel_requested ? "the ranks have ended"
                      : job->round_active ? "a cell is still running on the ranks"
                                          : NULL;
    if (!why) {
        job->submit_payload = copy;
        job->submit_len = len;
        job->submit_timeout_s = timeout_s;
        job->submit_pending = true;
        job->round_active = true;
        job->round_end = DK_END_NONE;
        job->round_root = -1;
    }
    pthread_mutex_unlock(&job->lock);
    if (why) {
        free(copy);
        dk_set_err(err, errlen, "%s", why);
        return -1;
    }
    char byte = 1;
    ssize_t n = write(job->wake[1], &byte, 1);
    (void) n;
    return 0;
}

static bool round_over(const dk_job_t *job)
{
    return !job->round_active || job->ended;
}

bool dk_job_round_wait(dk_job_t *job, int timeout_ms)
{
    return wait_for(job, timeout_ms, round_over);
}

dk_job_end_t dk_job_round_end(dk_job_t *job)
{
    pthread_mutex_lock(&job->lock);
    dk_job_end_t end = job->round_active && !job->ended ? DK_END_NONE
                       : job->round_active                ? job->end
                                                          : job->round_end;
    pthread_mutex_unlock(&job->lock);
    return end;
}

int dk_job_round_root_cause(dk_job_t *job)
{
    pthread_mutex_lock(&job->lock);
    int r = job->round_root;
    pthread_mutex_unlock(&job->lock);
    return r;
}

void dk_job_interrupt(dk_job_t *job)
{
    request(job, &job->interrupt_requested);
}

bool dk_job_sample_stacks(dk_job_t *job)
{
    request(job, &job->sample_requested);
    return dk_job_end(job) == DK_END_NONE;
}

double dk_job_idle_s(dk_job_t *job)
{
    pthread_mutex_lock(&job->lock);
    double idle = job->round_active || job->idle_since <= 0 ? 0 : dk_now_s() - job->idle_since;
    pthread_mutex_unlock(&job->lock);
    return idle;
}

const char *dk_job_rank_stacks(dk_job_t *job, int rank, size_t *len)
{
    if (!job->stacks || rank < 0 || rank >= job->world_size) {
        *len = 0;
        return NULL;
    }
    return dk_stackreq_dump(job->stacks, rank, len);
}
