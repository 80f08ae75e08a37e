/*
 * dk_dist_preflight: check=True, the NCCL check before a run's ranks start.
 *
 * The check (dk_check, distkernel-check) runs on the node's GPUs and its report
 * is printed in the cell; a failed verdict stops the run before any rank
 * starts, so the user reads why NCCL cannot work instead of N hung ranks.
 */
#ifndef DK_DIST_PREFLIGHT_H
#define DK_DIST_PREFLIGHT_H

#include "dk_stream.h"

#include <stdbool.h>

/* Run the check for a run of GPU ranks (GPU; CPU ranks have nothing to check,
 * which is said), its report written to STREAM. Returns 0 when the ranks may
 * start, or -1 with a Python exception set: KeyboardInterrupt when
 * interrupted, RuntimeError when the check failed or could not run. Holds the
 * GIL. */
int dk_dist_preflight(dk_stream_t *stream, bool gpu);

#endif
