/*
 * dk_pyinit: starting the embedded CPython the same way in the kernel and in
 * every rank.
 *
 * Both programs run on the libpython of the environment they serve
 * (dk_pyload.h) and load distkernel's Python package from where it was
 * installed (DK_GLUE_DIR, or DISTKERNEL_GLUE_DIR for a build not installed
 * yet). So that subprocess and multiprocessing start a real Python,
 * sys.executable is the environment's python, not the program that embeds it.
 * Command-line arguments are never parsed as Python's own. Python installs its
 * signal handlers itself (SIGINT's is Python's only if SIGINT was at its
 * default when it started).
 *
 * Environments: DISTKERNEL_PYTHON names the environment's python (the kernel
 * sets it from its --python argument, so every rank it starts, warm, started
 * or on a Slurm node, inherits it). It is the program name the interpreter
 * starts with, from which CPython's own path calculation finds the prefix of
 * its installation, and site.py the pyvenv.cfg of a venv around it, so
 * sys.prefix and site-packages are exactly that python's. Unset: the build's.
 */
#ifndef DK_PYINIT_H
#define DK_PYINIT_H

#include "dk_pyabi.h"

#include <stddef.h>

/* distkernel's Python package folder: DISTKERNEL_GLUE_DIR when set and not
 * empty, else the one the build installed. Not to be freed. */
const char *dk_pyinit_glue_dir(void);

/* Start the interpreter with sys.argv = [ARGV0], then put distkernel's package
 * directory first on sys.path. Returns 0 with the GIL held, or -1 with what
 * went wrong in ERR (the interpreter may be half started: exit). */
int dk_pyinit_start(const char *argv0, char *err, size_t errlen);

#endif
