/*
 * dk_pyinit: the embedded CPython's start, shared by the kernel and the ranks.
 * See dk_pyinit.h.
 */
#include "dk_pyinit.h"
#include "dk_err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *dk_pyinit_python(void)
{
    const char *env = getenv("DISTKERNEL_PYTHON");
    return env && *env ? env : DK_PYTHON_EXE;
}

const char *dk_pyinit_glue_dir(void)
{
    const char *env = getenv("DISTKERNEL_GLUE_DIR");
    return env && *env ? env : DK_GLUE_DIR;
}

int dk_pyinit_check_python(const char *host, char *err, size_t errlen)
{
    const char *python = dk_pyinit_python();
    if (access(python, X_OK) == 0)
        return 0;
    int e = errno;
    if (host)
        dk_set_err(err, errlen,
                   "the kernel's Python environment is not on node %s: %s: %s. The kernel "
                   "runs in the environment of %s, and every node its ranks run on needs "
                   "that environment at the same path: put it on a filesystem the nodes "
                   "share, or create it at that path on each node",
                   host, python, strerror(e), python);
    else
        dk_set_err(err, errlen,
                   "the kernel's Python environment is gone: %s: %s. Install the kernel "
                   "again for an environment that exists (distkernel install --python PATH)",
                   python, strerror(e));
    return -1;
}

static PyStatus configure_and_start(const char *argv0)
{
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.parse_argv = 0;
    const char *python = dk_pyinit_python();
    PyStatus st = PyConfig_SetBytesString(&config, &config.program_name, python);
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesString(&config, &config.executable, python);
    if (!PyStatus_Exception(st)) {
        char *argv[] = {(char *)argv0};
        st = PyConfig_SetBytesArgv(&config, 1, argv);
    }
    if (!PyStatus_Exception(st))
        st = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    return st;
}

int dk_pyinit_start(const char *argv0, char *err, size_t errlen)
{
    PyStatus st = configure_and_start(argv0);
    if (PyStatus_Exception(st)) {
        dk_set_err(err, errlen, "cannot start Python: %s",
                   st.err_msg ? st.err_msg : "Py_InitializeFromConfig failed");
        return -1;
    }
    const char *dir = dk_pyinit_glue_dir();
    PyObject *path = PySys_GetObject("path");
    PyObject *d = PyUnicode_FromString(dir);
    int rc = path && d ? PyList_Insert(path, 0, d) : -1;
    Py_XDECREF(d);
    if (rc < 0) {
        PyErr_Clear();
        dk_set_err(err, errlen, "cannot put %s on sys.path", dir);
        return -1;
    }
    return 0;
}
