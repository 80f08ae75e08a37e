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
 */
#ifndef DK_PYINIT_H
#define DK_PYINIT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stddef.h>

/* Start the interpreter with sys.argv = [ARGV0], then put distkernel's package
 * directory first on sys.path. Returns 0 with the GIL held, or -1 with what
 * went wrong in ERR (the interpreter may be half started: exit). */
int dk_pyinit_start(const char *argv0, char *err, size_t errlen);

#endif
