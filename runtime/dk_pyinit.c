/*
 * dk_pyinit: the embedded CPython's start, shared by the kernel and the ranks.
 * See dk_pyinit.h.
 */
#include "dk_pyinit.h"
#include "dk_err.h"

#include <stdio.h>
#include <stdlib.h>

static PyStatus configure_and_start(const char *argv0)
{
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    config.parse_argv = 0;
    PyStatus st = PyConfig_SetBytesString(&config, &config.program_name, DK_PYTHON_EXE);
    if (!PyStatus_Exception(st))
        st = PyConfig_SetBytesString(&config, &config.executable, DK_PYTHON_EXE);
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
    const char *dir = getenv("DISTKERNEL_GLUE_DIR");
    PyObject *path = PySys_GetObject("path");
    PyObject *d = PyUnicode_FromString(dir && *dir ? dir : DK_GLUE_DIR);
    int rc = path && d ? PyList_Insert(path, 0, d) : -1;
    Py_XDECREF(d);
    if (rc < 0) {
        PyErr_Clear();
        dk_set_err(err, errlen, "cannot put %s on sys.path", dir && *dir ? dir : DK_GLUE_DIR);
        return -1;
    }
    return 0;
}
