/*
 * dk_dist_pool: started ranks. See the header.
 *
 * The only shared state is the attached sink: the runtime thread calls
 * through it under the pool's lock, and the main thread swaps it under the
 * same lock, so a run that detaches is never called again once detach
 * returns. The relay behind the sink has a lock of its own and never takes
 * ours, so holding ours across the call cannot deadlock.
 */
#include "dk_dist_pool.h"
#include "dk_clock.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dk_dist_pool_t {
    dk_dist_opts_t opts;
    dk_dist_plan_t plan;
    char id[24];
    dk_job_t *job;
    long long started_ms;
    pthread_mutex_t lock;       /* guards current */
    dk_sink_t current;          /* .data NULL: no run attached */
    bool busy;                  /* a run uses the ranks (main thread, GIL held) */
};

dk_dist_pool_t *dk_dist_pool_new(const dk_dist_opts_t *opts, const dk_dist_plan_t *plan,
                                 const char *id)
{
    dk_dist_pool_t *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->opts = *opts;
    p->plan = *plan;
    snprintf(p->id, sizeof p->id, "%s", id);
    pthread_mutex_init(&p->lock, NULL);
    p->started_ms = dk_now_ms();
    return p;
}

/* ---- the sink: runs on the runtime thread --------------------------------- */

static void fwd_output(void *data, int rank, int fd, const char *bytes, size_t len)
{
    dk_dist_pool_t *p = data;
    pthread_mutex_lock(&p->lock);
    if (p->current.data && p->current.on_output)
        p->current.on_output(p->current.data, rank, fd, bytes, len);
    pthread_mutex_unlock(&p->lock);
}

static void fwd_state(void *data, int rank, dk_rank_state_t state, int code, int sig)
{
    dk_dist_pool_t *p = data;
    pthread_mutex_lock(&p->lock);
    if (p->current.data && p->current.on_state)
        p->current.on_state(p->current.data, rank, state, code, sig);
    pthread_mutex_unlock(&p->lock);
}

static void fwd_message(void *data, int rank, bool is_error, const void *bytes, size_t len)
{
    dk_dist_pool_t *p = data;
    pthread_mutex_lock(&p->lock);
    if (p->current.data && p->current.on_message)
        p->current.on_message(p->current.data, rank, is_error, bytes, len);
    pthread_mutex_unlock(&p->lock);
}

static void fwd_warning(void *data, const char *text)
{
    dk_dist_pool_t *p = data;
    pthread_mutex_lock(&p->lock);
    if (p->current.data && p->current.on_warning)
        p->current.on_warning(p->current.data, text);
    pthread_mutex_unlock(&p->lock);
}

static void fwd_caught_up(void *data, int rank, int fd)
{
    dk_dist_pool_t *p = data;
    pthread_mutex_lock(&p->lock);
    if (p->current.data && p->current.on_caught_up)
        p->current.on_caught_up(p->current.data, rank, fd);
    pthread_mutex_unlock(&p->lock);
}

dk_sink_t dk_dist_pool_sink(dk_dist_pool_t *self)
{
    return (dk_sink_t){.data = self, .on_output = fwd_output, .on_state = fwd_state,
                       .on_message = fwd_message, .on_warning = fwd_warning,
                       .on_caught_up = fwd_caught_up};
}

/* ---- the main thread -------------------------------------------------------- */

void dk_dist_pool_set_job(dk_dist_pool_t *self, dk_job_t *job)
{
    self->job = job;
    self->started_ms = dk_now_ms();
}

dk_job_t *dk_dist_pool_job(dk_dist_pool_t *self)
{
    return self->job;
}

void dk_dist_pool_attach(dk_dist_pool_t *self, const dk_sink_t *sink)
{
    pthread_mutex_lock(&self->lock);
    if (sink)
        self->current = *sink;
    else
        memset(&self->current, 0, sizeof self->current);
    pthread_mutex_unlock(&self->lock);
}

bool dk_dist_pool_busy(const dk_dist_pool_t *self)
{
    return self->busy;
}

void dk_dist_pool_set_busy(dk_dist_pool_t *self, bool busy)
{
    self->busy = busy;
}

const dk_dist_plan_t *dk_dist_pool_plan(const dk_dist_pool_t *self)
{
    return &self->plan;
}

const dk_dist_opts_t *dk_dist_pool_opts(const dk_dist_pool_t *self)
{
    return &self->opts;
}

const char *dk_dist_pool_id(const dk_dist_pool_t *self)
{
    return self->id;
}

bool dk_dist_pool_alive(dk_dist_pool_t *self)
{
    return self->job && dk_job_end(self->job) == DK_END_NONE;
}

char *dk_dist_pool_status_text(dk_dist_pool_t *self)
{
    size_t cap = 512 + (size_t)self->plan.world * 64;
    char *text = malloc(cap);
    if (!text)
        return NULL;
    double up = (double)(dk_now_ms() - self->started_ms) / 1000.0;
    double idle = dk_job_idle_s(self->job);
    size_t n = (size_t)snprintf(text, cap, "started ranks %s: %s · up %.0f s · %s", self->id,
                                self->plan.what, up, idle > 0 ? "idle" : "running a cell");
    if (idle > 0 && n < cap)
        n += (size_t)snprintf(text + n, cap - n, " for %.0f s", idle);
    if (n < cap && self->opts.idle_timeout_s > 0)
        n += (size_t)snprintf(text + n, cap - n, " (ended after %g s idle)",
                              self->opts.idle_timeout_s);
    for (int r = 0; r < self->plan.world && n < cap; r++)
        n += (size_t)snprintf(text + n, cap - n, "%srank %d pid %d", r ? " · " : "\n  ", r,
                              dk_job_rank_pid(self->job, r));
    return text;
}

void dk_dist_pool_gone_text(dk_dist_pool_t *self, char *out, size_t outlen)
{
    dk_job_end_t end = dk_job_end(self->job);
    int root = dk_job_root_cause(self->job);
    if (end == DK_END_IDLE)
        snprintf(out, outlen, "they were idle for longer than idle_timeout=%g s",
                 self->opts.idle_timeout_s);
    else if (end == DK_END_FAILED && root >= 0) {
        int code = dk_job_rank_exit_code(self->job, root);
        int sig = dk_job_rank_signal(self->job, root);
        if (sig)
            snprintf(out, outlen, "rank %d was killed by signal %d", root, sig);
        else if (dk_job_rank_state(self->job, root) == DK_RANK_FAILED && code >= 0 &&
                 !dk_job_rank_signal(self->job, root))
            snprintf(out, outlen, "rank %d failed (exit code %d)", root, code);
        else
            snprintf(out, outlen, "rank %d failed", root);
    } else
        snprintf(out, outlen, "they were ended (interrupted, stuck, or stopped)");
}

void dk_dist_pool_destroy(dk_dist_pool_t **self_p)
{
    dk_dist_pool_t *p = *self_p;
    if (!p)
        return;
    dk_dist_pool_attach(p, NULL);
    dk_job_destroy(&p->job);
    pthread_mutex_destroy(&p->lock);
    free(p);
    *self_p = NULL;
}
