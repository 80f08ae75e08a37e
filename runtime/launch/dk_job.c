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
 * The job is five files over one state (dk_job_state.h): this one holds the
 * runtime thread's loop and the handle; dk_job_launch.c starts the job,
 * dk_job_chan.c handles the channel to the ranks and their output,
 * dk_job_judge.c judges how each rank ended and stops the others, and
 * dk_job_round.c runs the rounds of a persistent job.
 *
 * Ending. The job ends when every rank is reaped and its pipes reached EOF.
 * What a rank leaves running in its process group is SIGKILLed when the rank
 * exits (see job_reap), so no process of a cell outlives it. A process that left
 * the group (setsid, a daemon) can still hold the pipes; its output is relayed,
 * but only for DRAIN_S after the last rank is reaped, so it never keeps a cell
 * running.
 */
#include "dk_job_state.h"
#include "dk_clock.h"
#include "dk_spawn.h"

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DRAIN_S 1.0                         /* pipes held open by a grandchild */
#define PIPE_BUDGET ((size_t) 1 << 20)      /* bytes per pipe per poll turn */
#define NO_PIDFD_TICK_MS 50                 /* kernels before 5.3: poll waitpid */

static void warn_v(dk_job_t *job, const char *fmt, va_list ap)
{
    if (!job->sink.on_warning)
        return;
    char text[1024];
    vsnprintf(text, sizeof text, fmt, ap);
    job->sink.on_warning(job->sink.data, text);
}

void job_warn(dk_job_t *job, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    warn_v(job, fmt, ap);
    va_end(ap);
}

void job_warn_rank(dk_job_t *job, int *told, const char *more, const char *fmt, ...)
{
    int n = (*told)++;
    if (n == DK_JOB_RANKS_TOLD)
        job_warn(job, "%s", more);
    if (n >= DK_JOB_RANKS_TOLD)
        return;
    va_list ap;
    va_start(ap, fmt);
    warn_v(job, fmt, ap);
    va_end(ap);
}

void job_close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
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
        earliest(&next, job_echo_deadline(job));
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
    if (job->nagents > 0 && !job->agents_reaped && job->agents_pidfd < 0 &&
        (ms < 0 || ms > NO_PIDFD_TICK_MS))
        ms = NO_PIDFD_TICK_MS;
    if (job_agents_words_pending(job) && (ms < 0 || ms > NO_PIDFD_TICK_MS))
        ms = NO_PIDFD_TICK_MS;      /* the launcher's last lines, or their deadline */
    if (job->nagents > 0 && job->stop_reason == DK_END_NONE) {
        double wait = (job->started_at + job->connect_timeout_s + job->heartbeat_s -
                       dk_now_s()) * 1000.0 + 1;
        int d = wait <= 0 ? 0 : wait > 60000 ? 60000 : (int) wait;
        if (ms < 0 || d < ms)
            ms = d;
    }
    for (int r = 0; r < job->world_size; r++) {
        if (!job->ranks[r].reaped && !job->ranks[r].by_agent && job->ranks[r].pidfd < 0 &&
            (ms < 0 || ms > NO_PIDFD_TICK_MS))
            ms = NO_PIDFD_TICK_MS;
        if (job_closing(&job->ranks[r])) {
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
        job_start_round(job);
    if (interrupt && job->round_reason == DK_END_NONE && job->round_pending > 0) {
        job->round_reason = DK_END_CANCELLED;
        job_interrupt_round(job);
    }
    if (sample && !cancel)
        job_sample_stacks(job);
    if (!cancel)
        return;
    if (job->unreaped > 0)
        job_begin_stop(job, DK_END_CANCELLED);
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
    /* The node agents' launcher: slot rank -1. */
    int agents_want[3] = {job->agents_pipe[0], job->agents_pipe[1],
                          job->agents_reaped ? -1 : job->agents_pidfd};
    for (int kind = 0; job->nagents > 0 && kind < 3; kind++) {
        if (agents_want[kind] < 0)
            continue;
        job->slot_rank[n - own_first] = -1;
        job->slot_kind[n - own_first] = kind;
        fds[n++] = (struct pollfd) {.fd = agents_want[kind], .events = POLLIN};
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
            if (r < 0) {
                if (kind < 2)
                    job_agents_drain(job, kind);
                else
                    job_agents_reap(job);
                continue;
            }
            if (kind < 2 && job->ranks[r].pipe_fd[kind] == fds[i].fd)
                job_drain_pipe(job, r, kind, PIPE_BUDGET);
            else if (kind == 2 && !job->ranks[r].reaped)
                job_reap(job, r);
        }
    }
    for (int r = 0; r < job->world_size; r++) {
        if (!job->ranks[r].reaped && !job->ranks[r].by_agent && job->ranks[r].pidfd < 0)
            job_reap(job, r);
    }
    job_agents_reap_told(job);
    if (job->nagents > 0 && !job->agents_reaped && job->agents_pidfd < 0)
        job_agents_reap(job);
    job_agents_judge(job);
    job_judge_deferred(job);
    job_judge_closed(job);
    job_resolve_failure(job);
    if (job->stacks && dk_stackreq_poll(job->stacks, dk_now_s())) {
        if (job->sampling)
            job_sample_over(job);
        else if (job->stop_deferred || job->interrupt_deferred)
            job_stacks_over(job);
    }
    job_escalate(job);
}

void *job_thread(void *arg)
{
    dk_job_t *job = arg;
    for (int r = 0; r < job->world_size; r++)
        job_set_state(job, r, DK_RANK_STARTING);
    while (!finished(job))
        loop_once(job);

    for (int r = 0; r < job->world_size; r++) {
        job_close_fd(&job->ranks[r].pipe_fd[0]);
        job_close_fd(&job->ranks[r].pipe_fd[1]);
    }
    job_close_logs(job);
    job_agents_end(job);
    dk_backchan_close_all(job->chan);
    if (job->stacks)
        dk_stackreq_end(job->stacks);     /* every rank is gone: final before the end is told */
    if (job->sampling)
        job_sample_over(job);             /* the job ended by itself: no end's stacks */
    /* Every rank is reaped and its group was ended as it was (job_reap): the
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
/* The handle                                                                */

/* Wait on the job's condition until DONE(job) holds (lock held when it is
 * asked), up to TIMEOUT_MS (< 0: no limit; 0: do not wait). Returns DONE's
 * last answer. */
bool job_wait_for(dk_job_t *job, int timeout_ms, bool (*done)(const dk_job_t *))
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
void job_request(dk_job_t *job, bool *flag)
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
    return job_wait_for(job, timeout_ms, job_ended);
}

void dk_job_cancel(dk_job_t *job)
{
    job_request(job, &job->cancel_requested);
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


bool dk_job_rank_lost(dk_job_t *job, int rank)
{
    if (!rank_ok(job, rank))
        return false;
    pthread_mutex_lock(&job->lock);
    bool lost = job->ranks[rank].lost;
    pthread_mutex_unlock(&job->lock);
    return lost;
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


const char *dk_job_rank_stacks(dk_job_t *job, int rank, size_t *len)
{
    if (!job->stacks || rank < 0 || rank >= job->world_size) {
        *len = 0;
        return NULL;
    }
    return dk_stackreq_dump(job->stacks, rank, len);
}
