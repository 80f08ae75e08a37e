/*
 * dk_pyinit: the embedded CPython's start, shared by the kernel and the ranks.
 * See dk_pyinit.h.
 */
#include "dk_pyinit.h"
#include "dk_err.h"
#include "dk_pyload.h"

#include <errno.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *dk_pyinit_glue_dir(void)
{
    const char *env = getenv("DISTKERNEL_GLUE_DIR");
    return env && *env ? env : DK_GLUE_DIR;
}

/* PEP 538, which the start below does not do: a C or POSIX LC_CTYPE becomes
 * C.UTF-8, in this process and, through the environment, in everything it
 * starts, as `python` itself does, so that open() and the standard streams are
 * UTF-8 in a job or a container that sets no locale. */
static void coerce_c_locale(void)
{
    if (getenv("LC_ALL") && *getenv("LC_ALL"))
        return;
    const char *cur = setlocale(LC_CTYPE, "");
    if (cur && strcmp(cur, "C") != 0 && strcmp(cur, "POSIX") != 0)
        return;
    static const char *const utf8[] = {"C.UTF-8", "C.utf8", "UTF-8"};
    for (size_t i = 0; i < sizeof utf8 / sizeof *utf8; i++)
        if (setlocale(LC_CTYPE, utf8[i])) {
            setenv("LC_CTYPE", utf8[i], 1);
            return;
        }
}

/* The stable ABI has no PyConfig: the interpreter is configured the way it
 * was before PEP 587, which every CPython from 3.10 to 3.13 still accepts.
 * The program name is the environment's python, from which CPython's own
 * path calculation finds its prefix and site.py the venv around it, as for
 * that python; sys.argv is [ARGV0] and nothing is parsed as Python's
 * options. Those calls are deprecated from 3.11 on, not removed. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static int configure_and_start(const char *argv0, char *err, size_t errlen)
{
    coerce_c_locale();
    /* Py_SetProgramName keeps the pointer: the name lives as long as the
     * process. */
    static wchar_t *program, *arg0;
    const char *python = dk_pyload_python();
    if (!program && !(program = Py_DecodeLocale(python, NULL))) {
        dk_set_err(err, errlen, "cannot start Python: %s cannot be decoded", python);
        return -1;
    }
    if (!arg0 && !(arg0 = Py_DecodeLocale(argv0, NULL))) {
        dk_set_err(err, errlen, "cannot start Python: %s cannot be decoded", argv0);
        return -1;
    }
    Py_SetProgramName(program);
    Py_InitializeEx(1);
    if (!Py_IsInitialized()) {
        dk_set_err(err, errlen, "cannot start Python as %s", python);
        return -1;
    }
    wchar_t *argv[] = {arg0};
    PySys_SetArgvEx(1, argv, 0);
    return 0;
}
#pragma GCC diagnostic pop

int dk_pyinit_start(const char *argv0, char *err, size_t errlen)
{
    if (configure_and_start(argv0, err, errlen) < 0)
        return -1;
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
