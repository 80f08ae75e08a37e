/*
 * dk_dist_warm: which warm-start template (runtime/launch/dk_template.h) a fresh
 * run's ranks are forked from, if any.
 *
 * The kernel keeps at most one template. Nothing is started before the first
 * fresh run that may be warm, so a kernel that runs no distributed cell pays
 * nothing. That run builds it (the import of torch once, which the ranks then
 * skip) and waits for it; later runs reuse it while it is fresh: its
 * fingerprint (distkernel._dist.warm_fingerprint: the kernel's environment,
 * working directory, sys.path, installed packages, the module list) still
 * matches. A stale one is replaced. A run that cannot be warm (warm=False,
 * DISTKERNEL_WARM=0, another launcher, a template that failed to import or
 * refuses: a thread started, CUDA initialised) runs cold, and the reason is
 * written to warm.log in the run's log folder (and to the kernel's stderr with
 * DISTKERNEL_DEBUG set); the cell shows nothing of it.
 */
#ifndef DK_DIST_WARM_H
#define DK_DIST_WARM_H

#include "dk_dist_opts.h"
#include "dk_template.h"

#include <stdbool.h>
#include <stddef.h>

/* The socket path (a new string, the caller frees it) of a template fit for
 * a fresh run with OPTS, building or rebuilding the one in *SLOT as needed
 * (RANK_EXE runs it); NULL with the reason in WHY when the run is to be cold
 * (always, for a run from a thread other than the kernel's main thread).
 * Returns NULL with a Python exception set (then *INTERRUPTED is true) when
 * the user interrupted the build. Called with the GIL held; releases it while
 * waiting. */
char *dk_dist_warm_socket(dk_template_t **slot, const dk_dist_opts_t *opts,
                          const char *rank_exe, bool *interrupted, char *why, size_t whylen);

/* A run whose ranks node agents start (launcher=slurm): each agent starts a
 * template of its own on its node (runtime/agent/dk_agent.h), importing what
 * this kernel's would, from its sys.path. True with the module list in
 * MODULES and the kernel's sys.path (newline-separated, a new string, the
 * caller frees it; NULL when it could not be read) in *PATH; false with the
 * reason in WHY when the run is to be cold (warm=False, DISTKERNEL_WARM=0).
 * Called with the GIL held. */
bool dk_dist_warm_for_agents(const dk_dist_opts_t *opts, char *modules, size_t len,
                             char **path, char *why, size_t whylen);

/* A fresh run's share of dk_dist_warm_for_agents: MODULES (as it returned
 * them) narrowed to what the run's PAYLOAD (LEN bytes, as prepare_cell or a
 * .distributed() call made it) may use, through
 * distkernel._dist.agent_warm_modules. A run whose code imports only the
 * standard library and names no warm module gets "", the reason written to
 * warm.log in LOG_DIR, so that its ranks do not wait for torch's import on
 * every node. MODULES is left as it was when Python cannot tell. Called with
 * the GIL held. */
void dk_dist_warm_for_run(const void *payload, size_t len, char *modules, size_t mlen,
                          const char *log_dir);

/* At the kernel's exit, from any thread: end the template in *SLOT
 * (dk_template_end) under the lock the runs take. */
void dk_dist_warm_end(dk_template_t **slot);

/* The line `%distributed status` shows for the template in *SLOT: its name,
 * pid and resident memory (it stays between runs, and holds torch), ending in
 * a newline; "" when none runs (or a run holds it at the moment). */
void dk_dist_warm_status_line(dk_template_t **slot, char *out, size_t outlen);

/* Write WHY to warm.log in LOG_DIR (and to stderr under DISTKERNEL_DEBUG). */
void dk_dist_warm_note(const char *log_dir, const char *why);

#endif
