/*
 * dk_job_round: the rounds of a persistent job (dk_job.h: started ranks).
 *
 * A persistent job's ranks stay up between cells. Each cell is a round: a
 * TASK frame to every live rank (dk_job_submit), and the round is over when
 * each has answered with a RESULT or an ERROR. A rank's ERROR interrupts the
 * others (they may wait for it in a collective); one that does not answer
 * within the grace after that ends the job (job_round_stuck).
 */
#include "dk_job_state.h"
#include "dk_clock.h"
#include "dk_err.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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
        job_sample_over(job);
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

void job_round_answered(dk_job_t *job)
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

void job_signal_unanswered(dk_job_t *job)
{
    for (int r = 0; r < job->world_size; r++) {
        rank_t *rk = &job->ranks[r];
        if (rk->reaped || rk->reported)
            continue;
        if (rk->by_agent)   /* its agent signals its group on its node */
            dk_backchan_agent_send(job->chan, r / job->ranks_per_node, DK_FRAME_SIGNAL,
                                   (uint32_t) r, SIGINT);
        else if (rk->pid > 0)
            killpg(rk->pid, SIGINT);
        rk->interrupted = true;
    }
    job->round_resend_at = dk_now_s() + ROUND_RESEND_S;
}

/* The round is interrupted: SIGINT to the ranks that have not answered; the
 * grace starts. */
void job_interrupt_round(dk_job_t *job)
{
    if (job_ask_stacks(job)) {
        job->interrupt_deferred = true;
        return;
    }
    job_signal_unanswered(job);
    if (job->round_deadline < 0)
        job->round_deadline = dk_now_s() + job->stop.grace;
}

/* A rank has not answered within the grace after our SIGINT: stuck (most
 * likely in a collective whose peer has left it). Every rank ends. */
void job_round_stuck(dk_job_t *job)
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
    job_warn(job, "rank %s did not return to the prompt within %.0f s of being interrupted "
         "(stuck in a collective?); every rank is being ended", who,
         job->stop.grace);
    job_begin_stop(job, root >= 0 ? DK_END_FAILED : job->round_reason);
}

void job_start_round(dk_job_t *job)
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
        job_warn(job, "cannot hand the cell to the ranks: %s", err);
        job_begin_stop(job, DK_END_FAILED);
    }
    free(payload);
    if (job->round_pending == 0)
        round_complete(job);
}

/* A persistent job's rank answered the round. */
void job_round_message(dk_job_t *job, int r, bool is_error, const void *bytes, size_t len)
{
    rank_t *rk = &job->ranks[r];
    rk->reported = true;
    rk->got_result = !is_error;
    /* It flushed its output before answering: let that output come first. */
    job_drain_pipe(job, r, 0, REAP_DRAIN_BUDGET);
    job_drain_pipe(job, r, 1, REAP_DRAIN_BUDGET);
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
            job_interrupt_round(job);   /* the others may wait for it in a collective */
    }
    job_set_state(job, r, state);
    job_round_answered(job);
}

/* ------------------------------------------------------------------------ */
/* The rounds' API (dk_job.h)                                                */

int dk_job_submit(dk_job_t *job, const void *payload, size_t len, double timeout_s, char *err,
                  size_t errlen)
{
    if (len > DK_FRAME_TASK_MAX) {
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
    return job_wait_for(job, timeout_ms, round_over);
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
    job_request(job, &job->interrupt_requested);
}

bool dk_job_sample_stacks(dk_job_t *job)
{
    job_request(job, &job->sample_requested);
    return dk_job_end(job) == DK_END_NONE;
}

double dk_job_idle_s(dk_job_t *job)
{
    pthread_mutex_lock(&job->lock);
    double idle = job->round_active || job->idle_since <= 0 ? 0 : dk_now_s() - job->idle_since;
    pthread_mutex_unlock(&job->lock);
    return idle;
}
