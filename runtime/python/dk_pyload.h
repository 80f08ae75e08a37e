/*
 * dk_pyload: choosing and loading the libpython of the environment a kernel
 * or a rank runs in, then the part of distkernel that calls Python.
 *
 * One distkernel serves every CPython from 3.10 on (docs/architecture.md, "One
 * build, every Python"). Its Python-using code is compiled against the stable
 * ABI (runtime/base/dk_pyabi.h) into private shared libraries that link no
 * libpython: libdistkernel-kernel.so (the kernel) and libdistkernel-rank.so
 * (a rank). The programs themselves, distkernel and distkernel-rank, link no
 * Python at all. They load the environment's libpython with RTLD_GLOBAL, so
 * that the library, and every extension module the environment imports, find
 * its symbols, and then the library, whose entry point they call.
 *
 * Which environment: DISTKERNEL_PYTHON, the environment's python, as before
 * (the kernel sets it from --python; every rank it starts inherits it). Which
 * libpython: DISTKERNEL_LIBPYTHON, which the kernel sets to the one it loaded
 * so that every rank, warm, started or on a Slurm node, loads the same one.
 * Unset, the build's own Python and libpython (DK_PYTHON_EXE, DK_LIBPYTHON).
 * This file calls no Python: it runs before there is one.
 */
#ifndef DK_PYLOAD_H
#define DK_PYLOAD_H

#include <stdbool.h>
#include <stddef.h>

/* The oldest CPython a kernel runs on: the stable ABI the code is built for. */
#define DK_PYLOAD_MIN_MAJOR 3
#define DK_PYLOAD_MIN_MINOR 10

/* The python whose environment the interpreter starts in: DISTKERNEL_PYTHON
 * when set and not empty, else the one the build embeds. Not to be freed. */
const char *dk_pyload_python(void);

/* The libpython to load: DISTKERNEL_LIBPYTHON when set and not empty, else the
 * build's. Not to be freed. */
const char *dk_pyload_libpython(void);

/* Whether the environment's python (dk_pyload_python) is there: 0, or -1
 * with a message in ERR that names it and, when HOST is given, the node it is
 * missing on. */
int dk_pyload_check_python(const char *host, char *err, size_t errlen);

/* Parse the start of a Py_GetVersion() string ("3.12.1 (main, ...) [GCC ...]")
 * into MAJOR and MINOR, and say whether it is a free-threaded build. Returns 0,
 * or -1 when it does not start with a version. */
int dk_pyload_parse_version(const char *version, int *major, int *minor, bool *free_threaded);

/* Load LIBPYTHON with RTLD_GLOBAL and check that it is a CPython distkernel
 * runs on (3.10 or later, with the GIL). Returns 0, or -1 with ERR saying
 * what it is instead, or why it does not load. VERSION (may be NULL) gets its
 * "3.12.1". Loading the same library again is harmless. */
int dk_pyload_open(const char *libpython, char *version, size_t version_len, char *err,
                   size_t errlen);

/* Load distkernel's library NAME ("libdistkernel-kernel.so") and return its
 * function ENTRY, or NULL with ERR. The library is looked for next to this
 * program first (a build folder), then where distkernel installs it
 * (DK_PRIVLIB_DIR). Every Python symbol it uses must already be loaded
 * (dk_pyload_open): one missing is named in ERR. */
void *dk_pyload_entry(const char *name, const char *entry, char *err, size_t errlen);

#endif
