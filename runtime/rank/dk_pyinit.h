/*
 * dk_pyinit: starting the embedded CPython the same way in the kernel and in
 * every rank.
 *
 * Both programs embed the interpreter the build chose (-Dpython=, DK_PYTHON_EXE)
 * and load distkernel's Python package from where it was installed
 * (DK_GLUE_DIR, or DISTKERNEL_GLUE_DIR for a build not installed yet). So that
 * subprocess and multiprocessing start a real Python, sys.executable is that
 * interpreter, not the program that embeds it. Command-line arguments are never
 * parsed as Python's own. Python installs its signal handlers itself (SIGINT's
 * is Python's only if SIGINT was at its default when it started).
 *
 * Environments: one build serves every venv, virtualenv or conda env of the
 * Python version it embeds. DISTKERNEL_PYTHON names the environment's python
 * (the kernel sets it from its --python argument, so every rank it starts,
 * warm, started or on a Slurm node, inherits it); it becomes
 * PyConfig.executable and program_name, from which CPython's own start (PEP
 * 587, getpath) finds the pyvenv.cfg next to or above it and so sys.prefix and
 * site-packages, exactly as that python would. Unset: the build's interpreter.
 */
#ifndef DK_PYINIT_H
#define DK_PYINIT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

/* The python whose environment the interpreter starts in: DISTKERNEL_PYTHON
 * when set and not empty, else the one the build embeds. A static string or
 * the environment's (not to be freed). */
const char *dk_pyinit_python(void);

/* distkernel's Python package folder: DISTKERNEL_GLUE_DIR when set and not
 * empty, else the one the build installed. Not to be freed. */
const char *dk_pyinit_glue_dir(void);

/* Whether the environment's python (dk_pyinit_python) is there: 0, or -1
 * with a message in ERR that names it and, when HOST is given, the node it is
 * missing on. Called before dk_pyinit_start, whose own error for a missing
 * environment would be CPython's obscure one (no encodings module). */
int dk_pyinit_check_python(const char *host, char *err, size_t errlen);

/* Start the interpreter with sys.argv = [ARGV0], then put distkernel's package
 * directory first on sys.path. Returns 0 with the GIL held, or -1 with what
 * went wrong in ERR (the interpreter may be half started: exit). */
int dk_pyinit_start(const char *argv0, char *err, size_t errlen);

#endif
