/*
 * dk_template: a warm-start template, the process that fresh runs' ranks are
 * forked from.
 *
 * A template is the rank program (distkernel-rank) started in template mode:
 * it imports a list of modules (torch, and what the user adds) once, with no
 * thread started, CUDA never initialised and no GPU held, and then forks a
 * rank for each request on its Unix socket (protocol: python/distkernel/
 * _template.py, serve; the requesting side: runtime/rank/rank_main.c). A job
 * uses it by naming its socket in dk_job_spec_t.warm_socket.
 *
 * It is started through dk_spawn like every process of the runtime: in a
 * process group of its own, killed when the thread that started it ends (so
 * with the host, even a SIGKILLed one: its ranks have PR_SET_PDEATHSIG too),
 * its socket in a fresh 0700 directory. The host keeps a FINGERPRINT with it
 * (an opaque string: what it was built from) to tell when it is stale.
 */
#ifndef DK_TEMPLATE_H
#define DK_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

/* What a template is called: its argv[0] (ps -f, pgrep -f) and its process
 * name (ps, pgrep, top; at most 15 characters), so that it is not taken for
 * a leftover rank. */
#define DK_TEMPLATE_ARGV0 "distkernel-template"
#define DK_TEMPLATE_COMM "distkernel-tmpl"

typedef struct dk_template_t dk_template_t;

/* Start a template: RANK_EXE (a name on $PATH or a path) with ENV (NULL: the
 * host's environ; OMP_NUM_THREADS=1 is added unless set, as the job does for
 * ranks) importing MODULES (comma-separated, may be empty) with the folders
 * of IMPORT_PATH (newline-separated, NULL: none) first on sys.path, as the
 * ranks will have them (the ranks get the template's own sys.path back
 * before they run). Returns at once;
 * dk_template_ready tells when it can serve. NULL with ERR when it could not
 * be started (then no process exists). */
dk_template_t *dk_template_start(const char *rank_exe, const char *const *env,
                                 const char *modules, const char *import_path,
                                 const char *fingerprint, char *err,
                                 size_t errlen);

/* Wait up to TIMEOUT_MS (-1: forever) for the template to be ready: 1 when it
 * is, 0 when still importing, -1 when it failed (it exited: WHY says how,
 * with what it wrote to stderr). */
int dk_template_ready(dk_template_t *t, int timeout_ms, char *why, size_t whylen);

/* Ask a ready template whether it can fork a rank now: 0, or -1 with WHY
 * (a thread started in it, CUDA initialised, it is gone). */
int dk_template_check(dk_template_t *t, char *why, size_t whylen);

/* Whether the template was ready at some point (one that is gone now ended
 * after serving, rather than failing to import). */
bool dk_template_was_ready(const dk_template_t *t);

const char *dk_template_socket(const dk_template_t *t);
const char *dk_template_fingerprint(const dk_template_t *t);
int dk_template_pid(const dk_template_t *t);
/* Kilobytes of the template's resident memory (VmRSS), or -1. */
long dk_template_rss_kb(const dk_template_t *t);

/* At the host's exit, holding what serializes the template's other calls
 * (it reads whether the template was reaped): unless reaped, SIGTERM (on
 * which it ends the groups of the ranks it forked, each of which leads its
 * own, and exits; waited for at most 2 s), then SIGKILL to the template's
 * group; and its socket and folder removed. The object stays valid
 * (dk_template_destroy still frees it) and refuses ranks from then on. */
void dk_template_end(dk_template_t *t);

/* No rank will be asked for any more: the template's socket and folder are
 * removed now (the template lives on; a rank asking from now on finds no
 * socket). A node agent whose kernel is gone does this first, so that a
 * SIGKILL that Slurm sends the agent's step soon after leaves no folder. */
void dk_template_unlink(dk_template_t *t);

/* SIGTERM, at most 2 s for it to end its ranks' groups, then SIGKILL, to the
 * template process alone, through its pidfd (nothing without one): safe from any thread, even while another reaps it, since a pidfd
 * never names a later process that reuses the pid. */
void dk_template_kill(const dk_template_t *t);

/* Kill the template (SIGTERM, then SIGKILL to its group, as dk_template_end),
 * reap it, remove its socket and directory, free. Sets *T_P to NULL. */
void dk_template_destroy(dk_template_t **t_p);

#endif
