/*
 * dk_pyprobe: what a python says about itself, and whether this kernel can
 * run in its environment.
 *
 * The kernel runs on the environment's own libpython, started as the
 * environment's python would start (runtime/python/dk_pyload.h), which works
 * for any CPython from 3.10 on that has a shared libpython, the GIL, IPython
 * and cloudpickle. The probe runs the python with a few lines
 * (dk_pyprobe_script) that print its version, SOABI, sys.prefix, what kind of
 * environment it is, its libpython, which of those modules it lacks and
 * whether debugpy is there; the check says what to do when it does not fit.
 * `distkernel install` (dk_install.h) refuses an environment on its word.
 */
#ifndef DK_PYPROBE_H
#define DK_PYPROBE_H

#include <stdbool.h>
#include <stddef.h>

/* What a python says about itself (dk_pyprobe_parse). */
typedef struct {
    int major, minor;
    char *soabi;                 /* "cpython-311-x86_64-linux-gnu"; "" when it has none */
    char *prefix;                /* sys.prefix */
    char *missing;               /* the kernel's modules it lacks, space-separated; "" */
    bool debugpy;                /* debugpy is importable: the debugger can start */
    char *implementation;        /* sys.implementation.name: "cpython" */
    char *kind;                  /* "venv", "conda" or "installation" */
    char *base;                  /* sys.base_prefix: the installation a venv is of */
    char *libpython;             /* its shared libpython; "" when it has none (static) */
    bool free_threaded;          /* a 3.13t build (Py_GIL_DISABLED) */
} dk_pyprobe_t;

/* The script dk_pyprobe_run runs with `PYTHON -c`. */
extern const char dk_pyprobe_script[];

/* Parse the probe's output OUT into PROBE. Returns 0, or -1 with ERR (OUT is
 * not what a Python running the script prints) and PROBE holding nothing. */
int dk_pyprobe_parse(const char *out, dk_pyprobe_t *probe, char *err, size_t errlen);

/* Run the probe with PYTHON and parse what it prints. Returns 0, or -1 with
 * ERR naming PYTHON and saying why it is not a Python (not there, not
 * executable, says nothing a Python would, did not finish within 60 s). */
int dk_pyprobe_run(const char *python, dk_pyprobe_t *probe, char *err, size_t errlen);

void dk_pyprobe_clear(dk_pyprobe_t *probe);

/* Whether a kernel can run in PYTHON's environment as PROBE describes it: a
 * CPython of 3.10 or later, with the GIL and a shared libpython, that has
 * IPython and cloudpickle. Returns 0, or -1 with ERR saying why not and what
 * to do. */
int dk_pyprobe_check(const dk_pyprobe_t *probe, const char *python, char *err, size_t errlen);

#endif
