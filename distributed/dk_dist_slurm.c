/*
 * dk_dist_slurm: the Slurm preflight of a run. See the header.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "dk_dist_slurm.h"
#include "dk_slurm.h"

#include <stdio.h>

/* sinfo's deadline here: a cell waits on it, and a healthy controller answers
 * in milliseconds. */
#define PREFLIGHT_TIMEOUT_S 15.0

/* "nodes=2", "remote=True / launcher=slurm": what asked for Slurm, for messages. */
static void what_asked(const dk_dist_opts_t *opts, char *out, size_t len)
{
    if (opts->nodes > 1)
        snprintf(out, len, "nodes=%d", opts->nodes);
    else
        snprintf(out, len, "launcher=slurm (or remote=True)");
}

int dk_dist_slurm_preflight(const dk_dist_opts_t *opts)
{
    char err[2048], asked[64];
    what_asked(opts, asked, sizeof asked);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = dk_slurm_reachable(PREFLIGHT_TIMEOUT_S, err, sizeof err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        PyErr_Format(PyExc_RuntimeError, "%s asks for a Slurm cluster, but %s. No rank was "
                     "started.", asked, err);
        return -1;
    }
    PyErr_Format(PyExc_RuntimeError,
                 "%s asks for a Slurm cluster, and Slurm is reachable, but this version of "
                 "distkernel cannot run ranks through Slurm yet: multi-node runs are not "
                 "available in this version. No rank was started and nothing was asked of "
                 "Slurm. Run on this node instead (without nodes, launcher=slurm or "
                 "remote=True).", asked);
    return -1;
}
