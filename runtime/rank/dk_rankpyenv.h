/*
 * dk_rankpyenv: the Python variables a rank on another node starts CPython
 * with, checked before it starts.
 *
 * A rank that its node's agent started (DISTKERNEL_CWD set: it is not on the
 * kernel's node) inherits the kernel's environment. CPython reads some of it
 * while it starts, before any of distkernel's Python runs: PYTHONPATH's
 * folders go on sys.path and `site` imports sitecustomize.py from them;
 * PYTHONHOME and the environment's own folder give the stdlib and
 * site-packages (whose .pth files `site` runs); PYTHONUSERBASE (or
 * ~/.local) gives the user's site-packages. Where one of those paths does not
 * exist on the node, another user of the node can make it, and their code
 * would run as ours, in the template and in every rank (with a cold rank's
 * run key in reach). So each is held to dk_logdir's rule for code (the
 * user's or root's, writable by nobody else, through folders nobody else can
 * rename) first:
 *   - PYTHONPATH keeps only the entries that pass (dk_codepath.h); it is
 *     unset when none does.
 *   - A user base that does not pass (missing included) turns the user's
 *     site-packages off: PYTHONNOUSERSITE=1.
 *   - The environment's folder (two levels above its python: ENV/bin/python),
 *     each folder of PYTHONHOME, and distkernel's own package folder must
 *     pass: without them there is nothing safe to start, and the rank ends
 *     saying which and why.
 * The environment is changed in place (setenv), before a warm rank asks its
 * template, so the programs a rank starts inherit the checked variables too.
 * What was left out is put in DISTKERNEL_PATH_NOTES, one "PATH<TAB>WHY" line
 * each, for distkernel._rank to write in the rank's log.
 */
#ifndef DK_RANKPYENV_H
#define DK_RANKPYENV_H

#include <stddef.h>

#define DK_RANKPYENV_NOTES "DISTKERNEL_PATH_NOTES"

/* Check this process's Python variables as above, for PYTHON (the
 * environment's python) and GLUE (distkernel's package folder). 0 when the
 * rank may start (some entries may have been left out); -1 with why in ERR
 * when it may not. */
int dk_rankpyenv_check(const char *python, const char *glue, char *err, size_t errlen);

#endif
