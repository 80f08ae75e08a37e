/*
 * dk_dist_pool: ranks started with `%distributed start`, kept between cells.
 *
 * The pool is a persistent job (runtime/launch/dk_job.h: rounds of TASK frames on
 * ranks that stay) with the plan and options it was started with. Each cell
 * or .distributed() call on it is a dk_dist_run of its own (its output, status
 * display, log folder, MLflow run, outcome), which attaches its sink to the
 * pool while it runs: the job's sink is the pool's, and forwards to the run
 * attached, if any. Output a rank writes between cells goes only to its log.
 *
 * Owned by the feature (dk_distributed); everything here is called on the
 * kernel's main thread except the sink, which the runtime thread calls.
 */
#ifndef DK_DIST_POOL_H
#define DK_DIST_POOL_H

#include "dk_dist_opts.h"
#include "dk_dist_plan.h"
#include "dk_dist_slurm.h"
#include "dk_job.h"

typedef struct dk_dist_pool_t dk_dist_pool_t;

/* A pool for ranks planned as PLAN, started with OPTS (copied), named by the
 * random ID; no job yet. NULL when out of memory. */
dk_dist_pool_t *dk_dist_pool_new(const dk_dist_opts_t *opts, const dk_dist_plan_t *plan,
                                 const char *id);

/* The sink to start the pool's job with: it forwards to the attached run. */
dk_sink_t dk_dist_pool_sink(dk_dist_pool_t *self);

/* The pool's job (which it owns from now on), once started. */
void dk_dist_pool_set_job(dk_dist_pool_t *self, dk_job_t *job);
dk_job_t *dk_dist_pool_job(dk_dist_pool_t *self);

/* On Slurm's nodes: the allocation the ranks are steps of, which the pool owns
 * from now on (after set_job). A thread of the pool releases it as soon as the
 * job ends, however it ends; destroy releases it at the latest. */
void dk_dist_pool_set_slurm(dk_dist_pool_t *self, dk_dist_slurm_t *slurm);

/* On Slurm's nodes: when (dk_now_s) the allocation's time limit ends it, as
 * found at the ranks' start (0: no limit); and the seconds left of it now, -1
 * for none. A cell's timeout is cut to end before it (dk_dist_job_timeout). */
void dk_dist_pool_set_slurm_end(dk_dist_pool_t *self, double end_s);
double dk_dist_pool_slurm_left(const dk_dist_pool_t *self);
/* The Slurm job the ranks are steps of, "" on this node. */
const char *dk_dist_pool_slurm_job_id(const dk_dist_pool_t *self);

/* Each rank's node name on Slurm's nodes (world entries), or NULL on this node. */
const char *const *dk_dist_pool_hosts(const dk_dist_pool_t *self);

/* End the ranks and wait for them and for the allocation's release, without
 * freeing (the kernel's exit: another thread may still use the pool). */
void dk_dist_pool_end(dk_dist_pool_t *self);

/* Route the job's callbacks to SINK (copied) while a run uses the ranks; NULL
 * detaches (returns once no callback is still running into the old one). */
void dk_dist_pool_attach(dk_dist_pool_t *self, const dk_sink_t *sink);

/* Whether a run uses the ranks now. A run waits with the GIL released, so
 * another Python thread of the kernel may call .distributed() or
 * `%distributed stop` meanwhile: the feature refuses both while the pool is
 * busy. Set by the run that claims the ranks, cleared when it is destroyed;
 * main thread (GIL held) only. */
bool dk_dist_pool_busy(const dk_dist_pool_t *self);
void dk_dist_pool_set_busy(dk_dist_pool_t *self, bool busy);

/* The error a second use of busy ranks gets (one sentence, what to do). */
#define DK_DIST_POOL_BUSY_TEXT                                                            \
    "a cell is running on the started ranks; wait for it or interrupt it (one cell or "  \
    ".distributed() call runs on them at a time)"

const dk_dist_plan_t *dk_dist_pool_plan(const dk_dist_pool_t *self);
const dk_dist_opts_t *dk_dist_pool_opts(const dk_dist_pool_t *self);
const char *dk_dist_pool_id(const dk_dist_pool_t *self);

/* Whether the ranks still run (the job has not ended). */
bool dk_dist_pool_alive(dk_dist_pool_t *self);

/* What `%distributed status` shows (malloc'd, no newline at its end), or NULL
 * when out of memory: the ranks by pid up to 8, above that counted by state
 * and node, in at most 12 lines at any size (dk_dist_status). */
char *dk_dist_pool_status_text(dk_dist_pool_t *self);

/* Why the ranks ended, in a sentence, into OUT (the job must have ended). */
void dk_dist_pool_gone_text(dk_dist_pool_t *self, char *out, size_t outlen);

/* End the ranks (if they run), wait for them, and free. Sets *SELF_P to NULL. */
void dk_dist_pool_destroy(dk_dist_pool_t **self_p);

#endif
