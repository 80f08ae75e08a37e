/*
 * dk_pyprobe: what a python says about itself, and whether this kernel can
 * run in its environment.
 *
 * The kernel embeds one libpython and starts it as the environment's python
 * would (runtime/rank/dk_pyinit.h), which works only for a Python of the same
 * version and ABI that has IPython and cloudpickle. The probe runs the python
 * with a few lines (dk_pyprobe_script) that print its version, SOABI,
 * sys.prefix, which of those modules it lacks and whether debugpy is there;
 * the check compares that with what the build embeds and says what to do when
 * it does not fit.
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

/* Whether the kernel, embedding Python WANT_VERSION ("3.11") with SOABI
 * WANT_SOABI, can run in PYTHON's environment as PROBE describes it: 0, or -1
 * with ERR saying why not (another version or ABI: both named, and how to
 * build a kernel for PYTHON; modules missing: which, and how to add them). */
int dk_pyprobe_check(const dk_pyprobe_t *probe, const char *python,
                     const char *want_version, const char *want_soabi, char *err,
                     size_t errlen);

#endif
