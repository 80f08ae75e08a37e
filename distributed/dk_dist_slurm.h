/*
 * dk_dist_slurm: a run that asks for Slurm (launcher=slurm, nodes > 1, or the
 * decorator's remote=True), before anything starts.
 *
 * Slurm must be reachable from the kernel (runtime/dk_slurm.h says what that
 * means); otherwise the user reads what is missing and what to set, and no
 * rank, log folder or MLflow run is made. Ranks do not run through Slurm yet
 * (they need the network back channel), so a run that passes this check still
 * stops here, saying so, rather than running on this node behind the user's
 * back.
 */
#ifndef DK_DIST_SLURM_H
#define DK_DIST_SLURM_H

#include "dk_dist_opts.h"

/* The Slurm preflight of a run with OPTS (whose launcher is slurm). Returns 0
 * when the run may go on, or -1 with a Python RuntimeError set. Holds the GIL,
 * and releases it while Slurm's commands run. */
int dk_dist_slurm_preflight(const dk_dist_opts_t *opts);

#endif
