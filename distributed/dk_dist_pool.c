/*
 * dk_dist_pool: started ranks. See the header.
 *
 * The only shared state is the attached sink: the runtime thread calls
 * through it under the pool's lock, and the main thread swaps it under the
 * same lock, so a run that detaches is never called again once detach
 * returns. The output (dk_dist_output) behind the sink has a lock of its own and never takes
 * ours, so holding ours across the call cannot deadlock.
 */
#include "dk_dist_pool.h"
#include "dk_log.h"
#include "dk_clock.h"
#include "dk_dist_rank.h"
#include "dk_dist_slurm.h"
#include "dk_dist_status.h"
#include "dk_gpu.h"
#include "dk_lost.h"

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
    /* On Slurm's nodes: the allocation, and the releaser (see the top). */
    dk_dist_slurm_t *slurm;
    pthread_t releaser;
    bool releaser_running;      /* started and not yet joined */
    pthread_mutex_t rel_lock;   /* guards released, quit */
    pthread_cond_t rel_cond;
    bool released, quit;
    double slurm_end_s;         /* dk_now_s when Slurm's time limit ends it; 0: none */
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
    pthread_mutex_init(&p->rel_lock, NULL);
    pthread_cond_init(&p->rel_cond, NULL);
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

static void fwd_stacks(void *data, int world, const char *const *dumps, const size_t *lens)
{
    dk_dist_pool_t *p = data;
    pthread_mutex_lock(&p->lock);
    if (p->current.data && p->current.on_stacks)
        p->current.on_stacks(p->current.data, world, dumps, lens);
    pthread_mutex_unlock(&p->lock);
}

dk_sink_t dk_dist_pool_sink(dk_dist_pool_t *self)
{
    return (dk_sink_t){.data = self, .on_output = fwd_output, .on_state = fwd_state,
                       .on_message = fwd_message, .on_warning = fwd_warning,
                       .on_caught_up = fwd_caught_up, .on_stacks = fwd_stacks};
}

/* ---- the main thread -------------------------------------------------------- */

void dk_dist_pool_set_job(dk_dist_pool_t *self, dk_job_t *job)
{
    self->job = job;
    self->started_ms = dk_now_ms();
}

/* How often the releaser looks at its quit flag while the job runs. */
#define RELEASER_SLICE_MS 200

static void *releaser_main(void *arg)
{
    dk_dist_pool_t *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->rel_lock);
        bool quit = p->quit;
        pthread_mutex_unlock(&p->rel_lock);
        if (quit || dk_job_wait(p->job, RELEASER_SLICE_MS))
            break;
    }
    /* The ranks ran in the allocation: they are gone once the job has
     * ended (dk_job ends the node agents' srun step). On quit the job may
     * still run: destroy releases after ending it. */
    char err[1024] = "";
    bool ended = dk_job_end(p->job) != DK_END_NONE;
    if (ended && dk_dist_slurm_release(p->slurm, err, sizeof err) < 0)
        dk_log("could not release Slurm job %s: %s", dk_dist_slurm_job_id(p->slurm), err);
    pthread_mutex_lock(&p->rel_lock);
    p->released = true;
    pthread_cond_broadcast(&p->rel_cond);
    pthread_mutex_unlock(&p->rel_lock);
    return NULL;
}

void dk_dist_pool_set_slurm(dk_dist_pool_t *self, dk_dist_slurm_t *slurm)
{
    self->slurm = slurm;
    if (pthread_create(&self->releaser, NULL, releaser_main, self) == 0)
        self->releaser_running = true;
    /* else: released when the pool is destroyed, as a fresh run's is */
}

void dk_dist_pool_set_slurm_end(dk_dist_pool_t *self, double end_s)
{
    self->slurm_end_s = end_s;
}

double dk_dist_pool_slurm_left(const dk_dist_pool_t *self)
{
    if (self->slurm_end_s <= 0)
        return -1;
    double left = self->slurm_end_s - dk_now_s();
    return left > 0 ? left : 0;
}

const char *dk_dist_pool_slurm_job_id(const dk_dist_pool_t *self)
{
    return self->slurm ? dk_dist_slurm_job_id(self->slurm) : "";
}

const char *const *dk_dist_pool_hosts(const dk_dist_pool_t *self)
{
    return self->slurm ? dk_dist_slurm_hosts(self->slurm) : NULL;
}

void dk_dist_pool_end(dk_dist_pool_t *self)
{
    if (!self->job)
        return;
    dk_job_cancel(self->job);
    dk_job_wait(self->job, -1);
    if (!self->releaser_running)
        return;
    pthread_mutex_lock(&self->rel_lock);
    while (!self->released)
        pthread_cond_wait(&self->rel_cond, &self->rel_lock);
    pthread_mutex_unlock(&self->rel_lock);
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

/* Each rank's lost flag (malloc'd, WORLD entries; NULL when out of memory or
 * on this node, where no rank is lost), with every rank of a node that has a
 * lost rank: a node cut off loses them all, but only the first heard to go
 * silent is marked lost (the job's stop then closes the others' connections
 * before their own heartbeat deadline passes). O(N log N). */
static bool *lost_ranks(dk_dist_pool_t *self)
{
    const char *const *hosts = dk_dist_pool_hosts(self);
    int n = self->plan.world;
    bool *lost = hosts ? calloc((size_t)n, sizeof *lost) : NULL;
    if (!lost)
        return NULL;
    for (int r = 0; r < n; r++)
        lost[r] = dk_job_rank_lost(self->job, r);
    dk_lost_whole_nodes(n, lost, hosts);    /* out of memory: the ranks marked */
    return lost;
}

/* The status is told as a run's is (dk_dist_status), from a record per rank
 * filled from the job (its state and lost flag are read under the job's
 * lock, so while it runs too), and whose output a cell shows from the
 * options the ranks were started with. The records are about a hundred
 * bytes each: well under 1 MiB at 4,096 ranks, for a command the user
 * types. */
char *dk_dist_pool_status_text(dk_dist_pool_t *self)
{
    int world = self->plan.world;
    dk_dist_rank_t *ranks = calloc((size_t)world, sizeof *ranks);
    bool *lost = lost_ranks(self);
    bool *shown = NULL;
    char err[512];
    if (!ranks || dk_dist_plan_output(&self->plan, &self->opts, &shown, err, sizeof err) < 0) {
        /* A list past the world was refused when the ranks started: memory. */
        free(ranks);
        free(lost);
        return NULL;
    }
    for (int r = 0; r < world; r++)
        ranks[r] = (dk_dist_rank_t){.state = dk_job_rank_state(self->job, r),
                                    .pid = dk_job_rank_pid(self->job, r),
                                    .gpu_index = dk_dist_plan_local_gpu(&self->plan, r),
                                    .lost = lost && lost[r]};
    dk_dist_started_t started = {.id = self->id, .idle_s = dk_job_idle_s(self->job),
                                 .idle_timeout_s = self->opts.idle_timeout_s};
    if (self->slurm) {
        started.slurm_job = dk_dist_slurm_job_id(self->slurm);
        started.slurm_nodes = dk_dist_slurm_node_list(self->slurm);
        started.slurm_time_limit = dk_dist_slurm_time_limit(self->slurm);
    }
    dk_dist_status_t st = {.what = self->plan.what,
                           .elapsed_s = (double)(dk_now_ms() - self->started_ms) / 1000.0,
                           .world = world, .ranks = ranks, .gpu = self->plan.gpu,
                           .hosts = dk_dist_pool_hosts(self),
                           .gpu_memory = dk_gpu_process_memory, .t0_ms = self->started_ms,
                           .output = self->opts.output, .shown = shown, .started = &started};
    char *text = dk_dist_status_text(&st);
    free(ranks);
    free(lost);
    free(shown);
    return text;
}

/* The nodes a lost rank ran on, each with all its ranks ("node2 lost (ranks
 * 2–3)"), into BUF; empty when none was lost. */
static void lost_nodes(dk_dist_pool_t *self, char *buf, size_t len)
{
    buf[0] = '\0';
    bool *lost = lost_ranks(self);
    if (lost)
        dk_lost_format(self->plan.world, lost, dk_dist_pool_hosts(self), "; ", buf, len);
    free(lost);
}

void dk_dist_pool_gone_text(dk_dist_pool_t *self, char *out, size_t outlen)
{
    dk_job_end_t end = dk_job_end(self->job);
    int root = dk_job_root_cause(self->job);
    char lost[400];
    lost_nodes(self, lost, sizeof lost);
    if (lost[0])        /* "node2 lost (ranks 2–3)": the node, not a rank's code */
        snprintf(out, outlen, "%s", lost);
    else if (end == DK_END_IDLE)
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
    dk_dist_pool_t *p = self_p ? *self_p : NULL;
    if (!p)
        return;
    dk_dist_pool_attach(p, NULL);
    if (p->releaser_running) {
        pthread_mutex_lock(&p->rel_lock);
        p->quit = true;
        pthread_mutex_unlock(&p->rel_lock);
        pthread_join(p->releaser, NULL);
    }
    dk_job_destroy(&p->job);
    dk_dist_slurm_destroy(&p->slurm);   /* after: the ranks were its steps */
    pthread_cond_destroy(&p->rel_cond);
    pthread_mutex_destroy(&p->rel_lock);
    pthread_mutex_destroy(&p->lock);
    free(p);
    *self_p = NULL;
}
