/*
 * dk_job_chan: the channel between a job and its ranks, and their output.
 *
 * The back channel (dk_backchan) calls the handlers here from the runtime
 * thread's poll loop: a rank's delivery, its answer, its HELLO, its output
 * frames, its stacks, its silence or its close. Its pipes are read here too.
 *
 * Output goes to the sink and to rank-N.log as it is read, stdout and stderr
 * into the same file in arrival order: a rank's bytes from its pipes as
 * read, unbuffered; those of a rank started by a node agent from its
 * agent's OUTPUT frames. A log that cannot be written (full disk) is
 * reported once and abandoned; the relay goes on. The log directory
 * is opened and checked with dk_logdir (nobody else can write it), held with
 * flock while the job runs so no pruning removes it, and every log is created
 * relative to its descriptor with O_EXCL | O_NOFOLLOW. A log that passes its
 * cap keeps its head and tail (dk_logfile_t); the sink is warned once per rank.
 */
#include "dk_job_state.h"
#include "dk_clock.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Output                                                                    */

static void log_bytes(dk_job_t *job, int r, const char *buf, size_t n)
{
    rank_t *rk = &job->ranks[r];
    if (!rk->log)
        return;
    if (dk_logfile_write(rk->log, buf, n) != 0) {
        job_warn_rank(job, &job->told_log_failed, "more ranks' log files could not be "
                      "written; their output is still shown",
                      "cannot write rank %d's log file %s (%s); its output is still shown "
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
        job_warn_rank(job, &job->told_log_capped, "more ranks' output passed the log cap; "
                      "each of their logs says how much it left out",
                      "rank %d's output passed its log cap of %llu bytes (log_cap=, "
                      "DISTKERNEL_LOG_CAP): %s keeps its first %llu bytes and its last, with a "
                      "line saying how much was left out between them", r, cap, rk->log_path,
                      cap / 2);
    }
}

/* Assemble each capped log (its head, a marker, its tail) and close it. */
void job_close_logs(dk_job_t *job)
{
    pthread_mutex_lock(&job->log_lock);
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (rk->log && dk_logfile_close(&rk->log) != 0) {
            job_warn_rank(job, &job->told_log_unfinished, "more ranks' log files could not "
                          "be finished; they may be cut short",
                          "cannot finish rank %d's log file %s (%s); it may be cut short", r,
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

void job_deliver(dk_job_t *job, int r, int fd, const char *buf, size_t n)
{
    deliver(job, r, fd, buf, n);
}

/* Read pipe WHICH of rank R until EAGAIN, EOF or BUDGET bytes. */
void job_drain_pipe(dk_job_t *job, int r, int which, size_t budget)
{
    rank_t *rk = &job->ranks[r];
    char buf[65536];
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
            job_close_fd(&rk->pipe_fd[which]);
            return;
        }
        deliver(job, r, which + 1, buf, (size_t) n);
        budget -= (size_t) n < budget ? (size_t) n : budget;
    }
}

/* ------------------------------------------------------------------------ */
/* Back-channel events                                                       */

static void bc_delivered(void *data, int r)
{
    dk_job_t *job = data;
    if (job->persistent ? !job->ranks[r].reported && job->stop_reason == DK_END_NONE
                        : job->ranks[r].state == DK_RANK_STARTING)
        if (!job->ranks[r].reaped)
            job_set_state(job, r, DK_RANK_RUNNING);
}

static void bc_hello(void *data, int r)
{
    dk_job_t *job = data;
    if (job->ranks[r].reaped || job->ranks[r].reported)
        return;
    job->ranks[r].reported = true;
    job_set_state(job, r, DK_RANK_DONE);
    job_round_answered(job);
}

/* A rank started by a node agent answered for its stacks, through its agent. */
static void bc_stacks(void *data, int r, const void *bytes, size_t len)
{
    dk_job_t *job = data;
    if (job->stacks)
        dk_stackreq_answer(job->stacks, r, bytes, len);
}

/* A rank's output from its agent's OUTPUT frames: the same path as a pipe's;
 * its notes about itself (DK_FRAME_OUTPUT_LOG, on its own connection) to its
 * log only. */
static void bc_output(void *data, int r, int fd, const void *bytes, size_t len, bool caught_up)
{
    dk_job_t *job = data;
    if (fd == DK_FRAME_OUTPUT_LOG) {
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

static void bc_agent_exit(void *data, int r, int exit_code, int term_signal)
{
    job_agent_exit(data, r, exit_code, term_signal);
}

static void bc_agent_hello(void *data, int node)
{
    dk_job_t *job = data;
    if (node >= 0 && node < job->nagents)
        job->agent_hello[node] = true;
}

/* The connection of node ID - world_size's agent went silent (only agents
 * have heartbeats): its node is lost. */
static void bc_lost(void *data, int id, double silent_s)
{
    dk_job_t *job = data;
    char why[120];
    snprintf(why, sizeof why, "nothing heard from its node agent for %.1f s", silent_s);
    job_agent_gone(job, id - job->world_size, why);
}

/* Rank R's connection was ended by its side before it answered (over TCP:
 * with heartbeats). Its process usually exits at once (a crash, a rank that
 * gave up), and that exit, which its agent tells, is judged as any other.
 * But it is awaited only for the heartbeat deadline, as silence would be: a
 * rank still running then is lost (job_judge_closed). Meanwhile a peer's
 * failure waits (job_resolve_failure): that is most likely its echo, gloo's
 * "Connection closed by peer". */
static void bc_closed(void *data, int r)
{
    dk_job_t *job = data;
    if (r >= job->world_size) {
        /* Told after its ranks' exits, when it ends as it should: then no
         * rank of its node is left to lose. */
        job_agent_gone(job, r - job->world_size, "its node agent's connection closed");
        return;
    }
    rank_t *rk = &job->ranks[r];
    if (job->heartbeat_s <= 0 || rk->reaped || rk->signalled || rk->lost || rk->reported)
        return;
    rk->closed_unanswered = true;
    rk->closed_until = dk_now_s() + job->heartbeat_s;
}

/* What a rank raises when a peer's connection went away under it: gloo's
 * "Connection closed by peer [ADDR]:PORT", a reset, a write to a closed
 * socket. On other nodes that is most often the echo of a lost node, which
 * the kernel learns of a little later (its agent's close or silence). */
static const char *const echo_marks[] = {"Connection closed by peer",
                                         "Connection reset by peer", "Broken pipe"};

static bool says_peer_went_away(const void *bytes, size_t len)
{
    for (size_t i = 0; i < sizeof echo_marks / sizeof echo_marks[0]; i++)
        if (memmem(bytes, len, echo_marks[i], strlen(echo_marks[i])))
            return true;
    return false;
}

static void bc_message(void *data, int r, bool is_error, const void *bytes, size_t len)
{
    dk_job_t *job = data;
    if (job->persistent) {
        job_round_message(job, r, is_error, bytes, len);
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
        job_note_failure(job, r);
}

static void bc_warning(void *data, const char *text)
{
    dk_job_t *job = data;
    if (job->sink.on_warning)
        job->sink.on_warning(job->sink.data, text);
}

/* The handlers above, as the back channel's sink for dk_job_start. */
dk_backchan_sink_t job_backchan_sink(dk_job_t *job)
{
    dk_backchan_sink_t bcsink = {job,       bc_delivered, bc_message, bc_warning,
                                 bc_hello,  bc_output,    bc_lost,    bc_closed, bc_stacks,
                                 bc_agent_exit, bc_agent_hello};
    return bcsink;
}
